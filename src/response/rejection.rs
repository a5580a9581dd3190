//! The [`Rejection`] trait and the [`DefaultRejection`] it comes with.

use std::borrow::Cow;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::RETRY_AFTER;
use http::{HeaderValue, Response, StatusCode};

use super::grpc::{grpc_trailers_only, GrpcCode, GRPC_RETRY_PUSHBACK_MS};
use super::problem::{Part, ProblemDetails};
use super::rfc3339;
use super::RejectionBody;
use crate::decision::Decisions;
use crate::decision::{ceil_secs, Decision, Name};
use crate::error::StoreError;
use crate::headers::policy_window_secs;
use crate::key::KeyError;
use crate::quota::Quota;
use crate::request::RequestView;

/// Builds the response for a request the rate limiter refuses.
///
/// The layer calls it with a [`Rejected`] describing why, then adds the rate-limit headers
/// (`X-RateLimit-*`, the IETF fields when enabled) and `Retry-After` when the response does not
/// already carry one, and (with
/// [`response_extensions`](crate::rate_limit::RateLimitLayerBuilder::response_extensions)) puts the
/// [`Decision`] in the response extensions. So an implementation only chooses the status and the
/// body.
///
/// [`DefaultRejection`] is used unless another is set with
/// [`RateLimitLayerBuilder::rejection`](crate::rate_limit::RateLimitLayerBuilder::rejection). Closures
/// `Fn(&Rejected<'_>) -> Response<RejectionBody>` implement the trait:
///
/// ```
/// use http::{Response, StatusCode};
/// use tollgate::response::{RejectReason, Rejected, RejectionBody};
///
/// let plain_text = |rejected: &Rejected<'_>| {
///     let body = match rejected.reason() {
///         RejectReason::RateLimited { decision, .. } => format!("slow down ({})", decision.policy()),
///         _ => String::from("refused"),
///     };
///     let mut response = Response::new(RejectionBody::from(body));
///     *response.status_mut() = rejected.status();
///     response
/// };
/// # let _: &dyn tollgate::response::Rejection = &plain_text;
/// ```
pub trait Rejection: Send + Sync + 'static {
    /// The response for `rejected`.
    fn reject(&self, rejected: &Rejected<'_>) -> Response<RejectionBody>;
}

