//! `code/*` on `local` (feature `code.interpret`): contexts, long-lived interpreters inside a
//! sandbox that run cells and keep their state.
//!
//! A context is one interpreter process started like an exec (same confinement, same
//! environment rules, its own session) running a small driver embedded in the binary:
//! `driver.py` (python3), `driver.js` (node, one `vm` context), `driver.sh` (bash at its top
//! level). The driver is not on the interpreter's command line (`ps` in the sandbox would
//! show it): a short bootstrap (`python3 -c`, `node -e`, `bash -c`) reads it, its length
//! known, from stdin, where the broker writes it first. Then the broker writes one cell per
//! line to the driver's stdin; the driver answers on its stdout with frames, each a marker
//! (`\x1f` and a random nonce given in the environment, which the driver removes) then one
//! JSON object and a newline: `ready`, `stdout`/`stderr` (what the language's own print
//! functions wrote, in order), `result` (a MIME bundle), `error` and `done`; after `done` it
//! writes the marker and `E` on its stderr. Bytes outside frames on either pipe are output
//! of child processes (or of the shell) and are reported as that pipe's stream. A context's
//! cells run one at a time.
//!
//! What the driver writes is untrusted (code in the sandbox can write any frame) and is
//! read within the broker-wide memory budget ([`abx_core::outbound::Pool`]), counted before
//! it is read: the pipes are read only while a cell runs (between cells the interpreter
//! waits on a full pipe, holding nothing of the daemon's), in reads whose bytes are taken
//! from the budget first; a frame is split, parsed and passed on by [`frame`] (its envelope
//! borrowed, a MIME bundle passed to the client as the JSON text it came as, never a tree
//! of untrusted size); what a cell keeps for its reply is taken from the budget too. Nothing
//! waits for the budget while holding some of it: what does not fit is dropped, and a note
//! in its place says so (a `[abx]` line on stderr, or a result whose `text/plain` says it).
//!
//! Interrupts: a cancelled or timed-out cell gets SIGINT (its process group); if it has not
//! finished [`GRACE`] later, or a run waiting behind an interrupted cell is cancelled too,
//! the interpreter is killed and the context restarts (its state lost): a `code/output` of
//! type `restarted` says so, and the run's result has `restarted: true`. A context dies
//! with its sandbox ([`Contexts::drop_sandbox`]).

pub mod frame;

use super::exec::{self, Site};
use super::procs;
use abx_core::outbound::{Hold, Outbound, Pool, MSG_OVERHEAD, SMALL_MESSAGE};
use abx_protocol::api::{CodeContext, CodeError, CodeResult, MimeBundle};
use abx_protocol::{AbxError, ErrorCode};
use frame::{Event, Kind, OutError, Output, Piece, Splitter, Why};
use serde_json::json;
use serde_json::value::RawValue;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const PYTHON_DRIVER: &str = include_str!("driver.py");
const NODE_DRIVER: &str = include_str!("driver.js");
const BASH_DRIVER: &str = include_str!("driver.sh");

/// How long an interrupted cell may take to stop before its context is restarted (default;
/// `ABX_CODE_GRACE_MS` sets another, for tests).
pub const GRACE: Duration = Duration::from_secs(2);
/// How long the output of an interpreter that ended is still read.
const DRAIN_GRACE: Duration = Duration::from_millis(250);

/// The grace in force.
pub fn grace_period() -> Duration {
    static G: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *G.get_or_init(|| {
        std::env::var("ABX_CODE_GRACE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(GRACE, Duration::from_millis)
    })
}
/// How long an interpreter may take to start (its `ready` frame).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Output kept per stream of one cell for the reply (the notifications carry all of it),
/// within the broker-wide budget.
const MAX_KEPT: usize = 16 * 1024 * 1024;
/// Rich results kept for the reply of one cell, as the memory their parsed trees take
/// ([`frame::tree_cost`]), within the broker-wide budget (the notifications carry all).
const MAX_RESULTS_KEPT: usize = 32 * 1024 * 1024;
/// The longest frame read from an interpreter (a larger one is dropped as it streams in,
/// never held, and a marker says so). Its notification must fit in the connection's
/// outbound budget (16 MiB) beside what the requests in flight on it hold, or it would
/// wait for ever (a result of 20 MB hung its `code/run` before issue 42): half of it.
const MAX_FRAME: usize = 8 * 1024 * 1024;
/// The largest `code/output` sent (a result's bundle and its envelope; a longer one is not
/// sent, and the reply says so).
const MAX_NOTE: usize = MAX_FRAME + 64 * 1024;
/// The longest frame read before the interpreter is ready (its `ready` is a few bytes).
const START_FRAME: usize = 2 * 1024;
/// A read of a pipe when the budget has room.
const READ: usize = 64 * 1024;
/// A read of a pipe when it has not: every cell can always read this much (so its `done`
/// is always read), without counting it.
const PROBE: usize = 4 * 1024;
/// Bytes a pipe's buffer may hold without counting them (a probe and a short frame: a
/// `done`, an end marker, so a cell always ends); beyond it every byte is counted twice (the
/// frame, and the text or the notification it becomes).
const FREE: usize = 8 * 1024;
/// Bytes of an error's name, value or traceback kept for the reply when the budget cannot
/// hold it whole.
const ERROR_KEPT: usize = 64 * 1024;
/// What the interpreter said before it failed to start, kept for the error (its tail).
const SAID: usize = 4 * 1024;
/// Contexts one sandbox may have at once.
pub const MAX_CONTEXTS: usize = 64;

/// A language a context runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    /// `python3` with `driver.py`.
    Python,
    /// `node` with `driver.js`.
    JavaScript,
    /// `bash` with `driver.sh`.
    Bash,
}

impl Lang {
    /// The language a `language` param names (default python).
    pub fn parse(s: Option<&str>) -> Result<Lang, AbxError> {
        match s.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("python") | Some("python3") | Some("py") => Ok(Lang::Python),
            Some("javascript") | Some("js") | Some("node") | Some("nodejs") => Ok(Lang::JavaScript),
            Some("bash") | Some("sh") | Some("shell") => Ok(Lang::Bash),
            Some(other) => Err(AbxError::invalid_params(
                "code",
                format!("unknown language '{other}'"),
            )
            .with_suggestion("The local provider runs python, javascript and bash.")),
        }
    }

    /// Its canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::JavaScript => "javascript",
            Lang::Bash => "bash",
        }
    }

    /// Its driver's source, written to the interpreter's stdin before anything else.
    fn driver(self) -> &'static str {
        match self {
            Lang::Python => PYTHON_DRIVER,
            Lang::JavaScript => NODE_DRIVER,
            Lang::Bash => BASH_DRIVER,
        }
    }

    /// The interpreter's command line: a bootstrap that reads the driver (exactly its
    /// length, so the cells that follow stay in the pipe) from stdin and runs it.
    fn argv(self, interpreter: Option<&str>) -> Vec<String> {
        let n = self.driver().len();
        let (prog, args): (&str, Vec<String>) = match self {
            // The driver's frames are named `<abx-driver>`: tracebacks leave them out.
            Lang::Python => (
                "python3",
                vec!["-c".into(), PY_BOOT.replace("{n}", &n.to_string())],
            ),
            Lang::JavaScript => (
                "node",
                vec!["-e".into(), JS_BOOT.replace("{n}", &n.to_string())],
            ),
            Lang::Bash => (
                "bash",
                vec![
                    "--noprofile".into(),
                    "--norc".into(),
                    "-c".into(),
                    format!("IFS= read -r -N {n} __abx_driver && eval \"$__abx_driver\""),
                ],
            ),
        };
        std::iter::once(interpreter.unwrap_or(prog).to_owned())
            .chain(args)
            .collect()
    }
}

