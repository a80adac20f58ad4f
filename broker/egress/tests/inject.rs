//! Header injection end to end, on loopback only (issue 44, "Credentials that never enter the
//! sandbox"): a TLS upstream on 127.0.0.3 with a certificate of a test CA (given to the proxy
//! as `Tls::extra_roots`), a client that trusts the sandbox's CA (`Egress::ca_pem`) only, the
//! proxy on 127.0.0.1. The upstream answers with the request head and body it received.

use abx_egress::{Config, Egress, Guard, Limits, Policy, SecretStore, Sets, StaticResolver, Tls};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const UP_IP: &str = "127.0.0.3";
const SECRET: &str = "Bearer s3cr3t-token-VALUE-0451";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA and a leaf of it for `names`.
fn test_ca(names: &[&str]) -> (CertificateDer<'static>, ServerConfigParts) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::default();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "abx test upstream CA");
    let ca = p.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
    (
        ca.der().clone(),
        ServerConfigParts {
            chain: vec![leaf.der().clone(), ca.der().clone()],
            key: key.serialize_der(),
        },
    )
}

struct ServerConfigParts {
    chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
}

/// What the upstream received: each request's head and body.
type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A TLS HTTP/1.1 upstream: reads one request (Content-Length or chunked body), answers with
/// `head + "\n--\n" + body`, closes with close_notify.
async fn upstream(parts: ServerConfigParts) -> (SocketAddr, Seen) {
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(parts.chain, PrivateKeyDer::Pkcs8(parts.key.into()))
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = TcpListener::bind((ip(UP_IP), 0)).await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let seen2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let acceptor = acceptor.clone();
            let seen = seen2.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let mut buf = Vec::new();
                let end = loop {
                    if let Some(i) = find(&buf, b"\r\n\r\n") {
                        break i + 4;
                    }
                    let mut b = [0u8; 4096];
                    let n = tls.read(&mut b).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&b[..n]);
                };
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let lower = head.to_ascii_lowercase();
                let mut body = buf[end..].to_vec();
                if let Some(n) = header(&lower, "content-length") {
                    let n: usize = n.parse().unwrap();
                    while body.len() < n {
                        let mut b = [0u8; 4096];
                        let k = tls.read(&mut b).await.unwrap();
                        assert!(k > 0);
                        body.extend_from_slice(&b[..k]);
                    }
                } else if lower.contains("transfer-encoding: chunked") {
                    // The last chunk, then trailers (maybe none) and the blank line.
                    while !(body.ends_with(b"\r\n\r\n") && find(&body, b"\r\n0\r\n").is_some()) {
                        let mut b = [0u8; 4096];
                        let k = tls.read(&mut b).await.unwrap();
                        assert!(k > 0);
                        body.extend_from_slice(&b[..k]);
                    }
                }
                seen.lock().unwrap().push((head.clone(), body.clone()));
                let mut out = head.into_bytes();
                out.extend_from_slice(b"\n--\n");
                out.extend_from_slice(&body);
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n",
                    out.len()
                );
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.write_all(&out).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, seen)
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

fn header(lower_head: &str, name: &str) -> Option<String> {
    lower_head
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_string())
}

struct Env {
    proxy: SocketAddr,
    egress: Arc<Egress>,
    up: SocketAddr,
    seen: Seen,
    up_ca: CertificateDer<'static>,
}

