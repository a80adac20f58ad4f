//! `abx mcp`: a Model Context Protocol server on stdio, backed by the daemon.
//!
//! Framing: one JSON-RPC message per line on stdin/stdout; nothing but protocol messages is
//! ever written to stdout (diagnostics go to stderr).
//!
//! Protocol eras, both served by the same process (a "dual-era" server):
//! - **Handshake era** (2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25): `initialize` answers
//!   the client's version when we speak it, else the newest one we do (never a version we do
//!   not speak: rmcp asks for 2026-07-28 in `initialize` and gets 2025-11-25), then
//!   `notifications/initialized`, `ping`, `tools/list`, `tools/call`.
//! - **Stateless era** (2026-07-28): no handshake; every request carries
//!   `_meta["io.modelcontextprotocol/protocolVersion"]` (and client capabilities/info).
//!   `server/discover` advertises versions and capabilities; every result carries
//!   `resultType: "complete"` and `_meta["io.modelcontextprotocol/serverInfo"]`; list
//!   results carry `ttlMs` and `cacheScope`. A request naming a version we do not speak gets
//!   -32022 with the supported list.
//!
//! Requests are served concurrently (each in its own task): a long `exec` never blocks
//! `tools/list` or another call. `notifications/cancelled {requestId}` cancels the call (an
//! exec is killed) and, per the spec, no response is sent for it. Unknown methods get -32601
//! at once. Tool failures are results with `isError: true` and the E-code text, never
//! protocol errors. The daemon is connected (and started) on the first tool call.

mod session;
mod tools;

pub use session::{Era, Out};

use abx_client::mux::Mux;
use abx_home::Paths;
use abx_protocol::codec::{Frame, FrameCodec, Framing};
use abx_protocol::{message, RpcError, DEFAULT_MAX_MESSAGE_SIZE};
use futures::StreamExt;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

/// Revisions with the `initialize` handshake, oldest first.
pub const HANDSHAKE_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The stateless revision (per-request `_meta`, `server/discover`).
pub const MODERN_VERSION: &str = "2026-07-28";
/// What `initialize` answers when the client asks for a version we do not speak.
pub const LATEST_HANDSHAKE: &str = "2025-11-25";

/// `_meta` key of the per-request protocol version (2026-07-28).
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key of the client identity on requests (2026-07-28).
const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";

/// The name abx mcp gives the daemon (`sandbox/log` shows it): `<MCP client> via abx mcp`
/// once the MCP client said its name (`initialize` `clientInfo`, or a request's `_meta`),
/// `abx mcp` before. Said before the daemon connection is made (the first tool call).
fn name_client(info: &Value) {
    if let Some(name) = info
        .get("name")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        let name: String = name.chars().take(128).collect();
        abx_client::client::set_client_name(&format!("{name} via abx mcp"));
    }
}

/// `_meta` key of the server identity on results (2026-07-28).
const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// JSON-RPC and MCP error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const UNSUPPORTED_VERSION: i64 = -32022;

const INSTRUCTIONS: &str = "abx runs code in sandboxes. Create one with sandbox_create and pass \
its id as the `sandbox` argument of every other tool; kill it with sandbox_kill when done. A \
sandbox lives `timeout` seconds (default 300): extend it with sandbox_set_timeout. Run commands \
with exec (a shell string, run with sh -c; output streams as progress). File paths are under \
/workspace (relative paths are taken from there) or /tmp. Failures come back as error results \
with an E-code and a suggestion.";

/// Every version this server speaks, newest first (for `server/discover` and -32022).
fn supported_versions() -> Vec<&'static str> {
    let mut v = vec![MODERN_VERSION];
    v.extend(HANDSHAKE_VERSIONS.iter().rev());
    v
}

/// The answer `initialize` gives to a requested version.
pub fn negotiate(requested: Option<&str>) -> &'static str {
    match requested {
        Some(r) => HANDSHAKE_VERSIONS
            .iter()
            .find(|v| **v == r)
            .copied()
            .unwrap_or(LATEST_HANDSHAKE),
        None => LATEST_HANDSHAKE,
    }
}

/// A JSON-RPC error to answer with.
#[derive(Debug)]
pub struct RpcErr {
    code: i64,
    message: String,
    data: Option<Value>,
}

