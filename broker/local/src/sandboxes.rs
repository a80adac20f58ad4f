//! The `local` provider itself: sandbox records, lifetimes, and the method table.
//!
//! A sandbox is a directory `data/local/sandboxes/<id>/` holding `sandbox.json` (its record,
//! written atomically), `workspace/` and `tmp/`. Records are loaded at start; expired ones
//! are reaped then and whenever a lifetime runs out (a reaper task sleeps until the next
//! expiry). Lifetimes are the daemon's to enforce, so they survive restarts.

use super::container::{self, Container};
use super::exec::{self, PtySize};
use super::limits::{self, Cgroup, Limits};
use super::pool::{Pool, Shape};
use super::templates::{self, Store};
use super::workspace::mounts::{self, MountRecord};
use super::{files, isolate, procs, watch, SandboxDirs};
use abx_core::provider::{BoxFut, CallCx, Kind, Provider, ProviderSummary, Reply};
use abx_home::util::{now_ms, replace_file, rfc3339};
use abx_protocol::api::{
    CodeContextParams, CodeCreateContextParams, CodeRunParams, ExecIdParams, ExecKillParams,
    ExecResizeParams, ExecRunParams, ExecStartParams, ExecWriteParams, FilesListParams,
    FilesReadParams, FilesWriteParams, MkdirParams, PathParams, PortParams, ProcessKillParams,
    RemoveParams, RenameParams, SandboxCreateParams, SandboxParams, SetNetworkParams,
    SetTimeoutParams, TemplatesParams, TransferParams, UnwatchParams, WatchParams,
};
use abx_protocol::{features, AbxError, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tracing::{info, warn};

/// Default lifetime of a sandbox, seconds.
pub const DEFAULT_TIMEOUT: u64 = 300;
/// Longest lifetime, seconds (30 days).
pub const MAX_TIMEOUT: u64 = 30 * 86_400;
/// The templates the local provider knows.
pub const TEMPLATES: &[&str] = &["base"];

/// What the local provider declares: everything it implements, nothing else.
pub const FEATURES: &[&str] = &[
    "sandbox.lifecycle",
    "sandbox.timeout",
    "sandbox.pause",
    "sessions",
    "exec.run",
    "exec.stream",
    "pty",
    "process.manage",
    "files.rw",
    "files.watch",
    "files.transfer",
    "ports.url",
    "code.interpret",
    "templates.read",
    "templates.build",
    "storage.mount",
    "network.vpc",
];

/// A sandbox's persisted record.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    id: String,
    template: String,
    status: String,
    created_ms: i64,
    expires_ms: i64,
    timeout: u64,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    metadata: BTreeMap<String, Value>,
    /// `none`, `internet` or `host` (`none` for a sandbox with a policy: what a daemon that
    /// does not know `policy` would make of it is no network at all).
    #[serde(default = "default_network")]
    network: String,
    /// A network policy `{allow, deny?}` as given (issue 44): the sandbox's only way out is
    /// its egress proxy ([`super::egress`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<Value>,
    /// Memory, CPU and process limits.
    #[serde(default)]
    limits: Limits,
    /// The image it was made from (a template other than `base`): pinned by digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<RecordImage>,
    /// Host directories mounted into it (issue 43), in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    mounts: Vec<MountRecord>,
}

/// The image of a sandbox made from a template.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RecordImage {
    /// Its manifest digest.
    digest: String,
    /// Its config (Env, WorkingDir, User, ...).
    config: templates::ImageConfig,
    /// Whether its root is a full copy (overlayfs refused) rather than an overlay.
    #[serde(default)]
    copy: bool,
}

fn default_network() -> String {
    "none".into()
}

struct Sandbox {
    dirs: SandboxDirs,
    /// The template store (an image sandbox's lower layer).
    store: Arc<Store>,
    rec: Mutex<Record>,
    /// The init of a running sandbox (namespaces model); started again on first use after a
    /// daemon restart.
    container: tokio::sync::Mutex<Option<Arc<Container>>>,
    /// Its cgroup (where one can be made), from the first start of its container.
    cgroup: Mutex<Option<Arc<Cgroup>>>,
    /// Port forwarders: sandbox port -> (host port, task).
    forwards: tokio::sync::Mutex<HashMap<u16, (u16, tokio::task::JoinHandle<()>)>>,
    /// What a mount's source may not be.
    guard: Arc<mounts::Guard>,
    /// Its egress proxy, when its network is a policy.
    egress: Mutex<Option<super::egress::SandboxEgress>>,
    /// The mounts' sources as opened and checked at create, for the first start of the
    /// init; later starts (after a daemon restart) open them again ([`mounts::reopen`]).
    opened: Mutex<Option<Vec<std::os::fd::OwnedFd>>>,
}

/// What an exec in a sandbox needs besides its params (see [`Sandbox::exec_parts`]).
struct ExecParts {
    env: std::collections::BTreeMap<String, String>,
    image: Option<templates::ImageConfig>,
    container: Option<Arc<Container>>,
    cgroup: Option<Arc<Cgroup>>,
    home: &'static str,
}

/// `HOME` of a sandbox whose `/workspace` is a host directory (see [`Sandbox::home`]).
const HOME_IN_TMP: &str = "/tmp/home";

/// Make `/tmp/home` (the sandbox's `tmp/home`), owned by the sandbox's user, before its init
/// starts: nothing of the sandbox runs then; an entry already there (even a symlink) is kept
/// as it is, never followed.
fn make_home(dirs: &SandboxDirs) {
    use std::os::unix::fs::DirBuilderExt;
    let home = dirs.tmp.join("home");
    if std::fs::DirBuilder::new().mode(0o700).create(&home).is_ok() {
        if let Some((u, g)) = container::sandbox_owner() {
            let _ = std::os::unix::fs::lchown(&home, Some(u), Some(g));
        }
    }
}

impl ExecParts {
    fn site<'a>(&'a self, sb: &'a Sandbox, id: &'a str) -> exec::Site<'a> {
        exec::Site {
            dirs: &sb.dirs,
            id,
            env: &self.env,
            image: self.image.as_ref(),
            container: self.container.as_deref(),
            cgroup: self.cgroup.clone(),
            home: self.home,
        }
    }
}

impl Sandbox {
    /// Its env, its running container (started if there is none) and its cgroup.
    async fn exec_parts(&self) -> Result<ExecParts, AbxError> {
        let (env, image) = {
            let r = self.rec.lock().expect("record");
            (r.env.clone(), r.image.as_ref().map(|i| i.config.clone()))
        };
        let container = self.container().await?;
        let cgroup = self.cgroup.lock().expect("cgroup").clone();
        let mut env = env;
        // A policy sandbox's commands find its proxy (over the create-time env: the proxy is
        // the only way out; a command's own env may still set them for itself).
        let (port, ca_env) = match self.egress.lock().expect("egress").as_mut() {
            // A policy that adds headers: the sandbox trusts its proxy's CA (its own only).
            Some(e) => (e.port, e.ca_env(&self.dirs.tmp)),
            None => (None, Vec::new()),
        };
        if let Some(port) = port {
            env.extend(super::egress::proxy_env(port));
            env.extend(ca_env);
        }
        Ok(ExecParts {
            env,
            image,
            container,
            cgroup,
            home: self.home(),
        })
    }

