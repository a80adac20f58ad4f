//! Issue 43, `sandbox/log`: every command run in a sandbox (exec/run, exec/start with and
//! without a pty, code/run), with the client that asked, kept by the broker for every
//! provider. A real daemon over its real socket, local sandboxes and a plugin's.

use abx_tests::fixtures::{install_pinned, plugin_sandbox, started};
use abx_tests::{abx_code, wait_until, Client, Home};
use serde_json::{json, Value};
use std::time::Duration;

/// A client that says its name (`initialize` `clientInfo.name`).
fn named(home: &Home, name: &str) -> Client {
    let mut c = home.connect();
    c.call(
        "initialize",
        json!({"clientInfo": {"name": name, "version": "1"}}),
    );
    c
}

fn log(c: &mut Client, sandbox: &str, extra: Value) -> Value {
    let mut p = json!({"sandbox": sandbox});
    if let (Some(p), Some(e)) = (p.as_object_mut(), extra.as_object()) {
        p.extend(e.clone());
    }
    c.call("sandbox/log", p)
}

fn entries(r: &Value) -> Vec<Value> {
    r["entries"].as_array().cloned().unwrap_or_default()
}

/// Whether the sandbox has python3 (a local sandbox sees the host's /usr).
fn has_python(c: &mut Client, sb: &str) -> bool {
    c.sh(sb, "command -v python3")["exitCode"] == 0
}

