//! The builtin `local` provider end to end: a real daemon, real processes, real files.

use abx_tests::{abx_code, rss_kib, sha256_file, wait_until, Client, Home};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::Duration;

fn setup() -> (Home, Client, String) {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let id = c.create(json!({}));
    (home, c, id)
}

#[test]
fn lifecycle_create_info_connect_list_timeout_kill() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let sb = c.call(
        "sandbox/create",
        json!({"template": "base", "timeout": 600, "env": {"GREETING": "hi"}, "metadata": {"owner": "t"}}),
    );
    let id = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(sb["provider"], "local");
    assert_eq!(sb["status"], "running");
    assert_eq!(sb["template"], "base");
    assert_eq!(sb["timeout"], 600);
    assert_eq!(sb["metadata"]["owner"], "t");
    assert!(sb["startedAt"].as_str().unwrap().ends_with('Z'));
    // Both id forms work.
    assert_eq!(
        c.call("sandbox/info", json!({"sandbox": id}))["id"],
        id.as_str()
    );
    assert_eq!(
        c.call("sandbox/info", json!({"sandbox": format!("local:{id}")}))["id"],
        id.as_str()
    );
    // connect never changes the lifetime.
    let before = c.call("sandbox/info", json!({"sandbox": id}))["expiresAt"].clone();
    // Once the clock is past the second `before` was read in, a reset lifetime would show.
    let read_at = abx_tests::unix_secs();
    wait_until("the next second", Duration::from_secs(5), || {
        abx_tests::unix_secs() > read_at
    });
    assert_eq!(
        c.call("sandbox/connect", json!({"sandbox": id}))["expiresAt"],
        before
    );
    // The create env is in every exec.
    assert_eq!(c.sh(&id, "echo $GREETING")["stdout"], "hi\n");
    let list = c.call("sandbox/list", Value::Null);
    assert!(list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["id"] == id.as_str()));
    let list = c.call("sandbox/list", json!({"provider": "local"}));
    assert_eq!(list["sandboxes"].as_array().unwrap().len(), 1);
    // setTimeout moves the expiry.
    let t = c.call(
        "sandbox/setTimeout",
        json!({"sandbox": id, "timeout": 3600}),
    );
    assert_ne!(t["expiresAt"], before);
    // capabilities are derived from the declared features: "code" from code.interpret.
    let caps = c.call("sandbox/capabilities", json!({"sandbox": id}));
    let caps: Vec<&str> = caps["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(caps.contains(&"shell") && caps.contains(&"files") && caps.contains(&"pty"));
    assert!(caps.contains(&"code"), "{caps:?}");
    let si = c.call("sandbox/systemInfo", json!({"sandbox": id}));
    assert_eq!(si["os"], "Linux");
    assert!(si["cpuCount"].as_u64().unwrap() >= 1);
    assert!(si["diskTotalGb"].as_f64().unwrap() > 0.0);
    assert!(si["isolation"]["model"].is_string());
    // kill is idempotent; info after kill is E2009.
    assert_eq!(
        c.call("sandbox/kill", json!({"sandbox": id}))["killed"],
        true
    );
    assert_eq!(
        c.call("sandbox/kill", json!({"sandbox": id}))["killed"],
        false
    );
    let e = c.call_err("sandbox/info", json!({"sandbox": id}));
    assert_eq!(e["code"], 2009);
    assert!(e["data"]["suggestion"]
        .as_str()
        .unwrap()
        .contains("abx list"));
    assert!(
        !home.path.join("data/local/sandboxes").join(&id).exists(),
        "its files are gone"
    );
}

#[test]
fn bad_lifecycle_input_gets_typed_errors() {
    let (_home, mut c, id) = setup();
    for (params, abx) in [
        (json!({"template": "python:3.12-slim"}), "E2005"),
        (json!({"timeout": -5}), "E2004"),
        (json!({"timeout": 0}), "E2004"),
        (json!({"timeout": 99_999_999}), "E2004"),
        (json!({"timeout": "soon"}), "E2004"),
        (json!({"provider": "nope"}), "E8001"),
    ] {
        let e = c.call_err("sandbox/create", params.clone());
        assert_eq!(abx_code(&e), abx, "{params} -> {e}");
    }
    assert_eq!(
        abx_code(&c.call_err("sandbox/info", json!({"sandbox": "sb-nope"}))),
        "E2009"
    );
    assert_eq!(
        abx_code(&c.call_err("exec/run", json!({"sandbox": "sb-nope", "command": "true"}))),
        "E2009"
    );
    assert_eq!(abx_code(&c.call_err("sandbox/info", json!({}))), "E1004");
    assert_eq!(
        abx_code(&c.call_err("sandbox/setTimeout", json!({"sandbox": id, "timeout": -1}))),
        "E2004"
    );
    // Every feature of the catalogue's sandbox methods is declared now (code.interpret:
    // issue 24, templates: issue 22); commands/run is served as declared (issue 49): local
    // templates name no commands, so a name is E1004 saying so and pointing at exec/run,
    // never E8004 naming a feature local declares.
    let e = c.call_err("commands/run", json!({"sandbox": id, "name": "anything"}));
    assert_eq!(abx_code(&e), "E1004", "{e}");
    assert!(
        e.to_string().contains("names no command") && e.to_string().contains("exec/run"),
        "{e}"
    );
    // Templates are declared (issue 22): the host template is always listed.
    let l = c.call("templates/list", json!({"provider": "local"}));
    assert_eq!(l["templates"][0]["name"], "base");
}

