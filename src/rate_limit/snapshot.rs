//! [`Snapshot`]: the limits and the store deciding them, swapped as a whole by a reload.

use super::limit::CompiledLimit;

/// The limits and the store deciding them: swapped as a whole by a reload.
pub(crate) struct Snapshot<St> {
    pub(crate) limits: Box<[CompiledLimit]>,
    pub(crate) store: St,
    /// `RateLimit-Policy` for a request checked against every limit (rendered once).
    pub(crate) policy_header: Option<http::HeaderValue>,
}
