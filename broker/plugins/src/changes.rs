//! Change notification on an installed plugin tree, so the integrity check before every call
//! costs a system call instead of a walk of the tree (issue 25).
//!
//! One inotify instance per tree (non-blocking, close-on-exec) watches every directory
//! (entries created, deleted, moved, changed) and every file inode (written, closed after
//! writing, attributes: a chmod, a new hard link's link count). [`Changes::quiet`] drains the
//! queue without blocking and says whether nothing happened since the last look. The events
//! of a write are queued by the kernel before the writing call returns, so a change made
//! before a call is always seen by that call.
//!
//! What inotify cannot see (a write through a shared mapping of a file opened before the
//! watch, a change on another machine of a network file system) is caught by the walk of
//! stat stamps the caller still does when the tree was quiet for longer than
//! [`RESTAMP_EVERY`], and in any case by the launcher, which runs a private copy hashed as
//! it is made: what runs is what was verified.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// How long a quiet tree is trusted without a walk of its stat stamps.
pub const RESTAMP_EVERY: Duration = Duration::from_secs(1);

/// More entries than this and the tree is not watched (the caller walks it every call).
pub const MAX_WATCHES: usize = 4096;

const DIR_MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_CLOSE_WRITE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_DONT_FOLLOW;
const FILE_MASK: u32 = libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_CLOSE_WRITE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_DONT_FOLLOW;

/// An inotify watch over one tree.
pub struct Changes {
    fd: OwnedFd,
}

impl Changes {
    /// Watch every directory and file beneath `root` (symlinks are not followed; an
    /// installed tree holds none). Fails when inotify is unavailable, its limits are reached
    /// or the tree has more than [`MAX_WATCHES`] entries: the caller then walks the tree.
    pub fn watch(root: &Path) -> io::Result<Changes> {
        // SAFETY: inotify_init1 with flags only.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let add = |p: &Path, mask: u32| -> io::Result<()> {
            let c = CString::new(p.as_os_str().as_bytes())
                .map_err(|_| io::Error::other("a NUL in a path"))?;
            // SAFETY: a valid C string and our descriptor.
            if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), mask) } < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        add(root, DIR_MASK)?;
        let mut count = 1;
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir)? {
                let e = e?;
                count += 1;
                if count > MAX_WATCHES {
                    return Err(io::Error::other("too many entries to watch"));
                }
                let t = e.file_type()?;
                if t.is_dir() {
                    add(&e.path(), DIR_MASK)?;
                    stack.push(e.path());
                } else {
                    add(&e.path(), FILE_MASK)?;
                }
            }
        }
        Ok(Changes { fd })
    }

    /// True when nothing changed since the last call (the queue was empty). Anything read,
    /// an overflowed queue or an error counts as a change.
    pub fn quiet(&self) -> bool {
        // Never read back, so never zeroed: zeroing 4 KiB was a tenth of the daemon's
        // instructions on a plugin call (issue 25), since this runs on every one.
        let mut buf = std::mem::MaybeUninit::<[u8; 4096]>::uninit();
        let mut quiet = true;
        loop {
            // SAFETY: the kernel writes at most 4096 bytes into the buffer, which is ours and
            // that long; nothing reads what it wrote.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 4096) };
            if n > 0 {
                quiet = false;
                continue;
            }
            if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) {
                return quiet;
            }
            // EOF or another error: do not trust the tree.
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("lib")).unwrap();
        std::fs::write(d.path().join("provider.py"), b"print(1)\n").unwrap();
        std::fs::write(d.path().join("lib/util.py"), b"x = 1\n").unwrap();
        d
    }

    /// Every way of changing an installed tree an attacker has with plain file calls is seen
    /// by the next look, and reading the tree is not a change.
    #[test]
    fn every_change_to_a_watched_tree_is_seen_by_the_next_look() {
        type Change = fn(&Path);
        let changes: &[(&str, Change)] = &[
            ("write a file", |r| {
                std::fs::write(r.join("lib/util.py"), b"x = 2\n").unwrap()
            }),
            ("append", |r| {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(r.join("provider.py"))
                    .unwrap();
                f.write_all(b"#").unwrap();
            }),
            ("chmod", |r| {
                std::fs::set_permissions(
                    r.join("provider.py"),
                    std::fs::Permissions::from_mode(0o755),
                )
                .unwrap()
            }),
            ("create a file", |r| {
                std::fs::write(r.join("lib/new.py"), b"").unwrap()
            }),
            ("create a .git dir", |r| {
                std::fs::create_dir(r.join(".git")).unwrap()
            }),
            ("remove a file", |r| {
                std::fs::remove_file(r.join("lib/util.py")).unwrap()
            }),
            ("rename in", |r| {
                std::fs::rename(r.join("lib/util.py"), r.join("util.py")).unwrap()
            }),
            ("a hard link elsewhere", |r| {
                let other = r
                    .parent()
                    .unwrap()
                    .join(format!("abx-link-{}", std::process::id()));
                let _ = std::fs::remove_file(&other);
                std::fs::hard_link(r.join("provider.py"), &other).unwrap();
                std::fs::remove_file(&other).unwrap();
            }),
            ("truncate", |r| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(r.join("provider.py"))
                    .unwrap()
                    .set_len(0)
                    .unwrap()
            }),
        ];
        for (what, change) in changes {
            let d = tree();
            let w = Changes::watch(d.path()).unwrap();
            assert!(w.quiet(), "{what}: quiet before");
            let _ = std::fs::read(d.path().join("provider.py")).unwrap();
            let _ = std::fs::read_dir(d.path().join("lib")).unwrap().count();
            assert!(w.quiet(), "{what}: reading is not a change");
            change(d.path());
            assert!(!w.quiet(), "{what}: not seen");
            assert!(w.quiet(), "{what}: seen once, then quiet again");
        }
    }

    #[test]
    fn a_tree_too_big_to_watch_is_refused() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..MAX_WATCHES + 1 {
            std::fs::write(d.path().join(format!("f{i}")), b"").unwrap();
        }
        assert!(Changes::watch(d.path()).is_err());
    }
}
