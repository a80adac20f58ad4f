//! What the broker's benches share (`mod common;` in each of them):
//!
//! - **Roles.** A bench re-executes itself as its servers: `ABX_BENCH_ROLE=daemon` runs
//!   `abx_broker::socket::run` under the home in `ABX_BENCH_HOME`; a bench may add roles of its
//!   own (a baseline server on the socket in `ABX_BENCH_SOCKET`). Each child says `ready <pid>`
//!   on the fd named by `ABX_READY_FD` and exits when its stdin closes, so a dying bench leaves
//!   nothing behind ([`main`], [`Spawned`]).
//! - **Configuration** from the environment and the positional filters ([`env_parse`],
//!   [`quick`], [`filter_words`], [`Mode`], [`modes`]).
//! - **Pinning** to one CPU ([`pin_current`], [`pin_if`], [`pin_cmd`]).
//! - **Noise**: CPU time used by everything but the bench and its processes ([`cpu_snap`],
//!   [`Out::noise`]), and per-process CPU time and memory ([`cpu_ns`], [`status_kib`]).
//! - **A blocking JSON-RPC line client** over a Unix socket or a pipe ([`Rpc`],
//!   [`timed_round_trip`]).
//! - **Statistics** ([`pct_us`], [`mean_us`], [`median`]) and **output**: a table on stdout
//!   (or stderr), JSON lines (`ABX_BENCH_JSON`), and the bars summary ([`Out`]).

#![allow(dead_code)]

use abx_home::socket::READY_FD_ENV;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ROLE_ENV: &str = "ABX_BENCH_ROLE";
pub const HOME_ENV: &str = "ABX_BENCH_HOME";
pub const SOCKET_ENV: &str = "ABX_BENCH_SOCKET";

pub type Res<T> = Result<T, String>;

/// A bench's `main`: run the child role named by `ABX_BENCH_ROLE` (`daemon`, or one of
/// `roles`), else the bench itself.
pub fn main(bench: &'static str, roles: &[(&str, fn())], orchestrate: fn() -> Res<()>) {
    // A bench daemon starts sandbox inits and plugin launchers as its own executable, as
    // `abx-broker` does.
    match std::env::args().nth(1).as_deref() {
        Some(abx_local::init::ARG) => abx_local::init::main(),
        Some(abx_plugins::launch::ARG) => abx_plugins::launch::main(),
        _ => {}
    }
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("daemon") => role_daemon(bench),
        Ok(other) => match roles.iter().find(|(name, _)| *name == other) {
            Some((_, role)) => role(),
            None => {
                eprintln!("{bench} bench: unknown {ROLE_ENV}={other}");
                std::process::exit(2);
            }
        },
        Err(_) => {
            if let Err(e) = orchestrate() {
                eprintln!("{bench} bench failed: {e}");
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
pub fn exit_with_parent() {
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

fn role_daemon(bench: &str) {
    exit_with_parent();
    let home = PathBuf::from(std::env::var_os(HOME_ENV).expect("ABX_BENCH_HOME is set"));
    match abx_broker::socket::run(abx_broker::Paths::under(&home), false) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("{bench} bench daemon: {e}");
            std::process::exit(1);
        }
    }
}

/// Say `ready <pid>` on the fd the bench passed in `ABX_READY_FD` (for roles other than the
/// daemon, which does it itself).
pub fn signal_ready() {
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

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Unpinned,
    Pinned,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Unpinned => "unpinned",
            Mode::Pinned => "pinned",
        }
    }

    /// The CPU this mode pins to, given the configured one.
    pub fn cpu(self, pin: Option<usize>) -> Option<usize> {
        match self {
            Mode::Unpinned => None,
            Mode::Pinned => pin,
        }
    }
}

pub fn env_parse<T: std::str::FromStr>(name: &str) -> Res<Option<T>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={v} is not a valid value")),
        _ => Ok(None),
    }
}

