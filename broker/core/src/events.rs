//! Sandbox change events: `sandbox/subscribe`, `sandbox/unsubscribe` and the
//! `sandbox/changed` notifications (docs/broker-api.md, "Events").
//!
//! One [`Events`] hub per broker. Whoever sees a sandbox change emits it here: the dispatch
//! layer after a successful `sandbox/create`, `kill`, `pause`, `resume` or `setTimeout` on
//! any provider, the `local` provider's reaper when a lifetime ends, and the plugin host
//! when a plugin reports a change of its own (the EPP/1 notification `sandbox/changed`).
//! Emitting never waits: each notification is encoded once and that one copy is shared by
//! every subscriber's queue and connection (issue 42: it was copied per subscriber, and 2000
//! subscribers that never read with one sandbox of 1 MB of metadata took the daemon down).
//! Its bytes are counted once in the broker-wide budget ([`crate::outbound::Pool`]) before
//! it is encoded, and given back when the last subscriber is done with it. When the budget
//! has no room for it, the notification goes without its `sandboxInfo` (logged); one too
//! large to be counted at all, too.
//!
//! Each subscribed connection has its own forwarder task that moves its queue onto the
//! connection's outbound queue ([`crate::outbound::Outbound`], bounded in bytes), at most
//! [`IN_FLIGHT`] notifications at a time that the client has not read yet. A subscriber that
//! stops reading therefore holds at most [`IN_FLIGHT`] notifications on its connection (and
//! never more than the connection's byte budget) and the hub's per-subscriber bound ([`DEFAULT_QUEUE`], the daemon reads `ABX_EVENT_QUEUE`) (at most [`QUEUE_BYTES`])
//! in its own queue; beyond that the oldest queued notification is dropped
//! (counted and logged), so it never blocks an emitter, another client, or grows the
//! daemon's memory.

use crate::outbound::{Outbound, Pool};
use abx_protocol::message;
use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;
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

/// `sandbox/changed` params (without `sandboxInfo`, written after them).
#[derive(Serialize)]
struct Changed<'a> {
    sandbox: &'a str,
    provider: &'a str,
    change: &'a str,
}

