//! The egress proxy's parsers, compiled in as they are (`broker/egress/src/`: std, serde_json
//! and abx-protocol only), and the bodies of the `egress_sni` and `egress_policy` targets.

#[path = "../../broker/egress/src/name.rs"]
pub mod name;
#[path = "../../broker/egress/src/net.rs"]
pub mod net;
#[path = "../../broker/egress/src/policy.rs"]
pub mod policy;
#[path = "../../broker/egress/src/sni.rs"]
pub mod sni;

use abx_protocol::ErrorCode;
use net::{Guard, IpNet};
use policy::{NameCheck, Pattern, Policy, Sets, Verdict};
use serde_json::{json, Value};
use sni::Hello;
use std::net::IpAddr;

fn check_hello(h: &Hello) {
    if let Hello::Complete { sni: Some(s) } = h {
        assert!(
            s.len() <= name::MAX_NAME,
            "a server name of {} bytes",
            s.len()
        );
        assert_eq!(
            name::normalize(s).as_deref(),
            Ok(s.as_str()),
            "a server name not normalized"
        );
    }
}

/// `egress_sni`: the bytes as the first bytes of a CONNECT tunnel, and (first byte: the record
/// size) as one handshake message cut into records. No panic; a server name is a normalized
/// host name; every prefix reads as "incomplete" or as the whole does (the result depends only
/// on the bytes read, so reading more never changes a decision).
pub fn egress_sni(data: &[u8]) {
    let data = &data[..data.len().min(sni::MAX_READ)];
    let whole = sni::parse(data);
    check_hello(&whole);
    let step = (data.len() / 8).max(1);
    for cut in (0..data.len()).step_by(step) {
        let p = sni::parse(&data[..cut]);
        assert!(
            p == Hello::Incomplete || p == whole,
            "the prefix of {cut} bytes reads {p:?}, the whole {whole:?}"
        );
    }
    if let Some((&first, msg)) = data.split_first() {
        let chunk = usize::from(first).max(1) * 64;
        let mut rec = vec![];
        for c in msg.chunks(chunk) {
            rec.extend_from_slice(&[22, 3, 1]);
            rec.extend_from_slice(&(c.len() as u16).to_be_bytes());
            rec.extend_from_slice(c);
        }
        rec.truncate(sni::MAX_READ);
        check_hello(&sni::parse(&rec));
    }
}

fn guard() -> Guard {
    Guard::new(
        vec![
            "192.0.2.7".parse().expect("ip"),
            "2001:db8::7".parse().expect("ip"),
        ],
        vec![7777],
    )
}

fn sets() -> Sets {
    let mut s = Sets::new();
    s.insert(
        "reg".into(),
        vec![json!("reg.example"), json!("*.cdn.example:8443")],
    );
    s.insert("bad".into(), vec![json!("@reg")]);
    s
}

/// `egress_policy`: the bytes as a policy object when they are JSON, else as lines of
/// patterns (a line starting with `!` goes to `deny`). No panic; a refusal is E1004 with the
/// entry (at most 256 characters, escaped); a parsed policy holds at most 1024 entries, names
/// normalized, no `allow` entry naming only what the guard refuses; matching never lets the
/// guard's addresses through (they are the guard's to refuse, checked apart).
pub fn egress_policy(data: &[u8]) {
    let spec: Value = match serde_json::from_slice::<Value>(data) {
        Ok(v) => v,
        Err(_) => {
            let text = String::from_utf8_lossy(data);
            let (mut allow, mut deny) = (vec![], vec![]);
            for line in text.lines().take(2000) {
                match line.strip_prefix('!') {
                    Some(d) => deny.push(Value::from(d)),
                    None => allow.push(Value::from(line)),
                }
            }
            json!({"allow": allow, "deny": deny})
        }
    };
    let g = guard();
    match Policy::parse("sandbox/create", &spec, &sets(), &g) {
        Err(e) => {
            assert_eq!(e.code, ErrorCode::InvalidParams, "{e}");
            assert!(e.message.contains("network"), "{e}");
            if let Some(entry) = e.data.get("entry") {
                let s = entry.as_str().expect("entry is a string");
                assert!(
                    s.chars().count() <= 256 * 10 + 3,
                    "entry shown whole: {}",
                    s.len()
                );
                assert!(
                    !s.chars().any(|c| c.is_control()),
                    "control characters shown"
                );
            }
            let _ = serde_json::to_string(&e.to_rpc()).expect("error serializes");
        }
        Ok(p) => {
            assert!(p.allowed().len() + p.denied().len() <= policy::MAX_ENTRIES);
            for r in p.allowed().iter().chain(p.denied()) {
                match &r.pattern {
                    Pattern::Host(h) | Pattern::Subdomains(h) => {
                        assert_eq!(name::normalize(h).as_deref(), Ok(h.as_str()), "{h}");
                    }
                    Pattern::Net(_) => {}
                }
            }
            for r in p.allowed() {
                if let Pattern::Net(n) = &r.pattern {
                    assert!(
                        g.refuses_net(n).is_none(),
                        "allowed {n}, which the guard refuses whole"
                    );
                }
            }
            let probes: [IpAddr; 4] = [
                "127.0.0.1".parse().expect("ip"),
                "169.254.169.254".parse().expect("ip"),
                "10.1.2.3".parse().expect("ip"),
                "2001:db8::1".parse().expect("ip"),
            ];
            for r in p.allowed().iter().take(64) {
                let host = match &r.pattern {
                    Pattern::Host(h) => h.clone(),
                    Pattern::Subdomains(s) => format!("x.{s}"),
                    Pattern::Net(n) => n.addr().to_string(),
                };
                for port in [80, 443, 22] {
                    if let NameCheck::Denied(e) = p.check_name(&host, port) {
                        assert!(!e.is_empty());
                    }
                    for ip in probes {
                        let v = p.check_addr(Some(&host), port, ip);
                        if let Verdict::Allowed(i) = v {
                            assert!(i < p.allowed().len());
                        }
                        let _ = g.refuses(std::net::SocketAddr::new(ip, port));
                    }
                }
            }
            let _ = IpNet::parse("10.0.0.0/8");
        }
    }
}
