//! Host directories mounted into a sandbox (`sandbox/create` `mounts`, issue 43).
//!
//! A mount is a door in the sandbox's boundary, so it is narrow (docs/threat-model.md,
//! "Mounts"):
//!
//! - The source is opened once (`O_PATH | O_DIRECTORY`) and every check is made on what was
//!   opened (its real path read back from `/proc/self/fd`, its `fstat`), never on the string
//!   given: a path component swapped for a symlink meanwhile changes nothing. What is mounted
//!   is that open directory: a root daemon clones it (`open_tree`) into an idmapped tree; a
//!   user's daemon hands the descriptor to the sandbox's init, which opens the same real path
//!   again in its own mount namespace without following any symlink and mounts it only when
//!   it is the same directory (device and inode).
//! - Refused (E2010): the broker's own directories (config, data, runtime, logs) and any
//!   directory inside or above them; `/`, `/proc`, `/sys`, `/dev`, `/etc`, `/boot`, `/run`
//!   and what is inside them, and the top system directories themselves (`/usr`, `/var`,
//!   `/tmp`, `/home`, ...); the home directory itself and every directory above it; a path
//!   with a credential directory (`.ssh`, ...: [`CREDENTIAL_DIRS`]) among its components,
//!   and a source holding one directly (`<source>/.ssh`; the tree is not walked).
//! - The record keeps the real path, the device and inode, the owner and the creation time:
//!   after a daemon restart the source is opened again and must be the same directory.

use abx_protocol::api::{MountMode, MountSpec};
use abx_protocol::{AbxError, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// The most mounts a sandbox may have (they travel to the init in one message).
pub const MAX_MOUNTS: usize = 8;

/// Credential directories (relative to a home directory): a source that is one, lies inside
/// one or holds one directly is refused. docs/threat-model.md lists them.
pub const CREDENTIAL_DIRS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".kube",
    ".docker",
    ".config/abx",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".password-store",
    ".local/share/keyrings",
    ".pki",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
];

/// Refused with everything inside them.
const SYSTEM_TREES: &[&str] = &["/proc", "/sys", "/dev", "/etc", "/boot", "/run"];

/// Refused themselves (a project may live beneath some of them).
const SYSTEM_DIRS: &[&str] = &[
    "/", "/usr", "/var", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/srv",
    "/tmp", "/var/tmp", "/home", "/root", "/mnt", "/media", "/snap", "/nix",
];

/// Targets refused in the sandbox: its system directories (with what is beneath them).
const RESERVED_TARGETS: &[&str] = &[
    "proc", "sys", "dev", "etc", "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "tmp",
    "boot", "run", "var", "root", "opt", "srv",
];

/// A mount as `sandbox.json` keeps it (part of the sandbox's record).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountRecord {
    /// The host directory, its real path as resolved at create.
    pub source: String,
    /// Its path in the sandbox.
    pub target: String,
    /// `overlay`, `ro` or `rw`.
    pub mode: MountMode,
    /// The device of the source at create.
    pub dev: u64,
    /// The inode of the source at create.
    pub ino: u64,
    /// The source's owner (the sandbox's user sees it as its own).
    pub uid: u32,
    /// The source's group.
    pub gid: u32,
    /// When the sandbox was created (ns since the epoch): what the host looked like then is
    /// what `sandbox/diff` compares with (files changed on the host after it conflict).
    pub created_ns: i128,
}

impl MountRecord {
    /// The view's entry (`Sandbox.mounts`).
    pub fn view(&self) -> abx_protocol::api::Mount {
        abx_protocol::api::Mount {
            source: self.source.clone(),
            target: self.target.clone(),
            mode: self.mode,
        }
    }
}

/// What the checks refuse, besides the fixed lists: the broker's own directories and the
/// daemon user's home.
#[derive(Clone, Debug, Default)]
pub struct Guard {
    /// The broker's config, data, runtime and log directories.
    pub protected: Vec<PathBuf>,
    /// The home directory of the daemon's user (`$HOME`, else the password database).
    pub home: Option<PathBuf>,
}

