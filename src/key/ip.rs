//! Address helpers shared by [`PeerIp`](super::PeerIp) and [`ClientIp`](super::ClientIp): IPv6
//! prefix grouping, CIDR ranges, and the peer address from request extensions.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use super::KeyError;
use crate::error::ConfigError;
use crate::request::RequestView;

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

/// The well-known NAT64 prefix `64:ff9b::/96` (RFC 6052), as the top 96 bits of a `u128`.
const NAT64_WELL_KNOWN: u128 = 0x0064_ff9b_u128 << 96;

/// The IPv4 address an IPv6 address carries in its last 32 bits, for the prefixes that
/// mean "this is an IPv4 host":
///
/// - IPv4-mapped `::ffff:0:0/96` (`::ffff:192.0.2.1`, what a dual-stack socket reports);
/// - IPv4-compatible `::/96` (`::192.0.2.1`, deprecated but still parsed), except `::` and `::1`;
/// - the well-known NAT64 prefix `64:ff9b::/96` (`64:ff9b::192.0.2.1`, RFC 6052), so that in
///   an IPv6-only network behind a NAT64 each IPv4 client keeps its own key instead of all of
///   them sharing the `64:ff9b::/64` group.
///
/// The local-use NAT64 prefix `64:ff9b:1::/48` (RFC 8215) is not mapped: its operator chooses
/// the prefix length, which decides where the IPv4 bits sit, so they cannot be read reliably.
fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(v6);
    let v4 = Ipv4Addr::from(bits as u32);
    match bits >> 32 {
        0xffff => Some(v4),
        0 if bits > 1 => Some(v4),
        prefix if prefix << 32 == NAT64_WELL_KNOWN => Some(v4),
        _ => None,
    }
}

/// An IPv6 address that embeds an IPv4 host (see [`embedded_ipv4`]: mapped, compatible and
/// well-known NAT64) as that IPv4 address; anything else unchanged.
#[inline]
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match embedded_ipv4(v6) {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The 6to4 prefix `2002::/16` (RFC 3056), as the top 16 bits of a `u128`.
const SIX_TO_FOUR: u128 = 0x2002_u128 << 112;
/// The Teredo prefix `2001::/32` (RFC 4380), as the top 32 bits of a `u128`.
const TEREDO: u128 = 0x2001_0000_u128 << 96;

/// The IPv4 host behind a tunnelled IPv6 address, whose prefix names the IPv4 host that owns
/// the whole address block:
///
/// - 6to4 `2002::/16` (RFC 3056): `2002:AABB:CCDD::/48` is the site of the IPv4 host
///   `AA.BB.CC.DD`, and every address in it (2^80 of them) belongs to that host;
/// - Teredo `2001::/32` (RFC 4380): the client's public IPv4 address is the last 32 bits,
///   inverted (`2001:0:SERVER:FLAGS:PORT:CLIENT`, with `PORT` and `CLIENT` bit-flipped).
///
/// Used for keys only ([`group`]): trusted-proxy ranges ([`Cidr::contains`]) match these
/// addresses as the IPv6 addresses they are, since a tunnel's embedded address does not say
/// the packet came from that IPv4 host.
fn tunnelled_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(v6);
    if bits >> 112 == SIX_TO_FOUR >> 112 {
        return Some(Ipv4Addr::from((bits >> 80) as u32));
    }
    if bits >> 96 == TEREDO >> 96 {
        return Some(Ipv4Addr::from(!(bits as u32)));
    }
    None
}

/// `ip` as a key: IPv4 unchanged; a 6to4 or Teredo address as the IPv4 host it tunnels (see
/// [`tunnelled_ipv4`]), so that one IPv4 host gets one key rather than one per `/v6_prefix`
/// of its 2^80 (6to4) addresses; any other IPv6 address masked to its first `v6_prefix` bits.
/// Expects a [`canonical`] address.
#[inline]
pub(crate) fn group(ip: IpAddr, v6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match tunnelled_ipv4(v6) {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask128(v6_prefix))),
        },
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

/// Which extractor reads the peer address, for the wording of the reason when there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerFor {
    /// [`PeerIp`](super::PeerIp): the peer is the key.
    PeerIp = 0,
    /// [`ClientIp`](super::ClientIp): the peer decides whether forwarding headers are trusted.
    ClientIp = 1,
}

