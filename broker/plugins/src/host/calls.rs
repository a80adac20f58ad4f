//! Calls: a request to the plugin and the wait for its reply. The line is written by the
//! caller when stdin is idle ([`Running::send`]); the call is tracked for the sweeper
//! ([`super::inflight`]); the only call in flight to a fast plugin has its reply polled for
//! (`pace.rs`); a call dropped unanswered sends `$/cancelRequest`.

use super::inflight::{cancel_line, track, Calls, Lent, Pending, MAX_CALL_WAIT};
use super::restarts::HostStatus;
use super::spawn::{last_lines, Running};
use super::Host;
use crate::pace::{self, Spinner};
use abx_core::outbound::{Hold, Outbound};
use abx_protocol::epp::redact;
use abx_protocol::message;
use abx_protocol::{AbxError, ErrorCode, Id};
use serde_json::value::RawValue;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// The one thread of the daemon that may be polling for a plugin's reply.
pub(super) static SPINNER: Spinner = Spinner::new();

impl Host {
    /// Call a method on the plugin. `conn` and `replied` route the stream that the reply may
    /// open (exec/start, files/watch) to the calling connection. `hold`: the request's reply
    /// budget, lent while the plugin answers and given back with the reply's own (see
    /// [`Pending::counted`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn call<P: serde::Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        conn: Option<Outbound>,
        replied: Option<CancellationToken>,
        cancel: Option<CancellationToken>,
        timeout: Option<Duration>,
        hold: Option<Hold>,
    ) -> Result<Box<RawValue>, AbxError> {
        let encode = |id: &Id| message::encode_request(id, method, Some(params));
        self.call_encoded(method, encode, conn, replied, cancel, timeout, hold)
            .await
    }

    /// [`Host::call`] with params the host owns: they are freed once the request line
    /// is written, not held until the reply (a 64 MiB `files/write` is held once, briefly).
    #[allow(clippy::too_many_arguments)]
    pub async fn call_owned(
        &self,
        method: &str,
        params: Box<RawValue>,
        conn: Option<Outbound>,
        replied: Option<CancellationToken>,
        cancel: Option<CancellationToken>,
        timeout: Option<Duration>,
        hold: Option<Hold>,
    ) -> Result<Box<RawValue>, AbxError> {
        let encode = move |id: &Id| message::encode_request(id, method, Some(&*params));
        self.call_encoded(method, encode, conn, replied, cancel, timeout, hold)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn call_encoded(
        &self,
        method: &str,
        encode: impl FnOnce(&Id) -> Vec<u8>,
        conn: Option<Outbound>,
        replied: Option<CancellationToken>,
        cancel: Option<CancellationToken>,
        timeout: Option<Duration>,
        hold: Option<Hold>,
    ) -> Result<Box<RawValue>, AbxError> {
        let r = self.running().await?;
        let id_num = r.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let spec_timeout = self.spec.lock().expect("spec").call_timeout;
        let limit = timeout.unwrap_or(spec_timeout).min(MAX_CALL_WAIT);
        let counted = Lent {
            permit: hold.as_ref().and_then(|h| h.lock().expect("hold").take()),
            back: hold,
        };
        let call = Pending {
            method: method.to_owned(),
            reply: tx,
            conn,
            replied,
            deadline: Some((Instant::now() + limit, limit)),
            counted,
        };
        let n = track(&r.pending, &r.sweep, id_num, call);
        // `broker/status` counts it from now on (one uncontended lock, no allocation).
        self.status.lock().expect("status").in_flight = n;
        // `encode` owns what it encodes: owned params are freed here, before the wait.
        let mut line = encode(&Id::Num(id_num));
        line.push(b'\n');
        let sent = Instant::now();
        if !r.send(line) {
            r.pending.lock().expect("pending").remove(&id_num);
            return Err(self.crashed_error(&r, "its stdin is closed"));
        }
        // The only call in flight to a plugin that answers within microseconds: its reply
        // is polled for before this task waits, so no sleeping CPU has to wake for it.
        if n == 1 {
            if let Some(fd) = &r.watch {
                let budget = r.pace.budget(pace::cpus());
                if !budget.is_zero() {
                    SPINNER.poll(fd.as_fd(), sent, budget);
                }
            }
        }
        // If this call is dropped unanswered (the client cancelled, or went away), the plugin
        // hears `$/cancelRequest` for it; answered or not, the count of calls in flight is
        // brought up to date (only that changes per call, the rest of the status when the
        // process starts, stops or fails: no allocation on this path).
        let _guard = CancelOnDrop {
            writer: &r.writer,
            pending: &r.pending,
            id: id_num,
            status: &self.status,
        };
        let cancelled = async {
            match &cancel {
                Some(c) => c.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // The reply, or E8008 from the sweeper (which told the plugin to cancel).
            res = rx => match res {
                Ok(res) => {
                    r.pace.record(sent.elapsed());
                    res
                }
                Err(_) => Err(self.crashed_error(&r, "it exited")),
            },
            // (The guard tells the plugin.)
            _ = cancelled => Err(AbxError::new(ErrorCode::RequestCancelled, &[])),
        }
    }

    fn crashed_error(&self, r: &Running, what: &str) -> AbxError {
        let secrets = self.spec.lock().expect("spec").secrets.clone();
        let tail = last_lines(&r.stderr_tail, 3);
        let detail = if tail.is_empty() {
            what.to_owned()
        } else {
            format!("{what}; stderr: {}", redact(&tail.join(" | "), &secrets))
        };
        AbxError::new(
            ErrorCode::PluginCrashed,
            &[("provider", &self.id()), ("detail", &detail)],
        )
    }
}

pub(super) struct CancelOnDrop<'a> {
    pub(super) writer: &'a mpsc::UnboundedSender<Vec<u8>>,
    pub(super) pending: &'a Mutex<Calls>,
    pub(super) id: i64,
    pub(super) status: &'a Mutex<HostStatus>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let (unanswered, in_flight) = {
            let mut pending = self.pending.lock().expect("pending");
            (pending.remove(&self.id).is_some(), pending.len())
        };
        if unanswered {
            let _ = self.writer.send(cancel_line(self.id));
        }
        self.status.lock().expect("status").in_flight = in_flight;
    }
}
