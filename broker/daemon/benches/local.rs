//! Local-provider bars of docs/design.md#bars (issue #3), measured side by side in one run (never
//! asserted):
//!
//! 1. **Exec output streaming.** `head -c N /dev/zero` in a local sandbox through `exec/start`,
//!    the client reading `exec/output` until `exec/exit` and counting decoded bytes, against
//!    `head -c N /dev/zero | cat > /dev/null` (bar: >= 0.25x its GiB/s). NUL bytes are valid
//!    UTF-8 but cost 6 bytes each as `\u0000`, so the broker sends them as base64; the same
//!    is measured with `/dev/urandom` (not UTF-8, base64 too) against its own `head | cat`. Unpinned
//!    and pinned (daemon, its sandboxed `head`, the client and the baseline pipeline all on one
//!    CPU).
//! 2. **Upload and download.** `files/upload` and `files/download` of one N-byte random file
//!    (made once in the temp dir, beside the daemon's home: one filesystem) against `cp` of the
//!    same file (bar: >= 0.5x), sha256 of source, uploaded and downloaded copies identical (the
//!    `sha256sum` binary), and the daemon's peak RSS (`VmHWM`, bar: <= 64 MiB). A fresh daemon
//!    serves this figure, since a peak cannot be reset. `sync` runs (untimed) before each
//!    timed copy so no copy pays for an earlier one's writeback. The three copies take turns
//!    at going first, second and third (rounds come in threes): on these VMs a copy's speed
//!    depends on its place in a run of copies (plain `cp`, five 1 GiB copies in a row after
//!    freeing the last run's: ~2 GiB/s for the first, ~0.45 GiB/s for the last ones), so a
//!    fixed order favours whoever goes first.
//!    Unpinned only.
//! 3. **Idle memory.** A fresh daemon's RSS after one ping (bar: <= 10 MiB), then with 1000
//!    more connections open, first only connected, then after one `broker/ping` each (bar:
//!    the latter adds <= 32 MiB). Unpinned only.
//!
//! Usage: `cargo bench -p abx-broker --bench local [-- stream|zero|urandom|transfer|rss|pinned|unpinned ...]`
//! (`zero`/`urandom` select one streaming source; `pinned`/`unpinned` select the streaming
//! modes; the other figures run with `unpinned`).
//!
//! Environment (all optional): `ABX_BENCH_QUICK=1` (64 MiB, one round), `ABX_BENCH_BYTES`
//! (per run: a number or `64M`, `1G`; default 1 GiB), `ABX_BENCH_ROUNDS` (default 3),
//! `ABX_BENCH_TRANSFER_ROUNDS` (default 6, quick 3; rounded up to a multiple of 3),
//! `ABX_BENCH_IDLE_CONNS` (default 1000), `ABX_BENCH_CPU`, `ABX_BENCH_JSON`,
//! `ABX_BENCH_ONLY` (as in the wire bench).

mod common;
use common::{
    cpu_ns, cpu_snap, env_bytes, env_parse, find_byte, human_bytes, max_of, median, min_of,
    pin_cmd, pin_if, round3, round_trip, status_kib, thread_cpu_ns, verdict, Mode, Out, Res,
    Spawned, UnixRpc, GIB,
};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    common::main("local", &[], orchestrate);
}

struct Config {
    quick: bool,
    bytes: u64,
    rounds: usize,
    transfer_rounds: usize,
    stream: bool,
    transfer: bool,
    rss: bool,
    modes: Vec<Mode>,
    cpu: Option<usize>,
    idle_conns: usize,
    /// The streaming sources (`zero`, `urandom`).
    sources: Vec<(&'static str, &'static str)>,
}

impl Config {
    fn load() -> Res<Config> {
        let quick = common::quick();
        let (mut stream, mut transfer, mut rss, mut pinned, mut unpinned) =
            (false, false, false, false, false);
        let mut sources = Vec::new();
        for w in &common::filter_words() {
            if let Some(src) = SOURCES.iter().find(|(name, _)| name == w) {
                stream = true;
                sources.push(*src);
                continue;
            }
            match w.as_str() {
                "stream" | "streaming" | "exec" => stream = true,
                "transfer" | "files" | "upload" | "download" => transfer = true,
                "rss" | "idle" | "memory" => rss = true,
                "pinned" => pinned = true,
                "unpinned" => unpinned = true,
                other => eprintln!(
                    "local bench: ignoring unknown filter {other:?} (known: stream, zero, urandom, transfer, rss, pinned, unpinned)"
                ),
            }
        }
        if !stream && !transfer && !rss {
            (stream, transfer, rss) = (true, true, true);
        }
        let cpu = common::pin_cpu()?;
        let modes = common::modes("local", pinned, unpinned, cpu);
        if sources.is_empty() {
            sources = SOURCES.to_vec();
        }
        let bytes = env_bytes("ABX_BENCH_BYTES")?.unwrap_or(if quick { 64 << 20 } else { 1 << 30 });
        Ok(Config {
            quick,
            bytes,
            rounds: env_parse::<usize>("ABX_BENCH_ROUNDS")?
                .unwrap_or(if quick { 1 } else { 3 })
                .max(1),
            transfer_rounds: env_parse::<usize>("ABX_BENCH_TRANSFER_ROUNDS")?
                .unwrap_or(if quick { 3 } else { 6 })
                .max(1)
                .div_ceil(3)
                * 3,
            stream,
            transfer,
            rss,
            cpu,
            idle_conns: env_parse::<usize>("ABX_BENCH_IDLE_CONNS")?.unwrap_or(1000),
            modes,
            sources,
        })
    }
}

