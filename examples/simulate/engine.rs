//! The simulator's core: a request stream in, every algorithm's decisions out (through the real
//! `MemoryStore` and a `ManualClock`), and what those decisions amount to: the most admitted in
//! any window of the limit's period, over every window position, against the bound the docs
//! promise, and how often each algorithm disagrees with the exact sliding log.
//!
//! No arithmetic of the algorithms is copied here: the store decides, this module only counts.
//! `tests/simulator_*.rs` include this file with `#[path]`, so the example and the tests measure
//! with the same code.

use std::fmt::Write as _;

use tollgate::algorithm::AlgorithmKind;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{memory::MemoryBackend, Backend, LimitSpec};
use tollgate::{Name, Quota};

/// One second in microseconds.
pub const SECOND: u64 = 1_000_000;

/// One request of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Microseconds since the stream's origin (the clock's zero, so window seams fall on
    /// multiples of the period).
    pub at: u64,
    /// Index into [`Stream::keys`].
    pub key: usize,
    /// Units the request spends.
    pub cost: u64,
}

/// A request stream, ordered by time.
#[derive(Debug, Clone, Default)]
pub struct Stream {
    /// The requests, in time order.
    pub requests: Vec<Request>,
    /// The distinct keys, by index.
    pub keys: Vec<String>,
    /// Where the stream ends (for drawing): at least the last request's time.
    pub end: u64,
}

impl Stream {
    fn push(&mut self, at: u64, key: usize, cost: u64) {
        self.requests.push(Request { at, key, cost });
        self.end = self.end.max(at);
    }

    fn single(end: u64) -> Self {
        Self {
            requests: Vec::new(),
            keys: vec!["client".to_owned()],
            end,
        }
    }
}

/// The named scenarios.
#[derive(Debug, Clone, PartialEq)]
pub enum Scenario {
    /// The seeds' window-edge traffic: `count` requests spread over the last tenth of a window
    /// and `count` over the first tenth of the next, at two seams.
    Edge,
    /// A burst of twice the count at once, then a steady stream at twice the rate.
    Burst,
    /// Poisson arrivals at 0.8×, 1× and 2× the rate (or only at `rate` × the rate),
    /// `windows` periods each, seeded.
    Steady {
        /// Periods per phase.
        windows: u64,
        /// RNG seed.
        seed: u64,
        /// One phase at this multiple of the rate instead of the three.
        rate: Option<f64>,
    },
    /// An attacker timing bursts at window seams: `count` just before each seam, `count` right
    /// on it, then a trickle at twice the rate until the next seam.
    SeamAttack,
    /// A user's log file: one request per line, `SECONDS [KEY [COST]]`.
    Replay(String),
    /// A log pasted into the lab page, in the same format as [`Scenario::Replay`]'s file.
    Pasted(String),
}

