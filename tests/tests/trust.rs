//! Issue 19, plugin trust without holes, against the real daemon and real
//! plugin processes: one bad provider never hides the others (`sandbox/list`, `abx list`,
//! MCP `sandbox_list`), the integrity check never stalls the daemon and refuses a tree past
//! the install caps at once, a `.git` appearing in an installed tree is E8011, and bare ids
//! of sandboxes made directly on a provider's server (the OpenSandbox stand-in) resolve, a
//! plugin cannot reach the broker's socket or see its state (with namespaces, and refused by
//! ancestry without them), and swapping the installed code while the plugin restarts never
//! runs it (each start runs a private copy hashed as it was made).

use abx_tests::fixtures::{copy_dir, git, install_pinned, started};
use abx_tests::{abx_code, wait_until, Client, Home, READ_TIMEOUT};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The installed tree of a provider, made writable (as an attacker with the user's rights).
fn installed_root(c: &mut Client, id: &str) -> PathBuf {
    let info = c.call("provider/info", json!({"id": id}));
    let root = PathBuf::from(info["path"].as_str().expect("path"));
    let _ = std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755));
    root
}

fn tamper_py_local(c: &mut Client) {
    let root = installed_root(c, "py-local");
    let f = root.join("provider.py");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&f, "# tampered\n").unwrap();
}

fn ids(list: &Value) -> Vec<String> {
    list["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| {
            format!(
                "{}:{}",
                s["provider"].as_str().unwrap_or(""),
                s["id"].as_str().unwrap()
            )
        })
        .collect()
}

/// `abx mcp` over raw JSON lines (the 2025-11-25 handshake): one `tools/call`.
fn mcp_tool(home: &Home, tool: &str, args: Value) -> Value {
    let mut child: Child = home
        .abx()
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn abx mcp");
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut send = move |v: Value| {
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    let recv_id = |id: i64| loop {
        let line = rx
            .recv_timeout(READ_TIMEOUT)
            .expect("abx mcp answered in time");
        let v: Value = serde_json::from_str(&line).expect("JSON line");
        if v["id"] == id {
            return v;
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "trust-test", "version": "0"}}}),
    );
    let init = recv_id(1);
    assert!(init.get("result").is_some(), "{init}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": args}}));
    let r = recv_id(2);
    drop(send); // closes stdin: abx mcp exits
    let _ = child.wait();
    r["result"].clone()
}

