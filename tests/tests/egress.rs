//! Network policies of `local` sandboxes (issue 44): a real daemon, a real sandbox whose only
//! way out is its egress proxy, real clients inside (curl, python3, openssl, pip, npm).
//!
//! Traffic goes only to loopback: the upstream servers listen on 127.0.0.2 and 127.0.0.3 in
//! the host's namespace; the daemon's test-only settings (`ABX_TEST_HOOKS=1` with
//! `ABX_TEST_EGRESS_RESOLVE`, `ABX_TEST_EGRESS_LOOPBACK`) map the test names to them and let
//! the proxy reach them (127.0.0.1 stays refused: the rebinding and host-service tests).

use abx_tests::{abx_code, wait_until, Client, Home};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What an upstream answers for a path (status, content type, body).
type Route = Box<dyn Fn(&str) -> Option<(u16, &'static str, Vec<u8>)> + Send + Sync>;

/// A tiny HTTP/1.1 server on `ip` (one request per connection).
struct Upstream {
    port: u16,
    /// Requests seen (their request lines).
    seen: Arc<Mutex<Vec<String>>>,
    /// `/slow`: released when this is set.
    release: Arc<AtomicUsize>,
}

impl Upstream {
    fn start(ip: &str, route: Route) -> Upstream {
        let l = TcpListener::bind((ip, 0)).expect("bind upstream");
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let release = Arc::new(AtomicUsize::new(0));
        let route = Arc::new(route);
        let (s2, r2) = (seen.clone(), release.clone());
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut conn) = conn else { continue };
                let (seen, release, route) = (s2.clone(), r2.clone(), route.clone());
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
                    let mut r = BufReader::new(conn.try_clone().unwrap());
                    let mut line = String::new();
                    if r.read_line(&mut line).is_err() {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    seen.lock().unwrap().push(line.trim().to_owned());
                    if path == "/slow" {
                        let body = b"first half, second half\n";
                        let _ = write!(
                            conn,
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = conn.write_all(&body[..11]);
                        let _ = conn.flush();
                        while release.load(Ordering::SeqCst) == 0 {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        let _ = conn.write_all(&body[11..]);
                        return;
                    }
                    let (status, ctype, body) =
                        route(&path).unwrap_or((404, "text/plain", b"not here\n".to_vec()));
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(&body);
                });
            }
        });
        Upstream {
            port,
            seen,
            release,
        }
    }
}

/// A home whose daemon resolves the test names to loopback addresses and may reach 127.0.0.2
/// and 127.0.0.3 (test-only settings).
fn home() -> (Home, Client) {
    let mut home = Home::new();
    for (k, v) in [
        ("ABX_TEST_HOOKS", "1"),
        (
            "ABX_TEST_EGRESS_RESOLVE",
            "web.example=127.0.0.2,denied.example=127.0.0.2,tls.example=127.0.0.3,pypi.example=127.0.0.2,npm.example=127.0.0.2,rebind.example=127.0.0.1",
        ),
        ("ABX_TEST_EGRESS_LOOPBACK", "1"),
    ] {
        home.env.push((k.into(), v.into()));
    }
    home.start();
    let c = home.connect();
    (home, c)
}

fn hello() -> Upstream {
    Upstream::start(
        "127.0.0.2",
        Box::new(|p: &str| Some((200, "text/plain", format!("hello {p}\n").into_bytes()))),
    )
}

fn run(c: &mut Client, id: &str, cmd: &str) -> (i64, String, String) {
    let r = c.call(
        "exec/run",
        json!({"sandbox": id, "command": cmd, "timeout": 60}),
    );
    (
        r["exitCode"].as_i64().unwrap_or(-1),
        r["stdout"].as_str().unwrap_or("").to_owned(),
        r["stderr"].as_str().unwrap_or("").to_owned(),
    )
}

