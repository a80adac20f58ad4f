//! EPP/1 provider plugins end to end: install from real git repos made in a temp dir,
//! pinning and refusals, integrity, feature gating, the shared plugin process, faults,
//! secrets. Real daemon, real plugin processes (Python and Node fixtures).

use abx_tests::fixtures::{
    copy_dir, fixture, git, install_pinned, plugin_sandbox, provider_status, repo, started,
};
use abx_tests::{abx_code, alive, wait_until, Client};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[test]
fn seed_flow_install_refusals_pinned_list_info_doctor_use_uninstall() {
    let (home, mut c) = started(&[]);
    let (_repo, url, commit) = repo(&[("opensandbox", "py-local")]);
    // Unpinned git source: refused even with confirm (a moving ref is never accepted by --yes).
    let e = c.call_err(
        "provider/install",
        json!({"source": url, "subdir": "opensandbox", "allowInsecureTransport": true, "confirm": true}),
    );
    assert_eq!(abx_code(&e), "E8012");
    assert_eq!(
        e["message"],
        "Refusing an unpinned git source without review (--yes does not accept a moving ref)."
    );
    let sugg = e["data"]["suggestion"].as_str().unwrap();
    assert!(
        sugg.contains(&format!("--ref {commit}")) && sugg.contains("--allow-unpinned"),
        "{sugg}"
    );
    // Insecure transport without the flag.
    let e = c.call_err(
        "provider/install",
        json!({"source": url, "subdir": "opensandbox", "ref": commit, "confirm": true}),
    );
    assert_eq!(abx_code(&e), "E8012");
    assert!(e["data"]["suggestion"]
        .as_str()
        .unwrap()
        .contains("--allow-insecure-transport"));
    // No confirmation: the re-run hint keeps every flag, --subdir included (the seed's bug).
    let e = c.call_err(
        "provider/install",
        json!({"source": url, "subdir": "opensandbox", "ref": commit, "allowInsecureTransport": true}),
    );
    assert_eq!(e["message"], "Installing a provider requires confirmation.");
    let sugg = e["data"]["suggestion"].as_str().unwrap();
    for part in [
        "--subdir opensandbox",
        &format!("--ref {commit}"),
        "--allow-insecure-transport",
        "--yes",
    ] {
        assert!(sugg.contains(part), "{part} missing from {sugg}");
    }
    // Dry run: the plan, nothing installed.
    let plan = c.call(
        "provider/install",
        json!({"source": url, "subdir": "opensandbox", "ref": commit, "allowInsecureTransport": true, "dryRun": true}),
    );
    assert_eq!(plan["id"], "py-local");
    assert!(plan["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(
        abx_code(&c.call_err("provider/info", json!({"id": "py-local"}))),
        "E8001"
    );
    // Pinned install.
    let r = c.call(
        "provider/install",
        json!({"source": url, "subdir": "opensandbox", "ref": commit, "allowInsecureTransport": true, "confirm": true}),
    );
    assert_eq!(
        (r["id"].clone(), r["trust"].clone(), r["version"].clone()),
        (json!("py-local"), json!("pinned"), json!("0.1.0"))
    );
    let list = c.call("provider/list", Value::Null);
    let p = list["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "py-local")
        .unwrap()
        .clone();
    assert_eq!(
        (p["kind"].clone(), p["trust"].clone(), p["default"].clone()),
        (json!("exec"), json!("pinned"), json!(false))
    );
    assert!(p["features"]
        .as_array()
        .unwrap()
        .contains(&json!("exec.stream")));
    let info = c.call("provider/info", json!({"id": "py-local"}));
    assert_eq!(info["source"]["commit"], commit.as_str());
    assert_eq!(info["source"]["subdir"], "opensandbox");
    assert_eq!(info["digest"], r["digest"]);
    assert_eq!(info["runtime"], json!(["python3", "./provider.py"]));
    assert!(info["installedAt"].as_str().unwrap().ends_with('Z'));
    let cfg = serde_json::to_string(&info["config"]).unwrap();
    assert!(cfg.contains("token") && cfg.contains("greeting"));
    let doc = c.call("provider/doctor", json!({"id": "py-local"}));
    let names: Vec<&str> = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "installed",
            "integrity",
            "config",
            "handshake",
            "permissions",
            "isolation"
        ]
    );
    assert!(
        doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["ok"] == true),
        "{doc}"
    );
    // Use it: lifecycle, exec, files, kill, E2009 after kill.
    let sb = c.call(
        "sandbox/create",
        json!({"provider": "py-local", "timeout": 600}),
    );
    assert_eq!(sb["provider"], "py-local");
    let id = sb["id"].as_str().unwrap().to_owned();
    let full = format!("py-local:{id}");
    let r = c.call(
        "exec/run",
        json!({"sandbox": full, "command": "echo hello-from-plugin; echo err >&2; exit 3"}),
    );
    assert_eq!(
        (
            r["exitCode"].clone(),
            r["stdout"].clone(),
            r["stderr"].clone()
        ),
        (json!(3), json!("hello-from-plugin\n"), json!("err\n"))
    );
    // Bare ids work through the index.
    assert_eq!(
        c.call("sandbox/info", json!({"sandbox": id}))["provider"],
        "py-local"
    );
    c.call("files/write", json!({"sandbox": full, "path": "/workspace/a.txt", "data": "AAEC/w==", "encoding": "base64"}));
    let r = c.call(
        "files/read",
        json!({"sandbox": full, "path": "/workspace/a.txt", "encoding": "base64"}),
    );
    assert_eq!(r["data"], "AAEC/w==");
    // Broker-side chunked upload/download (the plugin has no files.transfer).
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("up.bin");
    std::fs::write(
        &src,
        (0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    c.call(
        "files/upload",
        json!({"sandbox": full, "localPath": src, "path": "/workspace/up.bin"}),
    );
    let dst = tmp.path().join("down.bin");
    c.call(
        "files/download",
        json!({"sandbox": full, "path": "/workspace/up.bin", "localPath": dst}),
    );
    assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
    // Undeclared features: E8004 before the plugin is reached.
    for (m, p, f) in [
        (
            "files/watch",
            json!({"sandbox": full, "path": "/workspace"}),
            "files.watch",
        ),
        (
            "code/run",
            json!({"sandbox": full, "language": "python", "code": "1"}),
            "code.interpret",
        ),
        (
            "commands/run",
            json!({"sandbox": full, "name": "x"}),
            "templates.read",
        ),
        ("sandbox/pause", json!({"sandbox": full}), "sandbox.pause"),
        (
            "exec/start",
            json!({"sandbox": full, "command": "sh", "pty": {"cols": 80, "rows": 24}}),
            "pty",
        ),
    ] {
        let e = c.call_err(m, p);
        assert_eq!(abx_code(&e), "E8004", "{m}: {e}");
        assert_eq!(
            e["message"],
            format!("Provider 'py-local' does not support '{f}'.")
        );
    }
    let caps = c.call("sandbox/capabilities", json!({"sandbox": full}));
    assert!(
        !caps["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("code")),
        "{caps}"
    );
    c.call("sandbox/kill", json!({"sandbox": full}));
    c.call("sandbox/kill", json!({"sandbox": full}));
    assert_eq!(
        c.call_err("sandbox/info", json!({"sandbox": full}))["code"],
        2009
    );
    // Uninstall needs confirmation; then the provider is gone.
    assert_eq!(
        abx_code(&c.call_err("provider/uninstall", json!({"id": "py-local"}))),
        "E8012"
    );
    c.call(
        "provider/uninstall",
        json!({"id": "py-local", "confirm": true}),
    );
    assert_eq!(
        abx_code(&c.call_err("provider/info", json!({"id": "py-local"}))),
        "E8001"
    );
    assert_eq!(
        abx_code(&c.call_err("sandbox/create", json!({"provider": "py-local"}))),
        "E8001"
    );
    drop(home);
}

#[test]
fn old_manifest_name_gets_the_rename_hint_and_local_dirs_are_trusted_local() {
    let (_home, mut c) = started(&[]);
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture("py-local"), dir.path());
    std::fs::rename(
        dir.path().join("abx-provider.toml"),
        dir.path().join("ebx-provider.toml"),
    )
    .unwrap();
    let e = c.call_err(
        "provider/install",
        json!({"source": dir.path(), "confirm": true}),
    );
    assert_eq!(abx_code(&e), "E8014");
    assert_eq!(
        e["message"],
        "Invalid abx-provider.toml: file not found at the plugin root."
    );
    assert!(e["data"]["suggestion"]
        .as_str()
        .unwrap()
        .contains("pre-rename 'ebx-provider.toml'"));
    std::fs::rename(
        dir.path().join("ebx-provider.toml"),
        dir.path().join("abx-provider.toml"),
    )
    .unwrap();
    let r = c.call(
        "provider/install",
        json!({"source": dir.path(), "confirm": true}),
    );
    assert_eq!(r["trust"], "local");
    assert_eq!(
        abx_code(&c.call_err(
            "provider/install",
            json!({"source": dir.path(), "confirm": true})
        )),
        "E8015"
    );
}

#[test]
fn every_tampering_is_caught_before_the_plugin_runs() {
    let (_home, mut c) = started(&[]);
    let make_writable = |p: &Path| {
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
    };
    type Tamper = Box<dyn Fn(&Path)>;
    let variants: Vec<(&str, Tamper)> = vec![
        (
            "edit",
            Box::new(|r: &Path| std::fs::write(r.join("provider.py"), "print('evil')\n").unwrap()),
        ),
        (
            "add",
            Box::new(|r: &Path| std::fs::write(r.join("extra.py"), "x").unwrap()),
        ),
        (
            "chmod",
            Box::new(|r: &Path| {
                std::fs::set_permissions(
                    r.join("abx-provider.toml"),
                    std::fs::Permissions::from_mode(0o755),
                )
                .unwrap()
            }),
        ),
        (
            "manifest",
            Box::new(|r: &Path| {
                let t = std::fs::read_to_string(r.join("abx-provider.toml")).unwrap();
                std::fs::write(
                    r.join("abx-provider.toml"),
                    t.replace("\"files.rw\",", "\"files.rw\", \"files.watch\","),
                )
                .unwrap();
            }),
        ),
        (
            "symlink",
            Box::new(|r: &Path| {
                std::fs::remove_file(r.join("provider.py")).unwrap();
                std::os::unix::fs::symlink("/bin/sh", r.join("provider.py")).unwrap();
            }),
        ),
        (
            "delete",
            Box::new(|r: &Path| std::fs::remove_file(r.join("provider.py")).unwrap()),
        ),
    ];
    for (name, tamper) in &variants {
        // Fresh install for each variant.
        c.request(
            "provider/uninstall",
            json!({"id": "py-local", "confirm": true}),
        );
        let (_r, _) = install_pinned(&mut c, "py-local");
        let info = c.call("provider/info", json!({"id": "py-local"}));
        let root = PathBuf::from(info["path"].as_str().unwrap());
        make_writable(&root);
        for e in std::fs::read_dir(&root).unwrap() {
            make_writable(&e.unwrap().path());
        }
        tamper(&root);
        let e = c.call_err("sandbox/list", json!({"provider": "py-local"}));
        assert_eq!(abx_code(&e), "E8011", "{name}: {e}");
        assert_eq!(
            e["message"],
            "Provider 'py-local': files changed since install."
        );
        let p = provider_status(&mut c, "py-local");
        assert_eq!(
            p["running"], false,
            "{name}: the plugin must not have started"
        );
        let doc = c.call("provider/doctor", json!({"id": "py-local"}));
        let integ = doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "integrity")
            .unwrap()
            .clone();
        assert_eq!(integ["ok"], false, "{name}");
    }
}

