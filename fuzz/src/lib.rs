//! The bodies of the fuzz targets, shared by the libFuzzer binaries (`fuzz_targets/*.rs`,
//! run by `scripts/fuzz`) and the corpus replay of `scripts/fuzz-smoke` (`tests/smoke.rs`, a
//! plain `cargo test`). Each target takes arbitrary bytes, must never panic or hang, and checks
//! the properties the broker relies on (bounded buffers, lossless round trips, ids kept on
//! errors, typed error codes). A failed property is a panic, which libFuzzer reports as a crash.
//!
//! | target | what it drives |
//! |---|---|
//! | `codec_line` | `FrameCodec` in newline framing (fixed, and detected from the first byte) |
//! | `codec_header` | `FrameCodec` in `Content-Length` framing (fixed, and detected) |
//! | `decode` | `message::decode`, the request decoder every client frame goes through |
//! | `manifest` | `manifest::parse` of an `abx-provider.toml` |
//! | `epp_reply` | what the plugin host does with a plugin's stdout: `abx_protocol::epp` (the host's own line classification and handshake checks) over the host's codec |
//! | `epp_notification` | the plugin host's handling of one notification line, large ones included (a `@` in the input becomes an array of up to 150,000 zeros): `epp::classify` and `epp::classify_owned` (in place) agree, nothing is built as a tree, a forwarded body keeps its params, a `sandboxInfo` is tagged as a map would be |
//! | `code_frame` | what the daemon does with a code driver's stdout (`broker/local/src/code/frame.rs`, compiled here as [`code_frame_impl`]): the splitter, the frame envelope, the `code/output` body, the tree-cost estimate |
//! | `layer` | an image layer or archive tar stream through the daemon's reader and unpacker (`broker/local/src/templates/`, compiled here in [`images`]), applied into a temp root |
//! | `image_json` | the JSON of images (OCI index and manifest, image config, `docker save` manifest) through the daemon's typed, capped parsers ([`images`]) |
//! | `egress_sni` | the egress proxy's ClientHello reader (`broker/egress/src/sni.rs`, compiled in [`egress`]): the first bytes of a CONNECT tunnel, and the same bytes cut into records |
//! | `egress_policy` | the egress proxy's policy parser and matcher (`broker/egress/src/policy.rs`, [`egress`]): JSON policies, and lines of patterns |
//!
//! The first input byte of the codec targets picks the size limit and how the stream is cut
//! into reads, so one corpus entry covers every split of its bytes the fuzzer cares to try.

use abx_protocol::codec::{Frame, FrameCodec, Framing};
use abx_protocol::epp::{self, PluginLine};
use abx_protocol::message::{self, Incoming, Invalid, Message};
use abx_protocol::{ErrorCode, Id};
use bytes::BytesMut;
use serde_json::Value;
use std::collections::HashMap;
use tokio_util::codec::{Decoder, Encoder};

pub mod egress;
pub mod images;
pub mod smoke;

pub use egress::{egress_policy, egress_sni};
pub use images::{image_json, layer};

/// The daemon's own code for a code driver's frames (`broker/local/src/code/frame.rs`: std,
/// serde, serde_json and abx-protocol only), compiled into this crate as it is.
#[path = "../../broker/local/src/code/frame.rs"]
pub mod code_frame_impl;

/// A target: takes any bytes, panics on a failed property.
pub type Target = fn(&[u8]);

/// Every target by name, for the smoke replay.
pub const TARGETS: &[(&str, Target)] = &[
    ("codec_line", codec_line),
    ("codec_header", codec_header),
    ("decode", decode),
    ("manifest", manifest),
    ("epp_reply", epp_reply),
    ("epp_notification", epp_notification),
    ("code_frame", code_frame),
    ("layer", layer),
    ("image_json", image_json),
    ("egress_sni", egress_sni),
    ("egress_policy", egress_policy),
];