/// A byte count from the environment: a number with an optional binary suffix (`K`, `M`,
/// `G`, `KiB`, `MiB`, `GiB`).
pub fn env_bytes(name: &str) -> Res<Option<u64>> {
    let Ok(v) = std::env::var(name) else {
        return Ok(None);
    };
    let t = v.trim();
    if t.is_empty() {
        return Ok(None);
    }
    let bad = || format!("{name}={v} is not a byte count (like 1073741824, 64M or 1G)");
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(bad()),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    if n.is_nan() || n <= 0.0 {
        return Err(bad());
    }
    Ok(Some((n * mult as f64) as u64))
}

/// `ABX_BENCH_QUICK` is set (and not `0`).
pub fn quick() -> bool {
    matches!(std::env::var("ABX_BENCH_QUICK").as_deref(), Ok(v) if !v.is_empty() && v != "0")
}

/// The positional filters plus those in `ABX_BENCH_ONLY`.
pub fn filter_words() -> Vec<String> {
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
    words
}

/// The CPU of the pinned runs: `ABX_BENCH_CPU`, else the first one this process may use.
pub fn pin_cpu() -> Res<Option<usize>> {
    Ok(match env_parse::<usize>("ABX_BENCH_CPU")? {
        Some(c) => Some(c),
        None => first_allowed_cpu(),
    })
}

/// The modes to run (neither flag set means both); pinned only when there is a CPU to pin to.
pub fn modes(bench: &str, mut pinned: bool, mut unpinned: bool, cpu: Option<usize>) -> Vec<Mode> {
    if !pinned && !unpinned {
        (pinned, unpinned) = (true, true);
    }
    let mut modes = Vec::new();
    if unpinned {
        modes.push(Mode::Unpinned);
    }
    if pinned {
        if cpu.is_some() {
            modes.push(Mode::Pinned);
        } else {
            eprintln!("{bench} bench: pinning is not supported here; skipping the pinned runs");
        }
    }
    modes
}

// ---------------------------------------------------------------------------------------------
// CPU pinning
// ---------------------------------------------------------------------------------------------

/// Restrict the calling thread (or, in `pre_exec`, the child about to exec) to one CPU.
/// Async-signal-safe: no allocation.
#[cfg(target_os = "linux")]
pub fn pin_current(cpu: usize) -> io::Result<()> {
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
pub fn pin_current(_cpu: usize) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// The CPUs this process may run on.
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> Vec<usize> {
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
pub fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

pub fn first_allowed_cpu() -> Option<usize> {
    allowed_cpus().first().copied()
}

/// Pin the calling thread when `cpu` is set.
pub fn pin_if(cpu: Option<usize>) -> Res<()> {
    match cpu {
        Some(c) => pin_current(c).map_err(|e| format!("pin to CPU {c}: {e}")),
        None => Ok(()),
    }
}

/// Pin a child to `cpu` (when set) before it executes.
pub fn pin_cmd(cmd: &mut Command, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        // SAFETY: only an async-signal-safe call (sched_setaffinity) runs after fork.
        unsafe {
            cmd.pre_exec(move || pin_current(cpu));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Noise, CPU time and memory
// ---------------------------------------------------------------------------------------------

/// A snapshot of the machine's busy and stolen CPU time and of our own processes' CPU time,
/// in clock ticks (Linux `/proc`; `None` elsewhere).
#[derive(Clone, Copy)]
pub struct CpuSnap {
    at: Instant,
    busy: u64,
    steal: u64,
    ours: u64,
}

/// The fields after a `/proc/<pid>/stat` line's parenthesised command name.
fn stat_fields(pid: &str) -> Option<Vec<u64>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    // The state (a letter) comes first; keep the rest, numbered from field 4 on.
    Some(
        rest.split_whitespace()
            .skip(1)
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// A process's own CPU time (utime + stime, fields 14 and 15), in clock ticks.
pub fn proc_ticks(pid: &str) -> Option<u64> {
    let f = stat_fields(pid)?;
    Some(f.get(10)? + f.get(11)?)
}

/// A process's CPU time including that of the children it has reaped (fields 14 to 17).
fn proc_ticks_reaped(pid: &str) -> Option<u64> {
    let f = stat_fields(pid)?;
    Some(f.get(10)? + f.get(11)? + f.get(12)? + f.get(13)?)
}

/// The live descendants of `pid` (Linux: each task's `children`).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                for c in s.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                    if !out.contains(&c) {
                        out.push(c);
                        todo.push(c);
                    }
                }
            }
        }
    }
    out
}

