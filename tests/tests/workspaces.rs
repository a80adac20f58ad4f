//! Workspaces (issue 43, mounts): host directories mounted into `local` sandboxes, end to
//! end through a real daemon, as root (CI) and as a user (scripts/test runs this suite again
//! as `abx-nonroot`). Every refusal is tried the way an attacker would.

use abx_tests::fixtures::{copy_dir, fixture, started};
use abx_tests::{abx_code, Client, Home};
use serde_json::{json, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn setup() -> (Home, Client, Tidy) {
    let home = Home::new();
    home.start();
    let c = home.connect();
    let t = Tidy(home.path.clone());
    (home, c, t)
}

/// Dropped before its `Home`: opens up the directories a user who is not root could not
/// remove (overlayfs's `work/work`, mode 0; an installed plugin's read-only tree).
struct Tidy(PathBuf);

impl Drop for Tidy {
    fn drop(&mut self) {
        fn open_up(d: &Path, depth: usize) {
            let Ok(m) = std::fs::symlink_metadata(d) else {
                return;
            };
            if !m.is_dir() || depth > 16 {
                return;
            }
            if m.permissions().mode() & 0o700 != 0o700 {
                let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700));
            }
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                open_up(&e.path(), depth + 1);
            }
        }
        open_up(&self.0.join("data"), 0);
    }
}

/// A project directory of the test's user, with a file in it.
fn project() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("abx-proj")
        .tempdir()
        .unwrap();
    std::fs::write(d.path().join("a.txt"), "host a\n").unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    std::fs::write(d.path().join("sub/b.txt"), "host b\n").unwrap();
    d
}

fn euid() -> u32 {
    // SAFETY: a getter.
    unsafe { libc::geteuid() }
}

fn out(r: &Value) -> String {
    r["stdout"].as_str().unwrap_or_default().to_owned()
}

fn sandbox_dir(home: &Home, id: &str) -> PathBuf {
    home.path.join("data/local/sandboxes").join(id)
}

fn create_err(c: &mut Client, mounts: Value) -> Value {
    c.call_err("sandbox/create", json!({ "mounts": mounts }))
}

#[test]
fn an_overlay_mount_reads_the_host_and_writes_only_its_own_layer() {
    let (home, mut c, _t) = setup();
    let p = project();
    let src = p.path().canonicalize().unwrap();
    let sb = c.call("sandbox/create", json!({"mounts": [{"source": src}]}));
    let id = sb["id"].as_str().unwrap().to_owned();
    let want = json!([{"source": src, "target": "/workspace", "mode": "overlay"}]);
    assert_eq!(sb["mounts"], want);
    assert_eq!(
        c.call("sandbox/info", json!({"sandbox": id}))["mounts"],
        want
    );
    let list = c.call("sandbox/list", json!({"provider": "local"}));
    assert_eq!(list["sandboxes"][0]["mounts"], want, "{list}");
    // The record keeps the resolved source, its device and inode, owner, creation time.
    let rec: Value = serde_json::from_slice(
        &std::fs::read(sandbox_dir(&home, &id).join("sandbox.json")).unwrap(),
    )
    .unwrap();
    let st = std::fs::metadata(&src).unwrap();
    let m = &rec["mounts"][0];
    assert_eq!(m["dev"], st.dev());
    assert_eq!(m["ino"], st.ino());
    assert_eq!(m["uid"], st.uid());
    assert!(m["createdNs"].as_i64().unwrap() > 0);
    // Read, and the source's owner is the sandbox's own user.
    assert_eq!(
        out(&c.sh(&id, "cat /workspace/a.txt sub/b.txt")),
        "host a\nhost b\n"
    );
    assert_eq!(
        out(&c.sh(
            &id,
            "test \"$(stat -c %u a.txt)\" = \"$(id -u)\" && echo mine"
        )),
        "mine\n"
    );
    // Write, change, remove: the host is unchanged; the layer holds the changes.
    let r = c.sh(
        &id,
        "echo new > new.txt && echo more >> a.txt && rm sub/b.txt && mkdir d && cat a.txt",
    );
    assert_eq!(out(&r), "host a\nmore\n", "{r}");
    assert_eq!(
        std::fs::read_to_string(src.join("a.txt")).unwrap(),
        "host a\n"
    );
    assert!(src.join("sub/b.txt").exists());
    assert!(!src.join("new.txt").exists() && !src.join("d").exists());
    let upper = sandbox_dir(&home, &id).join("mounts/0/upper");
    assert_eq!(
        std::fs::read_to_string(upper.join("new.txt")).unwrap(),
        "new\n"
    );
    assert!(upper.join("a.txt").exists());
    // The host changes a file the sandbox did not change: the sandbox sees the new content.
    std::fs::write(src.join("sub/c.txt"), "from the host\n").unwrap();
    assert_eq!(out(&c.sh(&id, "cat sub/c.txt")), "from the host\n");
    std::fs::write(src.join("sub/c.txt"), "changed on the host\n").unwrap();
    assert_eq!(out(&c.sh(&id, "cat sub/c.txt")), "changed on the host\n");
    // Never suid, never devices.
    let opts = out(&c.sh(&id, "grep ' /workspace ' /proc/self/mounts | tail -1"));
    assert!(opts.contains("nosuid") && opts.contains("nodev"), "{opts}");
    // HOME is not the user's project: a shell's history and a tool's cache stay out of it
    // (and out of sandbox/diff).
    let r = c.sh(
        &id,
        "echo $HOME; echo ls >> ~/.bash_history && mkdir -p ~/.cache && pwd",
    );
    assert_eq!(
        out(&r),
        "/tmp/home
/workspace
",
        "{r}"
    );
    assert!(!upper.join(".bash_history").exists() && !upper.join(".cache").exists());
    // Without a mount on /workspace, HOME stays /workspace.
    let q = project();
    let other = c.call(
        "sandbox/create",
        json!({"mounts": [{"source": q.path().canonicalize().unwrap(), "target": "/workspace/q"}]}),
    );
    let oid = other["id"].as_str().unwrap();
    assert_eq!(
        out(&c.sh(oid, "echo $HOME; cat q/a.txt")),
        "/workspace
host a
"
    );
}

