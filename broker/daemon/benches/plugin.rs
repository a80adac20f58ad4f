//! Plugin bar of docs/design.md#bars (issue #5), measured side by side in one run (never asserted):
//! the round trip client -> broker -> plugin against the same client talking to the same
//! plugin program over a direct pipe (bar: <= 2.5x at p50; lspmux relays at about 4x).
//!
//! The plugin is the Python EPP/1 fixture `tests/fixtures/plugins/py-local`, installed into the
//! daemon's temp home as a local directory source (`provider/install {source, confirm}`), and
//! started a second time by the bench itself (`python3 ./provider.py` in a copy of the
//! fixture, with the environment the broker gives plugins: `ABX_PROTOCOL=EPP/1`,
//! `ABX_PROVIDER_ID=py-local`, `ABX_DATA_DIR`), which gets `initialize` and `initialized`
//! like the broker sends them. The call is `sandbox/list` (`{provider: "py-local"}` through
//! the broker, `{}` on the pipe): one request at a time, one client thread, both paths
//! interleaved in rounds (alternating which goes first), after a warm-up.
//!
//! Every figure is taken unpinned and with every process (client thread, daemon, both plugin
//! processes) on one CPU, and compared only with its baseline measured the same way.
//!
//! A second section (issue 25, `benches/relay/mod.rs`) puts the broker's hop beside lspmux's
//! in front of a Rust echo backend: added latency in us, relay CPU and preemptions per request.
//!
//! Usage: `cargo bench -p abx-broker --bench plugin [-- pinned|unpinned] [py|relay]`
//!
//! Environment (all optional): `ABX_BENCH_QUICK=1`, `ABX_BENCH_SAMPLES` (per path and mode,
//! default 10000), `ABX_BENCH_ROUNDS` (default 4), `ABX_BENCH_CPU`, `ABX_BENCH_JSON`,
//! `ABX_BENCH_ONLY` (as in the wire bench).

mod common;
mod relay;

use common::{
    cpu_ns, cpu_snap, ctx_switches, env_parse, mean_us, pct_us, pin_cmd, pin_if, push_request,
    round3, timed_round_trip, verdict, Mode, Out, Res, Rpc, Spawned,
};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    common::main("plugin", &[], orchestrate);
}

const PROVIDER: &str = "py-local";
/// The bar on p50.
const BAR: f64 = 2.5;

struct Config {
    quick: bool,
    samples: usize,
    rounds: usize,
    warmup: usize,
    modes: Vec<Mode>,
    cpu: Option<usize>,
    /// The sections to run: the Python fixture (docs/design.md#bars's bar), the relay comparison.
    py: bool,
    relay: bool,
}

impl Config {
    fn load() -> Res<Config> {
        let quick = common::quick();
        let (mut pinned, mut unpinned) = (false, false);
        let (mut py, mut relay) = (false, false);
        for w in &common::filter_words() {
            match w.as_str() {
                "pinned" => pinned = true,
                "unpinned" => unpinned = true,
                "py" | "python" => py = true,
                "relay" | "lspmux" => relay = true,
                "latency" | "rtt" | "plugin" => {}
                other => eprintln!(
                    "plugin bench: ignoring unknown filter {other:?} (known: pinned, unpinned, py, relay)"
                ),
            }
        }
        if !py && !relay {
            (py, relay) = (true, true);
        }
        let cpu = common::pin_cpu()?;
        let cfg = Config {
            quick,
            samples: env_parse("ABX_BENCH_SAMPLES")?.unwrap_or(if quick { 1_000 } else { 10_000 }),
            rounds: env_parse::<usize>("ABX_BENCH_ROUNDS")?
                .unwrap_or(if quick { 2 } else { 4 })
                .max(1),
            warmup: if quick { 100 } else { 500 },
            modes: common::modes("plugin", pinned, unpinned, cpu),
            cpu,
            py,
            relay,
        };
        if cfg.samples < cfg.rounds {
            return Err("ABX_BENCH_SAMPLES must be at least the number of rounds".into());
        }
        Ok(cfg)
    }
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/plugins/py-local")
}

fn copy_dir(from: &Path, to: &Path) -> Res<()> {
    let err = |e: std::io::Error| format!("copy {} to {}: {e}", from.display(), to.display());
    std::fs::create_dir_all(to).map_err(err)?;
    for e in std::fs::read_dir(from).map_err(err)? {
        let e = e.map_err(err)?;
        let dst = to.join(e.file_name());
        if e.file_type().map_err(err)?.is_dir() {
            copy_dir(&e.path(), &dst)?;
        } else {
            std::fs::copy(e.path(), &dst).map_err(err)?;
        }
    }
    Ok(())
}

type Client = Rpc<Box<dyn Read + Send>, Box<dyn Write + Send>>;

