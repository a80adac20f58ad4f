//! `abx sandbox process list|kill`.

use super::{call1, Ctx};
use crate::args::ProcessCmd;
use crate::output::{out, print_json, text, Failure};
use crate::table::Table;
use crate::term;
use abx_protocol::api::{self, to_params};
use serde_json::json;

/// `abx sandbox process ...`.
pub async fn process(cx: &Ctx, p: ProcessCmd) -> Result<u8, Failure> {
    match p {
        ProcessCmd::List(a) => {
            let r = call1(
                cx,
                "process/list",
                to_params(&api::SandboxParams { sandbox: a.sandbox }),
            )
            .await?;
            let procs = r["processes"].as_array().cloned().unwrap_or_default();
            if cx.json {
                print_json(&json!({"processes": procs}));
                return Ok(0);
            }
            if procs.is_empty() {
                out("No processes running.\n");
                return Ok(0);
            }
            let mut t = Table::new(["PID", "Command", "Status"]);
            for p in &procs {
                t.row([text(&p["pid"]), text(&p["command"]), text(&p["status"])]);
            }
            out(&t.render(term::table_width()));
            Ok(0)
        }
        ProcessCmd::Kill {
            sandbox,
            pid,
            signal,
        } => {
            let mut params = json!({"sandbox": sandbox, "pid": pid});
            if let Some(s) = &signal {
                params["signal"] = json!(s);
            }
            call1(cx, "process/kill", params).await?;
            let sig = signal.unwrap_or_else(|| "KILL".into());
            if cx.json {
                print_json(&json!({"sandbox": sandbox, "pid": pid, "signal": sig}));
            } else {
                out(&format!("Sent {sig} to process {pid}.\n"));
            }
            Ok(0)
        }
    }
}
