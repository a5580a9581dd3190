//! A store for this module's tests: the real [`MemoryStore`] on a manual clock, answering
//! synchronously, asynchronously (to exercise the pending path a networked store takes), or
//! with an error.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::clock::ManualClock;
use crate::error::{ConfigError, StoreError};
use crate::store::memory::{MemoryBackend, MemoryStore};
use crate::store::{Backend, Checked, Decisions, LimitCheck, LimitSpec, Store};

#[derive(Debug, Clone)]
pub(crate) enum Mode {
    Ready,
    Pending,
    Fail(StoreError),
}

#[derive(Debug, Clone)]
pub(crate) struct TestBackend {
    clock: ManualClock,
    mode: Mode,
}

impl TestBackend {
    pub(crate) fn new(clock: &ManualClock, mode: Mode) -> Self {
        Self {
            clock: clock.clone(),
            mode,
        }
    }
}

#[derive(Debug)]
pub(crate) struct TestStore {
    inner: MemoryStore<ManualClock>,
    mode: Mode,
}

impl Backend for TestBackend {
    type Store = TestStore;

    fn build(self, limits: &[LimitSpec]) -> Result<TestStore, ConfigError> {
        Ok(TestStore {
            inner: MemoryBackend::new().clock(self.clock).build(limits)?,
            mode: self.mode,
        })
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
        let value = match &self.mode {
            Mode::Ready => return Checked::Ready(self.inner.check_all(checks)),
            Mode::Pending => self.inner.check_all(checks),
            Mode::Fail(e) => Err(e.clone()),
        };
        Checked::Pending(YieldOnce {
            value: Some(value),
            yielded: false,
        })
    }

    fn refund(&self, checks: &[LimitCheck<'_>], reserved_at: u64) -> Checked<Self::Future> {
        match self.inner.refund(checks, reserved_at) {
            Checked::Ready(result) => Checked::Ready(result),
            Checked::Pending(_) => unreachable!("the memory store answers at once"),
        }
    }
}
