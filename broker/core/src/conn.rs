//! One client connection: decode, dispatch concurrently, reply through a bounded queue.
//!
//! - The reader decodes frames and spawns one task per request (a batch is one task that
//!   runs its elements concurrently). At most [`MAX_IN_FLIGHT`] requests run per connection,
//!   each element of a batch counting as one; past that the reader stops reading, which
//!   pushes back on the client alone. A batch has at most [`limits::MAX_BATCH`] elements
//!   (E1005 beyond, counted without being decoded).
//! - Every byte read from the client is counted before it is read (issue 42): the bytes of
//!   a message in progress up to [`READ_ALLOWANCE`] are the connection's own; a message
//!   that outgrows them is counted in the broker-wide budget ([`crate::outbound::Pool`])
//!   before another byte is read: a declared `Content-Length` whole at once, a line step by
//!   step as long as that leaves room for one whole line to complete, else the rest of a
//!   whole line at once (see [`Reader::count`]): two half-read messages never wait on each
//!   other; a client that stops mid-message holds only what it was counted.
//! - The requests being served hold their messages' bytes: small ones from the connection's
//!   own [`INBOUND_ALLOWANCE`] (then the budget), larger ones in the budget (what was counted
//!   while they were read, with [`HEADROOM`] for their reply), and against an inbound budget
//!   of the message size limit per connection: past it the reader waits too. A large message
//!   is decoded in place (its params are its own buffer, never a copy), and a request whose
//!   message was read into the budget never waits for more of it: its reply's room comes from
//!   its headroom or what is free, else it is answered E1013.
//! - Replies and notifications go through the connection's outbound queue, bounded in bytes
//!   ([`OUTBOUND_BUDGET`]). A client that stops reading fills only its own queue: its own
//!   handlers wait, nobody else's. A request reserves its reply's bytes
//!   ([`limits::reply_reserve`]) before it runs, so a client that never reads cannot make
//!   the daemon build replies it has no room for.
//! - Every request gets exactly one response. A handler that panics is answered E9001 (and
//!   logged with its method); the connection and the other requests carry on. Each path
//!   catches it: a spawned request and a batch element in `run_request` (a lock the
//!   handler poisoned included), a laned request through the same `serve_one`, the inline
//!   `broker/ping`/`broker/status` in `inline` (a provider's `info()` may panic). A request
//!   answered without running (cancelled, or the client gone while it waited for budget)
//!   gets -32800; only a client already gone gets nothing. Held by the `panic_*` and
//!   `cancel_*` tests of `broker/core/tests/core.rs` (one per path).
//! - After a burst of large messages the allocator gives the freed memory back
//!   ([`note_released`]).
//! - The writer drains the queue, coalescing whatever is ready into one write. A client that
//!   died is found out by a failed write: tracked messages (stream notifications) that were
//!   not written go back to their senders ([`Outbound::send_tracked`]), so an exec keeps
//!   them, its exit included, for the next `exec/attach`.
//! - Requests that must apply in order (`exec/write`, `exec/resize`, `exec/kill` of one
//!   exec) run in arrival order on a lane of their own; the rest run concurrently.
//! - `$/cancelRequest` cancels the request's token; the request answers -32800 at once (one
//!   waiting on its lane too, without running later).
//! - Lifecycle: `shutdown` makes later requests fail with E1010; `exit` closes.

use crate::broker::Broker;
use crate::cx::Caller;
use crate::dispatch::{self, Cx};
use crate::outbound::{
    note_released, Ack, Hold, Outbound, Queued, Writer, MSG_OVERHEAD, OUTBOUND_BUDGET,
};
use abx_protocol::api::{methods, CancelParams};
use abx_protocol::codec::{Frame, FrameCodec, Framing, Partial};
use abx_protocol::limits;
use abx_protocol::message::{self, Incoming, Message, Notification, Request};
use abx_protocol::{AbxError, ErrorCode, Id};
use bytes::{BufMut, BytesMut};
use futures::FutureExt;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Requests served at once on one connection.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Bodies above this are written straight from their buffer, not copied.
pub(crate) const DIRECT_WRITE: usize = 64 * 1024;

/// Frames of a pipelined burst served before its replies are let go, so a long burst is
/// answered as it goes rather than all at its end.
const MAX_CORKED_FRAMES: u32 = 64;
/// Largest inbound budget (the semaphore counts in u32).
const INBOUND_MAX: usize = 1 << 31;
/// Bytes of input a connection holds outside the broker-wide budget: a message in progress
/// up to this size, or the start of the next ones. A message that outgrows it is counted in
/// the budget before another byte of it is read. Also the most one read takes.
pub const READ_ALLOWANCE: usize = 64 * 1024;
/// Bytes of the small requests a connection has in flight held outside the budget (beyond
/// them, each is counted in it).
pub const INBOUND_ALLOWANCE: usize = 64 * 1024;
/// Budget reserved with a message larger than [`READ_ALLOWANCE`] for its reply: a request
/// that holds budget for its message takes its reply's room from here (or from what is free),
/// never waiting for it while it holds the rest.
pub const HEADROOM: usize = 128 * 1024;
/// The largest batch (in bytes) decoded: its elements' params are copies, so a batch holds
/// twice its size for a moment (counted). A larger one is answered E1005, never decoded.
pub const BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Per-connection state shared by its request tasks.
pub struct Conn {
    /// How to send to this connection.
    pub handle: Outbound,
    pending: Mutex<HashMap<Id, CancellationToken>>,
    shutting_down: AtomicBool,
    in_flight: Arc<Semaphore>,
    /// Bytes of request frames being served (at most the message size limit).
    inbound: Arc<Semaphore>,
    inbound_size: usize,
    /// The connection's own allowance for small requests in flight ([`INBOUND_ALLOWANCE`]).
    inbound_own: Arc<Semaphore>,
    /// The connection as its handlers see it (its [`Outbound`] and who connected).
    pub caller: Arc<Caller>,
    /// Ordered lanes: requests with the same key run one after another, in arrival order.
    lanes: Mutex<HashMap<String, mpsc::UnboundedSender<Laned>>>,
}

/// A request queued on a lane.
struct Laned {
    req: Request,
    token: CancellationToken,
    held: Held,
    /// For a request queued behind another: who answers it, the lane or (cancelled while
    /// it waits) its [`cancel_watch`].
    claim: Option<Arc<Claim>>,
}