#[test]
fn a_tampered_provider_beside_local_hides_nothing() {
    let (home, mut c) = started(&[]);
    let local = c.create(json!({"provider": "local"}));
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (plugin_sb, _) = abx_tests::fixtures::plugin_sandbox(&mut c, "py-local");
    tamper_py_local(&mut c);

    // The broker: local's sandboxes, and the broken provider named with its error.
    let r = c.call("sandbox/list", json!({}));
    assert!(ids(&r).contains(&format!("local:{local}")), "{r}");
    assert!(
        !ids(&r).iter().any(|i| i.ends_with(&plugin_sb)),
        "the tampered plugin was not asked: {r}"
    );
    let errors = r["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors: {r}"));
    assert_eq!(errors.len(), 1, "{r}");
    assert_eq!(errors[0]["provider"], "py-local");
    assert_eq!(errors[0]["code"], "E8011");
    assert_eq!(
        errors[0]["message"],
        "Provider 'py-local': files changed since install."
    );
    assert_eq!(
        errors[0]["suggestion"],
        "Reinstall or run 'abx provider update py-local'."
    );
    // Asked alone, the provider still fails with its own error.
    let e = c.call_err("sandbox/list", json!({"provider": "py-local"}));
    assert_eq!(abx_code(&e), "E8011", "{e}");
    // Local alone: no errors key.
    let r = c.call("sandbox/list", json!({"provider": "local"}));
    assert!(r.get("errors").is_none(), "{r}");

    // The CLI: the table, a warning line naming the provider, exit 1.
    let o = home.run(&["list"]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert_eq!(o.status.code(), Some(1), "stdout: {out}\nstderr: {err}");
    assert!(out.contains("ID"), "{out}");
    assert!(out.contains(&format!("local:{local}")), "{out}");
    assert_eq!(
        err,
        "Warning: provider 'py-local' could not list its sandboxes: [E8011] Provider 'py-local': files changed since install.\n  Suggestion: Reinstall or run 'abx provider update py-local'.\n"
    );
    // -j carries both.
    let o = home.run(&["-j", "list"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert!(ids(&v).contains(&format!("local:{local}")), "{v}");
    assert_eq!(v["errors"][0]["provider"], "py-local", "{v}");
    assert_eq!(v["errors"][0]["code"], "E8011", "{v}");

    // MCP: a result (not an error) with the sandboxes, naming the broken provider.
    let r = mcp_tool(&home, "sandbox_list", json!({}));
    assert_eq!(r["isError"], false, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.contains(&local), "{text}");
    assert!(
        text.contains("Warning: provider 'py-local' could not list its sandboxes: [E8011]"),
        "{text}"
    );
    assert_eq!(
        r["structuredContent"]["errors"][0]["provider"], "py-local",
        "{r}"
    );
}

#[test]
fn a_plugin_failing_its_handshake_beside_local_hides_nothing() {
    let (home, mut c) = started(&[("ABX_PLUGIN_HANDSHAKE_SECS", "1")]);
    let local = c.create(json!({"provider": "local"}));
    let (_repo, _) = install_pinned(&mut c, "bad-handshake");
    let r = c.call("sandbox/list", json!({}));
    assert!(ids(&r).contains(&format!("local:{local}")), "{r}");
    let errors = r["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors: {r}"));
    assert_eq!(errors.len(), 1, "{r}");
    assert_eq!(errors[0]["provider"], "bad-handshake");
    assert_eq!(errors[0]["code"], "E8002", "{r}");
    let o = home.run(&["list"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("local:{local}")));
    assert!(String::from_utf8_lossy(&o.stderr)
        .starts_with("Warning: provider 'bad-handshake' could not list its sandboxes: [E8002]"));
}

/// Round-trip time of one `broker/ping`.
fn ping(c: &mut Client) -> Duration {
    let t = Instant::now();
    c.call("broker/ping", json!({}));
    t.elapsed()
}

#[test]
fn a_huge_file_after_install_is_e8011_at_once_and_ping_stays_fast() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let root = installed_root(&mut c, "py-local");
    // 64 GiB, sparse: costs no disk, but hashing it would take tens of seconds per call.
    std::fs::File::create(root.join("huge.bin"))
        .unwrap()
        .set_len(64 << 30)
        .unwrap();

    let baseline = (0..20).map(|_| ping(&mut c)).max().unwrap();

    // Hashing 64 GiB takes minutes; refusing it without hashing takes milliseconds. Asked
    // from another connection so that a daemon that hashes fails here, not hangs.
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut other = home.connect();
    std::thread::spawn(move || {
        let e = other.request("sandbox/list", json!({"provider": "py-local"}));
        let _ = tx.send(e);
    });
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("E8011 within 10 s (the tree must not be hashed)");
    assert_eq!(abx_code(&e["error"]), "E8011", "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

    // Three doctors at once (each in its own connection) while pings are timed.
    let doctors: Vec<_> = (0..3)
        .map(|_| {
            let mut d = home.connect();
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let r = d.call("provider/doctor", json!({"id": "py-local"}));
                    let integ = r["checks"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|x| x["name"] == "integrity")
                        .cloned()
                        .unwrap();
                    assert_eq!(integ["ok"], false, "{r}");
                    assert_eq!(integ["code"], "E8011", "{r}");
                }
            })
        })
        .collect();
    let mut worst = Duration::ZERO;
    let mut pings = 0;
    while !doctors.iter().all(|d| d.is_finished()) || pings < 20 {
        worst = worst.max(ping(&mut c));
        pings += 1;
    }
    for d in doctors {
        d.join().expect("doctor thread");
    }
    // Generous: a ping may be many times slower on a loaded machine, never seconds slower.
    let bound = (baseline * 50).max(Duration::from_secs(2));
    assert!(
        worst < bound,
        "broker/ping took {worst:?} while doctor ran (baseline {baseline:?}, bound {bound:?})"
    );
}

