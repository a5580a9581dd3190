//! Script calls: sends a request's calls (a check joins its node's batcher, a refund goes on its
//! own) within the timeout, through each node's circuit breaker; parses the replies into
//! decisions; hands what Redis could not decide to the failure policies; and refunds the groups a
//! Cluster request charged when another of its groups rejects it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::batcher::{BatchError, Job};
use super::breaker::Breaker;
use super::conn::Conn;
use super::fallback::{collect, Fallback, LocalCheck};
use super::routing::{positions_of, ScriptCalls};
use super::script::{decision, reply_ints, CallKind, Group, Ints};
use super::store::Inner;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{StoreError, StoreErrorKind};
use crate::store::{Decisions, MAX_LIMITS};

/// A group as Redis answered it, with its check positions (empty: every check, in order).
type Reply = (Group, Vec<usize>, Result<Ints, StoreError>);

/// The replies of a request's script calls, in their order.
type Replies = std::iter::Chain<std::option::IntoIter<Reply>, std::vec::IntoIter<Reply>>;

/// A group Redis charged for a request whose limits span several hash slots: refunded if
/// another slot's group rejects the request (see [the module docs](super#several-limits-per-request)).
struct Reservation {
    group: Group,
    /// The time Redis charged it at.
    now: u64,
    /// The check index of each of its limits.
    positions: Vec<usize>,
}

impl Inner {
    /// Decides `calls`, whose checks are of `limits` (the first `n`): by Redis, and by their
    /// failure policies those Redis could not decide (`local`: those of a local fallback).
    pub(super) async fn run(
        self: Arc<Self>,
        calls: ScriptCalls,
        (limits, n): ([usize; MAX_LIMITS], usize),
        local: Vec<LocalCheck<'static>>,
    ) -> Result<Decisions, StoreError> {
        let several = matches!(calls, ScriptCalls::Several(_));
        let replies = self.call_groups(calls, CallKind::Check).await;
        // Built after the call, so the future does not carry it while it waits.
        let mut fb = Fallback::new(limits, n);
        // The earliest time Redis decided a group at (each master of a Cluster reads its own).
        let mut decided_at: Option<u64> = None;
        // Groups Redis charged: refunded if the request ends up rejected.
        let mut reservations = Vec::new();
        for (group, positions, result) in replies {
            let positions = positions_of(&group, &positions);
            let parsed =
                result.and_then(|ints| self.parse_group(&group, positions, &ints, &mut fb.got));
            if let Ok((now, _)) = parsed {
                decided_at = Some(decided_at.map_or(now, |at| at.min(now)));
            }
            match parsed {
                // Only a request split over several slots can need a refund.
                Ok((now, true)) if several => reservations.push(Reservation {
                    group,
                    now,
                    positions: positions.to_vec(),
                }),
                Ok(_) => {}
                Err(e) => {
                    for &p in positions {
                        fb.got[p] = None;
                    }
                    fb.error.get_or_insert(e);
                }
            }
        }
        let mut result = if fb.error.is_none() {
            let mut decisions = collect(&fb);
            // Only when Redis decided every limit: a limit decided by its failure policy was
            // not charged in Redis, and a refund must not give back what was never taken.
            if let Some(at) = decided_at {
                decisions.set_decided_at(at);
            }
            Ok(decisions)
        } else {
            self.degrade(fb, &local)
        };
        let rejected = result.as_ref().map_or(true, |d| !d.allowed());
        if rejected && !reservations.is_empty() {
            // Boxed, as rare and large (see `call_one`).
            Box::pin(self.refund_reservations(reservations, &mut result)).await;
        }
        result
    }

