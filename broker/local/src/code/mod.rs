//! `code/*` on `local` (feature `code.interpret`): contexts, long-lived interpreters inside a
//! sandbox that run cells and keep their state.
//!
//! A context is one interpreter process started like an exec (same confinement, same
//! environment rules, its own session) running a small driver embedded in the binary:
//! `driver.py` (python3), `driver.js` (node, one `vm` context), `driver.sh` (bash at its top
//! level). The broker writes one cell per line to the driver's stdin; the driver answers on
//! its stdout with frames, each a marker (`\x1f` and a random nonce given in the
//! environment, which the driver removes) then one JSON object and a newline: `ready`,
//! `stdout`/`stderr` (what the language's own print functions wrote, in order), `result`
//! (a MIME bundle), `error` and `done`; after `done` it writes the marker and `E` on its
//! stderr. Bytes outside frames on either pipe are output of child processes (or of the
//! shell) and are reported as that pipe's stream. A context's cells run one at a time.
//!
//! Interrupts: a cancelled or timed-out cell gets SIGINT (its process group); if it has not
//! finished [`GRACE`] later, or a run waiting behind an interrupted cell is cancelled too,
//! the interpreter is killed and the context restarts (its state lost): a `code/output` of
//! type `restarted` says so, and the run's result has `restarted: true`. A context dies
//! with its sandbox ([`Contexts::drop_sandbox`]).

use super::exec::{self, Site};
use super::procs;
use abx_core::outbound::Outbound;
use abx_protocol::api::{CodeContext, CodeError, CodeOutput, CodeResult, MimeBundle};
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
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
/// Events a context's pipe readers may have queued (then they wait: the pipes fill and the
/// interpreter waits too, so a client that reads slowly bounds what is held).
const EVENTS: usize = 64;

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
/// Output kept per stream of one cell for the reply (the notifications carry all of it).
const MAX_KEPT: usize = 16 * 1024 * 1024;
/// Bytes of rich results kept for the reply of one cell (the notifications carry all).
const MAX_RESULTS_KEPT: usize = 64 * 1024 * 1024;
/// The longest frame read from an interpreter (a larger one is dropped, never held).
const MAX_FRAME: usize = 48 * 1024 * 1024;
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

    fn argv(self, interpreter: Option<&str>) -> Vec<String> {
        let (prog, args): (&str, &[&str]) = match self {
            Lang::Python => ("python3", &["-c", PYTHON_DRIVER]),
            Lang::JavaScript => ("node", &["-e", NODE_DRIVER]),
            Lang::Bash => ("bash", &["--noprofile", "--norc", "-c", BASH_DRIVER]),
        };
        std::iter::once(interpreter.unwrap_or(prog))
            .chain(args.iter().copied())
            .map(str::to_owned)
            .collect()
    }
}

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

/// What the pipe readers report, in order per pipe.
enum Ev {
    Out(String),
    Err(String),
    Frame(Value),
    ErrEnd,
    /// One pipe reached its end.
    Eof,
    Exited,
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// A running interpreter.
struct Live {
    /// Its host pid (= its process group) while it runs, 0 once it ended.
    pid: Arc<AtomicI32>,
    stdin: Writer,
    rx: mpsc::Receiver<Ev>,
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

    /// Start the interpreter and wait for its `ready`.
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
        let mark: Arc<[u8]> = format!("\x1f{nonce}").into_bytes().into();
        let (tx, rx) = mpsc::channel(EVENTS);
        let stdout = sp.stdout.take().expect("piped");
        let stderr = sp.stderr.take().expect("piped");
        tokio::spawn(read_pipe(stdout, mark.clone(), tx.clone(), false));
        tokio::spawn(read_pipe(stderr, mark, tx.clone(), true));
        let mut child = sp.child;
        let pid2 = pid.clone();
        tokio::spawn(async move {
            let _ = child.wait().await;
            pid2.store(0, Ordering::SeqCst);
            let _ = tx.send(Ev::Exited).await;
        });
        let mut live = Live {
            pid: pid.clone(),
            stdin: sp.stdin.take().expect("piped"),
            rx,
        };
        *self.pid.lock().expect("pid") = pid;
        // Until `ready`: anything the interpreter says is why it did not start.
        let mut said = String::new();
        let ready = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(ev) = live.rx.recv().await {
                match ev {
                    Ev::Frame(v) if v["t"] == "ready" => return true,
                    Ev::Out(s) | Ev::Err(s) => said.push_str(&s),
                    Ev::Exited => return false,
                    _ => {}
                }
            }
            false
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
        Ok(live)
    }

