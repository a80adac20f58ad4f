//! Safe application of image layers (tar streams) onto a root directory.
//!
//! Every path of a layer is resolved beneath the root with `openat2(RESOLVE_IN_ROOT)`: a
//! symlink met on the way (absolute or relative, planted by this layer or an earlier one) is
//! resolved as it would be inside the image, never on the host, so nothing is ever written
//! outside the root. The final component is never followed (files are created `O_EXCL`
//! after removing what was there; that also keeps hard-link clones of a base image intact).
//! Entries with a `..` component are skipped; absolute names are taken relative to the root.
//! Hard links are made only to paths inside the root. Device nodes and fifos are skipped.
//! Setuid and setgid bits are dropped (a sandbox has one id, so they could not change
//! anything inside; on the host they would be a way into the sandbox's id). Everything is
//! owned by `owner` where one is given (a root daemon's sandbox id).
//!
//! Whiteouts ([`Root::apply`], layers only) by their exact grammar
//! ([`super::tarstream::whiteout`]): `.wh.<name>` removes `<name>` of the same directory,
//! `.wh..wh..opq` hides what lower layers put in its directory; any other name beginning with
//! `.wh.` (`.wh..`, `.wh...`, AUFS metadata) is neither acted on nor made. An archive
//! ([`Root::extract`]: a `docker save` tar, an OCI layout in a tar) has no whiteouts: such
//! names are skipped.
//!
//! Bounded whatever the archive: the tar stream is read by [`super::tarstream`] (each header
//! checked before its data, extension records capped, nothing buffered); no path is kept but
//! the last entry's parent (its descriptor, so files of one directory are made without
//! resolving a long path again); what a layer made is a set of keyed 64-bit hashes of its
//! paths (an opaque marker keeps those of its layer), at most [`MAX_MADE`] of them (an opaque
//! marker past that is refused); directories are emptied with `getdents64` from a position,
//! one directory's buffer at a time. A [`Budget`] caps what layers may unpack to (the
//! declared bytes of every entry, and the number of entries), so a decompression bomb stops
//! at the cap ([`is_over_budget`]).

use super::tarstream::{self, Kind, Whiteout};
use std::collections::HashSet;
use std::ffi::{CStr, CString, OsStr};
use std::hash::BuildHasher;
use std::io::{self, Read, Seek};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// The most paths one layer's opaque markers can tell apart from lower ones (about 20 MiB
/// of hashes at most).
pub const MAX_MADE: usize = 1 << 20;

/// The deepest tree a removal walks (one descriptor per level): no layer path is longer
/// than `PATH_MAX`, so only symlink tricks make deeper ones.
pub const MAX_DEPTH: usize = 4096;

/// What applying a layer did.
#[derive(Debug, Default, Clone)]
pub struct Applied {
    /// Entries written.
    pub written: u64,
    /// Entries skipped (device nodes, fifos, `..` names, links that lead nowhere, whiteout
    /// names outside their grammar or in an archive).
    pub skipped: u64,
}

/// What unpacking may still take: bytes (the declared size of every entry, whatever its
/// kind, so skipped entries count too, and of the records that describe them) and entries.
/// Shared by the layers of one image.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Bytes left.
    pub bytes: u64,
    /// Entries left.
    pub entries: u64,
}

/// The error a [`Budget`] running out raises (inside an `io::Error`).
#[derive(Debug)]
pub struct OverBudget(pub &'static str);

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unpacking goes over the cap on {}", self.0)
    }
}

impl std::error::Error for OverBudget {}

/// Whether an error is a [`Budget`] running out.
pub fn is_over_budget(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<OverBudget>())
}

impl Budget {
    /// No cap.
    pub fn unlimited() -> Budget {
        Budget {
            bytes: u64::MAX,
            entries: u64::MAX,
        }
    }

    /// Take one entry of `size` bytes.
    pub fn take(&mut self, size: u64) -> io::Result<()> {
        if self.entries == 0 {
            return Err(io::Error::other(OverBudget("entries")));
        }
        if size > self.bytes {
            return Err(io::Error::other(OverBudget("bytes")));
        }
        self.entries -= 1;
        self.bytes -= size;
        Ok(())
    }
}

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn cpath(p: &Path) -> io::Result<CString> {
    cstr(p.as_os_str().as_bytes())
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}
/// `RESOLVE_NO_XDEV`.
pub const RESOLVE_NO_XDEV: u64 = 0x01;
/// `RESOLVE_NO_MAGICLINKS`.
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// `RESOLVE_NO_SYMLINKS`.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;
/// `RESOLVE_BENEATH`.
pub const RESOLVE_BENEATH: u64 = 0x08;
/// `RESOLVE_IN_ROOT`.
pub const RESOLVE_IN_ROOT: u64 = 0x10;

