//! Addresses: CIDR blocks, and the addresses no policy can open ([`Guard`]: the host's
//! loopback, link-local, unspecified and non-unicast addresses, the host's own interfaces and
//! the broker's own ports). Std only (the fuzz crate compiles this file in).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// An IPv4 or IPv6 block (`10.0.0.0/8`, `2001:db8::/32`; a single address is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

/// `::ffff:a.b.c.d` as the IPv4 address it is; anything else as it is.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

fn mask(width: u8, prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        let all = if width == 32 {
            u128::from(u32::MAX)
        } else {
            u128::MAX
        };
        (all << (width - prefix)) & all
    }
}

impl IpNet {
    /// A block; the address's host bits are cleared. `None` past the family's width.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<IpNet> {
        let mut addr = addr;
        let mut prefix = prefix;
        if let IpAddr::V6(v6) = addr {
            if let Some(v4) = v6.to_ipv4_mapped() {
                if prefix < 96 {
                    // Wider than the mapped block: keep it IPv6 (it holds more than IPv4).
                } else {
                    addr = IpAddr::V4(v4);
                    prefix -= 96;
                }
            }
        }
        let (b, width) = bits(addr);
        if prefix > width {
            return None;
        }
        let b = b & mask(width, prefix);
        let addr = match addr {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(b as u32)),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(b)),
        };
        Some(IpNet { addr, prefix })
    }

    /// `a.b.c.d`, `a.b.c.d/n`, an IPv6 address, `v6/n`. `Err` says why not.
    pub fn parse(s: &str) -> Result<IpNet, &'static str> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| "not an IP address")?;
        let width = bits(addr).1;
        let prefix = match p {
            None => width,
            Some(p) => {
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("a prefix length is a number after '/'");
                }
                p.parse::<u8>()
                    .map_err(|_| "a prefix length out of range")?
            }
        };
        IpNet::new(addr, prefix).ok_or("a prefix length longer than the address")
    }

    /// The first address of the block.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in the block (a mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        let (a, wa) = bits(self.addr);
        let (b, wb) = bits(ip);
        wa == wb && (b & mask(wa, self.prefix)) == a
    }

    /// Whether every address of `self` is in `outer`.
    pub fn within(&self, outer: &IpNet) -> bool {
        outer.prefix <= self.prefix && outer.contains(self.addr)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Why an address or port is always refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refused {
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// 169.254.0.0/16, fe80::/10 (cloud metadata services live here).
    LinkLocal,
    /// 0.0.0.0/8, :: (a connect to them reaches the host itself).
    Unspecified,
    /// Multicast, broadcast: never a TCP peer.
    NotUnicast,
    /// An address of one of the host's own interfaces (services bound to 0.0.0.0 answer there).
    HostAddress,
    /// One of the broker's own ports.
    BrokerPort,
}

impl Refused {
    /// In words, for the 403 and for E1004.
    pub fn describe(self) -> &'static str {
        match self {
            Refused::Loopback => "the host's loopback",
            Refused::LinkLocal => "a link-local address",
            Refused::Unspecified => "the unspecified address (the host itself)",
            Refused::NotUnicast => "a multicast or broadcast address",
            Refused::HostAddress => "an address of the host's own interfaces",
            Refused::BrokerPort => "one of the broker's own ports",
        }
    }
}

/// The blocks refused whatever the policy, with why.
fn intrinsic() -> [(IpNet, Refused); 9] {
    let v4 = |a: [u8; 4], p| IpNet::new(IpAddr::V4(Ipv4Addr::from(a)), p).expect("valid");
    let v6 = |a: Ipv6Addr, p| IpNet::new(IpAddr::V6(a), p).expect("valid");
    [
        (v4([127, 0, 0, 0], 8), Refused::Loopback),
        (v4([169, 254, 0, 0], 16), Refused::LinkLocal),
        (v4([0, 0, 0, 0], 8), Refused::Unspecified),
        (v4([224, 0, 0, 0], 4), Refused::NotUnicast),
        (v4([255, 255, 255, 255], 32), Refused::NotUnicast),
        (v6(Ipv6Addr::LOCALHOST, 128), Refused::Loopback),
        (v6(Ipv6Addr::UNSPECIFIED, 128), Refused::Unspecified),
        (
            v6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
            Refused::LinkLocal,
        ),
        (
            v6(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
            Refused::NotUnicast,
        ),
    ]
}

/// The addresses and ports no policy opens, for one broker: the intrinsic blocks above, the
/// host's own interface addresses ([`crate::ifaddrs::host_addresses`]) and the broker's own
/// ports (refused on every address: the proxy's own listener among them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Guard {
    host_addrs: Vec<IpAddr>,
    broker_ports: Vec<u16>,
    test_upstreams: Vec<IpAddr>,
}

impl Guard {
    /// A guard refusing the intrinsic blocks, `host_addrs` and `broker_ports`.
    pub fn new(host_addrs: Vec<IpAddr>, broker_ports: Vec<u16>) -> Guard {
        Guard {
            host_addrs: host_addrs.into_iter().map(canonical).collect(),
            broker_ports,
            test_upstreams: vec![],
        }
    }

    /// **Tests and benches only** (the daemon never calls it): let these loopback addresses
    /// through, where the tests' upstream servers listen. Each must be in 127.0.0.0/8 and not
    /// 127.0.0.1, which stays refused (the DNS rebinding tests point names at it); anything
    /// else is an `Err` naming it.
    pub fn allow_loopback_for_tests(mut self, addrs: &[IpAddr]) -> Result<Guard, String> {
        for &a in addrs {
            let a = canonical(a);
            let ok = matches!(a, IpAddr::V4(v4) if v4.is_loopback() && v4 != Ipv4Addr::LOCALHOST);
            if !ok {
                return Err(format!(
                    "{a} cannot be a test upstream: only 127.0.0.2 to 127.255.255.254"
                ));
            }
            self.test_upstreams.push(a);
        }
        Ok(self)
    }