/// Decides once who answers a queued request: the lane that starts it, or the watcher that
/// answers its cancellation at once (-32800 without waiting for the requests before it).
#[derive(Default)]
struct Claim {
    taken: AtomicBool,
    /// Fired when the lane starts the request: its watcher ends.
    started: CancellationToken,
}

impl Claim {
    /// True for the first caller only.
    fn take(&self) -> bool {
        !self.taken.swap(true, Ordering::AcqRel)
    }
}

/// Answer -32800 as soon as a request waiting on its lane is cancelled, unless the lane
/// started it first (then the lane answers, as for any running request).
async fn cancel_watch(conn: Arc<Conn>, id: Id, token: CancellationToken, claim: Arc<Claim>) {
    tokio::select! {
        _ = token.cancelled() => {}
        _ = claim.started.cancelled() => return,
        _ = conn.handle.closed() => return,
    }
    if !claim.take() {
        return;
    }
    conn.pending.lock().expect("pending lock").remove(&id);
    let err = AbxError::new(ErrorCode::RequestCancelled, &[]);
    conn.handle
        .send(message::encode_response(Some(&id), Err(&err.to_rpc())))
        .await;
}

/// What a request holds while it is served: its in-flight slot and its frame's bytes.
struct Held {
    _slot: OwnedSemaphorePermit,
    _inbound: Option<OwnedSemaphorePermit>,
    counted: Counted,
}

/// Where a message's bytes are counted while its request is served.
#[derive(Default)]
struct Counted {
    /// In the connection's own allowance (a small message).
    _own: Option<OwnedSemaphorePermit>,
    /// In the broker-wide budget: its bytes.
    pool: Option<OwnedSemaphorePermit>,
    /// In the broker-wide budget, reserved with a large message for its reply.
    headroom: Option<OwnedSemaphorePermit>,
}

impl Counted {
    /// Whether the message was read into the budget (larger than the read allowance, with
    /// headroom for its reply): its request never waits for more of it. (A small message
    /// counted in the budget because its connection's allowance was in use holds at most
    /// 64 KiB of it: its request waits for its reply's room as any does.)
    fn holds_budget(&self) -> bool {
        self.headroom.is_some()
    }

    /// Its budget bytes, merged (they count its reply once the request is done with its
    /// params: the reply is queued against them).
    fn into_pool(self) -> Option<OwnedSemaphorePermit> {
        merge(self.pool, self.headroom)
    }
}

/// Two optional permits of one semaphore as one.
fn merge(
    a: Option<OwnedSemaphorePermit>,
    b: Option<OwnedSemaphorePermit>,
) -> Option<OwnedSemaphorePermit> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.merge(b);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

/// Requests that must apply in the order they were sent (stdin bytes, then its eof) get a
/// lane key; everything else runs concurrently.
fn lane_key(req: &Request) -> Option<String> {
    if !matches!(
        req.method.as_str(),
        "exec/write" | "exec/resize" | "exec/kill"
    ) {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct K {
        #[serde(rename = "execId")]
        exec_id: String,
    }
    let k: K = serde_json::from_str(req.params.as_deref()?.get()).ok()?;
    Some(k.exec_id)
}

async fn lane_worker(
    broker: Arc<Broker>,
    conn: Arc<Conn>,
    key: String,
    mut rx: mpsc::UnboundedReceiver<Laned>,
) {
    loop {
        let item = {
            let mut lanes = conn.lanes.lock().expect("lanes lock");
            match rx.try_recv() {
                Ok(item) => item,
                Err(_) => {
                    // Empty: retire under the lock, so no request is queued to a dead lane.
                    lanes.remove(&key);
                    return;
                }
            }
        };
        let Laned {
            req,
            token,
            held,
            claim,
        } = item;
        if let Some(claim) = claim {
            if !claim.take() {
                // Cancelled while it waited, and answered then: never run.
                drop(held);
                continue;
            }
            claim.started.cancel();
        }
        let Held {
            _slot,
            _inbound,
            counted,
        } = held;
        serve_one(&broker, &conn, req, token, counted).await;
    }
}

impl Conn {
    fn cancel(&self, id: &Id) -> bool {
        match self.pending.lock().expect("pending lock").get(id) {
            Some(t) => {
                t.cancel();
                true
            }
            None => false,
        }
    }

    fn cancel_all(&self) {
        for t in self.pending.lock().expect("pending lock").values() {
            t.cancel();
        }
    }
}

/// How a connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum ConnEnd {
    /// The client closed its side.
    Eof,
    /// The client sent `exit`.
    Exit,
    /// The framing was lost (bad headers) or a read failed.
    Broken,
    /// The broker is stopping.
    BrokerShutdown,
}

/// Serve one connection until it ends. Returns after every reply has been written (or the
/// client is gone).
pub async fn serve<R, W>(broker: Arc<Broker>, reader: R, writer: W) -> ConnEnd
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_hangup(broker, reader, writer, None).await
}

/// Tells, once the client's side reads as ended, whether the client is gone altogether (a
/// socket closed both ways) rather than only done sending (half-closed, waiting for its
/// replies).
pub type HungUp = Box<dyn Fn() -> bool + Send + Sync>;

