//! One daemon per data directory, found from every context (issue 41): a shell with
//! `XDG_RUNTIME_DIR`, a process without it (cron, ssh), and an MCP host that passes only
//! `HOME`, `PATH`, `SHELL` and `TERM` all reach the same daemon on the same data; a second
//! daemon started by hand on that data exits with E1012 naming the first; a socket is used
//! only when its daemon serves the client's own data directory.
//!
//! These tests use a temporary `HOME` (no `ABX_HOME`), so the paths are the real defaults
//! beneath it: `~/.local/share/abx`, `$XDG_RUNTIME_DIR/abx` and, without
//! `XDG_RUNTIME_DIR`, `$TMPDIR/abx-<uid>/<key>/`.

use abx_tests::{abx_bin, alive, bin_dir, wait_until};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// A user's home with a runtime dir of its own (as a login session has).
struct User {
    _dir: tempfile::TempDir,
    home: PathBuf,
    xdg: PathBuf,
}

/// The contexts a client runs in.
#[derive(Clone, Copy, Debug)]
enum Ctx {
    /// A login shell: `HOME`, `PATH`, `XDG_RUNTIME_DIR`.
    Shell,
    /// cron or `ssh host cmd`: `HOME` and `PATH`, no `XDG_RUNTIME_DIR`.
    NoRuntime,
    /// What the MCP Python SDK passes to the server it launches (its
    /// `get_default_environment`): `HOME`, `LOGNAME`, `PATH`, `SHELL`, `TERM`, `USER`.
    McpHost,
}

impl User {
    fn new() -> User {
        let dir = tempfile::Builder::new().prefix("abx-u").tempdir().unwrap();
        let home = dir.path().join("home");
        let xdg = dir.path().join("xdg");
        for d in [&home, &xdg] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        User {
            _dir: dir,
            home,
            xdg,
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.home.join(".local/share/abx")
    }

    fn cmd(&self, program: &Path, ctx: Ctx) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("HOME", &self.home)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .stdin(Stdio::null());
        match ctx {
            Ctx::Shell => {
                c.env("XDG_RUNTIME_DIR", &self.xdg);
            }
            Ctx::NoRuntime => {}
            Ctx::McpHost => {
                c.env("SHELL", "/bin/sh")
                    .env("TERM", "xterm")
                    .env("LOGNAME", "u")
                    .env("USER", "u");
            }
        }
        c
    }

    fn abx(&self, ctx: Ctx, args: &[&str]) -> Output {
        self.cmd(&abx_bin(), ctx).args(args).output().unwrap()
    }

    fn json(&self, ctx: Ctx, args: &[&str]) -> Value {
        let mut a = vec!["-j"];
        a.extend_from_slice(args);
        let out = self.abx(ctx, &a);
        assert!(
            out.status.success(),
            "abx {args:?} in {ctx:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
        })
    }

    fn status(&self, ctx: Ctx) -> Value {
        self.json(ctx, &["broker", "status"])
    }

    /// The daemons whose record names this user's data dir and that still run.
    fn live_daemons(&self) -> Vec<u32> {
        daemons_serving(&self.data_dir())
    }
}

impl Drop for User {
    fn drop(&mut self) {
        for ctx in [Ctx::Shell, Ctx::NoRuntime] {
            let _ = self.abx(ctx, &["broker", "stop"]);
        }
        let _ = std::fs::remove_dir_all(fallback_dir(&self.data_dir()));
    }
}

/// `$TMPDIR/abx-<uid>/<key>`: where a daemon of `data_dir` listens without `XDG_RUNTIME_DIR`;
/// `<key>` is the first 16 hex digits of the SHA-256 of the data dir's path, as documented
/// (computed here by coreutils, not by our code).
fn fallback_dir(data_dir: &Path) -> PathBuf {
    let uid = unsafe { libc::geteuid() };
    let out = Command::new("sh")
        .args(["-c", "printf %s \"$1\" | sha256sum", "sh"])
        .arg(data_dir)
        .output()
        .unwrap();
    let key = String::from_utf8_lossy(&out.stdout)[..16].to_owned();
    std::env::temp_dir().join(format!("abx-{uid}")).join(key)
}