/// The proxy with `allow` as its policy (JSON), the secret store holding `tok` (unless
/// `no_secret`), trusting the upstream's CA unless `untrusted`.
async fn env(allow: serde_json::Value, untrusted: bool, no_secret: bool) -> Env {
    let (up_ca, parts) = test_ca(&["api.example", "plain.example", "other.example"]);
    let (up, seen) = upstream(parts).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = listener.local_addr().unwrap();
    let guard = Guard::new(vec![], vec![proxy.port()])
        .allow_loopback_for_tests(&[ip(UP_IP)])
        .unwrap();
    let resolver = StaticResolver::new()
        .with("api.example", &[ip(UP_IP)])
        .with("plain.example", &[ip(UP_IP)])
        .with("other.example", &[ip(UP_IP)]);
    let store = Arc::new(SecretStore::in_memory());
    if !no_secret {
        store.set("tok", SECRET.to_string()).unwrap();
    }
    let tls = Tls {
        secrets: store,
        extra_roots: if untrusted {
            vec![]
        } else {
            vec![up_ca.clone()]
        },
    };
    let policy = Policy::parse(
        "sandbox/create",
        &serde_json::json!({ "allow": allow }),
        &Sets::new(),
        &guard,
    )
    .unwrap();
    let egress = Egress::new(
        policy,
        Config {
            sandbox: "sb-inject".into(),
            guard,
            resolver: Arc::new(resolver),
            limits: Limits::default(),
            tls,
        },
    );
    tokio::spawn(egress.clone().serve_tcp(listener));
    Env {
        proxy,
        egress,
        up,
        seen,
        up_ca,
    }
}

fn api_policy() -> serde_json::Value {
    serde_json::json!([
        {"host": "api.example:*", "headers": {"Authorization": "secret:tok"}},
        "plain.example:*"
    ])
}

/// CONNECT `host`:port and read the proxy's answer head.
async fn connect(proxy: SocketAddr, target: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "the proxy answers");
        head.push(b[0]);
    }
    (s, String::from_utf8_lossy(&head).to_string())
}

async fn tls_client(
    s: TcpStream,
    roots: &[CertificateDer<'static>],
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from(name.to_string()).unwrap();
    connector.connect(name, s).await
}

fn sandbox_ca(e: &Env) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(e.egress.ca_pem().unwrap().as_bytes()).unwrap()
}

/// A request through a tunnel to `api.example` that trusts the sandbox's CA; the answer.
async fn through_api(e: &Env, req: &[u8]) -> String {
    let (s, head) = connect(e.proxy, &format!("api.example:{}", e.up.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut tls = tls_client(s, &[sandbox_ca(e)], "api.example")
        .await
        .expect("the client trusts the sandbox's CA for api.example");
    tls.write_all(req).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut out))
        .await
        .expect("the proxy answers and closes");
    String::from_utf8_lossy(&out).to_string()
}

