//! A sandbox's processes: finding, listing and signalling them through `/proc`.
//!
//! Every process the broker starts in a sandbox carries `ABX_SANDBOX_ID=<id>` in its
//! environment ([`super::isolate::Confine::apply`] sets it). A process belongs to a sandbox
//! when its environment has that exact entry, or when one of its ancestors (by `ppid`) does,
//! so a child started with a cleaned environment (`env -i`) still counts while its parent
//! lives. Zombies have no readable environment: they are reported when their parent belongs.
//!
//! That marker is how the opt-in weaker models (`landlock`, `none`) find a sandbox's
//! processes; there a process that both clears its environment and is re-parented away from
//! the sandbox (a double fork after `env -i`) is no longer found. Sandboxes of the default
//! `namespaces` model are listed by their PID namespace instead ([`list_members`], from
//! [`super::container::Container::members`]). Processes of other users are never listed.

use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::fs;

/// The environment variable naming the sandbox of a process.
pub const MARKER: &str = "ABX_SANDBOX_ID";

/// Whether a process of a sandbox may run in the daemon's own PID namespace: set when a
/// weaker model starts one ([`note_host_sandbox_process`]) and at start when such processes
/// are found ([`scan_for_host_sandbox_processes`]). Until then [`sandbox_of`]'s walk of a
/// peer's ancestors (two `/proc` reads per ancestor, a third of a CLI call's wait) is
/// skipped: every sandbox process of the `namespaces` model is in a PID namespace of its
/// own, which the daemon refuses first.
static HOST_SANDBOX_PROCESSES: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A sandbox process now runs in the daemon's PID namespace (the weaker models).
pub fn note_host_sandbox_process() {
    HOST_SANDBOX_PROCESSES.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// True when a peer must be checked with [`sandbox_of`].
pub fn may_have_host_sandbox_processes() -> bool {
    HOST_SANDBOX_PROCESSES.load(std::sync::atomic::Ordering::SeqCst)
        || super::isolate::model() != super::isolate::Model::Namespaces
}

/// With a weaker model than namespaces in force, raise the user's ancestry flag
/// ([`abx_home::paths::ancestry_flag`]) before any sandbox runs: its processes share the
/// PID namespace of every daemon of the user, which then checks each peer's ancestry. Every
/// broker calls it at start (the socket daemon through [`scan_for_host_sandbox_processes`]).
pub fn announce_weaker_model() {
    if super::isolate::model() == super::isolate::Model::Namespaces {
        return;
    }
    if let Err(e) = abx_home::paths::raise_ancestry_flag() {
        tracing::warn!(error = %e, "cannot raise the user's ancestry flag");
    }
}

/// At daemon start: whether processes of a weaker model's sandboxes may be left in this PID
/// namespace, and if so whether any is (then peers are checked by ancestry from now on).
/// `data/local/host-processes` says `maybe` after a daemon ran a weaker model or found such
/// processes, `none` after one looked and found none, so a scan of `/proc` runs only after a
/// weaker model (or, without the file, when sandboxes exist from before: `any_sandboxes`).
pub fn scan_for_host_sandbox_processes(data_dir: &std::path::Path, any_sandboxes: bool) {
    let file = data_dir.join("local").join("host-processes");
    let record = |v: &str| {
        let _ = fs::create_dir_all(data_dir.join("local"));
        let _ = abx_home::util::replace_file(&file, v.as_bytes());
    };
    if super::isolate::model() != super::isolate::Model::Namespaces {
        record("maybe\n");
        announce_weaker_model();
        return;
    }
    let maybe = match fs::read_to_string(&file) {
        Ok(s) => s.trim() != "none",
        Err(_) => any_sandboxes,
    };
    if !maybe {
        return;
    }
    let me = std::process::id() as i32;
    let found = match fs::read_dir("/proc") {
        Err(_) => true,
        Ok(rd) => rd.flatten().any(|e| {
            e.file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
                .is_some_and(|pid| pid != me && marker_of(pid).is_some())
        }),
    };
    if found {
        note_host_sandbox_process();
    }
    record(if found { "maybe\n" } else { "none\n" });
}

/// One process of a sandbox (`process/list`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcInfo {
    /// Host pid (also the pid inside the sandbox: no pid namespace).
    pub pid: i32,
    /// Parent pid.
    pub ppid: i32,
    /// The command line joined with spaces, or `[comm]` when it has none.
    pub command: String,
    /// `running`, `sleeping`, `disk-sleep`, `stopped`, `tracing-stop`, `zombie`, `dead`,
    /// `idle`, ... from `/proc/<pid>/stat`.
    pub status: String,
}

