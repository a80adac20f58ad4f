//! What the broker's plugin host makes of a plugin's output (EPP/1, docs/epp-1.md): each
//! line of the plugin's stdout is classified here, without I/O, so the host's reader
//! (`broker/plugins/src/host.rs`) and the `epp_reply` and `epp_notification` fuzz targets run
//! the same code.
//!
//! A line is untrusted and up to 64 MiB: nothing here builds a `serde_json::Value` of it
//! (a tree costs 10 to 40 times its text; issue 42). Notifications are read member by member,
//! raw and borrowed: the few members the host acts on (`execId`, `watchId`, `sandbox`,
//! `change`, `level`, the start of `message`), everything else passed on as it came or
//! dropped.

use crate::error::{AbxError, ErrorCode, RpcError};
use crate::id::Id;
use crate::message::{self, BorrowedStr, Incoming, Message};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;

/// Longest `log` message written to the broker's log (the rest is cut, and said so).
pub const LOG_MESSAGE_MAX: usize = 8 * 1024;
/// A stream notification (`exec/output`, ...) whose params are larger than this is dropped
/// (the host logs it): stream chunks SHOULD be at most 64 KiB (docs/epp-1.md), and each
/// waits in its stream's queue for its client.
pub const STREAM_NOTIFICATION_MAX: usize = 1024 * 1024;
/// Longest sandbox id a `sandbox/changed` report may name (longer ones are ignored).
pub const SANDBOX_ID_MAX: usize = 256;
/// Control replies (a handshake, an `exec/start` result) are read into a tree only when it
/// takes at most this much (else they read as empty).
const CONTROL_VALUE_MAX: usize = 1024 * 1024;

/// One line from a plugin, as the host acts on it.
#[derive(Debug)]
pub enum PluginLine {
    /// A reply to the host's request `id`: the result, or the plugin's error mapped to an
    /// E-code (secrets redacted).
    Reply {
        /// The host's request id.
        id: i64,
        /// Result or mapped error.
        outcome: Result<Box<RawValue>, AbxError>,
    },
    /// A stream notification (`exec/output`, `exec/exit`, `files/changed`,
    /// `files/progress`) for the stream `key` (an exec id, or `watch:<id>`); `end` for
    /// `exec/exit`. `body` is the notification to forward to the stream's client: its params
    /// as the plugin wrote them.
    Stream {
        /// Route key.
        key: String,
        /// The stream ends with this one.
        end: bool,
        /// The encoded notification (no framing).
        body: Vec<u8>,
    },
    /// A `log` notification (message redacted, at most [`LOG_MESSAGE_MAX`] bytes of it).
    Log {
        /// Its level (`info` when missing).
        level: String,
        /// The redacted message (cut, and said so, when it was longer).
        message: String,
    },
    /// A request from the plugin: plugins may not call the broker, so this line (with its
    /// newline) answers it with -32601.
    Request {
        /// The method it asked for.
        method: String,
        /// The answer to write to the plugin's stdin.
        answer: Vec<u8>,
    },
    /// A plugin's report that one of its sandboxes changed (`sandbox/changed {sandbox,
    /// change, sandboxInfo?}`), checked: `sandbox` a non-empty id, `change` one of
    /// [`SANDBOX_CHANGES`], `sandboxInfo` an object when present (else it is left out).
    /// A report that fails the checks is [`PluginLine::Ignore`]d.
    SandboxChanged {
        /// The plugin's own sandbox id.
        sandbox: String,
        /// What happened.
        change: String,
        /// The sandbox as `sandbox/info` returns it, when given: raw, as the plugin wrote
        /// it (the host sets its `provider`).
        info: Option<Box<RawValue>>,
    },
    /// A stream notification larger than [`STREAM_NOTIFICATION_MAX`]: not passed on.
    Dropped {
        /// Its method.
        method: String,
        /// Its stream's route key.
        key: String,
        /// The size of its params.
        bytes: usize,
    },
    /// A notification the host does not use.
    Ignore {
        /// Its method.
        method: String,
    },
    /// The plugin broke the protocol: the host kills it, and calls in flight get E8009
    /// with this reason.
    Fatal(String),
}

