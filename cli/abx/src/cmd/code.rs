//! `abx code SANDBOX [FILE|-]`: run code in a context of the sandbox (`code/run`). Output
//! streams as it comes (`code/output`: stdout to stdout, stderr and the error's traceback to
//! stderr, each result as its `text/plain`, or a line naming its MIME types when it has no
//! text); with -j, the whole result as JSON. Exit code 0, or 1 when the code raised an
//! error. Ctrl-C, SIGTERM or SIGHUP interrupt the code (`$/cancelRequest`; the context keeps
//! its state) before abx exits with 128 + the signal.

use super::Ctx;
use crate::output::{print_json, Failure};
use crate::stream::Ending;
use abx_protocol::api::{self, to_params};
use abx_protocol::ErrorCode;
use serde_json::Value;
use std::io::Write;

/// The language a file's extension says.
fn language_of(file: &str) -> Option<&'static str> {
    let ext = std::path::Path::new(file).extension()?.to_str()?;
    Some(match ext {
        "py" => "python",
        "js" | "mjs" | "cjs" => "javascript",
        "sh" | "bash" => "bash",
        _ => return None,
    })
}

fn read_code(file: Option<&str>) -> Result<String, Failure> {
    match file {
        None | Some("-") => {
            if crate::term::stdin_is_tty() {
                return Err(Failure::usage(
                    "abx code: no code given",
                    "Pass a file, or pipe the code in: echo '1+1' | abx code SANDBOX",
                ));
            }
            Ok(
                String::from_utf8_lossy(&crate::stream::piped_stdin().unwrap_or_default())
                    .into_owned(),
            )
        }
        Some(f) => std::fs::read_to_string(f).map_err(|e| {
            Failure::from(abx_protocol::AbxError::detail(
                ErrorCode::LocalFileError,
                format!("{f}: {e}"),
            ))
        }),
    }
}

/// A result bundle as a line of text.
pub fn result_text(b: &Value) -> String {
    match b["text/plain"].as_str() {
        Some(t) => t.to_owned(),
        None => {
            let kinds: Vec<&str> = b
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            format!("[{}]", kinds.join(", "))
        }
    }
}

fn print_note(n: &Value) {
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let text = n["text"].as_str().unwrap_or_default();
    match n["type"].as_str().unwrap_or_default() {
        "stdout" => {
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
        "stderr" => {
            let _ = err.write_all(text.as_bytes());
        }
        "result" => {
            let _ = writeln!(out, "{}", result_text(&n["result"]));
            let _ = out.flush();
        }
        "error" => {
            let e = &n["error"];
            let tb = e["traceback"].as_str().unwrap_or_default();
            if tb.is_empty() {
                let _ = writeln!(err, "{}: {}", text_of(&e["name"]), text_of(&e["value"]));
            } else {
                let _ = write!(err, "{tb}");
                if !tb.ends_with('\n') {
                    let _ = writeln!(err);
                }
            }
        }
        "restarted" => {
            let _ = writeln!(err, "abx: {text}");
        }
        _ => {}
    }
}

fn text_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// `abx code`.
pub async fn code(
    cx: &Ctx,
    sandbox: &str,
    file: Option<&str>,
    context: Option<&str>,
    language: Option<&str>,
    timeout: Option<f64>,
) -> Result<u8, Failure> {
    let code = read_code(file)?;
    let language = language
        .map(str::to_owned)
        .or_else(|| file.and_then(language_of).map(str::to_owned));
    let params = to_params(&api::CodeRunParams {
        sandbox: sandbox.into(),
        code,
        language,
        context: context.map(Into::into),
        timeout,
        env: None,
        run_id: Some("abx-code".into()),
    });
    let mut c = cx.connect().await?;
    let mut ending = Ending::new();
    let id = c
        .send_request("code/run", Some(&params))
        .await
        .map_err(|e| Failure::from(e).in_method("code/run"))?;
    let json_mode = cx.json;
    let mut on_note = |n: &abx_protocol::message::Notification| {
        if !json_mode && n.method == "code/output" {
            if let Some(p) = n.params.as_deref() {
                if let Ok(v) = serde_json::from_str::<Value>(p.get()) {
                    print_note(&v);
                }
            }
        }
    };
    let sig = tokio::select! {
        r = c.reply_watching(&id, &mut on_note) => {
            let r = r.map_err(|e| Failure::from(e).in_method("code/run"))?;
            if json_mode {
                print_json(&r);
            } else if r["timedOut"] == true {
                eprintln!("abx: the code ran past its timeout and was interrupted");
            }
            return Ok(if r["error"].is_null() { 0 } else { 1 });
        }
        _ = tokio::signal::ctrl_c() => libc::SIGINT,
        sig = ending.recv() => sig,
    };
    crate::stream::cancel_and_wait(&mut c, &id).await;
    Ok((128 + sig) as u8)
}
