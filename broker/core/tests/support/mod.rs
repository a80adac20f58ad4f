//! What the core tests share: a test provider whose behaviour each call's params choose, a
//! broker built around it, and a line-framed client over an in-memory duplex pipe served by
//! `abx_core::conn::serve` (nothing else between them: no socket, no daemon).

#![allow(dead_code)]

use abx_core::broker::{Methods, Settings};
use abx_core::conn::{self, ConnEnd};
use abx_core::dispatch::{self, Cx};
use abx_core::events::Events;
use abx_core::provider::{BoxFut, CallCx, Kind, Provider, ProviderSummary, Reply};
use abx_core::Broker;
use abx_home::Paths;
use abx_protocol::message::{self, Incoming, Message, Response};
use abx_protocol::{AbxError, ErrorCode, Id, RpcError};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any wait for a condition may take before the test fails (generous: the machine
/// is shared; nothing is timed).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Wait until `cond` holds, failing the test with `what` after [`PATIENCE`].
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One `exec/write` as the provider saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Enter(u64),
    Leave(u64),
}

/// What a test provider saw, shared with the test.
#[derive(Default)]
pub struct Seen {
    /// Every call: method and params (after routing rewrote `sandbox`).
    pub calls: Mutex<Vec<(String, Value)>>,
    /// The cancellation token of each call that had a `tag` param.
    pub tokens: Mutex<HashMap<String, CancellationToken>>,
    /// Tags of calls whose future was dropped before it finished.
    pub dropped: Mutex<Vec<String>>,
    /// `exec/write` calls per execId, in the order they entered and left the provider.
    pub writes: Mutex<HashMap<String, Vec<Step>>>,
    /// Gates a call with a `gate` param waits on (the test adds permits).
    pub gates: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// `info()` panics while set (for `broker/status`).
    pub panic_in_info: AtomicBool,
}

impl Seen {
    pub fn gate(&self, name: &str) -> Arc<Semaphore> {
        self.gates
            .lock()
            .unwrap()
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(0)))
            .clone()
    }

    /// Let `n` calls waiting on gate `name` through.
    pub fn open(&self, name: &str, n: usize) {
        self.gate(name).add_permits(n);
    }

    pub fn token(&self, tag: &str) -> Option<CancellationToken> {
        self.tokens.lock().unwrap().get(tag).cloned()
    }

    /// Calls of `method` so far.
    pub fn count(&self, method: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _)| m == method)
            .count()
    }

    pub fn writes(&self, exec: &str) -> Vec<Step> {
        self.writes
            .lock()
            .unwrap()
            .get(exec)
            .cloned()
            .unwrap_or_default()
    }
}

/// Records that a call's future was dropped unfinished (the broker gave up on it).
struct DropFlag(Option<(Arc<Seen>, String)>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        if let Some((seen, tag)) = self.0.take() {
            seen.dropped.lock().unwrap().push(tag);
        }
    }
}

/// The members the test provider reads beside the API's (below): the brokers of these tests
/// let them through ([`Settings::extra_members`]); any other member a method does not take
/// is refused as in the daemon.
pub const CONTROL: &[&str] = &[
    "do", "tag", "gate", "seq", "spin", "size", "stream", "execId", "id",
];

/// A provider answering from its params:
/// - `do: "now"` (or nothing): answers at once with `{method, params}`;
/// - `do: "hang"`: keeps its cancellation token (under `tag`) and never answers by itself;
/// - `do: "panic"`: panics; `do: "panic-holding"` panics holding `cx.hold`'s lock;
/// - `do: "fail"`: E2009;
/// - `gate: name`: waits for a permit of that gate first;
/// - `size: n`: the answer carries `data` of n bytes;
/// - `exec/start` answers `{execId}` (the `execId` param, else `e1`) and, with `stream: n`,
///   sends n `exec/output` notifications through `cx.conn` once its reply is queued;
/// - `exec/write` records when it enters (before any gate) and leaves (per execId, `seq`
///   param), yielding `spin` times in between (varying handling times without sleeping);
/// - `sandbox/info` of a sandbox it does not own is E2009 (what the probe of a bare id asks);
/// - `sandbox/create` answers `{id}` (the `id` param).
pub struct TestProvider {
    summary: ProviderSummary,
    owned: Vec<String>,
    pub seen: Arc<Seen>,
}

