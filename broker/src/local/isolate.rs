//! How a sandbox's process is confined (DESIGN §8).
//!
//! Three models, chosen once per broker by [`model()`]:
//!
//! - **`namespaces`** (preferred; needs unprivileged user + mount namespaces). In the child,
//!   between `fork` and `exec`, the process enters a new user and mount namespace (its own
//!   uid/gid mapped to themselves, so files it creates belong to the broker's user), and
//!   sees a *composed root* built like bubblewrap builds one: a tmpfs (made read-only) that
//!   holds every top-level entry of the host `/`. Host directories are recursive read-only
//!   bind mounts (`mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY)`), top-level symlinks
//!   (`/bin -> usr/bin`) are the same symlinks, `/proc` and `/dev` are recursive binds of the
//!   host's, `/sys` a read-only one, `/workspace` and `/tmp` are read-write binds of the
//!   sandbox's `workspace` and `tmp` directories, and `/dev/shm` a bind of the sandbox's
//!   private `.shm` directory (shared by all processes of the sandbox). The directory
//!   holding the broker's sandboxes (and every path given to [`hide_paths`]) is covered by an
//!   empty read-only tmpfs, so a sandbox cannot read other sandboxes' files through the
//!   read-only host view. Then `pivot_root` (or `chroot` where that fails), the old root is
//!   detached, and the process starts in its working directory under `/workspace`.
//! - **`landlock`** (fallback without namespaces): the process runs in the host filesystem,
//!   starting in the host directory of its working directory, with `HOME` and `TMPDIR` set
//!   to the host `workspace` and `tmp` directories.
//! - **`none`**: only the working directory and the environment; nothing is confined. Used
//!   only when neither namespaces nor Landlock work (or when forced).
//!
//! In the `namespaces` and `landlock` models the process then drops every capability (the
//! bounding set is cleared with `PR_CAPBSET_DROP`, ambient caps cleared, then `capset` to
//! empty: a process that is root inside its user namespace must not be able to remount
//! anything), sets `PR_SET_NO_NEW_PRIVS`, and restricts itself with a Landlock ruleset built
//! before the fork: read and execute everywhere; write, create, remove, rename, truncate only
//! beneath the sandbox's `workspace` and `tmp` (and its `.shm`, or the host `/dev/shm` in the
//! `landlock` model); write, truncate and device ioctls only on the terminal and null-like
//! devices (`/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom`, `/dev/tty`,
//! `/dev/ptmx`, `/dev/pts/*`). A Landlock domain also forbids mounting and ptrace of
//! processes outside it.
//!
//! The Landlock rules are tied to inodes: the prepared rules (host `/`, the sandbox's
//! directories, the devices) still apply through the bind mounts, but a path walk in the
//! composed root ends at its tmpfs, never at the host `/`, so the child adds one more
//! read/execute rule for that tmpfs (a raw `landlock_add_rule` on the prepared ruleset fd)
//! before `landlock_restrict_self`.
//!
//! Every confined process carries `ABX_SANDBOX_ID=<id>` in its environment (see
//! [`super::procs`]).
//!
//! Verified on this machine (kernel 6.18, Landlock ABI 7) as root and as an unprivileged user
//! (`nobody`): all three models work; a namespaced spawn costs about 4 ms (the root is
//! composed per exec), a Landlock one about 2 ms.
//!
//! Everything the child needs is computed in [`Confine::new`]; the `pre_exec` hook only makes
//! system calls (no allocation, no locks). A failing step makes the spawn fail with an
//! `io::Error` whose raw code encodes the step and the errno; [`explain_spawn_error`] turns it
//! into a readable message (the caller reports E3003).
//!
//! ## Limits (honest list)
//!
//! - Network: the host's (no network namespace); `describe()` says `network: "host"`.
//!   Unix sockets on the read-only host view can still be connected to (Landlock before
//!   ABI 9 does not cover `connect`), so a sandbox can reach the user's session sockets,
//!   including the broker's own socket unless the broker refuses peers that belong to a
//!   sandbox (see [`super::procs::sandbox_of`]).
//! - Signals: no pid namespace and no Landlock signal scoping (every exec is its own Landlock
//!   domain, so scoping would stop `kill` between two execs of one sandbox); a sandbox process
//!   can signal other processes of the same user. It cannot ptrace them (Landlock).
//! - Reads: the whole host is readable (as the broker's user). In the `namespaces` model the
//!   sandboxes directory and [`hide_paths`] are hidden; in the `landlock` model they are not
//!   (Landlock cannot carve a read hole out of an allowed tree).
//! - `/proc` is the host's (a bind: a fresh procfs needs a pid namespace), so a sandbox sees
//!   every pid; Landlock denies writes beneath it (e.g. `/proc/self/oom_score_adj`).
//! - In the `landlock` model the host `/dev/shm` is writable and the host `/tmp` is readable.
//! - When the broker runs as root, a sandbox process is uid 0 (mapped to itself) without
//!   capabilities: root-owned host files are protected by the read-only mounts and Landlock,
//!   not by file permissions.
//! - The sandboxes directory is hidden only where it is visible at all, i.e. beneath a host
//!   directory that is bound (not under the host `/tmp`, which sandboxes never see), and only
//!   when it is not itself a top-level directory.
//! - Nested user namespaces can still be created inside, but Landlock denies writing their
//!   `uid_map` and any mount, so they give nothing.
//! - Read-only binds rely on `mount_setattr` (Linux 5.12). Without it the fallback remount is
//!   not recursive: sub-mounts of a host directory stay as writable as on the host (Landlock
//!   still denies writes where the kernel has it).
//! - Each exec has its own mount namespace: mounts made inside (none can be: no caps and
//!   Landlock forbid it) would not be shared; files are shared through the binds.

use super::{split_path, Area, SandboxDirs, TMP, WORKSPACE};
use abx_protocol::{AbxError, ErrorCode};
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The environment variable that forces a model (`namespaces`, `landlock`, `none`).
pub const FORCE_ENV: &str = "ABX_ISOLATION";

/// How a sandbox's processes are confined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Model {
    /// User + mount namespaces with a composed root, caps dropped, Landlock.
    Namespaces,
    /// Host filesystem, writes confined by Landlock, caps dropped.
    Landlock,
    /// Working directory and environment only.
    Unconfined,
}

