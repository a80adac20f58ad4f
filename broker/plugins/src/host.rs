//! The EPP/1 host: one child process per provider, shared by every client (docs/design.md#epp).
//!
//! Three tasks per running child (after helix-lsp): a reader (stdout: replies and
//! notifications), a stderr logger (secrets redacted, last lines kept for error details)
//! and a writer (stdin). The host owns the id counter and the map of pending calls; clients'
//! ids never reach the plugin.
//!
//! - **Handshake:** `initialize` must answer `protocol: "EPP/1"`, the manifest's id, and
//!   features that the manifest declares (else E8002/E8003); then `initialized`.
//! - **Streams:** when a reply to `exec/start`/`exec/attach`/`files/watch` passes, the reader
//!   records which connection owns that exec or watch id, and the stream's notifications go
//!   to it alone, through a per-stream forwarder that waits until the client has the reply.
//! - **Faults:** end of stdout fails every pending call with E8007 and the tail of stderr;
//!   garbage or an oversized line kills the child (E8009); a call that gets no answer in time
//!   is E8008. The next call restarts the child after a backoff; five crashes in a minute
//!   disable it until `provider/doctor` or a reinstall resets it, and so do five failed
//!   starts in a row (a plugin that hangs at the handshake fails only every 15 s).
//! - **Idle:** a child without calls or streams for `ABX_PLUGIN_IDLE_SECS` (300) is stopped.
//! - **Launch:** the child is the plugin launcher ([`super::launch`]): namespaces, a private
//!   copy verified as it is made, then the plugin. Its status line (fd 3) comes before the
//!   handshake: an integrity failure there is E8011 (not a crash), a setup failure E8002.
//!   `pid` is the launcher's: killing it ends the plugin's PID namespace.

use super::pace::{self, Pace, Spinner};
use super::stream::{self, Route};
use abx_core::outbound::{Hold, Outbound, Pool};
use abx_protocol::codec::{Frame, FrameCodec, Framing};
use abx_protocol::epp::{self, redact, PluginLine};
use abx_protocol::message;
use abx_protocol::{AbxError, ErrorCode, Id};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Largest line a plugin may send.
const MAX_LINE: usize = 64 * 1024 * 1024;
/// Bytes of a plugin's output the host holds outside the broker-wide budget (a line up to
/// this size, or the start of the next ones); a longer line is counted in the budget as it
/// grows, before its bytes are read (issue 42).
pub const LINE_ALLOWANCE: usize = 64 * 1024;
/// The most one read of a plugin's stdout takes.
const READ_CHUNK: usize = 256 * 1024;

/// Lines of stderr kept for error details.
const STDERR_TAIL: usize = 20;
/// Longest stderr line kept (the rest of a longer line is dropped).
const STDERR_LINE: usize = 16 * 1024;
/// Plugin stderr lines and `log` notifications written to the broker's log per second (the
/// rest are counted and reported, so a flooding plugin cannot fill the disk).
const LOG_LINES_PER_SEC: u32 = 100;

/// A per-second budget of log lines.
#[derive(Default)]
struct LogLimit {
    window: Option<Instant>,
    used: u32,
    dropped: u64,
}

impl LogLimit {
    /// Some(lines dropped since the last allowed one) when this line may be logged.
    fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .window
            .is_none_or(|w| now.duration_since(w) >= Duration::from_secs(1))
        {
            self.window = Some(now);
            self.used = 0;
        }
        if self.used < LOG_LINES_PER_SEC {
            self.used += 1;
            Some(std::mem::take(&mut self.dropped))
        } else {
            self.dropped += 1;
            None
        }
    }
}

/// Read one line into `line` (without its newline), keeping at most `cap` bytes. Ok(None) at
/// the end; Ok(Some(true)) when the line was cut.
async fn read_line_capped<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    line: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<Option<bool>> {
    use tokio::io::AsyncBufReadExt;
    line.clear();
    let mut cut = false;
    let mut any = false;
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok(any.then_some(cut));
        }
        any = true;
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        let room = cap.saturating_sub(line.len());
        line.extend_from_slice(&buf[..take.min(room)]);
        cut |= take > room;
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(Some(cut));
        }
    }
}

/// How long a plugin has to answer `initialize`: `ABX_PLUGIN_HANDSHAKE_SECS`, default 15.
fn handshake_timeout() -> Duration {
    std::env::var("ABX_PLUGIN_HANDSHAKE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(15), Duration::from_secs)
}

/// Crashes within [`CRASH_WINDOW`] that disable a plugin.
const CRASH_LIMIT: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(60);

/// Everything needed to start the child.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Provider id (from the manifest).
    pub id: String,
    /// The installed tree (cwd of the child).
    pub root: PathBuf,
    /// argv.
    pub command: Vec<String>,
    /// Extra environment (ABX_*, config env fallbacks).
    pub env: BTreeMap<String, String>,
    /// The plugin's private data dir.
    pub data_dir: PathBuf,
    /// Effective config sent in `initialize` (secrets included).
    pub config: serde_json::Map<String, Value>,
    /// Secret values, redacted from logs and error details.
    pub secrets: Vec<String>,
    /// Features the manifest declares.
    pub features: Vec<String>,
    /// Per-call timeout.
    pub call_timeout: Duration,
    /// The declared permissions, enforced on the child.
    pub permissions: Arc<super::permissions::Plan>,
    /// The installed tree's recorded digest: the launcher's private copy must match it.
    pub digest: String,
    /// The broker's directories hidden from the plugin (runtime, config, data).
    pub hide: Vec<PathBuf>,
    /// Where private copies go when the plugin runs without namespaces (0700, in the
    /// runtime dir).
    pub copies: PathBuf,
    /// Where the plugin's own `sandbox/changed` reports go.
    pub events: abx_core::events::Events,
}

/// What a started child told us in its handshake.
pub use abx_protocol::epp::Handshake;

type ReplyTx = oneshot::Sender<Result<Box<RawValue>, AbxError>>;

struct Pending {
    method: String,
    reply: ReplyTx,
    /// The budget the call's request reserved for its reply, lent while the plugin answers:
    /// the reader reads the reply (or, with the pool full, another line) into it.
    counted: Lent,
    conn: Option<Outbound>,
    replied: Option<CancellationToken>,
    /// When the call fails E8008 if unanswered, and its time limit (for the message);
    /// None for the handshake, which has its own.
    deadline: Option<(Instant, Duration)>,
}

/// A call's reply budget, lent to the reader (see [`Pending::counted`]).
#[derive(Default)]
struct Lent {
    /// What is left of it (the reader may have used some for a line).
    permit: Option<OwnedSemaphorePermit>,
    /// Where the reply's budget goes with the reply: the request's hold, so its reply is
    /// queued against the bytes the line was read into.
    back: Option<Hold>,
}

/// How long the sweeper stays awake with no call in flight before it parks until the next
/// call (at most the plugin's call timeout, so a call with that timeout made in the linger
/// does not wake it): calls made back to back, each answered before the next is sent, then
/// cost it no wakeup, instead of one each.
const SWEEP_LINGER: Duration = Duration::from_secs(5);

/// The longest the daemon waits for a plugin's answer, whatever time limit a call asks for
/// (`exec/run`'s `timeout` comes from the client): a year.
pub const MAX_CALL_WAIT: Duration = Duration::from_secs(366 * 86_400);

/// The sweeper's side of a running plugin. One task per plugin fails calls past their
/// deadline instead of a timer per call. It sleeps until the earliest deadline in flight
/// (`target`), and a new call wakes it only when its own deadline comes sooner, which is
/// rare since most calls share the plugin's time limit: a call registers no timer.
struct Sweep {
    /// Milliseconds after `epoch` the sweeper sleeps until; `u64::MAX` while parked.
    /// Stored with the pending map locked, so a call inserted after a scan sees the
    /// target that scan set.
    target: std::sync::atomic::AtomicU64,
    epoch: Instant,
    wake: tokio::sync::Notify,
    /// Times the sweeper woke, and times it scanned the calls in flight (tests hold both
    /// down with these).
    wakes: std::sync::atomic::AtomicU64,
    scans: std::sync::atomic::AtomicU64,
}

