//! Hot reload and per-key overrides of a running [`RateLimitLayer`].

use std::sync::Arc;

use super::audit::{AuditEvent, Change};
use super::builder::compile_limits;
use super::layer::RateLimitLayer;
use super::limit::overrides::key_digest;
use super::limit::{CompiledLimit, Limit};
use super::snapshot::Snapshot;
use crate::error::ConfigError;
use crate::headers::policy_field;
use crate::key::Key;
use crate::rate_limit::Override;
use crate::store::{PlanQuota, Store};

impl<St: Store> RateLimitLayer<St> {
    /// Replaces the layer's limits while it serves, atomically: a request is decided entirely by
    /// the old limits or entirely by the new ones, and reading them takes no lock.
    ///
    /// The new limits are validated as [`build`](crate::RateLimitLayerBuilder::build) validates
    /// them; an invalid set is refused with the error and the old limits keep serving. The
    /// store keeps the state of every limit whose name and algorithm are unchanged
    /// ([`Store::reconfigure`]): a changed quota or plan keeps what each key spent. Emits one
    /// [`AuditEvent`] naming what changed and `source`, and returns it.
    ///
    /// ```
    /// use http::Request;
    /// use tollgate::key::GlobalKey;
    /// use tollgate::{Limit, Quota, RateLimitLayer};
    /// use tower::{service_fn, ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::new(Limit::new("global", Quota::per_minute(2)).key(GlobalKey))?;
    /// let svc = ServiceBuilder::new().layer(layer.clone()).service(service_fn(|_: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// }));
    /// for _ in 0..2 {
    ///     svc.clone().oneshot(Request::new(())).await?;
    /// }
    /// assert_eq!(svc.clone().oneshot(Request::new(())).await?.status(), 429);
    ///
    /// // Raise the limit: the two requests already made stay spent.
    /// let event = layer.reload(vec![Limit::new("global", Quota::per_minute(3)).key(GlobalKey)], "admin")?;
    /// assert!(event.to_string().contains("limit=global quota 2/min -> 3/min"));
    /// assert_eq!(svc.clone().oneshot(Request::new(())).await?.status(), 200);
    /// assert_eq!(svc.clone().oneshot(Request::new(())).await?.status(), 429);
    ///
    /// // An invalid set is refused; the old one keeps serving.
    /// assert!(layer.reload(vec![Limit::new("global", Quota::per_minute(0)).key(GlobalKey)], "admin").is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn reload(
        &self,
        limits: Vec<Limit>,
        source: impl Into<String>,
    ) -> Result<AuditEvent, ConfigError> {
        let source = source.into();
        let mut generation = self
            .shared
            .reloading
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = self.swap(&limits, &source);
        match &result {
            Ok(event) => {
                *generation += 1;
                event.emit(self.shared.audit.as_deref());
            }
            Err(error) => {
                tracing::error!(target: "tollgate::audit", source = %source, error = %error, "rate-limit policy reload refused; the old policy keeps serving");
            }
        }
        result
    }

    fn swap(&self, limits: &[Limit], source: &str) -> Result<AuditEvent, ConfigError> {
        let (mut compiled, specs) = compile_limits(limits)?;
        let old = self.shared.current.load_full();
        let store = old.store.reconfigure(&specs)?;
        for limit in compiled.iter_mut() {
            // The store's tables may have been built for an earlier quota of this limit.
            limit.explicit_quota = true;
        }
        let changes = diff(&old.limits, &compiled);
        // Overrides with a quota follow their limit's algorithm; the others keep their
        // compiled quota (pinned, so its tag and the keys' states under it stay valid).
        self.shared.overrides.recompile(
            |name| {
                compiled
                    .iter()
                    .find(|l| l.name == name)
                    .map(|l| l.algorithm)
            },
            |algorithm, quota| PlanQuota::new(algorithm, quota).ok(),
        );
        let policy_header = policy_field(compiled.iter().map(|l| (l.name.as_str(), &l.quota)));
        self.shared.current.store(Arc::new(Snapshot {
            limits: compiled,
            store,
            policy_header,
        }));
        Ok(AuditEvent::new(source, changes))
    }

    /// Sets a per-key override of limit `limit` (by name) for `key`, exactly as the limit's key
    /// extractor produces it: `Key::string("free-key-1")` for a header, `Key::ip(..)` for an
    /// IPv4 address, and for IPv6 the address grouped to the extractor's prefix (`PeerIp` and
    /// `ClientIp` group to a /64 by default: `2001:db8::/64` is `Key::ip("2001:db8::".parse()?)`);
    /// a scoped key (`RouteKey`, `GrpcMethod`) includes its scope. A custom quota, a block
    /// (`403`) or an exemption. Overrides outlive reloads; a shadow limit never refuses, even
    /// for a blocked key. A custom quota is kept while the override is set (see
    /// [`PlanQuota`]): across reloads that keep the limit's algorithm, and however many other
    /// quotas the process compiles, the key keeps what it spent under it. A reload that changes
    /// the limit's algorithm compiles the quota for the new one (a key whose override quota the
    /// new algorithm refuses is decided as if it had no override, until its algorithm changes
    /// again or the override is set again).
    /// Emits an [`AuditEvent`] (the key appears only as a digest).
    ///
    /// ```
    /// use http::Request;
    /// use tollgate::key::{HeaderKey, Key};
    /// use tollgate::rate_limit::Override;
    /// use tollgate::{Limit, Quota, RateLimitLayer};
    /// use tower::{service_fn, ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::new(
    ///     Limit::new("api", Quota::per_minute(100)).key(HeaderKey::new("x-api-key")?),
    /// )?;
    /// let svc = ServiceBuilder::new().layer(layer.clone()).service(service_fn(|_: Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// }));
    /// let call = |key: &str| Request::get("/").header("x-api-key", key).body(()).unwrap();
    ///
    /// layer.set_override("api", Key::string("abuser"), Override::Block, "incident 42")?;
    /// assert_eq!(svc.clone().oneshot(call("abuser")).await?.status(), 403);
    /// layer.set_override("api", Key::string("big-co"), Override::Quota(Quota::per_minute(10_000)), "sales")?;
    /// assert_eq!(svc.clone().oneshot(call("big-co")).await?.headers()["x-ratelimit-limit"], "10000");
    /// assert!(layer.remove_override("api", Key::string("abuser"), "incident 42 closed"));
    /// assert_eq!(svc.clone().oneshot(call("abuser")).await?.status(), 200);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_override(
        &self,
        limit: &str,
        key: Key<'_>,
        value: Override,
        source: impl Into<String>,
    ) -> Result<AuditEvent, ConfigError> {
        // Not while a reload recompiles overrides for new algorithms.
        let _reloading = self
            .shared
            .reloading
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let snapshot = self.shared.current.load();
        let found = snapshot
            .limits
            .iter()
            .find(|l| l.name.as_str() == limit)
            .ok_or_else(|| {
                ConfigError::new(
                    "override.limit",
                    format!(
                        "no limit named {limit:?}; the layer has {}",
                        names(&snapshot.limits)
                    ),
                )
            })?;
        let quota = match value {
            Override::Quota(q) => Some(PlanQuota::new(found.algorithm, q).map_err(|e| {
                ConfigError::new(
                    "override.quota",
                    format!("limit \"{limit}\": {}", e.message()),
                )
            })?),
            _ => None,
        };
        self.shared.overrides.set(found.name, &key, value, quota);
        let event = AuditEvent::new(
            source,
            vec![Change::OverrideSet {
                limit: found.name,
                key_digest: key_digest(&key),
                value,
            }],
        );
        event.emit(self.shared.audit.as_deref());
        Ok(event)
    }

    /// Removes the override of `key` for limit `limit`; returns whether there was one. Emits an
    /// [`AuditEvent`] when there was.
    pub fn remove_override(&self, limit: &str, key: Key<'_>, source: impl Into<String>) -> bool {
        let _reloading = self
            .shared
            .reloading
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let name = {
            let snapshot = self.shared.current.load();
            snapshot
                .limits
                .iter()
                .find(|l| l.name.as_str() == limit)
                .map(|l| l.name)
        };
        let Some(name) = name else { return false };
        let removed = self.shared.overrides.remove(name, &key);
        if removed {
            AuditEvent::new(
                source,
                vec![Change::OverrideRemoved {
                    limit: name,
                    key_digest: key_digest(&key),
                }],
            )
            .emit(self.shared.audit.as_deref());
        }
        removed
    }
}

