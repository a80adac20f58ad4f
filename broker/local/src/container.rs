//! A sandbox's container, seen from the daemon: its init process (see [`super::init`]) and
//! the socket through which processes are started, ports are reached and signals are sent.
//!
//! One [`Container`] per running sandbox of the `namespaces` model, started at
//! `sandbox/create` (and again on first use after a daemon restart: a daemon crash ends the
//! processes, never the sandbox). A reader task takes the init's events: answers to requests
//! (matched by `seq`) and exits of started processes (matched by pid). Killing the container
//! closes the socket and kills the init's outer process; the kernel then ends every process of
//! the sandbox's PID namespace, detached or not.

use super::init::{self, Config, Event, Request};
use abx_protocol::{AbxError, ErrorCode};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

/// The environment variable naming the init program (default: the daemon's own binary).
pub const INIT_ENV: &str = "ABX_SANDBOX_INIT";

/// How long the init may take to build the sandbox or answer a request.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// An answer of the init to one request.
enum Answer {
    Spawned {
        pid: i32,
        fds: Vec<OwnedFd>,
        exit: oneshot::Receiver<i32>,
    },
    Failed {
        errno: i32,
        what: String,
    },
    Connected(Vec<OwnedFd>),
    Done,
}

/// A process started in a sandbox.
pub struct Proc {
    /// Its pid inside the sandbox.
    pub pid: i32,
    /// Its pid in the daemon's PID namespace.
    pub host_pid: i32,
    /// A pidfd (stable across pid reuse).
    pub pidfd: OwnedFd,
    /// The pty master (spawned with a pty).
    pub master: Option<OwnedFd>,
    exit: Option<oneshot::Receiver<i32>>,
    status: Option<i32>,
}

impl Proc {
    /// Wait for the process to end: its wait status. A process whose sandbox went away is
    /// reported as killed by SIGKILL. Cancel-safe; may be called again after it returned.
    pub async fn wait(&mut self) -> i32 {
        if let Some(s) = self.status {
            return s;
        }
        let s = match self.exit.as_mut() {
            Some(rx) => rx.await.unwrap_or(libc::SIGKILL),
            None => libc::SIGKILL,
        };
        self.exit = None;
        self.status = Some(s);
        s
    }
}

/// A running sandbox's init, from the daemon.
pub struct Container {
    sock: AsyncFd<OwnedFd>,
    outer: Outer,
    pidns: u64,
    seq: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    exits: Mutex<HashMap<i32, oneshot::Sender<i32>>>,
    alive: AtomicBool,
    /// The user-mode networking helper of an `internet` sandbox.
    pasta: Mutex<Option<i32>>,
    /// The sandbox's `/` ([`Container::root`]), asked for once.
    root: tokio::sync::Mutex<Option<Arc<OwnedFd>>>,
}

fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut sv = [0; 2];
    // SAFETY: socketpair into a local array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    let size: libc::c_int = (init::MAX_MSG * 2) as libc::c_int;
    // SAFETY: setsockopt with an int on the stack (best effort: capped by wmem_max).
    unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            4,
        );
    }
    Ok((a, b))
}

/// The program run as the init: `ABX_SANDBOX_INIT`, else the daemon's own binary.
fn init_program() -> std::path::PathBuf {
    std::env::var_os(INIT_ENV)
        .map(Into::into)
        .unwrap_or_else(|| "/proc/self/exe".into())
}

/// A sandbox's outer process (a child of the zygote): its pid and a pidfd.
pub struct Outer {
    /// Its pid in the daemon's PID namespace.
    pub pid: i32,
    /// A pidfd: readable once it has exited.
    pub pidfd: OwnedFd,
}

impl Outer {
    fn signal(&self, sig: i32) {
        // SAFETY: pidfd_send_signal on our own pidfd.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }

    /// Wait (blocking) up to `ms` for it to exit: whether it did.
    fn wait_blocking(&self, ms: i32) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one local pollfd.
        unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
    }

    /// Kill it (its inner process, PID 1 of the sandbox, dies with it) and wait.
    fn kill_blocking(&self) {
        self.signal(libc::SIGKILL);
        self.wait_blocking(5000);
    }
}

/// The daemon's zygote (see [`init`]'s `zygote`): one small single-threaded process, started
/// on first use from the init program, that forks each sandbox's outer process. Its socket
/// is its lifeline: it exits when the daemon does.
struct Zygote {
    child: std::process::Child,
    sock: OwnedFd,
    seq: u64,
}

