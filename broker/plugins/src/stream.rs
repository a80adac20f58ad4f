//! A plugin stream's route to its client: the notifications of one exec (or watch) of a
//! plugin, in order, to the connection that owns it, and kept for `exec/attach` while
//! no client receives them, as the builtin `local` provider keeps its own
//! (`abx_local::exec`).
//!
//! One forwarder task per stream. It waits until the owner has the reply that opened the
//! stream, then sends each notification to the owner's connection, tracked: one the client
//! never received (it died; the broker finds out when a write fails, and everything still
//! queued for it comes back) is kept, in order. While no client is attached an exec's
//! notifications are kept in a buffer of at most [`DETACHED_BUFFER`] bytes, the oldest
//! dropped and counted (`droppedBytes` of the next attach). The `exec/exit` is kept too:
//! after it the route stays (parked) until the exit has reached a client, or for
//! [`PARK`] at most. `exec/attach` from any connection re-routes the stream to that
//! connection and replays what was kept, after the attach's reply. Watches are not kept
//! (nothing re-attaches a watch): their notifications for a dead client are dropped.

use abx_core::outbound::{Delivery, Outbound};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Notifications kept for one detached exec (bytes of encoded notifications).
pub const DETACHED_BUFFER: usize = 1024 * 1024;
/// How long an exec's exit that reached no client is kept for an attach.
pub const PARK: Duration = Duration::from_secs(600);
/// Notifications queued per stream before the plugin's reader waits.
const STREAM_QUEUE: usize = 1024;
/// How long a forwarder waits for the reply that opened its stream (or re-routed it).
const REPLY_WAIT: Duration = Duration::from_secs(10);

/// The routes of one plugin process: stream key (exec id, `watch:<id>`) -> route.
pub type Routes = Arc<Mutex<HashMap<String, Route>>>;

enum Item {
    Body(Vec<u8>),
    Exit(Vec<u8>),
    Attach {
        conn: Outbound,
        replied: CancellationToken,
        answer: oneshot::Sender<Attached>,
    },
}

/// What an attach found.
pub struct Attached {
    /// Notifications replayed (the exit included, when it was kept).
    pub replayed: usize,
    /// Bytes of notifications dropped since the last attach (the buffer was full).
    pub dropped_bytes: u64,
    /// The exec has not sent its `exec/exit` yet.
    pub running: bool,
}

/// The sending side of a stream's forwarder.
#[derive(Clone)]
pub struct StreamTx(mpsc::Sender<Item>);

impl StreamTx {
    /// Pass on one notification of the stream (waits while its queue is full).
    pub async fn send(&self, body: Vec<u8>) -> Result<(), Vec<u8>> {
        self.0.send(Item::Body(body)).await.map_err(|e| match e.0 {
            Item::Body(b) | Item::Exit(b) => b,
            Item::Attach { .. } => Vec::new(),
        })
    }

    /// Pass on the stream's last notification (`exec/exit`).
    pub async fn exit(&self, body: Vec<u8>) {
        let _ = self.0.send(Item::Exit(body)).await;
    }
}

/// One stream's route.
pub struct Route {
    /// Its forwarder.
    pub tx: StreamTx,
    /// Its `exec/exit` has passed (the route is parked until the exit reached a client).
    pub ended: bool,
    id: u64,
}

static ROUTE_IDS: AtomicU64 = AtomicU64::new(1);

/// Start the forwarder of stream `key`, owned by `conn`, whose first notification goes out
/// once `replied` fires. It takes its route out of `routes` when the stream is over.
pub fn spawn(
    key: String,
    conn: Outbound,
    replied: Option<CancellationToken>,
    routes: Routes,
) -> Route {
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    let id = ROUTE_IDS.fetch_add(1, Ordering::Relaxed);
    let keep = !key.starts_with("watch:");
    let fwd = Forwarder {
        key,
        id,
        routes,
        keep,
        conn: Some(conn),
        buffer: VecDeque::new(),
        buffered: 0,
        dropped: 0,
        next: 0,
        exit_seq: None,
        shared: Arc::new(Shared::default()),
    };
    tokio::spawn(fwd.run(rx, replied));
    Route {
        tx: StreamTx(tx),
        ended: false,
        id,
    }
}

/// Re-route the stream behind `tx` to `conn`, replaying what was kept once `replied` fires.
/// `None` when its forwarder is gone.
pub async fn attach(tx: &StreamTx, conn: Outbound, replied: CancellationToken) -> Option<Attached> {
    let (answer, rx) = oneshot::channel();
    tx.0.send(Item::Attach {
        conn,
        replied,
        answer,
    })
    .await
    .ok()?;
    rx.await.ok()
}

/// What delivery reports tell the forwarder.
#[derive(Default)]
struct Shared {
    /// Notifications a client did not receive: (seq, connection id, body).
    returned: Mutex<Vec<(u64, u64, Vec<u8>)>>,
    exit_delivered: AtomicBool,
    wake: Notify,
}

