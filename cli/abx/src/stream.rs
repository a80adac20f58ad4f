//! Streaming an exec to the terminal: `abx exec` and `abx run`.
//!
//! Output is written as it arrives (stdout to stdout, stderr to stderr); piped stdin is
//! forwarded with `exec/write` and closed with `eof`; the exit code is the command's.

use crate::output::Failure;
use abx_client::client::{CallError, Client};
use abx_protocol::message::Message;
use abx_protocol::RpcError;
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Value};
use std::io::IsTerminal;
use tokio::io::AsyncWriteExt;

/// Join argv into one shell string: a single argument is taken as a shell command as is;
/// several are quoted so that each stays one word.
pub fn shell_join(args: &[String]) -> String {
    if args.len() == 1 {
        return args[0].clone();
    }
    args.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

fn quote(a: &str) -> String {
    if !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        a.to_owned()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

fn decode(v: &Value) -> Vec<u8> {
    let data = v["data"].as_str().unwrap_or_default();
    if v["encoding"] == "base64" {
        abx_protocol::b64::decode(data).unwrap_or_default()
    } else {
        data.as_bytes().to_vec()
    }
}

/// The signals that end the CLI from outside: SIGTERM (a killed agent, `timeout`, `kill`)
/// and SIGHUP (a closed terminal). Listening replaces their default action (exit at once,
/// leaving the remote command running), so the CLI can kill what it started first.
pub struct Ending(Vec<(i32, tokio::signal::unix::Signal)>);

impl Ending {
    /// Start listening (SIGINT has its own handling: interrupt, then leave).
    pub fn new() -> Ending {
        use tokio::signal::unix::{signal, SignalKind};
        let kinds = [
            (libc::SIGTERM, SignalKind::terminate()),
            (libc::SIGHUP, SignalKind::hangup()),
        ];
        Ending(
            kinds
                .into_iter()
                .filter_map(|(n, k)| signal(k).ok().map(|s| (n, s)))
                .collect(),
        )
    }

    /// The next of these signals (its number).
    pub async fn recv(&mut self) -> i32 {
        if self.0.is_empty() {
            return std::future::pending().await;
        }
        let all = self.0.iter_mut().map(|(n, s)| {
            let n = *n;
            Box::pin(async move {
                s.recv().await;
                n
            })
        });
        futures::future::select_all(all).await.0
    }
}

/// Send `method` and wait (a little) for its reply, so that it has been acted on before the
/// CLI exits.
pub async fn call_before_exit(c: &mut Client, method: &str, params: &Value) {
    if let Ok(id) = c.send_request(method, Some(params)).await {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), c.reply_to(&id)).await;
    }
}

/// True when `exec/start` was refused because the provider does not declare `exec.stream`
/// (E8004): `exec/run` does the same job, with the output at the end.
pub fn lacks_stream(e: &RpcError) -> bool {
    e.abx() == Some("E8004") && e.message.contains("'exec.stream'")
}

/// Say once per process (on stderr) that the output comes at the end.
pub fn note_no_stream(e: &RpcError) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let provider = e
        .message
        .split('\'')
        .nth(1)
        .map_or_else(String::new, |p| format!(" '{p}'"));
    eprintln!(
        "abx: provider{provider} does not stream output (no 'exec.stream'); running with exec/run instead: the output comes when the command ends."
    );
}

/// All of piped stdin (`None` when empty or unreadable).
pub fn piped_stdin() -> Option<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    match std::io::stdin().read_to_end(&mut buf) {
        Ok(_) if !buf.is_empty() => Some(buf),
        _ => None,
    }
}

/// Cancel request `id` (`$/cancelRequest`) and wait up to 5 s for its answer, so the broker
/// has stopped the work before the process exits.
pub async fn cancel_and_wait(c: &mut Client, id: &abx_protocol::Id) {
    let mut line =
        abx_protocol::message::encode_notification("$/cancelRequest", Some(&json!({ "id": id })));
    line.push(b'\n');
    if c.send_raw(&line).await.is_ok() {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), c.reply_to(id)).await;
    }
}

