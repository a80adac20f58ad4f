//! The proxy's costs, measured side by side with a direct loopback connection in the same run
//! (reported, never asserted; docs/performance.md's house style):
//!
//! 1. Connection setup, p50 and p99: connect, send a TLS ClientHello for `echo.example`, read
//!    it echoed back; directly to the upstream, and through the proxy (CONNECT by name: the
//!    static resolver, the guard, the policy, the ClientHello's server name checked, then the
//!    splice). The bar is +1 ms over a direct connect (there: in `internet` mode).
//! 2. Throughput of one download (default 1 GiB) through a CONNECT splice against the same
//!    download directly. The bar is 0.8x (there: against `internet` mode, pasta).
//!
//! Everything runs in this process on loopback: the upstream on 127.0.0.2, the proxy on
//! 127.0.0.1 (the test-only guard exemption lets 127.0.0.2 through), one tokio runtime with
//! two workers for all of it.
//!
//! Usage: `cargo bench -p abx-egress --bench egress`
//!
//! Environment (all optional): `ABX_BENCH_QUICK=1` (a smoke run: 64 MiB, 300 samples),
//! `ABX_BENCH_BYTES` (the download's size, default 1 GiB), `ABX_BENCH_SAMPLES` (setup
//! samples per side, default 3000), `ABX_BENCH_ROUNDS` (downloads per side, alternated,
//! default 3: the best of each side is reported), `ABX_BENCH_SPLICE_BUFFER` (the proxy's
//! splice buffer each way, default `Limits::default()`'s).

use abx_egress::{Config, Egress, Guard, Limits, Policy, Sets, StaticResolver};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const UPSTREAM_IP: &str = "127.0.0.2";

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A ClientHello record carrying `sni` (minimal but well formed).
fn client_hello(sni: &str) -> Vec<u8> {
    let mut list = vec![0u8];
    list.extend_from_slice(&(sni.len() as u16).to_be_bytes());
    list.extend_from_slice(sni.as_bytes());
    let mut ext = (list.len() as u16).to_be_bytes().to_vec();
    ext.extend_from_slice(&list);
    let mut exts = 0u16.to_be_bytes().to_vec();
    exts.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    exts.extend_from_slice(&ext);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut msg = vec![1];
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    msg.extend_from_slice(&body);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    rec.extend_from_slice(&msg);
    rec
}

/// Echoes what it reads.
async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind((UPSTREAM_IP.parse::<IpAddr>().unwrap(), 0))
        .await
        .unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    a
}

/// Reads the first bytes (a ClientHello), then sends `bytes` zeros and closes.
async fn source_server(bytes: u64) -> SocketAddr {
    let l = TcpListener::bind((UPSTREAM_IP.parse::<IpAddr>().unwrap(), 0))
        .await
        .unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut b = [0u8; 4096];
                if s.read(&mut b).await.unwrap_or(0) == 0 {
                    return;
                }
                let chunk = vec![0u8; 256 * 1024];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
                let _ = s.shutdown().await;
            });
        }
    });
    a
}

async fn proxy(guard: Guard) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    let ip: IpAddr = UPSTREAM_IP.parse().unwrap();
    let resolver = StaticResolver::new()
        .with("echo.example", &[ip])
        .with("source.example", &[ip]);
    let policy = Policy::from_patterns(
        "sandbox/create",
        &["echo.example:*", "source.example:*"],
        &[],
        &Sets::new(),
        &guard,
    )
    .unwrap();
    let e = Egress::new(
        policy,
        Config {
            sandbox: "bench".into(),
            guard,
            resolver: Arc::new(resolver),
            limits: Limits {
                splice_buffer: env_num(
                    "ABX_BENCH_SPLICE_BUFFER",
                    Limits::default().splice_buffer as u64,
                ) as usize,
                ..Limits::default()
            },
            tls: Default::default(),
        },
    );
    tokio::spawn(e.serve_tcp(l));
    a
}

