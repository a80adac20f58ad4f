//! How the CLI prints: errors as `[E2009] message` + `  Suggestion: ...` on stderr (or a
//! JSON object on stdout with -j), and the exit codes 0, 1, 2 (usage, refused), 4 (not found).
//!
//! Everything meant for stdout goes through [`out`] / [`out_bytes`]: a reader that went
//! away (`abx list | head -1`) ends abx quietly instead of panicking.

use abx_protocol::{AbxError, ErrorCode, RpcError};
use serde_json::{json, Value};
use std::io::Write;

/// A CLI failure: what to print and the exit code.
#[derive(Debug)]
pub struct Failure {
    /// `E2009`.
    pub abx: String,
    /// The message.
    pub message: String,
    /// What to do.
    pub suggestion: Option<String>,
    /// Exit code.
    pub exit: i32,
    /// What -v adds (boxed: failures travel in every `Result`).
    pub extra: Box<Extra>,
}

/// The detail of a [`Failure`] shown with -v.
#[derive(Debug, Default)]
pub struct Extra {
    /// The broker method that failed.
    pub method: Option<String>,
    /// The JSON-RPC error code and the rest of `error.data`.
    pub detail: Option<Value>,
}

impl From<AbxError> for Failure {
    fn from(e: AbxError) -> Self {
        let detail = (!e.data.is_empty()).then(|| Value::Object(e.data.clone()));
        Failure {
            abx: e.code.abx(),
            message: e.message,
            suggestion: Some(e.suggestion),
            exit: e.code.exit_code(),
            extra: Box::new(Extra {
                method: None,
                detail,
            }),
        }
    }
}

impl From<RpcError> for Failure {
    fn from(e: RpcError) -> Self {
        let mut detail = json!({"rpcCode": e.code});
        if let Some(Value::Object(data)) = &e.data {
            for (k, v) in data {
                if k != "abx" && k != "suggestion" {
                    detail[k] = v.clone();
                }
            }
        }
        Failure {
            abx: e.abx().map_or_else(|| e.code.to_string(), str::to_owned),
            suggestion: e.suggestion().map(str::to_owned),
            exit: e.exit_code(),
            message: e.message,
            extra: Box::new(Extra {
                method: None,
                detail: Some(detail),
            }),
        }
    }
}

impl From<abx_client::client::CallError> for Failure {
    fn from(e: abx_client::client::CallError) -> Self {
        match e {
            abx_client::client::CallError::Rpc(r) => r.into(),
            abx_client::client::CallError::Broken(b) => b.into(),
        }
    }
}

impl Failure {
    /// A usage error or a refusal (E1009, exit 2) with its own suggestion.
    pub fn usage(message: impl Into<String>, suggestion: impl Into<String>) -> Failure {
        Failure {
            abx: ErrorCode::Usage.abx(),
            message: message.into(),
            suggestion: Some(suggestion.into()),
            exit: ErrorCode::Usage.exit_code(),
            extra: Box::default(),
        }
    }

    /// Record the method that failed.
    pub fn in_method(mut self, method: &str) -> Failure {
        self.extra.method.get_or_insert_with(|| method.to_owned());
        self
    }

    /// Print it the way the user asked; `verbose` adds the method, the JSON-RPC code, the
    /// error's extra data and where the log is.
    pub fn print(&self, json_mode: bool, verbose: bool, log: Option<&std::path::Path>) {
        if json_mode {
            let mut v = json!({
                "status": "error",
                "message": self.message,
                "code": self.abx,
                "suggestion": self.suggestion,
            });
            if verbose {
                v["method"] = json!(self.extra.method);
                v["detail"] = self.extra.detail.clone().unwrap_or(Value::Null);
                v["log"] = json!(log);
            }
            print_json(&v);
        } else {
            let mut s = format!("[{}] {}\n", self.abx, self.message);
            if let Some(sg) = &self.suggestion {
                s.push_str(&format!("  Suggestion: {sg}\n"));
            }
            if verbose {
                if let Some(m) = &self.extra.method {
                    s.push_str(&format!("  Method: {m}\n"));
                }
                if let Some(d) = &self.extra.detail {
                    s.push_str(&format!("  Detail: {d}\n"));
                }
                if let Some(l) = log {
                    s.push_str(&format!("  Broker log: {}\n", l.display()));
                }
            }
            let _ = std::io::stderr().write_all(s.as_bytes());
        }
    }
}

/// Write text to stdout; a closed stdout ends abx quietly (like SIGPIPE would).
pub fn out(s: &str) {
    out_bytes(s.as_bytes());
}

/// Write one line (a newline is added) to stdout.
pub fn line(s: &str) {
    let mut t = String::with_capacity(s.len() + 1);
    t.push_str(s);
    t.push('\n');
    out(&t);
}

/// Write bytes to stdout (see [`out`]).
pub fn out_bytes(b: &[u8]) {
    let mut so = std::io::stdout().lock();
    if let Err(e) = so.write_all(b).and_then(|_| so.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
    }
}

/// Print a JSON value for -j.
pub fn print_json(v: &Value) {
    let mut s = serde_json::to_string_pretty(v).expect("json");
    s.push('\n');
    out(&s);
}

/// Render `key  value` rows aligned, the seed's info layout.
pub fn fields(rows: &[(&str, String)]) -> String {
    let w = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut s = String::new();
    for (k, v) in rows {
        let line = format!("{k:<w$}  {v}");
        s.push_str(line.trim_end_matches(' '));
        s.push('\n');
    }
    s
}

/// Print `key  value` rows aligned.
pub fn print_fields(rows: &[(&str, String)]) {
    out(&fields(rows));
}

/// A JSON value as display text: strings bare, null empty, the rest as JSON.
pub fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The warning line of a provider that failed its part of a listing.
pub fn provider_warning(e: &Value) -> String {
    format!(
        "Warning: provider '{}' could not list its sandboxes: [{}] {}\n  Suggestion: {}\n",
        text(&e["provider"]),
        text(&e["code"]),
        text(&e["message"]),
        text(&e["suggestion"]),
    )
}
