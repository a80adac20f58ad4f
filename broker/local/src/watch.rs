//! `files/watch` of the builtin `local` provider, through inotify (docs/design.md#api, docs/design.md#local).
//!
//! [`Watch::start`] resolves the path beneath the sandbox exactly as the file operations
//! do (`openat2` with `RESOLVE_BENEATH`), then watches the resolved inode through its
//! `/proc/self/fd` link, so a watch can never reach outside the sandbox. A recursive watch
//! adds every subdirectory (never following symlinks) and, as they appear, new ones (whose
//! existing contents are then reported as `created`, since they may have been filled before
//! the watch was in place).
//!
//! A file is watched through its directory (events filtered by its name), so replacing it
//! by a rename (editors, whole-file writes) keeps the watch alive; when the file's last
//! component is a symlink, the inode it points to is watched instead.
//!
//! Reported kinds: `created` (IN_CREATE), `modified` (IN_MODIFY, IN_ATTRIB), `removed`
//! (IN_DELETE, and IN_DELETE_SELF of the watched path itself), `renamed` (both halves of a
//! move: the old path and the new one; IN_MOVE_SELF of the watched path). The temporary
//! files of whole-file writes ([`super::files::TEMP_PREFIX`]) are hidden; their final rename
//! is reported as `created` or `modified` of the target. A queue overflow is reported as
//! `modified` of the watched path (rescan it). Events are not coalesced, except identical
//! consecutive ones from one read. When the watched directory (or a watched file's
//! directory, or a watched file reached through a symlink) is removed, the watch ends (the
//! channel closes); a watched file that is removed may come back and is still reported.

use super::files::{
    self, is_dir, is_lnk, lstatat, openat2, resolve_err, Dir, Target, RESOLVE_NOLINKS,
};
use super::{view_path, Area, SandboxDirs};
use abx_protocol::AbxError;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::Sender;
use tokio::task::JoinHandle;

/// One change under a watched path (`files/changed`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// The sandbox-view path that changed.
    pub path: String,
    /// `"created"`, `"modified"`, `"removed"` or `"renamed"`.
    pub kind: String,
}

/// A running watch; dropping it (or [`Watch::stop`]) ends its task and closes its fd.
#[derive(Debug)]
pub struct Watch {
    task: JoinHandle<()>,
}

const DIR_MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_EXCL_UNLINK
    | libc::IN_ONLYDIR;
const FILE_MASK: u32 =
    libc::IN_MODIFY | libc::IN_ATTRIB | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;

/// How many pending rename cookies of hidden temp files are remembered.
const MAX_COOKIES: usize = 1024;
/// How many entries of a new directory are reported as `created` at most.
const MAX_SCAN_REPORT: usize = 10_000;