#[test]
fn a_read_only_mount_refuses_writes() {
    let (_home, mut c, _t) = setup();
    let p = project();
    let src = p.path().canonicalize().unwrap();
    let id = c.create(json!({"mounts": [{"source": src, "target": "/src", "mode": "ro"}]}));
    assert_eq!(out(&c.sh(&id, "cat /src/a.txt")), "host a\n");
    let r = c.sh(
        &id,
        "echo x > /src/a.txt; echo x > /src/n.txt; rm /src/a.txt",
    );
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{r}"
    );
    assert_eq!(
        std::fs::read_to_string(src.join("a.txt")).unwrap(),
        "host a\n"
    );
    assert!(!src.join("n.txt").exists());
    // Through the API: E4014, not E4002.
    let e = c.call_err(
        "files/write",
        json!({"sandbox": id, "path": "/src/a.txt", "data": "x"}),
    );
    assert_eq!(abx_code(&e), "E4014", "{e}");
    assert_eq!(
        std::fs::read_to_string(src.join("a.txt")).unwrap(),
        "host a\n"
    );
}

#[test]
fn an_rw_mount_writes_through_as_the_sources_owner_and_no_setid_bit() {
    let (_home, mut c, _t) = setup();
    let p = project();
    let src = p.path().canonicalize().unwrap();
    let owner = std::fs::metadata(&src).unwrap().uid();
    let id =
        c.create(json!({"mounts": [{"source": src, "target": "/workspace/rw", "mode": "rw"}]}));
    let r = c.sh(&id, "echo written > rw/w.txt && mkdir rw/dir && echo ok");
    assert_eq!(out(&r), "ok\n", "{r}");
    let w = std::fs::metadata(src.join("w.txt")).unwrap();
    assert_eq!(
        std::fs::read_to_string(src.join("w.txt")).unwrap(),
        "written\n"
    );
    assert_eq!(w.uid(), owner, "written files belong to the source's owner");
    assert_eq!(std::fs::metadata(src.join("dir")).unwrap().uid(), owner);
    // Setuid and setgid bits, every way a shell and python know.
    let r = c.sh(
        &id,
        "cd rw; for m in u+s g+s 4755 2755 6777; do chmod $m a.txt 2>/dev/null && echo chmod $m; done; \
         install -m 4755 a.txt suid 2>/dev/null && echo install; \
         mkdir -m 2755 sgid 2>/dev/null && echo mkdir; \
         python3 -c 'import os; os.close(os.open(\"py\", os.O_CREAT|os.O_WRONLY, 0o4755))' 2>/dev/null && echo open; \
         python3 -c 'import os; os.chmod(\"a.txt\", 0o4755)' 2>/dev/null && echo pychmod; \
         python3 -c 'import os; fd=os.open(\"a.txt\", os.O_RDONLY); os.fchmod(fd, 0o2755)' 2>/dev/null && echo fchmod; \
         chmod 0640 a.txt && echo plain",
    );
    assert_eq!(out(&r), "plain\n", "{r}");
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        let mode = e.metadata().unwrap().permissions().mode();
        assert_eq!(mode & 0o6000, 0, "{:?} has mode {mode:o}", e.path());
    }
    assert_eq!(
        std::fs::metadata(src.join("a.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o640
    );
    // A hard link from inside the mount to a file outside it (EXDEV), either way.
    let r = c.sh(
        &id,
        "echo t > /tmp/outside; ln /tmp/outside rw/link 2>&1; ln rw/a.txt /tmp/in 2>&1; ln /etc/hostname rw/h 2>&1; true",
    );
    let text = out(&r);
    assert!(
        text.matches("Invalid cross-device link").count() == 3,
        "{r}"
    );
    assert!(!src.join("link").exists() && !src.join("h").exists());
    // A symlink the sandbox plants points in the sandbox: on the host it changes nothing
    // outside the source.
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    let r = c.sh(
        &id,
        &format!(
            "ln -s {v} rw/evil && echo pwned > rw/evil 2>&1; ln -s ../../../../..{v} rw/evil2 && echo pwned > rw/evil2 2>&1; true",
            v = victim.display()
        ),
    );
    let _ = r;
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
}

#[test]
fn broker_system_home_and_credential_dirs_are_refused() {
    let (home, mut c, _t) = setup();
    let t = tempfile::Builder::new()
        .prefix("abx-cred")
        .tempdir()
        .unwrap();
    let root = t.path().canonicalize().unwrap();
    for d in [
        ".ssh/keys",
        ".config/abx",
        "proj",
        "withcred/.gnupg",
        "deep/.aws",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::os::unix::fs::symlink("/proc", root.join("to-proc")).unwrap();
    std::os::unix::fs::symlink(root.join(".ssh"), root.join("proj/to-ssh")).unwrap();
    let data = home.path.join("data");
    let user_home = PathBuf::from(std::env::var("HOME").unwrap());
    let mut refused: Vec<PathBuf> = vec![
        home.path.clone(),
        data.clone(),
        data.join("local/sandboxes"),
        home.path.join("run"),
        home.path.join("config"),
        "/".into(),
        "/proc".into(),
        "/proc/self/cwd".into(),
        "/sys".into(),
        "/dev".into(),
        "/etc".into(),
        "/usr".into(),
        "/tmp".into(),
        user_home.clone(),
        root.join(".ssh"),
        root.join(".ssh/keys"),
        root.join(".config/abx"),
        root.join(".config"),
        root.join("withcred"),
        root.join("to-proc"),
        root.join("proj/to-ssh"),
        root.clone(),
    ];
    let mut up = user_home.parent();
    while let Some(p) = up {
        refused.push(p.to_path_buf());
        up = p.parent();
    }
    let before = std::fs::read_dir(home.path.join("data/local/sandboxes"))
        .map(|d| d.count())
        .unwrap_or(0);
    for p in &refused {
        for mode in ["overlay", "ro", "rw"] {
            let e = create_err(&mut c, json!([{"source": p, "mode": mode}]));
            assert_eq!(abx_code(&e), "E2010", "{} ({mode}): {e}", p.display());
            let sugg = e["data"]["suggestion"].as_str().unwrap_or_default();
            assert!(sugg.contains("Mounts"), "{sugg}");
        }
    }
    // Refused sources leave nothing behind.
    let after = std::fs::read_dir(home.path.join("data/local/sandboxes"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(before, after);
    // A refusal says which and why.
    let e = create_err(&mut c, json!([{"source": root.join("proj/to-ssh")}]));
    assert!(e["message"].as_str().unwrap().contains(".ssh"), "{e}");
    // Not a directory, missing.
    std::fs::write(root.join("file"), "x").unwrap();
    assert_eq!(
        abx_code(&create_err(&mut c, json!([{"source": root.join("file")}]))),
        "E2010"
    );
    assert_eq!(
        abx_code(&create_err(&mut c, json!([{"source": root.join("nope")}]))),
        "E2010"
    );
    // The good one is fine.
    c.create(json!({"mounts": [{"source": root.join("proj")}]}));
    // A user's daemon: a directory of another user is refused (the sandbox's user is the
    // daemon's).
    if euid() != 0 {
        let e = create_err(&mut c, json!([{"source": "/var/cache"}]));
        assert_eq!(abx_code(&e), "E2010", "{e}");
    }
}

#[test]
fn bad_entries_are_e1004_naming_the_member() {
    let (_home, mut c, _t) = setup();
    let p = project();
    let s = p.path().to_str().unwrap();
    for (mounts, says) in [
        (json!({"source": s}), "list"),
        (json!(["/x"]), "mounts[0]"),
        (
            json!([{"source": s, "readonly": true}]),
            "mounts[0].readonly",
        ),
        (json!([{"source": 1}]), "mounts[0].source"),
        (json!([{"target": "/workspace"}]), "mounts[0].source"),
        (json!([{"source": "rel/dir"}]), "mounts[0].source"),
        (json!([{"source": s, "mode": "write"}]), "mounts[0].mode"),
        (json!([{"source": s, "target": 5}]), "mounts[0].target"),
        (json!([{"source": s, "target": "/etc"}]), "\"/etc\""),
        (json!([{"source": s, "target": "/"}]), "\"/\""),
        (json!([{"source": s, "target": "/proc/x"}]), "\"/proc/x\""),
        (
            json!([{"source": s, "target": "/usr/local/p"}]),
            "\"/usr/local/p\"",
        ),
        (json!([{"source": s, "target": "/tmp"}]), "\"/tmp\""),
        (json!([{"source": s, "target": "/lib64"}]), "\"/lib64\""),
        (
            json!([{"source": s}, {"source": s, "target": "/workspace/"}]),
            "mounts[1].target",
        ),
    ] {
        let e = create_err(&mut c, mounts.clone());
        assert_eq!(abx_code(&e), "E1004", "{mounts}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains(says),
            "{mounts}: {e}"
        );
    }
    // null and [] ask for nothing.
    c.create(json!({"mounts": null}));
    c.create(json!({"mounts": []}));
}

/// The source is resolved once: a racing thread exchanging a path component with a symlink
/// to a credential-holding tree while creates run never gets that tree mounted.
#[test]
fn swapping_a_path_component_during_create_mounts_nothing_else() {
    let (_home, mut c, _t) = setup();
    let t = tempfile::Builder::new()
        .prefix("abx-race")
        .tempdir()
        .unwrap();
    let root = t.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join("good/proj")).unwrap();
    std::fs::write(root.join("good/proj/marker"), "good\n").unwrap();
    std::fs::create_dir_all(root.join("secret/proj/.ssh")).unwrap();
    std::fs::write(root.join("secret/proj/marker"), "secret\n").unwrap();
    std::fs::write(root.join("secret/proj/.ssh/id"), "KEY\n").unwrap();
    // `a` is the good directory or a symlink to the secret one, exchanged constantly.
    std::fs::rename(root.join("good"), root.join("a")).unwrap();
    std::os::unix::fs::symlink(root.join("secret"), root.join("b")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swaps = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let racer = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        let a = std::ffi::CString::new(root.join("a").to_str().unwrap()).unwrap();
        let b = std::ffi::CString::new(root.join("b").to_str().unwrap()).unwrap();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: renameat2 with C strings we hold.
                let rc = unsafe {
                    libc::syscall(
                        libc::SYS_renameat2,
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
                swaps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let source = root.join("a/proj");
    let (mut made, mut refused) = (0, 0);
    for _ in 0..30 {
        let r = c.request(
            "sandbox/create",
            json!({"mounts": [{"source": source, "mode": "ro"}]}),
        );
        if let Some(e) = r.get("error") {
            assert!(
                ["E2010"].contains(&abx_code(e)),
                "only a refusal may happen: {e}"
            );
            refused += 1;
            continue;
        }
        let id = r["result"]["id"].as_str().unwrap().to_owned();
        let seen = c.sh(&id, "cat /workspace/marker; ls -a /workspace");
        let text = out(&seen);
        assert!(
            text.starts_with("good\n") && !text.contains(".ssh"),
            "the mount is not the directory that was checked: {seen}"
        );
        made += 1;
        c.call("sandbox/kill", json!({"sandbox": id}));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    racer.join().unwrap();
    eprintln!(
        "{made} made, {refused} refused, {} swaps",
        swaps.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(refused > 0, "the race never hit the secret side");
}

#[test]
fn mounts_survive_a_restart_and_a_replaced_source_is_refused() {
    let (home, mut c, _t) = setup();
    let p = project();
    let src = p.path().canonicalize().unwrap();
    let q = project();
    let other = q.path().canonicalize().unwrap();
    let id = c.create(json!({"timeout": 600, "mounts": [{"source": src}]}));
    let moved = c.create(
        json!({"timeout": 600, "mounts": [{"source": other, "target": "/src", "mode": "ro"}]}),
    );
    let r = c.sh(&id, "echo kept > kept.txt && echo more >> a.txt && echo ok");
    assert_eq!(out(&r), "ok\n", "{r}");
    drop(c);
    assert!(home.run(&["broker", "stop"]).status.success());
    // Replace the second source with another directory of the same path.
    std::fs::rename(&other, other.with_extension("old")).unwrap();
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("a.txt"), "impostor\n").unwrap();
    home.start();
    let mut c = home.connect();
    // The overlay's changes are there, the host unchanged.
    assert_eq!(
        out(&c.sh(&id, "cat kept.txt a.txt")),
        "kept\nhost a\nmore\n"
    );
    assert_eq!(
        std::fs::read_to_string(src.join("a.txt")).unwrap(),
        "host a\n"
    );
    assert_eq!(
        c.call("sandbox/info", json!({"sandbox": id}))["mounts"][0]["source"],
        json!(src)
    );
    // The replaced one: its commands fail with E2010, nothing mounted without it.
    let e = c.call_err(
        "exec/run",
        json!({"sandbox": moved, "command": "cat /src/a.txt"}),
    );
    assert_eq!(abx_code(&e), "E2010", "{e}");
    assert!(e["message"].as_str().unwrap().contains("no longer"), "{e}");
    let _ = std::fs::remove_dir_all(other.with_extension("old"));
}

#[test]
fn files_see_what_exec_sees() {
    let (_home, mut c, _t) = setup();
    let p = project();
    let src = p.path().canonicalize().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "host secret\n").unwrap();
    let id = c.create(json!({"mounts": [
        {"source": src, "target": "/src", "mode": "rw"},
        {"source": src, "target": "/workspace/ov"},
    ]}));
    let read =
        |c: &mut Client, path: &str| c.request("files/read", json!({"sandbox": id, "path": path}));
    let os = read(&mut c, "/etc/os-release");
    assert!(
        os["result"]["data"]
            .as_str()
            .unwrap_or_default()
            .contains("ID="),
        "{os}"
    );
    assert_eq!(read(&mut c, "/src/a.txt")["result"]["data"], "host a\n");
    assert_eq!(
        read(&mut c, "/workspace/ov/sub/b.txt")["result"]["data"],
        "host b\n"
    );
    // Symlinks the sandbox plants are resolved in its own view, never on the host.
    let r = c.sh(
        &id,
        &format!(
            "ln -s /etc/hostname /src/l1; ln -s ../../../../../../..{s} /src/l2; ln -s {s} /workspace/ov/l3",
            s = outside.path().join("secret").display()
        ),
    );
    let _ = r;
    let hostname = out(&c.sh(&id, "cat /etc/hostname"));
    assert_eq!(read(&mut c, "/src/l1")["result"]["data"], json!(hostname));
    for l in ["/src/l2", "/workspace/ov/l3"] {
        let v = read(&mut c, l);
        assert!(
            !v.to_string().contains("host secret"),
            "{l} read the host file: {v}"
        );
    }
    // Writes: the system is read-only (E4014); what is not in the sandbox is E4002.
    let e = c.call_err(
        "files/write",
        json!({"sandbox": id, "path": "/etc/x", "data": "x"}),
    );
    assert_eq!(abx_code(&e), "E4014", "{e}");
    let e = c.call_err(
        "files/write",
        json!({"sandbox": id, "path": "/usr/x", "data": "x"}),
    );
    assert_eq!(abx_code(&e), "E4014", "{e}");
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "/src/api.txt", "data": "via api\n"}),
    );
    assert_eq!(
        std::fs::read_to_string(src.join("api.txt")).unwrap(),
        "via api\n"
    );
    assert_eq!(out(&c.sh(&id, "cat /src/api.txt")), "via api\n");
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "/workspace/ov/api2.txt", "data": "overlay\n"}),
    );
    assert!(!src.join("api2.txt").exists());
    assert_eq!(out(&c.sh(&id, "cat /workspace/ov/api2.txt")), "overlay\n");
}