/// The codec's longest header block (private in `codec.rs`; a buffer may hold this much).
const MAX_HEADER_BLOCK: usize = 8 * 1024;

/// What one pass of a decoder over a stream produced.
#[derive(Debug, PartialEq, Eq)]
struct Decoded {
    frames: Vec<Frame>,
    /// The stream ended in an error (framing lost, or EOF inside a message).
    error: bool,
}

impl Decoded {
    fn too_large(&self) -> bool {
        self.frames
            .iter()
            .any(|f| matches!(f, Frame::TooLarge { .. }))
    }
}

/// Feed `input` to `codec` in reads of the sizes `cuts` cycles through, as `FramedRead` does
/// (decode until `None`, then read more; `decode_eof` at the end), checking that the buffer
/// stays bounded and every message is within the limit.
fn run_codec(mut codec: FrameCodec, input: &[u8], cuts: &[usize]) -> Decoded {
    let max = codec.max();
    let bound = max.max(MAX_HEADER_BLOCK);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut pos = 0;
    let mut cut = 0;
    let check = |f: &Frame, frames: &Vec<Frame>| {
        if let Frame::Message(m) = f {
            assert!(
                m.len() <= max,
                "a message of {} bytes over the limit {max}",
                m.len()
            );
        }
        // Every frame consumes input: more frames than bytes means the decoder spins.
        assert!(
            frames.len() <= input.len() + 1,
            "more frames than input bytes"
        );
    };
    loop {
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(f)) => {
                    check(&f, &frames);
                    frames.push(f);
                }
                Ok(None) => break,
                Err(_) => {
                    return Decoded {
                        frames,
                        error: true,
                    }
                }
            }
        }
        assert!(
            buf.len() <= bound,
            "the read buffer holds {} bytes, over {bound} (limit {max})",
            buf.len()
        );
        if pos == input.len() {
            break;
        }
        let n = cuts[cut % cuts.len()].max(1).min(input.len() - pos);
        cut += 1;
        buf.extend_from_slice(&input[pos..pos + n]);
        pos += n;
    }
    loop {
        match codec.decode_eof(&mut buf) {
            Ok(Some(f)) => {
                check(&f, &frames);
                frames.push(f);
            }
            Ok(None) => break,
            Err(_) => {
                return Decoded {
                    frames,
                    error: true,
                }
            }
        }
    }
    Decoded {
        frames,
        error: false,
    }
}

/// The size limit and read sizes chosen by a selector byte.
fn shape(sel: u8) -> (usize, Vec<usize>) {
    let max = [16, 100, 1000, 70_000][usize::from(sel & 3)];
    let cuts = match (sel >> 2) & 7 {
        0 => vec![usize::MAX],
        1 => vec![1],
        2 => vec![2, 3],
        3 => vec![7, 1, 13],
        4 => vec![64],
        5 => vec![4096],
        6 => vec![max, 1],
        _ => vec![max + 1, max - 1, 5],
    };
    (max, cuts)
}

/// Decoding the same stream whole and cut into reads gives the same messages. (At the size
/// limit the two may differ: a line over the limit is only known to be too large once the
/// limit is crossed, and a trailing `\r` or a blank line counts until its newline arrives; so
/// the comparison is made when neither pass saw a message over the limit.)
fn same_whole_and_cut(make: impl Fn() -> FrameCodec, input: &[u8], cuts: &[usize]) {
    let whole = run_codec(make(), input, &[usize::MAX]);
    let cut = run_codec(make(), input, cuts);
    if !whole.too_large() && !cut.too_large() {
        assert_eq!(
            whole, cut,
            "cutting the stream into reads changed what was decoded"
        );
    }
}

