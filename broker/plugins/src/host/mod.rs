//! The EPP/1 host: one child process per provider, shared by every client (docs/design.md#epp).
//!
//! Three tasks per running child (after helix-lsp): a reader (stdout: replies and
//! notifications), a stderr logger (secrets redacted, last lines kept for error details)
//! and a writer (stdin). The host owns the id counter and the map of pending calls; clients'
//! ids never reach the plugin.
//!
//! - **Handshake:** `initialize` must answer `protocol: "EPP/1"`, the manifest's id, and
//!   features that the manifest declares (else E8002/E8003); then `initialized`.
//! - **Streams:** when a reply to `exec/start`/`exec/attach`/`files/watch` passes, the reader
//!   records which connection owns that exec or watch id, and the stream's notifications go
//!   to it alone, through a per-stream forwarder that waits until the client has the reply.
//! - **Faults:** end of stdout fails every pending call with E8007 and the tail of stderr;
//!   garbage or an oversized line kills the child (E8009); a call that gets no answer in time
//!   is E8008. The next call restarts the child after a backoff; five crashes in a minute
//!   disable it until `provider/doctor` or a reinstall resets it, and so do five failed
//!   starts in a row (a plugin that hangs at the handshake fails only every 15 s).
//! - **Idle:** a child without calls or streams for `ABX_PLUGIN_IDLE_SECS` (300) is stopped.
//! - **Launch:** the child is the plugin launcher ([`super::launch`]): namespaces, a private
//!   copy verified as it is made, then the plugin. Its status line (fd 3) comes before the
//!   handshake: an integrity failure there is E8011 (not a crash), a setup failure E8002.
//!   `pid` is the launcher's: killing it ends the plugin's PID namespace.
//!
//! The host by job: [`spawn`] starts a child (the launcher's command, the stderr logger,
//! the stdin writer, the child's end, the handshake); [`calls`] sends a call and waits for
//! its reply, with [`inflight`] keeping the calls in flight and their deadlines (the
//! sweeper); [`reader`] is the read loop over the child's stdout; [`restarts`] decides when a
//! new child may start (backoff, crash-loop disabling) and what the status says. This file
//! holds the [`Host`] itself: its state, its lifecycle (stop, idle stop) and stream routes.

mod calls;
mod inflight;
mod reader;
mod restarts;
mod spawn;
#[cfg(test)]
mod tests;

pub use inflight::MAX_CALL_WAIT;
pub use reader::LINE_ALLOWANCE;
pub use restarts::HostStatus;
pub use spawn::{Handshake, Spec};

use crate::stream;
use abx_core::outbound::Outbound;
use abx_protocol::message;
use abx_protocol::{AbxError, Id};
use inflight::{Lent, Pending};
use restarts::State;
use serde_json::{json, Value};
use spawn::Running;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// One plugin's host.
pub struct Host {
    spec: Mutex<Spec>,
    state: tokio::sync::Mutex<State>,
    status: Mutex<HostStatus>,
}

impl Host {
    /// A host for `spec`; nothing starts until the first call.
    pub fn new(spec: Spec) -> Arc<Host> {
        let host = Arc::new(Host {
            spec: Mutex::new(spec),
            state: tokio::sync::Mutex::new(State::default()),
            status: Mutex::new(HostStatus::default()),
        });
        let weak = Arc::downgrade(&host);
        tokio::spawn(async move { idle_reaper(weak).await });
        host
    }

    fn id(&self) -> String {
        self.spec.lock().expect("spec").id.clone()
    }

    /// The plugin's confinement.
    pub fn permissions(&self) -> Arc<crate::permissions::Plan> {
        self.spec.lock().expect("spec").permissions.clone()
    }

    /// Replace the spec (new config or a reinstall); the running child is stopped.
    pub async fn respec(&self, spec: Spec) {
        *self.spec.lock().expect("spec") = spec;
        self.stop().await;
        let mut st = self.state.lock().await;
        st.disabled = None;
        st.crashes.clear();
        st.failed_starts = 0;
    }

    /// Status for `broker/status` and doctor.
    pub fn status(&self) -> HostStatus {
        self.status.lock().expect("status").clone()
    }

