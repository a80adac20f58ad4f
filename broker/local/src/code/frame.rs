//! What a code driver writes, as the daemon reads it: pure functions over bytes, shared with
//! the `code_frame` fuzz target (`fuzz/src/lib.rs` compiles this file as its own module, so
//! it uses nothing of this crate: std, serde, serde_json and abx-protocol only).
//!
//! A driver's stdout is raw bytes (output of child processes) and frames: a marker (`\x1f`
//! and the context's nonce), one JSON object, a newline. Everything here is untrusted (code
//! in the sandbox can write any bytes, frames included: the nonce is in its own process) and
//! bounded: the [`Splitter`] holds at most one partial frame of at most its `max` bytes and
//! drops a longer one as it streams in; a frame's envelope is read with its fields borrowed
//! from the frame's text ([`parse`]), never as a `Value` tree; a MIME bundle goes on to the
//! client as the JSON text it came as ([`output_body`]); whether a bundle may be parsed into
//! a tree for a reply is decided on an estimate of that tree's memory ([`tree_cost`]) made
//! before it is built.

use serde::Serialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Why a frame was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Longer than the splitter's `max`.
    TooLarge,
    /// The memory budget could not hold it ([`Splitter::abandon`]).
    Memory,
    /// The stream ended inside it.
    Cut,
}

/// What a frame seemed to be, from its first bytes (a dropped frame is never parsed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `{"t": "result", ...}`.
    Result,
    /// Anything else (`stdout`, `stderr`, `error`, ...).
    Other,
}

/// A frame that was dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// Its bytes (those seen: a frame cut by the end of the stream, or still streaming).
    pub bytes: usize,
    /// Why.
    pub why: Why,
    /// What it seemed to be.
    pub kind: Kind,
    /// Its newline was read (it ended; else the stream did, inside it).
    pub closed: bool,
}

/// What a [`Splitter`] finds in a pipe's bytes, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Bytes outside frames.
    Raw(Vec<u8>),
    /// A frame's JSON text (without its marker and newline).
    Frame(Vec<u8>),
    /// A frame that was not kept.
    Dropped(Dropped),
}

/// Bytes of a frame's head looked at to tell its [`Kind`].
const HEAD: usize = 64;

/// Splits a pipe's bytes into raw bytes and frames (marker .. newline), each byte looked at
/// about once however a frame is cut into reads. New bytes are appended to [`Splitter::buf`]
/// (by a read straight into it, or [`Splitter::push`]); [`Splitter::take`] then takes out
/// what is complete. A partial frame, or a tail that may begin a marker, waits for more
/// (unless at the end); a frame longer than `max` is dropped as it comes (never held whole):
/// the bytes up to its newline are discarded as they arrive.
pub struct Splitter {
    /// The bytes not taken yet: a partial frame (from its marker), or a tail that may begin
    /// one. Read into it directly.
    pub buf: Vec<u8>,
    mark: Vec<u8>,
    max: usize,
    /// `buf` starts with a frame's marker; no newline in `buf[..scanned]`.
    in_frame: bool,
    scanned: usize,
    /// Inside a dropped frame: bytes are discarded up to its newline (its first [`HEAD`]
    /// bytes kept, to tell its kind).
    dropping: Option<(Dropped, Vec<u8>)>,
}

impl Splitter {
    /// A splitter for frames behind `mark`, of at most `max` bytes each.
    pub fn new(mark: &[u8], max: usize) -> Splitter {
        Splitter {
            buf: Vec::new(),
            mark: mark.to_vec(),
            max,
            in_frame: false,
            scanned: 0,
            dropping: None,
        }
    }

    /// Frames longer than `max` are dropped from now on.
    pub fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    /// The longest frame kept.
    pub fn max(&self) -> usize {
        self.max
    }

    /// True while a dropped frame's bytes are being discarded.
    pub fn dropping(&self) -> bool {
        self.dropping.is_some()
    }

    /// True while `buf` holds the start of a frame.
    pub fn in_frame(&self) -> bool {
        self.in_frame
    }

    /// Drop the partial frame in `buf` (its memory could not be counted): its bytes up to
    /// its newline are discarded, then a [`Piece::Dropped`] says so.
    pub fn abandon(&mut self) {
        if self.in_frame {
            let m = self.mark.len().min(self.buf.len());
            self.start_dropping(m, Why::Memory);
        }
    }

