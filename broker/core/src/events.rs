//! Sandbox change events: `sandbox/subscribe`, `sandbox/unsubscribe` and the
//! `sandbox/changed` notifications (docs/broker-api.md, "Events").
//!
//! One [`Events`] hub per broker. Whoever sees a sandbox change emits it here: the dispatch
//! layer after a successful `sandbox/create`, `kill`, `pause`, `resume` or `setTimeout` on
//! any provider, the `local` provider's reaper when a lifetime ends, and the plugin host
//! when a plugin reports a change of its own (the EPP/1 notification `sandbox/changed`).
//! Emitting never waits: each notification is encoded once and put on every subscriber's
//! queue.
//!
//! Each subscribed connection has its own forwarder task that moves its queue onto the
//! connection's outbound queue ([`crate::outbound::Outbound`], bounded in bytes), at most
//! [`IN_FLIGHT`] notifications at a time that the client has not read yet. A subscriber that
//! stops reading therefore holds at most [`IN_FLIGHT`] notifications on its connection (and
//! never more than the connection's byte budget) and the hub's per-subscriber bound ([`DEFAULT_QUEUE`], the daemon reads `ABX_EVENT_QUEUE`) (at most [`QUEUE_BYTES`])
//! in its own queue; beyond that the oldest queued notification is dropped
//! (counted and logged), so it never blocks an emitter, another client, or grows the
//! daemon's memory.

use crate::outbound::Outbound;
use abx_protocol::message;
use serde::Serialize;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The changes a `sandbox/changed` notification reports.
pub const CHANGES: &[&str] = &[
    "created", "killed", "paused", "resumed", "expired", "timeout",
];

/// Notifications queued on a subscriber's connection and not yet written to it.
pub const IN_FLIGHT: usize = 64;

/// Default number of notifications a subscriber's own queue holds before the oldest is
/// dropped (the daemon's `ABX_EVENT_QUEUE` overrides it).
pub const DEFAULT_QUEUE: usize = 1024;

/// Bytes a subscriber's own queue holds before the oldest is dropped (the newest is always
/// kept): a sandbox's metadata may be large, so the count alone would not bound it.
pub const QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// `sandbox/changed` params.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Changed<'a> {
    sandbox: &'a str,
    provider: &'a str,
    change: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox_info: Option<&'a Value>,
}

/// The broker-wide hub of sandbox change events (cheap to clone).
#[derive(Clone)]
pub struct Events(Arc<Hub>);

struct Hub {
    subs: Mutex<HashMap<u64, Arc<Sub>>>,
    cap: usize,
    /// The broker's sandbox index, kept up to date with every change.
    index: std::sync::OnceLock<Arc<crate::index::Index>>,
}

struct Sub {
    conn: Outbound,
    queue: Mutex<Queue>,
    wake: Notify,
    stop: CancellationToken,
    /// Held while one notification is being queued on the connection: `unsubscribe` takes
    /// it after stopping, so nothing is queued after its reply.
    sending: tokio::sync::Mutex<()>,
    in_flight: Arc<Semaphore>,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Arc<Vec<u8>>>,
    /// Bytes of `items`.
    bytes: usize,
    /// Dropped since the subscriber last caught up (logged then).
    dropped: u64,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Events({} subscribers)", self.subscribers())
    }
}

impl Default for Events {
    fn default() -> Self {
        Events::new(DEFAULT_QUEUE)
    }
}

impl Events {
    /// A hub whose subscribers queue at most `cap` notifications each.
    pub fn new(cap: usize) -> Events {
        Events(Arc::new(Hub {
            subs: Mutex::new(HashMap::new()),
            cap: cap.max(1),
            index: std::sync::OnceLock::new(),
        }))
    }

    /// Keep `index` (sandbox id -> provider) up to date with the changes emitted: created
    /// sandboxes are recorded, killed and expired ones forgotten, also those no client
    /// made or killed through the broker.
    pub fn set_index(&self, index: Arc<crate::index::Index>) {
        let _ = self.0.index.set(index);
    }

