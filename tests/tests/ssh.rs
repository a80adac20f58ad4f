//! `--host` / `ABX_HOST=ssh://...`: the CLI (and `abx rpc`) reaching a broker on "another
//! machine" through a real sshd (Debian's openssh-server) on a loopback port, with a
//! throwaway host key and user key, as the same user. The sshd gives its sessions their own
//! `ABX_HOME` (`SetEnv`), so the broker over there is not this test's local one. The client
//! side is an ssh config file passed through `ABX_SSH_CONFIG` (`ssh -F`). Skipped, with the
//! reason printed, only when sshd is absent (scripts/test installs it).

use abx_tests::{abx_bin, wait_until, Home};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

fn sshd_binary() -> Option<PathBuf> {
    ["/usr/sbin/sshd", "/usr/bin/sshd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Sshd {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
    user: String,
}

impl Sshd {
    fn start(bin: &Path) -> Sshd {
        let dir = tempfile::Builder::new()
            .prefix("abx-sshd")
            .tempdir()
            .unwrap();
        let d = dir.path();
        for k in ["host", "user", "wrong"] {
            let st = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(d.join(k))
                .status()
                .expect("ssh-keygen");
            assert!(st.success());
        }
        std::fs::copy(d.join("user.pub"), d.join("authorized_keys")).unwrap();
        std::fs::create_dir(d.join("remote-home")).unwrap();
        let port = free_port();
        std::fs::write(
            d.join("sshd_config"),
            format!(
                "ListenAddress 127.0.0.1\nPort {port}\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n\
                 StrictModes no\nPermitRootLogin yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 UsePAM no\nPidFile none\nSetEnv ABX_HOME={d}/remote-home\n",
                d = d.display()
            ),
        )
        .unwrap();
        for key in ["user", "wrong"] {
            std::fs::write(
                d.join(format!("ssh_config_{key}")),
                format!(
                    "Host *\n  IdentityFile {d}/{key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  \
                     UserKnownHostsFile {d}/known_hosts\n  LogLevel ERROR\n",
                    d = d.display()
                ),
            )
            .unwrap();
        }
        if unsafe { libc::geteuid() } == 0 {
            // sshd's privilege separation dir (absent until the service first ran).
            std::fs::create_dir_all("/run/sshd").unwrap();
        }
        let log = std::fs::File::create(d.join("sshd.log")).unwrap();
        let child = Command::new(bin)
            .arg("-f")
            .arg(d.join("sshd_config"))
            .args(["-D", "-e"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("sshd");
        let log_path = d.join("sshd.log");
        wait_until("sshd to listen", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() || panic_if_dead(&log_path)
        });
        let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_owned();
        Sshd {
            dir,
            child,
            port,
            user,
        }
    }

    fn url(&self) -> String {
        format!("ssh://{}@127.0.0.1:{}", self.user, self.port)
    }

    fn config(&self, key: &str) -> PathBuf {
        self.dir.path().join(format!("ssh_config_{key}"))
    }

    /// `abx ARGS` of `home`, reaching the broker over ssh with the given key.
    fn abx(&self, home: &Home, key: &str) -> Command {
        let mut c = home.abx();
        c.env("ABX_SSH_CONFIG", self.config(key))
            .env("ABX_REMOTE_BIN", abx_bin())
            .env_remove("ABX_HOST");
        c
    }
}

fn panic_if_dead(log: &Path) -> bool {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        !text.contains("fatal") && !text.contains("Bad configuration"),
        "sshd failed: {text}"
    );
    false
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = Command::new(abx_bin())
            .args(["broker", "stop"])
            .env("ABX_HOME", self.dir.path().join("remote-home"))
            .env_remove("ABX_HOST")
            .output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn setup() -> Option<(Home, Sshd)> {
    let Some(bin) = sshd_binary() else {
        println!("SKIPPED: sshd is not installed (apt-get install openssh-server; scripts/test installs it)");
        return None;
    };
    Some((Home::new(), Sshd::start(&bin)))
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn host_flag_and_env_reach_the_remote_broker() {
    let Some((home, sshd)) = setup() else { return };
    let url = sshd.url();
    // `--host`: create, list, exec (its exit code), over ssh.
    let out = sshd
        .abx(&home, "user")
        .args(["--host", &url, "-j", "create"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = json(&out)["id"].as_str().unwrap().to_owned();
    let out = sshd
        .abx(&home, "user")
        .args(["--host", &url, "list"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id));
    let out = sshd
        .abx(&home, "user")
        .args(["--host", &url, "exec", &id, "printf 'a\\000\\377'; exit 6"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(6));
    assert_eq!(out.stdout, b"a\x00\xff");
    // The same through ABX_HOST; the local broker never saw the sandbox.
    let out = sshd
        .abx(&home, "user")
        .env("ABX_HOST", &url)
        .args(["-j", "info", &id])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(json(&out)["id"], id.as_str());
    let out = home.run(&["-j", "list"]);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&id),
        "the local broker lists the remote sandbox"
    );
    assert!(sshd.dir.path().join("remote-home/run/broker.sock").exists());
    // broker status runs `abx broker status` over there.
    let out = sshd
        .abx(&home, "user")
        .args(["--host", &url, "-j", "broker", "status"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(json(&out)["socket"]
        .as_str()
        .unwrap()
        .contains("remote-home"));
    let out = sshd
        .abx(&home, "user")
        .args(["--host", &url, "kill", "--yes", &id])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn rpc_bridges_stdio_to_the_remote_broker() {
    let Some((home, sshd)) = setup() else { return };
    let mut child = sshd
        .abx(&home, "user")
        .env("ABX_HOST", sshd.url())
        .arg("rpc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        // Content-Length framing in, Content-Length out (the editors' framing).
        for (id, body) in [
            (
                1,
                r#"{"jsonrpc":"2.0","id":1,"method":"broker/ping"}"#.to_owned(),
            ),
            (
                2,
                r#"{"jsonrpc":"2.0","id":2,"method":"sandbox/list"}"#.to_owned(),
            ),
        ] {
            let _ = id;
            write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("Content-Length:").count(), 2, "{text}");
    assert!(text.contains(r#""id":1,"result":{}"#), "{text}");
    assert!(text.contains(r#""sandboxes":[]"#), "{text}");
}

#[test]
fn ssh_failures_are_typed_errors_with_the_fix() {
    let Some((home, sshd)) = setup() else { return };
    let check = |mut cmd: Command, code: &str, says: &str| {
        let out = cmd.arg("-j").arg("list").output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{code}");
        let v = json(&out);
        assert_eq!(v["code"], code, "{v}");
        assert!(v["message"].as_str().unwrap().contains(says), "{v}");
        assert!(!v["suggestion"].as_str().unwrap().is_empty());
        v
    };
    // Nothing listens on the port.
    let mut c = sshd.abx(&home, "user");
    c.args([
        "--host",
        &format!("ssh://{}@127.0.0.1:{}", sshd.user, free_port()),
    ]);
    check(c, "E1014", "Connection refused");
    // A key the server does not know.
    let mut c = sshd.abx(&home, "wrong");
    c.args(["--host", &sshd.url()]);
    check(c, "E1015", "Permission denied");
    // No such remote command.
    let mut c = sshd.abx(&home, "user");
    c.env("ABX_REMOTE_BIN", "/nonexistent/abx")
        .args(["--host", &sshd.url()]);
    let v = check(c, "E1016", "/nonexistent/abx");
    assert!(v["suggestion"].as_str().unwrap().contains("ABX_REMOTE_BIN"));
    // A host that is not ssh:// is a usage error before anything runs.
    let out = home.run(&["--host", "tcp://box", "-j", "list"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json(&out)["code"], "E1009");
}
