//! `abx template init` and `abx template build DIR -t NAME` (issue 49) end to end: the real
//! `abx` against a real daemon. `init` writes a scaffold whose FROM is an image of the store
//! (one imported here, built from `busybox-static`) or one the user is told to pull; a
//! Dockerfile build prints its steps as `docker build` does, caches, takes `-f` and
//! `--build-arg`, maps its E-code to the exit code, and Ctrl-C cancels it; `abx template build
//! SANDBOX NAME` still saves a sandbox.

mod images;

use abx_tests::{wait_until, Home};
use images::*;
use serde_json::Value;
use std::io::Read;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: Output, what: &str) -> Output {
    assert!(
        o.status.success(),
        "{what}: exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        stdout(&o),
        stderr(&o)
    );
    o
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(o), stderr(o)))
}

/// A busybox image (the shared test layout) imported as `name`.
fn import_busybox(home: &Home, name: &str) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("bb");
    oci_layout(&dir, "v1", &[(base_layer(), "gzip")], &["PATH=/bin"], "");
    ok(
        home.run(&["template", "import", dir.to_str().unwrap(), name]),
        "template import",
    );
}

fn template_names(home: &Home) -> Vec<String> {
    let l = json_of(&ok(home.run(&["-j", "template", "list"]), "template list"));
    l["templates"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["names"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect()
}

// ---- help and parsing (no daemon) ----

#[test]
fn template_help_shows_the_dockerfile_build_the_sandbox_form_and_init() {
    let home = Home::new();
    let h = stdout(&ok(home.run(&["template", "--help"]), "template --help"));
    assert!(h.contains("build") && h.contains("init"), "{h}");
    let b = stdout(&ok(
        home.run(&["template", "build", "--help"]),
        "template build --help",
    ));
    for want in [
        "abx template build <DIR> -t <NAME>",
        "abx template build <SANDBOX> <NAME>",
        "--build-arg",
        "--no-cache",
        "--network",
        "--target",
        "-f, --file",
        "-t, --tag",
    ] {
        assert!(b.contains(want), "{want} missing from:\n{b}");
    }
    let i = stdout(&ok(
        home.run(&["template", "init", "--help"]),
        "template init --help",
    ));
    for want in [
        "abx template init <LANGUAGE> [DIR]",
        "python, node, go, rust, java, shell",
        "--force",
    ] {
        assert!(i.contains(want), "{want} missing from:\n{i}");
    }
    // No name for a sandbox to be saved as: a usage error before any daemon is asked.
    let o = home.run(&["template", "build", "no-such-dir-or-sandbox"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A context with no -t: the name is asked for.
    let d = tempfile::tempdir().unwrap();
    let o = home.run(&["template", "build", d.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("-t NAME"), "{}", stderr(&o));
    // -t on something that is no directory: a local error, exit 1.
    let o = home.run(&["template", "build", "/nonexistent/ctx", "-t", "x"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).starts_with("[E4009]"), "{}", stderr(&o));
    assert!(
        !home.socket().exists(),
        "parsing errors never started a daemon"
    );
}

// ---- init ----

#[test]
fn init_writes_a_scaffold_names_the_pull_refuses_to_overwrite_and_lists_languages() {
    let home = Home::new();
    home.start();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("py-app");
    let d = dir.to_str().unwrap();
    let o = ok(home.run(&["template", "init", "python", d]), "init python");
    let out = stdout(&o);
    assert!(
        out.starts_with(&format!(
            "Template 'python' created in {d}\nCreated files:\n  Dockerfile\n  README.md\n"
        )),
        "{out}"
    );
    assert!(out.contains("Next steps:"), "{out}");
    assert!(
        out.contains("  abx template pull python:3.12-slim"),
        "{out}"
    );
    assert!(
        out.contains(&format!("  abx template build {d} -t py-app")),
        "{out}"
    );
    let df = std::fs::read_to_string(dir.join("Dockerfile")).unwrap();
    assert!(df.lines().any(|l| l == "FROM python:3.12-slim"), "{df}");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(
        readme.contains("abx template pull python:3.12-slim"),
        "{readme}"
    );
    assert!(readme.contains("abx template build"), "{readme}");

    // Never overwritten without --force: E4006 names the file, nothing is written.
    std::fs::write(dir.join("Dockerfile"), "FROM mine\n").unwrap();
    let o = home.run(&["template", "init", "python", d]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with(&format!("[E4006] '{d}/Dockerfile' already exists.")),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(dir.join("Dockerfile")).unwrap(),
        "FROM mine\n"
    );
    // -j: the result whole; --force overwrites.
    let j = json_of(&ok(
        home.run(&["-j", "template", "init", "python", d, "--force"]),
        "init --force",
    ));
    assert_eq!(j["path"], d, "{j}");
    assert_eq!(j["from"], "python:3.12-slim", "{j}");
    assert!(j["hint"]
        .as_str()
        .unwrap()
        .contains("abx template pull python:3.12-slim"));
    assert_eq!(
        j["files"],
        serde_json::json!([format!("{d}/Dockerfile"), format!("{d}/README.md")])
    );
    assert!(std::fs::read_to_string(dir.join("Dockerfile"))
        .unwrap()
        .contains("FROM python:3.12-slim"));

    // An unknown language: E1004 listing the ones there are (exit 2), nothing written.
    let o = home.run(&[
        "template",
        "init",
        "cobol",
        t.path().join("c").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).starts_with("[E1004]"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("python, node, go, rust, java, shell"),
        "{}",
        stderr(&o)
    );
    assert!(!t.path().join("c").exists());

    // The reference's form: --template LANGUAGE into ./LANGUAGE of the working directory.
    let o = ok(
        home.abx()
            .current_dir(t.path())
            .args(["template", "init", "--template", "node"])
            .output()
            .unwrap(),
        "init --template node",
    );
    assert!(
        stdout(&o).contains("Template 'node' created in"),
        "{}",
        stdout(&o)
    );
    let df = std::fs::read_to_string(t.path().join("node/Dockerfile")).unwrap();
    assert!(df.contains("FROM node:22-slim"), "{df}");
}

#[test]
fn init_names_an_image_of_the_store_when_one_fits() {
    let home = Home::new();
    home.start();
    import_busybox(&home, "python:3.11");
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("py");
    let j = json_of(&ok(
        home.run(&["-j", "template", "init", "python", d.to_str().unwrap()]),
        "init python",
    ));
    assert_eq!(j["from"], "python:3.11", "{j}");
    assert!(j.get("hint").is_none(), "{j}");
    let df = std::fs::read_to_string(d.join("Dockerfile")).unwrap();
    assert!(df.lines().any(|l| l == "FROM python:3.11"), "{df}");
    let out = stdout(&ok(
        home.run(&["template", "init", "python", d.to_str().unwrap(), "--force"]),
        "init again",
    ));
    assert!(
        out.contains("FROM python:3.11 (in the broker's store)"),
        "{out}"
    );
    assert!(!out.contains("template pull"), "{out}");
}

// ---- Dockerfile builds ----

/// A context: `hello.txt`, a `Dockerfile` on the imported busybox image.
fn context(dir: &Path, dockerfile: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("hello.txt"), "hello from the context\n").unwrap();
    std::fs::write(dir.join("Dockerfile"), dockerfile).unwrap();
}

#[test]
fn a_dockerfile_build_prints_docker_steps_caches_and_takes_build_args_and_a_file() {
    let home = Home::new();
    home.start();
    import_busybox(&home, "test/bb:1");
    let t = tempfile::tempdir().unwrap();
    let ctx = t.path().join("ctx");
    context(
        &ctx,
        "FROM test/bb:1\nARG MSG=default\nCOPY hello.txt /srv/hello.txt\nRUN echo \"msg=$MSG\" && echo \"msg=$MSG\" > /srv/msg.txt\n",
    );
    let c = ctx.to_str().unwrap();
    let o = ok(
        home.run(&[
            "template",
            "build",
            c,
            "-t",
            "cli/app:1",
            "--build-arg",
            "MSG=hi",
        ]),
        "build",
    );
    let err = stderr(&o);
    assert!(err.contains("COPY hello.txt /srv/hello.txt"), "{err}");
    let run_at = err
        .lines()
        .position(|l| l.ends_with("RUN echo \"msg=$MSG\" && echo \"msg=$MSG\" > /srv/msg.txt"))
        .unwrap_or_else(|| panic!("no RUN step in:\n{err}"));
    assert!(
        err.lines().nth(run_at).unwrap().starts_with('['),
        "a step as docker names it, [N/M] ...: {err}"
    );
    assert!(
        err.lines().skip(run_at).any(|l| l == "  msg=hi"),
        "the RUN's output, indented under its step: {err}"
    );
    assert!(
        stdout(&o).starts_with("Built template 'cli/app:1' ("),
        "{}",
        stdout(&o)
    );
    assert!(template_names(&home).contains(&"cli/app:1".to_owned()));
    let sb = json_of(&ok(
        home.run(&["-j", "create", "--template", "cli/app:1"]),
        "create",
    ));
    let id = sb["id"].as_str().unwrap();
    let cat = ok(
        home.run(&["exec", id, "cat /srv/hello.txt /srv/msg.txt"]),
        "exec",
    );
    assert_eq!(stdout(&cat), "hello from the context\nmsg=hi\n");
    ok(home.run(&["kill", id, "--yes"]), "kill");

    // The same build again: every step a cache hit, said as docker says it. -j: the
    // TemplateInfo on stdout, no progress.
    let o = ok(
        home.run(&[
            "template",
            "build",
            c,
            "-t",
            "cli/app:1",
            "--build-arg",
            "MSG=hi",
        ]),
        "build again",
    );
    assert!(
        stderr(&o).lines().any(|l| l.starts_with("CACHED [")),
        "{}",
        stderr(&o)
    );
    let j = json_of(&ok(
        home.run(&["-j", "template", "build", c, "-t", "cli/app:2"]),
        "build -j",
    ));
    assert_eq!(j["name"], "cli/app:2", "{j}");
    assert!(j["digest"].as_str().unwrap().starts_with("sha256:"), "{j}");

    // -f: a Dockerfile elsewhere in the context (a path from here), and a build-arg default.
    std::fs::create_dir_all(ctx.join("docker")).unwrap();
    std::fs::write(
        ctx.join("docker/Alt.Dockerfile"),
        "FROM test/bb:1\nARG MSG=alt-default\nRUN echo \"$MSG\" > /srv/alt.txt\n",
    )
    .unwrap();
    let alt = ctx.join("docker/Alt.Dockerfile");
    ok(
        home.run(&[
            "template",
            "build",
            c,
            "-t",
            "cli/alt:1",
            "-f",
            alt.to_str().unwrap(),
        ]),
        "build -f",
    );
    let sb = json_of(&ok(
        home.run(&["-j", "create", "--template", "cli/alt:1"]),
        "create alt",
    ));
    let id = sb["id"].as_str().unwrap();
    assert_eq!(
        stdout(&ok(home.run(&["exec", id, "cat /srv/alt.txt"]), "exec alt")),
        "alt-default\n"
    );
    ok(home.run(&["kill", id, "--yes"]), "kill alt");
}

#[test]
fn a_failing_or_invalid_build_exits_with_its_e_code_and_stores_nothing() {
    let home = Home::new();
    home.start();
    import_busybox(&home, "test/bb:1");
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join("bad");
    context(&bad, "FROM test/bb:1\nFROBNICATE everything\n");
    let o = home.run(&[
        "template",
        "build",
        bad.to_str().unwrap(),
        "-t",
        "cli/bad:1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("[E2012]"), "{}", stderr(&o));
    let fails = t.path().join("fails");
    context(&fails, "FROM test/bb:1\nRUN echo about-to-fail && exit 3\n");
    let o = home.run(&[
        "template",
        "build",
        fails.to_str().unwrap(),
        "-t",
        "cli/fails:1",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("  about-to-fail"), "{err}");
    assert!(err.contains("[E2011]"), "{err}");
    let names = template_names(&home);
    assert!(
        !names.iter().any(|n| n.starts_with("cli/")),
        "nothing stored: {names:?}"
    );
}

#[test]
fn ctrl_c_cancels_a_build_and_nothing_is_stored() {
    let home = Home::new();
    home.start();
    import_busybox(&home, "test/bb:1");
    let t = tempfile::tempdir().unwrap();
    let ctx = t.path().join("slow");
    context(
        &ctx,
        "FROM test/bb:1\nRUN echo started-sleeping && busybox sleep 600\n",
    );
    let mut child = home
        .abx()
        .args([
            "template",
            "build",
            ctx.to_str().unwrap(),
            "-t",
            "cli/slow:1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().unwrap();
    let s2 = seen.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            s2.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    wait_until("the RUN step started", Duration::from_secs(120), || {
        seen.lock().unwrap().contains("  started-sleeping")
    });
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let text = seen.lock().unwrap().clone();
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("cancelled"), "{text}");
    assert!(!template_names(&home).contains(&"cli/slow:1".to_owned()));
    // The broker is free for the next build (the cancelled one does not hold the store).
    let quick = t.path().join("quick");
    context(&quick, "FROM test/bb:1\nCOPY hello.txt /hello.txt\n");
    ok(
        home.run(&[
            "template",
            "build",
            quick.to_str().unwrap(),
            "-t",
            "cli/quick:1",
        ]),
        "build after a cancel",
    );
}

#[test]
fn the_sandbox_form_still_saves_a_sandbox() {
    let home = Home::new();
    home.start();
    import_busybox(&home, "test/bb:1");
    let sb = json_of(&ok(
        home.run(&["-j", "create", "--template", "test/bb:1"]),
        "create",
    ));
    let id = sb["id"].as_str().unwrap();
    ok(
        home.run(&["exec", id, "echo saved > /srv/saved.txt"]),
        "exec",
    );
    ok(
        home.run(&["template", "build", id, "cli/saved:1"]),
        "build SANDBOX NAME",
    );
    assert!(template_names(&home).contains(&"cli/saved:1".to_owned()));
    // An unknown sandbox is the sandbox form's error: E2009, exit 4.
    let o = home.run(&["template", "build", "sb-0000000000000000", "cli/none:1"]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    ok(home.run(&["kill", id, "--yes"]), "kill");
}