    /// Report a change of `sandbox` (the id as `sandbox/list` shows it) of `provider`.
    /// `info` is the sandbox as `sandbox/info` returns it, when known. Never waits.
    pub fn emit(&self, provider: &str, sandbox: &str, change: &str, info: Option<&Value>) {
        if let Some(ix) = self.0.index.get() {
            match change {
                "created" => ix.insert(sandbox, provider),
                // Only the provider's own entry: a bare id another provider holds stays.
                "killed" | "expired" if ix.get(sandbox).as_deref() == Some(provider) => {
                    ix.remove(sandbox)
                }
                _ => {}
            }
        }
        let subs: Vec<Arc<Sub>> = self
            .0
            .subs
            .lock()
            .expect("subscribers")
            .values()
            .cloned()
            .collect();
        debug!(
            provider,
            sandbox,
            change,
            subscribers = subs.len(),
            "sandbox changed"
        );
        if subs.is_empty() {
            return;
        }
        let body = Arc::new(message::encode_notification(
            "sandbox/changed",
            Some(&Changed {
                sandbox,
                provider,
                change,
                sandbox_info: info,
            }),
        ));
        for s in subs {
            {
                let mut q = s.queue.lock().expect("event queue");
                q.items.push_back(body.clone());
                q.bytes += body.len();
                while (q.items.len() > self.0.cap || q.bytes > QUEUE_BYTES) && q.items.len() > 1 {
                    let old = q.items.pop_front().expect("non-empty");
                    q.bytes -= old.len();
                    if q.dropped == 0 {
                        warn!(
                            conn = s.conn.id,
                            cap = self.0.cap,
                            "sandbox/changed subscriber is not reading: dropping its oldest notifications"
                        );
                    }
                    q.dropped += 1;
                }
            }
            s.wake.notify_one();
        }
    }

    /// Subscribe `conn` (idempotent). Its notifications start once `replied` fires (the
    /// reply to `sandbox/subscribe` is queued first).
    pub fn subscribe(&self, conn: Outbound, replied: CancellationToken) {
        let mut subs = self.0.subs.lock().expect("subscribers");
        if subs.contains_key(&conn.id) {
            return;
        }
        let sub = Arc::new(Sub {
            conn: conn.clone(),
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            stop: CancellationToken::new(),
            sending: tokio::sync::Mutex::new(()),
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
        });
        subs.insert(conn.id, sub.clone());
        drop(subs);
        debug!(conn = conn.id, "subscribed to sandbox changes");
        tokio::spawn(forward(Arc::downgrade(&self.0), sub, replied));
    }

    /// Unsubscribe connection `conn` (idempotent). When it returns, nothing more is queued
    /// for that connection.
    pub async fn unsubscribe(&self, conn: u64) {
        let sub = self.0.subs.lock().expect("subscribers").remove(&conn);
        if let Some(s) = sub {
            s.stop.cancel();
            let _sending = s.sending.lock().await;
            debug!(conn, "unsubscribed from sandbox changes");
        }
    }

    /// Forget a connection that is closing (no wait).
    pub fn drop_conn(&self, conn: u64) {
        let sub = self.0.subs.lock().expect("subscribers").remove(&conn);
        if let Some(s) = sub {
            s.stop.cancel();
        }
    }

    /// Subscribed connections.
    pub fn subscribers(&self) -> usize {
        self.0.subs.lock().expect("subscribers").len()
    }
}

/// Move one subscriber's queue onto its connection until it unsubscribes or goes away.
async fn forward(hub: Weak<Hub>, sub: Arc<Sub>, replied: CancellationToken) {
    let _ = tokio::time::timeout(Duration::from_secs(10), replied.cancelled()).await;
    loop {
        let next = {
            let mut q = sub.queue.lock().expect("event queue");
            let next = q.items.pop_front();
            if let Some(b) = &next {
                q.bytes -= b.len();
            }
            if next.is_none() && q.dropped > 0 {
                info!(
                    conn = sub.conn.id,
                    dropped = q.dropped,
                    "sandbox/changed subscriber caught up; notifications dropped meanwhile"
                );
                q.dropped = 0;
            }
            next
        };
        let Some(body) = next else {
            tokio::select! {
                _ = sub.wake.notified() => continue,
                _ = sub.stop.cancelled() => break,
                _ = sub.conn.closed() => break,
            }
        };
        let permit = tokio::select! {
            p = sub.in_flight.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = sub.stop.cancelled() => break,
            _ = sub.conn.closed() => break,
        };
        let _sending = sub.sending.lock().await;
        if sub.stop.is_cancelled() {
            break;
        }
        let body = Arc::try_unwrap(body).unwrap_or_else(|b| (*b).clone());
        // The permit goes back once the client has it (or cannot get it).
        let report: crate::outbound::Delivery = Box::new(move |_| drop(permit));
        if sub.conn.send_tracked(body, report, None).await.is_err() {
            break;
        }
    }
    if let Some(hub) = hub.upgrade() {
        let mut subs = hub.subs.lock().expect("subscribers");
        if subs.get(&sub.conn.id).is_some_and(|s| Arc::ptr_eq(s, &sub)) {
            subs.remove(&sub.conn.id);
        }
    }
}
