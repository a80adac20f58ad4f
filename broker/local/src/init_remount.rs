//! Mounting a sandbox's overlay again while it runs (`sandbox/discard`, issue 43).
//!
//! overlayfs keeps serving what it looked up, so after `sandbox/discard` removed entries from
//! an overlay's upper dir the sandbox sees them only once the overlay is mounted again. PID 1
//! cannot mount any more (it dropped every capability and is under Landlock, which refuses
//! mounts), so the mount is made by the **outer** process: it made the sandbox's user and
//! mount namespaces (it holds every capability in them), it is outside the sandbox's PID
//! namespace (no process of the sandbox can see or signal it), and it serves nothing but this.
//!
//! - Before it forks PID 1, the outer process clones each overlay's state dir
//!   (`mounts/<n>`, `open_tree(OPEN_TREE_CLONE)`) and keeps its `upper` and `work` in that
//!   detached mount: overlayfs clones its upper layer's mount when it is made, which it refuses
//!   for a mount no longer in the namespace (the host's tree is detached from it once PID 1
//!   has pivoted into the sandbox's root), and accepts for a detached tree, which lives as long
//!   as its descriptor ([`prepare`]).
//! - While it builds the root, PID 1 hands the outer process, over a socket pair made before
//!   the fork, each mount's tree (the source mounted at the target, the overlay's lower
//!   layer) as a descriptor ([`hand_over`]).
//! - The daemon asks PID 1 ([`super::Request::Remount`]); PID 1 passes it on and relays the
//!   answer ([`forward`], at most [`ANSWER_MS`]).
//! - The outer process forks a child per request that becomes the sandbox's user (the
//!   overlay's mounter, as at start) and builds the overlay as at start: same lower tree
//!   (its device and inode checked against the source's), upper and work dirs, `userxattr`,
//!   `nosuid`, `nodev`. The new overlay is mounted **beneath** the old one
//!   (`MOVE_MOUNT_BENEATH`, Linux 6.5), the mounts nested in the old one (targets beneath this
//!   one's) are moved onto the new one, then the old one is detached (`MNT_DETACH`): the
//!   target never shows anything but an overlay of the mount.
//! - Landlock ties a rule to the inode the path had when the sandbox was locked down, and
//!   ignores mount points hidden beneath: a write rule on an overlay's own target (`/workspace`,
//!   or a target outside it) would not cover a new overlay there. So a sandbox with such an
//!   overlay has `/` as its write rule (`init::writes_beneath_root`: its root tmpfs is
//!   read-only, so that adds what an image sandbox has), and a target beneath `/workspace` is
//!   covered by `/workspace`'s rule. Only where neither holds (no such case is built today) is
//!   a remount refused (`EOPNOTSUPP`).

use super::{become_inner_user, cstr, emit, os_err, Config, Event};
use serde::{Deserialize, Serialize};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

/// How long PID 1 waits for the outer process's answer.
pub const ANSWER_MS: i32 = 10_000;

/// PID 1's end of the socket pair with the outer process (-1: none).
static HELPER: AtomicI32 = AtomicI32::new(-1);

/// The trees PID 1 mounted (`O_PATH` of each mount's tree root at its target), by mount
/// index, until they are handed over.
static TREES: std::sync::Mutex<Vec<(usize, RawFd)>> = std::sync::Mutex::new(Vec::new());

/// What PID 1 sends the outer process.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
enum ToOuter {
    /// Mount `mount`'s tree root, as a descriptor.
    Layers { mount: usize },
    /// Mount overlay `mount` again.
    Remount { seq: u64, mount: usize },
}

/// The outer process's side: its end of the socket pair, and each overlay's upper and work
/// dirs in a detached clone of their state dir (an error where they could not be had: that
/// overlay is then not mounted again, and the answer says why).
pub struct Outer {
    sock: OwnedFd,
    dirs: Vec<Result<(OwnedFd, OwnedFd), String>>,
    /// The detached clones (a detached tree lives as long as its descriptor).
    _clones: Vec<OwnedFd>,
}