static ZYGOTE: Mutex<Option<Zygote>> = Mutex::new(None);

/// Put `fds` on 3, 4, ... of the child and mark every other descriptor close-on-exec.
/// Between fork and exec: fcntl, dup2 and close_range only, on a list built before the fork.
fn place_fds(cmd: &mut std::process::Command, sources: Vec<RawFd>) {
    let count = sources.len();
    // SAFETY: async-signal-safe calls only; `sources` is only read.
    unsafe {
        cmd.pre_exec(move || {
            // First out of the way (a source may sit on a target number), then into place.
            let mut high = [0 as RawFd; 16];
            for (i, &src) in sources.iter().enumerate().take(16) {
                high[i] = libc::fcntl(src, libc::F_DUPFD_CLOEXEC, 64);
                if high[i] < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (i, &h) in high.iter().enumerate().take(count.min(16)) {
                if libc::dup2(h, 3 + i as RawFd) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            abx_confine::fds::restore_fd_limit_in_child();
            libc::syscall(
                libc::SYS_close_range,
                3 + count as u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            Ok(())
        });
    }
}

fn start_zygote() -> Result<Zygote, String> {
    let (ours, theirs) = socketpair().map_err(|e| format!("socketpair: {e}"))?;
    let mut cmd = std::process::Command::new(init_program());
    cmd.arg0("abx-sandbox-zygote")
        .arg(init::ARG)
        .arg(init::ZYGOTE)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    place_fds(&mut cmd, vec![theirs.as_raw_fd()]);
    let child = cmd
        .spawn()
        .map_err(|e| format!("starting the sandbox zygote: {e}"))?;
    Ok(Zygote {
        child,
        sock: ours,
        seq: 0,
    })
}

/// Ask the zygote for a new outer process with the init's socket on its fd 3 and the
/// cgroup's `cgroup.procs` on 4... A zygote that died is started again (once per call).
fn fork_outer(init_end: RawFd, cgroup: &[RawFd], early: bool) -> Result<Outer, String> {
    let mut g = ZYGOTE.lock().unwrap_or_else(|e| e.into_inner());
    let mut last = String::new();
    for _ in 0..2 {
        if g.is_none() {
            *g = Some(start_zygote()?);
        }
        let z = g.as_mut().expect("zygote");
        z.seq += 1;
        let seq = z.seq;
        let req = serde_json::to_vec(&init::ZygoteRequest {
            seq,
            cgroups: cgroup.len(),
            early,
        })
        .map_err(|e| e.to_string())?;
        let mut fds = vec![init_end];
        fds.extend_from_slice(cgroup);
        let answer = init::send(z.sock.as_raw_fd(), &req, &fds, 0).and_then(|()| {
            let mut pfd = libc::pollfd {
                fd: z.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one local pollfd.
            if unsafe { libc::poll(&mut pfd, 1, ANSWER_TIMEOUT.as_millis() as i32) } <= 0 {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer"));
            }
            let mut buf = [0u8; 1024];
            let (n, fds) = init::recv(z.sock.as_raw_fd(), &mut buf, 0)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "exited"));
            }
            let a: init::ZygoteAnswer = serde_json::from_slice(&buf[..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            Ok((a, fds))
        });
        match answer {
            Ok((a, mut fds)) if a.seq == seq && a.pid > 0 && fds.len() == 1 => {
                return Ok(Outer {
                    pid: a.pid,
                    pidfd: fds.remove(0),
                });
            }
            Ok((a, _)) if a.seq == seq => {
                return Err(a
                    .error
                    .unwrap_or_else(|| "the sandbox zygote gave no process".into()))
            }
            Ok(_) => last = "the sandbox zygote answered out of turn".into(),
            Err(e) => last = format!("the sandbox zygote failed: {e}"),
        }
        // Out of step or gone: start a new one.
        if let Some(mut z) = g.take() {
            let _ = z.child.kill();
            let _ = z.child.wait();
        }
    }
    Err(format!(
        "{last} (is {} the abx daemon binary?)",
        init_program().display()
    ))
}

/// Start the init with its socket on fd 3 and send it the config. Blocking (no runtime
/// needed): used by the probe and, on a blocking thread, by [`Container::start`].
fn launch(cfg: &Config, cgroup: &[RawFd]) -> Result<(Outer, OwnedFd), String> {
    let (ours, theirs) = socketpair().map_err(|e| format!("socketpair: {e}"))?;
    let t0 = std::time::Instant::now();
    let outer = fork_outer(theirs.as_raw_fd(), cgroup, false)?;
    let fork_us = t0.elapsed().as_micros();
    drop(theirs);
    configure(cfg, outer, ours, fork_us)
}

/// How [`Container::start`] gets the sandbox's outer process.
pub enum Start {
    /// A new one from the zygote, joining these `cgroup.procs`.
    Fresh(Vec<RawFd>),
    /// The spare (already in its cgroup).
    Spare(Spare),
}

/// A sandbox's outer process started ahead of time, already in a cgroup of its own, waiting
/// for its config: `sandbox/create` then costs neither the fork nor the cgroup's creation and
/// migration (on cgroup v1 a migration waits for an RCU grace period, milliseconds). One is
/// kept per daemon, made again after each use, for the limits last asked for.
pub struct Spare {
    outer: Outer,
    sock: OwnedFd,
    /// Its cgroup (renamed to the sandbox where the kernel allows it: v1).
    pub cgroup: super::limits::Cgroup,
    limits: super::limits::Limits,
}

static SPARE: Mutex<Option<Spare>> = Mutex::new(None);

/// The spare, when there is one for `limits` and it is still alive.
pub fn take_spare(limits: &super::limits::Limits) -> Option<Spare> {
    let mut g = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    let sp = g.take()?;
    if sp.outer.wait_blocking(0) {
        // It died (its cgroup could not be joined, say): not usable.
        drop(g);
        std::thread::spawn(move || sp.discard());
        return None;
    }
    if &sp.limits == limits {
        return Some(sp);
    }
    *g = Some(sp);
    None
}

/// Make a spare for `limits` unless there is one (blocking: run on the blocking pool). No
/// spare where no cgroup can be made: then there is no migration to save.
pub fn make_spare(limits: super::limits::Limits) {
    {
        let g = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        if g.as_ref()
            .is_some_and(|s| s.limits == limits && !s.outer.wait_blocking(0))
        {
            return;
        }
    }
    let mut rnd = [0u8; 6];
    // SAFETY: getrandom into a local buffer.
    unsafe { libc::getrandom(rnd.as_mut_ptr().cast(), rnd.len(), 0) };
    let name: String = std::iter::once("spare-".to_owned())
        .chain(rnd.iter().map(|b| format!("{b:02x}")))
        .collect();
    let Some(cgroup) = super::limits::Cgroup::create(&name, &limits) else {
        return;
    };
    cgroup.allow_outer_process(&limits);
    let procs = cgroup.open_procs();
    let fds: Vec<RawFd> = procs.iter().map(|f| f.as_raw_fd()).collect();
    let made = socketpair()
        .map_err(|e| e.to_string())
        .and_then(|(ours, theirs)| {
            fork_outer(theirs.as_raw_fd(), &fds, true).map(|outer| (outer, ours))
        });
    drop(procs);
    match made {
        Ok((outer, sock)) => {
            let old = SPARE
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .replace(Spare {
                    outer,
                    sock,
                    cgroup,
                    limits,
                });
            if let Some(old) = old {
                old.discard();
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "no spare sandbox process");
            remove_cgroup_blocking(&cgroup);
        }
    }
}

/// Drop the spare (daemon shutdown): its process ends, its cgroup is removed.
pub fn discard_spare() {
    let sp = SPARE.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(sp) = sp {
        sp.discard();
    }
}

impl Spare {
    fn discard(self) {
        drop(self.sock);
        self.outer.kill_blocking();
        remove_cgroup_blocking(&self.cgroup);
    }

    /// Start the sandbox `cfg` from this spare (blocking).
    fn launch(self, cfg: &Config) -> Result<(Outer, OwnedFd), String> {
        configure(cfg, self.outer, self.sock, 0)
    }
}

fn remove_cgroup_blocking(cg: &super::limits::Cgroup) {
    cg.remove_blocking();
}

/// Send an outer process its config and wait until the sandbox is built.
fn configure(
    cfg: &Config,
    outer: Outer,
    ours: OwnedFd,
    fork_us: u128,
) -> Result<(Outer, OwnedFd), String> {
    let t0 = std::time::Instant::now();
    std::fs::create_dir_all(&cfg.new_root)
        .map_err(|e| format!("creating {}: {e}", cfg.new_root.display()))?;
    let body = serde_json::to_vec(cfg).map_err(|e| e.to_string())?;
    let fail = |outer: &Outer, e: String| {
        outer.kill_blocking();
        e
    };
    // The mounts' sources (or trees) travel with the config.
    let fds: Vec<i32> = cfg.fds.iter().map(|f| f.as_raw_fd()).collect();
    if let Err(e) = init::send(ours.as_raw_fd(), &body, &fds, 0) {
        return Err(fail(&outer, format!("sending the sandbox config: {e}")));
    }
    // The first event: Ready or SetupFailed, in bounded time.
    let mut pfd = libc::pollfd {
        fd: ours.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one local pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, ANSWER_TIMEOUT.as_millis() as i32) };
    if n <= 0 {
        return Err(fail(
            &outer,
            "the sandbox init did not answer in time".into(),
        ));
    }
    let mut buf = vec![0u8; 64 * 1024];
    let ev = match init::recv(ours.as_raw_fd(), &mut buf, 0) {
        Ok((0, _)) => {
            return Err(fail(
                &outer,
                format!(
                    "the sandbox init exited before it was ready (is {} the abx daemon binary?)",
                    init_program().display()
                ),
            ))
        }
        Ok((n, _)) => serde_json::from_slice::<Event>(&buf[..n]).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match ev {
        Ok(Event::Ready {
            setup_us,
            join_wait_us,
        }) => {
            tracing::debug!(
                sandbox = %cfg.id,
                fork_us,
                setup_us,
                join_wait_us,
                ready_us = t0.elapsed().as_micros(),
                "sandbox init ready"
            );
            Ok((outer, ours))
        }
        Ok(Event::SetupFailed { error }) => Err(fail(&outer, error)),
        Ok(other) => Err(fail(&outer, format!("unexpected first event {other:?}"))),
        Err(e) => Err(fail(&outer, e)),
    }
}

/// Build and tear down a throwaway sandbox: whether the container model works here.
pub fn probe(cfg: &Config) -> Result<(), String> {
    let (outer, sock) = launch(cfg, &[])?;
    drop(sock);
    outer.kill_blocking();
    Ok(())
}

/// The inode of a process's namespace link (`/proc/<pid>/ns/<name>`).
pub fn ns_inode(pid: i32, name: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/{name}"))
        .ok()
        .map(|m| m.ino())
}

impl Container {
    /// Start a sandbox's init and wait until the sandbox is built.
    pub async fn start(cfg: Config, how: Start) -> Result<Arc<Container>, AbxError> {
        let internet = cfg.network == "internet";
        let pidfile = cfg.new_root.with_file_name("pasta.pid");
        let (outer, sock) = tokio::task::spawn_blocking(move || match how {
            Start::Fresh(cgroup) => launch(&cfg, &cgroup),
            Start::Spare(sp) => sp.launch(&cfg),
        })
            .await
            .map_err(AbxError::internal)?
            .map_err(|e| {
                // A mount the init refused (its source is no longer what was checked).
                if let Some((path, reason)) = e
                    .strip_prefix("E2010 mount of '")
                    .and_then(|r| r.split_once("' refused: "))
                {
                    return crate::workspace::mounts::refused(path, reason);
                }
                AbxError::new(
                    ErrorCode::SandboxCreateFailed,
                    &[("detail", &format!("building the sandbox failed: {e}")), ("provider", "local")],
                )
                .with_suggestion("See docs/local-sandboxes.md for what the local provider needs (user namespaces); the broker log has details.")
            })?;
        let outer_pid = outer.pid;
        let pidns = ns_inode(outer_pid, "pid_for_children").unwrap_or(0);
        // A helper left by an earlier daemon for this sandbox.
        if let Some(old) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            super::net::stop_pasta(old);
        }
        let pasta = if internet {
            let pf = pidfile.clone();
            let started =
                tokio::task::spawn_blocking(move || super::net::start_pasta(outer_pid, &pf))
                    .await
                    .map_err(AbxError::internal)
                    .and_then(|r| r);
            match started {
                Ok(p) => Some(p),
                Err(e) => {
                    let _ = tokio::task::spawn_blocking(move || outer.kill_blocking()).await;
                    return Err(e);
                }
            }
        } else {
            None
        };
        // SAFETY: fcntl on our own descriptor.
        unsafe {
            let fl = libc::fcntl(sock.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(sock.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let c = Arc::new(Container {
            // SAFETY: the socket is an OwnedFd owned by the AsyncFd for its whole life.
            sock: unsafe { AsyncFd::register(sock) }
                .map_err(|e| AbxError::internal(e.to_string()))?,
            outer,
            pidns,
            seq: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            pasta: Mutex::new(pasta),
            root: tokio::sync::Mutex::new(None),
        });
        let r = c.clone();
        tokio::spawn(async move { r.read_loop().await });
        Ok(c)
    }

    /// Whether the init is still there.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// The inode of the sandbox's PID namespace.
    pub fn pidns(&self) -> u64 {
        self.pidns
    }

    async fn read_loop(self: Arc<Self>) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let Ok(mut guard) = self.sock.readable().await else {
                break;
            };
            match guard.try_io(|fd| init::recv(fd.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT)) {
                Ok(Ok((0, _))) => break,
                Ok(Ok((n, fds))) => {
                    if let Ok(ev) = serde_json::from_slice::<Event>(&buf[..n]) {
                        self.on_event(ev, fds);
                    }
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {}
                Ok(Err(_)) => break,
                Err(_would_block) => {}
            }
        }
        self.alive.store(false, Ordering::Relaxed);
        self.waiting.lock().expect("waiting").clear();
        self.exits.lock().expect("exits").clear();
    }

    fn on_event(&self, ev: Event, fds: Vec<OwnedFd>) {
        let answer = |seq: u64, a: Answer| {
            if let Some(tx) = self.waiting.lock().expect("waiting").remove(&seq) {
                let _ = tx.send(a);
            }
        };
        match ev {
            Event::Spawned { seq, pid } => {
                let (tx, rx) = oneshot::channel();
                self.exits.lock().expect("exits").insert(pid, tx);
                let a = Answer::Spawned { pid, fds, exit: rx };
                let waiter = self.waiting.lock().expect("waiting").remove(&seq);
                let undelivered = match waiter {
                    Some(w) => w.send(a).err(),
                    None => Some(a),
                };
                if undelivered.is_none() {
                    if let Some((_, mark)) = spawn_hooks_for_tests() {
                        let _ = std::fs::write(mark, pid.to_string());
                    }
                }
                // Nobody waits for it any more (the request was cancelled or timed out while
                // the init started it): the process must not stay behind unowned.
                if let Some(Answer::Spawned { fds, .. }) = undelivered {
                    if let Some(host) = fds.first().and_then(host_pid_of) {
                        super::procs::kill_tree(host, libc::SIGKILL);
                    }
                    self.exits.lock().expect("exits").remove(&pid);
                }
            }
            Event::Failed { seq, errno, what } => answer(seq, Answer::Failed { errno, what }),
            Event::Connected { seq } => answer(seq, Answer::Connected(fds)),
            Event::Done { seq } => answer(seq, Answer::Done),
            Event::Exit { pid, status } => {
                if let Some(tx) = self.exits.lock().expect("exits").remove(&pid) {
                    let _ = tx.send(status);
                }
            }
            Event::Ready { .. } | Event::SetupFailed { .. } => {}
        }
    }

    fn gone() -> AbxError {
        AbxError::detail(
            ErrorCode::ExecFailedToStart,
            "the sandbox's init is gone (the sandbox was killed or its init died)",
        )
    }

    async fn request(&self, req: Request, seq: u64, fds: &[RawFd]) -> Result<Answer, AbxError> {
        if !self.alive() {
            return Err(Self::gone());
        }
        let body = serde_json::to_vec(&req).map_err(AbxError::internal)?;
        if body.len() > init::MAX_MSG {
            return Err(AbxError::invalid_params(
                "exec",
                format!(
                    "the command and its environment take {} bytes; a local sandbox takes at most {} (pass large input on stdin or in a file)",
                    body.len(),
                    init::MAX_MSG
                ),
            ));
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("waiting").insert(seq, tx);
        loop {
            let mut guard = self.sock.writable().await.map_err(AbxError::internal)?;
            match guard.try_io(|fd| init::send(fd.as_raw_fd(), &body, fds, libc::MSG_DONTWAIT)) {
                Ok(Ok(())) => break,
                Ok(Err(_)) => {
                    self.waiting.lock().expect("waiting").remove(&seq);
                    return Err(Self::gone());
                }
                Err(_would_block) => continue,
            }
        }
        // A spawn answered into the channel but never taken (the request was cancelled in
        // between) is killed when the wait is dropped: no process stays behind unowned.
        let mut rx = SpawnWait(Some(rx));
        if matches!(req, Request::Spawn { .. }) {
            if let Some((d, _)) = spawn_hooks_for_tests() {
                // The answer arrives while this request is not looking (a busy machine).
                tokio::time::sleep(*d).await;
            }
        }
        match tokio::time::timeout(ANSWER_TIMEOUT, &mut rx).await {
            Ok(Ok(a)) => {
                rx.0 = None;
                Ok(a)
            }
            Ok(Err(_)) => Err(Self::gone()),
            Err(_) => {
                self.waiting.lock().expect("waiting").remove(&seq);
                Err(AbxError::detail(
                    ErrorCode::ExecFailedToStart,
                    "the sandbox's init did not answer in time",
                ))
            }
        }
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Start a process: `stdio` (stdin, stdout, stderr) or a pty of `(rows, cols)`.
    /// Errors: `Err((errno, step))` for what failed in the sandbox, else an AbxError.
    pub async fn spawn(
        &self,
        argv: Vec<String>,
        env: Vec<String>,
        cwd: String,
        pty: Option<(u16, u16)>,
        stdio: &[RawFd],
    ) -> Result<Result<Proc, (i32, String)>, AbxError> {
        let seq = self.next();
        let req = Request::Spawn {
            seq,
            argv,
            env,
            cwd,
            pty,
        };
        match self.request(req, seq, stdio).await? {
            Answer::Spawned { pid, fds, exit } => {
                let mut it = fds.into_iter();
                let pidfd = it.next().ok_or_else(|| AbxError::internal("no pidfd"))?;
                let master = if pty.is_some() { it.next() } else { None };
                let host_pid = host_pid_of(&pidfd).unwrap_or(0);
                Ok(Ok(Proc {
                    pid,
                    host_pid,
                    pidfd,
                    master,
                    exit: Some(exit),
                    status: None,
                }))
            }
            Answer::Failed { errno, what } => Ok(Err((errno, what))),
            _ => Err(AbxError::internal("unexpected answer to spawn")),
        }
    }

    /// A TCP connection to `port` on the sandbox's loopback (its network namespace).
    pub async fn connect(&self, port: u16) -> Result<OwnedFd, io::Error> {
        let seq = self.next();
        match self.request(Request::Connect { seq, port }, seq, &[]).await {
            Ok(Answer::Connected(mut fds)) if !fds.is_empty() => Ok(fds.remove(0)),
            Ok(Answer::Failed { errno, .. }) => Err(io::Error::from_raw_os_error(errno)),
            Ok(_) => Err(io::Error::other("unexpected answer to connect")),
            Err(e) => Err(io::Error::other(e.message)),
        }
    }

    /// A TCP socket listening on `127.0.0.1` inside the sandbox's network namespace (an
    /// ephemeral port), made by its init; the daemon accepts its connections (the egress
    /// proxy of a sandbox with a network policy).
    pub async fn listen(&self) -> Result<OwnedFd, io::Error> {
        let seq = self.next();
        match self.request(Request::Listen { seq }, seq, &[]).await {
            Ok(Answer::Connected(mut fds)) if !fds.is_empty() => Ok(fds.remove(0)),
            Ok(Answer::Failed { errno, .. }) => Err(io::Error::from_raw_os_error(errno)),
            Ok(_) => Err(io::Error::other("unexpected answer to listen")),
            Err(e) => Err(io::Error::other(e.message)),
        }
    }

    /// An `O_PATH` descriptor of the sandbox's `/` as its init sees it (in its mount
    /// namespace).
    pub async fn root(&self) -> Result<Arc<OwnedFd>, io::Error> {
        let mut g = self.root.lock().await;
        if let Some(r) = g.as_ref() {
            return Ok(r.clone());
        }
        let seq = self.next();
        match self.request(Request::Root { seq }, seq, &[]).await {
            Ok(Answer::Connected(mut fds)) if !fds.is_empty() => {
                let r = Arc::new(fds.remove(0));
                *g = Some(r.clone());
                Ok(r)
            }
            Ok(Answer::Failed { errno, .. }) => Err(io::Error::from_raw_os_error(errno)),
            Ok(_) => Err(io::Error::other("unexpected answer to root")),
            Err(e) => Err(io::Error::other(e.message)),
        }
    }

    /// Mount overlay `n` (its index in the sandbox's mounts) again, as at start, so the
    /// sandbox's processes see what `sandbox/discard` removed from its upper dir (the init's
    /// outer process does it: init_remount.rs). `ErrorKind::Unsupported`: this overlay is not
    /// mounted again while the sandbox runs (its target is a Landlock rule of its own).
    pub async fn remount(&self, n: usize) -> Result<(), io::Error> {
        let seq = self.next();
        match self
            .request(Request::Remount { seq, mount: n }, seq, &[])
            .await
        {
            Ok(Answer::Done) => Ok(()),
            Ok(Answer::Failed { errno, what }) if errno == libc::EOPNOTSUPP => {
                Err(io::Error::new(io::ErrorKind::Unsupported, what))
            }
            Ok(Answer::Failed { errno, what }) => Err(io::Error::other(format!(
                "{what} ({})",
                io::Error::from_raw_os_error(errno)
            ))),
            Ok(_) => Err(io::Error::other("unexpected answer to remount")),
            Err(e) => Err(io::Error::other(e.message)),
        }
    }

    /// Send a signal to every process of the sandbox (not the init).
    pub async fn signal_all(&self, sig: i32) -> Result<(), AbxError> {
        let seq = self.next();
        self.request(Request::SignalAll { seq, sig }, seq, &[])
            .await
            .map(|_| ())
    }

    /// End the sandbox's every process: close the socket (the init exits), kill the outer
    /// process, and wait until it is gone (by then the kernel has ended the whole PID
    /// namespace).
    pub async fn kill(&self) {
        self.alive.store(false, Ordering::Relaxed);
        if let Some(p) = self.pasta.lock().expect("pasta").take() {
            super::net::stop_pasta(p);
        }
        // SAFETY: shutdown on our own socket.
        unsafe { libc::shutdown(self.sock.get_ref().as_raw_fd(), libc::SHUT_RDWR) };
        // SIGTERM: the outer process kills PID 1 and exits only once it has reaped it, that
        // is once the kernel has ended every process of the PID namespace. Its pidfd then
        // becomes readable. SIGKILL if it does not manage in time.
        self.outer.signal(libc::SIGTERM);
        let watch = self.outer.pidfd.try_clone().and_then(|fd| {
            // SAFETY: the AsyncFd owns this duplicate for its whole life.
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                .map_err(|e| e.into_parts().1)
        });
        let exited = match watch {
            Ok(fd) => tokio::time::timeout(Duration::from_secs(5), fd.readable())
                .await
                .is_ok(),
            Err(_) => false,
        };
        if !exited {
            self.outer.signal(libc::SIGKILL);
            let o = self.outer.pidfd.try_clone().ok();
            let _ = tokio::task::spawn_blocking(move || {
                if let Some(fd) = o {
                    let mut pfd = libc::pollfd {
                        fd: fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: poll on one local pollfd.
                    unsafe { libc::poll(&mut pfd, 1, 5000) };
                }
            })
            .await;
        }
    }

    /// The host pids of the sandbox's processes with their pids inside (init excluded).
    pub fn members(&self) -> Vec<(i32, i32)> {
        members_of(self.pidns)
    }
}

/// `Pid:` from a pidfd's fdinfo: the process's pid in our PID namespace.
fn host_pid_of(pidfd: &OwnedFd) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|p: &i32| *p > 0)
}

/// `NSpid:` of a host pid: its pid in the innermost namespace.
pub fn inner_pid(host_pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last()?.parse().ok())
}

/// (host pid, inner pid) of every process whose PID namespace is `pidns`, init excluded.
pub fn members_of(pidns: u64) -> Vec<(i32, i32)> {
    if pidns == 0 {
        return Vec::new();
    }
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<(i32, i32)> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| ns_inode(p, "pid") == Some(pidns))
        .filter_map(|p| Some((p, inner_pid(p)?)))
        .filter(|&(_, inner)| inner != 1)
        .collect();
    out.sort_by_key(|&(_, inner)| inner);
    out
}

/// Top-level host directories a sandbox sees (read-only): `/usr` and the usr-merge links.
pub const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Entries of the host `/etc` a sandbox sees (read-only). Not carried: `shadow`, `gshadow`,
/// `sudoers`, `ssh`, `ssl/private` (with `ssl` only `certs` and `openssl.cnf`), and the
/// host's `passwd`, `group`, `hosts` and `hostname`, which are generated per sandbox.
pub const ETC_ENTRIES: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "gai.conf",
    "host.conf",
    "inputrc",
    "issue",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "login.defs",
    "lsb-release",
    "magic",
    "magic.mime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "profile",
    "profile.d",
    "protocols",
    "python3",
    "python3.11",
    "resolv.conf",
    "rpc",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
    "vim",
];

/// The host uid and gid a root daemon's sandboxes run as (root inside the sandbox, no
/// capabilities): an id no account has, so a sandbox process is nobody on the host.
pub const ROOT_SANDBOX_ID: u32 = 100_000_000;

/// The uid and gid a sandbox's processes have inside and the host ids they map to: the
/// daemon's own user mapped to itself (as the user sees its files); for a root daemon, root
/// inside mapped to the unprivileged [`ROOT_SANDBOX_ID`].
pub fn id_maps() -> (u32, u32, String, String) {
    // SAFETY: getters without arguments.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        let x = ROOT_SANDBOX_ID;
        return (0, 0, format!("0 {x} 1"), format!("0 {x} 1"));
    }
    (uid, gid, format!("{uid} {uid} 1"), format!("{gid} {gid} 1"))
}

/// The host owner the daemon gives what it creates in a sandbox (a root daemon's sandboxes
/// run as [`ROOT_SANDBOX_ID`]); None when that is the daemon's own user.
pub fn sandbox_owner() -> Option<(u32, u32)> {
    // SAFETY: a getter without arguments.
    let root = unsafe { libc::geteuid() } == 0;
    (root && super::isolate::model() == super::isolate::Model::Namespaces)
        .then_some((ROOT_SANDBOX_ID, ROOT_SANDBOX_ID))
}

/// Give the sandbox's owner its two directories (they must be writable inside).
pub fn own_dirs(dirs: &super::SandboxDirs) {
    if let Some((u, g)) = sandbox_owner() {
        for d in [&dirs.workspace, &dirs.tmp] {
            let _ = std::os::unix::fs::lchown(d, Some(u), Some(g));
        }
    }
}

/// The config of a sandbox's init.
pub fn config(dirs: &super::SandboxDirs, id: &str, network: &str, nproc: Option<u64>) -> Config {
    let (inner_uid, inner_gid, uid_map, gid_map) = id_maps();
    Config {
        id: id.to_owned(),
        new_root: dirs.root.join(".root"),
        workspace: dirs.workspace.clone(),
        tmp: dirs.tmp.clone(),
        network: network.to_owned(),
        uid_map,
        gid_map,
        inner_uid,
        inner_gid,
        system: SYSTEM_DIRS.iter().map(|s| s.to_string()).collect(),
        etc: ETC_ENTRIES.iter().map(|s| s.to_string()).collect(),
        shm_size: 64 << 20,
        landlock: true,
        nproc,
        fsize: None,
        image: None,
        mounts: Vec::new(),
        fds: Vec::new(),
    }
}

/// `ABX_TEST_HOOKS=1` with `ABX_TEST_SPAWN_WAIT_MS=N` and `ABX_TEST_SPAWN_MARK=path`: a
/// spawn request waits N ms before it looks for its answer (the window a cancellation can
/// race on a loaded machine), and the init's answer, once in its channel, writes `path`
/// (tests only; read once).
fn spawn_hooks_for_tests() -> Option<&'static (std::time::Duration, std::path::PathBuf)> {
    static H: std::sync::OnceLock<Option<(std::time::Duration, std::path::PathBuf)>> =
        std::sync::OnceLock::new();
    H.get_or_init(|| {
        if std::env::var("ABX_TEST_HOOKS").ok().as_deref() != Some("1") {
            return None;
        }
        let ms: u64 = std::env::var("ABX_TEST_SPAWN_WAIT_MS").ok()?.parse().ok()?;
        let mark = std::path::PathBuf::from(std::env::var_os("ABX_TEST_SPAWN_MARK")?);
        Some((std::time::Duration::from_millis(ms), mark))
    })
    .as_ref()
}

/// The wait for an init's answer. Dropped with a `Spawned` answer delivered and not taken
/// (the request's future was dropped after the init started the process, before it was
/// polled again: a cancellation racing the answer), it kills that process's tree, as
/// [`Container::on_event`] does for an answer nobody waits for any more.
struct SpawnWait(Option<oneshot::Receiver<Answer>>);

impl std::future::Future for SpawnWait {
    type Output = Result<Answer, oneshot::error::RecvError>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.0.as_mut() {
            Some(rx) => std::pin::Pin::new(rx).poll(cx),
            None => std::task::Poll::Pending,
        }
    }
}

impl Drop for SpawnWait {
    fn drop(&mut self) {
        if let Some(mut rx) = self.0.take() {
            if let Ok(Answer::Spawned { fds, .. }) = rx.try_recv() {
                if let Some(host) = fds.first().and_then(host_pid_of) {
                    super::procs::kill_tree(host, libc::SIGKILL);
                }
            }
        }
    }
}
