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
//! - A handler that panics is answered E9001 (and logged with its method); the connection
//!   and the other requests carry on.
//! - After a burst of large messages the allocator gives the freed memory back
//!   ([`note_released`]).
//! - The writer drains the queue, coalescing whatever is ready into one write. A client that
//!   died is found out by a failed write: tracked messages (stream notifications) that were
//!   not written go back to their senders ([`ConnHandle::send_tracked`]), so an exec keeps
//!   them, its exit included, for the next `exec/attach`.
//! - Requests that must apply in order (`exec/write`, `exec/resize`, `exec/kill` of one
//!   exec) run in arrival order on a lane of their own; the rest run concurrently.
//! - `$/cancelRequest` cancels the request's token; the request answers -32800 at once.
//! - Lifecycle: `shutdown` makes later requests fail with E1010; `exit` closes.

use crate::dispatch::{self, Cx};
use crate::state::Broker;
use abx_protocol::api::{methods, CancelParams, PeerInfo};
use abx_protocol::codec::{Frame, FrameCodec, Framing};
use abx_protocol::limits;
use abx_protocol::message::{self, Incoming, Message, Notification, Request};
use abx_protocol::{AbxError, ErrorCode, Id};
use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Requests served at once on one connection.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Bytes queued for one connection before its producers wait.
pub const OUTBOUND_BUDGET: usize = 16 * 1024 * 1024;
/// Accounting overhead per queued message.
pub const MSG_OVERHEAD: usize = 64;
/// Queued bytes of small messages each connection may hold outside the broker-wide pool:
/// its small replies (pings, acks, errors) never wait for other connections.
pub const OWN_ALLOWANCE: usize = 64 * 1024;
/// Messages up to this cost (body + overhead) may use the connection's own allowance.
pub const SMALL_MESSAGE: usize = 8 * 1024;
/// Default broker-wide cap on queued outbound bytes and large result buffers
/// (`ABX_MEMORY_BUDGET`).
pub const DEFAULT_POOL: usize = 128 * 1024 * 1024;
/// Bodies above this are written straight from their buffer, not copied.
const DIRECT_WRITE: usize = 64 * 1024;
/// Largest inbound budget (the semaphore counts in u32).
const INBOUND_MAX: usize = 1 << 31;
/// A read buffer grown past this by a large message is replaced once the message is out.
const READ_BUFFER_KEEP: usize = 1024 * 1024;
/// Freed bytes of large messages after which the allocator is asked to give memory back.
const TRIM_AFTER: usize = 32 * 1024 * 1024;

static RELEASED: AtomicUsize = AtomicUsize::new(0);
static TRIMMING: AtomicBool = AtomicBool::new(false);

/// Count `bytes` of a large message as freed; past [`TRIM_AFTER`] (and when `idle`, nothing
/// more queued) the allocator returns its free pages to the system (`malloc_trim`), so RSS
/// goes back near idle after a burst instead of staying at its peak.
pub fn note_released(bytes: usize, idle: bool) {
    let total = RELEASED.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if !idle || total < TRIM_AFTER || TRIMMING.swap(true, Ordering::AcqRel) {
        return;
    }
    RELEASED.store(0, Ordering::Relaxed);
    let trim = || {
        trim_now();
        TRIMMING.store(false, Ordering::Release);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) => drop(h.spawn_blocking(trim)),
        Err(_) => trim(),
    }
}

