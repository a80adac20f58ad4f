//! `abx mcp` with raw JSON lines: the handshake answers a version it speaks, the stateless
//! revision's envelope, unknown methods answered at once, stdout holding nothing but
//! protocol messages. (The MCP Python SDK drives the tools in tests/mcp/test_mcp.py.)

use abx_tests::{Home, READ_TIMEOUT};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Mcp {
    fn start(home: &Home) -> Mcp {
        let mut child = home
            .abx()
            .arg("mcp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn abx mcp");
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Mcp {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, v: &Value) {
        let s = self.stdin.as_mut().expect("stdin open");
        writeln!(s, "{v}").expect("write");
        s.flush().expect("flush");
    }

    fn recv(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(READ_TIMEOUT)
            .expect("abx mcp answered in time");
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"))
    }

    fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let m = self.recv();
            if m["id"] == json!(id) {
                return m;
            }
        }
    }

    /// Close stdin and expect a clean exit.
    fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                assert!(st.success(), "abx mcp exited with {st}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "abx mcp did not exit after stdin closed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn init(version: &str) -> Value {
    json!({"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}})
}

#[test]
fn initialize_answers_a_version_it_speaks() {
    let home = Home::new();
    for (asked, answered) in [
        ("2024-11-05", "2024-11-05"),
        ("2025-03-26", "2025-03-26"),
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        // The stateless revision has no initialize (rmcp asks it anyway): never echoed.
        ("2026-07-28", "2025-11-25"),
        ("1900-01-01", "2025-11-25"),
    ] {
        let mut m = Mcp::start(&home);
        let r = m.request(1, "initialize", init(asked));
        assert_eq!(
            r["result"]["protocolVersion"], answered,
            "asked {asked}: {r}"
        );
        assert_eq!(r["result"]["serverInfo"]["name"], "abx");
        assert_eq!(r["result"]["capabilities"]["tools"]["listChanged"], false);
        m.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        assert_eq!(m.request(2, "ping", json!({}))["result"], json!({}));
        let tools = m.request(3, "tools/list", json!({}));
        let tools = tools["result"]["tools"].as_array().expect("tools").clone();
        assert_eq!(tools.len(), 21);
        for t in &tools {
            assert_eq!(t["inputSchema"]["type"], "object");
            assert_eq!(t.get("outputSchema").is_some(), answered >= "2025-06-18");
        }
        m.finish();
    }
    // None of this needed the daemon.
    assert!(!home.socket().exists());
}

#[test]
fn unknown_methods_fail_at_once_and_the_stateless_revision_is_served() {
    let home = Home::new();
    let mut m = Mcp::start(&home);
    // Answered at once: the read below is bounded (a liveness bound, not a speed check).
    let r = m.request(1, "server/frobnicate", json!({}));
    assert_eq!(r["error"]["code"], -32601, "{r}");
    let meta = |v: &str| {
        json!({"_meta": {
            "io.modelcontextprotocol/protocolVersion": v,
            "io.modelcontextprotocol/clientCapabilities": {},
        }})
    };
    let d = m.request(2, "server/discover", meta("2026-07-28"));
    let d = &d["result"];
    assert_eq!(d["supportedVersions"][0], "2026-07-28", "{d}");
    assert_eq!(d["resultType"], "complete");
    assert_eq!(d["cacheScope"], "private");
    assert_eq!(d["ttlMs"], 0);
    assert_eq!(d["capabilities"]["tools"]["listChanged"], false);
    assert_eq!(
        d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "abx"
    );
    let t = m.request(3, "tools/list", meta("2026-07-28"));
    assert_eq!(t["result"]["resultType"], "complete");
    let e = m.request(4, "tools/list", meta("2099-01-01"));
    assert_eq!(e["error"]["code"], -32022, "{e}");
    assert_eq!(e["error"]["data"]["requested"], "2099-01-01");
    assert!(e["error"]["data"]["supported"]
        .as_array()
        .expect("supported")
        .contains(&json!("2026-07-28")));
    // Not JSON: a parse error, and the server goes on.
    m.send_raw(b"{oops\n");
    assert_eq!(m.recv()["error"]["code"], -32700);
    let r = m.request(
        5,
        "tools/call",
        json!({"name": "no_such_tool", "arguments": {}}),
    );
    assert_eq!(r["error"]["code"], -32602);
    m.finish();
}

impl Mcp {
    fn send_raw(&mut self, b: &[u8]) {
        let s = self.stdin.as_mut().expect("stdin open");
        s.write_all(b).expect("write");
        s.flush().expect("flush");
    }
}

/// Issue 21: the `exec` tool on a provider without `exec.stream` runs the command with
/// `exec/run` (the output comes at the end) instead of failing with E8004.
#[test]
fn exec_tool_falls_back_to_exec_run_without_exec_stream() {
    use abx_tests::fixtures::{install_without, plugin_sandbox};
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let _repo = install_without(&mut c, "py-local", "exec.stream");
    let (_, full) = plugin_sandbox(&mut c, "py-local");
    let mut m = Mcp::start(&home);
    let r = m.request(1, "initialize", init("2025-06-18"));
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18", "{r}");
    m.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let r = m.request(
        2,
        "tools/call",
        json!({"name": "exec", "arguments": {"sandbox": full, "command": "echo out; echo err >&2; exit 5"}}),
    );
    let res = &r["result"];
    assert_eq!(res["isError"], false, "{r}");
    let s = &res["structuredContent"];
    assert_eq!(
        (
            s["exitCode"].clone(),
            s["stdout"].clone(),
            s["stderr"].clone()
        ),
        (json!(5), json!("out\n"), json!("err\n")),
        "{r}"
    );
    assert_eq!(s["timedOut"], false, "{r}");
    let text = res["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("Exit code: 5"), "{text}");
    m.finish();
    c.call("sandbox/kill", json!({"sandbox": full}));
}

/// Issue 24: the `run_code` tool. State persists between calls, a result with an image is
/// MCP image content beside the text, an exception is `isError` with its traceback.
#[test]
fn run_code_tool_keeps_state_returns_images_and_errors() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let sb = c.create(json!({}));
    let mut m = Mcp::start(&home);
    let r = m.request(1, "initialize", init("2025-06-18"));
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18", "{r}");
    m.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let call = |m: &mut Mcp, id: i64, code: &str| {
        m.request(
            id,
            "tools/call",
            json!({"name": "run_code", "arguments": {"sandbox": sb, "code": code}}),
        )["result"]
            .clone()
    };
    let r = call(&mut m, 2, "x = 20\nprint('hi')\nx + 1");
    assert_eq!(r["isError"], false, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert_eq!(text, "--- stdout\nhi\n--- result\n21\n");
    assert_eq!(r["structuredContent"]["results"][0]["text/plain"], "21");
    let r = call(&mut m, 3, "x * 2");
    assert_eq!(
        r["structuredContent"]["results"][0]["text/plain"], "40",
        "{r}"
    );
    // An object with a PNG repr: an image content item (base64), and its text.
    let png = "class P:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\n'\n    def __repr__(self):\n        return 'P()'\nP()";
    let r = call(&mut m, 4, png);
    let content = r["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{r}");
    assert_eq!(content[1]["type"], "image");
    assert_eq!(content[1]["mimeType"], "image/png");
    assert_eq!(content[1]["data"], "iVBORw0KGgo=");
    assert!(content[0]["text"].as_str().unwrap().contains("P()"));
    // An exception: isError, the traceback in the text.
    let r = call(&mut m, 5, "def f():\n    raise ValueError('bad')\nf()");
    assert_eq!(r["isError"], true, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("--- error\nTraceback") && text.contains("ValueError: bad"),
        "{text}"
    );
    assert_eq!(r["structuredContent"]["error"]["name"], "ValueError");
    // A broker error (no such sandbox) is isError with the E-code line.
    let r = m.request(
        6,
        "tools/call",
        json!({"name": "run_code", "arguments": {"sandbox": "sb-nope", "code": "1"}}),
    )["result"]
        .clone();
    assert_eq!(r["isError"], true);
    assert!(r["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("[E2009]"));
    m.finish();
    c.call("sandbox/kill", json!({"sandbox": sb}));
}
