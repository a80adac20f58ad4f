//! The `files/*` operations of the builtin `local` provider, confined beneath the sandbox
//! (docs/design.md#api, docs/design.md#local).
//!
//! Every function is synchronous (the caller runs it in `spawn_blocking`) and takes
//! sandbox-view paths: `/workspace/a.txt`, `/tmp/x`, or `a.txt` (= `/workspace/a.txt`).
//! [`split_path`] maps a path onto an [`Area`] and a normalized relative path; then **all**
//! path walking is done by the kernel with `openat2(2)` relative to an `O_PATH` fd of the
//! area directory, with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`. So `..` and symlinks
//! that leave the area (absolute links always, relative ones when they climb out) are
//! refused (`EXDEV`/`ELOOP` => E4002), and the final operations are done on fds
//! (`pread`, `pwrite`, `fstat`, `mkdirat`, `unlinkat`, `renameat`, `fchmod`, `fdopendir`).
//! Host paths never appear in results or errors: only sandbox-view paths ([`view_path`]).
//!
//! Whole-file writes (`write` without offset or append, `upload`) never leave a
//! half-written file: the data goes to an anonymous `O_TMPFILE` in the target's directory
//! (or a uniquely named temp file where the filesystem lacks `O_TMPFILE`), which is then
//! linked under a temporary name and renamed over the target. The temporary names follow
//! [`TEMP_PREFIX`]; `files/watch` hides them and reports the final rename as `created` or
//! `modified`. When the target is a symlink, the link is resolved (beneath the area) and
//! the file it points to is replaced, so links stay links.

use super::{split_path, view_path, Area, SandboxDirs};
use abx_protocol::{AbxError, ErrorCode};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::ffi::{CStr, CString, OsStr};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) mod sys;
mod transfer;

pub(crate) use sys::*;
pub use transfer::{download, upload};

/// The largest chunk `files/read` returns (and its default length); a larger `length` is E1004.
pub const MAX_CHUNK: u64 = abx_protocol::limits::MAX_READ_LENGTH;

/// The most entries `files/list` returns; a larger (recursive) listing stops there and
/// returns what it has (breadth first, then sorted by path), without an error.
pub const MAX_LIST_ENTRIES: usize = 100_000;

/// The buffer of `upload`/`download` (and the progress granularity).
const TRANSFER_BUF: usize = 128 * 1024;
/// Progress is reported at most every this many bytes.
const PROGRESS_STEP: u64 = 1024 * 1024;

/// Every temporary name of a whole-file write starts with this prefix and ends with
/// [`TEMP_SUFFIX`]; the letter after it is `c` (the target did not exist) or `m` (it did).
pub const TEMP_PREFIX: &str = ".abx-tmp-";
/// See [`TEMP_PREFIX`].
pub const TEMP_SUFFIX: &str = ".tmp";

/// How every path of the sandbox is resolved.
pub(crate) const RESOLVE: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
/// For walking trees: never follow any symlink (used below an already resolved dir).
pub(crate) const RESOLVE_NOLINKS: u64 = RESOLVE | libc::RESOLVE_NO_SYMLINKS;

// ---------------------------------------------------------------------------------------
// Results

/// The result of [`read`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadResult {
    /// The chunk, as text or base64.
    pub data: String,
    /// `"utf-8"` or `"base64"`.
    pub encoding: String,
    /// The size of the whole file.
    pub size: u64,
    /// Whether the chunk reaches the end of the file.
    pub eof: bool,
    /// Where the chunk starts.
    pub offset: u64,
}

/// One entry of [`list`] and the result of [`stat`]: the API's type, built here.
pub use abx_protocol::api::FileEntry as Entry;

pub use abx_home::util::rfc3339;

// ---------------------------------------------------------------------------------------
// Errors

fn path_err(code: ErrorCode, view: &str, sandbox: &str) -> AbxError {
    AbxError::new(code, &[("path", view), ("sandbox", sandbox)])
}

/// The error of an operation on `view` that failed with `e` (not a path resolution).
pub(crate) fn op_err(e: &io::Error, view: &str, sandbox: &str) -> AbxError {
    let code = match e.raw_os_error() {
        Some(libc::ENOENT) => ErrorCode::FileNotFound,
        Some(libc::EISDIR) => ErrorCode::IsADirectory,
        Some(libc::ENOTDIR) => ErrorCode::NotADirectory,
        Some(libc::ENOTEMPTY) => ErrorCode::DirectoryNotEmpty,
        Some(libc::EEXIST) => ErrorCode::FileExists,
        Some(libc::EACCES | libc::EPERM) => ErrorCode::FilePermissionDenied,
        Some(libc::ENAMETOOLONG) => ErrorCode::PathTooLong,
        Some(libc::ENOSPC) => ErrorCode::DiskFull,
        Some(libc::EDQUOT) => ErrorCode::QuotaExceeded,
        // A read-only place of the sandbox: its system directories, an `ro` mount.
        Some(libc::EROFS) => ErrorCode::ReadOnly,
        Some(libc::EFBIG | libc::EOVERFLOW) => {
            return offset_err(
                view,
                sandbox,
                "beyond the largest file the file system allows",
            )
        }
        _ => return AbxError::internal(format!("{view}: {e}")),
    };
    path_err(code, view, sandbox)
}

