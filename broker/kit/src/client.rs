//! The kit's client: a real JSON-RPC connection to the broker (line-framed), through a
//! [`Connector`] the caller provides.
//!
//! Each [`Client`] is one `tokio::io::duplex` pipe whose other end is served by the broker's
//! connection loop (`abx_core::conn::serve`, wired by the daemon through the [`Connector`]:
//! the kit does not link the core), exactly like a socket client: framing, routing, gating, the
//! provider and the outbound queue all run as they do for any client. Requests are matched
//! to replies by id; notifications are dispatched by their `execId` / `watchId` to a
//! per-stream channel (created on first use by either side, so nothing is lost between a
//! reply and the subscription). Every message read gets a sequence number, so a test can
//! check that a reply came before the first notification of its stream.

use abx_protocol::{message, Id};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// A notification as the client received it.
#[derive(Clone, Debug)]
pub struct Note {
    /// Position among every message this connection read.
    pub seq: u64,
    /// `exec/output`, `exec/exit`, `files/changed`, ...
    pub method: String,
    /// Its params.
    pub params: Value,
}

/// An error reply.
#[derive(Clone, Debug)]
pub struct RpcErr {
    /// `error.code`.
    pub code: i64,
    /// `error.data.abx` (empty when absent).
    pub abx: String,
    /// `error.message`.
    pub message: String,
    /// The whole error object.
    pub raw: Value,
}

impl RpcErr {
    fn closed(method: &str) -> RpcErr {
        RpcErr {
            code: 0,
            abx: String::new(),
            message: format!("the connection closed before '{method}' was answered"),
            raw: Value::Null,
        }
    }

    /// A result that does not match its schema (a failure of the test, not an error reply).
    fn shape(message: String) -> RpcErr {
        RpcErr {
            code: 0,
            abx: String::new(),
            message,
            raw: Value::Null,
        }
    }

    /// True when the error carries one of these E-codes (`"E4001"`).
    pub fn is(&self, codes: &[&str]) -> bool {
        codes.contains(&self.abx.as_str())
    }
}

impl fmt::Display for RpcErr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.abx.is_empty() {
            write!(f, "[{}] {}", self.code, self.message)
        } else {
            write!(f, "[{}] {}", self.abx, self.message)
        }
    }
}

struct Slot {
    tx: mpsc::UnboundedSender<Note>,
    rx: Option<mpsc::UnboundedReceiver<Note>>,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<HashMap<i64, oneshot::Sender<(u64, Value)>>>,
    streams: Mutex<HashMap<String, Slot>>,
    closed: AtomicBool,
}

impl Shared {
    fn slot<'a>(map: &'a mut HashMap<String, Slot>, key: &str) -> &'a mut Slot {
        map.entry(key.to_owned()).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            Slot { tx, rx: Some(rx) }
        })
    }
}

/// What the current test is waiting for (shown when it times out).
pub type Waiting = Arc<Mutex<String>>;

/// The two halves of one connection to the broker.
pub type Halves = (
    Box<dyn AsyncRead + Send + Unpin>,
    Box<dyn AsyncWrite + Send + Unpin>,
);

/// How the kit reaches the broker: a new connection each call (the daemon serves an
/// in-memory pipe with its connection loop; anything speaking line-framed JSON-RPC does).
pub trait Connector: Send + Sync {
    /// Open a connection.
    fn connect(&self) -> Halves;
}

/// One connection to the broker.
pub struct Client {
    shared: Arc<Shared>,
    writer: tokio::sync::Mutex<Box<dyn AsyncWrite + Send + Unpin>>,
    reader: tokio::task::JoinHandle<()>,
    next_id: AtomicI64,
    waiting: Waiting,
}

impl Drop for Client {
    fn drop(&mut self) {
        // Dropping the read half (with the task) and the write half closes the pipe: the
        // broker sees the client go away.
        self.reader.abort();
    }
}

