//! Address helpers shared by [`PeerIp`](super::PeerIp) and [`ClientIp`](super::ClientIp): IPv6
//! prefix grouping, CIDR ranges, and the peer address from request extensions.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use http::Extensions;

use super::KeyError;
use crate::error::ConfigError;

/// The IPv6 prefix length addresses are grouped by unless configured: one host (a home router, a
/// cloud VM) is routinely handed a whole `/64`, so counting single IPv6 addresses would let it
/// rotate through 2^64 keys.
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Validates an IPv6 grouping prefix length for the extractor configuration `field`.
pub(crate) fn check_ipv6_prefix(field: &'static str, prefix: u8) -> Result<u8, ConfigError> {
    if (1..=128).contains(&prefix) {
        Ok(prefix)
    } else {
        Err(ConfigError::new(
            field,
            format!(
                "IPv6 prefix length {prefix} is out of range: use 1..=128 (64 groups a host's \
                 /64, 128 keeps single addresses)"
            ),
        ))
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`, what a dual-stack socket reports for an IPv4
/// client) as the IPv4 address it is; anything else unchanged.
#[inline]
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// `ip` as a key: IPv4 unchanged, IPv6 masked to its first `v6_prefix` bits. Expects a
/// [`canonical`] address.
#[inline]
pub(crate) fn group(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(v6_prefix))),
    }
}

#[inline]
fn mask128(prefix: u8) -> u128 {
    match prefix {
        0 => 0,
        p if p >= 128 => u128::MAX,
        p => u128::MAX << (128 - u32::from(p)),
    }
}

#[inline]
fn mask32(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p if p >= 32 => u32::MAX,
        p => u32::MAX << (32 - u32::from(p)),
    }
}

/// The TCP peer address of a request: axum's `ConnectInfo<SocketAddr>` (feature `axum`) or a
/// plain `SocketAddr` extension, as a [`canonical`] address.
pub(crate) fn peer_ip(extensions: &Extensions) -> Result<IpAddr, KeyError> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Ok(canonical(info.0.ip()));
    }
    match extensions.get::<SocketAddr>() {
        Some(addr) => Ok(canonical(addr.ip())),
        None => Err(KeyError::misconfigured(NO_PEER)),
    }
}

#[cfg(feature = "axum")]
const NO_PEER: &str = "no peer address in the request: serve the axum app with \
    `into_make_service_with_connect_info::<SocketAddr>()`, or insert the connection's \
    `SocketAddr` into the request extensions";
#[cfg(not(feature = "axum"))]
const NO_PEER: &str = "no peer address in the request: insert the connection's `SocketAddr` \
    into the request extensions (with axum, enable tollgate's `axum` feature to read \
    `ConnectInfo<SocketAddr>`)";

/// A range of addresses, `10.0.0.0/8` or `2001:db8::/32`, used to say which proxies are trusted.
///
/// Parsed from `ADDR/LEN` or a bare address (a single host: `/32` or `/128`). Parsing is strict,
/// because a typo here decides whose headers are believed:
///
/// - the address must be the start of its range: `10.1.2.3/8` is an error (did you mean
///   `10.0.0.0/8`, or the single host `10.1.2.3/32`?);
/// - a prefix length of `0` (every address) is an error: trusting every peer would let any client
///   choose its own key by sending a forwarding header.
///
/// IPv4-mapped IPv6 ranges (`::ffff:10.0.0.0/104`) are stored as the IPv4 range they denote,
/// since addresses are compared in their canonical form.
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::key::Cidr;
///
/// let net: Cidr = "10.0.0.0/8".parse().unwrap();
/// assert!(net.contains("10.200.3.4".parse::<IpAddr>().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse::<IpAddr>().unwrap()));
///
/// let err = "10.1.2.3/8".parse::<Cidr>().unwrap_err();
/// assert!(err.message().contains("10.0.0.0/8"), "{err}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The first address of the range.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length in bits.
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` lies in this range. IPv4-mapped IPv6 addresses count as their IPv4 address.
    #[inline]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                u32::from(ip) & mask32(self.prefix) == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                u128::from(ip) & mask128(self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }

    /// Parses `text`, naming `field` in the error.
    pub(crate) fn parse_for(field: &'static str, text: &str) -> Result<Self, ConfigError> {
        let invalid = |why: &str| {
            ConfigError::new(
                field,
                format!(
                    "`{text}` is not a valid CIDR range ({why}): write it like `10.0.0.0/8`, \
                     `2001:db8::/32`, or a single address like `192.0.2.7`"
                ),
            )
        };
        let trimmed = text.trim();
        let (addr_text, prefix_text) = match trimmed.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (trimmed, None),
        };
        let addr: IpAddr = addr_text
            .parse()
            .map_err(|_| invalid("the address does not parse"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix_text {
            None => max,
            Some(p) => {
                // `u8::from_str` accepts a leading '+'; a prefix is plain digits.
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(invalid("the prefix length is not a number"));
                }
                let n: u8 = p
                    .parse()
                    .map_err(|_| invalid("the prefix length is not a number"))?;
                if n > max {
                    return Err(invalid(if max == 32 {
                        "an IPv4 prefix length is at most 32"
                    } else {
                        "an IPv6 prefix length is at most 128"
                    }));
                }
                n
            }
        };
        if prefix == 0 {
            return Err(ConfigError::new(
                field,
                format!(
                    "`{text}` trusts every address, which would let any client choose its own key \
                     by sending a forwarding header: list only your proxies' ranges"
                ),
            ));
        }
        let network = match addr {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask32(prefix))),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(prefix))),
        };
        if network != addr {
            return Err(ConfigError::new(
                field,
                format!(
                    "`{text}` has bits set after its /{prefix} prefix: write the range as \
                     `{network}/{prefix}`, or the single host as `{addr}/{max}`"
                ),
            ));
        }
        // An IPv4-mapped range compares against canonical (IPv4) addresses.
        if let IpAddr::V6(v6) = network {
            if prefix >= 96 {
                if let Some(v4) = v6.to_ipv4_mapped() {
                    return Self {
                        addr: IpAddr::V4(v4),
                        prefix: prefix - 96,
                    }
                    .nonzero_or(field, text);
                }
            }
        }
        Ok(Self {
            addr: network,
            prefix,
        })
    }

    fn nonzero_or(self, field: &'static str, text: &str) -> Result<Self, ConfigError> {
        if self.prefix == 0 {
            Err(ConfigError::new(
                field,
                format!(
                    "`{text}` trusts every IPv4 address, which would let any client choose its \
                     own key by sending a forwarding header: list only your proxies' ranges"
                ),
            ))
        } else {
            Ok(self)
        }
    }
}

