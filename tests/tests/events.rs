//! Issue 21, events instead of polling: `sandbox/subscribe` / `sandbox/unsubscribe` and the
//! `sandbox/changed` notifications, against the real daemon over its socket, with real
//! `local` sandboxes and a real plugin (py-local). Also: a plugin exec's output while its
//! client is gone is kept by the broker and replayed by `exec/attach`.

use abx_tests::fixtures::{install_pinned, plugin_sandbox, started};
use abx_tests::{wait_until, Client, Home};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Generous: a liveness bound, never a speed assertion.
const DEADLINE: Duration = Duration::from_secs(60);

/// The next `sandbox/changed` params for `sandbox` (other messages are skipped), waiting at
/// most [`DEADLINE`].
fn next_change(c: &mut Client, sandbox: &str) -> Value {
    let until = Instant::now() + DEADLINE;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no sandbox/changed for {sandbox} in time");
        let Some(v) = c.try_recv(left.min(Duration::from_secs(5))) else {
            continue;
        };
        if v["method"] == "sandbox/changed" && v["params"]["sandbox"] == sandbox {
            return v["params"].clone();
        }
    }
}

/// Every `sandbox/changed` this client has received so far: a ping round trip first, so
/// whatever was queued for it before the ping has arrived.
fn changes_so_far(c: &mut Client) -> Vec<Value> {
    c.call("broker/ping", Value::Null);
    let mut out = Vec::new();
    while let Some(v) = c.try_recv(Duration::from_millis(1)) {
        if v["method"] == "sandbox/changed" {
            out.push(v["params"].clone());
        }
    }
    out
}

fn subscribe(c: &mut Client) {
    assert_eq!(c.call("sandbox/subscribe", json!({})), json!({}));
}

