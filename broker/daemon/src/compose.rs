//! The composition root: the one place that reads the environment and the broker config,
//! builds the providers (the builtin `local`, then every installed plugin) and gives them to
//! the core, with the daemon's own methods (`provider/*` management and the contract kit).

use crate::manage::{self, Plugins};
use abx_core::broker::{Methods, Settings};
use abx_core::dispatch::{self, params, reply, Cx, Reply};
use abx_core::provider::{BoxFut, Provider};
use abx_core::Broker;
use abx_home::Paths;
use abx_protocol::AbxError;
use serde_json::value::RawValue;
use std::sync::{Arc, Weak};

/// Bytes buffered in each direction of the kit's in-memory connections.
const KIT_PIPE: usize = 1024 * 1024;

/// The methods the daemon adds to the core's (also listed in `docs/broker-api.md`).
pub const METHODS: &[&str] = &[
    "provider/install",
    "provider/uninstall",
    "provider/update",
    "provider/doctor",
    "provider/configure",
    "provider/setDefault",
    "provider/test",
];

/// Every method the daemon answers: the core's and its own (the provider methods it routes
/// are `abx_protocol::features::PROVIDER_METHODS`).
pub fn all_methods() -> Vec<&'static str> {
    dispatch::METHODS.iter().chain(METHODS).copied().collect()
}

/// The daemon's tokio runtime: one worker per CPU the daemon may run on, at most two
/// (`ABX_WORKER_THREADS` overrides). With one, a current-thread runtime: every wakeup stays on
/// its thread. Measured (docs/performance.md, "Plugin hop", ninth round): confined to one
/// CPU, two workers only add hand-offs. On two CPUs it is a trade: one worker makes a single
/// client's hop to a plugin about 9% faster (0.91x lspmux's added p50 against 0.995x, in
/// alternated runs), two keep many clients' pipelined throughput (0.86x of the json-echo
/// baseline against 0.57x). Two stay the default there.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let n = std::env::var("ABX_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .min(2)
        });
    if n <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()
    }
}

/// The broker settings from the environment: `ABX_BROKER_VERSION`, `ABX_MAX_MESSAGE_SIZE`,
/// `ABX_MEMORY_BUDGET`, `ABX_TEST_HOOKS`.
pub fn settings_from_env() -> Settings {
    let mut s = Settings::default();
    if let Some(v) = std::env::var("ABX_BROKER_VERSION")
        .ok()
        .filter(|v| !v.is_empty())
    {
        s.version = v;
    }
    if let Some(n) = std::env::var("ABX_MAX_MESSAGE_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        s.max_message = n;
    }
    if let Ok(v) = std::env::var("ABX_MEMORY_BUDGET") {
        match abx_local::limits::parse_size(&v) {
            Some(n) => s.memory_budget = n as usize,
            None => tracing::warn!(value = %v, "ignoring ABX_MEMORY_BUDGET: not a size"),
        }
    }
    s.test_hooks = std::env::var("ABX_TEST_HOOKS").is_ok_and(|v| v == "1");
    s
}

/// The broker of this daemon (or stdio broker): `local` and the installed plugins, the
/// default provider from the config or `ABX_PROVIDER`. Must be called inside a tokio runtime
/// (the providers start tasks).
pub fn broker(paths: Paths) -> Arc<Broker> {
    let events = match std::env::var("ABX_EVENT_QUEUE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(n) => abx_core::events::Events::new(n),
        None => abx_core::events::Events::default(),
    };
    let config = abx_home::config::read(&paths.config_dir);
    let local: Arc<dyn Provider> = Arc::new(abx_local::sandboxes::LocalProvider::start(
        &paths.data_dir,
        abx_local::sandboxes::Settings::from_config(&config),
        events.clone(),
    ));
    let plugins = manage::load_installed(&paths, &events);
    let mut providers = vec![local];
    providers.extend(plugins.providers());
    let methods = Arc::new(Daemon {
        plugins,
        broker: Default::default(),
    });
    let broker = Arc::new(Broker::new(
        paths.clone(),
        settings_from_env(),
        providers,
        events,
        Some(methods.clone()),
    ));
    methods
        .broker
        .set(Arc::downgrade(&broker))
        .expect("set once");
    if let Some(d) = manage::load_default(&paths) {
        if broker.registry.set_default(&d).is_err() {
            tracing::warn!(provider = %d, "the configured default provider is not installed");
        }
    }
    if let Ok(p) = std::env::var("ABX_PROVIDER") {
        if !p.is_empty() && broker.registry.set_default(&p).is_err() {
            tracing::warn!(provider = %p, "ABX_PROVIDER names a provider that is not installed");
        }
    }
    broker
}