impl Model {
    /// The wire name: `namespaces`, `landlock` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Model::Namespaces => "namespaces",
            Model::Landlock => "landlock",
            Model::Unconfined => "none",
        }
    }

    /// Parse a wire name (`unconfined` is accepted for `none`).
    pub fn parse(s: &str) -> Option<Model> {
        match s.trim().to_ascii_lowercase().as_str() {
            "namespaces" | "namespace" | "ns" => Some(Model::Namespaces),
            "landlock" => Some(Model::Landlock),
            "none" | "unconfined" => Some(Model::Unconfined),
            _ => None,
        }
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

static MODEL: OnceLock<Model> = OnceLock::new();
static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
static HIDDEN: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The model in force for this broker: `ABX_ISOLATION` if set to a known model (the
/// opt-in to the weaker `landlock` or `none` models), else `namespaces`. There is no silent
/// fallback: where namespaces do not work, creating a sandbox fails and says how to opt in.
pub fn model() -> Model {
    *MODEL.get_or_init(|| {
        if let Ok(v) = std::env::var(FORCE_ENV) {
            match Model::parse(&v) {
                Some(m) => {
                    tracing::warn!(model = %m, "isolation model chosen by {FORCE_ENV}");
                    return m;
                }
                None => tracing::warn!(value = %v, "ignoring unknown {FORCE_ENV}"),
            }
        }
        Model::Namespaces
    })
}

/// The Landlock ABI in use (0 when the kernel has none; see [`crate::confine::landlock_abi`]).
pub fn landlock_abi() -> i32 {
    crate::confine::landlock_abi()
}

/// Whether the namespace model works here (probed once, with the reason when it does not).
pub fn namespaces_probe() -> Result<(), String> {
    PROBE.get_or_init(probe_once).clone()
}

fn probe_once() -> Result<(), String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let base = std::env::temp_dir().join(format!(
        "abx-isolation-probe-{}-{nanos}",
        std::process::id()
    ));
    let result = (|| {
        let dirs = SandboxDirs::new(base.clone());
        fs::create_dir_all(&dirs.workspace).map_err(|e| format!("probe dir: {e}"))?;
        fs::create_dir_all(&dirs.tmp).map_err(|e| format!("probe dir: {e}"))?;
        let cfg = super::container::config(&dirs, "isolation-probe", "none", None);
        super::container::probe(&cfg)
    })();
    let _ = fs::remove_dir_all(&base);
    result
}

/// Check a working directory of a sandbox (`/workspace/sub`, `/tmp`, or relative = under
/// `/workspace`) and return it as the sandbox sees it: E4002 when it leaves the sandbox
/// (`..`, a symlink out), E4001 when it does not exist, E4004 when it is not a directory.
pub fn check_cwd(dirs: &SandboxDirs, sandbox_id: &str, cwd: &str) -> Result<String, AbxError> {
    let (area, rel) = split_path(cwd)?;
    open_cwd(dirs, area, &rel, sandbox_id, cwd)?;
    Ok(super::view_path(area, &rel))
}

/// What `sandbox/systemInfo` and provider info say about isolation: the model, what a
/// sandbox sees, and what the model does not protect.
pub fn describe() -> serde_json::Value {
    let m = model();
    let abi = landlock_abi();
    let mut v = serde_json::json!({
        "model": m.as_str(),
        "landlock": {
            "abi": abi,
            "enforced": abi > 0 && m != Model::Unconfined,
            "scoped": abi >= 6 && m == Model::Namespaces,
        },
    });
    match m {
        Model::Namespaces => {
            v["namespaces"] = serde_json::json!([
                "user",
                "mount",
                "pid",
                "ipc",
                "uts",
                "net (unless network is host)"
            ]);
            v["root"] = serde_json::json!({
                "system": super::container::SYSTEM_DIRS.iter().map(|d| format!("/{d} (read-only)")).collect::<Vec<_>>(),
                "etc": super::container::ETC_ENTRIES.iter().map(|e| format!("/etc/{e}")).collect::<Vec<_>>(),
                "etcGenerated": ["/etc/passwd", "/etc/group", "/etc/hosts", "/etc/hostname"],
                "writable": ["/workspace", "/tmp", "/dev/shm"],
                "dev": ["null", "zero", "full", "random", "urandom", "tty", "pts (own instance)", "ptmx", "shm", "fd", "stdin", "stdout", "stderr"],
                "proc": "own (the sandbox's PID namespace)",
                "notVisible": ["home directories", "/root", "/run", "/var", "/srv", "/opt", "/mnt", "/media", "/sys", "the host /tmp", "other sandboxes", "the broker's state and socket"],
            });
            v["processes"] = serde_json::json!(
                "own PID namespace; an init as PID 1 reaps; kill ends every process"
            );
            if let Some(Err(reason)) = PROBE.get() {
                v["namespacesError"] = serde_json::Value::String(reason.clone());
            }
        }
        Model::Landlock | Model::Unconfined => {
            v["doesNotProtect"] = serde_json::json!([
                "the host filesystem is readable as the broker's user (home directories, keys, tokens)",
                "processes of the broker's user can be seen and signalled",
                "the host network and loopback services are reachable",
                "the broker socket can be reached; the broker refuses peers by an environment marker that a process can shed",
                "no process, memory or CPU limits",
            ]);
            if m == Model::Unconfined {
                v["doesNotProtect"]
                    .as_array_mut()
                    .expect("array")
                    .push(serde_json::json!(
                        "writes anywhere the broker's user can write"
                    ));
            }
        }
    }
    v
}

/// Hide more host directories from sandboxes (the broker's runtime, data and config
/// directories): in the `namespaces` model each is covered by an empty read-only tmpfs in
/// the composed root. Applies to processes confined after the call.
pub fn hide_paths<I: IntoIterator<Item = PathBuf>>(paths: I) {
    let mut h = HIDDEN.lock().unwrap_or_else(|e| e.into_inner());
    for p in paths {
        if !h.contains(&p) {
            h.push(p);
        }
    }
}

/// Map a sandbox path (`/workspace/a`, `/tmp/b`, or relative = under `/workspace`) to the
/// host path beneath the sandbox's directories. Lexical: `..` cannot climb out (E4002),
/// symlinks are not resolved.
pub fn host_path(dirs: &SandboxDirs, view_path: &str) -> Result<PathBuf, AbxError> {
    let (area, rel) = split_path(view_path)?;
    let base = dirs.area_dir(area);
    Ok(if rel.as_os_str().is_empty() {
        base.to_path_buf()
    } else {
        base.join(rel)
    })
}

// ---------------------------------------------------------------------------------------
// Child-side error reporting.

/// Raw error codes at or above this (and below `ERR_BASE + 64 * ERR_STEP`) are confinement
/// failures: `ERR_BASE + step * ERR_STEP + errno`.
const ERR_BASE: i32 = 0x0100_0000;
const ERR_STEP: i32 = 4096;

/// The steps of the child setup (for error messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
enum Step {
    Unshare = 1,
    Setgroups,
    UidMap,
    GidMap,
    MakePrivate,
    RootTmpfs,
    MountPoint,
    BindHost,
    ReadOnly,
    BindWorkspace,
    BindTmp,
    BindDev,
    BindProc,
    BindShm,
    Symlink,
    Hide,
    RootReadOnly,
    PivotRoot,
    Chdir,
    CapBound,
    CapSet,
    NoNewPrivs,
    LandlockRule,
    LandlockRestrict,
    MountAttrs,
}

const STEPS: [Step; 25] = [
    Step::Unshare,
    Step::Setgroups,
    Step::UidMap,
    Step::GidMap,
    Step::MakePrivate,
    Step::RootTmpfs,
    Step::MountPoint,
    Step::BindHost,
    Step::ReadOnly,
    Step::BindWorkspace,
    Step::BindTmp,
    Step::BindDev,
    Step::BindProc,
    Step::BindShm,
    Step::Symlink,
    Step::Hide,
    Step::RootReadOnly,
    Step::PivotRoot,
    Step::Chdir,
    Step::CapBound,
    Step::CapSet,
    Step::NoNewPrivs,
    Step::LandlockRule,
    Step::LandlockRestrict,
    Step::MountAttrs,
];

impl Step {
    fn what(self) -> &'static str {
        match self {
            Step::Unshare => "creating the user and mount namespaces (unshare)",
            Step::Setgroups => "writing /proc/self/setgroups",
            Step::UidMap => "writing /proc/self/uid_map",
            Step::GidMap => "writing /proc/self/gid_map",
            Step::MakePrivate => "making the mount tree private",
            Step::RootTmpfs => "mounting the tmpfs of the composed root",
            Step::MountPoint => "creating a mount point in the composed root",
            Step::BindHost => "bind-mounting a host entry into the composed root",
            Step::ReadOnly => "making a host bind mount read-only",
            Step::BindWorkspace => "bind-mounting /workspace",
            Step::BindTmp => "bind-mounting /tmp",
            Step::BindDev => "bind-mounting /dev",
            Step::BindProc => "bind-mounting /proc",
            Step::BindShm => "bind-mounting /dev/shm",
            Step::Symlink => "creating a top-level symlink in the composed root",
            Step::Hide => "hiding the broker's data directories",
            Step::RootReadOnly => "making the composed root read-only",
            Step::PivotRoot => "switching to the composed root (pivot_root/chroot)",
            Step::Chdir => "changing to the working directory",
            Step::CapBound => "clearing the capability bounding set",
            Step::CapSet => "dropping capabilities",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::LandlockRule => "adding a Landlock rule",
            Step::LandlockRestrict => "enforcing the Landlock ruleset",
            Step::MountAttrs => "setting mount attributes",
        }
    }
}