    /// The host's addresses this guard refuses.
    pub fn host_addresses(&self) -> &[IpAddr] {
        &self.host_addrs
    }

    /// The broker's ports this guard refuses.
    pub fn broker_ports(&self) -> &[u16] {
        &self.broker_ports
    }

    /// Whether `ip` is refused whatever the policy, and why.
    pub fn refuses_ip(&self, ip: IpAddr) -> Option<Refused> {
        let ip = canonical(ip);
        if self.test_upstreams.contains(&ip) {
            return None;
        }
        if let Some((_, why)) = intrinsic().iter().find(|(n, _)| n.contains(ip)) {
            return Some(*why);
        }
        if self.host_addrs.contains(&ip) {
            return Some(Refused::HostAddress);
        }
        None
    }

    /// Whether a connection to `to` is refused whatever the policy, and why.
    pub fn refuses(&self, to: SocketAddr) -> Option<Refused> {
        if let Some(why) = self.refuses_ip(to.ip()) {
            return Some(why);
        }
        if self.broker_ports.contains(&to.port()) {
            return Some(Refused::BrokerPort);
        }
        None
    }

    /// Whether every address of `net` is refused (an entry that can name nothing else), and why.
    pub fn refuses_net(&self, net: &IpNet) -> Option<Refused> {
        if self.test_upstreams.iter().any(|&a| net.contains(a)) {
            return None;
        }
        if let Some((_, why)) = intrinsic().iter().find(|(n, _)| net.within(n)) {
            return Some(*why);
        }
        let single = net.prefix() == bits(net.addr()).1;
        if single && self.host_addrs.contains(&net.addr()) {
            return Some(Refused::HostAddress);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_parse_and_contain() {
        let n = IpNet::parse("10.1.2.3/8").unwrap();
        assert_eq!(n.to_string(), "10.0.0.0/8");
        assert!(n.contains(ip("10.255.0.1")));
        assert!(n.contains(ip("::ffff:10.0.0.1")));
        assert!(!n.contains(ip("11.0.0.1")));
        assert!(!n.contains(ip("::a00:1")));
        let all = IpNet::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("1.2.3.4")));
        assert!(!all.contains(ip("2001:db8::1")));
        let v6 = IpNet::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        assert_eq!(
            IpNet::parse("::ffff:127.0.0.1").unwrap(),
            IpNet::parse("127.0.0.1").unwrap()
        );
        assert_eq!(IpNet::parse("::/0").unwrap().prefix(), 0);
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "x",
            "10.0.0.0/1234",
        ] {
            assert!(IpNet::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_guard_refuses_what_no_policy_opens() {
        let g = Guard::new(vec![ip("192.0.2.7"), ip("2001:db8::7")], vec![7777]);
        for (a, want) in [
            ("127.0.0.1", Some(Refused::Loopback)),
            ("127.9.9.9", Some(Refused::Loopback)),
            ("::1", Some(Refused::Loopback)),
            ("::ffff:127.0.0.1", Some(Refused::Loopback)),
            ("169.254.169.254", Some(Refused::LinkLocal)),
            ("fe80::1", Some(Refused::LinkLocal)),
            ("0.0.0.0", Some(Refused::Unspecified)),
            ("::", Some(Refused::Unspecified)),
            ("224.0.0.1", Some(Refused::NotUnicast)),
            ("255.255.255.255", Some(Refused::NotUnicast)),
            ("ff02::1", Some(Refused::NotUnicast)),
            ("192.0.2.7", Some(Refused::HostAddress)),
            ("::ffff:192.0.2.7", Some(Refused::HostAddress)),
            ("2001:db8::7", Some(Refused::HostAddress)),
            ("192.0.2.8", None),
            ("10.0.0.1", None),
            ("fd00::1", None),
        ] {
            assert_eq!(g.refuses_ip(ip(a)), want, "{a}");
        }
        assert_eq!(
            g.refuses("192.0.2.8:7777".parse().unwrap()),
            Some(Refused::BrokerPort)
        );
        assert_eq!(g.refuses("192.0.2.8:443".parse().unwrap()), None);
        for (n, want) in [
            ("127.0.0.0/8", Some(Refused::Loopback)),
            ("127.0.0.1", Some(Refused::Loopback)),
            ("127.0.0.0/7", None),
            ("169.254.169.254", Some(Refused::LinkLocal)),
            ("fe80::/64", Some(Refused::LinkLocal)),
            ("0.0.0.0/0", None),
            ("::/0", None),
            ("192.0.2.7", Some(Refused::HostAddress)),
            ("192.0.2.0/24", None),
        ] {
            assert_eq!(g.refuses_net(&IpNet::parse(n).unwrap()), want, "{n}");
        }
    }

    #[test]
    fn test_upstreams_are_loopback_other_than_127_0_0_1() {
        let g = Guard::default()
            .allow_loopback_for_tests(&[ip("127.0.0.2")])
            .unwrap();
        assert_eq!(g.refuses_ip(ip("127.0.0.2")), None);
        assert_eq!(g.refuses_ip(ip("127.0.0.1")), Some(Refused::Loopback));
        assert_eq!(g.refuses_net(&IpNet::parse("127.0.0.2").unwrap()), None);
        for bad in ["127.0.0.1", "10.0.0.1", "::1"] {
            assert!(Guard::default()
                .allow_loopback_for_tests(&[ip(bad)])
                .is_err());
        }
    }
}
