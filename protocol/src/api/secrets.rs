//! `secrets/*`: the broker's secret store for egress headers (a network policy's
//! `headers: {NAME: "secret:KEY"}`; docs/local-sandboxes.md, "Credentials that never enter
//! the sandbox"). Values go in, never out: no reply, log or error carries one.

use serde::{Deserialize, Serialize};

/// `secrets/set` params.
#[derive(Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct SecretSetParams {
    /// The key a policy names as `secret:KEY` (letters, digits, `_`, `-`, `.`; at most 128).
    pub key: String,
    /// The value (at most 8 KiB of visible ASCII, spaces and tabs: it goes into an HTTP
    /// header). Stored in a 0600 file of the daemon; never returned.
    pub value: String,
}

impl std::fmt::Debug for SecretSetParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSetParams")
            .field("key", &self.key)
            .field("value", &"[REDACTED]")
            .finish()
    }
}

/// `secrets/remove` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct SecretKeyParams {
    /// The key.
    pub key: String,
}

/// `secrets/list` result: the keys only.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SecretList {
    /// The keys stored, sorted.
    pub keys: Vec<String>,
}

/// `secrets/remove` result.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SecretRemoved {
    /// Whether the key was stored.
    pub removed: bool,
}