fn encode(step: Step, errno: i32) -> i32 {
    ERR_BASE + step as i32 * ERR_STEP + errno.clamp(0, ERR_STEP - 1)
}

/// Decode a confinement failure: (what failed, errno).
fn decode(code: i32) -> Option<(Step, i32)> {
    if code < ERR_BASE {
        return None;
    }
    let rel = code - ERR_BASE;
    let step = rel / ERR_STEP;
    STEPS
        .iter()
        .find(|s| **s as i32 == step)
        .map(|s| (*s, rel % ERR_STEP))
}

/// A readable message for a spawn error of a confined command: the failed sandbox setup step
/// with its OS error, or the error itself (program not found, ...).
pub fn explain_spawn_error(err: &io::Error) -> String {
    match err.raw_os_error().and_then(decode) {
        Some((step, errno)) => format!(
            "sandbox setup failed while {}: {}",
            step.what(),
            io::Error::from_raw_os_error(errno)
        ),
        None => err.to_string(),
    }
}

/// Whether a spawn error came from the sandbox setup (rather than from `exec`).
pub fn is_setup_error(err: &io::Error) -> bool {
    err.raw_os_error().and_then(decode).is_some()
}

// ---------------------------------------------------------------------------------------
// The plan executed in the child.

/// A mount-tree action of the namespace model.
#[derive(Debug)]
enum Action {
    Mkdir {
        path: CString,
    },
    Touch {
        path: CString,
    },
    Symlink {
        target: CString,
        path: CString,
    },
    /// `mount --rbind src dst`, then `mount_setattr(AT_RECURSIVE)` with `set`.
    Bind {
        src: CString,
        dst: CString,
        set: u64,
        step: Step,
        /// A failing bind leaves an empty mount point instead of failing the spawn.
        optional: bool,
    },
    /// An empty read-only tmpfs over `dst`.
    Hide {
        dst: CString,
    },
    /// Detach the copy of the composed root that a recursive bind of its host ancestor
    /// brought along (the root tmpfs was mounted before the bind). Best effort.
    Unmount {
        path: CString,
    },
}

#[derive(Debug)]
struct NsPlan {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    new_root: CString,
    actions: Vec<Action>,
    /// The working directory as the process sees it.
    cwd: CString,
}

#[derive(Debug)]
struct Plan {
    ns: Option<NsPlan>,
    /// The validated working directory (Landlock and none models): `fchdir`.
    cwd_fd: Option<OwnedFd>,
    /// Drop caps, no_new_privs, Landlock.
    confine: bool,
    ruleset: Option<OwnedFd>,
    last_cap: i32,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(rc: libc::c_long, step: Step) -> Result<(), i32> {
    if rc < 0 {
        Err(encode(step, errno()))
    } else {
        Ok(())
    }
}

/// Write `data` to `path` (async-signal-safe).
unsafe fn write_file(path: &CStr, data: &[u8]) -> Result<(), i32> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(errno());
    }
    let n = libc::write(fd, data.as_ptr().cast(), data.len());
    let e = errno();
    libc::close(fd);
    if n < 0 {
        Err(e)
    } else if n as usize != data.len() {
        Err(libc::EIO)
    } else {
        Ok(())
    }
}

unsafe fn set_mount_attrs(path: &CStr, set: u64, recursive: bool) -> libc::c_long {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 } as libc::c_uint;
    let rc = libc::syscall(
        libc::SYS_mount_setattr,
        libc::AT_FDCWD,
        path.as_ptr(),
        flags,
        &attr as *const MountAttr,
        std::mem::size_of::<MountAttr>(),
    );
    if rc < 0 && errno() == libc::ENOSYS {
        // Before Linux 5.12: remount the top mount only, keeping its locked flags.
        // (glibc's statvfs is one statfs call on kernels since 2.6.36: ST_VALID.)
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path.as_ptr(), &mut st) != 0 {
            return -1;
        }
        let keep = (st.f_flag as libc::c_ulong)
            & (libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC
                | libc::MS_NOATIME
                | libc::MS_NODIRATIME
                | libc::MS_RELATIME
                | libc::MS_RDONLY);
        let mut flags = libc::MS_REMOUNT | libc::MS_BIND | keep;
        if set & MOUNT_ATTR_RDONLY != 0 {
            flags |= libc::MS_RDONLY;
        }
        if set & MOUNT_ATTR_NOSUID != 0 {
            flags |= libc::MS_NOSUID;
        }
        if set & MOUNT_ATTR_NODEV != 0 {
            flags |= libc::MS_NODEV;
        }
        return libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        ) as libc::c_long;
    }
    rc
}