/// Classify one line of a plugin's stdout.
pub fn classify(line: &[u8], provider: &str, secrets: &[String]) -> PluginLine {
    classify_incoming(message::decode(line), provider, secrets)
}

/// [`classify`] of a line the host owns: a large result or params is cut out of the line's
/// own buffer ([`message::decode_owned`]), never copied, so what the host counted for the
/// line covers it.
pub fn classify_owned(line: Vec<u8>, provider: &str, secrets: &[String]) -> PluginLine {
    let incoming = match message::decode_owned(line, usize::MAX) {
        Ok(i) => i,
        Err(_) => return PluginLine::Fatal("sent a batch, which EPP/1 does not allow".into()),
    };
    classify_incoming(incoming, provider, secrets)
}

fn classify_incoming(incoming: Incoming, provider: &str, secrets: &[String]) -> PluginLine {
    match incoming {
        Incoming::Single(Ok(Message::Response(r))) => {
            let Some(Id::Num(id)) = r.id else {
                return PluginLine::Fatal("sent a reply with an id the broker never used".into());
            };
            PluginLine::Reply {
                id,
                outcome: r.outcome.map_err(|e| plugin_error(provider, e, secrets)),
            }
        }
        Incoming::Single(Ok(Message::Notification(n))) => {
            let params = n.params.as_deref();
            let m = params.map(Members::read).unwrap_or_default();
            match n.method.as_str() {
                "exec/output" | "exec/exit" | "files/changed" | "files/progress" => {
                    let key = match m.str("execId") {
                        Some(e) => e.into_owned(),
                        None => format!("watch:{}", m.str("watchId").unwrap_or_default()),
                    };
                    let params = params.map_or("null", RawValue::get);
                    if params.len() > STREAM_NOTIFICATION_MAX {
                        return PluginLine::Dropped {
                            method: n.method,
                            key,
                            bytes: params.len(),
                        };
                    }
                    let body = message::encode_notification_with(&n.method, params.len(), |out| {
                        out.extend_from_slice(params.as_bytes())
                    });
                    PluginLine::Stream {
                        key,
                        end: n.method == "exec/exit",
                        body,
                    }
                }
                "sandbox/changed" => {
                    let report = sandbox_changed(&m);
                    drop(m);
                    report.with_info(n.params)
                }
                "log" => {
                    let level = m
                        .get("level")
                        .and_then(|r| message::string_prefix(r.get(), 64))
                        .map_or_else(|| "info".to_owned(), |(s, _)| s);
                    // The start of the message only; a secret the cut went through is
                    // dropped with the rest (its start would not be redacted).
                    let (mut text, cut) = m
                        .get("message")
                        .and_then(|r| message::string_prefix(r.get(), 2 * LOG_MESSAGE_MAX))
                        .unwrap_or_default();
                    if cut {
                        drop_secret_start(&mut text, secrets);
                    }
                    let mut message = redact(&text, secrets);
                    if cut || message.len() > LOG_MESSAGE_MAX {
                        let mut at = LOG_MESSAGE_MAX.min(message.len());
                        while !message.is_char_boundary(at) {
                            at -= 1;
                        }
                        message.truncate(at);
                        message.push_str(" [cut: longer than 8 KiB]");
                    }
                    PluginLine::Log { level, message }
                }
                _ => PluginLine::Ignore { method: n.method },
            }
        }
        Incoming::Single(Ok(Message::Request(req))) => {
            let err = AbxError::new(ErrorCode::MethodNotFound, &[("method", &req.method)]);
            let mut answer = message::encode_response(Some(&req.id), Err(&err.to_rpc()));
            answer.push(b'\n');
            PluginLine::Request {
                method: req.method,
                answer,
            }
        }
        Incoming::Single(Err(inv)) => PluginLine::Fatal(format!(
            "sent something that is not JSON-RPC: {}",
            inv.error.message
        )),
        Incoming::Batch(_) => PluginLine::Fatal("sent a batch, which EPP/1 does not allow".into()),
    }
}

