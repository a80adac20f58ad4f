//! Waiting for a fast plugin's reply without going to sleep.
//!
//! A call to a plugin is a write to its stdin and, a little later, a line on its stdout.
//! When the daemon's thread sleeps in between, the reply has to wake it; with the plugin
//! on another CPU that wakeup crosses CPUs, and an idle CPU (on a virtual machine above
//! all) takes tens of microseconds to come back: on the 2-vCPU machines we measure on, a
//! plugin hop then costs more in wakeups than in work (docs/performance.md, issue 25).
//!
//! So after sending a call, the host may poll the plugin's stdout for a short while
//! ([`Pace::budget`]) before it lets its task wait: a reply that comes within the budget
//! is then read by a thread that never slept. The budget is learned per plugin:
//!
//! - only for plugins whose recent replies came within [`SPIN_LIMIT`] (a moving average of
//!   their latency; one slow call counts as at most [`SAMPLE_CAP`], so a long `exec/run`
//!   does not turn it off for the fast calls after it), twice that average, within
//!   [`SPIN_MIN`]..=[`SPIN_MAX`];
//! - never before a first reply was timed, never on one CPU (the plugin could not run
//!   while the daemon polls), and by one thread of the daemon at a time ([`Spinner`]);
//! - each round of the loop yields the CPU (`sched_yield`), so a plugin woken on the
//!   polling thread's own CPU runs at once.
//!
//! A plugin that answers in milliseconds (a remote server behind it) is never polled for,
//! so it costs nothing; one that answers in microseconds costs at most the budget in CPU
//! per call, usually less than the wakeup it saves.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Plugins whose replies come later than this on average are not polled for.
pub const SPIN_LIMIT: Duration = Duration::from_micros(60);
/// The most one call polls for.
pub const SPIN_MAX: Duration = Duration::from_micros(100);
/// The least a polled call polls for.
pub const SPIN_MIN: Duration = Duration::from_micros(20);
/// A reply slower than this counts as this in the average.
pub const SAMPLE_CAP: Duration = Duration::from_micros(240);

/// How soon one plugin answers: a moving average of its reply latency (1/8 weight to the
/// newest), in nanoseconds; 0 until the first reply.
#[derive(Debug, Default)]
pub struct Pace {
    avg_ns: AtomicU64,
}

impl Pace {
    /// Count one reply that came `latency` after its call was sent.
    pub fn record(&self, latency: Duration) {
        let sample = latency.min(SAMPLE_CAP).as_nanos().max(1) as u64;
        // Calls racing here may lose one sample to each other: an average can afford it.
        let old = self.avg_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.avg_ns.store(new.max(1), Ordering::Relaxed);
    }

    /// The learned average (None before the first reply).
    pub fn average(&self) -> Option<Duration> {
        match self.avg_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// How long to poll for the reply of a call just sent (zero: do not), on a daemon that
    /// may run on `cpus` CPUs.
    pub fn budget(&self, cpus: usize) -> Duration {
        match self.average() {
            Some(avg) if cpus > 1 && avg <= SPIN_LIMIT => (avg * 2).clamp(SPIN_MIN, SPIN_MAX),
            _ => Duration::ZERO,
        }
    }
}

/// The CPUs the daemon may run on (its affinity and CPU quota), read once.
pub fn cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// At most one thread of the daemon polls at a time: the others are left to the rest of
/// the daemon's work.
#[derive(Debug, Default)]
pub struct Spinner {
    busy: AtomicBool,
}

impl Spinner {
    /// Nobody polling yet.
    pub const fn new() -> Spinner {
        Spinner {
            busy: AtomicBool::new(false),
        }
    }
}

/// How a poll for a reply ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Polled {
    /// The plugin's stdout became readable (or reported an error or hangup).
    Ready,
    /// The budget ran out first.
    Expired,
    /// Another thread was polling: this one did not.
    Skipped,
}

