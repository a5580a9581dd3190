//! A private `redis-server` for the `redis_state` target: on a free loopback port, without
//! persistence, under a shell watchdog that stops it when the fuzzer exits (libFuzzer exits
//! without running destructors). `TOLLGATE_FUZZ_REDIS_URL` selects an existing server instead.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The URL of a Redis to fuzz against, starting one if needed.
pub fn redis_url() -> String {
    if let Ok(url) = std::env::var("TOLLGATE_FUZZ_REDIS_URL") {
        return url;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let script = format!(
        "redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no \
         --loglevel warning >/dev/null 2>&1 & r=$!; \
         while kill -0 {parent} 2>/dev/null; do sleep 1; done; kill $r",
        parent = std::process::id()
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .spawn()
        .expect("start redis-server (install the redis-server package)");
    let deadline = Instant::now() + Duration::from_secs(10);
    let url = format!("redis://127.0.0.1:{port}/");
    loop {
        let up = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .is_ok();
        if up {
            return url;
        }
        assert!(
            Instant::now() < deadline,
            "redis-server did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
