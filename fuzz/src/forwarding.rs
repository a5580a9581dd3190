//! Forwarding headers through the public [`ClientIp`] extractor, on a request built by hand with
//! a chosen TCP peer:
//!
//! - whatever the headers hold, extraction never panics and never errors (there is a peer);
//! - an untrusted peer is keyed by its own address, whatever it sends;
//! - a trusted peer's key is the peer or an address written somewhere in the headers read;
//! - forgery does not pay: when a trusted proxy appends the address it really saw (the client's,
//!   untrusted) to the header it writes, then whatever the client put in front of it, in any of
//!   the three headers, the key is that address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::{HeaderValue, Request};
use tollgate::key::{ClientIp, ForwardedHeader, KeyExtractor, KeyValue};
use tollgate::RequestView;

use crate::input::Input;

/// The proxies every check trusts.
pub const TRUSTED: [&str; 4] = [
    "10.0.0.0/8",
    "192.168.0.0/16",
    "2001:db8:ffff::/48",
    "127.0.0.1",
];

const HEADERS: [ForwardedHeader; 3] = [
    ForwardedHeader::XForwardedFor,
    ForwardedHeader::Forwarded,
    ForwardedHeader::XRealIp,
];

const PEERS: [&str; 6] = [
    "10.1.2.3",
    "192.168.7.7",
    "2001:db8:ffff::9",
    "127.0.0.1",
    "::ffff:10.0.0.1",
    "203.0.113.50",
];

/// Runs every check on one fuzzer input.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let config = input.byte();
    let first = HEADERS[usize::from(config) % 3];
    let mut list = vec![first];
    if config & 4 != 0 {
        list.extend(HEADERS.iter().filter(|&&h| h != first));
    }
    let extractor = ClientIp::trusting(TRUSTED)
        .expect("trusted ranges")
        .headers(list.iter().copied())
        .expect("headers")
        .ipv6_prefix(128)
        .expect("prefix");
    let peer: IpAddr = PEERS[usize::from(config >> 3) % PEERS.len()]
        .parse()
        .expect("peer");
    let form = input.byte();
    let honest = address(&mut input, form);
    let trusted_hops = usize::from(input.byte() % 4);
    let as_new_line = input.byte() & 1 == 1;
    let forged = forged_lines(input.rest());

    // Anything the client sends: the key is the peer or one of the addresses it wrote.
    let req = request(peer, &forged);
    let key = client_key(&extractor, &req);
    if extractor.is_trusted(canonical(peer)) {
        let written = forged
            .iter()
            .filter(|(h, _)| list.contains(h))
            .flat_map(|(_, v)| addresses_in(v))
            .collect::<Vec<_>>();
        assert!(
            key == key_of(peer) || written.contains(&key),
            "key {key} is neither the peer {peer} nor written in {forged:?}"
        );
    } else {
        assert_eq!(key, key_of(peer), "an untrusted peer chose its key");
    }

    // Forgery: a trusted proxy appends the client's real, untrusted address to `first`.
    let peer = canonical(peer);
    if !extractor.is_trusted(peer) || extractor.is_trusted(canonical(honest)) {
        return;
    }
    let mut lines = forged;
    let mut hop = render(first, honest, form);
    if first != ForwardedHeader::XRealIp {
        for i in 0..trusted_hops {
            let proxy = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1));
            hop.push_str(", ");
            hop.push_str(&render(first, proxy, form >> 4));
        }
    }
    let last_line = lines.iter().rposition(|(h, _)| *h == first);
    match last_line {
        Some(i) if !as_new_line && first != ForwardedHeader::XRealIp => {
            lines[i].1.extend_from_slice(b", ");
            lines[i].1.extend_from_slice(hop.as_bytes());
            // The proxy's append is the last line of that header.
            let line = lines.remove(i);
            lines.push(line);
        }
        _ => lines.push((first, hop.into_bytes())),
    }
    let req = request(peer, &lines);
    let key = client_key(&extractor, &req);
    assert_eq!(
        key,
        key_of(honest),
        "a forged prefix changed the key; lines {lines:?}"
    );
}

/// The client's address as the extractor keys it (IPv6 ungrouped: prefix 128).
fn client_key(extractor: &ClientIp, req: &Request<()>) -> IpAddr {
    let key = extractor
        .extract(&RequestView::new(req))
        .expect("a request with a peer always has a key");
    assert!(key.scope().is_none());
    match key.value() {
        KeyValue::Ip(ip) => *ip,
        other => panic!("ClientIp produced a non-IP key {other:?}"),
    }
}

fn request(peer: IpAddr, lines: &[(ForwardedHeader, Vec<u8>)]) -> Request<()> {
    let mut req = Request::get("/").body(()).expect("request");
    for (header, value) in lines {
        let value = HeaderValue::from_bytes(value).expect("sanitised value");
        req.headers_mut().append(header.name(), value);
    }
    req.extensions_mut().insert(SocketAddr::new(peer, 4321));
    req
}

