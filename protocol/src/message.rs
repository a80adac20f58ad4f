//! The JSON-RPC 2.0 message model.
//!
//! [`decode`] turns one frame into a single message or a batch. Every field is first taken
//! as raw JSON so that one bad field never loses the id: an invalid request is answered
//! with its own id wherever it had a valid one. Params and results stay `Box<RawValue>`
//! until a handler parses them into its own type.
//!
//! The `encode_*` functions are the only place that writes a JSON-RPC envelope: the broker,
//! its providers, the contract kit and the CLI (its MCP server included) all send through
//! them.

use crate::error::{AbxError, ErrorCode, RpcError};
use crate::id::Id;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// A request: expects exactly one response with the same id.
#[derive(Debug, Clone)]
pub struct Request {
    /// The client's id.
    pub id: Id,
    /// Method name, e.g. `broker/ping`.
    pub method: String,
    /// Unparsed params (an object or array), if any.
    pub params: Option<Box<RawValue>>,
}

/// A notification: no id, no response.
#[derive(Debug, Clone)]
pub struct Notification {
    /// Method name.
    pub method: String,
    /// Unparsed params, if any.
    pub params: Option<Box<RawValue>>,
}

/// A response to a request.
#[derive(Debug, Clone)]
pub struct Response {
    /// The request id; `None` is a JSON `null` (answers to undecodable requests).
    pub id: Option<Id>,
    /// The result or the error.
    pub outcome: Result<Box<RawValue>, RpcError>,
}

/// One JSON-RPC message.
#[derive(Debug, Clone)]
pub enum Message {
    /// Has an id and a method.
    Request(Request),
    /// Has a method and no id.
    Notification(Notification),
    /// Has an id and a result or an error.
    Response(Response),
}

/// A message that could not be decoded, with the id to answer it with (if one was found).
#[derive(Debug, Clone)]
pub struct Invalid {
    /// The id the error response carries (`null` when none was readable).
    pub id: Option<Id>,
    /// Why it is invalid (-32700 or -32600).
    pub error: AbxError,
}

/// What one frame held.
#[derive(Debug)]
pub enum Incoming {
    /// A single message (or why it is invalid).
    Single(Result<Message, Invalid>),
    /// A non-empty batch; each element decoded independently.
    Batch(Vec<Result<Message, Invalid>>),
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

/// A raw JSON value already validated by serde_json that is a string without escapes: its
/// contents as they are. `None` for anything else (the caller parses it properly). Ids and
/// method names are such strings in practice; this spares each message a second parser
/// pass over them (issue 25).
fn fast_str(raw: &str) -> Option<&str> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// A raw JSON value already validated that is a plain integer fitting an `i64`, or a
/// string without escapes, as an id; `None` for anything else (the caller parses it).
fn fast_id(raw: &str) -> Option<Id> {
    if let Some(s) = fast_str(raw) {
        return Some(Id::Str(s.to_owned()));
    }
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    // serde_json reads `-0` as a float, which is no id: left to the full parse.
    if digits.is_empty() || raw == "-0" || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    raw.parse().ok().map(Id::Num)
}

fn first_byte(raw: &[u8]) -> Option<u8> {
    raw.iter().copied().find(|b| !b.is_ascii_whitespace())
}

fn invalid(id: Option<Id>, detail: &str) -> Invalid {
    Invalid {
        id,
        error: AbxError::detail(ErrorCode::InvalidRequest, detail),
    }
}

/// Decode one frame (a message or a batch).
pub fn decode(frame: &[u8]) -> Incoming {
    match decode_limited(frame, usize::MAX) {
        Ok(incoming) => incoming,
        Err(_) => unreachable!("no batch is longer than usize::MAX"),
    }
}

/// [`decode`] with at most `max_batch` elements in a batch. A longer batch is `Err(count)`:
/// its elements are counted, never decoded or collected, so the memory it takes is the
/// frame's own whatever the count.
pub fn decode_limited(frame: &[u8], max_batch: usize) -> Result<Incoming, usize> {
    match first_byte(frame) {
        Some(b'[') => {
            let mut de = serde_json::Deserializer::from_slice(frame);
            let parsed = serde::Deserializer::deserialize_seq(&mut de, Capped { max: max_batch })
                .and_then(|r| de.end().map(|()| r));
            match parsed {
                Ok(Ok(items)) if items.is_empty() => {
                    Ok(Incoming::Single(Err(invalid(None, "empty batch"))))
                }
                Ok(Ok(items)) => Ok(Incoming::Batch(
                    items
                        .into_iter()
                        .map(|raw| decode_one(raw.get().as_bytes()))
                        .collect(),
                )),
                Ok(Err(count)) => Err(count),
                Err(e) => Ok(Incoming::Single(Err(parse_error(&e)))),
            }
        }
        _ => Ok(Incoming::Single(decode_one(frame))),
    }
}

/// The number of elements of a batch (a JSON array), counted without decoding any.
pub fn batch_len(frame: &[u8]) -> Result<usize, serde_json::Error> {
    struct Count;
    impl<'de> serde::de::Visitor<'de> for Count {
        type Value = usize;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON-RPC batch (an array)")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
            let mut n = 0;
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                n += 1;
            }
            Ok(n)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(frame);
    let n = serde::Deserializer::deserialize_seq(&mut de, Count)?;
    de.end()?;
    Ok(n)
}

/// A batch's elements, up to `max`; past it only counted (`Err(count)`).
struct Capped {
    max: usize,
}

impl<'de> serde::de::Visitor<'de> for Capped {
    type Value = Result<Vec<&'de RawValue>, usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON-RPC batch (an array)")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(raw) = seq.next_element::<&RawValue>()? {
            if items.len() == self.max {
                let mut count = items.len() + 1;
                drop(items);
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    count += 1;
                }
                return Ok(Err(count));
            }
            items.push(raw);
        }
        Ok(Ok(items))
    }
}