/// The proxy variables are set, an allowed name works over HTTP, a denied one gets 403 with
/// the hint, and the refusals are counted in `sandbox/info` and notified.
#[test]
fn allowed_name_works_denied_gets_403_counted_and_notified() {
    let (home, mut c) = home();
    let up = hello();
    let mut sub = home.connect();
    sub.call("sandbox/subscribe", Value::Null);
    let p = up.port;
    let sb = c.call(
        "sandbox/create",
        json!({"network": {"allow": [format!("web.example:{p}")], "deny": ["bad.example"]}}),
    );
    let id = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(sb["network"]["allow"], json!([format!("web.example:{p}")]));
    assert_eq!(sb["network"]["blocked"], json!([]));
    let si = c.call("sandbox/systemInfo", json!({"sandbox": id}));
    assert_eq!(si["isolation"]["network"], "policy", "{si}");
    let (code, env, _) = run(&mut c, &id, "env | grep -i _proxy | sort");
    assert_eq!(code, 0);
    for k in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        assert!(
            env.contains(&format!("{k}=http://127.0.0.1:")),
            "{k}: {env}"
        );
    }
    assert!(env.contains("NO_PROXY=localhost,127.0.0.1,::1"), "{env}");
    assert!(env.contains("no_proxy=localhost,127.0.0.1,::1"), "{env}");
    // curl and python3 urllib, through the proxy.
    let (code, out, err) = run(&mut c, &id, &format!("curl -sS http://web.example:{p}/a"));
    assert_eq!((code, out.as_str()), (0, "hello /a\n"), "{err}");
    let (code, out, err) = run(
        &mut c,
        &id,
        &format!("python3 -c 'import urllib.request as u; print(u.urlopen(\"http://web.example:{p}/b\").read().decode(), end=\"\")'"),
    );
    assert_eq!((code, out.as_str()), (0, "hello /b\n"), "{err}");
    // A name not allowed (and one denied): 403 naming the host and the way to allow it.
    let (code, out, _) = run(
        &mut c,
        &id,
        &format!("curl -s -w '\\n%{{http_code}}' http://denied.example:{p}/x"),
    );
    assert_eq!(code, 0);
    assert!(out.ends_with("\n403"), "{out}");
    assert!(out.contains("denied.example"), "{out}");
    assert!(out.contains(&format!("abx network {id} allow")), "{out}");
    let (_, out, _) = run(
        &mut c,
        &id,
        "curl -s -w '\\n%{http_code}' http://bad.example/",
    );
    assert!(out.ends_with("\n403"), "{out}");
    // The upstream never saw them.
    assert!(up.seen.lock().unwrap().iter().all(|l| !l.contains("/x")));
    // Counted per host and port, `last` as RFC 3339.
    let info = c.call("sandbox/info", json!({"sandbox": id}));
    let blocked = info["network"]["blocked"].as_array().unwrap().clone();
    let denied = blocked
        .iter()
        .find(|b| b["host"] == "denied.example")
        .unwrap_or_else(|| panic!("{info}"));
    assert_eq!(denied["port"], p);
    assert_eq!(denied["count"], 1);
    assert!(abx_tests::rfc3339_unix(denied["last"].as_str().unwrap()).is_some());
    assert!(blocked
        .iter()
        .any(|b| b["host"] == "bad.example" && b["port"] == 80));
    // And notified to the subscriber.
    let mut got = Vec::new();
    wait_until(
        "sandbox/blocked notifications",
        Duration::from_secs(20),
        || {
            while let Some(v) = sub.try_recv(Duration::from_millis(100)) {
                if v["method"] == "sandbox/blocked" {
                    got.push(v["params"].clone());
                }
            }
            got.len() >= 2
        },
    );
    assert_eq!(
        got[0],
        json!({"sandbox": id, "provider": "local", "host": "denied.example", "port": p, "count": 1})
    );
    c.call("sandbox/kill", json!({"sandbox": id}));
}

