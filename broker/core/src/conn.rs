//! One client connection: decode, dispatch concurrently, reply through a bounded queue.
//!
//! - The reader decodes frames and spawns one task per request (a batch is one task that
//!   runs its elements concurrently). At most [`MAX_IN_FLIGHT`] requests run per connection,
//!   each element of a batch counting as one; past that the reader stops reading, which
//!   pushes back on the client alone. A batch has at most [`limits::MAX_BATCH`] elements
//!   (E1005 beyond, counted without being decoded).
//! - The requests being served hold their frames' bytes against an inbound budget (the
//!   message size limit): past it the reader waits too.
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
use crate::dispatch::{self, Cx};
use crate::outbound::{
    note_released, Ack, Hold, Outbound, Queued, Writer, MSG_OVERHEAD, OUTBOUND_BUDGET,
};
use abx_protocol::api::{methods, CancelParams, PeerInfo};
use abx_protocol::codec::{Frame, FrameCodec, Framing};
use abx_protocol::limits;
use abx_protocol::message::{self, Incoming, Message, Notification, Request};
use abx_protocol::{AbxError, ErrorCode, Id};
use bytes::BytesMut;
use futures::{FutureExt, StreamExt};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::FramedRead;
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
/// A read buffer grown past this by a large message is replaced once the message is out.
const READ_BUFFER_KEEP: usize = 1024 * 1024;
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
    /// Who connected, from `initialize`.
    pub client: Mutex<Option<PeerInfo>>,
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
        serve_one(&broker, &conn, req, token).await;
        drop(held);
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
        handle,
        pending: Mutex::new(HashMap::new()),
        shutting_down: AtomicBool::new(false),
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        inbound: Arc::new(Semaphore::new(broker.max_message.clamp(1, INBOUND_MAX))),
        inbound_size: broker.max_message.clamp(1, INBOUND_MAX),
        client: Mutex::new(None),
        lanes: Mutex::new(HashMap::new()),
    });
    debug!(conn = conn_id, "connection opened");

    let mut frames =
        FramedRead::with_capacity(reader, FrameCodec::new(broker.max_message), 64 * 1024);
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
            frames.next().now_or_never()
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
            Some(Ok(Frame::TooLarge { size })) => {
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
            Some(Ok(Frame::Message(bytes))) => {
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
                let handled = handle_frame(&broker, &conn, bytes);
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
                    // A large message grew the read buffer: give it back rather than keep it
                    // for the connection's whole life.
                    let buf = frames.read_buffer_mut();
                    if buf.capacity() > READ_BUFFER_KEEP && buf.len() < READ_BUFFER_KEEP / 2 {
                        let mut fresh = BytesMut::with_capacity(64 * 1024);
                        fresh.extend_from_slice(buf);
                        *buf = fresh;
                    }
                    note_released(size, false);
                }
            }
        }
    };
    conn.handle.uncork();
    debug!(conn = conn_id, ?end, "connection reader done");
    match end {
        ConnEnd::Eof if hung_up.as_ref().is_some_and(|gone| gone()) => {
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
                // Large body: write what is buffered, then header and body without copying.
                let mut head = BytesMut::new();
                if f == Framing::Header {
                    head.extend_from_slice(
                        format!("Content-Length: {}\r\n\r\n", m.body.len()).as_bytes(),
                    );
                }
                ok = w.write_all(&buf).await.is_ok()
                    && w.write_all(&head).await.is_ok()
                    && w.write_all(&m.body).await.is_ok()
                    && (f == Framing::Header || w.write_all(b"\n").await.is_ok());
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

/// Handle one frame. Returns true when the connection must close (`exit`).
async fn handle_frame(broker: &Arc<Broker>, conn: &Arc<Conn>, bytes: BytesMut) -> bool {
    let size = bytes.len();
    let incoming = match message::decode_limited(&bytes, limits::MAX_BATCH) {
        Ok(i) => i,
        Err(count) => {
            drop(bytes);
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
    drop(bytes);
    match incoming {
        Incoming::Single(Ok(Message::Request(req))) => {
            let slot = acquire(conn).await;
            if let Some(body) = inline(broker, conn, &req) {
                conn.handle.send(body).await;
                drop(slot);
                return false;
            }
            let held = Held {
                _slot: slot,
                _inbound: take_inbound(conn, size).await,
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
                serve_one(&broker, &conn, req, token).await;
                drop(held);
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
        Incoming::Batch(items) => batch(broker, conn, items, size).await,
    }
}

/// A batch: each request takes an in-flight slot (waiting like single requests do), their
/// replies' reservations are taken together, and the elements whose replies would not fit
/// in the outbound budget beside the others are answered E1005 instead of being run.
async fn batch(
    broker: &Arc<Broker>,
    conn: &Arc<Conn>,
    items: Vec<Result<Message, message::Invalid>>,
    size: usize,
) -> bool {
    let mut exit = false;
    let mut slots = Vec::new();
    let mut futs = Vec::new();
    let mut bodies: Vec<Option<Vec<u8>>> = Vec::with_capacity(items.len());
    let mut reserve = 0usize;
    let mut work = 0usize;
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
                let (broker, conn, replied) = (broker.clone(), conn.clone(), replied.clone());
                futs.push(
                    async move { (idx, run_request(&broker, &conn, req, token, replied).await) },
                );
            }
            Ok(Message::Notification(n)) => exit |= notification(conn, n),
            Ok(Message::Response(_)) => {}
            Err(inv) => bodies.push(Some(message::encode_response(
                inv.id.as_ref(),
                Err(&inv.error.to_rpc()),
            ))),
        }
    }
    let inbound = take_inbound(conn, size).await;
    let conn2 = conn.clone();
    tokio::spawn(async move {
        let reservation = if futs.is_empty() {
            None
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
        drop((slots, inbound));
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

/// Run one request and queue its reply: the reply's bytes are reserved before it runs.
async fn serve_one(broker: &Arc<Broker>, conn: &Arc<Conn>, req: Request, token: CancellationToken) {
    let need = limits::reply_reserve(&req.method, req.params.as_deref());
    let work = limits::work_reserve(&req.method, req.params.as_deref());
    // The reservation first: when there is room (almost always) the cancellation's waiter is
    // never registered. A request cancelled meanwhile is still answered E1006 by
    // `run_request`, which checks the token before it runs anything.
    let reservation = tokio::select! {
        biased;
        r = conn.handle.reserve_with(need, work) => r,
        _ = token.cancelled() => None,
    };
    let Some(reservation) = reservation else {
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
    let (body, hold) = run_request(broker, conn, req, token, replied.clone()).await;
    let len = body.len();
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
    // By-position params other than [] get their E1004 from the dispatcher.
    if req.params.as_deref().and_then(dispatch::array_params) == Some(false) {
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
) -> (Vec<u8>, Option<OwnedSemaphorePermit>) {
    let _counted = broker.request_started();
    let hold: Hold = Arc::new(Mutex::new(None));
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
            conn: conn.clone(),
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
