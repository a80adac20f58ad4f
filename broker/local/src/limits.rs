//! Per-sandbox limits (docs/design.md#local): memory, CPU and processes, enforced with a cgroup per
//! sandbox (v2, or the v1 hierarchies where those are mounted, as on hybrid systems), and
//! with rlimits where no cgroup can be made (processes only: `RLIMIT_NPROC` counts per user
//! namespace, so it bounds exactly the sandbox's processes). The cgroup also freezes the
//! sandbox for pause/resume and tells whether the kernel's OOM killer struck.
//!
//! The init's outer process joins the cgroup first thing (a `write("0")` to each
//! `cgroup.procs` the daemon opened and handed it), so every process of the sandbox is in it
//! from the start. `cgroups-rs` was considered: the join happens in the init through
//! inherited descriptors, which the crate does not offer, and what remains is a handful of
//! file writes; see docs/architecture.md.

use abx_protocol::AbxError;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// The limits of a sandbox (`limits` on `sandbox/create`; defaults from the broker config).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// Memory in bytes (`memory: 536870912` or `"512M"`).
    #[serde(
        default,
        deserialize_with = "de_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory: Option<u64>,
    /// CPUs (fraction of a core allowed: `0.5`, `2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Processes (and threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
}

/// Default limits of a sandbox: 2 GiB of memory, 1024 processes, CPU unlimited.
pub const DEFAULT: Limits = Limits {
    memory: Some(2 << 30),
    cpus: None,
    pids: Some(1024),
};

/// Parse `512M`, `2G`, `1048576`, `64k` (powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_lowercase();
            let m: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => return None,
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: f64 = num.trim().parse().ok()?;
    if !(n.is_finite() && n > 0.0) {
        return None;
    }
    Some((n * mult as f64) as u64)
}

fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| D::Error::custom("memory must be a positive number of bytes")),
        Some(Value::String(s)) => parse_size(&s)
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("memory '{s}': use bytes or 512M, 2G"))),
        Some(other) => Err(D::Error::custom(format!("memory: unexpected {other}"))),
    }
}

impl Limits {
    /// These limits with `defaults` filled in where unset, checked.
    pub fn resolve(&self, defaults: &Limits) -> Result<Limits, AbxError> {
        let l = Limits {
            memory: self.memory.or(defaults.memory),
            cpus: self.cpus.or(defaults.cpus),
            pids: self.pids.or(defaults.pids),
        };
        let bad = |d: String| AbxError::invalid_params("sandbox/create", d);
        if let Some(m) = l.memory {
            if m < 16 << 20 {
                return Err(bad(format!("limits.memory {m} is below 16 MiB")));
            }
        }
        if let Some(c) = l.cpus {
            if !(0.01..=1024.0).contains(&c) {
                return Err(bad(format!("limits.cpus {c}: give 0.01 to 1024")));
            }
        }
        if let Some(p) = l.pids {
            if p < 8 {
                return Err(bad(format!("limits.pids {p} is below 8")));
            }
        }
        Ok(l)
    }
}

/// Which cgroup hierarchy serves a controller.
#[derive(Clone, Debug)]
enum Kind {
    V2(PathBuf),
    /// v1: controller name -> the directory of this sandbox in its hierarchy.
    V1(Vec<(&'static str, PathBuf)>),
}

/// A sandbox's cgroup (made at start, removed at kill).
#[derive(Clone, Debug)]
pub struct Cgroup {
    kind: Kind,
    /// What is enforced: "memory", "cpu", "pids", "freezer".
    pub enforced: Vec<&'static str>,
}

fn write(p: &Path, v: &str) -> std::io::Result<()> {
    std::fs::write(p, v)
}

fn open_procs(dir: &Path) -> std::io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))?;
    Ok(OwnedFd::from(f))
}