#[tokio::test]
async fn the_named_header_is_replaced_not_duplicated_and_host_is_the_connect_host() {
    let e = env(api_policy(), false, false).await;
    let resp = through_api(
        &e,
        b"GET /v1/x?q=1 HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer placeholder\r\nauthorization: second\r\nX-Keep: yes\r\nProxy-Authorization: x\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(resp.contains("Connection: close\r\n"), "{resp}");
    let seen = e.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let head = &seen[0].0;
    assert!(head.starts_with("GET /v1/x?q=1 HTTP/1.1\r\n"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert_eq!(lower.matches("authorization:").count(), 1, "{head}");
    assert!(
        head.contains(&format!("Authorization: {SECRET}\r\n")),
        "{head}"
    );
    assert!(
        !head.contains("placeholder") && !head.contains("second"),
        "{head}"
    );
    assert!(
        head.contains(&format!("Host: api.example:{}\r\n", e.up.port())),
        "{head}"
    );
    assert!(head.contains("X-Keep: yes\r\n") && !lower.contains("proxy-authorization"));
    // The sandbox side never carried the secret; the answer is the upstream's echo (so
    // here it does: what an upstream sends back is the sandbox's to read).
    assert!(e.egress.blocked().is_empty());
}

#[tokio::test]
async fn bodies_are_forwarded_as_framed_content_length_and_chunked() {
    let e = env(api_policy(), false, false).await;
    let resp = through_api(
        &e,
        b"POST /up HTTP/1.1\r\nHost: api.example\r\nContent-Length: 11\r\n\r\nhello world",
    )
    .await;
    assert!(resp.ends_with("\n--\nhello world"), "{resp}");
    let chunked = b"POST /up HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
    let resp = through_api(&e, chunked).await;
    assert!(
        resp.ends_with("\n--\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"),
        "{resp}"
    );
    let seen = e.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|(h, _)| h.contains(SECRET)));
    // Both framings at once are refused before anything is sent.
    let resp = through_api(
        &e,
        b"POST /up HTTP/1.1\r\nHost: api.example\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert_eq!(e.seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn heads_are_bounded_inside_the_tunnel_too() {
    let e = env(api_policy(), false, false).await;
    let mut req = b"GET / HTTP/1.1\r\nHost: api.example\r\n".to_vec();
    for i in 0..400 {
        req.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "a".repeat(60)).as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    let resp = through_api(&e, &req).await;
    assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");
    assert!(e.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_upstream_whose_certificate_does_not_verify_gets_nothing() {
    let e = env(api_policy(), true, false).await;
    let resp = through_api(&e, b"GET / HTTP/1.1\r\nHost: api.example\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 502"), "{resp}");
    assert!(resp.contains("nothing was sent"), "{resp}");
    assert!(!resp.contains(SECRET));
    assert!(e.seen.lock().unwrap().is_empty(), "no request reached it");
}

#[tokio::test]
async fn a_missing_secret_closes_the_tunnel_and_is_counted() {
    let e = env(api_policy(), false, true).await;
    let (s, head) = connect(e.proxy, &format!("api.example:{}", e.up.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let r = tls_client(s, &[sandbox_ca(&e)], "api.example").await;
    assert!(r.is_err(), "no handshake without the secret");
    let b = e.egress.blocked();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].host, "api.example");
    assert!(e.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn hosts_without_headers_stay_spliced() {
    let e = env(api_policy(), false, false).await;
    // plain.example: the client sees the upstream's own certificate (the test CA), and the
    // sandbox's CA does not verify it.
    let (s, head) = connect(e.proxy, &format!("plain.example:{}", e.up.port())).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut tls = tls_client(s, std::slice::from_ref(&e.up_ca), "plain.example")
        .await
        .expect("the upstream's own certificate");
    tls.write_all(b"GET / HTTP/1.1\r\nHost: plain.example\r\nAuthorization: mine\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(
        out.contains("Authorization: mine") && !out.contains(SECRET),
        "{out}"
    );
    let (s, _) = connect(e.proxy, &format!("plain.example:{}", e.up.port())).await;
    assert!(tls_client(s, &[sandbox_ca(&e)], "plain.example")
        .await
        .is_err());
    // And api.example is not served with the upstream's certificate: the client that trusts
    // only the upstream's CA fails (the proxy terminates it).
    let (s, _) = connect(e.proxy, &format!("api.example:{}", e.up.port())).await;
    assert!(tls_client(s, std::slice::from_ref(&e.up_ca), "api.example")
        .await
        .is_err());
}

#[tokio::test]
async fn a_live_policy_change_adds_or_stops_injection_for_new_connections() {
    let e = env(serde_json::json!(["api.example:*"]), false, false).await;
    let (s, _) = connect(e.proxy, &format!("api.example:{}", e.up.port())).await;
    assert!(tls_client(s, std::slice::from_ref(&e.up_ca), "api.example")
        .await
        .is_ok());
    let guard = Guard::new(vec![], vec![e.proxy.port()])
        .allow_loopback_for_tests(&[ip(UP_IP)])
        .unwrap();
    e.egress.set_policy(
        Policy::parse(
            "sandbox/setNetwork",
            &serde_json::json!({ "allow": api_policy() }),
            &Sets::new(),
            &guard,
        )
        .unwrap(),
    );
    let resp = through_api(&e, b"GET / HTTP/1.1\r\nHost: api.example\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(e.seen.lock().unwrap()[0].0.contains(SECRET));
}

/// The CA is a CA, and only the sandbox's: two proxies have two CAs.
#[tokio::test]
async fn each_proxy_has_its_own_ca() {
    let a = env(api_policy(), false, false).await;
    let b = env(api_policy(), false, false).await;
    let (pa, pb) = (a.egress.ca_pem().unwrap(), b.egress.ca_pem().unwrap());
    assert!(pa.starts_with("-----BEGIN CERTIFICATE-----\n"));
    assert_ne!(pa, pb);
    // b's client cannot be served by a's CA.
    let (s, _) = connect(a.proxy, &format!("api.example:{}", a.up.port())).await;
    assert!(tls_client(s, &[sandbox_ca(&b)], "api.example")
        .await
        .is_err());
}
