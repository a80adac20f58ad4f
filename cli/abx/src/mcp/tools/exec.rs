//! `exec`: a shell command through `exec/start` (progress notifications as its output
//! comes, cancellation by `exec/kill`) or `exec/run`; the output kept for the result is a
//! head and a tail per stream ([`Capture`]).

use super::cx::{args, fail, fail_abx, ok, Cx};
use super::types::*;
use abx_client::client::CallError;
use abx_protocol::api::{self, to_params};
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Value};

/// Output kept for the result, per stream: the first [`HEAD`] bytes and the last [`TAIL`].
pub(super) const HEAD: usize = 64 * 1024;
pub(super) const TAIL: usize = 448 * 1024;

#[derive(Default)]
pub(super) struct Capture {
    pub(super) head: String,
    /// Set once anything went to `tail`: the head takes no more.
    pub(super) head_closed: bool,
    pub(super) tail: String,
    pub(super) omitted: u64,
}

pub(super) fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Capture {
    pub(super) fn push(&mut self, mut s: &str) {
        if !self.head_closed {
            let n = floor_char(s, (HEAD - self.head.len()).min(s.len()));
            self.head.push_str(&s[..n]);
            s = &s[n..];
            if s.is_empty() {
                return;
            }
            self.head_closed = true;
        }
        self.tail.push_str(s);
        if self.tail.len() > TAIL {
            let cut = self.tail.len() - TAIL;
            let mut cut_at = cut;
            while !self.tail.is_char_boundary(cut_at) {
                cut_at += 1;
            }
            self.tail.drain(..cut_at);
            self.omitted += cut_at as u64;
        }
    }

    pub(super) fn text(&self) -> String {
        if self.omitted == 0 {
            format!("{}{}", self.head, self.tail)
        } else {
            format!(
                "{}\n[... {} bytes left out ...]\n{}",
                self.head, self.omitted, self.tail
            )
        }
    }
}

pub(super) async fn exec(cx: &Cx<'_>, a: Value) -> Option<Value> {
    let a: ExecArgs = match args("exec", a) {
        Ok(a) => a,
        Err(e) => return Some(e),
    };
    let conn = match cx.mux.conn().await {
        Ok(c) => c,
        Err(e) => return Some(fail_abx(&e)),
    };
    let p = to_params(&api::ExecStartParams::from(a.clone()));
    // Not raced with the cancel token: an exec that started must be known to be killed.
    let (started, mut events) = match conn.start_stream("exec/start", p.clone()).await {
        Ok(r) => r,
        Err(CallError::Rpc(e)) if crate::stream::lacks_stream(&e) => {
            // No `exec.stream`: `exec/run` does it, with the output at the end (said once
            // on stderr). Dropping the call on cancel sends `$/cancelRequest`, which kills it.
            crate::stream::note_no_stream(&e);
            let r = tokio::select! {
                r = conn.call("exec/run", p) => r,
                _ = cx.cancel.cancelled() => return None,
            };
            return Some(match r {
                Ok(r) => exec_result(
                    cx,
                    a.timeout,
                    run_as_exit(&r),
                    (run_capture(&r, "stdout"), run_capture(&r, "stderr")),
                    r["truncated"] == true,
                ),
                Err(e) => fail(&e),
            });
        }
        Err(e) => return Some(fail(&e)),
    };
    let exec_id = started["execId"].as_str().unwrap_or_default().to_owned();
    let (mut out, mut err) = (Capture::default(), Capture::default());
    let mut progressed: u64 = 0;
    let exit = loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) if ev.method == "exec/output" => {
                    let p = &ev.params;
                    let data = p["data"].as_str().unwrap_or_default();
                    let text = if p["encoding"] == "base64" {
                        let bytes = abx_protocol::b64::decode(data)
                            .unwrap_or_default();
                        String::from_utf8_lossy(&bytes).into_owned()
                    } else {
                        data.to_owned()
                    };
                    if p["stream"] == "stderr" {
                        err.push(&text);
                    } else {
                        out.push(&text);
                    }
                    if let (Some(token), false) = (&cx.progress, text.is_empty()) {
                        progressed += text.len() as u64;
                        cx.out.notify(
                            "notifications/progress",
                            json!({"progressToken": token, "progress": progressed, "message": text}),
                        );
                    }
                }
                Some(ev) if ev.method == "exec/exit" => break ev.params,
                Some(_) => {}
                None => {
                    return Some(fail_abx(&AbxError::new(
                        ErrorCode::BrokerUnreachable,
                        &[
                            ("detail", "the connection to the broker broke while the command ran"),
                            ("log", "the broker log"),
                        ],
                    )))
                }
            },
            _ = cx.cancel.cancelled() => {
                let kill = api::ExecIdParams { exec_id };
                let _ = conn.call("exec/kill", to_params(&kill)).await;
                return None;
            }
        }
    };
    Some(exec_result(cx, a.timeout, exit, (out, err), false))
}

/// An `exec/run` result's stream `k` as a [`Capture`].
pub(super) fn run_capture(r: &Value, k: &str) -> Capture {
    let data = r[k].as_str().unwrap_or_default();
    let mut c = Capture::default();
    if r["encoding"] == "base64" {
        let bytes = abx_protocol::b64::decode(data).unwrap_or_default();
        c.push(&String::from_utf8_lossy(&bytes));
    } else {
        c.push(data);
    }
    c
}

/// An `exec/run` result in the shape of an `exec/exit`.
pub(super) fn run_as_exit(r: &Value) -> Value {
    let mut e = json!({"exitCode": r.get("exitCode").cloned().unwrap_or(Value::Null), "timedOut": r["timedOut"]});
    if let Some(s) = r.get("signal") {
        e["signal"] = s.clone();
    }
    e
}

/// The tool result of an exec: exit line, stdout, stderr.
pub(super) fn exec_result(
    cx: &Cx<'_>,
    timeout: Option<f64>,
    exit: Value,
    (out, err): (Capture, Capture),
    truncated: bool,
) -> Value {
    let exit_code = exit.get("exitCode").cloned().unwrap_or(Value::Null);
    let timed_out = exit["timedOut"].as_bool().unwrap_or(false);
    let signal = exit["signal"].as_str().map(str::to_owned);
    let truncated = truncated || out.omitted > 0 || err.omitted > 0;
    let (stdout, stderr) = (out.text(), err.text());
    let mut text = match (&exit_code, timed_out) {
        (_, true) => format!(
            "Timed out after {}s and was killed (exit code {exit_code}).",
            timeout.unwrap_or(0.0)
        ),
        (Value::Null, _) => "Exit code: unknown.".to_owned(),
        (c, _) => format!("Exit code: {c}"),
    };
    if let Some(s) = &signal {
        text.push_str(&format!(" (signal {s})"));
    }
    text.push_str(&format!("\n--- stdout\n{stdout}"));
    if !stdout.is_empty() && !stdout.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!("--- stderr\n{stderr}"));
    let outcome = ExecOutcome {
        exit_code: exit_code.as_i64(),
        stdout,
        stderr,
        timed_out,
        signal,
        truncated,
    };
    ok(cx, text, json!(outcome))
}