/// `openat2(dir, rel, flags | O_CLOEXEC, resolve)` ("." for an empty `rel`).
pub fn openat2(dir: RawFd, rel: &Path, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    let p = if rel.as_os_str().is_empty() {
        CString::new(".").expect("dot")
    } else {
        cpath(rel)?
    };
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve,
    };
    // SAFETY: openat2 with a valid C string and a struct on the stack.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            p.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `openat2(root, rel, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`.
fn open_in(root: RawFd, rel: &Path, flags: i32) -> io::Result<OwnedFd> {
    openat2(root, rel, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
}

/// The normalized relative path of an entry name: None when it has a `..` component.
pub fn clean(name: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in name.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return None,
        }
    }
    Some(out)
}

/// A root directory layers are applied to.
pub struct Root {
    fd: OwnedFd,
    owner: Option<(u32, u32)>,
    made_cap: usize,
}

/// A directory `n` in `dir`: made, or kept if it is one already; a dangling symlink or a
/// file in its place is removed first (never followed).
fn make_dir_at(dir: RawFd, n: &CStr) -> io::Result<()> {
    if let Ok(st) = lstat_at(dir, n) {
        if !is_dir(&st) {
            remove_at(dir, n)?;
        }
    }
    // SAFETY: mkdirat of a name in a directory we hold.
    if unsafe { libc::mkdirat(dir, n.as_ptr(), 0o755) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn lstat_at(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: fstatat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstat(fd)`.
pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn unlink_at(dir: RawFd, name: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: unlinkat of a name in a directory we hold.
    if unsafe { libc::unlinkat(dir, name.as_ptr(), flags) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::NotFound {
            return Err(e);
        }
    }
    Ok(())
}

/// Remove `name` in `dir` (a directory with everything beneath it), never following a
/// symlink.
pub fn remove_at(dir: RawFd, name: &CStr) -> io::Result<()> {
    let st = match lstat_at(dir, name) {
        Ok(st) => st,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if is_dir(&st) {
        let sub = openat2(
            dir,
            Path::new(OsStr::from_bytes(name.to_bytes())),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        )?;
        clear_dir(sub, Path::new(""), None)?;
        unlink_at(dir, name, libc::AT_REMOVEDIR)
    } else {
        unlink_at(dir, name, 0)
    }
}

/// A directory's entries through `getdents64`, resumed from a position (the `d_off` of the
/// last entry taken), so a walk holds one buffer whatever its depth.
pub struct Dents {
    buf: Vec<u8>,
    len: usize,
    at: usize,
    /// Where the buffer's end is in the directory.
    pos: i64,
    /// Which directory (a depth of the walk) the buffer holds entries of.
    owner: Option<usize>,
}

/// One directory entry: its name, `d_type`, and the position after it.
pub struct Dent<'a> {
    /// The name (never `.` or `..`).
    pub name: &'a CStr,
    /// `DT_*`.
    pub kind: u8,
    /// Where the next entry is (for [`Dents::next`]).
    pub next: i64,
}

impl Default for Dents {
    fn default() -> Self {
        Dents {
            buf: vec![0u8; 16 * 1024],
            len: 0,
            at: 0,
            pos: 0,
            owner: None,
        }
    }
}

impl Dents {
    /// The entry of directory `fd` (known as `depth`) after position `from` (0: its first),
    /// None at its end. While the same directory is read, the buffer goes on where it was.
    pub fn next(&mut self, fd: RawFd, depth: usize, from: i64) -> io::Result<Option<Dent<'_>>> {
        if self.owner != Some(depth) {
            self.owner = Some(depth);
            self.pos = from;
            self.len = 0;
            self.at = 0;
        }
        loop {
            if self.at >= self.len {
                // SAFETY: lseek and getdents64 into our buffer, on a directory we hold.
                let n = unsafe {
                    if libc::lseek(fd, self.pos, libc::SEEK_SET) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::syscall(
                        libc::SYS_getdents64,
                        fd,
                        self.buf.as_mut_ptr(),
                        self.buf.len(),
                    )
                };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                self.len = n as usize;
                self.at = 0;
                if self.len == 0 {
                    return Ok(None);
                }
            }
            // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
            let rec = &self.buf[self.at..self.len];
            if rec.len() < 20 {
                return Err(io::Error::from(io::ErrorKind::InvalidData));
            }
            let next = i64::from_ne_bytes(rec[8..16].try_into().expect("8 bytes"));
            let reclen = u16::from_ne_bytes(rec[16..18].try_into().expect("2 bytes")) as usize;
            if reclen < 20 || reclen > rec.len() {
                return Err(io::Error::from(io::ErrorKind::InvalidData));
            }
            let kind = rec[18];
            let start = self.at;
            self.at += reclen;
            self.pos = next;
            let name = CStr::from_bytes_until_nul(&rec[19..reclen])
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?
                .to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let name = CStr::from_bytes_until_nul(&self.buf[start + 19..start + reclen])
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
            return Ok(Some(Dent { name, kind, next }));
        }
    }

    /// Forget the buffer (another directory is read, or the next read is of another).
    pub fn forget(&mut self) {
        self.owner = None;
    }
}

/// One directory of [`clear_dir`]'s walk.
struct Frame {
    fd: OwnedFd,
    /// Where to read its next entry.
    pos: i64,
    /// Its name in its parent (None for the top).
    name: Option<CString>,
    /// Kept (made by this layer, or the top): only what is not made goes from it.
    kept: bool,
    /// The length of the walk's path before this directory's name.
    plen: usize,
}

/// Empty `top` (never following a symlink) but, with `made`, of what this layer made:
/// entries whose path (`at/...`) is in `made` stay, made directories are walked in turn.
/// Iterative: one descriptor and one position per level, one buffer for all.
fn clear_dir(top: OwnedFd, at: &Path, made: Option<&Made>) -> io::Result<()> {
    let mut path: Vec<u8> = at.as_os_str().as_bytes().to_vec();
    let mut stack = vec![Frame {
        fd: top,
        pos: 0,
        name: None,
        kept: true,
        plen: path.len(),
    }];
    let mut dents = Dents::default();
    while let Some(depth) = stack.len().checked_sub(1) {
        let fd = stack[depth].fd.as_raw_fd();
        let from = stack[depth].pos;
        let Some((name, kind, next)) = dents
            .next(fd, depth, from)?
            .map(|d| (d.name.to_owned(), d.kind, d.next))
        else {
            let f = stack.pop().expect("a frame");
            dents.forget();
            path.truncate(f.plen);
            if let (Some(name), false, Some(parent)) = (&f.name, f.kept, stack.last()) {
                drop(f.fd);
                unlink_at(parent.fd.as_raw_fd(), name, libc::AT_REMOVEDIR)?;
            }
            continue;
        };
        stack[depth].pos = next;
        let child_made = stack[depth].kept
            && made.is_some_and(|m| {
                let plen = path.len();
                if !path.is_empty() {
                    path.push(b'/');
                }
                path.extend_from_slice(name.to_bytes());
                let yes = m.contains(&path);
                path.truncate(plen);
                yes
            });
        let dir = match kind {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => lstat_at(fd, &name).is_ok_and(|st| is_dir(&st)),
            _ => false,
        };
        if dir {
            let sub = openat2(
                fd,
                Path::new(OsStr::from_bytes(name.to_bytes())),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
            );
            match sub {
                Ok(sub) => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(io::Error::other(format!(
                            "a directory tree deeper than {MAX_DEPTH} levels"
                        )));
                    }
                    let plen = path.len();
                    if made.is_some() {
                        if !path.is_empty() {
                            path.push(b'/');
                        }
                        path.extend_from_slice(name.to_bytes());
                    }
                    dents.forget();
                    stack.push(Frame {
                        fd: sub,
                        pos: 0,
                        name: Some(name),
                        kept: child_made,
                        plen,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        } else if !child_made {
            unlink_at(fd, &name, 0)?;
        }
    }
    Ok(())
}

/// What one layer made: keyed 64-bit hashes of the paths of its entries and of the
/// directories it wrote into, up to a cap ([`MAX_MADE`]); `full` past that.
struct Made {
    keys: std::collections::hash_map::RandomState,
    set: HashSet<u64>,
    cap: usize,
    full: bool,
}

impl Made {
    fn new(cap: usize) -> Made {
        Made {
            keys: Default::default(),
            set: HashSet::new(),
            cap,
            full: false,
        }
    }

    fn hash(&self, p: &[u8]) -> u64 {
        self.keys.hash_one(p)
    }

    fn contains(&self, p: &[u8]) -> bool {
        self.set.contains(&self.hash(p))
    }

    fn insert(&mut self, p: &Path) -> bool {
        if self.set.len() >= self.cap {
            self.full = true;
            return false;
        }
        self.set.insert(self.hash(p.as_os_str().as_bytes()))
    }

    /// Note one made entry.
    fn note(&mut self, rel: &Path) {
        self.insert(rel);
    }

    /// Note a directory written into, with its parents (up to one noted before: its parents
    /// are noted already).
    fn note_dir(&mut self, dir: &Path) {
        let mut p = dir;
        while !p.as_os_str().is_empty() && self.insert(p) {
            p = p.parent().unwrap_or(Path::new(""));
        }
    }
}

/// An entry's path could not be applied: refused with where it is in the stream.
fn at_entry(offset: u64, what: &str) -> io::Error {
    io::Error::other(format!("{what} (the entry at byte {offset})"))
}

impl Root {
    /// Open `dir` (created if missing) as the root layers are applied to.
    pub fn open(dir: &Path, owner: Option<(u32, u32)>) -> io::Result<Root> {
        std::fs::create_dir_all(dir)?;
        if let Some((u, g)) = owner {
            std::os::unix::fs::lchown(dir, Some(u), Some(g))?;
        }
        let f = std::fs::File::open(dir)?;
        Ok(Root {
            fd: OwnedFd::from(f),
            owner,
            made_cap: MAX_MADE,
        })
    }

    fn chown_at(&self, dir: RawFd, name: &CStr) {
        if let Some((u, g)) = self.owner {
            // SAFETY: fchownat of a name in a directory we hold, not following it.
            unsafe { libc::fchownat(dir, name.as_ptr(), u, g, libc::AT_SYMLINK_NOFOLLOW) };
        }
    }

    /// The directory `rel` beneath the root, made (with its parents) where missing. A
    /// non-directory in the way is replaced; symlinks are resolved inside the root.
    fn dir(&self, rel: &Path) -> io::Result<OwnedFd> {
        match open_in(self.fd.as_raw_fd(), rel, libc::O_PATH | libc::O_DIRECTORY) {
            Ok(fd) => return Ok(fd),
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT)
                    || e.raw_os_error() == Some(libc::ENOTDIR) => {}
            Err(e) => return Err(e),
        }
        let (parent, name) = split(rel)?;
        let pfd = self.dir(&parent)?;
        let n = cstr(name.as_bytes())?;
        make_dir_at(pfd.as_raw_fd(), &n)?;
        self.chown_at(pfd.as_raw_fd(), &n);
        open_in(self.fd.as_raw_fd(), rel, libc::O_PATH | libc::O_DIRECTORY)
    }

    /// The directory `rel` where it exists (None where it does not, or is no directory).
    fn existing_dir(&self, rel: &Path) -> io::Result<Option<OwnedFd>> {
        match open_in(self.fd.as_raw_fd(), rel, libc::O_PATH | libc::O_DIRECTORY) {
            Ok(fd) => Ok(Some(fd)),
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT)
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Apply one layer (a tar stream) on top of what the root holds, within `budget`.
    pub fn apply(&self, tar_stream: impl Read, budget: &mut Budget) -> io::Result<Applied> {
        self.unpack(tar_stream, budget, true)
    }

    /// Unpack an archive (a tar stream) into the root, within `budget`: as a layer, but
    /// whiteout names mean nothing (they are skipped).
    pub fn extract(&self, tar_stream: impl Read, budget: &mut Budget) -> io::Result<Applied> {
        self.unpack(tar_stream, budget, false)
    }

    fn unpack(
        &self,
        tar_stream: impl Read,
        budget: &mut Budget,
        layer: bool,
    ) -> io::Result<Applied> {
        let mut ar = tarstream::Reader::new(tar_stream);
        let mut done = Applied::default();
        let mut made = Made::new(self.made_cap);
        // The last entry's parent directory (its path and descriptor).
        let mut cached: Option<(PathBuf, OwnedFd)> = None;
        while let Some(entry) = ar.next()? {
            budget.take(entry.size.saturating_add(entry.extension_bytes))?;
            let at = entry.offset;
            let Some(rel) = clean(Path::new(OsStr::from_bytes(&entry.path))) else {
                tracing::warn!(offset = at, "image layer: skipping a path with '..'");
                done.skipped += 1;
                continue;
            };
            if rel.as_os_str().is_empty() {
                continue;
            }
            let Ok((parent, name)) = split(&rel) else {
                done.skipped += 1;
                continue;
            };
            // Whatever replaces the cached directory or one above it makes it stale.
            if cached.as_ref().is_some_and(|(p, _)| p.starts_with(&rel)) {
                cached = None;
            }
            match tarstream::whiteout(name.as_bytes()) {
                Whiteout::No => {}
                _ if !layer => {
                    // An archive's entries are files: whiteouts are for the layers in it.
                    done.skipped += 1;
                    continue;
                }
                Whiteout::Invalid => {
                    tracing::warn!(
                        offset = at,
                        "image layer: ignoring a name that is no whiteout"
                    );
                    done.skipped += 1;
                    continue;
                }
                Whiteout::Opaque => {
                    cached = None;
                    if made.full {
                        return Err(at_entry(
                            at,
                            &format!("an opaque directory marker after more than {MAX_MADE} entries of its layer"),
                        ));
                    }
                    if let Some(d) = self.existing_dir(&parent)? {
                        let f = open_in(
                            d.as_raw_fd(),
                            Path::new(""),
                            libc::O_RDONLY | libc::O_DIRECTORY,
                        )?;
                        clear_dir(f, &parent, Some(&made))?;
                    }
                    done.written += 1;
                    continue;
                }
                Whiteout::Remove(hidden) => {
                    cached = None;
                    let target = parent.join(OsStr::from_bytes(hidden));
                    // Whiteouts hide what lower layers made, not what this one did.
                    if !made.full && made.contains(target.as_os_str().as_bytes()) {
                        done.skipped += 1;
                        continue;
                    }
                    if let Some(d) = self.existing_dir(&parent)? {
                        remove_at(d.as_raw_fd(), &cstr(hidden)?)?;
                    }
                    done.written += 1;
                    continue;
                }
            }
            let mode = entry.mode.unwrap_or(0o644) & 0o1777;
            let n = cstr(name.as_bytes())?;
            let link =
                || (!entry.link.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(&entry.link)));
            // The target of a hard link, resolved before the parent is made.
            let mut hard: Option<(OwnedFd, CString)> = None;
            if entry.kind == Kind::HardLink {
                let target = link();
                let Some(trel) = target
                    .as_deref()
                    .and_then(clean)
                    .filter(|t| !t.as_os_str().is_empty())
                else {
                    tracing::warn!(
                        offset = at,
                        "image layer: skipping a hard link out of the image"
                    );
                    done.skipped += 1;
                    continue;
                };
                let (tparent, tname) = split(&trel)?;
                let Ok(tfd) = open_in(
                    self.fd.as_raw_fd(),
                    &tparent,
                    libc::O_PATH | libc::O_DIRECTORY,
                ) else {
                    done.skipped += 1;
                    continue;
                };
                hard = Some((tfd, cstr(tname.as_bytes())?));
            }
            if entry.kind == Kind::Other {
                // Device nodes, fifos, and anything else: never made.
                done.skipped += 1;
                continue;
            }
            let hit = cached.as_ref().is_some_and(|(p, _)| *p == parent);
            if !hit {
                cached = Some((parent.clone(), self.dir(&parent)?));
                if layer {
                    made.note_dir(&parent);
                }
            }
            let pfd = cached.as_ref().expect("the parent").1.as_raw_fd();
            match entry.kind {
                Kind::Dir => {
                    make_dir_at(pfd, &n)?;
                    // The owner must be able to go on writing into it.
                    // SAFETY: fchmodat of a name in a directory we hold (a directory: no symlink).
                    unsafe { libc::fchmodat(pfd, n.as_ptr(), mode | 0o700, 0) };
                    self.chown_at(pfd, &n);
                }
                Kind::File => {
                    remove_at(pfd, &n)?;
                    // SAFETY: openat of a new name in a directory we hold.
                    let fd = unsafe {
                        libc::openat(
                            pfd,
                            n.as_ptr(),
                            libc::O_WRONLY
                                | libc::O_CREAT
                                | libc::O_EXCL
                                | libc::O_NOFOLLOW
                                | libc::O_CLOEXEC,
                            0o600,
                        )
                    };
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // SAFETY: a fresh descriptor.
                    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                    // Never more than it declared (and was charged for).
                    match &entry.sparse {
                        None => {
                            io::copy(&mut (&mut ar).take(entry.stored), &mut f)?;
                        }
                        Some(map) => {
                            for &(off, len) in map {
                                f.seek(io::SeekFrom::Start(off))?;
                                io::copy(&mut (&mut ar).take(len), &mut f)?;
                            }
                            f.set_len(entry.size)?;
                        }
                    }
                    if let Some((u, g)) = self.owner {
                        // SAFETY: fchown on our own descriptor.
                        unsafe { libc::fchown(f.as_raw_fd(), u, g) };
                    }
                    // SAFETY: fchmod on our own descriptor (after chown, which clears bits).
                    unsafe { libc::fchmod(f.as_raw_fd(), mode & 0o1777) };
                }
                Kind::Symlink => {
                    let Some(target) = link() else {
                        done.skipped += 1;
                        continue;
                    };
                    remove_at(pfd, &n)?;
                    let t = cpath(&target)?;
                    // SAFETY: symlinkat of a new name in a directory we hold.
                    if unsafe { libc::symlinkat(t.as_ptr(), pfd, n.as_ptr()) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    self.chown_at(pfd, &n);
                }
                Kind::HardLink => {
                    let (tfd, tn) = hard.take().expect("resolved above");
                    remove_at(pfd, &n)?;
                    // SAFETY: linkat between names in directories we hold (never following).
                    if unsafe { libc::linkat(tfd.as_raw_fd(), tn.as_ptr(), pfd, n.as_ptr(), 0) }
                        != 0
                    {
                        tracing::warn!(offset = at, error = %io::Error::last_os_error(), "image layer: hard link not made");
                        done.skipped += 1;
                        continue;
                    }
                }
                Kind::Other => unreachable!("skipped above"),
            }
            if layer {
                made.note(&rel);
            }
            done.written += 1;
        }
        Ok(done)
    }
}

fn split(rel: &Path) -> io::Result<(PathBuf, std::ffi::OsString)> {
    let name = rel
        .file_name()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?
        .to_owned();
    Ok((
        rel.parent().map(Path::to_path_buf).unwrap_or_default(),
        name,
    ))
}

/// Make `dst` a copy of the tree `src` that shares its files: directories are made anew,
/// files and symlinks are hard-linked (layers applied on `dst` replace files, never write
/// into them, so `src` stays as it was).
pub fn link_clone(src: &Path, dst: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(dst)?;
    let md = std::fs::symlink_metadata(src)?;
    std::fs::set_permissions(
        dst,
        std::os::unix::fs::PermissionsExt::from_mode(md.mode() & 0o7777),
    )?;
    let _ = std::os::unix::fs::lchown(dst, Some(md.uid()), Some(md.gid()));
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let ft = e.file_type()?;
        let to = dst.join(e.file_name());
        if ft.is_dir() {
            link_clone(&e.path(), &to)?;
        } else {
            std::fs::hard_link(e.path(), &to)?;
        }
    }
    Ok(())
}

/// A full copy of the tree `src` at `dst` (the fallback root where overlayfs is refused):
/// directories, files (data copied), symlinks; owners and modes kept.
pub fn deep_copy(src: &Path, dst: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(dst)?;
    let md = std::fs::symlink_metadata(src)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let ft = e.file_type()?;
        let to = dst.join(e.file_name());
        let m = e.metadata()?;
        if ft.is_dir() {
            deep_copy(&e.path(), &to)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(e.path())?, &to)?;
        } else if ft.is_file() {
            std::fs::copy(e.path(), &to)?;
            std::fs::set_permissions(
                &to,
                std::os::unix::fs::PermissionsExt::from_mode(m.mode() & 0o1777),
            )?;
        } else {
            continue;
        }
        let _ = std::os::unix::fs::lchown(&to, Some(m.uid()), Some(m.gid()));
    }
    std::fs::set_permissions(
        dst,
        std::os::unix::fs::PermissionsExt::from_mode(md.mode() & 0o7777),
    )?;
    let _ = std::os::unix::fs::lchown(dst, Some(md.uid()), Some(md.gid()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        // set_path refuses `..`; write the raw name like a hostile tool would.
        let name = path.as_bytes();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o777);
        let name = path.as_bytes();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        let t = target.as_bytes();
        h.as_old_mut().linkname[..t.len()].copy_from_slice(t);
        h.set_cksum();
        b.append(&h, &[][..]).unwrap();
    }

    #[test]
    fn whiteouts_opaque_dirs_and_links_apply() {
        let t = tempfile::tempdir().unwrap();
        let root = Root::open(&t.path().join("r"), None).unwrap();
        root.apply(
            &layer(|b| {
                file(b, "etc/gone", b"x", 0o644);
                file(b, "opq/old", b"x", 0o644);
                file(b, "bin/tool", b"tool", 0o4755);
                link(b, tar::EntryType::Link, "bin/hard", "bin/tool");
                link(b, tar::EntryType::Symlink, "bin/soft", "tool");
            })[..],
            &mut Budget::unlimited(),
        )
        .unwrap();
        root.apply(
            &layer(|b| {
                file(b, "etc/.wh.gone", b"", 0o644);
                file(b, "opq/.wh..wh..opq", b"", 0o644);
                file(b, "opq/new", b"y", 0o644);
            })[..],
            &mut Budget::unlimited(),
        )
        .unwrap();
        let r = t.path().join("r");
        assert!(!r.join("etc/gone").exists());
        assert!(r.join("etc").is_dir());
        assert!(!r.join("opq/old").exists());
        assert_eq!(std::fs::read(r.join("opq/new")).unwrap(), b"y");
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(r.join("bin/tool")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o755, "setuid dropped");
        assert_eq!(
            m.ino(),
            std::fs::metadata(r.join("bin/hard")).unwrap().ino()
        );
        assert_eq!(
            std::fs::read_link(r.join("bin/soft")).unwrap(),
            Path::new("tool")
        );
    }

    #[test]
    fn a_budget_caps_unpacked_bytes_and_entries() {
        let t = tempfile::tempdir().unwrap();
        let root = Root::open(&t.path().join("r"), None).unwrap();
        let big = layer(|b| file(b, "big", &vec![0u8; 4096], 0o644));
        // Bytes: one byte short of the file is refused before anything is written.
        let mut budget = Budget {
            bytes: 4095,
            entries: 10,
        };
        let e = root.apply(&big[..], &mut budget).unwrap_err();
        assert!(is_over_budget(&e), "{e}");
        assert!(!t.path().join("r/big").exists());
        // Exactly enough is taken, and spent.
        let mut budget = Budget {
            bytes: 4096,
            entries: 10,
        };
        root.apply(&big[..], &mut budget).unwrap();
        assert_eq!((budget.bytes, budget.entries), (0, 9));
        // Entries: what is skipped counts too.
        let many = layer(|b| {
            for i in 0..5 {
                file(b, &format!("f{i}"), b"", 0o644);
            }
        });
        let mut budget = Budget {
            bytes: u64::MAX,
            entries: 4,
        };
        let e = root.apply(&many[..], &mut budget).unwrap_err();
        assert!(is_over_budget(&e), "{e}");
        assert!(!t.path().join("r/f4").exists());
        // Other errors are not mistaken for it.
        assert!(!is_over_budget(&io::Error::other("x")));
    }

    #[test]
    fn hostile_layers_write_nothing_outside() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let root = Root::open(&t.path().join("r"), None).unwrap();
        let out = outside.display().to_string();
        let a = root
            .apply(
                &layer(|b| {
                    file(b, "../outside/dotdot", b"x", 0o644);
                    link(b, tar::EntryType::Symlink, "abs", &out);
                    link(b, tar::EntryType::Symlink, "rel", "../../outside");
                    link(b, tar::EntryType::Link, "hl", "../outside/victim");
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(tar::EntryType::Char);
                    h.set_path("dev/null2").unwrap();
                    h.set_size(0);
                    h.set_cksum();
                    b.append(&h, &[][..]).unwrap();
                })[..],
                &mut Budget::unlimited(),
            )
            .unwrap();
        assert!(a.skipped >= 3, "{a:?}");
        root.apply(
            &layer(|b| {
                file(b, "abs/through-abs", b"x", 0o644);
                file(b, "rel/through-rel", b"x", 0o644);
            })[..],
            &mut Budget::unlimited(),
        )
        .unwrap();
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        let r = t.path().join("r");
        // The writes stayed inside the image (where the links lead there, or in place of a
        // link that leads nowhere inside).
        let inside = |name: &str, link: &str, target: &Path| {
            r.join(link).join(name).exists() || r.join(target).join(name).exists()
        };
        assert!(inside(
            "through-abs",
            "abs",
            Path::new(out.trim_start_matches('/'))
        ));
        assert!(inside("through-rel", "rel", Path::new("outside")));
        assert!(!r.join("dev/null2").exists());
    }

    fn tree(r: &Path) -> Vec<String> {
        fn walk(base: &Path, p: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(p).unwrap().flatten() {
                let rel = e.path().strip_prefix(base).unwrap().display().to_string();
                let dir = e.file_type().unwrap().is_dir();
                out.push(if dir { format!("{rel}/") } else { rel });
                if dir {
                    walk(base, &e.path(), out);
                }
            }
        }
        let mut out = Vec::new();
        walk(r, r, &mut out);
        out.sort();
        out
    }

    #[test]
    fn opaque_markers_keep_what_their_layer_made_in_any_order() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("r");
        let root = Root::open(&r, None).unwrap();
        root.apply(
            &layer(|b| {
                file(b, "a/old", b"x", 0o644);
                file(b, "a/sub/lower", b"x", 0o644);
                file(b, "a/keepdir/x", b"x", 0o644);
                file(b, "b/lower", b"x", 0o644);
            })[..],
            &mut Budget::unlimited(),
        )
        .unwrap();
        root.apply(
            &layer(|b| {
                file(b, "a/new", b"y", 0o644);
                // Into a lower directory, without a header for it.
                file(b, "a/sub/made", b"y", 0o644);
                file(b, "a/.wh..wh..opq", b"", 0o644);
                file(b, "a/after", b"y", 0o644);
                // A marker before its siblings (the usual order).
                file(b, "b/.wh..wh..opq", b"", 0o644);
                file(b, "b/new", b"y", 0o644);
                // A whiteout of this layer's own file does not remove it.
                file(b, "c/mine", b"y", 0o644);
                file(b, "c/.wh.mine", b"", 0o644);
            })[..],
            &mut Budget::unlimited(),
        )
        .unwrap();
        assert_eq!(
            tree(&r),
            [
                "a/",
                "a/after",
                "a/new",
                "a/sub/",
                "a/sub/made",
                "b/",
                "b/new",
                "c/",
                "c/mine"
            ]
        );
    }

    #[test]
    fn an_opaque_marker_past_the_cap_on_made_paths_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let mut root = Root::open(&t.path().join("r"), None).unwrap();
        root.made_cap = 4;
        let l = layer(|b| {
            for i in 0..6 {
                file(b, &format!("d/f{i}"), b"", 0o644);
            }
            file(b, "d/.wh..wh..opq", b"", 0o644);
        });
        let e = root.apply(&l[..], &mut Budget::unlimited()).unwrap_err();
        assert!(e.to_string().contains("opaque directory marker"), "{e}");
        // Without an opaque marker, the cap is no limit.
        let l = layer(|b| {
            for i in 0..6 {
                file(b, &format!("e/f{i}"), b"", 0o644);
            }
            file(b, "e/.wh.f0", b"", 0o644);
        });
        root.apply(&l[..], &mut Budget::unlimited()).unwrap();
    }

    #[test]
    fn names_outside_the_whiteout_grammar_act_nowhere_and_archives_have_no_whiteouts() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("canary"), "x").unwrap();
        let r = t.path().join("r");
        let root = Root::open(&r, None).unwrap();
        let bad = [
            ".wh...",
            ".wh..",
            ".wh.",
            ".wh..wh.plnk",
            "d/.wh...",
            "d/.wh..",
        ];
        let a = root
            .apply(
                &layer(|b| {
                    file(b, "d/f", b"x", 0o644);
                    for n in bad {
                        file(b, n, b"", 0o644);
                    }
                })[..],
                &mut Budget::unlimited(),
            )
            .unwrap();
        assert_eq!(a.skipped, bad.len() as u64);
        assert!(t.path().join("canary").exists());
        assert_eq!(tree(&r), ["d/", "d/f"]);
        // An archive: whiteouts are neither acted on nor made.
        let a = root
            .extract(
                &layer(|b| {
                    file(b, "d/.wh.f", b"", 0o644);
                    file(b, ".wh..wh..opq", b"", 0o644);
                })[..],
                &mut Budget::unlimited(),
            )
            .unwrap();
        assert_eq!((a.written, a.skipped), (0, 2));
        assert_eq!(tree(&r), ["d/", "d/f"]);
    }

    #[test]
    fn sparse_files_are_written_as_their_map_says() {
        let mut h = [0u8; 512];
        h[..6].copy_from_slice(b"sparse");
        h[100..108].copy_from_slice(b"0000644\0");
        h[124..136].copy_from_slice(format!("{:011o}\0", 1024).as_bytes());
        h[156] = b'S';
        h[257..265].copy_from_slice(b"ustar  \0");
        // Two segments: 512 bytes at 4096, 512 at 10240; real size 16384.
        for (i, (off, len)) in [(4096u64, 512u64), (10240, 512)].iter().enumerate() {
            let at = 386 + i * 24;
            h[at..at + 12].copy_from_slice(format!("{off:011o}\0").as_bytes());
            h[at + 12..at + 24].copy_from_slice(format!("{len:011o}\0").as_bytes());
        }
        h[483..495].copy_from_slice(format!("{:011o}\0", 16384).as_bytes());
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| b as u32).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let mut l = h.to_vec();
        l.extend([b'a'; 512]);
        l.extend([b'b'; 512]);
        l.extend([0u8; 1024]);
        let t = tempfile::tempdir().unwrap();
        let root = Root::open(&t.path().join("r"), None).unwrap();
        let mut budget = Budget::unlimited();
        root.apply(&l[..], &mut budget).unwrap();
        assert_eq!(u64::MAX - budget.bytes, 16384, "the real size is charged");
        let got = std::fs::read(t.path().join("r/sparse")).unwrap();
        assert_eq!(got.len(), 16384);
        assert!(got[..4096].iter().all(|&b| b == 0));
        assert!(got[4096..4608].iter().all(|&b| b == b'a'));
        assert!(got[10240..10752].iter().all(|&b| b == b'b'));
        assert!(got[10752..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_deep_tree_is_removed_one_level_at_a_time() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("r");
        std::fs::create_dir(&r).unwrap();
        // 1500 levels (beyond PATH_MAX as a path), a file on each.
        let mut fd = OwnedFd::from(std::fs::File::open(&r).unwrap());
        let d = CString::new("dir").unwrap();
        let f = CString::new("f").unwrap();
        for _ in 0..1500 {
            // SAFETY: mkdirat/openat of names in a directory we hold.
            unsafe {
                assert_eq!(libc::mkdirat(fd.as_raw_fd(), d.as_ptr(), 0o755), 0);
                let x = libc::openat(
                    fd.as_raw_fd(),
                    f.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY,
                    0o644,
                );
                assert!(x >= 0);
                libc::close(x);
                let n = libc::openat(
                    fd.as_raw_fd(),
                    d.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY,
                );
                assert!(n >= 0);
                fd = OwnedFd::from_raw_fd(n);
            }
        }
        drop(fd);
        let top = OwnedFd::from(std::fs::File::open(t.path()).unwrap());
        remove_at(top.as_raw_fd(), &CString::new("r").unwrap()).unwrap();
        assert!(!r.exists());
    }

    #[test]
    fn many_files_of_one_deep_directory_resolve_it_once() {
        let t = tempfile::tempdir().unwrap();
        let root = Root::open(&t.path().join("r"), None).unwrap();
        let deep = "d/".repeat(1000);
        let l = layer(|b| {
            for i in 0..200 {
                let name = format!("{deep}f{i}");
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(1);
                h.set_mode(0o644);
                b.append_data(&mut h, &name, &b"x"[..]).unwrap();
            }
        });
        let a = root.apply(&l[..], &mut Budget::unlimited()).unwrap();
        assert_eq!(a.written, 200);
        let dir = t.path().join("r").join(deep.trim_end_matches('/'));
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 200);
    }
}
