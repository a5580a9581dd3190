//! Entry points for the `cargo fuzz` targets in `fuzz/`, compiled only with `--cfg fuzzing`
//! (which `cargo fuzz` sets): thin wrappers over crate-private pieces. Not part of the API.

#[cfg(feature = "redis")]
use crate::{store::LimitSpec, Decision, StoreError};

/// Decodes `reply` as the Redis script's reply for one group of limits, all of them `spec`:
/// the time, then five integers per limit. Returns each limit's decision and whether its key
/// held corrupt state.
#[cfg(feature = "redis")]
pub fn decode_reply(spec: &LimitSpec, reply: &[u8]) -> Result<Vec<(Decision, bool)>, StoreError> {
    use crate::store::redis::script::{decision, limit_info, reply_ints};
    let info = limit_info(spec, "fuzz".to_owned()).expect("a valid limit");
    let ints = reply_ints(redis::Value::BulkString(reply.to_vec()))?;
    ints.get(1..)
        .unwrap_or_default()
        .chunks(5)
        .map(|r| decision(&info, info.limit, r))
        .collect()
}