impl Client {
    /// Open a connection through `to`.
    pub fn connect(to: &dyn Connector, waiting: Waiting) -> Client {
        let (r, w) = to.connect();
        let shared = Arc::new(Shared::default());
        let reader = tokio::spawn(read_loop(
            BufReader::with_capacity(256 * 1024, r),
            shared.clone(),
        ));
        Client {
            shared,
            writer: tokio::sync::Mutex::new(w),
            reader,
            next_id: AtomicI64::new(1),
            waiting,
        }
    }

    fn wait_for(&self, what: impl Into<String>) {
        *self.waiting.lock().expect("waiting") = what.into();
    }

    /// Write one message body (from `abx_protocol::message`'s encoders) as a line.
    async fn write(&self, mut line: Vec<u8>) -> bool {
        line.push(b'\n');
        let mut w = self.writer.lock().await;
        w.write_all(&line).await.is_ok() && w.flush().await.is_ok()
    }

    /// Send a request; returns its id and where its reply (with its sequence number) lands.
    pub async fn send(
        &self,
        method: &str,
        params: Value,
    ) -> (i64, oneshot::Receiver<(u64, Value)>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.shared.pending.lock().expect("pending").insert(id, tx);
        // The reader clears `pending` after setting `closed`: one of the two sees the other.
        if self.shared.closed.load(Ordering::SeqCst) {
            self.shared.pending.lock().expect("pending").remove(&id);
        }
        self.wait_for(format!("the reply to {method}"));
        let msg = message::encode_request(&Id::Num(id), method, Some(&params));
        if !self.write(msg).await {
            self.shared.pending.lock().expect("pending").remove(&id);
        }
        (id, rx)
    }

    /// Send a notification.
    pub async fn notify(&self, method: &str, params: Value) {
        self.write(message::encode_notification(method, Some(&params)))
            .await;
    }

    /// `$/cancelRequest` for a request id.
    pub async fn cancel(&self, id: i64) {
        self.notify("$/cancelRequest", json!({ "id": id })).await;
    }

    /// A request and its outcome, with the sequence number of the reply.
    pub async fn call_seq(&self, method: &str, params: Value) -> (u64, Result<Value, RpcErr>) {
        let (_, rx) = self.send(method, params).await;
        match rx.await {
            // Every result is held to its schema (a wrong shape fails the calling test).
            Ok((seq, v)) => match outcome(v) {
                Ok(r) => match crate::schema::check_result(method, &r) {
                    Ok(()) => (seq, Ok(r)),
                    Err(e) => (seq, Err(RpcErr::shape(e))),
                },
                Err(e) => (seq, Err(e)),
            },
            Err(_) => (0, Err(RpcErr::closed(method))),
        }
    }

    /// A request and its outcome.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, RpcErr> {
        self.call_seq(method, params).await.1
    }

    /// A request expected to succeed; the failure text names the method.
    pub async fn ok(&self, method: &str, params: Value) -> Result<Value, String> {
        self.call(method, params).await.map_err(|e| {
            if e.code == 0 && e.abx.is_empty() {
                // Not an error reply: a closed connection or a result of the wrong shape.
                e.message
            } else {
                format!("{method} failed: {e}")
            }
        })
    }

    /// A request expected to fail; returns its error.
    pub async fn err(&self, method: &str, params: Value) -> Result<RpcErr, String> {
        match self.call(method, params).await {
            Ok(v) => Err(format!(
                "{method} unexpectedly succeeded: {}",
                short(&v.to_string())
            )),
            Err(e) if e.code == 0 && e.abx.is_empty() => Err(e.message),
            Err(e) => Ok(e),
        }
    }

    /// A request expected to fail with one of `codes` (E-codes); `what` describes the call.
    pub async fn expect_code(
        &self,
        method: &str,
        params: Value,
        codes: &[&str],
        what: &str,
    ) -> Result<RpcErr, String> {
        let e = self
            .err(method, params)
            .await
            .map_err(|m| format!("{what}: {m}; expected {}", codes.join(" or ")))?;
        if !e.is(codes) {
            return Err(format!(
                "{what} answered {e} instead of {}",
                codes.join(" or ")
            ));
        }
        Ok(e)
    }

    /// The notifications of one exec or watch id, from the first one received.
    pub fn stream(&self, key: &str) -> Stream {
        let mut map = self.shared.streams.lock().expect("streams");
        let slot = Shared::slot(&mut map, key);
        let rx = match slot.rx.take() {
            Some(rx) => rx,
            None => {
                // Subscribed twice: start over with a fresh channel.
                let (tx, rx) = mpsc::unbounded_channel();
                slot.tx = tx;
                rx
            }
        };
        Stream {
            key: key.to_owned(),
            rx,
            waiting: self.waiting.clone(),
        }
    }
}