/// Python's bootstrap: reads exactly `{n}` bytes (the driver) from stdin and runs them
/// as `<abx-driver>` (tracebacks leave its frames out).
const PY_BOOT: &str = "import os
def _abx_driver(n):
    b = b''
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            raise SystemExit('abx: no driver on stdin')
        b += c
    return compile(b, '<abx-driver>', 'exec')
exec(_abx_driver({n}))
";

/// node's bootstrap: reads exactly `{n}` bytes (the driver) from stdin and runs them as
/// `[abx-driver]` (stack traces leave its frames out).
const JS_BOOT: &str = "const fs = require('fs');
const n = {n}, b = Buffer.alloc(n);
let o = 0;
while (o < n) {
  let k = -1;
  try { k = fs.readSync(0, b, o, n - o, null); } catch (e) { if (e.code !== 'EAGAIN') throw e; }
  if (k === 0) process.exit(1);
  if (k > 0) o += k;
}
require('vm').runInThisContext('(function (require) {' + b.toString('utf8') + '\\n})',
  { filename: '[abx-driver]' })(require);
";

/// One cell to run.
pub struct Cell {
    /// The code.
    pub code: String,
    /// Environment set before it runs.
    pub env: BTreeMap<String, String>,
    /// Seconds before it is interrupted.
    pub timeout: Option<f64>,
    /// Echoed in its notifications.
    pub run_id: Option<String>,
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;
type Permit = OwnedSemaphorePermit;

/// Pool bytes held.
fn have(p: &Option<Permit>) -> usize {
    p.as_ref().map_or(0, |p| p.num_permits())
}

/// Hold at least `to` bytes of `pool` in `p`, taking the difference if it is free now
/// (never waiting). False when it is not (or `to` is more than the pool).
fn grow(p: &mut Option<Permit>, pool: &Pool, to: usize) -> bool {
    let h = have(p);
    if to <= h {
        return true;
    }
    if to > pool.cap() {
        return false;
    }
    match pool.try_take(to - h) {
        Some(more) => {
            match p {
                Some(p) => p.merge(more),
                None => *p = Some(more),
            }
            true
        }
        None => false,
    }
}

/// Hold `by` bytes more of `pool` in `p`, if they are free now.
fn grow_by(p: &mut Option<Permit>, pool: &Pool, by: usize) -> bool {
    let to = have(p).saturating_add(by);
    grow(p, pool, to)
}

/// Hold at most `to` bytes in `p`, giving the rest back.
fn trim(p: &mut Option<Permit>, to: usize) {
    let h = have(p);
    if h > to {
        match p {
            Some(x) if to > 0 => drop(x.split(h - to)),
            _ => *p = None,
        }
    }
}

/// Take `n` bytes (or all there are, when fewer) out of `p`.
fn take_out(p: &mut Option<Permit>, n: usize) -> Option<Permit> {
    let h = have(p);
    if n == 0 || h == 0 {
        None
    } else if n >= h {
        p.take()
    } else {
        p.as_mut().and_then(|x| x.split(n))
    }
}

/// Bytes a pipe's buffer of `len` bytes is counted as (see [`FREE`]).
fn cover(len: usize) -> usize {
    2 * len.saturating_sub(FREE)
}

/// One of the interpreter's pipes, read only while a cell runs (or until it is ready).
struct Pipe {
    r: Box<dyn AsyncRead + Send + Unpin>,
    split: Splitter,
    /// Pool bytes counting what `split` holds (see [`cover`]).
    held: Option<Permit>,
    /// Raw bytes that end inside a UTF-8 character (at most 3), until the rest arrives.
    partial: Vec<u8>,
    eof: bool,
}

impl Pipe {
    fn new(r: Box<dyn AsyncRead + Send + Unpin>, mark: &[u8]) -> Pipe {
        Pipe {
            r,
            split: Splitter::new(mark, START_FRAME),
            held: None,
            partial: Vec::new(),
            eof: false,
        }
    }

    /// How much the next read may bring, counted first: a full read when the budget
    /// has room for it, else a probe (uncounted); a partial frame that can grow no more is
    /// dropped (its newline is then looked for by probes).
    fn room(&mut self, pool: Option<&Pool>) -> usize {
        let len = self.split.buf.len();
        for want in [READ, PROBE] {
            let need = cover(len + want);
            if need <= have(&self.held) || pool.is_some_and(|p| grow(&mut self.held, p, need)) {
                return want;
            }
        }
        self.split.abandon();
        self.shrink();
        PROBE
    }

    /// Read into the splitter's buffer (0: the end). Cancel-safe: a read that did not
    /// complete took nothing, and what `room` took stays counted for the next.
    async fn fill(&mut self, pool: Option<&Pool>) -> usize {
        use bytes::BufMut;
        let want = self.room(pool);
        let buf = &mut self.split.buf;
        buf.reserve(want);
        let mut lim = buf.limit(want);
        self.r.read_buf(&mut lim).await.unwrap_or(0)
    }

    /// [`Pipe::fill`] for a cell whose output goes to `conn`: read only once the connection
    /// has room for what the read may become (its client takes what it was sent), so the
    /// cells of a client that does not read stop reading (their interpreters wait on a full
    /// pipe) instead of holding the budget in output their client cannot take (issue 42:
    /// such cells held the whole pool, and other such clients' cells got nothing). Nothing
    /// is held while it waits (cancel-safe, and no partial frame waits on room another
    /// holds). A cell that sends nothing more (`quiet`: cancelled) reads on, to its end.
    async fn fill_for(&mut self, conn: &Outbound, pool: &Pool, quiet: bool) -> usize {
        if !quiet {
            conn.room(READ).await;
        }
        self.fill(Some(pool)).await
    }

