//! `files/*` methods: read, write, list, stat, mkdir, remove, rename, upload, download,
//! watch, unwatch, and their notifications.

use serde::{Deserialize, Serialize};

/// `files/read` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct FilesReadParams {
    /// Sandbox id.
    pub sandbox: String,
    /// A file under `/workspace` (relative paths too) or `/tmp`; else E4002.
    pub path: String,
    /// Where to start.
    #[serde(default)]
    pub offset: Option<u64>,
    /// Bytes to read (default and maximum 4 MiB; above it E1004: read in chunks).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(max = 4_194_304)))]
    pub length: Option<u64>,
    /// `utf-8` (E4007 if not), `base64`, or absent: utf-8 when valid, else base64.
    #[serde(default)]
    pub encoding: Option<String>,
}

/// `files/read` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FileChunk {
    /// The chunk, as text or base64.
    pub data: String,
    /// `utf-8` or `base64`.
    pub encoding: String,
    /// Size of the whole file.
    pub size: u64,
    /// Whether the chunk reaches the end of the file.
    pub eof: bool,
    /// Where the chunk starts.
    pub offset: u64,
}

/// `files/write` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct FilesWriteParams {
    /// Sandbox id.
    pub sandbox: String,
    /// The file; its directory must exist (else E4001).
    pub path: String,
    /// The bytes, as text or base64.
    pub data: String,
    /// `utf-8` (default) or `base64`.
    #[serde(default)]
    pub encoding: Option<String>,
    /// Write at this offset without truncating (else the file is replaced atomically).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Append at the end.
    #[serde(default)]
    pub append: bool,
    /// Permission bits (e.g. 493 for 0755). Only the 0o1777 bits (rwx for user, group,
    /// other, and sticky) are applied: setuid and setgid are stripped.
    #[serde(default)]
    pub mode: Option<u32>,
}

/// A result holding a size in bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SizeResult {
    /// Bytes.
    pub size: u64,
}

/// `files/list` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct FilesListParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Directory (default `/workspace`).
    #[serde(default)]
    pub path: Option<String>,
    /// Include everything below.
    #[serde(default)]
    pub recursive: bool,
}

/// A directory entry (`files/list`) or a file's status (`files/stat`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    /// Last component (`a.txt`).
    pub name: String,
    /// Sandbox path (`/workspace/dir/a.txt`).
    pub path: String,
    /// `file`, `directory`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits in octal (`0644`).
    pub mode: String,
    /// Last modification (RFC 3339 UTC, with the fraction of a second the file system
    /// keeps, e.g. `2026-12-01T14:38:20.123456789Z`; whole seconds when it has none).
    pub modified_at: String,
}

/// `files/list` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FileList {
    /// Entries, sorted by path.
    pub entries: Vec<FileEntry>,
}

/// Params naming a path of a sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct PathParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Path in the sandbox.
    pub path: String,
}

/// `files/mkdir` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct MkdirParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Directory to create (exists: E4006 unless `parents`).
    pub path: String,
    /// Create missing parents; an existing directory is fine.
    #[serde(default)]
    pub parents: bool,
}

/// `files/remove` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct RemoveParams {
    /// Sandbox id.
    pub sandbox: String,
    /// What to remove.
    pub path: String,
    /// Remove a non-empty directory with its contents (else E4005).
    #[serde(default)]
    pub recursive: bool,
}

/// `files/rename` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct RenameParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Current path.
    pub from: String,
    /// New path.
    pub to: String,
}

/// `files/upload` / `files/download` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct TransferParams {
    /// Sandbox id.
    pub sandbox: String,
    /// A path on the broker's machine, read or written with the user's rights (E4009).
    pub local_path: String,
    /// The path in the sandbox.
    pub path: String,
}

/// `files/upload` / `files/download` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TransferResult {
    /// Bytes copied.
    pub size: u64,
    /// The local path.
    #[serde(default)]
    pub local_path: Option<String>,
    /// The sandbox path.
    #[serde(default)]
    pub path: Option<String>,
}

/// `files/progress` notification params (uploads and downloads).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FilesProgress {
    /// Sandbox id.
    pub sandbox: String,
    /// The sandbox path.
    pub path: String,
    /// Bytes done.
    pub bytes: u64,
    /// Bytes in all.
    pub total: u64,
}

/// `files/watch` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct WatchParams {
    /// Sandbox id.
    pub sandbox: String,
    /// File or directory to watch.
    pub path: String,
    /// Watch everything below.
    #[serde(default)]
    pub recursive: bool,
}

/// `files/watch` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WatchStarted {
    /// The watch, for `files/unwatch`.
    pub watch_id: String,
}

/// `files/unwatch` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct UnwatchParams {
    /// The watch.
    pub watch_id: String,
}

/// `files/changed` notification params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FilesChanged {
    /// The watch.
    pub watch_id: String,
    /// Sandbox id.
    pub sandbox: String,
    /// What changed.
    pub path: String,
    /// `created`, `modified`, `removed` or `renamed`.
    pub kind: String,
}