impl Default for Sweep {
    fn default() -> Self {
        Sweep {
            target: std::sync::atomic::AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            wake: tokio::sync::Notify::new(),
            wakes: Default::default(),
            scans: Default::default(),
        }
    }
}

impl Sweep {
    /// `at` in milliseconds after the epoch, rounded up (a wake at it is not early).
    fn ms(&self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.epoch);
        u64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u64::MAX - 1)
    }
}

struct Running {
    writer: mpsc::UnboundedSender<Vec<u8>>,
    /// The child's stdin, shared with the writer task: a call whose line fits in one
    /// atomic pipe write and finds it idle writes it itself ([`Running::send`]).
    stdin: Arc<tokio::sync::Mutex<tokio::process::ChildStdin>>,
    pending: Arc<Mutex<Calls>>,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    next_id: AtomicI64,
    pid: u32,
    isolation: String,
    dead: CancellationToken,
    handshake: Handshake,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    kill: CancellationToken,
    sweep: Arc<Sweep>,
    /// How soon the plugin answers, and a duplicate of its stdout to poll while a fast
    /// plugin's reply is on its way (pace.rs).
    pace: Arc<Pace>,
    watch: Option<Arc<std::os::fd::OwnedFd>>,
}

/// The one thread of the daemon that may be polling for a plugin's reply.
static SPINNER: Spinner = Spinner::new();

#[derive(Default)]
struct State {
    running: Option<Arc<Running>>,
    crashes: VecDeque<Instant>,
    /// Starts that failed in a row (no handshake since): a plugin that hangs at the
    /// handshake fails once per 15 s, never five times in a minute, and is disabled by this.
    failed_starts: usize,
    restarts: u64,
    disabled: Option<String>,
    last_used: Option<Instant>,
    last_error: Option<String>,
}

/// One plugin's host.
pub struct Host {
    spec: Mutex<Spec>,
    state: tokio::sync::Mutex<State>,
    status: Mutex<HostStatus>,
}

/// What `broker/status` and doctor show about a host.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostStatus {
    /// A child is running.
    pub running: bool,
    /// Its pid.
    pub pid: Option<u32>,
    /// Calls waiting for an answer.
    pub in_flight: usize,
    /// Restarts so far.
    pub restarts: u64,
    /// Why it is disabled, if it is.
    pub disabled: Option<String>,
    /// The last failure.
    pub last_error: Option<String>,
    /// How the running child is isolated: `namespaces`, or `none: <why>`.
    pub isolation: Option<String>,
}

impl Host {
    /// A host for `spec`; nothing starts until the first call.
    pub fn new(spec: Spec) -> Arc<Host> {
        let host = Arc::new(Host {
            spec: Mutex::new(spec),
            state: tokio::sync::Mutex::new(State::default()),
            status: Mutex::new(HostStatus::default()),
        });
        let weak = Arc::downgrade(&host);
        tokio::spawn(async move { idle_reaper(weak).await });
        host
    }

    fn id(&self) -> String {
        self.spec.lock().expect("spec").id.clone()
    }

    /// The plugin's confinement.
    pub fn permissions(&self) -> Arc<super::permissions::Plan> {
        self.spec.lock().expect("spec").permissions.clone()
    }

    /// Replace the spec (new config or a reinstall); the running child is stopped.
    pub async fn respec(&self, spec: Spec) {
        *self.spec.lock().expect("spec") = spec;
        self.stop().await;
        let mut st = self.state.lock().await;
        st.disabled = None;
        st.crashes.clear();
        st.failed_starts = 0;
    }

    /// Status for `broker/status` and doctor.
    pub fn status(&self) -> HostStatus {
        self.status.lock().expect("status").clone()
    }

    fn set_status(&self, st: &State) {
        let mut s = self.status.lock().expect("status");
        s.running = st.running.is_some();
        s.pid = st.running.as_ref().map(|r| r.pid);
        s.isolation = st.running.as_ref().map(|r| r.isolation.clone());
        s.in_flight = st
            .running
            .as_ref()
            .map_or(0, |r| r.pending.lock().expect("pending").len());
        s.restarts = st.restarts;
        s.disabled = st.disabled.clone();
        s.last_error = st.last_error.clone();
    }

    /// Forget the crash history (doctor, reinstall).
    pub async fn reset(&self) {
        let mut st = self.state.lock().await;
        st.disabled = None;
        st.crashes.clear();
        st.failed_starts = 0;
        self.set_status(&st);
    }

    /// The running child, started (with its handshake) if needed.
    async fn running(&self) -> Result<Arc<Running>, AbxError> {
        let mut st = self.state.lock().await;
        st.last_used = Some(Instant::now());
        if let Some(r) = st.running.clone() {
            if !r.dead.is_cancelled() {
                return Ok(r);
            }
        }
        // Boxed: the start and its backoff are a large future that every call's future
        // would otherwise carry (and copy) for the rare call that starts the plugin.
        Box::pin(self.start_locked(st)).await
    }

    /// [`Host::running`]'s slow path: the child is not running (it died, or never started).
    async fn start_locked(
        &self,
        mut st: tokio::sync::MutexGuard<'_, State>,
    ) -> Result<Arc<Running>, AbxError> {
        if st.running.is_some() {
            // It died on its own (stop() takes it out of the state first): a crash.
            st.running = None;
            st.crashes.push_back(Instant::now());
            st.last_error = Some("the plugin exited".into());
            if st.crashes.len() >= CRASH_LIMIT {
                st.disabled = Some(format!("crashed {} times in a minute", st.crashes.len()));
            }
        }
        let id = self.id();
        if let Some(why) = &st.disabled {
            return Err(AbxError::new(ErrorCode::PluginCrashed, &[("provider", &id), ("detail", why)])
                .with_suggestion(format!(
                    "It was disabled after crashing repeatedly; run 'abx provider doctor {id}' to retry."
                )));
        }
        // Backoff after recent crashes: 0, 100 ms, 200 ms, 400 ms ...
        let now = Instant::now();
        st.crashes.retain(|t| now.duration_since(*t) < CRASH_WINDOW);
        if let Some(last) = st.crashes.back() {
            let backoff = Duration::from_millis(100 * (1 << st.crashes.len().min(5)) / 2);
            let since = now.duration_since(*last);
            if since < backoff {
                tokio::time::sleep(backoff - since).await;
            }
        }
        let spec = self.spec.lock().expect("spec").clone();
        match start(&spec).await {
            Ok(r) => {
                st.failed_starts = 0;
                if !st.crashes.is_empty() {
                    info!(provider = %id, "plugin restarted");
                    st.restarts += 1;
                }
                st.running = Some(r.clone());
                self.set_status(&st);
                Ok(r)
            }
            Err(e) if e.code == ErrorCode::IntegrityFailed => {
                // The private copy did not match: nothing ran, nothing crashed.
                st.last_error = Some(e.message.clone());
                self.set_status(&st);
                Err(e)
            }
            Err(e) => {
                st.crashes.push_back(Instant::now());
                st.failed_starts += 1;
                st.last_error = Some(e.message.clone());
                if st.crashes.len() >= CRASH_LIMIT {
                    st.disabled = Some(format!(
                        "failed {} times in a minute: {}",
                        st.crashes.len(),
                        e.message
                    ));
                } else if st.failed_starts >= CRASH_LIMIT {
                    st.disabled = Some(format!(
                        "failed to start {} times in a row: {}",
                        st.failed_starts, e.message
                    ));
                }
                self.set_status(&st);
                Err(e)
            }
        }
    }