/// The members of a notification's params the host reads, raw and borrowed from its text
/// (the last of a name counts, as a map would read it); every other member is skipped
/// without being built. Params that are not an object have none.
#[derive(Default)]
struct Members<'a> {
    list: Vec<(&'static str, &'a RawValue)>,
    /// Where the params' text starts (members' offsets are taken from it).
    base: usize,
}

/// The members [`Members`] keeps.
const READ: &[&str] = &[
    "execId",
    "watchId",
    "sandbox",
    "change",
    "sandboxInfo",
    "level",
    "message",
];

impl<'a> Members<'a> {
    fn read(params: &'a RawValue) -> Members<'a> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut m = Members::default();
                while let Some(BorrowedStr(k)) = map.next_key()? {
                    match READ.iter().find(|r| **r == k) {
                        Some(name) => {
                            let v: &'de RawValue = map.next_value()?;
                            m.list.retain(|(n, _)| n != name);
                            m.list.push((name, v));
                        }
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(m)
            }
        }
        let mut de = serde_json::Deserializer::from_str(params.get());
        let mut m = de.deserialize_map(V).unwrap_or_default();
        m.base = params.get().as_ptr() as usize;
        m
    }

    fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.list.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// A member that is a string (of at most 64 KiB: an id, a change), else `None`.
    fn str(&self, name: &str) -> Option<Cow<'a, str>> {
        let raw = self.get(name)?;
        if raw.get().len() > 64 * 1024 {
            return None;
        }
        let mut de = serde_json::Deserializer::from_str(raw.get());
        BorrowedStr::deserialize_from(&mut de)
    }
}

impl<'de> BorrowedStr<'de> {
    fn deserialize_from(
        de: &mut serde_json::Deserializer<serde_json::de::StrRead<'de>>,
    ) -> Option<Cow<'de, str>> {
        serde::Deserialize::deserialize(de)
            .ok()
            .map(|BorrowedStr(s)| s)
    }
}

/// The changes `sandbox/changed` reports (docs/broker-api.md, docs/epp-1.md).
pub const SANDBOX_CHANGES: &[&str] = &[
    "created", "killed", "paused", "resumed", "expired", "timeout",
];

/// A checked `sandbox/changed` report: the sandbox, the change, and where its
/// `sandboxInfo` is in the params' text (start, length), when it is to be passed on.
enum Report {
    Ignore,
    Changed {
        sandbox: String,
        change: String,
        info: Option<(usize, usize)>,
    },
}

impl Report {
    /// The line for it, its `sandboxInfo` taken out of `params`: a large one is the params'
    /// own buffer, cut in place (never copied), a small one copied.
    fn with_info(self, params: Option<Box<RawValue>>) -> PluginLine {
        let Report::Changed {
            sandbox,
            change,
            info,
        } = self
        else {
            return PluginLine::Ignore {
                method: "sandbox/changed".into(),
            };
        };
        let info = match (info, params) {
            (Some((start, len)), Some(p)) if len >= message::IN_PLACE => {
                let text: Box<str> = p.into();
                message::raw_in_place(String::from(text).into_bytes(), start, len)
            }
            (Some((start, len)), Some(p)) => p
                .get()
                .get(start..start + len)
                .and_then(|t| RawValue::from_string(t.to_owned()).ok()),
            _ => None,
        };
        PluginLine::SandboxChanged {
            sandbox,
            change,
            info,
        }
    }
}

