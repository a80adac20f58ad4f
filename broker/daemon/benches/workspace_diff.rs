//! `sandbox/diff` (issue 43), measured, never asserted:
//!
//! 1. **Diff of 1,000 changed files in a 100,000-file tree** against `git status --porcelain`
//!    of the same change in a git checkout of the same tree (bar <= 1x, goal <= 0.3x), median
//!    of R runs each, pinned and unpinned. Two forms of the diff: the engine itself
//!    (`abx_local::workspace::changes::diff` on an upper dir holding the 1,000 changed files,
//!    as overlayfs leaves it) and, where `sandbox/create` takes mounts, `sandbox/diff` through
//!    a real daemon on a sandbox whose commands made the change.
//! 2. **Large forms** (opt-in: `ABX_BENCH_BIG=1`, or the filter word `big`; `scripts/bench
//!    workspace` with `--big`): an upper dir of 1,000,000 new files (the diff stops at 100,000
//!    entries, `truncated`) and a 10 GiB file changed in its last byte (diff, then apply),
//!    each with the time and the growth of this process's peak RSS: memory must not grow with
//!    the size of a file nor with the number of entries past the cut.
//!
//! Usage: `cargo bench -p abx-broker --bench workspace_diff [pinned|unpinned|big]`.
//! Environment: `ABX_BENCH_QUICK=1` (20,000 files, 200 changed), `ABX_BENCH_FILES`,
//! `ABX_BENCH_CHANGED`, `ABX_BENCH_ROUNDS` (default 7), `ABX_BENCH_CPU`.

mod common;
use abx_local::workspace::changes::{self, Layers, Selection};
use common::{env_parse, median, Mode, Out, Res, Spawned};
use serde_json::json;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn main() {
    common::main("workspace_diff", &[], orchestrate);
}

