//! `sandbox/log` (issue 43): the history of every command run in a sandbox, kept by the
//! broker for every provider, so a reviewer sees what an agent did, not what it says it did.
//!
//! - **What is recorded.** `exec/run` (kind `exec`), `exec/start` (`stream`, or `pty` with a
//!   pty) and `code/run` (`code`), each with a sequence number per sandbox (from 1), the
//!   client that asked (its `initialize` `clientInfo.name`, else `unknown`), argv (a
//!   `command` as `["sh", "-c", command]`) or code and language, cwd, start, then duration
//!   and exit (exit code, signal, or the E-code of a command that failed to start or was
//!   cancelled; a cell that raised has exit code 1, else 0).
//! - **When.** The start is written when [`crate::dispatch`] routes the request (before the
//!   provider answers); the end when the reply comes (`exec/run`, `code/run`), or, for
//!   `exec/start`, when its `exec/exit` notification goes to a client: every stream
//!   notification of every provider passes [`crate::outbound::Outbound`]'s queue, which
//!   hands the exits to [`exit_seen`]. A request whose future is dropped (cancelled, its
//!   client gone) ends `E1006` ([`Pending`]'s `Drop`). The exit of a stream nobody is
//!   attached to is seen when a client attaches and gets it replayed; until then its entry
//!   has no exit.
//! - **Where.** One append-only file per sandbox, `<data>/cmdlog/<provider>/<sandbox>.jsonl`:
//!   a start line is a [`LogEntry`] without its end, an end line is
//!   `{"end": seq, "durationMs", "exitCode"?, "signal"?, "error"?}`. Lines are written in
//!   sequence order (under the sandbox's lock), so the entries in a file are the sequence
//!   numbers `first..=last`, and `dropped` is `first - 1`. It survives a daemon restart
//!   (the counters are read back from the file the first time the sandbox is seen again) and
//!   is removed when the sandbox is killed or expires (`sandbox/changed`, see
//!   [`crate::events`]), or when its provider says it does not know the sandbox (E2009).
//! - **Bounds.** At most `max_entries` entries per sandbox (default [`MAX_ENTRIES`]): beyond
//!   a tenth more, the file is rewritten keeping the newest, streaming (constant memory), and
//!   the oldest are counted in `dropped`. A file beyond [`FILE_MAX`] bytes is rewritten the
//!   same way down to half of it (so no rewrite reads more than that). A start line is bounded: argv at [`ARGV_MAX`]
//!   bytes, code at [`CODE_MAX`], cwd at [`CWD_MAX`], the client's name and the language
//!   at [`NAME_MAX`]. The memory held per sandbox is a few counters; per running stream one
//!   small record ([`OPEN_MAX`] in all). A `sandbox/log` reply holds at most `limit` (at most
//!   [`LIMIT_MAX`]) entries and [`REPLY_MAX`] bytes of them (fewer entries then: ask again
//!   with `since`).

use crate::dispatch::{reply, Cx, Reply};
use crate::members::Members;
use abx_protocol::api::{LogEntry, LogKind, LogParams, LogResult};
use abx_protocol::message::string_prefix;
use abx_protocol::{AbxError, ErrorCode};
use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Instant;

/// Entries kept per sandbox by default (the oldest are dropped beyond it).
pub const MAX_ENTRIES: usize = 10_000;
/// Bytes of argv kept per entry (all arguments together; the last one kept is cut).
pub const ARGV_MAX: usize = 16 * 1024;
/// Bytes of a cell's code kept per entry.
pub const CODE_MAX: usize = 64 * 1024;
/// Bytes a sandbox's log file may hold: beyond, the oldest entries are dropped until it
/// holds half of it (so a rewrite reads at most this much).
pub const FILE_MAX: u64 = 32 * 1024 * 1024;
/// Bytes of a working directory kept.
pub const CWD_MAX: usize = 4096;
/// Bytes of a client's name, a language, an error kept.
pub const NAME_MAX: usize = 256;
/// `sandbox/log`'s default and largest `limit`.
pub const LIMIT_MAX: u64 = 1000;
/// Bytes of entries one `sandbox/log` reply holds at most (at least one entry).
pub const REPLY_MAX: usize = 4 * 1024 * 1024;
/// Running streams whose exit is waited for, over every sandbox (beyond: their entries get
/// no exit).
pub const OPEN_MAX: usize = 65_536;
/// What is appended to a cut argument or code.
const CUT: &str = "…[cut]";