    /// The handshake of the running child (starting it if needed).
    pub async fn handshake(&self) -> Result<Handshake, AbxError> {
        Ok(self.running().await?.handshake.clone())
    }

    /// Call a method on the plugin. `conn` and `replied` route the stream that the reply may
    /// open (exec/start, files/watch) to the calling connection. `hold`: the request's reply
    /// budget, lent while the plugin answers and given back with the reply's own (see
    /// [`Pending::counted`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn call<P: serde::Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        conn: Option<Outbound>,
        replied: Option<CancellationToken>,
        cancel: Option<CancellationToken>,
        timeout: Option<Duration>,
        hold: Option<Hold>,
    ) -> Result<Box<RawValue>, AbxError> {
        let encode = |id: &Id| message::encode_request(id, method, Some(params));
        self.call_encoded(method, encode, conn, replied, cancel, timeout, hold)
            .await
    }

    /// [`Host::call`] with params the host owns: they are freed once the request line
    /// is written, not held until the reply (a 64 MiB `files/write` is held once, briefly).
    #[allow(clippy::too_many_arguments)]
    pub async fn call_owned(
        &self,
        method: &str,
        params: Box<RawValue>,
        conn: Option<Outbound>,
        replied: Option<CancellationToken>,
        cancel: Option<CancellationToken>,
        timeout: Option<Duration>,
        hold: Option<Hold>,
    ) -> Result<Box<RawValue>, AbxError> {
        let encode = move |id: &Id| message::encode_request(id, method, Some(&*params));
        self.call_encoded(method, encode, conn, replied, cancel, timeout, hold)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn call_encoded(
        &self,
        method: &str,
        encode: impl FnOnce(&Id) -> Vec<u8>,
        conn: Option<Outbound>,
        replied: Option<CancellationToken>,
        cancel: Option<CancellationToken>,
        timeout: Option<Duration>,
        hold: Option<Hold>,
    ) -> Result<Box<RawValue>, AbxError> {
        let r = self.running().await?;
        let id_num = r.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let spec_timeout = self.spec.lock().expect("spec").call_timeout;
        let limit = timeout.unwrap_or(spec_timeout).min(MAX_CALL_WAIT);
        let counted = Lent {
            permit: hold.as_ref().and_then(|h| h.lock().expect("hold").take()),
            back: hold,
        };
        let call = Pending {
            method: method.to_owned(),
            reply: tx,
            conn,
            replied,
            deadline: Some((Instant::now() + limit, limit)),
            counted,
        };
        let n = track(&r.pending, &r.sweep, id_num, call);
        // `broker/status` counts it from now on (one uncontended lock, no allocation).
        self.status.lock().expect("status").in_flight = n;
        // `encode` owns what it encodes: owned params are freed here, before the wait.
        let mut line = encode(&Id::Num(id_num));
        line.push(b'\n');
        let sent = Instant::now();
        if !r.send(line) {
            r.pending.lock().expect("pending").remove(&id_num);
            return Err(self.crashed_error(&r, "its stdin is closed"));
        }
        // The only call in flight to a plugin that answers within microseconds: its reply
        // is polled for before this task waits, so no sleeping CPU has to wake for it.
        if n == 1 {
            if let Some(fd) = &r.watch {
                let budget = r.pace.budget(pace::cpus());
                if !budget.is_zero() {
                    SPINNER.poll(fd.as_fd(), sent, budget);
                }
            }
        }
        // If this call is dropped unanswered (the client cancelled, or went away), the plugin
        // hears `$/cancelRequest` for it; answered or not, the count of calls in flight is
        // brought up to date (only that changes per call, the rest of the status when the
        // process starts, stops or fails: no allocation on this path).
        let _guard = CancelOnDrop {
            writer: &r.writer,
            pending: &r.pending,
            id: id_num,
            status: &self.status,
        };
        let cancelled = async {
            match &cancel {
                Some(c) => c.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // The reply, or E8008 from the sweeper (which told the plugin to cancel).
            res = rx => match res {
                Ok(res) => {
                    r.pace.record(sent.elapsed());
                    res
                }
                Err(_) => Err(self.crashed_error(&r, "it exited")),
            },
            // (The guard tells the plugin.)
            _ = cancelled => Err(AbxError::new(ErrorCode::RequestCancelled, &[])),
        }
    }

    fn crashed_error(&self, r: &Running, what: &str) -> AbxError {
        let secrets = self.spec.lock().expect("spec").secrets.clone();
        let tail = last_lines(&r.stderr_tail, 3);
        let detail = if tail.is_empty() {
            what.to_owned()
        } else {
            format!("{what}; stderr: {}", redact(&tail.join(" | "), &secrets))
        };
        AbxError::new(
            ErrorCode::PluginCrashed,
            &[("provider", &self.id()), ("detail", &detail)],
        )
    }

    /// True when a stream id (exec or watch) is routed through this host and has not
    /// ended (an exec's `exec/exit` not seen yet).
    pub async fn has_route(&self, stream: &str) -> bool {
        let st = self.state.lock().await;
        st.running.as_ref().is_some_and(|r| {
            r.routes
                .lock()
                .expect("routes")
                .get(stream)
                .is_some_and(|r| !r.ended)
        })
    }

    /// `exec/attach` served by the host: when the running plugin's exec `exec_id` has a
    /// route (it runs, or its exit reached no client yet), its stream goes to `conn` from
    /// now on and what was kept while nobody received it is replayed after the reply
    /// (`replied`). `None`: no such route (the plugin is asked instead).
    pub async fn attach(
        &self,
        exec_id: &str,
        conn: Outbound,
        replied: CancellationToken,
    ) -> Option<Value> {
        let running = self.state.lock().await.running.clone()?;
        let tx = running
            .routes
            .lock()
            .expect("routes")
            .get(exec_id)
            .map(|r| r.tx.clone())?;
        let a = stream::attach(&tx, conn, replied).await?;
        Some(json!({
            "execId": exec_id,
            "running": a.running,
            "replayed": a.replayed,
            "droppedBytes": a.dropped_bytes,
        }))
    }

    /// Stop the child: `shutdown`, `exit`, then kill after a grace period.
    pub async fn stop(&self) {
        let running = self.state.lock().await.running.take();
        let Some(r) = running else { return };
        let (tx, rx) = oneshot::channel();
        let id_num = r.next_id.fetch_add(1, Ordering::Relaxed);
        r.pending.lock().expect("pending").insert(
            id_num,
            Pending {
                method: "shutdown".into(),
                reply: tx,
                conn: None,
                replied: None,
                deadline: None,
                counted: Lent::default(),
            },
        );
        let mut line = message::encode_request(&Id::Num(id_num), "shutdown", None::<&Value>);
        line.push(b'\n');
        let _ = r.writer.send(line);
        let _ = tokio::time::timeout(Duration::from_secs(2), rx).await;
        let mut exit = message::encode_notification("exit", None::<&Value>);
        exit.push(b'\n');
        let _ = r.writer.send(exit);
        if tokio::time::timeout(Duration::from_secs(2), r.dead.cancelled())
            .await
            .is_err()
        {
            r.kill.cancel();
        }
        let st = self.state.lock().await;
        self.set_status(&st);
    }
}

impl Running {
    /// Queue or write one line to the plugin. A line that fits in one atomic pipe write
    /// (`PIPE_BUF`) is written by the caller when stdin is idle and has room: one system
    /// call, no hand-off to the writer task. Never waits, so a dropped caller can never leave
    /// half a line behind; false when the writer task is gone (stdin closed).
    fn send(&self, line: Vec<u8>) -> bool {
        use futures::FutureExt;
        if line.len() <= PIPE_BUF {
            if let Ok(mut stdin) = self.stdin.try_lock() {
                // Polled once: on a pipe a write of at most PIPE_BUF bytes is all or nothing.
                match stdin.write(&line).now_or_never() {
                    Some(Ok(n)) if n == line.len() => return true,
                    // (Not on a pipe.) The rest goes after it, through the queue.
                    Some(Ok(n)) => return self.writer.send(line[n..].to_vec()).is_ok(),
                    // A closed stdin: as before, the queue says so once the writer task
                    // has seen it, and the reader fails the call when the plugin is gone.
                    Some(Err(_)) | None => {}
                }
            }
        }
        self.writer.send(line).is_ok()
    }
}

/// The last `n` lines of a plugin's stderr tail, oldest first.
fn last_lines(tail: &Mutex<VecDeque<String>>, n: usize) -> Vec<String> {
    let t = tail.lock().expect("tail");
    t.iter().skip(t.len().saturating_sub(n)).cloned().collect()
}

/// POSIX's bound on atomic pipe writes (Linux: 4096).
const PIPE_BUF: usize = 4096;

/// The calls in flight to one plugin, by the broker's own id for each (a counter, never a
/// client's or the plugin's choice). Hashed by one multiplication rather than SipHash, which
/// every call paid for twice (issue 25): keys nobody else picks need no defence against
/// collisions.
type Calls = HashMap<i64, Pending, std::hash::BuildHasherDefault<CounterHasher>>;

/// A hasher for counter keys (see [`Calls`]): the key times a 64-bit odd constant, so that
/// consecutive keys differ in the top bits hashbrown probes with.
#[derive(Default)]
struct CounterHasher(u64);

impl std::hash::Hasher for CounterHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_i64(&mut self, n: i64) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

struct CancelOnDrop<'a> {
    writer: &'a mpsc::UnboundedSender<Vec<u8>>,
    pending: &'a Mutex<Calls>,
    id: i64,
    status: &'a Mutex<HostStatus>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let (unanswered, in_flight) = {
            let mut pending = self.pending.lock().expect("pending");
            (pending.remove(&self.id).is_some(), pending.len())
        };
        if unanswered {
            let _ = self.writer.send(cancel_line(self.id));
        }
        self.status.lock().expect("status").in_flight = in_flight;
    }
}