    /// The pieces complete after a read of `n` bytes.
    fn pieces(&mut self, n: usize) -> Vec<Piece> {
        if n == 0 {
            self.eof = true;
        }
        let mut pieces = self.split.take(self.eof);
        if self.eof && !self.partial.is_empty() {
            // The end inside a character: what there is of it, replaced.
            pieces.push(Piece::Raw(Vec::new()));
        }
        pieces
    }

    /// Give back what the buffer no longer needs.
    fn shrink(&mut self) {
        trim(&mut self.held, cover(self.split.buf.len()));
        if self.split.buf.capacity() > 4 * FREE && self.split.buf.len() <= FREE {
            self.split.buf.shrink_to(FREE);
        }
    }

    /// The text of raw bytes: a character cut by the end of a read waits for the rest
    /// (unless at the end), invalid bytes become U+FFFD.
    fn text(&mut self, mut raw: Vec<u8>) -> String {
        if !self.partial.is_empty() {
            let mut p = std::mem::take(&mut self.partial);
            p.extend_from_slice(&raw);
            raw = p;
        }
        if !self.eof {
            if let Err(e) = std::str::from_utf8(&raw) {
                if e.error_len().is_none() {
                    self.partial = raw.split_off(e.valid_up_to());
                }
            }
        }
        match String::from_utf8(raw) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// A running interpreter.
struct Live {
    /// Its host pid (= its process group) while it runs, 0 once it ended.
    pid: Arc<AtomicI32>,
    stdin: Writer,
    out: Pipe,
    err: Pipe,
    /// Becomes true when the interpreter has ended.
    exited: tokio::sync::watch::Receiver<bool>,
}

impl Drop for Live {
    fn drop(&mut self) {
        let pid = self.pid.swap(0, Ordering::SeqCst);
        if pid > 1 {
            procs::kill_tree(pid, libc::SIGKILL);
        }
    }
}

/// One context.
pub struct Context {
    /// Its id.
    pub id: String,
    /// Its sandbox.
    pub sandbox: String,
    /// Its language.
    pub lang: Lang,
    cwd: String,
    interpreter: Option<String>,
    env: BTreeMap<String, String>,
    default: bool,
    live: Arc<tokio::sync::Mutex<Option<Live>>>,
    /// The pid cell of the current interpreter (to interrupt without the lock).
    pid: Mutex<Arc<AtomicI32>>,
    count: AtomicU64,
    restarts: AtomicU64,
    /// A cell of it is being interrupted.
    interrupting: AtomicBool,
    /// Its interpreter was killed by a second cancel (the restart says so).
    second_cancel: AtomicBool,
    /// Runs waiting for the running cell.
    queued: AtomicU64,
    removed: AtomicBool,
}

impl Context {
    /// Its view (`code/listContexts`).
    pub fn view(&self) -> CodeContext {
        CodeContext {
            id: self.id.clone(),
            sandbox: self.sandbox.clone(),
            language: self.lang.name().into(),
            cwd: self.cwd.clone(),
            default: self.default,
            execution_count: self.count.load(Ordering::Relaxed),
            running: self.current_pid() > 0,
            restarts: self.restarts.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
        }
    }

    fn current_pid(&self) -> i32 {
        self.pid.lock().expect("pid").load(Ordering::SeqCst)
    }

    /// Kill the interpreter now (its cell, if any, ends with `restarted`).
    fn kill_now(&self) {
        let pid = self.pid.lock().expect("pid").swap(0, Ordering::SeqCst);
        if pid > 1 {
            procs::kill_tree(pid, libc::SIGKILL);
        }
    }

    fn interrupt(&self) {
        let pid = self.current_pid();
        if pid > 1 {
            // SAFETY: a signal to the interpreter's process group.
            unsafe { libc::kill(-pid, libc::SIGINT) };
        }
    }

    /// Start the interpreter, hand it its driver and wait for its `ready`. Nothing is
    /// counted in the budget here (there may be no client to count it for): frames are at
    /// most [`START_FRAME`] bytes until `ready`, reads a probe each, and of what the
    /// interpreter says meanwhile only the last [`SAID`] bytes are kept.
    async fn start(&self, site: Site<'_>) -> Result<Live, AbxError> {
        let nonce = format!("{:016x}{:016x}", rand64(), rand64());
        let mut env = self.env.clone();
        env.insert("ABX_CODE_NONCE".into(), nonce.clone());
        let p = exec::ExecParams {
            sandbox: self.sandbox.clone(),
            argv: Some(self.lang.argv(self.interpreter.as_deref())),
            cwd: Some(self.cwd.clone()),
            env: Some(env),
            ..Default::default()
        };
        let mut sp = exec::spawn(site, &p, true).await?;
        let pid = Arc::new(AtomicI32::new(sp.pid));
        let mark = format!("\x1f{nonce}").into_bytes();
        let (tx, exited) = tokio::sync::watch::channel(false);
        let mut child = sp.child;
        let pid2 = pid.clone();
        tokio::spawn(async move {
            let _ = child.wait().await;
            pid2.store(0, Ordering::SeqCst);
            let _ = tx.send(true);
        });
        let mut live = Live {
            pid: pid.clone(),
            stdin: sp.stdin.take().expect("piped"),
            out: Pipe::new(sp.stdout.take().expect("piped"), &mark),
            err: Pipe::new(sp.stderr.take().expect("piped"), &mark),
            exited,
        };
        *self.pid.lock().expect("pid") = pid;
        // The driver first (it fits in the pipe: this never waits for the interpreter).
        let _ = live.stdin.write_all(self.lang.driver().as_bytes()).await;
        let _ = live.stdin.flush().await;
        // Until `ready`: anything the interpreter says is why it did not start.
        let mut said = String::new();
        let ready = tokio::time::timeout(START_TIMEOUT, async {
            let Live {
                out, err, exited, ..
            } = &mut live;
            // Once it ended, what it wrote last is still read (its error), for a moment.
            let mut drain: Option<Instant> = None;
            loop {
                let (pipe, n) = tokio::select! {
                    n = out.fill(None), if !out.eof => (&mut *out, n),
                    n = err.fill(None), if !err.eof => (&mut *err, n),
                    _ = exited.changed(), if drain.is_none() => {
                        drain = Some(Instant::now() + DRAIN_GRACE);
                        continue;
                    }
                    _ = until(drain), if drain.is_some() => return false,
                    else => return false,
                };
                for piece in pipe.pieces(n) {
                    match piece {
                        Piece::Frame(f) if matches!(frame::parse(&f), Some(Event::Ready)) => {
                            return true
                        }
                        Piece::Raw(b) => {
                            said.push_str(&pipe.text(b));
                            if said.len() > 2 * SAID {
                                said = tail(&said, SAID).to_owned();
                            }
                        }
                        _ => {}
                    }
                }
            }
        })
        .await
        .unwrap_or(false);
        if !ready {
            let said = said.trim();
            return Err(AbxError::detail(
                ErrorCode::ExecFailedToStart,
                format!(
                    "the {} interpreter did not start{}",
                    self.lang.name(),
                    if said.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", tail(said, 2000))
                    }
                ),
            )
            .with_suggestion(
                "Check that the interpreter is installed in the sandbox (python3, node, bash on its PATH, or the context's `interpreter`).",
            ));
        }
        for pipe in [&mut live.out, &mut live.err] {
            pipe.split.set_max(MAX_FRAME);
        }
        Ok(live)
    }

    /// Run a cell: notifications to `conn` as it runs, the whole execution as the result.
    /// `cancel` interrupts it. What the cell kept for its reply is counted in the
    /// broker-wide budget while it runs and given back when it returns; see
    /// [`Context::run_held`] to keep it counted until the reply is queued.
    pub async fn run(
        self: &Arc<Self>,
        site: Site<'_>,
        cell: Cell,
        conn: Outbound,
        cancel: CancellationToken,
    ) -> Result<CodeResult, AbxError> {
        self.run_with(site, cell, conn, cancel, None).await
    }

    /// [`Context::run`] that deposits in `hold` (the request's, [`abx_core::provider::CallCx`])
    /// the budget's bytes counting its reply (the output and results it kept, and their
    /// copies while the reply is built), so the reply is queued against them.
    pub async fn run_held(
        self: &Arc<Self>,
        site: Site<'_>,
        cell: Cell,
        conn: Outbound,
        cancel: CancellationToken,
        hold: &Hold,
    ) -> Result<CodeResult, AbxError> {
        self.run_with(site, cell, conn, cancel, Some(hold.clone()))
            .await
    }

    async fn run_with(
        self: &Arc<Self>,
        site: Site<'_>,
        cell: Cell,
        conn: Outbound,
        cancel: CancellationToken,
        hold: Option<Hold>,
    ) -> Result<CodeResult, AbxError> {
        check_cell(&cell)?;
        self.queued.fetch_add(1, Ordering::Relaxed);
        let mut waiting = Waiting(Some(self.clone()));
        let mut g = self.live.clone().lock_owned().await;
        waiting.0 = None;
        self.queued.fetch_sub(1, Ordering::Relaxed);
        if self.removed.load(Ordering::SeqCst) {
            return Err(gone(&self.sandbox, &self.id));
        }
        let mut restarted = false;
        if g.as_ref()
            .is_some_and(|l| l.pid.load(Ordering::SeqCst) == 0)
        {
            // It ended between cells (killed, out of memory): a fresh one, and say so.
            *g = None;
            restarted = true;
            self.count.store(0, Ordering::Relaxed);
            self.restarts.fetch_add(1, Ordering::Relaxed);
        }
        if g.is_none() {
            *g = Some(self.start(site).await?);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let me = self.clone();
        tokio::spawn(async move {
            let live = g.as_mut().expect("started");
            let (mut r, kept) = me.cell(live, cell, conn, cancel).await;
            if r.restarted {
                *g = None;
                me.count.store(0, Ordering::Relaxed);
                me.restarts.fetch_add(1, Ordering::Relaxed);
            }
            me.interrupting.store(false, Ordering::SeqCst);
            me.second_cancel.store(false, Ordering::SeqCst);
            drop(g);
            r.restarted |= restarted;
            let bytes = have(&kept);
            let held = match (hold, kept) {
                (Some(h), Some(p)) => {
                    *h.lock().expect("hold") = Some(p);
                    true
                }
                _ => false,
            };
            // A result nobody takes (a cancelled cell's, one of a client that went away) goes
            // now: counted as freed, so the allocator gives its memory back after a burst.
            if tx.send(r).is_err() || !held {
                abx_core::outbound::note_released(bytes, true);
            }
        });
        rx.await
            .map_err(|_| AbxError::internal("the code/run task ended without an answer"))
    }

    /// Run one cell on `live`. Returns its result and the budget's bytes that count what
    /// the reply will take (for a hold).
    async fn cell(
        &self,
        live: &mut Live,
        cell: Cell,
        conn: Outbound,
        cancel: CancellationToken,
    ) -> (CodeResult, Option<Permit>) {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let pool = conn.pool().clone();
        let mut run = Run {
            r: CodeResult {
                results: Vec::new(),
                stdout: String::new(),
                stderr: String::new(),
                error: None,
                execution_count: n,
                context: self.id.clone(),
                timed_out: false,
                restarted: false,
                truncated: false,
            },
            conn: &conn,
            pool: &pool,
            cancel: &cancel,
            sandbox: &self.sandbox,
            context: &self.id,
            run_id: cell.run_id.as_deref(),
            kept: None,
            results_cost: 0,
            quiet: false,
            kept_short: false,
            unsent: 0,
        };
        let line = request_line(self.lang, &cell);
        let wrote =
            live.stdin.write_all(line.as_bytes()).await.is_ok() && live.stdin.flush().await.is_ok();
        let deadline = cell
            .timeout
            .map(|t| Instant::now() + Duration::from_secs_f64(t));
        let mut grace: Option<Instant> = None;
        let (mut done, mut err_end, mut dead, mut hung) = (false, false, !wrote, false);
        // Once the interpreter ended: what it wrote last is still read, until both pipes
        // end or for DRAIN_GRACE (a child of it may hold them open).
        let mut drain: Option<Instant> = None;
        while !(done && err_end) && !(dead && ((live.out.eof && live.err.eof) || !wrote)) {
            let Live {
                out, err, exited, ..
            } = &mut *live;
            // Timers and the cancel first: a cell that writes without pause must not keep
            // its timeout from firing.
            tokio::select! {
                biased;
                _ = cancel.cancelled(), if grace.is_none() => {
                    run.quiet = true;
                    self.interrupting.store(true, Ordering::SeqCst);
                    self.interrupt();
                    grace = Some(Instant::now() + grace_period());
                }
                _ = until(deadline), if grace.is_none() && deadline.is_some() => {
                    run.r.timed_out = true;
                    self.interrupting.store(true, Ordering::SeqCst);
                    self.interrupt();
                    grace = Some(Instant::now() + grace_period());
                }
                _ = until(grace), if grace.is_some() && !dead => hung = true,
                _ = until(drain), if drain.is_some() => break,
                _ = exited.changed(), if !dead => {
                    dead = true;
                    drain.get_or_insert(Instant::now() + DRAIN_GRACE);
                }
                n = out.fill_for(&conn, &pool, run.quiet), if !out.eof => {
                    for piece in out.pieces(n) {
                        done |= run.stdout_piece(piece, out).await;
                    }
                    out.shrink();
                }
                n = err.fill_for(&conn, &pool, run.quiet), if !err.eof => {
                    for piece in err.pieces(n) {
                        err_end |= run.stderr_piece(piece, err).await;
                    }
                    err.shrink();
                }
            }
            if hung {
                break;
            }
        }
        // Ended with its cell done (an `exit` in the last line): still a restart.
        dead |= live.pid.load(Ordering::SeqCst) == 0 && !(done && err_end);
        if dead || hung {
            run.r.restarted = true;
            let reason = if hung {
                format!(
                    "the cell did not stop within {} ms of an interrupt: the {} context was restarted and its state is lost",
                    grace_period().as_millis(),
                    self.lang.name()
                )
            } else if self.second_cancel.load(Ordering::SeqCst) {
                format!(
                    "a second cancel while the cell was being interrupted: the {} context was restarted and its state is lost",
                    self.lang.name()
                )
            } else {
                format!(
                    "the {} interpreter ended: the context restarts on its next run, its state is lost",
                    self.lang.name()
                )
            };
            if run.r.error.is_none() || hung {
                run.r.error = Some(CodeError {
                    name: if run.r.timed_out {
                        "TimeoutError"
                    } else if hung {
                        "KeyboardInterrupt"
                    } else {
                        "ContextExited"
                    }
                    .into(),
                    value: reason.clone(),
                    traceback: String::new(),
                });
            }
            run.note("restarted", &reason).await;
        }
        run.finish()
    }
}

/// One cell while it runs: its result, what it keeps for its reply (counted in the
/// broker-wide budget), where its notifications go.
struct Run<'a> {
    r: CodeResult,
    conn: &'a Outbound,
    pool: &'a Pool,
    cancel: &'a CancellationToken,
    sandbox: &'a str,
    context: &'a str,
    run_id: Option<&'a str>,
    /// Pool bytes counting what `r` keeps: its text, its results' trees, its error.
    kept: Option<Permit>,
    /// The memory of the results kept (their trees, estimated before they were built).
    results_cost: usize,
    /// Cancelled: nothing more is sent (the client was answered already).
    quiet: bool,
    /// Output was left out of the reply because the budget could not hold it.
    kept_short: bool,
    /// Bytes of notifications not sent because the budget could not hold them.
    unsent: usize,
}

impl<'a> Run<'a> {
    /// A piece of the interpreter's stdout; true when it was the cell's `done`.
    async fn stdout_piece(&mut self, piece: Piece, pipe: &mut Pipe) -> bool {
        match piece {
            Piece::Raw(b) => {
                let t = pipe.text(b);
                self.text("stdout", &t, &mut pipe.held).await;
                false
            }
            Piece::Frame(f) => self.frame(f, &mut pipe.held).await,
            Piece::Dropped(d) => {
                self.dropped(d).await;
                false
            }
        }
    }

