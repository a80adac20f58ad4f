//! Sandbox lifecycle: create, info, list, kill, pause, resume, set-timeout, ports,
//! capabilities, system info and named commands.

use super::{call, call1, Ctx};
use crate::args::CreateArgs;
use crate::output::{out, print_fields, print_json, provider_warning, text, Failure};
use crate::table::Table;
use crate::term;
use abx_protocol::api::{self, to_params};
use serde_json::{json, Value};

/// The params of the calls that name only a sandbox.
fn sandbox_params(sandbox: &str) -> Value {
    to_params(&api::SandboxParams {
        sandbox: sandbox.into(),
    })
}

/// `provider:id` of a Sandbox object (the bare id when it has no provider).
pub fn full_id(sb: &Value) -> String {
    let id = text(&sb["id"]);
    match sb["provider"].as_str() {
        Some(p) if !p.is_empty() => format!("{p}:{id}"),
        _ => id,
    }
}

/// The Sandbox as -j prints it: the broker's result whole (`templateDigest`, `network` as a
/// mode or a policy, `mounts`, whatever a provider adds), with the keys every Sandbox has
/// (docs/cli.md) filled in when the provider left one out.
pub fn sandbox_json(sb: &Value) -> Value {
    let mut m = sb.as_object().cloned().unwrap_or_default();
    for k in [
        "id",
        "provider",
        "status",
        "template",
        "region",
        "timeout",
        "url",
        "startedAt",
        "expiresAt",
    ] {
        m.entry(k).or_insert(Value::Null);
    }
    if !m.get("metadata").is_some_and(Value::is_object) {
        m.insert("metadata".into(), json!({}));
    }
    Value::Object(m)
}

/// RFC 3339 UTC (`2026-10-13T12:49:26Z`) shown as the seed does
/// (`2026-10-13 12:49:26+00:00`); anything else as it is.
pub fn show_time(v: &Value) -> String {
    let s = text(v);
    match s.strip_suffix('Z') {
        Some(t) if t.contains('T') => format!("{}+00:00", t.replacen('T', " ", 1)),
        _ => s,
    }
}

/// The info layout of the seed (`ID        provider:id`, Template, Status, Region,
/// Timeout, URL, Started, Provider) plus Expires and Metadata.
pub fn print_sandbox(sb: &Value) {
    let timeout = match &sb["timeout"] {
        Value::Number(n) => format!("{n}s"),
        other => text(other),
    };
    let mut rows = vec![
        ("ID", full_id(sb)),
        ("Template", text(&sb["template"])),
        ("Status", text(&sb["status"])),
        ("Region", text(&sb["region"])),
        ("Timeout", timeout),
        ("URL", text(&sb["url"])),
        ("Started", show_time(&sb["startedAt"])),
        ("Provider", text(&sb["provider"])),
    ];
    if !sb["expiresAt"].is_null() {
        rows.push(("Expires", show_time(&sb["expiresAt"])));
    }
    if let Some(m) = sb["metadata"].as_object().filter(|m| !m.is_empty()) {
        let kv = m
            .iter()
            .map(|(k, v)| format!("{k}={}", text(v)))
            .collect::<Vec<_>>()
            .join(", ");
        rows.push(("Metadata", kv));
    }
    if let Some(m) = super::workspace::mounts_row(sb) {
        rows.push(("Mounts", m));
    }
    // A policy and its blocked hosts (a mode is not shown: `abx network SANDBOX show`).
    if sb["network"].is_object() {
        rows.extend(super::network::rows(&sb["network"]));
    }
    print_fields(&rows);
}

fn show(cx: &Ctx, sb: &Value) {
    if cx.json {
        print_json(&sandbox_json(sb));
    } else {
        print_sandbox(sb);
    }
}

/// `abx create`.
pub async fn create(cx: &Ctx, a: CreateArgs) -> Result<u8, Failure> {
    let mut create = api::SandboxCreateParams {
        provider: cx.provider.clone(),
        template: a.template.clone(),
        timeout: a.timeout.map(|t| json!(t)),
        env: (!a.env.is_empty()).then(|| a.env.into_iter().collect()),
        metadata: (!a.metadata.is_empty())
            .then(|| a.metadata.into_iter().map(|(k, v)| (k, json!(v))).collect()),
        ..Default::default()
    };
    create.mounts = super::workspace::mounts(&a.mount)?;
    a.opts.apply(&mut create);
    let params = to_params(&create);
    let sb = call1(cx, "sandbox/create", params).await?;
    show(cx, &sb);
    Ok(0)
}

