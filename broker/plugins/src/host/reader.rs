//! The read loop: a plugin's stdout as lines, each byte counted before it is read (up to
//! [`LINE_ALLOWANCE`] the host's own, beyond it in the broker-wide budget or the reply
//! budget its calls lent), each line classified (`abx_protocol::epp`) and delivered: a reply
//! to its pending call (opening a stream's route when it starts one), a stream notification
//! to its route, a log line to the broker's log (rate-limited), a `sandbox/changed` to the
//! event hub; garbage or an oversized line ends the plugin (E8009).

use super::inflight::{Calls, Pending};
use crate::stream::{self, Route};
use abx_core::outbound::Pool;
use abx_protocol::codec::{Frame, FrameCodec, Framing};
use abx_protocol::epp::{self, PluginLine};
use abx_protocol::message;
use abx_protocol::{AbxError, ErrorCode};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Largest line a plugin may send.
pub(super) const MAX_LINE: usize = 64 * 1024 * 1024;
/// Bytes of a plugin's output the host holds outside the broker-wide budget (a line up to
/// this size, or the start of the next ones); a longer line is counted in the budget as it
/// grows, before its bytes are read (issue 42).
pub const LINE_ALLOWANCE: usize = 64 * 1024;
/// The most one read of a plugin's stdout takes.
pub(super) const READ_CHUNK: usize = 256 * 1024;
/// Plugin stderr lines and `log` notifications written to the broker's log per second (the
/// rest are counted and reported, so a flooding plugin cannot fill the disk).
pub(super) const LOG_LINES_PER_SEC: u32 = 100;

/// A per-second budget of log lines.
#[derive(Default)]
pub(super) struct LogLimit {
    pub(super) window: Option<Instant>,
    pub(super) used: u32,
    pub(super) dropped: u64,
}

impl LogLimit {
    /// Some(lines dropped since the last allowed one) when this line may be logged.
    pub(super) fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .window
            .is_none_or(|w| now.duration_since(w) >= Duration::from_secs(1))
        {
            self.window = Some(now);
            self.used = 0;
        }
        if self.used < LOG_LINES_PER_SEC {
            self.used += 1;
            Some(std::mem::take(&mut self.dropped))
        } else {
            self.dropped += 1;
            None
        }
    }
}

/// Who the reader reads for: the plugin's id, its secrets (redacted), its stdin, and where
/// its sandbox change reports go.
pub(super) struct PluginIo<'a> {
    pub(super) id: &'a str,
    pub(super) secrets: &'a [String],
    pub(super) writer: &'a mpsc::UnboundedSender<Vec<u8>>,
    pub(super) events: &'a abx_core::events::Events,
}

/// A plugin's stdout as lines, each byte counted before it is read: up to
/// [`LINE_ALLOWANCE`] the host's own, beyond it in the broker-wide budget, grown with the
/// line (from what is free, else from the reply budget its calls in flight lent, else it
/// waits, not reading). Cancel-safe.
pub(super) struct LineReader<R> {
    pub(super) io: R,
    pub(super) buf: bytes::BytesMut,
    pub(super) codec: FrameCodec,
    /// Budget counted for the line in progress (it covers `covers` bytes beyond the
    /// allowance).
    pub(super) held: Option<OwnedSemaphorePermit>,
    pub(super) eof: bool,
}

/// One line read, and the budget it was read into (a line longer than the allowance).
pub(super) type Line = (Frame, Option<OwnedSemaphorePermit>);

impl<R: tokio::io::AsyncRead + AsRawFd + Unpin> LineReader<R> {
    pub(super) fn new(io: R) -> Self {
        LineReader {
            io,
            buf: bytes::BytesMut::with_capacity(LINE_ALLOWANCE),
            codec: FrameCodec::with_framing(Framing::Line, MAX_LINE),
            held: None,
            eof: false,
        }
    }