fn parse_error(e: &serde_json::Error) -> Invalid {
    Invalid {
        id: None,
        error: AbxError::detail(ErrorCode::ParseError, e),
    }
}

/// Decode a single message (not a batch).
pub fn decode_one(raw: &[u8]) -> Result<Message, Invalid> {
    parse_one(raw, |params| params.to_owned())
}

/// Params at least this long are cut out of an owned frame in place ([`decode_owned`]), not
/// copied.
pub const IN_PLACE: usize = 64 * 1024;

/// [`decode_limited`] of a frame the caller owns: a single message whose params (or result)
/// are [`IN_PLACE`] bytes or more gets them cut out of the frame's own buffer (the bytes
/// before and after them dropped, the buffer kept), so a large message is held once, never
/// twice: what was counted for the frame covers its params. A batch (and smaller params) is
/// decoded as [`decode_limited`] does, copying.
pub fn decode_owned(frame: Vec<u8>, max_batch: usize) -> Result<Incoming, usize> {
    if first_byte(&frame) == Some(b'[') {
        return decode_limited(&frame, max_batch);
    }
    let base = frame.as_ptr() as usize;
    let mut at = None;
    let msg = parse_one(&frame, |params| {
        let text = params.get();
        if text.len() < IN_PLACE {
            return params.to_owned();
        }
        at = Some((text.as_ptr() as usize - base, text.len()));
        // A placeholder, replaced below once the frame is no longer borrowed.
        RawValue::from_string("null".to_owned()).expect("valid JSON")
    });
    let mut msg = match msg {
        Ok(m) => m,
        Err(e) => return Ok(Incoming::Single(Err(e))),
    };
    let Some((start, len)) = at else {
        return Ok(Incoming::Single(Ok(msg)));
    };
    let params = raw_in_place(frame, start, len);
    let Some(params) = params else {
        let id = match &msg {
            Message::Request(r) => Some(r.id.clone()),
            Message::Response(r) => r.id.clone(),
            Message::Notification(_) => None,
        };
        return Ok(Incoming::Single(Err(invalid(id, "not JSON"))));
    };
    match &mut msg {
        Message::Request(Request { params: p, .. })
        | Message::Notification(Notification { params: p, .. }) => *p = Some(params),
        Message::Response(Response { outcome, .. }) => *outcome = Ok(params),
    }
    Ok(Incoming::Single(Ok(msg)))
}

/// The JSON value `buf[start..start + len]` (text `serde_json` checked: UTF-8, one value) as
/// a `RawValue` made of `buf` itself: what is before and after it dropped, the buffer shrunk in
/// place, no byte copied into a second buffer. `None` when that text is not a JSON value.
pub fn raw_in_place(buf: Vec<u8>, start: usize, len: usize) -> Option<Box<RawValue>> {
    let end = start.checked_add(len).filter(|e| *e <= buf.len())?;
    let mut text = buf;
    text.truncate(end);
    text.drain(..start);
    let text = String::from_utf8(text).ok()?;
    RawValue::from_string(text).ok()
}

/// One message read from its frame, its params (or result) made owned by `own` (a copy, or
/// the frame's own buffer: [`decode_owned`]).
#[inline]
fn parse_one<'a>(
    raw: &'a [u8],
    own: impl FnOnce(&'a RawValue) -> Box<RawValue>,
) -> Result<Message, Invalid> {
    if first_byte(raw) != Some(b'{') {
        // Valid JSON that is not an object is an invalid request; anything else a parse error.
        return match serde_json::from_slice::<serde::de::IgnoredAny>(raw) {
            Ok(_) => Err(invalid(None, "a message must be a JSON object")),
            Err(e) => Err(parse_error(&e)),
        };
    }
    // Checked as UTF-8 once, the text's members are read without checking each again (as
    // bytes, every raw member and string is checked on its own). Not UTF-8: read as bytes,
    // for the same error at the same place.
    let f: Result<Fields, _> = match std::str::from_utf8(raw) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(raw),
    };
    let f = match f {
        Ok(f) => f,
        Err(e) => return Err(parse_error(&e)),
    };
    // The id first, so that every later error can carry it.
    let null_id = f.id.is_some_and(|r| r.get() == "null");
    let id = match f.id {
        None => None,
        Some(raw) if raw.get() == "null" => None,
        Some(raw) => {
            match fast_id(raw.get()).map_or_else(|| serde_json::from_str::<Id>(raw.get()), Ok) {
                Ok(id) => Some(id),
                Err(_) => {
                    return Err(invalid(
                        None,
                        &format!("id must be an integer or a string, not {}", raw.get()),
                    ))
                }
            }
        }
    };
    match f.jsonrpc.map(|v| v.get()) {
        Some("\"2.0\"") => {}
        Some(other) => {
            return Err(invalid(
                id,
                &format!("jsonrpc must be \"2.0\", not {other}"),
            ))
        }
        None => return Err(invalid(id, "missing \"jsonrpc\": \"2.0\"")),
    }
    if let Some(m) = f.method {
        let method: String = match fast_str(m.get())
            .map_or_else(|| serde_json::from_str(m.get()), |s| Ok(s.to_owned()))
        {
            Ok(s) => s,
            Err(_) => return Err(invalid(id, "method must be a string")),
        };
        let params = match f.params {
            None => None,
            Some(p) if p.get() == "null" => None,
            Some(p) if matches!(first_byte(p.get().as_bytes()), Some(b'{' | b'[')) => Some(p),
            Some(_) => return Err(invalid(id, "params must be an object or an array")),
        };
        if null_id {
            return Err(invalid(
                None,
                "a request id must be an integer or a string, not null",
            ));
        }
        let params = params.map(own);
        return Ok(match id {
            Some(id) => Message::Request(Request { id, method, params }),
            None => Message::Notification(Notification { method, params }),
        });
    }
    match (f.result, f.error) {
        (Some(r), None) => Ok(Message::Response(Response {
            id,
            outcome: Ok(own(r)),
        })),
        (None, Some(e)) => match serde_json::from_str::<RpcError>(e.get()) {
            Ok(err) => Ok(Message::Response(Response {
                id,
                outcome: Err(err),
            })),
            Err(_) => Err(invalid(id, "error must be {code, message, data?}")),
        },
        (Some(_), Some(_)) => Err(invalid(id, "a response has result or error, not both")),
        (None, None) => Err(invalid(id, "missing \"method\"")),
    }
}