/// Snapshot the machine and our processes: this one, `children` and every live descendant of
/// either (the processes our servers run), each with the time of the children it reaped.
pub fn cpu_snap(children: &[u32]) -> Option<CpuSnap> {
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
    let mut ours = proc_ticks_reaped("self")?;
    let mut pids: Vec<u32> = children.to_vec();
    for p in std::iter::once(std::process::id()).chain(children.iter().copied()) {
        for d in descendants(p) {
            if !pids.contains(&d) {
                pids.push(d);
            }
        }
    }
    for pid in pids {
        ours += proc_ticks_reaped(&pid.to_string()).unwrap_or(0);
    }
    Some(CpuSnap {
        at: Instant::now(),
        busy,
        steal,
        ours,
    })
}

/// (other processes, steal) in CPUs' worth between two snapshots.
pub fn noise(a: Option<CpuSnap>, b: Option<CpuSnap>) -> Option<(f64, f64)> {
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
pub fn cpu_ns(pid: u32) -> Option<u64> {
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

/// Context switches (voluntary and not) of every live thread of a process so far.
pub fn ctx_switches(pid: u32) -> Option<u64> {
    ctx_switches_split(pid).map(|(v, n)| v + n)
}

/// Voluntary and involuntary (preempted) context switches of every live thread of a
/// process so far.
pub fn ctx_switches_split(pid: u32) -> Option<(u64, u64)> {
    let (mut vol, mut invol) = (0u64, 0u64);
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(s) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        for l in s.lines() {
            let parse = |v: &str| v.trim().parse::<u64>().unwrap_or(0);
            if let Some(v) = l.strip_prefix("voluntary_ctxt_switches:") {
                vol += parse(v);
            } else if let Some(v) = l.strip_prefix("nonvoluntary_ctxt_switches:") {
                invol += parse(v);
            }
        }
    }
    Some((vol, invol))
}

/// CPU time of the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    // SAFETY: clock_gettime fills the timespec we pass.
    unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `VmHWM`, ...), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

// ---------------------------------------------------------------------------------------------
// Children running this same executable
// ---------------------------------------------------------------------------------------------

/// A server this bench started: the daemon, or a baseline role serving on a socket.
pub struct Spawned {
    /// Its role (`daemon`, or the bench's own).
    pub name: String,
    /// Where it listens.
    pub socket: PathBuf,
    /// The daemon's home (`None` for other roles).
    pub home: Option<PathBuf>,
    pub child: Child,
}

impl Spawned {
    /// The daemon, with everything under `home`.
    pub fn daemon(home: &Path, cpu: Option<usize>, env: &[(&str, &str)]) -> Res<Spawned> {
        let socket = abx_broker::Paths::under(home).socket;
        Spawned::spawn(
            "daemon",
            socket,
            Some(home.to_path_buf()),
            &[(HOME_ENV, home.as_os_str())],
            env,
            cpu,
        )
    }

    /// One of the bench's own roles, serving on `dir/<role>.sock`.
    pub fn role(role: &str, dir: &Path, cpu: Option<usize>) -> Res<Spawned> {
        let socket = dir.join(format!("{role}.sock"));
        Spawned::spawn(
            role,
            socket.clone(),
            None,
            &[(SOCKET_ENV, socket.as_os_str())],
            &[],
            cpu,
        )
    }