    /// The frame in `buf` (behind `m` bytes of marker) is dropped: its first bytes kept to
    /// tell its kind, the rest discarded as it comes.
    fn start_dropping(&mut self, m: usize, why: Why) {
        let frame = &self.buf[m..];
        let d = Dropped {
            bytes: frame.len(),
            why,
            kind: Kind::Other,
            closed: false,
        };
        self.dropping = Some((d, frame[..frame.len().min(HEAD)].to_vec()));
        self.buf = Vec::new();
        (self.in_frame, self.scanned) = (false, 0);
    }

    /// The dropped frame, ended (its newline seen: `closed`) or cut by the end.
    fn dropped(&mut self, closed: bool) -> Piece {
        let (mut d, head) = self.dropping.take().expect("dropping");
        d.kind = kind_of(&head);
        d.closed = closed;
        Piece::Dropped(d)
    }

    /// Append `bytes` and take what is complete ([`Splitter::take`]).
    pub fn push(&mut self, bytes: &[u8], eof: bool) -> Vec<Piece> {
        self.buf.extend_from_slice(bytes);
        self.take(eof)
    }

    /// Take out of `buf` the pieces that are complete (all of them at the end: `eof`).
    pub fn take(&mut self, eof: bool) -> Vec<Piece> {
        let mut out = Vec::new();
        let m = self.mark.len();
        loop {
            if let Some((d, head)) = &mut self.dropping {
                let end = self.buf.iter().position(|&b| b == b'\n');
                let n = end.unwrap_or(self.buf.len());
                d.bytes += n;
                let more = (HEAD - head.len().min(HEAD)).min(n);
                head.extend_from_slice(&self.buf[..more]);
                match end {
                    Some(i) => {
                        self.buf.drain(..=i);
                        out.push(self.dropped(true));
                        continue;
                    }
                    None => {
                        self.buf.clear();
                        if eof {
                            out.push(self.dropped(false));
                        }
                        return out;
                    }
                }
            }
            if self.in_frame {
                let from = self.scanned.max(m);
                match self.buf[from..].iter().position(|&b| b == b'\n') {
                    Some(j) if from + j - m > self.max => {
                        // Whole in this read, and too long all the same.
                        out.push(Piece::Dropped(Dropped {
                            bytes: from + j - m,
                            why: Why::TooLarge,
                            kind: kind_of(&self.buf[m..from + j]),
                            closed: true,
                        }));
                        self.buf.drain(..=from + j);
                        (self.in_frame, self.scanned) = (false, 0);
                        continue;
                    }
                    Some(j) => {
                        let end = from + j;
                        // The frame is at the start of `buf`: it takes the buffer (no copy
                        // of it), the bytes after it go to a new one.
                        let rest = self.buf.split_off(end + 1);
                        let mut f = std::mem::replace(&mut self.buf, rest);
                        f.truncate(end);
                        f.drain(..m);
                        out.push(Piece::Frame(f));
                        (self.in_frame, self.scanned) = (false, 0);
                        continue;
                    }
                    None if eof => {
                        out.push(Piece::Dropped(Dropped {
                            bytes: self.buf.len() - m,
                            why: Why::Cut,
                            kind: kind_of(&self.buf[m..]),
                            closed: false,
                        }));
                        self.buf = Vec::new();
                        (self.in_frame, self.scanned) = (false, 0);
                        return out;
                    }
                    None if self.buf.len() - m > self.max => {
                        self.start_dropping(m, Why::TooLarge);
                        return out;
                    }
                    None => {
                        self.scanned = self.buf.len();
                        return out;
                    }
                }
            }
            match find(&self.buf, &self.mark) {
                Some(i) => {
                    if i > 0 {
                        out.push(Piece::Raw(self.buf[..i].to_vec()));
                        self.buf.drain(..i);
                    }
                    (self.in_frame, self.scanned) = (true, 0);
                }
                None => {
                    let keep = if eof {
                        0
                    } else {
                        (1..m.min(self.buf.len() + 1))
                            .rev()
                            .find(|&k| self.buf.ends_with(&self.mark[..k]))
                            .unwrap_or(0)
                    };
                    let upto = self.buf.len() - keep;
                    if upto > 0 {
                        if keep == 0 {
                            out.push(Piece::Raw(std::mem::take(&mut self.buf)));
                        } else {
                            out.push(Piece::Raw(self.buf[..upto].to_vec()));
                            self.buf.drain(..upto);
                        }
                    }
                    return out;
                }
            }
        }
    }
}

