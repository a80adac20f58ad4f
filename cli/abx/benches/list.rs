//! Benchmark (not a test): `abx list` against a warm daemon, next to what a Node CLI pays
//! just to start (`node -e 0`, run without NODE_EXTRA_CA_CERTS), and a cold first call that
//! starts the daemon. Bar (docs/design.md#bars): warm `abx list` <= 0.1x node; goal (issue 20) 0.05x.
//! And the client's own process start, `abx --version`, beside a Rust hello-world built with
//! `rustc -O` (what any Rust binary pays to start: the thin client's floor).
//!
//! Run: `cargo bench -p abx-cli --bench list` (Cargo builds the `abx` binary of the same
//! profile first, and the bench then builds the daemon `abx-broker` beside it: see
//! `common::ensure_broker`). Otherwise the binaries are looked up in target/release, then
//! target/debug (build them first: `cargo build --release -p abx-cli -p abx-broker`).
//! `ABX_BENCH_N` sets the number of warm runs (default 200), taken in 8 rounds that
//! alternate with `node -e 0`'s. Figures are shown unpinned and
//! pinned to CPU 0 (each compared only with its baseline measured the same way); a pinned
//! child pins itself before its exec, as `taskset -c 0` would, so no figure carries a second
//! exec (`taskset`'s, or `env`'s for node). Absolute numbers are noted, not gated.

mod common;

use common::{cmd, have, setup, show, stats, time_one, Home, Stats};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Warm `abx list` / `node -e 0`: the bar (docs/design.md#bars) and the goal (issue 20).
const BAR: f64 = 0.1;
const GOAL: f64 = 0.05;

const HELLO_SRC: &str = "fn main() {\n    println!(\"hello\");\n}\n";

/// A Rust hello-world built with `rustc -O` into `<target>/bench-hello/` beside `abx`'s
/// profile dir, rebuilt only when missing or its source changed.
fn hello(abx: &Path) -> Result<PathBuf, String> {
    let target = abx
        .parent()
        .and_then(Path::parent)
        .ok_or("abx has no target dir")?;
    let dir = target.join("bench-hello");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let src = dir.join("hello.rs");
    let bin = dir.join("hello");
    let fresh = bin.is_file() && std::fs::read_to_string(&src).is_ok_and(|s| s == HELLO_SRC);
    if !fresh {
        std::fs::write(&src, HELLO_SRC).map_err(|e| format!("{}: {e}", src.display()))?;
        let st = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
            .args(["-O", "--edition", "2021", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .map_err(|e| format!("cannot run rustc: {e}"))?;
        if !st.success() {
            return Err(format!("rustc -O {} failed: {st}", src.display()));
        }
    }
    Ok(bin)
}

fn version(abx: &Path, pinned: bool, n: usize) -> Stats {
    let home = Home::new(abx);
    for _ in 0..5 {
        time_one(home.abx(pinned, &["--version"]));
    }
    stats(
        (0..n)
            .map(|_| time_one(home.abx(pinned, &["--version"])))
            .collect(),
    )
}

fn run_n(argv: &[&str], pinned: bool, n: usize) -> Stats {
    for _ in 0..5 {
        time_one(cmd(pinned, argv));
    }
    stats((0..n).map(|_| time_one(cmd(pinned, argv))).collect())
}

fn us(d: std::time::Duration) -> String {
    format!("{:.0} us", d.as_secs_f64() * 1e6)
}

fn verdict(ratio: f64, limit: f64) -> &'static str {
    if ratio <= limit {
        "met"
    } else {
        "MISSED"
    }
}

/// Warm `abx list` and `node -e 0`, taken in alternating rounds (8 of each), so that what
/// the machine's neighbours do over the run weighs on both alike: the ratio is what counts.
fn warm_list_and_node(abx: &Path, pinned: bool, n: usize, node: bool) -> (Stats, Option<Stats>) {
    let home = Home::new(abx);
    // The daemon inherits the pinning of the command that starts it.
    time_one(home.abx(pinned, &["broker", "start"]));
    for _ in 0..3 {
        time_one(home.abx(pinned, &["create", "--timeout", "600"]));
    }
    for _ in 0..10 {
        time_one(home.abx(pinned, &["list"]));
    }
    let node_cmd = || {
        let mut c = cmd(pinned, &["node", "-e", "0"]);
        c.env_remove("NODE_EXTRA_CA_CERTS");
        c
    };
    if node {
        for _ in 0..3 {
            time_one(node_cmd());
        }
    }
    const ROUNDS: usize = 8;
    let (mut lists, mut nodes) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        for _ in 0..n.div_ceil(ROUNDS) {
            lists.push(time_one(home.abx(pinned, &["list"])));
        }
        if node {
            for _ in 0..(n / 4).max(10).div_ceil(ROUNDS) {
                nodes.push(time_one(node_cmd()));
            }
        }
    }
    (stats(lists), node.then(|| stats(nodes)))
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
    let hello = hello(&abx);
    println!("abx list benchmark");
    println!("  binary: {}", abx.display());
    println!(
        "  daemon: {} (beside abx)",
        abx.with_file_name("abx-broker").display()
    );
    match &hello {
        Ok(h) => println!("  hello-world: {} (rustc -O)", h.display()),
        Err(e) => println!("  hello-world: not built ({e}): its baseline is skipped"),
    }
    if abx.components().any(|c| c.as_os_str() == "debug") {
        println!("  note: a debug build; use a release build for figures that mean something");
    }
    let modes: &[bool] = &[false, true];
    for &pinned in modes {
        println!(
            "\n{}",
            if pinned {
                "pinned (CPU 0: client and daemon on one CPU)"
            } else {
                "unpinned"
            }
        );
        let (warm, nd) = warm_list_and_node(&abx, pinned, n, have_node);
        show("abx list (warm daemon)", &warm);
        let cold = cold_list(&abx, pinned, 5.min(n));
        show("abx list (cold: starts it)", &cold);
        if let Some(nd) = nd {
            show("node -e 0", &nd);
            let r50 = warm.p50.as_secs_f64() / nd.p50.as_secs_f64();
            let rmean = warm.mean.as_secs_f64() / nd.mean.as_secs_f64();
            let rcold = cold.p50.as_secs_f64() / nd.p50.as_secs_f64();
            println!(
                "  ratio warm/node: p50 {r50:.3}x, mean {rmean:.3}x (bar <= {BAR}x: {}; goal <= {GOAL}x: {})",
                verdict(r50, BAR),
                verdict(r50, GOAL)
            );
            println!("  ratio cold/node: p50 {rcold:.3}x (noted, no bar)");
        } else {
            println!("  node not found: the node baseline and the ratios are skipped");
        }
        let ver = version(&abx, pinned, n);
        show("abx --version", &ver);
        if let Ok(h) = &hello {
            let hs = run_n(&[h.to_str().expect("utf-8 path")], pinned, n);
            show("hello-world (rustc -O)", &hs);
            println!(
                "  ratio abx --version / hello-world: p50 {:.2}x, mean {:.2}x (abx {} vs {} p50, {} vs {} min; noted, no bar)",
                ver.p50.as_secs_f64() / hs.p50.as_secs_f64(),
                ver.mean.as_secs_f64() / hs.mean.as_secs_f64(),
                us(ver.p50),
                us(hs.p50),
                us(ver.min),
                us(hs.min)
            );
        }
    }
}