/// A sandbox's `sandbox/info` object, as whoever reports a change has it.
#[derive(Clone, Copy)]
pub enum Info<'a> {
    /// A tree (the builtin provider's).
    Value(&'a Value),
    /// Raw text, passed on as it is.
    Raw(&'a RawValue),
    /// Raw text of an object whose `provider` member the hub sets (a plugin's report: it
    /// cannot speak for another provider).
    Tagged(&'a RawValue),
}

/// One encoded notification, shared by every subscriber; its pool bytes go back when the
/// last of them drops it.
struct Shared {
    body: Vec<u8>,
    _counted: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

/// The broker-wide hub of sandbox change events (cheap to clone).
#[derive(Clone)]
pub struct Events(Arc<Hub>);

struct Hub {
    subs: Mutex<HashMap<u64, Arc<Sub>>>,
    cap: usize,
    /// The broker's sandbox index, kept up to date with every change.
    index: std::sync::OnceLock<Arc<crate::index::Index>>,
    /// The broker's command logs: a killed or expired sandbox's goes.
    cmdlog: std::sync::OnceLock<Arc<crate::cmdlog::CmdLog>>,
    /// The broker-wide budget the notifications are counted in (set by the broker; a hub
    /// without one counts in a pool of its own).
    pool: std::sync::OnceLock<Pool>,
    /// Notifications emitted without their `sandboxInfo` because the budget had no room.
    stripped: std::sync::atomic::AtomicU64,
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
    items: VecDeque<Bytes>,
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
            cmdlog: std::sync::OnceLock::new(),
            pool: std::sync::OnceLock::new(),
            stripped: Default::default(),
        }))
    }

    /// Count notifications in `pool` (the broker-wide budget; the broker sets it once).
    pub fn set_pool(&self, pool: Pool) {
        let _ = self.0.pool.set(pool);
    }

    /// The budget notifications are counted in (plugin hosts read their lines into it too).
    pub fn pool(&self) -> Pool {
        self.0
            .pool
            .get_or_init(|| Pool::new(crate::outbound::DEFAULT_POOL))
            .clone()
    }

    /// Notifications that went without their `sandboxInfo` (the budget had no room).
    pub fn stripped(&self) -> u64 {
        self.0.stripped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keep `index` (sandbox id -> provider) up to date with the changes emitted: created
    /// sandboxes are recorded, killed and expired ones forgotten, also those no client
    /// made or killed through the broker.
    pub fn set_index(&self, index: Arc<crate::index::Index>) {
        let _ = self.0.index.set(index);
    }

    /// Remove the command log (`sandbox/log`) of a sandbox killed or expired.
    pub fn set_cmdlog(&self, log: Arc<crate::cmdlog::CmdLog>) {
        let _ = self.0.cmdlog.set(log);
    }

    /// Report a change of `sandbox` (the id as `sandbox/list` shows it) of `provider`.
    /// `info` is the sandbox as `sandbox/info` returns it, when known. Never waits.
    pub fn emit(&self, provider: &str, sandbox: &str, change: &str, info: Option<&Value>) {
        self.emit_info(provider, sandbox, change, info.map(Info::Value))
    }

    /// [`Events::emit`] with the sandbox's info in any form (raw text is passed on without a
    /// tree of it).
    pub fn emit_info(&self, provider: &str, sandbox: &str, change: &str, info: Option<Info<'_>>) {
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
        if let (Some(log), "killed" | "expired") = (self.0.cmdlog.get(), change) {
            log.remove(provider, sandbox);
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
        let Some(body) = self.encode(provider, sandbox, change, info) else {
            return;
        };
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

    /// Report a connection of `sandbox` refused by its network policy (`sandbox/blocked
    /// {sandbox, provider, host, port, count}`, issue 44) to the subscribers only (the
    /// index and the command logs do not change). Never waits; dropped, logged, when the
    /// budget has no room for it.
    pub fn emit_blocked(&self, provider: &str, sandbox: &str, host: &str, port: u16, count: u64) {
        #[derive(Serialize)]
        struct Blocked<'a> {
            sandbox: &'a str,
            provider: &'a str,
            host: &'a str,
            port: u16,
            count: u64,
        }
        let subs: Vec<Arc<Sub>> = self
            .0
            .subs
            .lock()
            .expect("subscribers")
            .values()
            .cloned()
            .collect();
        if subs.is_empty() {
            return;
        }
        let params = Blocked {
            sandbox,
            provider,
            host,
            port,
            count,
        };
        let len = 160 + 6 * (sandbox.len() + provider.len() + host.len());
        let Some(mut counted) = self.pool().try_take_exact(len) else {
            warn!(
                provider,
                sandbox, "sandbox/blocked dropped: the memory budget is full"
            );
            return;
        };
        let mut body = message::encode_notification_with("sandbox/blocked", len, |out| {
            serde_json::to_writer(&mut *out, &params).expect("strings serialize");
        });
        body.shrink_to_fit();
        let keep = body.len().max(1);
        if counted.num_permits() > keep {
            drop(counted.split(counted.num_permits() - keep));
        }
        let body = Bytes::from_owner(Shared {
            body,
            _counted: Some(counted),
        });
        for s in subs {
            {
                let mut q = s.queue.lock().expect("event queue");
                q.items.push_back(body.clone());
                q.bytes += body.len();
                while (q.items.len() > self.0.cap || q.bytes > QUEUE_BYTES) && q.items.len() > 1 {
                    let old = q.items.pop_front().expect("non-empty");
                    q.bytes -= old.len();
                    q.dropped += 1;
                }
            }
            s.wake.notify_one();
        }
    }

    /// The one copy of a notification every subscriber shares, its bytes counted in the
    /// budget before it is written (without `sandboxInfo` when the budget has no room for
    /// it; `None`, logged, when it has none even for that).
    fn encode(
        &self,
        provider: &str,
        sandbox: &str,
        change: &str,
        info: Option<Info<'_>>,
    ) -> Option<Bytes> {
        let pool = self.pool();
        let head = Changed {
            sandbox,
            provider,
            change,
        };
        let head_len = 128 + 6 * (sandbox.len() + provider.len() + change.len());
        let info_len = match info {
            None => 0,
            Some(Info::Value(v)) => json_len(v),
            Some(Info::Raw(r)) => r.get().len(),
            Some(Info::Tagged(r)) => r.get().len() + 16 + 6 * provider.len(),
        } + 16;
        let (info, counted) = match pool.try_take_exact(head_len + info_len) {
            Some(p) => (info, p),
            None => {
                self.0
                    .stripped
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                warn!(
                    provider,
                    sandbox,
                    change,
                    bytes = head_len + info_len,
                    "sandbox/changed sent without its sandboxInfo: the memory budget has no room for it"
                );
                match pool.try_take_exact(head_len) {
                    Some(p) => (None, p),
                    None => {
                        warn!(
                            provider,
                            sandbox, change, "sandbox/changed dropped: the memory budget is full"
                        );
                        return None;
                    }
                }
            }
        };
        let mut body =
            message::encode_notification_with("sandbox/changed", head_len + info_len, |out| {
                serde_json::to_writer(&mut *out, &head).expect("strings serialize");
                let Some(info) = info else { return };
                // Reopen the object for `sandboxInfo`.
                out.pop();
                out.extend_from_slice(br#","sandboxInfo":"#);
                match info {
                    Info::Value(v) => {
                        serde_json::to_writer(&mut *out, v).expect("a Value serializes")
                    }
                    Info::Raw(r) => out.extend_from_slice(r.get().as_bytes()),
                    Info::Tagged(r) => {
                        let id = serde_json::to_string(provider).expect("a string serializes");
                        if message::write_object_with(out, r.get(), "provider", &id).is_err() {
                            out.extend_from_slice(b"null");
                        }
                    }
                }
                out.push(b'}');
            });
        body.shrink_to_fit();
        let mut counted = counted;
        let keep = body.len().max(1);
        if counted.num_permits() > keep {
            drop(counted.split(counted.num_permits() - keep));
        }
        Some(Bytes::from_owner(Shared {
            body,
            _counted: Some(counted),
        }))
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
        // The one shared copy (never a copy per subscriber); the permit goes back once the
        // client has it (or cannot get it).
        let done: crate::outbound::Done = Box::new(move |_| drop(permit));
        if !sub.conn.send_shared(body, done).await {
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

/// Bytes `v` takes as JSON (written to nowhere).
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::Pool;

    /// One notification for a thousand subscribers that never read is one copy, counted once
    /// in the budget (it was a copy per subscriber, made before the budget was asked); it
    /// goes back once the last of them is done with it. A notification the budget has no
    /// room for goes without its info; then, with no room at all, not at all.
    #[tokio::test]
    async fn one_copy_for_every_subscriber_counted_once() {
        let pool = Pool::new(64 << 20);
        let hub = Events::new(16);
        hub.set_pool(pool.clone());
        let mut queues = Vec::new();
        for id in 0..1000 {
            let (out, rx) = Outbound::new(id, pool.clone(), None);
            let replied = CancellationToken::new();
            replied.cancel();
            hub.subscribe(out, replied);
            queues.push(rx);
        }
        let info = serde_json::json!({"id": "s1", "metadata": {"blob": "m".repeat(1 << 20)}});
        hub.emit("local", "s1", "created", Some(&info));
        for rx in queues.iter_mut() {
            let m = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
                .await
                .expect("queued")
                .expect("a message");
            assert!(m.body.len() > 1 << 20);
            std::mem::forget(m);
        }
        let used = pool.cap() - pool.available();
        assert!(
            ((1 << 20)..(2 << 20)).contains(&used),
            "one copy counted once, not one per subscriber: {used} bytes"
        );
        // With the budget held by someone else: without its info, then not at all.
        let hog = pool.try_take(pool.available() - 1024).unwrap();
        hub.emit("local", "s2", "created", Some(&info));
        assert_eq!(hub.stripped(), 1);
        let rest = pool.try_take(pool.available()).unwrap();
        hub.emit("local", "s3", "created", Some(&info));
        assert_eq!(hub.stripped(), 2);
        drop((hog, rest));
        let m = queues[0].recv().await.expect("the stripped one");
        let v: Value = serde_json::from_slice(&m.body).unwrap();
        assert_eq!(v["params"]["sandbox"], "s2");
        assert!(v["params"].get("sandboxInfo").is_none(), "{v}");
    }
}
