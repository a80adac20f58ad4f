//! Issue 24, the code interpreter (`code.interpret`) on `local`: `code/run` and the context
//! methods against the real daemon, real sandboxes and real interpreters (python3, node,
//! bash; matplotlib and pandas from a virtualenv the test finds, see [`rich_python`]).

use abx_tests::{abx_code, wait_until, Client, Home};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Generous: a liveness bound, never a speed assertion.
const DEADLINE: Duration = Duration::from_secs(90);

fn setup() -> (Home, Client, String) {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let id = c.create(json!({"timeout": 900}));
    (home, c, id)
}

fn run(c: &mut Client, sb: &str, code: &str) -> Value {
    c.call("code/run", json!({"sandbox": sb, "code": code}))
}

fn plain(r: &Value, i: usize) -> &str {
    r["results"][i]["text/plain"].as_str().unwrap_or_default()
}

/// Read messages until the response to `id`; returns (notifications before it, response).
fn until_response(c: &mut Client, id: i64) -> (Vec<Value>, Value) {
    let until = Instant::now() + DEADLINE;
    let mut notes = Vec::new();
    loop {
        assert!(Instant::now() < until, "no response to {id} in time");
        let Some(v) = c.try_recv(Duration::from_secs(5)) else {
            continue;
        };
        if v["id"] == id {
            return (notes, v);
        }
        if v["method"] == "code/output" {
            notes.push(v["params"].clone());
        }
    }
}

/// Wait for a `code/output` of `run_id` whose text contains `what`.
fn wait_output(c: &mut Client, run_id: &str, what: &str) {
    let until = Instant::now() + DEADLINE;
    loop {
        assert!(Instant::now() < until, "no output {what:?} of {run_id}");
        let Some(v) = c.try_recv(Duration::from_secs(5)) else {
            continue;
        };
        if v["method"] == "code/output"
            && v["params"]["runId"] == run_id
            && v["params"]["text"]
                .as_str()
                .is_some_and(|t| t.contains(what))
        {
            return;
        }
    }
}

#[test]
fn python_state_persists_and_the_last_expression_is_a_result() {
    let (_h, mut c, sb) = setup();
    let r = run(
        &mut c,
        &sb,
        "import os\nx = 20\ny = x + 1\nos.chdir('/tmp')\nprint('hi')\ny * 2",
    );
    assert_eq!(r["stdout"], "hi\n");
    assert_eq!(plain(&r, 0), "42");
    assert!(r["error"].is_null(), "{r}");
    assert_eq!(r["executionCount"], 1);
    assert_eq!(r["context"], "default-python");
    let r = run(&mut c, &sb, "(x, y, os.getcwd())");
    assert_eq!(
        plain(&r, 0),
        "(20, 21, '/tmp')",
        "variables, imports and cwd persist"
    );
    assert_eq!(r["executionCount"], 2);
    // A statement last: no result; None: no result.
    let r = run(&mut c, &sb, "z = 1");
    assert_eq!(r["results"], json!([]));
    let r = run(&mut c, &sb, "None");
    assert_eq!(r["results"], json!([]));
    // `env` is set in the interpreter for the cell (and stays).
    let r = c.call(
        "code/run",
        json!({"sandbox": sb, "code": "import os; os.environ['GREETING']", "env": {"GREETING": "hej"}}),
    );
    assert_eq!(plain(&r, 0), "'hej'");
    assert_eq!(
        plain(&run(&mut c, &sb, "os.environ.get('GREETING')"), 0),
        "'hej'"
    );
    // The default context is listed.
    let l = c.call("code/listContexts", json!({"sandbox": sb}));
    let ctx = &l["contexts"][0];
    assert_eq!(ctx["id"], "default-python");
    assert_eq!(ctx["language"], "python");
    assert_eq!(ctx["default"], true);
    assert_eq!(ctx["running"], true);
    assert_eq!(ctx["executionCount"], 6);
}