/// Made by the outer process before it forks PID 1 (the host's tree is still in the
/// namespace), when the sandbox has an overlay mount: (the outer's side, PID 1's end).
pub fn prepare(cfg: &Config) -> Result<Option<(Outer, OwnedFd)>, String> {
    use abx_protocol::api::MountMode;
    if !cfg.mounts.iter().any(|m| m.mode == MountMode::Overlay) {
        return Ok(None);
    }
    let mut clones = Vec::new();
    let dirs = cfg
        .mounts
        .iter()
        .map(|m| state_dirs(m, &mut clones))
        .collect();
    let mut sv = [0; 2];
    // SAFETY: socketpair into a local array.
    super::check(
        unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            )
        } as _,
        "socketpair",
    )?;
    // SAFETY: just made.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    Ok(Some((
        Outer {
            sock: ours,
            dirs,
            _clones: clones,
        },
        theirs,
    )))
}

/// An overlay's upper and work dirs, opened in a detached clone of the dir holding both.
fn state_dirs(
    m: &crate::workspace::mounts::InitMount,
    clones: &mut Vec<OwnedFd>,
) -> Result<(OwnedFd, OwnedFd), String> {
    let (Some(upper), Some(work)) = (&m.upper, &m.work) else {
        return Err("not an overlay".into());
    };
    let (Some(dir), Some(u), Some(w)) = (upper.parent(), upper.file_name(), work.file_name())
    else {
        return Err("its layers have no names".into());
    };
    if work.parent() != Some(dir) {
        return Err("its upper and work dirs are not in one directory".into());
    }
    let d = std::fs::File::open(dir).map_err(|e| format!("opening {}: {e}", dir.display()))?;
    let clone = crate::workspace::mounts::clone_tree(d.as_raw_fd())
        .map_err(|e| format!("cloning {}: {e}", dir.display()))?;
    let open = |name: &std::ffi::OsStr| {
        open_at(
            clone.as_raw_fd(),
            &cstr(name),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )
        .map_err(|(_, e)| e)
    };
    let dirs = (open(u)?, open(w)?);
    clones.push(clone);
    Ok(dirs)
}

/// PID 1 keeps its end of the pair.
pub fn keep(fd: OwnedFd) {
    HELPER.store(std::os::fd::IntoRawFd::into_raw_fd(fd), Ordering::Relaxed);
}

/// `mount_workspaces`: the tree of mount `i` is now at its target (`at`: its root).
pub fn note_tree(i: usize, at: &OwnedFd) -> Result<(), String> {
    if HELPER.load(Ordering::Relaxed) < 0 {
        return Ok(());
    }
    let fd = at
        .try_clone()
        .map_err(|e| format!("keeping the tree of mount {i}: {e}"))?;
    TREES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((i, std::os::fd::IntoRawFd::into_raw_fd(fd)));
    Ok(())
}

/// PID 1, once the root is built (before it drops its descriptors and locks itself down):
/// hand every mount's tree to the outer process.
pub fn hand_over() -> Result<(), String> {
    let h = HELPER.load(Ordering::Relaxed);
    let trees = std::mem::take(&mut *TREES.lock().unwrap_or_else(|e| e.into_inner()));
    if h < 0 {
        return Ok(());
    }
    for (i, tree) in trees {
        // SAFETY: our descriptor, closed once sent.
        let tree = unsafe { OwnedFd::from_raw_fd(tree) };
        let body = serde_json::to_vec(&ToOuter::Layers { mount: i }).unwrap_or_default();
        super::send(h, &body, &[tree.as_raw_fd()], 0)
            .map_err(|e| format!("handing over mount {i}: {e}"))?;
    }
    Ok(())
}