    /// Its commands' `HOME`: `/workspace`, unless a host directory is mounted there; then
    /// `/tmp/home`, so shells and tools keep their dotfiles (`.bash_history`, caches) out of
    /// the user's project and out of `sandbox/diff`.
    fn home(&self) -> &'static str {
        let r = self.rec.lock().expect("record");
        if r.mounts.iter().any(|m| m.target == "/workspace") {
            HOME_IN_TMP
        } else {
            "/workspace"
        }
    }

    fn save(&self) -> Result<(), AbxError> {
        let rec = self.rec.lock().expect("record").clone();
        replace_file(
            &self.dirs.root.join("sandbox.json"),
            &serde_json::to_vec_pretty(&rec).unwrap_or_default(),
        )
        .map_err(|e| AbxError::internal(format!("cannot save sandbox record: {e}")))
    }

    fn view(&self) -> Value {
        let r = self.rec.lock().expect("record");
        let mut v = json!({
            "id": r.id,
            "provider": "local",
            "status": r.status,
            "template": r.template,
            "url": format!("local://{}", r.id),
            "region": "local",
            "timeout": r.timeout,
            "startedAt": rfc3339(r.created_ms / 1000),
            "expiresAt": rfc3339(r.expires_ms / 1000),
            "metadata": r.metadata,
            "network": r.network,
        });
        // Only for an image sandbox: a host sandbox's view stays as it was.
        if let Some(i) = &r.image {
            v["templateDigest"] = json!(i.digest);
        }
        if !r.mounts.is_empty() {
            v["mounts"] = json!(r.mounts.iter().map(MountRecord::view).collect::<Vec<_>>());
        }
        if let Some(spec) = &r.policy {
            v["network"] = match self.egress.lock().expect("egress").as_ref() {
                Some(e) => e.view(),
                None => super::egress::view(spec, &[]),
            };
        }
        v
    }

    /// The sandbox's running container, started when there is none (namespaces model only).
    async fn container(&self) -> Result<Option<Arc<Container>>, AbxError> {
        if isolate::model() != isolate::Model::Namespaces {
            return Ok(None);
        }
        let mut g = self.container.lock().await;
        if let Some(c) = g.as_ref().filter(|c| c.alive()) {
            return Ok(Some(c.clone()));
        }
        let (id, network, lim, image, recs) = {
            let r = self.rec.lock().expect("record");
            (
                r.id.clone(),
                r.network.clone(),
                r.limits.clone(),
                r.image.clone(),
                r.mounts.clone(),
            )
        };
        // The mounts' sources: as opened at create, else opened again and checked to be the
        // same directories (E2010 otherwise: the sandbox is not started without them).
        let (mount_cfgs, mount_fds) = if recs.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let taken = self.opened.lock().expect("opened").take();
            let fds = match taken {
                Some(fds) => fds,
                None => {
                    let guard = self.guard.clone();
                    let recs = recs.clone();
                    tokio::task::spawn_blocking(move || {
                        recs.iter()
                            .map(|r| mounts::reopen(r, &guard))
                            .collect::<Result<Vec<_>, _>>()
                    })
                    .await
                    .map_err(AbxError::internal)??
                }
            };
            let pairs: Vec<_> = fds.into_iter().zip(recs.iter().cloned()).collect();
            let root = self.dirs.root.clone();
            tokio::task::spawn_blocking(move || mounts::for_init(&root, &pairs))
                .await
                .map_err(AbxError::internal)??
        };
        let t0 = std::time::Instant::now();
        let mut spare = None;
        let cg = {
            let mut g = self.cgroup.lock().expect("cgroup");
            if g.is_none() {
                spare = container::take_spare(&lim);
                *g = match spare.as_mut() {
                    Some(sp) => {
                        let mut cg = sp.cgroup.clone();
                        cg.rename(&id);
                        sp.cgroup = cg.clone();
                        Some(Arc::new(cg))
                    }
                    None => Cgroup::create(&id, &lim).map(Arc::new),
                };
            }
            g.clone()
        };
        let cgroup_us = t0.elapsed().as_micros();
        // Without a pids controller, RLIMIT_NPROC (counted per user namespace) bounds it.
        let nproc = match &cg {
            Some(c) if c.enforced.contains(&"pids") => None,
            _ => lim.pids,
        };
        container::own_dirs(&self.dirs);
        if self.home() == HOME_IN_TMP {
            make_home(&self.dirs);
        }
        let from_spare = spare.is_some();
        let procs = match spare {
            Some(_) => Vec::new(),
            None => cg.as_ref().map(|c| c.open_procs()).unwrap_or_default(),
        };
        let how = match spare {
            Some(sp) => container::Start::Spare(sp),
            None => container::Start::Fresh(procs.iter().map(|f| f.as_raw_fd()).collect()),
        };
        let t1 = std::time::Instant::now();
        let mut cfg = container::config(&self.dirs, &id, &network, nproc);
        cfg.mounts = mount_cfgs;
        cfg.fds = mount_fds.into_iter().map(Arc::new).collect();
        if let Some(img) = &image {
            let root = image_root(&self.dirs, &self.store, img)?;
            if let Some((u, g)) = image_user(&self.store, img)? {
                run_as(&mut cfg, u, g);
            }
            cfg.image = Some(root);
        }
        let mut started = Container::start(cfg.clone(), how).await;
        drop(procs);
        if from_spare && started.is_err() {
            // The spare went away under us (its process died, its cgroup was removed): start
            // afresh, in a cgroup of the sandbox's own.
            tracing::warn!(sandbox = %id, "the spare sandbox process failed; starting afresh");
            let stale = self.cgroup.lock().expect("cgroup").take();
            if let Some(cg) = stale {
                // Gone before the new one takes its name.
                let _ = tokio::task::spawn_blocking(move || cg.remove_blocking()).await;
            }
            let cg = Cgroup::create(&id, &lim).map(Arc::new);
            *self.cgroup.lock().expect("cgroup") = cg.clone();
            let procs = cg.as_ref().map(|c| c.open_procs()).unwrap_or_default();
            let fds = procs.iter().map(|f| f.as_raw_fd()).collect();
            started = Container::start(cfg, container::Start::Fresh(fds)).await;
            drop(procs);
        }
        // The next sandbox's outer process, made while nobody waits for it.
        tokio::task::spawn_blocking(move || container::make_spare(lim));
        let c = started?;
        if self.rec.lock().expect("record").policy.is_some() {
            // Its only way out: a listener in its namespace, served by its egress proxy.
            let served = match c.listen().await {
                Ok(fd) => match self.egress.lock().expect("egress").as_mut() {
                    Some(eg) => eg.serve(fd).map(|_| ()),
                    None => Err(std::io::Error::other("no egress proxy")),
                },
                Err(e) => Err(e),
            };
            if let Err(e) = served {
                c.kill().await;
                return Err(AbxError::new(
                    ErrorCode::SandboxCreateFailed,
                    &[
                        ("detail", &format!("the egress proxy's listener: {e}")),
                        ("provider", "local"),
                    ],
                ));
            }
        }
        if !recs.is_empty() {
            // Asked for now: a paused sandbox's init does not answer (files/* use it).
            let _ = c.root().await;
        }
        tracing::debug!(
            sandbox = %id,
            cgroup_us,
            from_spare,
            container_us = t1.elapsed().as_micros(),
            "sandbox container started"
        );
        *g = Some(c.clone());
        Ok(Some(c))
    }

    /// Its directories, with its whole view ([`crate::RootView`]) when one of `paths` needs
    /// it (outside `/workspace` and `/tmp`, or on a mount): the container is started then.
    async fn dirs_for(&self, paths: &[&str]) -> Result<SandboxDirs, AbxError> {
        let mut dirs = self.dirs.clone();
        if isolate::model() != isolate::Model::Namespaces {
            return Ok(dirs);
        }
        let targets: Vec<String> = self
            .rec
            .lock()
            .expect("record")
            .mounts
            .iter()
            .map(|m| m.target.clone())
            .collect();
        if !paths.iter().any(|p| crate::in_view(p, &targets)) {
            return Ok(dirs);
        }
        let Some(c) = self.container().await? else {
            return Ok(dirs);
        };
        let root = c
            .root()
            .await
            .map_err(|e| AbxError::internal(format!("the sandbox's root: {e}")))?;
        dirs.view = Some(Arc::new(crate::RootView {
            root,
            mounts: targets,
            owner: container::sandbox_owner(),
        }));
        Ok(dirs)
    }

    /// A host loopback port forwarded to `port` on the sandbox's loopback (in its network
    /// namespace): the same number when it is free on the host, else an ephemeral one. One
    /// forwarder per port, for the life of the sandbox's container.
    async fn forward(&self, c: Arc<Container>, port: u16) -> Result<u16, AbxError> {
        let mut fw = self.forwards.lock().await;
        if let Some((host_port, task)) = fw.get(&port) {
            if !task.is_finished() {
                return Ok(*host_port);
            }
        }
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            Ok(l) => l,
            Err(_) => tokio::net::TcpListener::bind(("127.0.0.1", 0))
                .await
                .map_err(|e| AbxError::internal(format!("port forward: {e}")))?,
        };
        let host_port = listener.local_addr().map_err(AbxError::internal)?.port();
        let task = tokio::spawn(super::net::forward(listener, c, port));
        fw.insert(port, (host_port, task));
        Ok(host_port)
    }

    /// Kill every process of the sandbox: its container, or (other models) every process
    /// found by its marker.
    async fn stop_processes(&self) {
        for (_, (_, task)) in self.forwards.lock().await.drain() {
            task.abort();
        }
        if let Some(eg) = self.egress.lock().expect("egress").as_mut() {
            eg.stop_serving();
        }
        let c = self.container.lock().await.take();
        let cg = self.cgroup.lock().expect("cgroup").take();
        if let Some(cg) = &cg {
            cg.freeze(false);
        }
        match c {
            Some(c) => {
                c.kill().await;
                if let Some(cg) = cg {
                    // The kernel frees an emptied cgroup a little later: remove it in the
                    // background instead of making the caller wait.
                    tokio::spawn(async move { cg.remove().await });
                }
            }
            None => {
                let id = self.rec.lock().expect("record").id.clone();
                procs::signal_all(&id, libc::SIGKILL);
                procs::signal_all(&id, libc::SIGCONT);
            }
        }
    }
}

/// The `[local]` table of the broker config (`config.toml`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// The cap on live sandboxes (`max_sandboxes`, default 64).
    pub max_sandboxes: usize,
    /// The network mode of a sandbox created without one (`network`, default `none`).
    pub network: String,
    /// Limits of a sandbox created without them (`memory`, `cpus`, `pids`).
    pub limits: Limits,
    /// Sandboxes kept built ahead of any create (`pool`, default 2; 0: off; issue 48).
    pub pool: usize,
    /// Registries (`insecure_registries`, `[local.registry_auth]`).
    pub registry: templates::RegistrySettings,
    /// Caps on an image's size (`template_max_bytes`, `template_max_entries`).
    pub template_limits: templates::Limits,
    /// The broker's own directories (config, data, runtime, logs): never a mount's source.
    pub protected: Vec<PathBuf>,
    /// The named sets of network policies (`[network.sets]` of the broker config: `@NAME`).
    pub sets: abx_egress::Sets,
    /// The broker's secret store for egress headers (`secret:KEY`; the daemon's, kept in its
    /// config dir; in memory by default).
    pub secrets: std::sync::Arc<abx_egress::SecretStore>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_sandboxes: 64,
            network: "none".into(),
            limits: limits::DEFAULT,
            pool: DEFAULT_POOL,
            registry: templates::RegistrySettings::default(),
            template_limits: templates::Limits::default(),
            protected: Vec::new(),
            sets: abx_egress::Sets::new(),
            secrets: std::sync::Arc::new(abx_egress::SecretStore::in_memory()),
        }
    }
}

/// Ready sandboxes kept by default (`[local] pool`), and the most the config may ask.
pub const DEFAULT_POOL: usize = 2;
pub const MAX_POOL: usize = 16;
/// No pooled sandbox is built while the host has less memory available than this (MiB).
const POOL_MIN_AVAILABLE_MB: u64 = 512;

/// The network modes of a local sandbox.
pub const NETWORK_MODES: &[&str] = &["none", "internet", "host"];

impl Settings {
    /// These settings, with the broker's directories of `paths` refused as mount sources.
    pub fn protecting(mut self, paths: &abx_home::paths::Paths) -> Settings {
        self.protected.extend([
            paths.config_dir.clone(),
            paths.data_dir.clone(),
            paths.runtime_dir.clone(),
            paths.log_dir.clone(),
        ]);
        self.protected
            .extend(paths.user_runtime_dirs.iter().cloned());
        self
    }

    /// Read the `[local]` table (bad values are logged and replaced by the defaults).
    pub fn from_config(config: &toml::Table) -> Settings {
        let mut s = Settings {
            sets: super::egress::sets_from_config(config),
            ..Settings::default()
        };
        let Some(t) = config.get("local").and_then(|v| v.as_table()) else {
            return s;
        };
        if let Some(v) = t.get("max_sandboxes") {
            match v.as_integer().filter(|n| *n >= 1) {
                Some(n) => s.max_sandboxes = n as usize,
                None => warn!(value = %v, "ignoring [local] max_sandboxes: not a positive integer"),
            }
        }
        if let Some(v) = t.get("pool") {
            match v.as_integer().filter(|n| (0..=MAX_POOL as i64).contains(n)) {
                Some(n) => s.pool = n as usize,
                None => {
                    warn!(value = %v, "ignoring [local] pool: not an integer from 0 to {MAX_POOL}")
                }
            }
        }
        let positive_int = |v: &toml::Value| v.as_integer().filter(|n| *n > 0).map(|n| n as u64);
        if let Some(v) = t.get("memory") {
            match v
                .as_str()
                .and_then(limits::parse_size)
                .or_else(|| positive_int(v))
            {
                Some(n) => s.limits.memory = Some(n),
                None => warn!(value = %v, "ignoring [local] memory"),
            }
        }
        if let Some(v) = t.get("cpus") {
            match v
                .as_float()
                .or_else(|| positive_int(v).map(|n| n as f64))
                .filter(|f| *f > 0.0)
            {
                Some(f) => s.limits.cpus = Some(f),
                None => warn!(value = %v, "ignoring [local] cpus"),
            }
        }
        if let Some(v) = t.get("pids") {
            match positive_int(v) {
                Some(n) => s.limits.pids = Some(n),
                None => warn!(value = %v, "ignoring [local] pids"),
            }
        }
        if let Some(v) = t.get("template_max_bytes") {
            match v
                .as_str()
                .and_then(limits::parse_size)
                .or_else(|| positive_int(v))
                .filter(|n| *n > 0)
            {
                Some(n) => s.template_limits.max_bytes = n,
                None => warn!(value = %v, "ignoring [local] template_max_bytes: not a size"),
            }
        }
        if let Some(v) = t.get("template_max_entries") {
            match positive_int(v) {
                Some(n) => s.template_limits.max_entries = n,
                None => {
                    warn!(value = %v, "ignoring [local] template_max_entries: not a positive integer")
                }
            }
        }
        if let Some(v) = t.get("insecure_registries") {
            match v.as_array() {
                Some(a) => {
                    s.registry.insecure = a
                        .iter()
                        .filter_map(|x| x.as_str().map(str::to_owned))
                        .collect()
                }
                None => warn!("ignoring [local] insecure_registries: not a list of hosts"),
            }
        }
        if let Some(a) = t.get("registry_auth").and_then(|v| v.as_table()) {
            for (host, v) in a {
                match v.as_str().and_then(|c| c.split_once(':')) {
                    Some((u, p)) => {
                        s.registry
                            .auth
                            .insert(host.clone(), (u.to_owned(), p.to_owned()));
                    }
                    // The value is a secret: never logged.
                    None => {
                        warn!(registry = %host, "ignoring [local.registry_auth] entry: not \"user:password\"")
                    }
                }
            }
        }
        if let Some(v) = t.get("network") {
            match v.as_str().filter(|n| NETWORK_MODES.contains(n)) {
                Some(n) => s.network = n.to_owned(),
                None => {
                    warn!(value = %v, "ignoring [local] network: not one of none, internet, host")
                }
            }
        }
        s
    }
}

struct Inner {
    /// What a mount's source may not be (the broker's directories, the home directory).
    guard: Arc<mounts::Guard>,
    /// What the egress proxies of policy sandboxes share (guard, sets, resolver).
    net: super::egress::Net,
    settings: Settings,
    templates: Arc<Store>,
    summary: ProviderSummary,
    root: PathBuf,
    sandboxes: Mutex<HashMap<String, Arc<Sandbox>>>,
    streams: Mutex<HashMap<String, Arc<exec::Stream>>>,
    watches: Mutex<HashMap<String, (String, watch::Watch)>>,
    next: AtomicU64,
    reaper: Arc<Notify>,
    /// Where the reaper reports expired sandboxes.
    events: abx_core::events::Events,
    /// The sandboxes' code contexts (`code/*`).
    code: super::code::Contexts,
    /// What creates under way hold of the caps (see [`Slot`]).
    reserved: Mutex<Reserved>,
    /// The most processes the live sandboxes' limits may add up to.
    pids_budget: PidsBudget,
    /// Ready sandboxes (issue 48), built under `pool_root` and moved beside the others when
    /// taken.
    pool: Pool<Box<Sandbox>>,
    pool_root: PathBuf,
    /// Itself, for the refill task.
    me: std::sync::Weak<Inner>,
}

