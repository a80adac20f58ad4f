//! Fault injection (docs/design.md#reliability): real daemons over real sockets, real plugin processes, real
//! signals. Each test breaks something on purpose and checks that the errors are typed, that
//! memory stays bounded, that the daemon keeps serving everyone else, and that what is on disk
//! is consistent after a restart. No timed assertions: waits are generous liveness bounds.
//!
//! Rows of docs/design.md#reliability covered elsewhere and not repeated here: malformed/oversized/truncated/batched
//! input (`wire.rs`), a client that never reads pings or local exec output (`wire.rs`,
//! `local.rs`), 100 calls in flight from one client when the plugin is killed, and garbage /
//! crash / liar / flood-after-handshake plugins (`plugins.rs`), tampering and hostile sources
//! (`plugins.rs`, broker unit tests), another uid's ping (`daemon.rs`), restarts keeping local
//! sandboxes (`local.rs`). Fuzzing is `fuzz/` (`scripts/fuzz`, `scripts/fuzz-smoke`).

use abx_tests::fixtures::{
    copy_dir, fixture, git, install_pinned, plugin_sandbox, provider_status, sparse_file, started,
};
use abx_tests::{abx_code, alive, frame, rss_kib, wait_until, Client, Framing, Home};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM, ...).
fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Open file descriptors of a process.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// argv of a process.
fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Every live process whose argv satisfies `f`.
fn pids_where(f: impl Fn(&[String]) -> bool) -> Vec<u32> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) {
            let argv = cmdline(pid);
            if !argv.is_empty() && f(&argv) && !is_zombie(pid) {
                out.push(pid);
            }
        }
    }
    out
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
        })
        .is_none_or(|state| state == 'Z' || state == 'X')
}

/// Processes running a fixture plugin's provider.py from this home's installed tree.
fn plugin_pids(home: &Home, id: &str) -> Vec<u32> {
    let tree = home.path.join("data/providers").join(id);
    let tree = tree.to_string_lossy().into_owned();
    // A plugin runs `provider.py` with the installed tree as its cwd.
    pids_where(|argv| argv.iter().any(|a| a.contains("provider.py")))
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd"))
                .map(|p| p.to_string_lossy().starts_with(&tree))
                .unwrap_or(false)
        })
        .collect()
}

/// SIGKILL what matches, for clean-up.
fn kill_all(pids: &[u32]) {
    for &p in pids {
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
}

/// A check of `provider/doctor`.
fn doctor_check(c: &mut Client, id: &str, name: &str) -> Value {
    let doc = c.call("provider/doctor", json!({"id": id}));
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {doc}"))
        .clone()
}

/// Send a request without waiting for its answer.
fn send_req(c: &mut Client, id: i64, method: &str, params: Value) {
    c.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string());
}

/// The answer to request `id` within `wait` (other messages are dropped).
fn answer(c: &mut Client, id: i64, wait: Duration) -> Option<Value> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        match c.try_recv(Duration::from_millis(200)) {
            Some(v) if v["id"] == json!(id) => return Some(v),
            _ => {}
        }
    }
    None
}

/// Kill the daemon with SIGKILL and wait until it is gone: until its lifetime lock is free,
/// which is when the kernel has closed all its files (a thread in an uninterruptible call,
/// such as `syncfs`, keeps them open after the process shows as a zombie).
fn kill_daemon(home: &Home) -> u32 {
    use std::os::fd::AsRawFd;
    let pid = home.daemon_pid().expect("daemon pid");
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let lock = std::fs::File::open(home.run_dir().join("broker.lock")).expect("broker.lock");
    wait_until("the killed daemon's lock released", LONG, || unsafe {
        libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0
    });
    unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_UN) };
    pid
}

