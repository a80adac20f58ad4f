//! A sandbox's egress policy: `{allow: [entry...], deny?: [entry...]}`.
//!
//! An entry is a pattern string or `{host: pattern, headers: {NAME: "secret:KEY"}}` (the
//! headers are parsed and kept for the proxy to add later; nothing injects them yet). A
//! pattern is:
//!
//! | pattern | matches |
//! |---|---|
//! | `example.com` | that host only |
//! | `*.example.com` | its subdomains, at any depth, not `example.com` itself |
//! | `10.0.0.0/8`, `192.0.2.7`, `2001:db8::/32`, `[2001:db8::1]` | an address, also the address a name resolves to |
//! | `@NAME` | every entry of the named set `NAME` (the broker config's `[network.sets.NAME]`) |
//!
//! Each may end in `:PORT` or `:*` (an IPv6 address or block in brackets then: `[::/0]:22`).
//! Without one, an `allow` entry means ports 80 and 443, a `deny` entry every port (a
//! `deny` errs on the side of refusing). `deny` wins over `allow`; anything not allowed is
//! refused. Names compare case-insensitively without a trailing dot; internationalized names
//! are written in punycode.
//!
//! Refused at parse, with E1004 naming the entry: anything malformed, more than
//! [`MAX_ENTRIES`] entries (sets expanded), an unknown set, a set naming a set, and an entry
//! that can only name what the [`Guard`] always refuses (`localhost`, `127.0.0.1`,
//! `169.254.169.254`, `fe80::/10`, one of the host's addresses, a broker port).
//!
//! Std, serde_json and abx-protocol only (the fuzz crate compiles this file in).

use super::name;
use super::net::{Guard, IpNet, Refused};
use abx_protocol::error::AbxError;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

/// At most this many entries in a policy, named sets expanded.
pub const MAX_ENTRIES: usize = 1024;

/// At most this many headers on one entry.
pub const MAX_HEADERS: usize = 32;

/// Named sets of entries (the broker config's `[network.sets.NAME]`): each a list of entries
/// as a policy's `allow` holds them (strings, or objects with `host` and `headers`).
pub type Sets = BTreeMap<String, Vec<Value>>;

/// What an entry names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// One host name (normalized).
    Host(String),
    /// The subdomains of this name (normalized, without the `*.`).
    Subdomains(String),
    /// An address or block.
    Net(IpNet),
}

/// Which ports an entry covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ports {
    /// 80 and 443 (an `allow` entry without a port).
    Web,
    /// One port.
    One(u16),
    /// Every port (`:*`, or a `deny` entry without a port).
    Any,
}

impl Ports {
    /// Whether `port` is covered.
    pub fn covers(self, port: u16) -> bool {
        match self {
            Ports::Web => port == 80 || port == 443,
            Ports::One(p) => p == port,
            Ports::Any => true,
        }
    }
}

/// One parsed entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// What it names.
    pub pattern: Pattern,
    /// On which ports.
    pub ports: Ports,
    /// Headers to add to requests to it: `(name, "secret:KEY")`, names as written.
    pub headers: Vec<(String, String)>,
    /// The entry as written (`@set` entries: `@set: pattern`), for messages.
    pub entry: String,
}

impl Rule {
    fn matches_name(&self, host: &str) -> bool {
        match &self.pattern {
            Pattern::Host(h) => h == host,
            Pattern::Subdomains(s) => {
                host.len() > s.len() + 1
                    && host.ends_with(s.as_str())
                    && host.as_bytes()[host.len() - s.len() - 1] == b'.'
            }
            Pattern::Net(_) => false,
        }
    }
    fn matches_addr(&self, ip: IpAddr) -> bool {
        matches!(&self.pattern, Pattern::Net(n) if n.contains(ip))
    }
}

/// What the policy says before the name is resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameCheck {
    /// A `deny` entry names it (the entry as written): refused, not resolved.
    Denied(String),
    /// Nothing could allow it (no name entry matches, no address entry covers the port):
    /// refused, not resolved.
    NotAllowed,
    /// Resolve it, then ask [`Policy::check_addr`] of each address.
    Resolve,
}

