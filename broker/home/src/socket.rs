//! The socket halves of the daemon's connections and its clients', and the ready-line handshake of a
//! daemon started by a client.

use std::io;

/// The environment variable naming the fd on which the daemon writes `ready <pid>\n`.
pub const READY_FD_ENV: &str = "ABX_READY_FD";

/// The read half of a connection: tokio's own half of a Unix stream. A short read clears
/// its readiness, so reading one message costs one `recv` (interprocess's reads through a
/// shared `&Stream` go on until one fails with EAGAIN: a second system call per message).
pub type SocketRead = tokio::net::unix::OwnedReadHalf;
/// The write half of a connection (see [`SocketRead`]).
pub type SocketWrite = tokio::net::unix::OwnedWriteHalf;

/// Split a local-socket stream into tokio's halves of the same descriptor. The tokio stream
/// inside is taken out as it is, still registered with the reactor: no deregistration and
/// registration again (three system calls per connection, on both ends).
pub fn split(
    stream: interprocess::local_socket::tokio::Stream,
) -> io::Result<(SocketRead, SocketWrite)> {
    match stream {
        interprocess::local_socket::tokio::Stream::UdSocket(s) => {
            Ok(tokio::net::UnixStream::from(s).into_split())
        }
        #[allow(unreachable_patterns)]
        _ => Err(io::Error::other("not a Unix socket")),
    }
}
