//! Redis key names: a namespace prefix, a hash tag derived from the client key, and the client key
//! itself as a keyed hash, so client keys (API keys, tokens, user ids) never appear in Redis in
//! clear, cannot escape the namespace or pick the hash slot, and cannot grow without bound.
//!
//! ```text
//! {prefix}:{TAG}:{alg}:{limit}:{key}
//! tollgate:{4be1c3a0d2f59e17}:tb:burst:h.9f2c41d07a5be3e8c06d2b7f14a9e051
//! tollgate:{0c6b9e2d71f8a403}:tb:burst:e.ip:203.0.113.7      (readable_keys(true), IPs only)
//! ```
//!
//! - `TAG` is 16 hex digits of HMAC-SHA-256(secret, value), where `value` is the client key
//!   *without* its method/route scope. Every limit of one client therefore lands in one hash slot
//!   (and one script call); the slot depends only on the HMAC, never on bytes the client sent.
//! - `key` is `h.` + 32 hex digits (128 bits) of HMAC-SHA-256(secret, canonical key), where the
//!   canonical key (`Key::write_canonical`) includes the route scope. With the secret shared by
//!   every instance (`RedisBackend::hash_secret`) the name is stable across instances and cannot
//!   be reversed by anyone who reads Redis but not the secret. Without a secret the HMAC is keyed
//!   with the empty string: still no key in clear, but anyone can hash guesses, which reverses
//!   low-entropy keys (IP addresses, small user ids) by brute force.
//! - Two kinds of keys are written readably, percent-encoded (`e.` + bytes outside
//!   `[A-Za-z0-9._:/@-]` as `%XX`), when that stays within [`MAX_ENCODED_KEY`] bytes: the
//!   global key always (it names no client), and IP keys when the operator opts in with
//!   `RedisBackend::readable_keys(true)`. So the prefix and tag are the only braces in a Redis
//!   key, keys hold no whitespace, control or non-ASCII bytes, and no client can store more than
//!   about 200 bytes of key name per limit.
//!
//! SHA-256 is used (not the SHA-1 the `redis` crate already links for script hashes) because a
//! key maps to a stored key by its digest alone: a collision between two clients' keys would
//! merge their budgets, and SHA-256 keeps collisions out of reach even for keys crafted in pairs.

use sha2::{Digest, Sha256};

use crate::error::ConfigError;
use crate::key::{Key, KeyValue};

/// Encoded client keys longer than this are replaced by their digest.
pub(crate) const MAX_ENCODED_KEY: usize = 128;
/// The longest accepted prefix.
pub(crate) const MAX_PREFIX: usize = 64;
/// The longest accepted encoded limit name.
pub(crate) const MAX_NAME: usize = 64;

/// Builds Redis key names; see the module docs.
#[derive(Clone)]
pub(crate) struct KeyEncoder {
    prefix: String,
    readable_ips: bool,
    inner: Sha256,
    outer: Sha256,
}

impl std::fmt::Debug for KeyEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyEncoder")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// One encoded key: the full Redis key and its hash tag (which decides the slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EncodedKey {
    pub(crate) key: String,
    pub(crate) tag: [u8; 16],
}

impl KeyEncoder {
    /// The namespace prefix every key of the store starts with.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// An encoder for `prefix`, keyed with `secret` (empty: a public, deterministic hash), that
    /// writes IP keys readably if `readable_ips`.
    pub(crate) fn new(
        prefix: &str,
        secret: &[u8],
        readable_ips: bool,
    ) -> Result<Self, ConfigError> {
        validate_prefix(prefix)?;
        // HMAC-SHA-256 (RFC 2104) with the ipad/opad states precomputed once.
        let mut block = [0u8; 64];
        if secret.len() > 64 {
            block[..32].copy_from_slice(&Sha256::digest(secret));
        } else {
            block[..secret.len()].copy_from_slice(secret);
        }
        let mut inner = Sha256::new();
        inner.update(block.map(|b| b ^ 0x36));
        let mut outer = Sha256::new();
        outer.update(block.map(|b| b ^ 0x5c));
        Ok(Self {
            prefix: prefix.to_owned(),
            readable_ips,
            inner,
            outer,
        })
    }

    fn hmac(&self, domain: u8, msg: &[u8]) -> [u8; 32] {
        let mut inner = self.inner.clone();
        inner.update([domain]);
        inner.update(msg);
        let mut outer = self.outer.clone();
        outer.update(inner.finalize());
        outer.finalize().into()
    }