/// What the policy says of one destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed by the `allow` entry at this index ([`Policy::allowed`]).
    Allowed(usize),
    /// A `deny` entry names it (as written).
    Denied(String),
    /// No entry allows it.
    NotAllowed,
}

/// A parsed policy. Cheap to share (`Arc`), immutable: a change is a new policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    allow: Vec<Rule>,
    deny: Vec<Rule>,
    spec: Value,
}

const SUGGESTION: &str = "A network entry is a host name (example.com), a wildcard \
(*.example.com), an IP address or CIDR block, or @SET, optionally followed by :PORT (without \
one: 80 and 443); or {\"host\": PATTERN, \"headers\": {\"NAME\": \"secret:KEY\"}}. The host's \
loopback, link-local and own addresses and the broker's ports are always refused.";

/// The entry as it may be shown: at most 256 characters, escaped.
fn shown(entry: &str) -> String {
    let mut s: String = entry
        .chars()
        .take(256)
        .flat_map(char::escape_debug)
        .collect();
    if entry.chars().count() > 256 {
        s.push_str("...");
    }
    s
}

fn bad(method: &str, entry: &str, why: &str) -> AbxError {
    let e = shown(entry);
    AbxError::invalid_params(method, format!("network entry '{e}': {why}"))
        .with_data("entry", e)
        .with_suggestion(SUGGESTION)
}

fn bad_shape(method: &str, why: &str) -> AbxError {
    AbxError::invalid_params(method, format!("network policy: {why}")).with_suggestion(SUGGESTION)
}

struct Parser<'a> {
    method: &'a str,
    sets: &'a Sets,
    guard: &'a Guard,
    count: usize,
}

impl Policy {
    /// Parse a policy object (`{allow: [...], deny?: [...]}`) for `method` (named in the
    /// E1004 it returns: `sandbox/create`, `sandbox/setNetwork`), with the broker's named
    /// `sets` and the `guard` whose addresses and ports no entry may name alone.
    pub fn parse(
        method: &str,
        spec: &Value,
        sets: &Sets,
        guard: &Guard,
    ) -> Result<Policy, AbxError> {
        let Some(obj) = spec.as_object() else {
            return Err(bad_shape(
                method,
                "expected an object {allow: [...], deny?: [...]}",
            ));
        };
        if let Some(k) = obj.keys().find(|k| *k != "allow" && *k != "deny") {
            return Err(bad_shape(
                method,
                &format!("unknown member '{}' (only allow and deny)", shown(k)),
            ));
        }
        let mut p = Parser {
            method,
            sets,
            guard,
            count: 0,
        };
        let list = |p: &mut Parser, key: &str, deny: bool| -> Result<Vec<Rule>, AbxError> {
            match obj.get(key) {
                None if deny => Ok(vec![]),
                None => Err(bad_shape(method, "'allow' is required (a list of entries)")),
                Some(Value::Array(items)) => {
                    let mut rules = vec![];
                    for item in items {
                        p.entry(item, deny, None, &mut rules)?;
                    }
                    Ok(rules)
                }
                Some(_) => Err(bad_shape(
                    method,
                    &format!("'{key}' must be a list of entries"),
                )),
            }
        };
        let allow = list(&mut p, "allow", false)?;
        let deny = list(&mut p, "deny", true)?;
        Ok(Policy {
            allow,
            deny,
            spec: spec.clone(),
        })
    }

    /// A policy of patterns written as strings (tests, the CLI's `--allow`).
    pub fn from_patterns(
        method: &str,
        allow: &[&str],
        deny: &[&str],
        sets: &Sets,
        guard: &Guard,
    ) -> Result<Policy, AbxError> {
        let mut o = Map::new();
        o.insert(
            "allow".into(),
            allow.iter().map(|s| Value::from(*s)).collect(),
        );
        if !deny.is_empty() {
            o.insert(
                "deny".into(),
                deny.iter().map(|s| Value::from(*s)).collect(),
            );
        }
        Policy::parse(method, &Value::Object(o), sets, guard)
    }

