//! `templates/build`: a sandbox's overlay upper dir read as an OCI layer, without ever
//! reading the sandbox's files by path while it runs.
//!
//! The upper dir is the sandbox's to change while it runs: a process of it can swap any
//! directory for a symlink to the user's `~/.ssh` (`renameat2(RENAME_EXCHANGE)` in a loop),
//! and a walk by path follows it on the host. Two defences, each enough on its own:
//! - its processes are stopped meanwhile: the cgroup freezer where there is one (the caller),
//!   else [`stop_processes`]: `SIGSTOP` (through pidfds, checked to be of the sandbox's PID
//!   namespace) to every process of its namespace but its init, again to any that runs or
//!   appears, until two scans in a row find all of them stopped (a stopped process can resume
//!   none); they are resumed once the layer is read, but those that were stopped before;
//! - the walk goes through descriptors only ([`write_layer`]): each directory is opened from
//!   its parent's descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_XDEV)` and `O_NOFOLLOW | O_DIRECTORY`, symlinks are read with `readlinkat`
//!   (never followed), files are opened `O_NOFOLLOW | O_NONBLOCK` and kept only when `fstat`
//!   says they are regular; what a header says comes from the descriptor's `fstat`. An entry
//!   that changed kind under the walk is left out. A process that escaped the stop can tear
//!   the layer, not lead the walk out of it.
//!
//! The walk holds one descriptor and one position per level (one `getdents64` buffer in
//! all), counts entries and bytes against the store's caps (past them: E8012), and refuses a
//! path longer than `PATH_MAX` (a layer could not be applied with it).

