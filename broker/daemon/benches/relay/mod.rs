//! The relay figures of the plugin bench (issue 25): what the broker's hop to a plugin adds,
//! side by side with the leanest peer relay, lspmux 0.3.0 (a Rust LSP multiplexer), both in
//! front of the same Rust echo backend (`tools/echo_backend.rs`, answering in a few us).
//!
//! Paths, one request at a time from one client thread, interleaved in rounds:
//! - `direct epp`: the echo backend (EPP/1 mode) over a pipe: the abx baseline;
//! - `broker`: the same backend installed as plugin `echo`, through the daemon's socket;
//! - `abx rpc`: the same, through the `abx rpc` stdio bridge agents and editors use;
//! - `direct lsp`: the echo backend (LSP mode) over a pipe: the lspmux baseline;
//! - `lspmux`: through `lspmux server` on a Unix socket (it spawns the backend);
//! - `lspmux client`: through lspmux's stdio client shim and its server.
//!
//! Added latency is each relay's round trip minus its own baseline's, at p50 and p99; relay
//! CPU is the CPU time of the relay's processes (daemon; daemon + bridge; lspmux server;
//! server + shim) over the measured calls, per request. Bar: abx's added p50 and p99 <=
//! lspmux's, pinned and unpinned; goal <= 0.6x its added latency and CPU.
//!
//! lspmux is built from crates.io once (`cargo install lspmux --version 0.3.0 --locked`) into
//! `<target>/bench-tools/`; the echo backend is compiled there with `rustc -O`. Without
//! network or `rustc` the lspmux paths (or the whole section) are skipped, saying why.

use crate::common::{
    cpu_ns, ctx_switches_split, mean_us, pct_us, pin_cmd, pin_if, round3, verdict, Mode, Out, Res,
    Spawned,
};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The lspmux release compared with.
const LSPMUX: &str = "0.3.0";
/// The plugin id of the echo backend.
const ID: &str = "echo";
/// Bar and goal on abx's added latency (and CPU) over lspmux's.
const BAR: f64 = 1.0;
const GOAL: f64 = 0.6;

/// What the relay section needs, found or built once per run.
pub struct Tools {
    pub echo: PathBuf,
    pub lspmux: Result<PathBuf, String>,
    pub abx: Result<PathBuf, String>,
}

/// `target/` of this bench binary (`target/<profile>/deps/plugin-...`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.parent()?.to_path_buf())
        })
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.to_path_buf())
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

