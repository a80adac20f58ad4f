//! The composition root: the one place that reads the environment and the broker config,
//! builds the providers (the builtin `local`, then every installed plugin) and gives them to
//! the core, with the daemon's own methods (`provider/*` management and the contract kit).

use crate::manage::{self, Plugins};
use crate::secrets;
use abx_core::broker::{Methods, Settings};
use abx_core::dispatch::{self, params, reply, Cx, Reply};
use abx_core::provider::{BoxFut, Provider};
use abx_core::Broker;
use abx_home::Paths;
use abx_protocol::api::methods;
use abx_protocol::AbxError;
use serde_json::value::RawValue;
use std::sync::{Arc, Weak};

/// Bytes buffered in each direction of the kit's in-memory connections.
const KIT_PIPE: usize = 1024 * 1024;

/// The methods the daemon adds to the core's: the catalogue's [`Kind::Daemon`] ones
/// (`abx_protocol::catalogue::DAEMON`; also listed in `docs/broker-api.md`).
///
/// [`Kind::Daemon`]: abx_protocol::catalogue::Kind::Daemon
pub const METHODS: &[&str] = abx_protocol::catalogue::DAEMON;

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
/// `ABX_MEMORY_BUDGET` (at most a quarter of the daemon's own cgroup memory limit, when it
/// has one: [`budget_within_cgroup`]), `ABX_TEST_HOOKS`, `ABX_LOG_ENTRIES` (entries
/// `sandbox/log` keeps per sandbox).
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
    let wanted = s.memory_budget;
    let limit = cgroup_memory_limit(
        &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
        &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
    );
    s.memory_budget = budget_within_cgroup(wanted, limit.as_ref().map(|l| l.bytes));
    match &limit {
        Some(l) => tracing::info!(
            budget = s.memory_budget,
            asked = wanted,
            cgroup_limit = l.bytes,
            cgroup = %l.file.display(),
            "memory budget: at most a quarter of the daemon's cgroup memory limit"
        ),
        None => tracing::info!(
            budget = s.memory_budget,
            "memory budget (no cgroup memory limit found for the daemon)"
        ),
    }
    s.test_hooks = std::env::var("ABX_TEST_HOOKS").is_ok_and(|v| v == "1");
    if let Some(n) = std::env::var("ABX_LOG_ENTRIES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
    {
        s.log_entries = n;
    }
    s
}

/// The share of its cgroup's memory limit the daemon's budget may take: everything it counts
/// (queued replies, messages being read, `exec/run` output, change notifications) stays
/// within a quarter of it, so the rest (its code, per-connection bookkeeping, the allocator's
/// slack, the page cache the cgroup also charges) fits under the limit: the kernel's OOM
/// killer never has to choose the daemon for what clients sent (issue 42).
pub const CGROUP_SHARE: u64 = 4;

/// The memory budget for a daemon that asked for `wanted` bytes, in a cgroup limited to
/// `limit` bytes (when it is): at most a [`CGROUP_SHARE`]th of the limit, and never below
/// the pool's floor of 1 MiB.
pub fn budget_within_cgroup(wanted: usize, limit: Option<u64>) -> usize {
    match limit {
        Some(l) => wanted
            .min((l / CGROUP_SHARE).min(usize::MAX as u64) as usize)
            .max(1 << 20),
        None => wanted,
    }
}

/// A memory limit that applies to the daemon, and the file it was read from.
#[derive(Debug, PartialEq, Eq)]
pub struct CgroupLimit {
    /// The limit in bytes.
    pub bytes: u64,
    /// `memory.max` (cgroup v2) or `memory.limit_in_bytes` (v1).
    pub file: std::path::PathBuf,
}

