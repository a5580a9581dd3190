//! The Lua side: per-limit parameters, script assembly, packing a call and parsing its reply.
//!
//! A store's script is the concatenation of files in `scripts/` and two generated chunks, in this
//! order ([`LuaScript::assemble`]): `prelude.lua`; the batch constants (`PREFETCH`, `FAST`) with
//! limit 0's fused batch check (`token_bucket_fast.lua` or `fixed_window_fast.lua`) when it has
//! one; `lead.lua`; `state.lua`; the file of each algorithm its limits use (each once); `CONFIG`
//! (this store's limits as data); `dispatch.lua` and `driver.lua` (or `lease.lua`, for the hybrid
//! store's leases). The call protocol, the order of the files and what adding an algorithm takes
//! are described in `docs/internals/redis-script.md`.

use std::time::Duration;

use redis::{Cmd, Value};

use crate::algorithm::{Algorithm, AlgorithmKind};
use crate::decision::{Decision, Name};
use crate::error::{ConfigError, StoreError, StoreErrorKind};
use crate::quota::Quota;
use crate::store::plan_quota::CompiledAlgorithm;
use crate::store::{LimitSpec, PlanQuota, MAX_LIMITS};

const PRELUDE: &str = include_str!("scripts/prelude.lua");
const LEAD: &str = include_str!("scripts/lead.lua");
const STATE: &str = include_str!("scripts/state.lua");
const TOKEN_BUCKET_FAST: &str = include_str!("scripts/token_bucket_fast.lua");
const FIXED_WINDOW_FAST: &str = include_str!("scripts/fixed_window_fast.lua");
const DISPATCH: &str = include_str!("scripts/dispatch.lua");
const DRIVER: &str = include_str!("scripts/driver.lua");
/// The hybrid store's lease driver, run in place of `driver.lua` (see `super::lease`).
pub(crate) const LEASE_DRIVER: &str = include_str!("scripts/lease.lua");
const TOKEN_BUCKET: &str = include_str!("scripts/token_bucket.lua");
const GCRA: &str = include_str!("scripts/gcra.lua");
const FIXED_WINDOW: &str = include_str!("scripts/fixed_window.lua");
const SLIDING_WINDOW: &str = include_str!("scripts/sliding_window.lua");
const SLIDING_LOG: &str = include_str!("scripts/sliding_log.lua");
const LEAKY_BUCKET: &str = include_str!("scripts/leaky_bucket.lua");

/// How one algorithm maps onto the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AlgorithmScript {
    /// Its name: in key names, and in `<name>_algorithm`, the function of its Lua file that
    /// gives the dispatch its functions.
    pub(crate) short: &'static str,
    /// The Lua files that define it, in order.
    sources: &'static [&'static str],
}

pub(crate) fn script_of(kind: AlgorithmKind) -> AlgorithmScript {
    let (short, sources): (_, &'static [&'static str]) = match kind {
        AlgorithmKind::TokenBucket => ("tb", &[TOKEN_BUCKET]),
        AlgorithmKind::Gcra => ("gcra", &[GCRA]),
        AlgorithmKind::FixedWindow => ("fw", &[FIXED_WINDOW]),
        AlgorithmKind::SlidingWindow => ("sw", &[SLIDING_WINDOW]),
        AlgorithmKind::SlidingLog => ("sl", &[SLIDING_LOG]),
        // The leaky-bucket meter is the token bucket's arithmetic read as a queue's level
        // (src/algorithm/leaky_bucket.rs wraps a TokenBucket).
        AlgorithmKind::LeakyBucket => ("lb", &[TOKEN_BUCKET, LEAKY_BUCKET]),
    };
    AlgorithmScript { short, sources }
}

/// A limit as the script sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScriptParams {
    pub(crate) ttl_ms: u64,
    pub(crate) p: [u64; 3],
}

/// A quota as one check carries it to the script: its parameters (sent with the check), and
/// `Decision::limit` as its algorithm reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuotaArg {
    pub(crate) params: ScriptParams,
    pub(crate) limit: u64,
}

impl QuotaArg {
    /// The script parameters of `quota`, compiled already (no validation per check).
    pub(crate) fn of(quota: &PlanQuota) -> Self {
        let q = quota.quota();
        // The buckets: (unit, per, cap) in the token bucket's fixed point.
        let bucket = |q: &Quota| {
            let fp = q.fixed_point();
            [fp.unit, fp.per_micro, q.burst_size() * fp.unit]
        };
        let window = |q: &Quota| [q.period_micros(), q.count(), 0];
        // p3 = 0: windows of p1 µs from the epoch; else a calendar (see fixed_window.lua).
        let fixed = |q: &Quota| {
            let (period, calendar) = q
                .calendar()
                .map_or((q.period_micros(), 0), |c| c.script_params());
            [period, q.count(), calendar]
        };
        let (p, idle) = match &quota.compiled {
            CompiledAlgorithm::TokenBucket(a) => (bucket(q), a.idle_timeout_micros()),
            CompiledAlgorithm::Gcra(a) => (bucket(q), a.idle_timeout_micros()),
            CompiledAlgorithm::LeakyBucket(a) => (bucket(q), a.idle_timeout_micros()),
            CompiledAlgorithm::FixedWindow(a) => (fixed(q), a.idle_timeout_micros()),
            CompiledAlgorithm::SlidingWindow(a) => (window(q), a.idle_timeout_micros()),
            CompiledAlgorithm::SlidingLog(a) => (window(q), a.idle_timeout_micros()),
        };
        Self {
            params: ScriptParams {
                ttl_ms: idle.div_ceil(1000).max(1),
                p,
            },
            limit: quota.capacity(),
        }
    }
}

