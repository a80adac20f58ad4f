//! `files/upload` and `files/download`: between a host path of the caller and the sandbox,
//! streamed in chunks with progress, through a temp file renamed into place.

use super::*;

pub(super) fn report(progress: &mut dyn FnMut(u64, u64), done: u64, total: u64, last: &mut u64) {
    if done - *last >= PROGRESS_STEP && done < total {
        progress(done, total);
        *last = done;
    }
}

/// Copy the local file `local` into the sandbox at `path` (replacing it atomically) and
/// return the bytes copied, in the kernel where it can ([`Copier`]). Memory stays at one
/// 128 KiB buffer at most whatever the size.
/// `progress(done, total)` is called at most every MiB and once at the end.
/// Local-side problems (missing, unreadable, a directory, not a regular file) are E4009.
pub fn upload(
    dirs: &SandboxDirs,
    sandbox: &str,
    local: &Path,
    path: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, AbxError> {
    // O_NONBLOCK: opening a FIFO must not hang; it is refused below.
    let src = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(local)
        .map_err(|e| local_err(local, e))?;
    let meta = src.metadata().map_err(|e| local_err(local, e))?;
    if meta.is_dir() {
        return Err(local_err(local, "is a directory"));
    }
    if !meta.is_file() {
        return Err(local_err(local, "is not a regular file"));
    }
    let total = meta.len();
    // The local file is open: in the sandbox's view, a root daemon writes as its user.
    let _ids = dirs
        .view
        .as_ref()
        .and_then(|v| v.owner)
        .map(|(u, g)| super::FsIds::take(u, g));
    let t = Target::new(dirs, path)?;
    let view = t.view();
    let mut done = 0u64;
    replace_file(&t, sandbox, None, &mut |fd| {
        let mut copier = Copier::new();
        let mut last = 0u64;
        done = 0;
        loop {
            let n = match copier.step(src.as_raw_fd(), fd, done) {
                Ok(0) => break,
                Ok(n) => n,
                Err(CopyErr::Read(e)) => return Err(local_err(local, e)),
                Err(CopyErr::Write(e)) => return Err(op_err(&e, &view, sandbox)),
            };
            done += n as u64;
            report(progress, done, total, &mut last);
        }
        progress(done, total.max(done));
        Ok(())
    })?;
    Ok(done)
}

/// Removes a local temp file unless disarmed.
pub(super) struct LocalTemp(Option<PathBuf>);

impl Drop for LocalTemp {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Copy the sandbox file `path` to the local path `local` (written to a temp file in the
/// same directory, then renamed over it) and return the bytes copied ([`Copier`]). Memory
/// stays at one 128 KiB buffer at most. `progress(done, total)` is called at most every MiB and once at the end.
/// Local-side problems (the target is a directory, its directory is missing or not
/// writable) are E4009.
pub fn download(
    dirs: &SandboxDirs,
    sandbox: &str,
    path: &str,
    local: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, AbxError> {
    let t = Target::new(dirs, path)?;
    let view = t.view();
    let (src, st) = {
        // In the sandbox's view, a root daemon opens as its user (the local side as itself).
        let _ids = dirs
            .view
            .as_ref()
            .and_then(|v| v.owner)
            .map(|(u, g)| super::FsIds::take(u, g));
        t.open_read(sandbox)?
    };
    let total = st.st_size.max(0) as u64;

    if local.is_dir() {
        return Err(local_err(local, "is a directory"));
    }
    let file_name = local
        .file_name()
        .ok_or_else(|| local_err(local, "is not a file path"))?;
    let parent = match local.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(local_err(
                local,
                format!("'{}' is not a directory", parent.display()),
            ))
        }
        Err(e) => {
            return Err(local_err(
                local,
                format!("directory '{}': {e}", parent.display()),
            ))
        }
    }
    let (tmp_path, mut out) = {
        let mut attempt = 0;
        loop {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let p = parent.join(format!(
                ".{}.abx-{}-{n}.part",
                file_name.to_string_lossy(),
                std::process::id()
            ));
            match OpenOptions::new().write(true).create_new(true).open(&p) {
                Ok(f) => break (p, f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
                Err(e) => return Err(local_err(local, e)),
            }
        }
    };
    let mut guard = LocalTemp(Some(tmp_path.clone()));
    let mut copier = Copier::new();
    let mut done = 0u64;
    let mut last = 0u64;
    loop {
        let n = match copier.step(src.as_raw_fd(), out.as_raw_fd(), done) {
            Ok(0) => break,
            Ok(n) => n,
            Err(CopyErr::Read(e)) => return Err(op_err(&e, &view, sandbox)),
            Err(CopyErr::Write(e)) => return Err(local_err(local, e)),
        };
        done += n as u64;
        report(progress, done, total, &mut last);
    }
    out.flush().map_err(|e| local_err(local, e))?;
    drop::<File>(out);
    std::fs::rename(&tmp_path, local).map_err(|e| local_err(local, e))?;
    guard.0 = None;
    progress(done, total.max(done));
    Ok(done)
}

// ---------------------------------------------------------------------------------------
