//! Networks of `local` sandboxes (docs/design.md#local): `none` (a network namespace with loopback
//! only), `internet` (outbound through user-mode networking: `pasta` from the `passt`
//! package, attached to the sandbox's namespace; the host's loopback is not reachable) and
//! `host` (the host's network, only when asked).

use abx_protocol::{AbxError, ErrorCode};
use std::path::PathBuf;

/// The user-mode networking helper, found on `PATH` (or `/usr/bin`, `/usr/sbin`).
pub fn helper() -> Option<PathBuf> {
    // `ABX_PASTA`: the helper to use (packagers, tests), and only that one.
    if let Some(p) = std::env::var_os("ABX_PASTA") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/bin", "/usr/sbin", "/bin", "/sbin"])
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("pasta"))
        .find(|p| p.is_file());
    found
}

/// E2001 naming the package when the helper is missing.
pub fn check_helper() -> Result<PathBuf, AbxError> {
    helper().ok_or_else(|| {
        AbxError::new(
            ErrorCode::SandboxCreateFailed,
            &[
                (
                    "detail",
                    "network 'internet' needs the user-mode networking helper 'pasta', which is not installed",
                ),
                ("provider", "local"),
            ],
        )
        .with_suggestion("Install it (Debian/Ubuntu: 'sudo apt install passt'; Fedora: 'sudo dnf install passt'), or create the sandbox with --network none or --network host.")
    })
}

/// Accept on a host loopback listener and connect each client to `port` inside the
/// sandbox (through its init, whose socket lives in the sandbox's network namespace).
pub async fn forward(
    listener: tokio::net::TcpListener,
    c: std::sync::Arc<super::container::Container>,
    port: u16,
) {
    loop {
        let (mut client, _) = match listener.accept().await {
            Ok(c) => c,
            Err(_) => {
                // Out of descriptors or similar: do not spin; retry shortly.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if !c.alive() {
            return;
        }
        let c = c.clone();
        tokio::spawn(async move {
            let Ok(fd) = c.connect(port).await else {
                return; // refused inside: the client sees the connection close
            };
            let std = std::net::TcpStream::from(fd);
            if std.set_nonblocking(true).is_err() {
                return;
            }
            let Ok(mut inside) = tokio::net::TcpStream::from_std(std) else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut inside).await;
        });
    }
}

/// User-mode networking for a sandbox's namespace: `pasta` joined to the network and user
/// namespaces of the init's outer process (`outer_pid`: it shares them with the sandbox, is
/// dumpable unlike PID 1, and is not visible inside; pasta quits when it exits).
/// Returns when the namespace is configured (pasta's first process exits once it is, leaving
/// its background process, whose pid is in `pidfile`). No inbound port forwarding, and the
/// gateway address is not mapped to the host (`--no-map-gw`): the host's loopback services
/// are unreachable; outbound connections leave through the host's network stack.
pub fn start_pasta(outer_pid: i32, pidfile: &std::path::Path) -> Result<i32, AbxError> {
    let bin = check_helper()?;
    let _ = std::fs::remove_file(pidfile);
    let log = pidfile.with_file_name("pasta.log");
    let _ = std::fs::remove_file(&log);
    let fail = |d: String| {
        AbxError::new(
            ErrorCode::SandboxCreateFailed,
            &[("detail", &d), ("provider", "local")],
        )
        .with_suggestion("Check that 'pasta' (package passt) works here, or create the sandbox with --network none or --network host.")
    };
    // As root pasta would drop to `nobody`, who cannot join the sandbox's user namespace.
    // SAFETY: getters without arguments.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let out = std::process::Command::new(&bin)
        .arg("--runas")
        .arg(format!("{uid}:{gid}"))
        .args([
            "--config-net",
            "--no-map-gw",
            "-t",
            "none",
            "-u",
            "none",
            "-T",
            "none",
            "-U",
            "none",
            "-q",
            "-P",
        ])
        .arg(pidfile)
        // Its log goes to a file beside the pid file: once in the background, a write to a
        // closed pipe would end it.
        .arg("--log-file")
        .arg(&log)
        .args(["--log-size", "1048576"])
        .arg(outer_pid.to_string())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| fail(format!("starting pasta: {e}")))?;
    if !out.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let last: Vec<&str> = text.lines().rev().take(3).collect();
        return Err(fail(format!(
            "pasta failed ({out}): {}",
            last.into_iter().rev().collect::<Vec<_>>().join("; ")
        )));
    }
    std::fs::read_to_string(pidfile)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| fail("pasta did not write its pid".into()))
}

/// Stop a sandbox's `pasta` (only if that pid still is pasta).
pub fn stop_pasta(pid: i32) {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim().starts_with("pasta") || comm.trim().starts_with("passt") {
        // SAFETY: kill(2) with no memory arguments.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