// ---------------------------------------------------------------------------------------------
// What a `serde_json::Value` of untrusted text would cost, before it is built
// ---------------------------------------------------------------------------------------------

/// Bytes of one `serde_json::Value` (its slot in an array, a map or a box).
const VALUE_SLOT: usize = std::mem::size_of::<serde_json::Value>();
/// What the allocator adds to each allocation (its header, and rounding).
const ALLOC: usize = 32;
/// What one member of a map costs beside its key's and its value's heap: its key's `String`
/// and its value's slot in a B-tree node, with the nodes' slack (about half full).
const MAP_ENTRY: usize = 2 * (std::mem::size_of::<String>() + VALUE_SLOT) + 16;

/// The heap a `serde_json::Value` parsed from `text` would take (an upper estimate: arrays
/// with their growth's slack, maps' nodes half full, every allocation's header), counted by
/// a streaming pass that allocates nothing and stops at the first error. A Value tree takes
/// 10 to 40 times its text (a `0,` is a 32-byte slot, and up to 64 with the array's growth):
/// whoever builds one from untrusted text counts it first (issue 42).
pub fn value_cost(text: &str) -> Result<usize, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let cost = serde::de::DeserializeSeed::deserialize(CostSeed, &mut de)?;
    de.end()?;
    Ok(cost)
}

/// The cost of one value (its own heap, not its slot).
struct CostSeed;

impl<'de> serde::de::DeserializeSeed<'de> for CostSeed {
    type Value = usize;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_any(CostVisitor)
    }
}

struct CostVisitor;

fn string_cost(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        len + ALLOC
    }
}

impl<'de> serde::de::Visitor<'de> for CostVisitor {
    type Value = usize;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_i64<E>(self, _: i64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_u64<E>(self, _: u64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_f64<E>(self, _: f64) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_str<E>(self, s: &str) -> Result<usize, E> {
        Ok(string_cost(s.len()))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let (mut n, mut heap) = (0usize, 0usize);
        while let Some(c) = seq.next_element_seed(CostSeed)? {
            n += 1;
            heap = heap.saturating_add(c);
        }
        // A vector grown by doubling holds up to twice its elements.
        let slots = if n == 0 {
            0
        } else {
            2 * n * VALUE_SLOT + ALLOC
        };
        Ok(heap.saturating_add(slots))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let mut total = 0usize;
        while let Some(key) = map.next_key::<KeyLen>()? {
            let v = map.next_value_seed(CostSeed)?;
            total = total
                .saturating_add(MAP_ENTRY + string_cost(key.0))
                .saturating_add(v);
        }
        Ok(total)
    }
}

/// A JSON string, borrowed from the text when it has no escapes.
pub struct BorrowedStr<'a>(pub std::borrow::Cow<'a, str>);

impl<'de> Deserialize<'de> for BorrowedStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = BorrowedStr<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(std::borrow::Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(std::borrow::Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// A map key's length (its text is not kept).
struct KeyLen(usize);

impl<'de> Deserialize<'de> for KeyLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = KeyLen;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, s: &str) -> Result<KeyLen, E> {
                Ok(KeyLen(s.len()))
            }
        }
        d.deserialize_str(V)
    }
}

/// A JSON string value (its raw text, quotes included, as `serde_json` checked it) made a
/// `String` inside the buffer that holds it: `buf[start..start + len]` is the string's raw
/// text; its escapes are decoded in place (every escape is longer than what it stands for),
/// and what is before and after is dropped. No byte is copied into a second buffer, so a
/// 60 MB `data` member becomes the `Value` a provider gets without being held twice. `None`
/// when the text is not such a string (or escapes a lone surrogate, which `serde_json`
/// refuses too).
pub fn string_in_place(mut buf: Vec<u8>, start: usize, len: usize) -> Option<String> {
    let end = start.checked_add(len)?;
    if len < 2 || end > buf.len() || buf[start] != b'"' || buf[end - 1] != b'"' {
        return None;
    }
    let (from, to) = (start + 1, end - 1);
    let mut w = from;
    let mut r = from;
    while r < to {
        let b = buf[r];
        if b != b'\\' {
            if b == b'"' || b < 0x20 {
                return None;
            }
            buf[w] = b;
            w += 1;
            r += 1;
            continue;
        }
        let esc = *buf.get(r + 1).filter(|_| r + 1 < to)?;
        r += 2;
        let c = match esc {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = hex4(buf.get(r..r + 4).filter(|_| r + 4 <= to)?)?;
                r += 4;
                let code = match hi {
                    0xD800..=0xDBFF => {
                        if buf.get(r..r + 2) != Some(b"\\u") || r + 6 > to {
                            return None;
                        }
                        let lo = hex4(&buf[r + 2..r + 6])?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return None;
                        }
                        r += 6;
                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return None,
                    c => c,
                };
                char::from_u32(code)?
            }
            _ => return None,
        };
        let mut utf8 = [0u8; 4];
        let enc = c.encode_utf8(&mut utf8).as_bytes();
        // An escape is at least two bytes for one, six for up to three, twelve for four:
        // what is written never passes what was read.
        buf[w..w + enc.len()].copy_from_slice(enc);
        w += enc.len();
    }
    buf.truncate(w);
    buf.drain(..from);
    String::from_utf8(buf).ok()
}