/// `exec/run` that Ctrl-C, SIGTERM or SIGHUP cancel (`$/cancelRequest`: the broker kills the
/// command's tree): `Ok(result)`, or `Err(128 + the signal)` once it has been cancelled.
pub async fn run_cancellable(c: &mut Client, params: &Value) -> Result<Result<Value, u8>, Failure> {
    // Listening before the request goes: a signal from here on is handled, never fatal.
    let mut ending = Ending::new();
    let id = c
        .send_request("exec/run", Some(params))
        .await
        .map_err(|e| Failure::from(e).in_method("exec/run"))?;
    let sig = tokio::select! {
        r = c.reply_to(&id) => {
            return r.map(Ok).map_err(|e| Failure::from(e).in_method("exec/run"));
        }
        _ = tokio::signal::ctrl_c() => libc::SIGINT,
        sig = ending.recv() => sig,
    };
    cancel_and_wait(c, &id).await;
    Ok(Err((128 + sig) as u8))
}

/// Run with `exec/run` and write its output at the end (stdout to stdout, stderr to
/// stderr): the fallback of [`exec`] for providers without `exec.stream`.
async fn run_to_end(c: &mut Client, params: &Value, sandbox: &str) -> Result<u8, Failure> {
    let r = match run_cancellable(c, params).await? {
        Ok(r) => r,
        Err(code) => return Ok(code),
    };
    let bytes = |k: &str| -> Vec<u8> {
        let data = r[k].as_str().unwrap_or_default();
        if r["encoding"] == "base64" {
            abx_protocol::b64::decode(data).unwrap_or_default()
        } else {
            data.as_bytes().to_vec()
        }
    };
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    let _ = out.write_all(&bytes("stdout")).await;
    let _ = out.flush().await;
    let _ = err.write_all(&bytes("stderr")).await;
    if r["truncated"] == true {
        let _ = err
            .write_all(b"abx: output truncated (exec/run keeps at most 16 MiB per stream).\n")
            .await;
    }
    let _ = err.flush().await;
    if r["timedOut"] == true {
        eprintln!("[E3001] Command timed out.");
    }
    exit_code(&r, sandbox)
}

/// Start `command` in `sandbox`, stream it, return its exit code.
pub async fn exec(
    c: &mut Client,
    sandbox: &str,
    command: &str,
    timeout: Option<f64>,
    cwd: Option<&str>,
) -> Result<u8, Failure> {
    let mut params = json!({"sandbox": sandbox, "command": command});
    if let Some(t) = timeout {
        params["timeout"] = json!(t);
    }
    if let Some(d) = cwd {
        params["cwd"] = json!(d);
    }
    exec_params(c, params, sandbox, None).await
}