/// A program that ignores the proxy gets "network unreachable" at once; the host's loopback
/// services are unreachable whatever the policy, also by a name rebound to 127.0.0.1.
#[test]
fn bypass_unreachable_host_loopback_and_rebinding_refused() {
    let (_home, mut c) = home();
    let up = hello();
    let host_svc = TcpListener::bind("127.0.0.1:0").unwrap();
    let hp = host_svc.local_addr().unwrap().port();
    let p = up.port;
    let id = c.create(json!({"network": {"allow": [
        format!("web.example:{p}"), format!("rebind.example:{hp}"), "*.example:*"
    ]}}));
    // Raw connects bypassing the proxy: ENETUNREACH at once.
    let t0 = std::time::Instant::now();
    let (code, out, err) = run(
        &mut c,
        &id,
        "python3 -c 'import socket,errno\ntry:\n socket.create_connection((\"192.0.2.1\", 80), timeout=20)\nexcept OSError as e:\n print(errno.errorcode[e.errno])'",
    );
    assert_eq!((code, out.trim()), (0, "ENETUNREACH"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    let (_, out, _) = run(
        &mut c,
        &id,
        &format!("curl -sS --noproxy '*' http://127.0.0.2:{p}/ 2>&1; echo; curl -sS --noproxy '*' http://127.0.0.1:{hp}/ 2>&1"),
    );
    assert!(!out.contains("hello"), "{out}");
    // Through the proxy: the host's loopback by address, by localhost and by a rebound name.
    for url in [
        format!("http://127.0.0.1:{hp}/"),
        format!("http://localhost:{hp}/"),
        format!("http://rebind.example:{hp}/"),
    ] {
        let (_, out, _) = run(
            &mut c,
            &id,
            &format!("curl -s -w '\\n%{{http_code}}' --noproxy '' -x \"$HTTP_PROXY\" {url}"),
        );
        assert!(out.ends_with("\n403"), "{url}: {out}");
    }
    // CONNECT to a rebound name: refused too.
    let (_, out, _) = run(
        &mut c,
        &id,
        &format!("curl -s -o /dev/null -w '%{{http_connect}}' -p --noproxy '' -x \"$HTTP_PROXY\" http://rebind.example:{hp}/"),
    );
    assert_eq!(out, "403");
    host_svc.set_nonblocking(true).unwrap();
    assert!(
        host_svc.accept().is_err(),
        "the host's loopback service was reached"
    );
    // The allowed one still works.
    let (code, out, _) = run(&mut c, &id, &format!("curl -sS http://web.example:{p}/ok"));
    assert_eq!((code, out.as_str()), (0, "hello /ok\n"));
}

/// HTTPS through CONNECT with a test CA (openssl s_server on 127.0.0.3); a ClientHello whose
/// server name is not the CONNECT host is refused.
#[test]
fn https_connect_works_and_wrong_sni_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (key, cert) = (dir.path().join("key.pem"), dir.path().join("cert.pem"));
    let ok = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=tls.example",
            "-addext",
            "subjectAltName=DNS:tls.example",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    let port = {
        let l = TcpListener::bind("127.0.0.3:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut server = std::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(format!("127.0.0.3:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("s_server", Duration::from_secs(20), || {
        TcpStream::connect(("127.0.0.3", port)).is_ok()
    });
    let (_home, mut c) = home();
    let id = c.create(json!({"network": {"allow": [format!("tls.example:{port}")]}}));
    let pem = std::fs::read_to_string(&cert).unwrap();
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "/workspace/ca.pem", "data": pem}),
    );
    let (code, out, err) = run(
        &mut c,
        &id,
        &format!("curl -sS --cacert /workspace/ca.pem https://tls.example:{port}/ | head -c 200"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("s_server"), "{out} {err}");
    // The same tunnel, another server name in the ClientHello: cut.
    let script = format!(
        "import os,socket,ssl\nport=int(os.environ['HTTP_PROXY'].rsplit(':',1)[1])\ns=socket.create_connection(('127.0.0.1',port))\ns.sendall(b'CONNECT tls.example:{port} HTTP/1.1\\r\\nHost: tls.example:{port}\\r\\n\\r\\n')\nprint(s.recv(100).split(b'\\r\\n')[0].decode())\nctx=ssl.create_default_context(cafile='/workspace/ca.pem')\nctx.check_hostname=False\ntry:\n ctx.wrap_socket(s, server_hostname='evil.example')\n print('handshake done')\nexcept (OSError, ssl.SSLError) as e:\n print('refused')\n"
    );
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "/workspace/sni.py", "data": script}),
    );
    let (_, out, err) = run(&mut c, &id, "python3 /workspace/sni.py");
    assert!(out.contains("200"), "{out} {err}");
    assert!(out.trim_end().ends_with("refused"), "{out} {err}");
    let _ = server.kill();
    let _ = server.wait();
}