/// `abx info`.
pub async fn info(cx: &Ctx, sandbox: &str) -> Result<u8, Failure> {
    let sb = call1(cx, "sandbox/info", sandbox_params(sandbox)).await?;
    show(cx, &sb);
    Ok(0)
}

/// `abx list` / `abx sandbox list`.
pub async fn list(cx: &Ctx) -> Result<u8, Failure> {
    let r = call1(
        cx,
        "sandbox/list",
        to_params(&api::SandboxListParams {
            provider: cx.provider.clone(),
        }),
    )
    .await?;
    let list = r["sandboxes"].as_array().cloned().unwrap_or_default();
    // Providers that could not answer: the others are listed anyway, each failure is a
    // warning line on stderr and the exit code is 1.
    let errors = r["errors"].as_array().cloned().unwrap_or_default();
    let code = u8::from(!errors.is_empty());
    if cx.json {
        let mut v = json!({"sandboxes": list.iter().map(sandbox_json).collect::<Vec<_>>()});
        if !errors.is_empty() {
            v["errors"] = Value::Array(errors);
        }
        print_json(&v);
        return Ok(code);
    }
    if list.is_empty() {
        out("No sandboxes found.\n");
    } else {
        let mut t = Table::new(["ID", "Template", "Status", "Region"]);
        for sb in &list {
            t.row([
                full_id(sb),
                text(&sb["template"]),
                text(&sb["status"]),
                text(&sb["region"]),
            ]);
        }
        out(&t.render(term::table_width()));
    }
    for e in &errors {
        eprint!("{}", provider_warning(e));
    }
    Ok(code)
}

/// `abx kill`: `--yes`, or a `[y/N]` prompt on a terminal; refused (E1009, exit 2)
/// without either. Idempotent.
pub async fn kill(cx: &Ctx, sandbox: &str) -> Result<u8, Failure> {
    super::confirm_or_refuse(
        cx,
        &format!("Kill sandbox {sandbox}?"),
        &format!("sandbox '{sandbox}' was not killed"),
        &format!("kill sandbox '{sandbox}'"),
        &format!("abx kill {sandbox} --yes"),
    )?;
    let r = call1(cx, "sandbox/kill", sandbox_params(sandbox)).await?;
    let killed = r["killed"].as_bool().unwrap_or(true);
    if cx.json {
        print_json(&json!({"sandbox": sandbox, "killed": killed}));
    } else if killed {
        out(&format!("Sandbox {sandbox} killed.\n"));
    } else {
        out(&format!(
            "Sandbox {sandbox} killed (it was already gone).\n"
        ));
    }
    Ok(0)
}

/// `abx pause` / `abx resume`.
pub async fn pause_resume(cx: &Ctx, sandbox: &str, pause: bool) -> Result<u8, Failure> {
    let method = if pause {
        "sandbox/pause"
    } else {
        "sandbox/resume"
    };
    let sb = call1(cx, method, sandbox_params(sandbox)).await?;
    if cx.json {
        print_json(&sandbox_json(&sb));
    } else {
        let verb = if pause { "paused" } else { "resumed" };
        out(&format!("Sandbox {} {verb}.\n", full_id(&sb)));
    }
    Ok(0)
}

/// `abx set-timeout`.
pub async fn set_timeout(cx: &Ctx, sandbox: &str, seconds: u64) -> Result<u8, Failure> {
    let sb = call1(
        cx,
        "sandbox/setTimeout",
        to_params(&api::SetTimeoutParams {
            sandbox: sandbox.into(),
            timeout: seconds.into(),
        }),
    )
    .await?;
    if cx.json {
        print_json(&sandbox_json(&sb));
    } else {
        out(&format!(
            "Sandbox {} now expires at {} (in {seconds}s).\n",
            full_id(&sb),
            show_time(&sb["expiresAt"])
        ));
    }
    Ok(0)
}

/// `abx ports`.
pub async fn ports(cx: &Ctx, sandbox: &str, port: u16) -> Result<u8, Failure> {
    let r = call1(
        cx,
        "ports/url",
        to_params(&api::PortParams {
            sandbox: sandbox.into(),
            port: port.into(),
        }),
    )
    .await?;
    if cx.json {
        print_json(&json!({
            "sandbox": sandbox,
            "port": port,
            "url": r["url"],
            "headers": r.get("headers").cloned().unwrap_or_else(|| json!({})),
        }));
    } else {
        out(&format!("{}\n", text(&r["url"])));
        if let Some(h) = r["headers"].as_object() {
            for (k, v) in h {
                out(&format!("  {k}: {}\n", text(v)));
            }
        }
    }
    Ok(0)
}

