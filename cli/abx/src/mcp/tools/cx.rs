//! What a tool call gets ([`Cx`]) and the shapes of its result: a success with text for the
//! model and structured content for programs, a failure as the broker's E-code line and
//! suggestion (`isError: true`), so the model sees it and can correct itself.

use crate::mcp::session::{Era, Out};
use abx_client::client::CallError;
use abx_client::mux::Mux;
use abx_protocol::AbxError;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// What a tool call gets.
pub struct Cx<'a> {
    /// The daemon.
    pub mux: &'a Mux,
    /// stdout, for progress notifications.
    pub out: &'a Out,
    /// `_meta.progressToken` of the request, when the client wants progress.
    pub progress: Option<Value>,
    /// Fired by `notifications/cancelled` (or when the client goes away).
    pub cancel: CancellationToken,
    /// The revision the call is served under.
    pub era: Era,
}

/// A successful result: `text` for the model, `structured` for programs.
pub(super) fn ok(cx: &Cx<'_>, text: String, structured: Value) -> Value {
    let mut r = json!({"content": [{"type": "text", "text": text}], "isError": false});
    if cx.era.structured() {
        r["structuredContent"] = structured;
    }
    r
}

/// A failed result: the E-code line and its suggestion.
pub(super) fn fail_text(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

pub(super) fn fail_abx(e: &AbxError) -> Value {
    fail_text(format!("{e}\nSuggestion: {}", e.suggestion))
}

pub(super) fn fail(e: &CallError) -> Value {
    match e {
        CallError::Rpc(r) => match r.suggestion() {
            Some(s) => fail_text(format!("{r}\nSuggestion: {s}")),
            None => fail_text(r.to_string()),
        },
        CallError::Broken(b) => fail_abx(b),
    }
}

pub(super) fn args<T: DeserializeOwned>(tool: &str, v: Value) -> Result<T, Value> {
    serde_json::from_value(v).map_err(|e| fail_abx(&AbxError::invalid_params(tool, e)))
}

pub(super) fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}