/// What the creates under way hold of the caps: sandboxes being built, and their process
/// limits.
#[derive(Debug, Default)]
struct Reserved {
    count: usize,
    pids: u64,
}

/// The budget of processes across all live sandboxes (the sum of their `pids` limits): half
/// of the host's `pid_max`, so that sandboxes together cannot take the host's last pids (the
/// defaults, 64 sandboxes of 1024, are twice a `pid_max` of 32768).
#[derive(Clone, Copy, Debug)]
struct PidsBudget {
    /// `/proc/sys/kernel/pid_max` (of the daemon's PID namespace) when it was read.
    pid_max: Option<u64>,
    /// Half of it (unbounded when it could not be read).
    budget: u64,
}

impl PidsBudget {
    fn of_host() -> PidsBudget {
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|n| *n > 0);
        PidsBudget {
            pid_max,
            budget: pid_max.map_or(u64::MAX, |n| n / 2),
        }
    }
}

/// A slot among the live sandboxes, taken before a sandbox is built and counted with them
/// against `max_sandboxes` and the process budget, so the caps hold however many creates run
/// at once (issue 42: checked before and counted after, 150 concurrent creates made 102
/// sandboxes against a cap of 64). Dropped (the create failed), it is given back;
/// [`Slot::fill`] turns it into the sandbox.
struct Slot<'a> {
    inner: &'a Inner,
    pids: u64,
}

impl Slot<'_> {
    /// The sandbox is built: it takes the slot's place among the live ones.
    fn fill(self, id: String, sb: Arc<Sandbox>) {
        let inner = self.inner;
        let mut map = inner.sandboxes.lock().expect("sandboxes");
        map.insert(id, sb);
        // Given back while the map is held: the sandbox is never counted twice, nor missed.
        drop(self);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut r = self.inner.reserved.lock().expect("reserved");
        r.count -= 1;
        r.pids -= self.pids;
    }
}

/// `ABX_TEST_HOOKS=1` with `ABX_TEST_OVERLAY=refused`: image sandboxes take the fallback
/// root (a copy) as where the kernel refuses overlayfs (tests only).
fn overlay_refused_for_tests() -> bool {
    std::env::var("ABX_TEST_HOOKS").is_ok_and(|v| v == "1")
        && std::env::var("ABX_TEST_OVERLAY").is_ok_and(|v| v == "refused")
}

/// The writable layer of an image sandbox (and overlayfs's work dir beside it).
fn layer_dirs(dirs: &SandboxDirs) -> (PathBuf, PathBuf, PathBuf) {
    let l = dirs.root.join(".layer");
    (l.join("upper"), l.join("work"), l.join("copy"))
}

/// Make an image sandbox's layer directories, owned by the sandbox's user.
fn prepare_layer(dirs: &SandboxDirs, _image: &Option<RecordImage>) -> Result<(), AbxError> {
    let (upper, work, _) = layer_dirs(dirs);
    for d in [&upper, &work] {
        std::fs::create_dir_all(d).map_err(|e| {
            AbxError::new(
                ErrorCode::SandboxCreateFailed,
                &[("detail", &e.to_string()), ("provider", "local")],
            )
        })?;
        if let Some((u, g)) = container::sandbox_owner() {
            let _ = std::os::unix::fs::lchown(d, Some(u), Some(g));
        }
    }
    Ok(())
}

/// The image's `User` as numeric ids: `uid[:gid]`, or names of the image's own
/// `/etc/passwd` and `/etc/group` (a name without a group: the user's primary group).
fn image_user(store: &Store, img: &RecordImage) -> Result<Option<(u32, u32)>, AbxError> {
    let Some(user) = img.config.user.as_deref().filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let bad = |what: &str| {
        AbxError::new(
            ErrorCode::SandboxCreateFailed,
            &[
                ("detail", &format!("the image's User {user:?}: {what}")),
                ("provider", "local"),
            ],
        )
    };
    let root = store.rootfs(&img.digest);
    let table = |name: &str| -> Vec<Vec<String>> {
        root.as_ref()
            .and_then(|r| std::fs::read_to_string(r.join("etc").join(name)).ok())
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(':').map(str::to_owned).collect())
            .collect()
    };
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let passwd = table("passwd");
    let (uid, primary) = match u.parse::<u32>() {
        Ok(n) => (
            n,
            passwd
                .iter()
                .find(|f| f.get(2).map(String::as_str) == Some(u))
                .and_then(|f| f.get(3)?.parse().ok()),
        ),
        Err(_) => {
            let f = passwd
                .iter()
                .find(|f| f.first().map(String::as_str) == Some(u))
                .ok_or_else(|| bad("no such user in the image's /etc/passwd"))?;
            (
                f.get(2)
                    .and_then(|x| x.parse().ok())
                    .ok_or_else(|| bad("bad /etc/passwd"))?,
                f.get(3).and_then(|x| x.parse().ok()),
            )
        }
    };
    let gid = match g {
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => table("group")
                .iter()
                .find(|f| f.first().map(String::as_str) == Some(g))
                .and_then(|f| f.get(2)?.parse().ok())
                .ok_or_else(|| bad("no such group in the image's /etc/group"))?,
        },
        None => primary.unwrap_or(uid),
    };
    Ok(Some((uid, gid)))
}

/// Make the sandbox's processes run as `uid:gid` inside: the one id a sandbox has is mapped
/// to the same host id as before, only its number inside changes (every file of the image,
/// `/workspace` and `/tmp` then belong to it).
fn run_as(cfg: &mut super::init::Config, uid: u32, gid: u32) {
    let outer = |map: &str| map.split_whitespace().nth(1).unwrap_or("0").to_owned();
    cfg.uid_map = format!("{uid} {} 1", outer(&cfg.uid_map));
    cfg.gid_map = format!("{gid} {} 1", outer(&cfg.gid_map));
    cfg.inner_uid = uid;
    cfg.inner_gid = gid;
}

/// The root of an image sandbox for its init.
fn image_root(
    dirs: &SandboxDirs,
    store: &Store,
    img: &RecordImage,
) -> Result<super::init::ImageRoot, AbxError> {
    let (upper, work, copy) = layer_dirs(dirs);
    if img.copy {
        return Ok(super::init::ImageRoot {
            lower: None,
            upper: copy,
            work,
        });
    }
    let lower = store.rootfs(&img.digest).ok_or_else(|| {
        AbxError::new(
            ErrorCode::SandboxCreateFailed,
            &[
                (
                    "detail",
                    &format!(
                        "the image {} of this sandbox is no longer stored",
                        img.digest
                    ),
                ),
                ("provider", "local"),
            ],
        )
    })?;
    Ok(super::init::ImageRoot {
        lower: Some(lower),
        upper,
        work,
    })
}

fn parse<T: for<'de> Deserialize<'de>>(method: &str, v: Value) -> Result<T, AbxError> {
    serde_json::from_value(v).map_err(|e| AbxError::invalid_params(method, e))
}

fn timeout_secs(v: &Value) -> Result<u64, AbxError> {
    let bad = |d: &str| {
        AbxError::new(
            ErrorCode::InvalidTimeout,
            &[("timeout", &v.to_string()), ("detail", d)],
        )
    };
    let n = v.as_f64().ok_or_else(|| bad("not a number"))?;
    if n.is_nan() || n < 1.0 {
        return Err(bad("must be at least 1 second"));
    }
    if n > MAX_TIMEOUT as f64 {
        return Err(bad("must be at most 30 days (2592000 s)"));
    }
    Ok(n.round() as u64)
}

