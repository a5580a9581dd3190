//! Redis key names, through the public [`RedisStore::redis_key`]: whatever client key a request
//! produces (any bytes, any length, any method and route scope),
//!
//! - the key starts with the configured prefix and the client's hash tag, and holds no other
//!   `{` or `}` (so no client picks its hash slot), no whitespace, control or non-ASCII bytes;
//! - its length is bounded whatever the client key's length;
//! - every limit of one client, scoped or not, shares one tag (one slot, one script call);
//! - different client keys never share a Redis key (budgets are never merged).

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;
use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::key::{Key, KeyValue};
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::{Backend, FailurePolicy, LimitSpec};
use tollgate::{Name, Quota};

use crate::input::Input;

/// The most a key name may add to its prefix: `:{16 hex}:` (20), the algorithm code, `:`, the
/// escaped limit name (at most 64), `:`, and the encoded client key (at most 2 + 128).
pub const MAX_KEY_AFTER_PREFIX: usize = 20 + 8 + 1 + 64 + 1 + 130;

/// Limit names an operator might use, hostile ones included.
const NAMES: [&str; 6] = [
    "burst",
    "daily quota",
    "a{b}\r\n\"x\"",
    "límite-✓",
    "%41",
    "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn",
];

/// Stores that never connect (building does not), one per prefix / secret pair, each with a
/// limit of every algorithm.
fn stores() -> &'static [(&'static str, RedisStore)] {
    static STORES: OnceLock<Vec<(&'static str, RedisStore)>> = OnceLock::new();
    STORES.get_or_init(|| {
        let configs: [(&str, &[u8]); 3] = [
            ("tollgate", b""),
            ("app.rl_2:x-y", b"shared secret"),
            (
                "pppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp",
                &[0xff; 100],
            ),
        ];
        configs
            .iter()
            .map(|&(prefix, secret)| {
                let limits: Vec<LimitSpec> = AlgorithmKind::ALL
                    .iter()
                    .zip(NAMES.iter().cycle())
                    .map(|(&kind, name)| {
                        LimitSpec::new(Name::new(name), Quota::per_second(5), kind).on_store_error(
                            FailurePolicy::Closed {
                                retry_after: Duration::from_secs(1),
                            },
                        )
                    })
                    .collect();
                let store = RedisBackend::new("redis://127.0.0.1:1/")
                    .prefix(prefix)
                    .hash_secret(secret)
                    .build(&limits)
                    .expect("build a store (building does not connect)");
                (prefix, store)
            })
            .collect()
    })
}

/// A client key from the input: global, an IP, a number, or any bytes (up to the whole input),
/// sometimes scoped to a method and route taken from the input too.
fn key<'a>(input: &mut Input<'a>) -> Key<'a> {
    let kind = input.byte();
    let key = match kind % 8 {
        0 => Key::global(),
        1 => Key::ip(IpAddr::V4(Ipv4Addr::from(input.u64() as u32))),
        2 => Key::ip(IpAddr::V6(Ipv6Addr::from(
            (u128::from(input.u64()) << 64) | u128::from(input.u64()),
        ))),
        3 => Key::int(input.u64()),
        4 => Key::bytes(input.until(0)),
        5 => Key::string(String::from_utf8_lossy(input.until(0))),
        // Long keys: the input repeated, up to 4 KiB (any key over 128 encoded bytes takes the
        // same path; longer ones only make the fuzzer slower).
        6 => {
            let chunk = input.until(0);
            let times = usize::from(input.byte()) + 1;
            Key::bytes(Cow::Owned(
                chunk.repeat(times).into_iter().take(1 << 12).collect(),
            ))
        }
        _ => Key::bytes(input.rest()),
    };
    if kind & 8 != 0 {
        let method = std::str::from_utf8(input.until(0)).unwrap_or("GET");
        let route = std::str::from_utf8(input.until(0)).unwrap_or("/");
        key.scoped(method, route)
    } else {
        key
    }
}

/// The key without its scope: what the hash tag is derived from.
fn unscoped<'k>(key: &'k Key<'_>) -> Key<'k> {
    match key.value() {
        KeyValue::Global => Key::global(),
        KeyValue::Ip(ip) => Key::ip(*ip),
        KeyValue::Int(n) => Key::int(*n),
        KeyValue::Bytes(b) => Key::bytes(&b[..]),
        other => panic!("a key kind this target does not know yet: {other:?}"),
    }
}

fn canonical(key: &Key<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    key.write_canonical(&mut out);
    out
}

/// Checks the key names of two client keys read from `data`.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let a = key(&mut input);
    let b = key(&mut input);
    for (prefix, store) in stores() {
        let tag = check_key(prefix, store, &a);
        let bare = unscoped(&a);
        assert_eq!(
            check_key(prefix, store, &bare),
            tag,
            "scoping moved {a:?} to another slot"
        );
        check_key(prefix, store, &b);
        if canonical(&a) != canonical(&b) {
            for i in 0..AlgorithmKind::ALL.len() {
                assert_ne!(
                    store.redis_key(i, &a),
                    store.redis_key(i, &b),
                    "two client keys share a Redis key: {a:?} {b:?}"
                );
            }
        }
    }
}

/// Checks every limit's key name for `key`; returns the client's tag.
fn check_key(prefix: &str, store: &RedisStore, key: &Key<'_>) -> String {
    let mut tag = None;
    for i in 0..AlgorithmKind::ALL.len() {
        let name = store.redis_key(i, key).expect("limit i exists");
        let rest = name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix(":{"))
            .unwrap_or_else(|| panic!("{name:?} does not start with {prefix}:{{"));
        let (this_tag, tail) = rest
            .split_once("}:")
            .unwrap_or_else(|| panic!("{name:?} has no closing hash tag"));
        assert!(
            this_tag.len() == 16 && this_tag.bytes().all(|b| b.is_ascii_hexdigit()),
            "{name:?}: tag is not 16 hex digits"
        );
        assert!(
            !tail.contains(['{', '}']),
            "{name:?}: a brace after the tag could move the slot"
        );
        assert!(
            name.bytes().all(|b| b.is_ascii_graphic()),
            "{name:?}: whitespace, control or non-ASCII byte in a key name"
        );
        assert!(
            name.len() - prefix.len() <= MAX_KEY_AFTER_PREFIX,
            "key name of {} bytes for a client key: {name:?}",
            name.len()
        );
        match &tag {
            None => tag = Some(this_tag.to_owned()),
            Some(t) => assert_eq!(t, this_tag, "one client's limits in different slots"),
        }
    }
    tag.expect("at least one limit")
}
