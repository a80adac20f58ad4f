//! Networks of `local` sandboxes (DESIGN §8): `none` (a network namespace with loopback
//! only), `internet` (outbound through user-mode networking: `pasta` from the `passt`
//! package, attached to the sandbox's namespace; the host's loopback is not reachable) and
//! `host` (the host's network, only when asked).

use abx_protocol::{AbxError, ErrorCode};
use std::path::PathBuf;

/// The user-mode networking helper, found on `PATH` (or `/usr/bin`, `/usr/sbin`).
pub fn helper() -> Option<PathBuf> {
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
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
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
