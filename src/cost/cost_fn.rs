//! The [`Cost`] trait and its blanket implementations.

use crate::request::RequestView;

/// How many units a request spends from a limit.
///
/// Implemented by [`ConstantCost`](super::ConstantCost), [`CostTable`](super::CostTable) and
/// closures `Fn(&RequestView<'_>) -> u64`:
///
/// ```
/// use tollgate::cost::Cost;
/// use tollgate::RequestView;
///
/// // One unit per started kilobyte of declared upload, at least one.
/// let by_size = |req: &RequestView<'_>| {
///     let len = req
///         .headers()
///         .get(http::header::CONTENT_LENGTH)
///         .and_then(|v| v.to_str().ok())
///         .and_then(|v| v.parse::<u64>().ok())
///         .unwrap_or(0);
///     len.div_ceil(1024).clamp(1, 100)
/// };
///
/// let req = http::Request::post("/upload").header("content-length", "5000").body(()).unwrap();
/// assert_eq!(by_size.cost(&RequestView::new(&req)), 5);
/// assert_eq!(by_size.max_cost(), None); // a closure cannot declare its maximum
/// ```
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
