//! Ready sandboxes (issue 48): a small pool of sandboxes built ahead of any request, so
//! that `sandbox/create` hands one out instead of building it while the client waits.
//!
//! A pooled sandbox is a whole sandbox of its own, never a used one: its own id (so its
//! own hostname), directory, namespaces, cgroup and init, built for a [`Shape`] (network
//! mode and limits; the `base` template, no mounts, no network policy) and given out at
//! most once. What differs per create (lifetime, env, metadata) is set when it is taken.
//! The pool here is the bookkeeping only (which sandboxes are ready, for which shapes,
//! which shape to build next, the counters); building and tearing down is the provider's
//! (`sandboxes.rs`). Invariants: a sandbox taken is never in the pool again; a pooled
//! sandbox is in no table the API lists (`sandbox/list`, events, the cap on live
//! sandboxes), but its process limit counts in the process budget ([`Pool::pids`]).

use super::limits::Limits;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// How many recent creates are remembered to tell which shapes are asked for.
const RECENT: usize = 8;

/// What a pooled sandbox is built for: a create with the same network mode and limits
/// (already resolved against the defaults), no template other than `base`, no mounts and
/// no network policy takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub network: String,
    pub limits: Limits,
}

impl Shape {
    /// Its process limit (what it counts for in the process budget).
    pub fn pids(&self, default: u64) -> u64 {
        self.limits.pids.unwrap_or(default)
    }
}

struct Ready<T> {
    shape: Shape,
    pids: u64,
    item: T,
}

struct State<T> {
    ready: VecDeque<Ready<T>>,
    /// The shapes of the last creates that a pooled sandbox could have served, newest last.
    recent: VecDeque<Shape>,
    /// Shut down: nothing more goes in.
    closed: bool,
}

/// The pool: at most `size` ready sandboxes (0: off).
pub struct Pool<T> {
    size: usize,
    default: Mutex<Option<Shape>>,
    state: Mutex<State<T>>,
    /// A refill is under way (one at a time).
    filling: AtomicBool,
    /// A create came since the refill last looked.
    poked: AtomicBool,
    /// Creates served from the pool, and those that found none of their shape.
    served: AtomicU64,
    missed: AtomicU64,
    /// Sandboxes built for the pool, and those thrown away unused (evicted, shut down).
    built: AtomicU64,
    discarded: AtomicU64,
}

impl<T> Pool<T> {
    pub fn new(size: usize) -> Pool<T> {
        Pool {
            size,
            default: Mutex::new(None),
            state: Mutex::new(State {
                ready: VecDeque::new(),
                recent: VecDeque::new(),
                closed: false,
            }),
            filling: AtomicBool::new(false),
            poked: AtomicBool::new(false),
            served: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            built: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
        }
    }

    /// Whether the pool is on (`[local] pool` above 0).
    pub fn on(&self) -> bool {
        self.size > 0
    }

    /// The shape of a create without network or limits (the config's defaults).
    pub fn set_default(&self, shape: Shape) {
        *self.default.lock().expect("pool") = Some(shape);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().expect("pool")
    }

