//! `exec/*` methods: run, start, write, resize, kill, attach, and their notifications.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// A terminal size.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// `exec/run` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ExecRunParams {
    /// Sandbox id (or `create`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    /// Instead of `sandbox` (issue 48): a sandbox made for this command alone, with these
    /// `sandbox/create` params (their `provider` is the request's), killed once the command
    /// ends; the reply names it (`sandbox`). One request for what is otherwise three.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<Box<super::SandboxCreateParams>>,
    /// A shell string, run with `sh -c` (or give `argv`).
    #[serde(default)]
    pub command: Option<String>,
    /// A program and its arguments, run directly.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Working directory in the sandbox (default `/workspace`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Seconds before the whole process tree is killed (`timedOut: true`).
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Input for stdin (then closed).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Encoding of `stdin`: `utf-8` (default) or `base64`.
    #[serde(default)]
    pub stdin_encoding: Option<String>,
    /// Bytes kept per captured stream (default and maximum 16 MiB; above it E1004); more
    /// output sets `truncated`. Stream larger output with `exec/start`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(max = 16_777_216)))]
    pub max_output: Option<u64>,
    /// Not for `exec/run` (E1004 "pty is for exec/start"): accepted so the error says so.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub pty: Option<PtySize>,
    /// Client metadata (ignored).
    #[serde(default, rename = "_meta")]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub meta: Option<Value>,
}

/// `exec/start` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ExecStartParams {
    /// Sandbox id (or `create`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    /// Instead of `sandbox` (issue 48): a sandbox made for this command alone, with these
    /// `sandbox/create` params (their `provider` is the request's), killed once the command
    /// ends; the reply names it (`sandbox`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<Box<super::SandboxCreateParams>>,
    /// A shell string, run with `sh -c` (or give `argv`).
    #[serde(default)]
    pub command: Option<String>,
    /// A program and its arguments, run directly.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Working directory in the sandbox (default `/workspace`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Seconds before the whole process tree is killed.
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Initial stdin, then closed (else stdin stays open for `exec/write`).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Encoding of `stdin`: `utf-8` (default) or `base64`.
    #[serde(default)]
    pub stdin_encoding: Option<String>,
    /// Ignored by `exec/start` (output is streamed, not capped).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub max_output: Option<u64>,
    /// Run on a pseudo-terminal of this size (needs the `pty` feature); output comes as
    /// stream `pty`.
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Client metadata (ignored).
    #[serde(default, rename = "_meta")]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub meta: Option<Value>,
}

impl From<ExecRunParams> for ExecStartParams {
    /// The same command, for code that spawns both kinds (`maxOutput` and `pty` kept).
    fn from(p: ExecRunParams) -> Self {
        ExecStartParams {
            sandbox: p.sandbox,
            create: p.create,
            command: p.command,
            argv: p.argv,
            cwd: p.cwd,
            env: p.env,
            timeout: p.timeout,
            stdin: p.stdin,
            stdin_encoding: p.stdin_encoding,
            pty: p.pty,
            max_output: p.max_output,
            meta: p.meta,
        }
    }
}

/// `exec/run` (and `commands/run`) result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExecResult {
    /// Exit status (128+N when killed by signal N; `null` when unknown).
    pub exit_code: Option<i64>,
    /// Standard output (base64 when `encoding` says so).
    pub stdout: String,
    /// Standard error (base64 when `encoding` says so).
    pub stderr: String,
    /// The timeout killed it.
    pub timed_out: bool,
    /// How long it ran.
    pub duration_ms: u64,
    /// Output beyond `maxOutput` was dropped (or beyond what the broker's memory budget
    /// could hold then: see `memoryLimited`).
    #[serde(default)]
    pub truncated: bool,
    /// Output was dropped because the broker-wide memory budget (`ABX_MEMORY_BUDGET`) was
    /// in use by other results: run it again, or stream it with `exec/start`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_limited: bool,
    /// The signal that ended it (`SIGKILL`).
    #[serde(default)]
    pub signal: Option<String>,
    /// `base64` when the output is not UTF-8.
    #[serde(default)]
    pub encoding: Option<String>,
    /// The sandbox made for this command (`create`), as `provider:id`; killed already.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// `exec/start` result; then `exec/output` notifications and one `exec/exit`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExecStarted {
    /// The stream's id, for `exec/write`, `exec/kill`, `exec/resize`, `exec/attach`.
    pub exec_id: String,
    /// The process id, when the provider has one.
    #[serde(default)]
    pub pid: Option<i64>,
    /// The sandbox made for this command (`create`), as `provider:id`: killed once the
    /// stream has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// `exec/write` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ExecWriteParams {
    /// The exec.
    pub exec_id: String,
    /// Bytes for stdin.
    #[serde(default)]
    pub data: String,
    /// `utf-8` (default) or `base64`.
    #[serde(default)]
    pub encoding: Option<String>,
    /// Close stdin after writing.
    #[serde(default)]
    pub eof: bool,
}

/// `exec/resize` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ExecResizeParams {
    /// The exec (a pty one).
    pub exec_id: String,
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// `exec/kill` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ExecKillParams {
    /// The exec.
    pub exec_id: String,
    /// Signal name (`TERM`, `SIGINT`, ...); default `KILL`. The whole tree gets it.
    #[serde(default)]
    pub signal: Option<String>,
    /// Escalate when the command ignores the signal (default `true`): `INT`, then
    /// `TERM` 2 s later, then `KILL` 2 s after that, while the command has not ended
    /// (`TERM`, `HUP` and `QUIT`: `KILL` after 2 s; other signals never escalate). `false`
    /// sends only the signal asked for.
    #[serde(default)]
    pub escalate: Option<bool>,
}

/// Params naming an exec.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ExecIdParams {
    /// The exec.
    pub exec_id: String,
}

/// `exec/attach` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AttachResult {
    /// The exec.
    pub exec_id: String,
    /// Whether it still runs.
    pub running: bool,
    /// Bytes of buffered output replayed to this connection.
    pub replayed: u64,
    /// Bytes dropped while no one listened (beyond the 1 MiB buffer).
    pub dropped_bytes: u64,
}

/// `exec/output` notification params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExecOutput {
    /// The exec.
    pub exec_id: String,
    /// `stdout`, `stderr` or `pty`.
    pub stream: String,
    /// The chunk (base64 when `encoding` says so).
    pub data: String,
    /// `base64` when the chunk is not UTF-8.
    #[serde(default)]
    pub encoding: Option<String>,
}

/// `exec/exit` notification params (exactly one per exec, after its output).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExecExit {
    /// The exec.
    pub exec_id: String,
    /// Exit status (128+N when killed by signal N).
    pub exit_code: Option<i64>,
    /// The signal that ended it.
    #[serde(default)]
    pub signal: Option<String>,
    /// The timeout killed it.
    pub timed_out: bool,
}
