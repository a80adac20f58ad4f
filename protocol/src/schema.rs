//! Typed params and results of every broker method, with JSON Schemas (`schemars`).
//!
//! These types are the machine-readable description of the broker API: [`crate::openrpc`]
//! builds `docs/openrpc.json` from them, and clients may use them to build requests and
//! read replies. They describe the wire as docs/broker-api.md does; a provider may add
//! fields of its own to results (clients must ignore unknown fields).
//!
//! Param types are inlined in the OpenRPC document (each field becomes one by-name param);
//! result types and the types they contain are shared under `components/schemas`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A method without params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct NoParams {}

/// An empty object result (`{}`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct Empty {}

// ---------------------------------------------------------------------------------------
// Lifecycle and broker methods

/// Name and version of a peer.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct PeerInfo {
    /// Program name, e.g. `abx` or `abx-broker`.
    pub name: String,
    /// Its version.
    #[serde(default)]
    pub version: String,
}

/// `initialize` params (LSP fields are accepted and ignored).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
pub struct InitializeParams {
    /// Who is connecting (shown in logs and `broker/status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_info: Option<PeerInfo>,
}

/// What the broker offers.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrokerCapabilities {
    /// Framings accepted: `line` (newline-delimited JSON) and `content-length`.
    pub framings: Vec<String>,
    /// The largest message accepted, in bytes.
    pub max_message_size: u64,
    /// Every method answered.
    pub methods: Vec<String>,
}

/// `initialize` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// Always `abx/1`.
    pub protocol_version: String,
    /// `abx-broker` and its version.
    pub server_info: PeerInfo,
    /// What this broker offers.
    pub capabilities: BrokerCapabilities,
}

/// `$/cancelRequest` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct CancelParams {
    /// Id of the request to cancel (a number or a string).
    pub id: Value,
}

/// `broker/shutdown` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
pub struct BrokerShutdownParams {
    /// Only stop when no other connection is open and nothing else runs (else E1013).
    #[serde(default)]
    pub if_idle: bool,
}

/// A provider's process as `broker/status` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderProcess {
    /// Provider id.
    pub id: String,
    /// `builtin` or `exec`.
    pub kind: String,
    /// Whether its process runs (builtins always do).
    pub running: bool,
    /// Its pid, when it is a running plugin.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Requests it is serving.
    pub in_flight: u64,
    /// How often it was restarted after a crash.
    pub restarts: u64,
    /// Why it is disabled (crash loop, failed starts), if it is: `provider doctor` retries.
    #[serde(default)]
    pub disabled: Option<String>,
    /// Its last failure, if any.
    #[serde(default)]
    pub last_error: Option<String>,
}

/// `broker/status` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrokerStatus {
    /// The daemon's version.
    pub version: String,
    /// Its pid.
    pub pid: u32,
    /// Milliseconds since it started.
    pub uptime_ms: u64,
    /// When it started (Unix seconds).
    pub started_at: u64,
    /// Open connections.
    pub connections: u64,
    /// Connections subscribed to sandbox changes (`sandbox/subscribe`).
    #[serde(default)]
    pub subscribers: u64,
    /// Requests being served.
    pub in_flight: u64,
    /// The socket path.
    pub socket: String,
    /// The data directory.
    pub data_dir: String,
    /// The log file.
    pub log_file: String,
    /// Every provider and its process.
    pub providers: Vec<ProviderProcess>,
    /// Sandboxes known to all providers.
    pub sandboxes: u64,
}

// ---------------------------------------------------------------------------------------
// Providers

/// A provider as `provider/list` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProviderSummary {
    /// Provider id (`local`, or a plugin's manifest id).
    pub id: String,
    /// Display name.
    pub name: String,
    /// Version.
    pub version: String,
    /// `builtin` or `exec` (a plugin process speaking EPP/1).
    pub kind: String,
    /// `builtin`, `pinned`, `unpinned` or `local`.
    pub trust: String,
    /// Declared features (DESIGN §5), e.g. `sandbox.lifecycle`.
    pub features: Vec<String>,
    /// Whether it is the default provider.
    pub default: bool,
}

/// `provider/list` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProviderList {
    /// Every installed provider, builtins first.
    pub providers: Vec<ProviderSummary>,
}