/// PID 1: pass a `Remount` on to the outer process and relay its answer (`Done` or
/// `Failed`), waiting at most [`ANSWER_MS`].
pub fn forward(seq: u64, mount: usize) {
    let h = HELPER.load(Ordering::Relaxed);
    if h < 0 {
        super::fail(
            seq,
            "remount: the sandbox has no overlay mount",
            libc::EINVAL,
        );
        return;
    }
    let body = serde_json::to_vec(&ToOuter::Remount { seq, mount }).unwrap_or_default();
    if super::send(h, &body, &[], 0).is_err() {
        super::fail(seq, "remount: the outer process is gone", libc::EPIPE);
        return;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(ANSWER_MS as u64);
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd {
            fd: h,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one local pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32) };
        if n == 0 {
            super::fail(seq, "remount: no answer in time", libc::ETIMEDOUT);
            return;
        }
        if n < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            super::fail(seq, "remount: poll", super::last_errno());
            return;
        }
        match super::recv(h, &mut buf, libc::MSG_DONTWAIT) {
            Ok((0, _)) => {
                super::fail(seq, "remount: the outer process is gone", libc::EPIPE);
                return;
            }
            Ok((n, _)) => match serde_json::from_slice::<Event>(&buf[..n]) {
                // An answer to an earlier request that timed out: dropped.
                Ok(Event::Done { seq: s } | Event::Failed { seq: s, .. }) if s != seq => {}
                Ok(ev @ (Event::Done { .. } | Event::Failed { .. })) => {
                    emit(&ev, &[]);
                    return;
                }
                _ => {}
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => {
                super::fail(seq, "remount: reading the answer", libc::EIO);
                return;
            }
        }
    }
}

/// The outer process, while PID 1 (`pid`) lives: serve PID 1's requests on `sock`. Returns
/// when PID 1 has exited (the caller reaps it) or the socket is gone.
pub fn serve_outer(cfg: &Config, outer: Outer, pid: i32) {
    let Outer { sock, dirs, .. } = outer;
    // SAFETY: pidfd_open of our own child (reaped by the caller only after we return).
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return;
    }
    // SAFETY: just opened.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    let mut trees: Vec<Option<OwnedFd>> = (0..cfg.mounts.len()).map(|_| None).collect();
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll on a local array.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            // EINTR: the SIGTERM handler killed PID 1; its pidfd tells when it is gone.
            continue;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents == 0 {
            continue;
        }
        let (n, got) = match super::recv(sock.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT) {
            Ok((0, _)) => return,
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => continue,
            Err(_) => return,
        };
        match serde_json::from_slice::<ToOuter>(&buf[..n]) {
            Ok(ToOuter::Layers { mount }) if mount < trees.len() && got.len() == 1 => {
                trees[mount] = got.into_iter().next();
            }
            Ok(ToOuter::Remount { seq, mount }) => {
                let ev = match remount(cfg, &trees, &dirs, mount) {
                    Ok(()) => Event::Done { seq },
                    Err((errno, what)) => Event::Failed { seq, errno, what },
                };
                if let Ok(b) = serde_json::to_vec(&ev) {
                    let _ = super::send(sock.as_raw_fd(), &b, &[], 0);
                }
            }
            _ => {}
        }
    }
}

/// Whether overlay `i` may be mounted again: not when its target is a Landlock write rule of
/// its own (see the module's documentation).
fn landlock_allows(cfg: &Config, i: usize) -> bool {
    let t = Path::new(&cfg.mounts[i].target);
    let own_rule = t == Path::new("/workspace") || !t.starts_with("/workspace");
    // Such an overlay makes the sandbox's write rule `/` (init.rs `writes_beneath_root`).
    !(own_rule
        && cfg.image.is_none()
        && !super::writes_beneath_root(cfg)
        && cfg.landlock
        && abx_confine::landlock_abi() > 0)
}

