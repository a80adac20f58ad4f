//! What a sandbox changed under an overlay mount, and bringing it to the host or dropping it
//! (`sandbox/diff`, `sandbox/apply`, `sandbox/discard`; issue 43, docs/local-sandboxes.md
//! "Reviewing and applying changes", docs/threat-model.md).
//!
//! The engine works on two plain directories: the overlay's **upper** dir (what the sandbox
//! wrote: `data/local/sandboxes/<id>/mounts/<n>/upper`) and the **lower** dir (the host source
//! the overlay reads through). It never needs the sandbox running, and every function is
//! synchronous (the provider runs it on a blocking thread).
//!
//! - Only the upper dir is walked, so the cost grows with what the sandbox changed, not with
//!   the size of the tree. Each upper entry is compared with the lower entry of the same name:
//!   a 0/0 character device (or an entry with `user.overlay.whiteout`) over an existing lower
//!   entry is `deleted` (over nothing, no change); a directory marked `user.overlay.opaque=y`
//!   hides the lower entries of its tree, which are then `deleted` where the upper has none; an
//!   upper file equal to the lower one in content and permission bits is no change (overlayfs
//!   copies up on open for writing, and after an apply the host equals the upper).
//! - Every directory is opened by descriptor, name by name, with `O_NOFOLLOW`: no symlink is
//!   ever followed in either layer. Names are checked (at most 255 bytes, no `/`), the walk
//!   stops at [`MAX_DEPTH`] levels and [`MAX_ENTRIES`] changes (`truncated`), file contents are
//!   compared with two 64 KiB buffers, and a patch reads at most [`MAX_PATCH_INPUT`] per side.
//! - Apply writes beneath the source directory only: every host path is opened from the
//!   source's descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, a file is
//!   written to a temporary file in its directory, synced, given the source owner's uid/gid and
//!   its permission bits without setuid/setgid/sticky, and renamed over the old entry (so a
//!   host file is never opened for writing, and a hard link to a file outside the tree is
//!   replaced, never written through).

use crate::files::sys::{pread_full, write_all, Dir};
use abx_protocol::api::{ApplyResult, Change, ChangeKind, DiscardResult, PathReason};
use abx_protocol::{AbxError, ErrorCode};
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The most changes one call lists, applies or discards (`truncated` beyond; ask again with
/// `paths`, or apply again: applied paths leave the diff).
pub const MAX_ENTRIES: usize = 100_000;
/// How deep the walk goes in the upper dir (deeper changes are left out, `truncated`).
pub const MAX_DEPTH: usize = 256;
/// The first bytes of a file that say whether it is binary.
pub const BINARY_SNIFF: usize = 8 * 1024;
/// A patch is cut at this size.
pub const MAX_PATCH: usize = 1024 * 1024;
/// A patch is made only when each side is at most this large...
pub const MAX_PATCH_INPUT: u64 = 8 * 1024 * 1024;
/// ... and has at most this many lines.
pub const MAX_PATCH_LINES: usize = 200_000;
/// The patches of one answer add up to at most this much; later entries get a note instead.
pub const MAX_PATCH_TOTAL: usize = 16 * 1024 * 1024;
/// The most paths `applied.json` remembers (the oldest go first).
pub const MAX_APPLIED: usize = 100_000;
/// The longest symlink target read.
const MAX_LINK: usize = 4096;
/// The buffer of each side of a comparison or a copy.
const BUF: usize = 64 * 1024;
/// The work a patch's line diff may do (snake steps) before it gives up on finding the
/// shortest edit and shows the rest of the range as replaced.
const DIFF_BUDGET: u64 = 50_000_000;

/// What the engine needs to know of one overlay mount.
#[derive(Clone, Debug)]
pub struct Layers {
    /// The overlay's upper dir (`mounts/<n>/upper`).
    pub upper: PathBuf,
    /// The host source directory (the lower layer), as resolved at create.
    pub source: PathBuf,
    /// The source's device and inode recorded at create: apply refuses a source that is now
    /// another directory.
    pub source_id: Option<(u64, u64)>,
    /// Its path in the sandbox (`/workspace`).
    pub target: String,
    /// When the mount was made (ns since the epoch): a host entry whose ctime is later changed
    /// on the host since create.
    pub created_ns: i128,
    /// The source owner's uid and gid: what apply gives the files it writes (when the daemon
    /// may: as root; else they are the daemon's own).
    pub owner: Option<(u32, u32)>,
    /// Where `applied.json` is kept (`mounts/<n>`).
    pub state: PathBuf,
    /// The owner of what discard creates in the upper dir (whiteouts), when not the daemon.
    pub upper_owner: Option<(u32, u32)>,
}

/// Which paths of a mount a call is about (relative to the mount).
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only these paths and what is beneath them (None: everything).
    pub include: Option<Vec<Vec<u8>>>,
    /// Never these paths nor what is beneath them (other mounts nested in this one).
    pub exclude: Vec<Vec<u8>>,
}

#[derive(PartialEq)]
enum Rel {
    /// Not asked for.
    Skip,
    /// Above a path asked for: walk into it, do not report it.
    Descend,
    /// Asked for.
    Report,
}

/// `a` is `b` or beneath it.
fn beneath(a: &[u8], b: &[u8]) -> bool {
    b.is_empty() || a == b || (a.len() > b.len() && a.starts_with(b) && a[b.len()] == b'/')
}

impl Selection {
    fn rel(&self, p: &[u8]) -> Rel {
        if self.exclude.iter().any(|x| beneath(p, x)) {
            return Rel::Skip;
        }
        match &self.include {
            None => Rel::Report,
            Some(inc) => {
                if inc.iter().any(|x| beneath(p, x)) {
                    Rel::Report
                } else if inc.iter().any(|x| beneath(x, p)) {
                    Rel::Descend
                } else {
                    Rel::Skip
                }
            }
        }
    }

    /// Whether `p` was named itself (not through a directory above it).
    fn named(&self, p: &[u8]) -> bool {
        self.include
            .as_ref()
            .is_some_and(|inc| inc.iter().any(|x| x == p))
    }
}

/// The path of `path` relative to the mount at `target`: `Ok(None)` when it is not beneath
/// that mount; E4002 when it is not an absolute path, holds a NUL, or a `..` component.
pub fn rel_in(target: &str, path: &str) -> Result<Option<Vec<u8>>, AbxError> {
    let outside = || AbxError::new(ErrorCode::PathOutsideSandbox, &[("path", path)]);
    if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
        return Err(outside());
    }
    let parts = |s: &str| -> Result<Vec<String>, AbxError> {
        let mut v = Vec::new();
        for c in s.split('/') {
            match c {
                "" | "." => {}
                ".." => return Err(outside()),
                n if n.len() > 255 => return Err(outside()),
                n => v.push(n.to_owned()),
            }
        }
        Ok(v)
    };
    let p = parts(path)?;
    let t = parts(target)?;
    if p.len() < t.len() || p[..t.len()] != t[..] {
        return Ok(None);
    }
    Ok(Some(p[t.len()..].join("/").into_bytes()))
}

// ---------------------------------------------------------------------------------------
// System calls

fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `openat2(dir, path, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`;
/// an empty path is the directory itself.
fn open_beneath(dir: RawFd, path: &[u8], flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    let c = cstr(if path.is_empty() { b"." } else { path })?;
    // SAFETY: open_how is plain data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u32 as u64;
    how.mode = if flags & libc::O_CREAT != 0 {
        u64::from(mode)
    } else {
        0
    };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    for _ in 0..64 {
        // SAFETY: a valid C string and an open_how of the size passed.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if r >= 0 {
            // SAFETY: a fresh fd we own.
            return Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) });
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// A directory given by path (the upper dir, the source), its last component not followed.
fn open_dir_path(p: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = cstr(p.as_os_str().as_bytes())?;
    // SAFETY: a valid C string.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One name in `dir`, not following it (a directory or a regular file, `O_NONBLOCK` so a fifo
/// swapped in never blocks).
fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a valid C string.
    let fd = unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

fn lstatat(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: as fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

fn lstat_opt(dir: RawFd, name: &CStr) -> io::Result<Option<libc::stat>> {
    match lstatat(dir, name) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn readlinkat(dir: RawFd, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; MAX_LINK + 1];
    // SAFETY: the pointer and length describe `buf`.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n > MAX_LINK {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf.truncate(n);
    Ok(buf)
}

/// The path of `name` in the directory `dir` through `/proc/self/fd` (for the xattr calls,
/// which have no `*at` form before Linux 6.13); the last component is never followed
/// (`l*xattr`), the directory is the one we hold.
fn fd_path(dir: RawFd, name: &[u8]) -> io::Result<CString> {
    let mut p = format!("/proc/self/fd/{dir}/").into_bytes();
    p.extend_from_slice(name);
    cstr(&p)
}

fn getxattr(dir: RawFd, name: &[u8], attr: &CStr) -> Option<Vec<u8>> {
    let p = fd_path(dir, name).ok()?;
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and a buffer of the length passed.
    let n = unsafe {
        libc::lgetxattr(
            p.as_ptr(),
            attr.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        // ERANGE: a value larger than any overlay marker; present all the same.
        return (io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE))
            .then(|| b"?".to_vec());
    }
    Some(buf[..n as usize].to_vec())
}

fn setxattr(dir: RawFd, name: &[u8], attr: &CStr, value: &[u8]) -> io::Result<()> {
    let p = fd_path(dir, name)?;
    // SAFETY: valid C strings and a value of the length passed.
    cvt(unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            attr.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

fn removexattr(dir: RawFd, name: &[u8], attr: &CStr) -> io::Result<()> {
    let p = fd_path(dir, name)?;
    // SAFETY: valid C strings.
    match cvt(unsafe { libc::lremovexattr(p.as_ptr(), attr.as_ptr()) }) {
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => Ok(()),
        r => r,
    }
}

const OPAQUE: [&CStr; 2] = [c"user.overlay.opaque", c"trusted.overlay.opaque"];
const WHITEOUT: [&CStr; 2] = [c"user.overlay.whiteout", c"trusted.overlay.whiteout"];
const ORIGIN: [&CStr; 2] = [c"user.overlay.origin", c"trusted.overlay.origin"];

fn is_opaque(dir: RawFd, name: &[u8]) -> bool {
    OPAQUE
        .iter()
        .any(|a| getxattr(dir, name, a).is_some_and(|v| v == b"y"))
}

fn has_xattr(dir: RawFd, name: &[u8], attrs: &[&CStr]) -> bool {
    attrs.iter().any(|a| getxattr(dir, name, a).is_some())
}

/// A name read from a directory is one path component of at most 255 bytes.
fn name_ok(n: &[u8]) -> bool {
    !n.is_empty() && n.len() <= 255 && !n.contains(&b'/') && n != b"." && n != b".."
}

fn ctime_ns(st: &libc::stat) -> i128 {
    i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec)
}

// ---------------------------------------------------------------------------------------
// The walk

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symlink.
    Symlink,
    /// A device node, fifo or socket (listed, never applied).
    Other,
}

impl Kind {
    fn of(st: &libc::stat) -> Kind {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Dir => "directory",
            Kind::Symlink => "symlink",
            Kind::Other => "other",
        }
    }
}

/// One change found in the upper dir.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Relative to the mount (`a/b.txt`).
    pub rel: Vec<u8>,
    /// What changed.
    pub change: ChangeKind,
    /// What it is in the sandbox (for `deleted`: what it is on the host).
    pub kind: Kind,
    /// What it is on the host now (None: nothing there).
    pub lower: Option<Kind>,
    /// Its size in the sandbox.
    pub size: u64,
    /// Its mode bits in the sandbox (`0o7777`), for what is there.
    pub mode: Option<u32>,
    /// Its inode in the upper dir (apply checks it is still the one walked).
    pub ino: u64,
    /// A symlink's target.
    pub link: Option<Vec<u8>>,
    /// An added or changed symlink whose target leaves the mount.
    pub explicit_only: bool,
    /// A text/binary verdict on the sandbox's content (files).
    pub binary: bool,
    /// The sandbox could not be read here (a mode without read permission for the daemon).
    pub unreadable: bool,
    /// Under a directory that hides the host's (an opaque directory, here or above).
    pub hidden: bool,
    /// An upper file copied up from the host (overlayfs' `origin` mark): it existed on the host
    /// at create, so when the host has nothing there now the host removed it.
    pub copied_up: bool,
}

/// The changes of one mount.
#[derive(Debug, Default)]
pub struct Walked {
    /// Sorted by path (a directory before what is beneath it).
    pub entries: Vec<Entry>,
    /// Whether the walk stopped early ([`MAX_ENTRIES`], [`MAX_DEPTH`], an unreadable dir).
    pub truncated: bool,
}

struct Walk<'a> {
    sel: &'a Selection,
    out: Vec<Entry>,
    truncated: bool,
    buf: Option<(Vec<u8>, Vec<u8>)>,
}

/// Walk the upper dir of `layers` (the lower opened beneath its path) and list the changes
/// `sel` asks for.
pub fn walk(layers: &Layers, sel: &Selection) -> Result<Walked, AbxError> {
    let upper = open_dir_path(&layers.upper).map_err(|e| io_err(&layers.target, e))?;
    let lower = open_source(layers)?;
    walk_fds(upper, Some(lower), sel)
}

fn walk_fds(upper: OwnedFd, lower: Option<OwnedFd>, sel: &Selection) -> Result<Walked, AbxError> {
    let mut w = Walk {
        sel,
        out: Vec::new(),
        truncated: false,
        buf: None,
    };
    let mut rel = Vec::new();
    let udir = Dir::open(upper).map_err(|e| io_err("upper", e))?;
    w.dir(udir, lower, &mut rel, false, 0)
        .map_err(|e| io_err("upper", e))?;
    let mut entries = w.out;
    entries.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(Walked {
        entries,
        truncated: w.truncated,
    })
}

/// Open the source directory and check it is the one recorded at create.
pub fn open_source(layers: &Layers) -> Result<OwnedFd, AbxError> {
    let src = layers.source.display().to_string();
    let fd = open_dir_path(&layers.source).map_err(|e| {
        AbxError::new(
            ErrorCode::MountRefused,
            &[("path", &src), ("reason", &format!("cannot open it: {e}"))],
        )
    })?;
    if let Some((dev, ino)) = layers.source_id {
        let st = fstat(fd.as_raw_fd()).map_err(AbxError::internal)?;
        if (st.st_dev, st.st_ino) != (dev, ino) {
            return Err(AbxError::new(
                ErrorCode::MountRefused,
                &[
                    ("path", &src),
                    (
                        "reason",
                        "it is not the directory the sandbox was created with (its device and inode differ)",
                    ),
                ],
            ));
        }
    }
    Ok(fd)
}

fn io_err(what: &str, e: io::Error) -> AbxError {
    AbxError::internal(format!("{what}: {e}"))
}