/// Params naming a provider.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct ProviderIdParams {
    /// Provider id.
    pub id: String,
}

/// `provider/info` result: the summary, its description, and what the provider has.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProviderInfo {
    /// Provider id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Version.
    pub version: String,
    /// `builtin` or `exec`.
    pub kind: String,
    /// Trust level.
    pub trust: String,
    /// Declared features.
    pub features: Vec<String>,
    /// Whether it is the default provider.
    pub default: bool,
    /// What it is.
    pub description: String,
    /// The rest: config keys (secrets flagged, secret defaults never shown), inherits,
    /// source `{url, subdir, ref, commit}`, digest, runtime, templates, security
    /// `{network, filesystem, spawnsProcesses, enforced}`, process, installedAt.
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

/// `provider/install` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
#[schemars(inline)]
pub struct ProviderInstallParams {
    /// A local directory, a git URL or an archive URL.
    pub source: String,
    /// The plugin root inside the source.
    pub subdir: Option<String>,
    /// Git: a full commit id (pinned), or a branch / tag (moving; needs `allowUnpinned`).
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    /// The expected content digest (`sha256:<hex>` or bare hex); else E8013.
    pub sha256: Option<String>,
    /// Accept a moving ref.
    pub allow_unpinned: bool,
    /// Accept `file://` and `http://` sources.
    pub allow_insecure_transport: bool,
    /// The user confirmed the install (else E8012 with the plan).
    pub confirm: bool,
    /// Only return the plan: nothing is written.
    pub dry_run: bool,
    /// Replace an installed provider of the same id.
    pub replace: bool,
}

/// Where a provider came from.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProviderSource {
    /// The source as given.
    pub url: String,
    /// The plugin root inside it.
    #[serde(default)]
    pub subdir: Option<String>,
    /// The ref asked for.
    #[serde(default, rename = "ref")]
    pub git_ref: Option<String>,
    /// The resolved commit (git).
    #[serde(default)]
    pub commit: Option<String>,
}

/// The provider an install replaced (or, for a dry run, would replace).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct PreviousInstall {
    /// Its version.
    pub version: String,
    /// Its digest.
    pub digest: String,
    /// Its commit (git sources).
    #[serde(default)]
    pub commit: Option<String>,
}

/// `provider/install` result: the installed provider, or the plan of a dry run.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct InstallPlan {
    /// Manifest id.
    pub id: String,
    /// Manifest name.
    pub name: String,
    /// Manifest version.
    pub version: String,
    /// Trust level it gets: `pinned`, `unpinned` or `local`.
    pub trust: String,
    /// Source, with the resolved commit.
    pub source: ProviderSource,
    /// Content digest (`sha256:<hex>`).
    pub digest: String,
    /// The manifest (`abx-provider.toml` as JSON, without secret defaults).
    pub manifest: Map<String, Value>,
    /// Declared security: `{network, filesystem, spawnsProcesses, ...}`.
    pub security: Map<String, Value>,
    /// The installed tree (absent for a dry run).
    #[serde(default)]
    pub path: Option<String>,
    /// False for a dry run.
    pub installed: bool,
    /// The provider this replaced, if any.
    #[serde(default)]
    pub previous: Option<PreviousInstall>,
}

/// `provider/uninstall` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct ProviderUninstallParams {
    /// Provider id.
    pub id: String,
    /// The user confirmed (else E8012).
    #[serde(default)]
    pub confirm: bool,
}

/// `provider/update` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct ProviderUpdateParams {
    /// Only this provider (default: every installed plugin).
    #[serde(default)]
    pub id: Option<String>,
    /// Only report what would change.
    #[serde(default)]
    pub check: bool,
    /// Another git ref to follow.
    #[serde(default, rename = "ref")]
    pub git_ref: Option<String>,
}

/// One provider's outcome of `provider/update`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStatus {
    /// Provider id.
    pub id: String,
    /// Installed version.
    pub from: String,
    /// Available version (`null` on error).
    pub to: Option<String>,
    /// Installed digest.
    #[serde(default)]
    pub from_digest: Option<String>,
    /// Available digest.
    #[serde(default)]
    pub to_digest: Option<String>,
    /// `up-to-date`, `update-available`, `repair-available`, `updated`, `repaired` or `error`.
    pub status: String,
    /// Why it failed (`status: error`).
    #[serde(default)]
    pub error: Option<String>,
}

