//! The HTTP/1.x heads the proxy reads: bounded, read as they come, never buffered past the
//! cap, parsed without allocation beyond the header list.

use std::io;
use tokio::io::{AsyncRead, AsyncReadExt};

/// At most this many header lines in one head.
pub const MAX_HEADERS: usize = 128;

/// Why a head could not be read.
#[derive(Debug)]
pub enum HeadError {
    /// The peer closed before a whole head (nothing, or part of one).
    Closed,
    /// More than the cap without the end of the head.
    TooLarge,
    /// A read failed.
    Io(io::Error),
}

/// Read until the end of a head (`\r\n\r\n`, or `\n\n`) into `buf` (emptied first), never
/// holding more than `cap` bytes. Returns the head's length; what follows it in `buf` was
/// read past it (a body's start, a ClientHello sent early).
pub async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<usize, HeadError> {
    buf.clear();
    buf.reserve_exact(cap.min(4096));
    let mut searched = 0usize;
    loop {
        if buf.len() >= cap {
            return Err(HeadError::TooLarge);
        }
        let room = (cap - buf.len()).min(4096);
        let start = buf.len();
        buf.resize(start + room, 0);
        let n = match r.read(&mut buf[start..]).await {
            Ok(n) => n,
            Err(e) => {
                buf.truncate(start);
                return Err(HeadError::Io(e));
            }
        };
        buf.truncate(start + n);
        if n == 0 {
            return Err(HeadError::Closed);
        }
        if let Some(end) = head_end(buf, searched) {
            return Ok(end);
        }
        searched = buf.len().saturating_sub(3);
    }
}

/// The end of a head in `b` (just after its blank line), looking from `from`.
pub fn head_end(b: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < b.len() {
        if b[i] == b'\n' {
            if b.get(i + 1) == Some(&b'\n') {
                return Some(i + 2);
            }
            if b.get(i + 1) == Some(&b'\r') && b.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

/// A parsed head: the start line's three parts and the headers, borrowed.
#[derive(Debug)]
pub struct Head<'a> {
    /// Method (requests) or version (responses).
    pub first: &'a str,
    /// Target (requests) or status code (responses).
    pub second: &'a str,
    /// Version (requests) or reason (responses, may be empty or not UTF-8: then empty).
    pub third: &'a str,
    /// `(name, value)`, values without surrounding whitespace.
    pub headers: Vec<(&'a str, &'a [u8])>,
}

impl<'a> Head<'a> {
    /// Every value of header `name` (case-insensitive).
    pub fn values<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a [u8]> + 's {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// Whether any header named `name` has `token` in its comma-separated list.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.values(name).any(|v| {
            v.split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
        })
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parse a head (`b` ends with its blank line). `Err` says what is malformed.
pub fn parse_head(b: &[u8]) -> Result<Head<'_>, &'static str> {
    let mut lines = b
        .split(|&c| c == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let start = lines.next().ok_or("an empty head")?;
    let start = std::str::from_utf8(start).map_err(|_| "a start line that is not ASCII")?;
    if !start.is_ascii() || start.bytes().any(|c| c.is_ascii_control()) {
        return Err("a start line with control characters");
    }
    let mut parts = start.splitn(3, ' ');
    let first = parts.next().unwrap_or("");
    let second = parts.next().ok_or("a start line without a target")?;
    let third = parts.next().unwrap_or("");
    if first.is_empty() || second.is_empty() {
        return Err("a malformed start line");
    }
    let mut headers = vec![];
    for line in lines {
        if line.is_empty() {
            break;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err("a folded header line");
        }
        let colon = line
            .iter()
            .position(|&c| c == b':')
            .ok_or("a header line without ':'")?;
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&c| is_tchar(c)) {
            return Err("a malformed header name");
        }
        let value = line[colon + 1..].trim_ascii();
        if value.iter().any(|&c| (c < 0x20 && c != b'\t') || c == 0x7f) {
            return Err("a header value with control characters");
        }
        if headers.len() == MAX_HEADERS {
            return Err("too many header lines");
        }
        // `name` is tchars: ASCII.
        let name = std::str::from_utf8(name).map_err(|_| "a malformed header name")?;
        headers.push((name, value));
    }
    Ok(Head {
        first,
        second,
        third,
        headers,
    })
}

/// A request target's destination.
#[derive(Debug, PartialEq, Eq)]
pub struct Authority<'a> {
    /// The host as written (brackets removed from an IPv6 literal).
    pub host: &'a str,
    /// The port (the default when none is written).
    pub port: u16,
}

