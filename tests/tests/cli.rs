//! The `abx` CLI end to end: the real binary against a real daemon in a temp `ABX_HOME`
//! (the builtin `local` provider), every command in human and `-j` form, exit codes,
//! refusals, prompts and `abx shell` on a real pseudo-terminal.

use abx_tests::{Home, PtyChild};
use serde_json::{json, Value};
use std::process::Output;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run and expect exit `code`; returns the output.
#[track_caller]
fn run_code(home: &Home, args: &[&str], code: i32) -> Output {
    let o = home.run(args);
    assert_eq!(
        o.status.code(),
        Some(code),
        "abx {args:?}\nstdout: {}\nstderr: {}",
        stdout(&o),
        stderr(&o)
    );
    o
}

/// Run and expect success; returns stdout.
#[track_caller]
fn ok(home: &Home, args: &[&str]) -> String {
    stdout(&run_code(home, args, 0))
}

/// Run with -j and expect success; returns the parsed JSON.
#[track_caller]
fn ok_json(home: &Home, args: &[&str]) -> Value {
    let mut a = vec!["-j"];
    a.extend_from_slice(args);
    let out = ok(home, &a);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("abx {a:?}: not JSON ({e}): {out}"))
}

/// Run with -j and expect the JSON error object with `code` on stdout and exit `exit`.
#[track_caller]
fn err_json(home: &Home, args: &[&str], code: &str, exit: i32) -> Value {
    let mut a = vec!["-j"];
    a.extend_from_slice(args);
    let o = run_code(home, &a, exit);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("abx {a:?}: not JSON ({e}): {}", stdout(&o)));
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v["suggestion"].is_string(), "{v}");
    v
}

/// Run and expect `[CODE] message` + `  Suggestion: ...` on stderr and exit `exit`.
#[track_caller]
fn err_human(home: &Home, args: &[&str], code: &str, exit: i32) -> String {
    let o = run_code(home, args, exit);
    let e = stderr(&o);
    assert!(e.starts_with(&format!("[{code}] ")), "abx {args:?}: {e}");
    assert!(e.contains("\n  Suggestion: "), "abx {args:?}: {e}");
    assert!(o.stdout.is_empty(), "abx {args:?}: {}", stdout(&o));
    e
}

/// Create a sandbox with the CLI and return its bare id.
fn create(home: &Home) -> String {
    let v = ok_json(home, &["create"]);
    v["id"].as_str().expect("id").to_owned()
}

/// The `Key  value` rows of an info layout.
fn rows(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|l| match l.split_once("  ") {
            Some((k, v)) => (k.to_owned(), v.trim_start().to_owned()),
            None => (l.to_owned(), String::new()),
        })
        .collect()
}

