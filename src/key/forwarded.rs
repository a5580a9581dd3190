//! Parsers for forwarding headers: `X-Forwarded-For` / `X-Real-IP` entries and RFC 7239
//! `Forwarded` elements. They work on bytes, never allocate, never panic, and answer `None` for
//! anything that is not unambiguously an address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::ip::canonical;

/// Longest node text considered (`"[IPv6 with IPv4 tail]:_obfuscated-port"` fits with room);
/// longer entries are malformed without being parsed.
const MAX_NODE_LEN: usize = 100;

/// Strips optional whitespace (SP, HTAB) from both ends.
pub(super) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Which node syntax an entry is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Syntax {
    /// `X-Forwarded-For` / `X-Real-IP`: bare IPv6 allowed, numeric ports only.
    Plain,
    /// RFC 7239 node: IPv6 only in brackets, obfuscated ports (`_abc`) allowed.
    Forwarded,
}

/// An `X-Forwarded-For` / `X-Real-IP` entry: an address, optionally with a port
/// (`192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`).
pub(super) fn parse_plain_node(entry: &[u8]) -> Option<IpAddr> {
    parse_node(entry, Syntax::Plain)
}

/// The `for` address of one `Forwarded` element (`for=192.0.2.60;proto=http;by=203.0.113.43`).
/// `None` when the element has no `for`, more than one, a malformed pair, or a `for` that is not
/// an address (`unknown`, `_hidden`).
pub(super) fn parse_forwarded_element(element: &[u8]) -> Option<IpAddr> {
    let mut found = None;
    for pair in SplitUnquoted::new(element, b';') {
        let pair = trim_ows(pair);
        if pair.is_empty() {
            continue;
        }
        let eq = pair.iter().position(|&b| b == b'=')?;
        let (name, value) = (trim_ows(&pair[..eq]), trim_ows(&pair[eq + 1..]));
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return None;
        }
        if name.eq_ignore_ascii_case(b"for") {
            if found.is_some() {
                return None; // RFC 7239 §4: a parameter occurs at most once per element.
            }
            found = Some(value);
        } else if !valid_value(value) {
            return None;
        }
    }
    parse_node(unquote(found?)?, Syntax::Forwarded)
}

/// `IPv4[:port]`, `[IPv6][:port]`, and in [`Syntax::Plain`] a bare IPv6 address. `unknown` and
/// obfuscated names (`_hidden`) are not addresses. A bare IPv6 address is rejected in `Forwarded`:
/// the RFC requires brackets, without which a port cannot be told apart.
fn parse_node(node: &[u8], syntax: Syntax) -> Option<IpAddr> {
    if node.len() > MAX_NODE_LEN {
        return None;
    }
    let (ip, port) = if let [b'[', rest @ ..] = node {
        let close = rest.iter().position(|&b| b == b']')?;
        (IpAddr::V6(parse_ipv6(&rest[..close])?), &rest[close + 1..])
    } else {
        match node.iter().position(|&b| b == b':') {
            None => (IpAddr::V4(parse_ipv4(node)?), &[][..]),
            Some(colon) => match parse_ipv4(&node[..colon]) {
                Some(v4) => (IpAddr::V4(v4), &node[colon..]),
                None if syntax == Syntax::Plain => (IpAddr::V6(parse_ipv6(node)?), &[][..]),
                None => return None,
            },
        }
    };
    match port {
        [] => {}
        [b':', port @ ..] if valid_port(port, syntax) => {}
        _ => return None,
    }
    Some(canonical(ip))
}

