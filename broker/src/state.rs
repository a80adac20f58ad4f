//! Broker-wide state shared by every connection.

use crate::paths::Paths;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use tokio_util::sync::CancellationToken;

/// The daemon (or a stdio broker): one per process.
pub struct Broker {
    /// Version reported to clients.
    pub version: String,
    /// Where things live.
    pub paths: Paths,
    /// Cancelled when the broker stops.
    pub shutdown: CancellationToken,
    /// Message size limit per message.
    pub max_message: usize,
    /// The providers.
    pub registry: crate::provider::Registry,
    /// Which provider owns which sandbox.
    pub index: Arc<crate::index::Index>,
    /// Exec and watch ids -> provider.
    pub handles: crate::provider::Handles,
    /// Sandbox change events (`sandbox/subscribe`).
    pub events: crate::events::Events,
    /// The broker-wide memory budget (`ABX_MEMORY_BUDGET`, default 128 MiB): queued
    /// outbound bytes and large result buffers of every connection.
    pub pool: crate::conn::Pool,
    started: Instant,
    started_wall: SystemTime,
    next_conn: AtomicU64,
    connections: AtomicUsize,
    in_flight: AtomicUsize,
}

impl Broker {
    /// A broker with the given paths; version from `ABX_BROKER_VERSION` or the build.
    /// Starts the builtin providers, so it must be called inside a tokio runtime.
    pub fn new(paths: Paths) -> Broker {
        let events = crate::events::Events::default();
        let local: Arc<dyn crate::provider::Provider> =
            Arc::new(crate::local::provider::LocalProvider::start(
                &paths.data_dir,
                crate::local::provider::Settings::from_config(
                    &crate::plugins::manage::broker_config(&paths.config_dir),
                ),
                events.clone(),
            ));
        let mut providers = vec![local];
        providers.extend(crate::plugins::manage::load_installed(&paths, &events));

        let registry = crate::provider::Registry::new(providers);
        if let Some(d) = crate::plugins::manage::load_default(&paths) {
            if registry.set_default(&d).is_err() {
                tracing::warn!(provider = %d, "the configured default provider is not installed");
            }
        }
        if let Ok(p) = std::env::var("ABX_PROVIDER") {
            if !p.is_empty() && registry.set_default(&p).is_err() {
                tracing::warn!(provider = %p, "ABX_PROVIDER names a provider that is not installed");
            }
        }
        let index = Arc::new(crate::index::Index::load(
            paths.data_dir.join("sandboxes.json"),
        ));
        // What providers report on their own (expiries, sandboxes made on their backend)
        // keeps the index right too.
        events.set_index(index.clone());
        let version = std::env::var("ABX_BROKER_VERSION")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| crate::VERSION.to_owned());
        let max_message = std::env::var("ABX_MAX_MESSAGE_SIZE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(abx_protocol::DEFAULT_MAX_MESSAGE_SIZE);
        let pool = std::env::var("ABX_MEMORY_BUDGET")
            .ok()
            .and_then(|v| {
                let n = crate::local::limits::parse_size(&v);
                if n.is_none() {
                    tracing::warn!(value = %v, "ignoring ABX_MEMORY_BUDGET: not a size");
                }
                n
            })
            .map_or(crate::conn::DEFAULT_POOL, |n| n as usize);
        Broker {
            version,
            pool: crate::conn::Pool::new(pool),
            paths,
            shutdown: CancellationToken::new(),
            max_message,
            registry,
            index,
            handles: Default::default(),
            events,
            started: Instant::now(),
            started_wall: SystemTime::now(),
            next_conn: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Milliseconds since start.
    pub fn uptime_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Seconds since the epoch at start.
    pub fn started_unix(&self) -> u64 {
        self.started_wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Requests being served right now, over all connections.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn conn_opened(self: &Arc<Self>) -> (u64, Counted) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        (
            self.next_conn.fetch_add(1, Ordering::Relaxed),
            Counted(self.clone(), |b| &b.connections),
        )
    }

    pub(crate) fn request_started(self: &Arc<Self>) -> Counted {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Counted(self.clone(), |b| &b.in_flight)
    }
}

/// Decrements one of the broker's counters when dropped.
pub(crate) struct Counted(Arc<Broker>, fn(&Broker) -> &AtomicUsize);

impl Drop for Counted {
    fn drop(&mut self) {
        (self.1)(&self.0).fetch_sub(1, Ordering::Relaxed);
    }
}

/// The soft and hard open-file limits the daemon started with (0: not raised).
static FD_LIMIT: [std::sync::atomic::AtomicU64; 2] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// Mark every descriptor above stderr close-on-exec: whatever the daemon inherited from
/// whoever started it (an editor, a shell with `exec 8>>file`) must never reach a sandbox or a
/// plugin. Called first thing by the daemon and the stdio broker; descriptors the daemon
/// opens later are close-on-exec anyway (Rust opens every descriptor that way).
pub fn cloexec_inherited_fds() {
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC; no memory arguments.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc != 0 {
        // Before Linux 5.11: one fcntl per open descriptor.
        if let Ok(rd) = std::fs::read_dir("/proc/self/fd") {
            let fds: Vec<i32> = rd
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|fd| *fd > 2)
                .collect();
            for fd in fds {
                // SAFETY: fcntl on a descriptor number; harmless if it closed meanwhile.
                unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            }
        }
    }
}

/// In a child between fork and exec: close every descriptor above stderr that is not
/// close-on-exec (async-signal-safe).
pub fn close_inherited_in_child() {
    // SAFETY: close_range(2); no memory arguments.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// In a child between fork and exec (a system call, no allocation): give back the soft
/// open-file limit the daemon started with, so commands and plugins see the usual one.
pub fn restore_fd_limit_in_child() {
    let cur = FD_LIMIT[0].load(Ordering::Relaxed);
    if cur == 0 {
        return;
    }
    let l = libc::rlimit {
        rlim_cur: cur,
        rlim_max: FD_LIMIT[1].load(Ordering::Relaxed),
    };
    // SAFETY: setrlimit with a struct on the stack.
    unsafe {
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
    }
}

/// Raise the soft open-file limit to the hard one (at most 1M): every connection, plugin pipe
/// and exec stream is a descriptor, and the common soft limit of 1024 ends near 1000 clients.
/// Children get the original back ([`restore_fd_limit_in_child`]).
pub fn raise_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit with a struct on the stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            let want = l.rlim_max.min(1 << 20);
            if want > l.rlim_cur {
                FD_LIMIT[0].store(l.rlim_cur, Ordering::Relaxed);
                FD_LIMIT[1].store(l.rlim_max, Ordering::Relaxed);
                l.rlim_cur = want;
                libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            }
        }
    }
}

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
    }
}
