//! The engine on hand-built upper dirs: whiteouts as 0/0 character devices (as root) or the
//! `user.overlay.whiteout` xattr (as a user), opaque dirs by xattr.

use super::*;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

struct T {
    _dir: tempfile::TempDir,
    root: PathBuf,
    upper: PathBuf,
    lower: PathBuf,
    state: PathBuf,
}

impl T {
    fn new() -> T {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let (upper, lower, state) = (root.join("upper"), root.join("lower"), root.join("state"));
        for d in [&upper, &lower, &state] {
            fs::create_dir_all(d).unwrap();
        }
        T {
            _dir: dir,
            root,
            upper,
            lower,
            state,
        }
    }

    /// Layers made "at create" now (host changes before this call are not conflicts).
    fn layers(&self) -> Layers {
        let st = fs::metadata(&self.lower).unwrap();
        Layers {
            upper: self.upper.clone(),
            source: self.lower.clone(),
            source_id: Some((st.dev(), st.ino())),
            target: "/workspace".into(),
            created_ns: now_ns(),
            owner: None,
            state: self.state.clone(),
            upper_owner: None,
        }
    }

    fn lower(&self, rel: &str, content: &str) {
        write(&self.lower.join(rel), content);
    }

    fn upper(&self, rel: &str, content: &str) {
        write(&self.upper.join(rel), content);
    }
}

fn now_ns() -> i128 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    d.as_nanos() as i128
}