#[test]
fn lifecycle_in_human_and_json_form() {
    let home = Home::new();
    // create (human): the seed's info layout, aligned.
    let out = ok(
        &home,
        &[
            "create",
            "--template",
            "base",
            "--timeout",
            "600",
            "--metadata",
            "owner=cli-test",
        ],
    );
    let r = rows(&out);
    let keys: Vec<&str> = r.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "ID", "Template", "Status", "Region", "Timeout", "URL", "Started", "Provider",
            "Expires", "Metadata"
        ],
        "{out}"
    );
    assert!(out.starts_with("ID        local:sb-"), "{out}");
    assert_eq!(r[1].1, "base");
    assert_eq!(r[2].1, "running");
    assert_eq!(r[4].1, "600s");
    assert_eq!(r[7].1, "local");
    assert_eq!(r[9].1, "owner=cli-test");
    let full = r[0].1.clone();
    let id = full.strip_prefix("local:").unwrap().to_owned();

    // create (-j): the Sandbox with every key, and what the broker adds (`network`: issue 45,
    // item 7).
    let v = ok_json(&home, &["create", "--timeout", "5m"]);
    let mut keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "expiresAt",
            "id",
            "metadata",
            "network",
            "provider",
            "region",
            "startedAt",
            "status",
            "template",
            "timeout",
            "url"
        ]
    );
    assert_eq!(v["timeout"], 300);
    assert_eq!(v["provider"], "local");
    let id2 = v["id"].as_str().unwrap().to_owned();

    // info, both id forms.
    let out = ok(&home, &["info", &id]);
    assert!(out.starts_with(&format!("ID        {full}\n")), "{out}");
    let v = ok_json(&home, &["info", &full]);
    assert_eq!(v["id"], id.as_str());
    assert_eq!(v["metadata"]["owner"], "cli-test");

    // list and sandbox list: the seed's table.
    let out = ok(&home, &["list"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("┏━") && lines[0].ends_with("┓"),
        "{out}"
    );
    assert!(lines[1].starts_with("┃ ID ") && lines[1].contains("┃ Template "));
    assert!(lines[1].contains("┃ Status ") && lines[1].contains("┃ Region "));
    assert!(lines[2].starts_with("┡━"));
    assert!(lines.last().unwrap().starts_with("└─"));
    assert!(out.contains(&format!("│ {full} │ base ")), "{out}");
    assert!(out.contains(&format!("│ local:{id2} │")), "{out}");
    assert_eq!(ok(&home, &["sandbox", "list"]), out);
    let v = ok_json(&home, &["list"]);
    assert_eq!(v["sandboxes"].as_array().unwrap().len(), 2);
    assert_eq!(ok_json(&home, &["sandbox", "list"]), v);
    // --provider filters; an unknown provider is E8001 (exit 4).
    let v = ok_json(&home, &["--provider", "local", "list"]);
    assert_eq!(v["sandboxes"].as_array().unwrap().len(), 2);
    err_human(&home, &["--provider", "nope", "list"], "E8001", 4);
    let mut h2 = Home::new();
    h2.env.push(("ABX_PROVIDER".into(), "nope".into()));
    err_json(&h2, &["create"], "E8001", 4);

    // pause / resume / set-timeout / ports.
    assert_eq!(
        ok(&home, &["pause", &id]),
        format!("Sandbox {full} paused.\n")
    );
    assert_eq!(ok_json(&home, &["info", &id])["status"], "paused");
    assert_eq!(
        ok(&home, &["resume", &id]),
        format!("Sandbox {full} resumed.\n")
    );
    assert_eq!(ok_json(&home, &["pause", &id])["status"], "paused");
    assert_eq!(ok_json(&home, &["resume", &id])["status"], "running");
    let out = ok(&home, &["set-timeout", &id, "1h"]);
    assert!(
        out.starts_with(&format!("Sandbox {full} now expires at ")) && out.contains("(in 3600s)"),
        "{out}"
    );
    assert_eq!(ok_json(&home, &["set-timeout", &id, "900"])["timeout"], 900);
    err_human(&home, &["set-timeout", &id, "0"], "E2004", 2);
    assert_eq!(
        ok(&home, &["ports", &id, "8080"]),
        "http://127.0.0.1:8080\n"
    );
    let v = ok_json(&home, &["ports", &id, "8080"]);
    assert_eq!(v["url"], "http://127.0.0.1:8080");
    assert_eq!(v["port"], 8080);

    // kill --yes, idempotent; then E2009 (exit 4) in both forms.
    assert_eq!(
        ok(&home, &["kill", &id, "--yes"]),
        format!("Sandbox {id} killed.\n")
    );
    assert!(ok(&home, &["kill", &id, "--yes"]).starts_with(&format!("Sandbox {id} killed")));
    assert_eq!(
        ok_json(&home, &["kill", &id2, "-y"]),
        json!({"sandbox": id2, "killed": true})
    );
    assert_eq!(
        ok_json(&home, &["kill", &id2, "-y"]),
        json!({"sandbox": id2, "killed": false})
    );
    let e = err_human(&home, &["info", &id], "E2009", 4);
    assert!(e.contains("abx list"), "{e}");
    err_json(&home, &["info", &id], "E2009", 4);
    assert_eq!(ok(&home, &["list"]), "No sandboxes found.\n");
    assert_eq!(ok_json(&home, &["list"]), json!({"sandboxes": []}));
}

