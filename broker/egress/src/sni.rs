//! The server name (SNI) of a TLS ClientHello, read by hand, bounded: the proxy reads the
//! first bytes a client sends through a CONNECT tunnel (never decrypting anything) and checks
//! that the name it asks the server for is the name it asked the proxy for.
//!
//! [`parse`] takes what was read so far (one or more TLS records: the ClientHello may span
//! records) and says whether more is needed. A ClientHello is at most [`MAX_HELLO`] bytes;
//! the caller reads at most [`MAX_READ`]. Std only (the fuzz crate compiles this file in).

use super::name;

/// The largest ClientHello handshake message accepted (real ones are 0.5 to 3 KiB; with
/// post-quantum key shares about 2 KiB).
pub const MAX_HELLO: usize = 16 * 1024;

/// The most bytes the caller reads before giving up on a ClientHello (records' headers
/// included).
pub const MAX_READ: usize = MAX_HELLO + 4 * 1024;

/// What the bytes so far are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hello {
    /// A prefix of a TLS ClientHello: read more.
    Incomplete,
    /// Not a TLS handshake record.
    NotTls,
    /// A TLS handshake that is not a valid ClientHello (or too large).
    Invalid(&'static str),
    /// A complete ClientHello; its server name, normalized ([`name::normalize`]) when it had
    /// one.
    Complete {
        /// The `server_name` extension's host name.
        sni: Option<String>,
    },
}

const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const MAX_RECORD: usize = 16 * 1024 + 256;

/// Read `buf` (the first bytes of a connection) as TLS records carrying a ClientHello.
pub fn parse(buf: &[u8]) -> Hello {
    // Reassemble the handshake bytes of whole records, at most MAX_HELLO + 4 of them.
    let mut hs = [0u8; 4];
    let mut hs_len = 0usize; // handshake bytes seen
    let mut need: Option<usize> = None; // handshake message total (4 + length), once known
    let mut body: Vec<u8> = Vec::new();
    let mut at = 0usize;
    loop {
        let Some(head) = buf.get(at..at + 5) else {
            if at == 0 && !buf.is_empty() && buf[0] != RECORD_HANDSHAKE {
                return Hello::NotTls;
            }
            return Hello::Incomplete;
        };
        if head[0] != RECORD_HANDSHAKE {
            return if at == 0 {
                Hello::NotTls
            } else {
                Hello::Invalid("a record other than a handshake inside the ClientHello")
            };
        }
        if head[1] != 3 {
            return if at == 0 {
                Hello::NotTls
            } else {
                Hello::Invalid("a record of another version")
            };
        }
        let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
        if len == 0 || len > MAX_RECORD {
            return Hello::Invalid("a record length out of range");
        }
        let Some(frag) = buf.get(at + 5..at + 5 + len) else {
            return Hello::Incomplete;
        };
        at += 5 + len;
        for &b in frag {
            if hs_len < 4 {
                hs[hs_len] = b;
                hs_len += 1;
                if hs_len == 4 {
                    if hs[0] != HANDSHAKE_CLIENT_HELLO {
                        return Hello::Invalid("the first handshake message is not a ClientHello");
                    }
                    let l =
                        (usize::from(hs[1]) << 16) | (usize::from(hs[2]) << 8) | usize::from(hs[3]);
                    if l > MAX_HELLO {
                        return Hello::Invalid("a ClientHello larger than 16 KiB");
                    }
                    need = Some(4 + l);
                    body.reserve_exact(l);
                }
                continue;
            }
            if need.is_some_and(|n| hs_len < n) {
                body.push(b);
                hs_len += 1;
            } else {
                break;
            }
        }
        if let Some(n) = need {
            if hs_len >= n {
                return client_hello(&body);
            }
        }
    }
}

/// A cursor over bytes that never reads past its end.
struct Cur<'a> {
    b: &'a [u8],
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }
}

fn client_hello(body: &[u8]) -> Hello {
    match read_hello(body) {
        Ok(sni) => Hello::Complete { sni },
        Err(why) => Hello::Invalid(why),
    }
}

fn read_hello(body: &[u8]) -> Result<Option<String>, &'static str> {
    const SHORT: &str = "a truncated ClientHello";
    let mut c = Cur { b: body };
    let version = c.u16().ok_or(SHORT)?;
    if version >> 8 != 3 {
        return Err("a ClientHello of another protocol version");
    }
    c.take(32).ok_or(SHORT)?; // random
    let session = c.vec8().ok_or(SHORT)?;
    if session.len() > 32 {
        return Err("a session id longer than 32 bytes");
    }
    let suites = c.vec16().ok_or(SHORT)?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err("a malformed cipher suite list");
    }
    let compression = c.vec8().ok_or(SHORT)?;
    if compression.is_empty() {
        return Err("an empty compression method list");
    }
    if c.b.is_empty() {
        return Ok(None); // no extensions at all
    }
    let mut exts = Cur {
        b: c.vec16().ok_or(SHORT)?,
    };
    if !c.b.is_empty() {
        return Err("bytes after the extensions");
    }
    let mut sni = None;
    while !exts.b.is_empty() {
        let kind = exts.u16().ok_or(SHORT)?;
        let data = exts.vec16().ok_or(SHORT)?;
        if kind != EXT_SERVER_NAME {
            continue;
        }
        if sni.is_some() {
            return Err("two server_name extensions");
        }
        sni = Some(server_name(data)?);
    }
    Ok(sni.flatten())
}

