//! The outbound half of a connection, as handlers and providers see it: [`Outbound`], a
//! cheap cloneable handle that queues replies and notifications for one client, bounded in
//! bytes ([`OUTBOUND_BUDGET`] per connection; small messages from the connection's own
//! allowance, large ones from the broker-wide [`Pool`]). Providers and the events hub get
//! this, never the connection itself ([`crate::conn`]).
//!
//! - A tracked message ([`Outbound::send_tracked`]) tells its sender whether it reached the
//!   client, so an exec keeps what a dead client never got for the next `exec/attach`.
//! - After a burst of large messages the allocator gives the freed memory back
//!   ([`note_released`]).
//! - A small message that finds nothing queued or being written is written by its sender
//!   at once ([`Writer`]), with no hand-off to the connection's write task: a reply costs
//!   one task wake-up less, and none on another worker thread (issue 25). Order holds: a
//!   sender writes itself only while holding the writer with nothing of anyone's queued.
//! - A large tracked message (an exec stream's chunk) found the same way is written whole by
//!   its sender, which waits on the socket holding the writer (`Outbound::write_large`):
//!   the stream's pump reads, encodes and writes on one thread, and its frames are freed
//!   where they were made (issue 48).

use abx_protocol::codec::Framing;
use abx_protocol::message;
use bytes::{Bytes, BytesMut};
use serde::Serialize;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Bytes queued for one connection before its producers wait.
pub const OUTBOUND_BUDGET: usize = 16 * 1024 * 1024;
/// Accounting overhead per queued message.
pub const MSG_OVERHEAD: usize = 64;
/// Queued bytes of small messages each connection may hold outside the broker-wide pool:
/// its small replies (pings, acks, errors) never wait for other connections.
pub const OWN_ALLOWANCE: usize = 64 * 1024;
/// Messages up to this cost (body + overhead) may use the connection's own allowance.
pub const SMALL_MESSAGE: usize = 8 * 1024;
/// Bytes of small replies each connection may reserve before they run outside the
/// broker-wide pool: apart from [`OWN_ALLOWANCE`], so requests in flight (a `code/run` cell
/// runs for minutes holding its reply's reservation) never keep the connection's own
/// messages (their notifications) from its allowance (issue 42: 50 cells of a connection
/// that never read held all of it, and their notifications then had to wait for a pool
/// other such clients held).
pub const RESERVE_ALLOWANCE: usize = 32 * 1024;
/// Default broker-wide cap on queued outbound bytes and large result buffers
/// (`ABX_MEMORY_BUDGET`).
pub const DEFAULT_POOL: usize = 128 * 1024 * 1024;
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

    /// Take exactly `bytes` if free now; `None` also when they are more than the cap (they
    /// can never be counted).
    pub fn try_take_exact(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        if bytes > self.cap {
            return None;
        }
        self.try_take(bytes)
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
    /// Of the connection's reservation allowance ([`RESERVE_ALLOWANCE`]).
    rsv: Option<OwnedSemaphorePermit>,
    pool: Option<OwnedSemaphorePermit>,
}

impl Permits {
    /// Bytes of the pool or allowance held.
    fn shared(&self) -> usize {
        [&self.own, &self.rsv, &self.pool]
            .iter()
            .map(|p| p.as_ref().map_or(0, |p| p.num_permits()))
            .sum()
    }

    /// Take over `other`'s permits (of the same connection).
    fn merge(&mut self, other: Permits) {
        self.conn.merge(other.conn);
        for (mine, theirs) in [
            (&mut self.own, other.own),
            (&mut self.rsv, other.rsv),
            (&mut self.pool, other.pool),
        ] {
            match (mine.as_mut(), theirs) {
                (Some(m), Some(t)) => m.merge(t),
                (None, t) => *mine = t,
                (Some(_), None) => {}
            }
        }
    }