#[test]
fn unknown_ids_are_not_found_everywhere() {
    let home = Home::new();
    home.start();
    let local = std::env::temp_dir().join("abx-cli-test-unused");
    let local = local.to_str().unwrap();
    for args in [
        vec!["info", "sb-nope"],
        vec!["pause", "sb-nope"],
        vec!["resume", "sb-nope"],
        vec!["set-timeout", "sb-nope", "60"],
        vec!["ports", "sb-nope", "80"],
        vec!["exec", "sb-nope", "true"],
        vec!["shell", "sb-nope"],
        vec!["download", "sb-nope", "a.txt", local],
        vec!["sandbox", "files", "list", "sb-nope"],
        vec!["sandbox", "files", "read", "sb-nope", "a"],
        vec!["sandbox", "files", "rm", "sb-nope", "a"],
        vec!["sandbox", "files", "mkdir", "sb-nope", "a"],
        vec!["sandbox", "process", "list", "sb-nope"],
        vec!["sandbox", "process", "kill", "sb-nope", "1"],
        vec!["sandbox", "system", "info", "sb-nope"],
        vec!["sandbox", "capabilities", "sb-nope"],
        vec!["sandbox", "command", "run", "sb-nope", "x"],
    ] {
        err_human(&home, &args, "E2009", 4);
        if args[0] != "shell" {
            err_json(&home, &args, "E2009", 4);
        }
    }
    // -v adds the method, the JSON-RPC code and the log.
    let o = run_code(&home, &["-v", "info", "sb-nope"], 4);
    let e = stderr(&o);
    assert!(e.contains("  Method: sandbox/info"), "{e}");
    assert!(e.contains("  Broker log: "), "{e}");
    let v = err_json(&home, &["-v", "info", "sb-nope"], "E2009", 4);
    assert_eq!(v["method"], "sandbox/info");
    assert_eq!(v["detail"]["rpcCode"], 2009);
}

#[test]
fn exec_and_run_stream_and_keep_exit_codes() {
    let home = Home::new();
    let id = create(&home);
    // The seed's exec: both streams, the command's exit code.
    let o = run_code(
        &home,
        &["exec", &id, "echo hello-from-abx; echo err >&2; exit 3"],
        3,
    );
    assert_eq!(stdout(&o), "hello-from-abx\n");
    assert_eq!(stderr(&o), "err\n");
    // Words are quoted one by one.
    assert_eq!(
        ok(&home, &["exec", &id, "printf", "%s|", "a b", "c"]),
        "a b|c|"
    );
    // Piped stdin reaches the command (also more than one chunk).
    let o = home.run_with_input(&["exec", &id, "tr", "a-z", "A-Z"], b"piped input\n");
    assert_eq!(stdout(&o), "PIPED INPUT\n");
    assert!(o.status.success());
    let big = vec![b'x'; 300_000];
    let o = home.run_with_input(&["exec", &id, "wc -c"], &big);
    assert_eq!(stdout(&o).trim(), "300000");
    // --cwd and --timeout.
    ok(&home, &["sandbox", "files", "mkdir", &id, "sub"]);
    assert_eq!(
        ok(&home, &["exec", "--cwd", "/workspace/sub", &id, "pwd"]),
        "/workspace/sub\n"
    );
    let o = run_code(&home, &["exec", "--timeout", "0.5", &id, "sleep 5"], 137);
    assert!(stderr(&o).contains("[E3001]"), "{}", stderr(&o));
    // -j: one result object, abx's exit code still the command's; piped stdin too.
    let o = home.run_with_input(
        &["-j", "exec", &id, "cat; echo e >&2; exit 5"],
        b"from stdin\n",
    );
    assert_eq!(o.status.code(), Some(5));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exitCode"], 5);
    assert_eq!(v["stdout"], "from stdin\n");
    assert_eq!(v["stderr"], "e\n");
    assert_eq!(v["timedOut"], false);
    // Ctrl-C interrupts the remote command (SIGINT to its tree), which may handle it.
    let mut child = home
        .abx()
        .args([
            "exec",
            &id,
            "trap 'echo got-int; exit 9' INT; echo ready; sleep 30 & wait",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut so = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut so, &mut line).unwrap();
    assert_eq!(line, "ready\n");
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut so, &mut rest).unwrap();
    assert_eq!(rest, "got-int\n");
    assert_eq!(child.wait().unwrap().code(), Some(9));
    // run: a throwaway sandbox, in both forms; nothing left behind.
    let o = run_code(&home, &["run", "--", "echo ran; exit 4"], 4);
    assert_eq!(stdout(&o), "ran\n");
    let o = run_code(&home, &["-j", "run", "--", "echo ran"], 0);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["stdout"], "ran\n");
    assert!(v["sandbox"].as_str().unwrap().starts_with("local:sb-"));
    let left = ok_json(&home, &["list"]);
    assert_eq!(left["sandboxes"].as_array().unwrap().len(), 1, "{left}");
}

