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

fn read_stat(pid: i32) -> Option<Stat> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
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

/// Whether the environment of `pid` holds exactly `ABX_SANDBOX_ID=<sandbox_id>`.
fn has_marker(pid: i32, sandbox_id: &str) -> bool {
    let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let want_len = MARKER.len() + 1 + sandbox_id.len();
    env.split(|b| *b == 0).any(|entry| {
        entry.len() == want_len
            && entry.starts_with(MARKER.as_bytes())
            && entry[MARKER.len()] == b'='
            && &entry[MARKER.len() + 1..] == sandbox_id.as_bytes()
    })
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

fn command_of(pid: i32, stat: &Stat) -> String {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let parts: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    if parts.is_empty() {
        format!("[{}]", stat.comm)
    } else {
        parts.join(" ")
    }
}

/// The processes of a sandbox, sorted by pid (zombies included, as `zombie`).
pub fn list(sandbox_id: &str) -> Vec<ProcInfo> {
    let snap = snapshot();
    members(&snap, sandbox_id)
        .into_iter()
        .filter_map(|pid| {
            let stat = snap.get(&pid)?;
            // Re-read: the state may have changed since the snapshot, and the process may be gone.
            let fresh = read_stat(pid).unwrap_or_else(|| stat.clone());
            Some(ProcInfo {
                pid,
                ppid: fresh.ppid,
                command: command_of(pid, &fresh),
                status: status_name(fresh.state).to_owned(),
            })
        })
        .collect()
}

/// The processes of a sandbox with its own PID namespace, from (host pid, pid inside)
/// pairs: pids and parent pids as the sandbox sees them (a parent outside the list is the
/// sandbox's init, pid 1).
pub fn list_members(members: &[(i32, i32)]) -> Vec<ProcInfo> {
    let inner: HashMap<i32, i32> = members.iter().copied().collect();
    members
        .iter()
        .filter_map(|&(host, pid)| {
            let stat = read_stat(host)?;
            Some(ProcInfo {
                pid,
                ppid: inner.get(&stat.ppid).copied().unwrap_or(1),
                command: command_of(host, &stat),
                status: status_name(stat.state).to_owned(),
            })
        })
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

fn marker_of(pid: i32) -> Option<String> {
    let env = fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0).find_map(|entry| {
        let rest = entry.strip_prefix(MARKER.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(rest).into_owned())
    })
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