/// [`exec`] with its `exec/start` params as given (`abx run` asks for a sandbox made for
/// the command alone: `create` instead of `sandbox`, issue 48); `told` is told the
/// sandbox the reply names, once it is known.
pub async fn exec_params(
    c: &mut Client,
    mut params: Value,
    sandbox: &str,
    told: Option<&std::cell::RefCell<Option<String>>>,
) -> Result<u8, Failure> {
    // SIGTERM / SIGHUP: the command is killed (its whole tree) before abx exits. Listening
    // before exec/start goes, so a signal while it starts is handled, never fatal.
    let mut ending = Ending::new();
    let started = match c.call("exec/start", Some(&params)).await {
        Ok(v) => v,
        Err(CallError::Rpc(e)) if lacks_stream(&e) => {
            note_no_stream(&e);
            if !std::io::stdin().is_terminal() {
                if let Some(data) = piped_stdin() {
                    params["stdin"] = json!(abx_protocol::b64::encode(&data));
                    params["stdinEncoding"] = json!("base64");
                }
            }
            return run_to_end(c, &params, sandbox).await;
        }
        Err(e) => return Err(Failure::from(e).in_method("exec/start")),
    };
    let exec_id = started["execId"].as_str().unwrap_or_default().to_owned();
    let named = started["sandbox"].as_str().map(str::to_owned);
    let sandbox = named.as_deref().unwrap_or(sandbox);
    if let (Some(cell), Some(id)) = (told, &named) {
        *cell.borrow_mut() = Some(id.clone());
    }
    let forward_stdin = !std::io::stdin().is_terminal();
    let mut stdin = forward_stdin.then(crate::term::stdin_chunks);
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    if !forward_stdin {
        // Nothing will come: close the command's stdin so it never waits for input.
        write_stdin(c, &exec_id, &[], true).await?;
    }
    // Ctrl-C interrupts the remote command (SIGINT to its tree); a second one leaves.
    let mut interrupted = false;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(AbxError::internal)?;
    loop {
        tokio::select! {
            sig = ending.recv() => {
                call_before_exit(c, "exec/kill", &json!({"execId": exec_id, "signal": "KILL"})).await;
                return Ok((128 + sig) as u8);
            }
            _ = sigint.recv() => {
                if interrupted {
                    return Ok(130);
                }
                interrupted = true;
                let _ = c.send_request("exec/kill", Some(&json!({"execId": exec_id, "signal": "INT"}))).await;
            }
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
                    "exec/output" => {
                        let bytes = decode(&p);
                        if p["stream"] == "stderr" {
                            let _ = err.write_all(&bytes).await;
                            let _ = err.flush().await;
                        } else if out.write_all(&bytes).await.and(out.flush().await).is_err() {
                            // Our reader went away: stop the command, as a pipe would.
                            let _ = c.send_request("exec/kill", Some(&json!({"execId": exec_id}))).await;
                            return Ok(141);
                        }
                    }
                    "exec/exit" => {
                        let _ = out.flush().await;
                        if p["timedOut"] == true {
                            eprintln!("[E3001] Command timed out.");
                        }
                        return exit_code(&p, sandbox);
                    }
                    _ => {}
                }
            }
            chunk = async { stdin.as_mut().expect("stdin").recv().await }, if stdin.is_some() => {
                match chunk.flatten() {
                    Some(data) => write_stdin(c, &exec_id, &data, false).await?,
                    None => {
                        stdin = None;
                        write_stdin(c, &exec_id, &[], true).await?;
                    }
                }
            }
        }
    }
}

/// The exit code of an `exec/exit` (or an `exec/run` result): `exitCode`, else 128 + the
/// signal. A stream that ended with an error (a plugin's crash notice: `exitCode: null` and
/// `error`), an exit code outside 0..=255 (EPP/1 allows no other) or none at all is a
/// [`Failure`] naming what went wrong, never a success: `sandbox` (as the user gave it)
/// names the provider when it is `provider:id`.
pub fn exit_code(p: &Value, sandbox: &str) -> Result<u8, Failure> {
    if let Some(e) = p.get("error").filter(|e| !e.is_null()) {
        return Err(stream_error(e, sandbox));
    }
    let bad = |detail: String| -> Failure {
        let provider = sandbox.split_once(':').map_or("", |(p, _)| p);
        let mut e = AbxError::new(
            ErrorCode::BadPluginReply,
            &[("provider", provider), ("detail", &detail)],
        );
        if provider.is_empty() {
            e.message =
                format!("The provider of sandbox '{sandbox}' sent an invalid reply: {detail}");
        }
        e.into()
    };
    match &p["exitCode"] {
        Value::Null => {}
        Value::Number(n) => {
            return match n.as_i64().filter(|c| (0..=255).contains(c)) {
                Some(c) => Ok(c as u8),
                None => Err(bad(format!(
                    "exit code {n} for the command (an exit code is 0 to 255; 128 + N for signal N)"
                ))),
            };
        }
        other => {
            return Err(bad(format!(
                "exit code {other} for the command (an exit code is 0 to 255; 128 + N for signal N)"
            )))
        }
    }
    if let Some(sig) = p["signal"].as_str().filter(|s| !s.is_empty()) {
        return Ok(signal_number(sig).map_or(1, |n| (128 + n).clamp(0, 255) as u8));
    }
    if p["timedOut"] == true {
        return Ok(137);
    }
    Err(bad(format!(
        "no exit code and no signal for the command (its exit: {p})"
    )))
}

