//! The seed's sections 1 to 3 through the real `abx` binary: install refusals, pinned
//! install, list, info, doctor, use, kill, tamper, old manifest name, uninstall, templates.

use serde_json::Value;
use std::path::Path;

use abx_tests::fixtures::{copy_dir, fixture, git};
use abx_tests::Home;

struct Run {
    code: i32,
    out: String,
    err: String,
}

fn abx(home: &Home, args: &[&str]) -> Run {
    abx_with(home, &[], args)
}

fn abx_with(home: &Home, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut c = home.abx();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    Run {
        code: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

#[test]
fn seed_sections_one_to_three() {
    let home = Home::new();
    let repo = tempfile::tempdir().unwrap();
    copy_dir(&fixture("py-local"), &repo.path().join("opensandbox"));
    git(repo.path(), &["init", "-q", "-b", "main"]);
    git(repo.path(), &["add", "-A"]);
    git(repo.path(), &["commit", "-q", "-m", "p"]);
    let commit = git(repo.path(), &["rev-parse", "HEAD"]);
    let url = format!("file://{}", repo.path().display());

    // 1. A moving ref is refused even with --yes.
    let r = abx(
        &home,
        &[
            "provider",
            "install",
            &url,
            "--subdir",
            "opensandbox",
            "--allow-insecure-transport",
            "--yes",
        ],
    );
    assert_eq!(r.code, 2, "{}", r.err);
    assert_eq!(
        r.err,
        format!("[E8012] Refusing an unpinned git source without review (--yes does not accept a moving ref).\n  Suggestion: Pin it: --ref {commit} (or --sha256 <digest>); or pass --allow-unpinned to accept the current head.\n")
    );
    // Without --yes and without a terminal: the exact re-run command, every flag kept.
    let r = abx(
        &home,
        &[
            "provider",
            "install",
            &url,
            "--subdir",
            "opensandbox",
            "--ref",
            &commit,
            "--allow-insecure-transport",
        ],
    );
    assert_eq!(r.code, 2);
    assert!(r.err.starts_with("[E8012] Installing a provider requires confirmation.\n  Suggestion: Re-run with --yes after reviewing: abx provider install "), "{}", r.err);
    assert!(
        r.err.contains("--subdir opensandbox") && r.err.contains(&format!("--ref {commit}")),
        "{}",
        r.err
    );
    // Pinned.
    let r = abx(
        &home,
        &[
            "provider",
            "install",
            &url,
            "--subdir",
            "opensandbox",
            "--ref",
            &commit,
            "--allow-insecure-transport",
            "--yes",
        ],
    );
    assert_eq!(
        (r.code, r.out.as_str()),
        (0, "Installed provider 'py-local' 0.1.0 (pinned)\n"),
        "{}",
        r.err
    );
    // list: the Features column is never cut when piped.
    let r = abx(&home, &["provider", "list"]);
    assert!(
        r.out.contains(
            "sandbox(lifecycle,timeout) exec(run,stream) process(manage) files(rw) sessions"
        ),
        "{}",
        r.out
    );
    assert!(!r.out.contains('…'));
    assert!(r.out.contains("│ local "), "{}", r.out);
    // doctor.
    let r = abx(&home, &["provider", "doctor", "py-local"]);
    assert_eq!(r.code, 0, "{}", r.out);
    let lines: Vec<&str> = r.out.lines().collect();
    assert_eq!(lines[0], "ok    installed  Python local (fixture) 0.1.0");
    assert!(
        lines[1].starts_with("ok    integrity  ")
            && lines[1].len() == "ok    integrity  ".len() + 16,
        "{}",
        lines[1]
    );
    assert_eq!(lines[2], "ok    config");
    assert_eq!(lines[3], "ok    handshake");
    // info.
    let r = abx(&home, &["provider", "info", "py-local"]);
    for key in [
        "ID ",
        "Name ",
        "Version ",
        "Kind ",
        "Default ",
        "Trust ",
        "Features ",
        "Config ",
        "Inherits ",
        "Source ",
        "Commit ",
        "Digest ",
        "Runtime ",
        "Security ",
        "Installed ",
    ] {
        assert!(
            r.out.lines().any(|l| l.starts_with(key)),
            "{key} missing:\n{}",
            r.out
        );
    }
    assert!(r.out.contains("token (secret)"), "{}", r.out);
    assert!(
        r.out.contains("Runtime    python3 ./provider.py")
            || r.out.contains("python3 ./provider.py")
    );
    assert!(r.out.contains(&format!("Commit     {commit}")) || r.out.contains(&commit));

    // 2. Lifecycle with ABX_PROVIDER.
    let env = [("ABX_PROVIDER", "py-local")];
    let r = abx_with(&home, &env, &["-j", "create", "--timeout", "600"]);
    assert_eq!(r.code, 0, "{}", r.err);
    let v: Value = serde_json::from_str(&r.out).unwrap();
    let id = v["id"].as_str().unwrap().to_owned();
    assert_eq!(v["provider"], "py-local");
    let r = abx_with(&home, &env, &["info", &id]);
    assert!(
        r.out.starts_with(&format!("ID        py-local:{id}\n")),
        "{}",
        r.out
    );
    assert!(r.out.contains("Timeout   600s"));
    let r = abx_with(
        &home,
        &env,
        &["exec", &id, "echo hello-from-osb; echo err >&2; exit 3"],
    );
    assert_eq!(
        (r.code, r.out.as_str(), r.err.as_str()),
        (3, "hello-from-osb\n", "err\n")
    );
    let tmp = tempfile::tempdir().unwrap();
    let up = tmp.path().join("up2.bin");
    std::fs::write(
        &up,
        (0..3000u32)
            .map(|i| (i * 7 % 256) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let r = abx_with(
        &home,
        &env,
        &["upload", &id, up.to_str().unwrap(), "/workspace/up2.bin"],
    );
    assert_eq!(r.code, 0, "{}", r.err);
    let down = tmp.path().join("down2.bin");
    let r = abx_with(
        &home,
        &env,
        &[
            "download",
            &id,
            "/workspace/up2.bin",
            down.to_str().unwrap(),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(std::fs::read(&up).unwrap(), std::fs::read(&down).unwrap());
    let r = abx_with(&home, &env, &["sandbox", "capabilities", &id]);
    assert!(!r.out.contains("code"), "{}", r.out);
    let r = abx_with(&home, &env, &["sandbox", "command", "run", &id, "anything"]);
    assert_eq!(r.code, 1);
    assert!(
        r.err
            .starts_with("[E8004] Provider 'py-local' does not support 'templates.read'."),
        "{}",
        r.err
    );
    let r = abx_with(&home, &env, &["kill", &id]);
    assert_eq!(r.code, 2, "no terminal, no --yes: refused");
    let r = abx_with(&home, &env, &["kill", &id, "--yes"]);
    assert_eq!(r.code, 0);
    let r = abx_with(&home, &env, &["info", &id]);
    assert_eq!(r.code, 4);
    assert!(r.err.starts_with("[E2009] "), "{}", r.err);
    let r = abx_with(&home, &env, &["kill", &id, "--yes"]);
    assert_eq!(r.code, 0, "kill is idempotent");
    // Templates are gated (the seed's open problem).
    let r = abx_with(&home, &env, &["template", "init", "python"]);
    assert_eq!(r.code, 1);
    assert!(
        r.err
            .starts_with("[E8004] Provider 'py-local' does not support 'templates.read'."),
        "{}",
        r.err
    );

    // 3. The old manifest name.
    let old = tempfile::tempdir().unwrap();
    copy_dir(&fixture("py-local"), old.path());
    std::fs::rename(
        old.path().join("abx-provider.toml"),
        old.path().join("ebx-provider.toml"),
    )
    .unwrap();
    let r = abx(
        &home,
        &["provider", "install", old.path().to_str().unwrap(), "--yes"],
    );
    assert_eq!(r.code, 1);
    assert_eq!(
        r.err,
        "[E8014] Invalid abx-provider.toml: file not found at the plugin root.\n  Suggestion: This plugin still uses the pre-rename 'ebx-provider.toml'. Rename it to abx-provider.toml and rename its EBX_* variables to ABX_* (the plugin's maintainer must publish the update).\n"
    );
    // Tamper: doctor fails integrity; every provider command is E8011 before the plugin runs.
    let r = abx(&home, &["-j", "provider", "info", "py-local"]);
    let path = serde_json::from_str::<Value>(&r.out).unwrap()["path"]
        .as_str()
        .unwrap()
        .to_owned();
    let f = Path::new(&path).join("provider.py");
    std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::write(&f, "# tampered\n").unwrap();
    let r = abx(&home, &["provider", "doctor", "py-local"]);
    assert_eq!(r.code, 1);
    assert!(
        r.out
            .contains("fail  integrity  Provider 'py-local': files changed since install."),
        "{}",
        r.out
    );
    let r = abx(&home, &["-j", "--provider", "py-local", "sandbox", "list"]);
    assert_eq!(r.code, 1);
    let v: Value = serde_json::from_str(&r.out).unwrap();
    assert_eq!(
        (v["status"].clone(), v["code"].clone()),
        (Value::from("error"), Value::from("E8011"))
    );
    assert_eq!(
        v["message"],
        "Provider 'py-local': files changed since install."
    );
    assert_eq!(
        v["suggestion"],
        "Reinstall or run 'abx provider update py-local'."
    );
    // update repairs it from the pinned source.
    let r = abx(&home, &["provider", "update", "py-local"]);
    assert_eq!(r.code, 0, "{} {}", r.out, r.err);
    let r = abx(&home, &["provider", "doctor", "py-local"]);
    assert_eq!(r.code, 0, "{}", r.out);
    let r = abx(&home, &["provider", "update", "--check"]);
    assert_eq!(r.out, "All providers are up to date.\n");
    // Uninstall.
    let r = abx(&home, &["provider", "uninstall", "py-local", "--yes"]);
    assert_eq!(
        (r.code, r.out.as_str()),
        (0, "Removed provider 'py-local'\n")
    );
    let r = abx(&home, &["provider", "info", "py-local"]);
    assert_eq!(r.code, 4);
    let r = abx(&home, &["provider", "list", "-q"]);
    assert_eq!(r.code, 2);
}

/// Issue 21: `abx exec` and `abx run` on a provider without `exec.stream` run the command
/// with `exec/run` (output at the end) instead of failing with E8004, and say so once.
#[test]
fn exec_and_run_fall_back_to_exec_run_without_exec_stream() {
    use abx_tests::fixtures::{install_without, plugin_sandbox};
    use serde_json::json;
    let home = Home::new();
    home.start();
    let mut c = home.connect();
    let _repo = install_without(&mut c, "py-local", "exec.stream");
    let (_, full) = plugin_sandbox(&mut c, "py-local");
    let e = c.call_err("exec/start", json!({"sandbox": full, "command": "true"}));
    assert_eq!(abx_tests::abx_code(&e), "E8004", "{e}");
    let note = "running with exec/run instead";

    let r = abx(&home, &["exec", &full, "echo out; echo err >&2; exit 3"]);
    assert_eq!(r.code, 3, "stdout {:?} stderr {:?}", r.out, r.err);
    assert_eq!(r.out, "out\n");
    assert!(r.err.contains("err\n"), "{}", r.err);
    assert_eq!(r.err.matches(note).count(), 1, "{}", r.err);
    assert!(!r.err.contains("E8004"), "{}", r.err);

    // Piped stdin reaches the command.
    let o = home.run_with_input(&["exec", &full, "tr a-z A-Z"], b"piped\n");
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "PIPED\n");

    // `abx run`: a throwaway sandbox on the provider, the same fallback, and no sandbox left.
    let r = abx(
        &home,
        &[
            "--provider",
            "py-local",
            "run",
            "--",
            "echo via-run; exit 4",
        ],
    );
    assert_eq!(r.code, 4, "stdout {:?} stderr {:?}", r.out, r.err);
    assert_eq!(r.out, "via-run\n");
    assert_eq!(r.err.matches(note).count(), 1, "{}", r.err);
    c.call("sandbox/kill", json!({"sandbox": full}));
    let list = c.call("sandbox/list", json!({"provider": "py-local"}));
    assert_eq!(list["sandboxes"], json!([]), "{list}");
}
