//! The build context and `COPY` / `ADD` sources, read through descriptors only, and turned
//! into a layer.
//!
//! - The context directory is opened once; every source is opened beneath it with
//!   `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: a `..` that leaves it, or a symlink
//!   that leads out of it (absolute, or climbing above it), is refused (E2013), whatever
//!   the file system holds. Inside a copied directory, entries are opened from their
//!   parent's descriptor with `O_NOFOLLOW` and kept only when `fstat` says what the listing
//!   said; a symlink is copied as a symlink, refused when its target leaves the context.
//! - A stage's root (`COPY --from`) is read the same way with `RESOLVE_IN_ROOT`: its
//!   absolute symlinks resolve inside it, never on the host.
//! - `.dockerignore` ([`Ignore`]): patterns with `*`, `?`, `**`, and `!` exceptions, the last
//!   match winning; a pattern that matches a directory excludes what is under it.
//! - Every entry and byte copied is taken from a [`Budget`] (the context's caps); an `ADD`ed
//!   archive is read with the bounded tar reader ([`super::super::tarstream`]) and its
//!   entries count against the same budget (a decompression bomb stops at the cap).
//! - The layer's digest is not the cache key: [`Layer::key`] hashes what was selected
//!   (paths, kinds, modes, owners, contents; not modification times).

use super::super::tarstream;
use super::super::unpack::{
    fstat, openat2, Budget, RESOLVE_BENEATH, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS,
};
use sha2::{Digest, Sha256};
use std::ffi::{CString, OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Why a source cannot be used.
#[derive(Debug)]
pub enum CopyError {
    /// It leaves the context (E2013): the path as written, and why.
    Escapes(String, String),
    /// It is not there (or not readable): the path and why.
    Missing(String, String),
    /// The context's caps are reached (E2013 / E8012).
    TooBig(&'static str),
    /// An archive that cannot be read (`ADD`).
    BadArchive(String, String),
    /// Anything else.
    Io(io::Error),
}

impl From<io::Error> for CopyError {
    fn from(e: io::Error) -> CopyError {
        if let Some(o) = e
            .get_ref()
            .and_then(|x| x.downcast_ref::<super::super::unpack::OverBudget>())
        {
            return CopyError::TooBig(o.0);
        }
        CopyError::Io(e)
    }
}

/// `.dockerignore`.
#[derive(Clone, Debug, Default)]
pub struct Ignore {
    rules: Vec<(bool, Vec<String>)>,
}

impl Ignore {
    /// From the text of a `.dockerignore`.
    pub fn parse(text: &str) -> Ignore {
        let mut rules = Vec::new();
        for l in text.lines() {
            let l = l.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let (neg, p) = match l.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, l),
            };
            let segs: Vec<String> = p
                .split('/')
                .filter(|s| !s.is_empty() && *s != ".")
                .map(str::to_owned)
                .collect();
            if !segs.is_empty() {
                rules.push((neg, segs));
            }
        }
        Ignore { rules }
    }

    /// Whether the context path `rel` (`a/b/c`) is excluded.
    pub fn excluded(&self, rel: &str) -> bool {
        if self.rules.is_empty() {
            return false;
        }
        let parts: Vec<&str> = rel.split('/').filter(|s| !s.is_empty()).collect();
        let mut out = false;
        for (neg, pat) in &self.rules {
            let pat: Vec<&str> = pat.iter().map(String::as_str).collect();
            // The path, or a directory above it.
            let hit = (1..=parts.len()).any(|n| path_match(&pat, &parts[..n]));
            if hit {
                out = !neg;
            }
        }
        out
    }
}

fn path_match(pat: &[&str], parts: &[&str]) -> bool {
    match pat.first() {
        None => parts.is_empty(),
        Some(&"**") => {
            path_match(&pat[1..], parts) || (!parts.is_empty() && path_match(pat, &parts[1..]))
        }
        Some(p) => !parts.is_empty() && glob(p, parts[0]) && path_match(&pat[1..], &parts[1..]),
    }
}

