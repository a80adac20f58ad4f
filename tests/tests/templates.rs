//! Templates on `local` (issue 22) end to end: a real registry (Debian's `docker-registry`)
//! on a loopback port, test images built here from `busybox-static` as OCI layout
//! directories (several layers: gzip, plain and zstd; a whiteout, an opaque directory, a
//! hard link, a symlink, a setuid file), pushed with `skopeo`, then pulled and run by a
//! real daemon. Nothing is mocked.

mod images;

use abx_tests::{abx_code, wait_until, Client, Home};
use images::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The upper layer: a whiteout, an opaque dir, a hard link, a symlink, a setuid file.
fn upper_layer() -> Vec<u8> {
    tar(&[
        E::File("etc/.wh.gone.txt".into(), vec![], 0o644),
        E::Dir("opq"),
        E::File("opq/.wh..wh..opq".into(), vec![], 0o644),
        E::File("opq/new.txt".into(), b"new\n".to_vec(), 0o644),
        E::File("srv/app/target.txt".into(), b"linked\n".to_vec(), 0o644),
        E::Hard("srv/app/hard.txt", "srv/app/target.txt"),
        E::Sym("srv/app/soft".into(), "/srv/app/target.txt".into()),
        E::File(
            "bin/suid".into(),
            b"#!/bin/sh\necho suid\n".to_vec(),
            0o4755,
        ),
    ])
}

/// A third layer, zstd-compressed.
fn zstd_layer() -> Vec<u8> {
    tar(&[
        E::Dir("usr"),
        E::File("usr/zstd.txt".into(), b"zstd layer\n".to_vec(), 0o644),
    ])
}

// ---- the registry ----

struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    fn start() -> Registry {
        Registry::start_with(|_| String::new())
    }

    /// A registry whose config ends with `auth(dir)` (an `auth:` section, or nothing).
    fn start_with(auth: impl FnOnce(&Path) -> String) -> Registry {
        Registry::start_on(None, auth)
    }

    /// [`Registry::start_with`] serving the storage of `data` (another registry's) where given.
    fn start_on(data: Option<PathBuf>, auth: impl FnOnce(&Path) -> String) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let auth = auth(dir.path());
        let data = data.unwrap_or_else(|| dir.path().join("data"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = dir.path().join("config.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}",
                data.display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (Debian package docker-registry)");
        wait_until("the registry listens", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Registry { child, dir, port }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Push an OCI layout dir's `tag` as `name:tag` with skopeo.
    fn push(&self, layout: &Path, tag: &str, name: &str) {
        self.push_as(layout, tag, name, None)
    }

    /// [`Registry::push`] with `user:password` credentials.
    fn push_as(&self, layout: &Path, tag: &str, name: &str, creds: Option<&str>) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["--insecure-policy", "copy", "-q", "--dest-tls-verify=false"]);
        if let Some(c) = creds {
            cmd.arg(format!("--dest-creds={c}"));
        }
        let out = cmd
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{name}:{tag}", self.host()))
            .output()
            .expect("skopeo");
        assert!(
            out.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The stored data file of a blob.
    fn blob_file(&self, digest: &str) -> PathBuf {
        let h = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&h[..2])
            .join(h)
            .join("data")
    }
}

fn build_image(dir: &Path) {
    oci_layout(
        dir,
        "v1",
        &[
            (base_layer(), "gzip"),
            (upper_layer(), "plain"),
            (zstd_layer(), "zstd"),
        ],
        &["PATH=/bin", "GREETING=from-image"],
        "/srv/app",
    );
}

struct Fx {
    reg: Registry,
    _images: tempfile::TempDir,
    home: Home,
    c: Client,
    image: String,
}

fn fixture() -> Fx {
    let reg = Registry::start();
    let images = tempfile::tempdir().unwrap();
    let dir = images.path().join("bb");
    build_image(&dir);
    reg.push(&dir, "v1", "test/bb");
    let home = Home::new();
    home.start();
    let c = home.connect();
    let image = format!("{}/test/bb:v1", reg.host());
    Fx {
        reg,
        _images: images,
        home,
        c,
        image,
    }
}

fn sh(c: &mut Client, id: &str, cmd: &str) -> (i64, String) {
    let r = c.sh(id, cmd);
    (
        r["exitCode"].as_i64().unwrap_or(-1),
        format!(
            "{}{}",
            r["stdout"].as_str().unwrap_or(""),
            r["stderr"].as_str().unwrap_or("")
        ),
    )
}

fn out(c: &mut Client, id: &str, cmd: &str) -> String {
    let (code, o) = sh(c, id, cmd);
    assert_eq!(code, 0, "{cmd}: {o}");
    o
}

/// `templates/import` of the layout or archive at `path` as `name` on `local`.
fn import(c: &mut Client, path: impl AsRef<Path>, name: &str) -> Value {
    c.call(
        "templates/import",
        json!({"provider": "local", "path": path.as_ref(), "name": name}),
    )
}

#[test]
fn image_template_from_a_loopback_registry_by_tag_and_by_digest_with_env_workdir_and_layers() {
    let mut f = fixture();
    let sb = f.c.call("sandbox/create", json!({"template": f.image}));
    let id = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(sb["template"], f.image.as_str());
    let digest = sb["templateDigest"]
        .as_str()
        .expect("templateDigest")
        .to_owned();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    // The image's root, not the host's: busybox is the only program.
    assert!(out(&mut f.c, &id, "ls /bin").contains("busybox"));
    assert_eq!(
        sh(&mut f.c, &id, "test -e /usr/bin/apt").0,
        1,
        "no host /usr"
    );
    // Env and WorkingDir of the image.
    assert_eq!(out(&mut f.c, &id, "echo $GREETING"), "from-image\n");
    assert_eq!(out(&mut f.c, &id, "pwd"), "/srv/app\n");
    assert_eq!(out(&mut f.c, &id, "cat base.txt"), "from the base layer\n");
    // The sandbox's env goes over the image's, an exec's over both.
    let r = f.c.call(
        "exec/run",
        json!({"sandbox": id, "command": "echo $GREETING", "env": {"GREETING": "exec"}, "cwd": "/workspace"}),
    );
    assert_eq!(r["stdout"], "exec\n");
    // Layers: a whiteout removed a file, an opaque dir hid the lower content.
    assert_eq!(sh(&mut f.c, &id, "test -e /etc/gone.txt").0, 1, "whiteout");
    assert_eq!(out(&mut f.c, &id, "ls /opq"), "new.txt\n");
    // The hard link is one inode; the symlink resolves inside the image.
    let a = out(&mut f.c, &id, "stat -c %i /srv/app/target.txt");
    assert_eq!(out(&mut f.c, &id, "stat -c %i /srv/app/hard.txt"), a);
    assert_eq!(out(&mut f.c, &id, "cat /srv/app/soft"), "linked\n");
    assert_eq!(out(&mut f.c, &id, "cat /usr/zstd.txt"), "zstd layer\n");
    // The setuid bit is dropped (documented).
    assert_eq!(out(&mut f.c, &id, "stat -c %a /bin/suid"), "755\n");
    // The root is writable (the sandbox's own layer), /workspace and /tmp are its own.
    out(
        &mut f.c,
        &id,
        "echo mine > /etc/mine && cat /etc/mine && echo w > /workspace/w.txt",
    );
    let r = f.c.call(
        "files/read",
        json!({"sandbox": id, "path": "/workspace/w.txt"}),
    );
    assert_eq!(r["data"], "w\n");

    // By digest: the same image, no new pull (the registry is stopped first).
    let pinned = format!("{}/test/bb@{digest}", f.reg.host());
    drop(f.reg);
    let sb2 = f.c.call("sandbox/create", json!({"template": pinned}));
    let id2 = sb2["id"].as_str().unwrap().to_owned();
    assert_eq!(sb2["templateDigest"], digest.as_str());
    // The tag is pinned: it resolves without the registry too.
    let sb3 = f.c.call("sandbox/create", json!({"template": f.image}));
    assert_eq!(sb3["templateDigest"], digest.as_str());
    // Two sandboxes of one image do not see each other's writes.
    assert_eq!(sh(&mut f.c, &id2, "test -e /etc/mine").0, 1);
    out(&mut f.c, &id2, "echo other > /srv/app/base.txt");
    assert_eq!(
        out(&mut f.c, &id, "cat /srv/app/base.txt"),
        "from the base layer\n"
    );
    // templates/list shows it with name, digest, size and when pulled.
    let l = f.c.call("templates/list", json!({"provider": "local"}));
    let t = l["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["digest"] == digest.as_str())
        .cloned()
        .expect("listed");
    assert!(t["size"].as_u64().unwrap() > 100_000, "{t}");
    assert!(t["pulledAt"].as_str().unwrap().ends_with('Z'), "{t}");
    assert!(
        t["names"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == f.image.as_str()),
        "{t}"
    );
    let info = f.c.call("sandbox/info", json!({"sandbox": id}));
    assert_eq!(info["templateDigest"], digest.as_str());
    // Without a template: the host system as before.
    let host = f.c.create(json!({}));
    assert_eq!(sh(&mut f.c, &host, "test -e /usr/bin/env").0, 0);
    let _ = &f.home;
}

#[test]
fn pull_progress_corrupted_blob_refused_with_e8013_and_remove_prune() {
    let mut f = fixture();
    // templates/pull with progress notifications.
    let r = f.c.request(
        "templates/pull",
        json!({"provider": "local", "template": f.image}),
    );
    assert!(r.get("result").is_some(), "{r}");
    let mut progress = 0;
    while let Some(n) = f.c.try_recv(Duration::from_millis(1)) {
        if n["method"] == "templates/progress" {
            progress += 1;
        }
    }
    assert!(
        progress >= 2,
        "templates/progress notifications: {progress}"
    );
    let digest = r["result"]["digest"].as_str().unwrap().to_owned();

    // A second image whose layer is corrupted in the registry's storage.
    let dir = f._images.path().join("bad");
    // (gzip: skopeo pushes a compressed layer as it is.)
    oci_layout(
        &dir,
        "v1",
        &[(
            tar(&[E::File("x.txt".into(), vec![b'x'; 4096], 0o644)]),
            "gzip",
        )],
        &[],
        "",
    );
    f.reg.push(&dir, "v1", "test/bad");
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let md = index["manifests"][0]["digest"].as_str().unwrap();
    let man: Value = serde_json::from_slice(
        &std::fs::read(
            dir.join("blobs/sha256")
                .join(md.trim_start_matches("sha256:")),
        )
        .unwrap(),
    )
    .unwrap();
    let layer = man["layers"][0]["digest"].as_str().unwrap();
    let data = f.reg.blob_file(layer);
    let mut b = std::fs::read(&data).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    std::fs::write(&data, b).unwrap();
    let bad = format!("{}/test/bad:v1", f.reg.host());
    let e = f.c.call_err(
        "templates/pull",
        json!({"provider": "local", "template": bad}),
    );
    assert_eq!(abx_code(&e), "E8013", "{e}");
    let e = f.c.call_err("sandbox/create", json!({"template": bad}));
    assert_eq!(abx_code(&e), "E8013", "{e}");
    let l = f.c.call("templates/list", json!({"provider": "local"}));
    assert_eq!(
        l["templates"].as_array().unwrap().len(),
        2,
        "base and the good image: {l}"
    );
    let blobs = f.home.path.join("data/local/templates/blobs/sha256");
    assert!(
        !blobs.join(layer.trim_start_matches("sha256:")).exists(),
        "the corrupt blob is not stored"
    );

    // remove: refused while a sandbox uses it, then done; prune empties the store.
    let id = f.c.create(json!({"template": f.image}));
    let e = f.c.call_err(
        "templates/remove",
        json!({"provider": "local", "template": f.image}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    f.c.call("sandbox/kill", json!({"sandbox": id}));
    let r = f.c.call(
        "templates/remove",
        json!({"provider": "local", "template": digest}),
    );
    assert_eq!(r["removed"][0], digest.as_str());
    let l = f.c.call("templates/list", json!({"provider": "local"}));
    assert_eq!(l["templates"].as_array().unwrap().len(), 1, "{l}");
    assert_eq!(
        std::fs::read_dir(&blobs).unwrap().count(),
        0,
        "unused blobs removed"
    );
    let e = f.c.call_err(
        "templates/remove",
        json!({"provider": "local", "template": f.image}),
    );
    assert_eq!(abx_code(&e), "E2005");
    let r = f.c.call(
        "templates/remove",
        json!({"provider": "local", "prune": true}),
    );
    assert_eq!(r["removed"], json!([]));
}

#[test]
fn hostile_layer_with_dotdot_absolute_symlink_write_and_device_node_writes_nothing_outside() {
    let reg = Registry::start();
    let images = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let out_s = outside.path().display().to_string();
    let dir = images.path().join("hostile");
    let bb = std::fs::read("/bin/busybox").unwrap();
    let l1 = tar(&[
        E::Dir("bin"),
        E::File("bin/busybox".into(), bb, 0o755),
        E::Sym("bin/sh".into(), "busybox".into()),
        E::Sym("bin/ls".into(), "busybox".into()),
        E::File(
            format!("../../../../../..{out_s}/dotdot"),
            b"x".to_vec(),
            0o644,
        ),
        E::Sym("escape".into(), out_s.clone()),
        E::Sym("up".into(), "../../../../../../../..".into()),
        E::Dev("bin/evil"),
    ]);
    let l2 = tar(&[
        E::File("escape/through-abs".into(), b"x".to_vec(), 0o644),
        E::File(format!("up{out_s}/through-rel"), b"x".to_vec(), 0o644),
        E::Hard("bin/hl", "../../../../etc/passwd"),
    ]);
    oci_layout(
        &dir,
        "v1",
        &[(l1, "gzip"), (l2, "plain")],
        &["PATH=/bin"],
        "",
    );
    reg.push(&dir, "v1", "test/hostile");
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let id = c.create(json!({"template": format!("{}/test/hostile:v1", reg.host())}));
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing was written outside the image"
    );
    assert_eq!(sh(&mut c, &id, "test -e /bin/evil").0, 1, "no device node");
    assert_eq!(
        sh(&mut c, &id, "test -e /bin/hl").0,
        1,
        "no hard link out of the image"
    );
    assert_eq!(out(&mut c, &id, "ls /bin"), "busybox\nls\nsh\n");
}

#[test]
fn saved_template_from_templates_build_starts_with_the_saved_files() {
    let mut f = fixture();
    let id = f.c.create(json!({"template": f.image}));
    out(&mut f.c, &id, "mkdir -p /srv/app/built && echo saved > /srv/app/built/file.txt && rm /srv/app/base.txt && rm -r /opq && echo ws > /workspace/not-saved");
    let r = f.c.call(
        "templates/build",
        json!({"provider": "local", "sandbox": id, "name": "mine:1"}),
    );
    let d = r["digest"].as_str().unwrap().to_owned();
    assert_eq!(r["base"].as_str().unwrap().len(), 71);
    // The sandbox goes on working after the save.
    out(&mut f.c, &id, "echo after > /srv/app/after.txt");
    let sb = f.c.call("sandbox/create", json!({"template": "mine:1"}));
    let id2 = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(sb["templateDigest"], d.as_str());
    assert_eq!(
        out(&mut f.c, &id2, "cat /srv/app/built/file.txt"),
        "saved\n"
    );
    assert_eq!(
        sh(&mut f.c, &id2, "test -e /srv/app/base.txt").0,
        1,
        "a deletion is saved"
    );
    assert_eq!(
        sh(&mut f.c, &id2, "test -e /opq").0,
        1,
        "a removed dir is saved"
    );
    assert_eq!(sh(&mut f.c, &id2, "test -e /srv/app/after.txt").0, 1);
    assert_eq!(
        sh(&mut f.c, &id2, "test -e /workspace/not-saved").0,
        1,
        "/workspace is not part of it"
    );
    assert_eq!(
        out(&mut f.c, &id2, "echo $GREETING; pwd"),
        "from-image\n/srv/app\n"
    );
    // The base is still as it was.
    let id3 = f.c.create(json!({"template": f.image}));
    assert_eq!(
        out(&mut f.c, &id3, "cat /srv/app/base.txt"),
        "from the base layer\n"
    );
    // A host sandbox cannot be saved; a missing sandbox is E2009.
    let host = f.c.create(json!({}));
    let e = f.c.call_err(
        "templates/build",
        json!({"provider": "local", "sandbox": host, "name": "x"}),
    );
    assert_eq!(abx_code(&e), "E1004");
    let e = f.c.call_err(
        "templates/build",
        json!({"provider": "local", "sandbox": "sb-nope", "name": "x"}),
    );
    assert_eq!(abx_code(&e), "E2009");
    // The base of a built template is not removed under it.
    let e = f.c.call_err(
        "templates/remove",
        json!({"provider": "local", "template": f.image}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
}

#[test]
fn import_of_a_docker_save_archive_and_an_oci_layout_directory() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let t = tempfile::tempdir().unwrap();
    // docker save: manifest.json, the config named by its digest, layer tars.
    let save = t.path().join("save");
    std::fs::create_dir_all(save.join("l1")).unwrap();
    std::fs::create_dir_all(save.join("l2")).unwrap();
    let (l1, l2) = (base_layer(), upper_layer());
    std::fs::write(save.join("l1/layer.tar"), &l1).unwrap();
    std::fs::write(save.join("l2/layer.tar"), &l2).unwrap();
    let cfg = serde_json::to_vec(&json!({
        "architecture": go_arch(), "os": "linux",
        "config": {"Env": ["PATH=/bin", "FROM=docker-save"], "WorkingDir": "/srv/app"},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{}", sha256(&l1)), format!("sha256:{}", sha256(&l2))]},
    }))
    .unwrap();
    let ch = sha256(&cfg);
    std::fs::write(save.join(format!("{ch}.json")), &cfg).unwrap();
    std::fs::write(
        save.join("manifest.json"),
        serde_json::to_vec(&json!([{"Config": format!("{ch}.json"), "RepoTags": ["saved/bb:1"], "Layers": ["l1/layer.tar", "l2/layer.tar"]}])).unwrap(),
    )
    .unwrap();
    let archive = t.path().join("bb.tar");
    let st = Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&save)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let r = c.call(
        "templates/import",
        json!({"provider": "local", "path": archive}),
    );
    assert_eq!(r["name"], "saved/bb:1");
    let id = c.create(json!({"template": "saved/bb:1"}));
    assert_eq!(
        out(&mut c, &id, "echo $FROM; pwd; cat base.txt"),
        "docker-save\n/srv/app\nfrom the base layer\n"
    );
    assert_eq!(sh(&mut c, &id, "test -e /etc/gone.txt").0, 1);

    // A docker-save archive whose layer does not match its diff_id: E8013.
    std::fs::write(
        save.join("l2/layer.tar"),
        tar(&[E::File("evil".into(), b"x".to_vec(), 0o644)]),
    )
    .unwrap();
    let e = c.call_err(
        "templates/import",
        json!({"provider": "local", "path": save, "name": "tampered"}),
    );
    assert_eq!(abx_code(&e), "E8013", "{e}");

    // An OCI layout directory.
    let layout = t.path().join("layout");
    build_image(&layout);
    let r = c.call(
        "templates/import",
        json!({"provider": "local", "path": layout, "name": "oci/bb:1", "tag": "v1"}),
    );
    let d = r["digest"].as_str().unwrap().to_owned();
    let sb = c.call("sandbox/create", json!({"template": "oci/bb:1"}));
    assert_eq!(sb["templateDigest"], d.as_str());
    let id = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(
        out(&mut c, &id, "cat /usr/zstd.txt; echo $GREETING"),
        "zstd layer\nfrom-image\n"
    );
    // By digest alone.
    let id = c.create(json!({"template": d}));
    assert_eq!(out(&mut c, &id, "cat /opq/new.txt"), "new\n");
    let l = c.call("templates/list", json!({"provider": "local"}));
    assert_eq!(l["templates"].as_array().unwrap().len(), 3, "{l}");
    // An unknown template is still E2005 (nothing stored, nothing to pull on loopback).
    let e = c.call_err("sandbox/create", json!({"template": "127.0.0.1:1/none:1"}));
    assert_eq!(abx_code(&e), "E2005", "{e}");
}

#[test]
fn cli_template_import_list_create_build_rm() {
    let home = Home::new();
    home.start();
    let t = tempfile::tempdir().unwrap();
    let layout = t.path().join("layout");
    build_image(&layout);
    let run = |args: &[&str]| {
        let o = home.run(args);
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "abx {args:?}: {s}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        s
    };
    let l = layout.display().to_string();
    let r: Value =
        serde_json::from_str(&run(&["-j", "template", "import", &l, "cli/bb:1"])).unwrap();
    assert_eq!(r["name"], "cli/bb:1");
    // The same image under a second name: both are listed (issue 45, item 8: one row per
    // digest hid one), and `base` has its `names` too.
    run(&["template", "import", &l, "cli/bb:2"]);
    let list = run(&["template", "list"]);
    assert!(list.starts_with("NAME"), "{list}");
    assert!(
        list.contains("cli/bb:1") && list.contains("cli/bb:2") && list.contains("base"),
        "{list}"
    );
    let j: Value = serde_json::from_str(&run(&["-j", "template", "list"])).unwrap();
    let base = &j["templates"][0];
    assert_eq!(
        (&base["name"], &base["names"]),
        (&json!("base"), &json!(["base"])),
        "{j}"
    );
    let sb: Value =
        serde_json::from_str(&run(&["-j", "create", "--template", "cli/bb:1"])).unwrap();
    let id = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(run(&["exec", &id, "cat /usr/zstd.txt"]), "zstd layer\n");
    run(&["exec", &id, "echo cli > /srv/app/cli.txt"]);
    run(&["template", "build", &id, "cli/saved:1"]);
    let sb: Value =
        serde_json::from_str(&run(&["-j", "create", "--template", "cli/saved:1"])).unwrap();
    let id2 = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(run(&["exec", &id2, "cat /srv/app/cli.txt"]), "cli\n");
    run(&["kill", &id2, "--yes"]);
    run(&["template", "rm", "cli/saved:1"]);
    assert!(!run(&["template", "list"]).contains("cli/saved:1"));
    let o = home.run(&["template", "rm", "cli/saved:1"]);
    assert_eq!(o.status.code(), Some(4), "E2005 exits 4");
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("[E2005]"));
}

/// An image of busybox with every applet it has (as `busybox --install -s` would make).
fn full_busybox_image(dir: &Path) {
    let bb = std::fs::read("/bin/busybox").unwrap();
    let list = Command::new("/bin/busybox")
        .arg("--list-full")
        .output()
        .unwrap();
    let mut e = vec![
        E::Dir("bin"),
        E::Dir("sbin"),
        E::Dir("usr"),
        E::Dir("usr/bin"),
        E::Dir("usr/sbin"),
        E::Dir("etc"),
    ];
    e.push(E::File("bin/busybox".into(), bb, 0o755));
    for a in String::from_utf8_lossy(&list.stdout).lines() {
        let a = a.trim();
        // busybox-static's ls prints '?' for every non-ASCII byte of a name (it is built
        // without Unicode support): the image gets the host's for the kit's unicode test.
        if a.is_empty() || a == "bin/busybox" {
            continue;
        }
        e.push(E::Sym(a.to_owned(), "/bin/busybox".into()));
    }
    e.push(E::File(
        "etc/passwd".into(),
        b"root:x:0:0:root:/workspace:/bin/sh\n".to_vec(),
        0o644,
    ));
    // The host's dash as /bin/sh (busybox's ash would run its own ls applet) and the host's
    // ls, with the libraries ldd names.
    for (bin, at) in [("/bin/dash", "bin/sh"), ("/bin/ls", "bin/ls")] {
        e.retain(|x| !matches!(x, E::Sym(n, _) if n == at));
        e.push(E::File(at.into(), std::fs::read(bin).unwrap(), 0o755));
        let ldd = Command::new("ldd").arg(bin).output().unwrap();
        for l in String::from_utf8_lossy(&ldd.stdout).lines() {
            let Some(p) = l.split_whitespace().find(|w| w.starts_with('/')) else {
                continue;
            };
            let name = p.trim_start_matches('/').to_owned();
            if !e
                .iter()
                .any(|x| matches!(x, E::File(n, _, _) if *n == name))
            {
                e.push(E::File(name, std::fs::read(p).unwrap(), 0o755));
            }
        }
    }
    oci_layout(
        dir,
        "v1",
        &[(tar(&e), "gzip")],
        &["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
        "",
    );
}

#[test]
fn kit_passes_on_local_with_an_image_template() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let t = tempfile::tempdir().unwrap();
    full_busybox_image(&t.path().join("bb"));
    import(&mut c, t.path().join("bb"), "kit/busybox:1");
    c.stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .unwrap();
    let r = c.call(
        "provider/test",
        json!({"id": "local", "template": "kit/busybox:1"}),
    );
    let failed: Vec<&Value> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["outcome"] == "failed")
        .collect();
    assert!(
        failed.is_empty(),
        "failed on an image template: {}",
        serde_json::to_string_pretty(&failed).unwrap()
    );
    assert!(r["passed"].as_u64().unwrap() >= 20, "{r}");
    // The image has no python3: the code.interpret tests say so and skip (on `base` they
    // run: tests/tests/kit.rs).
    let code: Vec<&Value> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["name"].as_str().unwrap().starts_with("test_code_"))
        .collect();
    assert_eq!(code.len(), 5, "{r}");
    for x in code {
        assert_eq!(x["outcome"], "skipped", "{x}");
        assert!(
            x["detail"]
                .as_str()
                .unwrap()
                .contains("no Python interpreter"),
            "{x}"
        );
    }
    // The run's sandboxes really were of the image (and are gone).
    let l = c.call("sandbox/list", json!({"provider": "local"}));
    assert_eq!(l["sandboxes"], json!([]), "{l}");
}

#[test]
fn image_user_numeric_and_named_is_honoured() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let t = tempfile::tempdir().unwrap();
    let extra = tar(&[E::File(
        "etc/passwd".into(),
        b"root:x:0:0:root:/root:/bin/sh\napp:x:2000:3000:app:/srv/app:/bin/sh\n".to_vec(),
        0o644,
    )]);
    for (name, user, want) in [
        ("numeric", "1234:5678", "1234 5678\n"),
        ("named", "app", "2000 3000\n"),
    ] {
        let dir = t.path().join(name);
        oci_layout_as(
            &dir,
            "v1",
            &[(base_layer(), "gzip"), (extra.clone(), "plain")],
            &["PATH=/bin"],
            "/srv/app",
            user,
        );
        let tname = format!("user/{name}:1");
        import(&mut c, &dir, &tname);
        let id = c.create(json!({"template": tname}));
        assert_eq!(out(&mut c, &id, "echo $(id -u) $(id -g)"), want, "{user}");
        // The image's files, /workspace and /tmp belong to that user: it can write them.
        out(
            &mut c,
            &id,
            "echo x > /srv/app/mine && echo y > /workspace/y && echo z > /tmp/z",
        );
        assert_eq!(
            out(&mut c, &id, "stat -c %u /srv/app/base.txt"),
            format!("{}\n", want.split(' ').next().unwrap())
        );
    }
}

