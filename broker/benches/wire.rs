//! Wire bars of DESIGN §13, measured side by side in one run (never asserted):
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
//! `abx_broker::daemon::run` under the temp home in `ABX_BENCH_HOME`; `echo` and `json-echo`
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

use abx_broker::daemon::READY_FD_ENV;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ROLE_ENV: &str = "ABX_BENCH_ROLE";
const HOME_ENV: &str = "ABX_BENCH_HOME";
const SOCKET_ENV: &str = "ABX_BENCH_SOCKET";

type Res<T> = Result<T, String>;

fn main() {
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("daemon") => role_daemon(),
        Ok("echo") => role_echo(false),
        Ok("json-echo") => role_echo(true),
        Ok(other) => {
            eprintln!("wire bench: unknown {ROLE_ENV}={other}");
            std::process::exit(2);
        }
        Err(_) => {
            if let Err(e) = orchestrate() {
                eprintln!("wire bench failed: {e}");
                std::process::exit(1);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Child roles
// ---------------------------------------------------------------------------------------------

/// Exit as soon as our stdin (a pipe held by the bench) closes: a killed or crashed bench never
/// leaves servers behind.
fn exit_with_parent() {
    std::thread::spawn(|| {
        let mut stdin = io::stdin();
        let mut b = [0u8; 64];
        loop {
            match stdin.read(&mut b) {
                Ok(0) | Err(_) => std::process::exit(0),
                Ok(_) => {}
            }
        }
    });
}

fn role_daemon() {
    exit_with_parent();
    let home = PathBuf::from(std::env::var_os(HOME_ENV).expect("ABX_BENCH_HOME is set"));
    match abx_broker::daemon::run(abx_broker::Paths::under(&home), false) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("wire bench daemon: {e}");
            std::process::exit(1);
        }
    }
}

/// The baseline servers: one blocking thread per connection (the cheapest wake-up path there
/// is). `json = false` echoes every complete line as is; `json = true` parses every line into a
/// `serde_json::Value` and writes it re-serialized. Either writes once per read, after every
/// complete line in the read buffer has been handled.
fn role_echo(json: bool) {
    exit_with_parent();
    let socket = PathBuf::from(std::env::var_os(SOCKET_ENV).expect("ABX_BENCH_SOCKET is set"));
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).unwrap_or_else(|e| {
        eprintln!("wire bench echo: bind {}: {e}", socket.display());
        std::process::exit(1);
    });
    signal_ready();
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

fn signal_ready() {
    let Some(fd) = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<RawFd>().ok())
    else {
        return;
    };
    // SAFETY: the bench passed us this fd for exactly this purpose; we own it from here.
    let mut f = unsafe { File::from_raw_fd(fd) };
    let _ = writeln!(f, "ready {}", std::process::id());
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
enum Mode {
    Unpinned,
    Pinned,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Unpinned => "unpinned",
            Mode::Pinned => "pinned",
        }
    }
}

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

fn env_parse<T: std::str::FromStr>(name: &str) -> Res<Option<T>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={v} is not a valid value")),
        _ => Ok(None),
    }
}

