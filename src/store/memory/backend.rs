//! [`MemoryBackend`]: the in-memory store's configuration.

use super::any_table::AnyTable;
use super::store::MemoryStore;
use crate::clock::{Clock, DefaultClock};
use crate::error::ConfigError;
use crate::store::{Backend, LimitSpec, MAX_LIMITS};

/// Default shard counts never leave a shard with fewer keys than this. Shards fill unevenly (a
/// shard's share of the keys varies by about `1 / sqrt(share)`), and a full shard evicts even if
/// others have room, so small shards would make the bound much less exact (±1.6% at 4,096).
const MIN_KEYS_PER_SHARD: usize = 4_096;

/// Configuration of the in-memory store: key bound, shard count and clock.
///
/// The layer builder turns it into a [`MemoryStore`] with [`Backend::build`]; see the
/// [module docs](super) for the key bound and memory per key.
///
/// ```
/// use tollgate::clock::ManualClock;
/// use tollgate::store::{Backend, LimitSpec, memory::MemoryBackend};
/// use tollgate::{AlgorithmKind, Name, Quota};
///
/// let spec = LimitSpec::new(Name::new("api"), Quota::per_second(10), AlgorithmKind::TokenBucket);
/// let store = MemoryBackend::new()
///     .max_keys(50_000)
///     .shards(16)
///     .clock(ManualClock::new())
///     .build(&[spec])
///     .unwrap();
/// assert_eq!(store.max_keys(), 50_000);
///
/// // A bound of zero keys cannot hold anything: it is a configuration error.
/// let err = MemoryBackend::new().max_keys(0).build(&[spec]).unwrap_err();
/// assert_eq!(err.field(), "memory.max_keys");
/// ```
#[derive(Debug, Clone)]
pub struct MemoryBackend<C = DefaultClock> {
    max_keys: usize,
    shards: Option<usize>,
    clock: C,
}

impl MemoryBackend {
    /// Keys kept per limit unless [`max_keys`](Self::max_keys) says otherwise: 100,000, about
    /// 4 MB per token-bucket limit when full.
    pub const DEFAULT_MAX_KEYS: usize = 100_000;

    /// Most shards a table may have.
    pub const MAX_SHARDS: usize = 1 << 16;

    /// The default configuration: [`DEFAULT_MAX_KEYS`](Self::DEFAULT_MAX_KEYS) keys per limit,
    /// shards from the available parallelism, the [`DefaultClock`] (the CPU's counter, via
    /// quanta: see its docs for why).
    pub fn new() -> Self {
        Self {
            max_keys: Self::DEFAULT_MAX_KEYS,
            shards: None,
            clock: DefaultClock::new(),
        }
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// Keeps at most `n` keys per limit (a hard bound). Beyond it, a new key takes the place of
    /// an idle key that has fully recovered its budget (found by a second-chance clock that
    /// prefers keys not used lately), never of one that has not;
    /// if there is none, new keys share the limit's overflow bucket (see "Bound and eviction" in
    /// the [module docs](super)). `0` is a [`ConfigError`] at build time.
    #[must_use]
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }

    /// Splits each limit's keys over `n` independently locked shards: a power of two, at most
    /// [`MAX_SHARDS`](MemoryBackend::MAX_SHARDS) and at most the key bound (anything else is a
    /// [`ConfigError`] at build time).
    ///
    /// Each shard has its own eviction clock; keys are spread over shards by a seeded hash. The
    /// default is four shards per available CPU, rounded up to a power of two, and lowered so
    /// that each shard holds at least 4,096 keys (a bound under 8,192 keys gets a single shard).
    #[must_use]
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = Some(n);
        self
    }

    /// Reads time from `clock` (default [`DefaultClock`]; [`SystemClock`](crate::clock::SystemClock)
    /// reads `Instant`). Use
    /// [`ManualClock`](crate::clock::ManualClock) in tests, or
    /// [`TokioClock`](crate::clock::TokioClock) to follow tokio's paused time.
    ///
    /// The clock is a type parameter, so reading it is a direct (inlinable) call.
    #[must_use]
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryBackend<C2> {
        MemoryBackend {
            max_keys: self.max_keys,
            shards: self.shards,
            clock,
        }
    }

    /// The shard count to use, or what is wrong with the configuration.
    fn resolve_shards(&self) -> Result<usize, ConfigError> {
        let max_keys = self.max_keys;
        if max_keys == 0 {
            return Err(ConfigError::new(
                "memory.max_keys",
                "the key bound must be at least 1; use e.g. .max_keys(100_000)",
            ));
        }
        let shards = match self.shards {
            Some(n) => {
                if !n.is_power_of_two() || n > MemoryBackend::MAX_SHARDS {
                    return Err(ConfigError::new(
                        "memory.shards",
                        format!(
                            "{n} shards: use a power of two from 1 to {} (e.g. {})",
                            MemoryBackend::MAX_SHARDS,
                            n.clamp(1, MemoryBackend::MAX_SHARDS).next_power_of_two()
                        ),
                    ));
                }
                if n > max_keys {
                    return Err(ConfigError::new(
                        "memory.shards",
                        format!(
                            "{n} shards cannot share a bound of {max_keys} keys (each shard needs room for one); lower .shards() or raise .max_keys()"
                        ),
                    ));
                }
                n
            }
            None => default_shards(max_keys),
        };
        if max_keys.div_ceil(shards) >= 1 << 31 {
            return Err(ConfigError::new(
                "memory.max_keys",
                format!(
                    "{max_keys} keys over {shards} shards exceeds 2,147,483,647 keys per shard; raise .shards() or lower .max_keys()"
                ),
            ));
        }
        Ok(shards)
    }
}