/// `text` parsed into a `Value` when that tree would take at most `max` bytes
/// ([`value_cost`]); `None` when it would take more, or is not JSON. For control replies
/// (a handshake, an `exec/start` result) read from a plugin: a bounded streaming pass first,
/// the tree only when it is small.
pub fn bounded_value(text: &str, max: usize) -> Option<serde_json::Value> {
    match value_cost(text) {
        Ok(cost) if cost <= max => serde_json::from_str(text).ok(),
        _ => None,
    }
}

/// What a JSON string value says (`raw`: its text, quotes included), at most `max` bytes of
/// it, cut on a character boundary, and whether it was cut. Only the first `max` bytes of the
/// text are read (a 60 MB `message` costs what `max` does; escapes make what it says
/// shorter). `None` when `raw` is not a string.
pub fn string_prefix(raw: &str, max: usize) -> Option<(String, bool)> {
    if !raw.starts_with('"') {
        return None;
    }
    // The text of `max` bytes is never shorter than what it says.
    if raw.len() <= max + 2 {
        return serde_json::from_str::<String>(raw).ok().map(|s| (s, false));
    }
    let mut cut = max + 1;
    while !raw.is_char_boundary(cut) {
        cut -= 1;
    }
    // Back off past an escape the cut went through (at most 12 bytes: a surrogate pair).
    for back in 0..=12 {
        let Some(end) = cut.checked_sub(back).filter(|e| *e >= 1) else {
            break;
        };
        if !raw.is_char_boundary(end) {
            continue;
        }
        let mut text = String::with_capacity(end + 1);
        text.push_str(&raw[..end]);
        text.push('"');
        if let Ok(s) = serde_json::from_str::<String>(&text) {
            return Some((s, true));
        }
    }
    None
}

/// Write the JSON object `obj` (raw text) to `out` with the member `key` first, set to `value`
/// (raw JSON), and every member of that name in `obj` left out; the others as they came, one
/// by one, without a tree of them (a 60 MB `sandboxInfo` costs its copy, nothing more).
/// `Err` when `obj` is not an object.
pub fn write_object_with(
    out: &mut Vec<u8>,
    obj: &str,
    key: &str,
    value: &str,
) -> Result<(), serde_json::Error> {
    struct W<'o, 'k> {
        out: &'o mut Vec<u8>,
        key: &'k str,
    }
    impl<'de> serde::de::Visitor<'de> for W<'_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(BorrowedStr(k)) = map.next_key()? {
                let v: &RawValue = map.next_value()?;
                if k == self.key {
                    continue;
                }
                self.out.push(b',');
                serde_json::to_writer(&mut *self.out, &k).map_err(serde::de::Error::custom)?;
                self.out.push(b':');
                self.out.extend_from_slice(v.get().as_bytes());
            }
            Ok(())
        }
    }
    let mark = out.len();
    out.push(b'{');
    serde_json::to_writer(&mut *out, key)?;
    out.push(b':');
    out.extend_from_slice(value.as_bytes());
    let mut de = serde_json::Deserializer::from_str(obj);
    let done =
        serde::Deserializer::deserialize_map(&mut de, W { out, key }).and_then(|()| de.end());
    if let Err(e) = done {
        out.truncate(mark);
        return Err(e);
    }
    out.push(b'}');
    Ok(())
}

fn hex4(h: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(h).ok()?;
    if s.len() != 4 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

#[derive(Serialize)]
struct OutResponse<'a> {
    jsonrpc: &'static str,
    id: Option<&'a Id>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a RpcError>,
}

#[derive(Serialize)]
struct OutRequest<'a, P: Serialize + ?Sized> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a Id>,
    method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a P>,
}

/// Serialize a response body (no framing).
pub fn encode_response(id: Option<&Id>, outcome: Result<&RawValue, &RpcError>) -> Vec<u8> {
    let result = match outcome {
        Ok(r) => r.get(),
        Err(error) => {
            return serde_json::to_vec(&OutResponse {
                jsonrpc: "2.0",
                id,
                result: None,
                error: Some(error),
            })
            .expect("a response always serializes")
        }
    };
    // A result's envelope is written by hand, in the bytes serde would write, into a buffer
    // of the right size: every reply takes this path, and the serializer's escaping of the
    // fixed keys and its buffer's growth were a tenth of a `broker/ping`.
    let mut out = Vec::with_capacity(RESULT_HEAD + result.len() + 1);
    result_head(id, &mut out);
    out.extend_from_slice(result.as_bytes());
    out.push(b'}');
    out
}

/// Room for a result envelope's head with a numeric id.
const RESULT_HEAD: usize = 48;