/// [`serve`] where a client that closed its socket altogether is noticed at its EOF: its
/// requests still running or waiting for budget are cancelled at once instead of being
/// served to nobody (a burst of closed connections frees its memory promptly).
pub async fn serve_hangup<R, W>(
    broker: Arc<Broker>,
    reader: R,
    writer: W,
    hung_up: Option<HungUp>,
) -> ConnEnd
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (conn_id, _counted) = broker.conn_opened();
    let framing = Arc::new(AtomicU8::new(0));
    let writer = Arc::new(Writer::new(Box::pin(writer), framing.clone()));
    let (handle, rx) = Outbound::new(conn_id, broker.pool.clone(), Some(writer.clone()));
    let cork = writer.clone();
    let writer_task = tokio::spawn(write_loop(writer, rx, handle.closed_token().clone()));
    let conn = Arc::new(Conn {
        pending: Mutex::new(HashMap::new()),
        shutting_down: AtomicBool::new(false),
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        inbound: Arc::new(Semaphore::new(broker.max_message.clamp(1, INBOUND_MAX))),
        inbound_size: broker.max_message.clamp(1, INBOUND_MAX),
        inbound_own: Arc::new(Semaphore::new(INBOUND_ALLOWANCE)),
        caller: Arc::new(Caller::new(handle.clone())),
        lanes: Mutex::new(HashMap::new()),
        handle,
    });
    debug!(conn = conn_id, "connection opened");

    let mut frames = Reader::new(reader, broker.max_message, broker.pool.clone(), hung_up);
    // Made once per connection: polling fresh cancellation futures for every frame costs a
    // mutex each (a quarter of the daemon's CPU in the pipelined benchmark).
    let shutdown = broker.shutdown.clone().cancelled_owned();
    let closed = conn.handle.closed_token().clone().cancelled_owned();
    tokio::pin!(shutdown, closed);
    let mut frames_seen: u32 = 0;
    let mut corked_frames = 0;
    let end = loop {
        frames_seen = frames_seen.wrapping_add(1);
        // A client that never pauses still notices a broker shutdown.
        if frames_seen.is_multiple_of(256) && broker.shutdown.is_cancelled() {
            break ConnEnd::BrokerShutdown;
        }
        // Serving a burst: take its next frame only if it is read already; otherwise send
        // the burst's replies (Outbound::uncork) before waiting for more.
        let ready = if cork.is_corked() && corked_frames < MAX_CORKED_FRAMES {
            match frames.buffered() {
                Some(f) => Some(Some(f)),
                None => frames.next().now_or_never(),
            }
        } else {
            None
        };
        if ready.is_none() {
            corked_frames = 0;
            conn.handle.uncork();
        }
        let next = match ready {
            Some(f) => f,
            None => tokio::select! {
                biased;
                f = frames.next() => f,
                _ = &mut shutdown => break ConnEnd::BrokerShutdown,
                _ = &mut closed => break ConnEnd::Broken,
            },
        };
        match next {
            None => break ConnEnd::Eof,
            Some(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionAborted => {
                debug!(conn = conn_id, error = %e, "client gone");
                break ConnEnd::Broken;
            }
            Some(Err(e)) => {
                conn.handle.uncork();
                warn!(conn = conn_id, error = %e, "closing connection: framing lost");
                if let Some(f) = frames.decoder().framing() {
                    framing.store(framing_tag(f), Ordering::Relaxed);
                }
                let err = AbxError::detail(ErrorCode::ParseError, &e);
                conn.handle
                    .send(message::encode_response(None, Err(&err.to_rpc())))
                    .await;
                break ConnEnd::Broken;
            }
            Some(Ok((Frame::TooLarge { size }, _))) => {
                // Its answer may wait for room the write task frees.
                conn.handle.uncork();
                if let Some(f) = frames.decoder().framing() {
                    framing.store(framing_tag(f), Ordering::Relaxed);
                }
                let size = size.map_or_else(String::new, |s| format!(" (this one has {s})"));
                let err = AbxError::new(
                    ErrorCode::MessageTooLarge,
                    &[("size", &size), ("limit", &broker.max_message.to_string())],
                );
                conn.handle
                    .send(message::encode_response(None, Err(&err.to_rpc())))
                    .await;
            }
            Some(Ok((Frame::Message(bytes), counted))) => {
                if framing.load(Ordering::Relaxed) == 0 {
                    if let Some(f) = frames.decoder().framing() {
                        framing.store(framing_tag(f), Ordering::Relaxed);
                    }
                }
                let size = bytes.len();
                // More requests already read (a pipelining client): what this one answers
                // gathers with the burst's other replies, sent in one write at its end.
                if !frames.read_buffer().is_empty() {
                    cork.cork();
                    corked_frames += 1;
                }
                let handled = handle_frame(&broker, &conn, bytes, counted);
                tokio::pin!(handled);
                let exit = match futures::poll!(handled.as_mut()) {
                    std::task::Poll::Ready(exit) => exit,
                    std::task::Poll::Pending => {
                        // It waits (for room, for its lane): nothing held may wait on it.
                        conn.handle.uncork();
                        handled.await
                    }
                };
                if exit {
                    break ConnEnd::Exit;
                }
                if size >= DIRECT_WRITE {
                    note_released(size, false);
                }
            }
        }
    };
    conn.handle.uncork();
    debug!(conn = conn_id, ?end, "connection reader done");
    match end {
        ConnEnd::Eof if frames.hung_up.as_ref().is_some_and(|gone| gone()) => {
            debug!(conn = conn_id, "client gone: cancelling its requests");
            conn.cancel_all();
            conn.handle.closed_token().cancel();
        }
        ConnEnd::Eof => {
            // Half-closed: answer everything already asked before closing.
            tokio::select! {
                _ = conn.in_flight.acquire_many(MAX_IN_FLIGHT as u32) => {}
                _ = broker.shutdown.cancelled() => conn.cancel_all(),
                _ = conn.handle.closed() => conn.cancel_all(),
            }
        }
        _ => conn.cancel_all(),
    }
    // No more requests on this connection: its subscription (if any) ends.
    broker.events.drop_conn(conn_id);
    if end != ConnEnd::Eof {
        conn.handle.closed_token().cancel();
    }
    let closed = conn.handle.closed_token().clone();
    drop(conn);
    // Streams may still hold handles; the writer ends when they are all dropped or the
    // connection is closed.
    let _ = writer_task.await;
    closed.cancel();
    note_released(0, true);
    end
}

/// The connection's reader: bytes from the client into frames, each byte counted before it
/// is read (see the module's doc). Cancel-safe: dropped while it waits (for bytes or for
/// room), it loses nothing.
struct Reader<R> {
    io: R,
    buf: BytesMut,
    codec: FrameCodec,
    pool: crate::outbound::Pool,
    max: usize,
    /// Budget counted for the message in progress, once it outgrew [`READ_ALLOWANCE`]:
    /// `covers` bytes of the buffer (all it may hold then), the rest for its reply
    /// ([`HEADROOM`]) and a batch's copies.
    held: Option<OwnedSemaphorePermit>,
    covers: usize,
    eof: bool,
    /// Tells whether the client hung up (checked while a message waits for room: it reads
    /// nothing then, so it would not see its end).
    hung_up: Option<HungUp>,
}

/// How often a message waiting for room checks whether its client is still there.
const HANGUP_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

