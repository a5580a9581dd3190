//! The batcher: coalesces the checks that arrive while script calls are on the wire into one
//! script call (one per master of a Cluster, whatever the hash slots of its keys), and answers
//! each check with its part of the reply. The call's arguments and reply are described in
//! `docs/internals/redis-script.md`.

use std::sync::{Arc, RwLock};

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::RedisError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::conn::Conn;
use super::script::{reply_ints, CallKind, Group, Ints, LuaScript};
use super::slots::SlotCache;
use super::stats::RedisStats;

/// One call waiting in the batcher. The group travels back with the answer, which always comes
/// by `deadline`: the batcher sends no job after its deadline and gives each script call the
/// earliest deadline of its jobs, so callers need no timer of their own.
pub(crate) struct Job {
    pub(crate) group: Group,
    /// The script of the store that sent it: stores reconfigured from one another share the
    /// connection and its batcher, each with its own script.
    pub(crate) script: Arc<LuaScript>,
    pub(crate) deadline: Instant,
    /// The hash slot of the group's keys (Cluster; 0 on a single node).
    pub(crate) slot: u16,
    pub(crate) reply: oneshot::Sender<Answer>,
}

/// A job's answer: its group, and its part of the reply or why there is none.
pub(crate) type Answer = (Group, Result<Ints, BatchError>);

/// Why a batched call failed.
#[derive(Debug, Clone)]
pub(crate) enum BatchError {
    Timeout,
    Redis(Arc<RedisError>),
    Invalid(String),
}

/// Coalesces concurrent calls into one script run: while `max_in_flight` batches are on the
/// wire, new calls queue; the next batch takes everything queued (up to `max_batch`), one script
/// call per script among them (one, unless a reconfigured store shares the connection).
///
/// A Cluster has one batcher per master (`node` holds the slot map): its batches go to that
/// master in one call whatever their slots, see [`run_batch`].
fn spawn_batcher(
    conn: Conn,
    stats: RedisStats,
    (max_batch, max_in_flight): (usize, usize),
    node: Option<Arc<SlotCache>>,
) -> mpsc::UnboundedSender<Job> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
    let running = stats.batcher_running();
    tokio::spawn(async move {
        let _running = running;
        let mut in_flight = FuturesUnordered::new();
        let mut open = true;
        while open || !in_flight.is_empty() {
            tokio::select! {
                biased;
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                job = rx.recv(), if open && in_flight.len() < max_in_flight => {
                    let Some(job) = job else {
                        open = false;
                        continue;
                    };
                    let mut jobs = Vec::with_capacity(8);
                    jobs.push(job);
                    drain(&mut rx, &mut jobs, max_batch);
                    // While another call is on the wire, the callers its reply just woke are
                    // about to send their next checks: one yield lets them join this call
                    // rather than each going alone (a call's fixed cost in Redis is that of
                    // several decisions).
                    if !in_flight.is_empty() && jobs.len() < max_batch {
                        tokio::task::yield_now().await;
                        drain(&mut rx, &mut jobs, max_batch);
                    }
                    // A caller that went away no longer waits, and a job past its deadline is
                    // answered by the failure policy: neither is sent (nor charged).
                    let now = Instant::now();
                    jobs.retain(|j| !j.reply.is_closed());
                    let (late, mut jobs): (Vec<Job>, Vec<Job>) =
                        jobs.into_iter().partition(|j| j.deadline <= now);
                    for job in late {
                        let _ = job.reply.send((job.group, Err(BatchError::Timeout)));
                    }
                    if jobs.is_empty() {
                        continue;
                    }
                    let batch = |script, jobs| {
                        run_batch(conn.clone(), stats.clone(), script, jobs, node.clone())
                    };
                    if jobs.iter().all(|j| same_script(&j.script, &jobs[0].script)) {
                        jobs.shrink_to_fit();
                        let script = jobs[0].script.clone();
                        in_flight.push(batch(script, jobs));
                        continue;
                    }
                    for same in split(jobs, |a, b| same_script(&a.script, &b.script)) {
                        let script = same[0].script.clone();
                        in_flight.push(batch(script, same));
                    }
                }
                // Unreachable with max_in_flight >= 1 (checked at build time); if it ever is,
                // the task ends and the next request restarts it (see `Batchers::get`).
                else => break,
            }
        }
    });
    tx
}

