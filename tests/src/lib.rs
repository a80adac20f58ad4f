//! Test support: a temp `ABX_HOME`, the real `abx` binary, and plain std Unix-socket
//! clients speaking either framing. Everything here talks to real processes.

pub mod fixtures;
pub mod keys;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// How long any single read may wait before the test fails instead of hanging.
pub const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// The directory of the workspace's built binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    // target/debug/deps/<test> -> target/debug
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// Path of the `abx` binary; the test command builds it before the tests run.
pub fn abx_bin() -> PathBuf {
    let p = bin_dir().join("abx");
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build --workspace --bins)",
        p.display()
    );
    p
}

/// A private `ABX_HOME` with its own daemon; the daemon is stopped on drop.
pub struct Home {
    _dir: tempfile::TempDir,
    /// The `ABX_HOME` path.
    pub path: PathBuf,
    /// Extra environment for every `abx` this home runs.
    pub env: Vec<(String, String)>,
}

impl Default for Home {
    fn default() -> Self {
        Self::new()
    }
}

impl Home {
    /// A fresh, empty home.
    pub fn new() -> Home {
        let dir = tempfile::Builder::new()
            .prefix("abx-t")
            .tempdir()
            .expect("tempdir");
        let path = dir.path().to_path_buf();
        Home {
            _dir: dir,
            path,
            env: vec![],
        }
    }

    /// The daemon socket.
    pub fn socket(&self) -> PathBuf {
        self.path.join("run/broker.sock")
    }

    /// The runtime dir.
    /// Open the doors the permissions normally close (home, run dir, socket), so only the
    /// daemon's peer check stands between another user and the daemon, and put a copy of
    /// the `sockping` probe where that user can run it. Returns the probe's path.
    pub fn open_to_other_users(&self) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        for d in [self.path.clone(), self.run_dir()] {
            mode(&d, 0o755);
        }
        mode(&self.socket(), 0o777);
        let ping = self.path.join("sockping");
        // A hard link where it can be: a copy is written through a descriptor that a child
        // forked by another test thread may still hold when the probe is run (ETXTBSY).
        if std::fs::hard_link(bin_dir().join("sockping"), &ping).is_err() {
            std::fs::copy(bin_dir().join("sockping"), &ping).unwrap();
        }
        mode(&ping, 0o755);
        ping
    }

    pub fn run_dir(&self) -> PathBuf {
        self.path.join("run")
    }

    /// The log file.
    pub fn log_file(&self) -> PathBuf {
        self.path.join("data/logs/broker.log")
    }

    /// An `abx` command bound to this home.
    pub fn abx(&self) -> Command {
        let mut c = Command::new(abx_bin());
        c.env("ABX_HOME", &self.path)
            .env("PATH", plugin_path())
            .env_remove("ABX_PROVIDER")
            .env_remove("ABX_BROKER_VERSION")
            .env_remove("ABX_BROKER_BIN")
            .env("ABX_LOG", "debug")
            .stdin(Stdio::null());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Run `abx ARGS` to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.abx().args(args).output().expect("run abx")
    }

    /// Run `abx ARGS` with `input` on stdin.
    pub fn run_with_input(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .abx()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn abx");
        let mut stdin = child.stdin.take().expect("stdin");
        let input = input.to_vec();
        let w = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let out = child.wait_with_output().expect("wait abx");
        w.join().expect("writer");
        out
    }

    /// `abx broker start`; returns the daemon pid.
    pub fn start(&self) -> u32 {
        let out = self.run(&["-j", "broker", "start"]);
        assert!(
            out.status.success(),
            "broker start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("start json");
        v["pid"].as_u64().expect("pid") as u32
    }

    /// A line-framed client on the daemon socket (the daemon must be running).
    pub fn connect(&self) -> Client {
        Client::connect(&self.socket(), Framing::Line)
    }

    /// A client with the given framing.
    pub fn connect_with(&self, f: Framing) -> Client {
        Client::connect(&self.socket(), f)
    }

    /// The daemon pid in the lock file.
    pub fn daemon_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.path.join("run/broker.lock"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        if self.socket().exists() {
            let _ = self.abx().args(["broker", "stop"]).output();
        }
        remove_sandbox_cgroups(&self.path);
    }
}

