//! Installed providers and their stored configuration (docs/design.md#providers).
//!
//! Layout under the data dir:
//!
//! ```text
//! providers/installed.json        {"version": 1, "providers": [Installed, ...]}
//! providers/.lock                 flock held for every read-modify-write
//! providers/<id>/<digest-16>/     an installed tree (read-only)
//! providers/.staging-<rand>/      an install in progress (+ .staging-<rand>.lock, flocked)
//! ```
//!
//! `installed.json` is replaced atomically (temp file, fsync, rename), so readers never
//! need the lock; writers take it. A crash leaves either the old or the new file; trees and
//! staging directories no record points to are removed by [`cleanup_orphans`] (the daemon
//! calls it at start, under the lock, skipping installs that are still running).
//!
//! The manifest stored in a record is its serialized form, where a secret key's default is
//! omitted; [`full_manifest`] re-reads the installed tree's `abx-provider.toml` when the
//! broker needs it (resolving configuration before a plugin start, after verification).
//!
//! Configuration lives under the config dir in `providers/<id>.toml`, created with mode 0600
//! (never chmod-ed afterwards) and replaced atomically.

use abx_home::FileLock;
use abx_protocol::manifest::{self, Manifest};
use abx_protocol::{AbxError, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const REGISTRY_VERSION: u32 = 1;
const STAGING_PREFIX: &str = ".staging-";

/// How far an installed provider is trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    /// A full commit id or a content digest was given.
    Pinned,
    /// A moving ref (branch, tag, default head) accepted with `--allow-unpinned`.
    Unpinned,
    /// Copied from a local directory.
    Local,
}

impl Trust {
    /// `pinned`, `unpinned`, `local`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Pinned => "pinned",
            Trust::Unpinned => "unpinned",
            Trust::Local => "local",
        }
    }
}

impl fmt::Display for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a provider came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// The directory (absolute), git URL or archive URL given.
    pub url: String,
    /// `--subdir`, normalized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdir: Option<String>,
    /// `--ref` as given.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
    /// The resolved commit (git sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// One installed provider.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Installed {
    /// The manifest's id.
    pub id: String,
    /// The manifest's name.
    pub name: String,
    /// The manifest's version.
    pub version: String,
    /// Trust level.
    pub trust: Trust,
    /// Source.
    pub source: Source,
    /// `sha256:<64 hex>` of the installed tree.
    pub digest: String,
    /// The installed tree: `data_dir/providers/<id>/<digest-16>`.
    pub path: PathBuf,
    /// RFC 3339 UTC.
    pub installed_at: String,
    /// The manifest (serialized form: secret defaults omitted).
    pub manifest: Manifest,
}

#[derive(Serialize, Deserialize)]
struct RegistryFile {
    version: u32,
    #[serde(default)]
    providers: Vec<Installed>,
}

/// `data_dir/providers`.
pub fn providers_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("providers")
}

fn registry_path(data_dir: &Path) -> PathBuf {
    providers_dir(data_dir).join("installed.json")
}

fn lock_path(data_dir: &Path) -> PathBuf {
    providers_dir(data_dir).join(".lock")
}

fn internal(what: &str, e: impl fmt::Display) -> AbxError {
    AbxError::internal(format!("{what}: {e}"))
}

fn mkdir_private(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Read `installed.json` (no lock needed: it is replaced atomically). A missing file is an
/// empty registry; an unreadable one is an error.
pub fn try_load(data_dir: &Path) -> Result<Vec<Installed>, AbxError> {
    let path = registry_path(data_dir);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(internal(&format!("reading {}", path.display()), e)),
    };
    let file: RegistryFile = serde_json::from_slice(&bytes)
        .map_err(|e| internal(&format!("parsing {}", path.display()), e))?;
    if file.version != REGISTRY_VERSION {
        return Err(AbxError::internal(format!(
            "{} has version {}, this broker reads version {REGISTRY_VERSION}",
            path.display(),
            file.version
        )));
    }
    Ok(file.providers)
}

