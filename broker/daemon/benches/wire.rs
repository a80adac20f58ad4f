//! Wire bars of docs/design.md#bars, measured side by side in one run (never asserted):
//!
//! 1. `broker/ping` round trip over the daemon's socket, one client, one request at a time,
//!    against a minimal Unix-socket line echo server (bar: p50 <= 2x, p99 <= 3x).
//! 2. Pipelined `broker/ping`, 8 connections x 64 in flight, against an echo server that
//!    parses every line into a `serde_json::Value` and re-serializes it, writing only when its
//!    read buffer is drained (bar: >= 0.5x its messages/s). A plain echo server is measured
//!    too, for information.
//!
//! Every figure is taken twice: unpinned, and with every process (client threads, daemon,
//! baseline servers) restricted to one CPU. A figure is only ever compared with its baseline
//! measured the same way in the same run.
//!
//! The bench re-executes itself as its servers: `ABX_BENCH_ROLE=daemon` runs
//! `abx_broker::socket::run` under the temp home in `ABX_BENCH_HOME`; `echo` and `json-echo`
//! serve on the socket in `ABX_BENCH_SOCKET`. Each child says `ready <pid>` on the fd named by
//! `ABX_READY_FD` and exits when its stdin closes (so a dying bench leaves nothing behind).
//!
//! Usage: `cargo bench -p abx-broker --bench wire [-- latency|throughput|pinned|unpinned ...]`
//!
//! Environment (all optional):
//! - `ABX_BENCH_QUICK=1`: a smoke run of a few seconds.
//! - `ABX_BENCH_JSON=1`: JSON lines on stdout (the table goes to stderr);
//!   `ABX_BENCH_JSON=<file>`: JSON lines appended to that file (the table stays on stdout).
//! - `ABX_BENCH_ONLY=latency,pinned,...`: same as the positional filters.
//! - `ABX_BENCH_PING_SAMPLES` (per server and mode, default 20000), `ABX_BENCH_ROUNDS`
//!   (default 4 for latency, 5 for throughput), `ABX_BENCH_SECS` (seconds measured per
//!   throughput round, default 1.0), `ABX_BENCH_WARMUP_SECS` (default 0.3), `ABX_BENCH_CONNS`
//!   (default 8), `ABX_BENCH_DEPTH` (default 64), `ABX_BENCH_CLIENT_THREADS` (throughput
//!   client threads, default 1), `ABX_BENCH_CPU` (the CPU of the pinned runs, default the
//!   first one this process may use).

mod common;

use common::{
    cpu_ns, cpu_snap, env_parse, mean_us, median, pct_us, pin_if, push_ping, round3, round_trip,
    thousands, timed_round_trip, verdict, Mode, Out, Res, Spawned, SOCKET_ENV,
};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn main() {
    common::main(
        "wire",
        &[
            ("echo", || role_echo(false)),
            ("json-echo", || role_echo(true)),
        ],
        orchestrate,
    );
}

// ---------------------------------------------------------------------------------------------
// Child roles
// ---------------------------------------------------------------------------------------------