/// The cgroups of a home's `local` sandboxes (`<hierarchy>/abx/<id>` in every cgroup v1
/// hierarchy, `abx/<id>` on v2). A stopped daemon keeps its sandboxes' records and cgroups
/// for its next start; a home deleted with them would leave the cgroups behind for good
/// (thousands on a machine that runs the suites). Only empty ones can be removed: a
/// sandbox process still alive keeps its cgroup.
fn remove_sandbox_cgroups(home: &Path) {
    let Ok(sandboxes) = std::fs::read_dir(home.join("data/local/sandboxes")) else {
        return;
    };
    let ids: Vec<std::ffi::OsString> = sandboxes.flatten().map(|e| e.file_name()).collect();
    let root = Path::new("/sys/fs/cgroup");
    let mut bases = vec![root.join("abx")];
    if let Ok(hierarchies) = std::fs::read_dir(root) {
        bases.extend(hierarchies.flatten().map(|h| h.path().join("abx")));
    }
    // The stopped daemon's sandbox processes may still be exiting: a busy cgroup is tried
    // again until it empties (a few seconds at most; a process that stays keeps it).
    let mut busy: Vec<PathBuf> = Vec::new();
    for base in bases.iter().filter(|b| b.is_dir()) {
        for id in &ids {
            let dir = base.join(id);
            if let Err(e) = std::fs::remove_dir(&dir) {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    busy.push(dir);
                }
            }
        }
    }
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while !busy.is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
        busy.retain(|d| {
            std::fs::remove_dir(d).is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY))
        });
    }
}

/// Framing for [`Client`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Newline-delimited JSON.
    Line,
    /// Content-Length headers.
    Header,
}

/// A blocking JSON-RPC client over a std `UnixStream`.
pub struct Client {
    /// Write side.
    pub stream: UnixStream,
    reader: BufReader<UnixStream>,
    framing: Framing,
    next_id: i64,
    /// Messages read while waiting for a response (notifications), served first by `recv`.
    pending: std::collections::VecDeque<Value>,
}

impl Client {
    /// Connect with a framing.
    pub fn connect(socket: &Path, framing: Framing) -> Client {
        let stream = UnixStream::connect(socket)
            .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .expect("timeout");
        let reader = BufReader::new(stream.try_clone().expect("clone"));
        Client {
            stream,
            reader,
            framing,
            next_id: 1,
            pending: Default::default(),
        }
    }

    /// Bytes the broker sent that this client has not read yet: what sits in its socket's
    /// receive queue (`FIONREAD`), not counting what the reader buffered already.
    pub fn unread(&self) -> usize {
        socket_queue(&self.stream, libc::FIONREAD)
    }

    /// Write raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Frame and write one body.
    pub fn send(&mut self, body: &str) {
        let framed = frame(self.framing, body.as_bytes());
        self.send_raw(&framed);
    }

    /// Read one framed message (panics on timeout); `None` on EOF.
    pub fn recv_opt(&mut self) -> Option<Value> {
        if let Some(v) = self.pending.pop_front() {
            return Some(v);
        }
        read_frame(&mut self.reader, self.framing).map(|b| {
            serde_json::from_slice(&b).unwrap_or_else(|e| {
                panic!(
                    "bad JSON from broker ({e}): {}",
                    String::from_utf8_lossy(&b)
                )
            })
        })
    }

    /// Read one message, or `None` when nothing arrives within `wait`.
    pub fn try_recv(&mut self, wait: Duration) -> Option<Value> {
        if let Some(v) = self.pending.pop_front() {
            return Some(v);
        }
        if self.reader.buffer().is_empty() {
            self.stream.set_read_timeout(Some(wait)).expect("timeout");
            let ready = self.reader.fill_buf().map(|b| !b.is_empty());
            self.stream
                .set_read_timeout(Some(READ_TIMEOUT))
                .expect("timeout");
            match ready {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        self.recv_opt()
    }

    /// Read one framed message.
    pub fn recv(&mut self) -> Value {
        self.recv_opt().expect("unexpected EOF from broker")
    }

    /// Send a request and read messages until its response (notifications are skipped).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let msg = if params.is_null() {
            json!({"jsonrpc": "2.0", "id": id, "method": method})
        } else {
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        };
        self.send(&msg.to_string());
        loop {
            let v = read_frame(&mut self.reader, self.framing)
                .map(|b| serde_json::from_slice::<Value>(&b).expect("JSON from broker"))
                .expect("unexpected EOF from broker");
            if v.get("id") == Some(&json!(id)) {
                return v;
            }
            self.pending.push_back(v);
        }
    }