/// Give free heap pages back to the system now.
pub fn trim_now() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The broker-wide memory budget: bytes of queued outbound messages (beyond each
/// connection's own small allowance) and of large result buffers being built (`exec/run`
/// output, stream chunks). Whoever needs more waits (or, for `exec/run` output, stops
/// keeping it), so the sum stays under the cap whatever clients do.
#[derive(Clone)]
pub struct Pool {
    sem: Arc<Semaphore>,
    cap: usize,
}

impl Pool {
    /// A pool of `cap` bytes (at least 1 MiB, at most 2 GiB).
    pub fn new(cap: usize) -> Pool {
        let cap = cap.clamp(1 << 20, 1 << 31);
        Pool {
            sem: Arc::new(Semaphore::new(cap)),
            cap,
        }
    }

    /// The cap in bytes.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Bytes free right now.
    pub fn available(&self) -> usize {
        self.sem.available_permits()
    }

    fn units(&self, bytes: usize) -> u32 {
        bytes.clamp(1, self.cap) as u32
    }

    /// Take `bytes` (at most the cap) if free now.
    pub fn try_take(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        self.sem
            .clone()
            .try_acquire_many_owned(self.units(bytes))
            .ok()
    }

    /// Take `bytes` (at most the cap), waiting for them.
    pub async fn take(&self, bytes: usize) -> OwnedSemaphorePermit {
        self.sem
            .clone()
            .acquire_many_owned(self.units(bytes))
            .await
            .expect("the pool is never closed")
    }
}

/// A permit of a request's reply hold: bytes of the pool that already cover the memory of
/// its reply (an `exec/run` whose output was counted while it was collected). The handler
/// deposits it; the reply is queued against it, so the bytes stay counted, never twice.
pub type Hold = Arc<Mutex<Option<OwnedSemaphorePermit>>>;

/// What a queued message (or a reservation) holds: its share of the connection's budget,
/// and of its own small allowance or of the broker-wide pool.
pub struct Permits {
    conn: OwnedSemaphorePermit,
    own: Option<OwnedSemaphorePermit>,
    pool: Option<OwnedSemaphorePermit>,
}

impl Permits {
    /// Bytes of the pool or allowance held.
    fn shared(&self) -> usize {
        self.own.as_ref().map_or(0, |p| p.num_permits())
            + self.pool.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Add pool bytes (a handler's hold).
    fn add_pool(&mut self, p: OwnedSemaphorePermit) {
        match &mut self.pool {
            Some(mine) => mine.merge(p),
            None => self.pool = Some(p),
        }
    }

    /// Keep `conn` of the connection's budget and `shared` of the allowance or pool,
    /// giving the rest back; false when it holds less than that.
    fn fit(&mut self, conn: usize, shared: usize) -> bool {
        if self.conn.num_permits() < conn || self.shared() < shared {
            return false;
        }
        trim(&mut self.conn, conn);
        let own = self.own.as_ref().map_or(0, |p| p.num_permits());
        if own >= shared {
            self.pool = None;
            trim_opt(&mut self.own, shared);
        } else if let Some(p) = &mut self.pool {
            trim(p, shared - own);
        }
        true
    }
}

fn trim(p: &mut OwnedSemaphorePermit, keep: usize) {
    let have = p.num_permits();
    if have > keep && keep > 0 {
        drop(p.split(have - keep));
    }
}

fn trim_opt(p: &mut Option<OwnedSemaphorePermit>, keep: usize) {
    match p {
        Some(_) if keep == 0 => *p = None,
        Some(x) => trim(x, keep),
        None => {}
    }
}

struct Outbound {
    body: Bytes,
    _permit: Permits,
    /// Told whether the body reached the client (see [`ConnHandle::send_tracked`]).
    ack: Option<Ack>,
}

/// What a tracked message's sender hears: `Ok` once it was written and flushed, `Err(body)`
/// when it could not be (the client is gone), so the sender can keep it for later.
pub type Delivery = Box<dyn FnOnce(Result<(), Vec<u8>>) + Send>;

/// A tracked message's delivery report; dropped unreported (the connection went away
/// with the message still queued), it reports the body as undelivered.
struct Ack {
    body: Bytes,
    report: Option<Delivery>,
}

impl Ack {
    fn delivered(mut self) {
        if let Some(r) = self.report.take() {
            r(Ok(()));
        }
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        if let Some(r) = self.report.take() {
            r(Err(Vec::from(std::mem::take(&mut self.body))));
        }
    }
}

/// A cheap, cloneable way to send to one connection (replies, stream notifications).
#[derive(Clone)]
pub struct ConnHandle {
    /// Connection id (unique within this broker).
    pub id: u64,
    tx: mpsc::UnboundedSender<Outbound>,
    budget: Arc<Semaphore>,
    /// The connection's own allowance for small messages (outside the pool).
    own: Arc<Semaphore>,
    /// The broker-wide pool.
    pool: Pool,
    closed: CancellationToken,
}

/// What a message of `bytes` costs: of the connection's budget, and of the allowance or pool.
fn costs(bytes: usize, pool: &Pool) -> (usize, usize) {
    let cost = bytes.saturating_add(MSG_OVERHEAD);
    (cost.min(OUTBOUND_BUDGET), cost.min(pool.cap()))
}

impl ConnHandle {
    /// The broker-wide pool this connection's messages count against.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Queue one already-encoded message body. Waits while the queue is over budget.
    /// Returns false when the connection is gone.
    pub async fn send(&self, body: Vec<u8>) -> bool {
        self.send_or_keep(body).await.is_ok()
    }

    async fn conn_units(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        match self.budget.clone().try_acquire_many_owned(n as u32) {
            Ok(p) => Some(p),
            Err(tokio::sync::TryAcquireError::Closed) => None,
            Err(tokio::sync::TryAcquireError::NoPermits) => tokio::select! {
                p = self.budget.clone().acquire_many_owned(n as u32) => p.ok(),
                _ = self.closed.cancelled() => None,
            },
        }
    }

    /// The shared part of a message's cost, if free now: the connection's own allowance
    /// when the message is small and there is room, else the pool.
    fn try_shared(
        &self,
        n: usize,
    ) -> Option<(Option<OwnedSemaphorePermit>, Option<OwnedSemaphorePermit>)> {
        if n <= SMALL_MESSAGE {
            if let Ok(own) = self.own.clone().try_acquire_many_owned(n as u32) {
                return Some((Some(own), None));
            }
        }
        self.pool.try_take(n).map(|p| (None, Some(p)))
    }

    /// Take what a message of `bytes` costs: the connection's budget, then its allowance or
    /// the pool. Never waits for one while holding the other (so no two waiters can block
    /// each other): the connection's part is waited for first (a client that does not read
    /// waits here, never taking pool bytes it could not use); when the pool is short, the
    /// connection's part goes back while the pool is waited for. `None` once the connection
    /// is gone.
    async fn take(&self, bytes: usize) -> Option<Permits> {
        self.take_with(bytes, 0).await
    }

    /// [`ConnHandle::take`] with `work` more bytes of the shared part (memory the work holds
    /// beside the reply for a moment; given back when the reply is queued).
    async fn take_with(&self, bytes: usize, work: usize) -> Option<Permits> {
        let (c, sh) = costs(bytes, &self.pool);
        let sh = sh.saturating_add(work).min(self.pool.cap());
        loop {
            let conn = self.conn_units(c).await?;
            if let Some((own, pool)) = self.try_shared(sh) {
                return Some(Permits { conn, own, pool });
            }
            drop(conn);
            let pool = tokio::select! {
                p = self.pool.take(sh) => p,
                _ = self.closed.cancelled() => return None,
            };
            if let Ok(conn) = self.budget.clone().try_acquire_many_owned(c as u32) {
                return Some(Permits {
                    conn,
                    own: None,
                    pool: Some(pool),
                });
            }
        }
    }

    /// Reserve `bytes` (of the connection's budget and of the allowance or broker-wide pool)
    /// for a reply not built yet. Waits while either is short; `None` once the connection is
    /// gone.
    pub async fn reserve(&self, bytes: usize) -> Option<Permits> {
        self.take(bytes).await
    }

    /// [`ConnHandle::reserve`] with `work` bytes more of the shared budget, for memory the
    /// work holds beside its reply while it builds it (see [`limits::work_reserve`]).
    pub async fn reserve_with(&self, bytes: usize, work: usize) -> Option<Permits> {
        self.take_with(bytes, work).await
    }

    /// Queue `body` against a reservation from [`ConnHandle::reserve`] and a handler's
    /// `hold` (pool bytes that already count the body's memory): what they do not need goes
    /// back at once. When the connection's part is short, it is given back and the whole of
    /// it waited for (a waiter never holds connection budget while it waits, so replies
    /// larger than their reservations cannot deadlock), keeping the pool part: the body
    /// exists, its bytes stay counted. When the pool part is short and no more is free now,
    /// everything is given back and the whole cost waited for.
    pub async fn send_reserved(
        &self,
        body: Vec<u8>,
        mut permits: Permits,
        hold: Option<OwnedSemaphorePermit>,
    ) -> bool {
        if let Some(h) = hold {
            permits.add_pool(h);
        }
        let (c, sh) = costs(body.len(), &self.pool);
        if permits.shared() < sh {
            match self.pool.try_take(sh - permits.shared()) {
                Some(more) => permits.add_pool(more),
                None => {
                    drop(permits);
                    return self.send(body).await;
                }
            }
        }
        if !permits.fit(c, sh) {
            // The connection's part is short: wait for all of it, holding none of it.
            let Permits { conn, own, pool } = permits;
            drop(conn);
            let Some(conn) = self.conn_units(c).await else {
                return false;
            };
            permits = Permits { conn, own, pool };
            permits.fit(c, sh);
        }
        self.tx
            .send(Outbound {
                body: Bytes::from(body),
                _permit: permits,
                ack: None,
            })
            .is_ok()
    }

    /// [`ConnHandle::send`] that hands the body back when the connection has closed (a
    /// stream keeps it for a later attach without copying every body up front).
    pub async fn send_or_keep(&self, body: Vec<u8>) -> Result<(), Vec<u8>> {
        self.queue(body, None, None).await
    }

    /// [`ConnHandle::send_or_keep`] that also reports whether the body reached the client:
    /// `report(Ok(()))` once it was written and flushed, `report(Err(body))` when the
    /// client turned out to be gone (a write failed, or the connection closed with the body
    /// still queued). `Err(body)` here: not queued at all, `report` is not called.
    /// A stream uses it so that nothing written to a dead client is lost for a later
    /// `exec/attach`. `permits` (from [`ConnHandle::reserve`]) are used when given.
    pub async fn send_tracked(
        &self,
        body: Vec<u8>,
        report: Delivery,
        permits: Option<Permits>,
    ) -> Result<(), Vec<u8>> {
        self.queue(body, Some(report), permits).await
    }

    async fn queue(
        &self,
        body: Vec<u8>,
        report: Option<Delivery>,
        permits: Option<Permits>,
    ) -> Result<(), Vec<u8>> {
        let (c, sh) = costs(body.len(), &self.pool);
        let fitted = permits.and_then(|mut p| p.fit(c, sh).then_some(p));
        let permits = match fitted {
            Some(p) => p,
            None => match self.take(body.len()).await {
                Some(p) => p,
                None => return Err(body),
            },
        };
        let body = Bytes::from(body);
        let ack = report.map(|r| Ack {
            body: body.clone(),
            report: Some(r),
        });
        self.tx
            .send(Outbound {
                body,
                _permit: permits,
                ack,
            })
            .map_err(|e| {
                let mut m = e.0;
                // Not queued: the caller keeps the body (its report is not called).
                if let Some(mut a) = m.ack.take() {
                    a.report = None;
                }
                Vec::from(m.body)
            })
    }

    /// Queue a notification.
    pub async fn notify<P: Serialize + ?Sized>(&self, method: &str, params: &P) -> bool {
        self.send(message::encode_notification(method, Some(params)))
            .await
    }

    /// True once the connection has closed (the client went away or sent `exit`).
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves when the connection closes.
    pub async fn closed(&self) {
        self.closed.cancelled().await
    }
}

/// Per-connection state shared by its request tasks.
pub struct Conn {
    /// How to send to this connection.
    pub handle: ConnHandle,
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

type Laned = (Request, CancellationToken, Held);

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
        let (req, token, held) = item;
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
    let (tx, rx) = mpsc::unbounded_channel();
    let handle = ConnHandle {
        id: conn_id,
        tx,
        budget: Arc::new(Semaphore::new(OUTBOUND_BUDGET)),
        own: Arc::new(Semaphore::new(OWN_ALLOWANCE)),
        pool: broker.pool.clone(),
        closed: CancellationToken::new(),
    };
    let writer_task = tokio::spawn(write_loop(
        writer,
        rx,
        framing.clone(),
        handle.closed.clone(),
    ));
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
    let closed = conn.handle.closed.clone().cancelled_owned();
    tokio::pin!(shutdown, closed);
    let mut frames_seen: u32 = 0;
    let end = loop {
        frames_seen = frames_seen.wrapping_add(1);
        // A client that never pauses still notices a broker shutdown.
        if frames_seen.is_multiple_of(256) && broker.shutdown.is_cancelled() {
            break ConnEnd::BrokerShutdown;
        }
        let next = tokio::select! {
            biased;
            f = frames.next() => f,
            _ = &mut shutdown => break ConnEnd::BrokerShutdown,
            _ = &mut closed => break ConnEnd::Broken,
        };
        match next {
            None => break ConnEnd::Eof,
            Some(Err(e)) => {
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
                if handle_frame(&broker, &conn, bytes).await {
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
    debug!(conn = conn_id, ?end, "connection reader done");
    match end {
        ConnEnd::Eof if hung_up.as_ref().is_some_and(|gone| gone()) => {
            debug!(conn = conn_id, "client gone: cancelling its requests");
            conn.cancel_all();
            conn.handle.closed.cancel();
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
        conn.handle.closed.cancel();
    }
    let closed = conn.handle.closed.clone();
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

async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Outbound>,
    framing: Arc<AtomicU8>,
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
        let f = match framing.load(Ordering::Relaxed) {
            2 => Framing::Header,
            _ => Framing::Line,
        };
        let mut batch = Some(first);
        let mut ok = true;
        // Tracked messages of this write: told once it is flushed (or dropped: not
        // delivered).
        let mut acks: Vec<Ack> = Vec::new();
        while let Some(mut m) = batch.take() {
            if let Some(a) = m.ack.take() {
                acks.push(a);
            }
            if m.body.len() >= DIRECT_WRITE {
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
    let _ = w.shutdown().await;
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
                let item = (req, token, held);
                let item = match lanes.get(&key) {
                    Some(tx) => match tx.send(item) {
                        Ok(()) => return false,
                        Err(mpsc::error::SendError(item)) => item,
                    },
                    None => item,
                };
                let (tx, rx) = mpsc::unbounded_channel();
                let _ = tx.send(item);
                lanes.insert(key.clone(), tx);
                tokio::spawn(lane_worker(broker.clone(), conn.clone(), key, rx));
                return false;
            }
            let (broker, conn) = (broker.clone(), conn.clone());
            tokio::spawn(async move {
                serve_one(&broker, &conn, req, token).await;
                drop(held);
            });
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
    let reservation = tokio::select! {
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
    let result = match req.method.as_str() {
        methods::PING => dispatch::ping(),
        methods::STATUS => dispatch::status(broker),
        _ => return None,
    };
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
    let hold = hold.lock().expect("hold lock").take();
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

    fn handle(pool: &Pool) -> (ConnHandle, mpsc::UnboundedReceiver<Outbound>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let h = ConnHandle {
            id: 1,
            tx,
            budget: Arc::new(Semaphore::new(OUTBOUND_BUDGET)),
            own: Arc::new(Semaphore::new(OWN_ALLOWANCE)),
            pool: pool.clone(),
            closed: CancellationToken::new(),
        };
        (h, rx)
    }

    /// With the pool held by someone else, small messages still go (their connection's own
    /// allowance); a large one waits for the pool without holding its connection's budget, and
    /// goes once the pool frees.
    #[tokio::test]
    async fn small_messages_pass_a_full_pool_and_large_ones_wait_for_it() {
        let pool = Pool::new(1 << 20);
        let (h, mut rx) = handle(&pool);
        let hog = pool.try_take(pool.cap()).expect("the whole pool");
        assert_eq!(pool.available(), 0);
        for _ in 0..100 {
            assert!(
                h.send(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}".to_vec())
                    .await
            );
            drop(rx.recv().await.expect("queued"));
        }
        let big = h.clone();
        let waiter = tokio::spawn(async move { big.send(vec![b'x'; 256 * 1024]).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        // Waiting for the pool, it holds none of its connection's budget.
        assert_eq!(h.budget.available_permits(), OUTBOUND_BUDGET);
        drop(hog);
        assert!(waiter.await.unwrap());
        let m = rx.recv().await.expect("the large one");
        assert_eq!(m.body.len(), 256 * 1024);
        assert!(pool.available() < pool.cap());
        drop(m);
        assert_eq!(pool.available(), pool.cap());
    }

    /// A reply counted while it was built (a hold) is queued against those bytes: nothing is
    /// taken twice, and what the hold has beyond the reply goes back.
    #[tokio::test]
    async fn a_held_reply_is_queued_against_its_hold() {
        let pool = Pool::new(1 << 20);
        let (h, mut rx) = handle(&pool);
        let res = h.reserve(16 * 1024).await.expect("reserved");
        let hold = pool.try_take(600 * 1024).expect("held");
        let free = pool.available();
        assert!(
            h.send_reserved(vec![b'y'; 500 * 1024], res, Some(hold))
                .await
        );
        // The reservation's 16 KiB and the hold's extra came back; the body is counted once.
        assert_eq!(pool.available(), pool.cap() - (500 * 1024 + MSG_OVERHEAD));
        assert!(pool.available() > free);
        drop(rx.recv().await.expect("queued"));
        assert_eq!(pool.available(), pool.cap());
    }
}
