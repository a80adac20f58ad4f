//! The proxy: HTTP CONNECT (TLS spliced after its ClientHello's server name is checked) and
//! plain HTTP proxy requests (absolute-form, one request per connection), on a listener the
//! caller gives, for one sandbox's live policy ([`Egress`]).

use crate::blocked::{Blocked, BlockedCount, BlockedEvent};
use crate::http::{self, HeadError};
use crate::intercept::{self, Intercept, Rewind, Tls};
use crate::name;
use crate::net::{canonical, Guard, Refused};
use crate::policy::{NameCheck, Policy, Verdict};
use crate::resolve::Resolver;
use crate::sni::{self, Hello};
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::{broadcast, watch, OwnedSemaphorePermit, Semaphore};

/// The bounds every connection is held to (the client is the sandbox: hostile).
#[derive(Clone, Debug)]
pub struct Limits {
    /// The request line and headers, counted as read (431 beyond).
    pub head_max: usize,
    /// To send the whole head from the first byte on (a slowloris client is cut).
    pub head_timeout: Duration,
    /// To send the whole ClientHello after `200` ([`sni::MAX_READ`] bytes at most).
    pub hello_timeout: Duration,
    /// To resolve a name.
    pub resolve_timeout: Duration,
    /// To connect to one address.
    pub connect_timeout: Duration,
    /// A spliced or forwarded connection with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Connections at once per handle; beyond, a new one is refused at once (`503`).
    pub max_connections: usize,
    /// An upstream's response head (502 beyond).
    pub response_head_max: usize,
    /// The splice buffer, each way, per connection.
    pub splice_buffer: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            head_max: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(10),
            resolve_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_connections: 256,
            response_head_max: 64 * 1024,
            splice_buffer: 16 * 1024,
        }
    }
}

/// How to build an [`Egress`].
#[derive(Clone)]
pub struct Config {
    /// The sandbox's id, named in the 403's hint (`abx network SANDBOX allow HOST`).
    pub sandbox: String,
    /// What no policy opens.
    pub guard: Guard,
    /// How names become addresses (the system's, or a [`crate::StaticResolver`] in tests).
    pub resolver: Arc<dyn Resolver>,
    /// The bounds.
    pub limits: Limits,
    /// Header injection: where secret values come from, the tests' upstream CAs.
    pub tls: Tls,
}

/// One sandbox's proxy: its policy (replaceable while it serves), its guard, its blocked
/// counters and events, its connections.
pub struct Egress {
    sandbox: String,
    policy: RwLock<Arc<Policy>>,
    guard: RwLock<Arc<Guard>>,
    resolver: Arc<dyn Resolver>,
    limits: Limits,
    blocked: Mutex<Blocked>,
    conns: Arc<Semaphore>,
    /// Refusals being answered (`503`) beyond the connection limit, themselves bounded.
    refusals: Arc<Semaphore>,
    shutdown: watch::Sender<bool>,
    /// The sandbox's CA and leaves, for hosts with headers to add (`None`: the CA could not be
    /// made, logged; such hosts are refused).
    intercept: Option<Intercept>,
}

/// At most this many `503` answers at once; beyond, a connection is closed unanswered.
pub const MAX_REFUSALS: usize = 32;

const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 46\r\nConnection: close\r\n\r\nabx: too many connections through the proxy.\n";

/// Why a destination is refused.
struct Refusal {
    host: String,
    port: u16,
    reason: String,
    /// Whether a policy change can allow it (not for the guard's refusals).
    allowable: bool,
}

enum Decision {
    Go(Vec<SocketAddr>),
    Refuse(Refusal),
    /// Not a policy decision: a status and a text (400, 502, 504).
    Fail(u16, String),
}

impl Egress {
    /// A proxy for one sandbox, serving nothing yet ([`Egress::serve_tcp`],
    /// [`Egress::serve_unix`], [`Egress::accept`]).
    pub fn new(policy: Policy, config: Config) -> Arc<Egress> {
        let intercept = Intercept::new(&config.sandbox, config.tls)
            .inspect_err(|e| {
                tracing::warn!(sandbox = %config.sandbox, error = %e, "egress: cannot make the sandbox's CA; hosts with headers to add will be refused")
            })
            .ok();
        Arc::new(Egress {
            intercept,
            sandbox: config.sandbox,
            policy: RwLock::new(Arc::new(policy)),
            guard: RwLock::new(Arc::new(config.guard)),
            resolver: config.resolver,
            conns: Arc::new(Semaphore::new(config.limits.max_connections)),
            refusals: Arc::new(Semaphore::new(MAX_REFUSALS)),
            limits: config.limits,
            blocked: Mutex::new(Blocked::new()),
            shutdown: watch::channel(false).0,
        })
    }