fn rand_id() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n as usize == buf.len() {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Inner {
    /// `exec/run`, answered as raw JSON (see [`exec::run`]).
    async fn exec_run(self: &Arc<Self>, cx: &CallCx, params: Value) -> Reply {
        let method = "exec/run";
        let mut p: ExecRunParams = parse(method, params)?;
        let once = self.for_once(method, &p.sandbox, p.create.take()).await?;
        if let Some(id) = &once {
            p.sandbox = id.clone();
        }
        // Killed behind the reply, or when the request is cancelled (this future dropped):
        // the caller never waits on its tear-down.
        let _kill = KillOnDrop(once.clone().map(|id| (self.me.clone(), id)));
        let ran = async {
            let sb = self.running(&p.sandbox)?;
            let id = p.sandbox.clone();
            let parts = sb.exec_parts().await?;
            exec::run(
                parts.site(&sb, &id),
                p.into(),
                cx.conn.pool().clone(),
                &cx.hold,
            )
            .await
        }
        .await;
        let Some(id) = once else {
            return ran;
        };
        // The reply names the sandbox it made (`{"sandbox": ID, ...}`, still raw).
        let raw = ran?;
        let body = raw.get().trim_start();
        let named = match body.strip_prefix('{') {
            Some(rest) => format!(
                "{{\"sandbox\":{}{}{rest}",
                json!(format!("local:{id}")),
                if rest.trim_start().starts_with('}') {
                    ""
                } else {
                    ","
                }
            ),
            None => return Ok(raw),
        };
        serde_json::value::RawValue::from_string(named).map_err(AbxError::internal)
    }

    /// `create` of `exec/run` and `exec/start` (issue 48): a sandbox made for one command,
    /// its id (`None` when the request names a sandbox). Reported `created` as a
    /// `sandbox/create` would be.
    async fn for_once(
        &self,
        method: &str,
        sandbox: &str,
        create: Option<Box<SandboxCreateParams>>,
    ) -> Result<Option<String>, AbxError> {
        let Some(create) = create else {
            if sandbox.is_empty() {
                return Err(AbxError::invalid_params(
                    method,
                    "sandbox (or create) is required",
                ));
            }
            return Ok(None);
        };
        if !sandbox.is_empty() {
            return Err(AbxError::invalid_params(
                method,
                "give sandbox or create, not both",
            ));
        }
        let view = self.create(*create).await?;
        let id = view["id"].as_str().unwrap_or_default().to_owned();
        self.events.emit("local", &id, "created", Some(&view));
        Ok(Some(id))
    }

    /// `exec/start` in `p.sandbox`; `once`: the sandbox was made for this command (it is
    /// killed when the command's stream ends, and the reply names it).
    async fn exec_start(
        self: &Arc<Self>,
        cx: &CallCx,
        p: ExecStartParams,
        once: Option<String>,
    ) -> Result<Value, AbxError> {
        let sb = self.running(&p.sandbox)?;
        let exec_id = format!(
            "e-{}-{}",
            self.next.fetch_add(1, Ordering::Relaxed),
            rand_id()
        );
        let weak = Arc::downgrade(self);
        let id = p.sandbox.clone();
        let parts = sb.exec_parts().await?;
        let ephemeral = once.clone();
        let s = exec::start(
            parts.site(&sb, &id),
            p,
            exec_id.clone(),
            cx.conn.clone(),
            cx.replied.clone(),
            move |eid| {
                if let Some(me) = weak.upgrade() {
                    me.streams.lock().expect("streams").remove(eid);
                    if let Some(sid) = ephemeral {
                        me.kill_behind(sid);
                    }
                }
            },
        )
        .await?;
        let pid = s.view_pid;
        self.streams
            .lock()
            .expect("streams")
            .insert(exec_id.clone(), s);
        Ok(match once {
            Some(sid) => json!({"execId": exec_id, "pid": pid, "sandbox": format!("local:{sid}")}),
            None => json!({"execId": exec_id, "pid": pid}),
        })
    }

    /// Kill a sandbox made for one command once it has ended, in the background, and report
    /// it `killed`.
    fn kill_behind(&self, id: String) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            if me.kill(&id).await["killed"] == true {
                me.events.emit("local", &id, "killed", None);
            }
        });
    }

    fn start(data_dir: &Path, settings: Settings, events: abx_core::events::Events) -> Arc<Inner> {
        Inner::start_with_budget(data_dir, settings, events, PidsBudget::of_host())
    }

    fn start_with_budget(
        data_dir: &Path,
        mut settings: Settings,
        events: abx_core::events::Events,
        pids_budget: PidsBudget,
    ) -> Arc<Inner> {
        // The default process limit shares the budget among the cap's sandboxes, so the cap
        // stays reachable with default limits (256 each under a pid_max of 32768); a limit
        // set in the config or at create is kept as given.
        if settings.limits.pids == limits::DEFAULT.pids {
            let share = (pids_budget.budget / settings.max_sandboxes.max(1) as u64).max(64);
            settings.limits.pids = limits::DEFAULT.pids.map(|d| d.min(share));
        }
        let root = data_dir.join("local/sandboxes");
        let _ = std::fs::create_dir_all(&root);
        let templates = Arc::new(
            Store::new(
                data_dir,
                container::sandbox_owner(),
                settings.registry.clone(),
            )
            .with_limits(settings.template_limits),
        );
        let mut protected = settings.protected.clone();
        protected.push(data_dir.to_path_buf());
        let pool = Pool::new(settings.pool);
        if let Ok(limits) = Limits::default().resolve(&settings.limits) {
            pool.set_default(Shape {
                network: settings.network.clone(),
                limits,
            });
        }
        let p = Arc::new_cyclic(|me| {
            Inner {
            guard: Arc::new(mounts::Guard::new(protected)),
            net: super::egress::Net::new(settings.sets.clone())
                .with_secrets(settings.secrets.clone()),
            templates,
            settings,
            summary: ProviderSummary {
                id: "local".into(),
                name: "Local sandboxes".into(),
                version: abx_home::VERSION.into(),
                kind: Kind::Builtin,
                trust: "builtin".into(),
                features: FEATURES.iter().map(|s| s.to_string()).collect(),
                description: "Sandboxes on this machine: a private /workspace and /tmp per sandbox, no account needed.".into(),
            },
            root,
            sandboxes: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            reaper: Arc::new(Notify::new()),
            events,
            code: Default::default(),
            reserved: Mutex::new(Reserved::default()),
            pids_budget,
            pool,
            pool_root: data_dir.join("local/pool"),
            me: me.clone(),
        }
        });
        info!(budget = p.pids_budget.budget, pid_max = ?p.pids_budget.pid_max, "process budget of all local sandboxes");
        p.load();
        let weak = Arc::downgrade(&p);
        tokio::spawn(async move { reaper(weak).await });
        p
    }

    /// Where killed sandboxes' directories wait to be removed (beside `sandboxes/`).
    fn trash(&self) -> PathBuf {
        self.root.with_file_name("trash")
    }

    fn load(&self) {
        // Directories a killed sandbox left in the trash (the daemon ended while removing),
        // and the empty cgroups of spares whose daemon died.
        let trash = self.trash();
        // Sandboxes an earlier daemon kept ready: nobody's (their processes ended with it).
        // Listed now: what this daemon's pool builds from here on is not among them.
        let stale: Vec<PathBuf> = std::fs::read_dir(&self.pool_root)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        std::thread::spawn(move || {
            if trash.exists() {
                let _ = mounts::remove_all(&trash);
            }
            for dir in stale {
                let _ = mounts::remove_all(&dir);
            }
            limits::remove_stale_spares();
        });
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return;
        };
        let mut map = self.sandboxes.lock().expect("sandboxes");
        for e in rd.flatten() {
            let dir = e.path();
            let rec: Option<Record> = std::fs::read(dir.join("sandbox.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            match rec {
                Some(r) if r.expires_ms > now_ms() => {
                    info!(sandbox = %r.id, "sandbox restored");
                    let egress = r.policy.as_ref().map(|spec| {
                        // The policy was checked at create; the config's sets may have
                        // changed since: then nothing is allowed (logged), never more.
                        let policy = self.net.parse_stored("sandbox/create", spec).unwrap_or_else(|e| {
                            warn!(sandbox = %r.id, error = %e.message, "the sandbox's network policy no longer parses; nothing is allowed");
                            self.net
                                .parse("sandbox/create", &json!({"allow": []}))
                                .expect("an empty policy parses")
                        });
                        super::egress::SandboxEgress::new(&self.net, &r.id, policy, self.events.clone())
                    });
                    map.insert(
                        r.id.clone(),
                        Arc::new(Sandbox {
                            dirs: SandboxDirs::new(dir),
                            store: self.templates.clone(),
                            rec: Mutex::new(r),
                            container: tokio::sync::Mutex::new(None),
                            forwards: tokio::sync::Mutex::new(HashMap::new()),
                            cgroup: Mutex::new(None),
                            guard: self.guard.clone(),
                            egress: Mutex::new(egress),
                            opened: Mutex::new(None),
                        }),
                    );
                }
                Some(r) => {
                    info!(sandbox = %r.id, "reaping sandbox that expired while the broker was down");
                    procs::signal_all(&r.id, libc::SIGKILL);
                    let _ = mounts::remove_all(&dir);
                }
                None => {
                    // A crash during create leaves a directory without a record: not a sandbox.
                    warn!(dir = %dir.display(), "removing a half-created sandbox");
                    let _ = mounts::remove_all(&dir);
                }
            }
        }
    }

    fn get(&self, id: &str) -> Result<Arc<Sandbox>, AbxError> {
        self.sandboxes
            .lock()
            .expect("sandboxes")
            .get(id)
            .cloned()
            .ok_or_else(|| AbxError::new(ErrorCode::SandboxNotFound, &[("sandbox", id)]))
    }

    fn running(&self, id: &str) -> Result<Arc<Sandbox>, AbxError> {
        let sb = self.get(id)?;
        let status = sb.rec.lock().expect("record").status.clone();
        if status != "running" {
            return Err(AbxError::new(
                ErrorCode::SandboxNotRunning,
                &[("sandbox", id), ("status", &status)],
            ));
        }
        Ok(sb)
    }

    async fn create(&self, p: SandboxCreateParams) -> Result<Value, AbxError> {
        let template = p
            .template
            .clone()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "base".into());
        let image = if TEMPLATES.contains(&template.as_str()) {
            None
        } else {
            Some(self.image_for(&template).await?)
        };
        let timeout = match &p.timeout {
            None | Some(Value::Null) => DEFAULT_TIMEOUT,
            Some(v) => timeout_secs(v)?,
        };
        if let Some(env) = &p.env {
            if let Some(k) = env
                .keys()
                .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
            {
                return Err(AbxError::invalid_params(
                    "sandbox/create",
                    format!("invalid environment variable {k:?}"),
                ));
            }
        }
        let mut policy = None;
        let network = match &p.network {
            Some(spec @ Value::Object(_)) => {
                // Only a network namespace makes the proxy the only way out: refused,
                // never ignored, under the other isolation models.
                if isolate::model() != isolate::Model::Namespaces {
                    return Err(abx_core::provider::unsupported("local", "network.vpc")
                            .with_suggestion("A network policy needs the namespaces isolation model (user namespaces); this broker runs another (ABX_ISOLATION). Use --network none or internet."));
                }
                policy = Some((spec.clone(), self.net.parse("sandbox/create", spec)?));
                "none".to_owned()
            }
            None | Some(Value::Null) => self.settings.network.clone(),
            Some(Value::String(n)) if n.is_empty() => self.settings.network.clone(),
            Some(Value::String(n)) if NETWORK_MODES.contains(&n.as_str()) => n.clone(),
            Some(Value::String(n)) => {
                return Err(AbxError::invalid_params(
                    "sandbox/create",
                    format!("unknown network mode '{n}'; use none, internet or host"),
                ))
            }
            Some(_) => {
                return Err(AbxError::invalid_params(
                    "sandbox/create",
                    "network must be none, internet, host or a policy {allow: [...], deny?: [...]}",
                ))
            }
        };
        if network == "internet" {
            super::net::check_helper()?;
        }
        let limits = match &p.limits {
            None | Some(Value::Null) => Limits::default(),
            Some(v) => limits::parse(v)?,
        }
        .resolve(&self.settings.limits)?;
        // The mounts' sources, opened and checked once (what is mounted is what was opened).
        let opened = {
            let guard = self.guard.clone();
            let v = p.mounts.clone();
            tokio::task::spawn_blocking(move || mounts::open_all(v.as_ref(), &guard))
                .await
                .map_err(AbxError::internal)??
        };
        if !opened.is_empty() && isolate::model() != isolate::Model::Namespaces {
            return Err(mounts::refused(
                &opened[0].rec.source,
                "mounts need the namespaces isolation model (user namespaces); this broker runs another (ABX_ISOLATION)",
            ));
        }
        let (mount_fds, mount_recs): (Vec<_>, Vec<_>) =
            opened.into_iter().map(|o| (o.fd, o.rec)).unzip();
        // A create a ready sandbox can serve (issue 48): the `base` template, no mounts, no
        // policy, a network mode and limits it was built for.
        let shape = (image.is_none()
            && policy.is_none()
            && mount_recs.is_empty()
            && isolate::model() == isolate::Model::Namespaces)
            .then(|| Shape {
                network: network.clone(),
                limits: limits.clone(),
            });
        // Counted from here on: given back if anything below fails.
        let slot = self.reserve(limits.pids.unwrap_or(self.default_pids()))?;
        let env = p.env.unwrap_or_default();
        let metadata: BTreeMap<String, Value> =
            p.metadata.unwrap_or_default().into_iter().collect();
        if let Some(shape) = &shape {
            let ready = self.pool.take(shape);
            // The next one is built behind this create, never on its path.
            self.refill();
            if let Some(ready) = ready {
                match self.take_ready(ready, &template, timeout, &env, &metadata) {
                    Ok(sb) => {
                        let id = sb.rec.lock().expect("record").id.clone();
                        slot.fill(id, sb.clone());
                        self.reaper.notify_one();
                        return Ok(sb.view());
                    }
                    Err(ready) => self.discard(ready),
                }
            }
        } else {
            self.refill();
        }
        let id = format!("sb-{}", rand_id());
        let dirs = SandboxDirs::new(self.root.join(&id));
        let mk = |d: &Path| std::fs::create_dir_all(d);
        mk(&dirs.workspace)
            .and_then(|_| mk(&dirs.tmp))
            .map_err(|e| {
                AbxError::new(
                    ErrorCode::SandboxCreateFailed,
                    &[("detail", &e.to_string()), ("provider", "local")],
                )
            })?;
        let now = now_ms();
        let rec = Record {
            id: id.clone(),
            template,
            status: "running".into(),
            created_ms: now,
            expires_ms: now + (timeout as i64) * 1000,
            timeout,
            env,
            metadata,
            network,
            policy: policy.as_ref().map(|(spec, _)| spec.clone()),
            limits,
            image: image.map(|i| RecordImage {
                digest: i.digest,
                config: i.config,
                copy: false,
            }),
            mounts: mount_recs,
        };
        if rec.image.is_some() {
            prepare_layer(&dirs, &rec.image)?;
        }
        if let Err(e) = mounts::prepare_layers(&dirs.root, &rec.mounts) {
            let _ = std::fs::remove_dir_all(&dirs.root);
            return Err(AbxError::new(
                ErrorCode::SandboxCreateFailed,
                &[
                    ("detail", &format!("the mounts' layers: {e}")),
                    ("provider", "local"),
                ],
            ));
        }
        let egress = policy.map(|(_, policy)| {
            super::egress::SandboxEgress::new(&self.net, &id, policy, self.events.clone())
        });
        let sb = Arc::new(Sandbox {
            dirs,
            store: self.templates.clone(),
            rec: Mutex::new(rec),
            container: tokio::sync::Mutex::new(None),
            forwards: tokio::sync::Mutex::new(HashMap::new()),
            cgroup: Mutex::new(None),
            guard: self.guard.clone(),
            egress: Mutex::new(egress),
            opened: Mutex::new(Some(mount_fds)),
        });
        if let Err(e) = sb.save() {
            let _ = mounts::remove_all(&sb.dirs.root);
            return Err(e);
        }
        // Build the sandbox now: create fails (and leaves nothing) when it cannot be built.
        let image_sandbox = sb.rec.lock().expect("record").image.is_some();
        let mut built = if image_sandbox && overlay_refused_for_tests() {
            self.copy_root(&sb).await
        } else {
            sb.container().await
        };
        if let Err(e) = &built {
            if e.message.contains("mounting the image (overlay)") {
                // The kernel refuses overlayfs here: the root is a full copy of the image.
                warn!(sandbox = %sb.rec.lock().expect("record").id, error = %e.message, "overlayfs refused; the image root is a copy");
                built = self.copy_root(&sb).await;
            }
        }
        if let Err(e) = built {
            if let Some(eg) = sb.egress.lock().expect("egress").as_mut() {
                eg.shutdown();
            }
            let _ = mounts::remove_all(&sb.dirs.root);
            return Err(e);
        }
        slot.fill(id, sb.clone());
        self.reaper.notify_one();
        Ok(sb.view())
    }

    /// The process limit a sandbox without one counts for (records of older versions).
    fn default_pids(&self) -> u64 {
        self.settings
            .limits
            .pids
            .or(limits::DEFAULT.pids)
            .unwrap_or(0)
    }

    /// Take a slot for a sandbox of `pids` processes: E2006 when it would make more live
    /// sandboxes than `max_sandboxes`, or their process limits add up past the budget.
    fn reserve(&self, pids: u64) -> Result<Slot<'_>, AbxError> {
        let map = self.sandboxes.lock().expect("sandboxes");
        let default = self.default_pids();
        let live_pids: u64 = map
            .values()
            .map(|s| s.rec.lock().expect("record").limits.pids.unwrap_or(default))
            .fold(0, u64::saturating_add);
        let mut r = self.reserved.lock().expect("reserved");
        let live = map.len() + r.count;
        let max = self.settings.max_sandboxes;
        if live >= max {
            let building = match r.count {
                0 => String::new(),
                n => format!(" ({n} of them being created)"),
            };
            return Err(AbxError::new(
                ErrorCode::SandboxLimitReached,
                &[(
                    "detail",
                    &format!("{live} live local sandboxes{building}, the broker's cap is {max}"),
                )],
            ));
        }
        let taken = live_pids.saturating_add(r.pids);
        let budget = self.pids_budget;
        // Ready sandboxes count in the budget too; they make way for a create that would
        // fit without them.
        let mut pooled = self.pool.pids();
        if pooled > 0
            && taken.saturating_add(pooled).saturating_add(pids) > budget.budget
            && taken.saturating_add(pids) <= budget.budget
        {
            for sb in self.pool.drain(false) {
                self.discard(sb);
            }
            pooled = 0;
        }
        let taken = taken.saturating_add(pooled);
        if taken.saturating_add(pids) > budget.budget {
            let of = budget.pid_max.map_or(String::new(), |m| {
                format!(", half of the host's pid_max ({m})")
            });
            return Err(AbxError::new(
                ErrorCode::SandboxLimitReached,
                &[(
                    "detail",
                    &format!(
                        "the live local sandboxes may run {taken} processes and this one {pids} more, past the budget of {}{of}",
                        budget.budget
                    ),
                )],
            )
            .with_suggestion(
                "Ask for fewer processes (limits.pids, 'abx create --pids 256', or [local] pids in the broker config for every sandbox), or kill sandboxes you no longer need ('abx list', 'abx kill ID').",
            ));
        }
        r.count += 1;
        r.pids += pids;
        Ok(Slot { inner: self, pids })
    }

    /// A ready sandbox made the one this create asked for: moved beside the others, given
    /// the create's lifetime, env and metadata, its record written. Handed back when it
    /// cannot be (its init died, its directory cannot move): the create builds one then.
    fn take_ready(
        &self,
        mut sb: Box<Sandbox>,
        template: &str,
        timeout: u64,
        env: &BTreeMap<String, String>,
        metadata: &BTreeMap<String, Value>,
    ) -> Result<Arc<Sandbox>, Box<Sandbox>> {
        let alive = sb
            .container
            .try_lock()
            .is_ok_and(|c| c.as_ref().is_some_and(|c| c.alive()));
        if !alive {
            return Err(sb);
        }
        let id = sb.rec.get_mut().expect("record").id.clone();
        let root = self.root.join(&id);
        // Its init holds its own mounts of these directories: moving them moves nothing of
        // what it sees.
        if std::fs::rename(&sb.dirs.root, &root).is_err() {
            return Err(sb);
        }
        sb.dirs = SandboxDirs::new(root);
        let now = now_ms();
        {
            let r = sb.rec.get_mut().expect("record");
            r.template = template.to_owned();
            r.created_ms = now;
            r.expires_ms = now + (timeout as i64) * 1000;
            r.timeout = timeout;
            r.env = env.clone();
            r.metadata = metadata.clone();
        }
        if sb.save().is_err() {
            let _ = std::fs::rename(&sb.dirs.root, self.pool_root.join(&id));
            sb.dirs = SandboxDirs::new(self.pool_root.join(&id));
            return Err(sb);
        }
        Ok(Arc::from(sb))
    }

    /// Build ready sandboxes in the background until the pool is full (one refill at a
    /// time; a create during one is seen by it). Nothing is built while the process budget
    /// or the host's available memory is short, nor after shutdown.
    fn refill(&self) {
        if isolate::model() != isolate::Model::Namespaces || !self.pool.on() {
            return;
        }
        self.pool.poke();
        if !self.pool.begin_fill() {
            return;
        }
        let Some(me) = self.me.upgrade() else {
            self.pool.end_fill();
            return;
        };
        tokio::spawn(async move {
            loop {
                me.pool.unpoke();
                while let Some((shape, evicted)) = me.pool.next() {
                    if let Some(sb) = evicted {
                        me.discard(sb);
                    }
                    let pids = shape.pids(me.default_pids());
                    if !me.room_for_pool(pids) {
                        tracing::debug!("no room for a ready sandbox (process budget or memory)");
                        break;
                    }
                    let t0 = std::time::Instant::now();
                    match me.build_pooled(&shape).await {
                        Ok(sb) => {
                            tracing::debug!(us = t0.elapsed().as_micros(), "ready sandbox built");
                            if let Err(sb) = me.pool.put(shape, pids, sb) {
                                // Shut down meanwhile: torn down before the refill ends.
                                discard(sb).await;
                            }
                        }
                        Err(e) => {
                            warn!(error = %e.message, "building a ready sandbox failed");
                            break;
                        }
                    }
                }
                me.pool.end_fill();
                // A create that came while the last one was built: look again.
                if !me.pool.poked() || !me.pool.begin_fill() {
                    break;
                }
            }
        });
    }

    /// Whether one more ready sandbox of `pids` processes leaves room in the budget for a
    /// sandbox of the default limits besides, and the host has memory to spare.
    fn room_for_pool(&self, pids: u64) -> bool {
        let default = self.default_pids();
        let map = self.sandboxes.lock().expect("sandboxes");
        let live: u64 = map
            .values()
            .map(|s| s.rec.lock().expect("record").limits.pids.unwrap_or(default))
            .fold(0, u64::saturating_add);
        let r = self.reserved.lock().expect("reserved");
        let total = live
            .saturating_add(r.pids)
            .saturating_add(self.pool.pids())
            .saturating_add(pids)
            .saturating_add(default);
        drop((r, map));
        total <= self.pids_budget.budget
            && mem_available_mb().is_none_or(|m| m >= POOL_MIN_AVAILABLE_MB)
    }

    /// A sandbox of `shape` built for the pool under `pool_root`: no record on disk (a
    /// daemon that dies leaves a directory the next one removes), no lifetime yet.
    async fn build_pooled(&self, shape: &Shape) -> Result<Box<Sandbox>, AbxError> {
        let id = format!("sb-{}", rand_id());
        let dirs = SandboxDirs::new(self.pool_root.join(&id));
        std::fs::create_dir_all(&dirs.workspace)
            .and_then(|_| std::fs::create_dir_all(&dirs.tmp))
            .map_err(|e| {
                AbxError::new(
                    ErrorCode::SandboxCreateFailed,
                    &[("detail", &e.to_string()), ("provider", "local")],
                )
            })?;
        let sb = Box::new(Sandbox {
            dirs,
            store: self.templates.clone(),
            rec: Mutex::new(Record {
                id,
                template: "base".into(),
                status: "running".into(),
                created_ms: 0,
                expires_ms: i64::MAX,
                timeout: 0,
                env: BTreeMap::new(),
                metadata: BTreeMap::new(),
                network: shape.network.clone(),
                policy: None,
                limits: shape.limits.clone(),
                image: None,
                mounts: Vec::new(),
            }),
            container: tokio::sync::Mutex::new(None),
            forwards: tokio::sync::Mutex::new(HashMap::new()),
            cgroup: Mutex::new(None),
            guard: self.guard.clone(),
            egress: Mutex::new(None),
            opened: Mutex::new(None),
        });
        match sb.container().await {
            Ok(_) => Ok(sb),
            Err(e) => {
                discard(sb).await;
                Err(e)
            }
        }
    }

    /// Tear a ready sandbox down in the background.
    fn discard(&self, sb: Box<Sandbox>) {
        tokio::spawn(discard(sb));
    }

    /// The stored image a template names, pulled on first use (a tag then stays pinned to
    /// the digest it resolved to).
    async fn image_for(&self, template: &str) -> Result<templates::Image, AbxError> {
        if isolate::model() != isolate::Model::Namespaces {
            return Err(AbxError::new(
                ErrorCode::SandboxCreateFailed,
                &[
                    (
                        "detail",
                        "image templates need the namespaces isolation model (user namespaces)",
                    ),
                    ("provider", "local"),
                ],
            ));
        }
        if let Some(img) = self.templates.lookup(template) {
            return Ok(img);
        }
        let _g = self.templates.lock.lock().await;
        if let Some(img) = self.templates.lookup(template) {
            return Ok(img);
        }
        let quiet = |_: u64, _: u64, _: &str| {};
        match templates::registry::pull(&self.templates, template, &quiet).await {
            Ok(img) => Ok(img),
            // Credentials wanted or refused: said as such, with where they go.
            Err(e) if templates::registry::is_auth_error(&e) => Err(e),
            Err(e) if e.code == ErrorCode::SourceUnreachable => Err(AbxError::new(
                ErrorCode::TemplateNotFound,
                &[("template", template)],
            )
            .with_suggestion(format!(
                "It is not stored here and pulling it failed ({}). Run 'abx template list', 'abx template pull' or 'abx template import'; 'base' is the host system.",
                e.message
            ))),
            Err(e) => Err(e),
        }
    }

    /// Fallback root where overlayfs is refused: a full copy of the image.
    async fn copy_root(&self, sb: &Arc<Sandbox>) -> Result<Option<Arc<Container>>, AbxError> {
        let digest = {
            let mut r = sb.rec.lock().expect("record");
            let Some(i) = r.image.as_mut() else {
                return Err(AbxError::internal("not an image sandbox"));
            };
            i.copy = true;
            i.digest.clone()
        };
        let src = self
            .templates
            .rootfs(&digest)
            .ok_or_else(|| AbxError::internal("image rootfs missing"))?;
        let (_, _, copy) = layer_dirs(&sb.dirs);
        tokio::task::spawn_blocking(move || templates::unpack::deep_copy(&src, &copy))
            .await
            .map_err(AbxError::internal)?
            .map_err(|e| AbxError::internal(format!("copying the image: {e}")))?;
        sb.save()?;
        sb.container().await
    }

    /// Digests of the images live sandboxes use.
    fn images_in_use(&self) -> Vec<String> {
        self.sandboxes
            .lock()
            .expect("sandboxes")
            .values()
            .filter_map(|s| {
                s.rec
                    .lock()
                    .expect("record")
                    .image
                    .as_ref()
                    .map(|i| i.digest.clone())
            })
            .collect()
    }

    /// `templates/*`.
    async fn templates(&self, cx: &CallCx, method: &str, params: Value) -> Result<Value, AbxError> {
        let p: TemplatesParams = parse(method, params)?;
        let s = |k: &str| {
            p.rest
                .get(k)
                .and_then(|v| v.as_str())
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let need = |k: &str| {
            s(k).ok_or_else(|| AbxError::invalid_params(method, format!("missing field `{k}`")))
        };
        let store = self.templates.clone();
        match method {
            "templates/list" => {
                let mut out = vec![json!({
                    "name": "base",
                    "names": ["base"],
                    "digest": null,
                    "size": 0,
                    "pulledAt": null,
                    "source": "host",
                    "description": "the host system, read-only",
                })];
                out.extend(store.list().iter().map(|(i, n)| i.view(n)));
                Ok(json!({"templates": out}))
            }
            "templates/pull" => {
                let reference = need("template").or_else(|_| need("name"))?;
                let conn = cx.conn.clone();
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, u64, String)>();
                let r2 = reference.clone();
                let fwd = tokio::spawn(async move {
                    while let Some((done, total, what)) = rx.recv().await {
                        conn.notify(
                            "templates/progress",
                            &json!({"template": r2, "bytes": done, "total": total, "step": what}),
                        )
                        .await;
                    }
                });
                let progress = move |d: u64, t: u64, w: &str| {
                    let _ = tx.send((d, t, w.to_owned()));
                };
                let _g = store.lock.lock().await;
                let res = templates::registry::pull(&store, &reference, &progress).await;
                drop(progress);
                let _ = fwd.await;
                let img = res?;
                let names: Vec<String> = store
                    .list()
                    .into_iter()
                    .find(|(i, _)| i.digest == img.digest)
                    .map(|(_, n)| n)
                    .unwrap_or_default();
                Ok(img.view(&names))
            }
            "templates/init" => templates::init::init(&store, &p.rest),
            "templates/import" => {
                let path = PathBuf::from(need("path")?);
                let name = s("name");
                let tag = s("tag");
                let _g = store.lock.lock().await;
                let st = store.clone();
                let img = tokio::task::spawn_blocking(move || {
                    templates::archive::import(&st, &path, name.as_deref(), tag.as_deref())
                })
                .await
                .map_err(AbxError::internal)??;
                Ok(img.view(std::slice::from_ref(&img.name)))
            }
            "templates/remove" => {
                let in_use = self.images_in_use();
                let _g = store.lock.lock().await;
                if p.rest.get("prune").and_then(|v| v.as_bool()) == Some(true) {
                    let all = p.rest.get("all").and_then(|v| v.as_bool()) == Some(true);
                    return store.prune(&in_use, all);
                }
                let t = need("template").or_else(|_| need("name"))?;
                if TEMPLATES.contains(&t.as_str()) {
                    return Err(AbxError::invalid_params(
                        method,
                        "'base' is the host system; it cannot be removed",
                    ));
                }
                store.remove(&t, &in_use)
            }
            "templates/build" => {
                let sandbox = need("sandbox")?;
                let name = need("name")?;
                if TEMPLATES.contains(&name.as_str()) || name.contains('@') {
                    return Err(AbxError::invalid_params(
                        method,
                        format!("'{name}' cannot name a template"),
                    ));
                }
                let sb = self.get(&sandbox)?;
                let base = sb.rec.lock().expect("record").image.clone().ok_or_else(|| {
                    AbxError::invalid_params(
                        method,
                        format!("sandbox '{sandbox}' was made from the host template 'base'; only a sandbox made from an image can be saved as a template"),
                    )
                })?;
                let base_img = store.image(&base.digest).ok_or_else(|| {
                    AbxError::new(ErrorCode::TemplateNotFound, &[("template", &base.digest)])
                })?;
                let upper = if base.copy {
                    return Err(AbxError::invalid_params(method, "this sandbox's root is a copy (overlayfs was refused): it has no layer of its own to save"));
                } else {
                    layer_dirs(&sb.dirs).0
                };
                let _g = store.lock.lock().await;
                // Writes in flight would make a torn layer, and a directory swapped for a
                // symlink must not lead the walk out of the layer: the sandbox is stopped
                // meanwhile (its cgroup frozen, else each of its processes stopped) and the
                // layer is read through descriptors only (templates::build). A paused
                // sandbox is stopped already, and stays so.
                let paused = sb.rec.lock().expect("record").status == "paused";
                let cg = sb.cgroup.lock().expect("cgroup").clone();
                let frozen = !paused && cg.as_ref().is_some_and(|c| c.freeze(true));
                let pidns = match sb.container.lock().await.clone() {
                    Some(c) if !paused && !frozen => Some(c.pidns()),
                    _ => None,
                };
                let st = store.clone();
                let res =
                    tokio::task::spawn_blocking(move || st.build(&name, &base_img, &upper, pidns))
                        .await
                        .map_err(AbxError::internal);
                if let (true, Some(c)) = (frozen, &cg) {
                    c.freeze(false);
                }
                let img = res??;
                Ok(img.view(std::slice::from_ref(&img.name)))
            }
            _ => Err(AbxError::new(
                ErrorCode::MethodNotFound,
                &[("method", method)],
            )),
        }
    }

    async fn kill(&self, id: &str) -> Value {
        let sb = self.sandboxes.lock().expect("sandboxes").remove(id);
        let Some(sb) = sb else {
            return json!({"killed": false});
        };
        let t0 = std::time::Instant::now();
        self.code.drop_sandbox(id);
        sb.stop_processes().await;
        if let Some(eg) = sb.egress.lock().expect("egress").as_mut() {
            eg.shutdown();
        }
        let stopped_us = t0.elapsed().as_micros();
        // The record goes first (a directory without one is not a sandbox), then the
        // directory moves to the trash at once and is emptied in the background: its files
        // can take long to remove and nothing needs them any more.
        let root = sb.dirs.root.clone();
        let _ = std::fs::remove_file(root.join("sandbox.json"));
        let trash = self.trash().join(id);
        let gone = std::fs::create_dir_all(self.trash())
            .and_then(|()| std::fs::rename(&root, &trash))
            .map_or(root, |()| trash);
        tokio::task::spawn_blocking(move || mounts::remove_all(&gone));
        tracing::debug!(sandbox = %id, stopped_us, total_us = t0.elapsed().as_micros(), "sandbox killed");
        let streams: Vec<String> = self
            .streams
            .lock()
            .expect("streams")
            .values()
            .filter(|s| s.sandbox == id)
            .map(|s| s.id.clone())
            .collect();
        for s in streams {
            self.streams.lock().expect("streams").remove(&s);
        }
        self.watches
            .lock()
            .expect("watches")
            .retain(|_, (sbid, _)| sbid != id);
        json!({"killed": true})
    }

    /// `sandbox/setNetwork`: a policy sandbox's policy, replaced live (new connections follow
    /// it, open ones go on). A mode, or a policy for a sandbox made with a mode, is E1004:
    /// its network namespace was built for the one or the other.
    fn set_network(&self, id: &str, spec: &Value) -> Result<Value, AbxError> {
        const M: &str = "sandbox/setNetwork";
        let sb = self.get(id)?;
        let has_policy = sb.rec.lock().expect("record").policy.is_some();
        if !spec.is_object() {
            return Err(AbxError::invalid_params(
                M,
                "network must be a policy {allow: [...], deny?: [...]}; a local sandbox cannot switch to a mode (none, internet, host) once made: create another",
            ));
        }
        if !has_policy {
            return Err(AbxError::invalid_params(
                M,
                "this sandbox was made with a network mode; a local sandbox cannot switch between a mode and a policy once made: create one with a policy ({allow: [...]})",
            ));
        }
        let policy = self.net.parse(M, spec)?;
        {
            let mut g = sb.egress.lock().expect("egress");
            let Some(eg) = g.as_mut() else {
                return Err(AbxError::internal("a policy sandbox without its proxy"));
            };
            eg.egress.set_policy(policy);
        }
        sb.rec.lock().expect("record").policy = Some(spec.clone());
        sb.save()?;
        Ok(sb.view())
    }

    fn set_timeout(&self, id: &str, v: &Value) -> Result<Value, AbxError> {
        let secs = timeout_secs(v)?;
        let sb = self.get(id)?;
        {
            let mut r = sb.rec.lock().expect("record");
            r.expires_ms = now_ms() + (secs as i64) * 1000;
            r.timeout = secs;
            // `timeout` shows the lifetime last asked for (create or setTimeout).
        }
        sb.save()?;
        self.reaper.notify_one();
        Ok(sb.view())
    }

    async fn set_paused(&self, id: &str, paused: bool) -> Result<Value, AbxError> {
        let sb = self.get(id)?;
        let sig = if paused { libc::SIGSTOP } else { libc::SIGCONT };
        let c = sb.container().await?;
        let cg = sb.cgroup.lock().expect("cgroup").clone();
        match (c, cg) {
            (Some(_), Some(cg)) if cg.freeze(paused) => {}
            (Some(c), _) => {
                // Twice: a process forked while the first pass ran is caught by the second.
                c.signal_all(sig).await?;
                c.signal_all(sig).await?;
            }
            (None, _) => {
                procs::signal_all(id, sig);
            }
        }
        sb.rec.lock().expect("record").status = if paused { "paused" } else { "running" }.into();
        sb.save()?;
        Ok(sb.view())
    }

    fn stream(
        &self,
        cx: &CallCx,
        exec_id: &str,
        must_own: bool,
    ) -> Result<Arc<exec::Stream>, AbxError> {
        let s = self
            .streams
            .lock()
            .expect("streams")
            .get(exec_id)
            .filter(|s| !s.exit_out())
            .cloned()
            .ok_or_else(|| AbxError::new(ErrorCode::ExecNotFound, &[("exec", exec_id)]))?;
        if must_own && s.owner() != Some(cx.conn.id) {
            return Err(AbxError::new(ErrorCode::ExecNotOwned, &[("exec", exec_id)]));
        }
        Ok(s)
    }

    async fn dispatch(
        self: &Arc<Self>,
        cx: &CallCx,
        method: &str,
        params: Value,
    ) -> Result<Value, AbxError> {
        let sandbox = || -> Result<String, AbxError> {
            Ok(parse::<SandboxParams>(method, params.clone())?.sandbox)
        };
        match method {
            "sandbox/create" => self.create(parse(method, params)?).await,
            "sandbox/info" | "sandbox/connect" => Ok(self.get(&sandbox()?)?.view()),
            "sandbox/list" => {
                let mut v: Vec<Value> = self
                    .sandboxes
                    .lock()
                    .expect("sandboxes")
                    .values()
                    .map(|s| s.view())
                    .collect();
                v.sort_by(|a, b| {
                    a["startedAt"]
                        .as_str()
                        .cmp(&b["startedAt"].as_str())
                        .then(a["id"].as_str().cmp(&b["id"].as_str()))
                });
                Ok(json!({"sandboxes": v}))
            }
            "sandbox/kill" => Ok(self.kill(&sandbox()?).await),
            "sandbox/setNetwork" => {
                let p: SetNetworkParams = parse(method, params)?;
                self.set_network(&p.sandbox, &p.network)
            }
            "sandbox/setTimeout" => {
                let p: SetTimeoutParams = parse(method, params)?;
                self.set_timeout(&p.sandbox, &p.timeout)
            }
            "sandbox/pause" => self.set_paused(&sandbox()?, true).await,
            "sandbox/resume" => self.set_paused(&sandbox()?, false).await,
            "sandbox/capabilities" => {
                self.get(&sandbox()?)?;
                Ok(json!({
                    "capabilities": features::capabilities(&self.summary.features),
                    "features": self.summary.features,
                }))
            }
            "sandbox/systemInfo" => {
                let sb = self.get(&sandbox()?)?;
                let (id, network, lim) = {
                    let r = sb.rec.lock().expect("record");
                    // A policy sandbox: loopback only, out through its egress proxy.
                    let network = match r.policy {
                        Some(_) => "policy".to_owned(),
                        None => r.network.clone(),
                    };
                    (r.id.clone(), network, r.limits.clone())
                };
                let cg = sb.cgroup.lock().expect("cgroup").clone();
                let mut v = system_info(&sb.dirs, &id, &network);
                if isolate::model() == isolate::Model::Namespaces {
                    v["isolation"]["limits"] = limits::describe(&lim, cg.as_deref());
                }
                Ok(v)
            }
            "exec/run" => Err(AbxError::internal("exec/run is served by exec_run")),
            "exec/start" => {
                let mut p: ExecStartParams = parse(method, params)?;
                let once = self.for_once(method, &p.sandbox, p.create.take()).await?;
                if let Some(id) = &once {
                    p.sandbox = id.clone();
                }
                // Until its stream runs (which kills it at its end), the sandbox goes with a
                // failure or a cancelled request.
                let mut kill = KillOnDrop(once.clone().map(|id| (self.me.clone(), id)));
                let started = self.exec_start(cx, p, once).await;
                if started.is_ok() {
                    kill.0 = None;
                }
                started
            }
            "exec/write" => {
                let p: ExecWriteParams = parse(method, params)?;
                let bytes = exec::decode_data(&p.data, p.encoding.as_deref())?;
                self.stream(cx, &p.exec_id, true)?
                    .write(&bytes, p.eof)
                    .await?;
                Ok(json!({}))
            }
            "exec/resize" => {
                let p: ExecResizeParams = parse(method, params)?;
                self.stream(cx, &p.exec_id, true)?.resize(PtySize {
                    cols: p.cols,
                    rows: p.rows,
                })?;
                Ok(json!({}))
            }
            "exec/kill" => {
                let p: ExecKillParams = parse(method, params)?;
                let sig = signal(p.signal.as_deref())?;
                let s = self.stream(cx, &p.exec_id, true)?;
                procs::kill_tree(s.pid, sig);
                if p.escalate != Some(false) {
                    exec::escalate(s, sig);
                }
                Ok(json!({}))
            }
            "exec/attach" => {
                let p: ExecIdParams = parse(method, params)?;
                let s = self.stream(cx, &p.exec_id, false)?;
                Ok(s.attach(cx.conn.clone()).await)
            }
            "process/list" => {
                let id = sandbox()?;
                let sb = self.get(&id)?;
                let c = sb.container.lock().await.clone();
                let paused = sb.rec.lock().expect("record").status == "paused";
                Ok(match c {
                    Some(c) => {
                        let mut list = procs::list_members(&c.members());
                        if paused {
                            // A frozen cgroup shows its tasks as in disk sleep: they are stopped.
                            for p in &mut list {
                                if p.status == "disk-sleep" || p.status == "sleeping" {
                                    p.status = "stopped".into();
                                }
                            }
                        }
                        json!({"processes": list})
                    }
                    None => json!({"processes": procs::list(&id)}),
                })
            }
            "process/kill" => {
                let p: ProcessKillParams = parse(method, params)?;
                let sb = self.get(&p.sandbox)?;
                let sig = signal(p.signal.as_deref())?;
                let not_found = || {
                    AbxError::new(
                        ErrorCode::ProcessNotFound,
                        &[("pid", &p.pid.to_string()), ("sandbox", &p.sandbox)],
                    )
                };
                let c = sb.container.lock().await.clone();
                let host_pid = match c {
                    // `pid` is the sandbox's view; the init (1) is not the caller's to kill.
                    Some(c) => c
                        .members()
                        .into_iter()
                        .find(|&(_, inner)| inner == p.pid)
                        .map(|(host, _)| host)
                        .ok_or_else(not_found)?,
                    None if procs::belongs(p.pid, &p.sandbox) => p.pid,
                    None => return Err(not_found()),
                };
                unsafe { libc::kill(host_pid, sig) };
                Ok(json!({}))
            }
            m if m.starts_with("files/") => self.files(cx, m, params).await,
            m if m.starts_with("code/") => self.code_call(cx, m, params).await,
            // Issue 49: a Dockerfile build (templates/dockerfile; its RUN steps: build_runner).
            "templates/build" if params.get("context").is_some() => {
                let req = templates::dockerfile::request(&parse(method, params)?)?;
                let runner: Arc<dyn templates::dockerfile::Runner> = self.clone();
                templates::dockerfile::serve(self.templates.clone(), runner, req, cx.conn.clone())
                    .await
            }
            // Templates of `local` name no commands: every name is unknown (-32602).
            "commands/run" => {
                let p: abx_protocol::api::CommandRunParams = parse(method, params)?;
                let sb = self.get(&p.sandbox)?;
                let template = sb.rec.lock().expect("record").template.clone();
                Err(AbxError::invalid_params(
                    method,
                    format!("template '{template}' of sandbox '{}' names no command '{}': templates of the local provider name no commands; run it with exec/run ('abx sandbox exec')", p.sandbox, p.name),
                ))
            }
            m if m.starts_with("templates/") => self.templates(cx, m, params).await,
            "ports/url" => {
                let p: PortParams = parse(method, params)?;
                let sb = self.get(&p.sandbox)?;
                let port = p
                    .port
                    .as_u64()
                    .filter(|n| (1..=65535).contains(n))
                    .ok_or_else(|| {
                        AbxError::new(ErrorCode::InvalidPort, &[("port", &p.port.to_string())])
                    })? as u16;
                let network = sb.rec.lock().expect("record").network.clone();
                let host_port = if network == "host" {
                    port
                } else {
                    match sb.container().await? {
                        Some(c) => sb.forward(c, port).await?,
                        None => port,
                    }
                };
                Ok(json!({"url": format!("http://127.0.0.1:{host_port}"), "headers": {}}))
            }
            _ => Err(abx_core::provider::unsupported(
                "local",
                features::for_method(method, false).unwrap_or(method),
            )),
        }
    }

    /// `code/*` (see [`super::code`]).
    async fn code_call(
        self: &Arc<Self>,
        cx: &CallCx,
        method: &str,
        params: Value,
    ) -> Result<Value, AbxError> {
        use super::code::{Cell, Lang, NewContext};
        fn value<T: Serialize>(v: T) -> Result<Value, AbxError> {
            serde_json::to_value(v).map_err(AbxError::internal)
        }
        match method {
            "code/run" => {
                let p: CodeRunParams = parse(method, params)?;
                let sb = self.running(&p.sandbox)?;
                let cell = Cell {
                    code: p.code,
                    env: p.env.unwrap_or_default(),
                    timeout: p.timeout,
                    run_id: p.run_id,
                };
                super::code::check_cell(&cell)?;
                let ctx = match &p.context {
                    Some(id) => {
                        let c = self.code.get(&p.sandbox, id)?;
                        if p.language.is_some() && Lang::parse(p.language.as_deref())? != c.lang {
                            return Err(AbxError::invalid_params(
                                method,
                                format!("context '{id}' runs {}", c.lang.name()),
                            ));
                        }
                        c
                    }
                    None => self
                        .code
                        .default_for(&p.sandbox, Lang::parse(p.language.as_deref())?)?,
                };
                let parts = sb.exec_parts().await?;
                // The reply stays counted in the budget until it is queued (issue 42).
                let r = ctx
                    .run_held(
                        parts.site(&sb, &p.sandbox),
                        cell,
                        cx.conn.clone(),
                        cx.cancel.clone(),
                        &cx.hold,
                    )
                    .await?;
                value(r)
            }
            "code/createContext" => {
                let p: CodeCreateContextParams = parse(method, params)?;
                let sb = self.running(&p.sandbox)?;
                let new = NewContext {
                    lang: Lang::parse(p.language.as_deref())?,
                    cwd: p.cwd,
                    interpreter: p.interpreter,
                    env: p.env.unwrap_or_default(),
                };
                let c = self.code.create(&p.sandbox, new)?;
                let parts = sb.exec_parts().await?;
                self.code.start(parts.site(&sb, &p.sandbox), &c).await?;
                value(c.view())
            }
            "code/listContexts" => {
                let p: SandboxParams = parse(method, params)?;
                self.get(&p.sandbox)?;
                Ok(json!({"contexts": self.code.list(&p.sandbox)}))
            }
            "code/restartContext" => {
                let p: CodeContextParams = parse(method, params)?;
                let sb = self.running(&p.sandbox)?;
                let c = self.code.get(&p.sandbox, &p.context)?;
                let parts = sb.exec_parts().await?;
                self.code.restart(parts.site(&sb, &p.sandbox), &c).await?;
                value(c.view())
            }
            "code/removeContext" => {
                let p: CodeContextParams = parse(method, params)?;
                self.get(&p.sandbox)?;
                self.code.remove(&p.sandbox, &p.context)?;
                Ok(json!({}))
            }
            other => Err(AbxError::new(
                ErrorCode::MethodNotFound,
                &[("method", other)],
            )),
        }
    }

    async fn files(
        self: &Arc<Self>,
        cx: &CallCx,
        method: &str,
        params: Value,
    ) -> Result<Value, AbxError> {
        /// The `files/*` calls answered on a blocking thread, with their params.
        enum Op {
            Read(FilesReadParams),
            Write(FilesWriteParams),
            List(FilesListParams),
            Stat(PathParams),
            Mkdir(MkdirParams),
            Remove(RemoveParams),
            Rename(RenameParams),
        }
        if method != "files/unwatch" && params.get("sandbox").is_none() {
            // Without `sandbox` the call names the empty sandbox (E2009), as it always did.
            self.get("")?;
        }
        let op = match method {
            "files/unwatch" => {
                let p: UnwatchParams = parse(method, params)?;
                return match self.watches.lock().expect("watches").remove(&p.watch_id) {
                    Some(_) => Ok(json!({})),
                    None => Err(AbxError::invalid_params(
                        method,
                        format!("no watch '{}'", p.watch_id),
                    )),
                };
            }
            "files/watch" => {
                let p: WatchParams = parse(method, params)?;
                let sb = self.get(&p.sandbox)?;
                let id = p.sandbox;
                let (tx, mut rx) = tokio::sync::mpsc::channel::<watch::Change>(256);
                // A path on a mount is watched in the sandbox's whole view (issue 43).
                let dirs = sb.dirs_for(&[p.path.as_str()]).await?;
                let w = watch::Watch::start(&dirs, &id, &p.path, p.recursive, tx)?;
                let watch_id = format!(
                    "w-{}-{}",
                    self.next.fetch_add(1, Ordering::Relaxed),
                    rand_id()
                );
                self.watches
                    .lock()
                    .expect("watches")
                    .insert(watch_id.clone(), (id.clone(), w));
                let conn = cx.conn.clone();
                let wid = watch_id.clone();
                tokio::spawn(async move {
                    while let Some(c) = rx.recv().await {
                        let ok = conn
                            .notify("files/changed", &json!({"watchId": wid, "sandbox": id, "path": c.path, "kind": c.kind}))
                            .await;
                        if !ok {
                            break;
                        }
                    }
                });
                return Ok(json!({"watchId": watch_id}));
            }
            "files/upload" | "files/download" => {
                let p: TransferParams = parse(method, params)?;
                let sb = self.get(&p.sandbox)?;
                let dirs = sb.dirs_for(&[&p.path]).await?;
                let id = p.sandbox;
                let local = PathBuf::from(p.local_path);
                let path = p.path;
                let path_view = path.clone();
                let conn = cx.conn.clone();
                let up = method == "files/upload";
                let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, u64)>(4);
                // A first event at once, so progress bars appear before the first MiB.
                let total0 = if up {
                    std::fs::metadata(&local).map_or(0, |m| m.len())
                } else {
                    0
                };
                let _ = tx.try_send((0, total0));
                let path2 = path.clone();
                let sbid = id.clone();
                let fwd = tokio::spawn(async move {
                    while let Some((done, total)) = rx.recv().await {
                        conn.notify(
                            "files/progress",
                            &json!({"sandbox": sbid, "path": path2, "bytes": done, "total": total}),
                        )
                        .await;
                    }
                });
                let local2 = local.clone();
                let res = tokio::task::spawn_blocking(move || {
                    let mut progress = |d: u64, t: u64| {
                        let _ = tx.blocking_send((d, t));
                    };
                    if up {
                        files::upload(&dirs, &id, &local2, &path, &mut progress)
                    } else {
                        files::download(&dirs, &id, &path, &local2, &mut progress)
                    }
                })
                .await
                .map_err(AbxError::internal)??;
                let _ = fwd.await;
                return Ok(json!({"size": res, "localPath": local, "path": path_view}));
            }
            "files/read" => Op::Read(parse(method, params)?),
            "files/write" => Op::Write(parse(method, params)?),
            "files/list" => Op::List(parse(method, params)?),
            "files/stat" => Op::Stat(parse(method, params)?),
            "files/mkdir" => Op::Mkdir(parse(method, params)?),
            "files/remove" => Op::Remove(parse(method, params)?),
            "files/rename" => Op::Rename(parse(method, params)?),
            other => {
                return Err(AbxError::new(
                    ErrorCode::MethodNotFound,
                    &[("method", other)],
                ))
            }
        };
        let id = match &op {
            Op::Read(p) => &p.sandbox,
            Op::Write(p) => &p.sandbox,
            Op::List(p) => &p.sandbox,
            Op::Stat(p) => &p.sandbox,
            Op::Mkdir(p) => &p.sandbox,
            Op::Remove(p) => &p.sandbox,
            Op::Rename(p) => &p.sandbox,
        }
        .clone();
        let paths: Vec<&str> = match &op {
            Op::Read(p) => vec![&p.path],
            Op::Write(p) => vec![&p.path],
            Op::List(p) => vec![p.path.as_deref().unwrap_or("/workspace")],
            Op::Stat(p) => vec![&p.path],
            Op::Mkdir(p) => vec![&p.path],
            Op::Remove(p) => vec![&p.path],
            Op::Rename(p) => vec![&p.from, &p.to],
        };
        let dirs = self.get(&id)?.dirs_for(&paths).await?;
        tokio::task::spawn_blocking(move || -> Result<Value, AbxError> {
            // In the sandbox's view, a root daemon works as the sandbox's user.
            let _ids = dirs
                .view
                .as_ref()
                .and_then(|v| v.owner)
                .map(|(u, g)| files::FsIds::take(u, g));
            match op {
                Op::Read(p) => {
                    let r = files::read(
                        &dirs,
                        &id,
                        &p.path,
                        p.offset.unwrap_or(0),
                        p.length,
                        p.encoding.as_deref(),
                    )?;
                    // Moves the (large) data string into the Value: no copy.
                    Ok(json!({"data": r.data, "encoding": r.encoding, "size": r.size, "eof": r.eof, "offset": r.offset}))
                }
                Op::Write(p) => {
                    let size = files::write(
                        &dirs,
                        &id,
                        &p.path,
                        &p.data,
                        p.encoding.as_deref(),
                        p.offset,
                        p.append,
                        p.mode,
                    )?;
                    Ok(json!({"size": size}))
                }
                Op::List(p) => {
                    let entries = files::list(
                        &dirs,
                        &id,
                        p.path.as_deref().unwrap_or("/workspace"),
                        p.recursive,
                    )?;
                    Ok(json!({"entries": entries}))
                }
                Op::Stat(p) => Ok(serde_json::to_value(files::stat(&dirs, &id, &p.path)?)
                    .map_err(AbxError::internal)?),
                Op::Mkdir(p) => files::mkdir(&dirs, &id, &p.path, p.parents).map(|_| json!({})),
                Op::Remove(p) => {
                    files::remove(&dirs, &id, &p.path, p.recursive).map(|_| json!({}))
                }
                Op::Rename(p) => files::rename(&dirs, &id, &p.from, &p.to).map(|_| json!({})),
            }
        })
        .await
        .map_err(AbxError::internal)?
    }
}