impl Guard {
    /// The guard of a daemon whose broker directories are `protected`.
    pub fn new(protected: Vec<PathBuf>) -> Guard {
        Guard {
            protected,
            home: home_dir(),
        }
    }
}

/// `$HOME`, else the password database's entry of the effective uid.
pub fn home_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    // SAFETY: getpwuid_r into local buffers.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0u8; 16 * 1024];
        let mut out = std::ptr::null_mut();
        libc::getpwuid_r(
            libc::geteuid(),
            &mut pw,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        );
        if out.is_null() || pw.pw_dir.is_null() {
            return None;
        }
        let dir = std::ffi::CStr::from_ptr(pw.pw_dir);
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes())))
    }
}

/// A source opened and checked, ready to mount.
#[derive(Debug)]
pub struct Opened {
    /// `O_PATH | O_DIRECTORY` on the source.
    pub fd: OwnedFd,
    /// What the record keeps.
    pub rec: MountRecord,
}

fn bad(detail: String) -> AbxError {
    AbxError::invalid_params("sandbox/create", detail)
}

/// E2010 for `path`.
pub fn refused(path: &str, reason: &str) -> AbxError {
    AbxError::new(
        ErrorCode::MountRefused,
        &[("path", path), ("reason", reason)],
    )
}

/// Check `mounts` (any JSON: null or a list of `{source, target?, mode?}`) and open each
/// source. E1004 names the bad entry or member; E2010 a refused source.
pub fn open_all(v: Option<&Value>, guard: &Guard) -> Result<Vec<Opened>, AbxError> {
    let specs = parse(v)?;
    let mut out = Vec::with_capacity(specs.len());
    let created_ns = now_ns();
    for s in specs {
        let (fd, real, st) = open_source(&s.source, guard)?;
        out.push(Opened {
            fd,
            rec: MountRecord {
                source: real,
                target: s.target.unwrap_or_default(),
                mode: s.mode.unwrap_or_default(),
                dev: st.st_dev,
                ino: st.st_ino,
                uid: st.st_uid,
                gid: st.st_gid,
                created_ns,
            },
        });
    }
    Ok(out)
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// The entries of `mounts`, with their targets normalized (default `/workspace`).
pub fn parse(v: Option<&Value>) -> Result<Vec<MountSpec>, AbxError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(bad(
                "mounts must be a list of {source, target?, mode?}".into()
            ))
        }
    };
    if list.len() > MAX_MOUNTS {
        return Err(bad(format!(
            "mounts: at most {MAX_MOUNTS} entries, not {}",
            list.len()
        )));
    }
    let mut out: Vec<MountSpec> = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let Some(obj) = e.as_object() else {
            return Err(bad(format!(
                "mounts[{i}] must be an object {{source, target?, mode?}}"
            )));
        };
        for k in obj.keys() {
            if !["source", "target", "mode"].contains(&k.as_str()) {
                return Err(bad(format!(
                    "mounts[{i}].{k} is not a member of a mount (source, target, mode)"
                )));
            }
        }
        let source = match obj.get("source") {
            Some(Value::String(s)) => s.clone(),
            None => return Err(bad(format!("mounts[{i}].source is missing"))),
            Some(_) => {
                return Err(bad(format!(
                    "mounts[{i}].source must be a string (an absolute host path)"
                )))
            }
        };
        if !source.starts_with('/') || source.contains('\0') {
            return Err(bad(format!(
                "mounts[{i}].source must be an absolute host path, not {source:?}"
            )));
        }
        let target = match obj.get("target") {
            None | Some(Value::Null) => crate::WORKSPACE.to_owned(),
            Some(Value::String(t)) => {
                check_target(t).map_err(|why| bad(format!("mounts[{i}].target {t:?}: {why}")))?
            }
            Some(_) => {
                return Err(bad(format!(
                    "mounts[{i}].target must be a string (an absolute path in the sandbox)"
                )))
            }
        };
        let mode = match obj.get("mode") {
            None | Some(Value::Null) => MountMode::Overlay,
            Some(m) => serde_json::from_value::<MountMode>(m.clone()).map_err(|_| {
                bad(format!(
                    "mounts[{i}].mode must be \"overlay\", \"ro\" or \"rw\", not {m}"
                ))
            })?,
        };
        if let Some(j) = out
            .iter()
            .position(|o| o.target.as_deref() == Some(&target))
        {
            return Err(bad(format!(
                "mounts[{i}].target {target:?} is also the target of mounts[{j}]"
            )));
        }
        out.push(MountSpec {
            source,
            target: Some(target),
            mode: Some(mode),
        });
    }
    Ok(out)
}

