//! The splice: bytes both ways between the client and the upstream until either side ends
//! or nothing moves for the idle time (one idle clock for both directions, [`Idle`]).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A reader that notes when it last read a byte (the splice's idle clock).
pub(crate) struct Idle<R> {
    pub(crate) inner: R,
    pub(crate) last: Arc<AtomicU64>,
    pub(crate) epoch: Instant,
}

impl<R> Idle<R> {
    pub(crate) fn with_clock(inner: R, last: Arc<AtomicU64>, epoch: Instant) -> Idle<R> {
        Idle { inner, last, epoch }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Idle<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let ms = self.epoch.elapsed().as_millis() as u64;
            self.last.store(ms, Ordering::Relaxed);
        }
        r
    }
}

impl<R: AsyncWrite + Unpin> AsyncWrite for Idle<R> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Wait until nothing was read through `last` for `idle`.
pub(crate) async fn idle_for(last: &AtomicU64, epoch: Instant, idle: Duration) {
    loop {
        let since = epoch
            .elapsed()
            .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
        if since >= idle {
            return;
        }
        tokio::time::sleep(idle - since).await;
    }
}

/// Bytes both ways until either side ends or nothing moves for `idle`.
pub(crate) async fn splice<A, B>(a: A, b: B, idle: Duration, buffer: usize)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let last = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let mut a = Idle::with_clock(a, last.clone(), epoch);
    let mut b = Idle::with_clock(b, last.clone(), epoch);
    tokio::select! {
        r = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, buffer, buffer) => {
            if let Err(e) = r {
                tracing::debug!("egress: splice: {e}");
            }
        }
        _ = idle_for(&last, epoch, idle) => {
            tracing::debug!("egress: splice idle for {idle:?}: closed");
        }
    }
}