    fn spawn(
        name: &str,
        socket: PathBuf,
        home: Option<PathBuf>,
        paths: &[(&str, &std::ffi::OsStr)],
        env: &[(&str, &str)],
        cpu: Option<usize>,
    ) -> Res<Spawned> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.env(ROLE_ENV, name)
            .env_remove("ABX_HOME")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in paths {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
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
        let child = spawned.map_err(|e| format!("spawn {name}: {e}"))?;
        let s = Spawned {
            name: name.to_owned(),
            socket,
            home,
            child,
        };
        wait_ready(ready, Duration::from_secs(20))
            .map_err(|e| format!("{name} did not start: {e}"))?;
        Ok(s)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn connect(&self) -> Res<UnixStream> {
        UnixStream::connect(&self.socket)
            .map_err(|e| format!("connect {}: {e}", self.socket.display()))
    }

    /// A line client on a new connection.
    pub fn rpc(&self) -> Res<UnixRpc> {
        Rpc::unix(self.connect()?)
    }

    /// Stop: the daemon through `broker/shutdown`, the others by closing their stdin; kill
    /// whatever is still running after a grace period.
    pub fn stop(mut self) -> Res<()> {
        let mut note = Ok(());
        if self.home.is_some() {
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
                        note = Err(format!("{} exited with {status}", self.name));
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    note = Err(format!("{} did not stop in time; killed it", self.name));
                    break;
                }
            }
        }
        note
    }
}

impl Drop for Spawned {
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
// The line client
// ---------------------------------------------------------------------------------------------

/// The first `b` in `hay` (libc's vectorized memchr).
pub fn find_byte(hay: &[u8], b: u8) -> Option<usize> {
    if hay.is_empty() {
        return None;
    }
    // SAFETY: the pointer and length describe `hay`; memchr reads only within it.
    let p = unsafe { libc::memchr(hay.as_ptr().cast(), b as libc::c_int, hay.len()) };
    if p.is_null() {
        None
    } else {
        Some(p as usize - hay.as_ptr() as usize)
    }
}

/// The first occurrence of `needle` in `hay`.
pub fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    while let Some(i) = find_byte(&hay[from..], first) {
        let at = from + i;
        if hay[at + 1..].starts_with(rest) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

pub fn push_u64(out: &mut Vec<u8>, mut v: u64) {
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
pub fn push_ping(out: &mut Vec<u8>, id: u64) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    push_u64(out, id);
    out.extend_from_slice(b",\"method\":\"broker/ping\"}\n");
}

/// `{"jsonrpc":"2.0","id":N,"method":M,"params":P}\n` with `params` already encoded.
pub fn push_request(out: &mut Vec<u8>, id: u64, method: &str, params: &[u8]) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    push_u64(out, id);
    out.extend_from_slice(b",\"method\":");
    out.extend_from_slice(Value::from(method).to_string().as_bytes());
    if !params.is_empty() {
        out.extend_from_slice(b",\"params\":");
        out.extend_from_slice(params);
    }
    out.extend_from_slice(b"}\n");
}

/// Write one request line and read one reply line (without its newline).
pub fn round_trip(s: &mut UnixStream, req: &[u8]) -> io::Result<Vec<u8>> {
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

/// One timed round trip with one request in flight: write the request, read until what came
/// back ends with a newline. Returns the time and the number of bytes now in `buf`.
pub fn timed_round_trip<R: Read, W: Write>(
    r: &mut R,
    w: &mut W,
    req: &[u8],
    buf: &mut [u8],
) -> Res<(Duration, usize)> {
    let t0 = Instant::now();
    w.write_all(req).map_err(|e| e.to_string())?;
    let mut got = 0;
    loop {
        let n = r.read(&mut buf[got..]).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the server closed the connection".into());
        }
        got += n;
        if buf[got - 1] == b'\n' {
            return Ok((t0.elapsed(), got));
        }
        if got == buf.len() {
            return Err("reply too long".into());
        }
    }
}

/// A blocking JSON-RPC client speaking newline-delimited JSON over any byte pipe.
pub struct Rpc<R: Read, W: Write> {
    r: R,
    w: W,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Where the search for the next newline resumes (`start..scanned` holds none).
    scanned: usize,
    next_id: u64,
}

pub type UnixRpc = Rpc<UnixStream, UnixStream>;

/// The largest line the client accepts.
const MAX_LINE: usize = 256 << 20;

impl Rpc<UnixStream, UnixStream> {
    pub fn unix(s: UnixStream) -> Res<UnixRpc> {
        let r = s.try_clone().map_err(|e| format!("clone socket: {e}"))?;
        Ok(Rpc::new(r, s))
    }
}

impl<R: Read, W: Write> Rpc<R, W> {
    pub fn new(r: R, w: W) -> Rpc<R, W> {
        Rpc {
            r,
            w,
            buf: vec![0u8; 1 << 20],
            start: 0,
            end: 0,
            scanned: 0,
            next_id: 0,
        }
    }

