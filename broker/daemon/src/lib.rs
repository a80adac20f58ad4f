//! abx-broker: the daemon. The composition root ([`compose`]) builds the providers and gives
//! them to the core (`abx_core`); the transports serve it: [`socket`] (the per-user daemon on
//! a local socket) and [`stdio`] (`abx-broker --stdio`, one client on stdin/stdout).
//!
//! - [`compose`]: environment and config, providers, the daemon's own methods
//!   (`provider/*` management in [`manage`], the contract kit over in-memory connections).
//! - [`logging`]: tracing to `data/logs/broker.log` and stderr, never stdout.
//!
//! The binary (`src/main.rs`) also runs the sandbox init (`__abx-sandbox-init`) and the
//! plugin launcher (`__abx-plugin-launch`): the daemon starts both as its own executable.

pub mod compose;
pub mod logging;
pub mod manage;
pub mod secrets;
pub mod socket;
pub mod stdio;

pub use abx_home::{Paths, VERSION};

/// Keep the daemon's memory honest: buffers over 1 MiB are mmapped and returned to the
/// system when freed, the heap is trimmed above 2 MiB free, and few malloc arenas are kept.
/// Without a fixed threshold glibc raises it after the first large free and keeps every
/// later chunk.
pub fn tune_allocator() {
    // SAFETY: plain glibc tunables, set before the runtime starts.
    unsafe {
        // Stream frames (up to ~350 KiB) come from the heap, not a fresh mmap (page faults
        // and zeroing) per chunk; free memory above 2 MiB at the top goes back to the system.
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1024 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 2 * 1024 * 1024);
        libc::mallopt(libc::M_ARENA_MAX, 2);
        // No fastbins: small chunks are cached per thread (tcache) anyway, and with fastbins
        // in use every allocation above 1 KiB (a request's task) first consolidated them:
        // 2.5% of a plugin call's instructions (callgrind, docs/performance.md).
        libc::mallopt(libc::M_MXFAST, 0);
    }
}
