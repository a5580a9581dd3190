//! A small store for this module's tests: token bucket only, on a manual clock, answering
//! synchronously, asynchronously, or with an error.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use crate::algorithm::{Algorithm, TokenBucket, TokenBucketState};
use crate::clock::{Clock, ManualClock};
use crate::error::{ConfigError, StoreError};
use crate::store::{Backend, Checked, Decisions, LimitCheck, LimitSpec, Store};

#[derive(Debug, Clone)]
pub(crate) enum Mode {
    Ready,
    Pending,
    Fail(StoreError),
}

#[derive(Debug, Clone)]
pub(crate) struct TestBackend {
    pub(crate) clock: ManualClock,
    pub(crate) mode: Mode,
}

impl TestBackend {
    pub(crate) fn new(clock: &ManualClock, mode: Mode) -> Self {
        Self {
            clock: clock.clone(),
            mode,
        }
    }
}

type States = HashMap<(usize, Vec<u8>), TokenBucketState>;

#[derive(Debug)]
pub(crate) struct TestStore {
    clock: ManualClock,
    mode: Mode,
    buckets: Vec<TokenBucket>,
    state: Arc<Mutex<States>>,
}

impl Backend for TestBackend {
    type Store = TestStore;

    fn build(self, limits: &[LimitSpec]) -> Result<TestStore, ConfigError> {
        Ok(TestStore {
            clock: self.clock,
            mode: self.mode,
            buckets: limits
                .iter()
                .map(|l| TokenBucket::new(*l.quota()))
                .collect::<Result<_, _>>()?,
            state: Arc::default(),
        })
    }
}

impl TestStore {
    fn decide(&self, checks: &[LimitCheck<'_>]) -> Decisions {
        let now = self.clock.now_micros();
        let mut map = self.state.lock().unwrap();
        let keys: Vec<(usize, Vec<u8>)> = checks
            .iter()
            .map(|c| {
                let mut k = Vec::new();
                c.key.write_canonical(&mut k);
                (c.limit, k)
            })
            .collect();
        let mut decisions = Decisions::new();
        for (c, k) in checks.iter().zip(&keys) {
            let state = map.get(k).copied().unwrap_or_default();
            decisions.push(self.buckets[c.limit].decide(&state, now, c.cost));
        }
        if decisions.allowed() {
            for (c, k) in checks.iter().zip(keys) {
                let state = map.entry(k).or_default();
                self.buckets[c.limit].apply(state, now, c.cost);
            }
            return decisions;
        }
        // Nothing is charged: report every limit as it stands.
        let mut uncharged = Decisions::new();
        for ((c, k), d) in checks.iter().zip(&keys).zip(decisions.as_slice()) {
            let state = map.get(k).copied().unwrap_or_default();
            uncharged.push(if d.allowed() {
                self.buckets[c.limit].decide(&state, now, 0)
            } else {
                *d
            });
        }
        uncharged
    }
}

/// Resolves to its value on the second poll.
pub(crate) struct YieldOnce<T> {
    value: Option<T>,
    yielded: bool,
}

impl<T: Unpin> Future for YieldOnce<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.value.take().expect("polled after completion"))
    }
}

impl Store for TestStore {
    type Future = YieldOnce<Result<Decisions, StoreError>>;

    fn check(&self, checks: &[LimitCheck<'_>]) -> Checked<Self::Future> {
        match &self.mode {
            Mode::Ready => Checked::Ready(Ok(self.decide(checks))),
            Mode::Pending => Checked::Pending(YieldOnce {
                value: Some(Ok(self.decide(checks))),
                yielded: false,
            }),
            Mode::Fail(e) => Checked::Pending(YieldOnce {
                value: Some(Err(e.clone())),
                yielded: false,
            }),
        }
    }
}
