//! TLS termination for the hosts whose `allow` entry names headers to add (issue 44,
//! "Credentials that never enter the sandbox"): a per-sandbox CA made when the [`crate::Egress`]
//! is made (its key never leaves the daemon; only its certificate goes into the sandbox, which
//! alone trusts it), one short-lived leaf certificate per host signed by it (cached), and the
//! upstream side: a new TLS connection verified against the web's roots (`webpki-roots`, as
//! reqwest's `rustls-tls` in the rest of the broker) plus, for tests only, extra CAs.
//!
//! Hosts without headers never come here: they stay spliced, never decrypted.

use crate::http;
use crate::secrets::{NoSecrets, Secret, SecretSource};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A leaf certificate is valid this long (from an hour before it is made, for clock skew)...
const LEAF_VALID: Duration = Duration::from_secs(24 * 3600);
/// ...and made again after this long.
const LEAF_REUSE: Duration = Duration::from_secs(12 * 3600);
/// At most this many leaves cached per sandbox (a wildcard entry names many hosts).
const MAX_LEAVES: usize = 64;
/// The CA is valid this long (a sandbox lives in one daemon at most this long with it; a
/// daemon restart makes a new CA, and the sandbox's bundle file is written again).
const CA_VALID: Duration = Duration::from_secs(365 * 24 * 3600);

/// What header injection needs besides the policy: where secret values come from, and
/// (tests only) extra CAs the upstream's certificate may chain to.
#[derive(Clone)]
pub struct Tls {
    /// The values of `secret:KEY`.
    pub secrets: Arc<dyn SecretSource>,
    /// CAs trusted for upstreams besides the web's roots: **tests only** (the daemon sets them
    /// from a test-only setting).
    pub extra_roots: Vec<CertificateDer<'static>>,
}

impl Default for Tls {
    fn default() -> Tls {
        Tls {
            secrets: Arc::new(NoSecrets),
            extra_roots: Vec::new(),
        }
    }
}

impl Tls {
    /// The certificates of a PEM text added to [`Tls::extra_roots`].
    pub fn with_extra_roots_pem(mut self, pem: &[u8]) -> Result<Tls, String> {
        use rustls::pki_types::pem::PemObject;
        let before = self.extra_roots.len();
        for c in CertificateDer::pem_slice_iter(pem) {
            self.extra_roots
                .push(c.map_err(|e| format!("a bad PEM certificate: {e:?}"))?);
        }
        if self.extra_roots.len() == before {
            return Err("no PEM certificate".into());
        }
        Ok(self)
    }
}

/// One sandbox's CA, its leaves and its upstream TLS configuration.
pub(crate) struct Intercept {
    ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
    ca_pem: String,
    leaves: Mutex<HashMap<String, (Instant, Arc<ServerConfig>)>>,
    client: OnceLock<Result<Arc<ClientConfig>, String>>,
    tls: Tls,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `now + ahead - back`, since the Unix epoch (added to `rcgen::date_time_ymd(1970, 1, 1)`).
fn at(ahead: Duration, back: Duration) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (now + ahead).saturating_sub(back)
}