impl Walk<'_> {
    /// At [`MAX_ENTRIES`] changes: stop (what is left may hold more).
    fn full(&mut self) -> bool {
        if self.out.len() >= MAX_ENTRIES {
            self.truncated = true;
        }
        self.out.len() >= MAX_ENTRIES
    }

    fn push(&mut self, e: Entry) {
        if self.out.len() >= MAX_ENTRIES {
            self.truncated = true;
        } else {
            self.out.push(e);
        }
    }

    /// One directory of the upper dir; `hidden`: the host's entries here are hidden (an opaque
    /// directory here or above), so those the upper lacks are deleted.
    fn dir(
        &mut self,
        mut udir: Dir,
        lower: Option<OwnedFd>,
        rel: &mut Vec<u8>,
        hidden: bool,
        depth: usize,
    ) -> io::Result<()> {
        let ufd = udir.fd();
        let lfd = lower.as_ref().map(|l| l.as_raw_fd());
        while let Some(name) = udir.next_name()? {
            if self.full() {
                return Ok(());
            }
            let nb = name.to_bytes();
            if !name_ok(nb) {
                continue;
            }
            let base = rel.len();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(nb);
            let r = self.entry(ufd, lfd, &name, rel, hidden, depth);
            rel.truncate(base);
            r?;
        }
        if hidden {
            if let Some(lfd) = lfd {
                self.hidden_deleted(ufd, lfd, rel)?;
            }
        }
        Ok(())
    }

    /// The host's entries of a hidden directory that the upper has nothing for.
    fn hidden_deleted(&mut self, ufd: RawFd, lfd: RawFd, rel: &mut Vec<u8>) -> io::Result<()> {
        let dup = open_at(lfd, c".", libc::O_RDONLY | libc::O_DIRECTORY)?;
        let mut ldir = Dir::open(dup)?;
        while let Some(name) = ldir.next_name()? {
            if self.full() {
                return Ok(());
            }
            let nb = name.to_bytes();
            if !name_ok(nb) || lstat_opt(ufd, &name)?.is_some() {
                continue;
            }
            let base = rel.len();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(nb);
            if self.sel.rel(rel) == Rel::Report {
                if let Some(lst) = lstat_opt(ldir.fd(), &name)? {
                    self.push(deleted(rel, Kind::of(&lst), true));
                }
            }
            rel.truncate(base);
        }
        Ok(())
    }

    fn entry(
        &mut self,
        ufd: RawFd,
        lfd: Option<RawFd>,
        name: &CStr,
        rel: &[u8],
        hidden: bool,
        depth: usize,
    ) -> io::Result<()> {
        let how = self.sel.rel(rel);
        if how == Rel::Skip {
            return Ok(());
        }
        let report = how == Rel::Report;
        let Some(ust) = lstat_opt(ufd, name)? else {
            return Ok(()); // gone meanwhile
        };
        let lst = match lfd {
            Some(l) => lstat_opt(l, name)?,
            None => None,
        };
        let lkind = lst.as_ref().map(Kind::of);
        let ukind = Kind::of(&ust);
        let nb = name.to_bytes();
        let mode = ust.st_mode & 0o7777;
        let mut e = Entry {
            rel: rel.to_vec(),
            change: ChangeKind::Added,
            kind: ukind,
            lower: lkind,
            size: 0,
            mode: Some(mode),
            ino: ust.st_ino,
            link: None,
            explicit_only: false,
            binary: false,
            unreadable: false,
            hidden,
            copied_up: false,
        };
        // A whiteout: a 0/0 character device, or an entry marked so.
        let whiteout = (ust.st_mode & libc::S_IFMT == libc::S_IFCHR && ust.st_rdev == 0)
            || (ukind == Kind::File && ust.st_size == 0 && has_xattr(ufd, nb, &WHITEOUT));
        if whiteout {
            if let (true, Some(lk)) = (report, lkind) {
                self.push(deleted(rel, lk, hidden));
            }
            return Ok(());
        }
        match ukind {
            Kind::Dir => {
                let opaque = is_opaque(ufd, nb);
                let ldir = match lkind {
                    Some(Kind::Dir) => Some(open_at(
                        lfd.expect("a lower entry has a lower dir"),
                        name,
                        libc::O_RDONLY | libc::O_DIRECTORY,
                    )?),
                    _ => None,
                };
                let lmode = lst.map(|s| s.st_mode & 0o777);
                match lkind {
                    None => e.change = ChangeKind::Added,
                    Some(Kind::Dir) if lmode != Some(mode & 0o777) => {
                        e.change = ChangeKind::ModeChanged
                    }
                    Some(Kind::Dir) => e.mode = None,
                    Some(_) => e.change = ChangeKind::TypeChanged,
                }
                if report && e.mode.is_some() {
                    self.push(e);
                }
                if depth + 1 >= MAX_DEPTH {
                    self.truncated = true;
                    return Ok(());
                }
                let sub = match open_at(ufd, name, libc::O_RDONLY | libc::O_DIRECTORY) {
                    Ok(fd) => fd,
                    Err(err) if err.raw_os_error() == Some(libc::EACCES) => {
                        // A directory the daemon may not read (a user's daemon, mode 000).
                        self.truncated = true;
                        return Ok(());
                    }
                    Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
                    Err(err) => return Err(err),
                };
                let hidden_below = ldir.is_some() && (hidden || opaque);
                let mut rel2 = rel.to_vec();
                self.dir(Dir::open(sub)?, ldir, &mut rel2, hidden_below, depth + 1)
            }
            Kind::File => {
                if !report {
                    return Ok(());
                }
                e.size = ust.st_size as u64;
                let ufile = match open_at(ufd, name, libc::O_RDONLY) {
                    Ok(f) => Some(f),
                    Err(err) if err.raw_os_error() == Some(libc::EACCES) => None,
                    Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
                    Err(err) if err.raw_os_error() == Some(libc::ELOOP) => return Ok(()),
                    Err(err) => return Err(err),
                };
                if let Some(f) = &ufile {
                    let st = fstat(f.as_raw_fd())?;
                    if st.st_ino != ust.st_ino || Kind::of(&st) != Kind::File {
                        return Ok(()); // swapped meanwhile: the next walk sees it
                    }
                    e.binary = sniff_binary(f.as_raw_fd())?;
                } else {
                    e.unreadable = true;
                    e.binary = true;
                }
                match lkind {
                    None => {
                        e.change = ChangeKind::Added;
                        e.copied_up = has_xattr(ufd, nb, &ORIGIN);
                    }
                    Some(Kind::File) => {
                        let lst = lst.expect("a lower kind has a stat");
                        let same_content = match &ufile {
                            None => false,
                            Some(u) => {
                                lst.st_size == ust.st_size && {
                                    let l = open_at(lfd.expect("lower"), name, libc::O_RDONLY)?;
                                    self.same_bytes(u.as_raw_fd(), l.as_raw_fd())?
                                }
                            }
                        };
                        if !same_content {
                            e.change = ChangeKind::Modified;
                        } else if lst.st_mode & 0o777 != mode & 0o777 {
                            e.change = ChangeKind::ModeChanged;
                        } else {
                            return Ok(());
                        }
                    }
                    Some(_) => e.change = ChangeKind::TypeChanged,
                }
                self.push(e);
                Ok(())
            }
            Kind::Symlink => {
                if !report {
                    return Ok(());
                }
                let target = readlinkat(ufd, name)?;
                e.size = target.len() as u64;
                e.mode = None;
                e.explicit_only = leaves(rel, &target);
                match lkind {
                    None => e.change = ChangeKind::Added,
                    Some(Kind::Symlink) => {
                        if readlinkat(lfd.expect("lower"), name)? == target {
                            return Ok(());
                        }
                        e.change = ChangeKind::Modified;
                    }
                    Some(_) => e.change = ChangeKind::TypeChanged,
                }
                e.link = Some(target);
                self.push(e);
                Ok(())
            }
            Kind::Other => {
                if !report {
                    return Ok(());
                }
                e.change = match lst {
                    None => ChangeKind::Added,
                    Some(l) if l.st_mode & libc::S_IFMT == ust.st_mode & libc::S_IFMT => {
                        if l.st_rdev == ust.st_rdev && l.st_mode & 0o777 == mode & 0o777 {
                            return Ok(());
                        }
                        ChangeKind::Modified
                    }
                    Some(_) => ChangeKind::TypeChanged,
                };
                self.push(e);
                Ok(())
            }
        }
    }

    /// Whether two files of the same size hold the same bytes (two bounded buffers).
    fn same_bytes(&mut self, a: RawFd, b: RawFd) -> io::Result<bool> {
        let (ba, bb) = self
            .buf
            .get_or_insert_with(|| (vec![0u8; BUF], vec![0u8; BUF]));
        let mut off = 0u64;
        loop {
            let n = pread_full(a, ba, off)?;
            let m = pread_full(b, bb, off)?;
            if n != m || ba[..n] != bb[..m] {
                return Ok(false);
            }
            if n == 0 {
                return Ok(true);
            }
            off += n as u64;
        }
    }
}

fn deleted(rel: &[u8], kind: Kind, hidden: bool) -> Entry {
    Entry {
        rel: rel.to_vec(),
        change: ChangeKind::Deleted,
        kind,
        lower: Some(kind),
        size: 0,
        mode: None,
        ino: 0,
        link: None,
        explicit_only: false,
        binary: false,
        unreadable: false,
        hidden,
        copied_up: false,
    }
}

/// Whether a symlink at `rel` (relative to the mount) pointing at `target` leads out of the
/// mount: an absolute target, or `..` climbing above the mount's root.
pub fn leaves(rel: &[u8], target: &[u8]) -> bool {
    if target.is_empty() || target.starts_with(b"/") {
        return true;
    }
    // The link's directory, as a depth below the mount's root.
    let mut depth = rel.split(|&b| b == b'/').count() as i64 - 1;
    for c in target.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

/// A NUL byte, or bytes that are not UTF-8, in the first [`BINARY_SNIFF`] bytes.
fn sniff_binary(fd: RawFd) -> io::Result<bool> {
    let mut buf = [0u8; BINARY_SNIFF];
    let n = pread_full(fd, &mut buf, 0)?;
    Ok(is_binary(&buf[..n]))
}

fn is_binary(b: &[u8]) -> bool {
    if b.contains(&0) {
        return true;
    }
    match std::str::from_utf8(b) {
        Ok(_) => false,
        // A character cut by the end of the sniffed bytes is not a verdict.
        Err(e) => e.error_len().is_some(),
    }
}

// ---------------------------------------------------------------------------------------
// sandbox/diff

fn view(target: &str, rel: &[u8]) -> String {
    let rel = String::from_utf8_lossy(rel);
    if rel.is_empty() {
        target.to_owned()
    } else if target == "/" {
        format!("/{rel}")
    } else {
        format!("{target}/{rel}")
    }
}

/// The changes of one mount as `sandbox/diff` lists them; `patch`: with unified diffs of the
/// text files, at most `patch_budget` bytes of them (the budget is shared by the mounts of
/// one answer and spent here).
pub fn diff(
    layers: &Layers,
    sel: &Selection,
    patch: bool,
    patch_budget: &mut usize,
) -> Result<(Vec<Change>, bool), AbxError> {
    let upper = open_dir_path(&layers.upper).map_err(|e| io_err(&layers.target, e))?;
    let lower = open_source(layers)?;
    let lfd = lower.as_raw_fd();
    let ufd = upper.as_raw_fd();
    let walked = walk_fds(
        open_at(ufd, c".", libc::O_RDONLY | libc::O_DIRECTORY).map_err(AbxError::internal)?,
        Some(lower.try_clone().map_err(AbxError::internal)?),
        sel,
    )?;
    let mut out = Vec::with_capacity(walked.entries.len());
    for e in walked.entries {
        let path = view(&layers.target, &e.rel);
        let p = if patch && (e.kind == Kind::File || e.lower == Some(Kind::File)) && !e.unreadable {
            if *patch_budget == 0 {
                Some(format!(
                    "\\ abx: not shown: the patches of this answer passed {} MiB; ask for this path alone\n",
                    MAX_PATCH_TOTAL >> 20
                ))
            } else {
                let p = entry_patch(ufd, lfd, &e).map_err(AbxError::internal)?;
                if let Some(p) = &p {
                    *patch_budget = patch_budget.saturating_sub(p.len());
                }
                p
            }
        } else {
            None
        };
        out.push(Change {
            path,
            change: e.change,
            kind: e.kind.name().to_owned(),
            size: if e.change == ChangeKind::Deleted {
                0
            } else {
                e.size
            },
            binary: e.binary,
            mode: e.mode,
            symlink_target: e.link.as_ref().map(|l| String::from_utf8_lossy(l).into()),
            explicit_only: e.explicit_only,
            patch: p,
        });
    }
    Ok((out, walked.truncated))
}

/// The content of one side of a patch: None when it is not a regular file there.
fn side(root: RawFd, rel: &[u8], is_file: bool) -> io::Result<Option<Result<Vec<u8>, String>>> {
    if !is_file {
        return Ok(Some(Ok(Vec::new())));
    }
    let f = match open_beneath(root, rel, libc::O_RDONLY | libc::O_NONBLOCK, 0) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = fstat(f.as_raw_fd())?;
    if Kind::of(&st) != Kind::File {
        return Ok(None);
    }
    if st.st_size as u64 > MAX_PATCH_INPUT {
        return Ok(Some(Err(format!(
            "\\ abx: not shown: a side is larger than {} MiB\n",
            MAX_PATCH_INPUT >> 20
        ))));
    }
    let mut buf = vec![0u8; st.st_size as usize];
    let n = pread_full(f.as_raw_fd(), &mut buf, 0)?;
    buf.truncate(n);
    if is_binary(&buf[..n.min(BINARY_SNIFF)]) {
        return Ok(Some(Err(String::new())));
    }
    Ok(Some(Ok(buf)))
}

fn entry_patch(ufd: RawFd, lfd: RawFd, e: &Entry) -> io::Result<Option<String>> {
    let sandbox_is_file = e.kind == Kind::File && e.change != ChangeKind::Deleted;
    let host_is_file = e.lower == Some(Kind::File);
    let Some(b) = side(ufd, &e.rel, sandbox_is_file)? else {
        return Ok(None);
    };
    let Some(a) = side(lfd, &e.rel, host_is_file)? else {
        return Ok(None);
    };
    let (a, b) = match (a, b) {
        (Err(n), _) | (_, Err(n)) if n.is_empty() => return Ok(None), // binary
        (Err(note), _) | (_, Err(note)) => return Ok(Some(note)),
        (Ok(a), Ok(b)) => (a, b),
    };
    let name = String::from_utf8_lossy(&e.rel);
    let old = if host_is_file {
        format!("a/{name}")
    } else {
        "/dev/null".into()
    };
    let new = if sandbox_is_file {
        format!("b/{name}")
    } else {
        "/dev/null".into()
    };
    Ok(Some(unified(&old, &new, &a, &b)))
}

// ---------------------------------------------------------------------------------------
// A line diff (Myers' O(ND) algorithm in linear space, with a work budget) and unified hunks

fn split_lines(b: &[u8]) -> Vec<&[u8]> {
    let mut v = Vec::new();
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        if c == b'\n' {
            v.push(&b[start..=i]);
            start = i + 1;
        }
    }
    if start < b.len() {
        v.push(&b[start..]);
    }
    v
}

