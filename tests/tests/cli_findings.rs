//! What new users found in the CLI (issue 45, "CLI and MCP (new users)"), through the real
//! `abx` binary and a real daemon.

use abx_tests::fixtures::{install_pinned, started};
use abx_tests::Home;
use serde_json::{json, Value};

struct Run {
    code: i32,
    out: String,
    err: String,
}

fn abx(home: &Home, args: &[&str]) -> Run {
    let o = home.abx().args(args).output().unwrap();
    Run {
        code: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn show(r: &Run) -> String {
    format!("exit {}\nstdout:\n{}\nstderr:\n{}", r.code, r.out, r.err)
}

/// Item 3: a provider's exit code of -1 (or 256) is not a success: `abx exec` exits 1 and
/// says which provider sent what; a stream that ends with the plugin's crash notice is
/// printed as an error (E8007 and its suggestion), not a silent exit 1.
#[test]
fn a_providers_bad_exit_is_an_error_never_a_success() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "bad-exit");
    let r = abx(&home, &["exec", "bad-exit:s1", "echo", "hi"]);
    assert_eq!(r.code, 1, "{}", show(&r));
    assert_eq!(r.out, "hello\n", "{}", show(&r));
    assert!(
        r.err
            .contains("[E8009] Provider 'bad-exit' sent an invalid reply: exit code -1")
            && r.err.contains("  Suggestion: "),
        "{}",
        show(&r)
    );
    // -j (exec/run): the result as it came, and the same error on stderr.
    let r = abx(&home, &["-j", "exec", "bad-exit:s1", "true"]);
    assert_eq!(r.code, 1, "{}", show(&r));
    let v: Value = serde_json::from_str(&r.out).unwrap();
    assert_eq!(v["exitCode"], json!(-1), "{}", show(&r));
    assert!(r.err.contains("[E8009]"), "{}", show(&r));

    for how in ["256", "none"] {
        c.call(
            "provider/configure",
            json!({"id": "bad-exit", "values": {"exit": how}}),
        );
        let r = abx(&home, &["exec", "bad-exit:s1", "true"]);
        assert_eq!(r.code, 1, "{how}: {}", show(&r));
        assert!(r.err.contains("[E8009]"), "{how}: {}", show(&r));
    }

    // The plugin dies in the middle of the stream: the broker's crash notice ends it.
    let r = abx(&home, &["provider", "configure", "bad-exit", "exit=crash"]);
    assert_eq!(r.code, 0, "{}", show(&r));
    let r = abx(&home, &["exec", "bad-exit:s1", "true"]);
    assert_eq!(r.code, 1, "{}", show(&r));
    assert!(
        r.err.contains("[E8007] Provider 'bad-exit' crashed")
            && r.err.contains("  Suggestion: ")
            && r.err.contains("abx provider doctor bad-exit"),
        "{}",
        show(&r)
    );
}

/// Item 8: `abx template import --help` is the import's own help, not the group's.
#[test]
fn each_template_action_has_its_own_help() {
    let home = Home::new();
    let r = abx(&home, &["template", "import", "--help"]);
    assert_eq!(r.code, 0, "{}", show(&r));
    assert!(
        r.out
            .contains("Usage: abx template import [OPTIONS] <PATH> [NAME]")
            && r.out.contains("docker save"),
        "{}",
        show(&r)
    );
    for (action, usage) in [
        ("pull", "<REF>"),
        ("build", "<SANDBOX> <NAME>"),
        ("rm", "--prune"),
    ] {
        let r = abx(&home, &["template", action, "--help"]);
        assert_eq!(r.code, 0, "{action}: {}", show(&r));
        assert!(
            r.out.contains(&format!("abx template {action}")) && r.out.contains(usage),
            "{action}: {}",
            show(&r)
        );
    }
    // A missing argument is clap's usage error (exit 2), before any daemon is asked.
    let r = abx(&home, &["template", "import"]);
    assert_eq!(r.code, 2, "{}", show(&r));
    assert!(r.err.contains("<PATH>"), "{}", show(&r));
}

/// Item 7: `abx -j info` prints the broker's Sandbox whole: `network` (a mode or a policy),
/// `mounts`, `templateDigest`, whatever the provider sends.
#[test]
fn json_info_is_the_brokers_result_whole() {
    let (home, mut c) = started(&[]);
    let proj = tempfile::tempdir().unwrap();
    let mount = format!("{}:/workspace:ro", proj.path().display());
    let r = abx(
        &home,
        &["-j", "create", "--network", "none", "--mount", &mount],
    );
    assert_eq!(r.code, 0, "{}", show(&r));
    let created: Value = serde_json::from_str(&r.out).unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    let r = abx(&home, &["-j", "info", &id]);
    assert_eq!(r.code, 0, "{}", show(&r));
    let info: Value = serde_json::from_str(&r.out).unwrap();
    let broker = c.call("sandbox/info", json!({"sandbox": id}));
    for (k, v) in broker.as_object().unwrap() {
        assert_eq!(
            &info[k], v,
            "'{k}' of abx -j info: {info}\nthe broker's: {broker}"
        );
    }
    assert_eq!(info["network"], "none", "{info}");
    assert_eq!(info["mounts"][0]["mode"], "ro", "{info}");
    assert_eq!(created["network"], "none", "{created}");
    let r = abx(&home, &["kill", "--yes", &id]);
    assert_eq!(r.code, 0, "{}", show(&r));
}