/// The local provider deserializes into the protocol's API types: bad params keep the
/// E-codes and messages they had (E1004 naming the field, the provider's own codes for
/// values it checks itself). An unknown member is the broker's E1004 (issue 41), naming it
/// and what the method takes.
#[test]
fn bad_params_keep_their_codes_and_messages() {
    let (_home, mut c, id) = setup();
    let msg = |e: &Value| e["message"].as_str().unwrap_or_default().to_owned();
    let fields = "'sandbox', 'create', 'command', 'argv', 'cwd', 'env', 'timeout', 'stdin', \
                  'stdinEncoding', 'maxOutput', 'pty', '_meta', 'provider'";
    for m in ["exec/run", "exec/start"] {
        let e = c.call_err(m, json!({"sandbox": id, "command": "true", "bogus": 1}));
        assert_eq!(abx_code(&e), "E1004", "{e}");
        assert_eq!(
            msg(&e),
            format!("Invalid params for '{m}': unknown member 'bogus'")
        );
        let suggestion = e["data"]["suggestion"].as_str().unwrap();
        assert!(
            suggestion.starts_with(&format!("'{m}' takes {fields} (docs/broker-api.md).")),
            "{suggestion}"
        );
    }
    let e = c.call_err(
        "exec/run",
        json!({"sandbox": id, "command": "true", "pty": {"cols": 80, "rows": 24}}),
    );
    assert_eq!(
        msg(&e),
        "Invalid params for 'exec/run': pty is for exec/start"
    );
    let e = c.call_err("files/read", json!({"sandbox": id}));
    assert_eq!(
        msg(&e),
        "Invalid params for 'files/read': missing field `path`"
    );
    let e = c.call_err("files/rename", json!({"sandbox": id, "from": "a"}));
    assert_eq!(
        msg(&e),
        "Invalid params for 'files/rename': missing field `to`"
    );
    let e = c.call_err(
        "files/write",
        json!({"sandbox": id, "path": "a", "data": 5}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    assert!(
        msg(&e).contains("invalid type: integer `5`, expected a string"),
        "{e}"
    );
    // Without a sandbox, files/* name the empty one, as they always did.
    let e = c.call_err("files/list", json!({}));
    assert_eq!(
        (abx_code(&e), msg(&e).as_str()),
        ("E2009", "Sandbox '' not found.")
    );
    let e = c.call_err("files/unwatch", json!({}));
    assert_eq!(
        msg(&e),
        "Invalid params for 'files/unwatch': missing field `watchId`"
    );
    // Values the provider checks itself keep its codes.
    let e = c.call_err("sandbox/setTimeout", json!({"sandbox": id, "timeout": "x"}));
    assert_eq!(abx_code(&e), "E2004", "{e}");
    let e = c.call_err("sandbox/setTimeout", json!({"sandbox": id}));
    assert_eq!(
        msg(&e),
        "Invalid params for 'sandbox/setTimeout': missing field `timeout`"
    );
    let e = c.call_err("ports/url", json!({"sandbox": id, "port": "x"}));
    assert_eq!(abx_code(&e), "E5002", "{e}");
    let e = c.call_err("process/kill", json!({"sandbox": id, "pid": 1_i64 << 40}));
    assert_eq!(abx_code(&e), "E1004", "{e}");
    let e = c.call_err("exec/kill", json!({"execId": 5}));
    assert_eq!(abx_code(&e), "E1004", "{e}");
}

/// Issue 41: `sandbox/create` with a member this broker does not know (`volumes`, from some
/// newer API; `mounts` was the example until issue 43 made it known) is refused with E1004
/// naming it, and no sandbox is made without the volume the client asked for; the same
/// create without it makes one.
#[test]
fn sandbox_create_with_an_unknown_member_creates_nothing() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let listed = |c: &mut Client| c.call("sandbox/list", json!({}))["sandboxes"].clone();
    let before = listed(&mut c);
    let e = c.call_err(
        "sandbox/create",
        json!({"template": "base", "timeout": 60,
               "volumes": [{"source": "/srv/data", "target": "/workspace/data"}]}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    assert_eq!(
        e["message"],
        "Invalid params for 'sandbox/create': unknown member 'volumes'"
    );
    assert_eq!(e["data"]["unknown"], json!(["volumes"]));
    let suggestion = e["data"]["suggestion"].as_str().unwrap();
    assert!(
        suggestion.starts_with("'sandbox/create' takes 'provider', 'template', 'timeout', 'env', 'metadata', 'network', 'limits'"),
        "{suggestion}"
    );
    assert!(suggestion.contains("upgrade abx"), "{suggestion}");
    assert_eq!(listed(&mut c), before, "nothing was created");
    // With a bare provider id routing it, and a camelCase slip: the same.
    let e = c.call_err(
        "sandbox/create",
        json!({"provider": "local", "template": "base", "time_out": 60}),
    );
    assert_eq!(
        e["message"],
        "Invalid params for 'sandbox/create': unknown member 'time_out'"
    );
    assert_eq!(listed(&mut c), before, "nothing was created");
    let id = c.create(json!({"template": "base", "timeout": 60}));
    let after = listed(&mut c);
    assert_eq!(
        after.as_array().unwrap().len(),
        before.as_array().unwrap().len() + 1
    );
    assert!(after
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["id"] == id.as_str()));
}

#[test]
fn exec_run_shell_argv_cwd_env_stdin() {
    let (_home, mut c, id) = setup();
    let r = c.sh(&id, "echo hello; echo err >&2; exit 3");
    assert_eq!(
        (
            r["exitCode"].clone(),
            r["stdout"].clone(),
            r["stderr"].clone()
        ),
        (json!(3), json!("hello\n"), json!("err\n"))
    );
    assert_eq!(r["timedOut"], false);
    assert!(r["durationMs"].is_u64());
    let r = c.call(
        "exec/run",
        json!({"sandbox": id, "argv": ["printf", "%s|", "a b", "c"]}),
    );
    assert_eq!(r["stdout"], "a b|c|");
    c.call(
        "files/mkdir",
        json!({"sandbox": id, "path": "/workspace/sub"}),
    );
    let r = c.call(
        "exec/run",
        json!({"sandbox": id, "command": "pwd; echo $FOO", "cwd": "sub", "env": {"FOO": "bar"}}),
    );
    assert!(r["stdout"].as_str().unwrap().ends_with("sub\nbar\n"), "{r}");
    let r = c.call(
        "exec/run",
        json!({"sandbox": id, "command": "tr a-z A-Z", "stdin": "shout\n"}),
    );
    assert_eq!(r["stdout"], "SHOUT\n");
    // Nothing of the broker's own environment leaks in.
    let r = c.sh(&id, "env");
    assert!(!r["stdout"].as_str().unwrap().contains("ABX_HOME"), "{r}");
    // A missing program: argv gives E3003; a shell gives 127.
    let e = c.call_err(
        "exec/run",
        json!({"sandbox": id, "argv": ["/no/such/binary"]}),
    );
    assert_eq!(abx_code(&e), "E3003");
    assert_eq!(c.sh(&id, "no-such-command-xyz")["exitCode"], 127);
    let e = c.call_err("exec/run", json!({"sandbox": id}));
    assert_eq!(abx_code(&e), "E1004");
    let e = c.call_err(
        "exec/run",
        json!({"sandbox": id, "command": "true", "stdin": "!!", "stdinEncoding": "base64"}),
    );
    assert_eq!(abx_code(&e), "E4007");
    let e = c.call_err(
        "exec/run",
        json!({"sandbox": id, "command": "true", "timeout": -1}),
    );
    assert_eq!(abx_code(&e), "E2004");
    let e = c.call_err(
        "exec/run",
        json!({"sandbox": id, "command": "true", "cwd": "/etc"}),
    );
    assert_eq!(abx_code(&e), "E4002");
}

#[test]
fn exec_output_is_byte_exact_and_capped() {
    let (_home, mut c, id) = setup();
    let r = c.sh(&id, "printf '\\377\\000\\001abc'");
    assert_eq!(r["encoding"], "base64");
    assert_eq!(
        abx_tests::output_bytes(&json!({"data": r["stdout"], "encoding": "base64"})),
        vec![0xff, 0, 1, b'a', b'b', b'c']
    );
    let r = c.sh(&id, "printf 'héllo ✓'");
    assert_eq!(r["stdout"], "héllo ✓");
    assert!(r.get("encoding").is_none());
    let r = c.call("exec/run", json!({"sandbox": id, "command": "head -c 100000 /dev/zero | tr '\\0' x", "maxOutput": 1000}));
    assert_eq!(r["truncated"], true);
    assert_eq!(r["stdout"].as_str().unwrap().len(), 1000);
    assert_eq!(r["exitCode"], 0);
}

#[test]
fn exec_timeout_kills_the_whole_tree() {
    let (home, mut c, id) = setup();
    let r = c.call(
        "exec/run",
        json!({"sandbox": id, "command": "sh -c 'sleep 300 & echo $! > /tmp/gc; wait' & sleep 300", "timeout": 1}),
    );
    assert_eq!(r["timedOut"], true, "{r}");
    let gc: i32 = c.call("files/read", json!({"sandbox": id, "path": "/tmp/gc"}))["data"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until("grandchild killed", Duration::from_secs(30), || {
        gone_in_sandbox(&home, &id, gc as i64)
    });
}

/// Whether `pid` (as the sandbox sees it) is gone from the sandbox (or a zombie).
fn gone_in_sandbox(home: &Home, id: &str, pid: i64) -> bool {
    let mut c = home.connect();
    let list = c.call("process/list", json!({"sandbox": id}));
    !list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["pid"] == pid && p["status"] != "zombie")
}

#[test]
fn cancelling_exec_run_kills_it_and_answers_32800() {
    let (_home, mut c, id) = setup();
    c.send(&json!({"jsonrpc": "2.0", "id": 77, "method": "exec/run", "params": {"sandbox": id, "command": "echo $$ > /tmp/pid; exec sleep 300"}}).to_string());
    let mut pid = 0;
    wait_until("exec started", Duration::from_secs(10), || {
        let mut c2 = _home.connect();
        let r = c2.request("files/read", json!({"sandbox": id, "path": "/tmp/pid"}));
        if let Some(s) = r["result"]["data"].as_str() {
            pid = s.trim().parse().unwrap_or(0);
        }
        pid > 0
    });
    c.send(r#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":77}}"#);
    let v = c.recv();
    assert_eq!(v["id"], 77);
    assert_eq!(v["error"]["code"], -32800);
    assert_eq!(abx_code(&v["error"]), "E1006");
    wait_until("cancelled process killed", Duration::from_secs(30), || {
        gone_in_sandbox(&_home, &id, pid as i64)
    });
}

#[test]
fn exec_stream_keeps_order_and_sends_one_exit() {
    let (_home, mut c, id) = setup();
    let script = "for i in $(seq 1 200); do echo out$i; echo err$i >&2; done; exit 7";
    let r = c.call("exec/start", json!({"sandbox": id, "command": script}));
    let exec_id = r["execId"].as_str().unwrap().to_owned();
    let s = c.collect(&exec_id);
    let out: Vec<String> = String::from_utf8(s.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let err: Vec<String> = String::from_utf8(s.stderr)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        out,
        (1..=200).map(|i| format!("out{i}")).collect::<Vec<_>>()
    );
    assert_eq!(
        err,
        (1..=200).map(|i| format!("err{i}")).collect::<Vec<_>>()
    );
    assert_eq!(s.exit["exitCode"], 7);
    assert_eq!(s.exits, 1);
    // Nothing more for it afterwards: the next message is the ping's reply.
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
    // Stream ends: a later write says the exec is gone.
    let e = c.call_err("exec/write", json!({"execId": exec_id, "data": "x"}));
    assert_eq!(abx_code(&e), "E3002");
}

#[test]
fn exec_stdin_eof_kill_and_timeout() {
    let (_home, mut c, id) = setup();
    let r = c.call(
        "exec/start",
        json!({"sandbox": id, "command": "cat; echo done"}),
    );
    let e = r["execId"].as_str().unwrap().to_owned();
    c.call("exec/write", json!({"execId": e, "data": "line one\n"}));
    c.call(
        "exec/write",
        json!({"execId": e, "data": "bGluZSB0d28K", "encoding": "base64", "eof": true}),
    );
    let s = c.collect(&e);
    assert_eq!(
        String::from_utf8(s.stdout).unwrap(),
        "line one\nline two\ndone\n"
    );
    assert_eq!(s.exit["exitCode"], 0);

    let r = c.call("exec/start", json!({"sandbox": id, "command": "sleep 300"}));
    let e = r["execId"].as_str().unwrap().to_owned();
    c.call("exec/kill", json!({"execId": e}));
    let s = c.collect(&e);
    assert_eq!(s.exit["signal"], "SIGKILL");

    let r = c.call(
        "exec/start",
        json!({"sandbox": id, "command": "sleep 300", "timeout": 0.5}),
    );
    let e = r["execId"].as_str().unwrap().to_owned();
    let s = c.collect(&e);
    assert_eq!(s.exit["timedOut"], true);
}

#[test]
fn pty_exec_with_resize() {
    let (_home, mut c, id) = setup();
    let r = c.call("exec/start", json!({"sandbox": id, "command": "test -t 0 && echo tty; read x; stty size", "pty": {"cols": 80, "rows": 24}}));
    let e = r["execId"].as_str().unwrap().to_owned();
    c.call("exec/resize", json!({"execId": e, "cols": 100, "rows": 40}));
    c.call("exec/write", json!({"execId": e, "data": "go\n"}));
    let s = c.collect(&e);
    let text = String::from_utf8_lossy(&s.stdout);
    assert!(text.contains("tty"), "{text}");
    assert!(text.contains("40 100"), "{text}");
    assert_eq!(s.exit["exitCode"], 0);
    assert!(s.events.iter().all(|ev| ev["stream"] == "pty"));
    // Resizing a non-pty exec is refused.
    let r = c.call("exec/start", json!({"sandbox": id, "command": "sleep 5"}));
    let e = r["execId"].as_str().unwrap().to_owned();
    let err = c.call_err("exec/resize", json!({"execId": e, "cols": 1, "rows": 1}));
    assert_eq!(abx_code(&err), "E1004");
    c.call("exec/kill", json!({"execId": e}));
}

#[test]
fn attach_after_reconnect_and_foreign_exec_ids() {
    let (home, mut c, id) = setup();
    let r = c.call(
        "exec/start",
        json!({"sandbox": id, "command": "echo early; sleep 1; echo late; exit 4"}),
    );
    let e = r["execId"].as_str().unwrap().to_owned();
    // Another connection may not drive it...
    let mut other = home.connect();
    assert_eq!(
        abx_code(&other.call_err("exec/write", json!({"execId": e, "data": "x"}))),
        "E3004"
    );
    assert_eq!(
        abx_code(&other.call_err("exec/kill", json!({"execId": e}))),
        "E3004"
    );
    // ...until it attaches after the first goes away.
    drop(c);
    // Refused (E3004) until the daemon has seen the first connection close.
    let mut r = Value::Null;
    wait_until(
        "the exec freed by its closed connection",
        Duration::from_secs(10),
        || {
            let v = other.request("exec/attach", json!({"execId": e}));
            match v.get("result") {
                Some(res) => {
                    r = res.clone();
                    true
                }
                None => {
                    assert_eq!(abx_code(&v["error"]), "E3004", "{v}");
                    false
                }
            }
        },
    );
    assert_eq!(r["execId"], e.as_str());
    let s = other.collect(&e);
    let text = String::from_utf8(s.stdout).unwrap();
    assert!(text.contains("late"), "{text}");
    assert_eq!(s.exit["exitCode"], 4);
    assert_eq!(
        abx_code(&other.call_err("exec/attach", json!({"execId": "e-nope"}))),
        "E3002"
    );
}

#[test]
fn processes_list_and_kill() {
    let (home, mut c, id) = setup();
    c.sh(&id, "sleep 300 > /dev/null 2>&1 & echo $! > /tmp/bg");
    let pid: i64 = c.call("files/read", json!({"sandbox": id, "path": "/tmp/bg"}))["data"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let list = c.call("process/list", json!({"sandbox": id}));
    let procs = list["processes"].as_array().unwrap();
    let p = procs
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("{pid} not in {list}"));
    assert!(p["command"].as_str().unwrap().contains("sleep 300"));
    c.call(
        "process/kill",
        json!({"sandbox": id, "pid": pid, "signal": "TERM"}),
    );
    wait_until("process gone", Duration::from_secs(5), || {
        gone_in_sandbox(&home, &id, pid)
    });
    let e = c.call_err("process/kill", json!({"sandbox": id, "pid": 1}));
    assert_eq!(abx_code(&e), "E3006");
}

#[test]
fn pause_stops_output_and_resume_continues() {
    let (home, mut c, id) = setup();
    let r = c.call("exec/start", json!({"sandbox": id, "command": "i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done"}));
    let e = r["execId"].as_str().unwrap().to_owned();
    let mut ctl = home.connect();
    // Paused once output flows.
    let first = c.try_recv(Duration::from_secs(20));
    assert!(first.is_some(), "no output before the pause");
    assert_eq!(
        ctl.call("sandbox/pause", json!({"sandbox": id}))["status"],
        "paused"
    );
    assert_eq!(
        abx_code(&ctl.call_err("exec/run", json!({"sandbox": id, "command": "true"}))),
        "E2002"
    );
    // Drain what was produced before the pause, then expect silence.
    while c.try_recv(Duration::from_millis(400)).is_some() {}
    assert!(
        c.try_recv(Duration::from_millis(700)).is_none(),
        "output continued while paused"
    );
    let ps = ctl.call("process/list", json!({"sandbox": id}));
    assert!(
        ps["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["status"] == "stopped"),
        "{ps}"
    );
    assert_eq!(
        ctl.call("sandbox/resume", json!({"sandbox": id}))["status"],
        "running"
    );
    let v = c.recv();
    assert_eq!(v["method"], "exec/output", "output continues after resume");
    assert_eq!(ctl.sh(&id, "echo alive")["stdout"], "alive\n");
    c.call("exec/kill", json!({"execId": e}));
}

#[test]
fn files_roundtrip_and_what_exec_sees() {
    let (_home, mut c, id) = setup();
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "/workspace/a.txt", "data": "héllo\n"}),
    );
    assert_eq!(c.sh(&id, "cat /workspace/a.txt")["stdout"], "héllo\n");
    assert_eq!(
        c.sh(&id, "cat a.txt")["stdout"],
        "héllo\n",
        "relative paths are under /workspace"
    );
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "rel/../b.txt", "data": "b"}),
    );
    assert_eq!(c.sh(&id, "cat /workspace/b.txt")["stdout"], "b");
    // The seed's flow: upload to /tmp, then cat it.
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "/tmp/up2.txt", "data": "payload"}),
    );
    assert_eq!(c.sh(&id, "cat /tmp/up2.txt")["stdout"], "payload");
    // And the other way round.
    c.sh(&id, "printf 'from exec' > /tmp/e.txt");
    let r = c.call("files/read", json!({"sandbox": id, "path": "/tmp/e.txt"}));
    assert_eq!(
        (r["data"].clone(), r["size"].clone(), r["eof"].clone()),
        (json!("from exec"), json!(9), json!(true))
    );
    // Binary, offsets, append.
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "bin", "data": "AP8BAg==", "encoding": "base64"}),
    );
    let r = c.call(
        "files/read",
        json!({"sandbox": id, "path": "bin", "offset": 1, "length": 2}),
    );
    assert_eq!(
        (r["data"].clone(), r["encoding"].clone()),
        (json!("/wE="), json!("base64"))
    );
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "a.txt", "data": "more", "append": true}),
    );
    assert_eq!(c.sh(&id, "cat a.txt")["stdout"], "héllo\nmore");
    // Unicode and odd names.
    c.call("files/mkdir", json!({"sandbox": id, "path": "names"}));
    for name in ["héllo wörld ✓.txt", "日本語.md", "-dash", "sp ace"] {
        c.call(
            "files/write",
            json!({"sandbox": id, "path": format!("/workspace/names/{name}"), "data": name}),
        );
    }
    let l = c.call(
        "files/list",
        json!({"sandbox": id, "path": "/workspace/names"}),
    );
    let names: Vec<&str> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names.contains(&"héllo wörld ✓.txt"));
    assert_eq!(c.sh(&id, "ls names | wc -l")["stdout"], "4\n");
}