/// The v2 cgroup under which sandboxes are made: `ABX_CGROUP` (a delegated cgroup the
/// user owns), else `<cgroup2 mount>/abx` when we can make it (root), else the parent of
/// our own cgroup when it is writable (a systemd delegation).
fn v2_base() -> Option<PathBuf> {
    let mount = PathBuf::from("/sys/fs/cgroup");
    if !mount.join("cgroup.controllers").is_file() {
        // v1 or hybrid: the controllers live in the v1 hierarchies.
        return None;
    }
    if let Some(p) = std::env::var_os("ABX_CGROUP") {
        return Some(PathBuf::from(p));
    }
    let base = mount.join("abx");
    if std::fs::create_dir_all(&base).is_ok() && base.join("cgroup.procs").exists() {
        return Some(base);
    }
    None
}

fn enable_v2_controllers(base: &Path) -> Vec<&'static str> {
    let mut on = Vec::new();
    // The parent must delegate the controllers to `base`, and `base` to its children.
    let avail = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    if let Some(parent) = base.parent() {
        for c in ["memory", "pids", "cpu"] {
            if !avail.split_whitespace().any(|a| a == c) {
                let _ = write(&parent.join("cgroup.subtree_control"), &format!("+{c}"));
            }
        }
    }
    let avail = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    for c in ["memory", "pids", "cpu"] {
        if avail.split_whitespace().any(|a| a == c)
            && write(&base.join("cgroup.subtree_control"), &format!("+{c}")).is_ok()
        {
            on.push(c);
        }
    }
    on
}

/// The v1 hierarchies mounted here (controller -> mount point).
fn v1_mounts() -> Vec<(&'static str, PathBuf)> {
    let mut out = Vec::new();
    for (c, dirs) in [
        ("memory", &["memory"][..]),
        ("pids", &["pids"][..]),
        ("cpu", &["cpu,cpuacct", "cpu"][..]),
        ("freezer", &["freezer"][..]),
    ] {
        for d in dirs {
            let p = Path::new("/sys/fs/cgroup").join(d);
            if p.join("cgroup.procs").is_file() {
                out.push((c, p));
                break;
            }
        }
    }
    out
}

