//! Restarts: a plugin's lifetime state across its children (crashes in the last minute,
//! failed starts in a row, why it is disabled), the backoff before a new child, the
//! crash-loop disabling, and the status `broker/status` and doctor show.

use super::spawn::{start, Running, Spec};
use abx_protocol::{AbxError, ErrorCode};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::info;

/// Crashes within [`CRASH_WINDOW`] that disable a plugin.
pub(super) const CRASH_LIMIT: usize = 5;
pub(super) const CRASH_WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(super) struct State {
    pub(super) running: Option<Arc<Running>>,
    pub(super) crashes: VecDeque<Instant>,
    /// Starts that failed in a row (no handshake since): a plugin that hangs at the
    /// handshake fails once per 15 s, never five times in a minute, and is disabled by this.
    pub(super) failed_starts: usize,
    pub(super) restarts: u64,
    pub(super) disabled: Option<String>,
    pub(super) last_used: Option<Instant>,
    pub(super) last_error: Option<String>,
}

/// What `broker/status` and doctor show about a host.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostStatus {
    /// A child is running.
    pub running: bool,
    /// Its pid.
    pub pid: Option<u32>,
    /// Calls waiting for an answer.
    pub in_flight: usize,
    /// Restarts so far.
    pub restarts: u64,
    /// Why it is disabled, if it is.
    pub disabled: Option<String>,
    /// The last failure.
    pub last_error: Option<String>,
    /// How the running child is isolated: `namespaces`, or `none: <why>`.
    pub isolation: Option<String>,
}

impl State {
    /// Show this state in `status` (`broker/status`, doctor).
    pub(super) fn publish(&self, status: &Mutex<HostStatus>) {
        let st = self;
        let mut s = status.lock().expect("status");
        s.running = st.running.is_some();
        s.pid = st.running.as_ref().map(|r| r.pid);
        s.isolation = st.running.as_ref().map(|r| r.isolation.clone());
        s.in_flight = st
            .running
            .as_ref()
            .map_or(0, |r| r.pending.lock().expect("pending").len());
        s.restarts = st.restarts;
        s.disabled = st.disabled.clone();
        s.last_error = st.last_error.clone();
    }
}

/// [`super::Host`]'s slow path to its running child: the child is not running (it died, or
/// never started). A child that died on its own counts as a crash; a disabled plugin is
/// refused; recent crashes back the start off; a failed start counts toward disabling.
pub(super) async fn start_locked(
    mut st: tokio::sync::MutexGuard<'_, State>,
    spec: &Mutex<Spec>,
    status: &Mutex<HostStatus>,
) -> Result<Arc<Running>, AbxError> {
    if st.running.is_some() {
        // It died on its own (stop() takes it out of the state first): a crash.
        st.running = None;
        st.crashes.push_back(Instant::now());
        st.last_error = Some("the plugin exited".into());
        if st.crashes.len() >= CRASH_LIMIT {
            st.disabled = Some(format!("crashed {} times in a minute", st.crashes.len()));
        }
    }
    let id = spec.lock().expect("spec").id.clone();
    if let Some(why) = &st.disabled {
        return Err(AbxError::new(
            ErrorCode::PluginCrashed,
            &[("provider", &id), ("detail", why)],
        )
        .with_suggestion(format!(
            "It was disabled after crashing repeatedly; run 'abx provider doctor {id}' to retry."
        )));
    }
    // Backoff after recent crashes: 0, 100 ms, 200 ms, 400 ms ...
    let now = Instant::now();
    st.crashes.retain(|t| now.duration_since(*t) < CRASH_WINDOW);
    if let Some(last) = st.crashes.back() {
        let backoff = Duration::from_millis(100 * (1 << st.crashes.len().min(5)) / 2);
        let since = now.duration_since(*last);
        if since < backoff {
            tokio::time::sleep(backoff - since).await;
        }
    }
    let spec = spec.lock().expect("spec").clone();
    match start(&spec).await {
        Ok(r) => {
            st.failed_starts = 0;
            if !st.crashes.is_empty() {
                info!(provider = %id, "plugin restarted");
                st.restarts += 1;
            }
            st.running = Some(r.clone());
            st.publish(status);
            Ok(r)
        }
        Err(e) if e.code == ErrorCode::IntegrityFailed => {
            // The private copy did not match: nothing ran, nothing crashed.
            st.last_error = Some(e.message.clone());
            st.publish(status);
            Err(e)
        }
        Err(e) => {
            st.crashes.push_back(Instant::now());
            st.failed_starts += 1;
            st.last_error = Some(e.message.clone());
            if st.crashes.len() >= CRASH_LIMIT {
                st.disabled = Some(format!(
                    "failed {} times in a minute: {}",
                    st.crashes.len(),
                    e.message
                ));
            } else if st.failed_starts >= CRASH_LIMIT {
                st.disabled = Some(format!(
                    "failed to start {} times in a row: {}",
                    st.failed_starts, e.message
                ));
            }
            st.publish(status);
            Err(e)
        }
    }
}