fn offset_err(view: &str, sandbox: &str, detail: &str) -> AbxError {
    AbxError::new(
        ErrorCode::OffsetOutOfRange,
        &[("path", view), ("sandbox", sandbox), ("detail", detail)],
    )
}

/// Mode bits `files/write` applies: permissions and sticky; setuid and setgid never (a
/// sandbox file must not become a way to run something as its owner or group).
pub const WRITE_MODE_BITS: u32 = 0o1777;

/// The error of resolving (opening) `view` with `openat2`: escapes are E4002; a FIFO
/// without reader or a socket (ENXIO) is "not a regular file".
pub(crate) fn resolve_err(e: &io::Error, view: &str, sandbox: &str) -> AbxError {
    match e.raw_os_error() {
        Some(libc::EXDEV | libc::ELOOP) => path_err(ErrorCode::PathOutsideSandbox, view, sandbox),
        Some(libc::ENXIO) => not_regular(view),
        _ => op_err(e, view, sandbox),
    }
}

fn not_regular(view: &str) -> AbxError {
    AbxError::detail(
        ErrorCode::InvalidData,
        format!("'{view}' is not a regular file"),
    )
    .with_suggestion("Only regular files can be read and written.")
}

fn local_err(local: &Path, detail: impl std::fmt::Display) -> AbxError {
    AbxError::new(
        ErrorCode::LocalFileError,
        &[
            ("path", &local.display().to_string()),
            ("detail", &detail.to_string()),
        ],
    )
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Targets

/// A sandbox path mapped onto its area, with an `O_PATH` fd of the area directory.
pub(crate) struct Target {
    pub(crate) area: Area,
    pub(crate) rel: PathBuf,
    pub(crate) root: OwnedFd,
    /// Resolved in the sandbox's whole view ([`crate::RootView`]): `rel` is relative to
    /// its `/`.
    pub(crate) in_root: bool,
}

/// This thread's filesystem ids set to `uid:gid` (`setfsuid`, per thread) until dropped: a
/// root daemon works in a sandbox's view as the sandbox's user, so files it makes through
/// an idmapped mount are the source owner's and an overlay's layer stays the sandbox's.
pub struct FsIds(u32, u32);

impl FsIds {
    /// Take `uid:gid` as this thread's filesystem ids.
    pub fn take(uid: u32, gid: u32) -> FsIds {
        // SAFETY: setfsuid/setfsgid affect this thread only.
        unsafe {
            let old_g = libc::setfsgid(gid) as u32;
            let old_u = libc::setfsuid(uid) as u32;
            FsIds(old_u, old_g)
        }
    }
}

impl Drop for FsIds {
    fn drop(&mut self) {
        // SAFETY: as in `take`: back to the ids this thread had.
        unsafe {
            libc::setfsuid(self.0);
            libc::setfsgid(self.1);
        }
    }
}

/// Kernel interfaces of the sandbox that `files/*` do not serve (the daemon's credentials
/// are not the sandbox's: read them with `exec`).
const NOT_SERVED: &[&str] = &["proc", "sys", "dev"];

impl Target {
    pub(crate) fn new(dirs: &SandboxDirs, path: &str) -> Result<Target, AbxError> {
        if let Some(v) = dirs
            .view
            .as_ref()
            .filter(|v| crate::in_view(path, &v.mounts))
        {
            return Target::in_view(v, path);
        }
        let (area, rel) = split_path(path)?;
        let c = cstr(dirs.area_dir(area).as_os_str()).map_err(AbxError::internal)?;
        // The area directory itself is the broker's, not user-controlled.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(AbxError::internal(format!(
                "the sandbox's {} directory cannot be opened: {}",
                area.prefix(),
                io::Error::last_os_error()
            )));
        }
        // SAFETY: a fresh fd we own.
        let root = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Target {
            area,
            rel,
            root,
            in_root: false,
        })
    }

    /// A path of the sandbox's whole view, relative to the init's `/`.
    fn in_view(v: &crate::RootView, path: &str) -> Result<Target, AbxError> {
        let outside = || AbxError::new(ErrorCode::PathOutsideSandbox, &[("path", path)]);
        if path.contains('\0') {
            return Err(outside());
        }
        let p = if path.starts_with('/') {
            PathBuf::from(path)
        } else {
            Path::new(crate::WORKSPACE).join(path)
        };
        let mut rel = PathBuf::new();
        for c in p.components() {
            match c {
                Component::Normal(n) => rel.push(n),
                Component::ParentDir if rel.pop() => {}
                Component::ParentDir => return Err(outside()),
                _ => {}
            }
        }
        if let Some(Component::Normal(first)) = rel.components().next() {
            if NOT_SERVED.iter().any(|n| first == OsStr::new(n)) {
                return Err(AbxError::new(
                    ErrorCode::FilePermissionDenied,
                    &[("path", &format!("/{}", rel.display())), ("sandbox", "")],
                )
                .with_suggestion(
                    "files/* do not serve /proc, /sys and /dev (the kernel's interfaces): read them with exec ('cat /proc/...').",
                ));
            }
        }
        let root = v
            .root
            .try_clone()
            .map_err(|e| AbxError::internal(format!("the sandbox's root: {e}")))?;
        Ok(Target {
            area: Area::Workspace,
            rel,
            root,
            in_root: true,
        })
    }

    pub(crate) fn root_fd(&self) -> RawFd {
        self.root.as_raw_fd()
    }

    /// The sandbox-view path of this target.
    pub(crate) fn view(&self) -> String {
        self.view_of(&self.rel)
    }

    pub(crate) fn view_of(&self, rel: &Path) -> String {
        if self.in_root {
            return format!("/{}", rel.display());
        }
        view_path(self.area, rel)
    }

    /// `openat2` of an area-relative path beneath the area (in the whole view: beneath its
    /// root, symlinks followed as the sandbox would, `RESOLVE_IN_ROOT`).
    pub(crate) fn open(&self, rel: &Path, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
        let how = if self.in_root {
            libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS
        } else {
            RESOLVE
        };
        openat2(self.root_fd(), rel, flags, mode, how)
    }

    /// The parent directory (`O_PATH`) of `rel` and its last component. `rel` must not be
    /// empty. A missing parent is E4001 naming the parent.
    pub(crate) fn parent(&self, rel: &Path, sandbox: &str) -> Result<(OwnedFd, CString), AbxError> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = rel
            .file_name()
            .ok_or_else(|| AbxError::internal("a path without a last component"))?;
        let fd = self
            .open(parent, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| resolve_err(&e, &self.view_of(parent), sandbox))?;
        Ok((fd, cstr(name).map_err(AbxError::internal)?))
    }

    /// Open a regular file for reading (following links beneath the area).
    fn open_read(&self, sandbox: &str) -> Result<(OwnedFd, libc::stat), AbxError> {
        let view = self.view();
        let fd = self
            .open(
                &self.rel,
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
                0,
            )
            .map_err(|e| resolve_err(&e, &view, sandbox))?;
        let st = fstat(fd.as_raw_fd()).map_err(|e| op_err(&e, &view, sandbox))?;
        if is_dir(&st) {
            return Err(path_err(ErrorCode::IsADirectory, &view, sandbox));
        }
        if !is_reg(&st) {
            return Err(not_regular(&view));
        }
        Ok((fd, st))
    }
}

