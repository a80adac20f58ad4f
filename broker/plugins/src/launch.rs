//! The plugin launcher: every plugin process starts as `<daemon binary> __abx-plugin-launch`
//! (docs/design.md#providers, issue 19), a plain single-threaded program (never code run between `fork` and
//! `exec` of the multi-threaded daemon) that gives the plugin a world of its own and runs it
//! from a verified private copy of its installed tree.
//!
//! The daemon ([`super::host`]) starts it with the plugin's stdio pipes, its [`Config`] in
//! [`CONFIG_ENV`] and a status pipe on fd 3, on which the launcher writes one line before the
//! plugin's handshake: `ok namespaces`, `ok none <why>`, `integrity <why>` or `error <why>`.
//!
//! With namespaces (the default, where the kernel allows it):
//!
//! - the **outer** process makes a user namespace (the same uid and gid mapped, as an
//!   unprivileged user may; a root daemon without user namespaces makes the others alone), a
//!   PID namespace and a mount namespace, and forks the inner one. It stays in the daemon's PID
//!   namespace: it is the child the daemon holds and kills, and its death kills the inner one
//!   (`PR_SET_PDEATHSIG`), whose death ends every process of the namespace. The network
//!   namespace stays the daemon's: plugins talk to their servers.
//! - the **inner** process, PID 1 of the new namespace, composes the mount namespace: a tmpfs
//!   over the broker's runtime, config and data directories (no socket, no state, no other
//!   plugin to find), with the plugin's own data and temp directories bound back; a tmpfs at
//!   the installed tree's path, filled with the copy made while hashing (digest.rs, one pass)
//!   and compared with the recorded digest before anything runs, then made read-only; a fresh
//!   `/proc` of the new PID namespace (the daemon's `/proc/<pid>/root` is not there; its
//!   `keys` and `key-users` masked). Then it starts the plugin (a new session keyring instead
//!   of the daemon's, capabilities dropped, no_new_privs, the seccomp filters (its socket rules,
//!   the keyring calls refused: `abx_confine::keyring`) and the Landlock ruleset of its
//!   `[security]`, built here after the mounts so its rules name the copy),
//!   reaps every process of the namespace and exits with the plugin's status.
//!
//! The plugin sees its tree at the installed path (its cwd, `./` in `runtime.command`), so
//! nothing about its environment changes. The daemon refuses peers in another PID namespace
//! (`daemon::foreign_peer`), so a plugin that reaches the socket anyway (a hard link in its
//! data dir) is refused.
//!
//! Without namespaces (a kernel or container that forbids them, or `ABX_PLUGIN_ISOLATION=none`)
//! the copy goes to a fresh 0700 directory under the daemon's runtime dir (removed when the
//! plugin stops), the plugin runs from there, the launcher is a child subreaper (orphans of the
//! plugin stay beneath it and are killed with it), and the daemon refuses every peer whose
//! parent chain reaches a launcher it started ([`plugin_of`]). `provider/info`, doctor and the
//! log say which mode a plugin runs in.

use abx_confine::Policy;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The argument that makes the daemon binary run as a plugin launcher.
pub const ARG: &str = "__abx-plugin-launch";
/// The environment variable carrying the [`Config`] (JSON) to the launcher.
pub const CONFIG_ENV: &str = "ABX_PLUGIN_LAUNCH";
/// `none` turns the namespaces off (the fallback's rules stay): tests, and kernels where
/// namespaces misbehave.
pub const ISOLATION_ENV: &str = "ABX_PLUGIN_ISOLATION";
/// The program run as the launcher: this, else the daemon's own binary.
pub const LAUNCHER_ENV: &str = "ABX_PLUGIN_LAUNCHER";
/// The status pipe in the launcher.
const STATUS_FD: RawFd = 3;

/// What the launcher does.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// Provider id (for messages).
    pub id: String,
    /// The installed tree.
    pub tree: PathBuf,
    /// Its recorded digest.
    pub digest: String,
    /// Where the private copy goes without namespaces (must not exist; its parent must).
    pub copy_dir: PathBuf,
    /// `runtime.command[0]` (`./x` is relative to the tree the plugin sees).
    pub program: String,
    /// The rest of `runtime.command`.
    pub args: Vec<String>,
    /// The plugin's whole environment.
    pub env: Vec<(String, String)>,
    /// Directories hidden from the plugin (the broker's runtime, config and data dirs).
    pub hide: Vec<PathBuf>,
    /// Directories beneath them the plugin keeps (its data and temp dirs).
    pub keep: Vec<PathBuf>,
    /// The plugin's confinement (paths as the plugin sees them with namespaces).
    pub policy: Policy,
    /// Try namespaces (false: `ABX_PLUGIN_ISOLATION=none`).
    pub namespaces: bool,
}

