//! The `provider/*` management methods: install, uninstall, update, doctor, configure,
//! setDefault. Each works on the installed records first and then on the live
//! [`Registry`]; the daemon keeps its plugins typed ([`Plugins`]) beside the registry's
//! `dyn Provider`s, so nothing is downcast.

use abx_core::provider::{Kind, Provider, Registry};
use abx_core::Broker;
use abx_home::Paths;
use abx_plugins::install::{self, Request};
use abx_plugins::installed;
use abx_plugins::plugin::PluginProvider;
use abx_protocol::api::{
    ProviderConfigureParams, ProviderIdParams, ProviderUninstallParams, ProviderUpdateParams,
};
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::RwLock;
use std::time::Duration;

/// The installed plugins the daemon runs, by id (the same providers the core's registry
/// holds as `dyn Provider`).
#[derive(Default)]
pub struct Plugins(RwLock<HashMap<String, Arc<PluginProvider>>>);

impl Plugins {
    /// The plugin `id`, if it is one.
    pub fn get(&self, id: &str) -> Option<Arc<PluginProvider>> {
        self.0.read().expect("plugins").get(id).cloned()
    }

    /// Add (or replace) a plugin here and in the core's registry.
    pub fn upsert(&self, reg: &Registry, p: Arc<PluginProvider>) {
        let id = p.summary().id.clone();
        reg.upsert(p.clone());
        self.0.write().expect("plugins").insert(id, p);
    }

    /// Remove a plugin here and from the core's registry.
    pub fn remove(&self, reg: &Registry, id: &str) {
        reg.remove(id);
        self.0.write().expect("plugins").remove(id);
    }

    /// Every plugin, as the core's providers.
    pub fn providers(&self) -> Vec<Arc<dyn Provider>> {
        let mut v: Vec<_> = self.0.read().expect("plugins").values().cloned().collect();
        v.sort_by(|a, b| a.summary().id.cmp(&b.summary().id));
        v.into_iter().map(|p| p as Arc<dyn Provider>).collect()
    }
}

/// Load every installed plugin (at daemon start).
pub fn load_installed(paths: &Paths, events: &abx_core::events::Events) -> Plugins {
    let _ = installed::cleanup_orphans(&paths.data_dir);
    let plugins = Plugins::default();
    let loaded: HashMap<String, Arc<PluginProvider>> = installed::load(&paths.data_dir)
        .into_iter()
        .filter_map(|rec| {
            let id = rec.id.clone();
            match PluginProvider::new(rec, paths, events) {
                Ok(p) => Some((id, Arc::new(p))),
                Err(e) => {
                    tracing::warn!(provider = %id, "cannot load installed provider: {e}");
                    None
                }
            }
        })
        .collect();
    *plugins.0.write().expect("plugins") = loaded;
    plugins
}

/// The configured default provider, if any.
pub fn load_default(paths: &Paths) -> Option<String> {
    abx_home::config::read(&paths.config_dir)
        .get("default_provider")?
        .as_str()
        .map(str::to_owned)
}

fn store_default(paths: &Paths, id: &str) -> Result<(), AbxError> {
    let mut table = abx_home::config::read(&paths.config_dir);
    table.insert(
        "default_provider".into(),
        toml::Value::String(id.to_owned()),
    );
    let text = toml::to_string(&table).map_err(AbxError::internal)?;
    abx_home::util::write_atomic(&paths.config_dir.join("config.toml"), text.as_bytes())
        .map_err(AbxError::internal)
}

fn exec_provider(reg: &Registry, id: &str) -> Result<Arc<dyn Provider>, AbxError> {
    let p = reg.get(id)?;
    if p.summary().kind != Kind::Exec {
        return Err(
            AbxError::detail(ErrorCode::Usage, format!("'{id}' is a builtin provider"))
                .with_suggestion(
                    "Builtin providers cannot be installed, updated, configured or uninstalled.",
                ),
        );
    }
    Ok(p)
}

/// `provider/install`.
pub async fn install(m: &Plugins, b: &Arc<Broker>, req: Request) -> Result<Value, AbxError> {
    let plan = install::install(&b.paths.data_dir, &req).await?;
    if plan.installed {
        let rec = installed::get(&b.paths.data_dir, &plan.id)
            .ok_or_else(|| AbxError::internal("installed provider not in the registry"))?;
        if let Ok(old) = b.registry.get(&plan.id) {
            old.shutdown().await;
        }
        let p = PluginProvider::new(rec, &b.paths, &b.events)?;
        m.upsert(&b.registry, Arc::new(p));
    }
    serde_json::to_value(&plan).map_err(AbxError::internal)
}

/// `provider/uninstall`.
pub async fn uninstall(
    m: &Plugins,
    b: &Arc<Broker>,
    p: ProviderUninstallParams,
) -> Result<Value, AbxError> {
    let prov = exec_provider(&b.registry, &p.id)?;
    if !p.confirm {
        return Err(AbxError::new(
            ErrorCode::Refused,
            &[
                ("detail", "Uninstalling a provider requires confirmation."),
                (
                    "rerun",
                    &format!("Re-run with --yes: abx provider uninstall {} --yes", p.id),
                ),
            ],
        ));
    }
    prov.shutdown().await;
    m.remove(&b.registry, &p.id);
    installed::remove(&b.paths.data_dir, &p.id)?;
    if b.registry.default_id() == p.id {
        let _ = b.registry.set_default("local");
        let _ = store_default(&b.paths, "local");
    }
    Ok(json!({}))
}

