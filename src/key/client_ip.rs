//! [`ClientIp`]: the client's address as reported by trusted proxies.

use std::net::IpAddr;
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use http::HeaderMap;

use super::forwarded::{parse_forwarded_element, parse_plain_node, trim_ows, RSplitUnquoted};
use super::ip::{check_ipv6_prefix, group, peer_ip, Cidr, PeerFor, DEFAULT_IPV6_PREFIX};
use super::{Key, KeyError, KeyExtractor};
use crate::error::ConfigError;
use crate::request::RequestView;

/// `X-Forwarded-For`: a comma-separated list of addresses, each proxy appending its peer.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Real-IP`: the single address the nearest proxy saw (nginx's `$remote_addr`).
pub const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// A header in which proxies report the addresses they forwarded for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `Forwarded` (RFC 7239): `for=192.0.2.60;proto=https, for="[2001:db8::1]:4711"`. Only the
    /// `for` parameter is read.
    Forwarded,
    /// `X-Forwarded-For`: `192.0.2.60, 198.51.100.17`. Entries may carry a port
    /// (`192.0.2.60:5000`, `[2001:db8::1]:4711`).
    XForwardedFor,
    /// `X-Real-IP`: one address per header line.
    XRealIp,
}

impl ForwardedHeader {
    /// The header's name.
    pub fn name(self) -> HeaderName {
        match self {
            Self::Forwarded => FORWARDED,
            Self::XForwardedFor => X_FORWARDED_FOR,
            Self::XRealIp => X_REAL_IP,
        }
    }
}

/// Keys a request by the client's address as reported by **trusted proxies only**: the right key
/// behind a load balancer or reverse proxy.
///
/// Forwarding headers are written by whoever sent the request, so they are only as trustworthy as
/// the hop that wrote them. `ClientIp` therefore believes a hop only when the hop to its right is
/// one of the proxies you listed with [`ClientIp::trusting`]:
///
/// 1. Start at the TCP peer (read like [`PeerIp`](super::PeerIp) does). **If the peer is not
///    trusted, the key is the peer's address and all headers are ignored**: a client that talks to
///    the server directly cannot choose its key by sending `X-Forwarded-For`.
/// 2. Otherwise read the forwarding header ([which one](ClientIp::headers)) as one chain: several
///    header lines are concatenated in order, and empty list elements are skipped.
/// 3. Walk the chain **from the right** (the entry the nearest proxy appended): skip trusted
///    addresses; the **first untrusted address is the client**. Entries further left were written
///    by that client and may be forged, so they are never looked at.
/// 4. If every entry is trusted, the **leftmost** is the client (the request came from inside).
///    If the header is missing or empty, the client is the peer itself (a proxy's health check).
/// 5. An entry that is **not a valid address** (garbage, `unknown`, an obfuscated `_node`, a
///    `Forwarded` element without exactly one `for`) cannot be trusted and cannot be keyed: the
///    walk stops there and the client is the **last good address**, the trusted hop just right of
///    it (or the peer). Everyone whose chain breaks behind the same proxy therefore shares one key,
///    the safe direction: nobody can pick a fresh key by sending garbage.
///
/// The peer is read like [`PeerIp`](super::PeerIp) does (axum's `ConnectInfo`, tonic's
/// `TcpConnectInfo` with the `tonic` feature, or a `SocketAddr` extension). Addresses are
/// grouped like `PeerIp` does: IPv6 addresses embedding an IPv4 host (IPv4-mapped, IPv4-compatible,
/// NAT64 `64:ff9b::/96`) count as IPv4 (for the trust check too), 6to4 (`2002::/16`) and Teredo
/// (`2001::/32`) clients key as the IPv4 host they tunnel (for the key only: the trust check
/// matches them as IPv6), and other IPv6 keys are grouped by `/64` unless
/// [`ClientIp::ipv6_prefix`] says otherwise. Extraction never panics and never allocates,
/// whatever the headers hold.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{ClientIp, KeyExtractor};
/// use tollgate::RequestView;
///
/// let client_ip = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
///
/// fn key_for(extractor: &ClientIp, peer: &str, xff: &str) -> String {
///     let mut req = http::Request::get("/").header("x-forwarded-for", xff).body(()).unwrap();
///     req.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
///     extractor.extract(&RequestView::new(&req)).unwrap().to_string()
/// }
///
/// // Through our proxy at 10.0.0.2: the client prepended a fake entry; the proxy appended the
/// // address it really saw. The rightmost untrusted entry wins.
/// assert_eq!(key_for(&client_ip, "10.0.0.2:80", "6.6.6.6, 203.0.113.9"), "ip:203.0.113.9");
/// // Straight from the internet: the header is ignored.
/// assert_eq!(key_for(&client_ip, "198.51.100.1:80", "6.6.6.6"), "ip:198.51.100.1");
/// ```
///
/// Reading RFC 7239 `Forwarded` instead, with IPv6 grouped per `/56`:
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{ClientIp, ForwardedHeader, KeyExtractor};
/// use tollgate::RequestView;
///
/// let client_ip = ClientIp::trusting(["10.0.0.0/8", "2001:db8:ffff::/48"])
///     .unwrap()
///     .headers([ForwardedHeader::Forwarded])
///     .unwrap()
///     .ipv6_prefix(56)
///     .unwrap();
///
/// let mut req = http::Request::get("/")
///     .header("forwarded", r#"for="[2001:db8:1:2ab::7]:4711";proto=https, for=10.1.1.1"#)
///     .body(())
///     .unwrap();
/// req.extensions_mut().insert("[2001:db8:ffff::1]:443".parse::<SocketAddr>().unwrap());
/// let key = client_ip.extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(key.to_string(), "ip:2001:db8:1:200::");
/// ```
///
/// # Which header
///
/// By default only `X-Forwarded-For` is read: it is what nginx, HAProxy, Envoy and the cloud load
/// balancers append to. List exactly the headers your proxies **overwrite or append to**, with
/// [`ClientIp::headers`]; a header your proxy passes through untouched is written by the client
/// alone, and believing it would let every client choose its key. When several are listed, the
/// first one present in the request is used and the others are ignored (they are never merged).
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Arc<[Cidr]>,
    headers: [Option<ForwardedHeader>; 3],
    ipv6_prefix: u8,
}