#[test]
fn two_contexts_are_isolated() {
    let (_h, mut c, sb) = setup();
    let a = c.call(
        "code/createContext",
        json!({"sandbox": sb, "language": "python"}),
    );
    let b = c.call(
        "code/createContext",
        json!({"sandbox": sb, "language": "python", "cwd": "/tmp", "interpreter": "/usr/bin/python3"}),
    );
    let (a, b) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
    assert_ne!(a, b);
    c.call(
        "code/run",
        json!({"sandbox": sb, "context": a, "code": "v = 'a'"}),
    );
    c.call(
        "code/run",
        json!({"sandbox": sb, "context": b, "code": "v = 'b'"}),
    );
    let ra = c.call(
        "code/run",
        json!({"sandbox": sb, "context": a, "code": "import os; (v, os.getcwd())"}),
    );
    let rb = c.call(
        "code/run",
        json!({"sandbox": sb, "context": b, "code": "import os; (v, os.getcwd())"}),
    );
    assert_eq!(plain(&ra, 0), "('a', '/workspace')");
    assert_eq!(plain(&rb, 0), "('b', '/tmp')");
    // The default context sees neither.
    let r = run(&mut c, &sb, "v");
    assert_eq!(r["error"]["name"], "NameError");
    // Removing one leaves the other.
    c.call("code/removeContext", json!({"sandbox": sb, "context": a}));
    let e = c.call_err(
        "code/run",
        json!({"sandbox": sb, "context": a, "code": "1"}),
    );
    assert_eq!(abx_code(&e), "E1004");
    let rb = c.call(
        "code/run",
        json!({"sandbox": sb, "context": b, "code": "v"}),
    );
    assert_eq!(plain(&rb, 0), "'b'");
    let ids: Vec<Value> = c.call("code/listContexts", json!({"sandbox": sb}))["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].clone())
        .collect();
    assert!(
        ids.contains(&json!(b)) && !ids.contains(&json!(a)),
        "{ids:?}"
    );
    // A context of another language is refused for a mismatched run.
    let e = c.call_err(
        "code/run",
        json!({"sandbox": sb, "context": b, "language": "bash", "code": "true"}),
    );
    assert_eq!(abx_code(&e), "E1004");
}

#[test]
fn python_error_has_name_value_and_traceback() {
    let (_h, mut c, sb) = setup();
    let r = run(
        &mut c,
        &sb,
        "print('before')\ndef f(d):\n    return d['k']\nf({})",
    );
    assert_eq!(r["stdout"], "before\n", "output before the error is kept");
    let e = &r["error"];
    assert_eq!(e["name"], "KeyError");
    assert_eq!(e["value"], "'k'");
    let tb = e["traceback"].as_str().unwrap();
    assert!(tb.starts_with("Traceback (most recent call last):"), "{tb}");
    assert!(
        tb.contains("line 3, in f") && tb.contains("return d['k']"),
        "{tb}"
    );
    assert!(
        !tb.contains("<string>"),
        "the driver's frames are left out: {tb}"
    );
    let r = run(&mut c, &sb, "def (:");
    assert_eq!(r["error"]["name"], "SyntaxError");
    // The context carries on.
    assert_eq!(plain(&run(&mut c, &sb, "1+1"), 0), "2");
}

#[test]
fn stdout_and_stderr_stream_in_order_before_the_reply() {
    let (_h, mut c, sb) = setup();
    let code = "import sys\nfor i in range(3):\n    print('out', i)\n    print('err', i, file=sys.stderr)\n'end'";
    c.send(
        &json!({"jsonrpc": "2.0", "id": 77, "method": "code/run",
                "params": {"sandbox": sb, "code": code, "runId": "r1"}})
        .to_string(),
    );
    let (notes, resp) = until_response(&mut c, 77);
    let r = &resp["result"];
    assert_eq!(r["stdout"], "out 0\nout 1\nout 2\n");
    assert_eq!(r["stderr"], "err 0\nerr 1\nerr 2\n");
    let seq: Vec<String> = notes
        .iter()
        .map(|n| {
            assert_eq!(n["runId"], "r1");
            assert_eq!(n["sandbox"], sb.as_str());
            assert_eq!(n["context"], "default-python");
            match n["type"].as_str().unwrap() {
                "result" => format!("result {}", n["result"]["text/plain"].as_str().unwrap()),
                t => format!("{t} {}", n["text"].as_str().unwrap()),
            }
        })
        .collect();
    assert_eq!(
        seq,
        [
            "stdout out 0\n",
            "stderr err 0\n",
            "stdout out 1\n",
            "stderr err 1\n",
            "stdout out 2\n",
            "stderr err 2\n",
            "result 'end'"
        ]
    );
    // Bytes through sys.stdout.buffer, and output of a child process (its own fds).
    let r = run(
        &mut c,
        &sb,
        "import sys\nsys.stdout.buffer.write(b'raw\\n'); sys.stdout.flush()",
    );
    assert_eq!(r["stdout"], "raw\n");
    // Output of a child process (its own fds) is caught too.
    let r = run(
        &mut c,
        &sb,
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo child; echo cerr >&2'])\nNone",
    );
    assert_eq!(r["stdout"], "child\n");
    assert_eq!(r["stderr"], "cerr\n");
}

#[test]
fn rich_results_repr_methods_and_display() {
    let (_h, mut c, sb) = setup();
    let code = r#"
class Rich:
    def _repr_html_(self): return '<b>rich</b>'
    def _repr_markdown_(self): return '**rich**'
    def _repr_json_(self): return {'a': [1, 2]}
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"/>'
    def _repr_png_(self): return b'\x89PNG\r\n'
    def __repr__(self): return 'Rich()'
class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {'text/plain': 'B', 'text/latex': '$b$'}
display(Bundle())
Rich()
"#;
    let r = run(&mut c, &sb, code);
    assert_eq!(r["results"][0]["text/plain"], "B");
    assert_eq!(r["results"][0]["text/latex"], "$b$");
    let b = &r["results"][1];
    assert_eq!(b["text/plain"], "Rich()");
    assert_eq!(b["text/html"], "<b>rich</b>");
    assert_eq!(b["text/markdown"], "**rich**");
    assert_eq!(b["application/json"], json!({"a": [1, 2]}));
    assert_eq!(
        b["image/svg+xml"],
        "<svg xmlns=\"http://www.w3.org/2000/svg\"/>"
    );
    assert_eq!(b["image/png"], "iVBORw0K", "bytes come base64");
}

/// The site-packages of a virtualenv with matplotlib and pandas that the sandbox's own
/// `python3` (the host's /usr/bin/python3: a local sandbox sees /usr, not the venv) can
/// import: `ABX_TEST_PYTHON`'s, else the venv scripts/test makes (`target/pyvenv`, where it
/// installs both), else `target/codevenv`. `None` when there is none.
fn rich_site_packages() -> Option<PathBuf> {
    let target = abx_tests::bin_dir().parent()?.to_path_buf();
    let candidates = std::env::var_os("ABX_TEST_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            target.join("pyvenv/bin/python3"),
            target.join("codevenv/bin/python3"),
        ]);
    for py in candidates {
        let Ok(o) = std::process::Command::new(&py)
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ])
            .output()
        else {
            continue;
        };
        let site = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        let ok = std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import matplotlib, pandas"])
            .env("PYTHONPATH", &site)
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Some(site);
        }
    }
    None
}