#[test]
fn a_plugin_without_storage_mount_is_e8004() {
    let (home, mut c) = started(&[]);
    let _t = Tidy(home.path.clone());
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture("py-local"), dir.path());
    c.call(
        "provider/install",
        json!({"source": dir.path(), "confirm": true}),
    );
    let p = project();
    let e = c.call_err(
        "sandbox/create",
        json!({"provider": "py-local", "mounts": [{"source": p.path()}]}),
    );
    assert_eq!(abx_code(&e), "E8004", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("storage.mount"),
        "{e}"
    );
    // Without mounts (or an empty list) it is served.
    let r = c.request(
        "sandbox/create",
        json!({"provider": "py-local", "mounts": []}),
    );
    assert!(r.get("result").is_some(), "{r}");
    // local declares it.
    let info = c.call("provider/info", json!({"id": "local"}));
    assert!(info.to_string().contains("storage.mount"), "{info}");
}

/// A tiny OCI layout (busybox, an `/etc/os-release` of its own) at `dir`, made by python3.
fn busybox_layout(dir: &Path) {
    let script = r#"
import tarfile, io, json, hashlib, os, sys
root = sys.argv[1]
os.makedirs(root + "/blobs/sha256", exist_ok=True)
def blob(b):
    h = hashlib.sha256(b).hexdigest()
    open(f"{root}/blobs/sha256/{h}", "wb").write(b)
    return "sha256:" + h, len(b)
buf = io.BytesIO(); t = tarfile.open(fileobj=buf, mode="w")
def add(name, data=None, mode=0o755, typ=tarfile.REGTYPE, link=None):
    ti = tarfile.TarInfo(name); ti.mode = mode; ti.type = typ
    if link: ti.linkname = link
    if data is not None:
        ti.size = len(data); t.addfile(ti, io.BytesIO(data))
    else:
        t.addfile(ti)
for d in ["bin", "etc"]: add(d, typ=tarfile.DIRTYPE)
add("bin/busybox", open("/bin/busybox", "rb").read())
for a in ["sh", "cat", "echo", "ls"]: add("bin/" + a, typ=tarfile.SYMTYPE, link="/bin/busybox")
add("etc/os-release", b"ID=abx-image-test\n", 0o644)
t.close(); layer = buf.getvalue()
ld, ls = blob(layer)
cd, cs = blob(json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
    "rootfs": {"type": "layers", "diff_ids": [ld]}}).encode())
