//! Benchmark (not a test): `abx list` against a warm daemon, next to what a Node CLI pays
//! just to start (`env -u NODE_EXTRA_CA_CERTS node -e 0`), and a cold first call that
//! starts the daemon. Bar (DESIGN §13): warm `abx list` <= 0.1x node.
//!
//! Run: `cargo bench -p abx-cli --bench list` (Cargo builds the `abx` binary of the same
//! profile first). Otherwise the binary is looked up in target/release, then target/debug
//! (build it first: `cargo build --release -p abx-cli`). `ABX_BENCH_N` sets the number of
//! warm runs (default 200). Figures are shown unpinned and pinned to one CPU with taskset
//! (each compared only with its baseline measured the same way); absolute numbers are
//! noted, not gated.

mod common;

use common::{cmd, have, setup, show, stats, time_one, Home, Stats};
use std::path::Path;

fn warm_list(abx: &Path, pinned: bool, n: usize) -> Stats {
    let home = Home::new(abx);
    // The daemon inherits the pinning of the command that starts it.
    time_one(home.abx(pinned, &["broker", "start"]));
    for _ in 0..3 {
        time_one(home.abx(pinned, &["create", "--timeout", "600"]));
    }
    for _ in 0..10 {
        time_one(home.abx(pinned, &["list"]));
    }
    stats(
        (0..n)
            .map(|_| time_one(home.abx(pinned, &["list"])))
            .collect(),
    )
}

fn node(pinned: bool, n: usize) -> Stats {
    let argv = ["env", "-u", "NODE_EXTRA_CA_CERTS", "node", "-e", "0"];
    for _ in 0..3 {
        time_one(cmd(pinned, &argv));
    }
    stats((0..n).map(|_| time_one(cmd(pinned, &argv))).collect())
}

fn cold_list(abx: &Path, pinned: bool, n: usize) -> Stats {
    stats(
        (0..n)
            .map(|_| {
                let home = Home::new(abx);
                time_one(home.abx(pinned, &["list"]))
            })
            .collect(),
    )
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let (abx, n) = setup(200);
    let have_node = have("node", "--version");
    let have_taskset = have("taskset", "-V");
    println!("abx list benchmark");
    println!("  binary: {}", abx.display());
    if abx.components().any(|c| c.as_os_str() == "debug") {
        println!("  note: a debug build; use a release build for figures that mean something");
    }
    let modes: &[bool] = if have_taskset {
        &[false, true]
    } else {
        &[false]
    };
    for &pinned in modes {
        println!(
            "\n{}",
            if pinned {
                "pinned (taskset -c 0: client and daemon on one CPU)"
            } else {
                "unpinned"
            }
        );
        let warm = warm_list(&abx, pinned, n);
        show("abx list (warm daemon)", &warm);
        let cold = cold_list(&abx, pinned, 5.min(n));
        show("abx list (cold: starts it)", &cold);
        if have_node {
            let nd = node(pinned, (n / 4).max(10));
            show("node -e 0", &nd);
            let r50 = warm.p50.as_secs_f64() / nd.p50.as_secs_f64();
            let rmean = warm.mean.as_secs_f64() / nd.mean.as_secs_f64();
            let rcold = cold.p50.as_secs_f64() / nd.p50.as_secs_f64();
            println!(
                "  ratio warm/node: p50 {r50:.3}x, mean {rmean:.3}x (bar <= 0.1x: {})",
                if r50 <= 0.1 { "met" } else { "MISSED" }
            );
            println!("  ratio cold/node: p50 {rcold:.3}x (noted, no bar)");
        } else {
            println!("  node not found: the node baseline and the ratios are skipped");
        }
    }
}