    /// The policy as it was given (for `sandbox/info`).
    pub fn spec(&self) -> &Value {
        &self.spec
    }

    /// The `allow` entries, sets expanded.
    pub fn allowed(&self) -> &[Rule] {
        &self.allow
    }

    /// The `deny` entries, sets expanded.
    pub fn denied(&self) -> &[Rule] {
        &self.deny
    }

    /// Before resolving `host` (normalized) for `port`: refuse it at once, or resolve it.
    pub fn check_name(&self, host: &str, port: u16) -> NameCheck {
        if let Some(r) = self
            .deny
            .iter()
            .find(|r| r.ports.covers(port) && r.matches_name(host))
        {
            return NameCheck::Denied(r.entry.clone());
        }
        let possible = self.allow.iter().any(|r| {
            r.ports.covers(port) && (r.matches_name(host) || matches!(r.pattern, Pattern::Net(_)))
        });
        if possible {
            NameCheck::Resolve
        } else {
            NameCheck::NotAllowed
        }
    }

    /// The headers to add to requests to the name `host` (normalized) on `port`: those of the
    /// first `allow` entry naming it (by name, not by address) that has headers; empty when
    /// none has (the connection is spliced, never decrypted).
    pub fn inject_for(&self, host: &str, port: u16) -> &[(String, String)] {
        self.allow
            .iter()
            .find(|r| !r.headers.is_empty() && r.ports.covers(port) && r.matches_name(host))
            .map(|r| r.headers.as_slice())
            .unwrap_or(&[])
    }

    /// Whether any `allow` entry names headers (the sandbox must trust its proxy's CA).
    pub fn has_headers(&self) -> bool {
        self.allow.iter().any(|r| !r.headers.is_empty())
    }

    /// The secret keys the `allow` entries' headers name (`secret:KEY`), each once.
    pub fn secret_keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self
            .allow
            .iter()
            .flat_map(|r| r.headers.iter())
            .filter_map(|(_, v)| v.strip_prefix("secret:"))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// A connection to `ip`:`port`, reached by the name `host` (normalized) or by the address
    /// itself (`None`). The [`Guard`] is asked separately (before this).
    pub fn check_addr(&self, host: Option<&str>, port: u16, ip: IpAddr) -> Verdict {
        let hit = |r: &Rule| {
            r.ports.covers(port) && (r.matches_addr(ip) || host.is_some_and(|h| r.matches_name(h)))
        };
        if let Some(r) = self.deny.iter().find(|r| hit(r)) {
            return Verdict::Denied(r.entry.clone());
        }
        match self.allow.iter().position(hit) {
            Some(i) => Verdict::Allowed(i),
            None => Verdict::NotAllowed,
        }
    }
}