impl<F> Rejection for F
where
    F: Fn(&Rejected<'_>) -> Response<RejectionBody> + Send + Sync + 'static,
{
    fn reject(&self, rejected: &Rejected<'_>) -> Response<RejectionBody> {
        self(rejected)
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum RejectReason<'a> {
    /// A limit is exhausted; the request would succeed after `decision.retry_after()`.
    RateLimited {
        /// The rejecting limit's decision.
        decision: &'a Decision,
        /// The rejecting limit's quota.
        quota: &'a Quota,
    },
    /// The request costs more than the limit can ever hold: waiting never helps.
    CostExceedsCapacity {
        /// The limit's decision ([`Decision::is_impossible`]).
        decision: &'a Decision,
        /// The limit's quota.
        quota: &'a Quota,
        /// What the request costs.
        cost: u64,
    },
    /// No key could be extracted for a limit configured to reject such requests.
    MissingKey {
        /// The limit.
        policy: Name,
        /// Why there is no key.
        error: &'a KeyError,
        /// The status the limit was configured to answer with.
        status: StatusCode,
    },
    /// The store could not decide and its failure policy is to refuse.
    StoreUnavailable {
        /// What went wrong.
        error: &'a StoreError,
    },
    /// The limit's plan resolver knows no plan for this request and the limit refuses such
    /// requests ([`UnknownPlan::Reject`](crate::plan::UnknownPlan::Reject)).
    UnknownPlan {
        /// The limit.
        policy: Name,
        /// The status the limit was configured to answer with.
        status: StatusCode,
    },
    /// The key is blocked by a runtime [`Override::Block`](crate::rate_limit::Override::Block).
    Blocked {
        /// The limit whose override blocks the key.
        policy: Name,
    },
}

/// Everything a [`Rejection`] needs: the request, the reason and every decision made, and when
/// the rejecting limit has plans, its plan and the plan's link.
#[derive(Debug, Clone, Copy)]
pub struct Rejected<'a> {
    request: RequestView<'a>,
    reason: RejectReason<'a>,
    decisions: &'a Decisions,
    plan: Option<Name>,
    link: Option<&'a str>,
    /// The wall-clock time of the rejection; read when needed unless set.
    now: Option<SystemTime>,
}

impl<'a> Rejected<'a> {
    /// Describes a rejection of `request` (useful to test a custom [`Rejection`]).
    pub fn new(
        request: RequestView<'a>,
        reason: RejectReason<'a>,
        decisions: &'a Decisions,
    ) -> Self {
        Self {
            request,
            reason,
            decisions,
            plan: None,
            link: None,
            now: None,
        }
    }

    /// The same rejection, happening at the wall-clock time `now` (by default the system time
    /// when [`reset_at`](Self::reset_at) is asked): for deterministic tests of a [`Rejection`].
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use http::Request;
    /// use tollgate::response::{DefaultRejection, RejectReason, Rejected, Rejection};
    /// use tollgate::Decisions;
    /// use tollgate::{Decision, Name, Quota, RequestView};
    ///
    /// let req = Request::get("/").body(()).unwrap();
    /// let quota = Quota::per_minute(5);
    /// let decision = Decision::rejected(5, 0, Duration::from_secs(48), Duration::from_secs(12))
    ///     .with_policy(Name::new("api"));
    /// let decisions = Decisions::new();
    /// let reason = RejectReason::RateLimited { decision: &decision, quota: &quota };
    /// let rejected = Rejected::new(RequestView::new(&req), reason, &decisions)
    ///     .at(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    /// assert_eq!(rejected.reset_at(), Some(UNIX_EPOCH + Duration::from_secs(1_700_000_048)));
    ///
    /// let res = DefaultRejection::new().reject(&rejected);
    /// let body: serde_json::Value = serde_json::from_slice(res.body().as_bytes()).unwrap();
    /// assert_eq!(body["reset"], "2023-11-14T22:14:08Z");
    /// assert_eq!(body["reset_seconds"], 48);
    /// ```
    #[must_use]
    pub fn at(mut self, now: SystemTime) -> Self {
        self.now = Some(now);
        self
    }

    /// The same rejection, by the limit's plan `plan`, whose link (where to upgrade) is `link`.
    #[must_use]
    pub(crate) fn with_plan(mut self, plan: Name, link: Option<&'a str>) -> Self {
        self.plan = Some(plan);
        self.link = link;
        self
    }

    /// The refused request.
    pub fn request(&self) -> &RequestView<'a> {
        &self.request
    }

    /// Why it is refused.
    pub fn reason(&self) -> &RejectReason<'a> {
        &self.reason
    }

    /// Every decision made for the request (empty when no limit was checked).
    pub fn decisions(&self) -> &'a Decisions {
        self.decisions
    }

    /// The rejecting limit's decision, if a limit decided.
    pub fn decision(&self) -> Option<&'a Decision> {
        match self.reason {
            RejectReason::RateLimited { decision, .. }
            | RejectReason::CostExceedsCapacity { decision, .. } => Some(decision),
            _ => None,
        }
    }

    /// The plan of the rejecting limit that decided (`"free"`), when the limit has plans: the
    /// one the layer resolved, or else the rejecting decision's [`Decision::plan`].
    pub fn plan(&self) -> Option<Name> {
        self.plan
            .or_else(|| self.decision().and_then(Decision::plan))
    }

    /// [`plan`](Self::plan)'s name, borrowed.
    #[cfg(feature = "tonic")]
    fn plan_str(&self) -> Option<&str> {
        match &self.plan {
            Some(plan) => Some(plan.as_str()),
            None => self.decision().and_then(Decision::plan_str),
        }
    }

    /// The link configured for that plan (e.g. where to upgrade), if any.
    pub fn link(&self) -> Option<&'a str> {
        self.link
    }

    /// When the rejecting limit is fully restored: the wall-clock time of the rejection plus
    /// [`Decision::reset`], rounded up to a whole second. `None` when no limit decided.
    pub fn reset_at(&self) -> Option<SystemTime> {
        let decision = self.decision()?;
        let now = self.now.unwrap_or_else(crate::clock::wall_now);
        let secs = rfc3339::unix_secs_ceil(now, decision.reset());
        Some(UNIX_EPOCH + std::time::Duration::from_secs(secs))
    }

    /// The status [`DefaultRejection`] answers with: `429` rate limited, `413` cost exceeds
    /// capacity, the configured status for a missing key, `503` store unavailable.
    pub fn status(&self) -> StatusCode {
        match self.reason {
            RejectReason::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            RejectReason::CostExceedsCapacity { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            RejectReason::MissingKey { status, .. } => status,
            RejectReason::StoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            RejectReason::UnknownPlan { status, .. } => status,
            RejectReason::Blocked { .. } => StatusCode::FORBIDDEN,
        }
    }

    /// `Retry-After` in whole seconds (rounded up, at least 1), when waiting helps: for a rate
    /// limit, and for a store error that suggests a delay.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self.reason {
            RejectReason::RateLimited { decision, .. } => decision.retry_after_secs_ceil(),
            RejectReason::StoreUnavailable { error } => {
                error.retry_after().map(|d| ceil_secs(d).max(1))
            }
            _ => None,
        }
    }
}