/// One name against a pattern of `*`, `?`, `[...]` and `\` escapes.
pub fn glob(p: &str, s: &str) -> bool {
    let p: Vec<char> = p.chars().collect();
    let s: Vec<char> = s.chars().collect();
    fn m(p: &[char], s: &[char]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some('*') => (0..=s.len()).any(|k| m(&p[1..], &s[k..])),
            Some('?') => !s.is_empty() && m(&p[1..], &s[1..]),
            Some('[') => {
                let Some(end) = p.iter().skip(1).position(|&c| c == ']').map(|e| e + 1) else {
                    return !s.is_empty() && s[0] == '[' && m(&p[1..], &s[1..]);
                };
                if s.is_empty() {
                    return false;
                }
                let mut set = &p[1..end];
                let neg = set.first().is_some_and(|&c| c == '^' || c == '!');
                if neg {
                    set = &set[1..];
                }
                let mut hit = false;
                let mut i = 0;
                while i < set.len() {
                    if i + 2 < set.len() && set[i + 1] == '-' {
                        hit |= set[i] <= s[0] && s[0] <= set[i + 2];
                        i += 3;
                    } else {
                        hit |= set[i] == s[0];
                        i += 1;
                    }
                }
                hit != neg && m(&p[end + 1..], &s[1..])
            }
            Some('\\') if p.len() > 1 => !s.is_empty() && s[0] == p[1] && m(&p[2..], &s[1..]),
            Some(&c) => !s.is_empty() && s[0] == c && m(&p[1..], &s[1..]),
        }
    }
    m(&p, &s)
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// A source root: the context directory or a stage's root.
pub struct Source {
    fd: OwnedFd,
    /// A stage's root (absolute links resolve inside it) rather than the context.
    in_root: bool,
    ignore: Ignore,
}

impl Source {
    /// The context directory `dir` (opened once, `.dockerignore` read from it).
    pub fn context(dir: &Path) -> io::Result<Source> {
        let fd = openat2(
            libc::AT_FDCWD,
            dir,
            libc::O_PATH | libc::O_DIRECTORY,
            RESOLVE_NO_MAGICLINKS,
        )?;
        let mut s = Source {
            fd,
            in_root: false,
            ignore: Ignore::default(),
        };
        if let Ok(b) = s.read_small(".dockerignore", 1 << 20) {
            s.ignore = Ignore::parse(&String::from_utf8_lossy(&b));
        }
        Ok(s)
    }

    /// A stage's root directory.
    pub fn root(dir: &Path) -> io::Result<Source> {
        let fd = openat2(
            libc::AT_FDCWD,
            dir,
            libc::O_PATH | libc::O_DIRECTORY,
            RESOLVE_NO_MAGICLINKS,
        )?;
        Ok(Source {
            fd,
            in_root: true,
            ignore: Ignore::default(),
        })
    }

    fn resolve(&self) -> u64 {
        RESOLVE_NO_MAGICLINKS
            | if self.in_root {
                RESOLVE_IN_ROOT
            } else {
                RESOLVE_BENEATH
            }
    }

    /// Read a small file beneath the root (the Dockerfile, `.dockerignore`).
    pub fn read_small(&self, rel: &str, max: u64) -> Result<Vec<u8>, CopyError> {
        let rel = clean_rel(rel).ok_or_else(|| {
            CopyError::Escapes(rel.to_owned(), "a '..' that leaves the context".into())
        })?;
        let fd = self.open(&rel, libc::O_RDONLY)?;
        let st = fstat(fd.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(CopyError::Missing(rel, "not a regular file".into()));
        }
        let f = std::fs::File::from(fd);
        super::super::read_capped(f, max)
            .map_err(|e| CopyError::Missing(rel.clone(), e.to_string()))
    }