/// Every installed provider, sorted by id. An unreadable registry is logged and reads as
/// empty (writers use [`try_load`] under the lock and never overwrite it).
pub fn load(data_dir: &Path) -> Vec<Installed> {
    match try_load(data_dir) {
        Ok(mut v) => {
            v.sort_by(|a, b| a.id.cmp(&b.id));
            v
        }
        Err(e) => {
            tracing::error!("provider registry unreadable: {}", e.message);
            Vec::new()
        }
    }
}

/// One installed provider.
pub fn get(data_dir: &Path, id: &str) -> Option<Installed> {
    load(data_dir).into_iter().find(|p| p.id == id)
}

/// The registry, locked for a read-modify-write. Changes are written by [`Locked::save`];
/// dropping it without saving changes nothing.
pub struct Locked {
    _lock: FileLock,
    data_dir: PathBuf,
    /// The records as read under the lock.
    pub records: Vec<Installed>,
}

/// Take the registry lock (blocking) and read the records.
pub fn lock(data_dir: &Path) -> Result<Locked, AbxError> {
    let dir = providers_dir(data_dir);
    mkdir_private(&dir).map_err(|e| internal(&format!("creating {}", dir.display()), e))?;
    let lock = FileLock::acquire(&lock_path(data_dir))
        .map_err(|e| internal("locking the provider registry", e))?;
    let records = try_load(data_dir)?;
    Ok(Locked {
        _lock: lock,
        data_dir: data_dir.to_path_buf(),
        records,
    })
}

impl Locked {
    /// A record by id.
    pub fn get(&self, id: &str) -> Option<&Installed> {
        self.records.iter().find(|r| r.id == id)
    }

    /// Insert or replace a record (by id); returns the previous one.
    pub fn put(&mut self, rec: Installed) -> Option<Installed> {
        match self.records.iter_mut().find(|r| r.id == rec.id) {
            Some(slot) => Some(std::mem::replace(slot, rec)),
            None => {
                self.records.push(rec);
                None
            }
        }
    }

    /// Remove a record; returns it.
    pub fn take(&mut self, id: &str) -> Option<Installed> {
        let i = self.records.iter().position(|r| r.id == id)?;
        Some(self.records.remove(i))
    }

    /// Write the records atomically.
    pub fn save(&mut self) -> Result<(), AbxError> {
        self.records.sort_by(|a, b| a.id.cmp(&b.id));
        let file = RegistryFile {
            version: REGISTRY_VERSION,
            providers: std::mem::take(&mut self.records),
        };
        let bytes = serde_json::to_vec_pretty(&file);
        self.records = file.providers;
        let bytes = bytes.map_err(|e| internal("serializing the provider registry", e))?;
        let path = registry_path(&self.data_dir);
        abx_home::util::write_atomic(&path, &bytes)
            .map_err(|e| internal(&format!("writing {}", path.display()), e))
    }

    /// True when some record points at `path`.
    pub fn references(&self, path: &Path) -> bool {
        self.records.iter().any(|r| r.path == path)
    }

    /// Remove an installed tree no record points to (under the lock).
    pub fn remove_unreferenced_tree(&self, path: &Path) -> Result<(), AbxError> {
        if self.references(path) {
            return Ok(());
        }
        remove_tree(&self.data_dir, path)
    }

