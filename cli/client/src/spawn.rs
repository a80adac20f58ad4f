//! Starting the daemon from a client: one start at a time (a lock), a detached process in
//! its own session, and a ready line on a pipe so we never poll or race.

use abx_home::lock::{is_locked, FileLock};
use abx_home::socket::READY_FD_ENV;
use abx_home::Paths;
use abx_protocol::{AbxError, ErrorCode};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn err(paths: &Paths, detail: impl std::fmt::Display) -> AbxError {
    AbxError::new(
        ErrorCode::BrokerUnreachable,
        &[
            ("detail", &detail.to_string()),
            ("log", &paths.log_file().display().to_string()),
        ],
    )
}

/// The environment variable naming the daemon binary, for packagers and tests that put it
/// elsewhere than beside `abx`.
pub const DAEMON_BIN_ENV: &str = "ABX_BROKER_BIN";

/// The daemon's executable: `ABX_BROKER_BIN` when set; else `abx-broker` beside the running
/// executable (where the release archive and distribution packages put it, symlinks to `abx`
/// resolved); else `abx-broker` on `PATH` (`cargo install` puts both in `~/.cargo/bin`).
/// Under `cargo run -p abx-cli` in a source checkout, which builds `abx` alone, the daemon is
/// built beside it first (see [`build_in_checkout`]).
pub fn daemon_binary() -> std::io::Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os(DAEMON_BIN_ENV).filter(|p| !p.is_empty()) {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    if let Some(dir) = exe.parent() {
        let beside = dir.join("abx-broker");
        if beside.is_file() || build_in_checkout(dir) {
            return Ok(beside);
        }
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join("abx-broker");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!(
            "the daemon binary 'abx-broker' is neither beside {} nor on PATH (set {DAEMON_BIN_ENV} to its path)",
            exe.display()
        ),
    ))
}

/// `cargo run -p abx-cli` builds the `abx` binary only. When this `abx` was started that way
/// (cargo sets `CARGO` and `CARGO_MANIFEST_DIR` for what it runs) and lives in that
/// checkout's target dir, build `abx-broker` beside it with the same cargo and profile, so
/// the README's first command works on a fresh clone. Nothing of the kind happens outside
/// a cargo run.
fn build_in_checkout(dir: &std::path::Path) -> bool {
    let (Some(cargo), Some(manifest_dir)) = (
        std::env::var_os("CARGO"),
        std::env::var_os("CARGO_MANIFEST_DIR"),
    ) else {
        return false;
    };
    // target/<profile>/abx: only the dev and release profiles, whose dirs are debug/release.
    let release = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => false,
        Some("release") => true,
        _ => return false,
    };
    let manifest = std::path::Path::new(&manifest_dir).join("Cargo.toml");
    if !dir.join(".fingerprint").is_dir() || !manifest.is_file() {
        return false;
    }
    eprintln!(
        "abx: building the daemon (abx-broker) beside {} ...",
        dir.display()
    );
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "-p",
        "abx-broker",
        "--bin",
        "abx-broker",
    ])
    .arg("--manifest-path")
    .arg(&manifest)
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    if release {
        cmd.arg("--release");
    }
    cmd.status().is_ok_and(|s| s.success()) && dir.join("abx-broker").is_file()
}

/// Start a daemon unless one is (or becomes) reachable. Safe to call from many clients at
/// once: they queue on the spawn lock and all but the first find the daemon up.
pub async fn start_daemon(paths: &Paths) -> Result<Option<u32>, AbxError> {
    paths.ensure().map_err(|e| {
        err(
            paths,
            format!(
                "cannot create its directories ({}, {}): {e}",
                paths.runtime_dir.display(),
                paths.data_dir.display()
            ),
        )
    })?;
    let p = paths.clone();
    tokio::task::spawn_blocking(move || start_blocking(&p))
        .await
        .map_err(|e| err(paths, e))?
}

fn start_blocking(paths: &Paths) -> Result<Option<u32>, AbxError> {
    let _spawn_lock = FileLock::acquire(&paths.spawn_lock).map_err(|e| err(paths, e))?;
    if crate::client::answers(paths) {
        return Ok(None); // someone else started it while we waited
    }
    let exe = daemon_binary().map_err(|e| err(paths, e))?;
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(err(paths, std::io::Error::last_os_error()));
    }
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let stderr = OpenOptions::new()
        .create(true)
        .append(true)
        .open(paths.log_dir.join("daemon.stderr"))
        .map_err(|e| err(paths, e))?;
    let wfd = write_end.as_raw_fd();
    let mut cmd = Command::new(exe);
    cmd.args(["run", "--detached"])
        .env(READY_FD_ENV, "3")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::dup2(wfd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing else of the client's reaches the daemon (an inherited `8>>file`).
            libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| err(paths, format!("cannot start the daemon: {e}")))?;
    drop(write_end);
    let pid = child.id();
    // Read "ready <pid>" or EOF (the daemon died), with a deadline.
    let mut file = File::from(read_end);
    let line = read_with_deadline(&mut file, Duration::from_secs(15));
    // The daemon is not our child to wait for: let init reap it.
    std::mem::forget(child);
    match line {
        Some(l) if l.starts_with("ready") => Ok(Some(pid)),
        _ => {
            let tail = std::fs::read_to_string(paths.log_dir.join("daemon.stderr"))
                .unwrap_or_default()
                .lines()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
                .join(" | ");
            if crate::client::answers(paths) {
                return Ok(None);
            }
            Err(err(paths, format!("the daemon did not start: {tail}")))
        }
    }
}

fn read_with_deadline(f: &mut File, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        let mut pfd = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return None;
        }
        if r == 0 {
            return None;
        }
        match f.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&out).into_owned()),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.contains(&b'\n') {
                    return Some(String::from_utf8_lossy(&out).into_owned());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// Wait until no daemon holds the lock.
pub async fn wait_stopped(paths: &Paths, timeout: Duration) -> Result<(), AbxError> {
    let deadline = Instant::now() + timeout;
    while is_locked(paths) {
        if Instant::now() > deadline {
            return Err(err(paths, "the old daemon did not stop"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