/// Encode `bodies` with the codec's `Encoder` and decode them back.
fn round_trip(framing: Framing, detect: bool, bodies: &[&[u8]], max: usize, cuts: &[usize]) {
    let mut enc = FrameCodec::with_framing(framing, max);
    let mut wire = BytesMut::new();
    for b in bodies {
        enc.encode(*b, &mut wire).expect("encode");
    }
    let dec = if detect {
        FrameCodec::new(max)
    } else {
        FrameCodec::with_framing(framing, max)
    };
    let got = run_codec(dec, &wire, cuts);
    let want: Vec<Frame> = bodies
        .iter()
        .map(|b| Frame::Message(BytesMut::from(*b)))
        .collect();
    assert_eq!(
        got,
        Decoded {
            frames: want,
            error: false
        },
        "{framing:?} round trip"
    );
}

/// `FrameCodec` in newline framing: any stream, any cut; lines round-trip.
pub fn codec_line(data: &[u8]) {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let (max, cuts) = shape(sel);
    run_codec(FrameCodec::with_framing(Framing::Line, max), input, &cuts);
    run_codec(FrameCodec::new(max), input, &cuts);
    same_whole_and_cut(
        || FrameCodec::with_framing(Framing::Line, max),
        input,
        &cuts,
    );
    same_whole_and_cut(|| FrameCodec::new(max), input, &cuts);
    // The lines of the input that a sender could send as messages round-trip exactly.
    let bodies: Vec<&[u8]> = input
        .split(|&b| b == b'\n')
        .filter(|l| {
            l.len() <= max && l.last() != Some(&b'\r') && !l.iter().all(u8::is_ascii_whitespace)
        })
        .collect();
    round_trip(Framing::Line, false, &bodies, max, &cuts);
    // With detection the first message must open with `{` or `[` as clients' messages do.
    if bodies
        .first()
        .is_some_and(|b| matches!(b.first(), Some(b'{' | b'[')))
    {
        round_trip(Framing::Line, true, &bodies, max, &cuts);
    }
}

/// `FrameCodec` in `Content-Length` framing: any stream, any cut; any bodies round-trip.
pub fn codec_header(data: &[u8]) {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let (max, cuts) = shape(sel);
    run_codec(FrameCodec::with_framing(Framing::Header, max), input, &cuts);
    same_whole_and_cut(
        || FrameCodec::with_framing(Framing::Header, max),
        input,
        &cuts,
    );
    // Detection takes `C`/`c` as headers: the same stream behind a header, through `new`.
    let mut framed = b"Content-Length: 2\r\n\r\n{}".to_vec();
    framed.extend_from_slice(input);
    run_codec(FrameCodec::new(max), &framed, &cuts);
    same_whole_and_cut(|| FrameCodec::new(max), &framed, &cuts);
    // Any bytes are a body in this framing (NUL separates them here).
    let bodies: Vec<&[u8]> = input
        .split(|&b| b == 0)
        .filter(|b| b.len() <= max)
        .collect();
    round_trip(Framing::Header, false, &bodies, max, &cuts);
    round_trip(Framing::Header, true, &bodies, max, &cuts);
}

/// The id a JSON value would be, if it is a valid id.
fn id_of(v: &Value) -> Option<Id> {
    match v {
        Value::Number(n) => n.as_i64().map(Id::Num),
        Value::String(s) => Some(Id::Str(s.clone())),
        _ => None,
    }
}