/// The [`Kind`] a frame's first bytes tell.
fn kind_of(frame: &[u8]) -> Kind {
    let head = &frame[..frame.len().min(HEAD)];
    if find(head, b"\"result\"").is_some() {
        Kind::Result
    } else {
        Kind::Other
    }
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    while let Some(i) = hay[from..].iter().position(|&b| b == first) {
        let at = from + i;
        if hay.len() - at < needle.len() {
            return None;
        }
        if &hay[at + 1..at + needle.len()] == rest {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// One frame, read: its fields borrowed from the frame's text where they need no decoding.
#[derive(Debug)]
pub enum Event<'a> {
    /// The interpreter is ready (`{"t":"ready"}`).
    Ready,
    /// Text the language's own print functions wrote (`stdout` / `stderr`, field `d`).
    Text {
        /// On stderr.
        stderr: bool,
        /// The text.
        text: Cow<'a, str>,
    },
    /// A rich result: its MIME bundle as the JSON text it came as (an object).
    Result(&'a RawValue),
    /// An error (`name`, `value`, `traceback`).
    Error {
        /// Its name.
        name: Cow<'a, str>,
        /// Its value.
        value: Cow<'a, str>,
        /// Its traceback.
        traceback: Cow<'a, str>,
    },
    /// The cell is done (`status`: bash's exit status).
    Done(i64),
    /// Anything else (ignored).
    Other,
}

/// A frame's members, raw, borrowed from its text. Unknown members are skipped without being
/// kept; a repeated member makes the frame invalid.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    t: Option<&'a RawValue>,
    #[serde(borrow, default)]
    d: Option<&'a RawValue>,
    #[serde(borrow, default)]
    b: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    value: Option<&'a RawValue>,
    #[serde(borrow, default)]
    traceback: Option<&'a RawValue>,
    #[serde(borrow, default)]
    status: Option<&'a RawValue>,
}

/// Replace, in place, every escape of a lone UTF-16 surrogate (`\ud800` without its pair:
/// what Python writes for undecodable bytes, what JSON allows and strict parsers such as
/// serde_json refuse) by `\ufffd`, so that what is passed on as it came parses anywhere.
/// The length does not change.
pub fn mend(frame: &mut [u8]) {
    fn hex4(b: &[u8]) -> Option<u32> {
        let s = std::str::from_utf8(b.get(..4)?).ok()?;
        u32::from_str_radix(s, 16)
            .ok()
            .filter(|_| s.bytes().all(|c| c.is_ascii_hexdigit()))
    }
    let is_u = |f: &[u8], i: usize| f.get(i) == Some(&b'\\') && f.get(i + 1) == Some(&b'u');
    let mut i = 0;
    while i < frame.len() {
        if frame[i] != b'\\' {
            i += 1;
            continue;
        }
        if frame.get(i + 1) != Some(&b'u') {
            i += 2; // a two-byte escape (`\"`, `\\`, ...)
            continue;
        }
        let Some(u) = hex4(&frame[i + 2..]) else {
            i += 2;
            continue;
        };
        let low = |j: usize| {
            hex4(frame.get(j + 2..).unwrap_or(&[])).filter(|l| (0xDC00..0xE000).contains(l))
        };
        if (0xD800..0xDC00).contains(&u) && is_u(frame, i + 6) && low(i + 6).is_some() {
            i += 12; // a pair
        } else if (0xD800..0xE000).contains(&u) {
            frame[i + 2..i + 6].copy_from_slice(b"fffd");
            i += 6;
        } else {
            i += 6;
        }
    }
}

/// Read one frame's text. `None`: not a JSON object (or not UTF-8): ignored.
pub fn parse(frame: &[u8]) -> Option<Event<'_>> {
    let text = std::str::from_utf8(frame).ok()?;
    if !text.trim_start().starts_with('{') {
        return None;
    }
    let e: Envelope<'_> = serde_json::from_str(text).ok()?;
    let t = e.t.map(|t| t.get()).unwrap_or_default();
    Some(match t {
        r#""ready""# => Event::Ready,
        r#""stdout""# | r#""stderr""# => Event::Text {
            stderr: t == r#""stderr""#,
            text: text_of(e.d),
        },
        r#""result""# => Event::Result(match e.b {
            Some(b) if b.get().starts_with('{') => b,
            _ => empty_bundle(),
        }),
        r#""error""# => Event::Error {
            name: text_of(e.name),
            value: text_of(e.value),
            traceback: text_of(e.traceback),
        },
        r#""done""# => Event::Done(
            e.status
                .and_then(|v| v.get().parse::<i64>().ok())
                .unwrap_or(0),
        ),
        _ => Event::Other,
    })
}