/// Start the daemon again after a kill (with every detail when that fails).
fn restart(home: &Home) {
    let out = home.run(&["-j", "broker", "start"]);
    assert!(
        out.status.success(),
        "broker start failed ({}): {} {}\nlog tail: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(home.log_file())
            .unwrap_or_default()
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn sandbox_ids(c: &mut Client, params: Value) -> BTreeSet<String> {
    c.call("sandbox/list", params)["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Raise the soft limit of open files (inherited by the daemon that this test starts).
fn raise_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    if r.rlim_cur < want {
        r.rlim_cur = want.min(r.rlim_max);
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    }
    r.rlim_cur
}

// ---------------------------------------------------------------------------------------------
// Plugins
// ---------------------------------------------------------------------------------------------

/// docs/design.md#reliability "plugin killed with 100 calls in flight", from several clients in both framings with a
/// stream open: every call gets a typed error, the stream its `exec/exit`, and the next call
/// runs on a restarted plugin. (`plugins.rs` covers one client; this spreads the calls.)
#[test]
fn plugin_killed_with_calls_in_flight_from_many_clients() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (_, full) = plugin_sandbox(&mut c, "py-local");
    let marker = format!("37.{}", std::process::id());
    let pid = provider_status(&mut c, "py-local")["pid"].as_u64().unwrap() as u32;
    // A stream, then 4 clients x 25 calls.
    let mut streamer = home.connect();
    let exec = streamer.call(
        "exec/start",
        json!({"sandbox": full, "command": format!("echo started; sleep {marker}")}),
    )["execId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut clients: Vec<Client> = (0..4)
        .map(|i| {
            home.connect_with(if i % 2 == 0 {
                Framing::Line
            } else {
                Framing::Header
            })
        })
        .collect();
    for c in clients.iter_mut() {
        for i in 0..25 {
            send_req(
                c,
                1000 + i,
                "exec/run",
                json!({"sandbox": full, "command": format!("sleep {marker}")}),
            );
        }
    }
    // All 101 commands running in the plugin's sandbox (each `sleep MARKER`).
    let sleeping = || pids_where(|a| a.len() == 2 && a[0].ends_with("sleep") && a[1] == marker);
    wait_until("101 commands running", LONG, || sleeping().len() >= 101);
    let t0 = Instant::now();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    for c in clients.iter_mut() {
        let mut seen = BTreeSet::new();
        while seen.len() < 25 {
            let v = c.recv();
            let id = v["id"].as_i64().expect("a reply");
            assert_eq!(abx_code(&v["error"]), "E8007", "{v}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains("py-local"),
                "{v}"
            );
            seen.insert(id);
        }
    }
    eprintln!("100 typed errors {:?} after the kill", t0.elapsed());
    let s = streamer.collect(&exec);
    assert_eq!(s.exits, 1);
    assert!(s.exit["exitCode"].is_null(), "{}", s.exit);
    // The next call runs on a restarted plugin; the daemon is fine.
    assert_eq!(
        c.call("exec/run", json!({"sandbox": full, "command": "echo back"}))["stdout"],
        "back\n"
    );
    let p = provider_status(&mut c, "py-local");
    assert_ne!(p["pid"].as_u64().unwrap() as u32, pid, "{p}");
    assert!(p["restarts"].as_u64().unwrap() >= 1, "{p}");
    for c in clients.iter_mut() {
        assert_eq!(c.call("broker/ping", Value::Null), json!({}));
    }
    let daemon = home.daemon_pid().unwrap();
    assert!(rss_kib(daemon) < 200 * 1024);
    // The killed plugin's commands were in their own sessions: clean them up.
    kill_all(&sleeping());
}

/// docs/design.md#reliability "plugin hangs at handshake": E8002 after the handshake timeout, the plugin (which
/// ignores SIGTERM) is killed, other clients and providers are served meanwhile, doctor says
/// why.
#[test]
fn plugin_hanging_at_handshake_is_typed_killed_and_blocks_no_one() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "bad-handshake");
    let mut waiting = home.connect();
    send_req(
        &mut waiting,
        1,
        "sandbox/list",
        json!({"provider": "bad-handshake"}),
    );
    wait_until("the plugin started", LONG, || {
        !plugin_pids(&home, "bad-handshake").is_empty()
    });
    let hung = plugin_pids(&home, "bad-handshake");
    // While its handshake hangs, everyone else is served.
    let mut other = home.connect();
    assert_eq!(other.call("broker/ping", Value::Null), json!({}));
    let sb = other.create(json!({}));
    assert_eq!(other.sh(&sb, "echo fine")["stdout"], "fine\n");
    assert!(other
        .call("provider/list", Value::Null)
        .to_string()
        .contains("bad-handshake"));
    let v = answer(&mut waiting, 1, LONG).expect("an answer after the handshake timeout");
    assert_eq!(abx_code(&v["error"]), "E8002", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("initialize"),
        "{v}"
    );
    wait_until("the hung plugin killed", LONG, || {
        hung.iter().all(|&p| !alive(p) || is_zombie(p))
    });
    let hs = doctor_check(&mut c, "bad-handshake", "handshake");
    assert_eq!(hs["ok"], false, "{hs}");
    assert_eq!(hs["code"], "E8002", "{hs}");
    assert!(
        hs["detail"].as_str().unwrap().contains("initialize"),
        "{hs}"
    );
    wait_until("no plugin left behind", LONG, || {
        plugin_pids(&home, "bad-handshake").is_empty()
    });
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
}

/// docs/design.md#reliability "plugin floods at handshake": an endless line is cut at the 64 MiB limit (E8009 or
/// E8002), endless notifications end at the handshake timeout (E8002); the daemon's peak
/// memory stays bounded and it serves others throughout.
#[test]
fn plugin_flooding_at_handshake_keeps_memory_bounded() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "bad-handshake");
    let daemon = home.daemon_pid().unwrap();
    let configure = |c: &mut Client, mode: &str| {
        c.call(
            "provider/configure",
            json!({"id": "bad-handshake", "values": {"mode": mode}}),
        );
    };
    configure(&mut c, "flood-line");
    let e = c.call_err("sandbox/list", json!({"provider": "bad-handshake"}));
    assert!(["E8009", "E8002"].contains(&abx_code(&e)), "{e}");
    let hwm_line = status_kib(daemon, "VmHWM");
    eprintln!("after an endless line at handshake: peak RSS {hwm_line} KiB, error {e}");
    assert!(hwm_line < 256 * 1024, "peak RSS {hwm_line} KiB");

    configure(&mut c, "flood-lines");
    let log_before = std::fs::metadata(home.log_file()).map_or(0, |m| m.len());
    let mut waiting = home.connect();
    send_req(
        &mut waiting,
        1,
        "sandbox/list",
        json!({"provider": "bad-handshake"}),
    );
    wait_until("the flood started", LONG, || {
        !plugin_pids(&home, "bad-handshake").is_empty()
    });
    // Served during the flood.
    let mut other = home.connect();
    for _ in 0..20 {
        assert_eq!(other.call("broker/ping", Value::Null), json!({}));
    }
    let v = answer(&mut waiting, 1, LONG).expect("an answer after the handshake timeout");
    assert_eq!(abx_code(&v["error"]), "E8002", "{v}");
    let hwm = status_kib(daemon, "VmHWM");
    let log_after = std::fs::metadata(home.log_file()).map_or(0, |m| m.len());
    eprintln!(
        "after endless notifications at handshake: peak RSS {hwm} KiB, the log grew {} KiB",
        (log_after.saturating_sub(log_before)) / 1024
    );
    assert!(hwm < 256 * 1024, "peak RSS {hwm} KiB");
    wait_until("no plugin left behind", LONG, || {
        plugin_pids(&home, "bad-handshake").is_empty()
    });
    let hs = doctor_check(&mut c, "bad-handshake", "handshake");
    assert_eq!(hs["ok"], false, "{hs}");
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
}

