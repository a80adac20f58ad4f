//! Network policies of `local` sandboxes (issue 44, docs/local-sandboxes.md "Egress by
//! name"): a sandbox whose `network` is `{allow, deny?}` gets a network namespace with
//! loopback only (as `none`: no route out), and one way out: a TCP socket listening on
//! `127.0.0.1:<port>` inside that namespace whose connections the daemon accepts and hands to
//! the sandbox's [`Egress`] (the filtering proxy, crate `abx-egress`), on the host.
//!
//! **Why the init makes the listener** (rather than the daemon entering the namespace with
//! `setns` from a thread): the init already lives in the namespace and already hands the
//! daemon descriptors over its control socket with `SCM_RIGHTS` (`ports/url`'s connects,
//! `files/*`'s root); a listening socket keeps the namespace it was made in, so the daemon
//! accepts on it from the host's namespace with no thread of its own ever changing
//! namespace (a tokio worker left in a sandbox's namespace by a bug would be far worse than
//! one more request kind). The listener is made at each start of the sandbox's init; the
//! [`Egress`] lives as long as the sandbox in this daemon (its blocked counters with it) and
//! is made again from `sandbox.json`'s policy after a daemon restart.

use abx_core::events::Events;
use abx_egress::{BlockedCount, SystemResolver};
use abx_egress::{Config, Egress, Guard, Limits, Policy, Resolver, Sets, StaticResolver};
use abx_home::util::rfc3339;
use abx_protocol::AbxError;
use serde_json::{json, Value};
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tracing::warn;

/// What every policy sandbox of this daemon shares: the guard (what no policy opens), the
/// named sets of the broker config, the resolver.
#[derive(Clone)]
pub struct Net {
    /// The host's interface addresses and the broker's ports, refused whatever the policy.
    pub guard: Guard,
    /// `[network.sets.NAME]` of the broker config.
    pub sets: Sets,
    /// How names become addresses.
    pub resolver: Arc<dyn Resolver>,
    /// Header injection: the broker's secret store, and (tests only) the upstreams' CA.
    pub tls: abx_egress::Tls,
    /// The secret store (the keys a policy names must exist: E1004 otherwise).
    pub secrets: Arc<abx_egress::SecretStore>,
}

impl Net {
    /// The guard of this host (`getifaddrs`; the daemon listens on no TCP port of its own:
    /// its socket is a Unix socket, and `ports/url` forwards bind the host's `127.0.0.1`,
    /// refused as loopback), the config's sets, the system resolver; or the test-only
    /// settings (see [`test_settings`]).
    pub fn new(sets: Sets) -> Net {
        let addrs = abx_egress::host_addresses().unwrap_or_else(|e| {
            warn!(error = %e, "egress: cannot list the host's addresses; only the fixed blocks are refused");
            Vec::new()
        });
        let mut net = Net {
            guard: Guard::new(addrs, Vec::new()),
            sets,
            resolver: Arc::new(SystemResolver),
            tls: abx_egress::Tls::default(),
            secrets: Arc::new(abx_egress::SecretStore::in_memory()),
        };
        if let Some((resolver, loopback)) = test_settings() {
            warn!("egress: test-only settings in force (ABX_TEST_EGRESS_RESOLVE / ABX_TEST_EGRESS_LOOPBACK)");
            net.resolver = Arc::new(resolver);
            if !loopback.is_empty() {
                match net.guard.clone().allow_loopback_for_tests(&loopback) {
                    Ok(g) => net.guard = g,
                    Err(e) => warn!(error = %e, "egress: ignoring ABX_TEST_EGRESS_LOOPBACK"),
                }
            }
        }
        if let Some(pem) = test_upstream_ca() {
            warn!("egress: test-only setting in force (ABX_TEST_EGRESS_CA: an extra CA for upstreams)");
            match net.tls.clone().with_extra_roots_pem(&pem) {
                Ok(t) => net.tls = t,
                Err(e) => warn!(error = %e, "egress: ignoring ABX_TEST_EGRESS_CA"),
            }
        }
        net
    }

    /// These settings, with the broker's secret store (the values of `secret:KEY`).
    pub fn with_secrets(mut self, store: Arc<abx_egress::SecretStore>) -> Net {
        self.tls.secrets = store.clone();
        self.secrets = store;
        self
    }

    /// Parse a policy stored at create (a sandbox restored after a restart): as [`Net::parse`],
    /// but a secret removed since does not refuse the whole policy (the connections that need
    /// it are refused then, counted as blocked).
    pub fn parse_stored(&self, method: &str, spec: &Value) -> Result<Policy, AbxError> {
        Policy::parse(method, spec, &self.sets, &self.guard)
    }

    /// Parse a policy for `method` (E1004 naming the bad entry, or a secret key the store
    /// does not have: the key, never a value).
    pub fn parse(&self, method: &str, spec: &Value) -> Result<Policy, AbxError> {
        let policy = Policy::parse(method, spec, &self.sets, &self.guard)?;
        if let Some(key) = policy
            .secret_keys()
            .into_iter()
            .find(|k| !self.secrets.contains(k))
        {
            return Err(AbxError::invalid_params(
                method,
                format!("network: the secret '{key}' a header names is not in the broker's secret store (set it with: abx secret set {key})"),
            ));
        }
        Ok(policy)
    }
}