#[test]
fn files_directory_operations_stat_and_bad_paths() {
    let (_home, mut c, id) = setup();
    c.call(
        "files/mkdir",
        json!({"sandbox": id, "path": "d/e/f", "parents": true}),
    );
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "d/e/f/x", "data": "1"}),
    );
    let st = c.call("files/stat", json!({"sandbox": id, "path": "d/e/f/x"}));
    assert_eq!(
        (st["type"].clone(), st["size"].clone(), st["path"].clone()),
        (json!("file"), json!(1), json!("/workspace/d/e/f/x"))
    );
    let l = c.call(
        "files/list",
        json!({"sandbox": id, "path": "d", "recursive": true}),
    );
    assert_eq!(l["entries"].as_array().unwrap().len(), 3);
    c.call(
        "files/rename",
        json!({"sandbox": id, "from": "d/e/f/x", "to": "d/y"}),
    );
    assert_eq!(c.sh(&id, "cat d/y")["stdout"], "1");
    // Paths outside /workspace and /tmp are the sandbox's own view (issue 43): its /etc,
    // never the host's; read-only there.
    let pw = c.call("files/read", json!({"sandbox": id, "path": "/etc/passwd"}));
    assert_eq!(
        pw["data"].as_str().unwrap(),
        c.sh(&id, "cat /etc/passwd")["stdout"].as_str().unwrap()
    );
    let cases = [
        (
            "files/read",
            json!({"sandbox": id, "path": "/workspace/../../etc/passwd"}),
            "E4002",
        ),
        (
            "files/write",
            json!({"sandbox": id, "path": "/etc/passwd", "data": "x"}),
            "E4014",
        ),
        (
            "files/read",
            json!({"sandbox": id, "path": "../../x"}),
            "E4002",
        ),
        (
            "files/write",
            json!({"sandbox": id, "path": "/workspace/../../evil", "data": "x"}),
            "E4002",
        ),
        (
            "files/read",
            json!({"sandbox": id, "path": "nope.txt"}),
            "E4001",
        ),
        (
            "files/write",
            json!({"sandbox": id, "path": "no/parent/x", "data": "x"}),
            "E4001",
        ),
        ("files/read", json!({"sandbox": id, "path": "d"}), "E4003"),
        ("files/list", json!({"sandbox": id, "path": "d/y"}), "E4004"),
        ("files/remove", json!({"sandbox": id, "path": "d"}), "E4005"),
        ("files/mkdir", json!({"sandbox": id, "path": "d"}), "E4006"),
        (
            "files/write",
            json!({"sandbox": id, "path": "z", "data": "%%%", "encoding": "base64"}),
            "E4007",
        ),
    ];
    for (m, p, code) in cases {
        let e = c.call_err(m, p.clone());
        assert_eq!(abx_code(&e), code, "{m} {p} -> {e}");
        assert!(
            !e["message"].as_str().unwrap().contains("/data/local"),
            "host paths never leak: {e}"
        );
    }
    assert_eq!(
        c.sh(&id, "test -e z && echo yes || echo no")["stdout"],
        "no\n",
        "nothing half-written"
    );
    // Symlinks that escape are refused, made from inside the sandbox.
    c.sh(
        &id,
        "ln -s / /workspace/root; ln -s ../../../../ /workspace/up",
    );
    for p in ["root/etc/passwd", "up/etc/passwd"] {
        assert_eq!(
            abx_code(&c.call_err("files/read", json!({"sandbox": id, "path": p}))),
            "E4002",
            "{p}"
        );
        assert_eq!(
            abx_code(&c.call_err(
                "files/write",
                json!({"sandbox": id, "path": p, "data": "x"})
            )),
            "E4002",
            "{p}"
        );
    }
    c.call(
        "files/remove",
        json!({"sandbox": id, "path": "d", "recursive": true}),
    );
    assert_eq!(
        abx_code(&c.call_err("files/stat", json!({"sandbox": id, "path": "d"}))),
        "E4001"
    );
}

