//! abx-protocol: the only crate that knows the wire format.
//!
//! - [`message`]: the JSON-RPC 2.0 message model. Params and results stay unparsed
//!   (`Box<RawValue>`) until a handler asks for its typed params.
//! - [`codec`]: the two framings (newline-delimited JSON, LSP `Content-Length` headers),
//!   detected per connection from the first byte, with a message size limit.
//! - [`error`]: one enum of every E-code, each with its message template, default
//!   suggestion and CLI exit code, and the wire error object built from it.
//! - [`limits`]: the bounds on what one client can make the daemon hold.
//! - [`api`]: the param/result types of every method, shared by the broker (which
//!   deserializes into them), the CLI, the MCP tools and `openrpc`.
//! - [`catalogue`]: the one list of methods (name, who serves it, feature, params and result
//!   types, errors, notifications); every other method list is derived from it.
//! - `openrpc` (feature `schema`): `docs/openrpc.json`, generated from [`catalogue`] and
//!   [`api`].
//!
//! **Architecture invariant:** nothing here does I/O. The broker and the CLI wrap these
//! types in their own tokio plumbing.

pub mod api;
pub mod b64;
pub mod catalogue;
pub mod codec;
pub mod epp;
pub mod error;
pub mod features;
pub mod id;
pub mod limits;
pub mod manifest;
pub mod message;
#[cfg(feature = "schema")]
pub mod openrpc;

pub use codec::{Frame, FrameCodec, Framing, DEFAULT_MAX_MESSAGE_SIZE};
pub use error::{AbxError, ErrorCode, RpcError};
pub use id::Id;
pub use message::{Incoming, Message, Notification, Request, Response};

/// The protocol version answered by `initialize`.
pub const PROTOCOL_VERSION: &str = "abx/1";
