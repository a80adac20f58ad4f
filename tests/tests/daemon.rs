//! The daemon's life: paths and permissions, locks, stale sockets, concurrent starts,
//! version replacement, peer uid checks, and the `abx rpc` / `abx broker` verbs.

use abx_tests::{alive, parse_all, wait_until, Framing, Home};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn private_directory_and_socket() {
    let home = Home::new();
    home.start();
    assert_eq!(mode(&home.run_dir()), 0o700);
    assert_eq!(mode(&home.socket()), 0o600);
    assert_eq!(mode(&home.path.join("data")), 0o700);
    assert_eq!(mode(&home.path.join("config")), 0o700);
    assert!(
        home.log_file().exists(),
        "the daemon logs to a file under the data dir"
    );
}

#[test]
fn start_stop_status_verbs() {
    let home = Home::new();
    let out = home.run(&["broker", "status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("[E1007] "));
    let out = home.run(&["broker", "start"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("abx broker started (pid "));
    let out = home.run(&["broker", "start"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("abx broker is already running"));
    let out = home.run(&["broker", "status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Status       running"), "{text}");
    assert!(text.contains(&format!("Version      {}", env!("CARGO_PKG_VERSION"))));
    let out = home.run(&["-j", "broker", "status"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pid = v["pid"].as_u64().unwrap() as u32;
    assert_eq!(Some(pid), home.daemon_pid());
    let out = home.run(&["broker", "stop"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("abx broker stopped"));
    wait_until("daemon exit", Duration::from_secs(10), || !alive(pid));
    assert!(!home.socket().exists(), "the socket is removed on exit");
    let out = home.run(&["broker", "stop"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("not running"));
}

#[test]
fn stale_socket_is_probed_and_replaced() {
    let home = Home::new();
    std::fs::create_dir_all(home.run_dir()).unwrap();
    // A socket file nobody listens on (its listener is gone).
    let l = std::os::unix::net::UnixListener::bind(home.socket()).unwrap();
    drop(l);
    assert!(home.socket().exists());
    assert!(std::os::unix::net::UnixStream::connect(home.socket()).is_err());
    let pid = home.start();
    let mut c = home.connect();
    assert_eq!(c.call("broker/status", Value::Null)["pid"], pid);
}

#[test]
fn a_second_daemon_never_steals_a_live_socket() {
    let home = Home::new();
    let pid = home.start();
    let out = home.run(&["broker", "run"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[E1012]") && err.contains(&pid.to_string()),
        "{err}"
    );
    let mut c = home.connect();
    assert_eq!(c.call("broker/status", Value::Null)["pid"], pid);
    // Even with the lock file removed by hand, a socket that answers is never taken.
    std::fs::remove_file(home.run_dir().join("broker.lock")).unwrap();
    let out = home.run(&["broker", "run"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.call("broker/status", Value::Null)["pid"], pid);
}

#[test]
fn clients_starting_at_once_get_one_daemon() {
    let home = Home::new();
    let input = concat!(r#"{"jsonrpc":"2.0","id":1,"method":"broker/status"}"#, "\n");
    let children: Vec<_> = (0..6)
        .map(|_| {
            let mut c = home
                .abx()
                .arg("rpc")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            c.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
            c
        })
        .collect();
    let mut pids = std::collections::HashSet::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = parse_all(&out.stdout, Framing::Line);
        assert_eq!(v.len(), 1);
        pids.insert(v[0]["result"]["pid"].as_u64().unwrap());
    }
    assert_eq!(pids.len(), 1, "one daemon for all: {pids:?}");
    assert_eq!(pids.into_iter().next().map(|p| p as u32), home.daemon_pid());
}

#[test]
fn an_idle_daemon_of_another_version_is_replaced_a_busy_one_is_not() {
    let mut home = Home::new();
    home.env
        .push(("ABX_BROKER_VERSION".into(), "0.0.0-old".into()));
    let old = home.start();
    home.env.clear();
    let mut c = home.connect();
    assert_eq!(c.call("broker/status", Value::Null)["version"], "0.0.0-old");
    // Busy: another connection is open, so the old daemon stays and we are warned.
    let out = home.run(&["-j", "broker", "status"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], "0.0.0-old", "status never starts or replaces");
    let out = home.run_with_input(
        &["rpc"],
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"broker/status\"}\n",
    );
    let v = parse_all(&out.stdout, Framing::Line);
    assert_eq!(v[0]["result"]["pid"], old);
    assert!(String::from_utf8_lossy(&out.stderr).contains("[E1008]"));
    // Idle: replaced by this version.
    drop(c);
    // Idle once the old daemon has seen that connection go (no fixed wait): until then a
    // bridge is answered by the old daemon, with the warning, and asks again.
    let mut v = Vec::new();
    wait_until(
        "the idle old daemon replaced",
        Duration::from_secs(10),
        || {
            let out = home.run_with_input(
                &["rpc"],
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"broker/status\"}\n",
            );
            v = parse_all(&out.stdout, Framing::Line);
            v[0]["result"]["version"] == env!("CARGO_PKG_VERSION")
        },
    );
    assert_ne!(v[0]["result"]["pid"], old);
    wait_until("old daemon exit", Duration::from_secs(10), || !alive(old));
}

#[test]
fn another_uid_is_refused() {
    let home = Home::new();
    home.start();
    // Only the peer check stands between another user and the daemon.
    let ping = home.open_to_other_users();
    let same = std::process::Command::new(&ping)
        .arg(home.socket())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&same.stdout).contains("\"result\":{}"),
        "same uid is served"
    );
    let other = std::process::Command::new(&ping)
        .arg(home.socket())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&other.stdout);
    assert_eq!(
        text.trim(),
        "EOF",
        "another uid must be cut off unserved: {text} {}",
        String::from_utf8_lossy(&other.stderr)
    );
    // The refusal is logged by the daemon's own writer: wait for the line (under load it
    // may land after the probe has seen its EOF).
    wait_until("the refusal in the log", Duration::from_secs(20), || {
        std::fs::read_to_string(home.log_file())
            .unwrap_or_default()
            .contains("refusing a connection from another user")
    });
}

#[test]
fn rpc_bridge_in_both_framings_waits_for_every_reply() {
    let home = Home::new();
    // Line framing: one request, one reply line (the README's example).
    let out = home.run_with_input(
        &["rpc"],
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"broker/ping\"}\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n"
    );
    // Content-Length framing in, Content-Length out; many requests, stdin closed at once.
    let mut input = Vec::new();
    for i in 0..50 {
        let body = json!({"jsonrpc": "2.0", "id": i, "method": "broker/ping"}).to_string();
        input.extend(abx_tests::frame(Framing::Header, body.as_bytes()));
    }
    // A pretty-printed (multi-line) message passes through too.
    let pretty = "{\n  \"jsonrpc\": \"2.0\",\n  \"id\": \"p\",\n  \"method\": \"broker/status\"\n}";
    input.extend(abx_tests::frame(Framing::Header, pretty.as_bytes()));
    let out = home.run_with_input(&["rpc"], &input);
    assert!(out.stdout.starts_with(b"Content-Length: "));
    let msgs = parse_all(&out.stdout, Framing::Header);
    assert_eq!(msgs.len(), 51);
    assert!(msgs
        .iter()
        .any(|m| m["id"] == "p" && m["result"]["pid"].is_u64()));
    // Errors pass through with their codes; a notification gets nothing back.
    let out = home.run_with_input(
        &["rpc"],
        b"{\"jsonrpc\":\"2.0\",\"method\":\"initialized\"}\nnonsense\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"x/y\"}",
    );
    let msgs = parse_all(&out.stdout, Framing::Line);
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(msgs[0]["error"]["code"], -32700);
    assert_eq!(msgs[1]["error"]["code"], -32601);
}

/// The daemon raises its soft open-file limit to the hard one (1000 clients need more than
/// the common 1024), and the commands it runs get the limit it started with.
#[test]
fn daemon_raises_its_fd_limit_and_children_get_the_original() {
    let home = Home::new();
    let mut cmd = home.abx();
    cmd.args(["broker", "start"]);
    // SAFETY: getrlimit/setrlimit only, in the child before exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut l = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            l.rlim_cur = l.rlim_max.min(512);
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            Ok(())
        });
    }
    assert!(cmd.status().unwrap().success());
    let pid = home.daemon_pid().expect("daemon");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let nums: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (soft, hard) = (nums[0], nums[1]);
    assert_eq!(soft, hard.min(1 << 20), "{line}");
    let mut c = home.connect();
    let sb = c.create(json!({}));
    let expected = format!("{}\n", hard.min(512));
    assert_eq!(c.sh(&sb, "ulimit -n")["stdout"], expected.as_str());
}

/// A daemon that is going away (killed, still closing its files) holds its lock and its
/// socket for a moment and drops connections: a client waits for it to be gone and starts a
/// new one instead of failing with E1007. Simulated here by a listener that holds the lock,
/// drops every connection, and goes away after a moment.
#[test]
fn a_client_meeting_a_dying_daemon_starts_a_new_one() {
    use std::os::fd::AsRawFd;
    let home = Home::new();
    let run = home.run_dir();
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    let lock = std::fs::File::create(run.join("broker.lock")).unwrap();
    // SAFETY: flock on a file we own.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let listener = std::os::unix::net::UnixListener::bind(home.socket()).unwrap();
    let dying = std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let end = std::time::Instant::now() + Duration::from_millis(800);
        while std::time::Instant::now() < end {
            if let Ok((s, _)) = listener.accept() {
                drop(s); // reset: the dying daemon closes everything
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(listener); // the socket file stays behind, stale
        drop(lock);
    });
    let out = home.run(&["broker", "start"]);
    dying.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = home.connect();
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
}

/// `abx` is a thin client; the daemon is `abx-broker`, found through `ABX_BROKER_BIN`, beside
/// the real `abx` (symlinks resolved) or on PATH. Without it, commands fail with E1007 saying
/// where it was looked for, and no daemon starts.
#[test]
fn the_daemon_binary_is_found_beside_abx_or_named_by_abx_broker_bin() {
    let home = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("lone");
    std::fs::create_dir(&lone).unwrap();
    let abx = lone.join("abx");
    std::fs::copy(abx_tests::abx_bin(), &abx).unwrap();
    let run = |exe: &std::path::Path, broker_bin: Option<&std::path::Path>| {
        // A copy of abx, alone in its directory, with nothing named abx-broker on PATH and
        // not under cargo (which would build the daemon beside it).
        let mut c = std::process::Command::new(exe);
        c.env("ABX_HOME", &home.path)
            .env("PATH", "/usr/bin:/bin")
            .env_remove("CARGO")
            .env_remove("CARGO_MANIFEST_DIR")
            .env_remove("ABX_BROKER_BIN")
            .stdin(std::process::Stdio::null());
        if let Some(b) = broker_bin {
            c.env("ABX_BROKER_BIN", b);
        }
        c.args(["-j", "list"]);
        // A test thread that forks while the copy is still open for writing (std::fs::copy
        // on another thread) holds that descriptor until its exec: ETXTBSY for a moment.
        let t0 = std::time::Instant::now();
        loop {
            match c.output() {
                Err(e)
                    if e.raw_os_error() == Some(libc::ETXTBSY)
                        && t0.elapsed() < Duration::from_secs(10) =>
                {
                    std::thread::yield_now();
                }
                r => break r.unwrap(),
            }
        }
    };
    let out = run(&abx, None);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        v["code"],
        "E1007",
        "{v} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("abx-broker") && msg.contains("ABX_BROKER_BIN"),
        "{msg}"
    );
    assert!(home.daemon_pid().is_none(), "no daemon may start");

    // Named by ABX_BROKER_BIN: the daemon runs, and it is that binary.
    let broker = abx_tests::bin_dir().join("abx-broker");
    let out = run(&abx, Some(&broker));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = home.daemon_pid().expect("a daemon");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe, broker.canonicalize().unwrap());
    assert!(home.run(&["broker", "stop"]).status.success());

    // A symlink to the real abx finds the daemon beside the real file.
    let link = dir.path().join("abx");
    std::os::unix::fs::symlink(abx_tests::abx_bin(), &link).unwrap();
    let out = run(&link, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(home.daemon_pid().is_some());
}

/// How the stand-in daemon answers one line of a connection (`None`: it hangs up).
type Script = Box<dyn FnMut(&Value) -> Option<Value> + Send>;

/// A stand-in daemon on the home's socket: serves one connection per script, in order; each
/// script gets the lines the client sent and answers (or hangs up). Returns what every
/// connection sent, in order.
fn fake_daemon(home: &Home, scripts: Vec<Script>) -> std::thread::JoinHandle<Vec<Vec<Value>>> {
    use std::io::{BufRead, BufReader, Write};
    std::fs::create_dir_all(home.run_dir()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(home.socket()).unwrap();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for mut script in scripts {
            let (s, _) = listener.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut got = Vec::new();
            for line in BufReader::new(s).lines() {
                let Ok(line) = line else { break };
                let msg: Value = serde_json::from_str(&line).unwrap();
                got.push(msg.clone());
                match script(&msg) {
                    Some(reply) => {
                        let mut b = serde_json::to_vec(&reply).unwrap();
                        b.push(b'\n');
                        w.write_all(&b).unwrap();
                    }
                    None => break,
                }
            }
            seen.push(got);
        }
        seen
    })
}

fn answer(msg: &Value, version: &str) -> Option<Value> {
    let result = match msg["method"].as_str() {
        Some("initialize") => json!({
            "protocolVersion": "abx/1",
            "serverInfo": {"name": "abx-broker", "version": version},
            "capabilities": {},
        }),
        Some("sandbox/list") => json!({"sandboxes": [{"id": "fake-1", "provider": "local",
            "status": "running", "template": "t", "region": "here"}]}),
        _ => return None,
    };
    Some(json!({"jsonrpc": "2.0", "id": msg["id"], "result": result}))
}

/// The lock file records the daemon's version: a client of that version skips the
/// `initialize` round trip (its first line is the call itself); a daemon that takes such a
/// connection and drops it unanswered (one that is stopping) gets the call again on a
/// connection made with the handshake, and the user sees one answer; when the recorded
/// version is another, the handshake comes first.
#[test]
fn a_daemon_of_our_version_is_not_asked_initialize_and_a_dropped_first_call_is_sent_again() {
    let ours = env!("CARGO_PKG_VERSION");
    let home = Home::new();
    std::fs::create_dir_all(home.run_dir()).unwrap();
    let lock = home.run_dir().join("broker.lock");
    std::fs::write(&lock, format!("{}\n{ours}\n", std::process::id())).unwrap();
    let server = fake_daemon(
        &home,
        vec![
            // 1: answered at once.
            Box::new(move |m| answer(m, ours)),
            // 2: hung up on without a word.
            Box::new(|_| None),
            // 3: the careful connection that follows.
            Box::new(move |m| answer(m, ours)),
        ],
    );
    for _ in 0..2 {
        let out = home.run(&["-j", "list"]);
        assert!(out.status.success(), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["sandboxes"][0]["id"], "fake-1", "{v}");
    }
    let seen = server.join().unwrap();
    let methods: Vec<Vec<&str>> = seen
        .iter()
        .map(|c| c.iter().map(|m| m["method"].as_str().unwrap()).collect())
        .collect();
    assert_eq!(
        methods,
        [
            vec!["sandbox/list"],
            vec!["sandbox/list"],
            vec!["initialize", "sandbox/list"]
        ]
    );
    assert_eq!(seen[1][0], seen[2][1], "the same call, sent again");

    // Another version recorded (or none): the handshake first.
    std::fs::remove_file(home.socket()).unwrap();
    std::fs::write(&lock, format!("{}\n0.0.0-other\n", std::process::id())).unwrap();
    let server = fake_daemon(&home, vec![Box::new(move |m| answer(m, ours))]);
    let out = home.run(&["-j", "list"]);
    assert!(out.status.success(), "{out:?}");
    let seen = server.join().unwrap();
    assert_eq!(seen[0][0]["method"], "initialize");
    assert_eq!(seen[0][1]["method"], "sandbox/list");
}