    /// A piece of the interpreter's stderr; true when it was the end marker.
    async fn stderr_piece(&mut self, piece: Piece, pipe: &mut Pipe) -> bool {
        match piece {
            Piece::Raw(b) => {
                let t = pipe.text(b);
                self.text("stderr", &t, &mut pipe.held).await;
                false
            }
            Piece::Frame(f) => f == b"E",
            Piece::Dropped(_) => false,
        }
    }

    /// One frame of the driver; true when it was `done`. `held` counts it (twice its size
    /// beyond [`FREE`]: the frame, and what it becomes while it is passed on).
    async fn frame(&mut self, mut f: Vec<u8>, held: &mut Option<Permit>) -> bool {
        frame::mend(&mut f);
        let Some(ev) = frame::parse(&f) else {
            return false;
        };
        match ev {
            Event::Text { stderr, text } => {
                let kind = if stderr { "stderr" } else { "stdout" };
                match text {
                    std::borrow::Cow::Borrowed(t) => self.text(kind, t, held).await,
                    std::borrow::Cow::Owned(t) => {
                        // Decoded: the frame goes before the notification is built.
                        drop(f);
                        self.text(kind, &t, held).await;
                    }
                }
            }
            Event::Result(bundle) => self.result(bundle, held).await,
            Event::Error {
                name,
                value,
                traceback,
            } => {
                let e = CodeError {
                    name: name.into_owned(),
                    value: value.into_owned(),
                    traceback: traceback.into_owned(),
                };
                drop(f);
                self.error(e, held).await;
            }
            Event::Done(status) => {
                if status != 0 && self.r.error.is_none() {
                    let e = CodeError {
                        name: "ExitStatus".into(),
                        value: format!("exit status {status}"),
                        traceback: String::new(),
                    };
                    self.error(e, &mut None).await;
                }
                return true;
            }
            Event::Ready | Event::Other => {}
        }
        false
    }

