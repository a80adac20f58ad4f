//! Blocked attempts of one proxy handle: counters per host and port (bounded), and events for
//! subscribers (lossy: a slow subscriber loses the oldest and is told how many).

use std::collections::HashMap;
use std::time::SystemTime;
use tokio::sync::broadcast;

/// At most this many distinct (host, port) counters; later ones go to [`OTHER`].
pub const MAX_HOSTS: usize = 1024;

/// The host of the bucket counting every attempt past [`MAX_HOSTS`] (its port is 0).
pub const OTHER: &str = "other";

/// Events waiting for a subscriber; past this a slow subscriber loses the oldest
/// (`broadcast::error::RecvError::Lagged(n)` says how many).
pub const EVENT_QUEUE: usize = 256;

/// The counter of one blocked host and port (`sandbox/info` `network.blocked[]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedCount {
    /// The host as asked for (a normalized name, or an address), or [`OTHER`].
    pub host: String,
    /// The port asked for (0 for [`OTHER`]).
    pub port: u16,
    /// Refused attempts so far.
    pub count: u64,
    /// When the last one was refused.
    pub last: SystemTime,
}

/// One refused attempt, as the wiring turns it into `sandbox/blocked {sandbox, host, port,
/// count}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedEvent {
    /// The host as asked for (or [`OTHER`]).
    pub host: String,
    /// The port.
    pub port: u16,
    /// The counter after this attempt.
    pub count: u64,
    /// Why, in words (the 403's decision line).
    pub reason: String,
}

pub(crate) struct Blocked {
    counts: HashMap<(String, u16), (u64, SystemTime)>,
    events: broadcast::Sender<BlockedEvent>,
}

impl Blocked {
    pub(crate) fn new() -> Blocked {
        Blocked {
            counts: HashMap::new(),
            events: broadcast::channel(EVENT_QUEUE).0,
        }
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<BlockedEvent> {
        self.events.subscribe()
    }

    /// Count an attempt and announce it; returns the new count.
    pub(crate) fn record(&mut self, host: &str, port: u16, reason: &str) -> u64 {
        let now = SystemTime::now();
        let key = if self.counts.contains_key(&(host.to_string(), port))
            || self.counts.len() < MAX_HOSTS
        {
            (host.to_string(), port)
        } else {
            (OTHER.to_string(), 0)
        };
        let e = self.counts.entry(key.clone()).or_insert((0, now));
        e.0 += 1;
        e.1 = now;
        let count = e.0;
        // No subscriber is not an error: the counters still hold it.
        let _ = self.events.send(BlockedEvent {
            host: key.0,
            port: key.1,
            count,
            reason: reason.to_string(),
        });
        count
    }

    pub(crate) fn snapshot(&self) -> Vec<BlockedCount> {
        let mut v: Vec<BlockedCount> = self
            .counts
            .iter()
            .map(|((host, port), (count, last))| BlockedCount {
                host: host.clone(),
                port: *port,
                count: *count,
                last: *last,
            })
            .collect();
        v.sort_by(|a, b| {
            b.last
                .cmp(&a.last)
                .then_with(|| a.host.cmp(&b.host))
                .then(a.port.cmp(&b.port))
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_bounded_with_an_other_bucket() {
        let mut b = Blocked::new();
        let mut rx = b.subscribe();
        for i in 0..MAX_HOSTS + 10 {
            b.record(&format!("h{i}.example"), 443, "not allowed");
        }
        assert_eq!(b.record("h0.example", 443, "x"), 2);
        let s = b.snapshot();
        assert_eq!(s.len(), MAX_HOSTS + 1);
        let other = s.iter().find(|c| c.host == OTHER).unwrap();
        assert_eq!((other.port, other.count), (0, 10));
        // The subscriber lagged: it is told how many it lost, then gets the newest.
        match rx.try_recv() {
            Err(broadcast::error::TryRecvError::Lagged(n)) => assert!(n > 0),
            other => panic!("{other:?}"),
        }
        let mut last = None;
        while let Ok(e) = rx.try_recv() {
            last = Some(e);
        }
        assert_eq!(last.unwrap().count, 2);
    }
}
