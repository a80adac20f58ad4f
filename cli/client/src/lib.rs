//! abx-client: a client of the broker, shared by the `abx` CLI, `abx mcp` and `abx rpc`.
//!
//! - [`client`]: one connection, one call at a time: connect (starting the daemon when none
//!   answers), `initialize` with our version, replace an idle daemon of another version.
//! - [`mux`]: one connection, many concurrent calls and exec streams (what servers such as
//!   `abx mcp` need).
//! - [`remote`]: a broker on another machine (`ABX_HOST=ssh://...`): the connection is the
//!   stdio of `ssh host abx rpc`.
//! - [`spawn`]: start a detached daemon (`abx-broker run`, found by [`spawn::daemon_binary`])
//!   under the spawn lock and wait for its ready line.
//!
//! Links `abx-protocol` and `abx-home` only: nothing of the daemon.

pub mod client;
pub mod mux;
pub mod remote;
pub mod spawn;

pub use client::{CallError, Client};