    /// Text of `kind` (`stdout`, `stderr`): kept for the reply (within [`MAX_KEPT`] and the
    /// budget) and sent.
    async fn text(&mut self, kind: &str, t: &str, held: &mut Option<Permit>) {
        if t.is_empty() {
            return;
        }
        let kept = if kind == "stdout" {
            &mut self.r.stdout
        } else {
            &mut self.r.stderr
        };
        let mut cut = t.len().min(MAX_KEPT.saturating_sub(kept.len()));
        while !t.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut < t.len() {
            self.r.truncated = true;
        }
        if cut > 0 {
            if grow_by(&mut self.kept, self.pool, cut) {
                kept.reserve_exact(cut);
                kept.push_str(&t[..cut]);
            } else {
                self.r.truncated = true;
                self.kept_short = true;
            }
        }
        let o = self.output(kind, Some(t), None, None);
        self.send(&o, held).await;
    }

    /// A rich result: sent as the JSON text it came as; kept for the reply as a tree when
    /// the tree's estimated memory fits ([`MAX_RESULTS_KEPT`], the budget), else a marker in
    /// its place.
    async fn result(&mut self, bundle: &RawValue, held: &mut Option<Permit>) {
        let o = self.output("result", None, Some(bundle), None);
        self.send(&o, held).await;
        let json = bundle.get();
        let cost = frame::tree_cost(json);
        if self.results_cost + cost <= MAX_RESULTS_KEPT && grow_by(&mut self.kept, self.pool, cost)
        {
            if let Ok(b) = serde_json::from_str::<MimeBundle>(json) {
                self.results_cost += cost;
                self.r.results.push(b);
                return;
            }
        }
        self.r.truncated = true;
        let why = format!(
            "This result ({} bytes of JSON) is too large to keep in the reply: its code/output notification carried it.",
            json.len()
        );
        self.r
            .results
            .push(marker(frame::plain_text(bundle).as_deref(), &why));
    }

