//! What plugins declare in `[security]` is enforced (issue #11): a real daemon, real plugin
//! processes (the `perm-probe` Node fixture tries each forbidden thing and reports the
//! result), the kernel's Landlock and seccomp. Every probe is refused when undeclared and
//! allowed when declared.

use abx_tests::fixtures::{copy_dir, fixture, started};
use abx_tests::{abx_code, landlock_abi, wait_until, Client, Home};
use serde_json::{json, Value};
use std::net::TcpListener;
use std::time::Duration;

/// Landlock with TCP rules (ABI 4) is what these tests are about; without it they say so.
fn landlock_net() -> bool {
    landlock_abi() >= 4
}

struct Probe {
    home: Home,
    c: Client,
    _dirs: tempfile::TempDir,
    listener: TcpListener,
}

/// Install perm-probe with `security` as its `[security]` table (`{port}` replaced by the
/// loopback listener's port), configured to probe a file in a fake home, a directory outside
/// its data dir and that listener.
fn probe_with(security: &str, env: &[(&str, &str)]) -> Probe {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let security = security.replace("{port}", &port.to_string());
    let dirs = tempfile::tempdir().unwrap();
    let fake_home = dirs.path().join("home");
    std::fs::create_dir_all(&fake_home).unwrap();
    std::fs::write(fake_home.join("secret.txt"), "the user's file\n").unwrap();
    let outside = dirs.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let plugin = dirs.path().join("perm-probe");
    copy_dir(&fixture("perm-probe"), &plugin);
    let manifest = std::fs::read_to_string(plugin.join("abx-provider.toml")).unwrap();
    let head = &manifest[..manifest.rfind("\n[security]").unwrap() + 1];
    std::fs::write(
        plugin.join("abx-provider.toml"),
        format!("{head}[security]\n{security}\n"),
    )
    .unwrap();

    let home_env = fake_home.to_string_lossy().into_owned();
    let mut all_env = vec![("HOME", home_env.as_str())];
    all_env.extend_from_slice(env);
    let (home, mut c) = started(&all_env);
    c.call(
        "provider/install",
        json!({"source": plugin, "confirm": true}),
    );
    c.call(
        "provider/configure",
        json!({"id": "perm-probe", "values": {
            "home_file": fake_home.join("secret.txt"),
            "outside_dir": outside,
            "tcp_port": port.to_string(),
        }}),
    );
    Probe {
        home,
        c,
        _dirs: dirs,
        listener,
    }
}

impl Probe {
    fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }

    /// Create a sandbox on the plugin and run its probes.
    fn run(&mut self) -> Value {
        let sb = self.c.create(json!({"provider": "perm-probe"}));
        let info = self.c.call("sandbox/systemInfo", json!({"sandbox": sb}));
        info["probes"].clone()
    }

    /// Doctor's result and its `permissions` check.
    fn doctor_permissions(&mut self) -> (Value, Value) {
        let doc = self.c.call("provider/doctor", json!({"id": "perm-probe"}));
        let check = doc["checks"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == "permissions"))
            .cloned()
            .unwrap_or_else(|| panic!("no permissions check: {doc}"));
        (doc, check)
    }

    fn info(&mut self) -> Value {
        self.c.call("provider/info", json!({"id": "perm-probe"}))
    }
}

fn skip_without_landlock_net() -> bool {
    let skip = !landlock_net();
    if skip {
        eprintln!("skipped: this kernel has no Landlock TCP rules");
    }
    skip
}

fn refused(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|s| s != "ok" && s != "not configured")
}

