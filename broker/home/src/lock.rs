//! Advisory file locks: the daemon's lifetime lock on `broker.lock` (held for its whole
//! life; a second daemon fails on it), the clients' `spawn.lock` (one start at a time) and the
//! plugin registry's lock.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

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

    /// Take the lock if it is free or becomes free within `patience` (a client's probe
    /// ([`is_locked`]) holds it for a moment: the daemon must not lose its start to one);
    /// `Ok(None)` when someone holds it all that time.
    pub fn acquire_within(
        path: &std::path::Path,
        patience: std::time::Duration,
    ) -> io::Result<Option<FileLock>> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            if let Some(l) = Self::try_acquire(path)? {
                return Ok(Some(l));
            }
            if std::time::Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
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

    /// Record our pid, the version we answer `initialize` with, our socket and our data dir
    /// in the lock file, one per line (the daemon does, in its runtime `broker.lock` and in
    /// `data/broker.lock`: the pid for `broker status` and E1012, the version so a client of
    /// the same version can skip the `initialize` round trip, the socket so a client in
    /// another context finds this daemon, the data dir so a client uses a socket only when
    /// its daemon serves the client's own data).
    pub fn write_owner(&mut self, version: &str, socket: &Path, data_dir: &Path) -> io::Result<()> {
        let mut text = format!("{}\n{version}\n", std::process::id()).into_bytes();
        for p in [socket, data_dir] {
            let b = p.as_os_str().as_bytes();
            if b.contains(&b'\n') {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} has a newline in its name", p.display()),
                ));
            }
            text.extend_from_slice(b);
            text.push(b'\n');
        }
        self.file.set_len(0)?;
        self.file.rewind()?;
        // One write, so a reader sees the whole record or an empty/short file (no match).
        self.file.write_all(&text)
    }
}

/// What a daemon recorded in a lock file ([`FileLock::write_owner`]); complete lines only
/// (a half-written file gives fewer fields). A file of an older daemon has the pid, or the
/// pid and version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// The daemon's pid.
    pub pid: Option<u32>,
    /// The version it answers `initialize` with.
    pub version: Option<String>,
    /// The socket it listens on.
    pub socket: Option<PathBuf>,
    /// The data directory it serves.
    pub data_dir: Option<PathBuf>,
}

impl Record {
    /// Read a lock file's record (`None`: no file, or nothing in it). At most 16 KiB are read.
    pub fn read(path: &Path) -> Option<Record> {
        let mut buf = Vec::new();
        File::open(path)
            .ok()?
            .take(16 << 10)
            .read_to_end(&mut buf)
            .ok()?;
        let mut lines = buf.split_inclusive(|b| *b == b'\n').map_while(|l| {
            l.strip_suffix(b"\n")
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec)
        });
        let pid = lines
            .next()
            .and_then(|l| String::from_utf8(l).ok()?.trim().parse().ok());
        // An older daemon's pid-only file had no newline after the pid.
        let pid = pid.or_else(|| {
            std::str::from_utf8(&buf)
                .ok()
                .filter(|s| !s.contains('\n'))
                .and_then(|s| s.trim().parse().ok())
        });
        let version = lines.next().and_then(|l| String::from_utf8(l).ok());
        let mut path = || lines.next().map(|l| PathBuf::from(OsString::from_vec(l)));
        let (socket, data_dir) = (path(), path());
        (pid.is_some()).then_some(Record {
            pid,
            version,
            socket,
            data_dir,
        })
    }

    /// Whether the daemon that wrote this serves `data_dir` (a record without a data dir, of
    /// an older daemon, is taken as serving it: its version differs, so it is replaced).
    pub fn serves(&self, data_dir: &Path) -> bool {
        self.data_dir.as_deref().is_none_or(|d| d == data_dir)
    }
}

fn recorded(paths: &crate::Paths) -> Option<Record> {
    Record::read(&paths.daemon_lock)
}

/// The pid recorded in the daemon lock file, if any.
pub fn recorded_pid(paths: &crate::Paths) -> Option<u32> {
    recorded(paths)?.pid
}

/// The version the daemon that wrote the lock file answers `initialize` with, if recorded
/// (complete lines only: a half-written file gives `None`).
pub fn recorded_version(paths: &crate::Paths) -> Option<String> {
    recorded(paths)?.version
}

/// True when a live daemon holds the lock of the runtime dir or of the data dir (a probe:
/// it takes a free lock for a moment, which a starting daemon waits out, see
/// [`FileLock::acquire_within`]).
pub fn is_locked(paths: &crate::Paths) -> bool {
    [&paths.daemon_lock, &paths.data_lock]
        .iter()
        .any(|p| p.exists() && matches!(FileLock::try_acquire(p), Ok(None)))
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
        let (sock, data) = (
            Path::new("/r/abx/broker.sock"),
            Path::new("/h/.local/share/abx"),
        );
        l.write_owner("9.9.9-long-version", Path::new("/a/long/socket/path"), data)
            .unwrap();
        l.write_owner("1.2.3", sock, data).unwrap();
        assert_eq!(recorded_pid(&paths), Some(std::process::id()));
        assert_eq!(recorded_version(&paths).as_deref(), Some("1.2.3"));
        let r = Record::read(&paths.daemon_lock).unwrap();
        assert_eq!(r.socket.as_deref(), Some(sock));
        assert!(r.serves(data) && !r.serves(Path::new("/other/abx")));
        assert!(l.write_owner("1", Path::new("/x\ny"), data).is_err());
        assert!(is_locked(&paths));
        drop(l);
        assert!(!is_locked(&paths));
        // The file (and the pid in it) stays; only the lock goes.
        assert_eq!(recorded_pid(&paths), Some(std::process::id()));
        for (old, pid) in [
            ("42\n", Some(42)),
            ("42", Some(42)),
            ("42\n1.2", Some(42)),
            ("", None),
        ] {
            std::fs::write(&paths.daemon_lock, old).unwrap();
            assert_eq!(recorded_pid(&paths), pid, "{old:?}");
            assert_eq!(recorded_version(&paths), None, "{old:?}");
            // An older daemon's record (no data dir) is taken as serving any.
            if let Some(r) = Record::read(&paths.daemon_lock) {
                assert!(r.serves(Path::new("/any")) && r.socket.is_none());
            }
        }
        // A half-written record: the socket line is cut, so neither path counts.
        std::fs::write(&paths.daemon_lock, "42\n1.2\n/run/abx/bro").unwrap();
        let r = Record::read(&paths.daemon_lock).unwrap();
        assert_eq!((r.version.as_deref(), r.socket), (Some("1.2"), None));
    }
}
