//! A limit's options: [`Mode`] (enforce or shadow) and [`Charge`] (count every request, or by
//! outcome).

use std::fmt;
use std::sync::Arc;

use http::StatusCode;

/// Whether a limit refuses requests, or only reports what it would have refused.
///
/// A limit in [`Shadow`](Mode::Shadow) is decided and counted exactly as if it enforced (its own
/// state is charged by the requests it would have admitted), but it never refuses: would-be
/// rejections are logged (sampled) and counted (metric `outcome="shadow_rejected"`). It decides
/// on its own, in a store call of its own, so it never changes what the enforcing limits of its
/// layer decide, and it decides only the requests they allow. With a store that answers later
/// (Redis), its call is made at the same time as theirs, so a request waits for one store call
/// (at most one store timeout), not two; a request they refuse, or one dropped before they
/// answer, has its shadow charge given back.
/// A reload moves it to [`Enforce`](Mode::Enforce) with its counters intact.
///
/// ```
/// use tollgate::rate_limit::Mode;
///
/// assert_eq!(Mode::default(), Mode::Enforce);
/// assert!(Mode::shadow().is_shadow());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Refuse requests over the limit. The default.
    #[default]
    Enforce,
    /// Never refuse; count and log would-be rejections.
    Shadow {
        /// Whether responses carry this limit's rate-limit headers (default: no, so clients do
        /// not start backing off a limit that is only being tried).
        headers: bool,
    },
}

impl Mode {
    /// `Shadow { headers: false }`.
    pub const fn shadow() -> Self {
        Mode::Shadow { headers: false }
    }

    /// Whether this is a shadow mode.
    pub const fn is_shadow(&self) -> bool {
        matches!(self, Mode::Shadow { .. })
    }

    /// The mode's name, as a policy file spells it.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow { .. } => "shadow",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type StatusPredicate = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// Which requests a limit counts, by their response.
///
/// Either way the request is charged when it is admitted (a reservation), so concurrent requests
/// can never pass more than the quota; a response that is not to be counted gives its charge
/// back ([`Store::refund`](crate::store::Store::refund)). The bound: at any instant the limit has
/// admitted at most its quota plus nothing — in-flight requests hold their units until their
/// response decides, so late responses only ever make the limit stricter, never looser. A refund
/// gives back at most what the reservation still holds (a bucket's refill since then stays
/// spent: see [`Algorithm::refund`](crate::algorithm::Algorithm::refund)).
///
/// ```
/// use http::StatusCode;
/// use tollgate::rate_limit::Charge;
///
/// // Failed logins only: 401s are counted, everything else is given back.
/// let failed_logins = Charge::only_when(|status| status == StatusCode::UNAUTHORIZED);
/// assert!(failed_logins.keeps(StatusCode::UNAUTHORIZED));
/// assert!(!failed_logins.keeps(StatusCode::OK));
///
/// // Do not count errors the server caused.
/// let not_5xx = Charge::refund_when(|status| status.is_server_error());
/// assert!(!not_5xx.keeps(StatusCode::BAD_GATEWAY));
/// assert!(not_5xx.keeps(StatusCode::OK));
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Charge {
    /// Count every admitted request. The default.
    #[default]
    Always,
    /// Count only requests whose response status matches; give the others back.
    OnlyWhen(StatusPredicate),
    /// Give back requests whose response status matches; count the others.
    RefundWhen(StatusPredicate),
}

impl Charge {
    /// Counts only responses whose status matches `f`.
    pub fn only_when(f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        Charge::OnlyWhen(Arc::new(f))
    }

    /// Gives back responses whose status matches `f`.
    pub fn refund_when(f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        Charge::RefundWhen(Arc::new(f))
    }

    /// Whether a response with `status` keeps its charge.
    pub fn keeps(&self, status: StatusCode) -> bool {
        match self {
            Charge::Always => true,
            Charge::OnlyWhen(f) => f(status),
            Charge::RefundWhen(f) => !f(status),
        }
    }

    /// Whether the charge depends on the response.
    pub fn by_outcome(&self) -> bool {
        !matches!(self, Charge::Always)
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Charge::Always => "Always",
            Charge::OnlyWhen(_) => "OnlyWhen(..)",
            Charge::RefundWhen(_) => "RefundWhen(..)",
        })
    }
}