#[test]
fn files_upload_download_and_wide_tables() {
    let home = Home::new();
    let id = create(&home);
    let dir = tempfile::tempdir().unwrap();
    let txt = dir.path().join("up2.txt");
    std::fs::write(&txt, "payload\n").unwrap();
    let bin = dir.path().join("up2.bin");
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&bin, &data).unwrap();
    let (txt_s, bin_s) = (txt.to_str().unwrap(), bin.to_str().unwrap());

    // upload / download, the seed's lines; no progress bar when stderr is piped.
    let o = run_code(&home, &["upload", &id, txt_s, "/tmp/up2.txt"], 0);
    assert_eq!(stdout(&o), format!("Uploaded {txt_s} -> /tmp/up2.txt\n"));
    let o = run_code(&home, &["upload", &id, bin_s, "/tmp/up2.bin"], 0);
    assert_eq!(stdout(&o), format!("Uploaded {bin_s} -> /tmp/up2.bin\n"));
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    assert_eq!(
        ok(
            &home,
            &["exec", &id, "cat /tmp/up2.txt; wc -c < /tmp/up2.bin"]
        ),
        "payload\n3000000\n"
    );
    let down = dir.path().join("down2.bin");
    let o = run_code(
        &home,
        &["download", &id, "/tmp/up2.bin", down.to_str().unwrap()],
        0,
    );
    assert_eq!(
        stdout(&o),
        format!("Downloaded /tmp/up2.bin -> {}\n", down.display())
    );
    assert!(o.stderr.is_empty());
    assert!(std::fs::read(&down).unwrap() == data, "binary round trip");
    // A relative local path is the caller's, not the daemon's; a directory takes the name.
    let o = home
        .abx()
        .current_dir(dir.path())
        .args(["download", &id, "/tmp/up2.txt", "."])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&txt).unwrap(), "payload\n");
    let v = ok_json(&home, &["upload", &id, txt_s, "j.txt"]);
    assert_eq!(v["size"], 8);
    assert_eq!(v["path"], "j.txt");
    let v = ok_json(
        &home,
        &[
            "download",
            &id,
            "j.txt",
            dir.path().join("j.txt").to_str().unwrap(),
        ],
    );
    assert_eq!(v["size"], 8);

    // Local files that cannot be used: E4009 before anything is sent.
    let missing = dir.path().join("missing.txt");
    let e = err_human(
        &home,
        &["upload", &id, missing.to_str().unwrap(), "x.txt"],
        "E4009",
        1,
    );
    assert!(e.contains("no such file"), "{e}");
    err_json(
        &home,
        &["upload", &id, dir.path().to_str().unwrap(), "x"],
        "E4009",
        1,
    );
    err_human(
        &home,
        &[
            "sandbox",
            "files",
            "write",
            &id,
            "x",
            "--from",
            missing.to_str().unwrap(),
        ],
        "E4009",
        1,
    );
    err_human(
        &home,
        &["download", &id, "/tmp/up2.txt", "/nonexistent-dir/x"],
        "E4009",
        1,
    );
    err_human(&home, &["download", &id, "/tmp/none", "/tmp/x"], "E4001", 4);
    let v = ok_json(&home, &["sandbox", "files", "list", &id]);
    let names: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        !names.contains(&"x.txt") && !names.contains(&"x"),
        "{names:?}"
    );

    // files list (the seed's table) / read / write / mkdir / rm.
    let out = ok(&home, &["sandbox", "files", "list", &id, "--path", "/tmp"]);
    assert!(out.contains("┃ Name ") && out.contains("┃ Type ") && out.contains("┃ Size"));
    assert!(out.contains("│ up2.bin │ file │ 3000000 │"), "{out}");
    assert!(out.contains("│ up2.txt │ file │ 8       │"), "{out}");
    assert_eq!(
        ok(&home, &["sandbox", "files", "read", &id, "/tmp/up2.txt"]),
        "payload\n"
    );
    let o = run_code(&home, &["sandbox", "files", "read", &id, "/tmp/up2.bin"], 0);
    assert!(o.stdout == data, "raw bytes to stdout");
    let v = ok_json(&home, &["sandbox", "files", "read", &id, "/tmp/up2.txt"]);
    assert_eq!(
        (v["data"].clone(), v["encoding"].clone()),
        (json!("payload\n"), json!("utf-8"))
    );
    err_human(
        &home,
        &["sandbox", "files", "read", &id, "nope"],
        "E4001",
        4,
    );
    err_json(
        &home,
        &["sandbox", "files", "read", &id, "nope"],
        "E4001",
        4,
    );
    err_human(
        &home,
        &[
            "sandbox",
            "files",
            "read",
            &id,
            "/workspace/../../etc/passwd",
        ],
        "E4002",
        2,
    );

    assert_eq!(
        ok(&home, &["sandbox", "files", "mkdir", &id, "d/e", "-p"]),
        "Created directory d/e\n"
    );
    assert_eq!(
        ok_json(&home, &["sandbox", "files", "mkdir", &id, "d2"])["created"],
        true
    );
    let o = home.run_with_input(
        &["sandbox", "files", "write", &id, "d/e/f.txt"],
        b"from stdin\n",
    );
    assert_eq!(stdout(&o), "Wrote 11 bytes to d/e/f.txt\n");
    let o = home.run_with_input(&["-j", "sandbox", "files", "write", &id, "d/g.txt"], b"xyz");
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout).unwrap()["size"],
        3
    );
    assert_eq!(
        ok(
            &home,
            &["sandbox", "files", "write", &id, "d/h.bin", "--from", bin_s]
        ),
        "Wrote 3000000 bytes to d/h.bin\n"
    );
    // More stdin than one write: spooled and uploaded, byte-exact.
    let big: Vec<u8> = data.iter().cycle().take(5_000_000).copied().collect();
    let o = home.run_with_input(&["sandbox", "files", "write", &id, "big.bin"], &big);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run_code(&home, &["sandbox", "files", "read", &id, "big.bin"], 0);
    assert!(o.stdout == big, "5 MB through stdin");
    assert!(
        !std::fs::read_dir(home.run_dir()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".spool")),
        "no spool file left"
    );
    let out = ok(
        &home,
        &["sandbox", "files", "list", &id, "--path", "d", "-r"],
    );
    assert!(out.contains("│ e/f.txt ") && out.contains("│ e "), "{out}");
    assert_eq!(
        ok(&home, &["exec", &id, "cat d/e/f.txt d/g.txt"]),
        "from stdin\nxyz"
    );
    let e = err_human(&home, &["sandbox", "files", "rm", &id, "d"], "E4005", 1);
    assert!(e.contains("-r"), "{e}");
    assert_eq!(
        ok(&home, &["sandbox", "files", "rm", &id, "d", "-r"]),
        "Removed d\n"
    );
    assert_eq!(
        ok_json(&home, &["sandbox", "files", "rm", &id, "d2"])["removed"],
        true
    );
    err_human(&home, &["sandbox", "files", "rm", &id, "d"], "E4001", 4);
    // Wide tables are never cut when piped: a 180-character name stays whole on one line.
    let long = format!("{}.txt", "a-very-long-file-name-".repeat(8));
    ok(&home, &["sandbox", "files", "mkdir", &id, "wide"]);
    ok(&home, &["upload", &id, txt_s, &format!("wide/{long}")]);
    let out = ok(&home, &["sandbox", "files", "list", &id, "--path", "wide"]);
    assert!(out.contains(&format!("│ {long} │ file │ 8    │")), "{out}");
    assert!(!out.contains('…'));
    let widths: Vec<usize> = out.lines().map(|l| l.chars().count()).collect();
    assert!(
        widths.iter().all(|w| *w == widths[0] && *w > 190),
        "{widths:?}"
    );
}