/// docs/design.md#reliability "plugin exits / garbage at handshake" beyond `plugins.rs`: closing stdout while
/// staying alive, exiting 0 silently, dripping a line that never ends, and garbage: each a
/// typed error with a doctor result that says so; a crash loop disables the plugin with a
/// suggestion to run doctor, and doctor gives it another chance.
#[test]
fn plugin_exiting_or_closing_at_handshake_is_restarted_then_disabled() {
    let (home, mut c) = started(&[]);
    let (_r1, _) = install_pinned(&mut c, "bad-handshake");
    let (_r2, _) = install_pinned(&mut c, "bad-garbage");
    // Garbage instead of the initialize reply.
    let e = c.call_err("sandbox/list", json!({"provider": "bad-garbage"}));
    assert!(["E8009", "E8002"].contains(&abx_code(&e)), "{e}");
    let hs = doctor_check(&mut c, "bad-garbage", "handshake");
    assert_eq!(hs["ok"], false, "{hs}");
    assert!(!hs["detail"].as_str().unwrap().is_empty(), "{hs}");

    for mode in ["close", "exit"] {
        c.call(
            "provider/configure",
            json!({"id": "bad-handshake", "values": {"mode": mode}}),
        );
        // Each call restarts it (after a backoff) and fails typed, until five in a minute
        // disable it.
        let mut codes = vec![];
        for _ in 0..6 {
            let e = c.call_err("sandbox/list", json!({"provider": "bad-handshake"}));
            codes.push(abx_code(&e).to_owned());
            if abx_code(&e) == "E8007" {
                assert!(
                    e["data"]["suggestion"]
                        .as_str()
                        .unwrap()
                        .contains("abx provider doctor bad-handshake"),
                    "{e}"
                );
                break;
            }
            assert_eq!(abx_code(&e), "E8002", "{mode}: {e}");
        }
        assert_eq!(
            codes.last().unwrap(),
            "E8007",
            "{mode}: disabled at last: {codes:?}"
        );
        assert!(codes.len() >= 5, "{mode}: {codes:?}");
        // broker/status says so, and why.
        let me = provider_status(&mut c, "bad-handshake");
        assert!(
            me["disabled"].as_str().is_some_and(|d| !d.is_empty()),
            "{me}"
        );
        assert!(me["lastError"].as_str().is_some(), "{me}");
        // Doctor resets the crash history and tries again: still failing, and says so.
        let hs = doctor_check(&mut c, "bad-handshake", "handshake");
        assert_eq!(hs["ok"], false, "{hs}");
        assert_eq!(hs["code"], "E8002", "{mode}: {hs}");
        wait_until("no plugin left behind", LONG, || {
            plugin_pids(&home, "bad-handshake").is_empty()
        });
    }
    // A line that never ends, a byte at a time: the handshake timeout.
    c.call(
        "provider/configure",
        json!({"id": "bad-handshake", "values": {"mode": "drip"}}),
    );
    let e = c.call_err("sandbox/list", json!({"provider": "bad-handshake"}));
    assert_eq!(abx_code(&e), "E8002", "{e}");
    wait_until("no plugin left behind", LONG, || {
        plugin_pids(&home, "bad-handshake").is_empty()
    });
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
}

