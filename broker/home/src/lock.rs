//! Advisory file locks: the daemon's lifetime lock on `broker.lock` (held for its whole
//! life; a second daemon fails on it), the clients' `spawn.lock` (one start at a time) and the
//! plugin registry's lock.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

/// An exclusive advisory lock on a file, released on drop (and by the kernel on death).
pub struct FileLock {
    file: File,
}

impl FileLock {
    fn open(path: &std::path::Path) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
    }

    /// Take the lock, waiting for it.
    pub fn acquire(path: &std::path::Path) -> io::Result<FileLock> {
        let file = Self::open(path)?;
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(FileLock { file })
    }

    /// Take the lock if free; `Ok(None)` when someone holds it.
    pub fn try_acquire(path: &std::path::Path) -> io::Result<Option<FileLock>> {
        let file = Self::open(path)?;
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        Ok(Some(FileLock { file }))
    }

    /// Record our pid and the version we answer `initialize` with in the lock file, one per
    /// line (the daemon does: the pid for `broker status` and E1012, the version so a client
    /// of the same version can skip the `initialize` round trip).
    pub fn write_owner(&mut self, version: &str) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.rewind()?;
        // One write, so a reader sees the whole record or an empty/short file (no match).
        self.file
            .write_all(format!("{}\n{version}\n", std::process::id()).as_bytes())
    }
}

/// The daemon lock file's lines: pid, then version (a file written by an older daemon has
/// the pid only).
fn recorded(paths: &crate::Paths) -> Option<String> {
    let mut s = String::new();
    File::open(&paths.daemon_lock)
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

/// The pid recorded in the daemon lock file, if any.
pub fn recorded_pid(paths: &crate::Paths) -> Option<u32> {
    recorded(paths)?.lines().next()?.trim().parse().ok()
}

/// The version the daemon that wrote the lock file answers `initialize` with, if recorded
/// (complete lines only: a half-written file gives `None`).
pub fn recorded_version(paths: &crate::Paths) -> Option<String> {
    let s = recorded(paths)?;
    let mut lines = s.split_inclusive('\n');
    lines.next()?;
    let v = lines.next()?.strip_suffix('\n')?;
    (!v.is_empty()).then(|| v.to_owned())
}

/// True when a live daemon holds the lock.
pub fn is_locked(paths: &crate::Paths) -> bool {
    matches!(FileLock::try_acquire(&paths.daemon_lock), Ok(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One holder at a time: a second try (another open of the same file, as another
    /// process would do) gets `None` while the first holds it, and the lock once it is dropped.
    #[test]
    fn exclusive_try_acquire_is_none_while_held_and_free_after_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let held = FileLock::acquire(&path).unwrap();
        assert!(FileLock::try_acquire(&path).unwrap().is_none());
        assert!(FileLock::try_acquire(&path).unwrap().is_none());
        drop(held);
        let again = FileLock::try_acquire(&path)
            .unwrap()
            .expect("free after drop");
        assert!(FileLock::try_acquire(&path).unwrap().is_none());
        drop(again);
        assert!(FileLock::try_acquire(&path).unwrap().is_some());
    }

    /// `acquire` waits for the holder and gets the lock once it is released.
    #[test]
    fn acquire_waits_for_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.lock");
        let held = FileLock::acquire(&path).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        let waiter = std::thread::spawn(move || {
            let l = FileLock::acquire(&p).unwrap();
            tx.send(()).unwrap();
            l
        });
        // Still held: the waiter cannot have it.
        assert!(rx.try_recv().is_err());
        assert!(FileLock::try_acquire(&path).unwrap().is_none());
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the waiter got the lock");
        let l = waiter.join().unwrap();
        assert!(FileLock::try_acquire(&path).unwrap().is_none());
        drop(l);
    }

    /// The pid and version written are the ones read back; `is_locked` follows the daemon
    /// lock; a file of an older daemon (pid only) or a half-written one has no version.
    #[test]
    fn write_owner_is_recorded_and_is_locked_follows_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let paths = crate::Paths::under(dir.path());
        std::fs::create_dir_all(&paths.runtime_dir).unwrap();
        assert!(!is_locked(&paths));
        let mut l = FileLock::acquire(&paths.daemon_lock).unwrap();
        l.write_owner("9.9.9-long-version").unwrap();
        l.write_owner("1.2.3").unwrap();
        assert_eq!(recorded_pid(&paths), Some(std::process::id()));
        assert_eq!(recorded_version(&paths).as_deref(), Some("1.2.3"));
        assert!(is_locked(&paths));
        drop(l);
        assert!(!is_locked(&paths));
        // The file (and the pid in it) stays; only the lock goes.
        assert_eq!(recorded_pid(&paths), Some(std::process::id()));
        for (old, pid) in [("42\n", Some(42)), ("42\n1.2", Some(42)), ("", None)] {
            std::fs::write(&paths.daemon_lock, old).unwrap();
            assert_eq!(recorded_pid(&paths), pid, "{old:?}");
            assert_eq!(recorded_version(&paths), None, "{old:?}");
        }
    }
}