/// The `$/cancelRequest` line for the host's request `id`.
fn cancel_line(id: i64) -> Vec<u8> {
    let mut line = message::encode_notification("$/cancelRequest", Some(&json!({"id": id})));
    line.push(b'\n');
    line
}

/// Record a call in flight (the count of calls in flight is returned); the sweeper fails
/// it E8008 past its deadline, and is woken for it only if that comes before the deadline
/// the sweeper sleeps toward. The call lowers that target itself, so the woken sweeper only
/// sleeps again, toward the new target: a stream of calls with ever shorter time limits
/// costs a wakeup each, never a scan of every call in flight.
fn track(pending: &Mutex<Calls>, sweep: &Sweep, id: i64, call: Pending) -> usize {
    let at = call.deadline.map(|(at, _)| sweep.ms(at));
    let n = {
        let mut p = pending.lock().expect("pending");
        p.insert(id, call);
        p.len()
    };
    // After the insert: a scan that saw the map before it stored its target first (with
    // the map locked), and a scan after it sees this call.
    if let Some(at) = at {
        if sweep.target.fetch_min(at, Ordering::AcqRel) > at {
            sweep.wake.notify_one();
        }
    }
    n
}

/// Fail a running plugin's calls that are past their deadline (E8008), telling the plugin
/// to cancel each, until the plugin is gone. Between scans it sleeps until the earliest
/// deadline in flight, or `linger` when none is, then parks until a call wakes it.
async fn sweep(
    provider: String,
    pending: Arc<Mutex<Calls>>,
    sweep: Arc<Sweep>,
    writer: mpsc::UnboundedSender<Vec<u8>>,
    dead: CancellationToken,
    linger: Duration,
) {
    let mut idle_since: Option<Instant> = None;
    loop {
        sweep.scans.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let (expired, next) = {
            let mut p = pending.lock().expect("pending");
            let mut ids = Vec::new();
            let mut next: Option<Instant> = None;
            for (id, c) in p.iter() {
                match c.deadline {
                    Some((at, _)) if at <= now => ids.push(*id),
                    Some((at, _)) => next = Some(next.map_or(at, |n| n.min(at))),
                    None => {}
                }
            }
            let expired: Vec<(i64, Pending)> = ids
                .into_iter()
                .filter_map(|id| p.remove(&id).map(|c| (id, c)))
                .collect();
            // With no call in flight, stay awake for `linger` (calls back to back then cost
            // no wakeup) before parking until a call wakes it.
            let next = if next.is_some() || !p.is_empty() {
                idle_since = None;
                next
            } else {
                let since = *idle_since.get_or_insert(now);
                if now < since + linger {
                    Some(since + linger)
                } else {
                    idle_since = None;
                    None
                }
            };
            let target = next.map_or(u64::MAX, |at| sweep.ms(at));
            sweep.target.store(target, Ordering::Release);
            (expired, next)
        };
        for (id, call) in expired {
            let _ = writer.send(cancel_line(id));
            let limit = call.deadline.map_or(0, |(_, l)| l.as_secs());
            let _ = call.reply.send(Err(AbxError::new(
                ErrorCode::PluginTimedOut,
                &[
                    ("provider", &provider),
                    ("method", &call.method),
                    ("timeout", &limit.to_string()),
                ],
            )));
        }
        // Until the target is due: a call that lowered it wakes the sweeper to sleep toward
        // the new one, with no scan.
        let mut next = next;
        loop {
            let until = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = until => {
                    sweep.wakes.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                _ = sweep.wake.notified() => {}
                _ = dead.cancelled() => return,
            }
            sweep.wakes.fetch_add(1, Ordering::Relaxed);
            let t = sweep.target.load(Ordering::Acquire);
            if let Some(at) = (t != u64::MAX)
                .then(|| sweep.epoch.checked_add(Duration::from_millis(t)))
                .flatten()
            {
                next = Some(at);
            }
        }
    }
}