fn signal(name: Option<&str>) -> Result<i32, AbxError> {
    match name {
        None => Ok(libc::SIGKILL),
        Some(n) => abx_core::signals::signal_from_name(n)
            .ok_or_else(|| AbxError::invalid_params("kill", format!("unknown signal '{n}'"))),
    }
}

/// A sandbox made for one command (`create` of `exec/run` and `exec/start`), killed in the
/// background when this is dropped (unless emptied first).
struct KillOnDrop(Option<(std::sync::Weak<Inner>, String)>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some((me, id)) = self.0.take() {
            if let Some(me) = me.upgrade() {
                me.kill_behind(id);
            }
        }
    }
}

/// Tear down a sandbox nobody was given (a ready one): its processes, its cgroup, its
/// directory, in that order, waited for (daemon shutdown waits on it).
async fn discard(sb: Box<Sandbox>) {
    let cg = sb.cgroup.lock().expect("cgroup").take();
    if let Some(cg) = &cg {
        cg.freeze(false);
    }
    let c = sb.container.lock().await.take();
    if let Some(c) = c {
        c.kill().await;
    }
    if let Some(cg) = cg {
        cg.remove().await;
    }
    let root = sb.dirs.root.clone();
    let _ = tokio::task::spawn_blocking(move || mounts::remove_all(&root)).await;
}

