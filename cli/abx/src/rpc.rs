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
use futures::StreamExt;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Notify};
use tokio_util::codec::FramedRead;

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

/// Run the bridge until stdin closes and everything is answered, or the daemon goes away.
pub async fn run(paths: &Paths) -> Result<(), AbxError> {
    let client = Client::connect(paths).await?;
    let (mut from_daemon, mut to_daemon) = client.into_parts();
    let track = Arc::new(Mutex::new(Track::default()));
    let changed = Arc::new(Notify::new());
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(256);
    let framing = Arc::new(Mutex::new(Framing::Line));

    // stdout writer
    let framing_w = framing.clone();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        let mut buf = BytesMut::new();
        while let Some(body) = out_rx.recv().await {
            let f = *framing_w.lock().expect("framing");
            f.write(&body, &mut buf);
            while let Ok(more) = out_rx.try_recv() {
                f.write(&more, &mut buf);
                if buf.len() > 256 * 1024 {
                    break;
                }
            }
            if stdout.write_all(&buf).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
            buf.clear();
        }
    });

    // stdin -> daemon
    let (t_in, c_in, f_in, out_in) = (
        track.clone(),
        changed.clone(),
        framing.clone(),
        out_tx.clone(),
    );
    let reader = tokio::spawn(async move {
        let mut stdin = FramedRead::new(
            tokio::io::stdin(),
            FrameCodec::new(DEFAULT_MAX_MESSAGE_SIZE),
        );
        let mut framing_set = false;
        while let Some(frame) = stdin.next().await {
            if !framing_set {
                if let Some(f) = stdin.decoder().framing() {
                    *f_in.lock().expect("framing") = f;
                    framing_set = true;
                }
            }
            match frame {
                Ok(Frame::Message(mut body)) => {
                    record_outgoing(&t_in, &body);
                    // Newlines in JSON are only ever whitespace: flatten for line framing.
                    for b in body.iter_mut() {
                        if *b == b'\n' || *b == b'\r' {
                            *b = b' ';
                        }
                    }
                    body.extend_from_slice(b"\n");
                    if to_daemon.write_all(&body).await.is_err() {
                        break;
                    }
                }
                Ok(Frame::TooLarge { .. }) => {
                    let e = AbxError::new(
                        ErrorCode::MessageTooLarge,
                        &[
                            ("size", ""),
                            ("limit", &DEFAULT_MAX_MESSAGE_SIZE.to_string()),
                        ],
                    );
                    let _ = out_in
                        .send(message::encode_response(None, Err(&e.to_rpc())))
                        .await;
                }
                Err(e) => {
                    let e = AbxError::detail(ErrorCode::ParseError, e);
                    let _ = out_in
                        .send(message::encode_response(None, Err(&e.to_rpc())))
                        .await;
                    break;
                }
            }
        }
        let _ = to_daemon.flush().await;
        t_in.lock().expect("track").stdin_done = true;
        c_in.notify_one();
        to_daemon
    });

    // daemon -> stdout, until idle after stdin closed
    loop {
        {
            let t = track.lock().expect("track");
            if t.stdin_done && t.idle() {
                break;
            }
        }
        let msg = tokio::select! {
            m = from_daemon.next() => m,
            _ = changed.notified() => continue,
        };
        match msg {
            None | Some(Err(_)) => break,
            Some(Ok(Frame::TooLarge { .. })) => break,
            Some(Ok(Frame::Message(body))) => {
                record_incoming(&track, &body);
                if out_tx.send(body.to_vec()).await.is_err() {
                    break;
                }
            }
        }
    }
    reader.abort();
    drop(out_tx);
    let _ = writer.await;
    Ok(())
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
