//! Running commands in a local sandbox: `exec/run` (collect) and `exec/start` (stream).
//!
//! Every exec is its own session and process group, confined by [`super::isolate`], with a
//! clean environment (nothing of the broker's own environment leaks in: it may hold the
//! user's secrets). A timeout or a kill takes the whole tree down (the group and every
//! descendant). Output is passed byte-exact: UTF-8 text as is, anything else base64 with an
//! `encoding` field, never replaced.
//!
//! Streams: one pump task per exec reads stdout and stderr (or the pty) and sends
//! `exec/output` in read order, then exactly one `exec/exit`. Notifications go to the
//! exec's current sink; when that connection is gone the output is kept in a bounded
//! buffer (oldest dropped) until `exec/attach` replays it to a new connection.

use super::{isolate, procs, SandboxDirs};
use abx_core::outbound::{Outbound, Permits, Pool};
use abx_core::signals::{escalation, signal_name, KILL_GRACE};
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::{Notify, OwnedSemaphorePermit};

/// Default cap of each captured stream of `exec/run`.
pub const DEFAULT_MAX_OUTPUT: u64 = 16 * 1024 * 1024;
/// Output kept for a detached stream (oldest dropped beyond).
const DETACHED_BUFFER: usize = 1024 * 1024;
/// Output kept for all detached streams together (oldest of the stream that adds dropped
/// beyond): many detached streams cannot add up.
pub const DETACHED_TOTAL: usize = 16 * 1024 * 1024;
/// Bytes kept by detached streams right now.
static DETACHED_NOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Bytes all detached streams keep right now (for tests and `broker/status`).
pub fn detached_bytes() -> usize {
    DETACHED_NOW.load(std::sync::atomic::Ordering::Relaxed)
}
/// How long to keep reading after the main process exits (background children may hold
/// the pipes open forever).
const DRAIN_GRACE: Duration = Duration::from_millis(250);
const CHUNK: usize = 256 * 1024;
/// The buffer a read waits with (a quiet command holds no more than this).
const PROBE: usize = 4 * 1024;

/// Pipe capacity asked for a command's stdout: fewer, larger reads and notifications when it
/// writes fast (the default 64 KiB pipe wakes the reader for every 64 KiB).
const PIPE_SIZE: libc::c_int = 1024 * 1024;

/// Best effort: `F_SETPIPE_SZ` may be refused above `/proc/sys/fs/pipe-max-size` for users
/// without CAP_SYS_RESOURCE; the default size then stays.
fn grow_pipe(fd: &impl std::os::fd::AsRawFd) {
    // SAFETY: fcntl on a pipe fd we own; no pointers.
    unsafe {
        libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE);
    }
}

/// What spawns a command: `exec/start`'s params (`exec/run`'s convert into them, keeping
/// `maxOutput`).
pub type ExecParams = abx_protocol::api::ExecStartParams;
pub use abx_protocol::api::PtySize;

/// Decode `data` in `encoding` (utf-8 or base64).
pub fn decode_data(data: &str, encoding: Option<&str>) -> Result<Vec<u8>, AbxError> {
    match encoding.unwrap_or("utf-8") {
        "utf-8" | "utf8" | "text" => Ok(data.as_bytes().to_vec()),
        "base64" => abx_protocol::b64::decode(data)
            .map_err(|e| AbxError::detail(ErrorCode::InvalidData, format!("invalid base64: {e}"))),
        other => Err(AbxError::detail(
            ErrorCode::InvalidData,
            format!("unknown encoding '{other}'"),
        )),
    }
}

#[cfg(test)]
fn b64(b: &[u8]) -> String {
    abx_protocol::b64::encode(b)
}

fn base_env(sandbox_env: &BTreeMap<String, String>, pty: bool) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("LANG".into(), "C.UTF-8".into()),
        ("USER".into(), whoami()),
        (
            "TERM".into(),
            if pty { "xterm-256color" } else { "dumb" }.into(),
        ),
    ];
    for (k, v) in sandbox_env {
        env.push((k.clone(), v.clone()));
    }
    env
}

fn whoami() -> String {
    std::env::var("USER").unwrap_or_else(|_| {
        if unsafe { libc::geteuid() } == 0 {
            "root".into()
        } else {
            "user".into()
        }
    })
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;
type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// Where an exec runs: the sandbox's directories, id and create-time environment.
#[derive(Clone)]
pub struct Site<'a> {
    /// Its directories.
    pub dirs: &'a SandboxDirs,
    /// Its id.
    pub id: &'a str,
    /// The env given at create.
    pub env: &'a BTreeMap<String, String>,
    /// The config of the image it was made from (a template): Env and WorkingDir apply.
    pub image: Option<&'a super::templates::ImageConfig>,
    /// Its container (namespaces model).
    pub container: Option<&'a super::container::Container>,
    /// Its cgroup, to tell an OOM kill.
    pub cgroup: Option<Arc<super::limits::Cgroup>>,
    /// `HOME` of its commands (`/workspace`, or `/tmp/home` when a host directory is mounted
    /// on `/workspace`).
    pub home: &'a str,
}

/// The process of an exec: a child of the daemon (Landlock and none models) or a process
/// started by the sandbox's init (namespaces model).
pub enum ExecChild {
    /// A direct child.
    Host(Child),
    /// Started in a sandbox's container.
    Sandboxed(super::container::Proc),
}

impl ExecChild {
    /// Wait for it to end. Cancel-safe.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        match self {
            ExecChild::Host(c) => c.wait().await,
            ExecChild::Sandboxed(p) => Ok(std::process::ExitStatus::from_raw(p.wait().await)),
        }
    }
}

/// A spawned exec: the child, its pipes or pty, and its process group.
pub struct Spawned {
    /// The child.
    pub child: ExecChild,
    /// Its pid in the daemon's PID namespace (= its process group), for signals.
    pub pid: i32,
    /// Its pid as the sandbox sees it (what clients are told).
    pub view_pid: i32,
    /// Stdin (pipe or the pty master).
    pub stdin: Option<Writer>,
    /// Stdout (pipe or the pty master).
    pub stdout: Option<Reader>,
    /// Stderr (none for a pty).
    pub stderr: Option<Reader>,
    /// The pty master, for resizing.
    pub pty: Option<Arc<OwnedFd>>,
}