#[test]
fn sandbox_processes_may_write_only_inside() {
    let (_home, mut c, id) = setup();
    let marker = format!("/tmp/abx-escape-{}", std::process::id());
    c.sh(&id, &format!("echo x > {marker}"));
    assert!(
        !std::path::Path::new(&marker).exists(),
        "a sandbox /tmp write reached the host /tmp"
    );
    let r = c.sh(
        &id,
        "echo x > /etc/abx-escape 2>/dev/null && echo wrote || echo refused",
    );
    assert_eq!(r["stdout"], "refused\n");
    assert!(!std::path::Path::new("/etc/abx-escape").exists());
    let r = c.sh(
        &id,
        "echo x > /root/abx-escape 2>/dev/null && echo wrote || echo refused",
    );
    assert_eq!(r["stdout"], "refused\n");
    let si = c.call("sandbox/systemInfo", json!({"sandbox": id}));
    assert!(
        ["namespaces", "landlock"].contains(&si["isolation"]["model"].as_str().unwrap()),
        "{si}"
    );
}

#[test]
fn watch_reports_changes() {
    let (_home, mut c, id) = setup();
    let w = c.call(
        "files/watch",
        json!({"sandbox": id, "path": "/workspace", "recursive": true}),
    );
    let wid = w["watchId"].as_str().unwrap().to_owned();
    c.sh(&id, "mkdir sub; echo 1 > sub/new.txt");
    let mut seen = vec![];
    while !seen.iter().any(|p: &String| p.ends_with("sub/new.txt")) {
        let v = c.recv();
        if v["method"] == "files/changed" {
            assert_eq!(v["params"]["watchId"], wid.as_str());
            seen.push(v["params"]["path"].as_str().unwrap().to_owned());
        }
    }
    c.call("files/unwatch", json!({"watchId": wid}));
}

