//! The two framings of the wire (docs/design.md#wire) as one tokio-util codec.
//!
//! The framing is detected from the first non-blank byte of a connection: `{` or `[` means
//! newline-delimited JSON, `C`/`c` means LSP `Content-Length:` headers; anything else is
//! taken as lines, so garbage gets a parse error per line and the connection lives on.
//! Replies use the framing the client chose.
//!
//! A message above the size limit never grows the buffer past the limit: the decoder yields
//! [`Frame::TooLarge`] at once and then discards the rest of that message (to the next
//! newline, or the declared Content-Length), so the connection stays usable. A header block
//! that cannot be parsed loses the framing: that is an `Err`, and the caller closes.
//!
//! The decoder never grows the buffer itself (a declared `Content-Length` allocates
//! nothing): whoever reads into it decides how much it may hold. [`FrameCodec::partial`]
//! tells that reader what the message in progress needs (its declared size, or unknown
//! until a line ends), so it can count those bytes in a budget before it reads them
//! (`abx_core::conn`: issue 42).

use bytes::{Buf, BytesMut};
use std::io;
use tokio_util::codec::{Decoder, Encoder};

/// 64 MiB, the default limit of one message (docs/design.md#wire).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// Longest header block accepted in Content-Length framing.
const MAX_HEADER_BLOCK: usize = 8 * 1024;

/// How messages are delimited on a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// One JSON message per line.
    Line,
    /// LSP-style `Content-Length: N\r\n\r\n` then N bytes.
    Header,
}

impl Framing {
    /// Guess the framing from the first non-blank byte.
    pub fn detect(first: u8) -> Framing {
        match first {
            b'C' | b'c' => Framing::Header,
            _ => Framing::Line,
        }
    }

    /// Append `body` framed to `dst`.
    pub fn write(self, body: &[u8], dst: &mut BytesMut) {
        match self {
            Framing::Line => {
                dst.reserve(body.len() + 1);
                dst.extend_from_slice(body);
                dst.extend_from_slice(b"\n");
            }
            Framing::Header => {
                let header = format!("Content-Length: {}\r\n\r\n", body.len());
                dst.reserve(header.len() + body.len());
                dst.extend_from_slice(header.as_bytes());
                dst.extend_from_slice(body);
            }
        }
    }
}

/// What the decoder knows of the message it is in the middle of (see
/// [`FrameCodec::partial`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Partial {
    /// Between messages, or throwing a too-large one away: the buffer needs to hold nothing
    /// beyond what a read brings.
    Nothing,
    /// A line whose end has not come, or a header block (at most 8 KiB): its size is not
    /// known until it ends.
    Unknown,
    /// A `Content-Length` body of this many bytes (within the limit), of which the buffer
    /// holds the start.
    Body(usize),
}

/// What the decoder yields.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// One complete message body (a JSON object or batch, not yet parsed).
    Message(BytesMut),
    /// A message above the limit; its bytes are being discarded.
    TooLarge {
        /// Its declared size, where the framing tells it (Content-Length).
        size: Option<usize>,
    },
}

#[derive(Debug)]
enum State {
    Detect,
    /// Scanning for a newline; `scanned` bytes already checked.
    Line {
        scanned: usize,
    },
    /// Throwing a too-long line away up to its newline.
    LineDiscard,
    /// Reading a header block.
    Headers,
    /// Reading a body of `len` bytes.
    Body {
        len: usize,
    },
    /// Throwing `remaining` body bytes away.
    BodyDiscard {
        remaining: usize,
    },
}

/// A codec for both framings, with per-connection detection and a size limit.
#[derive(Debug)]
pub struct FrameCodec {
    framing: Option<Framing>,
    /// Framing used to encode; fixed when set, else follows detection (default Line).
    out_framing: Option<Framing>,
    max: usize,
    state: State,
}

impl FrameCodec {
    /// Detect the framing from the first byte; limit messages to `max` bytes.
    pub fn new(max: usize) -> Self {
        FrameCodec {
            framing: None,
            out_framing: None,
            max,
            state: State::Detect,
        }
    }

    /// A codec with a fixed framing (for the side that speaks first).
    pub fn with_framing(framing: Framing, max: usize) -> Self {
        FrameCodec {
            framing: Some(framing),
            out_framing: Some(framing),
            max,
            state: match framing {
                Framing::Line => State::Line { scanned: 0 },
                Framing::Header => State::Headers,
            },
        }
    }

    /// The detected (or fixed) framing, once known.
    pub fn framing(&self) -> Option<Framing> {
        self.framing
    }

    /// The message size limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// What the message in progress needs the buffer to hold (after [`Decoder::decode`]
    /// returned `None`): nothing more, an unknown amount (a line, a header block), or a body
    /// of a known size.
    pub fn partial(&self) -> Partial {
        match self.state {
            State::Detect | State::LineDiscard | State::BodyDiscard { .. } => Partial::Nothing,
            State::Line { .. } | State::Headers => Partial::Unknown,
            State::Body { len } => Partial::Body(len),
        }
    }