/// What the store needs to know about one configured limit.
#[derive(Debug, Clone)]
pub(crate) struct LimitInfo {
    pub(crate) name: Name,
    pub(crate) name_enc: String,
    pub(crate) short: &'static str,
    pub(crate) algorithm: AlgorithmKind,
    /// The parameters the script holds for this limit: those its unmarked keys were written at
    /// (see `scripts/state.lua`). The limit's own, unless the store was reconfigured from one
    /// where the limit of this name had another quota.
    pub(crate) params: ScriptParams,
    /// `Decision::limit` as the algorithm reports it.
    pub(crate) limit: u64,
    /// The limit's own quota when it is not `params` (reconfigured): every check without a plan
    /// then carries it, as a plan would.
    pub(crate) own: Option<QuotaArg>,
}

impl LimitInfo {
    /// Keeps reading unmarked keys as `earlier` (the same limit in the store this one
    /// reconfigures) wrote them: checks at this limit's own quota then carry it when it differs.
    pub(crate) fn inherit(&mut self, earlier: &LimitInfo) {
        let own = QuotaArg {
            params: self.params,
            limit: self.limit,
        };
        self.params = earlier.params;
        self.own = (own.params.p != self.params.p).then_some(own);
    }
}

/// Computes a limit's script parameters from its algorithm's exact integer formulas.
pub(crate) fn limit_info(spec: &LimitSpec, name_enc: String) -> Result<LimitInfo, ConfigError> {
    let arg = QuotaArg::of(&PlanQuota::new(spec.algorithm(), *spec.quota())?);
    Ok(LimitInfo {
        name: spec.name(),
        name_enc,
        short: script_of(spec.algorithm()).short,
        algorithm: spec.algorithm(),
        params: arg.params,
        limit: arg.limit,
        own: None,
    })
}

/// A store's Lua script: its source and SHA-1 (for EVALSHA).
#[derive(Debug, Clone)]
pub(crate) struct LuaScript {
    code: String,
    sha: String,
    /// Where the driver starts in `code`.
    driver_at: usize,
    /// How to read the compact records of a batch reply, when limit 0 has them.
    compact: Option<CompactForm>,
}

/// Limit 0's parameters, to read a batch reply's compact records: one negative integer
/// `-1 - x` for a check its fused batch check (`FAST`) decided, `x` being the token bucket's
/// deficit after the charge (`tb_fast`) or the fixed window's count after it (`fw_fast`, epoch windows;
/// 0: refused, the window spent); `docs/internals/redis-script.md`, "The check call".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompactForm {
    TokenBucket { unit: u64, per: u64, cap: u64 },
    FixedWindow { period: u64, limit: u64 },
}

impl CompactForm {
    /// The compact form of limit 0 when its algorithm has one.
    fn of(limits: &[(AlgorithmKind, ScriptParams)]) -> Option<Self> {
        match limits.first() {
            Some(&(AlgorithmKind::TokenBucket, p)) => {
                let [unit, per, cap] = p.p;
                (unit >= 1 && per >= 1).then_some(Self::TokenBucket { unit, per, cap })
            }
            Some(&(AlgorithmKind::FixedWindow, p)) => {
                let [period, limit, calendar] = p.p;
                (period >= 1 && calendar == 0).then_some(Self::FixedWindow { period, limit })
            }
            _ => None,
        }
    }

    /// The five reply integers of the compact record `record` (negative) of a batch decided at
    /// `now` (µs), as the script's general path reports the same check; `None` when it is not a
    /// state this limit can have.
    pub(crate) fn expand(&self, record: i64, now: i64) -> Option<[i64; 5]> {
        let x = u64::try_from(record.checked_neg()?.checked_sub(1)?).ok()?;
        let (remaining, reset) = match *self {
            // floor((cap - deficit) / unit) whole units left; full again in ceil(deficit / per) µs.
            Self::TokenBucket { unit, per, cap } => ((cap.checked_sub(x)? / unit), x.div_ceil(per)),
            // limit - count left until the end of the window holding `now`; a count of 0 is a
            // refusal there (the window was spent).
            Self::FixedWindow { period, limit } => {
                let now = u64::try_from(now).ok()?;
                let end = (now / period).checked_add(1)?.checked_mul(period)?;
                let wait = i64::try_from(end - now).ok()?;
                if x == 0 {
                    return Some([0, 0, wait, wait, 0]);
                }
                (limit.checked_sub(x)?, end - now)
            }
        };
        if x == 0 {
            return None; // a charge of 1 leaves at least 1 step spent
        }
        Some([
            1,
            i64::try_from(remaining).ok()?,
            i64::try_from(reset).ok()?,
            0,
            0,
        ])
    }
}

/// How far past `ttl_ms` the TTL-keeping writes of `tb_fast` may be: (the cell, the longest
/// refill a write may leave and still keep the key's TTL), both in µs ("Expiry" in
/// token_bucket.lua). A cell is an eighth of the ttl; the refill bound is the ttl less a cell and
/// 2 ms (the millisecond Redis may stamp a write with before the script's `TIME`, and one more),
/// and -1 (never keep) when nothing is left of it.
pub(crate) fn keep_ttl_window(ttl_ms: u64) -> (u64, i64) {
    let ttl = ttl_ms.saturating_mul(1000);
    let cell = (ttl / 8).max(1);
    let keep = ttl.saturating_sub(cell).saturating_sub(2000);
    (
        cell,
        i64::try_from(keep).ok().filter(|&k| k > 0).unwrap_or(-1),
    )
}

/// The cell and refill bound (µs) of limit 0's fused batch check: a token bucket's TTL-keeping
/// window ([`keep_ttl_window`]); for a fixed window of epoch windows (`p3` = 0), its period as the
/// cell, so that the start of the cell holding a batch's time, which the batch works out once, is
/// the start of the window holding it (`fw_fast` in fixed_window_fast.lua).
fn fast_cell(kind: AlgorithmKind, p: &ScriptParams) -> (u64, i64) {
    let (cell, keep) = keep_ttl_window(p.ttl_ms);
    match (kind, p.p) {
        (AlgorithmKind::FixedWindow, [period, _, 0]) if period >= 1 => (period, keep),
        _ => (cell, keep),
    }
}

