//! The egress proxy's bars (issue 44, "Bench"), through a real daemon and real `local`
//! sandboxes:
//!
//! - **Throughput**: a download (1 GiB; `ABX_BENCH_QUICK=1`: 128 MiB; `ABX_BENCH_EGRESS_BYTES`)
//!   by `curl -o /dev/null` inside a policy sandbox, through its proxy (`HTTP_PROXY`: a plain
//!   HTTP request the proxy forwards; and `curl -p`: a CONNECT tunnel the proxy splices),
//!   against the same download inside an `internet` sandbox (pasta). Bar: >= 0.8x.
//! - **Connection setup**: 1,000 sequential `connect + CONNECT host:port + 200` (the proxy
//!   resolves the name, checks it, connects to the upstream, answers 200) from a small Python
//!   client inside the policy sandbox, against 1,000 direct `connect` to the same server from
//!   the `internet` sandbox. Bar: the proxy adds at most 1 ms, at p50 and at p99.
//!
//! **Where the server is.** Traffic stays on this machine: the bench makes a network
//! namespace (`ip netns add`) joined to the host by a veth pair on 198.18.77.0/24 (RFC 2544's
//! benchmarking range; the bench refuses to run there if the host uses any of it), and its
//! HTTP server listens inside, on 198.18.77.2, from threads of the bench that entered that
//! namespace (`setns`). The `internet` sandbox reaches it through pasta (whose connects leave
//! from the host's namespace, routed to the veth), the policy sandbox through the daemon's
//! proxy (which resolves `bench.example` to it: the daemon's test-only settings
//! `ABX_TEST_HOOKS=1`, `ABX_TEST_EGRESS_RESOLVE`). Both use the same server, the same client,
//! the same path from the host's namespace on. Without root (no `ip netns`), or with
//! `ABX_BENCH_EGRESS_LOOPBACK=1`, the server listens on the host's 127.0.0.2 instead (pasta
//! refuses the host's loopback by design: `--no-map-gw`), and the baseline is the same client
//! run **on the host**, straight to 127.0.0.2: not a sandbox, so the ratio also counts what a
//! sandbox costs; the output says so.
//!
//! Each figure unpinned (daemon, sandboxes, pasta and server free) and pinned (all of them on
//! one CPU: the daemon pinned, its children inherit, the server's threads pinned), ratios
//! compared only within a mode. Never asserted.
//!
//! Usage: `cargo bench -p abx-broker --bench egress [-- --pinned|--unpinned]`
//! (`scripts/bench egress`). Environment (optional): `ABX_BENCH_QUICK=1`,
//! `ABX_BENCH_EGRESS_BYTES` (like `1G`, `256M`), `ABX_BENCH_ROUNDS` (downloads of each kind,
//! alternating; default 3), `ABX_BENCH_CONNECTS` (default 1000; quick 300),
//! `ABX_BENCH_EGRESS_LOOPBACK=1`, `ABX_BENCH_CPU`, `ABX_BENCH_JSON`.

mod common;
use common::{
    cpu_snap, env_bytes, env_parse, human_bytes, median, pin_cpu, pin_current, Out, Res, Spawned,
    UnixRpc,
};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

/// The name the proxy resolves to the server (test-only resolver of the daemon).
const NAME: &str = "bench.example";
/// The veth pair's network (RFC 2544's benchmarking range, 198.18.0.0/15).
const NET_HOST: &str = "198.18.77.1";
const NET_SERVER: &str = "198.18.77.2";

fn main() {
    common::main("egress", &[], orchestrate);
}

// ---------------------------------------------------------------------------------------------
// The server: HTTP/1.1, `GET /bytes/N` answers N zero bytes; any other connection is held
// until the client closes it (the CONNECT measurements open and close).
// ---------------------------------------------------------------------------------------------