/// docs/design.md#reliability "a client that never reads" with a plugin stream: a client that starts a flooding
/// exec on a plugin and never reads must not stall the plugin's other clients.
#[test]
fn a_client_that_never_reads_a_plugin_stream_does_not_stall_the_plugin() {
    let (home, mut c) = started(&[("ABX_PLUGIN_TIMEOUT_SECS", "30")]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (_, full) = plugin_sandbox(&mut c, "py-local");
    let mut stalled = home.connect();
    let marker = format!("flood-{}", std::process::id());
    stalled.call(
        "exec/start",
        json!({"sandbox": full, "command": format!("yes {marker}")}),
    );
    // The stalled client never reads again: once its socket is full, the flood fills the
    // daemon's queue for it and the plugin's route.
    wait_until("the stalled client's socket full", LONG, || {
        stalled.unread() >= abx_tests::SOCKET_FULL
    });
    let daemon = home.daemon_pid().unwrap();
    let mut other = home.connect();
    for i in 0..10 {
        send_req(
            &mut other,
            100 + i,
            "exec/run",
            json!({"sandbox": full, "command": "echo ok"}),
        );
        let v = answer(&mut other, 100 + i, Duration::from_secs(40)).unwrap_or_else(|| {
            panic!("call {i} on the plugin got no answer while another client did not read")
        });
        assert_eq!(v["result"]["stdout"], "ok\n", "call {i}: {v}");
    }
    let rss = rss_kib(daemon);
    eprintln!("daemon RSS {rss} KiB with a plugin stream nobody reads");
    assert!(rss < 200 * 1024, "RSS {rss} KiB");
    drop(stalled);
    kill_all(&pids_where(|a| a.iter().any(|x| x == &marker)));
}

// ---------------------------------------------------------------------------------------------
// The daemon killed mid-operation
// ---------------------------------------------------------------------------------------------

/// A fixture repo with py-local and `n` extra files, so an install takes a while.
fn big_plugin_repo(n: usize) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("plugin");
    copy_dir(&fixture("py-local"), &root);
    for d in 0..(n / 200).max(1) {
        let sub = root.join(format!("assets/d{d:03}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..200 {
            let body = format!("{d}/{f} {}\n", "lorem ipsum ".repeat(40 + (f % 7) * 30));
            std::fs::write(sub.join(format!("f{f:03}.txt")), body).unwrap();
        }
    }
    git(dir.path(), &["init", "-q", "-b", "main"]);
    git(dir.path(), &["add", "-A"]);
    git(dir.path(), &["commit", "-q", "-m", "big fixture"]);
    let commit = git(dir.path(), &["rev-parse", "HEAD"]);
    let url = format!("file://{}", dir.path().display());
    (dir, url, commit)
}

/// After a restart: the registry file, the provider trees and what the daemon says agree,
/// with no leftovers. Returns whether `id` is installed.
fn registry_consistent(home: &Home, c: &mut Client, id: &str) -> bool {
    let dir = home.path.join("data/providers");
    let recs: Vec<Value> = std::fs::read(dir.join("installed.json"))
        .ok()
        .map(|b| {
            let v: Value = serde_json::from_slice(&b).expect("installed.json is valid JSON");
            match v {
                Value::Array(a) => a,
                Value::Object(o) => o
                    .get("providers")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_else(|| o.values().cloned().collect()),
                _ => panic!("installed.json: {v}"),
            }
        })
        .unwrap_or_default();
    let on_disk: BTreeSet<String> = recs
        .iter()
        .filter_map(|r| r["id"].as_str().map(str::to_owned))
        .collect();
    let listed: BTreeSet<String> = c.call("provider/list", Value::Null)["providers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] != "builtin")
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(on_disk, listed, "the registry file and provider/list agree");
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                !name.starts_with(".staging-") && !name.contains(".tmp"),
                "a leftover after the restart: {name}"
            );
            if e.path().is_dir() {
                // Its trees (named by digest); `data` and `tmp` are the plugin's own (an
                // uninstalled plugin's stay until the next start).
                let trees: Vec<PathBuf> = std::fs::read_dir(e.path())
                    .unwrap()
                    .flatten()
                    .map(|t| t.path())
                    .filter(|t| t.file_name().is_some_and(|n| n != "data" && n != "tmp"))
                    .collect();
                let want = usize::from(on_disk.contains(&name));
                assert_eq!(trees.len(), want, "{name}: trees {trees:?}");
            }
        }
    }
    let installed = listed.contains(id);
    if installed {
        let integ = doctor_check(c, id, "integrity");
        assert_eq!(integ["ok"], true, "a listed provider verifies: {integ}");
    } else {
        let e = c.call_err("provider/info", json!({"id": id}));
        assert_eq!(abx_code(&e), "E8001", "{e}");
    }
    installed
}