impl Config {
    fn load() -> Res<Config> {
        let quick = matches!(std::env::var("ABX_BENCH_QUICK").as_deref(), Ok(v) if !v.is_empty() && v != "0");
        let mut words: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        if let Ok(only) = std::env::var("ABX_BENCH_ONLY") {
            words.extend(
                only.split([',', ' '])
                    .filter(|w| !w.is_empty())
                    .map(str::to_owned),
            );
        }
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
        if !pinned && !unpinned {
            (pinned, unpinned) = (true, true);
        }
        let cpu = match env_parse::<usize>("ABX_BENCH_CPU")? {
            Some(c) => Some(c),
            None => first_allowed_cpu(),
        };
        let mut modes = Vec::new();
        if unpinned {
            modes.push(Mode::Unpinned);
        }
        if pinned {
            if cpu.is_some() {
                modes.push(Mode::Pinned);
            } else {
                eprintln!("wire bench: pinning is not supported here; skipping the pinned runs");
            }
        }
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
// CPU pinning
// ---------------------------------------------------------------------------------------------

/// Restrict the calling thread (or, in `pre_exec`, the child about to exec) to one CPU.
/// Async-signal-safe: no allocation.
#[cfg(target_os = "linux")]
fn pin_current(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET only sets a bit in it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn pin_current(_cpu: usize) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// The CPUs this process may run on.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills the set we pass; CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

fn first_allowed_cpu() -> Option<usize> {
    allowed_cpus().first().copied()
}

// ---------------------------------------------------------------------------------------------
// Noise: CPU time spent by everything but this bench and its servers
// ---------------------------------------------------------------------------------------------

/// A snapshot of the machine's busy and stolen CPU time and of our own processes' CPU time,
/// in clock ticks (Linux `/proc`; `None` elsewhere).
#[derive(Clone, Copy)]
struct CpuSnap {
    at: Instant,
    busy: u64,
    steal: u64,
    ours: u64,
}

fn proc_ticks(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn cpu_snap(children: &[u32]) -> Option<CpuSnap> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    // irq and softirq time is left out: our own socket traffic causes some of it.
    let busy = f.first()? + f.get(1)? + f.get(2)?;
    let steal = *f.get(7).unwrap_or(&0);
    let mut ours = proc_ticks("self")?;
    for pid in children {
        ours += proc_ticks(&pid.to_string()).unwrap_or(0);
    }
    Some(CpuSnap {
        at: Instant::now(),
        busy,
        steal,
        ours,
    })
}

/// (other processes, steal) in CPUs' worth between two snapshots.
fn noise(a: Option<CpuSnap>, b: Option<CpuSnap>) -> Option<(f64, f64)> {
    let (a, b) = (a?, b?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let secs = (b.at - a.at).as_secs_f64().max(1e-3);
    let other = (b.busy - a.busy).saturating_sub(b.ours.saturating_sub(a.ours));
    Some((
        other as f64 / hz / secs,
        (b.steal - a.steal) as f64 / hz / secs,
    ))
}

/// CPU time of every thread of a process so far, in nanoseconds (Linux: from each task's
/// `schedstat`, else clock ticks from `stat`).
fn cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    let mut any = false;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let s = std::fs::read_to_string(t.path().join("schedstat")).ok();
        if let Some(ns) = s.and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok()) {
            total += ns;
            any = true;
        }
    }
    if any {
        return Some(total);
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    proc_ticks(&pid.to_string()).map(|t| t * 1_000_000_000 / hz)
}

fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

// ---------------------------------------------------------------------------------------------
// Servers (children running this same executable)
// ---------------------------------------------------------------------------------------------

struct Server {
    kind: Kind,
    socket: PathBuf,
    child: Child,
}

impl Server {
    fn spawn(kind: Kind, dir: &Path, cpu: Option<usize>) -> Res<Server> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.env(ROLE_ENV, kind.name())
            .env_remove("ABX_HOME")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let socket = match kind {
            Kind::Daemon => {
                let home = dir.join("daemon-home");
                cmd.env(HOME_ENV, &home);
                abx_broker::Paths::under(&home).socket
            }
            Kind::Echo | Kind::JsonEcho => {
                let s = dir.join(format!("{}.sock", kind.name()));
                cmd.env(SOCKET_ENV, &s);
                s
            }
        };
        let (rfd, wfd) = cloexec_pipe().map_err(|e| format!("pipe: {e}"))?;
        // SAFETY: we own rfd from here on; File closes it.
        let ready = unsafe { File::from_raw_fd(rfd) };
        cmd.env(READY_FD_ENV, wfd.to_string());
        // SAFETY: only async-signal-safe calls (fcntl, sched_setaffinity) run after fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(wfd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                if let Some(cpu) = cpu {
                    pin_current(cpu)?;
                }
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        // SAFETY: wfd is ours; the child has its own copy.
        unsafe { libc::close(wfd) };
        let child = spawned.map_err(|e| format!("spawn {}: {e}", kind.name()))?;
        let server = Server {
            kind,
            socket,
            child,
        };
        wait_ready(ready, Duration::from_secs(20))
            .map_err(|e| format!("{} did not start: {e}", kind.name()))?;
        server.check()?;
        Ok(server)
    }