#[test]
fn a_subscriber_sees_what_another_client_does_on_local() {
    let home = Home::new();
    home.start();
    let mut a = home.connect();
    let mut b = home.connect();
    let mut quiet = home.connect();
    subscribe(&mut a);
    // Idempotent, also with by-position empty params and no params at all.
    subscribe(&mut a);
    assert_eq!(a.call("sandbox/subscribe", json!([])), json!({}));
    assert_eq!(a.call("sandbox/subscribe", Value::Null), json!({}));

    let sb = b.create(json!({"timeout": 600, "metadata": {"who": "b"}}));
    let c = next_change(&mut a, &sb);
    assert_eq!(
        (&c["change"], &c["provider"], &c["sandboxInfo"]["id"]),
        (&json!("created"), &json!("local"), &json!(sb)),
        "{c}"
    );
    assert_eq!(c["sandboxInfo"]["metadata"]["who"], "b");
    assert_eq!(c["sandboxInfo"]["status"], "running");

    b.call("sandbox/pause", json!({"sandbox": sb}));
    let c = next_change(&mut a, &sb);
    assert_eq!(
        (&c["change"], &c["sandboxInfo"]["status"]),
        (&json!("paused"), &json!("paused")),
        "{c}"
    );
    b.call("sandbox/resume", json!({"sandbox": sb}));
    let c = next_change(&mut a, &sb);
    assert_eq!(
        (&c["change"], &c["sandboxInfo"]["status"]),
        (&json!("resumed"), &json!("running")),
        "{c}"
    );
    // The provider:id form addresses it too; the notification names it as sandbox/list does.
    let r = b.call(
        "sandbox/setTimeout",
        json!({"sandbox": format!("local:{sb}"), "timeout": 900}),
    );
    let c = next_change(&mut a, &sb);
    assert_eq!(
        (&c["change"], &c["sandbox"], &c["sandboxInfo"]["timeout"]),
        (&json!("timeout"), &json!(sb), &json!(900)),
        "{c}"
    );
    assert_eq!(c["sandboxInfo"]["expiresAt"], r["expiresAt"]);
    let listed = b.call("sandbox/list", json!({}));
    assert!(listed["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["id"] == sb.as_str()));

    b.call("sandbox/kill", json!({"sandbox": sb}));
    let c = next_change(&mut a, &sb);
    assert_eq!(c["change"], "killed", "{c}");
    assert!(c.get("sandboxInfo").is_none(), "{c}");
    // A second kill changes nothing and reports nothing; a failed call reports nothing.
    b.call("sandbox/kill", json!({"sandbox": sb}));
    b.call_err("sandbox/pause", json!({"sandbox": sb}));
    let rest = changes_so_far(&mut a);
    assert!(rest.is_empty(), "{rest:?}");

    // A connection that never subscribed got none of it.
    let got = changes_so_far(&mut quiet);
    assert!(got.is_empty(), "{got:?}");
}

#[test]
fn unsubscribe_stops_the_notifications() {
    let home = Home::new();
    home.start();
    let mut a = home.connect();
    let mut other = home.connect();
    let mut b = home.connect();
    subscribe(&mut a);
    subscribe(&mut other);
    let first = b.create(json!({"timeout": 600}));
    assert_eq!(next_change(&mut a, &first)["change"], "created");
    assert_eq!(a.call("sandbox/unsubscribe", json!({})), json!({}));
    // Idempotent.
    assert_eq!(a.call("sandbox/unsubscribe", Value::Null), json!({}));
    let second = b.create(json!({"timeout": 600}));
    b.call("sandbox/kill", json!({"sandbox": second}));
    b.call("sandbox/kill", json!({"sandbox": first}));
    // The one still subscribed sees them all...
    assert_eq!(next_change(&mut other, &first)["change"], "created");
    assert_eq!(next_change(&mut other, &second)["change"], "created");
    assert_eq!(next_change(&mut other, &second)["change"], "killed");
    assert_eq!(next_change(&mut other, &first)["change"], "killed");
    // ...the one that unsubscribed none.
    let got = changes_so_far(&mut a);
    assert!(got.is_empty(), "{got:?}");
    // Subscribing again starts them again.
    subscribe(&mut a);
    let third = b.create(json!({"timeout": 600}));
    assert_eq!(next_change(&mut a, &third)["change"], "created");
    b.call("sandbox/kill", json!({"sandbox": third}));
}

#[test]
fn a_lifetime_that_ends_with_no_client_acting_is_reported_expired() {
    let home = Home::new();
    home.start();
    let mut a = home.connect();
    subscribe(&mut a);
    let sb = {
        let mut b = home.connect();
        b.create(json!({"timeout": 1}))
        // b goes away: nobody acts on the sandbox any more.
    };
    assert_eq!(next_change(&mut a, &sb)["change"], "created");
    assert_eq!(index_entry(&home, &sb).as_deref(), Some("local"));
    let c = next_change(&mut a, &sb);
    assert_eq!(
        (&c["change"], &c["provider"]),
        (&json!("expired"), &json!("local")),
        "{c}"
    );
    assert!(c.get("sandboxInfo").is_none(), "{c}");
    // The broker's index (bare id -> provider) forgets it too.
    assert_eq!(index_entry(&home, &sb), None);
    let listed = a.call("sandbox/list", json!({"provider": "local"}));
    assert!(
        !listed["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == sb.as_str()),
        "{listed}"
    );
}

#[test]
fn plugin_sandboxes_are_reported_both_by_the_broker_and_by_the_plugin() {
    let (home, mut b) = started(&[]);
    let _repo = install_pinned(&mut b, "py-local");
    let mut a = home.connect();
    subscribe(&mut a);
    // Made through the broker: the broker reports it.
    let (sb, full) = plugin_sandbox(&mut b, "py-local");
    let c = next_change(&mut a, &sb);
    assert_eq!(
        (&c["change"], &c["provider"], &c["sandboxInfo"]["provider"]),
        (&json!("created"), &json!("py-local"), &json!("py-local")),
        "{c}"
    );
    b.call("sandbox/setTimeout", json!({"sandbox": full, "timeout": 1}));
    assert_eq!(next_change(&mut a, &sb)["change"], "timeout");
    // Its lifetime ends inside the plugin, which reports it with its own notification
    // (EPP/1 `sandbox/changed`); the broker adds the provider.
    let c = next_change(&mut a, &sb);
    assert_eq!(
        (&c["change"], &c["provider"]),
        (&json!("expired"), &json!("py-local")),
        "{c}"
    );
    // A sandbox the plugin made on its own (not through the broker): the plugin reports
    // it, with its sandboxInfo, which the broker tags with the provider.
    std::fs::write(
        plugin_data_dir(&home, "py-local").join("adopt-request"),
        "x",
    )
    .unwrap();
    let c = loop {
        let v = a.recv();
        if v["method"] == "sandbox/changed" && v["params"]["change"] == "created" {
            break v["params"].clone();
        }
    };
    let adopted = c["sandbox"].as_str().unwrap().to_owned();
    assert_eq!(
        (
            &c["provider"],
            &c["sandboxInfo"]["id"],
            &c["sandboxInfo"]["provider"]
        ),
        (&json!("py-local"), &json!(adopted), &json!("py-local")),
        "{c}"
    );
    // ...the broker records whose it is, and a client can use it by its bare id.
    assert_eq!(index_entry(&home, &adopted).as_deref(), Some("py-local"));
    let info = b.call("sandbox/info", json!({"sandbox": adopted}));
    assert_eq!(info["id"], adopted.as_str());
    // The expired one is forgotten.
    assert_eq!(index_entry(&home, &sb), None);
}

/// The provider the broker's persisted index (`data/sandboxes.json`) names for `sandbox`.
fn index_entry(home: &Home, sandbox: &str) -> Option<String> {
    abx_tests::sandbox_index(&home.path)
        .get(sandbox)?
        .as_str()
        .map(str::to_owned)
}

fn plugin_data_dir(home: &Home, id: &str) -> std::path::PathBuf {
    home.path.join("data/providers").join(id).join("data")
}

#[test]
fn a_subscriber_that_never_reads_blocks_no_one_and_loses_only_its_oldest() {
    let mut home = Home::new();
    // A small per-subscriber queue, so that the bound shows with few changes.
    home.env.push(("ABX_EVENT_QUEUE".into(), "16".into()));
    home.start();
    let mut lazy = home.connect();
    subscribe(&mut lazy);
    // Never reads from here on.
    let mut b = home.connect();
    let mut watcher = home.connect();
    subscribe(&mut watcher);
    // Large notifications (20 KB of metadata each), so the socket's own buffer holds few.
    let blob = "x".repeat(20_000);
    let sb = b.create(json!({"timeout": 600, "metadata": {"blob": blob}}));
    const ROUNDS: u64 = 300;
    let total = ROUNDS;
    for n in 1..=ROUNDS {
        b.call(
            "sandbox/setTimeout",
            json!({"sandbox": sb, "timeout": 1000 + n}),
        );
        // Other clients are served meanwhile.
        if n % 50 == 0 {
            watcher.call("broker/ping", Value::Null);
        }
    }
    // One last change with a known value.
    b.call(
        "sandbox/setTimeout",
        json!({"sandbox": sb, "timeout": 5000}),
    );
    // A reading subscriber got every one.
    let mut seen = 0;
    loop {
        let c = next_change(&mut watcher, &sb);
        if c["change"] == "timeout" {
            seen += 1;
            if c["sandboxInfo"]["timeout"] == 5000 {
                break;
            }
        }
    }
    assert_eq!(seen, total + 1);
    // The lazy one's queue overflowed: the broker says so in its log.
    let log = home.log_file();
    wait_until("the dropped-notifications warning", DEADLINE, || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("sandbox/changed subscriber is not reading")
    });
    // When it finally reads, it gets what its socket, its connection (bounded) and its
    // queue held: the oldest were dropped, the newest is there, in order.
    let mut got: Vec<u64> = Vec::new();
    loop {
        let c = next_change(&mut lazy, &sb);
        if c["change"] != "timeout" {
            continue;
        }
        let t = c["sandboxInfo"]["timeout"].as_u64().unwrap();
        got.push(t);
        if t == 5000 {
            break;
        }
    }
    eprintln!(
        "the lazy subscriber kept {} of {} notifications",
        got.len(),
        total + 1
    );
    assert!(
        (got.len() as u64) < total / 2,
        "{} of {} kept: not bounded",
        got.len(),
        total + 1
    );
    assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order: {got:?}");
    b.call("sandbox/kill", json!({"sandbox": sb}));
}

/// Until a write to a dead client fails, the broker cannot know it is gone; wait for that.
fn wait_for_connections(c: &mut Client, n: u64) {
    wait_until("the dead client's connection dropped", DEADLINE, || {
        c.call("broker/status", Value::Null)["connections"] == n
    });
}

#[test]
fn a_plugin_exec_whose_client_died_is_replayed_by_attach_from_another_connection() {
    let (home, mut a) = started(&[]);
    let _repo = install_pinned(&mut a, "py-local");
    let (_sb, full) = plugin_sandbox(&mut a, "py-local");
    let e = a.call(
        "exec/start",
        json!({"sandbox": full, "command": "echo early; while [ ! -e go ]; do sleep 0.05; done; echo late; echo oops >&2; exit 5"}),
    )["execId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The owner reads its first output, then dies.
    let first = loop {
        let v = a.recv();
        if v["method"] == "exec/output" && v["params"]["execId"] == e.as_str() {
            break v;
        }
    };
    assert_eq!(first["params"]["data"], "early\n", "{first}");
    drop(a);
    let mut b = home.connect();
    // The command goes on with nobody receiving: its output and exit reach the dead client's
    // connection, whose write fails; they are kept.
    b.call(
        "files/write",
        json!({"sandbox": full, "path": "go", "data": ""}),
    );
    wait_for_connections(&mut b, 1);
    let r = b.call("exec/attach", json!({"execId": e}));
    assert_eq!(r["execId"], e.as_str());
    assert_eq!(r["droppedBytes"], 0, "{r}");
    let s = b.collect(&e);
    assert_eq!(String::from_utf8_lossy(&s.stdout), "late\n");
    assert_eq!(String::from_utf8_lossy(&s.stderr), "oops\n");
    assert_eq!((s.exit["exitCode"].clone(), s.exits), (json!(5), 1));
    if r["running"] == false {
        assert!(r["replayed"].as_u64().unwrap() >= 3, "{r}");
    }
    // Once the exit reached a client, the exec is over: a later attach says so, and
    // replays nothing.
    let mut c = home.connect();
    let r = c.call("exec/attach", json!({"execId": e}));
    assert_eq!(
        (r["running"].clone(), r["replayed"].clone()),
        (json!(false), json!(0)),
        "{r}"
    );
    assert!(c.try_recv(Duration::from_millis(200)).is_none());
}

#[test]
fn a_detached_plugin_exec_keeps_at_most_a_mebibyte_and_counts_what_it_dropped() {
    let (home, mut a) = started(&[]);
    let _repo = install_pinned(&mut a, "py-local");
    let (_sb, full) = plugin_sandbox(&mut a, "py-local");
    // 3 MB of output once `go` exists, then a last line; `done` marks the end.
    let e = a.call(
        "exec/start",
        json!({"sandbox": full, "command": "echo ready; while [ ! -e go ]; do sleep 0.05; done; head -c 3000000 /dev/zero | tr '\\0' a; echo; echo the-end; touch done"}),
    )["execId"]
        .as_str()
        .unwrap()
        .to_owned();
    loop {
        let v = a.recv();
        if v["method"] == "exec/output" && v["params"]["execId"] == e.as_str() {
            break;
        }
    }
    drop(a);
    let mut b = home.connect();
    b.call(
        "files/write",
        json!({"sandbox": full, "path": "go", "data": ""}),
    );
    wait_for_connections(&mut b, 1);
    wait_until("the command to finish", DEADLINE, || {
        b.request("files/stat", json!({"sandbox": full, "path": "done"}))
            .get("result")
            .is_some()
    });
    let r = b.call("exec/attach", json!({"execId": e}));
    let dropped = r["droppedBytes"].as_u64().unwrap();
    assert!(dropped > 1_000_000, "{r}");
    let s = b.collect(&e);
    let text = String::from_utf8_lossy(&s.stdout).into_owned();
    eprintln!(
        "detached plugin exec: {} bytes of output replayed, {dropped} bytes of notifications dropped",
        text.len()
    );
    assert!(
        text.ends_with("\nthe-end\n"),
        "{}",
        &text[text.len().saturating_sub(64)..]
    );
    // What was kept is at most the bound (plus what was on the way when the client died).
    assert!(
        text.len() < 2_000_000,
        "{} bytes replayed: not bounded",
        text.len()
    );
    assert_eq!((s.exit["exitCode"].clone(), s.exits), (json!(0), 1));
}

#[test]
fn abx_events_prints_each_change_as_a_line() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let subscribers = |c: &mut Client| c.call("broker/status", Value::Null)["subscribers"].clone();
    assert_eq!(subscribers(&mut c), 0);
    let spawn = |args: &[&str]| {
        home.abx()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("abx events")
    };
    let json_events = spawn(&["-j", "events", "--count", "3"]);
    let text_events = spawn(&["events", "--count", "2"]);
    wait_until("both to subscribe", DEADLINE, || subscribers(&mut c) == 2);
    let sb = c.create(json!({"timeout": 600}));
    c.call("sandbox/setTimeout", json!({"sandbox": sb, "timeout": 700}));
    c.call("sandbox/kill", json!({"sandbox": sb}));
    let out = json_events.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let changes: Vec<&str> = lines
        .iter()
        .map(|l| l["change"].as_str().unwrap())
        .collect();
    assert_eq!(changes, ["created", "timeout", "killed"]);
    assert!(lines
        .iter()
        .all(|l| l["sandbox"] == sb.as_str() && l["provider"] == "local"));
    assert_eq!(lines[1]["sandboxInfo"]["timeout"], 700);
    let out = text_events.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].contains(&format!("created  local:{sb}  running  expires ")),
        "{text}"
    );
    assert!(lines[1].contains(&format!("timeout  local:{sb}")), "{text}");
    // The subscriptions ended with the commands.
    wait_until("the subscriptions to end", DEADLINE, || {
        subscribers(&mut c) == 0
    });
}

