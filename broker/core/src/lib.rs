//! abx-core: the broker without its providers. A transport hands each connection's byte
//! streams to [`conn::serve`], which decodes frames with `abx_protocol::FrameCodec`, runs
//! each request through [`dispatch::call`] (the core's own methods, the provider methods it
//! routes, and the composition root's [`broker::Methods`]) and queues replies on the
//! connection's byte-bounded [`outbound::Outbound`].
//!
//! - [`broker`]: the state shared by every connection ([`Broker`]), built from injected
//!   providers and [`broker::Settings`]; no environment reading here.
//! - [`conn`]: one connection: reader, in-flight and inbound limits, cancellation, lanes,
//!   lifecycle, writer.
//! - [`outbound`]: the handle handlers and providers send through, the memory pool.
//! - [`cx`]: what a handler gets ([`cx::Cx`]: the broker, its caller, its tokens) and
//!   gives ([`cx::Reply`]); it holds no connection.
//! - [`dispatch`]: the method table and routing of provider methods; `members`: the
//!   routed params' members, raw and borrowed.
//! - [`provider`]: the [`provider::Provider`] trait, the live registry, exec/watch handles.
//! - [`events`]: `sandbox/subscribe` and `sandbox/changed`.
//! - [`index`]: which provider owns which sandbox, on disk.
//! - [`signals`]: signal names and kill escalation, shared by providers.
//! - [`cmdlog`]: `sandbox/log`, the commands run in each sandbox.
//!
//! **Invariants:** every request gets exactly one response, a panicking handler included
//! (E9001); nothing here writes to stdout; a client that stops reading only ever blocks its
//! own connection. (In-memory tests with an injected provider: `tests/core.rs`.)

pub mod broker;
pub mod cmdlog;
pub mod conn;
pub mod cx;
pub mod dispatch;
pub mod events;
pub mod index;
mod members;
pub mod outbound;
pub mod provider;
pub mod signals;

pub use broker::Broker;