    /// The data dir.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

/// Insert or replace a record under the lock; a tree the previous record used and no
/// record uses any more is removed. Returns the previous record.
pub fn upsert(data_dir: &Path, rec: Installed) -> Result<Option<Installed>, AbxError> {
    let mut reg = lock(data_dir)?;
    let prev = reg.put(rec);
    reg.save()?;
    if let Some(p) = &prev {
        if let Err(e) = reg.remove_unreferenced_tree(&p.path) {
            tracing::warn!("removing the old tree of '{}': {}", p.id, e.message);
        }
    }
    Ok(prev)
}

/// Uninstall: the record goes first (atomically), then its tree. E8001 when not installed.
pub fn remove(data_dir: &Path, id: &str) -> Result<Installed, AbxError> {
    let mut reg = lock(data_dir)?;
    let rec = reg
        .take(id)
        .ok_or_else(|| AbxError::new(ErrorCode::ProviderNotInstalled, &[("provider", id)]))?;
    reg.save()?;
    // A leftover tree (crash here) is an orphan for cleanup_orphans.
    if let Err(e) = reg.remove_unreferenced_tree(&rec.path) {
        tracing::warn!("removing the tree of '{id}': {}", e.message);
    }
    Ok(rec)
}

/// The manifest of an installed provider as its tree has it (secret defaults included).
/// Verify the tree first ([`super::digest::verify`]).
pub fn full_manifest(rec: &Installed) -> Result<Manifest, AbxError> {
    let path = rec.path.join(manifest::FILE_NAME);
    let text = fs::read_to_string(&path)
        .map_err(|_| AbxError::new(ErrorCode::IntegrityFailed, &[("provider", rec.id.as_str())]))?;
    manifest::parse(&text)
}

/// True when `path` is strictly inside `data_dir/providers` without `..` components.
fn is_inside_providers(data_dir: &Path, path: &Path) -> bool {
    let base = providers_dir(data_dir);
    path != base
        && path.starts_with(&base)
        && !path.components().any(|c| matches!(c, Component::ParentDir))
}

/// Make every directory of a tree writable again (installed trees are read-only), without
/// following symlinks, then remove it.
pub(crate) fn force_remove_dir(path: &Path) -> io::Result<()> {
    fn unlock(p: &Path) {
        if let Ok(md) = fs::symlink_metadata(p) {
            if md.is_dir() {
                let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o700));
                if let Ok(rd) = fs::read_dir(p) {
                    for e in rd.flatten() {
                        unlock(&e.path());
                    }
                }
            }
        }
    }
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(md) if !md.is_dir() => return fs::remove_file(path),
        Ok(_) => {}
    }
    unlock(path);
    fs::remove_dir_all(path)
}

/// Remove an installed tree (only ever inside `data_dir/providers`), then its `<id>`
/// directory when empty.
fn remove_tree(data_dir: &Path, path: &Path) -> Result<(), AbxError> {
    if !is_inside_providers(data_dir, path) {
        return Err(AbxError::internal(format!(
            "refusing to remove '{}': not inside {}",
            path.display(),
            providers_dir(data_dir).display()
        )));
    }
    force_remove_dir(path).map_err(|e| internal(&format!("removing {}", path.display()), e))?;
    if let Some(parent) = path.parent() {
        if parent != providers_dir(data_dir) && is_inside_providers(data_dir, parent) {
            let _ = fs::remove_dir(parent); // only succeeds when empty
        }
    }
    Ok(())
}

/// A staging directory for one install: `data_dir/providers/.staging-<rand>/`, held by an
/// flock on its sibling `.staging-<rand>.lock` so [`cleanup_orphans`] leaves it alone while
/// the install runs. Dropping it removes both.
pub struct Staging {
    /// The directory.
    pub dir: PathBuf,
    lock_path: PathBuf,
    _lock: FileLock,
}

fn random_suffix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = N.fetch_add(1, Ordering::Relaxed);
    // Mix so names do not look sequential; uniqueness comes from create_dir anyway.
    let mut x =
        nanos ^ (u64::from(std::process::id()) << 32) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    format!("{x:016x}")
}

/// Create a staging directory (under the registry lock, so cleanup never sees it half made).
pub fn new_staging(data_dir: &Path) -> Result<Staging, AbxError> {
    let reg = lock(data_dir)?;
    let base = providers_dir(data_dir);
    for _ in 0..16 {
        let name = format!("{STAGING_PREFIX}{}", random_suffix());
        let dir = base.join(&name);
        let lock_path = base.join(format!("{name}.lock"));
        let lock = match FileLock::try_acquire(&lock_path) {
            Ok(Some(l)) => l,
            Ok(None) => continue,
            Err(e) => return Err(internal("locking a staging directory", e)),
        };
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                drop(reg);
                return Ok(Staging {
                    dir,
                    lock_path,
                    _lock: lock,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(internal(&format!("creating {}", dir.display()), e)),
        }
    }
    Err(AbxError::internal("could not create a staging directory"))
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Err(e) = force_remove_dir(&self.dir) {
            tracing::warn!("removing {}: {e}", self.dir.display());
        }
        let _ = fs::remove_file(&self.lock_path);
    }
}

