//! The per-user daemon on a local socket (docs/design.md#daemon).
//!
//! Start-up, in order: private directories; an exclusive `flock` on the data dir's
//! `broker.lock`, then on the runtime dir's, both held for the daemon's whole life (a second
//! daemon on the same data, from any context, fails here with E1012 naming the running one's
//! pid and socket, and never touches the socket); both record the pid, version, socket and
//! data dir; a leftover socket is probed and removed only if nothing answers; bind with mode 0600;
//! tell the starter we are ready (a line on the fd named by `ABX_READY_FD`); accept.
//! Every accepted peer's uid is checked against ours.

use crate::{logging, Paths};
use abx_core::conn;
use abx_home::lock::{FileLock, Record};
use abx_home::socket::READY_FD_ENV;
use abx_protocol::{AbxError, ErrorCode};
use interprocess::local_socket::tokio::prelude::*;
use interprocess::local_socket::{GenericFilePath, ListenerOptions};
use interprocess::os::unix::local_socket::ListenerOptionsExt;
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;
use tracing::{info, warn};

/// Whether the peer of a Unix socket has closed it both ways (`POLLHUP`), not only shut
/// down its sending side.
fn peer_hung_up(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd on a descriptor we own; no timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

fn startup_error(detail: impl std::fmt::Display, paths: &Paths) -> AbxError {
    AbxError::new(
        ErrorCode::BrokerUnreachable,
        &[
            ("detail", &detail.to_string()),
            ("log", &paths.log_file().display().to_string()),
        ],
    )
}

/// Run the daemon in the foreground until `broker/shutdown` or SIGTERM/SIGINT.
pub fn run(paths: Paths, log_to_stderr: bool) -> Result<(), AbxError> {
    abx_confine::fds::cloexec_inherited_fds();
    crate::tune_allocator();
    abx_confine::fds::raise_fd_limit();
    paths.ensure().map_err(|e| startup_error(e, &paths))?;
    let _log = logging::init(&paths, log_to_stderr);
    // One daemon per data directory: its lock first (a daemon started from another context,
    // with another runtime dir, fails here and names the one that serves this data), then
    // the runtime dir's.
    let patience = Duration::from_millis(500);
    let mut data_lock = match FileLock::acquire_within(&paths.data_lock, patience) {
        Ok(Some(l)) => l,
        Ok(None) => return Err(already_running(&paths, &paths.data_lock)),
        Err(e) => return Err(startup_error(e, &paths)),
    };
    let mut lock = match FileLock::acquire_within(&paths.daemon_lock, patience) {
        Ok(Some(l)) => l,
        Ok(None) => return Err(already_running(&paths, &paths.daemon_lock)),
        Err(e) => return Err(startup_error(e, &paths)),
    };
    // The version recorded is the one `initialize` answers (compose::broker uses the same
    // settings), so a client of that version can skip the handshake; the socket and the
    // data dir, so a client in any context finds this daemon and only for its own data.
    let version = crate::compose::settings_from_env().version;
    for l in [&mut lock, &mut data_lock] {
        l.write_owner(&version, &paths.socket, &paths.data_dir)
            .map_err(|e| startup_error(e, &paths))?;
    }

    // A socket file with no lock holder is stale, unless something still answers on it.
    if fs::symlink_metadata(&paths.socket).is_ok() {
        match std::os::unix::net::UnixStream::connect(&paths.socket) {
            Ok(_) => {
                return Err(AbxError::new(
                    ErrorCode::BrokerAlreadyRunning,
                    &[
                        ("pid", "unknown"),
                        ("socket", &paths.socket.display().to_string()),
                    ],
                )
                .with_suggestion(format!(
                    "Something answers on {} without holding {}; stop it first.",
                    paths.socket.display(),
                    paths.daemon_lock.display()
                )))
            }
            Err(_) => {
                info!(socket = %paths.socket.display(), "removing stale socket");
                fs::remove_file(&paths.socket).map_err(|e| startup_error(e, &paths))?;
            }
        }
    }

    let rt = crate::compose::runtime().map_err(|e| startup_error(e, &paths))?;
    // The accept loop runs on a worker, not on this thread: a connection's task then starts
    // on the worker that accepted it instead of waking another thread (issue 20).
    let result = rt.block_on(async {
        let paths = paths.clone();
        tokio::spawn(serve(paths))
            .await
            .unwrap_or_else(|e| Err(AbxError::internal(format!("the accept loop failed: {e}"))))
    });
    rt.shutdown_timeout(Duration::from_millis(200));
    // Remove the socket while we still hold the lock, so we never remove a successor's.
    let _ = fs::remove_file(&paths.socket);
    drop(lock);
    drop(data_lock);
    result
}

/// E1012 for a daemon that finds `held` locked: the running one's pid, socket and data dir,
/// from its record.
fn already_running(paths: &Paths, held: &std::path::Path) -> AbxError {
    let r = Record::read(held).unwrap_or_default();
    let pid = r.pid.map_or_else(|| "unknown".into(), |p| p.to_string());
    let socket = r.socket.unwrap_or_else(|| paths.socket.clone());
    let data = r.data_dir.unwrap_or_else(|| paths.data_dir.clone());
    let mut e = AbxError::new(
        ErrorCode::BrokerAlreadyRunning,
        &[("pid", &pid), ("socket", &socket.display().to_string())],
    );
    if data != paths.data_dir {
        e.suggestion = format!(
            "The daemon on {} serves {}, not {}: give this one its own runtime dir (XDG_RUNTIME_DIR or ABX_HOME), or stop that one ('abx broker stop' with its environment).",
            socket.display(),
            data.display(),
            paths.data_dir.display()
        );
    }
    e
}

async fn serve(paths: Paths) -> Result<(), AbxError> {
    let name = paths
        .socket
        .as_path()
        .to_fs_name::<GenericFilePath>()
        .map_err(|e| startup_error(e, &paths))?;
    let listener = ListenerOptions::new()
        .name(name)
        .mode(0o600)
        .reclaim_name(false)
        .create_tokio()
        .map_err(|e| {
            startup_error(
                format!("cannot listen on {}: {e}", paths.socket.display()),
                &paths,
            )
        })?;
    fs::set_permissions(&paths.socket, fs::Permissions::from_mode(0o600))
        .map_err(|e| startup_error(e, &paths))?;

    let broker = crate::compose::broker(paths.clone());
    // Sandbox processes a daemon of a weaker model left in this PID namespace: peers are
    // then checked by ancestry too.
    let any = broker.registry.all().iter().any(|p| p.sandbox_count() > 0);
    abx_local::procs::scan_for_host_sandbox_processes(&paths.data_dir, any);
    info!(version = %broker.version, pid = std::process::id(), socket = %paths.socket.display(), "daemon listening");
    signal_ready();

    let my_uid = unsafe { libc::geteuid() };
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| startup_error(e, &paths))?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| startup_error(e, &paths))?;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            _ = broker.shutdown.cancelled() => break,
            _ = sigterm.recv() => { info!("SIGTERM"); broker.shutdown.cancel(); break }
            _ = sigint.recv() => { info!("SIGINT"); broker.shutdown.cancel(); break }
            s = listener.accept() => s,
        };
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let creds = stream.peer_creds();
        match creds.as_ref().map(|c| c.euid()) {
            Ok(Some(uid)) if uid == my_uid => {}
            other => {
                warn!(peer = ?other, "refusing a connection from another user");
                drop(stream);
                continue;
            }
        }
        // A sandbox's or a plugin's process runs as this user too; it must not drive the
        // broker (it could read the user's files through files/upload, or kill other
        // sandboxes). A peer in another PID namespace than the daemon's (every sandbox and
        // every plugin has its own) is refused: a rule no process can shed by changing its
        // environment. The marker check covers the opt-in sandbox models without namespaces,
        // the ancestry check plugins run without them.
        let peer_pid = creds.ok().and_then(|c| c.pid()).unwrap_or(0);
        if let Some(why) = foreign_peer(peer_pid) {
            warn!(pid = peer_pid, reason = %why, "refusing a connection from a sandbox or plugin process");
            drop(stream);
            continue;
        }
        let (r, w) = match abx_home::socket::split(stream) {
            Ok(halves) => halves,
            Err(e) => {
                warn!(error = %e, "dropping a connection that cannot be set up");
                continue;
            }
        };
        let b = broker.clone();
        // The descriptor both halves share; serve_hangup asks while its read half lives.
        let fd = std::os::fd::AsRawFd::as_raw_fd(r.as_ref());
        let hung_up: conn::HungUp = Box::new(move || peer_hung_up(fd));
        tasks.spawn(async move {
            conn::serve_hangup(b, r, w, Some(hung_up)).await;
        });
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    // Stop the plugins cleanly (shutdown, exit), in parallel, bounded.
    let stops = broker.registry.all();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        futures::future::join_all(stops.iter().map(|p| p.shutdown())),
    )
    .await;
    // Give connections a moment to flush their last replies.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    info!("daemon stopped");
    Ok(())
}

