//! Benchmark (not a test): workspaces through the CLI (issue 43), ratios measured in one run,
//! unpinned and pinned to CPU 0:
//!
//! 1. `abx create --mount TREE` (an overlay mount of a 100,000-file tree) against `abx create`
//!    without a mount, each followed by an untimed kill. Bar <= 1.2x: no copy of the tree is
//!    made at create, so the mount costs an open, its checks and a mount.
//! 2. `abx run --mount REPO -- git status` (this repository, overlay) against `git status` on
//!    the host in the same repository. Bar <= 2x.
//!
//! Run: `cargo bench -p abx-cli --bench workspace` (see the list bench for how `abx` is
//! found). `ABX_BENCH_N` sets the number of runs (default 30), `ABX_BENCH_FILES` the tree's
//! size (default 100,000), `ABX_BENCH_REPO` the repository (default: this one).

mod common;

use common::{cmd, setup, show, stats, time_one, Home, Stats};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

/// `files` files of about 40 bytes, 100 to a directory.
fn tree(root: &Path, files: usize) {
    for i in 0..files {
        let d = root.join(format!("d{:04}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).expect("mkdir");
        }
        std::fs::write(
            d.join(format!("f{:03}.txt", i % 100)),
            format!("file {i}\nsome content\n"),
        )
        .expect("write");
    }
}

/// `abx -j create [--mount SRC]`, timed, then killed untimed.
fn create(home: &Home, pinned: bool, mount: Option<&str>, n: usize) -> Stats {
    let mut v = Vec::new();
    for _ in 0..n {
        let mut args = vec!["-j", "create"];
        if let Some(m) = mount {
            args.extend(["--mount", m]);
        }
        let t = Instant::now();
        let out = home
            .abx(pinned, &args)
            .stdout(Stdio::piped())
            .output()
            .expect("abx create");
        v.push(t.elapsed());
        assert!(out.status.success(), "abx {args:?} failed");
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("create -j");
        let id = j["id"].as_str().expect("id").to_owned();
        time_one(home.abx(pinned, &["kill", "--yes", &id]));
    }
    stats(v)
}

fn ratio(what: &str, a: &Stats, b: &Stats, bar: f64) {
    let r = a.p50.as_secs_f64() / b.p50.as_secs_f64();
    println!(
        "  ratio {what}: p50 {r:.2}x (bar <= {bar}x: {})",
        if r <= bar { "met" } else { "MISSED" }
    );
}

fn main() {
    let (abx, n) = setup(30);
    let files: usize = std::env::var("ABX_BENCH_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let repo: PathBuf = std::env::var_os("ABX_BENCH_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .canonicalize()
        .expect("repository");
    let t = tempfile::Builder::new()
        .prefix("abx-bench-tree")
        .tempdir()
        .expect("tempdir");
    let src = t.path().join("tree");
    println!("workspace benchmark\n  binary: {}", abx.display());
    println!("  building a {files}-file tree ...");
    tree(&src, files);
    let src = src.to_str().expect("utf-8").to_owned();
    let repo_s = repo.to_str().expect("utf-8").to_owned();
    let git_status = ["git", "-C", repo_s.as_str(), "status", "--porcelain"];
    for pinned in [false, true] {
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
        // Warm: the daemon's zygote, the page cache of the tree and of the repository.
        create(&home, pinned, Some(&src), 2);
        let plain = create(&home, pinned, None, n);
        let mounted = create(&home, pinned, Some(&src), n);
        show("abx create", &plain);
        show(&format!("abx create --mount ({files} files)"), &mounted);
        ratio("create with a mount / without", &mounted, &plain, 1.2);

        let run = [
            "run",
            "--mount",
            repo_s.as_str(),
            "--",
            "git",
            "status",
            "--porcelain",
        ];
        for _ in 0..2 {
            time_one(home.abx(pinned, &run));
            time_one(cmd(pinned, &git_status));
        }
        let host = stats((0..n).map(|_| time_one(cmd(pinned, &git_status))).collect());
        let inside = stats((0..n).map(|_| time_one(home.abx(pinned, &run))).collect());
        show("git status (host)", &host);
        show("abx run --mount . -- git status", &inside);
        ratio(
            "abx run --mount . -- git status / git status",
            &inside,
            &host,
            2.0,
        );
    }
}
