//! Leases for the hybrid store ([`crate::store::hybrid`]): one script call that takes up to
//! `want` units of one key's budget at once, on this store's connection, circuit breakers and
//! timeout.
//!
//! The lease script is this store's script with `scripts/lease.lua` in place of the driver, so
//! a lease runs the very functions (load, decide, apply, refund) a check runs, on the same keys.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::{ErrorKind, ServerErrorKind, Value};

use super::call::{kind_of, unix_micros};
use super::conn::Conn;
use super::fallback::{Fallback, LocalCheck};
use super::script::{LuaScript, LEASE_DRIVER};
use super::store::{Inner, RedisStore};
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::key::Key;
use crate::store::{Decisions, FailurePolicy, LimitCheck, MAX_LIMITS};

/// A store's lease script: its script with `scripts/lease.lua` in place of the driver.
#[derive(Debug, Clone)]
pub(crate) struct LeaseScript(LuaScript);

/// One lease call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseRequest<'k, 'a> {
    pub(crate) limit: usize,
    pub(crate) key: &'k Key<'a>,
    /// The most units to lease.
    pub(crate) want: u64,
    /// The fewest worth leasing (the request's cost).
    pub(crate) min: u64,
    /// On a refusal, how many units to wait for (at least `min`).
    pub(crate) wait: u64,
    /// Unused units of an earlier lease, given back first.
    pub(crate) give: u64,
    /// When (Redis time, µs) the units given back were leased.
    pub(crate) given_at: u64,
    /// Units admitted locally while Redis was unreachable, charged first.
    pub(crate) owed: u64,
    /// Units the caller knows the key had spent at Redis time `known_at` (µs), charged at that
    /// time if the key's state is gone (see "The lease call" in `docs/internals/redis-script.md`);
    /// 0: nothing known.
    pub(crate) known_spent: u64,
    /// Redis time (µs) of what `known_spent` says.
    pub(crate) known_at: u64,
    /// Redis time (µs) until which `known_spent` may be charged; 0: no end.
    pub(crate) known_until: u64,
}

/// Redis's answer to a lease.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseReply {
    /// Redis time (µs) of the lease.
    pub(crate) now: u64,
    /// Units leased (0: none; `min` did not fit, see `decision`).
    pub(crate) granted: u64,
    /// The key after the lease: allowed (remaining after the grant) or rejected (retry until
    /// `min` fits).
    pub(crate) decision: Decision,
}

impl RedisStore {
    /// The lease script for this store's limits, loaded on the current runtime's connection in
    /// the background. Always `Some`.
    pub(crate) fn lease_script(&self) -> Option<LeaseScript> {
        let script = LeaseScript(self.inner.script.with_driver(LEASE_DRIVER));
        if !self.inner.cluster
            && tokio::runtime::Handle::try_current().is_ok()
            && let Ok(handle) = self.inner.handle()
        {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(script.0.code());
            tokio::spawn(async move {
                let _ = handle.conn.query(&load).await;
            });
        }
        Some(script)
    }

    /// How long a check waits for Redis: the timeout, or the connect timeout until Redis has
    /// answered once.
    pub(crate) fn wait_timeout(&self) -> Duration {
        let inner = &self.inner;
        if inner.connected.load(Ordering::Relaxed) {
            inner.timeout
        } else {
            inner.timeout.max(inner.connect_timeout)
        }
    }

    /// The name of limit `limit`.
    pub(crate) fn name_of(&self, limit: usize) -> Option<crate::decision::Name> {
        self.inner.limits.get(limit).map(|l| l.name)
    }

    /// The failure policy of limit `limit`.
    pub(crate) fn policy_of(&self, limit: usize) -> Option<FailurePolicy> {
        self.inner.policies.get(limit).copied()
    }

    /// Leases units of one key: `Ok(None)` when the key is written at a plan's quota (check it
    /// plainly). Goes through the node's circuit breaker (open: fails at once), fails after
    /// `deadline` (or the store's timeout, if longer), and counts failures as a check does.
    pub(crate) async fn lease(
        &self,
        script: &LeaseScript,
        req: LeaseRequest<'_, '_>,
        deadline: Duration,
    ) -> Result<Option<LeaseReply>, StoreError> {
        let inner = &self.inner;
        let info = inner
            .limits
            .get(req.limit)
            .ok_or_else(|| StoreError::new(StoreErrorKind::Other, "lease for an unknown limit"))?;
        let enc = inner
            .keys
            .encode(info.short, &info.name_enc, req.key, &mut Vec::new());
        let (breaker, addr) = if inner.cluster {
            inner.node_of(&enc.tag)
        } else {
            (inner.breakers.default_breaker().clone(), None)
        };
        if breaker.is_open() {
            inner.stats.add_short_circuited();
            inner.spawn_probe(&breaker, addr);
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "circuit breaker open for this redis node",
            ));
        }
        let now = inner.clock.as_ref().map(|c| unix_micros(&**c));
        let timeout = self.wait_timeout().max(deadline);
        let result = match inner.handle() {
            Err(e) => Err(e),
            Ok(handle) => {
                match tokio::time::timeout(timeout, send(&handle.conn, script, &enc.key, &req, now))
                    .await
                {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::new(
                        StoreErrorKind::Timeout,
                        format!("redis did not answer within {timeout:?}"),
                    )),
                }
            }
        };
        match result {
            Ok(ints) => {
                breaker.on_success();
                inner.connected.store(true, Ordering::Relaxed);
                parse(inner, req.limit, &ints)
            }
            Err(err) => {
                crate::metrics::record_store_error(err.kind());
                tracing::warn!(error = %err, node = addr.as_deref(), "redis lease call failed");
                inner
                    .stats
                    .on_failure(err.kind() == StoreErrorKind::Timeout);
                if breaker.on_failure(inner.breaker_threshold, &inner.stats) {
                    tracing::warn!(
                        threshold = inner.breaker_threshold,
                        "redis circuit breaker opened; deciding by failure policy until a probe succeeds"
                    );
                    inner.spawn_probe(&breaker, addr);
                }
                Err(err)
            }
        }
    }

    /// Decides `checks` by their limits' failure policies, as the store does when Redis cannot
    /// decide (`error`: why).
    pub(crate) fn decide_by_policy(
        &self,
        checks: &[LimitCheck<'_>],
        error: StoreError,
    ) -> Result<Decisions, StoreError> {
        let mut limits = [0usize; MAX_LIMITS];
        for (slot, c) in limits.iter_mut().zip(checks) {
            *slot = c.limit;
        }
        let mut fallback = Fallback::new(limits, checks.len().min(MAX_LIMITS));
        fallback.error = Some(error);
        let local: Vec<LocalCheck<'_>> = checks.iter().map(LocalCheck::from).collect();
        self.inner.degrade(fallback, &local)
    }
}

