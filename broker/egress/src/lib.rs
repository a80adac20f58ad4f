//! abx-egress: the host-side filtering proxy of a sandbox's network (issue 44). `abx-local`
//! wires it into sandboxes with a network policy (`broker/local/src/egress.rs`;
//! docs/local-sandboxes.md, "Egress by name").
//!
//! A sandbox whose network is a policy (`{allow: [...], deny?: [...]}`) has no route out; its
//! only way out is this proxy, on the host, reached from inside through a forwarded loopback
//! port, with `HTTP_PROXY`/`HTTPS_PROXY` pointing at it. The proxy speaks HTTP CONNECT (TLS:
//! the ClientHello's server name must be the CONNECT host; bytes are spliced, never
//! decrypted, except for hosts whose `allow` entry names headers to add: see [`intercept`])
//! and plain HTTP proxy requests (`GET http://host/path`: rewritten to origin-form
//! and forwarded, one request per client connection). It resolves each name on the host once,
//! checks every address, and connects to the address it checked.
//!
//! # Wiring it (what `abx-local` does)
//!
//! ```no_run
//! # async fn wire() -> Result<(), Box<dyn std::error::Error>> {
//! use abx_egress::{Config, Egress, Guard, Limits, Policy, Sets, SystemResolver};
//! use std::sync::Arc;
//!
//! // Once per broker: what no policy opens.
//! let guard = Guard::new(abx_egress::host_addresses()?, vec![/* the broker's ports */]);
//! let sets = Sets::new(); // from the broker config's [network.sets.NAME]
//!
//! // Per sandbox: parse (E1004 naming the bad entry), then serve.
//! let spec = serde_json::json!({"allow": ["pypi.example", "*.files.example"]});
//! let policy = Policy::parse("sandbox/create", &spec, &sets, &guard)?;
//! let egress = Egress::new(policy, Config {
//!     sandbox: "sb-1".into(),
//!     guard: guard.clone(),
//!     resolver: Arc::new(SystemResolver),
//!     limits: Limits::default(),
//!     tls: abx_egress::Tls::default(), // header injection: the secret store (see below)
//! });
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?; // or a UnixListener
//! tokio::spawn(egress.clone().serve_tcp(listener)); // serve_unix, or accept() per stream
//!
//! // sandbox/setNetwork: new connections follow the new policy, open ones go on.
//! let spec = serde_json::json!({"allow": ["pypi.example", "api.example"]});
//! egress.set_policy(Policy::parse("sandbox/setNetwork", &spec, &sets, &guard)?);
//!
//! // sandbox/info network.blocked, and sandbox/blocked notifications.
//! let counts = egress.blocked(); // [{host, port, count, last}]
//! let mut events = egress.subscribe(); // lossy: Lagged(n) says how many were lost
//! while let Ok(e) = events.recv().await { /* sandbox/blocked {sandbox, e.host, e.port, e.count} */ }
//!
//! egress.shutdown(); // the sandbox is gone: serve loops and connections end
//! # Ok(()) }
//! ```
//!
//! # Modules
//!
//! - [`policy`]: parsing (bounded: 1024 entries, names of 253 bytes) and matching; E1004.
//! - [`net`]: CIDR blocks and the [`Guard`] (loopback, link-local, unspecified, non-unicast,
//!   the host's own addresses, the broker's ports: refused whatever the policy).
//! - [`name`]: host names as compared (lower-case, no trailing dot, punycode as given).
//! - [`sni`]: the hand-written, bounded ClientHello reader (fuzz target `egress_sni`).
//! - [`http`]: bounded HTTP/1.x heads.
//! - [`resolve`]: the [`Resolver`] trait, the system resolver and a static one for tests.
//! - [`blocked`]: the blocked counters (1024 hosts, then `other`) and events.
//! - [`proxy`]: [`Egress`], its [`Limits`] and the connection handling.
//! - [`ifaddrs`]: the host's interface addresses (`getifaddrs`).
//! - [`intercept`]: TLS termination for hosts with headers (the per-sandbox CA, leaves, the
//!   verified upstream side, the rewritten head).
//! - [`secrets`]: the secret store (a 0600 file, values zeroed on drop, never shown).
//!
//! # Bounds (the client is the sandbox, hence hostile)
//!
//! A head is at most 16 KiB, counted as read, and must arrive within 10 s (slowloris); a
//! ClientHello at most 16 KiB within 10 s; at most 256 connections per handle (more are
//! refused at once with 503); a spliced or forwarded connection idle for 5 minutes is closed;
//! each connection holds its head buffer and two 16 KiB splice buffers. Input never panics
//! (the fuzz targets `egress_sni` and `egress_policy`).
//!
//! # Header injection (credentials that never enter the sandbox)
//!
//! An `allow` entry `{host, headers: {NAME: "secret:KEY"}}` makes the proxy add those headers
//! to the requests to that host, with values from a [`SecretSource`] ([`Config::tls`]: the
//! daemon's [`SecretStore`]). For a CONNECT to such a host the proxy terminates TLS with a
//! leaf of the sandbox's own CA ([`Egress::ca_pem`]: what the sandbox must trust; its key
//! stays here), verifies the upstream's certificate against `webpki-roots` (plus
//! [`Tls::extra_roots`], tests only), forwards one request with the headers replaced and
//! closes. Every other host stays spliced.
//!
//! # Not here yet
//!
//! SOCKS5, UDP (DNS included: names are resolved by the proxy), keep-alive to the client for
//! plain HTTP and for intercepted hosts.
pub mod blocked;
mod forward;
pub mod http;
pub mod ifaddrs;
pub mod intercept;
pub mod name;
pub mod net;
pub mod policy;
pub mod proxy;
mod refusal;
pub mod resolve;
pub mod secrets;
pub mod sni;
mod splice;

pub use blocked::{BlockedCount, BlockedEvent};
pub use ifaddrs::host_addresses;
pub use intercept::Tls;
pub use net::{Guard, IpNet, Refused};
pub use policy::{Policy, Sets};
pub use proxy::{Config, Egress, Limits};
pub use resolve::{Resolver, StaticResolver, SystemResolver};
pub use secrets::{NoSecrets, Secret, SecretSource, SecretStore};