/// What `/proc/<pid>/stat` tells.
#[derive(Clone, Debug)]
struct Stat {
    comm: String,
    state: char,
    ppid: i32,
}

/// The most read of one `/proc/<pid>/` file listing a process: the kernel bounds `stat`
/// (well under this), a process's own `cmdline` only by its argument space (about 2 MB
/// each, with an 8 MiB stack limit: a sandbox of 900 such processes once made
/// `process/list` read 1.7 GB).
const STAT_MAX: usize = 4096;
/// Bytes of a command line shown (then cut at a character, with an ellipsis).
pub const MAX_COMMAND: usize = 4096;
/// Bytes of command lines one listing shows in all: past them each command is cut to
/// [`SHORT_COMMAND`] bytes.
pub const MAX_COMMANDS_TOTAL: usize = 1024 * 1024;
/// A command's share once a listing's [`MAX_COMMANDS_TOTAL`] is spent.
pub const SHORT_COMMAND: usize = 128;
/// Processes one listing shows at most (the lowest pids; a sandbox's default `pids` limit
/// is 1024).
pub const MAX_LISTED: usize = 4096;

/// At most `max` bytes of a file (a `/proc` file: never more, whatever it holds), and
/// whether there was more.
fn read_capped(path: &str, max: usize) -> Option<(Vec<u8>, bool)> {
    use std::io::Read;
    let f = fs::File::open(path).ok()?;
    let mut buf = Vec::with_capacity(max.min(64 * 1024) + 1);
    f.take(max as u64 + 1).read_to_end(&mut buf).ok()?;
    let more = buf.len() > max;
    buf.truncate(max);
    Some((buf, more))
}

fn read_stat(pid: i32) -> Option<Stat> {
    // Bytes: a `comm` that is not UTF-8 (a process names itself) must not hide it.
    let (b, _) = read_capped(&format!("/proc/{pid}/stat"), STAT_MAX)?;
    let s = String::from_utf8_lossy(&b);
    // `pid (comm) S ppid pgrp ...`: comm may hold spaces and parentheses.
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s.get(open + 1..close)?.to_owned();
    let mut rest = s.get(close + 1..)?.split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(Stat { comm, state, ppid })
}

fn status_name(state: char) -> &'static str {
    match state {
        'R' => "running",
        'S' => "sleeping",
        'D' => "disk-sleep",
        'T' => "stopped",
        't' => "tracing-stop",
        'Z' => "zombie",
        'X' | 'x' => "dead",
        'I' => "idle",
        'P' => "parked",
        'W' => "waking",
        'K' => "wakekill",
        _ => "unknown",
    }
}

/// Call `f` with each entry of `/proc/<pid>/environ` (read in pieces, never whole: a
/// process's environment can be megabytes), its first `keep` bytes and its full length,
/// until `f` returns true. False when the file cannot be read.
fn env_entries(pid: i32, keep: usize, mut f: impl FnMut(&[u8], usize) -> bool) -> bool {
    use std::io::Read;
    let Ok(mut file) = fs::File::open(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let mut chunk = [0u8; 8192];
    let (mut entry, mut len) = (Vec::with_capacity(keep), 0usize);
    loop {
        let n = match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        for &b in &chunk[..n] {
            if b == 0 {
                if f(&entry, len) {
                    return true;
                }
                entry.clear();
                len = 0;
            } else {
                if entry.len() < keep {
                    entry.push(b);
                }
                len += 1;
            }
        }
    }
    if len > 0 {
        f(&entry, len);
    }
    true
}

/// Whether the environment of `pid` holds exactly `ABX_SANDBOX_ID=<sandbox_id>`.
fn has_marker(pid: i32, sandbox_id: &str) -> bool {
    let want_len = MARKER.len() + 1 + sandbox_id.len();
    let mut found = false;
    env_entries(pid, want_len, |entry, len| {
        found = len == want_len
            && entry.starts_with(MARKER.as_bytes())
            && entry[MARKER.len()] == b'='
            && &entry[MARKER.len() + 1..] == sandbox_id.as_bytes();
        found
    });
    found
}

fn all_pids() -> Vec<i32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|p: &i32| *p > 0)
        .collect();
    pids.sort_unstable();
    pids
}