impl<R: AsyncRead + Unpin> Reader<R> {
    fn new(io: R, max: usize, pool: crate::outbound::Pool, hung_up: Option<HungUp>) -> Self {
        Reader {
            io,
            buf: BytesMut::with_capacity(READ_ALLOWANCE),
            codec: FrameCodec::new(max),
            pool,
            max,
            held: None,
            covers: 0,
            eof: false,
            hung_up,
        }
    }

    fn decoder(&self) -> &FrameCodec {
        &self.codec
    }

    fn read_buffer(&self) -> &BytesMut {
        &self.buf
    }

    /// The next frame if it is read already (no read, no wait): a pipelined burst's frames
    /// come out without a future each.
    #[inline]
    fn buffered(&mut self) -> Option<std::io::Result<(Frame, Counted)>> {
        match self.codec.decode(&mut self.buf) {
            Ok(Some(f)) => Some(Ok(self.took(f))),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// The next frame, with what counts it (a message larger than [`READ_ALLOWANCE`]: its
    /// budget); `None` at the end.
    async fn next(&mut self) -> Option<std::io::Result<(Frame, Counted)>> {
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
            // The allowance, or what was counted for the message in progress (all of the
            // buffer then: a message read into the budget is counted whole).
            let room = READ_ALLOWANCE
                .max(self.covers)
                .saturating_sub(self.buf.len());
            if room == 0 {
                if let Err(e) = self.count().await {
                    return Some(Err(e));
                }
                continue;
            }
            let want = room.min(READ_ALLOWANCE);
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

    /// The message in progress outgrew what was counted for it: count more before another
    /// byte is read. A body of a known size is counted whole at once (waiting for room while
    /// holding none), and gets a buffer of that size, so nothing is copied while it comes. A
    /// line, whose end is unknown, grows its count step by step (doubling) from what is free,
    /// as long as that leaves room for one whole line of the limit to complete; when it does
    /// not, it waits for the rest of a whole line. Growing never takes that last room, so a
    /// line waiting (holding what it read) can always complete once what others hold (replies,
    /// messages being served) is given back: half-read messages never wait on each other.
    async fn count(&mut self) -> std::io::Result<()> {
        let have = self.held.as_ref().map_or(0, |h| h.num_permits());
        let (covers, need) = match self.codec.partial() {
            Partial::Body(len) => (len, self.need(len)),
            Partial::Unknown => {
                // One byte past the limit: a line that long is too large (the codec says so).
                let whole = self.max + 1;
                let next = (2 * self.covers).max(1 << 20).min(whole);
                let more = self.need(next).saturating_sub(have);
                let margin = self.need(whole);
                if let Some(mut p) = self.pool.try_take_exact(more + margin) {
                    drop(p.split(margin));
                    self.add(p);
                    self.covers = next;
                    return Ok(());
                }
                (whole, self.need(whole))
            }
            // Nothing in progress holds the buffer (the codec empties it as it discards or
            // skips): a full buffer here would be a codec bug; read on rather than spin.
            Partial::Nothing => {
                debug_assert!(false, "a full read buffer with no message in progress");
                self.covers = self.buf.len() + READ_ALLOWANCE;
                return Ok(());
            }
        };
        // Waiting for room, nothing is read: a client that hung up meanwhile is noticed by
        // asking its socket, and its half-read message (and what it holds) let go.
        let pool = self.pool.clone();
        let take = pool.take(need.saturating_sub(have));
        tokio::pin!(take);
        let more = loop {
            tokio::select! {
                biased;
                p = &mut take => break p,
                _ = tokio::time::sleep(HANGUP_CHECK), if self.hung_up.is_some() => {
                    if self.hung_up.as_ref().is_some_and(|gone| gone()) {
                        self.held = None;
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::ConnectionAborted,
                            "the client hung up with a message waiting for room",
                        ));
                    }
                }
            }
        };
        self.add(more);
        self.covers = covers;
        if let Partial::Body(len) = self.codec.partial() {
            if self.buf.capacity() < len {
                let mut exact = BytesMut::with_capacity(len + READ_ALLOWANCE);
                exact.extend_from_slice(&self.buf);
                self.buf = exact;
            }
        }
        Ok(())
    }

    /// The budget a message of `covers` bytes holds while it is read: its bytes, a batch's
    /// copies, its reply's headroom.
    fn need(&self, covers: usize) -> usize {
        covers + batch_copies(&self.buf, covers, self.max) + HEADROOM
    }

    fn add(&mut self, more: OwnedSemaphorePermit) {
        match &mut self.held {
            Some(h) => h.merge(more),
            None => self.held = Some(more),
        }
    }

    /// A frame is out: it takes its budget (its bytes, a batch's copies, its reply's
    /// headroom) and the rest goes back; a large one gets its buffer to itself (the next
    /// bytes are moved to a fresh one), so it is decoded in place.
    #[inline]
    fn took(&mut self, f: Frame) -> (Frame, Counted) {
        let held = self.held.take();
        self.covers = 0;
        let Frame::Message(bytes) = f else {
            return (f, Counted::default());
        };
        let Some(mut held) = held else {
            return (Frame::Message(bytes), Counted::default());
        };
        let size = bytes.len() + batch_copies(&bytes, bytes.len(), self.max);
        let keep = size + HEADROOM;
        if held.num_permits() > keep {
            drop(held.split(held.num_permits() - keep));
        }
        let headroom = held.split(HEADROOM);
        let mut rest = BytesMut::with_capacity(READ_ALLOWANCE.max(self.buf.len()));
        rest.extend_from_slice(&self.buf);
        self.buf = rest;
        let counted = Counted {
            _own: None,
            pool: Some(held),
            headroom,
        };
        (Frame::Message(bytes), counted)
    }
}

/// What decoding the message starting `buf` (of `len` bytes) copies beside it: a batch's
/// elements' params (the size of a batch within [`batch_limit`]; a larger one is never
/// decoded).
fn batch_copies(buf: &[u8], len: usize, max: usize) -> usize {
    if is_batch(buf) && len <= batch_limit(max) {
        len
    } else {
        0
    }
}

fn is_batch(buf: &[u8]) -> bool {
    buf.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
}

/// The largest batch decoded: [`BATCH_BYTES`], at most half the message size limit (a line
/// counted at the limit holds a batch and its copies).
fn batch_limit(max: usize) -> usize {
    BATCH_BYTES.min(max / 2)
}

fn framing_tag(f: Framing) -> u8 {
    match f {
        Framing::Line => 1,
        Framing::Header => 2,
    }
}

async fn write_loop(
    writer: Arc<Writer>,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    closed: CancellationToken,
) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut released = 0;
    loop {
        if released > 0 && rx.is_empty() {
            note_released(std::mem::take(&mut released), true);
        }
        let first = tokio::select! {
            m = rx.recv() => match m {
                Some(m) => m,
                None => break,
            },
            _ = closed.cancelled() => match rx.try_recv() {
                Ok(m) => m,
                Err(_) => break,
            },
        };
        // Held while this batch is written: a sender writes itself only when it gets the
        // writer with nothing queued (outbound::Writer), so nothing passes what is queued.
        let mut w = writer.io.lock().await;
        let f = writer.framing();
        let mut taken = 0;
        let mut batch = Some(first);
        let mut ok = true;
        // Tracked messages of this write: told once it is flushed (or dropped: not
        // delivered).
        let mut acks: Vec<Ack> = Vec::new();
        while let Some(mut m) = batch.take() {
            taken += 1;
            if let Some(a) = m.ack.take() {
                acks.push(a);
            }
            if m.framed {
                buf.extend_from_slice(&m.body);
            } else if m.body.len() >= DIRECT_WRITE {
                // Large body: the framing and the body without copying, in one vectored
                // write with what is buffered (three or four plain writes before issue 48).
                ok = if f == Framing::Header {
                    let head = format!("Content-Length: {}\r\n\r\n", m.body.len());
                    w.write_all(&buf).await.is_ok()
                        && crate::outbound::write_parts(&mut w, [head.as_bytes(), &m.body, b""])
                            .await
                            .is_ok()
                } else {
                    crate::outbound::write_parts(&mut w, [&buf, &m.body, b"\n"])
                        .await
                        .is_ok()
                };
                buf.clear();
                released += m.body.len();
            } else {
                f.write(&m.body, &mut buf);
            }
            drop(m);
            if !ok {
                break;
            }
            if buf.len() < 256 * 1024 {
                batch = rx.try_recv().ok();
            }
        }
        if ok && !buf.is_empty() {
            ok = w.write_all(&buf).await.is_ok();
            buf.clear();
        }
        if ok {
            ok = w.flush().await.is_ok();
        }
        if !ok {
            debug!("client gone; closing its connection");
            closed.cancel();
            // What was not written goes back to its senders (streams keep it for a later
            // attach): this write's tracked messages first, then everything still queued,
            // in order.
            drop(acks);
            rx.close();
            while let Ok(m) = rx.try_recv() {
                released += m.body.len();
                drop(m);
            }
            break;
        }
        writer.queued.fetch_sub(taken, Ordering::AcqRel);
        drop(w);
        for a in acks {
            a.delivered();
        }
        if buf.capacity() > 4 * 1024 * 1024 {
            buf = BytesMut::with_capacity(64 * 1024);
        }
    }
    // What was queued and never written counts as freed too (a client that went away with
    // a full queue).
    while let Ok(m) = rx.try_recv() {
        released += m.body.len();
        drop(m);
    }
    note_released(released, true);
    let _ = writer.io.lock().await.shutdown().await;
}