impl Scenario {
    /// The names `--scenario` accepts (replay also takes a file).
    pub const NAMES: [&'static str; 5] = ["edge", "burst", "steady", "seam-attack", "replay"];

    /// Parses a scenario name; `replay` needs `file`.
    pub fn parse(name: &str, file: Option<&str>) -> Result<Self, String> {
        match name {
            "edge" => Ok(Self::Edge),
            "burst" => Ok(Self::Burst),
            "steady" => Ok(Self::Steady {
                windows: 20,
                seed: 12,
                rate: None,
            }),
            "seam-attack" => Ok(Self::SeamAttack),
            "replay" => file
                .map(|f| Self::Replay(f.to_owned()))
                .ok_or_else(|| "replay needs a file: --scenario replay FILE".to_owned()),
            other => Err(format!(
                "unknown scenario {other:?}; use one of {}",
                Self::NAMES.join(", ")
            )),
        }
    }

    /// The scenario's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Edge => "edge",
            Self::Burst => "burst",
            Self::Steady { .. } => "steady",
            Self::SeamAttack => "seam-attack",
            Self::Replay(_) | Self::Pasted(_) => "replay",
        }
    }

    /// The request stream for `quota` (scenarios scale with its count and period).
    pub fn stream(&self, quota: &Quota) -> Result<Stream, String> {
        let count = quota.count();
        let period = quota.period_micros();
        Ok(match self {
            Self::Edge => edge(count, period),
            Self::Burst => burst(count, period),
            Self::Steady {
                windows,
                seed,
                rate,
            } => match rate {
                Some(factor) => poisson(count, period, &[*factor], *windows, *seed),
                None => poisson(count, period, &[0.8, 1.0, 2.0], *windows, *seed),
            },
            Self::SeamAttack => seam_attack(count, period),
            Self::Replay(file) => {
                let text = std::fs::read_to_string(file)
                    .map_err(|e| format!("cannot read the replay file {file:?}: {e}"))?;
                parse_replay(&text, period).map_err(|e| format!("{file}: {e}"))?
            }
            Self::Pasted(text) => {
                parse_replay(text, period).map_err(|e| format!("the pasted log, {e}"))?
            }
        })
    }

    /// What the traffic is and what to look for in the lanes, for `quota` and the `stream` it
    /// produced (one short paragraph, shown under the title).
    pub fn caption(&self, quota: &Quota, stream: &Stream) -> String {
        let c = quota.count();
        let p = secs(quota.period_micros());
        let tenth = secs(quota.period_micros() / 10);
        match self {
            Self::Edge => format!(
                "Traffic: {c} requests in the last {tenth} before the window seams at {p} and \
                 {} and {c} in the first {tenth} after each. Look for: at the first seam the \
                 fixed window lets all {} through, twice its limit and exactly its promise; the \
                 sliding counter lets a few extra through; the sliding log never more than {c} \
                 in any {p}.",
                secs(2 * quota.period_micros()),
                2 * c
            ),
            Self::Burst => format!(
                "Traffic: {} requests at once at {tenth}, then a steady stream at twice the rate \
                 ({} per {p}) for {}. Look for: the buckets admit a full bucket ({}) at once, \
                 then one request per refill ({}); the window algorithms admit {c} and then \
                 wait for their window to move.",
                2 * c,
                2 * c,
                secs(3 * quota.period_micros()),
                quota.burst_size(),
                secs(quota.period_micros() / c.max(1)),
            ),
            Self::Steady { windows, rate, .. } => {
                let phases = match rate {
                    Some(f) => format!("{f}×"),
                    None => "0.8×, then 1×, then 2×".to_owned(),
                };
                format!(
                    "Traffic: random (Poisson) arrivals on one key at {phases} the rate, {windows} \
                     periods of {p} each. Look for: below the rate every algorithm admits nearly \
                     everything; at and above it they admit about as much but disagree on which \
                     requests, as the last column counts."
                )
            }
            Self::SeamAttack => format!(
                "Traffic: an attacker sends {c} requests just before each of three window seams \
                 and {c} right on it, then trickles at twice the rate until the next. Look for: \
                 the fixed window and the sliding counter let up to {} through in one {p} (they \
                 promise {c} per aligned window, not per sliding one); the sliding log holds \
                 {c}; the buckets stay within burst + rate × time.",
                2 * c
            ),
            Self::Replay(_) | Self::Pasted(_) => {
                let span = match (stream.requests.first(), stream.requests.last()) {
                    (Some(a), Some(b)) => secs(b.at - a.at),
                    _ => secs(0),
                };
                let keys = match stream.keys.len() {
                    1 => "one key".to_owned(),
                    n => format!("{n} keys"),
                };
                format!(
                    "Traffic: your log, {} requests from {keys} over {span}. Look for: where the \
                     lanes part ways, and the shaded {p} in which each algorithm admitted the \
                     most (for the key that came closest to the limit).",
                    stream.requests.len()
                )
            }
        }
    }
}

