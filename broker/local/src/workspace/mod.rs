//! Workspaces (issue 43): host directories mounted into a sandbox.
//!
//! - [`mounts`]: `sandbox/create`'s `mounts`: the checks, the record, what the init mounts.
//! - [`changes`]: `sandbox/diff`, `sandbox/apply`, `sandbox/discard` on an overlay mount's
//!   upper dir against its host source.
//!
//! An overlay mount `n` of a sandbox keeps its own layer at
//! `data/local/sandboxes/<id>/mounts/<n>/upper` (and overlayfs's `work` beside it); the lower
//! layer is the host source. Unprivileged overlayfs with `userxattr`: whiteouts are 0/0
//! character devices or `user.overlay.whiteout`, opaque directories `user.overlay.opaque`.

pub mod changes;
pub mod mounts;
