//! What the logs say when the store fails: each thing once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};

use super::{client, handler};
use crate::store::redis::RedisBackend;
use crate::store::FailurePolicy;
use crate::{Limit, Quota, RateLimitLayer};

/// The formatted events, one per line.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// Current-thread: the store's connection tasks run on this thread, under the subscriber.
#[tokio::test]
async fn a_redis_failure_is_logged_once_per_fact_without_an_empty_node() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // Nothing listens on port 1.
    let layer = RateLimitLayer::builder()
        .backend(RedisBackend::new("redis://127.0.0.1:1").timeout(Duration::from_millis(200)))
        .limit(
            Limit::new("api", Quota::per_second(5))
                .key(client())
                .on_store_error(FailurePolicy::Closed {
                    retry_after: Duration::from_secs(1),
                }),
        )
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(handler);
    let req = Request::get("/").header("x-client", "a").body(()).unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let refused: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("request refused"))
        .collect();
    assert_eq!(refused.len(), 1, "{text}");
    let line = refused[0];
    assert_eq!(line.matches("rate-limit store").count(), 1, "{line}");
    assert!(
        line.contains("rate-limit store unavailable: redis: "),
        "{line}"
    );
    assert!(!text.contains("the rate limiter is unavailable"), "{text}");
    assert!(!text.contains("Unavailable"), "{text}");
    assert!(!text.contains("node=\"\""), "{text}");
    assert!(!text.contains("node= "), "{text}");
    // The failed call is reported once, by the store.
    assert_eq!(
        text.matches("redis rate-limit call failed").count(),
        1,
        "{text}"
    );
}