#[test]
fn secrets_are_stored_privately_and_never_shown_or_logged() {
    let secret = "s3cr3t-VALUE-9f8e7d";
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "bad-stderr-secret");
    c.call(
        "provider/configure",
        json!({"id": "bad-stderr-secret", "values": {"api_key": secret, "leak": "all"}}),
    );
    let file = home.path.join("config/providers/bad-stderr-secret.toml");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let info = c.call("provider/info", json!({"id": "bad-stderr-secret"}));
    assert!(!info.to_string().contains(secret));
    // The plugin echoes its secret to stderr; the broker log must have it redacted.
    let mut outputs = vec![];
    outputs.push(c.request("sandbox/list", json!({"provider": "bad-stderr-secret"})));
    outputs.push(c.request("sandbox/create", json!({"provider": "bad-stderr-secret"})));
    outputs.push(c.request("provider/doctor", json!({"id": "bad-stderr-secret"})));
    for o in &outputs {
        assert!(!o.to_string().contains(secret), "secret in a reply: {o}");
    }
    // The plugin's stderr echo reaches the log redacted (wait for it: it is written by the
    // daemon's log writer, not before the replies).
    wait_until(
        "the plugin's stderr echo in the log, redacted",
        Duration::from_secs(20),
        || {
            std::fs::read_to_string(home.log_file())
                .unwrap_or_default()
                .contains("[REDACTED]")
        },
    );
    let log = std::fs::read_to_string(home.log_file()).unwrap();
    assert!(!log.contains(secret), "secret leaked into the log");
    // Unknown config keys are refused with the known ones listed.
    let e = c.call_err(
        "provider/configure",
        json!({"id": "bad-stderr-secret", "values": {"nope": 1}}),
    );
    assert_eq!(abx_code(&e), "E8006");
    assert!(!e.to_string().contains(secret));
}

