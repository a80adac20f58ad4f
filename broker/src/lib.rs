//! abx-broker: the per-user daemon and its stdio twin.
//!
//! Request flow: a transport ([`daemon`] for the local socket, [`stdio`] for
//! `abx broker --stdio`) hands each connection's byte streams to [`conn::serve`], which
//! decodes frames with `abx_protocol::FrameCodec`, runs every request as its own task
//! through [`dispatch::call`], and queues replies on the connection's byte-bounded
//! outbound queue ([`conn::ConnHandle`]). Broker-wide state lives in [`state::Broker`].
//!
//! **Architecture invariants:** every request gets exactly one response; nothing writes to
//! stdout except the stdio transport's reply writer; a client that stops reading only ever
//! blocks its own connection.

pub mod confine;
pub mod conn;
pub mod daemon;
pub mod dispatch;
pub mod events;
pub mod index;
pub mod kit;
pub mod local;
pub mod logging;
pub mod paths;
pub mod plugins;
pub mod provider;
pub mod state;
pub mod stdio;
pub mod util;

pub use paths::Paths;
pub use state::Broker;

/// This build's version (the daemon may override it with `ABX_BROKER_VERSION` for tests of
/// version replacement).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
