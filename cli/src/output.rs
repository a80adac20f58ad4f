//! How the CLI prints: errors as `[E2009] message` + `  Suggestion: ...` on stderr (or a
//! JSON object on stdout with -j), and the exit codes 0, 1, 2 (usage, refused), 4 (not found).

use abx_protocol::{AbxError, RpcError};
use serde_json::json;

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
}

impl From<AbxError> for Failure {
    fn from(e: AbxError) -> Self {
        Failure {
            abx: e.code.abx(),
            message: e.message,
            suggestion: Some(e.suggestion),
            exit: e.code.exit_code(),
        }
    }
}

impl From<RpcError> for Failure {
    fn from(e: RpcError) -> Self {
        Failure {
            abx: e.abx().map_or_else(|| e.code.to_string(), str::to_owned),
            suggestion: e.suggestion().map(str::to_owned),
            exit: e.exit_code(),
            message: e.message,
        }
    }
}

impl From<crate::client::CallError> for Failure {
    fn from(e: crate::client::CallError) -> Self {
        match e {
            crate::client::CallError::Rpc(r) => r.into(),
            crate::client::CallError::Broken(b) => b.into(),
        }
    }
}

impl Failure {
    /// Print it the way the user asked.
    pub fn print(&self, json_mode: bool) {
        if json_mode {
            let v = json!({
                "status": "error",
                "message": self.message,
                "code": self.abx,
                "suggestion": self.suggestion,
            });
            println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        } else {
            eprintln!("[{}] {}", self.abx, self.message);
            if let Some(s) = &self.suggestion {
                eprintln!("  Suggestion: {s}");
            }
        }
    }
}

/// Print a JSON value for -j.
pub fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).expect("json"));
}

/// Print `key  value` rows aligned, the seed's info layout.
pub fn print_fields(rows: &[(&str, String)]) {
    let w = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    for (k, v) in rows {
        println!("{k:<w$}  {v}");
    }
}
