//! `abx provider list|info` (the other provider commands come with their broker methods).

use super::{call1, Ctx};
use crate::output::{out, print_fields, print_json, text, Failure};
use crate::table::Table;
use crate::term;
use abx_protocol::features;
use serde_json::{json, Value};

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect::<Vec<_>>()
}

/// `abx provider list`: the seed's table, features grouped (`sandbox(lifecycle,timeout)`).
pub async fn list(cx: &Ctx) -> Result<u8, Failure> {
    let r = call1(cx, "provider/list", json!({})).await?;
    let list = r["providers"].as_array().cloned().unwrap_or_default();
    if cx.json {
        print_json(&json!({"providers": list}));
        return Ok(0);
    }
    let mut t = Table::new([
        "ID", "Name", "Version", "Kind", "Trust", "Features", "Default",
    ]);
    for p in &list {
        t.row([
            text(&p["id"]),
            text(&p["name"]),
            text(&p["version"]),
            text(&p["kind"]),
            text(&p["trust"]),
            features::grouped(&strings(&p["features"])),
            if p["default"] == true { "yes" } else { "" }.to_owned(),
        ]);
    }
    out(&t.render(term::table_width()));
    Ok(0)
}

/// An object in one line: `k: v · k: v` (nested objects in parentheses).
fn inline(v: &Value) -> String {
    match v {
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| match v {
                Value::Object(_) => format!("{k}: ({})", inline(v)),
                _ => format!("{k}: {}", inline(v)),
            })
            .collect::<Vec<_>>()
            .join(" · "),
        Value::Array(a) => a.iter().map(inline).collect::<Vec<_>>().join(", "),
        other => text(other),
    }
}

/// Config keys: `name`, `name (secret)`; objects or plain names both read.
fn config_keys(v: &Value) -> String {
    let one = |name: &str, spec: &Value| {
        if spec["secret"] == true {
            format!("{name} (secret)")
        } else {
            name.to_owned()
        }
    };
    match v {
        Value::Object(o) => o
            .iter()
            .map(|(k, s)| one(k, s))
            .collect::<Vec<_>>()
            .join(", "),
        Value::Array(a) => a
            .iter()
            .map(|s| match s {
                Value::String(n) => n.clone(),
                _ => one(&text(&s["name"]), s),
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => String::new(),
    }
}

/// `abx provider info ID`: the seed's `Key  value` layout.
pub async fn info(cx: &Ctx, id: &str) -> Result<u8, Failure> {
    let p = call1(cx, "provider/info", json!({"id": id})).await?;
    if cx.json {
        print_json(&p);
        return Ok(0);
    }
    let mut feats = strings(&p["features"]);
    feats.sort();
    let mut rows: Vec<(&str, String)> = vec![
        ("ID", text(&p["id"])),
        ("Name", text(&p["name"])),
        ("Version", text(&p["version"])),
        ("Kind", text(&p["kind"])),
        (
            "Default",
            if p["default"] == true { "yes" } else { "no" }.into(),
        ),
        ("Trust", text(&p["trust"])),
        ("Features", feats.join(", ")),
    ];
    if let Some(d) = p.get("description").filter(|d| !text(d).is_empty()) {
        rows.push(("Description", text(d)));
    }
    if let Some(c) = p.get("config") {
        rows.push(("Config", config_keys(c)));
    }
    if let Some(i) = p.get("inherits") {
        let s = inline(i);
        rows.push(("Inherits", if s.is_empty() { "(none)".into() } else { s }));
    }
    if let Some(src) = p.get("source").filter(|s| !s.is_null()) {
        let s = match src {
            Value::Object(o) => {
                let mut s = text(o.get("url").unwrap_or(&Value::Null));
                if let Some(sub) = o.get("subdir").filter(|v| !v.is_null()) {
                    s.push_str(&format!(" (subdir {})", text(sub)));
                }
                if let Some(r) = o.get("ref").filter(|v| !v.is_null()) {
                    s.push_str(&format!(" @ {}", text(r)));
                }
                s
            }
            other => text(other),
        };
        rows.push(("Source", s));
        if let Some(c) = src.get("commit").filter(|v| !v.is_null()) {
            rows.push(("Commit", text(c)));
        }
    }
    if let Some(d) = p.get("digest").filter(|v| !v.is_null()) {
        rows.push(("Digest", text(d)));
    }
    if let Some(r) = p.get("runtime").filter(|v| !v.is_null()) {
        let s = match r {
            Value::Object(o) => o
                .get("command")
                .map(|c| strings(c).join(" "))
                .unwrap_or_else(|| inline(r)),
            Value::Array(_) => strings(r).join(" "),
            other => text(other),
        };
        rows.push(("Runtime", s));
    }
    if let Some(t) = p.get("templates").filter(|v| !v.is_null()) {
        rows.push(("Templates", strings(t).join(", ")));
    }
    if let Some(s) = p.get("security").filter(|v| !v.is_null()) {
        let shown = match s.get("isolation") {
            // The builtin provider: how its sandboxes are isolated.
            Some(iso) if s.as_object().is_some_and(|o| o.len() == 1) => {
                format!("isolation: {}", super::sandbox::isolation_text(iso))
            }
            _ => inline(s),
        };
        rows.push(("Security", shown));
    }
    if let Some(d) = p.get("dataDir").filter(|v| !v.is_null()) {
        rows.push(("Data", text(d)));
    }
    if let Some(i) = p.get("installedAt").filter(|v| !v.is_null()) {
        rows.push(("Installed", text(i)));
    }
    print_fields(&rows);
    Ok(0)
}
