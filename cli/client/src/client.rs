//! The CLI's connection to the daemon: connect, start it when none answers, check versions.

use crate::remote::{self, Remote};
use crate::spawn;
use abx_home::lock::Record;
use abx_home::{Paths, SocketRead, SocketWrite};
use abx_protocol::api::{methods, InitializeResult, PeerInfo};
use abx_protocol::codec::{Frame, FrameCodec, Framing};
use abx_protocol::message::{self, Incoming, Message, Notification};
use abx_protocol::{AbxError, ErrorCode, Id, RpcError};
use futures::StreamExt;
use interprocess::local_socket::tokio::prelude::*;
use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::GenericFilePath;
use serde::Serialize;
use serde_json::Value;
use std::collections::VecDeque;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_util::codec::FramedRead;

/// Why a call failed: the broker answered an error, or the connection broke.
#[derive(Debug)]
pub enum CallError {
    /// The broker's error reply.
    Rpc(RpcError),
    /// Transport trouble (already an E1007).
    Broken(AbxError),
}

impl From<AbxError> for CallError {
    fn from(e: AbxError) -> Self {
        CallError::Broken(e)
    }
}

/// A line-framed JSON-RPC connection to the daemon.
pub struct Client {
    reader: FramedRead<SocketRead, FrameCodec>,
    writer: SocketWrite,
    next_id: i64,
    /// Notifications that arrived while waiting for a response.
    pub notifications: VecDeque<Notification>,
    /// The daemon's `initialize` result (`None` when the handshake was skipped).
    pub server: Option<InitializeResult>,
    paths: Paths,
    /// Connected without the handshake: what was sent before the first reply, to send again
    /// if the daemon drops the connection without answering anything (see [`Client::connect`]).
    replay: Option<Vec<u8>>,
    /// The ssh child when the broker is on another machine (`ABX_HOST`).
    remote: Option<Remote>,
}

/// The name this process gives the daemon in `initialize` (`clientInfo.name`): `abx`, or
/// what [`set_client_name`] set (`abx mcp`: its MCP client's name).
static CLIENT_NAME: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// Name this process to the daemon from now on (`initialize` `clientInfo.name`, shown by
/// `sandbox/log`): `abx mcp` passes on its MCP client's name.
pub fn set_client_name(name: &str) {
    *CLIENT_NAME.write().expect("client name") = Some(name.to_owned());
}

fn initialize_params() -> serde_json::Value {
    let name = CLIENT_NAME
        .read()
        .expect("client name")
        .clone()
        .unwrap_or_else(|| "abx".into());
    serde_json::json!({
        "clientInfo": PeerInfo { name, version: abx_home::VERSION.into() },
    })
}

/// The most a client keeps to send again while no reply has come (more: no replay).
const REPLAY_MAX: usize = 1 << 20;

/// Connect to the running daemon that serves `paths.data_dir`, without starting one: the
/// runtime dir's socket when the record beside it says its daemon serves our data dir (an
/// older daemon's record says nothing: taken as ours, and replaced for its version), else
/// the socket recorded in the data dir by the daemon that holds it (a daemon started from
/// another context: no `XDG_RUNTIME_DIR`, or another one). The daemon must run as this user.
pub async fn connect_raw(paths: &Paths) -> std::io::Result<Stream> {
    let record = Record::read(&paths.daemon_lock);
    let first = match &record {
        Some(r) if !r.serves(&paths.data_dir) => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "the daemon on {} serves another data dir",
                paths.socket.display()
            ),
        )),
        _ => connect_checked(&paths.socket).await,
    };
    let Err(e) = first else { return first };
    match recorded_elsewhere(paths) {
        Some(socket) => connect_checked(&socket).await,
        None => Err(e),
    }
}

/// Whether a daemon that serves `paths.data_dir` answers (see [`connect_raw`]; blocking).
pub fn answers(paths: &Paths) -> bool {
    let ours = Record::read(&paths.daemon_lock).is_none_or(|r| r.serves(&paths.data_dir));
    (ours && std::os::unix::net::UnixStream::connect(&paths.socket).is_ok())
        || recorded_elsewhere(paths)
            .is_some_and(|s| std::os::unix::net::UnixStream::connect(s).is_ok())
}

