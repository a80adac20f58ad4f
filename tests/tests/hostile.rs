//! Hostile clients (issue 18; docs/design.md#reliability "hostile client"): one connection tries to make the
//! daemon hold more memory than it should. Each test runs a real daemon, moved into a memory
//! cgroup made here (a hard limit: a regression is OOM-killed in its cgroup and the test fails,
//! instead of the machine suffering), while another client pings it all along. Each checks:
//! - the daemon is alive and was never OOM-killed;
//! - its peak RSS (VmHWM) stays under [`PEAK_BOUND_KIB`] (the documented bound,
//!   docs/performance.md "Hostile clients");
//! - the other client's pings kept being answered;
//! - once the hostile client is gone, RSS returns near its idle value.
//!
//! Timing here is only liveness: no assertion on durations (docs/performance.md has numbers).

mod watch;

use abx_tests::fixtures::{install_pinned, plugin_sandbox};
use abx_tests::{abx_code, alive, rss_kib, wait_until, Client, Home};
use serde_json::{json, Value};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use watch::{status_kib, MemCgroup};

const MIB: u64 = 1024 * 1024;
/// The documented bound on the daemon's peak RSS under any of these clients.
const PEAK_BOUND_KIB: u64 = 256 * 1024;
/// How far above its idle RSS the daemon may stay once the hostile client is gone.
const SETTLE_SLACK_KIB: u64 = 32 * 1024;
/// The cgroup's hard limit (a safety net above the bound; it counts the commands the daemon
/// runs and the page cache of the files they write too).
const CGROUP_LIMIT: u64 = 768 * MIB;
const LONG: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// The watch: cgroup, idle RSS, a pinging neighbour
// ---------------------------------------------------------------------------------------------

/// Bytes waiting to be read on a socket.
fn unread(s: &UnixStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    n.max(0) as usize
}