async fn idle_reaper(weak: std::sync::Weak<Host>) {
    let idle = std::env::var("ABX_PLUGIN_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(300), Duration::from_secs);
    loop {
        tokio::time::sleep(
            idle.min(Duration::from_secs(5))
                .max(Duration::from_millis(200)),
        )
        .await;
        let Some(host) = weak.upgrade() else { return };
        let stop = {
            let st = host.state.lock().await;
            match (&st.running, st.last_used) {
                (Some(r), Some(t)) => {
                    t.elapsed() >= idle
                        && r.pending.lock().expect("pending").is_empty()
                        && r.routes.lock().expect("routes").is_empty()
                }
                _ => false,
            }
        };
        if stop {
            info!(provider = %host.id(), "stopping idle plugin");
            host.stop().await;
        }
    }
}

/// Spawn the child and run the handshake.
async fn start(spec: &Spec) -> Result<Arc<Running>, AbxError> {
    let handshake_failed = |d: &str| {
        AbxError::new(
            ErrorCode::HandshakeFailed,
            &[("provider", &spec.id), ("detail", d)],
        )
    };
    let (program, args) = spec
        .command
        .split_first()
        .ok_or_else(|| handshake_failed("the manifest has an empty runtime command"))?;
    let program = program.clone();
    // The plugin's whole environment; the launcher gets only its config (and the Landlock
    // cap, so it builds the ruleset the daemon's coverage describes).
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
        ),
        (
            "HOME".into(),
            std::env::var("HOME").unwrap_or_else(|_| "/".into()),
        ),
        ("LANG".into(), "C.UTF-8".into()),
        ("ABX_PROTOCOL".into(), "EPP/1".into()),
        ("ABX_PROVIDER_ID".into(), spec.id.clone()),
        (
            "ABX_DATA_DIR".into(),
            spec.data_dir.to_string_lossy().into_owned(),
        ),
    ];
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut keep = vec![spec.data_dir.clone()];
    if let Some(tmp) = &spec.permissions.tmp_dir {
        let _ = std::fs::create_dir_all(tmp);
        env.push(("TMPDIR".into(), tmp.to_string_lossy().into_owned()));
        keep.push(tmp.clone());
    }
    // E8016 when the declarations cannot be enforced (mode `refuse`), before anything starts;
    // the launcher builds the ruleset itself, after composing the plugin's mounts.
    drop(spec.permissions.prepare(&spec.id)?);
    let _ = abx_home::paths::ensure_private_dir(&spec.copies);
    let copy_dir = spec.copies.join(format!(
        "{}.{}.{}",
        spec.id,
        std::process::id(),
        COPIES.fetch_add(1, Ordering::Relaxed)
    ));
    let cfg = super::launch::Config {
        id: spec.id.clone(),
        tree: spec.root.clone(),
        digest: spec.digest.clone(),
        copy_dir: copy_dir.clone(),
        program: program.clone(),
        args: args.to_vec(),
        env,
        hide: spec.hide.clone(),
        keep,
        policy: spec.permissions.policy.clone(),
        namespaces: super::launch::namespaces_wanted(),
    };
    let cfg_json = serde_json::to_string(&cfg).map_err(AbxError::internal)?;
    let (status_rx, status_tx) =
        super::launch::status_pipe().map_err(|e| handshake_failed(&format!("status pipe: {e}")))?;
    let mut cmd = tokio::process::Command::new(super::launch::program());
    cmd.arg0("abx-plugin-launch")
        .arg(super::launch::ARG)
        .current_dir("/")
        .env_clear()
        .env(super::launch::CONFIG_ENV, cfg_json)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Ok(v) = std::env::var(abx_confine::ABI_MAX_ENV) {
        cmd.env(abx_confine::ABI_MAX_ENV, v);
    }
    let status_fd = status_tx.as_raw_fd();
    // SAFETY: system calls only: its own process group (a kill takes its children), nothing
    // inherited but stdio and the status pipe (fd 3), the usual open-file limit.
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            abx_confine::fds::close_inherited_in_child();
            abx_confine::fds::restore_fd_limit_in_child();
            if status_fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0);
            } else if libc::dup2(status_fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| handshake_failed(&format!("cannot start the plugin launcher: {e}")))?;
    drop(status_tx);
    let pid = child.id().unwrap_or(0);
    super::launch::register(pid as i32, &spec.id);
    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let watch = stdout.as_fd().try_clone_to_owned().ok().map(Arc::new);
    let stderr = child.stderr.take().expect("piped");

    let pending: Arc<Mutex<Calls>> = Arc::default();
    let routes: Arc<Mutex<HashMap<String, Route>>> = Arc::default();
    let dead = CancellationToken::new();
    let kill = CancellationToken::new();
    let stderr_tail: Arc<Mutex<VecDeque<String>>> = Arc::default();

    // stderr: the plugin's log, redacted.
    {
        let tail = stderr_tail.clone();
        let secrets = spec.secrets.clone();
        let id = spec.id.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stderr);
            let mut limit = LogLimit::default();
            let mut line = Vec::new();
            // Lines are cut at STDERR_LINE bytes (the rest until the newline is dropped), so
            // an endless line costs no memory.
            while let Ok(Some(cut)) = read_line_capped(&mut reader, &mut line, STDERR_LINE).await {
                let mut text = redact(&String::from_utf8_lossy(&line), &secrets);
                if cut {
                    text.push_str(" [line cut]");
                }
                if let Some(dropped) = limit.allow() {
                    if dropped > 0 {
                        info!(provider = %id, "plugin: ({dropped} lines not logged: over {LOG_LINES_PER_SEC} a second)");
                    }
                    info!(provider = %id, "plugin: {text}");
                }
                let mut t = tail.lock().expect("tail");
                t.push_back(text);
                while t.len() > STDERR_TAIL {
                    t.pop_front();
                }
            }
        });
    }
    // stdin writer: whatever cannot be written at once by its sender.
    let (wtx, mut wrx) = mpsc::unbounded_channel::<Vec<u8>>();
    let stdin = Arc::new(tokio::sync::Mutex::new(stdin));
    {
        let stdin = stdin.clone();
        tokio::spawn(async move {
            while let Some(first) = wrx.recv().await {
                let mut buf = first;
                while let Ok(more) = wrx.try_recv() {
                    buf.extend_from_slice(&more);
                    if buf.len() > 1024 * 1024 {
                        break;
                    }
                }
                let mut stdin = stdin.lock().await;
                if stdin.write_all(&buf).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
        });
    }
    let running = Arc::new(Running {
        writer: wtx,
        stdin,
        pending: pending.clone(),
        routes: routes.clone(),
        next_id: AtomicI64::new(1),
        pid,
        isolation: String::new(),
        dead: dead.clone(),
        handshake: Handshake {
            name: String::new(),
            version: String::new(),
            features: vec![],
        },
        stderr_tail: stderr_tail.clone(),
        kill: kill.clone(),
        sweep: Arc::default(),
        pace: Arc::default(),
        watch,
    });
    tokio::spawn(sweep(
        spec.id.clone(),
        pending.clone(),
        running.sweep.clone(),
        running.writer.clone(),
        dead.clone(),
        SWEEP_LINGER.min(spec.call_timeout),
    ));
    // stdout reader, and the child's end.
    {
        let id = spec.id.clone();
        let pending = pending.clone();
        let routes = routes.clone();
        let dead = dead.clone();
        let writer = running.writer.clone();
        let tail = stderr_tail.clone();
        let secrets = spec.secrets.clone();
        let events = spec.events.clone();
        tokio::spawn(async move {
            let plugin = PluginIo {
                id: &id,
                secrets: &secrets,
                writer: &writer,
                events: &events,
            };
            let why = read_loop(&plugin, stdout, &pending, &routes, &kill, &mut child).await;
            // Give stderr a moment to deliver the last words.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = child.start_kill();
            let status = child.wait().await.ok();
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            super::launch::forget(pid as i32);
            // The private copy of a plugin run without namespaces (its launcher removes it,
            // unless it was killed first).
            let _ = std::fs::remove_dir_all(&copy_dir);
            let tail = last_lines(&tail, 3);
            let detail = format!(
                "{why} ({}){}",
                status.map_or_else(|| "no status".into(), |s| s.to_string()),
                if tail.is_empty() {
                    String::new()
                } else {
                    format!("; stderr: {}", redact(&tail.join(" | "), &secrets))
                }
            );
            let code = if why.starts_with("sent") {
                ErrorCode::BadPluginReply
            } else {
                ErrorCode::PluginCrashed
            };
            let drained: Vec<Pending> = pending
                .lock()
                .expect("pending")
                .drain()
                .map(|(_, p)| p)
                .collect();
            if !drained.is_empty() {
                warn!(provider = %id, calls = drained.len(), "plugin gone with calls in flight: {detail}");
            }
            for p in drained {
                let e = AbxError::new(code, &[("provider", &id), ("detail", &detail)]);
                let _ = p.reply.send(Err(e));
            }
            // Streams of a dead plugin end: tell their owners.
            let streams: Vec<(String, Route)> = routes.lock().expect("routes").drain().collect();
            for (sid, r) in streams {
                if sid.starts_with("watch:") {
                    continue;
                }
                let exit = message::encode_notification(
                    "exec/exit",
                    Some(
                        &json!({"execId": sid, "exitCode": null, "timedOut": false, "error": format!("provider '{id}' crashed")}),
                    ),
                );
                let _ = r.tx.send(exit, stream::Counted::none()).await;
            }
            dead.cancel();
        });
    }
    // The launcher's word: the private copy matched and the plugin runs, or why not.
    let limit = handshake_timeout();
    let said = read_status(status_rx, limit).await;
    let isolation = match super::launch::Status::parse(&said) {
        super::launch::Status::Started(None) => "namespaces".to_owned(),
        super::launch::Status::Started(Some(why)) => {
            warn!(provider = %spec.id, "the plugin runs without its own namespaces ({why}): peers descending from it are refused by ancestry, and it sees the broker's directories (Landlock still confines it)");
            format!("none: {why}")
        }
        super::launch::Status::Integrity(why) => {
            running.kill.cancel();
            warn!(provider = %spec.id, root = %spec.root.display(), "integrity check of the private copy failed, nothing ran: {why}");
            return Err(AbxError::new(
                ErrorCode::IntegrityFailed,
                &[("provider", &spec.id)],
            ));
        }
        super::launch::Status::Failed(why) => {
            running.kill.cancel();
            return Err(handshake_failed(&why));
        }
    };
    debug!(provider = %spec.id, isolation = %isolation, "plugin launched");
    // Handshake.
    let r = running.clone();
    let id_num = r.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    r.pending.lock().expect("pending").insert(
        id_num,
        Pending {
            method: "initialize".into(),
            reply: tx,
            conn: None,
            replied: None,
            deadline: None,
            counted: Lent::default(),
        },
    );
    let params = json!({
        "protocol": "EPP/1",
        "broker": {"name": "abx-broker", "version": abx_home::VERSION},
        "config": spec.config,
        "dataDir": spec.data_dir,
    });
    let mut line = message::encode_request(&Id::Num(id_num), "initialize", Some(&params));
    line.push(b'\n');
    let _ = r.writer.send(line);
    let reply = match tokio::time::timeout(limit, rx).await {
        Ok(Ok(Ok(v))) => v,
        Ok(Ok(Err(e))) => {
            r.kill.cancel();
            return Err(handshake_failed(&e.message));
        }
        Ok(Err(_)) => {
            r.kill.cancel();
            return Err(handshake_failed(
                "the plugin exited before answering initialize",
            ));
        }
        Err(_) => {
            r.kill.cancel();
            return Err(handshake_failed(&format!(
                "no answer to initialize within {} s",
                limit.as_secs()
            )));
        }
    };
    let handshake = match epp::check_handshake(&reply, &spec.id, &spec.features) {
        Ok(h) => h,
        Err(e) => {
            r.kill.cancel();
            return Err(e);
        }
    };
    let mut init = message::encode_notification("initialized", Some(&json!({})));
    init.push(b'\n');
    let _ = r.writer.send(init);
    debug!(provider = %spec.id, pid, "plugin started");
    // Rebuild with the handshake filled in (the tasks share the inner Arcs).
    Ok(Arc::new(Running {
        writer: r.writer.clone(),
        stdin: r.stdin.clone(),
        pending: r.pending.clone(),
        routes: r.routes.clone(),
        next_id: AtomicI64::new(r.next_id.load(Ordering::Relaxed)),
        pid,
        isolation,
        dead: r.dead.clone(),
        handshake,
        stderr_tail: r.stderr_tail.clone(),
        kill: r.kill.clone(),
        sweep: r.sweep.clone(),
        pace: r.pace.clone(),
        watch: r.watch.clone(),
    }))
}