fn names(limits: &[CompiledLimit]) -> String {
    limits
        .iter()
        .map(|l| format!("{:?}", l.name.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What changed between two sets of limits.
fn diff(old: &[CompiledLimit], new: &[CompiledLimit]) -> Vec<Change> {
    let mut changes = Vec::new();
    for n in new {
        let Some(o) = old.iter().find(|o| o.name == n.name) else {
            changes.push(Change::LimitAdded {
                limit: n.name,
                quota: n.quota,
                mode: n.mode,
            });
            continue;
        };
        if o.algorithm != n.algorithm {
            changes.push(Change::AlgorithmChanged {
                limit: n.name,
                old: o.algorithm,
                new: n.algorithm,
            });
        }
        if o.quota != n.quota {
            changes.push(Change::QuotaChanged {
                limit: n.name,
                plan: None,
                old: o.quota,
                new: n.quota,
            });
        }
        if o.mode != n.mode {
            changes.push(Change::ModeChanged {
                limit: n.name,
                old: o.mode,
                new: n.mode,
            });
        }
        for p in n.plans.iter() {
            match o.plans.iter().find(|op| op.name == p.name) {
                None => changes.push(Change::PlanAdded {
                    limit: n.name,
                    plan: p.name,
                    quota: *p.quota.quota(),
                }),
                Some(op) if op.quota.quota() != p.quota.quota() => {
                    changes.push(Change::QuotaChanged {
                        limit: n.name,
                        plan: Some(p.name),
                        old: *op.quota.quota(),
                        new: *p.quota.quota(),
                    })
                }
                Some(_) => {}
            }
        }
        for op in o.plans.iter() {
            if !n.plans.iter().any(|p| p.name == op.name) {
                changes.push(Change::PlanRemoved {
                    limit: n.name,
                    plan: op.name,
                });
            }
        }
    }
    for o in old {
        if !new.iter().any(|n| n.name == o.name) {
            changes.push(Change::LimitRemoved { limit: o.name });
        }
    }
    changes
}