#[test]
fn ports_url_reaches_a_server_in_the_sandbox() {
    let (_home, mut c, id) = setup();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "index.html", "data": "served from the sandbox"}),
    );
    let r = c.call("exec/start", json!({"sandbox": id, "command": format!("exec python3 -m http.server {port} --bind 127.0.0.1")}));
    let e = r["execId"].as_str().unwrap().to_owned();
    let url = c.call("ports/url", json!({"sandbox": id, "port": port}))["url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(url, format!("http://127.0.0.1:{port}"));
    let mut body = String::new();
    wait_until("server up", Duration::from_secs(20), || {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n");
        body.clear();
        let _ = s.read_to_string(&mut body);
        body.contains("served from the sandbox")
    });
    assert_eq!(
        abx_code(&c.call_err("ports/url", json!({"sandbox": id, "port": 70000}))),
        "E5002"
    );
    c.call("exec/kill", json!({"execId": e}));
}

#[test]
fn big_upload_download_in_chunks_with_constant_memory() {
    let (home, mut c, id) = setup();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.bin");
    let out = std::process::Command::new("head")
        .args(["-c", "67108864", "/dev/urandom"])
        .output()
        .unwrap();
    std::fs::write(&src, &out.stdout).unwrap();
    let pid = home.daemon_pid().unwrap();
    let rss_before = rss_kib(pid);
    let r = c.call(
        "files/upload",
        json!({"sandbox": id, "localPath": src, "path": "/workspace/big.bin"}),
    );
    assert_eq!(r["size"], 67108864);
    let sum = c.sh(&id, "sha256sum big.bin | cut -d' ' -f1")["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(sum, sha256_file(&src));
    let dst = dir.path().join("down.bin");
    c.call(
        "files/download",
        json!({"sandbox": id, "path": "big.bin", "localPath": dst}),
    );
    assert_eq!(sha256_file(&dst), sha256_file(&src));
    // Chunked reads through the API: many chunks, constant size each.
    let mut off = 0u64;
    let mut chunks = 0;
    loop {
        let r = c.call("files/read", json!({"sandbox": id, "path": "big.bin", "offset": off, "length": 4194304, "encoding": "base64"}));
        off += abx_tests::output_bytes(&r).len() as u64;
        chunks += 1;
        if r["eof"] == true {
            break;
        }
    }
    assert_eq!((off, chunks), (67108864, 16));
    let grew = rss_kib(pid).saturating_sub(rss_before);
    assert!(
        grew < 48 * 1024,
        "daemon RSS grew by {grew} KiB moving 64 MiB"
    );
    // Local-side errors.
    let e = c.call_err(
        "files/upload",
        json!({"sandbox": id, "localPath": "/no/such/file", "path": "x"}),
    );
    assert_eq!(abx_code(&e), "E4009");
    let e = c.call_err(
        "files/upload",
        json!({"sandbox": id, "localPath": "relative/file", "path": "x"}),
    );
    assert_eq!(abx_code(&e), "E1004", "relative local paths are refused");
}

#[test]
fn a_client_streaming_without_reading_does_not_slow_another() {
    let (home, mut c, id) = setup();
    let r = c.call("exec/start", json!({"sandbox": id, "command": "yes flood"}));
    let e = r["execId"].as_str().unwrap().to_owned();
    // c never reads: once its socket is full, its queue in the daemon is what fills.
    wait_until("c's socket full of output", Duration::from_secs(60), || {
        c.unread() >= abx_tests::SOCKET_FULL
    });
    let mut other = home.connect();
    for _ in 0..20 {
        assert_eq!(other.sh(&id, "echo ok")["stdout"], "ok\n");
    }
    let pid = home.daemon_pid().unwrap();
    assert!(rss_kib(pid) < 128 * 1024, "bounded memory");
    drop(c);
    let _ = e;
}

#[test]
fn restart_keeps_sandboxes_and_expiry_reaps() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let keep = c.create(json!({"timeout": 600}));
    let short = c.create(json!({"timeout": 2}));
    c.call(
        "files/write",
        json!({"sandbox": keep, "path": "state.txt", "data": "kept"}),
    );
    let short_ends = c.call("sandbox/info", json!({"sandbox": short}))["expiresAt"]
        .as_str()
        .and_then(abx_tests::rfc3339_unix)
        .expect("expiresAt");
    drop(c);
    let out = home.run(&["broker", "stop"]);
    assert!(out.status.success());
    // The short one's lifetime ends while the daemon is down.
    wait_until("the short sandbox's end", Duration::from_secs(10), || {
        abx_tests::unix_secs() > short_ends
    });
    home.start();
    let mut c = home.connect();
    let list = c.call("sandbox/list", Value::Null);
    let ids: Vec<&str> = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&keep.as_str()), "{ids:?}");
    assert!(
        !ids.contains(&short.as_str()),
        "expired while down: reaped at start"
    );
    assert_eq!(c.sh(&keep, "cat state.txt")["stdout"], "kept");
    // Expiry while running.
    let brief = c.create(json!({"timeout": 1}));
    wait_until("reaped", Duration::from_secs(10), || {
        c.request("sandbox/info", json!({"sandbox": brief}))["error"]["code"] == 2009
    });
    wait_until("its files removed", Duration::from_secs(10), || {
        !home.path.join("data/local/sandboxes").join(&brief).exists()
    });
}