#[test]
fn processes_system_capabilities_and_named_commands() {
    let home = Home::new();
    let id = create(&home);
    ok(&home, &["exec", &id, "sleep 300 >/dev/null 2>&1 &"]);
    let out = ok(&home, &["sandbox", "process", "list", &id]);
    assert!(out.contains("┃ PID ") && out.contains("┃ Command ") && out.contains("┃ Status"));
    assert!(out.contains("│ sleep 300 │"), "{out}");
    let v = ok_json(&home, &["sandbox", "process", "list", &id]);
    let p = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["command"] == "sleep 300")
        .unwrap()
        .clone();
    let pid = p["pid"].to_string();
    err_human(&home, &["sandbox", "process", "kill", &id, "1"], "E3006", 4);
    assert_eq!(
        ok(
            &home,
            &["sandbox", "process", "kill", &id, &pid, "--signal", "TERM"]
        ),
        format!("Sent TERM to process {pid}.\n")
    );
    abx_tests::wait_until("sleep gone", std::time::Duration::from_secs(10), || {
        ok_json(&home, &["sandbox", "process", "list", &id])["processes"] == json!([])
    });
    assert_eq!(
        ok(&home, &["sandbox", "process", "list", &id]),
        "No processes running.\n"
    );

    // system info: the seed's keys, plus Isolation.
    let out = ok(&home, &["sandbox", "system", "info", &id]);
    let r = rows(&out);
    let keys: Vec<&str> = r.iter().map(|(k, _)| k.as_str()).collect();
    for k in [
        "OS",
        "Arch",
        "Hostname",
        "CPU_Count",
        "Disk_Total_GB",
        "Disk_Free_GB",
        "Isolation",
    ] {
        assert!(keys.contains(&k), "{k} missing: {out}");
    }
    assert!(out.starts_with("OS  "), "{out}");
    assert_eq!(r[0].1, "Linux");
    let v = ok_json(&home, &["sandbox", "system", "info", &id]);
    assert_eq!(v["os"], "Linux");
    assert!(v["cpuCount"].as_u64().unwrap() >= 1);

    // capabilities: derived from the features ("code" from code.interpret).
    let out = ok(&home, &["sandbox", "capabilities", &id]);
    assert!(out.starts_with("Capabilities:\n  - "), "{out}");
    assert!(
        out.contains("  - files\n") && out.contains("  - shell\n"),
        "{out}"
    );
    assert!(out.contains("  - code\n"), "{out}");
    let v = ok_json(&home, &["sandbox", "capabilities", &id]);
    assert!(v["capabilities"]
        .as_array()
        .unwrap()
        .contains(&json!("shell")));
    assert!(v["features"]
        .as_array()
        .unwrap()
        .contains(&json!("exec.run")));

    // Named commands (issue 49): local serves commands/run as it declares; its templates
    // name no commands, so E1004 says so, printed, never a crash.
    let e = err_human(
        &home,
        &["sandbox", "command", "run", &id, "anything"],
        "E1004",
        2,
    );
    assert!(e.contains("names no command"), "{e}");
    err_json(
        &home,
        &["sandbox", "command", "run", &id, "anything"],
        "E1004",
        2,
    );
}

