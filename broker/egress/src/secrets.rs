//! The broker's secret store for egress (issue 44, "Credentials that never enter the
//! sandbox"): the values a policy entry's `headers: {NAME: "secret:KEY"}` names, held by the
//! daemon only, in one 0600 file (`<config>/egress-secrets.json`), never shown, logged or put
//! in an error (not even its length). A value lives in memory as a [`Secret`]: its bytes are
//! zeroed when it is dropped.
//!
//! The proxy asks a [`SecretSource`] for a value when a connection needs it (so a value set
//! or removed later applies to the next connection); a value is never copied into the
//! sandbox.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use zeroize::Zeroizing;

/// A secret value: zeroed when dropped, never printed (its `Debug` says `[REDACTED]`).
#[derive(Clone)]
pub struct Secret(Arc<Zeroizing<String>>);

impl Secret {
    /// Wrap `value` (moved: the caller keeps no copy of it).
    pub fn new(value: String) -> Secret {
        Secret(Arc::new(Zeroizing::new(value)))
    }

    /// The value, for the one place it is used: a request head sent to the upstream.
    pub fn expose(&self) -> &str {
        self.0.as_str()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// Where the proxy finds the value of `secret:KEY`.
pub trait SecretSource: Send + Sync {
    /// The value of `key`, if the store has it.
    fn get(&self, key: &str) -> Option<Secret>;
}

/// No secrets at all (a [`crate::Config`] without a store: every header entry is refused at
/// connect time).
pub struct NoSecrets;

impl SecretSource for NoSecrets {
    fn get(&self, _key: &str) -> Option<Secret> {
        None
    }
}

/// At most this many secrets in the store.
pub const MAX_SECRETS: usize = 256;
/// A key is at most this long (letters, digits, `_`, `-`, `.`: what a policy names).
pub const MAX_KEY: usize = 128;
/// A value is at most this many bytes.
pub const MAX_VALUE: usize = 8 * 1024;

/// Whether `key` is a valid secret key (the policy's rule: letters, digits, `_`, `-`, `.`).
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// Why a value cannot be stored; never quotes the value.
pub fn check_value(value: &str) -> Result<(), &'static str> {
    if value.is_empty() {
        return Err("the value is empty");
    }
    if value.len() > MAX_VALUE {
        return Err("the value is longer than 8 KiB");
    }
    // It goes into an HTTP header: visible ASCII, spaces and tabs only.
    if !value
        .bytes()
        .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return Err(
            "the value has characters an HTTP header cannot carry (control characters, line breaks or non-ASCII)",
        );
    }
    Ok(())
}

/// The store: the values in memory, and the file they are kept in (none: memory only).
pub struct SecretStore {
    path: Option<PathBuf>,
    values: RwLock<BTreeMap<String, Secret>>,
}

impl SecretStore {
    /// A store kept in memory only (tests, a broker without a config dir).
    pub fn in_memory() -> SecretStore {
        SecretStore {
            path: None,
            values: RwLock::new(BTreeMap::new()),
        }
    }