/// `{"jsonrpc":"2.0","id":<id>,"result":`, as serde writes it.
fn result_head(id: Option<&Id>, out: &mut Vec<u8>) {
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    match id {
        Some(id) => serde_json::to_writer(&mut *out, id).expect("an id always serializes"),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","result":"#);
}

/// [`encode_response`] of a result, reusing the result's buffer: the envelope is written
/// around it in place, so a large result (an `exec/run`'s output, a `files/read` chunk) is
/// never held twice. Byte-identical to `encode_response(Some(id), Ok(&result))`.
pub fn encode_response_owned(id: &Id, result: Box<RawValue>) -> Vec<u8> {
    if result.get().len() < 64 * 1024 {
        return encode_response(Some(id), Ok(&result));
    }
    let raw: Box<str> = result.into();
    let mut head = Vec::with_capacity(RESULT_HEAD);
    result_head(Some(id), &mut head);
    let mut body = String::from(raw).into_bytes();
    body.reserve_exact(head.len() + 1);
    body.splice(0..0, head);
    body.push(b'}');
    body
}

#[derive(Serialize)]
struct OutResponseAny<'a, I: Serialize + ?Sized, R: Serialize + ?Sized> {
    jsonrpc: &'static str,
    id: &'a I,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a R>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a RpcError>,
}

/// [`encode_response`] for a server whose request ids are kept as the peer sent them (any
/// JSON number or string, e.g. MCP's; `null` for none) and whose results are any
/// serializable value. Byte-identical to [`encode_response`] for the same id and result.
pub fn encode_response_any<I: Serialize + ?Sized, R: Serialize + ?Sized>(
    id: &I,
    outcome: Result<&R, &RpcError>,
) -> Vec<u8> {
    let (result, error) = match outcome {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e)),
    };
    serde_json::to_vec(&OutResponseAny {
        jsonrpc: "2.0",
        id,
        result,
        error,
    })
    .expect("a response of JSON values always serializes")
}

/// Serialize a request body (no framing).
pub fn encode_request<P: Serialize + ?Sized>(id: &Id, method: &str, params: Option<&P>) -> Vec<u8> {
    serde_json::to_vec(&OutRequest {
        jsonrpc: "2.0",
        id: Some(id),
        method,
        params,
    })
    .expect("params serialize")
}

/// Serialize a notification body (no framing).
pub fn encode_notification<P: Serialize + ?Sized>(method: &str, params: Option<&P>) -> Vec<u8> {
    serde_json::to_vec(&OutRequest {
        jsonrpc: "2.0",
        id: None,
        method,
        params,
    })
    .expect("params serialize")
}

/// [`encode_notification`] whose params the caller writes into the body itself: `params`
/// appends exactly one JSON value (an object) to the buffer it is given. A large payload (an
/// `exec/output` chunk as base64) is then encoded once, in place, without a `Value` tree or
/// a second buffer. `capacity` is what the params will take, as a hint. Byte-identical to
/// [`encode_notification`] with the same params.
pub fn encode_notification_with(
    method: &str,
    capacity: usize,
    params: impl FnOnce(&mut Vec<u8>),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity + method.len() + 40);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","method":"#);
    serde_json::to_writer(&mut out, method).expect("a string always serializes");
    out.extend_from_slice(br#","params":"#);
    params(&mut out);
    out.push(b'}');
    out
}

/// Join already-encoded bodies into one batch body.
pub fn encode_batch(bodies: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bodies.iter().map(|b| b.len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (i, b) in bodies.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b);
    }
    out.push(b']');
    out
}