/// `provider/update` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct UpdateResult {
    /// One entry per provider considered.
    pub providers: Vec<UpdateStatus>,
}

/// One check of `provider/doctor`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DoctorCheck {
    /// `installed`, `integrity`, `config`, `handshake` or `permissions`.
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// The E-code of a failure.
    #[serde(default)]
    pub code: Option<String>,
}

/// `provider/doctor` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct DoctorResult {
    /// The checks, in order; they stop at the first integrity failure.
    pub checks: Vec<DoctorCheck>,
    /// Whether every check passed.
    pub ok: bool,
}

/// `provider/configure` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct ProviderConfigureParams {
    /// Provider id.
    pub id: String,
    /// Keys of the manifest's `[config]` and their values (`null` removes a value).
    pub values: Map<String, Value>,
}

/// `provider/configure` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ConfigureResult {
    /// The keys now stored.
    pub configured: Vec<String>,
}

/// `provider/test` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct ProviderTestParams {
    /// Provider id.
    pub id: String,
    /// Only the contract tests whose name contains this.
    #[serde(default)]
    pub filter: Option<String>,
    /// Tests run at once (default 16, at least 1): 1 for a provider whose sandboxes
    /// share one endpoint (`abx provider test ID --concurrency N`).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub concurrency: Option<u64>,
}

/// One contract test of `provider/test`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TestOutcome {
    /// Test name.
    pub name: String,
    /// `passed`, `failed` or `skipped`.
    pub outcome: String,
    /// Why it failed or was skipped.
    #[serde(default)]
    pub detail: Option<String>,
    /// How long it took.
    pub duration_ms: u64,
}

/// `provider/testResult` notification params: one finished test of `provider/test`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TestResultNote {
    /// The provider under test.
    pub id: String,
    /// The test.
    #[serde(flatten)]
    pub test: TestOutcome,
}

/// `provider/test` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct TestResult {
    /// Every test run.
    pub results: Vec<TestOutcome>,
    /// Count passed.
    pub passed: u64,
    /// Count failed.
    pub failed: u64,
    /// Count skipped.
    pub skipped: u64,
    /// Tests that ran at once.
    #[serde(default)]
    pub concurrency: Option<u64>,
}

// ---------------------------------------------------------------------------------------
// Sandboxes

/// A sandbox.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// The provider's id of the sandbox (`provider:id` also routes).
    pub id: String,
    /// The provider that holds it.
    pub provider: String,
    /// `running` or `paused`.
    pub status: String,
    /// Its template.
    #[serde(default)]
    pub template: Option<String>,
    /// A provider URL of the sandbox.
    #[serde(default)]
    pub url: Option<String>,
    /// Where it runs.
    #[serde(default)]
    pub region: Option<String>,
    /// Its lifetime in seconds.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// When it started (RFC 3339 UTC).
    #[serde(default)]
    pub started_at: Option<String>,
    /// When it ends (RFC 3339 UTC).
    #[serde(default)]
    pub expires_at: Option<String>,
    /// Metadata given at create.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// Its network mode (`local`: `none`, `internet` or `host`).
    #[serde(default)]
    pub network: Option<String>,
}

/// What happened to a sandbox (`sandbox/changed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SandboxChange {
    /// It was created (through the broker, or reported by its provider).
    Created,
    /// It was killed.
    Killed,
    /// It was paused.
    Paused,
    /// It was resumed.
    Resumed,
    /// Its lifetime ended and it was reaped (no client acted).
    Expired,
    /// Its lifetime was changed (`sandbox/setTimeout`): `sandboxInfo.expiresAt` is the new end.
    Timeout,
}

/// `sandbox/changed` notification params (to connections that called `sandbox/subscribe`).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxChanged {
    /// The sandbox's id as `sandbox/list` shows it (`provider:sandbox` always routes to it).
    pub sandbox: String,
    /// The provider that holds it.
    pub provider: String,
    /// What happened.
    pub change: SandboxChange,
    /// The sandbox as `sandbox/info` returns it, where known (never for killed / expired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_info: Option<Sandbox>,
}

