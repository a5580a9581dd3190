//! [`PeerIp`]: the address of the TCP peer.

use super::ip::{check_ipv6_prefix, group, peer_ip, PeerFor, DEFAULT_IPV6_PREFIX};
use super::{Key, KeyError, KeyExtractor};
use crate::error::ConfigError;
use crate::request::RequestView;

/// Keys a request by the IP address of the TCP peer: the right key when clients connect directly.
///
/// Behind a proxy or load balancer every request comes from the proxy, so all clients would share
/// one key; use [`ClientIp`](super::ClientIp) there.
///
/// The address is read from the first of:
///
/// - axum's `ConnectInfo<SocketAddr>` (with the `axum` feature; serve the app with
///   `into_make_service_with_connect_info::<SocketAddr>()`);
/// - tonic's `TcpConnectInfo` (with the `tonic` feature), which tonic's `Server` records for
///   every TCP connection, so `Server::builder().layer(layer)` needs nothing else;
/// - a plain [`SocketAddr`](std::net::SocketAddr) request extension, which a plain hyper server
///   inserts from the address `accept()` returned (`req.extensions_mut().insert(peer)` in its
///   service), and which any other server (tonic over TLS or a Unix socket) can insert too.
///
/// Without any, extraction fails with a [misconfiguration](KeyError::is_misconfiguration) whose
/// reason names the fix for the framework in use (axum, tonic or hyper), and the layer answers
/// every request with `500` and that fix in the body (and, without a `tracing` subscriber, on
/// stderr once). **With axum, two things are needed**: tollgate's `axum` feature
/// (`features = ["axum"]`), without which `ConnectInfo` cannot be read, and serving with
/// `into_make_service_with_connect_info::<SocketAddr>()`, without which axum records no address:
///
/// ```no_run
/// # #[cfg(feature = "axum")]
/// # async fn serve(app: axum::Router) -> std::io::Result<()> {
/// use std::net::SocketAddr;
///
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
/// axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
/// # }
/// ```
///
/// - IPv4 addresses are keys as they are.
/// - IPv6 addresses are grouped by their first 64 bits, since one host is routinely given a whole
///   `/64` and could otherwise rotate through 2^64 keys. [`PeerIp::ipv6_prefix`] changes that.
/// - IPv6 addresses that embed an IPv4 host count as that IPv4 address, so each IPv4 client keeps
///   its own key instead of sharing a `/64`: IPv4-mapped `::ffff:0:0/96` (`::ffff:192.0.2.1`,
///   from dual-stack sockets), IPv4-compatible `::/96` (`::192.0.2.1`; not `::` or `::1`) and
///   the well-known NAT64 prefix `64:ff9b::/96` (`64:ff9b::192.0.2.1`). The local-use NAT64
///   prefix `64:ff9b:1::/48` is left as IPv6: its operator picks where the IPv4 bits sit.
/// - Tunnelled IPv6 addresses key as the IPv4 host that owns them: 6to4 `2002::/16`
///   (`2002:AABB:CCDD::/48` is the whole site of `AA.BB.CC.DD`, which would otherwise get 65,536
///   `/64` keys) and Teredo `2001::/32` (the client's public IPv4, the last 32 bits inverted).
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{KeyExtractor, PeerIp};
/// use tollgate::RequestView;
///
/// fn key_for(extractor: &PeerIp, peer: &str) -> String {
///     let mut req = http::Request::get("/").body(()).unwrap();
///     req.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
///     extractor.extract(&RequestView::new(&req)).unwrap().to_string()
/// }
///
/// let by_peer = PeerIp::new();
/// assert_eq!(key_for(&by_peer, "203.0.113.9:443"), "ip:203.0.113.9");
/// assert_eq!(key_for(&by_peer, "[::ffff:203.0.113.9]:443"), "ip:203.0.113.9");
/// assert_eq!(key_for(&by_peer, "[64:ff9b::203.0.113.9]:443"), "ip:203.0.113.9"); // NAT64
/// assert_eq!(key_for(&by_peer, "[2002:cb00:7109:1::5]:443"), "ip:203.0.113.9"); // 6to4
/// assert_eq!(key_for(&by_peer, "[2001:db8:1:2:3:4:5:6]:443"), "ip:2001:db8:1:2::");
///
/// let by_56 = PeerIp::new().ipv6_prefix(56).unwrap();
/// assert_eq!(key_for(&by_56, "[2001:db8:1:2ff:3:4:5:6]:443"), "ip:2001:db8:1:200::");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Keys by peer address, grouping IPv6 addresses by `/64`.
    pub const fn new() -> Self {
        Self {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Groups IPv6 addresses by their first `prefix` bits instead of 64: `128` counts single
    /// addresses, `48` or `56` a whole site. `prefix` must be in `1..=128`.
    pub fn ipv6_prefix(mut self, prefix: u8) -> Result<Self, ConfigError> {
        self.ipv6_prefix = check_ipv6_prefix("key.peer_ip.ipv6_prefix", prefix)?;
        Ok(self)
    }

    /// The IPv6 grouping prefix length.
    pub fn ipv6_prefix_len(&self) -> u8 {
        self.ipv6_prefix
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for PeerIp {
    #[inline]
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        let ip = peer_ip(req, PeerFor::PeerIp)?;
        Ok(Key::ip(group(ip, self.ipv6_prefix)))
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, SocketAddr};

    use super::*;

    fn extract(extractor: &PeerIp, peer: Option<&str>) -> Result<Key<'static>, KeyError> {
        let mut req = http::Request::get("/")
            .header("x-forwarded-for", "1.1.1.1")
            .body(())
            .unwrap();
        if let Some(peer) = peer {
            req.extensions_mut()
                .insert(peer.parse::<SocketAddr>().unwrap());
        }
        extractor
            .extract(&RequestView::new(&req))
            .map(Key::into_owned)
    }

    fn ip_key(s: &str) -> Key<'static> {
        Key::ip(s.parse::<IpAddr>().unwrap())
    }

    #[test]
    fn ipv4_is_kept_and_headers_ignored() {
        let key = extract(&PeerIp::new(), Some("192.0.2.1:1234")).unwrap();
        assert_eq!(key, ip_key("192.0.2.1"));
    }

    #[test]
    fn ipv4_mapped_counts_as_ipv4() {
        let key = extract(&PeerIp::new(), Some("[::ffff:192.0.2.1]:1234")).unwrap();
        assert_eq!(key, ip_key("192.0.2.1"));
    }

    #[test]
    fn nat64_and_compatible_peers_keep_their_ipv4_keys() {
        let p = PeerIp::new();
        let a = extract(&p, Some("[64:ff9b::203.0.113.9]:1")).unwrap();
        let b = extract(&p, Some("[64:ff9b::198.51.100.4]:1")).unwrap();
        assert_ne!(a, b, "two IPv4 clients behind a NAT64 must not share a key");
        assert_eq!(a, ip_key("203.0.113.9"));
        let c = extract(&p, Some("[::198.51.100.4]:1")).unwrap();
        assert_eq!(c, b);
    }

    #[test]
    fn ipv6_grouped_by_64() {
        let p = PeerIp::new();
        let a = extract(&p, Some("[2001:db8:aa:bb:1::1]:1")).unwrap();
        let b = extract(&p, Some("[2001:db8:aa:bb:ffff:ffff:ffff:ffff]:2")).unwrap();
        let c = extract(&p, Some("[2001:db8:aa:bc::1]:1")).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, ip_key("2001:db8:aa:bb::"));
    }

    #[test]
    fn ipv6_prefix_is_configurable_and_checked() {
        let p = PeerIp::new().ipv6_prefix(128).unwrap();
        let a = extract(&p, Some("[2001:db8::1]:1")).unwrap();
        let b = extract(&p, Some("[2001:db8::2]:1")).unwrap();
        assert_ne!(a, b);
        assert_eq!(p.ipv6_prefix_len(), 128);

        let p48 = PeerIp::new().ipv6_prefix(48).unwrap();
        assert_eq!(
            extract(&p48, Some("[2001:db8:7:ffff::1]:1")).unwrap(),
            ip_key("2001:db8:7::")
        );

        for bad in [0, 129, 255] {
            let err = PeerIp::new().ipv6_prefix(bad).unwrap_err();
            assert_eq!(err.field(), "key.peer_ip.ipv6_prefix");
        }
    }

    #[test]
    fn missing_peer_is_a_misconfiguration() {
        let err = extract(&PeerIp::new(), None).unwrap_err();
        assert!(err.is_misconfiguration());
        assert!(err.reason().contains("SocketAddr"), "{err}");
    }

    #[cfg(feature = "axum")]
    #[test]
    fn reads_axum_connect_info() {
        let mut req = http::Request::get("/").body(()).unwrap();
        let addr: SocketAddr = "198.51.100.3:80".parse().unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        let key = PeerIp::new().extract(&RequestView::new(&req)).unwrap();
        assert_eq!(key, ip_key("198.51.100.3"));
    }

    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn missing_peer_in_axum_names_connect_info() {
        use axum::{body::Body, extract::Request, routing::get, Router};
        use tower::ServiceExt;

        // Served without into_make_service_with_connect_info: the router's MatchedPath shows
        // that the app is axum, so the reason gives axum's fix alone.
        let app = Router::new().route(
            "/",
            get(|req: Request| async move {
                PeerIp::new()
                    .extract(&RequestView::new(&req))
                    .unwrap_err()
                    .to_string()
            }),
        );
        let res = app
            .oneshot(http::Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        let body = axum::body::to_bytes(res.into_body(), 4096).await.unwrap();
        let reason = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            reason.contains("into_make_service_with_connect_info"),
            "{reason}"
        );
        assert!(!reason.contains("tonic"), "{reason}");
    }
}