#[test]
fn plugin_faults_are_typed_and_the_daemon_survives() {
    let (home, mut c) = started(&[("ABX_PLUGIN_TIMEOUT_SECS", "3")]);
    let mut repos = vec![];
    for f in [
        "bad-garbage",
        "bad-hang",
        "bad-crash",
        "bad-crash-handshake",
        "bad-flood",
        "bad-liar",
    ] {
        repos.push(install_pinned(&mut c, f));
    }
    let expect = |c: &mut Client, prov: &str, codes: &[&str]| {
        let e = c.call_err("sandbox/list", json!({"provider": prov}));
        assert!(codes.contains(&abx_code(&e)), "{prov}: {e}");
        e
    };
    expect(&mut c, "bad-garbage", &["E8009", "E8002"]);
    expect(&mut c, "bad-hang", &["E8008"]);
    expect(&mut c, "bad-crash", &["E8007"]);
    expect(&mut c, "bad-crash", &["E8007"]); // restarted, crashes again
    expect(&mut c, "bad-crash-handshake", &["E8002"]);
    expect(&mut c, "bad-flood", &["E8009", "E8007"]);
    let e = expect(&mut c, "bad-liar", &["E8002"]);
    assert!(e["message"].as_str().unwrap().contains("handshake"), "{e}");
    // A crash loop disables the plugin, and doctor says why.
    for _ in 0..5 {
        let _ = c.request("sandbox/list", json!({"provider": "bad-crash-handshake"}));
    }
    let doc = c.call("provider/doctor", json!({"id": "bad-crash-handshake"}));
    let hs = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "handshake")
        .unwrap()
        .clone();
    assert_eq!(hs["ok"], false);
    // The daemon is unharmed and its memory bounded after the flood.
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
    let pid = home.daemon_pid().unwrap();
    assert!(abx_tests::rss_kib(pid) < 200 * 1024);
}