/// The daemon's own methods.
struct Daemon {
    plugins: Plugins,
    /// The broker these methods belong to (the kit's connections are served by it).
    broker: std::sync::OnceLock<Weak<Broker>>,
}

impl Methods for Daemon {
    fn names(&self) -> &[&'static str] {
        METHODS
    }

    fn call<'a>(
        &'a self,
        cx: &'a Cx,
        method: &'a str,
        raw: Option<Box<RawValue>>,
    ) -> BoxFut<'a, Reply> {
        Box::pin(async move {
            let p = raw.as_deref();
            let (m, b) = (&self.plugins, &cx.broker);
            match method {
                "provider/install" => manage::install(m, b, params(method, p)?).await,
                "provider/uninstall" => manage::uninstall(m, b, params(method, p)?).await,
                "provider/update" => manage::update(m, b, params(method, p)?).await,
                "provider/doctor" => manage::doctor(m, b, params(method, p)?).await,
                "provider/configure" => manage::configure(m, b, params(method, p)?).await,
                "provider/setDefault" => manage::set_default(b, params(method, p)?),
                "provider/test" => self.test(cx, params(method, p)?).await,
                _ => unreachable!("names() lists every method"),
            }
            .and_then(|v| reply(&v))
        })
    }
}

/// The kit's way in: an in-memory pipe served by the core's connection loop, exactly as a
/// socket client's connection is.
struct InMemory(Weak<Broker>);

impl abx_kit::Connector for InMemory {
    fn connect(&self) -> abx_kit::Halves {
        let (ours, theirs) = tokio::io::duplex(KIT_PIPE);
        if let Some(b) = self.0.upgrade() {
            let (r, w) = tokio::io::split(theirs);
            tokio::spawn(abx_core::conn::serve(b, r, w));
        }
        // With the broker gone the pipe's other end is dropped: every call fails at once.
        let (r, w) = tokio::io::split(ours);
        (Box::new(r), Box::new(w))
    }
}

impl Daemon {
    /// `provider/test`: the daemon says what the kit cannot learn through the API (the
    /// provider's secret config values, checked to never appear in a reply), then runs it.
    async fn test(&self, cx: &Cx, p: abx_kit::Params) -> Result<serde_json::Value, AbxError> {
        let prov = cx.broker.registry.get(&p.id)?;
        let plugin = self.plugins.get(&p.id);
        if let Some(e) = &plugin {
            e.verify().await?;
        }
        let summary = prov.summary().clone();
        let (secrets, secret_defaults) = plugin
            .map(|e| secrets_of(&cx.broker.paths, &e))
            .unwrap_or_default();
        let target = abx_kit::Target {
            id: summary.id,
            features: summary.features,
            secrets,
            secret_defaults,
        };
        let weak = self.broker.get().cloned().unwrap_or_default();
        let out = cx.conn.handle.clone();
        abx_kit::run(Arc::new(InMemory(weak)), target, p, move |note| {
            let out = out.clone();
            async move {
                out.notify("provider/testResult", &note).await;
            }
        })
        .await
    }
}

/// Secret config values and secret defaults of a plugin.
fn secrets_of(
    paths: &Paths,
    e: &abx_plugins::plugin::PluginProvider,
) -> (abx_kit::KeyValues, abx_kit::KeyValues) {
    use abx_plugins::installed;
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let rec = e.record();
    let manifest = installed::full_manifest(rec).unwrap_or_else(|_| rec.manifest.clone());
    let stored = installed::load_config(&paths.config_dir, &rec.id);
    let effective = installed::resolve_config(&manifest, &stored, |k| std::env::var(k).ok())
        .map(|(eff, _)| eff)
        .unwrap_or_default();
    let mut values = Vec::new();
    let mut defaults = Vec::new();
    for (name, key) in manifest.config_in_order() {
        if !key.secret {
            continue;
        }
        if let Some(v) = effective.get(name) {
            values.push((name.to_owned(), text(v)));
        }
        if let Some(d) = &key.default {
            defaults.push((name.to_owned(), text(d)));
        }
    }
    (values, defaults)
}
