//! The Cluster's slot map: which master serves a hash slot, read with `CLUSTER SLOTS` and read
//! again at most once per probe interval; and the hash slot of a key's tag.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use redis::Value;

use super::breaker::{Breaker, Breakers};
use super::conn::Conn;
use crate::error::{StoreError, StoreErrorKind};

/// The Cluster's slot map as last read, shared by a store, the stores reconfigured from it and
/// their batchers. Reading it takes no lock and no reference count in the common case (an
/// [`ArcSwap`]); a refresh swaps in a whole new map.
pub(crate) struct SlotCache {
    map: ArcSwap<SlotMap>,
    /// When the map was last asked for (ms since `born`), to ask at most once per `every`.
    asked: AtomicU64,
    born: std::time::Instant,
    every: Duration,
    timeout: Duration,
}

impl SlotCache {
    /// An empty map, read again at most once per `every`, each read within `timeout`.
    pub(crate) fn new(every: Duration, timeout: Duration) -> Self {
        Self {
            map: ArcSwap::default(),
            asked: AtomicU64::new(0),
            born: std::time::Instant::now(),
            every,
            timeout,
        }
    }

    /// The map as last read (empty until then), held for as long as the guard lives (keep it
    /// short: across an `.await`, clone the `Arc` out of it with [`Guard::into_inner`]).
    pub(crate) fn map(&self) -> Guard<Arc<SlotMap>> {
        self.map.load()
    }

    /// Whether a [`refresh`](Self::refresh) now would read the map (none in the last interval).
    pub(crate) fn due(&self) -> bool {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.asked.load(Ordering::Relaxed);
        let every = u64::try_from(self.every.as_millis()).unwrap_or(u64::MAX);
        last == 0 || now.saturating_sub(last) >= every
    }

    /// Reads the Cluster's slot map again (at most once per interval).
    pub(crate) async fn refresh(&self, conn: &Conn) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.asked.load(Ordering::Relaxed);
        let every = u64::try_from(self.every.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < every {
            return;
        }
        // Of the callers that saw the map due at once, one reads it.
        if self
            .asked
            .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        match tokio::time::timeout(self.timeout, SlotMap::fetch(conn)).await {
            Ok(Ok(map)) => {
                self.map.store(Arc::new(map));
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "could not read the cluster slot map"),
            Err(_) => tracing::debug!("reading the cluster slot map timed out"),
        }
    }
}

/// The Cluster's slot map as `CLUSTER SLOTS` reports it: (first slot, last slot, master), sorted
/// by first slot, and each master's `host:port` once, which a caller holds by a reference count
/// rather than a copy.
#[derive(Debug, Default, Clone)]
pub(crate) struct SlotMap {
    /// (first slot, last slot, index in `masters`).
    ranges: Vec<(u16, u16, usize)>,
    masters: Vec<Arc<str>>,
    /// Each master's breaker (in `masters` order) among the breakers of the stores that share
    /// this map, looked up once per map; kept with the breakers they were looked up in.
    breakers: OnceLock<(Weak<Breakers>, Vec<Arc<Breaker>>)>,
}

impl SlotMap {
    /// Reads the map from the Cluster.
    pub(crate) async fn fetch(conn: &Conn) -> Result<Self, StoreError> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let value = conn.cluster_slots(&cmd).await.map_err(|e| {
            StoreError::new(StoreErrorKind::Unavailable, format!("CLUSTER SLOTS: {e}"))
        })?;
        Self::parse(&value).ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::InvalidResponse,
                "CLUSTER SLOTS: unexpected reply",
            )
        })
    }

    fn parse(value: &Value) -> Option<Self> {
        let Value::Array(entries) = value else {
            return None;
        };
        let mut ranges = Vec::with_capacity(entries.len());
        let mut masters: Vec<Arc<str>> = Vec::new();
        for e in entries {
            let Value::Array(e) = e else { return None };
            let (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(master))) =
                (e.first(), e.get(1), e.get(2))
            else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(h) => String::from_utf8_lossy(h).into_owned(),
                Value::SimpleString(h) => h.clone(),
                _ => return None,
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return None;
            };
            let addr = format!("{host}:{port}");
            let m = match masters.iter().position(|m| **m == *addr) {
                Some(m) => m,
                None => {
                    masters.push(addr.into());
                    masters.len() - 1
                }
            };
            ranges.push((u16::try_from(*a).ok()?, u16::try_from(*b).ok()?, m));
        }
        ranges.sort_unstable();
        Some(Self {
            ranges,
            masters,
            breakers: OnceLock::new(),
        })
    }

    /// A slot the master at `addr` serves (its first), or `None` if it serves none.
    pub(crate) fn slot_of(&self, addr: &str) -> Option<u16> {
        let m = self.masters.iter().position(|m| **m == *addr)?;
        self.ranges.iter().find(|r| r.2 == m).map(|r| r.0)
    }

    /// The masters the map names, each once.
    pub(crate) fn masters(&self) -> &[Arc<str>] {
        &self.masters
    }

    /// The index in `masters` of the master serving `slot`, if known.
    fn master(&self, slot: u16) -> Option<usize> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= slot)
            .checked_sub(1)?;
        let (a, b, m) = self.ranges[i];
        (a <= slot && slot <= b).then_some(m)
    }

    /// The master serving `slot`, if known.
    pub(crate) fn node(&self, slot: u16) -> Option<&Arc<str>> {
        self.master(slot).map(|m| &self.masters[m])
    }

    /// The master serving `slot`, if known, and its breaker among `breakers`: found by index
    /// once the map has looked its masters' breakers up (on its first call), without a lock
    /// or a hash.
    pub(crate) fn node_and_breaker(
        &self,
        slot: u16,
        breakers: &Arc<Breakers>,
    ) -> Option<(&Arc<str>, Arc<Breaker>)> {
        let m = self.master(slot)?;
        let addr = &self.masters[m];
        let (of, found) = self.breakers.get_or_init(|| {
            let found = self.masters.iter().map(|a| breakers.node(a)).collect();
            (Arc::downgrade(breakers), found)
        });
        // Another store's breakers (not one sharing this map's): looked up by address.
        let breaker = if std::ptr::eq(of.as_ptr(), Arc::as_ptr(breakers)) {
            found[m].clone()
        } else {
            breakers.node(addr)
        };
        Some((addr, breaker))
    }
}