/// JSON equality, floats within a relative 1e-12: serde_json parses floats fast rather than
/// correctly rounded, so a float may move by an ulp through a parse/print/parse cycle (found by
/// the `decode` target: `fuzz/regressions/decode/float-ulp`).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// Checks on one decoded message: a valid one re-encodes to itself; an invalid one has a
/// JSON-RPC code, keeps its id where it had a valid one, and serializes as a response.
fn check_decoded(raw: &[u8], item: &Result<Message, Invalid>) {
    match item {
        Ok(m) => {
            let again = message::decode_one(&m.encode())
                .unwrap_or_else(|e| panic!("a decoded message does not re-decode: {e:?}"));
            match (m, &again) {
                (Message::Request(a), Message::Request(b)) => {
                    assert_eq!((&a.id, &a.method), (&b.id, &b.method));
                    assert_eq!(
                        a.params.as_ref().map(|p| p.get()),
                        b.params.as_ref().map(|p| p.get())
                    );
                }
                (Message::Notification(a), Message::Notification(b)) => {
                    assert_eq!(a.method, b.method);
                    assert_eq!(
                        a.params.as_ref().map(|p| p.get()),
                        b.params.as_ref().map(|p| p.get())
                    );
                }
                (Message::Response(a), Message::Response(b)) => {
                    assert_eq!(a.id, b.id);
                    match (&a.outcome, &b.outcome) {
                        (Ok(x), Ok(y)) => assert_eq!(x.get(), y.get()),
                        (Err(x), Err(y)) => {
                            assert_eq!((x.code, &x.message), (y.code, &y.message));
                            let none = Value::Null;
                            assert!(
                                same_json(
                                    x.data.as_ref().unwrap_or(&none),
                                    y.data.as_ref().unwrap_or(&none)
                                ),
                                "error data changed: {x:?} -> {y:?}"
                            );
                        }
                        other => panic!("outcome changed kind: {other:?}"),
                    }
                }
                other => panic!("a message changed kind on re-encoding: {other:?}"),
            }
        }
        Err(inv) => {
            assert!(
                matches!(
                    inv.error.code,
                    ErrorCode::ParseError | ErrorCode::InvalidRequest
                ),
                "unexpected code {:?}",
                inv.error.code
            );
            let rpc = inv.error.to_rpc();
            assert!(rpc.code == -32700 || rpc.code == -32600, "{rpc:?}");
            let body = message::encode_response(inv.id.as_ref(), Err(&rpc));
            let v: Value = serde_json::from_slice(&body).expect("an error response is JSON");
            assert!(v["error"]["data"]["abx"].is_string(), "{v}");
            // The id survives: an object with a valid id is answered with that id.
            if inv.error.code == ErrorCode::InvalidRequest {
                if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(raw) {
                    if let Some(id) = o.get("id").and_then(id_of) {
                        assert_eq!(inv.id.as_ref(), Some(&id), "the id was lost");
                    }
                }
            }
        }
    }
}

/// `message::decode`: single messages and batches.
pub fn decode(data: &[u8]) {
    match message::decode(data) {
        Incoming::Single(item) => check_decoded(data, &item),
        Incoming::Batch(items) => {
            let raws: Vec<&serde_json::value::RawValue> =
                serde_json::from_slice(data).expect("a batch is a JSON array");
            assert_eq!(raws.len(), items.len(), "one result per batch element");
            assert!(!items.is_empty(), "an empty batch is an error, not a batch");
            for (raw, item) in raws.iter().zip(&items) {
                check_decoded(raw.get().as_bytes(), item);
            }
        }
    }
}

/// `manifest::parse`: any text, valid manifests usable, errors typed.
pub fn manifest(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match abx_protocol::manifest::parse(&text) {
        Ok(m) => {
            let _ = m.config_in_order().count();
            let _ = serde_json::to_string(&m.redacted_config()).expect("config serializes");
            let _ = m.runtime_paths();
            let _ = m.has_feature("exec.run");
            assert!(abx_protocol::manifest::is_valid_id(&m.id), "{:?}", m.id);
        }
        Err(e) => {
            assert!(
                matches!(
                    e.code,
                    ErrorCode::InvalidManifest | ErrorCode::ProtocolMismatch
                ),
                "unexpected code {:?}: {}",
                e.code,
                e.message
            );
            let _ = serde_json::to_string(&e.to_rpc()).expect("error serializes");
            let _ = e.to_string();
        }
    }
}