md, ms = blob(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ld, "size": ls}]}).encode())
json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
    "digest": md, "size": ms, "annotations": {"org.opencontainers.image.ref.name": "v1"}}]},
    open(root + "/index.json", "w"))
open(root + "/oci-layout", "w").write('{"imageLayoutVersion":"1.0.0"}')
"#;
    let st = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(dir)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn an_image_sandbox_has_its_mounts_and_files_see_its_root() {
    if !Path::new("/bin/busybox").exists() {
        eprintln!("no /bin/busybox (package busybox-static): skipped");
        return;
    }
    let (_home, mut c, _t) = setup();
    let images = tempfile::tempdir().unwrap();
    busybox_layout(&images.path().join("oci"));
    c.call(
        "templates/import",
        json!({"path": images.path().join("oci"), "name": "ws-bb"}),
    );
    let p = project();
    let src = p.path().canonicalize().unwrap();
    let id = c.create(json!({"template": "ws-bb", "mounts": [
        {"source": src},
        {"source": src, "target": "/srv2/ro", "mode": "ro"},
    ]}));
    let r = c.sh(
        &id,
        "cat /workspace/a.txt /srv2/ro/a.txt /etc/os-release; echo x > /workspace/n; echo y > /srv2/ro/n",
    );
    assert_eq!(out(&r), "host a\nhost a\nID=abx-image-test\n", "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("Read-only"), "{r}");
    assert!(!src.join("n").exists());
    let os = c.call(
        "files/read",
        json!({"sandbox": id, "path": "/etc/os-release"}),
    );
    assert_eq!(os["data"], "ID=abx-image-test\n");
    // The image's root is the sandbox's to write; an ro mount is not.
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "/etc/new", "data": "z"}),
    );
    assert_eq!(out(&c.sh(&id, "cat /etc/new")), "z");
    let e = c.call_err(
        "files/write",
        json!({"sandbox": id, "path": "/srv2/ro/q", "data": "z"}),
    );
    assert_eq!(abx_code(&e), "E4014", "{e}");
}

