//! Options and validation: response extensions, build errors, accessors, paused time,
//! shadow charges of dropped requests.

use std::time::Duration;

use http::header::RETRY_AFTER;
use http::StatusCode;
use tower::{Service, ServiceBuilder, ServiceExt};

use super::test_store::Mode;
use super::*;
use crate::clock::ManualClock;
use crate::cost::Cost;
use crate::headers::{ResetFormat, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
use crate::key::{GlobalKey, MissingKey};
use crate::{Decision, Quota, RequestView};

#[tokio::test]
async fn allowed_responses_carry_the_decision_when_opted_in() {
    let clock = ManualClock::new();
    for mode in [Mode::Ready, Mode::Pending] {
        let svc = service(
            builder(&clock, mode)
                .response_extensions(true)
                .limit(Limit::new("pair", Quota::per_hour(2)).key(client())),
        );
        for remaining in [1, 0] {
            let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            let d = res.extensions().get::<Decision>().unwrap();
            assert_eq!((d.remaining(), d.policy().as_str()), (remaining, "pair"));
        }
        let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(!res.extensions().get::<Decision>().unwrap().allowed());
        let res = svc.clone().oneshot(get("/", "b")).await.unwrap();
        assert_eq!(
            res.extensions().get::<Decision>().map(Decision::remaining),
            Some(1)
        );
    }
}

#[derive(Debug)]
struct UpTo(u64);

impl Cost for UpTo {
    fn cost(&self, _: &RequestView<'_>) -> u64 {
        self.0
    }
    fn max_cost(&self) -> Option<u64> {
        Some(self.0)
    }
}

#[test]
fn build_validates_with_actionable_errors() {
    let clock = ManualClock::new();
    let b = || builder(&clock, Mode::Ready);
    let field = |r: Result<RateLimitLayer<_>, crate::ConfigError>| {
        let e = r.unwrap_err();
        assert!(!e.message().is_empty());
        (e.field(), e.message().to_owned())
    };

    assert_eq!(field(b().build()).0, "limits");

    let mut many = b();
    for i in 0..9 {
        many = many.limit(Limit::new(format!("l{i}"), Quota::per_second(1)).key(GlobalKey));
    }
    let (f, m) = field(many.build());
    assert_eq!(f, "limits");
    assert!(m.contains("at most 8"), "{m}");

    let (f, m) = field(b().limit(burst5()).limit(burst5()).build());
    assert_eq!(f, "limit.name");
    assert!(m.contains("\"burst\""), "{m}");

    for bad in ["", "naïve", "tab\there"] {
        let (f, _) = field(
            b().limit(Limit::new(bad, Quota::per_second(1)).key(GlobalKey))
                .build(),
        );
        assert_eq!(f, "limit.name", "{bad:?}");
    }

    let (f, m) = field(b().limit(Limit::new("nokey", Quota::per_second(1))).build());
    assert_eq!(f, "limit.key");
    assert!(m.contains("\"nokey\"") && m.contains(".key("), "{m}");

    let (f, m) = field(
        b().limit(Limit::new("zero", Quota::per_second(0)).key(GlobalKey))
            .build(),
    );
    assert_eq!(f, "quota.count");
    assert!(m.contains("\"zero\""), "{m}");

    let (f, m) = field(b().limit(burst5().cost(UpTo(6))).build());
    assert_eq!(f, "limit.cost");
    assert!(m.contains("\"burst\"") && m.contains("at least 6"), "{m}");
    assert!(b().limit(burst5().cost(UpTo(5))).build().is_ok());

    let (f, _) = field(
        b().limit(burst5().on_missing_key(MissingKey::reject_with(StatusCode::OK)))
            .build(),
    );
    assert_eq!(f, "limit.on_missing_key");
}

#[test]
fn layer_and_service_accessors() {
    let clock = ManualClock::new();
    let layer = builder(&clock, Mode::Ready)
        .limit(burst5())
        .build()
        .unwrap();
    assert!(format!("{layer:?}").contains("burst"));
    let mut svc = tower_layer::Layer::layer(&layer, 7u8);
    assert_eq!(*svc.get_ref(), 7);
    *svc.get_mut() = 8;
    assert_eq!(svc.clone().into_inner(), 8);
}

#[tokio::test(start_paused = true)]
async fn tokio_paused_time_drives_the_memory_store() {
    let layer = RateLimitLayer::builder()
        .backend(crate::store::memory::MemoryBackend::new().clock(crate::clock::TokioClock::new()))
        .reset_format(ResetFormat::DeltaSeconds)
        .limit(Limit::new("per-client", Quota::per_second(2).burst(2)).key(client()))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(handler);
    for _ in 0..2 {
        let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, RETRY_AFTER), "1"); // 500 ms, rounded up
    tokio::time::advance(Duration::from_millis(500)).await;
    let res = svc.clone().oneshot(get("/", "a")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, X_RATELIMIT_REMAINING), "0");
    assert_eq!(header(&res, X_RATELIMIT_RESET), "1");
}

/// A request dropped while its enforcing check is pending (its client went away) was never
/// allowed: the shadow check started with it gives its charge back, as for a refusal.
#[tokio::test]
async fn a_request_dropped_before_its_enforcing_answer_leaves_no_shadow_charge() {
    let clock = ManualClock::new();
    let svc = service(
        builder(&clock, Mode::Pending)
            .limit(Limit::new("enforced", Quota::per_hour(100)).key(client()))
            .limit(
                Limit::new("tried", Quota::per_hour(5))
                    .key(GlobalKey)
                    .mode(crate::rate_limit::Mode::Shadow { headers: true }),
            ),
    );
    // Both checks reach the store in `call`; the enforcing answer is still to come.
    for i in 0..3 {
        let mut s = svc.clone();
        let call = s.call(get("/", &format!("gone{i}")));
        drop(call);
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let res = svc.clone().oneshot(get("/", "b")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // `tried` (5 an hour, tighter than 100) shows: only this request is charged.
    assert_eq!(header(&res, X_RATELIMIT_LIMIT), "5");
    assert_eq!(header(&res, X_RATELIMIT_REMAINING), "4");
}