/// docs/design.md#reliability "daemon killed during install": SIGKILL at points spread over an install; after each
/// restart the provider is either fully installed and verified or not there at all, nothing
/// is left over, and installing (again) works.
#[test]
fn daemon_killed_during_install_leaves_no_half_installed_provider() {
    let (_repo, url, commit) = big_plugin_repo(3000);
    let params = json!({"source": url, "subdir": "plugin", "ref": commit, "allowInsecureTransport": true, "confirm": true});
    // How long one install takes here, to spread the kills over it.
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let t0 = Instant::now();
    c.call("provider/install", params.clone());
    let took = t0.elapsed();
    eprintln!("one install of the big fixture: {took:?}");
    c.call(
        "provider/uninstall",
        json!({"id": "py-local", "confirm": true}),
    );
    let mut outcomes = vec![];
    for i in 1..=6u32 {
        let mut c = home.connect();
        send_req(&mut c, 1, "provider/install", params.clone());
        std::thread::sleep(took * i / 4);
        kill_daemon(&home);
        restart(&home);
        let mut c = home.connect();
        let installed = registry_consistent(&home, &mut c, "py-local");
        outcomes.push(installed);
        if installed {
            assert_eq!(
                c.call("sandbox/list", json!({"provider": "py-local"}))["sandboxes"],
                json!([])
            );
            c.call(
                "provider/uninstall",
                json!({"id": "py-local", "confirm": true}),
            );
        }
        assert!(!registry_consistent(&home, &mut c, "py-local"));
    }
    eprintln!("installed when killed at 1/4 .. 6/4 of an install: {outcomes:?}");
    // After all that, a clean install.
    let mut c = home.connect();
    c.call("provider/install", params);
    assert!(registry_consistent(&home, &mut c, "py-local"));
}

/// After a restart: every local sandbox directory has its record, `sandbox/list` shows
/// exactly those, each works by its bare id, and the index names only existing sandboxes.
fn sandboxes_consistent(home: &Home, c: &mut Client) -> BTreeSet<String> {
    let root = home.path.join("data/local/sandboxes");
    let dirs: BTreeSet<String> = std::fs::read_dir(&root)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for d in &dirs {
        let rec = std::fs::read(root.join(d).join("sandbox.json"))
            .unwrap_or_else(|e| panic!("{d} has no record after the restart: {e}"));
        let _: Value = serde_json::from_slice(&rec).expect("a record is valid JSON");
    }
    let listed = sandbox_ids(c, json!({"provider": "local"}));
    assert_eq!(dirs, listed, "directories and sandbox/list agree");
    for id in listed.iter().take(5) {
        assert_eq!(
            c.sh(id, "echo ok")["stdout"],
            "ok\n",
            "{id} works by its bare id"
        );
    }
    let index = abx_tests::sandbox_index(&home.path);
    for (id, provider) in &index {
        if provider == "local" && !listed.contains(id) {
            let e = c.call_err("sandbox/info", json!({"sandbox": id}));
            assert_eq!(
                abx_code(&e),
                "E2009",
                "a stale index entry is just not found: {e}"
            );
        }
    }
    listed
}

