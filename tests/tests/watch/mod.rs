//! The hostile suites' watch over a daemon (`mod watch;` in a suite): a memory cgroup with a
//! hard limit ([`CGROUP_LIMIT`]: a regression is OOM-killed there and the test fails), the
//! daemon's idle RSS, a neighbour connection pinging it all along, and the checks once the
//! load is gone ([`Watch::check`]: alive, never OOM-killed, peak RSS (VmHWM) under
//! [`PEAK_BOUND_KIB`], the documented bound of docs/performance.md "Hostile clients", the
//! neighbour answered, RSS back near idle; one `hostile: ...` line, parsed by scripts/bench).
//! Used by `hostile_sandbox.rs` and `egress_load.rs`; `hostile.rs`, `hostile_wire.rs` and
//! `hostile_archives.rs` use its [`MemCgroup`] and [`status_kib`] with watches of their own.

#![allow(dead_code)]

use abx_tests::{alive, rss_kib, wait_until, Home};
use serde_json::{json, Value};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MIB: u64 = 1024 * 1024;
/// The documented bound on the daemon's peak RSS under any of these loads.
pub const PEAK_BOUND_KIB: u64 = 256 * 1024;
/// How far above its idle RSS the daemon may stay once the load is gone.
pub const SETTLE_SLACK_KIB: u64 = 32 * 1024;
/// The cgroup's hard limit (a safety net above the bound, as in `hostile.rs`).
pub const CGROUP_LIMIT: u64 = 768 * MIB;
pub const LONG: Duration = Duration::from_secs(180);

// ---------------------------------------------------------------------------------------------
// A memory cgroup for the daemon (v1 or v2), removed on drop
// ---------------------------------------------------------------------------------------------

pub struct MemCgroup {
    dir: PathBuf,
    parent: PathBuf,
    v2: bool,
}