/// A member's text: "" when it is missing or not a string.
fn text_of(v: Option<&RawValue>) -> Cow<'_, str> {
    v.and_then(string).unwrap_or_default()
}

fn empty_bundle() -> &'static RawValue {
    static EMPTY: std::sync::OnceLock<Box<RawValue>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| RawValue::from_string("{}".to_owned()).expect("JSON"))
}

/// The text of a JSON string token (with its quotes), decoded: borrowed when it has no
/// escapes; escapes that do not make a valid character (a lone surrogate, which Python
/// writes for undecodable bytes) become U+FFFD. `None` when `raw` is not a string.
pub fn string(raw: &RawValue) -> Option<Cow<'_, str>> {
    let inner = raw.get().strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    let hex4 = |chars: &mut std::str::Chars<'_>| -> Option<u32> {
        let mut v = 0;
        for _ in 0..4 {
            v = v * 16 + chars.next()?.to_digit(16)?;
        }
        Some(v)
    };
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            'b' => out.push('\u{8}'),
            'f' => out.push('\u{c}'),
            'u' => {
                let u = hex4(&mut chars)?;
                if (0xD800..0xDC00).contains(&u) {
                    // A high surrogate: a pair when a low one follows.
                    let mut ahead = chars.clone();
                    let low = (ahead.next() == Some('\\') && ahead.next() == Some('u'))
                        .then(|| hex4(&mut ahead))
                        .flatten()
                        .filter(|l| (0xDC00..0xE000).contains(l));
                    match low {
                        Some(l) => {
                            chars = ahead;
                            let c = 0x10000 + ((u - 0xD800) << 10) + (l - 0xDC00);
                            out.push(char::from_u32(c).unwrap_or('\u{FFFD}'));
                        }
                        None => out.push('\u{FFFD}'),
                    }
                } else {
                    out.push(char::from_u32(u).unwrap_or('\u{FFFD}'));
                }
            }
            other => out.push(other), // `"`, `\`, `/`
        }
    }
    Some(Cow::Owned(out))
}

/// Bytes of `s` as a JSON string (with its quotes), as serde_json writes it.
pub fn escaped_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// Memory charged per JSON array element or object member (a `Value` of 32 bytes, doubled
/// for a vector's spare capacity, and the allocations of small strings), per `[` (a
/// vector's first allocation) and per `{` (a map's first node).
const PER_ITEM: usize = 128;
const PER_ARRAY: usize = 160;
const PER_OBJECT: usize = 704;

/// An upper estimate of the memory a `serde_json::Value` parsed from `json` takes (no tree is
/// built to tell: one pass over the bytes). At least `json.len()`.
pub fn tree_cost(json: &str) -> usize {
    let (mut items, mut arrays, mut objects) = (1usize, 0usize, 0usize);
    let (mut in_str, mut esc) = (false, false);
    for &b in json.as_bytes() {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b',' | b':' => items += 1,
            b'[' => arrays += 1,
            b'{' => objects += 1,
            _ => {}
        }
    }
    json.len()
        .saturating_add(items.saturating_mul(PER_ITEM))
        .saturating_add(arrays.saturating_mul(PER_ARRAY))
        .saturating_add(objects.saturating_mul(PER_OBJECT))
}

/// An error as `code/output` carries it.
#[derive(Serialize)]
pub struct OutError<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its value.
    pub value: &'a str,
    /// Its traceback.
    pub traceback: &'a str,
}

/// The params of one `code/output` notification; a result is the bundle's JSON text as it
/// came (never a tree).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Output<'a> {
    /// Its sandbox.
    pub sandbox: &'a str,
    /// Its context.
    pub context: &'a str,
    /// The run's `runId`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<&'a str>,
    /// `stdout`, `stderr`, `result`, `error`, `restarted`.
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// Text of `stdout` / `stderr` / `restarted`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<&'a str>,
    /// The MIME bundle of a `result`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<&'a RawValue>,
    /// The error of an `error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<OutError<'a>>,
}

