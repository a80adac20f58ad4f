//! Dockerfile builds on `local` (issue 49) end to end: a busybox-static image made here,
//! pushed to a real registry (Debian's `docker-registry`) on a loopback port, then real
//! builds by a real daemon: stages, the cache, `.dockerignore`, the result's `USER` and
//! `WORKDIR` in a sandbox, a step that fails, cancellation, and bad input (each with its
//! E-code, nothing half-written in the store). Nothing is mocked; no fixed sleeps.

mod images;

use abx_tests::{abx_code, wait_until, Client, Home};
use images::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Registry {
    child: Child,
    _dir: tempfile::TempDir,
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
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = dir.path().join("config.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.path().join("data").display()
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
        Registry {
            child,
            _dir: dir,
            port,
        }
    }

    /// Push a layout's `v1` as `test/bb:v1`; its reference.
    fn push(&self, layout: &Path) -> String {
        let r = format!("127.0.0.1:{}/test/bb:v1", self.port);
        let out = Command::new("skopeo")
            // No credentials: an auth file of its own (the default one may be unreadable).
            .env("REGISTRY_AUTH_FILE", self._dir.path().join("auth.json"))
            .args(["--insecure-policy", "copy", "-q", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:v1", layout.display()))
            .arg(format!("docker://{r}"))
            .output()
            .expect("skopeo");
        assert!(
            out.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        r
    }
}

/// busybox with the applets the builds use, and a user `app` (1000).
fn bb_layer() -> Vec<u8> {
    let bb = std::fs::read("/bin/busybox").expect("busybox-static (/bin/busybox)");
    let mut e = vec![
        E::Dir("bin"),
        E::Dir("etc"),
        E::File("bin/busybox".into(), bb, 0o755),
        E::File(
            "etc/passwd".into(),
            b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n".to_vec(),
            0o644,
        ),
        E::File(
            "etc/group".into(),
            b"root:x:0:\napp:x:1000:\n".to_vec(),
            0o644,
        ),
    ];
    for a in [
        "sh", "cat", "ls", "test", "echo", "id", "env", "pwd", "rm", "mkdir", "touch", "stat",
        "sleep", "dd", "false", "true", "wc", "seq", "cp", "printf",
    ] {
        e.push(E::Sym(format!("bin/{a}"), "busybox".into()));
    }
    tar(&e)
}

struct Fx {
    _reg: Registry,
    _images: tempfile::TempDir,
    home: Home,
    c: Client,
    image: String,
}

fn fixture_with(config: &str) -> Fx {
    let reg = Registry::start();
    let images = tempfile::tempdir().unwrap();
    let dir = images.path().join("bb");
    oci_layout(&dir, "v1", &[(bb_layer(), "gzip")], &["PATH=/bin"], "");
    let image = reg.push(&dir);
    let home = Home::new();
    if !config.is_empty() {
        std::fs::create_dir_all(home.path.join("config")).unwrap();
        std::fs::write(home.path.join("config/config.toml"), config).unwrap();
    }
    home.start();
    let c = home.connect();
    Fx {
        _reg: reg,
        _images: images,
        home,
        c,
        image,
    }
}

fn fixture() -> Fx {
    fixture_with("")
}

/// Write `files` (path, content) under `dir`.
fn write(dir: &Path, files: &[(&str, &str)]) {
    for (p, c) in files {
        let p = dir.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, c).unwrap();
    }
}

/// A build: its reply and the progress notifications before it.
fn build(c: &mut Client, params: Value) -> (Value, Vec<Value>) {
    let r = c.request("templates/build", params);
    let mut notes = Vec::new();
    while let Some(n) = c.try_recv(Duration::from_millis(1)) {
        if n["method"] == "templates/progress" {
            notes.push(n["params"].clone());
        }
    }
    (r, notes)
}

fn ok(r: &Value) -> &Value {
    assert!(r.get("error").is_none(), "build failed: {r}");
    &r["result"]
}

/// Progress events of RUN and COPY steps: (step, cached).
fn steps(notes: &[Value]) -> Vec<(String, Option<bool>)> {
    notes
        .iter()
        .filter(|n| n.get("line").is_none())
        .filter(|n| {
            let s = n["step"].as_str().unwrap_or("");
            s.contains("] RUN") || s.contains("] COPY") || s.contains("] ADD")
        })
        .map(|n| {
            (
                n["step"].as_str().unwrap().to_owned(),
                n["cached"].as_bool(),
            )
        })
        .collect()
}

fn lines(notes: &[Value]) -> String {
    notes
        .iter()
        .filter_map(|n| n["line"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn sh(c: &mut Client, id: &str, cmd: &str) -> String {
    let r = c.sh(id, cmd);
    assert_eq!(r["exitCode"], 0, "{cmd}: {r}");
    r["stdout"].as_str().unwrap_or("").to_owned()
}

/// Every file under the store, and its size.
fn store_files(home: &Home) -> Vec<(PathBuf, u64)> {
    fn walk(d: &Path, out: &mut Vec<(PathBuf, u64)>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                walk(&e.path(), out);
            } else {
                out.push((e.path(), e.metadata().map_or(0, |m| m.len())));
            }
        }
    }
    let mut v = Vec::new();
    walk(&home.path.join("data/local/templates"), &mut v);
    v.sort();
    v
}

/// Nothing half-written: no temporary image dirs, no temporary blobs.
fn no_leftovers(home: &Home) {
    let t = home.path.join("data/local/templates");
    for d in ["images", "tmp"] {
        if let Ok(rd) = std::fs::read_dir(t.join(d)) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                assert!(
                    d == "images" && !n.contains("tmp") && !n.contains("removing"),
                    "left in the store: {d}/{n}"
                );
            }
        }
    }
}

fn names(c: &mut Client) -> Vec<String> {
    c.call("templates/list", json!({"provider": "local"}))["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

const APP: &str = r#"# syntax=docker/dockerfile:1
ARG BASE
FROM ${BASE} AS build
ARG GREETING=hello
ENV APP_HOME=/app \
    MODE=test
WORKDIR $APP_HOME
COPY --chmod=755 src/ ./src/
COPY hello.txt .
RUN echo "$GREETING from build in $MODE" > built.txt && cat built.txt
RUN ["sh", "-c", "echo exec-form > exec.txt; ls src | wc -l > count.txt"]

FROM ${BASE}
LABEL org.example.title="demo app"
EXPOSE 8080
WORKDIR /srv/out
COPY --from=build /app/built.txt /app/exec.txt /app/count.txt ./
COPY --chown=app:app hello.txt owned.txt
SHELL ["/bin/sh", "-ec"]
RUN id -u > builder-uid
USER app
RUN id -u > uid-in-run
CMD ["sh", "-c", "cat built.txt"]
"#;

#[test]
fn a_multi_stage_build_with_its_cache_dockerignore_user_and_workdir() {
    let mut fx = fixture();
    let t = tempfile::tempdir().unwrap();
    let ctx = t.path().join("ctx");
    write(
        &ctx,
        &[
            ("Dockerfile", APP),
            (".dockerignore", "**/*.log\nsrc/tmp\n!src/tmp/keep.txt\n"),
            ("hello.txt", "hello v1\n"),
            ("src/main.sh", "echo main\n"),
            ("src/lib.sh", "echo lib\n"),
            ("src/debug.log", "ignored\n"),
            ("src/tmp/scratch.txt", "ignored\n"),
            ("src/tmp/keep.txt", "kept\n"),
        ],
    );
    let params = |extra: Value| {
        let mut p = json!({
            "provider": "local", "context": ctx, "name": "demo",
            "buildArgs": {"BASE": fx.image, "GREETING": "hi"},
        });
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    // Cold.
    let (r, notes) = build(&mut fx.c, params(json!({})));
    let img = ok(&r).clone();
    assert_eq!(img["name"], "demo");
    assert_eq!(img["source"], "build");
    assert_eq!(img["config"]["workingDir"], "/srv/out", "{img}");
    assert_eq!(img["config"]["user"], "app");
    assert_eq!(img["config"]["cmd"], json!(["sh", "-c", "cat built.txt"]));
    assert_eq!(img["config"]["labels"]["org.example.title"], "demo app");
    assert_eq!(img["config"]["exposedPorts"], json!(["8080/tcp"]));
    assert!(lines(&notes).contains("hi from build in test"), "{notes:?}");
    let first: Vec<_> = steps(&notes);
    assert!(first.iter().all(|(_, c)| *c == Some(false)), "{first:?}");
    assert!(
        notes
            .iter()
            .any(|n| n["step"].as_str().unwrap().starts_with("[1/")),
        "{notes:?}"
    );
    assert!(names(&mut fx.c).contains(&"demo".to_string()));
    // The result in a sandbox: its workdir and user, the files of both stages.
    let sb =
        fx.c.create(json!({"provider": "local", "template": "demo"}));
    assert_eq!(sh(&mut fx.c, &sb, "pwd").trim(), "/srv/out");
    assert_eq!(sh(&mut fx.c, &sb, "id -u").trim(), "1000");
    assert_eq!(
        sh(&mut fx.c, &sb, "cat built.txt").trim(),
        "hi from build in test"
    );
    assert_eq!(sh(&mut fx.c, &sb, "cat exec.txt").trim(), "exec-form");
    // src/ had main.sh, lib.sh and tmp/keep.txt: debug.log and tmp/scratch.txt ignored.
    assert_eq!(sh(&mut fx.c, &sb, "cat count.txt").trim(), "3");
    assert_eq!(sh(&mut fx.c, &sb, "cat builder-uid").trim(), "0");
    assert_eq!(sh(&mut fx.c, &sb, "cat uid-in-run").trim(), "1000");
    assert_eq!(sh(&mut fx.c, &sb, "cat owned.txt"), "hello v1\n");
    fx.c.call("sandbox/kill", json!({"sandbox": sb}));
    // The first stage alone (target): .dockerignore and --chmod.
    let (r, _) = build(
        &mut fx.c,
        params(json!({"target": "build", "name": "demo-build"})),
    );
    ok(&r);
    let sb =
        fx.c.create(json!({"provider": "local", "template": "demo-build"}));
    assert_eq!(sh(&mut fx.c, &sb, "pwd").trim(), "/app");
    let ls = sh(&mut fx.c, &sb, "ls -R src");
    assert!(ls.contains("main.sh") && ls.contains("keep.txt"), "{ls}");
    assert!(
        !ls.contains("debug.log") && !ls.contains("scratch.txt"),
        "{ls}"
    );
    assert_eq!(sh(&mut fx.c, &sb, "stat -c %a src/main.sh").trim(), "755");
    fx.c.call("sandbox/kill", json!({"sandbox": sb}));

    // Warm, nothing changed: every step a cache hit, nothing new written.
    let before = store_files(&fx.home);
    let (r, notes) = build(&mut fx.c, params(json!({})));
    assert_eq!(ok(&r)["digest"], img["digest"]);
    let warm = steps(&notes);
    assert!(
        !warm.is_empty() && warm.iter().all(|(_, c)| *c == Some(true)),
        "{warm:?}"
    );
    assert!(lines(&notes).is_empty(), "a RUN ran: {notes:?}");
    let after = store_files(&fx.home);
    let new: Vec<_> = after
        .iter()
        .filter(|f| !before.contains(f) && !f.0.ends_with("names.json"))
        .collect();
    assert!(new.is_empty(), "written by a warm build: {new:?}");

    // A changed input re-runs what follows it only.
    write(&ctx, &[("hello.txt", "hello v2\n")]);
    let (r, notes) = build(&mut fx.c, params(json!({})));
    assert_ne!(ok(&r)["digest"], img["digest"]);
    let s = steps(&notes);
    let at = |needle: &str| {
        s.iter()
            .find(|(st, _)| st.contains(needle))
            .unwrap_or_else(|| panic!("{needle}: {s:?}"))
            .1
    };
    assert_eq!(at("COPY --chmod=755 src/"), Some(true), "{s:?}");
    assert_eq!(at("COPY hello.txt"), Some(false), "{s:?}");
    assert_eq!(at("RUN echo \"$GREETING"), Some(false), "{s:?}");
    assert_eq!(at("COPY --chown"), Some(false), "{s:?}");
    let sb =
        fx.c.create(json!({"provider": "local", "template": "demo"}));
    assert_eq!(sh(&mut fx.c, &sb, "cat owned.txt"), "hello v2\n");
    fx.c.call("sandbox/kill", json!({"sandbox": sb}));

    // noCache: every step runs again.
    let (r, notes) = build(&mut fx.c, params(json!({"noCache": true})));
    ok(&r);
    assert!(
        steps(&notes).iter().all(|(_, c)| *c == Some(false)),
        "{notes:?}"
    );
    no_leftovers(&fx.home);
    // The steps are not templates of their own.
    let n = names(&mut fx.c);
    assert!(!n.iter().any(|x| x.contains("step")), "{n:?}");
}

#[test]
fn a_failing_step_names_its_line_and_code_and_keeps_the_steps_before() {
    let mut fx = fixture();
    let t = tempfile::tempdir().unwrap();
    let ctx = t.path().join("ctx");
    let df = "ARG BASE\nFROM $BASE\nRUN echo one > /one.txt\nRUN echo about to fail && exit 3\nRUN echo never\n";
    write(&ctx, &[("Dockerfile", df)]);
    let p = json!({"provider": "local", "context": ctx, "name": "bad", "buildArgs": {"BASE": fx.image}});
    let (r, notes) = build(&mut fx.c, p.clone());
    let e = &r["error"];
    assert_eq!(abx_code(e), "E2011", "{r}");
    let m = e["message"].as_str().unwrap();
    assert!(
        m.contains("[3/4] RUN echo about to fail") && m.contains("line 4"),
        "{m}"
    );
    assert!(m.contains("code 3") && m.contains("about to fail"), "{m}");
    assert!(!lines(&notes).contains("never"));
    assert!(!names(&mut fx.c).contains(&"bad".to_string()));
    no_leftovers(&fx.home);
    assert_eq!(
        fx.c.call("sandbox/list", json!({"provider": "local"}))["sandboxes"],
        json!([])
    );
    // Fixed: the step before the failure is a cache hit.
    write(&ctx, &[("Dockerfile", &df.replace("exit 3", "true"))]);
    let (r, notes) = build(&mut fx.c, p);
    ok(&r);
    let s = steps(&notes);
    assert_eq!(s[0].1, Some(true), "{s:?}");
    assert_eq!(s[1].1, Some(false), "{s:?}");
}

#[test]
fn cancelling_a_build_leaves_the_store_as_it_was() {
    let mut fx = fixture();
    let t = tempfile::tempdir().unwrap();
    let ctx = t.path().join("ctx");
    write(
        &ctx,
        &[("Dockerfile", "ARG BASE\nFROM $BASE\nRUN echo warm\n")],
    );
    let base = json!({"BASE": fx.image});
    ok(&build(
        &mut fx.c,
        json!({"provider": "local", "context": ctx, "name": "w", "buildArgs": base}),
    )
    .0);
    let before = store_files(&fx.home);
    write(
        &ctx,
        &[
            ("Dockerfile", "ARG BASE\nFROM $BASE\nCOPY data.txt /data.txt\nRUN echo made > /made.txt\nRUN echo started && sleep 600\n"),
            ("data.txt", "new data\n"),
        ],
    );
    fx.c.send(
        &json!({"jsonrpc": "2.0", "id": 777, "method": "templates/build",
            "params": {"provider": "local", "context": ctx, "name": "cancelled", "buildArgs": base}})
        .to_string(),
    );
    loop {
        let n = fx.c.recv();
        assert!(n.get("id").is_none(), "answered before the cancel: {n}");
        if n["params"]["line"] == "started" {
            break;
        }
    }
    fx.c.send(
        &json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 777}}).to_string(),
    );
    loop {
        let n = fx.c.recv();
        if n["id"] == 777 {
            assert_eq!(n["error"]["code"], -32800, "{n}");
            break;
        }
    }
    let home = &fx.home;
    wait_until("the store is as it was", Duration::from_secs(30), || {
        store_files(home) == before
    });
    wait_until("no sandbox is left", Duration::from_secs(30), || {
        fx.c.call("sandbox/list", json!({"provider": "local"}))["sandboxes"] == json!([])
    });
    assert!(!names(&mut fx.c).contains(&"cancelled".to_string()));
}

#[test]
fn bad_input_gets_an_e_code_and_leaves_nothing_half_written() {
    let mut fx = fixture_with("[local]\ntemplate_max_bytes = \"8M\"\n");
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    write(&outside, &[("secret.txt", "secret\n")]);
    let base = json!({"BASE": fx.image});
    let mut case = |name: &str, df: &str, files: &[(&str, &str)], prep: &dyn Fn(&Path)| -> Value {
        let ctx = t.path().join(name);
        write(&ctx, &[("Dockerfile", df)]);
        write(&ctx, files);
        prep(&ctx);
        let (r, _) = build(
            &mut fx.c,
            json!({"provider": "local", "context": ctx, "name": name, "buildArgs": base}),
        );
        assert!(r.get("error").is_some(), "{name}: {r}");
        r["error"].clone()
    };
    let none = |_: &Path| {};
    let e = case(
        "dotdot",
        "ARG BASE\nFROM $BASE\nCOPY ../outside/secret.txt /s\n",
        &[],
        &none,
    );
    assert_eq!(abx_code(&e), "E2013", "{e}");
    let e = case(
        "linkout",
        "ARG BASE\nFROM $BASE\nCOPY link/secret.txt /s\n",
        &[],
        &|c: &Path| {
            std::os::unix::fs::symlink(t.path().join("outside"), c.join("link")).unwrap();
        },
    );
    assert_eq!(abx_code(&e), "E2013", "{e}");
    let e = case(
        "linkin",
        "ARG BASE\nFROM $BASE\nCOPY dir /d\n",
        &[("dir/a.txt", "a")],
        &|c: &Path| {
            std::os::unix::fs::symlink("../../outside/secret.txt", c.join("dir/s")).unwrap();
        },
    );
    assert_eq!(abx_code(&e), "E2013", "{e}");
    let e = case(
        "unsupported",
        "ARG BASE\nFROM $BASE\n\nHEALTHCHECK CMD true\n",
        &[],
        &none,
    );
    assert_eq!(abx_code(&e), "E2012", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("line 4")
            && e["message"].as_str().unwrap().contains("HEALTHCHECK"),
        "{e}"
    );
    let e = case(
        "cycle",
        "ARG BASE\nFROM $BASE AS a\nCOPY --from=b /x /x\nFROM $BASE AS b\nCOPY --from=a /y /y\n",
        &[],
        &none,
    );
    assert_eq!(abx_code(&e), "E2012", "{e}");
    assert!(e["message"].as_str().unwrap().contains("cycle"), "{e}");
    // A context over the cap (8 MiB).
    let e = case(
        "huge",
        "ARG BASE\nFROM $BASE\nCOPY . /ctx/\n",
        &[],
        &|c: &Path| {
            std::fs::write(c.join("big.bin"), vec![7u8; 12 << 20]).unwrap();
        },
    );
    assert_eq!(abx_code(&e), "E2013", "{e}");
    // A decompression bomb in ADD: 64 MiB of zeros, about 64 KiB gzipped.
    let e = case(
        "bomb",
        "ARG BASE\nFROM $BASE\nADD bomb.tar.gz /b/\n",
        &[],
        &|c: &Path| {
            let tarball = tar(&[E::File("zeros".into(), vec![0u8; 64 << 20], 0o644)]);
            std::fs::write(c.join("bomb.tar.gz"), compress("gzip", &tarball)).unwrap();
        },
    );
    assert_eq!(abx_code(&e), "E2013", "{e}");
    // A RUN that writes more than the store takes.
    let e = case(
        "fill",
        "ARG BASE\nFROM $BASE\nRUN dd if=/dev/zero of=/big bs=1048576 count=16\n",
        &[],
        &none,
    );
    assert_eq!(abx_code(&e), "E2011", "{e}");
    no_leftovers(&fx.home);
    let n = names(&mut fx.c);
    for bad in [
        "dotdot",
        "linkout",
        "linkin",
        "unsupported",
        "cycle",
        "huge",
        "bomb",
        "fill",
    ] {
        assert!(!n.contains(&bad.to_string()), "{bad} stored: {n:?}");
    }
    // An ADD of a tar that fits is unpacked.
    let ctx = t.path().join("add");
    write(
        &ctx,
        &[(
            "Dockerfile",
            "ARG BASE\nFROM $BASE\nADD small.tar /unpacked/\n",
        )],
    );
    std::fs::write(
        ctx.join("small.tar"),
        tar(&[
            E::Dir("d"),
            E::File("d/f.txt".into(), b"in the tar\n".to_vec(), 0o644),
        ]),
    )
    .unwrap();
    ok(&build(
        &mut fx.c,
        json!({"provider": "local", "context": ctx, "name": "added", "buildArgs": base}),
    )
    .0);
    let sb =
        fx.c.create(json!({"provider": "local", "template": "added"}));
    assert_eq!(sh(&mut fx.c, &sb, "cat /unpacked/d/f.txt"), "in the tar\n");
    // commands/run on local: served (no named commands), not E8004.
    let e =
        fx.c.call_err("commands/run", json!({"sandbox": sb, "name": "hello"}));
    assert_eq!(e["code"], -32602, "{e}");
}
