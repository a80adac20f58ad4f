//! Benchmark (not a test): a `local` sandbox's whole life through the CLI, `abx run -- true`
//! (create, exec, kill on a warm daemon), against bubblewrap doing the same isolation
//! one-shot (`bwrap --unshare-all` with a read-only /usr, its own /proc, /dev and /tmp,
//! `true`). Bar (issue 17): <= 3x, goal 1.5x. Also `sandbox/create` latency per network mode
//! (`abx create --network M`, each followed by an untimed kill).
//!
//! Run: `cargo bench -p abx-cli --bench sandbox` (see the list bench for how `abx` is found).
//! `ABX_BENCH_N` sets the number of runs (default 50). Unpinned and pinned to one CPU.

mod common;

use common::{cmd, have, setup, show, stats, time_one, Home, Stats};
use std::process::{Command, Stdio};

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

fn main() {
    let (abx, n) = setup(50);
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
        time_one(home.abx(pinned, &["broker", "start"]));
        let run = abx_run(&home, pinned, n);
        show("abx run -- true", &run);
        if have_bwrap {
            let b = bwrap(pinned, n);
            show("bwrap --unshare-all true", &b);
            let r = run.p50.as_secs_f64() / b.p50.as_secs_f64();
            println!(
                "  ratio abx run / bwrap: p50 {r:.2}x (bar <= 3x: {}; goal 1.5x)",
                if r <= 3.0 { "met" } else { "MISSED" }
            );
        } else {
            println!("  bwrap not found (apt install bubblewrap): no baseline");
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