/// Open a connection to `host`:`port` (through `via` when given) and send `hello`.
async fn open(via: Option<SocketAddr>, host: &str, to: SocketAddr, hello: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(via.unwrap_or(to)).await.unwrap();
    s.set_nodelay(true).unwrap();
    if via.is_some() {
        s.write_all(format!("CONNECT {host}:{} HTTP/1.1\r\n\r\n", to.port()).as_bytes())
            .await
            .unwrap();
        let mut head = vec![];
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(s.read(&mut b).await.unwrap(), 1, "the proxy answers");
            head.push(b[0]);
        }
        assert!(
            head.starts_with(b"HTTP/1.1 200 "),
            "{}",
            String::from_utf8_lossy(&head)
        );
    }
    s.write_all(hello).await.unwrap();
    s
}

async fn setup_sample(via: Option<SocketAddr>, to: SocketAddr, hello: &[u8]) -> Duration {
    let t = Instant::now();
    let mut s = open(via, "echo.example", to, hello).await;
    let mut back = vec![0u8; hello.len()];
    s.read_exact(&mut back).await.unwrap();
    t.elapsed()
}

async fn download(via: Option<SocketAddr>, to: SocketAddr, hello: &[u8], bytes: u64) -> f64 {
    let t = Instant::now();
    let mut s = open(via, "source.example", to, hello).await;
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    assert_eq!(got, bytes);
    bytes as f64 / t.elapsed().as_secs_f64() / (1u64 << 30) as f64
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let quick = std::env::var_os("ABX_BENCH_QUICK").is_some();
    let bytes = env_num("ABX_BENCH_BYTES", if quick { 64 << 20 } else { 1 << 30 });
    let samples = env_num("ABX_BENCH_SAMPLES", if quick { 300 } else { 3000 }) as usize;
    let rounds = env_num("ABX_BENCH_ROUNDS", 3).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let up: IpAddr = UPSTREAM_IP.parse().unwrap();
        let guard = Guard::new(abx_egress::host_addresses().unwrap_or_default(), vec![])
            .allow_loopback_for_tests(&[up])
            .unwrap();
        let echo = echo_server().await;
        let source = source_server(bytes).await;
        let via = proxy(guard).await;
        let hello = client_hello("echo.example");
        let hello_src = client_hello("source.example");

        // Warm up both paths, then alternate samples so both see the same machine.
        for _ in 0..100 {
            setup_sample(None, echo, &hello).await;
            setup_sample(Some(via), echo, &hello).await;
        }
        let (mut direct, mut proxied) = (vec![], vec![]);
        for _ in 0..samples {
            direct.push(setup_sample(None, echo, &hello).await);
            proxied.push(setup_sample(Some(via), echo, &hello).await);
        }
        let (d50, d99) = (pct(&mut direct, 0.5), pct(&mut direct, 0.99));
        let (p50, p99) = (pct(&mut proxied, 0.5), pct(&mut proxied, 0.99));

        let (mut best_d, mut best_p) = (0f64, 0f64);
        for _ in 0..rounds {
            best_d = best_d.max(download(None, source, &hello_src, bytes).await);
            best_p = best_p.max(download(Some(via), source, &hello_src, bytes).await);
        }

        println!("abx-egress bench: {samples} setups per side, {rounds} downloads of {} MiB per side (best), unpinned, debug={}", bytes >> 20, cfg!(debug_assertions));
        println!("| figure | baseline (direct loopback) | through the proxy | added | ratio | bar (issue 44) |");
        println!("|---|---|---|---|---|---|");
        println!(
            "| connection setup + ClientHello echo, p50 | {:.1} us | {:.1} us | +{:.1} us | {:.2}x | +1 ms |",
            us(d50), us(p50), us(p50) - us(d50), us(p50) / us(d50)
        );
        println!(
            "| connection setup + ClientHello echo, p99 | {:.1} us | {:.1} us | +{:.1} us | {:.2}x | +1 ms |",
            us(d99), us(p99), us(p99) - us(d99), us(p99) / us(d99)
        );
        println!(
            "| download through a CONNECT splice | {best_d:.2} GiB/s | {best_p:.2} GiB/s | - | {:.2}x | >= 0.8x |",
            best_p / best_d
        );
    });
}
