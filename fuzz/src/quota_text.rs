//! Quota text: `Quota::from_str` never panics, and whatever parses (or validates) prints as text
//! that parses back to the same quota.

use std::time::Duration;

use tollgate::Quota;

use crate::input::Input;

/// Checks `data` as quota text (when it is UTF-8), then as the fields of a quota built in code.
pub fn check(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        check_text(text);
    }
    let mut input = Input::new(data);
    let count = input.u64() >> (input.byte() % 64);
    let micros = input.u64() >> (input.byte() % 64);
    let mut quota = Quota::per(Duration::from_micros(micros), count);
    if input.byte() & 1 == 1 {
        quota = quota.burst(input.u64() >> (input.byte() % 64));
    }
    check_quota(quota);
}

/// Parsing never panics; a parsed quota is valid and round-trips through `Display`.
pub fn check_text(text: &str) {
    if let Ok(quota) = text.parse::<Quota>() {
        if let Err(e) = quota.validate() {
            panic!("{text:?} parsed to {quota}, which does not validate: {e}");
        }
        check_quota(quota);
    }
}

/// A valid quota prints as text that parses back to itself, and printing is canonical.
pub fn check_quota(quota: Quota) {
    if quota.validate().is_err() {
        return;
    }
    let text = quota.to_string();
    match text.parse::<Quota>() {
        Ok(back) => {
            assert_eq!(
                back, quota,
                "{quota:?} printed as {text:?}, re-parsed differently"
            );
            assert_eq!(back.to_string(), text, "printing is not canonical");
        }
        Err(e) => panic!("valid quota printed as {text:?}, which does not parse: {e}"),
    }
}