unsafe fn ns_setup(ns: &NsPlan, ruleset: Option<RawFd>) -> Result<(), i32> {
    let null = std::ptr::null::<libc::c_char>();
    check(
        libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) as _,
        Step::Unshare,
    )?;
    match write_file(c"/proc/self/setgroups", b"deny") {
        Ok(()) => {}
        Err(libc::ENOENT) => {}
        Err(e) => return Err(encode(Step::Setgroups, e)),
    }
    write_file(c"/proc/self/uid_map", &ns.uid_map).map_err(|e| encode(Step::UidMap, e))?;
    write_file(c"/proc/self/gid_map", &ns.gid_map).map_err(|e| encode(Step::GidMap, e))?;
    check(
        libc::mount(
            null,
            c"/".as_ptr(),
            null,
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) as _,
        Step::MakePrivate,
    )?;
    let root = ns.new_root.as_ptr();
    check(
        libc::mount(
            c"tmpfs".as_ptr(),
            root,
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            c"mode=0755".as_ptr().cast(),
        ) as _,
        Step::RootTmpfs,
    )?;
    for action in &ns.actions {
        match action {
            Action::Mkdir { path } => {
                if libc::mkdir(path.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                    return Err(encode(Step::MountPoint, errno()));
                }
            }
            Action::Touch { path } => {
                let fd = libc::open(
                    path.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    return Err(encode(Step::MountPoint, errno()));
                }
                libc::close(fd);
            }
            Action::Symlink { target, path } => {
                if libc::symlink(target.as_ptr(), path.as_ptr()) != 0 && errno() != libc::EEXIST {
                    return Err(encode(Step::Symlink, errno()));
                }
            }
            Action::Bind {
                src,
                dst,
                set,
                step,
                optional,
            } => {
                let rc = libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                );
                if rc != 0 {
                    if *optional {
                        continue;
                    }
                    return Err(encode(*step, errno()));
                }
                if *set != 0 {
                    let step = if *set & MOUNT_ATTR_RDONLY != 0 {
                        Step::ReadOnly
                    } else {
                        Step::MountAttrs
                    };
                    check(set_mount_attrs(dst, *set, true), step)?;
                }
            }
            Action::Unmount { path } => {
                libc::umount2(path.as_ptr(), libc::MNT_DETACH);
            }
            Action::Hide { dst } => {
                check(
                    libc::mount(
                        c"tmpfs".as_ptr(),
                        dst.as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        c"mode=0755,size=4k".as_ptr().cast(),
                    ) as _,
                    Step::Hide,
                )?;
            }
        }
    }
    check(
        libc::mount(
            null,
            root,
            null,
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            std::ptr::null(),
        ) as _,
        Step::RootReadOnly,
    )?;
    if let Some(rs) = ruleset {
        // The composed root is a fresh tmpfs: the walk up from any path ends at it, never at
        // the host `/` of the prepared rule, so it needs its own read/execute rule.
        let fd = libc::open(root, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(encode(Step::LandlockRule, errno()));
        }
        let attr = PathBeneathAttr {
            allowed_access: crate::confine::read_access().bits(),
            parent_fd: fd,
        };
        let rc = libc::syscall(
            libc::SYS_landlock_add_rule,
            rs,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        );
        let e = errno();
        libc::close(fd);
        if rc < 0 {
            return Err(encode(Step::LandlockRule, e));
        }
    }
    check(libc::chdir(root) as _, Step::PivotRoot)?;
    if libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) == 0 {
        check(
            libc::umount2(c".".as_ptr(), libc::MNT_DETACH) as _,
            Step::PivotRoot,
        )?;
    } else {
        check(libc::chroot(c".".as_ptr()) as _, Step::PivotRoot)?;
    }
    check(libc::chdir(c"/".as_ptr()) as _, Step::PivotRoot)?;
    check(libc::chdir(ns.cwd.as_ptr()) as _, Step::Chdir)?;
    Ok(())
}

unsafe fn drop_caps(last_cap: i32, strict: bool) -> Result<(), i32> {
    libc::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL,
        0 as libc::c_ulong,
        0 as libc::c_ulong,
        0 as libc::c_ulong,
    );
    for cap in 0..=last_cap {
        if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0 {
            let e = errno();
            // EINVAL: a cap this kernel does not know. EPERM: no CAP_SETPCAP (an unprivileged
            // user in the Landlock model has no caps to lose, and no_new_privs stops gaining).
            if e == libc::EINVAL || (e == libc::EPERM && !strict) {
                continue;
            }
            return Err(encode(Step::CapBound, e));
        }
    }
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    check(
        libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()),
        Step::CapSet,
    )
}

/// Runs in the child between fork and exec: system calls only.
unsafe fn child_setup(p: &Plan) -> Result<(), i32> {
    crate::state::restore_fd_limit_in_child();
    let ruleset = p.ruleset.as_ref().map(|f| f.as_raw_fd());
    if let Some(ns) = &p.ns {
        ns_setup(ns, ruleset)?;
    } else if let Some(fd) = &p.cwd_fd {
        check(libc::fchdir(fd.as_raw_fd()) as _, Step::Chdir)?;
    }
    if !p.confine {
        return Ok(());
    }
    drop_caps(p.last_cap, p.ns.is_some())?;
    check(
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as _,
        Step::NoNewPrivs,
    )?;
    if let Some(rs) = ruleset {
        check(
            libc::syscall(libc::SYS_landlock_restrict_self, rs, 0u32),
            Step::LandlockRestrict,
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Preparation (before fork).

/// The sandbox's Landlock ruleset (the shared [`crate::confine`] mechanism): read and execute
/// everywhere, write beneath `writable`, the network left to the host.
fn build_ruleset(writable: Vec<PathBuf>) -> Result<Option<OwnedFd>, AbxError> {
    let policy = crate::confine::Policy {
        read: vec![PathBuf::from("/")],
        write: writable,
        exec: None,
        net: crate::confine::Net::Any,
    };
    Ok(policy.prepare().map_err(AbxError::internal)?.ruleset)
}

fn cstring(p: impl AsRef<OsStr>) -> Result<CString, AbxError> {
    CString::new(p.as_ref().as_bytes())
        .map_err(|_| AbxError::internal("a path of the sandbox contains a NUL byte"))
}

fn internal(what: &str, e: impl fmt::Display) -> AbxError {
    AbxError::internal(format!("{what}: {e}"))
}

/// A top-level entry of the host `/`.
enum TopEntry {
    Dir,
    File,
    Symlink(PathBuf),
}

fn host_top_entries() -> io::Result<Vec<(OsString, TopEntry)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir("/")? {
        let entry = entry?;
        let name = entry.file_name();
        let Ok(ft) = entry.file_type() else { continue };
        let kind = if ft.is_symlink() {
            match fs::read_link(entry.path()) {
                Ok(t) => TopEntry::Symlink(t),
                Err(_) => continue,
            }
        } else if ft.is_dir() {
            TopEntry::Dir
        } else if ft.is_file() {
            TopEntry::File
        } else {
            // Sockets, fifos, devices at the top level: not carried over.
            continue;
        };
        out.push((name, kind));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Top-level names the composed root provides itself.
const SPECIAL_TOP: [&str; 5] = ["proc", "dev", "sys", "tmp", "workspace"];

/// The first path component of an absolute path, if the path has at least `min` components.
fn top_component(p: &Path, min: usize) -> Option<&OsStr> {
    let mut normals = p.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n),
        _ => None,
    });
    let first = normals.next()?;
    if 1 + normals.count() >= min {
        Some(first)
    } else {
        None
    }
}

/// Confinement of one process of a sandbox, computed before the fork.
pub struct Confine {
    model: Model,
    env: Vec<(&'static str, OsString)>,
    cwd_view: String,
    plan: Plan,
}

impl fmt::Debug for Confine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Confine")
            .field("model", &self.model)
            .field("cwd", &self.cwd_view)
            .finish_non_exhaustive()
    }
}

