//! Ready sandboxes (issue 48): `sandbox/create` served from a pool of sandboxes built ahead,
//! against a real daemon. A pooled sandbox is a sandbox of its own, never a used one: the
//! attacker's leftovers in one (files, processes, shared memory, sockets) are looked for from
//! the next, which came from the pool. The pool is switched off with `[local] pool = 0`,
//! does not count against the cap on live sandboxes, counts in the process budget, and is
//! gone with the daemon.

use abx_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// A home whose broker config is `config`, started.
fn home_with(config: &str) -> Home {
    let home = Home::new();
    std::fs::create_dir_all(home.path.join("config")).unwrap();
    std::fs::write(home.path.join("config/config.toml"), config).unwrap();
    home.start();
    home
}

/// What `provider/info` says of the local pool.
fn pool(c: &mut Client) -> Value {
    c.call("provider/info", json!({"id": "local"}))["pool"].clone()
}

fn wait_ready(c: &mut Client, n: u64) {
    wait_until(&format!("{n} ready sandboxes"), WAIT, || {
        let p = pool(c);
        p["ready"] == n && p["filling"] == false
    });
}

fn out(r: &Value) -> String {
    format!(
        "{}{}",
        r["stdout"].as_str().unwrap_or(""),
        r["stderr"].as_str().unwrap_or("")
    )
}

fn marker(what: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("abx-{what}-{}-{n}", std::process::id())
}

/// Host pids whose command line contains `needle`.
fn host_pids_with(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
        })
        .collect()
}

/// Every descendant of `pid` (through each thread's `children`).
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let kids: Vec<u32> = std::fs::read_dir(format!("/proc/{p}/task"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                    .flat_map(|s| {
                        s.split_whitespace()
                            .filter_map(|x| x.parse().ok())
                            .collect::<Vec<u32>>()
                    })
                    .collect()
            })
            .unwrap_or_default();
        all.extend(&kids);
        todo.extend(kids);
    }
    all
}