/// A plugin's stdout: newline framing with the host's codec (a smaller limit here so the
/// fuzzer reaches it), then every line classified as the host's reader does, with the
/// handshake's checks on the reply to `initialize` (id 1) and calls 2..=9 pending. The host
/// stops at the first fatal line; so does this.
pub fn epp_reply(data: &[u8]) {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let (_, cuts) = shape(sel);
    let decoded = run_codec(
        FrameCodec::with_framing(Framing::Line, 64 * 1024),
        input,
        &cuts,
    );
    let methods = [
        "initialize",
        "sandbox/list",
        "exec/start",
        "exec/attach",
        "files/watch",
        "exec/run",
        "files/read",
        "sandbox/create",
        "shutdown",
    ];
    let mut pending: HashMap<i64, &str> = (1..).zip(methods).collect();
    let secrets = vec!["s3cret".to_owned(), "tok".to_owned()];
    let declared = vec!["exec.run".to_owned(), "files.rw".to_owned()];
    let leaks = |text: &str| secrets.iter().any(|s| text.contains(s.as_str()));
    for frame in decoded.frames {
        let Frame::Message(line) = frame else {
            return; // a line over the limit kills the plugin
        };
        // The host's own classification (abx_protocol::epp), then its bookkeeping.
        match epp::classify(&line, "fuzz", &secrets) {
            PluginLine::Reply { id, outcome } => {
                let Some(method) = pending.remove(&id) else {
                    continue; // a late reply: ignored
                };
                match outcome {
                    Ok(raw) => {
                        let _ = epp::stream_key(method, &raw);
                        if method == "initialize" {
                            if let Err(e) = epp::check_handshake(&raw, "fuzz", &declared) {
                                assert!(
                                    matches!(
                                        e.code,
                                        ErrorCode::HandshakeFailed | ErrorCode::ProtocolMismatch
                                    ),
                                    "{e:?}"
                                );
                            }
                        }
                    }
                    Err(e) => {
                        let text = serde_json::to_string(&e.to_rpc()).expect("serializes");
                        assert!(
                            !leaks(&e.message) && !leaks(&e.suggestion),
                            "a secret reached an error: {text}"
                        );
                    }
                }
            }
            PluginLine::Stream { body, .. } => {
                // What the forwarder sends on to the client must be a valid message.
                assert!(message::decode_one(&body).is_ok());
            }
            PluginLine::Log { message, .. } => assert!(!leaks(&message), "a secret reached a log"),
            PluginLine::Request { answer, .. } => {
                assert!(matches!(
                    message::decode_one(answer.strip_suffix(b"\n").unwrap_or(&answer)),
                    Ok(Message::Response(_))
                ));
            }
            PluginLine::SandboxChanged {
                sandbox, change, ..
            } => {
                // Only checked reports pass: an id the broker can name, a known change.
                assert!(!sandbox.is_empty() && !sandbox.contains(':'));
                assert!(epp::SANDBOX_CHANGES.contains(&change.as_str()));
            }
            PluginLine::Ignore { .. } | PluginLine::Dropped { .. } => {}
            PluginLine::Fatal(_) => return,
        }
    }
}