/// `MemAvailable` of `/proc/meminfo`, MiB.
fn mem_available_mb() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("MemAvailable:")
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            })
        })
        .map(|kb| kb / 1024)
}

async fn reaper(weak: std::sync::Weak<Inner>) {
    loop {
        let Some(me) = weak.upgrade() else { return };
        let now = now_ms();
        let (expired, next): (Vec<String>, Option<i64>) = {
            let map = me.sandboxes.lock().expect("sandboxes");
            let expired = map
                .values()
                .filter(|s| s.rec.lock().expect("record").expires_ms <= now)
                .map(|s| s.rec.lock().expect("record").id.clone())
                .collect();
            let next = map
                .values()
                .map(|s| s.rec.lock().expect("record").expires_ms)
                .filter(|e| *e > now)
                .min();
            (expired, next)
        };
        for id in expired {
            info!(sandbox = %id, "sandbox expired; reaping");
            // Only the reaper's own kill reports `expired` (a client's kill may win the race).
            if me.kill(&id).await["killed"] == true {
                me.events.emit("local", &id, "expired", None);
            }
        }
        let wait = next.map_or(Duration::from_secs(3600), |n| {
            Duration::from_millis((n - now).max(1) as u64)
        });
        let wake = me.reaper.clone();
        drop(me);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = wake.notified() => {}
        }
    }
}