fn server_name(data: &[u8]) -> Result<Option<String>, &'static str> {
    const BAD: &str = "a malformed server_name extension";
    let mut c = Cur { b: data };
    let mut list = Cur {
        b: c.vec16().ok_or(BAD)?,
    };
    if !c.b.is_empty() {
        return Err(BAD);
    }
    let mut host = None;
    while !list.b.is_empty() {
        let kind = list.u8().ok_or(BAD)?;
        let name = list.vec16().ok_or(BAD)?;
        if kind != 0 {
            continue; // not host_name (none other is defined)
        }
        if host.is_some() {
            return Err("two host names in server_name");
        }
        let s = std::str::from_utf8(name).map_err(|_| "a server name that is not ASCII")?;
        host = Some(name::normalize(s).map_err(|_| "a server name that is not a host name")?);
    }
    if host.is_none() {
        return Err("a server_name extension without a host name");
    }
    Ok(host)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ClientHello carrying `sni` (or none), as one handshake message.
    pub(crate) fn hello_message(sni: Option<&str>, extra_ext: usize) -> Vec<u8> {
        let mut exts = vec![];
        if let Some(s) = sni {
            let mut list = vec![0u8];
            list.extend_from_slice(&(s.len() as u16).to_be_bytes());
            list.extend_from_slice(s.as_bytes());
            let mut ext = (list.len() as u16).to_be_bytes().to_vec();
            ext.extend_from_slice(&list);
            exts.extend_from_slice(&0u16.to_be_bytes());
            exts.extend_from_slice(&(ext.len() as u16).to_be_bytes());
            exts.extend_from_slice(&ext);
        }
        if extra_ext > 0 {
            exts.extend_from_slice(&21u16.to_be_bytes()); // padding
            exts.extend_from_slice(&(extra_ext as u16).to_be_bytes());
            exts.extend(std::iter::repeat_n(0, extra_ext));
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut msg = vec![1];
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        msg
    }

    /// `msg` cut into records of at most `chunk` bytes.
    pub(crate) fn records(msg: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = vec![];
        for c in msg.chunks(chunk) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(c.len() as u16).to_be_bytes());
            out.extend_from_slice(c);
        }
        out
    }

    #[test]
    fn the_server_name_is_read_whole_or_across_records() {
        let msg = hello_message(Some("Allowed.Example."), 0);
        for chunk in [msg.len(), 100, 7, 1] {
            let rec = records(&msg, chunk);
            assert_eq!(
                parse(&rec),
                Hello::Complete {
                    sni: Some("allowed.example".into())
                },
                "chunk {chunk}"
            );
            for cut in 0..rec.len() {
                assert_eq!(
                    parse(&rec[..cut]),
                    Hello::Incomplete,
                    "chunk {chunk} cut {cut}"
                );
            }
        }
        assert_eq!(
            parse(&records(&hello_message(None, 0), 1000)),
            Hello::Complete { sni: None }
        );
        // Bytes after the ClientHello (a client sending early data) do not matter.
        let mut rec = records(&msg, 1000);
        rec.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert!(matches!(parse(&rec), Hello::Complete { .. }));
    }

    #[test]
    fn anything_else_is_refused_without_panicking() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(parse(b"G"), Hello::NotTls);
        assert_eq!(parse(b"SSH-2.0-x\r\n"), Hello::NotTls);
        assert_eq!(
            parse(&[22, 3, 1, 0, 0]),
            Hello::Invalid("a record length out of range")
        );
        let big = hello_message(Some("a.example"), MAX_HELLO);
        assert!(matches!(parse(&records(&big, 16384)), Hello::Invalid(_)));
        let bad_name = hello_message(Some("a b"), 0);
        assert!(matches!(
            parse(&records(&bad_name, 1000)),
            Hello::Invalid(_)
        ));
        let msg = hello_message(Some("a.example"), 0);
        for i in 0..msg.len() {
            let mut m = msg.clone();
            m[i] ^= 0xff;
            let _ = parse(&records(&m, 1000));
            let _ = parse(&records(&msg[..i], 1000));
        }
    }
}
