//! System-call helpers of files/*: every path is relative to a directory fd (`openat2`
//! with `RESOLVE_BENEATH`), plus in-kernel copies, full reads and writes, and a `DIR*`.

use super::*;

pub(crate) fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

pub(crate) fn cpath(c: &CStr) -> &Path {
    Path::new(OsStr::from_bytes(c.to_bytes()))
}

pub(super) fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `openat2(dir, path, flags | O_CLOEXEC, mode, resolve)`; an empty path is `.`.
pub(crate) fn openat2(
    dir: RawFd,
    path: &Path,
    flags: libc::c_int,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    let c = cstr(path.as_os_str())?;
    // SAFETY: open_how is plain data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u32 as u64;
    let creates = flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE;
    how.mode = if creates { u64::from(mode) } else { 0 };
    how.resolve = resolve;
    for _ in 0..64 {
        // SAFETY: valid C string and open_how of the size passed.
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
            // EAGAIN: a concurrent rename raced a `..` lookup; the kernel asks us to retry.
            Some(libc::EAGAIN | libc::EINTR) => continue,
            Some(libc::ENOSYS) => {
                return Err(io::Error::other(
                    "openat2(2) is not available (Linux 5.6 or later is required)",
                ))
            }
            _ => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

pub(crate) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub(crate) fn lstatat(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: as fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

pub(crate) fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

pub(super) fn is_reg(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

pub(crate) fn is_lnk(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

/// Give what the daemon created in a sandbox to the sandbox's owner (a root daemon's
/// sandboxes run as an unprivileged host uid and must be able to change their files).
pub(super) fn own_fd(fd: RawFd) {
    if let Some((u, g)) = crate::container::sandbox_owner() {
        // SAFETY: fchown on a descriptor we hold.
        unsafe { libc::fchown(fd, u, g) };
    }
}

/// [`own_fd`] for a directory entry (not following a link).
pub(super) fn own_at(dir: RawFd, name: &CStr) {
    if let Some((u, g)) = crate::container::sandbox_owner() {
        // SAFETY: fchownat with a C string we hold.
        unsafe { libc::fchownat(dir, name.as_ptr(), u, g, libc::AT_SYMLINK_NOFOLLOW) };
    }
}

pub(super) fn unlinkat(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) })
}

pub(super) fn fchmod(fd: RawFd, mode: u32) -> io::Result<()> {
    cvt(unsafe { libc::fchmod(fd, (mode & WRITE_MODE_BITS) as libc::mode_t) })
}

/// Bytes one `copy_file_range` call moves at most (progress is reported between calls).
pub(super) const IN_KERNEL_CHUNK: usize = 2 * 1024 * 1024;

/// File-to-file copies for upload and download: `copy_file_range` (the copy stays in the
/// kernel, and is a reflink where the filesystem has them, like `cp`), else `pread`/`pwrite`
/// through one buffer. Any `copy_file_range` error switches to the buffered path, which either
/// works (another filesystem, a special file) or reports which side failed.
pub(super) struct Copier {
    in_kernel: bool,
    buf: Vec<u8>,
}

/// Which side of a copy failed.
pub(super) enum CopyErr {
    Read(io::Error),
    Write(io::Error),
}

impl Copier {
    pub(super) fn new() -> Copier {
        Copier {
            in_kernel: true,
            buf: Vec::new(),
        }
    }

    /// Copy up to one chunk of `src` at `off` to `dst` at `off`; 0 at the end of `src`.
    pub(super) fn step(&mut self, src: RawFd, dst: RawFd, off: u64) -> Result<usize, CopyErr> {
        if self.in_kernel {
            let (mut i, mut o) = (off as libc::loff_t, off as libc::loff_t);
            loop {
                // SAFETY: two fds we own and two offsets on the stack.
                let r =
                    unsafe { libc::copy_file_range(src, &mut i, dst, &mut o, IN_KERNEL_CHUNK, 0) };
                if r > 0 {
                    return Ok(r as usize);
                }
                if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // 0 (the end, or a file whose size says nothing, like /proc's) or an error:
                // the buffered path decides.
                break;
            }
            self.in_kernel = false;
        }
        if self.buf.is_empty() {
            self.buf = vec![0u8; TRANSFER_BUF];
        }
        let n = pread_full(src, &mut self.buf, off).map_err(CopyErr::Read)?;
        pwrite_all(dst, &self.buf[..n], off).map_err(CopyErr::Write)?;
        Ok(n)
    }
}

pub(crate) fn pread_full(fd: RawFd, buf: &mut [u8], mut off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe `rest`.
        let r =
            unsafe { libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), off as libc::off_t) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            break;
        }
        done += r as usize;
        off += r as u64;
    }
    Ok(done)
}

pub(super) fn pwrite_all(fd: RawFd, mut buf: &[u8], mut off: u64) -> io::Result<()> {
    if off > i64::MAX as u64 {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    while !buf.is_empty() {
        // SAFETY: the pointer and length describe `buf`.
        let r = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off as libc::off_t) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[r as usize..];
        off += r as u64;
    }
    Ok(())
}

pub(crate) fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: the pointer and length describe `buf`.
        let r = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[r as usize..];
    }
    Ok(())
}

/// A directory stream over an fd opened `O_RDONLY | O_DIRECTORY`.
pub(crate) struct Dir(*mut libc::DIR);

impl Dir {
    pub(crate) fn open(fd: OwnedFd) -> io::Result<Dir> {
        let raw = fd.into_raw_fd();
        // SAFETY: `raw` is an open fd we own; fdopendir takes it over on success.
        let d = unsafe { libc::fdopendir(raw) };
        if d.is_null() {
            let e = io::Error::last_os_error();
            unsafe { libc::close(raw) };
            return Err(e);
        }
        Ok(Dir(d))
    }

    /// The fd of the stream (for `*at` calls).
    pub(crate) fn fd(&self) -> RawFd {
        unsafe { libc::dirfd(self.0) }
    }

    /// Every name but `.` and `..`.
    pub(crate) fn names(&mut self) -> io::Result<Vec<CString>> {
        let mut out = Vec::new();
        while let Some(n) = self.next_name()? {
            out.push(n);
        }
        Ok(out)
    }

    /// The next name but `.` and `..`; None at the end (memory does not grow with the
    /// directory).
    pub(crate) fn next_name(&mut self) -> io::Result<Option<CString>> {
        loop {
            // SAFETY: errno is thread-local; readdir returns NULL at the end or on error.
            unsafe { *libc::__errno_location() = 0 };
            let ent = unsafe { libc::readdir(self.0) };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(0) | None => Ok(None),
                    _ => Err(e),
                };
            }
            // SAFETY: d_name is NUL-terminated and valid until the next readdir.
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
            let b = name.to_bytes();
            if b != b"." && b != b".." {
                return Ok(Some(name.to_owned()));
            }
        }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: opened by fdopendir, closed once.
        unsafe { libc::closedir(self.0) };
    }
}
