//! The start-up check of the server's `maxmemory-policy`: any policy that may evict keys with
//! an expiry (every `allkeys-*` and `volatile-*` policy; every limiter key has one) can silently
//! give an exhausted client a fresh budget, so it is logged loudly and exposed in
//! [`RedisStats::maxmemory_policy`](super::RedisStats::maxmemory_policy).

use redis::Value;

use super::conn::Conn;
use super::stats::RedisStats;

/// Whether `policy` may evict limiter keys.
pub(crate) fn evicts_limiter_keys(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

/// Reads `maxmemory-policy` (on one node; in a Cluster every master should be configured alike)
/// and records it in `stats`; warns when it can evict limiter keys. A server that refuses `CONFIG`
/// (renamed or denied by an ACL, as on managed services) leaves the policy unknown
/// ([`RedisStats::maxmemory_policy`](super::RedisStats::maxmemory_policy) is `None`) with one
/// warning per connection that says what to check by hand; decisions are unaffected.
pub(crate) async fn check(conn: &Conn, stats: &RedisStats) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let policy = match conn.query(&cmd).await {
        Ok(value) => parse(&value),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "could not read maxmemory-policy (CONFIG GET is renamed or not permitted, as on managed Redis services); rate limiting works, but check by hand that the server's maxmemory-policy is noeviction: an evicted limiter key is a fresh budget"
            );
            return;
        }
    };
    let Some(policy) = policy else {
        return;
    };
    if evicts_limiter_keys(&policy) {
        tracing::warn!(
            maxmemory_policy = %policy,
            "redis may evict rate-limit keys under memory pressure, and an evicted key is a fresh budget; set maxmemory-policy noeviction (or give the limiter its own Redis)"
        );
    }
    stats.set_maxmemory_policy(policy);
}

/// The value of a `CONFIG GET` reply (`[name, value]`, or a map in RESP3).
fn parse(value: &Value) -> Option<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match value {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, v)| text(v)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_that_evict_expiring_keys_are_flagged() {
        for p in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-ttl",
        ] {
            assert!(evicts_limiter_keys(p), "{p}");
        }
        assert!(!evicts_limiter_keys("noeviction"));
        let reply = Value::Array(vec![
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"allkeys-lru".to_vec()),
        ]);
        assert_eq!(parse(&reply).as_deref(), Some("allkeys-lru"));
        assert_eq!(parse(&Value::Array(vec![])), None);
    }
}