/// The default rejection: an RFC 9457 `application/problem+json` body, or a gRPC trailers-only
/// response for gRPC requests.
///
/// | reason | status | problem `type` suffix | extension members |
/// |---|---|---|---|
/// | rate limited | `429`, `Retry-After` | `rate-limited` | `policy`, `quota`, `limit`, `window`, `remaining`, `retry_after`, `reset`, `reset_seconds`, and `plan`, `link` when known |
/// | cost exceeds capacity | `413`, no `Retry-After` | `cost-exceeds-limit` | `policy`, `quota`, `limit`, `window`, `cost` |
/// | missing key | `400`, `500` if misconfigured, or as configured ([`MissingKey`](crate::key::MissingKey)) | `missing-key` | `policy` |
/// | store unavailable | `503`, `Retry-After` if known | `limiter-unavailable` | `retry_after` if known |
///
/// `window` is the seconds to refill the limit from empty (the `w` of `RateLimit-Policy`).
/// `reset_seconds` is the time until the limit is fully restored ([`Decision::reset`], whole
/// seconds rounded up) and `reset` the same instant as an RFC 3339 UTC time
/// (`"2026-03-01T12:00:48Z"`, see [`Rejected::reset_at`]); `retry_after` is the shorter wait
/// until this request would be allowed. `plan` names the limit's plan that refused (when the
/// limit has plans) and `link` is that plan's link (e.g. where to upgrade), when it has one. A cost
/// above capacity gets `413 Content Too Large` rather than `429`: `429` tells clients to slow
/// down and retry, but this request fails however long they wait, and clients do not retry a
/// `413`. For a missing key caused by server misconfiguration ([`KeyError::misconfigured`]: no
/// peer address, no matched route) the `500`'s `detail` (and a gRPC call's status message) names
/// the limit and the fix the extractor gave (`serve the axum app with
/// into_make_service_with_connect_info::<SocketAddr>()`), so the first request in testing shows
/// it; that reason is a `&'static str` describing the setup, never request data. A request's own
/// missing key answered with a 5xx ([`MissingKey::RejectWith`](crate::key::MissingKey::RejectWith))
/// does not repeat the reason.
///
/// The problem `type` is `urn:tollgate:problem:<suffix>` unless a base is set with
/// [`problem_type_base`](Self::problem_type_base).
///
/// gRPC requests (`content-type: application/grpc*`) get HTTP `200` with
/// `content-type: application/grpc`, `grpc-status` ([`GrpcCode::from_http`] of the status above:
/// `8 RESOURCE_EXHAUSTED` for a rate limit, `14 UNAVAILABLE` when the store fails closed), a
/// percent-encoded `grpc-message`, and `grpc-retry-pushback-ms` when waiting helps. With the
/// `tonic` feature they also carry `grpc-status-details-bin`, Google's error model that
/// `tonic-types`' `StatusExt` (and other gRPC libraries) decode: a `google.rpc.Status` with the
/// same code and message and
///
/// - `google.rpc.RetryInfo` whenever waiting helps: `retry_delay` is the `Retry-After`, in whole
///   seconds rounded up, never 0;
/// - `google.rpc.QuotaFailure` whenever a limit refused: one violation whose `subject` is the
///   limit's name and whose `description` is its quota in words (`"1 per second, bursts of up
///   to 5"`). The client's key never appears.
///
/// ```
/// use tollgate::response::DefaultRejection;
///
/// let rejection = DefaultRejection::new().problem_type_base("https://api.example.com/problems/");
/// # let _ = rejection;
/// ```
#[derive(Clone)]
pub struct DefaultRejection {
    type_base: Cow<'static, str>,
    grpc: bool,
}

impl Default for DefaultRejection {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for DefaultRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DefaultRejection")
            .field("type_base", &self.type_base)
            .field("grpc", &self.grpc)
            .finish()
    }
}

