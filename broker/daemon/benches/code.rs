//! The code interpreter's bar (issue 24): a trivial cell (`1+1`) through `code/run` in a warm
//! Python context against `exec/run` of `python3 -c '1+1'` in the same local sandbox, one
//! request at a time over one connection, alternating (bar: <= 0.2x the exec's median round
//! trip; goal <= 0.05x). The node context's `1+1` and bash's `echo $((1+1))` are printed beside it, without
//! a bar. Never asserted.
//!
//! Usage: `cargo bench -p abx-broker --bench code`. Environment (optional):
//! `ABX_BENCH_QUICK=1` (30 round trips each instead of 200), `ABX_BENCH_ROUNDS` (round trips
//! each), `ABX_BENCH_JSON`.

mod common;
use common::{cpu_snap, env_parse, median, Mode, Out, Res, Spawned, UnixRpc};
use serde_json::{json, Value};
use std::io::Write as _;
use std::time::Instant;

fn main() {
    common::main("code", &[], orchestrate);
}

fn timed(rpc: &mut UnixRpc, method: &str, params: &Value) -> Res<(f64, Value)> {
    let t = Instant::now();
    let v = rpc.call(method, params.clone())?;
    Ok((t.elapsed().as_secs_f64() * 1e6, v))
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut r = v.to_vec();
    r.sort_by(f64::total_cmp);
    let i = ((r.len() as f64 * p).ceil() as usize).clamp(1, r.len()) - 1;
    r[i]
}

fn orchestrate() -> Res<()> {
    let quick = common::quick();
    let rounds = env_parse::<usize>("ABX_BENCH_ROUNDS")?
        .unwrap_or(if quick { 30 } else { 200 })
        .max(1);
    let mut out = Out::new("code")?;
    let started = Instant::now();
    out.header(None, quick);
    let dir = tempfile::Builder::new()
        .prefix("abx-code-bench-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let daemon = Spawned::daemon(&dir.path().join("home"), None, &[])?;
    let mut rpc = daemon.rpc()?;
    let sb = rpc.call(
        "sandbox/create",
        json!({"provider": "local", "timeout": 3600}),
    )?;
    let sb = sb["id"]
        .as_str()
        .ok_or_else(|| format!("sandbox/create answered {sb}"))?
        .to_owned();
    let cell = |lang: &str| {
        let code = if lang == "bash" {
            "echo $((1+1))"
        } else {
            "1+1"
        };
        json!({"sandbox": sb, "language": lang, "code": code})
    };
    let exec = json!({"sandbox": sb, "argv": ["python3", "-c", "1+1"]});
    // Warm: the contexts start, the first exec pays for nothing the others do not.
    for lang in ["python", "javascript", "bash"] {
        let (_, v) = timed(&mut rpc, "code/run", &cell(lang))?;
        if !v["error"].is_null() {
            return Err(format!("code/run {lang} 1+1 answered {v}"));
        }
    }
    let (_, v) = timed(&mut rpc, "exec/run", &exec)?;
    if v["exitCode"] != 0 {
        return Err(format!("exec/run python3 -c 1+1 answered {v}"));
    }
    let before = cpu_snap(&[daemon.pid()]);
    let (mut code_us, mut exec_us, mut node_us, mut bash_us) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (t, v) = timed(&mut rpc, "code/run", &cell("python"))?;
        if v["results"][0]["text/plain"] != "2" {
            return Err(format!("code/run 1+1 answered {v}"));
        }
        code_us.push(t);
        exec_us.push(timed(&mut rpc, "exec/run", &exec)?.0);
        node_us.push(timed(&mut rpc, "code/run", &cell("javascript"))?.0);
        bash_us.push(timed(&mut rpc, "code/run", &cell("bash"))?.0);
    }
    let mut t = String::from("\nround trips, one at a time (µs): median / p90\n");
    for (name, v) in [
        ("code/run python 1+1 (warm context)", &code_us),
        ("exec/run python3 -c '1+1'", &exec_us),
        ("code/run javascript 1+1", &node_us),
        ("code/run bash echo $((1+1))", &bash_us),
    ] {
        let m = median(v).unwrap_or(0.0);
        t.push_str(&format!("  {name:<38} {m:>9.0} / {:>9.0}\n", pct(v, 0.9)));
        out.record(json!({"kind": "latency", "figure": name, "median_us": m, "p90_us": pct(v, 0.9), "n": v.len()}));
    }
    let ratio = median(&code_us).unwrap_or(0.0) / median(&exec_us).unwrap_or(f64::INFINITY);
    t.push_str(&format!(
        "  ratio code/run / exec/run (medians): {ratio:.3}x (bar <= 0.2x, goal <= 0.05x: {})\n",
        if ratio <= 0.05 {
            "goal met"
        } else if ratio <= 0.2 {
            "bar met"
        } else {
            "MISS"
        }
    ));
    out.table(&t);
    out.ratio(
        "1+1 cell",
        Mode::Unpinned,
        "code/run",
        "exec/run",
        ratio,
        Some(("<=", 0.2)),
    );
    out.noise("code unpinned", before, cpu_snap(&[daemon.pid()]));
    let _ = rpc.call("sandbox/kill", json!({"sandbox": sb}));
    if let Err(e) = daemon.stop() {
        eprintln!("code bench: warning: {e}");
    }
    out.finish(started);
    let _ = std::io::stdout().flush();
    Ok(())
}