/// The baseline servers: one blocking thread per connection (the cheapest wake-up path there
/// is). `json = false` echoes every complete line as is; `json = true` parses every line into a
/// `serde_json::Value` and writes it re-serialized. Either writes once per read, after every
/// complete line in the read buffer has been handled.
fn role_echo(json: bool) {
    common::exit_with_parent();
    let socket = PathBuf::from(std::env::var_os(SOCKET_ENV).expect("ABX_BENCH_SOCKET is set"));
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).unwrap_or_else(|e| {
        eprintln!("wire bench echo: bind {}: {e}", socket.display());
        std::process::exit(1);
    });
    common::signal_ready();
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                std::thread::spawn(move || echo_conn(s, json));
            }
            Err(e) => {
                eprintln!("wire bench echo: accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn echo_conn(mut s: UnixStream, json: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut have = 0;
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        if have == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = match s.read(&mut buf[have..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let from = have;
        have += n;
        let Some(last) = buf[from..have].iter().rposition(|&b| b == b'\n') else {
            continue;
        };
        let end = from + last + 1;
        let ok = if json {
            out.clear();
            for line in buf[..end - 1].split(|&b| b == b'\n') {
                if line.is_empty() {
                    continue;
                }
                match serde_json::from_slice::<Value>(line) {
                    Ok(v) => serde_json::to_writer(&mut out, &v).expect("a Value serializes"),
                    Err(_) => out.extend_from_slice(line),
                }
                out.push(b'\n');
            }
            s.write_all(&out).is_ok()
        } else {
            s.write_all(&buf[..end]).is_ok()
        };
        if !ok {
            return;
        }
        buf.copy_within(end..have, 0);
        have -= end;
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Daemon,
    Echo,
    JsonEcho,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Daemon => "daemon",
            Kind::Echo => "echo",
            Kind::JsonEcho => "json-echo",
        }
    }
}

struct Config {
    quick: bool,
    latency: bool,
    throughput: bool,
    modes: Vec<Mode>,
    ping_samples: usize,
    latency_rounds: usize,
    tput_rounds: usize,
    secs: f64,
    warmup_secs: f64,
    conns: usize,
    depth: usize,
    client_threads: usize,
    cpu: Option<usize>,
}

impl Config {
    fn load() -> Res<Config> {
        let quick = common::quick();
        let words = common::filter_words();
        let (mut latency, mut throughput, mut pinned, mut unpinned) = (false, false, false, false);
        for w in &words {
            match w.as_str() {
                "latency" | "ping" | "rtt" => latency = true,
                "throughput" | "pipelined" | "tput" => throughput = true,
                "pinned" => pinned = true,
                "unpinned" => unpinned = true,
                other => eprintln!(
                    "wire bench: ignoring unknown filter {other:?} (known: latency, throughput, pinned, unpinned)"
                ),
            }
        }
        if !latency && !throughput {
            (latency, throughput) = (true, true);
        }
        let cpu = common::pin_cpu()?;
        let modes = common::modes("wire", pinned, unpinned, cpu);
        let rounds = env_parse::<usize>("ABX_BENCH_ROUNDS")?;
        let cfg = Config {
            quick,
            latency,
            throughput,
            modes,
            ping_samples: env_parse("ABX_BENCH_PING_SAMPLES")?.unwrap_or(if quick {
                2_000
            } else {
                20_000
            }),
            latency_rounds: rounds.unwrap_or(if quick { 2 } else { 4 }).max(1),
            tput_rounds: rounds.unwrap_or(if quick { 1 } else { 5 }).max(1),
            secs: env_parse("ABX_BENCH_SECS")?.unwrap_or(if quick { 0.5 } else { 1.0 }),
            warmup_secs: env_parse("ABX_BENCH_WARMUP_SECS")?.unwrap_or(if quick {
                0.2
            } else {
                0.3
            }),
            conns: env_parse::<usize>("ABX_BENCH_CONNS")?.unwrap_or(8).max(1),
            depth: env_parse::<usize>("ABX_BENCH_DEPTH")?.unwrap_or(64).max(1),
            client_threads: env_parse::<usize>("ABX_BENCH_CLIENT_THREADS")?
                .unwrap_or(1)
                .max(1),
            cpu,
        };
        if cfg.ping_samples < cfg.latency_rounds {
            return Err("ABX_BENCH_PING_SAMPLES must be at least the number of rounds".into());
        }
        Ok(cfg)
    }
}

// ---------------------------------------------------------------------------------------------
// Servers (children running this same executable)
// ---------------------------------------------------------------------------------------------

struct Server {
    kind: Kind,
    s: Spawned,
}

impl Server {
    fn spawn(kind: Kind, dir: &Path, cpu: Option<usize>) -> Res<Server> {
        let s = match kind {
            Kind::Daemon => Spawned::daemon(&dir.join("daemon-home"), cpu, &[])?,
            Kind::Echo | Kind::JsonEcho => Spawned::role(kind.name(), dir, cpu)?,
        };
        let server = Server { kind, s };
        server.check()?;
        Ok(server)
    }

    fn socket(&self) -> &Path {
        &self.s.socket
    }

    fn connect(&self) -> Res<UnixStream> {
        self.s.connect()
    }

    /// One request, one reply, checked: the server answers what we measure.
    fn check(&self) -> Res<()> {
        let mut s = self.connect()?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let mut req = Vec::new();
        push_ping(&mut req, 7);
        let line = round_trip(&mut s, &req).map_err(|e| format!("{}: {e}", self.kind.name()))?;
        let v: Value = serde_json::from_slice(&line)
            .map_err(|e| format!("{} answered non-JSON ({e})", self.kind.name()))?;
        let ok = v["id"] == 7
            && match self.kind {
                Kind::Daemon => v["result"].is_object(),
                Kind::Echo | Kind::JsonEcho => v["method"] == "broker/ping",
            };
        if ok {
            Ok(())
        } else {
            Err(format!("{} answered {v}", self.kind.name()))
        }
    }

    fn stop(self) -> Res<()> {
        self.s.stop()
    }
}

// ---------------------------------------------------------------------------------------------
// Figure 1: ping round trip
// ---------------------------------------------------------------------------------------------

struct Latency {
    kind: Kind,
    /// Sorted round-trip times in nanoseconds.
    ns: Vec<u64>,
}

impl Latency {
    fn pct(&self, p: f64) -> f64 {
        pct_us(&self.ns, p)
    }
    fn mean(&self) -> f64 {
        mean_us(&self.ns)
    }
}

/// One client, one request at a time, servers interleaved in rounds (alternating which goes
/// first) so drift in the machine hits both alike.
fn run_latency(cfg: &Config, servers: &[&Server], cpu: Option<usize>) -> Res<Vec<Latency>> {
    let kinds: Vec<Kind> = servers.iter().map(|s| s.kind).collect();
    let streams = servers
        .iter()
        .map(|s| s.connect())
        .collect::<Res<Vec<_>>>()?;
    let rounds = cfg.latency_rounds;
    let per_round = cfg.ping_samples.div_ceil(rounds);
    let warmup = if cfg.quick { 200 } else { 1000 };
    let client = std::thread::spawn(move || -> Res<Vec<Latency>> {
        pin_if(cpu)?;
        let mut samples = vec![Vec::with_capacity(per_round * rounds); kinds.len()];
        let mut req = Vec::with_capacity(128);
        let mut buf = vec![0u8; 4096];
        let mut id = 0u64;
        for round in 0..rounds {
            for j in 0..kinds.len() {
                let k = if round % 2 == 0 {
                    j
                } else {
                    kinds.len() - 1 - j
                };
                for i in 0..warmup + per_round {
                    id += 1;
                    req.clear();
                    push_ping(&mut req, id);
                    let s = &streams[k];
                    let (dt, _) = timed_round_trip(&mut &*s, &mut &*s, &req, &mut buf)
                        .map_err(|e| format!("{}: {e}", kinds[k].name()))?;
                    if i >= warmup {
                        samples[k].push(dt.as_nanos() as u64);
                    }
                }
            }
        }
        Ok(kinds
            .iter()
            .zip(samples)
            .map(|(&kind, mut ns)| {
                ns.sort_unstable();
                Latency { kind, ns }
            })
            .collect())
    });
    client
        .join()
        .map_err(|_| "latency client panicked".to_string())?
}

// ---------------------------------------------------------------------------------------------
// Figure 2: pipelined throughput
// ---------------------------------------------------------------------------------------------

struct Throughput {
    kind: Kind,
    /// Messages per second, one per round.
    rates: Vec<f64>,
    /// The server's CPU time per message (ns), one per round.
    cpu_ns: Vec<f64>,
}

impl Throughput {
    fn median(&self) -> f64 {
        median(&self.rates).unwrap_or(0.0)
    }
    fn cpu_ns_median(&self) -> Option<f64> {
        median(&self.cpu_ns)
    }
    fn min(&self) -> f64 {
        common::min_of(&self.rates)
    }
    fn max(&self) -> f64 {
        common::max_of(&self.rates)
    }
}

/// Keep `depth` requests in flight on one connection: after each read, send as many new
/// requests as replies arrived, in one write. Stops refilling when `stop` is set and returns
/// once every reply is in.
async fn pump(
    path: PathBuf,
    depth: usize,
    counter: Arc<AtomicU64>,
    connected: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::UnixStream::connect(&path).await?;
    connected.fetch_add(1, Ordering::SeqCst);
    let mut out = Vec::with_capacity(depth * 64);
    let mut id = 0u64;
    for _ in 0..depth {
        id += 1;
        push_ping(&mut out, id);
    }
    s.write_all(&out).await?;
    let mut in_flight = depth;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no reply for 10 s"))??;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // Replies are compact JSON: a newline only ever ends one.
        let done = buf[..n].iter().filter(|&&b| b == b'\n').count();
        if done == 0 {
            continue;
        }
        in_flight -= done;
        counter.fetch_add(done as u64, Ordering::Relaxed);
        if stop.load(Ordering::Relaxed) {
            if in_flight == 0 {
                return Ok(());
            }
            continue;
        }
        out.clear();
        for _ in 0..done {
            id += 1;
            push_ping(&mut out, id);
        }
        s.write_all(&out).await?;
        in_flight += done;
    }
}