/// The socket the data dir's record names, when it is not ours, a daemon holds the data
/// dir's lock, and the record beside that socket says its daemon serves our data dir.
fn recorded_elsewhere(paths: &Paths) -> Option<std::path::PathBuf> {
    let socket = Record::read(&paths.data_lock)?.socket?;
    if socket == paths.socket || !socket.is_absolute() {
        return None;
    }
    let beside = Record::read(&socket.parent()?.join("broker.lock"))?;
    if beside.data_dir.as_deref() != Some(paths.data_dir.as_path()) {
        return None;
    }
    // The socket and its directory are this user's (the daemon made them 0600 / 0700).
    let me = unsafe { libc::geteuid() };
    let ok = |p: &std::path::Path, socket: bool| {
        std::fs::symlink_metadata(p).is_ok_and(|m| {
            m.uid() == me
                && (if socket {
                    m.file_type().is_socket()
                } else {
                    m.is_dir()
                })
        })
    };
    (ok(&socket, true) && ok(socket.parent()?, false)).then_some(socket)
}

/// Connect to `socket` and check that the daemon behind it runs as this user.
async fn connect_checked(socket: &std::path::Path) -> std::io::Result<Stream> {
    let name = socket.to_fs_name::<GenericFilePath>()?;
    let s = Stream::connect(name).await?;
    let me = unsafe { libc::geteuid() };
    match s.peer_creds().map(|c| c.euid()) {
        Ok(Some(uid)) if uid == me => Ok(s),
        other => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is served by another user ({other:?}), not uid {me}",
                socket.display()
            ),
        )),
    }
}

fn unreachable(paths: &Paths, detail: impl std::fmt::Display) -> AbxError {
    AbxError::new(
        ErrorCode::BrokerUnreachable,
        &[
            ("detail", &detail.to_string()),
            ("log", &paths.log_file().display().to_string()),
        ],
    )
}

impl Client {
    fn from_stream(stream: Stream, paths: &Paths) -> Result<Client, AbxError> {
        let (r, w) = abx_home::socket::split(stream)
            .map_err(|e| unreachable(paths, format!("cannot use the connection ({e})")))?;
        Ok(Client {
            reader: FramedRead::new(r, FrameCodec::with_framing(Framing::Line, usize::MAX / 2)),
            writer: w,
            next_id: 1,
            notifications: VecDeque::new(),
            server: None,
            paths: paths.clone(),
            replay: None,
            remote: None,
        })
    }

    /// A connection through `ssh host abx rpc` (see [`crate::remote`]), initialized; an ssh
    /// failure is its typed error (E1014, E1015, E1016). The remote `abx rpc` starts the
    /// daemon there and checks its version.
    async fn connect_remote(host: &remote::Host, paths: &Paths) -> Result<Client, AbxError> {
        let (stream, rem) = remote::connect(host)?;
        let mut client = Client::from_stream(stream, paths)?;
        client.remote = Some(rem);
        match client.initialize_raw().await {
            Ok(v) => {
                client.accept_init(v)?;
                Ok(client)
            }
            Err(CallError::Broken(_)) => {
                let mut rem = client.remote.take().expect("remote");
                Err(tokio::task::spawn_blocking(move || rem.failure())
                    .await
                    .unwrap_or_else(AbxError::internal))
            }
            Err(CallError::Rpc(r)) => Err(unreachable(
                paths,
                format!("initialize failed on {}: {r}", host.url),
            )),
        }
    }

    /// Whether this connection goes to another machine.
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Connect to the running daemon only (no start, no handshake).
    pub async fn connect_existing(paths: &Paths) -> Result<Client, AbxError> {
        if let Some(h) = remote::current()? {
            return Self::connect_remote(h, paths).await;
        }
        let s = connect_raw(paths)
            .await
            .map_err(|e| unreachable(paths, format!("not running ({e})")))?;
        Client::from_stream(s, paths)
    }

    /// Connect, starting the daemon when none answers, and replace an idle daemon of
    /// another version.
    ///
    /// When the lock file says the running daemon answers with our version, the handshake
    /// would tell us nothing (`initialize` is optional, docs/design.md#wire): its round trip is
    /// skipped. A daemon that is going away can still accept a connection and drop it; what
    /// was sent before its first reply is then sent again on a connection made the careful
    /// way ([`Client::connect_handshake`]), so callers see one answer either way.
    pub async fn connect(paths: &Paths) -> Result<Client, AbxError> {
        if remote::current()?.is_none()
            && Record::read(&paths.daemon_lock).is_some_and(|r| {
                r.version.as_deref() == Some(abx_home::VERSION) && r.serves(&paths.data_dir)
            })
        {
            if let Ok(s) = connect_raw(paths).await {
                let mut c = Client::from_stream(s, paths)?;
                c.replay = Some(Vec::new());
                return Ok(c);
            }
        }
        Self::connect_handshake(paths).await
    }

