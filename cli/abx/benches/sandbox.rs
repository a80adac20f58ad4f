//! Benchmark (not a test): a `local` sandbox's whole life through the CLI, `abx run -- true`
//! (create, exec, kill on a warm daemon), against bubblewrap doing the same isolation
//! one-shot (`bwrap --unshare-all` with a read-only /usr, its own /proc, /dev and /tmp,
//! `true`). Bar (issue 17): <= 3x, goal 1.5x; issue 48: bar 1x, goal 0.5x. Also
//! `sandbox/create` latency per network mode (`abx create --network M`, each followed by an
//! untimed kill), and, issue 48 (ready sandboxes), all against the same bwrap run:
//!
//! - what an agent's SDK pays: `sandbox/create`, `exec/run true`, `sandbox/kill` over a socket
//!   already open, back to back (each waiting for the last, the pool refilling as it can):
//!   the sustained rate; bar 0.5x;
//! - the same once after idle (the pool full and quiet), reported apart;
//! - 50 sandboxes created at once, each then `exec/run true`: the time until all have
//!   answered, against 50 bwrap runs started at once.
//!
//! Run: `cargo bench -p abx-cli --bench sandbox` (see the list bench for how `abx` is found;
//! `ABX_BENCH_ABX=/path/to/abx` measures another build, with its `abx-broker` beside it).
//! `ABX_BENCH_N` sets the number of runs (default 50). Unpinned and pinned to one CPU.

mod common;

use common::{cmd, have, setup, show, stats, time_one, Home, Stats};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BWRAP: &[&str] = &[
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/sbin",
    "/sbin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--ro-bind",
    "/etc",
    "/etc",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "--chdir",
    "/tmp",
    "true",
];

fn bwrap(pinned: bool, n: usize) -> Stats {
    for _ in 0..3 {
        time_one(cmd(pinned, BWRAP));
    }
    stats((0..n).map(|_| time_one(cmd(pinned, BWRAP))).collect())
}

fn abx_run(home: &Home, pinned: bool, n: usize) -> Stats {
    for _ in 0..3 {
        time_one(home.abx(pinned, &["run", "--", "true"]));
    }
    stats(
        (0..n)
            .map(|_| time_one(home.abx(pinned, &["run", "--", "true"])))
            .collect(),
    )
}

fn create(home: &Home, pinned: bool, network: &str, n: usize) -> Stats {
    let mut v = Vec::new();
    for _ in 0..n {
        let t = std::time::Instant::now();
        let out = home
            .abx(pinned, &["-j", "create", "--network", network])
            .stdout(Stdio::piped())
            .output()
            .expect("abx create");
        v.push(t.elapsed());
        assert!(out.status.success(), "create --network {network} failed");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("create -j");
        let id = v["id"].as_str().expect("id").to_owned();
        time_one(home.abx(pinned, &["kill", "--yes", &id]));
    }
    stats(v)
}

/// A client already running: one connection, line-framed JSON-RPC, one call at a time.
struct Sdk {
    w: UnixStream,
    r: BufReader<UnixStream>,
    next: u64,
}