    /// The certificate (PEM) of this sandbox's CA, which signs the leaves of hosts whose
    /// requests get headers added: what the sandbox must trust (its key never leaves here).
    pub fn ca_pem(&self) -> Option<&str> {
        self.intercept.as_ref().map(|i| i.ca_pem())
    }

    /// The policy new connections follow.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replace the policy: connections accepted from now on follow it; open ones go on.
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
    }

    /// Replace the guard (the host's addresses changed): for new connections.
    pub fn set_guard(&self, guard: Guard) {
        *self.guard.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(guard);
    }

    fn guard(&self) -> Arc<Guard> {
        self.guard.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The blocked attempts so far, per host and port, the latest first.
    pub fn blocked(&self) -> Vec<BlockedCount> {
        self.blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot()
    }

    /// Blocked attempts as they happen (each is counted, then sent, then answered).
    pub fn subscribe(&self) -> broadcast::Receiver<BlockedEvent> {
        self.blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .subscribe()
    }

    /// Connections being served now.
    pub fn active(&self) -> usize {
        self.limits.max_connections - self.conns.available_permits()
    }

    /// End the serve loops and every connection of this handle (the sandbox is gone).
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Serve TCP connections (loopback in tests) until [`Egress::shutdown`].
    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener) {
        let mut stop = self.shutdown.subscribe();
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.wait_for(|s| *s) => return,
            };
            match accepted {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    if !self.accept(s) {
                        tracing::warn!(sandbox = %self.sandbox, "egress: connection refused: too many at once");
                    }
                }
                Err(e) => accept_failed(e).await,
            }
        }
    }

    /// Serve Unix socket connections until [`Egress::shutdown`].
    pub async fn serve_unix(self: Arc<Self>, listener: UnixListener) {
        let mut stop = self.shutdown.subscribe();
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.wait_for(|s| *s) => return,
            };
            match accepted {
                Ok((s, _)) => {
                    if !self.accept(s) {
                        tracing::warn!(sandbox = %self.sandbox, "egress: connection refused: too many at once");
                    }
                }
                Err(e) => accept_failed(e).await,
            }
        }
    }

    /// Serve one connection the caller accepted (spawned). When the handle has
    /// [`Limits::max_connections`] already, it is refused at once: answered `503` (what it
    /// sent is read and dropped, at most 16 KiB for at most a second, so that the answer is
    /// not lost to a reset), or closed unanswered when [`MAX_REFUSALS`] are being answered.
    /// Returns whether it is served.
    pub fn accept<S>(self: &Arc<Self>, stream: S) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match self.conns.clone().try_acquire_owned() {
            Ok(permit) => {
                self.spawn(stream, permit);
                true
            }
            Err(_) => {
                if let Ok(permit) = self.refusals.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        let mut stream = stream;
                        let _ = tokio::time::timeout(Duration::from_secs(1), async {
                            stream.write_all(BUSY).await?;
                            stream.shutdown().await?;
                            let mut sink = [0u8; 1024];
                            let mut total = 0;
                            while total < 16 * 1024 {
                                let n = stream.read(&mut sink).await?;
                                if n == 0 {
                                    break;
                                }
                                total += n;
                            }
                            io::Result::Ok(())
                        })
                        .await;
                        drop(permit);
                    });
                }
                false
            }
        }
    }

    fn spawn<S>(self: &Arc<Self>, stream: S, permit: OwnedSemaphorePermit)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let me = self.clone();
        let mut stop = self.shutdown.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                _ = me.connection(stream) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
            drop(permit);
        });
    }

    async fn connection<S>(&self, mut client: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let mut buf = Vec::new();
        let read = tokio::time::timeout(
            self.limits.head_timeout,
            http::read_head(&mut client, &mut buf, self.limits.head_max),
        )
        .await;
        let head_len = match read {
            Err(_) => {
                tracing::info!(sandbox = %self.sandbox, "egress: closed a client that did not send its request head in time");
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    answer(
                        &mut client,
                        408,
                        "Request Timeout",
                        "abx: the request head took too long.\n",
                        &[],
                    ),
                )
                .await;
                return;
            }
            Ok(Err(HeadError::TooLarge)) => {
                let _ = answer(
                    &mut client,
                    431,
                    "Request Header Fields Too Large",
                    "abx: the request head is too large.\n",
                    &[],
                )
                .await;
                return;
            }
            Ok(Err(_)) => return,
            Ok(Ok(n)) => n,
        };
        let parsed = match http::parse_head(&buf[..head_len]) {
            Ok(h) => h,
            Err(why) => {
                let _ = answer(
                    &mut client,
                    400,
                    "Bad Request",
                    &format!("abx: a malformed request: {why}.\n"),
                    &[],
                )
                .await;
                return;
            }
        };
        if !parsed.third.starts_with("HTTP/1.") {
            let _ = answer(
                &mut client,
                400,
                "Bad Request",
                "abx: HTTP/1.x requests only.\n",
                &[],
            )
            .await;
            return;
        }
        if parsed.first == "CONNECT" {
            let target = parsed.second.to_string();
            drop(parsed);
            buf.drain(..head_len);
            self.connect(client, &target, buf).await;
        } else {
            let req = match Forward::from_head(&parsed) {
                Ok(r) => r,
                Err((status, text)) => {
                    drop(parsed);
                    let _ = answer(&mut client, status, reason_of(status), &text, &[]).await;
                    return;
                }
            };
            drop(parsed);
            buf.drain(..head_len);
            self.forward(client, req, buf).await;
        }
    }

    /// The policy's and the guard's decision for `host`:`port`, resolving a name once.
    async fn decide(&self, host_raw: &str, port: u16) -> Decision {
        let policy = self.policy();
        let guard = self.guard();
        let refuse = |host: &str, reason: String, allowable: bool| {
            Decision::Refuse(Refusal {
                host: host.to_string(),
                port,
                reason,
                allowable,
            })
        };
        if let Ok(ip) = host_raw.parse::<IpAddr>() {
            let ip = canonical(ip);
            let shown = ip.to_string();
            if let Some(why) = guard.refuses(SocketAddr::new(ip, port)) {
                return refuse(&shown, always(why, None), false);
            }
            return match policy.check_addr(None, port, ip) {
                Verdict::Allowed(_) => Decision::Go(vec![SocketAddr::new(ip, port)]),
                Verdict::Denied(e) => refuse(&shown, denied(&e), true),
                Verdict::NotAllowed => refuse(&shown, NOT_ALLOWED.into(), true),
            };
        }
        let host = match name::normalize(host_raw) {
            Ok(h) => h,
            Err(why) => {
                return Decision::Fail(
                    400,
                    format!(
                        "abx: '{}' is not a host name: {why}.\n",
                        printable(host_raw)
                    ),
                )
            }
        };
        if name::is_localhost(&host) {
            return refuse(&host, always(Refused::Loopback, None), false);
        }
        if guard.broker_ports().contains(&port) {
            return refuse(&host, always(Refused::BrokerPort, None), false);
        }
        match policy.check_name(&host, port) {
            NameCheck::Denied(e) => return refuse(&host, denied(&e), true),
            NameCheck::NotAllowed => return refuse(&host, NOT_ALLOWED.into(), true),
            NameCheck::Resolve => {}
        }
        let addrs = match tokio::time::timeout(
            self.limits.resolve_timeout,
            self.resolver.resolve(&host, port),
        )
        .await
        {
            Err(_) => return Decision::Fail(504, format!("abx: resolving {host} timed out.\n")),
            Ok(Err(e)) => {
                return Decision::Fail(502, format!("abx: cannot resolve {host}: {e}.\n"))
            }
            Ok(Ok(a)) if a.is_empty() => {
                return Decision::Fail(502, format!("abx: {host} has no address.\n"))
            }
            Ok(Ok(a)) => a,
        };
        let mut go = vec![];
        let mut worst: Option<(u8, String, bool)> = None;
        let mut note = |rank: u8, reason: String, allowable: bool| {
            if !matches!(&worst, Some(w) if w.0 >= rank) {
                worst = Some((rank, reason, allowable));
            }
        };
        for ip in addrs.into_iter().take(crate::resolve::MAX_ADDRESSES) {
            let ip = canonical(ip);
            let to = SocketAddr::new(ip, port);
            if let Some(why) = guard.refuses(to) {
                note(3, always(why, Some(ip)), false);
                continue;
            }
            match policy.check_addr(Some(&host), port, ip) {
                Verdict::Allowed(_) => go.push(to),
                Verdict::Denied(e) => {
                    note(2, format!("{} (it resolves to {ip})", denied(&e)), true)
                }
                Verdict::NotAllowed => {
                    note(1, format!("{NOT_ALLOWED} (it resolves to {ip})"), true)
                }
            }
        }
        if !go.is_empty() {
            return Decision::Go(go);
        }
        let (_, reason, allowable) = worst.unwrap_or((0, NOT_ALLOWED.into(), true));
        refuse(&host, reason, allowable)
    }

    /// Count a refusal, announce it, log it; then the caller answers.
    fn record(&self, r: &Refusal) {
        let count = self
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(&r.host, r.port, &r.reason);
        // A sandbox retrying in a loop must not flood the log: the 1st, 2nd, 4th, 8th... attempt
        // of each host at info, the rest at debug (the counters hold them all).
        if count.is_power_of_two() {
            tracing::info!(sandbox = %self.sandbox, host = %r.host, port = r.port, count, reason = %r.reason, "egress: blocked");
        } else {
            tracing::debug!(sandbox = %self.sandbox, host = %r.host, port = r.port, count, reason = %r.reason, "egress: blocked");
        }
    }

    async fn refuse<S: AsyncWrite + Unpin>(&self, client: &mut S, r: &Refusal) {
        self.record(r);
        let body = forbidden_body(&self.sandbox, r);
        let blocked = format!("{}:{}", r.host, r.port);
        let _ = answer(
            client,
            403,
            "Forbidden",
            &body,
            &[("X-Abx-Blocked", &blocked)],
        )
        .await;
    }

    /// Resolve and check, then connect to the first address that answers; `None` when the
    /// client has been answered already.
    async fn open<S: AsyncWrite + Unpin>(
        &self,
        client: &mut S,
        host: &str,
        port: u16,
    ) -> Option<TcpStream> {
        let addrs = match self.decide(host, port).await {
            Decision::Go(a) => a,
            Decision::Refuse(r) => {
                self.refuse(client, &r).await;
                return None;
            }
            Decision::Fail(status, text) => {
                let _ = answer(client, status, reason_of(status), &text, &[]).await;
                return None;
            }
        };
        let mut last = String::new();
        // Each address gets the connect timeout, all of them twice that.
        let deadline = Instant::now() + 2 * self.limits.connect_timeout;
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match tokio::time::timeout(self.limits.connect_timeout.min(left), TcpStream::connect(a))
                .await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Some(s);
                }
                Ok(Err(e)) => last = format!("{a}: {e}"),
                Err(_) => last = format!("{a}: timed out"),
            }
        }
        let text = format!(
            "abx: cannot connect to {}:{port} ({last}).\n",
            printable(host)
        );
        let _ = answer(client, 502, "Bad Gateway", &text, &[]).await;
        None
    }

    async fn connect<S>(&self, mut client: S, target: &str, mut early: Vec<u8>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let auth = match http::authority(target, None) {
            Ok(a) => a,
            Err(why) => {
                let _ = answer(
                    &mut client,
                    400,
                    "Bad Request",
                    &format!("abx: CONNECT {}: {why}.\n", printable(target)),
                    &[],
                )
                .await;
                return;
            }
        };
        let port = auth.port;
        let is_name = auth.host.parse::<IpAddr>().is_err();
        let host = if is_name {
            name::normalize(auth.host).unwrap_or_default()
        } else {
            auth.host.to_string()
        };
        let Some(mut upstream) = self.open(&mut client, auth.host, port).await else {
            return;
        };
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        if is_name {
            // The ClientHello's server name must be the CONNECT host.
            let check = tokio::time::timeout(
                self.limits.hello_timeout,
                read_hello(&mut client, &mut early),
            )
            .await;
            let refused = match check {
                Err(_) => Some("no TLS ClientHello in time".to_string()),
                Ok(Err(_)) => return, // gone
                Ok(Ok(Hello::Complete { sni: Some(s) })) if s == host => None,
                Ok(Ok(Hello::Complete { sni: Some(s) })) => Some(format!(
                    "the TLS server name {s} is not the CONNECT host {host}"
                )),
                Ok(Ok(Hello::Complete { sni: None })) => {
                    Some("a TLS ClientHello without a server name".into())
                }
                Ok(Ok(Hello::NotTls)) => {
                    Some("not TLS (a CONNECT to a name must carry TLS for that name)".into())
                }
                Ok(Ok(Hello::Invalid(why))) => Some(format!("an invalid TLS ClientHello: {why}")),
                Ok(Ok(Hello::Incomplete)) => {
                    Some("a TLS ClientHello larger than the proxy reads".into())
                }
            };
            if let Some(reason) = refused {
                self.record(&Refusal {
                    host,
                    port,
                    reason,
                    allowable: false,
                });
                return; // closing is the refusal: the 200 is sent
            }
        }
        if is_name {
            let inject = self.policy().inject_for(&host, port).to_vec();
            if !inject.is_empty() {
                self.intercept(client, upstream, &host, port, early, &inject)
                    .await;
                return;
            }
        }
        if !early.is_empty() && upstream.write_all(&early).await.is_err() {
            return;
        }
        drop(early);
        splice(
            client,
            upstream,
            self.limits.idle_timeout,
            self.limits.splice_buffer,
        )
        .await;
    }

    /// A CONNECT to `host` whose `allow` entry names headers: terminate the client's TLS with
    /// a leaf of the sandbox's CA, open a verified TLS connection to the upstream, read one
    /// request, add the headers (their secret values), forward it, pass the response back.
    /// Nothing reaches the upstream unless its certificate verifies and every secret exists.
    async fn intercept<S>(
        &self,
        client: S,
        upstream: TcpStream,
        host: &str,
        port: u16,
        early: Vec<u8>,
        inject: &[(String, String)],
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let refused = |reason: String| Refusal {
            host: host.to_owned(),
            port,
            reason,
            allowable: false,
        };
        let Some(ic) = &self.intercept else {
            self.record(&refused(
                "the sandbox's CA could not be made (see the daemon's log)".into(),
            ));
            return;
        };
        // Every value first: a missing one refuses before anything is decrypted or sent.
        let mut values = Vec::with_capacity(inject.len());
        for (name, v) in inject {
            let key = v.strip_prefix("secret:").unwrap_or(v);
            match ic.secret(key) {
                Some(s) => values.push((name.clone(), s)),
                None => {
                    self.record(&refused(format!(
                        "the secret '{key}' its header {name} names is not in the broker's secret store (abx secret set {key})"
                    )));
                    return;
                }
            }
        }
        let server = match ic.server_config(host) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(sandbox = %self.sandbox, host = %host, error = %e, "egress: cannot make a certificate");
                return;
            }
        };
        let accepted = tokio::time::timeout(
            self.limits.hello_timeout,
            tokio_rustls::TlsAcceptor::from(server).accept(Rewind::new(early, client)),
        )
        .await;
        let mut client = match accepted {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::debug!(sandbox = %self.sandbox, host = %host, "egress: the client's TLS: {e}");
                return;
            }
            Err(_) => return,
        };
        let upstream = match (ic.client_config(), intercept::server_name(host)) {
            (Ok(c), Ok(name)) => tokio::time::timeout(
                self.limits.connect_timeout,
                tokio_rustls::TlsConnector::from(c).connect(name, upstream),
            )
            .await
            .unwrap_or_else(|_| Err(io::Error::other("the TLS handshake timed out"))),
            (Err(e), _) | (_, Err(e)) => Err(io::Error::other(e)),
        };
        // The request head, bounded as every head is.
        let mut buf = Vec::new();
        let read = tokio::time::timeout(
            self.limits.head_timeout,
            http::read_head(&mut client, &mut buf, self.limits.head_max),
        )
        .await;
        let head_len = match read {
            Err(_) => {
                let _ = answer(
                    &mut client,
                    408,
                    "Request Timeout",
                    "abx: the request head took too long.\n",
                    &[],
                )
                .await;
                return;
            }
            Ok(Err(HeadError::TooLarge)) => {
                let _ = answer(
                    &mut client,
                    431,
                    "Request Header Fields Too Large",
                    "abx: the request head is too large.\n",
                    &[],
                )
                .await;
                return;
            }
            Ok(Err(_)) => return,
            Ok(Ok(n)) => n,
        };
        let upstream = match upstream {
            Ok(u) => u,
            Err(e) => {
                let reason = format!("its TLS certificate or handshake failed: {e}");
                tracing::warn!(sandbox = %self.sandbox, host = %host, port, reason = %reason, "egress: upstream refused; nothing sent");
                let _ = answer(
                    &mut client,
                    502,
                    "Bad Gateway",
                    &format!(
                        "abx: {}:{port}: {}; nothing was sent to it.\n",
                        printable(host),
                        printable(&reason)
                    ),
                    &[],
                )
                .await;
                return;
            }
        };
        let host_header = if port == 443 {
            host.to_owned()
        } else {
            format!("{host}:{port}")
        };
        let built = match http::parse_head(&buf[..head_len]) {
            Ok(h) => intercept::inject_head(&h, &host_header, &values),
            Err(why) => Err((400, format!("abx: a malformed request: {why}.\n"))),
        };
        drop(values);
        let (head, body) = match built {
            Ok(b) => b,
            Err((status, text)) => {
                let _ = answer(&mut client, status, reason_of(status), &text, &[]).await;
                return;
            }
        };
        buf.drain(..head_len);
        // `exchange` zeroes the head once written (it carries the secrets).
        self.exchange(client, upstream, head, body, buf, host).await;
    }

    async fn forward<S>(&self, mut client: S, req: Forward, early: Vec<u8>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(upstream) = self.open(&mut client, &req.host, req.port).await else {
            return;
        };
        self.exchange(client, upstream, req.head, req.body, early, &req.host)
            .await;
    }

    /// Send one request (its head, then its body as framed, from `early` then the client) to
    /// `upstream`, and its response back; `host` names the upstream in messages. The head is
    /// zeroed once written (it may carry secrets).
    async fn exchange<S, U>(
        &self,
        mut client: S,
        upstream: U,
        mut head: Vec<u8>,
        body: Body,
        early: Vec<u8>,
        host: &str,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send,
        U: AsyncRead + AsyncWrite + Unpin + Send,
    {
        struct Req<'a> {
            host: &'a str,
            body: Body,
        }
        let req = Req { host, body };
        let (up_r, mut up_w) = tokio::io::split(upstream);
        let sent_head = up_w.write_all(&head).await;
        {
            use zeroize::Zeroize;
            head.zeroize(); // written: not held for the connection's life
            head = Vec::new();
        }
        drop(head);
        if sent_head.is_err() {
            let _ = answer(
                &mut client,
                502,
                "Bad Gateway",
                "abx: the upstream closed.\n",
                &[],
            )
            .await;
            return;
        }
        let idle = self.limits.idle_timeout;
        // One idle clock for both directions: a read from the client or the upstream moves it.
        let last = Arc::new(AtomicU64::new(0));
        let epoch = Instant::now();
        let (client_r, mut client_w) = tokio::io::split(client);
        let mut body_src = Idle::with_clock(
            std::io::Cursor::new(early).chain(client_r),
            last.clone(),
            epoch,
        );
        let mut up_r = Idle::with_clock(up_r, last.clone(), epoch);
        let result = {
            let send = async {
                match req.body {
                    Body::None => Ok(()),
                    Body::Length(n) => {
                        let mut limited = (&mut body_src).take(n);
                        let copied = tokio::io::copy(&mut limited, &mut up_w).await?;
                        if copied < n {
                            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short body"));
                        }
                        Ok(())
                    }
                    Body::Chunked => copy_chunked(&mut body_src, &mut up_w).await,
                }
            };
            let max = self.limits.response_head_max;
            let recv = async {
                let mut head = Vec::new();
                let mut carry: Vec<u8> = Vec::new();
                let mut started = false;
                loop {
                    // Heads until a final one (1xx but 101 are followed by another).
                    let mut src = std::io::Cursor::new(std::mem::take(&mut carry)).chain(&mut up_r);
                    let read = http::read_head(&mut src, &mut head, max).await;
                    let (cursor, _) = src.into_inner();
                    let unread = &cursor.get_ref()
                        [(cursor.position() as usize).min(cursor.get_ref().len())..];
                    let n = read.map_err(|e| {
                        let e = match e {
                            HeadError::Io(e) => e,
                            HeadError::Closed => {
                                io::Error::new(io::ErrorKind::UnexpectedEof, "closed")
                            }
                            HeadError::TooLarge => io::Error::other("response head too large"),
                        };
                        (started, e)
                    })?;
                    let (out, informational) = rewrite_response(&head[..n])
                        .map_err(|why| (started, io::Error::other(why)))?;
                    client_w.write_all(&out).await.map_err(|e| (true, e))?;
                    started = true;
                    carry = head[n..].to_vec();
                    carry.extend_from_slice(unread);
                    if !informational {
                        client_w.write_all(&carry).await.map_err(|e| (true, e))?;
                        break;
                    }
                }
                // Not held while the body streams.
                drop(head);
                drop(carry);
                let copied = tokio::io::copy(&mut up_r, &mut client_w).await;
                // An upstream that closes its TLS without close_notify ends its response as a
                // plain connection's close does.
                if let Err(e) = copied {
                    if e.kind() != io::ErrorKind::UnexpectedEof {
                        return Err((true, e));
                    }
                }
                let _ = client_w.shutdown().await;
                Ok::<(), (bool, io::Error)>(())
            };
            tokio::pin!(send);
            tokio::pin!(recv);
            let mut sent = false;
            loop {
                tokio::select! {
                    r = &mut recv => break r,
                    _ = idle_for(&last, epoch, idle) => {
                        tracing::debug!(sandbox = %self.sandbox, host = %req.host, "egress: idle for {idle:?}: closed");
                        return;
                    }
                    s = &mut send, if !sent => {
                        sent = true;
                        if let Err(e) = s {
                            tracing::debug!(sandbox = %self.sandbox, host = %req.host, "egress: request body: {e}");
                            return;
                        }
                    }
                }
            }
        };
        if let Err((started, e)) = result {
            tracing::debug!(sandbox = %self.sandbox, host = %req.host, "egress: response: {e}");
            if !started {
                let _ = answer(
                    &mut client_w,
                    502,
                    "Bad Gateway",
                    &format!("abx: a bad response from {}: {e}.\n", req.host),
                    &[],
                )
                .await;
            }
        }
    }
}

