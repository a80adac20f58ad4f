//! A multiplexing daemon client: one connection, many concurrent calls.
//!
//! [`crate::client::Client`] is sequential (one call at a time, notifications queued). Servers
//! such as `abx mcp` run many calls at once, and long ones (an exec streaming its output) must
//! not block short ones. Here one reader task owns the read half and dispatches:
//!
//! - responses to the caller waiting for their id (a `oneshot`);
//! - `exec/output` / `exec/exit` notifications to the stream registered for their `execId`.
//!   A stream is registered by the reader itself when it sees the `exec/start` reply, before
//!   it reads the next message, so no notification can arrive before its subscriber (the
//!   broker always sends the reply first).
//!
//! A call whose future is dropped before its reply (the caller was cancelled) sends
//! `$/cancelRequest` so the broker stops the work too. When the daemon goes away every waiting
//! call fails with E1007 and every stream ends; the next [`Mux::conn`] connects again
//! (starting the daemon when needed).

use crate::client::{CallError, Client};
use abx_home::{Paths, SocketRead};
use abx_protocol::codec::{Frame, FrameCodec};
use abx_protocol::message::{self, Incoming, Message};
use abx_protocol::{AbxError, ErrorCode, Id};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;

/// A notification of an exec stream: its method (`exec/output`, `exec/exit`) and params.
#[derive(Debug, Clone)]
pub struct StreamEvent {
    /// `exec/output` or `exec/exit`.
    pub method: String,
    /// Its params.
    pub params: Value,
}

type CallReply = Result<Value, CallError>;
type StreamReply = Result<(Value, mpsc::UnboundedReceiver<StreamEvent>), CallError>;

enum Pending {
    Call(oneshot::Sender<CallReply>),
    /// An `exec/start`: the reader registers the stream before handing the reply over.
    Stream(oneshot::Sender<StreamReply>),
}

#[derive(Default)]
struct State {
    pending: HashMap<i64, Pending>,
    streams: HashMap<String, mpsc::UnboundedSender<StreamEvent>>,
}

/// One live connection to the daemon.
pub struct Conn {
    /// Whole messages for the writer task: a caller dropped mid-call can never leave half a
    /// message on the socket.
    writer: mpsc::UnboundedSender<Vec<u8>>,
    state: Mutex<State>,
    next_id: AtomicI64,
    closed: AtomicBool,
    paths: Paths,
}

fn broken(paths: &Paths, detail: &str) -> CallError {
    CallError::Broken(AbxError::new(
        ErrorCode::BrokerUnreachable,
        &[
            ("detail", detail),
            ("log", &paths.log_file().display().to_string()),
        ],
    ))
}

/// Fails a call's pending entry and cancels it at the broker when dropped unanswered.
struct Guard<'a> {
    conn: &'a Arc<Conn>,
    id: i64,
    armed: bool,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let was_pending = self
            .conn
            .state
            .lock()
            .expect("mux state")
            .pending
            .remove(&self.id)
            .is_some();
        if was_pending && !self.conn.is_closed() {
            let _ = self
                .conn
                .notify("$/cancelRequest", &json!({ "id": self.id }));
        }
    }
}