impl ClientIp {
    /// Believes forwarding headers only from peers in these CIDR ranges (`"10.0.0.0/8"`,
    /// `"::1/128"`, or a single address). The error names the first range that does not parse
    /// (see [`Cidr`] for what is rejected), or says that the list is empty.
    pub fn trusting<I>(ranges: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let trusted = ranges
            .into_iter()
            .map(|r| Cidr::parse_for("key.client_ip.trusted", r.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Self::trusting_cidrs(trusted)
    }

    /// Like [`ClientIp::trusting`], from ranges already parsed.
    pub fn trusting_cidrs<I>(ranges: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = Cidr>,
    {
        let trusted: Arc<[Cidr]> = ranges.into_iter().collect();
        if trusted.is_empty() {
            return Err(ConfigError::new(
                "key.client_ip.trusted",
                "no trusted proxy ranges given: list your proxies' addresses (\"10.0.0.0/8\"), \
                 or key by PeerIp if clients connect directly",
            ));
        }
        Ok(Self {
            trusted,
            headers: [Some(ForwardedHeader::XForwardedFor), None, None],
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        })
    }

    /// Reads these headers instead of `X-Forwarded-For`, in this order of precedence: the first
    /// one present in a request is the chain, the others are ignored. List only headers your
    /// proxies write (see [the type docs](ClientIp#which-header)). Repeats are ignored; an empty
    /// list is an error.
    pub fn headers<I>(mut self, headers: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = ForwardedHeader>,
    {
        let mut list = [None; 3];
        let mut len = 0;
        for header in headers {
            if !list[..len].contains(&Some(header)) {
                // Three distinct variants exist, so `len < 3` here.
                list[len] = Some(header);
                len += 1;
            }
        }
        if len == 0 {
            return Err(ConfigError::new(
                "key.client_ip.headers",
                "no forwarding header selected: name the header your proxies write, e.g. \
                 ForwardedHeader::XForwardedFor",
            ));
        }
        self.headers = list;
        Ok(self)
    }

    /// Groups IPv6 client addresses by their first `prefix` bits instead of 64 (`1..=128`).
    pub fn ipv6_prefix(mut self, prefix: u8) -> Result<Self, ConfigError> {
        self.ipv6_prefix = check_ipv6_prefix("key.client_ip.ipv6_prefix", prefix)?;
        Ok(self)
    }

    /// The trusted proxy ranges.
    pub fn trusted(&self) -> &[Cidr] {
        &self.trusted
    }

    /// Whether `ip` is one of the trusted proxies.
    #[inline]
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(ip))
    }

    /// The headers read, in order of precedence.
    pub fn header_list(&self) -> impl Iterator<Item = ForwardedHeader> + '_ {
        self.headers.iter().flatten().copied()
    }

    /// The client's address (before IPv6 grouping) for a request from trusted `peer`.
    fn client_behind(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let Some((header, lines)) = self.header_list().find_map(|h| {
            let mut lines = headers.get_all(h.name()).into_iter().peekable();
            lines.peek().is_some().then_some((h, lines))
        }) else {
            return peer;
        };
        let lines = lines.rev();
        match header {
            ForwardedHeader::XForwardedFor => self.walk(
                peer,
                lines
                    .flat_map(|line| line.as_bytes().rsplit(|&b| b == b','))
                    .map(trim_ows)
                    .filter(|entry| !entry.is_empty())
                    .map(parse_plain_node),
            ),
            ForwardedHeader::XRealIp => self.walk(
                peer,
                lines.map(|line| parse_plain_node(trim_ows(line.as_bytes()))),
            ),
            ForwardedHeader::Forwarded => self.walk(
                peer,
                lines
                    .flat_map(|line| RSplitUnquoted::new(line.as_bytes(), b','))
                    .map(trim_ows)
                    .filter(|element| !element.is_empty())
                    .map(parse_forwarded_element),
            ),
        }
    }

    /// Walks hops right to left (see the type docs): the first untrusted address, else the last
    /// good one.
    fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Option<IpAddr>>) -> IpAddr {
        let mut last_good = peer;
        for hop in hops {
            match hop {
                Some(ip) if self.is_trusted(ip) => last_good = ip,
                Some(ip) => return ip,
                None => {
                    tracing::trace!(%last_good, "unparseable forwarding hop; keying by last good address");
                    return last_good;
                }
            }
        }
        last_good
    }
}

