//! An installed EPP/1 plugin as a [`Provider`].
//!
//! Before every call (and so before every start of its process) the installed tree is
//! verified: a cheap stamp of every file (inode, ctime, size, mode) is compared with the
//! stamp taken at the last full verification, and any difference triggers a full digest,
//! which must equal the one recorded at install: else E8011 and the plugin never runs.
//! Each start of the process then runs a private copy made and hashed in one pass by the
//! launcher ([`super::launch`]), so what runs is what was verified even if the tree is
//! swapped between this check and the start.

use super::digest;
use super::host::{Host, Spec};
use super::installed::{self, Installed};
use super::permissions;
use abx_core::provider::{BoxFut, CallCx, Kind, Provider, ProviderSummary, Reply};
use abx_home::Paths;
use abx_protocol::{epp, features, AbxError, ErrorCode};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Chunk size of broker-side upload/download for plugins without `files.transfer`.
const CHUNK: u64 = 4 * 1024 * 1024;

#[derive(PartialEq, Eq, Debug)]
struct Stamp {
    path: PathBuf,
    ino: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
    size: u64,
    mode: u32,
}

/// The stat stamps of every entry of a tree; an error (and so E8011) when the tree holds
/// more entries than an install may (a tree that grew past the caps is never walked whole).
fn stamps(root: &Path) -> std::io::Result<Vec<Stamp>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            if out.len() > 2 * super::install::MAX_FILES {
                return Err(std::io::Error::other(
                    "more entries than an install may hold",
                ));
            }
            let m = std::fs::symlink_metadata(e.path())?;
            out.push(Stamp {
                path: e.path(),
                ino: m.ino(),
                ctime: (m.ctime(), m.ctime_nsec()),
                mtime: (m.mtime(), m.mtime_nsec()),
                size: m.size(),
                mode: m.mode(),
            });
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// An installed plugin.
pub struct PluginProvider {
    summary: ProviderSummary,
    record: Installed,
    host: Arc<Host>,
    /// The stamps of the tree when it was last checked, and whether it passed. An async
    /// lock: checks of one provider run one at a time, and a waiting call holds no worker.
    verified: tokio::sync::Mutex<Option<(Vec<Stamp>, bool)>>,
    /// The tree's change watch and when its stamps were last walked and found good: while
    /// it is quiet and that walk is recent, a call's integrity check is one `read(2)`
    /// ([`super::changes`]).
    watch: std::sync::Mutex<Option<(super::changes::Changes, std::time::Instant)>>,
    paths: Paths,
    events: abx_core::events::Events,
}

impl PluginProvider {
    /// A `sandbox/*` reply, its sandboxes tagged with this provider.
    fn tagged(&self, raw: Box<RawValue>) -> Reply {
        tag_provider_raw(raw, &self.record.id).map_err(|e| {
            AbxError::new(
                ErrorCode::BadPluginReply,
                &[("provider", &self.record.id), ("detail", &e.to_string())],
            )
        })
    }

    /// `exec/kill`: the plugin gets the signal asked for, and the broker escalates after it
    /// (`escalate`, the broker's own member, is not passed on).
    async fn kill(&self, cx: &CallCx, params: Box<RawValue>) -> Reply {
        let (mut params, counted) =
            abx_core::dispatch::params_value("exec/kill", params, cx.conn.pool())?;
        let escalate = params
            .as_object_mut()
            .and_then(|o| o.remove("escalate"))
            .is_none_or(|v| v != Value::Bool(false));
        let raw = self
            .host
            .call(
                "exec/kill",
                &params,
                Some(cx.conn.clone()),
                Some(cx.replied.clone()),
                None,
                None,
                Some(cx.hold.clone()),
            )
            .await?;
        drop(counted);
        if escalate {
            self.escalate(cx, &params);
        }
        Ok(raw)
    }

