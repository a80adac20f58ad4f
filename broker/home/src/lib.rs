//! abx-home: where the broker's things live and the few pieces of the filesystem and socket
//! that the daemon and its clients share.
//!
//! - [`paths`]: `ABX_HOME` / XDG locations of the socket, locks, data, config and logs.
//! - [`lock`]: advisory file locks (the daemon's lifetime lock, the clients' spawn lock).
//! - [`socket`]: one half of a local-socket stream, the daemon's ready-line handshake.
//! - [`config`]: the broker config file.
//! - [`util`]: atomic writes, RFC 3339 times, the clock.
//!
//! Below everything but `abx-protocol`: the thin `abx` client links it, so it never pulls in
//! daemon-only crates (git2, OpenSSL, reqwest, landlock).

pub mod config;
pub mod lock;
pub mod paths;
pub mod socket;
pub mod util;

pub use lock::FileLock;
pub use paths::Paths;
pub use socket::{SocketRead, SocketWrite};

/// This build's version (every crate of the workspace shares it). The daemon reports
/// `ABX_BROKER_VERSION` instead when set (tests of version replacement).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
