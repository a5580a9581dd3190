//! [`PlanFromHeader`]: the plan named in a request header set by a trusted gateway.

use std::sync::Arc;

use http::header::HeaderName;

use super::names::PlanNames;
use crate::error::ConfigError;
use crate::key::Key;
use crate::plan::{PlanResolver, Resolution};
use crate::request::RequestView;

/// Resolves the plan from a request header, such as `x-plan: pro`.
///
/// **Only for a header your own gateway sets** (and strips from client requests): a client that
/// can send the header chooses its own plan. No header: [`Resolution::Default`]. Sent twice, not
/// text, not a plausible plan name (non-empty printable ASCII without spaces, at most
/// [`Name::MAX_LEN`](crate::Name::MAX_LEN) bytes), or outside
/// [`plans`](Self::plans) when set: [`Resolution::Unknown`]. Nothing read from a header is kept.
///
/// ```
/// use tollgate::key::Key;
/// use tollgate::plan::{PlanFromHeader, PlanResolver, Resolution};
/// use tollgate::RequestView;
///
/// let resolver = PlanFromHeader::new("x-plan").unwrap().plans(["free", "pro"]);
/// let req = http::Request::get("/").header("x-plan", "pro").body(()).unwrap();
/// let plan = resolver.resolve(&RequestView::new(&req), &Key::global());
/// assert!(matches!(plan, Resolution::Plan(p) if p.as_str() == "pro"));
///
/// let req = http::Request::get("/").body(()).unwrap();
/// assert!(matches!(resolver.resolve(&RequestView::new(&req), &Key::global()), Resolution::Default));
///
/// assert!(PlanFromHeader::new("not a header").is_err());
/// ```
#[derive(Debug, Clone)]
pub struct PlanFromHeader {
    name: HeaderName,
    names: Arc<PlanNames>,
}

impl PlanFromHeader {
    /// Reads the plan from header `name` (case-insensitive). An invalid header name is a
    /// [`ConfigError`].
    pub fn new<N>(name: N) -> Result<Self, ConfigError>
    where
        N: TryInto<HeaderName>,
    {
        let name = name.try_into().map_err(|_| {
            ConfigError::new(
                "plan_header",
                "not a valid header name: use letters, digits and `-`, like \"x-plan\"",
            )
        })?;
        Ok(Self {
            name,
            names: Arc::new(PlanNames::open()),
        })
    }

    /// Accepts only these plan names; any other is [`Resolution::Unknown`].
    #[must_use]
    pub fn plans<I>(mut self, names: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.names = Arc::new(PlanNames::fixed(names));
        self
    }

    /// The header read.
    pub fn header_name(&self) -> &HeaderName {
        &self.name
    }
}

impl PlanResolver for PlanFromHeader {
    fn resolve(&self, req: &RequestView<'_>, _key: &Key<'_>) -> Resolution {
        let mut values = req.headers().get_all(&self.name).into_iter();
        let Some(value) = values.next() else {
            return Resolution::Default;
        };
        if values.next().is_some() {
            return Resolution::Unknown;
        }
        match value.to_str() {
            Ok(name) => self.names.resolve(name),
            Err(_) => Resolution::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(resolver: &PlanFromHeader, values: &[&str]) -> Resolution {
        let mut req = http::Request::get("/").body(()).unwrap();
        for v in values {
            req.headers_mut()
                .append("x-plan", http::HeaderValue::from_str(v).unwrap());
        }
        resolver.resolve(&RequestView::new(&req), &Key::global())
    }

    #[test]
    fn header_values() {
        let open = PlanFromHeader::new("X-Plan").unwrap();
        assert_eq!(open.header_name(), "x-plan");
        assert!(matches!(resolve(&open, &["team"]), Resolution::Plan(p) if p.as_str() == "team"));
        assert!(matches!(resolve(&open, &[]), Resolution::Default));
        assert!(matches!(resolve(&open, &["a", "b"]), Resolution::Unknown));
        assert!(matches!(
            resolve(&open, &["two words"]),
            Resolution::Unknown
        ));
        let fixed = open.plans(["free"]);
        assert!(matches!(resolve(&fixed, &["team"]), Resolution::Unknown));
        assert!(matches!(resolve(&fixed, &["free"]), Resolution::Plan(_)));
        let err = PlanFromHeader::new("x plan").unwrap_err();
        assert_eq!(err.field(), "plan_header");
    }
}
