//! Tests of commands: exec/run, exec/start streams, stdin, pty, attach, cancellation,
//! timeouts and process trees, processes, two clients, unicode.

use super::client::{short, Client, Stream};
use super::{ensure, pass, Done, Outcome, Sb, T};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const EXIT_WAIT: Duration = Duration::from_secs(20);
/// How long to watch for notifications after exec/exit (there must be none).
const QUIET: Duration = Duration::from_millis(150);

fn b64(b: &[u8]) -> String {
    abx_protocol::b64::encode(b)
}

/// stdout of an exec/run result as bytes (base64 when `encoding` says so).
fn stdout_bytes(r: &Value) -> Vec<u8> {
    super::client::decode(&r["stdout"], &r["encoding"])
}

fn stdout_text(r: &Value) -> String {
    String::from_utf8_lossy(&stdout_bytes(r)).into_owned()
}

fn stderr_text(r: &Value) -> String {
    String::from_utf8_lossy(&super::client::decode(&r["stderr"], &r["encoding"])).into_owned()
}

/// exec/start; returns the exec id, the reply's sequence number, the reply and its stream.
async fn start(
    c: &Client,
    sb: &Sb,
    mut params: Value,
) -> Result<(String, u64, Value, Stream), String> {
    params["sandbox"] = json!(sb.id);
    let (seq, r) = c.call_seq("exec/start", params).await;
    let r = r.map_err(|e| format!("exec/start failed: {e}"))?;
    let id = r["execId"]
        .as_str()
        .ok_or_else(|| format!("exec/start answered no execId: {}", short(&r.to_string())))?
        .to_owned();
    let stream = c.stream(&id);
    Ok((id, seq, r, stream))
}

fn single_exit(out: &super::client::Output) -> Result<(), String> {
    ensure!(
        out.exits == 1,
        "{} exec/exit notifications arrived for one exec, expected exactly one",
        out.exits
    );
    ensure!(
        out.after_exit == 0,
        "{} exec/output notifications arrived after exec/exit",
        out.after_exit
    );
    Ok(())
}

