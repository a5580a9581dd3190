//! [`HeaderKey`]: the value of a request header, such as an API key.

use http::header::HeaderName;

use super::{Key, KeyError, KeyExtractor};
use crate::error::ConfigError;
use crate::request::RequestView;

/// Keys a request by the value of one header, typically an API key (`x-api-key`).
///
/// The key borrows the header's bytes from the request: no allocation. The value is used as
/// sent (after the HTTP parser has removed surrounding whitespace); it is **not** checked for
/// validity, so put this limit behind the layer that authenticates the key, or clients can make
/// up a fresh key per request.
///
/// It reads **gRPC metadata** as well: ASCII metadata entries are HTTP/2 headers, so
/// `HeaderKey::new("x-api-key")` keys a tonic call by its `x-api-key` metadata
/// (`request.metadata_mut().insert("x-api-key", ..)` on the client). Binary entries (`-bin`
/// names) are keyed by their base64 text as sent.
///
/// No key, each with a clear [`KeyError`]:
/// - the header is missing, or empty;
/// - it occurs more than once (which one counts would be ambiguous);
/// - it is longer than the maximum, 256 bytes unless set with [`HeaderKey::max_len`], so a client
///   cannot make the limiter store arbitrarily large keys.
///
/// ```
/// use tollgate::key::{HeaderKey, KeyExtractor};
/// use tollgate::RequestView;
///
/// let api_key = HeaderKey::new("x-api-key").unwrap();
///
/// let req = http::Request::get("/").header("x-api-key", "k-123").body(()).unwrap();
/// assert_eq!(api_key.extract(&RequestView::new(&req)).unwrap().to_string(), "b:k-123");
///
/// let req = http::Request::get("/").body(()).unwrap();
/// let err = api_key.extract(&RequestView::new(&req)).unwrap_err();
/// assert_eq!(err.reason(), "missing x-api-key header");
/// ```
///
/// A shorter maximum, and a header name that is a constant:
///
/// ```
/// use tollgate::key::{HeaderKey, KeyExtractor};
/// use tollgate::RequestView;
///
/// let by_auth = HeaderKey::from(http::header::AUTHORIZATION).max_len(16).unwrap();
/// let req = http::Request::get("/").header("authorization", "Bearer 0123456789abcdef").body(()).unwrap();
/// let err = by_auth.extract(&RequestView::new(&req)).unwrap_err();
/// assert_eq!(err.reason(), "authorization header is longer than 16 bytes");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderKey {
    name: HeaderName,
    max_len: usize,
}

/// The default maximum header value length, in bytes.
const DEFAULT_MAX_LEN: usize = 256;

impl HeaderKey {
    /// Keys by the header `name` (case-insensitive: `"X-Api-Key"` is fine). An invalid header
    /// name is a [`ConfigError`].
    pub fn new<N>(name: N) -> Result<Self, ConfigError>
    where
        N: TryInto<HeaderName>,
    {
        match name.try_into() {
            Ok(name) => Ok(Self::from(name)),
            Err(_) => Err(ConfigError::new(
                "key.header.name",
                "not a valid header name: use letters, digits and `-`, like \"x-api-key\"",
            )),
        }
    }

    /// Rejects values longer than `max_len` bytes (default 256). Zero is an error.
    pub fn max_len(mut self, max_len: usize) -> Result<Self, ConfigError> {
        if max_len == 0 {
            return Err(ConfigError::new(
                "key.header.max_len",
                "a maximum length of 0 rejects every request: use at least the length of your \
                 longest valid key",
            ));
        }
        self.max_len = max_len;
        Ok(self)
    }

    /// The header read.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    /// The longest value accepted, in bytes.
    pub fn max_len_bytes(&self) -> usize {
        self.max_len
    }
}

impl From<HeaderName> for HeaderKey {
    fn from(name: HeaderName) -> Self {
        Self {
            name,
            max_len: DEFAULT_MAX_LEN,
        }
    }
}