    /// After an `exec/kill` with a signal the command may ignore: while the exec's stream
    /// still runs (no `exec/exit` yet), follow with TERM, then KILL,
    /// [`abx_core::signals::KILL_GRACE`] apart (`escalate: false` opts out).
    fn escalate(&self, cx: &CallCx, params: &Value) {
        let Some(exec_id) = params["execId"].as_str().map(str::to_owned) else {
            return;
        };
        let sig = params["signal"]
            .as_str()
            .map_or(Some(libc::SIGKILL), abx_core::signals::signal_from_name);
        let next = sig.map_or(&[][..], abx_core::signals::escalation);
        if next.is_empty() {
            return;
        }
        let (host, conn) = (self.host.clone(), cx.conn.clone());
        tokio::spawn(async move {
            for &sig in next {
                let until = tokio::time::Instant::now() + abx_core::signals::KILL_GRACE;
                loop {
                    if !host.has_route(&exec_id).await {
                        return;
                    }
                    if tokio::time::Instant::now() >= until {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let name = abx_core::signals::signal_name(sig);
                let p = json!({"execId": exec_id, "signal": name.trim_start_matches("SIG")});
                tracing::debug!(exec = %exec_id, signal = %name, "exec/kill: escalating");
                if host
                    .call("exec/kill", &p, Some(conn.clone()), None, None, None, None)
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }

    /// Wrap an installed record (the process starts on first use); the sandbox changes the
    /// plugin reports go to `events`.
    pub fn new(
        record: Installed,
        paths: &Paths,
        events: &abx_core::events::Events,
    ) -> Result<PluginProvider, AbxError> {
        let spec = spec_for(&record, paths, events)?;
        Ok(PluginProvider {
            summary: ProviderSummary {
                id: record.id.clone(),
                name: record.name.clone(),
                version: record.version.clone(),
                kind: Kind::Exec,
                trust: record.trust.as_str().to_owned(),
                features: record.manifest.features.clone(),
                description: record.manifest.description.clone(),
            },
            host: Host::new(spec),
            record,
            verified: tokio::sync::Mutex::new(None),
            watch: std::sync::Mutex::new(None),
            paths: paths.clone(),
            events: events.clone(),
        })
    }

    /// The installed record.
    pub fn record(&self) -> &Installed {
        &self.record
    }

    /// The host (doctor, status).
    pub fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// Verify the installed tree against its recorded digest (E8011 when it differs).
    ///
    /// The walk and the hashing run on the blocking pool, never on the async workers, one
    /// check at a time per provider. Unchanged stat stamps since the last check give the
    /// last answer without hashing; a tree past the install caps is E8011 without hashing
    /// ([`digest::verify`]).
    pub async fn verify(&self) -> Result<(), AbxError> {
        // The fast path: the tree passed a walk less than RESTAMP_EVERY ago and nothing
        // changed in it since.
        {
            let mut w = self.watch.lock().expect("watch");
            if let Some((changes, at)) = &*w {
                if at.elapsed() < super::changes::RESTAMP_EVERY && changes.quiet() {
                    return Ok(());
                }
                // Whatever this look read is gone from the queue: no other call may take the
                // fast path on it before the walk below has judged the tree.
                *w = None;
            }
        }
        let mut last = self.verified.lock().await;
        let root = self.record.path.clone();
        let expected = self.record.digest.clone();
        let id = self.record.id.clone();
        let prev = last.take();
        let (res, state, watch) = tokio::task::spawn_blocking(move || {
            // Watched before the walk: a change during it is seen by the next call.
            let watch = super::changes::Changes::watch(&root).ok();
            let Ok(now) = stamps(&root) else {
                tracing::warn!(provider = %id, root = %root.display(), "integrity check failed: the tree cannot be walked or is past the install caps");
                return (Err(integrity(&id)), None, None);
            };
            if let Some((seen, ok)) = prev {
                if seen == now {
                    let r = if ok { Ok(()) } else { Err(integrity(&id)) };
                    return (r, Some((seen, ok)), watch.filter(|_| ok));
                }
            }
            let r = digest::verify(&root, &expected, &id);
            let ok = r.is_ok();
            (r, Some((now, ok)), watch.filter(|_| ok))
        })
        .await
        .map_err(AbxError::internal)?;
        *last = state;
        // Only a tree that passed gets the fast path.
        *self.watch.lock().expect("watch") = watch.map(|w| (w, std::time::Instant::now()));
        res
    }

    /// Re-read the stored configuration (after `provider/configure`).
    pub async fn reconfigure(&self) -> Result<(), AbxError> {
        let spec = spec_for(&self.record, &self.paths, &self.events)?;
        self.host.respec(spec).await;
        Ok(())
    }

    /// Which configuration keys are missing (for doctor).
    pub fn missing_config(&self) -> Vec<String> {
        let stored = installed::load_config(&self.paths.config_dir, &self.record.id);
        installed::resolve_config(&self.record.manifest, &stored, |k| std::env::var(k).ok())
            .map(|(_, missing)| missing)
            .unwrap_or_default()
    }

    async fn upload(&self, cx: &CallCx, params: &Value) -> Result<Value, AbxError> {
        let local = PathBuf::from(params["localPath"].as_str().unwrap_or_default());
        let path = params["path"].as_str().unwrap_or_default().to_owned();
        let sandbox = params["sandbox"].clone();
        let local_err = |d: String| {
            AbxError::new(
                ErrorCode::LocalFileError,
                &[("path", &local.display().to_string()), ("detail", &d)],
            )
        };
        let mut f = std::fs::File::open(&local).map_err(|e| local_err(e.to_string()))?;
        let total = f.metadata().map_err(|e| local_err(e.to_string()))?.len();
        // More than one chunk: written under a temporary sibling name, then renamed over the
        // target, so an interrupted upload never leaves a partial file at `path` (a single
        // chunk is a whole-file write, atomic by itself).
        let target = if total > CHUNK {
            let (dir, name) = match path.rsplit_once('/') {
                Some((d, n)) => (format!("{d}/"), n),
                None => (String::new(), path.as_str()),
            };
            let n = UPLOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("{dir}.{name}.abx-upload-{}-{n}", std::process::id())
        } else {
            path.clone()
        };
        let result = async {
            let mut buf = vec![0u8; CHUNK as usize];
            let mut done = 0u64;
            loop {
                use std::io::Read;
                let n = f.read(&mut buf).map_err(|e| local_err(e.to_string()))?;
                if n == 0 && done > 0 {
                    break;
                }
                let data = abx_protocol::b64::encode(&buf[..n]);
                let mut p =
                    json!({"sandbox": sandbox, "path": target, "data": data, "encoding": "base64"});
                if done > 0 {
                    p["offset"] = json!(done);
                }
                self.host
                    .call(
                        "files/write",
                        &p,
                        None,
                        None,
                        Some(cx.cancel.clone()),
                        None,
                        None,
                    )
                    .await?;
                done += n as u64;
                cx.conn
                    .notify(
                        "files/progress",
                        &json!({"sandbox": sandbox, "path": path, "bytes": done, "total": total}),
                    )
                    .await;
                if n == 0 {
                    break;
                }
            }
            if target != path {
                let p = json!({"sandbox": sandbox, "from": target, "to": path});
                self.host
                    .call(
                        "files/rename",
                        &p,
                        None,
                        None,
                        Some(cx.cancel.clone()),
                        None,
                        None,
                    )
                    .await?;
            }
            Ok::<u64, AbxError>(done)
        }
        .await;
        match result {
            Ok(done) => Ok(json!({"size": done, "path": path, "localPath": local})),
            Err(e) => {
                if target != path {
                    let p = json!({"sandbox": sandbox, "path": target});
                    let _ = self
                        .host
                        .call("files/remove", &p, None, None, None, None, None)
                        .await;
                }
                Err(e)
            }
        }
    }

    async fn download(&self, cx: &CallCx, params: &Value) -> Result<Value, AbxError> {
        use std::io::Write;
        let local = PathBuf::from(params["localPath"].as_str().unwrap_or_default());
        let path = params["path"].as_str().unwrap_or_default().to_owned();
        let sandbox = params["sandbox"].clone();
        let local_err = |d: String| {
            AbxError::new(
                ErrorCode::LocalFileError,
                &[("path", &local.display().to_string()), ("detail", &d)],
            )
        };
        let dir = local
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let tmp = dir.join(format!(".abx-download-{}", std::process::id()));
        let mut f = std::fs::File::create(&tmp).map_err(|e| local_err(e.to_string()))?;
        let mut off = 0u64;
        let result = async {
            loop {
                let p = json!({"sandbox": sandbox, "path": path, "offset": off, "length": CHUNK, "encoding": "base64"});
                let raw = self.host.call("files/read", &p, None, None, Some(cx.cancel.clone()), None, None).await?;
                let v: Value = serde_json::from_str(raw.get()).map_err(AbxError::internal)?;
                let bytes = abx_protocol::b64::decode(v["data"].as_str().unwrap_or_default())
                    .map_err(|e| AbxError::new(ErrorCode::BadPluginReply, &[("provider", &self.record.id), ("detail", &e.to_string())]))?;
                f.write_all(&bytes).map_err(|e| local_err(e.to_string()))?;
                off += bytes.len() as u64;
                let total = v["size"].as_u64().unwrap_or(off);
                cx.conn.notify("files/progress", &json!({"path": path, "bytes": off, "total": total})).await;
                if v["eof"] == true || bytes.is_empty() {
                    return Ok(());
                }
            }
        }
        .await;
        match result {
            Ok(()) => {
                std::fs::rename(&tmp, &local).map_err(|e| local_err(e.to_string()))?;
                Ok(json!({"size": off, "path": path, "localPath": local}))
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }
}

/// Numbers temporary upload names.
static UPLOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn integrity(id: &str) -> AbxError {
    AbxError::new(ErrorCode::IntegrityFailed, &[("provider", id)])
}

/// The start spec of a plugin from its record and stored configuration.
fn spec_for(
    rec: &Installed,
    paths: &Paths,
    events: &abx_core::events::Events,
) -> Result<Spec, AbxError> {
    // The registry's copy has no secret defaults: read them from the (verified) tree.
    let manifest = installed::full_manifest(rec).unwrap_or_else(|_| rec.manifest.clone());
    let stored = installed::load_config(&paths.config_dir, &rec.id);
    let (effective, _missing) =
        installed::resolve_config(&manifest, &stored, |k| std::env::var(k).ok())?;
    let mut secrets = Vec::new();
    let mut env = BTreeMap::new();
    for (k, key) in &manifest.config {
        let Some(v) = effective.get(k) else { continue };
        let text = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if key.secret {
            secrets.push(text.clone());
        }
        if let Some(name) = &key.env {
            env.insert(name.clone(), text);
        }
    }
    let data_dir = paths.data_dir.join("providers").join(&rec.id).join("data");
    let _ = std::fs::create_dir_all(&data_dir);
    let tmp_dir = paths.data_dir.join("providers").join(&rec.id).join("tmp");
    let path_env = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let permissions = permissions::plan(
        &manifest.security,
        &manifest.runtime.command,
        &permissions::Places {
            root: &rec.path,
            data_dir: &data_dir,
            tmp_dir: &tmp_dir,
            path_env: &path_env,
        },
        permissions::Mode::configured(&paths.config_dir),
    );
    let call_timeout = std::env::var("ABX_PLUGIN_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(120), Duration::from_secs);
    Ok(Spec {
        id: rec.id.clone(),
        root: rec.path.clone(),
        command: rec.manifest.runtime.command.clone(),
        env,
        data_dir,
        config: effective.into_iter().collect(),
        secrets,
        features: rec.manifest.features.clone(),
        call_timeout,
        permissions: Arc::new(permissions),
        digest: rec.digest.clone(),
        hide: [
            paths.runtime_dir.clone(),
            paths.config_dir.clone(),
            paths.data_dir.clone(),
        ]
        .into_iter()
        .chain(user_runtime_dirs(paths))
        .collect(),
        copies: paths.runtime_dir.join("plugins"),
        events: events.clone(),
    })
}

/// Every directory where a daemon of this user may put its socket (any data dir: an
/// editor's private broker, another `ABX_HOME`, the default daemon), made where its parent
/// exists, so the plugin's mount namespace can cover it with a tmpfs before a daemon
/// started later puts a socket there.
fn user_runtime_dirs(paths: &Paths) -> Vec<std::path::PathBuf> {
    paths
        .user_runtime_dirs
        .iter()
        .filter(|d| {
            d.is_dir()
                || d.parent().is_some_and(|p| p.is_dir())
                    && abx_home::paths::ensure_private_dir(d).is_ok()
        })
        .cloned()
        .collect()
}

/// Tag the sandboxes of a `sandbox/*` reply that is still text with their provider: each
/// object of `sandboxes` (an array), else the reply itself when it has an `id`. Only the
/// members that decide it are read, and a reply with no sandbox to tag (`{"sandboxes":[]}`,
/// `{"killed":true}`) is passed on as it came, without a copy. The sandboxes tagged get
/// `provider` set (a plugin's own `provider` member is replaced, as [`tag_provider`] does);
/// their other members stay as the plugin wrote them.
fn tag_provider_raw(raw: Box<RawValue>, id: &str) -> Result<Box<RawValue>, serde_json::Error> {
    /// Whether a member is there at all (`"id": null` is there).
    #[derive(Default)]
    struct Seen(bool);
    impl<'de> Deserialize<'de> for Seen {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            IgnoredAny::deserialize(d).map(|_| Seen(true))
        }
    }
    #[derive(Deserialize)]
    struct Shape<'a> {
        #[serde(borrow, default)]
        sandboxes: Option<&'a RawValue>,
        #[serde(default)]
        id: Seen,
    }
    type Members = BTreeMap<String, Box<RawValue>>;
    let is_object = |r: &RawValue| r.get().trim_start().starts_with('{');
    let tag_object = |r: &RawValue| -> Result<Box<RawValue>, serde_json::Error> {
        let mut m: Members = serde_json::from_str(r.get())?;
        m.insert("provider".into(), serde_json::value::to_raw_value(id)?);
        serde_json::value::to_raw_value(&m)
    };
    if !is_object(&raw) {
        return Ok(raw);
    }
    // A member named twice is refused by the derived reader: the map's reading (the last one
    // counts) then decides, as it did before.
    let Ok(shape) = serde_json::from_str::<Shape>(raw.get()) else {
        let mut v: Value = serde_json::from_str(raw.get())?;
        tag_provider(&mut v, id);
        return serde_json::value::to_raw_value(&v);
    };
    if let Some(Ok(items)) = shape
        .sandboxes
        .map(|list| serde_json::from_str::<Vec<&RawValue>>(list.get()))
    {
        if !items.iter().any(|r| is_object(r)) {
            return Ok(raw);
        }
        let tagged = items
            .iter()
            .map(|r| {
                if is_object(r) {
                    tag_object(r)
                } else {
                    Ok((*r).to_owned())
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut top: Members = serde_json::from_str(raw.get())?;
        top.insert(
            "sandboxes".into(),
            serde_json::value::to_raw_value(&tagged)?,
        );
        return serde_json::value::to_raw_value(&top);
    }
    if shape.id.0 {
        return tag_object(&raw);
    }
    Ok(raw)
}

/// A string member of raw params (`None` when absent, not a string, or not an object), read
/// without a tree of them.
fn member_str(params: &RawValue, key: &str) -> Option<String> {
    let map: BTreeMap<String, &RawValue> = serde_json::from_str(params.get()).ok()?;
    serde_json::from_str(map.get(key)?.get()).ok()
}

/// How long the daemon waits for a plugin's `exec/run`: its `timeout` (the plugin judges the
/// value) and 30 s more, else an hour; a negative or huge one is the host's cap
/// ([`super::host::MAX_CALL_WAIT`]), not a panic.
fn run_wait(params: &RawValue) -> Duration {
    let timeout = || -> Option<f64> {
        let map: BTreeMap<String, &RawValue> = serde_json::from_str(params.get()).ok()?;
        serde_json::from_str::<Value>(map.get("timeout")?.get())
            .ok()?
            .as_f64()
    };
    match timeout() {
        Some(t) => Duration::try_from_secs_f64(t + 30.0).unwrap_or(super::host::MAX_CALL_WAIT),
        None => Duration::from_secs(3600),
    }
}

fn tag_provider(v: &mut Value, id: &str) {
    let tag = |o: &mut Value| {
        if let Some(obj) = o.as_object_mut() {
            obj.insert("provider".into(), json!(id));
        }
    };
    if let Some(list) = v.get_mut("sandboxes").and_then(Value::as_array_mut) {
        list.iter_mut().for_each(tag);
    } else if v.get("id").is_some() {
        tag(v);
    }
}

impl Provider for PluginProvider {
    fn summary(&self) -> &ProviderSummary {
        &self.summary
    }

    fn info(&self) -> Value {
        let m = &self.record.manifest;
        let s = &self.record.source;
        let perms = self.host.permissions().describe();
        json!({
            "config": m.redacted_config(),
            "inherits": m.inherits,
            "source": {"url": s.url, "subdir": s.subdir, "ref": s.git_ref, "commit": s.commit},
            "digest": self.record.digest,
            "runtime": m.runtime.command,
            "security": {
                "network": m.security.network,
                "filesystem": m.security.filesystem,
                "spawnsProcesses": m.security.spawns_processes,
                "enforced": perms["enforced"],
                "why": perms["why"],
                "enforcement": perms["enforcement"],
                "landlockAbi": perms["landlockAbi"],
                "rules": perms["rules"],
            },
            "installedAt": self.record.installed_at,
            "path": self.record.path,
            "process": self.host.status(),
        })
    }

    /// For a caller that holds a `Value` (the trait's other entry; the broker calls
    /// [`Provider::call_raw`]): serialized once and taken through `call_raw`, the one way a
    /// call reaches the plugin.
    fn call<'a>(&'a self, cx: &'a CallCx, method: &'a str, params: Value) -> BoxFut<'a, Reply> {
        Box::pin(async move {
            let raw = serde_json::value::to_raw_value(&params).map_err(AbxError::internal)?;
            drop(params);
            self.call_raw(cx, method, raw).await
        })
    }

    fn takes_raw(&self) -> bool {
        true
    }

    /// Every call to the plugin, decided here. The tree is verified first. The few methods
    /// the broker serves or watches itself: `sandbox/capabilities` (from the declared
    /// features, the plugin not asked), `exec/attach` of a stream the broker routes
    /// (re-routed and replayed, the plugin not asked), `exec/kill` (the broker escalates),
    /// `files/upload` and `files/download` of a plugin without `files.transfer` (chunked by the
    /// broker). Everything else, `exec/run` included (only its `timeout` is read, for the
    /// daemon's wait), goes to the plugin with its params as they came (only the broker
    /// rewrote `sandbox`), and a reply the broker does not look into comes back as it came.
    fn call_raw<'a>(
        &'a self,
        cx: &'a CallCx,
        method: &'a str,
        params: Box<serde_json::value::RawValue>,
    ) -> BoxFut<'a, Reply> {
        Box::pin(async move {
            self.verify().await?;
            let has = |f: &str| self.summary.features.iter().any(|x| x == f);
            match method {
                "sandbox/capabilities" => {
                    let v = json!({
                        "capabilities": features::capabilities(&self.summary.features),
                        "features": self.summary.features,
                    });
                    return serde_json::value::to_raw_value(&v).map_err(AbxError::internal);
                }
                "exec/attach" => {
                    let exec_id = member_str(&params, "execId").unwrap_or_default();
                    let conn = cx.conn.clone();
                    if let Some(v) = self.host.attach(&exec_id, conn, cx.replied.clone()).await {
                        return serde_json::value::to_raw_value(&v).map_err(AbxError::internal);
                    }
                }
                "exec/kill" => return self.kill(cx, params).await,
                "files/upload" | "files/download" if !has("files.transfer") => {
                    // A tree of the params (these read them): its cost counted before it is
                    // built, its largest string made of the request's own buffer.
                    let (v, counted) =
                        abx_core::dispatch::params_value(method, params, cx.conn.pool())?;
                    let mut r = if method == "files/upload" {
                        self.upload(cx, &v).await?
                    } else {
                        self.download(cx, &v).await?
                    };
                    drop(counted);
                    tag_provider(&mut r, &self.record.id);
                    return serde_json::value::to_raw_value(&r).map_err(AbxError::internal);
                }
                _ => {}
            }
            let timeout = (method == "exec/run").then(|| run_wait(&params));
            // Only a reply that opens a stream needs the connection and the reply's signal.
            // The request's cancellation is its caller's: the core drops this call, and the
            // host then tells the plugin (no second waiter on the token per call).
            let stream = epp::opens_stream(method);
            let raw = self
                .host
                .call_owned(
                    method,
                    params,
                    stream.then(|| cx.conn.clone()),
                    stream.then(|| cx.replied.clone()),
                    None,
                    timeout,
                    Some(cx.hold.clone()),
                )
                .await?;
            if !method.starts_with("sandbox/") {
                return Ok(raw);
            }
            self.tagged(raw)
        })
    }

    fn shutdown(&self) -> BoxFut<'_, ()> {
        Box::pin(async move { self.host.stop().await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the Value round trip made of a reply: the reference the raw tagging must match.
    fn by_value(text: &str, id: &str) -> Value {
        let mut v: Value = serde_json::from_str(text).unwrap();
        tag_provider(&mut v, id);
        v
    }

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn raw_tagging_matches_the_value_round_trip() {
        let cases = [
            // Lists: objects tagged, anything else kept; a plugin's own provider replaced.
            r#"{"sandboxes":[{"id":"a","state":"running"},{"id":"b","provider":"spoof"}]}"#,
            r#"{"sandboxes":[ {"id":"a"} , 3, "x", null, [1], {}], "next": "c"}"#,
            r#"{"sandboxes":[{"id":"a","n":1e2,"deep":{"z":1,"a":[{"provider":"kept"}]}}]}"#,
            r#"{"sandboxes":[{"id":"a","id":"b","provider":"x","provider":"y"}]}"#,
            // One sandbox: tagged when it has an id, null included.
            r#"{"id":"a","state":"running","provider":"spoof"}"#,
            r#"{"id":null}"#,
            r#"{"sandboxes":null,"id":"a"}"#,
            r#"{"sandboxes":"nope","id":"a"}"#,
            r#"{"sandboxes":{"id":"x"},"id":"a"}"#,
            // A member named twice: the last one counts, as it did.
            r#"{"id":"a","id":"b"}"#,
            r#"{"sandboxes":[],"sandboxes":[{"id":"a"}]}"#,
            r#"{"sandboxes":[{"id":"a"}],"sandboxes":[]}"#,
        ];
        for text in cases {
            let got = tag_provider_raw(raw(text), "echo").unwrap();
            let got: Value = serde_json::from_str(got.get()).unwrap();
            assert_eq!(got, by_value(text, "echo"), "{text}");
        }
        // The spoofed provider is the broker's, never the plugin's.
        let got = tag_provider_raw(raw(cases[0]), "echo").unwrap();
        assert!(!got.get().contains("spoof"), "{}", got.get());
    }

    #[test]
    fn a_reply_with_nothing_to_tag_is_passed_on_as_it_came() {
        for text in [
            r#"{"sandboxes":[]}"#,
            r#"{ "sandboxes" : [ ] , "n" : 1.50 }"#,
            r#"{"sandboxes":[1,"x",null]}"#,
            r#"{"killed":true}"#,
            r#"{}"#,
            r#"[{"id":"a"}]"#,
            r#""a string""#,
            r#"null"#,
            r#"{"sandboxes":null}"#,
        ] {
            let got = tag_provider_raw(raw(text), "echo").unwrap();
            assert_eq!(got.get(), text);
            assert_eq!(
                serde_json::from_str::<Value>(got.get()).unwrap(),
                by_value(text, "echo"),
                "{text}"
            );
        }
    }
}