/// docs/design.md#reliability "daemon killed during create": two clients create sandboxes as fast as they can; the
/// daemon is killed; after the restart the records, the list and the index agree.
#[test]
fn daemon_killed_during_create_keeps_sandboxes_and_index_consistent() {
    let home = Home::new();
    // Dozens of sandboxes live at once: small process limits keep them within the budget
    // of all sandboxes (half of pid_max, 16384 where pid_max is 32768).
    std::fs::create_dir_all(home.path.join("config")).unwrap();
    std::fs::write(home.path.join("config/config.toml"), "[local]\npids = 64\n").unwrap();
    home.start();
    for round in 0..3 {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let mut stream = UnixStream::connect(home.socket()).unwrap();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut n = 0;
                    for i in 0.. {
                        let body = json!({"jsonrpc": "2.0", "id": i, "method": "sandbox/create", "params": {"timeout": 600}});
                        let framed = frame(Framing::Line, body.to_string().as_bytes());
                        if stream.write_all(&framed).is_err() {
                            break;
                        }
                        // Until the daemon dies: EOF or a reset.
                        let mut line = String::new();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => break,
                            Ok(_) if line.contains("\"result\"") => n += 1,
                            Ok(_) => panic!("a create failed: {line}"),
                        }
                    }
                    n
                })
            })
            .collect();
        let root = home.path.join("data/local/sandboxes");
        let before = std::fs::read_dir(&root).map_or(0, |d| d.count());
        wait_until("creates under way", LONG, || {
            std::fs::read_dir(&root).map_or(0, |d| d.count()) >= before + 5 + round * 7
        });
        kill_daemon(&home);
        let created: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        restart(&home);
        let mut c = home.connect();
        let listed = sandboxes_consistent(&home, &mut c);
        eprintln!(
            "round {round}: {created} creates answered before the kill, {} sandboxes after",
            listed.len()
        );
        assert!(listed.len() >= created, "every answered create survives");
        // And creating works again.
        let id = c.create(json!({}));
        assert_eq!(c.sh(&id, "echo again")["stdout"], "again\n");
    }
}

/// docs/design.md#reliability "daemon killed during upload": the target keeps its old content or has the whole new
/// one, no temp file is left in the sandbox, and the sandbox and the index are consistent.
#[test]
fn daemon_killed_during_upload_leaves_the_old_file_or_the_new_one() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let sb = c.create(json!({"timeout": 600}));
    c.call(
        "files/write",
        json!({"sandbox": sb, "path": "big.bin", "data": "old"}),
    );
    // A 1 GiB sparse file: reading it costs no disk.
    let (src_dir, src) = sparse_file(1 << 30);
    send_req(
        &mut c,
        7,
        "files/upload",
        json!({"sandbox": sb, "localPath": src, "path": "big.bin"}),
    );
    // Kill as soon as the upload reports progress (it is then under way).
    let mut finished = false;
    loop {
        let v = c.recv();
        if v["method"] == "files/progress" && v["params"]["bytes"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        if v["id"] == 7 {
            finished = true;
            break;
        }
    }
    kill_daemon(&home);
    restart(&home);
    let mut c = home.connect();
    let listed = sandboxes_consistent(&home, &mut c);
    assert!(listed.contains(&sb));
    let size = c.call("files/stat", json!({"sandbox": sb, "path": "big.bin"}))["size"]
        .as_u64()
        .unwrap();
    eprintln!("upload finished before the kill: {finished}; size after the restart: {size}");
    assert!(
        size == 3 || size == 1 << 30,
        "the old file or the whole new one, not {size} bytes"
    );
    if size == 3 {
        assert_eq!(
            c.call("files/read", json!({"sandbox": sb, "path": "big.bin"}))["data"],
            "old"
        );
    }
    let ws = home.path.join("data/local/sandboxes").join(&sb);
    for area in ["workspace", "tmp"] {
        for e in std::fs::read_dir(ws.join(area)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(!name.starts_with(".abx-tmp-"), "a temp file left: {name}");
        }
    }
    // Uploading again works.
    let small = src_dir.path().join("small.txt");
    std::fs::write(&small, "new content\n").unwrap();
    c.call(
        "files/upload",
        json!({"sandbox": sb, "localPath": small, "path": "big.bin"}),
    );
    assert_eq!(c.sh(&sb, "cat big.bin")["stdout"], "new content\n");
}