impl Sdk {
    fn connect(socket: &Path) -> Sdk {
        let w = UnixStream::connect(socket).expect("connect to the daemon");
        let r = BufReader::new(w.try_clone().expect("clone"));
        Sdk { w, r, next: 1 }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let mut line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        line.push('\n');
        self.w.write_all(line.as_bytes()).expect("write");
        loop {
            let mut buf = String::new();
            assert!(
                self.r.read_line(&mut buf).expect("read") > 0,
                "daemon closed"
            );
            let v: Value = serde_json::from_str(&buf).expect("json");
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// create, exec/run true, kill: what an agent's throwaway sandbox costs.
    fn cycle(&mut self) -> Duration {
        let t = Instant::now();
        let id = self.call("sandbox/create", json!({}))["id"]
            .as_str()
            .expect("id")
            .to_owned();
        let r = self.call("exec/run", json!({"sandbox": id, "command": "true"}));
        assert_eq!(r["exitCode"], 0, "{r}");
        self.call("sandbox/kill", json!({"sandbox": id}));
        t.elapsed()
    }

    /// Wait until the local pool is full and no refill runs (at once for a build without one).
    fn idle(&mut self) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            let p = &self.call("provider/info", json!({"id": "local"}))["pool"];
            if p.is_null() || (p["ready"] == p["size"] && p["filling"] == false) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The socket of the home's daemon (`abx broker status -j`), started.
fn socket_of(home: &Home) -> PathBuf {
    time_one(home.abx(false, &["broker", "start"]));
    let out = home
        .abx(false, &["-j", "broker", "status"])
        .stdout(Stdio::piped())
        .output()
        .expect("abx broker status");
    let v: Value = serde_json::from_slice(&out.stdout).expect("status -j");
    let s = v["socket"]
        .as_str()
        .or_else(|| v["daemon"]["socket"].as_str())
        .unwrap_or_else(|| panic!("no socket in {v}"));
    PathBuf::from(s)
}

fn sdk_cycles(socket: &Path, n: usize) -> (Stats, f64) {
    let mut c = Sdk::connect(socket);
    for _ in 0..3 {
        c.cycle();
    }
    c.idle();
    let t = Instant::now();
    let v: Vec<Duration> = (0..n).map(|_| c.cycle()).collect();
    let rate = n as f64 / t.elapsed().as_secs_f64();
    (stats(v), rate)
}

fn sdk_after_idle(socket: &Path, n: usize) -> Stats {
    let mut c = Sdk::connect(socket);
    stats(
        (0..n)
            .map(|_| {
                c.idle();
                c.cycle()
            })
            .collect(),
    )
}

/// `k` sandboxes created at once (a connection each), each then `exec/run true`: the time
/// until the last has answered. They are killed after, untimed.
fn at_once(socket: &Path, k: usize) -> Duration {
    let mut clients: Vec<Sdk> = (0..k).map(|_| Sdk::connect(socket)).collect();
    let go = std::sync::Arc::new(std::sync::Barrier::new(k + 1));
    let workers: Vec<_> = clients
        .drain(..)
        .map(|mut c| {
            let go = go.clone();
            std::thread::spawn(move || {
                go.wait();
                let id = c.call("sandbox/create", json!({}))["id"]
                    .as_str()
                    .expect("id")
                    .to_owned();
                let r = c.call("exec/run", json!({"sandbox": id, "command": "true"}));
                assert_eq!(r["exitCode"], 0, "{r}");
                (Instant::now(), c, id)
            })
        })
        .collect();
    go.wait();
    let t = Instant::now();
    let done: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let last = done.iter().map(|(e, _, _)| *e).max().unwrap();
    for (_, mut c, id) in done {
        c.call("sandbox/kill", json!({"sandbox": id}));
    }
    last - t
}

fn bwrap_at_once(k: usize) -> Duration {
    let t = Instant::now();
    let kids: Vec<_> = (0..k)
        .map(|_| cmd(false, BWRAP).spawn().expect("bwrap"))
        .collect();
    for mut c in kids {
        assert!(c.wait().unwrap().success());
    }
    t.elapsed()
}

fn ratio(name: &str, a: Duration, b: Duration, bar: f64, goal: Option<f64>) {
    let r = a.as_secs_f64() / b.as_secs_f64();
    let goal = goal.map_or(String::new(), |g| format!("; goal {g}x"));
    println!(
        "  ratio {name}: {r:.2}x (bar <= {bar}x: {}{goal})",
        if r <= bar { "met" } else { "MISSED" }
    );
}

fn main() {
    let (abx, n) = match std::env::var_os("ABX_BENCH_ABX") {
        Some(p) => {
            let n = std::env::var("ABX_BENCH_N")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(50);
            (PathBuf::from(p), n)
        }
        None => setup(50),
    };
    let have_bwrap = have("bwrap", "--version");
    let have_pasta = Command::new("sh")
        .args(["-c", "command -v pasta"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    println!("local sandbox benchmark");
    println!("  binary: {}", abx.display());
    let modes: &[bool] = &[false, true];
    for &pinned in modes {
        println!(
            "\n{}",
            if pinned {
                "pinned (CPU 0: client, daemon and sandbox on one CPU)"
            } else {
                "unpinned"
            }
        );
        let home = Home::new(&abx);
        let socket = socket_of(&home);
        let run = abx_run(&home, pinned, n);
        show("abx run -- true", &run);
        let b = have_bwrap.then(|| bwrap(pinned, n));
        match &b {
            Some(b) => {
                show("bwrap --unshare-all true", b);
                ratio("abx run / bwrap, p50", run.p50, b.p50, 1.0, Some(0.5));
            }
            None => println!("  bwrap not found (apt install bubblewrap): no baseline"),
        }
        // The SDK's calls run from this process: pinned, it is pinned itself for them.
        if pinned {
            pin_self(true);
        }
        let (sdk, rate) = sdk_cycles(&socket, n);
        show("sdk create+exec+kill", &sdk);
        println!("  sustained: {rate:.1} sandboxes/s, back to back");
        let idle = sdk_after_idle(&socket, (n / 5).max(5));
        show("sdk, once after idle", &idle);
        if pinned {
            pin_self(false);
        }
        if let Some(b) = &b {
            ratio("sdk sustained / bwrap, p50", sdk.p50, b.p50, 0.5, None);
            ratio("sdk after idle / bwrap, p50", idle.p50, b.p50, 0.5, None);
        }
        if !pinned && have_bwrap {
            const K: usize = 50;
            let mut ours = Vec::new();
            let mut theirs = Vec::new();
            for _ in 0..3 {
                Sdk::connect(&socket).idle();
                ours.push(at_once(&socket, K));
                theirs.push(bwrap_at_once(K));
            }
            ours.sort();
            theirs.sort();
            println!(
                "  {K} at once, all answered: abx {} / bwrap {} (medians of 3; runs abx {:?}, bwrap {:?})",
                common::ms(ours[1]),
                common::ms(theirs[1]),
                ours.iter().map(|d| common::ms(*d)).collect::<Vec<_>>(),
                theirs.iter().map(|d| common::ms(*d)).collect::<Vec<_>>(),
            );
            ratio(
                &format!("{K} at once / bwrap"),
                ours[1],
                theirs[1],
                1.0,
                None,
            );
        }
        for network in ["none", "host", "internet"] {
            if network == "internet" && !have_pasta {
                println!("  create --network internet: pasta not found (apt install passt)");
                continue;
            }
            let c = create(&home, pinned, network, (n / 2).max(5));
            show(&format!("create --network {network}"), &c);
        }
    }
}

/// Pin this process (its calling thread) to CPU 0, or let it run anywhere again.
fn pin_self(on: bool) {
    // SAFETY: sched_setaffinity on this thread with a local set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if on {
            libc::CPU_SET(0, &mut set);
        } else {
            for c in 0..libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c, &mut set);
            }
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