struct Forwarder {
    key: String,
    id: u64,
    routes: Routes,
    keep: bool,
    conn: Option<Outbound>,
    buffer: VecDeque<(u64, Vec<u8>)>,
    buffered: usize,
    dropped: u64,
    next: u64,
    exit_seq: Option<u64>,
    shared: Arc<Shared>,
}

impl Forwarder {
    async fn run(mut self, mut rx: mpsc::Receiver<Item>, replied: Option<CancellationToken>) {
        if let Some(r) = replied {
            let _ = tokio::time::timeout(REPLY_WAIT, r.cancelled()).await;
        }
        let mut park: Option<tokio::time::Instant> = None;
        loop {
            self.merge_returned().await;
            if self.exit_seq.is_some() && self.shared.exit_delivered.load(Ordering::Acquire) {
                break;
            }
            let parked = async {
                match park {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let item = tokio::select! {
                it = rx.recv() => it,
                _ = self.shared.wake.notified() => continue,
                _ = parked => {
                    debug!(stream = %self.key, "no attach for a detached exec's exit; dropped");
                    break;
                }
            };
            match item {
                // The route is gone (the plugin ended): nothing can attach any more.
                None => break,
                // Exactly one exec/exit: nothing after it (the crash notice of a plugin that
                // died while the exit was parked included).
                Some(Item::Body(_) | Item::Exit(_)) if self.exit_seq.is_some() => {}
                Some(Item::Body(b)) => {
                    let seq = self.seq();
                    self.send(seq, b).await;
                }
                Some(Item::Exit(b)) => {
                    let seq = self.seq();
                    self.exit_seq = Some(seq);
                    park = Some(tokio::time::Instant::now() + PARK);
                    self.send(seq, b).await;
                }
                Some(Item::Attach {
                    conn,
                    replied,
                    answer,
                }) => {
                    self.merge_returned().await;
                    let _ = answer.send(Attached {
                        replayed: self.buffer.len(),
                        dropped_bytes: std::mem::take(&mut self.dropped),
                        running: self.exit_seq.is_none(),
                    });
                    debug!(stream = %self.key, conn = conn.id, replay = self.buffer.len(), "stream attached");
                    self.conn = Some(conn);
                    let _ = tokio::time::timeout(REPLY_WAIT, replied.cancelled()).await;
                    self.flush().await;
                }
            }
        }
        let mut routes = self.routes.lock().expect("routes");
        if routes.get(&self.key).is_some_and(|r| r.id == self.id) {
            routes.remove(&self.key);
        }
    }

    fn seq(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }

    /// Send notification `seq` to the attached connection, or keep it.
    async fn send(&mut self, seq: u64, body: Vec<u8>) {
        let Some(conn) = self.conn.clone().filter(|c| !c.is_closed()) else {
            self.conn = None;
            self.keep(seq, body);
            return;
        };
        let shared = self.shared.clone();
        let is_exit = self.exit_seq == Some(seq);
        let conn_id = conn.id;
        let report: Delivery = Box::new(move |r| {
            match r {
                Ok(()) if is_exit => shared.exit_delivered.store(true, Ordering::Release),
                Ok(()) => return,
                Err(body) => shared
                    .returned
                    .lock()
                    .expect("returned")
                    .push((seq, conn_id, body)),
            }
            shared.wake.notify_one();
        });
        if let Err(body) = conn.send_tracked(body, report, None).await {
            self.conn = None;
            self.keep(seq, body);
        }
    }

    /// Keep `body` (number `seq`) for the next attach, in order, within the bound.
    fn keep(&mut self, seq: u64, body: Vec<u8>) {
        if !self.keep {
            return;
        }
        self.buffered += body.len();
        let at = self.buffer.partition_point(|(n, _)| *n < seq);
        self.buffer.insert(at, (seq, body));
        while self.buffered > DETACHED_BUFFER && self.buffer.len() > 1 {
            let (_, old) = self.buffer.pop_front().expect("non-empty");
            self.buffered -= old.len();
            self.dropped += old.len() as u64;
        }
    }

    /// Take back what a client did not receive: that client is gone, so the stream is
    /// detached from it (and what it missed goes to the client attached since, if any).
    async fn merge_returned(&mut self) {
        let back = std::mem::take(&mut *self.shared.returned.lock().expect("returned"));
        if back.is_empty() {
            return;
        }
        for (seq, conn_id, body) in back {
            if self.conn.as_ref().is_some_and(|c| c.id == conn_id) {
                debug!(stream = %self.key, conn = conn_id, "stream owner gone; keeping its notifications");
                self.conn = None;
            }
            self.keep(seq, body);
        }
        if self.conn.is_some() {
            self.flush().await;
        }
    }

    /// Send what is kept to the attached connection, in order.
    async fn flush(&mut self) {
        while self.conn.is_some() {
            let Some((seq, body)) = self.buffer.pop_front() else {
                return;
            };
            self.buffered -= body.len();
            self.send(seq, body).await;
        }
    }
}