/// `n` requests spread evenly over `[from, from + span)`.
fn spread(stream: &mut Stream, n: u64, from: u64, span: u64) {
    for i in 0..n {
        stream.push(from + span * i / n, 0, 1);
    }
}

/// The seeds' window-edge traffic: with 5 per 10 s, requests at 9.0, 9.2 … 9.8 s and 10.0 …
/// 10.8 s, and again across the 20 s seam.
fn edge(count: u64, period: u64) -> Stream {
    let mut s = Stream::single(3 * period);
    for seam in [period, 2 * period] {
        spread(&mut s, count, seam - period / 10, period / 10);
        spread(&mut s, count, seam, period / 10);
    }
    s
}

/// `2 × count` at a tenth of a period, then twice the rate for three periods.
fn burst(count: u64, period: u64) -> Stream {
    let mut s = Stream::single(4 * period);
    let start = period / 10;
    for _ in 0..2 * count {
        s.push(start, 0, 1);
    }
    spread(&mut s, 6 * count, start + period / (2 * count), 3 * period);
    s
}

/// `count` just before each of three seams, `count` right on it, then twice the rate.
fn seam_attack(count: u64, period: u64) -> Stream {
    let mut s = Stream::single(4 * period);
    let before = (period / 100).max(1);
    for seam in [period, 2 * period, 3 * period] {
        for _ in 0..count {
            s.push(seam - before, 0, 1);
        }
        for _ in 0..count {
            s.push(seam, 0, 1);
        }
        spread(&mut s, 2 * count, seam + 1, period - before - 1);
    }
    s
}

/// Poisson arrivals on one key, in phases of `windows` periods at each of `factors` × the rate
/// `count / period`.
pub fn poisson(count: u64, period: u64, factors: &[f64], windows: u64, seed: u64) -> Stream {
    let mut s = Stream::single(factors.len() as u64 * windows * period);
    let mut rng = Rng::new(seed);
    let mut t = 0.0f64;
    for (phase, &factor) in factors.iter().enumerate() {
        let phase_end = ((phase as u64 + 1) * windows * period) as f64;
        let mean_gap = period as f64 / (count as f64 * factor);
        loop {
            t += rng.exponential(mean_gap);
            if t >= phase_end {
                t = phase_end;
                break;
            }
            s.push(t as u64, 0, 1);
        }
    }
    s
}

/// The largest cost a replayed request may have (sums of costs then stay far from overflow).
pub const MAX_COST: u64 = 1_000_000_000;
/// The latest time a replayed request may have, in seconds (epoch seconds are about 1.8 × 10^9).
pub const MAX_SECONDS: u64 = 100_000_000_000;

/// Parses a replay log: one request per line, `SECONDS [KEY [COST]]` (fields split by spaces,
/// tabs or commas; blank lines and `#` comments skipped). Times are decimal seconds; epoch
/// seconds work: the clock's origin is the earliest time rounded down to a multiple of `period`
/// (µs), so window seams stay where the log's own clock puts them (on the minute, for a
/// minute's limit). The stream is sorted by time.
pub fn parse_replay(text: &str, period: u64) -> Result<Stream, String> {
    let mut rows: Vec<(u64, String, u64)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
        let mut fields = line
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|f| !f.is_empty());
        let at = fields
            .next()
            .and_then(parse_seconds)
            .filter(|&at| at <= MAX_SECONDS * SECOND)
            .ok_or_else(|| {
                bad("the first field must be a time in decimal seconds (12.5), at most 10^11")
            })?;
        let key = fields.next().unwrap_or("client");
        if key.len() > 256 {
            return Err(bad("the key is longer than 256 bytes"));
        }
        let cost = match fields.next() {
            None => 1,
            Some(c) => c
                .parse::<u64>()
                .ok()
                .filter(|&c| c <= MAX_COST)
                .ok_or_else(|| {
                    bad("the cost (third field) must be a whole number up to 1000000000")
                })?,
        };
        if fields.next().is_some() {
            return Err(bad("expected at most three fields: SECONDS [KEY [COST]]"));
        }
        rows.push((at, key.to_owned(), cost));
    }
    if rows.is_empty() {
        return Err("no requests: expected one line per request, SECONDS [KEY [COST]]".to_owned());
    }
    rows.sort_by_key(|r| r.0);
    let origin = rows[0].0 - rows[0].0 % period.max(1);
    let mut stream = Stream::default();
    let mut index = std::collections::HashMap::new();
    for (at, key, cost) in rows {
        let next = index.len();
        let k = *index.entry(key.clone()).or_insert_with(|| {
            stream.keys.push(key);
            next
        });
        stream.push(at - origin, k, cost);
    }
    Ok(stream)
}