fn temp_dir(prefix: &str) -> Res<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))
}

/// A local sandbox that outlives the bench's figures.
fn create_sandbox(rpc: &mut UnixRpc) -> Res<String> {
    let sb = rpc.call(
        "sandbox/create",
        json!({"provider": "local", "timeout": 7200}),
    )?;
    sb["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("sandbox/create answered {sb}"))
}

fn gib_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / GIB / secs.max(1e-9)
}

// ---------------------------------------------------------------------------------------------
// Figure 1: exec output streaming
// ---------------------------------------------------------------------------------------------

const SOURCES: [(&str, &str); 2] = [("zero", "/dev/zero"), ("urandom", "/dev/urandom")];

/// One streamed run.
#[derive(Default)]
struct Streamed {
    secs: f64,
    /// Decoded stdout bytes.
    bytes: u64,
    stderr_bytes: u64,
    text_notes: u64,
    base64_notes: u64,
    /// Notifications the fast path did not recognise (parsed in full instead).
    slow_notes: u64,
    /// A decoded byte other than NUL was seen.
    non_nul: bool,
    daemon_cpu_ns: u64,
    client_cpu_ns: u64,
}

/// Counts a JSON string's decoded bytes from just after its opening quote. Returns the decoded
/// length, the index of the closing quote, and whether any decoded byte was not NUL.
fn scan_json_string(s: &[u8]) -> Option<(u64, usize, bool)> {
    fn hex4(h: &[u8]) -> Option<u32> {
        let mut v = 0u32;
        for &c in h {
            v = v * 16 + (c as char).to_digit(16)?;
        }
        Some(v)
    }
    let mut i = 0;
    let mut len = 0u64;
    let mut non_nul = false;
    // The next unescaped-looking quote at or after `i` (recomputed when an escape ate it).
    let mut quote = find_byte(s, b'"')?;
    const NUL4: &[u8; 24] = b"\\u0000\\u0000\\u0000\\u0000";
    loop {
        // The common case of /dev/zero: runs of `\u0000`, four at a time.
        while s.len() >= i + 24 && s[i..i + 24] == NUL4[..] {
            i += 24;
            len += 4;
        }
        match *s.get(i)? {
            b'\\' => {
                if *s.get(i + 1)? == b'u' {
                    let cp = hex4(s.get(i + 2..i + 6)?)?;
                    i += 6;
                    if cp != 0 {
                        non_nul = true;
                    }
                    len += match cp {
                        0..=0x7f => 1,
                        0x80..=0x7ff => 2,
                        0xd800..=0xdbff => {
                            // A surrogate pair: one 4-byte character; skip its low half.
                            if s.get(i..i + 2) == Some(b"\\u") {
                                i += 6;
                            }
                            4
                        }
                        _ => 3,
                    };
                } else {
                    non_nul = true;
                    len += 1;
                    i += 2;
                }
                if i > quote {
                    quote = i + find_byte(&s[i..], b'"')?;
                }
            }
            b'"' => return Some((len, i, non_nul)),
            _ => {
                let run = find_byte(&s[i..quote], b'\\').unwrap_or(quote - i);
                len += run as u64;
                non_nul = true;
                i += run;
            }
        }
    }
}

const OUTPUT_PREFIX: &[u8] =
    b"{\"jsonrpc\":\"2.0\",\"method\":\"exec/output\",\"params\":{\"data\":\"";

/// The fast path for one `exec/output` line as the broker writes it (compact, keys sorted):
/// count its decoded bytes without building a `Value`. `None`: not such a line.
fn fast_output(line: &[u8], run: &mut Streamed, scratch: &mut Vec<u8>) -> Option<Res<()>> {
    let body = line.strip_prefix(OUTPUT_PREFIX)?;
    let (len, end, non_nul) = scan_json_string(body)?;
    let tail = &body[end + 1..];
    let stderr = find_bytes_in(tail, b"\"stream\":\"stderr\"");
    let n = if tail.starts_with(b",\"encoding\":\"base64\"") {
        let raw = &body[..end];
        scratch.clear();
        match abx_protocol::b64::decode_append(raw, scratch) {
            Ok(()) => {
                run.base64_notes += 1;
                scratch.len() as u64
            }
            Err(e) => return Some(Err(format!("exec/output: bad base64: {e}"))),
        }
    } else {
        run.text_notes += 1;
        run.non_nul |= non_nul;
        len
    };
    if stderr {
        run.stderr_bytes += n;
    } else {
        run.bytes += n;
    }
    Some(Ok(()))
}