impl Tools {
    pub fn get() -> Res<Tools> {
        let dir = target_dir().join("bench-tools");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/tools/echo_backend.rs");
        let text = std::fs::read(&src).map_err(|e| format!("{}: {e}", src.display()))?;
        // Rebuilt when the source changes: the name carries a hash of it.
        let hash = text.iter().fold(0xcbf29ce484222325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        });
        let echo = dir.join(format!("echo_backend-{hash:016x}"));
        if !echo.is_file() {
            let out = Command::new("rustc")
                .args(["-O", "--edition", "2021", "-o"])
                .arg(&echo)
                .arg(&src)
                .output()
                .map_err(|e| format!("rustc: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "rustc {}: {}",
                    src.display(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let root = dir.join(format!("lspmux-{LSPMUX}"));
        let bin = root.join("bin/lspmux");
        let lspmux = if bin.is_file() {
            Ok(bin)
        } else {
            eprintln!(
                "plugin bench: building lspmux {LSPMUX} from crates.io into {} (once)",
                root.display()
            );
            let out = Command::new(cargo())
                .args([
                    "install",
                    "--quiet",
                    "--locked",
                    "lspmux",
                    "--version",
                    LSPMUX,
                    "--root",
                ])
                .arg(&root)
                .stdin(Stdio::null())
                .output();
            match out {
                Ok(o) if o.status.success() && bin.is_file() => Ok(bin),
                Ok(o) => Err(format!(
                    "cargo install lspmux {LSPMUX} failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                )),
                Err(e) => Err(format!("cargo: {e}")),
            }
        };
        let abx = match std::env::var_os("ABX_BIN") {
            Some(p) => Ok(PathBuf::from(p)),
            None => {
                let p = profile_dir().map(|d| d.join("abx"));
                match p {
                    Some(p) if p.is_file() => Ok(p),
                    _ => {
                        let release = profile_dir()
                            .is_some_and(|d| d.file_name().is_some_and(|n| n == "release"));
                        let mut c = Command::new(cargo());
                        c.args(["build", "--quiet", "-p", "abx-cli", "--bin", "abx"]);
                        if release {
                            c.arg("--release");
                        }
                        match (c.status(), profile_dir().map(|d| d.join("abx"))) {
                            (Ok(s), Some(p)) if s.success() && p.is_file() => Ok(p),
                            _ => Err("no abx binary (build it: cargo build --release -p abx-cli, or set ABX_BIN)".into()),
                        }
                    }
                }
            }
        };
        Ok(Tools { echo, lspmux, abx })
    }
}

/// How a path frames its messages.
#[derive(Clone, Copy, PartialEq)]
enum Framing {
    Line,
    Lsp,
}

type Reader = Box<dyn Read + Send>;
type Writer = Box<dyn Write + Send>;

/// A blocking client of one path, in its framing.
struct Conn {
    r: Reader,
    w: Writer,
    framing: Framing,
    buf: Vec<u8>,
    /// Bytes in `buf` not consumed yet.
    have: usize,
}

impl Conn {
    fn new(r: Reader, w: Writer, framing: Framing) -> Conn {
        Conn {
            r,
            w,
            framing,
            buf: vec![0; 64 * 1024],
            have: 0,
        }
    }

    fn frame(&self, body: &[u8], out: &mut Vec<u8>) {
        out.clear();
        if self.framing == Framing::Lsp {
            let _ = write!(out, "Content-Length: {}\r\n\r\n", body.len());
        }
        out.extend_from_slice(body);
        if self.framing == Framing::Line {
            out.push(b'\n');
        }
    }

    /// The length of the first complete message in `buf[..have]` and where its body is.
    fn complete(&self) -> Option<(usize, std::ops::Range<usize>)> {
        let b = &self.buf[..self.have];
        match self.framing {
            Framing::Line => b.iter().position(|&c| c == b'\n').map(|i| (i + 1, 0..i)),
            Framing::Lsp => {
                let end = b.windows(4).position(|w| w == b"\r\n\r\n")?;
                let head = std::str::from_utf8(&b[..end]).ok()?;
                let len: usize = head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })?;
                let start = end + 4;
                (b.len() >= start + len).then_some((start + len, start..start + len))
            }
        }
    }

    /// Read until one whole message is buffered; returns its body range and total length.
    fn read_message(&mut self) -> Res<(usize, std::ops::Range<usize>)> {
        loop {
            if let Some(m) = self.complete() {
                return Ok(m);
            }
            if self.have == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            let n = self
                .r
                .read(&mut self.buf[self.have..])
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("the peer closed the connection".into());
            }
            self.have += n;
        }
    }

    fn consume(&mut self, n: usize) {
        self.buf.copy_within(n..self.have, 0);
        self.have -= n;
    }

    fn send(&mut self, v: &Value) -> Res<()> {
        let mut out = Vec::new();
        self.frame(v.to_string().as_bytes(), &mut out);
        self.w.write_all(&out).map_err(|e| format!("write: {e}"))
    }

    /// A setup call: send, skip notifications, return the result.
    fn call(&mut self, id: &Value, method: &str, params: Value) -> Res<Value> {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        loop {
            let (n, body) = self.read_message()?;
            let v: Value = serde_json::from_slice(&self.buf[body])
                .map_err(|e| format!("{method}: reply not JSON: {e}"))?;
            self.consume(n);
            if v.get("method").is_some() {
                continue;
            }
            if &v["id"] == id {
                return v
                    .get("result")
                    .cloned()
                    .ok_or_else(|| format!("{method}: {}", v["error"]));
            }
        }
    }

    fn notify(&mut self, method: &str, params: Value) -> Res<()> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }
}

/// One way of reaching the echo backend.
struct PathX {
    name: &'static str,
    conn: Conn,
    params: &'static str,
    /// The processes whose CPU is the relay's (empty for a baseline).
    relay: Vec<u32>,
    /// The baseline this path is compared with (its index).
    base: Option<usize>,
}

struct Figures {
    ns: Vec<u64>,
    relay_cpu_ns: u64,
    /// Times a relay process was preempted (involuntary context switches): a woken peer
    /// landing on its CPU and running first.
    relay_preempted: u64,
}

fn spawn_echo(echo: &Path, mode: &str, cpu: Option<usize>) -> Res<(Child, Conn)> {
    let mut cmd = Command::new(echo);
    cmd.arg(mode)
        .arg(ID)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    pin_cmd(&mut cmd, cpu);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", echo.display()))?;
    let w = child.stdin.take().expect("piped");
    let r = child.stdout.take().expect("piped");
    let framing = if mode == "lsp" {
        Framing::Lsp
    } else {
        Framing::Line
    };
    Ok((child, Conn::new(Box::new(r), Box::new(w), framing)))
}

fn lsp_initialize(c: &mut Conn, dir: &Path, mux: Option<Value>) -> Res<()> {
    let mut params = json!({
        "processId": std::process::id(),
        "rootUri": null,
        "capabilities": {},
        "clientInfo": {"name": "abx-plugin-bench"},
    });
    if let Some(m) = mux {
        params["initializationOptions"] = json!({"lspMux": m});
        params["rootPath"] = json!(dir);
    }
    c.call(&json!(0), "initialize", params)?;
    c.notify("initialized", json!({}))
}

/// The plugin tree of the echo backend, installed from `root`.
fn echo_plugin(root: &Path, echo: &Path) -> Res<()> {
    std::fs::create_dir_all(root).map_err(|e| format!("{}: {e}", root.display()))?;
    std::fs::copy(echo, root.join("echo_backend")).map_err(|e| format!("copy echo: {e}"))?;
    let manifest = format!(
        r#"# The relay bench's echo backend as an EPP/1 plugin.
schema = 1
id = "{ID}"
name = "Echo"
version = "0.1.0"
protocol = "EPP/1"
description = "Answers every request at once (bench only)."
features = ["sandbox.lifecycle"]

[runtime]
command = ["./echo_backend", "epp", "{ID}"]

[security]
network = []
filesystem = []
spawns_processes = false
"#
    );
    std::fs::write(root.join("abx-provider.toml"), manifest)
        .map_err(|e| format!("write manifest: {e}"))
}

struct Lspmux {
    server: Child,
    socket: PathBuf,
    xdg: PathBuf,
}

impl Lspmux {
    fn start(bin: &Path, dir: &Path, cpu: Option<usize>) -> Res<Lspmux> {
        let xdg = dir.join("xdg");
        let cfg = xdg.join("lspmux");
        std::fs::create_dir_all(&cfg).map_err(|e| format!("{}: {e}", cfg.display()))?;
        let socket = dir.join("lspmux.sock");
        std::fs::write(
            cfg.join("config.toml"),
            format!(
                "instance_timeout = false\ngc_interval = 10\nlisten = {s:?}\nconnect = {s:?}\nlog_filters = \"warn\"\n",
                s = socket.display().to_string()
            ),
        )
        .map_err(|e| format!("lspmux config: {e}"))?;
        let mut cmd = Command::new(bin);
        // The server logs an error with a backtrace when a client shim hangs up at the end of
        // a mode: expected, so without the backtrace.
        cmd.arg("server")
            .env("XDG_CONFIG_HOME", &xdg)
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        pin_cmd(&mut cmd, cpu);
        let server = cmd.spawn().map_err(|e| format!("lspmux server: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&socket).is_err() {
            if Instant::now() > deadline {
                return Err("lspmux server did not listen".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Lspmux {
            server,
            socket,
            xdg,
        })
    }

    fn connect(&self, echo: &Path, dir: &Path) -> Res<Conn> {
        let s = UnixStream::connect(&self.socket).map_err(|e| format!("lspmux: {e}"))?;
        let r = s.try_clone().map_err(|e| e.to_string())?;
        let mut c = Conn::new(Box::new(r), Box::new(s), Framing::Lsp);
        let mux = json!({
            "version": "1", "method": "connect", "server": echo, "args": ["lsp", ID],
            "cwd": dir,
        });
        lsp_initialize(&mut c, dir, Some(mux))?;
        Ok(c)
    }

    /// The lspmux client shim on stdio, connected to this server.
    fn shim(&self, bin: &Path, echo: &Path, dir: &Path, cpu: Option<usize>) -> Res<(Child, Conn)> {
        let mut cmd = Command::new(bin);
        cmd.args(["client", "--server-path"])
            .arg(echo)
            .args(["lsp", ID])
            .current_dir(dir)
            .env("XDG_CONFIG_HOME", &self.xdg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        pin_cmd(&mut cmd, cpu);
        let mut child = cmd.spawn().map_err(|e| format!("lspmux client: {e}"))?;
        let w = child.stdin.take().expect("piped");
        let r = child.stdout.take().expect("piped");
        let mut c = Conn::new(Box::new(r), Box::new(w), Framing::Lsp);
        lsp_initialize(&mut c, dir, None)?;
        Ok((child, c))
    }
}

impl Drop for Lspmux {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// The daemon's plugin process (the echo backend, a descendant of the daemon).
fn plugin_pid(daemon: u32) -> Option<u32> {
    crate::common::descendants(daemon).into_iter().find(|p| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .map(|c| crate::common::find_bytes(&c, b"echo_backend").is_some())
            .unwrap_or(false)
    })
}

/// The relay section for one mode.
pub fn run(
    tools: &Tools,
    out: &mut Out,
    mode: Mode,
    cpu: Option<usize>,
    samples: usize,
    rounds: usize,
    warmup: usize,
) -> Res<()> {
    let dir = tempfile::Builder::new()
        .prefix("abx-relay-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let mut notes = Vec::new();
    let mut children: Vec<Child> = Vec::new();
    let mut paths: Vec<PathX> = Vec::new();

    let (c, conn) = spawn_echo(&tools.echo, "epp", cpu)?;
    children.push(c);
    let mut conn = conn;
    conn.call(&json!(0), "initialize", json!({"protocol": "EPP/1", "broker": {"name": "bench", "version": "0"}, "config": {}, "dataDir": dir.path()}))?;
    conn.notify("initialized", json!({}))?;
    paths.push(PathX {
        name: "direct epp",
        conn,
        params: "{}",
        relay: vec![],
        base: None,
    });

    let root = dir.path().join("echo-plugin");
    echo_plugin(&root, &tools.echo)?;
    let home = dir.path().join("home");
    let daemon = Spawned::daemon(&home, cpu, &[])?;
    {
        let s = daemon.connect()?;
        let r = s.try_clone().map_err(|e| e.to_string())?;
        let mut setup = Conn::new(Box::new(r), Box::new(s), Framing::Line);
        let inst = setup.call(
            &json!(1),
            "provider/install",
            json!({"source": root, "confirm": true}),
        )?;
        if inst["id"] != ID {
            return Err(format!("provider/install answered {inst}"));
        }
    }
    let s = daemon.connect()?;
    let r = s.try_clone().map_err(|e| e.to_string())?;
    let mut via = Conn::new(Box::new(r), Box::new(s), Framing::Line);
    via.call(&json!(1), "sandbox/list", json!({"provider": ID}))?;
    if plugin_pid(daemon.pid()).is_none() {
        return Err("the daemon runs no echo_backend".into());
    }
    paths.push(PathX {
        name: "broker",
        conn: via,
        params: "{\"provider\":\"echo\"}",
        relay: vec![daemon.pid()],
        base: Some(0),
    });

    match &tools.abx {
        Ok(abx) => {
            let mut cmd = Command::new(abx);
            cmd.arg("rpc")
                .env("ABX_HOME", &home)
                .env("ABX_NO_REPLACE", "1")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            pin_cmd(&mut cmd, cpu);
            let mut child = cmd.spawn().map_err(|e| format!("abx rpc: {e}"))?;
            let w = child.stdin.take().expect("piped");
            let r = child.stdout.take().expect("piped");
            let mut c = Conn::new(Box::new(r), Box::new(w), Framing::Line);
            c.call(&json!(1), "sandbox/list", json!({"provider": ID}))?;
            let bridge = child.id();
            children.push(child);
            paths.push(PathX {
                name: "abx rpc",
                conn: c,
                params: "{\"provider\":\"echo\"}",
                relay: vec![daemon.pid(), bridge],
                base: Some(0),
            });
        }
        Err(e) => notes.push(format!("abx rpc path skipped: {e}")),
    }

    let mut mux = None;
    match &tools.lspmux {
        Ok(bin) => {
            let (c, mut conn) = spawn_echo(&tools.echo, "lsp", cpu)?;
            children.push(c);
            lsp_initialize(&mut conn, dir.path(), None)?;
            let base = paths.len();
            paths.push(PathX {
                name: "direct lsp",
                conn,
                params: "{}",
                relay: vec![],
                base: None,
            });
            let m = Lspmux::start(bin, dir.path(), cpu)?;
            let c = m.connect(&tools.echo, dir.path())?;
            paths.push(PathX {
                name: "lspmux",
                conn: c,
                params: "{}",
                relay: vec![m.server.id()],
                base: Some(base),
            });
            let (shim, c) = m.shim(bin, &tools.echo, dir.path(), cpu)?;
            paths.push(PathX {
                name: "lspmux client",
                conn: c,
                params: "{}",
                relay: vec![m.server.id(), shim.id()],
                base: Some(base),
            });
            children.push(shim);
            mux = Some(m);
        }
        Err(e) => notes.push(format!("lspmux paths skipped: {e}")),
    }

    let figures = measure(&mut paths, cpu, samples, rounds, warmup)?;
    report(out, mode, &paths, &figures, &notes);

    for p in &mut paths {
        let _ = p.conn.w.flush();
    }
    drop(paths);
    drop(mux);
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    if let Err(e) = daemon.stop() {
        eprintln!("plugin bench: warning: {e}");
    }
    Ok(())
}

fn measure(
    paths: &mut [PathX],
    cpu: Option<usize>,
    samples: usize,
    rounds: usize,
    warmup: usize,
) -> Res<Vec<Figures>> {
    let per_round = samples.div_ceil(rounds.max(1));
    let n = paths.len();
    let mut figs: Vec<Figures> = (0..n)
        .map(|_| Figures {
            ns: Vec::with_capacity(per_round * rounds),
            relay_cpu_ns: 0,
            relay_preempted: 0,
        })
        .collect();
    std::thread::scope(|s| {
        s.spawn(|| -> Res<()> {
            pin_if(cpu)?;
            let mut req = Vec::with_capacity(256);
            let mut body = Vec::with_capacity(256);
            let mut id = 1_000_000u64;
            for round in 0..rounds {
                for j in 0..n {
                    let k = if round % 2 == 0 { j } else { n - 1 - j };
                    let p = &mut paths[k];
                    let cpu_of = |pids: &[u32]| pids.iter().filter_map(|&q| cpu_ns(q)).sum::<u64>();
                    let preempted_of = |pids: &[u32]| {
                        pids.iter().filter_map(|&q| ctx_switches_split(q)).map(|(_, n)| n).sum::<u64>()
                    };
                    let (mut before, mut preempted_before) = (0, 0);
                    for i in 0..warmup + per_round {
                        if i == warmup {
                            before = cpu_of(&p.relay);
                            preempted_before = preempted_of(&p.relay);
                        }
                        id += 1;
                        body.clear();
                        let _ = write!(body, "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"sandbox/list\",\"params\":{}}}", p.params);
                        p.conn.frame(&body, &mut req);
                        let t0 = Instant::now();
                        p.conn.w.write_all(&req).map_err(|e| format!("{}: write: {e}", p.name))?;
                        let (len, range) = p.conn.read_message().map_err(|e| format!("{}: {e}", p.name))?;
                        let dt = t0.elapsed();
                        let reply = &p.conn.buf[range];
                        let idb = format!("\"id\":{id}");
                        let at = crate::common::find_bytes(reply, idb.as_bytes());
                        let whole = at.is_some_and(|i| {
                            !reply.get(i + idb.len()).is_some_and(u8::is_ascii_digit)
                        });
                        if !whole
                            || crate::common::find_bytes(reply, b"\"sandboxes\"").is_none()
                        {
                            return Err(format!("{}: answered {}", p.name, String::from_utf8_lossy(reply)));
                        }
                        p.conn.consume(len);
                        if i >= warmup {
                            figs[k].ns.push(dt.as_nanos() as u64);
                        }
                    }
                    figs[k].relay_cpu_ns += cpu_of(&p.relay).saturating_sub(before);
                    figs[k].relay_preempted += preempted_of(&p.relay).saturating_sub(preempted_before);
                }
            }
            Ok(())
        })
        .join()
        .map_err(|_| "relay client panicked".to_string())?
    })?;
    for f in &mut figs {
        f.ns.sort_unstable();
    }
    Ok(figs)
}

fn report(out: &mut Out, mode: Mode, paths: &[PathX], figs: &[Figures], notes: &[String]) {
    let mut t = String::new();
    let n = figs.first().map_or(0, |f| f.ns.len());
    let _ = writeln!(
        t,
        "\nrelay hop to a Rust echo backend, abx beside lspmux {LSPMUX}, 1 client, 1 request at a time [{}] ({n} samples per path)",
        mode.name()
    );
    let _ = writeln!(
        t,
        "  {:<15}{:>9}{:>9}{:>9}{:>9}{:>12}{:>12}{:>15}{:>16}",
        "path",
        "p50 us",
        "p99 us",
        "mean us",
        "max us",
        "added p50",
        "added p99",
        "relay CPU/req",
        "preempted/req"
    );
    let added = |k: usize, p: f64| -> Option<f64> {
        let b = paths[k].base?;
        Some(pct_us(&figs[k].ns, p) - pct_us(&figs[b].ns, p))
    };
    let cpu = |k: usize| figs[k].relay_cpu_ns as f64 / figs[k].ns.len().max(1) as f64 / 1000.0;
    let preempted = |k: usize| figs[k].relay_preempted as f64 / figs[k].ns.len().max(1) as f64;
    for (k, p) in paths.iter().enumerate() {
        let f = &figs[k];
        let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} us"));
        let _ = writeln!(
            t,
            "  {:<15}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>12}{:>12}{:>15}{:>16}",
            p.name,
            pct_us(&f.ns, 0.5),
            pct_us(&f.ns, 0.99),
            mean_us(&f.ns),
            pct_us(&f.ns, 1.0),
            opt(added(k, 0.5)),
            opt(added(k, 0.99)),
            if p.relay.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.1} us", cpu(k))
            },
            if p.relay.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.3}", preempted(k))
            },
        );
        out.record(json!({
            "kind": "latency", "figure": "relay_rtt", "mode": mode.name(), "path": p.name,
            "samples": f.ns.len(), "p50_us": round3(pct_us(&f.ns, 0.5)),
            "p99_us": round3(pct_us(&f.ns, 0.99)), "mean_us": round3(mean_us(&f.ns)),
            "added_p50_us": added(k, 0.5).map(round3), "added_p99_us": added(k, 0.99).map(round3),
            "relay_cpu_us_per_request": (!p.relay.is_empty()).then(|| round3(cpu(k))),
            "relay_preempted_per_request": (!p.relay.is_empty()).then(|| round3(preempted(k))),
        }));
    }
    let find = |name: &str| paths.iter().position(|p| p.name == name);
    for (ours, theirs) in [("broker", "lspmux"), ("abx rpc", "lspmux client")] {
        let (Some(a), Some(b)) = (find(ours), find(theirs)) else {
            continue;
        };
        for (what, p) in [("p50", 0.5), ("p99", 0.99)] {
            let (Some(x), Some(y)) = (added(a, p), added(b, p)) else {
                continue;
            };
            // An added latency at or below zero is within noise: compare against 0.1 us.
            let r = x.max(0.1) / y.max(0.1);
            let _ = writeln!(
                t,
                "  {ours} / {theirs} added {what}: {x:.1} / {y:.1} us = {r:.2}x   bar <= {BAR}x [{}], goal <= {GOAL}x [{}]",
                verdict(r <= BAR),
                verdict(r <= GOAL)
            );
            out.ratio(
                &format!("relay_added_{what}"),
                mode,
                ours,
                theirs,
                r,
                Some(("<=", BAR)),
            );
        }
        let r = cpu(a) / cpu(b).max(0.001);
        let _ = writeln!(
            t,
            "  {ours} / {theirs} relay CPU per request: {:.1} / {:.1} us = {r:.2}x   goal <= {GOAL}x [{}]",
            cpu(a),
            cpu(b),
            verdict(r <= GOAL)
        );
        out.ratio("relay_cpu", mode, ours, theirs, r, None);
    }
    for note in notes {
        let _ = writeln!(t, "  note: {note}");
    }
    out.table(&t);
}
