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
//!
//! Every notification a stream holds is counted in the broker-wide budget before it is
//! queued (issue 42): the host hands it over with the pool bytes that count it
//! ([`Counted`]), and it keeps them while it waits in the stream's queue, is queued on the
//! client's connection, or is kept for an attach (a notification a dead client gave back is
//! counted again, or dropped when the budget has no room). A stream's queue holds at most
//! [`STREAM_QUEUE`] notifications and [`STREAM_BYTES`] bytes: beyond them the plugin's
//! reader waits (as it does for the budget).

use abx_core::outbound::{Delivery, Outbound, Pool, MSG_OVERHEAD};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Notifications kept for one detached exec (bytes of encoded notifications).
pub const DETACHED_BUFFER: usize = 1024 * 1024;
/// How long an exec's exit that reached no client is kept for an attach.
pub const PARK: Duration = Duration::from_secs(600);
/// Notifications queued per stream before the plugin's reader waits.
pub const STREAM_QUEUE: usize = 1024;
/// Bytes of notifications queued per stream before the plugin's reader waits (a client that
/// never reads holds at most this much of a stream here, beside its connection's budget).
pub const STREAM_BYTES: usize = 4 * 1024 * 1024;
/// How long a forwarder waits for the reply that opened its stream (or re-routed it).
const REPLY_WAIT: Duration = Duration::from_secs(10);

/// The routes of one plugin process: stream key (exec id, `watch:<id>`) -> route.
pub type Routes = Arc<Mutex<HashMap<String, Route>>>;

/// What counts a notification while a stream holds it: its bytes in the broker-wide pool,
/// and its share of the stream's queue (given back once it left the queue).
pub struct Counted {
    pool: Option<OwnedSemaphorePermit>,
    queue: Option<OwnedSemaphorePermit>,
}

impl Counted {
    /// Pool bytes for a notification of `len` bytes: `held` (what counted the line it came
    /// in), topped up from what is free now, else (`held` given back first, so nothing waits
    /// for the pool while holding some) waited for.
    pub async fn take(pool: &Pool, len: usize, held: Option<OwnedSemaphorePermit>) -> Counted {
        let need = len.saturating_add(MSG_OVERHEAD).min(pool.cap());
        let mut p = held;
        let have = p.as_ref().map_or(0, |p| p.num_permits());
        if have > need {
            if let Some(x) = p.as_mut() {
                drop(x.split(have - need));
            }
        } else if have < need {
            match pool.try_take(need - have) {
                Some(more) => match &mut p {
                    Some(x) => x.merge(more),
                    None => p = Some(more),
                },
                None => {
                    drop(p);
                    p = Some(pool.take(need).await);
                }
            }
        }
        Counted {
            pool: p,
            queue: None,
        }
    }

    /// Counted for nothing yet (a small notification the broker writes itself: its
    /// connection counts it when it is queued).
    pub fn none() -> Counted {
        Counted {
            pool: None,
            queue: None,
        }
    }
}

enum Item {
    Body(Vec<u8>, Counted),
    Exit(Vec<u8>, Counted),
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
pub struct StreamTx {
    tx: mpsc::Sender<Item>,
    /// Bytes the stream's queue may still take ([`STREAM_BYTES`]).
    room: Arc<Semaphore>,
}

impl StreamTx {
    /// Its share of the queue for a body of `len` bytes (waits while the queue is full).
    async fn queue_room(&self, len: usize) -> Option<OwnedSemaphorePermit> {
        let n = len.clamp(1, STREAM_BYTES) as u32;
        self.room.clone().acquire_many_owned(n).await.ok()
    }

    /// Pass on one notification of the stream, counted (waits while its queue is full).
    pub async fn send(&self, body: Vec<u8>, mut counted: Counted) -> Result<(), Vec<u8>> {
        counted.queue = self.queue_room(body.len()).await;
        self.tx
            .send(Item::Body(body, counted))
            .await
            .map_err(|e| match e.0 {
                Item::Body(b, _) | Item::Exit(b, _) => b,
                Item::Attach { .. } => Vec::new(),
            })
    }