    /// [`Client::connect`] with the `initialize` handshake always made first (for
    /// connections handed on whole: `abx rpc`, the multiplexer).
    pub async fn connect_handshake(paths: &Paths) -> Result<Client, AbxError> {
        if let Some(h) = remote::current()? {
            return Self::connect_remote(h, paths).await;
        }
        let mut client = Self::connect_or_start(paths).await?;
        let init = match client.initialize_raw().await {
            Ok(v) => client.accept_init(v)?,
            // A daemon that is going away (killed, or stopping) can still accept a connection
            // and then drop it: wait until it is gone (its lock is free), then start one.
            Err(CallError::Broken(_)) => {
                drop(client);
                spawn::wait_stopped(paths, Duration::from_secs(10)).await?;
                client = Self::connect_or_start(paths).await?;
                client.initialize().await?
            }
            Err(CallError::Rpc(r)) => {
                return Err(unreachable(paths, format!("initialize failed: {r}")))
            }
        };
        if init.server_info.version != abx_home::VERSION
            && std::env::var_os("ABX_NO_REPLACE").is_none()
        {
            match client
                .call(
                    methods::BROKER_SHUTDOWN,
                    Some(&serde_json::json!({"ifIdle": true})),
                )
                .await
            {
                Ok(_) => {
                    drop(client);
                    spawn::wait_stopped(paths, Duration::from_secs(10)).await?;
                    client = Self::connect_or_start(paths).await?;
                    client.initialize().await?;
                }
                Err(_) => {
                    let e = AbxError::new(
                        ErrorCode::VersionMismatch,
                        &[
                            ("server", &init.server_info.version),
                            ("client", abx_home::VERSION),
                        ],
                    );
                    eprintln!("warning: {e}\n  Suggestion: {}", e.suggestion);
                }
            }
        }
        Ok(client)
    }

    async fn connect_or_start(paths: &Paths) -> Result<Client, AbxError> {
        if let Ok(s) = connect_raw(paths).await {
            return Client::from_stream(s, paths);
        }
        spawn::start_daemon(paths).await?;
        let s = connect_raw(paths)
            .await
            .map_err(|e| unreachable(paths, format!("started, but cannot connect ({e})")))?;
        Client::from_stream(s, paths)
    }

    /// Send `initialize` with our version.
    pub async fn initialize(&mut self) -> Result<InitializeResult, AbxError> {
        let v = self.initialize_raw().await.map_err(|e| match e {
            CallError::Rpc(r) => unreachable(&self.paths, format!("initialize failed: {r}")),
            CallError::Broken(b) => b,
        })?;
        self.accept_init(v)
    }

    /// The `initialize` call itself (a broken connection is told from an error reply).
    async fn initialize_raw(&mut self) -> Result<serde_json::Value, CallError> {
        self.call(methods::INITIALIZE, Some(&initialize_params()))
            .await
    }

    /// Say who we are on a connection made without the handshake ([`Client::connect`]), so
    /// that what this client runs is logged under its name (`sandbox/log`): the
    /// `initialize` the fast path skipped, answered before anything else is sent (the
    /// broker serves requests concurrently). Nothing on a connection that made it.
    pub async fn announce(&mut self) -> Result<(), AbxError> {
        if self.server.is_some() {
            return Ok(());
        }
        match self.initialize_raw().await {
            Ok(v) => {
                let _ = self.accept_init(v);
                Ok(())
            }
            Err(CallError::Rpc(_)) => Ok(()),
            Err(CallError::Broken(b)) => Err(b),
        }
    }

    fn accept_init(&mut self, v: serde_json::Value) -> Result<InitializeResult, AbxError> {
        let init: InitializeResult = serde_json::from_value(v)
            .map_err(|e| unreachable(&self.paths, format!("bad initialize reply: {e}")))?;
        self.server = Some(init.clone());
        Ok(init)
    }

    /// The connection's halves, for `abx rpc` (an ssh child lives on by itself: it ends
    /// when its side of the connection closes).
    pub fn into_parts(self) -> (FramedRead<SocketRead, FrameCodec>, SocketWrite) {
        (self.reader, self.writer)
    }