impl RpcErr {
    fn new(code: i64, message: impl Into<String>) -> Self {
        RpcErr {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The wire form (the same `{code, message, data?}` object as the broker's errors).
    fn to_rpc(&self) -> RpcError {
        RpcError {
            code: self.code,
            message: self.message.clone(),
            data: self.data.clone(),
        }
    }
}

/// What a request handler ends with.
enum Outcome {
    Result(Value),
    Error(RpcErr),
    /// Cancelled by the client: nothing is sent.
    Cancelled,
}

struct Server {
    mux: Mux,
    out: Out,
    /// In-flight requests by id (JSON text of the id), for `notifications/cancelled`.
    inflight: Mutex<HashMap<String, CancellationToken>>,
    /// The version `initialize` settled on (handshake era).
    negotiated: Mutex<Option<&'static str>>,
}

/// Run the server until stdin closes. Exit code 0, or 1 when stdio itself fails.
pub fn run(paths: &Paths) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("abx mcp: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // One thread is plenty for this I/O-bound server; a LocalSet because the daemon client's
    // connect future is not `Send`.
    let code = rt.block_on(tokio::task::LocalSet::new().run_until(serve(paths)));
    // Background tasks (the daemon reader) must not keep the process alive.
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

async fn serve(paths: &Paths) -> ExitCode {
    abx_client::client::set_client_name("abx mcp");
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = rx.recv().await {
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                eprintln!("abx mcp: stdout closed");
                break;
            }
        }
    });
    let server = Arc::new(Server {
        mux: Mux::new(paths),
        out: Out(tx),
        inflight: Mutex::new(HashMap::new()),
        negotiated: Mutex::new(None),
    });
    let mut tasks = JoinSet::new();
    let mut input = FramedRead::new(
        tokio::io::stdin(),
        FrameCodec::with_framing(Framing::Line, DEFAULT_MAX_MESSAGE_SIZE),
    );
    let mut code = ExitCode::SUCCESS;
    let mut stop = Signals::new();
    let mut grace = Duration::from_secs(1);
    loop {
        let frame = tokio::select! {
            f = input.next() => match f {
                Some(f) => f,
                None => break,
            },
            _ = stop.recv() => {
                grace = Duration::ZERO;
                break;
            }
        };
        while tasks.try_join_next().is_some() {}
        match frame {
            Ok(Frame::Message(bytes)) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(Value::Array(items)) if !items.is_empty() => {
                    let s = server.clone();
                    let mut futs = Vec::new();
                    for item in items {
                        if let Some(f) = s.clone().accept(item) {
                            futs.push(f);
                        }
                    }
                    if !futs.is_empty() {
                        tasks.spawn_local(async move {
                            let replies: Vec<Vec<u8>> = futures::future::join_all(futs)
                                .await
                                .into_iter()
                                .flatten()
                                .collect();
                            if !replies.is_empty() {
                                s.out.send(message::encode_batch(&replies));
                            }
                        });
                    }
                }
                Ok(v) => {
                    if let Some(f) = server.clone().accept(v) {
                        let s = server.clone();
                        tasks.spawn_local(async move {
                            if let Some(reply) = f.await {
                                s.out.send(reply);
                            }
                        });
                    }
                }
                Err(e) => server.out.send(error_reply(
                    Value::Null,
                    &RpcErr::new(PARSE_ERROR, format!("Parse error: {e}")),
                )),
            },
            Ok(Frame::TooLarge { .. }) => server.out.send(error_reply(
                Value::Null,
                &RpcErr::new(
                    INVALID_REQUEST,
                    format!("Message too large: the limit is {DEFAULT_MAX_MESSAGE_SIZE} bytes."),
                ),
            )),
            Err(e) => {
                eprintln!("abx mcp: reading stdin failed: {e}");
                code = ExitCode::from(1);
                break;
            }
        }
    }
    // The client closed our stdin (the stdio way to stop a server): calls that finish
    // within a short grace are answered; what still runs then is cancelled (an exec is
    // killed, never left behind); then flush and leave.
    let _ = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    for t in server.inflight.lock().expect("inflight").values() {
        t.cancel();
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    drop(server);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    code
}

/// SIGTERM, SIGINT and SIGHUP: stop like at the end of stdin, without the grace.
struct Signals(Vec<tokio::signal::unix::Signal>);

impl Signals {
    fn new() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        let kinds = [
            SignalKind::terminate(),
            SignalKind::interrupt(),
            SignalKind::hangup(),
        ];
        Signals(kinds.into_iter().filter_map(|k| signal(k).ok()).collect())
    }