    /// The store kept in `path` (read now; a file that is missing is an empty store; one
    /// that cannot be read is logged, without its content, and the store starts empty).
    pub fn open(path: PathBuf) -> SecretStore {
        let mut values = BTreeMap::new();
        match fs::read(&path) {
            Ok(bytes) => {
                let bytes = Zeroizing::new(bytes);
                match serde_json::from_slice::<BTreeMap<String, String>>(&bytes) {
                    Ok(map) => {
                        for (k, v) in map {
                            if valid_key(&k) && check_value(&v).is_ok() {
                                values.insert(k, Secret::new(v));
                            } else {
                                let _ = Zeroizing::new(v);
                                tracing::warn!(key = %k.escape_debug(), path = %path.display(), "egress secrets: skipping an invalid entry");
                            }
                        }
                    }
                    Err(_) => {
                        tracing::warn!(path = %path.display(), "egress secrets: the file is not a JSON object of strings; starting empty")
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "egress secrets: cannot read the file; starting empty")
            }
        }
        SecretStore {
            path: Some(path),
            values: RwLock::new(values),
        }
    }

    /// The keys, sorted (never the values).
    pub fn keys(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// Whether `key` is stored.
    pub fn contains(&self, key: &str) -> bool {
        self.read().contains_key(key)
    }

    /// Store `value` under `key` (replacing one), written to the file before it is answered.
    /// The caller checks the key and value ([`valid_key`], [`check_value`]).
    pub fn set(&self, key: &str, value: String) -> io::Result<()> {
        let mut g = self.values.write().unwrap_or_else(|e| e.into_inner());
        if !g.contains_key(key) && g.len() >= MAX_SECRETS {
            return Err(io::Error::other(format!(
                "the store holds {MAX_SECRETS} secrets already"
            )));
        }
        let old = g.insert(key.to_owned(), Secret::new(value));
        if let Err(e) = self.persist(&g) {
            match old {
                Some(o) => g.insert(key.to_owned(), o),
                None => g.remove(key),
            };
            return Err(e);
        }
        Ok(())
    }

    /// Remove `key`; whether it was there.
    pub fn remove(&self, key: &str) -> io::Result<bool> {
        let mut g = self.values.write().unwrap_or_else(|e| e.into_inner());
        let Some(old) = g.remove(key) else {
            return Ok(false);
        };
        if let Err(e) = self.persist(&g) {
            g.insert(key.to_owned(), old);
            return Err(e);
        }
        Ok(true)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Secret>> {
        self.values.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Write the map to a new 0600 file, fsynced, renamed over the old one.
    fn persist(&self, map: &BTreeMap<String, Secret>) -> io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        let plain: BTreeMap<&str, &str> =
            map.iter().map(|(k, v)| (k.as_str(), v.expose())).collect();
        let text = Zeroizing::new(serde_json::to_vec(&plain).map_err(io::Error::other)?);
        drop(plain);
        static N: AtomicU64 = AtomicU64::new(0);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("secrets");
        let tmp = dir.join(format!(
            ".{name}.tmp{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> io::Result<()> {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            // The mode of a new file is masked by the umask: 0600 or less, never more.
            f.set_permissions(fs::Permissions::from_mode(0o600))?;
            f.write_all(&text)?;
            f.sync_all()?;
            fs::rename(&tmp, path)
        };
        write().inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
    }
}

impl std::fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretStore")
            .field("path", &self.path)
            .field("keys", &self.keys())
            .finish()
    }
}

impl SecretSource for SecretStore {
    fn get(&self, key: &str) -> Option<Secret> {
        self.read().get(key).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_values_in_a_0600_file_and_never_shows_them() {
        let dir = std::env::temp_dir().join(format!("abx-egress-secrets-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let path = dir.join("config").join("egress-secrets.json");
        let s = SecretStore::open(path.clone());
        assert!(s.keys().is_empty());
        s.set("api_token", "Bearer-s3cr3t-VALUE".into()).unwrap();
        s.set("other", "x".into()).unwrap();
        assert_eq!(s.keys(), ["api_token", "other"]);
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(format!("{:?}", s.get("api_token").unwrap()), "[REDACTED]");
        // Read again from the file.
        let again = SecretStore::open(path.clone());
        assert_eq!(
            again.get("api_token").unwrap().expose(),
            "Bearer-s3cr3t-VALUE"
        );
        assert!(again.remove("other").unwrap());
        assert!(!again.remove("other").unwrap());
        assert_eq!(SecretStore::open(path).keys(), ["api_token"]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn keys_and_values_are_checked() {
        assert!(valid_key("api_token.v2-x"));
        assert!(!valid_key("") && !valid_key("a b") && !valid_key(&"k".repeat(129)));
        assert!(check_value("Bearer abc").is_ok());
        for bad in ["", "a\r\nX-Evil: 1", "caf\u{e9}", "a\0b"] {
            let e = check_value(bad).unwrap_err();
            assert!(bad.is_empty() || !e.contains(bad));
        }
        assert!(check_value(&"a".repeat(MAX_VALUE + 1)).is_err());
    }
}
