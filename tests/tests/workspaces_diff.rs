//! `sandbox/diff`, `sandbox/apply`, `sandbox/discard` end to end (issue 43): a real daemon,
//! a real sandbox with an overlay mount of a host directory, changes made by commands in it.
//! The engine's own cases are unit tests (broker/local/src/workspace/changes_tests.rs); the
//! large forms (1,000,000 files, 10 GiB) are in `scripts/bench workspace`.

use abx_tests::{abx_code, Client, Home};
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A host project: a git checkout made in a temp dir, readable by the daemon's user.
fn project() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("abx-proj")
        .tempdir()
        .unwrap();
    let p = dir.path();
    fs::write(p.join("a.txt"), "alpha\nbeta\ngamma\n").unwrap();
    fs::write(p.join("b.txt"), "bee\n").unwrap();
    fs::write(p.join("run.sh"), "#!/bin/sh\necho run\n").unwrap();
    fs::create_dir_all(p.join("src/deep")).unwrap();
    fs::write(p.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
    fs::write(p.join("src/deep/x.txt"), "x\n").unwrap();
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .args(args)
            .current_dir(p)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-qm", "init"]);
    dir
}

fn setup(source: &Path) -> (Home, Client, String) {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let id = c.create(json!({
        "mounts": [{"source": source.to_str().unwrap(), "target": "/workspace/proj"}],
        "timeout": 600,
    }));
    (home, c, id)
}

fn sh_ok(c: &mut Client, id: &str, cmd: &str) -> String {
    let r = c.sh(id, cmd);
    assert_eq!(r["exitCode"], 0, "{cmd}: {r}");
    r["stdout"].as_str().unwrap_or_default().to_owned()
}

/// `path change` of each entry.
fn listed(c: &mut Client, params: Value) -> Vec<String> {
    let r = c.call("sandbox/diff", params);
    r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["path"].as_str().unwrap(),
                e["change"].as_str().unwrap()
            )
        })
        .collect()
}

fn paths(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e.as_str()
                .map_or_else(|| e["path"].as_str().unwrap().to_owned(), str::to_owned)
        })
        .collect()
}

/// Waits until the file system's clock (a new file's ctime, which the kernel takes from its
/// coarse clock) has moved past what it said before the call: a host change made after this
/// has a ctime later than the sandbox's creation, whatever the clock's tick.
fn settle() {
    let d = tempfile::tempdir().unwrap();
    let ctime = |n: u32| {
        let f = d.path().join(n.to_string());
        fs::write(&f, "").unwrap();
        let m = fs::metadata(&f).unwrap();
        (m.ctime(), m.ctime_nsec())
    };
    let before = ctime(0);
    let mut n = 1;
    while ctime(n) <= before {
        n += 1;
        std::thread::yield_now();
    }
}