    /// Send raw bytes (one framed message or more).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), AbxError> {
        if let Some(kept) = &mut self.replay {
            if kept.len() + bytes.len() <= REPLAY_MAX {
                kept.extend_from_slice(bytes);
            } else {
                self.replay = None;
            }
        }
        if let Err(e) = self.writer.write_all(bytes).await {
            if self.replay.is_some() {
                // Sent again, with the rest, once the read side sees the connection gone.
                return Ok(());
            }
            return Err(unreachable(&self.paths, format!("write failed: {e}")));
        }
        Ok(())
    }

    /// The daemon dropped a connection made without the handshake before answering
    /// anything: connect the careful way and send again what was sent. `false` when this
    /// connection cannot be replayed (it was answered, or the handshake was made).
    async fn replay_on_fresh(&mut self) -> Result<bool, AbxError> {
        let Some(kept) = self.replay.take() else {
            return Ok(false);
        };
        let mut fresh = Box::pin(Self::connect_handshake(&self.paths)).await?;
        fresh.next_id = fresh.next_id.max(self.next_id);
        fresh.notifications = std::mem::take(&mut self.notifications);
        *self = fresh;
        self.send_raw(&kept).await?;
        Ok(true)
    }

    /// Send a request and return its id.
    pub async fn send_request<P: Serialize + ?Sized>(
        &mut self,
        method: &str,
        params: Option<&P>,
    ) -> Result<Id, AbxError> {
        let id = Id::Num(self.next_id);
        self.next_id += 1;
        let mut body = message::encode_request(&id, method, params);
        body.push(b'\n');
        self.send_raw(&body).await?;
        Ok(id)
    }

    /// The next message from the daemon (`None` at end of stream).
    pub async fn next_message(&mut self) -> Result<Option<Message>, AbxError> {
        loop {
            let next = self.reader.next().await;
            if matches!(next, None | Some(Err(_))) && self.replay_on_fresh().await? {
                continue;
            }
            if next.is_some() {
                self.replay = None;
            }
            match next {
                None => return Ok(None),
                Some(Err(e)) => return Err(unreachable(&self.paths, format!("read failed: {e}"))),
                Some(Ok(Frame::TooLarge { .. })) => {
                    return Err(unreachable(&self.paths, "reply too large"))
                }
                Some(Ok(Frame::Message(b))) => match message::decode(&b) {
                    Incoming::Single(Ok(m)) => return Ok(Some(m)),
                    Incoming::Single(Err(inv)) => {
                        return Err(unreachable(
                            &self.paths,
                            format!("bad reply: {}", inv.error),
                        ))
                    }
                    Incoming::Batch(_) => continue,
                },
            }
        }
    }

    /// Call a method and wait for its result; notifications meanwhile are queued.
    pub async fn call<P: Serialize + ?Sized>(
        &mut self,
        method: &str,
        params: Option<&P>,
    ) -> Result<Value, CallError> {
        let id = self.send_request(method, params).await?;
        self.wait_for(&id, None).await
    }

    /// Call a method and hand every notification that arrives meanwhile to `on_note`
    /// (progress bars) instead of queueing it.
    pub async fn call_watching<P: Serialize + ?Sized>(
        &mut self,
        method: &str,
        params: Option<&P>,
        on_note: &mut dyn FnMut(&Notification),
    ) -> Result<Value, CallError> {
        let id = self.send_request(method, params).await?;
        self.wait_for(&id, Some(on_note)).await
    }

    /// Wait for the reply to a request sent with [`Client::send_request`].
    pub async fn reply_to(&mut self, id: &Id) -> Result<Value, CallError> {
        self.wait_for(id, None).await
    }

    /// Wait for the reply to a request sent with [`Client::send_request`], handing every
    /// notification that arrives meanwhile to `on_note`.
    pub async fn reply_watching(
        &mut self,
        id: &Id,
        on_note: &mut dyn FnMut(&Notification),
    ) -> Result<Value, CallError> {
        self.wait_for(id, Some(on_note)).await
    }

    async fn wait_for(
        &mut self,
        id: &Id,
        mut on_note: Option<&mut dyn FnMut(&Notification)>,
    ) -> Result<Value, CallError> {
        let id = id.clone();
        loop {
            match self.next_message().await? {
                None => {
                    return Err(CallError::Broken(unreachable(
                        &self.paths,
                        "the broker closed the connection",
                    )))
                }
                Some(Message::Response(r)) if r.id.as_ref() == Some(&id) => {
                    return match r.outcome {
                        Ok(raw) => Ok(serde_json::from_str(raw.get()).unwrap_or(Value::Null)),
                        Err(e) => Err(CallError::Rpc(e)),
                    }
                }
                Some(Message::Notification(n)) => match on_note.as_mut() {
                    Some(f) => f(&n),
                    None => self.notifications.push_back(n),
                },
                Some(_) => {}
            }
        }
    }
}