type Key = (String, String);

/// The logs of every sandbox of a broker.
pub struct CmdLog {
    dir: PathBuf,
    max_entries: usize,
    me: Weak<CmdLog>,
    sandboxes: Mutex<HashMap<Key, Arc<Mutex<Sb>>>>,
}

/// One sandbox's log: its counters (the entries are in its file).
#[derive(Default)]
struct Sb {
    /// Read back from the file (or found none).
    loaded: bool,
    /// Removed (the sandbox is gone): nothing more is written.
    gone: bool,
    /// The largest sequence number given.
    last: u64,
    /// Entries dropped (the file holds `dropped + 1 ..= last`).
    dropped: u64,
    /// The file's size.
    bytes: u64,
}

/// A running stream waiting for its `exec/exit` (by exec id, every broker of the process).
struct Open {
    log: Weak<CmdLog>,
    key: Key,
    seq: u64,
    started: Instant,
}

static OPEN: LazyLock<Mutex<HashMap<String, Open>>> = LazyLock::new(Default::default);
/// How many are in [`OPEN`] (read without its lock on every notification).
static OPEN_COUNT: AtomicUsize = AtomicUsize::new(0);

/// What an end line says.
#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct End {
    end: u64,
    duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exit_code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// A line of a log file, read back.
#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    End(End),
    Entry(Box<LogEntry>),
}

/// A file name for an id: as it is when it is plain, else hex (a plugin's ids are its own).
fn file_name(id: &str) -> String {
    let plain = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if plain {
        id.to_owned()
    } else {
        let hex: String = id.bytes().take(100).map(|b| format!("{b:02x}")).collect();
        format!("x-{hex}")
    }
}

impl CmdLog {
    /// The logs under `dir` (`<data>/cmdlog`), at most `max_entries` entries per sandbox.
    pub fn new(dir: PathBuf, max_entries: usize) -> Arc<CmdLog> {
        Arc::new_cyclic(|me| CmdLog {
            dir,
            max_entries: max_entries.max(1),
            me: me.clone(),
            sandboxes: Mutex::new(HashMap::new()),
        })
    }

    fn path(&self, key: &Key) -> PathBuf {
        self.dir
            .join(file_name(&key.0))
            .join(format!("{}.jsonl", file_name(&key.1)))
    }

    fn sb(&self, key: &Key) -> Arc<Mutex<Sb>> {
        self.sandboxes
            .lock()
            .expect("cmdlog")
            .entry(key.clone())
            .or_default()
            .clone()
    }

    /// Read a sandbox's counters back from its file, once.
    fn load(&self, key: &Key, sb: &mut Sb) {
        if sb.loaded {
            return;
        }
        sb.loaded = true;
        let Ok(f) = std::fs::File::open(self.path(key)) else {
            return;
        };
        sb.bytes = f.metadata().map_or(0, |m| m.len());
        let mut first = None;
        for line in std::io::BufReader::new(f)
            .split(b'\n')
            .map_while(Result::ok)
        {
            if let Some(seq) = start_seq(&line) {
                first.get_or_insert(seq);
                sb.last = sb.last.max(seq);
            }
        }
        sb.dropped = first.map_or(sb.last, |f| f - 1);
    }