/// Numbers private copies.
static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The launcher's status line (empty when it closed the pipe without one, or took longer
/// than `limit`).
async fn read_status(fd: std::os::fd::OwnedFd, limit: Duration) -> String {
    use tokio::io::AsyncBufReadExt;
    let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return String::new();
    };
    let mut line = String::new();
    let mut r = tokio::io::BufReader::new(rx).take(64 * 1024);
    match tokio::time::timeout(limit, r.read_line(&mut line)).await {
        Ok(Ok(_)) => line,
        Ok(Err(e)) => format!("error reading the launcher's status: {e}"),
        Err(_) => format!(
            "error the plugin launcher did not start the plugin within {} s",
            limit.as_secs()
        ),
    }
}

/// Who the reader reads for: the plugin's id, its secrets (redacted), its stdin, and where
/// its sandbox change reports go.
struct PluginIo<'a> {
    id: &'a str,
    secrets: &'a [String],
    writer: &'a mpsc::UnboundedSender<Vec<u8>>,
    events: &'a abx_core::events::Events,
}

/// A plugin's stdout as lines, each byte counted before it is read: up to
/// [`LINE_ALLOWANCE`] the host's own, beyond it in the broker-wide budget, grown with the
/// line (from what is free, else from the reply budget its calls in flight lent, else it
/// waits, not reading). Cancel-safe.
struct LineReader<R> {
    io: R,
    buf: bytes::BytesMut,
    codec: FrameCodec,
    /// Budget counted for the line in progress (it covers `covers` bytes beyond the
    /// allowance).
    held: Option<OwnedSemaphorePermit>,
    eof: bool,
}

/// One line read, and the budget it was read into (a line longer than the allowance).
type Line = (Frame, Option<OwnedSemaphorePermit>);

impl<R: tokio::io::AsyncRead + AsRawFd + Unpin> LineReader<R> {
    fn new(io: R) -> Self {
        LineReader {
            io,
            buf: bytes::BytesMut::with_capacity(LINE_ALLOWANCE),
            codec: FrameCodec::with_framing(Framing::Line, MAX_LINE),
            held: None,
            eof: false,
        }
    }

