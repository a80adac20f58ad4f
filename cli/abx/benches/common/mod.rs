//! What the CLI benches share: finding `abx` and the daemon binary `abx-broker` beside it
//! (built first under cargo), timing commands (optionally pinned to CPU 0, as `taskset -c 0` would, without its exec), percentiles, and
//! a throwaway `ABX_HOME` whose daemon is stopped on drop.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `prog arg` runs and succeeds (a tool is installed).
pub fn have(prog: &str, arg: &str) -> bool {
    Command::new(prog)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The `abx` binary and the number of runs (`ABX_BENCH_N`, else `default_n`), with the
/// daemon binary in place beside `abx` ([`ensure_broker`]); exits when either is missing.
pub fn setup(default_n: usize) -> (PathBuf, usize) {
    let Some(abx) = find_abx() else {
        eprintln!("abx binary not found: build it first (cargo build --release -p abx-cli)");
        std::process::exit(1);
    };
    if let Err(e) = ensure_broker(&abx) {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let n = std::env::var("ABX_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_n);
    (abx, n)
}

pub fn find_abx() -> Option<PathBuf> {
    if let Some(p) = option_env!("CARGO_BIN_EXE_abx") {
        if Path::new(p).exists() {
            return Some(p.into());
        }
    }
    let mut roots = vec![];
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/deps/list-xxxx -> target
        if let Some(t) = exe.parent().and_then(Path::parent).and_then(Path::parent) {
            roots.push(t.to_path_buf());
        }
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        roots.push(t.into());
    }
    roots.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    for r in roots {
        for profile in ["release", "debug"] {
            let p = r.join(profile).join("abx");
            if p.exists() {
                return Some(p);
            }
        }
    }
    None
}

/// `abx` starts the daemon from `abx-broker` beside it (abx-client's `spawn.rs`), and
/// `cargo bench -p abx-cli` builds only abx-cli's binary: the daemon is another package's.
/// So under cargo (`CARGO` set) build it first with the same cargo and profile (a no-op when
/// it is fresh; never a stale daemon, and never a build inside a timed `abx` call); outside
/// cargo use the one beside `abx` as it is.
pub fn ensure_broker(abx: &Path) -> Result<PathBuf, String> {
    let dir = abx.parent().ok_or("abx has no directory")?;
    let broker = dir.join("abx-broker");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let release = dir.file_name().is_some_and(|n| n == "release");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let mut c = Command::new(cargo);
        c.args([
            "build",
            "--quiet",
            "-p",
            "abx-broker",
            "--bin",
            "abx-broker",
        ])
        .arg("--manifest-path")
        .arg(&manifest);
        if release {
            c.arg("--release");
        }
        eprintln!("building abx-broker beside {} ...", abx.display());
        let st = c.status().map_err(|e| format!("cannot run cargo: {e}"))?;
        if !st.success() {
            return Err(format!("cargo build -p abx-broker failed: {st}"));
        }
    }
    if broker.is_file() {
        Ok(broker)
    } else {
        Err(format!(
            "{} is missing: build it (cargo build --release -p abx-broker)",
            broker.display()
        ))
    }
}

/// A command, optionally pinned to CPU 0. The child pins itself between fork and exec
/// (`sched_setaffinity`), so a pinned figure times the command alone: through `taskset` every
/// pinned figure carried a second exec (about 1.2 ms here), the baselines' too.
pub fn cmd(pinned: bool, argv: &[&str]) -> Command {
    let mut c = Command::new(argv[0]);
    c.args(&argv[1..]);
    if pinned {
        use std::os::unix::process::CommandExt;
        // SAFETY: only an async-signal-safe call (sched_setaffinity) runs after fork.
        unsafe {
            c.pre_exec(|| {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

pub fn time_one(mut c: Command) -> Duration {
    let t = Instant::now();
    let st = c.status().expect("spawn");
    let d = t.elapsed();
    assert!(st.success(), "{c:?} failed: {st}");
    d
}

pub struct Stats {
    pub p50: Duration,
    pub p90: Duration,
    pub mean: Duration,
    pub min: Duration,
    pub n: usize,
}

pub fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let n = v.len();
    Stats {
        p50: v[n / 2],
        p90: v[(n * 9 / 10).min(n - 1)],
        mean: v.iter().sum::<Duration>() / n as u32,
        min: v[0],
        n,
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

pub fn show(name: &str, s: &Stats) {
    println!(
        "  {name:<28} p50 {:>10}  p90 {:>10}  mean {:>10}  min {:>10}  (n={})",
        ms(s.p50),
        ms(s.p90),
        ms(s.mean),
        ms(s.min),
        s.n
    );
}

pub struct Home {
    dir: tempfile::TempDir,
    abx: PathBuf,
}

impl Home {
    pub fn new(abx: &Path) -> Home {
        Home {
            dir: tempfile::Builder::new()
                .prefix("abx-bench")
                .tempdir()
                .expect("tempdir"),
            abx: abx.to_path_buf(),
        }
    }

    pub fn abx(&self, pinned: bool, args: &[&str]) -> Command {
        let abx = self.abx.to_str().expect("utf-8 path");
        let mut argv = vec![abx];
        argv.extend_from_slice(args);
        let mut c = cmd(pinned, &argv);
        // No CARGO*: `abx` run by cargo would build a missing daemon itself (spawn.rs).
        c.env("ABX_HOME", self.dir.path())
            .env_remove("CARGO")
            .env_remove("CARGO_MANIFEST_DIR")
            .env_remove("ABX_BROKER_BIN")
            .env_remove("ABX_PROVIDER")
            .env("ABX_NO_REPLACE", "1");
        c
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = self.abx(false, &["broker", "stop"]).status();
    }
}