#[test]
fn providers_list_and_info() {
    let home = Home::new();
    let out = ok(&home, &["provider", "list"]);
    let header = out.lines().nth(1).unwrap();
    for h in [
        "ID", "Name", "Version", "Kind", "Trust", "Features", "Default",
    ] {
        assert!(header.contains(&format!("┃ {h} ")), "{h}: {out}");
    }
    // Grouped features on one line: not cut when piped.
    assert!(
        out.contains("│ sandbox(lifecycle,timeout,pause) exec(run,stream) "),
        "{out}"
    );
    assert!(
        out.contains("│ local ") && out.contains("│ builtin │ builtin │"),
        "{out}"
    );
    assert!(out.contains("│ yes "), "{out}");
    let v = ok_json(&home, &["provider", "list"]);
    let p = &v["providers"][0];
    assert_eq!(p["id"], "local");
    assert_eq!(p["default"], true);
    assert!(p["features"].as_array().unwrap().contains(&json!("pty")));

    let out = ok(&home, &["provider", "info", "local"]);
    let r = rows(&out);
    assert_eq!(r[0], ("ID".into(), "local".into()), "{out}");
    let keys: Vec<&str> = r.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        &keys[..7],
        ["ID", "Name", "Version", "Kind", "Default", "Trust", "Features"]
    );
    assert!(out.contains("Default      yes\n"), "{out}");
    assert!(out.contains("exec.run, exec.stream, "), "{out}");
    assert_eq!(
        ok_json(&home, &["provider", "info", "local"])["id"],
        "local"
    );
    err_human(&home, &["provider", "info", "nope"], "E8001", 4);
    err_json(&home, &["provider", "info", "nope"], "E8001", 4);
}