/// The same for a plugin (broker-side chunked upload through `files/write` to a temporary
/// sibling, then `files/rename`): the registry and the plugin's sandboxes are consistent after
/// the restart, and the target holds the old file or the whole new one, never a part.
#[test]
fn daemon_killed_during_a_plugin_upload_keeps_registry_and_sandboxes() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (sb, full) = plugin_sandbox(&mut c, "py-local");
    c.call(
        "files/write",
        json!({"sandbox": full, "path": "big.bin", "data": "old"}),
    );
    let (_src_dir, src) = sparse_file(256 << 20);
    send_req(
        &mut c,
        7,
        "files/upload",
        json!({"sandbox": full, "localPath": src, "path": "big.bin"}),
    );
    loop {
        let v = c.recv();
        if v["method"] == "files/progress" || v["id"] == 7 {
            break;
        }
    }
    kill_daemon(&home);
    wait_until("the orphaned plugin exits", LONG, || {
        plugin_pids(&home, "py-local").is_empty()
    });
    restart(&home);
    let mut c = home.connect();
    assert!(registry_consistent(&home, &mut c, "py-local"));
    let ids = sandbox_ids(&mut c, json!({"provider": "py-local"}));
    assert!(ids.contains(&sb), "{ids:?}");
    let size = c.call("files/stat", json!({"sandbox": full, "path": "big.bin"}))["size"]
        .as_u64()
        .unwrap();
    assert!(
        size == 3 || size == 256 << 20,
        "plugin upload killed: the target holds {size} bytes (old 3, new {})",
        256u64 << 20
    );
    assert_eq!(
        c.call("exec/run", json!({"sandbox": full, "command": "echo ok"}))["stdout"],
        "ok\n"
    );
}

// ---------------------------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------------------------

/// The daemon's RSS once it stops moving: three reads 50 ms apart within 64 KiB of each
/// other (the allocator returning memory after a burst), at most 10 s.
fn settled_rss(pid: u32) -> u64 {
    let mut last = vec![rss_kib(pid)];
    wait_until(
        "the daemon's RSS to settle",
        Duration::from_secs(10),
        || {
            std::thread::sleep(Duration::from_millis(50));
            last.push(rss_kib(pid));
            let n = last.len();
            n >= 3 && last[n - 3..].iter().max().unwrap() - last[n - 3..].iter().min().unwrap() < 64
        },
    );
    *last.last().unwrap()
}

