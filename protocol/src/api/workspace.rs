//! Workspaces (issue 43): host directories mounted into a sandbox (`sandbox/create`'s
//! `mounts`), what the sandbox changed under its overlay mounts (`sandbox/diff`), bringing
//! those changes to the host or dropping them (`sandbox/apply`, `sandbox/discard`), and the
//! history of every command run in a sandbox (`sandbox/log`).
//!
//! Paths in `paths` and in results are absolute paths in the sandbox
//! (`/workspace/proj/a.txt`).

use serde::{Deserialize, Serialize};

/// How a host directory is mounted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum MountMode {
    /// The default: the host tree is read through a copy-on-write layer of the sandbox; the
    /// host changes only on `sandbox/apply`.
    #[default]
    Overlay,
    /// Read-only.
    Ro,
    /// Writes go to the host at once (never the default).
    Rw,
}

impl MountMode {
    /// The wire name (`overlay`, `ro`, `rw`).
    pub fn as_str(self) -> &'static str {
        match self {
            MountMode::Overlay => "overlay",
            MountMode::Ro => "ro",
            MountMode::Rw => "rw",
        }
    }
}

/// A host directory to mount (`sandbox/create` `mounts` entry).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MountSpec {
    /// An absolute path of a directory on the broker's machine. Refused (E2010): the broker's
    /// own directories, `/`, `/proc`, `/sys`, `/dev`, the home directory itself or above it,
    /// and credential directories (`.ssh`, `.gnupg`, `.aws`, ...).
    pub source: String,
    /// Where the sandbox sees it: an absolute path (default `/workspace`); under `/workspace`,
    /// or elsewhere outside the system directories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `overlay` (default), `ro` or `rw`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MountMode>,
}

/// A mount of a sandbox (`Sandbox.mounts`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// The host directory (as resolved at create).
    pub source: String,
    /// Its path in the sandbox.
    pub target: String,
    /// `overlay`, `ro` or `rw`.
    pub mode: MountMode,
}

/// What `sandbox/diff` answers per entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum DiffFormat {
    /// Entries only (the default).
    #[default]
    List,
    /// Entries, and a unified diff (`patch`) for each text entry.
    Patch,
}

/// `sandbox/diff` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
#[serde(rename_all = "camelCase")]
pub struct DiffParams {
    /// The sandbox.
    pub sandbox: String,
    /// One mount, by its target (default: every overlay mount).
    #[serde(default)]
    pub target: Option<String>,
    /// Only these paths (absolute sandbox paths; a directory selects what is beneath it).
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    /// `list` (default) or `patch`.
    #[serde(default)]
    pub format: Option<DiffFormat>,
}

/// How a path differs from the host as it was at create.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ChangeKind {
    /// New in the sandbox.
    Added,
    /// Its content changed.
    Modified,
    /// Removed in the sandbox.
    Deleted,
    /// A file became a directory, a symlink, ... or the other way round.
    TypeChanged,
    /// Only its permission bits changed.
    ModeChanged,
}

/// One changed path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// The absolute path in the sandbox.
    pub path: String,
    /// What changed.
    pub change: ChangeKind,
    /// `file`, `directory` or `symlink`: what the path is in the sandbox (for `deleted`:
    /// what it was on the host).
    #[serde(rename = "type")]
    pub kind: String,
    /// Its size in the sandbox (0 for deleted).
    pub size: u64,
    /// Whether its content is not text (a NUL byte, or not UTF-8, in its first 8 KiB).
    pub binary: bool,
    /// Its permission bits in the sandbox (`0o644` as 420).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// A symlink's target (never followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Whether applying it needs the path named explicitly (an added symlink whose target
    /// leaves the mount's tree).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub explicit_only: bool,
    /// A unified diff (`format: "patch"`, text files only; cut at 1 MiB with a last line
    /// saying so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

/// `sandbox/diff` result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DiffResult {
    /// Every change, sorted by path.
    pub changes: Vec<Change>,
    /// Whether the list was cut (at 100,000 entries; ask again with `paths`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// `sandbox/apply` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
#[serde(rename_all = "camelCase")]
pub struct ApplyParams {
    /// The sandbox.
    pub sandbox: String,
    /// One mount, by its target (default: every overlay mount).
    #[serde(default)]
    pub target: Option<String>,
    /// Only these paths (absolute sandbox paths; a directory selects what is beneath it).
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    /// Say what would be applied, and change nothing.
    #[serde(default)]
    pub dry_run: Option<bool>,
    /// Apply paths whose host file changed since create too (no conflict).
    #[serde(default)]
    pub force: Option<bool>,
}

/// A path and why it was not applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PathReason {
    /// The absolute path in the sandbox.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// `sandbox/apply` result: a conflict is an entry, and the other paths are still applied.
/// Conflicts are part of the result, never an error: E4015 is the code the CLI exits with
/// when there are conflicts (docs/broker-api.md, "Workspaces").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApplyResult {
    /// Written to the host (with `dryRun`: would be).
    pub applied: Vec<String>,
    /// Changed on the host since create (E4015 names them when nothing else was applied).
    pub conflicts: Vec<PathReason>,
    /// Left out, and why (a device node, an added symlink leaving the tree not named, ...).
    pub skipped: Vec<PathReason>,
    /// Whether there were more changes than one call handles (100,000): apply again for the
    /// rest (applied paths leave the diff).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// `sandbox/discard` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
#[serde(rename_all = "camelCase")]
pub struct DiscardParams {
    /// The sandbox.
    pub sandbox: String,
    /// One mount, by its target (default: every overlay mount).
    #[serde(default)]
    pub target: Option<String>,
    /// Only these paths (default: every change).
    #[serde(default)]
    pub paths: Option<Vec<String>>,
}

/// `sandbox/discard` result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DiscardResult {
    /// The paths whose changes were dropped (the sandbox sees the host's version again).
    pub discarded: Vec<String>,
    /// Whether there were more changes than one call handles (100,000): discard again for
    /// the rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// `sandbox/log` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
#[serde(rename_all = "camelCase")]
pub struct LogParams {
    /// The sandbox.
    pub sandbox: String,
    /// Only entries with a larger sequence number.
    #[serde(default)]
    pub since: Option<u64>,
    /// At most this many entries (default and max 1000), the oldest first.
    #[serde(default)]
    pub limit: Option<u64>,
}

/// What kind of command a log entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum LogKind {
    /// `exec/run`.
    Exec,
    /// `exec/start` without a pty.
    Stream,
    /// `exec/start` with a pty.
    Pty,
    /// `code/run`.
    Code,
}

/// One command run in a sandbox.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    /// Its sequence number in the sandbox (from 1).
    pub seq: u64,
    /// What ran it.
    pub kind: LogKind,
    /// The client that asked: its `initialize` `clientInfo.name` (`abx mcp` passes its MCP
    /// client's), else `unknown`.
    pub client: String,
    /// The argv (`exec/*` with `argv`); a `command` runs as `["sh", "-c", command]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// The code of a cell (`code/run`; cut at 64 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// A cell's language.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Its working directory, when one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// When it started (RFC 3339 UTC).
    pub started_at: String,
    /// How long it ran; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Its exit code; absent while it runs, or when it did not start (`error` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// The signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// The E-code it failed with, if it did not run to an exit (`E3003`, `E1006`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `sandbox/log` result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LogResult {
    /// The entries, oldest first.
    pub entries: Vec<LogEntry>,
    /// Entries dropped because the log is bounded (the oldest go first).
    pub dropped: u64,
    /// The largest sequence number so far (pass it as `since` to get only what comes next).
    pub last: u64,
}