impl KeyExtractor for HeaderKey {
    fn extract<'r>(&self, req: &RequestView<'r>) -> Result<Key<'r>, KeyError> {
        let mut values = req.headers().get_all(&self.name).into_iter();
        let Some(value) = values.next() else {
            return Err(KeyError::new(format!("missing {} header", self.name)));
        };
        if values.next().is_some() {
            return Err(KeyError::new(format!(
                "more than one {} header: send it once",
                self.name
            )));
        }
        let bytes = value.as_bytes();
        if bytes.is_empty() {
            return Err(KeyError::new(format!("empty {} header", self.name)));
        }
        if bytes.len() > self.max_len {
            return Err(KeyError::new(format!(
                "{} header is longer than {} bytes",
                self.name, self.max_len
            )));
        }
        Ok(Key::bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::key::KeyValue;

    fn request(values: &[&[u8]]) -> http::Request<()> {
        let mut req = http::Request::get("/").body(()).unwrap();
        for v in values {
            req.headers_mut()
                .append("x-api-key", http::HeaderValue::from_bytes(v).unwrap());
        }
        req
    }

    #[test]
    fn value_is_borrowed_from_the_request() {
        let req = request(&[b"secret-1"]);
        let key = HeaderKey::new("X-Api-Key")
            .unwrap()
            .extract(&RequestView::new(&req))
            .unwrap();
        match key.value() {
            KeyValue::Bytes(Cow::Borrowed(b)) => {
                assert_eq!(*b, b"secret-1");
                assert_eq!(b.as_ptr(), req.headers()["x-api-key"].as_bytes().as_ptr());
            }
            other => panic!("expected borrowed bytes, got {other:?}"),
        }
    }

    #[test]
    fn distinct_values_are_distinct_keys() {
        let h = HeaderKey::new("x-api-key").unwrap();
        let (a, b) = (request(&[b"a"]), request(&[b"b"]));
        assert_ne!(
            h.extract(&RequestView::new(&a)).unwrap(),
            h.extract(&RequestView::new(&b)).unwrap()
        );
        // Non-UTF-8 bytes are fine.
        let odd = request(&[b"\xff\xfe"]);
        assert_eq!(
            h.extract(&RequestView::new(&odd)).unwrap(),
            Key::bytes(&b"\xff\xfe"[..])
        );
    }

    #[test]
    fn missing_empty_repeated_and_long_values_are_errors() {
        let h = HeaderKey::new("x-api-key").unwrap();
        let check = |values: &[&[u8]], reason: &str| {
            let req = request(values);
            let err = h.extract(&RequestView::new(&req)).unwrap_err();
            assert_eq!(err.reason(), reason);
            assert!(!err.is_misconfiguration());
        };
        check(&[], "missing x-api-key header");
        check(&[b""], "empty x-api-key header");
        check(
            &[b"a", b"b"],
            "more than one x-api-key header: send it once",
        );
        let long = vec![b'k'; 257];
        check(&[&long], "x-api-key header is longer than 256 bytes");
        let huge = vec![b'k'; 1 << 20];
        check(&[&huge], "x-api-key header is longer than 256 bytes");

        let at_max = vec![b'k'; 256];
        let req = request(&[&at_max]);
        assert!(h.extract(&RequestView::new(&req)).is_ok());
    }

    #[test]
    fn max_len_is_configurable() {
        let h = HeaderKey::new("x-api-key").unwrap().max_len(4).unwrap();
        assert_eq!(h.max_len_bytes(), 4);
        assert!(h.extract(&RequestView::new(&request(&[b"abcd"]))).is_ok());
        assert!(h.extract(&RequestView::new(&request(&[b"abcde"]))).is_err());
        let err = HeaderKey::new("x-api-key").unwrap().max_len(0).unwrap_err();
        assert_eq!(err.field(), "key.header.max_len");
    }

    #[test]
    fn invalid_names_are_config_errors() {
        for bad in ["", "x api key", "x-api-key\n", "ä"] {
            let err = HeaderKey::new(bad).unwrap_err();
            assert_eq!(err.field(), "key.header.name", "{bad:?}");
        }
        assert_eq!(
            HeaderKey::new(http::header::AUTHORIZATION).unwrap().name(),
            http::header::AUTHORIZATION
        );
    }
}
