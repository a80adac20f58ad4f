//! What the broker's plugin host makes of a plugin's output (EPP/1, docs/epp-1.md): each
//! line of the plugin's stdout is classified here, without I/O, so the host's reader
//! (`broker/src/plugins/host.rs`) and the `epp_reply` fuzz target run the same code.

use crate::error::{AbxError, ErrorCode, RpcError};
use crate::id::Id;
use crate::message::{self, Incoming, Message};
use serde_json::value::RawValue;
use serde_json::Value;

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
    /// `exec/exit`. `body` is the notification to forward to the stream's client.
    Stream {
        /// Route key.
        key: String,
        /// The stream ends with this one.
        end: bool,
        /// The encoded notification (no framing).
        body: Vec<u8>,
    },
    /// A `log` notification (message redacted).
    Log {
        /// Its level (`info` when missing).
        level: String,
        /// The redacted message.
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
        /// The sandbox as `sandbox/info` returns it, when given.
        info: Option<Value>,
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
    match message::decode(line) {
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
            let params: Value = n
                .params
                .as_deref()
                .and_then(|p| serde_json::from_str(p.get()).ok())
                .unwrap_or(Value::Null);
            match n.method.as_str() {
                "exec/output" | "exec/exit" | "files/changed" | "files/progress" => {
                    let key = match params["execId"].as_str() {
                        Some(e) => e.to_owned(),
                        None => format!("watch:{}", params["watchId"].as_str().unwrap_or_default()),
                    };
                    PluginLine::Stream {
                        key,
                        end: n.method == "exec/exit",
                        body: message::encode_notification(&n.method, Some(&params)),
                    }
                }
                "sandbox/changed" => sandbox_changed(params),
                "log" => PluginLine::Log {
                    level: params["level"].as_str().unwrap_or("info").to_owned(),
                    message: redact(params["message"].as_str().unwrap_or_default(), secrets),
                },
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

/// The changes `sandbox/changed` reports (docs/broker-api.md, docs/epp-1.md).
pub const SANDBOX_CHANGES: &[&str] = &[
    "created", "killed", "paused", "resumed", "expired", "timeout",
];

/// Check a plugin's `sandbox/changed` params.
fn sandbox_changed(mut params: Value) -> PluginLine {
    let ignore = || PluginLine::Ignore {
        method: "sandbox/changed".into(),
    };
    let sandbox = match params["sandbox"].as_str() {
        Some(s) if !s.is_empty() && !s.contains(':') && !s.contains(char::is_whitespace) => {
            s.to_owned()
        }
        _ => return ignore(),
    };
    let change = match params["change"].as_str() {
        Some(c) if SANDBOX_CHANGES.contains(&c) => c.to_owned(),
        _ => return ignore(),
    };
    let info = match params.get_mut("sandboxInfo").map(Value::take) {
        Some(v @ Value::Object(_)) if !matches!(change.as_str(), "killed" | "expired") => Some(v),
        _ => None,
    };
    PluginLine::SandboxChanged {
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
    let v: Value = serde_json::from_str(result.get()).ok()?;
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
    let v: Value = serde_json::from_str(result.get()).unwrap_or(Value::Null);
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
                assert_eq!(info, Some(serde_json::json!({"id": "s1"})));
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
