#![no_main]

use std::sync::{Mutex, OnceLock};

use tollgate_fuzz::redis_state::Harness;

fn harness() -> &'static Mutex<Harness> {
    static HARNESS: OnceLock<Mutex<Harness>> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let url = tollgate_fuzz::server::redis_url();
        let prefix = format!("fuzz-{}", std::process::id());
        Mutex::new(Harness::new(&url, &prefix))
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut h = harness().lock().unwrap_or_else(|e| e.into_inner());
    h.check(data);
});