    /// A request expected to succeed: returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let v = self.request(method, params);
        assert!(v.get("error").is_none(), "{method} failed: {v}");
        v["result"].clone()
    }

    /// A request expected to fail: returns its error object.
    pub fn call_err(&mut self, method: &str, params: Value) -> Value {
        let v = self.request(method, params);
        assert!(
            v.get("result").is_none(),
            "{method} unexpectedly succeeded: {v}"
        );
        v["error"].clone()
    }
}

/// Frame a body.
pub fn frame(f: Framing, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 32);
    match f {
        Framing::Line => {
            out.extend_from_slice(body);
            out.push(b'\n');
        }
        Framing::Header => {
            out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            out.extend_from_slice(body);
        }
    }
    out
}

/// Read one frame from a buffered reader; `None` on EOF.
pub fn read_frame<R: BufRead>(r: &mut R, f: Framing) -> Option<Vec<u8>> {
    match f {
        Framing::Line => {
            let mut line = Vec::new();
            let n = r.read_until(b'\n', &mut line).expect("read (timed out?)");
            if n == 0 {
                return None;
            }
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            Some(line)
        }
        Framing::Header => {
            let mut len = None;
            loop {
                let mut h = String::new();
                let n = r.read_line(&mut h).expect("read header (timed out?)");
                if n == 0 {
                    return None;
                }
                let h = h.trim_end();
                if h.is_empty() {
                    if len.is_some() {
                        break;
                    }
                    continue;
                }
                let (k, v) = h.split_once(':').expect("header line");
                if k.eq_ignore_ascii_case("content-length") {
                    len = Some(v.trim().parse::<usize>().expect("length"));
                }
            }
            let mut body = vec![0; len.expect("Content-Length")];
            r.read_exact(&mut body).expect("body");
            Some(body)
        }
    }
}

/// Parse every framed message in `bytes`.
pub fn parse_all(bytes: &[u8], f: Framing) -> Vec<Value> {
    let mut r = BufReader::new(bytes);
    let mut out = vec![];
    while let Some(b) = read_frame(&mut r, f) {
        if b.iter().all(|c| c.is_ascii_whitespace()) {
            continue;
        }
        out.push(
            serde_json::from_slice(&b)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&b))),
        );
    }
    out
}

/// The `error.data.abx` code of an error object.
/// The broker's sandbox index as the daemon sees it: the snapshot (`data/sandboxes.json`)
/// with the journal (`data/sandboxes.log`, `["+", id, provider]` / `["-", id]` lines)
/// replayed on top. Read only: the files stay as they are.
pub fn sandbox_index(home: &Path) -> serde_json::Map<String, Value> {
    let mut map: serde_json::Map<String, Value> = std::fs::read(home.join("data/sandboxes.json"))
        .map(|b| serde_json::from_slice(&b).expect("the index snapshot is valid JSON"))
        .unwrap_or_default();
    let journal = std::fs::read_to_string(home.join("data/sandboxes.log")).unwrap_or_default();
    for line in journal.lines() {
        match serde_json::from_str::<Vec<String>>(line).as_deref() {
            Ok([op, id, provider]) if op == "+" => {
                map.insert(id.clone(), Value::String(provider.clone()));
            }
            Ok([op, id]) if op == "-" => {
                map.remove(id);
            }
            _ => {}
        }
    }
    map
}

/// The kernel's Landlock ABI (0: none).
pub fn landlock_abi() -> i64 {
    // SAFETY: the version query (flag 1) takes no pointers.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    v.max(0)
}