#[test]
fn review_apply_conflict_force_discard() {
    let proj = project();
    let p = proj.path().to_path_buf();
    let (home, mut c, id) = setup(&p);
    settle();
    sh_ok(
        &mut c,
        &id,
        "cd /workspace/proj && sed -i s/beta/BETA/ a.txt && echo new > new.txt && rm b.txt \
         && chmod 755 run.sh && mkdir -p made/here && echo m > made/here/m.txt \
         && echo changed > src/deep/x.txt && cat src/lib.rs > /dev/null",
    );
    let all = json!({"sandbox": id});
    assert_eq!(
        listed(&mut c, all.clone()),
        [
            "/workspace/proj/a.txt modified",
            "/workspace/proj/b.txt deleted",
            "/workspace/proj/made added",
            "/workspace/proj/made/here added",
            "/workspace/proj/made/here/m.txt added",
            "/workspace/proj/new.txt added",
            "/workspace/proj/run.sh modeChanged",
            "/workspace/proj/src/deep/x.txt modified",
        ]
    );
    // Nothing on the host changed yet.
    assert_eq!(fs::read_to_string(p.join("b.txt")).unwrap(), "bee\n");
    // The patch of a text entry, and git agrees it is a unified diff of the same change.
    let r = c.call(
        "sandbox/diff",
        json!({"sandbox": id, "paths": ["/workspace/proj/a.txt"], "format": "patch"}),
    );
    let e = &r["changes"][0];
    assert_eq!(e["type"], "file");
    assert_eq!(e["binary"], false);
    assert_eq!(
        e["patch"],
        "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n alpha\n-beta\n+BETA\n gamma\n"
    );
    // `target` names the mount; an unknown one is E1004.
    assert_eq!(
        listed(
            &mut c,
            json!({"sandbox": id, "target": "/workspace/proj", "paths": ["/workspace/proj/src"]})
        ),
        ["/workspace/proj/src/deep/x.txt modified"]
    );
    let err = c.call_err("sandbox/diff", json!({"sandbox": id, "target": "/nowhere"}));
    assert_eq!(abx_code(&err), "E1004");

    // The host changes a.txt and run.sh meanwhile.
    settle();
    fs::write(p.join("a.txt"), "alpha\nbeta\ngamma\nhost line\n").unwrap();
    fs::set_permissions(p.join("run.sh"), fs::Permissions::from_mode(0o700)).unwrap();
    // A dry run says what would happen and changes nothing.
    let r = c.call("sandbox/apply", json!({"sandbox": id, "dryRun": true}));
    assert_eq!(
        paths(&r["conflicts"]),
        ["/workspace/proj/a.txt", "/workspace/proj/run.sh"]
    );
    assert_eq!(paths(&r["applied"]).len(), 6, "{r}");
    assert!(!p.join("new.txt").exists());
    // Apply: the others still go, each file atomically, owned by the source's owner.
    let r = c.call("sandbox/apply", json!({"sandbox": id}));
    assert_eq!(paths(&r["conflicts"]).len(), 2, "{r}");
    assert_eq!(
        paths(&r["applied"]),
        [
            "/workspace/proj/b.txt",
            "/workspace/proj/made",
            "/workspace/proj/made/here",
            "/workspace/proj/made/here/m.txt",
            "/workspace/proj/new.txt",
            "/workspace/proj/src/deep/x.txt",
        ]
    );
    assert!(!p.join("b.txt").exists());
    assert_eq!(fs::read_to_string(p.join("new.txt")).unwrap(), "new\n");
    assert_eq!(
        fs::read_to_string(p.join("made/here/m.txt")).unwrap(),
        "m\n"
    );
    let owner = fs::metadata(&p).unwrap();
    let new = fs::metadata(p.join("new.txt")).unwrap();
    assert_eq!((new.uid(), new.gid()), (owner.uid(), owner.gid()));
    assert_eq!(
        fs::read_to_string(p.join("a.txt")).unwrap(),
        "alpha\nbeta\ngamma\nhost line\n"
    );
    // git sees exactly what was applied.
    let st = Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(&p)
        .output()
        .unwrap();
    let st = String::from_utf8(st.stdout).unwrap();
    assert!(
        st.contains(" D b.txt") && st.contains("?? new.txt") && st.contains(" M src/deep/x.txt"),
        "{st}"
    );
    // Applied paths leave the diff; the conflicts stay.
    assert_eq!(
        listed(&mut c, all.clone()),
        [
            "/workspace/proj/a.txt modified",
            "/workspace/proj/run.sh modeChanged"
        ]
    );
    // Force: the sandbox's version wins.
    let r = c.call(
        "sandbox/apply",
        json!({"sandbox": id, "paths": ["/workspace/proj/run.sh"], "force": true}),
    );
    assert_eq!(paths(&r["applied"]), ["/workspace/proj/run.sh"]);
    assert_eq!(
        fs::metadata(p.join("run.sh")).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    // The sandbox changes an applied file again: no false conflict.
    settle();
    sh_ok(&mut c, &id, "echo again >> /workspace/proj/new.txt");
    let r = c.call(
        "sandbox/apply",
        json!({"sandbox": id, "paths": ["/workspace/proj/new.txt"]}),
    );
    assert_eq!(paths(&r["applied"]), ["/workspace/proj/new.txt"], "{r}");
    assert_eq!(
        fs::read_to_string(p.join("new.txt")).unwrap(),
        "new\nagain\n"
    );

    // Discard: the change leaves the diff at once; the sandbox sees the host's version once
    // its overlay is mounted again (docs/local-sandboxes.md, "A running sandbox and discard":
    // here, its init started again after a daemon restart).
    sh_ok(
        &mut c,
        &id,
        "rm /workspace/proj/src/lib.rs && echo junk > /workspace/proj/junk",
    );
    let r = c.call(
        "sandbox/discard",
        json!({"sandbox": id, "paths": ["/workspace/proj/a.txt"]}),
    );
    assert_eq!(paths(&r["discarded"]), ["/workspace/proj/a.txt"]);
    assert_eq!(
        listed(&mut c, all.clone()),
        [
            "/workspace/proj/junk added",
            "/workspace/proj/src/lib.rs deleted"
        ]
    );
    // Discard everything (a deleted file comes back, an added one goes).
    let r = c.call("sandbox/discard", json!({"sandbox": id}));
    assert_eq!(
        paths(&r["discarded"]),
        ["/workspace/proj/junk", "/workspace/proj/src/lib.rs"]
    );
    assert!(listed(&mut c, all.clone()).is_empty());
    drop(c);
    assert!(home.run(&["broker", "stop"]).status.success());
    home.start();
    let mut c = home.connect();
    assert_eq!(
        sh_ok(
            &mut c,
            &id,
            "cat /workspace/proj/a.txt /workspace/proj/src/lib.rs"
        ),
        "alpha\nbeta\ngamma\nhost line\npub fn f() {}\n"
    );
    assert_eq!(c.sh(&id, "test -e /workspace/proj/junk")["exitCode"], 1);
}

/// What a running sandbox sees right after a discard: overlayfs keeps serving the dropped
/// entries it looked up before, so the sandbox's init mounts the overlay again (a new overlay
/// of the same layers beneath the old one, the old one detached). A process whose working
/// directory is inside keeps the old (detached) one until it changes directory, and keeps
/// running (under Landlock a path relative to it is refused: its `ls` may fail); a file it
/// holds open stays readable; `cd "$PWD"` gives the new view.
#[test]
fn a_running_sandbox_sees_a_discard_at_once() {
    let proj = project();
    let (_home, mut c, id) = setup(proj.path());
    sh_ok(
        &mut c,
        &id,
        "cd /workspace/proj && echo sandbox > a.txt && echo n > new.txt && rm b.txt",
    );
    // Looked up (cached by overlayfs) before the discard.
    sh_ok(&mut c, &id, "cd /workspace/proj && cat a.txt new.txt; ls");
    // A process with its working directory inside, holding the sandbox's a.txt open.
    sh_ok(
        &mut c,
        &id,
        r#"cd /workspace/proj && cat > /tmp/inside.sh <<'SH'
exec 3<a.txt
touch /tmp/ready
while [ ! -e /tmp/go ]; do sleep 0.05; done
{ ls >/dev/null 2>&1; echo listed; cat <&3; cd "$PWD" && cat a.txt; echo end; } >/tmp/inside.out 2>&1
SH
nohup sh /tmp/inside.sh >/dev/null 2>&1 &
for i in $(seq 100); do [ -e /tmp/ready ] && break; sleep 0.05; done; test -e /tmp/ready"#,
    );
    let r = c.call("sandbox/discard", json!({"sandbox": id}));
    assert_eq!(paths(&r["discarded"]).len(), 3, "{r}");
    assert_eq!(
        sh_ok(&mut c, &id, "cd /workspace/proj && cat a.txt b.txt; ls"),
        "alpha\nbeta\ngamma\nbee\na.txt\nb.txt\nrun.sh\nsrc\n"
    );
    assert_eq!(
        sh_ok(
            &mut c,
            &id,
            "touch /tmp/go; for i in $(seq 100); do grep -q end /tmp/inside.out 2>/dev/null && break; sleep 0.05; done; cat /tmp/inside.out"
        ),
        "listed\nsandbox\nalpha\nbeta\ngamma\nend\n",
        "the process inside: its view, its open file, then the new view"
    );
    // The new overlay is the sandbox's: it writes (a copy-up too), diff sees it, and a second
    // discard is seen at once as well.
    sh_ok(
        &mut c,
        &id,
        "cd /workspace/proj && echo more >> a.txt && echo c > c.txt && cat a.txt c.txt >/dev/null",
    );
    assert_eq!(
        listed(&mut c, json!({"sandbox": id})),
        [
            "/workspace/proj/a.txt modified",
            "/workspace/proj/c.txt added"
        ]
    );
    let r = c.call("sandbox/discard", json!({"sandbox": id}));
    assert_eq!(paths(&r["discarded"]).len(), 2, "{r}");
    assert_eq!(
        sh_ok(&mut c, &id, "cd /workspace/proj && cat a.txt; ls"),
        "alpha\nbeta\ngamma\na.txt\nb.txt\nrun.sh\nsrc\n"
    );
    assert_eq!(
        fs::read_to_string(proj.path().join("a.txt")).unwrap(),
        "alpha\nbeta\ngamma\n"
    );
}

/// Mounting an overlay again carries the mounts nested in it (their targets beneath its
/// target) onto the new overlay: they stay where they were, with their own changes.
#[test]
fn a_discard_keeps_the_mounts_nested_in_the_overlay() {
    let proj = project();
    let lib = project();
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let id = c.create(json!({
        "mounts": [
            {"source": proj.path().to_str().unwrap(), "target": "/workspace/proj"},
            {"source": lib.path().to_str().unwrap(), "target": "/workspace/proj/vendor/lib"},
        ],
        "timeout": 600,
    }));
    sh_ok(
        &mut c,
        &id,
        "cd /workspace/proj && echo sandbox > a.txt && cat a.txt && echo mine > vendor/lib/b.txt",
    );
    let r = c.call(
        "sandbox/discard",
        json!({"sandbox": id, "target": "/workspace/proj", "paths": ["/workspace/proj/a.txt"]}),
    );
    assert_eq!(paths(&r["discarded"]), ["/workspace/proj/a.txt"], "{r}");
    assert_eq!(
        sh_ok(
            &mut c,
            &id,
            "cat /workspace/proj/a.txt /workspace/proj/vendor/lib/b.txt; echo w > /workspace/proj/vendor/lib/c.txt && echo ok"
        ),
        "alpha\nbeta\ngamma\nmine\nok\n"
    );
    // The nested overlay is mounted again in turn, and its parent stays.
    let r = c.call(
        "sandbox/discard",
        json!({"sandbox": id, "target": "/workspace/proj/vendor/lib"}),
    );
    assert_eq!(paths(&r["discarded"]).len(), 2, "{r}");
    assert_eq!(
        sh_ok(
            &mut c,
            &id,
            "cat /workspace/proj/vendor/lib/b.txt; ls /workspace/proj/vendor/lib; ls /workspace/proj"
        ),
        "bee\na.txt\nb.txt\nrun.sh\nsrc\na.txt\nb.txt\nrun.sh\nsrc\nvendor\n"
    );
}

/// An overlay on `/workspace` itself is a Landlock write rule of its own in a host-template
/// sandbox: it is not mounted again while the sandbox runs (a new overlay there would be
/// read-only to the sandbox), and the sandbox keeps writing after a discard.
#[test]
fn a_discard_on_workspace_itself_leaves_the_sandbox_writable() {
    let proj = project();
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let id = c.create(json!({
        "mounts": [{"source": proj.path().to_str().unwrap()}],
        "timeout": 600,
    }));
    sh_ok(
        &mut c,
        &id,
        "cd /workspace && echo s > a.txt && echo n > new.txt && cat a.txt",
    );
    let r = c.call("sandbox/discard", json!({"sandbox": id}));
    assert_eq!(
        paths(&r["discarded"]),
        ["/workspace/a.txt", "/workspace/new.txt"],
        "{r}"
    );
    // Its Landlock write rule is `/` (so the new overlay stays writable): the root and the
    // system directories stay read-only all the same.
    assert_eq!(
        sh_ok(
            &mut c,
            &id,
            "for p in /x /etc/x /usr/x /bin/x /var/x; do touch $p 2>/dev/null && echo wrote $p; done; echo ro"
        ),
        "ro\n"
    );
    // The sandbox sees the host's files again at once (the overlay was mounted again).
    assert_eq!(
        sh_ok(
            &mut c,
            &id,
            "cd /workspace && head -1 a.txt && test ! -e new.txt && echo gone"
        ),
        "alpha\ngone\n"
    );
    assert_eq!(
        sh_ok(
            &mut c,
            &id,
            "cd /workspace && echo w > w.txt && echo more >> b.txt && cat w.txt b.txt"
        ),
        "w\nbee\nmore\n"
    );
    assert_eq!(
        listed(&mut c, json!({"sandbox": id})),
        ["/workspace/b.txt modified", "/workspace/w.txt added"]
    );
}

#[test]
fn a_sandbox_cannot_make_apply_write_outside_the_tree_nor_plant_setuid_files() {
    let proj = project();
    let p = proj.path().to_path_buf();
    let outside = tempfile::Builder::new()
        .prefix("abx-victim")
        .tempdir()
        .unwrap();
    let victim = outside.path().join("victim");
    fs::write(&victim, "precious\n").unwrap();
    // A hard link inside the tree to the file outside.
    fs::hard_link(&victim, p.join("hl")).unwrap();
    let (_home, mut c, id) = setup(&p);
    settle();
    let v = victim.display().to_string();
    sh_ok(
        &mut c,
        &id,
        &format!(
            "cd /workspace/proj && ln -s {v} evil && ln -s ../../{name}/victim rel-evil \
             && cp run.sh suid && chmod 4755 suid && echo overwritten > hl \
             && mkdir -p linkdir && mkfifo fifo",
            name = outside.path().file_name().unwrap().to_str().unwrap()
        ),
    );
    let r = c.call("sandbox/diff", json!({"sandbox": id}));
    let ch = r["changes"].as_array().unwrap();
    let evil = ch
        .iter()
        .find(|e| e["path"] == "/workspace/proj/evil")
        .unwrap();
    assert_eq!(evil["type"], "symlink");
    assert_eq!(evil["symlinkTarget"], v.as_str());
    assert_eq!(evil["explicitOnly"], true);
    let suid = ch
        .iter()
        .find(|e| e["path"] == "/workspace/proj/suid")
        .unwrap();
    assert_eq!(suid["mode"], 0o4755, "the reviewer sees the bit asked for");
    // `..` and paths outside every overlay mount are refused before anything is written.
    for bad in [
        "/workspace/proj/../../etc/passwd",
        "/etc/passwd",
        "relative.txt",
    ] {
        let err = c.call_err(
            "sandbox/apply",
            json!({"sandbox": id, "paths": [bad], "force": true}),
        );
        assert_eq!(abx_code(&err), "E4002", "{bad}");
    }
    // Apply everything, forced: the links that leave the tree are skipped (not named), the
    // fifo is skipped, the setuid bit is dropped, the hard link is replaced.
    let r = c.call("sandbox/apply", json!({"sandbox": id, "force": true}));
    let skipped = paths(&r["skipped"]);
    assert!(skipped.contains(&"/workspace/proj/evil".to_owned()), "{r}");
    assert!(
        skipped.contains(&"/workspace/proj/rel-evil".to_owned()),
        "{r}"
    );
    assert!(skipped.contains(&"/workspace/proj/fifo".to_owned()), "{r}");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(fs::read_to_string(p.join("hl")).unwrap(), "overwritten\n");
    assert_ne!(
        fs::metadata(p.join("hl")).unwrap().ino(),
        fs::metadata(&victim).unwrap().ino()
    );
    let m = fs::metadata(p.join("suid")).unwrap().permissions().mode();
    assert_eq!(m & 0o7777, 0o755);
    assert!(!p.join("fifo").exists());
    // Named explicitly, the link itself is made, and nothing is written through it.
    let r = c.call(
        "sandbox/apply",
        json!({"sandbox": id, "paths": ["/workspace/proj/evil"], "force": true}),
    );
    assert_eq!(paths(&r["applied"]), ["/workspace/proj/evil"]);
    assert!(fs::symlink_metadata(p.join("evil"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    // The sandbox writes "through" the link: in its own view, never the host's file.
    c.sh(&id, "echo pwned > /workspace/proj/evil");
    let r = c.call("sandbox/apply", json!({"sandbox": id, "force": true}));
    assert!(
        r["applied"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p != "/workspace/proj/evil"),
        "{r}"
    );
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
}

#[test]
fn only_overlay_mounts_have_changes() {
    let proj = project();
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let id = c.create(json!({"mounts": [{"source": proj.path().to_str().unwrap(), "target": "/workspace/ro", "mode": "ro"}]}));
    let err = c.call_err(
        "sandbox/diff",
        json!({"sandbox": id, "target": "/workspace/ro"}),
    );
    assert_eq!(abx_code(&err), "E1004");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("only overlay mounts"),
        "{err}"
    );
    // Without overlay mounts there is nothing to list.
    assert_eq!(listed(&mut c, json!({"sandbox": id})), Vec::<String>::new());
    let err = c.call_err("sandbox/diff", json!({"sandbox": "nope"}));
    assert_eq!(abx_code(&err), "E2009");
}

/// The small form of the large cases (the large ones: `scripts/bench workspace`): 20,000 files
/// with 200 changed and one 64 MiB file changed; the daemon answers another client meanwhile.
#[test]
fn a_large_tree_and_a_large_file_stay_bounded_and_the_daemon_answers_meanwhile() {
    let src = tempfile::Builder::new()
        .prefix("abx-big")
        .tempdir()
        .unwrap();
    let s = src.path();
    for d in 0..100 {
        let dir = s.join(format!("d{d:03}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..200 {
            fs::write(dir.join(format!("f{f:03}.txt")), format!("{d} {f}\n")).unwrap();
        }
    }
    let big = s.join("big.bin");
    {
        let f = fs::File::create(&big).unwrap();
        f.set_len(64 << 20).unwrap();
    }
    let (home, mut c, id) = setup(s);
    sh_ok(
        &mut c,
        &id,
        "cd /workspace/proj && for d in d0*; do echo changed >> $d/f007.txt; echo changed >> $d/f100.txt; done \
         && printf x | dd of=big.bin bs=1 seek=67108863 conv=notrunc 2>/dev/null",
    );
    let t0 = std::time::Instant::now();
    let mut other = home.connect();
    let started = std::thread::spawn({
        let sock = home.socket();
        move || {
            // Another client's pings while the diff runs.
            let mut o = Client::connect(&sock, abx_tests::Framing::Line);
            let mut n = 0;
            for _ in 0..20 {
                o.call("broker/ping", json!({}));
                n += 1;
            }
            n
        }
    });
    let r = c.call("sandbox/diff", json!({"sandbox": id}));
    assert_eq!(started.join().unwrap(), 20);
    let ch = r["changes"].as_array().unwrap();
    assert_eq!(ch.len(), 201, "{}", ch.len());
    let b = ch
        .iter()
        .find(|e| e["path"] == "/workspace/proj/big.bin")
        .unwrap();
    assert_eq!(b["size"], 64u64 << 20);
    assert_eq!(b["binary"], true);
    let r = c.call("sandbox/apply", json!({"sandbox": id}));
    assert_eq!(r["applied"].as_array().unwrap().len(), 201, "{r}");
    let host = fs::read(&big).unwrap();
    assert_eq!((host.len(), host[host.len() - 1]), (64 << 20, b'x'));
    assert!(listed(&mut other, json!({"sandbox": id})).is_empty());
    eprintln!(
        "diff + apply of 201 changes in 20,001 files and 64 MiB: {:?}",
        t0.elapsed()
    );
}

/// Helper for debugging: the sandbox's upper dir of its first mount.
#[allow(dead_code)]
fn upper(home: &Home, id: &str) -> PathBuf {
    home.path
        .join(format!("data/local/sandboxes/{id}/mounts/0/upper"))
}
