//! The init of a `local` sandbox (docs/design.md#local): the program that builds a sandbox's private
//! world once and then starts every process of the sandbox inside it.
//!
//! The daemon starts it per sandbox as `<daemon binary> __abx-sandbox-init` (see
//! [`super::container`]) with a `SOCK_SEQPACKET` socket on fd 3. It is an ordinary
//! single-threaded program (never code run between `fork` and `exec` of the multi-threaded
//! daemon), in two processes:
//!
//! - the **outer** process reads the [`Config`], creates the user, mount, PID, IPC, UTS and
//!   (unless the network mode is `host`) network namespaces, maps its uid/gid, forks the
//!   inner process and waits for it. It stays in the daemon's PID namespace: it is the child
//!   the daemon holds, and killing it (SIGKILL) kills the inner one (`PR_SET_PDEATHSIG`), whose
//!   death kills every process of the namespace.
//! - the **inner** process is PID 1 of the sandbox. It composes the private root on a tmpfs
//!   (system directories read-only, an `/etc` subset, `/workspace` and `/tmp` onto the
//!   sandbox's directories, a minimal `/dev` with its own devpts, a fresh `/proc`), sets the
//!   hostname to the sandbox id, brings up loopback, `pivot_root`s into it, then joins a new
//!   session keyring (not the daemon's), drops every capability, sets no_new_privs, refuses the
//!   keyring system calls (seccomp, `abx_confine::keyring`; `/proc/keys` is masked) and
//!   restricts itself with Landlock (writes only beneath
//!   `/workspace`, `/tmp`, `/dev/shm` and the terminal/null devices; signals and abstract Unix
//!   sockets scoped to the sandbox where the ABI has it). Every process it starts inherits
//!   all of that. It then serves [`Request`]s: spawn a process with the given descriptors (or
//!   a pty of the sandbox's own devpts), connect to a port inside the sandbox's network (for
//!   `ports/url`), signal every process (pause/resume). It reaps every process (orphans
//!   included) and reports the exit of the ones it started. When the daemon's end of the
//!   socket closes, it exits, and with it the whole sandbox.
//!
//! Messages are JSON, one per datagram; descriptors travel as `SCM_RIGHTS`.

use serde::{Deserialize, Serialize};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

#[path = "init_remount.rs"]
mod remount;

/// The argument that makes the daemon binary run as a sandbox init.
pub const ARG: &str = "__abx-sandbox-init";

/// The largest message (a spawn request with its argv and environment).
pub const MAX_MSG: usize = 192 * 1024;

/// The descriptor the socket is on in the init.
const SOCK_FD: RawFd = 3;

/// What the init builds.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// The sandbox id (the hostname).
    pub id: String,
    /// An empty host directory the composed root is mounted on.
    pub new_root: PathBuf,
    /// Host directory bound at `/workspace`.
    pub workspace: PathBuf,
    /// Host directory bound at `/tmp`.
    pub tmp: PathBuf,
    /// `none`, `internet` or `host`: a new network namespace unless `host`.
    pub network: String,
    /// Lines for `uid_map` and `gid_map` (`inside outside count`).
    pub uid_map: String,
    /// See `uid_map`.
    pub gid_map: String,
    /// The uid/gid the sandbox's processes have inside.
    pub inner_uid: u32,
    /// See `inner_uid`.
    pub inner_gid: u32,
    /// Top-level host directories bound read-only (or recreated as symlinks).
    pub system: Vec<String>,
    /// Entries of the host `/etc` bound read-only.
    pub etc: Vec<String>,
    /// Size of `/dev/shm` in bytes.
    pub shm_size: u64,
    /// Restrict with Landlock (when the kernel has it).
    pub landlock: bool,
    /// `RLIMIT_NPROC` inside the sandbox's user namespace.
    pub nproc: Option<u64>,
    /// `RLIMIT_FSIZE`: the largest file a process may write.
    pub fsize: Option<u64>,
    /// An image root (a template): the sandbox's `/` is the image, with a writable layer of
    /// its own, instead of the host's system directories.
    #[serde(default)]
    pub image: Option<ImageRoot>,
    /// Host directories mounted into the sandbox (issue 43); their descriptors travel beside
    /// the config, in this order.
    #[serde(default)]
    pub mounts: Vec<crate::workspace::mounts::InitMount>,
    /// The descriptors of `mounts` (the daemon's side only).
    #[serde(skip)]
    pub fds: Vec<std::sync::Arc<OwnedFd>>,
}

/// The descriptors of the mounts' sources or trees, as the init holds them (in the order of
/// [`Config::mounts`]).
static MOUNT_FDS: std::sync::Mutex<Vec<RawFd>> = std::sync::Mutex::new(Vec::new());

/// The root of a sandbox made from an image.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRoot {
    /// The image's flattened tree (read-only lower layer of an overlay); None: `upper` is a
    /// full copy of it and is bound as the root (where overlayfs is refused).
    pub lower: Option<PathBuf>,
    /// The sandbox's own writable layer.
    pub upper: PathBuf,
    /// overlayfs's work directory (beside `upper`).
    pub work: PathBuf,
}

/// A request of the daemon.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// Start a process. Without `pty` the datagram carries its stdin, stdout and stderr.
    Spawn {
        /// Request number.
        seq: u64,
        /// The program and its arguments (`argv[0]` found on the env's `PATH`).
        argv: Vec<String>,
        /// `KEY=VALUE` entries.
        env: Vec<String>,
        /// Working directory (a sandbox path).
        cwd: String,
        /// Run on a new pty of the sandbox's devpts with this size (rows, cols).
        pty: Option<(u16, u16)>,
    },
    /// Connect to `port` on the sandbox's loopback; the answer carries the socket.
    Connect {
        /// Request number.
        seq: u64,
        /// TCP port.
        port: u16,
    },
    /// A listening TCP socket on the sandbox's `127.0.0.1` (an ephemeral port), whose
    /// connections the daemon accepts: the way out of a sandbox with a network policy (its
    /// egress proxy, issue 44). The answer is `Connected` carrying it.
    Listen {
        /// Request number.
        seq: u64,
    },
    /// An `O_PATH` descriptor of the sandbox's `/` (`files/*` resolve beneath it); the
    /// answer is `Connected` carrying it.
    Root {
        /// Request number.
        seq: u64,
    },
    /// Mount overlay `mount` (an index into [`Config::mounts`]) again, as at start, so the
    /// sandbox sees what `sandbox/discard` removed from its upper dir (init_remount.rs).
    /// Answered `Done` or `Failed`.
    Remount {
        /// Request number.
        seq: u64,
        /// The mount's index.
        mount: usize,
    },
    /// Send `sig` to every process of the sandbox but the init.
    SignalAll {
        /// Request number.
        seq: u64,
        /// The signal.
        sig: i32,
    },
}

/// What the init tells the daemon.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Event {
    /// The sandbox is built; requests are served.
    Ready {
        /// Microseconds the inner process took to build the sandbox.
        #[serde(default)]
        setup_us: u64,
        /// Microseconds it then waited for the outer process to join the cgroup.
        #[serde(default)]
        join_wait_us: u64,
    },
    /// Building the sandbox failed (the init exits).
    SetupFailed {
        /// What failed, with the OS error.
        error: String,
    },
    /// A process started; the datagram carries its pidfd (and the pty master).
    Spawned {
        /// Request number.
        seq: u64,
        /// Its pid inside the sandbox.
        pid: i32,
    },
    /// A request failed.
    Failed {
        /// Request number.
        seq: u64,
        /// The OS error.
        errno: i32,
        /// The step (`chdir`, `exec`, `pty`, `connect`, ...).
        what: String,
    },
    /// Connected; the datagram carries the socket.
    Connected {
        /// Request number.
        seq: u64,
    },
    /// Done (`SignalAll`).
    Done {
        /// Request number.
        seq: u64,
    },
    /// A started process ended (`status` as from `waitpid`).
    Exit {
        /// Its pid inside the sandbox.
        pid: i32,
        /// The wait status.
        status: i32,
    },
}

// ---------------------------------------------------------------------------------------
// Datagrams with descriptors (both sides).