#[test]
fn matplotlib_figure_is_a_png_and_a_dataframe_is_html() {
    let Some(site) = rich_site_packages() else {
        // scripts/test installs both into target/pyvenv; only a machine without PyPI lacks them.
        eprintln!("SKIPPED: no virtualenv with matplotlib and pandas for /usr/bin/python3 (run scripts/test, or set ABX_TEST_PYTHON)");
        return;
    };
    let (home, mut c, sb) = setup();
    // The packages go into the sandbox's /workspace (what a user would pip install there).
    let ws = home
        .path
        .join(format!("data/local/sandboxes/{sb}/workspace/.site"));
    let cp = std::process::Command::new("cp")
        .args(["-r", "--reflink=auto"])
        .arg(&site)
        .arg(&ws)
        .status()
        .unwrap();
    assert!(cp.success());
    let ctx = c.call(
        "code/createContext",
        json!({"sandbox": sb, "language": "python", "env": {"PYTHONPATH": "/workspace/.site"}}),
    )["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let go = |c: &mut Client, code: &str| {
        c.call(
            "code/run",
            json!({"sandbox": sb, "context": ctx, "code": code, "timeout": 120}),
        )
    };
    // Left open at the end of the cell.
    let r = go(
        &mut c,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('t')",
    );
    assert!(r["error"].is_null(), "{r}");
    let pngs: Vec<&Value> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b.get("image/png").is_some())
        .collect();
    assert_eq!(pngs.len(), 1, "{r}");
    let png = pngs[0]["image/png"].as_str().unwrap();
    assert!(
        png.starts_with("iVBORw0KGgo"),
        "a PNG, base64: {}",
        &png[..20]
    );
    assert!(png.len() > 1000);
    // Shown with plt.show(), and closed by it: the next cell has no figure.
    let r = go(
        &mut c,
        "plt.figure(); plt.bar([1, 2], [3, 4]); plt.show(); print('after')",
    );
    assert_eq!(r["results"].as_array().unwrap().len(), 1, "{r}");
    assert!(r["results"][0]["image/png"].is_string());
    assert_eq!(r["stdout"], "after\n");
    let r = go(&mut c, "1");
    assert_eq!(r["results"], json!([{"text/plain": "1"}]));
    // A DataFrame: HTML and text.
    let r = go(
        &mut c,
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})",
    );
    let b = &r["results"][0];
    let html = b["text/html"].as_str().unwrap_or_default();
    assert!(
        html.contains("<table") && html.contains("<td>x</td>"),
        "{b}"
    );
    let text = b["text/plain"].as_str().unwrap();
    assert!(text.contains('a') && text.contains('y'), "{text}");
}