/// A snapshot of every process's stat.
fn snapshot() -> HashMap<i32, Stat> {
    all_pids()
        .into_iter()
        .filter_map(|p| Some((p, read_stat(p)?)))
        .collect()
}

/// The members of a sandbox in a snapshot: marked processes and their descendants.
fn members(snap: &HashMap<i32, Stat>, sandbox_id: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut memo: HashMap<i32, bool> = HashMap::new();
    let mut out = Vec::new();
    let mut pids: Vec<i32> = snap.keys().copied().collect();
    pids.sort_unstable();
    for pid in pids {
        if pid != me && is_member(pid, snap, sandbox_id, me, &mut memo) {
            out.push(pid);
        }
    }
    out
}

fn is_member(
    pid: i32,
    snap: &HashMap<i32, Stat>,
    sandbox_id: &str,
    me: i32,
    memo: &mut HashMap<i32, bool>,
) -> bool {
    // Walk up to the first ancestor whose answer is known or that carries the marker.
    let mut chain = Vec::new();
    let mut cur = pid;
    let mut seen = HashSet::new();
    let answer = loop {
        if let Some(&known) = memo.get(&cur) {
            break known;
        }
        // The broker itself and init never belong; stop on loops (pid reuse races).
        if cur <= 1 || cur == me || !seen.insert(cur) {
            break false;
        }
        let Some(stat) = snap.get(&cur) else {
            break false;
        };
        chain.push(cur);
        if stat.state != 'Z' && has_marker(cur, sandbox_id) {
            break true;
        }
        cur = stat.ppid;
    };
    for p in chain {
        memo.insert(p, answer);
    }
    answer
}

/// What one listing has left of [`MAX_COMMANDS_TOTAL`].
struct Shown(usize);

impl Shown {
    fn new() -> Shown {
        Shown(MAX_COMMANDS_TOTAL)
    }

    /// The most bytes the next command may show.
    fn cap(&self) -> usize {
        if self.0 >= MAX_COMMAND {
            MAX_COMMAND
        } else {
            SHORT_COMMAND
        }
    }

    fn spend(&mut self, n: usize) {
        self.0 = self.0.saturating_sub(n);
    }
}

/// The command line of `pid` (its arguments joined with spaces), at most `max` bytes of it
/// read; cut at a character with an ellipsis when longer. `[comm]` when it has none.
fn command_of(pid: i32, stat: &Stat, max: usize) -> String {
    let (cmdline, more) = read_capped(&format!("/proc/{pid}/cmdline"), max).unwrap_or_default();
    let mut s = String::with_capacity(cmdline.len() + 3);
    for part in cmdline.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(&String::from_utf8_lossy(part));
    }
    if s.is_empty() {
        return format!("[{}]", stat.comm);
    }
    // Invalid bytes grew into U+FFFD (3 bytes each): cut to `max` again.
    let long = more || s.len() > max;
    if long {
        let mut cut = s.len().min(max);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// The processes of a sandbox, sorted by pid (zombies included, as `zombie`): at most
/// [`MAX_LISTED`], each command line at most [`MAX_COMMAND`] bytes (fewer once the listing
/// showed [`MAX_COMMANDS_TOTAL`]).
pub fn list(sandbox_id: &str) -> Vec<ProcInfo> {
    let snap = snapshot();
    let mut shown = Shown::new();
    members(&snap, sandbox_id)
        .into_iter()
        .filter_map(|pid| {
            let stat = snap.get(&pid)?;
            // Re-read: the state may have changed since the snapshot, and the process may be gone.
            let fresh = read_stat(pid).unwrap_or_else(|| stat.clone());
            let command = command_of(pid, &fresh, shown.cap());
            shown.spend(command.len());
            Some(ProcInfo {
                pid,
                ppid: fresh.ppid,
                command,
                status: status_name(fresh.state).to_owned(),
            })
        })
        .take(MAX_LISTED)
        .collect()
}

/// The processes of a sandbox with its own PID namespace, from (host pid, pid inside)
/// pairs: pids and parent pids as the sandbox sees them (a parent outside the list is the
/// sandbox's init, pid 1). Bounded as [`list`] is.
pub fn list_members(members: &[(i32, i32)]) -> Vec<ProcInfo> {
    let inner: HashMap<i32, i32> = members.iter().copied().collect();
    let mut shown = Shown::new();
    members
        .iter()
        .filter_map(|&(host, pid)| {
            let stat = read_stat(host)?;
            let command = command_of(host, &stat, shown.cap());
            shown.spend(command.len());
            Some(ProcInfo {
                pid,
                ppid: inner.get(&stat.ppid).copied().unwrap_or(1),
                command,
                status: status_name(stat.state).to_owned(),
            })
        })
        .take(MAX_LISTED)
        .collect()
}

fn kill(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) has no memory arguments.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Send `sig` to every process of the sandbox; returns how many were signalled.
pub fn signal_all(sandbox_id: &str, sig: i32) -> usize {
    let snap = snapshot();
    members(&snap, sandbox_id)
        .into_iter()
        .filter(|&pid| kill(pid, sig))
        .count()
}

fn descendants_in(snap: &HashMap<i32, Stat>, pid: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (&p, s) in snap {
        children.entry(s.ppid).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut seen = HashSet::from([pid]);
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if seen.insert(c) {
                out.push(c);
                stack.push(c);
            }
        }
    }
    out.sort_unstable();
    out
}