impl DefaultRejection {
    /// Problem types under `urn:tollgate:problem:`, gRPC detection on.
    pub const fn new() -> Self {
        Self {
            type_base: Cow::Borrowed("urn:tollgate:problem:"),
            grpc: true,
        }
    }

    /// Prefixes problem types with `base` (e.g. `https://api.example.com/problems/`, giving
    /// `https://api.example.com/problems/rate-limited`).
    #[must_use]
    pub fn problem_type_base(mut self, base: impl Into<Cow<'static, str>>) -> Self {
        self.type_base = base.into();
        self
    }

    /// Whether gRPC requests get a trailers-only gRPC response (default: yes).
    #[must_use]
    pub fn grpc(mut self, enabled: bool) -> Self {
        self.grpc = enabled;
        self
    }

    fn problem(&self, rejected: &Rejected<'_>) -> ProblemDetails {
        let status = rejected.status();
        let ty = |suffix: &str| format!("{}{suffix}", self.type_base);
        match rejected.reason {
            RejectReason::RateLimited { decision, quota } => {
                let retry = decision.retry_after_secs_ceil().unwrap_or(1);
                let name = decision.policy();
                let reset_at = rejected
                    .reset_at()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs());
                // Written straight into the document (no intermediate strings; the quota's text
                // comes from a per-thread cache): the same text as `format!`ing each member.
                // "Rate limit \"{name}\" ({quota}) is exhausted; retry in {retry} s."
                with_quota_text(quota, |quota_text| {
                    let mut problem = ProblemDetails::typed_parts(
                        status,
                        &[Part::Text(&self.type_base), Part::Escaped("rate-limited")],
                        "Too Many Requests",
                    )
                    .lead_parts(
                        ",\"detail\":",
                        &[
                            Part::Escaped("Rate limit \\\""),
                            Part::Text(name.as_str()),
                            Part::Escaped("\\\" ("),
                            Part::Text(quota_text),
                            Part::Escaped(") is exhausted; retry in "),
                            Part::U64(retry),
                            Part::Escaped(" s."),
                        ],
                    )
                    .lead_str(",\"policy\":", name.as_str())
                    .lead_str(",\"quota\":", quota_text)
                    .lead_u64(",\"limit\":", decision.limit())
                    .lead_u64(",\"window\":", policy_window_secs(quota))
                    .lead_u64(",\"remaining\":", decision.remaining())
                    .lead_u64(",\"retry_after\":", retry)
                    .lead_str(
                        ",\"reset\":",
                        std::str::from_utf8(&rfc3339::utc_bytes(reset_at)).unwrap_or_default(),
                    )
                    .lead_u64(",\"reset_seconds\":", ceil_secs(decision.reset()));
                    if let Some(plan) = rejected.plan() {
                        problem = problem.member_str("plan", plan.as_str());
                    }
                    if let Some(link) = rejected.link() {
                        problem = problem.member_str("link", link);
                    }
                    problem
                })
            }
            RejectReason::CostExceedsCapacity {
                decision,
                quota,
                cost,
            } => {
                let name = decision.policy();
                let limit = decision.limit();
                ProblemDetails::new(
                    status,
                    &ty("cost-exceeds-limit"),
                    "Request Cost Exceeds Rate Limit",
                )
                .detail(&format!(
                    "This request costs {cost} units but rate limit \"{name}\" ({quota}) holds at most {limit}, so it can never be allowed; split it into smaller requests."
                ))
                .member_str("policy", name.as_str())
                .member_str("quota", &quota.to_string())
                .member_u64("limit", limit)
                .member_u64("window", policy_window_secs(quota))
                .member_u64("cost", cost)
            }
            RejectReason::MissingKey { policy, error, .. } => {
                let detail = match error.fix() {
                    Some(fix) => format!(
                        "Rate limit \"{policy}\" cannot identify the client because the server is misconfigured: {fix}."
                    ),
                    None if status.is_server_error() => format!(
                        "The server could not identify the client for rate limit \"{policy}\"."
                    ),
                    None => format!("Rate limit \"{policy}\" cannot identify the client: {error}."),
                };
                ProblemDetails::new(status, &ty("missing-key"), "Rate Limit Key Unavailable")
                    .detail(&detail)
                    .member_str("policy", policy.as_str())
            }
            RejectReason::StoreUnavailable { .. } => {
                let problem = ProblemDetails::new(
                    status,
                    &ty("limiter-unavailable"),
                    "Rate Limiter Unavailable",
                )
                .detail("The rate limiter cannot decide right now; retry later.");
                match rejected.retry_after_secs() {
                    Some(secs) => problem.member_u64("retry_after", secs),
                    None => problem,
                }
            }
            RejectReason::UnknownPlan { policy, .. } => {
                ProblemDetails::new(status, &ty("unknown-plan"), "No Plan For This Client")
                    .detail(&format!(
                        "Rate limit \"{policy}\" has no plan for this client; check the API key."
                    ))
                    .member_str("policy", policy.as_str())
            }
            RejectReason::Blocked { policy } => {
                ProblemDetails::new(status, &ty("blocked"), "Forbidden")
                    .detail(&format!("Rate limit \"{policy}\" blocks this client."))
                    .member_str("policy", policy.as_str())
            }
        }
    }

    fn grpc_message(rejected: &Rejected<'_>) -> String {
        match rejected.reason {
            RejectReason::RateLimited { decision, quota } => format!(
                "rate limit \"{}\" ({quota}) exhausted; retry in {} s",
                decision.policy(),
                decision.retry_after_secs_ceil().unwrap_or(1)
            ),
            RejectReason::CostExceedsCapacity { decision, cost, .. } => format!(
                "request costs {cost} units but rate limit \"{}\" holds at most {}",
                decision.policy(),
                decision.limit()
            ),
            RejectReason::MissingKey { policy, error, .. } => match error.fix() {
                Some(fix) => format!(
                    "rate limit \"{policy}\" cannot identify the client because the server is misconfigured: {fix}"
                ),
                None => format!("rate limit \"{policy}\" cannot identify the client"),
            },
            RejectReason::StoreUnavailable { .. } => String::from("rate limiter unavailable"),
            RejectReason::UnknownPlan { policy, .. } => {
                format!("rate limit \"{policy}\" has no plan for this client")
            }
            RejectReason::Blocked { policy } => {
                format!("rate limit \"{policy}\" blocks this client")
            }
        }
    }
}