struct Myers<'a> {
    a: &'a [u32],
    b: &'a [u32],
    ca: Vec<bool>,
    cb: Vec<bool>,
    vf: Vec<isize>,
    vb: Vec<isize>,
    budget: u64,
}

impl Myers<'_> {
    fn mark(&mut self, a: std::ops::Range<usize>, b: std::ops::Range<usize>) {
        for i in a {
            self.ca[i] = true;
        }
        for j in b {
            self.cb[j] = true;
        }
    }

    fn conquer(&mut self, mut a0: usize, mut a1: usize, mut b0: usize, mut b1: usize) {
        while a0 < a1 && b0 < b1 && self.a[a0] == self.b[b0] {
            a0 += 1;
            b0 += 1;
        }
        while a0 < a1 && b0 < b1 && self.a[a1 - 1] == self.b[b1 - 1] {
            a1 -= 1;
            b1 -= 1;
        }
        if a0 == a1 || b0 == b1 {
            self.mark(a0..a1, b0..b1);
            return;
        }
        match self.middle_snake(a0, a1, b0, b1) {
            Some((x, y)) if (x, y) != (a0, b0) && (x, y) != (a1, b1) => {
                self.conquer(a0, x, b0, y);
                self.conquer(x, a1, y, b1);
            }
            _ => self.mark(a0..a1, b0..b1),
        }
    }

    /// A point of a shortest edit path of `a[a0..a1]` -> `b[b0..b1]` (both non-empty, no common
    /// prefix or suffix), or None when the work budget ran out.
    fn middle_snake(
        &mut self,
        a0: usize,
        a1: usize,
        b0: usize,
        b1: usize,
    ) -> Option<(usize, usize)> {
        let n = (a1 - a0) as isize;
        let m = (b1 - b0) as isize;
        let delta = n - m;
        let odd = delta & 1 == 1;
        let off = n + m + 2; // index offset of diagonal 0
        let need = 2 * off as usize + 2;
        if self.vf.len() < need {
            self.vf.resize(need, 0);
            self.vb.resize(need, 0);
        }
        let ix = |k: isize| (k + off) as usize;
        self.vf[ix(1)] = 0;
        self.vb[ix(1)] = 0;
        let dmax = (n + m + 1) / 2 + 1;
        for d in 0..dmax {
            let mut k = -d;
            while k <= d {
                let mut x = if k == -d || (k != d && self.vf[ix(k - 1)] < self.vf[ix(k + 1)]) {
                    self.vf[ix(k + 1)]
                } else {
                    self.vf[ix(k - 1)] + 1
                };
                let mut y = x - k;
                let (x0, y0) = (x, y);
                while x < n && y < m && self.a[a0 + x as usize] == self.b[b0 + y as usize] {
                    x += 1;
                    y += 1;
                }
                self.budget = self.budget.saturating_sub(1 + (x - x0) as u64);
                self.vf[ix(k)] = x;
                if odd && (k - delta).abs() < d && self.vf[ix(k)] + self.vb[ix(delta - k)] >= n {
                    return Some((a0 + x0 as usize, b0 + y0 as usize));
                }
                k += 2;
            }
            let mut k = -d;
            while k <= d {
                let mut x = if k == -d || (k != d && self.vb[ix(k - 1)] < self.vb[ix(k + 1)]) {
                    self.vb[ix(k + 1)]
                } else {
                    self.vb[ix(k - 1)] + 1
                };
                let mut y = x - k;
                let x0 = x;
                while x < n && y < m && self.a[a1 - 1 - x as usize] == self.b[b1 - 1 - y as usize] {
                    x += 1;
                    y += 1;
                }
                self.budget = self.budget.saturating_sub(1 + (x - x0) as u64);
                self.vb[ix(k)] = x;
                if !odd && (k - delta).abs() <= d && self.vb[ix(k)] + self.vf[ix(delta - k)] >= n {
                    return Some((a0 + (n - x) as usize, b0 + (m - y) as usize));
                }
                k += 2;
            }
            if self.budget == 0 {
                return None;
            }
        }
        None
    }
}