/// Every descendant of `pid` (children, grandchildren, ...) by `ppid` links, sorted.
pub fn descendants(pid: i32) -> Vec<i32> {
    descendants_in(&snapshot(), pid)
}

/// Signal a process tree: its process group `-pid` (if `pid` leads one), `pid`, and every
/// descendant found. For `SIGKILL` the tree is first frozen with `SIGSTOP` (repeatedly, until
/// no new descendant appears) so nothing can fork away; for `SIGTERM`, `SIGINT`, `SIGHUP` and
/// `SIGQUIT` a `SIGCONT` follows so stopped (paused) processes act on it.
pub fn kill_tree(pid: i32, sig: i32) {
    if pid <= 1 || pid == std::process::id() as i32 {
        return;
    }
    let mut tree: Vec<i32> = Vec::new();
    if sig == libc::SIGKILL {
        let mut stopped: HashSet<i32> = HashSet::new();
        for _ in 0..16 {
            let snap = snapshot();
            let mut fresh = false;
            for p in std::iter::once(pid).chain(descendants_in(&snap, pid)) {
                if stopped.insert(p) {
                    fresh = true;
                    kill(p, libc::SIGSTOP);
                    tree.push(p);
                }
            }
            if !fresh {
                break;
            }
        }
    } else {
        tree.push(pid);
        tree.extend(descendants(pid));
    }
    // SAFETY: getpgid(2) has no memory arguments.
    if unsafe { libc::getpgid(pid) } == pid {
        kill(-pid, sig);
    }
    for &p in &tree {
        kill(p, sig);
    }
    if matches!(
        sig,
        libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT
    ) {
        for &p in &tree {
            kill(p, libc::SIGCONT);
        }
    }
}

/// Whether `pid` is a process of the sandbox (marker in its environment or an ancestor's).
pub fn belongs(pid: i32, sandbox_id: &str) -> bool {
    let me = std::process::id() as i32;
    let mut cur = pid;
    let mut seen = HashSet::new();
    while cur > 1 && cur != me && seen.insert(cur) {
        let Some(stat) = read_stat(cur) else {
            return false;
        };
        if stat.state != 'Z' && has_marker(cur, sandbox_id) {
            return true;
        }
        cur = stat.ppid;
    }
    false
}

/// The sandbox a process belongs to (its own or its nearest ancestor's marker), if any.
/// For a daemon that must refuse clients running inside one of its sandboxes.
pub fn sandbox_of(pid: i32) -> Option<String> {
    let me = std::process::id() as i32;
    let mut cur = pid;
    let mut seen = HashSet::new();
    while cur > 1 && cur != me && seen.insert(cur) {
        let stat = read_stat(cur)?;
        if stat.state != 'Z' {
            if let Some(id) = marker_of(cur) {
                return Some(id);
            }
        }
        cur = stat.ppid;
    }
    None
}

