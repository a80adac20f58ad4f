//! The wire against a real daemon over a real socket: both framings, batches, every bad
//! input of issue #2, lifecycle, and a client that never reads.

use abx_tests::{abx_code, Framing, Home};
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

fn ping(id: i64) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "broker/ping"}).to_string()
}

#[test]
fn both_framings_in_and_out() {
    let home = Home::new();
    home.start();
    for f in [Framing::Line, Framing::Header] {
        let mut c = home.connect_with(f);
        // A reply comes back in the framing the client used (read_frame checks the shape).
        let r = c.request("broker/ping", Value::Null);
        assert_eq!(r, json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
        let st = c.call("broker/status", Value::Null);
        assert_eq!(st["version"], env!("CARGO_PKG_VERSION"));
        assert!(st["pid"].as_u64().unwrap() > 0);
        assert!(st["connections"].as_u64().unwrap() >= 1);
    }
    // Lower-case header name and bare \n separators are accepted too.
    let mut c = home.connect_with(Framing::Header);
    let body = ping(9);
    c.send_raw(format!("content-length: {}\n\n{body}", body.len()).as_bytes());
    assert_eq!(c.recv()["id"], 9);
}

#[test]
fn many_requests_in_one_write_all_answered() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let mut buf = String::new();
    for i in 0..500 {
        buf.push_str(&ping(i));
        buf.push('\n');
    }
    c.send_raw(buf.as_bytes());
    let mut ids: Vec<i64> = (0..500).map(|_| c.recv()["id"].as_i64().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, (0..500).collect::<Vec<_>>());
}

#[test]
fn batches() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    c.send(concat!(
        r#"[{"jsonrpc":"2.0","id":1,"method":"broker/ping"},"#,
        r#"{"jsonrpc":"2.0","method":"initialized"},"#,
        r#"{"jsonrpc":"2.0","id":"two","method":"nope/nope"},7]"#
    ));
    let v = c.recv();
    let arr = v.as_array().expect("a batch reply is an array");
    assert_eq!(
        arr.len(),
        3,
        "one reply per request and per invalid element: {v}"
    );
    assert_eq!(arr[0], json!({"jsonrpc":"2.0","id":1,"result":{}}));
    assert_eq!(arr[1]["id"], "two");
    assert_eq!(arr[1]["error"]["code"], -32601);
    assert_eq!(arr[2]["id"], Value::Null);
    assert_eq!(arr[2]["error"]["code"], -32600);
    // A batch of notifications only gets no reply at all: the next reply is the ping's.
    c.send(r#"[{"jsonrpc":"2.0","method":"initialized"}]"#);
    c.send(&ping(5));
    assert_eq!(c.recv()["id"], 5);
    // An empty batch is one Invalid Request.
    c.send("[]");
    let e = c.recv();
    assert_eq!(e["error"]["code"], -32600);
    assert_eq!(abx_code(&e["error"]), "E1002");
}