    /// The two halves, for a hand-made exchange ([`timed_round_trip`]). Only use them while
    /// nothing is buffered ([`Rpc::buffered`] is 0).
    pub fn halves(&mut self) -> (&mut R, &mut W) {
        (&mut self.r, &mut self.w)
    }

    /// Bytes read but not yet returned as lines.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    pub fn send(&mut self, bytes: &[u8]) -> Res<()> {
        self.w.write_all(bytes).map_err(|e| format!("write: {e}"))
    }

    /// A fresh request id.
    pub fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Send a request; returns its id.
    pub fn request(&mut self, method: &str, params: &Value) -> Res<u64> {
        let id = self.id();
        let mut line = Vec::with_capacity(128);
        push_request(&mut line, id, method, params.to_string().as_bytes());
        self.send(&line)?;
        Ok(id)
    }

    pub fn notify(&mut self, method: &str, params: &Value) -> Res<()> {
        let line = format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "method": method, "params": params})
        );
        self.send(line.as_bytes())
    }

    /// The next line without its newline, valid until the next read.
    pub fn line(&mut self) -> Res<&[u8]> {
        loop {
            if let Some(i) = find_byte(&self.buf[self.scanned..self.end], b'\n') {
                let (from, to) = (self.start, self.scanned + i);
                self.start = to + 1;
                self.scanned = self.start;
                return Ok(&self.buf[from..to]);
            }
            self.scanned = self.end;
            if self.start > 0 && (self.end == self.buf.len() || self.start == self.end) {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.scanned -= self.start;
                self.start = 0;
            }
            if self.end == self.buf.len() {
                if self.buf.len() >= MAX_LINE {
                    return Err(format!("a line longer than {MAX_LINE} bytes"));
                }
                self.buf.resize(self.buf.len() * 2, 0);
            }
            let n = loop {
                match self.r.read(&mut self.buf[self.end..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("read: {e}")),
                }
            };
            if n == 0 {
                return Err("the peer closed the connection".into());
            }
            self.end += n;
        }
    }

    /// The next message, parsed.
    pub fn message(&mut self) -> Res<Value> {
        let line = self.line()?;
        serde_json::from_slice(line).map_err(|e| {
            format!(
                "not JSON ({e}): {}",
                String::from_utf8_lossy(&line[..line.len().min(200)])
            )
        })
    }

    /// Call and wait for the reply, handing every notification that arrives meanwhile to
    /// `on_note`. An error reply is an `Err` holding the error object.
    pub fn call_with(
        &mut self,
        method: &str,
        params: Value,
        mut on_note: impl FnMut(&Value),
    ) -> Res<Value> {
        let id = self.request(method, &params)?;
        loop {
            let v = self.message()?;
            if v.get("id").and_then(Value::as_u64) == Some(id) && v.get("method").is_none() {
                if let Some(r) = v.get("result") {
                    return Ok(r.clone());
                }
                return Err(format!("{method}: {}", v.get("error").unwrap_or(&v)));
            }
            if v.get("method").is_some() {
                on_note(&v);
            }
        }
    }

    /// Call and wait for the reply, skipping notifications.
    pub fn call(&mut self, method: &str, params: Value) -> Res<Value> {
        self.call_with(method, params, |_| {})
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------

/// The `p` quantile (nearest rank) of sorted nanoseconds, in microseconds.
pub fn pct_us(sorted_ns: &[u64], p: f64) -> f64 {
    let n = sorted_ns.len();
    let i = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
    sorted_ns[i] as f64 / 1000.0
}

/// The mean of nanoseconds, in microseconds.
pub fn mean_us(ns: &[u64]) -> f64 {
    ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0
}

pub fn median(v: &[f64]) -> Option<f64> {
    let mut r = v.to_vec();
    r.sort_by(f64::total_cmp);
    let n = r.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(r[n / 2]),
        _ => Some((r[n / 2 - 1] + r[n / 2]) / 2.0),
    }
}