    fn connect(&self) -> Res<UnixStream> {
        UnixStream::connect(&self.socket)
            .map_err(|e| format!("connect {}: {e}", self.socket.display()))
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

    /// Stop: the daemon through `broker/shutdown`, the baselines by closing their stdin; kill
    /// whatever is still running after a grace period.
    fn stop(mut self) -> Res<()> {
        let mut note = Ok(());
        if self.kind == Kind::Daemon {
            let r = self.connect().and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(5)))
                    .map_err(|e| e.to_string())?;
                let line = round_trip(
                    &mut s,
                    b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"broker/shutdown\"}\n",
                )
                .map_err(|e| e.to_string())?;
                let v: Value = serde_json::from_slice(&line).map_err(|e| e.to_string())?;
                if v.get("result").is_some() {
                    Ok(())
                } else {
                    Err(format!("broker/shutdown answered {v}"))
                }
            });
            if let Err(e) = r {
                note = Err(format!("daemon shutdown: {e}"));
            }
        }
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() && note.is_ok() {
                        note = Err(format!("{} exited with {status}", self.kind.name()));
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    note = Err(format!(
                        "{} did not stop in time; killed it",
                        self.kind.name()
                    ));
                    break;
                }
            }
        }
        note
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn cloexec_pipe() -> io::Result<(RawFd, RawFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe fills two fds; we mark both close-on-exec before anything can fork them.
    unsafe {
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        for fd in fds {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok((fds[0], fds[1]))
}

fn wait_ready(mut f: File, timeout: Duration) -> Res<()> {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out waiting for `ready`".into());
        }
        let mut pfd = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e.to_string());
        }
        if r == 0 {
            continue;
        }
        let mut b = [0u8; 64];
        match f.read(&mut b) {
            Ok(0) => return Err("it exited first (see its stderr above)".into()),
            Ok(n) => {
                got.extend_from_slice(&b[..n]);
                if got.contains(&b'\n') {
                    return if got.starts_with(b"ready ") {
                        Ok(())
                    } else {
                        Err(format!("said {:?}", String::from_utf8_lossy(&got)))
                    };
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Client helpers
// ---------------------------------------------------------------------------------------------

fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}

/// `{"jsonrpc":"2.0","id":N,"method":"broker/ping"}\n`
fn push_ping(out: &mut Vec<u8>, id: u64) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    push_u64(out, id);
    out.extend_from_slice(b",\"method\":\"broker/ping\"}\n");
}

/// Write one request line and read one reply line (without its newline).
fn round_trip(s: &mut UnixStream, req: &[u8]) -> io::Result<Vec<u8>> {
    s.write_all(req)?;
    let mut buf = vec![0u8; 4096];
    let mut got = 0;
    loop {
        if got == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let n = s.read(&mut buf[got..])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
        if let Some(i) = buf[..got].iter().position(|&b| b == b'\n') {
            buf.truncate(i);
            return Ok(buf);
        }
    }
}

fn pin_if(cpu: Option<usize>) -> Res<()> {
    match cpu {
        Some(c) => pin_current(c).map_err(|e| format!("pin to CPU {c}: {e}")),
        None => Ok(()),
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
        let n = self.ns.len();
        let i = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
        self.ns[i] as f64 / 1000.0
    }
    fn mean(&self) -> f64 {
        self.ns.iter().sum::<u64>() as f64 / self.ns.len() as f64 / 1000.0
    }
}

/// One timed round trip: write the request, read until the reply's newline.
fn timed_ping(s: &mut UnixStream, req: &[u8], buf: &mut [u8]) -> Res<Duration> {
    let t0 = Instant::now();
    s.write_all(req).map_err(|e| e.to_string())?;
    let mut got = 0;
    loop {
        let n = s.read(&mut buf[got..]).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the server closed the connection".into());
        }
        got += n;
        if buf[got - 1] == b'\n' {
            return Ok(t0.elapsed());
        }
        if got == buf.len() {
            return Err("reply too long".into());
        }
    }
}