#[test]
fn bad_input_gets_errors_and_the_connection_lives() {
    let home = Home::new();
    home.start();
    for f in [Framing::Line, Framing::Header] {
        let mut c = home.connect_with(f);
        let cases: &[(&str, i64, &str, Value)] = &[
            ("{\"jsonrpc\":\"2.0\",\"id\":1,", -32700, "E1001", Value::Null),
            ("not json at all", -32700, "E1001", Value::Null),
            ("\"a string\"", -32600, "E1002", Value::Null),
            ("{\"id\":4,\"method\":\"broker/ping\"}", -32600, "E1002", json!(4)),
            ("{\"jsonrpc\":\"1.0\",\"id\":5,\"method\":\"broker/ping\"}", -32600, "E1002", json!(5)),
            ("{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"broker/ping\"}", -32600, "E1002", Value::Null),
            ("{\"jsonrpc\":\"2.0\",\"id\":true,\"method\":\"broker/ping\"}", -32600, "E1002", Value::Null),
            ("{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"no/such\"}", -32601, "E1003", json!(8)),
            ("{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"broker/shutdown\",\"params\":{\"ifIdle\":\"yes\"}}", -32602, "E1004", json!(9)),
            ("{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"broker/ping\",\"params\":\"x\"}", -32600, "E1002", json!(10)),
            ("{\"jsonrpc\":\"2.0\",\"id\":11}", -32600, "E1002", json!(11)),
        ];
        for (input, code, abx, id) in cases {
            c.send(input);
            let v = c.recv();
            assert_eq!(v["error"]["code"], *code, "{input} -> {v}");
            assert_eq!(abx_code(&v["error"]), *abx, "{input} -> {v}");
            assert_eq!(v["id"], *id, "{input} -> {v}");
            assert!(v["error"]["data"]["suggestion"]
                .as_str()
                .is_some_and(|s| !s.is_empty()));
            // Still usable.
            c.send(&ping(100));
            assert_eq!(c.recv()["id"], 100, "connection unusable after {input}");
        }
        // Unknown methods are answered at once, with the method named.
        let e = c.call_err("sandbox/frobnicate", Value::Null);
        assert!(e["message"]
            .as_str()
            .unwrap()
            .contains("sandbox/frobnicate"));
    }
}

#[test]
fn oversized_messages_are_refused_without_losing_the_connection() {
    let mut home = Home::new();
    home.env
        .push(("ABX_MAX_MESSAGE_SIZE".into(), "4096".into()));
    home.start();
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"broker/ping\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(100_000)
    );
    for f in [Framing::Line, Framing::Header] {
        let mut c = home.connect_with(f);
        c.send(&big);
        let v = c.recv();
        assert_eq!(abx_code(&v["error"]), "E1005", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("4096"));
        c.send(&ping(2));
        assert_eq!(c.recv()["id"], 2);
    }
}

#[test]
fn truncated_and_broken_frames_close_cleanly_and_the_daemon_lives() {
    let home = Home::new();
    let pid = home.start();
    // Closed in the middle of a body.
    let mut c = home.connect_with(Framing::Header);
    c.send_raw(b"Content-Length: 100\r\n\r\n{\"jsonrpc\":");
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    // Either an error reply or a clean close; never a hang.
    let _ = c.recv_opt();
    // Headers that lose the framing: an error, then the connection closes.
    let mut c = home.connect_with(Framing::Header);
    c.send_raw(b"Content-Length: banana\r\n\r\n{}");
    let v = c.recv();
    assert_eq!(abx_code(&v["error"]), "E1001");
    assert!(
        c.recv_opt().is_none(),
        "connection closes when framing is lost"
    );
    // Closed mid-line.
    let mut c = home.connect();
    c.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"meth");
    drop(c);
    // The daemon is unharmed.
    let mut c = home.connect();
    assert_eq!(c.call("broker/status", Value::Null)["pid"], pid);
}