/// Check a plugin's `sandbox/changed` params.
fn sandbox_changed(m: &Members<'_>) -> Report {
    let sandbox = match m.str("sandbox") {
        Some(s)
            if !s.is_empty()
                && s.len() <= SANDBOX_ID_MAX
                && !s.contains(':')
                && !s.contains(char::is_whitespace) =>
        {
            s.into_owned()
        }
        _ => return Report::Ignore,
    };
    let change = match m.str("change") {
        Some(c) if SANDBOX_CHANGES.contains(&&*c) => c.into_owned(),
        _ => return Report::Ignore,
    };
    let info = match m.get("sandboxInfo") {
        Some(v) if v.get().starts_with('{') && !matches!(change.as_str(), "killed" | "expired") => {
            Some((v.get().as_ptr() as usize - m.base, v.get().len()))
        }
        _ => None,
    };
    Report::Changed {
        sandbox,
        change,
        info,
    }
}

/// Whether a reply to `method` may open a stream (its notifications then go to the caller's
/// connection, after the reply): `exec/start`, `exec/attach`, `files/watch`.
pub fn opens_stream(method: &str) -> bool {
    matches!(method, "exec/start" | "exec/attach" | "files/watch")
}

/// The stream a reply opens: the route key of an `exec/start` / `exec/attach` result
/// (`execId`) or a `files/watch` result (`watch:<watchId>`); None for other methods.
pub fn stream_key(method: &str, result: &RawValue) -> Option<String> {
    if !opens_stream(method) {
        return None;
    }
    let v = message::bounded_value(result.get(), CONTROL_VALUE_MAX)?;
    match (v["execId"].as_str(), v["watchId"].as_str()) {
        (Some(e), _) => Some(e.to_owned()),
        (None, Some(w)) => Some(format!("watch:{w}")),
        _ => None,
    }
}

/// What a plugin said about itself in its `initialize` result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// Provider name it reported.
    pub name: String,
    /// Version it reported.
    pub version: String,
    /// Features it reported.
    pub features: Vec<String>,
}

/// Check an `initialize` result: protocol `EPP/1` (else E8003), the manifest's id (else
/// E8002), no feature the manifest does not declare (else E8002).
pub fn check_handshake(
    result: &RawValue,
    provider: &str,
    declared: &[String],
) -> Result<Handshake, AbxError> {
    let failed = |d: &str| {
        AbxError::new(
            ErrorCode::HandshakeFailed,
            &[("provider", provider), ("detail", d)],
        )
    };
    let v = message::bounded_value(result.get(), CONTROL_VALUE_MAX).unwrap_or(Value::Null);
    match v["protocol"].as_str() {
        Some("EPP/1") => {}
        other => {
            return Err(AbxError::new(
                ErrorCode::ProtocolMismatch,
                &[
                    ("provider", provider),
                    ("protocol", other.unwrap_or("nothing")),
                ],
            ))
        }
    }
    let reported_id = v["provider"]["id"].as_str().unwrap_or_default();
    if reported_id != provider {
        return Err(failed(&format!(
            "it says it is '{reported_id}', the manifest says '{provider}'"
        )));
    }
    let features: Vec<String> = v["features"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if let Some(extra) = features.iter().find(|f| !declared.contains(f)) {
        return Err(failed(&format!(
            "it reports feature '{extra}', which its manifest does not declare"
        )));
    }
    let text = |k: &str| v["provider"][k].as_str().unwrap_or_default().to_owned();
    Ok(Handshake {
        name: text("name"),
        version: text("version"),
        features,
    })
}

/// Drop the end of `text` that is the start of a secret (a text cut there could show it
/// unredacted).
fn drop_secret_start(text: &mut String, secrets: &[String]) {
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        for k in (1..s.len()).rev() {
            if s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                text.truncate(text.len() - k);
                break;
            }
        }
    }
}

/// `text` with every secret value replaced by `[REDACTED]`.
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_owned();
    for s in secrets {
        if !s.is_empty() {
            out = out.replace(s.as_str(), "[REDACTED]");
        }
    }
    out
}