fn serve(l: TcpListener, cpu: Option<usize>) {
    if let Some(c) = cpu {
        let _ = pin_current(c);
    }
    for conn in l.incoming() {
        let Ok(conn) = conn else { continue };
        // Threads inherit this one's namespace and affinity.
        std::thread::spawn(move || {
            let _ = conn.set_nodelay(true);
            let mut r = BufReader::new(match conn.try_clone() {
                Ok(c) => c,
                Err(_) => return,
            });
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return; // opened and closed: a connect measurement
            }
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            let n: u64 = line
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.rsplit('/').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let mut w = conn;
            let _ = write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
            );
            let buf = vec![0u8; 256 * 1024];
            let mut left = n;
            while left > 0 {
                let k = left.min(buf.len() as u64) as usize;
                if w.write_all(&buf[..k]).is_err() {
                    return;
                }
                left -= k as u64;
            }
            let _ = w.flush();
            // Wait for the client to close (no RST on unread bytes).
            let mut sink = [0u8; 512];
            while matches!(r.get_mut().read(&mut sink), Ok(n) if n > 0) {}
        });
    }
}

/// A network namespace joined to the host by a veth pair; removed on drop.
struct Netns {
    name: String,
}

fn ip(args: &[&str]) -> Res<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    fn create() -> Res<Netns> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: cannot make a network namespace".into());
        }
        let used = Command::new("ip")
            .args(["-o", "addr"])
            .output()
            .map_err(|e| format!("ip -o addr: {e}"))?;
        let routes = Command::new("ip")
            .args(["route"])
            .output()
            .map_err(|e| format!("ip route: {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&used.stdout),
            String::from_utf8_lossy(&routes.stdout)
        );
        if text.contains("198.18.") || text.contains("198.19.") {
            return Err("the host uses 198.18.0.0/15 already".into());
        }
        let pid = std::process::id();
        let ns = Netns {
            name: format!("abx-bench-egress-{pid}"),
        };
        let (h, n) = (format!("abxe{pid}h"), format!("abxe{pid}n"));
        ip(&["netns", "add", &ns.name])?;
        ip(&[
            "link", "add", &h, "type", "veth", "peer", "name", &n, "netns", &ns.name,
        ])?;
        ip(&["addr", "add", &format!("{NET_HOST}/24"), "dev", &h])?;
        ip(&["link", "set", &h, "up"])?;
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{NET_SERVER}/24"),
            "dev",
            &n,
        ])?;
        ip(&["-n", &ns.name, "link", "set", &n, "up"])?;
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A listener on `addr` inside the namespace: made by a thread that entered it (a socket
    /// keeps the namespace it was made in), which then serves it.
    fn serve(&self, addr: &str, cpu: Option<usize>) -> Res<u16> {
        let path = format!("/run/netns/{}", self.name);
        let f = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        let addr = addr.to_owned();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: a valid namespace fd; this thread alone changes namespace, and stays
            // there (it and the threads it makes only serve the listener).
            if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                let _ = tx.send(Err(format!("setns: {}", std::io::Error::last_os_error())));
                return;
            }
            match TcpListener::bind((addr.as_str(), 0)) {
                Ok(l) => {
                    let _ = tx.send(Ok(l.local_addr().map(|a| a.port()).unwrap_or(0)));
                    serve(l, cpu);
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("bind {addr} in the namespace: {e}")));
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(10))
            .map_err(|e| format!("server thread: {e}"))?
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // The veth pair goes with the namespace.
        let _ = ip(&["netns", "del", &self.name]);
    }
}

fn serve_loopback(cpu: Option<usize>) -> Res<u16> {
    let l = TcpListener::bind("127.0.0.2:0").map_err(|e| format!("bind 127.0.0.2: {e}"))?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    std::thread::spawn(move || serve(l, cpu));
    Ok(port)
}

// ---------------------------------------------------------------------------------------------
// Clients: in a sandbox (exec/run) or on the host
// ---------------------------------------------------------------------------------------------

/// The Python client of the connect measurements: `proxy` (connect to the proxy, CONNECT,
/// read the 200) or `direct` (connect); prints the times in ns after 20 warm-up rounds.
const CONNECT_PY: &str = r#"import os,socket,sys,time
mode,n,host,port=sys.argv[1],int(sys.argv[2]),sys.argv[3],int(sys.argv[4])
if mode=='proxy':
    pa=('127.0.0.1',int(os.environ['HTTP_PROXY'].rsplit(':',1)[1]))
    req=('CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n'%(host,port,host,port)).encode()