use super::unpack::{
    fstat, lstat_at, openat2, Budget, Dents, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS, RESOLVE_NO_XDEV,
};
use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long [`stop_processes`] tries before the walk goes on anyway (safe through
/// descriptors, possibly torn).
pub const STOP_WAIT: Duration = Duration::from_secs(5);

/// The mount points the sandbox's init makes in an image root: not part of a saved layer
/// when they are empty.
const MOUNT_POINTS: &[&[u8]] = &[b"workspace", b"tmp", b"dev", b"proc"];

/// The longest path a layer entry may have.
const PATH_MAX: usize = 4095;

/// The processes [`stop_processes`] stopped: resumed (`SIGCONT`) when this is dropped.
pub struct Stopped {
    pidfds: Vec<OwnedFd>,
}

impl Stopped {
    /// How many processes are held stopped.
    pub fn count(&self) -> usize {
        self.pidfds.len()
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for fd in &self.pidfds {
            pidfd_signal(fd.as_raw_fd(), libc::SIGCONT);
        }
    }
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) has no memory arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a fresh descriptor.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal`: false when the process is gone.
fn pidfd_signal(fd: RawFd, sig: i32) -> bool {
    // SAFETY: pidfd_send_signal(2) on our descriptor, no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd,
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// Whether every thread of `pid` is stopped (or dead, or gone).
fn all_stopped(pid: i32) -> bool {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    rd.flatten().all(|t| {
        let Ok(stat) = std::fs::read(t.path().join("stat")) else {
            return true;
        };
        // "tid (comm) S ...": the state follows the last ')'.
        let state = stat
            .iter()
            .rposition(|&b| b == b')')
            .and_then(|i| stat.get(i + 2).copied());
        matches!(state, Some(b'T' | b't' | b'Z' | b'X') | None)
    })
}

/// Stop every process of the PID namespace `pidns` (its init excepted) with `SIGSTOP`, until
/// two scans in a row find all of them stopped and none new, or `wait` has passed.
pub fn stop_processes(pidns: u64, wait: Duration) -> Stopped {
    let t0 = Instant::now();
    // host pid -> (its pidfd, whether we stopped it)
    let mut known: HashMap<i32, (OwnedFd, bool)> = HashMap::new();
    let mut calm = 0;
    loop {
        let mut quiet = true;
        for (pid, _) in crate::container::members_of(pidns) {
            if let std::collections::hash_map::Entry::Vacant(slot) = known.entry(pid) {
                let Some(fd) = pidfd_open(pid) else {
                    continue;
                };
                // The pidfd names the process; only then is its namespace checked (a pid
                // reused by a host process in between fails here).
                if crate::container::ns_inode(pid, "pid") != Some(pidns) {
                    continue;
                }
                quiet = false;
                slot.insert((fd, false));
            }
            if !all_stopped(pid) {
                quiet = false;
                let e = known.get_mut(&pid).expect("known");
                if pidfd_signal(e.0.as_raw_fd(), libc::SIGSTOP) {
                    e.1 = true;
                } else {
                    // Gone: its pid may be another process of the sandbox next time.
                    known.remove(&pid);
                }
            }
        }
        if quiet {
            calm += 1;
            if calm >= 2 {
                break;
            }
        } else {
            calm = 0;
        }
        if t0.elapsed() > wait {
            tracing::warn!(
                processes = known.len(),
                "templates/build: the sandbox's processes did not all stop; its layer is read through descriptors anyway"
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    tracing::debug!(
        stopped = known.values().filter(|e| e.1).count(),
        us = t0.elapsed().as_micros(),
        "templates/build: sandbox processes stopped"
    );
    Stopped {
        pidfds: known
            .into_values()
            .filter_map(|(fd, ours)| ours.then_some(fd))
            .collect(),
    }
}

/// A file's data, exactly `left` bytes: zeros where it shrank under the walk, never more.
struct Exact<R> {
    r: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = match self.r.read(&mut buf[..want])? {
            0 => {
                buf[..want].fill(0);
                want
            }
            n => n,
        };
        self.left -= n as u64;
        Ok(n)
    }
}

fn beneath(dir: RawFd, name: &CStr, flags: i32) -> io::Result<OwnedFd> {
    openat2(
        dir,
        Path::new(OsStr::from_bytes(name.to_bytes())),
        flags | libc::O_NOFOLLOW,
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
    )
}

fn readlink_at(dir: RawFd, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; PATH_MAX + 1];
    // SAFETY: readlinkat into our buffer.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn is_opaque(fd: RawFd) -> bool {
    [c"user.overlay.opaque", c"trusted.overlay.opaque"]
        .iter()
        .any(|name| {
            let mut v = [0u8; 4];
            // SAFETY: fgetxattr into a local buffer.
            let n = unsafe { libc::fgetxattr(fd, name.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
            n >= 1 && v[0] == b'y'
        })
}

fn is_empty_dir(fd: RawFd, dents: &mut Dents) -> io::Result<bool> {
    dents.forget();
    let empty = dents.next(fd, usize::MAX, 0)?.is_none();
    dents.forget();
    Ok(empty)
}

fn header(st: &libc::stat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(kind);
    h.set_size(size);
    h
}

/// One directory of the walk.
struct Frame {
    fd: OwnedFd,
    pos: i64,
    plen: usize,
}

/// Append the overlay upper dir `upper` to a layer, through descriptors only (see the
/// module's header): a 0:0 character device is a whiteout, `user.overlay.opaque` (or
/// `trusted.`) marks an opaque directory. Entries and bytes are taken from `budget`.
pub fn write_layer<W: Write>(
    b: &mut tar::Builder<W>,
    upper: &Path,
    budget: &mut Budget,
) -> io::Result<()> {
    let top = openat2(
        libc::AT_FDCWD,
        upper,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        RESOLVE_NO_MAGICLINKS,
    )?;
    let mut path: Vec<u8> = Vec::new();
    let mut stack = vec![Frame {
        fd: top,
        pos: 0,
        plen: 0,
    }];
    let mut dents = Dents::default();
    let mut skipped = 0u64;
    while let Some(depth) = stack.len().checked_sub(1) {
        let dfd = stack[depth].fd.as_raw_fd();
        let from = stack[depth].pos;
        let Some((name, next)) = dents
            .next(dfd, depth, from)?
            .map(|d| (d.name.to_owned(), d.next))
        else {
            let f = stack.pop().expect("a frame");
            path.truncate(f.plen);
            dents.forget();
            continue;
        };
        stack[depth].pos = next;
        let plen = path.len();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name.to_bytes());
        if path.len() > PATH_MAX {
            return Err(io::Error::other(format!(
                "a path in the sandbox's layer is longer than {PATH_MAX} bytes"
            )));
        }
        let Ok(st) = lstat_at(dfd, &name) else {
            path.truncate(plen);
            continue;
        };
        let rel = Path::new(OsStr::from_bytes(&path));
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                let Ok(sub) = beneath(dfd, &name, libc::O_RDONLY | libc::O_DIRECTORY) else {
                    // Not a directory any more: left out.
                    skipped += 1;
                    path.truncate(plen);
                    continue;
                };
                let st = fstat(sub.as_raw_fd())?;
                if depth == 0
                    && MOUNT_POINTS.contains(&name.to_bytes())
                    && is_empty_dir(sub.as_raw_fd(), &mut dents)?
                {
                    path.truncate(plen);
                    continue;
                }
                budget.take(0)?;
                let mut h = header(&st, tar::EntryType::Directory, 0);
                b.append_data(&mut h, rel, io::empty())?;
                if is_opaque(sub.as_raw_fd()) {
                    budget.take(0)?;
                    let mut oh = header(&st, tar::EntryType::Regular, 0);
                    oh.set_mode(0o644);
                    b.append_data(&mut oh, rel.join(".wh..wh..opq"), io::empty())?;
                }
                dents.forget();
                stack.push(Frame {
                    fd: sub,
                    pos: 0,
                    plen,
                });
                continue;
            }
            libc::S_IFLNK => match readlink_at(dfd, &name) {
                Ok(target) => {
                    budget.take(0)?;
                    let mut h = header(&st, tar::EntryType::Symlink, 0);
                    b.append_link(&mut h, rel, Path::new(OsStr::from_bytes(&target)))?;
                }
                Err(_) => skipped += 1,
            },
            libc::S_IFREG => {
                let file = beneath(dfd, &name, libc::O_RDONLY | libc::O_NONBLOCK)
                    .and_then(|fd| Ok((fstat(fd.as_raw_fd())?, fd)));
                match file {
                    Ok((st, fd)) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {
                        let size = st.st_size.max(0) as u64;
                        budget.take(size)?;
                        let mut h = header(&st, tar::EntryType::Regular, size);
                        let r = Exact {
                            r: std::fs::File::from(fd),
                            left: size,
                        };
                        b.append_data(&mut h, rel, r)?;
                    }
                    _ => skipped += 1,
                }
            }
            libc::S_IFCHR if st.st_rdev == 0 => {
                // An overlay whiteout.
                budget.take(0)?;
                let mut wh = Vec::with_capacity(path.len() + 4);
                wh.extend_from_slice(&path[..plen]);
                if plen > 0 {
                    wh.push(b'/');
                }
                wh.extend_from_slice(b".wh.");
                wh.extend_from_slice(name.to_bytes());
                let mut h = header(&st, tar::EntryType::Regular, 0);
                h.set_mode(0o644);
                b.append_data(&mut h, Path::new(OsStr::from_bytes(&wh)), io::empty())?;
            }
            // Sockets, fifos, devices: not part of an image.
            _ => skipped += 1,
        }
        path.truncate(plen);
    }
    if skipped > 0 {
        tracing::debug!(skipped, "templates/build: entries left out of the layer");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(layer: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>)> {
        let mut ar = tar::Archive::new(layer);
        ar.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let p = e.path().unwrap().display().to_string();
                let t = e.header().entry_type();
                let mut d = Vec::new();
                e.read_to_end(&mut d).unwrap();
                (p, t, d)
            })
            .collect()
    }

    #[test]
    fn the_layer_is_read_through_descriptors_and_never_follows_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        let up = t.path().join("upper");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(up.join("srv/a/b")).unwrap();
        std::fs::create_dir_all(up.join("tmp")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "SECRET").unwrap();
        std::fs::write(up.join("srv/a/b/f"), "data").unwrap();
        std::os::unix::fs::symlink(&outside, up.join("srv/link")).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut budget = Budget::unlimited();
        write_layer(&mut b, &up, &mut budget).unwrap();
        let layer = b.into_inner().unwrap();
        let e = entries(&layer);
        let names: Vec<&str> = e.iter().map(|x| x.0.as_str()).collect();
        assert!(
            names.contains(&"srv/a/b/f") && names.contains(&"srv/link"),
            "{names:?}"
        );
        assert!(
            !names.iter().any(|n| n.starts_with("tmp")),
            "empty mount point kept"
        );
        assert!(!layer.windows(6).any(|w| w == b"SECRET"));
        let f = e.iter().find(|x| x.0 == "srv/a/b/f").unwrap();
        assert_eq!(f.2, b"data");
        // The caps hold.
        let mut b = tar::Builder::new(Vec::new());
        let mut small = Budget {
            bytes: 3,
            entries: 100,
        };
        let err = write_layer(&mut b, &up, &mut small).unwrap_err();
        assert!(super::super::unpack::is_over_budget(&err), "{err}");
    }

    #[test]
    fn a_file_that_shrinks_is_padded_and_one_that_grows_is_cut() {
        let mut r = Exact {
            r: &b"ab"[..],
            left: 4,
        };
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        assert_eq!(v, b"ab\0\0");
        let mut r = Exact {
            r: &b"abcdef"[..],
            left: 4,
        };
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        assert_eq!(v, b"abcd");
    }

    #[test]
    fn stopping_a_namespace_with_no_process_returns_at_once() {
        let s = stop_processes(1, Duration::from_secs(1));
        assert_eq!(s.count(), 0);
    }
}
