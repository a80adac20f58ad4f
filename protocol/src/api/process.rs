//! `process/*` methods: list, kill.

use serde::{Deserialize, Serialize};

/// A process of a sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessEntry {
    /// Process id.
    pub pid: i64,
    /// Parent process id.
    #[serde(default)]
    pub ppid: Option<i64>,
    /// Command line.
    pub command: String,
    /// State (`running`, `sleeping`, `stopped`, `zombie`, ...).
    pub status: String,
}

/// `process/list` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessList {
    /// The sandbox's processes.
    pub processes: Vec<ProcessEntry>,
}

/// `process/kill` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ProcessKillParams {
    /// Sandbox id.
    pub sandbox: String,
    /// A process of that sandbox; else E3006.
    #[cfg_attr(feature = "schema", schemars(with = "i64"))]
    pub pid: i32,
    /// Signal name; default `KILL`.
    #[serde(default)]
    pub signal: Option<String>,
}
