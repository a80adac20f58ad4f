//! Spawn: a plugin's child started and handshaken. [`start`] runs the steps in order:
//! the launcher's command ([`launcher`]: the plugin's whole environment, its config on the
//! launcher's environment, nothing inherited but stdio and the status pipe), the stderr
//! logger (redacted, rate-limited, a tail kept for error details), the stdin writer, the
//! sweeper, the child's watcher (the read loop, then the child's end: pending calls failed,
//! streams ended), the launcher's status line, and the `initialize` handshake.

use super::inflight::{sweep, Calls, Lent, Pending, Sweep, SWEEP_LINGER};
use super::reader::{read_loop, LogLimit, PluginIo, LOG_LINES_PER_SEC};
use crate::launch;
use crate::pace::Pace;
use crate::stream::{self, Route};
use abx_protocol::epp::{self, redact};
use abx_protocol::message;
use abx_protocol::{AbxError, ErrorCode, Id};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Lines of stderr kept for error details.
pub(super) const STDERR_TAIL: usize = 20;
/// Longest stderr line kept (the rest of a longer line is dropped).
pub(super) const STDERR_LINE: usize = 16 * 1024;

/// Read one line into `line` (without its newline), keeping at most `cap` bytes. Ok(None) at
/// the end; Ok(Some(true)) when the line was cut.
pub(super) async fn read_line_capped<R: tokio::io::AsyncBufRead + Unpin>(
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
pub(super) fn handshake_timeout() -> Duration {
    std::env::var("ABX_PLUGIN_HANDSHAKE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(15), Duration::from_secs)
}

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
    pub permissions: Arc<crate::permissions::Plan>,
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

pub(super) struct Running {
    pub(super) writer: mpsc::UnboundedSender<Vec<u8>>,
    /// The child's stdin, shared with the writer task: a call whose line fits in one
    /// atomic pipe write and finds it idle writes it itself ([`Running::send`]).
    pub(super) stdin: Arc<tokio::sync::Mutex<tokio::process::ChildStdin>>,
    pub(super) pending: Arc<Mutex<Calls>>,
    pub(super) routes: Arc<Mutex<HashMap<String, Route>>>,
    pub(super) next_id: AtomicI64,
    pub(super) pid: u32,
    pub(super) isolation: String,
    pub(super) dead: CancellationToken,
    pub(super) handshake: Handshake,
    pub(super) stderr_tail: Arc<Mutex<VecDeque<String>>>,
    pub(super) kill: CancellationToken,
    pub(super) sweep: Arc<Sweep>,
    /// How soon the plugin answers, and a duplicate of its stdout to poll while a fast
    /// plugin's reply is on its way (pace.rs).
    pub(super) pace: Arc<Pace>,
    pub(super) watch: Option<Arc<std::os::fd::OwnedFd>>,
}

impl Running {
    /// Queue or write one line to the plugin. A line that fits in one atomic pipe write
    /// (`PIPE_BUF`) is written by the caller when stdin is idle and has room: one system
    /// call, no hand-off to the writer task. Never waits, so a dropped caller can never leave
    /// half a line behind; false when the writer task is gone (stdin closed).
    pub(super) fn send(&self, line: Vec<u8>) -> bool {
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
pub(super) fn last_lines(tail: &Mutex<VecDeque<String>>, n: usize) -> Vec<String> {
    let t = tail.lock().expect("tail");
    t.iter().skip(t.len().saturating_sub(n)).cloned().collect()
}

/// POSIX's bound on atomic pipe writes (Linux: 4096).
pub(super) const PIPE_BUF: usize = 4096;

/// Spawn the child and run the handshake.
pub(super) async fn start(spec: &Spec) -> Result<Arc<Running>, AbxError> {
    let (mut cmd, status_rx, status_tx, copy_dir) = launcher(spec)?;
    let mut child = cmd
        .spawn()
        .map_err(|e| handshake_failed(spec, &format!("cannot start the plugin launcher: {e}")))?;
    drop(status_tx);
    let pid = child.id().unwrap_or(0);
    launch::register(pid as i32, &spec.id);
    let stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let watch = stdout.as_fd().try_clone_to_owned().ok().map(Arc::new);
    let stderr = child.stderr.take().expect("piped");

    let stderr_tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
    log_stderr(spec, stderr, stderr_tail.clone());
    let (writer, stdin) = stdin_writer(stdin);
    let running = Arc::new(Running {
        writer,
        stdin,
        pending: Arc::default(),
        routes: Arc::default(),
        next_id: AtomicI64::new(1),
        pid,
        isolation: String::new(),
        dead: CancellationToken::new(),
        handshake: Handshake {
            name: String::new(),
            version: String::new(),
            features: vec![],
        },
        stderr_tail,
        kill: CancellationToken::new(),
        sweep: Arc::default(),
        pace: Arc::default(),
        watch,
    });
    tokio::spawn(sweep(
        spec.id.clone(),
        running.pending.clone(),
        running.sweep.clone(),
        running.writer.clone(),
        running.dead.clone(),
        SWEEP_LINGER.min(spec.call_timeout),
    ));
    watch_child(spec, &running, stdout, child, copy_dir);
    let limit = handshake_timeout();
    let isolation = launched(spec, &running, status_rx, limit).await?;
    let handshake = handshake(spec, &running, limit).await?;
    debug!(provider = %spec.id, pid, "plugin started");
    // Rebuild with the handshake filled in (the tasks share the inner Arcs).
    let r = running;
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

/// E8002 for `spec`'s plugin, with `detail`.
pub(super) fn handshake_failed(spec: &Spec, detail: &str) -> AbxError {
    AbxError::new(
        ErrorCode::HandshakeFailed,
        &[("provider", &spec.id), ("detail", detail)],
    )
}

/// The launcher's command (not started): the plugin's whole environment and its config on
/// the launcher's environment, its own process group, nothing inherited but stdio and the
/// status pipe (fd 3). Also the status pipe's two ends and the private copy's directory.
pub(super) fn launcher(
    spec: &Spec,
) -> Result<(tokio::process::Command, OwnedFd, OwnedFd, PathBuf), AbxError> {
    let (program, args) = spec
        .command
        .split_first()
        .ok_or_else(|| handshake_failed(spec, "the manifest has an empty runtime command"))?;
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
    let cfg = launch::Config {
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
        namespaces: launch::namespaces_wanted(),
    };
    let cfg_json = serde_json::to_string(&cfg).map_err(AbxError::internal)?;
    let (status_rx, status_tx) =
        launch::status_pipe().map_err(|e| handshake_failed(spec, &format!("status pipe: {e}")))?;
    let mut cmd = tokio::process::Command::new(launch::program());
    cmd.arg0("abx-plugin-launch")
        .arg(launch::ARG)
        .current_dir("/")
        .env_clear()
        .env(launch::CONFIG_ENV, cfg_json)
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
    Ok((cmd, status_rx, status_tx, copy_dir))
}

/// The plugin's stderr, logged redacted and rate-limited; its last lines kept in `tail`.
pub(super) fn log_stderr(
    spec: &Spec,
    stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<VecDeque<String>>>,
) {
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

/// The stdin writer task: whatever a sender cannot write at once itself ([`Running::send`]).
#[allow(clippy::type_complexity)]
pub(super) fn stdin_writer(
    stdin: tokio::process::ChildStdin,
) -> (
    mpsc::UnboundedSender<Vec<u8>>,
    Arc<tokio::sync::Mutex<tokio::process::ChildStdin>>,
) {
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
    (wtx, stdin)
}

/// The child's watcher: the read loop over its stdout, then the child's end (reaped, its
/// process group killed, its private copy removed): every call in flight fails (E8007, or
/// E8009 when it misbehaved) with the tail of its stderr, every stream ends with an
/// `exec/exit`, and `dead` is cancelled.
pub(super) fn watch_child(
    spec: &Spec,
    running: &Running,
    stdout: tokio::process::ChildStdout,
    mut child: tokio::process::Child,
    copy_dir: PathBuf,
) {
    let pid = running.pid;
    let kill = running.kill.clone();
    let id = spec.id.clone();
    let pending = running.pending.clone();
    let routes = running.routes.clone();
    let dead = running.dead.clone();
    let writer = running.writer.clone();
    let tail = running.stderr_tail.clone();
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
        launch::forget(pid as i32);
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

/// The launcher's word (its status line): the private copy matched and the plugin runs
/// (how it is isolated), or why not (E8011 for an integrity failure, E8002 else).
pub(super) async fn launched(
    spec: &Spec,
    running: &Running,
    status_rx: OwnedFd,
    limit: Duration,
) -> Result<String, AbxError> {
    let said = read_status(status_rx, limit).await;
    let isolation = match launch::Status::parse(&said) {
        launch::Status::Started(None) => "namespaces".to_owned(),
        launch::Status::Started(Some(why)) => {
            warn!(provider = %spec.id, "the plugin runs without its own namespaces ({why}): peers descending from it are refused by ancestry, and it sees the broker's directories (Landlock still confines it)");
            format!("none: {why}")
        }
        launch::Status::Integrity(why) => {
            running.kill.cancel();
            warn!(provider = %spec.id, root = %spec.root.display(), "integrity check of the private copy failed, nothing ran: {why}");
            return Err(AbxError::new(
                ErrorCode::IntegrityFailed,
                &[("provider", &spec.id)],
            ));
        }
        launch::Status::Failed(why) => {
            running.kill.cancel();
            return Err(handshake_failed(spec, &why));
        }
    };
    Ok(isolation)
}

/// The `initialize` handshake (within `limit`), then `initialized`. A plugin that fails it
/// is killed.
pub(super) async fn handshake(
    spec: &Spec,
    r: &Running,
    limit: Duration,
) -> Result<Handshake, AbxError> {
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
            return Err(handshake_failed(spec, &e.message));
        }
        Ok(Err(_)) => {
            r.kill.cancel();
            return Err(handshake_failed(
                spec,
                "the plugin exited before answering initialize",
            ));
        }
        Err(_) => {
            r.kill.cancel();
            return Err(handshake_failed(
                spec,
                &format!("no answer to initialize within {} s", limit.as_secs()),
            ));
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
    Ok(handshake)
}

/// Numbers private copies.
pub(super) static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The launcher's status line (empty when it closed the pipe without one, or took longer
/// than `limit`).
pub(super) async fn read_status(fd: std::os::fd::OwnedFd, limit: Duration) -> String {
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