/// The area-relative path of `fd` as the kernel resolved it, when it lies beneath `root`.
fn real_rel(root: RawFd, fd: RawFd) -> Option<PathBuf> {
    let r = std::fs::read_link(format!("/proc/self/fd/{root}")).ok()?;
    let p = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let rel = p.strip_prefix(&r).ok()?;
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    (plain && !rel.as_os_str().is_empty()).then(|| rel.to_path_buf())
}

// ---------------------------------------------------------------------------------------
// Encodings

#[derive(Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Auto,
    Utf8,
    Base64,
}

fn parse_encoding(e: Option<&str>) -> Result<Encoding, AbxError> {
    match e {
        None => Ok(Encoding::Auto),
        Some(s) if s.eq_ignore_ascii_case("utf-8") || s.eq_ignore_ascii_case("utf8") => {
            Ok(Encoding::Utf8)
        }
        Some(s) if s.eq_ignore_ascii_case("base64") => Ok(Encoding::Base64),
        Some(s) => Err(AbxError::detail(
            ErrorCode::InvalidData,
            format!("unknown encoding '{s}' (use 'utf-8' or 'base64')"),
        )),
    }
}

fn decode<'a>(data: &'a str, encoding: Option<&str>) -> Result<Cow<'a, [u8]>, AbxError> {
    match parse_encoding(encoding)? {
        Encoding::Auto | Encoding::Utf8 => Ok(Cow::Borrowed(data.as_bytes())),
        Encoding::Base64 => abx_protocol::b64::decode(data)
            .map(Cow::Owned)
            .map_err(|e| AbxError::detail(ErrorCode::InvalidData, format!("invalid base64: {e}"))),
    }
}

// ---------------------------------------------------------------------------------------
// read / write

