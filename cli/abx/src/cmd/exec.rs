//! `abx exec` and `abx run`: output streamed live (or, with -j, one JSON result), stdin
//! forwarded when piped, abx's exit code = the command's.

use super::{call, Ctx};
use crate::output::{print_json, Failure};
use crate::stream;
use crate::term;
use abx_protocol::api::{self, to_params};
use serde_json::{json, Value};

/// `exec/run` params plus piped stdin (for -j).
fn run_params(sandbox: &str, command: &str, timeout: Option<f64>, cwd: Option<&str>) -> Value {
    let mut p = api::ExecRunParams {
        sandbox: sandbox.into(),
        command: Some(command.into()),
        timeout,
        cwd: cwd.map(Into::into),
        ..Default::default()
    };
    if !term::stdin_is_tty() {
        if let Some(buf) = stream::piped_stdin() {
            p.stdin = Some(abx_protocol::b64::encode(&buf));
            p.stdin_encoding = Some("base64".into());
        }
    }
    to_params(&p)
}

/// The exit code of an `exec/run` result printed with -j: the command's; a provider's bad
/// exit (an exit code outside 0..=255, or none) is said on stderr (the result on stdout
/// shows it) and is exit 1, never a success.
fn exit_of(r: &Value, sandbox: &str) -> u8 {
    stream::exit_code(r, sandbox).unwrap_or_else(|f| {
        f.print(false, false, None);
        f.exit.clamp(1, 255) as u8
    })
}

/// `abx exec SANDBOX CMD...`.
pub async fn exec(
    cx: &Ctx,
    sandbox: &str,
    command: &[String],
    timeout: Option<f64>,
    cwd: Option<&str>,
) -> Result<u8, Failure> {
    let mut c = cx.connect_announced().await?;
    let cmd = stream::shell_join(command);
    if cx.json {
        return run_json(&mut c, sandbox, &cmd, timeout, cwd).await;
    }
    stream::exec(&mut c, sandbox, &cmd, timeout, cwd).await
}

/// `exec/run` with -j. Ctrl-C, SIGTERM or SIGHUP cancel it (`$/cancelRequest`: the broker
/// kills the command's tree) before abx exits with 128 + the signal.
async fn run_json(
    c: &mut abx_client::client::Client,
    sandbox: &str,
    cmd: &str,
    timeout: Option<f64>,
    cwd: Option<&str>,
) -> Result<u8, Failure> {
    let params = run_params(sandbox, cmd, timeout, cwd);
    match stream::run_cancellable(c, &params).await? {
        Ok(r) => {
            print_json(&r);
            Ok(exit_of(&r, sandbox))
        }
        Err(code) => Ok(code),
    }
}

/// `abx run -- CMD`: create a sandbox, run, kill it (also on failure or Ctrl-C).
pub async fn run(
    cx: &Ctx,
    template: Option<&str>,
    mounts: Option<Value>,
    opts: &crate::args::SandboxOpts,
    timeout: Option<f64>,
    command: &[String],
) -> Result<u8, Failure> {
    let mut c = cx.connect_announced().await?;
    let mut create = api::SandboxCreateParams {
        provider: cx.provider.clone(),
        template: template.map(Into::into),
        mounts,
        ..Default::default()
    };
    opts.apply(&mut create);
    let params = to_params(&create);
    // Listening before the sandbox exists: a SIGTERM or SIGHUP from here on still kills it.
    let mut ending = stream::Ending::new();
    let sb = call(&mut c, "sandbox/create", params).await?;
    let full = super::sandbox::full_id(&sb);
    let cmd = stream::shell_join(command);
    let result = if cx.json {
        tokio::select! {
            r = call(&mut c, "exec/run", run_params(&full, &cmd, timeout, None)) => r.map(|r| {
                let mut r = r;
                r["sandbox"] = json!(full);
                print_json(&r);
                exit_of(&r, &full)
            }),
            _ = tokio::signal::ctrl_c() => Ok(130),
            sig = ending.recv() => Ok((128 + sig) as u8),
        }
    } else {
        tokio::select! {
            r = stream::exec(&mut c, &full, &cmd, timeout, None) => r,
            _ = tokio::signal::ctrl_c() => Ok(130),
            sig = ending.recv() => Ok((128 + sig) as u8),
        }
    };
    // Always clean up, on success, failure, Ctrl-C, SIGTERM or SIGHUP, on a fresh connection.
    if let Ok(mut k) = cx.connect().await {
        let kill = api::SandboxParams { sandbox: full };
        let _ = call(&mut k, "sandbox/kill", to_params(&kill)).await;
    }
    result
}