/// Why a peer must be refused (a process of a sandbox), if it must.
fn foreign_peer(pid: i32) -> Option<String> {
    if pid <= 0 {
        // The kernel gives no pid for a peer whose PID namespace we cannot see.
        return Some("the peer's pid is not visible from the daemon's PID namespace".into());
    }
    // A process's own PID namespace never changes: looked up once.
    static MINE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let mine =
        *MINE.get_or_init(|| abx_local::container::ns_inode(std::process::id() as i32, "pid"));
    let theirs = abx_local::container::ns_inode(pid, "pid");
    if mine.is_some() && theirs != mine {
        return Some("the peer runs in another PID namespace".into());
    }
    if let Some(id) = abx_plugins::launch::plugin_of(pid) {
        return Some(format!("the peer is a process of plugin '{id}'"));
    }
    // A weaker model's sandbox of this daemon or of another daemon of the user (another
    // data dir, an editor's private broker) shares this PID namespace: such a daemon raised
    // the user's ancestry flag before its sandboxes ran.
    if !abx_local::procs::may_have_host_sandbox_processes()
        && !abx_home::paths::ancestry_flag().exists()
    {
        return None;
    }
    abx_local::procs::sandbox_of(pid).map(|sb| format!("the peer belongs to sandbox {sb}"))
}

fn signal_ready() {
    let Some(fd) = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    std::env::remove_var(READY_FD_ENV);
    // SAFETY: the starter passed us this fd for exactly this purpose; we own it from here.
    let mut f = unsafe { File::from_raw_fd(fd) };
    let _ = writeln!(f, "ready {}", std::process::id());
}
