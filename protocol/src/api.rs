//! Method names and the param/result types shared by the broker and its clients.

use serde::{Deserialize, Serialize};

/// Method names of the broker API (DESIGN §4) handled by the broker itself.
pub mod methods {
    /// LSP-style handshake (optional for scripts).
    pub const INITIALIZE: &str = "initialize";
    /// Notification after `initialize`.
    pub const INITIALIZED: &str = "initialized";
    /// LSP shutdown request: the connection accepts no more requests.
    pub const SHUTDOWN: &str = "shutdown";
    /// LSP exit notification: the connection closes.
    pub const EXIT: &str = "exit";
    /// Cancel an in-flight request.
    pub const CANCEL_REQUEST: &str = "$/cancelRequest";
    /// Liveness.
    pub const PING: &str = "broker/ping";
    /// Daemon status.
    pub const STATUS: &str = "broker/status";
    /// Stop the daemon.
    pub const BROKER_SHUTDOWN: &str = "broker/shutdown";
    /// This connection receives `sandbox/changed` from now on (idempotent).
    pub const SUBSCRIBE: &str = "sandbox/subscribe";
    /// This connection stops receiving `sandbox/changed` (idempotent).
    pub const UNSUBSCRIBE: &str = "sandbox/unsubscribe";
    /// Notification: a sandbox of some provider changed (to subscribed connections).
    pub const SANDBOX_CHANGED: &str = "sandbox/changed";
}

/// Name and version of a peer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// Program name, e.g. `abx` or `abx-broker`.
    pub name: String,
    /// Its version.
    #[serde(default)]
    pub version: String,
}

/// `initialize` params; every field is optional and unknown LSP fields are ignored.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// Who is connecting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_info: Option<PeerInfo>,
}

/// `initialize` result.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// Always [`crate::PROTOCOL_VERSION`].
    pub protocol_version: String,
    /// The broker's name and version.
    pub server_info: PeerInfo,
    /// What this broker offers.
    pub capabilities: serde_json::Value,
}

/// `$/cancelRequest` params.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct CancelParams {
    /// Id of the request to cancel.
    pub id: crate::Id,
}

/// `broker/shutdown` params.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokerShutdownParams {
    /// Only stop when no other connection is open and nothing is running (version upgrade).
    #[serde(default)]
    pub if_idle: bool,
}
