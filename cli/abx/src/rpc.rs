//! `abx rpc`: a stdio bridge to the daemon.
//!
//! Frames from stdin (either framing, detected from the first byte) go to the daemon;
//! replies and notifications come back in the framing stdin used. When stdin closes, the
//! bridge waits until every request it forwarded has been answered and every exec stream
//! it saw start (`exec/start`, `exec/attach`) has delivered its `exec/exit`, then exits.

use abx_client::client::Client;
use abx_home::Paths;
use abx_protocol::codec::{Frame, FrameCodec, Framing};
use abx_protocol::message::{self, Incoming, Message};
use abx_protocol::{AbxError, ErrorCode, Id, DEFAULT_MAX_MESSAGE_SIZE};
use bytes::BytesMut;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Track {
    /// Request id -> method, awaiting a response.
    pending: HashMap<Id, String>,
    /// Replies expected with a null id (undecodable input).
    pending_null: usize,
    /// Batches awaiting their array reply.
    pending_batches: usize,
    /// Exec streams whose exec/exit has not arrived.
    streams: HashSet<String>,
    stdin_done: bool,
}

impl Track {
    fn idle(&self) -> bool {
        self.pending.is_empty()
            && self.pending_null == 0
            && self.pending_batches == 0
            && self.streams.is_empty()
    }
}

/// Bytes read at a time from either side.
const READ_CHUNK: usize = 64 * 1024;

/// Run the bridge. The daemon is reached (and started, and version-checked) through the
/// async client; then the bridge is two plain threads on blocking descriptors, one per
/// direction: a message costs one read and one write each way, with no task or thread
/// hand-off in between (tokio's stdin and stdout run every read and write on its blocking
/// pool, which cost more than the daemon's whole hop to a plugin).
pub async fn run(paths: &Paths) -> Result<(), AbxError> {
    let client = Client::connect_handshake(paths).await?;
    let (from_daemon, to_daemon) = client.into_parts();
    let leftover = from_daemon.read_buffer().clone();
    let socket = blocking_socket(from_daemon.get_ref().as_ref())
        .map_err(|e| AbxError::detail(ErrorCode::BrokerUnreachable, e))?;
    drop(from_daemon);
    // Not a shutdown of the shared socket's sending side, as dropping the half would be.
    to_daemon.forget();
    // Nothing else runs on this (current-thread) runtime: blocking it is fine.
    bridge(socket, leftover)
}

/// A blocking duplicate of the daemon connection's descriptor.
fn blocking_socket(s: &tokio::net::UnixStream) -> std::io::Result<std::os::unix::net::UnixStream> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let fd = s.as_raw_fd();
    // SAFETY: dup of a descriptor we hold; the copy is owned by the UnixStream.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(dup) };
    // The file description is shared with tokio's copy (dropped right after): blocking now.
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Stdout, written whole messages at a time by whichever side has one.
struct Stdout(std::mem::ManuallyDrop<std::fs::File>);

impl Stdout {
    fn write(&self, bytes: &[u8]) -> bool {
        use std::io::Write;
        (&*self.0).write_all(bytes).is_ok()
    }
}