/// `sandbox/create` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct SandboxCreateParams {
    /// Provider id (default: `ABX_PROVIDER` of the broker, else the configured default).
    #[serde(default)]
    pub provider: Option<String>,
    /// Template (the provider's; `local` has `base`); unknown: E2005.
    #[serde(default)]
    pub template: Option<String>,
    /// Lifetime in seconds, 1..2592000 (default 300); else E2004.
    #[serde(default)]
    #[schemars(range(min = 1, max = 2_592_000))]
    pub timeout: Option<u64>,
    /// Environment of every command in the sandbox.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Metadata to attach.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    /// Network of the sandbox (`local`): `none` (loopback only), `internet` (outbound, not
    /// the host's loopback; needs `pasta`) or `host`; default from the broker config
    /// (`[local] network`, else `none`). Unknown: E1004.
    #[serde(default)]
    pub network: Option<String>,
    /// Limits (`local`): `{memory: bytes | "512M", cpus: 1.5, pids: 256}`; defaults from the
    /// broker config (`[local] memory|cpus|pids`, else 2G memory, 1024 processes).
    #[serde(default)]
    pub limits: Option<SandboxLimits>,
}

/// Limits of a sandbox.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct SandboxLimits {
    /// Memory: bytes, or a string with a unit (`512M`, `2G`); the OOM killer ends a command
    /// that goes over it (`oomKilled: true` in its exit).
    #[serde(default)]
    pub memory: Option<Value>,
    /// CPUs (`0.5`: half a core).
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Processes and threads.
    #[serde(default)]
    pub pids: Option<u64>,
}

/// Params naming a sandbox.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct SandboxParams {
    /// Sandbox id: `id` or `provider:id`; unknown: E2009.
    pub sandbox: String,
}

/// `sandbox/list` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct SandboxListParams {
    /// Only this provider's sandboxes (default: every provider's).
    #[serde(default)]
    pub provider: Option<String>,
}

/// `sandbox/list` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct SandboxList {
    /// The sandboxes, oldest first per provider.
    pub sandboxes: Vec<Sandbox>,
    /// Without `provider`: one entry per provider that could not list its sandboxes
    /// (absent when every provider answered); the others' sandboxes are listed anyway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ProviderFailure>,
}

/// A provider that failed its part of a call across providers.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProviderFailure {
    /// The provider's id.
    pub provider: String,
    /// Its error's code, e.g. `E8011`.
    pub code: String,
    /// Its error's message.
    pub message: String,
    /// What to do about it.
    pub suggestion: String,
}

/// `sandbox/kill` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct KillResult {
    /// False when it was gone already (kill is idempotent).
    pub killed: bool,
}

/// `sandbox/setTimeout` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct SetTimeoutParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Seconds from now, 1..2592000; else E2004.
    #[schemars(range(min = 1, max = 2_592_000))]
    pub timeout: u64,
}

/// `sandbox/capabilities` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Capabilities {
    /// Derived from the features: `code`, `files`, `ports`, `processes`, `pty`, `shell`,
    /// `templates`, `watch`.
    pub capabilities: Vec<String>,
    /// The provider's declared features.
    pub features: Vec<String>,
}

/// `sandbox/systemInfo` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemInfo {
    /// Operating system (`Linux`).
    pub os: String,
    /// CPU architecture (`x86_64`).
    pub arch: String,
    /// Host name.
    pub hostname: String,
    /// Kernel release.
    #[serde(default)]
    pub kernel: Option<String>,
    /// CPUs available.
    pub cpu_count: u64,
    /// Memory in MB.
    #[serde(default)]
    pub memory_total_mb: Option<u64>,
    /// Disk size in GB.
    pub disk_total_gb: f64,
    /// Free disk in GB.
    pub disk_free_gb: f64,
    /// How the sandbox is confined: `{model, landlock: {abi, enforced}, namespaces, network}`.
    #[serde(default)]
    pub isolation: Option<Map<String, Value>>,
}

// ---------------------------------------------------------------------------------------
// Exec

/// A terminal size.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema)]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// `exec/run` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
pub struct ExecRunParams {
    /// Sandbox id.
    pub sandbox: String,
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
    #[schemars(range(max = 16_777_216))]
    pub max_output: Option<u64>,
}