    /// [`Store::refund`]: sends each group's refund (concurrently on a Cluster) and reports every
    /// limit as it stands after it. Fails with the first error; the groups that answered were
    /// refunded all the same.
    pub(super) async fn give_back(
        self: Arc<Self>,
        calls: ScriptCalls,
        n: usize,
    ) -> Result<Decisions, StoreError> {
        let replies = self.call_groups(calls, CallKind::Refund).await;
        let mut got = [None; MAX_LIMITS];
        let mut error = None;
        let mut at: Option<u64> = None;
        for (group, positions, result) in replies {
            let positions = positions_of(&group, &positions);
            let parsed =
                result.and_then(|ints| self.parse_group(&group, positions, &ints, &mut got));
            self.stats.add_refund(parsed.is_ok());
            match parsed {
                Ok((now, _)) => at = Some(at.map_or(now, |a| a.min(now))),
                Err(e) => {
                    tracing::warn!(keys = ?group.keys, error = %e, "could not refund a reservation; it stays spent until it refills");
                    error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        let mut decisions = Decisions::new();
        for d in &got[..n] {
            decisions.push(d.ok_or_else(|| {
                StoreError::new(
                    StoreErrorKind::InvalidResponse,
                    "a refund left a limit unreported",
                )
            })?);
        }
        if let Some(at) = at {
            decisions.set_decided_at(at);
        }
        Ok(decisions)
    }

    /// Gives back what Redis charged for a request that is, as a whole, not allowed (Cluster,
    /// limits in several slots), and reports the refunded limits as they now stand.
    async fn refund_reservations(
        self: &Arc<Self>,
        reservations: Vec<Reservation>,
        result: &mut Result<Decisions, StoreError>,
    ) {
        // Applied now (the store's clock, or the server's TIME in the script), as of the
        // reservation's time: the buckets give back only what has not refilled since.
        let now = self.clock.as_ref().map(|c| unix_micros(&**c));
        let calls = reservations.iter().map(|a| {
            let mut group = a.group.clone();
            group.now = now;
            group.reserved_at = Some(a.now);
            async move {
                let conn = self.handle().ok()?.conn;
                let deadline = deadline_after(self.timeout);
                let value = tokio::time::timeout_at(
                    deadline,
                    conn.eval(
                        &self.script,
                        CallKind::Refund,
                        std::iter::once(&group),
                        deadline,
                    ),
                )
                .await
                .ok()?
                .ok()?;
                reply_ints(value).ok()
            }
        });
        let replies = futures_util::future::join_all(calls).await;
        for (a, reply) in reservations.iter().zip(replies) {
            self.stats.add_refund(reply.is_some());
            let Some(ints) = reply else {
                tracing::warn!(
                    keys = ?a.group.keys,
                    "could not refund a reservation; it stays spent until it refills"
                );
                continue;
            };
            if let Ok(decisions) = result {
                let mut got = [None; MAX_LIMITS];
                if self
                    .parse_group(&a.group, &a.positions, &ints, &mut got)
                    .is_ok()
                {
                    for &p in &a.positions {
                        if let Some(d) = got[p] {
                            decisions.as_mut_slice()[p] = d;
                        }
                    }
                }
            }
        }
    }

    /// Parses one group's reply into `got`; returns the time it used and whether it charged.
    fn parse_group(
        &self,
        group: &Group,
        positions: &[usize],
        ints: &[i64],
        got: &mut [Option<Decision>; MAX_LIMITS],
    ) -> Result<(u64, bool), StoreError> {
        if ints.len() != group.reply_len() {
            return Err(StoreError::new(
                StoreErrorKind::InvalidResponse,
                format!(
                    "expected {} integers, got {}",
                    group.reply_len(),
                    ints.len()
                ),
            ));
        }
        let now = u64::try_from(ints[0]).unwrap_or(0);
        let mut all = true;
        for (j, (&p, l)) in positions.iter().zip(&group.limits).enumerate() {
            let info = &self.limits[l.limit];
            let (d, corrupt) = decision(info, l.reported_limit(info), &ints[1 + 5 * j..6 + 5 * j])?;
            if corrupt {
                self.stats.add_corrupt_reset();
                tracing::warn!(
                    policy = %info.name,
                    key = %group.keys[j],
                    "rate-limit key held unreadable state; it was reset to a fresh key"
                );
            }
            all &= d.allowed();
            got[p] = Some(d);
        }
        Ok((now, all))
    }

    /// Sends every group within the timeout: a check joins its node's batcher (each master's on
    /// a Cluster), a refund goes on its own. A group whose node's breaker is open is not sent: it
    /// fails at once.
    async fn call_groups(self: &Arc<Self>, calls: ScriptCalls, kind: CallKind) -> Replies {
        match calls {
            ScriptCalls::One(p) => {
                let (group, result) = self.call_one(p.group, p.node, p.slot, kind).await;
                Some((group, p.positions, result))
                    .into_iter()
                    .chain(Vec::new())
            }
            ScriptCalls::Several(calls) => {
                let replies =
                    futures_util::future::join_all(calls.into_iter().map(|p| async move {
                        let (group, result) = self.call_one(p.group, p.node, p.slot, kind).await;
                        (group, p.positions, result)
                    }))
                    .await;
                None.into_iter().chain(replies)
            }
        }
    }

    async fn call_one(
        self: &Arc<Self>,
        group: Group,
        (breaker, addr): (Arc<Breaker>, Option<Arc<str>>),
        slot: u16,
        kind: CallKind,
    ) -> (Group, Result<Ints, StoreError>) {
        if breaker.is_open() {
            self.stats.add_short_circuited();
            self.spawn_probe(&breaker, addr);
            let err = StoreError::new(
                StoreErrorKind::Unavailable,
                "circuit breaker open for this redis node",
            );
            crate::metrics::record_store_error(err.kind());
            return (group, Err(err));
        }
        // Until Redis has answered once, a call may also wait for the connection to be set up.
        let timeout = if self.connected.load(Ordering::Relaxed) {
            self.timeout
        } else {
            self.timeout.max(self.connect_timeout)
        };
        let timer = crate::metrics::RedisTimer::start(); // metrics: the round trip
        let (group, result) = match self.handle() {
            Err(e) => (group, Err(CallError::Store(e))),
            Ok(handle) => match &handle.batchers {
                // The batcher coalesces checks; a refund goes on its own, and so does a check
                // for a Cluster node not known yet (the slot map is read in the background).
                Some(batchers) if kind == CallKind::Check && (!self.cluster || addr.is_some()) => {
                    let batcher = batchers.get(addr.as_deref().unwrap_or(""));
                    self.send_batched(&batcher, group, slot, timeout).await
                }
                // Boxed: its future (a timer and the connection's) is large, and would make
                // every batched call's future as large, which is moved as it is polled.
                _ => {
                    Box::pin(async {
                        let deadline = deadline_after(timeout);
                        let result = match tokio::time::timeout_at(
                            deadline,
                            self.send(&handle.conn, &group, kind, deadline),
                        )
                        .await
                        {
                            Ok(r) => r,
                            Err(_) => Err(CallError::Timeout),
                        };
                        (group, result)
                    })
                    .await
                }
            },
        };
        timer.finish();
        let result = match result {
            Ok(ints) => {
                breaker.on_success();
                self.connected.store(true, Ordering::Relaxed);
                Ok(ints)
            }
            Err(e) => {
                let timed_out = matches!(e, CallError::Timeout);
                let err = e.into_store_error(timeout);
                crate::metrics::record_store_error(err.kind());
                tracing::warn!(error = %err, node = addr.as_deref(), "redis rate-limit call failed");
                self.stats.on_failure(timed_out);
                if breaker.on_failure(self.breaker_threshold, &self.stats) {
                    tracing::warn!(
                        threshold = self.breaker_threshold,
                        node = addr.as_deref(),
                        "redis circuit breaker opened; deciding by failure policy until a probe succeeds"
                    );
                    self.spawn_probe(&breaker, addr);
                }
                Err(err)
            }
        };
        (group, result)
    }

    /// One script call for one group, on the shared connection.
    async fn send(
        &self,
        conn: &Conn,
        group: &Group,
        kind: CallKind,
        deadline: tokio::time::Instant,
    ) -> Result<Ints, CallError> {
        let value = conn
            .eval(&self.script, kind, std::iter::once(group), deadline)
            .await
            .map_err(|e| CallError::Redis(e.to_string(), kind_of(&e)))?;
        let ints = reply_ints(value).map_err(CallError::Store)?;
        Ints::from_slice(&ints).ok_or_else(|| {
            CallError::Store(StoreError::new(
                StoreErrorKind::InvalidResponse,
                format!("{} integers in a reply", ints.len()),
            ))
        })
    }

    /// The group joins the batcher's next script call. If the caller gives up (timeout), the
    /// batcher skips the group unless it was already sent.
    async fn send_batched(
        &self,
        batcher: &mpsc::UnboundedSender<Job>,
        group: Group,
        slot: u16,
        timeout: Duration,
    ) -> (Group, Result<Ints, CallError>) {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            group,
            script: self.script.clone(),
            // The timeout is at most MAX_TIMEOUT (checked at build time); checked anyway.
            deadline: deadline_after(timeout),
            slot,
            reply: tx,
        };
        if let Err(mpsc::error::SendError(job)) = batcher.send(job) {
            let err = StoreError::new(StoreErrorKind::Unavailable, "the redis batcher stopped");
            return (job.group, Err(CallError::Store(err)));
        }
        // No timer here: the batcher answers every job by its deadline.
        match rx.await {
            Ok((group, Ok(ints))) => (group, Ok(ints)),
            Ok((group, Err(BatchError::Timeout))) => (group, Err(CallError::Timeout)),
            Ok((group, Err(BatchError::Redis(e)))) => {
                (group, Err(CallError::Redis(e.to_string(), kind_of(&e))))
            }
            Ok((group, Err(BatchError::Invalid(msg)))) => (
                group,
                Err(CallError::Store(StoreError::new(
                    StoreErrorKind::InvalidResponse,
                    msg,
                ))),
            ),
            // The group went with the job; the caller only needs it to refund a group Redis
            // charged, which this one was not.
            Err(_) => (
                Group::default(),
                Err(CallError::Store(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "the redis batcher dropped the call",
                ))),
            ),
        }
    }
}

/// `now + timeout`, saturating far in the future instead of overflowing.
fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + super::MAX_TIMEOUT)
}

enum CallError {
    Timeout,
    Redis(String, StoreErrorKind),
    Store(StoreError),
}

impl CallError {
    fn into_store_error(self, timeout: Duration) -> StoreError {
        match self {
            CallError::Timeout => StoreError::new(
                StoreErrorKind::Timeout,
                format!("redis did not answer within {timeout:?}"),
            ),
            CallError::Redis(msg, kind) => StoreError::new(kind, format!("redis: {msg}")),
            CallError::Store(e) => e,
        }
    }
}

pub(super) fn kind_of(e: &redis::RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Other
    }
}

/// A configured clock's time in the domain of Redis `TIME`: Unix µs (its reading plus its
/// [`unix_offset_micros`](Clock::unix_offset_micros), 0 for a `ManualClock` left alone).
pub(super) fn unix_micros(clock: &dyn Clock) -> u64 {
    clock
        .now_micros()
        .saturating_add(clock.unix_offset_micros())
}