fn e<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn run(cmd: &mut Command) -> Res<String> {
    let o = cmd.output().map_err(e)?;
    if !o.status.success() {
        return Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn git(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(dir)
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@localhost")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@localhost");
    c
}

/// `files` files of about 40 bytes, 100 to a directory.
fn tree(root: &Path, files: usize) -> Res<()> {
    for i in 0..files {
        let d = root.join(format!("d{:04}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).map_err(e)?;
        }
        std::fs::write(
            d.join(format!("f{:03}.txt", i % 100)),
            format!("file {i}\nsome content\n"),
        )
        .map_err(e)?;
    }
    Ok(())
}

/// The relative paths of the changed files: spread over the tree.
fn changed_paths(files: usize, changed: usize) -> Vec<String> {
    let step = (files / changed.max(1)).max(1);
    (0..changed)
        .map(|k| {
            let i = (k * step) % files;
            format!("d{:04}/f{:03}.txt", i / 100, i % 100)
        })
        .collect()
}

fn change(root: &Path, rel: &str) -> Res<()> {
    let p = root.join(rel);
    let mut s = std::fs::read_to_string(&p).map_err(e)?;
    s.push_str("changed\n");
    std::fs::write(&p, s).map_err(e)
}

fn time_ms(f: &mut dyn FnMut() -> Res<()>) -> Res<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

fn layers(upper: &Path, lower: &Path, state: &Path) -> Layers {
    let st = std::fs::metadata(lower).ok();
    Layers {
        upper: upper.to_path_buf(),
        source: lower.to_path_buf(),
        source_id: st.map(|s| (s.dev(), s.ino())),
        target: "/workspace".into(),
        created_ns: 0,
        owner: None,
        state: state.to_path_buf(),
        upper_owner: None,
    }
}

fn engine_diff(l: &Layers) -> Res<usize> {
    let mut budget = changes::MAX_PATCH_TOTAL;
    let (c, _) =
        changes::diff(l, &Selection::default(), false, &mut budget).map_err(|e| e.message)?;
    Ok(c.len())
}

fn hwm_kib() -> u64 {
    common::status_kib(std::process::id(), "VmHWM").unwrap_or(0)
}

fn orchestrate() -> Res<()> {
    let started = Instant::now();
    let quick = common::quick();
    let words = common::filter_words();
    let big = words.iter().any(|w| w == "big")
        || matches!(std::env::var("ABX_BENCH_BIG").as_deref(), Ok(v) if !v.is_empty() && v != "0");
    let files: usize =
        env_parse("ABX_BENCH_FILES")?.unwrap_or(if quick { 20_000 } else { 100_000 });
    let changed: usize = env_parse("ABX_BENCH_CHANGED")?.unwrap_or(if quick { 200 } else { 1000 });
    let rounds: usize = env_parse("ABX_BENCH_ROUNDS")?.unwrap_or(if quick { 3 } else { 7 });
    let pin = common::pin_cpu()?;
    let modes = common::modes(
        "workspace_diff",
        words.iter().any(|w| w == "pinned"),
        words.iter().any(|w| w == "unpinned"),
        pin,
    );
    let mut out = Out::new("workspace_diff")?;
    out.header(pin, quick);

    let t = tempfile::tempdir().map_err(e)?;
    let lower = t.path().join("tree");
    let wt = t.path().join("checkout");
    let upper = t.path().join("upper");
    let state = t.path().join("state");
    std::fs::create_dir_all(&upper).map_err(e)?;
    std::fs::create_dir_all(&state).map_err(e)?;
    out.table(&format!(
        "\nbuilding a {files}-file tree, a git checkout of it and {changed} changed files ...\n"
    ));
    tree(&lower, files)?;
    run(git(&lower).args(["init", "-q"]))?;
    // No background gc (it packs the 100,000 loose objects while the tree is copied).
    run(git(&lower).args(["config", "gc.auto", "0"]))?;
    run(git(&lower).args(["config", "maintenance.auto", "false"]))?;
    run(git(&lower).args(["add", "-A"]))?;
    run(git(&lower).args(["commit", "-qm", "tree"]))?;
    run(Command::new("cp").arg("-a").arg(&lower).arg(&wt))?;
    let paths = changed_paths(files, changed);
    for rel in &paths {
        change(&wt, rel)?;
        // The upper dir as overlayfs leaves it: the changed file copied up, its directory too.
        let u = upper.join(rel);
        std::fs::create_dir_all(u.parent().expect("parent")).map_err(e)?;
        std::fs::copy(wt.join(rel), &u).map_err(e)?;
    }
    // git's index refreshed once (its stat cache), as in a checkout someone works in.
    run(git(&wt).args(["update-index", "-q", "--refresh"]))?;
    let porcelain = run(git(&wt).args(["status", "--porcelain"]))?;
    let l = layers(&upper, &lower, &state);
    let n = engine_diff(&l)?;
    if n != changed || porcelain.lines().count() != changed {
        return Err(format!(
            "expected {changed} changes: the engine found {n}, git {}",
            porcelain.lines().count()
        ));
    }

    // The sandbox path, where mounts work: a sandbox whose commands change the same files.
    let home = tempfile::tempdir().map_err(e)?;
    let daemon = Spawned::daemon(home.path(), None, &[]).ok();
    let mut sandbox: Option<(common::UnixRpc, String)> = None;
    if let Some(d) = &daemon {
        let mut rpc = d.rpc()?;
        match rpc.call(
            "sandbox/create",
            json!({"mounts": [{"source": lower, "target": "/workspace/proj"}], "timeout": 3600}),
        ) {
            Ok(r) if r["id"].is_string() => {
                let id = r["id"].as_str().unwrap_or_default().to_owned();
                let script: String = paths
                    .iter()
                    .map(|p| format!("echo changed >> {p}\n"))
                    .collect();
                let r = rpc.call(
                    "exec/run",
                    json!({"sandbox": id, "argv": ["sh", "-c", format!("cd /workspace/proj && {script}")]}),
                )?;
                if r["exitCode"] == 0 {
                    sandbox = Some((rpc, id));
                } else {
                    out.table(&format!("  (the sandbox could not make the change: {r})\n"));
                }
            }
            other => out.table(&format!(
                "  (sandbox/diff through the daemon not measured: sandbox/create with mounts answered {other:?})\n"
            )),
        }
    }

    for mode in modes {
        let cpu = mode.cpu(pin);
        common::pin_if(cpu)?;
        let before = common::cpu_snap(&[]);
        let (mut ours, mut theirs, mut daemon_ms) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            ours.push(time_ms(&mut || engine_diff(&l).map(|_| ()))?);
            theirs.push(time_ms(&mut || {
                let mut c = git(&wt);
                c.args(["status", "--porcelain"]);
                common::pin_cmd(&mut c, cpu);
                run(&mut c).map(|_| ())
            })?);
            if let Some((rpc, id)) = sandbox.as_mut() {
                daemon_ms.push(time_ms(&mut || {
                    let r = rpc.call("sandbox/diff", json!({"sandbox": id}))?;
                    let n = r["changes"].as_array().map_or(0, Vec::len);
                    if n != changed {
                        return Err(format!("sandbox/diff listed {n}, not {changed}"));
                    }
                    Ok(())
                })?);
            }
        }
        if mode == Mode::Pinned {
            common::pin_if(None).ok();
            // Back to every allowed CPU.
            let _ = reset_affinity();
        }
        let (o, g) = (median(&ours).unwrap_or(0.0), median(&theirs).unwrap_or(0.0));
        out.table(&format!(
            "\n[{}] {changed} changed in {files} files, median of {rounds}\n  \
             diff (engine)            {o:9.2} ms\n  git status --porcelain   {g:9.2} ms\n",
            mode.name()
        ));
        out.ratio(
            "diff of 1000 changed in 100k files",
            mode,
            "engine",
            "git status",
            o / g.max(1e-9),
            Some(("<=", 1.0)),
        );
        if let Some(dm) = median(&daemon_ms) {
            out.table(&format!("  sandbox/diff (daemon)    {dm:9.2} ms\n"));
            out.ratio(
                "diff of 1000 changed in 100k files",
                mode,
                "sandbox/diff",
                "git status",
                dm / g.max(1e-9),
                Some(("<=", 1.0)),
            );
        }
        out.noise(mode.name(), before, common::cpu_snap(&[]));
    }
    if let Some(d) = daemon {
        drop(sandbox);
        d.stop()?;
    }

    if big {
        big_forms(&mut out, t.path())?;
    } else {
        out.table("\n(the large forms: ABX_BENCH_BIG=1 or the filter word `big`)\n");
    }
    out.finish(started);
    Ok(())
}

fn reset_affinity() -> std::io::Result<()> {
    // SAFETY: a cpu_set_t filled with every CPU, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// 1,000,000 new files; a 10 GiB file changed in its last byte.
fn big_forms(out: &mut Out, dir: &Path) -> Res<()> {
    let lower = dir.join("big-lower");
    let upper = dir.join("big-upper");
    let state = dir.join("big-state");
    for d in [&lower, &upper, &state] {
        std::fs::create_dir_all(d).map_err(e)?;
    }
    let n: usize = env_parse("ABX_BENCH_BIG_FILES")?.unwrap_or(1_000_000);
    out.table(&format!("\nlarge forms: {n} new files ...\n"));
    for i in 0..n {
        let d = upper.join(format!("d{:04}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir(&d).map_err(e)?;
        }
        std::fs::File::create(d.join(format!("{i}"))).map_err(e)?;
    }
    let l = layers(&upper, &lower, &state);
    let h0 = hwm_kib();
    let t0 = Instant::now();
    let mut budget = changes::MAX_PATCH_TOTAL;
    let (c, truncated) =
        changes::diff(&l, &Selection::default(), false, &mut budget).map_err(|e| e.message)?;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    let grew = hwm_kib().saturating_sub(h0);
    out.table(&format!(
        "  diff of {n} new files: {} listed, truncated {truncated}, {ms:.0} ms, peak RSS +{} MiB\n",
        c.len(),
        grew / 1024
    ));
    out.check(
        "diff of 1M new files stops at 100k",
        "unpinned",
        truncated && c.len() == changes::MAX_ENTRIES,
        &format!("{}", c.len()),
        "100000 cut",
    );
    out.absolute(
        "diff of 1M new files: peak RSS growth",
        "unpinned",
        grew as f64 / 1024.0,
        "MiB",
        ("<=", 128.0),
    );
    drop(c);
    std::fs::remove_dir_all(&upper).map_err(e)?;
    std::fs::create_dir_all(&upper).map_err(e)?;

    // 10 GiB, sparse on both sides, the last byte differing.
    let size: u64 = common::env_bytes("ABX_BENCH_BIG_FILE")?.unwrap_or(10 << 30);
    out.table(&format!(
        "large forms: a {} file changed in its last byte ...\n",
        common::human_bytes(size)
    ));
    for (p, last) in [(lower.join("huge"), b'a'), (upper.join("huge"), b'b')] {
        let f = std::fs::File::create(&p).map_err(e)?;
        f.set_len(size).map_err(e)?;
        use std::os::unix::fs::FileExt;
        f.write_at(&[last], size - 1).map_err(e)?;
    }
    let h0 = hwm_kib();
    let t0 = Instant::now();
    let mut budget = changes::MAX_PATCH_TOTAL;
    let (c, _) =
        changes::diff(&l, &Selection::default(), true, &mut budget).map_err(|e| e.message)?;
    let diff_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let t0 = Instant::now();
    let mut r = abx_protocol::api::ApplyResult::default();
    changes::apply(&l, &Selection::default(), false, true, &mut r).map_err(|e| e.message)?;
    let apply_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let grew = hwm_kib().saturating_sub(h0);
    out.table(&format!(
        "  diff (with patch) {diff_ms:.0} ms: {:?}; apply {apply_ms:.0} ms ({} applied); peak RSS +{} MiB\n",
        c.first().map(|c| (&c.change, c.size)),
        r.applied.len(),
        grew / 1024
    ));
    out.absolute(
        "diff + apply of a 10 GiB file: peak RSS growth",
        "unpinned",
        grew as f64 / 1024.0,
        "MiB",
        ("<=", 64.0),
    );
    Ok(())
}