/// Handle one frame. Returns true when the connection must close (`exit`). `counted`: the
/// budget a large frame was read into.
async fn handle_frame(
    broker: &Arc<Broker>,
    conn: &Arc<Conn>,
    bytes: BytesMut,
    mut counted: Counted,
) -> bool {
    let size = bytes.len();
    if is_batch(&bytes) && size > batch_limit(broker.max_message) {
        // Never decoded: its elements are counted (for the answer), nothing is built.
        let err = match message::batch_len(&bytes) {
            Ok(n) if n > limits::MAX_BATCH => limits::batch_too_large(n),
            _ => batch_too_many_bytes(size, batch_limit(broker.max_message)),
        };
        drop(bytes);
        warn!(
            conn = conn.handle.id,
            size, "refusing a batch too large to decode"
        );
        conn.handle
            .send(message::encode_response(None, Err(&err.to_rpc())))
            .await;
        return false;
    }
    // A frame read into the budget has its buffer to itself: decoded in place (its params
    // are that buffer, never a copy). A small one is decoded from the read buffer.
    let decoded = if counted.holds_budget() {
        message::decode_owned(Vec::from(bytes), limits::MAX_BATCH)
    } else {
        let d = message::decode_limited(&bytes, limits::MAX_BATCH);
        drop(bytes);
        d
    };
    let incoming = match decoded {
        Ok(i) => i,
        Err(count) => {
            warn!(
                conn = conn.handle.id,
                count,
                "refusing a batch above {} elements",
                limits::MAX_BATCH
            );
            let err = limits::batch_too_large(count);
            conn.handle
                .send(message::encode_response(None, Err(&err.to_rpc())))
                .await;
            return false;
        }
    };
    if let (Incoming::Batch(_), Some(p)) = (&incoming, &mut counted.pool) {
        // The frame is gone; its elements' params (copies, at most its size) remain.
        if p.num_permits() > size {
            drop(p.split(p.num_permits() - size));
        }
    }
    match incoming {
        Incoming::Single(Ok(Message::Request(req))) => {
            let slot = acquire(conn).await;
            if let Some(body) = inline(broker, conn, &req) {
                conn.handle.send(body).await;
                drop(slot);
                return false;
            }
            if !counted.holds_budget() {
                counted._own = count_small(conn, size).await;
                if counted._own.is_none() && size > 0 {
                    counted.pool = Some(broker.pool.take(size).await);
                }
            }
            let held = Held {
                _slot: slot,
                _inbound: take_inbound(conn, size).await,
                counted,
            };
            let token = register(conn, &req.id);
            if let Some(key) = lane_key(&req) {
                let mut lanes = conn.lanes.lock().expect("lanes lock");
                let item = Laned {
                    req,
                    token,
                    held,
                    claim: None,
                };
                let item = match lanes.get(&key) {
                    Some(tx) => {
                        // Queued behind another: a cancellation is answered while it waits.
                        let claim = Arc::new(Claim::default());
                        let watch = (item.req.id.clone(), item.token.clone(), claim.clone());
                        let item = Laned {
                            claim: Some(claim),
                            ..item
                        };
                        match tx.send(item) {
                            Ok(()) => {
                                let (id, token, claim) = watch;
                                tokio::spawn(cancel_watch(conn.clone(), id, token, claim));
                                return false;
                            }
                            Err(mpsc::error::SendError(item)) => Laned {
                                claim: None,
                                ..item
                            },
                        }
                    }
                    None => item,
                };
                let (tx, rx) = mpsc::unbounded_channel();
                let _ = tx.send(item);
                lanes.insert(key.clone(), tx);
                tokio::spawn(lane_worker(broker.clone(), conn.clone(), key, rx));
                return false;
            }
            let (broker, conn) = (broker.clone(), conn.clone());
            // Boxed: the request's future (about 1.5 KiB) is moved once, into its box, and
            // the task holds a pointer; spawned as it is, it was copied four times per request.
            tokio::spawn(Box::pin(async move {
                let Held {
                    _slot,
                    _inbound,
                    counted,
                } = held;
                serve_one(&broker, &conn, req, token, counted).await;
            }));
            false
        }
        Incoming::Single(Ok(Message::Notification(n))) => notification(conn, n),
        Incoming::Single(Ok(Message::Response(r))) => {
            debug!(id = ?r.id, "ignoring a response from a client");
            false
        }
        Incoming::Single(Err(inv)) => {
            conn.handle
                .send(message::encode_response(
                    inv.id.as_ref(),
                    Err(&inv.error.to_rpc()),
                ))
                .await;
            false
        }
        Incoming::Batch(items) => batch(broker, conn, items, size, counted).await,
    }
}

