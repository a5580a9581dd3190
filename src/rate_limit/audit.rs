//! [`AuditEvent`]: what a reload or a runtime override changed, when, and by which source.

use std::fmt;
use std::time::SystemTime;

use super::limit::{Mode, Override};
use crate::algorithm::AlgorithmKind;
use crate::decision::Name;
use crate::quota::Quota;

pub(crate) type AuditFn = dyn Fn(&AuditEvent) + Send + Sync;

/// One change of a reload or an override.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Change {
    /// A limit that did not exist before.
    LimitAdded {
        /// The limit.
        limit: Name,
        /// Its own quota.
        quota: Quota,
        /// Its mode.
        mode: Mode,
    },
    /// A limit that no longer exists (its counters are dropped).
    LimitRemoved {
        /// The limit.
        limit: Name,
    },
    /// A quota changed: the limit's own (`plan` is `None`) or one plan's. Keys keep what they
    /// spent.
    QuotaChanged {
        /// The limit.
        limit: Name,
        /// The plan, or `None` for the limit's own quota.
        plan: Option<Name>,
        /// Before.
        old: Quota,
        /// After.
        new: Quota,
    },
    /// A plan that did not exist before.
    PlanAdded {
        /// The limit.
        limit: Name,
        /// The plan.
        plan: Name,
        /// Its quota.
        quota: Quota,
    },
    /// A plan that no longer exists.
    PlanRemoved {
        /// The limit.
        limit: Name,
        /// The plan.
        plan: Name,
    },
    /// The limit moved between enforce and shadow.
    ModeChanged {
        /// The limit.
        limit: Name,
        /// Before.
        old: Mode,
        /// After.
        new: Mode,
    },
    /// The algorithm changed: the limit starts over with fresh state.
    AlgorithmChanged {
        /// The limit.
        limit: Name,
        /// Before.
        old: AlgorithmKind,
        /// After.
        new: AlgorithmKind,
    },
    /// A per-key override was set. The key is named by a digest, never in clear.
    OverrideSet {
        /// The limit.
        limit: Name,
        /// A 64-bit digest of the key (hex), to correlate events without logging the key.
        key_digest: String,
        /// The override.
        value: Override,
    },
    /// A per-key override was removed.
    OverrideRemoved {
        /// The limit.
        limit: Name,
        /// A 64-bit digest of the key (hex).
        key_digest: String,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::LimitAdded { limit, quota, mode } => {
                write!(f, "limit={limit} added quota={quota} mode={mode}")
            }
            Change::LimitRemoved { limit } => write!(f, "limit={limit} removed"),
            Change::QuotaChanged {
                limit,
                plan,
                old,
                new,
            } => match plan {
                Some(plan) => write!(f, "limit={limit} plan={plan} quota {old} -> {new}"),
                None => write!(f, "limit={limit} quota {old} -> {new}"),
            },
            Change::PlanAdded { limit, plan, quota } => {
                write!(f, "limit={limit} plan={plan} added quota={quota}")
            }
            Change::PlanRemoved { limit, plan } => write!(f, "limit={limit} plan={plan} removed"),
            Change::ModeChanged { limit, old, new } => {
                write!(f, "limit={limit} mode {old} -> {new}")
            }
            Change::AlgorithmChanged { limit, old, new } => {
                write!(
                    f,
                    "limit={limit} algorithm {old} -> {new} (state starts over)"
                )
            }
            Change::OverrideSet {
                limit,
                key_digest,
                value,
            } => {
                let value = match value {
                    Override::Quota(q) => format!("quota={q}"),
                    Override::Block => String::from("block"),
                    Override::Exempt => String::from("exempt"),
                };
                write!(f, "limit={limit} key#{key_digest} override {value}")
            }
            Change::OverrideRemoved { limit, key_digest } => {
                write!(f, "limit={limit} key#{key_digest} override removed")
            }
        }
    }
}

/// What one reload or override changed, when, and by which source: emitted once per reload
/// (even one that changed nothing) and once per override, as a `tracing` event at `INFO` on
/// target `tollgate::audit` and to the callback set with
/// [`RateLimitLayerBuilder::on_audit`](crate::RateLimitLayerBuilder::on_audit).
///
/// ```
/// use tollgate::rate_limit::{AuditEvent, Change};
/// use tollgate::{Name, Quota};
///
/// let event = AuditEvent::new(
///     "SIGHUP examples/plans.toml",
///     vec![Change::QuotaChanged {
///         limit: Name::new("api"),
///         plan: Some(Name::new("free")),
///         old: Quota::per_minute(5),
///         new: Quota::per_minute(10),
///     }],
/// );
/// assert!(event.to_string().contains("limit=api plan=free quota 5/min -> 10/min"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEvent {
    source: String,
    at: SystemTime,
    changes: Vec<Change>,
}

impl AuditEvent {
    /// An event from `source` (e.g. `"SIGHUP /etc/app/policy.toml"`, `"admin API"`), now.
    pub fn new(source: impl Into<String>, changes: Vec<Change>) -> Self {
        Self {
            source: source.into(),
            at: SystemTime::now(),
            changes,
        }
    }

    /// Who or what made the change.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// When (wall clock).
    pub fn at(&self) -> SystemTime {
        self.at
    }

    /// What changed (empty: a reload that changed nothing).
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    pub(crate) fn emit(&self, sink: Option<&AuditFn>) {
        tracing::info!(target: "tollgate::audit", source = %self.source, changes = self.changes.len(), summary = %self, "rate-limit policy changed");
        if let Some(sink) = sink {
            sink(self);
        }
    }
}

impl fmt::Display for AuditEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let at = crate::response::rfc3339::format_utc(secs);
        write!(f, "audit at={at} source={:?}", self.source)?;
        if self.changes.is_empty() {
            return f.write_str(" no changes");
        }
        for (i, change) in self.changes.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            write!(f, "{change}")?;
        }
        Ok(())
    }
}
