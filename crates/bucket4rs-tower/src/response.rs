//! What a decision means for the request: the rate-limit headers of an allowed request, and
//! the responses the layer makes itself (429, the cost beyond a plan, unknown keys, an
//! unavailable store), RFC 9457 problem bodies that say what happened and nothing of the
//! store's internals.

use bytes::Bytes;
use http::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};

use crate::headers::{self, RATELIMIT, RATELIMIT_POLICY, X_RATE_LIMIT_REMAINING};
use crate::plan::Plan;
use crate::problem::{self, Problem};
use crate::store::{Answer, same};

/// What the layer does with a request once its store answered.
pub(crate) enum Verdict<R> {
    /// Call the inner service, then add these headers (none for an unmetered request).
    Allow(Option<RateHeaders>),
    /// The layer's own answer.
    Answer(R),
}

/// The headers of a metered request (allowed, or refused with a 429).
#[derive(Debug)]
pub(crate) struct RateHeaders {
    policy: HeaderValue,
    ratelimit: Option<HeaderValue>,
    remaining: Option<u64>,
}

impl RateHeaders {
    #[inline]
    pub(crate) fn apply(self, h: &mut http::HeaderMap) {
        h.insert(RATELIMIT_POLICY, self.policy);
        if let Some(rl) = self.ratelimit {
            h.insert(RATELIMIT, rl);
        }
        if let Some(remaining) = self.remaining {
            h.insert(X_RATE_LIMIT_REMAINING, HeaderValue::from(remaining));
        }
    }
}

/// The verdict on a request that cost `cost`, its key's plan `plan`, whose store answered
/// `answer`: allowed with its headers, or refused (429, with `Retry-After` rounded up to whole
/// seconds). The one function every answer goes through, in process, remote or fallback.
#[inline]
pub(crate) fn verdict<ResBody: From<Bytes>>(
    plan: &Plan,
    answer: &Answer,
    cost: u64,
    remaining_header: bool,
) -> Verdict<Response<ResBody>> {
    if !same(answer.configuration(), plan.configuration()) {
        return stale_verdict(plan, answer, cost, remaining_header);
    }
    let probe = answer.value();
    let headers = RateHeaders {
        policy: plan.policy_header().clone(),
        ratelimit: headers::ratelimit_header(plan, answer.state(), answer.now_nanos(), cost),
        remaining: remaining_header.then_some(probe.remaining_tokens()),
    };
    if probe.is_consumed() {
        Verdict::Allow(Some(headers))
    } else {
        Verdict::Answer(refusal(plan, answer, headers, cost))
    }
}

/// [`verdict`] of a bucket that answered under another configuration than its plan's (the
/// key changed plan, or the plans did; the bucket is being switched): decided, and
/// described, under the configuration it has.
#[cold]
#[inline(never)]
fn stale_verdict<ResBody: From<Bytes>>(
    plan: &Plan,
    answer: &Answer,
    cost: u64,
    remaining_header: bool,
) -> Verdict<Response<ResBody>> {
    let decided_under = Plan::new(plan.name(), answer.configuration().clone());
    if cost > decided_under.min_capacity() {
        return Verdict::Answer(cost_exceeds_capacity(&decided_under, cost));
    }
    verdict(&decided_under, answer, cost, remaining_header)
}

/// The 429 of a refused request. Out of line, like every answer of the layer: the allowed
/// path, which runs on every request, stays compact.
#[inline(never)]
fn refusal<ResBody: From<Bytes>>(
    plan: &Plan,
    answer: &Answer,
    headers: RateHeaders,
    cost: u64,
) -> Response<ResBody> {
    let probe = answer.value();
    // Refused, so there is a wait (the cost is within the plan's capacity: checked before).
    let retry = probe.retry_after_secs().unwrap_or(1);
    let mut resp = problem::too_many_requests(
        retry,
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("rate limit of plan {:?} exceeded", plan.name()),
        )
        .with("plan", plan.name())
        .with("cost", cost)
        .with("remaining", probe.remaining_tokens()),
    );
    headers.apply(resp.headers_mut());
    resp
}

/// The answer to a request whose cost no bucket of its plan can ever hold: a configuration
/// error of the service (500), not a 429 with an absurd `Retry-After`.
#[cold]
#[inline(never)]
pub(crate) fn cost_exceeds_capacity<ResBody: From<Bytes>>(
    plan: &Plan,
    cost: u64,
) -> Response<ResBody> {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!(
            "cost exceeds capacity: this request costs {cost} tokens but plan {:?} holds at most {}",
            plan.name(),
            plan.min_capacity()
        ),
    )
    .with("plan", plan.name())
    .with("cost", cost)
    .with("capacity", plan.min_capacity())
    .into_response()
}

/// Why a request got a 503: what the body says, in the client's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// The store failed or did not answer in time.
    Store,
    /// The in-process store is full of clients it cannot forget.
    Full,
}

impl Unavailable {
    fn detail(self) -> &'static str {
        match self {
            Self::Store => "the rate-limit store is unavailable; try again shortly",
            Self::Full => {
                "the rate-limit store cannot take new clients right now; try again shortly"
            }
        }
    }
}

/// The answer when the store cannot decide and the failure policy says so (503). The body
/// says what happened; the store's own error goes to the logs, not to the client.
#[cold]
#[inline(never)]
pub(crate) fn unavailable<ResBody: From<Bytes>>(why: Unavailable) -> Response<ResBody> {
    let mut r =
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, why.detail()).into_response::<ResBody>();
    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u32));
    r
}

/// The answer when the store cannot decide and the failure policy denies (429).
#[cold]
#[inline(never)]
pub(crate) fn denied_on_failure<ResBody: From<Bytes>>() -> Response<ResBody> {
    problem::too_many_requests(
        1,
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "the rate limiter cannot decide right now; denied by the failure policy",
        ),
    )
}

/// What a 500 of a failed store says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failed {
    /// The stored record is not one this server can read (corrupt, another format, edited).
    Unreadable,
    /// Anything else the store reported.
    Other,
}

/// The answer when the store failed in a way no retry mends (500): a corrupt stored record,
/// for instance. Details go to the logs.
#[cold]
#[inline(never)]
pub(crate) fn internal_error<ResBody: From<Bytes>>(what: Failed) -> Response<ResBody> {
    let detail = match what {
        Failed::Unreadable => {
            "the rate-limit store answered with a record it cannot read; the request was not served"
        }
        Failed::Other => "the rate limiter failed; the request was not served",
    };
    Problem::new(StatusCode::INTERNAL_SERVER_ERROR, detail).into_response()
}

/// The answer to a request without a usable client key, or with a key no plan knows.
#[cold]
#[inline(never)]
pub(crate) fn key_problem<ResBody: From<Bytes>>(
    status: StatusCode,
    detail: &str,
) -> Response<ResBody> {
    let mut r = Problem::new(status, detail).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("ApiKey"));
    }
    r
}