/// What the launcher said on its status pipe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// The plugin runs; `None` with namespaces, `Some(why)` without.
    Started(Option<String>),
    /// The copy's digest is not the recorded one: nothing ran.
    Integrity(String),
    /// Setup failed: nothing ran.
    Failed(String),
}

impl Status {
    /// Parse a status line (no line, or an unknown one: the launcher failed).
    pub fn parse(line: &str) -> Status {
        let line = line.trim_end();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "ok" if rest == "namespaces" => Status::Started(None),
            "ok" => Status::Started(Some(rest.strip_prefix("none ").unwrap_or(rest).to_owned())),
            "integrity" => Status::Integrity(rest.to_owned()),
            "error" => Status::Failed(rest.to_owned()),
            "" => Status::Failed("the plugin launcher exited without a word".into()),
            _ => Status::Failed(format!("the plugin launcher said '{line}'")),
        }
    }
}

/// The program the daemon runs as the launcher.
pub fn program() -> PathBuf {
    std::env::var_os(LAUNCHER_ENV)
        .map(Into::into)
        .unwrap_or_else(|| "/proc/self/exe".into())
}

/// Whether namespaces are wanted (`ABX_PLUGIN_ISOLATION` is not `none`).
pub fn namespaces_wanted() -> bool {
    std::env::var(ISOLATION_ENV).map_or(true, |v| v != "none")
}

// ---------------------------------------------------------------------------------------
// The daemon's side: which processes are plugins'.

/// Live launchers: pid -> provider id.
static LAUNCHERS: Mutex<Option<HashMap<i32, String>>> = Mutex::new(None);

/// Remember a launcher the host started.
pub fn register(pid: i32, id: &str) {
    LAUNCHERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(pid, id.to_owned());
}

/// Forget a launcher that was reaped.
pub fn forget(pid: i32) {
    if let Some(m) = LAUNCHERS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        m.remove(&pid);
    }
}

/// The parent of `pid` from `/proc/<pid>/stat` (the field after the command's `)`).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The plugin whose launcher `pid` descends from (or is), if any: the peer rule for
/// plugins, also where namespaces are unavailable. A launcher this daemon started is named
/// by its provider id; a launcher of any other daemon of the user (an editor's private
/// `abx broker --stdio`, another `ABX_HOME`) by its command line: `argv[1]` is
/// [`ARG`], written by the kernel at its `execve`, in a process the plugin cannot rewrite
/// (the fallback's launcher is not dumpable, and Landlock confines the plugin's ptrace to
/// its own domain). A process cannot leave its ancestry while its launcher lives except by
/// being orphaned, and orphans of a plugin are reparented to its launcher (a child
/// subreaper).
///
/// Launchers of other daemons are looked for only when [`abx_home::paths::ancestry_flag`] is
/// raised (a launcher without namespaces raises it before its plugin runs); with namespaces
/// a plugin is in another PID namespace, which the daemon refuses first.
pub fn plugin_of(pid: i32) -> Option<String> {
    let guard = LAUNCHERS.lock().unwrap_or_else(|e| e.into_inner());
    let map = guard.as_ref().filter(|m| !m.is_empty());
    let others = abx_home::paths::ancestry_flag().exists();
    if map.is_none() && !others {
        return None;
    }
    let mut p = pid;
    for _ in 0..256 {
        if let Some(id) = map.and_then(|m| m.get(&p)) {
            return Some(id.clone());
        }
        if others && is_launcher(p) {
            return Some(format!("(a launcher of another daemon, pid {p})"));
        }
        match parent_of(p) {
            Some(pp) if pp > 1 && pp != p => p = pp,
            _ => return None,
        }
    }
    None
}

/// Whether `pid` runs as a plugin launcher: its `argv[1]` is [`ARG`].
fn is_launcher(pid: i32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    cmdline.split(|b| *b == 0).nth(1) == Some(ARG.as_bytes())
}

