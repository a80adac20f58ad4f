//! Lifecycle and `broker/*` methods: `initialize`, `$/cancelRequest`, `broker/status`,
//! `broker/shutdown`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Name and version of a peer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PeerInfo {
    /// Program name, e.g. `abx` or `abx-broker`.
    pub name: String,
    /// Its version.
    #[serde(default)]
    pub version: String,
}

/// `initialize` params (LSP fields are accepted and ignored).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct InitializeParams {
    /// Who is connecting (shown in logs and `broker/status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_info: Option<PeerInfo>,
}

/// What the broker offers.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// Always `abx/1`.
    pub protocol_version: String,
    /// `abx-broker` and its version.
    pub server_info: PeerInfo,
    // A `BrokerCapabilities`, kept as JSON so a client reads a newer broker's too.
    /// What this broker offers.
    #[cfg_attr(feature = "schema", schemars(with = "BrokerCapabilities"))]
    pub capabilities: Value,
}

/// `$/cancelRequest` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct CancelParams {
    /// Id of the request to cancel (a number or a string).
    #[cfg_attr(feature = "schema", schemars(with = "Value"))]
    pub id: crate::Id,
}

/// `broker/shutdown` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct BrokerShutdownParams {
    /// Only stop when no other connection is open and nothing else runs (else E1013).
    #[serde(default)]
    pub if_idle: bool,
}

/// A provider's process as `broker/status` shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
