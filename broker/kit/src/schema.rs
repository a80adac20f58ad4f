//! Every result the kit receives is checked against its method's result schema in
//! `docs/openrpc.json` (issue 47): a provider that answers with a wrong shape (a missing
//! member, a string where the API has a number) fails the test that made the call, naming
//! the method, the member and what was wrong.
//!
//! The document is the checked-in one (`protocol/tests/openrpc.rs` keeps it equal to the
//! types), built into the kit. The checker covers the JSON Schema that schemars writes for
//! the API's types: `$ref` into `components/schemas`, `type` (one or several), `properties`,
//! `required`, `additionalProperties`, `items`, `enum`, `const`, `anyOf` / `oneOf` /
//! `allOf`, `minimum` / `maximum`; `format` and annotations are not checked. A small checker
//! and not the `jsonschema` crate: that crate pulls about 40 crates (regex engines, URL and
//! remote-reference support) for a subset this file covers in a page, and CI builds cold.

use serde_json::{Map, Value};
use std::sync::OnceLock;

static DOC: &str = include_str!("../../../docs/openrpc.json");

fn doc() -> &'static Value {
    static PARSED: OnceLock<Value> = OnceLock::new();
    PARSED.get_or_init(|| serde_json::from_str(DOC).expect("docs/openrpc.json is JSON"))
}

/// The result schema of `method`, if the document has the method.
fn result_schema(method: &str) -> Option<&'static Value> {
    doc()["methods"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == method)
        .and_then(|m| m.get("result"))
        .and_then(|r| r.get("schema"))
}

/// Checks `result` against `method`'s result schema: `Err` names the member and the fault.
/// Methods the document does not have (provider extensions) are not checked.
pub fn check_result(method: &str, result: &Value) -> Result<(), String> {
    let Some(schema) = result_schema(method) else {
        return Ok(());
    };
    check(result, schema, "result", 0)
        .map_err(|e| format!("{method}: the result does not match docs/openrpc.json: {e}"))
}

/// `#/components/schemas/X`.
fn resolve(r: &str) -> Result<&'static Value, String> {
    let name = r
        .strip_prefix("#/components/schemas/")
        .ok_or_else(|| format!("unsupported $ref {r}"))?;
    doc()["components"]["schemas"]
        .get(name)
        .ok_or_else(|| format!("no schema {name}"))
}

fn type_matches(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => true,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let mut end = 77;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    } else {
        s
    }
}

fn check(v: &Value, schema: &Value, at: &str, depth: usize) -> Result<(), String> {
    if depth > 64 {
        return Err(format!("{at}: nested too deep to check"));
    }
    let s = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => return Err(format!("{at}: no value is allowed here")),
        Value::Object(s) => s,
        _ => return Ok(()),
    };
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        check(v, resolve(r)?, at, depth + 1)?;
    }
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for sub in all {
            check(v, sub, at, depth + 1)?;
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(any) = s.get(key).and_then(Value::as_array) {
            let mut why = vec![];
            if !any.iter().any(|sub| match check(v, sub, at, depth + 1) {
                Ok(()) => true,
                Err(e) => {
                    why.push(e);
                    false
                }
            }) {
                // The closest miss: the longest path is the deepest the value got.
                let best = why
                    .into_iter()
                    .max_by_key(|e| e.split(':').next().map_or(0, str::len))
                    .unwrap_or_default();
                return Err(format!("{at}: matches none of its forms ({best})"));
            }
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!(
                "{at}: {} is not one of {}",
                short(v),
                short(&Value::Array(e.clone()))
            ));
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            return Err(format!("{at}: {} is not {}", short(v), short(c)));
        }
    }
    match s.get("type") {
        Some(Value::String(t)) if !type_matches(v, t) => {
            return Err(format!("{at}: {} where the API has {t}", kind(v)));
        }
        Some(Value::Array(ts))
            if !ts
                .iter()
                .filter_map(Value::as_str)
                .any(|t| type_matches(v, t)) =>
        {
            return Err(format!(
                "{at}: {} where the API has {}",
                kind(v),
                short(&Value::Array(ts.clone()))
            ));
        }
        _ => {}
    }
    if let Some(n) = v.as_f64() {
        if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
            if n < min {
                return Err(format!("{at}: {n} is below {min}"));
            }
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
            if n > max {
                return Err(format!("{at}: {n} is above {max}"));
            }
        }
    }
    if let Value::Object(o) = v {
        check_object(o, s, at, depth)?;
    }
    if let (Value::Array(a), Some(items)) = (v, s.get("items")) {
        for (i, item) in a.iter().enumerate() {
            check(item, items, &format!("{at}[{i}]"), depth + 1)?;
        }
    }
    Ok(())
}

fn check_object(
    o: &Map<String, Value>,
    s: &Map<String, Value>,
    at: &str,
    depth: usize,
) -> Result<(), String> {
    if let Some(req) = s.get("required").and_then(Value::as_array) {
        for r in req.iter().filter_map(Value::as_str) {
            if !o.contains_key(r) {
                return Err(format!("{at}: the required member '{r}' is missing"));
            }
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    for (k, val) in o {
        let here = format!("{at}.{k}");
        match props.and_then(|p| p.get(k)) {
            Some(p) => check(val, p, &here, depth + 1)?,
            None => {
                if let Some(extra) = s.get("additionalProperties") {
                    check(val, extra, &here, depth + 1)
                        .map_err(|e| format!("{e} (a member the API does not name)"))?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_good_result_passes_and_wrong_shapes_are_named() {
        check_result("broker/ping", &json!({})).unwrap();
        // sandbox/create answers a sandbox: `id` is required and a string.
        let good = doc()["methods"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "sandbox/create");
        assert!(good);
        let e = check_result(
            "sandbox/create",
            &json!({"provider": "local", "status": "running"}),
        )
        .unwrap_err();
        assert!(e.contains("required member 'id'"), "{e}");
        let e = check_result(
            "sandbox/create",
            &json!({"id": 5, "provider": "local", "status": "running"}),
        )
        .unwrap_err();
        assert!(
            e.contains("result.id: a number where the API has string"),
            "{e}"
        );
        // A method the document does not have is not checked.
        check_result("vendor/extension", &json!(5)).unwrap();
    }

    #[test]
    fn the_subset_of_json_schema() {
        let s = json!({
            "type": "object",
            "required": ["a"],
            "properties": {
                "a": {"type": "integer", "minimum": 0},
                "b": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "c": {"type": "array", "items": {"enum": ["x", "y"]}},
            },
            "additionalProperties": false,
        });
        check(&json!({"a": 1, "b": null, "c": ["x"]}), &s, "r", 0).unwrap();
        assert!(check(&json!({"a": -1}), &s, "r", 0)
            .unwrap_err()
            .contains("below"));
        assert!(check(&json!({"a": 1.5}), &s, "r", 0)
            .unwrap_err()
            .contains("integer"));
        assert!(check(&json!({"a": 1, "b": 3}), &s, "r", 0)
            .unwrap_err()
            .contains("none of its forms"));
        assert!(check(&json!({"a": 1, "c": ["z"]}), &s, "r", 0)
            .unwrap_err()
            .contains("r.c[0]"));
        assert!(check(&json!({"a": 1, "d": 1}), &s, "r", 0)
            .unwrap_err()
            .contains("does not name"));
    }
}