/// Read at most `length` bytes (default and maximum [`MAX_CHUNK`]; above it E1004) from
/// `offset`.
///
/// Memory is bounded by the chunk, whatever the file size. Encoding `None` returns
/// `"utf-8"` when the chunk is valid UTF-8 and `"base64"` otherwise; `Some("base64")`
/// always base64; `Some("utf-8")` fails with E4007 on invalid UTF-8, except that a chunk
/// ending inside a multi-byte character (not at the end of the file) is shortened to the
/// last whole character (so the next offset is `offset + data.len()`). A directory is E4003.
pub fn read(
    dirs: &SandboxDirs,
    sandbox: &str,
    path: &str,
    offset: u64,
    length: Option<u64>,
    encoding: Option<&str>,
) -> Result<ReadResult, AbxError> {
    abx_protocol::limits::check_read_length(length)?;
    let enc = parse_encoding(encoding)?;
    let t = Target::new(dirs, path)?;
    let view = t.view();
    let (fd, st) = t.open_read(sandbox)?;
    let size = st.st_size.max(0) as u64;
    let want = length.unwrap_or(MAX_CHUNK);
    let n = want.min(size.saturating_sub(offset)) as usize;
    let mut buf = vec![0u8; n];
    let got =
        pread_full(fd.as_raw_fd(), &mut buf, offset).map_err(|e| op_err(&e, &view, sandbox))?;
    buf.truncate(got);
    let mut eof = offset.saturating_add(got as u64) >= size;
    let (data, encoding) = match enc {
        Encoding::Base64 => (abx_protocol::b64::encode(&buf), "base64"),
        Encoding::Auto => match std::str::from_utf8(&buf) {
            Ok(_) => (String::from_utf8(buf).expect("checked"), "utf-8"),
            // Text cut inside a character by the chunk length: the whole characters as text,
            // the next read starts at the cut (EPP/1 §6.5).
            Err(e) if e.error_len().is_none() && !eof && e.valid_up_to() > 0 => {
                buf.truncate(e.valid_up_to());
                (String::from_utf8(buf).expect("checked"), "utf-8")
            }
            Err(_) => (abx_protocol::b64::encode(&buf), "base64"),
        },
        Encoding::Utf8 => match std::str::from_utf8(&buf) {
            Ok(_) => (String::from_utf8(buf).expect("checked"), "utf-8"),
            Err(e) if e.error_len().is_none() && !eof && e.valid_up_to() > 0 => {
                buf.truncate(e.valid_up_to());
                eof = false;
                (String::from_utf8(buf).expect("checked"), "utf-8")
            }
            Err(e) => {
                return Err(AbxError::detail(
                    ErrorCode::InvalidData,
                    format!(
                        "'{view}' is not valid UTF-8 at byte {}",
                        offset + e.valid_up_to() as u64
                    ),
                )
                .with_suggestion("Read it with encoding 'base64'."))
            }
        },
    };
    Ok(ReadResult {
        data,
        encoding: encoding.to_owned(),
        size,
        eof,
        offset,
    })
}

/// Write `data` (decoded per `encoding`: `"utf-8"`, the default, or `"base64"`) to `path`
/// and return the file's size afterwards.
///
/// Invalid data is refused (E4007) before anything is touched. A missing parent directory
/// is E4001 naming the parent. New files are created with mode 0o644 (less the umask);
/// `mode` is applied with `fchmod` when given.
/// - Neither `offset` nor `append`: the whole file is replaced atomically (temp file +
///   rename; an existing file keeps its mode unless `mode` is given).
/// - `append`: appended at the end (takes precedence over `offset`).
/// - `offset`: written at `offset` without truncating (a hole is left past the end).
#[allow(clippy::too_many_arguments)]
pub fn write(
    dirs: &SandboxDirs,
    sandbox: &str,
    path: &str,
    data: &str,
    encoding: Option<&str>,
    offset: Option<u64>,
    append: bool,
    mode: Option<u32>,
) -> Result<u64, AbxError> {
    let bytes = decode(data, encoding)?;
    let t = Target::new(dirs, path)?;
    let view = t.view();
    if t.rel.as_os_str().is_empty() {
        return Err(path_err(ErrorCode::IsADirectory, &view, sandbox));
    }
    if let (false, Some(off)) = (append, offset) {
        // Refused before anything is created: the end must fit in a file offset.
        if off
            .checked_add(bytes.len() as u64)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(offset_err(
                &view,
                sandbox,
                &format!(
                    "offset {off} + {} bytes is beyond 2^63-1, the largest file offset",
                    bytes.len()
                ),
            ));
        }
    }
    if !append && offset.is_none() {
        return replace_file(&t, sandbox, mode, &mut |fd| {
            pwrite_all(fd, &bytes, 0).map_err(|e| op_err(&e, &view, sandbox))
        });
    }
    let (dir, name) = t.parent(&t.rel, sandbox)?; // E4001 naming the parent when missing
    let mut flags = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
    if append {
        flags |= libc::O_APPEND;
    }
    // Create exclusively first, so a failed write knows whether the file is its own to
    // remove (nothing is left behind) or someone's to restore to its old size.
    let (fd, created) = match t.open(&t.rel, flags | libc::O_CREAT | libc::O_EXCL, 0o644) {
        Ok(fd) => {
            own_fd(fd.as_raw_fd());
            (fd, true)
        }
        // Exists (or is a link, dangling links included: its target is created as before).
        Err(e) if errno(&e) == libc::EEXIST => (
            t.open(&t.rel, flags | libc::O_CREAT, 0o644)
                .map_err(|e| resolve_err(&e, &view, sandbox))?,
            false,
        ),
        Err(e) => return Err(resolve_err(&e, &view, sandbox)),
    };
    let raw = fd.as_raw_fd();
    let err = |e: io::Error| op_err(&e, &view, sandbox);
    let st = fstat(raw).map_err(err)?;
    if !is_reg(&st) {
        return Err(not_regular(&view));
    }
    let old_size = st.st_size;
    let written = (|| {
        if let Some(m) = mode {
            fchmod(raw, m)?;
        }
        match (append, offset) {
            (false, Some(off)) => pwrite_all(raw, &bytes, off),
            _ => write_all(raw, &bytes),
        }
    })();
    if let Err(e) = written {
        if created {
            // SAFETY: a directory fd we own and a NUL-terminated name.
            unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) };
        } else {
            // SAFETY: ftruncate of an fd we own.
            unsafe { libc::ftruncate(raw, old_size) };
        }
        return Err(err(e));
    }
    Ok(fstat(raw).map_err(err)?.st_size.max(0) as u64)
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_name(created: bool) -> CString {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let kind = if created { 'c' } else { 'm' };
    CString::new(format!(
        "{TEMP_PREFIX}{kind}-{}-{n}-{nanos:08x}{TEMP_SUFFIX}",
        std::process::id()
    ))
    .expect("no NUL")
}

