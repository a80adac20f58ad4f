//! Broker-wide state shared by every connection.

use abx_home::Paths;
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
    pub pool: crate::outbound::Pool,
    /// Whether `$/abx/test/*` is served.
    pub test_hooks: bool,
    /// Members every method's params also take (see [`Settings::extra_members`]).
    pub extra_members: &'static [&'static str],
    /// The composition root's methods (see [`Methods`]).
    pub methods: Option<Arc<dyn Methods>>,
    /// The commands run in each sandbox (`sandbox/log`).
    pub cmdlog: Arc<crate::cmdlog::CmdLog>,
    started: Instant,
    started_wall: SystemTime,
    next_conn: AtomicU64,
    connections: AtomicUsize,
    in_flight: AtomicUsize,
}

/// What the composition root decides for the core (read from the environment and the
/// config by the daemon; tests set it directly).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Version reported to clients.
    pub version: String,
    /// Message size limit per message.
    pub max_message: usize,
    /// The broker-wide memory budget in bytes.
    pub memory_budget: usize,
    /// Serve the `$/abx/test/*` methods (test suites only).
    pub test_hooks: bool,
    /// Members the broker lets through on every method beside those its params type names
    /// (`abx_protocol::api::params`): the control members of the core tests' test provider.
    /// None (the default) anywhere else: the daemon never sets it, so a member a method does
    /// not take is refused before any provider sees it.
    pub extra_members: &'static [&'static str],
    /// Entries `sandbox/log` keeps per sandbox (the oldest dropped beyond it).
    pub log_entries: usize,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            version: abx_home::VERSION.to_owned(),
            max_message: abx_protocol::DEFAULT_MAX_MESSAGE_SIZE,
            memory_budget: crate::outbound::DEFAULT_POOL,
            test_hooks: false,
            extra_members: &[],
            log_entries: crate::cmdlog::MAX_ENTRIES,
        }
    }
}

/// Methods the composition root serves beside the core's own (the daemon's `provider/*`
/// management methods and the contract kit). The core routes a method here when
/// [`Methods::serves`] says so (by default: it is in [`Methods::names`]), after its own table.
pub trait Methods: Send + Sync {
    /// The methods this table serves (listed by `initialize` beside the core's).
    fn names(&self) -> &[&'static str];
    /// True for a method this table serves.
    fn serves(&self, method: &str) -> bool {
        self.names().contains(&method)
    }
    /// Serve one request.
    fn call<'a>(
        &'a self,
        cx: &'a Cx,
        method: &'a str,
        params: Option<Box<serde_json::value::RawValue>>,
    ) -> crate::provider::BoxFut<'a, crate::cx::Reply>;
}

/// What the core's handlers (and the composition root's [`Methods`]) get: a
/// [`crate::cx::Cx`] of this broker.
pub type Cx = crate::cx::Cx<Broker>;

impl Broker {
    /// A broker over `providers` (the first is the default until told otherwise), with the
    /// sandbox index under `paths.data_dir`. `events` is the hub the providers were given.
    /// Reads no environment: everything comes from the caller.
    pub fn new(
        paths: Paths,
        settings: Settings,
        providers: Vec<Arc<dyn crate::provider::Provider>>,
        events: crate::events::Events,
        methods: Option<Arc<dyn Methods>>,
    ) -> Broker {
        let registry = crate::provider::Registry::new(providers);
        let index = Arc::new(crate::index::Index::load(
            paths.data_dir.join("sandboxes.json"),
        ));
        // What providers report on their own (expiries, sandboxes made on their backend)
        // keeps the index right too.
        events.set_index(index.clone());
        // A sandbox that is killed or expires takes its command log with it (so does one of a
        // builtin provider that ended while the daemon was down).
        let cmdlog =
            crate::cmdlog::CmdLog::new(paths.data_dir.join("cmdlog"), settings.log_entries);
        events.set_cmdlog(cmdlog.clone());
        cmdlog.sweep(&registry);
        let pool = crate::outbound::Pool::new(settings.memory_budget);
        // Change notifications are counted in it too (once each, shared by every subscriber).
        events.set_pool(pool.clone());
        // A message is counted in the budget while it is read (issue 42): one larger than half
        // of it could never be read beside another, so the limit follows a small budget.
        let max_message = settings.max_message.min(pool.cap() / 2).max(1);
        if max_message < settings.max_message {
            tracing::info!(
                budget = pool.cap(),
                max_message,
                "the message size limit is half the memory budget"
            );
        }
        Broker {
            version: settings.version,
            pool,
            paths,
            shutdown: CancellationToken::new(),
            max_message,
            test_hooks: settings.test_hooks,
            extra_members: settings.extra_members,
            registry,
            index,
            handles: Default::default(),
            events,
            methods,
            cmdlog,
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