    /// The cell's error: sent, and kept (cut short when the budget cannot hold it).
    async fn error(&mut self, mut e: CodeError, held: &mut Option<Permit>) {
        let o = Output {
            error: Some(OutError {
                name: &e.name,
                value: &e.value,
                traceback: &e.traceback,
            }),
            ..self.output("error", None, None, None)
        };
        self.send(&o, held).await;
        let size = e.name.len() + e.value.len() + e.traceback.len();
        if !grow_by(&mut self.kept, self.pool, size) {
            for s in [&mut e.name, &mut e.value, &mut e.traceback] {
                let mut cut = s.len().min(ERROR_KEPT);
                while !s.is_char_boundary(cut) {
                    cut -= 1;
                }
                s.truncate(cut);
                s.shrink_to_fit();
            }
            self.r.truncated = true;
            self.kept_short = true;
        }
        self.r.error = Some(e);
    }

    /// A frame that was not kept: a marker where it was (a result whose `text/plain` says
    /// so, or a line on stderr).
    async fn dropped(&mut self, d: frame::Dropped) {
        let why = match d.why {
            Why::TooLarge => format!("too large (one output may take {} MiB)", MAX_FRAME >> 20),
            Why::Memory => "the broker-wide memory budget was in use".into(),
            Why::Cut => "cut off by the end of the interpreter's output".into(),
        };
        self.r.truncated = true;
        match d.kind {
            Kind::Result => {
                let m = marker(
                    None,
                    &format!("A result of {} bytes was dropped: {why}.", d.bytes),
                );
                if let Ok(raw) = serde_json::value::to_raw_value(&m) {
                    let o = self.output("result", None, Some(&raw), None);
                    self.send(&o, &mut None).await;
                }
                self.r.results.push(m);
            }
            Kind::Other => {
                let line = format!("\n[abx] {} bytes of output were dropped: {why}.\n", d.bytes);
                self.text("stderr", &line, &mut None).await;
            }
        }
    }

    /// A small notification (`restarted` and why), sent even after a cancel (the client
    /// learns its context restarted).
    async fn note(&mut self, kind: &str, text: &str) {
        let o = self.output(kind, Some(text), None, None);
        if let Some((body, p)) = self.counted(&o, &mut None) {
            send_note(self.conn, body, p).await;
        }
    }

    fn output<'o>(
        &self,
        kind: &'o str,
        text: Option<&'o str>,
        result: Option<&'o RawValue>,
        error: Option<OutError<'o>>,
    ) -> Output<'o>
    where
        'a: 'o,
    {
        Output {
            sandbox: self.sandbox,
            context: self.context,
            run_id: self.run_id,
            kind,
            text,
            result,
            error,
        }
    }

    /// Send a notification (unless cancelled), its bytes counted before it is built: from
    /// `held` (what counts the frame it comes from) and the budget. When they cannot be
    /// counted it is not sent (unless small: a connection's own allowance takes it), and
    /// the reply says so.
    async fn send(&mut self, o: &Output<'_>, held: &mut Option<Permit>) {
        if self.quiet || self.cancel.is_cancelled() {
            return;
        }
        if let Some((body, p)) = self.counted(o, held) {
            tokio::select! {
                _ = send_note(self.conn, body, p) => {}
                _ = self.cancel.cancelled() => {}
            }
        }
    }

    /// The body of a notification and the pool bytes counting it, counted before it is
    /// built (see [`Run::send`]).
    fn counted(
        &mut self,
        o: &Output<'_>,
        held: &mut Option<Permit>,
    ) -> Option<(Vec<u8>, Option<Permit>)> {
        let size = o.size() + MSG_OVERHEAD;
        if size > MAX_NOTE {
            self.unsent += size;
            return None;
        }
        let mut p = take_out(held, size);
        if !grow(&mut p, self.pool, size) && size > SMALL_MESSAGE {
            if let Some(p) = p {
                match held {
                    Some(h) => h.merge(p),
                    None => *held = Some(p),
                }
            }
            self.unsent += size;
            return None;
        }
        Some((frame::output_body(o), p))
    }

    /// The result, notes added for what the budget made it leave out, and the budget's
    /// bytes counting the reply (what it keeps, its copy while it is converted, its JSON).
    fn finish(mut self) -> (CodeResult, Option<Permit>) {
        if self.unsent > 0 {
            self.r.stderr.push_str(&format!(
                "\n[abx] {} bytes of code/output notifications were not sent: the broker-wide memory budget was in use (this reply keeps what it could).\n",
                self.unsent
            ));
            self.r.truncated = true;
        }
        if self.kept_short {
            self.r.stderr.push_str(
                "\n[abx] Output was left out of this reply: the broker-wide memory budget was in use (the code/output notifications carried it).\n",
            );
        }
        let text = |s: &str| 2 * s.len() + frame::escaped_len(s);
        let need = text(&self.r.stdout)
            + text(&self.r.stderr)
            + 2 * self.results_cost
            + self
                .r
                .error
                .as_ref()
                .map_or(0, |e| text(&e.name) + text(&e.value) + text(&e.traceback))
            + 4096;
        grow(&mut self.kept, self.pool, need);
        (self.r, self.kept)
    }
}

/// A MIME bundle standing for a result that is not there: its `text/plain` (when short)
/// and why, as `[abx] ...`.
fn marker(plain: Option<&str>, why: &str) -> MimeBundle {
    let text = match plain {
        Some(p) if p.len() <= 4096 => format!("{p}\n[abx] {why}"),
        _ => format!("[abx] {why}"),
    };
    let mut m = MimeBundle::new();
    m.insert("text/plain".into(), json!(text));
    m
}

/// Queue a notification whose pool bytes `hold` counts (waiting only for the connection's
/// own budget, while its client reads).
async fn send_note(conn: &Outbound, body: Vec<u8>, hold: Option<Permit>) {
    if let Some(r) = conn.reserve(0).await {
        conn.send_reserved(body, r, hold).await;
    }
}

/// A cell's `timeout` and `env`, checked (E2004, E1004) before anything is made for it.
pub fn check_cell(cell: &Cell) -> Result<(), AbxError> {
    if let Some(t) = cell.timeout {
        if !(t > 0.0 && t <= 30.0 * 86_400.0) {
            return Err(AbxError::new(
                ErrorCode::InvalidTimeout,
                &[
                    ("timeout", &t.to_string()),
                    ("detail", "must be more than 0 and at most 30 days"),
                ],
            ));
        }
    }
    if let Some(k) = cell.env.iter().find_map(|(k, v)| {
        let name = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        (!name || v.contains('\0')).then_some(k)
    }) {
        return Err(AbxError::invalid_params(
            "code/run",
            format!("invalid environment variable {k:?}"),
        )
        .with_suggestion(
            "Names of letters, digits and _, not starting with a digit; values without NUL.",
        ));
    }
    Ok(())
}

/// Kills the interpreter of a context whose run is cancelled while it waits behind a cell
/// that is being interrupted (the "second cancel").
struct Waiting(Option<Arc<Context>>);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.queued.fetch_sub(1, Ordering::Relaxed);
            if c.interrupting.load(Ordering::SeqCst) {
                c.second_cancel.store(true, Ordering::SeqCst);
                c.kill_now();
            }
        }
    }
}