#[test]
fn abx_run_is_the_main_job() {
    let home = Home::new();
    let out = home.run(&[
        "run",
        "--",
        "echo hello from a sandbox; echo err >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from a sandbox\n"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    let out = home.run(&["run", "--", "uname", "-s"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Linux\n");
    assert!(out.status.success());
    // Piped stdin reaches the command.
    let out = home.run_with_input(&["run", "--", "tr", "a-z", "A-Z"], b"piped\n");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "PIPED\n");
    // Nothing is left behind.
    let mut c = home.connect();
    assert_eq!(c.call("sandbox/list", Value::Null)["sandboxes"], json!([]));
}

#[test]
fn pipelined_stdin_writes_apply_in_order() {
    let (_home, mut c, id) = setup();
    let r = c.call("exec/start", json!({"sandbox": id, "command": "cat"}));
    let e = r["execId"].as_str().unwrap().to_owned();
    // Send every write without waiting for replies; the eof comes last.
    for i in 0..300 {
        c.send(&json!({"jsonrpc": "2.0", "id": 1000 + i, "method": "exec/write", "params": {"execId": e, "data": format!("{i}\n")}}).to_string());
    }
    c.send(&json!({"jsonrpc": "2.0", "id": 5000, "method": "exec/write", "params": {"execId": e, "eof": true}}).to_string());
    let s = c.collect(&e);
    let got: Vec<String> = String::from_utf8(s.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(got, (0..300).map(|i| i.to_string()).collect::<Vec<_>>());
}

#[test]
fn a_sandbox_cannot_drive_the_broker() {
    // Under the namespace model the broker's directories are hidden from sandboxes; under
    // the Landlock model the socket is visible, so the daemon's peer check must refuse. The
    // user's other daemon (another data dir, the default model: it never ran a weaker
    // model's sandbox) must refuse too (issue 41).
    let other = Home::new();
    other.start();
    for model in ["namespaces", "landlock"] {
        let mut home = Home::new();
        home.env.push(("ABX_ISOLATION".into(), model.into()));
        home.start();
        let mut c = home.connect();
        let id = c.create(json!({}));
        let probe = format!(
            "import socket, sys\ndef drive(p):\n  s=socket.socket(socket.AF_UNIX)\n  try:\n    s.connect(p)\n  except OSError as e:\n    return 'unreachable %d' % e.errno\n  s.settimeout(10)\n  try:\n    s.sendall(b'{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"broker/ping\"}}\\n')\n    d=s.recv(100)\n  except OSError:\n    d=b''\n  return 'served' if d else 'EOF'\nprint(drive({:?}))\nprint(drive({:?}))",
            home.socket().display().to_string(),
            other.socket().display().to_string()
        );
        c.call(
            "files/write",
            json!({"sandbox": id, "path": "probe.py", "data": probe}),
        );
        let r = c.sh(&id, "python3 probe.py");
        let out = r["stdout"].as_str().unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{model}: {r}");
        assert!(
            !out.contains("served"),
            "{model}: a sandbox process was served: {r}"
        );
        for (line, h) in lines.iter().zip([&home, &other]) {
            assert!(
                line.starts_with("unreachable") || line.starts_with("EOF"),
                "{model}: {r}"
            );
            if line.starts_with("EOF") {
                // The line may reach the file after the peer saw its EOF: wait for it.
                wait_until("the refusal is logged", Duration::from_secs(20), || {
                    std::fs::read_to_string(h.log_file())
                        .unwrap_or_default()
                        .contains("refusing a connection from a sandbox or plugin process")
                });
            }
        }
        // And the broker's data is not readable from inside under namespaces.
        if model == "namespaces" {
            let r = c.sh(
                &id,
                &format!("ls {} 2>&1 | head -3", home.path.join("data").display()),
            );
            assert!(
                !r["stdout"].as_str().unwrap().contains("sandboxes.json"),
                "{r}"
            );
        }
    }
}

/// Issue 21: `modifiedAt` carries the fraction of a second the file system keeps (valid
/// RFC 3339), in `files/stat` and `files/list` alike.
#[test]
fn modified_at_has_the_file_systems_sub_second_precision() {
    let (_home, mut c, id) = setup();
    let r = c.sh(
        &id,
        "printf x > t && touch -d '2020-01-02T03:04:05.123456789Z' t && printf y > w && touch -d '2020-01-02T03:04:05Z' w",
    );
    assert_eq!(r["exitCode"], 0, "{r}");
    let st = c.call("files/stat", json!({"sandbox": id, "path": "t"}));
    assert_eq!(st["modifiedAt"], "2020-01-02T03:04:05.123456789Z", "{st}");
    // Whole seconds stay without a fraction.
    let st = c.call("files/stat", json!({"sandbox": id, "path": "w"}));
    assert_eq!(st["modifiedAt"], "2020-01-02T03:04:05Z", "{st}");
    let l = c.call("files/list", json!({"sandbox": id, "path": "."}));
    let t = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "t")
        .cloned()
        .unwrap_or_else(|| panic!("no t in {l}"));
    assert_eq!(t["modifiedAt"], "2020-01-02T03:04:05.123456789Z", "{t}");
}

/// Start `command` and wait for its first output (so its traps are set).
fn start_ready(c: &mut Client, sandbox: &str, command: &str) -> String {
    let e = c.call(
        "exec/start",
        json!({"sandbox": sandbox, "command": command, "stdin": ""}),
    )["execId"]
        .as_str()
        .unwrap()
        .to_owned();
    loop {
        let v = c.recv();
        if v["params"]["execId"] == e.as_str() && v["method"] == "exec/output" {
            assert_eq!(abx_tests::output_bytes(&v["params"]), b"ready\n");
            return e;
        }
        assert_ne!(v["method"], "exec/exit", "{v}");
    }
}

/// Issue 21: `exec/kill` with INT can be swallowed (`sh` between commands, a trap): the
/// broker escalates to TERM, then KILL, 2 s apart, while the command runs; `escalate:
/// false` sends only the signal asked for.
#[test]
fn exec_kill_escalates_int_to_term_then_kill() {
    let (_home, mut c, id) = setup();
    let grace = Duration::from_secs(2);
    let slack = Duration::from_millis(300);
    // Ignores INT and TERM: only the KILL ends it.
    let e = start_ready(
        &mut c,
        &id,
        "trap '' INT TERM; echo ready; while :; do sleep 0.1; done",
    );
    let t0 = std::time::Instant::now();
    c.call("exec/kill", json!({"execId": e, "signal": "INT"}));
    let s = c.collect(&e);
    assert_eq!(s.exit["signal"], "SIGKILL", "{:?}", s.exit);
    assert!(t0.elapsed() + slack >= 2 * grace, "{:?}", t0.elapsed());
    // Ignores INT only: the TERM ends it.
    let e = start_ready(
        &mut c,
        &id,
        "trap '' INT; echo ready; while :; do sleep 0.1; done",
    );
    let t0 = std::time::Instant::now();
    c.call("exec/kill", json!({"execId": e, "signal": "INT"}));
    let s = c.collect(&e);
    assert_eq!(s.exit["signal"], "SIGTERM", "{:?}", s.exit);
    assert!(t0.elapsed() + slack >= grace, "{:?}", t0.elapsed());
    // Opted out: the INT is all it gets (it outlives two grace periods), until a KILL.
    let e = start_ready(
        &mut c,
        &id,
        "trap '' INT TERM; echo ready; while :; do sleep 0.1; done",
    );
    c.call(
        "exec/kill",
        json!({"execId": e, "signal": "INT", "escalate": false}),
    );
    if let Some(v) = c.try_recv(2 * grace + Duration::from_secs(1)) {
        panic!("nothing expected without escalation: {v}");
    }
    c.call("exec/kill", json!({"execId": e, "signal": "KILL"}));
    assert_eq!(c.collect(&e).exit["signal"], "SIGKILL");
}

/// Issue 21: a client that dies is found out when a write to it fails (or, since issue 18,
/// when its closed socket reads as ended). The exit of its exec sent then (the first
/// notification after the death) stays with the exec, so a later `exec/attach` replays it
/// instead of answering E3002.
#[test]
fn an_exit_written_to_a_dead_client_stays_for_the_next_attach() {
    let (home, mut c, id) = setup();
    let e = c.call(
        "exec/start",
        json!({"sandbox": id, "command": "while [ ! -e go ]; do sleep 0.05; done; exit 7", "stdin": ""}),
    )["execId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The client dies with the command silent: nothing is written to it yet.
    drop(c);
    let mut other = home.connect();
    let connections = |o: &mut Client| o.call("broker/status", Value::Null)["connections"].clone();
    // (Since issue 18 a socket closed both ways is noticed at its EOF, before any write: the
    // exit then finds the connection closed, which keeps it the same way.)
    other.call(
        "files/write",
        json!({"sandbox": id, "path": "go", "data": ""}),
    );
    // The exit goes to the dead client, the write fails, and its connection is dropped.
    wait_until(
        "the dead client's connection dropped",
        Duration::from_secs(20),
        || connections(&mut other) == 1,
    );
    // The command has ended (its exit went to the dead connection, and stayed).
    wait_until("the command ended", Duration::from_secs(20), || {
        let r = other.call("process/list", json!({"sandbox": id}));
        !r["processes"].as_array().is_some_and(|ps| {
            ps.iter()
                .any(|p| p["command"].as_str().is_some_and(|c| c.contains("-e go")))
        })
    });
    let r = other.call("exec/attach", json!({"execId": e}));
    // Replayed (kept while nobody was attached), or, when the attach came between the
    // command's end and its exit being sent, sent live: never lost, never twice.
    assert!(
        [(json!(false), json!(1)), (json!(true), json!(0))]
            .contains(&(r["running"].clone(), r["replayed"].clone())),
        "{r}"
    );
    let s = other.collect(&e);
    assert_eq!((s.exit["exitCode"].clone(), s.exits), (json!(7), 1));
}

/// A sandbox process a daemon of the Landlock model left running (it is in the daemon's own
/// PID namespace) cannot drive the next daemon either, even one of the namespaces model,
/// which otherwise refuses peers by PID namespace alone: at start it finds such processes
/// and checks every peer's ancestry again.
#[test]
fn a_sandbox_process_left_by_a_landlock_daemon_cannot_drive_its_successor() {
    let mut home = Home::new();
    home.env.push(("ABX_ISOLATION".into(), "landlock".into()));
    home.start();
    let mut c = home.connect();
    let id = c.create(json!({"timeout": 600}));
    let probe = format!(
        "import os, socket, time\nwhile not os.path.exists('go'):\n  time.sleep(0.05)\ns=socket.socket(socket.AF_UNIX)\ntry:\n  s.connect({:?})\n  s.settimeout(10)\n  s.sendall(b'{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"broker/ping\"}}\\n')\n  d=s.recv(100)\nexcept OSError as e:\n  d=b''\nopen('result.tmp','w').write('served' if d else 'refused')\nos.rename('result.tmp','result')\n",
        home.socket().display().to_string()
    );
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "probe.py", "data": probe}),
    );
    let r = c.sh(
        &id,
        "setsid python3 probe.py </dev/null >/dev/null 2>&1 & echo started",
    );
    assert_eq!(r["stdout"], "started\n", "{r}");
    drop(c);
    assert!(home.run(&["broker", "stop"]).status.success());
    // The successor runs the default model.
    home.env.retain(|(k, _)| k != "ABX_ISOLATION");
    home.start();
    let mut c = home.connect();
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "go", "data": ""}),
    );
    let mut result = Value::Null;
    wait_until("the probe's verdict", Duration::from_secs(30), || {
        result = c.request("files/read", json!({"sandbox": id, "path": "result"}));
        result["result"]["data"].is_string()
    });
    assert_eq!(
        result["result"]["data"], "refused",
        "a left-over sandbox process was served: {result}"
    );
}