fn check_timeout(p: &ExecParams) -> Result<(), AbxError> {
    if let Some(t) = p.timeout {
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
    Ok(())
}

/// The program and arguments of an exec: `sh -c command` or the argv.
fn argv_of(p: &ExecParams) -> Result<Vec<String>, AbxError> {
    match (&p.command, &p.argv) {
        (Some(c), None) => Ok(vec!["/bin/sh".into(), "-c".into(), c.clone()]),
        (None, Some(argv)) if !argv.is_empty() => Ok(argv.clone()),
        (Some(_), Some(_)) => Err(AbxError::invalid_params(
            "exec",
            "give either command or argv, not both",
        )),
        _ => Err(AbxError::invalid_params(
            "exec",
            "command (a shell string) or argv (a non-empty list) is required",
        )),
    }
}

/// The environment of an exec: the base, the sandbox's, the exec's (checked).
fn env_of(site: &Site<'_>, p: &ExecParams) -> Result<Vec<(String, String)>, AbxError> {
    let mut env = match site.image {
        // The image's Env goes over the base (its PATH wins), under the sandbox's own.
        Some(img) => {
            let mut e = base_env(&BTreeMap::new(), p.pty.is_some());
            e.extend(img.env.iter().filter_map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            }));
            e.extend(site.env.iter().map(|(k, v)| (k.clone(), v.clone())));
            e
        }
        None => base_env(site.env, p.pty.is_some()),
    };
    if let Some(extra) = &p.env {
        for (k, v) in extra {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(AbxError::invalid_params(
                    "exec",
                    format!("invalid environment variable {k:?}"),
                ));
            }
            env.push((k.clone(), v.clone()));
        }
    }
    Ok(env)
}

