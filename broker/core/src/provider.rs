//! The provider abstraction: builtin providers and (later) EPP/1 plugins behind one trait,
//! and the registry the broker routes provider methods through.
//!
//! Routing of a provider method (see [`crate::dispatch`]):
//! 1. find the provider: the `sandbox` param (`provider:id`, or a bare id looked up in the
//!    [`crate::index`]), an `execId`/`watchId` the broker saw start, the `provider` param,
//!    or the default provider;
//! 2. gate: the method's feature (docs/design.md#features) must be declared, else E8004 before the
//!    provider is reached;
//! 3. rewrite `sandbox` to the provider's own id and call it;
//! 4. record what the reply creates (sandbox ids, exec ids, watch ids).

use crate::outbound::Outbound;
use abx_protocol::{AbxError, ErrorCode};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use tokio_util::sync::CancellationToken;

/// A boxed, sendable future.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A provider's reply: raw JSON or a typed error.
pub type Reply = Result<Box<RawValue>, AbxError>;

/// What a provider call gets besides its params.
#[derive(Clone)]
pub struct CallCx {
    /// The calling connection: stream notifications and progress go here.
    pub conn: Outbound,
    /// Cancelled by `$/cancelRequest` or when the caller goes away.
    pub cancel: CancellationToken,
    /// Fired once the reply to this call is queued: stream notifications wait for it.
    pub replied: CancellationToken,
    /// Where a handler deposits the pool bytes that already count its reply's memory
    /// (see [`crate::outbound::Hold`]).
    pub hold: crate::outbound::Hold,
}

/// How a provider is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Compiled into the broker.
    Builtin,
    /// An EPP/1 child process.
    Exec,
}

/// A provider's summary (what `provider/list` shows).
#[derive(Clone, Debug, Serialize)]
pub struct ProviderSummary {
    /// Id, e.g. `local`.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Version.
    pub version: String,
    /// builtin or exec.
    pub kind: Kind,
    /// builtin / pinned / unpinned / local.
    pub trust: String,
    /// Declared features.
    pub features: Vec<String>,
    /// Human description.
    pub description: String,
}

/// A sandbox provider.
pub trait Provider: Send + Sync + std::any::Any {
    /// Its summary.
    fn summary(&self) -> &ProviderSummary;

    /// Extra `provider/info` fields (security, runtime, ...).
    fn info(&self) -> Value {
        Value::Null
    }

    /// True when this provider knows the (provider-local) sandbox id.
    fn owns(&self, _sandbox: &str) -> bool {
        false
    }

    /// How many sandboxes it holds, when it knows without a call.
    fn sandbox_count(&self) -> usize {
        0
    }

    /// Serve one provider method. `params` already has `sandbox` rewritten to the
    /// provider's own id. Gating has been done by the caller.
    fn call<'a>(&'a self, cx: &'a CallCx, method: &'a str, params: Value) -> BoxFut<'a, Reply>;

    /// True when the broker should hand this provider its params raw ([`Provider::call_raw`]):
    /// a plugin forwards them unread. A provider that reads them (the builtin `local`) gets a
    /// `Value` built once ([`Provider::call`]).
    fn takes_raw(&self) -> bool {
        false
    }

    /// The same from raw params, as the broker routes them (`sandbox` already rewritten,
    /// `provider` removed): what [`crate::dispatch`] calls. The default parses them and
    /// calls [`Provider::call`]; a provider that passes params through unread (a plugin)
    /// overrides it, so nothing builds a `Value` tree of them.
    fn call_raw<'a>(
        &'a self,
        cx: &'a CallCx,
        method: &'a str,
        params: Box<RawValue>,
    ) -> BoxFut<'a, Reply> {
        Box::pin(async move {
            let v: Value = serde_json::from_str(params.get())
                .map_err(|e| AbxError::invalid_params(method, e))?;
            self.call(cx, method, v).await
        })
    }

    /// Called when the broker stops.
    fn shutdown(&self) -> BoxFut<'_, ()> {
        Box::pin(async {})
    }
}

/// The installed providers and the default.
pub struct Registry {
    providers: RwLock<Vec<Arc<dyn Provider>>>,
    default: RwLock<String>,
}