impl Message {
    /// Serialize this message (no framing).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Message::Request(r) => encode_request(&r.id, &r.method, r.params.as_deref()),
            Message::Notification(n) => encode_notification(&n.method, n.params.as_deref()),
            Message::Response(r) => encode_response(r.id.as_ref(), r.outcome.as_deref()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn owned_responses_are_byte_identical() {
        for id in [super::Id::Num(7), super::Id::Str("a\"b".into())] {
            for len in [3, 70_000] {
                let text = "x\u{e9}\n".repeat(len);
                let v =
                    serde_json::value::to_raw_value(&serde_json::json!({"data": text})).unwrap();
                let want = super::encode_response(Some(&id), Ok(&v));
                assert_eq!(super::encode_response_owned(&id, v), want);
            }
        }
    }

    use super::*;

    fn single(s: &str) -> Result<Message, Invalid> {
        match decode(s.as_bytes()) {
            Incoming::Single(m) => m,
            Incoming::Batch(_) => panic!("batch"),
        }
    }

    #[test]
    fn ids_and_methods_read_the_same_with_or_without_escapes() {
        // The fast paths (a plain string or integer) and the full parse must agree, and what
        // neither accepts keeps its error.
        let cases: &[(&str, Option<Id>)] = &[
            ("7", Some(Id::Num(7))),
            ("-12", Some(Id::Num(-12))),
            ("9223372036854775807", Some(Id::Num(i64::MAX))),
            ("\"a\"", Some(Id::Str("a".into()))),
            ("\"a\\u0041\\\"\"", Some(Id::Str("aA\"".into()))),
            ("\"\"", Some(Id::Str(String::new()))),
            ("9223372036854775808", None),
            ("1.5", None),
            ("-1e2", None),
            ("-0", None),
        ];
        for (raw, want) in cases {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{raw},"method":"s\u0061ndbox/list"}}"#);
            match (single(&text), want) {
                (Ok(Message::Request(r)), Some(id)) => {
                    assert_eq!(&r.id, id, "{raw}");
                    assert_eq!(r.method, "sandbox/list");
                }
                (Err(inv), None) => {
                    assert!(inv.error.message.contains("id must be"), "{raw}: {inv:?}");
                }
                (other, _) => panic!("{raw}: {other:?}"),
            }
            let text = format!(r#"{{"jsonrpc":"2.0","id":{raw},"method":"ping"}}"#);
            if let (Ok(Message::Request(r)), Some(id)) = (single(&text), want) {
                assert_eq!((&r.id, r.method.as_str()), (id, "ping"));
            }
        }
        assert!(matches!(
            single(r#"{"jsonrpc":"2.0","id":1,"method":7}"#),
            Err(inv) if inv.error.message.contains("method must be a string")
        ));
    }

    #[test]
    fn utf8_text_and_bytes_read_alike_and_bad_utf8_keeps_its_error() {
        // Valid UTF-8 is read as text (each member unchecked), the rest as bytes: both must
        // give what reading as bytes gave, errors and their positions included.
        let as_bytes = |raw: &[u8]| -> Result<String, String> {
            let f: Fields =
                serde_json::from_slice(raw).map_err(|e| parse_error(&e).error.message)?;
            Ok(format!(
                "{:?}",
                [f.jsonrpc, f.id, f.method, f.params, f.result, f.error]
                    .map(|r| r.map(RawValue::get))
            ))
        };
        let cases: &[&[u8]] = &[
            r#"{"jsonrpc":"2.0","id":1,"method":"files/write","params":{"data":"\u{e9}t\u{e9} \u00e9"}}"#.as_bytes(),
            "{\"jsonrpc\":\"2.0\",\"id\":\"\u{e9}\",\"method\":\"m\",\"params\":{\"k\":\"\u{1F600}\"}}".as_bytes(),
            br#"{"jsonrpc":"2.0","id":2,"result":{"sandboxes":[]}}"#,
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"k\":\"\xff\"}}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\xc3\"}",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":[\"\xed\xa0\x80\"]}",
            br#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"k":1,}}"#,
        ];
        for raw in cases {
            let got = decode_one(raw);
            match as_bytes(raw) {
                Ok(_) => assert!(got.is_ok(), "{:?}: {got:?}", String::from_utf8_lossy(raw)),
                Err(message) => {
                    let inv = got.expect_err("bad input is refused");
                    assert_eq!(inv.error.message, message);
                }
            }
        }
        // What the text was read into is what the bytes were.
        let text = cases[1];
        let Ok(Message::Request(r)) = decode_one(text) else {
            panic!("a request")
        };
        assert_eq!(r.id, Id::Str("\u{e9}".into()));
        assert_eq!(r.params.unwrap().get(), "{\"k\":\"\u{1F600}\"}");
    }

    #[test]
    fn request_notification_response() {
        match single(r#"{"jsonrpc":"2.0","id":7,"method":"broker/ping","params":{"a":[1]}}"#) {
            Ok(Message::Request(r)) => {
                assert_eq!(r.id, Id::Num(7));
                assert_eq!(r.method, "broker/ping");
                assert_eq!(r.params.unwrap().get(), r#"{"a":[1]}"#);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            single(r#"{"jsonrpc":"2.0","method":"initialized"}"#),
            Ok(Message::Notification(_))
        ));
        assert!(matches!(
            single(r#"{"jsonrpc":"2.0","id":"x","result":null}"#),
            Ok(Message::Response(Response {
                id: Some(Id::Str(_)),
                outcome: Ok(_)
            }))
        ));
    }

    #[test]
    fn invalid_requests_keep_their_id() {
        let e = single(r#"{"id":3,"method":"m"}"#).unwrap_err();
        assert_eq!(e.id, Some(Id::Num(3)));
        assert_eq!(e.error.code, ErrorCode::InvalidRequest);
        let e = single(r#"{"jsonrpc":"1.0","id":"a","method":"m"}"#).unwrap_err();
        assert_eq!(e.id, Some(Id::Str("a".into())));
        let e = single(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"m"}"#).unwrap_err();
        assert_eq!((e.id, e.error.code), (None, ErrorCode::InvalidRequest));
        let e = single(r#"{"jsonrpc":"2.0","id":1.5,"method":"m"}"#).unwrap_err();
        assert_eq!(e.error.code, ErrorCode::InvalidRequest);
        let e = single(r#"{"jsonrpc":"2.0","id":1,"method":5}"#).unwrap_err();
        assert_eq!(e.id, Some(Id::Num(1)));
        let e = single(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":3}"#).unwrap_err();
        assert_eq!(e.error.code, ErrorCode::InvalidRequest);
        let e = single("42").unwrap_err();
        assert_eq!(e.error.code, ErrorCode::InvalidRequest);
        let e = single("{\"jsonrpc\":").unwrap_err();
        assert_eq!(e.error.code, ErrorCode::ParseError);
        let e = single("not json").unwrap_err();
        assert_eq!(e.error.code, ErrorCode::ParseError);
    }

    #[test]
    fn null_ids() {
        let e = single(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#).unwrap_err();
        assert_eq!((e.id, e.error.code), (None, ErrorCode::InvalidRequest));
        assert!(matches!(
            single(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#),
            Ok(Message::Response(Response {
                id: None,
                outcome: Err(_)
            }))
        ));
    }

    #[test]
    fn batches() {
        match decode(
            br#"[{"jsonrpc":"2.0","id":1,"method":"a"}, 1, {"jsonrpc":"2.0","method":"n"}]"#,
        ) {
            Incoming::Batch(v) => {
                assert_eq!(v.len(), 3);
                assert!(matches!(v[0], Ok(Message::Request(_))));
                assert!(v[1].is_err());
                assert!(matches!(v[2], Ok(Message::Notification(_))));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(decode(b"[]"), Incoming::Single(Err(_))));
        assert!(matches!(
            decode(b"[1,"),
            Incoming::Single(Err(Invalid {
                error: AbxError {
                    code: ErrorCode::ParseError,
                    ..
                },
                ..
            }))
        ));
    }

    #[test]
    fn long_batches_are_counted_not_decoded() {
        let ping = r#"{"jsonrpc":"2.0","id":1,"method":"broker/ping"}"#;
        let batch = |n: usize| format!("[{}]", vec![ping; n].join(","));
        match decode_limited(batch(3).as_bytes(), 3) {
            Ok(Incoming::Batch(v)) => assert_eq!(v.len(), 3),
            other => panic!("{other:?}"),
        }
        assert_eq!(decode_limited(batch(4).as_bytes(), 3).unwrap_err(), 4);
        assert_eq!(decode_limited(b"[1,2,3,{}, []]", 2).unwrap_err(), 5);
        // Broken JSON past the limit is still a parse error, not a count.
        assert!(matches!(
            decode_limited(b"[1,2,3,", 2),
            Ok(Incoming::Single(Err(_)))
        ));
        assert!(matches!(
            decode_limited(b"[1] x", 2),
            Ok(Incoming::Single(Err(_)))
        ));
    }

    #[test]
    fn notifications_with_params_written_in_place_are_byte_identical() {
        let params =
            serde_json::json!({"data": "a\"b\n\u{e9}", "execId": "e1", "stream": "stdout"});
        let want = encode_notification("exec/output", Some(&params));
        let got = encode_notification_with("exec/output", 0, |out| {
            serde_json::to_writer(out, &params).unwrap()
        });
        assert_eq!(
            String::from_utf8(got).unwrap(),
            String::from_utf8(want).unwrap()
        );
        let odd = encode_notification_with("a\"b", 8, |out| out.extend_from_slice(b"{}"));
        assert_eq!(
            odd,
            encode_notification("a\"b", Some(&serde_json::json!({})))
        );
        assert!(matches!(
            decode(&odd),
            Incoming::Single(Ok(Message::Notification(Notification { method, .. }))) if method == "a\"b"
        ));
    }

    #[test]
    fn responses_of_json_ids_are_byte_identical() {
        let v = serde_json::json!({"content": [{"type": "text", "text": "hi"}]});
        let raw = serde_json::value::to_raw_value(&v).unwrap();
        for (json_id, id) in [
            (serde_json::json!(7), Some(Id::Num(7))),
            (serde_json::json!("x\"y"), Some(Id::Str("x\"y".into()))),
            (serde_json::json!(-3), Some(Id::Num(-3))),
            (serde_json::json!(i64::MAX), Some(Id::Num(i64::MAX))),
            (
                serde_json::json!("\u{1}\\/\u{e9}\u{1f600}"),
                Some(Id::Str("\u{1}\\/\u{e9}\u{1f600}".into())),
            ),
            (serde_json::Value::Null, None),
        ] {
            assert_eq!(
                encode_response_any(&json_id, Ok(&v)),
                encode_response(id.as_ref(), Ok(&raw))
            );
            let err = AbxError::new(ErrorCode::MethodNotFound, &[("method", "m")]).to_rpc();
            assert_eq!(
                encode_response_any::<_, ()>(&json_id, Err(&err)),
                encode_response(id.as_ref(), Err(&err))
            );
        }
        // Ids an `Id` cannot hold are kept as sent.
        let body = encode_response_any(&serde_json::json!(1.5), Ok(&v));
        let back: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(back["id"], 1.5);
        assert_eq!(back["result"], v);
    }

    /// Frames as a reader owns them decode as borrowed ones do, whatever the size of their
    /// params or result (cut out in place from 64 KiB on).
    #[test]
    fn owned_frames_decode_as_borrowed_ones() {
        let big = "x".repeat(IN_PLACE + 10);
        let arr = format!("[{}0]", "0,".repeat(IN_PLACE));
        let frames = [
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":1}}"#.to_owned(),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m","params":{{"data":"{big}"}}}}"#),
            format!(r#" {{ "params" : {arr} , "method":"m","jsonrpc":"2.0","id":"q"}} "#),
            format!(r#"{{"jsonrpc":"2.0","method":"n","params":{{"x":{arr}}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"d":"{big}"}}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":7,"result":{arr},"x":1}}"#),
            format!(r#"{{"jsonrpc":"1.0","id":7,"method":"m","params":{arr}}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":7,"method":"m","params":"{big}"}}"#),
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"x"}}"#.to_owned(),
            "[1,2]".to_owned(),
            "nope".to_owned(),
        ];
        let show = |m: &Result<Message, Invalid>| match m {
            Ok(m) => String::from_utf8(m.encode()).unwrap(),
            Err(e) => format!("{:?} {}", e.id, e.error.message),
        };
        for f in frames {
            let want = decode(f.as_bytes());
            let got = decode_owned(f.clone().into_bytes(), 10).expect("no long batch");
            match (want, got) {
                (Incoming::Single(a), Incoming::Single(b)) => {
                    assert_eq!(show(&a), show(&b), "{f:.80}")
                }
                (Incoming::Batch(a), Incoming::Batch(b)) => assert_eq!(a.len(), b.len()),
                (a, b) => panic!("{f:.80}: {a:?} / {b:?}"),
            }
        }
    }

    /// The cost of a `Value` is known before it is built, and is not less than what it takes.
    #[test]
    fn value_cost_is_counted_without_building_and_bounds_the_tree() {
        let n = 100_000;
        let arr = format!("[{}0]", "0,".repeat(n));
        let cost = value_cost(&arr).unwrap();
        assert!(
            cost >= n * std::mem::size_of::<serde_json::Value>(),
            "{cost}"
        );
        assert!(
            cost > 10 * arr.len(),
            "a tree of zeros costs many times its text"
        );
        let text = format!(r#"{{"a":"{}","b":{{"c":[1,"x",null]}}}}"#, "y".repeat(1000));
        assert!(value_cost(&text).unwrap() >= 1000);
        assert_eq!(value_cost("0").unwrap(), 0);
        assert!(value_cost("[1,").is_err());
        assert!(value_cost("1 2").is_err());
        assert_eq!(bounded_value(&arr, cost - 1), None);
        assert_eq!(bounded_value("[1]", 1024), Some(serde_json::json!([1])));
        // Deep nesting is refused by the parser's own limit, never a stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(value_cost(&deep).is_err());
    }

    /// A string made in place says what serde_json reads it to say, for every escape, and is
    /// refused where serde_json refuses it.
    #[test]
    fn strings_made_in_place_read_as_serde_json_reads_them() {
        let mut cases: Vec<String> = [
            r#""""#,
            r#""abc""#,
            r#""a\"b\\c\/d\b\f\n\r\t""#,
            r#""\u00e9\u0041\u20ac""#,
            r#""\ud83d\ude00 smile""#,
            r#""\ud83d""#,
            r#""\ude00""#,
            r#""\ud83d\u0041""#,
            r#""\u12""#,
            r#""\x""#,
            "\"\u{e9}t\u{e9} \u{1F600}\"",
            r#""\u0000""#,
            r#""\uD83D\uDE00""#,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Random strings of escapes and text (a fixed generator: the same every run).
        let pieces = [
            "a",
            "\\n",
            "\\\"",
            "\\\\",
            "\\u00e9",
            "\\ud83d\\ude00",
            "\u{e9}",
            "\u{1F600}",
            "\\/",
            "\\t",
            "\\u0000",
            "z",
        ];
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..500 {
            let mut s = String::from("\"");
            for _ in 0..(x % 20) {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                s.push_str(pieces[(x >> 33) as usize % pieces.len()]);
            }
            s.push('"');
            cases.push(s);
        }
        for raw in cases {
            let want = serde_json::from_str::<String>(&raw).ok();
            let mut buf = b"{\"k\":".to_vec();
            let start = buf.len();
            buf.extend_from_slice(raw.as_bytes());
            buf.extend_from_slice(b"}");
            assert_eq!(string_in_place(buf, start, raw.len()), want, "{raw}");
        }
        assert_eq!(string_in_place(b"[1]".to_vec(), 0, 3), None);
        assert_eq!(string_in_place(b"\"a\"".to_vec(), 1, 9), None);
    }

    /// The start of a long string is read without the rest; short ones are read whole.
    #[test]
    fn string_prefixes_are_cut_on_a_character() {
        let long = format!("\"{}\"", "\\u00e9\\n\u{1F600}ab".repeat(1000));
        let full = serde_json::from_str::<String>(&long).unwrap();
        for max in [0, 1, 5, 17, 100, 4096] {
            let (got, cut) = string_prefix(&long, max).unwrap();
            assert!(cut && got.len() <= max, "{max}: {}", got.len());
            assert!(full.starts_with(&got), "{max}");
        }
        let plain = format!("\"{}\"", "x".repeat(10_000));
        assert_eq!(string_prefix(&plain, 100).unwrap(), ("x".repeat(100), true));
        assert_eq!(string_prefix(r#""ab""#, 10), Some(("ab".into(), false)));
        assert_eq!(string_prefix("[1]", 10), None);
    }

    /// An object written with one member set first reads as the map with that member set.
    #[test]
    fn objects_written_with_a_member_read_as_the_map_would() {
        for obj in [
            r#"{}"#,
            r#"{"id":"a","provider":"spoof","x":[1,{"provider":"kept"}]}"#,
            r#" { "a" : 1 , "provider" : 2 , "provider" : 3 , "b\u0041" : "\n" } "#,
        ] {
            let mut out = Vec::new();
            write_object_with(&mut out, obj, "provider", r#""echo""#).unwrap();
            let got: serde_json::Value = serde_json::from_slice(&out).unwrap();
            let mut want: serde_json::Value = serde_json::from_str(obj).unwrap();
            want["provider"] = serde_json::json!("echo");
            assert_eq!(got, want, "{obj}");
            assert!(out.starts_with(br#"{"provider":"echo""#));
        }
        let mut out = b"keep".to_vec();
        assert!(write_object_with(&mut out, "[1]", "p", "1").is_err());
        assert!(write_object_with(&mut out, r#"{"a":1"#, "p", "1").is_err());
        assert_eq!(out, b"keep");
    }

    #[test]
    fn encode_roundtrip() {
        let err = AbxError::new(ErrorCode::SandboxNotFound, &[("sandbox", "x")]).to_rpc();
        let body = encode_response(Some(&Id::Num(1)), Err(&err));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], 2009);
        assert_eq!(v["error"]["data"]["abx"], "E2009");
        let body = encode_response(None, Ok(&RawValue::from_string("{}".into()).unwrap()));
        assert_eq!(body, br#"{"jsonrpc":"2.0","id":null,"result":{}}"#);
        let b = encode_batch(&[b"1".to_vec(), b"2".to_vec()]);
        assert_eq!(b, b"[1,2]");
    }
}