fn start_failed(p: &ExecParams, e: std::io::Error) -> AbxError {
    let what = p.argv.as_ref().map_or("sh", |a| a[0].as_str());
    let e = AbxError::detail(ErrorCode::ExecFailedToStart, format!("{what}: {e}"));
    if p.argv.is_some() {
        e.with_suggestion("Check the program name (argv[0] is run without a shell, found on PATH inside the sandbox).")
    } else {
        e
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 into a local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The working directory of an exec in an image sandbox: `/workspace` and `/tmp` paths are
/// checked as on the host template; any other absolute path is the image's (the init's
/// chdir happens inside the sandbox's root; a missing one is E4001).
fn image_cwd(site: &Site<'_>, cwd: Option<&str>) -> Result<String, AbxError> {
    let cwd = cwd.unwrap_or("/workspace");
    if super::split_path(cwd).is_ok() {
        return isolate::check_cwd(site.dirs, site.id, cwd);
    }
    if !cwd.starts_with('/') || cwd.contains('\0') {
        return Err(AbxError::new(
            ErrorCode::PathOutsideSandbox,
            &[("path", cwd)],
        ));
    }
    Ok(cwd.to_owned())
}

/// `KEY=value` entries with each key once, its last value.
fn dedup_env(pairs: Vec<(String, String)>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<String> = pairs
        .into_iter()
        .rev()
        .filter(|(k, _)| seen.insert(k.clone()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    out.reverse();
    out
}

/// Spawn an exec in a sandbox.
pub async fn spawn(site: Site<'_>, p: &ExecParams, want_stdin: bool) -> Result<Spawned, AbxError> {
    match site.container {
        Some(c) => spawn_in(c, site.clone(), p, want_stdin).await,
        None => spawn_host(site, p, want_stdin),
    }
}

/// Spawn through the sandbox's init (namespaces model).
async fn spawn_in(
    c: &super::container::Container,
    site: Site<'_>,
    p: &ExecParams,
    want_stdin: bool,
) -> Result<Spawned, AbxError> {
    let argv = argv_of(p)?;
    check_timeout(p)?;
    let cwd = match site.image {
        Some(img) => image_cwd(&site, p.cwd.as_deref().or(img.working_dir.as_deref()))?,
        None => isolate::check_cwd(site.dirs, site.id, p.cwd.as_deref().unwrap_or("/workspace"))?,
    };
    let mut pairs = env_of(&site, p)?;
    pairs.push((procs::MARKER.to_owned(), site.id.to_owned()));
    pairs.push(("HOME".into(), site.home.to_owned()));
    pairs.push(("TMPDIR".into(), "/tmp".into()));
    pairs.push(("PWD".into(), cwd.clone()));
    let env = if site.image.is_some() {
        // Later entries win (the image's Env sets what the base set before).
        dedup_env(pairs)
    } else {
        pairs.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
    };
    let io = |e: std::io::Error| AbxError::internal(format!("exec pipes: {e}"));
    let pty = p.pty.map(|s| (s.rows, s.cols));
    let mut ours: (Option<OwnedFd>, Option<OwnedFd>, Option<OwnedFd>) = (None, None, None);
    let mut theirs: Vec<OwnedFd> = Vec::new();
    if pty.is_none() {
        let stdin = if want_stdin {
            let (r, w) = pipe().map_err(io)?;
            ours.0 = Some(w);
            r
        } else {
            OwnedFd::from(std::fs::File::open("/dev/null").map_err(io)?)
        };
        let (or, ow) = pipe().map_err(io)?;
        let (er, ew) = pipe().map_err(io)?;
        grow_pipe(&or);
        ours.1 = Some(or);
        ours.2 = Some(er);
        theirs = vec![stdin, ow, ew];
    }
    let raw: Vec<std::os::fd::RawFd> = theirs.iter().map(|f| f.as_raw_fd()).collect();
    let proc_ = match c.spawn(argv, env, cwd.clone(), pty, &raw).await? {
        Ok(p) => p,
        Err((errno, what)) => {
            let e = std::io::Error::from_raw_os_error(errno);
            return Err(match what.as_str() {
                "chdir" => AbxError::new(
                    ErrorCode::FileNotFound,
                    &[("path", &cwd), ("sandbox", site.id)],
                ),
                "exec" => start_failed(p, e),
                other => AbxError::detail(
                    ErrorCode::ExecFailedToStart,
                    format!("starting the process failed ({other}): {e}"),
                ),
            });
        }
    };
    drop(theirs);
    let (pid, view_pid) = (proc_.host_pid, proc_.pid);
    // Running from here: an error below must not leave it behind unowned.
    let mut started = TreeGuard(pid, true);
    let mut proc_ = proc_;
    type Ends = (
        Option<Writer>,
        Option<Reader>,
        Option<Reader>,
        Option<Arc<OwnedFd>>,
    );
    let (stdin, stdout, stderr, pty): Ends = match proc_.master.take() {
        Some(m) => {
            let (w, r, m) = pty_ends(m)?;
            (Some(w), Some(r), None, Some(m))
        }
        None => {
            use tokio::net::unix::pipe as tp;
            let w = match ours.0 {
                Some(w) => Some(Box::new(tp::Sender::from_owned_fd(w).map_err(io)?) as Writer),
                None => None,
            };
            let o = tp::Receiver::from_owned_fd(ours.1.expect("stdout")).map_err(io)?;
            let e = tp::Receiver::from_owned_fd(ours.2.expect("stderr")).map_err(io)?;
            (
                w,
                Some(Box::new(o) as Reader),
                Some(Box::new(e) as Reader),
                None,
            )
        }
    };
    started.1 = false;
    Ok(Spawned {
        child: ExecChild::Sandboxed(proc_),
        pid,
        view_pid,
        stdin,
        stdout,
        stderr,
        pty,
    })
}

/// Spawn as a child of the daemon (Landlock and none models).
fn spawn_host(site: Site<'_>, p: &ExecParams, want_stdin: bool) -> Result<Spawned, AbxError> {
    let (dirs, sandbox_id) = (site.dirs, site.id);
    let argv = argv_of(p)?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    check_timeout(p)?;
    cmd.env_clear();
    for (k, v) in env_of(&site, p)? {
        cmd.env(k, v);
    }
    cmd.kill_on_drop(false);
    let mut master: Option<OwnedFd> = None;
    if let Some(size) = p.pty {
        let (m, s) = open_pty(size).map_err(|e| {
            AbxError::detail(
                ErrorCode::ExecFailedToStart,
                format!("cannot open a pty: {e}"),
            )
        })?;
        let dup = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
        cmd.stdin(dup(&s).map_err(AbxError::internal)?)
            .stdout(dup(&s).map_err(AbxError::internal)?)
            .stderr(Stdio::from(s));
        // SAFETY: async-signal-safe calls only.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        master = Some(m);
    } else {
        cmd.stdin(if want_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        // SAFETY: async-signal-safe calls only.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let confine =
        isolate::Confine::new(dirs, sandbox_id, p.cwd.as_deref().unwrap_or("/workspace"))?;
    confine.apply(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| {
        if isolate::is_setup_error(&e) {
            return AbxError::detail(
                ErrorCode::ExecFailedToStart,
                isolate::explain_spawn_error(&e),
            )
            .with_suggestion("The sandbox could not be set up; see the broker log.");
        }
        start_failed(p, e)
    })?;
    let pid = child.id().map_or(0, |p| p as i32);
    type Ends = (
        Option<Writer>,
        Option<Reader>,
        Option<Reader>,
        Option<Arc<OwnedFd>>,
    );
    let (stdin, stdout, stderr, pty): Ends = match master {
        Some(m) => {
            let (w, r, m) = pty_ends(m)?;
            (Some(w), Some(r), None, Some(m))
        }
        None => (
            child.stdin.take().map(|s| Box::new(s) as _),
            child.stdout.take().map(|s| {
                grow_pipe(&s);
                Box::new(s) as _
            }),
            child.stderr.take().map(|s| Box::new(s) as _),
            None,
        ),
    };
    Ok(Spawned {
        child: ExecChild::Host(child),
        pid,
        view_pid: pid,
        stdin,
        stdout,
        stderr,
        pty,
    })
}

/// A pty master as the exec's stdin writer and output reader (and the master, to resize).
fn pty_ends(m: OwnedFd) -> Result<(Writer, Reader, Arc<OwnedFd>), AbxError> {
    let m = Arc::new(m);
    let file = |m: &OwnedFd| -> Result<tokio::fs::File, AbxError> {
        Ok(tokio::fs::File::from_std(std::fs::File::from(
            m.try_clone().map_err(AbxError::internal)?,
        )))
    };
    Ok((Box::new(file(&m)?), Box::new(file(&m)?), m))
}

fn open_pty(size: PtySize) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut m = 0;
    let mut s = 0;
    let ws = libc::winsize {
        ws_row: size.rows.max(1),
        ws_col: size.cols.max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    if unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openpty returned two fresh fds we now own.
    let (m, s) = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
    for fd in [m.as_raw_fd(), s.as_raw_fd()] {
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok((m, s))
}

/// Set a pty's size.
pub fn resize(master: &OwnedFd, size: PtySize) -> std::io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows.max(1),
        ws_col: size.cols.max(1),
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Kills the exec's whole tree when dropped, unless disarmed (cancellation, errors).
pub struct TreeGuard(pub i32, pub bool);

impl Drop for TreeGuard {
    fn drop(&mut self) {
        if self.1 && self.0 > 0 {
            procs::kill_tree(self.0, libc::SIGKILL);
        }
    }
}

/// Pool bytes charged per kept byte of `exec/run` output: the byte itself and its share of
/// the reply (base64, 4/3), so the reply is built within what was counted.
fn run_cost(n: usize) -> usize {
    n + abx_protocol::b64::encoded_len(n)
}

/// One captured stream of an `exec/run`.
#[derive(Default)]
struct Collected {
    out: Vec<u8>,
    /// Output was dropped: past `maxOutput`, or past what the broker-wide pool could hold.
    truncated: bool,
    /// The pool was short (some output was dropped for it).
    pool_short: bool,
    /// Pool bytes counting `out` and its share of the reply.
    held: Option<OwnedSemaphorePermit>,
}

impl Collected {
    fn merge_held(&mut self, p: OwnedSemaphorePermit) {
        match &mut self.held {
            Some(h) => h.merge(p),
            None => self.held = Some(p),
        }
    }

    /// Keep `data` (within `cap` and the pool), or drop it and say so.
    fn keep(&mut self, data: &[u8], cap: u64, pool: &Pool) {
        let room = cap.saturating_sub(self.out.len() as u64) as usize;
        let n = data.len().min(room);
        if n < data.len() {
            self.truncated = true;
        }
        if n == 0 || self.pool_short {
            self.truncated |= n > 0;
            return;
        }
        match pool.try_take(run_cost(n)) {
            Some(p) => {
                self.merge_held(p);
                self.out.reserve_exact(n);
                self.out.extend_from_slice(&data[..n]);
            }
            None => {
                self.pool_short = true;
                self.truncated = true;
            }
        }
    }
}

/// Read a stream to the end (or until told to stop), keeping at most `cap` bytes, each
/// counted in the broker-wide pool as it arrives. A read waits with a small buffer (a
/// quiet command holds no large one); what else is ready then is read straight into the
/// output, after its bytes were counted. When the pool is short the rest is read and
/// dropped (`truncated`): never waiting for memory while holding some, so concurrent
/// commands cannot deadlock each other.
async fn collect<R: AsyncRead + Unpin>(
    mut r: R,
    cap: u64,
    stop: Arc<Notify>,
    pool: Pool,
) -> Collected {
    let mut c = Collected::default();
    let mut probe = vec![0u8; PROBE];
    let mut stopping = false;
    loop {
        let n = if stopping {
            // Take what is already in the pipe (a slow reader under load must not lose
            // output the command wrote before it exited), then stop.
            match futures::FutureExt::now_or_never(r.read(&mut probe)) {
                Some(Ok(n)) => n,
                _ => 0,
            }
        } else {
            tokio::select! {
                biased;
                n = r.read(&mut probe) => n.unwrap_or(0),
                _ = stop.notified() => {
                    stopping = true;
                    continue;
                }
            }
        };
        if n == 0 {
            break;
        }
        c.keep(&probe[..n], cap, &pool);
        // More ready: straight into the output once counted (no copy, no big buffer).
        let mut eof = false;
        loop {
            let room = cap.saturating_sub(c.out.len() as u64) as usize;
            if room == 0 || c.pool_short {
                break;
            }
            let want = room.min(CHUNK);
            let Some(grant) = pool.try_take(run_cost(want)) else {
                c.pool_short = true;
                break;
            };
            c.out.reserve_exact(want);
            let before = c.out.len();
            let got = {
                use bytes::BufMut;
                let mut lim = (&mut c.out).limit(want);
                futures::FutureExt::now_or_never(r.read_buf(&mut lim))
            };
            let m = c.out.len() - before;
            let mut grant = grant;
            let keep = run_cost(m);
            if keep == 0 {
                drop(grant);
            } else {
                if grant.num_permits() > keep {
                    drop(grant.split(grant.num_permits() - keep));
                }
                c.merge_held(grant);
            }
            match got {
                Some(Ok(0)) | Some(Err(_)) => {
                    eof = true;
                    break;
                }
                Some(Ok(_)) => {}
                None => break,
            }
        }
        if eof {
            break;
        }
    }
    c
}

/// What `exec/run` answers, serialized straight from the collected output (no copies):
/// text when both streams are UTF-8 and their escaped form fits in what was counted (or
/// the pool has the difference now), base64 otherwise (`encoding: base64`).
struct RunReply<'a> {
    fields: &'a serde_json::Map<String, Value>,
    stdout: &'a [u8],
    stderr: &'a [u8],
    base64: bool,
}

/// Bytes as a JSON string: as is (already checked UTF-8) or base64.
struct Data<'a>(&'a [u8], bool);

impl serde::Serialize for Data<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.1 {
            s.collect_str(&B64Display(self.0))
        } else {
            s.serialize_str(std::str::from_utf8(self.0).map_err(serde::ser::Error::custom)?)
        }
    }
}

/// Base64 written in pieces (never the whole encoded string at once).
struct B64Display<'a>(&'a [u8]);

impl std::fmt::Display for B64Display<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut buf = Vec::with_capacity(4 * 1024);
        for piece in self.0.chunks(3 * 1024) {
            buf.clear();
            abx_protocol::b64::encode_append(piece, &mut buf);
            // SAFETY: base64 is ASCII.
            f.write_str(unsafe { std::str::from_utf8_unchecked(&buf) })?;
        }
        Ok(())
    }
}