/// A plugin's error reply, passed on with its code (message and suggestion redacted);
/// codes that are not the broker's become E8009.
pub fn plugin_error(provider: &str, e: RpcError, secrets: &[String]) -> AbxError {
    let message = redact(&e.message, secrets);
    match e.error_code() {
        Some(code) => AbxError {
            code,
            message,
            suggestion: redact(e.suggestion().unwrap_or(code.suggestion()), secrets),
            data: serde_json::Map::new(),
        },
        None => AbxError::new(
            ErrorCode::BadPluginReply,
            &[
                ("provider", provider),
                ("detail", &format!("error {}: {message}", e.code)),
            ],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// A plugin's 60 MB notification is read member by member: nothing of untrusted size is
    /// built (the test's own allocations bound it), and what the host acts on is right.
    #[test]
    fn huge_notifications_are_read_raw() {
        let n = 200_000;
        let arr = format!("[{}0]", "0,".repeat(n));
        let secrets = s(&["hunter2"]);
        let line = |method: &str, params: String| {
            format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{params}}}"#).into_bytes()
        };
        // A stream notification is passed on with its params as they came; a larger one
        // than a stream may queue is dropped (and said so).
        let big = format!("[{}0]", "0,".repeat(STREAM_NOTIFICATION_MAX / 2));
        match classify_owned(
            line("exec/output", format!(r#"{{"execId":"e1","junk":{big}}}"#)),
            "p",
            &secrets,
        ) {
            PluginLine::Dropped { key, bytes, .. } => {
                assert_eq!(key, "e1");
                assert!(bytes > STREAM_NOTIFICATION_MAX);
            }
            other => panic!("{other:?}"),
        }
        let params = format!(r#"{{"execId":"e1","junk":{arr},"data":"x"}}"#);
        match classify_owned(line("exec/output", params.clone()), "p", &secrets) {
            PluginLine::Stream { key, end, body } => {
                assert_eq!((key.as_str(), end), ("e1", false));
                let v: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(v["params"]["junk"].as_array().unwrap().len(), n + 1);
                assert_eq!(v["method"], "exec/output");
            }
            other => panic!("{other:?}"),
        }
        // A log message is cut at 8 KiB, redacted first (a secret across the cut too).
        let msg = format!(
            "{}hunter2{}",
            "a".repeat(LOG_MESSAGE_MAX - 3),
            "b".repeat(1 << 20)
        );
        let params = format!(r#"{{"level":"warn","message":"{msg}","junk":{arr}}}"#);
        match classify_owned(line("log", params), "p", &secrets) {
            PluginLine::Log { level, message } => {
                assert_eq!(level, "warn");
                assert!(
                    !message.contains("hun"),
                    "{}",
                    &message[message.len() - 40..]
                );
                assert!(message.len() < LOG_MESSAGE_MAX + 64, "{}", message.len());
                assert!(message.ends_with("[cut: longer than 8 KiB]"));
            }
            other => panic!("{other:?}"),
        }
        // A large sandboxInfo comes out as the plugin wrote it.
        let info = format!(r#"{{"id":"s1","metadata":{{"k":{arr}}}}}"#);
        let params = format!(r#"{{"sandbox":"s1","change":"created","sandboxInfo":{info}}}"#);
        match classify_owned(line("sandbox/changed", params), "p", &secrets) {
            PluginLine::SandboxChanged {
                info: Some(got), ..
            } => assert_eq!(got.get(), info),
            other => panic!("{other:?}"),
        }
        // Unknown methods, params of any shape, ids too long: ignored.
        for (method, params) in [
            ("x/unknown", format!(r#"{{"a":{arr}}}"#)),
            ("log", arr.clone()),
            (
                "sandbox/changed",
                format!(r#"{{"sandbox":"{}","change":"created"}}"#, "s".repeat(300)),
            ),
            (
                "sandbox/changed",
                format!(r#"{{"sandbox":{arr},"change":"created"}}"#),
            ),
        ] {
            match classify_owned(line(method, params), "p", &secrets) {
                PluginLine::Ignore { .. } | PluginLine::Log { .. } => {}
                other => panic!("{method}: {other:?}"),
            }
        }
    }

    #[test]
    fn lines_are_classified() {
        let secrets = s(&["hunter2"]);
        match classify(
            br#"{"jsonrpc":"2.0","id":3,"result":{"execId":"e1"}}"#,
            "p",
            &secrets,
        ) {
            PluginLine::Reply {
                id: 3,
                outcome: Ok(raw),
            } => {
                assert_eq!(stream_key("exec/start", &raw).as_deref(), Some("e1"));
                assert_eq!(stream_key("exec/run", &raw), None);
            }
            other => panic!("{other:?}"),
        }
        match classify(
            br#"{"jsonrpc":"2.0","id":4,"error":{"code":2009,"message":"no hunter2"}}"#,
            "p",
            &secrets,
        ) {
            PluginLine::Reply {
                outcome: Err(e), ..
            } => {
                assert_eq!(e.code, ErrorCode::SandboxNotFound);
                assert_eq!(e.message, "no [REDACTED]");
            }
            other => panic!("{other:?}"),
        }
        match classify(
            br#"{"jsonrpc":"2.0","id":5,"error":{"code":-5,"message":"x"}}"#,
            "p",
            &secrets,
        ) {
            PluginLine::Reply {
                outcome: Err(e), ..
            } => {
                assert_eq!(e.code, ErrorCode::BadPluginReply)
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"exec/exit","params":{"execId":"e1","exitCode":0}}"#, "p", &secrets),
            PluginLine::Stream { ref key, end: true, .. } if key == "e1"
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"files/changed","params":{"watchId":"w"}}"#, "p", &secrets),
            PluginLine::Stream { ref key, end: false, .. } if key == "watch:w"
        ));
        match classify(
            br#"{"jsonrpc":"2.0","method":"sandbox/changed","params":{"sandbox":"s1","change":"paused","sandboxInfo":{"id":"s1"}}}"#,
            "p",
            &secrets,
        ) {
            PluginLine::SandboxChanged {
                sandbox,
                change,
                info,
            } => {
                assert_eq!((sandbox.as_str(), change.as_str()), ("s1", "paused"));
                assert_eq!(info.map(|i| i.get().to_owned()).as_deref(), Some(r#"{"id":"s1"}"#));
            }
            other => panic!("{other:?}"),
        }
        // No info for a sandbox that is gone; bad reports are ignored.
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"sandbox/changed","params":{"sandbox":"s1","change":"expired","sandboxInfo":{"id":"s1"}}}"#, "p", &secrets),
            PluginLine::SandboxChanged { info: None, .. }
        ));
        for bad in [
            &br#"{"jsonrpc":"2.0","method":"sandbox/changed","params":{"sandbox":"s1","change":"exploded"}}"#[..],
            br#"{"jsonrpc":"2.0","method":"sandbox/changed","params":{"sandbox":"other:s1","change":"killed"}}"#,
            br#"{"jsonrpc":"2.0","method":"sandbox/changed","params":{"change":"killed"}}"#,
            br#"{"jsonrpc":"2.0","method":"sandbox/changed","params":{"sandbox":"","change":"killed"}}"#,
        ] {
            assert!(
                matches!(classify(bad, "p", &secrets), PluginLine::Ignore { .. }),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"log","params":{"message":"hunter2!"}}"#, "p", &secrets),
            PluginLine::Log { ref message, .. } if message == "[REDACTED]!"
        ));
        assert!(matches!(
            classify(
                br#"{"jsonrpc":"2.0","id":"x","method":"broker/ping"}"#,
                "p",
                &secrets
            ),
            PluginLine::Request { .. }
        ));
        for bad in [
            &b"nope"[..],
            br#"[{"jsonrpc":"2.0","id":1,"result":1}]"#,
            br#"{"jsonrpc":"2.0","id":"s","result":1}"#,
        ] {
            assert!(
                matches!(classify(bad, "p", &secrets), PluginLine::Fatal(_)),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
