//! `sandbox/*` methods: create, info, list, kill, setTimeout, capabilities, systemInfo, and
//! the `sandbox/changed` notification.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
    /// The digest its image template resolved to when it was created (`local`: pinned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_digest: Option<String>,
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
    /// Its network: a mode (`local`: `none`, `internet` or `host`), or, for a policy, the
    /// policy and what it refused (`{allow, deny, blocked: [{host, port, count, last}]}`).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Option<NetworkView>"))]
    pub network: Option<Value>,
    /// Host directories mounted into it (`sandbox/create` `mounts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<crate::api::Mount>,
}

/// What happened to a sandbox (`sandbox/changed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct SandboxCreateParams {
    /// Provider id (default: `ABX_PROVIDER` of the broker, else the configured default).
    #[serde(default)]
    pub provider: Option<String>,
    /// Template (the provider's; `local` has `base`); unknown: E2005.
    #[serde(default)]
    pub template: Option<String>,
    /// Lifetime in seconds, 1..2592000 (default 300); else E2004.
    // Any JSON: the provider answers E2004 (not E1004) for one that is not a number of seconds.
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(with = "Option<u64>", range(min = 1, max = 2_592_000))
    )]
    pub timeout: Option<Value>,
    /// Environment of every command in the sandbox.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Metadata to attach.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    /// Network of the sandbox (`local`): `none` (loopback only), `internet` (outbound, not
    /// the host's loopback; needs `pasta`), `host`, or a policy `{allow: [pattern...],
    /// deny?: [pattern...]}` (`network.vpc`: only the hosts allowed, through a filtering proxy
    /// on the host); default from the broker config (`[local] network`, else `none`).
    /// Unknown: E1004.
    // Any JSON: the provider checks it and names the bad entry (E1004).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Option<NetworkSpec>"))]
    pub network: Option<Value>,
    /// Limits (`local`): `{memory: bytes | "512M", cpus: 1.5, pids: 256}`; defaults from the
    /// broker config (`[local] memory|cpus|pids`, else 2G memory, 1024 processes).
    // Any JSON: the provider checks it and names the bad limit (`local`: E1004).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Option<SandboxLimits>"))]
    pub limits: Option<Value>,
    /// Host directories to mount (`storage.mount`): `[{source, target?, mode?}]`; `mode` is
    /// `overlay` (default: the host changes only on `sandbox/apply`), `ro` or `rw`.
    // Any JSON: the provider checks each entry and names the bad one (E1004, E2010).
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(with = "Option<Vec<crate::api::MountSpec>>")
    )]
    pub mounts: Option<Value>,
}

/// Limits of a sandbox.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct SandboxParams {
    /// Sandbox id: `id` or `provider:id`; unknown: E2009.
    pub sandbox: String,
}

/// `sandbox/list` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct SandboxListParams {
    /// Only this provider's sandboxes (default: every provider's).
    #[serde(default)]
    pub provider: Option<String>,
}

/// `sandbox/list` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SandboxList {
    /// The sandboxes, oldest first per provider.
    pub sandboxes: Vec<Sandbox>,
    /// Without `provider`: one entry per provider that could not list its sandboxes
    /// (absent when every provider answered); the others' sandboxes are listed anyway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ProviderFailure>,
}

/// A provider that failed its part of a call across providers.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct KillResult {
    /// False when it was gone already (kill is idempotent).
    pub killed: bool,
}

/// `sandbox/setTimeout` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct SetTimeoutParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Seconds from now, 1..2592000; else E2004.
    // Any JSON: the provider answers E2004 (not E1004) for one that is not a number of seconds.
    #[cfg_attr(
        feature = "schema",
        schemars(with = "u64", range(min = 1, max = 2_592_000))
    )]
    pub timeout: Value,
}

/// `sandbox/capabilities` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Capabilities {
    /// Derived from the features: `code`, `files`, `ports`, `processes`, `pty`, `shell`,
    /// `templates`, `watch`.
    pub capabilities: Vec<String>,
    /// The provider's declared features.
    pub features: Vec<String>,
}

/// `sandbox/systemInfo` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

/// A sandbox's network as asked for: a mode, or a policy.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum NetworkSpec {
    /// `none`, `internet` or `host`.
    Mode(String),
    /// Only the hosts allowed.
    Policy(NetworkPolicy),
}

/// An egress policy: what a sandbox may reach, through a filtering proxy on the host.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicy {
    /// What it may reach: `example.com` (that host), `*.example.com` (its subdomains, not the
    /// apex), with an optional `:port` (none: 80 and 443; `:*` every port), an IP or CIDR,
    /// `@NAME` (a set of the broker config's `[network.sets.NAME]`), or `{host: pattern,
    /// headers: {NAME: "secret:KEY"}}`.
    pub allow: Vec<Value>,
    /// What it may not reach, even when allowed (deny wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<Value>,
}

/// A sandbox's network as shown: a mode, or the policy and what it refused.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum NetworkView {
    /// `none`, `internet` or `host`.
    Mode(String),
    /// A policy.
    Policy(NetworkPolicyView),
}

/// A policy sandbox's network in `sandbox/info`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicyView {
    /// As given.
    pub allow: Vec<Value>,
    /// As given.
    #[serde(default)]
    pub deny: Vec<Value>,
    /// Refused attempts per host and port, counted before the refusal was answered.
    #[serde(default)]
    pub blocked: Vec<BlockedCount>,
}

/// Refused attempts to reach one host and port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BlockedCount {
    /// The name (or address) asked for; `other` once 1024 hosts are counted.
    pub host: String,
    /// The port.
    pub port: u16,
    /// How many times.
    pub count: u64,
    /// The last time (RFC 3339 UTC).
    pub last: String,
}

/// `sandbox/setNetwork` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct SetNetworkParams {
    /// The sandbox.
    pub sandbox: String,
    /// A policy (`{allow, deny?}`): new connections follow it, open ones go on. (`local`
    /// cannot switch a running sandbox between modes and a policy: E1004 says so.)
    #[cfg_attr(feature = "schema", schemars(with = "NetworkSpec"))]
    pub network: Value,
}

/// `sandbox/blocked` notification params (to connections that called `sandbox/subscribe`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxBlocked {
    /// The sandbox.
    pub sandbox: String,
    /// Its provider.
    pub provider: String,
    /// The host it tried to reach.
    pub host: String,
    /// The port.
    pub port: u16,
    /// Attempts refused so far for this host and port.
    pub count: u64,
}