impl serde::Serialize for RunReply<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        for (k, v) in self.fields {
            m.serialize_entry(k, v)?;
        }
        if self.base64 {
            m.serialize_entry("encoding", "base64")?;
        }
        m.serialize_entry("stderr", &Data(self.stderr, self.base64))?;
        m.serialize_entry("stdout", &Data(self.stdout, self.base64))?;
        m.end()
    }
}

/// Bytes of `b` escaped as a JSON string (without the quotes).
fn escaped_len(b: &[u8]) -> usize {
    b.len()
        + b.iter()
            .map(|&x| ESCAPE_EXTRA[x as usize] as usize)
            .sum::<usize>()
}

/// `exec/run`: run to completion and collect the output. The output is counted in the
/// broker-wide pool as it arrives; the pool bytes that count the reply are deposited in
/// `hold`, so the reply is queued against them.
pub async fn run(
    site: Site<'_>,
    p: ExecParams,
    pool: Pool,
    hold: &abx_core::outbound::Hold,
) -> Result<Box<serde_json::value::RawValue>, AbxError> {
    // The output is held until the command ends: bounded (E1004 above 16 MiB per stream).
    abx_protocol::limits::check_max_output(p.max_output)?;
    let stdin_data = match &p.stdin {
        Some(s) => Some(decode_data(s, p.stdin_encoding.as_deref())?),
        None => None,
    };
    if p.pty.is_some() {
        return Err(AbxError::invalid_params(
            "exec/run",
            "pty is for exec/start",
        ));
    }
    let started = Instant::now();
    let oom0 = site.cgroup.as_ref().map(|c| c.oom_kills());
    let mut sp = spawn(site.clone(), &p, stdin_data.is_some()).await?;
    let mut guard = TreeGuard(sp.pid, true);
    let cap = p.max_output.unwrap_or(DEFAULT_MAX_OUTPUT);
    if let (Some(mut w), Some(data)) = (sp.stdin.take(), stdin_data) {
        tokio::spawn(async move {
            let _ = w.write_all(&data).await;
            let _ = w.shutdown().await;
        });
    }
    let stop = Arc::new(Notify::new());
    let out_task = tokio::spawn(collect(
        sp.stdout.take().expect("piped"),
        cap,
        stop.clone(),
        pool.clone(),
    ));
    let err_task = tokio::spawn(collect(
        sp.stderr.take().expect("piped"),
        cap,
        stop.clone(),
        pool.clone(),
    ));
    let timeout = p.timeout.map(Duration::from_secs_f64);
    let waited = match timeout {
        Some(t) => tokio::time::timeout(t, sp.child.wait()).await.ok(),
        None => Some(sp.child.wait().await),
    };
    let (status, timed_out) = match waited {
        Some(s) => (s.ok(), false),
        None => {
            procs::kill_tree(sp.pid, libc::SIGKILL);
            (sp.child.wait().await.ok(), true)
        }
    };
    // Let the pipes drain; background children may keep them open.
    let drain = async {
        let (o, e) = tokio::join!(out_task, err_task);
        (o.unwrap_or_default(), e.unwrap_or_default())
    };
    tokio::pin!(drain);
    let (mut out, err) = match tokio::time::timeout(DRAIN_GRACE, &mut drain).await {
        Ok(r) => r,
        Err(_) => {
            stop.notify_waiters();
            drain.await
        }
    };
    guard.1 = timed_out; // the tree is already dead on timeout; otherwise leave background jobs
    drop(guard);
    let (code, signal) = exit_info(status);
    let mut v = json!({
        "exitCode": code,
        "timedOut": timed_out,
        "durationMs": started.elapsed().as_millis() as u64,
        "truncated": out.truncated || err.truncated,
    });
    if out.pool_short || err.pool_short {
        tracing::warn!(
            sandbox = site.id,
            "exec/run: output dropped, the broker-wide memory budget is in use"
        );
        v["memoryLimited"] = json!(true);
    }
    if let Some(s) = signal {
        if s == "SIGKILL" && oom_struck(site.cgroup.as_deref(), oom0) {
            v["oomKilled"] = json!(true);
        }
        v["signal"] = json!(s);
    }
    if let Some(h) = err.held {
        out.merge_held(h);
    }
    // Text when both are UTF-8 and their escaped form fits in what was counted (the
    // base64 share), or the pool has the difference now; base64 otherwise.
    let counted = abx_protocol::b64::encoded_len(out.out.len())
        + abx_protocol::b64::encoded_len(err.out.len());
    let mut base64 =
        std::str::from_utf8(&out.out).is_err() || std::str::from_utf8(&err.out).is_err();
    if !base64 {
        let text = escaped_len(&out.out) + escaped_len(&err.out);
        if text > counted {
            match pool.try_take(text - counted) {
                Some(more) => out.merge_held(more),
                None => base64 = true,
            }
        }
    }
    let reply = {
        let fields = v.as_object().expect("an object");
        serde_json::value::to_raw_value(&RunReply {
            fields,
            stdout: &out.out,
            stderr: &err.out,
            base64,
        })
        .map_err(AbxError::internal)?
    };
    // The output is in the reply now: its own share of the pool goes back (the reply's
    // share stays held until the reply is written).
    drop((std::mem::take(&mut out.out), err.out));
    if let Some(mut h) = out.held.take() {
        let keep = reply.get().len() + 1024;
        if h.num_permits() > keep {
            drop(h.split(h.num_permits() - keep));
        }
        *hold.lock().expect("hold") = Some(h);
    }
    Ok(reply)
}

