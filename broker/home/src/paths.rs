//! Where the broker keeps its socket, locks, data, config and logs (docs/design.md#daemon).
//!
//! `ABX_HOME` relocates everything beneath one directory (tests use it); otherwise the XDG
//! variables decide. Without `XDG_RUNTIME_DIR` the socket goes to a private 0700 directory
//! per data directory under the temp dir: `$TMPDIR/abx-<uid>/<key>/broker.sock`, where
//! `<key>` is [`data_key`] of the data directory, so two HOMEs of one user never meet there
//! and one parent (`abx-<uid>`) holds every such directory of the user.
//!
//! One daemon serves one data directory: it holds `data/broker.lock` for its whole life and
//! records there (as in its runtime `broker.lock`) its pid, version, socket and data dir
//! ([`crate::lock::Record`]), so a client in another context (no `XDG_RUNTIME_DIR`, an MCP
//! host that passes only `HOME`) finds the same daemon.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// All filesystem locations of one user's broker.
#[derive(Clone, Debug)]
pub struct Paths {
    /// Holds the socket and the locks (0700).
    pub runtime_dir: PathBuf,
    /// `broker.sock` (0600).
    pub socket: PathBuf,
    /// Held (flock) by the live daemon for its whole life; holds its pid.
    pub daemon_lock: PathBuf,
    /// Held by a client while it starts a daemon, so two clients start one (in the data dir:
    /// clients of one data dir in any context queue on it).
    pub spawn_lock: PathBuf,
    /// Held (flock) by the daemon serving the data dir for its whole life; records its pid,
    /// version, socket and data dir (the same record as `daemon_lock`).
    pub data_lock: PathBuf,
    /// Persistent state (sandboxes, providers).
    pub data_dir: PathBuf,
    /// Configuration.
    pub config_dir: PathBuf,
    /// Log files.
    pub log_dir: PathBuf,
    /// Where any daemon of this user may have its socket, whatever its data dir: the temp
    /// fallback's per-user parent, `$XDG_RUNTIME_DIR/abx` and `/run/user/<uid>/abx` (hidden
    /// from plugins, see `abx_plugins::launch`).
    pub user_runtime_dirs: Vec<PathBuf>,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl Paths {
    /// Resolve from `ABX_HOME`, else XDG, else defaults.
    pub fn from_env() -> Paths {
        if let Some(home) = env_path("ABX_HOME") {
            return Paths::under(&home);
        }
        let uid = unsafe { libc::geteuid() };
        let home = env_path("HOME").unwrap_or_else(|| PathBuf::from("/"));
        let data_dir = env_path("XDG_DATA_HOME")
            .unwrap_or_else(|| home.join(".local/share"))
            .join("abx");
        let runtime_dir = match env_path("XDG_RUNTIME_DIR") {
            Some(d) if d.is_dir() => d.join("abx"),
            _ => temp_runtime_parent(uid).join(data_key(&data_dir)),
        };
        let config_dir = env_path("XDG_CONFIG_HOME")
            .unwrap_or_else(|| home.join(".config"))
            .join("abx");
        Paths::assemble(runtime_dir, data_dir, config_dir)
    }

    /// Everything beneath one directory (what `ABX_HOME` does).
    pub fn under(home: &Path) -> Paths {
        Paths::assemble(home.join("run"), home.join("data"), home.join("config"))
    }

    fn assemble(runtime_dir: PathBuf, data_dir: PathBuf, config_dir: PathBuf) -> Paths {
        let uid = unsafe { libc::geteuid() };
        let mut user_runtime_dirs = vec![temp_runtime_parent(uid)];
        if let Some(d) = env_path("XDG_RUNTIME_DIR") {
            user_runtime_dirs.push(d.join("abx"));
        }
        user_runtime_dirs.push(PathBuf::from(format!("/run/user/{uid}/abx")));
        user_runtime_dirs.dedup();
        Paths {
            user_runtime_dirs,
            socket: runtime_dir.join("broker.sock"),
            daemon_lock: runtime_dir.join("broker.lock"),
            spawn_lock: data_dir.join("spawn.lock"),
            data_lock: data_dir.join("broker.lock"),
            log_dir: data_dir.join("logs"),
            runtime_dir,
            data_dir,
            config_dir,
        }
    }

    /// The daemon's log file.
    pub fn log_file(&self) -> PathBuf {
        self.log_dir.join("broker.log")
    }

    /// Create every directory, private to this user (the temp fallback's per-user parent
    /// too).
    pub fn ensure(&self) -> io::Result<()> {
        if let Some(parent) = self.runtime_dir.parent() {
            if parent == temp_runtime_parent(unsafe { libc::geteuid() }) {
                ensure_private_dir(parent)?;
            }
        }
        for d in [
            &self.runtime_dir,
            &self.data_dir,
            &self.config_dir,
            &self.log_dir,
        ] {
            ensure_private_dir(d)?;
        }
        Ok(())
    }
}

/// The per-user parent of the temp-dir fallback runtime dirs: `$TMPDIR/abx-<uid>` (0700).
pub fn temp_runtime_parent(uid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("abx-{uid}"))
}

/// A file whose presence tells every daemon of this user to check each peer's ancestry for
/// the marks of plugin launchers and sandbox processes of any daemon (not only its own): a
/// daemon that runs sandboxes of a weaker model than namespaces, and a plugin launcher
/// without namespaces, raise it before anything of theirs runs (those processes share the
/// daemons' PID namespace, so that rule alone does not refuse them). Never lowered: a stale
/// flag costs an ancestry walk per connection, no more. It sits in the per-user temp parent
/// (0700), where neither a Landlock-confined sandbox nor a plugin can write.
pub fn ancestry_flag() -> PathBuf {
    temp_runtime_parent(unsafe { libc::geteuid() }).join("check-peer-ancestry")
}

/// Raise [`ancestry_flag`].
pub fn raise_ancestry_flag() -> io::Result<()> {
    let flag = ancestry_flag();
    if flag.exists() {
        return Ok(());
    }
    if let Some(parent) = flag.parent() {
        ensure_private_dir(parent)?;
    }
    fs::write(&flag, b"")
}

/// The key of a data directory in the temp-dir fallback: the first 16 hex digits of the
/// SHA-256 of its path as given (no resolution: the SDKs compute the same from their
/// environment).
pub fn data_key(data_dir: &Path) -> String {
    use sha2::Digest;
    use std::fmt::Write as _;
    use std::os::unix::ffi::OsStrExt;
    let d = sha2::Sha256::digest(data_dir.as_os_str().as_bytes());
    d[..8].iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Create `dir` (and parents) and make it 0700; refuse a directory another user owns.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let uid = unsafe { libc::geteuid() };
    if meta.uid() != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to this user ({uid})",
                dir.display(),
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key the SDKs compute too (extensions/sdk/*: the same SHA-256 prefix).
    #[test]
    fn data_key_is_the_sha256_prefix_of_the_path() {
        assert_eq!(data_key(Path::new("/root/.local/share/abx")).len(), 16);
        // printf %s /home/u/.local/share/abx | sha256sum | cut -c1-16
        assert_eq!(
            data_key(Path::new("/home/u/.local/share/abx")),
            "5d30585de145e544"
        );
        assert_ne!(data_key(Path::new("/a/abx")), data_key(Path::new("/b/abx")));
    }
}