impl TestProvider {
    pub fn new(id: &str, features: &[&str], owned: &[&str]) -> Arc<TestProvider> {
        Arc::new(TestProvider {
            summary: ProviderSummary {
                id: id.to_owned(),
                name: format!("test provider {id}"),
                version: "0.0.1".to_owned(),
                kind: Kind::Builtin,
                trust: "builtin".to_owned(),
                features: features.iter().map(|f| (*f).to_owned()).collect(),
                description: "answers as its params say".to_owned(),
            },
            owned: owned.iter().map(|s| (*s).to_owned()).collect(),
            seen: Arc::default(),
        })
    }

    /// Provider `t`: lifecycle, streams, files; owns `s1`.
    pub fn full() -> Arc<TestProvider> {
        TestProvider::new(
            "t",
            &["sandbox.lifecycle", "exec.stream", "files.rw"],
            &["s1"],
        )
    }

    async fn serve(&self, cx: &CallCx, method: &str, params: Value) -> Reply {
        let tag = params["tag"].as_str().map(str::to_owned);
        if let Some(tag) = &tag {
            self.seen
                .tokens
                .lock()
                .unwrap()
                .insert(tag.clone(), cx.cancel.clone());
        }
        let _flag = DropFlag(tag.clone().map(|t| (self.seen.clone(), t)));
        let exec = params["execId"].as_str().unwrap_or_default().to_owned();
        let seq = params["seq"].as_u64().unwrap_or_default();
        let log = |s: Step| {
            self.seen
                .writes
                .lock()
                .unwrap()
                .entry(exec.clone())
                .or_default()
                .push(s)
        };
        if method == "exec/write" {
            // Entered before any gate: the test sees which write holds its lane.
            log(Step::Enter(seq));
        }
        if let Some(g) = params["gate"].as_str() {
            let gate = self.seen.gate(g);
            gate.acquire().await.expect("gate").forget();
        }
        match params["do"].as_str().unwrap_or("now") {
            "hang" => std::future::pending::<()>().await,
            "panic" => panic!("the test provider panics in {method}"),
            "panic-holding" => {
                // Poisons the reply hold's lock on the way out.
                let _held = cx.hold.lock().unwrap();
                panic!("the test provider panics in {method} holding the reply hold")
            }
            "fail" => {
                return Err(AbxError::new(
                    ErrorCode::SandboxNotFound,
                    &[("sandbox", "failing")],
                ))
            }
            _ => {}
        }
        let reply = match method {
            "exec/start" => {
                let exec = params["execId"].as_str().unwrap_or("e1").to_owned();
                if let Some(n) = params["stream"].as_u64() {
                    let (conn, replied) = (cx.conn.clone(), cx.replied.clone());
                    let exec = exec.clone();
                    tokio::spawn(async move {
                        replied.cancelled().await;
                        for i in 0..n {
                            let p =
                                json!({"execId": exec, "stream": "stdout", "data": i.to_string()});
                            assert!(conn.notify("exec/output", &p).await);
                        }
                    });
                }
                json!({ "execId": exec })
            }
            "exec/write" => {
                for _ in 0..params["spin"].as_u64().unwrap_or(0) {
                    tokio::task::yield_now().await;
                }
                log(Step::Leave(seq));
                json!({})
            }
            "sandbox/info" => {
                let sb = params["sandbox"].as_str().unwrap_or_default();
                if !self.owned.iter().any(|o| o == sb) {
                    return Err(AbxError::new(
                        ErrorCode::SandboxNotFound,
                        &[("sandbox", sb)],
                    ));
                }
                json!({ "id": sb, "provider": self.summary.id })
            }
            "sandbox/create" => json!({ "id": params["id"] }),
            "sandbox/list" => json!({ "sandboxes": [] }),
            _ => match params["size"].as_u64() {
                Some(n) => json!({ "data": "x".repeat(n as usize) }),
                None => json!({ "method": method, "params": params, "provider": self.summary.id }),
            },
        };
        dispatch::reply(&reply)
    }
}

impl Provider for TestProvider {
    fn summary(&self) -> &ProviderSummary {
        &self.summary
    }

    fn info(&self) -> Value {
        if self.seen.panic_in_info.load(Ordering::Relaxed) {
            panic!("the test provider panics in info()");
        }
        json!({ "process": { "running": true } })
    }

    fn owns(&self, sandbox: &str) -> bool {
        self.owned.iter().any(|o| o == sandbox)
    }