fn exit_info(status: Option<std::process::ExitStatus>) -> (Value, Option<String>) {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => (json!(c), None),
            (None, Some(sig)) => (json!(128 + sig), Some(signal_name(sig))),
            _ => (Value::Null, None),
        },
        None => (Value::Null, None),
    }
}

/// Whether the OOM killer struck in the sandbox since `before` was read (its memory limit).
fn oom_struck(cg: Option<&super::limits::Cgroup>, before: Option<u64>) -> bool {
    match (cg, before) {
        (Some(c), Some(b)) => c.oom_kills() > b,
        _ => false,
    }
}

/// Where a stream's notifications go: a connection, or a bounded buffer while detached.
struct Sink {
    conn: Option<Outbound>,
    /// Notifications no one received yet, with their sequence numbers (in order).
    buffer: VecDeque<(u64, Vec<u8>)>,
    buffered: usize,
    dropped: u64,
    /// Sequence number of the next notification.
    next: u64,
    /// Sequence number of the `exec/exit`, once sent.
    exit: Option<u64>,
}

impl Sink {
    /// Keep `body` (number `seq`) for a later attach, in order, within the bounds: this
    /// stream's ([`DETACHED_BUFFER`]) and all detached streams' ([`DETACHED_TOTAL`]). The
    /// oldest output of this stream goes first; its `exec/exit` is always kept.
    fn keep(&mut self, seq: u64, body: Vec<u8>) {
        use std::sync::atomic::Ordering::Relaxed;
        self.buffered += body.len();
        DETACHED_NOW.fetch_add(body.len(), Relaxed);
        let at = self.buffer.partition_point(|(n, _)| *n < seq);
        self.buffer.insert(at, (seq, body));
        while self.buffered > DETACHED_BUFFER || DETACHED_NOW.load(Relaxed) > DETACHED_TOTAL {
            let exit = self.exit;
            let Some(i) = self.buffer.iter().position(|(n, _)| Some(*n) != exit) else {
                break;
            };
            let (_, old) = self.buffer.remove(i).expect("in range");
            self.forget(old.len());
            self.dropped += old.len() as u64;
        }
    }

    fn forget(&mut self, n: usize) {
        self.buffered -= n;
        DETACHED_NOW.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Everything kept, in order, no longer counted.
    fn take_all(&mut self) -> Vec<Vec<u8>> {
        let n = self.buffered;
        self.forget(n);
        self.buffer.drain(..).map(|(_, b)| b).collect()
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let n = self.buffered;
        self.forget(n);
    }
}

/// Room for one output frame (see [`Stream::slot`]).
enum Slot {
    /// Of connection `id`'s budget (and the pool).
    Conn(u64, Permits),
    /// Of the pool (detached).
    Pool { _held: OwnedSemaphorePermit },
}

/// One running (or finished, exit not yet delivered) `exec/start`.
pub struct Stream {
    /// `e-…` id.
    pub id: String,
    /// The sandbox it runs in.
    pub sandbox: String,
    /// Its process group (a pid of the daemon's PID namespace).
    pub pid: i32,
    /// Its pid as the sandbox sees it.
    pub view_pid: i32,
    sink: Mutex<Sink>,
    stdin: tokio::sync::Mutex<Option<Writer>>,
    pty: Option<Arc<OwnedFd>>,
    attached: Notify,
    /// Set once the exit notification has been delivered.
    pub done: std::sync::atomic::AtomicBool,
    /// Becomes true when its process has ended.
    ended: tokio::sync::watch::Sender<bool>,
    /// The broker-wide pool its chunks are counted in while they are built.
    pool: Pool,
}

impl Stream {
    /// The connection id this stream reports to.
    pub fn owner(&self) -> Option<u64> {
        self.sink.lock().expect("sink").conn.as_ref().map(|c| c.id)
    }

    /// Write to stdin; `eof` closes it.
    pub async fn write(&self, data: &[u8], eof: bool) -> Result<(), AbxError> {
        let mut g = self.stdin.lock().await;
        let Some(w) = g.as_mut() else {
            return Err(AbxError::new(
                ErrorCode::ExecStdinClosed,
                &[("exec", &self.id)],
            ));
        };
        if !data.is_empty() && w.write_all(data).await.is_err() {
            *g = None;
            return Err(AbxError::new(
                ErrorCode::ExecStdinClosed,
                &[("exec", &self.id)],
            ));
        }
        let _ = w.flush().await;
        if eof {
            if self.pty.is_some() {
                // A pty has no half-close: send the terminal's EOF character.
                let _ = w.write_all(&[4]).await;
                let _ = w.flush().await;
            } else {
                let _ = w.shutdown().await;
                *g = None;
            }
        }
        Ok(())
    }

    /// Resize its pty.
    pub fn resize(&self, size: PtySize) -> Result<(), AbxError> {
        match &self.pty {
            Some(m) => resize(m, size).map_err(AbxError::internal),
            None => Err(AbxError::invalid_params(
                "exec/resize",
                format!("exec '{}' has no pty", self.id),
            )),
        }
    }

    /// True once its `exec/exit` went out to a client (queued or written; not kept for an
    /// attach): the exec is gone for every method from then on, as its exit says.
    pub fn exit_out(&self) -> bool {
        let s = self.sink.lock().expect("sink");
        s.exit
            .is_some_and(|e| !s.buffer.iter().any(|(n, _)| *n == e))
    }

    /// Send notifications to `conn` from now on, replaying what was buffered.
    pub async fn attach(&self, conn: Outbound) -> Value {
        let (buffered, dropped, exit_replayed) = {
            let mut s = self.sink.lock().expect("sink");
            s.conn = Some(conn.clone());
            let exit = s.exit;
            let exit_replayed = s.buffer.iter().any(|(n, _)| Some(*n) == exit);
            let b = s.take_all();
            (b, std::mem::take(&mut s.dropped), exit_replayed)
        };
        let replayed = buffered.len();
        for body in buffered {
            conn.send(body).await;
        }
        self.attached.notify_waiters();
        // Not running: its exit was delivered before, or is among what was just replayed
        // (clients take `running: false` without an exit as an exit lost on the way).
        let running = !(exit_replayed || self.done.load(std::sync::atomic::Ordering::Relaxed));
        json!({"execId": self.id, "running": running, "replayed": replayed, "droppedBytes": dropped})
    }

