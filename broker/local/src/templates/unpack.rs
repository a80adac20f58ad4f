//! Safe application of image layers (tar, gzip, zstd) onto a root directory.
//!
//! Every path of a layer is resolved beneath the root with `openat2(RESOLVE_IN_ROOT)`: a
//! symlink met on the way (absolute or relative, planted by this layer or an earlier one) is
//! resolved as it would be inside the image, never on the host, so nothing is ever written
//! outside the root. The final component is never followed (files are created `O_EXCL`
//! after removing what was there; that also keeps hard-link clones of a base image intact).
//! Entries with a `..` component are skipped; absolute names are taken relative to the root.
//! OCI whiteouts (`.wh.NAME`) remove NAME, opaque markers (`.wh..wh..opq`) empty the directory
//! of what lower layers put there. Hard links are made only to paths inside the root. Device
//! nodes and fifos are skipped. Setuid and setgid bits are dropped (a sandbox has one id, so
//! they could not change anything inside; on the host they would be a way into the sandbox's
//! id). Everything is owned by `owner` where one is given (a root daemon's sandbox id).
//! A [`Budget`] caps what layers may unpack to (the declared bytes of every entry, and the
//! number of entries), so a decompression bomb stops at the cap ([`is_over_budget`]).

use std::collections::HashSet;
use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// What applying a layer did.
#[derive(Debug, Default, Clone)]
pub struct Applied {
    /// Entries written.
    pub written: u64,
    /// Entries skipped (device nodes, fifos, `..` names, links that lead nowhere).
    pub skipped: u64,
}

/// What unpacking may still take: bytes (the declared size of every entry, whatever its
/// kind, so skipped entries count too) and entries. Shared by the layers of one image.
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

/// The compression of a layer, from its media type or its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

impl Compression {
    /// Sniff the magic bytes of a blob.
    pub fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// A reader of the tar stream inside a (possibly compressed) layer file.
pub fn layer_reader(path: &Path) -> io::Result<Box<dyn Read>> {
    let mut f = std::fs::File::open(path)?;
    let mut head = [0u8; 4];
    let n = read_full(&mut f, &mut head)?;
    let f = std::fs::File::open(path)?;
    let r = io::BufReader::with_capacity(256 * 1024, f);
    Ok(match Compression::sniff(&head[..n]) {
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(r)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(r)?),
        Compression::None => Box::new(r),
    })
}

