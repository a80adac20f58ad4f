//! The parsed manifest: its types (serialized for clients with secret defaults left out)
//! and what the broker asks of them (config keys in order, runtime paths, features).

use super::rules::{classify_arg, ArgKind};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;

/// The manifest's file name at the plugin root.
pub const FILE_NAME: &str = "abx-provider.toml";
/// The pre-rename file name (refused with a rename hint).
pub const OLD_FILE_NAME: &str = "ebx-provider.toml";
/// The only manifest schema this broker reads.
pub const SCHEMA: u32 = 1;
/// The only plugin protocol this broker speaks.
pub const PROTOCOL: &str = "EPP/1";
/// Filesystem areas a plugin may declare.
pub const FILESYSTEM_AREAS: &[&str] = &["data_dir", "tmp"];

/// A parsed, validated `abx-provider.toml`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 1.
    pub schema: u32,
    /// `^[a-z0-9][a-z0-9-]{0,62}$`.
    pub id: String,
    /// Display name.
    pub name: String,
    /// The plugin's version (free form, non-empty).
    pub version: String,
    /// Always `EPP/1`.
    pub protocol: String,
    /// One paragraph for `provider info`.
    #[serde(default)]
    pub description: String,
    /// Declared features (known names, no duplicates, manifest order).
    #[serde(default)]
    pub features: Vec<String>,
    /// Provider ids this one inherits from (informational).
    #[serde(default)]
    pub inherits: Vec<String>,
    /// How to start the plugin.
    pub runtime: Runtime,
    /// Configuration keys by name.
    #[serde(default)]
    pub config: BTreeMap<String, ConfigKey>,
    /// The configuration key names in manifest order (for display).
    #[serde(default)]
    pub config_order: Vec<String>,
    /// What the plugin says it needs.
    #[serde(default)]
    pub security: Security,
}

/// `[runtime]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Runtime {
    /// The argv, run with the plugin root as working directory. Entries that are paths
    /// (`./x`, `../x`, `/x`, or a first entry containing `/`) must stay inside the root.
    pub command: Vec<String>,
}

/// `[config.KEY]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigKey {
    /// What the key is for.
    #[serde(default)]
    pub description: String,
    /// The default value (never serialized for a secret key).
    #[serde(default)]
    pub default: Option<Value>,
    /// The plugin cannot start without it.
    #[serde(default)]
    pub required: bool,
    /// Never shown: not in info, errors, logs.
    #[serde(default)]
    pub secret: bool,
    /// Environment variable consulted when the key is not configured.
    #[serde(default)]
    pub env: Option<String>,
}

impl Serialize for ConfigKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let show_default = !self.secret && self.default.is_some();
        let n = 3 + usize::from(show_default) + usize::from(self.env.is_some());
        let mut st = s.serialize_struct("ConfigKey", n)?;
        st.serialize_field("description", &self.description)?;
        if show_default {
            st.serialize_field("default", &self.default)?;
        }
        st.serialize_field("required", &self.required)?;
        st.serialize_field("secret", &self.secret)?;
        if let Some(env) = &self.env {
            st.serialize_field("env", env)?;
        }
        st.end()
    }
}

/// `[security]`: what the plugin declares it needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Security {
    /// `[]` none, `["*"]` any, or hosts / `host:port` / `*:port`.
    #[serde(default)]
    pub network: Vec<String>,
    /// Areas it writes: `data_dir`, `tmp`.
    #[serde(default)]
    pub filesystem: Vec<String>,
    /// Whether it starts other programs.
    #[serde(default)]
    pub spawns_processes: bool,
}

impl Manifest {
    /// The configuration keys in manifest order.
    pub fn config_in_order(&self) -> impl Iterator<Item = (&str, &ConfigKey)> + '_ {
        let listed = self
            .config_order
            .iter()
            .filter_map(|k| self.config.get_key_value(k));
        // Keys missing from `config_order` (a hand-built manifest) come last, sorted.
        let rest = self
            .config
            .iter()
            .filter(|(k, _)| !self.config_order.contains(k));
        listed.chain(rest).map(|(k, v)| (k.as_str(), v))
    }

    /// The configuration keys for display, in manifest order:
    /// `[{name, description, required, secret, env?, default?}]`, where `default` appears
    /// only for keys that are not secret.
    pub fn redacted_config(&self) -> Value {
        Value::Array(
            self.config_in_order()
                .map(|(name, key)| {
                    let mut o = serde_json::Map::new();
                    o.insert("name".into(), Value::String(name.to_owned()));
                    o.insert("description".into(), Value::String(key.description.clone()));
                    o.insert("required".into(), Value::Bool(key.required));
                    o.insert("secret".into(), Value::Bool(key.secret));
                    if let Some(env) = &key.env {
                        o.insert("env".into(), Value::String(env.clone()));
                    }
                    if !key.secret {
                        if let Some(d) = &key.default {
                            o.insert("default".into(), d.clone());
                        }
                    }
                    Value::Object(o)
                })
                .collect(),
        )
    }

    /// The runtime argv entries that name files inside the plugin: `(index, path relative
    /// to the plugin root, normalized)`. [`parse`] has already refused those that escape.
    pub fn runtime_paths(&self) -> Vec<(usize, String)> {
        self.runtime
            .command
            .iter()
            .enumerate()
            .filter_map(|(i, arg)| match classify_arg(i, arg) {
                ArgKind::Inside(p) => Some((i, p)),
                _ => None,
            })
            .collect()
    }

    /// True when `feature` is declared.
    pub fn has_feature(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }
}