    fn covers(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.num_permits())
    }

    async fn next(&mut self, pool: &Pool, pending: &Mutex<Calls>) -> Option<std::io::Result<Line>> {
        use bytes::BufMut;
        loop {
            match self.codec.decode(&mut self.buf) {
                Ok(Some(f)) => return Some(Ok(self.took(f))),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
            if self.eof {
                return match self.codec.decode_eof(&mut self.buf) {
                    Ok(Some(f)) => Some(Ok(self.took(f))),
                    Ok(None) => None,
                    Err(e) => Some(Err(e)),
                };
            }
            let mut room = (LINE_ALLOWANCE + self.covers()).saturating_sub(self.buf.len());
            if room == 0 {
                // Grow the line's count: as much again as it has (at least 1 MiB), from what
                // the budget has free, else from what calls in flight lent; else wait.
                let step = self
                    .covers()
                    .max(1024 * 1024)
                    .min(MAX_LINE + 1 - self.covers().min(MAX_LINE));
                loop {
                    if let Some(more) = take_some(pool, pending, step) {
                        match &mut self.held {
                            Some(h) => h.merge(more),
                            None => self.held = Some(more),
                        }
                        break;
                    }
                    // Not reading while it waits: a plugin that exited meanwhile is seen
                    // by its pipe (its line can never end).
                    if pipe_closed(self.io.as_raw_fd()) {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                room = (LINE_ALLOWANCE + self.covers()).saturating_sub(self.buf.len());
            }
            let want = room.min(READ_CHUNK);
            if self.buf.capacity() - self.buf.len() < want {
                self.buf.reserve(want);
            }
            match self.io.read_buf(&mut (&mut self.buf).limit(want)).await {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// A line is out: it takes what was counted for it (trimmed to its size), and gets its
    /// buffer to itself when it is long (the next bytes go to a fresh one), so it is read in
    /// place.
    fn took(&mut self, f: Frame) -> Line {
        let held = self.held.take();
        let Frame::Message(bytes) = f else {
            return (f, None);
        };
        let Some(mut held) = held else {
            return (Frame::Message(bytes), None);
        };
        let keep = bytes.len().max(1);
        if held.num_permits() > keep {
            drop(held.split(held.num_permits() - keep));
        }
        let mut rest = bytes::BytesMut::with_capacity(LINE_ALLOWANCE.max(self.buf.len()));
        rest.extend_from_slice(&self.buf);
        self.buf = rest;
        (Frame::Message(bytes), Some(held))
    }
}

/// Whether every writer of the pipe `fd` reads from has closed it.
fn pipe_closed(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on a descriptor the caller owns; no timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

/// Up to `n` bytes of budget now: what the pool has free, else what the calls in flight
/// lent (their replies then take their room when they are queued). `None`: nothing now.
fn take_some(pool: &Pool, pending: &Mutex<Calls>, n: usize) -> Option<OwnedSemaphorePermit> {
    let free = pool.available().min(n);
    if free > 0 {
        if let Some(p) = pool.try_take_exact(free) {
            return Some(p);
        }
    }
    let mut got: Option<OwnedSemaphorePermit> = None;
    let mut calls = pending.lock().expect("pending");
    for c in calls.values_mut() {
        let have = got.as_ref().map_or(0, |g| g.num_permits());
        if have >= n {
            break;
        }
        let Some(lent) = c.counted.permit.as_mut() else {
            continue;
        };
        let part = if lent.num_permits() <= n - have {
            c.counted.permit.take()
        } else {
            lent.split(n - have)
        };
        if let Some(part) = part {
            match &mut got {
                Some(g) => g.merge(part),
                None => got = Some(part),
            }
        }
    }
    got
}

/// Read the child's stdout until it ends or misbehaves. Returns why it ended.
async fn read_loop(
    io: &PluginIo<'_>,
    stdout: tokio::process::ChildStdout,
    pending: &Arc<Mutex<Calls>>,
    routes: &Arc<Mutex<HashMap<String, Route>>>,
    kill: &CancellationToken,
    child: &mut tokio::process::Child,
) -> String {
    let (id, secrets, writer) = (io.id, io.secrets, io.writer);
    let pool = io.events.pool();
    let mut lines = LineReader::new(stdout);
    let mut log_limit = LogLimit::default();
    loop {
        let frame = tokio::select! {
            f = lines.next(&pool, pending) => f,
            _ = kill.cancelled() => {
                let _ = child.start_kill();
                return "it was stopped".into();
            }
        };
        let (bytes, counted) = match frame {
            None => return "it exited".into(),
            Some(Err(e)) => return format!("sent unreadable output: {e}"),
            Some(Ok((Frame::TooLarge { .. }, _))) => {
                return format!("sent a line over {} bytes", MAX_LINE);
            }
            Some(Ok((Frame::Message(b), counted))) => (b, counted),
        };
        let size = bytes.len();
        // A long line has its buffer to itself: read in place (its result or params are that
        // buffer, never a copy), what was counted for it covers them.
        let line = if counted.is_some() {
            epp::classify_owned(Vec::from(bytes), id, secrets)
        } else {
            epp::classify(&bytes, id, secrets)
        };
        match line {
            PluginLine::Reply { id: n, outcome } => {
                let Some(p) = pending.lock().expect("pending").remove(&n) else {
                    debug!(provider = %id, n, "late reply ignored");
                    continue;
                };
                // Replies are bounded like the builtin provider's (limits::plugin_reply_bound).
                let bound = abx_protocol::limits::plugin_reply_bound(&p.method);
                let outcome = if size > bound {
                    warn!(provider = %id, method = %p.method, size, bound, "plugin reply above its bound");
                    Err(AbxError::new(
                        ErrorCode::BadPluginReply,
                        &[
                            ("provider", id),
                            (
                                "detail",
                                &format!(
                                    "its reply to '{}' has {size} bytes, above the {bound} bytes allowed",
                                    p.method
                                ),
                            ),
                        ],
                    ))
                } else {
                    outcome
                };
                if let (Ok(raw), Some(conn)) = (&outcome, &p.conn) {
                    if let Some(key) = epp::stream_key(&p.method, raw) {
                        let mut r = routes.lock().expect("routes");
                        // An attach the plugin answered (the broker had no route): a new
                        // route only when the exec still runs.
                        let attach = p.method == "exec/attach";
                        if !(attach && (r.contains_key(&key) || !still_running(raw))) {
                            let route = stream::spawn(
                                key.clone(),
                                conn.clone(),
                                p.replied.clone(),
                                routes.clone(),
                            );
                            r.insert(key, route);
                        }
                    }
                }
                // The reply's budget (the line's, and what its call lent) goes to the
                // request with the reply: it is queued against those bytes.
                let Pending {
                    reply,
                    counted: lent,
                    ..
                } = p;
                if let Some(back) = &lent.back {
                    let mut h = back.lock().expect("hold");
                    for p in [counted, lent.permit].into_iter().flatten() {
                        match h.as_mut() {
                            Some(mine) => mine.merge(p),
                            None => *h = Some(p),
                        }
                    }
                }
                let _ = reply.send(outcome);
            }
            PluginLine::Dropped { method, key, bytes } => {
                if log_limit.allow().is_some() {
                    warn!(provider = %id, method = %method, key, bytes, "plugin stream notification over 1 MiB dropped");
                }
            }
            PluginLine::Stream { key, end, body } => {
                // After its exit a stream takes nothing more; its route stays (parked)
                // until the exit reached a client.
                let tx = {
                    let mut r = routes.lock().expect("routes");
                    match r.get_mut(&key) {
                        Some(route) if !route.ended => {
                            route.ended |= end;
                            Some(route.tx.clone())
                        }
                        _ => None,
                    }
                };
                // Counted before the stream holds it: the line's bytes (a long line), else
                // taken from the budget (waiting, holding none of it, when it has no room).
                // A stop is heard while it waits.
                match tx {
                    Some(tx) => {
                        let handed = async {
                            let counted = stream::Counted::take(&pool, body.len(), counted).await;
                            if end {
                                tx.exit(body, counted).await;
                            } else {
                                let _ = tx.send(body, counted).await;
                            }
                        };
                        tokio::select! {
                            _ = handed => {}
                            _ = kill.cancelled() => {
                                let _ = child.start_kill();
                                return "it was stopped".into();
                            }
                        }
                    }
                    None => debug!(provider = %id, key, "notification for an unknown stream"),
                }
            }
            PluginLine::Log { level, message } => {
                if let Some(dropped) = log_limit.allow() {
                    if dropped > 0 {
                        info!(provider = %id, "plugin log: ({dropped} messages not logged: over {LOG_LINES_PER_SEC} a second)");
                    }
                    info!(provider = %id, level = %level, "plugin log: {message}");
                }
            }
            PluginLine::Request { method, answer } => {
                // Plugins may not call the broker (yet): answered -32601.
                warn!(provider = %id, method = %method, "plugin sent a request");
                let _ = writer.send(answer);
            }
            PluginLine::SandboxChanged {
                sandbox,
                change,
                info,
            } => {
                // The broker's form: `provider` set to the plugin's id (by the hub, as it
                // writes the one copy every subscriber gets), as its sandbox/* results have it.
                io.events.emit_info(
                    id,
                    &sandbox,
                    &change,
                    info.as_deref().map(abx_core::events::Info::Tagged),
                );
                drop(counted);
            }
            PluginLine::Ignore { method } => {
                debug!(provider = %id, method = %method, "ignoring plugin notification")
            }
            PluginLine::Fatal(why) => return why,
        }
    }
}

/// An `exec/attach` result that says the exec still runs.
fn still_running(raw: &RawValue) -> bool {
    message::bounded_value(raw.get(), 1024 * 1024).is_some_and(|v| v["running"] != false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_keys_spread_over_the_bits_hashbrown_probes_with() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let b = BuildHasherDefault::<CounterHasher>::default();
        // hashbrown takes its 7-bit tag from the top of the hash and the bucket from the
        // bottom: consecutive ids must differ in both.
        let tops: std::collections::HashSet<u64> =
            (0..128i64).map(|k| b.hash_one(k) >> 57).collect();
        let lows: std::collections::HashSet<u64> =
            (0..128i64).map(|k| b.hash_one(k) & 127).collect();
        assert!(
            tops.len() > 64 && lows.len() > 64,
            "{} {}",
            tops.len(),
            lows.len()
        );
        let mut calls: HashMap<i64, (), BuildHasherDefault<CounterHasher>> = HashMap::default();
        for k in 0..100_000 {
            calls.insert(k, ());
        }
        assert!((0..100_000).all(|k| calls.remove(&k).is_some()) && calls.is_empty());
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn call(
        method: &str,
        limit: Duration,
    ) -> (Pending, oneshot::Receiver<Result<Box<RawValue>, AbxError>>) {
        let (tx, rx) = oneshot::channel();
        let p = Pending {
            method: method.into(),
            reply: tx,
            conn: None,
            replied: None,
            deadline: Some((Instant::now() + limit, limit)),
            counted: Lent::default(),
        };
        (p, rx)
    }

    /// A sweeper of its own over an empty map: the map, the sweeper's side, what it writes
    /// to the plugin, the plugin's end and the task.
    struct Swept {
        pending: Arc<Mutex<Calls>>,
        sw: Arc<Sweep>,
        wrx: mpsc::UnboundedReceiver<Vec<u8>>,
        dead: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    fn swept(linger: Duration) -> Swept {
        let pending: Arc<Mutex<Calls>> = Arc::default();
        let sw: Arc<Sweep> = Arc::default();
        let (wtx, wrx) = mpsc::unbounded_channel();
        let dead = CancellationToken::new();
        let task = tokio::spawn(sweep(
            "p".into(),
            pending.clone(),
            sw.clone(),
            wtx,
            dead.clone(),
            linger,
        ));
        Swept {
            pending,
            sw,
            wrx,
            dead,
            task,
        }
    }

    /// A call past its deadline fails E8008 and the plugin hears `$/cancelRequest` for it,
    /// even when the sweeper had parked for want of calls, or slept toward a later deadline;
    /// a call within its time stays; the sweeper ends with the plugin.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_sweeper_times_calls_out_after_sleeping_and_ends_with_the_plugin() {
        let Swept {
            pending,
            sw,
            mut wrx,
            dead,
            task,
        } = swept(Duration::from_millis(20));
        until("the idle sweeper parked", || {
            sw.target.load(Ordering::SeqCst) == u64::MAX
        })
        .await;
        let (slow, mut slow_rx) = call("sandbox/list", Duration::from_secs(600));
        assert_eq!(track(&pending, &sw, 1, slow), 1);
        until("the sweeper sleeps toward the slow call's deadline", || {
            sw.target.load(Ordering::SeqCst) != u64::MAX
        })
        .await;
        // Sooner than the deadline the sweeper sleeps toward: it must be woken for it.
        let (hung, hung_rx) = call("exec/run", Duration::from_millis(30));
        assert_eq!(track(&pending, &sw, 2, hung), 2);
        let e = tokio::time::timeout(Duration::from_secs(10), hung_rx)
            .await
            .expect("the hung call timed out")
            .expect("answered, not dropped")
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::PluginTimedOut, "{e:?}");
        assert!(e.message.contains("exec/run"), "{}", e.message);
        let line = wrx.recv().await.unwrap();
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["method"], "$/cancelRequest");
        assert_eq!(v["params"]["id"], 2);
        // The call within its time is still waiting for the plugin.
        assert!(pending.lock().unwrap().contains_key(&1));
        assert!(slow_rx.try_recv().is_err());
        dead.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the sweeper ended with the plugin")
            .unwrap();
    }

    /// Calls made back to back, each answered before the next, cost the sweeper no wakeup
    /// each (it neither ticks nor wakes per call): it wakes for the first call after it
    /// parked, and again only when its linger or a deadline is due.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_back_to_back_do_not_wake_the_sweeper_each() {
        let Swept {
            pending,
            sw,
            wrx: _,
            dead,
            task: _,
        } = swept(Duration::from_secs(30));
        until("the sweeper's first scan", || {
            sw.scans.load(Ordering::SeqCst) >= 1
        })
        .await;
        let (mut answered, mut in_flight) = (Vec::new(), Vec::new());
        for id in 0..2000 {
            let (c, rx) = call("sandbox/list", Duration::from_secs(30));
            track(&pending, &sw, id, c);
            // Answered: the reader takes it off the map and replies.
            let c = pending.lock().unwrap().remove(&id).unwrap();
            let _ = c.reply.send(Ok(RawValue::from_string("1".into()).unwrap()));
            answered.push(rx);
            if id % 100 == 0 {
                // Now and then a call stays in flight, with the same time limit as the rest.
                let (c, rx) = call("exec/run", Duration::from_secs(30));
                track(&pending, &sw, 10_000 + id, c);
                in_flight.push(rx);
            }
            tokio::task::yield_now().await;
        }
        // Time passes with calls in flight: a sweeper that ticked would wake in it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let wakes = sw.wakes.load(Ordering::SeqCst);
        assert!(wakes <= 2, "the sweeper woke {wakes} times for 2020 calls");
        assert!(in_flight.iter_mut().all(|rx| rx.try_recv().is_err()));
        dead.cancel();
    }

    /// Calls with ever shorter time limits, the most a client can make the sweeper do: a
    /// wakeup each, but no scan of the calls in flight for any of them (the call lowers the
    /// target itself), until the earliest deadline is due; then it fails that call E8008.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ever_shorter_limits_wake_the_sweeper_without_a_scan_each() {
        let Swept {
            pending,
            sw,
            mut wrx,
            dead,
            task: _,
        } = swept(Duration::from_secs(600));
        until("the sweeper's first scan", || {
            sw.scans.load(Ordering::SeqCst) >= 1
        })
        .await;
        let mut rxs = Vec::new();
        for i in 0..500u64 {
            let (c, rx) = call("exec/run", Duration::from_secs(500 - i));
            track(&pending, &sw, i as i64, c);
            rxs.push(rx);
            tokio::task::yield_now().await;
        }
        until("the sweeper saw the wakeups", || {
            sw.wakes.load(Ordering::SeqCst) >= 1
        })
        .await;
        let scans = sw.scans.load(Ordering::SeqCst);
        assert!(
            scans <= 2,
            "{scans} scans for 500 calls none of which is due"
        );
        // A call shorter than all of them is still timed out on time.
        let (c, rx) = call("exec/run", Duration::from_millis(20));
        track(&pending, &sw, 9999, c);
        let e = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .expect("the shortest call timed out")
            .expect("answered, not dropped")
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::PluginTimedOut, "{e:?}");
        let v: Value = serde_json::from_slice(&wrx.recv().await.unwrap()).unwrap();
        assert_eq!(v["params"]["id"], 9999);
        assert!(rxs.iter_mut().all(|rx| rx.try_recv().is_err()));
        dead.cancel();
    }

    #[tokio::test]
    async fn stderr_lines_are_capped_and_logging_is_rate_limited() {
        let mut input: &[u8] = b"short\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\nlast";
        let mut r = tokio::io::BufReader::with_capacity(4, &mut input);
        let mut line = Vec::new();
        assert_eq!(
            read_line_capped(&mut r, &mut line, 8).await.unwrap(),
            Some(false)
        );
        assert_eq!(line, b"short");
        assert_eq!(
            read_line_capped(&mut r, &mut line, 8).await.unwrap(),
            Some(true)
        );
        assert_eq!(line, b"xxxxxxxx");
        assert_eq!(
            read_line_capped(&mut r, &mut line, 8).await.unwrap(),
            Some(false)
        );
        assert_eq!(line, b"last");
        assert_eq!(read_line_capped(&mut r, &mut line, 8).await.unwrap(), None);

        let mut l = LogLimit::default();
        for _ in 0..LOG_LINES_PER_SEC {
            assert_eq!(l.allow(), Some(0));
        }
        assert_eq!(l.allow(), None);
        assert_eq!(l.allow(), None);
        l.window = Some(Instant::now() - Duration::from_secs(2));
        assert_eq!(
            l.allow(),
            Some(2),
            "the next window reports what was dropped"
        );
    }
}