#[test]
fn a_git_dir_appearing_in_an_installed_tree_is_e8011() {
    let (_home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    c.call("sandbox/list", json!({"provider": "py-local"}));
    let root = installed_root(&mut c, "py-local");
    std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
    std::fs::write(
        root.join(".git/hooks/post-checkout"),
        "#!/bin/sh\necho evil\n",
    )
    .unwrap();
    let e = c.call_err("sandbox/list", json!({"provider": "py-local"}));
    assert_eq!(abx_code(&e), "E8011", "{e}");
    let doc = c.call("provider/doctor", json!({"id": "py-local"}));
    assert_eq!(doc["ok"], false, "{doc}");
    // Removing it restores the tree as installed.
    std::fs::remove_dir_all(root.join(".git")).unwrap();
    c.call("sandbox/list", json!({"provider": "py-local"}));
    // Even an empty .git is refused: an installed tree never holds one.
    std::fs::create_dir(root.join(".git")).unwrap();
    let e = c.call_err("sandbox/list", json!({"provider": "py-local"}));
    assert_eq!(abx_code(&e), "E8011", "{e}");
}

/// The OpenSandbox stand-in on loopback, stopped on drop.
struct StandIn {
    child: Child,
    url: String,
    key: String,
}

impl StandIn {
    fn start() -> StandIn {
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("opensandbox/server.mjs");
        let key = format!("osb-trust-{}", std::process::id());
        let mut child = Command::new("node")
            .arg(&here)
            .args(["--port", "0", "--host", "127.0.0.1"])
            .env("OSB_STANDIN_API_KEY", &key)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node server.mjs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("stand-in output");
        let url = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("stand-in said {line:?}"))
            .to_owned();
        StandIn { child, url, key }
    }

    /// Create a sandbox directly on the server (not through abx); returns its id.
    fn create_directly(&self) -> String {
        let script = r#"
const [url, key] = process.argv.slice(1);
const r = await fetch(url + "/v1/sandboxes", {method: "POST",
  headers: {"OPEN-SANDBOX-API-KEY": key, "content-type": "application/json"},
  body: JSON.stringify({image: {uri: "ubuntu:22.04"}, entrypoint: ["tail", "-f", "/dev/null"],
    timeout: 600, resourceLimits: {cpu: "1", memory: "1Gi"}})});
const b = await r.json();
if (!b.id) { console.error(JSON.stringify(b)); process.exit(1); }
process.stdout.write(b.id);
"#;
        let o = Command::new("node")
            .args(["--input-type=module", "-e", script, &self.url, &self.key])
            .output()
            .expect("node");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Install the OpenSandbox plugin of this repository under `id`, pointed at `server`.
fn install_opensandbox(
    home: &Home,
    c: &mut Client,
    id: &str,
    server: &StandIn,
) -> tempfile::TempDir {
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../extensions/providers/opensandbox");
    let repo = tempfile::tempdir().unwrap();
    let dir = repo.path().join("p");
    copy_dir(&plugin, &dir);
    let m = std::fs::read_to_string(dir.join("abx-provider.toml")).unwrap();
    std::fs::write(
        dir.join("abx-provider.toml"),
        m.replacen("id = \"opensandbox\"", &format!("id = \"{id}\""), 1),
    )
    .unwrap();
    // The id it says at the handshake, too.
    let lib = dir.join("lib/provider.mjs");
    let code = std::fs::read_to_string(&lib).unwrap();
    std::fs::write(
        &lib,
        code.replacen("id: \"opensandbox\"", &format!("id: \"{id}\""), 1),
    )
    .unwrap();
    git(repo.path(), &["init", "-q", "-b", "main"]);
    git(repo.path(), &["add", "-A"]);
    git(repo.path(), &["commit", "-q", "-m", "osb"]);
    let commit = git(repo.path(), &["rev-parse", "HEAD"]);
    let url = format!("file://{}", repo.path().display());
    let r = c.request(
        "provider/install",
        json!({"source": url, "subdir": "p", "ref": commit, "allowInsecureTransport": true, "confirm": true}),
    );
    assert!(r.get("error").is_none(), "install {id}: {r}");
    c.call(
        "provider/configure",
        json!({"id": id, "values": {"base_url": server.url, "api_key": server.key}}),
    );
    let _ = home;
    repo
}

#[test]
fn bare_ids_of_sandboxes_made_on_the_providers_server_resolve() {
    let server = StandIn::start();
    let (home, mut c) = started(&[]);
    let _repo = install_opensandbox(&home, &mut c, "opensandbox", &server);
    let id = server.create_directly();

    // Listed by abx, but this broker never saw it made.
    let list = c.call("sandbox/list", json!({}));
    assert!(ids(&list).contains(&format!("opensandbox:{id}")), "{list}");
    // The bare id resolves through the providers: the broker and the CLI.
    let sb = c.call("sandbox/info", json!({"sandbox": id}));
    assert_eq!(sb["id"], id.as_str(), "{sb}");
    assert_eq!(sb["provider"], "opensandbox", "{sb}");
    let o = home.run(&["-j", "info", &id]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["provider"], "opensandbox", "{v}");
    // An id nobody holds is still E2009, in bounded time.
    let t = Instant::now();
    let e = c.call_err("sandbox/info", json!({"sandbox": "no-such-sandbox"}));
    assert_eq!(abx_code(&e), "E2009", "{e}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());

    // A second provider on the same server holds the same id: ambiguous, both named.
    let id2 = server.create_directly();
    let _repo2 = install_opensandbox(&home, &mut c, "osb-two", &server);
    let e = c.call_err("sandbox/info", json!({"sandbox": id2}));
    assert_eq!(abx_code(&e), "E1004", "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("opensandbox:{id2}")) && msg.contains(&format!("osb-two:{id2}")),
        "{msg}"
    );
    let mut cands: Vec<String> = e["data"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_owned())
        .collect();
    cands.sort();
    assert_eq!(
        cands,
        vec![format!("opensandbox:{id2}"), format!("osb-two:{id2}")]
    );
    // provider:id is explicit; the CLI exits 2 on the ambiguous bare id.
    let sb = c.call("sandbox/info", json!({"sandbox": format!("osb-two:{id2}")}));
    assert_eq!(sb["provider"], "osb-two", "{sb}");
    let o = home.run(&["info", &id2]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("[E1004]"));
    // The one the broker resolved before is in its index now: no longer ambiguous for it.
    let sb = c.call("sandbox/info", json!({"sandbox": id}));
    assert_eq!(sb["provider"], "opensandbox", "{sb}");
    c.call(
        "sandbox/kill",
        json!({"sandbox": format!("opensandbox:{id}")}),
    );
    c.call(
        "sandbox/kill",
        json!({"sandbox": format!("opensandbox:{id2}")}),
    );
}

#[test]
fn a_provider_whose_server_is_down_beside_local_hides_nothing() {
    let server = StandIn::start();
    let (home, mut c) = started(&[]);
    let _repo = install_opensandbox(&home, &mut c, "opensandbox", &server);
    let local = c.create(json!({"provider": "local"}));
    let remote = server.create_directly();
    let r = c.call("sandbox/list", json!({}));
    assert!(ids(&r).contains(&format!("opensandbox:{remote}")), "{r}");
    assert!(r.get("errors").is_none(), "{r}");
    drop(server); // the OpenSandbox server goes down
    let r = c.call("sandbox/list", json!({}));
    assert!(ids(&r).contains(&format!("local:{local}")), "{r}");
    assert_eq!(r["errors"][0]["provider"], "opensandbox", "{r}");
    assert_eq!(r["errors"][0]["code"], "E8006", "{r}");
    let o = home.run(&["list"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("local:{local}")));
    assert!(String::from_utf8_lossy(&o.stderr)
        .starts_with("Warning: provider 'opensandbox' could not list its sandboxes: [E8006]"));
}

// ---------------------------------------------------------------------------------------
// No way to the broker from a plugin, and what runs is what was verified.

/// sock-probe installed from its fixture dir and configured with what an attacker who knows
/// the broker would use: the socket path, the daemon's pid, a local sandbox and a host path
/// for `files/download` to write. Returns the home, a client, the marker path and the
/// plugin's data dir.
fn sock_probe(env: &[(&str, &str)]) -> (Home, Client, PathBuf, PathBuf, Home) {
    let (home, mut c) = started(env);
    // Another daemon of the same user (an editor's, another ABX_HOME, the default one): the
    // plugin must not drive it either (issue 41).
    let (other, _) = started(&[]);
    let local = c.create(json!({"provider": "local"}));
    c.call(
        "provider/install",
        json!({"source": abx_tests::fixtures::fixture("sock-probe"), "confirm": true}),
    );
    let marker = home.path.join("written-by-the-plugin");
    c.call(
        "provider/configure",
        json!({"id": "sock-probe", "values": {
            "socket_path": home.socket(),
            "other_sockets": other.socket(),
            "daemon_pid": home.daemon_pid().expect("daemon pid").to_string(),
            "sandbox": format!("local:{local}"),
            "marker": marker,
        }}),
    );
    let data_dir = home.path.join("data/providers/sock-probe/data");
    assert!(data_dir.is_dir(), "{}", data_dir.display());
    (home, c, marker, data_dir, other)
}

/// The user's other daemon refused the plugin's connection (made: its socket is visible)
/// and said why in its log.
fn assert_refused_by_the_other_daemon(p: &Value, other: &Home, why: &str) {
    let a = p["attempts"]["other:0"].as_str().unwrap_or_default();
    assert!(a.starts_with("closed without an answer"), "other:0: {a}");
    wait_for_log(
        other,
        "the refusal in the other daemon's log",
        &[
            "refusing a connection from a sandbox or plugin process",
            why,
        ],
    );
}

/// Run the probe on a sandbox of the plugin.
fn probe(c: &mut Client) -> Value {
    let sb = c.create(json!({"provider": "sock-probe"}));
    c.call(
        "sandbox/systemInfo",
        json!({"sandbox": format!("sock-probe:{sb}")}),
    )["probes"]
        .clone()
}

fn assert_no_attempt_answered(p: &Value, marker: &Path) {
    let attempts = p["attempts"].as_object().expect("attempts");
    assert!(attempts.len() > 8, "{p}");
    for (name, outcome) in attempts {
        let outcome = outcome.as_str().unwrap_or_default();
        assert!(
            !outcome.starts_with("answered"),
            "the plugin drove the broker through '{name}': {outcome}"
        );
    }
    assert!(
        !marker.exists(),
        "files/download through the broker wrote {}",
        marker.display()
    );
}

fn wait_for_log(home: &Home, what: &str, needle: &[&str]) {
    wait_until(what, READ_TIMEOUT, || {
        std::fs::read_to_string(home.log_file())
            .is_ok_and(|log| log.lines().any(|l| needle.iter().all(|n| l.contains(n))))
    });
}

#[test]
fn a_plugin_cannot_reach_the_broker_socket_nor_see_its_state() {
    let (home, mut c, marker, data_dir, other) = sock_probe(&[]);
    // An attacker with the user's rights outside puts a hard link to the socket where the
    // plugin can see it: the peer rule alone must refuse it.
    std::fs::hard_link(home.socket(), data_dir.join("broker.sock")).unwrap();
    let p = probe(&mut c);
    eprintln!("{p:#}");
    assert_no_attempt_answered(&p, &marker);
    let a = &p["attempts"];
    // Hidden: the socket, the config dir and the registry are not even there.
    assert_eq!(p["socketVisible"], false, "{p}");
    let seen = p["stateSeen"].as_object().expect("stateSeen");
    assert!(seen.len() >= 4, "{p}");
    for (rel, there) in seen {
        assert_eq!(there, false, "the plugin sees {rel}: {p}");
    }
    for name in ["configured", "guessedFromDataDir", "procDaemonRoot"] {
        assert!(
            a[name].as_str().unwrap_or_default().starts_with("connect:"),
            "{name}: {}",
            a[name]
        );
    }
    // Its own /proc: a handful of pids, not the host's.
    assert!(p["pidsSeen"].as_u64().unwrap() < 10, "{p}");
    assert_ne!(p["signalDaemon"], "delivered", "{p}");
    // The hard link reached the socket; the daemon refused the peer and said why.
    assert!(
        a["hardLinkInDataDir"]
            .as_str()
            .unwrap_or_default()
            .starts_with("closed without an answer"),
        "{}",
        a["hardLinkInDataDir"]
    );
    wait_for_log(
        &home,
        "the refusal in the daemon's log",
        &[
            "refusing a connection from a sandbox or plugin process",
            "another PID namespace",
        ],
    );
    let info = c.call("provider/info", json!({"id": "sock-probe"}));
    assert_eq!(info["process"]["isolation"], "namespaces", "{info}");
    // The user's other daemons: their runtime dirs are empty in the plugin's view, and a
    // socket it finds elsewhere (another ABX_HOME) refuses it.
    let uid = unsafe { libc::geteuid() };
    for (dir, seen) in p["runtimeDirsSeen"].as_object().expect("runtimeDirsSeen") {
        assert!(
            seen.is_null() || seen == &json!([]),
            "the plugin sees {dir}: {seen}"
        );
    }
    assert!(p["runtimeDirsSeen"]
        .get(format!("/tmp/abx-{uid}"))
        .is_some());
    assert_refused_by_the_other_daemon(&p, &other, "another PID namespace");
    // The broker itself still answers its clients.
    assert_eq!(c.call("broker/ping", Value::Null), json!({}));
}

#[test]
fn without_namespaces_a_plugin_is_refused_by_ancestry_and_runs_from_a_private_copy() {
    let (home, mut c, marker, _, other) = sock_probe(&[("ABX_PLUGIN_ISOLATION", "none")]);
    let p = probe(&mut c);
    eprintln!("{p:#}");
    assert_no_attempt_answered(&p, &marker);
    // Another daemon, which never started this plugin, refuses it by its launcher's mark.
    assert_refused_by_the_other_daemon(&p, &other, "a launcher of another daemon");
    // The socket is visible here (and the broker's state), so the connection is made, and
    // refused.
    assert_eq!(p["socketVisible"], true, "{p}");
    assert_eq!(p["stateSeen"]["data/providers/installed.json"], true, "{p}");
    // The daemon's pid exists in its view, but no signal reaches it (Landlock scoping).
    if abx_tests::landlock_abi() >= 6 {
        assert_eq!(p["signalDaemon"], "refused: EPERM", "{p}");
    }
    assert!(
        p["attempts"]["configured"]
            .as_str()
            .unwrap_or_default()
            .starts_with("closed without an answer"),
        "{}",
        p["attempts"]["configured"]
    );
    wait_for_log(
        &home,
        "the refusal in the daemon's log",
        &[
            "refusing a connection from a sandbox or plugin process",
            "the peer is a process of plugin 'sock-probe'",
        ],
    );
    let info = c.call("provider/info", json!({"id": "sock-probe"}));
    let isolation = info["process"]["isolation"].as_str().unwrap_or_default();
    assert!(isolation.starts_with("none: "), "{info}");
    // It runs from a private copy under the runtime dir, removed when it stops.
    let copies = home.run_dir().join("plugins");
    let count = || std::fs::read_dir(&copies).map_or(0, |d| d.count());
    assert_eq!(count(), 1, "one private copy while it runs");
    c.call(
        "provider/configure",
        json!({"id": "sock-probe", "values": {"sandbox": "none"}}),
    );
    wait_until("the private copy removed", READ_TIMEOUT, || count() == 0);
}

#[test]
fn swapping_the_installed_code_while_the_plugin_restarts_never_runs_it() {
    let (home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let root = installed_root(&mut c, "py-local");
    let dir = root.parent().unwrap().to_path_buf();
    let target = root.join("provider.py");
    let good_text = std::fs::read(&target).unwrap();
    let mode = std::fs::metadata(&target).unwrap().permissions();
    // The tampered code leaves a mark in the plugin's data dir the moment it runs.
    let data_dir = dir.join("data");
    let mark = data_dir.join("TAMPERED");
    let mut bad_text = b"import os as _o\nopen(_o.path.join(_o.environ['ABX_DATA_DIR'], 'TAMPERED'), 'a').write('ran\\n')\n".to_vec();
    bad_text.extend_from_slice(&good_text);
    let (good, bad) = (dir.join("good.py"), dir.join("bad.py"));
    for (p, t) in [(&good, &good_text), (&bad, &bad_text)] {
        std::fs::write(p, t).unwrap();
        std::fs::set_permissions(p, mode.clone()).unwrap();
    }
    // Prove the mark works: run the tampered file as the plugin would.
    let o = Command::new("python3")
        .arg(&bad)
        .env("ABX_DATA_DIR", &data_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(mark.exists(), "{o:?}");
    std::fs::remove_file(&mark).unwrap();

    // Swap provider.py between the two, by hard link + rename, as fast as possible.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, dir, target) = (stop.clone(), dir.clone(), target.clone());
        let (good, bad) = (good.clone(), bad.clone());
        std::thread::spawn(move || {
            let tmp = dir.join(".swap");
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for from in [&bad, &good] {
                    let _ = std::fs::remove_file(&tmp);
                    if std::fs::hard_link(from, &tmp).is_ok()
                        && std::fs::rename(&tmp, &target).is_ok()
                    {
                        swaps += 1;
                    }
                }
            }
            swaps
        })
    };
    let (mut ran, mut refused) = (0, 0);
    let until = Instant::now() + Duration::from_secs(20);
    for i in 0..30 {
        if Instant::now() > until {
            break;
        }
        // A restart: the running plugin is stopped, the next call starts it.
        c.call(
            "provider/configure",
            json!({"id": "py-local", "values": {"greeting": format!("hello {i}")}}),
        );
        let r = c.request("sandbox/list", json!({"provider": "py-local"}));
        match r.get("error") {
            None => ran += 1,
            Some(e) => {
                assert_eq!(
                    abx_code(e),
                    "E8011",
                    "a start that is neither good nor E8011: {r}"
                );
                refused += 1;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!(
        "{} starts: {ran} ran, {refused} refused (E8011); {swaps} swaps",
        ran + refused
    );
    std::fs::rename(&good, &target).unwrap();
    assert!(swaps > 100, "the swapper ran: {swaps} swaps");
    assert!(
        !mark.exists(),
        "the tampered code ran: {}",
        std::fs::read_to_string(&mark).unwrap_or_default()
    );
    assert!(ran >= 1, "no start ran at all ({refused} refused)");
    // Back to the installed code: the plugin runs.
    c.call(
        "provider/configure",
        json!({"id": "py-local", "values": {"greeting": "hello"}}),
    );
    c.call("sandbox/list", json!({"provider": "py-local"}));
    assert!(!mark.exists());
    drop(home);
}

/// Processes whose argv is `sleep <marker>`.
fn sleepers(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            std::fs::read(format!("/proc/{pid}/cmdline")).ok()
        })
        .filter(|c| {
            let argv: Vec<&[u8]> = c.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
            argv.len() == 2 && argv[0].ends_with(b"sleep") && argv[1] == marker.as_bytes()
        })
        .count()
}

#[test]
fn stopping_or_killing_a_plugin_ends_every_process_it_started() {
    let (_home, mut c) = started(&[]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (_, full) = abx_tests::fixtures::plugin_sandbox(&mut c, "py-local");
    let info = c.call("provider/info", json!({"id": "py-local"}));
    assert_eq!(info["process"]["isolation"], "namespaces", "{info}");
    let doc = c.call("provider/doctor", json!({"id": "py-local"}));
    let iso = doc["checks"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == "isolation"))
        .cloned()
        .unwrap_or_else(|| panic!("no isolation check: {doc}"));
    assert!(
        iso["detail"]
            .as_str()
            .unwrap()
            .starts_with("own user, PID and mount namespaces"),
        "{iso}"
    );
    let detached = |c: &mut Client, marker: &str| {
        // A process of its own session, detached from the command that started it.
        c.call(
            "exec/run",
            json!({"sandbox": full, "command": format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 &")}),
        );
        wait_until("the detached sleep", READ_TIMEOUT, || sleepers(marker) == 1);
    };
    // A stop (a restart: new configuration) ends it.
    let marker = format!("4242.{}", std::process::id());
    detached(&mut c, &marker);
    c.call(
        "provider/configure",
        json!({"id": "py-local", "values": {"greeting": "again"}}),
    );
    wait_until("the stopped plugin's processes gone", READ_TIMEOUT, || {
        sleepers(&marker) == 0
    });
    // So does a kill of the process the broker holds.
    let marker = format!("4343.{}", std::process::id());
    detached(&mut c, &marker);
    let pid = abx_tests::fixtures::provider_status(&mut c, "py-local")["pid"]
        .as_u64()
        .unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_until("the killed plugin's processes gone", READ_TIMEOUT, || {
        sleepers(&marker) == 0
    });
    // And a call runs on a fresh plugin (one that raced the host noticing the death gets
    // E8007, as documented).
    let mut r = c.request("exec/run", json!({"sandbox": full, "command": "echo back"}));
    if r.get("error").is_some() {
        assert_eq!(abx_code(&r["error"]), "E8007", "{r}");
        r = c.request("exec/run", json!({"sandbox": full, "command": "echo back"}));
    }
    assert_eq!(r["result"]["stdout"], "back\n", "{r}");
}

#[test]
fn an_idle_stopped_plugin_leaves_no_process() {
    let (home, mut c) = started(&[("ABX_PLUGIN_IDLE_SECS", "1")]);
    let (_repo, _) = install_pinned(&mut c, "py-local");
    let (_, full) = abx_tests::fixtures::plugin_sandbox(&mut c, "py-local");
    let marker = format!("4444.{}", std::process::id());
    c.call(
        "exec/run",
        json!({"sandbox": full, "command": format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 &")}),
    );
    wait_until("the detached sleep", READ_TIMEOUT, || {
        sleepers(&marker) == 1
    });
    wait_for_log(&home, "the idle stop", &["stopping idle plugin"]);
    wait_until("the idle plugin's processes gone", READ_TIMEOUT, || {
        sleepers(&marker) == 0
    });
}

// ---------------------------------------------------------------------------------------
// No host key in a plugin (issue 42).

/// The host's keys (a session keyring with a key, a key in the user keyring) are where the
/// daemon was started; the plugin looks for them every way it can (keyprobe.py: `@s`, `@u`,
/// `@us`, by id, through `/proc/keys`, by linking any keyring it can name into its own
/// session). A root daemon's plugin is root on the host: the keys are its uid's, the case
/// of every user's daemon. Without namespaces the plugin shares the host's `/proc`, whose
/// `/proc/keys` names the keys (`hides_key_names` false).
fn keys_stay_out_of_plugins(env: &[(&str, &str)], hides_key_names: bool) {
    let mut home = Home::new();
    home.env
        .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let tag = format!("plugin-{}-{nanos}", std::process::id());
    let host = abx_tests::keys::start_with_host_keys(&home, None, &tag);
    let mut c = home.connect();
    c.call(
        "provider/install",
        json!({"source": abx_tests::fixtures::fixture("sock-probe"), "confirm": true}),
    );
    c.call(
        "provider/configure",
        json!({"id": "sock-probe", "values": {"key_ids": host.ids().join(" ")}}),
    );
    let p = probe(&mut c);
    let seen: String = p["keyring"]
        .as_array()
        .unwrap_or_else(|| panic!("no keyring probe: {p}"))
        .iter()
        .map(|l| format!("{}\n", l.as_str().unwrap_or_default()))
        .collect();
    eprintln!("--- the plugin:\n{seen}");
    assert!(seen.contains("keyprobe done"), "{seen}");
    if hides_key_names {
        host.assert_not_in(&seen, "a plugin");
    } else {
        host.assert_no_secret_in(&seen, "a plugin");
    }
}

#[test]
fn no_host_key_reaches_a_plugin() {
    keys_stay_out_of_plugins(&[], true);
}

#[test]
fn no_host_key_reaches_a_plugin_without_namespaces() {
    keys_stay_out_of_plugins(&[("ABX_PLUGIN_ISOLATION", "none")], false);
}
