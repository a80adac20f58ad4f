//! The proxy: HTTP CONNECT (TLS spliced after its ClientHello's server name is checked) and
//! plain HTTP proxy requests (absolute-form, one request per connection), on a listener the
//! caller gives, for one sandbox's live policy ([`Egress`]).

use crate::blocked::{Blocked, BlockedCount, BlockedEvent};
use crate::forward::{exchange, Exchange, Forward};
use crate::http::{self, HeadError};
use crate::intercept::{self, Intercept, Rewind, Tls};
use crate::name;
use crate::net::{canonical, Guard, Refused};
use crate::policy::{NameCheck, Policy, Verdict};
use crate::refusal::{
    always, answer, denied, forbidden_body, printable, reason_of, Refusal, NOT_ALLOWED,
};
use crate::resolve::Resolver;
use crate::sni::{self, Hello};
use crate::splice::splice;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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
        exchange(self.exchange_to(host), client, upstream, head, body, buf).await;
    }

    /// An exchange with `host` for this sandbox, within its limits.
    fn exchange_to<'a>(&'a self, host: &'a str) -> Exchange<'a> {
        Exchange {
            sandbox: &self.sandbox,
            host,
            idle: self.limits.idle_timeout,
            response_head_max: self.limits.response_head_max,
        }
    }

    async fn forward<S>(&self, mut client: S, req: Forward, early: Vec<u8>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(upstream) = self.open(&mut client, &req.host, req.port).await else {
            return;
        };
        let to = self.exchange_to(&req.host);
        exchange(to, client, upstream, req.head, req.body, early).await;
    }
}

async fn accept_failed(e: io::Error) {
    // Out of descriptors, a connection reset before accept: wait a little, go on.
    tracing::warn!("egress: accept: {e}");
    tokio::time::sleep(Duration::from_millis(50)).await;
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
