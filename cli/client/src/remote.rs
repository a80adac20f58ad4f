//! A broker on another machine: `ABX_HOST=ssh://[user@]host[:port]` (or `abx --host`).
//!
//! The way `DOCKER_HOST=ssh://` works: the user's own `ssh` binary, keys and config run
//! `ssh [-F $ABX_SSH_CONFIG] [-p PORT] -T -o BatchMode=yes -- [user@]host abx rpc`, and the
//! connection speaks JSON-RPC over that child's stdio. The child's stdin and stdout are one
//! end of a Unix socket pair; the other end is an ordinary daemon connection to the rest of
//! the client ([`crate::client::Client`], [`crate::mux`], the `abx rpc` bridge), so nothing
//! above this module knows the broker is remote. The remote `abx rpc` starts the daemon
//! there when none runs, as it does locally.
//!
//! When the connection ends before the broker answered, [`Remote::failure`] waits for ssh to
//! exit and tells from its status and stderr which of the typed errors it was: E1014 the host
//! cannot be reached, E1015 the login was refused, E1016 no `abx` to run there.
//!
//! Environment: `ABX_REMOTE_BIN` names the remote command (default `abx`), `ABX_SSH_CONFIG`
//! an ssh config file (`-F`), `ABX_SSH` the ssh binary (default `ssh` on PATH).

use abx_protocol::{AbxError, ErrorCode};
use interprocess::local_socket::tokio::Stream;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The variable naming the broker's machine.
pub const HOST_ENV: &str = "ABX_HOST";
/// The command run on the remote machine (default `abx`).
pub const REMOTE_BIN_ENV: &str = "ABX_REMOTE_BIN";
/// An ssh config file passed as `-F`.
pub const SSH_CONFIG_ENV: &str = "ABX_SSH_CONFIG";
/// The ssh binary (default `ssh` on PATH).
pub const SSH_BIN_ENV: &str = "ABX_SSH";

/// The last bytes of ssh's stderr kept for an error message.
const STDERR_TAIL: usize = 8 * 1024;

/// A parsed `ssh://[user@]host[:port]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// As given.
    pub url: String,
    /// The login name, when given.
    pub user: Option<String>,
    /// Host name or address (IPv6 without its brackets).
    pub host: String,
    /// The port, when given.
    pub port: Option<u16>,
}

fn bad_host(s: &str, why: &str) -> AbxError {
    AbxError::detail(ErrorCode::Usage, format!("Invalid host '{s}': {why}.")).with_suggestion(
        "Give ABX_HOST / --host as ssh://[user@]host[:port] (an empty value means this machine).",
    )
}