/// The TCP peer address of a request, as a [`canonical`] address, from the first of:
///
/// - axum's `ConnectInfo<SocketAddr>` (feature `axum`);
/// - tonic's `TcpConnectInfo` (feature `tonic`), which tonic's `Server` records for TCP
///   connections;
/// - a plain `SocketAddr` extension (what a hyper server inserts itself).
///
/// Without any, a [misconfiguration](KeyError::is_misconfiguration) whose reason names the fix
/// for the framework the request came through.
pub(crate) fn peer_ip(req: &RequestView<'_>, by: PeerFor) -> Result<IpAddr, KeyError> {
    let extensions = req.extensions();
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Ok(canonical(info.0.ip()));
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
    {
        return Ok(canonical(addr.ip()));
    }
    match extensions.get::<SocketAddr>() {
        Some(addr) => Ok(canonical(addr.ip())),
        None => Err(KeyError::misconfigured(no_peer_reason(req, by))),
    }
}

/// Why there is no peer address, and the fix for the framework `req` came through: a gRPC
/// request was served by tonic (or another gRPC server), a request with axum's `MatchedPath` by
/// axum; otherwise every framework's fix is listed. Without tollgate's `axum` feature, axum's
/// `ConnectInfo` cannot be read at all, so the first fix listed is to turn the feature on.
fn no_peer_reason(req: &RequestView<'_>, by: PeerFor) -> &'static str {
    no_peer_reason_as_built(req, by, cfg!(feature = "axum"))
}

/// [`no_peer_reason`] for a build with (`axum_feature`) or without tollgate's `axum` feature: a
/// parameter, so that the tests (which always build with it) check both builds' reasons.
fn no_peer_reason_as_built(req: &RequestView<'_>, by: PeerFor, axum_feature: bool) -> &'static str {
    let by = by as usize;
    if req.is_grpc() {
        return NO_PEER_GRPC[by];
    }
    if !axum_feature {
        return NO_PEER_ANY_WITHOUT_AXUM[by];
    }
    #[cfg(feature = "axum")]
    if req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .is_some()
    {
        return NO_PEER_AXUM[by];
    }
    NO_PEER_ANY[by]
}

/// The reason for [`PeerIp`](super::PeerIp) and for [`ClientIp`](super::ClientIp), with `$fix`.
macro_rules! no_peer {
    ($fix:literal) => {
        [
            concat!("no peer address in the request: ", $fix),
            concat!(
                "no peer address in the request, which ClientIp needs even behind a proxy (it \
                 believes forwarding headers only from a peer in its trusted proxy ranges): ",
                $fix
            ),
        ]
    };
}

#[cfg(feature = "tonic")]
const NO_PEER_GRPC: [&str; 2] = no_peer!(
    "tonic records it (as `TcpConnectInfo`) only when its own `Server` accepts plain TCP \
     connections; over TLS, a Unix socket or a custom `serve_with_incoming` stream, insert the \
     client's `SocketAddr` into the request extensions"
);
#[cfg(not(feature = "tonic"))]
const NO_PEER_GRPC: [&str; 2] = no_peer!(
    "with a tonic server, enable tollgate's `tonic` feature (`features = [\"tonic\"]`) so the \
     peer is read from tonic's `TcpConnectInfo`; otherwise insert the client's `SocketAddr` into \
     the request extensions"
);

#[cfg(feature = "axum")]
const NO_PEER_AXUM: [&str; 2] = no_peer!(
    "serve the axum app with `into_make_service_with_connect_info::<SocketAddr>()` (not \
     `axum::serve(listener, app)`)"
);

const NO_PEER_ANY: [&str; 2] = no_peer!(
    "with axum, serve the app with `into_make_service_with_connect_info::<SocketAddr>()`; with \
     tonic, enable tollgate's `tonic` feature; with plain hyper, insert the connection's \
     `SocketAddr` into the request extensions"
);

const NO_PEER_ANY_WITHOUT_AXUM: [&str; 2] = no_peer!(
    "with axum, enable tollgate's `axum` feature (`features = [\"axum\"]`) and serve the app \
     with `into_make_service_with_connect_info::<SocketAddr>()`; with tonic, enable tollgate's \
     `tonic` feature; with plain hyper, insert the connection's `SocketAddr` into the request \
     extensions"
);

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
/// Ranges of IPv6 addresses that embed IPv4 hosts (IPv4-mapped `::ffff:10.0.0.0/104`, NAT64
/// `64:ff9b::10.0.0.0/104`, IPv4-compatible `::10.0.0.0/104`) are stored as the IPv4 range they
/// denote, since addresses are compared in their canonical form, where such addresses are IPv4.
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
        // A range of IPv4-embedding addresses compares against canonical (IPv4) addresses.
        if let IpAddr::V6(v6) = network
            && prefix >= 96
            && let Some(v4) = embedded_ipv4(v6)
        {
            return Self {
                addr: IpAddr::V4(v4),
                prefix: prefix - 96,
            }
            .nonzero_or(field, text);
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
    fn canonical_unmaps_ipv4_embedding_prefixes() {
        // IPv4-mapped, IPv4-compatible and well-known NAT64 addresses are their IPv4 host.
        for embedded in [
            "::ffff:192.0.2.1",
            "::192.0.2.1",
            "64:ff9b::192.0.2.1",
            "64:ff9b::c000:201",
        ] {
            assert_eq!(canonical(ip(embedded)), ip("192.0.2.1"), "{embedded}");
        }
        assert_eq!(canonical(ip("::2")), ip("0.0.0.2"));
        // The unspecified and loopback addresses are not IPv4 hosts.
        assert_eq!(canonical(ip("::")), ip("::"));
        assert_eq!(canonical(ip("::1")), ip("::1"));
        // Neighbours of the prefixes, and the local-use NAT64 prefix, stay IPv6.
        for v6 in [
            "2001:db8::1",
            "64:ff9b:1::192.0.2.1",
            "64:ff9b:0:0:1::c000:201",
            "::fffe:c000:201",
            "::1:c000:201",
            "65:ff9b::c000:201",
        ] {
            assert_eq!(canonical(ip(v6)), ip(v6), "{v6}");
        }
    }

    #[test]
    fn nat64_clients_are_not_merged_by_ipv6_grouping() {
        // Before the fix every IPv4 client behind a NAT64 shared the key 64:ff9b::/64.
        let a = group(canonical(ip("64:ff9b::203.0.113.9")), 64);
        let b = group(canonical(ip("64:ff9b::198.51.100.4")), 64);
        assert_ne!(a, b);
        assert_eq!(a, ip("203.0.113.9"));
        let c = group(canonical(ip("::203.0.113.9")), 64);
        let d = group(canonical(ip("::198.51.100.4")), 64);
        assert_ne!(c, d);
        assert_eq!(c, a);
    }

    #[test]
    fn six_to_four_and_teredo_clients_key_as_their_ipv4_host() {
        // 6to4: 2002:c000:0201::/48 is the site of 192.0.2.1; every subnet and interface in it
        // is one key (with /64 grouping it was 65,536 keys for one IPv4 host).
        let site = [
            "2002:c000:201::1",
            "2002:c000:201:1::1",
            "2002:c000:201:ffff:1:2:3:4",
        ];
        let mut keys: Vec<IpAddr> = site.iter().map(|a| group(canonical(ip(a)), 64)).collect();
        keys.dedup();
        println!(
            "6to4: {} addresses of 192.0.2.1 -> {} key(s)",
            site.len(),
            keys.len()
        );
        assert_eq!(keys, [ip("192.0.2.1")]);
        assert_eq!(
            group(canonical(ip("2002:cb00:7109::5")), 128),
            ip("203.0.113.9")
        );
        // Teredo: the client's IPv4 is the last 32 bits inverted (RFC 4380's example: server
        // 65.54.227.120, client 192.0.2.45 behind port 40000).
        let teredo = ip("2001:0:4136:e378:8000:63bf:3fff:fdd2");
        assert_eq!(group(canonical(teredo), 64), ip("192.0.2.45"));
        assert_eq!(
            group(canonical(ip("2001:0:4136:e378:8000:63bf:3fff:fdd2")), 128),
            group(canonical(ip("2001:0:4136:e378:0:1234:3fff:fdd2")), 64),
        );
        // Neighbours stay IPv6 and grouped: 2001:db8::/32 (documentation), 2001:1::/32,
        // 2003::/16.
        assert_eq!(group(ip("2001:db8:1:2::9"), 64), ip("2001:db8:1:2::"));
        assert_eq!(group(ip("2001:1::3fff:fdd2"), 64), ip("2001:1::"));
        assert_eq!(group(ip("2003:c000:201::1"), 48), ip("2003:c000:201::"));
        // Trust is not keying: an IPv4 proxy range does not trust a 6to4 address claiming it.
        let net: Cidr = "192.0.2.0/24".parse().unwrap();
        assert!(!net.contains(ip("2002:c000:201::1")));
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
        // IPv4-compatible ::10.0.0.1 is the IPv4 host 10.0.0.1.
        assert!(net.contains(ip("::a00:1")));
        assert!(!net.contains(ip("2001:db8::a00:1")));

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

        let nat64: Cidr = "64:ff9b::10.0.0.0/104".parse().unwrap();
        assert_eq!(nat64.to_string(), "10.0.0.0/8");
        assert!(nat64.contains(ip("64:ff9b::10.1.2.3")));
        assert!("64:ff9b::/96".parse::<Cidr>().is_err());
        let lo: Cidr = "::1/128".parse().unwrap();
        assert_eq!(lo.to_string(), "::1/128");
    }

    fn no_peer(req: &http::Request<()>) -> KeyError {
        peer_ip(&RequestView::new(req), PeerFor::PeerIp).unwrap_err()
    }

    #[test]
    fn missing_peer_names_the_fix_for_the_framework() {
        let grpc = http::Request::post("/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let err = no_peer(&grpc);
        assert!(err.is_misconfiguration());
        assert!(err.reason().contains("tonic"), "{err}");
        assert!(!err.reason().contains("axum"), "{err}");

        let plain = http::Request::get("/").body(()).unwrap();
        let err = no_peer(&plain);
        for fix in [
            "into_make_service_with_connect_info",
            "`tonic` feature",
            "SocketAddr",
        ] {
            assert!(err.reason().contains(fix), "{fix}: {err}");
        }
    }

    /// Forgetting `features = ["axum"]`: axum's `ConnectInfo` may be there but cannot be read
    /// (nor its `MatchedPath`), and the reason says to turn the feature on. The tests always
    /// build with the feature (the crate is its own dev-dependency), so the build without it is
    /// the `axum_feature` parameter.
    #[test]
    fn missing_peer_without_the_axum_feature_says_to_enable_it() {
        let plain = http::Request::get("/").body(()).unwrap();
        let view = RequestView::new(&plain);
        for (by, name) in [(PeerFor::PeerIp, "PeerIp"), (PeerFor::ClientIp, "ClientIp")] {
            let reason = no_peer_reason_as_built(&view, by, false);
            for fix in [
                "`axum` feature",
                r#"features = ["axum"]"#,
                "into_make_service_with_connect_info::<SocketAddr>()",
                "`tonic` feature",
            ] {
                assert!(reason.contains(fix), "{name}, {fix}: {reason}");
            }
            assert_eq!(
                reason.contains("trusted proxy"),
                by == PeerFor::ClientIp,
                "{reason}"
            );
            // With the feature, the reason does not ask for it again.
            let built = no_peer_reason_as_built(&view, by, true);
            assert!(!built.contains(r#"features = ["axum"]"#), "{built}");
        }
        // What this build answers: PeerIp on a request with no address.
        let err = no_peer(&plain);
        assert!(err.is_misconfiguration());
        assert_eq!(
            err.reason(),
            no_peer_reason_as_built(&view, PeerFor::PeerIp, cfg!(feature = "axum"))
        );
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn reads_tonic_tcp_connect_info() {
        use tonic::transport::server::{Connected, TcpConnectInfo};
        // tonic builds TcpConnectInfo from the accepted stream; do the same with a real one.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let info: TcpConnectInfo = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (_client, accepted) =
                tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
            accepted.unwrap().0.connect_info()
        });
        let mut req = http::Request::post("/p.S/M")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        req.extensions_mut().insert(info);
        assert_eq!(
            peer_ip(&RequestView::new(&req), PeerFor::PeerIp).unwrap(),
            ip("127.0.0.1")
        );
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