/// Remove what a crash left behind: staging directories of installs that are no longer
/// running, trees no record points to, temp files of interrupted registry writes. Returns
/// the paths removed.
pub fn cleanup_orphans(data_dir: &Path) -> Result<Vec<PathBuf>, AbxError> {
    let base = providers_dir(data_dir);
    if !base.is_dir() {
        return Ok(Vec::new());
    }
    let reg = lock(data_dir)?;
    let mut removed = Vec::new();
    let rd =
        fs::read_dir(&base).map_err(|e| internal(&format!("reading {}", base.display()), e))?;
    for ent in rd.flatten() {
        let name = ent.file_name();
        let name = name.to_string_lossy();
        let path = ent.path();
        let Ok(md) = fs::symlink_metadata(&path) else {
            continue;
        };
        if name == ".lock" || name == "installed.json" {
            continue;
        }
        if name.starts_with(".installed.json.tmp") && md.is_file() {
            if fs::remove_file(&path).is_ok() {
                removed.push(path);
            }
            continue;
        }
        if let Some(rest) = name.strip_prefix(STAGING_PREFIX) {
            let stem = rest.strip_suffix(".lock").unwrap_or(rest);
            let dir = base.join(format!("{STAGING_PREFIX}{stem}"));
            let lockp = base.join(format!("{STAGING_PREFIX}{stem}.lock"));
            if name.ends_with(".lock") && fs::symlink_metadata(&dir).is_ok() {
                continue; // handled with its directory
            }
            match FileLock::try_acquire(&lockp) {
                Ok(Some(_held)) => {
                    if fs::symlink_metadata(&dir).is_ok() && force_remove_dir(&dir).is_ok() {
                        removed.push(dir);
                    }
                    let _ = fs::remove_file(&lockp);
                }
                Ok(None) => {} // an install in progress
                Err(e) => tracing::warn!("checking {}: {e}", lockp.display()),
            }
            continue;
        }
        if md.is_dir() && manifest::is_valid_id(&name) {
            let installed = reg.get(&name).is_some();
            if let Ok(trees) = fs::read_dir(&path) {
                for t in trees.flatten() {
                    let tp = t.path();
                    // An installed plugin's own data and temp dirs live beside its trees.
                    if installed && matches!(t.file_name().to_str(), Some("data" | "tmp")) {
                        continue;
                    }
                    if !reg.references(&tp) && remove_tree(data_dir, &tp).is_ok() {
                        removed.push(tp);
                    }
                }
            }
            let _ = fs::remove_dir(&path);
        }
    }
    drop(reg);
    for p in &removed {
        tracing::info!("removed orphaned provider files: {}", p.display());
    }
    Ok(removed)
}

// ---------------------------------------------------------------------------------------
// Configuration.

fn config_error(id: &str, detail: impl fmt::Display) -> AbxError {
    AbxError::new(
        ErrorCode::ConfigInvalid,
        &[("provider", id), ("detail", &detail.to_string())],
    )
}

/// `config_dir/providers/<id>.toml`.
pub fn config_path(config_dir: &Path, id: &str) -> PathBuf {
    config_dir.join("providers").join(format!("{id}.toml"))
}

fn check_id(id: &str) -> Result<(), AbxError> {
    if manifest::is_valid_id(id) {
        Ok(())
    } else {
        Err(AbxError::new(
            ErrorCode::ProviderNotInstalled,
            &[("provider", id)],
        ))
    }
}

fn toml_to_json(v: toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => {
            Value::Object(t.into_iter().map(|(k, v)| (k, toml_to_json(v))).collect())
        }
    }
}

/// The stored configuration of a provider, or an error when the file is unreadable.
pub fn try_load_config(config_dir: &Path, id: &str) -> Result<BTreeMap<String, Value>, AbxError> {
    check_id(id)?;
    let path = config_path(config_dir, id);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => {
            return Err(config_error(
                id,
                format!("cannot read {}: {e}", path.display()),
            ))
        }
    };
    // The message of a parse error may quote the file: keep only the line.
    let table: BTreeMap<String, toml::Value> = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| {
            text.as_bytes()[..s.start.min(text.len())]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1
        });
        config_error(
            id,
            format!(
                "{} is not valid TOML{}",
                path.display(),
                line.map_or(String::new(), |l| format!(" (line {l})"))
            ),
        )
    })?;
    Ok(table
        .into_iter()
        .map(|(k, v)| (k, toml_to_json(v)))
        .collect())
}

