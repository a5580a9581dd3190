//! [`Key`] and [`KeyValue`]: the identity a limit counts against.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;

/// The identity a limit counts against: a value, optionally scoped to a method and route.
///
/// ```
/// use std::net::{IpAddr, Ipv4Addr};
/// use tollgate::key::Key;
///
/// let ip = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7));
/// let key = Key::ip(ip).scoped("GET", "/search");
/// let mut encoded = Vec::new();
/// key.write_canonical(&mut encoded);
/// assert_eq!(encoded, b"GET /search|ip:203.0.113.7");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key<'a> {
    scope: Option<(&'a str, &'a str)>,
    value: KeyValue<'a>,
}

/// The value part of a [`Key`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyValue<'a> {
    /// One shared key for every request.
    Global,
    /// An IP address (IPv6 already grouped to its prefix by the extractor).
    Ip(IpAddr),
    /// A number (a user id).
    Int(u64),
    /// Bytes: an API key, a principal's name.
    Bytes(Cow<'a, [u8]>),
}

impl<'a> Key<'a> {
    /// The single global key.
    pub const fn global() -> Self {
        Self {
            scope: None,
            value: KeyValue::Global,
        }
    }

    /// A key for an IP address.
    pub const fn ip(ip: IpAddr) -> Self {
        Self {
            scope: None,
            value: KeyValue::Ip(ip),
        }
    }

    /// A key for a number.
    pub const fn int(n: u64) -> Self {
        Self {
            scope: None,
            value: KeyValue::Int(n),
        }
    }

    /// A key for bytes borrowed from the request (or owned, via `Cow::Owned`).
    pub fn bytes(bytes: impl Into<Cow<'a, [u8]>>) -> Self {
        Self {
            scope: None,
            value: KeyValue::Bytes(bytes.into()),
        }
    }

    /// A key for a string.
    pub fn string(s: impl Into<Cow<'a, str>>) -> Self {
        let bytes = match s.into() {
            Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
            Cow::Owned(s) => Cow::Owned(s.into_bytes()),
        };
        Self::bytes(bytes)
    }

    /// The same key, counted separately per `method` and `route`.
    #[must_use]
    pub fn scoped(mut self, method: &'a str, route: &'a str) -> Self {
        self.scope = Some((method, route));
        self
    }

    /// The method and route this key is scoped to, if any.
    pub fn scope(&self) -> Option<(&'a str, &'a str)> {
        self.scope
    }

    /// The value part.
    pub fn value(&self) -> &KeyValue<'a> {
        &self.value
    }

    /// Copies any borrowed bytes so the key outlives the request.
    pub fn into_owned(self) -> Key<'static> {
        // Scopes are short; owning them needs 'static strings, so they are folded into the value.
        match self.scope {
            None => Key {
                scope: None,
                value: match self.value {
                    KeyValue::Global => KeyValue::Global,
                    KeyValue::Ip(ip) => KeyValue::Ip(ip),
                    KeyValue::Int(n) => KeyValue::Int(n),
                    KeyValue::Bytes(b) => KeyValue::Bytes(Cow::Owned(b.into_owned())),
                },
            },
            Some(_) => {
                let mut buf = Vec::new();
                self.write_canonical(&mut buf);
                Key::bytes(buf)
            }
        }
    }

    /// Appends an unambiguous byte encoding of this key: `[METHOD ROUTE|]global`, `ip:ADDR`,
    /// `int:N` or `b:BYTES`. Backends that store keys by name (Redis) escape or hash it further.
    pub fn write_canonical(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        if let Some((method, route)) = self.scope {
            out.extend_from_slice(method.as_bytes());
            out.push(b' ');
            out.extend_from_slice(route.as_bytes());
            out.push(b'|');
        }
        match &self.value {
            KeyValue::Global => out.extend_from_slice(b"global"),
            // Digits written directly: the formatting machinery costs several times as much,
            // on every Redis decision. The bytes are those of `Display`.
            KeyValue::Ip(IpAddr::V4(ip)) => {
                out.extend_from_slice(b"ip:");
                for (i, octet) in ip.octets().into_iter().enumerate() {
                    if i > 0 {
                        out.push(b'.');
                    }
                    push_decimal(out, u64::from(octet));
                }
            }
            KeyValue::Ip(ip) => {
                let _ = write!(out, "ip:{ip}");
            }
            KeyValue::Int(n) => {
                out.extend_from_slice(b"int:");
                push_decimal(out, *n);
            }
            KeyValue::Bytes(b) => {
                out.extend_from_slice(b"b:");
                out.extend_from_slice(b);
            }
        }
    }
}

/// Appends `n` in decimal, as `Display` writes it.
fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(crate::headers::decimal(n, &mut [0; 20]));
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = Vec::new();
        self.write_canonical(&mut buf);
        f.write_str(&String::from_utf8_lossy(&buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn canonical(key: &Key<'_>) -> String {
        let mut out = Vec::new();
        key.write_canonical(&mut out);
        String::from_utf8(out).expect("ASCII")
    }

    #[test]
    fn integer_and_ip_keys_are_written_as_display_writes_them() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            assert_eq!(canonical(&Key::int(n)), format!("int:{n}"));
        }
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..1_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            assert_eq!(
                canonical(&Key::int(x >> (x % 64))),
                format!("int:{}", x >> (x % 64))
            );
            let v4 = Ipv4Addr::from((x >> 8) as u32);
            assert_eq!(canonical(&Key::ip(IpAddr::V4(v4))), format!("ip:{v4}"));
        }
        for v4 in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(10, 0, 200, 7),
        ] {
            assert_eq!(canonical(&Key::ip(IpAddr::V4(v4))), format!("ip:{v4}"));
        }
        let v6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
        assert_eq!(canonical(&Key::ip(IpAddr::V6(v6))), "ip:2001:db8::1");
    }
}