/// The `error` of an `exec/exit`: an error object (`{code, message, data: {abx,
/// suggestion}}`), an E-code, or a plugin's crash notice (`provider 'X' crashed`).
fn stream_error(e: &Value, sandbox: &str) -> Failure {
    if let Ok(rpc) = serde_json::from_value::<RpcError>(e.clone()) {
        return rpc.into();
    }
    let text = crate::output::text(e);
    if let Some(code) = ErrorCode::from_abx(text.trim()) {
        return AbxError::new(code, &[("sandbox", sandbox)]).into();
    }
    if text.contains("crashed") {
        let provider = text.split('\'').nth(1).unwrap_or(sandbox);
        return AbxError::new(
            ErrorCode::PluginCrashed,
            &[
                ("provider", provider),
                ("detail", "the command's stream ended without its exit"),
            ],
        )
        .into();
    }
    AbxError::internal(format!("the command's stream ended with an error: {text}")).into()
}

fn signal_number(name: &str) -> Option<i32> {
    if let Ok(n) = name.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    Some(match name.trim_start_matches("SIG") {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ILL" => 4,
        "TRAP" => 5,
        "ABRT" => 6,
        "BUS" => 7,
        "FPE" => 8,
        "KILL" => 9,
        "USR1" => 10,
        "SEGV" => 11,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "XCPU" => 24,
        "XFSZ" => 25,
        _ => return None,
    })
}

pub async fn write_stdin(
    c: &mut Client,
    exec_id: &str,
    data: &[u8],
    eof: bool,
) -> Result<(), Failure> {
    // Fire and forget: replies are read (and ignored) by the stream loop.
    let params = json!({
        "execId": exec_id,
        "data": abx_protocol::b64::encode(data),
        "encoding": "base64",
        "eof": eof,
    });
    c.send_request("exec/write", Some(&params)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn joins_words_for_the_shell() {
        let s =
            |v: &[&str]| super::shell_join(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(s(&["echo hi; exit 3"]), "echo hi; exit 3");
        assert_eq!(
            s(&["python3", "-c", "print('x y')"]),
            "python3 -c 'print('\\''x y'\\'')'"
        );
        assert_eq!(s(&["ls", ""]), "ls ''");
    }

    /// Issue 45, item 3: a provider's bad exit is never a success.
    #[test]
    fn a_bad_exit_is_an_error_never_a_success() {
        use super::exit_code;
        use serde_json::json;
        assert_eq!(exit_code(&json!({"exitCode": 0}), "p:s").unwrap(), 0);
        assert_eq!(exit_code(&json!({"exitCode": 255}), "p:s").unwrap(), 255);
        assert_eq!(
            exit_code(&json!({"exitCode": null, "signal": "SIGKILL"}), "s").unwrap(),
            137
        );
        assert_eq!(
            exit_code(&json!({"exitCode": null, "signal": "USR1"}), "s").unwrap(),
            138
        );
        for bad in [
            json!({"exitCode": -1}),
            json!({"exitCode": 256}),
            json!({"exitCode": null}),
            json!({"exitCode": 1.5}),
            json!({"exitCode": "0"}),
            json!({}),
        ] {
            let f = exit_code(&bad, "bad-exit:s1").unwrap_err();
            assert_eq!(f.abx, "E8009", "{bad}");
            assert_eq!(f.exit, 1, "{bad}");
            assert!(f.message.contains("Provider 'bad-exit'"), "{}", f.message);
        }
        let f = exit_code(&json!({"exitCode": -1}), "s1").unwrap_err();
        assert!(
            f.message.contains("-1") && f.message.contains("sandbox 's1'"),
            "{}",
            f.message
        );
        // A stream that ended with an error: the plugin's crash notice, an error object.
        let f = exit_code(
            &json!({"exitCode": null, "timedOut": false, "error": "provider 'bad-exit' crashed"}),
            "s1",
        )
        .unwrap_err();
        assert_eq!((f.abx.as_str(), f.exit), ("E8007", 1));
        assert!(
            f.message.starts_with("Provider 'bad-exit' crashed"),
            "{}",
            f.message
        );
        assert!(f
            .suggestion
            .unwrap()
            .contains("abx provider doctor bad-exit"));
        let e = json!({"code": 3001, "message": "Command timed out.",
            "data": {"abx": "E3001", "suggestion": "Raise --timeout."}});
        let f = exit_code(&json!({"exitCode": null, "error": e}), "s1").unwrap_err();
        assert_eq!(
            (f.abx.as_str(), f.suggestion.as_deref()),
            ("E3001", Some("Raise --timeout."))
        );
    }
}