#[test]
fn one_plugin_process_for_all_clients_and_a_kill_with_calls_in_flight() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (sb, full) = plugin_sandbox(&mut c, "py-local");
    // Two clients stream from the same plugin at once; each gets only its own stream.
    let mut c2 = home.connect();
    let e1 = c.call(
        "exec/start",
        json!({"sandbox": full, "command": "for i in 1 2 3; do echo one$i; sleep 0.1; done"}),
    )["execId"]
        .as_str()
        .unwrap()
        .to_owned();
    let e2 = c2.call(
        "exec/start",
        json!({"sandbox": full, "command": "for i in 1 2 3; do echo two$i; sleep 0.1; done"}),
    )["execId"]
        .as_str()
        .unwrap()
        .to_owned();
    let s1 = c.collect(&e1);
    let s2 = c2.collect(&e2);
    assert_eq!(String::from_utf8(s1.stdout).unwrap(), "one1\none2\none3\n");
    assert_eq!(String::from_utf8(s2.stdout).unwrap(), "two1\ntwo2\ntwo3\n");
    assert_eq!((s1.exits, s2.exits), (1, 1));
    let pid = provider_status(&mut c, "py-local")["pid"].as_u64().unwrap();
    // 100 calls in flight, then the plugin is killed: 100 typed errors, then a restart.
    for i in 0..100 {
        c.send(&json!({"jsonrpc": "2.0", "id": 10_000 + i, "method": "exec/run", "params": {"sandbox": full, "command": "sleep 30"}}).to_string());
    }
    // Killed only once all 100 are the plugin's: a call still queued in the broker would go
    // to the restarted plugin instead.
    let mut probe = home.connect();
    wait_until("100 calls in flight", Duration::from_secs(30), || {
        provider_status(&mut probe, "py-local")["inFlight"].as_u64() >= Some(100)
    });
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let mut errors = 0;
    while errors < 100 {
        let v = c.recv();
        if v["id"].as_i64().is_some_and(|i| i >= 10_000) {
            assert_eq!(abx_code(&v["error"]), "E8007", "{v}");
            errors += 1;
        }
    }
    wait_until("old plugin gone", Duration::from_secs(5), || {
        !alive(pid as u32)
    });
    let r = c.call("sandbox/list", json!({"provider": "py-local"}));
    assert!(
        r["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == sb.as_str()),
        "sandboxes survive a plugin restart"
    );
    assert_eq!(
        c.call("exec/run", json!({"sandbox": full, "command": "echo back"}))["stdout"],
        "back\n"
    );
}

