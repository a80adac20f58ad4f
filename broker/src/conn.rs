//! One client connection: decode, dispatch concurrently, reply through a bounded queue.
//!
//! - The reader decodes frames and spawns one task per request (a batch is one task that
//!   runs its elements concurrently). At most [`MAX_IN_FLIGHT`] requests run per connection;
//!   past that the reader stops reading, which pushes back on the client alone.
//! - Replies and notifications go through the connection's outbound queue, bounded in bytes
//!   ([`OUTBOUND_BUDGET`]). A client that stops reading fills only its own queue: its own
//!   handlers wait, nobody else's.
//! - The writer drains the queue, coalescing whatever is ready into one write.
//! - Requests that must apply in order (`exec/write`, `exec/resize`, `exec/kill` of one
//!   exec) run in arrival order on a lane of their own; the rest run concurrently.
//! - `$/cancelRequest` cancels the request's token; the request answers -32800 at once.
//! - Lifecycle: `shutdown` makes later requests fail with E1010; `exit` closes.

use crate::dispatch::{self, Cx};
use crate::state::Broker;
use abx_protocol::api::{methods, CancelParams, PeerInfo};
use abx_protocol::codec::{Frame, FrameCodec, Framing};
use abx_protocol::message::{self, Incoming, Message, Notification, Request};
use abx_protocol::{AbxError, ErrorCode, Id};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde::Serialize;
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
/// Bytes queued for one connection before its producers wait.
pub const OUTBOUND_BUDGET: usize = 16 * 1024 * 1024;
/// Accounting overhead per queued message.
const MSG_OVERHEAD: usize = 64;
/// Bodies above this are written straight from their buffer, not copied.
const DIRECT_WRITE: usize = 64 * 1024;

struct Outbound {
    body: Bytes,
    _permit: OwnedSemaphorePermit,
}

/// A cheap, cloneable way to send to one connection (replies, stream notifications).
#[derive(Clone)]
pub struct ConnHandle {
    /// Connection id (unique within this broker).
    pub id: u64,
    tx: mpsc::UnboundedSender<Outbound>,
    budget: Arc<Semaphore>,
    closed: CancellationToken,
}

impl ConnHandle {
    /// Queue one already-encoded message body. Waits while the queue is over budget.
    /// Returns false when the connection is gone.
    pub async fn send(&self, body: Vec<u8>) -> bool {
        self.send_or_keep(body).await.is_ok()
    }

    /// [`ConnHandle::send`] that hands the body back when the connection has closed (a
    /// stream keeps it for a later attach without copying every body up front).
    pub async fn send_or_keep(&self, body: Vec<u8>) -> Result<(), Vec<u8>> {
        let cost = (body.len() + MSG_OVERHEAD).min(OUTBOUND_BUDGET) as u32;
        // Fast path: budget available (no cancellation bookkeeping per message).
        let permit = match self.budget.clone().try_acquire_many_owned(cost) {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(body),
            Err(tokio::sync::TryAcquireError::NoPermits) => tokio::select! {
                p = self.budget.clone().acquire_many_owned(cost) => match p {
                    Ok(p) => p,
                    Err(_) => return Err(body),
                },
                _ = self.closed.cancelled() => return Err(body),
            },
        };
        self.tx
            .send(Outbound {
                body: Bytes::from(body),
                _permit: permit,
            })
            .map_err(|e| Vec::from(e.0.body))
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
    /// Who connected, from `initialize`.
    pub client: Mutex<Option<PeerInfo>>,
    /// Ordered lanes: requests with the same key run one after another, in arrival order.
    lanes: Mutex<HashMap<String, mpsc::UnboundedSender<Laned>>>,
}

type Laned = (Request, CancellationToken, OwnedSemaphorePermit);

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
        let (req, token, permit) = item;
        let replied = CancellationToken::new();
        let body = run_request(&broker, &conn, req, token, replied.clone()).await;
        conn.handle.send(body).await;
        replied.cancel();
        drop(permit);
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
    let (conn_id, _counted) = broker.conn_opened();
    let framing = Arc::new(AtomicU8::new(0));
    let (tx, rx) = mpsc::unbounded_channel();
    let handle = ConnHandle {
        id: conn_id,
        tx,
        budget: Arc::new(Semaphore::new(OUTBOUND_BUDGET)),
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
                if handle_frame(&broker, &conn, bytes).await {
                    break ConnEnd::Exit;
                }
            }
        }
    };
    debug!(conn = conn_id, ?end, "connection reader done");
    match end {
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
    if end != ConnEnd::Eof {
        conn.handle.closed.cancel();
    }
    let closed = conn.handle.closed.clone();
    drop(conn);
    // Streams may still hold handles; the writer ends when they are all dropped or the
    // connection is closed.
    let _ = writer_task.await;
    closed.cancel();
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
    loop {
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
        while let Some(m) = batch.take() {
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
            break;
        }
        if buf.capacity() > 4 * 1024 * 1024 {
            buf = BytesMut::with_capacity(64 * 1024);
        }
    }
    let _ = w.shutdown().await;
}