// ---------------------------------------------------------------------------------------
// The launcher.

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

fn mount(
    src: Option<&str>,
    dst: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let c = |s: &str| CString::new(s).unwrap_or_default();
    let (src_c, fs_c, data_c) = (src.map(c), fstype.map(c), data.map(c));
    let d = cstr(dst);
    // SAFETY: mount(2) with valid C strings or nulls.
    let rc = unsafe {
        libc::mount(
            src_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            d.as_ptr(),
            fs_c.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data_c
                .as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        )
    };
    if rc != 0 {
        return Err(os_err(&format!(
            "mounting {} on {}",
            fstype.or(src).unwrap_or("(remount)"),
            dst.display()
        )));
    }
    Ok(())
}

fn status(line: &str) {
    let mut b = line.replace('\n', " ").into_bytes();
    b.push(b'\n');
    // SAFETY: write(2) of a local buffer on our status descriptor.
    unsafe { libc::write(STATUS_FD, b.as_ptr().cast(), b.len()) };
}

/// Point 0, 1 and 2 at /dev/null (the plugin holds the pipes; EOF on them means it is gone).
fn release_stdio() {
    // SAFETY: open/dup2/close of descriptors we own.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            libc::close(null);
        }
        libc::close(STATUS_FD);
    }
}

enum Fail {
    Integrity(String),
    Setup(String),
}

/// The exit code of a launcher process; a failure is reported on the status line first.
fn launcher_exit(r: Result<i32, Fail>) -> i32 {
    match r {
        Ok(c) => c,
        Err(Fail::Integrity(why)) => {
            status(&format!("integrity {why}"));
            125
        }
        Err(Fail::Setup(why)) => {
            let _ = writeln!(io::stderr(), "abx-plugin-launch: {why}");
            status(&format!("error {why}"));
            125
        }
    }
}

/// Entry point of `<binary> __abx-plugin-launch`. Never returns.
pub fn main() -> ! {
    let code = launcher_exit(launch());
    std::process::exit(code)
}

fn launch() -> Result<i32, Fail> {
    let raw =
        std::env::var(CONFIG_ENV).map_err(|_| Fail::Setup(format!("{CONFIG_ENV} is not set")))?;
    std::env::remove_var(CONFIG_ENV);
    let cfg: Config = serde_json::from_str(&raw)
        .map_err(|e| Fail::Setup(format!("reading the launch config: {e}")))?;
    drop(raw);
    let unshared = if cfg.namespaces {
        unshare()?
    } else {
        Err(format!("turned off ({ISOLATION_ENV}=none)"))
    };
    match unshared {
        Ok(()) => outer(&cfg),
        Err(why) => flat(&cfg, &why),
    }
}

/// New user (unless a root daemon cannot have one), PID and mount namespaces, the same uid
/// and gid mapped. Ok(Err(why)) when the kernel refuses: the launcher runs without them; a
/// user namespace made but not mapped is a failure (nothing could run in it as the user).
fn unshare() -> Result<Result<(), String>, Fail> {
    // SAFETY: plain system calls in a single-threaded process.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let all = libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS;
    // SAFETY: unshare with flags only.
    if unsafe { libc::unshare(all) } == 0 {
        let maps = std::fs::write("/proc/self/setgroups", b"deny")
            .or_else(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .and_then(|_| std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n")))
            .and_then(|_| std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n")));
        return maps
            .map(Ok)
            .map_err(|e| Fail::Setup(format!("writing the uid/gid maps: {e}")));
    }
    let e = io::Error::last_os_error();
    // SAFETY: unshare with flags only.
    if uid == 0 && unsafe { libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) } == 0 {
        return Ok(Ok(()));
    }
    Ok(Err(format!("the kernel refused new namespaces: {e}")))
}

fn wait_for(pid: i32) -> i32 {
    loop {
        let mut st = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            return exit_code(st);
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    }
}

fn exit_code(st: i32) -> i32 {
    if libc::WIFEXITED(st) {
        libc::WEXITSTATUS(st)
    } else {
        128 + libc::WTERMSIG(st)
    }
}

fn outer(cfg: &Config) -> Result<i32, Fail> {
    // A pipe whose write end only this process holds: the inner one sees it hang up if this
    // one died before its death signal was armed (its getppid() is 0 in the new namespace).
    let mut alive = [0; 2];
    // SAFETY: pipe2 into a local array, then fork in a single-threaded process.
    if unsafe { libc::pipe2(alive.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Fail::Setup(os_err("pipe")));
    }
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Fail::Setup(os_err("fork")));
    }
    if pid == 0 {
        // SAFETY: prctl with integer arguments; close and poll our own descriptors.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            libc::close(alive[1]);
            let mut p = libc::pollfd {
                fd: alive[0],
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut p, 1, 0) != 0 {
                libc::_exit(1);
            }
            libc::close(alive[0]);
        }
        let code = launcher_exit(inner(cfg));
        // SAFETY: leaving the inner process.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: closing our copy of the read end.
    unsafe { libc::close(alive[0]) };
    release_stdio();
    Ok(wait_for(pid))
}