/// Decimal seconds to microseconds, exactly (no float rounding), at most 6 decimals.
fn parse_seconds(text: &str) -> Option<u64> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && frac.is_empty() || frac.len() > 6 {
        return None;
    }
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(frac) {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac: u64 = format!("{frac:0<6}").parse().ok()?;
    whole.checked_mul(SECOND)?.checked_add(frac)
}

/// A deterministic xorshift64* generator (the simulator needs no crypto and no dependency).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (any value).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A uniform float in (0, 1].
    pub fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// An exponential variate of mean `mean`.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -self.unit().ln() * mean
    }
}

/// The quota an algorithm runs with: the window algorithms take no burst, so theirs is dropped.
pub fn quota_for(kind: AlgorithmKind, quota: &Quota) -> Quota {
    match kind {
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow | AlgorithmKind::SlidingLog => {
            Quota::per(quota.period(), quota.count())
        }
        _ => *quota,
    }
}

/// One limit per algorithm, in [`AlgorithmKind::ALL`] order.
pub fn specs(quota: &Quota) -> Vec<LimitSpec> {
    AlgorithmKind::ALL
        .iter()
        .map(|&k| LimitSpec::new(Name::new(k.as_str()), quota_for(k, quota), k))
        .collect()
}

/// Every algorithm's decisions on `stream`, in [`AlgorithmKind::ALL`] order: the stream runs
/// through one real `MemoryStore` (one limit per algorithm) on a `ManualClock` set to each
/// request's time.
pub fn decide_memory(stream: &Stream, quota: &Quota) -> Result<Vec<Vec<bool>>, String> {
    let clock = ManualClock::new();
    let store = MemoryBackend::new()
        .max_keys(stream.keys.len().max(1) * 2)
        .clock(clock.clone())
        .build(&specs(quota))
        .map_err(|e| e.to_string())?;
    let keys: Vec<Key<'_>> = stream
        .keys
        .iter()
        .map(|k| Key::string(k.as_str()))
        .collect();
    let mut out = vec![Vec::with_capacity(stream.requests.len()); AlgorithmKind::ALL.len()];
    for r in &stream.requests {
        clock.set_micros(r.at);
        for (limit, decisions) in out.iter_mut().enumerate() {
            let d = store
                .check_one(limit, &keys[r.key], r.cost)
                .map_err(|e| e.to_string())?;
            decisions.push(d.allowed());
        }
    }
    Ok(out)
}

/// The busiest window of one period: the most units admitted in any `[t, t + period)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Worst {
    /// Units admitted in it.
    pub units: u64,
    /// The key it belongs to.
    pub key: usize,
    /// First admitted request in it (µs).
    pub first: u64,
    /// Last admitted request in it (µs); `last - first` is how tightly they came.
    pub last: u64,
}