#[test]
fn fallback_root_is_a_private_copy_where_overlayfs_is_refused() {
    let mut home = Home::new();
    home.env.push(("ABX_TEST_HOOKS".into(), "1".into()));
    home.env.push(("ABX_TEST_OVERLAY".into(), "refused".into()));
    home.start();
    let mut c = home.connect();
    let t = tempfile::tempdir().unwrap();
    build_image(&t.path().join("img"));
    import(&mut c, t.path().join("img"), "copy/bb:1");
    let a = c.create(json!({"template": "copy/bb:1"}));
    let b = c.create(json!({"template": "copy/bb:1"}));
    assert_eq!(
        out(&mut c, &a, "echo $GREETING; pwd; cat base.txt"),
        "from-image\n/srv/app\nfrom the base layer\n"
    );
    assert_eq!(sh(&mut c, &a, "test -e /etc/gone.txt").0, 1, "whiteout");
    out(&mut c, &a, "echo changed > /srv/app/base.txt");
    assert_eq!(
        out(&mut c, &b, "cat /srv/app/base.txt"),
        "from the base layer\n",
        "copies are private"
    );
    let rootfs = std::fs::read_dir(home.path.join("data/local/templates/images"))
        .unwrap()
        .flatten()
        .find(|e| e.path().join("rootfs").is_dir())
        .unwrap()
        .path()
        .join("rootfs/srv/app/base.txt");
    assert_eq!(
        std::fs::read_to_string(rootfs).unwrap(),
        "from the base layer\n",
        "the stored image is untouched"
    );
    let e = c.call_err(
        "templates/build",
        json!({"provider": "local", "sandbox": a, "name": "x:1"}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
}

#[test]
fn an_image_sandbox_and_its_own_layer_survive_a_daemon_restart() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let t = tempfile::tempdir().unwrap();
    build_image(&t.path().join("img"));
    import(&mut c, t.path().join("img"), "restart/bb:1");
    let id = c.create(json!({"template": "restart/bb:1", "timeout": 600}));
    out(&mut c, &id, "echo kept > /etc/kept && rm /srv/app/base.txt");
    drop(c);
    let o = home.run(&["broker", "stop"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    home.start();
    let mut c = home.connect();
    let info = c.call("sandbox/info", json!({"sandbox": id}));
    assert_eq!(info["template"], "restart/bb:1");
    assert!(info["templateDigest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(
        out(&mut c, &id, "cat /etc/kept; echo $GREETING"),
        "kept\nfrom-image\n"
    );
    assert_eq!(sh(&mut c, &id, "test -e /srv/app/base.txt").0, 1);
}

// ---- registry credentials (HTTP Basic with htpasswd, Bearer tokens from a token server) ----

fn b64(b: &[u8], url: bool) -> String {
    let abc: &[u8] = if url {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..=c.len() {
            out.push(abc[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
        if !url {
            for _ in c.len()..3 {
                out.push('=');
            }
        }
    }
    out
}

fn openssl(args: &[&str], input: Option<&[u8]>) -> Vec<u8> {
    use std::io::Write;
    let mut c = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl");
    let mut stdin = c.stdin.take().unwrap();
    let data = input.unwrap_or(b"").to_vec();
    let w = std::thread::spawn(move || stdin.write_all(&data));
    let out = c.wait_with_output().unwrap();
    w.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

const USER: &str = "alice";
const PASSWORD: &str = "pw-Xq7-correct-horse";
const WRONG: &str = "pw-Zt3-wrong-battery";

/// `docker-registry` with `auth: htpasswd` (bcrypt, `htpasswd -B`), plain HTTP on loopback
/// (distribution 2.8 does not refuse that, and a loopback registry is plain HTTP for abx).
fn htpasswd_registry() -> Registry {
    Registry::start_with(|dir| {
        let file = dir.join("htpasswd");
        let out = Command::new("htpasswd")
            .args(["-Bbn", USER, PASSWORD])
            .output()
            .expect("htpasswd (Debian package apache2-utils)");
        assert!(out.status.success());
        std::fs::write(&file, out.stdout).unwrap();
        format!(
            "auth:\n  htpasswd:\n    realm: abx-test\n    path: {}\n",
            file.display()
        )
    })
}

/// A token server on a loopback port, as `docker_auth` or a registry's own would be: it
/// takes Basic credentials and answers `{"token": JWT}`, RS256-signed with a key whose
/// self-signed certificate is the registry's `rootcertbundle` and rides in the header's
/// `x5c` (distribution's `token.go` verifies the chain against the bundle, then iss, aud,
/// exp and nbf with a leeway, then the signature; `accesscontroller.go` the `access`).
struct TokenServer {
    port: u16,
    dir: tempfile::TempDir,
    /// Every request: (query, Authorization header was the right one, token given).
    seen: std::sync::Arc<std::sync::Mutex<Vec<Asked>>>,
}

/// One request to the token server: (query, the right credentials, the token given).
type Asked = (String, bool, Option<String>);

const ISSUER: &str = "abx-test-issuer";
const SERVICE: &str = "abx-test-registry";

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl TokenServer {
    fn start() -> TokenServer {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        let cert = dir.path().join("cert.pem");
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=abx-test-token-issuer",
                "-keyout",
                key.to_str().unwrap(),
                "-out",
                cert.to_str().unwrap(),
            ],
            None,
        );
        let der = openssl(
            &["x509", "-in", cert.to_str().unwrap(), "-outform", "DER"],
            None,
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let good = format!(
            "Basic {}",
            b64(format!("{USER}:{PASSWORD}").as_bytes(), false)
        );
        let x5c = b64(&der, false);
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            for s in listener.incoming() {
                let Ok(mut s) = s else { continue };
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                let mut first = String::new();
                if r.read_line(&mut first).is_err() {
                    continue;
                }
                let mut authz = String::new();
                loop {
                    let mut l = String::new();
                    if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = l.split_once(':') {
                        if k.eq_ignore_ascii_case("authorization") {
                            authz = v.trim().to_owned();
                        }
                    }
                }
                if first.starts_with("GET /quit") {
                    break;
                }
                let target = first.split_whitespace().nth(1).unwrap_or("").to_owned();
                let query = target.split_once('?').map_or("", |q| q.1).to_owned();
                let ok = authz == good;
                if !ok {
                    seen2.lock().unwrap().push((query, false, None));
                    let body = r#"{"details":"bad credentials"}"#;
                    let _ = write!(s, "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                    continue;
                }
                // scope=repository:NAME:ACTIONS (one or more), service=...
                let mut access = Vec::new();
                for kv in query.split('&') {
                    let Some((k, v)) = kv.split_once('=') else {
                        continue;
                    };
                    if k != "scope" {
                        continue;
                    }
                    let v = unescape(v);
                    let mut parts = v.splitn(2, ':');
                    let kind = parts.next().unwrap_or("");
                    let rest = parts.next().unwrap_or("");
                    let (name, actions) = rest.rsplit_once(':').unwrap_or((rest, ""));
                    access.push(json!({"type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>()}));
                }
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs();
                let header = json!({"alg": "RS256", "typ": "JWT", "x5c": [x5c]});
                let claims = json!({
                    "iss": ISSUER, "sub": USER, "aud": SERVICE,
                    "exp": now + 300, "nbf": now - 10, "iat": now,
                    "jti": format!("jti-{now}-{}", seen2.lock().unwrap().len()),
                    "access": access,
                });
                let signing = format!(
                    "{}.{}",
                    b64(header.to_string().as_bytes(), true),
                    b64(claims.to_string().as_bytes(), true)
                );
                let sig = openssl(
                    &["dgst", "-sha256", "-sign", key.to_str().unwrap()],
                    Some(signing.as_bytes()),
                );
                let token = format!("{signing}.{}", b64(&sig, true));
                seen2
                    .lock()
                    .unwrap()
                    .push((unescape(&query), true, Some(token.clone())));
                let body =
                    json!({"token": token, "expires_in": 300, "issued_at": "2026-01-01T00:00:00Z"})
                        .to_string();
                let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            }
        });
        TokenServer { port, dir, seen }
    }

    fn cert(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    fn seen(&self) -> Vec<Asked> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        use std::io::Write;
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = s.write_all(b"GET /quit HTTP/1.1\r\n\r\n");
        }
    }
}

fn token_registry(ts: &TokenServer) -> Registry {
    let (port, cert) = (ts.port, ts.cert());
    Registry::start_with(move |_| {
        format!(
            "auth:\n  token:\n    realm: http://127.0.0.1:{port}/token\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
            cert.display()
        )
    })
}

/// A docker config dir whose config.json holds `user:password` for `host`.
fn docker_config(dir: &Path, host: &str, password: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec(&json!({"auths": {host: {"auth": b64(format!("{USER}:{password}").as_bytes(), false)}}})).unwrap(),
    )
    .unwrap();
}

/// Neither password (nor its base64 form in `user:password`) is in `text`.
fn no_secret(text: &str, what: &str) {
    for p in [PASSWORD, WRONG] {
        assert!(!text.contains(p), "a password in {what}: {text}");
        let enc = b64(format!("{USER}:{p}").as_bytes(), false);
        assert!(!text.contains(&enc), "an encoded password in {what}");
    }
}

/// The error of a registry that wants credentials: E8010 with `data.auth`, a suggestion
/// naming where credentials go, and no secret.
fn assert_auth_error(e: &Value, state: &str) {
    assert_eq!(abx_code(e), "E8010", "{e}");
    assert_eq!(e["data"]["auth"], state, "{e}");
    let sug = e["data"]["suggestion"].as_str().unwrap();
    assert!(
        sug.contains("[local.registry_auth]") && sug.contains("config.json"),
        "{sug}"
    );
    no_secret(&e.to_string(), "an error");
}

fn pushed_image(reg: &Registry, creds: &str) -> (tempfile::TempDir, String) {
    let images = tempfile::tempdir().unwrap();
    let dir = images.path().join("bb");
    build_image(&dir);
    reg.push_as(&dir, "v1", "test/bb", Some(creds));
    (images, format!("{}/test/bb:v1", reg.host()))
}

#[test]
fn htpasswd_registry_credentials_from_docker_config_and_broker_config_never_shown() {
    let reg = htpasswd_registry();
    // skopeo without credentials is refused too: the registry really asks for them.
    let images = tempfile::tempdir().unwrap();
    build_image(&images.path().join("bb"));
    let anon = Command::new("skopeo")
        .args(["--insecure-policy", "copy", "-q", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:v1", images.path().join("bb").display()))
        .arg(format!("docker://{}/test/anon:v1", reg.host()))
        .output()
        .unwrap();
    assert!(!anon.status.success(), "an anonymous push was taken");
    let (_images, image) = pushed_image(&reg, &format!("{USER}:{PASSWORD}"));

    // The daemon's docker config: none at first.
    let cfg = tempfile::tempdir().unwrap();
    let mut home = Home::new();
    home.env
        .push(("DOCKER_CONFIG".into(), cfg.path().display().to_string()));
    home.start();
    let mut c = home.connect();
    let e = c.call_err("sandbox/create", json!({"template": image}));
    assert_auth_error(&e, "required");
    let e = c.call_err(
        "templates/pull",
        json!({"provider": "local", "template": image}),
    );
    assert_auth_error(&e, "required");
    // A wrong password: refused, and said so.
    docker_config(cfg.path(), &reg.host(), WRONG);
    let e = c.call_err(
        "templates/pull",
        json!({"provider": "local", "template": image}),
    );
    assert_auth_error(&e, "refused");
    assert!(
        e["message"].as_str().unwrap().contains("docker config"),
        "{e}"
    );
    let l = c.call("templates/list", json!({"provider": "local"}));
    assert_eq!(
        l["templates"].as_array().unwrap().len(),
        1,
        "only base: {l}"
    );
    // The right one (auths.<host:port>.auth = base64 of user:password): the image runs.
    docker_config(cfg.path(), &reg.host(), PASSWORD);
    let id = c.create(json!({"template": image}));
    assert_eq!(out(&mut c, &id, "cat /usr/zstd.txt"), "zstd layer\n");
    drop(c);

    // The broker config's [local.registry_auth] (it goes before the docker config).
    let home2 = Home::new();
    std::fs::create_dir_all(home2.path.join("config")).unwrap();
    let write_cfg = |p: &str| {
        std::fs::write(
            home2.path.join("config/config.toml"),
            format!(
                "[local.registry_auth]\n\"{}\" = \"{USER}:{p}\"\n",
                reg.host()
            ),
        )
        .unwrap()
    };
    write_cfg(WRONG);
    home2.start();
    let mut c2 = home2.connect();
    let e = c2.call_err("sandbox/create", json!({"template": image}));
    assert_auth_error(&e, "refused");
    assert!(
        e["message"].as_str().unwrap().contains("broker config"),
        "{e}"
    );
    drop(c2);
    let o = home2.run(&["broker", "stop"]);
    assert!(o.status.success());
    write_cfg(PASSWORD);
    home2.start();
    let mut c2 = home2.connect();
    let id = c2.create(json!({"template": image}));
    assert_eq!(out(&mut c2, &id, "echo $GREETING"), "from-image\n");
    drop(c2);
    for h in [&home, &home2] {
        let log = std::fs::read_to_string(h.log_file()).unwrap();
        assert!(log.contains("daemon listening"), "the daemon's log: {log}");
        no_secret(&log, "the daemon's log");
    }
}

#[test]
fn token_registry_bearer_tokens_from_a_token_server_with_docker_config_credentials() {
    let ts = TokenServer::start();
    let reg = token_registry(&ts);
    let (_images, image) = pushed_image(&reg, &format!("{USER}:{PASSWORD}"));
    assert!(
        ts.seen()
            .iter()
            .any(|(q, ok, _)| *ok && q.contains("repository:test/bb:") && q.contains("push")),
        "skopeo got its push token: {:?}",
        ts.seen()
    );
    let pushes = ts.seen().len();

    let cfg = tempfile::tempdir().unwrap();
    let mut home = Home::new();
    home.env
        .push(("DOCKER_CONFIG".into(), cfg.path().display().to_string()));
    home.start();
    let mut c = home.connect();
    // Anonymous: the token server refuses, so does the registry.
    let e = c.call_err("sandbox/create", json!({"template": image}));
    assert_auth_error(&e, "required");
    let asked: Vec<_> = ts.seen()[pushes..].to_vec();
    assert!(
        !asked.is_empty() && asked.iter().all(|(_, ok, _)| !ok),
        "the daemon asked the token server, without credentials: {asked:?}"
    );
    // A wrong password.
    docker_config(cfg.path(), &reg.host(), WRONG);
    let e = c.call_err(
        "templates/pull",
        json!({"provider": "local", "template": image}),
    );
    assert_auth_error(&e, "refused");
    // The right one: a pull token for the repository, then the image runs.
    let before = ts.seen().len();
    docker_config(cfg.path(), &reg.host(), PASSWORD);
    let id = c.create(json!({"template": image}));
    assert_eq!(
        out(&mut c, &id, "cat /srv/app/base.txt"),
        "from the base layer\n"
    );
    let got: Vec<_> = ts.seen()[before..].to_vec();
    assert!(
        got.iter().any(|(q, ok, t)| *ok
            && t.is_some()
            && q.contains("scope=repository:test/bb:pull")
            && q.contains(&format!("service={SERVICE}"))),
        "a pull token was asked with the credentials: {got:?}"
    );
    drop(c);
    let log = std::fs::read_to_string(home.log_file()).unwrap();
    no_secret(&log, "the daemon's log");
    for (_, _, t) in ts.seen() {
        if let Some(t) = t {
            assert!(!log.contains(&t), "a bearer token in the daemon's log");
        }
    }
}

// ---- size caps ----

/// The files a failed pull or import could have left in the store.
fn store_leftovers(home: &Home) -> Vec<PathBuf> {
    let t = home.path.join("data/local/templates");
    let mut out = Vec::new();
    for d in ["images", "blobs/sha256", "tmp"] {
        if let Ok(rd) = std::fs::read_dir(t.join(d)) {
            out.extend(rd.flatten().map(|e| e.path()));
        }
    }
    out
}

#[test]
fn template_max_bytes_refuses_a_decompression_bomb_by_import_and_by_pull_and_keeps_nothing() {
    let reg = Registry::start();
    let home = Home::new();
    std::fs::create_dir_all(home.path.join("config")).unwrap();
    std::fs::write(
        home.path.join("config/config.toml"),
        "[local]\ntemplate_max_bytes = \"16M\"\n",
    )
    .unwrap();
    home.start();
    let mut c = home.connect();
    // 64 MiB of zeros: about 64 KiB gzipped, four times the cap unpacked.
    let bomb = tar(&[E::File("zeros".into(), vec![0u8; 64 << 20], 0o644)]);
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("bomb");
    oci_layout(
        &dir,
        "v1",
        &[(base_layer(), "gzip"), (bomb, "gzip")],
        &["PATH=/bin"],
        "",
    );
    let layer_sizes: u64 = std::fs::read_dir(dir.join("blobs/sha256"))
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(
        layer_sizes < 8 << 20,
        "the image is small packed: {layer_sizes}"
    );
    let e = c.call_err(
        "templates/import",
        json!({"provider": "local", "path": dir, "name": "bomb:1"}),
    );
    assert_eq!(abx_code(&e), "E8012", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("template_max_bytes")
            && e["data"]["suggestion"]
                .as_str()
                .unwrap()
                .contains("template_max_bytes"),
        "{e}"
    );
    assert_eq!(
        store_leftovers(&home),
        Vec::<PathBuf>::new(),
        "nothing kept"
    );
    // The same image from the registry: create and pull are refused alike.
    reg.push(&dir, "v1", "test/bomb");
    let image = format!("{}/test/bomb:v1", reg.host());
    let e = c.call_err("sandbox/create", json!({"template": image}));
    assert_eq!(abx_code(&e), "E8012", "{e}");
    assert_eq!(
        store_leftovers(&home),
        Vec::<PathBuf>::new(),
        "nothing kept"
    );
    let e = c.call_err(
        "templates/pull",
        json!({"provider": "local", "template": image}),
    );
    assert_eq!(abx_code(&e), "E8012", "{e}");
    assert_eq!(
        store_leftovers(&home),
        Vec::<PathBuf>::new(),
        "nothing kept"
    );
    let l = c.call("templates/list", json!({"provider": "local"}));
    assert_eq!(
        l["templates"].as_array().unwrap().len(),
        1,
        "only base: {l}"
    );
    // An image under the cap goes in as before.
    let ok = t.path().join("ok");
    build_image(&ok);
    import(&mut c, &ok, "small:1");
    let id = c.create(json!({"template": "small:1"}));
    assert_eq!(out(&mut c, &id, "cat /usr/zstd.txt"), "zstd layer\n");
}

#[test]
fn templates_import_takes_only_an_absolute_host_path_like_files_upload() {
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let e = c.call_err(
        "templates/import",
        json!({"provider": "local", "path": "relative/layout"}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("must be absolute"),
        "{e}"
    );
}

#[test]
fn credentials_are_not_sent_to_a_plain_http_token_realm_off_loopback() {
    // The image goes in through an open registry; a second one serves the same storage
    // behind a token realm on plain HTTP at a non-loopback address (TEST-NET-1: nothing
    // there is ever contacted, the daemon refuses before).
    let open = Registry::start();
    let images = tempfile::tempdir().unwrap();
    build_image(&images.path().join("bb"));
    open.push(&images.path().join("bb"), "v1", "test/bb");
    let ts = TokenServer::start();
    let cert = ts.cert();
    let reg = Registry::start_on(Some(open.dir.path().join("data")), move |_| {
        format!(
            "auth:\n  token:\n    realm: http://192.0.2.1:9/token\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
            cert.display()
        )
    });
    let image = format!("{}/test/bb:v1", reg.host());
    let cfg = tempfile::tempdir().unwrap();
    docker_config(cfg.path(), &reg.host(), PASSWORD);
    let mut home = Home::new();
    home.env
        .push(("DOCKER_CONFIG".into(), cfg.path().display().to_string()));
    home.start();
    let mut c = home.connect();
    for (method, params) in [
        (
            "templates/pull",
            json!({"provider": "local", "template": image}),
        ),
        ("sandbox/create", json!({"template": image})),
    ] {
        let e = c.call_err(method, params);
        assert_eq!(abx_code(&e), "E8012", "{method}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains("192.0.2.1:9")
                && e["data"]["suggestion"]
                    .as_str()
                    .unwrap()
                    .contains("insecure_registries"),
            "{e}"
        );
        no_secret(&e.to_string(), "an error");
    }
    // The open registry's copy (no challenge, no credentials for it) is pulled as before.
    let id = c.create(json!({"template": format!("{}/test/bb:v1", open.host())}));
    assert_eq!(out(&mut c, &id, "cat /usr/zstd.txt"), "zstd layer\n");
}

/// An OCI layout whose `tag` is an image index of two platforms: this machine's (layer
/// `/arch.txt` = "native") and another architecture's ("foreign"), both on the busybox base.
fn multi_arch_layout(dir: &Path, tag: &str) {
    let base = base_layer();
    let base_gz = compress("gzip", &base);
    let base_d = put_blob(dir, &base_gz);
    let other = if go_arch() == "amd64" {
        "s390x"
    } else {
        "amd64"
    };
    let mut entries = Vec::new();
    for (arch, marker) in [(other, "foreign"), (go_arch(), "native")] {
        let top = tar(&[E::File(
            "arch.txt".into(),
            format!("{marker}\n").into_bytes(),
            0o644,
        )]);
        let top_d = put_blob(dir, &top);
        let (md, size) = put_manifest(
            dir,
            &json!({
                "architecture": arch, "os": "linux",
                "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"]},
                "rootfs": {"type": "layers", "diff_ids": [
                    format!("sha256:{}", sha256(&base)), format!("sha256:{}", sha256(&top)),
                ]},
            }),
            &[
                json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": base_d, "size": base_gz.len()}),
                json!({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": top_d, "size": top.len()}),
            ],
        );
        entries.push(json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
            "size": size, "platform": {"os": "linux", "architecture": arch},
        }));
    }
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries,
    }))
    .unwrap();
    let id = put_blob(dir, &index);
    write_layout_index(
        dir,
        "application/vnd.oci.image.index.v1+json",
        &id,
        index.len(),
        tag,
    );
}

#[test]
fn a_multi_platform_index_from_the_registry_gives_this_machines_image_by_tag_and_by_index_digest() {
    let reg = Registry::start();
    let images = tempfile::tempdir().unwrap();
    let dir = images.path().join("multi");
    multi_arch_layout(&dir, "v1");
    // The whole index and both platforms' images go to the registry (skopeo --all).
    let out_ = Command::new("skopeo")
        .args([
            "--insecure-policy",
            "copy",
            "-q",
            "--all",
            "--dest-tls-verify=false",
        ])
        .arg(format!("oci:{}:v1", dir.display()))
        .arg(format!("docker://{}/test/multi:v1", reg.host()))
        .output()
        .expect("skopeo");
    assert!(
        out_.status.success(),
        "skopeo copy --all: {}",
        String::from_utf8_lossy(&out_.stderr)
    );
    // The index as the registry serves it (skopeo may have written it anew).
    let raw = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{}/test/multi:v1", reg.host()))
        .output()
        .expect("skopeo inspect");
    assert!(
        raw.status.success(),
        "{}",
        String::from_utf8_lossy(&raw.stderr)
    );
    let served: Value = serde_json::from_slice(&raw.stdout).unwrap();
    assert_eq!(
        served["manifests"].as_array().map(Vec::len),
        Some(2),
        "{served}"
    );
    let index = format!("sha256:{}", sha256(&raw.stdout));
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let sb = c.call(
        "sandbox/create",
        json!({"template": format!("{}/test/multi:v1", reg.host())}),
    );
    let id = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(out(&mut c, &id, "cat /arch.txt"), "native\n");
    let digest = sb["templateDigest"].as_str().unwrap().to_owned();
    assert_ne!(
        digest, index,
        "pinned to the platform's manifest, not the index"
    );
    // By the index's digest: the same platform manifest.
    let home2 = Home::new();
    home2.start();
    let mut c2 = home2.connect();
    let sb2 = c2.call(
        "sandbox/create",
        json!({"template": format!("{}/test/multi@{index}", reg.host())}),
    );
    let id2 = sb2["id"].as_str().unwrap().to_owned();
    assert_eq!(out(&mut c2, &id2, "cat /arch.txt"), "native\n");
    assert_eq!(sb2["templateDigest"], digest.as_str());
}