/// A target: absolute, normalized, under `/workspace` or outside the sandbox's system
/// directories. Returns it normalized.
pub fn check_target(t: &str) -> Result<String, &'static str> {
    if !t.starts_with('/') || t.contains('\0') {
        return Err("must be an absolute path");
    }
    let mut parts: Vec<String> = Vec::new();
    for c in Path::new(t).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
            Component::ParentDir | Component::Prefix(_) => return Err("may not contain '..'"),
        }
    }
    let Some(first) = parts.first() else {
        return Err("may not be '/'");
    };
    if RESERVED_TARGETS.contains(&first.as_str()) || first.starts_with("lib") {
        return Err(
            "is a system directory of the sandbox (use /workspace/... or a new top directory)",
        );
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Open `source` once and check what was opened: (descriptor, real path, fstat).
pub fn open_source(source: &str, guard: &Guard) -> Result<(OwnedFd, String, libc::stat), AbxError> {
    let c = CString::new(source).map_err(|_| refused(source, "the path holds a NUL byte"))?;
    // SAFETY: open(2) with a C string we hold.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let why = match e.raw_os_error() {
            Some(libc::ENOENT) => "it does not exist".to_owned(),
            Some(libc::ENOTDIR) => "it is not a directory".to_owned(),
            _ => format!("it cannot be opened ({e})"),
        };
        return Err(refused(source, &why));
    }
    // SAFETY: just opened.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let real = fd_path(fd.as_raw_fd())
        .map_err(|e| refused(source, &format!("its real path cannot be read ({e})")))?;
    let st = fstat(fd.as_raw_fd()).map_err(|e| refused(source, &format!("fstat: {e}")))?;
    check_source(source, &real, &st, guard)?;
    Ok((fd, real.to_string_lossy().into_owned(), st))
}

/// The real path of an open descriptor (`/proc/self/fd/N`).
pub fn fd_path(fd: RawFd) -> std::io::Result<PathBuf> {
    let p = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    if p.as_os_str().as_bytes().ends_with(b" (deleted)") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the directory was removed",
        ));
    }
    Ok(p)
}

/// `fstat` of a descriptor.
pub fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    // SAFETY: fstat into a zeroed local struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(st)
    }
}

/// Lexically normalized (no `.`, `..` applied), for comparing real paths.
fn norm(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// The path with its existing part resolved (a broker dir may not exist yet).
fn resolved(p: &Path) -> PathBuf {
    if let Ok(r) = std::fs::canonicalize(p) {
        return r;
    }
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) => resolved(parent).join(name),
        _ => norm(p),
    }
}

