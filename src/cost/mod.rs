//! Cost functions: how many units a request spends.

use crate::request::RequestView;

/// How many units a request spends from a limit.
///
/// Implemented for closures `Fn(&RequestView<'_>) -> u64`.
pub trait Cost: Send + Sync + 'static {
    /// The cost of `req`. Zero is allowed (the request is reported but not charged).
    fn cost(&self, req: &RequestView<'_>) -> u64;

    /// The largest cost this function can return, if known at build time. The builder rejects a
    /// cost function whose maximum exceeds a limit's capacity, since such requests could never
    /// succeed.
    fn max_cost(&self) -> Option<u64> {
        None
    }
}

impl<F> Cost for F
where
    F: Fn(&RequestView<'_>) -> u64 + Send + Sync + 'static,
{
    #[inline]
    fn cost(&self, req: &RequestView<'_>) -> u64 {
        self(req)
    }
}

impl Cost for Box<dyn Cost> {
    #[inline]
    fn cost(&self, req: &RequestView<'_>) -> u64 {
        (**self).cost(req)
    }

    fn max_cost(&self) -> Option<u64> {
        (**self).max_cost()
    }
}