    /// Forget the crash history (doctor, reinstall).
    pub async fn reset(&self) {
        let mut st = self.state.lock().await;
        st.disabled = None;
        st.crashes.clear();
        st.failed_starts = 0;
        st.publish(&self.status);
    }

    /// The running child, started (with its handshake) if needed.
    async fn running(&self) -> Result<Arc<Running>, AbxError> {
        let mut st = self.state.lock().await;
        st.last_used = Some(Instant::now());
        if let Some(r) = st.running.clone() {
            if !r.dead.is_cancelled() {
                return Ok(r);
            }
        }
        // Boxed: the start and its backoff are a large future that every call's future
        // would otherwise carry (and copy) for the rare call that starts the plugin.
        Box::pin(restarts::start_locked(st, &self.spec, &self.status)).await
    }

    /// The handshake of the running child (starting it if needed).
    pub async fn handshake(&self) -> Result<Handshake, AbxError> {
        Ok(self.running().await?.handshake.clone())
    }

    /// True when a stream id (exec or watch) is routed through this host and has not
    /// ended (an exec's `exec/exit` not seen yet).
    pub async fn has_route(&self, stream: &str) -> bool {
        let st = self.state.lock().await;
        st.running.as_ref().is_some_and(|r| {
            r.routes
                .lock()
                .expect("routes")
                .get(stream)
                .is_some_and(|r| !r.ended)
        })
    }

    /// `exec/attach` served by the host: when the running plugin's exec `exec_id` has a
    /// route (it runs, or its exit reached no client yet), its stream goes to `conn` from
    /// now on and what was kept while nobody received it is replayed after the reply
    /// (`replied`). `None`: no such route (the plugin is asked instead).
    pub async fn attach(
        &self,
        exec_id: &str,
        conn: Outbound,
        replied: CancellationToken,
    ) -> Option<Value> {
        let running = self.state.lock().await.running.clone()?;
        let tx = running
            .routes
            .lock()
            .expect("routes")
            .get(exec_id)
            .map(|r| r.tx.clone())?;
        let a = stream::attach(&tx, conn, replied).await?;
        Some(json!({
            "execId": exec_id,
            "running": a.running,
            "replayed": a.replayed,
            "droppedBytes": a.dropped_bytes,
        }))
    }

    /// Stop the child: `shutdown`, `exit`, then kill after a grace period.
    pub async fn stop(&self) {
        let running = self.state.lock().await.running.take();
        let Some(r) = running else { return };
        let (tx, rx) = oneshot::channel();
        let id_num = r.next_id.fetch_add(1, Ordering::Relaxed);
        r.pending.lock().expect("pending").insert(
            id_num,
            Pending {
                method: "shutdown".into(),
                reply: tx,
                conn: None,
                replied: None,
                deadline: None,
                counted: Lent::default(),
            },
        );
        let mut line = message::encode_request(&Id::Num(id_num), "shutdown", None::<&Value>);
        line.push(b'\n');
        let _ = r.writer.send(line);
        let _ = tokio::time::timeout(Duration::from_secs(2), rx).await;
        let mut exit = message::encode_notification("exit", None::<&Value>);
        exit.push(b'\n');
        let _ = r.writer.send(exit);
        if tokio::time::timeout(Duration::from_secs(2), r.dead.cancelled())
            .await
            .is_err()
        {
            r.kill.cancel();
        }
        let st = self.state.lock().await;
        st.publish(&self.status);
    }
}

async fn idle_reaper(weak: std::sync::Weak<Host>) {
    let idle = std::env::var("ABX_PLUGIN_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(300), Duration::from_secs);
    loop {
        tokio::time::sleep(
            idle.min(Duration::from_secs(5))
                .max(Duration::from_millis(200)),
        )
        .await;
        let Some(host) = weak.upgrade() else { return };
        let stop = {
            let st = host.state.lock().await;
            match (&st.running, st.last_used) {
                (Some(r), Some(t)) => {
                    t.elapsed() >= idle
                        && r.pending.lock().expect("pending").is_empty()
                        && r.routes.lock().expect("routes").is_empty()
                }
                _ => false,
            }
        };
        if stop {
            info!(provider = %host.id(), "stopping idle plugin");
            host.stop().await;
        }
    }
}