/// The memory limit of the daemon's own cgroup, or of one of its ancestors (the lowest),
/// from the texts of `/proc/self/cgroup` and `/proc/self/mountinfo`: cgroup v2 (`0::/path`,
/// `memory.max` under the `cgroup2` mount) or v1 (the `memory` controller's line,
/// `memory.limit_in_bytes` under its `cgroup` mount). "max" and v1's "unlimited" (a value
/// near `i64::MAX`) are no limit. `None` when there is none, or it cannot be read.
pub fn cgroup_memory_limit(proc_cgroup: &str, mountinfo: &str) -> Option<CgroupLimit> {
    use std::path::PathBuf;
    // Mount points: (root within the hierarchy, where it is mounted, fs type, super options).
    let mounts: Vec<(String, PathBuf, String, String)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            let p: Vec<&str> = post.split(' ').collect();
            Some((
                f.get(3)?.to_string(),
                PathBuf::from(unescape_mount(f.get(4)?)),
                p.first()?.to_string(),
                p.get(2).unwrap_or(&"").to_string(),
            ))
        })
        .collect();
    let mut found: Option<CgroupLimit> = None;
    for line in proc_cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let (v2, file) = if ctrls.is_empty() {
            (true, "memory.max")
        } else if ctrls.split(',').any(|c| c == "memory") {
            (false, "memory.limit_in_bytes")
        } else {
            continue;
        };
        let mount = mounts.iter().find(|(_, _, fs, opts)| {
            if v2 {
                fs == "cgroup2"
            } else {
                fs == "cgroup" && opts.split(',').any(|o| o == "memory")
            }
        });
        let Some((root, at, _, _)) = mount else {
            continue;
        };
        // The cgroup's path as seen from the mount (a container mounts its own part).
        let rel = path
            .strip_prefix(root.as_str())
            .unwrap_or(path)
            .trim_start_matches('/');
        let mut dir = at.join(rel);
        loop {
            if let Some(bytes) = std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|t| parse_limit(&t))
            {
                if found.as_ref().is_none_or(|f| bytes < f.bytes) {
                    found = Some(CgroupLimit {
                        bytes,
                        file: dir.join(file),
                    });
                }
            }
            if dir.as_path() == at.as_path() || !dir.pop() || !dir.starts_with(at) {
                break;
            }
        }
    }
    found
}

/// A limit file's value: bytes, or `None` for no limit ("max", v1's page-rounded i64::MAX).
fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|n| *n < 1 << 60)
}

