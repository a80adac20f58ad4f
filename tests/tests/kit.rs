//! The contract kit (`provider/test`) end to end: it passes on `local` and on the fixture
//! plugins py-local and node-local, reports each violation of the deliberately broken
//! `bad-contract` fixture, refuses a tampered plugin with E8011, and cleans up every sandbox
//! it creates. Real daemon, real plugin processes.

use abx_tests::fixtures::{self, install_pinned};
use abx_tests::{abx_code, Client, Home};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The eighteen tests of the seed's `abx provider test opensandbox`.
const SEED_TESTS: &[&str] = &[
    "test_declared_features_are_known",
    "test_describe_never_exposes_secret_defaults",
    "test_lifecycle",
    "test_kill_is_idempotent",
    "test_set_timeout",
    "test_pause_resume",
    "test_exec_run",
    "test_exec_exit_code_stderr_and_env",
    "test_exec_stream_order_and_single_exit",
    "test_exec_timeout_is_enforced",
    "test_process_list",
    "test_files_roundtrip",
    "test_files_binary_and_unicode",
    "test_files_directory_operations",
    "test_missing_file_is_a_typed_not_found",
    "test_ports_url",
    "test_undeclared_feature_fails_with_e8004",
    "test_secret_options_are_redacted_from_errors",
];

/// Tests none of the providers here can run: `local` declares every feature that has a
/// method, so no method is left to be refused with E8004.
const NOBODY: &[&str] = &["test_undeclared_feature_fails_with_e8004"];

/// A started daemon with extra environment, and a client that waits long enough for a
/// whole kit run.
fn started(home_env: &[(&str, &str)]) -> (Home, Client) {
    let (home, c) = fixtures::started(home_env);
    // A kit run answers after its slowest test; notifications come as tests finish.
    c.stream
        .set_read_timeout(Some(Duration::from_secs(180)))
        .unwrap();
    (home, c)
}

/// One kit run: the reply and the `provider/testResult` notifications that came before it.
struct Run {
    result: Value,
    notes: Vec<Value>,
    wall: Duration,
}

impl Run {
    fn results(&self) -> &Vec<Value> {
        self.result["results"].as_array().expect("results array")
    }

    fn get(&self, name: &str) -> &Value {
        self.results()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not in the results: {}", self.result))
    }

    fn names(&self, outcome: &str) -> BTreeSet<String> {
        self.results()
            .iter()
            .filter(|r| r["outcome"] == outcome)
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    }

    fn print(&self, id: &str) {
        for r in self.results() {
            let detail = r["detail"].as_str().unwrap_or_default();
            eprintln!(
                "{:<7} {:<48} {:>6} ms  {detail}",
                r["outcome"].as_str().unwrap(),
                r["name"].as_str().unwrap(),
                r["durationMs"]
            );
        }
        eprintln!(
            "kit on {id}: {} passed, {} failed, {} skipped; {} ms in the broker, {} ms round trip",
            self.result["passed"],
            self.result["failed"],
            self.result["skipped"],
            self.result["durationMs"],
            self.wall.as_millis()
        );
    }
}

fn kit(c: &mut Client, params: Value) -> Run {
    let t0 = Instant::now();
    let r = c.request("provider/test", params);
    let wall = t0.elapsed();
    assert!(r.get("error").is_none(), "provider/test failed: {r}");
    let mut notes = Vec::new();
    while let Some(m) = c.try_recv(Duration::from_millis(1)) {
        if m["method"] == "provider/testResult" {
            notes.push(m["params"].clone());
        }
    }
    Run {
        result: r["result"].clone(),
        notes,
        wall,
    }
}

/// The shape every run must have: counts, stable order, a notification per result.
fn check_shape(run: &Run, id: &str) {
    let results = run.results();
    let count = |o: &str| results.iter().filter(|r| r["outcome"] == o).count() as u64;
    assert_eq!(run.result["passed"], count("passed"));
    assert_eq!(run.result["failed"], count("failed"));
    assert_eq!(run.result["skipped"], count("skipped"));
    for r in results {
        assert!(
            ["passed", "failed", "skipped"].contains(&r["outcome"].as_str().unwrap()),
            "{r}"
        );
        assert!(r["durationMs"].is_u64(), "{r}");
        if r["outcome"] != "passed" {
            assert!(
                !r["detail"].as_str().unwrap_or_default().is_empty(),
                "a {} test says why: {r}",
                r["outcome"]
            );
        }
    }
    // One notification per test, carrying the provider id and the same outcome.
    assert_eq!(run.notes.len(), results.len(), "{:?}", run.notes);
    for n in &run.notes {
        assert_eq!(n["id"], id, "{n}");
        let r = run.get(n["name"].as_str().unwrap());
        assert_eq!(n["outcome"], r["outcome"], "{n} vs {r}");
        assert_eq!(n["detail"], r["detail"], "{n} vs {r}");
    }
    // Stable order: the seed's tests first, in the seed's order.
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    if names.len() >= SEED_TESTS.len() {
        assert_eq!(&names[..SEED_TESTS.len()], SEED_TESTS);
    }
}

