//! The OpenRPC description of the broker API (`docs/openrpc.json`), generated from the
//! catalogue of methods ([`crate::catalogue`]), the types of [`crate::api`] and the E-codes
//! of [`crate::error`].
//!
//! [`document`] lists every method of the catalogue (docs/broker-api.md; the broker's own
//! methods and the provider methods it routes) with its by-name params, its result,
//! its errors (references into `components/errors`, one per E-code) and, for provider
//! methods, the feature that gates it (`x-feature`). Notifications a client sends are
//! methods without a result; notifications the broker sends are listed under
//! `x-notifications`, and each method names those it may cause.
//!
//! A test (protocol/tests/openrpc.rs) fails when the checked-in document differs from this
//! one; regenerate with `ABX_UPDATE_OPENRPC=1 cargo test -p abx-protocol --features schema --test openrpc`.

use crate::catalogue::{self, Kind};
use crate::error::ErrorCode;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

/// Makes a type's schema (the catalogue records one per params and result type).
pub(crate) type SchemaFn = fn(&mut SchemaGenerator) -> Value;

/// The schema of `T`: inline, or a reference into `components/schemas`.
pub(crate) fn schema_of<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    let mut schema = g.subschema_for::<T>();
    for t in g.transforms_mut() {
        t.transform(&mut schema);
    }
    schema.to_value()
}

/// `shutdown`'s result.
pub(crate) fn null_schema(_: &mut SchemaGenerator) -> Value {
    json!({"type": "null"})
}

/// The methods the document describes, in order (requests and client notifications).
pub fn method_names() -> Vec<&'static str> {
    catalogue::METHODS.iter().map(|m| m.name).collect()
}

/// Each method the document describes with the Rust types its params and result are
/// generated from (`std::any::type_name`; no result type for notifications and `shutdown`).
pub fn method_types() -> Vec<(&'static str, &'static str, Option<&'static str>)> {
    catalogue::METHODS
        .iter()
        .map(|m| {
            let result = m.result.as_ref().and_then(|r| r.type_name());
            (m.name, m.params.type_name(), result)
        })
        .collect()
}

/// Turn an inline object schema into by-name content descriptors.
fn params_of(schema: &Value) -> Vec<Value> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema["properties"].as_object() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, prop) in props {
        let mut prop = prop.clone();
        let description = prop
            .as_object_mut()
            .and_then(|o| o.remove("description"))
            .unwrap_or(Value::Null);
        let mut cd = json!({
            "name": name,
            "required": required.contains(&name.as_str()),
            "schema": prop,
        });
        if !description.is_null() {
            cd["description"] = description;
        }
        out.push(cd);
    }
    // Required params first, each group in name order.
    out.sort_by_key(|cd| (cd["required"] == json!(false), cd["name"].to_string()));
    out
}

fn error_ref(c: ErrorCode) -> Value {
    json!({"$ref": format!("#/components/errors/{}", c.abx())})
}

fn error_object(c: ErrorCode) -> Value {
    json!({
        "code": c.rpc_code(),
        "message": c.template(),
        "data": {"abx": c.abx(), "suggestion": c.suggestion(), "exitCode": c.exit_code()},
    })
}

/// The OpenRPC 1.3 document of the broker API.
pub fn document() -> Value {
    let mut g = SchemaSettings::draft07()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    let mut methods = Vec::new();
    for m in catalogue::METHODS {
        let params_schema = (m.params_schema)(&mut g);
        let mut o = Map::new();
        o.insert("name".into(), json!(m.name));
        o.insert("summary".into(), json!(m.summary));
        o.insert("tags".into(), json!([{"name": m.group}]));
        o.insert("paramStructure".into(), json!("by-name"));
        o.insert("params".into(), Value::Array(params_of(&params_schema)));
        if m.params.open {
            o.insert("x-openParams".into(), json!(true));
        }
        if let Some(r) = &m.result {
            o.insert(
                "result".into(),
                json!({"name": r.name, "schema": (r.schema)(&mut g)}),
            );
            o.insert(
                "errors".into(),
                Value::Array(m.errors().into_iter().map(error_ref).collect()),
            );
            if m.kind == Kind::Routed {
                o.insert("x-feature".into(), json!(m.feature.unwrap_or_default()));
                if let Some(f) = m.with_pty {
                    o.insert(
                        "description".into(),
                        json!(format!("With `pty` it also needs the `{f}` feature.")),
                    );
                }
            }
        }
        if !m.notifications.is_empty() {
            o.insert("x-notifications".into(), json!(m.notifications));
        }
        methods.push(Value::Object(o));
    }
    let notes: Vec<Value> = catalogue::NOTIFICATIONS
        .iter()
        .map(|n| {
            let schema = (n.params_schema)(&mut g);
            json!({"name": n.name, "description": n.description, "params": schema})
        })
        .collect();
    let mut errors = Map::new();
    for c in ErrorCode::ALL {
        errors.insert(c.abx(), error_object(*c));
    }
    let schemas = Value::Object(g.take_definitions(true));
    json!({
        "openrpc": "1.3.2",
        "info": {
            "title": "abx broker API",
            "version": crate::PROTOCOL_VERSION,
            "description": "JSON-RPC 2.0 API of the abx broker, the per-user daemon that drives code sandboxes. \
                Transports: the per-user socket ($XDG_RUNTIME_DIR/abx/broker.sock, or $ABX_HOME/run/broker.sock), \
                `abx broker --stdio` and `abx rpc`; newline-delimited JSON or Content-Length framing, detected per connection. \
                Requests are served concurrently. Errors carry `data.abx` (the E-code) and `data.suggestion`; \
                `error.code` is the JSON-RPC code for wire errors (E1001 -32700, E1002/E1005/E1010 -32600, E1003 -32601, \
                E1004 -32602, E1006 -32800) and the E-number otherwise. Provider methods take `sandbox` (`id` or \
                `provider:id`) or `provider` and are gated by the feature in `x-feature` (E8004). \
                A params member a method does not take is refused (E1004 naming it), except by the methods \
                marked `x-openParams`. \
                See docs/broker-api.md.",
            "license": {"name": "Apache-2.0"},
        },
        "servers": [{
            "name": "abx broker",
            "url": "unix:$XDG_RUNTIME_DIR/abx/broker.sock",
            "summary": "The per-user socket (or $ABX_HOME/run/broker.sock); also `abx broker --stdio`.",
        }],
        "methods": methods,
        "components": {
            "schemas": schemas,
            "errors": errors,
        },
        "x-notifications": notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document lists every method of the catalogue once, in its order, and every
    /// routed one with its feature.
    #[test]
    fn every_catalogue_method_is_described_once_with_its_feature() {
        let doc = document();
        let methods = doc["methods"].as_array().expect("methods");
        let names: Vec<&str> = methods
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, method_names());
        for (m, c) in methods.iter().zip(catalogue::METHODS) {
            assert_eq!(
                m.get("x-feature").and_then(Value::as_str),
                c.feature,
                "{}",
                c.name
            );
            assert_eq!(m["x-openParams"] == true, c.params.open, "{}", c.name);
        }
        let notes = doc["x-notifications"].as_array().expect("notifications");
        assert_eq!(notes.len(), catalogue::NOTIFICATIONS.len());
    }
}