/// A mountinfo path field with its octal escapes (`\040` for a space) undone.
fn unescape_mount(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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
    // The values of egress headers (`secret:KEY`): one 0600 file of the config dir, held by
    // the daemon only (docs/local-sandboxes.md, "Credentials that never enter the sandbox").
    let secrets = Arc::new(abx_egress::SecretStore::open(
        paths.config_dir.join("egress-secrets.json"),
    ));
    let mut settings = abx_local::sandboxes::Settings::from_config(&config).protecting(&paths);
    settings.secrets = secrets.clone();
    let local: Arc<dyn Provider> = Arc::new(abx_local::sandboxes::LocalProvider::start(
        &paths.data_dir,
        settings,
        events.clone(),
    ));
    let plugins = manage::load_installed(&paths, &events);
    let mut providers = vec![local];
    providers.extend(plugins.providers());
    let methods = Arc::new(Daemon {
        plugins,
        secrets,
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
    /// The secret store of egress headers (`secrets/*`).
    secrets: Arc<abx_egress::SecretStore>,
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
                methods::PROVIDER_INSTALL => manage::install(m, b, params(method, p)?).await,
                methods::PROVIDER_UNINSTALL => manage::uninstall(m, b, params(method, p)?).await,
                methods::PROVIDER_UPDATE => manage::update(m, b, params(method, p)?).await,
                methods::PROVIDER_DOCTOR => manage::doctor(m, b, params(method, p)?).await,
                methods::PROVIDER_CONFIGURE => manage::configure(m, b, params(method, p)?).await,
                methods::PROVIDER_SET_DEFAULT => manage::set_default(b, params(method, p)?),
                methods::PROVIDER_TEST => self.test(cx, params(method, p)?).await,
                methods::SECRETS_SET => secrets::set(&self.secrets, params(method, p)?).await,
                methods::SECRETS_LIST => Ok(secrets::list(&self.secrets)),
                methods::SECRETS_REMOVE => secrets::remove(&self.secrets, params(method, p)?).await,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A fake cgroup file system in a temp dir: `files` are (path under it, content).
    fn fake(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        dir
    }

    fn mountinfo(lines: &[(&str, &Path, &str, &str)]) -> String {
        lines
            .iter()
            .enumerate()
            .map(|(i, (root, at, fs, opts))| {
                format!(
                    "{} 20 0:{} {root} {} rw,nosuid shared:{i} - {fs} {fs} rw,{opts}\n",
                    30 + i,
                    40 + i,
                    at.display()
                )
            })
            .collect()
    }

    /// cgroup v2 (these machines have v1 only: the v2 paths are checked here, with fake
    /// files): the own cgroup's `memory.max`, the lowest of its ancestors', "max" as none.
    #[test]
    fn cgroup_v2_memory_max_is_read_for_the_own_cgroup_and_its_ancestors() {
        let fs = fake(&[
            ("unified/user.slice/memory.max", "max\n"),
            ("unified/user.slice/abx.service/memory.max", "1073741824\n"),
            ("unified/cgroup.controllers", "cpu memory pids\n"),
        ]);
        let at = fs.path().join("unified");
        let mi = mountinfo(&[("/", &at, "cgroup2", "nsdelegate")]);
        let own = "0::/user.slice/abx.service\n";
        let got = cgroup_memory_limit(own, &mi).unwrap();
        assert_eq!(got.bytes, 1 << 30);
        assert_eq!(got.file, at.join("user.slice/abx.service/memory.max"));
        assert_eq!(budget_within_cgroup(128 << 20, Some(got.bytes)), 128 << 20);
        assert_eq!(budget_within_cgroup(512 << 20, Some(got.bytes)), 256 << 20);
        // An ancestor's lower limit is the one that applies.
        std::fs::write(at.join("user.slice/memory.max"), "268435456").unwrap();
        let got = cgroup_memory_limit(own, &mi).unwrap();
        assert_eq!(got.bytes, 256 << 20);
        assert_eq!(budget_within_cgroup(128 << 20, Some(got.bytes)), 64 << 20);
        // "max" everywhere: no limit, the budget as asked.
        for f in ["user.slice/memory.max", "user.slice/abx.service/memory.max"] {
            std::fs::write(at.join(f), "max\n").unwrap();
        }
        assert_eq!(cgroup_memory_limit(own, &mi), None);
        assert_eq!(budget_within_cgroup(128 << 20, None), 128 << 20);
        // A container: the mount's root is the cgroup's own path.
        let fs = fake(&[("cg/memory.max", "536870912")]);
        let at = fs.path().join("cg");
        let mi = mountinfo(&[("/machine/ct1", &at, "cgroup2", "")]);
        let got = cgroup_memory_limit("0::/machine/ct1\n", &mi).unwrap();
        assert_eq!(got.bytes, 512 << 20);
        // A tiny limit still leaves the pool's floor.
        assert_eq!(budget_within_cgroup(128 << 20, Some(2 << 20)), 1 << 20);
    }

    /// cgroup v1 (what these machines have): the memory controller's line and mount, the
    /// page-rounded "unlimited" as none; other controllers' lines are not read.
    #[test]
    fn cgroup_v1_limit_in_bytes_is_read_from_the_memory_hierarchy() {
        let fs = fake(&[
            ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory/tests/memory.limit_in_bytes", "1073741824\n"),
            ("cpu/tests/memory.limit_in_bytes", "4096\n"),
        ]);
        let mem = fs.path().join("memory");
        let cpu = fs.path().join("cpu");
        let mi = mountinfo(&[
            ("/", &cpu, "cgroup", "cpu,cpuacct"),
            ("/", &mem, "cgroup", "memory"),
        ]);
        let own = "5:cpu,cpuacct:/tests\n4:memory:/tests\n0::/\n";
        let got = cgroup_memory_limit(own, &mi).unwrap();
        assert_eq!(got.bytes, 1 << 30);
        assert_eq!(got.file, mem.join("tests/memory.limit_in_bytes"));
        assert_eq!(cgroup_memory_limit("4:memory:/\n", &mi), None);
        assert_eq!(cgroup_memory_limit("", &mi), None);
        assert_eq!(cgroup_memory_limit(own, ""), None);
        assert_eq!(unescape_mount("/a\\040b"), "/a b");
    }
}
