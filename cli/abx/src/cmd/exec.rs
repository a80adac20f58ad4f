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
    // Listening before the sandbox exists: a SIGTERM or SIGHUP from here on still kills it.
    let mut ending = stream::Ending::new();
    let cmd = stream::shell_join(command);
    // One request (issue 48): the sandbox made for the command and killed after it by the
    // broker. `ABX_RUN_CALLS=3` keeps the three calls (create, exec, kill), as does a broker
    // or provider that does not know `create` (E1004): measured, docs/performance.md.
    if std::env::var_os("ABX_RUN_CALLS").is_none_or(|v| v != "3") {
        if let Some(done) = run_once(cx, &mut c, &create, &cmd, timeout, &mut ending).await {
            return done;
        }
    }
    let params = to_params(&create);
    let sb = call(&mut c, "sandbox/create", params).await?;
    let full = super::sandbox::full_id(&sb);
    // Whether the command ran to its end (its reply or its exit read): the connection is
    // then idle and the kill goes on it; otherwise (Ctrl-C, a signal) on a fresh one.
    let mut finished = false;
    let result = if cx.json {
        tokio::select! {
            r = call(&mut c, "exec/run", run_params(&full, &cmd, timeout, None)) => {
                finished = true;
                r.map(|r| {
                    let mut r = r;
                    r["sandbox"] = json!(full);
                    print_json(&r);
                    exit_of(&r, &full)
                })
            }
            _ = tokio::signal::ctrl_c() => Ok(130),
            sig = ending.recv() => Ok((128 + sig) as u8),
        }
    } else {
        tokio::select! {
            r = stream::exec(&mut c, &full, &cmd, timeout, None) => {
                finished = true;
                r
            }
            _ = tokio::signal::ctrl_c() => Ok(130),
            sig = ending.recv() => Ok((128 + sig) as u8),
        }
    };
    // Always clean up, on success, failure, Ctrl-C, SIGTERM or SIGHUP.
    let kill = to_params(&api::SandboxParams { sandbox: full });
    let killed = finished && call(&mut c, "sandbox/kill", kill.clone()).await.is_ok();
    if !killed {
        if let Ok(mut k) = cx.connect().await {
            let _ = call(&mut k, "sandbox/kill", kill).await;
        }
    }
    result
}

/// `abx run` in one request: `exec/start` (or `exec/run` with -j) with `create` instead of
/// `sandbox`. `None` when the broker or the provider does not take `create` (E1004 before
/// anything ran): the caller makes the three calls then.
async fn run_once(
    cx: &Ctx,
    c: &mut abx_client::client::Client,
    create: &api::SandboxCreateParams,
    cmd: &str,
    timeout: Option<f64>,
    ending: &mut stream::Ending,
) -> Option<Result<u8, Failure>> {
    let mut inner = create.clone();
    let provider = inner.provider.take();
    let mut params = if cx.json {
        run_params("", cmd, timeout, None)
    } else {
        json!({"command": cmd, "timeout": timeout})
    };
    if timeout.is_none() {
        if let Some(o) = params.as_object_mut() {
            o.remove("timeout");
        }
    }
    params["create"] = to_params(&inner);
    if let Some(p) = provider {
        params["provider"] = json!(p);
    }
    // Refused as a whole before anything ran: a broker or provider that does not take
    // `create` (a plugin answers "missing field `sandbox`", an older broker names `create`).
    // A fault of the command's own params then shows again on the three calls' path.
    let refused = |f: &Failure| f.abx == "E1004";
    let told = std::cell::RefCell::new(None::<String>);
    let result = if cx.json {
        tokio::select! {
            r = call(c, "exec/run", params) => match r {
                Err(f) if refused(&f) => return None,
                r => r.map(|r| {
                    let sb = r["sandbox"].as_str().unwrap_or_default().to_owned();
                    print_json(&r);
                    exit_of(&r, &sb)
                }),
            },
            // The broker cancels the request (the connection ends) and kills the sandbox.
            _ = tokio::signal::ctrl_c() => Ok(130),
            sig = ending.recv() => Ok((128 + sig) as u8),
        }
    } else {
        let r = tokio::select! {
            r = stream::exec_params(c, params, "", Some(&told)) => r,
            _ = tokio::signal::ctrl_c() => Ok(130),
            sig = ending.recv() => Ok((128 + sig) as u8),
        };
        match r {
            Err(f) if told.borrow().is_none() && refused(&f) => return None,
            r => r,
        }
    };
    // The broker kills the sandbox once the command has ended; cut short here (Ctrl-C, a
    // signal), the kill is asked for too.
    let id = told.borrow_mut().take();
    if let (Some(id), true) = (id, result.as_ref().is_ok_and(|code| *code >= 128)) {
        if let Ok(mut k) = cx.connect().await {
            let kill = api::SandboxParams { sandbox: id };
            let _ = call(&mut k, "sandbox/kill", to_params(&kill)).await;
        }
    }
    Some(result)
}
