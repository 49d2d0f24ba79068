//! What a decision means for the request: the rate-limit headers of an allowed request, and
//! the responses the layer makes itself (429, the cost beyond a plan, unknown keys, an
//! unavailable store), RFC 9457 problem bodies that say what happened and nothing of the
//! store's internals.

use bytes::Bytes;
use http::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};

use crate::headers::{self, RATELIMIT, RATELIMIT_POLICY, X_RATE_LIMIT_REMAINING};
use crate::layer::Shared;
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

/// The headers of a metered request (allowed, or refused with a 429), and the shadow
/// refusal it carries, if any.
#[derive(Debug)]
pub(crate) struct RateHeaders {
    policy: HeaderValue,
    ratelimit: Option<HeaderValue>,
    remaining: Option<u64>,
    shadow: Option<Box<ShadowRefusal>>,
}

impl RateHeaders {
    #[inline]
    pub(crate) fn apply<B>(self, resp: &mut Response<B>) {
        let h = resp.headers_mut();
        h.insert(RATELIMIT_POLICY, self.policy);
        if let Some(rl) = self.ratelimit {
            h.insert(RATELIMIT, rl);
        }
        if let Some(remaining) = self.remaining {
            h.insert(X_RATE_LIMIT_REMAINING, HeaderValue::from(remaining));
        }
        if let Some(shadow) = self.shadow {
            resp.extensions_mut().insert(*shadow);
        }
    }
}

/// The response extension of a request a limit in shadow mode would have refused, and
/// served: what the refusal would have said. Limits in shadow mode are plans made with
/// [`Plan::shadow`], limits made with [`Limit::shadow`](crate::Limit::shadow), or every
/// limit of a layer built with
/// [`shadow(true)`](crate::RateLimitLayerBuilder::shadow).
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_tower::{Plan, RateLimitLayer, ShadowRefusal};
/// use std::time::Duration;
/// use tower::{Layer, ServiceExt};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let one = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(60))?).build()?;
/// let svc = RateLimitLayer::builder().plans(Plan::new("trial", one).shadow()).build()?
///     .layer(tower::service_fn(|_: http::Request<()>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(bytes::Bytes::new()))
///     }));
/// let req = || http::Request::get("/").header("x-api-key", "k").body(()).unwrap();
/// assert!(svc.clone().oneshot(req()).await?.extensions().get::<ShadowRefusal>().is_none());
/// let served = svc.clone().oneshot(req()).await?;
/// assert_eq!(served.status(), 200);
/// let would = served.extensions().get::<ShadowRefusal>().expect("would have been refused");
/// assert_eq!((would.limit(), would.retry_after_secs()), ("trial", 60));
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShadowRefusal {
    limit: String,
    retry_after_secs: u64,
}

impl ShadowRefusal {
    /// The plan (or further limit) that would have refused.
    ///
    /// ```
    /// # fn f(s: &bucket4rs_tower::ShadowRefusal) -> &str { s.limit() }
    /// ```
    pub fn limit(&self) -> &str {
        &self.limit
    }

    /// The `Retry-After` the refusal would have had (the longest wait of the limits that
    /// would have refused).
    ///
    /// ```
    /// # fn f(s: &bucket4rs_tower::ShadowRefusal) -> u64 { s.retry_after_secs() }
    /// ```
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_secs
    }
}

/// What a refused request's answer is made from, handed to the refusal hook
/// ([`RateLimitLayerBuilder::on_refusal`](crate::RateLimitLayerBuilder::on_refusal)).
///
/// ```
/// # fn f(r: &bucket4rs_tower::Refusal) { let _ = (r.limit(), r.cost(), r.retry_after_secs(), r.is_grpc()); }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    limit: String,
    cost: u64,
    remaining: u64,
    retry_after_secs: u64,
    grpc: bool,
}

impl Refusal {
    /// The plan (or further limit) that refused; with several, the one of the longest wait.
    ///
    /// ```
    /// # fn f(r: &bucket4rs_tower::Refusal) -> &str { r.limit() }
    /// ```
    pub fn limit(&self) -> &str {
        &self.limit
    }

