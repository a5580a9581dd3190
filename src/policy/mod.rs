//! Policies as data: limits described in a file (TOML, or any serde format), compiled into the
//! same [`Limit`]s as the builder API, and reloaded while serving.
//!
//! Requires the `serde` feature; `toml` adds [`Policy::from_toml_str`] and
//! [`Policy::from_toml_file`] with line and column in every error.
//!
//! # The format
//!
//! ```toml
//! [[limit]]
//! name = "api"                    # unique; sent in headers and bodies
//! algorithm = "fixed_window"      # token_bucket (default), gcra, fixed_window, sliding_window, sliding_log, leaky_bucket
//! key = { header = "x-api-key" }  # "peer_ip", "global", "principal", { header = .. },
//!                                 # { client_ip = { trusted_proxies = ["10.0.0.0/8"] } }
//! routes = ["GET /api/*"]         # [METHOD ]PATH; `*` = one segment, trailing `/*` = anything below
//! on_missing_key = 401            # a status, "reject" (400) or "skip"
//! plans.free = { quota = "5/min", link = "https://example.com/upgrade" }
//! plans.pro = "20/min"
//! assign = { "free-key-1" = "free", "pro-key-1" = "pro" }  # or plan_header = "x-plan", or plan_extension = true
//! on_unknown_plan = 401           # or "default" (the limit's own quota)
//!
//! [[limit]]
//! name = "login"
//! quota = "3/min"                 # "10/s burst 50"; several windows: "10/s; 1000/h; 10000/d"
//! key = { client_ip = { trusted_proxies = ["127.0.0.1/32"] } }
//! routes = ["POST /login"]
//! charge = { only_status = [401] }   # or { refund_status = ["5xx"] }
//! on_store_error = "closed retry 5s" # "open", "closed", "local share 0.5"
//! cost = 1                        # the default cost; per route: costs = { "POST /upload" = 10, "/search" = 5 }
//! mode = "enforce"                # or "shadow" (+ shadow_headers = true)
//! ```
//!
//! **Several windows** (`quota = "10/s; 1000/h; 10000/d"`) make one limit per window, named
//! `NAME/PERIOD`: `api/s`, `api/h`, `api/d` (`api/15min` for `5/15min`). A request must pass
//! all of them, as with any limits of one layer. Every plan of such a limit lists the same
//! periods.
//!
//! **The limit's own quota** (`quota`) counts requests for which no plan applies; with plans
//! it may be replaced by `default_plan = "free"`, or left out when `on_unknown_plan` refuses
//! and plans come from `assign` (then no request is ever counted at it).
//!
//! **Keys**: `principal` reads a [`PrincipalId`] that authentication middleware put in the
//! request extensions; `plan_extension = true` reads a
//! [`plan::AssignedPlan`](crate::plan::AssignedPlan).
//!
//! # Examples
//!
//! From TOML (feature `toml`):
//!
//! ```
//! # #[cfg(feature = "toml")] {
//! use tollgate::policy::Policy;
//! use tollgate::RateLimitLayer;
//!
//! let policy = Policy::from_toml_str(r#"
//!     [[limit]]
//!     name = "per-ip"
//!     quota = "10/s burst 20; 1000/h"
//!     key = "peer_ip"
//! "#, "inline").unwrap();
//! let limits = policy.limits().unwrap();
//! let names: Vec<_> = limits.iter().map(|l| l.name().as_str().to_owned()).collect();
//! assert_eq!(names, ["per-ip/s", "per-ip/h"]);
//! let layer = RateLimitLayer::builder().limits(limits).build().unwrap();
//! # let _ = layer;
//! # }
//! ```
//!
//! From JSON (or YAML, ...) through serde, naming the source for errors:
//!
//! ```
//! use tollgate::policy::Policy;
//!
//! let json = r#"{ "limit": [ { "name": "login", "quota": "3/min", "key": "peer_ip",
//!                              "routes": ["POST /login"], "charge": { "only_status": [401] } } ] }"#;
//! let policy: Policy = serde_json::from_str(json).unwrap();
//! let policy = policy.with_source_name("policy.json");
//! assert_eq!(policy.limits().unwrap().len(), 1);
//! ```
//!
//! Reloading when the file changes: see [`PolicyWatcher`].

mod compile;
mod error;
mod model;
mod route;
mod text;
#[cfg(feature = "toml")]
mod toml_source;
mod watch;

use std::sync::Arc;

use serde::Deserialize;

use crate::rate_limit::Limit;

pub use error::PolicyError;
pub use watch::{PolicyWatcher, WatchOutcome};

/// The authenticated caller's identity, put in the request extensions by authentication
/// middleware; a policy's `key = "principal"` counts requests per `PrincipalId`.
///
/// ```
/// use tollgate::policy::PrincipalId;
///
/// let mut req = http::Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert(PrincipalId::new("user-42"));
/// assert_eq!(req.extensions().get::<PrincipalId>().unwrap().as_str(), "user-42");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PrincipalId(String);

impl PrincipalId {
    /// The caller `id` (a user id, a tenant, an API client).
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A policy: limits described as data. See the [module docs](self) for the format.
///
/// Deserialize it with any serde format, or read TOML with [`Policy::from_toml_str`] /
/// [`Policy::from_toml_file`]; [`Policy::limits`] compiles it, for
/// [`RateLimitLayer::builder`](crate::RateLimitLayer::builder) or
/// [`RateLimitLayer::reload`](crate::RateLimitLayer::reload).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(rename = "limit", alias = "limits", default)]
    limits: Vec<model::LimitDoc>,
    #[serde(skip)]
    source: Source,
}

/// Where a policy came from, for errors.
#[derive(Debug, Clone)]
struct Source {
    name: Arc<str>,
    /// The TOML text, to find the line and column of a fault.
    #[cfg_attr(not(feature = "toml"), allow(dead_code))]
    toml: Option<Arc<str>>,
}

impl Default for Source {
    fn default() -> Self {
        Self {
            name: Arc::from("policy"),
            toml: None,
        }
    }
}

impl Policy {
    /// Names the policy's source (a file name) in its errors (default `"policy"`).
    #[must_use]
    pub fn with_source_name(mut self, name: impl AsRef<str>) -> Self {
        self.source.name = Arc::from(name.as_ref());
        self
    }

    /// The source name errors carry.
    pub fn source_name(&self) -> &str {
        &self.source.name
    }

    /// The number of `[[limit]]` entries (a limit with several windows counts once).
    pub fn len(&self) -> usize {
        self.limits.len()
    }

    /// Whether the policy has no limits.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// Compiles the policy into limits, validating every field. An error names the source,
    /// the limit and the field (with line and column for TOML) and says what to write instead.
    pub fn limits(&self) -> Result<Vec<Limit>, PolicyError> {
        if self.limits.is_empty() {
            return Err(PolicyError::new(
                &*self.source.name,
                None,
                "limit",
                "the policy has no limits: add a [[limit]] table with a name, a quota and a key",
            ));
        }
        compile::compile(&self.limits).map_err(|fault| self.fault_error(fault))
    }

    fn fault_error(&self, fault: compile::Fault) -> PolicyError {
        let limit = self
            .limits
            .get(fault.limit)
            .map(|l| l.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("#{}", fault.limit + 1));
        let error = PolicyError::new(
            &*self.source.name,
            Some(limit),
            compile::path_text(&fault.path),
            fault.message,
        );
        #[cfg(feature = "toml")]
        if let Some(text) = &self.source.toml {
            return error.at(toml_source::locate(text, fault.limit, &fault.path));
        }
        error
    }
}