impl Intercept {
    /// A new CA for sandbox `sandbox` (ECDSA P-256).
    pub(crate) fn new(sandbox: &str, tls: Tls) -> Result<Intercept, rcgen::Error> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyUsagePurpose};
        let key = rcgen::KeyPair::generate()?;
        let mut p = CertificateParams::default();
        let cn: String = format!("abx egress CA for sandbox {sandbox}")
            .chars()
            .filter(|c| c.is_ascii_graphic() || *c == ' ')
            .take(64)
            .collect();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.distinguished_name.push(DnType::OrganizationName, "abx");
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        p.not_before =
            rcgen::date_time_ymd(1970, 1, 1) + at(Duration::ZERO, Duration::from_secs(3600));
        p.not_after = rcgen::date_time_ymd(1970, 1, 1) + at(CA_VALID, Duration::ZERO);
        let cert = p.self_signed(&key)?;
        let ca_pem = pem("CERTIFICATE", cert.der());
        Ok(Intercept {
            ca_cert: cert,
            ca_key: key,
            ca_pem,
            leaves: Mutex::new(HashMap::new()),
            client: OnceLock::new(),
            tls,
        })
    }

    pub(crate) fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub(crate) fn secret(&self, key: &str) -> Option<Secret> {
        self.tls.secrets.get(key)
    }

    /// The server side for `host`: a leaf for it, made or taken from the cache.
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, String> {
        let mut g = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((made, c)) = g.get(host) {
            if made.elapsed() < LEAF_REUSE {
                return Ok(c.clone());
            }
        }
        let c = Arc::new(self.leaf(host)?);
        if g.len() >= MAX_LEAVES && !g.contains_key(host) {
            // The oldest goes.
            if let Some(k) = g
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| k.clone())
            {
                g.remove(&k);
            }
        }
        g.insert(host.to_owned(), (Instant::now(), c.clone()));
        Ok(c)
    }

    fn leaf(&self, host: &str) -> Result<ServerConfig, String> {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyUsagePurpose};
        let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
        let mut p = CertificateParams::new(vec![host.to_owned()]).map_err(|e| e.to_string())?;
        p.distinguished_name.push(DnType::CommonName, host);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.use_authority_key_identifier_extension = true;
        p.not_before =
            rcgen::date_time_ymd(1970, 1, 1) + at(Duration::ZERO, Duration::from_secs(3600));
        p.not_after = rcgen::date_time_ymd(1970, 1, 1) + at(LEAF_VALID, Duration::ZERO);
        let cert = p
            .signed_by(&key, &self.ca_cert, &self.ca_key)
            .map_err(|e| e.to_string())?;
        let chain = vec![cert.der().clone(), self.ca_cert.der().clone()];
        let pkey = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut c = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(chain, pkey)
            .map_err(|e| e.to_string())?;
        // HTTP/1.1 only: the proxy reads HTTP/1.1 heads (a client offering h2 falls back).
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(c)
    }

    /// The upstream side (made on first use: the web's roots, plus the tests' CAs).
    pub(crate) fn client_config(&self) -> Result<Arc<ClientConfig>, String> {
        self.client
            .get_or_init(|| {
                let mut roots = RootCertStore::empty();
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                for c in &self.tls.extra_roots {
                    roots
                        .add(c.clone())
                        .map_err(|e| format!("a test CA: {e}"))?;
                }
                let mut c = ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                c.alpn_protocols = vec![b"http/1.1".to_vec()];
                Ok(Arc::new(c))
            })
            .clone()
    }
}

/// `host` as a TLS server name.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())
}

/// DER as PEM (64-column base64).
pub(crate) fn pem(label: &str, der: &[u8]) -> String {
    let b = abx_protocol::b64::encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or(""));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The request head sent upstream for a request the client sent through an intercepted
/// connection: origin-form kept, `Host` set to the CONNECT host, hop-by-hop headers dropped,
/// every header the policy names replaced (never duplicated) by its secret value,
/// `Connection: close` (one request per connection). Also how its body is framed.
pub(crate) fn inject_head(
    h: &http::Head<'_>,
    host_header: &str,
    inject: &[(String, Secret)],
) -> Result<(Vec<u8>, crate::forward::Body), (u16, String)> {
    if h.first == "CONNECT" {
        return Err((
            405,
            "abx: CONNECT inside a tunnel is not supported.\n".into(),
        ));
    }
    if !(h.second.starts_with('/') || (h.second == "*" && h.first == "OPTIONS")) {
        return Err((
            400,
            "abx: send origin-form requests (GET /path) through the tunnel.\n".into(),
        ));
    }
    if !h.third.starts_with("HTTP/1.") {
        return Err((400, "abx: HTTP/1.x requests only.\n".into()));
    }
    let body = crate::forward::body_of(h)?;
    let named = crate::forward::connection_named(h);
    // Built after every check: nothing returns it but the caller, which writes it to the
    // upstream and zeroes it (`Egress::exchange`).
    let mut head = Vec::with_capacity(512);
    head.extend_from_slice(h.first.as_bytes());
    head.push(b' ');
    head.extend_from_slice(h.second.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    head.extend_from_slice(host_header.as_bytes());
    head.extend_from_slice(b"\r\n");
    for (k, v) in &h.headers {
        let lk = k.to_ascii_lowercase();
        if crate::forward::DROPPED.contains(&lk.as_str())
            || named.contains(&lk)
            || inject.iter().any(|(n, _)| n.eq_ignore_ascii_case(k))
        {
            continue;
        }
        head.extend_from_slice(k.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(v);
        head.extend_from_slice(b"\r\n");
    }
    for (n, s) in inject {
        head.extend_from_slice(n.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(s.expose().as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok((head, body))
}

/// A stream whose first bytes were read already (the ClientHello the proxy checked).
pub(crate) struct Rewind<S> {
    pre: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Rewind<S> {
    pub(crate) fn new(pre: Vec<u8>, inner: S) -> Rewind<S> {
        Rewind { pre, pos: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.pre.len() {
            let n = (self.pre.len() - self.pos).min(buf.remaining());
            let from = self.pos;
            buf.put_slice(&self.pre[from..from + n]);
            self.pos += n;
            if self.pos == self.pre.len() {
                self.pre = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