async fn until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn tail(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut i = s.len() - n;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

fn rand64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom into a local buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        return t ^ (std::process::id() as u64).rotate_left(32);
    }
    u64::from_ne_bytes(b)
}

/// The line the driver reads for a cell.
fn request_line(lang: Lang, cell: &Cell) -> String {
    match lang {
        Lang::Python | Lang::JavaScript => {
            let mut s = json!({"code": cell.code, "env": cell.env}).to_string();
            s.push('\n');
            s
        }
        Lang::Bash => {
            let mut code = String::new();
            for (k, v) in &cell.env {
                code.push_str(&format!("export {k}='{}'\n", v.replace('\'', r"'\''")));
            }
            code.push_str(&cell.code);
            let mut s = bash_escape(&code);
            s.push('\n');
            s
        }
    }
}

/// `code` as one line that bash's `printf %b` turns back into it (NULs dropped: a bash
/// string cannot hold them).
fn bash_escape(code: &str) -> String {
    let mut s = String::with_capacity(code.len() + 16);
    for c in code.chars() {
        match c {
            '\\' => s.push_str(r"\\"),
            '\n' => s.push_str(r"\n"),
            '\0' => {}
            c if (c as u32) < 0x20 || c == '\x7f' => s.push_str(&format!("\\x{:02x}", c as u32)),
            c => s.push(c),
        }
    }
    s
}

fn gone(sandbox: &str, id: &str) -> AbxError {
    AbxError::invalid_params(
        "code",
        format!("no code context '{id}' in sandbox '{sandbox}'"),
    )
    .with_suggestion("List the sandbox's contexts with code/listContexts, or create one with code/createContext.")
}

/// Every sandbox's contexts.
#[derive(Default)]
pub struct Contexts {
    map: Mutex<HashMap<String, Vec<Arc<Context>>>>,
    next: AtomicU64,
}

/// What a new context starts with.
pub struct NewContext {
    /// Its language.
    pub lang: Lang,
    /// Its working directory (checked when it starts).
    pub cwd: Option<String>,
    /// Its interpreter program.
    pub interpreter: Option<String>,
    /// Its environment.
    pub env: BTreeMap<String, String>,
}

impl Contexts {
    /// Create a context (its interpreter starts on its first run).
    pub fn create(&self, sandbox: &str, new: NewContext) -> Result<Arc<Context>, AbxError> {
        let id = format!(
            "ctx-{}-{:08x}",
            self.next.fetch_add(1, Ordering::Relaxed) + 1,
            rand64() as u32
        );
        self.insert(sandbox, id, new, false)
    }