/// A dotted-quad IPv4 address, accepting exactly what [`Ipv4Addr`]'s `FromStr` accepts (four
/// decimal octets up to 255, no leading zeros), several times faster.
pub(super) fn parse_ipv4(s: &[u8]) -> Option<Ipv4Addr> {
    let mut octets = [0_u8; 4];
    let mut i = 0;
    for (n, octet) in octets.iter_mut().enumerate() {
        if n > 0 {
            if s.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let start = i;
        let mut value: u32 = 0;
        while i - start < 3 {
            match s.get(i) {
                Some(&d) if d.is_ascii_digit() => {
                    value = value * 10 + u32::from(d - b'0');
                    i += 1;
                }
                _ => break,
            }
        }
        let digits = i - start;
        if digits == 0 || (digits > 1 && s[start] == b'0') {
            return None;
        }
        *octet = u8::try_from(value).ok()?;
    }
    (i == s.len()).then(|| Ipv4Addr::from(octets))
}

fn parse_ipv6(s: &[u8]) -> Option<Ipv6Addr> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// A port number up to 65535, or in `Forwarded` an obfuscated port
/// `"_" 1*(ALPHA / DIGIT / "." / "_" / "-")`.
fn valid_port(port: &[u8], syntax: Syntax) -> bool {
    match port {
        [b'_', rest @ ..] => {
            syntax == Syntax::Forwarded
                && !rest.is_empty()
                && rest
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        digits => {
            (1..=5).contains(&digits.len())
                && digits.iter().all(u8::is_ascii_digit)
                && digits
                    .iter()
                    .fold(0_u32, |n, &d| n * 10 + u32::from(d - b'0'))
                    <= 65_535
        }
    }
}

/// A token, or a quoted string without escapes (an escape never belongs in an address).
fn valid_value(value: &[u8]) -> bool {
    match value {
        [b'"', ..] => unquote(value).is_some(),
        _ => !value.is_empty() && value.iter().all(|&b| is_tchar(b)),
    }
}

/// The contents of a quoted string, or an unquoted value as is. `None` for unbalanced quotes or
/// escapes.
fn unquote(value: &[u8]) -> Option<&[u8]> {
    match value {
        [b'"', inner @ .., b'"'] if !inner.contains(&b'"') && !inner.contains(&b'\\') => {
            Some(inner)
        }
        [b'"', ..] | [.., b'"'] => None,
        _ => Some(value),
    }
}

/// RFC 9110 `tchar`, as a table.
const TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

#[inline]
fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

/// Whether the quote at `s[i]` is escaped by an odd run of backslashes before it.
fn escaped(s: &[u8], i: usize) -> bool {
    s[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// Splits on `sep` outside quoted strings, left to right.
struct SplitUnquoted<'a> {
    rest: Option<&'a [u8]>,
    sep: u8,
}

impl<'a> SplitUnquoted<'a> {
    fn new(s: &'a [u8], sep: u8) -> Self {
        Self { rest: Some(s), sep }
    }
}

impl<'a> Iterator for SplitUnquoted<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let s = self.rest?;
        let mut quoted = false;
        for (i, &b) in s.iter().enumerate() {
            if b == b'"' && !escaped(s, i) {
                quoted = !quoted;
            } else if b == self.sep && !quoted {
                self.rest = Some(&s[i + 1..]);
                return Some(&s[..i]);
            }
        }
        self.rest = None;
        Some(s)
    }
}

/// Splits on `sep` outside quoted strings, right to left, so that what a client wrote on the left
/// (an unbalanced quote) cannot change how the entries proxies appended on the right are read.
pub(super) struct RSplitUnquoted<'a> {
    rest: Option<&'a [u8]>,
    sep: u8,
}

impl<'a> RSplitUnquoted<'a> {
    pub(super) fn new(s: &'a [u8], sep: u8) -> Self {
        Self { rest: Some(s), sep }
    }
}

