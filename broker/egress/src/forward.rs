//! Plain HTTP through the proxy: a request's head rewritten for its origin (absolute-form
//! to origin-form, hop-by-hop headers dropped, `Host` written from the URL,
//! `Connection: close`), its body's framing (`Content-Length`, or `chunked` alone), and one
//! exchange: the head and body sent, the response heads rewritten and the body streamed back,
//! under one idle clock. Used for plain requests ([`crate::proxy`]) and, with the head
//! rewritten again, for intercepted ones ([`crate::intercept`]).

use crate::http::{self, HeadError};
use crate::refusal::answer;
use crate::splice::{idle_for, Idle};
use std::io;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A plain HTTP request to forward: where to, its new head, how its body is framed.
pub(crate) struct Forward {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) head: Vec<u8>,
    pub(crate) body: Body,
}

pub(crate) enum Body {
    None,
    Length(u64),
    Chunked,
}

/// Hop-by-hop headers the proxy drops (and `Host`, which it writes from the URL).
pub(crate) const DROPPED: &[&str] = &[
    "host",
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "upgrade",
];

impl Forward {
    pub(crate) fn from_head(h: &http::Head<'_>) -> Result<Forward, (u16, String)> {
        let bad = |why: &str| (400, format!("abx: {why}.\n"));
        let (auth_s, origin) = http::absolute_http(h.second).map_err(|why| {
            (
                400,
                format!("abx: this is an HTTP proxy: send absolute-form requests (GET http://host/path) or CONNECT host:port; {why}.\n"),
            )
        })?;
        let auth = http::authority(auth_s, Some(80)).map_err(bad)?;
        let body = body_of(h)?;
        let named = connection_named(h);
        let host_header = auth_s;
        let mut head = Vec::with_capacity(512);
        head.extend_from_slice(h.first.as_bytes());
        head.push(b' ');
        head.extend_from_slice(origin.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        head.extend_from_slice(host_header.as_bytes());
        head.extend_from_slice(b"\r\n");
        for (k, v) in &h.headers {
            let lk = k.to_ascii_lowercase();
            if DROPPED.contains(&lk.as_str()) || named.contains(&lk) {
                continue;
            }
            head.extend_from_slice(k.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(v);
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"Connection: close\r\n\r\n");
        Ok(Forward {
            host: auth.host.to_string(),
            port: auth.port,
            head,
            body,
        })
    }
}

/// How a request's body is framed (`Content-Length`, or `chunked` alone; both, or another
/// coding, refused).
pub(crate) fn body_of(h: &http::Head<'_>) -> Result<Body, (u16, String)> {
    let bad = |why: &str| (400, format!("abx: {why}.\n"));
    {
        let te: Vec<&[u8]> = h.values("transfer-encoding").collect();
        let cl: Vec<&[u8]> = h.values("content-length").collect();
        let body = if !te.is_empty() {
            if !cl.is_empty() {
                return Err(bad("both Transfer-Encoding and Content-Length"));
            }
            let chunked_only = te.len() == 1 && te[0].trim_ascii().eq_ignore_ascii_case(b"chunked");
            if !chunked_only {
                return Err((
                    501,
                    "abx: only Transfer-Encoding: chunked is forwarded.\n".into(),
                ));
            }
            Body::Chunked
        } else if let Some(first) = cl.first() {
            if cl.iter().any(|v| v != first)
                || first.is_empty()
                || first.len() > 18
                || !first.iter().all(u8::is_ascii_digit)
            {
                return Err(bad("a malformed Content-Length"));
            }
            let n: u64 = std::str::from_utf8(first)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("a malformed Content-Length"))?;
            if n == 0 {
                Body::None
            } else {
                Body::Length(n)
            }
        } else {
            Body::None
        };
        Ok(body)
    }
}

/// The headers the client's `Connection` header names (hop-by-hop too; never the framing).
pub(crate) fn connection_named(h: &http::Head<'_>) -> Vec<String> {
    h.values("connection")
        .flat_map(|v| v.split(|&b| b == b','))
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
        .filter(|t| t != "content-length" && t != "transfer-encoding")
        .collect()
}

/// The response head with `Connection: close` (the proxy serves one request per connection);
/// whether it is informational (1xx but 101: another head follows).
pub(crate) fn rewrite_response(b: &[u8]) -> Result<(Vec<u8>, bool), &'static str> {
    let h = http::parse_head(b)?;
    if !h.first.starts_with("HTTP/1.")
        || h.second.len() != 3
        || !h.second.bytes().all(|c| c.is_ascii_digit())
    {
        return Err("not an HTTP/1.x response");
    }
    let informational = h.second.starts_with('1') && h.second != "101";
    if h.second == "101" {
        return Err("a protocol switch (use CONNECT for WebSockets)");
    }
    let mut out = Vec::with_capacity(b.len() + 32);
    out.extend_from_slice(h.first.as_bytes());
    out.push(b' ');
    out.extend_from_slice(h.second.as_bytes());
    out.push(b' ');
    out.extend_from_slice(h.third.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (k, v) in &h.headers {
        let lk = k.to_ascii_lowercase();
        if !informational
            && matches!(
                lk.as_str(),
                "connection" | "keep-alive" | "proxy-connection"
            )
        {
            continue;
        }
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    if !informational {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok((out, informational))
}

/// Forward a chunked body as it is, chunk by chunk: size lines and trailers are at most 4 KiB
/// each (16 KiB of trailers), chunk data is streamed.
pub(crate) async fn copy_chunked<R, W>(r: &mut R, w: &mut W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let mut line = Vec::with_capacity(64);
    loop {
        read_line(r, &mut line, 4096).await?;
        w.write_all(&line).await?;
        let text = line.trim_ascii_end();
        let size_s = text
            .split(|&b| b == b';')
            .next()
            .unwrap_or(b"")
            .trim_ascii();
        if size_s.is_empty() || size_s.len() > 15 || !size_s.iter().all(u8::is_ascii_hexdigit) {
            return Err(bad("a malformed chunk size"));
        }
        let size = u64::from_str_radix(
            std::str::from_utf8(size_s).map_err(|_| bad("chunk size"))?,
            16,
        )
        .map_err(|_| bad("chunk size"))?;
        if size == 0 {
            // Trailers, then the blank line.
            let mut total = 0usize;
            loop {
                read_line(r, &mut line, 4096).await?;
                total += line.len();
                if total > 16 * 1024 {
                    return Err(bad("trailers too large"));
                }
                w.write_all(&line).await?;
                if line.trim_ascii().is_empty() {
                    return w.flush().await;
                }
            }
        }
        let mut data = (&mut *r).take(size + 2);
        let n = tokio::io::copy(&mut data, w).await?;
        if n < size + 2 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// One line (through `\n`) into `line`, at most `max` bytes. Read a byte at a time: nothing
/// past the line may be taken from the unbuffered reader (chunk size lines are a few bytes;
/// the chunks' data is copied in bulk).
pub(crate) async fn read_line<R: AsyncRead + Unpin>(
    r: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<()> {
    line.clear();
    let mut b = [0u8; 1];
    loop {
        if r.read(&mut b).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        line.push(b[0]);
        if b[0] == b'\n' {
            return Ok(());
        }
        if line.len() >= max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a line too long",
            ));
        }
    }
}

/// Whom an exchange is for (the sandbox and upstream named in the log and messages) and
/// its bounds (the proxy's [`crate::Limits`]).
pub(crate) struct Exchange<'a> {
    pub(crate) sandbox: &'a str,
    pub(crate) host: &'a str,
    /// Nothing moving either way this long ends it.
    pub(crate) idle: Duration,
    /// The largest response head.
    pub(crate) response_head_max: usize,
}

/// Send one request (its head, then its body as framed, from `early` then the client) to
/// `upstream`, and its response back. The head is zeroed once written (it may carry secrets).
pub(crate) async fn exchange<S, U>(
    to: Exchange<'_>,
    mut client: S,
    upstream: U,
    mut head: Vec<u8>,
    body: Body,
    early: Vec<u8>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    struct Req<'a> {
        host: &'a str,
        body: Body,
    }
    let Exchange {
        sandbox,
        host,
        idle,
        response_head_max,
    } = to;
    let req = Req { host, body };
    let (up_r, mut up_w) = tokio::io::split(upstream);
    let sent_head = up_w.write_all(&head).await;
    {
        use zeroize::Zeroize;
        head.zeroize(); // written: not held for the connection's life
        head = Vec::new();
    }
    drop(head);
    if sent_head.is_err() {
        let _ = answer(
            &mut client,
            502,
            "Bad Gateway",
            "abx: the upstream closed.\n",
            &[],
        )
        .await;
        return;
    }
    // One idle clock for both directions: a read from the client or the upstream moves it.
    let last = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let (client_r, mut client_w) = tokio::io::split(client);
    let mut body_src = Idle::with_clock(
        std::io::Cursor::new(early).chain(client_r),
        last.clone(),
        epoch,
    );
    let mut up_r = Idle::with_clock(up_r, last.clone(), epoch);
    let result = {
        let send = async {
            match req.body {
                Body::None => Ok(()),
                Body::Length(n) => {
                    let mut limited = (&mut body_src).take(n);
                    let copied = tokio::io::copy(&mut limited, &mut up_w).await?;
                    if copied < n {
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short body"));
                    }
                    Ok(())
                }
                Body::Chunked => copy_chunked(&mut body_src, &mut up_w).await,
            }
        };
        let max = response_head_max;
        let recv = async {
            let mut head = Vec::new();
            let mut carry: Vec<u8> = Vec::new();
            let mut started = false;
            loop {
                // Heads until a final one (1xx but 101 are followed by another).
                let mut src = std::io::Cursor::new(std::mem::take(&mut carry)).chain(&mut up_r);
                let read = http::read_head(&mut src, &mut head, max).await;
                let (cursor, _) = src.into_inner();
                let unread =
                    &cursor.get_ref()[(cursor.position() as usize).min(cursor.get_ref().len())..];
                let n = read.map_err(|e| {
                    let e = match e {
                        HeadError::Io(e) => e,
                        HeadError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, "closed"),
                        HeadError::TooLarge => io::Error::other("response head too large"),
                    };
                    (started, e)
                })?;
                let (out, informational) =
                    rewrite_response(&head[..n]).map_err(|why| (started, io::Error::other(why)))?;
                client_w.write_all(&out).await.map_err(|e| (true, e))?;
                started = true;
                carry = head[n..].to_vec();
                carry.extend_from_slice(unread);
                if !informational {
                    client_w.write_all(&carry).await.map_err(|e| (true, e))?;
                    break;
                }
            }
            // Not held while the body streams.
            drop(head);
            drop(carry);
            let copied = tokio::io::copy(&mut up_r, &mut client_w).await;
            // An upstream that closes its TLS without close_notify ends its response as a
            // plain connection's close does.
            if let Err(e) = copied {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    return Err((true, e));
                }
            }
            let _ = client_w.shutdown().await;
            Ok::<(), (bool, io::Error)>(())
        };
        tokio::pin!(send);
        tokio::pin!(recv);
        let mut sent = false;
        loop {
            tokio::select! {
                r = &mut recv => break r,
                _ = idle_for(&last, epoch, idle) => {
                    tracing::debug!(sandbox = %sandbox, host = %req.host, "egress: idle for {idle:?}: closed");
                    return;
                }
                s = &mut send, if !sent => {
                    sent = true;
                    if let Err(e) = s {
                        tracing::debug!(sandbox = %sandbox, host = %req.host, "egress: request body: {e}");
                        return;
                    }
                }
            }
        }
    };
    if let Err((started, e)) = result {
        tracing::debug!(sandbox = %sandbox, host = %req.host, "egress: response: {e}");
        if !started {
            let _ = answer(
                &mut client_w,
                502,
                "Bad Gateway",
                &format!("abx: a bad response from {}: {e}.\n", req.host),
                &[],
            )
            .await;
        }
    }
}