    /// What the request cost.
    ///
    /// ```
    /// # fn f(r: &bucket4rs_tower::Refusal) -> u64 { r.cost() }
    /// ```
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The tokens left in the refusing limit.
    ///
    /// ```
    /// # fn f(r: &bucket4rs_tower::Refusal) -> u64 { r.remaining() }
    /// ```
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The wait, in whole seconds rounded up (at least 1): the `Retry-After` value.
    ///
    /// ```
    /// # fn f(r: &bucket4rs_tower::Refusal) -> u64 { r.retry_after_secs() }
    /// ```
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_secs
    }

    /// Whether the request is a gRPC call (`content-type: application/grpc…`), answered with
    /// `grpc-status: 8` (`RESOURCE_EXHAUSTED`) rather than 429.
    ///
    /// ```
    /// # fn f(r: &bucket4rs_tower::Refusal) -> bool { r.is_grpc() }
    /// ```
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }
}

/// One limit asked about a request: its plan and the store's answer.
pub(crate) struct Asked<'a> {
    pub(crate) plan: &'a Plan,
    pub(crate) answer: &'a Answer,
}

/// Whether `answer` (of `plan`) refuses the request: refused, and not in shadow mode.
#[inline]
pub(crate) fn blocks(shared: &Shared, plan: &Plan, answer: &Answer) -> bool {
    !answer.value().is_consumed() && !plan.is_shadow() && !shared.shadow
}

/// The verdict on a request that cost `cost`, its key's plan `plan`, whose store answered
/// `answer`: allowed with its headers, or refused (429, with `Retry-After` rounded up to whole
/// seconds). With one limit (the common case) the path every answer takes, in process, remote
/// or fallback; [`verdict_many`] for several.
#[inline]
pub(crate) fn verdict<ResBody: From<Bytes>>(
    shared: &Shared,
    plan: &Plan,
    answer: &Answer,
    cost: u64,
    grpc: impl FnOnce() -> bool,
) -> Verdict<Response<ResBody>> {
    if !same(answer.configuration(), plan.configuration()) {
        return stale_verdict(shared, plan, answer, cost, grpc());
    }
    let probe = answer.value();
    let headers = RateHeaders {
        policy: plan.policy_header().clone(),
        ratelimit: headers::ratelimit_header(plan, answer.state(), answer.now_nanos(), cost),
        remaining: shared.remaining_header.then_some(probe.remaining_tokens()),
        shadow: None,
    };
    if probe.is_consumed() {
        plan.counters(crate::metrics::CLIENT).allowed.increment(1);
        Verdict::Allow(Some(headers))
    } else {
        verdict_many(shared, &[Asked { plan, answer }], cost, grpc())
    }
}

/// [`verdict`] of a bucket that answered under another configuration than its plan's (the
/// key changed plan, or the plans did; the bucket is being switched): decided, and
/// described, under the configuration it has.
#[cold]
#[inline(never)]
fn stale_verdict<ResBody: From<Bytes>>(
    shared: &Shared,
    plan: &Plan,
    answer: &Answer,
    cost: u64,
    grpc: bool,
) -> Verdict<Response<ResBody>> {
    let decided_under = under(plan, answer);
    if cost > decided_under.min_capacity() {
        return Verdict::Answer(cost_exceeds_capacity(&decided_under, cost));
    }
    verdict(shared, &decided_under, answer, cost, || grpc)
}

/// The plan `answer` was decided under: `plan`, or its name over the configuration the
/// bucket had.
fn under(plan: &Plan, answer: &Answer) -> Plan {
    if same(answer.configuration(), plan.configuration()) {
        plan.clone()
    } else {
        let p = Plan::new(plan.name(), answer.configuration().clone());
        if plan.is_shadow() { p.shadow() } else { p }
    }
}