impl Confine {
    /// Prepare confinement of a process of this sandbox under the broker's [`model()`].
    ///
    /// `cwd` is a sandbox-view directory (`/workspace/sub`, `/tmp`, or relative = under
    /// `/workspace`): E4002 when it leaves the sandbox (`..`, a symlink out), E4001 when it
    /// does not exist, E4004 when it is not a directory.
    pub fn new(dirs: &SandboxDirs, sandbox_id: &str, cwd: &str) -> Result<Confine, AbxError> {
        Confine::with_model(model(), dirs, sandbox_id, cwd)
    }

    /// [`Confine::new`] with an explicit model (tests, the probe).
    pub fn with_model(
        model: Model,
        dirs: &SandboxDirs,
        sandbox_id: &str,
        cwd: &str,
    ) -> Result<Confine, AbxError> {
        let (area, rel) = split_path(cwd)?;
        let cwd_fd = open_cwd(dirs, area, &rel, sandbox_id, cwd)?;
        let canon =
            |p: &Path| fs::canonicalize(p).map_err(|e| internal(&p.display().to_string(), e));
        let root = canon(&dirs.root)?;
        let workspace = canon(&dirs.workspace)?;
        let tmp = canon(&dirs.tmp)?;
        let host_cwd = {
            let base = match area {
                Area::Workspace => &workspace,
                Area::Tmp => &tmp,
            };
            if rel.as_os_str().is_empty() {
                base.clone()
            } else {
                base.join(&rel)
            }
        };
        let view_cwd = super::view_path(area, &rel);
        let (home, tmpdir, pwd) = match model {
            Model::Namespaces => (
                OsString::from(WORKSPACE),
                OsString::from(TMP),
                OsString::from(&view_cwd),
            ),
            _ => (
                workspace.clone().into_os_string(),
                tmp.clone().into_os_string(),
                host_cwd.clone().into_os_string(),
            ),
        };
        let env = vec![
            (super::procs::MARKER, OsString::from(sandbox_id)),
            ("HOME", home),
            ("TMPDIR", tmpdir),
            ("PWD", pwd),
        ];

        let mut plan = Plan {
            ns: None,
            cwd_fd: None,
            confine: model != Model::Unconfined,
            ruleset: None,
            last_cap: last_cap(),
        };
        match model {
            Model::Namespaces => {
                let shm = root.join(".shm");
                // A real directory (not a symlink such as `/dev/shm -> /run/shm`, which would
                // resolve outside the composed root when mounting on it).
                let host_shm = fs::symlink_metadata("/dev/shm").is_ok_and(|m| m.is_dir());
                if host_shm {
                    ensure_dir(&shm)?;
                }
                let mut writable = vec![workspace.clone(), tmp.clone()];
                if host_shm {
                    writable.push(shm.clone());
                }
                plan.ruleset = build_ruleset(writable)?;
                plan.ns = Some(ns_plan(
                    &root,
                    &workspace,
                    &tmp,
                    host_shm.then_some(&shm),
                    &view_cwd,
                )?);
            }
            Model::Landlock => {
                let mut writable = vec![workspace.clone(), tmp.clone()];
                if Path::new("/dev/shm").is_dir() {
                    writable.push(PathBuf::from("/dev/shm"));
                }
                plan.ruleset = build_ruleset(writable)?;
                plan.cwd_fd = Some(cwd_fd);
            }
            Model::Unconfined => plan.cwd_fd = Some(cwd_fd),
        }
        Ok(Confine {
            model,
            env,
            cwd_view: match model {
                Model::Namespaces => view_cwd,
                _ => host_cwd.to_string_lossy().into_owned(),
            },
            plan,
        })
    }

    /// The model this confinement applies.
    pub fn model(&self) -> Model {
        self.model
    }

    /// The working directory as the process sees it (`/workspace/sub` in the namespace
    /// model, the host directory otherwise).
    pub fn cwd(&self) -> &str {
        &self.cwd_view
    }

    /// Whether the Landlock ruleset will be enforced on the process.
    pub fn landlock_enforced(&self) -> bool {
        self.plan.ruleset.is_some()
    }

    /// Register on the command: the environment (`ABX_SANDBOX_ID`, `HOME`, `TMPDIR`, `PWD`)
    /// and the `pre_exec` hook that confines the child and changes to its working directory.
    /// Must be the last `pre_exec` registered (register setsid/pty hooks before).
    pub fn apply(self, cmd: &mut tokio::process::Command) {
        self.apply_std(cmd.as_std_mut());
    }

    /// [`Confine::apply`] for a `std::process::Command`.
    pub fn apply_std(self, cmd: &mut std::process::Command) {
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let plan = self.plan;
        // SAFETY: the hook only makes system calls on data prepared before the fork (no
        // allocation, no locks), as required between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || child_setup(&plan).map_err(io::Error::from_raw_os_error));
        }
    }
}

fn ensure_dir(p: &Path) -> Result<(), AbxError> {
    match fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && p.is_dir() => Ok(()),
        Err(e) => Err(internal(&p.display().to_string(), e)),
    }
}