/// The most units admitted by one key in any half-open window of `period` µs, over every window
/// position (a two-pointer sweep per key; among equal counts, the tightest span wins).
pub fn worst_window(stream: &Stream, admitted: &[bool], period: u64) -> Worst {
    let mut per_key: Vec<Vec<(u64, u64)>> = vec![Vec::new(); stream.keys.len()];
    for (r, _) in stream.requests.iter().zip(admitted).filter(|&(_, &a)| a) {
        per_key[r.key].push((r.at, r.cost));
    }
    let mut best = Worst::default();
    for (key, events) in per_key.iter().enumerate() {
        let (mut i, mut sum) = (0, 0u64);
        for &(t, cost) in events {
            sum += cost;
            while t - events[i].0 >= period {
                sum -= events[i].1;
                i += 1;
            }
            let span = t - events[i].0;
            if sum > best.units || (sum == best.units && span < best.last - best.first) {
                best = Worst {
                    units: sum,
                    key,
                    first: events[i].0,
                    last: t,
                };
            }
        }
    }
    best
}

/// The most units admitted by one key inside any single aligned window `[k × period, (k+1) ×
/// period)`.
pub fn worst_aligned(stream: &Stream, admitted: &[bool], period: u64) -> u64 {
    let mut counts = std::collections::HashMap::new();
    for (r, _) in stream.requests.iter().zip(admitted).filter(|&(_, &a)| a) {
        *counts.entry((r.key, r.at / period)).or_insert(0u64) += r.cost;
    }
    counts.into_values().max().unwrap_or(0)
}

/// The most units the docs promise an algorithm admits in any window of one period:
/// the log `count`; the fixed window `2 × count` (across a seam); the sliding counter `2 ×
/// count` too (it never passes `count` in an aligned window, and a period spans two of them);
/// the buckets `burst + count` (capacity + rate × span).
pub fn bound(kind: AlgorithmKind, quota: &Quota) -> u64 {
    let q = quota_for(kind, quota);
    match kind {
        AlgorithmKind::SlidingLog => q.count(),
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow => 2 * q.count(),
        _ => q.burst_size() + q.count(),
    }
}

/// What one algorithm did with the stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// The algorithm.
    pub kind: AlgorithmKind,
    /// Requests offered.
    pub offered: usize,
    /// Requests admitted.
    pub admitted: usize,
    /// The busiest window of one period.
    pub worst: Worst,
    /// The promised bound on it.
    pub bound: u64,
    /// Requests an exact sliding log would have decided differently on the same history
    /// ([`disagreements`]).
    pub differs: usize,
    /// The most units admitted by one key inside a single aligned window.
    pub aligned: u64,
    /// The window algorithms' second promise: at most this many in an aligned window.
    pub aligned_bound: Option<u64>,
    /// The first algorithm (in [`AlgorithmKind::ALL`] order) that decided every request of the
    /// stream exactly as this one did, if any.
    pub same_as: Option<AlgorithmKind>,
}

impl Outcome {
    /// Whether the promises held.
    pub fn held(&self) -> bool {
        self.worst.units <= self.bound
            && match self.aligned_bound {
                Some(b) => self.aligned <= b,
                None => true,
            }
    }

    /// The share of decisions that differ from the sliding log, in percent.
    pub fn differs_percent(&self) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            100.0 * self.differs as f64 / self.offered as f64
        }
    }
}

/// How many of `admitted`'s decisions an exact sliding log would have made differently *on the
/// same history*: request `r` of key `k` fits the log when the units `k` had admitted in
/// `(r.at - period, r.at]` plus `r.cost` stay within `count`. This is the measure behind
/// Cloudflare's "0.003 % of requests wrongly allowed or rate limited": each decision is judged
/// against the true trailing-window count of what the limiter itself had let through, so one
/// early difference is counted once instead of shifting every later decision. (The crate's
/// `SlidingLog` must score 0 here: `tests/simulator/simulator_bounds.rs` checks it.)
pub fn disagreements(stream: &Stream, admitted: &[bool], quota: &Quota) -> usize {
    let (count, period) = (quota.count(), quota.period_micros());
    let mut windows: Vec<(std::collections::VecDeque<(u64, u64)>, u64)> =
        vec![Default::default(); stream.keys.len()];
    let mut wrong = 0;
    for (r, &allowed) in stream.requests.iter().zip(admitted) {
        let (live, used) = &mut windows[r.key];
        while let Some(&(at, cost)) = live.front() {
            if at + period > r.at {
                break;
            }
            live.pop_front();
            *used -= cost;
        }
        let exact = *used + r.cost <= count;
        wrong += usize::from(exact != allowed);
        if allowed {
            live.push_back((r.at, r.cost));
            *used += r.cost;
        }
    }
    wrong
}

