//! A misconfigured key extractor made loud: a `tracing` warning on every request, and one line
//! on stderr per process and per misconfiguration when no `tracing` subscriber is installed.

use std::sync::atomic::{AtomicU64, Ordering};

use super::KeyError;

/// How many distinct misconfigurations the process prints to stderr; later ones only go to
/// `tracing`. A server has a handful of limits, and each has at most a few reasons.
const NOTICES: usize = 16;

/// The misconfigurations already printed in this process.
static PRINTED: Noticed<NOTICES> = Noticed::new();

/// A fixed set of `N` digests, each claimed once: which misconfigurations were printed.
///
/// Lock-free: a lookup reads at most `N` atomics; a digest is written once into the first free
/// slot, and slots are never cleared. When all `N` are taken, nothing new is printed.
pub(crate) struct Noticed<const N: usize> {
    seen: [AtomicU64; N],
}

impl<const N: usize> Noticed<N> {
    pub(crate) const fn new() -> Self {
        Self {
            seen: [const { AtomicU64::new(0) }; N],
        }
    }

    /// Whether `digest` is seen here for the first time (and now recorded). `false` when it was
    /// seen before, or when the set is full.
    pub(crate) fn first(&self, digest: u64) -> bool {
        // 0 marks a free slot.
        let digest = digest.max(1);
        for slot in &self.seen {
            match slot.load(Ordering::Relaxed) {
                0 => match slot.compare_exchange(0, digest, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return true,
                    Err(taken) if taken == digest => return false,
                    // Another misconfiguration took the slot first: try the next one.
                    Err(_) => {}
                },
                taken if taken == digest => return false,
                _ => {}
            }
        }
        false
    }
}

/// What a limit does with the requests it cannot key, for the notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Consequence {
    /// Every request is refused with `500`.
    Refused,
    /// The limit is skipped ([`MissingKey::Skip`](super::MissingKey::Skip), or a shadow limit):
    /// nothing is limited by it.
    Skipped,
}

/// Reports that the limit `policy` (of the kind `what`: `"rate limit"`, `"concurrency limit"`)
/// met a misconfigured key extractor: a `tracing` warning, and the first time in this process,
/// when no `tracing` subscriber is installed, one line on stderr. Call it only for a
/// [misconfiguration](KeyError::is_misconfiguration).
#[cold]
#[inline(never)]
pub(crate) fn report_misconfiguration(
    what: &'static str,
    policy: &str,
    error: &KeyError,
    consequence: Consequence,
) {
    match consequence {
        Consequence::Refused => {
            tracing::warn!(limit = what, policy, reason = %error, "no key (server misconfigured); request refused with 500");
        }
        Consequence::Skipped => {
            tracing::warn!(limit = what, policy, reason = %error, "no key (server misconfigured); limit skipped");
        }
    }
    let subscriber = tracing::dispatcher::has_been_set();
    if let Some(line) = notice(&PRINTED, subscriber, what, policy, error, consequence) {
        eprintln!("{line}");
    }
}

/// The line to print on stderr, or `None`: when a `tracing` subscriber is installed (it got the
/// warning), or when this misconfiguration was printed before (or `noticed` is full).
pub(crate) fn notice<const N: usize>(
    noticed: &Noticed<N>,
    subscriber: bool,
    what: &'static str,
    policy: &str,
    error: &KeyError,
    consequence: Consequence,
) -> Option<String> {
    if subscriber {
        return None;
    }
    let reason = error.reason();
    let digest = fnv1a(&[what, policy, reason, consequence.as_str()]);
    if !noticed.first(digest) {
        return None;
    }
    let effect = match consequence {
        Consequence::Refused => "every request it sees is answered with 500",
        Consequence::Skipped => "the limit is skipped, so it limits nothing",
    };
    Some(format!(
        "tollgate: {what} \"{policy}\" cannot key requests because the server is misconfigured: \
         {reason}. Until this is fixed, {effect}. (Printed once per process because no `tracing` \
         subscriber is installed.)"
    ))
}

impl Consequence {
    fn as_str(self) -> &'static str {
        match self {
            Consequence::Refused => "refused",
            Consequence::Skipped => "skipped",
        }
    }
}

/// 64-bit FNV-1a over `parts`, each followed by a 0 byte so that the parts cannot run together.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &byte in part.as_bytes().iter().chain(&[0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_PEER: &str = "no peer address in the request: serve the axum app with \
                           `into_make_service_with_connect_info::<SocketAddr>()`";

    #[test]
    fn each_misconfiguration_is_printed_once_without_a_subscriber() {
        let noticed = Noticed::<4>::new();
        let err = KeyError::misconfigured(NO_PEER);
        let line = notice(
            &noticed,
            false,
            "rate limit",
            "per-ip",
            &err,
            Consequence::Refused,
        )
        .expect("the first time is printed");
        assert!(
            line.starts_with("tollgate: rate limit \"per-ip\""),
            "{line}"
        );
        assert!(line.contains(NO_PEER), "{line}");
        assert!(line.contains("500"), "{line}");
        for _ in 0..3 {
            assert_eq!(
                notice(
                    &noticed,
                    false,
                    "rate limit",
                    "per-ip",
                    &err,
                    Consequence::Refused
                ),
                None
            );
        }
        // Another limit, another kind of limit, another consequence: each is news once.
        let other = [
            ("rate limit", "per-ip-2", Consequence::Refused),
            ("concurrency limit", "per-ip", Consequence::Refused),
            ("rate limit", "per-ip", Consequence::Skipped),
        ];
        for (what, policy, consequence) in other {
            let line = notice(&noticed, false, what, policy, &err, consequence);
            assert!(line.is_some(), "{what} {policy} {consequence:?}");
            assert_eq!(
                notice(&noticed, false, what, policy, &err, consequence),
                None
            );
        }
        let skipped = notice(
            &noticed,
            false,
            "rate limit",
            "elsewhere",
            &err,
            Consequence::Skipped,
        );
        assert_eq!(skipped, None, "the set holds 4: a fifth is not printed");
    }

    #[test]
    fn nothing_is_printed_when_a_subscriber_is_installed() {
        let noticed = Noticed::<4>::new();
        let err = KeyError::misconfigured(NO_PEER);
        let args = ("rate limit", "per-ip", &err, Consequence::Refused);
        assert_eq!(notice(&noticed, true, args.0, args.1, args.2, args.3), None);
        // Not remembered either: without a subscriber later, it is printed.
        assert!(notice(&noticed, false, args.0, args.1, args.2, args.3).is_some());
    }

    #[test]
    fn the_set_is_claimed_once_per_digest_from_many_threads() {
        let noticed = Noticed::<8>::new();
        let firsts: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..12u64).filter(|&d| noticed.first(d)).count()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        // Digests 0 and 1 are the same slot value (0 marks a free slot), so 11 distinct values,
        // of which 8 fit: exactly 8 first sightings across all threads.
        assert_eq!(firsts, 8);
        assert!(!noticed.first(100), "full");
    }

    #[test]
    fn digests_keep_parts_apart() {
        assert_ne!(fnv1a(&["ab", "c"]), fnv1a(&["a", "bc"]));
        assert_eq!(fnv1a(&["ab", "c"]), fnv1a(&["ab", "c"]));
    }
}