/// `provider/update`: re-resolve each provider's source; with `check`, only report.
pub async fn update(
    m: &Plugins,
    b: &Arc<Broker>,
    p: ProviderUpdateParams,
) -> Result<Value, AbxError> {
    let targets: Vec<installed::Installed> = match &p.id {
        Some(id) => {
            exec_provider(&b.registry, id)?;
            vec![installed::get(&b.paths.data_dir, id).ok_or_else(|| {
                AbxError::new(ErrorCode::ProviderNotInstalled, &[("provider", id)])
            })?]
        }
        None => installed::load(&b.paths.data_dir),
    };
    let mut out = Vec::new();
    for rec in targets {
        let tampered = match m.get(&rec.id) {
            Some(e) => e.verify().await.is_err(),
            None => false,
        };
        let git_ref = p.git_ref.clone().or_else(|| rec.source.git_ref.clone());
        let req = Request {
            source: rec.source.url.clone(),
            subdir: rec.source.subdir.clone(),
            git_ref: git_ref.clone(),
            sha256: None,
            allow_unpinned: rec.trust == installed::Trust::Unpinned,
            allow_insecure_transport: true,
            confirm: true,
            dry_run: true,
            replace: true,
        };
        let plan = match install::install(&b.paths.data_dir, &req).await {
            Ok(plan) => plan,
            Err(e) => {
                out.push(json!({"id": rec.id, "from": rec.version, "to": null, "status": "error", "error": e.to_string()}));
                continue;
            }
        };
        let changed = plan.digest != rec.digest;
        let status = match (changed || tampered, p.check) {
            (false, _) => "up-to-date",
            (true, true) => {
                if tampered && !changed {
                    "repair-available"
                } else {
                    "update-available"
                }
            }
            (true, false) => {
                let req = Request {
                    dry_run: false,
                    ..req
                };
                install(m, b, req).await?;
                if tampered && !changed {
                    "repaired"
                } else {
                    "updated"
                }
            }
        };
        out.push(json!({
            "id": rec.id, "from": rec.version, "to": plan.version,
            "fromDigest": rec.digest, "toDigest": plan.digest, "status": status,
        }));
    }
    Ok(json!({"providers": out}))
}

/// `provider/doctor`: installed, integrity, config, handshake, permissions, isolation.
pub async fn doctor(m: &Plugins, b: &Arc<Broker>, p: ProviderIdParams) -> Result<Value, AbxError> {
    let prov = b.registry.get(&p.id)?;
    let s = prov.summary().clone();
    let mut checks = vec![
        json!({"name": "installed", "ok": true, "detail": format!("{} {}", s.name, s.version)}),
    ];
    let Some(e) = m.get(&p.id) else {
        checks.push(json!({"name": "integrity", "ok": true, "detail": "builtin"}));
        checks.push(json!({"name": "config", "ok": true, "detail": ""}));
        checks.push(json!({"name": "handshake", "ok": true, "detail": "builtin"}));
        return Ok(json!({"checks": checks, "ok": true}));
    };
    let integrity = e.verify().await;
    checks.push(match &integrity {
        Ok(()) => json!({"name": "integrity", "ok": true, "detail": abx_plugins::digest::short(&e.record().digest)}),
        Err(err) => json!({"name": "integrity", "ok": false, "detail": err.message, "code": err.code.abx()}),
    });
    if integrity.is_err() {
        return Ok(json!({"checks": checks, "ok": false}));
    }
    let missing = e.missing_config();
    checks.push(json!({
        "name": "config",
        "ok": missing.is_empty(),
        "detail": if missing.is_empty() { String::new() } else { format!("missing required: {}", missing.join(", ")) },
    }));
    e.host().reset().await;
    let hs = e.host().handshake().await;
    checks.push(match &hs {
        Ok(_) => json!({"name": "handshake", "ok": true, "detail": ""}),
        Err(err) => {
            json!({"name": "handshake", "ok": false, "detail": err.message, "code": err.code.abx()})
        }
    });
    // The plugin's own checks (its service reachable, its credentials accepted): EPP/1
    // `provider/doctor`, optional (a plugin without it answers -32601 and adds none).
    if hs.is_ok() {
        checks.extend(plugin_checks(e.host()).await);
    }
    let info = prov.info();
    let sec = &info["security"];
    let enforced = sec["enforced"] == true;
    let warn_mode = sec["enforcement"] == "warn";
    checks.push(json!({
        "name": "permissions",
        // Not enforced in `refuse` mode: the plugin cannot start.
        "ok": enforced || warn_mode,
        "detail": format!(
            "network: {} · filesystem: {} · spawns processes: {} ({})",
            list_or_none(&sec["network"]), list_or_none(&sec["filesystem"]),
            if sec["spawnsProcesses"] == true { "yes" } else { "no" },
            if enforced {
                "enforced".to_owned()
            } else if warn_mode {
                format!("NOT enforced, running anyway (enforcement = \"warn\"): {}", sec["why"].as_str().unwrap_or(""))
            } else {
                format!("cannot be enforced, the plugin will not start (E8016): {}", sec["why"].as_str().unwrap_or(""))
            }
        ),
    }));
    // How the plugin runs (known once it started): said, never a failure by itself.
    if let Some(iso) = e.host().status().isolation {
        let detail = match iso.strip_prefix("none: ") {
            None => "own user, PID and mount namespaces (broker state hidden); runs a private copy verified as it was made".to_owned(),
            Some(why) => format!(
                "no namespaces ({why}): runs a private copy verified as it was made; its processes are refused by ancestry, and it can see the broker's directories"
            ),
        };
        checks.push(json!({"name": "isolation", "ok": true, "detail": detail}));
    }
    let ok = checks.iter().all(|c| c["ok"] == true);
    Ok(json!({"checks": checks, "ok": ok}))
}