#[test]
fn timeout_interrupts_the_cell_and_keeps_the_variables() {
    let (_h, mut c, sb) = setup();
    let r = c.call(
        "code/run",
        json!({"sandbox": sb, "code": "import time\nkept = 7\ntime.sleep(60)\nkept = 8", "timeout": 1}),
    );
    assert_eq!(r["timedOut"], true);
    assert_eq!(r["restarted"], false);
    assert_eq!(r["error"]["name"], "KeyboardInterrupt");
    assert!(r["error"]["traceback"]
        .as_str()
        .unwrap()
        .contains("time.sleep(60)"));
    let r = run(&mut c, &sb, "kept");
    assert_eq!(plain(&r, 0), "7", "the context and its state stay");
    assert_eq!(r["timedOut"], false);
    let e = c.call_err(
        "code/run",
        json!({"sandbox": sb, "code": "1", "timeout": 0}),
    );
    assert_eq!(abx_code(&e), "E2004");
}

#[test]
fn cancel_interrupts_the_cell_and_keeps_the_variables() {
    let (_h, mut c, sb) = setup();
    run(&mut c, &sb, "before = 1");
    c.send(
        &json!({"jsonrpc": "2.0", "id": 5, "method": "code/run",
                "params": {"sandbox": sb, "runId": "slow",
                           "code": "import time\nafter = 1\nprint('go', flush=True)\ntime.sleep(60)\nafter = 2"}})
        .to_string(),
    );
    wait_output(&mut c, "slow", "go");
    c.send(
        &json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 5}}).to_string(),
    );
    let (_, resp) = until_response(&mut c, 5);
    assert_eq!(resp["error"]["code"], -32800, "{resp}");
    // The next cell runs once the interrupted one stopped: it stopped before `after = 2`.
    let r = run(&mut c, &sb, "(before, after)");
    assert_eq!(plain(&r, 0), "(1, 1)");
    assert_eq!(r["restarted"], false);
}

#[test]
fn a_cell_that_ignores_the_interrupt_restarts_its_context() {
    let (_h, mut c, sb) = setup();
    let code = "import time\nstate = 1\nwhile True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass";
    c.send(
        &json!({"jsonrpc": "2.0", "id": 9, "method": "code/run",
                "params": {"sandbox": sb, "code": code, "timeout": 1, "runId": "stubborn"}})
        .to_string(),
    );
    let (notes, resp) = until_response(&mut c, 9);
    let r = &resp["result"];
    assert_eq!(r["timedOut"], true, "{resp}");
    assert_eq!(r["restarted"], true);
    assert_eq!(r["error"]["name"], "TimeoutError");
    assert!(r["error"]["value"].as_str().unwrap().contains("restarted"));
    assert!(
        notes
            .iter()
            .any(|n| n["type"] == "restarted" && n["runId"] == "stubborn"),
        "a restarted notification: {notes:?}"
    );
    let r = run(&mut c, &sb, "'state' in globals()");
    assert_eq!(plain(&r, 0), "False", "a fresh interpreter");
    assert_eq!(r["executionCount"], 1);
    let l = c.call("code/listContexts", json!({"sandbox": sb}));
    assert_eq!(l["contexts"][0]["restarts"], 1);
}

#[test]
fn restart_context_starts_a_fresh_interpreter() {
    let (_h, mut c, sb) = setup();
    let ctx = c.call("code/createContext", json!({"sandbox": sb}))["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let pid1 = c.call(
        "code/run",
        json!({"sandbox": sb, "context": ctx, "code": "import os; gone = 1; os.getpid()"}),
    );
    let v = c.call(
        "code/restartContext",
        json!({"sandbox": sb, "context": ctx}),
    );
    assert_eq!(v["restarts"], 1);
    assert_eq!(v["running"], true);
    assert_eq!(v["executionCount"], 0);
    let r = c.call("code/run", json!({"sandbox": sb, "context": ctx, "code": "import os; ('gone' in globals(), os.getpid())"}));
    let text = plain(&r, 0);
    assert!(text.starts_with("(False, "), "{text}");
    assert_ne!(
        plain(&pid1, 0),
        text.trim_start_matches("(False, ").trim_end_matches(')')
    );
    let e = c.call_err(
        "code/restartContext",
        json!({"sandbox": sb, "context": "ctx-nope"}),
    );
    assert_eq!(abx_code(&e), "E1004");
}