#[test]
fn refusals_usage_errors_and_completions() {
    let home = Home::new();
    let id = create(&home);
    // kill without a terminal and without --yes: refused, exit 2, nothing killed.
    let e = err_human(&home, &["kill", &id], "E1009", 2);
    assert!(
        e.starts_with(&format!(
            "[E1009] Refusing to kill sandbox '{id}' without confirmation"
        )),
        "{e}"
    );
    assert!(e.contains(&format!("abx kill {id} --yes")), "{e}");
    let v = err_json(&home, &["kill", &id], "E1009", 2);
    assert!(v["suggestion"].as_str().unwrap().contains("--yes"));
    assert_eq!(ok_json(&home, &["info", &id])["status"], "running");
    // shell has no JSON form.
    err_json(&home, &["shell", &id], "E1009", 2);

    // Unknown command: clap's error plus the hint; exit 2.
    let o = run_code(&home, &["process", "list"], 2);
    let e = stderr(&o);
    assert!(e.contains("unrecognized subcommand 'process'"), "{e}");
    assert!(e.contains("Did you mean 'abx sandbox process'?"), "{e}");
    assert!(e.contains("See 'abx --help' for the command list"), "{e}");
    let o = run_code(&home, &["frobnicate"], 2);
    assert!(stderr(&o).contains("See 'abx --help' for the command list"));
    let v = err_json(&home, &["frobnicate"], "E1009", 2);
    assert!(v["message"].as_str().unwrap().contains("frobnicate"), "{v}");
    // Missing arguments, unknown flags, bad values: clap, exit 2.
    for args in [
        vec!["info"],
        vec!["exec", &id],
        vec!["upload", &id, "a"],
        vec!["provider", "list", "-q"],
        vec!["list", "--bogus"],
        vec!["set-timeout", &id, "soon"],
        vec!["ports", &id, "99999"],
        vec!["create", "--metadata", "novalue"],
        vec!["completions", "tcsh"],
    ] {
        let o = run_code(&home, &args, 2);
        assert!(
            stderr(&o).starts_with("error: "),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    // A bad timeout from the broker: E2004, exit 2.
    err_human(&home, &["create", "--timeout", "99999999"], "E2004", 2);
    err_human(
        &home,
        &["create", "--template", "python:3.12-slim"],
        "E2005",
        4,
    );
    // Help and version: exit 0.
    assert!(ok(&home, &["--help"]).contains("sandbox"));
    assert!(ok(&home, &["--version"]).starts_with("abx "));

    // Completions for the three shells.
    for (shell, marker) in [
        ("bash", "complete"),
        ("zsh", "#compdef abx"),
        ("fish", "complete -c abx"),
    ] {
        let out = ok(&home, &["completions", shell]);
        assert!(out.len() > 1000 && out.contains(marker), "{shell}");
        assert!(out.contains("set-timeout"), "{shell}");
    }
    assert!(ok_json(&home, &["completions", "bash"])["script"]
        .as_str()
        .unwrap()
        .contains("complete"));

    // A daemon that cannot start: E1007, exit 1, in both forms.
    let file = home.path.join("a-file");
    std::fs::write(&file, "").unwrap();
    let mut broken = Home::new();
    broken
        .env
        .push(("ABX_HOME".into(), file.join("sub").display().to_string()));
    let e = err_human(&broken, &["list"], "E1007", 1);
    assert!(e.contains("not reachable"), "{e}");
    err_json(&broken, &["list"], "E1007", 1);
}

/// Read a pty session to its end; assert the exit code.
#[track_caller]
fn finish(mut p: PtyChild, code: i32) -> String {
    let (out, got) = p.finish();
    assert_eq!(got, code, "{out:?}");
    out
}

#[test]
fn kill_asks_on_a_terminal() {
    let home = Home::new();
    home.start();
    let id = create(&home);
    // N: refused, exit 2, still running.
    let mut p = home.spawn_pty(&["kill", &id], 100, 30);
    p.expect(&format!("Kill sandbox {id}? [y/N]: "));
    p.write(b"n\n");
    let out = finish(p, 2);
    assert!(out.contains("[E1009] Aborted"), "{out:?}");
    assert_eq!(ok_json(&home, &["info", &id])["status"], "running");
    // Enter alone is no.
    let mut p = home.spawn_pty(&["kill", &id], 100, 30);
    p.expect("[y/N]: ");
    p.write(b"\n");
    finish(p, 2);
    // y: killed.
    let mut p = home.spawn_pty(&["kill", &id], 100, 30);
    p.expect(&format!("Kill sandbox {id}? [y/N]: "));
    p.write(b"y\n");
    let out = finish(p, 0);
    assert!(out.contains(&format!("Sandbox {id} killed.")), "{out:?}");
    err_human(&home, &["info", &id], "E2009", 4);
}

#[test]
fn shell_runs_on_a_pty_with_resize_and_exit_code() {
    let home = Home::new();
    home.start();
    let id = create(&home);
    let mut p = home.spawn_pty(&["shell", &id], 100, 30);
    // Raw mode: keystrokes go through as typed; \r is Enter.
    p.write(b"echo hel''lo-$((6*7)); stty size\r");
    p.expect("hello-42");
    p.expect("30 100");
    // A window change reaches the remote pty.
    abx_tests::set_winsize(std::os::fd::AsRawFd::as_raw_fd(&p.master), 120, 40);
    // The resize travels (SIGWINCH, exec/resize, the remote pty): ask for the size until
    // the answer is the new one, each time after the previous answer came.
    let answers = |p: &abx_tests::PtyChild| {
        let t = p.text();
        t.matches("30 100").count() + t.matches("40 120").count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !p.text().contains("40 120") {
        let before = answers(&p);
        p.write(b"stty size\r");
        while answers(&p) == before {
            assert!(
                std::time::Instant::now() < deadline,
                "no stty answer: {:?}",
                p.text()
            );
            assert!(
                p.pump(std::time::Duration::from_millis(50)).is_some(),
                "{:?}",
                p.text()
            );
        }
    }
    // Raw mode while the session runs; the terminal's settings come back at the end.
    assert_eq!(p.lflag() & (libc::ICANON | libc::ECHO), 0);
    p.write(b"exit 7\r");
    let (out, code) = p.finish();
    assert_eq!(code, 7, "{out:?}");
    let lflag = p.lflag();
    assert_eq!(
        lflag & (libc::ICANON | libc::ECHO),
        libc::ICANON | libc::ECHO
    );
    // A command instead of the shell; its exit code.
    let p = home.spawn_pty(
        &["shell", &id, "--", "test -t 0 && echo on-a-tty; exit 3"],
        80,
        24,
    );
    let out = finish(p, 3);
    assert!(out.contains("on-a-tty"), "{out:?}");
}

#[test]
fn tables_fit_the_terminal_and_progress_shows_there() {
    let home = Home::new();
    home.start();
    let id = create(&home);
    let long = format!("{}.txt", "long-name-".repeat(12));
    ok(&home, &["sandbox", "files", "mkdir", &id, "w"]);
    let o = home.run_with_input(
        &["sandbox", "files", "write", &id, &format!("w/{long}")],
        b"x",
    );
    assert!(o.status.success());
    let p = home.spawn_pty(&["sandbox", "files", "list", &id, "--path", "w"], 50, 20);
    let out = finish(p, 0);
    let lines: Vec<&str> = out.lines().map(|l| l.trim_end_matches('\r')).collect();
    assert!(lines.iter().all(|l| l.chars().count() <= 50), "{out}");
    // Wrapped, not cut: the name's pieces add up to the whole name.
    let name: String = lines
        .iter()
        .filter(|l| l.starts_with('│'))
        .map(|l| l.split('│').nth(1).unwrap().trim())
        .collect();
    assert_eq!(name, long, "{out}");
    // A progress bar on a terminal's stderr.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("p.bin");
    std::fs::write(&f, vec![7u8; 3 << 20]).unwrap();
    let p = home.spawn_pty(&["upload", &id, f.to_str().unwrap(), "p.bin"], 100, 20);
    let out = finish(p, 0);
    assert!(out.contains("Uploading ") && out.contains("%"), "{out:?}");
    assert!(out.contains("Uploaded "), "{out:?}");
}