/// One way of reaching the plugin: its client, the params of the call, and the processes
/// whose CPU time it costs.
struct Path_ {
    name: &'static str,
    rpc: Client,
    params: Vec<u8>,
    /// The daemon, when the path goes through it.
    broker_pid: Option<u32>,
    plugin_pid: u32,
}

/// The plugin process the daemon runs (a descendant whose command line names provider.py).
fn plugin_under(daemon_pid: u32) -> Res<u32> {
    common::descendants(daemon_pid)
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| common::find_bytes(&c, b"provider.py").is_some())
                .unwrap_or(false)
        })
        .ok_or_else(|| "the daemon runs no provider.py".to_string())
}

/// The plugin over a direct pipe, started as the broker starts it.
struct Direct {
    child: Child,
}

impl Direct {
    fn spawn(root: &Path, data: &Path, cpu: Option<usize>) -> Res<(Direct, Client)> {
        let mut cmd = Command::new("python3");
        cmd.arg("./provider.py")
            .current_dir(root)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
            )
            .env("HOME", std::env::var("HOME").unwrap_or_else(|_| "/".into()))
            .env("LANG", "C.UTF-8")
            .env("ABX_PROTOCOL", "EPP/1")
            .env("ABX_PROVIDER_ID", PROVIDER)
            .env("ABX_DATA_DIR", data)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        pin_cmd(&mut cmd, cpu);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("python3 provider.py: {e}"))?;
        let w = child.stdin.take().expect("piped stdin");
        let r = child.stdout.take().expect("piped stdout");
        let mut rpc: Client = Rpc::new(Box::new(r), Box::new(w));
        let init = rpc.call(
            "initialize",
            json!({
                "protocol": "EPP/1",
                "broker": {"name": "abx-broker", "version": abx_broker::VERSION},
                "config": {"greeting": "hello"},
                "dataDir": data,
            }),
        )?;
        if init["protocol"] != "EPP/1" || init["provider"]["id"] != PROVIDER {
            return Err(format!("initialize answered {init}"));
        }
        rpc.notify("initialized", &json!({}))?;
        Ok((Direct { child }, rpc))
    }

    fn stop(mut self, rpc: &mut Client) {
        let _ = rpc.call("shutdown", Value::Null);
        let _ = rpc.notify("exit", &Value::Null);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("plugin bench: warning: the direct plugin did not exit; killing it");
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

struct Measured {
    name: &'static str,
    /// Sorted round trips, ns.
    ns: Vec<u64>,
    broker_cpu_ns: u64,
    plugin_cpu_ns: u64,
    /// The daemon's context switches over the measured calls.
    broker_switches: u64,
}

impl Measured {
    fn pct(&self, p: f64) -> f64 {
        pct_us(&self.ns, p)
    }
    fn mean(&self) -> f64 {
        mean_us(&self.ns)
    }
    fn per_call(&self, ns: u64) -> f64 {
        ns as f64 / self.ns.len().max(1) as f64 / 1000.0
    }
}

/// Check one reply: exactly one line, the reply to `id`, a sandbox list.
fn check_reply(name: &str, bytes: &[u8], id: u64) -> Res<()> {
    let line = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if line.contains(&b'\n') {
        return Err(format!(
            "{name}: more than one message came back: {}",
            String::from_utf8_lossy(line)
        ));
    }
    let v: Value = serde_json::from_slice(line).map_err(|e| format!("{name}: not JSON: {e}"))?;
    if v["id"].as_u64() != Some(id) || !v["result"]["sandboxes"].is_array() {
        return Err(format!("{name}: answered {v}"));
    }
    Ok(())
}

/// Interleaved rounds over both paths on one client thread.
/// Returns the figures and the paths (for their shutdown).
fn run_latency(
    cfg: &Config,
    mut paths: Vec<Path_>,
    cpu: Option<usize>,
) -> Res<(Vec<Measured>, Vec<Path_>)> {
    let rounds = cfg.rounds;
    let per_round = cfg.samples.div_ceil(rounds);
    let warmup = cfg.warmup;
    let client = std::thread::spawn(move || -> Res<(Vec<Measured>, Vec<Path_>)> {
        pin_if(cpu)?;
        let n = paths.len();
        let mut samples = vec![Vec::with_capacity(per_round * rounds); n];
        let mut cpu_b = vec![0u64; n];
        let mut cpu_p = vec![0u64; n];
        let mut sw_b = vec![0u64; n];
        let mut req = Vec::with_capacity(256);
        let mut buf = vec![0u8; 64 * 1024];
        let mut id = 1_000_000u64;
        for p in &mut paths {
            if p.rpc.buffered() != 0 {
                return Err(format!("{}: unread bytes before the timed calls", p.name));
            }
        }
        for round in 0..rounds {
            for j in 0..n {
                let k = if round % 2 == 0 { j } else { n - 1 - j };
                let p = &mut paths[k];
                for i in 0..warmup + per_round {
                    if i == warmup {
                        // Count CPU time over the measured calls only.
                        let (b, q) = (p.broker_pid.and_then(cpu_ns), cpu_ns(p.plugin_pid));
                        cpu_b[k] = cpu_b[k].wrapping_sub(b.unwrap_or(0));
                        cpu_p[k] = cpu_p[k].wrapping_sub(q.unwrap_or(0));
                        let s = p.broker_pid.and_then(ctx_switches).unwrap_or(0);
                        sw_b[k] = sw_b[k].wrapping_sub(s);
                    }
                    id += 1;
                    req.clear();
                    push_request(&mut req, id, "sandbox/list", &p.params);
                    let (r, w) = p.rpc.halves();
                    let (dt, got) = timed_round_trip(r, w, &req, &mut buf)
                        .map_err(|e| format!("{}: {e}", p.name))?;
                    check_reply(p.name, &buf[..got], id)?;
                    if i >= warmup {
                        samples[k].push(dt.as_nanos() as u64);
                    }
                }
                let (b1, p1) = (p.broker_pid.and_then(cpu_ns), cpu_ns(p.plugin_pid));
                cpu_b[k] = cpu_b[k].wrapping_add(b1.unwrap_or(0));
                cpu_p[k] = cpu_p[k].wrapping_add(p1.unwrap_or(0));
                let s = p.broker_pid.and_then(ctx_switches).unwrap_or(0);
                sw_b[k] = sw_b[k].wrapping_add(s);
            }
        }
        let measured = paths
            .iter()
            .zip(samples)
            .enumerate()
            .map(|(k, (p, mut ns))| {
                ns.sort_unstable();
                Measured {
                    name: p.name,
                    ns,
                    broker_cpu_ns: cpu_b[k],
                    plugin_cpu_ns: cpu_p[k],
                    broker_switches: sw_b[k],
                }
            })
            .collect();
        Ok((measured, paths))
    });
    client
        .join()
        .map_err(|_| "latency client panicked".to_string())?
}

fn report(out: &mut Out, cfg: &Config, mode: Mode, res: &[Measured]) {
    let mut t = String::new();
    let n = res.first().map_or(0, |r| r.ns.len());
    let _ = writeln!(
        t,
        "\nsandbox/list round trip to the {PROVIDER} plugin, 1 client, 1 request at a time [{}] ({n} samples per path, {} interleaved rounds)",
        mode.name(),
        cfg.rounds
    );
    let _ = writeln!(
        t,
        "  {:<18}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>14}{:>14}",
        "path",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "mean us",
        "max us",
        "broker CPU",
        "plugin CPU"
    );
    for r in res {
        let _ = writeln!(
            t,
            "  {:<18}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>14}{:>14}",
            r.name,
            r.pct(0.50),
            r.pct(0.90),
            r.pct(0.99),
            r.pct(0.999),
            r.mean(),
            r.pct(1.0),
            if r.name == "direct" {
                "-".to_string()
            } else {
                format!("{:.1} us/call", r.per_call(r.broker_cpu_ns))
            },
            format!("{:.1} us/call", r.per_call(r.plugin_cpu_ns)),
        );
        out.record(json!({
            "kind": "latency", "figure": "plugin_rtt", "mode": mode.name(), "path": r.name,
            "samples": r.ns.len(), "p50_us": round3(r.pct(0.5)), "p90_us": round3(r.pct(0.9)),
            "p99_us": round3(r.pct(0.99)), "p999_us": round3(r.pct(0.999)),
            "mean_us": round3(r.mean()), "min_us": round3(r.ns[0] as f64 / 1000.0),
            "max_us": round3(r.pct(1.0)),
            "broker_cpu_us_per_call": (r.name != "direct").then(|| round3(r.per_call(r.broker_cpu_ns))),
            "plugin_cpu_us_per_call": round3(r.per_call(r.plugin_cpu_ns)),
            "broker_switches_per_call": (r.name != "direct").then(|| round3(r.broker_switches as f64 / r.ns.len().max(1) as f64)),
        }));
    }
    let find = |name| res.iter().find(|r| r.name == name);
    if let (Some(b), Some(d)) = (find("broker"), find("direct")) {
        let p50 = b.pct(0.5) / d.pct(0.5);
        let p90 = b.pct(0.9) / d.pct(0.9);
        let p99 = b.pct(0.99) / d.pct(0.99);
        let p999 = b.pct(0.999) / d.pct(0.999);
        let mean = b.mean() / d.mean();
        let _ = writeln!(
            t,
            "  {:<18}{:>9.2}x{:>9.2}x{:>9.2}x{:>9.2}x{:>9.2}x   bar: p50 <= {BAR}x [{}] (p99 for information)",
            "broker/direct",
            p50,
            p90,
            p99,
            p999,
            mean,
            verdict(p50 <= BAR),
        );
        let _ = writeln!(
            t,
            "  {:<18}{:>9.1} us added per call at p50, {:.1} us at p99; the daemon switched context {:.1} times per call",
            "broker hop",
            b.pct(0.5) - d.pct(0.5),
            b.pct(0.99) - d.pct(0.99),
            b.broker_switches as f64 / b.ns.len().max(1) as f64
        );
        out.ratio(
            "plugin_rtt_p50",
            mode,
            "broker",
            "direct",
            p50,
            Some(("<=", BAR)),
        );
        out.ratio("plugin_rtt_p99", mode, "broker", "direct", p99, None);
        out.ratio("plugin_rtt_p999", mode, "broker", "direct", p999, None);
    }
    out.table(&t);
}

fn mode_run(cfg: &Config, out: &mut Out, mode: Mode) -> Res<()> {
    let cpu = mode.cpu(cfg.cpu);
    let dir = tempfile::Builder::new()
        .prefix("abx-plugin-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let root = dir.path().join(PROVIDER);
    copy_dir(&fixture(), &root)?;
    let data = dir.path().join("direct-data");
    std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;

    let daemon = Spawned::daemon(&dir.path().join("home"), cpu, &[])?;
    let mut setup = daemon.rpc()?;
    let installed = setup.call("provider/install", json!({"source": root, "confirm": true}))?;
    if installed["id"] != PROVIDER {
        return Err(format!("provider/install answered {installed}"));
    }
    let sock = daemon.connect()?;
    let r = sock.try_clone().map_err(|e| format!("clone socket: {e}"))?;
    let mut via: Client = Rpc::new(Box::new(r), Box::new(sock));
    // The first call starts the plugin.
    via.call("sandbox/list", json!({"provider": PROVIDER}))?;
    let plugin_pid = plugin_under(daemon.pid())?;

    let (direct, mut pipe) = Direct::spawn(&root, &data, cpu)?;
    // Also drains the plugin's `log` notification that follows `initialized`.
    pipe.call("sandbox/list", json!({}))?;
    let direct_pid = direct.child.id();
    eprintln!(
        "plugin bench: {} daemon and both plugins up (plugin under the daemon: pid {plugin_pid}, direct: pid {direct_pid})",
        mode.name()
    );

    let pids = [daemon.pid(), direct_pid];
    let before = cpu_snap(&pids);
    let paths = vec![
        Path_ {
            name: "direct",
            rpc: pipe,
            params: b"{}".to_vec(),
            broker_pid: None,
            plugin_pid: direct_pid,
        },
        Path_ {
            name: "broker",
            rpc: via,
            params: format!("{{\"provider\":\"{PROVIDER}\"}}").into_bytes(),
            broker_pid: Some(daemon.pid()),
            plugin_pid,
        },
    ];
    let (res, mut paths) = run_latency(cfg, paths, cpu)?;
    report(out, cfg, mode, &res);
    out.noise(mode.name(), before, cpu_snap(&pids));

    direct.stop(&mut paths[0].rpc);
    drop(setup);
    if let Err(e) = daemon.stop() {
        eprintln!("plugin bench: warning: {e}");
    }
    Ok(())
}

fn orchestrate() -> Res<()> {
    let cfg = Config::load()?;
    if !fixture().join("abx-provider.toml").is_file() {
        return Err(format!("no fixture at {}", fixture().display()));
    }
    let mut out = Out::new("plugin")?;
    let started = Instant::now();
    out.header(cfg.cpu, cfg.quick);
    out.record(json!({
        "kind": "meta",
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "allowed_cpus": common::allowed_cpus(), "pin_cpu": cfg.cpu, "quick": cfg.quick,
        "samples": cfg.samples, "rounds": cfg.rounds, "warmup": cfg.warmup,
        "provider": PROVIDER, "call": "sandbox/list",
        "version": abx_broker::VERSION, "loadavg1": common::loadavg(),
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    }));
    let tools = if cfg.relay {
        Some(relay::Tools::get()?)
    } else {
        None
    };
    for &mode in &cfg.modes {
        if cfg.py {
            mode_run(&cfg, &mut out, mode)?;
        }
        if let Some(tools) = &tools {
            relay::run(
                tools,
                &mut out,
                mode,
                mode.cpu(cfg.cpu),
                cfg.samples,
                cfg.rounds,
                cfg.warmup,
            )?;
        }
    }
    out.finish(started);
    Ok(())
}