fn outcome(v: Value) -> Result<Value, RpcErr> {
    match v.get("error") {
        Some(e) => Err(RpcErr {
            code: e["code"].as_i64().unwrap_or(0),
            abx: e["data"]["abx"].as_str().unwrap_or_default().to_owned(),
            message: e["message"].as_str().unwrap_or_default().to_owned(),
            raw: e.clone(),
        }),
        None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
    }
}

async fn read_loop(mut r: BufReader<Box<dyn AsyncRead + Send + Unpin>>, sh: Arc<Shared>) {
    let mut line = Vec::with_capacity(64 * 1024);
    let mut seq = 0u64;
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        seq += 1;
        let Ok(mut v) = serde_json::from_slice::<Value>(&line) else {
            tracing::warn!("kit client: a line from the broker is not JSON");
            continue;
        };
        if let Some(method) = v.get("method").and_then(Value::as_str).map(str::to_owned) {
            let params = v.get_mut("params").map(Value::take).unwrap_or(Value::Null);
            let key = params["execId"]
                .as_str()
                .or(params["watchId"].as_str())
                .or(params["runId"].as_str())
                .unwrap_or("")
                .to_owned();
            let mut map = sh.streams.lock().expect("streams");
            let _ = Shared::slot(&mut map, &key).tx.send(Note {
                seq,
                method,
                params,
            });
        } else if let Some(id) = v.get("id").and_then(Value::as_i64) {
            if let Some(tx) = sh.pending.lock().expect("pending").remove(&id) {
                let _ = tx.send((seq, v));
            }
        }
    }
    sh.closed.store(true, Ordering::SeqCst);
    sh.pending.lock().expect("pending").clear();
    sh.streams.lock().expect("streams").clear();
}

/// The notifications of one exec or watch.
pub struct Stream {
    key: String,
    rx: mpsc::UnboundedReceiver<Note>,
    waiting: Waiting,
}

/// What an exec stream delivered.
#[derive(Default, Debug)]
pub struct Output {
    /// stdout bytes.
    pub stdout: Vec<u8>,
    /// stderr bytes.
    pub stderr: Vec<u8>,
    /// pty bytes.
    pub pty: Vec<u8>,
    /// The last exec/exit params.
    pub exit: Option<Value>,
    /// How many exec/exit arrived.
    pub exits: usize,
    /// Sequence number of the first notification.
    pub first_seq: Option<u64>,
    /// Stream names of the output notifications, in order.
    pub streams: Vec<String>,
    /// Output notifications that came after an exec/exit.
    pub after_exit: usize,
}

impl Output {
    /// stdout as text (lossy).
    pub fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// stderr as text (lossy).
    pub fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// pty output as text (lossy).
    pub fn tty(&self) -> String {
        String::from_utf8_lossy(&self.pty).into_owned()
    }
    /// The exit code of the exec/exit, when there was one.
    pub fn code(&self) -> Option<i64> {
        self.exit.as_ref().and_then(|e| e["exitCode"].as_i64())
    }

