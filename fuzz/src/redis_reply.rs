//! Script replies, decoded by the store's own parser (through the hidden `fuzzing` module):
//! whatever bytes come back, decoding never panics, and every decision it accepts is coherent.

use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::store::{FailurePolicy, LimitSpec};
use tollgate::{Name, Quota};

use crate::input::Input;

/// Decodes `data` (after one byte choosing the algorithm) as a reply.
pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    let kind = input.pick(&AlgorithmKind::ALL);
    let spec = LimitSpec::new(Name::new("fuzz"), Quota::per_second(5), kind).on_store_error(
        FailurePolicy::Closed {
            retry_after: Duration::from_secs(1),
        },
    );
    let Ok(decisions) = tollgate::fuzzing::decode_reply(&spec, input.rest()) else {
        return;
    };
    for (d, _corrupt) in decisions {
        assert!(d.remaining() <= d.limit(), "{d:?}");
        match d.retry_after() {
            Some(wait) if d.allowed() => assert_eq!(wait, Duration::ZERO, "{d:?}"),
            Some(wait) => assert!(wait > Duration::ZERO, "{d:?}"),
            None => assert!(!d.allowed() && d.is_impossible(), "{d:?}"),
        }
    }
}