/// Send one datagram with descriptors.
pub fn send(fd: RawFd, data: &[u8], fds: &[RawFd], flags: libc::c_int) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr and control buffer are built on the stack with CMSG_* sizes.
    unsafe {
        let space = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize;
        let mut cbuf = vec![0u8; space.max(1)];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
        let n = libc::sendmsg(fd, &msg, flags | libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receive one datagram (0 bytes: the peer closed) with its descriptors (close-on-exec).
pub fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as in `send`; received descriptors are taken into OwnedFd once.
    unsafe {
        let space = libc::CMSG_SPACE((8 * std::mem::size_of::<RawFd>()) as u32) as usize;
        let mut cbuf = vec![0u8; space];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let n = libc::recvmsg(fd, &mut msg, flags | libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fds = Vec::new();
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let count = len / std::mem::size_of::<RawFd>();
                let p = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(p.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        if msg.msg_flags & libc::MSG_TRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "message larger than the limit",
            ));
        }
        Ok((n as usize, fds))
    }
}

// ---------------------------------------------------------------------------------------
// The init program.

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

fn check(rc: libc::c_long, what: &str) -> Result<(), String> {
    if rc < 0 {
        Err(os_err(what))
    } else {
        Ok(())
    }
}

fn cstr(p: impl AsRef<Path>) -> CString {
    CString::new(p.as_ref().as_os_str().as_bytes()).unwrap_or_default()
}

fn write_file(path: &str, data: &[u8]) -> Result<(), String> {
    std::fs::write(path, data).map_err(|e| format!("writing {path}: {e}"))
}

fn emit(ev: &Event, fds: &[RawFd]) {
    if let Ok(b) = serde_json::to_vec(ev) {
        let _ = send(SOCK_FD, &b, fds, 0);
    }
}

/// Entry point of `<binary> __abx-sandbox-init [N | zygote]`. Never returns.
///
/// With `zygote` it is the daemon's one [zygote](zygote): a small single-threaded process
/// that forks a sandbox's outer process per request, so a sandbox costs a `fork` of a small
/// process instead of an `exec` of the daemon's binary. Otherwise it is one sandbox's outer
/// process with `N` cgroup `cgroup.procs` on fds 4.. (the probe, and without a zygote).
pub fn main() -> ! {
    let arg = std::env::args().nth(2).unwrap_or_default();
    if arg == ZYGOTE {
        zygote();
    }
    let n: i32 = arg.parse().unwrap_or(0);
    run_outer(n, false)
}

fn run_outer(cgroups: i32, early: bool) -> ! {
    let code = match outer(cgroups.clamp(0, MAX_CGROUP_FDS as i32), early) {
        Ok(c) => c,
        Err(e) => {
            emit(&Event::SetupFailed { error: e }, &[]);
            125
        }
    };
    // SAFETY: leaving the process (no Rust destructors left to run that matter).
    unsafe { libc::_exit(code) }
}

/// The second argument that makes the init program a zygote.
pub const ZYGOTE: &str = "zygote";

/// The most cgroup hierarchies a sandbox joins (v1: one per controller).
pub const MAX_CGROUP_FDS: usize = 8;

/// A request to the zygote: start one sandbox's outer process. The datagram carries the
/// init's socket, then `cgroups` `cgroup.procs` descriptors.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZygoteRequest {
    /// Request number (answered in order, but checked).
    pub seq: u64,
    /// How many of the descriptors after the socket are `cgroup.procs` files.
    pub cgroups: usize,
    /// Join the cgroup at once, before the config comes (a spare made ahead of time),
    /// instead of joining the inner process while it builds the root.
    #[serde(default)]
    pub early: bool,
}

/// The zygote's answer; on success the datagram carries the outer process's pidfd.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZygoteAnswer {
    /// The request's number.
    pub seq: u64,
    /// The outer process's pid (in the daemon's PID namespace); 0 on failure.
    pub pid: i32,
    /// Why it failed.
    pub error: Option<String>,
}

/// The zygote: fork an outer process per request, reap them, exit when the daemon's end of
/// the socket closes. It holds no descriptor but its socket between requests.
fn zygote() -> ! {
    let sfd = sigchld_fd();
    let mut buf = vec![0u8; 4096];
    loop {
        let Some((sock, child)) = wait_sock_or_child(sfd) else {
            continue;
        };
        if child {
            // SAFETY: reaping our own children.
            unsafe { while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {} }
        }
        if !sock {
            continue;
        }
        let (n, got) = match recv(SOCK_FD, &mut buf, libc::MSG_DONTWAIT) {
            Ok((0, _)) => break,
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => continue,
            Err(_) => break,
        };
        let Ok(req) = serde_json::from_slice::<ZygoteRequest>(&buf[..n]) else {
            continue;
        };
        let answer = |pid: i32, error: Option<String>, fds: &[RawFd]| {
            if let Ok(b) = serde_json::to_vec(&ZygoteAnswer {
                seq: req.seq,
                pid,
                error,
            }) {
                let _ = send(SOCK_FD, &b, fds, 0);
            }
        };
        if got.is_empty() || req.cgroups > MAX_CGROUP_FDS || got.len() != 1 + req.cgroups {
            answer(0, Some("malformed zygote request".into()), &[]);
            continue;
        }
        // SAFETY: fork in a single-threaded process; the child only rearranges descriptors
        // and signal state, then runs the outer process's code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            answer(0, Some(os_err("fork")), &[]);
            continue;
        }
        if pid == 0 {
            // SAFETY: descriptor and signal calls in the fresh child.
            unsafe {
                libc::close(sfd);
                // Sources out of the way first (one may sit on a target number).
                let mut high = [0 as RawFd; 1 + MAX_CGROUP_FDS];
                for (i, f) in got.iter().enumerate() {
                    high[i] = libc::fcntl(f.as_raw_fd(), libc::F_DUPFD, 64);
                }
                libc::close(SOCK_FD);
                for (i, &h) in high.iter().enumerate().take(got.len()) {
                    if h < 0 || libc::dup2(h, SOCK_FD + i as RawFd) < 0 {
                        libc::_exit(125);
                    }
                }
                libc::syscall(
                    libc::SYS_close_range,
                    (SOCK_FD as usize + got.len()) as u32,
                    u32::MAX,
                    0,
                );
                std::mem::forget(got);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            }
            run_outer(req.cgroups as i32, req.early);
        }
        drop(got);
        // SAFETY: pidfd_open of our own child (not yet reaped: SIGCHLD is handled above).
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if pidfd < 0 {
            let e = os_err("pidfd_open");
            // SAFETY: killing our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            answer(0, Some(e), &[]);
            continue;
        }
        answer(pid, None, &[pidfd as RawFd]);
        // SAFETY: our copy of the pidfd, sent.
        unsafe { libc::close(pidfd as RawFd) };
    }
    // SAFETY: leaving the process; the outer processes live on (each ends with its socket).
    unsafe { libc::_exit(0) }
}