/// One line of a plugin's stdout as the host handles a notification (`read_loop` in
/// `broker/plugins/src/host/reader.rs`: `epp::classify` of a short line, `epp::classify_owned` of a
/// long one). The first byte picks how the rest becomes a line: as it is, or as the params of
/// a notification whose method it picks; every `@` in the input is replaced by a JSON array of
/// zeros whose length it picks too (up to 150,000: lines of hundreds of kilobytes from small seeds).
/// Checks: no panic; the borrowed and the in-place readings agree; a stream notification is
/// passed on as a valid notification of the same method with its params as they came, or
/// dropped when larger than a stream takes; a log message is redacted and cut to its bound; a
/// `sandboxInfo` is an object, and tagged with the provider reads as the map with `provider`
/// set; the tree-cost estimate of what it carries is not below its text.
pub fn epp_notification(data: &[u8]) {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let zeros: usize = match sel >> 5 {
        7 => 150_000,
        5 | 6 => 10_000,
        3 | 4 => 1000,
        1 | 2 => 3,
        _ => 0,
    };
    let array = if zeros == 0 {
        b"[]".to_vec()
    } else {
        let mut a = b"[".to_vec();
        a.extend(std::iter::repeat_n(&b"0,"[..], zeros - 1).flatten());
        a.extend_from_slice(b"0]");
        a
    };
    let mut body = Vec::with_capacity(input.len());
    for &b in input {
        if b == b'@' {
            body.extend_from_slice(&array);
        } else {
            body.push(b);
        }
    }
    let methods = [
        None,
        Some("exec/output"),
        Some("exec/exit"),
        Some("files/changed"),
        Some("log"),
        Some("sandbox/changed"),
        Some("x/unknown"),
        Some("files/progress"),
    ];
    let line = match methods[usize::from(sel & 7)] {
        None => body,
        Some(m) => {
            let mut l = format!(r#"{{"jsonrpc":"2.0","method":"{m}","params":"#).into_bytes();
            l.extend_from_slice(&body);
            l.push(b'}');
            l
        }
    };
    let secrets = vec!["s3cret".to_owned()];
    let borrowed = epp::classify(&line, "fuzz", &secrets);
    let owned = epp::classify_owned(line.clone(), "fuzz", &secrets);
    let params = match message::decode(&line) {
        Incoming::Single(Ok(Message::Notification(n))) => n.params,
        _ => None,
    };
    match (&borrowed, &owned) {
        (
            PluginLine::Stream { key, end, body },
            PluginLine::Stream {
                key: k2,
                end: e2,
                body: b2,
            },
        ) => {
            assert_eq!(
                (key, end, body),
                (k2, e2, b2),
                "in place and borrowed differ"
            );
            match message::decode_one(body) {
                Ok(Message::Notification(n)) => {
                    assert_eq!(
                        n.params.as_deref().map_or("null", |p| p.get()),
                        params.as_deref().map_or("null", |p| p.get()),
                        "a forwarded notification changed its params"
                    );
                    assert!(body.len() <= epp::STREAM_NOTIFICATION_MAX + 64 + n.method.len());
                }
                other => panic!("a forwarded body is not a notification: {other:?}"),
            }
        }
        (PluginLine::Dropped { bytes, .. }, PluginLine::Dropped { bytes: b2, .. }) => {
            assert_eq!(bytes, b2);
            assert!(*bytes > epp::STREAM_NOTIFICATION_MAX);
        }
        (
            PluginLine::Log { level, message },
            PluginLine::Log {
                level: l2,
                message: m2,
            },
        ) => {
            assert_eq!((level, message), (l2, m2));
            assert!(!message.contains("s3cret"), "a secret reached a log");
            assert!(level.len() <= 64);
            assert!(
                message.len() <= epp::LOG_MESSAGE_MAX + 32,
                "{}",
                message.len()
            );
        }
        (
            PluginLine::SandboxChanged {
                sandbox,
                change,
                info,
            },
            PluginLine::SandboxChanged {
                sandbox: s2,
                change: c2,
                info: i2,
            },
        ) => {
            assert_eq!((sandbox, change), (s2, c2));
            assert_eq!(
                info.as_deref().map(|i| i.get()),
                i2.as_deref().map(|i| i.get()),
                "in place and borrowed differ"
            );
            assert!(!sandbox.is_empty() && sandbox.len() <= epp::SANDBOX_ID_MAX);
            if let Some(info) = info {
                let text = info.get();
                assert!(text.starts_with('{'));
                let mut tagged = Vec::new();
                message::write_object_with(&mut tagged, text, "provider", "\"fuzz\"")
                    .expect("an object is tagged");
                // As a map would read it (only when the tree is small).
                if message::value_cost(text).is_ok_and(|c| c < 1 << 20) {
                    let mut want: Value = serde_json::from_str(text).expect("JSON");
                    want["provider"] = Value::from("fuzz");
                    let got: Value = serde_json::from_slice(&tagged).expect("tagged is JSON");
                    assert_eq!(got, want, "tagging changed the info");
                }
            }
        }
        (PluginLine::Ignore { method }, PluginLine::Ignore { method: m2 }) => {
            assert_eq!(method, m2)
        }
        (PluginLine::Fatal(_), PluginLine::Fatal(_))
        | (PluginLine::Request { .. }, PluginLine::Request { .. })
        | (PluginLine::Reply { .. }, PluginLine::Reply { .. }) => {}
        (a, b) => panic!("in place and borrowed differ: {a:?} / {b:?}"),
    }
    // What a notification carries costs at least its text as a tree.
    if let Some(p) = params {
        if let Ok(cost) = message::value_cost(p.get()) {
            let strings: usize = p.get().matches('"').count() / 2;
            assert!(
                cost + 2 * strings + 64 >= p.get().len() / 4,
                "cost {cost} of {}",
                p.get().len()
            );
        }
    }
}

/// Count the values of a JSON tree (for the `code_frame` cost check).
fn nodes(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(nodes).sum::<usize>(),
        Value::Object(o) => 1 + o.values().map(nodes).sum::<usize>(),
        _ => 1,
    }
}