    /// Take the pool bytes out (the connection's part and its own allowance stay): a
    /// request lends them to the provider that builds its reply (the plugin host reads the
    /// reply into them), and gets them back as its reply's hold.
    pub fn take_pool(&mut self) -> Option<OwnedSemaphorePermit> {
        self.pool.take()
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
        // Kept in this order: the connection's own allowances first, the pool last.
        let mut left = shared;
        for p in [&mut self.own, &mut self.rsv, &mut self.pool] {
            let have = p.as_ref().map_or(0, |p| p.num_permits());
            trim_opt(p, left);
            left -= have.min(left);
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

/// Messages up to this size may be written by their sender ([`Writer`]).
const SENDER_WRITES: usize = 16 * 1024;

/// Framed messages up to this size are copied onto the sender's stack and written in one
/// plain write.
const SMALL_WRITE: usize = 1024;

/// A connection's writer, shared by its write task and by senders of small messages that
/// find nothing queued and the writer free.
pub(crate) struct Writer {
    pub(crate) io: tokio::sync::Mutex<Pin<Box<dyn AsyncWrite + Send>>>,
    /// Messages handed to the write task and not written yet (it counts them down under
    /// `io`'s lock once they are).
    pub(crate) queued: AtomicUsize,
    /// The connection's framing (0 until known: lines).
    pub(crate) framing: Arc<AtomicU8>,
    /// Set by the connection's reader while it serves a burst of requests already read
    /// (a pipelining client) without waiting. Small replies sent meanwhile gather, framed, in
    /// `burst` instead of a write each (and, to the write task, a wakeup each); at the
    /// burst's end ([`Outbound::uncork`]) the reader writes them in one write, or hands them
    /// to the write task as one message.
    corked: AtomicBool,
    burst: std::sync::Mutex<Burst>,
}

/// The replies of a burst (see [`Writer::cork`]): later than everything queued when they
/// were added, earlier than everything sent after the burst's end.
#[derive(Default)]
struct Burst {
    /// Framed, in order.
    bytes: BytesMut,
    /// What they cost, merged.
    permit: Option<Permits>,
}

/// A burst's replies are let go once they hold this much.
const BURST_BYTES: usize = 64 * 1024;

impl Writer {
    pub(crate) fn new(io: Pin<Box<dyn AsyncWrite + Send>>, framing: Arc<AtomicU8>) -> Writer {
        Writer {
            io: tokio::sync::Mutex::new(io),
            queued: AtomicUsize::new(0),
            framing,
            corked: AtomicBool::new(false),
            burst: std::sync::Mutex::new(Burst::default()),
        }
    }

    /// Gather this connection's small replies until [`Outbound::uncork`]. Only the
    /// connection's reader corks, and only while it runs without waiting: it uncorks before
    /// anything it awaits (more bytes, room a reply waits for), so nothing waits on a burst
    /// that waits on it.
    pub(crate) fn cork(&self) {
        self.corked.store(true, Ordering::Release);
    }

    /// Whether the reader holds the cork.
    pub(crate) fn is_corked(&self) -> bool {
        self.corked.load(Ordering::Acquire)
    }

    pub(crate) fn framing(&self) -> Framing {
        match self.framing.load(Ordering::Relaxed) {
            2 => Framing::Header,
            _ => Framing::Line,
        }
    }
}

pub(crate) struct Queued {
    pub(crate) body: Bytes,
    /// `body` is framed already (the unwritten rest of a sender's own write).
    pub(crate) framed: bool,
    pub(crate) _permit: Permits,
    /// Told whether the body reached the client (see [`Outbound::send_tracked`]).
    pub(crate) ack: Option<Ack>,
}

/// What a tracked message's sender hears: `Ok` once it was written and flushed, `Err(body)`
/// when it could not be (the client is gone), so the sender can keep it for later.
pub type Delivery = Box<dyn FnOnce(Result<(), Vec<u8>>) + Send>;

/// What the sender of a shared message ([`Outbound::send_shared`]) hears: whether it reached
/// the client (it keeps nothing, so it gets no body back).
pub type Done = Box<dyn FnOnce(bool) + Send>;

/// Who hears about a tracked message.
enum Report {
    /// Its sender, with the body back when it was not delivered.
    Body(Delivery),
    /// Its sender, without the body (shared: given back, it would be a copy).
    Done(Done),
}

/// A tracked message's delivery report; dropped unreported (the connection went away
/// with the message still queued), it reports the body as undelivered.
pub(crate) struct Ack {
    body: Bytes,
    report: Option<Report>,
}

impl Ack {
    pub(crate) fn delivered(mut self) {
        match self.report.take() {
            Some(Report::Body(r)) => r(Ok(())),
            Some(Report::Done(r)) => r(true),
            None => {}
        }
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        match self.report.take() {
            Some(Report::Body(r)) => r(Err(Vec::from(std::mem::take(&mut self.body)))),
            Some(Report::Done(r)) => r(false),
            None => {}
        }
    }
}

/// A cheap, cloneable way to send to one connection (replies, stream notifications): a clone
/// is one reference count (issue 25: the handle is cloned on every routed call).
#[derive(Clone)]
pub struct Outbound {
    /// Connection id (unique within this broker).
    pub id: u64,
    shared: Arc<Shared>,
}

/// What every handle of one connection shares.
struct Shared {
    tx: mpsc::UnboundedSender<Queued>,
    budget: Arc<Semaphore>,
    /// The connection's own allowance for small messages (outside the pool).
    own: Arc<Semaphore>,
    /// Its allowance for small replies reserved before they run ([`RESERVE_ALLOWANCE`]).
    rsv: Arc<Semaphore>,
    /// The broker-wide pool.
    pool: Pool,
    closed: CancellationToken,
    /// The connection's writer, for senders that write themselves (`None`: always queue).
    writer: Option<Arc<Writer>>,
}

/// The framing around a body of `len` bytes: (head, tail), the head written into `buf`.
fn frame_parts(f: Framing, len: usize, buf: &mut [u8; 40]) -> (&[u8], &'static [u8]) {
    match f {
        Framing::Line => (&[], b"\n"),
        Framing::Header => {
            let mut at = &mut buf[..];
            let _ =
                std::io::Write::write_fmt(&mut at, format_args!("Content-Length: {len}\r\n\r\n"));
            let n = 40 - at.len();
            (&buf[..n], &[])
        }
    }
}

/// Write `parts` whole, vectored when the writer takes that (one system call for a body and
/// its framing where three plain writes were made), then flush.
pub(crate) async fn write_parts(
    io: &mut Pin<Box<dyn AsyncWrite + Send>>,
    parts: [&[u8]; 3],
) -> std::io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let vectored = io.is_write_vectored();
    let mut done = 0;
    while done < total {
        let n = std::future::poll_fn(|cx| {
            let mut skip = done;
            let mut slices = [std::io::IoSlice::new(&[]); 3];
            let mut k = 0;
            for p in parts {
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                slices[k] = std::io::IoSlice::new(&p[skip..]);
                skip = 0;
                k += 1;
            }
            if vectored {
                io.as_mut().poll_write_vectored(cx, &slices[..k])
            } else {
                io.as_mut().poll_write(cx, &slices[0])
            }
        })
        .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        done += n;
    }
    std::future::poll_fn(|cx| io.as_mut().poll_flush(cx)).await
}

/// What a message of `bytes` costs: of the connection's budget, and of the allowance or pool.
fn costs(bytes: usize, pool: &Pool) -> (usize, usize) {
    let cost = bytes.saturating_add(MSG_OVERHEAD);
    (cost.min(OUTBOUND_BUDGET), cost.min(pool.cap()))
}

impl Outbound {
    /// A handle for connection `id` and the queue its writer drains.
    pub(crate) fn new(
        id: u64,
        pool: Pool,
        writer: Option<Arc<Writer>>,
    ) -> (Outbound, mpsc::UnboundedReceiver<Queued>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let h = Outbound {
            id,
            shared: Arc::new(Shared {
                tx,
                budget: Arc::new(Semaphore::new(OUTBOUND_BUDGET)),
                own: Arc::new(Semaphore::new(OWN_ALLOWANCE)),
                rsv: Arc::new(Semaphore::new(RESERVE_ALLOWANCE)),
                pool,
                closed: CancellationToken::new(),
                writer,
            }),
        };
        (h, rx)
    }

    /// Hand a message to the write task (or, small, untracked and with nothing ahead of it,
    /// write it now, straight from `body`; or, while the reader serves a burst, add it to the
    /// burst's replies). `Err` gives the body back: the connection is gone (and `report` is
    /// not called).
    fn push(
        &self,
        body: Vec<u8>,
        permit: Permits,
        report: Option<Delivery>,
    ) -> Result<(), Vec<u8>> {
        // `sandbox/log`: every message to a client passes here (an exit seen already in
        // `queue` is a no-op the second time).
        crate::cmdlog::exit_seen(&body);
        let permit = match report {
            Some(_) => permit,
            None => match self.write_now(&body, permit) {
                Ok(()) => return Ok(()),
                Err(permit) => permit,
            },
        };
        let w = self.shared.writer.as_deref();
        // Held until this message is queued, so the burst's end cannot pass it.
        let mut burst = w
            .filter(|w| w.is_corked())
            .map(|w| w.burst.lock().expect("burst lock"));
        if let (Some(w), Some(b)) = (w, burst.as_deref_mut()) {
            if w.is_corked() {
                if report.is_none()
                    && body.len() <= SENDER_WRITES
                    && b.bytes.len() < BURST_BYTES
                    && !self.shared.tx.is_closed()
                {
                    w.framing().write(&body, &mut b.bytes);
                    match &mut b.permit {
                        Some(mine) => mine.merge(permit),
                        None => b.permit = Some(permit),
                    }
                    return Ok(());
                }
                // What the burst gathered goes first.
                self.queue_burst(b);
            }
        }
        let body = Bytes::from(body);
        let ack = report.map(|r| Ack {
            body: body.clone(),
            report: Some(Report::Body(r)),
        });
        let q = Queued {
            body,
            framed: false,
            _permit: permit,
            ack,
        };
        let Some(mut q) = self.enqueue(q) else {
            return Ok(());
        };
        drop(burst);
        if let Some(mut a) = q.ack.take() {
            a.report = None;
        }
        Err(Vec::from(q.body))
    }

    /// Queue a body shared with other connections, tracked (never joining a burst: what a
    /// burst gathered goes first). False when the connection is gone (`done` not called).
    fn push_shared(&self, body: Bytes, permit: Permits, done: Done) -> bool {
        let w = self.shared.writer.as_deref();
        let mut burst = w
            .filter(|w| w.is_corked())
            .map(|w| w.burst.lock().expect("burst lock"));
        if let Some(b) = burst.as_deref_mut() {
            self.queue_burst(b);
        }
        let ack = Ack {
            body: body.clone(),
            report: Some(Report::Done(done)),
        };
        let q = Queued {
            body,
            framed: false,
            _permit: permit,
            ack: Some(ack),
        };
        let Some(mut q) = self.enqueue(q) else {
            return true;
        };
        drop(burst);
        if let Some(mut a) = q.ack.take() {
            a.report = None;
        }
        false
    }

    /// Hand one message to the write task; given back when the connection is gone.
    fn enqueue(&self, q: Queued) -> Option<Queued> {
        let w = self.shared.writer.as_deref();
        if let Some(w) = w {
            w.queued.fetch_add(1, Ordering::AcqRel);
        }
        let Err(mpsc::error::SendError(q)) = self.shared.tx.send(q) else {
            return None;
        };
        if let Some(w) = w {
            w.queued.fetch_sub(1, Ordering::AcqRel);
        }
        Some(q)
    }

    /// Hand what a burst gathered to the write task, as one framed message.
    fn queue_burst(&self, b: &mut Burst) {
        let Some(permit) = b.permit.take() else {
            return;
        };
        let q = Queued {
            body: b.bytes.split().freeze(),
            framed: true,
            _permit: permit,
            ack: None,
        };
        // Not queued: the connection is gone, and so are its replies.
        let _ = self.enqueue(q);
    }

    /// The end of a burst (the reader's, see [`Writer::cork`]): its replies are written now
    /// in one write when nothing is queued ahead of them and the writer is free, else handed
    /// to the write task as one message; then replies go out one by one again.
    pub(crate) fn uncork(&self) {
        let Some(w) = self.shared.writer.as_deref() else {
            return;
        };
        if !w.is_corked() {
            return;
        }
        let mut b = w.burst.lock().expect("burst lock");
        if let Some(permit) = b.permit.take() {
            match self.lock_free_writer(w) {
                Some(io) => match self.write_locked(io, [&[], &b.bytes, &[]], permit) {
                    Ok(()) => {
                        b.bytes.clear();
                        if b.bytes.capacity() > BURST_BYTES * 2 {
                            b.bytes = BytesMut::new();
                        }
                    }
                    Err(permit) => {
                        b.permit = Some(permit);
                        self.queue_burst(&mut b);
                    }
                },
                None => {
                    b.permit = Some(permit);
                    self.queue_burst(&mut b);
                }
            }
        }
        w.corked.store(false, Ordering::Release);
    }

    /// The writer, if a sender may write now: the connection is open, nothing is queued,
    /// and nobody is writing.
    fn lock_free_writer<'w>(
        &self,
        w: &'w Writer,
    ) -> Option<tokio::sync::MutexGuard<'w, Pin<Box<dyn AsyncWrite + Send>>>> {
        if self.shared.tx.is_closed() || w.queued.load(Ordering::Acquire) != 0 {
            return None;
        }
        let io = w.io.try_lock().ok()?;
        // Checked again under the lock: the write task counts down only while holding it.
        (w.queued.load(Ordering::Acquire) == 0).then_some(io)
    }