/// `abx sandbox capabilities`.
pub async fn capabilities(cx: &Ctx, sandbox: &str) -> Result<u8, Failure> {
    let r = call1(cx, "sandbox/capabilities", sandbox_params(sandbox)).await?;
    if cx.json {
        print_json(&json!({
            "capabilities": r.get("capabilities").cloned().unwrap_or_else(|| json!([])),
            "features": r.get("features").cloned().unwrap_or_else(|| json!([])),
        }));
        return Ok(0);
    }
    let mut s = String::from("Capabilities:\n");
    for c in r["capabilities"].as_array().into_iter().flatten() {
        s.push_str(&format!("  - {}\n", text(c)));
    }
    out(&s);
    Ok(0)
}

/// The isolation object of systemInfo in one line.
pub fn isolation_text(v: &Value) -> String {
    let Some(o) = v.as_object() else {
        return text(v);
    };
    let mut parts = vec![];
    if let Some(m) = o.get("model") {
        parts.push(text(m));
    }
    if let Some(l) = o.get("landlock").and_then(Value::as_object) {
        let abi = l.get("abi").map(text).unwrap_or_default();
        let on = if l.get("enforced") == Some(&json!(true)) {
            "enforced"
        } else {
            "not enforced"
        };
        parts.push(format!("landlock abi {abi} ({on})"));
    }
    if let Some(n) = o.get("network") {
        parts.push(format!("network: {}", text(n)));
    }
    for (k, val) in o {
        if !matches!(k.as_str(), "model" | "landlock" | "network" | "namespaces") {
            parts.push(format!("{k}: {}", text(val)));
        }
    }
    parts.join(" · ")
}

/// `abx sandbox system info`: the seed's keys first (OS, Arch, Hostname, CPU_Count,
/// Disk_Total_GB, Disk_Free_GB), then what else the provider tells, then Isolation.
pub async fn system_info(cx: &Ctx, sandbox: &str) -> Result<u8, Failure> {
    let r = call1(cx, "sandbox/systemInfo", sandbox_params(sandbox)).await?;
    if cx.json {
        print_json(&r);
        return Ok(0);
    }
    let known = [
        ("os", "OS"),
        ("arch", "Arch"),
        ("hostname", "Hostname"),
        ("kernel", "Kernel"),
        ("cpuCount", "CPU_Count"),
        ("memoryTotalMb", "Memory_Total_MB"),
        ("diskTotalGb", "Disk_Total_GB"),
        ("diskFreeGb", "Disk_Free_GB"),
    ];
    let mut rows: Vec<(String, String)> = vec![];
    for (k, label) in known {
        if let Some(v) = r.get(k) {
            rows.push((label.to_owned(), text(v)));
        }
    }
    if let Some(o) = r.as_object() {
        for (k, v) in o {
            if known.iter().any(|(kk, _)| kk == k) || k == "isolation" {
                continue;
            }
            rows.push((title_key(k), text(v)));
        }
    }
    if let Some(iso) = r.get("isolation") {
        rows.push(("Isolation".into(), isolation_text(iso)));
    }
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print_fields(&rows);
    Ok(0)
}

/// `pythonVersion` -> `Python_Version`.
fn title_key(k: &str) -> String {
    let mut s = String::new();
    for (i, c) in k.chars().enumerate() {
        if i == 0 {
            s.extend(c.to_uppercase());
        } else if c.is_uppercase() {
            s.push('_');
            s.push(c);
        } else {
            s.push(c);
        }
    }
    s
}