    fn open(&self, rel: &str, flags: i32) -> Result<OwnedFd, CopyError> {
        openat2(
            self.fd.as_raw_fd(),
            Path::new(if rel.is_empty() { "." } else { rel }),
            // openat2 takes no other flag with O_PATH.
            if flags & libc::O_PATH != 0 {
                flags
            } else {
                flags | libc::O_NOCTTY | libc::O_NONBLOCK
            },
            self.resolve(),
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EXDEV) | Some(libc::ELOOP) => CopyError::Escapes(
                rel.to_owned(),
                "a symlink on the way leads out of the context".into(),
            ),
            _ => CopyError::Missing(rel.to_owned(), e.to_string()),
        })
    }

    /// The entries a source pattern selects: context paths (globs expanded, sorted).
    fn select(&self, src: &str) -> Result<Vec<String>, CopyError> {
        let rel = clean_rel(src).ok_or_else(|| {
            CopyError::Escapes(src.to_owned(), "a '..' that leaves the context".into())
        })?;
        if !has_glob(&rel) {
            return Ok(vec![rel]);
        }
        let segs: Vec<&str> = rel.split('/').collect();
        let mut found = vec![String::new()];
        for seg in segs {
            let mut next = Vec::new();
            for base in &found {
                if !has_glob(seg) {
                    next.push(join(base, seg));
                    continue;
                }
                let Ok(dfd) = self.open(base, libc::O_RDONLY | libc::O_DIRECTORY) else {
                    continue;
                };
                for name in list(&dfd)? {
                    let n = name.to_string_lossy();
                    if glob(seg, &n) {
                        next.push(join(base, &n));
                    }
                }
            }
            found = next;
        }
        found.retain(|p| !self.ignore.excluded(p));
        found.sort();
        if found.is_empty() {
            return Err(CopyError::Missing(src.to_owned(), "no file matches".into()));
        }
        Ok(found)
    }
}

fn join(base: &str, name: &str) -> String {
    if base.is_empty() {
        name.to_owned()
    } else {
        format!("{base}/{name}")
    }
}

/// A relative path without `.` and empty parts; None when a `..` climbs above the start.
pub fn clean_rel(p: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for s in p.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            s => out.push(s),
        }
    }
    Some(out.join("/"))
}