fn system_info(dirs: &SandboxDirs, id: &str, network: &str) -> Value {
    let ns = isolate::model() == isolate::Model::Namespaces;
    let mut isolation = isolate::describe();
    isolation["network"] = json!(if ns { network } else { "host" });
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    unsafe { libc::uname(&mut uts) };
    let field = |f: &[libc::c_char]| {
        unsafe { std::ffi::CStr::from_ptr(f.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let path =
        std::ffi::CString::new(dirs.workspace.as_os_str().as_encoded_bytes()).unwrap_or_default();
    unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    let gb = |blocks: u64| ((blocks as f64 * st.f_frsize as f64) / 1e9 * 100.0).round() / 100.0;
    let mem_mb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            })
        })
        .map(|kb| kb / 1024);
    json!({
        "os": field(&uts.sysname),
        "arch": field(&uts.machine),
        "hostname": if ns { id.to_owned() } else { field(&uts.nodename) },
        "kernel": field(&uts.release),
        "cpuCount": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "memoryTotalMb": mem_mb,
        "diskTotalGb": gb(st.f_blocks as u64),
        "diskFreeGb": gb(st.f_bavail as u64),
        "isolation": isolation,
    })
}

/// The builtin local provider.
pub struct LocalProvider(Arc<Inner>);