/// Every check on an opened source (`real`: its real path; `st`: its fstat).
pub fn check_source(
    given: &str,
    real: &Path,
    st: &libc::stat,
    guard: &Guard,
) -> Result<(), AbxError> {
    let shown = if real.as_os_str() == given {
        given.to_owned()
    } else {
        format!("{given}' (really '{}')", real.display())
    };
    let no = |why: String| Err(refused(&shown, &why));
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return no("it is not a directory".into());
    }
    let real = norm(real);
    // The path given too: `/proc/self/cwd` or `/proc/<pid>/root` lead elsewhere.
    let given_norm = norm(Path::new(given));
    for t in SYSTEM_TREES {
        if real.starts_with(t) || given_norm.starts_with(t) {
            return no(format!("{t} is a system directory"));
        }
    }
    if SYSTEM_DIRS.iter().any(|d| real == Path::new(d)) {
        return no(format!("{} is a system directory", real.display()));
    }
    for p in &guard.protected {
        let p = resolved(p);
        if real == p {
            return no(format!("it is the broker's own directory {}", p.display()));
        }
        if real.starts_with(&p) {
            return no(format!(
                "it lies inside the broker's own directory {}",
                p.display()
            ));
        }
        if p.starts_with(&real) {
            return no(format!(
                "it contains the broker's own directory {}",
                p.display()
            ));
        }
    }
    if let Some(home) = &guard.home {
        let home = resolved(home);
        if real == home {
            return no(format!(
                "it is the home directory {} (mount a project directory in it)",
                home.display()
            ));
        }
        if home.starts_with(&real) {
            return no(format!(
                "it contains the home directory {} (mount a project directory in it)",
                home.display()
            ));
        }
    }
    // A credential directory among its components (`/home/u/.ssh/x`, `/srv/.aws`).
    let comps: Vec<&std::ffi::OsStr> = real
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    for cred in CREDENTIAL_DIRS {
        let want: Vec<&std::ffi::OsStr> = cred.split('/').map(std::ffi::OsStr::new).collect();
        if comps.windows(want.len()).any(|w| w == want.as_slice()) {
            return no(format!(
                "it is or lies inside a credential directory ({cred})"
            ));
        }
    }
    // Holding one directly (`<source>/.ssh`, and `<source>/abx` when the source is a
    // `.config`): looked up by name beneath the source, never walked.
    for cred in CREDENTIAL_DIRS {
        let want: Vec<&std::ffi::OsStr> = cred.split('/').map(std::ffi::OsStr::new).collect();
        for k in 0..want.len() {
            if !comps.ends_with(&want[..k]) {
                continue;
            }
            let rest: PathBuf = want[k..].iter().collect();
            if exists_beneath(real.as_path(), &rest) {
                return no(format!(
                    "it contains a credential directory ({})",
                    real.join(&rest).display()
                ));
            }
        }
    }
    // A user's daemon: the sandbox's user is the daemon's user, who must own the source.
    // SAFETY: a getter without arguments.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 && st.st_uid != euid {
        return no(format!(
            "it belongs to uid {}, not to the broker's user (uid {euid}): a sandbox's user is the broker's user, so it would not own the files",
            st.st_uid
        ));
    }
    Ok(())
}

/// Whether `rel` exists beneath `dir` (not following symlinks on the way, so a symlink
/// named `.ssh` counts as there).
fn exists_beneath(dir: &Path, rel: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(rel)).is_ok()
}

/// Open a recorded source again (after a daemon restart): it must be the same directory
/// (device and inode) and still pass every check, else E2010.
pub fn reopen(rec: &MountRecord, guard: &Guard) -> Result<OwnedFd, AbxError> {
    let (fd, real, st) = open_source(&rec.source, guard)?;
    if st.st_dev != rec.dev || st.st_ino != rec.ino || real != rec.source {
        return Err(refused(
            &rec.source,
            "it is no longer the directory mounted at create (its device and inode changed: it was replaced or moved)",
        ));
    }
    Ok(fd)
}

/// The sandbox's own layers of mount `n` (`mounts/<n>/upper` and `work`), beside its record.
pub fn layer_dirs(root: &Path, n: usize) -> (PathBuf, PathBuf) {
    let d = root.join("mounts").join(n.to_string());
    (d.join("upper"), d.join("work"))
}

