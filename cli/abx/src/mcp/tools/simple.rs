//! The tools that are one broker call each (sandboxes, files, ports, providers,
//! code contexts), and the text each gives the model.

use super::cx::{args, fail, fail_text, ok, pretty, Cx};
use super::types::*;
use abx_client::client::CallError;
use abx_protocol::api::{self, to_params};
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Value};

pub(super) async fn simple(cx: &Cx<'_>, name: &str, a: Value) -> Result<Value, Value> {
    let m = cx.mux;
    let call = |method: &'static str, params: Value| async move {
        m.call(method, params).await.map_err(|e| fail(&e))
    };
    Ok(match name {
        "sandbox_create" => {
            let a: CreateArgs = args(name, a)?;
            let p = to_params(&api::SandboxCreateParams::from(a));
            let sb = call("sandbox/create", p).await?;
            ok(cx, pretty(&sb), sb)
        }
        "sandbox_diff" => {
            let a: DiffArgs = args(name, a)?;
            let r = call("sandbox/diff", to_params(&api::DiffParams::from(a))).await?;
            ok(cx, diff_text(&r), r)
        }
        "sandbox_apply" => {
            let a: ApplyArgs = args(name, a)?;
            let sandbox = a.sandbox.clone();
            let r = call("sandbox/apply", to_params(&api::ApplyParams::from(a))).await?;
            ok(cx, apply_text(&sandbox, &r), r)
        }
        "sandbox_discard" => {
            let a: DiscardArgs = args(name, a)?;
            let r = call("sandbox/discard", to_params(&api::DiscardParams::from(a))).await?;
            let n = r["discarded"].as_array().map_or(0, Vec::len);
            ok(
                cx,
                format!("Discarded the changes of {n} paths.\n{}", pretty(&r)),
                r,
            )
        }
        "sandbox_log" => {
            let a: LogArgs = args(name, a)?;
            let r = call("sandbox/log", to_params(&api::LogParams::from(a))).await?;
            ok(cx, pretty(&r), r)
        }
        "sandbox_list" => {
            let a: ProviderArg = args(name, a)?;
            let r = call("sandbox/list", to_params(&api::SandboxListParams::from(a))).await?;
            // A provider that failed is named under the list; the others are listed anyway.
            let mut text = pretty(&r);
            for e in r["errors"].as_array().into_iter().flatten() {
                text.push('\n');
                text.push_str(crate::output::provider_warning(e).trim_end());
            }
            ok(cx, text, r)
        }
        "sandbox_info" => {
            let a: SandboxArg = args(name, a)?;
            let sb = call("sandbox/info", to_params(&api::SandboxParams::from(a))).await?;
            ok(cx, pretty(&sb), sb)
        }
        "sandbox_kill" => {
            let a: SandboxArg = args(name, a)?;
            let p = to_params(&api::SandboxParams::from(a.clone()));
            let r = call("sandbox/kill", p).await?;
            let killed = r["killed"].as_bool().unwrap_or(false);
            let text = if killed {
                format!("Sandbox '{}' killed.", a.sandbox)
            } else {
                format!("Sandbox '{}' was already gone.", a.sandbox)
            };
            ok(cx, text, json!({"killed": killed}))
        }
        "sandbox_set_network" => {
            let a: SetNetworkArgs = args(name, a)?;
            let p = to_params(&api::SetNetworkParams::from(a));
            let sb = call("sandbox/setNetwork", p).await?;
            ok(cx, pretty(&sb), sb)
        }
        "sandbox_set_timeout" => {
            let a: TimeoutArgs = args(name, a)?;
            let p = to_params(&api::SetTimeoutParams::from(a));
            let sb = call("sandbox/setTimeout", p).await?;
            ok(cx, pretty(&sb), sb)
        }
        "files_read" => {
            let a: PathArgs = args(name, a)?;
            let p = to_params(&api::FilesReadParams::from(a.clone()));
            let r = call("files/read", p).await?;
            let content = r["data"].as_str().unwrap_or_default().to_owned();
            let encoding = r["encoding"].as_str().unwrap_or("utf-8").to_owned();
            let size = r["size"].as_u64().unwrap_or(0);
            let truncated = r["eof"] == json!(false);
            let mut text = if encoding == "base64" {
                format!("(not UTF-8 text: {size} bytes, base64-encoded)\n{content}")
            } else {
                content.clone()
            };
            if truncated {
                text.push_str(&format!(
                    "\n[... truncated: the file has {size} bytes; read it in parts with exec (e.g. head, tail, sed -n)]"
                ));
            }
            let outcome = ReadOutcome {
                path: a.path,
                content,
                encoding,
                size,
                truncated,
            };
            ok(cx, text, json!(outcome))
        }
        "files_write" => {
            let a: WriteArgs = args(name, a)?;
            let p = to_params(&api::FilesWriteParams::from(a.clone()));
            let r = match m.call("files/write", p.clone()).await {
                Err(CallError::Rpc(e)) if e.error_code() == Some(ErrorCode::FileNotFound) => {
                    // A missing parent directory: create it, then write again.
                    match parent(&a.path) {
                        Some(dir) => {
                            let mkdir = api::MkdirParams {
                                sandbox: a.sandbox.clone(),
                                path: dir,
                                parents: true,
                            };
                            call("files/mkdir", to_params(&mkdir)).await?;
                            call("files/write", p).await?
                        }
                        None => return Err(fail(&CallError::Rpc(e))),
                    }
                }
                r => r.map_err(|e| fail(&e))?,
            };
            let size = r["size"].as_u64().unwrap_or(0);
            let text = format!("Wrote {size} bytes to {}.", a.path);
            ok(cx, text, json!(WriteOutcome { path: a.path, size }))
        }
        "files_list" => {
            let a: ListArgs = args(name, a)?;
            let r = call(
                "files/list",
                to_params(&api::FilesListParams::from(a.clone())),
            )
            .await?;
            let entries = r["entries"].as_array().cloned().unwrap_or_default();
            let dir = a.path.unwrap_or_else(|| "/workspace".into());
            let mut text = if entries.is_empty() {
                format!("{dir} is empty.")
            } else {
                format!("{dir}:\n")
            };
            for e in &entries {
                let kind = e["type"].as_str().unwrap_or("?");
                let suffix = if kind == "directory" { "/" } else { "" };
                text.push_str(&format!(
                    "{:<9} {:>10} {} {}{suffix}\n",
                    kind,
                    e["size"].as_u64().unwrap_or(0),
                    e["modifiedAt"].as_str().unwrap_or(""),
                    e["name"].as_str().unwrap_or(""),
                ));
            }
            ok(cx, text.trim_end().to_owned(), json!({"entries": entries}))
        }
        "ports_url" => {
            let a: PortArgs = args(name, a)?;
            let r = call("ports/url", to_params(&api::PortParams::from(a))).await?;
            let headers = r.get("headers").cloned().unwrap_or_else(|| json!({}));
            let url = r["url"].clone();
            ok(cx, pretty(&r), json!({"url": url, "headers": headers}))
        }
        "code_context_create" => {
            let a: CreateContextArgs = args(name, a)?;
            let p = to_params(&api::CodeCreateContextParams::from(a));
            let r = call("code/createContext", p).await?;
            ok(cx, pretty(&r), r)
        }
        "code_context_list" => {
            let a: SandboxArg = args(name, a)?;
            let r = call("code/listContexts", to_params(&api::SandboxParams::from(a))).await?;
            ok(cx, pretty(&r), r)
        }
        "code_context_restart" => {
            let a: ContextArgs = args(name, a)?;
            let p = to_params(&api::CodeContextParams::from(a));
            let r = call("code/restartContext", p).await?;
            ok(cx, pretty(&r), r)
        }
        "code_context_remove" => {
            let a: ContextArgs = args(name, a)?;
            let p = to_params(&api::CodeContextParams::from(a.clone()));
            let r = call("code/removeContext", p).await?;
            let text = format!(
                "Context '{}' of sandbox '{}' removed.",
                a.context, a.sandbox
            );
            ok(cx, text, r)
        }
        "provider_list" => {
            let a: NoArgs = args(name, a)?;
            let r = call("provider/list", to_params(&api::NoParams::from(a))).await?;
            ok(cx, pretty(&r), r)
        }
        other => return Err(fail_text(format!("Unknown tool '{other}'."))),
    })
}