/// Host processes whose environment marks them as `sandbox`'s.
fn sandbox_processes(sandbox: &str) -> Vec<u32> {
    let marker = format!("ABX_SANDBOX_ID={sandbox}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|kv| kv == marker.as_bytes()))
        })
        .collect()
}

#[test]
fn contexts_die_with_their_sandbox() {
    let (_h, mut c, sb) = setup();
    c.call(
        "code/createContext",
        json!({"sandbox": sb, "language": "python"}),
    );
    run(&mut c, &sb, "x = 1");
    c.call(
        "code/run",
        json!({"sandbox": sb, "language": "bash", "code": "y=1"}),
    );
    assert!(
        sandbox_processes(&sb).len() >= 3,
        "three interpreters run in the sandbox"
    );
    c.call("sandbox/kill", json!({"sandbox": sb}));
    wait_until("the interpreters are gone", DEADLINE, || {
        sandbox_processes(&sb).is_empty()
    });
    let e = c.call_err("code/listContexts", json!({"sandbox": sb}));
    assert_eq!(abx_code(&e), "E2009");
    let e = c.call_err("code/run", json!({"sandbox": sb, "code": "x"}));
    assert_eq!(abx_code(&e), "E2009");
}

#[test]
fn a_hundred_concurrent_runs_across_contexts() {
    let (_h, mut c, sb) = setup();
    let ctxs: Vec<String> = (0..4)
        .map(|i| {
            let lang = if i == 3 { "javascript" } else { "python" };
            c.call(
                "code/createContext",
                json!({"sandbox": sb, "language": lang}),
            )["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    for (i, ctx) in ctxs.iter().enumerate() {
        let init = if i == 3 { "var n = 0" } else { "n = 0" };
        c.call(
            "code/run",
            json!({"sandbox": sb, "context": ctx, "code": init}),
        );
    }
    for k in 0..100 {
        let i = k % 4;
        let code = if i == 3 { "n += 1; n" } else { "n += 1\nn" };
        c.send(
            &json!({"jsonrpc": "2.0", "id": 1000 + k, "method": "code/run",
                    "params": {"sandbox": sb, "context": ctxs[i], "code": code}})
            .to_string(),
        );
    }
    let mut seen = vec![Vec::new(); 4];
    let until = Instant::now() + DEADLINE;
    let mut left = 100;
    while left > 0 {
        assert!(Instant::now() < until, "{left} runs did not answer");
        let Some(v) = c.try_recv(Duration::from_secs(5)) else {
            continue;
        };
        let Some(id) = v["id"].as_i64() else { continue };
        assert!(v["error"].is_null(), "{v}");
        let i = ((id - 1000) % 4) as usize;
        let n: u64 = v["result"]["results"][0]["text/plain"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        seen[i].push(n);
        left -= 1;
    }
    for (i, mut s) in seen.into_iter().enumerate() {
        s.sort();
        assert_eq!(
            s,
            (1..=25).collect::<Vec<u64>>(),
            "context {i} ran each cell once"
        );
    }
}

#[test]
fn javascript_basics() {
    let (_h, mut c, sb) = setup();
    let go = |c: &mut Client, code: &str| {
        c.call(
            "code/run",
            json!({"sandbox": sb, "language": "js", "code": code}),
        )
    };
    let r = go(
        &mut c,
        "var a = 40; let b = 2; console.log('hi', {k: 1}); console.error('e'); a + b",
    );
    assert_eq!(r["stdout"], "hi { k: 1 }\n");
    assert_eq!(r["stderr"], "e\n");
    assert_eq!(plain(&r, 0), "42");
    assert_eq!(r["context"], "default-javascript");
    let r = go(&mut c, "[a, b, typeof require('fs').readFileSync]");
    assert_eq!(plain(&r, 0), "[ 40, 2, 'function' ]", "state persists");
    let r = go(
        &mut c,
        "(async () => { await new Promise(r => setTimeout(r, 10)); return 'later'; })()",
    );
    assert_eq!(plain(&r, 0), "'later'", "a promise is awaited");
    let r = go(&mut c, "function f() { null.x }\nf()");
    assert_eq!(r["error"]["name"], "TypeError");
    assert!(r["error"]["value"].as_str().unwrap().contains("null"));
    let tb = r["error"]["traceback"].as_str().unwrap();
    assert!(tb.contains("at f (<cell 4>"), "{tb}");
    let r = c.call(
        "code/run",
        json!({"sandbox": sb, "language": "js", "code": "a = 1; while (true) {}", "timeout": 1}),
    );
    assert_eq!(r["timedOut"], true);
    assert_eq!(r["restarted"], false, "{r}");
    assert_eq!(r["error"]["name"], "KeyboardInterrupt");
    assert_eq!(plain(&go(&mut c, "a"), 0), "1");
}

#[test]
fn bash_basics() {
    let (_h, mut c, sb) = setup();
    let go = |c: &mut Client, code: &str| {
        c.call(
            "code/run",
            json!({"sandbox": sb, "language": "bash", "code": code}),
        )
    };
    let r = go(
        &mut c,
        "cd /tmp\nV='it''s'\nf() { echo \"f:$1\"; }\necho out; echo err >&2",
    );
    assert_eq!(r["stdout"], "out\n");
    assert_eq!(r["stderr"], "err\n");
    assert!(r["error"].is_null(), "{r}");
    let r = go(&mut c, "echo \"$PWD $V\"; f x; printf 'a\\tb\\\\c\\n'");
    assert_eq!(
        r["stdout"], "/tmp its\nf:x\na\tb\\c\n",
        "cwd, vars and functions persist"
    );
    let r = go(&mut c, "ls /nonexistent-dir");
    assert_eq!(r["error"]["name"], "ExitStatus");
    assert_eq!(r["error"]["value"], "exit status 2");
    // Input is not the driver's.
    let r = go(&mut c, "cat; echo read-nothing");
    assert_eq!(r["stdout"], "read-nothing\n");
    let r = c.call(
        "code/run",
        json!({"sandbox": sb, "language": "bash", "code": "echo \"$GREETING\"", "env": {"GREETING": "o'hi"}}),
    );
    assert_eq!(r["stdout"], "o'hi\n");
    let r = c.call(
        "code/run",
        json!({"sandbox": sb, "language": "bash", "code": "sleep 60; echo no", "timeout": 1}),
    );
    assert_eq!(r["timedOut"], true);
    assert_eq!(r["restarted"], false, "{r}");
    assert_eq!(go(&mut c, "echo $V")["stdout"], "its\n");
    // `exit` ends the shell: the context says so and starts afresh next time.
    let r = go(&mut c, "exit 3");
    assert_eq!(r["restarted"], true);
    assert_eq!(r["error"]["name"], "ContextExited");
    let r = go(&mut c, "echo \"[$V]\"");
    assert_eq!(r["stdout"], "[]\n");
    assert_eq!(r["executionCount"], 1);
}

#[test]
fn bad_params_are_typed_errors() {
    let (_h, mut c, sb) = setup();
    let e = c.call_err(
        "code/run",
        json!({"sandbox": sb, "code": "1", "language": "cobol"}),
    );
    assert_eq!(abx_code(&e), "E1004");
    let e = c.call_err("code/run", json!({"sandbox": sb}));
    assert_eq!(abx_code(&e), "E1004");
    let e = c.call_err(
        "code/run",
        json!({"sandbox": sb, "language": "bash", "code": "true", "env": {"A; touch /workspace/x; B": "1"}}),
    );
    assert_eq!(abx_code(&e), "E1004");
    let e = c.call_err("code/run", json!({"sandbox": "sb-nope", "code": "1"}));
    assert_eq!(abx_code(&e), "E2009");
    let e = c.call_err(
        "code/createContext",
        json!({"sandbox": sb, "interpreter": "/no/such/python"}),
    );
    assert_eq!(abx_code(&e), "E3003");
    let e = c.call_err(
        "code/createContext",
        json!({"sandbox": sb, "cwd": "/workspace/missing"}),
    );
    assert_eq!(abx_code(&e), "E4001");
    assert_eq!(
        c.call("code/listContexts", json!({"sandbox": sb}))["contexts"],
        json!([]),
        "failed creates leave nothing"
    );
    let e = c.call_err("code/removeContext", json!({"sandbox": sb, "context": "x"}));
    assert_eq!(abx_code(&e), "E1004");
}

#[test]
fn cli_abx_code_runs_files_and_stdin_in_contexts() {
    let (home, mut c, sb) = setup();
    let out = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let err = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    let o = home.run_with_input(&["code", &sb], b"x = 6\nprint('hi')\nx * 7\n");
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(out(&o), "hi\n42\n");
    // A file; its extension picks the language (bash keeps its variables too).
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("a.sh");
    std::fs::write(&f, "V=kept; echo \"$V\"").unwrap();
    let o = home.run(&["code", &sb, f.to_str().unwrap()]);
    assert_eq!(out(&o), "kept\n", "{}", err(&o));
    let o = home.run_with_input(&["code", &sb, "-", "--language", "bash"], b"echo \"[$V]\"");
    assert_eq!(out(&o), "[kept]\n");
    // An error: traceback on stderr, exit 1; -j prints the whole result.
    let o = home.run_with_input(&["code", &sb], b"x / 0");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("ZeroDivisionError: division by zero"),
        "{}",
        err(&o)
    );
    let o = home.run_with_input(&["-j", "code", &sb], b"x");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["results"][0]["text/plain"], "6");
    assert_eq!(v["context"], "default-python");
    // --context.
    let ctx = c.call("code/createContext", json!({"sandbox": sb}))["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let o = home.run_with_input(&["code", &sb, "--context", &ctx], b"'x' in globals()");
    assert_eq!(out(&o), "False\n");
    let o = home.run_with_input(&["code", &sb, "--context", "ctx-nope"], b"1");
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("E1004"), "{}", err(&o));
}

/// Issue 45 item 9: `abx code` says that an image came back (it printed only the figure's
/// `<Figure size 640x480 with 1 Axes>`), and `--save-images DIR` writes it there.
#[test]
fn cli_abx_code_names_image_results_and_saves_them() {
    let (home, _c, sb) = setup();
    let out = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let err = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    // An object with a PNG (8 bytes: the signature) and a text form, as a figure has.
    let fig = b"class Fig:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\n'\n    def __repr__(self):\n        return '<Figure size 640x480 with 1 Axes>'\nFig()\n";
    let o = home.run_with_input(&["code", &sb], fig);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert_eq!(
        out(&o),
        "<Figure size 640x480 with 1 Axes>\n[image/png 8 bytes: use --save-images DIR]\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let imgs = dir.path().join("imgs");
    let d = imgs.to_str().unwrap();
    for n in 1..=2 {
        let o = home.run_with_input(&["code", &sb, "--save-images", d], b"Fig()");
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        let path = imgs.join(format!("{n}.png"));
        assert_eq!(
            out(&o),
            format!(
                "<Figure size 640x480 with 1 Axes>\n[image/png 8 bytes: {}]\n",
                path.display()
            )
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"\x89PNG\r\n\x1a\n");
    }
    // -j: the result whole, and the paths written.
    let o = home.run_with_input(&["-j", "code", &sb, "--save-images", d], b"Fig()");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["results"][0]["image/png"], "iVBORw0KGgo=", "{v}");
    assert_eq!(v["savedImages"], json!([imgs.join("3.png")]), "{v}");
}

#[test]
fn a_second_cancel_restarts_a_context_whose_cell_ignores_the_interrupt() {
    // A long grace: only the second cancel can restart the context here.
    let (_home, mut c) = abx_tests::fixtures::started(&[("ABX_CODE_GRACE_MS", "600000")]);
    let sb = c.create(json!({"timeout": 900}));
    // Every interrupt is caught, wherever it lands (in the sleep or in the print).
    let code = "import time\nstate = 1\nwhile True:\n    try:\n        print('go', flush=True)\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass";
    c.send(
        &json!({"jsonrpc": "2.0", "id": 21, "method": "code/run",
                "params": {"sandbox": sb, "code": code, "runId": "first"}})
        .to_string(),
    );
    wait_output(&mut c, "first", "go");
    c.send(
        &json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 21}}).to_string(),
    );
    let (_, resp) = until_response(&mut c, 21);
    assert_eq!(resp["error"]["code"], -32800);
    // A second run waits behind the interrupted cell; cancelling it restarts the context.
    c.send(
        &json!({"jsonrpc": "2.0", "id": 22, "method": "code/run",
                "params": {"sandbox": sb, "code": "'second'"}})
        .to_string(),
    );
    wait_until("the second run waits", DEADLINE, || {
        c.call("code/listContexts", json!({"sandbox": sb}))["contexts"][0]["queued"] == 1
    });
    c.send(
        &json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 22}}).to_string(),
    );
    let until = Instant::now() + DEADLINE;
    let mut restarted = None;
    while restarted.is_none() {
        assert!(Instant::now() < until, "no restarted notification");
        if let Some(v) = c.try_recv(Duration::from_secs(5)) {
            if v["method"] == "code/output" && v["params"]["type"] == "restarted" {
                restarted = Some(v["params"].clone());
            }
        }
    }
    let n = restarted.unwrap();
    assert_eq!(n["runId"], "first");
    assert!(n["text"].as_str().unwrap().contains("second cancel"), "{n}");
    let r = run(&mut c, &sb, "'state' in globals()");
    assert_eq!(plain(&r, 0), "False", "a fresh interpreter");
    let l = c.call("code/listContexts", json!({"sandbox": sb}));
    assert_eq!(l["contexts"][0]["restarts"], 1);
    assert_eq!(l["contexts"][0]["queued"], 0);
}