/// A unified diff (3 lines of context) of `a` -> `b`, cut at [`MAX_PATCH`].
pub fn unified(old: &str, new: &str, a: &[u8], b: &[u8]) -> String {
    let la = split_lines(a);
    let lb = split_lines(b);
    if la.len() > MAX_PATCH_LINES || lb.len() > MAX_PATCH_LINES {
        return format!("\\ abx: not shown: a side has more than {MAX_PATCH_LINES} lines\n");
    }
    fn intern<'a>(ids: &mut HashMap<&'a [u8], u32>, l: &[&'a [u8]]) -> Vec<u32> {
        l.iter()
            .map(|s| {
                let n = ids.len() as u32;
                *ids.entry(*s).or_insert(n)
            })
            .collect()
    }
    let mut ids: HashMap<&[u8], u32> = HashMap::new();
    let ia = intern(&mut ids, &la);
    let ib = intern(&mut ids, &lb);
    drop(ids);
    let mut my = Myers {
        a: &ia,
        b: &ib,
        ca: vec![false; ia.len()],
        cb: vec![false; ib.len()],
        vf: Vec::new(),
        vb: Vec::new(),
        budget: DIFF_BUDGET,
    };
    my.conquer(0, ia.len(), 0, ib.len());
    let (ca, cb) = (my.ca, my.cb);
    // Runs: (kind, i, j, len): 0 equal, 1 delete, 2 insert.
    let mut ops: Vec<(u8, usize, usize, usize)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < la.len() || j < lb.len() {
        let (si, sj) = (i, j);
        while i < la.len() && j < lb.len() && !ca[i] && !cb[j] {
            i += 1;
            j += 1;
        }
        if i > si {
            ops.push((0, si, sj, i - si));
        }
        let si = i;
        while i < la.len() && ca[i] {
            i += 1;
        }
        if i > si {
            ops.push((1, si, j, i - si));
        }
        let sj = j;
        while j < lb.len() && cb[j] {
            j += 1;
        }
        if j > sj {
            ops.push((2, i, sj, j - sj));
        }
    }
    let mut out = format!("--- {old}\n+++ {new}\n");
    const CTX: usize = 3;
    let mut k = 0;
    while k < ops.len() {
        if ops[k].0 == 0 {
            k += 1;
            continue;
        }
        // A hunk: from this change to the last change whose gap to the next is <= 2*CTX.
        let mut end = k;
        while end + 1 < ops.len() {
            let next = &ops[end + 1];
            if next.0 == 0 && (next.3 > 2 * CTX || end + 2 >= ops.len()) {
                break;
            }
            end += 1;
        }
        let (ki, kj) = (ops[k].1, ops[k].2);
        let pre = if k > 0 { ops[k - 1].3.min(CTX) } else { 0 };
        let (ai, bj) = (ki - pre, kj - pre);
        let (ei, ej) = match ops[end] {
            (1, i, j, n) => (i + n, j),
            (2, i, j, n) => (i, j + n),
            (_, i, j, n) => (i + n, j + n),
        };
        let post = if end + 1 < ops.len() {
            ops[end + 1].3.min(CTX)
        } else {
            0
        };
        let (ei, ej) = (ei + post, ej + post);
        let hdr = |start: usize, len: usize| {
            if len == 0 {
                format!("{start},0")
            } else if len == 1 {
                format!("{}", start + 1)
            } else {
                format!("{},{len}", start + 1)
            }
        };
        out.push_str(&format!(
            "@@ -{} +{} @@\n",
            hdr(ai, ei - ai),
            hdr(bj, ej - bj)
        ));
        let line = |out: &mut String, c: char, l: &[u8]| {
            if out.len() > MAX_PATCH {
                return; // cut below
            }
            out.push(c);
            out.push_str(&String::from_utf8_lossy(l));
            if !l.ends_with(b"\n") {
                out.push_str("\n\\ No newline at end of file\n");
            }
        };
        for l in &la[ai..ki] {
            line(&mut out, ' ', l);
        }
        for op in &ops[k..=end] {
            for t in 0..op.3 {
                match op.0 {
                    0 => line(&mut out, ' ', la[op.1 + t]),
                    1 => line(&mut out, '-', la[op.1 + t]),
                    _ => line(&mut out, '+', lb[op.2 + t]),
                }
            }
        }
        if end + 1 < ops.len() {
            let (_, i, _, _) = ops[end + 1];
            for t in 0..post {
                line(&mut out, ' ', la[i + t]);
            }
        }
        if out.len() > MAX_PATCH {
            let mut cut = MAX_PATCH;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            let cut = out[..cut].rfind('\n').map_or(0, |i| i + 1);
            out.truncate(cut);
            out.push_str(&format!("\\ abx: patch cut at {} MiB\n", MAX_PATCH >> 20));
            return out;
        }
        k = end + 1;
    }
    out
}

// ---------------------------------------------------------------------------------------
// applied.json: what apply wrote, so a later apply of the same path is not a conflict

#[derive(Default)]
struct Applied {
    /// path -> (dev, ino, ctime ns, order)
    map: HashMap<Vec<u8>, (u64, u64, i128, u64)>,
    next: u64,
    dirty: bool,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct AppliedFile {
    v: u32,
    /// `[path, dev, ino, ctime ns as a string]`, oldest first.
    entries: Vec<(String, u64, u64, String)>,
}

const APPLIED_FILE: &str = "applied.json";
/// The largest `applied.json` read.
const APPLIED_MAX_BYTES: u64 = 64 * 1024 * 1024;

impl Applied {
    fn load(dir: &Path) -> Applied {
        let mut a = Applied::default();
        let p = dir.join(APPLIED_FILE);
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            return a;
        };
        if !md.is_file() || md.len() > APPLIED_MAX_BYTES {
            return a;
        }
        let Ok(bytes) = std::fs::read(&p) else {
            return a;
        };
        let Ok(f) = serde_json::from_slice::<AppliedFile>(&bytes) else {
            return a;
        };
        for (path, dev, ino, ct) in f.entries.into_iter().take(MAX_APPLIED) {
            if let Ok(ct) = ct.parse::<i128>() {
                a.map.insert(path.into_bytes(), (dev, ino, ct, a.next));
                a.next += 1;
            }
        }
        a
    }

    fn matches(&self, rel: &[u8], st: &libc::stat) -> bool {
        self.map
            .get(rel)
            .is_some_and(|&(d, i, c, _)| (d, i, c) == (st.st_dev, st.st_ino, ctime_ns(st)))
    }

    fn record(&mut self, rel: &[u8], st: &libc::stat) {
        if std::str::from_utf8(rel).is_err() {
            return;
        }
        self.map.insert(
            rel.to_vec(),
            (st.st_dev, st.st_ino, ctime_ns(st), self.next),
        );
        self.next += 1;
        self.dirty = true;
    }

    fn forget(&mut self, rel: &[u8]) {
        if self.map.remove(rel).is_some() {
            self.dirty = true;
        }
    }

    fn save(&mut self, dir: &Path) -> io::Result<()> {
        if !self.dirty {
            return Ok(());
        }
        let mut v: Vec<_> = self.map.iter().collect();
        v.sort_by_key(|(_, e)| e.3);
        let skip = v.len().saturating_sub(MAX_APPLIED);
        let f = AppliedFile {
            v: 1,
            entries: v
                .into_iter()
                .skip(skip)
                .map(|(p, e)| {
                    (
                        String::from_utf8_lossy(p).into_owned(),
                        e.0,
                        e.1,
                        e.2.to_string(),
                    )
                })
                .collect(),
        };
        let bytes = serde_json::to_vec(&f).map_err(io::Error::other)?;
        abx_home::util::replace_file(&dir.join(APPLIED_FILE), &bytes)?;
        self.dirty = false;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// sandbox/apply

/// Apply the changes of one mount that `sel` selects into `result`; at most
/// [`MAX_ENTRIES`] (returns whether there were more).
pub fn apply(
    layers: &Layers,
    sel: &Selection,
    dry_run: bool,
    force: bool,
    result: &mut ApplyResult,
) -> Result<bool, AbxError> {
    let upper = open_dir_path(&layers.upper).map_err(|e| io_err(&layers.target, e))?;
    let lower = open_source(layers)?;
    let walked = walk_fds(
        open_at(upper.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(AbxError::internal)?,
        Some(lower.try_clone().map_err(AbxError::internal)?),
        sel,
    )?;
    let mut applied = Applied::load(&layers.state);
    let mut ap = Applier {
        layers,
        upper: upper.as_raw_fd(),
        lower: lower.as_raw_fd(),
        applied: &mut applied,
        dry_run,
        buf: Vec::new(),
        removed: Vec::new(),
    };
    // Paths named that have no change: say so.
    if let Some(inc) = &sel.include {
        for p in inc {
            if !walked.entries.iter().any(|e| beneath(&e.rel, p)) {
                result.skipped.push(PathReason {
                    path: view(&layers.target, p),
                    reason: "no change".into(),
                });
            }
        }
    }
    for e in &walked.entries {
        let path = view(&layers.target, &e.rel);
        if ap.removed.iter().any(|r| beneath(&e.rel, r)) {
            continue; // beneath a directory this apply removed: gone with it
        }
        match ap.one(e, sel, force) {
            Ok(Outcome::Applied) => result.applied.push(path),
            Ok(Outcome::Conflict(reason)) => result.conflicts.push(PathReason { path, reason }),
            Ok(Outcome::Skipped(reason)) => result.skipped.push(PathReason { path, reason }),
            Err(err) => {
                let reason = match err.raw_os_error() {
                    Some(libc::ELOOP) => {
                        "a symlink on its path on the host (never followed)".into()
                    }
                    Some(libc::EXDEV) => "it leaves the mount on the host".into(),
                    Some(libc::ENOSPC) => "no space left on the host".into(),
                    Some(libc::EACCES | libc::EPERM) => "permission denied on the host".into(),
                    _ => format!("{err}"),
                };
                result.skipped.push(PathReason { path, reason });
            }
        }
    }
    if !dry_run {
        applied
            .save(&layers.state)
            .map_err(|e| io_err("applied.json", e))?;
    }
    Ok(walked.truncated)
}

/// The host directory of an entry.
enum Parent {
    Fd(OwnedFd),
    /// Not there (a dry run, which makes no directory).
    Missing,
}

enum Outcome {
    Applied,
    Conflict(String),
    Skipped(String),
}

struct Applier<'a> {
    layers: &'a Layers,
    upper: RawFd,
    lower: RawFd,
    applied: &'a mut Applied,
    dry_run: bool,
    buf: Vec<u8>,
    /// Directories this apply removed on the host (or replaced).
    removed: Vec<Vec<u8>>,
}

fn split_parent(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[], rel),
    }
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The prefix of apply's temporary names in host directories.
pub const APPLY_TEMP_PREFIX: &str = ".abx-apply-";

fn temp_name() -> CString {
    let n = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    CString::new(format!(
        "{APPLY_TEMP_PREFIX}{}-{n}-{t:x}",
        std::process::id()
    ))
    .expect("no NUL")
}

impl Applier<'_> {
    fn one(&mut self, e: &Entry, sel: &Selection, force: bool) -> io::Result<Outcome> {
        let named = sel.named(&e.rel);
        if e.change != ChangeKind::Deleted {
            match e.kind {
                Kind::Other => {
                    return Ok(Outcome::Skipped(
                        "a device node, fifo or socket: never applied".into(),
                    ))
                }
                Kind::Symlink if e.explicit_only && !named => {
                    return Ok(Outcome::Skipped(
                        "a symlink whose target leaves the mount: applied only when named in paths"
                            .into(),
                    ))
                }
                Kind::File if e.unreadable => {
                    return Ok(Outcome::Skipped(
                        "the daemon cannot read it in the sandbox (its mode)".into(),
                    ))
                }
                _ => {}
            }
        }
        let (parent, name) = split_parent(&e.rel);
        let cname = cstr(name)?;
        let pdir = match self.host_parent(parent)? {
            Ok(Parent::Fd(fd)) => fd,
            Ok(Parent::Missing) => {
                // A dry run under a directory the host lacks: nothing there to conflict with
                // but a file the host removed.
                return Ok(match self.conflict(e, None).filter(|_| !force) {
                    Some(reason) => Outcome::Conflict(reason),
                    None => Outcome::Applied,
                });
            }
            Err(reason) => return Ok(Outcome::Skipped(reason)),
        };
        let host = lstat_opt(pdir.as_raw_fd(), &cname)?;
        if !force {
            if let Some(reason) = self.conflict(e, host.as_ref()) {
                return Ok(Outcome::Conflict(reason));
            }
        }
        if self.dry_run {
            return Ok(Outcome::Applied);
        }
        let pfd = pdir.as_raw_fd();
        if e.change == ChangeKind::Deleted {
            if let Some(h) = host {
                if Kind::of(&h) == Kind::Dir {
                    remove_tree(pfd, &cname, 0)?;
                    self.removed.push(e.rel.clone());
                } else {
                    cvt(unsafe { libc::unlinkat(pfd, cname.as_ptr(), 0) })?;
                }
            }
            self.applied.forget(&e.rel);
            return Ok(Outcome::Applied);
        }
        // What the host has there and the sandbox replaces by another type goes first.
        if let Some(h) = &host {
            let hk = Kind::of(h);
            if hk == Kind::Dir && e.kind != Kind::Dir {
                remove_tree(pfd, &cname, 0)?;
                self.removed.push(e.rel.clone());
            } else if hk != Kind::Dir && e.kind == Kind::Dir {
                cvt(unsafe { libc::unlinkat(pfd, cname.as_ptr(), 0) })?;
            }
        }
        match e.kind {
            Kind::Dir => {
                let d = self.make_dir(pfd, &cname, e.mode.unwrap_or(0o755))?;
                let st = fstat(d.as_raw_fd())?;
                self.applied.record(&e.rel, &st);
            }
            Kind::File => {
                let Some(st) = self.write_file(pfd, &cname, e)? else {
                    return Ok(Outcome::Skipped(
                        "it changed in the sandbox meanwhile: diff again".into(),
                    ));
                };
                self.applied.record(&e.rel, &st);
            }
            Kind::Symlink => {
                let target = e.link.as_deref().unwrap_or_default();
                let tmp = temp_name();
                let ct = cstr(target)?;
                cvt(unsafe { libc::symlinkat(ct.as_ptr(), pfd, tmp.as_ptr()) })?;
                if let Some((u, g)) = self.owner() {
                    // SAFETY: fchownat on a name we just made, not following it.
                    unsafe {
                        libc::fchownat(pfd, tmp.as_ptr(), u, g, libc::AT_SYMLINK_NOFOLLOW);
                    }
                }
                if let Err(err) =
                    cvt(unsafe { libc::renameat(pfd, tmp.as_ptr(), pfd, cname.as_ptr()) })
                {
                    unsafe { libc::unlinkat(pfd, tmp.as_ptr(), 0) };
                    return Err(err);
                }
                let st = lstatat(pfd, &cname)?;
                self.applied.record(&e.rel, &st);
            }
            Kind::Other => unreachable!("skipped above"),
        }
        Ok(Outcome::Applied)
    }