impl<'a> Iterator for RSplitUnquoted<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let s = self.rest?;
        let mut quoted = false;
        for i in (0..s.len()).rev() {
            let b = s[i];
            if b == b'"' && !escaped(s, i) {
                quoted = !quoted;
            } else if b == self.sep && !quoted {
                self.rest = Some(&s[..i]);
                return Some(&s[i + 1..]);
            }
        }
        self.rest = None;
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn plain_nodes() {
        for (text, want) in [
            ("192.0.2.1", Some("192.0.2.1")),
            ("192.0.2.1:80", Some("192.0.2.1")),
            ("192.0.2.1:65535", Some("192.0.2.1")),
            ("2001:db8::1", Some("2001:db8::1")),
            ("[2001:db8::1]", Some("2001:db8::1")),
            ("[2001:db8::1]:443", Some("2001:db8::1")),
            ("::ffff:192.0.2.1", Some("192.0.2.1")),
            ("[::ffff:192.0.2.1]:1", Some("192.0.2.1")),
            ("0.0.0.0", Some("0.0.0.0")),
            ("192.0.2.1:65536", None),
            ("192.0.2.1:_obf", None),
            ("192.0.2.1:", None),
            ("192.0.2.1:80:80", None),
            ("192.0.2.01", None),
            ("[192.0.2.1]", None),
            ("[2001:db8::1", None),
            ("2001:db8::1]", None),
            ("[2001:db8::1]443", None),
            ("unknown", None),
            ("", None),
        ] {
            assert_eq!(parse_plain_node(text.as_bytes()), want.map(ip), "{text:?}");
        }
    }

    #[test]
    fn forwarded_elements() {
        for (text, want) in [
            ("for=192.0.2.1", Some("192.0.2.1")),
            ("FOR=192.0.2.1", Some("192.0.2.1")),
            ("for=\"192.0.2.1:_p-1.x\"", Some("192.0.2.1")),
            ("for=\"[2001:db8::1]:_p\"", Some("2001:db8::1")),
            ("by=x;for=192.0.2.1;;proto=https", Some("192.0.2.1")),
            ("for = 192.0.2.1", Some("192.0.2.1")),
            ("for=\"2001:db8::1\"", None),
            ("for=\"[2001:db8::1]:_\"", None),
            ("for=\"_hidden\"", None),
            ("for=unknown", None),
            ("proto=https", None),
            ("for=192.0.2.1;by", None),
            ("for=192.0.2.1;by=\"x", None),
            ("for=192.0.2.1;by=a\"b\"", None),
            ("for=192.0.2.1;for=192.0.2.1", None),
            ("for=192.0.2.1;b y=x", None),
        ] {
            assert_eq!(
                parse_forwarded_element(text.as_bytes()),
                want.map(ip),
                "{text:?}"
            );
        }
    }

    #[test]
    fn trim_strips_spaces_and_tabs_only() {
        assert_eq!(trim_ows(b" \t a b\t "), b"a b");
        assert_eq!(trim_ows(b"  "), b"");
        assert_eq!(trim_ows(b"\na\r"), b"\na\r");
    }

    #[test]
    fn tchar_table() {
        let tchars: Vec<u8> = (0..=255).filter(|&b| is_tchar(b)).collect();
        assert_eq!(tchars.len(), 26 * 2 + 10 + 15);
        for b in b"\"(),/:;<=>?@[\\]{} \t" {
            assert!(!is_tchar(*b), "{}", *b as char);
        }
    }

    #[test]
    fn splitters_respect_quotes_both_ways() {
        let s = br#"a="x,y",b,"c\",d",e"#;
        let fwd: Vec<_> = SplitUnquoted::new(s, b',').collect();
        let mut back: Vec<_> = RSplitUnquoted::new(s, b',').collect();
        back.reverse();
        assert_eq!(fwd, back);
        assert_eq!(fwd, [&br#"a="x,y""#[..], b"b", br#""c\",d""#, b"e"]);
        assert_eq!(SplitUnquoted::new(b"", b',').collect::<Vec<_>>(), [b""]);
        assert_eq!(RSplitUnquoted::new(b"", b',').collect::<Vec<_>>(), [b""]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The fast IPv4 parser agrees with the standard library on near-addresses.
        #[test]
        fn parse_ipv4_matches_std(s in "[0-9.]{0,18}") {
            prop_assert_eq!(parse_ipv4(s.as_bytes()), s.parse::<Ipv4Addr>().ok());
        }

        /// ... on well-formed addresses with leading zeros and extra parts mixed in ...
        #[test]
        fn parse_ipv4_matches_std_on_quads(
            parts in proptest::collection::vec("0{0,2}[0-9]{1,3}", 3..6),
            sep in "[.]{1,2}",
        ) {
            let s = parts.join(&sep);
            prop_assert_eq!(parse_ipv4(s.as_bytes()), s.parse::<Ipv4Addr>().ok());
        }

        /// ... and on arbitrary text.
        #[test]
        fn parse_ipv4_matches_std_on_anything(s in "\\PC{0,20}") {
            prop_assert_eq!(parse_ipv4(s.as_bytes()), s.parse::<Ipv4Addr>().ok());
        }

        /// Every address round-trips through both syntaxes, with and without a port.
        #[test]
        fn nodes_round_trip(v4 in any::<u32>(), v6 in any::<u128>(), port in any::<u16>()) {
            let v4 = Ipv4Addr::from(v4);
            let v6 = Ipv6Addr::from(v6);
            let want6 = canonical(IpAddr::V6(v6));
            prop_assert_eq!(parse_plain_node(v4.to_string().as_bytes()), Some(IpAddr::V4(v4)));
            prop_assert_eq!(parse_plain_node(format!("{v4}:{port}").as_bytes()), Some(IpAddr::V4(v4)));
            prop_assert_eq!(parse_plain_node(v6.to_string().as_bytes()), Some(want6));
            prop_assert_eq!(parse_plain_node(format!("[{v6}]:{port}").as_bytes()), Some(want6));
            prop_assert_eq!(
                parse_forwarded_element(format!("for=\"{v4}:{port}\"").as_bytes()),
                Some(IpAddr::V4(v4))
            );
            prop_assert_eq!(
                parse_forwarded_element(format!("for=\"[{v6}]:{port}\";proto=https").as_bytes()),
                Some(want6)
            );
        }
    }
}