#[test]
fn lifecycle_initialize_shutdown_exit() {
    let home = Home::new();
    home.start();
    let mut c = home.connect_with(Framing::Header);
    // LSP-style initialize with unknown fields.
    let r = c.call(
        "initialize",
        json!({"processId": 1, "rootUri": null, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    assert_eq!(r["protocolVersion"], "abx/1");
    assert_eq!(r["serverInfo"]["name"], "abx-broker");
    assert_eq!(r["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
    // `initialize` lists every method the broker answers: the core's, the provider methods
    // it routes and the daemon's own (provider/*): exactly what docs/openrpc.json describes,
    // client notifications aside.
    let listed: std::collections::BTreeSet<String> = r["capabilities"]["methods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openrpc.json"))
            .unwrap(),
    )
    .unwrap();
    let described: std::collections::BTreeSet<String> = doc["methods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .filter(|m| !["initialized", "exit", "$/cancelRequest"].contains(&m.as_str()))
        .collect();
    assert_eq!(
        listed, described,
        "initialize's methods vs docs/openrpc.json"
    );
    // And, in order, the catalogue's requests (the list is derived from it).
    assert_eq!(
        r["capabilities"]["methods"],
        json!(abx_protocol::catalogue::REQUESTS),
        "initialize's methods vs abx_protocol::catalogue::REQUESTS"
    );
    for m in [
        "broker/ping",
        "sandbox/create",
        "provider/install",
        "provider/test",
    ] {
        assert!(listed.contains(m), "{m}");
    }
    c.send(r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#);
    assert_eq!(c.call("shutdown", Value::Null), Value::Null);
    let e = c.call_err("broker/status", Value::Null);
    assert_eq!(abx_code(&e), "E1010");
    c.send(r#"{"jsonrpc":"2.0","method":"exit"}"#);
    assert!(c.recv_opt().is_none(), "exit closes the connection");
    // Methods work without initialize, and the daemon is still there.
    let mut c = home.connect();
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
    // Cancelling something that is not running is harmless.
    c.send(r#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":12345}}"#);
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
}

/// Issue 41: a params member a method does not take is refused (E1004 naming it and the
/// method) by every method whose params are closed: the protocol's params table is iterated,
/// and every method the daemon answers must be in it, so a method added later is covered.
/// Nothing runs: no sandbox is made, the daemon does not stop. Open params (LSP's
/// `initialize`) still take anything.
#[test]
fn every_closed_method_refuses_an_unknown_member() {
    use abx_protocol::api::params::{params_of, params_table};
    let home = Home::new();
    let pid = home.start();
    let mut c = home.connect();
    let init = c.call(
        "initialize",
        json!({"processId": 1, "capabilities": {}, "workDoneToken": "w", "locale": "en"}),
    );
    for m in init["capabilities"]["methods"].as_array().unwrap() {
        let m = m.as_str().unwrap();
        assert!(
            params_of(m).is_some(),
            "{m} is answered but not in abx_protocol::api::params: its members are not checked"
        );
    }
    let before = c.call("sandbox/list", json!({}));
    let mut checked = 0;
    for e in params_table().filter(|e| !e.open) {
        let m = e.method;
        let err = c.call_err(m, json!({"zzMadeUp": {"x": [1]}}));
        assert_eq!(abx_code(&err), "E1004", "{m}: {err}");
        assert_eq!(err["code"], -32602, "{m}");
        assert_eq!(
            err["message"],
            format!("Invalid params for '{m}': unknown member 'zzMadeUp'"),
        );
        assert_eq!(err["data"]["unknown"], json!(["zzMadeUp"]), "{m}");
        checked += 1;
    }
    assert!(checked > 40, "{checked}");
    assert_eq!(c.call("sandbox/list", json!({})), before);
    assert_eq!(c.call("broker/status", Value::Null)["pid"], pid);
    // `broker/ping` with a member is not answered on the fast path unchecked.
    let err = c.call_err("broker/ping", json!({"echo": 1}));
    assert_eq!(abx_code(&err), "E1004", "{err}");
    assert_eq!(c.call("broker/ping", json!({})), json!({}));
}

#[test]
fn a_client_that_never_reads_does_not_stall_another() {
    let home = Home::new();
    let pid = home.start();
    // The stalled client pipelines far more replies than its queue and socket can hold.
    let mut stalled = std::os::unix::net::UnixStream::connect(home.socket()).unwrap();
    let stalled_ctl = stalled.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut chunk = String::new();
        for i in 0..1000 {
            chunk.push_str(&ping(i));
            chunk.push('\n');
        }
        stalled
            .set_write_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        // Until the daemon stops reading from us (backpressure) or 400k requests are sent.
        for _ in 0..400 {
            if stalled.write_all(chunk.as_bytes()).is_err() {
                break;
            }
        }
        stalled
    });
    // Until the daemon stops reading from the stalled client: its replies fill the client's
    // socket, then the daemon's queue for it, and then its requests pile up unread on our
    // side (`TIOCOUTQ`: sent and not yet read by the daemon).
    abx_tests::wait_until(
        "the daemon to stop reading the stalled client",
        Duration::from_secs(60),
        || abx_tests::socket_queue(&stalled_ctl, libc::TIOCOUTQ) >= abx_tests::SOCKET_FULL,
    );
    let t0 = std::time::Instant::now();
    let mut other = home.connect();
    for i in 0..200 {
        assert_eq!(
            other.call("broker/ping", Value::Null),
            json!({}),
            "ping {i}"
        );
    }
    let st = other.call("broker/status", Value::Null);
    assert!(st["connections"].as_u64().unwrap() >= 2);
    let rss_kib = abx_tests::rss_kib(pid);
    assert!(
        rss_kib < 128 * 1024,
        "daemon memory is bounded, RSS {rss_kib} KiB"
    );
    eprintln!(
        "other client served in {:?} while one never read",
        t0.elapsed()
    );
    stalled_ctl.shutdown(std::net::Shutdown::Both).unwrap();
    drop(writer.join().unwrap());
    let mut again = home.connect();
    assert_eq!(again.call("broker/ping", Value::Null), json!({}));
}

#[test]
fn stdio_broker_serves_both_framings_and_keeps_stdout_clean() {
    let home = Home::new();
    let mut input = Vec::new();
    for i in 1..=3 {
        input.extend_from_slice(ping(i).as_bytes());
        input.push(b'\n');
    }
    input.extend_from_slice(br#"{"jsonrpc":"2.0","id":4,"method":"nope"}"#);
    input.push(b'\n');
    let out = home.run_with_input(&["broker", "--stdio"], &input);
    assert!(out.status.success());
    let msgs = abx_tests::parse_all(&out.stdout, Framing::Line);
    assert_eq!(
        msgs.len(),
        4,
        "stdout holds only replies: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(msgs[3]["error"]["code"], -32601);
    // Logs went to stderr and the log file, never stdout.
    assert!(String::from_utf8_lossy(&out.stderr).contains("stdio broker"));
    assert!(std::fs::read_to_string(home.log_file())
        .unwrap()
        .contains("stdio broker"));

    // Content-Length framing, and `exit` ends the process even with stdin still open.
    let mut child = home
        .abx()
        .args(["broker", "--stdio"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(&abx_tests::frame(Framing::Header, ping(1).as_bytes()))
        .unwrap();
    stdin
        .write_all(&abx_tests::frame(
            Framing::Header,
            br#"{"jsonrpc":"2.0","method":"exit"}"#,
        ))
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let reply = abx_tests::read_frame(&mut stdout, Framing::Header).expect("a reply");
    assert_eq!(serde_json::from_slice::<Value>(&reply).unwrap()["id"], 1);
    let status = child.wait().unwrap();
    assert!(status.success());
    drop(stdin);
}

/// Issue 21: `vim.lsp.rpc` sends `params: []` for an empty Lua table. An empty by-position
/// array is no params for every method; a non-empty one is E1004 that names by-name params.
#[test]
fn empty_array_params_are_no_params_and_by_position_gets_a_clear_error() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    for method in [
        "sandbox/list",
        "provider/list",
        "broker/ping",
        "broker/status",
        "initialize",
    ] {
        let r = c.request(method, json!([]));
        assert!(r.get("error").is_none(), "{method} with [] failed: {r}");
    }
    // Whitespace inside the empty array is still empty.
    c.send(r#"{"jsonrpc":"2.0","id":"ws","method":"sandbox/list","params":[ ]}"#);
    let r = c.recv();
    assert!(r["result"]["sandboxes"].is_array(), "{r}");
    for method in [
        "sandbox/list",
        "broker/ping",
        "broker/status",
        "provider/info",
    ] {
        let e = c.call_err(method, json!(["local"]));
        assert_eq!(e["code"], -32602, "{method}: {e}");
        assert_eq!(abx_code(&e), "E1004", "{method}: {e}");
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.contains("by-name") && msg.contains("object") && msg.contains(method),
            "{method}: {e}"
        );
        assert!(e["data"]["suggestion"]
            .as_str()
            .is_some_and(|s| s.contains("object")));
    }
    // Still usable.
    assert_eq!(c.request("broker/ping", Value::Null)["result"], json!({}));
}