/// The Cluster hash slot of `key`: of its hash tag (the bytes between its first `{` and the
/// next `}`, if not empty), else of the whole key, as Redis computes it.
/// A key in `slot` under `prefix` (`<prefix>:{probe-<n>}`, the smallest such `n`), which no
/// store writes: a read of it asks the slot's master whether it serves the slot, which a
/// keyless command does not (a node answers `ECHO` while the Cluster is down).
pub(crate) fn probe_key(prefix: &str, slot: u16) -> String {
    let slot = slot % 16384;
    let mut tag = *b"probe-0000000000";
    let mut len = 7;
    for n in 0u32.. {
        // n in decimal after "probe-", without allocating.
        let (mut rest, mut digits) = (n, [0u8; 10]);
        let mut count = 0;
        loop {
            digits[count] = b'0' + (rest % 10) as u8;
            count += 1;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        for (i, d) in digits[..count].iter().rev().enumerate() {
            tag[6 + i] = *d;
        }
        len = 6 + count;
        if slot_of_tag(&tag[..len]) == slot {
            break;
        }
    }
    let tag = std::str::from_utf8(&tag[..len]).expect("ASCII");
    format!("{prefix}:{{{tag}}}")
}

pub(crate) fn slot_of_key(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    slot_of_tag(tag)
}

/// The Cluster hash slot of a key whose hash tag is `tag` (CRC16-XMODEM mod 16384, as Redis).
pub(crate) fn slot_of_tag(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & 16383
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_key_is_in_its_slot_under_the_prefix() {
        // Every slot takes about 16,384 tries on average: a spread of them, and both ends.
        for slot in (0..16384u16).step_by(257).chain([1, 16382, 16383]) {
            let key = probe_key("tollgate", slot);
            assert_eq!(slot_of_key(key.as_bytes()), slot, "{key}");
            assert!(key.starts_with("tollgate:{probe-"), "{key}");
        }
        assert_eq!(probe_key("p", 16384 + 7), probe_key("p", 7));
    }

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot_of_tag(b"foo"), 12182);
        assert_eq!(slot_of_tag(b"123456789"), 12739);
        assert_eq!(slot_of_tag(b""), 0);
        // Values from `CLUSTER KEYSLOT`: a key's hash tag decides, an empty one does not.
        assert_eq!(slot_of_key(b"foo"), 12182);
        assert_eq!(slot_of_key(b"rl:{foo}:x"), 12182);
        assert_eq!(slot_of_key(b"{}foo"), slot_of_tag(b"{}foo"));
        assert_eq!(slot_of_key(b"a{foo"), slot_of_tag(b"a{foo"));
    }

    #[test]
    fn slot_map_lookup() {
        let m = SlotMap::parse(&Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                Value::Array(vec![
                    Value::BulkString(b"10.0.0.2".to_vec()),
                    Value::Int(7001),
                ]),
            ]),
            Value::Array(vec![
                Value::Int(16000),
                Value::Int(16383),
                Value::Array(vec![
                    Value::SimpleString("10.0.0.1".to_owned()),
                    Value::Int(7000),
                ]),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![
                    Value::BulkString(b"10.0.0.1".to_vec()),
                    Value::Int(7000),
                ]),
            ]),
        ]))
        .unwrap();
        let node = |slot| m.node(slot).map(|a| &**a);
        assert_eq!(node(0), Some("10.0.0.1:7000"));
        assert_eq!(node(5460), Some("10.0.0.1:7000"));
        assert_eq!(node(5461), Some("10.0.0.2:7001"));
        assert_eq!(node(10923), None);
        assert_eq!(node(16383), Some("10.0.0.1:7000"));
        assert!(
            Arc::ptr_eq(m.node(0).unwrap(), m.node(16383).unwrap()),
            "one address per master, shared by its ranges"
        );
        assert_eq!(m.masters().len(), 2);

        // Each master's breaker is its breaker among the store's, found by index; another
        // store's breakers give their own.
        let breakers = Arc::new(Breakers::default());
        let (addr, b) = m.node_and_breaker(5461, &breakers).unwrap();
        assert_eq!(&**addr, "10.0.0.2:7001");
        assert!(Arc::ptr_eq(&b, &breakers.node("10.0.0.2:7001")));
        let (_, b) = m.node_and_breaker(0, &breakers).unwrap();
        assert!(Arc::ptr_eq(&b, &breakers.node("10.0.0.1:7000")));
        assert!(m.node_and_breaker(10923, &breakers).is_none());
        let others = Arc::new(Breakers::default());
        let (_, b) = m.node_and_breaker(0, &others).unwrap();
        assert!(Arc::ptr_eq(&b, &others.node("10.0.0.1:7000")));
        assert!(!Arc::ptr_eq(&b, &breakers.node("10.0.0.1:7000")));
        assert_eq!(m.slot_of("10.0.0.2:7001"), Some(5461));
        assert_eq!(m.slot_of("10.0.0.1:7000"), Some(0));
        assert_eq!(m.slot_of("10.0.0.3:7002"), None);
        assert!(SlotMap::parse(&Value::Okay).is_none());
    }
}
