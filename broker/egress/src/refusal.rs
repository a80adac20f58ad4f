//! Refusals and the proxy's own answers: why a destination is refused ([`Refusal`]), the
//! 403's text (what was blocked, why, and how to allow it), and the short plain-text
//! answers the proxy writes itself (`answer`: 400, 403, 502, 503, 504 ...).

use crate::net::Refused;
use std::fmt::Write as _;
use std::io;
use std::net::IpAddr;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Why a destination is refused.
pub(crate) struct Refusal {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) reason: String,
    /// Whether a policy change can allow it (not for the guard's refusals).
    pub(crate) allowable: bool,
}

pub(crate) const NOT_ALLOWED: &str = "not allowed by the sandbox's network policy";

pub(crate) fn denied(entry: &str) -> String {
    format!("denied by the policy entry '{entry}'")
}

pub(crate) fn always(why: Refused, ip: Option<IpAddr>) -> String {
    match ip {
        Some(ip) => format!(
            "it resolves to {ip}, {}: always refused, no policy allows it",
            why.describe()
        ),
        None => format!("{}: always refused, no policy allows it", why.describe()),
    }
}

/// The 403's text: what was blocked, why, and how to allow it.
pub(crate) fn forbidden_body(sandbox: &str, r: &Refusal) -> String {
    let mut s = format!(
        "abx: {}:{} is blocked for sandbox {sandbox}: {}.\n",
        r.host, r.port, r.reason
    );
    if r.allowable {
        let pattern = if r.port == 80 || r.port == 443 {
            r.host.clone()
        } else if r.host.contains(':') {
            format!("[{}]:{}", r.host, r.port)
        } else {
            format!("{}:{}", r.host, r.port)
        };
        let _ = write!(
            s,
            "To allow it (ask the user first):\n  abx network {sandbox} allow {pattern}     (this running sandbox)\n  abx run --allow {pattern} -- ...   (the CLI flag, at create; --network allow:{pattern})\n  {{\"network\": {{\"allow\": [\"{pattern}\"]}}}}   (the MCP sandbox_create `network` argument)\n"
        );
    }
    s
}

pub(crate) fn reason_of(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// `s` cut to 256 characters, escaped, for messages.
pub(crate) fn printable(s: &str) -> String {
    s.chars().take(256).flat_map(char::escape_debug).collect()
}

pub(crate) async fn answer<S: AsyncWrite + Unpin>(
    client: &mut S,
    status: u16,
    reason: &str,
    body: &str,
    extra: &[(&str, &str)],
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        let _ = write!(out, "{k}: {v}\r\n");
    }
    out.push_str("\r\n");
    out.push_str(body);
    client.write_all(out.as_bytes()).await?;
    client.flush().await?;
    client.shutdown().await
}