#[test]
fn cancellation_reaches_the_plugin() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "bad-slow");
    c.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "sandbox/create", "params": {"provider": "bad-slow", "metadata": {"sleep": 30}}}).to_string());
    // Cancelled once the plugin has it (a call cancelled before it was sent never reaches it).
    let mut probe = home.connect();
    wait_until("the call is the plugin's", Duration::from_secs(30), || {
        provider_status(&mut probe, "bad-slow")["inFlight"].as_u64() == Some(1)
    });
    c.send(r#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":5}}"#);
    let v = c.recv();
    assert_eq!(
        (v["id"].clone(), v["error"]["code"].clone()),
        (json!(5), json!(-32800))
    );
    wait_until("plugin saw the cancel", Duration::from_secs(5), || {
        std::fs::read_to_string(home.log_file())
            .unwrap_or_default()
            .contains("$/cancelRequest")
    });
}

/// Issue 41: a member a method does not take is refused by the broker (E1004 naming it)
/// before the call is routed: the plugin never sees it (bad-slow logs every request it gets,
/// with the `sleep` it read from the params).
#[test]
fn a_plugin_never_sees_an_unknown_member() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "bad-slow");
    let e = c.call_err(
        "sandbox/create",
        json!({"provider": "bad-slow", "metadata": {"sleep": 0}, "sleep": 7.25}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    assert_eq!(
        e["message"],
        "Invalid params for 'sandbox/create': unknown member 'sleep'"
    );
    let e = c.call_err(
        "exec/run",
        json!({"sandbox": "bad-slow:slow-1", "command": "true", "sleep": 7.25}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    // What it does take reaches it (after the refused calls, on the same connection).
    let sb = c.call(
        "sandbox/create",
        json!({"provider": "bad-slow", "metadata": {"sleep": 0.125}}),
    );
    assert_eq!(sb["provider"], "bad-slow");
    let log = || std::fs::read_to_string(home.log_file()).unwrap_or_default();
    wait_until("the plugin's log line", Duration::from_secs(10), || {
        log().contains("answering in 0.125s")
    });
    let log = log();
    assert!(!log.contains("answering in 7.25s"), "{log}");
    assert_eq!(log.matches("bad-slow: sandbox/create").count(), 1, "{log}");
    assert!(!log.contains("bad-slow: exec/run"), "{log}");
}

#[test]
fn node_provider_works_too() {
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("node is not installed: skipping");
        return;
    }
    let (_home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "node-local");
    let (_, full) = plugin_sandbox(&mut c, "node-local");
    assert_eq!(
        c.call(
            "exec/run",
            json!({"sandbox": full, "command": "echo from-node"})
        )["stdout"],
        "from-node\n"
    );
    let e = c.call(
        "exec/start",
        json!({"sandbox": full, "command": "echo a; echo b >&2; exit 2"}),
    )["execId"]
        .as_str()
        .unwrap()
        .to_owned();
    let s = c.collect(&e);
    assert_eq!((s.exit["exitCode"].clone(), s.exits), (json!(2), 1));
    c.call("sandbox/kill", json!({"sandbox": full}));
}

#[test]
fn update_check_and_repair() {
    let (_home, mut c) = started(&[]);
    let (repo_dir, url, _commit) = repo(&[("p", "py-local")]);
    c.call(
        "provider/install",
        json!({"source": url, "subdir": "p", "ref": "main", "allowUnpinned": true, "allowInsecureTransport": true, "confirm": true}),
    );
    let r = c.call("provider/update", json!({"id": "py-local", "check": true}));
    assert_eq!(r["providers"][0]["status"], "up-to-date");
    // A new commit on the moving ref.
    let f = repo_dir.path().join("p/provider.py");
    let mut text = std::fs::read_to_string(&f).unwrap();
    text.push_str("\n# a change\n");
    std::fs::write(&f, text).unwrap();
    git(repo_dir.path(), &["commit", "-qam", "change"]);
    let r = c.call("provider/update", json!({"id": "py-local", "check": true}));
    assert_eq!(r["providers"][0]["status"], "update-available", "{r}");
    let r = c.call("provider/update", json!({"id": "py-local"}));
    assert_eq!(r["providers"][0]["status"], "updated", "{r}");
    let r = c.call("provider/update", json!({"id": "py-local", "check": true}));
    assert_eq!(r["providers"][0]["status"], "up-to-date");
}

/// Issue 21: the broker escalates an `exec/kill` the command ignores on plugins too: INT,
/// then TERM, then KILL (2 s apart) as further `exec/kill`s to the plugin.
#[test]
fn exec_kill_escalates_on_a_plugin() {
    let (_home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (_, full) = plugin_sandbox(&mut c, "py-local");
    let e = c.call(
        "exec/start",
        json!({"sandbox": full, "command": "trap '' INT TERM; echo ready; while :; do sleep 0.1; done", "stdin": ""}),
    )["execId"]
        .as_str()
        .unwrap()
        .to_owned();
    loop {
        let v = c.recv();
        if v["params"]["execId"] == e.as_str() && v["method"] == "exec/output" {
            break;
        }
        assert_ne!(v["method"], "exec/exit", "{v}");
    }
    let t0 = std::time::Instant::now();
    c.call("exec/kill", json!({"execId": e, "signal": "INT"}));
    let s = c.collect(&e);
    assert!(
        s.exit["signal"]
            .as_str()
            .is_some_and(|n| n.ends_with("KILL")),
        "{:?}",
        s.exit
    );
    assert!(
        t0.elapsed() + Duration::from_millis(300) >= Duration::from_secs(4),
        "{:?}",
        t0.elapsed()
    );
    c.call("sandbox/kill", json!({"sandbox": full}));
}

/// A client's `timeout` for an `exec/run` on a plugin sets how long the daemon waits for the
/// plugin (`timeout` + 30 s). Out-of-range values (too big for a `Duration`, too far for an
/// `Instant`, negative) must not panic the request (E9001) or stop the plugin's timeouts:
/// the daemon waits at most its own cap and lets the plugin judge the value.
#[test]
fn out_of_range_exec_timeouts_on_a_plugin_do_not_panic_the_daemon() {
    let (_home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (_sb, full) = plugin_sandbox(&mut c, "py-local");
    for t in [1e300, 1.8e19, 9e18, 1e12, -1e9, -31.0] {
        let r = c.request(
            "exec/run",
            json!({"sandbox": full, "command": "echo ok", "timeout": t}),
        );
        if let Some(e) = r.get("error") {
            assert_ne!(abx_code(e), "E9001", "timeout {t}: {r}");
        }
    }
    // The plugin's timeouts still work and the daemon still answers.
    assert_eq!(
        c.call("exec/run", json!({"sandbox": full, "command": "echo back"}))["stdout"],
        "back\n"
    );
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
}