/// Mount overlay `i` again, in a child that becomes the sandbox's user (the overlay's
/// mounter, as at start). Errors: `(errno, what)`.
fn remount(
    cfg: &Config,
    trees: &[Option<OwnedFd>],
    dirs: &[Result<(OwnedFd, OwnedFd), String>],
    i: usize,
) -> Result<(), (i32, String)> {
    use abx_protocol::api::MountMode;
    let Some(mc) = cfg.mounts.get(i) else {
        return Err((libc::EINVAL, format!("remount: no mount {i}")));
    };
    if mc.mode != MountMode::Overlay {
        return Err((
            libc::EINVAL,
            format!("remount: mount {i} is not an overlay"),
        ));
    }
    if !landlock_allows(cfg, i) {
        return Err((
            libc::EOPNOTSUPP,
            format!(
                "remount: {} is a Landlock write rule of its own (the sandbox could not write to a new overlay there)",
                mc.target
            ),
        ));
    }
    if trees[i].is_none() {
        return Err((
            libc::EINVAL,
            format!("remount: mount {i}'s tree is unknown"),
        ));
    }
    if let Err(e) = &dirs[i] {
        return Err((libc::EINVAL, format!("remount: mount {i}'s layers: {e}")));
    }
    let mut p = [0; 2];
    // SAFETY: pipe2 into a local array.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err((super::last_errno(), "remount: pipe".into()));
    }
    // SAFETY: just made.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    // SAFETY: fork in a single-threaded process; the child mounts and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err((super::last_errno(), "remount: fork".into()));
    }
    if pid == 0 {
        drop(r);
        let res = become_inner_user(cfg)
            .map_err(|e| (super::last_errno(), e))
            .and_then(|_| mount_again(cfg, trees, dirs, i));
        let code = match res {
            Ok(()) => 0,
            Err((errno, what)) => {
                let msg = format!("{errno} {what}");
                // SAFETY: write(2) of a local buffer on our pipe.
                unsafe { libc::write(w.as_raw_fd(), msg.as_ptr().cast(), msg.len().min(4000)) };
                1
            }
        };
        // SAFETY: leaving the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    drop(w);
    let mut msg = vec![0u8; 4096];
    let mut len = 0;
    loop {
        // SAFETY: read(2) into our buffer.
        let n = unsafe {
            libc::read(
                r.as_raw_fd(),
                msg[len..].as_mut_ptr().cast(),
                msg.len() - len,
            )
        };
        if n > 0 {
            len += n as usize;
            if len < msg.len() {
                continue;
            }
        }
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        break;
    }
    let mut st = 0;
    // SAFETY: waiting for our own child.
    while unsafe { libc::waitpid(pid, &mut st, 0) } < 0
        && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    {}
    if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&msg[..len]).into_owned();
    let (errno, what) = text
        .split_once(' ')
        .and_then(|(e, w)| Some((e.parse().ok()?, w.to_owned())))
        .unwrap_or((
            libc::EIO,
            format!("remount: the helper ended with status {st}"),
        ));
    Err((errno, what))
}

const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;
const MOVE_MOUNT_BENEATH: u32 = 0x200;

fn open_at(at: RawFd, name: &std::ffi::CStr, flags: libc::c_int) -> Result<OwnedFd, (i32, String)> {
    // SAFETY: openat with a C string and a descriptor we hold.
    let n = unsafe { libc::openat(at, name.as_ptr(), flags | libc::O_CLOEXEC) };
    if n < 0 {
        return Err((
            super::last_errno(),
            os_err(&format!("remount: opening {}", name.to_string_lossy())),
        ));
    }
    // SAFETY: just opened.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

fn dev_ino(fd: RawFd) -> Result<(u64, u64), (i32, String)> {
    crate::workspace::mounts::fstat(fd)
        .map(|st| (st.st_dev, st.st_ino))
        .map_err(|e| {
            (
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("remount: fstat: {e}"),
            )
        })
}

fn move_mount(
    from: RawFd,
    to: RawFd,
    to_name: &std::ffi::CStr,
    flags: u32,
) -> Result<(), (i32, String)> {
    // SAFETY: move_mount between descriptors we hold.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from,
            c"".as_ptr(),
            to,
            to_name.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | flags,
        )
    };
    if rc < 0 {
        return Err((super::last_errno(), os_err("remount: move_mount")));
    }
    Ok(())
}

