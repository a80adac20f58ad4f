//! The calls in flight to one plugin and their deadlines: the map of pending calls (keyed by
//! the host's own counter, hashed by one multiplication), the reply budget each call lends
//! the reader, and the sweeper, one task per running plugin that fails calls past their
//! deadline (E8008) instead of a timer per call.

use abx_core::outbound::{Hold, Outbound};
use abx_protocol::message;
use abx_protocol::{AbxError, ErrorCode};
use serde_json::json;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

pub(super) type ReplyTx = oneshot::Sender<Result<Box<RawValue>, AbxError>>;

pub(super) struct Pending {
    pub(super) method: String,
    pub(super) reply: ReplyTx,
    /// The budget the call's request reserved for its reply, lent while the plugin answers:
    /// the reader reads the reply (or, with the pool full, another line) into it.
    pub(super) counted: Lent,
    pub(super) conn: Option<Outbound>,
    pub(super) replied: Option<CancellationToken>,
    /// When the call fails E8008 if unanswered, and its time limit (for the message);
    /// None for the handshake, which has its own.
    pub(super) deadline: Option<(Instant, Duration)>,
}

/// A call's reply budget, lent to the reader (see [`Pending::counted`]).
#[derive(Default)]
pub(super) struct Lent {
    /// What is left of it (the reader may have used some for a line).
    pub(super) permit: Option<OwnedSemaphorePermit>,
    /// Where the reply's budget goes with the reply: the request's hold, so its reply is
    /// queued against the bytes the line was read into.
    pub(super) back: Option<Hold>,
}

/// How long the sweeper stays awake with no call in flight before it parks until the next
/// call (at most the plugin's call timeout, so a call with that timeout made in the linger
/// does not wake it): calls made back to back, each answered before the next is sent, then
/// cost it no wakeup, instead of one each.
pub(super) const SWEEP_LINGER: Duration = Duration::from_secs(5);

/// The longest the daemon waits for a plugin's answer, whatever time limit a call asks for
/// (`exec/run`'s `timeout` comes from the client): a year.
pub const MAX_CALL_WAIT: Duration = Duration::from_secs(366 * 86_400);

/// The sweeper's side of a running plugin. One task per plugin fails calls past their
/// deadline instead of a timer per call. It sleeps until the earliest deadline in flight
/// (`target`), and a new call wakes it only when its own deadline comes sooner, which is
/// rare since most calls share the plugin's time limit: a call registers no timer.
pub(super) struct Sweep {
    /// Milliseconds after `epoch` the sweeper sleeps until; `u64::MAX` while parked.
    /// Stored with the pending map locked, so a call inserted after a scan sees the
    /// target that scan set.
    pub(super) target: std::sync::atomic::AtomicU64,
    pub(super) epoch: Instant,
    pub(super) wake: tokio::sync::Notify,
    /// Times the sweeper woke, and times it scanned the calls in flight (tests hold both
    /// down with these).
    pub(super) wakes: std::sync::atomic::AtomicU64,
    pub(super) scans: std::sync::atomic::AtomicU64,
}

impl Default for Sweep {
    fn default() -> Self {
        Sweep {
            target: std::sync::atomic::AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            wake: tokio::sync::Notify::new(),
            wakes: Default::default(),
            scans: Default::default(),
        }
    }
}

impl Sweep {
    /// `at` in milliseconds after the epoch, rounded up (a wake at it is not early).
    pub(super) fn ms(&self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.epoch);
        u64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u64::MAX - 1)
    }
}

/// client's or the plugin's choice). Hashed by one multiplication rather than SipHash, which
/// every call paid for twice (issue 25): keys nobody else picks need no defence against
/// collisions.
pub(super) type Calls = HashMap<i64, Pending, std::hash::BuildHasherDefault<CounterHasher>>;

/// A hasher for counter keys (see [`Calls`]): the key times a 64-bit odd constant, so that
/// consecutive keys differ in the top bits hashbrown probes with.
#[derive(Default)]
pub(super) struct CounterHasher(u64);