impl LocalProvider {
    /// Load the sandboxes under `data_dir/local` and start the reaper (needs a runtime);
    /// sandboxes whose lifetime ends are reported to `events` as `expired`.
    pub fn start(
        data_dir: &Path,
        settings: Settings,
        events: abx_core::events::Events,
    ) -> LocalProvider {
        LocalProvider(Inner::start(data_dir, settings, events))
    }
}

impl Provider for LocalProvider {
    fn summary(&self) -> &ProviderSummary {
        &self.0.summary
    }

    fn shutdown(&self) -> BoxFut<'_, ()> {
        Box::pin(async {
            // The ready sandboxes, and the spare outer process and its cgroup, are nobody's
            // sandbox. A refill under way puts nothing in once the pool is closed; it is
            // waited for (bounded) so that what it built is torn down too.
            let ready = self.0.pool.drain(true);
            let waited = tokio::time::timeout(Duration::from_secs(5), async {
                while self.0.pool.filling() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            let _ = tokio::join!(
                futures::future::join_all(ready.into_iter().map(discard)),
                waited
            );
            let _ = tokio::task::spawn_blocking(container::discard_spare).await;
        })
    }

    fn info(&self) -> Value {
        json!({
            "templates": TEMPLATES,
            "security": {"isolation": isolate::describe()},
            "dataDir": self.0.root,
            "pool": self.0.pool.view(),
        })
    }

    fn sandbox_count(&self) -> usize {
        self.0.sandboxes.lock().expect("sandboxes").len()
    }

    fn owns(&self, sandbox: &str) -> bool {
        self.0
            .sandboxes
            .lock()
            .expect("sandboxes")
            .contains_key(sandbox)
    }

    fn call<'a>(&'a self, cx: &'a CallCx, method: &'a str, params: Value) -> BoxFut<'a, Reply> {
        Box::pin(async move {
            if method == "exec/run" {
                // Built as raw JSON from the output itself: never a Value tree, never a copy.
                return self.0.exec_run(cx, params).await;
            }
            if crate::workspace::changes::METHODS.contains(&method) {
                // Issue 43 (part B): sandbox/diff|apply|discard on the overlay mounts, served on
                // a blocking thread and answered as raw JSON (workspace/changes.rs).
                let id = params
                    .get("sandbox")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let sb = self.0.get(id)?;
                let mounts = sb.rec.lock().expect("record").mounts.clone();
                let root = sb.dirs.root.clone();
                let sid = id.to_owned();
                let served = crate::workspace::changes::serve(method, params, root, mounts).await?;
                // overlayfs keeps serving what it looked up: a running sandbox sees what discard
                // dropped once each overlay in `served.remount` is mounted again (its init
                // does it). The discard is done whatever happens here: a failure is logged,
                // not answered (docs/local-sandboxes.md, "A running sandbox and discard").
                if !served.remount.is_empty() {
                    let c = sb.container.lock().await.clone();
                    for n in served.remount.iter().copied() {
                        let Some(c) = c.as_ref().filter(|c| c.alive()) else {
                            break;
                        };
                        match c.remount(n).await {
                            Ok(()) => {
                                tracing::debug!(sandbox = %sid, mount = n, "overlay mounted again")
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                                tracing::info!(sandbox = %sid, mount = n, "overlay not mounted again: {e}")
                            }
                            Err(e) => {
                                tracing::error!(sandbox = %sid, mount = n, "mounting the overlay again after a discard failed: {e}")
                            }
                        }
                    }
                }
                return Ok(served.reply);
            }
            let v = self.0.dispatch(cx, method, params).await?;
            serde_json::value::to_raw_value(&v).map_err(AbxError::internal)
        })
    }
}

/// Issue 49: the RUN steps of a Dockerfile build (a child module, to see the sandboxes).
#[path = "templates/dockerfile/runner.rs"]
mod build_runner;

#[cfg(test)]
mod settings_tests {
    use super::*;

    #[test]
    fn templates_caps_are_read_from_the_local_table() {
        let s = |t: &str| Settings::from_config(&t.parse::<toml::Table>().unwrap());
        assert_eq!(s("").template_limits, templates::Limits::default());
        assert_eq!(templates::Limits::default().max_bytes, 16 << 30);
        let l = s("[local]\ntemplate_max_bytes = \"16M\"\ntemplate_max_entries = 1000\n")
            .template_limits;
        assert_eq!((l.max_bytes, l.max_entries), (16 << 20, 1000));
        assert_eq!(
            s("[local]\ntemplate_max_bytes = 5000\n")
                .template_limits
                .max_bytes,
            5000
        );
        // Bad values keep the defaults.
        let l = s("[local]\ntemplate_max_bytes = \"lots\"\ntemplate_max_entries = -1\n")
            .template_limits;
        assert_eq!(l, templates::Limits::default());
    }
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    fn inner(max_sandboxes: usize, budget: u64) -> (tempfile::TempDir, Arc<Inner>) {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings {
            max_sandboxes,
            ..Settings::default()
        };
        let budget = PidsBudget {
            pid_max: Some(budget * 2),
            budget,
        };
        let p = Inner::start_with_budget(dir.path(), settings, Default::default(), budget);
        (dir, p)
    }

    /// Slots count against both caps while held, whether or not a sandbox is made yet, and a
    /// dropped one (a create that failed) is given back.
    #[tokio::test]
    async fn slots_hold_the_caps_and_are_given_back() {
        let (_d, p) = inner(2, 1000);
        let a = p.reserve(400).unwrap();
        let b = p.reserve(400).unwrap();
        let e = p.reserve(10).err().expect("a third is past the cap");
        assert_eq!(e.code, ErrorCode::SandboxLimitReached);
        assert!(
            e.message.contains("2 of them being created"),
            "{}",
            e.message
        );
        drop(a);
        // Room again for one, but not for one past the process budget (400 + 700 > 1000).
        let e = p.reserve(700).err().expect("past the budget");
        assert_eq!(e.code, ErrorCode::SandboxLimitReached);
        assert!(e.message.contains("pid_max (2000)"), "{}", e.message);
        assert!(e.suggestion.contains("pids"), "{e:?}");
        let c = p.reserve(600).unwrap();
        drop((b, c));
        let r = p.reserved.lock().unwrap();
        assert_eq!((r.count, r.pids), (0, 0));
    }

    #[test]
    fn the_budget_is_half_of_pid_max() {
        let b = PidsBudget::of_host();
        if let Some(m) = b.pid_max {
            assert_eq!(b.budget, m / 2);
        }
    }
}