    fn insert(
        &self,
        sandbox: &str,
        id: String,
        new: NewContext,
        default: bool,
    ) -> Result<Arc<Context>, AbxError> {
        if let Some(i) = &new.interpreter {
            if i.is_empty() || i.contains('\0') {
                return Err(AbxError::invalid_params(
                    "code/createContext",
                    "interpreter must be a program name or path",
                ));
            }
        }
        if let Some(k) = new
            .env
            .iter()
            .find(|(k, v)| k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0'))
        {
            return Err(AbxError::invalid_params(
                "code",
                format!("invalid environment variable {:?}", k.0),
            ));
        }
        let mut map = self.map.lock().expect("contexts");
        let list = map.entry(sandbox.to_owned()).or_default();
        if let Some(c) = list.iter().find(|c| c.id == id) {
            return Ok(c.clone());
        }
        if list.len() >= MAX_CONTEXTS {
            return Err(AbxError::invalid_params(
                "code/createContext",
                format!(
                    "sandbox '{sandbox}' has {MAX_CONTEXTS} code contexts, the most it may have"
                ),
            )
            .with_suggestion("Remove contexts it no longer needs with code/removeContext."));
        }
        let c = Arc::new(Context {
            id,
            sandbox: sandbox.to_owned(),
            lang: new.lang,
            cwd: new.cwd.unwrap_or_else(|| super::WORKSPACE.into()),
            interpreter: new.interpreter,
            env: new.env,
            default,
            live: Arc::new(tokio::sync::Mutex::new(None)),
            pid: Mutex::new(Arc::new(AtomicI32::new(0))),
            count: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            interrupting: AtomicBool::new(false),
            second_cancel: AtomicBool::new(false),
            queued: AtomicU64::new(0),
            removed: AtomicBool::new(false),
        });
        list.push(c.clone());
        Ok(c)
    }

    /// The context `id` of `sandbox`.
    pub fn get(&self, sandbox: &str, id: &str) -> Result<Arc<Context>, AbxError> {
        self.map
            .lock()
            .expect("contexts")
            .get(sandbox)
            .and_then(|l| l.iter().find(|c| c.id == id).cloned())
            .ok_or_else(|| gone(sandbox, id))
    }

    /// The sandbox's default context of `lang` (`default-<lang>`), made on first use.
    pub fn default_for(&self, sandbox: &str, lang: Lang) -> Result<Arc<Context>, AbxError> {
        let new = NewContext {
            lang,
            cwd: None,
            interpreter: None,
            env: BTreeMap::new(),
        };
        self.insert(sandbox, format!("default-{}", lang.name()), new, true)
    }

    /// The sandbox's contexts, oldest first.
    pub fn list(&self, sandbox: &str) -> Vec<CodeContext> {
        self.map
            .lock()
            .expect("contexts")
            .get(sandbox)
            .map(|l| l.iter().map(|c| c.view()).collect())
            .unwrap_or_default()
    }

    /// Remove a context and end its interpreter.
    pub fn remove(&self, sandbox: &str, id: &str) -> Result<(), AbxError> {
        let c = {
            let mut map = self.map.lock().expect("contexts");
            let list = map.get_mut(sandbox).ok_or_else(|| gone(sandbox, id))?;
            let i = list
                .iter()
                .position(|c| c.id == id)
                .ok_or_else(|| gone(sandbox, id))?;
            list.remove(i)
        };
        c.removed.store(true, Ordering::SeqCst);
        c.kill_now();
        Ok(())
    }

    /// Start a new context's interpreter now (so a bad `cwd` or interpreter fails its
    /// create); the context is forgotten when it cannot start.
    pub async fn start(&self, site: Site<'_>, c: &Arc<Context>) -> Result<(), AbxError> {
        let mut g = c.live.lock().await;
        if g.is_none() {
            match c.start(site).await {
                Ok(l) => *g = Some(l),
                Err(e) => {
                    drop(g);
                    let _ = self.remove(&c.sandbox, &c.id);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Restart a context: its interpreter is killed (a running cell ends `restarted`) and a
    /// new one started.
    pub async fn restart(&self, site: Site<'_>, c: &Arc<Context>) -> Result<(), AbxError> {
        c.kill_now();
        let mut g = c.live.lock().await;
        // A cell that was running counted the restart already (and cleared its interpreter).
        if g.take().is_some() {
            c.restarts.fetch_add(1, Ordering::Relaxed);
        }
        c.count.store(0, Ordering::Relaxed);
        *g = Some(c.start(site).await?);
        Ok(())
    }

    /// Forget a sandbox's contexts (its processes are gone with it).
    pub fn drop_sandbox(&self, sandbox: &str) {
        let list = self.map.lock().expect("contexts").remove(sandbox);
        for c in list.unwrap_or_default() {
            c.removed.store(true, Ordering::SeqCst);
            c.kill_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark() -> Vec<u8> {
        b"\x1fNN".to_vec()
    }

    /// What a pipe yields for `bytes`, read as a cell reads it, with `pool`; checks that
    /// every read was counted before it was made.
    async fn read_all(bytes: Vec<u8>, pool: &Pool, max: usize) -> Vec<String> {
        let mut pipe = Pipe::new(Box::new(std::io::Cursor::new(bytes)), &mark());
        pipe.split.set_max(max);
        let mut seen = Vec::new();
        while !pipe.eof {
            let n = pipe.fill(Some(pool)).await;
            assert!(
                have(&pipe.held) >= cover(pipe.split.buf.len()),
                "{} bytes held for a buffer of {}",
                have(&pipe.held),
                pipe.split.buf.len()
            );
            for p in pipe.pieces(n) {
                seen.push(match p {
                    Piece::Raw(b) => format!("raw {}", pipe.text(b)),
                    Piece::Frame(f) => match frame::parse(&f) {
                        Some(Event::Done(_)) => "done".into(),
                        Some(Event::Result(_)) => format!("result {}", f.len()),
                        _ => "frame".into(),
                    },
                    Piece::Dropped(d) => format!("dropped {:?} {:?}", d.why, d.kind),
                });
            }
            pipe.shrink();
        }
        drop(pipe);
        assert_eq!(pool.available(), pool.cap(), "everything given back");
        seen
    }

    fn big_result(n: usize) -> Vec<u8> {
        let mut bytes = b"a\x1fNN{\"t\": \"result\", \"b\": {\"text/plain\": \"".to_vec();
        bytes.resize(bytes.len() + n, b'x');
        bytes.extend_from_slice(b"\"}}\nb\x1fNN{\"t\":\"done\"}\n");
        bytes
    }

    #[tokio::test]
    async fn a_frame_too_large_is_dropped_and_what_follows_is_read() {
        let pool = Pool::new(512 << 20);
        let seen = read_all(big_result(MAX_FRAME + 256 * 1024), &pool, MAX_FRAME).await;
        assert_eq!(
            seen,
            ["raw a", "dropped TooLarge Result", "raw b", "done"],
            "{seen:?}"
        );
        // Within the bound: read whole.
        let seen = read_all(big_result(3 << 20), &pool, MAX_FRAME).await;
        assert_eq!(seen[1], format!("result {}", (3 << 20) + 40));
    }

    #[tokio::test]
    async fn a_frame_the_budget_cannot_hold_is_dropped_and_said_so() {
        // A pool of 1 MiB (the least there is) cannot count a frame of 3 MiB: dropped as
        // it streams in, what follows read, everything given back.
        let pool = Pool::new(1 << 20);
        let seen = read_all(big_result(3 << 20), &pool, MAX_FRAME).await;
        assert_eq!(
            seen,
            ["raw a", "dropped Memory Result", "raw b", "done"],
            "{seen:?}"
        );
        // Short frames need nothing of it.
        let none = Pool::new(1 << 20);
        let _all = none.try_take(1 << 20).unwrap();
        let mut bytes = b"x\x1fNN{\"t\":\"stdout\",\"d\":\"hi\"}\n".to_vec();
        bytes.extend_from_slice(b"\x1fNN{\"t\":\"done\"}\n");
        let mut pipe = Pipe::new(Box::new(std::io::Cursor::new(bytes)), &mark());
        let mut seen = Vec::new();
        while !pipe.eof {
            let n = pipe.fill(Some(&none)).await;
            seen.extend(
                pipe.pieces(n)
                    .into_iter()
                    .map(|p| matches!(p, Piece::Frame(_))),
            );
        }
        assert_eq!(seen, [false, true, true]);
    }

    #[test]
    fn bash_escape_round_trips_through_printf_b() {
        let code = "echo 'a\\tb' \"$HOME\"\nprintf '%s\\n' x\x01y\r";
        let line = bash_escape(code);
        assert!(!line.contains('\n'));
        let out = std::process::Command::new("bash")
            .args([
                "-c",
                "printf -v c '%b' \"$1\"; printf '%s' \"$c\"",
                "-",
                &line,
            ])
            .output()
            .expect("bash");
        assert_eq!(String::from_utf8_lossy(&out.stdout), code);
    }

    #[test]
    fn languages_and_aliases() {
        assert_eq!(Lang::parse(None).unwrap(), Lang::Python);
        assert_eq!(Lang::parse(Some("JS")).unwrap(), Lang::JavaScript);
        assert_eq!(Lang::parse(Some("shell")).unwrap(), Lang::Bash);
        let e = Lang::parse(Some("cobol")).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidParams);
    }

    /// Each interpreter's bootstrap (short: `ps` shows it) reads its driver from stdin and
    /// runs the cell that follows it there.
    #[test]
    fn the_bootstraps_run_the_driver_from_stdin() {
        use std::io::Write;
        for (lang, prog, code, want) in [
            (Lang::Python, "python3", "print(6 * 7)", "42"),
            (Lang::JavaScript, "node", "console.log(6 * 7)", "42"),
            (Lang::Bash, "bash", "echo $((6 * 7))", "42"),
        ] {
            let Ok(found) = std::process::Command::new("which").arg(prog).output() else {
                continue;
            };
            if !found.status.success() {
                eprintln!("{prog} not installed: skipped");
                continue;
            }
            let argv = lang.argv(None);
            assert!(
                argv.iter().map(String::len).sum::<usize>() < 800,
                "{argv:?}"
            );
            let mut child = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .env("ABX_CODE_NONCE", "NN")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let cell = Cell {
                code: code.into(),
                env: BTreeMap::new(),
                timeout: None,
                run_id: None,
            };
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(lang.driver().as_bytes()).unwrap();
            stdin
                .write_all(request_line(lang, &cell).as_bytes())
                .unwrap();
            drop(stdin);
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                stdout.contains("\x1fNN{\"t\": \"ready\"")
                    || stdout.contains("\x1fNN{\"t\":\"ready\""),
                "{lang:?}: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout.contains(want), "{lang:?}: {stdout}");
            assert!(stdout.contains("\"done\""), "{lang:?}: {stdout}");
        }
    }
}