/// Count a small message's bytes in the connection's own allowance, if it has room.
async fn count_small(conn: &Conn, size: usize) -> Option<OwnedSemaphorePermit> {
    if size == 0 {
        return None;
    }
    conn.inbound_own
        .clone()
        .try_acquire_many_owned(size.min(INBOUND_ALLOWANCE) as u32)
        .ok()
}

/// E1005 for a batch larger than the broker decodes.
fn batch_too_many_bytes(size: usize, limit: usize) -> AbxError {
    let mut e = AbxError::new(ErrorCode::MessageTooLarge, &[]);
    e.message =
        format!("Batch too large: the limit is {limit} bytes per batch (this one has {size}).");
    e.suggestion =
        "Send large requests outside a batch (they run concurrently all the same).".into();
    e.with_data("limit", limit).with_data("size", size)
}

/// E1013: a request holding budget for its large message found none free for its reply
/// (it never waits for the budget while holding some).
fn budget_busy(method: &str, held: usize) -> AbxError {
    AbxError::new(
        ErrorCode::Busy,
        &[(
            "detail",
            &format!(
                "the memory budget has no room now for the reply to '{method}' beside its own \
                 message ({held} bytes); it was not run"
            ),
        )],
    )
}

/// A batch: each request takes an in-flight slot (waiting like single requests do), their
/// replies' reservations are taken together, and the elements whose replies would not fit
/// in the outbound budget beside the others are answered E1005 instead of being run.
async fn batch(
    broker: &Arc<Broker>,
    conn: &Arc<Conn>,
    items: Vec<Result<Message, message::Invalid>>,
    size: usize,
    mut counted: Counted,
) -> bool {
    let mut exit = false;
    let mut slots = Vec::new();
    let mut futs = Vec::new();
    let mut bodies: Vec<Option<Vec<u8>>> = Vec::with_capacity(items.len());
    let mut reserve = 0usize;
    let mut work = 0usize;
    let mut ids = Vec::new();
    let replied = CancellationToken::new();
    for item in items {
        match item {
            Ok(Message::Request(req)) => {
                let need = limits::reply_reserve(&req.method, req.params.as_deref());
                if reserve + need > OUTBOUND_BUDGET - MSG_OVERHEAD {
                    let mut e = AbxError::new(ErrorCode::MessageTooLarge, &[]);
                    e.message = format!(
                        "Batch reply too large: with '{}' the replies of this batch could exceed the {} bytes queued per connection.",
                        req.method, OUTBOUND_BUDGET
                    );
                    e.suggestion =
                        "Send large reads and commands outside a batch (they run concurrently all the same)."
                            .into();
                    bodies.push(Some(message::encode_response(
                        Some(&req.id),
                        Err(&e.to_rpc()),
                    )));
                    continue;
                }
                reserve += need;
                work += limits::work_reserve(&req.method, req.params.as_deref());
                slots.push(acquire(conn).await);
                let token = register(conn, &req.id);
                let idx = bodies.len();
                bodies.push(None);
                ids.push((idx, req.id.clone()));
                let (broker, conn, replied) = (broker.clone(), conn.clone(), replied.clone());
                futs.push(async move {
                    let r = run_request(&broker, &conn, req, token, replied, None).await;
                    (idx, r)
                });
            }
            Ok(Message::Notification(n)) => exit |= notification(conn, n),
            Ok(Message::Response(_)) => {}
            Err(inv) => bodies.push(Some(message::encode_response(
                inv.id.as_ref(),
                Err(&inv.error.to_rpc()),
            ))),
        }
    }
    if !counted.holds_budget() {
        counted._own = count_small(conn, size).await;
        if counted._own.is_none() && size > 0 {
            counted.pool = Some(broker.pool.take(size).await);
        }
    }
    let inbound = take_inbound(conn, size).await;
    let conn2 = conn.clone();
    tokio::spawn(async move {
        let reservation = if futs.is_empty() {
            None
        } else if counted.holds_budget() {
            // A large batch holds budget: its replies' room never waits for more of it.
            let held = counted.pool.as_ref().map_or(0, |p| p.num_permits());
            match conn2
                .handle
                .reserve_within(reserve, work, &mut counted.headroom)
                .await
            {
                Ok(r) => r,
                Err(()) => {
                    let e = budget_busy("a batch", held).to_rpc();
                    let mut pending = conn2.pending.lock().expect("pending lock");
                    for (idx, id) in ids {
                        pending.remove(&id);
                        bodies[idx] = Some(message::encode_response(Some(&id), Err(&e)));
                    }
                    drop(pending);
                    futs.clear();
                    None
                }
            }
        } else {
            conn2.handle.reserve_with(reserve, work).await
        };
        let mut holds = Vec::new();
        if reservation.is_some() || futs.is_empty() {
            for (idx, (body, hold)) in futures::future::join_all(futs).await {
                bodies[idx] = Some(body);
                holds.extend(hold);
            }
        }
        let bodies: Vec<Vec<u8>> = bodies.into_iter().flatten().collect();
        if !bodies.is_empty() {
            let body = message::encode_batch(&bodies);
            let len = body.len() + bodies.iter().map(Vec::len).sum::<usize>();
            drop(bodies);
            let hold = holds.into_iter().reduce(|mut a, b| {
                a.merge(b);
                a
            });
            match reservation {
                Some(r) => conn2.handle.send_reserved(body, r, hold).await,
                None => {
                    drop(hold);
                    conn2.handle.send(body).await
                }
            };
            if len >= DIRECT_WRITE {
                note_released(len, false);
            }
        }
        replied.cancel();
        drop((slots, inbound, counted));
    });
    exit
}