/// `abx sandbox command run`: a named command of the template. Providers without named
/// commands answer E8004, printed like any error.
pub async fn command_run(
    cx: &Ctx,
    sandbox: &str,
    name: &str,
    args: &[String],
) -> Result<u8, Failure> {
    let mut c = cx.connect().await?;
    let r = call(
        &mut c,
        "commands/run",
        to_params(&api::CommandRunParams {
            sandbox: sandbox.into(),
            name: name.into(),
            args: Some(args.to_vec()),
        }),
    )
    .await?;
    // A result without an exit code is a success (a provider's own kind of command); one
    // outside 0..=255 is the provider's bad exit, never a success (exit 1, said after the
    // output).
    let code = match r.get("exitCode") {
        None | Some(Value::Null) => Ok(0),
        Some(_) => crate::stream::exit_code(&r, sandbox),
    };
    if cx.json {
        print_json(&r);
        return Ok(code.unwrap_or_else(|f| {
            f.print(false, false, None);
            f.exit.clamp(1, 255) as u8
        }));
    }
    match (r.get("stdout"), r.get("stderr")) {
        (None, None) => print_json(&r),
        (o, e) => {
            if let Some(o) = o {
                out(&text(o));
            }
            if let Some(e) = e {
                eprint!("{}", text(e));
            }
        }
    }
    code
}

/// `abx events`: subscribe and print each `sandbox/changed` (human: `TIME CHANGE
/// provider:id` plus status and expiry when known; `-j`: the notification's params, one
/// JSON object per line), until interrupted or `count` changes.
pub async fn events(cx: &Ctx, count: Option<u64>) -> Result<u8, Failure> {
    let mut c = cx.connect().await?;
    call(&mut c, "sandbox/subscribe", to_params(&api::NoParams {})).await?;
    if count == Some(0) {
        return Ok(0);
    }
    let mut seen = 0u64;
    loop {
        let note = match c.notifications.pop_front() {
            Some(n) => n,
            None => match c.next_message().await? {
                Some(abx_protocol::message::Message::Notification(n)) => n,
                Some(_) => continue,
                None => {
                    return Err(Failure::from(abx_protocol::AbxError::detail(
                        abx_protocol::ErrorCode::BrokerUnreachable,
                        "the daemon closed the connection",
                    )))
                }
            },
        };
        if note.method != "sandbox/changed" {
            continue;
        }
        let p: Value = note
            .params
            .as_deref()
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .unwrap_or(Value::Null);
        if cx.json {
            crate::output::line(&p.to_string());
        } else {
            crate::output::line(&change_line(&p));
        }
        seen += 1;
        if count.is_some_and(|n| seen >= n) {
            return Ok(0);
        }
    }
}

/// One human line of a `sandbox/changed`.
fn change_line(p: &Value) -> String {
    let now = abx_home::util::rfc3339(abx_home::util::now_ms() / 1000);
    let mut s = format!(
        "{now}  {:<8} {}:{}",
        text(&p["change"]),
        text(&p["provider"]),
        text(&p["sandbox"])
    );
    let info = &p["sandboxInfo"];
    if info.is_object() {
        s.push_str(&format!("  {}", text(&info["status"])));
        if !info["expiresAt"].is_null() {
            s.push_str(&format!("  expires {}", show_time(&info["expiresAt"])));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_layout_matches_the_seed() {
        let sb = json!({"id": "50953498", "provider": "opensandbox", "template": "python:3.12-slim",
            "status": "running", "region": "", "timeout": 600, "url": "epp://opensandbox/50953498",
            "startedAt": "2026-10-13T12:49:26Z"});
        let rows = crate::output::fields(&[
            ("ID", full_id(&sb)),
            ("Timeout", "600s".into()),
            ("Region", "".into()),
            ("Started", show_time(&sb["startedAt"])),
            ("Provider", "opensandbox".into()),
        ]);
        assert_eq!(
            rows,
            "ID        opensandbox:50953498\nTimeout   600s\nRegion\nStarted   2026-10-13 12:49:26+00:00\nProvider  opensandbox\n"
        );
        let j = sandbox_json(&sb);
        assert_eq!(j["metadata"], json!({}));
        assert!(j["expiresAt"].is_null());
        // The broker's result whole: nothing it sends is dropped (issue 45, item 7).
        let full = json!({"id": "sb-1", "provider": "local", "templateDigest": "sha256:ab",
            "network": "none", "mounts": [{"source": "/p", "target": "/workspace", "mode": "ro"}],
            "metadata": {"a": "b"}, "extra": 1});
        let j = sandbox_json(&full);
        for k in ["templateDigest", "network", "mounts", "extra", "metadata"] {
            assert_eq!(j[k], full[k], "{k}");
        }
        let policy =
            json!({"id": "sb-2", "network": {"allow": ["a.example"], "deny": [], "blocked": []}});
        assert_eq!(sandbox_json(&policy)["network"], policy["network"]);
        assert_eq!(title_key("pythonVersion"), "Python_Version");
    }
}