impl std::hash::Hasher for CounterHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_i64(&mut self, n: i64) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The `$/cancelRequest` line for the host's request `id`.
pub(super) fn cancel_line(id: i64) -> Vec<u8> {
    let mut line = message::encode_notification("$/cancelRequest", Some(&json!({"id": id})));
    line.push(b'\n');
    line
}

/// Record a call in flight (the count of calls in flight is returned); the sweeper fails
/// it E8008 past its deadline, and is woken for it only if that comes before the deadline
/// the sweeper sleeps toward. The call lowers that target itself, so the woken sweeper only
/// sleeps again, toward the new target: a stream of calls with ever shorter time limits
/// costs a wakeup each, never a scan of every call in flight.
pub(super) fn track(pending: &Mutex<Calls>, sweep: &Sweep, id: i64, call: Pending) -> usize {
    let at = call.deadline.map(|(at, _)| sweep.ms(at));
    let n = {
        let mut p = pending.lock().expect("pending");
        p.insert(id, call);
        p.len()
    };
    // After the insert: a scan that saw the map before it stored its target first (with
    // the map locked), and a scan after it sees this call.
    if let Some(at) = at {
        if sweep.target.fetch_min(at, Ordering::AcqRel) > at {
            sweep.wake.notify_one();
        }
    }
    n
}

/// Fail a running plugin's calls that are past their deadline (E8008), telling the plugin
/// to cancel each, until the plugin is gone. Between scans it sleeps until the earliest
/// deadline in flight, or `linger` when none is, then parks until a call wakes it.
pub(super) async fn sweep(
    provider: String,
    pending: Arc<Mutex<Calls>>,
    sweep: Arc<Sweep>,
    writer: mpsc::UnboundedSender<Vec<u8>>,
    dead: CancellationToken,
    linger: Duration,
) {
    let mut idle_since: Option<Instant> = None;
    loop {
        sweep.scans.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let (expired, next) = {
            let mut p = pending.lock().expect("pending");
            let mut ids = Vec::new();
            let mut next: Option<Instant> = None;
            for (id, c) in p.iter() {
                match c.deadline {
                    Some((at, _)) if at <= now => ids.push(*id),
                    Some((at, _)) => next = Some(next.map_or(at, |n| n.min(at))),
                    None => {}
                }
            }
            let expired: Vec<(i64, Pending)> = ids
                .into_iter()
                .filter_map(|id| p.remove(&id).map(|c| (id, c)))
                .collect();
            // With no call in flight, stay awake for `linger` (calls back to back then cost
            // no wakeup) before parking until a call wakes it.
            let next = if next.is_some() || !p.is_empty() {
                idle_since = None;
                next
            } else {
                let since = *idle_since.get_or_insert(now);
                if now < since + linger {
                    Some(since + linger)
                } else {
                    idle_since = None;
                    None
                }
            };
            let target = next.map_or(u64::MAX, |at| sweep.ms(at));
            sweep.target.store(target, Ordering::Release);
            (expired, next)
        };
        for (id, call) in expired {
            let _ = writer.send(cancel_line(id));
            let limit = call.deadline.map_or(0, |(_, l)| l.as_secs());
            let _ = call.reply.send(Err(AbxError::new(
                ErrorCode::PluginTimedOut,
                &[
                    ("provider", &provider),
                    ("method", &call.method),
                    ("timeout", &limit.to_string()),
                ],
            )));
        }
        // Until the target is due: a call that lowered it wakes the sweeper to sleep toward
        // the new one, with no scan.
        let mut next = next;
        loop {
            let until = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = until => {
                    sweep.wakes.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                _ = sweep.wake.notified() => {}
                _ = dead.cancelled() => return,
            }
            sweep.wakes.fetch_add(1, Ordering::Relaxed);
            let t = sweep.target.load(Ordering::Acquire);
            if let Some(at) = (t != u64::MAX)
                .then(|| sweep.epoch.checked_add(Duration::from_millis(t)))
                .flatten()
            {
                next = Some(at);
            }
        }
    }
}