/// One round against one server: connect everything, warm up, count replies over `secs`.
/// Returns messages per second and the server's CPU time per message in nanoseconds (when
/// the OS tells us).
fn throughput_round(cfg: &Config, server: &Server, cpu: Option<usize>) -> Res<(f64, Option<f64>)> {
    let counter = Arc::new(AtomicU64::new(0));
    let connected = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(Mutex::new(None::<String>));
    let threads = cfg.client_threads.min(cfg.conns);
    let mut handles = Vec::new();
    for t in 0..threads {
        let my_conns = (t..cfg.conns).step_by(threads).count();
        let (counter, connected, stop, failed) = (
            counter.clone(),
            connected.clone(),
            stop.clone(),
            failed.clone(),
        );
        let path = server.socket().to_path_buf();
        let depth = cfg.depth;
        handles.push(std::thread::spawn(move || {
            let run = || -> Res<()> {
                pin_if(cpu)?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async {
                    let mut set = tokio::task::JoinSet::new();
                    for _ in 0..my_conns {
                        set.spawn(pump(
                            path.clone(),
                            depth,
                            counter.clone(),
                            connected.clone(),
                            stop.clone(),
                        ));
                    }
                    while let Some(r) = set.join_next().await {
                        r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            };
            if let Err(e) = run() {
                *failed.lock().expect("failed lock") = Some(e);
                stop.store(true, Ordering::SeqCst);
            }
        }));
    }
    let result = (|| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while connected.load(Ordering::SeqCst) < cfg.conns {
            if stop.load(Ordering::SeqCst) || Instant::now() > deadline {
                return Err("clients did not connect".to_string());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_secs_f64(cfg.warmup_secs));
        let pid = server.s.pid();
        let (s0, c0, t0) = (cpu_ns(pid), counter.load(Ordering::SeqCst), Instant::now());
        std::thread::sleep(Duration::from_secs_f64(cfg.secs));
        let (c1, t1, s1) = (counter.load(Ordering::SeqCst), Instant::now(), cpu_ns(pid));
        let msgs = (c1 - c0).max(1) as f64;
        let cpu = match (s0, s1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / msgs),
            _ => None,
        };
        Ok((msgs / (t1 - t0).as_secs_f64(), cpu))
    })();
    stop.store(true, Ordering::SeqCst);
    for h in handles {
        h.join()
            .map_err(|_| "throughput client panicked".to_string())?;
    }
    if let Some(e) = failed.lock().expect("failed lock").take() {
        return Err(format!("{}: {e}", server.kind.name()));
    }
    result
}

fn run_throughput(cfg: &Config, servers: &[&Server], cpu: Option<usize>) -> Res<Vec<Throughput>> {
    let mut out: Vec<Throughput> = servers
        .iter()
        .map(|s| Throughput {
            kind: s.kind,
            rates: Vec::new(),
            cpu_ns: Vec::new(),
        })
        .collect();
    for round in 0..cfg.tput_rounds {
        for j in 0..servers.len() {
            // Rotate the order each round.
            let k = (j + round) % servers.len();
            let (rate, cpu_ns) = throughput_round(cfg, servers[k], cpu)?;
            out[k].rates.push(rate);
            out[k].cpu_ns.extend(cpu_ns);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

fn report_latency(out: &mut Out, cfg: &Config, mode: Mode, res: &[Latency]) {
    let mut t = String::new();
    let n = res.first().map_or(0, |r| r.ns.len());
    let _ = writeln!(
        t,
        "\nbroker/ping round trip, 1 client, 1 request at a time [{}] ({n} samples per server, {} interleaved rounds)",
        mode.name(),
        cfg.latency_rounds
    );
    let _ = writeln!(
        t,
        "  {:<18}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "server", "p50 us", "p90 us", "p99 us", "p99.9 us", "mean us", "max us"
    );
    for r in res {
        let _ = writeln!(
            t,
            "  {:<18}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>10.1}",
            r.kind.name(),
            r.pct(0.50),
            r.pct(0.90),
            r.pct(0.99),
            r.pct(0.999),
            r.mean(),
            r.pct(1.0)
        );
        out.record(json!({
            "kind": "latency", "figure": "ping_rtt", "mode": mode.name(), "server": r.kind.name(),
            "samples": r.ns.len(), "p50_us": round3(r.pct(0.5)), "p90_us": round3(r.pct(0.9)),
            "p99_us": round3(r.pct(0.99)), "p999_us": round3(r.pct(0.999)),
            "mean_us": round3(r.mean()), "min_us": round3(r.ns[0] as f64 / 1000.0),
            "max_us": round3(r.pct(1.0)),
        }));
    }
    let find = |k| res.iter().find(|r| r.kind == k);
    if let (Some(d), Some(e)) = (find(Kind::Daemon), find(Kind::Echo)) {
        let p50 = d.pct(0.5) / e.pct(0.5);
        let p90 = d.pct(0.9) / e.pct(0.9);
        let p99 = d.pct(0.99) / e.pct(0.99);
        let p999 = d.pct(0.999) / e.pct(0.999);
        let mean = d.mean() / e.mean();
        let _ = writeln!(
            t,
            "  {:<18}{:>9.2}x{:>9.2}x{:>9.2}x{:>9.2}x{:>9.2}x   bar: p50 <= 2x [{}], p99 <= 3x [{}]",
            "daemon/echo",
            p50,
            p90,
            p99,
            p999,
            mean,
            verdict(p50 <= 2.0),
            verdict(p99 <= 3.0)
        );
        out.ratio(
            "ping_rtt_p50",
            mode,
            Kind::Daemon.name(),
            Kind::Echo.name(),
            p50,
            Some(("<=", 2.0)),
        );
        out.ratio(
            "ping_rtt_p99",
            mode,
            Kind::Daemon.name(),
            Kind::Echo.name(),
            p99,
            Some(("<=", 3.0)),
        );
        out.ratio(
            "ping_rtt_p999",
            mode,
            Kind::Daemon.name(),
            Kind::Echo.name(),
            p999,
            None,
        );
    }
    out.table(&t);
}

fn report_throughput(out: &mut Out, cfg: &Config, mode: Mode, res: &[Throughput]) {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\npipelined broker/ping, {} conns x {} in flight, {} client thread(s) [{}] ({} rounds x {} s per server)",
        cfg.conns,
        cfg.depth,
        cfg.client_threads.min(cfg.conns),
        mode.name(),
        cfg.tput_rounds,
        cfg.secs
    );
    let _ = writeln!(
        t,
        "  {:<18}{:>16}{:>16}{:>16}{:>18}",
        "server", "median msg/s", "min msg/s", "max msg/s", "server CPU ns/msg"
    );
    for r in res {
        let cpu = r.cpu_ns_median();
        let _ = writeln!(
            t,
            "  {:<18}{:>16}{:>16}{:>16}{:>18}",
            r.kind.name(),
            thousands(r.median()),
            thousands(r.min()),
            thousands(r.max()),
            cpu.map_or_else(|| "-".to_string(), |c| format!("{c:.0}"))
        );
        out.record(json!({
            "kind": "throughput", "figure": "pipelined_ping", "mode": mode.name(),
            "server": r.kind.name(), "conns": cfg.conns, "depth": cfg.depth,
            "client_threads": cfg.client_threads.min(cfg.conns), "secs_per_round": cfg.secs,
            "rounds_msgs_per_s": r.rates.iter().map(|v| v.round()).collect::<Vec<_>>(),
            "median_msgs_per_s": r.median().round(),
            "rounds_server_cpu_ns_per_msg": r.cpu_ns.iter().map(|v| v.round()).collect::<Vec<_>>(),
            "median_server_cpu_ns_per_msg": cpu.map(f64::round),
        }));
    }
    let find = |k| res.iter().find(|r| r.kind == k);
    if let (Some(d), Some(j)) = (find(Kind::Daemon), find(Kind::JsonEcho)) {
        let r = d.median() / j.median();
        let _ = writeln!(
            t,
            "  {:<18}{:>15.2}x   bar: >= 0.5x [{}]",
            "daemon/json-echo",
            r,
            verdict(r >= 0.5)
        );
        out.ratio(
            "pipelined",
            mode,
            Kind::Daemon.name(),
            Kind::JsonEcho.name(),
            r,
            Some((">=", 0.5)),
        );
        if let (Some(dc), Some(jc)) = (d.cpu_ns_median(), j.cpu_ns_median()) {
            let r = dc / jc;
            let _ = writeln!(
                t,
                "  {:<18}{:>15.2}x   server CPU per message (for information; less disturbed by other load)",
                "daemon/json-echo",
                r
            );
            out.ratio(
                "pipelined_cpu_per_msg",
                mode,
                Kind::Daemon.name(),
                Kind::JsonEcho.name(),
                r,
                None,
            );
        }
    }
    if let Some(e) = find(Kind::Echo) {
        for k in [Kind::JsonEcho, Kind::Daemon] {
            if let Some(v) = find(k) {
                let r = v.median() / e.median();
                let _ = writeln!(
                    t,
                    "  {:<18}{:>15.2}x   (for information)",
                    format!("{}/echo", k.name()),
                    r
                );
                out.ratio("pipelined", mode, k.name(), Kind::Echo.name(), r, None);
            }
        }
    }
    out.table(&t);
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

fn orchestrate() -> Res<()> {
    let cfg = Config::load()?;
    let mut out = Out::new("wire")?;
    let started = Instant::now();
    out.header(cfg.cpu, cfg.quick);
    out.record(json!({
        "kind": "meta",
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "allowed_cpus": common::allowed_cpus(), "pin_cpu": cfg.cpu,
        "quick": cfg.quick, "ping_samples": cfg.ping_samples, "latency_rounds": cfg.latency_rounds,
        "tput_rounds": cfg.tput_rounds, "secs_per_round": cfg.secs, "warmup_secs": cfg.warmup_secs,
        "conns": cfg.conns, "depth": cfg.depth, "client_threads": cfg.client_threads,
        "version": abx_broker::VERSION, "loadavg1": common::loadavg(),
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    }));

    for &mode in &cfg.modes {
        let cpu = mode.cpu(cfg.cpu);
        let dir = tempfile::Builder::new()
            .prefix("abx-wire-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let daemon = Server::spawn(Kind::Daemon, dir.path(), cpu)?;
        let echo = Server::spawn(Kind::Echo, dir.path(), cpu)?;
        let json_echo = if cfg.throughput {
            Some(Server::spawn(Kind::JsonEcho, dir.path(), cpu)?)
        } else {
            None
        };
        eprintln!("wire bench: {} servers up", mode.name());
        let pids: Vec<u32> = [Some(&daemon), Some(&echo), json_echo.as_ref()]
            .into_iter()
            .flatten()
            .map(|s| s.s.pid())
            .collect();
        let before = cpu_snap(&pids);
        if cfg.latency {
            let res = run_latency(&cfg, &[&echo, &daemon], cpu)?;
            report_latency(&mut out, &cfg, mode, &res);
        }
        if let Some(json_echo) = &json_echo {
            let res = run_throughput(&cfg, &[&echo, json_echo, &daemon], cpu)?;
            report_throughput(&mut out, &cfg, mode, &res);
        }
        out.noise(mode.name(), before, cpu_snap(&pids));
        for s in [Some(daemon), Some(echo), json_echo].into_iter().flatten() {
            if let Err(e) = s.stop() {
                eprintln!("wire bench: warning: {e}");
            }
        }
    }

    out.finish(started);
    Ok(())
}