impl FromStr for Cidr {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_for("cidr", s)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn canonical_unmaps_ipv4_mapped_only() {
        assert_eq!(canonical(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
        // The deprecated IPv4-compatible form and loopback stay IPv6.
        assert_eq!(canonical(ip("::1")), ip("::1"));
        assert_eq!(canonical(ip("::192.0.2.1")), ip("::192.0.2.1"));
        assert_eq!(canonical(ip("2001:db8::1")), ip("2001:db8::1"));
    }

    #[test]
    fn group_masks_ipv6_only() {
        assert_eq!(group(ip("203.0.113.9"), 64), ip("203.0.113.9"));
        assert_eq!(group(ip("2001:db8:1:2:3:4:5:6"), 64), ip("2001:db8:1:2::"));
        assert_eq!(group(ip("2001:db8:1:2:3:4:5:6"), 48), ip("2001:db8:1::"));
        assert_eq!(
            group(ip("2001:db8:1:2:3:4:5:6"), 128),
            ip("2001:db8:1:2:3:4:5:6")
        );
        assert_eq!(group(ip("ffff::1"), 1), ip("8000::"));
    }

    #[test]
    fn prefix_range_is_checked() {
        assert!(check_ipv6_prefix("f", 0).is_err());
        assert!(check_ipv6_prefix("f", 129).is_err());
        assert_eq!(check_ipv6_prefix("f", 1), Ok(1));
        assert_eq!(check_ipv6_prefix("f", 128), Ok(128));
        let err = check_ipv6_prefix("key.ipv6_prefix", 200).unwrap_err();
        assert_eq!(err.field(), "key.ipv6_prefix");
        assert!(err.message().contains("1..=128"), "{err}");
    }

    #[test]
    fn cidr_parses_and_matches() {
        let net: Cidr = "10.0.0.0/8".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains(ip("10.0.0.0")));
        assert!(net.contains(ip("10.255.255.255")));
        assert!(net.contains(ip("::ffff:10.1.1.1")));
        assert!(!net.contains(ip("11.0.0.0")));
        assert!(!net.contains(ip("9.255.255.255")));
        assert!(!net.contains(ip("::a00:1")));

        let host: Cidr = "192.0.2.7".parse().unwrap();
        assert_eq!(host.prefix_len(), 32);
        assert!(host.contains(ip("192.0.2.7")));
        assert!(!host.contains(ip("192.0.2.8")));

        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        assert!(!v6.contains(ip("32.1.13.184")));

        let lo: Cidr = " ::1/128 ".parse().unwrap();
        assert!(lo.contains(ip("::1")));
        assert!(!lo.contains(ip("::2")));

        let odd: Cidr = "172.16.0.0/12".parse().unwrap();
        assert!(odd.contains(ip("172.31.255.255")));
        assert!(!odd.contains(ip("172.32.0.0")));
    }

    #[test]
    fn ipv4_mapped_ranges_become_ipv4() {
        let net: Cidr = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(net.to_string(), "10.0.0.0/8");
        assert!(net.contains(ip("10.9.9.9")));
        assert!(net.contains(ip("::ffff:10.9.9.9")));
        assert!("::ffff:0.0.0.0/96".parse::<Cidr>().is_err());
    }

    #[test]
    fn cidr_rejects_garbage_with_the_text() {
        for bad in [
            "",
            "/",
            "10.0.0.0/",
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "10.0.0.0/08x",
            "10.0.0.0/8/8",
            "nonsense",
            "[::1]/128",
            "10.0.0.0/1000",
            "fe80::1%eth0/64",
        ] {
            let err = Cidr::parse_for("key.trusted_proxies", bad).unwrap_err();
            assert_eq!(err.field(), "key.trusted_proxies");
            assert!(err.message().contains(&format!("`{bad}`")), "{err}");
        }
    }

    #[test]
    fn cidr_rejects_host_bits_and_trust_everything() {
        let err = "10.1.2.3/8".parse::<Cidr>().unwrap_err();
        assert!(err.message().contains("10.0.0.0/8"), "{err}");
        assert!(err.message().contains("10.1.2.3/32"), "{err}");
        let err = "2001:db8::1/64".parse::<Cidr>().unwrap_err();
        assert!(err.message().contains("2001:db8::/64"), "{err}");
        for all in ["0.0.0.0/0", "::/0"] {
            let err = all.parse::<Cidr>().unwrap_err();
            assert!(err.message().contains("every"), "{err}");
        }
    }
}