/// The inner process's pid, for the outer's SIGTERM handler.
static INNER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_term(_: libc::c_int) {
    let pid = INNER.load(std::sync::atomic::Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

fn outer(cgroups: i32, early: bool) -> Result<i32, String> {
    // A spare joins its cgroup now, while it waits for a sandbox to be asked for: the inner
    // process is then born in it.
    let cgroups = if early {
        for fd in 4..4 + cgroups {
            // SAFETY: write(2) of a constant on an inherited descriptor, then close it.
            unsafe {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(os_err("joining the sandbox's cgroup"));
                }
                libc::close(fd);
            }
        }
        0
    } else {
        cgroups
    };
    let mut buf = vec![0u8; MAX_MSG];
    let (n, fds) = recv(SOCK_FD, &mut buf, 0).map_err(|e| format!("reading the config: {e}"))?;
    let cfg: Config =
        serde_json::from_slice(&buf[..n]).map_err(|e| format!("reading the config: {e}"))?;
    drop(buf);
    if fds.len() != cfg.mounts.len() {
        return Err(format!(
            "the config names {} mounts and came with {} descriptors",
            cfg.mounts.len(),
            fds.len()
        ));
    }
    *MOUNT_FDS.lock().unwrap_or_else(|e| e.into_inner()) = fds
        .into_iter()
        .map(std::os::fd::IntoRawFd::into_raw_fd)
        .collect();
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    if cfg.network != "host" {
        flags |= libc::CLONE_NEWNET;
    }
    // A helper left in this user namespace writes the maps when they name ids other than our
    // own (a root daemon mapping the sandbox to an unprivileged uid): that needs CAP_SETUID
    // here, which the process that made the new namespace no longer has.
    let own = format!("{} {} 1", cfg.inner_uid, unsafe { libc::geteuid() });
    let helper = if cfg.uid_map.trim() != own.trim() {
        Some(map_helper(&cfg)?)
    } else {
        None
    };
    // SAFETY: plain system calls in a single-threaded process.
    check(unsafe { libc::unshare(flags) } as _, "unshare")?;
    match helper {
        Some((pid, go)) => {
            // SAFETY: a byte on our own pipe, then waiting for our own child.
            unsafe {
                libc::write(go.as_raw_fd(), b"g".as_ptr().cast(), 1);
                drop(go);
                let mut st = 0;
                libc::waitpid(pid, &mut st, 0);
                if !(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0) {
                    return Err(format!(
                        "writing the uid/gid maps failed (helper status {st})"
                    ));
                }
            }
        }
        None => {
            match std::fs::write("/proc/self/setgroups", b"deny") {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("writing /proc/self/setgroups: {e}")),
            }
            write_file("/proc/self/uid_map", cfg.uid_map.as_bytes())?;
            write_file("/proc/self/gid_map", cfg.gid_map.as_bytes())?;
        }
    }
    // The inner process waits on this pipe before it says Ready: by then it is in the
    // sandbox's cgroup.
    let mut joined = [0; 2];
    // SAFETY: pipe2 into a local array.
    check(
        unsafe { libc::pipe2(joined.as_mut_ptr(), libc::O_CLOEXEC) } as _,
        "pipe",
    )?;
    // The outer process mounts an overlay again when PID 1 asks (init_remount.rs).
    let helper = remount::prepare(&cfg)?;
    // SAFETY: fork in a single-threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(os_err("fork"));
    }
    if pid == 0 {
        if let Some((ours, theirs)) = helper {
            drop(ours);
            remount::keep(theirs);
        }
        // SAFETY: the inner keeps the read end only, and no cgroup descriptor.
        unsafe {
            libc::close(joined[1]);
            for fd in 4..4 + cgroups {
                libc::close(fd);
            }
        }
        inner(&cfg, joined[0]);
    }
    INNER.store(pid, std::sync::atomic::Ordering::Relaxed);
    // The mounts are the inner process's.
    for fd in std::mem::take(&mut *MOUNT_FDS.lock().unwrap_or_else(|e| e.into_inner())) {
        // SAFETY: closing descriptors we own.
        unsafe { libc::close(fd) };
    }
    // SAFETY: installing an async-signal-safe handler; closing our read end.
    unsafe {
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
        libc::close(joined[0]);
    }
    // Join the sandbox's cgroup (its `cgroup.procs` are fds 4..4+n) with the inner process,
    // the ancestor of every process of the sandbox, while it builds the root: a cgroup
    // migration waits for an RCU grace period (milliseconds), which then costs no time.
    let pid_text = pid.to_string();
    for fd in 4..4 + cgroups {
        // SAFETY: write(2) of a local buffer on an inherited descriptor, then close it.
        let ok = unsafe {
            let n = libc::write(fd, pid_text.as_ptr().cast(), pid_text.len());
            libc::close(fd);
            n == pid_text.len() as isize
        };
        if !ok {
            let e = os_err("joining the sandbox's cgroup");
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            return Err(e);
        }
    }
    // SAFETY: telling the inner process, then closing our copy of the socket (the inner
    // process owns it now).
    unsafe {
        libc::write(joined[1], b"j".as_ptr().cast(), 1);
        libc::close(joined[1]);
        libc::close(SOCK_FD);
    }
    if let Some((ours, theirs)) = helper {
        drop(theirs);
        remount::serve_outer(&cfg, ours, pid);
    }
    loop {
        let mut st = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            return Ok(if libc::WIFEXITED(st) {
                libc::WEXITSTATUS(st)
            } else {
                128 + libc::WTERMSIG(st)
            });
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Ok(1);
        }
    }
}

/// Fork a child that waits for a byte on a pipe, then writes the maps of its parent.
fn map_helper(cfg: &Config) -> Result<(i32, OwnedFd), String> {
    let mut p = [0; 2];
    // SAFETY: pipe2 into a local array.
    check(
        unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } as _,
        "pipe",
    )?;
    // SAFETY: the fds were just made.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    let parent = unsafe { libc::getpid() };
    // SAFETY: fork in a single-threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(os_err("fork"));
    }
    if pid == 0 {
        drop(w);
        let mut b = [0u8; 1];
        // SAFETY: reading one byte into a local buffer.
        let n = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
        // setgroups stays allowed: the sandbox's init drops its supplementary groups.
        let ok = n == 1
            && std::fs::write(format!("/proc/{parent}/uid_map"), cfg.uid_map.as_bytes()).is_ok()
            && std::fs::write(format!("/proc/{parent}/gid_map"), cfg.gid_map.as_bytes()).is_ok();
        // SAFETY: leaving the helper without running the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    drop(r);
    Ok((pid, w))
}

/// PID 1 of the sandbox. `joined`: the read end of the pipe on which the outer process says
/// that this process is in the sandbox's cgroup.
fn inner(cfg: &Config, joined: RawFd) -> ! {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    // The sandbox's directories are opened with the creator's host credentials (a root
    // daemon's data dir is under /root, which the sandbox's unprivileged host uid cannot
    // walk), then the process becomes the sandbox's user and binds them through the fds.
    let mut cfg = cfg.clone();
    let mut keep = Vec::new();
    if let Err(e) = reopen_sources(&cfg) {
        emit(&Event::SetupFailed { error: e }, &[]);
        // SAFETY: leaving the process.
        unsafe { libc::_exit(125) };
    }
    let mut paths = vec![&mut cfg.workspace, &mut cfg.tmp];
    if let Some(img) = cfg.image.as_mut() {
        paths.push(&mut img.upper);
        paths.push(&mut img.work);
        if let Some(l) = img.lower.as_mut() {
            paths.push(l);
        }
    }
    for m in cfg.mounts.iter_mut() {
        if let Some(u) = m.upper.as_mut() {
            paths.push(u);
        }
        if let Some(w) = m.work.as_mut() {
            paths.push(w);
        }
    }
    for p in paths {
        match std::fs::File::open(&*p) {
            Ok(f) => {
                *p = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
                keep.push(f);
            }
            Err(e) => {
                emit(
                    &Event::SetupFailed {
                        error: format!("opening {}: {e}", p.display()),
                    },
                    &[],
                );
                // SAFETY: leaving the process.
                unsafe { libc::_exit(125) };
            }
        }
    }
    let cfg = &cfg;
    let started = std::time::Instant::now();
    if let Err(e) = prepare_root(cfg)
        .and_then(|_| become_inner_user(cfg))
        .and_then(|_| build_root(cfg))
        .and_then(|_| remount::hand_over())
        .and_then(|_| {
            drop(std::mem::take(&mut keep));
            for fd in std::mem::take(&mut *MOUNT_FDS.lock().unwrap_or_else(|e| e.into_inner())) {
                // SAFETY: closing descriptors we own (the mounts hold what they need).
                unsafe { libc::close(fd) };
            }
            lock_down(cfg)
        })
    {
        emit(&Event::SetupFailed { error: e }, &[]);
        // SAFETY: leaving the process.
        unsafe { libc::_exit(125) };
    }
    // Ready only once in the sandbox's cgroup (nothing is started before).
    let setup_us = started.elapsed().as_micros() as u64;
    let mut b = [0u8; 1];
    // SAFETY: reading one byte from our pipe, then closing it.
    let n = unsafe {
        let n = libc::read(joined, b.as_mut_ptr().cast(), 1);
        libc::close(joined);
        n
    };
    if n != 1 {
        // The outer process failed to join the cgroup (and said so).
        // SAFETY: leaving the process.
        unsafe { libc::_exit(125) };
    }
    emit(
        &Event::Ready {
            setup_us,
            join_wait_us: (started.elapsed().as_micros() as u64).saturating_sub(setup_us),
        },
        &[],
    );
    serve();
}