    /// Run a cell: notifications to `conn` as it runs, the whole execution as the result.
    /// `cancel` interrupts it.
    pub async fn run(
        self: &Arc<Self>,
        site: Site<'_>,
        cell: Cell,
        conn: Outbound,
        cancel: CancellationToken,
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
            let mut r = me.cell(live, cell, conn, cancel).await;
            if r.restarted {
                *g = None;
                me.count.store(0, Ordering::Relaxed);
                me.restarts.fetch_add(1, Ordering::Relaxed);
            }
            me.interrupting.store(false, Ordering::SeqCst);
            me.second_cancel.store(false, Ordering::SeqCst);
            drop(g);
            r.restarted |= restarted;
            let _ = tx.send(r);
        });
        rx.await
            .map_err(|_| AbxError::internal("the code/run task ended without an answer"))
    }

    async fn cell(
        &self,
        live: &mut Live,
        cell: Cell,
        conn: Outbound,
        cancel: CancellationToken,
    ) -> CodeResult {
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let mut r = CodeResult {
            results: Vec::new(),
            stdout: String::new(),
            stderr: String::new(),
            error: None,
            execution_count: n,
            context: self.id.clone(),
            timed_out: false,
            restarted: false,
            truncated: false,
        };
        let note = Note {
            conn: &conn,
            sandbox: &self.sandbox,
            context: &self.id,
            run_id: cell.run_id.as_deref(),
        };
        let line = request_line(self.lang, &cell);
        let wrote =
            live.stdin.write_all(line.as_bytes()).await.is_ok() && live.stdin.flush().await.is_ok();
        let deadline = cell
            .timeout
            .map(|t| Instant::now() + Duration::from_secs_f64(t));
        let mut grace: Option<Instant> = None;
        let (mut done, mut err_end, mut dead, mut hung, mut cancelled) =
            (false, false, !wrote, false, false);
        // Once the interpreter ended: what it wrote last is still read, until both pipes
        // end or for DRAIN_GRACE (a child of it may hold them open).
        let (mut eofs, mut drain): (u8, Option<Instant>) = (0, None);
        let mut results_kept = 0usize;
        while !(done && err_end) && !(dead && (eofs >= 2 || !wrote)) {
            tokio::select! {
                biased;
                ev = live.rx.recv() => match ev {
                    None => (dead, eofs) = (true, 2),
                    Some(Ev::Exited) => {
                        dead = true;
                        drain.get_or_insert(Instant::now() + DRAIN_GRACE);
                    }
                    Some(Ev::Eof) => eofs += 1,
                    Some(Ev::ErrEnd) => err_end = true,
                    Some(Ev::Out(s)) => r.truncated |= note.text(&mut r.stdout, "stdout", s, cancelled).await,
                    Some(Ev::Err(s)) => r.truncated |= note.text(&mut r.stderr, "stderr", s, cancelled).await,
                    Some(Ev::Frame(v)) => match v["t"].as_str().unwrap_or_default() {
                        "stdout" => r.truncated |= note.text(&mut r.stdout, "stdout", text(&v["d"]), cancelled).await,
                        "stderr" => r.truncated |= note.text(&mut r.stderr, "stderr", text(&v["d"]), cancelled).await,
                        "result" => {
                            let size = v["n"].as_u64().unwrap_or(0) as usize;
                            let b: MimeBundle = match v {
                                Value::Object(mut o) => match o.remove("b") {
                                    Some(Value::Object(b)) => b,
                                    _ => MimeBundle::new(),
                                },
                                _ => MimeBundle::new(),
                            };
                            if !cancelled {
                                note.send("result", None, Some(b.clone()), None).await;
                            }
                            if results_kept + size <= MAX_RESULTS_KEPT {
                                results_kept += size;
                                r.results.push(b);
                            } else {
                                r.truncated = true;
                            }
                        }
                        "error" => {
                            let e = CodeError {
                                name: text(&v["name"]),
                                value: text(&v["value"]),
                                traceback: text(&v["traceback"]),
                            };
                            if !cancelled {
                                note.send("error", None, None, Some(e.clone())).await;
                            }
                            r.error = Some(e);
                        }
                        "done" => {
                            done = true;
                            let status = v["status"].as_i64().unwrap_or(0);
                            if status != 0 && r.error.is_none() {
                                let e = CodeError {
                                    name: "ExitStatus".into(),
                                    value: format!("exit status {status}"),
                                    traceback: String::new(),
                                };
                                if !cancelled {
                                    note.send("error", None, None, Some(e.clone())).await;
                                }
                                r.error = Some(e);
                            }
                        }
                        _ => {}
                    },
                },
                _ = cancel.cancelled(), if grace.is_none() => {
                    cancelled = true;
                    self.interrupting.store(true, Ordering::SeqCst);
                    self.interrupt();
                    grace = Some(Instant::now() + grace_period());
                }
                _ = until(deadline), if grace.is_none() && deadline.is_some() => {
                    r.timed_out = true;
                    self.interrupting.store(true, Ordering::SeqCst);
                    self.interrupt();
                    grace = Some(Instant::now() + grace_period());
                }
                _ = until(grace), if grace.is_some() && !dead => hung = true,
                _ = until(drain), if drain.is_some() => break,
            }
            if hung {
                break;
            }
        }
        // Ended with its cell done (an `exit` in the last line): still a restart.
        dead |= live.pid.load(Ordering::SeqCst) == 0 && !(done && err_end);
        if dead || hung {
            r.restarted = true;
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
            if r.error.is_none() || hung {
                r.error = Some(CodeError {
                    name: if r.timed_out {
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
            note.send("restarted", Some(reason), None, None).await;
        }
        r
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

/// Where a cell's notifications go.
struct Note<'a> {
    conn: &'a Outbound,
    sandbox: &'a str,
    context: &'a str,
    run_id: Option<&'a str>,
}

impl Note<'_> {
    async fn send(
        &self,
        kind: &str,
        text: Option<String>,
        result: Option<MimeBundle>,
        error: Option<CodeError>,
    ) {
        let n = CodeOutput {
            sandbox: self.sandbox.into(),
            context: self.context.into(),
            run_id: self.run_id.map(str::to_owned),
            kind: kind.into(),
            text,
            result,
            error,
        };
        let mut v = serde_json::to_value(&n).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.retain(|_, x| !x.is_null());
        }
        self.conn.notify("code/output", &v).await;
    }

    /// Keep `s` (within [`MAX_KEPT`]) and send it; true when some of it was not kept.
    async fn text(&self, kept: &mut String, kind: &str, s: String, quiet: bool) -> bool {
        if s.is_empty() {
            return false;
        }
        let room = MAX_KEPT.saturating_sub(kept.len());
        let mut cut = s.len().min(room);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        kept.push_str(&s[..cut]);
        let short = cut < s.len();
        if !quiet {
            self.send(kind, Some(s), None, None).await;
        }
        short
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
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

/// Read one of the interpreter's pipes: raw text and frames (stdout), raw text and the end
/// marker (stderr), in order, until EOF.
async fn read_pipe(
    mut r: Box<dyn AsyncRead + Send + Unpin>,
    mark: Arc<[u8]>,
    tx: mpsc::Sender<Ev>,
    stderr: bool,
) {
    let mut split = Splitter::new(mark, MAX_FRAME);
    let mut raw: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = r.read(&mut chunk).await.unwrap_or(0);
        let eof = n == 0;
        for piece in split.push(&chunk[..n], eof) {
            match piece {
                Piece::Raw(b) => raw.extend_from_slice(&b),
                Piece::Frame(f) => {
                    flush_raw(&mut raw, &tx, stderr, true).await;
                    let ev = if stderr {
                        (f == b"E").then_some(Ev::ErrEnd)
                    } else {
                        serde_json::from_slice::<Value>(&f).ok().map(|mut v| {
                            if v.is_object() {
                                v["n"] = json!(f.len());
                            }
                            Ev::Frame(v)
                        })
                    };
                    if let Some(ev) = ev {
                        let _ = tx.send(ev).await;
                    }
                }
            }
        }
        flush_raw(&mut raw, &tx, stderr, eof).await;
        if eof {
            let _ = tx.send(Ev::Eof).await;
            return;
        }
    }
}

/// Send the complete UTF-8 text of `raw` (all of it, lossily, when `all`).
async fn flush_raw(raw: &mut Vec<u8>, tx: &mpsc::Sender<Ev>, stderr: bool, all: bool) {
    if raw.is_empty() {
        return;
    }
    let cut = match std::str::from_utf8(raw) {
        Ok(_) => raw.len(),
        Err(e) if e.error_len().is_none() && !all => e.valid_up_to(),
        Err(_) => raw.len(),
    };
    if cut == 0 {
        return;
    }
    let rest = raw.split_off(cut);
    let s = String::from_utf8_lossy(raw).into_owned();
    *raw = rest;
    let _ = tx.send(if stderr { Ev::Err(s) } else { Ev::Out(s) }).await;
}

/// What a [`Splitter`] finds in a pipe's bytes.
#[derive(Debug, PartialEq)]
enum Piece {
    Raw(Vec<u8>),
    Frame(Vec<u8>),
}

/// Splits a pipe's bytes into raw bytes and frames (marker .. newline), each byte looked at
/// about once however a frame is cut into reads. A partial frame, or a tail that may begin a
/// marker, waits for more (unless at the end); a frame longer than `max` is dropped as it
/// comes (never held whole).
struct Splitter {
    buf: Vec<u8>,
    mark: Arc<[u8]>,
    max: usize,
    /// `buf` starts with a frame's marker; no newline in `buf[..scanned]`.
    in_frame: bool,
    scanned: usize,
    /// Inside a frame that grew past `max`: bytes are dropped up to its newline.
    dropping: bool,
}

impl Splitter {
    fn new(mark: Arc<[u8]>, max: usize) -> Splitter {
        Splitter {
            buf: Vec::new(),
            mark,
            max,
            in_frame: false,
            scanned: 0,
            dropping: false,
        }
    }

    fn push(&mut self, mut bytes: &[u8], eof: bool) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.dropping {
            match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.dropping = false;
                    bytes = &bytes[i + 1..];
                }
                None => bytes = &[],
            }
        }
        self.buf.extend_from_slice(bytes);
        let m = self.mark.len();
        loop {
            if self.in_frame {
                let from = self.scanned.max(m);
                match self.buf[from..].iter().position(|&b| b == b'\n') {
                    Some(j) => {
                        let end = from + j;
                        out.push(Piece::Frame(self.buf[m..end].to_vec()));
                        self.buf.drain(..=end);
                        (self.in_frame, self.scanned) = (false, 0);
                        continue;
                    }
                    None if eof => {
                        self.buf.clear();
                        self.in_frame = false;
                    }
                    None if self.buf.len() > self.max => {
                        tracing::warn!(
                            bytes = self.buf.len(),
                            "code: dropping an interpreter frame too large to keep"
                        );
                        self.buf.clear();
                        (self.in_frame, self.dropping) = (false, true);
                    }
                    None => self.scanned = self.buf.len(),
                }
                return out;
            }
            match find(&self.buf, &self.mark) {
                Some(i) => {
                    if i > 0 {
                        out.push(Piece::Raw(self.buf[..i].to_vec()));
                        self.buf.drain(..i);
                    }
                    (self.in_frame, self.scanned) = (true, 0);
                }
                None => {
                    let keep = if eof {
                        0
                    } else {
                        (1..m.min(self.buf.len() + 1))
                            .rev()
                            .find(|&k| self.buf.ends_with(&self.mark[..k]))
                            .unwrap_or(0)
                    };
                    let upto = self.buf.len() - keep;
                    if upto > 0 {
                        out.push(Piece::Raw(self.buf[..upto].to_vec()));
                        self.buf.drain(..upto);
                    }
                    return out;
                }
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
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

    #[test]
    fn split_takes_frames_and_raw_text_in_order() {
        let mut sp = Splitter::new(b"\x1fNN".to_vec().into(), 1 << 20);
        let p = sp.push(b"ab\x1fNN{\"t\":1}\ncd\x1fN", false);
        assert_eq!(
            p,
            vec![
                Piece::Raw(b"ab".to_vec()),
                Piece::Frame(b"{\"t\":1}".to_vec()),
                Piece::Raw(b"cd".to_vec())
            ]
        );
        assert_eq!(sp.buf, b"\x1fN", "a tail that may begin a marker waits");
        assert!(sp.push(b"N{}", false).is_empty(), "a partial frame waits");
        assert!(sp.push(b"[1,", false).is_empty(), "still");
        assert_eq!(
            sp.push(b"2]\nz", false),
            vec![Piece::Frame(b"{}[1,2]".to_vec()), Piece::Raw(b"z".to_vec())]
        );
        let mut sp = Splitter::new(b"\x1fNN".to_vec().into(), 1 << 20);
        assert_eq!(
            sp.push(b"x\x1fN", true),
            vec![Piece::Raw(b"x\x1fN".to_vec())]
        );
        // Longer than the bound: dropped through its newline, what follows is kept.
        let mut sp = Splitter::new(b"\x1fNN".to_vec().into(), 8);
        assert_eq!(
            sp.push(b"a\x1fNN0123456789", false),
            vec![Piece::Raw(b"a".to_vec())]
        );
        assert!(sp.buf.is_empty());
        assert!(sp.push(b"more", false).is_empty());
        assert_eq!(
            sp.push(b"end\nb\x1fNN{}\n", false),
            vec![Piece::Raw(b"b".to_vec()), Piece::Frame(b"{}".to_vec())]
        );
    }

    #[tokio::test]
    async fn a_frame_too_large_is_dropped_and_what_follows_is_read() {
        let mark: Arc<[u8]> = b"\x1fNN".to_vec().into();
        let mut bytes = b"a\x1fNN{\"t\":\"result\",\"b\":\"".to_vec();
        bytes.resize(bytes.len() + MAX_FRAME + 256 * 1024, b'x');
        bytes.extend_from_slice(b"\"}\nb\x1fNN{\"t\":\"done\"}\n");
        let (tx, mut rx) = mpsc::channel(EVENTS);
        let reader: Box<dyn AsyncRead + Send + Unpin> = Box::new(std::io::Cursor::new(bytes));
        tokio::spawn(read_pipe(reader, mark, tx, false));
        let mut seen = Vec::new();
        while let Some(ev) = rx.recv().await {
            seen.push(match ev {
                Ev::Out(s) => format!("out {s}"),
                Ev::Frame(v) => format!("frame {}", v["t"]),
                Ev::Eof => "eof".into(),
                _ => "other".into(),
            });
        }
        assert_eq!(seen, ["out a", "out b", "frame \"done\"", "eof"]);
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
}