fn last_cap() -> i32 {
    fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// Open the working directory beneath its area (no `..`, absolute or magic symlink escape).
fn open_cwd(
    dirs: &SandboxDirs,
    area: Area,
    rel: &Path,
    sandbox_id: &str,
    cwd: &str,
) -> Result<OwnedFd, AbxError> {
    let not_found = || {
        AbxError::new(
            ErrorCode::FileNotFound,
            &[("path", cwd), ("sandbox", sandbox_id)],
        )
    };
    let outside = || AbxError::new(ErrorCode::PathOutsideSandbox, &[("path", cwd)]);
    let base_c = cstring(dirs.area_dir(area))?;
    // SAFETY: plain syscalls on owned, NUL-terminated paths.
    let base = unsafe {
        libc::open(
            base_c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if base < 0 {
        return Err(not_found());
    }
    // SAFETY: `base` is a fresh fd we own.
    let base = unsafe { OwnedFd::from_raw_fd(base) };
    if rel.as_os_str().is_empty() {
        return Ok(base);
    }
    let rel_c = cstring(rel)?;
    // SAFETY: open_how is plain data; zero is its default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `how` and `rel_c` outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            base.as_raw_fd(),
            rel_c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd >= 0 {
        // SAFETY: a fresh fd we own.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
    }
    match errno() {
        libc::ENOENT => Err(not_found()),
        libc::ENOTDIR => Err(AbxError::new(ErrorCode::NotADirectory, &[("path", cwd)])),
        libc::EXDEV | libc::ELOOP => Err(outside()),
        libc::ENOSYS => {
            // Before Linux 5.6: canonicalize and check the prefix.
            let area_dir = fs::canonicalize(dirs.area_dir(area)).map_err(|_| not_found())?;
            let p = fs::canonicalize(area_dir.join(rel)).map_err(|_| not_found())?;
            if !p.starts_with(&area_dir) {
                return Err(outside());
            }
            if !p.is_dir() {
                return Err(AbxError::new(ErrorCode::NotADirectory, &[("path", cwd)]));
            }
            let c = cstring(&p)?;
            // SAFETY: plain syscall on an owned path.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(not_found());
            }
            // SAFETY: a fresh fd we own.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }
        e => Err(internal(
            &format!("working directory '{cwd}'"),
            io::Error::from_raw_os_error(e),
        )),
    }
}

/// The namespace-model plan: the composed root's mounts, the id maps, the working dir.
fn ns_plan(
    root: &Path,
    workspace: &Path,
    tmp: &Path,
    shm: Option<&PathBuf>,
    view_cwd: &str,
) -> Result<NsPlan, AbxError> {
    let new_root = root.join(".root");
    ensure_dir(&new_root)?;
    let entries = host_top_entries().map_err(|e| internal("listing /", e))?;
    let in_root = |name: &OsStr| new_root.join(name);
    let mut actions = Vec::new();
    let mut bound_dirs: Vec<OsString> = Vec::new();
    // The host directory holding the composed root gets a copy of it when bound recursively.
    let root_top = top_component(&new_root, 1).map(OsStr::to_os_string);
    let root_copy = new_root.join(new_root.strip_prefix("/").unwrap_or(&new_root));
    for (name, kind) in &entries {
        if SPECIAL_TOP.iter().any(|s| OsStr::new(s) == name) {
            continue;
        }
        let host = Path::new("/").join(name);
        match kind {
            TopEntry::Dir => {
                actions.push(Action::Mkdir {
                    path: cstring(in_root(name))?,
                });
                actions.push(Action::Bind {
                    src: cstring(&host)?,
                    dst: cstring(in_root(name))?,
                    set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
                    step: Step::BindHost,
                    optional: true,
                });
                if root_top.as_deref() == Some(name.as_os_str()) {
                    actions.push(Action::Unmount {
                        path: cstring(&root_copy)?,
                    });
                }
                bound_dirs.push(name.clone());
            }
            TopEntry::File => {
                actions.push(Action::Touch {
                    path: cstring(in_root(name))?,
                });
                actions.push(Action::Bind {
                    src: cstring(&host)?,
                    dst: cstring(in_root(name))?,
                    set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
                    step: Step::BindHost,
                    optional: true,
                });
            }
            TopEntry::Symlink(target) => actions.push(Action::Symlink {
                target: cstring(target)?,
                path: cstring(in_root(name))?,
            }),
        }
    }
    let mut special = |name: &str, src: &Path, set: u64, step: Step, optional: bool| {
        let dst = cstring(new_root.join(name))?;
        actions.push(Action::Mkdir { path: dst.clone() });
        actions.push(Action::Bind {
            src: cstring(src)?,
            dst,
            set,
            step,
            optional,
        });
        Ok::<(), AbxError>(())
    };
    special("dev", Path::new("/dev"), 0, Step::BindDev, false)?;
    special("proc", Path::new("/proc"), 0, Step::BindProc, false)?;
    special(
        "sys",
        Path::new("/sys"),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        Step::BindHost,
        true,
    )?;
    special(
        "workspace",
        workspace,
        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        Step::BindWorkspace,
        false,
    )?;
    special(
        "tmp",
        tmp,
        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        Step::BindTmp,
        false,
    )?;
    if let Some(shm) = shm {
        // The mount point exists on the host's /dev (checked): never create it there.
        actions.push(Action::Bind {
            src: cstring(shm)?,
            dst: cstring(new_root.join("dev/shm"))?,
            set: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            step: Step::BindShm,
            optional: false,
        });
    }
    // Hide the sandboxes directory (or this sandbox's own, when its parent is a top-level
    // directory) and the broker's directories, where they are visible through a host bind.
    let hideable = |p: &Path| {
        top_component(p, 2).is_some_and(|top| bound_dirs.iter().any(|b| b == top)) && p.is_dir()
    };
    let mut hidden: Vec<PathBuf> = Vec::new();
    if let Some(parent) = root.parent().filter(|p| hideable(p)) {
        hidden.push(parent.to_path_buf());
    } else if hideable(root) {
        hidden.push(root.to_path_buf());
    }
    let extra = HIDDEN.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for p in extra {
        if let Ok(c) = fs::canonicalize(&p) {
            if hideable(&c) {
                hidden.push(c);
            }
        }
    }
    hidden.sort();
    hidden.dedup();
    let outer: Vec<PathBuf> = hidden
        .iter()
        .filter(|p| !hidden.iter().any(|q| q != *p && p.starts_with(q)))
        .cloned()
        .collect();
    for p in outer {
        let rel = p.strip_prefix("/").unwrap_or(&p);
        actions.push(Action::Hide {
            dst: cstring(new_root.join(rel))?,
        });
    }

    // SAFETY: trivial getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    Ok(NsPlan {
        uid_map: format!("{uid} {uid} 1\n").into_bytes(),
        gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        new_root: cstring(&new_root)?,
        actions,
        cwd: cstring(view_cwd)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::process::Output;

    fn sandbox_in(base: &Path) -> (tempfile::TempDir, SandboxDirs) {
        let t = tempfile::Builder::new()
            .prefix("abx-iso-")
            .tempdir_in(base)
            .unwrap();
        let dirs = SandboxDirs::new(t.path().join("sb"));
        fs::create_dir_all(&dirs.workspace).unwrap();
        fs::create_dir_all(&dirs.tmp).unwrap();
        (t, dirs)
    }

    fn sandbox() -> (tempfile::TempDir, SandboxDirs) {
        sandbox_in(&std::env::temp_dir())
    }

    async fn run(model: Model, dirs: &SandboxDirs, id: &str, cwd: &str, script: &str) -> Output {
        let confine = Confine::with_model(model, dirs, id, cwd).unwrap();
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(script);
        confine.apply(&mut cmd);
        let out = cmd.output().await.expect("spawn confined sh");
        eprintln!(
            "--- {model} stdout:\n{}--- stderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn lines(out: &Output) -> Vec<String> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn has(out: &Output, line: &str) -> bool {
        lines(out).iter().any(|l| l == line)
    }

    /// Checks shared by the confined models: writes outside fail, tools run, marker set.
    const COMMON: &str = r#"
echo "marker=$ABX_SANDBOX_ID"
echo x > /etc/abx-iso-test 2>/dev/null && echo ETC_WRITABLE
echo x > /root/abx-iso-test 2>/dev/null && echo ROOT_WRITABLE
/usr/bin/env | grep -q '^ABX_SANDBOX_ID=' && echo env_ok
if [ -x /usr/bin/python3 ]; then /usr/bin/python3 -c 'print("py_ok")'; else echo py_ok; fi
echo done
"#;

    fn host_tmp_file(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("abx-iso-host-{tag}-{}", std::process::id()))
    }

    fn assert_common(out: &Output, id: &str, host_tmp: &Path) {
        assert!(has(out, &format!("marker={id}")), "marker");
        assert!(!has(out, "ETC_WRITABLE"));
        assert!(!has(out, "ROOT_WRITABLE"));
        assert!(has(out, "env_ok"), "env runs");
        assert!(has(out, "py_ok"), "python runs");
        assert!(has(out, "done"));
        assert!(!Path::new("/etc/abx-iso-test").exists());
        assert!(!Path::new("/root/abx-iso-test").exists());
        assert!(!host_tmp.exists());
    }

    #[tokio::test]
    async fn namespaces_compose_the_root() {
        let (_t, dirs) = sandbox();
        let id = "sb-ns-1";
        let host_tmp = host_tmp_file("ns");
        let tempdir_name = _t
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let script = format!(
            r#"echo x > /tmp/{tmp_name} && echo tmp_name_ok
echo x > /abx-iso-test 2>/dev/null && echo SLASH_WRITABLE
echo "pwd=$(pwd)"; echo "home=$HOME"; echo "tmpdir=$TMPDIR"; echo "envpwd=$PWD"
echo hi > /workspace/a.txt && echo ws_ok
echo hi > /tmp/b.txt && echo tmp_ok
echo hi > rel.txt && echo rel_ok
mount -o remount,rw / 2>/dev/null && echo REMOUNT_OK
mount -o remount,rw /usr 2>/dev/null && echo REMOUNT_USR_OK
mount -t tmpfs none /mnt 2>/dev/null && echo MOUNT_OK
touch /usr/abx-iso-test 2>/dev/null && echo USR_WRITABLE
test -e /tmp/{tempdir} && echo HOST_TMP_VISIBLE
test -e /usr/bin/sh && echo usr_ok
test -e /proc/self/status && echo proc_ok
echo x > /dev/null && echo devnull_ok
ls / >/dev/null && echo ls_root_ok
echo $(id -u) > /workspace/uid
{common}"#,
            tmp_name = host_tmp.file_name().unwrap().to_string_lossy(),
            tempdir = tempdir_name,
            common = COMMON
        );
        let out = run(Model::Namespaces, &dirs, id, "/workspace", &script).await;
        assert!(out.status.success());
        assert!(has(&out, "pwd=/workspace"));
        assert!(has(&out, "home=/workspace"));
        assert!(has(&out, "tmpdir=/tmp"));
        assert!(has(&out, "envpwd=/workspace"));
        for ok in [
            "ws_ok",
            "tmp_ok",
            "rel_ok",
            "usr_ok",
            "proc_ok",
            "devnull_ok",
            "ls_root_ok",
            "tmp_name_ok",
        ] {
            assert!(has(&out, ok), "{ok}");
        }
        for bad in [
            "REMOUNT_OK",
            "REMOUNT_USR_OK",
            "MOUNT_OK",
            "USR_WRITABLE",
            "HOST_TMP_VISIBLE",
            "SLASH_WRITABLE",
        ] {
            assert!(!has(&out, bad), "{bad}");
        }
        assert_common(&out, id, &host_tmp);
        // /tmp inside is the sandbox's tmp, not the host's.
        assert!(dirs.tmp.join(host_tmp.file_name().unwrap()).exists());
        assert_eq!(
            fs::read_to_string(dirs.workspace.join("a.txt")).unwrap(),
            "hi\n"
        );
        assert_eq!(fs::read_to_string(dirs.tmp.join("b.txt")).unwrap(), "hi\n");
        assert!(dirs.workspace.join("rel.txt").exists());
        // Same uid as the broker inside (mapped to itself).
        let uid = unsafe { libc::geteuid() };
        assert_eq!(
            fs::read_to_string(dirs.workspace.join("uid"))
                .unwrap()
                .trim(),
            uid.to_string()
        );
    }

    #[tokio::test]
    async fn namespaces_hide_other_sandboxes_and_keep_cwd() {
        // Under /var/tmp the sandboxes dir is visible through the read-only /var bind: hidden.
        let (t, dirs) = sandbox_in(Path::new("/var/tmp"));
        fs::create_dir_all(dirs.workspace.join("sub/deeper")).unwrap();
        let other = t.path().join("other-sandbox");
        fs::create_dir_all(&other).unwrap();
        fs::write(other.join("secret"), "s").unwrap();
        let script = format!(
            "echo \"pwd=$(pwd)\"; echo \"envpwd=$PWD\"; \
             test -e {other}/secret && echo OTHER_VISIBLE; \
             test -d /var/tmp && echo var_ok; echo hi > x && echo w_ok",
            other = other.display()
        );
        let out = run(Model::Namespaces, &dirs, "sb-ns-2", "sub/deeper", &script).await;
        assert!(out.status.success());
        assert!(has(&out, "pwd=/workspace/sub/deeper"));
        assert!(has(&out, "envpwd=/workspace/sub/deeper"));
        assert!(has(&out, "var_ok"));
        assert!(has(&out, "w_ok"));
        assert!(!has(&out, "OTHER_VISIBLE"));
        assert!(dirs.workspace.join("sub/deeper/x").exists());
        let out = run(Model::Namespaces, &dirs, "sb-ns-2", "/tmp", "pwd").await;
        assert_eq!(lines(&out), vec!["/tmp".to_owned()]);
    }

    #[tokio::test]
    async fn landlock_confines_writes() {
        if landlock_abi() == 0 {
            eprintln!("no Landlock on this kernel: skipped");
            return;
        }
        let (_t, dirs) = sandbox();
        let id = "sb-ll-1";
        let host_tmp = host_tmp_file("ll");
        let script = format!(
            "echo x > {host} 2>/dev/null && echo HOST_TMP_WRITABLE\n\
             echo \"pwd=$(pwd)\"; echo \"home=$HOME\"; echo \"tmpdir=$TMPDIR\"\n\
             echo hi > \"$HOME/a.txt\" && echo ws_ok\n\
             echo hi > \"$TMPDIR/b.txt\" && echo tmp_ok\n\
             echo hi > rel.txt && echo rel_ok\n\
             echo x > /dev/null && echo devnull_ok\n\
             mount -t tmpfs none /mnt 2>/dev/null && echo MOUNT_OK\n{COMMON}",
            host = host_tmp.display()
        );
        let out = run(Model::Landlock, &dirs, id, "/workspace", &script).await;
        assert!(out.status.success());
        let ws = fs::canonicalize(&dirs.workspace).unwrap();
        let tmp = fs::canonicalize(&dirs.tmp).unwrap();
        assert!(has(&out, &format!("pwd={}", ws.display())));
        assert!(has(&out, &format!("home={}", ws.display())));
        assert!(has(&out, &format!("tmpdir={}", tmp.display())));
        for ok in ["ws_ok", "tmp_ok", "rel_ok", "devnull_ok"] {
            assert!(has(&out, ok), "{ok}");
        }
        assert!(!has(&out, "MOUNT_OK"));
        assert!(!has(&out, "HOST_TMP_WRITABLE"));
        assert_common(&out, id, &host_tmp);
        assert!(dirs.workspace.join("a.txt").exists());
        assert!(dirs.workspace.join("rel.txt").exists());
        assert!(dirs.tmp.join("b.txt").exists());
    }

    #[tokio::test]
    async fn unconfined_sets_cwd_and_env() {
        let (_t, dirs) = sandbox();
        fs::create_dir(dirs.tmp.join("t")).unwrap();
        let script = "echo \"pwd=$(pwd)\"; echo \"marker=$ABX_SANDBOX_ID\"; \
                      echo hi > \"$HOME/a.txt\"; echo hi > \"$TMPDIR/b.txt\"; echo hi > here.txt";
        let out = run(Model::Unconfined, &dirs, "sb-none", "/tmp/t", script).await;
        assert!(out.status.success());
        let tmp = fs::canonicalize(&dirs.tmp).unwrap();
        assert!(has(&out, &format!("pwd={}", tmp.join("t").display())));
        assert!(has(&out, "marker=sb-none"));
        assert!(dirs.workspace.join("a.txt").exists());
        assert!(dirs.tmp.join("b.txt").exists());
        assert!(dirs.tmp.join("t/here.txt").exists());
    }

    #[test]
    fn cwd_is_validated() {
        let (_t, dirs) = sandbox();
        fs::create_dir(dirs.workspace.join("d")).unwrap();
        fs::write(dirs.workspace.join("f"), "").unwrap();
        symlink("/etc", dirs.workspace.join("out")).unwrap();
        symlink("../..", dirs.workspace.join("up")).unwrap();
        symlink("d", dirs.workspace.join("in")).unwrap();
        let code = |cwd: &str| {
            Confine::with_model(Model::Unconfined, &dirs, "sb", cwd)
                .map(|_| ())
                .map_err(|e| e.code)
        };
        assert_eq!(code("/workspace"), Ok(()));
        assert_eq!(code("d"), Ok(()));
        assert_eq!(code("in"), Ok(()));
        assert_eq!(code("/tmp"), Ok(()));
        assert_eq!(code("missing"), Err(ErrorCode::FileNotFound));
        assert_eq!(code("f"), Err(ErrorCode::NotADirectory));
        for bad in ["..", "/etc", "/workspace/../etc", "out", "up", "up/x"] {
            assert_eq!(code(bad), Err(ErrorCode::PathOutsideSandbox), "{bad}");
        }
    }

    #[test]
    fn host_path_maps_areas() {
        let dirs = SandboxDirs::new(PathBuf::from("/data/sb"));
        assert_eq!(
            host_path(&dirs, "/workspace/a/b").unwrap(),
            Path::new("/data/sb/workspace/a/b")
        );
        assert_eq!(
            host_path(&dirs, "x").unwrap(),
            Path::new("/data/sb/workspace/x")
        );
        assert_eq!(host_path(&dirs, "/tmp").unwrap(), Path::new("/data/sb/tmp"));
        assert_eq!(
            host_path(&dirs, "/etc/passwd").unwrap_err().code,
            ErrorCode::PathOutsideSandbox
        );
        assert_eq!(
            host_path(&dirs, "a/../../b").unwrap_err().code,
            ErrorCode::PathOutsideSandbox
        );
    }

    #[tokio::test]
    async fn setup_failures_fail_the_spawn_with_a_clear_message() {
        let (_t, dirs) = sandbox();
        let confine =
            Confine::with_model(Model::Namespaces, &dirs, "sb-err", "/workspace").unwrap();
        // The sandbox's tmp vanishes between preparation and spawn.
        fs::remove_dir(&dirs.tmp).unwrap();
        let mut cmd = tokio::process::Command::new("true");
        confine.apply(&mut cmd);
        let err = cmd.spawn().expect_err("spawn must fail");
        assert!(is_setup_error(&err));
        let msg = explain_spawn_error(&err);
        assert!(msg.contains("bind-mounting /tmp"), "{msg}");
        assert!(msg.contains("No such file"), "{msg}");
        // An ordinary spawn error is passed through.
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        assert!(!is_setup_error(&e));
        assert_eq!(explain_spawn_error(&e), e.to_string());
    }

    #[test]
    fn error_codes_round_trip() {
        for s in STEPS {
            assert_eq!(decode(encode(s, libc::EPERM)), Some((s, libc::EPERM)));
        }
        assert_eq!(decode(libc::EPERM), None);
    }

    #[test]
    fn models_parse_and_describe() {
        for m in [Model::Namespaces, Model::Landlock, Model::Unconfined] {
            assert_eq!(Model::parse(m.as_str()), Some(m));
            assert_eq!(m.to_string(), m.as_str());
        }
        assert_eq!(Model::parse("bogus"), None);
        let d = describe();
        assert_eq!(d["model"], model().as_str());
        assert!(d["landlock"]["abi"].is_i64());
        // Each model says what a sandbox sees or what it does not protect.
        match model() {
            Model::Namespaces => assert!(d["root"]["notVisible"].is_array(), "{d}"),
            _ => assert!(d["doesNotProtect"].is_array(), "{d}"),
        }
    }
}