    async fn recv(&mut self) {
        if self.0.is_empty() {
            return std::future::pending().await;
        }
        let all = self.0.iter_mut().map(|s| Box::pin(s.recv()));
        futures::future::select_all(all).await;
    }
}

/// The encoded reply to a request (`None`: nothing is sent).
type ReplyFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Vec<u8>>>>>;

fn error_reply(id: Value, e: &RpcErr) -> Vec<u8> {
    message::encode_response_any::<_, ()>(&id, Err(&e.to_rpc()))
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

impl Server {
    /// Take one message: notifications are handled at once (`None`); a request returns the
    /// future of its reply (`None` inside when cancelled); responses are ignored.
    fn accept(self: Arc<Self>, msg: Value) -> Option<ReplyFuture> {
        let Value::Object(obj) = msg else {
            let e = RpcErr::new(INVALID_REQUEST, "Invalid request: not an object");
            return Some(Box::pin(async move { Some(error_reply(Value::Null, &e)) }));
        };
        let id = obj.get("id").cloned();
        let valid_id = matches!(id, Some(Value::Number(_) | Value::String(_)));
        let Some(method) = obj.get("method").and_then(Value::as_str).map(str::to_owned) else {
            if obj.contains_key("result") || obj.contains_key("error") {
                return None; // a response to nothing we asked: ignore
            }
            let e = RpcErr::new(INVALID_REQUEST, "Invalid request: no method");
            let id = if valid_id { id.unwrap() } else { Value::Null };
            return Some(Box::pin(async move { Some(error_reply(id, &e)) }));
        };
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        if id.is_none() {
            self.notification(&method, &params);
            return None;
        }
        if !valid_id {
            let e = RpcErr::new(
                INVALID_REQUEST,
                "Invalid request: the id must be a number or a string",
            );
            return Some(Box::pin(async move { Some(error_reply(Value::Null, &e)) }));
        }
        let id = id.expect("checked");
        let token = CancellationToken::new();
        let key = id_key(&id);
        self.inflight
            .lock()
            .expect("inflight")
            .insert(key.clone(), token.clone());
        Some(Box::pin(async move {
            let outcome = self.request(&method, params, token.clone()).await;
            self.inflight.lock().expect("inflight").remove(&key);
            if token.is_cancelled() {
                return None;
            }
            match outcome {
                Outcome::Result(r) => Some(message::encode_response_any(&id, Ok(&r))),
                Outcome::Error(e) => Some(error_reply(id, &e)),
                Outcome::Cancelled => None,
            }
        }))
    }

    /// Only `notifications/cancelled` matters; `notifications/initialized` and the rest need
    /// nothing.
    fn notification(&self, method: &str, params: &Value) {
        if method != "notifications/cancelled" {
            return;
        }
        if let Some(rid) = params.get("requestId") {
            if let Some(t) = self.inflight.lock().expect("inflight").get(&id_key(rid)) {
                t.cancel();
            }
        }
    }

    /// The era of a request from its `_meta`, or -32022 for a version we do not speak.
    fn era(&self, params: &Value) -> Result<Era, RpcErr> {
        match params.get("_meta").and_then(|m| m.get(META_VERSION)) {
            Some(Value::String(v)) if v == MODERN_VERSION => Ok(Era::Modern),
            Some(v) => Err(RpcErr {
                code: UNSUPPORTED_VERSION,
                message: "Unsupported protocol version".into(),
                data: Some(json!({"supported": supported_versions(), "requested": v})),
            }),
            None => Ok(Era::Handshake(
                self.negotiated
                    .lock()
                    .expect("negotiated")
                    .unwrap_or(LATEST_HANDSHAKE),
            )),
        }
    }

    async fn request(&self, method: &str, params: Value, cancel: CancellationToken) -> Outcome {
        if !matches!(params, Value::Null | Value::Object(_)) {
            return Outcome::Error(RpcErr::new(INVALID_PARAMS, "params must be an object"));
        }
        if method == "initialize" {
            return Outcome::Result(self.initialize(&params));
        }
        let era = match self.era(&params) {
            Ok(e) => e,
            Err(e) => return Outcome::Error(e),
        };
        // 2026-07-28: who the client is comes with each request.
        if let Some(info) = params.get("_meta").and_then(|m| m.get(META_CLIENT_INFO)) {
            name_client(info);
        }
        let outcome = match method {
            "ping" => Outcome::Result(json!({})),
            "server/discover" => Outcome::Result(json!({
                "supportedVersions": supported_versions(),
                "capabilities": capabilities(),
                "instructions": INSTRUCTIONS,
                "ttlMs": 0,
                "cacheScope": "private",
            })),
            "tools/list" => {
                let mut r = json!({ "tools": tools::list(era) });
                if era == Era::Modern {
                    r["ttlMs"] = json!(0);
                    r["cacheScope"] = json!("private");
                }
                Outcome::Result(r)
            }
            "tools/call" => self.call_tool(era, &params, cancel).await,
            _ => Outcome::Error(RpcErr::new(
                METHOD_NOT_FOUND,
                format!("Method not found: {method}"),
            )),
        };
        match outcome {
            Outcome::Result(r) if era == Era::Modern => Outcome::Result(modern_result(r)),
            o => o,
        }
    }

    fn initialize(&self, params: &Value) -> Value {
        if let Some(info) = params.get("clientInfo") {
            name_client(info);
        }
        let version = negotiate(params.get("protocolVersion").and_then(Value::as_str));
        *self.negotiated.lock().expect("negotiated") = Some(version);
        json!({
            "protocolVersion": version,
            "capabilities": capabilities(),
            "serverInfo": server_info(),
            "instructions": INSTRUCTIONS,
        })
    }

    async fn call_tool(&self, era: Era, params: &Value, cancel: CancellationToken) -> Outcome {
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return Outcome::Error(RpcErr::new(
                INVALID_PARAMS,
                "tools/call needs a tool `name`",
            ));
        };
        if !tools::exists(name) {
            return Outcome::Error(RpcErr::new(INVALID_PARAMS, format!("Unknown tool: {name}")));
        }
        let args = match params.get("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(v) => v.clone(),
        };
        let progress = params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .filter(|t| !t.is_null())
            .cloned();
        let cx = tools::Cx {
            mux: &self.mux,
            out: &self.out,
            progress,
            cancel,
            era,
        };
        match tools::call(&cx, name, args).await {
            Some(result) => Outcome::Result(result),
            None => Outcome::Cancelled,
        }
    }
}