/// Moves queued jobs into `jobs` until it holds `max_batch`.
fn drain(rx: &mut mpsc::UnboundedReceiver<Job>, jobs: &mut Vec<Job>, max_batch: usize) {
    while jobs.len() < max_batch {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
}

/// `jobs` split into runs of jobs that are `alike` (each run in arrival order, the runs in the
/// order of their first job): one script call each.
fn split(mut jobs: Vec<Job>, alike: impl Fn(&Job, &Job) -> bool) -> Vec<Vec<Job>> {
    let mut parts = Vec::new();
    while !jobs.is_empty() {
        let first = jobs.remove(0);
        let (mut same, rest): (Vec<Job>, Vec<Job>) =
            jobs.into_iter().partition(|j| alike(&first, j));
        same.insert(0, first);
        parts.push(same);
        jobs = rest;
    }
    parts
}

fn same_script(a: &Arc<LuaScript>, b: &Arc<LuaScript>) -> bool {
    Arc::ptr_eq(a, b) || a.sha() == b.sha()
}

/// The error code the script answers a node batch with when one of its keys is not served by
/// the node it ran on (checked for every key before anything is written).
const UNSERVED: &str = "TOLLGATE_UNSERVED";

/// Runs one batch and answers its jobs. With `node` (a Cluster master's batcher) the batch goes
/// to that master in one call; if a key's slot is no longer served there (resharding, failover:
/// the script checks every key before its first write, so nothing was applied), the jobs are
/// sent again slot by slot, each once, routed by their keys (following `MOVED` and `ASK`), and
/// the slot map is read again.
async fn run_batch(
    conn: Conn,
    stats: RedisStats,
    script: Arc<LuaScript>,
    jobs: Vec<Job>,
    node: Option<Arc<SlotCache>>,
) {
    stats.record_batch(jobs.len());
    let route = node.as_ref().map(|_| jobs[0].slot);
    let result = call_batch(&conn, &script, &jobs, route).await;
    match result {
        Err(BatchError::Redis(e)) if route.is_some() && e.code() == Some(UNSERVED) => {
            tracing::debug!(error = %e, "a cluster node no longer serves a slot of its batch; sending it slot by slot");
            stats.add_split_batch();
            if let Some(slots) = node {
                let conn = conn.clone();
                tokio::spawn(async move { slots.refresh(&conn).await });
            }
            let calls = split(jobs, |a, b| a.slot == b.slot)
                .into_iter()
                .map(|jobs| {
                    stats.record_batch(jobs.len());
                    let (conn, script) = (&conn, &script);
                    async move {
                        let result = call_batch(conn, script, &jobs, None).await;
                        answer(jobs, result, script);
                    }
                });
            futures_util::future::join_all(calls).await;
        }
        result => answer(jobs, result, &script),
    }
}

/// One script call for `jobs`, within the earliest of their deadlines: routed by its keys, or
/// to the master of slot `node`.
async fn call_batch(
    conn: &Conn,
    script: &LuaScript,
    jobs: &[Job],
    node: Option<u16>,
) -> Result<Vec<i64>, BatchError> {
    let deadline = jobs
        .iter()
        .map(|j| j.deadline)
        .min()
        .expect("a batch has jobs");
    let kind = if compact(jobs) {
        CallKind::Batch
    } else {
        CallKind::Check
    };
    let result = tokio::time::timeout_at(
        deadline,
        conn.eval_routed(script, kind, jobs.iter().map(|j| &j.group), node, deadline),
    )
    .await;
    match result {
        Ok(Ok(value)) => reply_ints(value).map_err(|e| BatchError::Invalid(e.to_string())),
        Ok(Err(e)) => Err(BatchError::Redis(Arc::new(e))),
        Err(_) => Err(BatchError::Timeout),
    }
}

/// The compact form when every job is one limit at the server's time (the usual case).
fn compact(jobs: &[Job]) -> bool {
    jobs.iter().all(|j| j.group.is_single_at_server_time())
}

/// Answers each job with its part of the batch's reply (or the batch's error). A compact
/// reply's part of a job is its compact record (one negative integer, read by `script`'s
/// [`CompactForm`](super::script::CompactForm)) or five integers.
fn answer(jobs: Vec<Job>, ints: Result<Vec<i64>, BatchError>, script: &LuaScript) {
    let compact = compact(&jobs);
    let ints = match ints {
        Ok(ints) => ints,
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send((job.group, Err(e.clone())));
            }
            return;
        }
    };
    let total = ints.len();
    // A compact reply holds the time once, first; each group's answer starts with it. An empty
    // reply has none, and every job's part is then missing.
    let now = ints.first().copied().unwrap_or_default();
    let mut at = usize::from(compact);
    for job in jobs {
        let (len, part) = if compact && total > 0 {
            let mut buf = [0i64; 6];
            buf[0] = now;
            let (len, five) = match ints.get(at) {
                Some(&record) if record < 0 => (
                    1,
                    script.compact().and_then(|form| form.expand(record, now)),
                ),
                _ => (
                    5,
                    ints.get(at..at + 5)
                        .and_then(|f| <[i64; 5]>::try_from(f).ok()),
                ),
            };
            let part = five.and_then(|five| {
                buf[1..].copy_from_slice(&five);
                Ints::from_slice(&buf)
            });
            (len, part)
        } else if compact {
            (1, None)
        } else {
            let len = job.group.reply_len();
            (len, ints.get(at..at + len).and_then(Ints::from_slice))
        };
        at += len;
        let part = part.ok_or_else(|| {
            BatchError::Invalid(format!(
                "batched reply of {total} integers is short or malformed before integer {at}"
            ))
        });
        let _ = job.reply.send((job.group, part));
    }
}

