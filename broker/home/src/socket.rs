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

/// Split a local-socket stream into tokio's halves of the same descriptor (call it on a
/// tokio runtime: the descriptor is registered with its reactor again).
pub fn split(
    stream: interprocess::local_socket::tokio::Stream,
) -> io::Result<(SocketRead, SocketWrite)> {
    let fd: std::os::fd::OwnedFd = match stream {
        interprocess::local_socket::tokio::Stream::UdSocket(s) => s.try_into()?,
        #[allow(unreachable_patterns)]
        _ => return Err(io::Error::other("not a Unix socket")),
    };
    let std = std::os::unix::net::UnixStream::from(fd);
    std.set_nonblocking(true)?;
    Ok(tokio::net::UnixStream::from_std(std)?.into_split())
}
