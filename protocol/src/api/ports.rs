//! `ports/url`, `commands/run` and `templates/*` (`code/*` is in [`super::code`]).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// `ports/url` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct PortParams {
    /// Sandbox id.
    pub sandbox: String,
    /// Port number, 1..65535 (else E5002).
    // Any JSON: the provider answers E5002 (not E1004) for one that is not a port number.
    #[cfg_attr(
        feature = "schema",
        schemars(with = "u32", range(min = 1, max = 65535))
    )]
    pub port: Value,
}

/// `ports/url` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PortUrl {
    /// Where a client reaches the port.
    pub url: String,
    /// Headers the client must send.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// `commands/run` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
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
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct TemplatesParams {
    /// Provider id (default: the default provider).
    #[serde(default)]
    pub provider: Option<String>,
    /// Further params, defined by the provider.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A provider-defined result object.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderDefined {
    /// Provider-defined fields.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}