/// Hold a frame's bytes against the inbound budget (a frame at the limit takes it all).
async fn take_inbound(conn: &Conn, size: usize) -> Option<OwnedSemaphorePermit> {
    if size < 4096 {
        return None;
    }
    let n = size.min(INBOUND_MAX) as u32;
    let n = n.min(conn.inbound_size as u32);
    conn.inbound.clone().acquire_many_owned(n).await.ok()
}

/// Run one request and queue its reply: the reply's bytes are reserved before it runs. A
/// request whose message holds budget (`counted`) takes that room without waiting for more
/// budget (E1013 when there is none); its message's budget then counts its reply.
async fn serve_one(
    broker: &Arc<Broker>,
    conn: &Arc<Conn>,
    req: Request,
    token: CancellationToken,
    mut counted: Counted,
) {
    let need = limits::reply_reserve(&req.method, req.params.as_deref());
    let work = limits::work_reserve(&req.method, req.params.as_deref());
    // The reservation first: when there is room (almost always) the cancellation's waiter is
    // never registered. A request cancelled meanwhile is still answered E1006 by
    // `run_request`, which checks the token before it runs anything.
    let reservation = if counted.holds_budget() {
        let held = counted.pool.as_ref().map_or(0, |p| p.num_permits());
        let r = tokio::select! {
            biased;
            r = conn.handle.reserve_within(need, work, &mut counted.headroom) => r,
            _ = token.cancelled() => Ok(None),
        };
        match r {
            Ok(r) => r,
            Err(()) => {
                conn.pending.lock().expect("pending lock").remove(&req.id);
                let err = budget_busy(&req.method, held);
                drop(counted);
                conn.handle
                    .send(message::encode_response(Some(&req.id), Err(&err.to_rpc())))
                    .await;
                return;
            }
        }
    } else {
        tokio::select! {
            biased;
            r = conn.handle.reserve_with(need, work) => r,
            _ = token.cancelled() => None,
        }
    };
    let Some(mut reservation) = reservation else {
        // Cancelled (or the client went away) while waiting for room: never run it, so
        // requests that were waiting for budget cannot all run at once without any.
        conn.pending.lock().expect("pending lock").remove(&req.id);
        let err = AbxError::new(ErrorCode::RequestCancelled, &[]);
        conn.handle
            .send(message::encode_response(Some(&req.id), Err(&err.to_rpc())))
            .await;
        return;
    };
    let replied = CancellationToken::new();
    // The reply's budget is lent to whatever builds it (a plugin's host reads the reply into
    // it), and comes back as its hold.
    let lent = reservation.take_pool();
    let (body, hold) = run_request(broker, conn, req, token, replied.clone(), lent).await;
    let len = body.len();
    // The params are gone: the bytes counted for them count the reply (what it does not need
    // goes back when it is queued).
    let hold = merge(hold, counted.into_pool());
    conn.handle.send_reserved(body, reservation, hold).await;
    replied.cancel();
    if len >= DIRECT_WRITE {
        note_released(len, false);
    }
}

async fn acquire(conn: &Conn) -> OwnedSemaphorePermit {
    conn.in_flight
        .clone()
        .acquire_owned()
        .await
        .expect("the in-flight semaphore is never closed")
}

fn register(conn: &Conn, id: &Id) -> CancellationToken {
    let token = CancellationToken::new();
    conn.pending
        .lock()
        .expect("pending lock")
        .insert(id.clone(), token.clone());
    token
}

/// Methods answered without a task: cheap and never blocking.
fn inline(broker: &Arc<Broker>, conn: &Conn, req: &Request) -> Option<Vec<u8>> {
    if conn.shutting_down.load(Ordering::Relaxed) {
        return None;
    }
    // Params with members (by-position ones other than [] too) get their E1004 from the
    // dispatcher: these methods take none.
    if !req.params.as_deref().is_none_or(dispatch::no_members) {
        return None;
    }
    if !matches!(req.method.as_str(), methods::PING | methods::STATUS) {
        return None;
    }
    // `broker/status` asks every provider for its `info()`: a provider that panics there is
    // answered E9001 like any handler, not allowed to take the reader (and the connection)
    // down with it.
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match req.method.as_str() {
            methods::PING => dispatch::ping(),
            _ => dispatch::status(broker),
        }))
        .unwrap_or_else(|panic| Err(panicked(&req.method, conn.handle.id, &*panic)));
    Some(encode_outcome(&req.id, result))
}

fn encode_outcome(id: &Id, outcome: Result<Box<RawValue>, AbxError>) -> Vec<u8> {
    match outcome {
        // In place: a large result is not copied a second time.
        Ok(v) => message::encode_response_owned(id, v),
        Err(e) => message::encode_response(Some(id), Err(&e.to_rpc())),
    }
}