async fn send(
    conn: &Conn,
    script: &LeaseScript,
    key: &str,
    req: &LeaseRequest<'_, '_>,
    now: Option<u64>,
) -> Result<Vec<i64>, StoreError> {
    // The key's birth record (scripts/lease.lua): the same hash tag, so the same slot; `!` never
    // ends an encoded client key (it is percent-encoded), so the name is the record's alone.
    let born = format!("{key}!");
    let pack = |cmd: &mut redis::Cmd| {
        cmd.arg(2)
            .arg(key)
            .arg(&born)
            .arg(req.limit)
            .arg(req.want)
            .arg(if req.wait > req.min {
                format!("{}:{}", req.min, req.wait)
            } else {
                req.min.to_string()
            })
            .arg(req.give)
            .arg(req.given_at)
            .arg(req.owed);
        match now {
            Some(t) => cmd.arg(t),
            None => cmd.arg(""),
        };
        cmd.arg(req.known_spent)
            .arg(req.known_at)
            .arg(req.known_until);
    };
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.0.sha());
    pack(&mut cmd);
    let value = match conn.query(&cmd).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(script.0.code());
            pack(&mut cmd);
            conn.query(&cmd).await
        }
        other => other,
    }
    .map_err(|e| StoreError::new(kind_of(&e), format!("redis: {e}")))?;
    let Value::BulkString(bytes) = value else {
        return Err(StoreError::new(
            StoreErrorKind::InvalidResponse,
            format!("expected a string of integers, got {value:?}"),
        ));
    };
    if bytes.len() != 48 {
        return Err(StoreError::new(
            StoreErrorKind::InvalidResponse,
            format!("a lease reply of {} bytes", bytes.len()),
        ));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

fn parse(inner: &Arc<Inner>, limit: usize, r: &[i64]) -> Result<Option<LeaseReply>, StoreError> {
    let &[now, granted, remaining, reset, retry, corrupt] = r else {
        return Err(StoreError::new(
            StoreErrorKind::InvalidResponse,
            "a lease reply of the wrong length",
        ));
    };
    if granted == -2 {
        return Ok(None);
    }
    let info = &inner.limits[limit];
    let bad = || {
        StoreError::new(
            StoreErrorKind::InvalidResponse,
            format!("malformed lease reply {r:?}"),
        )
    };
    let (Ok(now), Ok(granted), Ok(remaining), Ok(reset)) = (
        u64::try_from(now),
        u64::try_from(granted),
        u64::try_from(remaining),
        u64::try_from(reset),
    ) else {
        return Err(bad());
    };
    if corrupt == 1 {
        inner.stats.add_corrupt_reset();
        tracing::warn!(policy = %info.name, "rate-limit key held unreadable state; it was reset to a fresh key");
    }
    let reset = Duration::from_micros(reset);
    let decision = match (granted, retry) {
        (g, _) if g > 0 => Decision::allowed_with(info.limit, remaining, reset),
        (0, -1) => Decision::impossible(info.limit, remaining, reset),
        (0, retry) if retry > 0 => Decision::rejected(
            info.limit,
            remaining,
            reset,
            Duration::from_micros(retry.unsigned_abs()),
        ),
        _ => return Err(bad()),
    }
    .with_policy(info.name);
    Ok(Some(LeaseReply {
        now,
        granted,
        decision,
    }))
}

#[cfg(test)]
mod tests {
    use super::LEASE_DRIVER;
    use crate::algorithm::AlgorithmKind;
    use crate::store::redis::RedisBackend;
    use crate::store::{Backend, FailurePolicy, LimitSpec};
    use crate::{Name, Quota};

    #[test]
    fn every_store_script_has_a_lease_variant() {
        // The lease script is the store's script with the lease driver in place of the check
        // driver, for every algorithm.
        let limits: Vec<LimitSpec> = AlgorithmKind::ALL
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                LimitSpec::new(Name::new(format!("l{i}")), Quota::per_minute(60), k)
                    .on_store_error(FailurePolicy::Open)
            })
            .collect();
        let store = RedisBackend::new("redis://127.0.0.1:1")
            .build(&limits)
            .unwrap();
        let script = store.lease_script().expect("a lease script");
        assert!(script.0.code().ends_with(LEASE_DRIVER));
        assert!(!script.0.code().contains("local refund = ARGV[1] == 'r'"));
        assert!(script.0.code().contains("local function LIMIT(i)"));
        assert_eq!(script.0.sha().len(), 40);
    }
}