impl Host {
    /// Parse `ssh://[user@]host[:port]`; an empty string is `None` (this machine).
    pub fn parse(s: &str) -> Result<Option<Host>, AbxError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        let Some(rest) = s.strip_prefix("ssh://") else {
            return Err(bad_host(s, "only ssh:// hosts are supported"));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (user, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| bad_host(s, "unclosed '['"))?;
            match after.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None if after.is_empty() => (h, None),
                None => return Err(bad_host(s, "junk after ']'")),
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        let port = match port {
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad_host(s, "the port is not a number from 1 to 65535"))?,
            ),
            None => None,
        };
        let ok = |t: &str| {
            !t.is_empty()
                && !t.starts_with('-')
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-:%".contains(c))
        };
        if !ok(host) {
            return Err(bad_host(s, "no valid host name"));
        }
        if let Some(u) = user {
            if !ok(u) {
                return Err(bad_host(s, "no valid user name"));
            }
        }
        Ok(Some(Host {
            url: s.to_owned(),
            user: user.map(str::to_owned),
            host: host.to_owned(),
            port,
        }))
    }

    /// `user@host` or `host`, as ssh takes it.
    pub fn target(&self) -> String {
        match &self.user {
            Some(u) => format!("{u}@{}", self.host),
            None => self.host.clone(),
        }
    }

    /// The remote command (`ABX_REMOTE_BIN`, default `abx`).
    pub fn remote_bin() -> String {
        std::env::var(REMOTE_BIN_ENV)
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "abx".to_owned())
    }

    /// `ssh ... -- [user@]host <remote abx> ARGS`.
    pub fn ssh_command(&self, args: &[&str]) -> Command {
        let ssh = std::env::var_os(SSH_BIN_ENV)
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "ssh".into());
        let mut cmd = Command::new(ssh);
        if let Some(cfg) = std::env::var_os(SSH_CONFIG_ENV).filter(|s| !s.is_empty()) {
            cmd.arg("-F").arg(cfg);
        }
        if let Some(p) = self.port {
            cmd.arg("-p").arg(p.to_string());
        }
        // No pty, and never a prompt: stdin is the protocol, not a terminal.
        cmd.args(["-T", "-o", "BatchMode=yes", "--"])
            .arg(self.target());
        // ssh hands the words to the remote shell joined by spaces: quote them.
        cmd.arg(shell_quote(&Self::remote_bin()));
        for a in args {
            cmd.arg(shell_quote(a));
        }
        cmd
    }

    fn err(&self, code: ErrorCode, detail: &str) -> AbxError {
        AbxError::new(
            code,
            &[
                ("host", &self.url),
                ("target", &self.target()),
                ("detail", detail),
                ("bin", &Self::remote_bin()),
            ],
        )
    }

    /// Turn ssh's exit status and stderr into the typed error (E1014, E1015, E1016), or
    /// `None` when ssh itself worked and the remote command failed on its own.
    pub fn classify(&self, status: Option<i32>, stderr: &str) -> Option<AbxError> {
        let tail = last_lines(stderr, 3);
        let detail = if tail.is_empty() {
            match status {
                Some(c) => format!("ssh exited with status {c}"),
                None => "ssh ended without a word".to_owned(),
            }
        } else {
            tail
        };
        let low = stderr.to_ascii_lowercase();
        let auth = [
            "permission denied",
            "host key verification failed",
            "too many authentication failures",
            "no matching host key",
            "authentication failed",
        ];
        let missing = [
            "command not found",
            ": not found",
            "no such file or directory",
        ];
        if status == Some(255) {
            let code = if auth.iter().any(|a| low.contains(a)) {
                ErrorCode::HostAuthFailed
            } else {
                ErrorCode::HostUnreachable
            };
            return Some(self.err(code, &detail));
        }
        if status == Some(127) || status == Some(126) || missing.iter().any(|m| low.contains(m)) {
            return Some(self.err(ErrorCode::RemoteAbxNotFound, &detail));
        }
        None
    }
}

/// Quote a word for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./=:@%+,".contains(c))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Warning: Permanently added"))
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

static HOST: OnceLock<Option<Host>> = OnceLock::new();

/// Set the host for this process (`--host`; an empty value is this machine). Call once,
/// before the first connection; without it [`current`] reads `ABX_HOST`.
pub fn set(host: Option<&str>) -> Result<(), AbxError> {
    let parsed = match host {
        Some(h) => Host::parse(h)?,
        None => Host::parse(&std::env::var(HOST_ENV).unwrap_or_default())?,
    };
    let _ = HOST.set(parsed);
    Ok(())
}

/// The broker's machine: `None` for this one.
pub fn current() -> Result<Option<&'static Host>, AbxError> {
    if HOST.get().is_none() {
        set(None)?;
    }
    Ok(HOST.get().and_then(Option::as_ref))
}

/// The ssh child of a remote connection.
pub struct Remote {
    /// Which host.
    pub host: Host,
    child: Option<Child>,
    stderr: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// Start `ssh host abx rpc` and return our end of its stdio as a daemon connection.
pub fn connect(host: &Host) -> Result<(Stream, Remote), AbxError> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| host.err(ErrorCode::HostUnreachable, &format!("socketpair: {e}")))?;
    let theirs_out = theirs
        .try_clone()
        .map_err(|e| host.err(ErrorCode::HostUnreachable, &format!("socketpair: {e}")))?;
    let mut cmd = host.ssh_command(&["rpc"]);
    cmd.stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::from(OwnedFd::from(theirs_out)))
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        host.err(
            ErrorCode::HostUnreachable,
            &format!("cannot run ssh: {e} (install an OpenSSH client, or set {SSH_BIN_ENV})"),
        )
    })?;
    // `cmd` holds our copies of the child's ends: close them so its exit is our EOF.
    drop(cmd);
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let reader = child.stderr.take().map(|mut e| {
        let buf = stderr.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = e.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                let mut b = buf.lock().expect("ssh stderr");
                b.extend_from_slice(&chunk[..n]);
                if b.len() > STDERR_TAIL {
                    let cut = b.len() - STDERR_TAIL;
                    b.drain(..cut);
                }
            }
        })
    });
    let broken = |e: std::io::Error| host.err(ErrorCode::HostUnreachable, &e.to_string());
    ours.set_nonblocking(true).map_err(broken)?;
    let uds =
        interprocess::os::unix::uds_local_socket::tokio::Stream::try_from(OwnedFd::from(ours))
            .map_err(broken)?;
    Ok((
        Stream::from(uds),
        Remote {
            host: host.clone(),
            child: Some(child),
            stderr,
            reader,
        },
    ))
}