    /// Send a notification to the attached connection, or keep it for a later attach. One
    /// that was queued but never reached the client (it died before the write) comes back
    /// and is kept too, in order. `delivered`, given for the `exec/exit`, hears whether it
    /// reached the client.
    async fn emit_tracked(
        self: &Arc<Self>,
        body: Vec<u8>,
        delivered: Option<tokio::sync::oneshot::Sender<bool>>,
        slot: Option<Slot>,
    ) {
        let (conn, seq) = {
            let mut s = self.sink.lock().expect("sink");
            s.next += 1;
            if delivered.is_some() {
                s.exit = Some(s.next - 1);
            }
            (s.conn.clone(), s.next - 1)
        };
        let body = match conn {
            Some(c) => {
                let weak = Arc::downgrade(self);
                let conn_id = c.id;
                let report: abx_core::outbound::Delivery = Box::new(move |r| {
                    let ok = r.is_ok();
                    if let (Err(body), Some(me)) = (r, weak.upgrade()) {
                        me.undelivered(conn_id, seq, body);
                    }
                    if let Some(d) = delivered {
                        let _ = d.send(ok);
                    }
                });
                let permits = match slot {
                    Some(Slot::Conn(id, p)) if id == conn_id => Some(p),
                    _ => None,
                };
                match c.send_tracked(body, report, permits).await {
                    Ok(()) => return,
                    Err(body) => body,
                }
            }
            None => body,
        };
        let mut s = self.sink.lock().expect("sink");
        s.conn = None;
        s.keep(seq, body);
    }

    async fn emit(self: &Arc<Self>, body: Vec<u8>, slot: Option<Slot>) {
        self.emit_tracked(body, None, slot).await
    }

    /// Room for one output frame of at most `bytes` (and the chunk it is built from), before
    /// it is read: of the attached
    /// connection's budget and the pool, or of the pool alone while detached. A stream whose
    /// client does not read waits here, holding no buffer. `None`: the connection closed
    /// while waiting (detached now; ask again).
    async fn slot(&self, bytes: usize) -> Option<Slot> {
        let conn = self.sink.lock().expect("sink").conn.clone();
        match conn {
            Some(c) if !c.is_closed() => c
                .reserve_with(bytes, CHUNK)
                .await
                .map(|p| Slot::Conn(c.id, p)),
            Some(_) => {
                self.sink.lock().expect("sink").conn = None;
                None
            }
            None => Some(Slot::Pool {
                _held: self.pool.take(bytes + CHUNK).await,
            }),
        }
    }

