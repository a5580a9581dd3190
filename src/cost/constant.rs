//! [`ConstantCost`]: every request costs the same.

use super::Cost;
use crate::request::RequestView;

/// Every request costs `n` units; the default is one.
///
/// [`Cost::max_cost`] is `Some(n)`, so a cost that exceeds a limit's capacity is caught when the
/// layer is built.
///
/// ```
/// use tollgate::cost::{ConstantCost, Cost};
/// use tollgate::RequestView;
///
/// let req = http::Request::get("/report").body(()).unwrap();
/// assert_eq!(ConstantCost(5).cost(&RequestView::new(&req)), 5);
/// assert_eq!(ConstantCost(5).max_cost(), Some(5));
/// assert_eq!(ConstantCost::default(), ConstantCost::new(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConstantCost(pub u64);

impl ConstantCost {
    /// Every request costs `n`.
    pub const fn new(n: u64) -> Self {
        Self(n)
    }

    /// The cost of every request.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl Default for ConstantCost {
    fn default() -> Self {
        Self(1)
    }
}

impl Cost for ConstantCost {
    #[inline]
    fn cost(&self, _req: &RequestView<'_>) -> u64 {
        self.0
    }

    fn max_cost(&self) -> Option<u64> {
        Some(self.0)
    }
}