impl Conn {
    /// Whether the daemon connection is gone.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn write(&self, mut body: Vec<u8>) -> Result<(), CallError> {
        body.push(b'\n');
        self.writer
            .send(body)
            .map_err(|_| broken(&self.paths, "the broker closed the connection"))
    }

    /// Send a notification to the daemon.
    pub fn notify(&self, method: &str, params: &Value) -> Result<(), CallError> {
        self.write(message::encode_notification(method, Some(params)))
    }

    fn send(
        self: &Arc<Self>,
        method: &str,
        params: &Value,
        pending: Pending,
    ) -> Result<Guard<'_>, CallError> {
        if self.is_closed() {
            return Err(broken(&self.paths, "the broker closed the connection"));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.state
            .lock()
            .expect("mux state")
            .pending
            .insert(id, pending);
        let guard = Guard {
            conn: self,
            id,
            armed: true,
        };
        self.write(message::encode_request(&Id::Num(id), method, Some(params)))?;
        Ok(guard)
    }

    /// Call a method and wait for its result. Dropping the future cancels the request.
    pub async fn call(self: &Arc<Self>, method: &str, params: Value) -> Result<Value, CallError> {
        let (tx, rx) = oneshot::channel();
        let mut guard = self.send(method, &params, Pending::Call(tx))?;
        let res = rx
            .await
            .unwrap_or_else(|_| Err(broken(&self.paths, "the broker closed the connection")));
        guard.armed = false;
        res
    }

    /// Call a stream-starting method (`exec/start`): its result and the receiver of the
    /// notifications of its `execId`, which ends after `exec/exit` (or when the daemon goes).
    pub async fn start_stream(
        self: &Arc<Self>,
        method: &str,
        params: Value,
    ) -> Result<(Value, mpsc::UnboundedReceiver<StreamEvent>), CallError> {
        let (tx, rx) = oneshot::channel();
        let mut guard = self.send(method, &params, Pending::Stream(tx))?;
        let res = rx
            .await
            .unwrap_or_else(|_| Err(broken(&self.paths, "the broker closed the connection")));
        guard.armed = false;
        res
    }

    fn deliver(&self, m: Message) {
        match m {
            Message::Response(r) => {
                let Some(Id::Num(id)) = r.id else { return };
                let mut st = self.state.lock().expect("mux state");
                let Some(p) = st.pending.remove(&id) else {
                    return;
                };
                let outcome = r
                    .outcome
                    .map(|raw| serde_json::from_str::<Value>(raw.get()).unwrap_or(Value::Null))
                    .map_err(CallError::Rpc);
                match p {
                    Pending::Call(tx) => {
                        let _ = tx.send(outcome);
                    }
                    Pending::Stream(tx) => {
                        let reply = outcome.map(|v| {
                            let (stx, srx) = mpsc::unbounded_channel();
                            if let Some(eid) = v["execId"].as_str() {
                                st.streams.insert(eid.to_owned(), stx);
                            }
                            (v, srx)
                        });
                        let _ = tx.send(reply);
                    }
                }
            }
            Message::Notification(n) => {
                if n.method != "exec/output" && n.method != "exec/exit" {
                    return;
                }
                let params: Value = n
                    .params
                    .as_deref()
                    .and_then(|p| serde_json::from_str(p.get()).ok())
                    .unwrap_or(Value::Null);
                let Some(eid) = params["execId"].as_str().map(str::to_owned) else {
                    return;
                };
                let mut st = self.state.lock().expect("mux state");
                let exit = n.method == "exec/exit";
                if let Some(tx) = st.streams.get(&eid) {
                    let _ = tx.send(StreamEvent {
                        method: n.method,
                        params,
                    });
                }
                if exit {
                    st.streams.remove(&eid);
                }
            }
            Message::Request(_) => {}
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let mut st = self.state.lock().expect("mux state");
        for (_, p) in st.pending.drain() {
            let e = broken(&self.paths, "the broker closed the connection");
            match p {
                Pending::Call(tx) => {
                    let _ = tx.send(Err(e));
                }
                Pending::Stream(tx) => {
                    let _ = tx.send(Err(e));
                }
            }
        }
        st.streams.clear();
    }
}

async fn read_loop(conn: Arc<Conn>, mut reader: FramedRead<SocketRead, FrameCodec>) {
    while let Some(frame) = reader.next().await {
        match frame {
            Ok(Frame::Message(b)) => match message::decode(&b) {
                Incoming::Single(Ok(m)) => conn.deliver(m),
                Incoming::Single(Err(_)) => {}
                Incoming::Batch(items) => {
                    for m in items.into_iter().flatten() {
                        conn.deliver(m);
                    }
                }
            },
            Ok(Frame::TooLarge { .. }) => {}
            Err(_) => break,
        }
    }
    conn.close();
}

/// The shared daemon connection of a long-running client, (re)connected on demand.
pub struct Mux {
    paths: Paths,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
}

impl Mux {
    /// A client for the daemon at `paths`; nothing is connected until the first call.
    pub fn new(paths: &Paths) -> Mux {
        Mux {
            paths: paths.clone(),
            conn: tokio::sync::Mutex::new(None),
        }
    }

    /// The live connection: connects (starting the daemon when none answers, replacing an
    /// idle one of another version) when there is none or the last one broke.
    pub async fn conn(&self) -> Result<Arc<Conn>, AbxError> {
        let mut g = self.conn.lock().await;
        if let Some(c) = g.as_ref() {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let client = Client::connect_handshake(&self.paths).await?;
        let (reader, mut socket) = client.into_parts();
        let (writer, mut outgoing) = mpsc::unbounded_channel::<Vec<u8>>();
        let conn = Arc::new(Conn {
            writer,
            state: Mutex::new(State::default()),
            next_id: AtomicI64::new(1_000),
            closed: AtomicBool::new(false),
            paths: self.paths.clone(),
        });
        tokio::spawn(read_loop(conn.clone(), reader));
        // Weak: the task must not keep the connection (and so its own channel) alive.
        let c = Arc::downgrade(&conn);
        tokio::spawn(async move {
            while let Some(body) = outgoing.recv().await {
                if socket.write_all(&body).await.is_err() {
                    break;
                }
            }
            // The reader sees the end of the connection and fails what waits.
            if let Some(c) = c.upgrade() {
                c.closed.store(true, Ordering::SeqCst);
            }
        });
        *g = Some(conn.clone());
        Ok(conn)
    }

    /// Call a method on the live connection.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, CallError> {
        self.conn().await?.call(method, params).await
    }
}