/// An absolute path without `.`, `..` or empty parts (`..` stops at `/`).
pub fn clean_abs(p: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for s in p.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

fn list(dfd: &OwnedFd) -> io::Result<Vec<OsString>> {
    // The directory as opened (the descriptor's own, through /proc: no path is walked).
    let mut v: Vec<OsString> = std::fs::read_dir(format!("/proc/self/fd/{}", dfd.as_raw_fd()))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    v.sort();
    Ok(v)
}

fn lstat_at(dfd: RawFd, name: &OsStr) -> io::Result<libc::stat> {
    let c =
        CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    super::super::unpack::lstat_at(dfd, &c)
}

fn readlink_at(dfd: RawFd, name: &OsStr) -> io::Result<Vec<u8>> {
    let c =
        CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: readlinkat into our buffer of its length.
    let n = unsafe { libc::readlinkat(dfd, c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// What a `COPY` / `ADD` does with ownership and modes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Meta {
    /// `--chown` as numbers.
    pub owner: Option<(u32, u32)>,
    /// `--chmod`.
    pub mode: Option<u32>,
}

/// A layer being written: the tar and the cache key's hash of what went in.
pub struct Layer<W: Write> {
    /// The tar.
    pub tar: tar::Builder<W>,
    key: Sha256,
    /// Entries written.
    pub entries: u64,
    budget: Budget,
    written_dirs: std::collections::HashSet<String>,
}

impl<W: Write> Layer<W> {
    /// A layer written to `w`, within `budget`.
    pub fn new(w: W, budget: Budget) -> Layer<W> {
        let mut tar = tar::Builder::new(w);
        tar.mode(tar::HeaderMode::Deterministic);
        Layer {
            tar,
            key: Sha256::new(),
            entries: 0,
            budget,
            written_dirs: Default::default(),
        }
    }

    /// The hash of what went in (hex).
    pub fn key(&self) -> String {
        super::super::hex(&self.key.clone().finalize())
    }

    /// What is left of the budget.
    pub fn budget_left(&self) -> Budget {
        self.budget
    }

    /// Finish the tar; the writer back.
    pub fn finish(self) -> io::Result<W> {
        self.tar.into_inner()
    }

    fn hdr(
        &mut self,
        path: &str,
        kind: tar::EntryType,
        mode: u32,
        size: u64,
        mtime: i64,
        meta: &Meta,
    ) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        let mode = meta.mode.unwrap_or(mode & 0o7777);
        h.set_mode(mode);
        let (u, g) = meta.owner.unwrap_or((0, 0));
        h.set_uid(u as u64);
        h.set_gid(g as u64);
        h.set_mtime(mtime.max(0) as u64);
        h.set_entry_type(kind);
        h.set_size(size);
        self.key.update(path.as_bytes());
        self.key.update([0]);
        self.key
            .update(format!("{:?}:{mode:o}:{u}:{g}:{size}", kind.as_byte()).as_bytes());
        h
    }

    /// A directory entry for `path` (no leading `/`), once.
    pub fn dir(&mut self, path: &str, mode: u32, meta: &Meta) -> io::Result<()> {
        if path.is_empty() || !self.written_dirs.insert(path.to_owned()) {
            return Ok(());
        }
        self.budget.take(0)?;
        let mut h = self.hdr(path, tar::EntryType::Directory, mode, 0, 0, meta);
        self.tar
            .append_data(&mut h, format!("{path}/"), io::empty())?;
        self.entries += 1;
        Ok(())
    }

    /// A file entry from a reader of `size` bytes.
    pub fn file(
        &mut self,
        path: &str,
        mode: u32,
        size: u64,
        mtime: i64,
        meta: &Meta,
        data: impl Read,
    ) -> io::Result<()> {
        self.budget.take(size)?;
        let mut h = self.hdr(path, tar::EntryType::Regular, mode, size, mtime, meta);
        let mut hr = HashRead {
            inner: data.take(size),
            hash: &mut self.key,
            n: 0,
        };
        self.tar.append_data(&mut h, path, &mut hr)?;
        if hr.n != size {
            return Err(io::Error::other(format!(
                "{path} changed while it was read"
            )));
        }
        self.entries += 1;
        Ok(())
    }

    /// A symlink entry.
    pub fn symlink(&mut self, path: &str, target: &[u8], meta: &Meta) -> io::Result<()> {
        self.budget.take(target.len() as u64)?;
        let mut h = self.hdr(path, tar::EntryType::Symlink, 0o777, 0, 0, meta);
        self.key.update(target);
        self.tar
            .append_link(&mut h, path, Path::new(OsStr::from_bytes(target)))?;
        self.entries += 1;
        Ok(())
    }
}

struct HashRead<'a, R> {
    inner: R,
    hash: &'a mut Sha256,
    n: u64,
}

impl<R: Read> Read for HashRead<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.n += n as u64;
        Ok(n)
    }
}

/// Where a copy goes, and what is there already (the image's root so far).
pub struct Dest<'a> {
    /// The destination (absolute, cleaned), as the Dockerfile gave it.
    pub path: String,
    /// It ended with `/`.
    pub trailing_slash: bool,
    /// Whether an absolute path of the image is a directory already.
    pub is_dir: &'a dyn Fn(&str) -> bool,
}

/// Write the parents of `path` (absolute) that the image lacks as directories.
fn parents<W: Write>(l: &mut Layer<W>, d: &Dest<'_>, path: &str) -> io::Result<()> {
    let mut cur = String::new();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for p in &parts[..parts.len().saturating_sub(1)] {
        cur = join(&cur, p);
        if !(d.is_dir)(&format!("/{cur}")) {
            l.dir(&cur, 0o755, &Meta::default())?;
        }
    }
    Ok(())
}