    /// Append `line` to the sandbox's file (a newline added); then, beyond a tenth more than
    /// the bound, drop the oldest entries.
    fn append(&self, key: &Key, sb: &mut Sb, line: &[u8]) {
        if sb.gone {
            return;
        }
        let path = self.path(key);
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            let mut buf = Vec::with_capacity(line.len() + 1);
            buf.extend_from_slice(line);
            buf.push(b'\n');
            f.write_all(&buf)
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "sandbox/log: cannot append");
            return;
        }
        sb.bytes += line.len() as u64 + 1;
        let held = sb.last - sb.dropped;
        let max = self.max_entries as u64;
        let over_count = held > max + max / 10;
        let over_bytes = sb.bytes > FILE_MAX;
        if over_count || over_bytes {
            let keep_from = (sb.dropped + 1).max((sb.last + 1).saturating_sub(max));
            let bytes = if over_bytes { FILE_MAX / 2 } else { u64::MAX };
            match compact(&path, keep_from, bytes) {
                Ok((first, size)) => {
                    sb.dropped = first - 1;
                    sb.bytes = size;
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "sandbox/log: cannot drop old entries")
                }
            }
        }
    }

    /// Record the start of a command.
    fn start(&self, key: Key, mut entry: LogEntry) -> Pending {
        let sb = self.sb(&key);
        let mut s = sb.lock().expect("cmdlog sandbox");
        self.load(&key, &mut s);
        s.last += 1;
        entry.seq = s.last;
        let line = serde_json::to_vec(&entry).unwrap_or_default();
        self.append(&key, &mut s, &line);
        Pending {
            log: self.me.clone(),
            key,
            seq: entry.seq,
            started: Instant::now(),
            done: false,
        }
    }

    /// Write an end line; nothing when the sandbox's log was removed meanwhile.
    fn end(&self, key: &Key, end: &End) {
        let Some(sb) = self.sandboxes.lock().expect("cmdlog").get(key).cloned() else {
            return;
        };
        let mut s = sb.lock().expect("cmdlog sandbox");
        self.load(key, &mut s);
        let line = serde_json::to_vec(end).unwrap_or_default();
        self.append(key, &mut s, &line);
    }

    /// Forget a sandbox's log and remove its file (the sandbox was killed, expired, or its
    /// provider does not know it).
    pub fn remove(&self, provider: &str, sandbox: &str) {
        let key = (provider.to_owned(), sandbox.to_owned());
        let sb = self.sandboxes.lock().expect("cmdlog").remove(&key);
        // Anything still holding it writes nothing more.
        if let Some(sb) = &sb {
            sb.lock().expect("cmdlog sandbox").gone = true;
        }
        let path = self.path(&key);
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::debug!(provider, sandbox, "sandbox/log removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "sandbox/log: cannot remove")
            }
        }
        let mut open = OPEN.lock().expect("cmdlog open");
        open.retain(|_, o| !(o.key == key && o.log.ptr_eq(&self.me)));
        OPEN_COUNT.store(open.len(), Ordering::Relaxed);
    }

    /// Remove the logs of a builtin provider's sandboxes that it no longer holds (they
    /// ended while the daemon was down: no `sandbox/changed` told of it). A builtin
    /// provider knows its sandboxes as soon as it is made ([`crate::provider::Provider::owns`]);
    /// a plugin's logs wait for its own reports, or for `sandbox/log` to find the sandbox gone.
    pub fn sweep(&self, registry: &crate::provider::Registry) {
        for p in registry.all() {
            let s = p.summary();
            if s.kind != crate::provider::Kind::Builtin {
                continue;
            }
            let Ok(dir) = std::fs::read_dir(self.dir.join(file_name(&s.id))) else {
                continue;
            };
            for e in dir.flatten() {
                let name = e.file_name();
                let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) else {
                    continue;
                };
                // Plain names only: a builtin provider's ids are.
                if file_name(id) == id && !p.owns(id) {
                    tracing::debug!(provider = %s.id, sandbox = id, "sandbox/log of a sandbox gone while the daemon was down: removed");
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }

    /// The entries after `since`, at most `limit` of them (and [`REPLY_MAX`] bytes).
    fn read(&self, key: &Key, since: u64, limit: u64) -> LogResult {
        let sb = self.sb(key);
        let (last, dropped) = {
            let mut s = sb.lock().expect("cmdlog sandbox");
            self.load(key, &mut s);
            (s.last, s.dropped)
        };
        let mut out = LogResult {
            entries: Vec::new(),
            dropped,
            last,
        };
        let Ok(f) = std::fs::File::open(self.path(key)) else {
            return out;
        };
        let mut bytes = 0usize;
        let mut full = limit == 0;
        let mut at: HashMap<u64, usize> = HashMap::new();
        for line in std::io::BufReader::new(f)
            .split(b'\n')
            .map_while(Result::ok)
        {
            let Ok(l) = serde_json::from_slice::<Line>(&line) else {
                continue;
            };
            match l {
                Line::Entry(e) => {
                    if e.seq <= since || e.seq > last || full {
                        continue;
                    }
                    bytes += line.len();
                    at.insert(e.seq, out.entries.len());
                    out.entries.push(*e);
                    full = out.entries.len() as u64 >= limit || bytes >= REPLY_MAX;
                }
                Line::End(end) => {
                    if let Some(&i) = at.get(&end.end) {
                        let e = &mut out.entries[i];
                        e.duration_ms = Some(end.duration_ms);
                        e.exit_code = end.exit_code;
                        e.signal = end.signal;
                        e.error = end.error;
                    }
                }
            }
        }
        out
    }
}

/// The sequence number of a start line (an end line has `end`, not `seq`, first).
fn start_seq(line: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(br#"{"seq":"#)?;
    let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..n]).ok()?.parse().ok()
}