fn find_bytes_in(hay: &[u8], needle: &[u8]) -> bool {
    common::find_bytes(hay, needle).is_some()
}

/// Run `head -c N <src>` in the sandbox through `exec/start`; read until `exec/exit`.
fn stream_once(
    rpc: &mut UnixRpc,
    daemon_pid: u32,
    sandbox: &str,
    src: &str,
    bytes: u64,
    scratch: &mut Vec<u8>,
) -> Res<Streamed> {
    let mut run = Streamed::default();
    let (d0, c0, t0) = (cpu_ns(daemon_pid), thread_cpu_ns(), Instant::now());
    let id = rpc.request(
        "exec/start",
        &json!({"sandbox": sandbox, "argv": ["head", "-c", bytes.to_string(), src]}),
    )?;
    let mut exec_id: Option<String> = None;
    loop {
        let line = rpc.line()?;
        if let Some(r) = fast_output(line, &mut run, scratch) {
            r?;
            continue;
        }
        let v: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
        match v["method"].as_str() {
            None if v["id"].as_u64() == Some(id) => {
                if let Some(e) = v.get("error") {
                    return Err(format!("exec/start: {e}"));
                }
                exec_id = v["result"]["execId"].as_str().map(str::to_owned);
            }
            Some("exec/output") => {
                run.slow_notes += 1;
                let p = &v["params"];
                let data = p["data"].as_str().unwrap_or_default();
                let decoded = match p["encoding"].as_str() {
                    Some("base64") => abx_protocol::b64::decode(data)
                        .map_err(|e| format!("exec/output: bad base64: {e}"))?,
                    _ => data.as_bytes().to_vec(),
                };
                run.non_nul |= decoded.iter().any(|&b| b != 0);
                if p["stream"] == "stderr" {
                    run.stderr_bytes += decoded.len() as u64;
                } else {
                    run.bytes += decoded.len() as u64;
                }
            }
            Some("exec/exit") => {
                let p = &v["params"];
                if exec_id.is_some() && p["execId"].as_str() != exec_id.as_deref() {
                    continue;
                }
                if p["exitCode"] != 0 {
                    return Err(format!("head exited with {p}"));
                }
                break;
            }
            _ => {}
        }
    }
    run.secs = t0.elapsed().as_secs_f64();
    run.client_cpu_ns = thread_cpu_ns() - c0;
    if let (Some(a), Some(b)) = (d0, cpu_ns(daemon_pid)) {
        run.daemon_cpu_ns = b.saturating_sub(a);
    }
    if run.bytes != bytes {
        return Err(format!(
            "streamed {} bytes of {src}, expected {bytes} (stderr: {})",
            run.bytes, run.stderr_bytes
        ));
    }
    Ok(run)
}