impl Spinner {
    /// Poll `fd` until it is readable or `budget` has passed since `since`, yielding the CPU
    /// each round.
    pub fn poll(&self, fd: BorrowedFd<'_>, since: Instant, budget: Duration) -> Polled {
        if self.busy.swap(true, Ordering::Acquire) {
            return Polled::Skipped;
        }
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let end = loop {
            // SAFETY: one pollfd, valid for the call; a zero timeout never blocks.
            if unsafe { libc::poll(&mut pfd, 1, 0) } != 0 {
                break Polled::Ready;
            }
            if since.elapsed() >= budget {
                break Polled::Expired;
            }
            // SAFETY: no arguments; lets a task runnable on this CPU (the plugin) go first.
            unsafe { libc::sched_yield() };
        };
        self.busy.store(false, Ordering::Release);
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    fn pipe() -> (OwnedFd, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: two out-slots for the ends of a new pipe.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors, owned once each.
        unsafe {
            (
                OwnedFd::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        }
    }

    /// Replies enough for the average to settle on `latency`.
    fn feed(p: &Pace, latency: Duration) {
        for _ in 0..64 {
            p.record(latency);
        }
    }

    /// A poll with a budget a passing test never reaches: it ends when the pipe is readable
    /// (and expires, failing the test, when a poll misses that).
    fn poll_long(s: &Spinner, r: &OwnedFd) -> Polled {
        s.poll(r.as_fd(), Instant::now(), Duration::from_secs(20))
    }

    #[test]
    fn nothing_is_polled_for_before_a_reply_was_timed_or_on_one_cpu() {
        let p = Pace::default();
        assert_eq!(p.average(), None);
        assert_eq!(p.budget(8), Duration::ZERO);
        p.record(Duration::from_micros(10));
        assert_eq!(
            p.budget(1),
            Duration::ZERO,
            "one CPU: the plugin could not run"
        );
        assert_eq!(p.budget(2), SPIN_MIN, "twice 10 us, raised to the least");
    }

    #[test]
    fn a_fast_plugin_gets_twice_its_average_and_a_slow_one_nothing() {
        let p = Pace::default();
        feed(&p, Duration::from_micros(30));
        let avg = p.average().unwrap();
        assert!(avg.abs_diff(Duration::from_micros(30)) < Duration::from_micros(1));
        assert_eq!(p.budget(2), avg * 2);
        feed(&p, Duration::from_millis(3));
        let avg = p.average().unwrap();
        assert!(
            avg <= SAMPLE_CAP && SAMPLE_CAP - avg < Duration::from_micros(1),
            "a slow reply counts as the cap: {avg:?}"
        );
        assert_eq!(p.budget(2), Duration::ZERO);
        // Faster again: polled for again once the average is back under the limit.
        feed(&p, Duration::from_micros(50));
        assert_eq!(p.budget(2), SPIN_MAX, "twice 50 us, capped");
    }

    #[test]
    fn one_long_call_does_not_stop_the_polling_for_the_fast_ones_after_it() {
        let p = Pace::default();
        feed(&p, Duration::from_micros(20));
        // An exec/run of ten seconds.
        p.record(Duration::from_secs(10));
        assert!(p.budget(2) > Duration::ZERO, "average {:?}", p.average());
    }

    #[test]
    fn a_poll_ends_when_the_reply_is_there_and_expires_without_one() {
        let s = Spinner::default();
        let (r, mut w) = pipe();
        // Nothing written: the budget runs out.
        let t = Instant::now();
        assert_eq!(
            s.poll(r.as_fd(), t, Duration::from_micros(200)),
            Polled::Expired
        );
        assert!(t.elapsed() >= Duration::from_micros(200));
        // Written by another thread while this one polls (a budget it never reaches).
        let writer = std::thread::spawn(move || {
            w.write_all(b"{}\n").unwrap();
            w
        });
        assert_eq!(poll_long(&s, &r), Polled::Ready);
        drop(writer.join().unwrap());
        // A hung-up pipe ends it too (the plugin exited).
        let (r, w) = pipe();
        drop(w);
        assert_eq!(poll_long(&s, &r), Polled::Ready);
    }

    #[test]
    fn one_thread_polls_at_a_time() {
        let s = std::sync::Arc::new(Spinner::default());
        let (r, mut w) = pipe();
        let r = std::sync::Arc::new(r);
        let (s2, r2) = (s.clone(), r.clone());
        let first = std::thread::spawn(move || poll_long(&s2, &r2));
        // Once the first is polling, a second is turned away; then the write releases both.
        let waited = Instant::now();
        while !s.busy.load(Ordering::Acquire) {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "no poll started"
            );
            std::thread::yield_now();
        }
        // (A short budget: were it let in, it would expire rather than hang.)
        assert_eq!(
            s.poll(r.as_fd(), Instant::now(), Duration::from_millis(1)),
            Polled::Skipped
        );
        w.write_all(b"x").unwrap();
        assert_eq!(first.join().unwrap(), Polled::Ready);
        assert!(!s.busy.load(Ordering::Acquire));
    }
}