/// One client, one request at a time, servers interleaved in rounds (alternating which goes
/// first) so drift in the machine hits both alike.
fn run_latency(cfg: &Config, servers: &[&Server], cpu: Option<usize>) -> Res<Vec<Latency>> {
    let kinds: Vec<Kind> = servers.iter().map(|s| s.kind).collect();
    let mut streams = servers
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
                    let dt = timed_ping(&mut streams[k], &req, &mut buf)
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

fn median(v: &[f64]) -> Option<f64> {
    let mut r = v.to_vec();
    r.sort_by(f64::total_cmp);
    let n = r.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(r[n / 2]),
        _ => Some((r[n / 2 - 1] + r[n / 2]) / 2.0),
    }
}

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
        self.rates.iter().copied().fold(f64::INFINITY, f64::min)
    }
    fn max(&self) -> f64 {
        self.rates.iter().copied().fold(0.0, f64::max)
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
        let path = server.socket.clone();
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
        let pid = server.child.id();
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

enum JsonSink {
    None,
    Stdout,
    File(File),
}

struct Out {
    json: JsonSink,
    table_to_stderr: bool,
    bars: Vec<(String, Mode, f64, &'static str, f64)>,
}

impl Out {
    fn new() -> Res<Out> {
        let (json, table_to_stderr) = match std::env::var("ABX_BENCH_JSON").as_deref() {
            Ok("") | Ok("0") | Err(_) => (JsonSink::None, false),
            Ok("1") | Ok("-") => (JsonSink::Stdout, true),
            Ok(path) => (
                JsonSink::File(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map_err(|e| format!("ABX_BENCH_JSON={path}: {e}"))?,
                ),
                false,
            ),
        };
        Ok(Out {
            json,
            table_to_stderr,
            bars: Vec::new(),
        })
    }

    fn table(&self, text: &str) {
        if self.table_to_stderr {
            eprint!("{text}");
        } else {
            print!("{text}");
            let _ = io::stdout().flush();
        }
    }

    fn record(&mut self, mut v: Value) {
        v["bench"] = json!("wire");
        let line = format!("{v}\n");
        match &mut self.json {
            JsonSink::None => {}
            JsonSink::Stdout => {
                print!("{line}");
                let _ = io::stdout().flush();
            }
            JsonSink::File(f) => {
                let _ = f.write_all(line.as_bytes());
            }
        }
    }

    fn ratio(
        &mut self,
        figure: &str,
        mode: Mode,
        num: Kind,
        den: Kind,
        value: f64,
        bar: Option<(&'static str, f64)>,
    ) {
        let ok = bar.map(|(cmp, b)| meets(value, cmp, b));
        self.record(json!({
            "kind": "ratio", "figure": figure, "mode": mode.name(),
            "num": num.name(), "den": den.name(), "value": round3(value),
            "bar": bar.map(|b| b.1), "cmp": bar.map(|b| b.0), "ok": ok,
        }));
        if let Some((cmp, b)) = bar {
            self.bars.push((
                format!("{figure} {}/{}", num.name(), den.name()),
                mode,
                value,
                cmp,
                b,
            ));
        }
    }
}

fn meets(value: f64, cmp: &str, bar: f64) -> bool {
    match cmp {
        "<=" => value <= bar,
        _ => value >= bar,
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "MISS"
    }
}

fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

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
            Kind::Daemon,
            Kind::Echo,
            p50,
            Some(("<=", 2.0)),
        );
        out.ratio(
            "ping_rtt_p99",
            mode,
            Kind::Daemon,
            Kind::Echo,
            p99,
            Some(("<=", 3.0)),
        );
        out.ratio("ping_rtt_p999", mode, Kind::Daemon, Kind::Echo, p999, None);
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
            Kind::Daemon,
            Kind::JsonEcho,
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
                Kind::Daemon,
                Kind::JsonEcho,
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
                out.ratio("pipelined", mode, k, Kind::Echo, r, None);
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
    let mut out = Out::new()?;
    let started = Instant::now();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let allowed = allowed_cpus();
    out.table(&format!(
        "abx broker wire bench: {cpus} CPUs available{}, pinned runs on CPU {}{}; load average {}\n\
         (ratios compare each figure only with its baseline measured the same way in this run)\n",
        if allowed.is_empty() {
            String::new()
        } else {
            format!(" (allowed: {allowed:?})")
        },
        cfg.cpu.map_or_else(|| "-".to_string(), |c| c.to_string()),
        if cfg.quick {
            "; QUICK run (ABX_BENCH_QUICK)"
        } else {
            ""
        },
        loadavg().map_or_else(|| "-".to_string(), |l| format!("{l:.2}")),
    ));
    out.record(json!({
        "kind": "meta", "cpus": cpus, "allowed_cpus": allowed, "pin_cpu": cfg.cpu,
        "quick": cfg.quick, "ping_samples": cfg.ping_samples, "latency_rounds": cfg.latency_rounds,
        "tput_rounds": cfg.tput_rounds, "secs_per_round": cfg.secs, "warmup_secs": cfg.warmup_secs,
        "conns": cfg.conns, "depth": cfg.depth, "client_threads": cfg.client_threads,
        "version": abx_broker::VERSION, "loadavg1": loadavg(),
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    }));

    for &mode in &cfg.modes {
        let cpu = match mode {
            Mode::Unpinned => None,
            Mode::Pinned => cfg.cpu,
        };
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
            .map(|s| s.child.id())
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
        if let Some((other, steal)) = noise(before, cpu_snap(&pids)) {
            out.table(&format!(
                "\n  [{}] CPU used by other processes during these figures: {other:.2} CPUs' worth, stolen: {steal:.2}{}\n",
                mode.name(),
                if other > 0.05 || steal > 0.05 { "  <- figures disturbed, rerun on a quiet machine" } else { "" }
            ));
            out.record(json!({
                "kind": "noise", "mode": mode.name(),
                "other_cpus": round3(other), "steal_cpus": round3(steal),
            }));
        }
        for s in [Some(daemon), Some(echo), json_echo].into_iter().flatten() {
            if let Err(e) = s.stop() {
                eprintln!("wire bench: warning: {e}");
            }
        }
    }

    let mut t = String::from("\nbars (DESIGN §13)\n");
    let _ = writeln!(
        t,
        "  {:<30}{:<10}{:>9}{:>10}  verdict",
        "figure", "mode", "ratio", "bar"
    );
    for (name, mode, v, cmp, bar) in &out.bars {
        let _ = writeln!(
            t,
            "  {:<30}{:<10}{:>8.2}x{:>10}  {}",
            name,
            mode.name(),
            v,
            format!("{cmp} {bar}x"),
            verdict(meets(*v, cmp, *bar))
        );
    }
    let _ = writeln!(t, "\ntotal {:.1} s", started.elapsed().as_secs_f64());
    out.table(&t);
    Ok(())
}