/// `COPY srcs dst` (and `ADD`, which extracts local tar archives) from `src` into the layer.
pub fn copy<W: Write>(
    l: &mut Layer<W>,
    src: &Source,
    srcs: &[String],
    d: &Dest<'_>,
    meta: &Meta,
    add: bool,
) -> Result<(), CopyError> {
    let mut selected = Vec::new();
    let mut many = srcs.len() > 1;
    for s in srcs {
        let v = src.select(s)?;
        many |= has_glob(s);
        selected.extend(v);
    }
    let into_dir = many || d.trailing_slash || (d.is_dir)(&d.path);
    for rel in selected {
        let fd = src.open(&rel, libc::O_PATH)?;
        let st = fstat(fd.as_raw_fd())?;
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if is_dir {
            // A directory's contents go into the destination.
            let dst = d.path.trim_start_matches('/').to_owned();
            parents(l, d, &d.path)?;
            if !(d.is_dir)(&d.path) {
                l.dir(&dst, 0o755, meta)?;
            }
            let dfd = src.open(&rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
            walk(l, src, &dfd, &rel, &dst, meta, 0, &mut Vec::new())?;
            continue;
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(CopyError::Missing(
                rel,
                "not a regular file or directory".into(),
            ));
        }
        if src.ignore.excluded(&rel) {
            return Err(CopyError::Missing(rel, "excluded by .dockerignore".into()));
        }
        let f = std::fs::File::from(src.open(&rel, libc::O_RDONLY)?);
        let base = rel.rsplit('/').next().unwrap_or(&rel).to_owned();
        if add {
            let mut head = [0u8; 512];
            let n = read_full(&f, &mut head)?;
            if is_archive(&head[..n]) {
                let mut f = f;
                std::io::Seek::rewind(&mut f)?;
                let dst = d.path.clone();
                parents(l, d, &format!("{}/x", dst.trim_end_matches('/')))?;
                if !(d.is_dir)(&dst) {
                    l.dir(dst.trim_start_matches('/'), 0o755, meta)?;
                }
                extract(l, f, &rel, dst.trim_start_matches('/'), meta)?;
                continue;
            }
        }
        let target = if into_dir {
            format!("{}/{base}", d.path.trim_end_matches('/'))
        } else {
            d.path.clone()
        };
        parents(l, d, &target)?;
        let mut f = f;
        std::io::Seek::rewind(&mut f)?;
        l.file(
            target.trim_start_matches('/'),
            st.st_mode,
            st.st_size as u64,
            st.st_mtime,
            meta,
            f,
        )?;
    }
    Ok(())
}

fn read_full(mut f: &std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn is_archive(head: &[u8]) -> bool {
    !matches!(
        super::super::Compression::sniff(head),
        super::super::Compression::None
    ) || (head.len() >= 262 && &head[257..262] == b"ustar")
}

/// The entries under the directory `dfd` (context path `rel`) into `dst`. An excluded
/// directory is still walked when `.dockerignore` has exceptions (`!`): it is written
/// (from `pending`) only before something under it that is not excluded.
#[allow(clippy::too_many_arguments)]
fn walk<W: Write>(
    l: &mut Layer<W>,
    src: &Source,
    dfd: &OwnedFd,
    rel: &str,
    dst: &str,
    meta: &Meta,
    depth: usize,
    pending: &mut Vec<(String, u32)>,
) -> Result<(), CopyError> {
    if depth > 256 {
        return Err(CopyError::Escapes(
            rel.to_owned(),
            "directories nested too deep".into(),
        ));
    }
    let exceptions = src.ignore.rules.iter().any(|r| r.0);
    for name in list(dfd)? {
        let crel = join(rel, &name.to_string_lossy());
        let excluded = src.ignore.excluded(&crel);
        let cdst = join(dst, &name.to_string_lossy());
        let Ok(st) = lstat_at(dfd.as_raw_fd(), &name) else {
            continue;
        };
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if excluded && !(is_dir && exceptions) {
            continue;
        }
        if !excluded {
            for (p, m) in pending.drain(..) {
                l.dir(&p, m, meta)?;
            }
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR if excluded => {
                let Ok(cfd) = openat2(
                    dfd.as_raw_fd(),
                    Path::new(&name),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
                ) else {
                    continue;
                };
                let n = pending.len();
                pending.push((cdst.clone(), st.st_mode));
                walk(l, src, &cfd, &crel, &cdst, meta, depth + 1, pending)?;
                pending.truncate(n);
            }
            libc::S_IFDIR => {
                let Ok(cfd) = openat2(
                    dfd.as_raw_fd(),
                    Path::new(&name),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
                ) else {
                    continue;
                };
                l.dir(&cdst, st.st_mode, meta)?;
                walk(l, src, &cfd, &crel, &cdst, meta, depth + 1, pending)?;
            }
            libc::S_IFREG => {
                let Ok(fd) = openat2(
                    dfd.as_raw_fd(),
                    Path::new(&name),
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
                    RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
                ) else {
                    continue;
                };
                let st = fstat(fd.as_raw_fd())?;
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    continue;
                }
                l.file(
                    &cdst,
                    st.st_mode,
                    st.st_size as u64,
                    st.st_mtime,
                    meta,
                    std::fs::File::from(fd),
                )?;
            }
            libc::S_IFLNK => {
                let target = readlink_at(dfd.as_raw_fd(), &name)?;
                if !src.in_root && link_escapes(&crel, &target) {
                    return Err(CopyError::Escapes(
                        crel,
                        "a symlink whose target is outside the context".into(),
                    ));
                }
                l.symlink(&cdst, &target, meta)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether a symlink at context path `at` pointing to `target` leaves the context.
fn link_escapes(at: &str, target: &[u8]) -> bool {
    if target.starts_with(b"/") {
        return true;
    }
    let dir = at.rsplit_once('/').map_or("", |(d, _)| d);
    clean_rel(&format!("{dir}/{}", String::from_utf8_lossy(target))).is_none()
}

/// An `ADD`ed tar archive's entries under `dst` (bounded: every entry and byte from the
/// layer's budget; `..` names and absolute links are dropped; devices are skipped).
fn extract<W: Write>(
    l: &mut Layer<W>,
    f: std::fs::File,
    rel: &str,
    dst: &str,
    meta: &Meta,
) -> Result<(), CopyError> {
    let bad = |e: io::Error| -> CopyError {
        if super::super::unpack::is_over_budget(&e) {
            CopyError::from(e)
        } else {
            CopyError::BadArchive(rel.to_owned(), e.to_string())
        }
    };
    let r = super::super::layer_reader(f).map_err(bad)?;
    let mut t = tarstream::Reader::new(r);
    while let Some(e) = t.next().map_err(bad)? {
        let Some(p) = super::super::unpack::clean(Path::new(OsStr::from_bytes(&e.path))) else {
            continue;
        };
        let p = join(dst, &p.to_string_lossy());
        let mode = e.mode.unwrap_or(0o644);
        match e.kind {
            tarstream::Kind::Dir => l.dir(&p, mode, meta).map_err(bad)?,
            tarstream::Kind::File if e.sparse.is_none() => {
                l.file(&p, mode, e.size, 0, meta, &mut t).map_err(bad)?
            }
            tarstream::Kind::Symlink => {
                // Kept as written: it resolves inside whatever root the layer is applied to.
                l.symlink(&p, &e.link.clone(), meta).map_err(bad)?
            }
            _ => {
                // Hard links, devices, sparse files: counted, not kept.
                l.budget.take(e.size).map_err(bad)?;
            }
        }
    }
    Ok(())
}

/// `--chown` as numbers: `uid[:gid]`, or names of the image's `/etc/passwd` and
/// `/etc/group` (read by `read`).
pub fn owner(spec: &str, read: &dyn Fn(&str) -> Option<String>) -> Result<(u32, u32), String> {
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let table = |name: &str| -> Vec<Vec<String>> {
        read(name)
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(':').map(str::to_owned).collect())
            .collect()
    };
    let passwd = table("passwd");
    let (uid, primary) = match u.parse::<u32>() {
        Ok(n) => (n, None),
        Err(_) => {
            let f = passwd
                .iter()
                .find(|f| f.first().map(String::as_str) == Some(u))
                .ok_or_else(|| format!("--chown: no user {u:?} in the image's /etc/passwd"))?;
            (
                f.get(2)
                    .and_then(|x| x.parse().ok())
                    .ok_or("bad /etc/passwd")?,
                f.get(3).and_then(|x| x.parse::<u32>().ok()),
            )
        }
    };
    let gid = match g {
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => table("group")
                .iter()
                .find(|f| f.first().map(String::as_str) == Some(g))
                .and_then(|f| f.get(2)?.parse().ok())
                .ok_or_else(|| format!("--chown: no group {g:?} in the image's /etc/group"))?,
        },
        None => primary.unwrap_or(uid),
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerignore_patterns() {
        let i = Ignore::parse("# c\nnode_modules\n*.log\n!keep.log\n**/tmp\ndocs/**/*.md\n");
        assert!(i.excluded("node_modules"));
        assert!(i.excluded("node_modules/a/b"));
        assert!(i.excluded("x.log"));
        assert!(!i.excluded("keep.log"));
        assert!(!i.excluded("sub/x.log"));
        assert!(i.excluded("a/b/tmp/c"));
        assert!(i.excluded("tmp"));
        assert!(i.excluded("docs/a/b/x.md"));
        assert!(i.excluded("docs/x.md"));
        assert!(!i.excluded("docs/x.txt"));
        assert!(!i.excluded("src/main.rs"));
    }

    #[test]
    fn globs_and_paths() {
        assert!(glob("*.rs", "main.rs"));
        assert!(!glob("*.rs", "main.c"));
        assert!(glob("f?o", "foo"));
        assert!(glob("[a-c]x", "bx"));
        assert!(!glob("[!a-c]x", "bx"));
        assert_eq!(clean_rel("./a/../b/"), Some("b".into()));
        assert_eq!(clean_rel("../x"), None);
        assert_eq!(clean_rel("a/../../x"), None);
        assert_eq!(clean_abs("/a/../../b/./c/"), "/b/c");
        assert!(link_escapes("a/l", b"../../x"));
        assert!(!link_escapes("a/l", b"../x"));
        assert!(link_escapes("l", b"/etc/passwd"));
    }

    #[test]
    fn a_context_is_read_beneath_its_root() {
        let d = tempfile::tempdir().unwrap();
        let c = d.path().join("ctx");
        std::fs::create_dir_all(c.join("sub")).unwrap();
        std::fs::write(c.join("sub/a.txt"), "A").unwrap();
        std::fs::write(c.join("skip.log"), "L").unwrap();
        std::fs::write(c.join(".dockerignore"), "*.log\n").unwrap();
        std::fs::write(d.path().join("secret"), "S").unwrap();
        std::os::unix::fs::symlink("../secret", c.join("out")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", c.join("sub/abs")).unwrap();
        let s = Source::context(&c).unwrap();
        let none = |_: &str| false;
        let dest = Dest {
            path: "/app".into(),
            trailing_slash: true,
            is_dir: &none,
        };
        let mut l = Layer::new(Vec::new(), Budget::unlimited());
        let r = copy(&mut l, &s, &["out".into()], &dest, &Meta::default(), false);
        assert!(matches!(r, Err(CopyError::Escapes(..))), "{r:?}");
        assert!(matches!(
            copy(
                &mut l,
                &s,
                &["../secret".into()],
                &dest,
                &Meta::default(),
                false
            ),
            Err(CopyError::Escapes(..))
        ));
        assert!(matches!(
            copy(&mut l, &s, &["sub".into()], &dest, &Meta::default(), false),
            Err(CopyError::Escapes(..))
        ));
        std::fs::remove_file(c.join("sub/abs")).unwrap();
        std::fs::remove_file(c.join("out")).unwrap();
        let mut l = Layer::new(Vec::new(), Budget::unlimited());
        copy(&mut l, &s, &[".".into()], &dest, &Meta::default(), false).unwrap();
        let tar = l.finish().unwrap();
        let mut names = Vec::new();
        let mut a = tar::Archive::new(&tar[..]);
        for e in a.entries().unwrap() {
            names.push(e.unwrap().path().unwrap().to_string_lossy().into_owned());
        }
        assert!(names.contains(&"app/sub/a.txt".to_string()), "{names:?}");
        assert!(!names.iter().any(|n| n.contains("skip.log")), "{names:?}");
        let mut l = Layer::new(
            Vec::new(),
            Budget {
                bytes: 1 << 20,
                entries: 2,
            },
        );
        assert!(matches!(
            copy(&mut l, &s, &[".".into()], &dest, &Meta::default(), false),
            Err(CopyError::TooBig(_))
        ));
    }
}