    /// A notification connection `conn_id` did not receive: that connection is gone, so
    /// the stream detaches from it and keeps the body for the next attach (or, when
    /// another connection attached meanwhile, sends it there).
    fn undelivered(&self, conn_id: u64, seq: u64, body: Vec<u8>) {
        let mut s = self.sink.lock().expect("sink");
        match &s.conn {
            Some(c) if c.id != conn_id && !c.is_closed() => {
                let c = c.clone();
                drop(s);
                tokio::spawn(async move {
                    c.send(body).await;
                });
            }
            _ => {
                s.conn = None;
                s.keep(seq, body);
            }
        }
    }
}

/// Escalate a signal the command may ignore (`sh` swallows INT between commands): INT
/// becomes TERM, then KILL; TERM, HUP and QUIT become KILL; each after [`KILL_GRACE`] if the
/// command's process is still running. Other signals never escalate.
pub fn escalate(s: Arc<Stream>, sig: i32) {
    let next = escalation(sig);
    if next.is_empty() {
        return;
    }
    let mut ended = s.ended.subscribe();
    if *ended.borrow() {
        return;
    }
    tokio::spawn(async move {
        for &sig in next {
            if tokio::time::timeout(KILL_GRACE, ended.wait_for(|e| *e))
                .await
                .is_ok()
            {
                return;
            }
            tracing::debug!(exec = %s.id, signal = %signal_name(sig), "exec/kill: escalating");
            procs::kill_tree(s.pid, sig);
        }
    });
}

/// `exec/start`: spawn and stream. Returns the stream entry; the pump runs on its own.
pub async fn start(
    site: Site<'_>,
    p: ExecParams,
    id: String,
    conn: Outbound,
    replied: tokio_util::sync::CancellationToken,
    on_done: impl FnOnce(&str) + Send + 'static,
) -> Result<Arc<Stream>, AbxError> {
    let initial_stdin = match &p.stdin {
        Some(s) => Some(decode_data(s, p.stdin_encoding.as_deref())?),
        None => None,
    };
    let mut sp = spawn(site.clone(), &p, true).await?;
    let stream = Arc::new(Stream {
        id: id.clone(),
        sandbox: site.id.to_owned(),
        pid: sp.pid,
        view_pid: sp.view_pid,
        sink: Mutex::new(Sink {
            conn: Some(conn.clone()),
            buffer: VecDeque::new(),
            buffered: 0,
            dropped: 0,
            next: 0,
            exit: None,
        }),
        stdin: tokio::sync::Mutex::new(sp.stdin.take()),
        pty: sp.pty.clone(),
        attached: Notify::new(),
        done: std::sync::atomic::AtomicBool::new(false),
        ended: tokio::sync::watch::Sender::new(false),
        pool: conn.pool().clone(),
    });
    if let Some(data) = initial_stdin {
        let s = stream.clone();
        tokio::spawn(async move {
            let _ = s.write(&data, true).await;
        });
    }
    let timeout = p.timeout.map(Duration::from_secs_f64);
    let s = stream.clone();
    let cg = site.cgroup.clone();
    let oom0 = cg.as_ref().map(|c| c.oom_kills());
    tokio::spawn(async move {
        // The client must see exec/start's reply (the execId) before any output.
        let _ = tokio::time::timeout(Duration::from_secs(10), replied.cancelled()).await;
        pump(s, sp, timeout, cg, oom0).await;
        on_done(&id);
    });
    Ok(stream)
}

async fn pump(
    s: Arc<Stream>,
    mut sp: Spawned,
    timeout: Option<Duration>,
    cg: Option<Arc<super::limits::Cgroup>>,
    oom0: Option<u64>,
) {
    let pid = sp.pid;
    let mut out = sp.stdout.take();
    let mut err = sp.stderr.take();
    let (mut carry_o, mut carry_e) = (Vec::new(), Vec::new());
    // Reads wait with small buffers; a chunk's buffer exists only once room for its frame
    // was had (see `send_read`).
    let mut buf_o = vec![0u8; PROBE];
    let mut buf_e = vec![0u8; PROBE];
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut timed_out = false;
    let mut status = None;
    let mut exited_at: Option<tokio::time::Instant> = None;
    // Bytes read: freed once sent or dropped, told to the allocator at the end.
    let mut produced = 0usize;
    let stream_name = if s.pty.is_some() { "pty" } else { "stdout" };
    loop {
        if out.is_none() && err.is_none() && status.is_some() {
            break;
        }
        if let Some(t) = exited_at {
            if t.elapsed() > DRAIN_GRACE {
                break;
            }
        }
        let sleep_until = match (deadline, exited_at) {
            (_, Some(t)) => t + DRAIN_GRACE,
            (Some(d), None) if !timed_out => d,
            _ => tokio::time::Instant::now() + Duration::from_secs(3600),
        };
        tokio::select! {
            r = read_opt(&mut out, &mut buf_o) => match r {
                Some(n) if n > 0 => {
                    // Output still flowing after the exit: the grace starts again.
                    if exited_at.is_some() {
                        exited_at = Some(tokio::time::Instant::now());
                    }
                    let t = (deadline, pid, &mut timed_out);
                    produced += send_read(&s, stream_name, &mut carry_o, &buf_o[..n], &mut out, t).await;
                }
                _ => out = None,
            },
            r = read_opt(&mut err, &mut buf_e) => match r {
                Some(n) if n > 0 => {
                    if exited_at.is_some() {
                        exited_at = Some(tokio::time::Instant::now());
                    }
                    let t = (deadline, pid, &mut timed_out);
                    produced += send_read(&s, "stderr", &mut carry_e, &buf_e[..n], &mut err, t).await;
                }
                _ => err = None,
            },
            st = sp.child.wait(), if status.is_none() => {
                status = Some(st.ok());
                exited_at = Some(tokio::time::Instant::now());
                s.ended.send_replace(true);
            },
            _ = tokio::time::sleep_until(sleep_until) => {
                if exited_at.is_none() && !timed_out {
                    timed_out = true;
                    procs::kill_tree(pid, libc::SIGKILL);
                }
            }
        }
    }
    for (name, carry) in [(stream_name, carry_o), ("stderr", carry_e)] {
        if !carry.is_empty() {
            send_raw(&s, name, &carry).await;
        }
    }
    // The read buffers are not kept while the exit waits for an attach.
    drop((buf_o, buf_e, out, err));
    abx_core::outbound::note_released(produced, true);
    let status = match status {
        Some(st) => st,
        None => sp.child.wait().await.ok(),
    };
    s.ended.send_replace(true);
    let (code, signal) = exit_info(status);
    let mut exit = json!({"execId": s.id, "exitCode": code, "timedOut": timed_out});
    if let Some(sig) = signal {
        if sig == "SIGKILL" && oom_struck(cg.as_deref(), oom0) {
            exit["oomKilled"] = json!(true);
        }
        exit["signal"] = json!(sig);
    }
    // Listening for an attach before the exit goes out, so none is missed.
    let attached = s.attached.notified();
    tokio::pin!(attached);
    attached.as_mut().enable();
    let (tx, rx) = tokio::sync::oneshot::channel();
    s.emit_tracked(
        abx_protocol::message::encode_notification("exec/exit", Some(&exit)),
        Some(tx),
        None,
    )
    .await;
    // Delivered means written to the client: a client that died is found out by the write,
    // and its undelivered exit stays with the stream.
    let delivered = rx.await.unwrap_or(false);
    // A detached stream keeps its exit for a later attach; wait for one (bounded).
    let pending = !s.sink.lock().expect("sink").buffer.is_empty();
    if !delivered && pending {
        let _ = tokio::time::timeout(Duration::from_secs(600), attached).await;
    }
    s.done.store(true, std::sync::atomic::Ordering::Relaxed);
}

async fn read_opt(r: &mut Option<Reader>, buf: &mut [u8]) -> Option<usize> {
    match r {
        Some(r) => r.read(buf).await.ok(),
        None => std::future::pending().await,
    }
}

/// The largest `exec/output` frame of one chunk (base64 of [`CHUNK`] bytes and the rest).
fn frame_max(exec_id: &str) -> usize {
    abx_protocol::b64::encoded_len(CHUNK) + 256 + exec_id.len()
}

/// Send what a read brought (after what was carried from the last one) and whatever else
/// is ready, up to [`CHUNK`], as one frame: room for the frame is had first (the
/// connection's budget and the pool; the pool alone while detached), so a stream whose
/// client does not read waits holding a few KiB, never a chunk. A character cut at the end
/// stays in `carry` for the next frame. The timeout still kills the command while it waits.
async fn send_read(
    s: &Arc<Stream>,
    stream: &str,
    carry: &mut Vec<u8>,
    first: &[u8],
    r: &mut Option<Reader>,
    (deadline, pid, timed_out): (Option<tokio::time::Instant>, i32, &mut bool),
) -> usize {
    let max = frame_max(&s.id);
    let slot = loop {
        let wait = match deadline {
            Some(d) if !*timed_out => d,
            _ => tokio::time::Instant::now() + Duration::from_secs(3600),
        };
        tokio::select! {
            sl = s.slot(max) => if let Some(sl) = sl { break sl },
            _ = tokio::time::sleep_until(wait) => {
                if deadline.is_some() && !*timed_out {
                    *timed_out = true;
                    procs::kill_tree(pid, libc::SIGKILL);
                }
            }
        }
    };
    let mut buf = Vec::with_capacity(CHUNK.max(carry.len() + first.len()));
    buf.append(carry);
    buf.extend_from_slice(first);
    if let Some(rd) = r.as_mut() {
        while buf.len() < CHUNK {
            let want = CHUNK - buf.len();
            let got = {
                use bytes::BufMut;
                let mut lim = (&mut buf).limit(want);
                futures::FutureExt::now_or_never(rd.read_buf(&mut lim))
            };
            match got {
                Some(Ok(0)) | Some(Err(_)) => {
                    *r = None;
                    break;
                }
                Some(Ok(_)) => {}
                None => break,
            }
        }
    }
    let (p, used) = payload(&buf, true);
    if used > 0 {
        s.emit(frame(&s.id, stream, p), Some(slot)).await;
    }
    carry.extend_from_slice(&buf[used..]);
    buf.len()
}

async fn send_raw(s: &Arc<Stream>, stream: &str, bytes: &[u8]) {
    s.emit(output_frame(&s.id, stream, bytes), None).await;
}

/// Extra bytes JSON escaping adds per input byte: 5 for control characters (`\u00XX`), 1
/// for the two-character escapes.
static ESCAPE_EXTRA: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = 5;
        i += 1;
    }
    t[b'\n' as usize] = 1;
    t[b'\r' as usize] = 1;
    t[b'\t' as usize] = 1;
    t[0x08] = 1;
    t[0x0c] = 1;
    t[b'"' as usize] = 1;
    t[b'\\' as usize] = 1;
    t
};

/// Whether `bytes` escaped as a JSON string take at most `limit` bytes (stops early once
/// they cannot).
fn escaped_within(bytes: &[u8], limit: usize) -> bool {
    let Some(mut budget) = limit.checked_sub(bytes.len()) else {
        return false;
    };
    for block in bytes.chunks(4096) {
        let extra: usize = block
            .iter()
            .map(|&b| ESCAPE_EXTRA[b as usize] as usize)
            .sum();
        match budget.checked_sub(extra) {
            Some(left) => budget = left,
            None => return false,
        }
    }
    true
}