impl Watch {
    /// Watch `path` of the sandbox and send its changes to `tx`.
    ///
    /// Must be called within a tokio runtime (it spawns the reading task). Errors: the
    /// path's E4001/E4002/... as the file operations; E9001 when inotify refuses (for
    /// example the `fs.inotify.max_user_watches` limit for the watched path itself; for
    /// subdirectories of a recursive watch, the limit is logged and they are skipped).
    /// The initial recursive walk is done before this returns, so every change after it is
    /// seen. The task ends when `tx`'s receiver is dropped, when the watched path is
    /// removed, or when the `Watch` is dropped.
    pub fn start(
        dirs: &SandboxDirs,
        sandbox: &str,
        path: &str,
        recursive: bool,
        tx: Sender<Change>,
    ) -> Result<Watch, AbxError> {
        let t = Target::new(dirs, path)?;
        let view = t.view();
        let fd = t
            .open(&t.rel, libc::O_PATH, 0)
            .map_err(|e| resolve_err(&e, &view, sandbox))?;
        let st = files::fstat(fd.as_raw_fd()).map_err(|e| files::op_err(&e, &view, sandbox))?;
        let dir = is_dir(&st);
        // A file is watched through its directory, filtered by name, so that replacing
        // it (editors, whole-file writes: a rename over it) does not end the watch. Only
        // when its last component is a symlink is the file's inode watched itself.
        let mut watched = fd;
        let mut mask = DIR_MASK;
        let mut only = None;
        if !dir {
            let (parent, name) = t.parent(&t.rel, sandbox)?;
            match lstatat(parent.as_raw_fd(), &name) {
                Ok(st) if !is_lnk(&st) => {
                    watched = parent;
                    only = Some(name.into_bytes());
                }
                _ => mask = FILE_MASK,
            }
        }
        // SAFETY: plain syscall; the fd is owned below.
        let ino = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if ino < 0 {
            return Err(AbxError::internal(format!(
                "inotify_init1: {}",
                io::Error::last_os_error()
            )));
        }
        // SAFETY: a fresh fd we own.
        let ino = unsafe { OwnedFd::from_raw_fd(ino) };
        let mut state = State {
            ino: ino.as_raw_fd(),
            root: t.root,
            area: t.area,
            in_root: t.in_root,
            base: t.rel,
            recursive: recursive && dir,
            wds: HashMap::new(),
            root_wd: -1,
            cookies: VecDeque::new(),
            view: view.clone(),
            only,
        };
        state.root_wd = add_watch(state.ino, watched.as_raw_fd(), mask)
            .map_err(|e| AbxError::internal(format!("cannot watch '{view}': {}", describe(&e))))?;
        state.wds.insert(state.root_wd, PathBuf::new());
        if state.recursive {
            let top = openat2(
                watched.as_raw_fd(),
                Path::new(""),
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
                RESOLVE_NOLINKS,
            )
            .map_err(|e| files::op_err(&e, &view, sandbox))?;
            state.walk(&top, Path::new(""), None);
        }
        drop(watched);
        // SAFETY: `ino` is an open fd owned by the AsyncFd for its whole life.
        let afd = unsafe { AsyncFd::register_with_interest(ino, Interest::READABLE) }
            .map_err(|e| AbxError::internal(format!("inotify: {e}")))?;
        let task = tokio::spawn(run(afd, state, tx));
        Ok(Watch { task })
    }

    /// End the watch (same as dropping it).
    pub fn stop(self) {}

    /// Whether the task still runs (it ends when the watched path is removed or the
    /// receiver is gone).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => {
            "the inotify watch limit is reached (sysctl fs.inotify.max_user_watches)".into()
        }
        _ => e.to_string(),
    }
}

/// Watch the inode `fd` refers to (an `O_PATH` or directory fd) through its proc link.
fn add_watch(ino: RawFd, fd: RawFd, mask: u32) -> io::Result<i32> {
    let p = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
    // SAFETY: valid C string.
    let wd = unsafe { libc::inotify_add_watch(ino, p.as_ptr(), mask) };
    if wd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(wd)
    }
}

struct State {
    ino: RawFd,
    /// The area directory (`O_PATH`).
    root: OwnedFd,
    area: Area,
    /// `root` is the sandbox's whole view (a path on a mount, issue 43): paths are relative
    /// to its `/` and resolved as the sandbox resolves them (`RESOLVE_IN_ROOT`).
    in_root: bool,
    /// The watched path, relative to the area, as the caller named it.
    base: PathBuf,
    recursive: bool,
    /// Watch descriptor => directory relative to the watched path.
    wds: HashMap<i32, PathBuf>,
    root_wd: i32,
    /// Rename cookies of hidden temp files => whether the target was being created.
    cookies: VecDeque<(u32, bool)>,
    /// The watched path, sandbox view.
    view: String,
    /// Watching a file through its directory: its name there.
    only: Option<Vec<u8>>,
}

impl State {
    fn view_of(&self, suffix: &Path) -> String {
        if self.in_root {
            return format!("/{}", self.base.join(suffix).display());
        }
        view_path(self.area, &self.base.join(suffix))
    }

