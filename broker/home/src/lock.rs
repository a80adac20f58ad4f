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

    /// Record our pid in the lock file (the daemon does, for `broker status` and E1012).
    pub fn write_pid(&mut self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.rewind()?;
        writeln!(self.file, "{}", std::process::id())
    }
}

/// The pid recorded in the daemon lock file, if any.
pub fn recorded_pid(paths: &crate::Paths) -> Option<u32> {
    let mut s = String::new();
    File::open(&paths.daemon_lock)
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    s.trim().parse().ok()
}

/// True when a live daemon holds the lock.
pub fn is_locked(paths: &crate::Paths) -> bool {
    matches!(FileLock::try_acquire(&paths.daemon_lock), Ok(None))
}
