//! Enforcing what a plugin declares in `[security]` (docs/design.md#providers) with the broker's one
//! confinement mechanism ([`abx_confine`], also used for `local` sandboxes).
//!
//! A plugin process, from before its runtime starts:
//!
//! - **reads** its installed tree, its runtime (the install prefix of the program its
//!   `runtime.command` names, e.g. `/usr` for `/usr/bin/node`, `~/.pyenv` for a pyenv shim)
//!   and the system: `/usr`, `/bin`, `/sbin`, `/lib*`, `/etc`, `/proc`, `/sys`, `/dev` (and
//!   the directory `/etc/resolv.conf` points into). Not the user's home, not the broker's
//!   state, not other plugins.
//! - **writes** only where `filesystem` allows: `data_dir` (its `ABX_DATA_DIR`) and `tmp`
//!   (a private directory, its `TMPDIR`), plus the null-like devices and terminals.
//! - **executes** only its runtime (the program, its ELF interpreter, a script's interpreter)
//!   when `spawns_processes = false`; anything it can read when `true`.
//! - **network**: `["*"]` is unrestricted. `[]` means no TCP connect or bind (Landlock) and no
//!   other socket than Unix ones (seccomp). A host list allows TCP connect to the listed ports
//!   (80 and 443 for a host without a port; Landlock filters ports, not addresses: a listed
//!   port is open to every address) and, unless every entry is an IP address, UDP and netlink
//!   sockets for name resolution.
//!
//! When the kernel cannot enforce all of it (no Landlock, or TCP rules before Landlock ABI 4,
//! or no seccomp), the broker config's `enforcement` decides: `"refuse"` (E8016 before the
//! plugin starts) or `"warn"` (start it with whatever can be enforced and log a warning on
//! every start; `provider/info` and doctor say what is missing). The default is `refuse`
//! where the kernel has Landlock at all, `warn` where it has none. `ABX_ENFORCEMENT`
//! overrides the config.

use abx_confine::{self as confine, Coverage, Net, Policy, Prepared};
use abx_protocol::manifest::Security;
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Value};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The environment variable that overrides the config's `enforcement`.
pub const MODE_ENV: &str = "ABX_ENFORCEMENT";

/// What to do when the kernel cannot enforce a plugin's declarations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// E8016: the plugin does not start.
    Refuse,
    /// Start it with what can be enforced, with a warning.
    Warn,
}

impl Mode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Refuse => "refuse",
            Mode::Warn => "warn",
        }
    }

    /// `ABX_ENFORCEMENT`, else `enforcement` in the broker config, else the default.
    pub fn configured(config_dir: &Path) -> Mode {
        let parse = |s: &str| match s {
            "refuse" => Some(Mode::Refuse),
            "warn" => Some(Mode::Warn),
            _ => None,
        };
        if let Some(m) = std::env::var(MODE_ENV).ok().as_deref().and_then(parse) {
            return m;
        }
        let from_config = abx_home::config::read(config_dir)
            .get("enforcement")
            .and_then(|v| v.as_str())
            .and_then(parse);
        from_config.unwrap_or(if confine::kernel_landlock_abi() > 0 {
            Mode::Refuse
        } else {
            Mode::Warn
        })
    }
}

/// A plugin's confinement, computed from its manifest and where it lives.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The rules.
    pub policy: Policy,
    /// What this kernel enforces of them.
    pub coverage: Coverage,
    /// The private temp directory (`TMPDIR`), when `tmp` is declared.
    pub tmp_dir: Option<PathBuf>,
    /// What to do about gaps.
    pub mode: Mode,
}

/// Where a plugin lives.
pub struct Places<'a> {
    /// The installed tree.
    pub root: &'a Path,
    /// Its `ABX_DATA_DIR`.
    pub data_dir: &'a Path,
    /// Its private temp directory.
    pub tmp_dir: &'a Path,
    /// The `PATH` it runs with.
    pub path_env: &'a str,
}

const SYSTEM_READ: [&str; 12] = [
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/run/systemd/resolve",
];

/// The confinement of a plugin that declares `sec` and runs `command`.
pub fn plan(sec: &Security, command: &[String], at: &Places<'_>, mode: Mode) -> Plan {
    let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
    if let Ok(target) = std::fs::canonicalize("/etc/resolv.conf") {
        if let Some(dir) = target.parent().filter(|d| !d.starts_with("/etc")) {
            read.push(dir.to_path_buf());
        }
    }
    read.push(at.root.to_path_buf());
    let runtime = command.first().and_then(|p| {
        if p.starts_with("./") || p.starts_with("../") {
            Some(at.root.join(p))
        } else {
            confine::which(p, at.path_env)
        }
    });
    let closure = runtime
        .as_deref()
        .map(|r| confine::exec_closure(r, at.path_env))
        .unwrap_or_default();
    for file in &closure {
        let Some(dir) = file.parent() else { continue };
        let named = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let prefix = match dir.parent() {
            Some(up)
                if ["bin", "sbin", "shims", "libexec"].contains(&named) && up != Path::new("/") =>
            {
                up
            }
            _ => dir,
        };
        if prefix != Path::new("/") && !read.iter().any(|r| prefix.starts_with(r)) {
            read.push(prefix.to_path_buf());
        }
    }
    let mut write = Vec::new();
    let mut tmp_dir = None;
    if sec.filesystem.iter().any(|f| f == "data_dir") {
        write.push(at.data_dir.to_path_buf());
    }
    if sec.filesystem.iter().any(|f| f == "tmp") {
        write.push(at.tmp_dir.to_path_buf());
        tmp_dir = Some(at.tmp_dir.to_path_buf());
    }
    let exec = (!sec.spawns_processes).then_some(closure);
    let policy = Policy {
        read,
        write,
        exec,
        net: net_rules(&sec.network),
        // Whatever it declares, a plugin signals only its own processes and connects to no
        // abstract Unix socket outside its domain (Landlock ABI 6+): not the daemon, not the
        // user's other processes.
        scoped: true,
    };
    let coverage = policy.coverage();
    Plan {
        policy,
        coverage,
        tmp_dir,
        mode,
    }
}

