//! Which isolation model is in force, what it protects, and per-process confinement of the
//! opt-in weaker models (docs/design.md#local).
//!
//! - **`namespaces`** (the default): each sandbox is a container built by its init
//!   ([`super::init`], started through [`super::container`]): own user, mount, PID, IPC, UTS
//!   and network namespaces, a private root, Landlock inherited from the init. Commands are
//!   started by the init, not here. Where user namespaces do not work, creating a sandbox
//!   fails (E2001) and says how to opt in to a weaker model.
//! - **`landlock`** (opt-in, `ABX_ISOLATION=landlock`): the process runs in the host
//!   filesystem, starting in the host directory of its working directory, with `HOME` and
//!   `TMPDIR` set to the host `workspace` and `tmp` directories; capabilities are dropped,
//!   `no_new_privs` set, and a Landlock ruleset built before the fork allows writes only
//!   beneath the sandbox's `workspace`, `tmp` and `/dev/shm` and on the terminal and
//!   null-like devices; where the kernel has Landlock ABI 6, signals and connections to
//!   abstract Unix sockets are scoped to the command's own processes (no `kill` of the daemon
//!   or of the user's processes); the process gets a session keyring of its own and the
//!   keyring system calls are refused (seccomp: the user keyring here is the host's). It does
//!   not hide the host filesystem, processes, network or the broker socket ([`describe`] lists
//!   what it does not protect).
//! - **`none`** (opt-in, `ABX_ISOLATION=none`): only the working directory, the environment
//!   and a session keyring of its own (not the daemon's); nothing is confined.
//!
//! Every confined process carries `ABX_SANDBOX_ID=<id>` in its environment (see
//! [`super::procs`]): in the weaker models that is how the broker finds them.
//!
//! Everything the child needs is computed in [`Confine::new`]; the `pre_exec` hook only makes
//! system calls (no allocation, no locks). A failing step makes the spawn fail with an
//! `io::Error` whose raw code encodes the step and the errno; [`explain_spawn_error`] turns it
//! into a readable message (the caller reports E3003).

use super::{split_path, Area, SandboxDirs};
use abx_protocol::{AbxError, ErrorCode};
use std::ffi::{CString, OsStr, OsString};
use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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

/// The Landlock ABI in use (0 when the kernel has none; see [`abx_confine::landlock_abi`]).
pub fn landlock_abi() -> i32 {
    abx_confine::landlock_abi()
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
    describe_for(model())
}

/// [`describe`] for a given model.
pub fn describe_for(m: Model) -> serde_json::Value {
    let abi = landlock_abi();
    let mut v = serde_json::json!({
        "model": m.as_str(),
        "landlock": {
            "abi": abi,
            "enforced": abi > 0 && m != Model::Unconfined,
            "scoped": abi >= abx_confine::SCOPE_ABI && m != Model::Unconfined,
        },
    });
    let refused = if abx_confine::seccomp_available() {
        "; add_key, request_key and keyctl refused (ENOSYS)"
    } else {
        ""
    };
    v["keyrings"] = serde_json::Value::String(match m {
        Model::Namespaces => {
            format!("a new, empty session keyring of its own{refused}; /proc/keys masked")
        }
        Model::Landlock => format!("a new, empty session keyring per command{refused}"),
        Model::Unconfined => {
            "a new, empty session keyring per command (the user keyring is the host's)".into()
        }
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
                if abi >= abx_confine::SCOPE_ABI && m == Model::Landlock {
                    "processes of the broker's user can be seen (signals are scoped to each command's own processes by Landlock)"
                } else {
                    "processes of the broker's user can be seen and signalled (Landlock signal scoping needs ABI 6, Linux 6.12)"
                },
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
                v["doesNotProtect"]
                    .as_array_mut()
                    .expect("array")
                    .push(serde_json::json!(
                        "the broker's user's keyring (@u) and keys found by id (each command has a session keyring of its own; the keyring calls are refused only in the landlock model)"
                    ));
            }
        }
    }
    v
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
    Chdir = 1,
    CapBound,
    CapSet,
    NoNewPrivs,
    LandlockRestrict,
    Keyring,
    Seccomp,
}