/// Make the layers of each overlay mount, owned by the sandbox's user.
pub fn prepare_layers(root: &Path, recs: &[MountRecord]) -> std::io::Result<()> {
    for (n, r) in recs.iter().enumerate() {
        if r.mode != MountMode::Overlay {
            continue;
        }
        let (u, w) = layer_dirs(root, n);
        for d in [&u, &w] {
            std::fs::create_dir_all(d)?;
            if let Some((uid, gid)) = crate::container::sandbox_owner() {
                std::os::unix::fs::lchown(d, Some(uid), Some(gid))?;
            }
        }
    }
    Ok(())
}

/// Remove a sandbox's directory (or the trash holding several): overlayfs leaves its
/// work dir's `work/` with mode 0, which a daemon that is not root could not empty, so
/// directories it cannot read are opened up first (it owns them). Never follows a symlink.
pub fn remove_all(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    fn open_up(d: &Path, depth: usize) {
        use std::os::unix::fs::PermissionsExt;
        let Ok(m) = std::fs::symlink_metadata(d) else {
            return;
        };
        if !m.is_dir() || depth > 64 {
            return;
        }
        if m.permissions().mode() & 0o700 != 0o700 {
            let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700));
        }
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    open_up(&e.path(), depth + 1);
                }
            }
        }
    }
    open_up(dir, 0);
    std::fs::remove_dir_all(dir)
}

/// What the init needs for one mount (the descriptor travels beside the config).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitMount {
    /// The target in the sandbox.
    pub target: String,
    /// The mode.
    pub mode: MountMode,
    /// The descriptor is a detached mount tree made by the daemon (idmapped, with its
    /// attributes set); else it is the `O_PATH` source, opened again by the init at `source`
    /// (no symlink followed) and used only if it is the same directory (`dev`, `ino`).
    pub tree: bool,
    /// The real path of the source.
    pub source: PathBuf,
    /// Its device.
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
    /// The overlay's upper and work dirs (overlay mode).
    pub upper: Option<PathBuf>,
    /// See `upper`.
    pub work: Option<PathBuf>,
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
/// `MOUNT_ATTR_*`.
pub const ATTR_RDONLY: u64 = 0x1;
/// See [`ATTR_RDONLY`].
pub const ATTR_NOSUID: u64 = 0x2;
/// See [`ATTR_RDONLY`].
pub const ATTR_NODEV: u64 = 0x4;
const ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// The attributes of a mount of `mode`: never suid, never devices; `ro` and an overlay's
/// lower tree read-only.
pub fn attrs(mode: MountMode) -> u64 {
    ATTR_NOSUID
        | ATTR_NODEV
        | match mode {
            MountMode::Rw => 0,
            MountMode::Ro | MountMode::Overlay => ATTR_RDONLY,
        }
}

/// `open_tree(fd, "", OPEN_TREE_CLONE)`: a detached copy of the mount at `fd` (not
/// recursive: mounts beneath the source are not carried).
pub fn clone_tree(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: open_tree with an empty C string and a descriptor we hold.
    let t = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            fd,
            c"".as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    if t < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just made.
    Ok(unsafe { OwnedFd::from_raw_fd(t as RawFd) })
}

/// `mount_setattr` on a detached tree: set `set`, idmapped through `userns` when given.
pub fn set_tree_attrs(tree: RawFd, set: u64, userns: Option<RawFd>) -> std::io::Result<()> {
    let attr = MountAttr {
        attr_set: set | if userns.is_some() { ATTR_IDMAP } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |f| f as u64),
    };
    // SAFETY: mount_setattr with a struct on the stack.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A user namespace whose uid and gid maps are `inside outside 1` (a root daemon only):