    /// A ready sandbox of `shape`, taken out (the oldest); the ask is remembered either way.
    pub fn take(&self, shape: &Shape) -> Option<T> {
        if !self.on() {
            return None;
        }
        let mut s = self.lock();
        s.recent.push_back(shape.clone());
        if s.recent.len() > RECENT {
            s.recent.pop_front();
        }
        let at = s.ready.iter().position(|r| &r.shape == shape);
        match at.and_then(|i| s.ready.remove(i)) {
            Some(r) => {
                self.served.fetch_add(1, Ordering::Relaxed);
                Some(r.item)
            }
            None => {
                self.missed.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Whether sandboxes of `shape` are kept ready: the default shape, and a shape asked
    /// for at least twice among the last creates (a one-off shape costs nothing idle).
    fn wanted(&self, s: &State<T>, shape: &Shape) -> bool {
        self.default.lock().expect("pool").as_ref() == Some(shape)
            || s.recent.iter().filter(|r| *r == shape).count() >= 2
    }

    /// The shape to build next, or `None` when the pool is as it should be. The most
    /// recently asked shape that is wanted comes first; when the pool is full with none of
    /// it, the oldest sandbox of another shape is handed back to make room (the caller
    /// tears it down).
    pub fn next(&self) -> Option<(Shape, Option<T>)> {
        if !self.on() {
            return None;
        }
        let mut s = self.lock();
        if s.closed {
            return None;
        }
        let default = self.default.lock().expect("pool").clone();
        let target = s
            .recent
            .iter()
            .rev()
            .find(|r| self.wanted(&s, r))
            .cloned()
            .or(default)?;
        if s.ready.len() < self.size {
            return Some((target, None));
        }
        if s.ready.iter().any(|r| r.shape == target) {
            return None;
        }
        let evicted = s.ready.pop_front().map(|r| r.item);
        self.discarded.fetch_add(1, Ordering::Relaxed);
        Some((target, evicted))
    }

    /// Put a sandbox built for `shape` in the pool: given back when the pool was shut down
    /// meanwhile (the caller tears it down).
    pub fn put(&self, shape: Shape, pids: u64, item: T) -> Result<(), T> {
        let mut s = self.lock();
        if s.closed || s.ready.len() >= self.size {
            self.discarded.fetch_add(1, Ordering::Relaxed);
            return Err(item);
        }
        self.built.fetch_add(1, Ordering::Relaxed);
        s.ready.push_back(Ready { shape, pids, item });
        Ok(())
    }

    /// The process limits of the pooled sandboxes, added up (they count in the budget).
    pub fn pids(&self) -> u64 {
        self.lock()
            .ready
            .iter()
            .map(|r| r.pids)
            .fold(0, u64::saturating_add)
    }

    /// Every pooled sandbox, taken out (to make room in the budget, or at shutdown with
    /// `close`: nothing goes in afterwards).
    pub fn drain(&self, close: bool) -> Vec<T> {
        let mut s = self.lock();
        s.closed |= close;
        let n = s.ready.len() as u64;
        self.discarded.fetch_add(n, Ordering::Relaxed);
        s.ready.drain(..).map(|r| r.item).collect()
    }

    /// Claim the refill: `false` when one is already under way.
    pub fn begin_fill(&self) -> bool {
        self.on()
            && !self.lock().closed
            && self
                .filling
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    pub fn end_fill(&self) {
        self.filling.store(false, Ordering::Release);
    }

    /// Whether a refill is under way.
    pub fn filling(&self) -> bool {
        self.filling.load(Ordering::Acquire)
    }

    /// A create came: the refill (under way or next) looks again.
    pub fn poke(&self) {
        self.poked.store(true, Ordering::Release);
    }

    pub fn unpoke(&self) {
        self.poked.store(false, Ordering::Release);
    }

    pub fn poked(&self) -> bool {
        self.poked.load(Ordering::Acquire)
    }

    /// What `provider/info` says of the pool.
    pub fn view(&self) -> Value {
        let s = self.lock();
        json!({
            "size": self.size,
            "ready": s.ready.len(),
            "served": self.served.load(Ordering::Relaxed),
            "missed": self.missed.load(Ordering::Relaxed),
            "built": self.built.load(Ordering::Relaxed),
            "discarded": self.discarded.load(Ordering::Relaxed),
            "filling": self.filling(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(pids: u64) -> Shape {
        Shape {
            network: "none".into(),
            limits: Limits {
                pids: Some(pids),
                ..Limits::default()
            },
        }
    }

    #[test]
    fn the_default_shape_is_built_until_full_and_taken_once() {
        let p: Pool<u32> = Pool::new(2);
        p.set_default(shape(64));
        assert_eq!(
            p.next().map(|(s, e)| (s, e.is_none())),
            Some((shape(64), true))
        );
        p.put(shape(64), 64, 1).unwrap();
        p.put(shape(64), 64, 2).unwrap();
        assert!(p.next().is_none(), "full");
        assert_eq!(p.pids(), 128);
        assert_eq!(p.take(&shape(64)), Some(1));
        assert_eq!(p.take(&shape(64)), Some(2));
        assert_eq!(p.take(&shape(64)), None);
        assert_eq!(p.pids(), 0);
        assert_eq!(p.view()["served"], 2);
        assert_eq!(p.view()["missed"], 1);
    }

    #[test]
    fn a_shape_asked_twice_is_pooled_and_makes_room() {
        let p: Pool<u32> = Pool::new(2);
        p.set_default(shape(64));
        p.put(shape(64), 64, 1).unwrap();
        p.put(shape(64), 64, 2).unwrap();
        assert_eq!(p.take(&shape(40)), None);
        assert!(p.next().is_none(), "a one-off shape is not pooled");
        assert_eq!(p.take(&shape(40)), None);
        let (s, evicted) = p.next().unwrap();
        assert_eq!((s, evicted), (shape(40), Some(1)));
    }

    #[test]
    fn off_and_closed_pools_hold_nothing() {
        let p: Pool<u32> = Pool::new(0);
        p.set_default(shape(64));
        assert!(p.next().is_none());
        assert!(!p.begin_fill());
        let p: Pool<u32> = Pool::new(2);
        p.set_default(shape(64));
        p.put(shape(64), 64, 1).unwrap();
        assert_eq!(p.drain(true), vec![1]);
        assert_eq!(p.put(shape(64), 64, 2), Err(2));
        assert!(p.next().is_none());
    }
}