fn server_info() -> Value {
    json!({"name": "abx", "title": "abx sandboxes", "version": abx_home::VERSION})
}

fn capabilities() -> Value {
    json!({"tools": {"listChanged": false}})
}

/// Add what every 2026-07-28 result carries.
fn modern_result(mut r: Value) -> Value {
    if let Value::Object(obj) = &mut r {
        obj.insert("resultType".into(), json!("complete"));
        let meta = obj.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(m) = meta {
            m.insert(META_SERVER_INFO.into(), server_info());
        }
    }
    r
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn negotiation_never_answers_an_unsupported_version() {
        assert_eq!(negotiate(Some("2024-11-05")), "2024-11-05");
        assert_eq!(negotiate(Some("2025-03-26")), "2025-03-26");
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some("2025-11-25")), "2025-11-25");
        assert_eq!(negotiate(Some("2026-07-28")), "2025-11-25");
        assert_eq!(negotiate(Some("1900-01-01")), "2025-11-25");
        assert_eq!(negotiate(None), "2025-11-25");
    }

    #[test]
    fn eras_gate_fields() {
        assert!(!Era::Handshake("2024-11-05").annotations());
        assert!(Era::Handshake("2025-03-26").annotations());
        assert!(!Era::Handshake("2025-03-26").structured());
        assert!(Era::Handshake("2025-06-18").structured());
        assert!(Era::Modern.structured());
        let r = modern_result(json!({"tools": []}));
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["_meta"][META_SERVER_INFO]["name"], "abx");
    }
}