pub fn min_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

pub fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

pub fn thousands(v: f64) -> String {
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

pub const MIB: f64 = 1024.0 * 1024.0;
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// A byte count for people: `1 GiB`, `64 MiB`, `1.5 GiB`, `1000 B`.
pub fn human_bytes(n: u64) -> String {
    let f = n as f64;
    let (v, unit) = if f >= GIB {
        (f / GIB, "GiB")
    } else if f >= MIB {
        (f / MIB, "MiB")
    } else if f >= 1024.0 {
        (f / 1024.0, "KiB")
    } else {
        return format!("{n} B");
    };
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

pub fn meets(value: f64, cmp: &str, bar: f64) -> bool {
    match cmp {
        "<=" => value <= bar,
        _ => value >= bar,
    }
}

pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "MISS"
    }
}

enum JsonSink {
    None,
    Stdout,
    File(File),
}

/// One line of the bars summary.
pub struct Bar {
    pub name: String,
    pub mode: String,
    /// The figure as shown (`1.23x`, `7.4 MiB`).
    pub value: String,
    /// The bar as shown (`>= 0.5x`).
    pub bar: String,
    pub ok: bool,
    /// A ratio (`x`): the summary's column says "ratio" when every bar is one.
    pub ratio: bool,
}

/// The table (stdout, or stderr when the JSON lines go to stdout), the JSON lines
/// (`ABX_BENCH_JSON=1` to stdout, `ABX_BENCH_JSON=<file>` appended to it) and the bars.
pub struct Out {
    bench: &'static str,
    json: JsonSink,
    table_to_stderr: bool,
    pub bars: Vec<Bar>,
}