/// Counts what each algorithm's decisions amount to.
pub fn analyse(stream: &Stream, quota: &Quota, decisions: &[Vec<bool>]) -> Vec<Outcome> {
    AlgorithmKind::ALL
        .iter()
        .zip(decisions)
        .enumerate()
        .map(|(n, (&kind, d))| Outcome {
            same_as: decisions[..n]
                .iter()
                .position(|earlier| earlier == d)
                .map(|i| AlgorithmKind::ALL[i]),
            kind,
            offered: d.len(),
            admitted: d.iter().filter(|&&a| a).count(),
            worst: worst_window(stream, d, quota.period_micros()),
            bound: bound(kind, quota),
            differs: disagreements(stream, d, quota),
            aligned: worst_aligned(stream, d, quota.period_micros()),
            aligned_bound: match kind {
                AlgorithmKind::FixedWindow
                | AlgorithmKind::SlidingWindow
                | AlgorithmKind::SlidingLog => Some(quota.count()),
                _ => None,
            },
        })
        .collect()
}

/// The table's header.
pub const HEADER: [&str; 7] = [
    "algorithm",
    "offered",
    "admitted",
    "most in any window",
    "promised",
    "held",
    "unlike an exact count",
];

/// What the table's last column counts, for `quota` (printed under the table).
pub fn table_note(quota: &Quota) -> String {
    format!(
        "held: whether the most admitted in any window stayed within what the algorithm promises. \
         Unlike an exact count: the requests that an exact count of the last {} (the sliding \
         log's rule) would have decided the other way, given what the algorithm had admitted \
         before them.",
        secs(quota.period_micros())
    )
}

/// Seconds, to the millisecond, without trailing zeros ("9.8 s").
pub fn secs(micros: u64) -> String {
    let text = format!("{:.3}", micros as f64 / SECOND as f64);
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} s")
}