    fn call<'a>(&'a self, cx: &'a CallCx, method: &'a str, params: Value) -> BoxFut<'a, Reply> {
        self.seen
            .calls
            .lock()
            .unwrap()
            .push((method.to_owned(), params.clone()));
        Box::pin(self.serve(cx, method, params))
    }
}

/// A composition root's table: `test/echo` answers its params, `test/panic` panics; it
/// also claims `broker/ping` (the core's own must win).
pub struct RootMethods;

impl Methods for RootMethods {
    fn names(&self) -> &[&'static str] {
        &["test/echo", "test/panic", "broker/ping"]
    }

    fn call<'a>(
        &'a self,
        _cx: &'a Cx,
        method: &'a str,
        params: Option<Box<RawValue>>,
    ) -> BoxFut<'a, dispatch::Reply> {
        Box::pin(async move {
            match method {
                "test/panic" => panic!("the composition root panics"),
                "broker/ping" => dispatch::reply(&json!({"from": "root"})),
                _ => dispatch::reply(&json!({
                    "from": "root",
                    "params": params.map(|p| serde_json::from_str::<Value>(p.get()).unwrap()),
                })),
            }
        })
    }
}

/// A broker over `providers` in a fresh directory (kept alive by the returned guard).
pub fn broker_with(
    providers: Vec<Arc<dyn Provider>>,
    memory_budget: usize,
    methods: Option<Arc<dyn Methods>>,
) -> (Arc<Broker>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = Settings {
        memory_budget,
        extra_members: CONTROL,
        ..Settings::default()
    };
    let broker = Broker::new(
        Paths::under(dir.path()),
        settings,
        providers,
        Events::default(),
        methods,
    );
    (Arc::new(broker), dir)
}

/// The usual broker: provider `t` (see [`TestProvider::full`]), the default budget, no
/// composition-root methods.
pub fn broker(t: &Arc<TestProvider>) -> (Arc<Broker>, tempfile::TempDir) {
    broker_with(
        vec![t.clone() as Arc<dyn Provider>],
        abx_core::outbound::DEFAULT_POOL,
        None,
    )
}

/// A response as the client read it.
#[derive(Debug)]
pub struct Reply1 {
    pub id: Option<Id>,
    pub outcome: Result<Value, RpcError>,
}

impl Reply1 {
    fn of(r: Response) -> Reply1 {
        Reply1 {
            id: r.id,
            outcome: r
                .outcome
                .map(|raw| serde_json::from_str(raw.get()).expect("result JSON")),
        }
    }

    pub fn ok(self) -> Value {
        match self.outcome {
            Ok(v) => v,
            Err(e) => panic!("expected a result for {:?}, got {e:?}", self.id),
        }
    }

    pub fn err(self) -> RpcError {
        match self.outcome {
            Err(e) => e,
            Ok(v) => panic!("expected an error for {:?}, got {v}", self.id),
        }
    }

    /// The error, checked to carry `code` (its E-code and JSON-RPC number).
    pub fn err_code(self, code: ErrorCode) -> RpcError {
        let e = self.err();
        assert_eq!(e.abx(), Some(code.abx().as_str()), "{e:?}");
        assert_eq!(e.code, code.rpc_code(), "{e:?}");
        e
    }
}

/// What one frame from the broker held.
#[derive(Debug)]
pub enum Got {
    Reply(Reply1),
    Note(String, Value),
    Batch(Vec<Reply1>),
}

fn got(m: Message) -> Got {
    match m {
        Message::Response(r) => Got::Reply(Reply1::of(r)),
        Message::Notification(n) => Got::Note(
            n.method,
            n.params
                .map_or(Value::Null, |p| serde_json::from_str(p.get()).unwrap()),
        ),
        Message::Request(r) => panic!("the broker sent a request: {r:?}"),
    }
}

/// A line-framed client over a duplex pipe; frames read while looking for a reply are kept
/// for later looks.
pub struct Client {
    w: WriteHalf<DuplexStream>,
    r: tokio::io::Lines<BufReader<ReadHalf<DuplexStream>>>,
    next: i64,
    kept: Vec<Got>,
    /// The connection's `serve`, returning how it ended.
    pub served: Option<JoinHandle<ConnEnd>>,
}

/// Bytes the pipe between client and broker holds each way.
pub const PIPE: usize = 64 * 1024;

impl Client {
    /// A new connection to `broker`.
    pub fn connect(broker: &Arc<Broker>) -> Client {
        Client::connect_pipe(broker, PIPE)
    }