    /// Pass on the stream's last notification (`exec/exit`).
    pub async fn exit(&self, body: Vec<u8>, mut counted: Counted) {
        counted.queue = self.queue_room(body.len()).await;
        let _ = self.tx.send(Item::Exit(body, counted)).await;
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
    let pool = conn.pool().clone();
    let keep = !key.starts_with("watch:");
    let fwd = Forwarder {
        key,
        id,
        routes,
        keep,
        pool,
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
        tx: StreamTx {
            tx,
            room: Arc::new(Semaphore::new(STREAM_BYTES)),
        },
        ended: false,
        id,
    }
}

/// Re-route the stream behind `tx` to `conn`, replaying what was kept once `replied` fires.
/// `None` when its forwarder is gone.
pub async fn attach(tx: &StreamTx, conn: Outbound, replied: CancellationToken) -> Option<Attached> {
    let (answer, rx) = oneshot::channel();
    tx.tx
        .send(Item::Attach {
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

/// A notification kept for an attach, and the pool bytes counting it.
type Kept = (u64, Vec<u8>, Option<OwnedSemaphorePermit>);

struct Forwarder {
    key: String,
    id: u64,
    routes: Routes,
    keep: bool,
    pool: Pool,
    conn: Option<Outbound>,
    buffer: VecDeque<Kept>,
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
                Some(Item::Body(..) | Item::Exit(..)) if self.exit_seq.is_some() => {}
                Some(Item::Body(b, counted)) => {
                    let seq = self.seq();
                    self.send(seq, b, counted.pool).await;
                }
                Some(Item::Exit(b, counted)) => {
                    let seq = self.seq();
                    self.exit_seq = Some(seq);
                    park = Some(tokio::time::Instant::now() + PARK);
                    self.send(seq, b, counted.pool).await;
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

    /// Send notification `seq` (whose memory `held` counts) to the attached connection, or
    /// keep it.
    async fn send(&mut self, seq: u64, body: Vec<u8>, held: Option<OwnedSemaphorePermit>) {
        let Some(conn) = self.conn.clone().filter(|c| !c.is_closed()) else {
            self.conn = None;
            self.keep(seq, body, held);
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
        if let Err(body) = conn.send_tracked_held(body, report, held).await {
            self.conn = None;
            self.keep(seq, body, None);
        }
    }

    /// Keep `body` (number `seq`) for the next attach, in order, within the bound, counted
    /// in the pool (`held`, else taken now: a body the pool has no room for is dropped, and
    /// counted as dropped).
    fn keep(&mut self, seq: u64, body: Vec<u8>, held: Option<OwnedSemaphorePermit>) {
        if !self.keep {
            return;
        }
        let need = body.len() + MSG_OVERHEAD;
        let held = match held {
            Some(h) if h.num_permits() >= need => Some(h),
            other => {
                drop(other);
                match self.pool.try_take_exact(need) {
                    Some(p) => Some(p),
                    None => {
                        self.dropped += body.len() as u64;
                        return;
                    }
                }
            }
        };
        self.buffered += body.len();
        let at = self.buffer.partition_point(|(n, ..)| *n < seq);
        self.buffer.insert(at, (seq, body, held));
        while self.buffered > DETACHED_BUFFER && self.buffer.len() > 1 {
            let (_, old, _) = self.buffer.pop_front().expect("non-empty");
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
            self.keep(seq, body, None);
        }
        if self.conn.is_some() {
            self.flush().await;
        }
    }

    /// Send what is kept to the attached connection, in order.
    async fn flush(&mut self) {
        while self.conn.is_some() {
            let Some((seq, body, held)) = self.buffer.pop_front() else {
                return;
            };
            self.buffered -= body.len();
            self.send(seq, body, held).await;
        }
    }
}
