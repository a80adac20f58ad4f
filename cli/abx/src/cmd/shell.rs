//! `abx shell SANDBOX [-- CMD]`: an interactive pty session.
//!
//! `exec/start` with `pty {cols, rows}` from the terminal; stdin in raw mode (restored on
//! every way out); keystrokes forwarded with `exec/write`; SIGWINCH becomes `exec/resize`;
//! SIGTERM/SIGHUP kill the remote session and restore the terminal; abx exits with the
//! shell's exit code.

use super::Ctx;
use crate::output::{out_bytes, Failure};
use crate::stream::{self, write_stdin};
use crate::term;
use abx_protocol::api::{self, to_params};
use abx_protocol::message::Message;
use abx_protocol::{AbxError, ErrorCode};
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};

/// What runs when no CMD is given: the sandbox's bash, else sh, interactive.
pub const DEFAULT_SHELL: &str =
    "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi";

/// `abx shell`.
pub async fn shell(cx: &Ctx, sandbox: &str, command: &[String]) -> Result<u8, Failure> {
    if cx.json {
        return Err(Failure::usage(
            "'abx shell' is interactive and has no JSON form.",
            format!("Use 'abx -j exec {sandbox} CMD' for machine-readable output."),
        ));
    }
    let cmd = if command.is_empty() {
        DEFAULT_SHELL.to_owned()
    } else {
        stream::shell_join(command)
    };
    let (cols, rows) = term::pty_size();
    let mut start = api::ExecStartParams {
        sandbox: sandbox.into(),
        command: Some(cmd),
        pty: Some(api::PtySize { cols, rows }),
        ..Default::default()
    };
    // The terminal type, as ssh passes it (the sandbox's default is xterm-256color).
    if let Ok(t) = std::env::var("TERM") {
        if !t.is_empty() && t != "dumb" && term::stdin_is_tty() {
            start.env = Some([("TERM".to_owned(), t)].into());
        }
    }
    let params = to_params(&start);
    let mut c = cx.connect_announced().await?;
    let started = super::call(&mut c, "exec/start", params).await?;
    let exec_id = started["execId"].as_str().unwrap_or_default().to_owned();
    let mut winch = signal(SignalKind::window_change()).map_err(AbxError::internal)?;
    let mut term_sig = signal(SignalKind::terminate()).map_err(AbxError::internal)?;
    let mut hup = signal(SignalKind::hangup()).map_err(AbxError::internal)?;
    // Raw mode only once the session exists; dropped (restored) on every return below.
    let _raw = if term::stdin_is_tty() {
        term::RawMode::enable()
    } else {
        None
    };
    let mut stdin = Some(term::stdin_chunks());
    let mut last_size = (cols, rows);
    loop {
        tokio::select! {
            m = c.next_message() => {
                let Some(m) = m? else {
                    return Err(AbxError::detail(ErrorCode::BrokerUnreachable, "the broker closed the connection").into());
                };
                let Message::Notification(n) = m else { continue };
                let p: Value = n.params.as_deref().and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or_default();
                if p["execId"] != exec_id.as_str() {
                    continue;
                }
                match n.method.as_str() {
                    "exec/output" => out_bytes(&decode(&p)),
                    "exec/exit" => return stream::exit_code(&p, sandbox),
                    _ => {}
                }
            }
            chunk = async { stdin.as_mut().expect("stdin").recv().await }, if stdin.is_some() => {
                match chunk.flatten() {
                    Some(data) => write_stdin(&mut c, &exec_id, &data, false).await?,
                    None => {
                        // End of input: the terminal's EOF character for the shell.
                        stdin = None;
                        write_stdin(&mut c, &exec_id, &[], true).await?;
                    }
                }
            }
            _ = winch.recv() => {
                let size = term::pty_size();
                if size != last_size {
                    last_size = size;
                    let p = to_params(&api::ExecResizeParams {
                        exec_id: exec_id.clone(),
                        cols: size.0,
                        rows: size.1,
                    });
                    c.send_request("exec/resize", Some(&p)).await?;
                }
            }
            _ = term_sig.recv() => return Ok(hang_up(&mut c, &exec_id, 15).await),
            _ = hup.recv() => return Ok(hang_up(&mut c, &exec_id, 1).await),
        }
    }
}

async fn hang_up(c: &mut abx_client::client::Client, exec_id: &str, sig: u8) -> u8 {
    let _ = c
        .call(
            "exec/kill",
            Some(&to_params(&api::ExecKillParams {
                exec_id: exec_id.into(),
                signal: Some("HUP".into()),
                escalate: None,
            })),
        )
        .await;
    128 + sig
}

fn decode(v: &Value) -> Vec<u8> {
    let data = v["data"].as_str().unwrap_or_default();
    if v["encoding"] == "base64" {
        abx_protocol::b64::decode(data).unwrap_or_default()
    } else {
        data.as_bytes().to_vec()
    }
}