const STEPS: [Step; 7] = [
    Step::Chdir,
    Step::CapBound,
    Step::CapSet,
    Step::NoNewPrivs,
    Step::LandlockRestrict,
    Step::Keyring,
    Step::Seccomp,
];

impl Step {
    fn what(self) -> &'static str {
        match self {
            Step::Chdir => "changing to the working directory",
            Step::CapBound => "clearing the capability bounding set",
            Step::CapSet => "dropping capabilities",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::LandlockRestrict => "enforcing the Landlock ruleset",
            Step::Keyring => "joining a new session keyring",
            Step::Seccomp => "installing the seccomp filter",
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

#[derive(Debug)]
struct Plan {
    /// The validated working directory (Landlock and none models): `fchdir`.
    cwd_fd: Option<OwnedFd>,
    /// Drop caps, no_new_privs, the keyring filter, Landlock.
    confine: bool,
    /// The Landlock ruleset and the keyring filter.
    prepared: Option<abx_confine::Prepared>,
    last_cap: i32,
}

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

/// [`abx_confine::caps::drop_all`] with its error as an encoded step (see
/// [`explain_spawn_error`]). Also used by the sandbox's init.
pub(crate) unsafe fn drop_caps(last_cap: i32, strict: bool) -> Result<(), i32> {
    abx_confine::caps::drop_all(last_cap, strict).map_err(|(step, e)| {
        encode(
            match step {
                abx_confine::caps::Step::Bound => Step::CapBound,
                abx_confine::caps::Step::Set => Step::CapSet,
            },
            e,
        )
    })
}

/// Runs in the child between fork and exec: system calls only.
unsafe fn child_setup(p: &Plan) -> Result<(), i32> {
    abx_confine::fds::restore_fd_limit_in_child();
    if let Some(fd) = &p.cwd_fd {
        check(libc::fchdir(fd.as_raw_fd()) as _, Step::Chdir)?;
    }
    // Every model: a session keyring of the command's own, so nothing of the daemon's (a
    // login's, with the user's keys) is possessed. Each costs one key of the user's quota
    // (kernel.keys.maxkeys, 200) while the command lives: past it the command keeps the
    // daemon's rather than failing (`landlock` still refuses every keyring call below;
    // `none` protects nothing of the host anyway).
    match abx_confine::keyring::join_fresh_session() {
        Ok(()) | Err(libc::EDQUOT) => {}
        Err(e) => return Err(encode(Step::Keyring, e)),
    }
    if !p.confine {
        return Ok(());
    }
    drop_caps(p.last_cap, false)?;
    check(
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as _,
        Step::NoNewPrivs,
    )?;
    if let Some(prepared) = &p.prepared {
        // The keyring filter (the user keyring is the host's here: only refusing the calls
        // keeps it out), then Landlock.
        abx_confine::restrict_self(prepared).map_err(|(step, e)| {
            encode(
                match step {
                    abx_confine::Step::NoNewPrivs => Step::NoNewPrivs,
                    abx_confine::Step::Seccomp => Step::Seccomp,
                    abx_confine::Step::Landlock => Step::LandlockRestrict,
                },
                e,
            )
        })?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Preparation (before fork).

/// The sandbox's Landlock ruleset (the shared [`abx_confine`] mechanism): read and execute
/// everywhere, write beneath `writable`, the network left to the host; and the keyring filter.
fn prepare(writable: Vec<PathBuf>) -> Result<abx_confine::Prepared, AbxError> {
    let policy = abx_confine::Policy {
        read: vec![PathBuf::from("/")],
        write: writable,
        exec: None,
        net: abx_confine::Net::Any,
        // Signals and abstract Unix sockets stay inside the process's own domain: no
        // `kill` of the daemon or of the user's other processes, no abstract-socket
        // services of the host (ABI 6+).
        scoped: true,
    };
    policy.prepare().map_err(AbxError::internal)
}

fn cstring(p: impl AsRef<OsStr>) -> Result<CString, AbxError> {
    CString::new(p.as_ref().as_bytes())
        .map_err(|_| AbxError::internal("a path of the sandbox contains a NUL byte"))
}

fn internal(what: &str, e: impl fmt::Display) -> AbxError {
    AbxError::internal(format!("{what}: {e}"))
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
        let (home, tmpdir, pwd) = (
            workspace.clone().into_os_string(),
            tmp.clone().into_os_string(),
            host_cwd.clone().into_os_string(),
        );
        if model != Model::Namespaces {
            super::procs::note_host_sandbox_process();
        }
        let env = vec![
            (super::procs::MARKER, OsString::from(sandbox_id)),
            ("HOME", home),
            ("TMPDIR", tmpdir),
            ("PWD", pwd),
        ];

        let mut plan = Plan {
            cwd_fd: None,
            confine: model != Model::Unconfined,
            prepared: None,
            last_cap: last_cap(),
        };
        match model {
            Model::Namespaces => {
                return Err(AbxError::internal(
                    "the namespaces model runs commands through the sandbox's init, not Confine",
                ))
            }
            Model::Landlock => {
                let mut writable = vec![workspace.clone(), tmp.clone()];
                if Path::new("/dev/shm").is_dir() {
                    writable.push(PathBuf::from("/dev/shm"));
                }
                plan.prepared = Some(prepare(writable)?);
                plan.cwd_fd = Some(cwd_fd);
            }
            Model::Unconfined => plan.cwd_fd = Some(cwd_fd),
        }
        Ok(Confine {
            model,
            env,
            cwd_view: host_cwd.to_string_lossy().into_owned(),
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
        self.plan
            .prepared
            .as_ref()
            .is_some_and(|p| p.ruleset.is_some())
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

/// The highest capability number this kernel knows.
pub(crate) fn last_cap() -> i32 {
    abx_confine::caps::last_cap()
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
    async fn landlock_model_cannot_signal_the_host() {
        if landlock_abi() < abx_confine::SCOPE_ABI {
            eprintln!("no Landlock scoping on this kernel: skipped");
            return;
        }
        // A process of the broker's user outside the sandbox (the daemon in the attack).
        let mut victim = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let (_t, dirs) = sandbox();
        let script = format!(
            "kill -STOP {pid} 2>/dev/null && echo STOPPED_HOST_PROCESS\n\
             kill -9 {pid} 2>/dev/null && echo KILLED_HOST_PROCESS\n\
             sleep 5 & kill $! && echo own_ok",
            pid = victim.id()
        );
        let out = run(Model::Landlock, &dirs, "sb-ll-sig", "/workspace", &script).await;
        assert!(has(&out, "own_ok"), "its own children stay signalable");
        assert!(!has(&out, "STOPPED_HOST_PROCESS"));
        assert!(!has(&out, "KILLED_HOST_PROCESS"));
        assert!(
            victim.try_wait().expect("try_wait").is_none(),
            "the host process survived"
        );
        let _ = victim.kill();
        let _ = victim.wait();
        assert_eq!(describe_for(Model::Landlock)["landlock"]["scoped"], true);
    }

    /// What `python3 -c KEYS ID...` prints: for `@s`, `@u` and each id, what reading it
    /// gives (a keyring's members are read too): `b'...'` for data, `errno N` for a refusal.
    const KEYS: &str = r#"
import ctypes, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
NR = {"x86_64": 250, "aarch64": 219}[platform.machine()]
def read(k, depth=0):
    b = ctypes.create_string_buffer(4096)
    n = libc.syscall(L(NR), L(11), L(k), b, L(4096))
    print(k, b.raw[:n] if n >= 0 else "errno %d" % ctypes.get_errno())
    if n > 0 and n % 4 == 0 and depth < 2 and k < 0:
        for i in range(0, n, 4):
            read(int.from_bytes(b.raw[i:i + 4], sys.byteorder, signed=True), depth + 1)
for k in [-3, -4] + [int(x) for x in sys.argv[1:]]:
    read(k)
print("probed")
"#;

    /// A key added on the host (`keyctl add user NAME SECRET RING`) by this thread; expires
    /// in 5 minutes, invalidated on drop.
    struct HostKey(libc::c_long);

    impl HostKey {
        fn add(name: &str, secret: &str, ring: libc::c_long) -> HostKey {
            let name = CString::new(name).unwrap();
            // SAFETY: add_key and keyctl with C strings and integers we hold.
            let id = unsafe {
                libc::syscall(
                    libc::SYS_add_key,
                    c"user".as_ptr(),
                    name.as_ptr(),
                    secret.as_ptr(),
                    secret.len(),
                    ring,
                )
            };
            assert!(id > 0, "add_key: {}", io::Error::last_os_error());
            // SAFETY: KEYCTL_SET_TIMEOUT with integers.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_keyctl,
                    15 as libc::c_long,
                    id,
                    300 as libc::c_long,
                )
            };
            assert_eq!(r, 0, "{}", io::Error::last_os_error());
            HostKey(id)
        }
    }

    impl Drop for HostKey {
        fn drop(&mut self) {
            // SAFETY: KEYCTL_INVALIDATE with an integer.
            unsafe { libc::syscall(libc::SYS_keyctl, 21 as libc::c_long, self.0) };
        }
    }

    /// The weaker models run commands on the daemon's side of the host, so they would inherit
    /// its session keyring (a login's, holding the user's keys) and share its user keyring.
    /// Each command gets a session keyring of its own; with `landlock`, the keyring calls are
    /// refused too (the user keyring is the host's: only that keeps it out).
    #[tokio::test]
    async fn weaker_models_do_not_inherit_the_hosts_keys() {
        if !Path::new("/usr/bin/python3").exists() {
            eprintln!("no python3: skipped");
            return;
        }
        // This thread's session keyring, as a login has one (commands are forked from it),
        // with the user keyring linked in as pam_keyinit does (its keys are then possessed:
        // this test may expire and remove them).
        // SAFETY: KEYCTL_JOIN_SESSION_KEYRING with a null name, KEYCTL_LINK of @u into @s.
        unsafe {
            let joined = libc::syscall(libc::SYS_keyctl, 1 as libc::c_long, 0 as libc::c_long);
            assert!(joined > 0, "{}", io::Error::last_os_error());
            let linked = libc::syscall(
                libc::SYS_keyctl,
                8 as libc::c_long,
                -4 as libc::c_long,
                -3 as libc::c_long,
            );
            assert_eq!(linked, 0, "{}", io::Error::last_os_error());
        }
        let tag = format!("{}-{}", std::process::id(), rand_tag());
        let session = HostKey::add(
            &format!("abx-iso-{tag}"),
            &format!("SESSIONSECRET-{tag}"),
            -3,
        );
        let user = HostKey::add(
            &format!("abx-iso-u-{tag}"),
            &format!("USERSECRET-{tag}"),
            -4,
        );
        let ids = [session.0.to_string(), user.0.to_string()];
        let script = format!("python3 -c '{KEYS}' {} {}", ids[0], ids[1]);
        // The probe itself sees them here (it is not confined).
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("SESSIONSECRET-{tag}")), "{text}");
        let (_t, dirs) = sandbox();
        let out = run(
            Model::Unconfined,
            &dirs,
            "sb-keys-none",
            "/workspace",
            &script,
        )
        .await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("probed"), "{text}");
        assert!(!text.contains(&format!("SESSIONSECRET-{tag}")), "{text}");
        if landlock_abi() > 0 && abx_confine::seccomp_available() {
            let out = run(Model::Landlock, &dirs, "sb-keys-ll", "/workspace", &script).await;
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("probed"), "{text}");
            for secret in ["SESSIONSECRET", "USERSECRET"] {
                assert!(!text.contains(&format!("{secret}-{tag}")), "{text}");
            }
        }
    }

    fn rand_tag() -> u32 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
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
