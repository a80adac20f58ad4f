//! `abx broker start|stop|status`. With a remote host (`--host` / `ABX_HOST`) each runs as
//! `abx broker start|stop|status` on that machine over ssh, its output passed through.

use super::Ctx;
use crate::output::{print_fields, print_json, text, Failure};
use abx_client::client::Client;
use abx_client::spawn;
use abx_protocol::api::{methods, to_params, NoParams};
use serde_json::{json, Value};
use std::time::Duration;

fn fmt_uptime(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// On a remote host: run `abx [-j] broker ACTION` there (`None` on this machine).
fn on_remote_host(cx: &Ctx, action: &str) -> Option<Result<u8, Failure>> {
    let host = match abx_client::remote::current() {
        Ok(Some(h)) => h,
        Ok(None) => return None,
        Err(e) => return Some(Err(e.into())),
    };
    let mut args = vec!["broker", action];
    if cx.json {
        args.insert(0, "-j");
    }
    Some(
        abx_client::remote::run_remote(host, &args)
            .map(|c| c.clamp(0, 255) as u8)
            .map_err(Failure::from),
    )
}

/// `abx broker status`: never starts the daemon (E1007 when none runs).
pub async fn status(cx: &Ctx) -> Result<u8, Failure> {
    if let Some(r) = on_remote_host(cx, "status") {
        return r;
    }
    let mut c = Client::connect_existing(&cx.paths).await?;
    let st = super::call(&mut c, methods::STATUS, to_params(&NoParams {})).await?;
    if cx.json {
        print_json(&st);
        return Ok(0);
    }
    let s = |k: &str| st.get(k).map(text).unwrap_or_default();
    print_fields(&[
        ("Status", "running".into()),
        ("Version", s("version")),
        ("PID", s("pid")),
        ("Uptime", fmt_uptime(st["uptimeMs"].as_u64().unwrap_or(0))),
        ("Connections", s("connections")),
        ("Sandboxes", s("sandboxes")),
        ("Socket", s("socket")),
        ("Data", s("dataDir")),
        ("Log", s("logFile")),
    ]);
    Ok(0)
}

/// `abx broker start`: no-op when one runs.
pub async fn start(cx: &Ctx) -> Result<u8, Failure> {
    if let Some(r) = on_remote_host(cx, "start") {
        return r;
    }
    let started = spawn::start_daemon(&cx.paths).await?;
    let mut c = Client::connect(&cx.paths).await?;
    let st = super::call(&mut c, methods::STATUS, to_params(&NoParams {})).await?;
    let pid = st["pid"].as_u64().unwrap_or(0);
    if cx.json {
        print_json(
            &json!({"status": "running", "started": started.is_some(), "pid": pid, "version": st["version"]}),
        );
    } else if started.is_some() {
        crate::output::out(&format!("abx broker started (pid {pid}).\n"));
    } else {
        crate::output::out(&format!("abx broker is already running (pid {pid}).\n"));
    }
    Ok(0)
}

/// `abx broker stop`: fine when none runs.
pub async fn stop(cx: &Ctx) -> Result<u8, Failure> {
    if let Some(r) = on_remote_host(cx, "stop") {
        return r;
    }
    let Ok(mut c) = Client::connect_existing(&cx.paths).await else {
        if cx.json {
            print_json(&json!({"status": "stopped", "wasRunning": false}));
        } else {
            crate::output::out("abx broker is not running.\n");
        }
        return Ok(0);
    };
    let st = super::call(&mut c, methods::STATUS, to_params(&NoParams {})).await?;
    c.call(methods::BROKER_SHUTDOWN, None::<&Value>).await?;
    drop(c);
    spawn::wait_stopped(&cx.paths, Duration::from_secs(10)).await?;
    let pid = st["pid"].as_u64().unwrap_or(0);
    if cx.json {
        print_json(&json!({"status": "stopped", "wasRunning": true, "pid": pid}));
    } else {
        crate::output::out(&format!("abx broker stopped (pid {pid}).\n"));
    }
    Ok(0)
}

/// `abx broker run` / `abx broker --stdio`: replace this process with the daemon binary
/// (`abx-broker`, see [`spawn::daemon_binary`]). Returns only when that fails.
pub fn exec_daemon(cx: &Ctx, args: &[&str]) -> Failure {
    use std::os::unix::process::CommandExt;
    let bin = match spawn::daemon_binary() {
        Ok(b) => b,
        Err(e) => return cannot_start(cx, e),
    };
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(args);
    if cx.json {
        cmd.arg("--json");
    }
    let e = cmd.exec();
    cannot_start(cx, format!("cannot run {}: {e}", bin.display()))
}

fn cannot_start(cx: &Ctx, detail: impl std::fmt::Display) -> Failure {
    Failure::from(abx_protocol::AbxError::new(
        abx_protocol::ErrorCode::BrokerUnreachable,
        &[
            ("detail", &detail.to_string()),
            ("log", &cx.paths.log_file().display().to_string()),
        ],
    ))
}