/// docs/design.md#reliability / docs/design.md#bars "1000 idle connections": all are served, the daemon's memory grows by a bounded
/// amount (printed; the bar is 32 MiB, measured by `scripts/bench`), other clients are
/// unaffected, and closing them gives everything back.
#[test]
fn a_thousand_idle_connections() {
    let limit = raise_nofile(4096);
    assert!(
        limit >= 1100,
        "RLIMIT_NOFILE {limit} is too low for this test"
    );
    let home = Home::new();
    // No ready sandboxes (issue 48): they hold descriptors of their own, refilled as the
    // sandbox below is taken, and this test counts what connections hold and give back.
    std::fs::create_dir_all(home.path.join("config")).unwrap();
    std::fs::write(home.path.join("config/config.toml"), "[local]\npool = 0\n").unwrap();
    let pid = home.start();
    let mut probe = home.connect();
    assert_eq!(probe.call("broker/ping", Value::Null), json!({}));
    settled_rss(pid);
    let (rss0, fds0) = (rss_kib(pid), fd_count(pid));
    let mut idle: Vec<Client> = Vec::with_capacity(1000);
    for i in 0..1000 {
        let mut c = home.connect_with(if i % 4 == 3 {
            Framing::Header
        } else {
            Framing::Line
        });
        // Half say something first (so their framing is known), half never say a word.
        if i % 2 == 0 {
            assert_eq!(c.call("broker/ping", Value::Null), json!({}));
        }
        idle.push(c);
    }
    wait_until("1000 connections counted", LONG, || {
        probe.call("broker/status", Value::Null)["connections"]
            .as_u64()
            .unwrap()
            >= 1001
    });
    let rss1 = settled_rss(pid);
    let grew = rss1.saturating_sub(rss0);
    eprintln!(
        "1000 idle connections: RSS {rss0} -> {rss1} KiB (+{grew} KiB, {} B each), fds {fds0} -> {}",
        grew * 1024 / 1000,
        fd_count(pid)
    );
    assert!(grew < 64 * 1024, "1000 idle connections added {grew} KiB");
    // Someone new is served at once, and every idle one still is.
    let mut fresh = home.connect();
    assert_eq!(fresh.call("broker/ping", Value::Null), json!({}));
    let sb = fresh.create(json!({}));
    assert_eq!(fresh.sh(&sb, "echo ok")["stdout"], "ok\n");
    for c in idle.iter_mut() {
        assert_eq!(c.call("broker/ping", Value::Null), json!({}));
    }
    drop(idle);
    fresh.call("sandbox/kill", json!({"sandbox": sb}));
    wait_until("connections closed", LONG, || {
        probe.call("broker/status", Value::Null)["connections"]
            .as_u64()
            .unwrap()
            <= 2
    });
    // What the first sandbox leaves for the next ones: the zygote's socket, and the spare
    // outer process's socket and pidfd (docs/local-sandboxes.md).
    const LOCAL_KEEPS: usize = 3;
    wait_until("their fds released", LONG, || {
        fd_count(pid) <= fds0 + 2 + LOCAL_KEEPS
    });
}

/// docs/design.md#reliability "another uid connects": refused every time without leaking a descriptor, and the
/// daemon's own clients notice nothing. (`daemon.rs` checks a single refusal and its log.)
#[test]
fn another_uid_is_refused_every_time_without_leaking() {
    use std::os::unix::process::CommandExt;
    let home = Home::new();
    let pid = home.start();
    // Only the peer check stands between another user and the daemon.
    let ping = home.open_to_other_users();
    let mut mine = home.connect();
    assert_eq!(mine.call("broker/ping", Value::Null), json!({}));
    let fds0 = fd_count(pid);
    // 50 probes from another uid, 4 at a time, while our client keeps calling.
    for batch in 0..13 {
        let kids: Vec<_> = (0..4)
            .map(|_| {
                std::process::Command::new(&ping)
                    .arg(home.socket())
                    .uid(65534)
                    .gid(65534)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for k in kids {
            let out = k.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                text.trim(),
                "EOF",
                "batch {batch}: another uid was served: {text}"
            );
        }
        assert_eq!(mine.call("broker/ping", Value::Null), json!({}));
    }
    wait_until("no descriptor kept for refused peers", LONG, || {
        fd_count(pid) <= fds0
    });
    assert_eq!(
        mine.call("broker/status", Value::Null)["connections"],
        json!(1)
    );
}

/// A plugin that hangs at every handshake is disabled after five failed starts (here with a
/// 1 s handshake timeout, `ABX_PLUGIN_HANDSHAKE_SECS`), with a doctor-pointing error and
/// `broker/status` saying why.
#[test]
fn plugin_hanging_at_every_handshake_is_disabled() {
    let (home, mut c) = started(&[("ABX_PLUGIN_HANDSHAKE_SECS", "1")]);
    let (_repo, _) = install_pinned(&mut c, "bad-handshake");
    let mut codes = vec![];
    for _ in 0..7 {
        let e = c.call_err("sandbox/list", json!({"provider": "bad-handshake"}));
        codes.push(abx_code(&e).to_owned());
        if abx_code(&e) == "E8007" {
            break;
        }
        assert!(
            e["error"]["message"]
                .as_str()
                .or(e["message"].as_str())
                .unwrap_or_default()
                .contains("within 1 s"),
            "{e}"
        );
    }
    assert_eq!(codes.len(), 6, "five E8002 then disabled: {codes:?}");
    assert!(codes[..5].iter().all(|c| c == "E8002"), "{codes:?}");
    let me = provider_status(&mut c, "bad-handshake");
    assert!(
        me["disabled"]
            .as_str()
            .is_some_and(|d| d.contains("initialize")),
        "{me}"
    );
    wait_until("no plugin left behind", LONG, || {
        plugin_pids(&home, "bad-handshake").is_empty()
    });
}
