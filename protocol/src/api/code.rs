//! `code/*` methods (feature `code.interpret`): run a cell in a long-lived interpreter of
//! the sandbox (a context), its `code/output` notifications, and the context methods.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// `code/run` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct CodeRunParams {
    /// Sandbox id.
    pub sandbox: String,
    /// The code (a cell: several statements; the value of a last expression is a result).
    pub code: String,
    /// `python` (default), `javascript` or `bash` (aliases: `py`, `python3`, `js`, `node`,
    /// `sh`, `shell`); with `context`, must match the context's language when given.
    #[serde(default)]
    pub language: Option<String>,
    /// The context to run in (default: the sandbox's default context of the language).
    #[serde(default)]
    pub context: Option<String>,
    /// Seconds before the cell is interrupted (the context and its variables stay).
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Environment set in the interpreter for this cell (and left set).
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Echoed in every `code/output` of this run, so a client can tie them to the request.
    #[serde(default)]
    pub run_id: Option<String>,
}

/// An error raised by code run with `code/run`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CodeError {
    /// Error name (`NameError`, `KeyboardInterrupt`, `TimeoutError`, `ExitStatus`, ...).
    pub name: String,
    /// Error value (its message).
    pub value: String,
    /// The formatted traceback.
    pub traceback: String,
}

/// A rich result: MIME type -> data (`text/plain`, `text/html`, `text/markdown`,
/// `image/svg+xml` as text; `image/png`, `image/jpeg` base64; `application/json` as JSON).
pub type MimeBundle = Map<String, Value>;

/// `code/run` result: the whole execution.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CodeResult {
    /// Rich results in order (displayed objects, figures, the last expression's value).
    pub results: Vec<MimeBundle>,
    /// Standard output of the cell.
    pub stdout: String,
    /// Standard error of the cell.
    pub stderr: String,
    /// The error, or `null`.
    pub error: Option<CodeError>,
    /// This context's count of cells run, this one included.
    #[serde(default)]
    pub execution_count: u64,
    /// The context the cell ran in.
    #[serde(default)]
    pub context: String,
    /// The `timeout` interrupted the cell.
    #[serde(default)]
    pub timed_out: bool,
    /// The context was restarted (its state lost): an interrupt that did not finish in
    /// time, or the interpreter ended.
    #[serde(default)]
    pub restarted: bool,
    /// Some output (beyond 16 MiB a stream, 8 MiB a frame) or results (beyond an estimated
    /// 32 MiB) were left out of this reply; the `code/output` notifications carried what
    /// the budget allowed (issue 42).
    #[serde(default)]
    pub truncated: bool,
}

/// `code/output` notification params: one event of a running cell, in order.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CodeOutput {
    /// Sandbox id.
    pub sandbox: String,
    /// The context.
    pub context: String,
    /// The run's `runId`, when it gave one.
    #[serde(default)]
    pub run_id: Option<String>,
    /// `stdout`, `stderr`, `result`, `error` or `restarted`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of `stdout` / `stderr`; the reason of `restarted`.
    #[serde(default)]
    pub text: Option<String>,
    /// The MIME bundle of a `result`.
    #[serde(default)]
    pub result: Option<MimeBundle>,
    /// The error of `error`.
    #[serde(default)]
    pub error: Option<CodeError>,
}

/// `code/createContext` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct CodeCreateContextParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Language (as in `code/run`; default `python`).
    #[serde(default)]
    pub language: Option<String>,
    /// Working directory the interpreter starts in (default `/workspace`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// The interpreter program inside the sandbox (default `python3`, `node`, `bash` found
    /// on the sandbox's PATH), e.g. a virtualenv's `/path/venv/bin/python`.
    #[serde(default)]
    pub interpreter: Option<String>,
    /// Environment of the interpreter.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
}

/// `code/restartContext` / `code/removeContext` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct CodeContextParams {
    /// Sandbox id.
    pub sandbox: String,
    /// The context id.
    pub context: String,
}

/// A code context: a long-lived interpreter of a sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CodeContext {
    /// Context id (a default context's is `default-<language>`).
    pub id: String,
    /// Its sandbox.
    pub sandbox: String,
    /// `python`, `javascript` or `bash`.
    pub language: String,
    /// The directory it started in.
    pub cwd: String,
    /// The sandbox's default context of its language.
    #[serde(default)]
    pub default: bool,
    /// Cells run since it (re)started.
    #[serde(default)]
    pub execution_count: u64,
    /// Its interpreter is running (it starts on the first run).
    #[serde(default)]
    pub running: bool,
    /// Times it was restarted.
    #[serde(default)]
    pub restarts: u64,
    /// Runs waiting for its running cell.
    #[serde(default)]
    pub queued: u64,
}

/// `code/listContexts` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CodeContexts {
    /// The sandbox's contexts.
    pub contexts: Vec<CodeContext>,
}
