//! The broker API's types: the params and results of every method, one module per method
//! family. The broker deserializes its params into them, the CLI and the MCP tools build
//! requests from them, and (with the `schema` feature, which derives `schemars::JsonSchema`)
//! [`crate::openrpc`] generates `docs/openrpc.json` and the MCP tools their input schemas
//! from them.
//!
//! They describe the wire as docs/broker-api.md does: field names, optionality, defaults and
//! aliases are what the broker accepts. The broker refuses params members a method's type
//! does not name (E1004), but for the few methods whose params are open ([`params`]; each
//! method's params and result types are its entry in [`crate::catalogue`]); a provider may
//! add fields of its own to results (clients must ignore unknown fields).
//!
//! With the `schema` feature, param types are inlined in the OpenRPC document (each field
//! becomes one by-name param); result types and the types they contain are shared under
//! `components/schemas`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod broker;
pub mod code;
pub mod exec;
pub mod files;
pub mod params;
pub mod ports;
pub mod process;
pub mod provider;
pub mod sandbox;
pub mod secrets;
pub mod templates;
pub mod workspace;

pub use broker::*;
pub use code::*;
pub use exec::*;
pub use files::*;
pub use ports::*;
pub use process::*;
pub use provider::*;
pub use sandbox::*;
pub use secrets::*;
pub use templates::*;
pub use workspace::*;

/// A constant per method and notification name of the broker API (docs/design.md#api),
/// written by the catalogue ([`crate::catalogue::names`]): `methods::PING` is
/// `"broker/ping"`, `methods::SANDBOX_CHANGED` is `"sandbox/changed"`.
pub use crate::catalogue::names as methods;

/// A method without params (a member is refused, unless the method's params are open: see
/// [`params`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct NoParams {}

/// An empty object result (`{}`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Empty {}

/// `p` as the params object a client sends: members that are `null` (an absent option) are
/// left out, so a request carries only what its sender set.
pub fn to_params<T: Serialize>(p: &T) -> Value {
    let mut v = serde_json::to_value(p).unwrap_or_else(|_| Value::Object(Default::default()));
    if let Some(o) = v.as_object_mut() {
        o.retain(|_, x| !x.is_null());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_params_leaves_out_absent_options_only() {
        let p = ExecKillParams {
            exec_id: "e-1".into(),
            signal: None,
            escalate: Some(false),
        };
        assert_eq!(
            to_params(&p),
            serde_json::json!({"execId": "e-1", "escalate": false})
        );
    }
}