/// The stored configuration of a provider (empty when none; an unreadable file is logged
/// and reads as empty; use [`try_load_config`] to get the error).
pub fn load_config(config_dir: &Path, id: &str) -> BTreeMap<String, Value> {
    try_load_config(config_dir, id).unwrap_or_else(|e| {
        tracing::warn!("{}", e.message);
        BTreeMap::new()
    })
}

/// Replace the stored configuration of a provider: written to a new 0600 file, fsynced,
/// renamed over the old one. `null` values are dropped (they mean "unset").
pub fn store_config(
    config_dir: &Path,
    id: &str,
    values: &BTreeMap<String, Value>,
) -> Result<(), AbxError> {
    check_id(id)?;
    let kept: BTreeMap<&String, &Value> = values.iter().filter(|(_, v)| !v.is_null()).collect();
    let text = toml::to_string(&kept).map_err(|_| {
        config_error(
            id,
            "values must be strings, numbers, booleans, lists or tables without nulls",
        )
    })?;
    let dir = config_dir.join("providers");
    mkdir_private(&dir).map_err(|e| internal(&format!("creating {}", dir.display()), e))?;
    let path = config_path(config_dir, id);
    static N: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{id}.toml.tmp{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let write = || -> io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        internal(&format!("writing {}", path.display()), e)
    })
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a table",
    }
}