struct Watch {
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
    fn start(home: &Home, pid: u32) -> Watch {
        let cgroup = match MemCgroup::create(CGROUP_LIMIT) {
            Ok(cg) => match cg.add(pid) {
                Ok(()) => Some(cg),
                Err(e) => {
                    eprintln!("hostile: running without a memory cgroup: {e}");
                    None
                }
            },
            Err(e) => {
                eprintln!("hostile: running without a memory cgroup: {e}");
                None
            }
        };
        let mut c = home.connect();
        c.call("broker/ping", Value::Null);
        let idle_kib = rss_kib(pid);
        // The neighbour's ping latency before the hostile client starts (for the report).
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

    /// Wait until the neighbour has been answered `n` more pings (time passes with the daemon
    /// under load, without a fixed sleep).
    fn pings_answered(&self, n: usize) {
        let from = self.pings.load(Ordering::Relaxed);
        wait_until("the neighbour's pings", LONG, || {
            self.pings.load(Ordering::Relaxed) >= from + n
        });
    }

    /// The checks, once the hostile client is gone. Returns the peak RSS in KiB.
    fn check(mut self, what: &str) -> u64 {
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
        // One line per client, parsed by scripts/bench for docs/performance.md.
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

fn home_with_daemon(env: &[(&str, &str)]) -> (Home, u32, Client) {
    let mut home = Home::new();
    for (k, v) in env {
        home.env.push((k.to_string(), v.to_string()));
    }
    let pid = home.start();
    let c = home.connect();
    (home, pid, c)
}

fn req(id: usize, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// A raw connection that sends `lines` and never reads; returns once the daemon has filled
/// what the socket holds toward it and the neighbour got `pings` more answers.
fn never_reading(home: &Home, w: &Watch, lines: &[String], pings: usize) -> UnixStream {
    let mut s = UnixStream::connect(home.socket()).unwrap();
    let mut all = lines.join("\n");
    all.push('\n');
    s.write_all(all.as_bytes()).unwrap();
    wait_until("replies waiting in the socket", LONG, || {
        unread(&s) >= 64 * 1024
    });
    w.pings_answered(pings);
    s
}

// ---------------------------------------------------------------------------------------------
// The hostile clients
// ---------------------------------------------------------------------------------------------

/// These clients load the machine on purpose and measure the daemon under that load: they
/// run one at a time whatever `--test-threads` says (two at once on 2 CPUs starve each
/// other's daemons past the waits).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// (a) One newline-framed batch of 500,000 pings (26 MB, under the 64 MiB message limit):
/// E1005 naming the limit, without decoding it; a batch at the limit is answered in full.
#[test]
fn a_batch_of_500000_pings_is_refused_and_one_of_1024_answered() {
    let _one_at_a_time = serial();
    let (home, pid, _c) = home_with_daemon(&[]);
    let w = Watch::start(&home, pid);
    let mut h = home.connect();
    let ping = |i: usize| req(i, "broker/ping", json!({}));
    let batch = |n: usize| format!("[{}]", (0..n).map(ping).collect::<Vec<_>>().join(","));
    let huge = batch(500_000);
    assert!(huge.len() > 25_000_000 && huge.len() < 64 << 20);
    h.send(&huge);
    drop(huge);
    let v = h.recv();
    assert_eq!(v["id"], Value::Null, "{v}");
    assert_eq!(abx_code(&v["error"]), "E1005", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("1024") && msg.contains("500000"), "{msg}");
    // At the limit: every element answered, in one batch reply.
    h.send(&batch(1024));
    let v = h.recv();
    let items = v.as_array().expect("a batch reply");
    assert_eq!(items.len(), 1024);
    assert!(items.iter().all(|r| r["result"] == json!({})), "{v}");
    // One more is refused whole.
    h.send(&batch(1025));
    assert_eq!(abx_code(&h.recv()["error"]), "E1005");
    // Several huge batches in a row (one after the other, as a client would retry).
    for _ in 0..3 {
        h.send(&batch(400_000));
        assert_eq!(abx_code(&h.recv()["error"]), "E1005");
    }
    w.pings_answered(20);
    drop(h);
    w.check("batch of 500000 pings");
}

/// (b) A client that never reads sends 1024 `files/read` of 4 MiB as base64: each reply is
/// reserved from its connection's 16 MiB budget before it is built, so only a few exist.
#[test]
fn a_client_that_never_reads_1024_reads_of_4_mib() {
    let _one_at_a_time = serial();
    let (home, pid, mut c) = home_with_daemon(&[]);
    let sb = c.create(json!({}));
    c.sh(&sb, "head -c 4194304 /dev/urandom > big.bin");
    let w = Watch::start(&home, pid);
    let lines: Vec<String> = (0..1024)
        .map(|i| {
            req(
                i,
                "files/read",
                json!({"sandbox": sb, "path": "big.bin", "length": 4194304, "encoding": "base64"}),
            )
        })
        .collect();
    let h = never_reading(&home, &w, &lines, 50);
    // The daemon serves everyone else meanwhile, reads included.
    let r = c.call(
        "files/read",
        json!({"sandbox": sb, "path": "big.bin", "length": 4194304, "encoding": "base64"}),
    );
    assert_eq!(r["size"], 4194304);
    drop(h);
    w.check("1024 reads of 4 MiB, never read");
}

/// (c) `exec/run` with `maxOutput: 4e9` is E1004 naming the limit and exec/start; at the limit,
/// 1.5 GB of output keeps 16 MiB.
#[test]
fn exec_run_max_output_is_bounded() {
    let _one_at_a_time = serial();
    let (home, pid, mut c) = home_with_daemon(&[]);
    let sb = c.create(json!({}));
    let w = Watch::start(&home, pid);
    let e = c.call_err(
        "exec/run",
        json!({"sandbox": sb, "command": "head -c 1500000000 /dev/zero", "maxOutput": 4_000_000_000u64}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    assert!(e["message"].as_str().unwrap().contains("16777216"), "{e}");
    assert!(
        e["data"]["suggestion"]
            .as_str()
            .unwrap()
            .contains("exec/start"),
        "{e}"
    );
    let r = c.call(
        "exec/run",
        json!({"sandbox": sb, "command": "yes 0123456789abcdef | head -c 1500000000", "maxOutput": 16 * MIB}),
    );
    assert_eq!(r["truncated"], true);
    assert_eq!(r["stdout"].as_str().unwrap().len() as u64, 16 * MIB);
    w.check("exec/run of 1.5 GB at maxOutput 16 MiB");
}

/// Deep batches of `exec/start` to a client that never reads: every exec counts against the
/// in-flight limit, their output waits on the connection's budget.
#[test]
fn deep_batches_of_exec_start_to_a_client_that_never_reads() {
    let _one_at_a_time = serial();
    let (home, pid, mut c) = home_with_daemon(&[]);
    let sb = c.create(json!({}));
    let w = Watch::start(&home, pid);
    let batch = |base: usize| {
        format!(
            "[{}]",
            (0..1024)
                .map(|i| req(
                    base + i,
                    "exec/start",
                    json!({"sandbox": sb, "command": "echo started; head -c 4096 /dev/zero | tr '\\0' x"})
                ))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let h = never_reading(&home, &w, &[batch(0), batch(10_000)], 50);
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
    drop(h);
    w.check("2 batches of 1024 exec/start, never read");
}

/// Many `files/download` to a client that never reads its progress notifications.
#[test]
fn many_downloads_to_a_client_that_never_reads() {
    let _one_at_a_time = serial();
    let (home, pid, mut c) = home_with_daemon(&[]);
    let sb = c.create(json!({}));
    c.sh(&sb, "head -c 2097152 /dev/urandom > f.bin");
    let out = tempfile::tempdir().unwrap();
    let w = Watch::start(&home, pid);
    let lines: Vec<String> = (0..256)
        .map(|i| {
            req(
                i,
                "files/download",
                json!({"sandbox": sb, "path": "f.bin", "localPath": out.path().join(format!("d{i}")).to_str().unwrap()}),
            )
        })
        .collect();
    let mut s = UnixStream::connect(home.socket()).unwrap();
    s.write_all((lines.join("\n") + "\n").as_bytes()).unwrap();
    wait_until("downloads under way", LONG, || unread(&s) >= 16 * 1024);
    w.pings_answered(50);
    drop(s);
    w.check("256 downloads, never read");
}

/// A plugin replying with large results (py-local, `files/read` of 4 MiB as base64) to a
/// client that never reads: the calls wait for budget before they reach the plugin.
#[test]
fn a_plugin_replying_large_results_to_a_client_that_never_reads() {
    let _one_at_a_time = serial();
    let (home, pid, mut c) = home_with_daemon(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (_, full) = plugin_sandbox(&mut c, "py-local");
    c.sh(&full, "head -c 4194304 /dev/urandom > big.bin");
    let w = Watch::start(&home, pid);
    let lines: Vec<String> = (0..256)
        .map(|i| {
            req(
                i,
                "files/read",
                json!({"sandbox": full, "path": "big.bin", "length": 4194304, "encoding": "base64"}),
            )
        })
        .collect();
    let h = never_reading(&home, &w, &lines, 50);
    let r = c.call(
        "files/read",
        json!({"sandbox": full, "path": "big.bin", "length": 4194304, "encoding": "base64"}),
    );
    assert_eq!(r["size"], 4194304);
    drop(h);
    w.check("256 plugin reads of 4 MiB, never read");
}

/// A batch whose replies could not fit in the connection's budget: the elements past it
/// are answered E1005 (the rest run), never built.
#[test]
fn a_batch_of_large_reads_answers_what_fits_and_refuses_the_rest() {
    let _one_at_a_time = serial();
    let (_home, _pid, mut c) = home_with_daemon(&[]);
    let sb = c.create(json!({}));
    c.sh(&sb, "head -c 4194304 /dev/urandom > big.bin");
    let body = format!(
        "[{}]",
        (0..8)
            .map(|i| req(
                i,
                "files/read",
                json!({"sandbox": sb, "path": "big.bin", "encoding": "base64"})
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    c.send(&body);
    let v = c.recv();
    let items = v.as_array().expect("a batch reply");
    assert_eq!(items.len(), 8);
    let ok = items
        .iter()
        .filter(|r| r["result"]["size"] == 4194304)
        .count();
    let refused: Vec<&Value> = items.iter().filter(|r| r.get("error").is_some()).collect();
    assert!(ok >= 1 && ok + refused.len() == 8, "{ok} ok of 8");
    assert!(
        !refused.is_empty(),
        "8 reads of 4 MiB cannot all fit in 16 MiB"
    );
    for r in refused {
        assert_eq!(abx_code(&r["error"]), "E1005", "{r}");
        assert!(r["id"].is_number(), "{r}");
    }
}

/// A handler that panics is answered E9001 for its id, logged with its method; the
/// connection and the other requests carry on.
#[test]
fn a_panicking_handler_is_answered_e9001() {
    let _one_at_a_time = serial();
    let (home, _pid, mut c) = home_with_daemon(&[("ABX_TEST_HOOKS", "1")]);
    let v = c.request("$/abx/test/panic", json!({}));
    assert_eq!(abx_code(&v["error"]), "E9001", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("$/abx/test/panic"),
        "{v}"
    );
    // Same connection, concurrently with others in a batch.
    c.send(&format!(
        "[{},{}]",
        req(100, "$/abx/test/panic", json!({})),
        req(101, "broker/status", json!({}))
    ));
    let v = c.recv();
    let items = v.as_array().expect("a batch reply");
    assert_eq!(items.len(), 2, "{v}");
    let by_id = |id: i64| items.iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(abx_code(&by_id(100)["error"]), "E9001");
    assert!(by_id(101)["result"]["pid"].is_number());
    // Released: nothing is left in flight (status itself is answered inline, uncounted).
    assert_eq!(c.call("broker/status", Value::Null)["inFlight"], 0);
    wait_until("the panic in the log", Duration::from_secs(20), || {
        std::fs::read_to_string(home.log_file())
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("request handler panicked") && l.contains("$/abx/test/panic"))
    });
    // Without ABX_TEST_HOOKS the hook does not exist.
    let (_home2, _pid2, mut c2) = home_with_daemon(&[]);
    let v = c2.request("$/abx/test/panic", json!({}));
    assert_eq!(v["error"]["code"], -32601, "{v}");
}

// ---------------------------------------------------------------------------------------------
// Broker-wide budget (issue 18, second part): what many connections or many commands hold
// together
// ---------------------------------------------------------------------------------------------

/// The daemon is running (not gone, not a zombie).
fn daemon_up(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| s.contains("VmRSS:"))
}

/// Wait for `f`, failing at once (instead of at the timeout) when the daemon is gone.
fn wait_alive(what: &str, pid: u32, mut f: impl FnMut() -> bool) {
    wait_until(what, LONG, || {
        assert!(daemon_up(pid), "the daemon died while waiting for {what}");
        f()
    });
}

/// Many concurrent `exec/run` (32, on 4 connections) with 16 MiB of output each, on
/// connections that never read:
/// each command's output is counted in the broker-wide budget as it arrives (what does not
/// fit is dropped and said so: `truncated` and `memoryLimited`), so they cannot add up to
/// gigabytes.
#[test]
fn many_exec_runs_with_large_output_on_connections_that_never_read() {
    let _one_at_a_time = serial();
    let (home, pid, mut c) = home_with_daemon(&[]);
    let sb = c.create(json!({}));
    let w = Watch::start(&home, pid);
    // An odd size, so the commands are told apart from anything else on the machine.
    const CMD: &str = "head -c 16777213 /dev/zero";
    let conns: Vec<UnixStream> = (0..4)
        .map(|k| {
            let lines: Vec<String> = (0..8)
                .map(|i| {
                    req(
                        k * 100 + i,
                        "exec/run",
                        json!({"sandbox": sb, "command": format!("{CMD} | tr '\\0' a")}),
                    )
                })
                .collect();
            let mut s = UnixStream::connect(home.socket()).unwrap();
            s.write_all((lines.join("\n") + "\n").as_bytes()).unwrap();
            s
        })
        .collect();
    // Every connection got a reply (it waits in its socket) and every command has ended. A
    // reply may be small: while the others' output holds the budget, a connection's whole
    // output can be dropped (`memoryLimited`), which is what the budget promises.
    wait_alive("replies on every connection", pid, || {
        conns.iter().all(|s| unread(s) > 0)
    });
    wait_alive("every command ended", pid, || host_procs(CMD) == 0);
    w.pings_answered(50);
    // A neighbour's own exec/run still works meanwhile (small output).
    let r = c.call(
        "exec/run",
        json!({"sandbox": sb, "command": "echo neighbour"}),
    );
    assert_eq!(r["stdout"], "neighbour\n");
    drop(conns);
    w.check("32 exec/run of 16 MiB on 4 connections, never read");
}

/// 200 connections each with a full outbound queue (a `files/read` of 4 MiB as base64, never
/// read): the replies count against one broker-wide budget, not 200 connection budgets;
/// the pings of others keep being answered from their connections' own small allowance.
#[test]
fn two_hundred_connections_with_full_queues() {
    let _one_at_a_time = serial();
    let (home, pid, mut c) = home_with_daemon(&[]);
    let sb = c.create(json!({}));
    c.sh(&sb, "head -c 4194304 /dev/urandom > big.bin");
    let w = Watch::start(&home, pid);
    let line = req(
        1,
        "files/read",
        json!({"sandbox": sb, "path": "big.bin", "length": 4194304, "encoding": "base64"}),
    ) + "\n";
    let conns: Vec<UnixStream> = (0..200)
        .map(|_| {
            let mut s = UnixStream::connect(home.socket()).unwrap();
            let two = format!("{line}{}", line.replace("\"id\":1", "\"id\":2"));
            s.write_all(two.as_bytes()).unwrap();
            s
        })
        .collect();
    // The budget holds about 22 of these replies (two per connection, in the order they
    // were asked): at least 8 connections have one waiting.
    wait_alive("replies waiting in 8 sockets", pid, || {
        conns.iter().filter(|s| unread(s) >= 64 * 1024).count() >= 8
    });
    w.pings_answered(300);
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
    drop(conns);
    w.check("200 connections x 2 reads of 4 MiB, never read");
}

/// Processes on this machine whose command line contains `needle` (read from /proc here,
/// not asked of the daemon, so waiting adds no load to it).
fn host_procs(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                        String::from_utf8_lossy(&c)
                            .replace('\0', " ")
                            .contains(needle)
                    })
                })
                .count()
        })
        .unwrap_or(0)
}

/// Many streamed execs producing output nobody reads: first on a connection that never
/// reads (each stream waits for room before it reads a chunk, holding no buffer), then
/// detached (the connection went away: what is kept for a later `exec/attach` is bounded
/// per exec and in total).
#[test]
fn many_streamed_execs_whose_output_nobody_reads() {
    let _one_at_a_time = serial();
    let (home, pid, mut c) = home_with_daemon(&[]);
    let sb = c.create(json!({}));
    let w = Watch::start(&home, pid);
    // 300 x 1.5 MiB (one process each; NUL bytes, sent as base64). An odd size, so the
    // processes are told apart from anything else on the machine.
    const CMD: &str = "head -c 1572861 /dev/zero";
    let lines: Vec<String> = (0..300)
        .map(|i| {
            req(
                i,
                "exec/start",
                json!({"sandbox": sb, "argv": ["head", "-c", "1572861", "/dev/zero"]}),
            )
        })
        .collect();
    let h = never_reading(&home, &w, &lines, 50);
    // Most of them at once: those whose output fits the budget end (about 85), the others
    // wait with their output unread.
    wait_alive("the commands started", pid, || host_procs(CMD) >= 100);
    w.pings_answered(100);
    // Gone: every stream detaches and keeps what it can for an attach.
    drop(h);
    wait_alive("every command ended", pid, || host_procs(CMD) == 0);
    w.pings_answered(50);
    let st = c.call("broker/status", Value::Null);
    assert!(st["pid"].is_number(), "{st}");
    w.check("300 streamed execs of 1.5 MiB, never read, then detached");
}

/// `exec/run` output the broker-wide budget cannot hold is dropped and said so
/// (`truncated`, `memoryLimited`), never waited for (commands cannot deadlock each other) nor
/// held beyond it; once the budget is free again output is whole.
#[test]
fn exec_run_output_beyond_the_budget_is_dropped_and_said_so() {
    let _one_at_a_time = serial();
    let (_home, _pid, mut c) = home_with_daemon(&[("ABX_MEMORY_BUDGET", "8M")]);
    let sb = c.create(json!({}));
    let r = c.call(
        "exec/run",
        json!({"sandbox": sb, "command": "head -c 16777216 /dev/zero | tr '\\0' a"}),
    );
    assert_eq!(r["truncated"], true, "{}", r["exitCode"]);
    assert_eq!(r["memoryLimited"], true);
    assert_eq!(r["exitCode"], 0);
    let kept = r["stdout"].as_str().unwrap().len();
    assert!(kept > 0 && kept < 8 << 20, "{kept}");
    // The budget came back with the reply: the next one is whole, and says nothing.
    let r = c.call(
        "exec/run",
        json!({"sandbox": sb, "command": "head -c 1048576 /dev/zero | tr '\\0' b"}),
    );
    assert_eq!(r["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(r["truncated"], false);
    assert!(r.get("memoryLimited").is_none(), "{}", r["truncated"]);
}
