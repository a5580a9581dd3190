//! [`Plan`]: one named quota of a limit.

use std::fmt;
use std::sync::Arc;

use crate::decision::Name;
use crate::quota::Quota;

/// One named quota of a [`Limit`](crate::Limit): "free" at 100 per hour, "pro" at 1 000.
///
/// A limit's plans share its algorithm, key, cost and state: a key whose plan changes keeps what
/// it spent (see [`PlanQuota`](crate::store::PlanQuota) and each algorithm's "Plan changes").
///
/// ```
/// use tollgate::plan::Plan;
/// use tollgate::Quota;
///
/// let free = Plan::new("free", Quota::per_hour(100)).link("https://example.com/upgrade");
/// assert_eq!(free.name().as_str(), "free");
/// assert_eq!(free.link_url(), Some("https://example.com/upgrade"));
/// assert_eq!(*free.quota(), Quota::per_hour(100));
/// ```
#[derive(Clone, PartialEq)]
pub struct Plan {
    name: Name,
    quota: Quota,
    link: Option<Arc<str>>,
}

impl Plan {
    /// A plan named `name` (printable ASCII without spaces, at most
    /// [`Name::MAX_LEN`] (47) bytes, unique within its limit) granting `quota`. The
    /// limit's build refuses another name with a [`ConfigError`](crate::ConfigError) naming
    /// `limit.plans.name`.
    pub fn new(name: impl AsRef<str>, quota: Quota) -> Self {
        Self {
            name: Name::new(name),
            quota,
            link: None,
        }
    }

    /// A link sent with this plan's rejections (the problem+json `link` member), e.g. where to
    /// upgrade.
    #[must_use]
    pub fn link(mut self, url: impl Into<String>) -> Self {
        self.link = Some(Arc::from(url.into()));
        self
    }

    /// The plan's name.
    pub fn name(&self) -> Name {
        self.name
    }

    /// The plan's quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The link sent with this plan's rejections, if any.
    pub fn link_url(&self) -> Option<&str> {
        self.link.as_deref()
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("link", &self.link)
            .finish()
    }
}