    /// Watch every directory below `top` (a directory fd for `suffix`), never following
    /// links; collect the suffixes of everything found when `found` is given.
    fn walk(&mut self, top: &OwnedFd, suffix: &Path, mut found: Option<&mut Vec<PathBuf>>) {
        let mut queue: VecDeque<PathBuf> = VecDeque::from([PathBuf::new()]);
        while let Some(sub) = queue.pop_front() {
            let fd = if sub.as_os_str().is_empty() {
                top.try_clone()
            } else {
                openat2(
                    top.as_raw_fd(),
                    &sub,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    0,
                    RESOLVE_NOLINKS,
                )
            };
            let Ok(mut dir) = fd.and_then(Dir::open) else {
                continue;
            };
            let Ok(names) = dir.names() else { continue };
            for name in names {
                let rel = sub.join(files::cpath(&name));
                let Ok(st) = lstatat(dir.fd(), &name) else {
                    continue;
                };
                if let Some(f) = found.as_deref_mut() {
                    if f.len() < MAX_SCAN_REPORT {
                        f.push(suffix.join(&rel));
                    }
                }
                if !is_dir(&st) {
                    continue;
                }
                let child = openat2(
                    dir.fd(),
                    files::cpath(&name),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                    0,
                    RESOLVE_NOLINKS,
                );
                let Ok(child) = child else { continue };
                match add_watch(self.ino, child.as_raw_fd(), DIR_MASK) {
                    Ok(wd) => {
                        self.wds.insert(wd, suffix.join(&rel));
                        queue.push_back(rel);
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                        tracing::warn!(watch = %self.view, "{}; subdirectories not watched", describe(&e));
                        return;
                    }
                    Err(_) => {}
                }
            }
        }
    }

    /// A new directory `suffix` appeared: watch it and everything below it.
    fn add_dir(&mut self, suffix: &Path, found: Option<&mut Vec<PathBuf>>) {
        let rel = self.base.join(suffix);
        let how = if self.in_root {
            libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS
        } else {
            files::RESOLVE
        };
        let Ok(fd) = openat2(
            self.root.as_raw_fd(),
            &rel,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
            how,
        ) else {
            return;
        };
        match add_watch(self.ino, fd.as_raw_fd(), DIR_MASK) {
            Ok(wd) => {
                self.wds.insert(wd, suffix.to_path_buf());
            }
            Err(e) => {
                tracing::warn!(watch = %self.view, "cannot watch a new directory: {}", describe(&e));
                return;
            }
        }
        self.walk(&fd, suffix, found);
    }

    /// A directory was moved away: drop its watches (it is re-added if it lands inside).
    fn drop_dir(&mut self, suffix: &Path) {
        let gone: Vec<i32> = self
            .wds
            .iter()
            .filter(|(wd, p)| **wd != self.root_wd && p.starts_with(suffix))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.wds.remove(&wd);
            // SAFETY: plain syscall.
            unsafe { libc::inotify_rm_watch(self.ino, wd) };
        }
    }

    /// Turn a buffer of raw events into changes; `true` when the watch is over.
    fn handle(&mut self, buf: &[u8], out: &mut Vec<Change>) -> bool {
        let mut done = false;
        let mut i = 0;
        let u32_at = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        while i + 16 <= buf.len() {
            let wd = u32_at(i) as i32;
            let mask = u32_at(i + 4);
            let cookie = u32_at(i + 8);
            let len = u32_at(i + 12) as usize;
            let end = (i + 16 + len).min(buf.len());
            let raw_name = &buf[i + 16..end];
            let name = &raw_name[..raw_name
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(raw_name.len())];
            i = end;
            if mask & libc::IN_Q_OVERFLOW != 0 {
                tracing::warn!(watch = %self.view, "inotify queue overflow: changes were lost");
                push(out, self.view.clone(), "modified");
                continue;
            }
            if mask & libc::IN_IGNORED != 0 {
                self.wds.remove(&wd);
                if wd == self.root_wd {
                    done = true;
                }
                continue;
            }
            let Some(dir) = self.wds.get(&wd).cloned() else {
                continue;
            };
            if name.is_empty() {
                // Events on a watched inode itself: only the watched path's are reported
                // (a subdirectory's are reported by its parent).
                if wd != self.root_wd || self.only.is_some() {
                    continue;
                }
                let kind = if mask & libc::IN_DELETE_SELF != 0 {
                    "removed"
                } else if mask & libc::IN_MOVE_SELF != 0 {
                    "renamed"
                } else if mask & (libc::IN_MODIFY | libc::IN_ATTRIB) != 0 {
                    "modified"
                } else {
                    continue;
                };
                push(out, self.view.clone(), kind);
                continue;
            }
            let child = dir.join(OsStr::from_bytes(name));
            let isdir = mask & libc::IN_ISDIR != 0;
            if let Some(created) = files::temp_kind(name) {
                // A whole-file write's temp file: hidden; remember its rename.
                if mask & libc::IN_MOVED_FROM != 0 && cookie != 0 {
                    if self.cookies.len() >= MAX_COOKIES {
                        self.cookies.pop_front();
                    }
                    self.cookies.push_back((cookie, created));
                }
                continue;
            }
            if self
                .only
                .as_ref()
                .is_some_and(|only| only.as_slice() != name)
            {
                continue;
            }
            let kind = if mask & libc::IN_CREATE != 0 {
                "created"
            } else if mask & (libc::IN_MODIFY | libc::IN_ATTRIB) != 0 {
                "modified"
            } else if mask & libc::IN_DELETE != 0 {
                "removed"
            } else if mask & libc::IN_MOVED_FROM != 0 {
                if self.recursive && isdir {
                    self.drop_dir(&child);
                }
                "renamed"
            } else if mask & libc::IN_MOVED_TO != 0 {
                match self
                    .cookies
                    .iter()
                    .position(|(c, _)| *c == cookie && cookie != 0)
                {
                    Some(at) => {
                        let (_, created) = self.cookies.remove(at).expect("present");
                        if created {
                            "created"
                        } else {
                            "modified"
                        }
                    }
                    None => "renamed",
                }
            } else {
                continue;
            };
            let path = match self.only {
                Some(_) => self.view.clone(),
                None => self.view_of(&child),
            };
            push(out, path, kind);
            if self.recursive && isdir && mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
                if mask & libc::IN_CREATE != 0 {
                    let mut found = Vec::new();
                    self.add_dir(&child, Some(&mut found));
                    for f in found {
                        push(out, self.view_of(&f), "created");
                    }
                } else {
                    self.add_dir(&child, None);
                }
            }
        }
        done
    }
}