/// Writes `CONFIG`, one of the script's two generated pieces: a Lua function of a limit's
/// configuration index returning its algorithm (the `<name>_algorithm` function of its file),
/// `ttl_ms`, `p1`, `p2` and `p3`; nothing past the last limit. `ttl_ms` is a string: it only goes
/// to `PX`, and a number would be formatted with `sprintf` on every write. A function of
/// constants rather than a table, so that a call builds nothing it does not use.
fn write_config(code: &mut String, limits: &[(AlgorithmKind, ScriptParams)]) {
    use std::fmt::Write;
    code.push_str(
        "-- This store's limits, generated from its configuration: CONFIG(i) returns limit i's\n\
         -- algorithm, ttl_ms, p1, p2, p3; nothing past the last limit.\n\
         local function CONFIG(i)\n",
    );
    for (i, (kind, p)) in limits.iter().enumerate() {
        let [p1, p2, p3] = p.p;
        let _ = writeln!(
            code,
            "  if i == {i} then return {}_algorithm, '{}', {p1}, {p2}, {p3} end",
            script_of(*kind).short,
            p.ttl_ms,
        );
    }
    code.push_str("end\n");
}

/// Writes the batch constants, the script's other generated piece, and limit 0's fused batch
/// check when it has one: `PREFETCH`, whether a batch reads its keys ahead with one `MGET` (unless
/// a limit is a sliding log, which reads its state in pieces), then `FAST`, limit 0's fused check
/// (`tb_fast` or `fw_fast`, when the batch reads ahead and the limit has a compact reply form;
/// else `false`), with its `ttl_ms`, parameters, and the cell and refill bound of its writes
/// ([`fast_cell`]).
fn write_batch_paths(code: &mut String, limits: &[(AlgorithmKind, ScriptParams)]) {
    use std::fmt::Write;
    let prefetch = limits
        .iter()
        .all(|(kind, _)| *kind != AlgorithmKind::SlidingLog);
    let _ = writeln!(
        code,
        "-- How this store's batches run, generated from its configuration (lead.lua).\n\
         local PREFETCH = {prefetch}\n\
         local FAST, FAST_TTL, FAST_P1, FAST_P2, FAST_P3, FAST_CELL, FAST_KEEP = false"
    );
    let fast = match (prefetch, CompactForm::of(limits), limits.first()) {
        (true, Some(CompactForm::TokenBucket { .. }), Some(first)) => {
            Some((TOKEN_BUCKET_FAST, "tb_fast", first))
        }
        (true, Some(CompactForm::FixedWindow { .. }), Some(first)) => {
            Some((FIXED_WINDOW_FAST, "fw_fast", first))
        }
        _ => None,
    };
    if let Some((source, name, (kind, p))) = fast {
        let (cell, keep) = fast_cell(*kind, p);
        let [p1, p2, p3] = p.p;
        code.push_str(source);
        let _ = writeln!(
            code,
            "FAST, FAST_TTL, FAST_P1, FAST_P2, FAST_P3, FAST_CELL, FAST_KEEP =\n  \
             {name}, '{}', {p1}, {p2}, {p3}, {cell}, {keep}",
            p.ttl_ms,
        );
    }
}

impl LuaScript {
    /// The script of a store deciding `limits`.
    pub(crate) fn for_limits(limits: &[LimitInfo]) -> Self {
        Self::assemble(
            &limits
                .iter()
                .map(|info| (info.algorithm, info.params))
                .collect::<Vec<_>>(),
        )
    }

    /// The prelude, the batch constants with limit 0's fused check and the lead, the state
    /// helpers, the files of the algorithms `limits` use (each once, in the order of first use),
    /// `CONFIG` (each limit's algorithm and parameters, as constants), the dispatch and the
    /// driver. The SHA therefore names one configuration.
    pub(crate) fn assemble(limits: &[(AlgorithmKind, ScriptParams)]) -> Self {
        let mut code = String::with_capacity(8 * 1024);
        code.push_str(PRELUDE);
        code.push('\n');
        write_batch_paths(&mut code, limits);
        code.push('\n');
        code.push_str(LEAD);
        code.push('\n');
        code.push_str(STATE);
        let mut used: Vec<&'static str> = Vec::with_capacity(limits.len());
        for (kind, _) in limits {
            for &source in script_of(*kind).sources {
                if !used.iter().any(|u| std::ptr::eq(*u, source)) {
                    used.push(source);
                    code.push('\n');
                    code.push_str(source);
                }
            }
        }
        code.push('\n');
        write_config(&mut code, limits);
        code.push('\n');
        code.push_str(DISPATCH);
        let driver_at = code.len();
        code.push('\n');
        code.push_str(DRIVER);
        let sha = redis::Script::new(&code).get_hash().to_owned();
        Self {
            code,
            sha,
            driver_at,
            compact: CompactForm::of(limits),
        }
    }

    /// This script with `driver` in place of `driver.lua`: what the same limits run for another
    /// call (the hybrid store's leases).
    pub(crate) fn with_driver(&self, driver: &str) -> Self {
        let mut code = String::with_capacity(self.driver_at + 1 + driver.len());
        code.push_str(&self.code[..self.driver_at]);
        code.push('\n');
        code.push_str(driver);
        let sha = redis::Script::new(&code).get_hash().to_owned();
        Self {
            code,
            sha,
            driver_at: self.driver_at,
            compact: self.compact,
        }
    }