fn become_inner_user(cfg: &Config) -> Result<(), String> {
    // SAFETY: credential calls with integer arguments.
    unsafe {
        // A root daemon's supplementary groups (root's) must not follow into the sandbox. Only
        // possible where setgroups is allowed (maps written by the privileged helper).
        if libc::geteuid() != cfg.inner_uid && libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(os_err("dropping supplementary groups"));
        }
        if libc::getegid() != cfg.inner_gid {
            check(
                libc::setresgid(cfg.inner_gid, cfg.inner_gid, cfg.inner_gid) as _,
                "setresgid",
            )?;
        }
        if libc::geteuid() != cfg.inner_uid {
            check(
                libc::setresuid(cfg.inner_uid, cfg.inner_uid, cfg.inner_uid) as _,
                "setresuid",
            )?;
        }
    }
    Ok(())
}

fn mount(
    src: Option<&CStr>,
    dst: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> libc::c_long {
    // SAFETY: mount(2) with valid C strings or nulls.
    unsafe {
        libc::mount(
            src.map_or(std::ptr::null(), |s| s.as_ptr()),
            dst.as_ptr(),
            fstype.map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data.map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        ) as libc::c_long
    }
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Set attributes on a whole mount tree (`mount_setattr`, Linux 5.12; a non-recursive
/// remount before).
fn set_attrs(path: &CStr, set: u64) -> Result<(), String> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr with a struct on the stack.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_RECURSIVE as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // Before 5.12: remount the top mount only, keeping the flags the kernel locked.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs into a local struct.
    unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    let mut flags = libc::MS_REMOUNT
        | libc::MS_BIND
        | ((st.f_flag as libc::c_ulong)
            & (libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY));
    if set & MOUNT_ATTR_RDONLY != 0 {
        flags |= libc::MS_RDONLY;
    }
    if set & MOUNT_ATTR_NOSUID != 0 {
        flags |= libc::MS_NOSUID;
    }
    if set & MOUNT_ATTR_NODEV != 0 {
        flags |= libc::MS_NODEV;
    }
    check(
        mount(None, path, None, flags, None),
        &format!("read-only remount of {}", path.to_string_lossy()),
    )
}

fn bind(src: &Path, dst: &Path, set: u64) -> Result<(), String> {
    let (s, d) = (cstr(src), cstr(dst));
    check(
        mount(Some(&s), &d, None, libc::MS_BIND | libc::MS_REC, None),
        &format!("bind-mounting {}", src.display()),
    )?;
    if set != 0 {
        set_attrs(&d, set)?;
    }
    Ok(())
}

fn mkdir(p: &Path) -> Result<(), String> {
    match std::fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("creating {}: {e}", p.display())),
    }
}

fn touch(p: &Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .map(drop)
        .map_err(|e| format!("creating {}: {e}", p.display()))
}

fn symlink(target: &Path, p: &Path) -> Result<(), String> {
    std::os::unix::fs::symlink(target, p).map_err(|e| format!("creating {}: {e}", p.display()))
}

/// Bind a host entry (directory or file) read-only at `dst`, or recreate it as a symlink.
/// Missing entries are skipped.
fn carry(host: &Path, dst: &Path, set: u64) -> Result<(), String> {
    let Ok(meta) = std::fs::symlink_metadata(host) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        let t = std::fs::read_link(host).map_err(|e| format!("{}: {e}", host.display()))?;
        return symlink(&t, dst);
    }
    if meta.is_dir() {
        mkdir(dst)?;
    } else if meta.is_file() {
        touch(dst)?;
    } else {
        return Ok(());
    }
    bind(host, dst, set)
}

const RO: u64 = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;

/// With the creator's credentials: a private mount tree, the root tmpfs (owned by the
/// sandbox's user) on `new_root`, and the working directory in it. The rest of the root is
/// built relative to it, so nothing above `new_root` (a root daemon's data dir is under
/// `/root`) needs to be walked as the sandbox's user.
/// The directory holding an image sandbox's `.root`, opened with the creator's credentials.
static IMAGE_PARENT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

trait IntoRawKeep {
    fn into_raw_fd_keep(self) -> RawFd;
}
impl IntoRawKeep for OwnedFd {
    fn into_raw_fd_keep(self) -> RawFd {
        std::os::fd::IntoRawFd::into_raw_fd(self)
    }
}

/// The descriptor behind a `/proc/self/fd/N` path (see [`inner`]), else the path opened.
fn dir_fd(p: &Path) -> Result<(RawFd, Option<OwnedFd>), String> {
    if let Some(n) = p
        .to_str()
        .and_then(|s| s.strip_prefix("/proc/self/fd/"))
        .and_then(|n| n.parse::<RawFd>().ok())
    {
        return Ok((n, None));
    }
    let f = std::fs::File::open(p).map_err(|e| format!("opening {}: {e}", p.display()))?;
    let f = OwnedFd::from(f);
    Ok((f.as_raw_fd(), Some(f)))
}

/// Mount an overlay of `lower` (read-only) and `upper` at `target`, its layers given by
/// descriptor (the new mount API: `fsopen`, `fsconfig(FSCONFIG_SET_FD)`, `fsmount`,
/// `move_mount`): the paths beneath a root daemon's data dir cannot be walked by the
/// sandbox's user, and a path string would be looked up with its credentials.
fn mount_overlay(
    lower: &Path,
    upper: &Path,
    work: &Path,
    at: RawFd,
    target: &Path,
    attrs: u64,
) -> Result<(), String> {
    let (l, _lk) = dir_fd(lower)?;
    let (u, _uk) = dir_fd(upper)?;
    let (w, _wk) = dir_fd(work)?;
    let m = overlay_fd(l, u, w, attrs)?;
    let t = cstr(target);
    // SAFETY: move_mount between a descriptor we hold and a C string.
    if unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            m.as_raw_fd(),
            c"".as_ptr(),
            at,
            t.as_ptr(),
            4u32, /* MOVE_MOUNT_F_EMPTY_PATH */
        )
    } < 0
    {
        return Err(os_err("move_mount"));
    }
    Ok(())
}

/// A detached overlay of the layers `l` (read-only), `u` and `w` (descriptors), with
/// `userxattr` and the mount attributes `attrs`: the mount's descriptor.
fn overlay_fd(l: RawFd, u: RawFd, w: RawFd, attrs: u64) -> Result<OwnedFd, String> {
    const FSCONFIG_SET_FLAG: u32 = 0;
    const FSCONFIG_SET_FD: u32 = 5;
    const FSCONFIG_CMD_CREATE: u32 = 6;
    // SAFETY: the new mount API with C strings and descriptors we hold.
    unsafe {
        let fs = libc::syscall(libc::SYS_fsopen, c"overlay".as_ptr(), 1u32);
        if fs < 0 {
            return Err(os_err("fsopen"));
        }
        let fs = OwnedFd::from_raw_fd(fs as RawFd);
        let cfg = |cmd: u32, key: Option<&CStr>, aux: RawFd, what: &str| -> Result<(), String> {
            let k = key.map_or(std::ptr::null(), |k| k.as_ptr());
            if libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                cmd,
                k,
                std::ptr::null::<u8>(),
                aux,
            ) < 0
            {
                return Err(os_err(what));
            }
            Ok(())
        };
        cfg(FSCONFIG_SET_FLAG, Some(c"userxattr"), 0, "userxattr")?;
        cfg(FSCONFIG_SET_FD, Some(c"lowerdir+"), l, "lowerdir")?;
        cfg(FSCONFIG_SET_FD, Some(c"upperdir"), u, "upperdir")?;
        cfg(FSCONFIG_SET_FD, Some(c"workdir"), w, "workdir")?;
        cfg(FSCONFIG_CMD_CREATE, None, 0, "creating the overlay")?;
        let m = libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), 1u32, attrs);
        if m < 0 {
            return Err(os_err("fsmount"));
        }
        Ok(OwnedFd::from_raw_fd(m as RawFd))
    }
}