impl Registry {
    /// A registry holding `providers`; the first is the default unless `ABX_PROVIDER` names
    /// another (resolved per call, see [`Registry::default_id`]).
    pub fn new(providers: Vec<Arc<dyn Provider>>) -> Registry {
        let default = providers
            .first()
            .map(|p| p.summary().id.clone())
            .unwrap_or_default();
        Registry {
            providers: RwLock::new(providers),
            default: RwLock::new(default),
        }
    }

    /// Every provider.
    pub fn all(&self) -> Vec<Arc<dyn Provider>> {
        self.providers.read().expect("registry lock").clone()
    }

    /// The providers that declare `feature`.
    pub fn with_feature(&self, feature: &str) -> Vec<Arc<dyn Provider>> {
        self.all()
            .into_iter()
            .filter(|p| p.summary().features.iter().any(|f| f == feature))
            .collect()
    }

    /// A provider by id, or E8001.
    pub fn get(&self, id: &str) -> Result<Arc<dyn Provider>, AbxError> {
        // Under the read lock: only the provider found is cloned, not the whole list.
        self.providers
            .read()
            .expect("registry lock")
            .iter()
            .find(|p| p.summary().id == id)
            .cloned()
            .ok_or_else(|| AbxError::new(ErrorCode::ProviderNotInstalled, &[("provider", id)]))
    }

    /// Add a provider, replacing one with the same id.
    pub fn upsert(&self, p: Arc<dyn Provider>) {
        let mut all = self.providers.write().expect("registry lock");
        all.retain(|x| x.summary().id != p.summary().id);
        all.push(p);
    }

    /// Remove a provider.
    pub fn remove(&self, id: &str) {
        self.providers
            .write()
            .expect("registry lock")
            .retain(|x| x.summary().id != id);
    }

    /// The configured default provider id.
    pub fn default_id(&self) -> String {
        self.default.read().expect("registry lock").clone()
    }

    /// Set the default provider.
    pub fn set_default(&self, id: &str) -> Result<(), AbxError> {
        self.get(id)?;
        *self.default.write().expect("registry lock") = id.to_owned();
        Ok(())
    }

    /// The provider that owns a bare sandbox id, asking each.
    pub fn owner_of(&self, sandbox: &str) -> Option<Arc<dyn Provider>> {
        self.all().into_iter().find(|p| p.owns(sandbox))
    }
}

/// How long each provider may take to say whether it holds a bare sandbox id.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The providers that hold a bare sandbox id none of them claimed and the index does not
/// know (made directly on a provider's server, or by another broker): each provider with
/// `sandbox.lifecycle` is asked `sandbox/info` at once, each for at most [`PROBE_TIMEOUT`];
/// an error or no answer in time counts as "not mine".
pub async fn probe_owners(reg: &Registry, cx: &CallCx, sandbox: &str) -> Vec<Arc<dyn Provider>> {
    let candidates = reg.with_feature("sandbox.lifecycle");
    let answers = futures::future::join_all(candidates.iter().map(|p| async move {
        let params = serde_json::json!({ "sandbox": sandbox });
        let asked = tokio::time::timeout(PROBE_TIMEOUT, p.call(cx, "sandbox/info", params));
        matches!(asked.await, Ok(Ok(_)))
    }))
    .await;
    candidates
        .into_iter()
        .zip(answers)
        .filter_map(|(p, yes)| yes.then_some(p))
        .collect()
}

/// E8004 for a provider and feature.
pub fn unsupported(provider: &str, feature: &str) -> AbxError {
    AbxError::new(
        ErrorCode::FeatureNotSupported,
        &[("provider", provider), ("feature", feature)],
    )
}

/// Ids of things that outlive the call that made them (exec streams, watches), mapped to
/// the provider that made them.
#[derive(Default)]
pub struct Handles {
    map: std::sync::Mutex<HashMap<String, String>>,
}

impl Handles {
    /// Remember that `handle` belongs to `provider`.
    pub fn insert(&self, handle: &str, provider: &str) {
        self.map
            .lock()
            .expect("handles lock")
            .insert(handle.to_owned(), provider.to_owned());
    }

    /// Which provider made `handle`.
    pub fn get(&self, handle: &str) -> Option<String> {
        self.map.lock().expect("handles lock").get(handle).cloned()
    }

    /// Forget `handle`.
    pub fn remove(&self, handle: &str) {
        self.map.lock().expect("handles lock").remove(handle);
    }
}