async fn accept_failed(e: io::Error) {
    // Out of descriptors, a connection reset before accept: wait a little, go on.
    tracing::warn!("egress: accept: {e}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

const NOT_ALLOWED: &str = "not allowed by the sandbox's network policy";

fn denied(entry: &str) -> String {
    format!("denied by the policy entry '{entry}'")
}

fn always(why: Refused, ip: Option<IpAddr>) -> String {
    match ip {
        Some(ip) => format!(
            "it resolves to {ip}, {}: always refused, no policy allows it",
            why.describe()
        ),
        None => format!("{}: always refused, no policy allows it", why.describe()),
    }
}

/// The 403's text: what was blocked, why, and how to allow it.
fn forbidden_body(sandbox: &str, r: &Refusal) -> String {
    let mut s = format!(
        "abx: {}:{} is blocked for sandbox {sandbox}: {}.\n",
        r.host, r.port, r.reason
    );
    if r.allowable {
        let pattern = if r.port == 80 || r.port == 443 {
            r.host.clone()
        } else if r.host.contains(':') {
            format!("[{}]:{}", r.host, r.port)
        } else {
            format!("{}:{}", r.host, r.port)
        };
        let _ = write!(
            s,
            "To allow it (ask the user first):\n  abx network {sandbox} allow {pattern}     (this running sandbox)\n  abx run --allow {pattern} -- ...   (the CLI flag, at create; --network allow:{pattern})\n  {{\"network\": {{\"allow\": [\"{pattern}\"]}}}}   (the MCP sandbox_create `network` argument)\n"
        );
    }
    s
}

fn reason_of(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// `s` cut to 256 characters, escaped, for messages.
fn printable(s: &str) -> String {
    s.chars().take(256).flat_map(char::escape_debug).collect()
}

async fn answer<S: AsyncWrite + Unpin>(
    client: &mut S,
    status: u16,
    reason: &str,
    body: &str,
    extra: &[(&str, &str)],
) -> io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        let _ = write!(out, "{k}: {v}\r\n");
    }
    out.push_str("\r\n");
    out.push_str(body);
    client.write_all(out.as_bytes()).await?;
    client.flush().await?;
    client.shutdown().await
}

/// Read the ClientHello into `buf` (which may hold its start already), at most
/// [`sni::MAX_READ`] bytes.
async fn read_hello<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<Hello> {
    loop {
        let h = sni::parse(buf);
        if h != Hello::Incomplete || buf.len() >= sni::MAX_READ {
            return Ok(h);
        }
        let start = buf.len();
        let room = (sni::MAX_READ - start).min(4096);
        buf.resize(start + room, 0);
        let n = r.read(&mut buf[start..]).await?;
        buf.truncate(start + n);
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// A plain HTTP request to forward: where to, its new head, how its body is framed.
struct Forward {
    host: String,
    port: u16,
    head: Vec<u8>,
    body: Body,
}

pub(crate) enum Body {
    None,
    Length(u64),
    Chunked,
}

/// Hop-by-hop headers the proxy drops (and `Host`, which it writes from the URL).
pub(crate) const DROPPED: &[&str] = &[
    "host",
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "upgrade",
];

impl Forward {
    fn from_head(h: &http::Head<'_>) -> Result<Forward, (u16, String)> {
        let bad = |why: &str| (400, format!("abx: {why}.\n"));
        let (auth_s, origin) = http::absolute_http(h.second).map_err(|why| {
            (
                400,
                format!("abx: this is an HTTP proxy: send absolute-form requests (GET http://host/path) or CONNECT host:port; {why}.\n"),
            )
        })?;
        let auth = http::authority(auth_s, Some(80)).map_err(bad)?;
        let body = body_of(h)?;
        let named = connection_named(h);
        let host_header = auth_s;
        let mut head = Vec::with_capacity(512);
        head.extend_from_slice(h.first.as_bytes());
        head.push(b' ');
        head.extend_from_slice(origin.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        head.extend_from_slice(host_header.as_bytes());
        head.extend_from_slice(b"\r\n");
        for (k, v) in &h.headers {
            let lk = k.to_ascii_lowercase();
            if DROPPED.contains(&lk.as_str()) || named.contains(&lk) {
                continue;
            }
            head.extend_from_slice(k.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(v);
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"Connection: close\r\n\r\n");
        Ok(Forward {
            host: auth.host.to_string(),
            port: auth.port,
            head,
            body,
        })
    }
}

/// How a request's body is framed (`Content-Length`, or `chunked` alone; both, or another
/// coding, refused).
pub(crate) fn body_of(h: &http::Head<'_>) -> Result<Body, (u16, String)> {
    let bad = |why: &str| (400, format!("abx: {why}.\n"));
    {
        let te: Vec<&[u8]> = h.values("transfer-encoding").collect();
        let cl: Vec<&[u8]> = h.values("content-length").collect();
        let body = if !te.is_empty() {
            if !cl.is_empty() {
                return Err(bad("both Transfer-Encoding and Content-Length"));
            }
            let chunked_only = te.len() == 1 && te[0].trim_ascii().eq_ignore_ascii_case(b"chunked");
            if !chunked_only {
                return Err((
                    501,
                    "abx: only Transfer-Encoding: chunked is forwarded.\n".into(),
                ));
            }
            Body::Chunked
        } else if let Some(first) = cl.first() {
            if cl.iter().any(|v| v != first)
                || first.is_empty()
                || first.len() > 18
                || !first.iter().all(u8::is_ascii_digit)
            {
                return Err(bad("a malformed Content-Length"));
            }
            let n: u64 = std::str::from_utf8(first)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("a malformed Content-Length"))?;
            if n == 0 {
                Body::None
            } else {
                Body::Length(n)
            }
        } else {
            Body::None
        };
        Ok(body)
    }
}

/// The headers the client's `Connection` header names (hop-by-hop too; never the framing).
pub(crate) fn connection_named(h: &http::Head<'_>) -> Vec<String> {
    h.values("connection")
        .flat_map(|v| v.split(|&b| b == b','))
        .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
        .filter(|t| t != "content-length" && t != "transfer-encoding")
        .collect()
}

/// The response head with `Connection: close` (the proxy serves one request per connection);
/// whether it is informational (1xx but 101: another head follows).
fn rewrite_response(b: &[u8]) -> Result<(Vec<u8>, bool), &'static str> {
    let h = http::parse_head(b)?;
    if !h.first.starts_with("HTTP/1.")
        || h.second.len() != 3
        || !h.second.bytes().all(|c| c.is_ascii_digit())
    {
        return Err("not an HTTP/1.x response");
    }
    let informational = h.second.starts_with('1') && h.second != "101";
    if h.second == "101" {
        return Err("a protocol switch (use CONNECT for WebSockets)");
    }
    let mut out = Vec::with_capacity(b.len() + 32);
    out.extend_from_slice(h.first.as_bytes());
    out.push(b' ');
    out.extend_from_slice(h.second.as_bytes());
    out.push(b' ');
    out.extend_from_slice(h.third.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (k, v) in &h.headers {
        let lk = k.to_ascii_lowercase();
        if !informational
            && matches!(
                lk.as_str(),
                "connection" | "keep-alive" | "proxy-connection"
            )
        {
            continue;
        }
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    if !informational {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok((out, informational))
}

/// Forward a chunked body as it is, chunk by chunk: size lines and trailers are at most 4 KiB
/// each (16 KiB of trailers), chunk data is streamed.
async fn copy_chunked<R, W>(r: &mut R, w: &mut W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let mut line = Vec::with_capacity(64);
    loop {
        read_line(r, &mut line, 4096).await?;
        w.write_all(&line).await?;
        let text = line.trim_ascii_end();
        let size_s = text
            .split(|&b| b == b';')
            .next()
            .unwrap_or(b"")
            .trim_ascii();
        if size_s.is_empty() || size_s.len() > 15 || !size_s.iter().all(u8::is_ascii_hexdigit) {
            return Err(bad("a malformed chunk size"));
        }
        let size = u64::from_str_radix(
            std::str::from_utf8(size_s).map_err(|_| bad("chunk size"))?,
            16,
        )
        .map_err(|_| bad("chunk size"))?;
        if size == 0 {
            // Trailers, then the blank line.
            let mut total = 0usize;
            loop {
                read_line(r, &mut line, 4096).await?;
                total += line.len();
                if total > 16 * 1024 {
                    return Err(bad("trailers too large"));
                }
                w.write_all(&line).await?;
                if line.trim_ascii().is_empty() {
                    return w.flush().await;
                }
            }
        }
        let mut data = (&mut *r).take(size + 2);
        let n = tokio::io::copy(&mut data, w).await?;
        if n < size + 2 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// One line (through `\n`) into `line`, at most `max` bytes. Read a byte at a time: nothing
/// past the line may be taken from the unbuffered reader (chunk size lines are a few bytes;
/// the chunks' data is copied in bulk).
async fn read_line<R: AsyncRead + Unpin>(
    r: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<()> {
    line.clear();
    let mut b = [0u8; 1];
    loop {
        if r.read(&mut b).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        line.push(b[0]);
        if b[0] == b'\n' {
            return Ok(());
        }
        if line.len() >= max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a line too long",
            ));
        }
    }
}

/// A reader that notes when it last read a byte (the splice's idle clock).
struct Idle<R> {
    inner: R,
    last: Arc<AtomicU64>,
    epoch: Instant,
}

impl<R> Idle<R> {
    fn with_clock(inner: R, last: Arc<AtomicU64>, epoch: Instant) -> Idle<R> {
        Idle { inner, last, epoch }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Idle<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let ms = self.epoch.elapsed().as_millis() as u64;
            self.last.store(ms, Ordering::Relaxed);
        }
        r
    }
}

impl<R: AsyncWrite + Unpin> AsyncWrite for Idle<R> {
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

/// Wait until nothing was read through `last` for `idle`.
async fn idle_for(last: &AtomicU64, epoch: Instant, idle: Duration) {
    loop {
        let since = epoch
            .elapsed()
            .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
        if since >= idle {
            return;
        }
        tokio::time::sleep(idle - since).await;
    }
}

/// Bytes both ways until either side ends or nothing moves for `idle`.
async fn splice<A, B>(a: A, b: B, idle: Duration, buffer: usize)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let last = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let mut a = Idle::with_clock(a, last.clone(), epoch);
    let mut b = Idle::with_clock(b, last.clone(), epoch);
    tokio::select! {
        r = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, buffer, buffer) => {
            if let Err(e) = r {
                tracing::debug!("egress: splice: {e}");
            }
        }
        _ = idle_for(&last, epoch, idle) => {
            tracing::debug!("egress: splice idle for {idle:?}: closed");
        }
    }
}