    /// A new connection whose pipe holds `pipe` bytes each way (a few: nearly every write
    /// the broker makes is partial).
    pub fn connect_pipe(broker: &Arc<Broker>, pipe: usize) -> Client {
        let (client, server) = tokio::io::duplex(pipe);
        let (sr, sw) = tokio::io::split(server);
        let served = tokio::spawn(conn::serve(broker.clone(), sr, sw));
        let (cr, cw) = tokio::io::split(client);
        Client {
            w: cw,
            r: BufReader::new(cr).lines(),
            next: 1,
            kept: Vec::new(),
            served: Some(served),
        }
    }

    /// Write one body as a line.
    pub async fn write(&mut self, mut body: Vec<u8>) {
        body.push(b'\n');
        self.w.write_all(&body).await.expect("write to the broker");
        self.w.flush().await.expect("flush");
    }

    /// Write bytes as they are (no framing added).
    pub async fn write_raw(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).await.expect("write to the broker");
        self.w.flush().await.expect("flush");
    }

    /// A request body with a fresh numeric id.
    pub fn request(&mut self, method: &str, params: Value) -> (Id, Vec<u8>) {
        let id = Id::Num(self.next);
        self.next += 1;
        let body = message::encode_request(&id, method, Some(&params));
        (id, body)
    }

    /// Send a request; returns its id.
    pub async fn send(&mut self, method: &str, params: Value) -> Id {
        let (id, body) = self.request(method, params);
        self.write(body).await;
        id
    }

    /// Send a notification.
    pub async fn notify(&mut self, method: &str, params: Value) {
        self.write(message::encode_notification(method, Some(&params)))
            .await;
    }

    /// `$/cancelRequest` for `id`.
    pub async fn cancel(&mut self, id: &Id) {
        self.notify("$/cancelRequest", json!({ "id": id })).await;
    }

    /// Close the sending side (EOF for the broker).
    pub async fn close_write(&mut self) {
        self.w.shutdown().await.expect("shutdown");
    }

    /// The next frame, `None` at EOF.
    pub async fn next(&mut self) -> Option<Got> {
        let line = tokio::time::timeout(PATIENCE, self.r.next_line())
            .await
            .expect("timed out waiting for a message from the broker")
            .expect("read");
        let line = line?;
        Some(match message::decode(line.as_bytes()) {
            Incoming::Single(m) => got(m.unwrap_or_else(|e| panic!("undecodable {line}: {e:?}"))),
            Incoming::Batch(items) => Got::Batch(
                items
                    .into_iter()
                    .map(|m| match got(m.expect("a batch element")) {
                        Got::Reply(r) => r,
                        other => panic!("a notification in a batch reply: {other:?}"),
                    })
                    .collect(),
            ),
        })
    }

    /// The reply to `id` (frames read before it are kept).
    pub async fn reply(&mut self, id: &Id) -> Reply1 {
        if let Some(i) = self
            .kept
            .iter()
            .position(|g| matches!(g, Got::Reply(r) if r.id.as_ref() == Some(id)))
        {
            let Got::Reply(r) = self.kept.remove(i) else {
                unreachable!()
            };
            return r;
        }
        loop {
            match self.next().await {
                Some(Got::Reply(r)) if r.id.as_ref() == Some(id) => return r,
                Some(other) => self.kept.push(other),
                None => panic!("the connection ended before the reply to {id}"),
            }
        }
    }

    /// The next batch reply (frames read before it are kept).
    pub async fn batch(&mut self) -> Vec<Reply1> {
        if let Some(i) = self.kept.iter().position(|g| matches!(g, Got::Batch(_))) {
            let Got::Batch(b) = self.kept.remove(i) else {
                unreachable!()
            };
            return b;
        }
        loop {
            match self.next().await {
                Some(Got::Batch(b)) => return b,
                Some(other) => self.kept.push(other),
                None => panic!("the connection ended before a batch reply"),
            }
        }
    }

    /// A request and its reply.
    pub async fn call(&mut self, method: &str, params: Value) -> Reply1 {
        let id = self.send(method, params).await;
        self.reply(&id).await
    }

    /// Frames read but not yet taken.
    pub fn kept(&mut self) -> Vec<Got> {
        std::mem::take(&mut self.kept)
    }

    /// How `serve` ended (waits for it).
    pub async fn ended(&mut self) -> ConnEnd {
        let served = self.served.take().expect("not awaited yet");
        tokio::time::timeout(PATIENCE, served)
            .await
            .expect("timed out waiting for the connection to end")
            .expect("serve did not panic")
    }
}