/// The sequence number an end line ends.
fn end_seq(line: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(br#"{"end":"#)?;
    let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..n]).ok()?.parse().ok()
}

/// Rewrite `path` without the entries before `keep_from` (and their end lines), and
/// without more of the oldest while what is left holds more than `max_bytes` (the newest
/// entry is always kept), line by line, through a temporary file renamed over it. Returns
/// the first entry kept and the new size.
fn compact(path: &Path, keep_from: u64, max_bytes: u64) -> std::io::Result<(u64, u64)> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut keep_from = keep_from;
    if max_bytes != u64::MAX {
        // Where each entry starts: the first whose start leaves at most `max_bytes` after it.
        let mut starts = Vec::new();
        let mut at = 0u64;
        for line in std::io::BufReader::new(std::fs::File::open(path)?).split(b'\n') {
            let line = line?;
            if let Some(seq) = start_seq(&line) {
                starts.push((seq, at));
            }
            at += line.len() as u64 + 1;
        }
        let fits = starts
            .iter()
            .find(|(_, off)| at - off <= max_bytes)
            .or(starts.last())
            .map(|(seq, _)| *seq);
        if let Some(seq) = fits {
            keep_from = keep_from.max(seq);
        }
    }
    let mut size = 0u64;
    {
        let src = std::io::BufReader::new(std::fs::File::open(path)?);
        let mut dst = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        for line in src.split(b'\n') {
            let line = line?;
            let seq = start_seq(&line).or_else(|| end_seq(&line));
            if seq.is_some_and(|s| s >= keep_from) {
                dst.write_all(&line)?;
                dst.write_all(b"\n")?;
                size += line.len() as u64 + 1;
            }
        }
        dst.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    Ok((keep_from, size))
}

/// A started command whose end is not written yet. Dropped unfinished (the request was
/// cancelled, its client went away), it ends `E1006`.
pub(crate) struct Pending {
    log: Weak<CmdLog>,
    key: Key,
    seq: u64,
    started: Instant,
    done: bool,
}

impl Pending {
    fn write_end(&mut self, mut end: End) {
        self.done = true;
        end.end = self.seq;
        end.duration_ms = self.started.elapsed().as_millis() as u64;
        if let Some(log) = self.log.upgrade() {
            log.end(&self.key, &end);
        }
    }