    /// How to read the compact records of this script's batch replies, if it sends any.
    pub(crate) fn compact(&self) -> Option<&CompactForm> {
        self.compact.as_ref()
    }

    /// The script source.
    pub(crate) fn code(&self) -> &str {
        &self.code
    }

    /// The SHA-1 EVALSHA uses.
    pub(crate) fn sha(&self) -> &str {
        &self.sha
    }
}

/// Check (decide and charge), refund, or a batch of single-limit checks at server time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind {
    Check,
    Refund,
    /// Every group is one limit at the server's time: a compact call (`'b'` in
    /// `docs/internals/redis-script.md`).
    Batch,
}

/// One limit of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitArg {
    /// Index of the limit in the store's configuration.
    pub(crate) limit: usize,
    pub(crate) cost: u64,
    /// The quota to decide at, when it is not the script's (a plan, or the limit's own quota
    /// after a reconfiguration changed it).
    pub(crate) quota: Option<QuotaArg>,
}

impl LimitArg {
    /// `Decision::limit` of this check.
    pub(crate) fn reported_limit(&self, info: &LimitInfo) -> u64 {
        self.quota.map_or(info.limit, |q| q.limit)
    }
}

/// A group of limits decided all-or-nothing in one script run; all keys share a hash slot (in a
/// Cluster).
#[derive(Debug, Clone, Default)]
pub(crate) struct Group {
    pub(crate) keys: Vec<String>,
    pub(crate) limits: Vec<LimitArg>,
    /// Explicit time in µs, or `None` for the server's `TIME`.
    pub(crate) now: Option<u64>,
    /// For a refund: the time (µs) its reservation was charged at; the refund itself is applied
    /// at `now`.
    pub(crate) reserved_at: Option<u64>,
}

impl Group {
    pub(crate) fn len(&self) -> usize {
        self.limits.len()
    }

    /// Reply integers this group takes: its `now`, then 5 per limit.
    pub(crate) fn reply_len(&self) -> usize {
        1 + 5 * self.limits.len()
    }

    /// Whether the group can go in a [`CallKind::Batch`] call.
    pub(crate) fn is_single_at_server_time(&self) -> bool {
        self.limits.len() == 1 && self.now.is_none() && self.reserved_at.is_none()
    }
}

/// Writes `numkeys`, the keys and the arguments of a call on `groups` after `EVALSHA sha`.
/// With `node` (a Cluster master's batch, whose keys may be of several slots) no key is declared:
/// `0 n {numkeys} {keys}` come first, then the same arguments. The layout is described in
/// `docs/internals/redis-script.md`, "The check call".
pub(crate) fn pack_args<'g>(
    cmd: &mut Cmd,
    kind: CallKind,
    groups: impl Iterator<Item = &'g Group> + Clone,
    node: bool,
) {
    let nkeys: usize = groups.clone().map(Group::len).sum();
    if node {
        cmd.arg(0).arg("n");
    }
    cmd.arg(nkeys);
    for g in groups.clone() {
        for k in &g.keys {
            cmd.arg(k.as_str());
        }
    }
    if kind == CallKind::Batch {
        if each_of_limit_0(groups.clone()) {
            cmd.arg("B");
            return;
        }
        cmd.arg("b");
        for l in groups.flat_map(|g| &g.limits) {
            match (l.limit, l.quota) {
                (0, None) => cmd.arg(l.cost),
                (i, None) => cmd.arg(format!("{i}:{}", l.cost)),
                (i, Some(q)) => {
                    let [p1, p2, p3] = q.params.p;
                    cmd.arg(format!("{i}:{}:{}:{p1}:{p2}:{p3}", l.cost, q.params.ttl_ms))
                }
            };
        }
        return;
    }
    cmd.arg(match kind {
        CallKind::Refund => "r",
        _ => "c",
    });
    cmd.arg(groups.clone().count());
    for g in groups.clone() {
        // '' is one limit at the server's time.
        match (g.len(), g.now, g.reserved_at) {
            (1, None, None) => cmd.arg(""),
            (n, None, None) => cmd.arg(n),
            (n, Some(now), None) => cmd.arg(format!("{n}@{now}")),
            (n, None, Some(at)) => cmd.arg(format!("{n}r{at}")),
            (n, Some(now), Some(at)) => cmd.arg(format!("{n}@{now}r{at}")),
        };
    }
    for g in groups {
        for l in &g.limits {
            match l.quota {
                None => cmd.arg(l.limit),
                Some(q) => {
                    let [p1, p2, p3] = q.params.p;
                    cmd.arg(format!("{}:{}:{p1}:{p2}:{p3}", l.limit, q.params.ttl_ms))
                }
            };
            cmd.arg(l.cost);
        }
    }
}

/// Whether a batch can go as `'B'`: every check is of limit 0 at its own quota, at cost 1, and
/// no key comes twice (the script then reads each key's state by its position).
///
/// Up to [`SEEN_KEYS`] keys (a default batch) are told apart in a hash table on the stack, in
/// one pass and without an allocation; a larger batch's keys are sorted.
fn each_of_limit_0<'g>(groups: impl Iterator<Item = &'g Group> + Clone) -> bool {
    let mut seen: [Option<&str>; 2 * SEEN_KEYS] = [None; 2 * SEEN_KEYS];
    let mut n = 0;
    for g in groups.clone() {
        for (k, l) in g.keys.iter().zip(&g.limits) {
            if l.limit != 0 || l.cost != 1 || l.quota.is_some() {
                return false;
            }
            n += 1;
            if n > SEEN_KEYS {
                continue;
            }
            // Open addressing, at most half full: a free place is always found.
            let mut at = key_hash(k) % seen.len();
            while let Some(other) = seen[at] {
                if other == k.as_str() {
                    return false;
                }
                at = (at + 1) % seen.len();
            }
            seen[at] = Some(k);
        }
    }
    if n <= SEEN_KEYS {
        return true;
    }
    let mut keys: Vec<&str> = groups
        .flat_map(|g| g.keys.iter().zip(&g.limits).map(|(k, _)| k.as_str()))
        .collect();
    keys.sort_unstable();
    keys.windows(2).all(|w| w[0] != w[1])
}

