//! `abx network SANDBOX show|allow HOST...|deny HOST...`: a sandbox's network policy, live
//! (`sandbox/info`, `sandbox/setNetwork`; docs/cli.md), and the policy rows of `abx info`.

use super::{call, Ctx};
use crate::args::NetworkArgs;
use crate::output::{out, print_fields, print_json, text, Failure};
use serde_json::{json, Value};

/// `abx network`.
pub async fn network(cx: &Ctx, a: NetworkArgs) -> Result<u8, Failure> {
    let mut c = cx.connect().await?;
    let sb = call(&mut c, "sandbox/info", json!({"sandbox": a.sandbox})).await?;
    let current = &sb["network"];
    let sb = match a.action.as_str() {
        "show" => {
            if !a.hosts.is_empty() {
                return Err(Failure::usage(
                    "abx network SANDBOX show takes no hosts",
                    "Run 'abx network SANDBOX allow HOST...' to add hosts.",
                ));
            }
            sb
        }
        action => {
            if a.hosts.is_empty() {
                return Err(Failure::usage(
                    format!("abx network SANDBOX {action} HOST...: name at least one host"),
                    "Name hosts as patterns: example.com, *.example.com, HOST:PORT, an IP or CIDR, @SET.",
                ));
            }
            if !current.is_object() {
                return Err(Failure::usage(
                    format!(
                        "sandbox {} has the network mode '{}', not a policy",
                        a.sandbox,
                        text(current)
                    ),
                    "A policy is chosen at create: abx create --allow HOST (or --network allow:HOST,...).",
                ));
            }
            let list =
                |k: &str| -> Vec<Value> { current[k].as_array().cloned().unwrap_or_default() };
            let (mut allow, mut deny) = (list("allow"), list("deny"));
            let target = if action == "allow" {
                &mut allow
            } else {
                &mut deny
            };
            for h in &a.hosts {
                let h = Value::from(h.as_str());
                if !target.contains(&h) {
                    target.push(h);
                }
            }
            if action == "allow" {
                // Allowing a host also lifts a deny entry written the same way.
                deny.retain(|d| !a.hosts.iter().any(|h| d == h.as_str()));
            }
            let mut policy = json!({ "allow": allow });
            if !deny.is_empty() {
                policy["deny"] = Value::Array(deny);
            }
            call(
                &mut c,
                "sandbox/setNetwork",
                json!({"sandbox": a.sandbox, "network": policy}),
            )
            .await?
        }
    };
    if cx.json {
        print_json(&sb["network"]);
    } else {
        let rows = rows(&sb["network"]);
        if rows.is_empty() {
            out("No network information.\n");
        } else {
            print_fields(&rows);
        }
    }
    Ok(0)
}

/// The rows of a sandbox's `network` in `abx info`: `Network` (a mode, or `allow ...; deny
/// ...`) and `Blocked` (`host:port xN (last TIME)`, the latest first).
pub fn rows(n: &Value) -> Vec<(&'static str, String)> {
    let join = |v: &Value| {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|e| match e {
                        Value::String(s) => s.clone(),
                        other => other["host"]
                            .as_str()
                            .map_or_else(|| other.to_string(), str::to_owned),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    match n {
        Value::Null => vec![],
        Value::Object(_) => {
            let mut policy = format!("allow {}", join(&n["allow"]));
            let deny = join(&n["deny"]);
            if !deny.is_empty() {
                policy.push_str(&format!("; deny {deny}"));
            }
            let mut rows = vec![("Network", policy)];
            let blocked: Vec<String> = n["blocked"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|b| {
                            format!(
                                "{}:{} x{} (last {})",
                                text(&b["host"]),
                                text(&b["port"]),
                                text(&b["count"]),
                                super::sandbox::show_time(&b["last"])
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            if !blocked.is_empty() {
                rows.push(("Blocked", blocked.join(", ")));
            }
            rows
        }
        other => vec![("Network", text(other))],
    }
}