/// The batchers of one connection: the single node's, or one per Cluster master (started when
/// a check for it first comes, restarted if found stopped).
pub(crate) struct Batchers {
    conn: Conn,
    stats: RedisStats,
    limits: (usize, usize),
    /// The Cluster's slot map (`None`: a single node).
    slots: Option<Arc<SlotCache>>,
    by_node: RwLock<Vec<(Box<str>, mpsc::UnboundedSender<Job>)>>,
}

impl Batchers {
    /// The batchers of `conn`, each holding up to `limits` (`max_batch`, `max_in_flight`); with
    /// `slots` (a Cluster), one per master.
    pub(crate) fn new(
        conn: Conn,
        stats: RedisStats,
        limits: (usize, usize),
        slots: Option<Arc<SlotCache>>,
    ) -> Self {
        Self {
            conn,
            stats,
            limits,
            slots,
            by_node: RwLock::new(Vec::new()),
        }
    }

    /// The batcher for the master at `node` (`""`: the single node). Must run on the
    /// connection's runtime.
    pub(crate) fn get(&self, node: &str) -> mpsc::UnboundedSender<Job> {
        // The common case, a running batcher of a known master, shares the lock.
        {
            let by_node = self.by_node.read().unwrap_or_else(|e| e.into_inner());
            if let Some((_, batcher)) = by_node.iter().find(|(n, _)| &**n == node)
                && !batcher.is_closed()
            {
                return batcher.clone();
            }
        }
        let mut by_node = self.by_node.write().unwrap_or_else(|e| e.into_inner());
        let spawn = || {
            spawn_batcher(
                self.conn.clone(),
                self.stats.clone(),
                self.limits,
                self.slots.clone(),
            )
        };
        match by_node.iter_mut().find(|(n, _)| &**n == node) {
            Some((_, batcher)) => {
                if batcher.is_closed() {
                    self.stats.add_batcher_restart();
                    tracing::error!(
                        node,
                        "the redis batching task stopped; restarting it (its requests were decided by their failure policies)"
                    );
                    *batcher = spawn();
                }
                batcher.clone()
            }
            None => {
                // A new master: the batchers of addresses the slot map no longer names as
                // masters (failed over, removed) are dropped, and their tasks end once their
                // calls on the wire are answered.
                if let Some(slots) = &self.slots {
                    let map = slots.map();
                    let masters = map.masters();
                    by_node.retain(|(n, _)| masters.iter().any(|m| **m == **n));
                }
                let batcher = spawn();
                by_node.push((node.into(), batcher.clone()));
                batcher
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::AlgorithmKind;
    use crate::quota::Quota;
    use crate::store::redis::script::{LimitArg, QuotaArg};
    use crate::store::PlanQuota;

    fn script(count: u64) -> Arc<LuaScript> {
        let kind = AlgorithmKind::FixedWindow;
        let params = QuotaArg::of(&PlanQuota::new(kind, Quota::per_minute(count)).unwrap()).params;
        Arc::new(LuaScript::assemble(&[(kind, params)]))
    }

    /// A job of `limits` limits for `key` at slot `slot`, and the receiver of its answer.
    fn job(
        key: &str,
        limits: usize,
        slot: u16,
        script: &Arc<LuaScript>,
    ) -> (Job, oneshot::Receiver<Answer>) {
        let (reply, rx) = oneshot::channel();
        let group = Group {
            keys: vec![key.to_owned(); limits],
            limits: vec![
                LimitArg {
                    limit: 0,
                    cost: 1,
                    quota: None,
                };
                limits
            ],
            now: None,
            reserved_at: None,
        };
        let job = Job {
            group,
            script: script.clone(),
            deadline: Instant::now(),
            slot,
            reply,
        };
        (job, rx)
    }

    fn keys(parts: &[Vec<Job>]) -> Vec<Vec<&str>> {
        parts
            .iter()
            .map(|p| p.iter().map(|j| j.group.keys[0].as_str()).collect())
            .collect()
    }

    #[test]
    fn a_batch_splits_by_slot_and_by_script_keeping_arrival_order() {
        let (one, two) = (script(1), script(2));
        let jobs: Vec<Job> = [
            ("a", 5, &one),
            ("b", 7, &two),
            ("c", 5, &two),
            ("d", 9, &one),
        ]
        .into_iter()
        .map(|(key, slot, script)| job(key, 1, slot, script).0)
        .collect();
        let by_slot = split(jobs, |a, b| a.slot == b.slot);
        assert_eq!(keys(&by_slot), [vec!["a", "c"], vec!["b"], vec!["d"]]);
        let jobs = by_slot.into_iter().flatten().collect();
        let by_script = split(jobs, |a, b| same_script(&a.script, &b.script));
        assert_eq!(keys(&by_script), [vec!["a", "d"], vec!["c", "b"]]);
        assert!(split(Vec::new(), |_, _| true).is_empty());
        assert!(
            same_script(&one, &script(1)),
            "the same source, another Arc"
        );
    }

    #[test]
    fn a_compact_reply_is_shared_out_with_its_time_in_front_of_each_answer() {
        let s = script(1);
        let (a, mut ra) = job("a", 1, 0, &s);
        let (b, mut rb) = job("b", 1, 0, &s);
        let jobs = vec![a, b];
        assert!(compact(&jobs));
        // The time once, then five integers per job.
        answer(jobs, Ok(vec![100, 1, 9, 10, 0, 0, 0, 0, 20, 30, 0]), &s);
        let ints = |rx: &mut oneshot::Receiver<_>| {
            let (_, result): Answer = rx.try_recv().unwrap();
            result.unwrap().to_vec()
        };
        assert_eq!(ints(&mut ra), [100, 1, 9, 10, 0, 0]);
        assert_eq!(ints(&mut rb), [100, 0, 0, 20, 30, 0]);
    }

    #[test]
    fn compact_records_are_read_with_limit_zeros_parameters_between_full_ones() {
        // 10/s with a burst of 20: unit 100 000 steps per token, 1 step per µs, cap 2 000 000.
        let kind = AlgorithmKind::TokenBucket;
        let quota = Quota::per_second(10).burst(20);
        let params = QuotaArg::of(&PlanQuota::new(kind, quota).unwrap()).params;
        let s = Arc::new(LuaScript::assemble(&[(kind, params)]));
        let (a, mut ra) = job("a", 1, 0, &s);
        let (b, mut rb) = job("b", 1, 0, &s);
        let (c, mut rc) = job("c", 1, 0, &s);
        // a: a deficit of 250 000 steps after its charge (17 left, full in 250 ms); b: five
        // integers (rejected); c: an empty bucket's first token (19 left, 100 ms).
        let reply = vec![7, -1 - 250_000, 0, 0, 40, 60, 0, -1 - 100_000];
        answer(vec![a, b, c], Ok(reply), &s);
        let ints = |rx: &mut oneshot::Receiver<Answer>| rx.try_recv().unwrap().1.unwrap().to_vec();
        assert_eq!(ints(&mut ra), [7, 1, 17, 250_000, 0, 0]);
        assert_eq!(ints(&mut rb), [7, 0, 0, 40, 60, 0]);
        assert_eq!(ints(&mut rc), [7, 1, 19, 100_000, 0, 0]);
        // A fixed window of 5 a minute: a count of 3 at 1.5 min leaves 2 for 30 s.
        let fw = script(5);
        let (a, mut ra) = job("a", 1, 0, &fw);
        answer(vec![a], Ok(vec![90_000_000, -1 - 3]), &fw);
        assert_eq!(ints(&mut ra), [90_000_000, 1, 2, 30_000_000, 0, 0]);
        // A count of 0: refused until the window ends.
        let (a, mut ra) = job("a", 1, 0, &fw);
        answer(vec![a], Ok(vec![90_000_000, -1]), &fw);
        assert_eq!(ints(&mut ra), [90_000_000, 0, 0, 30_000_000, 30_000_000, 0]);
        // A deficit past the capacity or of 0, a count past the limit, or a compact record where
        // the script has none (a sliding window), is a malformed reply.
        for record in [-1 - 2_000_001, -1] {
            let (a, mut ra) = job("a", 1, 0, &s);
            answer(vec![a], Ok(vec![7, record]), &s);
            assert!(matches!(
                ra.try_recv().unwrap().1,
                Err(BatchError::Invalid(_))
            ));
        }
        let (a, mut ra) = job("a", 1, 0, &fw);
        answer(vec![a], Ok(vec![7, -1 - 6]), &fw);
        assert!(matches!(
            ra.try_recv().unwrap().1,
            Err(BatchError::Invalid(_))
        ));
        let kind = AlgorithmKind::SlidingWindow;
        let params = QuotaArg::of(&PlanQuota::new(kind, Quota::per_minute(5)).unwrap()).params;
        let sw = Arc::new(LuaScript::assemble(&[(kind, params)]));
        let (a, mut ra) = job("a", 1, 0, &sw);
        answer(vec![a], Ok(vec![7, -2]), &sw);
        assert!(matches!(
            ra.try_recv().unwrap().1,
            Err(BatchError::Invalid(_))
        ));
    }

    #[test]
    fn an_empty_reply_is_malformed_for_every_job_and_never_a_panic() {
        let s = script(1);
        let (a, mut ra) = job("a", 1, 0, &s);
        let (b, mut rb) = job("b", 1, 0, &s);
        let jobs = vec![a, b];
        assert!(compact(&jobs));
        answer(jobs, Ok(vec![]), &s);
        for rx in [&mut ra, &mut rb] {
            assert!(matches!(
                rx.try_recv().unwrap().1,
                Err(BatchError::Invalid(_))
            ));
        }
    }

    #[test]
    fn a_full_reply_is_shared_out_group_by_group() {
        let s = script(1);
        // A group of two limits: the batch is not compact, each group's answer has its time.
        let (a, mut ra) = job("a", 2, 0, &s);
        let (b, mut rb) = job("b", 1, 0, &s);
        let jobs = vec![a, b];
        assert!(!compact(&jobs));
        let first: Vec<i64> = (0..11).collect();
        let second: Vec<i64> = (100..106).collect();
        answer(jobs, Ok([first.clone(), second.clone()].concat()), &s);
        assert_eq!(ra.try_recv().unwrap().1.unwrap().to_vec(), first);
        assert_eq!(rb.try_recv().unwrap().1.unwrap().to_vec(), second);
    }

    #[test]
    fn a_short_reply_or_an_error_reaches_every_job_with_its_group() {
        let s = script(1);
        let (a, mut ra) = job("a", 1, 0, &s);
        let (b, mut rb) = job("b", 1, 0, &s);
        answer(vec![a, b], Ok(vec![100, 1, 9, 10, 0, 0]), &s);
        assert!(ra.try_recv().unwrap().1.is_ok());
        assert!(matches!(
            rb.try_recv().unwrap().1,
            Err(BatchError::Invalid(_))
        ));
        let (a, mut ra) = job("a", 1, 0, &s);
        answer(vec![a], Err(BatchError::Timeout), &s);
        let (group, result) = ra.try_recv().unwrap();
        assert_eq!(group.keys, ["a"], "the group travels back");
        assert!(matches!(result, Err(BatchError::Timeout)));
    }
}