/// The most keys [`each_of_limit_0`] tells apart without an allocation (a default batch).
const SEEN_KEYS: usize = 64;

/// A hash of a Redis key for [`each_of_limit_0`]'s table: of its length and its last 16 bytes
/// (where the keys of one batch differ: a hashed or escaped client key), read as two words.
fn key_hash(key: &str) -> usize {
    let bytes = key.as_bytes();
    let word = |w: &[u8]| w.try_into().map_or(0, u64::from_le_bytes);
    let (a, b) = match bytes.len().checked_sub(16) {
        Some(at) => (word(&bytes[at..at + 8]), word(&bytes[at + 8..])),
        None => {
            let mut tail = [0u8; 16];
            tail[..bytes.len()].copy_from_slice(bytes);
            (word(&tail[..8]), word(&tail[8..]))
        }
    };
    let h = (a ^ b.rotate_left(29) ^ bytes.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 32) as usize
}

/// One group's reply integers: its `now`, then 5 per limit. A group of one limit (the common
/// case) is held inline, without an allocation; a larger group's are boxed, so that the reply
/// stays small as it moves from the batcher to its caller.
#[derive(Debug, Clone)]
pub(crate) enum Ints {
    One { len: usize, buf: [i64; ONE_LIMIT] },
    Several(Box<[i64]>),
}

/// The reply integers of a group of one limit.
const ONE_LIMIT: usize = 6;

impl Ints {
    /// Copies `ints`, or `None` if they are more than a group can take.
    pub(crate) fn from_slice(ints: &[i64]) -> Option<Self> {
        if ints.len() <= ONE_LIMIT {
            let mut buf = [0; ONE_LIMIT];
            buf[..ints.len()].copy_from_slice(ints);
            return Some(Self::One {
                len: ints.len(),
                buf,
            });
        }
        (ints.len() <= 1 + 5 * MAX_LIMITS).then(|| Self::Several(ints.into()))
    }
}

impl std::ops::Deref for Ints {
    type Target = [i64];

    fn deref(&self) -> &[i64] {
        match self {
            Self::One { len, buf } => &buf[..*len],
            Self::Several(ints) => ints,
        }
    }
}