/// Splits the attacker's bytes into header lines: the first byte of each picks the header, the
/// rest is its value with the bytes a header value cannot hold removed.
fn forged_lines(bytes: &[u8]) -> Vec<(ForwardedHeader, Vec<u8>)> {
    let mut input = Input::new(bytes);
    let mut lines = Vec::new();
    while !input.is_empty() && lines.len() < 64 {
        let line = input.until(b'\n');
        let Some((&which, value)) = line.split_first() else {
            continue;
        };
        let value = value
            .iter()
            .copied()
            .filter(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
            .collect();
        lines.push((HEADERS[usize::from(which) % 3], value));
    }
    lines
}

/// An address from the input: IPv4 or IPv6 (sometimes IPv4-mapped) by `form`.
fn address(input: &mut Input<'_>, form: u8) -> IpAddr {
    let a = input.u64();
    let b = input.u64();
    match form % 4 {
        0 | 1 => IpAddr::V4(Ipv4Addr::from(a as u32)),
        2 => IpAddr::V6(Ipv6Addr::from((u128::from(a) << 64) | u128::from(b))),
        _ => IpAddr::V6(Ipv4Addr::from(a as u32).to_ipv6_mapped()),
    }
}

/// How a proxy writes `ip` in `header`, in one of the forms proxies use (with or without port).
fn render(header: ForwardedHeader, ip: IpAddr, form: u8) -> String {
    let port = form & 2 != 0;
    match (header, ip, port) {
        (ForwardedHeader::Forwarded, IpAddr::V4(v4), false) => format!("for={v4}"),
        (ForwardedHeader::Forwarded, IpAddr::V4(v4), true) => {
            format!("for=\"{v4}:4711\";proto=https")
        }
        (ForwardedHeader::Forwarded, IpAddr::V6(v6), false) => format!("for=\"[{v6}]\""),
        (ForwardedHeader::Forwarded, IpAddr::V6(v6), true) => format!("for=\"[{v6}]:4711\""),
        (_, IpAddr::V4(v4), true) => format!("{v4}:4711"),
        (_, IpAddr::V6(v6), true) => format!("[{v6}]:4711"),
        (_, ip, false) => ip.to_string(),
    }
}

/// An IPv6 address carrying an IPv4 host as that IPv4 address, as the extractor counts it:
/// IPv4-mapped `::ffff:0:0/96`, IPv4-compatible `::/96` (not `::` and `::1`) and the
/// well-known NAT64 prefix `64:ff9b::/96`.
/// The key of a client at `ip`: its canonical address, or the IPv4 host a 6to4 (`2002::/16`)
/// or Teredo (`2001::/32`, client bits inverted) address carries.
fn key_of(ip: IpAddr) -> IpAddr {
    let ip = canonical(ip);
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    let bits = u128::from(v6);
    match bits >> 96 {
        b if b >> 16 == 0x2002 => IpAddr::V4(Ipv4Addr::from((bits >> 80) as u32)),
        0x2001_0000 => IpAddr::V4(Ipv4Addr::from(!(bits as u32))),
        _ => ip,
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    let bits = u128::from(v6);
    let v4 = IpAddr::V4(Ipv4Addr::from(bits as u32));
    match bits >> 32 {
        0xffff => v4,
        0 if bits > 1 => v4,
        0x0064_ff9b_0000_0000_0000_0000 => v4,
        _ => ip,
    }
}

/// Every address that can be read out of `value`: each maximal run of address characters,
/// parsed as an address or a socket address, with brackets stripped; an over-approximation of
/// the hops a forwarding header can name, computed without the extractor's parser.
fn addresses_in(value: &[u8]) -> Vec<IpAddr> {
    let text = String::from_utf8_lossy(value);
    let mut out = Vec::new();
    let is_addr = |c: char| c.is_ascii_hexdigit() || matches!(c, ':' | '.' | '[' | ']');
    for run in text.split(|c: char| !is_addr(c)).filter(|r| !r.is_empty()) {
        let inner = run.trim_start_matches('[');
        let candidates = [
            run.parse::<SocketAddr>().ok().map(|s| s.ip()),
            inner.trim_end_matches(']').parse::<IpAddr>().ok(),
            inner
                .split_once(']')
                .and_then(|(ip, _)| ip.parse::<IpAddr>().ok()),
            inner.rsplit_once(':').and_then(|(ip, _)| ip.parse().ok()),
        ];
        for ip in candidates.into_iter().flatten() {
            out.push(canonical(ip));
            out.push(key_of(ip));
            if let IpAddr::V6(v6) = ip {
                // An IPv4 address embedded in the low 32 bits (NAT64 forms).
                out.push(IpAddr::V4(Ipv4Addr::from(u128::from(v6) as u32)));
            }
        }
    }
    out
}
