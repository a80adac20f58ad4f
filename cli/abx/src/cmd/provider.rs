//! `abx provider list|info` (the other provider commands come with their broker methods).

use super::{call1, Ctx};
use crate::output::{line, out, print_fields, print_json, text, Failure};
use crate::table::Table;
use crate::term;
use abx_protocol::api::{self, to_params};
use abx_protocol::features;
use serde_json::{json, Value};

/// The params of the calls that name only a provider.
fn id_params(id: &str) -> Value {
    to_params(&api::ProviderIdParams { id: id.into() })
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect::<Vec<_>>()
}

/// `abx provider list`: the seed's table, features grouped (`sandbox(lifecycle,timeout)`).
pub async fn list(cx: &Ctx) -> Result<u8, Failure> {
    let r = call1(cx, "provider/list", to_params(&api::NoParams {})).await?;
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
    let p = call1(cx, "provider/info", id_params(id)).await?;
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
            _ => security_text(s, true),
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

fn install_params(a: &crate::args::InstallArgs, confirm: bool, dry_run: bool) -> Value {
    // A local directory is sent as an absolute path (the daemon has its own cwd).
    let source = match std::fs::canonicalize(&a.source) {
        Ok(p) if !a.source.contains("://") => p.display().to_string(),
        _ => a.source.clone(),
    };
    to_params(&api::ProviderInstallParams {
        source,
        subdir: a.subdir.clone(),
        git_ref: a.git_ref.clone(),
        sha256: a.sha256.clone(),
        allow_unpinned: a.allow_unpinned,
        allow_insecure_transport: a.allow_insecure_transport,
        confirm,
        dry_run,
        replace: false,
    })
}

fn plan_rows(p: &Value) -> Vec<(&'static str, String)> {
    let src = &p["source"];
    let mut rows = vec![
        ("ID", text(&p["id"])),
        ("Name", text(&p["name"])),
        ("Version", text(&p["version"])),
        ("Trust", text(&p["trust"])),
        ("Source", text(&src["url"])),
    ];
    if !src["subdir"].is_null() {
        rows.push(("Subdir", text(&src["subdir"])));
    }
    if !src["commit"].is_null() {
        rows.push(("Commit", text(&src["commit"])));
    }
    rows.push(("Digest", text(&p["digest"])));
    rows.push((
        "Features",
        features::grouped(&strings(&p["manifest"]["features"])),
    ));
    rows.push((
        "Runtime",
        strings(&p["manifest"]["runtime"]["command"]).join(" "),
    ));
    rows.push(("Security", security_text(&p["security"], false)));
    rows
}

/// `network: * · filesystem: data_dir · spawns processes: no  (enforced)`, or
/// `(not enforced, will not start: why)`.
fn security_text(s: &Value, with_enforcement: bool) -> String {
    let list = |v: &Value| {
        let items = strings(v);
        if items.is_empty() {
            "none".to_owned()
        } else {
            items.join(", ")
        }
    };
    let spawns = s["spawnsProcesses"]
        .as_bool()
        .or_else(|| s["spawns_processes"].as_bool())
        .unwrap_or(false);
    let mut out = format!(
        "network: {} · filesystem: {} · spawns processes: {}",
        list(&s["network"]),
        list(&s["filesystem"]),
        if spawns { "yes" } else { "no" }
    );
    if with_enforcement {
        if s["enforced"] == true {
            out.push_str("  (enforced)");
        } else {
            let why = text(&s["why"]);
            let what = if s["enforcement"] == "warn" {
                "not enforced, runs anyway"
            } else {
                "not enforced, will not start"
            };
            if why.is_empty() {
                out.push_str(&format!("  ({what})"));
            } else {
                out.push_str(&format!("  ({what}: {why})"));
            }
        }
    }
    out
}

/// `abx provider install SOURCE [flags]`: on a terminal, shows the plan and asks; without
/// a terminal, --yes is required (the broker refuses with the exact command to re-run).
pub async fn install(cx: &Ctx, a: &crate::args::InstallArgs) -> Result<u8, Failure> {
    let mut c = cx.connect().await?;
    if a.dry_run {
        let plan = super::call(&mut c, "provider/install", install_params(a, false, true)).await?;
        if cx.json {
            print_json(&plan);
        } else {
            print_fields(&plan_rows(&plan));
        }
        return Ok(0);
    }
    let mut confirm = cx.yes;
    if !confirm && term::stdin_is_tty() && !cx.json {
        // Review first: the plan, then a prompt. Refusals (pinning, transport) come now.
        let plan = super::call(&mut c, "provider/install", install_params(a, false, true)).await?;
        print_fields(&plan_rows(&plan));
        match term::confirm(&format!(
            "Install provider '{}' {}?",
            text(&plan["id"]),
            text(&plan["version"])
        )) {
            Some(true) => confirm = true,
            _ => {
                return Err(Failure::usage(
                    "Aborted: nothing was installed.",
                    "Re-run and answer y, or pass --yes after reviewing.",
                ))
            }
        }
    }
    let r = super::call(
        &mut c,
        "provider/install",
        install_params(a, confirm, false),
    )
    .await?;
    if cx.json {
        print_json(&r);
    } else {
        line(&format!(
            "Installed provider '{}' {} ({})",
            text(&r["id"]),
            text(&r["version"]),
            text(&r["trust"])
        ));
    }
    Ok(0)
}

/// `abx provider uninstall ID [--yes]`.
pub async fn uninstall(cx: &Ctx, id: &str) -> Result<u8, Failure> {
    let mut confirm = cx.yes;
    if !confirm && term::stdin_is_tty() && !cx.json {
        match term::confirm(&format!("Remove provider '{id}'?")) {
            Some(true) => confirm = true,
            _ => {
                return Err(Failure::usage(
                    "Aborted: nothing was removed.",
                    format!("Re-run with --yes: abx provider uninstall {id} --yes"),
                ))
            }
        }
    }
    call1(
        cx,
        "provider/uninstall",
        to_params(&api::ProviderUninstallParams {
            id: id.into(),
            confirm,
        }),
    )
    .await?;
    if cx.json {
        print_json(&json!({"status": "removed", "id": id}));
    } else {
        line(&format!("Removed provider '{id}'"));
    }
    Ok(0)
}

/// `abx provider update [ID] [--check] [--ref R]`.
pub async fn update(
    cx: &Ctx,
    id: Option<&str>,
    check: bool,
    git_ref: Option<&str>,
) -> Result<u8, Failure> {
    let r = call1(
        cx,
        "provider/update",
        to_params(&api::ProviderUpdateParams {
            id: id.map(Into::into),
            check,
            git_ref: git_ref.map(Into::into),
        }),
    )
    .await?;
    if cx.json {
        print_json(&r);
        return Ok(0);
    }
    let list = r["providers"].as_array().cloned().unwrap_or_default();
    let mut code = 0;
    if list.iter().all(|p| p["status"] == "up-to-date") {
        line(if list.is_empty() {
            "No installed providers."
        } else {
            "All providers are up to date."
        });
        return Ok(0);
    }
    for p in &list {
        let status = text(&p["status"]);
        if status == "error" {
            code = 1;
        }
        let detail = match status.as_str() {
            "error" => format!(": {}", text(&p["error"])),
            _ => format!(" {} -> {}", text(&p["from"]), text(&p["to"])),
        };
        line(&format!("{:<16} {status}{detail}", text(&p["id"])));
    }
    Ok(code)
}

/// `abx provider doctor ID`: `ok    installed  Name 1.0` lines; exit 1 on any failure.
pub async fn doctor(cx: &Ctx, id: &str) -> Result<u8, Failure> {
    let r = call1(cx, "provider/doctor", id_params(id)).await?;
    let ok = r["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|c| c["ok"] == true);
    if cx.json {
        print_json(&r);
    } else {
        for c in r["checks"].as_array().into_iter().flatten() {
            let status = if c["ok"] == true { "ok" } else { "fail" };
            let detail = text(&c["detail"]);
            let l = format!("{status:<5} {:<10} {detail}", text(&c["name"]));
            line(l.trim_end());
        }
    }
    Ok(if ok { 0 } else { 1 })
}

/// `abx provider test ID [--filter F]`: a line per test as it finishes, then the totals.
pub async fn test(
    cx: &Ctx,
    id: &str,
    filter: Option<&str>,
    concurrency: Option<u64>,
) -> Result<u8, Failure> {
    use abx_protocol::message::Message;
    let mut c = cx.connect().await?;
    let params = to_params(&api::ProviderTestParams {
        id: id.into(),
        filter: filter.map(Into::into),
        concurrency: concurrency.map(|n| n as usize),
        template: None,
    });
    let req = c.send_request("provider/test", Some(&params)).await?;
    let print_line = |v: &Value| {
        let outcome = text(&v["outcome"]);
        let detail = text(&v["detail"]);
        let l = if detail.is_empty() || outcome == "passed" {
            format!("{outcome:<7} {}", text(&v["name"]))
        } else {
            format!("{outcome:<7} {}: {detail}", text(&v["name"]))
        };
        line(l.trim_end());
    };
    let result = loop {
        let Some(m) = c.next_message().await? else {
            return Err(Failure::from(abx_protocol::AbxError::detail(
                abx_protocol::ErrorCode::BrokerUnreachable,
                "the broker closed the connection",
            )));
        };
        match m {
            Message::Notification(n) if n.method == "provider/testResult" && !cx.json => {
                if let Some(p) = n
                    .params
                    .as_deref()
                    .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
                {
                    print_line(&p);
                }
            }
            Message::Response(r) if r.id.as_ref() == Some(&req) => match r.outcome {
                Ok(raw) => break serde_json::from_str::<Value>(raw.get()).unwrap_or(Value::Null),
                Err(e) => return Err(Failure::from(e).in_method("provider/test")),
            },
            _ => {}
        }
    };
    if cx.json {
        print_json(&result);
    } else {
        line(&format!(
            "{} passed, {} failed, {} skipped",
            result["passed"], result["failed"], result["skipped"]
        ));
    }
    Ok(if result["failed"].as_u64().unwrap_or(0) > 0 {
        1
    } else {
        0
    })
}

/// `abx provider configure ID KEY=VALUE... [--unset KEY]`.
pub async fn configure(
    cx: &Ctx,
    id: &str,
    values: &[String],
    unset: &[String],
) -> Result<u8, Failure> {
    let mut map = serde_json::Map::new();
    for kv in values {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(Failure::usage(
                format!("'{kv}' is not KEY=VALUE."),
                "Example: abx provider configure ID base_url=https://... api_key=-",
            ));
        };
        let v = if v == "-" {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| {
                Failure::usage(format!("cannot read stdin: {e}"), "Pipe the value in.")
            })?;
            s.trim_end_matches(['\n', '\r']).to_owned()
        } else {
            v.to_owned()
        };
        // Numbers and booleans keep their type; everything else is a string.
        let parsed = match serde_json::from_str::<Value>(&v) {
            Ok(x @ (Value::Bool(_) | Value::Number(_))) => x,
            _ => Value::String(v),
        };
        map.insert(k.to_owned(), parsed);
    }
    for k in unset {
        map.insert(k.clone(), Value::Null);
    }
    if map.is_empty() {
        return Err(Failure::usage(
            "Nothing to configure.",
            "Give KEY=VALUE pairs or --unset KEY.",
        ));
    }
    let r = call1(
        cx,
        "provider/configure",
        to_params(&api::ProviderConfigureParams {
            id: id.into(),
            values: map,
        }),
    )
    .await?;
    if cx.json {
        print_json(&r);
    } else {
        line(&format!(
            "Configured provider '{id}': {}",
            strings(&r["configured"]).join(", ")
        ));
    }
    Ok(0)
}