/// The child's work: the new overlay beneath the old, the nested mounts moved onto it, the
/// old one detached.
fn mount_again(
    cfg: &Config,
    trees: &[Option<OwnedFd>],
    dirs: &[Result<(OwnedFd, OwnedFd), String>],
    i: usize,
) -> Result<(), (i32, String)> {
    let mc = &cfg.mounts[i];
    let (Some(tree), Ok((upper, work))) = (&trees[i], &dirs[i]) else {
        return Err((libc::EINVAL, "remount: no layers".into()));
    };
    // The lower layer: the tree at the target ("." does not cross the mounts on it), still
    // the source directory of create.
    let lower = open_at(tree.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY)?;
    if dev_ino(lower.as_raw_fd())? != (mc.dev, mc.ino) {
        return Err((
            libc::ESTALE,
            format!(
                "remount: the tree at {} is no longer the directory mounted at create",
                mc.target
            ),
        ));
    }
    // The top of the target: the old overlay.
    let name = Path::new(&mc.target)
        .file_name()
        .map(cstr)
        .ok_or((libc::EINVAL, "remount: the target has no name".to_owned()))?;
    let parent = open_at(tree.as_raw_fd(), c"..", libc::O_PATH | libc::O_DIRECTORY)?;
    let top_of = || {
        open_at(
            parent.as_raw_fd(),
            &name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )
    };
    let old = top_of()?;
    // SAFETY: fstatfs into a zeroed local struct.
    let magic = unsafe {
        let mut sf: libc::statfs = std::mem::zeroed();
        if libc::fstatfs(old.as_raw_fd(), &mut sf) != 0 {
            return Err((super::last_errno(), os_err("remount: fstatfs")));
        }
        sf.f_type as i64
    };
    if magic != OVERLAYFS_SUPER_MAGIC {
        return Err((
            libc::EINVAL,
            format!("remount: the top of {} is not its overlay", mc.target),
        ));
    }
    let old_dev = dev_ino(old.as_raw_fd())?.0;
    let new = super::overlay_fd(
        lower.as_raw_fd(),
        upper.as_raw_fd(),
        work.as_raw_fd(),
        super::MOUNT_ATTR_NOSUID | super::MOUNT_ATTR_NODEV,
    )
    .map_err(|e| (super::last_errno(), format!("remount: {e}")))?;
    let new_dev = dev_ino(new.as_raw_fd())?.0;
    move_mount(
        new.as_raw_fd(),
        old.as_raw_fd(),
        c"",
        MOVE_MOUNT_T_EMPTY_PATH | MOVE_MOUNT_BENEATH,
    )?;
    // The mounts nested in this one (the nearest beneath it; the deeper ones ride on them)
    // move onto the new overlay, their mount points made where missing (as at start).
    let t = Path::new(&mc.target);
    let within = |a: &Path, b: &Path| a != b && a.starts_with(b);
    for (j, other) in cfg.mounts.iter().enumerate() {
        let ot = Path::new(&other.target);
        if j == i || !within(ot, t) {
            continue;
        }
        let nearest = !cfg.mounts.iter().enumerate().any(|(k, m)| {
            let mt = Path::new(&m.target);
            k != i && k != j && within(mt, t) && within(ot, mt)
        });
        let Some(tree_j) = trees[j].as_ref().filter(|_| nearest) else {
            continue;
        };
        let rel = ot.strip_prefix(t).unwrap_or(ot);
        let mut dir = open_at(new.as_raw_fd(), c".", libc::O_PATH | libc::O_DIRECTORY)?;
        for c in rel.components() {
            let std::path::Component::Normal(n) = c else {
                continue;
            };
            let n = cstr(n);
            // SAFETY: mkdirat with a C string and a descriptor we hold.
            let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), n.as_ptr(), 0o755) };
            if rc != 0 && super::last_errno() != libc::EEXIST {
                return Err((super::last_errno(), os_err("remount: a nested mount point")));
            }
            dir = open_at(
                dir.as_raw_fd(),
                &n,
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            )?;
        }
        move_mount(
            tree_j.as_raw_fd(),
            dir.as_raw_fd(),
            c"",
            MOVE_MOUNT_T_EMPTY_PATH,
        )?;
    }
    // Detach the old overlay, the top of the target (a process inside it keeps its view).
    if dev_ino(top_of()?.as_raw_fd())?.0 != old_dev {
        return Err((libc::EBUSY, "remount: the target changed meanwhile".into()));
    }
    // SAFETY: fchdir to our descriptor, then umount2 of a name relative to it (this child's
    // working directory only).
    unsafe {
        if libc::fchdir(parent.as_raw_fd()) != 0 {
            return Err((super::last_errno(), os_err("remount: fchdir")));
        }
        if libc::umount2(name.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) != 0 {
            return Err((
                super::last_errno(),
                os_err("remount: detaching the old overlay"),
            ));
        }
    }
    if dev_ino(top_of()?.as_raw_fd())?.0 != new_dev {
        return Err((libc::EIO, "remount: the new overlay is not on top".into()));
    }
    Ok(())
}