/// A user's daemon passes each mount's source as an `O_PATH` descriptor of the daemon's
/// mount namespace, which this one cannot clone: open the same real path here, without
/// following any symlink, and keep it only when it is the same directory (device and
/// inode) as the descriptor, which the daemon checked. A root daemon's trees are ready.
fn reopen_sources(cfg: &Config) -> Result<(), String> {
    let mut fds = MOUNT_FDS.lock().unwrap_or_else(|e| e.into_inner());
    for (m, fd) in cfg.mounts.iter().zip(fds.iter_mut()) {
        if m.tree {
            continue;
        }
        let given = crate::workspace::mounts::fstat(*fd).map_err(|e| format!("fstat: {e}"))?;
        let how = OpenHow {
            flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
            mode: 0,
            resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        let p = cstr(&m.source);
        // SAFETY: openat2 with a C string and a struct on the stack.
        let n = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                libc::AT_FDCWD,
                p.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        let refused =
            |why: String| format!("E2010 mount of '{}' refused: {why}", m.source.display());
        if n < 0 {
            return Err(refused(format!(
                "it cannot be opened again without following a symlink ({})",
                io::Error::last_os_error()
            )));
        }
        let n = n as RawFd;
        let st = crate::workspace::mounts::fstat(n);
        let same = st.as_ref().is_ok_and(|st| {
            st.st_dev == given.st_dev
                && st.st_ino == given.st_ino
                && st.st_dev == m.dev
                && st.st_ino == m.ino
        });
        if !same {
            // SAFETY: closing our descriptor.
            unsafe { libc::close(n) };
            return Err(refused(
                "its path no longer leads to the directory that was checked".into(),
            ));
        }
        // SAFETY: replacing our descriptor.
        unsafe { libc::close(*fd) };
        *fd = n;
    }
    Ok(())
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;

/// Walk `rel` beneath `.` (the new root) component by component, never following a
/// symlink, making missing directories when `make`. Returns an `O_PATH` descriptor.
fn walk_beneath(rel: &Path, make: bool) -> Result<OwnedFd, String> {
    let open = |at: RawFd, name: &CStr| -> RawFd {
        // SAFETY: openat with a C string.
        unsafe {
            libc::openat(
                at,
                name.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        }
    };
    let d = open(libc::AT_FDCWD, c".");
    if d < 0 {
        return Err(os_err("opening the root"));
    }
    // SAFETY: just opened.
    let mut dir = unsafe { OwnedFd::from_raw_fd(d) };
    for c in rel.components() {
        let std::path::Component::Normal(name) = c else {
            continue;
        };
        let name = cstr(name);
        if make {
            // A directory fd for mkdirat: O_PATH descriptors serve as dirfds.
            // SAFETY: mkdirat with a C string.
            let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) };
            if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                return Err(os_err(&format!(
                    "creating the mount point {}",
                    rel.display()
                )));
            }
        }
        let n = open(dir.as_raw_fd(), &name);
        if n < 0 {
            return Err(os_err(&format!(
                "the mount point /{} (a symlink, or not a directory)",
                rel.display()
            )));
        }
        // SAFETY: just opened.
        dir = unsafe { OwnedFd::from_raw_fd(n) };
    }
    Ok(dir)
}

/// Mount the host directories (issue 43) beneath `.`, the sandbox's root, shallowest target
/// first: each source's tree (read-only for `ro` and as an overlay's lower layer; never suid
/// or devices) on its target, and an overlay's writable layer on top of it.
fn mount_workspaces(cfg: &Config) -> Result<(), String> {
    use crate::workspace::mounts as m;
    use abx_protocol::api::MountMode;
    if cfg.mounts.is_empty() {
        return Ok(());
    }
    let fds = MOUNT_FDS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut order: Vec<usize> = (0..cfg.mounts.len()).collect();
    order.sort_by_key(|&i| Path::new(&cfg.mounts[i].target).components().count());
    for i in order {
        let mc = &cfg.mounts[i];
        let rel = Path::new(mc.target.trim_start_matches('/'));
        let fail = |what: &str, e: String| {
            format!(
                "mounting {} at {}: {what}: {e}",
                mc.source.display(),
                mc.target
            )
        };
        let at = walk_beneath(rel, true).map_err(|e| fail("its mount point", e))?;
        let tree = if mc.tree {
            // SAFETY: the daemon's tree, ours now (closed with the others after the build).
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fds[i]) }
                .try_clone_to_owned()
                .map_err(|e| fail("dup", e.to_string()))?
        } else {
            let t = m::clone_tree(fds[i]).map_err(|e| fail("open_tree", e.to_string()))?;
            m::set_tree_attrs(t.as_raw_fd(), m::attrs(mc.mode), None)
                .map_err(|e| fail("mount_setattr", e.to_string()))?;
            t
        };
        // SAFETY: move_mount between descriptors we hold.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                c"".as_ptr(),
                at.as_raw_fd(),
                c"".as_ptr(),
                4u32 | 0x40u32, /* MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH */
            )
        };
        if rc < 0 {
            return Err(fail("move_mount", os_err("move_mount")));
        }
        drop(at);
        remount::note_tree(
            i,
            &walk_beneath(rel, false).map_err(|e| fail("its tree", e))?,
        )?;
        if mc.mode != MountMode::Overlay {
            continue;
        }
        // The tree just mounted is the lower layer; the overlay goes on top of it.
        let lower = walk_beneath(rel, false).map_err(|e| fail("its tree", e))?;
        let lower_rd = {
            // SAFETY: reopening our O_PATH descriptor for reading (fsconfig wants a dir fd).
            let n = unsafe {
                libc::openat(
                    lower.as_raw_fd(),
                    c".".as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            if n < 0 {
                return Err(fail("opening its tree", os_err("open")));
            }
            // SAFETY: just opened.
            unsafe { OwnedFd::from_raw_fd(n) }
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        let parent_fd = walk_beneath(parent, false).map_err(|e| fail("its parent", e))?;
        let name = rel.file_name().map(Path::new).unwrap_or(Path::new("."));
        let (Some(upper), Some(work)) = (&mc.upper, &mc.work) else {
            return Err(fail("the overlay", "no layers".into()));
        };
        mount_overlay(
            &PathBuf::from(format!("/proc/self/fd/{}", lower_rd.as_raw_fd())),
            upper,
            work,
            parent_fd.as_raw_fd(),
            name,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        )
        .map_err(|e| fail("the overlay", e))?;
    }
    Ok(())
}

fn prepare_root(cfg: &Config) -> Result<(), String> {
    check(
        mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None),
        "making the mount tree private",
    )?;
    if let Some(img) = &cfg.image {
        if img.lower.is_some() {
            // Mounted once the process is the sandbox's user (the overlay's mounter, owner
            // of its layers), on `.root` beneath this directory (reached by descriptor: the
            // user cannot walk a root daemon's data dir).
            let parent = cfg.new_root.parent().unwrap_or(Path::new("/"));
            let f = std::fs::File::open(parent)
                .map_err(|e| format!("opening {}: {e}", parent.display()))?;
            IMAGE_PARENT.store(OwnedFd::from(f).into_raw_fd_keep(), Ordering::Relaxed);
            return Ok(());
        }
        bind(&img.upper, &cfg.new_root, MOUNT_ATTR_NODEV)?;
        // SAFETY: chdir with a C string we hold.
        return check(
            unsafe { libc::chdir(cstr(&cfg.new_root).as_ptr()) } as _,
            "entering the image root",
        );
    }
    let opts = CString::new(format!(
        "mode=0755,size=1m,uid={},gid={}",
        cfg.inner_uid, cfg.inner_gid
    ))
    .unwrap_or_default();
    check(
        mount(
            Some(c"tmpfs"),
            &cstr(&cfg.new_root),
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&opts),
        ),
        "mounting the root tmpfs",
    )?;
    // SAFETY: chdir with a C string we hold.
    check(
        unsafe { libc::chdir(cstr(&cfg.new_root).as_ptr()) } as _,
        "entering the root tmpfs",
    )
}