out=[]
for i in range(n+20):
    t=time.perf_counter_ns()
    if mode=='proxy':
        s=socket.create_connection(pa)
        s.sendall(req)
        b=b''
        while b'\r\n\r\n' not in b:
            c=s.recv(4096)
            if not c: sys.exit('the proxy closed: %r'%b)
            b+=c
        if not b.startswith(b'HTTP/1.1 200'): sys.exit('the proxy answered %r'%b[:200])
    else:
        s=socket.create_connection((host,port))
    d=time.perf_counter_ns()-t
    s.close()
    if i>=20: out.append(d)
print(' '.join(map(str,out)))
"#;

enum Place {
    Sandbox(String),
    Host,
}

struct Clients<'a> {
    rpc: &'a mut UnixRpc,
    cpu: Option<usize>,
}

impl Clients<'_> {
    fn sh(&mut self, at: &Place, cmd: &str) -> Res<String> {
        match at {
            Place::Sandbox(id) => {
                let v = self.rpc.call(
                    "exec/run",
                    json!({"sandbox": id, "command": cmd, "timeout": 1800}),
                )?;
                if v["exitCode"] != 0 {
                    return Err(format!("in {id}: {cmd}: {v}"));
                }
                Ok(v["stdout"].as_str().unwrap_or("").to_owned())
            }
            Place::Host => {
                let mut c = Command::new("sh");
                c.args(["-c", cmd]);
                common::pin_cmd(&mut c, self.cpu);
                let o = c.output().map_err(|e| format!("sh -c {cmd}: {e}"))?;
                if !o.status.success() {
                    return Err(format!(
                        "on the host: {cmd}: {}",
                        String::from_utf8_lossy(&o.stderr)
                    ));
                }
                Ok(String::from_utf8_lossy(&o.stdout).into_owned())
            }
        }
    }

    /// One download: bytes per second (curl's own size and time).
    fn download(&mut self, at: &Place, args: &str, url: &str, bytes: u64) -> Res<f64> {
        let out = self.sh(
            at,
            &format!("curl -sS {args} -o /dev/null -w '%{{size_download}} %{{time_total}}' {url}"),
        )?;
        let mut it = out.split_whitespace();
        let got: u64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        let secs: f64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        if got != bytes || secs <= 0.0 {
            return Err(format!("download {url}: curl said {out:?}"));
        }
        Ok(bytes as f64 / secs)
    }

    fn connects(&mut self, at: &Place, args: &str) -> Res<Vec<u64>> {
        let out = self.sh(at, &format!("python3 /tmp/abx-connect.py {args}"))?;
        let mut v: Vec<u64> = out
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.is_empty() {
            return Err(format!("connect client printed {out:?}"));
        }
        v.sort_unstable();
        Ok(v)
    }
}