    /// The provider answered: write the end of an `exec/run` or `code/run`, or wait for the
    /// `exec/exit` of an `exec/start`. A sandbox the provider does not know loses its log.
    pub(crate) fn finish(mut self, method: &str, res: &Result<Box<RawValue>, AbxError>) {
        let raw = match res {
            Err(e) => {
                if e.code == ErrorCode::SandboxNotFound {
                    self.done = true;
                    if let Some(log) = self.log.upgrade() {
                        log.remove(&self.key.0, &self.key.1);
                    }
                    return;
                }
                self.write_end(End {
                    error: Some(e.code.abx()),
                    ..End::default()
                });
                return;
            }
            Ok(raw) => raw,
        };
        let Ok(m) = Members::parse(method, raw) else {
            return self.write_end(End::default());
        };
        match method {
            "exec/start" => {
                let Some(id) = m.get("execId").and_then(|r| string_prefix(r.get(), 512)) else {
                    return self.write_end(End::default());
                };
                let mut open = OPEN.lock().expect("cmdlog open");
                if open.len() < OPEN_MAX {
                    self.done = true;
                    open.insert(
                        id.0,
                        Open {
                            log: self.log.clone(),
                            key: self.key.clone(),
                            seq: self.seq,
                            started: self.started,
                        },
                    );
                    OPEN_COUNT.store(open.len(), Ordering::Relaxed);
                } else {
                    // Not followed: the entry stays without an exit.
                    self.done = true;
                }
            }
            "code/run" => {
                let raised = m.get("error").is_some_and(|r| r.get().trim() != "null");
                let timed_out = m.get("timedOut").is_some_and(|r| r.get().trim() == "true");
                self.write_end(End {
                    exit_code: Some(i64::from(raised || timed_out)),
                    error: timed_out.then(|| ErrorCode::ExecTimedOut.abx()),
                    ..End::default()
                })
            }
            _ => self.write_end(exit_of(&m)),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            self.write_end(End {
                error: Some(ErrorCode::RequestCancelled.abx()),
                ..End::default()
            });
        }
    }
}

/// Exit code, signal and error of an `exec/run` result or `exec/exit` params.
fn exit_of(m: &Members<'_>) -> End {
    let exit_code = m
        .get("exitCode")
        .and_then(|r| serde_json::from_str::<Option<i64>>(r.get()).ok().flatten());
    let signal = m
        .get("signal")
        .and_then(|r| string_prefix(r.get(), 64))
        .map(|s| s.0);
    // The timeout's E3001; else what the provider said went wrong (a plugin's crash notice:
    // E8007).
    let timed_out = m.get("timedOut").is_some_and(|r| r.get().trim() == "true");
    let error = if timed_out {
        Some(ErrorCode::ExecTimedOut.abx())
    } else {
        m.get("error")
            .and_then(|r| string_prefix(r.get(), NAME_MAX))
            .map(|(s, _)| {
                let code = s.len() == 5
                    && s.starts_with('E')
                    && s[1..].bytes().all(|b| b.is_ascii_digit());
                if code {
                    s
                } else if s.contains("crashed") {
                    ErrorCode::PluginCrashed.abx()
                } else {
                    s
                }
            })
    };
    End {
        exit_code,
        signal,
        error,
        ..End::default()
    }
}

/// Called with every notification queued for a client (see
/// [`crate::outbound::Outbound`]): the `exec/exit` of a stream being logged ends its entry.
/// Cheap for everything else (a prefix compared; a map looked up only while streams are
/// followed).
pub fn exit_seen(body: &[u8]) {
    const EXIT: &[u8] = br#"{"jsonrpc":"2.0","method":"exec/exit","params":"#;
    if !body.starts_with(EXIT) || OPEN_COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let Some(params) = body
        .get(EXIT.len()..body.len().saturating_sub(1))
        .and_then(|p| std::str::from_utf8(p).ok())
        .and_then(|p| serde_json::from_str::<&RawValue>(p).ok())
    else {
        return;
    };
    let Ok(m) = Members::parse("exec/exit", params) else {
        return;
    };
    let Some((id, _)) = m.get("execId").and_then(|r| string_prefix(r.get(), 512)) else {
        return;
    };
    let open = {
        let mut open = OPEN.lock().expect("cmdlog open");
        let o = open.remove(&id);
        OPEN_COUNT.store(open.len(), Ordering::Relaxed);
        o
    };
    let Some(o) = open else { return };
    let mut p = Pending {
        log: o.log,
        key: o.key,
        seq: o.seq,
        started: o.started,
        done: false,
    };
    p.write_end(exit_of(&m));
}