fn build_root(cfg: &Config) -> Result<(), String> {
    let r = Path::new(".");
    let rc = cstr(r);
    if cfg.image.is_some() {
        return build_image_root(cfg);
    }
    for name in &cfg.system {
        carry(&Path::new("/").join(name), &r.join(name), RO)?;
    }
    // /etc: a tmpfs directory with a read-only subset of the host's, and generated files.
    let etc = r.join("etc");
    mkdir(&etc)?;
    for name in &cfg.etc {
        let dst = etc.join(name);
        if let Some(parent) = dst.parent().filter(|p| *p != etc) {
            if Path::new("/etc").join(name).exists() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("creating {}: {e}", parent.display()))?;
            }
        }
        carry(&Path::new("/etc").join(name), &dst, RO)?;
    }
    let gen = |name: &str, text: String| {
        let p = etc.join(name);
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, text).map_err(|e| format!("writing /etc/{name}: {e}"))
    };
    gen("hostname", format!("{}\n", cfg.id))?;
    gen(
        "hosts",
        format!(
            "127.0.0.1\tlocalhost {id}\n::1\tlocalhost ip6-localhost ip6-loopback {id}\n",
            id = cfg.id
        ),
    )?;
    let (u, g) = (cfg.inner_uid, cfg.inner_gid);
    let mut passwd = String::from("root:x:0:0:root:/workspace:/bin/sh\n");
    let mut group = String::from("root:x:0:\n");
    if u != 0 {
        passwd.push_str(&format!("sandbox:x:{u}:{g}:sandbox:/workspace:/bin/sh\n"));
    }
    if g != 0 {
        group.push_str(&format!("sandbox:x:{g}:\n"));
    }
    passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    group.push_str("nogroup:x:65534:\n");
    gen("passwd", passwd)?;
    gen("group", group)?;
    if cfg.network != "host" && !etc.join("resolv.conf").exists() {
        gen("resolv.conf", String::new())?;
    }
    mount_common(cfg, r)?;
    mount_workspaces(cfg)?;
    // The root itself read-only.
    check(
        mount(
            None,
            &rc,
            None,
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            None,
        ),
        "making the root read-only",
    )?;
    enter_root(cfg, &rc)
}

/// The sandbox's own directories, a minimal `/dev` and a fresh `/proc`, beneath `r`.
fn mount_common(cfg: &Config, r: &Path) -> Result<(), String> {
    // The sandbox's own directories.
    let ws = r.join("workspace");
    mkdir(&ws)?;
    bind(&cfg.workspace, &ws, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
    let tmp = r.join("tmp");
    mkdir(&tmp)?;
    bind(&cfg.tmp, &tmp, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
    // A minimal /dev.
    let dev = r.join("dev");
    mkdir(&dev)?;
    check(
        mount(
            Some(c"tmpfs"),
            &cstr(&dev),
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(c"mode=0755,size=64k"),
        ),
        "mounting /dev",
    )?;
    for name in ["null", "zero", "full", "random", "urandom", "tty"] {
        let d = dev.join(name);
        touch(&d)?;
        bind(&Path::new("/dev").join(name), &d, MOUNT_ATTR_NOSUID)?;
    }
    let pts = dev.join("pts");
    mkdir(&pts)?;
    check(
        mount(
            Some(c"devpts"),
            &cstr(&pts),
            Some(c"devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(c"newinstance,ptmxmode=0666,mode=0620"),
        ),
        "mounting /dev/pts",
    )?;
    symlink(Path::new("pts/ptmx"), &dev.join("ptmx"))?;
    let shm = dev.join("shm");
    mkdir(&shm)?;
    let shm_opts =
        CString::new(format!("mode=1777,size={}", cfg.shm_size.max(4096))).unwrap_or_default();
    check(
        mount(
            Some(c"tmpfs"),
            &cstr(&shm),
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&shm_opts),
        ),
        "mounting /dev/shm",
    )?;
    symlink(Path::new("/proc/self/fd"), &dev.join("fd"))?;
    for (i, n) in ["stdin", "stdout", "stderr"].iter().enumerate() {
        symlink(&PathBuf::from(format!("/proc/self/fd/{i}")), &dev.join(n))?;
    }
    // A fresh /proc of the sandbox's PID namespace.
    let proc_ = r.join("proc");
    mkdir(&proc_)?;
    check(
        mount(
            Some(c"proc"),
            &cstr(&proc_),
            Some(c"proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        ),
        "mounting /proc",
    )?;
    // The key lists: /proc/keys names every key the sandbox's host uid may view (a user's
    // daemon: the user's own keys, by description). Masked as containers do.
    for name in ["keys", "key-users"] {
        let p = proc_.join(name);
        if p.exists() {
            bind(Path::new("/dev/null"), &p, MOUNT_ATTR_RDONLY)?;
        }
    }
    Ok(())
}

/// The rest of an image root: the image's own `/usr` and `/etc` stay; the sandbox's
/// directories, `/dev` and `/proc` are mounted on it as on the host template.
fn build_image_root(cfg: &Config) -> Result<(), String> {
    if let Some(img) = cfg.image.as_ref().filter(|i| i.lower.is_some()) {
        let parent = IMAGE_PARENT.load(Ordering::Relaxed);
        let name = cfg.new_root.file_name().unwrap_or_default();
        mount_overlay(
            img.lower.as_deref().unwrap_or(Path::new("/")),
            &img.upper,
            &img.work,
            parent,
            Path::new(name),
            MOUNT_ATTR_NODEV,
        )
        .map_err(|e| format!("mounting the image (overlay): {e}"))?;
        // SAFETY: fchdir/chdir/close on our descriptor and a C string we hold.
        unsafe {
            check(libc::fchdir(parent) as _, "entering the sandbox dir")?;
            check(
                libc::chdir(cstr(name).as_ptr()) as _,
                "entering the image root",
            )?;
            libc::close(parent);
        }
    }
    let r = Path::new(".");
    let rc = cstr(r);
    mount_common(cfg, r)?;
    mount_workspaces(cfg)?;
    enter_root(cfg, &rc)
}

/// The last steps of either root: the sandbox's hostname, its loopback (unless it shares
/// the host's network), then the pivot into `rc`.
fn enter_root(cfg: &Config, rc: &CStr) -> Result<(), String> {
    // SAFETY: sethostname with a buffer and its length.
    check(
        unsafe { libc::sethostname(cfg.id.as_ptr().cast(), cfg.id.len()) } as _,
        "sethostname",
    )?;
    if cfg.network != "host" {
        loopback_up()?;
    }
    pivot(rc)
}

fn pivot(rc: &CStr) -> Result<(), String> {
    // SAFETY: chdir/pivot_root/umount2 with valid C strings.
    unsafe {
        check(libc::chdir(rc.as_ptr()) as _, "chdir to the new root")?;
        check(
            libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()),
            "pivot_root",
        )?;
        check(
            libc::umount2(c".".as_ptr(), libc::MNT_DETACH) as _,
            "detaching the old root",
        )?;
        check(libc::chdir(c"/workspace".as_ptr()) as _, "chdir /workspace")?;
    }
    Ok(())
}

/// `ip link set lo up` in the sandbox's network namespace.
fn loopback_up() -> Result<(), String> {
    // SAFETY: a datagram socket and SIOC[GS]IFFLAGS on a zeroed ifreq.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(os_err("socket for loopback"));
        }
        let s = OwnedFd::from_raw_fd(s);
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        check(
            libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) as _,
            "reading loopback flags",
        )?;
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check(
            libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) as _,
            "bringing loopback up",
        )?;
    }
    Ok(())
}

/// Whether the sandbox's Landlock write rule is `/` because of its mounts: an overlay whose
/// target would be a write rule of its own (`/workspace`, or a target outside it) is mounted
/// again on a discard (init_remount.rs), and a rule on the old overlay's root would not cover
/// the new one.
pub(crate) fn writes_beneath_root(cfg: &Config) -> bool {
    cfg.mounts.iter().any(|m| {
        let t = Path::new(&m.target);
        m.mode == abx_protocol::api::MountMode::Overlay
            && (t == Path::new("/workspace") || !t.starts_with("/workspace"))
    })
}