fn read_full(f: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_IN_ROOT: u64 = 0x10;

/// `openat2(root, rel, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`.
fn open_in(root: RawFd, rel: &Path, flags: i32) -> io::Result<OwnedFd> {
    let p = if rel.as_os_str().is_empty() {
        CString::new(".").expect("dot")
    } else {
        cstr(rel)?
    };
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 with a valid C string and a struct on the stack.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root,
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
}

/// A directory `n` in `dir`: made, or kept if it is one already; a dangling symlink or a
/// file in its place is removed first (never followed).
fn make_dir_at(dir: RawFd, n: &CString) -> io::Result<()> {
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

fn lstat_at(dir: RawFd, name: &CString) -> io::Result<libc::stat> {
    // SAFETY: fstatat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// Remove `name` in `dir` (a directory recursively), never following a symlink.
fn remove_at(dir: RawFd, name: &CString) -> io::Result<()> {
    let st = match lstat_at(dir, name) {
        Ok(st) => st,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if is_dir(&st) {
        // SAFETY: openat of a name in a directory we hold.
        let fd = unsafe {
            libc::openat(
                dir,
                name.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor.
        let sub = unsafe { OwnedFd::from_raw_fd(fd) };
        empty_dir(sub.as_raw_fd(), &HashSet::new(), Path::new(""))?;
        // SAFETY: unlinkat of a name in a directory we hold.
        if unsafe { libc::unlinkat(dir, name.as_ptr(), libc::AT_REMOVEDIR) } != 0 {
            return Err(io::Error::last_os_error());
        }
    } else if unsafe { libc::unlinkat(dir, name.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The names in a directory (an fd).
fn names(dir: RawFd) -> io::Result<Vec<CString>> {
    // SAFETY: dup then fdopendir takes the duplicate.
    let d = unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) };
    if d < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fdopendir on our duplicate; lseek to read from the start.
    let dp = unsafe {
        libc::lseek(d, 0, libc::SEEK_SET);
        libc::fdopendir(d)
    };
    if dp.is_null() {
        // SAFETY: closing our duplicate.
        unsafe { libc::close(d) };
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: readdir on an open DIR*.
        let ent = unsafe { libc::readdir(dp) };
        if ent.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let n = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
        let b = n.to_bytes();
        if b != b"." && b != b".." {
            out.push(n.to_owned());
        }
    }
    // SAFETY: closing the DIR* (and our duplicate).
    unsafe { libc::closedir(dp) };
    Ok(out)
}

/// Remove everything in `dir` except what `keep` names (paths relative to the root, `at` is
/// this directory's).
fn empty_dir(dir: RawFd, keep: &HashSet<PathBuf>, at: &Path) -> io::Result<()> {
    for n in names(dir)? {
        let rel = at.join(std::ffi::OsStr::from_bytes(n.as_bytes()));
        if keep.contains(&rel) {
            continue;
        }
        remove_at(dir, &n)?;
    }
    Ok(())
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
        })
    }

    fn chown_at(&self, dir: RawFd, name: &CString) {
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
        let n = cstr(Path::new(&name))?;
        make_dir_at(pfd.as_raw_fd(), &n)?;
        self.chown_at(pfd.as_raw_fd(), &n);
        open_in(self.fd.as_raw_fd(), rel, libc::O_PATH | libc::O_DIRECTORY)
    }

    /// Apply one layer (a tar stream) on top of what the root holds, within `budget`.
    pub fn apply(&self, tar_stream: impl Read, budget: &mut Budget) -> io::Result<Applied> {
        let mut ar = tar::Archive::new(tar_stream);
        let mut done = Applied::default();
        // Paths this layer made: an opaque marker only hides what lower layers put there.
        let mut made: HashSet<PathBuf> = HashSet::new();
        for entry in ar.entries()? {
            let mut entry = entry?;
            budget.take(entry.size())?;
            let raw = entry.path()?.into_owned();
            let Some(rel) = clean(&raw) else {
                tracing::warn!(path = %raw.display(), "image layer: skipping a path with '..'");
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
            let name_b = name.as_bytes();
            if name_b == b".wh..wh..opq" {
                let d = self.dir(&parent)?;
                let f = open_in(
                    d.as_raw_fd(),
                    Path::new(""),
                    libc::O_RDONLY | libc::O_DIRECTORY,
                )?;
                empty_dir(f.as_raw_fd(), &made, &parent)?;
                done.written += 1;
                continue;
            }
            if let Some(hidden) = name_b.strip_prefix(b".wh.") {
                let d = self.dir(&parent)?;
                let n = CString::new(hidden)
                    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
                remove_at(d.as_raw_fd(), &n)?;
                done.written += 1;
                continue;
            }
            let kind = entry.header().entry_type();
            let mode = entry.header().mode().unwrap_or(0o644) & 0o1777;
            let n = cstr(Path::new(&name))?;
            match kind {
                tar::EntryType::Directory => {
                    let pfd = self.dir(&parent)?;
                    make_dir_at(pfd.as_raw_fd(), &n)?;
                    // The owner must be able to go on writing into it.
                    // SAFETY: fchmodat of a name in a directory we hold (a directory: no symlink).
                    unsafe { libc::fchmodat(pfd.as_raw_fd(), n.as_ptr(), mode | 0o700, 0) };
                    self.chown_at(pfd.as_raw_fd(), &n);
                }
                tar::EntryType::Regular
                | tar::EntryType::Continuous
                | tar::EntryType::GNUSparse => {
                    let pfd = self.dir(&parent)?;
                    remove_at(pfd.as_raw_fd(), &n)?;
                    // SAFETY: openat of a new name in a directory we hold.
                    let fd = unsafe {
                        libc::openat(
                            pfd.as_raw_fd(),
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
                    let want = entry.size();
                    io::copy(&mut (&mut entry).take(want), &mut f)?;
                    if let Some((u, g)) = self.owner {
                        // SAFETY: fchown on our own descriptor.
                        unsafe { libc::fchown(f.as_raw_fd(), u, g) };
                    }
                    // SAFETY: fchmod on our own descriptor (after chown, which clears bits).
                    unsafe { libc::fchmod(f.as_raw_fd(), mode & 0o1777) };
                }
                tar::EntryType::Symlink => {
                    let Some(target) = entry.link_name()?.map(|t| t.into_owned()) else {
                        done.skipped += 1;
                        continue;
                    };
                    let pfd = self.dir(&parent)?;
                    remove_at(pfd.as_raw_fd(), &n)?;
                    let t = cstr(&target)?;
                    // SAFETY: symlinkat of a new name in a directory we hold.
                    if unsafe { libc::symlinkat(t.as_ptr(), pfd.as_raw_fd(), n.as_ptr()) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    self.chown_at(pfd.as_raw_fd(), &n);
                }
                tar::EntryType::Link => {
                    let target = entry.link_name()?.map(|t| t.into_owned());
                    let Some(trel) = target
                        .as_deref()
                        .and_then(clean)
                        .filter(|t| !t.as_os_str().is_empty())
                    else {
                        tracing::warn!(path = %rel.display(), "image layer: skipping a hard link out of the image");
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
                    let tn = cstr(Path::new(&tname))?;
                    let pfd = self.dir(&parent)?;
                    remove_at(pfd.as_raw_fd(), &n)?;
                    // SAFETY: linkat between names in directories we hold (never following).
                    if unsafe {
                        libc::linkat(tfd.as_raw_fd(), tn.as_ptr(), pfd.as_raw_fd(), n.as_ptr(), 0)
                    } != 0
                    {
                        tracing::warn!(path = %rel.display(), error = %io::Error::last_os_error(), "image layer: hard link not made");
                        done.skipped += 1;
                        continue;
                    }
                }
                _ => {
                    // Device nodes, fifos, and anything else: never made.
                    done.skipped += 1;
                    continue;
                }
            }
            made.insert(rel);
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

/// Disk used by a tree (apparent sizes of files, each inode once).
pub fn tree_size(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = HashSet::new();
    fn walk(p: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
        let Ok(rd) = std::fs::read_dir(p) else {
            return 0;
        };
        let mut n = 0;
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                n += walk(&e.path(), seen);
            } else if seen.insert((m.dev(), m.ino())) {
                n += m.len();
            }
        }
        n
    }
    walk(p, &mut seen)
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
}