/// The integers of a script reply: a string of little-endian 64-bit integers.
pub(crate) fn reply_ints(value: Value) -> Result<Vec<i64>, StoreError> {
    let Value::BulkString(bytes) = value else {
        return Err(invalid(format!(
            "expected a string of integers, got {value:?}"
        )));
    };
    if bytes.len() % 8 != 0 {
        return Err(invalid(format!(
            "{} bytes is not a whole number of integers",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

fn invalid(msg: String) -> StoreError {
    StoreError::new(StoreErrorKind::InvalidResponse, msg)
}

/// Turns one limit's five reply integers into a decision, reported with `limit`.
pub(crate) fn decision(
    info: &LimitInfo,
    limit: u64,
    r: &[i64],
) -> Result<(Decision, bool), StoreError> {
    let &[allowed, remaining, reset, retry, corrupt] = r else {
        return Err(invalid(format!("expected 5 integers per limit, got {r:?}")));
    };
    let (Ok(remaining), Ok(reset)) = (u64::try_from(remaining), u64::try_from(reset)) else {
        return Err(invalid(format!("negative remaining or reset in {r:?}")));
    };
    let reset = Duration::from_micros(reset);
    let d = match (allowed, retry) {
        (1, _) => Decision::allowed_with(limit, remaining, reset),
        (0, -1) => Decision::impossible(limit, remaining, reset),
        (0, retry) if retry > 0 => Decision::rejected(
            limit,
            remaining,
            reset,
            Duration::from_micros(retry.unsigned_abs()),
        ),
        _ => return Err(invalid(format!("malformed decision {r:?}"))),
    };
    Ok((d.with_policy(info.name), corrupt == 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

    #[test]
    fn reply_integers_keep_what_they_were_given_up_to_a_full_group() {
        for len in [0, 1, 6, 7, 11, 1 + 5 * MAX_LIMITS] {
            let given: Vec<i64> = (0..len as i64).map(|i| i * 7 - 3).collect();
            let ints = Ints::from_slice(&given).expect("within a group's size");
            assert_eq!(&ints[..], &given[..], "{len} integers");
            assert_eq!(matches!(ints, Ints::One { .. }), len <= ONE_LIMIT);
        }
        assert!(Ints::from_slice(&[0; 2 + 5 * MAX_LIMITS]).is_none());
    }

    fn params(kind: AlgorithmKind) -> ScriptParams {
        QuotaArg::of(&PlanQuota::new(kind, Quota::per_minute(10)).unwrap()).params
    }

    #[test]
    fn the_script_is_its_files_in_the_documented_order() {
        let p = ScriptParams {
            ttl_ms: 2000,
            p: [100_000, 1, 2_000_000],
        };
        let fw = params(AlgorithmKind::FixedWindow);
        let limits = [
            (AlgorithmKind::LeakyBucket, p),
            (AlgorithmKind::FixedWindow, fw),
            (AlgorithmKind::TokenBucket, p),
        ];
        let script = LuaScript::assemble(&limits);
        let [a, b, c] = fw.p;
        // Limit 0 is a leaky bucket: no fused batch check, so no FAST.
        let batch =
            "-- How this store's batches run, generated from its configuration (lead.lua).\n\
             local PREFETCH = true\n\
             local FAST, FAST_TTL, FAST_P1, FAST_P2, FAST_P3, FAST_CELL, FAST_KEEP = false\n";
        let config = format!(
            "-- This store's limits, generated from its configuration: CONFIG(i) returns limit i's\n\
             -- algorithm, ttl_ms, p1, p2, p3; nothing past the last limit.\n\
             local function CONFIG(i)\n  \
             if i == 0 then return lb_algorithm, '2000', 100000, 1, 2000000 end\n  \
             if i == 1 then return fw_algorithm, '{}', {a}, {b}, {c} end\n  \
             if i == 2 then return tb_algorithm, '2000', 100000, 1, 2000000 end\n\
             end\n",
            fw.ttl_ms,
        );
        // Each file once, in the order of first use; the leaky bucket's after the token bucket's.
        let files = [
            PRELUDE,
            batch,
            LEAD,
            STATE,
            TOKEN_BUCKET,
            LEAKY_BUCKET,
            FIXED_WINDOW,
            &config,
            DISPATCH,
        ];
        assert_eq!(script.code(), [&files[..], &[DRIVER]].concat().join("\n"));
        assert_eq!(script.sha().len(), 40);
        let lease = script.with_driver(LEASE_DRIVER);
        assert_eq!(
            lease.code(),
            [&files[..], &[LEASE_DRIVER]].concat().join("\n")
        );
        assert_ne!(lease.sha(), script.sha());
    }

    #[test]
    fn limit_0s_fused_batch_check_comes_before_the_lead() {
        let tb = params(AlgorithmKind::TokenBucket);
        let fw = params(AlgorithmKind::FixedWindow);
        for (limits, fused, name) in [
            (
                vec![(AlgorithmKind::TokenBucket, tb)],
                Some(TOKEN_BUCKET_FAST),
                "tb_fast",
            ),
            (
                vec![(AlgorithmKind::FixedWindow, fw)],
                Some(FIXED_WINDOW_FAST),
                "fw_fast",
            ),
            // A sliding log among the limits: batches do not read ahead, so nothing is fused.
            (
                vec![
                    (AlgorithmKind::TokenBucket, tb),
                    (AlgorithmKind::SlidingLog, params(AlgorithmKind::SlidingLog)),
                ],
                None,
                "",
            ),
            (vec![(AlgorithmKind::Gcra, tb)], None, ""),
        ] {
            let code = LuaScript::assemble(&limits).code().to_owned();
            let lead = code.find(LEAD).expect("the lead");
            assert!(code.find(STATE).expect("the state helpers") > lead);
            assert!(code.find("local function CONFIG(i)").expect("CONFIG") > lead);
            let prefetch = !limits.iter().any(|(k, _)| *k == AlgorithmKind::SlidingLog);
            assert!(code.contains(&format!("local PREFETCH = {prefetch}\n")));
            match fused {
                Some(source) => {
                    let at = code.find(source).expect("the fused check");
                    assert!(at < lead, "{name}");
                    assert!(
                        code[at..lead].contains(&format!("=\n  {name}, '")),
                        "{name}"
                    );
                }
                None => {
                    assert!(!code.contains(TOKEN_BUCKET_FAST) && !code.contains(FIXED_WINDOW_FAST));
                }
            }
        }
    }

    #[test]
    fn the_sha_names_one_configuration() {
        let p = params(AlgorithmKind::TokenBucket);
        let tb = LuaScript::assemble(&[(AlgorithmKind::TokenBucket, p)]);
        assert!(tb.code().contains("local function tb_decide("));
        assert!(!tb.code().contains("local function gcra_decide("));
        assert!(!tb.code().contains("local function lb_algorithm("));
        let again = LuaScript::assemble(&[(AlgorithmKind::TokenBucket, p)]);
        assert_eq!(again.sha(), tb.sha(), "same configuration, same script");
        let other =
            LuaScript::assemble(&[(AlgorithmKind::TokenBucket, ScriptParams { ttl_ms: 1, ..p })]);
        assert_ne!(other.sha(), tb.sha());
    }

    /// What `<short>_algorithm()` returns for `kind`, from its file: load, decide, apply, refund,
    /// rebase, check.
    fn registration(kind: AlgorithmKind) -> Vec<String> {
        let AlgorithmScript { short, sources } = script_of(kind);
        let source = sources.last().expect("a file");
        let head = format!("\nlocal function {short}_algorithm()\n  return ");
        let at = source
            .find(&head)
            .unwrap_or_else(|| panic!("{kind} defines {short}_algorithm"));
        let body = &source[at + head.len()..];
        let body = &body[..body.find('\n').expect("one line")];
        body.split(',').map(|v| v.trim().to_owned()).collect()
    }

    #[test]
    fn every_algorithm_gives_the_dispatch_what_it_calls() {
        for kind in AlgorithmKind::ALL {
            let code: String = script_of(kind).sources.concat();
            let returned = registration(kind);
            let [load, decide, apply, refund, rebase, check] = &returned[..] else {
                panic!("{kind}: six values, got {returned:?}");
            };
            let defined = |f: &str| {
                let def = |c: &str| {
                    c.contains(&format!("local function {f}("))
                        || c.contains(&format!("local {f} = "))
                };
                def(&code) || def(PRELUDE) || def(STATE)
            };
            for f in [load, decide, apply, refund, rebase] {
                assert!(defined(f), "{kind}: {f}");
            }
            // Only the buckets decide and apply in one call; the token bucket and the fixed
            // window have a fused batch check (and a compact reply).
            let buckets = matches!(
                kind,
                AlgorithmKind::TokenBucket | AlgorithmKind::Gcra | AlgorithmKind::LeakyBucket
            );
            assert_eq!(check != "false", buckets, "{kind}: {check}");
            assert!(check == "false" || defined(check), "{kind}: {check}");
            let fused = matches!(
                kind,
                AlgorithmKind::TokenBucket | AlgorithmKind::FixedWindow
            );
            assert_eq!(
                CompactForm::of(&[(kind, params(kind))]).is_some(),
                fused,
                "{kind}"
            );
        }
        // Defined before they are read.
        let all: Vec<_> = AlgorithmKind::ALL
            .into_iter()
            .map(|k| (k, params(k)))
            .collect();
        let code = LuaScript::assemble(&all).code().to_owned();
        let at = |s: &str| code.find(s).unwrap_or_else(|| panic!("{s}"));
        for kind in AlgorithmKind::ALL {
            let short = script_of(kind).short;
            let defined = at(&format!("local function {short}_algorithm()"));
            assert!(defined < at("local function CONFIG(i)"), "{kind}");
        }
        assert!(at("local function CONFIG(i)") < at("local function LIMIT(i)"));
        assert!(at("local PREFETCH = ") < at("if FAST and ARGV[1] == 'B' then"));
        assert!(at("local LEAD_NOW,") < at("LEAD_NOW, LEAD_FROM, LEAD_INTS"));
    }

    #[test]
    fn ttl_keeping_writes_stay_inside_the_ttl() {
        // A 60 s ttl: cells of 7.5 s; a write keeps the TTL if the bucket refills within
        // 60 - 7.5 - 0.002 s.
        assert_eq!(keep_ttl_window(60_000), (7_500_000, 52_498_000));
        // The bound plus a cell never reaches the ttl less 2 ms.
        for ttl_ms in [1, 2, 3, 8, 17, 300, 1_001, 86_400_000, u64::MAX / 1000] {
            let (cell, keep) = keep_ttl_window(ttl_ms);
            assert!(cell >= 1);
            if keep >= 0 {
                let keep = u64::try_from(keep).unwrap();
                assert!(keep + cell + 2000 <= ttl_ms * 1000, "{ttl_ms} ms");
            }
        }
        // Too short to keep anything: every write sets the TTL.
        assert_eq!(keep_ttl_window(2).1, -1);
        assert_eq!(keep_ttl_window(0), (1, -1));
    }

    #[test]
    fn refund_headers_carry_the_reservation_time() {
        let args = |kind, now, reserved_at| {
            let group = Group {
                keys: vec!["k".into()],
                limits: vec![LimitArg {
                    limit: 0,
                    cost: 3,
                    quota: None,
                }],
                now,
                reserved_at,
            };
            let mut cmd = redis::cmd("EVALSHA");
            pack_args(&mut cmd, kind, std::iter::once(&group), false);
            cmd.args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => "<cursor>".to_owned(),
                })
                .collect::<Vec<_>>()
        };
        fn call(header: &str, kind: &str) -> Vec<String> {
            ["EVALSHA", "1", "k", kind, "1", header, "0", "3"]
                .map(String::from)
                .to_vec()
        }
        assert_eq!(args(CallKind::Check, None, None), call("", "c"));
        assert_eq!(args(CallKind::Check, Some(5), None), call("1@5", "c"));
        assert_eq!(args(CallKind::Refund, None, Some(7)), call("1r7", "r"));
        assert_eq!(args(CallKind::Refund, Some(9), Some(7)), call("1@9r7", "r"));
    }

    #[test]
    fn a_node_batch_declares_no_key_and_passes_its_keys_first() {
        let group = |key: &str, cost| Group {
            keys: vec![key.into()],
            limits: vec![LimitArg {
                limit: 0,
                cost,
                quota: None,
            }],
            now: None,
            reserved_at: None,
        };
        let groups = [group("a", 1), group("b", 2)];
        let args = |node| {
            let mut cmd = redis::cmd("EVALSHA");
            pack_args(&mut cmd, CallKind::Batch, groups.iter(), node);
            arg_strings(&cmd, 1)
        };
        assert_eq!(args(false), ["2", "a", "b", "b", "1", "2"]);
        assert_eq!(args(true), ["0", "n", "2", "a", "b", "b", "1", "2"]);
    }

    /// A group of one limit's check of `key` at the server's time, without a plan.
    fn one_limit(key: &str, limit: usize, cost: u64) -> Group {
        Group {
            keys: vec![key.to_owned()],
            limits: vec![LimitArg {
                limit,
                cost,
                quota: None,
            }],
            now: None,
            reserved_at: None,
        }
    }

    #[test]
    fn a_batch_of_distinct_keys_of_limit_0_is_told_apart_at_every_size() {
        let group = |key: String, limit, cost| one_limit(&key, limit, cost);
        // Keys alike but for one byte, in the middle or at the end, as a batch's keys are.
        let key = |i: usize| format!("rl:{{{i:016x}}}:tb:hourly:h.{:032x}", i % 97);
        for n in [1, 2, 7, 63, SEEN_KEYS, SEEN_KEYS + 1, 200, 1024] {
            let mut groups: Vec<Group> = (0..n).map(|i| group(key(i), 0, 1)).collect();
            assert!(each_of_limit_0(groups.iter()), "{n} distinct keys");
            // A repeated key, first or last, is found wherever it is.
            for (at, of) in [(n - 1, 0), (0, n - 1), (n / 2, n / 3)] {
                if at == of {
                    continue;
                }
                let was = std::mem::replace(&mut groups[at].keys[0], key(of));
                assert!(!each_of_limit_0(groups.iter()), "{n}: key {of} at {at}");
                groups[at].keys[0] = was;
            }
            groups[n - 1].limits[0].cost = 2;
            assert!(!each_of_limit_0(groups.iter()), "{n}: a cost of 2");
            groups[n - 1].limits[0] = LimitArg {
                limit: 1,
                cost: 1,
                quota: None,
            };
            assert!(!each_of_limit_0(groups.iter()), "{n}: limit 1");
        }
        // Keys equal in their last 16 bytes and length share a hash, and are still told apart.
        let groups: Vec<Group> = (0..SEEN_KEYS)
            .map(|i| group(format!("{i:02}{}", "x".repeat(20)), 0, 1))
            .collect();
        assert!(each_of_limit_0(groups.iter()));
    }

    /// `cmd`'s arguments after the first `skip`, as text.
    fn arg_strings(cmd: &redis::Cmd, skip: usize) -> Vec<String> {
        cmd.args_iter()
            .skip(skip)
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_plan_sends_its_parameters_with_its_check() {
        let plan =
            PlanQuota::new(AlgorithmKind::TokenBucket, Quota::per_second(10).burst(20)).unwrap();
        let arg = QuotaArg::of(&plan);
        assert_eq!(arg.params.p, [100_000, 1, 2_000_000]);
        assert_eq!((arg.params.ttl_ms, arg.limit), (2_000, 20));
        let group = |limit, quota| Group {
            keys: vec!["k".into()],
            limits: vec![LimitArg {
                limit,
                cost: 3,
                quota,
            }],
            now: None,
            reserved_at: None,
        };
        let args = |kind, g: &Group| {
            let mut cmd = redis::cmd("EVALSHA");
            pack_args(&mut cmd, kind, std::iter::once(g), false);
            arg_strings(&cmd, 3)
        };
        // Without a plan, only the limit and the cost.
        assert_eq!(args(CallKind::Batch, &group(0, None)), ["b", "3"]);
        assert_eq!(args(CallKind::Batch, &group(2, None)), ["b", "2:3"]);
        assert_eq!(
            args(CallKind::Check, &group(2, None)),
            ["c", "1", "", "2", "3"]
        );
        // With one, its ttl and parameters.
        assert_eq!(
            args(CallKind::Batch, &group(0, Some(arg))),
            ["b", "0:3:2000:100000:1:2000000"]
        );
        assert_eq!(
            args(CallKind::Check, &group(1, Some(arg))),
            ["c", "1", "", "1:2000:100000:1:2000000", "3"]
        );
    }

    #[test]
    fn a_batch_of_distinct_keys_at_limit_0_and_cost_1_goes_without_arguments() {
        let one = one_limit;
        let args = |groups: &[Group]| {
            let mut cmd = redis::cmd("EVALSHA");
            pack_args(&mut cmd, CallKind::Batch, groups.iter(), false);
            arg_strings(&cmd, 1)
        };
        assert_eq!(
            args(&[one("a", 0, 1), one("b", 0, 1)]),
            ["2", "a", "b", "B"]
        );
        // A key twice, another limit or another cost: each check's argument follows.
        assert_eq!(
            args(&[one("a", 0, 1), one("a", 0, 1)]),
            ["2", "a", "a", "b", "1", "1"]
        );
        assert_eq!(
            args(&[one("a", 0, 1), one("b", 1, 1)]),
            ["2", "a", "b", "b", "1", "1:1"]
        );
        assert_eq!(
            args(&[one("a", 0, 2), one("b", 0, 1)]),
            ["2", "a", "b", "b", "2", "1"]
        );
    }

    #[test]
    fn a_reconfigured_limit_keeps_the_scripts_parameters_and_sends_its_own() {
        let spec = |q| LimitSpec::new(Name::new("b"), q, AlgorithmKind::FixedWindow);
        let before = limit_info(&spec(Quota::per_minute(5)), "b".into()).unwrap();
        let mut same = limit_info(&spec(Quota::per_minute(5)), "b".into()).unwrap();
        same.inherit(&before);
        assert_eq!((same.params, same.own), (before.params, None));
        let mut raised = limit_info(&spec(Quota::per_minute(10)), "b".into()).unwrap();
        raised.inherit(&before);
        assert_eq!(raised.params, before.params, "unmarked keys read as before");
        let own = raised.own.expect("its own quota goes with each check");
        assert_eq!((own.params.p, own.limit), ([60_000_000, 10, 0], 10));
        let mut again = limit_info(&spec(Quota::per_minute(3)), "b".into()).unwrap();
        again.inherit(&raised);
        assert_eq!(
            again.params, before.params,
            "inherited through every reload"
        );
        assert_eq!(again.own.unwrap().limit, 3);
    }

    #[test]
    fn token_bucket_params_follow_the_fixed_point() {
        let spec = LimitSpec::new(
            Name::new("b"),
            Quota::per_second(10).burst(20),
            AlgorithmKind::TokenBucket,
        );
        let info = limit_info(&spec, "b".into()).unwrap();
        assert_eq!(info.params.p, [100_000, 1, 2_000_000]);
        assert_eq!(info.params.ttl_ms, 2_000);
        assert_eq!(info.limit, 20);
    }

    #[test]
    fn replies_are_validated() {
        let spec = LimitSpec::new(
            Name::new("b"),
            Quota::per_second(1),
            AlgorithmKind::TokenBucket,
        );
        let info = limit_info(&spec, "b".into()).unwrap();
        let (d, corrupt) = decision(&info, info.limit, &[0, 0, 1_000_000, 500_000, 1]).unwrap();
        assert!(!d.allowed() && corrupt);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        assert!(
            decision(&info, info.limit, &[0, 0, 1, 0, 0]).is_err(),
            "rejected needs a positive retry"
        );
        assert!(decision(&info, info.limit, &[1, -1, 1, 0, 0]).is_err());
        assert!(decision(&info, info.limit, &[1, 1]).is_err());
        assert!(reply_ints(Value::Okay).is_err());
        assert!(reply_ints(Value::BulkString(vec![0; 7])).is_err());
        let mut bytes = 5i64.to_le_bytes().to_vec();
        bytes.extend((-1i64).to_le_bytes());
        assert_eq!(reply_ints(Value::BulkString(bytes)).unwrap(), [5, -1]);
    }
}