/// Wait until `pid` is no longer a process of the sandbox.
async fn wait_gone(t: &T, c: &Client, sb: &Sb, pid: i64, what: &str) -> Result<(), String> {
    if t.has("process.manage") {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let l = c.ok("process/list", json!({"sandbox": sb.id})).await?;
            let alive = l["processes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["pid"].as_i64() == Some(pid))
                .cloned();
            match alive {
                None => return Ok(()),
                Some(p) if Instant::now() > deadline => {
                    return Err(format!(
                        "{what}: process {pid} ({}) is still there 3 s later",
                        p["command"].as_str().unwrap_or("?")
                    ))
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    } else {
        let script = format!(
            "i=0; while kill -0 {pid} 2>/dev/null; do i=$((i+1)); \
             if [ $i -ge 150 ]; then echo alive; exit 0; fi; sleep 0.02; done; echo gone"
        );
        let r = c
            .ok("exec/run", json!({"sandbox": sb.id, "command": script}))
            .await?;
        ensure!(
            stdout_text(&r).trim() == "gone",
            "{what}: process {pid} is still alive 3 s later"
        );
        Ok(())
    }
}

pub async fn exec_run(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let r = c
        .ok(
            "exec/run",
            json!({"sandbox": sb.id, "command": "echo hello"}),
        )
        .await?;
    ensure!(
        r["exitCode"] == 0,
        "exec/run 'echo hello' answered exitCode {}",
        r["exitCode"]
    );
    ensure!(
        stdout_text(&r) == "hello\n",
        "exec/run 'echo hello' answered stdout {:?}",
        stdout_text(&r)
    );
    ensure!(
        stderr_text(&r).is_empty(),
        "exec/run 'echo hello' answered stderr {:?}",
        stderr_text(&r)
    );
    ensure!(
        r["timedOut"] == false,
        "exec/run 'echo hello' answered timedOut {}",
        r["timedOut"]
    );
    ensure!(
        r["durationMs"].is_number(),
        "exec/run answered no durationMs: {}",
        short(&r.to_string())
    );
    let r = c
        .ok(
            "exec/run",
            json!({"sandbox": sb.id, "argv": ["printf", "%s-%s", "a b", "c"]}),
        )
        .await?;
    ensure!(
        stdout_text(&r) == "a b-c",
        "exec/run with argv [printf, %s-%s, 'a b', c] answered stdout {:?}: arguments must be passed as they are",
        stdout_text(&r)
    );
    let r = c
        .ok(
            "exec/run",
            json!({"sandbox": sb.id, "command": "printf '\\377\\000x'"}),
        )
        .await?;
    ensure!(
        r["encoding"] == "base64",
        "exec/run printing bytes that are not UTF-8 must answer encoding \"base64\"; answered {}",
        r["encoding"]
    );
    ensure!(
        stdout_bytes(&r) == [0xff, 0, b'x'],
        "exec/run printing ff 00 78 answered {:?}",
        stdout_bytes(&r)
    );
    pass()
}

pub async fn exit_code_stderr_and_env(t: &T) -> Outcome {
    let c = t.client();
    let sb = t
        .create(json!({"env": {"KIT_SANDBOX_VAR": "from-create"}}))
        .await?;
    let r = c
        .ok(
            "exec/run",
            json!({
                "sandbox": sb.id,
                "command": "echo out; echo \"$KIT_SANDBOX_VAR $KIT_CALL_VAR\" >&2; exit 3",
                "env": {"KIT_CALL_VAR": "from-call"},
            }),
        )
        .await?;
    ensure!(
        r["exitCode"] == 3,
        "exec/run of 'exit 3' answered exitCode {}, expected 3",
        r["exitCode"]
    );
    ensure!(
        stdout_text(&r) == "out\n",
        "exec/run answered stdout {:?}, expected \"out\\n\"",
        stdout_text(&r)
    );
    ensure!(
        stderr_text(&r) == "from-create from-call\n",
        "stderr was {:?}, expected \"from-create from-call\\n\" (the sandbox's env from create plus the call's env)",
        stderr_text(&r)
    );
    let r = c
        .ok(
            "exec/run",
            json!({"sandbox": sb.id, "command": "kill -TERM $$"}),
        )
        .await?;
    ensure!(
        r["exitCode"] == 143,
        "a command killed by SIGTERM answered exitCode {}, expected 143 (128 + 15)",
        r["exitCode"]
    );
    ensure!(
        r.get("signal")
            .is_none_or(|s| s == "SIGTERM" || s.is_null()),
        "a command killed by SIGTERM answered signal {}",
        r["signal"]
    );
    c.expect_code(
        "exec/run",
        json!({"sandbox": sb.id, "argv": ["/no/such/kit-program"]}),
        &["E3003"],
        "exec/run of a missing program",
    )
    .await?;
    pass()
}

pub async fn stream_order_and_single_exit(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let n = 300;
    let cmd = format!(
        "i=1; while [ $i -le {n} ]; do echo line$i; i=$((i+1)); done; echo err >&2; exit 5"
    );
    let (_, seq, _, mut s) = start(&c, &sb, json!({"command": cmd})).await?;
    let out = s.finish(EXIT_WAIT, QUIET).await?;
    if let Some(first) = out.first_seq {
        ensure!(
            first > seq,
            "a notification of the exec arrived before the reply to exec/start"
        );
    }
    let want: String = (1..=n).map(|i| format!("line{i}\n")).collect();
    if out.out() != want {
        let got = out.out().lines().count();
        let first_diff = out
            .out()
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .map_or(String::new(), |i| {
                format!(", first difference at line {}", i + 1)
            });
        return Err(format!(
            "stdout has {got} of {n} lines in order{first_diff} (exec/exit came with exitCode {:?}; output after exec/exit is lost)",
            out.code()
        ));
    }
    ensure!(
        out.err() == "err\n",
        "stderr was {:?}, expected \"err\\n\"",
        out.err()
    );
    single_exit(&out)?;
    ensure!(
        out.code() == Some(5),
        "exec/exit said exitCode {:?}, expected 5",
        out.exit.as_ref().map(|e| e["exitCode"].clone())
    );
    ensure!(
        out.exit.as_ref().is_some_and(|e| e["timedOut"] == false),
        "exec/exit said timedOut {:?}",
        out.exit.as_ref().map(|e| e["timedOut"].clone())
    );
    pass()
}

pub async fn timeout_is_enforced(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let cmd = "echo before; sleep 30";
    let run = async {
        let t0 = Instant::now();
        let r = c
            .ok(
                "exec/run",
                json!({"sandbox": sb.id, "command": cmd, "timeout": 1}),
            )
            .await?;
        ensure!(
            r["timedOut"] == true,
            "exec/run with timeout 1 of 'sleep 30' answered timedOut {}",
            r["timedOut"]
        );
        ensure!(
            stdout_text(&r) == "before\n",
            "exec/run that timed out answered stdout {:?}, expected what it printed before",
            stdout_text(&r)
        );
        let took = t0.elapsed();
        ensure!(
            took < Duration::from_secs(10),
            "exec/run with timeout 1 took {:.1} s",
            took.as_secs_f64()
        );
        Ok::<(), String>(())
    };
    let stream = async {
        if !t.has("exec.stream") {
            return Ok(());
        }
        let (_, _, _, mut s) = start(&c, &sb, json!({"command": cmd, "timeout": 1})).await?;
        let out = s.finish(EXIT_WAIT, QUIET).await?;
        single_exit(&out)?;
        let exit = out.exit.clone().unwrap_or_default();
        ensure!(
            exit["timedOut"] == true,
            "exec/start with timeout 1 of 'sleep 30' ended with {exit}, expected timedOut: true"
        );
        ensure!(
            out.out() == "before\n",
            "exec/start that timed out sent stdout {:?}",
            out.out()
        );
        Ok(())
    };
    let (a, b) = tokio::join!(run, stream);
    a?;
    b?;
    pass()
}

pub async fn process_list(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let mut stream = None;
    if t.has("exec.stream") {
        let (_, _, _, s) = start(&c, &sb, json!({"argv": ["sleep", "31"]})).await?;
        stream = Some(s);
    } else if t.has("exec.run") {
        c.ok(
            "exec/run",
            json!({"sandbox": sb.id, "command": "sleep 31 >/dev/null 2>&1 &"}),
        )
        .await?;
    } else {
        let l = c.ok("process/list", json!({"sandbox": sb.id})).await?;
        ensure!(l["processes"].is_array(), "process/list answered {l}");
        return Ok(Done::Passed(Some(
            "no way to start a process: only the list's shape was checked".into(),
        )));
    }
    // The process shows up (give a remote backend a moment).
    let deadline = Instant::now() + Duration::from_secs(5);
    let proc_ = loop {
        let l = c.ok("process/list", json!({"sandbox": sb.id})).await?;
        let procs = l["processes"]
            .as_array()
            .ok_or_else(|| format!("process/list answered {}", short(&l.to_string())))?;
        for p in procs {
            ensure!(
                p["pid"].is_i64() && p["command"].is_string(),
                "process/list entries need an integer pid and a command: {p}"
            );
        }
        if let Some(p) = procs.iter().find(|p| {
            p["command"]
                .as_str()
                .is_some_and(|c| c.contains("sleep 31"))
        }) {
            break p.clone();
        }
        ensure!(
            Instant::now() < deadline,
            "process/list does not show the running 'sleep 31': {}",
            short(&l.to_string())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let pid = proc_["pid"].as_i64().unwrap_or_default();
    c.ok("process/kill", json!({"sandbox": sb.id, "pid": pid}))
        .await?;
    if let Some(mut s) = stream {
        let out = s.finish(EXIT_WAIT, Duration::ZERO).await?;
        ensure!(
            out.code() == Some(137),
            "the exec whose process was killed (KILL) ended with {:?}, expected exitCode 137",
            out.exit
        );
    }
    wait_gone(t, &c, &sb, pid, "after process/kill").await?;
    c.expect_code(
        "process/kill",
        json!({"sandbox": sb.id, "pid": 99_999_999}),
        &["E3006"],
        "process/kill of a pid that is not the sandbox's",
    )
    .await?;
    pass()
}

pub async fn stdin_and_eof(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let (id, _, _, mut s) = start(&c, &sb, json!({"command": "cat; echo done"})).await?;
    c.ok("exec/write", json!({"execId": id, "data": "abc\n"}))
        .await?;
    c.ok(
        "exec/write",
        json!({"execId": id, "data": b64("déf\n".as_bytes()), "encoding": "base64"}),
    )
    .await?;
    c.ok("exec/write", json!({"execId": id, "data": "", "eof": true}))
        .await?;
    let out = s.finish(EXIT_WAIT, QUIET).await?;
    single_exit(&out)?;
    ensure!(
        out.out() == "abc\ndéf\ndone\n",
        "stdout of 'cat; echo done' fed abc, déf (base64) and eof was {:?}",
        out.out()
    );
    ensure!(
        out.code() == Some(0),
        "exec/exit said {:?}, expected exitCode 0",
        out.exit
    );
    c.expect_code(
        "exec/write",
        json!({"execId": id, "data": "late\n"}),
        &["E3005", "E3002"],
        "exec/write after the exit",
    )
    .await?;
    if t.has("exec.run") {
        let r = c
            .ok(
                "exec/run",
                json!({"sandbox": sb.id, "command": "cat", "stdin": "piped\n"}),
            )
            .await?;
        ensure!(
            stdout_text(&r) == "piped\n",
            "exec/run 'cat' with stdin \"piped\\n\" answered {:?}",
            stdout_text(&r)
        );
        let bytes = [0u8, 1, 2, 255];
        let r = c
            .ok(
                "exec/run",
                json!({
                    "sandbox": sb.id, "command": "cat",
                    "stdin": b64(&bytes), "stdinEncoding": "base64",
                }),
            )
            .await?;
        ensure!(
            stdout_bytes(&r) == bytes,
            "exec/run 'cat' with base64 stdin 00 01 02 ff answered {:?}",
            stdout_bytes(&r)
        );
        let r = c
            .ok(
                "exec/run",
                json!({"sandbox": sb.id, "command": "cat; echo end", "timeout": 10}),
            )
            .await?;
        ensure!(
            r["timedOut"] == false && stdout_text(&r) == "end\n",
            "exec/run without stdin must give the command an empty stdin; 'cat' answered {}",
            short(&r.to_string())
        );
    }
    pass()
}

pub async fn pty_and_resize(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let cmd = "stty size; test -t 0 && echo is-a-tty; read line; stty size; exit 0";
    let (id, _, _, mut s) = start(
        &c,
        &sb,
        json!({"command": cmd, "pty": {"cols": 80, "rows": 24}}),
    )
    .await?;
    let mut out = super::client::Output::default();
    s.read_until(
        &mut out,
        EXIT_WAIT,
        "'24 80' and 'is-a-tty' on the pty",
        |o| {
            let t = o.tty();
            t.contains("24 80") && t.contains("is-a-tty")
        },
    )
    .await?;
    c.ok(
        "exec/resize",
        json!({"execId": id, "cols": 100, "rows": 30}),
    )
    .await?;
    c.ok("exec/write", json!({"execId": id, "data": "\n"}))
        .await?;
    s.finish_into(&mut out, EXIT_WAIT, QUIET).await?;
    single_exit(&out)?;
    ensure!(
        out.tty().contains("30 100"),
        "after exec/resize to 100x30, 'stty size' printed {:?}",
        short(&out.tty())
    );
    ensure!(
        out.streams.iter().all(|s| s == "pty"),
        "a pty exec must send its output as stream \"pty\"; got {:?}",
        out.streams
    );
    ensure!(
        out.code() == Some(0),
        "exec/exit said {:?}, expected exitCode 0",
        out.exit
    );
    pass()
}

pub async fn attach_after_reconnect(t: &T) -> Outcome {
    let a = t.client();
    let sb = t.create(json!({})).await?;
    let cmd = "echo first; read line; echo \"got:$line\"; exit 4";
    let (id, _, _, mut s) = start(&a, &sb, json!({"command": cmd})).await?;
    let mut before = super::client::Output::default();
    s.read_until(&mut before, EXIT_WAIT, "'first' on connection A", |o| {
        o.out().contains("first\n")
    })
    .await?;
    drop(s);
    drop(a);
    let b = t.client();
    let mut s = b.stream(&id);
    let r = b.ok("exec/attach", json!({"execId": id})).await?;
    ensure!(
        r["execId"] == id.as_str(),
        "exec/attach answered execId {}",
        r["execId"]
    );
    ensure!(
        r["running"] == true,
        "exec/attach of a running exec answered running {}",
        r["running"]
    );
    b.ok(
        "exec/write",
        json!({"execId": id, "data": "hello\n", "eof": true}),
    )
    .await?;
    let out = s.finish(EXIT_WAIT, QUIET).await?;
    single_exit(&out)?;
    ensure!(
        out.out().contains("got:hello\n"),
        "after exec/attach on a new connection, stdout was {:?}, expected \"got:hello\"",
        out.out()
    );
    ensure!(
        out.code() == Some(4),
        "exec/exit on the new connection said {:?}, expected exitCode 4",
        out.exit
    );
    pass()
}

/// Wait until a command has written its pid to `file` (in /workspace); returns it.
async fn pid_from_file(c: &Client, sb: &Sb, file: &str, what: &str) -> Result<i64, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c
            .ok(
                "exec/run",
                json!({"sandbox": sb.id, "command": format!("cat {file} 2>/dev/null")}),
            )
            .await?;
        if let Ok(pid) = stdout_text(&r).trim().parse::<i64>() {
            return Ok(pid);
        }
        ensure!(
            Instant::now() < deadline,
            "{what} did not start within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn cancellation(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let cmd = "echo $$ > kit-cancel.pid; exec sleep 37";
    let (id, rx) = c
        .send("exec/run", json!({"sandbox": sb.id, "command": cmd}))
        .await;
    // Cancel once the command surely runs.
    let pid = pid_from_file(&c, &sb, "kit-cancel.pid", "the command to cancel").await?;
    c.cancel(id).await;
    let v = match tokio::time::timeout(Duration::from_secs(5), rx).await {
        Err(_) => return Err("exec/run was not answered within 5 s of $/cancelRequest".into()),
        Ok(Err(_)) => {
            return Err("the connection closed instead of answering the cancelled exec/run".into())
        }
        Ok(Ok((_, v))) => v,
    };
    ensure!(
        v["error"]["code"] == -32800,
        "the cancelled exec/run answered {}, expected error -32800",
        short(&v.to_string())
    );
    ensure!(
        v["error"]["data"]["abx"] == "E1006",
        "the cancellation error has data.abx {}",
        v["error"]["data"]["abx"]
    );
    wait_gone(
        t,
        &c,
        &sb,
        pid,
        "after $/cancelRequest, the cancelled command",
    )
    .await?;
    pass()
}

pub async fn concurrent_calls_from_two_clients(t: &T) -> Outcome {
    let a = Arc::new(t.client());
    let b = t.client();
    let sb = t.create(json!({})).await?;
    // Client A's call runs until client B says go: B's calls can only complete while it is
    // in flight if calls are served concurrently.
    let a2 = a.clone();
    let sid = sb.id.clone();
    let blocked = tokio::spawn(async move {
        let cmd =
            "i=0; while [ ! -e kit-go ] && [ $i -lt 1000 ]; do i=$((i+1)); sleep 0.02; done; \
                   echo released";
        a2.call(
            "exec/run",
            json!({"sandbox": sid, "command": cmd, "timeout": 25}),
        )
        .await
    });
    let quick = |c, tag| quick_calls(c, &sb, tag, 8);
    let both = async {
        tokio::join!(
            quick(&a, "A"),
            quick(&b, "B"),
            b.call("sandbox/info", json!({"sandbox": sb.id}))
        )
    };
    let (ra, rb, info) = match tokio::time::timeout(Duration::from_secs(15), both).await {
        Ok(r) => r,
        Err(_) => {
            return Err("16 quick calls of two clients did not complete within 15 s while one call was running: calls seem serialized".into())
        }
    };
    info.map_err(|e| format!("sandbox/info during concurrent calls failed: {e}"))?;
    for (tag, rs) in [("A", ra), ("B", rb)] {
        for (i, r) in rs {
            let r = r.map_err(|e| format!("client {tag}'s exec/run #{i} failed: {e}"))?;
            ensure!(
                stdout_text(&r) == format!("{tag}{i}\n"),
                "client {tag}'s exec/run #{i} got {:?}: replies crossed",
                stdout_text(&r)
            );
        }
    }
    ensure!(
        !blocked.is_finished(),
        "client A's waiting command finished before client B released it"
    );
    b.ok(
        "exec/run",
        json!({"sandbox": sb.id, "command": "touch kit-go"}),
    )
    .await?;
    let r = blocked
        .await
        .map_err(|e| format!("the waiting call panicked: {e}"))?
        .map_err(|e| format!("client A's waiting exec/run failed: {e}"))?;
    ensure!(
        stdout_text(&r) == "released\n",
        "client A's waiting exec/run answered {}",
        short(&r.to_string())
    );
    pass()
}

async fn quick_calls(
    c: &Client,
    sb: &Sb,
    tag: &'static str,
    n: usize,
) -> Vec<(usize, Result<Value, super::client::RpcErr>)> {
    let calls = (0..n).map(|i| async move {
        let cmd = format!("echo {tag}{i}");
        (
            i,
            c.call("exec/run", json!({"sandbox": sb.id, "command": cmd}))
                .await,
        )
    });
    futures::future::join_all(calls).await
}

pub async fn unicode_everywhere(t: &T) -> Outcome {
    let c = t.client();
    let env_val = "ünïcødé ✓ 你好";
    let sb = t
        .create(json!({"env": {"KIT_UNI": env_val}, "metadata": {"note": "日本語 ✓"}}))
        .await?;
    ensure!(
        sb.info["metadata"]["note"] == "日本語 ✓",
        "sandbox/create returned metadata {} for {{\"note\": \"日本語 ✓\"}}",
        sb.info["metadata"]
    );
    let r = c
        .ok(
            "exec/run",
            json!({"sandbox": sb.id, "argv": ["printf", "%s|%s", "ärg 1", "🌍"]}),
        )
        .await?;
    ensure!(
        stdout_text(&r) == "ärg 1|🌍",
        "unicode argv came back as {:?}",
        stdout_text(&r)
    );
    let r = c
        .ok(
            "exec/run",
            json!({
                "sandbox": sb.id,
                "command": "printf '%s|%s' \"$KIT_UNI\" \"$KIT_U2\"",
                "env": {"KIT_U2": "ключ 🔑"},
            }),
        )
        .await?;
    ensure!(
        stdout_text(&r) == format!("{env_val}|ключ 🔑"),
        "unicode environment came back as {:?}",
        stdout_text(&r)
    );
    if t.has("files.rw") {
        let dir = "/workspace/dïr-ü";
        let name = "文件 🌍.txt";
        let path = format!("{dir}/{name}");
        let content = "héllo 世界 🌍\n";
        c.ok("files/mkdir", json!({"sandbox": sb.id, "path": dir}))
            .await?;
        let w = c
            .ok(
                "files/write",
                json!({"sandbox": sb.id, "path": path, "data": content}),
            )
            .await?;
        ensure!(
            w["size"] == content.len(),
            "files/write of {} bytes of UTF-8 answered size {}",
            content.len(),
            w["size"]
        );
        let l = c
            .ok("files/list", json!({"sandbox": sb.id, "path": dir}))
            .await?;
        let entry = l["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .cloned();
        ensure!(
            entry.is_some(),
            "files/list of {dir} does not show {name:?}: {}",
            short(&l.to_string())
        );
        ensure!(
            entry.as_ref().is_some_and(|e| e["path"] == path.as_str()),
            "files/list shows path {} for {name:?}, expected {path:?}",
            entry.unwrap_or_default()["path"]
        );
        let rd = c
            .ok("files/read", json!({"sandbox": sb.id, "path": path}))
            .await?;
        ensure!(
            rd["data"] == content,
            "files/read of a unicode file name answered {}",
            rd["data"]
        );
        let r = c
            .ok(
                "exec/run",
                json!({"sandbox": sb.id, "command": format!("cat 'dïr-ü/{name}'")}),
            )
            .await?;
        ensure!(
            stdout_text(&r) == content,
            "a command reading the unicode file got {:?}",
            stdout_text(&r)
        );
        let r = c
            .ok(
                "exec/run",
                json!({"sandbox": sb.id, "command": "ls", "cwd": dir}),
            )
            .await?;
        ensure!(
            stdout_text(&r).lines().any(|l| l == name),
            "'ls' with cwd {dir:?} answered {:?}",
            stdout_text(&r)
        );
    }
    pass()
}

pub async fn timeout_kills_children(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    // The grandchild: sh -> sh -> sleep (the trailing `true` keeps the outer shell).
    let run = async {
        let r = c
            .ok(
                "exec/run",
                json!({
                    "sandbox": sb.id,
                    "command": "sh -c 'sleep 61 & echo $!; wait'; true",
                    "timeout": 1,
                }),
            )
            .await?;
        ensure!(
            r["timedOut"] == true,
            "exec/run with timeout 1 answered timedOut {}",
            r["timedOut"]
        );
        let pid: i64 = stdout_text(&r)
            .trim()
            .parse()
            .map_err(|_| format!("the command printed {:?}, expected a pid", stdout_text(&r)))?;
        wait_gone(
            t,
            &c,
            &sb,
            pid,
            "after the timeout of exec/run, its grandchild",
        )
        .await
    };
    let kill = async {
        if !t.has("exec.stream") {
            return Ok(());
        }
        let (id, _, _, mut s) = start(
            &c,
            &sb,
            json!({"command": "sh -c 'sleep 62 & echo $!; wait'; true"}),
        )
        .await?;
        let mut out = super::client::Output::default();
        s.read_until(&mut out, EXIT_WAIT, "the grandchild's pid", |o| {
            o.out().contains('\n')
        })
        .await?;
        let pid: i64 = out
            .out()
            .trim()
            .parse()
            .map_err(|_| format!("the command printed {:?}, expected a pid", out.out()))?;
        c.ok("exec/kill", json!({"execId": id, "signal": "TERM"}))
            .await?;
        s.finish_into(&mut out, EXIT_WAIT, QUIET).await?;
        single_exit(&out)?;
        let exit = out.exit.clone().unwrap_or_default();
        ensure!(
            exit["exitCode"] == 143 || exit["signal"] == "SIGTERM",
            "exec/kill with TERM ended the exec with {exit}, expected exitCode 143"
        );
        wait_gone(t, &c, &sb, pid, "after exec/kill, the exec's grandchild").await
    };
    let (a, b) = tokio::join!(run, kill);
    a?;
    b?;
    pass()
}