/// Four shards per CPU (a power of two), fewer when the bound is small.
fn default_shards(max_keys: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let wanted = (cpus * 4)
        .next_power_of_two()
        .min(MemoryBackend::MAX_SHARDS);
    // The largest power of two leaving each shard at least MIN_KEYS_PER_SHARD keys (>= 1).
    let room = (max_keys / MIN_KEYS_PER_SHARD).max(1);
    let fit = 1usize << room.ilog2();
    wanted.min(fit)
}

impl<C: Clock> Backend for MemoryBackend<C> {
    type Store = MemoryStore<C>;

    fn build(self, limits: &[LimitSpec]) -> Result<MemoryStore<C>, ConfigError> {
        if limits.len() > MAX_LIMITS {
            return Err(ConfigError::new(
                "limits",
                format!(
                    "{} limits on one layer; use at most {MAX_LIMITS}, or stack another layer",
                    limits.len()
                ),
            ));
        }
        let shards = self.resolve_shards()?;
        let tables = limits
            .iter()
            .map(|spec| AnyTable::new(spec, self.max_keys, shards))
            .collect::<Result<Vec<_>, _>>()?;
        tracing::debug!(
            limits = limits.len(),
            max_keys = self.max_keys,
            shards,
            "built in-memory rate-limit store"
        );
        Ok(MemoryStore::new(tables, self.max_keys, shards, self.clock))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::AlgorithmKind;
    use crate::decision::Name;
    use crate::quota::Quota;

    fn spec() -> LimitSpec {
        LimitSpec::new(
            Name::new("t"),
            Quota::per_second(1),
            AlgorithmKind::TokenBucket,
        )
    }

    fn field_of(backend: MemoryBackend) -> &'static str {
        backend.build(&[spec()]).unwrap_err().field()
    }

    #[test]
    fn bad_configuration_names_the_field() {
        assert_eq!(
            field_of(MemoryBackend::new().max_keys(0)),
            "memory.max_keys"
        );
        assert_eq!(field_of(MemoryBackend::new().shards(0)), "memory.shards");
        assert_eq!(field_of(MemoryBackend::new().shards(12)), "memory.shards");
        assert_eq!(
            field_of(MemoryBackend::new().shards(1 << 17)),
            "memory.shards"
        );
        assert_eq!(
            field_of(MemoryBackend::new().max_keys(4).shards(8)),
            "memory.shards"
        );
        let err = MemoryBackend::new()
            .shards(12)
            .build(&[spec()])
            .unwrap_err();
        assert!(err.message().contains("e.g. 16"), "{err}");
        let nine = [spec(); MAX_LIMITS + 1];
        assert_eq!(
            MemoryBackend::new().build(&nine).unwrap_err().field(),
            "limits"
        );
    }

    #[test]
    fn invalid_quota_is_reported() {
        let bad = LimitSpec::new(
            Name::new("t"),
            Quota::per_second(0),
            AlgorithmKind::TokenBucket,
        );
        assert_eq!(
            MemoryBackend::new().build(&[bad]).unwrap_err().field(),
            "quota.count"
        );
    }

    #[test]
    fn default_shards_are_a_power_of_two_that_fits_the_bound() {
        for max_keys in [1, 2, 4_095, 4_096, 8_191, 8_192, 100_000, usize::MAX / 2] {
            let n = default_shards(max_keys);
            assert!(n.is_power_of_two(), "{max_keys}: {n}");
            assert!(n <= max_keys, "{max_keys}: {n}");
            assert!(
                n == 1 || max_keys / n >= MIN_KEYS_PER_SHARD,
                "{max_keys}: {n}"
            );
        }
        assert_eq!(default_shards(8_191), 1);
    }

    #[test]
    fn explicit_shards_are_used() {
        let store = MemoryBackend::new().shards(4).build(&[spec()]).unwrap();
        assert_eq!(store.shards(), 4);
        let store = MemoryBackend::new()
            .max_keys(1)
            .shards(1)
            .build(&[spec()])
            .unwrap();
        assert_eq!(store.shards(), 1);
    }
}