/// Whether `name` is a temporary name of a whole-file write; `Some(true)` when it was
/// creating the target, `Some(false)` when replacing one.
pub fn temp_kind(name: &[u8]) -> Option<bool> {
    let rest = name.strip_prefix(TEMP_PREFIX.as_bytes())?;
    if !name.ends_with(TEMP_SUFFIX.as_bytes()) {
        return None;
    }
    match rest.first() {
        Some(b'c') => Some(true),
        Some(b'm') => Some(false),
        _ => None,
    }
}

/// A temporary file in a directory, removed on drop unless committed.
struct TempFile {
    dir: RawFd,
    fd: OwnedFd,
    /// The name it has in `dir` (none while it is an anonymous O_TMPFILE).
    name: Option<CString>,
    created: bool,
}

impl TempFile {
    fn create(dir: RawFd, created: bool) -> io::Result<TempFile> {
        #[cfg(test)]
        let anonymous = !tests::NAMED_TEMP.with(|c| c.get());
        #[cfg(not(test))]
        let anonymous = true;
        let tmpfile = if anonymous {
            openat2(
                dir,
                Path::new("."),
                libc::O_TMPFILE | libc::O_RDWR,
                0o644,
                RESOLVE,
            )
        } else {
            Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
        };
        match tmpfile {
            Ok(fd) => {
                own_fd(fd.as_raw_fd());
                return Ok(TempFile {
                    dir,
                    fd,
                    name: None,
                    created,
                });
            }
            Err(e) if matches!(errno(&e), libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
        for _ in 0..100 {
            let name = temp_name(created);
            match openat2(
                dir,
                cpath(&name),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                0o644,
                RESOLVE_NOLINKS,
            ) {
                Ok(fd) => {
                    own_fd(fd.as_raw_fd());
                    return Ok(TempFile {
                        dir,
                        fd,
                        name: Some(name),
                        created,
                    });
                }
                Err(e) if errno(&e) == libc::EEXIST => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::from_raw_os_error(libc::EEXIST))
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Give an anonymous file a (temporary) name in its directory.
    fn link(&mut self) -> io::Result<()> {
        if self.name.is_some() {
            return Ok(());
        }
        let proc_path = CString::new(format!("/proc/self/fd/{}", self.raw())).expect("no NUL");
        for _ in 0..100 {
            let name = temp_name(self.created);
            let mut r = cvt(unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc_path.as_ptr(),
                    self.dir,
                    name.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            });
            if matches!(&r, Err(e) if errno(e) == libc::ENOENT) {
                // No /proc: try the fd itself (allowed without privileges on newer kernels).
                r = cvt(unsafe {
                    libc::linkat(
                        self.raw(),
                        c"".as_ptr(),
                        self.dir,
                        name.as_ptr(),
                        libc::AT_EMPTY_PATH,
                    )
                });
            }
            match r {
                Ok(()) => {
                    self.name = Some(name);
                    return Ok(());
                }
                Err(e) if errno(&e) == libc::EEXIST => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::from_raw_os_error(libc::EEXIST))
    }

    /// Rename it over `target` in the same directory.
    fn commit(mut self, target: &CStr) -> io::Result<()> {
        self.link()?;
        let name = self.name.as_ref().expect("linked");
        cvt(unsafe { libc::renameat(self.dir, name.as_ptr(), self.dir, target.as_ptr()) })?;
        self.name = None;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            let _ = unlinkat(self.dir, name, 0);
        }
    }
}

/// Replace the file at `t` with what `fill` writes into a fresh fd (at offset 0), without
/// ever exposing a partial file. Returns the new size.
fn replace_file(
    t: &Target,
    sandbox: &str,
    mode: Option<u32>,
    fill: &mut dyn FnMut(RawFd) -> Result<(), AbxError>,
) -> Result<u64, AbxError> {
    let view = t.view();
    if t.rel.as_os_str().is_empty() {
        return Err(path_err(ErrorCode::IsADirectory, &view, sandbox));
    }
    let mut rel = t.rel.clone();
    for hop in 0..3 {
        let (dir, name) = t.parent(&rel, sandbox)?;
        let existing = match lstatat(dir.as_raw_fd(), &name) {
            Ok(st) => Some(st),
            Err(e) if errno(&e) == libc::ENOENT => None,
            Err(e) => return Err(op_err(&e, &view, sandbox)),
        };
        match existing {
            Some(st) if is_dir(&st) => {
                return Err(path_err(ErrorCode::IsADirectory, &view, sandbox))
            }
            Some(st) if is_lnk(&st) => {
                if hop == 2 {
                    break;
                }
                // Replace the file the link points to (beneath the area), not the link.
                let link_target = match t.open(&rel, libc::O_PATH, 0) {
                    Err(e) if errno(&e) == libc::ENOENT => {
                        // A dangling link inside the area: create its target first.
                        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_NONBLOCK;
                        drop(
                            t.open(&rel, flags, 0o644)
                                .map_err(|e| resolve_err(&e, &view, sandbox))?,
                        );
                        t.open(&rel, libc::O_PATH, 0)
                    }
                    r => r,
                }
                .map_err(|e| resolve_err(&e, &view, sandbox))?;
                let st = fstat(link_target.as_raw_fd()).map_err(|e| op_err(&e, &view, sandbox))?;
                if is_dir(&st) {
                    return Err(path_err(ErrorCode::IsADirectory, &view, sandbox));
                }
                match real_rel(t.root_fd(), link_target.as_raw_fd()) {
                    Some(r) => rel = r,
                    None => break,
                }
            }
            existing => {
                let err = |e: io::Error| op_err(&e, &view, sandbox);
                let tmp = TempFile::create(dir.as_raw_fd(), existing.is_none()).map_err(err)?;
                fill(tmp.raw())?;
                let perm = mode.or(existing.map(|st| st.st_mode & 0o7777));
                if let Some(p) = perm {
                    fchmod(tmp.raw(), p).map_err(err)?;
                }
                let size = fstat(tmp.raw()).map_err(err)?.st_size.max(0) as u64;
                tmp.commit(&name).map_err(err)?;
                return Ok(size);
            }
        }
    }
    // Could not pin the link target down (no /proc, or links changing under us): write
    // through the link in place, still confined beneath the area.
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = t
        .open(&t.rel, flags, 0o644)
        .map_err(|e| resolve_err(&e, &view, sandbox))?;
    let err = |e: io::Error| op_err(&e, &view, sandbox);
    if !is_reg(&fstat(fd.as_raw_fd()).map_err(err)?) {
        return Err(not_regular(&view));
    }
    if let Some(m) = mode {
        fchmod(fd.as_raw_fd(), m).map_err(err)?;
    }
    fill(fd.as_raw_fd())?;
    Ok(fstat(fd.as_raw_fd()).map_err(err)?.st_size.max(0) as u64)
}

// ---------------------------------------------------------------------------------------
// stat / list

fn entry(name: String, path: String, st: &libc::stat) -> Entry {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        _ => "other",
    };
    Entry {
        name,
        path,
        kind: kind.to_owned(),
        size: st.st_size.max(0) as u64,
        mode: format!("{:04o}", st.st_mode & 0o7777),
        modified_at: abx_home::util::rfc3339_nanos(st.st_mtime, st.st_mtime_nsec),
    }
}

/// Describe `path` without following a final symlink (reported as `"symlink"`).
pub fn stat(dirs: &SandboxDirs, sandbox: &str, path: &str) -> Result<Entry, AbxError> {
    let t = Target::new(dirs, path)?;
    let view = t.view();
    if t.rel.as_os_str().is_empty() {
        let st = fstat(t.root_fd()).map_err(|e| op_err(&e, &view, sandbox))?;
        let name = if t.in_root {
            t.rel
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            t.area.prefix().trim_start_matches('/').to_owned()
        };
        return Ok(entry(name, view, &st));
    }
    let (dir, name) = t.parent(&t.rel, sandbox)?;
    let st = lstatat(dir.as_raw_fd(), &name).map_err(|e| op_err(&e, &view, sandbox))?;
    Ok(entry(name.to_string_lossy().into_owned(), view, &st))
}

/// The entries of directory `path` (following links to reach it), sorted by path.
///
/// `recursive` walks every subdirectory, never following symlinks (they are listed as
/// `"symlink"`). At most [`MAX_LIST_ENTRIES`] entries are returned; the walk stops there
/// without an error. Subdirectories that vanish or turn into links during the walk are
/// skipped. Listing a file is E4004.
pub fn list(
    dirs: &SandboxDirs,
    sandbox: &str,
    path: &str,
    recursive: bool,
) -> Result<Vec<Entry>, AbxError> {
    let t = Target::new(dirs, path)?;
    let view = t.view();
    let top = t
        .open(&t.rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .map_err(|e| resolve_err(&e, &view, sandbox))?;
    let mut out = Vec::new();
    let mut queue: VecDeque<PathBuf> = VecDeque::from([PathBuf::new()]);
    'walk: while let Some(suffix) = queue.pop_front() {
        let first = suffix.as_os_str().is_empty();
        let fd = if first {
            top.try_clone()
        } else {
            openat2(
                top.as_raw_fd(),
                &suffix,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                0,
                RESOLVE_NOLINKS,
            )
        };
        let here = t.rel.join(&suffix);
        let mut dir = match fd.and_then(Dir::open) {
            Ok(d) => d,
            Err(e) if first => return Err(op_err(&e, &view, sandbox)),
            Err(_) => continue,
        };
        let names = match dir.names() {
            Ok(n) => n,
            Err(e) if first => return Err(op_err(&e, &view, sandbox)),
            Err(_) => continue,
        };
        for name in names {
            if out.len() >= MAX_LIST_ENTRIES {
                break 'walk;
            }
            let st = match lstatat(dir.fd(), &name) {
                Ok(st) => st,
                Err(_) => continue, // removed meanwhile
            };
            let child = suffix.join(cpath(&name));
            let e = entry(
                name.to_string_lossy().into_owned(),
                t.view_of(&here.join(cpath(&name))),
                &st,
            );
            if recursive && is_dir(&st) {
                queue.push_back(child);
            }
            out.push(e);
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// mkdir / remove / rename

/// Create directory `path` (mode 0o755 less the umask).
///
/// Without `parents`: an existing path is E4006 and a missing parent E4001. With
/// `parents`: missing ancestors are created and an existing directory is fine (an existing
/// non-directory is still E4006).
pub fn mkdir(dirs: &SandboxDirs, sandbox: &str, path: &str, parents: bool) -> Result<(), AbxError> {
    let t = Target::new(dirs, path)?;
    let view = t.view();
    let mkdirat = |dir: RawFd, name: &CStr| {
        cvt(unsafe { libc::mkdirat(dir, name.as_ptr(), 0o755) })?;
        own_at(dir, name);
        Ok::<(), io::Error>(())
    };
    if t.rel.as_os_str().is_empty() {
        return if parents {
            Ok(())
        } else {
            Err(path_err(ErrorCode::FileExists, &view, sandbox))
        };
    }
    if !parents {
        let (dir, name) = t.parent(&t.rel, sandbox)?;
        return mkdirat(dir.as_raw_fd(), &name).map_err(|e| op_err(&e, &view, sandbox));
    }
    let comps: Vec<&OsStr> = t.rel.iter().collect();
    let mut acc = PathBuf::new();
    for (i, comp) in comps.iter().enumerate() {
        let last = i + 1 == comps.len();
        let dir = t
            .open(&acc, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| resolve_err(&e, &t.view_of(&acc), sandbox))?;
        acc.push(comp);
        let acc_view = t.view_of(&acc);
        let name = cstr(comp).map_err(AbxError::internal)?;
        match mkdirat(dir.as_raw_fd(), &name) {
            Ok(()) => {}
            Err(e) if errno(&e) == libc::EEXIST => {
                // It must be a directory (possibly through a link that stays inside).
                match t.open(&acc, libc::O_PATH | libc::O_DIRECTORY, 0) {
                    Ok(_) => {}
                    Err(e) if errno(&e) == libc::ENOTDIR => {
                        return Err(if last {
                            path_err(ErrorCode::FileExists, &view, sandbox)
                        } else {
                            path_err(ErrorCode::NotADirectory, &acc_view, sandbox)
                        })
                    }
                    Err(e) => return Err(resolve_err(&e, &acc_view, sandbox)),
                }
            }
            Err(e) => return Err(op_err(&e, &acc_view, sandbox)),
        }
    }
    Ok(())
}

/// Remove a file, a symlink (never what it points to) or an empty directory; with
/// `recursive`, a directory with everything in it (through fds, never following links).
/// A non-empty directory without `recursive` is E4005; the area roots themselves
/// (`/workspace`, `/tmp`) are E4002.
pub fn remove(
    dirs: &SandboxDirs,
    sandbox: &str,
    path: &str,
    recursive: bool,
) -> Result<(), AbxError> {
    let t = Target::new(dirs, path)?;
    let view = t.view();
    if t.rel.as_os_str().is_empty() {
        return Err(path_err(ErrorCode::PathOutsideSandbox, &view, sandbox));
    }
    let (dir, name) = t.parent(&t.rel, sandbox)?;
    let dfd = dir.as_raw_fd();
    let st = lstatat(dfd, &name).map_err(|e| op_err(&e, &view, sandbox))?;
    if !is_dir(&st) {
        return unlinkat(dfd, &name, 0).map_err(|e| op_err(&e, &view, sandbox));
    }
    match unlinkat(dfd, &name, libc::AT_REMOVEDIR) {
        Ok(()) => Ok(()),
        Err(e) if recursive && matches!(errno(&e), libc::ENOTEMPTY | libc::EEXIST) => {
            remove_tree(dfd, &name)
                .map_err(|(e, suffix)| op_err(&e, &t.view_of(&t.rel.join(suffix)), sandbox))
        }
        Err(e) => Err(op_err(&e, &view, sandbox)),
    }
}

/// One directory level of [`remove_tree`].
struct Level {
    /// Relative to the tree's top.
    suffix: PathBuf,
    /// Released while deeper levels are worked on when the stack is deep.
    dir: Option<Dir>,
    names: Vec<CString>,
    next: usize,
    tries: u32,
}

/// Remove directory `name` of `parent` and everything below it, never following a
/// symlink. Errors name the entry (relative to the tree's top) they happened on.
fn remove_tree(parent: RawFd, name: &CStr) -> Result<(), (io::Error, PathBuf)> {
    const KEEP_OPEN: usize = 64;
    let open_dir = |dir: RawFd, rel: &Path| -> io::Result<Dir> {
        let fd = openat2(
            dir,
            rel,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
            RESOLVE_NOLINKS,
        )?;
        Dir::open(fd)
    };
    let top = openat2(
        parent,
        cpath(name),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
        RESOLVE_NOLINKS,
    )
    .map_err(|e| (e, PathBuf::new()))?;
    let mut first = open_dir(top.as_raw_fd(), Path::new("")).map_err(|e| (e, PathBuf::new()))?;
    let names = first.names().map_err(|e| (e, PathBuf::new()))?;
    let mut stack = vec![Level {
        suffix: PathBuf::new(),
        dir: Some(first),
        names,
        next: 0,
        tries: 0,
    }];
    while let Some(level) = stack.last_mut() {
        if level.next >= level.names.len() {
            stack.pop();
            continue;
        }
        if level.dir.is_none() {
            level.dir = Some(
                open_dir(top.as_raw_fd(), &level.suffix).map_err(|e| (e, level.suffix.clone()))?,
            );
        }
        let dfd = level.dir.as_ref().expect("opened").fd();
        let name = &level.names[level.next];
        let child = level.suffix.join(cpath(name));
        let st = match lstatat(dfd, name) {
            Ok(st) => st,
            Err(e) if errno(&e) == libc::ENOENT => {
                level.next += 1;
                continue;
            }
            Err(e) => return Err((e, child)),
        };
        let flags = if is_dir(&st) { libc::AT_REMOVEDIR } else { 0 };
        match unlinkat(dfd, name, flags) {
            Ok(()) => {}
            Err(e) if errno(&e) == libc::ENOENT => {}
            Err(e)
                if is_dir(&st)
                    && matches!(errno(&e), libc::ENOTEMPTY | libc::EEXIST)
                    && level.tries < 3 =>
            {
                // Empty it first, then come back and retry (a few times, in case
                // something keeps filling it).
                level.tries += 1;
                let mut sub = open_dir(dfd, cpath(name)).map_err(|e| (e, child.clone()))?;
                let names = sub.names().map_err(|e| (e, child.clone()))?;
                let deep = stack.len() >= KEEP_OPEN;
                if deep {
                    stack.last_mut().expect("non-empty").dir = None;
                }
                stack.push(Level {
                    suffix: child,
                    dir: Some(sub),
                    names,
                    next: 0,
                    tries: 0,
                });
                continue;
            }
            Err(e) => return Err((e, child)),
        }
        level.next += 1;
        level.tries = 0;
    }
    drop(top);
    match unlinkat(parent, name, libc::AT_REMOVEDIR) {
        Err(e) if errno(&e) != libc::ENOENT => Err((e, PathBuf::new())),
        _ => Ok(()),
    }
}

/// Rename `from` to `to` (both confined; across `/workspace` and `/tmp` when they are on
/// one filesystem). An existing file at `to` is replaced, as rename(2) does.
pub fn rename(dirs: &SandboxDirs, sandbox: &str, from: &str, to: &str) -> Result<(), AbxError> {
    let f = Target::new(dirs, from)?;
    let t = Target::new(dirs, to)?;
    let (fview, tview) = (f.view(), t.view());
    for x in [&f, &t] {
        if x.rel.as_os_str().is_empty() {
            return Err(path_err(ErrorCode::PathOutsideSandbox, &x.view(), sandbox));
        }
    }
    let (fdir, fname) = f.parent(&f.rel, sandbox)?;
    let (tdir, tname) = t.parent(&t.rel, sandbox)?;
    lstatat(fdir.as_raw_fd(), &fname).map_err(|e| op_err(&e, &fview, sandbox))?;
    let r = cvt(unsafe {
        libc::renameat(
            fdir.as_raw_fd(),
            fname.as_ptr(),
            tdir.as_raw_fd(),
            tname.as_ptr(),
        )
    });
    r.map_err(|e| match errno(&e) {
        libc::EXDEV => AbxError::internal(format!(
            "cannot rename '{fview}' to '{tview}': they are on different filesystems"
        ))
        .with_suggestion("Copy it (files/read and files/write) and remove the original instead."),
        libc::EINVAL => AbxError::detail(
            ErrorCode::InvalidData,
            format!("cannot move '{fview}' into itself ('{tview}')"),
        )
        .with_suggestion("Choose a destination outside the directory being moved."),
        libc::ENOENT | libc::EACCES | libc::EPERM => op_err(&e, &fview, sandbox),
        _ => op_err(&e, &tview, sandbox),
    })
}

#[cfg(test)]
mod tests;