/// Handle one frame. Returns true when the connection must close (`exit`).
async fn handle_frame(broker: &Arc<Broker>, conn: &Arc<Conn>, bytes: BytesMut) -> bool {
    match message::decode(&bytes) {
        Incoming::Single(Ok(Message::Request(req))) => {
            let permit = acquire(conn).await;
            if let Some(body) = inline(broker, conn, &req) {
                conn.handle.send(body).await;
                drop(permit);
                return false;
            }
            let token = register(conn, &req.id);
            if let Some(key) = lane_key(&req) {
                let mut lanes = conn.lanes.lock().expect("lanes lock");
                let item = (req, token, permit);
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
                let replied = CancellationToken::new();
                let body = run_request(&broker, &conn, req, token, replied.clone()).await;
                conn.handle.send(body).await;
                replied.cancel();
                drop(permit);
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
        Incoming::Batch(items) => {
            let permit = acquire(conn).await;
            let mut exit = false;
            let mut futs = Vec::new();
            let replied = CancellationToken::new();
            let mut bodies: Vec<Option<Vec<u8>>> = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Ok(Message::Request(req)) => {
                        let token = register(conn, &req.id);
                        let idx = bodies.len();
                        bodies.push(None);
                        let (broker, conn, replied) =
                            (broker.clone(), conn.clone(), replied.clone());
                        futs.push(async move {
                            (idx, run_request(&broker, &conn, req, token, replied).await)
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
            let conn2 = conn.clone();
            tokio::spawn(async move {
                for (idx, body) in futures::future::join_all(futs).await {
                    bodies[idx] = Some(body);
                }
                let bodies: Vec<Vec<u8>> = bodies.into_iter().flatten().collect();
                if !bodies.is_empty() {
                    conn2.handle.send(message::encode_batch(&bodies)).await;
                }
                replied.cancel();
                drop(permit);
            });
            exit
        }
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
    let result = match req.method.as_str() {
        methods::PING => dispatch::ping(),
        methods::STATUS => dispatch::status(broker),
        _ => return None,
    };
    Some(encode_outcome(&req.id, result))
}

fn encode_outcome(id: &Id, outcome: Result<Box<RawValue>, AbxError>) -> Vec<u8> {
    match outcome {
        Ok(v) => message::encode_response(Some(id), Ok(&v)),
        Err(e) => message::encode_response(Some(id), Err(&e.to_rpc())),
    }
}

async fn run_request(
    broker: &Arc<Broker>,
    conn: &Arc<Conn>,
    req: Request,
    token: CancellationToken,
    replied: CancellationToken,
) -> Vec<u8> {
    let _counted = broker.request_started();
    let outcome = if conn.shutting_down.load(Ordering::Relaxed) {
        Err(AbxError::new(
            ErrorCode::ShuttingDown,
            &[("method", &req.method)],
        ))
    } else {
        let cx = Cx {
            broker: broker.clone(),
            conn: conn.clone(),
            cancel: token.clone(),
            replied,
        };
        tokio::select! {
            r = dispatch::call(&cx, &req.method, req.params.as_deref()) => r,
            _ = token.cancelled() => Err(AbxError::new(ErrorCode::RequestCancelled, &[])),
        }
    };
    conn.pending.lock().expect("pending lock").remove(&req.id);
    if req.method == methods::SHUTDOWN {
        conn.shutting_down.store(true, Ordering::Relaxed);
    }
    encode_outcome(&req.id, outcome)
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