/// `abx provider default ID`.
pub async fn set_default(cx: &Ctx, id: &str) -> Result<u8, Failure> {
    call1(cx, "provider/setDefault", id_params(id)).await?;
    if cx.json {
        print_json(&json!({"default": id}));
    } else {
        line(&format!("Default provider is now '{id}'."));
    }
    Ok(0)
}

/// The rows of `abx template list`: one per name of each template (an image imported under
/// two names is listed under both), else its `name`.
fn template_rows(templates: &Value) -> Vec<(String, &Value)> {
    let mut rows = Vec::new();
    for t in templates.as_array().into_iter().flatten() {
        let names: Vec<&str> = t["names"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if names.is_empty() {
            rows.push((text(&t["name"]), t));
        } else {
            rows.extend(names.into_iter().map(|n| (n.to_owned(), t)));
        }
    }
    rows
}

/// `abx template list|pull|build|rm|import|init`: gated on templates.read / templates.build
/// like every other method (the seed's open problem: they ignored --provider and never said
/// E8004). The words after the action go as `args` too, for providers of their own.
pub async fn template(cx: &Ctx, action: &str, args: &[String]) -> Result<u8, Failure> {
    let usage = |u: &str| {
        Failure::usage(
            format!("missing arguments for abx template {action}"),
            format!("Usage: abx template {u}"),
        )
    };
    let mut rest: serde_json::Map<String, serde_json::Value> =
        [("args".to_owned(), json!(args))].into_iter().collect();
    let arg = |i: usize| args.get(i).filter(|a| !a.starts_with("--")).cloned();
    let method = match action {
        "list" => "templates/list",
        "init" => "templates/init",
        "pull" => {
            rest.insert(
                "template".into(),
                json!(arg(0).ok_or_else(|| usage("pull REF"))?),
            );
            "templates/pull"
        }
        "rm" => {
            if args.iter().any(|a| a == "--prune") {
                rest.insert("prune".into(), json!(true));
                if args.iter().any(|a| a == "--all") {
                    rest.insert("all".into(), json!(true));
                }
            } else {
                rest.insert(
                    "template".into(),
                    json!(arg(0).ok_or_else(|| usage("rm NAME|DIGEST, or rm --prune [--all]"))?),
                );
            }
            "templates/remove"
        }
        "import" => {
            let p = arg(0).ok_or_else(|| usage("import PATH [NAME]"))?;
            // The broker reads it: an absolute path.
            let abs = std::path::absolute(&p).unwrap_or_else(|_| p.clone().into());
            rest.insert("path".into(), json!(abs));
            if let Some(n) = arg(1) {
                rest.insert("name".into(), json!(n));
            }
            "templates/import"
        }
        _ => {
            if let (Some(sb), Some(name)) = (arg(0), arg(1)) {
                rest.insert("sandbox".into(), json!(sb));
                rest.insert("name".into(), json!(name));
            }
            "templates/build"
        }
    };
    let params = api::TemplatesParams {
        provider: cx.provider.clone(),
        rest,
    };
    let r = call1(cx, method, to_params(&params)).await?;
    if cx.json {
        print_json(&r);
    } else if method == "templates/list" && r["templates"].is_array() {
        line(&format!(
            "{:<40} {:<19} {:>10}  {}",
            "NAME", "DIGEST", "SIZE", "PULLED"
        ));
        for (name, t) in template_rows(&r["templates"]) {
            let digest = t["digest"].as_str().map_or("-".to_owned(), |d| {
                d.trim_start_matches("sha256:").chars().take(12).collect()
            });
            line(&format!(
                "{:<40} {:<19} {:>10}  {}",
                name,
                digest,
                t["size"].as_u64().unwrap_or(0),
                t["pulledAt"].as_str().unwrap_or("-")
            ));
        }
    } else {
        line(&serde_json::to_string_pretty(&r).unwrap_or_default());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// Issue 45, item 8: every name of an image is listed, not one per digest.
    #[test]
    fn template_list_shows_every_name() {
        let t = json!([
            {"name": "base", "names": ["base"], "digest": null},
            {"name": "a/bb:1", "names": ["a/bb:1", "b/bb:2"], "digest": "sha256:ab"},
            {"name": "other", "digest": "sha256:cd"},
        ]);
        let rows: Vec<String> = super::template_rows(&t)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(rows, ["base", "a/bb:1", "b/bb:2", "other"]);
    }
}
