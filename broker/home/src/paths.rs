//! Where the broker keeps its socket, locks, data, config and logs (DESIGN §10).
//!
//! `ABX_HOME` relocates everything beneath one directory (tests use it); otherwise the XDG
//! variables decide, with a private 0700 per-user directory under the temp dir as the
//! runtime fallback.

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
    /// Held by a client while it starts a daemon, so two clients start one.
    pub spawn_lock: PathBuf,
    /// Persistent state (sandboxes, providers).
    pub data_dir: PathBuf,
    /// Configuration.
    pub config_dir: PathBuf,
    /// Log files.
    pub log_dir: PathBuf,
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
        let runtime_dir = match env_path("XDG_RUNTIME_DIR") {
            Some(d) if d.is_dir() => d.join("abx"),
            _ => std::env::temp_dir().join(format!("abx-{uid}")),
        };
        let data_dir = env_path("XDG_DATA_HOME")
            .unwrap_or_else(|| home.join(".local/share"))
            .join("abx");
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
        Paths {
            socket: runtime_dir.join("broker.sock"),
            daemon_lock: runtime_dir.join("broker.lock"),
            spawn_lock: runtime_dir.join("spawn.lock"),
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

    /// Create every directory, private to this user.
    pub fn ensure(&self) -> io::Result<()> {
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