/// **Tests only**, read from the daemon's own environment (never from a client's request or
/// a sandbox: neither can set the daemon's environment), and only with `ABX_TEST_HOOKS=1`:
/// `ABX_TEST_EGRESS_RESOLVE="name=127.0.0.2,other=127.0.0.3"` replaces the system resolver
/// by a static map (any other name does not exist); `ABX_TEST_EGRESS_LOOPBACK=1` lets the
/// proxy reach 127.0.0.2 and 127.0.0.3 (where the tests' servers listen; or a comma list of
/// such addresses; 127.0.0.1 always stays refused).
pub fn test_settings() -> Option<(StaticResolver, Vec<IpAddr>)> {
    if !std::env::var("ABX_TEST_HOOKS").is_ok_and(|v| v == "1") {
        return None;
    }
    let resolve = std::env::var("ABX_TEST_EGRESS_RESOLVE").ok();
    let loopback = std::env::var("ABX_TEST_EGRESS_LOOPBACK").ok();
    if resolve.is_none() && loopback.is_none() {
        return None;
    }
    let mut map: Vec<(String, Vec<IpAddr>)> = Vec::new();
    for item in resolve.as_deref().unwrap_or("").split(',') {
        let Some((name, addr)) = item.split_once('=') else {
            continue;
        };
        let Ok(ip) = addr.trim().parse::<IpAddr>() else {
            continue;
        };
        match map.iter_mut().find(|(n, _)| n == name.trim()) {
            Some((_, v)) => v.push(ip),
            None => map.push((name.trim().to_owned(), vec![ip])),
        }
    }
    let mut r = StaticResolver::new();
    for (n, a) in &map {
        r = r.with(n, a);
    }
    let lb = match loopback.as_deref() {
        None | Some("") | Some("0") => Vec::new(),
        Some("1") => vec![[127, 0, 0, 2].into(), [127, 0, 0, 3].into()],
        Some(list) => list
            .split(',')
            .filter_map(|a| a.trim().parse().ok())
            .collect(),
    };
    Some((r, lb))
}

/// **Tests only**, as [`test_settings`]: `ABX_TEST_EGRESS_CA=FILE` (PEM) is a CA the proxy
/// trusts for upstreams of hosts whose requests get headers added, besides the web's roots.
fn test_upstream_ca() -> Option<Vec<u8>> {
    if !std::env::var("ABX_TEST_HOOKS").is_ok_and(|v| v == "1") {
        return None;
    }
    let path = std::env::var_os("ABX_TEST_EGRESS_CA")?;
    std::fs::read(path).ok()
}

/// The named sets of the broker config: `[network.sets]` with `NAME = ["host", ...]`, or
/// `[network.sets.NAME]` with `allow = ["host", ...]` (bad ones are logged and skipped).
pub fn sets_from_config(config: &toml::Table) -> Sets {
    let mut sets = Sets::new();
    let Some(t) = config
        .get("network")
        .and_then(|v| v.get("sets"))
        .and_then(|v| v.as_table())
    else {
        return sets;
    };
    for (name, v) in t {
        let list = match v {
            toml::Value::Array(a) => Some(a),
            toml::Value::Table(t) => t.get("allow").and_then(|v| v.as_array()),
            _ => None,
        };
        let Some(list) = list else {
            warn!(set = %name, "ignoring [network.sets] entry: not a list of patterns (NAME = [...] or [network.sets.NAME] allow = [...])");
            continue;
        };
        let items: Vec<Value> = list
            .iter()
            .filter_map(|x| x.as_str().map(Value::from))
            .collect();
        sets.insert(name.clone(), items);
    }
    sets
}

/// The proxy of one policy sandbox, and where it serves now.
pub struct SandboxEgress {
    /// The proxy (its policy, its blocked counters).
    pub egress: Arc<Egress>,
    /// The port inside the sandbox (`127.0.0.1:<port>`) of its running init's listener.
    pub port: Option<u16>,
    serve: Option<JoinHandle<()>>,
    relay: JoinHandle<()>,
    /// Whether this proxy's CA was written into the sandbox's `/tmp` (once per proxy: a
    /// proxy made after a daemon restart has a new CA).
    ca_written: bool,
}