/// Live `abx-broker run` processes whose `HOME` makes `data_dir` theirs.
fn daemons_serving(data_dir: &Path) -> Vec<u32> {
    let home = data_dir
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap();
    let want = format!("HOME={}", home.display());
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let argv: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if argv.len() < 2 || !argv[0].ends_with(b"abx-broker") || argv[1] != b"run" {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn a_shell_a_cron_job_and_an_mcp_host_share_one_daemon() {
    let u = User::new();
    // The shell starts it: its socket is in the runtime dir.
    let first = u.status_after_start(Ctx::Shell);
    let pid = first["pid"].as_u64().unwrap();
    assert_eq!(
        first["socket"].as_str().unwrap(),
        u.xdg.join("abx/broker.sock").to_str().unwrap()
    );
    assert_eq!(
        first["dataDir"].as_str().unwrap(),
        u.data_dir().to_str().unwrap()
    );
    // The record in the data dir, readable only by the user.
    let record = u.data_dir().join("broker.lock");
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(
        text.starts_with(&format!("{pid}\n")) && text.contains("xdg/abx/broker.sock\n"),
        "{text}"
    );
    assert_eq!(
        std::fs::metadata(&record).unwrap().permissions().mode() & 0o077,
        0
    );

    // A sandbox made by the shell is the one every other context sees.
    let sb = u.json(Ctx::Shell, &["create"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for ctx in [Ctx::NoRuntime, Ctx::McpHost] {
        assert_eq!(u.status(ctx)["pid"], pid, "{ctx:?} reached another daemon");
        let listed = u.json(ctx, &["list"]);
        assert!(listed.to_string().contains(&sb), "{ctx:?}: {listed}");
    }
    let out = u.abx(Ctx::McpHost, &["exec", &sb, "echo", "from-the-agent"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "from-the-agent",
        "{out:?}"
    );
    assert_eq!(u.live_daemons(), vec![pid as u32], "one daemon on the data");

    // A second daemon started by hand on the same data, from the other context: E1012
    // naming the running one's pid and socket; it never touches the running one's socket.
    let out = u
        .cmd(&bin_dir().join("abx-broker"), Ctx::NoRuntime)
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[E1012]")
            && err.contains(&format!("pid {pid}"))
            && err.contains(u.xdg.join("abx/broker.sock").to_str().unwrap()),
        "{err}"
    );
    assert!(!fallback_dir(&u.data_dir()).join("broker.sock").exists());
    assert_eq!(u.status(Ctx::Shell)["pid"], pid);

    // Stopped from the context without a runtime dir; started from there, the shell finds
    // it through the record although its own runtime dir has no socket.
    let out = u.abx(Ctx::NoRuntime, &["broker", "stop"]);
    assert!(out.status.success(), "{out:?}");
    wait_until("the first daemon gone", Duration::from_secs(20), || {
        !alive(pid as u32)
    });
    let second = u.status_after_start(Ctx::McpHost);
    let pid2 = second["pid"].as_u64().unwrap();
    assert_ne!(pid2, pid);
    let sock = fallback_dir(&u.data_dir()).join("broker.sock");
    assert_eq!(second["socket"].as_str().unwrap(), sock.to_str().unwrap());
    assert_eq!(u.status(Ctx::Shell)["pid"], pid2);
    // The sandbox survived the restart, and the shell sees it through the new daemon.
    assert!(u.json(Ctx::Shell, &["list"]).to_string().contains(&sb));
    assert_eq!(u.live_daemons(), vec![pid2 as u32]);
    u.json(Ctx::Shell, &["kill", &sb, "--yes"]);
}

#[test]
fn a_stale_record_of_a_dead_daemon_is_replaced() {
    let u = User::new();
    let pid = u.status_after_start(Ctx::Shell)["pid"].as_u64().unwrap() as u32;
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_until("the daemon dead", Duration::from_secs(20), || !alive(pid));
    // Its records and socket stay behind; a client in the other context starts a new
    // daemon (on its own runtime dir) and the record names it.
    assert!(u.xdg.join("abx/broker.sock").exists());
    let v = u.status_after_start(Ctx::NoRuntime);
    let pid2 = v["pid"].as_u64().unwrap() as u32;
    assert_ne!(pid2, pid);
    let text = std::fs::read_to_string(u.data_dir().join("broker.lock")).unwrap();
    assert!(text.starts_with(&format!("{pid2}\n")), "{text}");
    // The shell's stale socket is not used: the shell reaches the live daemon.
    assert_eq!(u.status(Ctx::Shell)["pid"], pid2);
}

#[test]
fn a_socket_is_used_only_by_clients_of_its_data_dir() {
    // Two HOMEs of one user that share a runtime dir (same session): the second never drives
    // the first's daemon; it is told which daemon holds the runtime dir.
    let a = User::new();
    let b = User::new();
    let pid_a = a.status_after_start(Ctx::Shell)["pid"].clone();
    let shared = |u: &User, args: &[&str]| {
        let mut c = u.cmd(&abx_bin(), Ctx::NoRuntime);
        c.env("XDG_RUNTIME_DIR", &a.xdg)
            .args(args)
            .output()
            .unwrap()
    };
    let out = shared(&b, &["-j", "broker", "status"]);
    assert!(!out.status.success(), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&pid_a.to_string()));
    let out = shared(&b, &["list"]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("E1012") || err.contains("E1007"), "{err}");
    assert!(err.contains(a.data_dir().to_str().unwrap()), "{err}");
    assert_eq!(b.live_daemons(), Vec::<u32>::new());

    // Without a runtime dir, each HOME gets its own fallback dir: two daemons, each on its
    // own data.
    let va = a.status(Ctx::NoRuntime);
    let vb = b.status_after_start(Ctx::NoRuntime);
    assert_eq!(va["pid"], pid_a);
    assert_ne!(vb["pid"], pid_a);
    assert_eq!(
        vb["dataDir"].as_str().unwrap(),
        b.data_dir().to_str().unwrap()
    );
    assert_ne!(fallback_dir(&a.data_dir()), fallback_dir(&b.data_dir()));
}

impl User {
    /// `abx broker start` in `ctx`, then its status.
    fn status_after_start(&self, ctx: Ctx) -> Value {
        let out = self.abx(ctx, &["broker", "start"]);
        assert!(out.status.success(), "{out:?}");
        self.status(ctx)
    }
}