/// Nothing the kit created is left.
fn assert_no_sandboxes(c: &mut Client, id: &str) {
    let list = c.call("sandbox/list", json!({"provider": id}));
    assert_eq!(
        list["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "the kit left sandboxes behind on {id}: {list}"
    );
}

/// Every test ran: none failed, and the skipped ones are exactly `skipped`, each saying
/// which feature is not declared.
fn assert_passes(run: &Run, skipped: &[&str]) {
    assert_eq!(
        run.names("failed"),
        BTreeSet::new(),
        "failures: {}",
        serde_json::to_string_pretty(
            &run.results()
                .iter()
                .filter(|r| r["outcome"] == "failed")
                .collect::<Vec<_>>()
        )
        .unwrap()
    );
    let want: BTreeSet<String> = skipped.iter().map(|s| s.to_string()).collect();
    assert_eq!(run.names("skipped"), want);
    for name in skipped {
        let d = run.get(name)["detail"].as_str().unwrap().to_owned();
        assert!(
            d.starts_with("provider does not declare ")
                || d == "the provider declares every feature that has a method",
            "{name}: {d}"
        );
    }
    for name in SEED_TESTS {
        run.get(name);
    }
}

#[test]
fn kit_passes_on_local() {
    let (_home, mut c) = started(&[]);
    let run = kit(&mut c, json!({"id": "local"}));
    run.print("local");
    check_shape(&run, "local");
    assert_passes(&run, NOBODY);
    assert_no_sandboxes(&mut c, "local");
    // A second run right away. Durations are printed, never asserted (docs/design.md#bars's bar of
    // 2 s for the whole kit on local is a release-build figure).
    let run2 = kit(&mut c, json!({"id": "local"}));
    eprintln!(
        "kit on local, second run: {} ms in the broker, {} ms round trip",
        run2.result["durationMs"],
        run2.wall.as_millis()
    );
    assert_eq!(run2.result["failed"], 0, "{}", run2.result);

    // Filters: a substring or a comma list; only the selected tests are reported.
    let f = kit(
        &mut c,
        json!({"id": "local", "filter": "test_lifecycle, kill_is"}),
    );
    let names: Vec<&str> = f
        .results()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["test_lifecycle", "test_kill_is_idempotent"]);
    assert_eq!(f.notes.len(), 2);
    let f = kit(&mut c, json!({"id": "local", "filter": "files"}));
    assert_eq!(f.results().len(), 5, "{}", f.result);
    assert!(f
        .results()
        .iter()
        .all(|r| r["name"].as_str().unwrap().contains("files")));
    let e = c.call_err(
        "provider/test",
        json!({"id": "local", "filter": "no-such-test"}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    let e = c.call_err("provider/test", json!({"id": "nope"}));
    assert_eq!(abx_code(&e), "E8001", "{e}");
    assert_eq!(e["message"], "Provider 'nope' is not installed.");
    assert_no_sandboxes(&mut c, "local");

    // A kit run cancelled half-way still kills every sandbox it made.
    c.send(r#"{"jsonrpc":"2.0","id":"kit-1","method":"provider/test","params":{"id":"local"}}"#);
    let mut seen = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen && Instant::now() < deadline {
        let list = c.call("sandbox/list", json!({"provider": "local"}));
        seen = !list["sandboxes"].as_array().unwrap().is_empty();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(seen, "the kit made no sandbox");
    c.send(r#"{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"kit-1"}}"#);
    loop {
        let m = c.recv();
        if m["id"] == "kit-1" {
            assert_eq!(m["error"]["code"], -32800, "{m}");
            break;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = c.call("sandbox/list", json!({"provider": "local"}));
        if list["sandboxes"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a cancelled kit run left sandboxes behind: {list}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

const PLUGIN_SKIPS: &[&str] = &[
    "test_pause_resume",
    "test_ports_url",
    "test_pty_and_resize",
    "test_files_watch",
    "test_code_run",
    "test_code_state_kept",
    "test_code_error_shape",
    "test_code_cancel_keeps_state",
    "test_code_rich_result",
    "test_templates_list",
    "test_templates_build_is_typed",
];

#[test]
fn kit_passes_on_py_local() {
    // A secret value in the broker's environment: the redaction test then really checks.
    let (_home, mut c) = started(&[("PY_LOCAL_TOKEN", "tk-kit-secret-4711")]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let run = kit(&mut c, json!({"id": "py-local"}));
    run.print("py-local");
    check_shape(&run, "py-local");
    assert_passes(&run, PLUGIN_SKIPS);
    let d = run.get("test_secret_options_are_redacted_from_errors")["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(d.starts_with("1 secret value(s) checked"), "{d}");
    assert!(!run.result.to_string().contains("tk-kit-secret-4711"));
    assert_no_sandboxes(&mut c, "py-local");
}

#[test]
fn kit_passes_on_node_local() {
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("node is not installed: skipping");
        return;
    }
    let (_home, mut c) = started(&[("NODE_LOCAL_TOKEN", "tk-kit-secret-0815")]);
    let (_repo, _) = install_pinned(&mut c, "node-local");
    let run = kit(&mut c, json!({"id": "node-local"}));
    run.print("node-local");
    check_shape(&run, "node-local");
    let mut skips = PLUGIN_SKIPS.to_vec();
    skips.push("test_process_list");
    assert_passes(&run, &skips);
    assert_no_sandboxes(&mut c, "node-local");
}

#[test]
fn kit_reports_each_broken_contract() {
    let (_home, mut c) = started(&[("BAD_CONTRACT_TOKEN", "tk-kit-leaked-1234")]);
    let (_repo, _) = install_pinned(&mut c, "bad-contract");
    let run = kit(&mut c, json!({"id": "bad-contract"}));
    run.print("bad-contract");
    check_shape(&run, "bad-contract");
    let failed = |name: &str, needles: &[&str]| {
        let r = run.get(name);
        assert_eq!(r["outcome"], "failed", "{name} must fail: {r}");
        let d = r["detail"].as_str().unwrap();
        for n in needles {
            assert!(d.contains(n), "{name}: {n:?} missing from {d:?}");
        }
    };
    // 1. exit codes ignored.
    failed(
        "test_exec_exit_code_stderr_and_env",
        &["exitCode 0", "expected 3"],
    );
    // 2. a generic error for a missing file.
    failed(
        "test_missing_file_is_a_typed_not_found",
        &["files/read of a missing file", "E9001", "E4001"],
    );
    // 3. kill not idempotent.
    failed(
        "test_kill_is_idempotent",
        &["second sandbox/kill", "E2009", "idempotent"],
    );
    // 4. exec/exit before the output (and twice).
    failed(
        "test_exec_stream_order_and_single_exit",
        &["0 of 300 lines", "exec/exit"],
    );
    // 5. a declared feature that is not implemented.
    failed(
        "test_pause_resume",
        &["declares 'sandbox.pause'", "E1003", "not implemented"],
    );
    // 6. connect changes the lifetime.
    failed(
        "test_connect_keeps_lifetime",
        &["expiresAt", "keep the lifetime"],
    );
    // 7. a secret leaks into commands (named by key, never by value).
    failed(
        "test_secret_options_are_redacted_from_errors",
        &["secret key 'token'", "environment of a command"],
    );
    // 8. a result of the wrong shape (every result is checked against docs/openrpc.json).
    failed(
        "test_files_roundtrip",
        &[
            "files/stat",
            "docs/openrpc.json",
            "result.modifiedAt: a number where the API has string",
        ],
    );
    assert!(
        !run.result.to_string().contains("tk-kit-leaked-1234"),
        "the kit's report must not quote the secret"
    );
    // What the fixture did not break still passes.
    for ok in [
        "test_declared_features_are_known",
        "test_describe_never_exposes_secret_defaults",
        "test_exec_run",
        "test_files_binary_and_unicode",
        "test_undeclared_feature_fails_with_e8004",
        "test_concurrent_calls_from_two_clients",
    ] {
        assert_eq!(run.get(ok)["outcome"], "passed", "{}", run.get(ok));
    }
    // Even a provider whose kill is broken gets its sandboxes killed.
    assert_no_sandboxes(&mut c, "bad-contract");
}

#[test]
fn kit_refuses_a_tampered_plugin_with_e8011() {
    let (_home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let info = c.call("provider/info", json!({"id": "py-local"}));
    let root = PathBuf::from(info["path"].as_str().unwrap());
    let _ = std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755));
    let _ = std::fs::set_permissions(
        root.join("provider.py"),
        std::fs::Permissions::from_mode(0o644),
    );
    std::fs::write(root.join("provider.py"), "print('evil')\n").unwrap();
    let e = c.call_err("provider/test", json!({"id": "py-local"}));
    assert_eq!(abx_code(&e), "E8011", "{e}");
    assert_eq!(
        e["message"],
        "Provider 'py-local': files changed since install."
    );
    // No test ran: nothing was reported.
    assert!(c.try_recv(Duration::from_millis(100)).is_none());
}

/// Issue 21: the CLI sets the kit's concurrency (`--concurrency N`, as `provider/test` can):
/// with 1 the tests run one after another, so their durations add up to at most the run's.
#[test]
fn cli_sets_the_kits_concurrency() {
    let (home, _c) = started(&[]);
    let tests = "test_lifecycle,test_exec_run,test_files_roundtrip,test_exec_timeout_is_enforced";
    let o = home.run(&[
        "-j",
        "provider",
        "test",
        "local",
        "--filter",
        tests,
        "--concurrency",
        "1",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(r["concurrency"], 1, "{r}");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "{r}");
    let sum: u64 = results
        .iter()
        .map(|t| t["durationMs"].as_u64().unwrap())
        .sum();
    assert!(
        sum <= r["durationMs"].as_u64().unwrap(),
        "tests overlapped: {sum} ms of tests in {} ms",
        r["durationMs"]
    );
    // 0 is a usage error, refused before anything runs.
    let o = home.run(&["provider", "test", "local", "--concurrency", "0"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}