/// `sandbox/setNetwork` replaces the policy live: new connections follow it, an open one goes
/// on; switching between a mode and a policy is E1004; a provider-less check of bad input.
#[test]
fn live_policy_change_keeps_open_connections() {
    let (_home, mut c) = home();
    let up = hello();
    let p = up.port;
    let id = c.create(json!({"network": {"allow": [format!("web.example:{p}")]}}));
    // A slow download, open while the policy changes.
    let r = c.call(
        "exec/start",
        json!({"sandbox": id, "command": format!("curl -sS http://web.example:{p}/slow")}),
    );
    let exec_id = r["execId"].as_str().unwrap().to_owned();
    wait_until("the slow request upstream", Duration::from_secs(20), || {
        up.seen.lock().unwrap().iter().any(|l| l.contains("/slow"))
    });
    let mut c2 = _home.connect();
    let v = c2.call(
        "sandbox/setNetwork",
        json!({"sandbox": id, "network": {"allow": ["other.example"]}}),
    );
    assert_eq!(v["network"]["allow"], json!(["other.example"]));
    let (_, out, _) = run(
        &mut c2,
        &id,
        &format!("curl -s -o /dev/null -w '%{{http_code}}' http://web.example:{p}/new"),
    );
    assert_eq!(out, "403");
    up.release.store(1, Ordering::SeqCst);
    let s = c.collect(&exec_id);
    assert_eq!(
        String::from_utf8_lossy(&s.stdout),
        "first half, second half\n"
    );
    assert_eq!(s.exit["exitCode"], 0);
    // Allowed again: works again.
    c.call(
        "sandbox/setNetwork",
        json!({"sandbox": id, "network": {"allow": [format!("web.example:{p}")]}}),
    );
    let (_, out, _) = run(
        &mut c,
        &id,
        &format!("curl -sS http://web.example:{p}/again"),
    );
    assert_eq!(out, "hello /again\n");
    // Bad input: E1004 naming the entry; modes are not switched to or from.
    let e = c.call_err(
        "sandbox/setNetwork",
        json!({"sandbox": id, "network": {"allow": ["127.0.0.1"]}}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    assert!(e["message"].as_str().unwrap().contains("127.0.0.1"), "{e}");
    let e = c.call_err(
        "sandbox/setNetwork",
        json!({"sandbox": id, "network": "internet"}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    let plain = c.create(json!({"network": "none"}));
    let e = c.call_err(
        "sandbox/setNetwork",
        json!({"sandbox": plain, "network": {"allow": ["web.example"]}}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    assert!(e["message"].as_str().unwrap().contains("mode"), "{e}");
    let e = c.call_err(
        "sandbox/create",
        json!({"network": {"allow": ["@nosuchset"]}}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
}

/// A slowloris client inside (connections that never finish their head) does not stop the
/// others; the policy survives a daemon restart (the proxy is made again from sandbox.json).
#[test]
fn slowloris_does_not_stop_others_and_policy_survives_restart() {
    let (home, mut c) = home();
    let up = hello();
    let p = up.port;
    let id = c.create(json!({"network": {"allow": [format!("web.example:{p}")]}}));
    let r = c.call(
        "exec/start",
        json!({"sandbox": id, "command": "python3 -c 'import os,socket,time\nport=int(os.environ[\"HTTP_PROXY\"].rsplit(\":\",1)[1])\nss=[]\nfor i in range(100):\n s=socket.create_connection((\"127.0.0.1\",port)); s.sendall(b\"GET http://web.exa\"); ss.append(s)\nprint(\"open\", flush=True)\ntime.sleep(60)'"}),
    );
    let exec_id = r["execId"].as_str().unwrap().to_owned();
    // Wait until its connections are open.
    loop {
        let v = c.recv();
        if v["method"] == "exec/output" && v["params"]["execId"] == exec_id.as_str() {
            break;
        }
        assert_ne!(v["method"], "exec/exit", "{v}");
    }
    let t0 = std::time::Instant::now();
    let (code, out, _) = run(
        &mut c,
        &id,
        &format!("curl -sS http://web.example:{p}/fast"),
    );
    assert_eq!((code, out.as_str()), (0, "hello /fast\n"));
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    c.call("exec/kill", json!({"execId": exec_id}));
    // Restart the daemon: the sandbox starts again with its policy.
    drop(c);
    let out = home.run(&["broker", "stop"]);
    assert!(out.status.success());
    home.start();
    let mut c = home.connect();
    let info = c.call("sandbox/info", json!({"sandbox": id}));
    assert_eq!(
        info["network"]["allow"],
        json!([format!("web.example:{p}")])
    );
    let (code, out, _) = run(
        &mut c,
        &id,
        &format!("curl -sS http://web.example:{p}/after"),
    );
    assert_eq!((code, out.as_str()), (0, "hello /after\n"));
    let (_, out, _) = run(
        &mut c,
        &id,
        "curl -s -o /dev/null -w '%{http_code}' http://denied.example/",
    );
    assert_eq!(out, "403");
}

/// pip download from a PEP 503 simple index and npm view from a registry, both served by the
/// test, both through the proxy.
#[test]
fn pip_download_and_npm_view_through_the_proxy() {
    // A tiny wheel, made by the host's python3.
    let dir = tempfile::tempdir().unwrap();
    let whl = dir.path().join("demo_pkg-1.0-py3-none-any.whl");
    let ok = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sys,zipfile,hashlib,base64\nfiles={'demo_pkg/__init__.py':b'x=1\\n','demo_pkg-1.0.dist-info/METADATA':b'Metadata-Version: 2.1\\nName: demo-pkg\\nVersion: 1.0\\n','demo_pkg-1.0.dist-info/WHEEL':b'Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'}\nrec=''\nfor n,b in files.items():\n h=base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()\n rec+=f'{n},sha256={h},{len(b)}\\n'\nrec+='demo_pkg-1.0.dist-info/RECORD,,\\n'\nwith zipfile.ZipFile(sys.argv[1],'w') as z:\n [z.writestr(n,b) for n,b in files.items()]\n z.writestr('demo_pkg-1.0.dist-info/RECORD',rec)\n",
        )
        .arg(&whl)
        .status()
        .unwrap();
    assert!(ok.success());
    let wheel = std::fs::read(&whl).unwrap();
    let tgz_port = Arc::new(AtomicUsize::new(0));
    let tp = tgz_port.clone();
    let up = Upstream::start(
        "127.0.0.2",
        Box::new(move |path: &str| {
            let port = tp.load(Ordering::SeqCst);
            match path {
                "/simple/demo-pkg/" | "/simple/demo-pkg" => Some((
                    200,
                    "text/html",
                    b"<html><body><a href=\"/files/demo_pkg-1.0-py3-none-any.whl\">demo_pkg-1.0-py3-none-any.whl</a></body></html>".to_vec(),
                )),
                "/files/demo_pkg-1.0-py3-none-any.whl" => {
                    Some((200, "application/octet-stream", wheel.clone()))
                }
                "/demo-pkg" => Some((
                    200,
                    "application/json",
                    json!({
                        "name": "demo-pkg",
                        "dist-tags": {"latest": "1.2.3"},
                        "versions": {"1.2.3": {"name": "demo-pkg", "version": "1.2.3",
                            "dist": {"tarball": format!("http://npm.example:{port}/demo-pkg/-/demo-pkg-1.2.3.tgz"),
                                     "shasum": "0000000000000000000000000000000000000000"}}},
                    })
                    .to_string()
                    .into_bytes(),
                )),
                _ => None,
            }
        }),
    );
    let p = up.port;
    tgz_port.store(p as usize, Ordering::SeqCst);
    let (_home, mut c) = home();
    let id = c.create(
        json!({"network": {"allow": [format!("pypi.example:{p}"), format!("npm.example:{p}")]}}),
    );
    let (code, out, err) = run(
        &mut c,
        &id,
        &format!("python3 -m pip download --no-deps --disable-pip-version-check -q -d /tmp/dl --trusted-host pypi.example --index-url http://pypi.example:{p}/simple/ demo-pkg && ls /tmp/dl"),
    );
    assert_eq!(code, 0, "pip: {out} {err}");
    assert!(out.contains("demo_pkg-1.0-py3-none-any.whl"), "{out} {err}");
    let (code, out, err) = run(
        &mut c,
        &id,
        &format!("npm view --registry http://npm.example:{p}/ demo-pkg version 2>&1"),
    );
    assert_eq!((code, out.trim()), (0, "1.2.3"), "npm: {out} {err}");
    // Not allowed: pip fails and the refusal is counted.
    let (code, _, _) = run(
        &mut c,
        &id,
        &format!("python3 -m pip download --no-deps --disable-pip-version-check -q --retries 0 -d /tmp/dl2 --trusted-host denied.example --index-url http://denied.example:{p}/simple/ demo-pkg"),
    );
    assert_ne!(code, 0);
    let info = c.call("sandbox/info", json!({"sandbox": id}));
    assert!(
        info["network"]["blocked"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["host"] == "denied.example"),
        "{info}"
    );
}

/// A provider without `network.vpc` is refused a policy (E8004, never ignored); `local`
/// declares it; named sets come from the broker config (`[network.sets]`).
#[test]
fn policy_needs_network_vpc_and_sets_come_from_the_config() {
    let mut home = Home::new();
    home.env.push(("ABX_TEST_HOOKS".into(), "1".into()));
    home.env.push((
        "ABX_TEST_EGRESS_RESOLVE".into(),
        "web.example=127.0.0.2,two.example=127.0.0.2".into(),
    ));
    home.env
        .push(("ABX_TEST_EGRESS_LOOPBACK".into(), "1".into()));
    let up = hello();
    let p = up.port;
    std::fs::create_dir_all(home.path.join("config")).unwrap();
    std::fs::write(
        home.path.join("config/config.toml"),
        format!("[network.sets]\nweb = [\"web.example:{p}\"]\n\n[network.sets.two]\nallow = [\"two.example:{p}\"]\n"),
    )
    .unwrap();
    home.start();
    let mut c = home.connect();
    let dir = tempfile::tempdir().unwrap();
    abx_tests::fixtures::copy_dir(&abx_tests::fixtures::fixture("py-local"), dir.path());
    c.call(
        "provider/install",
        json!({"source": dir.path(), "confirm": true}),
    );
    let e = c.call_err(
        "sandbox/create",
        json!({"provider": "py-local", "network": {"allow": ["web.example"]}}),
    );
    assert_eq!(abx_code(&e), "E8004", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("network.vpc"),
        "{e}"
    );
    // A mode string is not a policy: served. setNetwork is gated too.
    let other = c.create(json!({"provider": "py-local", "network": "none"}));
    let e = c.call_err(
        "sandbox/setNetwork",
        json!({"sandbox": other, "network": {"allow": ["web.example"]}}),
    );
    assert_eq!(abx_code(&e), "E8004", "{e}");
    let info = c.call("provider/info", json!({"id": "local"}));
    assert!(info.to_string().contains("network.vpc"), "{info}");
    let id = c.create(json!({"provider": "local", "network": {"allow": ["@web", "@two"]}}));
    for h in ["web", "two"] {
        let (code, out, err) = run(&mut c, &id, &format!("curl -sS http://{h}.example:{p}/s"));
        assert_eq!((code, out.as_str()), (0, "hello /s\n"), "{err}");
    }
}

/// The CLI: `--allow` and `--network allow:...` build a policy, `abx network` shows and
/// changes it live, `abx info` shows it with the blocked hosts, a bad `--network` is a usage
/// error.
#[test]
fn cli_allow_flags_network_command_and_info() {
    let (home, _c) = home();
    let up = hello();
    let p = up.port;
    let ok = |args: &[&str]| {
        let o = home.run(args);
        assert!(
            o.status.success(),
            "abx {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let web = format!("web.example:{p}");
    let v: Value = serde_json::from_str(&ok(&[
        "-j",
        "create",
        "--network",
        "allow:one.example,two.example",
        "--allow",
        &web,
    ]))
    .unwrap();
    let id = v["id"].as_str().unwrap().to_owned();
    assert_eq!(
        v["network"]["allow"],
        json!(["one.example", "two.example", web])
    );
    let out = ok(&[
        "exec",
        &id,
        "--",
        "curl",
        "-sS",
        &format!("http://web.example:{p}/cli"),
    ]);
    assert_eq!(out, "hello /cli\n");
    // A blocked attempt, then the policy and the counts in `abx info`.
    let o = home.run(&[
        "exec",
        &id,
        "--",
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "http://blocked.example/",
    ]);
    assert!(o.status.success());
    let info = ok(&["info", &id]);
    assert!(
        info.contains(&format!("allow one.example, two.example, {web}")),
        "{info}"
    );
    assert!(info.contains("blocked.example:80 x1"), "{info}");
    // Live changes: allow adds, deny adds, show shows.
    let v: Value =
        serde_json::from_str(&ok(&["-j", "network", &id, "allow", "blocked.example"])).unwrap();
    assert_eq!(
        v["allow"],
        json!(["one.example", "two.example", web, "blocked.example"])
    );
    let v: Value =
        serde_json::from_str(&ok(&["-j", "network", &id, "deny", "two.example"])).unwrap();
    assert_eq!(v["deny"], json!(["two.example"]));
    let show = ok(&["network", &id, "show"]);
    assert!(show.contains("deny two.example"), "{show}");
    // `abx run --allow`.
    let out = ok(&[
        "run",
        "--allow",
        &web,
        "--",
        "curl",
        "-sS",
        &format!("http://web.example:{p}/run"),
    ]);
    assert_eq!(out, "hello /run\n");
    // A bad --network: usage, exit 2; a mode sandbox: no policy to change.
    let o = home.run(&["create", "--network", "bogus"]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_str(&ok(&["-j", "create", "--network", "none"])).unwrap();
    let plain = v["id"].as_str().unwrap();
    let o = home.run(&["network", plain, "allow", "x.example"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a policy"));
}

/// Under an isolation model without namespaces nothing would make the proxy the only way
/// out: a policy is refused (E8004 naming network.vpc), never ignored.
#[test]
fn a_policy_is_refused_without_namespaces() {
    let mut home = Home::new();
    home.env.push(("ABX_ISOLATION".into(), "none".into()));
    home.start();
    let mut c = home.connect();
    let e = c.call_err(
        "sandbox/create",
        json!({"network": {"allow": ["web.example"]}}),
    );
    assert_eq!(abx_code(&e), "E8004", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("network.vpc"),
        "{e}"
    );
    assert!(e.to_string().contains("ABX_ISOLATION"), "{e}");
}

/// The upstream of the credential tests: an HTTPS server (Python's `http.server` in `ssl`)
/// on `ip` that appends each request's path and headers to `seen` (one JSON line each).
const RECORDING_SERVER: &str = r#"
import http.server, json, ssl, sys
ip, cert, key, out = sys.argv[1:5]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        with open(out, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": [[k, v] for k, v in self.headers.items()]}) + "\n")
        body = ("ok " + self.path + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer((ip, 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// A recording HTTPS upstream on `ip` with `cert`/`key`; its port and the file it writes.
fn recording_upstream(
    dir: &std::path::Path,
    ip: &str,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> (std::process::Child, u16, std::path::PathBuf) {
    let script = dir.join("upstream.py");
    std::fs::write(&script, RECORDING_SERVER).unwrap();
    let seen = dir.join(format!("seen-{ip}.jsonl"));
    std::fs::write(&seen, "").unwrap();
    let mut child = std::process::Command::new("python3")
        .arg(&script)
        .args([ip])
        .arg(cert)
        .arg(key)
        .arg(&seen)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("port: {line:?}"));
    (child, port, seen)
}

fn openssl(args: &[&str], dir: &std::path::Path) {
    let ok = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success(), "openssl {args:?}");
}

/// A secret set with `abx secret set` (stdin) reaches the upstream as the policy's header,
/// and appears nowhere the sandbox can look, nor in the daemon's log or any reply. A host
/// without headers stays spliced (the client sees the upstream's own certificate); an
/// upstream whose certificate does not verify gets nothing (502); an unknown key is E1004.
#[test]
fn credentials_reach_the_upstream_and_never_enter_the_sandbox() {
    // Built from halves below, so that no command text sent to the sandbox contains it.
    const SECRET: &str = "Bearer abx-secret-7f3a9c-VALUE";
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The tests' CA, a leaf of it for api.example and plain.example; a self-signed
    // certificate for bad.example (verifies against nothing the proxy trusts).
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
            "/CN=abx test upstream CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
        d,
    );
    openssl(
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=api.example",
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
        ],
        d,
    );
    std::fs::write(
        d.join("ext.cnf"),
        "subjectAltName=DNS:api.example,DNS:plain.example\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
            "-out",
            "leaf.pem",
        ],
        d,
    );
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
            "/CN=bad.example",
            "-addext",
            "subjectAltName=DNS:bad.example",
            "-keyout",
            "bad.key",
            "-out",
            "bad.pem",
        ],
        d,
    );
    let (mut good, port, seen) =
        recording_upstream(d, "127.0.0.2", &d.join("leaf.pem"), &d.join("leaf.key"));
    let (mut bad, bad_port, bad_seen) =
        recording_upstream(d, "127.0.0.3", &d.join("bad.pem"), &d.join("bad.key"));

    let mut home = Home::new();
    for (k, v) in [
        ("ABX_TEST_HOOKS", "1".to_owned()),
        (
            "ABX_TEST_EGRESS_RESOLVE",
            "api.example=127.0.0.2,plain.example=127.0.0.2,bad.example=127.0.0.3".to_owned(),
        ),
        ("ABX_TEST_EGRESS_LOOPBACK", "1".to_owned()),
        (
            "ABX_TEST_EGRESS_CA",
            d.join("ca.pem").to_string_lossy().into_owned(),
        ),
    ] {
        home.env.push((k.into(), v));
    }
    home.start();
    let mut c = home.connect();

    // `abx secret set` reads the value from stdin; list shows keys only.
    let o = home.run_with_input(
        &["secret", "set", "api_token"],
        format!("{SECRET}\n").as_bytes(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = home.run(&["secret", "list"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "api_token\n");
    let listed = c.call("secrets/list", json!({}));
    assert_eq!(listed, json!({"keys": ["api_token"]}));
    let file = home.path.join("config/egress-secrets.json");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", file.display());

    // A key the store does not have: E1004 naming the key, at create and at setNetwork.
    let e = c.call_err(
        "sandbox/create",
        json!({"network": {"allow": [{"host": "api.example", "headers": {"Authorization": "secret:nope"}}]}}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");
    assert!(e.to_string().contains("nope"), "{e}");

    let policy = json!({"allow": [
        {"host": format!("api.example:{port}"), "headers": {"Authorization": "secret:api_token"}},
        format!("plain.example:{port}"),
        {"host": format!("bad.example:{bad_port}"), "headers": {"Authorization": "secret:api_token"}},
    ]});
    let sb = c.call("sandbox/create", json!({"network": policy}));
    let id = sb["id"].as_str().unwrap().to_owned();
    let e = c.call_err(
        "sandbox/setNetwork",
        json!({"sandbox": id, "network": {"allow": [{"host": "api.example", "headers": {"X-Key": "secret:nope"}}]}}),
    );
    assert_eq!(abx_code(&e), "E1004", "{e}");

    // The sandbox trusts its own CA: the variables name the bundle and the CA.
    let (_, env, _) = run(&mut c, &id, "env | sort");
    for v in [
        "SSL_CERT_FILE=/tmp/abx-egress-ca-bundle.pem",
        "REQUESTS_CA_BUNDLE=/tmp/abx-egress-ca-bundle.pem",
        "CURL_CA_BUNDLE=/tmp/abx-egress-ca-bundle.pem",
        "NODE_EXTRA_CA_CERTS=/tmp/abx-egress-ca.pem",
    ] {
        assert!(env.contains(v), "{v}: {env}");
    }
    // curl, as a tool would call it: the upstream sees the secret, once, in place of the
    // sandbox's own value.
    let (code, out, err) = run(
        &mut c,
        &id,
        &format!(
            "curl -sS -H 'Authorization: Bearer placeholder' https://api.example:{port}/v1/models"
        ),
    );
    assert_eq!((code, out.as_str()), (0, "ok /v1/models\n"), "{err}");
    let (code, out, err) = run(
        &mut c,
        &id,
        &format!("curl -sS https://api.example:{port}/again"),
    );
    assert_eq!((code, out.as_str()), (0, "ok /again\n"), "{err}");
    let got = std::fs::read_to_string(&seen).unwrap();
    let lines: Vec<Value> = got
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{got}");
    for l in &lines {
        let auth: Vec<&Value> = l["headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h[0].as_str().unwrap().eq_ignore_ascii_case("authorization"))
            .collect();
        assert_eq!(auth.len(), 1, "{l}");
        assert_eq!(auth[0][1], SECRET, "{l}");
    }
    // The leaf the client saw is the sandbox CA's.
    let (_, out, _) = run(
        &mut c,
        &id,
        &format!("curl -sv https://api.example:{port}/cert 2>&1 >/dev/null | grep -i issuer"),
    );
    assert!(out.contains("abx egress CA"), "{out}");

    // plain.example has no headers: spliced. The sandbox's bundle does not verify it (the
    // upstream's own certificate), the upstream's CA does, and no secret was added.
    let (code, _, _) = run(
        &mut c,
        &id,
        &format!("curl -sS https://plain.example:{port}/p"),
    );
    assert_ne!(
        code, 0,
        "the sandbox CA must not be what plain.example shows"
    );
    c.call(
        "files/write",
        json!({"sandbox": id, "path": "/workspace/upstream-ca.pem", "data": std::fs::read_to_string(d.join("ca.pem")).unwrap()}),
    );
    let (code, out, err) = run(
        &mut c,
        &id,
        &format!("curl -sv --cacert /workspace/upstream-ca.pem https://plain.example:{port}/p 2>&1 | grep -i -e issuer -e '^ok'"),
    );
    assert_eq!(code, 0, "{out} {err}");
    assert!(
        out.contains("abx test upstream CA") && out.contains("ok /p"),
        "{out}"
    );
    let got = std::fs::read_to_string(&seen).unwrap();
    let last: Value = serde_json::from_str(got.lines().last().unwrap()).unwrap();
    assert_eq!(last["path"], "/p");
    assert!(!last.to_string().contains(SECRET), "{last}");

    // bad.example's certificate verifies against nothing the proxy trusts: 502, nothing sent.
    let (_, out, _) = run(
        &mut c,
        &id,
        &format!("curl -s -o /dev/null -w '%{{http_code}}' https://bad.example:{bad_port}/"),
    );
    assert_eq!(out, "502");
    assert_eq!(std::fs::read_to_string(&bad_seen).unwrap(), "");

    // Nowhere in the sandbox: its environment, every /proc/*/environ it can read, its /tmp
    // (the CA bundle the daemon wrote included) and /workspace.
    let look = "n='abx-secret-7f3a''9c-VALUE'; (env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rF -- \"$n\" /tmp /workspace 2>/dev/null) | grep -cF -- \"$n\"; ls /tmp";
    let (_, out, err) = run(&mut c, &id, look);
    assert!(out.starts_with("0\n"), "{out} {err}");
    assert!(out.contains("abx-egress-ca-bundle.pem"), "{out}");
    // Nor in any reply, nor in the daemon's log.
    for (m, p) in [
        ("sandbox/info", json!({"sandbox": id})),
        ("secrets/list", json!({})),
        ("sandbox/log", json!({"sandbox": id})),
        ("sandbox/list", json!({})),
    ] {
        let r = c.call(m, p);
        assert!(!r.to_string().contains("7f3a9c"), "{m}: {r}");
    }
    let log = std::fs::read_to_string(home.log_file()).unwrap_or_default();
    assert!(!log.contains("7f3a9c"), "the daemon's log has the secret");

    // Removed: new connections to api.example are refused (counted), nothing reaches it.
    let o = home.run(&["secret", "rm", "api_token"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (code, _, _) = run(
        &mut c,
        &id,
        &format!("curl -sS https://api.example:{port}/gone"),
    );
    assert_ne!(code, 0);
    let got = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(got.lines().count(), 4, "{got}"); // /v1/models, /again, /cert, /p
    assert!(!got.contains("/gone"), "{got}");
    let info = c.call("sandbox/info", json!({"sandbox": id}));
    assert!(
        info["network"]["blocked"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["host"] == "api.example"),
        "{info}"
    );
    let _ = (good.kill(), bad.kill());
    let _ = (good.wait(), bad.wait());
}
