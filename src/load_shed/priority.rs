//! [`Priority`] and the [`Classify`] trait: which class a request belongs to, from a header, a
//! key extractor (route, principal, plan, API key) or a closure.

use std::fmt;

use http::HeaderName;

use crate::key::{Key, KeyExtractor};
use crate::request::RequestView;

/// A request's class: lower classes are shed first.
///
/// ```
/// use tollgate::load_shed::Priority;
///
/// assert_eq!("critical".parse::<Priority>(), Ok(Priority::Critical));
/// assert_eq!(Priority::Sheddable.as_str(), "sheddable");
/// assert!(Priority::Critical > Priority::Default);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Shed first: prefetches, retries, batch jobs, anonymous traffic.
    Sheddable,
    /// Everything not marked otherwise.
    Default,
    /// Shed last: may use the whole limit (logins, payments, health checks of the fleet).
    Critical,
}

impl Priority {
    /// Every class, most important first (the order waiting requests are served in).
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Default, Priority::Sheddable];

    /// `"critical"`, `"default"` or `"sheddable"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Default => "default",
            Priority::Sheddable => "sheddable",
        }
    }

    pub(crate) const fn index(self) -> usize {
        match self {
            Priority::Critical => 0,
            Priority::Default => 1,
            Priority::Sheddable => 2,
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Priority {
    type Err = UnknownPriority;

    /// Parses `critical`, `default` or `sheddable`, in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| s.eq_ignore_ascii_case(p.as_str()))
            .ok_or(UnknownPriority)
    }
}

/// A text that names no [`Priority`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownPriority;

impl fmt::Display for UnknownPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a priority: use critical, default or sheddable")
    }
}

impl std::error::Error for UnknownPriority {}

/// Decides a request's [`Priority`]. Implemented by [`PriorityHeader`], [`KeyPriority`] and
/// any `Fn(&RequestView<'_>) -> Priority` closure.
///
/// ```
/// use tollgate::load_shed::{Classify, Priority};
/// use tollgate::RequestView;
///
/// // Health checks of the load balancer are critical, everything else default.
/// let classify = |req: &RequestView<'_>| match req.uri().path() {
///     "/healthz" => Priority::Critical,
///     _ => Priority::Default,
/// };
/// let req = http::Request::get("/healthz").body(()).unwrap();
/// assert_eq!(classify.classify(&RequestView::new(&req)), Priority::Critical);
/// ```
pub trait Classify: Send + Sync + 'static {
    /// The class of `req`.
    fn classify(&self, req: &RequestView<'_>) -> Priority;
}

impl<F> Classify for F
where
    F: Fn(&RequestView<'_>) -> Priority + Send + Sync + 'static,
{
    #[inline]
    fn classify(&self, req: &RequestView<'_>) -> Priority {
        self(req)
    }
}

/// Every request in one class (the layer's default: [`Priority::Default`]).
impl Classify for Priority {
    #[inline]
    fn classify(&self, _req: &RequestView<'_>) -> Priority {
        *self
    }
}

/// The priority a header names (`critical`, `default` or `sheddable`, any case); requests
/// without it, or with another value, get the [`otherwise`](Self::otherwise) class.
///
/// A client can claim any class this way: trust the header only from your own services (a
/// gateway that sets it), or derive the class from something the client cannot forge with
/// [`KeyPriority`].
///
/// ```
/// use tollgate::load_shed::{Classify, Priority, PriorityHeader};
/// use tollgate::RequestView;
///
/// let classify = PriorityHeader::new("x-priority").otherwise(Priority::Sheddable);
/// let critical = http::Request::get("/").header("x-priority", "Critical").body(()).unwrap();
/// let plain = http::Request::get("/").body(()).unwrap();
/// assert_eq!(classify.classify(&RequestView::new(&critical)), Priority::Critical);
/// assert_eq!(classify.classify(&RequestView::new(&plain)), Priority::Sheddable);
/// ```
#[derive(Debug, Clone)]
pub struct PriorityHeader {
    name: HeaderName,
    otherwise: Priority,
}

impl PriorityHeader {
    /// Reads the header `name`; without it a request is [`Priority::Default`].
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name (a constant in practice).
    pub fn new(name: &str) -> Self {
        Self {
            name: HeaderName::try_from(name).expect("a valid header name"),
            otherwise: Priority::Default,
        }
    }

    /// The class of requests without the header or with another value.
    #[must_use]
    pub fn otherwise(mut self, priority: Priority) -> Self {
        self.otherwise = priority;
        self
    }
}

impl Classify for PriorityHeader {
    fn classify(&self, req: &RequestView<'_>) -> Priority {
        req.headers()
            .get(&self.name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(self.otherwise)
    }
}

/// The priority of a request's key, from any [`KeyExtractor`]: a route
/// ([`RouteKey`](crate::key::RouteKey)), a principal ([`Principal`](crate::key::Principal)),
/// an API key header ([`HeaderKey`](crate::key::HeaderKey)), a plan resolved earlier. Requests
/// without a key get the `otherwise` class.
///
/// ```
/// use tollgate::key::{HeaderKey, Key, KeyValue};
/// use tollgate::load_shed::{Classify, KeyPriority, Priority};
/// use tollgate::RequestView;
///
/// // Paying customers' API keys start with "live_"; their requests are critical.
/// let classify = KeyPriority::new(HeaderKey::new("x-api-key")?, |key: &Key<'_>| match key.value() {
///     KeyValue::Bytes(b) if b.starts_with(b"live_") => Priority::Critical,
///     _ => Priority::Sheddable,
/// });
/// let req = http::Request::get("/").header("x-api-key", "live_42").body(()).unwrap();
/// assert_eq!(classify.classify(&RequestView::new(&req)), Priority::Critical);
/// let anonymous = http::Request::get("/").body(()).unwrap();
/// assert_eq!(classify.classify(&RequestView::new(&anonymous)), Priority::Default);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct KeyPriority<E, F> {
    extractor: E,
    map: F,
    otherwise: Priority,
}

impl<E, F> KeyPriority<E, F>
where
    E: KeyExtractor,
    F: Fn(&Key<'_>) -> Priority + Send + Sync + 'static,
{
    /// Classifies by `map` of the key `extractor` finds; [`Priority::Default`] without a key.
    pub fn new(extractor: E, map: F) -> Self {
        Self {
            extractor,
            map,
            otherwise: Priority::Default,
        }
    }

    /// The class of requests the extractor finds no key in.
    #[must_use]
    pub fn otherwise(mut self, priority: Priority) -> Self {
        self.otherwise = priority;
        self
    }
}

impl<E, F> fmt::Debug for KeyPriority<E, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPriority")
            .field("otherwise", &self.otherwise)
            .finish_non_exhaustive()
    }
}

impl<E, F> Classify for KeyPriority<E, F>
where
    E: KeyExtractor,
    F: Fn(&Key<'_>) -> Priority + Send + Sync + 'static,
{
    fn classify(&self, req: &RequestView<'_>) -> Priority {
        match self.extractor.extract(req) {
            Ok(key) => (self.map)(&key),
            Err(_) => self.otherwise,
        }
    }
}
