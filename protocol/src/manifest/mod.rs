//! `abx-provider.toml`: the manifest at the root of every provider plugin (docs/design.md#providers).
//!
//! ```toml
//! schema = 1
//! id = "opensandbox"
//! name = "OpenSandbox"
//! version = "0.1.0"
//! protocol = "EPP/1"
//! description = "Sandboxes on an OpenSandbox server"
//! features = ["sandbox.lifecycle", "exec.run"]
//! inherits = []
//!
//! [runtime]
//! command = ["node", "./provider.mjs"]
//!
//! [config.api_key]
//! description = "API key"
//! required = true
//! secret = true
//! env = "OPENSANDBOX_API_KEY"
//!
//! [security]
//! network = ["*"]            # [] none, ["*"] any, or "host", "host:port", "*:443"
//! filesystem = ["data_dir"]  # "data_dir", "tmp" (a single string is accepted too)
//! spawns_processes = false
//! ```
//!
//! [`parse`] validates everything that can be checked without the filesystem and reports
//! the first problem as E8014 naming the line and the key (E8003 for a protocol other
//! than EPP/1). Error texts never contain configuration values: a secret key's default
//! cannot leak through them. When serialized (JSON, camelCase), a secret key's `default`
//! is omitted, so a [`Manifest`] can be sent to clients as is; the full default stays
//! available to the broker through the parsed value.
//!
//! In three parts: [`model`] (the parsed manifest's types and what the broker asks of
//! them), [`rules`] (the shapes of ids, key and variable names, runtime arguments and
//! network entries) and [`parse`] (the TOML read, checked and reported by line and key).

mod model;
mod parse;
mod rules;

pub use model::*;
pub use parse::parse;
pub use rules::{is_valid_config_key, is_valid_env_name, is_valid_id};