    /// The key of limit `name_enc` (see [`encode_name`]) with algorithm code `alg` for `key`.
    /// `scratch` is reused between calls to avoid allocating for the canonical form.
    pub(crate) fn encode(
        &self,
        alg: &str,
        name_enc: &str,
        key: &Key<'_>,
        scratch: &mut Vec<u8>,
    ) -> EncodedKey {
        scratch.clear();
        value_only(key).write_canonical(scratch);
        let digest = self.hmac(b't', scratch);
        let mut tag = [0u8; 16];
        hex_into(&digest[..8], &mut tag);

        scratch.clear();
        key.write_canonical(scratch);
        let mut out =
            String::with_capacity(self.prefix.len() + 24 + alg.len() + name_enc.len() + 48);
        out.push_str(&self.prefix);
        out.push_str(":{");
        out.push_str(ascii(&tag));
        out.push_str("}:");
        out.push_str(alg);
        out.push(':');
        out.push_str(name_enc);
        out.push(':');
        let readable = match key.value() {
            KeyValue::Global => true,
            KeyValue::Ip(_) => self.readable_ips,
            KeyValue::Int(_) | KeyValue::Bytes(_) => false,
        };
        if readable && escaped_len(scratch) <= MAX_ENCODED_KEY {
            out.push_str("e.");
            escape_into(scratch, &mut out);
        } else {
            out.push_str("h.");
            let digest = self.hmac(b'k', scratch);
            let mut hex = [0u8; 32];
            hex_into(&digest[..16], &mut hex);
            out.push_str(ascii(&hex));
        }
        EncodedKey { key: out, tag }
    }
}

/// Hex digits as a `str` (they are ASCII).
fn ascii(hex: &[u8]) -> &str {
    std::str::from_utf8(hex).expect("hex digits are ASCII")
}

/// The key without its method/route scope: what the hash tag is derived from.
fn value_only<'k>(key: &'k Key<'_>) -> Key<'k> {
    match key.value() {
        KeyValue::Global => Key::global(),
        KeyValue::Ip(ip) => Key::ip(*ip),
        KeyValue::Int(n) => Key::int(*n),
        KeyValue::Bytes(b) => Key::bytes(&b[..]),
    }
}

/// Checks a namespace prefix: 1 to 64 bytes of `[A-Za-z0-9._:-]`.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    let ok = !prefix.is_empty()
        && prefix.len() <= MAX_PREFIX
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            "redis.prefix",
            format!(
                "the key prefix {prefix:?} must be 1 to {MAX_PREFIX} characters of letters, digits, '.', '_', ':' or '-' (no braces: the hash tag is tollgate's)"
            ),
        ))
    }
}

/// Encodes a limit name for use in key names; errors if it is too long.
pub(crate) fn encode_name(name: &str) -> Result<String, ConfigError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || escaped_len(bytes) > MAX_NAME {
        return Err(ConfigError::new(
            "limit.name",
            format!(
                "the limit name {name:?} is used in Redis key names and must be 1 to {MAX_NAME} bytes once escaped; pick a shorter name"
            ),
        ));
    }
    let mut out = String::with_capacity(bytes.len());
    escape_into(bytes, &mut out);
    Ok(out)
}

#[inline]
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'@' | b'-')
}

fn escaped_len(bytes: &[u8]) -> usize {
    bytes.iter().map(|&b| if is_plain(b) { 1 } else { 3 }).sum()
}

