//! [`Outcome`]: what a decided request's response carries (rate-limit headers, the reported
//! decision in its extensions), merged with what a nested rate-limit layer wrote.

use http::{Extensions, HeaderValue, Request, Response};

use super::applied::Applied;
use super::body::ResponseBody;
use super::shaping::ShapedDelay;
use super::shared::Shared;
use super::snapshot::Snapshot;
use crate::decision::Decision;
use crate::headers::{
    policy_field, ratelimit_field, RateLimitHeaders, RATELIMIT, RATELIMIT_POLICY,
};
use crate::store::{Decisions, MAX_LIMITS};

/// What to write on a response: the reported decision and, when enabled, the IETF fields
/// (rendered when the decision is made, so the future holds no reference to the layer).
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(super) headers: RateLimitHeaders,
    pub(super) reported: Decision,
    /// Boxed: rare (opt-in), and allocating anyway; the future stays small without it.
    pub(super) ietf: Option<Box<(HeaderValue, HeaderValue)>>,
    /// How long the request waited for its turn (shaping).
    pub(super) shaped: Option<ShapedDelay>,
    /// Whether the response gets the reported decision in its extensions: opted in, a refusal,
    /// or a layer nested in another (which merges the decisions).
    pub(super) extension: bool,
}

impl Outcome {
    pub(super) fn new<St>(
        shared: &Shared<St>,
        snapshot: &Snapshot<St>,
        applied: &Applied,
        decisions: &Decisions,
        reported: Decision,
    ) -> Self {
        // A decision the store did not count (failure policy `Open`) has no budget to show.
        let counted = decisions.as_slice().iter().any(Decision::is_counted);
        let ietf = if shared.headers.writes_ietf() && counted {
            let policy =
                if usize::from(applied.len) == snapshot.limits.len() && applied.at_own_quotas() {
                    snapshot.policy_header.clone()
                } else {
                    policy_field((0..usize::from(applied.len)).map(|i| {
                        (
                            snapshot.limits[usize::from(applied.limit[i])].name.as_str(),
                            applied.quota_of(snapshot, i),
                        )
                    }))
                };
            policy
                .zip(ratelimit_field(
                    decisions.as_slice().iter().filter(|d| d.is_counted()),
                ))
                .map(Box::new)
        } else {
            None
        };
        Self {
            headers: shared.headers,
            reported,
            ietf,
            shaped: None,
            extension: shared.response_extensions,
        }
    }

    /// The outcome of refusing `req`: its response carries the decision when this layer is
    /// nested in another one (which put its decision in the request's extensions), so that the
    /// outer layer leaves this refusal's headers alone.
    pub(super) fn refusal<B>(mut self, req: &Request<B>) -> Self {
        self.extension |= req.extensions().get::<Decision>().is_some();
        self
    }

    /// Adds shadow decisions that show in headers: the tighter one wins `X-RateLimit-*`.
    pub(super) fn fold_in(&mut self, shown: &Decisions) {
        for d in shown.as_slice() {
            if d.is_tighter_than(&self.reported) {
                self.reported = *d;
            }
        }
        if let Some(pair) = &mut self.ietf {
            let (_, ratelimit) = &mut **pair;
            if let Some(more) = ratelimit_field(shown.as_slice().iter()) {
                let mut joined = ratelimit.as_bytes().to_vec();
                joined.extend_from_slice(b", ");
                joined.extend_from_slice(more.as_bytes());
                if let Ok(v) = HeaderValue::from_bytes(&joined) {
                    *ratelimit = v;
                }
            }
        }
    }

    /// Writes rate-limit headers and, when it should, the reported decision on `response`,
    /// merging with what a nested rate-limit layer already wrote (it puts its decision in the
    /// response's extensions when it sees ours in the request's): the more pressing decision
    /// wins `X-RateLimit-*` and the extension, and the IETF lists are appended to.
    pub(crate) fn apply<B>(self, response: &mut Response<B>) {
        if let Some(shaped) = self.shaped {
            response.extensions_mut().insert(shaped);
        }
        let ours_wins = match response.extensions_mut().get_mut::<Decision>() {
            Some(theirs) => {
                let wins = more_pressing(&self.reported, theirs);
                if wins {
                    *theirs = self.reported;
                }
                wins
            }
            None => {
                if self.extension {
                    response.extensions_mut().insert(self.reported);
                }
                true
            }
        };
        // An uncounted decision (failure policy `Open`) writes nothing.
        if ours_wins {
            self.headers
                .write_x_ratelimit(&self.reported, response.headers_mut());
        }
        if let Some(pair) = self.ietf {
            let (policy, ratelimit) = *pair;
            let headers = response.headers_mut();
            headers.append(RATELIMIT_POLICY, policy);
            headers.append(RATELIMIT, ratelimit);
        }
    }
}

/// Whether decision `a` should be reported over `b`: a rejection over an allowance, else the
/// one closer to exhaustion.
fn more_pressing(a: &Decision, b: &Decision) -> bool {
    match (a.allowed(), b.allowed()) {
        (false, true) => true,
        (true, false) => false,
        _ => a.is_tighter_than(b),
    }
}

/// Puts the reported decision in `ext`, keeping a more pressing decision a nested layer put
/// there, and all decisions when there may be more than one: when this layer holds several
/// limits (`several`), or a nested layer already decided. A single-limit layer alone inserts
/// only its `Decision`, which is then the one and only decision (this saves boxing the whole
/// `Decisions` on the common path). Returns whether another layer had decided (this one is
/// nested in it).
pub(super) fn merge_extensions(
    ext: &mut Extensions,
    decisions: &Decisions,
    reported: &Decision,
    several: bool,
) -> bool {
    // One lookup on the common path (no outer layer): insert, and put an outer layer's
    // decision back if it is the more pressing one.
    let theirs = ext.insert(*reported);
    if let Some(theirs) = theirs
        && !more_pressing(reported, &theirs)
    {
        ext.insert(theirs);
    }
    match ext.get_mut::<Decisions>() {
        Some(existing) => {
            for d in decisions.as_slice() {
                if existing.len() < MAX_LIMITS {
                    existing.push(*d);
                }
            }
        }
        None => {
            let Some(theirs) = theirs else {
                if several {
                    ext.insert(decisions.clone());
                }
                return false;
            };
            // A `Decision` without `Decisions`: a single-limit layer decided before us.
            let mut all = Decisions::new();
            all.push(theirs);
            for d in decisions.as_slice() {
                if all.len() < MAX_LIMITS {
                    all.push(*d);
                }
            }
            ext.insert(all);
        }
    }
    theirs.is_some()
}

/// Writes the headers of `outcome` (if any) on the inner service's response.
pub(super) fn respond<B>(
    outcome: &mut Option<Outcome>,
    mut response: Response<B>,
) -> Response<ResponseBody<B>> {
    if let Some(outcome) = outcome.take() {
        outcome.apply(&mut response);
    }
    response.map(ResponseBody::inner)
}