impl Output<'_> {
    /// Bytes its notification takes at most (the exact figure or a little more): what is
    /// counted before the body is built.
    pub fn size(&self) -> usize {
        let opt = |s: Option<&str>| s.map_or(0, escaped_len);
        160 + escaped_len(self.sandbox)
            + escaped_len(self.context)
            + opt(self.run_id)
            + escaped_len(self.kind)
            + opt(self.text)
            + self.result.map_or(0, |r| r.get().len())
            + self.error.as_ref().map_or(0, |e| {
                escaped_len(e.name) + escaped_len(e.value) + escaped_len(e.traceback)
            })
    }
}

/// The `code/output` notification's body, built in one buffer of [`Output::size`] bytes.
pub fn output_body(o: &Output<'_>) -> Vec<u8> {
    abx_protocol::message::encode_notification_with("code/output", o.size(), |out| {
        serde_json::to_writer(out, o).expect("a code/output serializes")
    })
}

/// The `text/plain` of a MIME bundle's JSON text, read without making a tree of the rest.
pub fn plain_text(bundle: &RawValue) -> Option<Cow<'_, str>> {
    #[derive(serde::Deserialize)]
    struct Plain<'a> {
        #[serde(rename = "text/plain", borrow, default)]
        plain: Option<&'a RawValue>,
    }
    let p: Plain<'_> = serde_json::from_str(bundle.get()).ok()?;
    p.plain.and_then(string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn split_takes_frames_and_raw_text_in_order() {
        let mut sp = Splitter::new(b"\x1fNN", 1 << 20);
        let p = sp.push(b"ab\x1fNN{\"t\":1}\ncd\x1fN", false);
        assert_eq!(
            p,
            vec![
                Piece::Raw(b"ab".to_vec()),
                Piece::Frame(b"{\"t\":1}".to_vec()),
                Piece::Raw(b"cd".to_vec())
            ]
        );
        assert_eq!(sp.buf, b"\x1fN", "a tail that may begin a marker waits");
        assert!(sp.push(b"N{}", false).is_empty(), "a partial frame waits");
        assert!(sp.push(b"[1,", false).is_empty(), "still");
        assert_eq!(
            sp.push(b"2]\nz", false),
            vec![Piece::Frame(b"{}[1,2]".to_vec()), Piece::Raw(b"z".to_vec())]
        );
        let mut sp = Splitter::new(b"\x1fNN", 1 << 20);
        assert_eq!(
            sp.push(b"x\x1fN", true),
            vec![Piece::Raw(b"x\x1fN".to_vec())]
        );
        // Longer than the bound: dropped through its newline, what follows is kept.
        let mut sp = Splitter::new(b"\x1fNN", 8);
        assert_eq!(
            sp.push(b"a\x1fNN{\"t\": \"result\"", false),
            vec![Piece::Raw(b"a".to_vec())]
        );
        assert!(sp.buf.is_empty() && sp.dropping());
        assert!(sp.push(b"more", false).is_empty());
        let dropped = Piece::Dropped(Dropped {
            bytes: r#"{"t": "result""#.len() + "more".len() + "end".len(),
            why: Why::TooLarge,
            kind: Kind::Result,
            closed: true,
        });
        assert_eq!(
            sp.push(b"end\nb\x1fNN{}\n", false),
            vec![
                dropped,
                Piece::Raw(b"b".to_vec()),
                Piece::Frame(b"{}".to_vec())
            ]
        );
        // Too long though whole in one read: dropped all the same.
        let mut sp = Splitter::new(b"\x1fNN", 8);
        assert!(matches!(
            &sp.push(b"\x1fNN0123456789\n", false)[..],
            [Piece::Dropped(Dropped {
                bytes: 10,
                closed: true,
                ..
            })]
        ));
        // Cut by the end.
        assert!(matches!(
            &sp.push(b"\x1fNN{\"t\"", true)[..],
            [Piece::Dropped(Dropped {
                bytes: 4,
                why: Why::Cut,
                closed: false,
                ..
            })]
        ));
        // Abandoned (the budget): its rest is discarded up to its newline.
        sp.set_max(1 << 20);
        assert!(sp.push(b"\x1fNN{\"t\":\"stdout\"", false).is_empty());
        sp.abandon();
        assert!(sp.push(b",\"d\":\"x\"}", false).is_empty());
        assert!(matches!(
            &sp.push(b"\nq", false)[..],
            [Piece::Dropped(Dropped { bytes: 22, why: Why::Memory, closed: true, .. }), Piece::Raw(r)] if r == b"q"
        ));
    }

    #[test]
    fn frames_are_read_with_their_fields_borrowed() {
        let mut f = br#"{"t":"x","d":"\ud83d\ude00 \ud800\u0041 \\ud800 \udc00\uD83D"}"#.to_vec();
        mend(&mut f);
        assert_eq!(
            std::str::from_utf8(&f).unwrap(),
            r#"{"t":"x","d":"\ud83d\ude00 \ufffd\u0041 \\ud800 \ufffd\ufffd"}"#
        );
        let ev = parse(br#"{"t": "stdout", "d": "plain"}"#).unwrap();
        assert!(matches!(
            ev,
            Event::Text {
                stderr: false,
                text: Cow::Borrowed("plain")
            }
        ));
        let ev = parse(br#"{"t":"stderr","d":"a\nb \u00e9 \ud83d\ude00 \ud800 \/"}"#).unwrap();
        match ev {
            Event::Text { stderr: true, text } => assert_eq!(text, "a\nb é 😀 \u{FFFD} /"),
            other => panic!("{other:?}"),
        }
        let f = br#"{"t": "result", "b": {"text/plain": "x", "application/json": [1, [2]]}}"#;
        match parse(f).unwrap() {
            Event::Result(b) => {
                assert!(b.get().starts_with("{\"text/plain\""));
                assert_eq!(plain_text(b).as_deref(), Some("x"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(parse(br#"{"t":"result","b":[1]}"#), Some(Event::Result(b)) if b.get() == "{}")
        );
        assert!(matches!(
            parse(br#"{"t":"done","status":3}"#),
            Some(Event::Done(3))
        ));
        assert!(matches!(parse(br#"{"t":"done"}"#), Some(Event::Done(0))));
        assert!(matches!(
            parse(br#"{"t":"ready","pid":1}"#),
            Some(Event::Ready)
        ));
        assert!(matches!(
            parse(br#"{"t":"error","name":"E","value":1,"traceback":"tb","x":[[[]]]}"#),
            Some(Event::Error { name, value, traceback }) if name == "E" && value.is_empty() && traceback == "tb"
        ));
        assert!(parse(b"[1]").is_none());
        assert!(
            parse(br#"{"t":"stdout","t":"result"}"#).is_none(),
            "a repeated member"
        );
        assert!(
            parse(b"{\"t\":\"stdout\",\"d\":\"\xff\"}").is_none(),
            "not UTF-8"
        );
    }

    #[test]
    fn the_cost_of_a_tree_is_estimated_above_its_memory() {
        // A list of 15 million zeros: 45 MB of text, more than 1.9 GB as a tree.
        let small = "[0, 0, 0]";
        assert!(tree_cost(small) >= small.len() + 3 * 32);
        let zeros = format!("[{}0]", "0, ".repeat(1000));
        assert!(tree_cost(&zeros) >= 1001 * 64, "{}", tree_cost(&zeros));
        // Structure inside strings is text.
        assert_eq!(tree_cost(r#""[,{:]""#), tree_cost(r#""abcde""#));
        assert_eq!(tree_cost(r#""\"[""#), tree_cost(r#""\"x""#));
        assert!(tree_cost(r#"{"a":{}}"#) >= 2 * PER_OBJECT);
    }

    #[test]
    fn an_output_body_is_the_notification_with_the_bundle_as_it_came() {
        let bundle = raw(r#"{"application/json": [1, 2.50, {"k": null}], "text/plain": "[1]"}"#);
        let o = Output {
            sandbox: "sb",
            context: "ctx",
            run_id: Some("r\"1"),
            kind: "result",
            text: None,
            result: Some(&bundle),
            error: None,
        };
        let body = output_body(&o);
        assert!(body.len() <= o.size(), "{} > {}", body.len(), o.size());
        let text = std::str::from_utf8(&body).unwrap();
        assert!(
            text.contains(r#""result":{"application/json": [1, 2.50, {"k": null}]"#),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["method"], "code/output");
        assert_eq!(v["params"]["runId"], "r\"1");
        assert_eq!(v["params"]["type"], "result");
        assert!(v["params"].get("text").is_none());
        let t = "a\u{1}\"\\\n é";
        assert_eq!(escaped_len(t), serde_json::to_string(t).unwrap().len());
        let o = Output {
            text: Some(t),
            result: None,
            kind: "stdout",
            run_id: None,
            ..o
        };
        let body = output_body(&o);
        assert!(body.len() <= o.size());
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["params"]["text"], t);
        assert!(v["params"].get("runId").is_none());
    }
}