impl MemCgroup {
    /// A child of this process's own memory cgroup, limited to `limit` bytes.
    pub fn create(limit: u64) -> Result<MemCgroup, String> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "abx-{}-{}-{}",
            env!("CARGO_CRATE_NAME"),
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        // v1: "N:memory:/path"; v2: "0::/path".
        let v1 = own.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
            ctrls
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        });
        let (parent, v2) = match v1 {
            Some(p) if PathBuf::from("/sys/fs/cgroup/memory").is_dir() => {
                (PathBuf::from(format!("/sys/fs/cgroup/memory{p}")), false)
            }
            _ => {
                let p = own
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .ok_or("no memory cgroup (neither v1 nor v2) for this process")?;
                let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                    .into_iter()
                    .map(PathBuf::from)
                    .find(|r| r.join("cgroup.controllers").exists())
                    .ok_or("no cgroup v2 mount")?;
                let parent = root.join(p.trim_start_matches('/'));
                let controllers =
                    std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
                if !controllers.split_whitespace().any(|c| c == "memory") {
                    return Err(format!(
                        "the memory controller is not available in {}",
                        parent.display()
                    ));
                }
                let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
                (parent, true)
            }
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = MemCgroup { dir, parent, v2 };
        let limit_file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(cg.dir.join(limit_file), limit.to_string())
            .map_err(|e| format!("{limit_file}: {e}"))?;
        Ok(cg)
    }

    /// Its `cgroup.procs` (what a process writes its pid to, to join it).
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    pub fn add(&self, pid: u32) -> Result<(), String> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .map_err(|e| format!("moving {pid} into {}: {e}", self.dir.display()))
    }

    /// OOM kills in this cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = std::fs::write(self.parent.join("cgroup.procs"), pid);
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            if Instant::now() > deadline {
                eprintln!(
                    "{}: could not remove {}",
                    env!("CARGO_CRATE_NAME"),
                    self.dir.display()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The watch: cgroup, idle RSS, a pinging neighbour
// ---------------------------------------------------------------------------------------------

pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Bytes waiting to be read on a socket.
pub fn unread(s: &UnixStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    n.max(0) as usize
}

pub struct Watch {
    pid: u32,
    idle_kib: u64,
    quiet_p99: Duration,
    cgroup: Option<MemCgroup>,
    stop: Arc<AtomicBool>,
    pings: Arc<AtomicUsize>,
    pinger: Option<std::thread::JoinHandle<Vec<Duration>>>,
}

impl Watch {
    /// Put the daemon of `home` under a memory cgroup and start a neighbour pinging it.
    pub fn start(home: &Home, pid: u32) -> Watch {
        let cgroup = match MemCgroup::create(CGROUP_LIMIT) {
            Ok(cg) => match cg.add(pid) {
                Ok(()) => Some(cg),
                Err(e) => {
                    eprintln!(
                        "{}: running without a memory cgroup: {e}",
                        env!("CARGO_CRATE_NAME")
                    );
                    None
                }
            },
            Err(e) => {
                eprintln!(
                    "{}: running without a memory cgroup: {e}",
                    env!("CARGO_CRATE_NAME")
                );
                None
            }
        };
        let mut c = home.connect();
        c.call("broker/ping", Value::Null);
        let idle_kib = rss_kib(pid);
        let mut quiet: Vec<Duration> = (0..200)
            .map(|_| {
                let t = Instant::now();
                c.call("broker/ping", Value::Null);
                t.elapsed()
            })
            .collect();
        quiet.sort();
        let quiet_p99 = quiet[quiet.len() * 99 / 100];
        let stop = Arc::new(AtomicBool::new(false));
        let pings = Arc::new(AtomicUsize::new(0));
        let (stop2, pings2) = (stop.clone(), pings.clone());
        let pinger = std::thread::spawn(move || {
            let mut lat = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                let t = Instant::now();
                // Client::call fails the test if a ping is not answered within 20 s.
                assert_eq!(c.call("broker/ping", Value::Null), json!({}));
                lat.push(t.elapsed());
                pings2.fetch_add(1, Ordering::Relaxed);
            }
            lat
        });
        Watch {
            pid,
            idle_kib,
            quiet_p99,
            cgroup,
            stop,
            pings,
            pinger: Some(pinger),
        }
    }

    /// Wait until the neighbour has been answered `n` more pings.
    pub fn pings_answered(&self, n: usize) {
        let from = self.pings.load(Ordering::Relaxed);
        wait_alive("the neighbour's pings", self.pid, || {
            self.pings.load(Ordering::Relaxed) >= from + n
        });
    }

    /// The checks, once the hostile load is gone. Returns the peak RSS in KiB.
    pub fn check(mut self, what: &str) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut lat = self
            .pinger
            .take()
            .unwrap()
            .join()
            .expect("the neighbour's pings were answered");
        assert!(!lat.is_empty(), "{what}: no ping answered");
        assert!(alive(self.pid), "{what}: the daemon died");
        if let Some(cg) = &self.cgroup {
            assert_eq!(cg.oom_kills(), 0, "{what}: OOM kill in the daemon's cgroup");
        }
        lat.sort();
        let p99 = lat[(lat.len() * 99 / 100).min(lat.len() - 1)];
        let peak = status_kib(self.pid, "VmHWM");
        // One line per load, parsed by scripts/bench for docs/performance.md.
        eprintln!(
            "hostile: {what}: peak RSS {} MiB (idle {} MiB), neighbour's ping p99 {:.2} ms (before: {:.2} ms) over {} pings, cgroup {}",
            peak / 1024,
            self.idle_kib / 1024,
            p99.as_secs_f64() * 1000.0,
            self.quiet_p99.as_secs_f64() * 1000.0,
            lat.len(),
            if self.cgroup.is_some() { "yes" } else { "no" }
        );
        assert!(
            peak <= PEAK_BOUND_KIB,
            "{what}: peak RSS {peak} KiB above the {PEAK_BOUND_KIB} KiB bound"
        );
        let bound = self.idle_kib + SETTLE_SLACK_KIB;
        wait_until("RSS back near idle", LONG, || rss_kib(self.pid) <= bound);
        peak
    }
}

/// The daemon is running (not gone, not a zombie).
pub fn daemon_up(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| s.contains("VmRSS:"))
}

/// Wait for `f`, failing at once (instead of at the timeout) when the daemon is gone.
pub fn wait_alive(what: &str, pid: u32, mut f: impl FnMut() -> bool) {
    wait_until(what, LONG, || {
        assert!(daemon_up(pid), "the daemon died while waiting for {what}");
        f()
    });
}
