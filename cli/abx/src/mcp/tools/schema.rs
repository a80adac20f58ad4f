//! The tools' schemas, generated: an input schema from a tool's arguments type, an output
//! schema from the type of its structured result (docs/style.md, "Schemas are generated
//! from the types").

use schemars::JsonSchema;
use serde_json::{json, Value};

/// A tool's input schema, generated from its arguments type: inlined, an optional argument
/// is left out rather than `null` (its type is not nullable), without the root's `$schema`,
/// `title` and `description` (the tool has its own).
pub(super) fn input_schema<T: JsonSchema>() -> Value {
    let mut g = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut v = g.root_schema_for::<T>().to_value();
    drop_null_defaults(&mut v);
    if let Some(o) = v.as_object_mut() {
        for k in ["$schema", "title", "description"] {
            o.remove(k);
        }
        // Some clients want `properties` even when there are none.
        o.entry("properties").or_insert_with(|| json!({}));
        for prop in o
            .get_mut("properties")
            .and_then(Value::as_object_mut)
            .into_iter()
            .flat_map(|p| p.values_mut())
        {
            // `["string", "null"]` → `"string"`.
            if let Some(Value::Array(types)) = prop.get("type") {
                let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                prop["type"] = match <[Value; 1]>::try_from(rest) {
                    Ok([one]) => one,
                    Err(many) => Value::Array(many),
                };
            }
        }
    }
    v
}

/// Leave out the `default: null` schemars gives an optional member that is not nullable in
/// the schema (`sandbox_create`'s mounts: left out is the default, `null` is not a value).
pub(super) fn drop_null_defaults(v: &mut Value) {
    match v {
        Value::Object(o) => {
            if o.get("default") == Some(&Value::Null) {
                o.remove("default");
            }
            o.values_mut().for_each(drop_null_defaults);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_null_defaults),
        _ => {}
    }
}

/// A tool's output schema, generated from the type of its structured result: inlined,
/// without the root's `$schema`, `title` and `description` (the tool has its own). The
/// contract is what the type accepts (a member with a default may be absent): most tools
/// pass on the provider's result as it came.
pub(super) fn output_schema<T: JsonSchema>() -> Value {
    schema_of::<T>(false)
}

/// [`output_schema`] of a tool's own result type: what it serializes (a member left out when
/// empty is optional, every other one required).
pub(super) fn own_output_schema<T: JsonSchema>() -> Value {
    schema_of::<T>(true)
}

pub(super) fn schema_of<T: JsonSchema>(serialized: bool) -> Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    if serialized {
        settings = settings.for_serialize();
    }
    let mut g = settings
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut v = g.root_schema_for::<T>().to_value();
    if let Some(o) = v.as_object_mut() {
        for k in ["$schema", "title", "description"] {
            o.remove(k);
        }
    }
    v
}