#[test]
fn a_create_is_served_from_the_pool_with_a_fresh_hostname_and_workspace() {
    let home = home_with("");
    let mut c = home.connect();
    assert_eq!(pool(&mut c)["size"], 2, "the default size");
    // The first create builds its sandbox (nothing is built before the provider is used)
    // and starts the refill.
    let a = c.create(json!({"env": {"WHO": "a"}}));
    wait_ready(&mut c, 2);
    let served = pool(&mut c)["served"].as_u64().unwrap();
    let b = c.create(json!({"env": {"WHO": "b"}, "metadata": {"k": "v"}, "timeout": 120}));
    let p = pool(&mut c);
    assert_eq!(p["served"].as_u64().unwrap(), served + 1, "{p}");
    assert_ne!(a, b);
    // Its own id, hostname, workspace, env, lifetime and metadata; listed, in its place.
    let r = c.sh(
        &b,
        "hostname; echo $WHO $ABX_SANDBOX_ID; ls -A /workspace | wc -l",
    );
    assert_eq!(out(&r), format!("{b}\nb {b}\n0\n"));
    let info = c.call("sandbox/info", json!({"sandbox": b}));
    assert_eq!(info["timeout"], 120, "{info}");
    assert_eq!(info["metadata"]["k"], "v", "{info}");
    let listed = c.call("sandbox/list", json!({}));
    let ids: Vec<&str> = listed["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "ready sandboxes are not listed: {listed}");
    assert!(home
        .path
        .join("data/local/sandboxes")
        .join(&b)
        .join("sandbox.json")
        .exists());
    // Its files are where a sandbox's files are, for files/* as for the host.
    c.call(
        "files/write",
        json!({"sandbox": b, "path": "/workspace/f", "data": "hi"}),
    );
    assert_eq!(c.sh(&b, "cat /workspace/f")["stdout"], "hi");
    assert_eq!(
        std::fs::read_to_string(
            home.path
                .join("data/local/sandboxes")
                .join(&b)
                .join("workspace/f")
        )
        .unwrap(),
        "hi"
    );
    // Shapes: another network mode or other limits are not served by the default's pool.
    let served = pool(&mut c)["served"].as_u64().unwrap();
    c.create(json!({"network": "host"}));
    assert_eq!(
        pool(&mut c)["served"].as_u64().unwrap(),
        served,
        "network host"
    );
}

/// The attacker's leftovers in a sandbox, looked for from the next one (served from the
/// pool): files in /tmp, /workspace and /dev/shm, a detached process (setsid, double fork),
/// a SysV shared memory segment, an abstract Unix socket and a named one.
#[test]
fn nothing_of_an_earlier_sandbox_reaches_the_next() {
    let home = home_with("");
    let mut c = home.connect();
    let first = c.create(json!({}));
    c.call("sandbox/kill", json!({"sandbox": first}));
    wait_ready(&mut c, 2);
    let a = c.create(json!({}));
    let m = marker("left");
    let leave = format!(
        r#"echo {m} > /tmp/{m}; echo {m} > /workspace/{m}; echo {m} > /dev/shm/{m}
ipcmk -M 4096 >/dev/null && ipcs -m | grep -c 0x
setsid -f sh -c '(setsid -f bash -c "exec -a {m} sleep 3011" &) ; true' >/dev/null 2>&1
setsid -f python3 -c '
import socket, time
a = socket.socket(socket.AF_UNIX); a.bind("\0{m}"); a.listen()
n = socket.socket(socket.AF_UNIX); n.bind("/tmp/{m}.sock"); n.listen()
open("/tmp/{m}.up", "w").close()
time.sleep(3011)
' >/dev/null 2>&1
for i in $(seq 200); do [ -e /tmp/{m}.up ] && break; sleep 0.05; done
grep -c {m} /proc/net/unix; ls /proc | grep -c '^[0-9]'"#
    );
    let r = c.sh(&a, &leave);
    let text = out(&r);
    // What was left is there in A (the checks below can find it).
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"1"), "the shm segment: {text}");
    assert_eq!(lines.get(1), Some(&"2"), "both sockets: {text}");
    wait_until("the detached process runs", WAIT, || {
        !host_pids_with(&m).is_empty()
    });
    let served = pool(&mut c)["served"].as_u64().unwrap();
    // The marker never written whole in this script (its own command line would match): a
    // pattern that matches it, and a name Python joins.
    let (pat, m1, m2) = (format!("[{}]{}", &m[..1], &m[1..]), &m[..4], &m[4..]);
    let look = format!(
        r#"ls -A /tmp /workspace /dev/shm | grep -c '{pat}'
ipcs -m | grep -c 0x
grep -c '{pat}' /proc/net/unix
for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done | grep -c '{pat}'
python3 -c '
import socket
for addr in ("\0" "{m1}" "{m2}", "/tmp/" "{m1}" "{m2}" ".sock"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(addr); print("reached", repr(addr))
    except OSError:
        print("refused")
'"#
    );
    // The same look from A finds every one of them (the look can fail).
    let in_a = out(&c.sh(&a, &look));
    let counts: Vec<&str> = in_a.lines().take(4).collect();
    assert!(
        counts.iter().all(|n| n.parse::<u32>().is_ok_and(|n| n > 0)) && !in_a.contains("refused"),
        "A's leftovers not found from A: {in_a}"
    );
    c.call("sandbox/kill", json!({"sandbox": a}));
    let b = c.create(json!({}));
    assert_eq!(
        pool(&mut c)["served"].as_u64().unwrap(),
        served + 1,
        "B came from the pool"
    );
    let text = out(&c.sh(&b, &look));
    assert_eq!(
        text, "0\n0\n0\n0\nrefused\nrefused\n",
        "B sees what A left: {text}"
    );
    // And on the host the detached process went with A.
    wait_until("A's detached processes are gone", WAIT, || {
        host_pids_with(&m).is_empty()
    });
}