#[cfg(feature = "tonic")]
impl DefaultRejection {
    /// `RetryInfo` whenever waiting helps (a rate limit, a store that suggests a delay), and a
    /// `QuotaFailure` naming the limit whenever a limit refused.
    fn grpc_details<'a>(rejected: &'a Rejected<'_>) -> super::grpc_details::StatusDetails<'a> {
        let quota = match rejected.reason {
            RejectReason::RateLimited { decision, quota }
            | RejectReason::CostExceedsCapacity {
                decision, quota, ..
            } => Some((decision.policy_str(), quota)),
            RejectReason::MissingKey { .. }
            | RejectReason::StoreUnavailable { .. }
            | RejectReason::UnknownPlan { .. }
            | RejectReason::Blocked { .. } => None,
        };
        super::grpc_details::StatusDetails {
            retry_after_secs: rejected.retry_after_secs(),
            quota,
            plan: quota.and(rejected.plan_str()),
        }
    }
}

impl Rejection for DefaultRejection {
    fn reject(&self, rejected: &Rejected<'_>) -> Response<RejectionBody> {
        let retry_after = rejected.retry_after_secs();
        if self.grpc && rejected.request().is_grpc() {
            let code = GrpcCode::from_http(rejected.status());
            let message = Self::grpc_message(rejected);
            let mut response = grpc_trailers_only(code, &message);
            #[cfg(feature = "tonic")]
            if let Some(details) = Self::grpc_details(rejected).header_value(code, &message) {
                response
                    .headers_mut()
                    .insert(super::GRPC_STATUS_DETAILS_BIN, details);
            }
            if let Some(secs) = retry_after {
                let millis = match rejected.decision().and_then(Decision::retry_after) {
                    Some(d) => u64::try_from(d.as_millis().max(1)).unwrap_or(u64::MAX),
                    None => secs.saturating_mul(1000),
                };
                response
                    .headers_mut()
                    .insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(millis));
            }
            return response;
        }
        let mut response = self.problem(rejected).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(RETRY_AFTER, crate::headers::number(secs));
        }
        response
    }
}