impl Remote {
    /// Why the connection ended: waits (up to 10 s) for ssh to exit, then the typed error;
    /// the remote side's own failure (its stderr, e.g. an E1007 of the remote daemon) as
    /// E1007 otherwise.
    pub fn failure(&mut self) -> AbxError {
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = match self.child.take() {
            None => None,
            Some(mut child) => loop {
                match child.try_wait() {
                    Ok(Some(s)) => break s.code(),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => {
                        let _ = child.kill();
                        break child.wait().ok().and_then(|s| s.code());
                    }
                }
            },
        };
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let stderr = String::from_utf8_lossy(&self.stderr.lock().expect("ssh stderr")).into_owned();
        self.host.classify(status, &stderr).unwrap_or_else(|| {
            let tail = last_lines(&stderr, 3);
            AbxError::new(
                ErrorCode::BrokerUnreachable,
                &[
                    (
                        "detail",
                        &format!(
                            "the remote '{} rpc' on '{}' ended{}{}",
                            Host::remote_bin(),
                            self.host.url,
                            status.map(|c| format!(" (exit {c})")).unwrap_or_default(),
                            if tail.is_empty() {
                                String::new()
                            } else {
                                format!(": {tail}")
                            }
                        ),
                    ),
                    ("log", "the broker log on that machine"),
                ],
            )
        })
    }
}

impl Drop for Remote {
    /// ssh ends when its side of the connection closes: reap it then, off this thread, so a
    /// long-lived client (`abx mcp` reconnecting) leaves no zombies.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                let _ = std::thread::Builder::new()
                    .name("abx-ssh-reap".into())
                    .spawn(move || {
                        let _ = child.wait();
                    });
            }
        }
    }
}

/// Run `abx ARGS` on the host over ssh with stdout passed through (`abx broker
/// start|stop|status` on a remote host); returns its exit code, or the typed ssh error.
pub fn run_remote(host: &Host, args: &[&str]) -> Result<i32, AbxError> {
    let out = host
        .ssh_command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| {
            host.err(
                ErrorCode::HostUnreachable,
                &format!("cannot run ssh: {e} (install an OpenSSH client, or set {SSH_BIN_ENV})"),
            )
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(e) = host.classify(out.status.code(), &stderr) {
        return Err(e);
    }
    eprint!("{stderr}");
    Ok(out.status.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts() {
        assert_eq!(Host::parse("").unwrap(), None);
        let h = Host::parse("ssh://me@box.example:2222").unwrap().unwrap();
        assert_eq!(
            (h.user.as_deref(), h.host.as_str(), h.port),
            (Some("me"), "box.example", Some(2222))
        );
        assert_eq!(h.target(), "me@box.example");
        let h = Host::parse("ssh://[::1]:22").unwrap().unwrap();
        assert_eq!((h.host.as_str(), h.port), ("::1", Some(22)));
        let h = Host::parse("ssh://box").unwrap().unwrap();
        assert_eq!((h.user, h.port), (None, None));
        for bad in [
            "box",
            "tcp://box",
            "ssh://",
            "ssh://box:0",
            "ssh://box:x",
            "ssh://-oProxyCommand=x",
        ] {
            let e = Host::parse(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::Usage, "{bad}");
        }
    }

    #[test]
    fn classifies_ssh_failures() {
        let h = Host::parse("ssh://u@h:1").unwrap().unwrap();
        let c = |st, err| h.classify(st, err).map(|e| e.code);
        assert_eq!(
            c(
                Some(255),
                "ssh: connect to host h port 1: Connection refused"
            ),
            Some(ErrorCode::HostUnreachable)
        );
        assert_eq!(
            c(Some(255), "u@h: Permission denied (publickey)."),
            Some(ErrorCode::HostAuthFailed)
        );
        assert_eq!(
            c(Some(127), "sh: 1: nope: not found"),
            Some(ErrorCode::RemoteAbxNotFound)
        );
        assert_eq!(c(Some(1), "[E1007] remote trouble"), None);
    }

    #[test]
    fn quotes_remote_words() {
        assert_eq!(shell_quote("/usr/bin/abx"), "/usr/bin/abx");
        assert_eq!(shell_quote("a b'c"), "'a b'\\''c'");
    }
}