impl Parser<'_> {
    fn entry(
        &mut self,
        item: &Value,
        deny: bool,
        set: Option<&str>,
        out: &mut Vec<Rule>,
    ) -> Result<(), AbxError> {
        let (pattern, headers) = match item {
            Value::String(s) => (s.as_str(), vec![]),
            Value::Object(o) => {
                let shown_obj = || {
                    let s = item.to_string();
                    s.chars().take(200).collect::<String>()
                };
                if let Some(k) = o.keys().find(|k| *k != "host" && *k != "headers") {
                    return Err(bad(
                        self.method,
                        &shown_obj(),
                        &format!("unknown member '{}' (only host and headers)", shown(k)),
                    ));
                }
                let Some(Value::String(host)) = o.get("host") else {
                    return Err(bad(
                        self.method,
                        &shown_obj(),
                        "'host' must be a pattern string",
                    ));
                };
                let headers = match o.get("headers") {
                    None => vec![],
                    Some(Value::Object(h)) => self.headers(host, h)?,
                    Some(_) => {
                        return Err(bad(self.method, host, "'headers' must be an object"));
                    }
                };
                if deny && !headers.is_empty() {
                    return Err(bad(self.method, host, "a deny entry has no headers"));
                }
                (host.as_str(), headers)
            }
            other => {
                let s: String = other.to_string().chars().take(200).collect();
                return Err(bad(
                    self.method,
                    &s,
                    "an entry is a pattern string or {host, headers}",
                ));
            }
        };
        if let Some(set_name) = pattern.strip_prefix('@') {
            if let Some(outer) = set {
                return Err(bad(
                    self.method,
                    pattern,
                    &format!("set '{outer}' names another set (sets hold patterns only)"),
                ));
            }
            if !headers.is_empty() {
                return Err(bad(
                    self.method,
                    pattern,
                    "a set takes no headers (put them in the set)",
                ));
            }
            let Some(items) = self.sets.get(set_name) else {
                let mut known = String::new();
                for (i, k) in self.sets.keys().take(20).enumerate() {
                    let _ = write!(known, "{}@{}", if i > 0 { ", " } else { "" }, shown(k));
                }
                let why = if known.is_empty() {
                    "no such set (the broker config defines none: [network.sets.NAME])".to_string()
                } else {
                    format!("no such set (defined: {known})")
                };
                return Err(bad(self.method, pattern, &why));
            };
            for it in items {
                self.entry(it, deny, Some(set_name), out)?;
            }
            return Ok(());
        }
        self.count += 1;
        if self.count > MAX_ENTRIES {
            return Err(bad_shape(
                self.method,
                &format!("more than {MAX_ENTRIES} entries (sets expanded)"),
            ));
        }
        let mut rule = self.pattern(pattern, deny)?;
        rule.headers = headers;
        if let Some(s) = set {
            rule.entry = format!("@{s}: {}", rule.entry);
        }
        out.push(rule);
        Ok(())
    }

    fn headers(
        &self,
        host: &str,
        h: &Map<String, Value>,
    ) -> Result<Vec<(String, String)>, AbxError> {
        if h.len() > MAX_HEADERS {
            return Err(bad(self.method, host, "more than 32 headers"));
        }
        let mut out = vec![];
        for (k, v) in h {
            let token = !k.is_empty()
                && k.len() <= 64
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !token {
                return Err(bad(
                    self.method,
                    host,
                    &format!("header name '{}' is not a token", shown(k)),
                ));
            }
            let lower = k.to_ascii_lowercase();
            if [
                "host",
                "connection",
                "content-length",
                "transfer-encoding",
                "proxy-authorization",
            ]
            .contains(&lower.as_str())
            {
                return Err(bad(
                    self.method,
                    host,
                    &format!("header '{k}' cannot be injected"),
                ));
            }
            let Some(key) = v.as_str().and_then(|s| s.strip_prefix("secret:")) else {
                return Err(bad(
                    self.method,
                    host,
                    &format!("header '{k}': the value is \"secret:KEY\" (a key of the broker's secret store)"),
                ));
            };
            let ok = !key.is_empty()
                && key.len() <= 128
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
            if !ok {
                return Err(bad(
                    self.method,
                    host,
                    &format!("header '{k}': the secret key is letters, digits, '_', '-', '.'"),
                ));
            }
            out.push((k.clone(), format!("secret:{key}")));
        }
        Ok(out)
    }

    fn pattern(&self, entry: &str, deny: bool) -> Result<Rule, AbxError> {
        let err = |why: &str| bad(self.method, entry, why);
        if entry.len() > name::MAX_NAME + 16 {
            return Err(err("longer than a host name can be (253 bytes)"));
        }
        // Split off the port: `[v6 or block]:port`, `host:port`; a bare IPv6 has no port.
        let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
            let Some((inner, after)) = rest.split_once(']') else {
                return Err(err("a '[' without its ']'"));
            };
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| err("after ']' comes :PORT"))?,
                ),
            };
            if !inner.contains(':') {
                return Err(err("brackets are for IPv6 addresses"));
            }
            (inner, port)
        } else if entry.matches(':').count() > 1 {
            (entry, None)
        } else {
            match entry.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (entry, None),
            }
        };
        let ports = match port {
            None if deny => Ports::Any,
            None => Ports::Web,
            Some("*") => Ports::Any,
            Some(p) => {
                let n = (!p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| p.parse::<u32>().ok())
                    .flatten()
                    .filter(|n| (1..=65535).contains(n))
                    .ok_or_else(|| err("a port is a number from 1 to 65535, or *"))?;
                let n = n as u16;
                if !deny && self.guard.broker_ports().contains(&n) {
                    return Err(err(&format!(
                        "port {n} is one of the broker's own ports, always refused"
                    )));
                }
                Ports::One(n)
            }
        };
        let looks_ip = host.contains(':')
            || host.contains('/')
            || host.parse::<IpAddr>().is_ok()
            || (!host.is_empty() && host.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
        let pattern = if looks_ip {
            let net = IpNet::parse(host).map_err(&err)?;
            if !deny {
                if let Some(why) = self.guard.refuses_net(&net) {
                    return Err(err(&refused_why(why)));
                }
            }
            Pattern::Net(net)
        } else if let Some(base) = host.strip_prefix("*.") {
            let base = name::normalize(base).map_err(&err)?;
            if !deny && name::is_localhost(&base) {
                return Err(err(&refused_why(Refused::Loopback)));
            }
            Pattern::Subdomains(base)
        } else if host.contains('*') {
            return Err(err("a wildcard is only '*.' at the start (*.example.com)"));
        } else {
            let h = name::normalize(host).map_err(&err)?;
            if !deny && name::is_localhost(&h) {
                return Err(err(&refused_why(Refused::Loopback)));
            }
            Pattern::Host(h)
        };
        Ok(Rule {
            pattern,
            ports,
            headers: vec![],
            entry: entry.to_string(),
        })
    }
}