impl SandboxEgress {
    /// A proxy for sandbox `id` under `policy`, its blocked events sent to `events`'
    /// subscribers as `sandbox/blocked`.
    pub fn new(net: &Net, id: &str, policy: Policy, events: Events) -> SandboxEgress {
        let egress = Egress::new(
            policy,
            Config {
                sandbox: id.to_owned(),
                guard: net.guard.clone(),
                resolver: net.resolver.clone(),
                limits: Limits::default(),
                tls: net.tls.clone(),
            },
        );
        let mut rx = egress.subscribe();
        let sid = id.to_owned();
        let relay = tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                match rx.recv().await {
                    Ok(e) => events.emit_blocked("local", &sid, &e.host, e.port, e.count),
                    Err(RecvError::Lagged(n)) => {
                        warn!(sandbox = %sid, lost = n, "egress: sandbox/blocked events lost (too many at once)")
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
        SandboxEgress {
            egress,
            port: None,
            serve: None,
            relay,
            ca_written: false,
        }
    }

    /// Serve the listener the sandbox's (new) init made: the earlier one, of an init that
    /// is gone, stops.
    pub fn serve(&mut self, listener: OwnedFd) -> std::io::Result<u16> {
        let std = std::net::TcpListener::from(listener);
        std.set_nonblocking(true)?;
        let port = std.local_addr()?.port();
        let l = tokio::net::TcpListener::from_std(std)?;
        if let Some(t) = self.serve.take() {
            t.abort();
        }
        self.serve = Some(tokio::spawn(self.egress.clone().serve_tcp(l)));
        self.port = Some(port);
        Ok(port)
    }

    /// The sandbox's init is gone (killed, paused out, restarting): stop accepting.
    pub fn stop_serving(&mut self) {
        if let Some(t) = self.serve.take() {
            t.abort();
        }
        self.port = None;
    }

    /// The sandbox is gone: every connection ends.
    pub fn shutdown(&mut self) {
        self.stop_serving();
        self.egress.shutdown();
        self.relay.abort();
    }

    /// The variables that make a command trust this sandbox's CA, when its policy adds
    /// headers to some host (else none): the CA is written into the sandbox's `/tmp` (host
    /// side `tmp`) first, alone and after the host's bundle.
    pub fn ca_env(&mut self, tmp: &Path) -> Vec<(String, String)> {
        if !self.egress.policy().has_headers() {
            return Vec::new();
        }
        let Some(ca) = self.egress.ca_pem() else {
            return Vec::new();
        };
        if !self.ca_written {
            let mut bundle = std::fs::read(HOST_BUNDLE).unwrap_or_default();
            if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                bundle.push(b'\n');
            }
            bundle.extend_from_slice(ca.as_bytes());
            let written = write_in_sandbox(tmp, CA_FILE, ca.as_bytes())
                .and_then(|()| write_in_sandbox(tmp, BUNDLE_FILE, &bundle));
            match written {
                Ok(()) => self.ca_written = true,
                Err(e) => {
                    warn!(error = %e, "egress: cannot write the sandbox's CA bundle into its /tmp");
                    return Vec::new();
                }
            }
        }
        ca_vars()
    }

    /// `sandbox/info`'s `network`: `{allow, deny, blocked: [{host, port, count, last}]}`.
    pub fn view(&self) -> Value {
        view(self.egress.policy().spec(), &self.egress.blocked())
    }
}

/// The host's CA bundle (Debian's), followed by the sandbox's CA in the sandbox's bundle.
const HOST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The sandbox's CA alone, in its `/tmp`.
const CA_FILE: &str = "abx-egress-ca.pem";
/// The host's bundle and the sandbox's CA, in its `/tmp`.
const BUNDLE_FILE: &str = "abx-egress-ca-bundle.pem";

/// What names the files inside the sandbox.
pub fn ca_vars() -> Vec<(String, String)> {
    let bundle = format!("/tmp/{BUNDLE_FILE}");
    vec![
        ("SSL_CERT_FILE".into(), bundle.clone()),
        ("REQUESTS_CA_BUNDLE".into(), bundle.clone()),
        ("CURL_CA_BUNDLE".into(), bundle),
        ("NODE_EXTRA_CA_CERTS".into(), format!("/tmp/{CA_FILE}")),
    ]
}

/// Write `name` in the sandbox's (host side) directory `dir`, which the sandbox can write
/// too: whatever is there is removed (never followed), the file made new
/// (`O_CREAT|O_EXCL|O_NOFOLLOW`: a symlink planted meanwhile fails it), readable by all,
/// given to the sandbox's owner as the daemon's other files in it are.
fn write_in_sandbox(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(_) => std::fs::remove_file(&path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)?;
    f.write_all(bytes)?;
    if let Some((u, g)) = super::container::sandbox_owner() {
        std::os::unix::fs::fchown(&f, Some(u), Some(g))?;
    }
    Ok(())
}

/// `{allow, deny, blocked}` of a policy as given and its counters.
pub fn view(spec: &Value, blocked: &[BlockedCount]) -> Value {
    let blocked: Vec<Value> = blocked
        .iter()
        .map(|b| {
            let secs = b
                .last
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            json!({"host": b.host, "port": b.port, "count": b.count, "last": rfc3339(secs)})
        })
        .collect();
    json!({
        "allow": spec.get("allow").cloned().unwrap_or_else(|| json!([])),
        "deny": spec.get("deny").cloned().unwrap_or_else(|| json!([])),
        "blocked": blocked,
    })
}

/// The proxy variables of a command in a policy sandbox whose proxy listens on `port`.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut v = Vec::new();
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        v.push((k.to_owned(), url.clone()));
        v.push((k.to_ascii_lowercase(), url.clone()));
    }
    for k in ["NO_PROXY", "no_proxy"] {
        v.push((k.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
    }
    v
}