/// `sandbox_diff`'s text: one line per change (`modified /workspace/a.txt (file, 12 bytes)`),
/// then the patches.
pub(super) fn diff_text(r: &Value) -> String {
    let changes = r["changes"].as_array().cloned().unwrap_or_default();
    if changes.is_empty() {
        return "No changes.".into();
    }
    let mut text = String::new();
    for c in &changes {
        text.push_str(&format!(
            "{} {} ({}, {} bytes{})\n",
            c["change"].as_str().unwrap_or("?"),
            c["path"].as_str().unwrap_or("?"),
            c["type"].as_str().unwrap_or("?"),
            c["size"].as_u64().unwrap_or(0),
            if c["binary"] == true { ", binary" } else { "" },
        ));
    }
    for c in &changes {
        if let Some(p) = c["patch"].as_str() {
            text.push('\n');
            text.push_str(p);
        }
    }
    if r["truncated"] == true {
        text.push_str("\n(the list was cut: ask again with paths)\n");
    }
    text
}

/// `sandbox_apply`'s text: what was applied, skipped, and the conflicts with E4015's line.
pub(super) fn apply_text(sandbox: &str, r: &Value) -> String {
    let list = |k: &str| r[k].as_array().cloned().unwrap_or_default();
    let mut text = String::new();
    for p in list("applied") {
        text.push_str(&format!("applied {}\n", p.as_str().unwrap_or("?")));
    }
    for s in list("skipped") {
        text.push_str(&format!(
            "skipped {}: {}\n",
            s["path"].as_str().unwrap_or("?"),
            s["reason"].as_str().unwrap_or("")
        ));
    }
    let conflicts = list("conflicts");
    for c in &conflicts {
        text.push_str(&format!(
            "conflict {}: {}\n",
            c["path"].as_str().unwrap_or("?"),
            c["reason"].as_str().unwrap_or("")
        ));
    }
    if !conflicts.is_empty() {
        let paths: Vec<&str> = conflicts
            .iter()
            .filter_map(|c| c["path"].as_str())
            .collect();
        let e = AbxError::new(
            ErrorCode::ApplyConflict,
            &[("sandbox", sandbox), ("paths", &paths.join(", "))],
        );
        text.push_str(&format!("{e}\nSuggestion: {}\n", e.suggestion));
    }
    if text.is_empty() {
        text.push_str("Nothing to apply.\n");
    }
    text
}

/// The parent directory of a sandbox path, when it has one worth creating.
pub(super) fn parent(path: &str) -> Option<String> {
    let p = std::path::Path::new(path).parent()?.to_str()?;
    (!p.is_empty() && p != "/").then(|| p.to_owned())
}