fn refused_why(why: Refused) -> String {
    format!(
        "it can only name {}, which is always refused whatever the policy",
        why.describe()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use abx_protocol::ErrorCode;
    use serde_json::json;

    const M: &str = "sandbox/create";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn guard() -> Guard {
        Guard::new(vec![ip("192.0.2.7")], vec![7777])
    }

    fn sets() -> Sets {
        let mut s = Sets::new();
        s.insert(
            "pypi".into(),
            vec![json!("pypi.example"), json!("*.files.example")],
        );
        s.insert("nested".into(), vec![json!("@pypi")]);
        s
    }

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        Policy::from_patterns(M, allow, deny, &sets(), &guard()).unwrap()
    }

    fn refused(spec: Value) -> AbxError {
        Policy::parse(M, &spec, &sets(), &guard()).unwrap_err()
    }

    #[test]
    fn names_wildcards_and_ports_match_as_documented() {
        let p = policy(
            &[
                "Example.COM.",
                "*.wild.example",
                "api.example:8443",
                "any.example:*",
            ],
            &[],
        );
        let name = |h: &str, port| match p.check_name(h, port) {
            NameCheck::Resolve => matches!(
                p.check_addr(Some(h), port, ip("203.0.113.1")),
                Verdict::Allowed(_)
            ),
            _ => false,
        };
        for (h, port, want) in [
            ("example.com", 443, true),
            ("example.com", 80, true),
            ("example.com", 8080, false),
            ("www.example.com", 443, false),
            ("a.wild.example", 443, true),
            ("a.b.wild.example", 80, true),
            ("wild.example", 443, false),
            ("xwild.example", 443, false),
            ("api.example", 8443, true),
            ("api.example", 443, false),
            ("any.example", 22, true),
            ("any.example", 65535, true),
            ("other.example", 443, false),
        ] {
            assert_eq!(name(h, port), want, "{h}:{port}");
        }
        assert_eq!(p.check_name("other.example", 443), NameCheck::NotAllowed);
    }

    #[test]
    fn addresses_match_literals_and_what_names_resolve_to() {
        let p = policy(
            &["10.0.0.0/8", "[2001:db8::/32]:22", "198.51.100.7:8080"],
            &[],
        );
        for (host, port, addr, want) in [
            (None, 443, "10.1.2.3", true),
            (None, 80, "10.1.2.3", true),
            (None, 22, "10.1.2.3", false),
            (Some("internal.example"), 443, "10.9.9.9", true),
            (Some("internal.example"), 443, "11.9.9.9", false),
            (None, 22, "2001:db8::5", true),
            (None, 443, "2001:db8::5", false),
            (None, 8080, "198.51.100.7", true),
            (None, 8080, "::ffff:198.51.100.7", true),
            (None, 8081, "198.51.100.7", false),
        ] {
            let got = matches!(p.check_addr(host, port, ip(addr)), Verdict::Allowed(_));
            assert_eq!(got, want, "{host:?} {addr}:{port}");
        }
        // With an address entry for the port, any name is resolved (its address decides).
        assert_eq!(p.check_name("internal.example", 443), NameCheck::Resolve);
        assert_eq!(p.check_name("internal.example", 25), NameCheck::NotAllowed);
    }

    #[test]
    fn deny_wins_over_allow() {
        let p = policy(
            &["*.example.com", "10.0.0.0/8", "pinned.example:*"],
            &["bad.example.com", "10.6.6.0/24", "pinned.example:22"],
        );
        assert_eq!(
            p.check_name("bad.example.com", 443),
            NameCheck::Denied("bad.example.com".into())
        );
        assert_eq!(p.check_name("ok.example.com", 443), NameCheck::Resolve);
        // A deny entry without a port denies every port.
        assert_eq!(
            p.check_name("bad.example.com", 8080),
            NameCheck::Denied("bad.example.com".into())
        );
        assert_eq!(
            p.check_addr(Some("ok.example.com"), 443, ip("10.6.6.1")),
            Verdict::Denied("10.6.6.0/24".into())
        );
        assert_eq!(p.check_addr(None, 443, ip("10.6.7.1")), Verdict::Allowed(1));
        assert_eq!(
            p.check_name("pinned.example", 22),
            NameCheck::Denied("pinned.example:22".into())
        );
        assert_eq!(p.check_name("pinned.example", 23), NameCheck::Resolve);
    }

    #[test]
    fn sets_expand_and_are_named_in_entries() {
        let p = policy(&["@pypi"], &[]);
        assert_eq!(p.allowed().len(), 2);
        assert_eq!(p.allowed()[0].entry, "@pypi: pypi.example");
        assert_eq!(p.check_name("pypi.example", 443), NameCheck::Resolve);
        assert_eq!(p.check_name("x.files.example", 443), NameCheck::Resolve);
        let e = refused(json!({"allow": ["@nope"]}));
        assert!(
            e.message.contains("no such set (defined: @nested, @pypi)"),
            "{e}"
        );
        let e = refused(json!({"allow": ["@nested"]}));
        assert!(e.message.contains("names another set"), "{e}");
        let e = Policy::parse(M, &json!({"allow": ["@x"]}), &Sets::new(), &guard()).unwrap_err();
        assert!(e.message.contains("[network.sets.NAME]"), "{e}");
    }

    #[test]
    fn headers_are_kept_and_checked() {
        let p = Policy::parse(
            M,
            &json!({"allow": [{"host": "api.example", "headers": {"Authorization": "secret:api_token"}}]}),
            &sets(),
            &guard(),
        )
        .unwrap();
        assert_eq!(
            p.allowed()[0].headers,
            vec![("Authorization".to_string(), "secret:api_token".to_string())]
        );
        for bad in [
            json!({"allow": [{"host": "a.example", "headers": {"X": "plain"}}]}),
            json!({"allow": [{"host": "a.example", "headers": {"Bad Name": "secret:k"}}]}),
            json!({"allow": [{"host": "a.example", "headers": {"Host": "secret:k"}}]}),
            json!({"allow": [{"host": "a.example", "headers": {"X": "secret:"}}]}),
            json!({"allow": [{"host": "a.example", "headers": "x"}]}),
            json!({"allow": [{"host": "a.example", "other": 1}]}),
            json!({"allow": [{"headers": {}}]}),
            json!({"allow": [], "deny": [{"host": "a.example", "headers": {"X": "secret:k"}}]}),
        ] {
            let e = refused(bad.clone());
            assert_eq!(e.code, ErrorCode::InvalidParams, "{bad}");
        }
    }

    #[test]
    fn malformed_and_always_refused_entries_are_e1004_naming_the_entry() {
        for (entry, says) in [
            ("localhost", "the host's loopback"),
            ("LOCALHOST.", "the host's loopback"),
            ("db.localhost", "the host's loopback"),
            ("*.localhost", "the host's loopback"),
            ("127.0.0.1", "the host's loopback"),
            ("127.0.0.0/8", "the host's loopback"),
            ("::1", "the host's loopback"),
            ("[::1]:443", "the host's loopback"),
            ("::ffff:127.0.0.1", "the host's loopback"),
            ("169.254.169.254", "link-local"),
            ("169.254.0.0/16", "link-local"),
            ("fe80::/10", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("::", "unspecified"),
            ("224.0.0.1", "multicast"),
            ("192.0.2.7", "host's own interfaces"),
            ("example.com:7777", "broker's own ports"),
            ("example.com:0", "a port is a number"),
            ("example.com:65536", "a port is a number"),
            ("example.com:", "a port is a number"),
            ("example.com:8o", "a port is a number"),
            ("exa*mple.com", "wildcard"),
            ("*example.com", "wildcard"),
            ("*.*.example.com", "a character other than"),
            ("ex ample.com", "a character other than"),
            ("bücher.example", "punycode"),
            ("a..example", "empty label"),
            ("", "empty host name"),
            ("1.2.3", "not an IP address"),
            ("10.0.0.0/33", "prefix length"),
            ("[10.0.0.1]", "brackets are for IPv6"),
            ("[::1", "without its ']'"),
        ] {
            let e = refused(json!({"allow": [entry]}));
            assert_eq!(e.code, ErrorCode::InvalidParams, "{entry}");
            assert!(e.message.contains(&format!("'{entry}'")), "{entry}: {e}");
            assert!(e.message.contains(says), "{entry}: {e}");
            assert_eq!(e.data.get("entry"), Some(&json!(entry)), "{entry}");
            assert!(e.suggestion.contains("*.example.com"), "{entry}");
        }
        let long = format!(
            "{}.example",
            [
                "a".repeat(63),
                "b".repeat(63),
                "c".repeat(63),
                "d".repeat(60)
            ]
            .join(".")
        );
        assert!(refused(json!({"allow": [long]})).message.contains("253"));
        // A block that only partly covers refused addresses is allowed (the guard refuses the
        // rest at connect time); so are private and documentation ranges.
        for ok in [
            "0.0.0.0/0",
            "::/0",
            "127.0.0.0/7",
            "10.0.0.0/8",
            "192.168.1.1",
            "fd00::/8",
            "2001:db8::1",
            "192.0.2.8",
        ] {
            assert!(
                Policy::from_patterns(M, &[ok], &[], &sets(), &guard()).is_ok(),
                "{ok}"
            );
        }
        // Deny may name anything.
        assert!(Policy::from_patterns(
            M,
            &[],
            &["localhost", "127.0.0.1", "x.example:7777"],
            &sets(),
            &guard()
        )
        .is_ok());
    }

    #[test]
    fn shapes_and_bounds() {
        for bad in [
            json!("internet"),
            json!([]),
            json!({}),
            json!({"allow": "example.com"}),
            json!({"allow": [], "deny": "x"}),
            json!({"allow": [], "extra": []}),
            json!({"allow": [1]}),
            json!({"allow": [null]}),
        ] {
            assert_eq!(refused(bad.clone()).code, ErrorCode::InvalidParams, "{bad}");
        }
        let many: Vec<String> = (0..MAX_ENTRIES).map(|i| format!("h{i}.example")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(Policy::from_patterns(M, &refs, &[], &sets(), &guard()).is_ok());
        let e = Policy::from_patterns(M, &refs, &["x.example"], &sets(), &guard()).unwrap_err();
        assert!(e.message.contains("more than 1024"), "{e}");
        let e = Policy::from_patterns("sandbox/setNetwork", &["bad entry"], &[], &sets(), &guard())
            .unwrap_err();
        assert!(e.message.contains("sandbox/setNetwork"), "{e}");
        let spec = json!({"allow": ["a.example"], "deny": []});
        assert_eq!(
            Policy::parse(M, &spec, &sets(), &guard()).unwrap().spec(),
            &spec
        );
    }
}
