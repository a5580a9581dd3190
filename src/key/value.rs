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
            KeyValue::Ip(ip) => {
                let _ = write!(out, "ip:{ip}");
            }
            KeyValue::Int(n) => {
                let _ = write!(out, "int:{n}");
            }
            KeyValue::Bytes(b) => {
                out.extend_from_slice(b"b:");
                out.extend_from_slice(b);
            }
        }
    }
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = Vec::new();
        self.write_canonical(&mut buf);
        f.write_str(&String::from_utf8_lossy(&buf))
    }
}