/// A code driver's stdout as the daemon reads it (`broker/local/src/code/frame.rs`): split
/// into raw bytes and frames behind a marker, in reads cut as the selector byte says, with a
/// frame size limit it picks too; every frame read as the daemon reads it and passed on as
/// its `code/output` body. Checks: the splitter never holds more than one frame within its
/// limit; no frame over the limit is passed on; the pieces account for every input byte in
/// order; the stream cut into reads gives the same pieces as whole; a text is decoded as
/// serde_json decodes it (lone surrogates as U+FFFD); a result's body is a valid
/// notification carrying the bundle as it came, within the size counted for it; the tree
/// cost estimate is above the bytes and the values of the tree.
pub fn code_frame(data: &[u8]) {
    use code_frame_impl as cf;
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let (max, cuts) = shape(sel);
    let mark: &[u8] = if sel & 0x80 == 0 { b"\x1fNN" } else { b"\x1f" };
    let run = |cuts: &[usize]| {
        let mut sp = cf::Splitter::new(mark, max);
        let mut pieces = Vec::new();
        let mut pos = 0;
        let mut cut = 0;
        while pos < input.len() {
            let n = cuts[cut % cuts.len()].max(1).min(input.len() - pos);
            cut += 1;
            pieces.extend(sp.push(&input[pos..pos + n], false));
            pos += n;
            assert!(
                sp.buf.len() <= max + mark.len(),
                "the splitter holds {} bytes (limit {max})",
                sp.buf.len()
            );
        }
        pieces.extend(sp.take(true));
        assert!(sp.buf.is_empty(), "bytes left at the end");
        pieces
    };
    // Adjacent raw pieces merged (a raw run may come in several reads).
    let merged = |pieces: Vec<cf::Piece>| {
        let mut out: Vec<cf::Piece> = Vec::new();
        for p in pieces {
            match (out.last_mut(), p) {
                (Some(cf::Piece::Raw(a)), cf::Piece::Raw(b)) => a.extend_from_slice(&b),
                (_, p) => out.push(p),
            }
        }
        out
    };
    let whole = merged(run(&[usize::MAX]));
    let cut = merged(run(&cuts));
    assert_eq!(
        whole, cut,
        "cutting the stream into reads changed the pieces"
    );
    // Every input byte accounted for, in order.
    let mut pos = 0;
    for p in &whole {
        match p {
            cf::Piece::Raw(b) => {
                assert!(!b.is_empty());
                assert_eq!(&input[pos..pos + b.len()], &b[..]);
                pos += b.len();
            }
            cf::Piece::Frame(f) => {
                assert!(
                    f.len() <= max,
                    "a frame of {} over the limit {max}",
                    f.len()
                );
                assert_eq!(&input[pos..pos + mark.len()], mark);
                pos += mark.len();
                assert_eq!(&input[pos..pos + f.len()], &f[..]);
                pos += f.len();
                assert_eq!(input[pos], b'\n');
                pos += 1;
            }
            cf::Piece::Dropped(d) => {
                assert_eq!(&input[pos..pos + mark.len()], mark);
                pos += mark.len() + d.bytes;
                if d.closed {
                    assert_eq!(input[pos], b'\n');
                    pos += 1;
                }
            }
        }
    }
    assert_eq!(pos, input.len(), "pieces account for every byte");
    for p in whole {
        if let cf::Piece::Frame(mut f) = p {
            // As the daemon does: lone surrogates mended first (the length stays).
            let len = f.len();
            cf::mend(&mut f);
            assert_eq!(f.len(), len);
            code_frame_event(&f);
        }
    }
}