#[test]
fn the_last_output_of_an_interpreter_that_exits_is_kept() {
    let (_h, mut c, sb) = setup();
    let r = run(
        &mut c,
        &sb,
        "import os, sys\nprint('last words', flush=True)\nos._exit(3)",
    );
    assert_eq!(r["restarted"], true);
    assert_eq!(r["error"]["name"], "ContextExited");
    assert_eq!(r["stdout"], "last words\n");
    let r = run(&mut c, &sb, "1");
    assert_eq!(plain(&r, 0), "1");
    assert_eq!(r["executionCount"], 1);
}

/// Issue 45 item 9: the drivers are not on their interpreters' command lines (`ps` in the
/// sandbox showed the whole Python driver), and a Python traceback never shows the driver's
/// own frames: not the signal handler that raises `KeyboardInterrupt` (`File "<string>",
/// line 24, in _on_int`), not the `sys.stdout` the driver installs.
#[test]
fn the_drivers_stay_off_the_command_line_and_out_of_tracebacks() {
    let (_h, mut c, sb) = setup();
    for lang in ["python", "javascript", "bash"] {
        c.call(
            "code/createContext",
            json!({"sandbox": sb, "language": lang}),
        );
    }
    let procs = c.call("process/list", json!({"sandbox": sb}));
    let commands: Vec<&str> = procs["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["command"].as_str().unwrap())
        .collect();
    for lang in ["python3", "node", "bash"] {
        let cmd = commands
            .iter()
            .find(|c| c.starts_with(lang))
            .unwrap_or_else(|| panic!("no {lang} among {commands:?}"));
        assert!(cmd.len() < 400, "{lang}'s command line: {cmd}");
    }
    for c in &commands {
        for source in ["_on_int", "import ast", "createContext", "__abx_mark"] {
            assert!(!c.contains(source), "driver source on a command line: {c}");
        }
    }
    let r = run(
        &mut c,
        &sb,
        "open('/proc/self/cmdline', 'rb').read().count(b'\\n') < 20",
    );
    assert_eq!(plain(&r, 0), "True", "{r}");
    // An interrupt: the user's frame, none of the driver's.
    let r = c.call(
        "code/run",
        json!({"sandbox": sb, "code": "import time\ntime.sleep(60)", "timeout": 1}),
    );
    assert_eq!(r["error"]["name"], "KeyboardInterrupt", "{r}");
    let tb = r["error"]["traceback"].as_str().unwrap();
    assert!(tb.contains("time.sleep(60)"), "{tb}");
    assert!(tb.trim_end().ends_with("KeyboardInterrupt"), "{tb}");
    for driver in ["_on_int", "<string>", "abx-driver", "_main_loop", "_run"] {
        assert!(!tb.contains(driver), "a driver frame ({driver}): {tb}");
    }
    // An error raised inside the driver's own sys.stdout.
    let r = run(&mut c, &sb, "import sys\nsys.stdout.write(b'x')");
    assert_eq!(r["error"]["name"], "TypeError", "{r}");
    let tb = r["error"]["traceback"].as_str().unwrap();
    assert!(tb.contains("sys.stdout.write(b'x')"), "{tb}");
    for driver in ["<string>", "abx-driver", "in write"] {
        assert!(!tb.contains(driver), "a driver frame ({driver}): {tb}");
    }
    // JavaScript: the user's frames, none of the driver's nor node's own.
    let r = c.call(
        "code/run",
        json!({"sandbox": sb, "language": "js", "code": "function f() { null.x }\nf()"}),
    );
    let tb = r["error"]["traceback"].as_str().unwrap();
    assert!(tb.contains("at f (<cell"), "{tb}");
    for driver in ["abx-driver", "[eval]", "(node:"] {
        assert!(
            !tb.contains(driver),
            "a frame not the user's ({driver}): {tb}"
        );
    }
}