#[test]
fn the_pool_can_be_switched_off() {
    let home = home_with("[local]\npool = 0\n");
    let mut c = home.connect();
    let a = c.create(json!({}));
    let b = c.create(json!({}));
    assert_eq!(c.sh(&b, "hostname")["stdout"], format!("{b}\n"));
    c.call("sandbox/kill", json!({"sandbox": a}));
    let p = pool(&mut c);
    assert_eq!(
        (
            &p["size"],
            &p["ready"],
            &p["served"],
            &p["built"],
            &p["filling"]
        ),
        (&json!(0), &json!(0), &json!(0), &json!(0), &json!(false)),
        "{p}"
    );
    let pooled = std::fs::read_dir(home.path.join("data/local/pool")).map_or(0, |d| d.count());
    assert_eq!(pooled, 0);
}

/// The cap counts live sandboxes only: ready ones do not take a place under it, and a
/// killed one's place is free when kill answers.
#[test]
fn the_cap_counts_live_sandboxes_only_and_kill_frees_a_place_at_once() {
    let home = home_with("[local]\nmax_sandboxes = 2\n");
    let mut c = home.connect();
    let first = c.create(json!({}));
    c.call("sandbox/kill", json!({"sandbox": first}));
    wait_ready(&mut c, 2);
    // Two ready, none live: the cap's two creates succeed.
    let a = c.create(json!({}));
    c.create(json!({}));
    let e = c.call_err("sandbox/create", json!({}));
    assert_eq!(abx_code(&e), "E2006", "{e}");
    for _ in 0..3 {
        // Killed, then at once (no wait) another: its place is free.
        let ids: Vec<String> = c.call("sandbox/list", json!({}))["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect();
        c.call("sandbox/kill", json!({"sandbox": ids[0]}));
        c.create(json!({}));
    }
    let _ = a;
}

/// Ready sandboxes count in the process budget (half of pid_max): they make way for a create
/// that fits without them, and none is built while the budget is short.
#[test]
fn ready_sandboxes_count_in_the_process_budget() {
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let budget = pid_max / 2;
    let home = home_with("[local]\npids = 64\n");
    let mut c = home.connect();
    let first = c.create(json!({}));
    c.call("sandbox/kill", json!({"sandbox": first}));
    wait_ready(&mut c, 2);
    // Fits only once the two ready ones (2 x 64) make way.
    let big = c.create(json!({"limits": {"pids": budget - 100}}));
    // Every create pokes the refill; it builds nothing while a default sandbox and a ready
    // one would not both fit.
    let small = c.create(json!({"limits": {"pids": 32}}));
    wait_until("the refill has looked", WAIT, || {
        pool(&mut c)["filling"] == false
    });
    let p = pool(&mut c);
    assert_eq!(p["ready"], 0, "{p}");
    // Past the budget with no ready sandbox to make way: refused. Killing the big one makes
    // room, and ready sandboxes come back.
    let e = c.call_err("sandbox/create", json!({"limits": {"pids": 80}}));
    assert_eq!(abx_code(&e), "E2006", "{e}");
    c.call("sandbox/kill", json!({"sandbox": big}));
    c.create(json!({}));
    wait_ready(&mut c, 2);
    c.call("sandbox/kill", json!({"sandbox": small}));
}

/// The daemon stopping takes its ready sandboxes with it: processes, directories, cgroups.
#[test]
fn a_stopped_daemon_leaves_no_ready_sandbox() {
    let home = home_with("");
    let mut c = home.connect();
    let first = c.create(json!({}));
    wait_ready(&mut c, 2);
    let daemon = home.daemon_pid().expect("daemon pid");
    let procs = descendants(daemon);
    let pooled: Vec<String> = std::fs::read_dir(home.path.join("data/local/pool"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(pooled.len(), 2, "{pooled:?}");
    // Each ready sandbox's init runs (its processes are the daemon's descendants).
    assert!(procs.len() >= 4, "{procs:?}");
    drop(c);
    assert!(home.run(&["broker", "stop"]).status.success());
    wait_until("every sandbox process is gone", WAIT, || {
        procs.iter().all(|p| !alive(*p))
    });
    wait_until("the ready sandboxes' directories are gone", WAIT, || {
        pooled
            .iter()
            .all(|id| !home.path.join("data/local/pool").join(id).exists())
    });
    for id in &pooled {
        for ctl in ["pids", "memory", "cpu", "freezer", "unified"] {
            let cg = format!("/sys/fs/cgroup/{ctl}/abx/{id}");
            assert!(!std::path::Path::new(&cg).exists(), "{cg} left");
        }
        assert!(!home.path.join("data/local/sandboxes").join(id).exists());
    }
    let _ = first;
}

/// `abx run` in one request: `exec/run` and `exec/start` with `create` instead of `sandbox`
/// make a sandbox for the command alone (from the pool), name it in the reply, and kill it
/// once the command has ended, reported `created` and `killed` as any other.
#[test]
fn a_command_in_a_sandbox_of_its_own_is_one_request() {
    let home = home_with("");
    let mut c = home.connect();
    c.call("sandbox/subscribe", json!({}));
    let gone = |c: &mut Client, id: &str| {
        wait_until(&format!("{id} killed"), WAIT, || {
            c.call("sandbox/list", json!({}))["sandboxes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["id"] != id)
        });
    };
    let r = c.call(
        "exec/run",
        json!({"create": {"env": {"WHO": "once"}}, "command": "echo $WHO $(hostname); exit 3"}),
    );
    let id = r["sandbox"]
        .as_str()
        .unwrap()
        .strip_prefix("local:")
        .unwrap()
        .to_owned();
    assert_eq!(r["exitCode"], 3, "{r}");
    assert_eq!(r["stdout"], format!("once {id}\n"), "{r}");
    gone(&mut c, &id);
    wait_until("its directory is gone", WAIT, || {
        !home.path.join("data/local/sandboxes").join(&id).exists()
    });
    // Subscribers were told, as of any sandbox.
    let mut changes = Vec::new();
    while changes.len() < 2 {
        let v = c.recv();
        let of = v["params"]["sandbox"].as_str().unwrap_or_default();
        if v["method"] == "sandbox/changed" && of.ends_with(id.as_str()) {
            changes.push(v["params"]["change"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(changes, ["created", "killed"]);
    // Streamed: the reply names the sandbox; it goes once the command has exited.
    let s = c.call(
        "exec/start",
        json!({"create": {}, "command": "read x; echo got $x", "stdin": "it\n"}),
    );
    let id = s["sandbox"]
        .as_str()
        .unwrap()
        .strip_prefix("local:")
        .unwrap()
        .to_owned();
    let out = c.collect(s["execId"].as_str().unwrap());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "got it\n");
    gone(&mut c, &id);
    // A command that fails to start leaves no sandbox either. (From the pool: once it is
    // full again, since the runs above took from it and a loaded machine refills slowly.)
    wait_ready(&mut c, 2);
    let before = pool(&mut c)["served"].as_u64().unwrap();
    c.request(
        "exec/run",
        json!({"create": {}, "argv": ["/no/such/program"]}),
    );
    assert!(
        pool(&mut c)["served"].as_u64().unwrap() > before,
        "served from the pool"
    );
    wait_until("nothing live", WAIT, || {
        c.call("sandbox/list", json!({}))["sandboxes"] == json!([])
    });
    // Both, or neither: refused.
    let sb = c.create(json!({}));
    let e = c.call_err(
        "exec/run",
        json!({"sandbox": sb, "create": {}, "command": "true"}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    let e = c.call_err("exec/run", json!({"command": "true"}));
    assert_eq!(abx_code(&e), "E1004", "{e}");
}