/// Queue a change unless it repeats the previous one.
fn push(out: &mut Vec<Change>, path: String, kind: &str) {
    let c = Change {
        path,
        kind: kind.to_owned(),
    };
    if out.last() != Some(&c) {
        out.push(c);
    }
}

async fn run(afd: AsyncFd<OwnedFd>, mut state: State, tx: Sender<Change>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut changes = Vec::new();
    loop {
        let n = tokio::select! {
            _ = tx.closed() => return,
            ready = afd.readable() => {
                let mut guard = match ready {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::warn!(watch = %state.view, "inotify: {e}");
                        return;
                    }
                };
                let read = guard.try_io(|inner| {
                    // SAFETY: the pointer and length describe `buf`.
                    let r = unsafe {
                        libc::read(inner.get_ref().as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
                    };
                    if r < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(r as usize)
                    }
                });
                match read {
                    Ok(Ok(n)) => n,
                    Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Ok(Err(e)) => {
                        tracing::warn!(watch = %state.view, "inotify read: {e}");
                        return;
                    }
                    Err(_would_block) => continue,
                }
            }
        };
        changes.clear();
        let done = state.handle(&buf[..n], &mut changes);
        for c in changes.drain(..) {
            if tx.send(c).await.is_err() {
                return;
            }
        }
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files;
    use std::time::Duration;
    use tokio::sync::mpsc;

    fn sandbox() -> (tempfile::TempDir, SandboxDirs) {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = SandboxDirs::new(tmp.path().join("sb"));
        std::fs::create_dir_all(&dirs.workspace).unwrap();
        std::fs::create_dir_all(&dirs.tmp).unwrap();
        std::fs::create_dir_all(tmp.path().join("outside")).unwrap();
        (tmp, dirs)
    }

    /// Wait for a change with this path and kind; return everything seen on the way.
    async fn expect(rx: &mut mpsc::Receiver<Change>, path: &str, kind: &str) -> Vec<Change> {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(c)) => {
                    let hit = c.path == path && c.kind == kind;
                    seen.push(c);
                    if hit {
                        return seen;
                    }
                }
                Ok(None) => panic!("channel closed waiting for {kind} {path}; saw {seen:?}"),
                Err(_) => panic!("timed out waiting for {kind} {path}; saw {seen:?}"),
            }
        }
    }

    async fn quiet(rx: &mut mpsc::Receiver<Change>) -> Vec<Change> {
        let mut seen = Vec::new();
        while let Ok(Some(c)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            seen.push(c);
        }
        seen
    }

    #[tokio::test]
    async fn sees_created_modified_removed() {
        let (_tmp, dirs) = sandbox();
        let (tx, mut rx) = mpsc::channel(64);
        let w = Watch::start(&dirs, "sb", "/workspace", false, tx).unwrap();
        let ws = dirs.workspace.clone();
        std::fs::write(ws.join("a.txt"), "1").unwrap();
        expect(&mut rx, "/workspace/a.txt", "created").await;
        expect(&mut rx, "/workspace/a.txt", "modified").await;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(ws.join("a.txt"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"2").unwrap();
        drop(f);
        expect(&mut rx, "/workspace/a.txt", "modified").await;
        std::fs::rename(ws.join("a.txt"), ws.join("b.txt")).unwrap();
        expect(&mut rx, "/workspace/a.txt", "renamed").await;
        expect(&mut rx, "/workspace/b.txt", "renamed").await;
        std::fs::remove_file(ws.join("b.txt")).unwrap();
        expect(&mut rx, "/workspace/b.txt", "removed").await;

        // Whole-file writes through files::write: temp files hidden, created/modified.
        files::write(&dirs, "sb", "c.txt", "new", None, None, false, None).unwrap();
        let seen = expect(&mut rx, "/workspace/c.txt", "created").await;
        files::write(&dirs, "sb", "c.txt", "again", None, None, false, None).unwrap();
        let mut all = seen;
        all.extend(expect(&mut rx, "/workspace/c.txt", "modified").await);
        all.extend(quiet(&mut rx).await);
        assert!(all.iter().all(|c| !c.path.contains(".abx-tmp")), "{all:?}");

        // Non-recursive: nothing from inside a subdirectory.
        std::fs::create_dir(ws.join("sub")).unwrap();
        expect(&mut rx, "/workspace/sub", "created").await;
        std::fs::write(ws.join("sub/inner"), "x").unwrap();
        let rest = quiet(&mut rx).await;
        assert!(rest.iter().all(|c| !c.path.contains("inner")), "{rest:?}");

        assert!(w.is_running());
        w.stop();
        // The task is gone: the sender it held is dropped.
        assert!(tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn recursive_follows_new_directories() {
        let (_tmp, dirs) = sandbox();
        let ws = dirs.workspace.clone();
        std::fs::create_dir_all(ws.join("pre/existing")).unwrap();
        let (tx, mut rx) = mpsc::channel(64);
        let _w = Watch::start(&dirs, "sb", "", true, tx).unwrap();
        std::fs::write(ws.join("pre/existing/f"), "x").unwrap();
        expect(&mut rx, "/workspace/pre/existing/f", "created").await;
        std::fs::create_dir(ws.join("new")).unwrap();
        expect(&mut rx, "/workspace/new", "created").await;
        // Used at once: what lands in a new directory before the watcher added it is found
        // by the scan it makes when it adds it, what lands after by the new watch.
        std::fs::create_dir(ws.join("new/deeper")).unwrap();
        expect(&mut rx, "/workspace/new/deeper", "created").await;
        std::fs::write(ws.join("new/deeper/g"), "y").unwrap();
        expect(&mut rx, "/workspace/new/deeper/g", "created").await;
        // A tree created at once (mkdir -p + file) is reported fully.
        std::fs::create_dir_all(ws.join("burst/a/b")).unwrap();
        std::fs::write(ws.join("burst/a/b/h"), "z").unwrap();
        expect(&mut rx, "/workspace/burst/a/b/h", "created").await;
        // Moves inside the tree keep being tracked under the new name.
        std::fs::rename(ws.join("new"), ws.join("moved")).unwrap();
        expect(&mut rx, "/workspace/moved", "renamed").await;
        std::fs::write(ws.join("moved/deeper/k"), "k").unwrap();
        expect(&mut rx, "/workspace/moved/deeper/k", "created").await;
        std::fs::remove_file(ws.join("moved/deeper/k")).unwrap();
        expect(&mut rx, "/workspace/moved/deeper/k", "removed").await;
        std::fs::remove_dir_all(ws.join("pre")).unwrap();
        expect(&mut rx, "/workspace/pre", "removed").await;
    }

    #[tokio::test]
    async fn file_watch_survives_replacement_and_ends_with_its_dir() {
        let (_tmp, dirs) = sandbox();
        std::fs::create_dir(dirs.tmp.join("d")).unwrap();
        std::fs::write(dirs.tmp.join("d/f"), "1").unwrap();
        std::fs::write(dirs.tmp.join("d/other"), "1").unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let w = Watch::start(&dirs, "sb", "/tmp/d/f", true, tx).unwrap();
        std::fs::write(dirs.tmp.join("d/other"), "2").unwrap(); // a sibling: not reported
        std::fs::write(dirs.tmp.join("d/f"), "2").unwrap();
        let seen = expect(&mut rx, "/tmp/d/f", "modified").await;
        assert!(seen.iter().all(|c| c.path == "/tmp/d/f"), "{seen:?}");
        // Replaced by a whole-file write (temp + rename): still watched, seen as modified.
        files::write(&dirs, "sb", "/tmp/d/f", "3", None, None, false, None).unwrap();
        expect(&mut rx, "/tmp/d/f", "modified").await;
        std::fs::write(dirs.tmp.join("d/f"), "4").unwrap();
        expect(&mut rx, "/tmp/d/f", "modified").await;
        std::fs::remove_file(dirs.tmp.join("d/f")).unwrap();
        expect(&mut rx, "/tmp/d/f", "removed").await;
        std::fs::write(dirs.tmp.join("d/f"), "back").unwrap();
        expect(&mut rx, "/tmp/d/f", "created").await;
        assert!(w.is_running());
        // Removing its directory ends the watch and closes the channel.
        std::fs::remove_dir_all(dirs.tmp.join("d")).unwrap();
        expect(&mut rx, "/tmp/d/f", "removed").await;
        assert!(tokio::time::timeout(Duration::from_secs(5), async {
            while rx.recv().await.is_some() {}
        })
        .await
        .is_ok());
    }

    #[tokio::test]
    async fn file_watch_through_a_link_watches_the_target() {
        let (_tmp, dirs) = sandbox();
        std::fs::write(dirs.workspace.join("real"), "1").unwrap();
        std::os::unix::fs::symlink("real", dirs.workspace.join("link")).unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let _w = Watch::start(&dirs, "sb", "link", false, tx).unwrap();
        std::fs::write(dirs.workspace.join("real"), "2").unwrap();
        expect(&mut rx, "/workspace/link", "modified").await;
        std::fs::remove_file(dirs.workspace.join("real")).unwrap();
        expect(&mut rx, "/workspace/link", "removed").await;
        assert!(tokio::time::timeout(Duration::from_secs(5), async {
            while rx.recv().await.is_some() {}
        })
        .await
        .is_ok());
    }

    #[tokio::test]
    async fn watch_is_confined() {
        let (tmp, dirs) = sandbox();
        std::os::unix::fs::symlink(tmp.path().join("outside"), dirs.workspace.join("out")).unwrap();
        std::os::unix::fs::symlink("/", dirs.workspace.join("root")).unwrap();
        for p in ["out", "root/etc", "/etc", "..", "/workspace/../sb"] {
            let (tx, _rx) = mpsc::channel(1);
            let e = Watch::start(&dirs, "sb", p, true, tx).unwrap_err();
            assert_eq!(e.code, abx_protocol::ErrorCode::PathOutsideSandbox, "{p}");
        }
        let (tx, _rx) = mpsc::channel(1);
        let e = Watch::start(&dirs, "sb", "missing", false, tx).unwrap_err();
        assert_eq!(e.code, abx_protocol::ErrorCode::FileNotFound);
        // A recursive watch of the workspace does not descend through the link.
        let (tx, mut rx) = mpsc::channel(8);
        let _w = Watch::start(&dirs, "sb", "/workspace", true, tx).unwrap();
        std::fs::write(tmp.path().join("outside/x"), "x").unwrap();
        assert!(quiet(&mut rx).await.is_empty());
    }

    #[tokio::test]
    async fn stops_when_receiver_is_gone() {
        let (_tmp, dirs) = sandbox();
        let (tx, rx) = mpsc::channel(1);
        let w = Watch::start(&dirs, "sb", "/tmp", false, tx).unwrap();
        drop(rx);
        for _ in 0..50 {
            if !w.is_running() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the watch task did not end");
    }
}