    fn parse_headers(&self, block: &[u8]) -> io::Result<usize> {
        let text = std::str::from_utf8(block)
            .map_err(|_| bad("header block is not UTF-8 (framing lost)"))?;
        let mut len = None;
        for line in text.split('\n') {
            let line = line.trim_end_matches('\r');
            if line.is_empty() {
                continue;
            }
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| bad(&format!("malformed header line {line:?} (framing lost)")))?;
            if name.trim().eq_ignore_ascii_case("content-length") {
                len = Some(value.trim().parse::<usize>().map_err(|_| {
                    bad(&format!(
                        "invalid Content-Length {:?} (framing lost)",
                        value.trim()
                    ))
                })?);
            }
        }
        len.ok_or_else(|| bad("missing Content-Length header (framing lost)"))
    }
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

fn find_header_end(buf: &[u8]) -> Option<(usize, usize)> {
    // Returns (end of header block, start of body). Accepts \r\n\r\n and \n\n.
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'\n' {
            if buf.get(i + 1) == Some(&b'\n') {
                return Some((i, i + 2));
            }
            if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                return Some((i, i + 3));
            }
        }
        i += 1;
    }
    None
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> io::Result<Option<Frame>> {
        loop {
            match self.state {
                State::Detect => {
                    let skip = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
                    buf.advance(skip);
                    let Some(&first) = buf.first() else {
                        return Ok(None);
                    };
                    let f = Framing::detect(first);
                    self.framing = Some(f);
                    self.state = match f {
                        Framing::Line => State::Line { scanned: 0 },
                        Framing::Header => State::Headers,
                    };
                }
                State::Line { scanned } => {
                    match memchr(b'\n', &buf[scanned..]) {
                        Some(pos) => {
                            let mut line = buf.split_to(scanned + pos + 1);
                            self.state = State::Line { scanned: 0 };
                            line.truncate(line.len() - 1);
                            if line.last() == Some(&b'\r') {
                                line.truncate(line.len() - 1);
                            }
                            if line.iter().all(|b| b.is_ascii_whitespace()) {
                                continue; // blank lines are keep-alives
                            }
                            if line.len() > self.max {
                                return Ok(Some(Frame::TooLarge {
                                    size: Some(line.len()),
                                }));
                            }
                            return Ok(Some(Frame::Message(line)));
                        }
                        None if buf.len() > self.max => {
                            buf.clear();
                            self.state = State::LineDiscard;
                            return Ok(Some(Frame::TooLarge { size: None }));
                        }
                        None => {
                            self.state = State::Line { scanned: buf.len() };
                            return Ok(None);
                        }
                    }
                }
                State::LineDiscard => match memchr(b'\n', buf) {
                    Some(pos) => {
                        buf.advance(pos + 1);
                        self.state = State::Line { scanned: 0 };
                    }
                    None => {
                        buf.clear();
                        return Ok(None);
                    }
                },
                State::Headers => {
                    let skip = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
                    buf.advance(skip);
                    match find_header_end(buf) {
                        Some((end, body_start)) => {
                            let len = self.parse_headers(&buf[..end])?;
                            buf.advance(body_start);
                            if len > self.max {
                                self.state = State::BodyDiscard { remaining: len };
                                return Ok(Some(Frame::TooLarge { size: Some(len) }));
                            }
                            self.state = State::Body { len };
                        }
                        None if buf.len() > MAX_HEADER_BLOCK => {
                            return Err(bad("header block too long (framing lost)"));
                        }
                        None => return Ok(None),
                    }
                }
                State::Body { len } => {
                    // Not reserved here: the reader grows the buffer, once it has counted
                    // what the body will hold (a declared length alone allocates nothing).
                    if buf.len() < len {
                        return Ok(None);
                    }
                    let body = buf.split_to(len);
                    self.state = State::Headers;
                    return Ok(Some(Frame::Message(body)));
                }
                State::BodyDiscard { remaining } => {
                    let n = remaining.min(buf.len());
                    buf.advance(n);
                    if n == remaining {
                        self.state = State::Headers;
                    } else {
                        self.state = State::BodyDiscard {
                            remaining: remaining - n,
                        };
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> io::Result<Option<Frame>> {
        if let Some(frame) = self.decode(buf)? {
            return Ok(Some(frame));
        }
        match self.state {
            // A last line without its newline is still a message (`printf '{...}' | abx rpc`).
            State::Line { .. } if !buf.iter().all(|b| b.is_ascii_whitespace()) => {
                let line = buf.split();
                self.state = State::Line { scanned: 0 };
                Ok(Some(Frame::Message(line)))
            }
            State::Body { .. } | State::Headers if !buf.iter().all(|b| b.is_ascii_whitespace()) => {
                buf.clear();
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed in the middle of a message",
                ))
            }
            _ => {
                buf.clear();
                Ok(None)
            }
        }
    }
}

impl<T: AsRef<[u8]>> Encoder<T> for FrameCodec {
    type Error = io::Error;

    fn encode(&mut self, body: T, dst: &mut BytesMut) -> io::Result<()> {
        let f = self.out_framing.or(self.framing).unwrap_or(Framing::Line);
        f.write(body.as_ref(), dst);
        Ok(())
    }
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(codec: &mut FrameCodec, input: &[u8]) -> Vec<Frame> {
        let mut buf = BytesMut::from(input);
        let mut out = vec![];
        while let Some(f) = codec.decode(&mut buf).unwrap() {
            out.push(f);
        }
        while let Some(f) = codec.decode_eof(&mut buf).unwrap() {
            out.push(f);
        }
        out
    }

    fn msg(s: &str) -> Frame {
        Frame::Message(BytesMut::from(s.as_bytes()))
    }

    #[test]
    fn lines() {
        let mut c = FrameCodec::new(100);
        let got = all(&mut c, b"\n {\"a\":1}\r\n\n[1]\n{\"tail\":0}");
        assert_eq!(c.framing(), Some(Framing::Line));
        assert_eq!(got, vec![msg("{\"a\":1}"), msg("[1]"), msg("{\"tail\":0}")]);
    }

    #[test]
    fn headers() {
        let mut c = FrameCodec::new(100);
        let got = all(
            &mut c,
            b"Content-Length: 7\r\nContent-Type: x\r\n\r\n{\"a\":1}content-length:2\n\n[]",
        );
        assert_eq!(c.framing(), Some(Framing::Header));
        assert_eq!(got, vec![msg("{\"a\":1}"), msg("[]")]);
    }

    #[test]
    fn byte_at_a_time() {
        let input = b"Content-Length: 7\r\n\r\n{\"a\":1}Content-Length: 2\r\n\r\n{}";
        let mut c = FrameCodec::new(100);
        let mut buf = BytesMut::new();
        let mut out = vec![];
        for &b in input.iter() {
            buf.extend_from_slice(&[b]);
            while let Some(f) = c.decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        assert_eq!(out, vec![msg("{\"a\":1}"), msg("{}")]);
    }

    #[test]
    fn too_large_line_is_skipped_and_connection_survives() {
        let mut c = FrameCodec::new(10);
        let mut input = vec![b'{'];
        input.extend(std::iter::repeat_n(b'x', 50));
        input.extend_from_slice(b"\n{\"ok\":1}\n");
        let mut buf = BytesMut::new();
        let mut out = vec![];
        for chunk in input.chunks(7) {
            buf.extend_from_slice(chunk);
            while let Some(f) = c.decode(&mut buf).unwrap() {
                out.push(f);
            }
            assert!(buf.len() <= 18, "buffer bounded, was {}", buf.len());
        }
        assert_eq!(out, vec![Frame::TooLarge { size: None }, msg("{\"ok\":1}")]);
    }

    #[test]
    fn too_large_body_is_skipped() {
        let mut c = FrameCodec::new(4);
        let got = all(
            &mut c,
            b"Content-Length: 6\r\n\r\n{\"a\":}Content-Length: 2\r\n\r\n{}",
        );
        assert_eq!(got, vec![Frame::TooLarge { size: Some(6) }, msg("{}")]);
    }

    #[test]
    fn bad_headers_lose_framing() {
        let mut c = FrameCodec::new(100);
        let mut buf = BytesMut::from(&b"Content-Length: x\r\n\r\n{}"[..]);
        assert!(c.decode(&mut buf).is_err());
        let mut c = FrameCodec::new(100);
        let mut buf = BytesMut::from(&b"Content-Type: a\r\n\r\n{}"[..]);
        assert!(c.decode(&mut buf).is_err());
    }

    #[test]
    fn truncated_body_at_eof_is_an_error() {
        let mut c = FrameCodec::new(100);
        let mut buf = BytesMut::from(&b"Content-Length: 10\r\n\r\n{\"a\""[..]);
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        assert!(c.decode_eof(&mut buf).is_err());
    }

    /// What the message in progress needs is known before it is read: a body's declared
    /// size (nothing allocated for it), or unknown until a line ends.
    #[test]
    fn the_message_in_progress_says_what_it_needs() {
        let mut c = FrameCodec::new(1 << 20);
        let mut buf = BytesMut::from(&b"Content-Length: 900000\r\n\r\n{\"a\""[..]);
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        assert_eq!(c.partial(), Partial::Body(900_000));
        assert!(
            buf.capacity() < 900_000,
            "a declared length allocates nothing"
        );
        let mut c = FrameCodec::new(1 << 20);
        let mut buf = BytesMut::from(&b"{\"a\":"[..]);
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        assert_eq!(c.partial(), Partial::Unknown);
        let mut c = FrameCodec::new(4);
        let mut buf = BytesMut::from(&b"Content-Length: 9\r\n\r\n{"[..]);
        assert!(matches!(
            c.decode(&mut buf).unwrap(),
            Some(Frame::TooLarge { .. })
        ));
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        assert_eq!(c.partial(), Partial::Nothing);
        assert_eq!(FrameCodec::new(4).partial(), Partial::Nothing);
    }

    #[test]
    fn encode_both() {
        let mut out = BytesMut::new();
        Framing::Header.write(b"{}", &mut out);
        Framing::Line.write(b"{}", &mut out);
        assert_eq!(&out[..], b"Content-Length: 2\r\n\r\n{}{}\n");
    }
}