/// The `clientInfo.name` of the calling connection, else `unknown`.
fn client_name(cx: &Cx) -> String {
    let name = cx
        .conn
        .client
        .lock()
        .expect("client lock")
        .as_ref()
        .map(|c| c.name.clone())
        .filter(|n| !n.is_empty());
    match name {
        Some(mut n) => {
            cut(&mut n, NAME_MAX);
            n
        }
        None => "unknown".to_owned(),
    }
}

/// Cut `s` to at most `max` bytes on a character boundary, saying so.
fn cut(s: &mut String, max: usize) -> bool {
    if s.len() <= max {
        return false;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
    s.push_str(CUT);
    true
}

/// A string member, at most `max` bytes of it (cut said so).
fn str_member(m: &Members<'_>, key: &str, max: usize) -> Option<String> {
    let (mut s, was_cut) = string_prefix(m.get(key)?.get(), max)?;
    if was_cut {
        cut(&mut s, max.saturating_sub(CUT.len()));
        if !s.ends_with(CUT) {
            s.push_str(CUT);
        }
    }
    Some(s)
}

/// An `argv` member, at most [`ARGV_MAX`] bytes of it: read element by element, the rest
/// skipped unread.
fn argv_member(raw: &RawValue) -> Option<Vec<String>> {
    struct Prefix;
    impl<'de> Visitor<'de> for Prefix {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of strings")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut out = Vec::new();
            let mut left = ARGV_MAX;
            while left > 0 {
                let Some(r) = seq.next_element::<&'de RawValue>()? else {
                    return Ok(out);
                };
                let Some((mut s, was_cut)) = string_prefix(r.get(), left) else {
                    continue;
                };
                left = left.saturating_sub(s.len().max(1));
                if was_cut || left == 0 {
                    s.push_str(CUT);
                    left = 0;
                }
                out.push(s);
            }
            let mut more = 0usize;
            while seq.next_element::<IgnoredAny>()?.is_some() {
                more += 1;
            }
            if more > 0 {
                if let Some(l) = out.last_mut() {
                    if !l.ends_with(CUT) {
                        l.push_str(CUT);
                    }
                }
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    serde::Deserializer::deserialize_seq(&mut de, Prefix).ok()
}

/// The route's hook, before the provider is called: a logged method (`exec/run`,
/// `exec/start`, `code/run`) on a sandbox gets its start written, and the [`Pending`] the
/// route ends with [`Pending::finish`]. Anything else: `None`.
pub(crate) fn begin(
    cx: &Cx,
    method: &str,
    provider: &str,
    sandbox: Option<&str>,
    params: &Members<'_>,
    pty: bool,
) -> Option<Pending> {
    let kind = match method {
        "exec/run" => LogKind::Exec,
        "exec/start" if pty => LogKind::Pty,
        "exec/start" => LogKind::Stream,
        "code/run" => LogKind::Code,
        _ => return None,
    };
    let sandbox = sandbox?;
    let (argv, code, language) = if kind == LogKind::Code {
        (
            None,
            Some(str_member(params, "code", CODE_MAX).unwrap_or_default()),
            Some(str_member(params, "language", NAME_MAX).unwrap_or_else(|| "python".into())),
        )
    } else {
        let argv = match params.get("argv").and_then(argv_member) {
            Some(a) if !a.is_empty() => Some(a),
            _ => str_member(params, "command", ARGV_MAX)
                .map(|c| vec!["sh".to_owned(), "-c".to_owned(), c]),
        };
        (argv, None, None)
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let entry = LogEntry {
        seq: 0,
        kind,
        client: client_name(cx),
        argv,
        code,
        language,
        cwd: str_member(params, "cwd", CWD_MAX),
        started_at: abx_home::util::rfc3339_nanos(
            now.as_secs() as i64,
            i64::from(now.subsec_millis()) * 1_000_000,
        ),
        duration_ms: None,
        exit_code: None,
        signal: None,
        error: None,
    };
    Some(
        cx.broker
            .cmdlog
            .start((provider.to_owned(), sandbox.to_owned()), entry),
    )
}

/// `sandbox/log`: resolve the sandbox as routed methods do, make sure its provider knows
/// it (E2009 otherwise, and its log goes), then read its log.
pub(crate) async fn serve(cx: &Cx, p: LogParams) -> Reply {
    let (provider, id) = crate::dispatch::resolve_sandbox(cx, &p.sandbox).await?;
    let pid = provider.summary().id.clone();
    if provider
        .summary()
        .features
        .iter()
        .any(|f| f == "sandbox.lifecycle")
    {
        let ccx = crate::provider::CallCx {
            conn: cx.conn.handle.clone(),
            cancel: cx.cancel.clone(),
            replied: cx.replied.clone(),
            hold: cx.hold.clone(),
        };
        let asked = provider
            .call(&ccx, "sandbox/info", serde_json::json!({ "sandbox": id }))
            .await;
        if let Err(e) = asked {
            if e.code == ErrorCode::SandboxNotFound {
                cx.broker.cmdlog.remove(&pid, &id);
                cx.broker.index.remove(&id);
                return Err(AbxError::new(
                    ErrorCode::SandboxNotFound,
                    &[("sandbox", &p.sandbox)],
                ));
            }
            return Err(e);
        }
    }
    let since = p.since.unwrap_or(0);
    let limit = p.limit.unwrap_or(LIMIT_MAX).min(LIMIT_MAX);
    let log = cx.broker.cmdlog.clone();
    let key = (pid, id);
    let out = tokio::task::spawn_blocking(move || log.read(&key, since, limit))
        .await
        .map_err(AbxError::internal)?;
    reply(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: LogKind) -> LogEntry {
        LogEntry {
            seq: 0,
            kind,
            client: "t".into(),
            argv: Some(vec!["true".into()]),
            code: None,
            language: None,
            cwd: None,
            started_at: "2026-01-01T00:00:00Z".into(),
            duration_ms: None,
            exit_code: None,
            signal: None,
            error: None,
        }
    }

    #[test]
    fn entries_bound_drop_the_oldest_and_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let log = CmdLog::new(dir.path().join("cmdlog"), 10);
        let key: Key = ("local".into(), "sb-1".into());
        for i in 0..25 {
            let p = log.start(key.clone(), entry(LogKind::Exec));
            let mut m = serde_json::json!({"exitCode": i});
            let raw = serde_json::value::to_raw_value(&m.take()).unwrap();
            p.finish("exec/run", &Ok(raw));
        }
        let r = log.read(&key, 0, 1000);
        assert_eq!(r.last, 25);
        assert!(
            r.entries.len() >= 10 && r.entries.len() <= 11,
            "{}",
            r.entries.len()
        );
        assert_eq!(r.dropped, 25 - r.entries.len() as u64);
        assert_eq!(r.entries.last().unwrap().exit_code, Some(24));
        assert_eq!(r.entries[0].seq, r.dropped + 1);
        // A new broker reads the counters back.
        let again = CmdLog::new(dir.path().join("cmdlog"), 10);
        let r2 = again.read(&key, 20, 2);
        assert_eq!((r2.last, r2.dropped), (r.last, r.dropped));
        assert_eq!(
            r2.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![21, 22]
        );
        again.remove("local", "sb-1");
        assert!(!dir.path().join("cmdlog/local/sb-1.jsonl").exists());
        assert_eq!(again.read(&key, 0, 10).last, 0);
    }

    #[test]
    fn a_dropped_pending_ends_cancelled_and_a_stream_ends_at_its_exit() {
        let dir = tempfile::tempdir().unwrap();
        let log = CmdLog::new(dir.path().to_path_buf(), 100);
        let key: Key = ("p".into(), "a/../b".into());
        drop(log.start(key.clone(), entry(LogKind::Exec)));
        let p = log.start(key.clone(), entry(LogKind::Stream));
        let raw = RawValue::from_string(r#"{"execId":"ex-test-1"}"#.into()).unwrap();
        p.finish("exec/start", &Ok(raw));
        exit_seen(&abx_protocol::message::encode_notification(
            "exec/exit",
            Some(
                &serde_json::json!({"execId": "ex-test-1", "exitCode": null, "signal": "SIGKILL"}),
            ),
        ));
        let r = log.read(&key, 0, 10);
        assert_eq!(r.entries[0].error.as_deref(), Some("E1006"));
        assert_eq!(r.entries[1].signal.as_deref(), Some("SIGKILL"));
        assert!(r.entries[1].duration_ms.is_some());
        // The file name of an id that is not plain is hex.
        assert!(dir
            .path()
            .join("p")
            .join(format!("{}.jsonl", file_name("a/../b")))
            .exists());
    }

    #[test]
    fn the_file_is_bounded_in_bytes_too() {
        let dir = tempfile::tempdir().unwrap();
        let log = CmdLog::new(dir.path().to_path_buf(), MAX_ENTRIES);
        let key: Key = ("local".into(), "sb-big".into());
        let cell = "x".repeat(CODE_MAX);
        for _ in 0..(FILE_MAX / CODE_MAX as u64 + 20) {
            let mut e = entry(LogKind::Code);
            e.argv = None;
            e.code = Some(cell.clone());
            let p = log.start(key.clone(), e);
            let raw = RawValue::from_string(r#"{"error":null}"#.into()).unwrap();
            p.finish("code/run", &Ok(raw));
        }
        let size = std::fs::metadata(log.path(&key)).unwrap().len();
        assert!(size <= FILE_MAX, "{size}");
        let r = log.read(&key, 0, 1000);
        assert!(r.dropped > 0, "{}", r.dropped);
        assert_eq!(r.entries[0].seq, r.dropped + 1);
        assert!(r.entries.iter().all(|e| e.exit_code == Some(0)));
        let newest = log.read(&key, r.last - 1, 1000);
        assert_eq!(newest.entries.len(), 1);
        assert_eq!(newest.entries[0].seq, r.last);
        // A reply holds about REPLY_MAX bytes of entries, not all of them.
        assert!(
            r.entries.len() < (REPLY_MAX / CODE_MAX) + 2,
            "{}",
            r.entries.len()
        );
        // What a new broker reads back agrees.
        let again = CmdLog::new(dir.path().to_path_buf(), MAX_ENTRIES);
        let r2 = again.read(&key, 0, 1);
        assert_eq!((r2.last, r2.dropped), (r.last, r.dropped));
    }

    #[test]
    fn argv_and_code_are_cut() {
        let big = format!(
            r#"["a",{},"c"]"#,
            serde_json::to_string(&"x".repeat(100_000)).unwrap()
        );
        let raw = RawValue::from_string(big).unwrap();
        let a = argv_member(&raw).unwrap();
        assert_eq!(a.len(), 2);
        assert!(a[1].ends_with(CUT));
        assert!(a.iter().map(String::len).sum::<usize>() <= ARGV_MAX + 2 * CUT.len());
        let mut s = "é".repeat(100);
        assert!(cut(&mut s, 11));
        assert!(s.starts_with("ééééé") && s.ends_with(CUT));
    }
}
