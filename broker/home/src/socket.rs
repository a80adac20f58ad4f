//! The socket half shared by the daemon and its clients, and the ready-line handshake of a
//! daemon started by a client.

use std::io;
use std::sync::Arc;

/// The environment variable naming the fd on which the daemon writes `ready <pid>\n`.
pub const READY_FD_ENV: &str = "ABX_READY_FD";

/// One half of a shared socket: `&Stream` reads and writes, so two `Arc`s make two halves.
pub struct SocketHalf(pub Arc<interprocess::local_socket::tokio::Stream>);

impl SocketHalf {
    /// Split a stream into a read half and a write half.
    pub fn pair(stream: interprocess::local_socket::tokio::Stream) -> (SocketHalf, SocketHalf) {
        let s = Arc::new(stream);
        (SocketHalf(s.clone()), SocketHalf(s))
    }
}

impl tokio::io::AsyncRead for SocketHalf {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut &*self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for SocketHalf {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut &*self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut &*self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut &*self.0).poll_shutdown(cx)
    }
}