    /// Write a small message now if nothing is queued or being written: one attempt that
    /// never waits, from the body as it is. `Err`: not written, queue it.
    fn write_now(&self, body: &[u8], permit: Permits) -> Result<(), Permits> {
        let Some(w) = self.shared.writer.as_deref() else {
            return Err(permit);
        };
        if body.len() > SENDER_WRITES || w.is_corked() {
            return Err(permit);
        }
        let Some(io) = self.lock_free_writer(w) else {
            return Err(permit);
        };
        let mut head = [0u8; 40];
        let (head, tail) = frame_parts(w.framing(), body.len(), &mut head);
        self.write_locked(io, [head, body, tail], permit)
    }

    /// Write the framed message `parts` with `io` held: one attempt that never waits (the
    /// framing beside the body in one vectored write, no framed copy, when the writer takes
    /// vectored writes). What the socket did not take is queued, framed, while the writer is
    /// still held (so nothing can pass it). `Err`: nothing written, queue it.
    fn write_locked(
        &self,
        mut io: tokio::sync::MutexGuard<'_, Pin<Box<dyn AsyncWrite + Send>>>,
        parts: [&[u8]; 3],
        permit: Permits,
    ) -> Result<(), Permits> {
        let [head, body, tail] = parts;
        let total = head.len() + body.len() + tail.len();
        // A small message is copied whole onto the stack and sent in one plain write (a
        // vectored write of its pieces costs the kernel more than the copy); a larger one
        // goes vectored from the body as it is, when the writer takes that.
        let mut small = [0u8; SMALL_WRITE];
        let mut copy = Vec::new();
        let whole = head.is_empty() && tail.is_empty();
        let vectored = !whole && total > SMALL_WRITE && io.is_write_vectored();
        let flat: &[u8] = if whole {
            body
        } else if total <= SMALL_WRITE {
            let mut at = 0;
            for p in parts {
                small[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            &small[..total]
        } else {
            if !vectored {
                copy.reserve_exact(total);
                parts.iter().for_each(|p| copy.extend_from_slice(p));
            }
            &copy
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut done = 0;
        while done < total {
            let polled = if vectored {
                let mut skip = done;
                let mut slices = [std::io::IoSlice::new(&[]); 3];
                let mut k = 0;
                for p in parts {
                    if skip >= p.len() {
                        skip -= p.len();
                        continue;
                    }
                    slices[k] = std::io::IoSlice::new(&p[skip..]);
                    skip = 0;
                    k += 1;
                }
                io.as_mut().poll_write_vectored(&mut cx, &slices[..k])
            } else {
                io.as_mut().poll_write(&mut cx, &flat[done..])
            };
            match polled {
                Poll::Ready(Ok(n)) if n > 0 => done += n,
                // Broken, or the socket is full before a byte went: the write task deals
                // with it (a failed write closes the connection).
                Poll::Ready(_) | Poll::Pending if done == 0 => return Err(permit),
                Poll::Ready(_) | Poll::Pending => break,
            }
        }
        let flushed = matches!(io.as_mut().poll_flush(&mut cx), Poll::Ready(Ok(())));
        if done == total && flushed {
            return Ok(());
        }
        // The rest (possibly nothing, then only the flush) goes first in the write task's
        // queue: queued under the lock, ahead of anything sent after this.
        let mut rest = BytesMut::with_capacity(total - done);
        let mut skip = done;
        for p in parts {
            let from = skip.min(p.len());
            skip -= from;
            rest.extend_from_slice(&p[from..]);
        }
        let rest = Queued {
            body: rest.freeze(),
            framed: true,
            _permit: permit,
            ack: None,
        };
        let _ = self.enqueue(rest);
        drop(io);
        Ok(())
    }

    /// Cancelled once the connection's writer is gone.
    pub(crate) fn closed_token(&self) -> &CancellationToken {
        &self.shared.closed
    }

    /// The broker-wide pool this connection's messages count against.
    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    /// Queue one already-encoded message body. Waits while the queue is over budget.
    /// Returns false when the connection is gone.
    pub async fn send(&self, body: Vec<u8>) -> bool {
        self.send_or_keep(body).await.is_ok()
    }

    async fn conn_units(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        match self.shared.budget.clone().try_acquire_many_owned(n as u32) {
            Ok(p) => Some(p),
            Err(tokio::sync::TryAcquireError::Closed) => None,
            Err(tokio::sync::TryAcquireError::NoPermits) => tokio::select! {
                p = self.shared.budget.clone().acquire_many_owned(n as u32) => p.ok(),
                _ = self.shared.closed.cancelled() => None,
            },
        }
    }

    /// The shared part of a message's cost, if free now: the connection's own allowance
    /// (for a reply reserved before it runs, its reservation allowance) when the message is
    /// small and there is room, else the pool.
    fn try_shared(
        &self,
        conn: OwnedSemaphorePermit,
        n: usize,
        reserving: bool,
    ) -> Result<Permits, OwnedSemaphorePermit> {
        let mut p = Permits {
            conn,
            own: None,
            rsv: None,
            pool: None,
        };
        if n <= SMALL_MESSAGE {
            let sem = if reserving {
                &self.shared.rsv
            } else {
                &self.shared.own
            };
            if let Ok(own) = sem.clone().try_acquire_many_owned(n as u32) {
                if reserving {
                    p.rsv = Some(own);
                } else {
                    p.own = Some(own);
                }
                return Ok(p);
            }
        }
        match self.shared.pool.try_take(n) {
            Some(pool) => {
                p.pool = Some(pool);
                Ok(p)
            }
            None => Err(p.conn),
        }
    }

    /// Take what a message of `bytes` costs: the connection's budget, then its allowance or
    /// the pool. Never waits for one while holding the other (so no two waiters can block
    /// each other): the connection's part is waited for first (a client that does not read
    /// waits here, never taking pool bytes it could not use); when the pool is short, the
    /// connection's part goes back while the pool is waited for. `None` once the connection
    /// is gone.
    async fn take(&self, bytes: usize) -> Option<Permits> {
        self.take_with(bytes, 0, false).await
    }

    /// [`Outbound::take`] with `work` more bytes of the shared part (memory the work holds
    /// beside the reply for a moment; given back when the reply is queued); `reserving`: for
    /// a reply not built yet (its small part from the reservation allowance).
    async fn take_with(&self, bytes: usize, work: usize, reserving: bool) -> Option<Permits> {
        let (c, sh) = costs(bytes, &self.shared.pool);
        let sh = sh.saturating_add(work).min(self.shared.pool.cap());
        loop {
            let conn = self.conn_units(c).await?;
            let conn = match self.try_shared(conn, sh, reserving) {
                Ok(p) => return Some(p),
                Err(conn) => conn,
            };
            drop(conn);
            let pool = tokio::select! {
                p = self.shared.pool.take(sh) => p,
                _ = self.shared.closed.cancelled() => return None,
            };
            if let Ok(conn) = self.shared.budget.clone().try_acquire_many_owned(c as u32) {
                return Some(Permits {
                    conn,
                    own: None,
                    rsv: None,
                    pool: Some(pool),
                });
            }
        }
    }

    /// Reserve `bytes` (of the connection's budget and of its reservation allowance or the
    /// broker-wide pool) for a reply not built yet. Waits while either is short; `None` once
    /// the connection is gone.
    pub async fn reserve(&self, bytes: usize) -> Option<Permits> {
        self.take_with(bytes, 0, true).await
    }

    /// [`Outbound::reserve`] with `work` bytes more of the shared budget, for memory the
    /// work holds beside its reply while it builds it (see [`limits::work_reserve`]).
    pub async fn reserve_with(&self, bytes: usize, work: usize) -> Option<Permits> {
        self.take_with(bytes, work, true).await
    }

    /// Wait until the connection's budget has room for `bytes` (or the connection is gone),
    /// holding none of it: a producer reads what becomes this client's messages only as
    /// fast as the client takes them, without holding budget while it waits.
    pub async fn room(&self, bytes: usize) {
        drop(self.conn_units(bytes.min(OUTBOUND_BUDGET)).await);
    }

    /// Queue `body` against a reservation from [`Outbound::reserve`] and a handler's
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
        let (c, sh) = costs(body.len(), &self.shared.pool);
        if permits.shared() < sh && sh <= SMALL_MESSAGE && permits.own.is_none() {
            // A small message: the connection's own allowance, as for any other.
            if let Ok(own) = self.shared.own.clone().try_acquire_many_owned(sh as u32) {
                permits.own = Some(own);
            }
        }
        if permits.shared() < sh {
            match self.shared.pool.try_take(sh - permits.shared()) {
                Some(more) => permits.add_pool(more),
                None => {
                    drop(permits);
                    return self.send(body).await;
                }
            }
        }
        if !permits.fit(c, sh) {
            // The connection's part is short: wait for all of it, holding none of it.
            let Permits {
                conn,
                own,
                rsv,
                pool,
            } = permits;
            drop(conn);
            let Some(conn) = self.conn_units(c).await else {
                return false;
            };
            permits = Permits {
                conn,
                own,
                rsv,
                pool,
            };
            permits.fit(c, sh);
        }
        self.push(body, permits, None).is_ok()
    }

    /// [`Outbound::send`] that hands the body back when the connection has closed (a
    /// stream keeps it for a later attach without copying every body up front).
    pub async fn send_or_keep(&self, body: Vec<u8>) -> Result<(), Vec<u8>> {
        self.queue(body, None, None).await
    }

    /// [`Outbound::send_or_keep`] that also reports whether the body reached the client:
    /// `report(Ok(()))` once it was written and flushed, `report(Err(body))` when the
    /// client turned out to be gone (a write failed, or the connection closed with the body
    /// still queued). `Err(body)` here: not queued at all, `report` is not called.
    /// A stream uses it so that nothing written to a dead client is lost for a later
    /// `exec/attach`. `permits` (from [`Outbound::reserve`]) are used when given.
    pub async fn send_tracked(
        &self,
        body: Vec<u8>,
        report: Delivery,
        permits: Option<Permits>,
    ) -> Result<(), Vec<u8>> {
        self.queue(body, Some(report), permits).await
    }

    /// [`Outbound::send_tracked`] for a body whose memory `hold` (pool bytes) counts
    /// already (a plugin's stream notification, counted when it was read): queued against
    /// those bytes, never counted twice. Waits only for the connection's budget (the body
    /// exists, its bytes stay counted meanwhile); when `hold` is short and the pool has no
    /// more now, it is given back and the whole cost waited for as [`Outbound::send`] does.
    pub async fn send_tracked_held(
        &self,
        body: Vec<u8>,
        report: Delivery,
        hold: Option<OwnedSemaphorePermit>,
    ) -> Result<(), Vec<u8>> {
        let (c, sh) = costs(body.len(), &self.shared.pool);
        let mut pool = hold;
        let have = pool.as_ref().map_or(0, |p| p.num_permits());
        if have < sh {
            match self.shared.pool.try_take(sh - have) {
                Some(more) => match &mut pool {
                    Some(p) => p.merge(more),
                    None => pool = Some(more),
                },
                None => {
                    drop(pool);
                    return self.queue(body, Some(report), None).await;
                }
            }
        }
        let Some(conn) = self.conn_units(c).await else {
            return Err(body);
        };
        let mut permits = Permits {
            conn,
            own: None,
            rsv: None,
            pool,
        };
        permits.fit(c, sh);
        self.push(body, permits, Some(report))
    }

    /// Queue a body shared with other connections (a `sandbox/changed` every subscriber
    /// gets: one copy, whose memory its sender counted once). It costs this connection its
    /// budget (so a client that does not read holds at most 16 MiB of them), never the pool
    /// again. `done(true)` once it was written, `done(false)` when the client never got it.
    /// False when the connection is gone (`done` is not called then).
    pub async fn send_shared(&self, body: Bytes, done: Done) -> bool {
        let (c, _) = costs(body.len(), &self.shared.pool);
        let Some(conn) = self.conn_units(c).await else {
            return false;
        };
        let permits = Permits {
            conn,
            own: None,
            rsv: None,
            pool: None,
        };
        self.push_shared(body, permits, done)
    }

    /// [`Outbound::reserve_with`] for a request that holds pool bytes already (its message,
    /// and `headroom` reserved with it for its reply): it never waits for the pool while it
    /// holds them (no two such requests can wait on each other). The shared part comes from
    /// the connection's reservation allowance (small replies), else from `headroom`, else from what
    /// the pool has free now; `Err(())` when that is not enough (the connection's part is
    /// given back). Waits only for the connection's own budget. `Ok(None)`: the connection
    /// is gone.
    pub async fn reserve_within(
        &self,
        bytes: usize,
        work: usize,
        headroom: &mut Option<OwnedSemaphorePermit>,
    ) -> Result<Option<Permits>, ()> {
        let (c, sh) = costs(bytes, &self.shared.pool);
        let sh = sh.saturating_add(work);
        let Some(conn) = self.conn_units(c).await else {
            return Ok(None);
        };
        if sh <= SMALL_MESSAGE {
            if let Ok(rsv) = self.shared.rsv.clone().try_acquire_many_owned(sh as u32) {
                return Ok(Some(Permits {
                    conn,
                    own: None,
                    rsv: Some(rsv),
                    pool: None,
                }));
            }
        }
        let have = headroom.as_ref().map_or(0, |h| h.num_permits());
        let pool = if have >= sh {
            let h = headroom.as_mut().expect("headroom");
            if have == sh {
                headroom.take()
            } else {
                Some(h.split(sh).expect("enough permits"))
            }
        } else {
            match self.shared.pool.try_take_exact(sh - have) {
                Some(mut more) => {
                    if let Some(h) = headroom.take() {
                        more.merge(h);
                    }
                    Some(more)
                }
                None => return Err(()),
            }
        };
        Ok(Some(Permits {
            conn,
            own: None,
            rsv: None,
            pool,
        }))
    }

    async fn queue(
        &self,
        body: Vec<u8>,
        report: Option<Delivery>,
        permits: Option<Permits>,
    ) -> Result<(), Vec<u8>> {
        // `sandbox/log`: an exec's exit ends its entry, also when the client is gone (the
        // stream keeps it for an attach).
        crate::cmdlog::exit_seen(&body);
        let (c, sh) = costs(body.len(), &self.shared.pool);
        let fitted = permits.and_then(|mut p| p.fit(c, sh).then_some(p));
        let permits = match fitted {
            Some(p) => p,
            None => match self.take(body.len()).await {
                Some(p) => p,
                None => return Err(body),
            },
        };
        let (body, permits, report) = match report {
            Some(r) if body.len() > SENDER_WRITES => match self.write_large(body, permits, r).await
            {
                Ok(()) => return Ok(()),
                Err((body, permits, r)) => (body, permits, Some(r)),
            },
            r => (body, permits, r),
        };
        self.push(body, permits, report)
    }

    /// A large tracked message (a stream's chunk) written by its sender, whole, when nothing
    /// is queued, nobody is writing and no burst is gathering: no hand-off to the write task
    /// (a wakeup of another worker per chunk), and the body is freed by the thread that made
    /// it, so the next chunk reuses its memory instead of faulting in fresh pages (issue 48:
    /// a quarter of the daemon's CPU per streamed GiB was page faults in the base64 encoder).
    /// The framing goes beside the body in one vectored write. The sender waits while the
    /// socket is full, holding the writer: what others send meanwhile is queued behind it,
    /// in order. Reported delivered once written; on a failed write or a closed connection,
    /// undelivered with the body back (the connection is closed, as the write task does).
    /// `Err`: not written (someone else is writing), the inputs back to queue.
    async fn write_large(
        &self,
        body: Vec<u8>,
        permit: Permits,
        report: Delivery,
    ) -> Result<(), (Vec<u8>, Permits, Delivery)> {
        let Some(w) = self.shared.writer.as_deref() else {
            return Err((body, permit, report));
        };
        if w.is_corked() {
            return Err((body, permit, report));
        }
        let Some(mut io) = self.lock_free_writer(w) else {
            return Err((body, permit, report));
        };
        let mut head = [0u8; 40];
        let (head, tail) = frame_parts(w.framing(), body.len(), &mut head);
        let ok = tokio::select! {
            biased;
            r = write_parts(&mut io, [head, &body, tail]) => r.is_ok(),
            _ = self.shared.closed.cancelled() => false,
        };
        if !ok {
            self.shared.closed.cancel();
        }
        drop(io);
        drop(permit);
        report(if ok { Ok(()) } else { Err(body) });
        Ok(())
    }

    /// Queue a notification.
    pub async fn notify<P: Serialize + ?Sized>(&self, method: &str, params: &P) -> bool {
        self.send(message::encode_notification(method, Some(params)))
            .await
    }

    /// True once the connection has closed (the client went away or sent `exit`).
    pub fn is_closed(&self) -> bool {
        self.shared.closed.is_cancelled()
    }

    /// Resolves when the connection closes.
    pub async fn closed(&self) {
        self.shared.closed.cancelled().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn handle(pool: &Pool) -> (Outbound, mpsc::UnboundedReceiver<Queued>) {
        Outbound::new(1, pool.clone(), None)
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
        assert_eq!(h.shared.budget.available_permits(), OUTBOUND_BUDGET);
        drop(hog);
        assert!(waiter.await.unwrap());
        let m = rx.recv().await.expect("the large one");
        assert_eq!(m.body.len(), 256 * 1024);
        assert!(pool.available() < pool.cap());
        drop(m);
        assert_eq!(pool.available(), pool.cap());
    }

    /// Replies reserved before they run (a `code/run` cell runs for minutes holding its
    /// reservation) have an allowance of their own, apart from the one small messages are
    /// sent from (issue 42: 50 cells' reservations held all of it, and their notifications
    /// then waited for a pool other clients held): with the pool held and the reservation
    /// allowance used up, the connection's small messages still go, and a further
    /// reservation waits for the pool.
    #[tokio::test]
    async fn reservations_never_keep_small_messages_from_the_allowance() {
        let pool = Pool::new(1 << 20);
        let (h, mut rx) = handle(&pool);
        let hog = pool.try_take(pool.cap()).expect("the whole pool");
        // Every reservation there is room for without the pool.
        let mut held = Vec::new();
        while let Some(p) = futures::FutureExt::now_or_never(h.reserve(4096)) {
            held.push(p.expect("reserved"));
        }
        assert_eq!(held.len(), RESERVE_ALLOWANCE / (4096 + MSG_OVERHEAD));
        let more = h.clone();
        let waiter = tokio::spawn(async move { more.reserve(4096).await.is_some() });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "past the allowance: the pool");
        for _ in 0..100 {
            let sent = tokio::time::timeout(Duration::from_secs(5), h.send(vec![b'x'; 4096]));
            assert!(sent.await.expect("sent without the pool"));
            drop(rx.recv().await.expect("queued"));
        }
        // A notification sent against a reservation of nothing (what a cell does).
        let r = h.reserve(0).await.expect("reserved");
        let sent = tokio::time::timeout(
            Duration::from_secs(5),
            h.send_reserved(vec![b'y'; 6000], r, None),
        );
        assert!(sent.await.expect("sent without the pool"));
        drop(rx.recv().await.expect("queued"));
        drop(hog);
        assert!(waiter.await.unwrap());
        drop(held);
    }

    /// `room` waits while the connection's budget is full (its client does not read) and
    /// holds none of it; it returns once the client takes what it was sent, or at once when
    /// the connection is gone.
    #[tokio::test]
    async fn room_waits_for_the_client_and_holds_nothing() {
        let pool = Pool::new(64 << 20);
        let (h, mut rx) = handle(&pool);
        assert!(h.send(vec![b'x'; OUTBOUND_BUDGET - 1024]).await);
        let w = h.clone();
        let waiter = tokio::spawn(async move { w.room(64 * 1024).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(rx.recv().await.expect("queued"));
        waiter.await.unwrap();
        assert_eq!(h.shared.budget.available_permits(), OUTBOUND_BUDGET);
        assert!(h.send(vec![b'x'; OUTBOUND_BUDGET - 1024]).await);
        let w = h.clone();
        let waiter = tokio::spawn(async move { w.room(64 * 1024).await });
        tokio::task::yield_now().await;
        h.shared.closed.cancel();
        waiter.await.unwrap();
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

    /// A socket that takes at most `step` bytes a write and `room` bytes in all (then it is
    /// full: `Pending`), so a sender's own write can end part way and its rest must be queued
    /// framed; it counts its write calls.
    struct Trickle {
        out: Arc<Mutex<Vec<u8>>>,
        step: usize,
        room: usize,
        vectored: bool,
        calls: Arc<AtomicUsize>,
    }

    impl Trickle {
        fn take(&mut self, bufs: &[&[u8]]) -> Poll<std::io::Result<usize>> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let mut left = self.step.min(self.room);
            if left == 0 {
                return Poll::Pending;
            }
            let mut out = self.out.lock().unwrap();
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(left);
                out.extend_from_slice(&b[..k]);
                left -= k;
                n += k;
            }
            self.room -= n;
            Poll::Ready(Ok(n))
        }
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.take(&[buf])
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let bufs: Vec<&[u8]> = bufs.iter().map(|b| &**b).collect();
            self.take(&bufs)
        }
        fn is_write_vectored(&self) -> bool {
            self.vectored
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// While the reader serves a burst, small replies gather and go out in one write at its
    /// end; a message that cannot join (tracked, or large) sends what gathered ahead of it
    /// first; a burst that finds something queued ahead of it is queued behind it whole.
    #[tokio::test]
    async fn a_bursts_replies_keep_their_order_and_go_out_together() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let calls = Arc::new(AtomicUsize::new(0));
        let io = Trickle {
            out: out.clone(),
            step: usize::MAX,
            room: usize::MAX,
            vectored: true,
            calls: calls.clone(),
        };
        let writer = Arc::new(Writer::new(Box::pin(io), Arc::new(AtomicU8::new(1))));
        let pool = Pool::new(1 << 20);
        let (h, mut rx) = Outbound::new(1, pool.clone(), Some(writer.clone()));
        let msg = |n: u32| format!("{{\"n\":{n}}}").into_bytes();
        let line = |n: u32| format!("{{\"n\":{n}}}\n").into_bytes();

        // A burst of three: nothing written until its end, then one write of all three.
        writer.cork();
        for n in 1..=3 {
            assert!(h.send(msg(n)).await);
        }
        assert_eq!(
            calls.load(Ordering::Relaxed),
            0,
            "held while the burst runs"
        );
        assert!(rx.try_recv().is_err(), "and not handed to the write task");
        h.uncork();
        assert_eq!(calls.load(Ordering::Relaxed), 1, "one write for the burst");
        assert_eq!(*out.lock().unwrap(), [line(1), line(2), line(3)].concat());
        out.lock().unwrap().clear();
        assert!(!writer.is_corked());
        assert!(h.send(msg(4)).await);
        assert_eq!(
            *out.lock().unwrap(),
            line(4),
            "after the burst, written at once"
        );
        out.lock().unwrap().clear();

        // A tracked message in a burst: what gathered before it is queued first.
        writer.cork();
        assert!(h.send(msg(5)).await);
        let delivered = Arc::new(AtomicUsize::new(0));
        let d = delivered.clone();
        h.send_tracked(
            msg(6),
            Box::new(move |r| {
                d.fetch_add(if r.is_ok() { 1 } else { 10 }, Ordering::Relaxed);
            }),
            None,
        )
        .await
        .unwrap();
        assert!(h.send(msg(7)).await);
        h.uncork();
        let first = rx.try_recv().expect("the burst's start, queued");
        assert!(first.framed);
        assert_eq!(&first.body[..], &line(5)[..]);
        let second = rx.try_recv().expect("the tracked message");
        assert_eq!(&second.body[..], &msg(6)[..]);
        let third = rx.try_recv().expect("the rest, queued behind");
        assert!(third.framed);
        assert_eq!(&third.body[..], &line(7)[..]);
        assert!(out.lock().unwrap().is_empty(), "nothing passed the queue");
        drop((first, second, third));
        writer.queued.store(0, Ordering::Release);
        // Dropped here unwritten (no write task in this test): reported as not delivered.
        assert_eq!(delivered.load(Ordering::Relaxed), 10);

        // Large messages do not join either; a burst left at the reader's end still goes.
        writer.cork();
        assert!(h.send(msg(8)).await);
        let big = vec![b'x'; SENDER_WRITES + 1];
        assert!(h.send(big.clone()).await);
        h.uncork();
        assert_eq!(&rx.try_recv().expect("queued").body[..], &line(8)[..]);
        assert_eq!(&rx.try_recv().expect("queued").body[..], &big[..]);
        writer.queued.store(0, Ordering::Release);
        assert!(rx.try_recv().is_err());
        assert_eq!(pool.available(), pool.cap(), "nothing is left counted");
    }

    /// A large tracked message (a stream's chunk) is written by its sender, whole and framed,
    /// in one vectored write when the socket takes it, and reported delivered; with something
    /// queued ahead of it, it is queued behind (order holds); a sender waiting on a full
    /// socket lets go when the connection closes, and a failed write closes the connection:
    /// either way the body comes back whole, undelivered, for the stream to keep.
    #[tokio::test]
    async fn a_large_tracked_message_is_written_by_its_sender_or_given_back_whole() {
        let body = vec![b'z'; SENDER_WRITES * 4];
        type Got = Arc<Mutex<Vec<Result<(), Vec<u8>>>>>;
        let report = |got: &Got| -> Delivery {
            let got = got.clone();
            Box::new(move |r| got.lock().unwrap().push(r))
        };
        for (framing, tag) in [(Framing::Line, 1u8), (Framing::Header, 2u8)] {
            let mut want = BytesMut::new();
            framing.write(&body, &mut want);
            for (step, room) in [(usize::MAX, usize::MAX), (4096, usize::MAX), (1000, 0)] {
                let case = format!("{framing:?} step={step} room={room}");
                let out = Arc::new(Mutex::new(Vec::new()));
                let calls = Arc::new(AtomicUsize::new(0));
                let io = Trickle {
                    out: out.clone(),
                    step,
                    room,
                    vectored: true,
                    calls: calls.clone(),
                };
                let writer = Arc::new(Writer::new(Box::pin(io), Arc::new(AtomicU8::new(tag))));
                let pool = Pool::new(4 << 20);
                let (h, mut rx) = Outbound::new(1, pool.clone(), Some(writer.clone()));
                let got: Got = Arc::default();
                if room == 0 {
                    // The socket is full: the sender waits, holding the writer; what is sent
                    // meanwhile is queued behind it; closing lets it go with its body back.
                    let w = h.clone();
                    let (b, r) = (body.clone(), report(&got));
                    let sender = tokio::spawn(async move { w.send_tracked(b, r, None).await });
                    tokio::task::yield_now().await;
                    assert!(!sender.is_finished(), "{case}");
                    assert!(h.send(b"{}".to_vec()).await);
                    assert!(rx.try_recv().is_ok(), "{case}: queued behind the writer");
                    h.shared.closed.cancel();
                    assert!(sender.await.unwrap().is_ok(), "{case}");
                    assert_eq!(*got.lock().unwrap(), [Err(body.clone())], "{case}");
                    continue;
                }
                assert!(h
                    .send_tracked(body.clone(), report(&got), None)
                    .await
                    .is_ok());
                assert_eq!(*out.lock().unwrap(), &want[..], "{case}");
                if step == usize::MAX {
                    assert_eq!(calls.load(Ordering::Relaxed), 1, "{case}: one write");
                }
                assert_eq!(*got.lock().unwrap(), [Ok(())], "{case}");
                assert!(rx.try_recv().is_err(), "{case}: nothing for the write task");
                assert_eq!(pool.available(), pool.cap(), "{case}: nothing left counted");
                assert_eq!(h.shared.budget.available_permits(), OUTBOUND_BUDGET);

                // Something queued ahead: queued behind it, not written.
                out.lock().unwrap().clear();
                writer.queued.store(1, Ordering::Release);
                let got: Got = Arc::default();
                assert!(h
                    .send_tracked(body.clone(), report(&got), None)
                    .await
                    .is_ok());
                assert!(out.lock().unwrap().is_empty(), "{case}");
                let q = rx.try_recv().expect("queued");
                assert_eq!(&q.body[..], &body[..], "{case}");
                drop(q);
                assert_eq!(
                    got.lock().unwrap().len(),
                    1,
                    "{case}: reported when dropped"
                );
            }
        }

        // A failed write: the body comes back whole and the connection is closed.
        struct Broken;
        impl AsyncWrite for Broken {
            fn poll_write(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
                _: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()))
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
        }
        let writer = Arc::new(Writer::new(Box::pin(Broken), Arc::new(AtomicU8::new(1))));
        let pool = Pool::new(4 << 20);
        let (h, _rx) = Outbound::new(1, pool.clone(), Some(writer));
        let got: Got = Arc::default();
        assert!(h
            .send_tracked(body.clone(), report(&got), None)
            .await
            .is_ok());
        assert_eq!(*got.lock().unwrap(), [Err(body.clone())]);
        assert!(h.is_closed());
        assert_eq!(pool.available(), pool.cap());
    }

    /// What a sender writes itself is the framed message, byte for byte, in either framing,
    /// whether the socket takes it at once (one vectored call), in pieces (the rest queued,
    /// framed, for the write task), or only without vectored writes.
    #[tokio::test]
    async fn a_senders_own_write_is_the_framed_message_whole_or_in_part() {
        let small = br#"{"jsonrpc":"2.0","id":7,"result":{"sandboxes":[]}}"#.to_vec();
        let large = format!(
            r#"{{"jsonrpc":"2.0","id":7,"result":{{"text":"{}"}}}}"#,
            "x".repeat(3 * SMALL_WRITE)
        )
        .into_bytes();
        for (body, (framing, tag)) in [small, large].into_iter().flat_map(|b| {
            [
                (b.clone(), (Framing::Line, 0u8)),
                (b, (Framing::Header, 2u8)),
            ]
        }) {
            let mut want = BytesMut::new();
            framing.write(&body, &mut want);
            for vectored in [true, false] {
                for (step, room) in [
                    (1, usize::MAX),
                    (3, usize::MAX),
                    (4096, usize::MAX),
                    (1 << 20, usize::MAX),
                    (1 << 20, want.len()),
                    (1 << 20, 0),
                    (1 << 20, 1),
                    (1 << 20, 20),
                    (1 << 20, body.len()),
                    (7, want.len() - 1),
                    (1, 5),
                ] {
                    let out = Arc::new(Mutex::new(Vec::new()));
                    let calls = Arc::new(AtomicUsize::new(0));
                    let io = Trickle {
                        out: out.clone(),
                        step,
                        room,
                        vectored,
                        calls: calls.clone(),
                    };
                    let writer = Arc::new(Writer::new(Box::pin(io), Arc::new(AtomicU8::new(tag))));
                    let pool = Pool::new(1 << 20);
                    let (h, mut rx) = Outbound::new(1, pool.clone(), Some(writer));
                    let res = h.reserve(body.len()).await.expect("reserved");
                    assert!(h.send_reserved(body.clone(), res, None).await);
                    let case = format!(
                        "{framing:?} {} bytes vectored={vectored} step={step} room={room}",
                        body.len()
                    );
                    let mut got = out.lock().unwrap().clone();
                    assert_eq!(got.len(), want.len().min(room), "{case}");
                    if room == 0 {
                        // Full before a byte went: queued whole, unframed, for the write task.
                        let q = rx.try_recv().expect("queued");
                        assert!(!q.framed, "{case}");
                        assert_eq!(&q.body[..], &body[..], "{case}");
                        got = want.to_vec();
                    } else if got.len() < want.len() {
                        // What the socket did not take is queued, framed, for the write task.
                        let rest = rx.try_recv().expect("the rest is queued");
                        assert!(rest.framed, "{case}");
                        got.extend_from_slice(&rest.body);
                    }
                    assert_eq!(got, &want[..], "{case}");
                    assert!(rx.try_recv().is_err(), "queued once: {case}");
                    if (vectored || want.len() <= SMALL_WRITE)
                        && step >= want.len()
                        && room >= want.len()
                    {
                        assert_eq!(
                            calls.load(Ordering::Relaxed),
                            1,
                            "one write for the message: {case}"
                        );
                    }
                    drop(rx);
                    assert_eq!(pool.available(), pool.cap(), "nothing is left counted");
                }
            }
        }
    }
}