/// PID 1 of the plugin's namespace: compose its mounts, start it, reap, exit with its status.
fn inner(cfg: &Config) -> Result<i32, Fail> {
    let warning = compose(cfg)?;
    if let Some(w) = &warning {
        let _ = writeln!(io::stderr(), "abx-plugin-launch: {w}");
    }
    let plugin = spawn(cfg, &cfg.tree, &cfg.policy)?;
    status("ok namespaces");
    release_stdio();
    Ok(reap_until(plugin))
}

/// Reap everything; return the plugin's status when it exits (PID 1 leaving ends the rest).
fn reap_until(plugin: i32) -> i32 {
    loop {
        let mut st = 0;
        // SAFETY: waiting for any child.
        let r = unsafe { libc::waitpid(-1, &mut st, 0) };
        if r == plugin {
            return exit_code(st);
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    }
}

/// The outermost existing directories of `dirs`.
fn outermost(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = dirs.iter().filter(|d| d.is_dir()).cloned().collect();
    v.sort();
    v.dedup();
    let all = v.clone();
    v.retain(|d| !all.iter().any(|o| o != d && d.starts_with(o)));
    v
}

/// The mount namespace: broker state hidden, the verified copy at the tree's path, a fresh
/// `/proc`. Some(warning) when `/proc` could not be replaced.
fn compose(cfg: &Config) -> Result<Option<String>, Fail> {
    let setup = Fail::Setup;
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .map_err(setup)?;
    // Opened before anything is mounted over them.
    let src = std::fs::File::open(&cfg.tree)
        .map_err(|e| Fail::Setup(format!("opening {}: {e}", cfg.tree.display())))?;
    let keep: Vec<(PathBuf, std::fs::File)> = cfg
        .keep
        .iter()
        .filter_map(|p| {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
                .open(p)
                .ok()
                .map(|f| (p.clone(), f))
        })
        .collect();
    let hide = outermost(&cfg.hide);
    let hidden = |p: &Path| hide.iter().any(|h| p.starts_with(h));
    for h in &hide {
        mount(
            Some("tmpfs"),
            h,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some("mode=0755,size=1m"),
        )
        .map_err(setup)?;
    }
    for (p, f) in &keep {
        if !hidden(p) {
            continue;
        }
        std::fs::create_dir_all(p)
            .map_err(|e| Fail::Setup(format!("creating {}: {e}", p.display())))?;
        let from = format!("/proc/self/fd/{}", f.as_raw_fd());
        mount(Some(&from), p, None, libc::MS_BIND | libc::MS_REC, None).map_err(setup)?;
    }
    drop(keep);
    // The private copy, made while hashing, at the tree's own path.
    std::fs::create_dir_all(&cfg.tree)
        .map_err(|e| Fail::Setup(format!("creating {}: {e}", cfg.tree.display())))?;
    let size = format!("mode=0755,size={}", super::install::MAX_TREE + (16 << 20));
    mount(
        Some("tmpfs"),
        &cfg.tree,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&size),
    )
    .map_err(setup)?;
    // The trailing `.`: the magic link itself is a symlink, the directory behind it is not.
    let from = PathBuf::from(format!("/proc/self/fd/{}/.", src.as_raw_fd()));
    super::digest::copy_verified(&from, &cfg.tree, &cfg.digest).map_err(Fail::Integrity)?;
    drop(src);
    let ro = libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    mount(None, &cfg.tree, None, ro, None).map_err(setup)?;
    for h in &hide {
        mount(None, h, None, ro | libc::MS_NOEXEC, None).map_err(setup)?;
    }
    // A /proc of the new PID namespace: no daemon pid, no /proc/<pid>/root into the host.
    let warning = mount(
        Some("proc"),
        Path::new("/proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .err()
    .map(|e| format!("{e}; the plugin sees the host's /proc (the peer rule still refuses it)"));
    // The key lists name every key of the plugin's uid (the user's own keys): masked.
    if warning.is_none() {
        for keys in ["/proc/keys", "/proc/key-users"] {
            if Path::new(keys).exists() {
                mount(
                    Some("/dev/null"),
                    Path::new(keys),
                    None,
                    libc::MS_BIND,
                    None,
                )
                .map_err(setup)?;
            }
        }
    }
    Ok(warning)
}

/// Without namespaces: copy to `copy_dir`, run from there, kill what is left when it exits.
fn flat(cfg: &Config, why: &str) -> Result<i32, Fail> {
    // A subreaper, so the plugin's orphans stay beneath this process (its mark, see
    // [`plugin_of`]); not dumpable, so the plugin (same uid) can neither ptrace it nor
    // rewrite its command line. Its children are dumpable again once they exec.
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    // Every daemon of the user checks its peers' ancestry from now on (before the plugin
    // runs: it shares their PID namespace).
    abx_home::paths::raise_ancestry_flag().map_err(|e| {
        Fail::Setup(format!(
            "raising {}: {e}",
            abx_home::paths::ancestry_flag().display()
        ))
    })?;
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&cfg.copy_dir)
            .map_err(|e| Fail::Setup(format!("creating {}: {e}", cfg.copy_dir.display())))?;
    }
    let result = (|| {
        super::digest::copy_verified(&cfg.tree, &cfg.copy_dir, &cfg.digest)
            .map_err(Fail::Integrity)?;
        let moved = |p: &PathBuf| match p.strip_prefix(&cfg.tree) {
            Ok(rest) => cfg.copy_dir.join(rest),
            Err(_) => p.clone(),
        };
        let mut policy = cfg.policy.clone();
        policy.read = policy.read.iter().map(moved).collect();
        policy.exec = policy.exec.map(|v| v.iter().map(moved).collect());
        spawn(cfg, &cfg.copy_dir, &policy)
    })();
    let plugin = match result {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&cfg.copy_dir);
            return Err(e);
        }
    };
    status(&format!("ok none {why}"));
    release_stdio();
    let code = reap_until(plugin);
    kill_descendants();
    let _ = std::fs::remove_dir_all(&cfg.copy_dir);
    Ok(code)
}