/// Remove empty spare cgroups (`spare-*`, older than a minute) a daemon that died left
/// behind. A spare in use has a process in it, and removing a cgroup with a process fails:
/// only the empty ones go.
pub fn remove_stale_spares() {
    let mut bases: Vec<PathBuf> = v2_base().into_iter().collect();
    bases.extend(v1_mounts().into_iter().map(|(_, m)| m.join("abx")));
    for base in bases {
        let Ok(rd) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in rd.flatten() {
            // Only old ones: a live daemon's new spare is empty for the moment between its
            // mkdir and its process joining.
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(60));
            if old && e.file_name().to_string_lossy().starts_with("spare-") {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}

impl Cgroup {
    /// Make the cgroup of sandbox `id` with `limits`; None when no cgroup can be made here
    /// (then only rlimits apply).
    pub fn create(id: &str, limits: &Limits) -> Option<Cgroup> {
        if let Some(base) = v2_base() {
            let on = enable_v2_controllers(&base);
            let dir = base.join(id);
            if std::fs::create_dir(&dir).is_ok() || dir.is_dir() {
                let mut enforced = vec!["freezer"];
                if let (Some(m), true) = (limits.memory, on.contains(&"memory")) {
                    if write(&dir.join("memory.max"), &m.to_string()).is_ok() {
                        let _ = write(&dir.join("memory.swap.max"), "0");
                        enforced.push("memory");
                    }
                }
                if let (Some(p), true) = (limits.pids, on.contains(&"pids")) {
                    if write(&dir.join("pids.max"), &p.to_string()).is_ok() {
                        enforced.push("pids");
                    }
                }
                if let (Some(c), true) = (limits.cpus, on.contains(&"cpu")) {
                    let quota = (c * 100_000.0) as u64;
                    if write(&dir.join("cpu.max"), &format!("{quota} 100000")).is_ok() {
                        enforced.push("cpu");
                    }
                }
                if open_procs(&dir).is_ok() {
                    return Some(Cgroup {
                        kind: Kind::V2(dir),
                        enforced,
                    });
                }
                let _ = std::fs::remove_dir(&dir);
            }
        }
        let mounts = v1_mounts();
        let mut dirs = Vec::new();
        let mut enforced = Vec::new();
        for (c, mount) in mounts {
            let dir = mount.join("abx").join(id);
            if std::fs::create_dir_all(&dir).is_err() {
                continue;
            }
            let ok = match c {
                "memory" => match limits.memory {
                    Some(m) => {
                        let ok = write(&dir.join("memory.limit_in_bytes"), &m.to_string()).is_ok();
                        let _ = write(&dir.join("memory.memsw.limit_in_bytes"), &m.to_string());
                        ok
                    }
                    None => true,
                },
                "pids" => match limits.pids {
                    Some(p) => write(&dir.join("pids.max"), &p.to_string()).is_ok(),
                    None => true,
                },
                "cpu" => match limits.cpus {
                    Some(cpus) => {
                        write(&dir.join("cpu.cfs_period_us"), "100000").is_ok()
                            && write(
                                &dir.join("cpu.cfs_quota_us"),
                                &((cpus * 100_000.0) as u64).to_string(),
                            )
                            .is_ok()
                    }
                    None => true,
                },
                _ => true,
            };
            match (ok, open_procs(&dir)) {
                (true, Ok(_)) => {
                    let set = match c {
                        "memory" => limits.memory.is_some(),
                        "pids" => limits.pids.is_some(),
                        "cpu" => limits.cpus.is_some(),
                        _ => true,
                    };
                    if set {
                        enforced.push(c);
                    }
                    dirs.push((c, dir));
                }
                _ => {
                    let _ = std::fs::remove_dir(&dir);
                }
            }
        }
        if dirs.is_empty() {
            return None;
        }
        Some(Cgroup {
            kind: Kind::V1(dirs),
            enforced,
        })
    }

    /// The `cgroup.procs` files the sandbox's init joins through, opened for it.
    pub fn open_procs(&self) -> Vec<OwnedFd> {
        let dirs: Vec<&Path> = match &self.kind {
            Kind::V2(d) => vec![d.as_path()],
            Kind::V1(v) => v.iter().map(|(_, d)| d.as_path()).collect(),
        };
        dirs.into_iter()
            .filter_map(|d| open_procs(d).ok())
            .collect()
    }

    /// `v2` or `v1`.
    pub fn version(&self) -> &'static str {
        match self.kind {
            Kind::V2(_) => "v2",
            Kind::V1(_) => "v1",
        }
    }

    fn dir_of(&self, controller: &str) -> Option<&Path> {
        match &self.kind {
            Kind::V2(d) => Some(d),
            Kind::V1(v) => v
                .iter()
                .find(|(c, _)| *c == controller)
                .map(|(_, d)| d.as_path()),
        }
    }

    /// Freeze or thaw every process (false when no freezer is available).
    pub fn freeze(&self, frozen: bool) -> bool {
        match &self.kind {
            Kind::V2(d) => write(&d.join("cgroup.freeze"), if frozen { "1" } else { "0" }).is_ok(),
            Kind::V1(_) => match self.dir_of("freezer") {
                Some(d) => write(
                    &d.join("freezer.state"),
                    if frozen { "FROZEN" } else { "THAWED" },
                )
                .is_ok(),
                None => false,
            },
        }
    }

    /// How many times the OOM killer struck in the sandbox.
    pub fn oom_kills(&self) -> u64 {
        let file = match &self.kind {
            Kind::V2(d) => d.join("memory.events"),
            Kind::V1(_) => match self.dir_of("memory") {
                Some(d) => d.join("memory.oom_control"),
                None => return 0,
            },
        };
        std::fs::read_to_string(file)
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("oom_kill ")
                        .and_then(|v| v.trim().parse().ok())
                })
            })
            .unwrap_or(0)
    }

    fn dirs(&self) -> Vec<PathBuf> {
        match &self.kind {
            Kind::V2(d) => vec![d.clone()],
            Kind::V1(v) => v.iter().map(|(_, d)| d.clone()).collect(),
        }
    }

    /// Count one process more than `limits` allow: a spare's outer process waits in the
    /// cgroup (it joined before the sandbox existed), so the sandbox's own processes still get
    /// exactly the limit.
    pub fn allow_outer_process(&self, limits: &Limits) {
        if let (Some(p), Some(dir)) = (limits.pids, self.dir_of("pids")) {
            let file = if matches!(self.kind, Kind::V2(_)) || dir.join("pids.max").exists() {
                dir.join("pids.max")
            } else {
                return;
            };
            let _ = write(&file, &(p + 1).to_string());
        }
    }

    /// Give the cgroup sandbox `id`'s name (a spare made ahead of time). cgroup v1 can
    /// rename a cgroup; v2 cannot, and the cgroup keeps its name.
    pub fn rename(&mut self, id: &str) {
        if let Kind::V1(v) = &mut self.kind {
            for (_, d) in v.iter_mut() {
                let n = d.with_file_name(id);
                if std::fs::rename(&*d, &n).is_ok() {
                    *d = n;
                }
            }
        }
    }

    /// [`Cgroup::remove`] on a blocking thread.
    pub fn remove_blocking(&self) {
        for d in self.dirs() {
            for _ in 0..100 {
                if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }

    /// Remove the cgroup (after its processes are gone; retried briefly while the kernel
    /// finishes tearing them down).
    pub async fn remove(&self) {
        for d in self.dirs() {
            for _ in 0..100 {
                if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    }
}

/// What `sandbox/systemInfo` says about limits: each with its value and how it is enforced.
pub fn describe(limits: &Limits, cg: Option<&Cgroup>) -> Value {
    let how = |name: &str, rlimit: Option<&str>| -> Value {
        match cg {
            Some(c) if c.enforced.contains(&name) => json!(format!("cgroup {}", c.version())),
            _ => rlimit.map_or(Value::Bool(false), |r| json!(r)),
        }
    };
    json!({
        "memory": {"bytes": limits.memory, "enforced": how("memory", None)},
        "cpus": {"cpus": limits.cpus, "enforced": how("cpu", None)},
        "pids": {"max": limits.pids, "enforced": how("pids", Some("rlimit RLIMIT_NPROC (per user namespace)"))},
        "freezer": how("freezer", Some("SIGSTOP/SIGCONT to every process")),
        "tmpSize": {"enforced": false, "why": "/workspace and /tmp are directories of the broker's data dir (files/* share them); /dev/shm is a tmpfs of 64 MiB"},
    })
}

/// E1004 for bad `limits`.
pub fn parse(v: &Value) -> Result<Limits, AbxError> {
    serde_json::from_value(v.clone())
        .map_err(|e| AbxError::invalid_params("sandbox/create", format!("limits: {e}")))
        .map_err(|e: AbxError| {
            e.with_suggestion("limits: {\"memory\": \"512M\", \"cpus\": 1.5, \"pids\": 256}")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        assert_eq!(parse_size("12X"), None);
        assert_eq!(parse_size("-1M"), None);
    }

    #[test]
    fn limits_resolve_and_refuse_nonsense() {
        let l = parse(&json!({"memory": "256M", "pids": 50})).unwrap();
        let r = l.resolve(&DEFAULT).unwrap();
        assert_eq!(r.memory, Some(256 << 20));
        assert_eq!(r.pids, Some(50));
        assert_eq!(r.cpus, None);
        assert!(parse(&json!({"memory": "lots"})).is_err());
        assert!(parse(&json!({"disk": 1})).is_err());
        assert!(parse(&json!({"pids": 2}))
            .unwrap()
            .resolve(&DEFAULT)
            .is_err());
        assert!(parse(&json!({"cpus": 0}))
            .unwrap()
            .resolve(&DEFAULT)
            .is_err());
    }
}