/// The sandbox id a process's environment names, if any (its first 512 bytes: whatever
/// its length, an entry `ABX_SANDBOX_ID=...` is a marker).
fn marker_of(pid: i32) -> Option<String> {
    let mut id = None;
    env_entries(pid, MARKER.len() + 1 + 512, |entry, _| {
        id = entry
            .strip_prefix(MARKER.as_bytes())
            .and_then(|r| r.strip_prefix(b"="))
            .map(|r| String::from_utf8_lossy(r).into_owned());
        id.is_some()
    });
    id
}

#[cfg(test)]
mod tests {
    use super::super::isolate::{Confine, Model};
    use super::super::SandboxDirs;
    use super::*;
    use std::time::{Duration, Instant};

    struct Tree {
        _t: tempfile::TempDir,
        child: std::process::Child,
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            kill_tree(self.child.id() as i32, libc::SIGKILL);
            let _ = self.child.wait();
        }
    }

    fn start(model: Model, id: &str, script: &str) -> Tree {
        let t = tempfile::tempdir().unwrap();
        let dirs = SandboxDirs::new(t.path().join("sb"));
        fs::create_dir_all(&dirs.workspace).unwrap();
        fs::create_dir_all(&dirs.tmp).unwrap();
        let confine = Confine::with_model(model, &dirs, id, "/workspace").unwrap();
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c").arg(script);
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        confine.apply_std(&mut cmd);
        let child = cmd.spawn().unwrap();
        Tree { _t: t, child }
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn statuses(id: &str) -> Vec<(i32, String)> {
        list(id).into_iter().map(|p| (p.pid, p.status)).collect()
    }

    fn tree_lifecycle(model: Model, id: &str) {
        let tree = start(model, id, "sleep 30 & wait");
        let sh = tree.child.id() as i32;
        // The shell and its backgrounded sleep.
        wait_for("sh and sleep listed", || {
            let l = list(id);
            l.iter().any(|p| p.pid == sh)
                && l.iter()
                    .any(|p| p.ppid == sh && p.command.starts_with("sleep 30"))
        });
        let procs = list(id);
        let sleep = procs
            .iter()
            .find(|p| p.ppid == sh && p.command == "sleep 30")
            .expect("the grandchild sleep")
            .pid;
        assert!(procs.windows(2).all(|w| w[0].pid < w[1].pid), "sorted");
        assert!(procs
            .iter()
            .any(|p| p.pid == sh && p.command.starts_with("sh -c")));
        assert!(belongs(sh, id));
        assert!(belongs(sleep, id));
        assert!(!belongs(sh, "another-sandbox"));
        assert!(!belongs(std::process::id() as i32, id));
        assert!(!belongs(1, id));
        assert!(list("another-sandbox-id").iter().all(|p| p.pid != sh));
        assert_eq!(descendants(sh), vec![sleep]);

        // Pause and resume.
        assert_eq!(signal_all(id, libc::SIGSTOP), 2);
        wait_for("stopped", || {
            statuses(id).iter().all(|(_, s)| s == "stopped")
        });
        assert_eq!(signal_all(id, libc::SIGCONT), 2);
        wait_for("resumed", || {
            statuses(id).iter().all(|(_, s)| s == "sleeping")
        });

        // kill_tree takes the grandchild with it.
        kill_tree(sh, libc::SIGKILL);
        // Gone, or a zombie waiting for whoever adopted it.
        let dead = |p: i32| !matches!(read_stat(p), Some(s) if s.state != 'Z');
        wait_for("sleep gone", || dead(sleep));
        assert!(!list(id)
            .iter()
            .any(|p| p.pid == sleep && p.status != "zombie"));
    }

    #[test]
    fn finds_and_signals_a_tree_in_the_landlock_model() {
        tree_lifecycle(Model::Landlock, "procs-ll-1");
    }

    #[test]
    fn finds_and_signals_a_tree_unconfined() {
        tree_lifecycle(Model::Unconfined, "procs-none-1");
    }

    #[test]
    fn zombies_of_members_are_reported() {
        // sh forks a child that exits at once, then sleeps without reaping it (exec).
        let id = "procs-zombie-1";
        let tree = start(Model::Unconfined, id, "sh -c 'exit 0' & exec sleep 30");
        let pid = tree.child.id() as i32;
        wait_for("zombie listed", || {
            list(id)
                .iter()
                .any(|p| p.ppid == pid && p.status == "zombie")
        });
        let z = list(id).into_iter().find(|p| p.status == "zombie").unwrap();
        assert!(z.command.starts_with('['), "{}", z.command);
    }

    #[test]
    fn env_cleared_children_still_belong() {
        let id = "procs-envi-1";
        let tree = start(Model::Unconfined, id, "env -i sleep 30 & wait");
        let sh = tree.child.id() as i32;
        wait_for("env -i sleep listed", || {
            list(id)
                .iter()
                .any(|p| p.ppid == sh && p.command == "sleep 30")
        });
        let sleep = list(id)
            .into_iter()
            .find(|p| p.command == "sleep 30")
            .unwrap()
            .pid;
        assert!(belongs(sleep, id));
        assert!(!has_marker(sleep, id));
        assert_eq!(sandbox_of(sleep).as_deref(), Some(id));
        assert_eq!(sandbox_of(std::process::id() as i32), None);
    }

    #[test]
    fn huge_command_lines_and_environments_are_read_in_bounded_pieces() {
        // 10 arguments of 128,000 bytes (1.3 MB), and a marker behind 0.5 MB of
        // environment: the listing shows 4 KiB of the command, cut with an ellipsis, and
        // the marker is still found (the environment is scanned, never held whole).
        let id = "procs-huge-1";
        let mut script = String::from("exec env -i");
        for i in 0..4 {
            script.push_str(&format!(" PAD{i}=$(head -c 128000 /dev/zero | tr '\\0' p)"));
        }
        script.push_str(&format!(" {MARKER}={id} sh -c 'sleep 30' sh"));
        for _ in 0..10 {
            script.push_str(" $(head -c 128000 /dev/zero | tr '\\0' a)");
        }
        let tree = start(Model::Unconfined, id, &script);
        let pid = tree.child.id() as i32;
        wait_for("the sleep listed", || {
            list(id).iter().any(|p| p.command == "sleep 30")
        });
        let sh = list(id).into_iter().find(|p| p.pid == pid).expect("listed");
        assert!(
            sh.command.starts_with("sh -c sleep 30 sh aaaa"),
            "{}",
            &sh.command[..40]
        );
        assert_eq!(sh.command.len(), MAX_COMMAND + '…'.len_utf8());
        assert!(sh.command.ends_with('…'));
        assert!(has_marker(pid, id));
        assert_eq!(marker_of(pid).as_deref(), Some(id));
        assert!(!has_marker(pid, "procs-huge"));
        // A listing's commands are bounded in all: past the total, each is short.
        let mut shown = Shown::new();
        shown.spend(MAX_COMMANDS_TOTAL - 100);
        let stat = read_stat(pid).unwrap();
        let short = command_of(pid, &stat, shown.cap());
        assert_eq!(short.len(), SHORT_COMMAND + '…'.len_utf8());
    }

    #[test]
    fn a_process_whose_name_is_not_utf8_is_still_seen() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let link = t
            .path()
            .join(std::ffi::OsStr::from_bytes(b"\xff\xfesleeper"));
        std::os::unix::fs::symlink("/bin/sleep", &link).unwrap();
        let mut child = std::process::Command::new(&link).arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let stat = read_stat(pid);
        let _ = child.kill();
        let _ = child.wait();
        let stat = stat.expect("its stat is read");
        assert!(stat.comm.contains("sleeper"), "{}", stat.comm);
    }

    #[test]
    fn stat_parsing_handles_odd_comms() {
        let me = std::process::id() as i32;
        let s = read_stat(me).unwrap();
        assert!("RS".contains(s.state), "{}", s.state);
        assert!(s.ppid > 0);
        assert!(!s.comm.is_empty());
        assert_eq!(status_name('Z'), "zombie");
        assert_eq!(status_name('T'), "stopped");
    }
}