/// A percentage with the digits that mean something: "0 %", "25 %", "1.1 %", "0.0031 %" (two
/// significant digits at most, and never "0 %" for a nonzero share).
pub fn percent(p: f64) -> String {
    if p <= 0.0 || !p.is_finite() {
        return "0 %".to_owned();
    }
    let decimals = if p >= 10.0 {
        0
    } else {
        // One decimal at 1 %, two at 0.1 %, ...: two significant digits.
        (1.0 - p.log10().floor()) as usize
    };
    let text = format!("{p:.decimals$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    format!("{text} %")
}

/// `count` per `period` as a rate: "0.5/s" when that is exact to the millisecond, otherwise
/// "(100 per 60 s)".
fn rate(count: u64, period: u64) -> String {
    let per_second_milli = u128::from(count) * 1_000_000_000 / u128::from(period.max(1));
    if per_second_milli * u128::from(period.max(1)) == u128::from(count) * 1_000_000_000 {
        let text = format!("{:.3}", per_second_milli as f64 / 1000.0);
        format!("{}/s", text.trim_end_matches('0').trim_end_matches('.'))
    } else {
        format!("({count} per {})", secs(period))
    }
}

/// The bound `kind` promises at `quota`, explained in one line with the numbers filled in.
pub fn promise(kind: AlgorithmKind, quota: &Quota) -> String {
    let q = quota_for(kind, quota);
    let (c, period) = (q.count(), q.period_micros());
    let p = secs(period);
    match kind {
        AlgorithmKind::FixedWindow => format!(
            "at most {c} in each aligned window ([0, {p}), [{p}, {}), …), so up to 2 × {c} = {} \
             in a {p} window that straddles a seam",
            secs(2 * period),
            bound(kind, quota)
        ),
        AlgorithmKind::SlidingWindow => format!(
            "at most {c} in each aligned window; its estimate lets up to 2 × {c} = {} through a \
             {p} window against bursts timed at the seams",
            bound(kind, quota)
        ),
        AlgorithmKind::SlidingLog => format!("at most {c} in any {p} window, counted exactly"),
        // The buckets, as in `bound`.
        _ => {
            format!(
                "at most burst + rate × t in any window of length t, so {} + {} × {p} = {} in {p}",
                q.burst_size(),
                rate(c, period),
                bound(kind, quota)
            )
        }
    }
}

/// Why `kind` decided every request as `reference` did.
pub fn why_same(kind: AlgorithmKind, reference: AlgorithmKind) -> &'static str {
    use AlgorithmKind::{Gcra, LeakyBucket, TokenBucket};
    match (reference, kind) {
        (TokenBucket, Gcra) => {
            "the same limit expressed two ways: GCRA keeps the token bucket as one timestamp, \
             the moment the bucket is full again, instead of a token count"
        }
        (TokenBucket | Gcra, LeakyBucket) => {
            "the same limit expressed two ways: a leaky bucket as a meter counts the units \
             queued where the token bucket counts the tokens left"
        }
        _ => "different rules that happen to agree on this traffic",
    }
}

/// One sentence per algorithm that decided exactly as an earlier one, saying so and why.
pub fn same_notes(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| {
            let reference = o.same_as?;
            Some(format!(
                "{} decided all {} requests exactly as {reference} did ({}).",
                o.kind,
                o.offered,
                why_same(o.kind, reference)
            ))
        })
        .collect()
}

/// "10 within 1.8 s (from 9 s)", or "5 at once (at 1 s)".
pub fn worst_text(worst: &Worst) -> String {
    if worst.units == 0 {
        "0".to_owned()
    } else if worst.first == worst.last {
        format!("{} at once (at {})", worst.units, secs(worst.first))
    } else {
        format!(
            "{} within {} (from {})",
            worst.units,
            secs(worst.last - worst.first),
            secs(worst.first)
        )
    }
}

/// The table's rows, as text: the CLI prints them, the lab page shows them.
pub fn rows(outcomes: &[Outcome]) -> Vec<[String; 7]> {
    outcomes
        .iter()
        .map(|o| {
            [
                o.kind.as_str().to_owned(),
                o.offered.to_string(),
                o.admitted.to_string(),
                worst_text(&o.worst),
                format!("at most {}", o.bound),
                if o.held() { "yes" } else { "NO" }.to_owned(),
                if o.differs == 0 {
                    "none".to_owned()
                } else {
                    format!("{} ({})", o.differs, percent(o.differs_percent()))
                },
            ]
        })
        .collect()
}

/// The table as aligned text.
pub fn render_table(rows: &[[String; 7]]) -> String {
    let mut widths = HEADER.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", padded.join(" | ").trim_end());
    };
    line(&HEADER.map(str::to_owned));
    line(&widths.map(|w| "-".repeat(w)));
    for row in rows {
        line(row);
    }
    out
}

/// A one-line description of the limit, e.g. "5 per 10 s".
pub fn describe(quota: &Quota) -> String {
    let burst = if quota.has_explicit_burst() {
        format!(", burst {} for the buckets", quota.burst_size())
    } else {
        String::new()
    };
    format!(
        "{} per {}{burst}",
        quota.count(),
        secs(quota.period_micros())
    )
}