async fn run_request(
    broker: &Arc<Broker>,
    conn: &Arc<Conn>,
    req: Request,
    token: CancellationToken,
    replied: CancellationToken,
    lent: Option<OwnedSemaphorePermit>,
) -> (Vec<u8>, Option<OwnedSemaphorePermit>) {
    let _counted = broker.request_started();
    let hold: Hold = Arc::new(Mutex::new(lent));
    let outcome = if conn.shutting_down.load(Ordering::Relaxed) {
        Err(AbxError::new(
            ErrorCode::ShuttingDown,
            &[("method", &req.method)],
        ))
    } else if token.is_cancelled() {
        // Cancelled before it started: not started at all.
        Err(AbxError::new(ErrorCode::RequestCancelled, &[]))
    } else {
        let cx = Cx {
            broker: broker.clone(),
            conn: conn.caller.clone(),
            cancel: token.clone(),
            replied,
            hold: hold.clone(),
        };
        let call = std::panic::AssertUnwindSafe(dispatch::call(&cx, &req.method, req.params))
            .catch_unwind();
        tokio::select! {
            biased;
            _ = token.cancelled() => Err(AbxError::new(ErrorCode::RequestCancelled, &[])),
            r = call => r.unwrap_or_else(|panic| Err(panicked(&req.method, conn.handle.id, &*panic))),
        }
    };
    conn.pending.lock().expect("pending lock").remove(&req.id);
    if req.method == methods::SHUTDOWN {
        conn.shutting_down.store(true, Ordering::Relaxed);
    }
    let body = encode_outcome(&req.id, outcome);
    // A handler that panicked while holding the hold's lock poisoned it: its reply (E9001)
    // is still owed, so the lock is taken as it is rather than panicking here.
    let hold = hold
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    (body, hold)
}

/// The E9001 answer to a handler that panicked; the panic is logged with its method.
fn panicked(method: &str, conn: u64, panic: &(dyn std::any::Any + Send)) -> AbxError {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    tracing::error!(conn, method, panic = %what, "request handler panicked");
    AbxError::internal(format!("the handler of '{method}' failed ({what})"))
}

/// Handle a notification. Returns true on `exit`.
fn notification(conn: &Conn, n: Notification) -> bool {
    match n.method.as_str() {
        methods::EXIT => true,
        methods::CANCEL_REQUEST => {
            match n
                .params
                .as_deref()
                .map(|p| serde_json::from_str::<CancelParams>(p.get()))
            {
                Some(Ok(p)) => {
                    if !conn.cancel(&p.id) {
                        debug!(id = %p.id, "cancel for a request that is not running");
                    }
                }
                _ => debug!("ignoring $/cancelRequest without a valid id"),
            }
            false
        }
        methods::INITIALIZED => false,
        other => {
            debug!(method = other, "ignoring unknown notification");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::Pool;
    use std::time::Duration;

    const MIB: usize = 1 << 20;

    fn used(pool: &Pool) -> usize {
        pool.cap() - pool.available()
    }

    /// Poll the reader for a moment: `None` when it is still waiting (for bytes or room).
    async fn poll<R: AsyncRead + Unpin>(r: &mut Reader<R>) -> Option<(Frame, Counted)> {
        match tokio::time::timeout(Duration::from_millis(200), r.next()).await {
            Ok(Some(Ok(f))) => Some(f),
            Ok(other) => panic!("the stream ended: {:?}", other.map(|r| r.map(|_| ()))),
            Err(_) => None,
        }
    }

    /// A `Content-Length` body is counted whole before more of it than the allowance is read;
    /// the frame takes that budget (its bytes, and its reply's headroom) and nothing stays.
    #[tokio::test]
    async fn a_declared_body_is_counted_whole_before_it_is_read() {
        let pool = Pool::new(16 * MIB);
        let (mut client, server) = tokio::io::duplex(MIB);
        let mut r = Reader::new(server, 8 * MIB, pool.clone(), None);
        let len = 3 * MIB;
        let writer = tokio::spawn(async move {
            client
                .write_all(format!("Content-Length: {len}\r\n\r\n").as_bytes())
                .await
                .unwrap();
            client.write_all(&vec![b'x'; len / 2]).await.unwrap();
            client
        });
        assert!(poll(&mut r).await.is_none());
        assert_eq!(used(&pool), len + HEADROOM, "counted whole, once");
        assert!(r.buf.capacity() >= len, "one buffer of its size");
        let mut client = writer.await.unwrap();
        let rest = tokio::spawn(async move {
            client.write_all(&vec![b'y'; len - len / 2]).await.unwrap();
            client
        });
        let (frame, counted) = poll(&mut r).await.expect("the frame");
        drop(rest.await.unwrap());
        assert!(matches!(&frame, Frame::Message(b) if b.len() == len));
        assert_eq!(counted.pool.as_ref().unwrap().num_permits(), len);
        assert_eq!(counted.headroom.as_ref().unwrap().num_permits(), HEADROOM);
        drop((frame, counted));
        assert_eq!(used(&pool), 0);
    }

    /// A line whose end is unknown is counted as it grows, never behind what was read; two
    /// lines half read at once, with room for one whole line only, both complete once their
    /// bytes come (the one waiting holds what it read, the other can still grow).
    #[tokio::test]
    async fn lines_are_counted_as_they_grow_and_two_half_read_ones_both_complete() {
        let pool = Pool::new(12 * MIB);
        let max = 4 * MIB;
        let mut readers = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..2 {
            let (client, server) = tokio::io::duplex(MIB);
            readers.push(Reader::new(server, max, pool.clone(), None));
            clients.push(client);
        }
        let line = |n: usize| {
            let mut l = vec![b'{'];
            l.resize(n, b'a');
            l
        };
        let mut tasks = Vec::new();
        for mut c in clients {
            tasks.push(tokio::spawn(async move {
                c.write_all(&line(3 * MIB)).await.unwrap();
                c
            }));
        }
        for _ in 0..20 {
            for r in readers.iter_mut() {
                assert!(poll(r).await.is_none());
                let held = r.held.as_ref().map_or(0, |h| h.num_permits());
                assert!(
                    r.buf.len() <= READ_ALLOWANCE || held >= r.buf.len(),
                    "{} bytes read, {held} counted",
                    r.buf.len()
                );
            }
            if tasks.iter().all(|t| t.is_finished()) {
                break;
            }
        }
        let mut clients = Vec::new();
        for t in tasks {
            clients.push(t.await.unwrap());
        }
        assert!(used(&pool) <= pool.cap());
        for c in clients.iter_mut() {
            c.write_all(b"\n").await.unwrap();
        }
        for r in readers.iter_mut() {
            let mut got = None;
            for _ in 0..20 {
                got = poll(r).await;
                if got.is_some() {
                    break;
                }
            }
            let (frame, counted) = got.expect("the line completes");
            assert!(matches!(&frame, Frame::Message(b) if b.len() == 3 * MIB));
            drop((frame, counted));
        }
        assert_eq!(used(&pool), 0);
    }
}