/// Kill and reap every process left beneath this one (orphans are reparented to it).
fn kill_descendants() {
    // SAFETY: getpid.
    let me = unsafe { libc::getpid() };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        let kids: Vec<i32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|&p| parent_of(p) == Some(me))
            .collect();
        for &k in &kids {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(k, libc::SIGKILL) };
        }
        let mut st = 0;
        // SAFETY: waiting for any child.
        let r = unsafe { libc::waitpid(-1, &mut st, 0) };
        if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            return;
        }
    }
}

/// Start the plugin with `root` as its tree: capabilities dropped, confined, its env only.
fn spawn(cfg: &Config, root: &Path, policy: &Policy) -> Result<i32, Fail> {
    let program = if cfg.program.starts_with("./") || cfg.program.starts_with("../") {
        root.join(&cfg.program).to_string_lossy().into_owned()
    } else {
        cfg.program.clone()
    };
    let prepared = policy
        .prepare()
        .map_err(|e| Fail::Setup(format!("confinement: {e}")))?;
    let last_cap = abx_confine::caps::last_cap();
    let mut cmd = std::process::Command::new(&program);
    cmd.args(&cfg.args)
        .env_clear()
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .current_dir(root);
    // SAFETY: system calls only: the status pipe and anything else stays out, a session
    // keyring of its own (not the daemon's, a login's with the user's keys), capabilities go
    // (a root daemon's plugin keeps none), then no_new_privs, seccomp (its socket rules and
    // the keyring calls refused) and Landlock.
    unsafe {
        cmd.pre_exec(move || {
            libc::close(STATUS_FD);
            abx_confine::fds::close_inherited_in_child();
            abx_confine::keyring::join_fresh_session()
                .map_err(|_| io::Error::other("joining a new session keyring"))?;
            abx_confine::caps::drop_all(last_cap, false)
                .map_err(|_| io::Error::other("dropping capabilities"))?;
            abx_confine::restrict_self(&prepared).map_err(|(_, e)| io::Error::from_raw_os_error(e))
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| Fail::Setup(format!("cannot start {program}: {e}")))?;
    let pid = child.id() as i32;
    // The child is reaped by pid (waitpid), not through `Child`.
    std::mem::forget(child);
    Ok(pid)
}

/// The daemon's end of the status pipe and the launcher's (to become its fd 3).
pub fn status_pipe() -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    let mut p = [0; 2];
    // SAFETY: pipe2 into a local array.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are ours.
    let (r, w) = unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(p[0]),
            std::os::fd::OwnedFd::from_raw_fd(p[1]),
        )
    };
    // The launcher's end blocks (it writes one line).
    // SAFETY: fcntl on our own descriptor.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, 0) };
    Ok((r, w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(Status::parse("ok namespaces\n"), Status::Started(None));
        assert_eq!(
            Status::parse("ok none the kernel refused: EPERM\n"),
            Status::Started(Some("the kernel refused: EPERM".into()))
        );
        assert_eq!(
            Status::parse("integrity digest x"),
            Status::Integrity("digest x".into())
        );
        assert_eq!(Status::parse("error boom"), Status::Failed("boom".into()));
        assert!(matches!(Status::parse(""), Status::Failed(_)));
    }

    #[test]
    fn outermost_dirs_only() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("a/b"));
        std::fs::create_dir_all(&b).unwrap();
        let c = d.path().join("c");
        std::fs::create_dir_all(&c).unwrap();
        let missing = d.path().join("missing");
        assert_eq!(
            outermost(&[b.clone(), a.clone(), c.clone(), missing, a.clone()]),
            vec![a, c]
        );
    }

    #[test]
    fn plugin_of_walks_the_parent_chain() {
        // This test process descends from its parent; register the parent.
        let me = std::process::id() as i32;
        let parent = parent_of(me).unwrap();
        assert_eq!(plugin_of(me), None);
        register(parent, "p");
        assert_eq!(plugin_of(me).as_deref(), Some("p"));
        forget(parent);
        assert_eq!(plugin_of(me), None);
    }

    /// A launcher no daemon of this process registered (another daemon's) is known by its
    /// `argv[1]`, for every process beneath it, orphans included.
    #[test]
    fn a_launcher_of_another_daemon_is_known_by_its_command_line() {
        let d = tempfile::tempdir().unwrap();
        // `sh __abx-plugin-launch`: argv[1] is the launcher's argument. Its script starts a
        // child and an orphan (reparented to a subreaper or init) and waits.
        std::fs::write(
            d.path().join(ARG),
            "sleep 30 & echo $! > child\n(sleep 30 & echo $! > orphan) \nwait\n",
        )
        .unwrap();
        let mut launcher = std::process::Command::new("/bin/sh")
            .arg(ARG)
            .current_dir(d.path())
            .spawn()
            .unwrap();
        let pid_in = |f: &str| -> Option<i32> {
            std::fs::read_to_string(d.path().join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        // Until both exist and have become `sleep`: between its fork and its exec a child of
        // the shell still has the launcher's command line (it is then a launcher itself, and
        // plugin_of names it instead of its parent: seen once under load).
        let execed = |p: Option<i32>| p.is_some_and(|p| !is_launcher(p));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !(execed(pid_in("child")) && execed(pid_in("orphan")))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (child, orphan) = (pid_in("child").unwrap(), pid_in("orphan").unwrap());
        let lpid = launcher.id() as i32;
        assert!(is_launcher(lpid));
        // What a launcher without namespaces does before its plugin runs.
        abx_home::paths::raise_ancestry_flag().unwrap();
        assert!(plugin_of(child).unwrap().contains(&format!("pid {lpid}")));
        // This process is not beneath a launcher; the orphan left its launcher's ancestry
        // (no subreaper here: a real launcher is one, so its orphans stay beneath it).
        assert_eq!(plugin_of(std::process::id() as i32), None);
        for p in [child, orphan] {
            // SAFETY: signalling processes this test started.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        let _ = launcher.wait();
    }
}