impl KeyExtractor for ClientIp {
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        let peer = peer_ip(req, PeerFor::ClientIp)?;
        let client = if self.is_trusted(peer) {
            self.client_behind(peer, req.headers())
        } else {
            peer
        };
        Ok(Key::ip(group(client, self.ipv6_prefix)))
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use super::*;

    const PROXIES: [&str; 3] = ["10.0.0.0/8", "192.168.0.0/16", "2001:db8:ffff::/48"];

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn client_ip() -> ClientIp {
        ClientIp::trusting(PROXIES).unwrap()
    }

    fn forwarded() -> ClientIp {
        client_ip().headers([ForwardedHeader::Forwarded]).unwrap()
    }

    /// The key for a request from `peer` carrying `headers` (name, value) lines in order.
    fn key(extractor: &ClientIp, peer: &str, headers: &[(&str, &[u8])]) -> Key<'static> {
        let mut req = http::Request::get("/").body(()).unwrap();
        for (name, value) in headers {
            req.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        req.extensions_mut().insert(SocketAddr::new(ip(peer), 4321));
        extractor
            .extract(&RequestView::new(&req))
            .unwrap()
            .into_owned()
    }

    fn xff(extractor: &ClientIp, peer: &str, value: &str) -> Key<'static> {
        key(extractor, peer, &[("x-forwarded-for", value.as_bytes())])
    }

    fn fwd(extractor: &ClientIp, peer: &str, value: &str) -> Key<'static> {
        key(extractor, peer, &[("forwarded", value.as_bytes())])
    }

    fn ip_key(s: &str) -> Key<'static> {
        Key::ip(ip(s))
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        let c = client_ip();
        assert_eq!(xff(&c, "203.0.113.5", "1.2.3.4"), ip_key("203.0.113.5"));
        // Even when the forged entry claims to be a trusted proxy.
        assert_eq!(xff(&c, "203.0.113.5", "10.0.0.1"), ip_key("203.0.113.5"));
        let all = client_ip()
            .headers([
                ForwardedHeader::Forwarded,
                ForwardedHeader::XForwardedFor,
                ForwardedHeader::XRealIp,
            ])
            .unwrap();
        let spoofed = key(
            &all,
            "203.0.113.5",
            &[
                ("forwarded", b"for=1.1.1.1"),
                ("x-forwarded-for", b"2.2.2.2"),
                ("x-real-ip", b"3.3.3.3"),
            ],
        );
        assert_eq!(spoofed, ip_key("203.0.113.5"));
    }

    #[test]
    fn rightmost_untrusted_hop_wins() {
        let c = client_ip();
        // client 203.0.113.9 -> proxy 10.0.0.7 -> proxy 10.0.0.2 (peer)
        assert_eq!(
            xff(&c, "10.0.0.2", "203.0.113.9, 10.0.0.7"),
            ip_key("203.0.113.9")
        );
        // The attacker prepends fake entries, including fake "trusted" ones; only what the
        // proxies appended (the right side) is believed.
        assert_eq!(
            xff(
                &c,
                "10.0.0.2",
                "1.1.1.1, 10.9.9.9, 2.2.2.2, 203.0.113.9, 10.0.0.7"
            ),
            ip_key("203.0.113.9")
        );
        assert_eq!(
            xff(&c, "10.0.0.2", "6.6.6.6, 203.0.113.9"),
            ip_key("203.0.113.9")
        );
    }

    #[test]
    fn all_trusted_chain_uses_leftmost() {
        let c = client_ip();
        assert_eq!(
            xff(&c, "10.0.0.2", "192.168.1.5, 10.0.0.7"),
            ip_key("192.168.1.5")
        );
        // No header, or an empty one: the trusted peer is the client.
        assert_eq!(key(&c, "10.0.0.2", &[]), ip_key("10.0.0.2"));
        assert_eq!(xff(&c, "10.0.0.2", ""), ip_key("10.0.0.2"));
        assert_eq!(xff(&c, "10.0.0.2", " , ,"), ip_key("10.0.0.2"));
    }

    #[test]
    fn garbage_stops_at_last_good_address() {
        let c = client_ip();
        // Garbage right of the client (written by a trusted proxy's peer): key by the hop that
        // reported it.
        assert_eq!(
            xff(&c, "10.0.0.2", "203.0.113.9, garbage, 10.0.0.7"),
            ip_key("10.0.0.7")
        );
        assert_eq!(
            xff(&c, "10.0.0.2", "203.0.113.9, garbage"),
            ip_key("10.0.0.2")
        );
        assert_eq!(xff(&c, "10.0.0.2", "unknown"), ip_key("10.0.0.2"));
        // Garbage left of the client is never reached.
        assert_eq!(
            xff(&c, "10.0.0.2", "garbage, 203.0.113.9, 10.0.0.7"),
            ip_key("203.0.113.9")
        );
        for bad in [
            "1.2.3",
            "1.2.3.4.5",
            "256.1.1.1",
            "1.2.3.4:99999",
            "1.2.3.4:",
            "[::1",
            "::1]",
            "[1.2.3.4]",
            "fe80::1%eth0",
            "1.2.3.4 5.6.7.8",
            "-",
            "\"1.2.3.4\"",
            "0x01020304",
        ] {
            assert_eq!(
                xff(&c, "10.0.0.2", &format!("203.0.113.9, {bad}")),
                ip_key("10.0.0.2"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn xff_entries_with_ports_and_ipv6() {
        let c = client_ip();
        assert_eq!(
            xff(&c, "10.0.0.2", "203.0.113.9:5000"),
            ip_key("203.0.113.9")
        );
        assert_eq!(
            xff(&c, "10.0.0.2", "[2001:db8:1:2::9]:5000"),
            ip_key("2001:db8:1:2::")
        );
        assert_eq!(
            xff(&c, "10.0.0.2", "[2001:db8:1:2::9]"),
            ip_key("2001:db8:1:2::")
        );
        assert_eq!(
            xff(&c, "10.0.0.2", "2001:db8:1:2::9"),
            ip_key("2001:db8:1:2::")
        );
        assert_eq!(
            xff(&c, "10.0.0.2", "::ffff:203.0.113.9"),
            ip_key("203.0.113.9")
        );
        // An IPv4-mapped trusted proxy is trusted.
        assert_eq!(
            xff(&c, "10.0.0.2", "203.0.113.9, ::ffff:10.0.0.7"),
            ip_key("203.0.113.9")
        );
        // Tabs are optional whitespace.
        assert_eq!(
            xff(&c, "10.0.0.2", "\t203.0.113.9\t,\t10.0.0.7"),
            ip_key("203.0.113.9")
        );
    }

    #[test]
    fn ipv4_mapped_peer_is_trusted() {
        let c = client_ip();
        assert_eq!(
            xff(&c, "::ffff:10.0.0.2", "203.0.113.9"),
            ip_key("203.0.113.9")
        );
        assert_eq!(
            xff(&c, "::ffff:203.0.113.1", "10.0.0.1"),
            ip_key("203.0.113.1")
        );
    }

    #[test]
    fn multiple_header_lines_concatenate_in_order() {
        let c = client_ip();
        let k = key(
            &c,
            "10.0.0.2",
            &[
                ("x-forwarded-for", b"6.6.6.6, 203.0.113.9"),
                ("x-forwarded-for", b"10.0.0.9, 10.0.0.8"),
            ],
        );
        assert_eq!(k, ip_key("203.0.113.9"));
        let k = key(
            &c,
            "10.0.0.2",
            &[
                ("x-forwarded-for", b"203.0.113.9"),
                ("x-forwarded-for", b"198.51.100.7"),
            ],
        );
        assert_eq!(k, ip_key("198.51.100.7"));
    }

    #[test]
    fn forwarded_header_forms() {
        let c = forwarded();
        let peer = "10.0.0.2";
        assert_eq!(fwd(&c, peer, "for=203.0.113.9"), ip_key("203.0.113.9"));
        assert_eq!(fwd(&c, peer, "For=203.0.113.9"), ip_key("203.0.113.9"));
        assert_eq!(fwd(&c, peer, "for=\"203.0.113.9\""), ip_key("203.0.113.9"));
        assert_eq!(
            fwd(&c, peer, "for=\"203.0.113.9:8080\""),
            ip_key("203.0.113.9")
        );
        assert_eq!(
            fwd(&c, peer, "for=\"203.0.113.9:_port\""),
            ip_key("203.0.113.9")
        );
        assert_eq!(
            fwd(&c, peer, "for=\"[2001:db8:cafe::17]:4711\""),
            ip_key("2001:db8:cafe::")
        );
        assert_eq!(
            fwd(&c, peer, "for=\"[2001:db8:cafe::17]\""),
            ip_key("2001:db8:cafe::")
        );
        assert_eq!(
            fwd(
                &c,
                peer,
                "proto=https;for=203.0.113.9;by=10.0.0.2;host=\"a.example\""
            ),
            ip_key("203.0.113.9")
        );
        assert_eq!(
            fwd(
                &c,
                peer,
                "for=6.6.6.6, for=203.0.113.9;proto=http, for=10.0.0.7"
            ),
            ip_key("203.0.113.9")
        );
        // A client-written unbalanced quote on the left does not swallow the proxies' entries.
        assert_eq!(
            fwd(&c, peer, "for=\"6.6.6.6, for=203.0.113.9, for=10.0.0.7"),
            ip_key("203.0.113.9")
        );
        // Quoted commas and semicolons belong to the value.
        assert_eq!(
            fwd(&c, peer, "for=203.0.113.9;host=\"a,b;c\", for=10.0.0.7"),
            ip_key("203.0.113.9")
        );
        // IPv6 proxies in brackets are trusted and skipped.
        assert_eq!(
            key(
                &c,
                "2001:db8:ffff::1",
                &[(
                    "forwarded",
                    b"for=198.51.100.4, for=\"[2001:db8:ffff::9]:80\""
                )]
            ),
            ip_key("198.51.100.4")
        );
    }

    #[test]
    fn forwarded_unknown_obfuscated_and_malformed_stop_the_walk() {
        let c = forwarded();
        let peer = "10.0.0.2";
        for bad in [
            "for=unknown",
            "for=_hidden",
            "for=\"_hidden:80\"",
            "for=\"[2001:db8::1]:99999\"",
            "for=\"[2001:db8::1]x\"",
            "for=2001:db8::1",
            "for=\"[10.0.0.1]\"",
            "for=",
            "for=\"\"",
            "for=\"203.0.113.9",
            "for=\"203.0.113.9\\\"\"",
            "proto=https",
            "for=203.0.113.9;for=198.51.100.1",
            "for 203.0.113.9",
            "for=203.0.113.9;=x",
            "for=203.0.113.9;proto=ht tp",
            "for=203.0.113.9:",
            "f\u{f6}r=1.2.3.4",
        ] {
            let chain = format!("for=198.51.100.1, {bad}, for=10.0.0.7");
            assert_eq!(fwd(&c, peer, &chain), ip_key("10.0.0.7"), "{bad:?}");
        }
    }

    #[test]
    fn x_real_ip_is_one_hop_per_line() {
        let c = client_ip().headers([ForwardedHeader::XRealIp]).unwrap();
        let k = key(&c, "10.0.0.2", &[("x-real-ip", b"203.0.113.9")]);
        assert_eq!(k, ip_key("203.0.113.9"));
        // A list is not an X-Real-IP value.
        let k = key(&c, "10.0.0.2", &[("x-real-ip", b"203.0.113.9, 1.1.1.1")]);
        assert_eq!(k, ip_key("10.0.0.2"));
        // X-Forwarded-For is not read when not selected.
        let k = key(&c, "10.0.0.2", &[("x-forwarded-for", b"203.0.113.9")]);
        assert_eq!(k, ip_key("10.0.0.2"));
    }

    #[test]
    fn first_present_header_wins() {
        let c = client_ip()
            .headers([ForwardedHeader::Forwarded, ForwardedHeader::XForwardedFor])
            .unwrap();
        let both: &[(&str, &[u8])] = &[
            ("x-forwarded-for", b"198.51.100.1"),
            ("forwarded", b"for=203.0.113.9"),
        ];
        assert_eq!(key(&c, "10.0.0.2", both), ip_key("203.0.113.9"));
        assert_eq!(
            key(&c, "10.0.0.2", &[("x-forwarded-for", b"198.51.100.1")]),
            ip_key("198.51.100.1")
        );
        // The default reads only X-Forwarded-For.
        assert_eq!(key(&client_ip(), "10.0.0.2", both), ip_key("198.51.100.1"));
        assert_eq!(
            client_ip().header_list().collect::<Vec<_>>(),
            [ForwardedHeader::XForwardedFor]
        );
    }

    #[test]
    fn ipv6_clients_group_by_prefix() {
        let c = client_ip();
        let a = xff(&c, "10.0.0.2", "2001:db8:1:2::1");
        let b = xff(&c, "10.0.0.2", "2001:db8:1:2:ffff::9");
        let other = xff(&c, "10.0.0.2", "2001:db8:1:3::1");
        assert_eq!(a, b);
        assert_ne!(a, other);

        let exact = client_ip().ipv6_prefix(128).unwrap();
        assert_ne!(
            xff(&exact, "10.0.0.2", "2001:db8:1:2::1"),
            xff(&exact, "10.0.0.2", "2001:db8:1:2::2")
        );
        // The trust check uses the full address, not the grouped one: 2001:db8:ffff::/48 is
        // trusted, but 2001:db8:fffe::1 shares no /48 with it.
        assert_eq!(
            xff(&c, "10.0.0.2", "2001:db8:fffe::1, 2001:db8:ffff::5"),
            ip_key("2001:db8:fffe::")
        );
        assert!(client_ip().ipv6_prefix(0).is_err());
        assert!(client_ip().ipv6_prefix(129).is_err());
    }

    #[test]
    fn configuration_errors_name_the_problem() {
        let err = ClientIp::trusting(["10.0.0.0/8", "10.0.0.300/8"]).unwrap_err();
        assert_eq!(err.field(), "key.client_ip.trusted");
        assert!(err.message().contains("`10.0.0.300/8`"), "{err}");
        let err = ClientIp::trusting(Vec::<String>::new()).unwrap_err();
        assert!(err.message().contains("PeerIp"), "{err}");
        let err = ClientIp::trusting(["0.0.0.0/0"]).unwrap_err();
        assert!(err.message().contains("every"), "{err}");
        let err = client_ip().headers([]).unwrap_err();
        assert_eq!(err.field(), "key.client_ip.headers");
        let dup = client_ip()
            .headers([ForwardedHeader::XRealIp, ForwardedHeader::XRealIp])
            .unwrap();
        assert_eq!(dup.header_list().count(), 1);
    }

    #[test]
    fn missing_peer_is_a_misconfiguration() {
        let req = http::Request::get("/")
            .header("x-forwarded-for", "203.0.113.9")
            .body(())
            .unwrap();
        let err = client_ip().extract(&RequestView::new(&req)).unwrap_err();
        assert!(err.is_misconfiguration());
        assert!(err.reason().contains("trusted proxy"), "{err}");
        assert!(err.reason().contains("SocketAddr"), "{err}");
    }

    #[test]
    fn huge_and_hostile_headers_never_panic() {
        let c = client_ip()
            .headers([ForwardedHeader::Forwarded, ForwardedHeader::XForwardedFor])
            .unwrap();
        let long_entry = "9".repeat(100_000);
        let many = "10.0.0.1, ".repeat(20_000) + "203.0.113.9, 10.0.0.7";
        let quotes = "\"".repeat(10_001) + "for=203.0.113.9";
        let backslashes = "\\".repeat(10_000) + "\",for=203.0.113.9";
        let bytes: Vec<u8> = (0x80..=0xff)
            .chain(b"for=1.2.3.4".iter().copied())
            .collect();
        for value in [
            long_entry.as_bytes(),
            many.as_bytes(),
            quotes.as_bytes(),
            backslashes.as_bytes(),
            &bytes,
            b",,,,;;;;====\"\"\"",
            b"for=[",
            b"for=\"[",
            b"[",
            b"]",
            b"\"",
            b"\\",
            b"for=\"[::1]:\"",
        ] {
            let k = key(
                &c,
                "10.0.0.2",
                &[("forwarded", value), ("x-forwarded-for", value)],
            );
            // Whatever the result, it is an address from the request or the peer, never a panic.
            assert!(matches!(k.value(), crate::key::KeyValue::Ip(_)));
            let k = key(&client_ip(), "10.0.0.2", &[("x-forwarded-for", value)]);
            assert!(matches!(k.value(), crate::key::KeyValue::Ip(_)));
        }
        assert_eq!(
            key(
                &client_ip(),
                "10.0.0.2",
                &[("x-forwarded-for", many.as_bytes())]
            ),
            ip_key("203.0.113.9")
        );
        assert_eq!(
            key(&c, "10.0.0.2", &[("forwarded", long_entry.as_bytes())]),
            ip_key("10.0.0.2")
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// An address outside every trusted range of [`PROXIES`].
        fn untrusted_v4() -> impl Strategy<Value = IpAddr> {
            (11_u8..=191, any::<u8>(), any::<u8>(), 1_u8..=254)
                .prop_map(|(a, b, c, d)| IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
        }

        fn trusted_v4() -> impl Strategy<Value = IpAddr> {
            (any::<u8>(), any::<u8>(), any::<u8>())
                .prop_map(|(b, c, d)| IpAddr::V4(Ipv4Addr::new(10, b, c, d)))
        }

        /// What a client may write itself: any visible ASCII, quotes, commas and all.
        fn forged() -> impl Strategy<Value = String> {
            "[ -~]{0,40}"
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Whatever a client prepends, the key behind a chain of trusted proxies is the
            /// address the first of them saw.
            #[test]
            fn forged_prefix_never_changes_the_key(
                forged in proptest::collection::vec(forged(), 0..4),
                client in untrusted_v4(),
                hops in proptest::collection::vec(trusted_v4(), 0..4),
            ) {
                let c = client_ip();
                let f = forwarded();
                let mut x_forwarded_for = forged.join(",");
                let mut forwarded_value = x_forwarded_for.clone();
                for (i, ip) in std::iter::once(client).chain(hops.iter().copied()).enumerate() {
                    let sep = if i == 0 && forged.is_empty() { "" } else { ", " };
                    x_forwarded_for.push_str(&format!("{sep}{ip}"));
                    forwarded_value.push_str(&format!("{sep}for={ip};proto=https"));
                }
                prop_assert_eq!(xff(&c, "10.0.0.2", &x_forwarded_for), Key::ip(client));
                prop_assert_eq!(fwd(&f, "10.0.0.2", &forwarded_value), Key::ip(client));
            }

            /// From an untrusted peer, nothing in any header matters.
            #[test]
            fn untrusted_peer_is_always_the_key(
                peer in untrusted_v4(),
                value in proptest::collection::vec(any::<u8>(), 0..200),
            ) {
                let all = client_ip()
                    .headers([ForwardedHeader::Forwarded, ForwardedHeader::XForwardedFor])
                    .unwrap();
                if let Ok(value) = http::HeaderValue::from_bytes(&value) {
                    let mut req = http::Request::get("/").body(()).unwrap();
                    req.headers_mut().insert(FORWARDED, value.clone());
                    req.headers_mut().insert(X_FORWARDED_FOR, value);
                    req.extensions_mut().insert(SocketAddr::new(peer, 1));
                    let key = all.extract(&RequestView::new(&req)).unwrap();
                    prop_assert_eq!(key, Key::ip(peer));
                }
            }

            /// Arbitrary bytes from a trusted peer never panic and always give an address key.
            #[test]
            fn arbitrary_headers_from_a_trusted_peer(
                value in proptest::collection::vec(any::<u8>(), 0..300),
                text in "[ -~]{0,120}",
            ) {
                let c = client_ip()
                    .headers([ForwardedHeader::Forwarded, ForwardedHeader::XForwardedFor])
                    .unwrap();
                for value in [value, text.into_bytes()] {
                    if let Ok(v) = http::HeaderValue::from_bytes(&value) {
                        for name in [FORWARDED, X_FORWARDED_FOR] {
                            let mut req = http::Request::get("/").body(()).unwrap();
                            req.headers_mut().insert(name, v.clone());
                            req.extensions_mut().insert(SocketAddr::new(ip("10.0.0.2"), 1));
                            let key = c.extract(&RequestView::new(&req)).unwrap();
                            prop_assert!(matches!(key.value(), crate::key::KeyValue::Ip(_)));
                        }
                    }
                }
            }
        }
    }
}