/// A cancellation sent right behind an `exec/run` (at once, or up to 1.1 ms later) never
/// leaves its process running unowned: whether it lands before the init started it, while
/// the init's answer is in flight, or after the broker took the process over, no `sleep`
/// survives. (The narrowest of these windows, an answer delivered and not yet taken, is hit
/// under load; the Python SDK's `test_keyboard_interrupt_cancels_at_the_broker` caught it.)
#[test]
fn a_cancel_racing_the_start_of_an_exec_run_leaves_no_process_behind() {
    let (home, mut c, id) = setup();
    for i in 0..120u64 {
        c.send(
            &json!({"jsonrpc": "2.0", "id": 1000 + i, "method": "exec/run",
                "params": {"sandbox": id, "command": format!("sleep 300 # {i}")}})
            .to_string(),
        );
        // A spread of moments: some cancels land before the spawn, some in its answer.
        let until = std::time::Instant::now() + Duration::from_micros(i % 12 * 100);
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        c.send(
            &json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 1000 + i}})
                .to_string(),
        );
        let v = c.recv();
        assert_eq!(v["id"], 1000 + i, "{v}");
    }
    let mut ctl = home.connect();
    let mut left = Value::Null;
    wait_until("no cancelled sleep left", Duration::from_secs(20), || {
        let ps = ctl.call("process/list", json!({"sandbox": id}));
        left = json!(ps["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["command"]
                .as_str()
                .is_some_and(|c| c.contains("sleep 300")))
            .cloned()
            .collect::<Vec<_>>());
        left.as_array().unwrap().is_empty()
    });
}