/// One frame as the daemon reads and passes it on.
fn code_frame_event(f: &[u8]) {
    use code_frame_impl as cf;
    let Some(ev) = cf::parse(f) else {
        return;
    };
    fn out<'a>(
        kind: &'a str,
        text: Option<&'a str>,
        result: Option<&'a serde_json::value::RawValue>,
    ) -> code_frame_impl::Output<'a> {
        code_frame_impl::Output {
            sandbox: "sb",
            context: "ctx",
            run_id: Some("run"),
            kind,
            text,
            result,
            error: None,
        }
    }
    let checked = |o: &cf::Output<'_>| -> Value {
        let body = cf::output_body(o);
        assert!(
            body.len() <= o.size(),
            "a body of {} over the {} counted",
            body.len(),
            o.size()
        );
        match message::decode_one(&body) {
            Ok(Message::Notification(n)) => {
                assert_eq!(n.method, "code/output");
                // Params with a number past f64 (a bundle's, as it came) make no tree here.
                serde_json::from_str(n.params.expect("params").get()).unwrap_or(Value::Null)
            }
            other => panic!("not a notification: {other:?}"),
        }
    };
    match ev {
        cf::Event::Text { text, .. } => {
            // serde_json's own decoding, where it has one (not for lone surrogates).
            if let Ok(v) = serde_json::from_slice::<Value>(f) {
                if let Some(d) = v.get("d").and_then(Value::as_str) {
                    assert_eq!(d, text, "decoded differently");
                }
            }
            let p = checked(&out("stdout", Some(&text), None));
            assert_eq!(p["text"], Value::String(text.into_owned()));
        }
        cf::Event::Result(bundle) => {
            let json = bundle.get();
            assert!(json.starts_with('{'), "a bundle is an object: {json}");
            let cost = cf::tree_cost(json);
            assert!(cost >= json.len());
            let p = checked(&out("result", None, Some(bundle)));
            // A tree where serde_json makes one (not of numbers past f64, which JSON allows
            // and the daemon then passes on as they came, keeping only a marker in a reply).
            if let Ok(tree) = serde_json::from_str::<Value>(json) {
                assert!(cost >= 32 * nodes(&tree), "cost {cost} under the tree");
                if let (Some(plain), Some(s)) =
                    (cf::plain_text(bundle), tree["text/plain"].as_str())
                {
                    assert_eq!(plain, s);
                }
                assert!(same_json(&p["result"], &tree), "the bundle changed");
            }
        }
        cf::Event::Error {
            name,
            value,
            traceback,
        } => {
            let o = cf::Output {
                error: Some(cf::OutError {
                    name: &name,
                    value: &value,
                    traceback: &traceback,
                }),
                ..out("error", None, None)
            };
            let p = checked(&o);
            assert_eq!(
                p["error"]["traceback"],
                Value::String(traceback.into_owned())
            );
        }
        cf::Event::Done(_) | cf::Event::Ready | cf::Event::Other => {}
    }
}