/// `exec/start` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
pub struct ExecStartParams {
    /// Sandbox id.
    pub sandbox: String,
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
    /// Run on a pseudo-terminal of this size (needs the `pty` feature); output comes as
    /// stream `pty`.
    #[serde(default)]
    pub pty: Option<PtySize>,
}

/// `exec/run` (and `commands/run`) result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
}

/// `exec/start` result; then `exec/output` notifications and one `exec/exit`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecStarted {
    /// The stream's id, for `exec/write`, `exec/kill`, `exec/resize`, `exec/attach`.
    pub exec_id: String,
    /// The process id, when the provider has one.
    #[serde(default)]
    pub pid: Option<i64>,
}

/// `exec/write` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
pub struct ExecResizeParams {
    /// The exec (a pty one).
    pub exec_id: String,
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// `exec/kill` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
pub struct ExecIdParams {
    /// The exec.
    pub exec_id: String,
}

/// `exec/attach` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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

// ---------------------------------------------------------------------------------------
// Processes

/// A process of a sandbox.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProcessList {
    /// The sandbox's processes.
    pub processes: Vec<ProcessEntry>,
}

/// `process/kill` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct ProcessKillParams {
    /// Sandbox id.
    pub sandbox: String,
    /// A process of that sandbox; else E3006.
    pub pid: i64,
    /// Signal name; default `KILL`.
    #[serde(default)]
    pub signal: Option<String>,
}

// ---------------------------------------------------------------------------------------
// Files

/// `files/read` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
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
    #[schemars(range(max = 4_194_304))]
    pub length: Option<u64>,
    /// `utf-8` (E4007 if not), `base64`, or absent: utf-8 when valid, else base64.
    #[serde(default)]
    pub encoding: Option<String>,
}

/// `files/read` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct SizeResult {
    /// Bytes.
    pub size: u64,
}

/// `files/list` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct FileList {
    /// Entries, sorted by path.
    pub entries: Vec<FileEntry>,
}

/// Params naming a path of a sandbox.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct PathParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Path in the sandbox.
    pub path: String,
}

/// `files/mkdir` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct RenameParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Current path.
    pub from: String,
    /// New path.
    pub to: String,
}

/// `files/upload` / `files/download` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
pub struct TransferParams {
    /// Sandbox id.
    pub sandbox: String,
    /// A path on the broker's machine, read or written with the user's rights (E4009).
    pub local_path: String,
    /// The path in the sandbox.
    pub path: String,
}

/// `files/upload` / `files/download` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
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
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchStarted {
    /// The watch, for `files/unwatch`.
    pub watch_id: String,
}

/// `files/unwatch` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(inline)]
pub struct UnwatchParams {
    /// The watch.
    pub watch_id: String,
}

/// `files/changed` notification params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
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

// ---------------------------------------------------------------------------------------
// Ports, code, commands, templates

/// `ports/url` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct PortParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Port number, 1..65535 (else E5002).
    #[schemars(range(min = 1, max = 65535))]
    pub port: u32,
}

/// `ports/url` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct PortUrl {
    /// Where a client reaches the port.
    pub url: String,
    /// Headers the client must send.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// `code/run` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct CodeRunParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Language of the code (`python`, ...).
    pub language: String,
    /// The code.
    pub code: String,
}

/// An error raised by code run with `code/run`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct CodeError {
    /// Error name.
    pub name: String,
    /// Error value.
    pub value: String,
    /// Traceback.
    pub traceback: String,
}

/// `code/run` result.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct CodeResult {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Rich results (interpreter-defined).
    pub results: Vec<Value>,
    /// The error, or `null`.
    pub error: Option<CodeError>,
}

/// `commands/run` params.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct CommandRunParams {
    /// Sandbox id.
    pub sandbox: String,
    /// A named command of the sandbox's template (unknown: -32602).
    pub name: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Option<Vec<String>>,
}

/// `templates/*` params: the provider, plus what the provider's template methods take.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct TemplatesParams {
    /// Provider id (default: the default provider).
    #[serde(default)]
    pub provider: Option<String>,
    /// Further params, defined by the provider.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A provider-defined result object.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ProviderDefined {
    /// Provider-defined fields.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}
