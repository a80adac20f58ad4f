//! Name resolution on the host, once per connection: the proxy resolves, checks each address,
//! and connects to the address it checked (no second lookup a rebinding server could answer
//! differently).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;

/// At most this many addresses of one name are considered.
pub const MAX_ADDRESSES: usize = 16;

/// A boxed future of a resolution.
pub type Resolving<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Turns a host name into addresses.
pub trait Resolver: Send + Sync + 'static {
    /// The addresses of `host` (normalized: lower-case, no trailing dot), in the order to
    /// try them. An empty list is "no such host".
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolving<'a>;
}

/// The system resolver (`getaddrinfo` through `tokio::net::lookup_host`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolving<'a> {
        Box::pin(async move {
            let mut out: Vec<IpAddr> = vec![];
            for a in tokio::net::lookup_host((host, port)).await? {
                if !out.contains(&a.ip()) {
                    out.push(a.ip());
                }
                if out.len() == MAX_ADDRESSES {
                    break;
                }
            }
            Ok(out)
        })
    }
}

/// **Tests and benches**: a fixed map of names to addresses; any other name does not exist
/// (nothing ever reaches a real resolver).
#[derive(Clone, Debug, Default)]
pub struct StaticResolver {
    map: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    /// An empty map.
    pub fn new() -> StaticResolver {
        StaticResolver::default()
    }

    /// `name` (normalized here) resolves to `addrs`.
    pub fn with(mut self, name: &str, addrs: &[IpAddr]) -> StaticResolver {
        let key = crate::name::normalize(name).unwrap_or_else(|_| name.to_ascii_lowercase());
        self.map.insert(key, addrs.to_vec());
        self
    }
}

impl Resolver for StaticResolver {
    fn resolve<'a>(&'a self, host: &'a str, _port: u16) -> Resolving<'a> {
        let r = self.map.get(host).cloned().unwrap_or_default();
        Box::pin(async move { Ok(r) })
    }
}