/// `[security] network` as rules.
pub fn net_rules(network: &[String]) -> Net {
    if network.iter().any(|n| n == "*") {
        return Net::Any;
    }
    let mut ports = Vec::new();
    let mut datagrams = false;
    for entry in network {
        let (host, port) = split_host_port(entry);
        match port {
            Some(p) => ports.push(p),
            None => ports.extend([80, 443]),
        }
        if host != "*" && host.parse::<IpAddr>().is_err() {
            datagrams = true;
        }
    }
    ports.sort_unstable();
    ports.dedup();
    Net::Limited {
        tcp_connect: ports,
        datagrams,
    }
}

fn split_host_port(entry: &str) -> (&str, Option<u16>) {
    if let Some(rest) = entry.strip_prefix('[') {
        let close = rest.find(']').unwrap_or(rest.len());
        let port = rest
            .get(close + 1..)
            .and_then(|t| t.strip_prefix(':'))
            .and_then(|p| p.parse().ok());
        return (&rest[..close], port);
    }
    match entry.split_once(':') {
        Some((h, p)) => (h, p.parse().ok()),
        None => (entry, None),
    }
}

impl Plan {
    /// Everything declared is enforced.
    pub fn enforced(&self) -> bool {
        self.coverage.complete()
    }

    /// Why not, when not.
    pub fn why(&self) -> Option<String> {
        (!self.enforced()).then(|| self.coverage.gaps().join("; "))
    }

    /// The ruleset and filter to apply in the child, or E8016 when the kernel cannot enforce
    /// the declarations and the mode is `refuse`.
    pub fn prepare(&self, id: &str) -> Result<Prepared, AbxError> {
        if let Some(why) = self.why() {
            match self.mode {
                Mode::Refuse => {
                    return Err(AbxError::new(
                        ErrorCode::EnforcementUnavailable,
                        &[("provider", id), ("detail", &why)],
                    ))
                }
                Mode::Warn => tracing::warn!(
                    provider = %id,
                    "starting the plugin although its declared security is not fully enforced \
                     (enforcement = \"warn\"): {why}"
                ),
            }
        }
        self.policy.prepare().map_err(|e| {
            AbxError::new(
                ErrorCode::EnforcementUnavailable,
                &[("provider", id), ("detail", &e)],
            )
        })
    }

    /// `provider/info`'s view of the rules.
    pub fn describe(&self) -> Value {
        let (tcp, datagrams) = match &self.policy.net {
            Net::Any => (Value::String("any".into()), true),
            Net::Limited {
                tcp_connect,
                datagrams,
            } => (json!(tcp_connect), *datagrams),
        };
        json!({
            "enforced": self.enforced(),
            "why": self.why(),
            "enforcement": self.mode.as_str(),
            "landlockAbi": self.coverage.abi,
            "rules": {
                "read": self.policy.read,
                "write": self.policy.write,
                "execute": match &self.policy.exec { Some(v) => json!(v), None => json!("anything readable") },
                "tcpConnectPorts": tcp,
                "udpAndNetlink": datagrams,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn network_maps_to_ports() {
        assert_eq!(net_rules(&strings(&["*"])), Net::Any);
        assert_eq!(
            net_rules(&[]),
            Net::Limited {
                tcp_connect: vec![],
                datagrams: false
            }
        );
        assert_eq!(
            net_rules(&strings(&["127.0.0.1:8080", "[::1]:9"])),
            Net::Limited {
                tcp_connect: vec![9, 8080],
                datagrams: false
            }
        );
        assert_eq!(
            net_rules(&strings(&["api.example.com", "*:8443"])),
            Net::Limited {
                tcp_connect: vec![80, 443, 8443],
                datagrams: true
            }
        );
    }

    #[test]
    fn plan_reads_root_and_runtime_writes_declared() {
        let d = tempfile::tempdir().unwrap();
        let (root, data, tmp) = (d.path().join("r"), d.path().join("d"), d.path().join("t"));
        let sec = Security {
            network: vec![],
            filesystem: strings(&["data_dir"]),
            spawns_processes: false,
        };
        let at = Places {
            root: &root,
            data_dir: &data,
            tmp_dir: &tmp,
            path_env: "/usr/bin:/bin",
        };
        let p = plan(&sec, &strings(&["sh", "x"]), &at, Mode::Refuse);
        assert!(p.policy.read.contains(&root));
        assert_eq!(p.policy.write, vec![data.clone()]);
        assert!(p.tmp_dir.is_none());
        let exec = p.policy.exec.clone().expect("limited");
        assert!(exec.iter().any(|e| e.ends_with("sh")), "{exec:?}");
        assert_eq!(p.describe()["rules"]["tcpConnectPorts"], json!([]));
    }
}