/// Limits, no capabilities, no new privileges, a session keyring of its own and no keyring
/// calls, Landlock: inherited by every process.
fn lock_down(cfg: &Config) -> Result<(), String> {
    let setlim = |res, v: u64| {
        let l = libc::rlimit {
            rlim_cur: v,
            rlim_max: v,
        };
        // SAFETY: setrlimit with a struct on the stack.
        unsafe { libc::setrlimit(res, &l) }
    };
    if let Some(n) = cfg.nproc {
        check(
            setlim(libc::RLIMIT_NPROC, n) as _,
            "setting the process limit",
        )?;
    }
    if let Some(n) = cfg.fsize {
        check(
            setlim(libc::RLIMIT_FSIZE, n) as _,
            "setting the file size limit",
        )?;
    }
    // Not dumpable: processes of the sandbox cannot ptrace the init or open its descriptors.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let prepared = if cfg.landlock && abx_confine::landlock_abi() > 0 {
        let policy = abx_confine::Policy {
            read: vec![PathBuf::from("/")],
            // An image root is the sandbox's own (its writable layer): all of it. So with an
            // overlay mount that must stay writable when it is mounted again (a discard: its
            // target is a rule of its own, and Landlock ties a rule to the inode it had at
            // lock-down): the root tmpfs is read-only, so what `/` adds is what an image
            // sandbox has, its /dev tmpfs and its own /proc (docs/threat-model.md, "Mounts").
            write: if cfg.image.is_some() || writes_beneath_root(cfg) {
                vec![PathBuf::from("/")]
            } else {
                let mut w = vec![
                    PathBuf::from("/workspace"),
                    PathBuf::from("/tmp"),
                    PathBuf::from("/dev/shm"),
                ];
                // Writable mounts elsewhere (an `ro` mount refuses writes itself).
                w.extend(
                    cfg.mounts
                        .iter()
                        .filter(|m| m.mode != abx_protocol::api::MountMode::Ro)
                        .filter(|m| !Path::new(&m.target).starts_with("/workspace"))
                        .map(|m| PathBuf::from(&m.target)),
                );
                w
            },
            exec: None,
            net: abx_confine::Net::Any,
            // Signals and abstract Unix sockets stay inside the sandbox (ABI 6+).
            scoped: true,
        };
        policy.prepare()?
    } else {
        abx_confine::Prepared::refusing_keyrings()
    };
    // An `rw` mount writes host files as their owner: no setuid or setgid bit may be set
    // through it (docs/threat-model.md, "Mounts").
    let prepared = if cfg
        .mounts
        .iter()
        .any(|m| m.mode == abx_protocol::api::MountMode::Rw)
    {
        prepared.refusing_setid()
    } else {
        prepared
    };
    // A session keyring of the sandbox's own, empty: the daemon's (a login's, with the
    // user's keys) is no longer possessed. Then the keyring system calls are refused (the
    // filter), so no key is found by its id nor keyring linked (abx_confine::keyring).
    // SAFETY: keyctl with integer arguments.
    unsafe { abx_confine::keyring::join_fresh_session() }.map_err(|e| {
        let quota = if e == libc::EDQUOT {
            " (each sandbox holds one key of its uid's kernel key quota, kernel.keys.maxkeys)"
        } else {
            ""
        };
        format!(
            "joining a new session keyring: {}{quota}",
            io::Error::from_raw_os_error(e)
        )
    })?;
    // SAFETY: capability and prctl calls with local structs.
    unsafe {
        super::isolate::drop_caps(super::isolate::last_cap(), true).map_err(|code| {
            super::isolate::explain_spawn_error(&io::Error::from_raw_os_error(code))
        })?;
        check(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as _,
            "setting no_new_privs",
        )?;
        abx_confine::restrict_self(&prepared).map_err(|(step, e)| {
            format!(
                "confinement ({step:?}): {}",
                io::Error::from_raw_os_error(e)
            )
        })?;
    }
    Ok(())
}

/// Block SIGCHLD and get it as a signalfd (the zygote's and PID 1's loops).
fn sigchld_fd() -> RawFd {
    // SAFETY: signal mask and signalfd on local sets.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
    }
}

/// Wait for a message on the socket or a child's exit (the signalfd drained): which came,
/// or None when interrupted.
fn wait_sock_or_child(sfd: RawFd) -> Option<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: SOCK_FD,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: sfd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: poll on a local array.
    if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
        return None;
    }
    let child = fds[1].revents != 0;
    if child {
        let mut si = [0u8; 128];
        // SAFETY: draining the signalfd into a local buffer.
        while unsafe { libc::read(sfd, si.as_mut_ptr().cast(), si.len()) } > 0 {}
    }
    Some((fds[0].revents != 0, child))
}

/// The request loop of PID 1.
fn serve() -> ! {
    let sfd = sigchld_fd();
    let mut started: std::collections::HashSet<i32> = std::collections::HashSet::new();
    let mut buf = vec![0u8; MAX_MSG];
    loop {
        let Some((sock, child)) = wait_sock_or_child(sfd) else {
            continue;
        };
        if child {
            reap(&mut started);
        }
        if sock {
            match recv(SOCK_FD, &mut buf, libc::MSG_DONTWAIT) {
                Ok((0, _)) => break,
                Ok((n, fds)) => match serde_json::from_slice::<Request>(&buf[..n]) {
                    Ok(req) => handle(req, fds, &mut started),
                    Err(_) => continue,
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {}
                Err(_) => break,
            }
        }
    }
    // The daemon is gone or killed the sandbox: PID 1's exit ends every process in it.
    // SAFETY: leaving the process.
    unsafe { libc::_exit(0) }
}

fn reap(started: &mut std::collections::HashSet<i32>) {
    loop {
        let mut st = 0;
        // SAFETY: waitpid into a local.
        let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if pid <= 0 {
            break;
        }
        if started.remove(&pid) {
            emit(&Event::Exit { pid, status: st }, &[]);
        }
    }
}

fn fail(seq: u64, what: &str, errno: i32) {
    emit(
        &Event::Failed {
            seq,
            errno,
            what: what.to_owned(),
        },
        &[],
    );
}

fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn handle(req: Request, fds: Vec<OwnedFd>, started: &mut std::collections::HashSet<i32>) {
    match req {
        Request::Spawn {
            seq,
            argv,
            env,
            cwd,
            pty,
        } => match spawn(&argv, &env, &cwd, pty, fds) {
            Ok((pid, pidfd, master)) => {
                started.insert(pid);
                let mut out = vec![pidfd.as_raw_fd()];
                if let Some(m) = &master {
                    out.push(m.as_raw_fd());
                }
                emit(&Event::Spawned { seq, pid }, &out);
            }
            Err((what, errno)) => fail(seq, what, errno),
        },
        Request::Connect { seq, port } => match connect(port) {
            Ok(s) => emit(&Event::Connected { seq }, &[s.as_raw_fd()]),
            Err(errno) => fail(seq, "connect", errno),
        },
        Request::Listen { seq } => match listen() {
            Ok(s) => emit(&Event::Connected { seq }, &[s.as_raw_fd()]),
            Err(errno) => fail(seq, "listen", errno),
        },
        Request::Root { seq } => {
            // SAFETY: open(2) of a constant path.
            let fd = unsafe {
                libc::open(
                    c"/".as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                fail(seq, "root", last_errno());
            } else {
                // SAFETY: just opened; closed once sent.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                emit(&Event::Connected { seq }, &[fd.as_raw_fd()]);
            }
        }
        Request::Remount { seq, mount } => remount::forward(seq, mount),
        Request::SignalAll { seq, sig } => {
            // SAFETY: kill(2); -1 from PID 1 is every process of the namespace but itself.
            unsafe { libc::kill(-1, sig) };
            emit(&Event::Done { seq }, &[]);
        }
    }
}

/// A TCP socket listening on `127.0.0.1:0` of the sandbox's network namespace (made here,
/// where the init lives in it; the daemon, in the host's namespace, accepts on it).
fn listen() -> Result<OwnedFd, i32> {
    // SAFETY: a TCP socket, bind to a local sockaddr, listen.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(last_errno());
        }
        let s = OwnedFd::from_raw_fd(s);
        let mut a: libc::sockaddr_in = std::mem::zeroed();
        a.sin_family = libc::AF_INET as _;
        a.sin_port = 0;
        a.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
        if libc::bind(
            s.as_raw_fd(),
            (&a as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as _,
        ) != 0
            || libc::listen(s.as_raw_fd(), 1024) != 0
        {
            return Err(last_errno());
        }
        Ok(s)
    }
}

fn connect(port: u16) -> Result<OwnedFd, i32> {
    // SAFETY: a TCP socket and connect with a local sockaddr.
    unsafe {
        let try4 = || -> Result<OwnedFd, i32> {
            let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if s < 0 {
                return Err(last_errno());
            }
            let s = OwnedFd::from_raw_fd(s);
            let mut a: libc::sockaddr_in = std::mem::zeroed();
            a.sin_family = libc::AF_INET as _;
            a.sin_port = port.to_be();
            a.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 1]).to_be();
            if libc::connect(
                s.as_raw_fd(),
                (&a as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as _,
            ) != 0
            {
                return Err(last_errno());
            }
            Ok(s)
        };
        let try6 = || -> Result<OwnedFd, i32> {
            let s = libc::socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if s < 0 {
                return Err(last_errno());
            }
            let s = OwnedFd::from_raw_fd(s);
            let mut a: libc::sockaddr_in6 = std::mem::zeroed();
            a.sin6_family = libc::AF_INET6 as _;
            a.sin6_port = port.to_be();
            a.sin6_addr.s6_addr[15] = 1;
            if libc::connect(
                s.as_raw_fd(),
                (&a as *const libc::sockaddr_in6).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as _,
            ) != 0
            {
                return Err(last_errno());
            }
            Ok(s)
        };
        try4().or_else(|e| try6().map_err(|_| e))
    }
}