/// Runs `f` with `quota`'s text (its `Display`), rendered once per thread for the quota last
/// asked for: a refused request's body names its limit's quota twice, and a limit refuses many
/// requests in a row.
fn with_quota_text<R>(quota: &Quota, f: impl Fn(&str) -> R) -> R {
    use std::cell::RefCell;
    use std::fmt::Write as _;
    thread_local!(static LAST: RefCell<Option<(Quota, String)>> = const { RefCell::new(None) });
    LAST.try_with(|last| {
        let mut last = last.try_borrow_mut().ok()?;
        let (cached, text) = last.get_or_insert_with(|| (*quota, quota.to_string()));
        if cached != quota {
            *cached = *quota;
            text.clear();
            let _ = write!(text, "{quota}");
        }
        Some(f(text))
    })
    .ok()
    .flatten()
    .unwrap_or_else(|| f(&quota.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreErrorKind;
    use http::header::CONTENT_TYPE;
    use std::time::Duration;

    fn json(response: Response<RejectionBody>) -> serde_json::Value {
        serde_json::from_slice(response.body().as_bytes()).unwrap()
    }

    #[test]
    fn rate_limited_problem_names_the_limit() {
        let req = http::Request::get("/").body(()).unwrap();
        let q = Quota::per_second(1).burst(5);
        let d = Decision::rejected(5, 0, Duration::from_secs(5), Duration::from_millis(400))
            .with_policy(Name::new("burst"));
        let decisions = Decisions::new();
        let rejected = Rejected::new(
            RequestView::new(&req),
            RejectReason::RateLimited {
                decision: &d,
                quota: &q,
            },
            &decisions,
        );
        let response = DefaultRejection::new().reject(&rejected);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        let v = json(response);
        assert_eq!(v["type"], "urn:tollgate:problem:rate-limited");
        assert_eq!(v["title"], "Too Many Requests");
        assert_eq!(v["status"], 429);
        assert_eq!(v["policy"], "burst");
        assert_eq!(v["quota"], "1/s burst 5");
        assert_eq!(v["limit"], 5);
        assert_eq!(v["window"], 5);
        assert_eq!(v["retry_after"], 1);
        assert!(v["detail"].as_str().unwrap().contains("\"burst\""));
    }

    #[test]
    fn each_refusal_names_its_own_quota_whichever_came_before() {
        let req = http::Request::get("/").body(()).unwrap();
        let decisions = Decisions::new();
        let quotas = [
            (Quota::per_second(1).burst(5), "1/s burst 5"),
            (Quota::per_minute(100), "100/min"),
        ];
        for (quota, text) in quotas.iter().chain(&quotas).chain(quotas.iter().rev()) {
            let d = Decision::rejected(5, 0, Duration::from_secs(5), Duration::from_secs(1))
                .with_policy(Name::new("burst"));
            let reason = RejectReason::RateLimited {
                decision: &d,
                quota,
            };
            let rejected = Rejected::new(RequestView::new(&req), reason, &decisions);
            let v = json(DefaultRejection::new().reject(&rejected));
            assert_eq!(v["quota"], *text);
            assert!(
                v["detail"].as_str().unwrap().contains(&format!("({text})")),
                "{v}"
            );
        }
    }

    #[test]
    fn rate_limited_problem_says_when_it_resets_and_names_the_plan() {
        use std::time::UNIX_EPOCH;
        let req = http::Request::get("/api/items").body(()).unwrap();
        let q = Quota::per_minute(5);
        let free = Name::new("free");
        // 47.2 s until fully restored, at 2024-02-29T23:59:30.5Z: resets at 2024-03-01T00:00:18Z.
        let d = Decision::rejected(5, 0, Duration::from_millis(47_200), Duration::from_secs(11))
            .with_policy(Name::new("api"));
        let decisions = Decisions::new();
        let reason = RejectReason::RateLimited {
            decision: &d,
            quota: &q,
        };
        let now = UNIX_EPOCH + Duration::from_millis(1_709_251_170_500);
        let rejected = Rejected::new(RequestView::new(&req), reason, &decisions).at(now);
        assert_eq!(rejected.plan(), None);
        let v = json(DefaultRejection::new().reject(&rejected));
        assert_eq!(v["reset"], "2024-03-01T00:00:18Z");
        assert_eq!(v["reset_seconds"], 48);
        assert!(v.get("plan").is_none() && v.get("link").is_none(), "{v}");

        let with_plan = rejected.with_plan(free, Some("https://example.com/upgrade?from=\"free\""));
        assert_eq!(with_plan.plan(), Some(free));
        let v = json(DefaultRejection::new().reject(&with_plan));
        assert_eq!(v["plan"], "free");
        assert_eq!(v["link"], "https://example.com/upgrade?from=\"free\"");
        assert_eq!(v["policy"], "api");
        assert_eq!(v["retry_after"], 11);

        // A plan without a link; the plan known from the decision alone.
        let d = d.with_plan(Name::new("pro"));
        let reason = RejectReason::RateLimited {
            decision: &d,
            quota: &q,
        };
        let rejected = Rejected::new(RequestView::new(&req), reason, &decisions).at(now);
        let v = json(DefaultRejection::new().reject(&rejected));
        assert_eq!(v["plan"], "pro");
        assert!(v.get("link").is_none());

        // Other reasons carry neither reset nor plan.
        let err = StoreError::new(StoreErrorKind::Timeout, "t");
        let reason = RejectReason::StoreUnavailable { error: &err };
        let rejected = Rejected::new(RequestView::new(&req), reason, &decisions)
            .with_plan(free, Some("https://example.com/upgrade"));
        assert_eq!(rejected.reset_at(), None);
        let v = json(DefaultRejection::new().reject(&rejected));
        assert!(v.get("reset").is_none() && v.get("plan").is_none(), "{v}");
    }

    #[test]
    fn reset_uses_the_wall_clock_by_default() {
        use std::time::{SystemTime, UNIX_EPOCH};
        let req = http::Request::get("/").body(()).unwrap();
        let q = Quota::per_hour(1);
        let d = Decision::rejected(1, 0, Duration::from_secs(3600), Duration::from_secs(3600));
        let decisions = Decisions::new();
        let reason = RejectReason::RateLimited {
            decision: &d,
            quota: &q,
        };
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let before = secs(SystemTime::now());
        let reset = Rejected::new(RequestView::new(&req), reason, &decisions)
            .reset_at()
            .unwrap();
        let after = secs(SystemTime::now());
        assert!((before + 3600..=after + 3601).contains(&secs(reset)));
    }

    #[test]
    fn store_error_is_503_with_its_retry_after_and_no_internals() {
        let req = http::Request::get("/").body(()).unwrap();
        let err = StoreError::new(StoreErrorKind::Timeout, "redis 10.0.0.5 timed out")
            .with_retry_after(Duration::from_millis(1500));
        let decisions = Decisions::new();
        let rejected = Rejected::new(
            RequestView::new(&req),
            RejectReason::StoreUnavailable { error: &err },
            &decisions,
        );
        let response = DefaultRejection::new()
            .problem_type_base("https://e.example/p/")
            .reject(&rejected);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[RETRY_AFTER], "2");
        let body = String::from_utf8(response.body().as_bytes().to_vec()).unwrap();
        assert!(!body.contains("10.0.0.5"), "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["type"], "https://e.example/p/limiter-unavailable");
        assert_eq!(v["retry_after"], 2);
    }

    #[test]
    fn missing_key_hides_reason_only_for_server_errors() {
        let req = http::Request::get("/").body(()).unwrap();
        let err = KeyError::new("missing x-api-key header");
        let decisions = Decisions::new();
        let policy = Name::new("per-key");
        for (status, shows) in [
            (StatusCode::UNAUTHORIZED, true),
            (StatusCode::INTERNAL_SERVER_ERROR, false),
        ] {
            let rejected = Rejected::new(
                RequestView::new(&req),
                RejectReason::MissingKey {
                    policy,
                    error: &err,
                    status,
                },
                &decisions,
            );
            let response = DefaultRejection::new().reject(&rejected);
            assert_eq!(response.status(), status);
            assert!(!response.headers().contains_key(RETRY_AFTER));
            let v = json(response);
            assert_eq!(v["policy"], "per-key");
            assert_eq!(
                v["detail"].as_str().unwrap().contains("x-api-key"),
                shows,
                "{status}"
            );
        }
    }

    #[test]
    fn a_misconfiguration_names_the_limit_and_the_fix() {
        let fix = "no peer address in the request: serve the axum app with \
                   `into_make_service_with_connect_info::<SocketAddr>()`";
        let err = KeyError::misconfigured(fix);
        let decisions = Decisions::new();
        let reason = RejectReason::MissingKey {
            policy: Name::new("per-ip"),
            error: &err,
            status: StatusCode::INTERNAL_SERVER_ERROR,
        };
        let req = http::Request::get("/").body(()).unwrap();
        let response = DefaultRejection::new().reject(&Rejected::new(
            RequestView::new(&req),
            reason,
            &decisions,
        ));
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let v = json(response);
        assert_eq!(
            v["detail"],
            format!(
                "Rate limit \"per-ip\" cannot identify the client because the server is \
                 misconfigured: {fix}."
            )
        );

        let grpc = http::Request::post("/p.S/M")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let response = DefaultRejection::new().reject(&Rejected::new(
            RequestView::new(&grpc),
            reason,
            &decisions,
        ));
        let message = response.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(message.contains("per-ip"), "{message}");
        assert!(
            message.contains("into_make_service_with_connect_info"),
            "{message}"
        );
    }

    #[test]
    fn grpc_requests_get_trailers_only() {
        let req = http::Request::post("/pkg.Svc/M")
            .header(CONTENT_TYPE, "application/grpc")
            .body(())
            .unwrap();
        let q = Quota::per_second(10);
        let d = Decision::rejected(10, 0, Duration::from_secs(1), Duration::from_millis(100))
            .with_policy(Name::new("rpc"));
        let decisions = Decisions::new();
        let rejected = Rejected::new(
            RequestView::new(&req),
            RejectReason::RateLimited {
                decision: &d,
                quota: &q,
            },
            &decisions,
        );
        let response = DefaultRejection::new().reject(&rejected);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(response.headers()["grpc-status"], "8");
        assert_eq!(response.headers()[GRPC_RETRY_PUSHBACK_MS], "100");
        assert!(response.body().as_bytes().is_empty());
        // Detection can be turned off.
        let response = DefaultRejection::new().grpc(false).reject(&rejected);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    }

    #[cfg(feature = "tonic")]
    fn grpc_status(response: &Response<RejectionBody>) -> tonic::Status {
        tonic::Status::from_header_map(response.headers()).unwrap()
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn grpc_rejections_carry_googles_error_model() {
        use tonic_types::StatusExt;

        let req = http::Request::post("/pkg.Svc/M")
            .header(CONTENT_TYPE, "application/grpc")
            .body(())
            .unwrap();
        let decisions = Decisions::new();
        let view = RequestView::new(&req);
        let q = Quota::per_second(1).burst(5);

        // Rate limited: RESOURCE_EXHAUSTED, RetryInfo rounded up to 1 s, QuotaFailure.
        let d = Decision::rejected(5, 0, Duration::from_secs(5), Duration::from_millis(100))
            .with_policy(Name::new("per-ip"));
        let reason = RejectReason::RateLimited {
            decision: &d,
            quota: &q,
        };
        let response = DefaultRejection::new().reject(&Rejected::new(view, reason, &decisions));
        assert_eq!(response.headers()[GRPC_RETRY_PUSHBACK_MS], "100");
        let status = grpc_status(&response);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        let details = status.get_error_details();
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_secs(1))
        );
        let violations = &details.quota_failure().unwrap().violations;
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].subject, "per-ip");
        assert_eq!(violations[0].description, "1 per second, bursts of up to 5");

        // A store failing closed: UNAVAILABLE with RetryInfo, no QuotaFailure.
        let err = StoreError::new(StoreErrorKind::Timeout, "redis timed out")
            .with_retry_after(Duration::from_millis(1500));
        let reason = RejectReason::StoreUnavailable { error: &err };
        let response = DefaultRejection::new().reject(&Rejected::new(view, reason, &decisions));
        let status = grpc_status(&response);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        let details = status.get_error_details();
        assert_eq!(
            details.retry_info().unwrap().retry_delay,
            Some(Duration::from_secs(2))
        );
        assert!(details.quota_failure().is_none());

        // A cost that never fits: QuotaFailure, but no RetryInfo (waiting never helps).
        let impossible =
            Decision::impossible(5, 5, Duration::ZERO).with_policy(Name::new("per-ip"));
        let reason = RejectReason::CostExceedsCapacity {
            decision: &impossible,
            quota: &q,
            cost: 9,
        };
        let response = DefaultRejection::new().reject(&Rejected::new(view, reason, &decisions));
        let details = grpc_status(&response).get_error_details();
        assert!(details.retry_info().is_none());
        assert_eq!(
            details.quota_failure().unwrap().violations[0].subject,
            "per-ip"
        );

        // A missing key has nothing to add.
        let key_err = KeyError::new("missing x-api-key header");
        let reason = RejectReason::MissingKey {
            policy: Name::new("per-key"),
            error: &key_err,
            status: StatusCode::BAD_REQUEST,
        };
        let response = DefaultRejection::new().reject(&Rejected::new(view, reason, &decisions));
        assert!(!response
            .headers()
            .contains_key(super::super::GRPC_STATUS_DETAILS_BIN));
        assert_eq!(grpc_status(&response).code(), tonic::Code::InvalidArgument);
    }
}
