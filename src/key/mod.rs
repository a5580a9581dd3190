//! Key extractors: who a request is counted against.
//!
//! A [`KeyExtractor`] turns a [`RequestView`] into a [`Key`]. Keys borrow from the request where
//! they can, so extracting a header or a route costs no allocation.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;

use crate::request::RequestView;

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

/// Why no key could be extracted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    reason: Cow<'static, str>,
}

impl KeyError {
    /// A key error with a reason a client can read (`"missing x-api-key header"`).
    pub fn new(reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    /// The reason.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for KeyError {}

/// Extracts the [`Key`] a request is counted against.
///
/// Implemented for closures `Fn(&RequestView<'r>) -> Result<Key<'r>, KeyError>`.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key for `req`, or why there is none.
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError>;
}

impl<F> KeyExtractor for F
where
    F: for<'r> Fn(&RequestView<'r>) -> Result<Key<'r>, KeyError> + Send + Sync + 'static,
{
    #[inline]
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        self(req)
    }
}

impl KeyExtractor for Box<dyn KeyExtractor> {
    #[inline]
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        (**self).extract(req)
    }
}