pub fn abx_code(err: &Value) -> &str {
    err["data"]["abx"]
        .as_str()
        .unwrap_or_else(|| panic!("no data.abx in {err}"))
}

/// Wait until `f` is true, polling (a liveness bound, not a speed assertion).
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Seconds since the Unix epoch of an RFC 3339 UTC time as the broker writes it
/// (`2026-12-05T06:32:05Z`, an optional fraction ignored).
pub fn rfc3339_unix(s: &str) -> Option<i64> {
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// A socket's queue length: `libc::FIONREAD` (bytes received and not read) or
/// `libc::TIOCOUTQ` (bytes sent that the peer has not read yet).
pub fn socket_queue(stream: &UnixStream, which: libc::Ioctl) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: both requests write one int through the pointer on a socket we own.
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), which, &mut n) };
    assert_eq!(rc, 0, "ioctl: {}", std::io::Error::last_os_error());
    n as usize
}

/// Bytes a client that stopped reading must have in its socket before a test counts its
/// queue as full: a unix socket holds about 200 KiB (`wmem_default` of the sender, less
/// the buffers' overhead), so past this the broker's own queue for it is what grows.
pub const SOCKET_FULL: usize = 96 * 1024;

/// True while a process exists.
pub fn alive(pid: u32) -> bool {
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// Resident set size of a process in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// Output of one streamed exec, gathered from its notifications.
#[derive(Debug, Default)]
pub struct Streamed {
    /// stdout (or pty) bytes.
    pub stdout: Vec<u8>,
    /// stderr bytes.
    pub stderr: Vec<u8>,
    /// Every exec/output params in arrival order.
    pub events: Vec<Value>,
    /// The exec/exit params.
    pub exit: Value,
    /// How many exec/exit notifications arrived (must be exactly one).
    pub exits: usize,
}

/// Decode exec/output data.
pub fn output_bytes(p: &Value) -> Vec<u8> {
    let d = p["data"].as_str().unwrap_or_default();
    if p["encoding"] == "base64" {
        abx_protocol::b64::decode(d).expect("base64")
    } else {
        d.as_bytes().to_vec()
    }
}

impl Client {
    /// Read notifications of `exec_id` until its exec/exit (other messages are skipped).
    pub fn collect(&mut self, exec_id: &str) -> Streamed {
        let mut s = Streamed::default();
        loop {
            let v = self.recv();
            if v["params"]["execId"] != exec_id {
                continue;
            }
            match v["method"].as_str() {
                Some("exec/output") => {
                    let b = output_bytes(&v["params"]);
                    if v["params"]["stream"] == "stderr" {
                        s.stderr.extend(b);
                    } else {
                        s.stdout.extend(b);
                    }
                    s.events.push(v["params"].clone());
                }
                Some("exec/exit") => {
                    s.exits += 1;
                    s.exit = v["params"].clone();
                    return s;
                }
                _ => {}
            }
        }
    }

    /// Create a local sandbox and return its id.
    pub fn create(&mut self, params: Value) -> String {
        let r = self.call("sandbox/create", params);
        r["id"].as_str().expect("sandbox id").to_owned()
    }

    /// `exec/run` a shell string and return the result.
    pub fn sh(&mut self, sandbox: &str, command: &str) -> Value {
        self.call("exec/run", json!({"sandbox": sandbox, "command": command}))
    }
}

/// sha256 hex of bytes (via the system's sha256sum, to stay dependency-free).
pub fn sha256_file(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A process running on a pseudo-terminal (its stdin, stdout and stderr, and its
/// controlling terminal): for prompts, `abx shell` and terminal-sized tables.
pub struct PtyChild {
    /// The master side: what the process writes, and where keystrokes go.
    pub master: std::fs::File,
    /// The process.
    pub child: std::process::Child,
    /// Everything read from the master so far.
    pub output: Vec<u8>,
}

/// Set the window size of a terminal.
pub fn set_winsize(fd: i32, cols: u16, rows: u16) {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let r = unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) };
    assert_eq!(r, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
}

impl Home {
    /// Run `abx ARGS` on a new pseudo-terminal of `cols` x `rows`, in its own session with
    /// the terminal as its controlling terminal (so `/dev/tty` works).
    pub fn spawn_pty(&self, args: &[&str], cols: u16, rows: u16) -> PtyChild {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        use std::os::unix::process::CommandExt;
        let (mut m, mut s) = (0, 0);
        let r = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
        let (master, slave) = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
        unsafe { libc::fcntl(master.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        set_winsize(slave.as_raw_fd(), cols, rows);
        let mut cmd = self.abx();
        cmd.args(args)
            .stdin(Stdio::from(slave.try_clone().expect("dup")))
            .stdout(Stdio::from(slave.try_clone().expect("dup")))
            .stderr(Stdio::from(slave.try_clone().expect("dup")));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn abx on a pty");
        drop(slave);
        PtyChild {
            master: std::fs::File::from(master),
            child,
            output: Vec::new(),
        }
    }
}

impl PtyChild {
    /// Type bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).expect("write to pty");
    }

    /// Read what is there within `wait`: `Some(true)` data came, `Some(false)` nothing
    /// came, `None` the terminal was closed.
    /// Read what the terminal has within `wait`; `None` once it closed.
    pub fn pump(&mut self, wait: Duration) -> Option<bool> {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: self.master.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let r = unsafe { libc::poll(&mut pfd, 1, wait.as_millis() as i32) };
        if r <= 0 {
            return Some(false);
        }
        let mut buf = [0u8; 4096];
        match self.master.read(&mut buf) {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                self.output.extend_from_slice(&buf[..n]);
                Some(true)
            }
        }
    }

    /// The output so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }

    /// Read until the output contains `needle` (panics after [`READ_TIMEOUT`]).
    pub fn expect(&mut self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + READ_TIMEOUT;
        while !self.text().contains(needle) {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {needle:?} in {:?}",
                self.text()
            );
            if self.pump(Duration::from_millis(50)).is_none() {
                assert!(
                    self.text().contains(needle),
                    "terminal closed without {needle:?}: {:?}",
                    self.text()
                );
            }
        }
        self.text()
    }

    /// The terminal's local mode flags (`ICANON`, `ECHO`, ...), read through the master.
    pub fn lflag(&self) -> libc::tcflag_t {
        use std::os::fd::AsRawFd;
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::tcgetattr(self.master.as_raw_fd(), &mut t) };
        assert_eq!(r, 0, "tcgetattr: {}", std::io::Error::last_os_error());
        t.c_lflag
    }

    /// Read to the end and wait for the exit code.
    pub fn finish(&mut self) -> (String, i32) {
        let deadline = std::time::Instant::now() + READ_TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                // What is still buffered; stop at the end or when nothing more comes.
                while self.pump(Duration::from_millis(100)) == Some(true) {}
                return (self.text(), st.code().unwrap_or(-1));
            }
            assert!(
                std::time::Instant::now() < deadline,
                "abx did not exit: {:?}",
                self.text()
            );
            self.pump(Duration::from_millis(20));
        }
    }
}

/// `PATH` for the daemon: the real `python3` first. A version manager's shim (pyenv) is a
/// shell script that runs helpers, which a plugin declaring `spawns_processes = false` may
/// not execute (docs/providers.md, "Permissions"); users point PATH at the interpreter too.
pub fn plugin_path() -> String {
    static P: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
        let real = Command::new("python3")
            .args([
                "-c",
                "import os,sys;print(os.path.dirname(os.path.realpath(sys.executable)))",
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|d| !d.is_empty());
        match real {
            Some(dir) => format!("{dir}:{path}"),
            None => path,
        }
    })
    .clone()
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn rfc3339_unix_reads_the_brokers_times() {
        assert_eq!(super::rfc3339_unix("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            super::rfc3339_unix("2026-12-05T06:32:05Z"),
            Some(1_796_452_325)
        );
        assert_eq!(
            super::rfc3339_unix("2000-02-29T12:00:00.5Z"),
            Some(951_825_600)
        );
        assert_eq!(super::rfc3339_unix("nope"), None);
    }
}
