//! docs/openrpc.json is generated from the protocol types: this fails when the checked-in
//! document drifts from the code. Regenerate it with
//! `ABX_UPDATE_OPENRPC=1 cargo test -p abx-protocol --features schema --test openrpc`.

use abx_protocol::openrpc;
use abx_protocol::ErrorCode;
use serde_json::Value;
use std::path::PathBuf;

fn doc_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openrpc.json")
}

fn rendered() -> String {
    let mut s = serde_json::to_string_pretty(&openrpc::document()).expect("serialize");
    s.push('\n');
    s
}

#[test]
fn checked_in_openrpc_matches_the_code() {
    let path = doc_path();
    let want = rendered();
    if std::env::var_os("ABX_UPDATE_OPENRPC").is_some_and(|v| !v.is_empty() && v != "0") {
        std::fs::write(&path, &want).expect("write docs/openrpc.json");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let first = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "docs/openrpc.json differs from the document generated from protocol/src/api/ \
             and protocol/src/openrpc.rs (first difference at line {}).\n\
             Regenerate it: ABX_UPDATE_OPENRPC=1 cargo test -p abx-protocol --features schema --test openrpc",
            first + 1
        );
    }
}

/// Every `$ref` in `v` (recursively).
fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if k == "$ref" {
                    if let Some(s) = x.as_str() {
                        out.push(s);
                    }
                } else {
                    refs(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

#[test]
fn the_document_is_well_formed() {
    let doc = openrpc::document();
    assert_eq!(doc["openrpc"], "1.3.2");
    let methods = doc["methods"].as_array().expect("methods");
    assert!(methods.len() >= 50);
    for m in methods {
        let name = m["name"].as_str().expect("name");
        assert!(m["params"].is_array(), "{name}");
        for p in m["params"].as_array().unwrap() {
            assert!(
                p["name"].is_string() && p["schema"].is_object(),
                "{name}: {p}"
            );
        }
        if let Some(r) = m.get("result") {
            assert!(r["name"].is_string() && r["schema"].is_object(), "{name}");
            assert!(
                !m["errors"].as_array().expect("errors").is_empty(),
                "{name}"
            );
        }
    }
    // Every reference resolves.
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let ptr = r.strip_prefix('#').expect("local ref");
        assert!(doc.pointer(ptr).is_some(), "dangling $ref {r}");
    }
    // Every E-code is an error component with its wire code.
    for c in ErrorCode::ALL {
        let e = &doc["components"]["errors"][c.abx()];
        assert_eq!(e["code"], c.rpc_code(), "{c}");
        assert_eq!(e["data"]["abx"], c.abx());
    }
    // Spot checks against docs/broker-api.md.
    let m = |n: &str| methods.iter().find(|m| m["name"] == n).expect(n).clone();
    let create = m("sandbox/create");
    assert_eq!(create["x-feature"], "sandbox.lifecycle");
    assert!(create["params"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["required"] == false));
    let read = m("files/read");
    let names: Vec<&str> = read["params"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["path", "sandbox", "encoding", "length", "offset"]);
    assert_eq!(m("exec/start")["x-notifications"][1], "exec/exit");
    assert!(m("$/cancelRequest").get("result").is_none());
}

/// The document covers the params and the result of every method, each generated from an
/// API type: no param or result is an empty (any-JSON) schema unless the type says so, and
/// every request has a result.
#[test]
fn every_method_has_typed_params_and_a_result() {
    let doc = openrpc::document();
    let methods = doc["methods"].as_array().expect("methods");
    let types = openrpc::method_types();
    assert_eq!(methods.len(), types.len());
    // Members that are any JSON on purpose (provider-defined or a JSON-RPC id).
    let free = ["rest", "id"];
    for (m, (name, params, result)) in methods.iter().zip(&types) {
        assert_eq!(m["name"], *name);
        assert!(
            params.starts_with("abx_protocol::api::"),
            "{name}: {params}"
        );
        for p in m["params"].as_array().expect("params") {
            let schema = p["schema"].as_object().expect("schema");
            let pname = p["name"].as_str().unwrap();
            assert!(
                !schema.is_empty() || free.contains(&pname),
                "{name}: param {pname} has no schema"
            );
        }
        let is_notification = ["initialized", "exit", "$/cancelRequest"].contains(name);
        match (m.get("result"), result) {
            (None, _) => assert!(is_notification, "{name}: a request without a result"),
            (Some(r), Some(t)) => {
                assert!(t.starts_with("abx_protocol::api::"), "{name}: {t}");
                let r = r["schema"].as_object().expect("result schema");
                assert!(!r.is_empty(), "{name}: result has no schema");
            }
            (Some(r), None) => assert_eq!(r["schema"]["type"], "null", "{name}"),
        }
    }
}