/// The verdict on a request several limits answered (the client's plan first): refused
/// when one that is not in shadow mode refused (`Retry-After` the longest wait of those),
/// allowed otherwise; the `RateLimit` fields list every policy of every limit asked. Out of
/// line: one allowed limit does not come here.
#[inline(never)]
pub(crate) fn verdict_many<ResBody: From<Bytes>>(
    shared: &Shared,
    asked: &[Asked<'_>],
    cost: u64,
    grpc: bool,
) -> Verdict<Response<ResBody>> {
    // Room for a few policies each, so the values are not grown step by step.
    let mut policy = Vec::with_capacity(64 * asked.len());
    let mut ratelimit = Vec::with_capacity(64 * asked.len());
    let mut refused: Option<(String, u64, u64)> = None;
    let mut shadowed: Option<(String, u64)> = None;
    for (i, a) in asked.iter().enumerate() {
        let plan = under(a.plan, a.answer);
        let counters = plan.counters(if i == 0 {
            crate::metrics::CLIENT
        } else {
            plan.name()
        });
        let probe = a.answer.value();
        if i > 0 {
            policy.extend_from_slice(b", ");
            ratelimit.extend_from_slice(b", ");
        }
        policy.extend_from_slice(plan.policy_header().as_bytes());
        if let Some(v) =
            headers::ratelimit_header(&plan, a.answer.state(), a.answer.now_nanos(), cost)
        {
            ratelimit.extend_from_slice(v.as_bytes());
        }
        if probe.is_consumed() {
            counters.allowed.increment(1);
            continue;
        }
        let wait = probe.retry_after_secs().unwrap_or(1);
        if blocks(shared, &plan, a.answer) {
            counters.refused.increment(1);
            if refused.as_ref().is_none_or(|r| wait > r.1) {
                refused = Some((plan.name().to_owned(), wait, probe.remaining_tokens()));
            }
        } else {
            counters.shadow_refused.increment(1);
            if shadowed.as_ref().is_none_or(|r| wait > r.1) {
                shadowed = Some((plan.name().to_owned(), wait));
            }
        }
    }
    let remaining = asked
        .iter()
        .map(|a| a.answer.value().remaining_tokens())
        .min()
        .unwrap_or(0);
    let headers = RateHeaders {
        policy: HeaderValue::from_bytes(&policy).unwrap_or_else(|_| HeaderValue::from_static("")),
        ratelimit: HeaderValue::from_bytes(&ratelimit).ok(),
        remaining: shared.remaining_header.then_some(remaining),
        shadow: None,
    };
    match refused {
        Some((limit, retry_after_secs, remaining)) => {
            let refusal = Refusal {
                limit,
                cost,
                remaining,
                retry_after_secs,
                grpc,
            };
            Verdict::Answer(refuse(shared, &refusal, headers))
        }
        None => Verdict::Allow(Some(RateHeaders {
            shadow: shadowed.map(|(limit, retry_after_secs)| {
                Box::new(ShadowRefusal {
                    limit,
                    retry_after_secs,
                })
            }),
            ..headers
        })),
    }
}

/// The answer to a refused request: 429 with `Retry-After` and a problem body, or for a
/// gRPC call `grpc-status: 8` with the wait in `retry-after`; then the refusal hook, if any.
#[inline(never)]
fn refuse<ResBody: From<Bytes>>(
    shared: &Shared,
    r: &Refusal,
    headers: RateHeaders,
) -> Response<ResBody> {
    let mut resp: Response<Bytes> = if r.grpc {
        grpc_refusal(r)
    } else {
        problem::too_many_requests(
            r.retry_after_secs,
            Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("rate limit of plan {:?} exceeded", r.limit),
            )
            .with("plan", r.limit.as_str())
            .with("cost", r.cost)
            .with("remaining", r.remaining),
        )
    };
    headers.apply(&mut resp);
    if let Some(hook) = &shared.on_refusal {
        hook(r, &mut resp);
    }
    resp.map(ResBody::from)
}

/// A gRPC refusal: a trailers-only response (HTTP 200, no message) whose `grpc-status` is 8
/// (`RESOURCE_EXHAUSTED`), with the wait in `retry-after` (a header a tonic client reads from
/// the status's metadata).
fn grpc_refusal(r: &Refusal) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::new());
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from_static("8"));
    h.insert(
        "grpc-message",
        HeaderValue::from_static("rate%20limit%20exceeded"),
    );
    h.insert(RETRY_AFTER, HeaderValue::from(r.retry_after_secs));
    resp
}

/// Whether a request is a gRPC call.
#[inline]
pub(crate) fn is_grpc(h: &http::HeaderMap) -> bool {
    h.get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
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