    fn owner(&self) -> Option<(u32, u32)> {
        // SAFETY: a getter.
        let root = unsafe { libc::geteuid() } == 0;
        self.layers.owner.filter(|_| root)
    }

    /// Why applying `e` over what the host has now would lose a host change, if it would.
    fn conflict(&self, e: &Entry, host: Option<&libc::stat>) -> Option<String> {
        match host {
            None => (e.change == ChangeKind::Added && e.copied_up && e.kind != Kind::Dir)
                .then(|| "removed on the host since the sandbox was created".to_owned()),
            Some(st) => {
                if self.applied.matches(&e.rel, st) {
                    return None;
                }
                // A directory whose mode the sandbox changed: what is in it is not this change.
                if Kind::of(st) == Kind::Dir
                    && e.kind == Kind::Dir
                    && e.change != ChangeKind::Deleted
                {
                    return None;
                }
                (ctime_ns(st) > self.layers.created_ns)
                    .then(|| "changed on the host since the sandbox was created".to_owned())
            }
        }
    }

    /// The host directory `parent` (relative to the source), made where the sandbox has
    /// directories the host lacks; `Err(reason)` when it cannot be (a symlink or a file on
    /// the way).
    fn host_parent(&mut self, parent: &[u8]) -> io::Result<Result<Parent, String>> {
        match open_beneath(self.lower, parent, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            Ok(fd) => return Ok(Ok(Parent::Fd(fd))),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
                ) => {}
            Err(e) => return Err(e),
        }
        // Component by component: say what is in the way, make what is missing as the sandbox
        // has it.
        let mut fd = open_beneath(self.lower, b"", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let mut sofar: Vec<u8> = Vec::new();
        for c in parent.split(|&b| b == b'/') {
            if !sofar.is_empty() {
                sofar.push(b'/');
            }
            sofar.extend_from_slice(c);
            let cn = cstr(c)?;
            match lstat_opt(fd.as_raw_fd(), &cn)?.map(|st| Kind::of(&st)) {
                None => {}
                Some(Kind::Dir) => {
                    fd = open_at(fd.as_raw_fd(), &cn, libc::O_RDONLY | libc::O_DIRECTORY)?;
                    continue;
                }
                Some(Kind::Symlink) => {
                    return Ok(Err(
                        "a symlink on its path on the host (never followed)".into()
                    ))
                }
                Some(_) => {
                    return Ok(Err(
                        "the host has a file where the sandbox has a directory above it: apply that directory too".into(),
                    ))
                }
            }
            let ust = match open_beneath(self.upper, &sofar, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            {
                Ok(u) => fstat(u.as_raw_fd())?,
                Err(_) => {
                    return Ok(Err(
                        "its directory is neither on the host nor in the sandbox".into(),
                    ))
                }
            };
            if self.dry_run {
                // A dry run makes nothing: nothing is on the host beneath a missing directory.
                return Ok(Ok(Parent::Missing));
            }
            let next = self.make_dir(fd.as_raw_fd(), &cn, ust.st_mode & 0o7777)?;
            let st = fstat(next.as_raw_fd())?;
            self.applied.record(&sofar, &st);
            fd = next;
        }
        Ok(Ok(Parent::Fd(fd)))
    }

    /// mkdir (or the directory there), its mode without setuid/setgid/sticky, the owner's.
    fn make_dir(&self, pfd: RawFd, name: &CStr, mode: u32) -> io::Result<OwnedFd> {
        match cvt(unsafe { libc::mkdirat(pfd, name.as_ptr(), 0o700) }) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
        let d = open_at(pfd, name, libc::O_RDONLY | libc::O_DIRECTORY)?;
        if let Some((u, g)) = self.owner() {
            cvt(unsafe { libc::fchown(d.as_raw_fd(), u, g) })?;
        }
        cvt(unsafe { libc::fchmod(d.as_raw_fd(), (mode & 0o777) as libc::mode_t) })?;
        Ok(d)
    }

    /// The upper file copied to a temporary file beside `name`, synced, owned, moded, and
    /// renamed over `name`; its stat after the rename. None when the upper file is no longer
    /// the one walked.
    fn write_file(&mut self, pfd: RawFd, name: &CStr, e: &Entry) -> io::Result<Option<libc::stat>> {
        let src = match open_beneath(self.upper, &e.rel, libc::O_RDONLY | libc::O_NONBLOCK, 0) {
            Ok(f) => f,
            Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ELOOP)) => {
                return Ok(None)
            }
            Err(err) => return Err(err),
        };
        let sst = fstat(src.as_raw_fd())?;
        if Kind::of(&sst) != Kind::File || sst.st_ino != e.ino {
            return Ok(None);
        }
        let mut tmp = temp_name();
        let mut tries = 0;
        let dst = loop {
            // SAFETY: a valid C string.
            let fd = unsafe {
                libc::openat(
                    pfd,
                    tmp.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd >= 0 {
                // SAFETY: a fresh fd we own.
                break unsafe { OwnedFd::from_raw_fd(fd) };
            }
            let err = io::Error::last_os_error();
            tries += 1;
            if err.raw_os_error() != Some(libc::EEXIST) || tries > 16 {
                return Err(err);
            }
            tmp = temp_name();
        };
        let done = (|| -> io::Result<libc::stat> {
            if self.buf.is_empty() {
                self.buf = vec![0u8; BUF];
            }
            let mut off = 0u64;
            loop {
                let n = pread_full(src.as_raw_fd(), &mut self.buf, off)?;
                if n == 0 {
                    break;
                }
                write_all(dst.as_raw_fd(), &self.buf[..n])?;
                off += n as u64;
            }
            if let Some((u, g)) = self.owner() {
                cvt(unsafe { libc::fchown(dst.as_raw_fd(), u, g) })?;
            }
            // Never setuid, setgid or sticky on the host.
            let mode = e.mode.unwrap_or(0o644) & 0o777;
            cvt(unsafe { libc::fchmod(dst.as_raw_fd(), mode as libc::mode_t) })?;
            cvt(unsafe { libc::fsync(dst.as_raw_fd()) })?;
            cvt(unsafe { libc::renameat(pfd, tmp.as_ptr(), pfd, name.as_ptr()) })?;
            fstat(dst.as_raw_fd())
        })();
        match done {
            Ok(st) => Ok(Some(st)),
            Err(err) => {
                unsafe { libc::unlinkat(pfd, tmp.as_ptr(), 0) };
                Err(err)
            }
        }
    }
}

/// Remove `name` in `dir` and everything beneath it, never following a symlink (each
/// directory opened `O_NOFOLLOW` from its parent's descriptor); a directory the daemon may
/// not read or write is given `0700` first (it owns what it removes).
fn remove_tree(dir: RawFd, name: &CStr, depth: usize) -> io::Result<()> {
    match cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), 0) }) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EISDIR | libc::EPERM)) => {}
        Err(e) => return Err(e),
    }
    if depth > 2 * MAX_DEPTH {
        // One descriptor per level: deeper than this is refused (the path is skipped).
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    let sub = match open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY) {
        Ok(s) => s,
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            // A directory without read permission (the daemon owns it, or is root): give it
            // 0700 through an O_PATH descriptor of that very directory (never a path that a
            // symlink swapped in meanwhile could redirect).
            let p = open_at(dir, name, libc::O_PATH | libc::O_DIRECTORY)?;
            let proc = cstr(format!("/proc/self/fd/{}", p.as_raw_fd()).as_bytes())?;
            // SAFETY: a valid C string; the magic link is the directory we hold.
            cvt(unsafe { libc::chmod(proc.as_ptr(), 0o700) })?;
            open_at(p.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY)?
        }
        Err(e) => return Err(e),
    };
    let st = fstat(sub.as_raw_fd())?;
    if st.st_mode & 0o700 != 0o700 {
        cvt(unsafe { libc::fchmod(sub.as_raw_fd(), 0o700) })?;
    }
    let mut d = Dir::open(sub)?;
    while let Some(n) = d.next_name()? {
        remove_tree(d.fd(), &n, depth + 1)?;
    }
    drop(d);
    cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), libc::AT_REMOVEDIR) })
}