#[test]
fn undeclared_permissions_are_refused() {
    if skip_without_landlock_net() {
        return;
    }
    let mut p = probe_with(
        "network = []\nfilesystem = [\"data_dir\"]\nspawns_processes = false",
        &[],
    );
    let r = p.run();
    assert_eq!(r["writeDataDir"], "ok", "{r}");
    assert_eq!(r["readOwnRoot"], "ok", "{r}");
    for (k, why) in [
        ("writeTmp", "tmp is not declared"),
        ("writeOutside", "outside its data dir"),
        ("readHome", "the user's home"),
        ("tcpConnect", "network = []"),
        ("udpSocket", "network = []"),
        ("spawnSh", "spawns_processes = false"),
    ] {
        assert!(refused(&r[k]), "{k} must be refused ({why}): {r}");
    }
    assert_eq!(r["writeOutside"], "EACCES", "{r}");
    assert_eq!(r["readHome"], "EACCES", "{r}");
    assert_eq!(r["tcpConnect"], "EACCES", "{r}");
    assert_eq!(r["udpSocket"], "EACCES", "{r}");

    let info = p.info();
    let sec = &info["security"];
    assert_eq!(sec["enforced"], true, "{info}");
    assert_eq!(sec["rules"]["tcpConnectPorts"], json!([]), "{info}");
    assert_eq!(sec["rules"]["udpAndNetlink"], false, "{info}");
    // The CLI says so, and doctor has a passing permissions check.
    let out = p.home.run(&["provider", "info", "perm-probe"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("network: none · filesystem: data_dir · spawns processes: no  (enforced)"),
        "{text}"
    );
    let (doc, check) = p.doctor_permissions();
    assert_eq!(check["ok"], true, "{doc}");
    assert!(
        check["detail"].as_str().unwrap().ends_with("(enforced)"),
        "{doc}"
    );
}

#[test]
fn declared_permissions_are_allowed_and_nothing_more() {
    if skip_without_landlock_net() {
        return;
    }
    let mut p = probe_with(
        "network = [\"127.0.0.1:{port}\"]\nfilesystem = [\"data_dir\", \"tmp\"]\nspawns_processes = true",
        &[],
    );
    let port = p.port();
    let r = p.run();
    for k in [
        "writeDataDir",
        "writeTmp",
        "readOwnRoot",
        "tcpConnect",
        "spawnSh",
    ] {
        assert_eq!(r[k], "ok", "{k} is declared: {r}");
    }
    // Still refused: what no declaration grants, and UDP (an IP-only host list needs no DNS).
    for k in ["writeOutside", "readHome", "udpSocket"] {
        assert_eq!(r[k], "EACCES", "{k}: {r}");
    }
    // Another port than the declared one is refused.
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    p.c.call(
        "provider/configure",
        json!({"id": "perm-probe", "values": {"tcp_port": other.local_addr().unwrap().port().to_string()}}),
    );
    let r = p.run();
    assert_eq!(r["tcpConnect"], "EACCES", "an undeclared port: {r}");
    let info = p.info();
    assert_eq!(info["security"]["rules"]["tcpConnectPorts"], json!([port]));
}

#[test]
fn any_network_and_host_names_allow_datagrams() {
    if skip_without_landlock_net() {
        return;
    }
    let mut p = probe_with(
        "network = [\"*\"]\nfilesystem = []\nspawns_processes = false",
        &[],
    );
    let r = p.run();
    assert_eq!(r["tcpConnect"], "ok", "{r}");
    assert_eq!(r["udpSocket"], "ok", "{r}");
    // filesystem = []: not even its data dir.
    assert_eq!(r["writeDataDir"], "EACCES", "{r}");
    assert!(refused(&r["spawnSh"]), "{r}");

    // A host name: its ports (80, 443) and UDP for name resolution; the loopback port is not
    // among them.
    let mut p = probe_with(
        "network = [\"localhost\"]\nfilesystem = [\"data_dir\"]\nspawns_processes = false",
        &[],
    );
    let r = p.run();
    assert_eq!(r["udpSocket"], "ok", "{r}");
    assert_eq!(r["tcpConnect"], "EACCES", "{r}");
    let info = p.info();
    assert_eq!(
        info["security"]["rules"]["tcpConnectPorts"],
        json!([80, 443])
    );
}

#[test]
fn a_kernel_that_cannot_enforce_refuses_by_default_or_warns_when_told() {
    if landlock_abi() == 0 {
        eprintln!("skipped: no Landlock here");
        return;
    }
    // Pretend the kernel predates Landlock's TCP rules.
    let security = "network = []\nfilesystem = [\"data_dir\"]\nspawns_processes = false";
    let mut p = probe_with(security, &[("ABX_LANDLOCK_ABI_MAX", "3")]);
    let e =
        p.c.call_err("sandbox/create", json!({"provider": "perm-probe"}));
    let text = e.to_string();
    assert!(
        text.contains("E8016") || text.contains("cannot enforce"),
        "refused before the plugin runs: {e}"
    );
    let info = p.info();
    assert_eq!(info["security"]["enforced"], false, "{info}");
    assert_eq!(info["security"]["enforcement"], "refuse");
    assert!(
        info["security"]["why"]
            .as_str()
            .unwrap()
            .contains("Landlock ABI 4"),
        "{info}"
    );
    let out = p.home.run(&["provider", "info", "perm-probe"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("(not enforced, will not start: "), "{shown}");
    let (doc, check) = p.doctor_permissions();
    assert_eq!(check["ok"], false, "{doc}");
    assert!(check["detail"].as_str().unwrap().contains("E8016"), "{doc}");

    // enforcement = "warn" in the broker config: it runs, with what can be enforced (the
    // filesystem and the socket filter), and says so.
    let cfg = p.home.path.join("config/config.toml");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(&cfg, "enforcement = \"warn\"\n").unwrap();
    // The mode is read when the provider is loaded: restart the daemon.
    p.home.run(&["broker", "stop"]);
    p.home.start();
    p.c = p.home.connect();
    let r = p.run();
    assert_eq!(
        r["readHome"], "EACCES",
        "the filesystem rules still hold: {r}"
    );
    assert_eq!(
        r["udpSocket"], "EACCES",
        "the socket filter still holds: {r}"
    );
    assert_eq!(r["tcpConnect"], "ok", "TCP is what cannot be enforced: {r}");
    let info = p.info();
    assert_eq!(info["security"]["enforcement"], "warn");
    wait_until("a loud warning in the log", Duration::from_secs(20), || {
        std::fs::read_to_string(p.home.log_file())
            .unwrap_or_default()
            .contains("not fully enforced")
    });
}

#[test]
fn the_local_provider_uses_the_same_mechanism() {
    // `local` sandboxes: writes only inside the sandbox (the shared Landlock builder).
    let (home, mut c) = started(&[]);
    let sb = c.create(json!({}));
    let r = c.sh(&sb, "echo ok > /workspace/f && cat /workspace/f");
    assert_eq!(r["stdout"], "ok\n", "{r}");
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("x");
    let r = c.sh(
        &sb,
        &format!("echo no > {} 2>&1; echo $?", target.display()),
    );
    assert!(!target.exists(), "{r}");
    let info = c.call("provider/info", json!({"id": "local"}));
    let iso = &info["security"]["isolation"];
    if landlock_abi() > 0 {
        assert_eq!(iso["landlock"]["enforced"], true, "{info}");
    }
    drop(home);
}

#[test]
fn contract_kit_still_passes_on_confined_fixtures() {
    // node-local declares network = [], filesystem = [data_dir, tmp], spawns_processes = true:
    // confined, and the kit passes.
    let (_home, mut c) = started(&[]);
    let (_repo, _commit) = abx_tests::fixtures::install_pinned(&mut c, "node-local");
    let info = c.call("provider/info", json!({"id": "node-local"}));
    if landlock_net() {
        assert_eq!(info["security"]["enforced"], true, "{info}");
    }
    let r = c.call("provider/test", json!({"id": "node-local"}));
    assert_eq!(r["failed"], 0, "{r}");
    assert!(r["passed"].as_u64().unwrap() > 10, "{r}");
    let _ = abx_code;
}