/// `files/watch` of a path on a mount (issue 43) watches what the sandbox sees there: writes
/// through an overlay mount on `/workspace` and through an `rw` mount elsewhere are reported
/// with their sandbox paths, and host writes under the `rw` and `ro` mounts too (the same
/// inodes).
#[test]
fn a_watch_on_a_mount_reports_the_sandboxs_paths() {
    let (_home, mut c, _t) = setup();
    let p = project();
    let src = p.path().canonicalize().unwrap();
    let other = project();
    let other_src = other.path().canonicalize().unwrap();
    let third = project();
    let third_src = third.path().canonicalize().unwrap();
    let id = c.create(json!({"mounts": [
        {"source": src},
        {"source": other_src, "target": "/data", "mode": "rw"},
        {"source": third_src, "target": "/ref", "mode": "ro"},
    ]}));
    let watch = |c: &mut Client, path: &str| {
        c.call(
            "files/watch",
            json!({"sandbox": id, "path": path, "recursive": true}),
        )["watchId"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let w_ws = watch(&mut c, "/workspace");
    let w_data = watch(&mut c, "/data");
    let w_ref = watch(&mut c, "/ref");
    c.sh(&id, "mkdir /workspace/newdir && echo x > /workspace/newdir/n.txt && echo y > /workspace/sub/b.txt && echo z > /data/z.txt");
    std::fs::write(other_src.join("from-host.txt"), "h\n").unwrap();
    std::fs::write(third_src.join("sub/ro-host.txt"), "h\n").unwrap();
    let want = [
        (w_ws.as_str(), "/workspace/newdir/n.txt"),
        (w_ws.as_str(), "/workspace/sub/b.txt"),
        (w_data.as_str(), "/data/z.txt"),
        (w_data.as_str(), "/data/from-host.txt"),
        (w_ref.as_str(), "/ref/sub/ro-host.txt"),
    ];
    let mut seen: Vec<(String, String)> = vec![];
    while !want
        .iter()
        .all(|(w, p)| seen.iter().any(|(sw, sp)| sw == w && sp == p))
    {
        let v = c.recv();
        if v["method"] == "files/changed" {
            let path = v["params"]["path"].as_str().unwrap().to_owned();
            assert!(
                !path.contains("/workspace/workspace") && !path.starts_with("/workspace/data"),
                "a path not as the sandbox sees it: {v}"
            );
            seen.push((v["params"]["watchId"].as_str().unwrap().to_owned(), path));
        }
    }
    // Nothing on the host changed under the overlay.
    assert!(!src.join("newdir").exists());
    assert_eq!(
        std::fs::read_to_string(src.join("sub/b.txt")).unwrap(),
        "host b\n"
    );
}