/// `head -c N <src> | cat > /dev/null`, timed from spawn to exit.
fn baseline_once(src: &str, bytes: u64, cpu: Option<usize>) -> Res<f64> {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("head -c {bytes} {src} | cat > /dev/null"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    pin_cmd(&mut cmd, cpu);
    let t0 = Instant::now();
    let st = cmd.status().map_err(|e| format!("sh: {e}"))?;
    let secs = t0.elapsed().as_secs_f64();
    if !st.success() {
        return Err(format!("baseline for {src} exited with {st}"));
    }
    Ok(secs)
}

#[derive(Default)]
struct StreamFigure {
    baseline: Vec<f64>,
    daemon: Vec<f64>,
    daemon_cpu_s_per_gib: Vec<f64>,
    client_cpu_s_per_gib: Vec<f64>,
    text_notes: u64,
    base64_notes: u64,
    slow_notes: u64,
    non_nul: bool,
}

fn run_stream(
    cfg: &Config,
    socket: PathBuf,
    daemon_pid: u32,
    cpu: Option<usize>,
) -> Res<Vec<StreamFigure>> {
    let bytes = cfg.bytes;
    let rounds = cfg.rounds;
    let sources = cfg.sources.clone();
    let client = std::thread::spawn(move || -> Res<Vec<StreamFigure>> {
        pin_if(cpu)?;
        let mut rpc = common::Rpc::unix(
            UnixStream::connect(&socket)
                .map_err(|e| format!("connect {}: {e}", socket.display()))?,
        )?;
        let sandbox = create_sandbox(&mut rpc)?;
        let mut scratch = Vec::new();
        // Warm up both paths (page tables, buffers, the sandbox's first exec).
        let warm = (bytes / 8).clamp(1, 64 << 20);
        for &(_, src) in &sources {
            baseline_once(src, warm, cpu)?;
            stream_once(&mut rpc, daemon_pid, &sandbox, src, warm, &mut scratch)?;
        }
        let mut figs: Vec<StreamFigure> = sources.iter().map(|_| StreamFigure::default()).collect();
        for round in 0..rounds {
            for j in 0..sources.len() {
                let k = (j + round) % sources.len();
                let src = sources[k].1;
                let fig = &mut figs[k];
                let mut daemon = || -> Res<()> {
                    let r = stream_once(&mut rpc, daemon_pid, &sandbox, src, bytes, &mut scratch)?;
                    fig.daemon.push(gib_per_s(bytes, r.secs));
                    let gib = bytes as f64 / GIB;
                    fig.daemon_cpu_s_per_gib
                        .push(r.daemon_cpu_ns as f64 / 1e9 / gib);
                    fig.client_cpu_s_per_gib
                        .push(r.client_cpu_ns as f64 / 1e9 / gib);
                    fig.text_notes += r.text_notes;
                    fig.base64_notes += r.base64_notes;
                    fig.slow_notes += r.slow_notes;
                    fig.non_nul |= r.non_nul;
                    Ok(())
                };
                if round % 2 == 0 {
                    daemon()?;
                    fig.baseline
                        .push(gib_per_s(bytes, baseline_once(src, bytes, cpu)?));
                } else {
                    let b = baseline_once(src, bytes, cpu)?;
                    daemon()?;
                    fig.baseline.push(gib_per_s(bytes, b));
                }
            }
        }
        Ok(figs)
    });
    client
        .join()
        .map_err(|_| "streaming client panicked".to_string())?
}

fn report_stream(out: &mut Out, cfg: &Config, mode: Mode, figs: &[StreamFigure]) {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nexec output streaming, {} per run [{}] ({} round(s); exec/start in a local sandbox, read until exec/exit)",
        human_bytes(cfg.bytes),
        mode.name(),
        cfg.rounds
    );
    let _ = writeln!(
        t,
        "  {:<34}{:>10}{:>10}{:>10}{:>15}{:>15}",
        "path", "med GiB/s", "min", "max", "daemon CPU s", "client CPU s"
    );
    let _ = writeln!(
        t,
        "  {:<34}{:>10}{:>10}{:>10}{:>15}{:>15}",
        "", "", "", "", "per GiB", "per GiB"
    );
    for ((name, src), f) in cfg.sources.iter().zip(figs) {
        let base = median(&f.baseline).unwrap_or(0.0);
        let daemon = median(&f.daemon).unwrap_or(0.0);
        let dcpu = median(&f.daemon_cpu_s_per_gib);
        let ccpu = median(&f.client_cpu_s_per_gib);
        let _ = writeln!(
            t,
            "  {:<34}{:>10.3}{:>10.3}{:>10.3}",
            format!("head -c N {src} | cat"),
            base,
            min_of(&f.baseline),
            max_of(&f.baseline)
        );
        let how = if f.base64_notes > f.text_notes {
            "base64"
        } else {
            "text"
        };
        let _ = writeln!(
            t,
            "  {:<34}{:>10.3}{:>10.3}{:>10.3}{:>15}{:>15}",
            format!("exec/start head ({how})"),
            daemon,
            min_of(&f.daemon),
            max_of(&f.daemon),
            dcpu.map_or_else(|| "-".into(), |v| format!("{v:.2}")),
            ccpu.map_or_else(|| "-".into(), |v| format!("{v:.2}")),
        );
        let r = daemon / base;
        let _ = writeln!(
            t,
            "  {:<34}{:>9.2}x   bar: >= 0.25x [{}]{}",
            format!("{name}: stream/baseline"),
            r,
            verdict(r >= 0.25),
            if *name == "zero" && f.non_nul {
                "  (WARNING: decoded bytes other than NUL)"
            } else {
                ""
            }
        );
        if f.slow_notes > 0 {
            let _ = writeln!(
                t,
                "  (note: {} notifications missed the client's fast path)",
                f.slow_notes
            );
        }
        out.record(json!({
            "kind": "stream", "figure": format!("stream_{name}"), "mode": mode.name(),
            "bytes": cfg.bytes, "source": src,
            "rounds_baseline_gib_per_s": f.baseline.iter().map(|v| round3(*v)).collect::<Vec<_>>(),
            "rounds_daemon_gib_per_s": f.daemon.iter().map(|v| round3(*v)).collect::<Vec<_>>(),
            "median_baseline_gib_per_s": round3(base), "median_daemon_gib_per_s": round3(daemon),
            "daemon_cpu_s_per_gib": dcpu.map(round3), "client_cpu_s_per_gib": ccpu.map(round3),
            "text_notifications": f.text_notes, "base64_notifications": f.base64_notes,
        }));
        out.ratio(
            &format!("stream_{name}"),
            mode,
            "daemon",
            "cat",
            r,
            Some((">=", 0.25)),
        );
    }
    out.table(&t);
}

