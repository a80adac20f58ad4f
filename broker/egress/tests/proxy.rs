//! The proxy end to end, on loopback only: upstream servers on 127.0.0.2 to 127.0.0.4 (let
//! through by the test-only `Guard::allow_loopback_for_tests`), names mapped to them by a
//! `StaticResolver` (no real name is ever resolved), the proxy on 127.0.0.1. 127.0.0.1
//! itself stays refused: the DNS rebinding tests point names at it.

use abx_egress::{Config, Egress, Guard, Limits, Policy, Sets, StaticResolver};
use abx_protocol::ErrorCode;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HTTP_IP: &str = "127.0.0.2";
const TLS_IP: &str = "127.0.0.3";
const ECHO_IP: &str = "127.0.0.4";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A plain HTTP server: answers each request with its request line, its Host and its body,
/// closing when asked (`Connection: close`).
async fn http_upstream() -> SocketAddr {
    let l = TcpListener::bind((ip(HTTP_IP), 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                loop {
                    let Some((head, mut rest)) = read_head(&mut s).await else {
                        return;
                    };
                    let text = String::from_utf8_lossy(&head).to_string();
                    let lower = text.to_ascii_lowercase();
                    let line = text.lines().next().unwrap_or("").to_string();
                    let host = header(&lower, "host").unwrap_or_default();
                    if line.contains(" /bad ") {
                        let _ = s.write_all(b"NOT HTTP AT ALL\r\n\r\n").await;
                        return;
                    }
                    if lower.contains("expect: 100-continue") {
                        let early = b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n";
                        if s.write_all(early).await.is_err() {
                            return;
                        }
                    }
                    let body = if let Some(n) = header(&lower, "content-length") {
                        let n: usize = n.parse().unwrap();
                        while rest.len() < n {
                            let mut b = [0u8; 4096];
                            let k = s.read(&mut b).await.unwrap();
                            assert!(k > 0);
                            rest.extend_from_slice(&b[..k]);
                        }
                        rest[..n].to_vec()
                    } else if lower.contains("transfer-encoding: chunked") {
                        while !rest.ends_with(b"0\r\n\r\n") {
                            let mut b = [0u8; 4096];
                            let k = s.read(&mut b).await.unwrap();
                            assert!(k > 0);
                            rest.extend_from_slice(&b[..k]);
                        }
                        rest.clone()
                    } else {
                        vec![]
                    };
                    let mut out = format!(
                        "{line}\nhost={host}\nconnection={}\nbody=",
                        header(&lower, "connection").unwrap_or_default()
                    )
                    .into_bytes();
                    out.extend_from_slice(&body);
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n",
                        out.len()
                    );
                    if s.write_all(resp.as_bytes()).await.is_err()
                        || s.write_all(&out).await.is_err()
                    {
                        return;
                    }
                    if lower.contains("connection: close") {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn header(lower_head: &str, name: &str) -> Option<String> {
    lower_head.lines().find_map(|l| {
        l.strip_prefix(&format!("{name}:"))
            .map(|v| v.trim().to_string())
    })
}

/// Read a head byte by byte-ish: returns (head, what followed).
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = vec![];
    loop {
        let mut b = [0u8; 1024];
        let n = s.read(&mut b).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Some((buf, rest));
        }
    }
}

/// Read a head one byte at a time (so nothing after it is taken from the stream).
async fn read_head_exact<S: AsyncRead + Unpin>(s: &mut S) -> String {
    let mut buf = vec![];
    while !buf.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        if s.read(&mut b).await.unwrap() == 0 {
            break;
        }
        buf.push(b[0]);
    }
    String::from_utf8_lossy(&buf).to_string()
}

/// A TCP echo server.
async fn echo_upstream() -> SocketAddr {
    let l = TcpListener::bind((ip(ECHO_IP), 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

struct Tls {
    addr: SocketAddr,
    roots: rustls::RootCertStore,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS echo server for `tls.example` with a fresh self-signed certificate.
async fn tls_upstream() -> Tls {
    let ck = rcgen::generate_simple_self_signed(vec!["tls.example".to_string()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = TcpListener::bind((ip(TLS_IP), 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let (mut r, mut w) = tokio::io::split(tls);
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    Tls { addr, roots }
}

struct Env {
    proxy: SocketAddr,
    egress: Arc<Egress>,
    http: SocketAddr,
    echo: SocketAddr,
    tls: Tls,
    guard: Guard,
}

fn resolver() -> StaticResolver {
    StaticResolver::new()
        .with("allowed.example", &[ip(HTTP_IP)])
        .with("denied.example", &[ip(HTTP_IP)])
        .with("tls.example", &[ip(TLS_IP)])
        .with("other.example", &[ip(TLS_IP)])
        .with("echo.example", &[ip(ECHO_IP)])
        .with("rebind.example", &[ip("127.0.0.1")])
        .with("mapped.example", &[ip("::ffff:127.0.0.1")])
        .with("metadata.example", &[ip("169.254.169.254")])
        .with("mixed.example", &[ip("127.0.0.1"), ip(HTTP_IP)])
        .with("nowhere.example", &[])
}

fn policy(allow: &[&str], deny: &[&str], guard: &Guard) -> Policy {
    Policy::from_patterns("sandbox/create", allow, deny, &Sets::new(), guard).unwrap()
}

async fn env_with(allow: &[&str], deny: &[&str], limits: Limits) -> Env {
    let http = http_upstream().await;
    let echo = echo_upstream().await;
    let tls = tls_upstream().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    let guard = Guard::new(abx_egress::host_addresses().unwrap(), vec![proxy.port()])
        .allow_loopback_for_tests(&[ip(HTTP_IP), ip(TLS_IP), ip(ECHO_IP)])
        .unwrap();
    let egress = Egress::new(
        policy(allow, deny, &guard),
        Config {
            sandbox: "sb-test".into(),
            guard: guard.clone(),
            resolver: Arc::new(resolver()),
            limits,
            tls: Default::default(),
        },
    );
    tokio::spawn(egress.clone().serve_tcp(listener));
    Env {
        proxy,
        egress,
        http,
        echo,
        tls,
        guard,
    }
}

async fn env(allow: &[&str], deny: &[&str]) -> Env {
    env_with(allow, deny, Limits::default()).await
}

/// Send `req` through the proxy, read the whole answer (the proxy closes).
async fn roundtrip(proxy: SocketAddr, req: &[u8]) -> String {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(req).await.unwrap();
    let mut out = vec![];
    tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
        .await
        .expect("the proxy answers and closes")
        .unwrap();
    String::from_utf8_lossy(&out).to_string()
}

/// CONNECT and read the proxy's answer head.
async fn connect(proxy: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head_exact(&mut s).await;
    (s, head)
}

async fn tls_client(
    s: TcpStream,
    roots: &rustls::RootCertStore,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    connector.connect(name, s).await
}

async fn echo_roundtrip<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, msg: &[u8]) {
    s.write_all(msg).await.unwrap();
    s.flush().await.unwrap();
    let mut got = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(20), s.read_exact(&mut got))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(got, msg);
}

#[tokio::test]
async fn http_to_an_allowed_name_is_forwarded_in_origin_form() {
    let e = env(&["allowed.example:*"], &[]).await;
    let port = e.http.port();
    let r = roundtrip(
        e.proxy,
        format!("GET http://Allowed.Example.:{port}/x?y=1 HTTP/1.1\r\nHost: evil.example\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nAccept: */*\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.contains("\r\nConnection: close\r\n"), "{r}");
    assert!(!r.to_ascii_lowercase().contains("keep-alive"), "{r}");
    assert!(r.contains("\nGET /x?y=1 HTTP/1.1\n"), "{r}");
    // Host is the URL's authority, whatever the client's Host said.
    assert!(
        r.contains(&format!("host=allowed.example.:{port}\n")),
        "{r}"
    );
    assert!(r.contains("connection=close\n"), "{r}");

    // A body by Content-Length, and a chunked one, reach the upstream as sent.
    let r = roundtrip(
        e.proxy,
        format!("POST http://allowed.example:{port}/up HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
            .as_bytes(),
    )
    .await;
    assert!(r.ends_with("body=hello"), "{r}");
    let r = roundtrip(
        e.proxy,
        format!("POST http://allowed.example:{port}/up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(
        r.ends_with("body=5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n"),
        "{r}"
    );
    assert!(e.egress.blocked().is_empty());
}

#[tokio::test]
async fn malformed_requests_get_4xx_and_never_reach_an_upstream() {
    let e = env(&["allowed.example:*"], &[]).await;
    let port = e.http.port();
    for (req, status) in [
        ("GET /x HTTP/1.1\r\nHost: allowed.example\r\n\r\n".to_string(), "400"),
        (format!("GET https://allowed.example:{port}/ HTTP/1.1\r\n\r\n"), "400"),
        (format!("GET http://allowed.example:{port}/ HTTP/2\r\n\r\n"), "400"),
        (format!("POST http://allowed.example:{port}/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"), "400"),
        (format!("POST http://allowed.example:{port}/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"), "501"),
        (format!("POST http://allowed.example:{port}/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"), "400"),
        (format!("GET http://user@allowed.example:{port}/ HTTP/1.1\r\n\r\n"), "400"),
        ("GET http://bad_name!/ HTTP/1.1\r\n\r\n".to_string(), "400"),
        ("CONNECT allowed.example HTTP/1.1\r\n\r\n".to_string(), "400"),
        ("GET / HTTP/1.1\r\n folded\r\n\r\n".to_string(), "400"),
        (format!("GET http://allowed.example:{port}/ HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000)), "431"),
    ] {
        let r = roundtrip(e.proxy, req.as_bytes()).await;
        assert!(r.starts_with(&format!("HTTP/1.1 {status} ")), "{req:.80}: {r}");
    }
}

#[tokio::test]
async fn a_refused_name_gets_403_with_the_hint_counted_and_announced_before_the_answer() {
    let e = env(&["allowed.example:*", "tls.example:*"], &["denied.example"]).await;
    let mut events = e.egress.subscribe();
    let port = e.http.port();
    let r = roundtrip(
        e.proxy,
        format!("GET http://denied.example:{port}/ HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    // The counter and the event exist as soon as the 403 has been read.
    let ev = events
        .try_recv()
        .expect("the event was sent before the answer");
    assert_eq!(
        (ev.host.as_str(), ev.port, ev.count),
        ("denied.example", port, 1)
    );
    assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{r}");
    assert!(
        r.contains(&format!("X-Abx-Blocked: denied.example:{port}\r\n")),
        "{r}"
    );
    assert!(r.contains(&format!("denied.example:{port} is blocked for sandbox sb-test: denied by the policy entry 'denied.example'")), "{r}");
    assert!(
        r.contains(&format!("abx network sb-test allow denied.example:{port}")),
        "{r}"
    );
    assert!(r.contains("--allow"), "{r}");
    assert!(r.contains("MCP sandbox_create `network` argument"), "{r}");

    // Not listed at all: CONNECT and plain, on the standard ports too.
    let (_, head) = connect(e.proxy, "unlisted.example:443").await;
    assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
    let ev = events.try_recv().unwrap();
    assert_eq!(
        (ev.host.as_str(), ev.port, ev.count),
        ("unlisted.example", 443, 1)
    );
    assert!(
        ev.reason
            .contains("not allowed by the sandbox's network policy"),
        "{ev:?}"
    );
    let r = roundtrip(e.proxy, b"GET http://unlisted.example/ HTTP/1.1\r\n\r\n").await;
    assert!(
        r.contains("abx network sb-test allow unlisted.example "),
        "{r}"
    );
    let (_, _) = connect(e.proxy, "unlisted.example:443").await;
    let counts = e.egress.blocked();
    let c = counts
        .iter()
        .find(|c| c.host == "unlisted.example" && c.port == 443)
        .unwrap();
    assert_eq!(c.count, 2);
    assert_eq!(counts.len(), 3, "{counts:?}");
}

#[tokio::test]
async fn connect_with_tls_to_an_allowed_name_is_spliced_and_the_handshake_completes() {
    let e = env(&["tls.example:*"], &[]).await;
    let (s, head) = connect(e.proxy, &format!("tls.example:{}", e.tls.addr.port())).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let mut tls = tls_client(s, &e.tls.roots, "tls.example")
        .await
        .expect("handshake through the proxy");
    echo_roundtrip(&mut tls, b"hello through the tunnel").await;
    echo_roundtrip(&mut tls, &vec![7u8; 200_000]).await;
    assert!(e.egress.blocked().is_empty());
}

#[tokio::test]
async fn connect_whose_server_name_is_not_the_connect_host_is_refused() {
    let e = env(&["tls.example:*", "other.example:*", "echo.example:*"], &[]).await;
    let port = e.tls.addr.port();
    let mut events = e.egress.subscribe();
    // CONNECT to an allowed name, then a ClientHello for another (also allowed) name.
    let (s, head) = connect(e.proxy, &format!("tls.example:{port}")).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(tls_client(s, &e.tls.roots, "other.example").await.is_err());
    let ev = events.recv().await.unwrap();
    assert_eq!((ev.host.as_str(), ev.port), ("tls.example", port));
    assert!(
        ev.reason
            .contains("the TLS server name other.example is not the CONNECT host tls.example"),
        "{ev:?}"
    );
    // Not TLS at all through a CONNECT to a name: closed.
    let (mut s, head) = connect(e.proxy, &format!("echo.example:{}", e.echo.port())).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut b = vec![];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut b))
        .await
        .unwrap();
    assert!(n.is_err() || b.is_empty(), "nothing echoed: {b:?}");
    let ev = events.recv().await.unwrap();
    assert!(ev.reason.contains("not TLS"), "{ev:?}");
    // An IP literal's tunnel carries anything (the address is what the policy allowed).
    let e2 = env(&[&format!("{ECHO_IP}:*")], &[]).await;
    let (mut s, head) = connect(e2.proxy, &e2.echo.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    echo_roundtrip(&mut s, b"raw bytes").await;
}

#[tokio::test]
async fn names_resolving_to_the_hosts_loopback_are_refused_even_when_allowed() {
    let e = env(
        &[
            "rebind.example:*",
            "mapped.example:*",
            "metadata.example:*",
            "mixed.example:*",
            "0.0.0.0/0:*",
            "[::/0]:*",
        ],
        &[],
    )
    .await;
    let port = e.http.port();
    for (host, says) in [
        (
            "rebind.example",
            "it resolves to 127.0.0.1, the host's loopback: always refused",
        ),
        (
            "mapped.example",
            "it resolves to 127.0.0.1, the host's loopback: always refused",
        ),
        (
            "metadata.example",
            "it resolves to 169.254.169.254, a link-local address: always refused",
        ),
        ("localhost", "the host's loopback: always refused"),
    ] {
        let r = roundtrip(
            e.proxy,
            format!("GET http://{host}:{port}/ HTTP/1.1\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 403 "), "{host}: {r}");
        assert!(r.contains(says), "{host}: {r}");
        assert!(
            !r.contains("To allow it"),
            "no hint for what no policy allows: {r}"
        );
        let (_, head) = connect(e.proxy, &format!("{host}:{port}")).await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{host}: {head}");
    }
    // Literal loopback, whatever the policy (0.0.0.0/0 and ::/0 are allowed here).
    for target in [
        "127.0.0.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "0.0.0.0",
        "169.254.169.254",
    ] {
        let (_, head) = connect(e.proxy, &format!("{target}:{port}")).await;
        assert!(head.starts_with("HTTP/1.1 403 "), "{target}: {head}");
    }
    // The proxy's own port (a broker port) on a test upstream address.
    let (_, head) = connect(e.proxy, &format!("{HTTP_IP}:{}", e.proxy.port())).await;
    assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
    // A name with a refused and an allowed address goes to the allowed one, the one checked.
    let r = roundtrip(
        e.proxy,
        format!("GET http://mixed.example:{port}/m HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(
        r.starts_with("HTTP/1.1 200 ") && r.contains("GET /m HTTP/1.1"),
        "{r}"
    );
    // And no policy can even name them.
    for entry in [
        "127.0.0.1",
        "localhost",
        "169.254.169.254",
        "[::1]:443",
        &format!("x.example:{}", e.proxy.port()),
    ] {
        let err =
            Policy::from_patterns("sandbox/setNetwork", &[entry], &[], &Sets::new(), &e.guard)
                .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams, "{entry}");
        assert!(err.message.contains(entry), "{entry}: {err}");
    }
}

#[tokio::test]
async fn a_live_policy_change_keeps_open_tunnels_and_applies_to_new_connections() {
    let e = env(&["tls.example:*"], &[]).await;
    let target = format!("tls.example:{}", e.tls.addr.port());
    let (s, head) = connect(e.proxy, &target).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let mut open = tls_client(s, &e.tls.roots, "tls.example").await.unwrap();
    echo_roundtrip(&mut open, b"before").await;

    e.egress
        .set_policy(policy(&["allowed.example:*"], &["tls.example"], &e.guard));
    let (_, head) = connect(e.proxy, &target).await;
    assert!(head.starts_with("HTTP/1.1 403 "), "{head}");
    echo_roundtrip(&mut open, b"after: still open").await;
    let r = roundtrip(
        e.proxy,
        format!(
            "GET http://allowed.example:{}/ HTTP/1.1\r\n\r\n",
            e.http.port()
        )
        .as_bytes(),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200 "), "{r}");

    e.egress
        .set_policy(policy(&["tls.example:*"], &[], &e.guard));
    let (s, head) = connect(e.proxy, &target).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let mut again = tls_client(s, &e.tls.roots, "tls.example").await.unwrap();
    echo_roundtrip(&mut again, b"allowed again").await;
    echo_roundtrip(&mut open, b"the first one too").await;
}

#[tokio::test]
async fn a_slowloris_client_is_cut_after_the_head_timeout_while_others_are_served() {
    let limits = Limits {
        head_timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let e = env_with(&["allowed.example:*"], &[], limits).await;
    let started = Instant::now();
    let mut slow = TcpStream::connect(e.proxy).await.unwrap();
    slow.write_all(b"GET http://allowed.example/ HTTP/1.1\r\n")
        .await
        .unwrap();
    let drip = tokio::spawn(async move {
        // One header byte every 200 ms: never a whole head.
        let mut out = vec![];
        for _ in 0..50 {
            if slow.write_all(b"X").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut b = [0u8; 256];
            match tokio::time::timeout(Duration::from_millis(1), slow.read(&mut b)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => out.extend_from_slice(&b[..n]),
                Err(_) => {}
            }
        }
        (started.elapsed(), String::from_utf8_lossy(&out).to_string())
    });
    let port = e.http.port();
    for _ in 0..5 {
        let r = roundtrip(
            e.proxy,
            format!("GET http://allowed.example:{port}/ HTTP/1.1\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 200 "), "{r}");
    }
    let (took, said) = drip.await.unwrap();
    assert!(took < Duration::from_secs(5), "cut after {took:?}");
    assert!(took >= Duration::from_millis(900), "cut after {took:?}");
    assert!(
        said.is_empty() || said.starts_with("HTTP/1.1 408 "),
        "{said}"
    );
}

/// `n` tunnels open at once through the proxy, each echoing.
async fn concurrent_tunnels(n: usize, max: usize) {
    let limits = Limits {
        max_connections: max,
        ..Limits::default()
    };
    let e = env_with(&[&format!("{ECHO_IP}:*")], &[], limits).await;
    let target = e.echo.to_string();
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = vec![];
    for i in 0..n {
        let target = target.clone();
        let barrier = barrier.clone();
        let proxy = e.proxy;
        tasks.push(tokio::spawn(async move {
            let (mut s, head) = connect(proxy, &target).await;
            assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
            echo_roundtrip(&mut s, format!("conn {i}").as_bytes()).await;
            barrier.wait().await; // all open at once
            echo_roundtrip(&mut s, &vec![i as u8; 4096]).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn two_hundred_concurrent_tunnels() {
    concurrent_tunnels(200, 256).await;
}

#[tokio::test]
#[ignore = "opt-in: 1000 tunnels need about 4000 descriptors (ulimit -n)"]
async fn a_thousand_concurrent_tunnels() {
    raise_nofile();
    concurrent_tunnels(1000, 1024).await;
}

fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max.min(65536);
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

#[tokio::test]
async fn connections_beyond_the_limit_are_refused_at_once() {
    let limits = Limits {
        max_connections: 4,
        ..Limits::default()
    };
    let e = env_with(&[&format!("{ECHO_IP}:*")], &[], limits).await;
    let mut open = vec![];
    for _ in 0..4 {
        let (s, head) = connect(e.proxy, &e.echo.to_string()).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        open.push(s);
    }
    let r = roundtrip(e.proxy, b"CONNECT 127.0.0.4:1 HTTP/1.1\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 503 "), "{r}");
    assert_eq!(e.egress.active(), 4);
    drop(open);
    let deadline = Instant::now() + Duration::from_secs(10);
    while e.egress.active() > 0 {
        assert!(
            Instant::now() < deadline,
            "connections end when their clients leave"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, head) = connect(e.proxy, &e.echo.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
}

#[tokio::test]
async fn an_idle_tunnel_is_closed_and_shutdown_ends_everything() {
    let limits = Limits {
        idle_timeout: Duration::from_millis(800),
        ..Limits::default()
    };
    let e = env_with(&[&format!("{ECHO_IP}:*")], &[], limits).await;
    let (mut s, head) = connect(e.proxy, &e.echo.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    echo_roundtrip(&mut s, b"x").await;
    let mut b = vec![];
    let t = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );

    let (mut s, _) = connect(e.proxy, &e.echo.to_string()).await;
    e.egress.shutdown();
    let mut b = vec![];
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut b))
        .await
        .unwrap()
        .ok();
    assert!(
        TcpStream::connect(e.proxy).await.is_err() || {
            // The listener may still be in the kernel's backlog; nothing answers.
            let mut c = TcpStream::connect(e.proxy).await.unwrap();
            let _ = c
                .write_all(b"GET http://allowed.example/ HTTP/1.1\r\n\r\n")
                .await;
            let mut b = vec![];
            matches!(
                tokio::time::timeout(Duration::from_secs(2), c.read_to_end(&mut b)).await,
                Ok(Ok(0)) | Ok(Err(_)) | Err(_)
            ) && b.is_empty()
        }
    );
}

#[tokio::test]
async fn informational_responses_pass_and_upstream_failures_are_502() {
    let e = env(&["allowed.example:*", "nowhere.example:*"], &[]).await;
    let port = e.http.port();
    let r = roundtrip(
        e.proxy,
        format!("POST http://allowed.example:{port}/c HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok").as_bytes(),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"), "{r}");
    assert!(
        r.contains("\r\nConnection: close\r\n") && r.ends_with("body=ok"),
        "{r}"
    );
    let r = roundtrip(
        e.proxy,
        format!("GET http://allowed.example:{port}/bad HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 502 "), "{r}");
    // An allowed name with no address, and an address where nothing listens.
    let r = roundtrip(e.proxy, b"GET http://nowhere.example/ HTTP/1.1\r\n\r\n").await;
    assert!(
        r.starts_with("HTTP/1.1 502 ") && r.contains("nowhere.example has no address"),
        "{r}"
    );
    let closed = TcpListener::bind((ip(HTTP_IP), 0)).await.unwrap();
    let dead = closed.local_addr().unwrap().port();
    drop(closed);
    let (_, head) = connect(e.proxy, &format!("allowed.example:{dead}")).await;
    assert!(head.starts_with("HTTP/1.1 502 "), "{head}");
    assert!(e.egress.blocked().is_empty(), "failures are not blocks");
}

#[tokio::test]
async fn the_proxy_serves_a_unix_socket_too() {
    let e = env(&["allowed.example:*"], &[]).await;
    let path = std::env::temp_dir().join(format!("abx-egress-test-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let egress = Egress::new(
        policy(&["allowed.example:*"], &[], &e.guard),
        Config {
            sandbox: "sb-unix".into(),
            guard: e.guard.clone(),
            resolver: Arc::new(resolver()),
            limits: Limits::default(),
            tls: Default::default(),
        },
    );
    tokio::spawn(egress.clone().serve_unix(listener));
    let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
    s.write_all(
        format!(
            "GET http://allowed.example:{}/u HTTP/1.1\r\n\r\n",
            e.http.port()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = vec![];
    s.read_to_end(&mut out).await.unwrap();
    let r = String::from_utf8_lossy(&out);
    assert!(
        r.starts_with("HTTP/1.1 200 ") && r.contains("GET /u HTTP/1.1"),
        "{r}"
    );
    let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
    s.write_all(b"GET http://denied.example/ HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut out = vec![];
    s.read_to_end(&mut out).await.unwrap();
    let r = String::from_utf8_lossy(&out);
    assert!(
        r.starts_with("HTTP/1.1 403 ") && r.contains("abx network sb-unix allow denied.example"),
        "{r}"
    );
    egress.shutdown();
    let _ = std::fs::remove_file(&path);
}