/// How long the plugin's own doctor checks may take.
const PLUGIN_DOCTOR_TIMEOUT: Duration = Duration::from_secs(15);
/// At most this many checks of a plugin's are shown, each detail cut at 1 KiB.
const PLUGIN_DOCTOR_CHECKS: usize = 16;

/// The checks a plugin reports itself (`provider/doctor`, docs/epp-1.md §6.7): each
/// `{name, ok, detail?, code?}`; a plugin without the method adds none; a failing or
/// malformed answer is one failed check saying so.
async fn plugin_checks(host: &abx_plugins::host::Host) -> Vec<Value> {
    let failed = |detail: String| json!({"name": "plugin", "ok": false, "detail": detail});
    let r = host
        .call(
            "provider/doctor",
            &json!({}),
            None,
            None,
            None,
            Some(PLUGIN_DOCTOR_TIMEOUT),
            None,
        )
        .await;
    let raw = match r {
        Ok(raw) => raw,
        Err(e) if e.code == ErrorCode::MethodNotFound => return Vec::new(),
        Err(e) => return vec![failed(format!("[{}] {}", e.code.abx(), e.message))],
    };
    let Ok(v) = serde_json::from_str::<Value>(raw.get()) else {
        return vec![failed("its provider/doctor answer is not JSON".into())];
    };
    let Some(list) = v["checks"].as_array() else {
        return vec![failed("its provider/doctor answer has no checks".into())];
    };
    let cut = |s: &str| -> String {
        let mut end = s.len().min(1024);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_owned()
    };
    list.iter()
        .take(PLUGIN_DOCTOR_CHECKS)
        .map(|c| {
            let mut o = json!({
                "name": cut(c["name"].as_str().unwrap_or("plugin")),
                "ok": c["ok"] == true,
                "detail": cut(c["detail"].as_str().unwrap_or("")),
            });
            if let Some(code) = c["code"].as_str().and_then(ErrorCode::from_abx) {
                o["code"] = json!(code.abx());
            }
            o
        })
        .collect()
}

fn list_or_none(v: &Value) -> String {
    match v.as_array() {
        Some(a) if a.is_empty() => "none".to_owned(),
        Some(a) => a
            .iter()
            .map(|x| x.as_str().unwrap_or("?"))
            .collect::<Vec<_>>()
            .join(", "),
        None => v.to_string(),
    }
}

/// `provider/configure`: store values (secrets included) in the provider's 0600 file.
pub async fn configure(
    m: &Plugins,
    b: &Arc<Broker>,
    p: ProviderConfigureParams,
) -> Result<Value, AbxError> {
    exec_provider(&b.registry, &p.id)?;
    let e = m
        .get(&p.id)
        .ok_or_else(|| AbxError::internal("not a plugin"))?;
    let manifest = &e.record().manifest;
    let values: std::collections::BTreeMap<String, Value> = p
        .values
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    installed::validate_values(manifest, &values)?;
    if let Some(k) = p.values.keys().find(|k| !manifest.config.contains_key(*k)) {
        return Err(AbxError::new(
            ErrorCode::ConfigInvalid,
            &[
                ("provider", &p.id),
                ("detail", &format!("unknown key '{k}'")),
            ],
        ));
    }
    let mut stored = installed::load_config(&b.paths.config_dir, &p.id);
    for (k, v) in p.values {
        if v.is_null() {
            stored.remove(&k);
        } else {
            stored.insert(k, v);
        }
    }
    installed::store_config(&b.paths.config_dir, &p.id, &stored)?;
    e.reconfigure().await?;
    Ok(json!({"configured": stored.keys().collect::<Vec<_>>()}))
}

/// `provider/setDefault`.
pub fn set_default(b: &Arc<Broker>, p: ProviderIdParams) -> Result<Value, AbxError> {
    b.registry.set_default(&p.id)?;
    store_default(&b.paths, &p.id)?;
    Ok(json!({}))
}