fn stream_section(cfg: &Config, out: &mut Out, mode: Mode) -> Res<()> {
    let cpu = mode.cpu(cfg.cpu);
    let dir = temp_dir("abx-local-stream-")?;
    let daemon = Spawned::daemon(&dir.path().join("home"), cpu, &[])?;
    eprintln!("local bench: {} daemon up (streaming)", mode.name());
    let pid = daemon.pid();
    let before = cpu_snap(&[pid]);
    let figs = run_stream(cfg, daemon.socket.clone(), pid, cpu)?;
    report_stream(out, cfg, mode, &figs);
    out.noise(&format!("stream {}", mode.name()), before, cpu_snap(&[pid]));
    if let Err(e) = daemon.stop() {
        eprintln!("local bench: warning: {e}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Figure 2: upload and download
// ---------------------------------------------------------------------------------------------

fn sh(script: &str) -> Res<String> {
    let o = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("sh: {e}"))?;
    if !o.status.success() {
        return Err(format!("`{script}` exited with {}", o.status));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn sha256(paths: &[&Path]) -> Res<Vec<String>> {
    let o = Command::new("sha256sum")
        .args(paths)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("sha256sum: {e}"))?;
    if !o.status.success() {
        return Err(format!("sha256sum exited with {}", o.status));
    }
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect())
}

fn sync() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Cp,
    Upload,
    Download,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Cp => "cp",
            Op::Upload => "files/upload",
            Op::Download => "files/download",
        }
    }
}

struct Transfer {
    rates: [Vec<f64>; 3],
    /// The daemon's CPU seconds per GiB moved, per round.
    cpu: [Vec<f64>; 3],
    progress_notes: u64,
    hwm_before_kib: Option<u64>,
    hwm_after_kib: Option<u64>,
    rss_after_kib: Option<u64>,
    /// sha256 of source, cp copy, uploaded copy, downloaded copy.
    sums: Vec<String>,
}