fn write(p: &Path, content: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

fn root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

fn cpath(p: &Path) -> CString {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// A whiteout at `p`: a 0/0 character device (allowed to any user since Linux 5.8), else the
/// xattr form.
fn whiteout(p: &Path) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    let c = cpath(p);
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, 0) } != 0 {
        fs::write(p, "").unwrap();
        let r = unsafe {
            libc::lsetxattr(
                c.as_ptr(),
                c"user.overlay.whiteout".as_ptr(),
                b"y".as_ptr().cast(),
                1,
                0,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
    }
}

fn opaque(p: &Path) {
    fs::create_dir_all(p).unwrap();
    let c = cpath(p);
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            c"user.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!(r, 0, "{}", io::Error::last_os_error());
}

fn all() -> Selection {
    Selection::default()
}

fn only(paths: &[&str]) -> Selection {
    Selection {
        include: Some(paths.iter().map(|p| p.as_bytes().to_vec()).collect()),
        exclude: Vec::new(),
    }
}

fn diff_of(l: &Layers, sel: &Selection, patch: bool) -> Vec<Change> {
    let mut budget = MAX_PATCH_TOTAL;
    diff(l, sel, patch, &mut budget).unwrap().0
}

/// `path change` lines.
fn summary(l: &Layers, sel: &Selection) -> Vec<String> {
    diff_of(l, sel, false)
        .into_iter()
        .map(|c| format!("{} {:?} {}", c.path, c.change, c.kind))
        .collect()
}

fn apply_of(l: &Layers, sel: &Selection, dry: bool, force: bool) -> ApplyResult {
    let mut r = ApplyResult::default();
    apply(l, sel, dry, force, &mut r).unwrap();
    r
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn every_change_kind_and_copies_up_that_change_nothing() {
    let t = T::new();
    t.lower("same.txt", "same\n");
    t.lower("mod.txt", "one\n");
    t.lower("gone.txt", "bye\n");
    t.lower("chmod.sh", "#!/bin/sh\n");
    t.lower("f2d", "a file\n");
    t.lower("dir/keep.txt", "k\n");
    let l = t.layers();
    // Copied up, unchanged (open for writing, touch): no change.
    t.upper("same.txt", "same\n");
    t.upper("mod.txt", "two\n");
    whiteout(&t.upper.join("gone.txt"));
    t.upper("chmod.sh", "#!/bin/sh\n");
    fs::set_permissions(t.upper.join("chmod.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    t.upper("f2d/inside", "x\n");
    t.upper("new/deep/file.txt", "new\n");
    // An unchanged directory copied up (it holds a change): not listed itself.
    t.upper("dir/added.txt", "a\n");
    fs::set_permissions(t.lower.join("chmod.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(
        summary(&l, &all()),
        [
            "/workspace/chmod.sh ModeChanged file",
            "/workspace/dir/added.txt Added file",
            "/workspace/f2d TypeChanged directory",
            "/workspace/f2d/inside Added file",
            "/workspace/gone.txt Deleted file",
            "/workspace/mod.txt Modified file",
            "/workspace/new Added directory",
            "/workspace/new/deep Added directory",
            "/workspace/new/deep/file.txt Added file",
        ]
    );
    let c = diff_of(&l, &only(&["mod.txt"]), false);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].size, c[0].binary, c[0].mode), (4, false, Some(0o644)));
    let c = diff_of(&l, &only(&["gone.txt"]), false);
    assert_eq!((c[0].size, c[0].mode), (0, None));
    // A selected directory selects what is beneath it; the path above is walked, not listed.
    assert_eq!(
        summary(&l, &only(&["new/deep"])),
        [
            "/workspace/new/deep Added directory",
            "/workspace/new/deep/file.txt Added file"
        ]
    );
    // Excluded (a nested mount): nothing from there.
    let sel = Selection {
        include: None,
        exclude: vec![b"new".to_vec(), b"f2d".to_vec()],
    };
    assert_eq!(summary(&l, &sel).len(), 4);
}

#[test]
fn same_size_other_bytes_is_modified_and_a_whiteout_over_nothing_is_no_change() {
    let t = T::new();
    t.lower("a", "abcdef");
    let l = t.layers();
    t.upper("a", "abcdeg");
    whiteout(&t.upper.join("never-there"));
    assert_eq!(summary(&l, &all()), ["/workspace/a Modified file"]);
}

#[test]
fn opaque_dirs_delete_what_they_hide_all_the_way_down() {
    let t = T::new();
    t.lower("d/a", "a\n");
    t.lower("d/b", "b\n");
    t.lower("d/sub/x", "x\n");
    t.lower("d/sub/y", "y\n");
    let l = t.layers();
    // rm -rf d; mkdir -p d/sub; echo b > d/b; echo z > d/sub/z
    opaque(&t.upper.join("d"));
    t.upper("d/b", "b\n");
    t.upper("d/sub/z", "z\n"); // d/sub is not marked: its parent hides the host's
    assert_eq!(
        summary(&l, &all()),
        [
            "/workspace/d/a Deleted file",
            "/workspace/d/sub/x Deleted file",
            "/workspace/d/sub/y Deleted file",
            "/workspace/d/sub/z Added file",
        ]
    );
    // Apply makes the host what the sandbox sees; nothing is left to diff.
    let r = apply_of(&l, &all(), false, false);
    assert_eq!(r.applied.len(), 4, "{r:?}");
    assert!(!t.lower.join("d/a").exists() && !t.lower.join("d/sub/x").exists());
    assert_eq!(fs::read_to_string(t.lower.join("d/sub/z")).unwrap(), "z\n");
    assert!(summary(&l, &all()).is_empty());
}

#[test]
fn a_whole_directory_deleted_is_one_entry_and_apply_removes_it_beneath_the_source_only() {
    let t = T::new();
    t.lower("tree/a/b/c", "c\n");
    t.lower("tree/top", "t\n");
    let outside = t.root.join("outside");
    write(&outside.join("keep"), "keep\n");
    symlink(&outside, t.lower.join("tree/a/link")).unwrap();
    let l = t.layers();
    whiteout(&t.upper.join("tree"));
    assert_eq!(summary(&l, &all()), ["/workspace/tree Deleted directory"]);
    let r = apply_of(&l, &all(), false, false);
    assert_eq!(r.applied, ["/workspace/tree"]);
    assert!(!t.lower.join("tree").exists());
    assert_eq!(fs::read_to_string(outside.join("keep")).unwrap(), "keep\n");
}

#[test]
fn binary_is_a_nul_or_bytes_not_utf8_in_the_first_8_kib() {
    assert!(!is_binary(b"plain text\n"));
    assert!(is_binary(b"a\0b"));
    assert!(is_binary(b"\xff\xfe"));
    assert!(!is_binary("h\u{e9}llo".as_bytes()));
    // A character cut by the 8 KiB boundary is not binary.
    let mut b = vec![b'a'; BINARY_SNIFF - 1];
    b.extend_from_slice("\u{e9}".as_bytes());
    assert!(!is_binary(&b[..BINARY_SNIFF]));
    let t = T::new();
    let l = t.layers();
    fs::write(t.upper.join("bin"), b"\x7fELF\0\0\x01").unwrap();
    let mut late = vec![b'x'; BINARY_SNIFF];
    late.push(0);
    fs::write(t.upper.join("late-nul"), &late).unwrap();
    let c = diff_of(&l, &all(), true);
    assert_eq!(c[0].path, "/workspace/bin");
    assert!(c[0].binary && c[0].patch.is_none());
    assert!(!c[1].binary, "a NUL after 8 KiB is not looked at");
}

#[test]
fn patches_are_unified_diffs_of_text_entries() {
    let t = T::new();
    let old: String = (1..=20).map(|i| format!("line {i}\n")).collect();
    t.lower("f.txt", &old);
    t.lower("del.txt", "x\ny\n");
    let l = t.layers();
    let new = old
        .replace("line 3\n", "line three\n")
        .replace("line 18\n", "")
        + "tail";
    t.upper("f.txt", &new);
    t.upper("add.txt", "hello\n");
    whiteout(&t.upper.join("del.txt"));
    let c = diff_of(&l, &all(), true);
    let p = |path: &str| {
        c.iter()
            .find(|c| c.path == path)
            .and_then(|c| c.patch.clone())
            .unwrap()
    };
    assert_eq!(
        p("/workspace/f.txt"),
        "--- a/f.txt\n+++ b/f.txt\n@@ -1,6 +1,6 @@\n line 1\n line 2\n-line 3\n+line three\n \
         line 4\n line 5\n line 6\n@@ -15,6 +15,6 @@\n line 15\n line 16\n line 17\n-line 18\n \
         line 19\n line 20\n+tail\n\\ No newline at end of file\n"
    );
    assert_eq!(
        p("/workspace/add.txt"),
        "--- /dev/null\n+++ b/add.txt\n@@ -0,0 +1 @@\n+hello\n"
    );
    assert_eq!(
        p("/workspace/del.txt"),
        "--- a/del.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x\n-y\n"
    );
    // Without format patch: no patch.
    assert!(diff_of(&l, &all(), false).iter().all(|c| c.patch.is_none()));
}

#[test]
fn patches_are_capped() {
    let t = T::new();
    // More than 8 MiB on a side: a note, not a patch.
    let big = "0123456789abcdef\n".repeat((MAX_PATCH_INPUT as usize / 17) + 10);
    t.lower("big.txt", &big);
    let l = t.layers();
    t.upper("big.txt", &(big.clone() + "more\n"));
    // 2 MiB of changed lines: cut at 1 MiB with a last line saying so.
    let many: String = (0..120_000).map(|i| format!("old line {i}\n")).collect();
    t.lower("many.txt", &many);
    t.upper("many.txt", &many.replace("old", "new"));
    let c = diff_of(&l, &all(), true);
    let big_p = c[0].patch.as_ref().unwrap();
    assert!(
        big_p.starts_with("\\ abx: not shown: a side is larger than 8 MiB"),
        "{big_p}"
    );
    let p = c[1].patch.as_ref().unwrap();
    assert!(p.len() <= MAX_PATCH + 100, "{}", p.len());
    assert!(p.ends_with("\\ abx: patch cut at 1 MiB\n"));
    // The answer's patches share a budget: past it, a note.
    let mut budget = 10;
    let (c, _) = diff(&l, &all(), true, &mut budget).unwrap();
    assert!(c[1].patch.as_ref().unwrap().contains("passed 16 MiB"));
}

/// Apply a unified diff (as `unified` writes it) to `a`.
fn patch_apply(a: &str, patch: &str) -> String {
    let old: Vec<&str> = a.split_inclusive('\n').collect();
    let mut out = String::new();
    let mut i = 0usize;
    let mut lines = patch.split_inclusive('\n').skip(2).peekable();
    while let Some(h) = lines.next() {
        assert!(h.starts_with("@@ -"), "{h}");
        let spec = h[4..].split(' ').next().unwrap();
        let mut it = spec.split(',');
        let start: usize = it.next().unwrap().parse().unwrap();
        let len: usize = it.next().map_or(1, |n| n.parse().unwrap());
        let start = if len == 0 { start } else { start - 1 };
        while i < start {
            out.push_str(old[i]);
            i += 1;
        }
        while let Some(l) = lines.peek() {
            if l.starts_with("@@") {
                break;
            }
            let l = lines.next().unwrap();
            let no_nl = lines.peek().is_some_and(|n| n.starts_with("\\ No newline"));
            let body = if no_nl { l.trim_end_matches('\n') } else { l };
            if no_nl {
                lines.next();
            }
            match &l[..1] {
                " " => {
                    out.push_str(&body[1..]);
                    i += 1;
                }
                "-" => i += 1,
                "+" => out.push_str(&body[1..]),
                _ => panic!("{l}"),
            }
        }
    }
    while i < old.len() {
        out.push_str(old[i]);
        i += 1;
    }
    out
}

#[test]
fn the_line_diff_turns_a_into_b() {
    // A small pseudo-random generator: many shapes of edits over a small alphabet.
    let mut seed = 0x2545f4914f6cdd1du64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..300 {
        let la = rnd(40) as usize;
        let lb = rnd(40) as usize;
        let a: String = (0..la).map(|_| format!("{}\n", rnd(6))).collect();
        let mut b: String = (0..lb).map(|_| format!("{}\n", rnd(6))).collect();
        if round % 7 == 0 {
            b.push_str("no newline");
        }
        let p = unified("a/x", "b/x", a.as_bytes(), b.as_bytes());
        assert_eq!(patch_apply(&a, &p), b, "round {round}\n{a:?}\n{b:?}\n{p}");
    }
    assert_eq!(
        unified("a/x", "b/x", b"same\n", b"same\n"),
        "--- a/x\n+++ b/x\n"
    );
}

#[test]
fn the_line_diff_gives_up_politely_on_huge_edits() {
    // Two unrelated 200,000-line texts: the budget runs out, the rest shows as replaced, and
    // the patch is still correct (and cut).
    let a: String = (0..100_000).map(|i| format!("{}\n", i * 2)).collect();
    let b: String = (0..100_000).map(|i| format!("{}\n", i * 2 + 1)).collect();
    let t0 = std::time::Instant::now();
    let p = unified("a/x", "b/x", a.as_bytes(), b.as_bytes());
    assert!(t0.elapsed() < std::time::Duration::from_secs(30));
    assert!(p.ends_with("cut at 1 MiB\n"));
}

#[test]
fn symlinks_are_listed_never_followed_and_leaving_ones_are_explicit_only() {
    let t = T::new();
    let outside = t.root.join("outside");
    write(&outside.join("secret"), "secret\n");
    t.lower("target.txt", "t\n");
    let l = t.layers();
    symlink("target.txt", t.upper.join("in")).unwrap();
    symlink("sub/../target.txt", t.upper.join("in2")).unwrap();
    symlink("../outside/secret", t.upper.join("out")).unwrap();
    symlink("/etc/passwd", t.upper.join("abs")).unwrap();
    // A symlink to a directory outside: never walked into.
    symlink(&outside, t.upper.join("dirlink")).unwrap();
    let c = diff_of(&l, &all(), true);
    let got: Vec<_> = c
        .iter()
        .map(|c| {
            (
                c.path.as_str(),
                c.kind.as_str(),
                c.symlink_target.as_deref().unwrap(),
                c.explicit_only,
            )
        })
        .collect();
    let o = outside.display().to_string();
    assert_eq!(
        got,
        [
            ("/workspace/abs", "symlink", "/etc/passwd", true),
            ("/workspace/dirlink", "symlink", o.as_str(), true),
            ("/workspace/in", "symlink", "target.txt", false),
            ("/workspace/in2", "symlink", "sub/../target.txt", false),
            ("/workspace/out", "symlink", "../outside/secret", true),
        ]
    );
    assert!(c.iter().all(|c| c.patch.is_none()));
    assert!(leaves(b"a/b/l", b"../../../x") && !leaves(b"a/b/l", b"../../x"));
    // Apply: the inside ones; the leaving ones only when named.
    let r = apply_of(&l, &all(), false, false);
    assert_eq!(r.applied, ["/workspace/in", "/workspace/in2"]);
    assert_eq!(r.skipped.len(), 3, "{r:?}");
    assert!(r.skipped[0].reason.contains("named"), "{r:?}");
    assert_eq!(
        fs::read_link(t.lower.join("in")).unwrap(),
        Path::new("target.txt")
    );
    let r = apply_of(&l, &only(&["out"]), false, false);
    assert_eq!(r.applied, ["/workspace/out"]);
    assert_eq!(
        fs::read_link(t.lower.join("out")).unwrap(),
        Path::new("../outside/secret")
    );
    assert_eq!(
        fs::read_to_string(outside.join("secret")).unwrap(),
        "secret\n"
    );
}

#[test]
fn apply_never_writes_through_a_host_symlink() {
    let t = T::new();
    let outside = t.root.join("outside");
    write(&outside.join("victim"), "victim\n");
    // The host has a symlink `d` to a directory outside; the sandbox made `d` a directory.
    symlink(&outside, t.lower.join("d")).unwrap();
    symlink(outside.join("victim"), t.lower.join("f")).unwrap();
    let l = t.layers();
    t.upper("d/victim", "pwned\n");
    t.upper("f", "pwned\n");
    // Only the file beneath: its host directory is a symlink, never followed.
    let r = apply_of(&l, &only(&["d/victim"]), false, true);
    assert!(r.applied.is_empty(), "{r:?}");
    assert!(r.skipped[0].reason.contains("symlink"), "{r:?}");
    assert_eq!(
        fs::read_to_string(outside.join("victim")).unwrap(),
        "victim\n"
    );
    // The whole change: the symlinks are replaced, the files outside untouched.
    let r = apply_of(&l, &all(), false, true);
    assert_eq!(r.applied.len(), 3, "{r:?}");
    assert!(fs::symlink_metadata(t.lower.join("d")).unwrap().is_dir());
    assert!(fs::symlink_metadata(t.lower.join("f")).unwrap().is_file());
    assert_eq!(fs::read_to_string(t.lower.join("f")).unwrap(), "pwned\n");
    assert_eq!(
        fs::read_to_string(outside.join("victim")).unwrap(),
        "victim\n"
    );
}

#[test]
fn dot_dot_and_paths_outside_the_mount_are_refused() {
    assert_eq!(
        rel_in("/workspace", "/workspace/a/b").unwrap(),
        Some(b"a/b".to_vec())
    );
    assert_eq!(
        rel_in("/workspace", "/workspace//a/./b/").unwrap(),
        Some(b"a/b".to_vec())
    );
    assert_eq!(
        rel_in("/workspace", "/workspace").unwrap(),
        Some(Vec::new())
    );
    assert_eq!(rel_in("/workspace/p", "/workspace/a").unwrap(), None);
    assert_eq!(rel_in("/workspace", "/workspacex/a").unwrap(), None);
    for bad in [
        "/workspace/../etc/passwd",
        "/workspace/a/../../x",
        "relative",
        "/workspace/\0",
    ] {
        assert_eq!(
            rel_in("/workspace", bad).unwrap_err().code,
            ErrorCode::PathOutsideSandbox,
            "{bad}"
        );
    }
}

#[test]
fn setuid_setgid_and_sticky_never_reach_the_host() {
    let t = T::new();
    let l = t.layers();
    t.upper("suid", "#!/bin/sh\n");
    fs::set_permissions(t.upper.join("suid"), fs::Permissions::from_mode(0o6755)).unwrap();
    fs::create_dir(t.upper.join("sticky")).unwrap();
    fs::set_permissions(t.upper.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    let c = diff_of(&l, &only(&["suid"]), false);
    assert_eq!(
        c[0].mode,
        Some(0o6755),
        "the reviewer sees the bits asked for"
    );
    let r = apply_of(&l, &all(), false, false);
    assert_eq!(r.applied.len(), 2);
    assert_eq!(mode(&t.lower.join("suid")), 0o755);
    assert_eq!(mode(&t.lower.join("sticky")), 0o777);
    // The host now has what can be applied: no change left.
    assert!(summary(&l, &all()).is_empty());
}

#[test]
fn device_nodes_fifos_and_sockets_are_skipped() {
    let t = T::new();
    let l = t.layers();
    let c = cpath(&t.upper.join("fifo"));
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let _sock = std::os::unix::net::UnixListener::bind(t.upper.join("sock")).unwrap();
    if root() {
        let c = cpath(&t.upper.join("null"));
        let dev = libc::makedev(1, 3);
        assert_eq!(
            unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, dev) },
            0
        );
    }
    let n = if root() { 3 } else { 2 };
    let c = diff_of(&l, &all(), false);
    assert_eq!(c.len(), n);
    assert!(c.iter().all(|c| c.kind == "other"));
    let r = apply_of(&l, &all(), false, true);
    assert!(r.applied.is_empty());
    assert_eq!(r.skipped.len(), n);
    assert!(r.skipped.iter().all(|s| s.reason.contains("never applied")));
    assert_eq!(fs::read_dir(&t.lower).unwrap().count(), 0);
}

#[test]
fn a_hard_link_to_a_file_outside_the_tree_is_replaced_never_written() {
    let t = T::new();
    let outside = t.root.join("outside-file");
    fs::write(&outside, "outside\n").unwrap();
    fs::hard_link(&outside, t.lower.join("hl")).unwrap();
    let l = t.layers();
    t.upper("hl", "from the sandbox\n");
    fs::set_permissions(t.upper.join("hl"), fs::Permissions::from_mode(0o600)).unwrap();
    // force: the link's ctime moved when it was made (after "create" above? no: before).
    let r = apply_of(&l, &all(), false, false);
    assert_eq!(r.applied, ["/workspace/hl"], "{r:?}");
    assert_eq!(fs::read_to_string(&outside).unwrap(), "outside\n");
    assert_eq!(mode(&outside), 0o644);
    assert_eq!(
        fs::read_to_string(t.lower.join("hl")).unwrap(),
        "from the sandbox\n"
    );
    assert_ne!(
        fs::metadata(&outside).unwrap().ino(),
        fs::metadata(t.lower.join("hl")).unwrap().ino()
    );
    // A mode-only change goes through a new file too (no chmod of the shared inode).
    let t = T::new();
    let outside = t.root.join("outside-file");
    fs::write(&outside, "same\n").unwrap();
    fs::hard_link(&outside, t.lower.join("hl")).unwrap();
    let l = t.layers();
    t.upper("hl", "same\n");
    fs::set_permissions(t.upper.join("hl"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(summary(&l, &all()), ["/workspace/hl ModeChanged file"]);
    apply_of(&l, &all(), false, false);
    assert_eq!(mode(&outside), 0o644);
    assert_eq!(mode(&t.lower.join("hl")), 0o700);
}

fn settle() {
    // The kernel's file times are coarse (a tick): what happens after create must be later.
    std::thread::sleep(std::time::Duration::from_millis(30));
}

#[test]
fn host_changes_after_create_are_conflicts_unless_forced_and_the_rest_still_applies() {
    let t = T::new();
    t.lower("a.txt", "a\n");
    t.lower("b.txt", "b\n");
    t.lower("gone.txt", "g\n");
    t.lower("deleted-here.txt", "d\n");
    t.lower("copied.txt", "c\n");
    let l = t.layers();
    settle();
    t.upper("a.txt", "sandbox a\n");
    t.upper("b.txt", "sandbox b\n");
    whiteout(&t.upper.join("deleted-here.txt"));
    t.upper("copied.txt", "sandbox c\n");
    // The copy-up mark overlayfs leaves (an empty origin: a lower fs without file handles).
    let c = cpath(&t.upper.join("copied.txt"));
    unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            c"user.overlay.origin".as_ptr(),
            b"".as_ptr().cast(),
            0,
            0,
        )
    };
    t.upper("new.txt", "new\n");
    // The host changes a.txt, touches deleted-here.txt, removes copied.txt.
    t.lower("a.txt", "host a\n");
    fs::set_permissions(
        t.lower.join("deleted-here.txt"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    fs::remove_file(t.lower.join("copied.txt")).unwrap();
    let r = apply_of(&l, &all(), true, false);
    let conflicts: Vec<_> = r.conflicts.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        conflicts,
        [
            "/workspace/a.txt",
            "/workspace/copied.txt",
            "/workspace/deleted-here.txt"
        ]
    );
    assert!(
        r.conflicts[1].reason.contains("removed on the host"),
        "{r:?}"
    );
    assert_eq!(r.applied, ["/workspace/b.txt", "/workspace/new.txt"]);
    // The dry run changed nothing.
    assert_eq!(fs::read_to_string(t.lower.join("b.txt")).unwrap(), "b\n");
    assert!(!t.lower.join("new.txt").exists());
    let r = apply_of(&l, &all(), false, false);
    assert_eq!(r.conflicts.len(), 3);
    assert_eq!(
        fs::read_to_string(t.lower.join("b.txt")).unwrap(),
        "sandbox b\n"
    );
    assert_eq!(
        fs::read_to_string(t.lower.join("a.txt")).unwrap(),
        "host a\n"
    );
    // Force: the sandbox's version wins.
    let r = apply_of(&l, &only(&["a.txt", "deleted-here.txt"]), false, true);
    assert_eq!(
        r.applied,
        ["/workspace/a.txt", "/workspace/deleted-here.txt"]
    );
    assert!(r.conflicts.is_empty());
    assert_eq!(
        fs::read_to_string(t.lower.join("a.txt")).unwrap(),
        "sandbox a\n"
    );
    assert!(!t.lower.join("deleted-here.txt").exists());
}

#[test]
fn applied_paths_leave_the_diff_and_applying_them_again_is_no_conflict() {
    let t = T::new();
    t.lower("a.txt", "a\n");
    let l = t.layers();
    settle();
    t.upper("a.txt", "v1\n");
    t.upper("dir/n.txt", "n\n");
    let r = apply_of(&l, &all(), false, false);
    assert_eq!(r.applied.len(), 3, "{r:?}");
    assert!(summary(&l, &all()).is_empty());
    assert!(t.state.join("applied.json").exists());
    // The sandbox changes them again: the host's ctime is after create, but apply wrote it.
    settle();
    t.upper("a.txt", "v2\n");
    t.upper("dir/n.txt", "n2\n");
    let r = apply_of(&l, &all(), false, false);
    assert!(r.conflicts.is_empty(), "{r:?}");
    assert_eq!(r.applied, ["/workspace/a.txt", "/workspace/dir/n.txt"]);
    assert_eq!(fs::read_to_string(t.lower.join("a.txt")).unwrap(), "v2\n");
    // Then the host changes it: a conflict again.
    settle();
    t.upper("a.txt", "v3\n");
    t.lower("a.txt", "host\n");
    let r = apply_of(&l, &all(), false, false);
    assert_eq!(r.conflicts.len(), 1, "{r:?}");
    // A path with no change, named: said so.
    let r = apply_of(&l, &only(&["dir/n.txt"]), false, false);
    assert_eq!(r.skipped[0].reason, "no change");
}

#[test]
fn apply_makes_the_directories_above_a_named_file_and_owns_nothing_it_should_not() {
    let t = T::new();
    let l = t.layers();
    t.upper("x/y/z.txt", "z\n");
    fs::set_permissions(t.upper.join("x"), fs::Permissions::from_mode(0o750)).unwrap();
    let r = apply_of(&l, &only(&["x/y/z.txt"]), true, false);
    assert_eq!(r.applied, ["/workspace/x/y/z.txt"]);
    assert!(!t.lower.join("x").exists());
    let r = apply_of(&l, &only(&["x/y/z.txt"]), false, false);
    assert_eq!(r.applied, ["/workspace/x/y/z.txt"]);
    assert_eq!(
        fs::read_to_string(t.lower.join("x/y/z.txt")).unwrap(),
        "z\n"
    );
    assert_eq!(mode(&t.lower.join("x")), 0o750);
    assert!(summary(&l, &all()).is_empty());
    // No temporary file left behind.
    let names: Vec<_> = fs::read_dir(t.lower.join("x/y"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn a_source_that_is_another_directory_now_is_refused() {
    let t = T::new();
    let mut l = t.layers();
    l.source_id = Some((1, 1));
    let mut b = MAX_PATCH_TOTAL;
    assert_eq!(
        diff(&l, &all(), false, &mut b).unwrap_err().code,
        ErrorCode::MountRefused
    );
}

#[test]
fn discard_drops_changes_and_the_host_version_shows_again() {
    let t = T::new();
    t.lower("m.txt", "m\n");
    t.lower("d.txt", "d\n");
    t.lower("dir/keep", "k\n");
    t.lower("o/a", "a\n");
    t.lower("o/b", "b\n");
    t.lower("o/s/x", "x\n");
    let l = t.layers();
    t.upper("m.txt", "changed\n");
    whiteout(&t.upper.join("d.txt"));
    t.upper("added/deep.txt", "n\n");
    fs::create_dir(t.upper.join("dir")).unwrap();
    fs::set_permissions(t.upper.join("dir"), fs::Permissions::from_mode(0o700)).unwrap();
    t.upper("dir/new", "new\n");
    // `o` was removed and made again with `b` changed and `s/y` new.
    opaque(&t.upper.join("o"));
    t.upper("o/b", "b2\n");
    t.upper("o/s/y", "y\n");
    assert_eq!(summary(&l, &all()).len(), 10);
    // Discard one path under the opaque dir: the others stay as the sandbox sees them.
    let mut r = DiscardResult::default();
    discard(&l, &only(&["o/a"]), &mut r).unwrap();
    assert_eq!(r.discarded, ["/workspace/o/a"]);
    assert_eq!(
        summary(&l, &only(&["o"])),
        [
            "/workspace/o/b Modified file",
            "/workspace/o/s/x Deleted file",
            "/workspace/o/s/y Added file",
        ]
    );
    // Only the mode of a directory: what is in it stays.
    let mut r = DiscardResult::default();
    discard(&l, &only(&["dir"]), &mut r).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(r.discarded, ["/workspace/dir", "/workspace/dir/new"]);
    let mut r = DiscardResult::default();
    discard(&l, &all(), &mut r).unwrap();
    assert_eq!(r.discarded.len(), 6, "{r:?}");
    assert!(summary(&l, &all()).is_empty(), "{:?}", summary(&l, &all()));
    assert!(!t.upper.join("m.txt").exists());
    assert!(!t.upper.join("added").exists());
}

#[test]
fn too_many_changes_are_cut_and_said_so() {
    let t = T::new();
    let l = t.layers();
    for i in 0..(MAX_ENTRIES + 5) {
        let d = t.upper.join(format!("d{}", i / 10_000));
        if i % 10_000 == 0 {
            fs::create_dir(&d).unwrap();
        }
        fs::write(d.join(format!("{i}")), "").unwrap();
    }
    let mut b = MAX_PATCH_TOTAL;
    let (c, truncated) = diff(&l, &all(), false, &mut b).unwrap();
    assert!(truncated);
    assert_eq!(c.len(), MAX_ENTRIES);
}

#[test]
fn discard_removes_directories_the_sandbox_locked_and_never_follows_a_link() {
    let t = T::new();
    let outside = t.root.join("outside");
    write(&outside.join("keep"), "keep\n");
    let l = t.layers();
    t.upper("added/locked/inner.txt", "x\n");
    symlink(&outside, t.upper.join("added/link")).unwrap();
    fs::set_permissions(
        t.upper.join("added/locked"),
        fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    let mut r = DiscardResult::default();
    discard(&l, &all(), &mut r).unwrap();
    assert_eq!(r.discarded, ["/workspace/added"]);
    assert!(!t.upper.join("added").exists());
    assert_eq!(fs::read_to_string(outside.join("keep")).unwrap(), "keep\n");
}

fn rec(target: &str, mode: abx_protocol::api::MountMode) -> crate::workspace::mounts::MountRecord {
    crate::workspace::mounts::MountRecord {
        source: "/src".into(),
        target: target.into(),
        mode,
        dev: 1,
        ino: 2,
        uid: 3,
        gid: 4,
        created_ns: 5,
    }
}

#[test]
fn target_and_paths_pick_the_overlay_mounts() {
    use abx_protocol::api::MountMode::{Overlay, Ro};
    let mounts = [
        rec("/workspace", Overlay),
        rec("/workspace/proj/", Overlay),
        rec("/workspace/data", Ro),
    ];
    let root = Path::new("/data/local/sandboxes/x");
    let p = |target: Option<&str>, paths: Option<&[&str]>| {
        let paths: Option<Vec<String>> = paths.map(|v| v.iter().map(|s| s.to_string()).collect());
        pick("sandbox/diff", root, &mounts, target, paths.as_deref())
    };
    // Default: every overlay mount, each without what is mounted beneath it.
    let all = p(None, None).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].layers.upper, root.join("mounts/0/upper"));
    assert_eq!(all[0].state, root.join("mounts/0"));
    assert_eq!(all[0].sel.exclude, [b"proj".to_vec(), b"data".to_vec()]);
    assert_eq!(all[1].layers.target, "/workspace/proj");
    assert_eq!(
        (
            all[1].n,
            all[1].layers.owner,
            all[1].layers.source_id,
            all[1].layers.created_ns
        ),
        (1, Some((3, 4)), Some((1, 2)), 5)
    );
    // Paths go to the deepest mount holding them.
    let v = p(
        None,
        Some(&["/workspace/a", "/workspace/proj/b/c", "/workspace/proj"]),
    )
    .unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].sel.include, Some(vec![b"a".to_vec()]));
    assert_eq!(v[1].sel.include, Some(vec![b"b/c".to_vec(), Vec::new()]));
    // `target` picks one; a path of another mount is then outside it.
    let v = p(Some("/workspace/proj"), None).unwrap();
    assert_eq!((v.len(), v[0].n), (1, 1));
    let code = |r: Result<Vec<Picked>, AbxError>| r.err().map(|e| e.code);
    assert_eq!(
        code(p(Some("/workspace/proj"), Some(&["/workspace/a"]))),
        Some(ErrorCode::PathOutsideSandbox)
    );
    assert_eq!(
        code(p(Some("/workspace/data"), None)),
        Some(ErrorCode::InvalidParams)
    );
    assert_eq!(
        code(p(Some("/nowhere"), None)),
        Some(ErrorCode::InvalidParams)
    );
    assert_eq!(
        code(p(None, Some(&["/workspace/data/x"]))),
        Some(ErrorCode::InvalidParams)
    );
    for bad in ["/etc/passwd", "/workspace/../etc", "workspace/a"] {
        assert_eq!(
            code(p(None, Some(&[bad]))),
            Some(ErrorCode::PathOutsideSandbox),
            "{bad}"
        );
    }
}