#[test]
fn every_command_is_logged_with_its_client_argv_cwd_and_exit() {
    let home = Home::new();
    home.start();
    let mut one = named(&home, "agent-one");
    let mut two = named(&home, "agent-two");
    let mut anon = home.connect();
    let sb = one.create(json!({"timeout": 600}));

    // exec/run: a command (sh -c) with a cwd, and an argv.
    let r = one.call(
        "exec/run",
        json!({"sandbox": sb, "command": "echo hi; exit 3", "cwd": "/tmp"}),
    );
    assert_eq!(r["exitCode"], 3);
    two.call("exec/run", json!({"sandbox": sb, "argv": ["true"]}));
    // exec/start without and with a pty.
    let s = one.call(
        "exec/start",
        json!({"sandbox": sb, "command": "echo streamed"}),
    );
    let exit = one.collect(s["execId"].as_str().unwrap()).exit;
    assert_eq!(exit["exitCode"], 0, "{exit}");
    let s = two.call(
        "exec/start",
        json!({"sandbox": sb, "argv": ["sh", "-c", "exit 5"], "pty": {"cols": 80, "rows": 24}}),
    );
    let exit = two.collect(s["execId"].as_str().unwrap()).exit;
    assert_eq!(exit["exitCode"], 5, "{exit}");
    // A command that cannot start, and one that is cancelled.
    let failed = two.request(
        "exec/run",
        json!({"sandbox": sb, "argv": ["/no/such/program"]}),
    );
    // A cancelled one: its request answered -32800.
    one.send(
        &json!({"jsonrpc": "2.0", "id": 9001, "method": "exec/run",
                "params": {"sandbox": sb, "command": "sleep 30"}})
        .to_string(),
    );
    // Cancelled once it runs: the log has its start (recorded when the request is routed).
    wait_until("the sleep 30 in the log", Duration::from_secs(30), || {
        let log = anon.call("sandbox/log", json!({"sandbox": sb}));
        log["entries"].as_array().is_some_and(|e| {
            e.iter()
                .any(|x| x["argv"] == json!(["sh", "-c", "sleep 30"]))
        })
    });
    one.send(r#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":9001}}"#);
    loop {
        let v = one.recv();
        if v["id"] == 9001 {
            assert_eq!(v["error"]["code"], -32800, "{v}");
            break;
        }
    }
    // A client that never said its name.
    anon.sh(&sb, "true");
    let python = has_python(&mut anon, &sb);
    // The `command -v python3` above is logged too (anon).
    if python {
        let r = one.call("code/run", json!({"sandbox": sb, "code": "1 + 1"}));
        assert_eq!(r["results"][0]["text/plain"], "2", "{r}");
        let r = one.call(
            "code/run",
            json!({"sandbox": sb, "code": "raise ValueError('x')", "language": "python"}),
        );
        assert!(!r["error"].is_null(), "{r}");
    } else {
        eprintln!("SKIPPED (code/run part): no python3 in the sandbox");
    }

    let r = log(&mut two, &sb, json!({}));
    let e = entries(&r);
    assert_eq!(r["dropped"], 0, "{r}");
    let n = if python { 10 } else { 8 };
    assert_eq!(e.len(), n, "{r:#}");
    assert_eq!(r["last"], n as u64);
    for (i, x) in e.iter().enumerate() {
        assert_eq!(x["seq"], i as u64 + 1, "{x}");
        let started = x["startedAt"].as_str().unwrap();
        assert!(abx_tests::rfc3339_unix(started).is_some(), "{started}");
        assert!(started.ends_with('Z'), "{started}");
        assert!(x["durationMs"].is_u64(), "ended: {x}");
    }
    let kinds: Vec<&str> = e.iter().map(|x| x["kind"].as_str().unwrap()).collect();
    let clients: Vec<&str> = e.iter().map(|x| x["client"].as_str().unwrap()).collect();
    let mut want_kinds = vec![
        "exec", "exec", "stream", "pty", "exec", "exec", "exec", "exec",
    ];
    let mut want_clients = vec![
        "agent-one",
        "agent-two",
        "agent-one",
        "agent-two",
        "agent-two",
        "agent-one",
        "unknown",
        "unknown",
    ];
    if python {
        want_kinds.extend(["code", "code"]);
        want_clients.extend(["agent-one", "agent-one"]);
    }
    assert_eq!(kinds, want_kinds);
    assert_eq!(clients, want_clients);
    assert_eq!(e[0]["argv"], json!(["sh", "-c", "echo hi; exit 3"]));
    assert_eq!(e[0]["cwd"], "/tmp");
    assert_eq!(e[0]["exitCode"], 3);
    assert_eq!(e[1]["argv"], json!(["true"]));
    assert!(e[1].get("cwd").is_none(), "{}", e[1]);
    assert_eq!(e[1]["exitCode"], 0);
    assert_eq!(e[2]["argv"], json!(["sh", "-c", "echo streamed"]));
    assert_eq!(e[2]["exitCode"], 0);
    assert_eq!(e[3]["argv"], json!(["sh", "-c", "exit 5"]));
    assert_eq!(e[3]["exitCode"], 5);
    // Failed to start: the E-code of the error, or the shell's 127, as the reply said.
    match failed.get("error") {
        Some(err) => assert_eq!(e[4]["error"], abx_code(err), "{}", e[4]),
        None => assert_eq!(e[4]["exitCode"], failed["result"]["exitCode"], "{}", e[4]),
    }
    assert_eq!(e[5]["argv"], json!(["sh", "-c", "sleep 30"]));
    assert_eq!(e[5]["error"], "E1006", "cancelled: {}", e[5]);
    assert!(e[5].get("exitCode").is_none(), "{}", e[5]);
    assert!(e[5]["durationMs"].as_u64().unwrap() < 20_000, "{}", e[5]);
    if python {
        assert_eq!(e[8]["code"], "1 + 1");
        assert_eq!(e[8]["language"], "python");
        assert_eq!(e[8]["exitCode"], 0);
        assert!(e[8].get("argv").is_none());
        assert_eq!(e[9]["exitCode"], 1, "a cell that raised: {}", e[9]);
    }

    // since and limit.
    let r = log(&mut one, &sb, json!({"since": 2, "limit": 3}));
    let seqs: Vec<u64> = entries(&r)
        .iter()
        .map(|x| x["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [3, 4, 5]);
    assert_eq!(r["last"], n as u64);
    let r = log(&mut one, &sb, json!({"since": n}));
    assert!(entries(&r).is_empty(), "{r}");
    let r = log(&mut one, &sb, json!({"limit": 0}));
    assert!(entries(&r).is_empty(), "{r}");
    // `provider:id` names it too.
    let r = log(&mut one, &format!("local:{sb}"), json!({"limit": 1}));
    assert_eq!(entries(&r)[0]["seq"], 1);
    // Bad params as any method's.
    let err = one.call_err("sandbox/log", json!({"sandbox": sb, "since": -1}));
    assert_eq!(abx_code(&err), "E1004", "{err}");
    let err = one.call_err("sandbox/log", json!({"sandbox": sb, "bogus": 1}));
    assert_eq!(abx_code(&err), "E1004", "{err}");
    // A sandbox the broker does not know.
    let err = one.call_err("sandbox/log", json!({"sandbox": "sb-0000000000000000"}));
    assert_eq!(abx_code(&err), "E2009", "{err}");
    let err = one.call_err("sandbox/log", json!({"sandbox": "local:nope/../x"}));
    assert!(
        ["E2009", "E1004"].contains(&abx_code(&err)),
        "as sandbox/info: {err}"
    );
}

#[test]
fn a_stream_still_running_has_no_exit_and_gets_it_when_it_ends() {
    let home = Home::new();
    home.start();
    let mut c = named(&home, "streamer");
    let sb = c.create(json!({"timeout": 600}));
    let s = c.call(
        "exec/start",
        json!({"sandbox": sb, "command": "read x; exit 4"}),
    );
    let id = s["execId"].as_str().unwrap().to_owned();
    let mut other = home.connect();
    let e = entries(&log(&mut other, &sb, json!({})));
    assert_eq!(e.len(), 1);
    assert_eq!(e[0]["kind"], "stream");
    assert!(e[0].get("durationMs").is_none(), "running: {}", e[0]);
    assert!(e[0].get("exitCode").is_none(), "running: {}", e[0]);
    c.call(
        "exec/write",
        json!({"execId": id, "data": "go\n", "eof": true}),
    );
    let exit = c.collect(&id).exit;
    assert_eq!(exit["exitCode"], 4);
    let e = entries(&log(&mut other, &sb, json!({})));
    assert_eq!(e[0]["exitCode"], 4, "{}", e[0]);
    assert!(e[0]["durationMs"].is_u64());
    // Killed by its timeout: E3001 beside how it ended.
    let r = c.call(
        "exec/run",
        json!({"sandbox": sb, "command": "sleep 30", "timeout": 0.5}),
    );
    assert_eq!(r["timedOut"], true, "{r}");
    let e = entries(&log(&mut other, &sb, json!({"since": 1})));
    assert_eq!(e[0]["error"], "E3001", "{}", e[0]);
    assert_eq!(e[0]["exitCode"], r["exitCode"], "{}", e[0]);
}

#[test]
fn the_bound_drops_the_oldest_and_the_log_survives_a_restart_and_goes_with_the_sandbox() {
    let mut home = Home::new();
    home.env.push(("ABX_LOG_ENTRIES".into(), "5".into()));
    home.start();
    let mut c = named(&home, "bounded");
    let sb = c.create(json!({"timeout": 600}));
    for i in 0..12 {
        c.sh(&sb, &format!("exit {i}"));
    }
    let r = log(&mut c, &sb, json!({}));
    let e = entries(&r);
    assert_eq!(r["last"], 12);
    assert_eq!(e.len() as u64 + r["dropped"].as_u64().unwrap(), 12, "{r}");
    assert!(e.len() >= 5 && e.len() <= 6, "{r}");
    assert_eq!(e.last().unwrap()["exitCode"], 11);
    assert_eq!(e[0]["seq"], r["dropped"].as_u64().unwrap() + 1);
    let file = home
        .path
        .join("data/cmdlog/local")
        .join(format!("{sb}.jsonl"));
    assert!(file.exists(), "{}", file.display());
    let lines = std::fs::read_to_string(&file).unwrap().lines().count();
    assert!(
        lines <= 2 * 6,
        "the file holds only what is kept: {lines} lines"
    );

    // A daemon restart: the log is read back, and goes on from where it was; the log of a
    // sandbox that expired while the daemon was down is gone.
    let short = c.create(json!({"timeout": 2}));
    c.sh(&short, "true");
    let short_file = home
        .path
        .join("data/cmdlog/local")
        .join(format!("{short}.jsonl"));
    assert!(short_file.exists());
    let short_ends = c.call("sandbox/info", json!({"sandbox": short}))["expiresAt"]
        .as_str()
        .and_then(abx_tests::rfc3339_unix)
        .expect("expiresAt");
    drop(c);
    let out = home.run(&["broker", "stop"]);
    assert!(out.status.success(), "{out:?}");
    wait_until("the short sandbox's end", Duration::from_secs(10), || {
        abx_tests::unix_secs() > short_ends
    });
    home.start();
    assert!(!short_file.exists(), "expired while the daemon was down");
    let mut c = named(&home, "after");
    let again = log(&mut c, &sb, json!({}));
    assert_eq!(again, r, "the same log after a restart");
    c.sh(&sb, "true");
    let r = log(&mut c, &sb, json!({"since": 12}));
    let e = entries(&r);
    assert_eq!(e.len(), 1, "{r}");
    assert_eq!(
        (e[0]["seq"].as_u64(), e[0]["client"].as_str()),
        (Some(13), Some("after"))
    );

    // Killed: the log goes with the sandbox.
    c.call("sandbox/kill", json!({"sandbox": sb}));
    assert!(!file.exists(), "removed with the sandbox");
    let err = c.call_err("sandbox/log", json!({"sandbox": sb}));
    assert_eq!(abx_code(&err), "E2009", "{err}");

    // Expired: the same.
    let brief = c.create(json!({"timeout": 2}));
    c.sh(&brief, "true");
    let file = home
        .path
        .join("data/cmdlog/local")
        .join(format!("{brief}.jsonl"));
    assert!(file.exists());
    wait_until(
        "expired and its log removed",
        Duration::from_secs(20),
        || !file.exists(),
    );
    let err = c.call_err("sandbox/log", json!({"sandbox": brief}));
    assert_eq!(abx_code(&err), "E2009", "{err}");
}

#[test]
fn a_plugin_providers_sandbox_is_logged_too() {
    let (home, mut c) = started(&[]);
    c.call(
        "initialize",
        json!({"clientInfo": {"name": "plugin-user", "version": "1"}}),
    );
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (sb, full) = plugin_sandbox(&mut c, "py-local");
    let r = c.call("exec/run", json!({"sandbox": full, "command": "exit 2"}));
    assert_eq!(r["exitCode"], 2, "{r}");
    let s = c.call(
        "exec/start",
        json!({"sandbox": full, "argv": ["sh", "-c", "echo hi"]}),
    );
    let exit = c.collect(s["execId"].as_str().unwrap()).exit;
    assert_eq!(exit["exitCode"], 0, "{exit}");
    let r = log(&mut c, &full, json!({}));
    let e = entries(&r);
    assert_eq!(e.len(), 2, "{r}");
    assert_eq!(
        (
            e[0]["kind"].as_str(),
            e[0]["client"].as_str(),
            e[0]["exitCode"].as_i64()
        ),
        (Some("exec"), Some("plugin-user"), Some(2))
    );
    assert_eq!(e[1]["kind"], "stream");
    assert_eq!(e[1]["argv"], json!(["sh", "-c", "echo hi"]));
    assert_eq!(e[1]["exitCode"], 0, "{}", e[1]);
    // The bare id finds it too.
    assert_eq!(log(&mut c, &sb, json!({}))["last"], 2);
    let file = home
        .path
        .join("data/cmdlog/py-local")
        .join(format!("{sb}.jsonl"));
    assert!(file.exists(), "{}", file.display());
    c.call("sandbox/kill", json!({"sandbox": full}));
    assert!(!file.exists(), "removed with the plugin's sandbox");
}

#[test]
fn abx_log_prints_a_table_and_json() {
    let home = Home::new();
    home.start();
    let mut c = named(&home, "table-client");
    let sb = c.create(json!({"timeout": 600}));
    c.call(
        "exec/run",
        json!({"sandbox": sb, "command": "echo one", "cwd": "/tmp"}),
    );
    drop(c);
    // `abx exec` says its name (`abx`), though it skips the handshake otherwise.
    let out = home.run(&["exec", &sb, "--", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let out = home.run(&["log", &sb]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "Seq",
        "Client",
        "Kind",
        "Command",
        "Cwd",
        "Started",
        "Duration",
        "Exit",
        "table-client",
        "echo one",
        "/tmp",
        "abx",
        "exit 7",
    ] {
        assert!(text.contains(want), "{want:?} in\n{text}");
    }
    let out = home.run(&["-j", "log", &sb, "--since", "1"]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["last"], 2, "{v}");
    assert_eq!(v["entries"][0]["client"], "abx", "{v}");
    assert_eq!(v["entries"][0]["exitCode"], 7, "{v}");
    let out = home.run(&["-j", "log", &sb, "--limit", "1"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["entries"].as_array().unwrap().len(), 1, "{v}");
    let out = home.run(&["log", "sb-0000000000000000"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("[E2009]"));
}