fn pct_ms(sorted: &[u64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1e6
}

fn gib(bps: f64) -> f64 {
    bps / (1u64 << 30) as f64
}

// ---------------------------------------------------------------------------------------------
// The bench
// ---------------------------------------------------------------------------------------------

fn orchestrate() -> Res<()> {
    let quick = common::quick();
    let bytes =
        env_bytes("ABX_BENCH_EGRESS_BYTES")?.unwrap_or(if quick { 128 << 20 } else { 1 << 30 });
    let rounds = env_parse::<usize>("ABX_BENCH_ROUNDS")?.unwrap_or(3).max(1);
    let connects = env_parse::<usize>("ABX_BENCH_CONNECTS")?
        .unwrap_or(if quick { 300 } else { 1000 })
        .max(10);
    let args: Vec<String> = std::env::args().collect();
    let cpu = pin_cpu()?;
    let modes = common::modes(
        "egress",
        args.iter().any(|a| a == "--pinned"),
        args.iter().any(|a| a == "--unpinned"),
        cpu,
    );
    let mut out = Out::new("egress")?;
    let started = Instant::now();
    out.header(cpu, quick);

    let force_loopback = env_parse::<u8>("ABX_BENCH_EGRESS_LOOPBACK")?.unwrap_or(0) == 1;
    let netns = if force_loopback {
        None
    } else {
        match Netns::create() {
            Ok(n) => Some(n),
            Err(e) => {
                out.table(&format!(
                    "egress bench: no network namespace for the server ({e}): falling back to a server on 127.0.0.2 and a baseline run on the host\n"
                ));
                None
            }
        }
    };
    let (server_ip, baseline_name) = match &netns {
        Some(_) => (
            NET_SERVER,
            "the same client in an `internet` sandbox (pasta), server in a namespace of the bench",
        ),
        None => (
            "127.0.0.2",
            "the same client on the host, straight to 127.0.0.2 (no sandbox: no honest `internet` baseline here)",
        ),
    };
    out.table(&format!(
        "server {server_ip} ({}); download {} x {rounds} each way; {connects} connects each way\n\
         baseline: {baseline_name}\n",
        if netns.is_some() {
            "inside a network namespace, veth to the host on 198.18.77.0/24"
        } else {
            "host loopback"
        },
        human_bytes(bytes),
    ));
    out.record(
        json!({"kind": "meta", "figure": "egress", "baseline": baseline_name,
        "server": server_ip, "bytes": bytes, "rounds": rounds, "connects": connects,
        "load": common::loadavg()}),
    );

    for mode in modes {
        let mcpu = mode.cpu(cpu);
        // Each mode its own server (pinned or not) and daemon.
        let port = match &netns {
            Some(n) => n.serve(NET_SERVER, mcpu)?,
            None => serve_loopback(mcpu)?,
        };
        let dir = tempfile::Builder::new()
            .prefix("abx-egress-bench-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let resolve = format!("{NAME}={server_ip}");
        let mut env = vec![
            ("ABX_TEST_HOOKS", "1"),
            ("ABX_TEST_EGRESS_RESOLVE", resolve.as_str()),
        ];
        if netns.is_none() {
            env.push(("ABX_TEST_EGRESS_LOOPBACK", "127.0.0.2"));
        }
        let daemon = Spawned::daemon(&dir.path().join("home"), mcpu, &env)?;
        let mut rpc = daemon.rpc()?;
        let create = |rpc: &mut UnixRpc, network: Value| -> Res<String> {
            let v = rpc.call(
                "sandbox/create",
                json!({"provider": "local", "network": network, "timeout": 7200}),
            )?;
            v["id"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("sandbox/create answered {v}"))
        };
        let policy = create(
            &mut rpc,
            json!({"allow": [format!("{NAME}:{port}"), format!("{server_ip}:{port}")]}),
        )?;
        let base = match &netns {
            Some(_) => Place::Sandbox(create(&mut rpc, json!("internet"))?),
            None => Place::Host,
        };
        let proxied = Place::Sandbox(policy.clone());
        for at in [&proxied, &base] {
            match at {
                Place::Sandbox(id) => {
                    rpc.call(
                        "files/write",
                        json!({"sandbox": id, "path": "/tmp/abx-connect.py", "data": CONNECT_PY}),
                    )?;
                }
                Place::Host => std::fs::write("/tmp/abx-connect.py", CONNECT_PY)
                    .map_err(|e| format!("/tmp/abx-connect.py: {e}"))?,
            }
        }
        let mut cl = Clients {
            rpc: &mut rpc,
            cpu: mcpu,
        };
        let url_name = format!("http://{NAME}:{port}/bytes/{bytes}");
        let url_ip = format!("http://{server_ip}:{port}/bytes/{bytes}");
        // Warm: each path once, small.
        let small = 1u64 << 20;
        cl.download(
            &proxied,
            "",
            &format!("http://{NAME}:{port}/bytes/{small}"),
            small,
        )?;
        cl.download(
            &base,
            "--noproxy '*'",
            &format!("http://{server_ip}:{port}/bytes/{small}"),
            small,
        )?;

        let before = cpu_snap(&[daemon.pid()]);
        let load0 = common::loadavg();
        let (mut fwd, mut tun, mut direct) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            fwd.push(cl.download(&proxied, "", &url_name, bytes)?);
            direct.push(cl.download(&base, "--noproxy '*'", &url_ip, bytes)?);
            // CONNECT to the address (a CONNECT to a name must carry TLS: the SNI check).
            tun.push(cl.download(&proxied, "-p", &url_ip, bytes)?);
        }
        let pl = cl.connects(&proxied, &format!("proxy {connects} {NAME} {port}"))?;
        let dl = cl.connects(&base, &format!("direct {connects} {server_ip} {port}"))?;
        let after = cpu_snap(&[daemon.pid()]);
        let load1 = common::loadavg();

        let (mf, mt, md) = (
            median(&fwd).unwrap_or(0.0),
            median(&tun).unwrap_or(0.0),
            median(&direct).unwrap_or(f64::INFINITY),
        );
        let mut t = format!(
            "\n[{}] download of {} (median of {rounds}; GiB/s), load average {} -> {}\n",
            mode.name(),
            human_bytes(bytes),
            load0.map_or("-".into(), |l| format!("{l:.2}")),
            load1.map_or("-".into(), |l| format!("{l:.2}")),
        );
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{:.2}", gib(*x)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        t.push_str(&format!(
            "  through the proxy, HTTP forwarded   {:>7.2}   ({})\n",
            gib(mf),
            list(&fwd)
        ));
        t.push_str(&format!(
            "  through the proxy, CONNECT tunnel   {:>7.2}   ({})\n",
            gib(mt),
            list(&tun)
        ));
        t.push_str(&format!(
            "  baseline                            {:>7.2}   ({})\n",
            gib(md),
            list(&direct)
        ));
        let (rf, rt) = (mf / md, mt / md);
        t.push_str(&format!(
            "  ratio forwarded/baseline {rf:.2}x, tunnel/baseline {rt:.2}x (bar >= 0.8x: {}, {})\n",
            if rf >= 0.8 { "met" } else { "MISS" },
            if rt >= 0.8 { "met" } else { "MISS" },
        ));
        let (p50p, p99p, p50d, p99d) = (
            pct_ms(&pl, 0.5),
            pct_ms(&pl, 0.99),
            pct_ms(&dl, 0.5),
            pct_ms(&dl, 0.99),
        );
        t.push_str(&format!(
            "[{}] connection setup, {connects} sequential (ms): p50 / p99\n\
             \x20 connect + CONNECT + 200 (proxy)      {p50p:>7.3} / {p99p:>7.3}\n\
             \x20 connect (baseline)                   {p50d:>7.3} / {p99d:>7.3}\n\
             \x20 added by the proxy                   {:>7.3} / {:>7.3}  (bar <= +1 ms: {}, {})\n",
            mode.name(),
            p50p - p50d,
            p99p - p99d,
            if p50p - p50d <= 1.0 { "met" } else { "MISS" },
            if p99p - p99d <= 1.0 { "met" } else { "MISS" },
        ));
        out.table(&t);
        out.record(
            json!({"kind": "throughput", "figure": "egress_download", "mode": mode.name(),
            "bytes": bytes, "baseline": baseline_name,
            "forwarded_bytes_per_s": fwd, "tunnel_bytes_per_s": tun, "baseline_bytes_per_s": direct,
            "median_forwarded_gib_per_s": gib(mf), "median_tunnel_gib_per_s": gib(mt),
            "median_baseline_gib_per_s": gib(md), "load": [load0, load1]}),
        );
        out.record(json!({"kind": "latency", "figure": "egress_connect", "mode": mode.name(),
            "n": connects, "baseline": baseline_name,
            "proxy_p50_ms": p50p, "proxy_p99_ms": p99p, "baseline_p50_ms": p50d, "baseline_p99_ms": p99d,
            "load": [load0, load1]}));
        out.ratio(
            "egress_download_forwarded",
            mode,
            "proxy",
            "baseline",
            rf,
            Some((">=", 0.8)),
        );
        out.ratio(
            "egress_download_tunnel",
            mode,
            "proxy",
            "baseline",
            rt,
            Some((">=", 0.8)),
        );
        out.absolute(
            "egress connect setup added, p50",
            mode.name(),
            (p50p - p50d) * 1000.0,
            "us",
            ("<=", 1000.0),
        );
        out.absolute(
            "egress connect setup added, p99",
            mode.name(),
            (p99p - p99d) * 1000.0,
            "us",
            ("<=", 1000.0),
        );
        out.noise(&format!("egress {}", mode.name()), before, after);
        for at in [&proxied, &base] {
            match at {
                Place::Sandbox(id) => {
                    let _ = rpc.call("sandbox/kill", json!({"sandbox": id}));
                }
                Place::Host => {
                    let _ = std::fs::remove_file("/tmp/abx-connect.py");
                }
            }
        }
        if let Err(e) = daemon.stop() {
            eprintln!("egress bench: warning: {e}");
        }
    }
    drop(netns);
    out.finish(started);
    let _ = std::io::stdout().flush();
    Ok(())
}