/// Check values given to `provider/configure` against the manifest: known keys only, and
/// of the type of the key's default where it has one. `null` (unset) is always accepted.
/// Errors (E8006) name keys and types, never values.
pub fn validate_values(
    manifest: &Manifest,
    values: &BTreeMap<String, Value>,
) -> Result<(), AbxError> {
    for (k, v) in values {
        let Some(key) = manifest.config.get(k) else {
            let known: Vec<&str> = manifest.config_in_order().map(|(n, _)| n).collect();
            return Err(config_error(
                &manifest.id,
                format!(
                    "unknown key '{}' (known: {})",
                    k.escape_debug(),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        };
        if v.is_null() {
            continue;
        }
        if let Some(d) = &key.default {
            if kind_of(d) != kind_of(v) {
                return Err(config_error(
                    &manifest.id,
                    format!("key '{k}' must be {}, not {}", kind_of(d), kind_of(v)),
                ));
            }
        }
    }
    Ok(())
}

/// Read an environment value as the type of the key's default.
fn from_env(
    manifest: &Manifest,
    key: &str,
    var: &str,
    raw: String,
    default: Option<&Value>,
) -> Result<Value, AbxError> {
    let bad = |what: &str| {
        config_error(
            &manifest.id,
            format!("environment variable {var} (for '{key}') is not {what}"),
        )
    };
    Ok(match default {
        Some(Value::Number(_)) => {
            let t = raw.trim();
            if let Ok(i) = t.parse::<i64>() {
                Value::from(i)
            } else {
                t.parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    .ok_or_else(|| bad("a number"))?
            }
        }
        Some(Value::Bool(_)) => match raw.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Value::Bool(true),
            "0" | "false" | "no" | "off" => Value::Bool(false),
            _ => return Err(bad("a boolean (true/false)")),
        },
        Some(Value::Array(_)) | Some(Value::Object(_)) => {
            let v: Value = serde_json::from_str(&raw).map_err(|_| bad("JSON"))?;
            if kind_of(&v) != kind_of(default.expect("matched")) {
                return Err(bad(kind_of(default.expect("matched"))));
            }
            v
        }
        _ => Value::String(raw),
    })
}

/// The effective configuration of a provider: for each key of the manifest, the stored
/// value, else its environment variable (`env`, read as the default's type; empty means
/// unset), else its default. Returns it with the required keys still missing. Stored keys
/// the manifest does not know are dropped. Errors (E8006) never quote values.
pub fn resolve_config(
    manifest: &Manifest,
    stored: &BTreeMap<String, Value>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(BTreeMap<String, Value>, Vec<String>), AbxError> {
    let mut effective = BTreeMap::new();
    let mut missing = Vec::new();
    for (name, key) in manifest.config_in_order() {
        let value = match stored.get(name).filter(|v| !v.is_null()) {
            Some(v) => Some(v.clone()),
            None => match key
                .env
                .as_deref()
                .and_then(|var| env(var).map(|v| (var, v)))
            {
                Some((var, raw)) if !raw.is_empty() => {
                    Some(from_env(manifest, name, var, raw, key.default.as_ref())?)
                }
                _ => key.default.clone(),
            },
        };
        match value {
            Some(v) => {
                effective.insert(name.to_owned(), v);
            }
            None if key.required => missing.push(name.to_owned()),
            None => {}
        }
    }
    Ok((effective, missing))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    pub(crate) fn manifest(id: &str) -> Manifest {
        manifest::parse(&format!(
            r#"schema = 1
id = "{id}"
name = "N {id}"
version = "1.0.0"
protocol = "EPP/1"
[runtime]
command = ["sh", "./run.sh"]
[config.base_url]
default = "http://x"
[config.api_key]
secret = true
required = true
env = "T_API_KEY"
default = "sk-SECRET-default"
[config.timeout]
default = 30
env = "T_TIMEOUT"
[config.verbose]
default = false
env = "T_VERBOSE"
[config.region]
required = true
"#
        ))
        .unwrap()
    }

    fn record(data: &Path, id: &str, tag: &str) -> Installed {
        let path = providers_dir(data).join(id).join(tag);
        fs::create_dir_all(&path).unwrap();
        fs::write(path.join("f"), tag).unwrap();
        Installed {
            id: id.into(),
            name: format!("N {id}"),
            version: "1.0.0".into(),
            trust: Trust::Local,
            source: Source {
                url: "/src".into(),
                ..Source::default()
            },
            digest: format!("sha256:{}", "0".repeat(64)),
            path,
            installed_at: abx_home::util::rfc3339(0),
            manifest: manifest(id),
        }
    }

    #[test]
    fn upsert_get_remove_round_trip() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        assert!(load(d).is_empty());
        assert!(upsert(d, record(d, "b", "t1")).unwrap().is_none());
        assert!(upsert(d, record(d, "a", "t1")).unwrap().is_none());
        let ids: Vec<String> = load(d).into_iter().map(|r| r.id).collect();
        assert_eq!(ids, vec!["a", "b"]);
        let got = get(d, "a").unwrap();
        // What is stored is the serialized form: the secret default is not kept.
        let expected: Installed =
            serde_json::from_value(serde_json::to_value(record(d, "a", "t1")).unwrap()).unwrap();
        assert_eq!(got, expected);
        assert_eq!(got.manifest.config["api_key"].default, None);
        // The stored JSON keeps `ref` and camelCase, never the secret default.
        let json = fs::read_to_string(registry_path(d)).unwrap();
        assert!(
            json.contains("\"installedAt\"") && !json.contains("SECRET"),
            "{json}"
        );

        // Replacing with a new tree removes the old one.
        let old = get(d, "b").unwrap().path;
        let prev = upsert(d, record(d, "b", "t2")).unwrap().unwrap();
        assert_eq!(prev.path, old);
        assert!(!old.exists());
        assert!(get(d, "b").unwrap().path.ends_with("b/t2"));

        let gone = remove(d, "b").unwrap();
        assert!(!gone.path.exists());
        assert!(!providers_dir(d).join("b").exists());
        assert!(get(d, "b").is_none());
        let e = remove(d, "b").unwrap_err();
        assert_eq!(e.code, ErrorCode::ProviderNotInstalled);
    }

    #[test]
    fn source_serializes_ref() {
        let s = Source {
            url: "https://x".into(),
            subdir: Some("p".into()),
            git_ref: Some("main".into()),
            commit: Some("c".repeat(40)),
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["ref"], "main");
        assert_eq!(v["subdir"], "p");
        assert_eq!(serde_json::from_value::<Source>(v).unwrap(), s);
        assert_eq!(serde_json::to_value(Trust::Unpinned).unwrap(), "unpinned");
    }

    #[test]
    fn a_corrupt_registry_is_never_overwritten() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        fs::create_dir_all(providers_dir(d)).unwrap();
        fs::write(registry_path(d), "{not json").unwrap();
        assert!(load(d).is_empty());
        let e = upsert(d, record(d, "a", "t")).unwrap_err();
        assert_eq!(e.code, ErrorCode::Internal);
        assert_eq!(fs::read_to_string(registry_path(d)).unwrap(), "{not json");
    }

    #[test]
    fn remove_never_leaves_the_providers_dir() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("data");
        let outside = t.path().join("precious");
        fs::create_dir_all(&outside).unwrap();
        let mut r = record(&d, "a", "t");
        r.path = providers_dir(&d).join("a/../../../precious");
        upsert(&d, r).unwrap();
        remove(&d, "a").unwrap();
        assert!(outside.exists());
    }

    #[test]
    fn cleanup_keeps_an_installed_plugins_data() {
        // Regression (found by tests/tests/faults.rs): every daemon start removed the data
        // dir of every plugin, so a plugin's sandboxes did not survive a daemon restart.
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        upsert(d, record(d, "a", "keep")).unwrap();
        let base = providers_dir(d);
        fs::create_dir_all(base.join("a/data/sandboxes")).unwrap();
        fs::write(base.join("a/data/sandboxes/sb-1.json"), "{}").unwrap();
        fs::create_dir_all(base.join("a/tmp")).unwrap();
        fs::create_dir_all(base.join("gone/data")).unwrap();
        let removed = cleanup_orphans(d).unwrap();
        assert!(
            base.join("a/data/sandboxes/sb-1.json").exists(),
            "{removed:?}"
        );
        assert!(base.join("a/tmp").exists(), "{removed:?}");
        assert!(
            !base.join("gone").exists(),
            "an uninstalled plugin's data goes"
        );
    }

    #[test]
    fn cleanup_removes_orphans_only() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        upsert(d, record(d, "a", "keep")).unwrap();
        let base = providers_dir(d);
        // An orphaned tree, read-only like installed ones.
        let orphan = base.join("a/orphan");
        fs::create_dir_all(orphan.join("sub")).unwrap();
        fs::write(orphan.join("sub/f"), "x").unwrap();
        fs::set_permissions(orphan.join("sub"), fs::Permissions::from_mode(0o555)).unwrap();
        fs::set_permissions(&orphan, fs::Permissions::from_mode(0o555)).unwrap();
        let orphan_id = base.join("zz/abc");
        fs::create_dir_all(&orphan_id).unwrap();
        // A crashed install, and a running one.
        let dead = base.join(".staging-dead");
        fs::create_dir_all(dead.join("tree")).unwrap();
        fs::write(base.join(".staging-dead.lock"), "").unwrap();
        let live = new_staging(d).unwrap();
        fs::write(live.dir.join("x"), "").unwrap();
        fs::write(base.join(".installed.json.tmp123"), "partial").unwrap();

        let removed = cleanup_orphans(d).unwrap();
        assert!(removed.contains(&orphan), "{removed:?}");
        assert!(removed.contains(&dead), "{removed:?}");
        assert!(!orphan.exists() && !dead.exists() && !base.join("zz").exists());
        assert!(!base.join(".staging-dead.lock").exists());
        assert!(!base.join(".installed.json.tmp123").exists());
        assert!(base.join("a/keep/f").exists());
        assert!(live.dir.join("x").exists());
        assert_eq!(load(d).len(), 1);
        let live_dir = live.dir.clone();
        drop(live);
        assert!(!live_dir.exists());
    }

    #[test]
    fn config_is_private_and_round_trips() {
        let t = tempfile::tempdir().unwrap();
        let c = t.path();
        assert!(load_config(c, "p").is_empty());
        let mut v = BTreeMap::new();
        v.insert("api_key".to_string(), Value::from("sk-123"));
        v.insert("timeout".to_string(), Value::from(10));
        v.insert("tags".to_string(), serde_json::json!(["a", "b"]));
        v.insert("map".to_string(), serde_json::json!({"k": "v"}));
        v.insert("unset".to_string(), Value::Null);
        store_config(c, "p", &v).unwrap();
        let path = config_path(c, "p");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let back = load_config(c, "p");
        v.remove("unset");
        assert_eq!(back, v);
        // Replacing keeps 0600 and leaves no temp file behind.
        store_config(c, "p", &BTreeMap::new()).unwrap();
        assert!(load_config(c, "p").is_empty());
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(c.join("providers")).unwrap().count(), 1);
        assert!(store_config(c, "../evil", &BTreeMap::new()).is_err());
        // Nulls nested inside values cannot be stored.
        let mut bad = BTreeMap::new();
        bad.insert("x".to_string(), serde_json::json!([null]));
        assert_eq!(
            store_config(c, "p", &bad).unwrap_err().code,
            ErrorCode::ConfigInvalid
        );
        // A broken file is an error for try_load_config and never quotes it.
        fs::write(&path, "api_key = \"sk-LEAK\nx").unwrap();
        let e = try_load_config(c, "p").unwrap_err();
        assert!(!e.to_string().contains("LEAK"), "{e}");
    }

    #[test]
    fn resolution_order_is_stored_env_default() {
        let m = manifest("p");
        let env = |k: &str| match k {
            "T_API_KEY" => Some("sk-from-env".to_string()),
            "T_TIMEOUT" => Some("45".to_string()),
            "T_VERBOSE" => Some("".to_string()),
            _ => None,
        };
        let mut stored = BTreeMap::new();
        stored.insert("base_url".to_string(), Value::from("http://stored"));
        stored.insert("region".to_string(), Value::Null);
        stored.insert("obsolete".to_string(), Value::from(1));
        let (eff, missing) = resolve_config(&m, &stored, env).unwrap();
        assert_eq!(eff["base_url"], "http://stored");
        assert_eq!(eff["api_key"], "sk-from-env");
        assert_eq!(eff["timeout"], 45);
        assert_eq!(eff["verbose"], false); // empty env = unset -> default
        assert!(!eff.contains_key("obsolete"));
        assert_eq!(missing, vec!["region"]);

        // Without env, the default applies (also for secrets: the full manifest has it).
        let (eff, _) = resolve_config(&m, &BTreeMap::new(), |_| None).unwrap();
        assert_eq!(eff["api_key"], "sk-SECRET-default");
        // The manifest as stored (JSON round trip) has no secret default: api_key missing.
        let stored_m: Manifest = serde_json::from_value(serde_json::to_value(&m).unwrap()).unwrap();
        let (_, missing) = resolve_config(&stored_m, &BTreeMap::new(), |_| None).unwrap();
        assert_eq!(missing, vec!["api_key", "region"]);

        let e = resolve_config(&m, &BTreeMap::new(), |k| {
            (k == "T_TIMEOUT").then(|| "sk-not-a-number".to_string())
        })
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::ConfigInvalid);
        assert!(
            e.message.contains("T_TIMEOUT") && !e.message.contains("sk-not"),
            "{e}"
        );
    }

    #[test]
    fn configure_values_are_validated() {
        let m = manifest("p");
        let mut v = BTreeMap::new();
        v.insert("timeout".to_string(), Value::from(5));
        v.insert("api_key".to_string(), Value::from("sk-x"));
        v.insert("region".to_string(), Value::Null);
        validate_values(&m, &v).unwrap();
        v.insert("timeout".to_string(), Value::from("sk-five"));
        let e = validate_values(&m, &v).unwrap_err();
        assert!(
            e.message
                .contains("'timeout' must be a number, not a string"),
            "{e}"
        );
        assert!(!e.message.contains("sk-five"));
        let mut v = BTreeMap::new();
        v.insert("nope".to_string(), Value::from(1));
        let e = validate_values(&m, &v).unwrap_err();
        assert!(e.message.contains("unknown key 'nope'"), "{e}");
    }
}