/// `host[:port]` or `[v6][:port]`; `default` when the port is absent (`None`: required).
pub fn authority(s: &str, default: Option<u16>) -> Result<Authority<'_>, &'static str> {
    if s.contains('@') {
        return Err("credentials in the target");
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or("a '[' without ']'")?;
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or("a malformed port")?)),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err("an IPv6 address without brackets"),
            None => (s, None),
        }
    };
    let port = match port {
        Some(p) => {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err("a malformed port");
            }
            match p.parse::<u16>() {
                Ok(n) if n > 0 => n,
                _ => return Err("a port out of range"),
            }
        }
        None => default.ok_or("a target without a port")?,
    };
    if host.is_empty() {
        return Err("an empty host");
    }
    Ok(Authority { host, port })
}

/// `http://authority/path?query` split into its authority and its origin-form (`/` when the
/// path is empty). `Err` for other schemes and malformed URLs.
pub fn absolute_http(target: &str) -> Result<(&str, String), &'static str> {
    let rest = match target.get(..7) {
        Some(s) if s.eq_ignore_ascii_case("http://") => &target[7..],
        _ => {
            if target
                .get(..8)
                .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
            {
                return Err("https:// through a plain proxy request (use CONNECT)");
            }
            return Err("not an absolute http:// URL");
        }
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(end);
    let path = path.split('#').next().unwrap_or("");
    let origin = if path.is_empty() {
        "/".to_string()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Ok((auth, origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn heads_are_read_within_the_cap_and_keep_what_follows() {
        let mut buf = vec![];
        let mut r: &[u8] = b"GET http://a.example/ HTTP/1.1\r\nHost: a\r\n\r\nBODY";
        let n = read_head(&mut r, &mut buf, 1024).await.unwrap();
        assert_eq!(&buf[n..], b"BODY");
        let mut r: &[u8] = &[b'a'; 5000];
        assert!(matches!(
            read_head(&mut r, &mut buf, 1024).await,
            Err(HeadError::TooLarge)
        ));
        assert!(buf.len() <= 1024);
        let mut r: &[u8] = b"GET / HTTP/1.1\r\n";
        assert!(matches!(
            read_head(&mut r, &mut buf, 1024).await,
            Err(HeadError::Closed)
        ));
    }

    #[test]
    fn heads_targets_and_authorities_parse() {
        let h = parse_head(b"GET http://a.example/x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\n\r\n").unwrap();
        assert_eq!(
            (h.first, h.second, h.third),
            ("GET", "http://a.example/x", "HTTP/1.1")
        );
        assert!(h.has_token("connection", "upgrade"));
        assert!(parse_head(b"GET / HTTP/1.1\r\n folded\r\n\r\n").is_err());
        assert!(parse_head(b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n").is_err());
        assert!(parse_head(b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n").is_err());
        assert!(parse_head(b"GET\r\n\r\n").is_err());
        assert_eq!(
            authority("a.example:443", None).unwrap(),
            Authority {
                host: "a.example",
                port: 443
            }
        );
        assert_eq!(
            authority("[::1]:8080", None).unwrap(),
            Authority {
                host: "::1",
                port: 8080
            }
        );
        assert_eq!(authority("a.example", Some(80)).unwrap().port, 80);
        for bad in [
            "a.example",
            "a.example:0",
            "a.example:99999",
            "::1:443",
            "u@a.example:443",
            ":443",
            "a:b",
        ] {
            assert!(authority(bad, None).is_err(), "{bad}");
        }
        assert_eq!(
            absolute_http("http://a.example").unwrap(),
            ("a.example", "/".into())
        );
        assert_eq!(
            absolute_http("HTTP://a.example:8080/p?q#f").unwrap(),
            ("a.example:8080", "/p?q".into())
        );
        assert_eq!(
            absolute_http("http://a.example?q").unwrap(),
            ("a.example", "/?q".into())
        );
        assert!(absolute_http("https://a.example/").is_err());
        assert!(absolute_http("/path").is_err());
    }
}