fn bridge(socket: std::os::unix::net::UnixStream, leftover: BytesMut) -> Result<(), AbxError> {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    let track = Arc::new(Mutex::new(Track::default()));
    // Which framing the client speaks (from its first message; replies use it).
    let framing = Arc::new(Mutex::new(Framing::Line));
    // SAFETY: fds 0 and 1 are ours for the process's life; ManuallyDrop never closes them.
    let stdout = Arc::new(Mutex::new(Stdout(std::mem::ManuallyDrop::new(unsafe {
        std::fs::File::from_raw_fd(1)
    }))));
    let to_daemon = socket
        .try_clone()
        .map_err(|e| AbxError::detail(ErrorCode::BrokerUnreachable, e))?;

    let (t_in, f_in, out_in) = (track.clone(), framing.clone(), stdout.clone());
    std::thread::Builder::new()
        .name("abx-rpc-stdin".into())
        .spawn(move || {
            let mut to_daemon = to_daemon;
            // SAFETY: see above.
            let mut stdin = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
            let mut codec = FrameCodec::new(DEFAULT_MAX_MESSAGE_SIZE);
            let mut buf = BytesMut::with_capacity(READ_CHUNK);
            let mut framing_set = false;
            let mut send = Vec::with_capacity(READ_CHUNK);
            let mut eof = false;
            'read: while !eof {
                buf.reserve(READ_CHUNK);
                let spare = buf.spare_capacity_mut();
                // SAFETY: reading into spare capacity; only the bytes read are exposed.
                match (*stdin).read(unsafe {
                    std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<u8>(), spare.len())
                }) {
                    Ok(0) | Err(_) => eof = true,
                    // SAFETY: n bytes were just written into the spare capacity.
                    Ok(n) => unsafe { buf.set_len(buf.len() + n) },
                }
                send.clear();
                loop {
                    // At EOF a last message without its newline still counts.
                    let next = if eof {
                        tokio_util::codec::Decoder::decode_eof(&mut codec, &mut buf)
                    } else {
                        tokio_util::codec::Decoder::decode(&mut codec, &mut buf)
                    };
                    let frame = match next {
                        Ok(Some(f)) => f,
                        Ok(None) => break,
                        Err(e) => {
                            let e = AbxError::detail(ErrorCode::ParseError, e);
                            reply_to_client(
                                &out_in,
                                &f_in,
                                &message::encode_response(None, Err(&e.to_rpc())),
                            );
                            eof = true;
                            break;
                        }
                    };
                    if !framing_set {
                        if let Some(f) = codec.framing() {
                            *f_in.lock().expect("framing") = f;
                            framing_set = true;
                        }
                    }
                    match frame {
                        Frame::Message(mut body) => {
                            record_outgoing(&t_in, &body);
                            for b in body.iter_mut() {
                                if *b == b'\n' || *b == b'\r' {
                                    *b = b' ';
                                }
                            }
                            send.extend_from_slice(&body);
                            send.push(b'\n');
                        }
                        Frame::TooLarge { .. } => {
                            let e = AbxError::new(
                                ErrorCode::MessageTooLarge,
                                &[
                                    ("size", ""),
                                    ("limit", &DEFAULT_MAX_MESSAGE_SIZE.to_string()),
                                ],
                            );
                            reply_to_client(
                                &out_in,
                                &f_in,
                                &message::encode_response(None, Err(&e.to_rpc())),
                            );
                        }
                    }
                }
                if !send.is_empty() && to_daemon.write_all(&send).is_err() {
                    break 'read;
                }
            }
            let mut t = t_in.lock().expect("track");
            t.stdin_done = true;
            if t.idle() {
                // Nothing more will come back that anyone waits for: end the other side.
                let _ = to_daemon.shutdown(std::net::Shutdown::Both);
            }
        })
        .map_err(|e| AbxError::internal(format!("thread: {e}")))?;

    let mut from_daemon = socket;
    let mut codec = FrameCodec::new(usize::MAX >> 1);
    let mut buf = leftover;
    let mut out = BytesMut::with_capacity(READ_CHUNK);
    loop {
        out.clear();
        let mut done = false;
        loop {
            match tokio_util::codec::Decoder::decode(&mut codec, &mut buf) {
                Ok(Some(Frame::Message(body))) => {
                    record_incoming(&track, &body);
                    let f = *framing.lock().expect("framing");
                    f.write(&body, &mut out);
                }
                Ok(Some(Frame::TooLarge { .. })) | Err(_) => {
                    done = true;
                    break;
                }
                Ok(None) => break,
            }
        }
        if !out.is_empty() && !stdout.lock().expect("stdout").write(&out) {
            break;
        }
        {
            let t = track.lock().expect("track");
            if done || (t.stdin_done && t.idle()) {
                break;
            }
        }
        buf.reserve(READ_CHUNK);
        let spare = buf.spare_capacity_mut();
        // SAFETY: reading into spare capacity; only the bytes read are exposed.
        let n = match from_daemon.read(unsafe {
            std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<u8>(), spare.len())
        }) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // SAFETY: n bytes were just written into the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
    }
    let _ = from_daemon.flush();
    Ok(())
}

/// An error of the bridge itself, in the client's framing.
fn reply_to_client(out: &Mutex<Stdout>, framing: &Mutex<Framing>, body: &[u8]) {
    let mut b = BytesMut::new();
    framing.lock().expect("framing").write(body, &mut b);
    out.lock().expect("stdout").write(&b);
}

fn record_outgoing(track: &Mutex<Track>, body: &[u8]) {
    let mut t = track.lock().expect("track");
    match message::decode(body) {
        Incoming::Single(Ok(Message::Request(r))) => {
            t.pending.insert(r.id, r.method);
        }
        Incoming::Single(Ok(_)) => {}
        Incoming::Single(Err(inv)) => match inv.id {
            Some(id) => {
                t.pending.insert(id, String::new());
            }
            None => t.pending_null += 1,
        },
        Incoming::Batch(items) => {
            let mut expects = false;
            for item in items {
                match item {
                    Ok(Message::Request(r)) => {
                        expects = true;
                        t.pending.insert(r.id, r.method);
                    }
                    Ok(_) => {}
                    Err(_) => expects = true,
                }
            }
            if expects {
                t.pending_batches += 1;
            }
        }
    }
}

fn record_incoming(track: &Mutex<Track>, body: &[u8]) {
    let mut t = track.lock().expect("track");
    match message::decode(body) {
        Incoming::Single(Ok(m)) => record_one(&mut t, m),
        Incoming::Batch(items) => {
            t.pending_batches = t.pending_batches.saturating_sub(1);
            for m in items.into_iter().flatten() {
                record_one(&mut t, m);
            }
        }
        Incoming::Single(Err(_)) => {}
    }
}

fn record_one(t: &mut Track, m: Message) {
    match m {
        Message::Response(r) => match r.id {
            Some(id) => {
                let method = t.pending.remove(&id).unwrap_or_default();
                if matches!(method.as_str(), "exec/start" | "exec/attach") {
                    if let Ok(raw) = &r.outcome {
                        if let Ok(v) = serde_json::from_str::<Value>(raw.get()) {
                            if let Some(e) = v.get("execId").and_then(Value::as_str) {
                                t.streams.insert(e.to_owned());
                            }
                        }
                    }
                }
            }
            None => t.pending_null = t.pending_null.saturating_sub(1),
        },
        Message::Notification(n) if n.method == "exec/exit" => {
            if let Some(p) = n.params {
                if let Ok(v) = serde_json::from_str::<Value>(p.get()) {
                    if let Some(e) = v.get("execId").and_then(Value::as_str) {
                        t.streams.remove(e);
                    }
                }
            }
        }
        _ => {}
    }
}