fn escape_into(bytes: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        if is_plain(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
}

fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, &b) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 15)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn enc(e: &KeyEncoder, key: &Key<'_>) -> EncodedKey {
        e.encode("tb", "burst", key, &mut Vec::new())
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        // Key "Jefe", data "what do ya want for nothing?", minus our domain byte: check the raw
        // construction by hashing with an empty domain via a direct computation.
        let e = KeyEncoder::new("t", b"Jefe", false).unwrap();
        let mut inner = e.inner.clone();
        inner.update(b"what do ya want for nothing?");
        let mut outer = e.outer.clone();
        outer.update(inner.finalize());
        let got: [u8; 32] = outer.finalize().into();
        let mut hex = [0u8; 64];
        hex_into(&got, &mut hex);
        assert_eq!(
            std::str::from_utf8(&hex).unwrap(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn client_keys_never_appear_in_clear() {
        let e = KeyEncoder::new("tollgate", b"", false).unwrap();
        let ip = Key::ip(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)));
        for key in [
            Key::string("sk_live_51HqLyjSecret"),
            Key::int(4242),
            ip.clone(),
            Key::string("sk_live_51HqLyjSecret").scoped("GET", "/v1/charges"),
        ] {
            let k = enc(&e, &key);
            assert!(!k.key.contains("sk_live"), "{}", k.key);
            assert!(!k.key.contains("4242"), "{}", k.key);
            assert!(!k.key.contains("203.0.113.7"), "{}", k.key);
            assert!(k.key.contains(":tb:burst:h."), "{}", k.key);
            assert_eq!(
                k.key.len(),
                "tollgate:{0123456789abcdef}:tb:burst:h.".len() + 32
            );
        }
        assert!(enc(&e, &Key::global()).key.ends_with(":tb:burst:e.global"));
    }

    #[test]
    fn ips_are_readable_only_when_opted_in() {
        let e = KeyEncoder::new("tollgate", b"", true).unwrap();
        let k = enc(&e, &Key::ip(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7))));
        assert!(k.key.starts_with("tollgate:{"), "{}", k.key);
        assert!(k.key.ends_with(":tb:burst:e.ip:203.0.113.7"), "{}", k.key);
        // Opting in never makes other keys readable.
        let k = enc(&e, &Key::string("a{b}\n c%"));
        assert!(k.key.contains(":h."), "{}", k.key);
    }

    #[test]
    fn keys_are_stable_for_a_secret_and_differ_across_secrets() {
        let a = KeyEncoder::new("tollgate", b"shared", false).unwrap();
        let b = KeyEncoder::new("tollgate", b"shared", false).unwrap();
        let c = KeyEncoder::new("tollgate", b"other", false).unwrap();
        let key = Key::string("alice");
        assert_eq!(
            enc(&a, &key),
            enc(&b, &key),
            "every instance names it alike"
        );
        assert_ne!(enc(&a, &key).key, enc(&c, &key).key);
    }

    #[test]
    fn hostile_bytes_never_add_braces_or_control_characters() {
        let e = KeyEncoder::new("tollgate", b"s3cret", false).unwrap();
        let hostile: [&[u8]; 5] = [
            b"{x}",
            b"}{",
            b"\r\n*1\r\n$4\r\nPING\r\n",
            &[0, 255, 128],
            b"{",
        ];
        for h in hostile {
            let k = enc(&e, &Key::bytes(h));
            assert_eq!(k.key.matches('{').count(), 1, "{}", k.key);
            assert_eq!(k.key.matches('}').count(), 1, "{}", k.key);
            assert!(k.key.bytes().all(|b| b.is_ascii_graphic()), "{}", k.key);
            // The tag sits right after the prefix and decides the slot.
            let tag = std::str::from_utf8(&k.tag).unwrap();
            assert!(k.key.starts_with(&format!("tollgate:{{{tag}}}:")));
        }
    }

    #[test]
    fn long_keys_are_hashed_and_bounded() {
        let e = KeyEncoder::new("tollgate", b"", false).unwrap();
        let big = vec![b'x'; 1 << 20];
        let k = enc(&e, &Key::bytes(&big[..]));
        assert!(k.key.len() < 120, "{}", k.key.len());
        assert!(k.key.contains(":h."));
        let mut other = big.clone();
        other[12345] = b'y';
        assert_ne!(enc(&e, &Key::bytes(&other[..])).key, k.key);
        // Escaping that would exceed the bound also hashes: 50 non-plain bytes become 150.
        let k = enc(&e, &Key::bytes(&[0u8; 50][..]));
        assert!(k.key.contains(":h."));
    }

    #[test]
    fn encoding_is_injective_across_forms() {
        let e = KeyEncoder::new("tollgate", b"", false).unwrap();
        let a = enc(&e, &Key::string("%41"));
        let b = enc(&e, &Key::string("A"));
        assert_ne!(a.key, b.key);
        let c = enc(&e, &Key::int(7));
        let d = enc(&e, &Key::string("int:7"));
        assert_ne!(c.key, d.key);
    }

    #[test]
    fn a_clients_scoped_keys_share_the_tag() {
        let e = KeyEncoder::new("tollgate", b"", false).unwrap();
        let plain = enc(&e, &Key::string("alice"));
        let scoped = enc(&e, &Key::string("alice").scoped("GET", "/search"));
        assert_eq!(plain.tag, scoped.tag);
        assert_ne!(plain.key, scoped.key);
        assert_ne!(plain.tag, enc(&e, &Key::string("bob")).tag);
    }

    #[test]
    fn the_secret_changes_tags_and_digests() {
        let a = KeyEncoder::new("tollgate", b"one", false).unwrap();
        let b = KeyEncoder::new("tollgate", b"two", false).unwrap();
        let key = Key::string("alice");
        assert_ne!(enc(&a, &key).tag, enc(&b, &key).tag);
    }

    #[test]
    fn bad_prefixes_and_names_are_config_errors() {
        for p in ["", "a{b", "a b", "x}", &"p".repeat(65)] {
            let err = KeyEncoder::new(p, b"", false).unwrap_err();
            assert_eq!(err.field(), "redis.prefix");
        }
        assert_eq!(encode_name("daily quota").unwrap(), "daily%20quota");
        assert_eq!(
            encode_name(&"n".repeat(65)).unwrap_err().field(),
            "limit.name"
        );
        assert!(encode_name("").is_err());
    }
}