#[test]
fn a_lazy_subscriber_is_bounded_in_bytes_too_when_sandboxes_carry_large_metadata() {
    let home = Home::new();
    let pid = home.start();
    let mut lazy = home.connect();
    subscribe(&mut lazy);
    let mut b = home.connect();
    // 1 MB of metadata: every notification of this sandbox carries it.
    let blob = "m".repeat(1_000_000);
    let sb = b.create(json!({"timeout": 600, "metadata": {"blob": blob}}));
    let before = abx_tests::rss_kib(pid);
    const ROUNDS: u64 = 50;
    for n in 1..=ROUNDS {
        b.call(
            "sandbox/setTimeout",
            json!({"sandbox": sb, "timeout": 1000 + n}),
        );
    }
    eprintln!(
        "daemon RSS with a lazy subscriber: {} KiB before, {} KiB after {ROUNDS} changes of 1 MB each",
        before,
        abx_tests::rss_kib(pid)
    );
    let mut got = 0;
    loop {
        let c = next_change(&mut lazy, &sb);
        if c["change"] == "timeout" {
            got += 1;
            if c["sandboxInfo"]["timeout"] == 1000 + ROUNDS {
                break;
            }
        }
    }
    eprintln!("the lazy subscriber kept {got} of {ROUNDS}");
    // 16 MiB on its connection and 4 MiB in its queue at most: about 20 of the 50 MB.
    assert!(got < 30, "{got} of {ROUNDS} kept: not bounded in bytes");
    b.call("sandbox/kill", json!({"sandbox": sb}));
}

#[test]
fn the_node_plugin_reports_its_expiries_too() {
    if std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("node is not installed: skipping");
        return;
    }
    let (home, mut b) = started(&[]);
    let _repo = install_pinned(&mut b, "node-local");
    let mut a = home.connect();
    subscribe(&mut a);
    let sb = b.call(
        "sandbox/create",
        json!({"provider": "node-local", "timeout": 1}),
    )["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(next_change(&mut a, &sb)["change"], "created");
    let c = next_change(&mut a, &sb);
    assert_eq!(
        (&c["change"], &c["provider"]),
        (&json!("expired"), &json!("node-local")),
        "{c}"
    );
}