/// Open a pty of the sandbox's own devpts: (master, slave).
fn open_pty(rows: u16, cols: u16) -> Result<(OwnedFd, OwnedFd), i32> {
    // SAFETY: opening /dev/ptmx and its slave; ioctls with local structs.
    unsafe {
        let m = libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if m < 0 {
            return Err(last_errno());
        }
        let m = OwnedFd::from_raw_fd(m);
        let unlock: libc::c_int = 0;
        if libc::ioctl(m.as_raw_fd(), libc::TIOCSPTLCK, &unlock) != 0 {
            return Err(last_errno());
        }
        // TIOCGPTPEER opens the slave through the master (no path lookup).
        let s = libc::ioctl(
            m.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if s < 0 {
            return Err(last_errno());
        }
        let s = OwnedFd::from_raw_fd(s);
        let ws = libc::winsize {
            ws_row: rows.max(1),
            ws_col: cols.max(1),
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        libc::ioctl(m.as_raw_fd(), libc::TIOCSWINSZ, &ws);
        Ok((m, s))
    }
}

/// Find `prog` on `PATH` (from the process's environment) the way execvp does.
fn resolve(prog: &str, env: &[String]) -> Vec<CString> {
    if prog.contains('/') {
        return vec![CString::new(prog).unwrap_or_default()];
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .filter(|d| !d.is_empty())
        .filter_map(|d| CString::new(format!("{d}/{prog}")).ok())
        .collect()
}

type Spawned = (i32, OwnedFd, Option<OwnedFd>);

fn spawn(
    argv: &[String],
    env: &[String],
    cwd: &str,
    pty: Option<(u16, u16)>,
    fds: Vec<OwnedFd>,
) -> Result<Spawned, (&'static str, i32)> {
    if argv.is_empty() {
        return Err(("exec", libc::EINVAL));
    }
    let (master, stdio): (Option<OwnedFd>, [RawFd; 3]) = match pty {
        Some((rows, cols)) => {
            let (m, s) = open_pty(rows, cols).map_err(|e| ("pty", e))?;
            let raw = s.as_raw_fd();
            std::mem::forget(s);
            (Some(m), [raw, raw, raw])
        }
        None => {
            if fds.len() != 3 {
                return Err(("stdio", libc::EBADF));
            }
            (
                None,
                [fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd()],
            )
        }
    };
    let c_argv: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_str()).unwrap_or_default())
        .collect();
    let c_env: Vec<CString> = env
        .iter()
        .map(|a| CString::new(a.as_str()).unwrap_or_default())
        .collect();
    let mut p_argv: Vec<*const libc::c_char> = c_argv.iter().map(|c| c.as_ptr()).collect();
    p_argv.push(std::ptr::null());
    let mut p_env: Vec<*const libc::c_char> = c_env.iter().map(|c| c.as_ptr()).collect();
    p_env.push(std::ptr::null());
    let candidates = resolve(&argv[0], env);
    let c_cwd = CString::new(cwd).unwrap_or_default();
    let mut ep = [0; 2];
    // SAFETY: pipe2 into a local array.
    if unsafe { libc::pipe2(ep.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(("pipe", last_errno()));
    }
    // SAFETY: fresh fds.
    let (er, ew) = unsafe { (OwnedFd::from_raw_fd(ep[0]), OwnedFd::from_raw_fd(ep[1])) };
    // SAFETY: fork in a single-threaded process; the child only makes system calls on data
    // prepared above, then execs or exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        if pty.is_some() {
            unsafe { libc::close(stdio[0]) };
        }
        return Err(("fork", last_errno()));
    }
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            let report = |what: u8, e: i32| {
                let mut b = [0u8; 5];
                b[0] = what;
                b[1..].copy_from_slice(&e.to_ne_bytes());
                libc::write(ew.as_raw_fd(), b.as_ptr().cast(), 5);
                libc::_exit(127);
            };
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            libc::setsid();
            for (i, fd) in stdio.iter().enumerate() {
                if libc::dup2(*fd, i as RawFd) < 0 {
                    report(b's', last_errno());
                }
            }
            if pty.is_some() && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                report(b't', last_errno());
            }
            if libc::chdir(c_cwd.as_ptr()) != 0 {
                report(b'c', last_errno());
            }
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            let mut err = libc::ENOENT;
            for c in &candidates {
                libc::execve(c.as_ptr(), p_argv.as_ptr(), p_env.as_ptr());
                let e = last_errno();
                // Like execvp: a later PATH entry may still work; remember a real failure.
                if e != libc::ENOENT && e != libc::ENOTDIR {
                    err = e;
                }
            }
            report(b'e', err);
        }
    }
    drop(ew);
    if pty.is_some() {
        // SAFETY: our copy of the slave.
        unsafe { libc::close(stdio[0]) };
    }
    drop(fds);
    let mut b = [0u8; 5];
    let n = loop {
        // SAFETY: reading into a local buffer.
        let n = unsafe { libc::read(er.as_raw_fd(), b.as_mut_ptr().cast(), 5) };
        if n < 0 && last_errno() == libc::EINTR {
            continue;
        }
        break n;
    };
    if n == 5 {
        let e = i32::from_ne_bytes([b[1], b[2], b[3], b[4]]);
        let what = match b[0] {
            b'c' => "chdir",
            b's' => "stdio",
            b't' => "pty",
            _ => "exec",
        };
        // The child exits at once; `reap` collects it (it is not in `started`).
        return Err((what, e));
    }
    // SAFETY: pidfd_open on our own child.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        let e = last_errno();
        unsafe { libc::kill(pid, libc::SIGKILL) };
        return Err(("pidfd", e));
    }
    // SAFETY: a fresh fd.
    Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) }, master))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let r = Request::Spawn {
            seq: 7,
            argv: vec!["sh".into(), "-c".into(), "true".into()],
            env: vec!["A=b".into()],
            cwd: "/workspace".into(),
            pty: Some((24, 80)),
        };
        let b = serde_json::to_vec(&r).unwrap();
        assert!(String::from_utf8_lossy(&b).contains("\"op\":\"spawn\""));
        match serde_json::from_slice::<Request>(&b).unwrap() {
            Request::Spawn { seq, pty, .. } => assert_eq!((seq, pty), (7, Some((24, 80)))),
            other => panic!("{other:?}"),
        }
        let e: Event = serde_json::from_str(r#"{"op":"exit","pid":3,"status":256}"#).unwrap();
        assert!(matches!(
            e,
            Event::Exit {
                pid: 3,
                status: 256
            }
        ));
    }

    #[test]
    fn datagrams_carry_descriptors() {
        let mut sv = [0; 2];
        // SAFETY: socketpair into a local array.
        assert_eq!(
            unsafe {
                libc::socketpair(
                    libc::AF_UNIX,
                    libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                    0,
                    sv.as_mut_ptr(),
                )
            },
            0
        );
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
        let f = std::fs::File::open("/dev/null").unwrap();
        send(a.as_raw_fd(), b"hello", &[f.as_raw_fd()], 0).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = recv(b.as_raw_fd(), &mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        // A datagram over the buffer is refused, not cut.
        send(a.as_raw_fd(), &[1u8; 100], &[], 0).unwrap();
        let mut small = [0u8; 10];
        assert!(recv(b.as_raw_fd(), &mut small, 0).is_err());
        drop(a);
        assert_eq!(recv(b.as_raw_fd(), &mut buf, 0).unwrap().0, 0);
    }

    #[test]
    fn programs_are_found_on_the_given_path() {
        let env = vec!["PATH=/a:/b".to_owned()];
        assert_eq!(
            resolve("sh", &env),
            vec![
                CString::new("/a/sh").unwrap(),
                CString::new("/b/sh").unwrap()
            ]
        );
        assert_eq!(resolve("./x", &env), vec![CString::new("./x").unwrap()]);
    }
}