    pub(super) fn covers(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.num_permits())
    }

    pub(super) async fn next(
        &mut self,
        pool: &Pool,
        pending: &Mutex<Calls>,
    ) -> Option<std::io::Result<Line>> {
        use bytes::BufMut;
        loop {
            match self.codec.decode(&mut self.buf) {
                Ok(Some(f)) => return Some(Ok(self.took(f))),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
            if self.eof {
                return match self.codec.decode_eof(&mut self.buf) {
                    Ok(Some(f)) => Some(Ok(self.took(f))),
                    Ok(None) => None,
                    Err(e) => Some(Err(e)),
                };
            }
            let mut room = (LINE_ALLOWANCE + self.covers()).saturating_sub(self.buf.len());
            if room == 0 {
                // Grow the line's count: as much again as it has (at least 1 MiB), from what
                // the budget has free, else from what calls in flight lent; else wait.
                let step = self
                    .covers()
                    .max(1024 * 1024)
                    .min(MAX_LINE + 1 - self.covers().min(MAX_LINE));
                loop {
                    if let Some(more) = take_some(pool, pending, step) {
                        match &mut self.held {
                            Some(h) => h.merge(more),
                            None => self.held = Some(more),
                        }
                        break;
                    }
                    // Not reading while it waits: a plugin that exited meanwhile is seen
                    // by its pipe (its line can never end).
                    if pipe_closed(self.io.as_raw_fd()) {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                room = (LINE_ALLOWANCE + self.covers()).saturating_sub(self.buf.len());
            }
            let want = room.min(READ_CHUNK);
            if self.buf.capacity() - self.buf.len() < want {
                self.buf.reserve(want);
            }
            match self.io.read_buf(&mut (&mut self.buf).limit(want)).await {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// A line is out: it takes what was counted for it (trimmed to its size), and gets its
    /// buffer to itself when it is long (the next bytes go to a fresh one), so it is read in
    /// place.
    pub(super) fn took(&mut self, f: Frame) -> Line {
        let held = self.held.take();
        let Frame::Message(bytes) = f else {
            return (f, None);
        };
        let Some(mut held) = held else {
            return (Frame::Message(bytes), None);
        };
        let keep = bytes.len().max(1);
        if held.num_permits() > keep {
            drop(held.split(held.num_permits() - keep));
        }
        let mut rest = bytes::BytesMut::with_capacity(LINE_ALLOWANCE.max(self.buf.len()));
        rest.extend_from_slice(&self.buf);
        self.buf = rest;
        (Frame::Message(bytes), Some(held))
    }
}

/// Whether every writer of the pipe `fd` reads from has closed it.
pub(super) fn pipe_closed(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on a descriptor the caller owns; no timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

/// Up to `n` bytes of budget now: what the pool has free, else what the calls in flight
/// lent (their replies then take their room when they are queued). `None`: nothing now.
pub(super) fn take_some(
    pool: &Pool,
    pending: &Mutex<Calls>,
    n: usize,
) -> Option<OwnedSemaphorePermit> {
    let free = pool.available().min(n);
    if free > 0 {
        if let Some(p) = pool.try_take_exact(free) {
            return Some(p);
        }
    }
    let mut got: Option<OwnedSemaphorePermit> = None;
    let mut calls = pending.lock().expect("pending");
    for c in calls.values_mut() {
        let have = got.as_ref().map_or(0, |g| g.num_permits());
        if have >= n {
            break;
        }
        let Some(lent) = c.counted.permit.as_mut() else {
            continue;
        };
        let part = if lent.num_permits() <= n - have {
            c.counted.permit.take()
        } else {
            lent.split(n - have)
        };
        if let Some(part) = part {
            match &mut got {
                Some(g) => g.merge(part),
                None => got = Some(part),
            }
        }
    }
    got
}

/// Read the child's stdout until it ends or misbehaves. Returns why it ended.
pub(super) async fn read_loop(
    io: &PluginIo<'_>,
    stdout: tokio::process::ChildStdout,
    pending: &Arc<Mutex<Calls>>,
    routes: &Arc<Mutex<HashMap<String, Route>>>,
    kill: &CancellationToken,
    child: &mut tokio::process::Child,
) -> String {
    let (id, secrets, writer) = (io.id, io.secrets, io.writer);
    let pool = io.events.pool();
    let mut lines = LineReader::new(stdout);
    let mut log_limit = LogLimit::default();
    loop {
        let frame = tokio::select! {
            f = lines.next(&pool, pending) => f,
            _ = kill.cancelled() => {
                let _ = child.start_kill();
                return "it was stopped".into();
            }
        };
        let (bytes, counted) = match frame {
            None => return "it exited".into(),
            Some(Err(e)) => return format!("sent unreadable output: {e}"),
            Some(Ok((Frame::TooLarge { .. }, _))) => {
                return format!("sent a line over {} bytes", MAX_LINE);
            }
            Some(Ok((Frame::Message(b), counted))) => (b, counted),
        };
        let size = bytes.len();
        // A long line has its buffer to itself: read in place (its result or params are that
        // buffer, never a copy), what was counted for it covers them.
        let line = if counted.is_some() {
            epp::classify_owned(Vec::from(bytes), id, secrets)
        } else {
            epp::classify(&bytes, id, secrets)
        };
        match line {
            PluginLine::Reply { id: n, outcome } => {
                let Some(p) = pending.lock().expect("pending").remove(&n) else {
                    debug!(provider = %id, n, "late reply ignored");
                    continue;
                };
                // Replies are bounded like the builtin provider's (limits::plugin_reply_bound).
                let bound = abx_protocol::limits::plugin_reply_bound(&p.method);
                let outcome = if size > bound {
                    warn!(provider = %id, method = %p.method, size, bound, "plugin reply above its bound");
                    Err(AbxError::new(
                        ErrorCode::BadPluginReply,
                        &[
                            ("provider", id),
                            (
                                "detail",
                                &format!(
                                    "its reply to '{}' has {size} bytes, above the {bound} bytes allowed",
                                    p.method
                                ),
                            ),
                        ],
                    ))
                } else {
                    outcome
                };
                if let (Ok(raw), Some(conn)) = (&outcome, &p.conn) {
                    if let Some(key) = epp::stream_key(&p.method, raw) {
                        let mut r = routes.lock().expect("routes");
                        // An attach the plugin answered (the broker had no route): a new
                        // route only when the exec still runs.
                        let attach = p.method == "exec/attach";
                        if !(attach && (r.contains_key(&key) || !still_running(raw))) {
                            let route = stream::spawn(
                                key.clone(),
                                conn.clone(),
                                p.replied.clone(),
                                routes.clone(),
                            );
                            r.insert(key, route);
                        }
                    }
                }
                // The reply's budget (the line's, and what its call lent) goes to the
                // request with the reply: it is queued against those bytes.
                let Pending {
                    reply,
                    counted: lent,
                    ..
                } = p;
                if let Some(back) = &lent.back {
                    let mut h = back.lock().expect("hold");
                    for p in [counted, lent.permit].into_iter().flatten() {
                        match h.as_mut() {
                            Some(mine) => mine.merge(p),
                            None => *h = Some(p),
                        }
                    }
                }
                let _ = reply.send(outcome);
            }
            PluginLine::Dropped { method, key, bytes } => {
                if log_limit.allow().is_some() {
                    warn!(provider = %id, method = %method, key, bytes, "plugin stream notification over 1 MiB dropped");
                }
            }
            PluginLine::Stream { key, end, body } => {
                // After its exit a stream takes nothing more; its route stays (parked)
                // until the exit reached a client.
                let tx = {
                    let mut r = routes.lock().expect("routes");
                    match r.get_mut(&key) {
                        Some(route) if !route.ended => {
                            route.ended |= end;
                            Some(route.tx.clone())
                        }
                        _ => None,
                    }
                };
                // Counted before the stream holds it: the line's bytes (a long line), else
                // taken from the budget (waiting, holding none of it, when it has no room).
                // A stop is heard while it waits.
                match tx {
                    Some(tx) => {
                        let handed = async {
                            let counted = stream::Counted::take(&pool, body.len(), counted).await;
                            if end {
                                tx.exit(body, counted).await;
                            } else {
                                let _ = tx.send(body, counted).await;
                            }
                        };
                        tokio::select! {
                            _ = handed => {}
                            _ = kill.cancelled() => {
                                let _ = child.start_kill();
                                return "it was stopped".into();
                            }
                        }
                    }
                    None => debug!(provider = %id, key, "notification for an unknown stream"),
                }
            }
            PluginLine::Log { level, message } => {
                if let Some(dropped) = log_limit.allow() {
                    if dropped > 0 {
                        info!(provider = %id, "plugin log: ({dropped} messages not logged: over {LOG_LINES_PER_SEC} a second)");
                    }
                    info!(provider = %id, level = %level, "plugin log: {message}");
                }
            }
            PluginLine::Request { method, answer } => {
                // Plugins may not call the broker (yet): answered -32601.
                warn!(provider = %id, method = %method, "plugin sent a request");
                let _ = writer.send(answer);
            }
            PluginLine::SandboxChanged {
                sandbox,
                change,
                info,
            } => {
                // The broker's form: `provider` set to the plugin's id (by the hub, as it
                // writes the one copy every subscriber gets), as its sandbox/* results have it.
                io.events.emit_info(
                    id,
                    &sandbox,
                    &change,
                    info.as_deref().map(abx_core::events::Info::Tagged),
                );
                drop(counted);
            }
            PluginLine::Ignore { method } => {
                debug!(provider = %id, method = %method, "ignoring plugin notification")
            }
            PluginLine::Fatal(why) => return why,
        }
    }
}

/// An `exec/attach` result that says the exec still runs.
pub(super) fn still_running(raw: &RawValue) -> bool {
    message::bounded_value(raw.get(), 1024 * 1024).is_some_and(|v| v["running"] != false)
}