/// What an `exec/output` frame carries: text, or bytes sent as base64.
enum Payload<'a> {
    Text(&'a str),
    Binary(&'a [u8]),
}

/// Choose how to send the front of `bytes`, and how many bytes that takes: UTF-8 text as a
/// JSON string, unless it is not UTF-8 or escaping it would cost more than base64
/// (control-heavy output such as NUL bytes, 6 bytes each as `\u0000`). With `keep_cut`, a
/// character cut at the end is left out (the caller carries it into the next chunk).
fn payload(bytes: &[u8], keep_cut: bool) -> (Payload<'_>, usize) {
    // The cost check first: it gives up within a few KiB of NUL-heavy output, where a
    // UTF-8 scan of the whole chunk would be wasted.
    if escaped_within(bytes, abx_protocol::b64::encoded_len(bytes.len()) + 24) {
        match std::str::from_utf8(bytes) {
            Ok(t) => return (Payload::Text(t), bytes.len()),
            Err(e) if keep_cut && e.error_len().is_none() => {
                let valid = e.valid_up_to();
                // SAFETY: `valid_up_to` is the length of the prefix `from_utf8` validated.
                let t = unsafe { std::str::from_utf8_unchecked(&bytes[..valid]) };
                return (Payload::Text(t), valid);
            }
            Err(_) => {}
        }
    }
    (Payload::Binary(bytes), bytes.len())
}

/// The `exec/output` notification body for `bytes` (all of them), byte-exact: text or
/// base64 with `"encoding": "base64"` as [`payload`] chooses.
pub fn output_frame(exec_id: &str, stream: &str, bytes: &[u8]) -> Vec<u8> {
    frame(exec_id, stream, payload(bytes, false).0)
}

/// The notification body, built in one buffer sized for it: text is only chosen when its
/// escaped form fits in the base64 length.
fn frame(exec_id: &str, stream: &str, p: Payload<'_>) -> Vec<u8> {
    let len = match p {
        Payload::Text(t) => t.len(),
        Payload::Binary(b) => b.len(),
    };
    let capacity = abx_protocol::b64::encoded_len(len) + 120;
    // The envelope is the protocol's; the params are written in place. Keys in the order
    // serde_json's map writes them (sorted), like every other message.
    abx_protocol::message::encode_notification_with("exec/output", capacity, |out| {
        out.extend_from_slice(br#"{"data":"#);
        match p {
            Payload::Text(t) => {
                serde_json::to_writer(&mut *out, t).expect("vec write");
            }
            Payload::Binary(b) => {
                out.push(b'"');
                abx_protocol::b64::encode_append(b, out);
                out.extend_from_slice(br#"","encoding":"base64""#);
            }
        }
        out.extend_from_slice(br#","execId":"#);
        serde_json::to_writer(&mut *out, exec_id).expect("vec write");
        out.extend_from_slice(br#","stream":"#);
        serde_json::to_writer(&mut *out, stream).expect("vec write");
        out.push(b'}');
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink() -> Sink {
        Sink {
            conn: None,
            buffer: VecDeque::new(),
            buffered: 0,
            dropped: 0,
            next: 0,
            exit: None,
        }
    }

    /// Detached streams keep at most 1 MiB each and DETACHED_TOTAL together (the oldest of
    /// the stream that adds goes first); an exit is always kept; dropping a stream uncounts it.
    #[test]
    fn detached_output_is_bounded_per_stream_and_in_total() {
        let mut sinks: Vec<Sink> = (0..64).map(|_| sink()).collect();
        for (i, s) in sinks.iter_mut().enumerate() {
            for seq in 0..8 {
                s.keep(seq, vec![b'x'; 256 * 1024]);
                assert!(s.buffered <= DETACHED_BUFFER, "stream {i}");
            }
            s.exit = Some(8);
            s.keep(8, b"exit".to_vec());
            assert!(detached_bytes() <= DETACHED_TOTAL + 256 * 1024);
        }
        let kept: usize = sinks.iter().map(|s| s.buffered).sum();
        assert!(kept <= DETACHED_TOTAL, "{kept}");
        assert!(sinks
            .iter()
            .all(|s| s.buffer.back().map(|b| b.0) == Some(8)));
        assert!(sinks.iter().map(|s| s.dropped).sum::<u64>() > 0);
        drop(sinks);
        assert_eq!(detached_bytes(), 0);
    }

    #[test]
    fn output_frames_are_byte_exact_and_cheap() {
        let decode = |body: &[u8]| -> Vec<u8> {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            assert_eq!(v["method"], "exec/output");
            assert_eq!(v["params"]["execId"], "e\"1");
            let d = v["params"]["data"].as_str().unwrap();
            match v["params"]["encoding"].as_str() {
                Some("base64") => decode_data(d, Some("base64")).unwrap(),
                None => d.as_bytes().to_vec(),
                Some(o) => panic!("{o}"),
            }
        };
        for input in [
            b"hello\n".to_vec(),
            "h\u{e9}llo \"q\" \\ \t".as_bytes().to_vec(),
            vec![0u8; 4096],
            vec![0xff, 0xfe, b'a'],
            (0..=255u8).collect(),
        ] {
            let body = output_frame("e\"1", "stdout", &input);
            assert_eq!(decode(&body), input);
        }
        // The same bytes as the generic encoder writes (sorted keys), text and base64.
        assert_eq!(
            output_frame("e1", "stderr", "tëxt\n".as_bytes()),
            abx_protocol::message::encode_notification(
                "exec/output",
                Some(&json!({"execId": "e1", "stream": "stderr", "data": "tëxt\n"}))
            )
        );
        assert_eq!(
            output_frame("e1", "stdout", &[0xff, 0]),
            abx_protocol::message::encode_notification(
                "exec/output",
                Some(
                    &json!({"execId": "e1", "stream": "stdout", "data": b64(&[0xff, 0]), "encoding": "base64"})
                )
            )
        );
        // NUL bytes go as base64 (4/3), not as \u0000 (6x); text stays text.
        let zeros = output_frame("x", "stdout", &[0u8; 3000]);
        assert!(zeros.len() < 4200, "{}", zeros.len());
        assert!(
            !String::from_utf8_lossy(&output_frame("x", "stdout", b"plain")).contains("base64")
        );
    }

    #[test]
    fn utf8_chunks_carry_partial_characters() {
        let text = |p: Payload<'_>| match p {
            Payload::Text(t) => Some(t.to_string()),
            Payload::Binary(_) => None,
        };
        let bytes = "héllo".as_bytes();
        // A character cut at the end is carried (keep_cut) or sent as base64 (at the end).
        let (p, used) = payload(&bytes[..2], true);
        assert_eq!((text(p).as_deref(), used), (Some("h"), 1));
        let (p, used) = payload(&bytes[..2], false);
        assert_eq!((text(p), used), (None, 2));
        let (p, used) = payload(bytes, true);
        assert_eq!((text(p).as_deref(), used), (Some("héllo"), bytes.len()));
        // Not UTF-8, or only a cut character: nothing sent as text.
        assert_eq!(text(payload(&[0xff, b'a'], true).0), None);
        assert_eq!(payload(&bytes[1..2], true).1, 0);
        // NUL-heavy bytes go as base64 even though they are valid UTF-8.
        assert_eq!(text(payload(&[0u8; 4096], true).0), None);
    }
}