    fn take(&mut self, n: &Note) {
        self.first_seq.get_or_insert(n.seq);
        match n.method.as_str() {
            "exec/output" => {
                if self.exits > 0 {
                    self.after_exit += 1;
                }
                let bytes = decode(&n.params["data"], &n.params["encoding"]);
                let stream = n.params["stream"].as_str().unwrap_or("").to_owned();
                match stream.as_str() {
                    "stderr" => self.stderr.extend(bytes),
                    "pty" => self.pty.extend(bytes),
                    _ => self.stdout.extend(bytes),
                }
                self.streams.push(stream);
            }
            "exec/exit" => {
                self.exits += 1;
                self.exit = Some(n.params.clone());
            }
            _ => {}
        }
    }
}

/// Decode a `data` field with its `encoding`.
pub fn decode(data: &Value, encoding: &Value) -> Vec<u8> {
    let s = data.as_str().unwrap_or_default();
    if encoding == "base64" {
        abx_protocol::b64::decode(s).unwrap_or_else(|_| s.as_bytes().to_vec())
    } else {
        s.as_bytes().to_vec()
    }
}

impl Stream {
    /// The next notification within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<Note> {
        tokio::time::timeout(wait, self.rx.recv())
            .await
            .ok()
            .flatten()
    }

    /// Read exec notifications into `out` until `done(out)` holds or the exec exits.
    pub async fn read_until(
        &mut self,
        out: &mut Output,
        wait: Duration,
        what: &str,
        done: impl Fn(&Output) -> bool,
    ) -> Result<(), String> {
        *self.waiting.lock().expect("waiting") = format!("{what} (exec {})", self.key);
        let deadline = tokio::time::Instant::now() + wait;
        while !done(out) {
            if out.exits > 0 {
                return Err(format!(
                    "the exec exited before {what} (stdout {:?}, stderr {:?}, pty {:?})",
                    short(&out.out()),
                    short(&out.err()),
                    short(&out.tty())
                ));
            }
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(n)) => out.take(&n),
                Ok(None) => return Err(format!("the connection closed before {what}")),
                Err(_) => {
                    return Err(format!(
                        "no {what} within {} s (stdout so far {:?}, stderr {:?}, pty {:?})",
                        wait.as_secs(),
                        short(&out.out()),
                        short(&out.err()),
                        short(&out.tty())
                    ))
                }
            }
        }
        Ok(())
    }

    /// Read the exec to its exec/exit, then make sure nothing more arrives for `quiet`.
    pub async fn finish(&mut self, wait: Duration, quiet: Duration) -> Result<Output, String> {
        let mut out = Output::default();
        self.finish_into(&mut out, wait, quiet).await?;
        Ok(out)
    }

    /// [`Stream::finish`] continuing an [`Output`].
    pub async fn finish_into(
        &mut self,
        out: &mut Output,
        wait: Duration,
        quiet: Duration,
    ) -> Result<(), String> {
        if out.exits == 0 {
            *self.waiting.lock().expect("waiting") = format!("exec/exit of {}", self.key);
            let deadline = tokio::time::Instant::now() + wait;
            while out.exits == 0 {
                match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                    Ok(Some(n)) => out.take(&n),
                    Ok(None) => return Err("the connection closed before exec/exit".into()),
                    Err(_) => {
                        return Err(format!(
                            "no exec/exit within {} s (stdout so far {:?}, stderr {:?})",
                            wait.as_secs(),
                            short(&out.out()),
                            short(&out.err())
                        ))
                    }
                }
            }
        }
        *self.waiting.lock().expect("waiting") = format!("silence after exec/exit of {}", self.key);
        let deadline = tokio::time::Instant::now() + quiet;
        while let Ok(Some(n)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            out.take(&n);
        }
        Ok(())
    }
}

/// At most 200 characters of a text, for details.
pub fn short(s: &str) -> String {
    if s.chars().count() <= 200 {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(200).collect();
        t.push('…');
        t
    }
}