// ---------------------------------------------------------------------------------------
// sandbox/discard

/// Drop the changes of one mount that `sel` selects from its upper dir (the sandbox sees the
/// host's version again); the sandbox paths dropped, and whether there were more than
/// [`MAX_ENTRIES`].
pub fn discard(
    layers: &Layers,
    sel: &Selection,
    result: &mut DiscardResult,
) -> Result<bool, AbxError> {
    let upper = open_dir_path(&layers.upper).map_err(|e| io_err(&layers.target, e))?;
    let lower = open_source(layers)?;
    let walked = walk_fds(
        open_at(upper.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(AbxError::internal)?,
        Some(lower.try_clone().map_err(AbxError::internal)?),
        sel,
    )?;
    let ufd = upper.as_raw_fd();
    let lfd = lower.as_raw_fd();
    let mut removed: Vec<Vec<u8>> = Vec::new();
    for e in &walked.entries {
        if removed.iter().any(|r| beneath(&e.rel, r)) {
            continue;
        }
        let path = view(&layers.target, &e.rel);
        match discard_one(ufd, lfd, e, layers.upper_owner) {
            Ok(true) => {
                let kept = e.change == ChangeKind::ModeChanged && e.kind == Kind::Dir;
                if e.kind == Kind::Dir && !kept {
                    removed.push(e.rel.clone());
                }
                result.discarded.push(path);
            }
            Ok(false) => {}
            Err(err) => {
                return Err(AbxError::internal(format!("discard {path}: {err}")));
            }
        }
    }
    Ok(walked.truncated)
}

fn discard_one(ufd: RawFd, lfd: RawFd, e: &Entry, owner: Option<(u32, u32)>) -> io::Result<bool> {
    let (parent, name) = split_parent(&e.rel);
    if e.hidden {
        unhide(ufd, lfd, parent, owner)?;
    }
    let pdir = match open_beneath(ufd, parent, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
        Ok(d) => d,
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
        Err(err) => return Err(err),
    };
    let pfd = pdir.as_raw_fd();
    let cname = cstr(name)?;
    let Some(ust) = lstat_opt(pfd, &cname)? else {
        return Ok(false);
    };
    if e.change == ChangeKind::ModeChanged && e.kind == Kind::Dir {
        // The directory keeps what is beneath it (other changes): only its mode goes back.
        let lst = open_beneath(lfd, &e.rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .and_then(|d| fstat(d.as_raw_fd()))?;
        let d = open_at(pfd, &cname, libc::O_RDONLY | libc::O_DIRECTORY)?;
        cvt(unsafe { libc::fchmod(d.as_raw_fd(), (lst.st_mode & 0o7777) as libc::mode_t) })?;
        return Ok(true);
    }
    if Kind::of(&ust) == Kind::Dir {
        remove_tree(pfd, &cname, 0)?;
    } else {
        cvt(unsafe { libc::unlinkat(pfd, cname.as_ptr(), 0) })?;
    }
    Ok(true)
}

/// Make the directories from the mount's root down to `parent` stop hiding the host's
/// entries, without changing what the sandbox sees: each opaque upper directory loses its
/// mark, gets a whiteout for every host entry it lacks, and passes the mark on to its upper
/// subdirectories that have a host directory of the same name.
fn unhide(ufd: RawFd, lfd: RawFd, parent: &[u8], owner: Option<(u32, u32)>) -> io::Result<()> {
    let mut prefix: Vec<u8> = Vec::new();
    let comps: Vec<&[u8]> = if parent.is_empty() {
        Vec::new()
    } else {
        parent.split(|&b| b == b'/').collect()
    };
    // The root, then each component.
    for i in 0..=comps.len() {
        if i > 0 {
            if !prefix.is_empty() {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(comps[i - 1]);
        }
        let (pp, nm) = split_parent(&prefix);
        let Ok(pd) = open_beneath(ufd, pp, libc::O_RDONLY | libc::O_DIRECTORY, 0) else {
            return Ok(());
        };
        let nm_or_dot: &[u8] = if nm.is_empty() { b"." } else { nm };
        if !is_opaque(pd.as_raw_fd(), nm_or_dot) {
            continue;
        }
        let (Ok(ud), Ok(ld)) = (
            open_beneath(ufd, &prefix, libc::O_RDONLY | libc::O_DIRECTORY, 0),
            open_beneath(lfd, &prefix, libc::O_RDONLY | libc::O_DIRECTORY, 0),
        ) else {
            continue;
        };
        let udfd = ud.as_raw_fd();
        // Whiteouts for what the host has and the upper lacks.
        let mut ldir = Dir::open(ld)?;
        while let Some(n) = ldir.next_name()? {
            if !name_ok(n.to_bytes()) {
                continue;
            }
            match lstat_opt(udfd, &n)? {
                None => {
                    cvt(unsafe { libc::mknodat(udfd, n.as_ptr(), libc::S_IFCHR, 0) })?;
                    if let Some((u, g)) = owner {
                        unsafe {
                            libc::fchownat(udfd, n.as_ptr(), u, g, libc::AT_SYMLINK_NOFOLLOW)
                        };
                    }
                }
                Some(st) if Kind::of(&st) == Kind::Dir => {
                    if let Some(lst) = lstat_opt(ldir.fd(), &n)? {
                        if Kind::of(&lst) == Kind::Dir && !is_opaque(udfd, n.to_bytes()) {
                            setxattr(udfd, n.to_bytes(), OPAQUE[0], b"y")?;
                        }
                    }
                }
                Some(_) => {}
            }
        }
        for a in OPAQUE {
            if getxattr(pd.as_raw_fd(), nm_or_dot, a).is_some() {
                removexattr(pd.as_raw_fd(), nm_or_dot, a)?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The provider's side: a sandbox's mounts, `target` and `paths` mapped onto them

/// The methods [`serve`] answers.
pub const METHODS: &[&str] = &["sandbox/diff", "sandbox/apply", "sandbox/discard"];

/// One overlay mount of a sandbox and what a call selects of it.
struct Picked {
    /// Its index in the sandbox's mounts.
    n: usize,
    layers: Layers,
    sel: Selection,
    /// Where its state lives (`mounts/<n>`): apply and discard hold a lock on it.
    state: PathBuf,
}

fn norm_target(t: &str) -> String {
    let parts: Vec<&str> = t
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

/// The overlay mounts a call is about, each with its selection: `target` picks one (an `ro`
/// or `rw` mount is E1004: only overlay mounts have changes), `paths` are mapped to the mount
/// they lie in (the deepest; E4002 for a path in none, or with `..`).
fn pick(
    method: &str,
    root: &Path,
    mounts: &[super::mounts::MountRecord],
    target: Option<&str>,
    paths: Option<&[String]>,
) -> Result<Vec<Picked>, AbxError> {
    use abx_protocol::api::MountMode;
    let targets: Vec<String> = mounts.iter().map(|m| norm_target(&m.target)).collect();
    let chosen: Vec<usize> = match target {
        Some(t) => {
            let t = norm_target(t);
            let Some(n) = targets.iter().position(|x| *x == t) else {
                return Err(AbxError::invalid_params(
                    method,
                    format!("the sandbox has no mount at '{t}'"),
                ));
            };
            if mounts[n].mode != MountMode::Overlay {
                return Err(AbxError::invalid_params(
                    method,
                    format!(
                        "only overlay mounts have changes ('{t}' is mounted {})",
                        mounts[n].mode.as_str()
                    ),
                ));
            }
            vec![n]
        }
        None => (0..mounts.len())
            .filter(|&n| mounts[n].mode == MountMode::Overlay)
            .collect(),
    };
    // Each path to the deepest mount holding it (of all the sandbox's mounts).
    let mut per: HashMap<usize, Vec<Vec<u8>>> = HashMap::new();
    if let Some(paths) = paths {
        if paths.len() > MAX_ENTRIES {
            return Err(AbxError::invalid_params(
                method,
                format!("at most {MAX_ENTRIES} paths"),
            ));
        }
        for p in paths {
            let mut best: Option<(usize, Vec<u8>)> = None;
            for (n, t) in targets.iter().enumerate() {
                if let Some(rel) = rel_in(t, p)? {
                    if best
                        .as_ref()
                        .is_none_or(|(b, _)| targets[*b].len() < t.len())
                    {
                        best = Some((n, rel));
                    }
                }
            }
            match best {
                Some((n, rel)) if chosen.contains(&n) => per.entry(n).or_default().push(rel),
                Some((n, _)) if mounts[n].mode != MountMode::Overlay => {
                    return Err(AbxError::invalid_params(
                        method,
                        format!(
                            "only overlay mounts have changes ('{p}' is in '{}', mounted {})",
                            targets[n],
                            mounts[n].mode.as_str()
                        ),
                    ))
                }
                _ => {
                    return Err(AbxError::new(ErrorCode::PathOutsideSandbox, &[("path", p)])
                        .with_data(
                            "detail",
                            "not beneath an overlay mount of the sandbox (or of `target`)",
                        ))
                }
            }
        }
    }
    let mut out = Vec::new();
    for n in chosen {
        let include = match paths {
            None => None,
            Some(_) => match per.remove(&n) {
                Some(v) => Some(v),
                None => continue,
            },
        };
        let m = &mounts[n];
        // Mounts nested beneath this one are theirs, not this overlay's.
        let exclude = targets
            .iter()
            .enumerate()
            .filter(|&(k, _)| k != n)
            .filter_map(|(_, t)| rel_in(&targets[n], t).ok().flatten())
            .filter(|r| !r.is_empty())
            .collect();
        let (upper, _work) = super::mounts::layer_dirs(root, n);
        let state = upper.parent().map(Path::to_path_buf).unwrap_or_default();
        out.push(Picked {
            n,
            layers: Layers {
                upper,
                source: PathBuf::from(&m.source),
                source_id: Some((m.dev, m.ino)),
                target: targets[n].clone(),
                created_ns: m.created_ns,
                owner: Some((m.uid, m.gid)),
                state: state.clone(),
                upper_owner: crate::container::sandbox_owner(),
            },
            sel: Selection { include, exclude },
            state,
        });
    }
    Ok(out)
}

/// An exclusive lock on a mount's state dir while apply or discard changes it (one at a time
/// per mount: `applied.json` and the upper dir).
fn lock_state(dir: &Path) -> Result<OwnedFd, AbxError> {
    let fd = open_dir_path(dir).map_err(|e| io_err("mount state", e))?;
    // SAFETY: flock on a descriptor we hold; released when it is closed.
    cvt(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) })
        .map_err(|e| io_err("mount state", e))?;
    Ok(fd)
}

/// What a call answered, and which overlays a running sandbox should mount again to see it.
pub struct Served {
    /// The result, as JSON.
    pub reply: Box<serde_json::value::RawValue>,
    /// The indexes (in the sandbox's mounts) of the overlays whose upper dir `sandbox/discard`
    /// changed: overlayfs keeps serving what it looked up before, so a running sandbox sees
    /// the host's version only once such an overlay is mounted again (docs/local-sandboxes.md,
    /// "A running sandbox and discard").
    pub remount: Vec<usize>,
}

fn run(
    method: &str,
    params: serde_json::Value,
    root: &Path,
    mounts: &[super::mounts::MountRecord],
) -> Result<Served, AbxError> {
    let mut remount = Vec::new();
    let reply = run_inner(method, params, root, mounts, &mut remount)?;
    Ok(Served { reply, remount })
}

fn run_inner(
    method: &str,
    params: serde_json::Value,
    root: &Path,
    mounts: &[super::mounts::MountRecord],
    remount: &mut Vec<usize>,
) -> Result<Box<serde_json::value::RawValue>, AbxError> {
    use abx_protocol::api::{ApplyParams, DiffFormat, DiffParams, DiffResult, DiscardParams};
    match method {
        "sandbox/diff" => {
            let p: DiffParams =
                serde_json::from_value(params).map_err(|e| AbxError::invalid_params(method, e))?;
            let patch = p.format == Some(DiffFormat::Patch);
            let mut budget = MAX_PATCH_TOTAL;
            let mut res = DiffResult::default();
            for m in pick(
                method,
                root,
                mounts,
                p.target.as_deref(),
                p.paths.as_deref(),
            )? {
                let (mut c, t) = diff(&m.layers, &m.sel, patch, &mut budget)?;
                res.truncated |= t;
                res.changes.append(&mut c);
                if res.changes.len() > MAX_ENTRIES {
                    res.changes.truncate(MAX_ENTRIES);
                    res.truncated = true;
                }
            }
            res.changes.sort_by(|a, b| a.path.cmp(&b.path));
            raw(&res)
        }
        "sandbox/apply" => {
            let p: ApplyParams =
                serde_json::from_value(params).map_err(|e| AbxError::invalid_params(method, e))?;
            let mut res = ApplyResult::default();
            for m in pick(
                method,
                root,
                mounts,
                p.target.as_deref(),
                p.paths.as_deref(),
            )? {
                let _lock = lock_state(&m.state)?;
                let more = apply(
                    &m.layers,
                    &m.sel,
                    p.dry_run.unwrap_or(false),
                    p.force.unwrap_or(false),
                    &mut res,
                )?;
                res.truncated |= more;
            }
            raw(&res)
        }
        "sandbox/discard" => {
            let p: DiscardParams =
                serde_json::from_value(params).map_err(|e| AbxError::invalid_params(method, e))?;
            let mut res = DiscardResult::default();
            for m in pick(
                method,
                root,
                mounts,
                p.target.as_deref(),
                p.paths.as_deref(),
            )? {
                let _lock = lock_state(&m.state)?;
                let before = res.discarded.len();
                res.truncated |= discard(&m.layers, &m.sel, &mut res)?;
                if res.discarded.len() > before {
                    remount.push(m.n);
                }
            }
            raw(&res)
        }
        other => Err(AbxError::new(
            ErrorCode::MethodNotFound,
            &[("method", other)],
        )),
    }
}

/// A result serialized straight to raw JSON (never a `Value` tree: a diff of 100,000 entries
/// stays one buffer).
fn raw<T: serde::Serialize>(v: &T) -> Result<Box<serde_json::value::RawValue>, AbxError> {
    serde_json::value::to_raw_value(v).map_err(AbxError::internal)
}

/// Serve `sandbox/diff`, `sandbox/apply` or `sandbox/discard` for a sandbox whose directory is
/// `root` and whose mounts are `mounts`, on a blocking thread (the daemon keeps answering
/// meanwhile), straight to raw JSON.
pub async fn serve(
    method: &str,
    params: serde_json::Value,
    root: PathBuf,
    mounts: Vec<super::mounts::MountRecord>,
) -> Result<Served, AbxError> {
    // What one call holds (its list of up to 100,000 changes, two patch inputs of up to 8 MiB,
    // its answer before it is queued) is bounded; so is how many run at once: the others wait,
    // holding nothing.
    static RUNNING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(RUNNING_AT_ONCE);
    let _permit = RUNNING.acquire().await.map_err(AbxError::internal)?;
    let method = method.to_owned();
    tokio::task::spawn_blocking(move || run(&method, params, &root, &mounts))
        .await
        .map_err(AbxError::internal)?
}

/// How many diff, apply and discard calls run at once (daemon-wide).
pub const RUNNING_AT_ONCE: usize = 2;

#[cfg(test)]
#[path = "changes_tests.rs"]
mod tests;