fn run_transfer(cfg: &Config, dir: &Path, daemon: &Spawned) -> Res<Transfer> {
    let src = dir.join("src.bin");
    let warm_src = dir.join("warm.bin");
    let cp_dst = dir.join("cp.bin");
    let down = dir.join("down.bin");
    sh(&format!(
        "head -c {} /dev/urandom > '{}' && head -c {} /dev/urandom > '{}'",
        cfg.bytes,
        src.display(),
        (cfg.bytes / 16).max(1),
        warm_src.display()
    ))?;
    if file_len(&src) != cfg.bytes {
        return Err(format!("could not make {}", src.display()));
    }
    let pid = daemon.pid();
    let mut rpc = daemon.rpc()?;
    let sandbox = create_sandbox(&mut rpc)?;
    let home = daemon.home.clone().expect("a daemon has a home");
    let bare = sandbox.rsplit(':').next().unwrap_or(&sandbox);
    let up_host = abx_broker::Paths::under(&home)
        .data_dir
        .join("local/sandboxes")
        .join(bare)
        .join("workspace/up.bin");
    let mut notes = 0u64;
    // Returns the seconds and the daemon's CPU nanoseconds.
    let op = |rpc: &mut UnixRpc, op: Op, from: &Path, notes: &mut u64| -> Res<(f64, u64)> {
        // Every copy goes into a fresh file; freeing the last round's copy is not timed. (A
        // download over an existing file is an atomic rename over it, and ext4 then starts
        // writing the new data back at once (auto_da_alloc), which `cp`'s in-place overwrite
        // does not pay: that would compare durability, not transfer speed.)
        let _ = std::fs::remove_file(match op {
            Op::Cp => &cp_dst,
            Op::Upload => &up_host,
            Op::Download => &down,
        });
        sync();
        let c0 = cpu_ns(pid);
        let t0 = Instant::now();
        match op {
            Op::Cp => {
                let st = Command::new("cp")
                    .arg(from)
                    .arg(&cp_dst)
                    .status()
                    .map_err(|e| format!("cp: {e}"))?;
                if !st.success() {
                    return Err(format!("cp exited with {st}"));
                }
            }
            Op::Upload => {
                rpc.call_with(
                    "files/upload",
                    json!({"sandbox": sandbox, "localPath": from, "path": "/workspace/up.bin"}),
                    |_| *notes += 1,
                )?;
            }
            Op::Download => {
                rpc.call_with(
                    "files/download",
                    json!({"sandbox": sandbox, "path": "/workspace/up.bin", "localPath": down}),
                    |_| *notes += 1,
                )?;
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let cpu = match (c0, cpu_ns(pid)) {
            (Some(a), Some(b)) if op != Op::Cp => b.saturating_sub(a),
            _ => 0,
        };
        Ok((secs, cpu))
    };
    // Warm up every path on a small file.
    for o in [Op::Cp, Op::Upload, Op::Download] {
        op(&mut rpc, o, &warm_src, &mut notes)?;
    }
    let _ = std::fs::remove_file(&cp_dst);
    let _ = std::fs::remove_file(&down);
    let hwm_before_kib = status_kib(pid, "VmHWM");
    notes = 0;
    let mut rates: [Vec<f64>; 3] = Default::default();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    let mut sums = Vec::new();
    for round in 0..cfg.transfer_rounds {
        let mut order = [Op::Cp, Op::Upload, Op::Download];
        order.rotate_left(round % 3);
        for o in order {
            let (secs, cpu_used) = op(&mut rpc, o, &src, &mut notes)?;
            let (i, out_path) = match o {
                Op::Cp => (0, &cp_dst),
                Op::Upload => (1, &up_host),
                Op::Download => (2, &down),
            };
            let got = file_len(out_path);
            if got != cfg.bytes {
                return Err(format!(
                    "{}: {} holds {got} bytes, expected {}",
                    o.name(),
                    out_path.display(),
                    cfg.bytes
                ));
            }
            rates[i].push(gib_per_s(cfg.bytes, secs));
            cpu[i].push(cpu_used as f64 / 1e9 / (cfg.bytes as f64 / GIB));
        }
        if round + 1 == cfg.transfer_rounds {
            sums = sha256(&[&src, &cp_dst, &up_host, &down])?;
        }
        // Drop the copies (and their pending writeback) before the next round.
        let _ = std::fs::remove_file(&cp_dst);
        let _ = std::fs::remove_file(&down);
    }
    Ok(Transfer {
        rates,
        cpu,
        progress_notes: notes,
        hwm_before_kib,
        hwm_after_kib: status_kib(pid, "VmHWM"),
        rss_after_kib: status_kib(pid, "VmRSS"),
        sums,
    })
}

fn report_transfer(out: &mut Out, cfg: &Config, x: &Transfer) {
    let mut t = String::new();
    let mode = Mode::Unpinned;
    let _ = writeln!(
        t,
        "\nupload/download of a {} random file vs cp on the same filesystem [unpinned] ({} round(s), each copy first, second and third in turn, sync before each)",
        human_bytes(cfg.bytes),
        cfg.transfer_rounds
    );
    let _ = writeln!(
        t,
        "  {:<34}{:>10}{:>10}{:>10}{:>15}",
        "operation", "med GiB/s", "min", "max", "daemon CPU s"
    );
    let ops = [Op::Cp, Op::Upload, Op::Download];
    for ((o, r), c) in ops.iter().zip(&x.rates).zip(&x.cpu) {
        let _ = writeln!(
            t,
            "  {:<34}{:>10.3}{:>10.3}{:>10.3}{:>15}",
            o.name(),
            median(r).unwrap_or(0.0),
            min_of(r),
            max_of(r),
            if *o == Op::Cp {
                "-".to_string()
            } else {
                median(c).map_or_else(|| "-".into(), |v| format!("{v:.2} per GiB"))
            }
        );
    }
    let cp = median(&x.rates[0]).unwrap_or(0.0);
    for (name, i) in [("upload", 1), ("download", 2)] {
        let v = median(&x.rates[i]).unwrap_or(0.0) / cp;
        let best = max_of(&x.rates[i]) / max_of(&x.rates[0]);
        let _ = writeln!(
            t,
            "  {:<34}{:>9.2}x   bar: >= 0.5x [{}]   (best round against best round: {best:.2}x)",
            format!("{name}/cp"),
            v,
            verdict(v >= 0.5)
        );
        out.ratio(name, mode, "daemon", "cp", v, Some((">=", 0.5)));
        out.ratio(&format!("{name}_best"), mode, "daemon", "cp", best, None);
    }
    let same = x.sums.len() == 4 && x.sums.iter().all(|s| *s == x.sums[0]);
    let _ = writeln!(
        t,
        "  sha256 source = cp = uploaded = downloaded: {} [{}]{}",
        if same { "identical" } else { "DIFFERENT" },
        verdict(same),
        x.sums
            .first()
            .map_or_else(String::new, |s| format!("  ({}…)", &s[..s.len().min(16)]))
    );
    out.check(
        "transfer sha256",
        mode.name(),
        same,
        if same { "same" } else { "differ" },
        "= source",
    );
    let mib = |k: Option<u64>| k.map(|k| k as f64 / 1024.0);
    let (before, after, rss) = (
        mib(x.hwm_before_kib),
        mib(x.hwm_after_kib),
        mib(x.rss_after_kib),
    );
    let show = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1} MiB"));
    let _ = writeln!(
        t,
        "  daemon peak RSS (VmHWM): {} before the transfers, {} after; RSS now {}   bar: <= 64 MiB [{}]",
        show(before),
        show(after),
        show(rss),
        after.map_or("-", |a| verdict(a <= 64.0))
    );
    let _ = writeln!(
        t,
        "  ({} files/progress notifications over the timed transfers)",
        x.progress_notes
    );
    if let Some(a) = after {
        out.absolute(
            "transfer peak RSS (VmHWM)",
            mode.name(),
            a,
            "MiB",
            ("<=", 64.0),
        );
    }
    out.record(json!({
        "kind": "transfer", "mode": mode.name(), "bytes": cfg.bytes,
        "rounds_cp_gib_per_s": x.rates[0].iter().map(|v| round3(*v)).collect::<Vec<_>>(),
        "rounds_upload_gib_per_s": x.rates[1].iter().map(|v| round3(*v)).collect::<Vec<_>>(),
        "rounds_download_gib_per_s": x.rates[2].iter().map(|v| round3(*v)).collect::<Vec<_>>(),
        "rounds_upload_daemon_cpu_s_per_gib": x.cpu[1].iter().map(|v| round3(*v)).collect::<Vec<_>>(),
        "rounds_download_daemon_cpu_s_per_gib": x.cpu[2].iter().map(|v| round3(*v)).collect::<Vec<_>>(),
        "sha256_identical": same, "sha256": x.sums,
        "vmhwm_before_kib": x.hwm_before_kib, "vmhwm_after_kib": x.hwm_after_kib,
        "vmrss_after_kib": x.rss_after_kib, "progress_notifications": x.progress_notes,
    }));
    out.table(&t);
}

fn transfer_section(cfg: &Config, out: &mut Out) -> Res<()> {
    let dir = temp_dir("abx-local-xfer-")?;
    let daemon = Spawned::daemon(&dir.path().join("home"), None, &[])?;
    eprintln!("local bench: fresh daemon up (transfers)");
    let pid = daemon.pid();
    let before = cpu_snap(&[pid]);
    let x = run_transfer(cfg, dir.path(), &daemon)?;
    report_transfer(out, cfg, &x);
    out.noise("transfer unpinned", before, cpu_snap(&[pid]));
    if let Err(e) = daemon.stop() {
        eprintln!("local bench: warning: {e}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Figure 3: idle memory
// ---------------------------------------------------------------------------------------------

fn connections(rpc: &mut UnixRpc) -> Res<u64> {
    let st = rpc.call("broker/status", json!({}))?;
    st["connections"]
        .as_u64()
        .ok_or_else(|| format!("broker/status answered {st}"))
}

/// Wait until the daemon counts `n` connections.
fn wait_connections(rpc: &mut UnixRpc, n: u64) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = connections(rpc)?;
        if c >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the daemon counts {c} connections, expected {n}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Idle {
    /// `VmRSS`, then its anonymous and file-backed parts, and the thread count.
    idle_parts: (u64, u64, u64),
    pinged_parts: (u64, u64, u64),
    rss_idle: u64,
    hwm_idle: u64,
    rss_connected: u64,
    rss_pinged: u64,
    rss_closed: u64,
    conns: usize,
}

fn run_idle(cfg: &Config, daemon: &Spawned) -> Res<Idle> {
    let pid = daemon.pid();
    let kib = |f: &str| status_kib(pid, f).ok_or_else(|| format!("no {f} for the daemon"));
    let settle = || std::thread::sleep(Duration::from_millis(300));
    let mut rpc = daemon.rpc()?;
    rpc.call("broker/ping", json!({}))?;
    settle();
    let (rss_idle, hwm_idle) = (kib("VmRSS")?, kib("VmHWM")?);
    let parts = || -> Res<(u64, u64, u64)> { Ok((kib("RssAnon")?, kib("RssFile")?, threads(pid))) };
    let idle_parts = parts()?;
    let mut conns = Vec::with_capacity(cfg.idle_conns);
    for _ in 0..cfg.idle_conns {
        conns.push(daemon.connect()?);
    }
    wait_connections(&mut rpc, cfg.idle_conns as u64 + 1)?;
    settle();
    let rss_connected = kib("VmRSS")?;
    let mut req = Vec::new();
    for (i, s) in conns.iter_mut().enumerate() {
        req.clear();
        common::push_ping(&mut req, i as u64 + 1);
        let reply = round_trip(s, &req).map_err(|e| format!("ping on connection {i}: {e}"))?;
        if !reply.starts_with(b"{") {
            return Err(format!(
                "ping on connection {i} answered {}",
                String::from_utf8_lossy(&reply)
            ));
        }
    }
    settle();
    let rss_pinged = kib("VmRSS")?;
    let pinged_parts = parts()?;
    drop(conns);
    let deadline = Instant::now() + Duration::from_secs(10);
    while connections(&mut rpc)? > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    settle();
    Ok(Idle {
        idle_parts,
        pinged_parts,
        rss_idle,
        hwm_idle,
        rss_connected,
        rss_pinged,
        rss_closed: kib("VmRSS")?,
        conns: cfg.idle_conns,
    })
}

fn threads(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count() as u64)
}

fn report_idle(out: &mut Out, x: &Idle) {
    let mib = |k: u64| k as f64 / 1024.0;
    let per = |k: u64| (k.saturating_sub(x.rss_idle)) as f64 / x.conns.max(1) as f64;
    let mut t = String::new();
    let _ = writeln!(t, "\nidle daemon memory [unpinned] (fresh daemon)");
    let _ = writeln!(
        t,
        "  {:<44}{:>10.1} MiB   (VmHWM {:.1} MiB)   bar: <= 10 MiB [{}]",
        "RSS after one broker/ping",
        mib(x.rss_idle),
        mib(x.hwm_idle),
        verdict(mib(x.rss_idle) <= 10.0)
    );
    let _ = writeln!(
        t,
        "  {:<44}{:>10.1} MiB   (+{:.1} MiB, {:.1} KiB each)",
        format!("+{} connections, connected only", x.conns),
        mib(x.rss_connected),
        mib(x.rss_connected.saturating_sub(x.rss_idle)),
        per(x.rss_connected)
    );
    let added = mib(x.rss_pinged.saturating_sub(x.rss_idle));
    let _ = writeln!(
        t,
        "  {:<44}{:>10.1} MiB   (+{:.1} MiB, {:.1} KiB each)   bar: <= +32 MiB [{}]",
        format!("+{} connections, one broker/ping each", x.conns),
        mib(x.rss_pinged),
        added,
        per(x.rss_pinged),
        verdict(added <= 32.0)
    );
    let _ = writeln!(
        t,
        "  {:<44}{:>10.1} MiB",
        "after they closed",
        mib(x.rss_closed)
    );
    for (when, (anon, file, th)) in [
        ("idle", x.idle_parts),
        ("with the connections", x.pinged_parts),
    ] {
        let _ = writeln!(
            t,
            "  ({when}: {:.1} MiB anonymous, {:.1} MiB file-backed (the executable, libraries), {th} threads)",
            mib(anon),
            mib(file)
        );
    }
    out.absolute("idle RSS", "unpinned", mib(x.rss_idle), "MiB", ("<=", 10.0));
    out.absolute(
        &format!("+{} idle conns RSS", x.conns),
        "unpinned",
        added,
        "MiB",
        ("<=", 32.0),
    );
    out.record(json!({
        "kind": "idle", "mode": "unpinned", "conns": x.conns,
        "rss_idle_kib": x.rss_idle, "hwm_idle_kib": x.hwm_idle,
        "rss_connected_kib": x.rss_connected, "rss_pinged_kib": x.rss_pinged,
        "rss_closed_kib": x.rss_closed,
        "idle_rss_anon_kib": x.idle_parts.0, "idle_rss_file_kib": x.idle_parts.1,
        "idle_threads": x.idle_parts.2,
        "pinged_rss_anon_kib": x.pinged_parts.0, "pinged_rss_file_kib": x.pinged_parts.1,
        "pinged_threads": x.pinged_parts.2,
    }));
    out.table(&t);
}

fn idle_section(cfg: &Config, out: &mut Out) -> Res<()> {
    let dir = temp_dir("abx-local-idle-")?;
    let daemon = Spawned::daemon(&dir.path().join("home"), None, &[])?;
    eprintln!("local bench: fresh daemon up (idle memory)");
    let pid = daemon.pid();
    let before = cpu_snap(&[pid]);
    let x = run_idle(cfg, &daemon)?;
    report_idle(out, &x);
    out.noise("rss unpinned", before, cpu_snap(&[pid]));
    if let Err(e) = daemon.stop() {
        eprintln!("local bench: warning: {e}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

fn orchestrate() -> Res<()> {
    let cfg = Config::load()?;
    let mut out = Out::new("local")?;
    let started = Instant::now();
    out.header(cfg.cpu, cfg.quick);
    out.record(json!({
        "kind": "meta",
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "allowed_cpus": common::allowed_cpus(), "pin_cpu": cfg.cpu, "quick": cfg.quick,
        "bytes": cfg.bytes, "rounds": cfg.rounds, "transfer_rounds": cfg.transfer_rounds, "idle_conns": cfg.idle_conns,
        "version": abx_broker::VERSION, "loadavg1": common::loadavg(),
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    }));
    let unpinned = cfg.modes.contains(&Mode::Unpinned);
    if cfg.rss && unpinned {
        idle_section(&cfg, &mut out)?;
    }
    if cfg.stream {
        for &mode in &cfg.modes {
            stream_section(&cfg, &mut out, mode)?;
        }
    }
    if cfg.transfer && unpinned {
        transfer_section(&cfg, &mut out)?;
    }
    out.finish(started);
    let _ = std::io::stdout().flush();
    Ok(())
}
