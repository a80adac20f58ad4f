//! abx-plugins: EPP/1 provider plugins (docs/design.md#providers, docs/design.md#epp). The `provider/*` management
//! methods that drive them are the daemon's (`abx_broker::manage`).
//!
//! - `protocol::manifest`: `abx-provider.toml`.
//! - [`digest`]: the content digest and verification; [`changes`]: inotify on an installed
//!   tree, so the check before every call is a system call, not a walk.
//! - [`install`]: sources (directory, git, archive), pinning, confirmation, atomic install.
//! - [`installed`]: the installed providers' records and their stored configuration.
//! - [`host`]: one child process per provider, shared by every client: handshake, id
//!   rewriting, stream routing, cancellation, timeouts, restarts.
//! - [`pace`]: how soon each plugin answers; a fast one's reply is polled for, not slept on.
//! - [`launch`]: the launcher each plugin process starts as: its own user, PID and mount
//!   namespaces (broker state hidden), run from a private copy hashed as it is made.
//! - [`stream`]: a stream's route to its client, kept (bounded) while no client receives
//!   it, re-routed and replayed by `exec/attach`.
//! - [`permissions`]: the `[security]` declarations enforced on the child (Landlock,
//!   seccomp) through [`abx_confine`].
//! - [`provider`]: an installed plugin as a [`abx_core::provider::Provider`]: integrity before
//!   every use, then the host.

pub mod changes;
pub mod digest;
pub mod host;
pub mod install;
pub mod installed;
pub mod launch;
pub mod pace;
pub mod permissions;
pub mod plugin;
pub mod stream;
