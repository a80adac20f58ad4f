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
            Some(p) if matches!(first_byte(p.get().as_bytes()), Some(b'{' | b'[')) => {
                Some(p.to_owned())
            }
            Some(_) => return Err(invalid(id, "params must be an object or an array")),
        };
        if null_id {
            return Err(invalid(
                None,
                "a request id must be an integer or a string, not null",
            ));
        }
        return Ok(match id {
            Some(id) => Message::Request(Request { id, method, params }),
            None => Message::Notification(Notification { method, params }),
        });
    }
    match (f.result, f.error) {
        (Some(r), None) => Ok(Message::Response(Response {
            id,
            outcome: Ok(r.to_owned()),
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