/// the idmapping of a mount (a file of `inside` on disk is seen as `outside`, and
/// `outside` writes as `inside`).
fn idmap_userns(uid: (u32, u32), gid: (u32, u32)) -> std::io::Result<OwnedFd> {
    let mut ready = [0; 2];
    let mut go = [0; 2];
    // SAFETY: pipes into local arrays; a fork whose child makes system calls only and
    // leaves with _exit; the parent writes the child's maps and opens its namespace.
    unsafe {
        if libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (r0, r1) = (
            OwnedFd::from_raw_fd(ready[0]),
            OwnedFd::from_raw_fd(ready[1]),
        );
        if libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (g0, g1) = (OwnedFd::from_raw_fd(go[0]), OwnedFd::from_raw_fd(go[1]));
        let pid = libc::fork();
        if pid < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if pid == 0 {
            // Only our ends: the parent's must not keep this child waiting.
            libc::close(r0.as_raw_fd());
            libc::close(g1.as_raw_fd());
            let ok = libc::unshare(libc::CLONE_NEWUSER) == 0;
            let b = if ok { b"y" } else { b"n" };
            libc::write(r1.as_raw_fd(), b.as_ptr().cast(), 1);
            let mut x = 0u8;
            libc::read(g0.as_raw_fd(), (&mut x as *mut u8).cast(), 1);
            libc::_exit(0);
        }
        drop(r1);
        drop(g0);
        let mut b = 0u8;
        let n = libc::read(r0.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
        let res = (|| {
            if n != 1 || b != b'y' {
                return Err(std::io::Error::other(
                    "cannot make a user namespace for the idmapping",
                ));
            }
            std::fs::write(
                format!("/proc/{pid}/uid_map"),
                format!("{} {} 1", uid.0, uid.1),
            )?;
            std::fs::write(
                format!("/proc/{pid}/gid_map"),
                format!("{} {} 1", gid.0, gid.1),
            )?;
            let f = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
            Ok(OwnedFd::from(f))
        })();
        libc::write(g1.as_raw_fd(), b"g".as_ptr().cast(), 1);
        drop(g1);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        res
    }
}

/// The init's part of each mount and the descriptors that go with them (in order). A root
/// daemon clones each source into a detached tree idmapped so that the source's owner is
/// the sandbox's user ([`crate::container::ROOT_SANDBOX_ID`]), with the mode's attributes;
/// a user's daemon passes the `O_PATH` descriptor on.
pub fn for_init(
    root: &Path,
    mounts: &[(OwnedFd, MountRecord)],
) -> Result<(Vec<InitMount>, Vec<OwnedFd>), AbxError> {
    let mut cfgs = Vec::new();
    let mut fds = Vec::new();
    for (n, (fd, rec)) in mounts.iter().enumerate() {
        let fail = |what: &str, e: std::io::Error| refused(&rec.source, &format!("{what}: {e}"));
        let (tree, pass) = match crate::container::sandbox_owner() {
            Some((su, sg)) => {
                let t = clone_tree(fd.as_raw_fd()).map_err(|e| fail("cloning the mount", e))?;
                let ns = idmap_userns((rec.uid, su), (rec.gid, sg))
                    .map_err(|e| fail("the idmapping", e))?;
                set_tree_attrs(t.as_raw_fd(), attrs(rec.mode), Some(ns.as_raw_fd()))
                    .map_err(|e| fail("an idmapped mount (mount_setattr)", e))?;
                (true, t)
            }
            None => (false, fd.try_clone().map_err(|e| fail("dup", e))?),
        };
        let (upper, work) = if rec.mode == MountMode::Overlay {
            let (u, w) = layer_dirs(root, n);
            (Some(u), Some(w))
        } else {
            (None, None)
        };
        cfgs.push(InitMount {
            target: rec.target.clone(),
            mode: rec.mode,
            tree,
            source: PathBuf::from(&rec.source),
            dev: rec.dev,
            ino: rec.ino,
            upper,
            work,
        });
        fds.push(pass);
    }
    Ok((cfgs, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_are_checked_member_by_member() {
        let e = |v: Value| parse(Some(&v)).unwrap_err().message;
        assert!(e(json!({"source": "/x"})).contains("must be a list"));
        assert!(e(json!([1])).contains("mounts[0] must be an object"));
        assert!(e(json!([{"source": "/x", "bogus": 1}])).contains("mounts[0].bogus"));
        assert!(e(json!([{"target": "/workspace"}])).contains("mounts[0].source is missing"));
        assert!(e(json!([{"source": 3}])).contains("mounts[0].source must be a string"));
        assert!(e(json!([{"source": "rel"}])).contains("absolute"));
        assert!(e(json!([{"source": "/x", "mode": "rwx"}])).contains("mounts[0].mode"));
        assert!(e(json!([{"source": "/x", "target": 1}])).contains("mounts[0].target"));
        assert!(
            e(json!([{"source": "/a"}, {"source": "/b", "target": "/workspace/"}]))
                .contains("also the target of mounts[0]")
        );
        for t in [
            "/",
            "/proc",
            "/etc/x",
            "/usr",
            "/tmp",
            "/lib64",
            "/dev/shm",
            "x",
            "/a/../etc",
        ] {
            assert!(
                e(json!([{"source": "/x", "target": t}])).contains(&format!("{t:?}")),
                "{t}"
            );
        }
        let ok = parse(Some(
            &json!([{"source": "/x"}, {"source": "/y", "target": "/src/./a", "mode": "ro"}]),
        ))
        .unwrap();
        assert_eq!(ok[0].target.as_deref(), Some("/workspace"));
        assert_eq!(ok[0].mode, Some(MountMode::Overlay));
        assert_eq!(ok[1].target.as_deref(), Some("/src/a"));
        assert!(parse(None).unwrap().is_empty());
        assert!(parse(Some(&Value::Null)).unwrap().is_empty());
    }

    #[test]
    fn system_home_broker_and_credential_dirs_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home/u");
        let proj = home.join("proj");
        std::fs::create_dir_all(proj.join("sub")).unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::create_dir_all(home.join(".config/abx/x")).unwrap();
        let broker = t.path().join("abxhome/data");
        std::fs::create_dir_all(&broker).unwrap();
        let g = Guard {
            protected: vec![broker.clone()],
            home: Some(home.clone()),
        };
        let check = |p: &Path| open_source(p.to_str().unwrap(), &g).map(|_| ());
        let code = |p: &Path| check(p).unwrap_err().code;
        check(&proj).unwrap();
        check(&proj.join("sub")).unwrap();
        for p in [
            Path::new("/"),
            Path::new("/proc"),
            Path::new("/proc/self"),
            Path::new("/sys"),
            Path::new("/dev"),
            Path::new("/etc"),
            Path::new("/usr"),
            Path::new("/tmp"),
            &home,
            &home.join(".ssh"),
            &home.join(".config/abx"),
            &home.join(".config/abx/x"),
            home.parent().unwrap(),
            &broker,
            broker.parent().unwrap(),
            t.path(),
        ] {
            assert_eq!(code(p), ErrorCode::MountRefused, "{}", p.display());
        }
        // Holding a credential directory directly.
        std::fs::create_dir_all(proj.join(".aws")).unwrap();
        let e = check(&proj).unwrap_err();
        assert!(e.message.contains(".aws"), "{}", e.message);
        // A symlink to a refused directory is judged by what it opens.
        std::os::unix::fs::symlink(home.join(".ssh"), t.path().join("link")).unwrap();
        let e = check(&t.path().join("link")).unwrap_err();
        assert!(e.message.contains("really"), "{}", e.message);
        assert_eq!(
            check(&t.path().join("nope")).unwrap_err().code,
            ErrorCode::MountRefused
        );
    }
}