/// The narrowest window of a cancel racing a start, held open: the init has started the
/// process and answered, and the request has not taken the answer yet (a test hook makes it
/// look 800 ms late, as a loaded machine may). Cancelled then, the process must not run on.
#[test]
fn a_cancel_while_a_started_process_answer_waits_kills_that_process() {
    let mut home = Home::new();
    let mark = home.path.join("spawn-answered");
    home.env.push(("ABX_TEST_HOOKS".into(), "1".into()));
    home.env
        .push(("ABX_TEST_SPAWN_WAIT_MS".into(), "800".into()));
    home.env
        .push(("ABX_TEST_SPAWN_MARK".into(), mark.display().to_string()));
    home.start();
    let mut c = home.connect();
    let id = c.create(json!({}));
    let mut ctl = home.connect();
    let sleepers = |ctl: &mut Client| {
        ctl.call("process/list", json!({"sandbox": id}))["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| {
                p["command"]
                    .as_str()
                    .is_some_and(|c| c.contains("sleep 300"))
            })
            .count()
    };
    c.send(
        &json!({"jsonrpc": "2.0", "id": 7, "method": "exec/run",
            "params": {"sandbox": id, "command": "sleep 300"}})
        .to_string(),
    );
    // Started in the sandbox, and its answer is in the request's channel, not yet taken.
    wait_until("the start answered", Duration::from_secs(20), || {
        mark.exists()
    });
    assert!(sleepers(&mut ctl) > 0, "the sleep runs");
    c.send(r#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":7}}"#);
    let v = c.recv();
    assert_eq!(v["id"], 7, "{v}");
    assert_eq!(v["error"]["code"], -32800, "{v}");
    wait_until("the cancelled sleep gone", Duration::from_secs(20), || {
        sleepers(&mut ctl) == 0
    });
}