impl Out {
    pub fn new(bench: &'static str) -> Res<Out> {
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
            bench,
            json,
            table_to_stderr,
            bars: Vec::new(),
        })
    }

    pub fn table(&self, text: &str) {
        if self.table_to_stderr {
            eprint!("{text}");
        } else {
            print!("{text}");
            let _ = io::stdout().flush();
        }
    }

    pub fn record(&mut self, mut v: Value) {
        v["bench"] = json!(self.bench);
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

    /// The first lines: the machine, the pinned CPU, quick or not, the load.
    pub fn header(&mut self, pin: Option<usize>, quick: bool) {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let allowed = allowed_cpus();
        self.table(&format!(
            "abx broker {} bench: {cpus} CPUs available{}, pinned runs on CPU {}{}; load average {}\n\
             (ratios compare each figure only with its baseline measured the same way in this run)\n",
            self.bench,
            if allowed.is_empty() {
                String::new()
            } else {
                format!(" (allowed: {allowed:?})")
            },
            pin.map_or_else(|| "-".to_string(), |c| c.to_string()),
            if quick {
                "; QUICK run (ABX_BENCH_QUICK)"
            } else {
                ""
            },
            loadavg().map_or_else(|| "-".to_string(), |l| format!("{l:.2}")),
        ));
    }

    /// A ratio `num/den` of one figure, with its bar when it has one.
    pub fn ratio(
        &mut self,
        figure: &str,
        mode: Mode,
        num: &str,
        den: &str,
        value: f64,
        bar: Option<(&'static str, f64)>,
    ) {
        let ok = bar.map(|(cmp, b)| meets(value, cmp, b));
        self.record(json!({
            "kind": "ratio", "figure": figure, "mode": mode.name(),
            "num": num, "den": den, "value": round3(value),
            "bar": bar.map(|b| b.1), "cmp": bar.map(|b| b.0), "ok": ok,
        }));
        if let Some((cmp, b)) = bar {
            self.bars.push(Bar {
                name: format!("{figure} {num}/{den}"),
                mode: mode.name().to_owned(),
                value: format!("{value:.2}x"),
                bar: format!("{cmp} {b}x"),
                ok: meets(value, cmp, b),
                ratio: true,
            });
        }
    }

    /// An absolute figure against its bar (`value` and `bar` in `unit`).
    pub fn absolute(
        &mut self,
        figure: &str,
        mode: &str,
        value: f64,
        unit: &str,
        bar: (&'static str, f64),
    ) {
        let (cmp, b) = bar;
        let ok = meets(value, cmp, b);
        self.record(json!({
            "kind": "bar", "figure": figure, "mode": mode, "value": round3(value),
            "unit": unit, "bar": b, "cmp": cmp, "ok": ok,
        }));
        self.bars.push(Bar {
            name: figure.to_owned(),
            mode: mode.to_owned(),
            value: format!("{value:.1} {unit}"),
            bar: format!("{cmp} {b} {unit}"),
            ok,
            ratio: false,
        });
    }

    /// A yes/no bar (`what` says what was checked).
    pub fn check(&mut self, figure: &str, mode: &str, ok: bool, shown: &str, bar: &str) {
        self.record(json!({
            "kind": "check", "figure": figure, "mode": mode, "value": shown, "bar": bar, "ok": ok,
        }));
        self.bars.push(Bar {
            name: figure.to_owned(),
            mode: mode.to_owned(),
            value: shown.to_owned(),
            bar: bar.to_owned(),
            ok,
            ratio: false,
        });
    }

    /// The noise line for the figures taken between two snapshots.
    pub fn noise(&mut self, label: &str, before: Option<CpuSnap>, after: Option<CpuSnap>) {
        if let Some((other, steal)) = noise(before, after) {
            self.table(&format!(
                "\n  [{label}] CPU used by other processes during these figures: {other:.2} CPUs' worth, stolen: {steal:.2}{}\n",
                if other > 0.05 || steal > 0.05 { "  <- figures disturbed, rerun on a quiet machine" } else { "" }
            ));
            self.record(json!({
                "kind": "noise", "mode": label,
                "other_cpus": round3(other), "steal_cpus": round3(steal),
            }));
        }
    }

    /// The bars summary and the total time.
    pub fn finish(&mut self, started: Instant) {
        let mut t = String::from("\nbars (docs/design.md#bars)\n");
        let all_ratios = self.bars.iter().all(|b| b.ratio);
        // As wide as the longest name, so a long one never runs into its mode.
        let w = self
            .bars
            .iter()
            .map(|b| b.name.len() + 2)
            .max()
            .unwrap_or(0)
            .max(30);
        let _ = writeln!(
            t,
            "  {:<w$}{:<10}{:>9}{:>10}  verdict",
            "figure",
            "mode",
            if all_ratios { "ratio" } else { "value" },
            "bar"
        );
        for b in &self.bars {
            let _ = writeln!(
                t,
                "  {:<w$}{:<10}{:>9}{:>10}  {}",
                b.name,
                b.mode,
                b.value,
                b.bar,
                verdict(b.ok)
            );
        }
        let _ = writeln!(t, "\ntotal {:.1} s", started.elapsed().as_secs_f64());
        self.table(&t);
    }
}
