//! The tower layer and service.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, ready};
use std::sync::Arc;

use async_trait::async_trait;
use bucket4rs_core::TokensInheritanceStrategy;
use bucket4rs_core::ops::Refilled;
use bucket4rs_core::{BucketConfiguration, BucketState, ConsumptionProbe};
use bucket4rs_distributed::{
    Backend, BackendError, BackendErrorKind, DistributedError, EmbeddedBackend, FailurePolicy,
    LiveTake, ProxyManager, RemoteBucket, StorageKey, Transaction, Verbose, VerboseRef,
};
use bucket4rs_local::FastClock;
use bytes::Bytes;
use http::header::{RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::headers::{self, RATELIMIT, RATELIMIT_POLICY, X_RATE_LIMIT_REMAINING};
use crate::key::{KeyExtractor, RequestInfo};
use crate::plan::{Plan, PlanResolver};
use crate::problem::{self, Problem};

/// The embedded backend's key cap when the layer builds its own (see
/// [`RateLimitLayerBuilder::max_keys`]).
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A wait this long means "never" in the core (`i64::MAX` nanoseconds).
const NEVER: u64 = i64::MAX as u64;

type CostFn = dyn for<'a> Fn(&RequestInfo<'a>) -> u64 + Send + Sync;

struct Shared<B> {
    manager: ProxyManager<B>,
    key: KeyExtractor,
    plans: Option<Arc<dyn PlanResolver>>,
    /// The resolver's plans when they are fixed and the store runs consumptions in place:
    /// a known client's plan is then read off its bucket ([`FixedPlans`]).
    fixed: Option<FixedPlans>,
    cost: Arc<CostFn>,
    failure: FailurePolicy,
    /// A manager whose backend always fails: lets the [`FailurePolicy`] decide without a
    /// second round trip to the real backend.
    unreachable: ProxyManager<Unreachable>,
    missing_key: StatusCode,
    unknown_key: StatusCode,
    remaining_header: bool,
}

/// The most plans [`FixedPlans`] takes: a known client's plan is found by comparing its
/// bucket's configuration with each plan's, which stays cheaper than a key lookup only for
/// a few plans.
const MAX_FIXED_PLANS: usize = 16;

/// The plans of a resolver whose answers never change ([`PlanResolver::fixed_plans`]),
/// each with a configuration of its own (by identity).
///
/// A key that has a live bucket got it from the layer under its plan, so the bucket holds
/// that plan's configuration (the same `Arc`, cloned when the bucket was created): the
/// layer consumes from the bucket first and reads the plan off the configuration it finds
/// there, and resolves the key only when it has no live bucket. One lookup of the key per
/// request instead of two (the plan table's and the store's): with many clients each
/// lookup reads its key's data out of the cache, and together with the embedded map's
/// inline keys and states this took ~4 points off the loss with 10,000 clients
/// (docs/http-overhead.md, "Both at once").
struct FixedPlans {
    plans: Box<[Plan]>,
}

impl FixedPlans {
    /// `None` when the resolver's answers may change, or it has no plans, more than
    /// [`MAX_FIXED_PLANS`], or two plans sharing one configuration (a bucket's
    /// configuration would not tell them apart).
    fn of(resolver: &dyn PlanResolver) -> Option<Self> {
        let plans = resolver.fixed_plans()?;
        if plans.is_empty() || plans.len() > MAX_FIXED_PLANS {
            return None;
        }
        for (i, a) in plans.iter().enumerate() {
            if plans[..i]
                .iter()
                .any(|b| identical(a.configuration(), b.configuration()))
            {
                return None;
            }
        }
        Some(Self {
            plans: plans.into_boxed_slice(),
        })
    }

    /// The plan whose configuration `config` is (by identity).
    #[inline]
    fn plan_of(&self, config: &BucketConfiguration) -> Option<&Plan> {
        self.plans
            .iter()
            .find(|p| identical(p.configuration(), config))
    }
}

/// Whether two configurations are one (the same bandwidths allocation).
#[inline]
fn identical(a: &BucketConfiguration, b: &BucketConfiguration) -> bool {
    core::ptr::eq(a.bandwidths(), b.bandwidths())
}

/// A backend that is always unavailable (see `Shared::unreachable`).
#[derive(Debug)]
struct Unreachable;

#[async_trait]
impl Backend for Unreachable {
    async fn transact(&self, _: &StorageKey, _: &mut dyn Transaction) -> Result<(), BackendError> {
        Err(unavailable())
    }
    async fn read(&self, _: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        Err(unavailable())
    }
    async fn remove(&self, _: &StorageKey) -> Result<bool, BackendError> {
        Err(unavailable())
    }
}

/// The layer's default bucket store: an [`EmbeddedBackend`] on [`FastClock`], the local
/// buckets' default clock (epoch nanoseconds advanced by the CPU's time-stamp counter). For a
/// store that lives in this process only, a clock that never goes back and costs a quarter
/// of a system-time reading is the better time source (docs/http-overhead.md, "The
/// `RateLimit` value cache and the store's clock").
///
/// ```
/// let backend = bucket4rs_tower::embedded_backend().with_max_keys(1_000);
/// let layer = bucket4rs_tower::RateLimitLayer::builder()
///     .backend(bucket4rs_distributed::ProxyManager::new(backend))
///     .build();
/// ```
pub fn embedded_backend() -> EmbeddedBackend {
    EmbeddedBackend::with_clock(FastClock)
}

fn unavailable() -> BackendError {
    BackendError::new(
        BackendErrorKind::Unavailable,
        "the rate-limit store is unavailable",
    )
}

/// Builds a [`RateLimitLayer`]; from [`RateLimitLayer::builder`].
///
/// Defaults: the `X-API-Key` header as the key, no plans (every key is unknown: set
/// [`plans`](Self::plans)), cost 1, [`FailurePolicy::error`] (503 when the backend is down),
/// 401 for missing and unknown keys, and an [`EmbeddedBackend`] capped at
/// [`DEFAULT_MAX_KEYS`] keys.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_distributed::{EmbeddedBackend, FailurePolicy, ProxyManager};
/// use bucket4rs_tower::{KeyExtractor, Plan, RateLimitLayer};
/// use std::time::Duration;
/// let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(20, Duration::from_secs(60))?).build()?;
/// let layer = RateLimitLayer::builder()
///     .backend(ProxyManager::configure(EmbeddedBackend::new()).key_prefix("api").build()?)
///     .key(KeyExtractor::header("x-api-key"))
///     .plans(Plan::new("free", config))
///     .cost(|req| if req.uri().path().ends_with("/search") { 5 } else { 1 })
///     .failure_policy(FailurePolicy::deny())
///     .unknown_key_status(http::StatusCode::FORBIDDEN)
///     .build();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct RateLimitLayerBuilder<B> {
    manager: ProxyManager<B>,
    key: KeyExtractor,
    plans: Option<Arc<dyn PlanResolver>>,
    cost: Arc<CostFn>,
    failure: FailurePolicy,
    missing_key: StatusCode,
    unknown_key: StatusCode,
    remaining_header: bool,
}

impl<B: fmt::Debug> fmt::Debug for RateLimitLayerBuilder<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("manager", &self.manager)
            .field("key", &self.key)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayerBuilder<EmbeddedBackend> {
    /// Uses a fresh [`EmbeddedBackend`] capped at `max_keys` keys (idle keys are dropped once
    /// their bucket would be full again; at the cap, new keys meet the failure policy).
    ///
    /// ```
    /// let layer = bucket4rs_tower::RateLimitLayer::builder().max_keys(10_000).build();
    /// ```
    pub fn max_keys(self, max_keys: usize) -> Self {
        self.backend(ProxyManager::new(
            embedded_backend().with_max_keys(max_keys),
        ))
    }
}

impl<B: Backend> RateLimitLayerBuilder<B> {
    /// Stores buckets with `manager` (embedded, Redis, PostgreSQL or your own backend).
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let b = bucket4rs_tower::RateLimitLayer::builder().backend(ProxyManager::new(EmbeddedBackend::new()));
    /// ```
    pub fn backend<B2: Backend>(self, manager: ProxyManager<B2>) -> RateLimitLayerBuilder<B2> {
        RateLimitLayerBuilder {
            manager,
            key: self.key,
            plans: self.plans,
            cost: self.cost,
            failure: self.failure,
            missing_key: self.missing_key,
            unknown_key: self.unknown_key,
            remaining_header: self.remaining_header,
        }
    }

    /// What requests are limited by.
    ///
    /// ```
    /// # use bucket4rs_tower::{KeyExtractor, RateLimitLayer};
    /// let b = RateLimitLayer::builder().key(KeyExtractor::client_ip());
    /// ```
    pub fn key(mut self, key: KeyExtractor) -> Self {
        self.key = key;
        self
    }

    /// Maps keys to plans ([`Plan`] for one plan for all, a `PlanTable`, or a closure).
    ///
    /// ```
    /// # use bucket4rs_tower::{Plan, RateLimitLayer};
    /// let b = RateLimitLayer::builder().plans(|_key: &str| -> Option<Plan> { None });
    /// ```
    pub fn plans(mut self, plans: impl PlanResolver) -> Self {
        self.plans = Some(Arc::new(plans));
        self
    }

    /// What a request costs, in tokens. A cost of 0 lets the request through unmetered
    /// (no bucket is touched and no rate-limit header is added).
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().cost(|req| if req.method() == http::Method::GET { 1 } else { 3 });
    /// ```
    pub fn cost(
        mut self,
        cost: impl for<'a> Fn(&RequestInfo<'a>) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.cost = Arc::new(cost);
        self
    }

    /// What to do when the backend is unavailable: [`FailurePolicy::error`] answers 503,
    /// [`FailurePolicy::deny`] 429, [`FailurePolicy::fallback`] decides with a local limit.
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().failure_policy(bucket4rs_distributed::FailurePolicy::deny());
    /// ```
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The status for a request without a usable key (default 401).
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().missing_key_status(http::StatusCode::BAD_REQUEST);
    /// ```
    pub fn missing_key_status(mut self, status: StatusCode) -> Self {
        self.missing_key = status;
        self
    }

    /// The status for a key the plan resolver does not know (default 401).
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().unknown_key_status(http::StatusCode::FORBIDDEN);
    /// ```
    pub fn unknown_key_status(mut self, status: StatusCode) -> Self {
        self.unknown_key = status;
        self
    }

    /// Also sends `X-Rate-Limit-Remaining` (tokens left over all bandwidths), the header of
    /// Bucket4j's examples, for clients that read it (default: off; `RateLimit` carries the
    /// same number per bandwidth).
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().remaining_header(true);
    /// ```
    pub fn remaining_header(mut self, on: bool) -> Self {
        self.remaining_header = on;
        self
    }

    /// The layer.
    ///
    /// ```
    /// let layer = bucket4rs_tower::RateLimitLayer::builder().build();
    /// ```
    pub fn build(self) -> RateLimitLayer<B> {
        let fixed = self
            .plans
            .as_deref()
            .filter(|_| self.manager.runs_in_place())
            .and_then(FixedPlans::of);
        RateLimitLayer {
            shared: Arc::new(Shared {
                manager: self.manager,
                key: self.key,
                plans: self.plans,
                fixed,
                cost: self.cost,
                failure: self.failure,
                unreachable: ProxyManager::new(Unreachable),
                missing_key: self.missing_key,
                unknown_key: self.unknown_key,
                remaining_header: self.remaining_header,
            }),
        }
    }
}

/// A tower [`Layer`] that rate-limits requests with token buckets (see the crate docs).
///
/// Cheap to clone; every service it makes shares the same buckets.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_tower::{Plan, RateLimitLayer};
/// use std::time::Duration;
/// let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(20, Duration::from_secs(60))?).build()?;
/// let layer = RateLimitLayer::builder().plans(Plan::new("free", config)).build();
/// let app: axum_like::Router = axum_like::Router.layer(layer);
/// # mod axum_like { #[derive(Debug)] pub struct Router; impl Router { pub fn layer<L>(self, _: L) -> Self { self } } }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimitLayer<B = EmbeddedBackend> {
    shared: Arc<Shared<B>>,
}

impl<B> Clone for RateLimitLayer<B> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for RateLimitLayer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("manager", &self.shared.manager)
            .field("key", &self.shared.key)
            .field("failure", &self.shared.failure)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer<EmbeddedBackend> {
    /// Starts building a layer (see [`RateLimitLayerBuilder`] for the defaults).
    ///
    /// ```
    /// let builder = bucket4rs_tower::RateLimitLayer::builder();
    /// ```
    pub fn builder() -> RateLimitLayerBuilder<EmbeddedBackend> {
        RateLimitLayerBuilder {
            manager: ProxyManager::new(embedded_backend().with_max_keys(DEFAULT_MAX_KEYS)),
            key: KeyExtractor::header("x-api-key"),
            plans: None,
            cost: Arc::new(|_| 1),
            failure: FailurePolicy::error(),
            missing_key: StatusCode::UNAUTHORIZED,
            unknown_key: StatusCode::UNAUTHORIZED,
            remaining_header: false,
        }
    }
}

impl<B> RateLimitLayer<B> {
    /// The proxy manager holding the buckets.
    ///
    /// ```
    /// let layer = bucket4rs_tower::RateLimitLayer::builder().build();
    /// assert_eq!(layer.manager().backend().len(), 0);
    /// ```
    pub fn manager(&self) -> &ProxyManager<B> {
        &self.shared.manager
    }
}

impl<S, B> Layer<S> for RateLimitLayer<B> {
    type Service = RateLimit<S, B>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The rate-limiting service made by [`RateLimitLayer`].
///
/// ```
/// use bucket4rs_tower::RateLimitLayer;
/// use tower::Layer;
/// let svc = RateLimitLayer::builder().build().layer(tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(bytes::Bytes::new()))
/// }));
/// ```
pub struct RateLimit<S, B = EmbeddedBackend> {
    inner: S,
    shared: Arc<Shared<B>>,
}

impl<S: Clone, B> Clone for RateLimit<S, B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, B> fmt::Debug for RateLimit<S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The boxed bucket operation of one request: the bucket comes back with the result (the
/// failure policy needs its key).
type Op<B> = Pin<
    Box<
        dyn Future<
                Output = (
                    RemoteBucket<B>,
                    Result<Verbose<ConsumptionProbe>, DistributedError>,
                ),
            > + Send,
    >,
>;

type BoxResponse<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`].
    ///
    /// A state machine rather than one boxed `async` block: on the common path (the
    /// bucket answers, the request is allowed) the inner service's future is polled in
    /// place and the rate-limit headers are added to its response; only the rare paths
    /// (backend failure, a key whose plan changed) run in a boxed future.
    pub struct ResponseFuture<S, ReqBody, B>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, B>
    where
        S: Service<Request<ReqBody>>,
    {
        // The bucket operation is running (a remote backend); the request waits, boxed so
        // that it does not enlarge the future of the in-process path.
        Deciding {
            op: Op<B>,
            waiting: Option<Box<Waiting<S, ReqBody, B>>>,
        },
        // Allowed (or unmetered): the inner service answers, then the headers are added.
        Calling {
            #[pin]
            fut: S::Future,
            headers: Option<RateHeaders>,
        },
        // Answered by the layer itself.
        Ready { resp: Option<S::Response> },
        // The rare paths.
        Boxed { fut: BoxResponse<S::Response, S::Error> },
        Done,
    }
}

/// A request waiting for a remote bucket's answer.
struct Waiting<S, ReqBody, B> {
    inner: S,
    req: Request<ReqBody>,
    shared: Arc<Shared<B>>,
    plan: Plan,
    cost: u64,
}

impl<S, ReqBody, B> fmt::Debug for ResponseFuture<S, ReqBody, B>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<S, ReqBody, ResBody, B> Future for ResponseFuture<S, ReqBody, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
    B: Backend,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Deciding { op, waiting } => {
                    let (bucket, result) = ready!(op.as_mut().poll(cx));
                    let Some(w) = waiting.take() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let Waiting {
                        mut inner,
                        req,
                        shared,
                        plan,
                        cost,
                    } = *w;
                    state.set(decided(
                        &shared,
                        Some(bucket),
                        plan,
                        cost,
                        result,
                        &mut inner,
                        req,
                    ));
                }
                StateProj::Calling { fut, headers } => {
                    // The inner future's output is returned as it is, the headers added to
                    // its response in place: the response is not moved out and back.
                    let mut out = fut.poll(cx);
                    if let Poll::Ready(Ok(resp)) = &mut out {
                        if let Some(h) = headers.take() {
                            h.apply(resp.headers_mut());
                        }
                        state.set(State::Done);
                    }
                    return out;
                }
                StateProj::Ready { resp } => {
                    let resp = resp.take();
                    state.set(State::Done);
                    if let Some(resp) = resp {
                        return Poll::Ready(Ok(resp));
                    }
                }
                StateProj::Boxed { fut } => return fut.as_mut().poll(cx),
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

impl<S, ReqBody, B> ResponseFuture<S, ReqBody, B>
where
    S: Service<Request<ReqBody>>,
{
    fn ready(resp: S::Response) -> Self {
        Self {
            state: State::Ready { resp: Some(resp) },
        }
    }
}

/// The state after the bucket answered: the common outcomes without a box, the rare ones
/// in [`rare`].
///
/// `inner` must be ready; on the rare paths it is replaced by a clone and moved into the
/// boxed future. Out of line: the in-process path only needs it on its rare paths.
#[inline(never)]
fn decided<S, ReqBody, ResBody, B>(
    shared: &Arc<Shared<B>>,
    bucket: Option<RemoteBucket<B>>,
    plan: Plan,
    cost: u64,
    result: Result<Verbose<ConsumptionProbe>, DistributedError>,
    inner: &mut S,
    req: Request<ReqBody>,
) -> State<S, ReqBody, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
    B: Backend,
{
    match result {
        Ok(v) if same_config(&v.configuration, plan.configuration()) => {
            match verdict(&plan, &v, cost, shared.remaining_header) {
                Verdict::Allow(headers) => State::Calling {
                    fut: inner.call(req),
                    headers: Some(headers),
                },
                Verdict::Answer(resp) => State::Ready { resp: Some(resp) },
            }
        }
        result => {
            // Given for the rare outcomes; its key was valid, so this is not expected.
            let bucket = match bucket {
                Some(b) => b,
                None => {
                    return State::Ready {
                        resp: Some(key_problem(
                            shared.missing_key,
                            "the client key is too long",
                        )),
                    };
                }
            };
            let fresh = inner.clone();
            let ready = core::mem::replace(inner, fresh);
            State::Boxed {
                fut: Box::pin(rare(
                    Arc::clone(shared),
                    bucket,
                    plan,
                    cost,
                    result,
                    ready,
                    req,
                )),
            }
        }
    }
}

/// The headers of a metered request (allowed, or refused with a 429).
struct RateHeaders {
    policy: HeaderValue,
    ratelimit: Option<HeaderValue>,
    remaining: Option<u64>,
}

impl RateHeaders {
    /// The headers of a request decided under `plan`.
    #[inline]
    fn of(
        plan: &Plan,
        ratelimit: Option<HeaderValue>,
        remaining_header: bool,
        decision: &Decision,
    ) -> Self {
        Self {
            policy: plan.policy_header().clone(),
            ratelimit,
            remaining: remaining_header.then_some(decision.remaining),
        }
    }

    #[inline]
    fn apply(self, h: &mut http::HeaderMap) {
        h.insert(RATELIMIT_POLICY, self.policy);
        if let Some(rl) = self.ratelimit {
            h.insert(RATELIMIT, rl);
        }
        if let Some(remaining) = self.remaining {
            h.insert(X_RATE_LIMIT_REMAINING, HeaderValue::from(remaining));
        }
    }
}

enum Verdict<ResBody> {
    /// Call the inner service, then add these headers.
    Allow(RateHeaders),
    /// The layer's own answer (429, or 500 when the cost can never be served).
    Answer(Response<ResBody>),
}

/// What the bucket's answer under `effective` means for the request.
fn verdict<ResBody: From<Bytes>>(
    effective: &Plan,
    v: &Verbose<ConsumptionProbe>,
    cost: u64,
    remaining_header: bool,
) -> Verdict<ResBody> {
    let ratelimit = headers::ratelimit_header(effective, &v.state, v.now_nanos, cost);
    let decision = Decision::of_probe(&v.value);
    let headers = RateHeaders::of(effective, ratelimit, remaining_header, &decision);
    if decision.consumed {
        return Verdict::Allow(headers);
    }
    Verdict::Answer(refusal(effective, &decision, headers, cost))
}

/// What the layer needs from a bucket's answer: the fields of a [`ConsumptionProbe`] it
/// reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Decision {
    consumed: bool,
    /// Tokens left over all bandwidths (after the request when it was consumed).
    remaining: u64,
    /// Until the request could be served (0 when consumed; [`NEVER`] when never).
    wait: u64,
}

impl Decision {
    fn of_probe(probe: &ConsumptionProbe) -> Self {
        Self {
            consumed: probe.is_consumed(),
            remaining: probe.remaining_tokens(),
            wait: probe.nanos_to_wait_for_refill(),
        }
    }

    /// The decision of a `try_consume(cost)` that answered `consumed` and left `state`
    /// (at instant `now`): the values `try_consume_and_return_remaining(cost)` would have
    /// reported (the same core functions on the same refilled state), without the probe's
    /// wait for a full bucket.
    fn of_try_consume(
        consumed: bool,
        config: &BucketConfiguration,
        state: &BucketState,
        now: i64,
        cost: u64,
    ) -> Self {
        let b = state.bandwidths();
        let view = Refilled::new(config, now, |i| b.get(i).copied().unwrap_or_default());
        // Consumed: the state is the one after consuming `cost`, whose balance is the
        // probe's `available - cost`.
        let remaining = u64::try_from(view.available()).unwrap_or(0);
        let wait = if consumed {
            0
        } else {
            view.request_wait(cost, true)
        };
        Self {
            consumed,
            remaining,
            wait,
        }
    }

    /// The full probe of a `try_consume(cost)` from its lent snapshot, as
    /// `try_consume_and_return_remaining(cost)` reports it (for the rare paths, which take
    /// a `Verbose<ConsumptionProbe>`).
    fn probe_of_try_consume(v: &VerboseRef<'_, bool>, cost: u64) -> ConsumptionProbe {
        probe_of(v.value, v.configuration, v.state, v.now_nanos, cost)
    }
}

/// [`Decision::probe_of_try_consume`] from the parts of the snapshot.
fn probe_of(
    consumed: bool,
    config: &BucketConfiguration,
    state: &BucketState,
    now: i64,
    cost: u64,
) -> ConsumptionProbe {
    let d = Decision::of_try_consume(consumed, config, state, now, cost);
    let b = state.bandwidths();
    let view = Refilled::new(config, now, |i| b.get(i).copied().unwrap_or_default());
    // Consumed: the state is the one after consuming, whose wait for a full bucket is the
    // probe's `reset_wait(cost)` of the state before.
    ConsumptionProbe::new(d.consumed, d.remaining, d.wait, view.reset_wait(0))
}

/// The layer's answer to a request the bucket refused: 429, or 500 when the cost can never
/// be served.
///
/// Not inlined, like the other answers of the layer: the allowed path, which runs on every
/// request, stays compact (in a server, its code is fetched anew for each request: see
/// "Code footprint" in docs/http-overhead.md).
#[inline(never)]
fn refusal<ResBody: From<Bytes>>(
    effective: &Plan,
    decision: &Decision,
    headers: RateHeaders,
    cost: u64,
) -> Response<ResBody> {
    if decision.wait >= NEVER {
        return cost_exceeds_capacity(effective, cost);
    }
    let retry = headers::ceil_secs(decision.wait);
    let mut resp = problem::too_many_requests(
        retry,
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("rate limit of plan {:?} exceeded", effective.name()),
        )
        .with("plan", effective.name())
        .with("cost", cost)
        .with("remaining", decision.remaining),
    );
    headers.apply(resp.headers_mut());
    resp
}

/// What an in-process bucket call gives the layer: under the current plan, just what the
/// response needs (computed while the record is lent, so nothing is cloned); under another
/// configuration, an owned snapshot for the rare path.
enum InProcess {
    Current(Decision, Option<HeaderValue>),
    Stale(Verbose<ConsumptionProbe>),
}

impl InProcess {
    /// The owned snapshot of a bucket found under another configuration (rare).
    #[cold]
    #[inline(never)]
    fn stale(v: &VerboseRef<'_, bool>, cost: u64) -> Self {
        let probe = Decision::probe_of_try_consume(v, cost);
        Self::Stale(v.to_verbose().map(|_| probe))
    }
}

/// The rare outcomes: the backend failed (the failure policy decides), or the key's bucket
/// was created under another plan.
async fn rare<S, ReqBody, ResBody, B>(
    shared: Arc<Shared<B>>,
    bucket: RemoteBucket<B>,
    plan: Plan,
    cost: u64,
    result: Result<Verbose<ConsumptionProbe>, DistributedError>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
    B: Backend,
{
    let v = match result {
        Ok(v) => v,
        Err(e) if e.is_unavailable() => {
            let supplier_plan = plan.clone();
            let Ok(fallback) = shared
                .unreachable
                .builder()
                .build(bucket.key().as_bytes(), move || {
                    supplier_plan.configuration().clone()
                })
            else {
                return Ok(unavailable_response(&e.to_string()));
            };
            return match shared.failure.try_consume(&fallback, cost).await {
                Ok(d) if d.is_allowed() => inner.call(req).await,
                Ok(_) => Ok(problem::too_many_requests(
                    1,
                    Problem::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "the rate limiter cannot decide ({e}); denied by the failure policy"
                        ),
                    ),
                )),
                Err(_) => Ok(unavailable_response(&e.to_string())),
            };
        }
        Err(e) => {
            return Ok(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("rate limiter error: {e}"),
            )
            .into_response());
        }
    };
    let stored;
    let effective = if same_config(&v.configuration, plan.configuration()) {
        &plan
    } else {
        // The key's bucket was created under another plan (the key changed plan, or the
        // plans file changed): report what decided, then switch the bucket to the current
        // plan, keeping its tokens.
        stored = Plan::new(plan.name().to_owned(), v.configuration.clone());
        let _ = bucket
            .replace_configuration(
                plan.configuration().clone(),
                TokensInheritanceStrategy::AsIs,
            )
            .await;
        &stored
    };
    match verdict(effective, &v, cost, shared.remaining_header) {
        Verdict::Allow(headers) => {
            let mut resp = inner.call(req).await?;
            headers.apply(resp.headers_mut());
            Ok(resp)
        }
        Verdict::Answer(resp) => Ok(resp),
    }
}

/// Whether two configurations are equal; first by identity (a bucket created from a plan
/// shares its configuration's bandwidths, and `Arc<[T]>`'s `==` compares the elements).
///
/// Inlined: the identity test is a pointer comparison; the element-wise comparison (a
/// bucket decoded by a remote backend, or a changed plan) is a call.
#[inline]
fn same_config(a: &BucketConfiguration, b: &BucketConfiguration) -> bool {
    identical(a, b) || equal_configs(a, b)
}

#[inline(never)]
fn equal_configs(a: &BucketConfiguration, b: &BucketConfiguration) -> bool {
    a == b
}

/// The [`RemoteBucket`] of a client key under `plan`. Out of line: the in-process path
/// needs one only on its rare paths.
#[inline(never)]
fn remote_bucket<B: Backend>(
    shared: &Shared<B>,
    key: &str,
    plan: &Plan,
) -> Result<RemoteBucket<B>, DistributedError> {
    let supplier_plan = plan.clone();
    shared.manager.builder().build(key.as_bytes(), move || {
        supplier_plan.configuration().clone()
    })
}

#[cold]
#[inline(never)]
fn key_problem<ResBody: From<Bytes>>(status: StatusCode, detail: &str) -> Response<ResBody> {
    let mut r = Problem::new(status, detail).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("ApiKey"));
    }
    r
}

impl<S, B, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
    B: Backend,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        // The common case, on a path of its own: fixed plans on an in-place store, and a
        // known client's one-bandwidth bucket that has the tokens and keeps `cost` more,
        // so its `RateLimit` value needs no wait ([`allowed`]). Its plan is read off the
        // bucket's configuration (one lookup of the key instead of two; see
        // `FixedPlans`). A known client's other outcomes are decided in the same lookup
        // and answered out of line ([`answer_live`]). Everything else (a new key, a plan
        // resolved per request, a remote store) is left untouched for `call_general`, out
        // of line, so that this path's code stays compact and its stack frame small
        // (docs/http-overhead.md, "A path for the common case").
        let Some(fixed) = &shared.fixed else {
            return self.call_general(req, None);
        };
        let info = RequestInfo::new(&req);
        let Some(key) = shared.key.extract(&info) else {
            return missing_key(shared.missing_key);
        };
        let cost = (shared.cost)(&info);
        if cost != 0 {
            let remaining_header = shared.remaining_header;
            let select = |config: &BucketConfiguration| {
                fixed.plan_of(config).filter(|p| cost <= p.min_capacity())
            };
            // A known client's other outcomes (a refusal, the last tokens, several
            // bandwidths), decided in the same lookup, out of line.
            let live =
                shared
                    .manager
                    .try_take_live(key.as_bytes(), cost, cost, select, |plan, v| {
                        (plan, decide(plan, &v, cost, remaining_header))
                    });
            match live {
                Ok(Some(LiveTake::Taken(plan, left))) => {
                    #[cfg(test)]
                    tests::COMMON_PATH.with(|n| n.set(n.get() + 1));
                    return allowed(&mut self.inner, req, plan, left, remaining_header);
                }
                Ok(Some(LiveTake::Other((plan, (decision, ratelimit))))) => {
                    return answer_live(
                        &mut self.inner,
                        req,
                        plan,
                        decision,
                        ratelimit,
                        remaining_header,
                        cost,
                    );
                }
                // No live bucket, a configuration none of the plans has, a cost beyond the
                // plan's capacity (all untouched), or a key too long: the general path.
                _ => {}
            }
        }
        self.call_general(req, Some(cost))
    }
}

impl<S, B: Backend> RateLimit<S, B> {
    /// [`call`](Service::call) for every request the common path leaves (`cost` computed
    /// there: a key without a live bucket, a configuration none of the fixed plans has, a
    /// cost beyond the plan), and for every request when the plans are not fixed (`cost`
    /// is `None`): the resolving path. A request that left the common path has its key
    /// extracted again (the first one borrowed the request, which is moved here): a header
    /// or the peer address is read twice, a [`KeyExtractor::from_fn`] closure called twice.
    #[inline(never)]
    fn call_general<ReqBody, ResBody>(
        &mut self,
        req: Request<ReqBody>,
        cost: Option<u64>,
    ) -> ResponseFuture<S, ReqBody, B>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqBody: Send + 'static,
        ResBody: From<Bytes> + Send + 'static,
    {
        let shared = &self.shared;
        let info = RequestInfo::new(&req);
        let Some(key) = shared.key.extract(&info) else {
            return missing_key(shared.missing_key);
        };
        let cost = cost.unwrap_or_else(|| (shared.cost)(&info));
        let remaining_header = shared.remaining_header;
        let Some(plan) = shared.plans.as_ref().and_then(|p| p.resolve(&key)) else {
            return ResponseFuture::ready(key_problem(shared.unknown_key, "unknown client key"));
        };
        if cost == 0 {
            return ResponseFuture {
                state: State::Calling {
                    fut: self.inner.call(req),
                    headers: None,
                },
            };
        }
        if cost > plan.min_capacity() {
            return ResponseFuture::ready(cost_exceeds_capacity(&plan, cost));
        }
        // A backend that runs transactions synchronously (the embedded default,
        // `Backend::supports_transact_now`): the bucket is called here, with the storage key
        // encoded on the stack and the plan's configuration borrowed (cloned only when the
        // key has no bucket yet), the `RateLimit` value computed while the record is lent,
        // and the request decided here, so `self.inner` (the service that was polled ready)
        // is called without a clone.
        // Matched by reference: the bucket (its key encoded on the stack) is not moved.
        let in_process = shared
            .manager
            .in_process_bucket(key.as_bytes(), plan.configuration());
        match &in_process {
            Ok(Some(bucket)) => {
                let result = bucket.try_consume_with(cost, |v| {
                    if !same_config(v.configuration, plan.configuration()) {
                        return InProcess::stale(&v, cost);
                    }
                    let (decision, ratelimit) = decide(&plan, &v, cost, remaining_header);
                    InProcess::Current(decision, ratelimit)
                });
                let result = match result {
                    Ok(InProcess::Current(decision, ratelimit)) => {
                        return answer(
                            &mut self.inner,
                            req,
                            &plan,
                            decision,
                            ratelimit,
                            remaining_header,
                            cost,
                        );
                    }
                    Ok(InProcess::Stale(v)) => Ok(v),
                    Err(e) => Err(e),
                };
                // The rare paths (a changed plan, a failure) need a `RemoteBucket`: the
                // failure policy and the switch to the current plan run through it.
                let remote = remote_bucket(shared, &key, &plan).ok();
                return ResponseFuture {
                    state: decided(shared, remote, plan, cost, result, &mut self.inner, req),
                };
            }
            Ok(None) => {}
            Err(_) => {
                return ResponseFuture::ready(key_problem(
                    shared.missing_key,
                    "the client key is too long",
                ));
            }
        }
        ResponseFuture {
            state: remote_call(
                shared,
                remote_bucket(shared, &key, &plan),
                plan,
                cost,
                &mut self.inner,
                req,
            ),
        }
    }
}

/// What the response needs from a bucket that answered `try_consume(cost)` under `plan`'s
/// configuration, computed while the record is lent: the decision and the `RateLimit`
/// value.
#[inline(always)]
fn decide(
    plan: &Plan,
    v: &VerboseRef<'_, bool>,
    cost: u64,
    remaining_header: bool,
) -> (Decision, Option<HeaderValue>) {
    let ratelimit = headers::ratelimit_header(plan, v.state, v.now_nanos, cost);
    // Allowed without `X-Rate-Limit-Remaining`: nothing else to compute (`remaining` is
    // then not read).
    let decision = if v.value && !remaining_header {
        Decision {
            consumed: true,
            remaining: 0,
            wait: 0,
        }
    } else {
        Decision::of_try_consume(v.value, v.configuration, v.state, v.now_nanos, cost)
    };
    (decision, ratelimit)
}

/// The response future of a request allowed by [`ProxyManager::try_take_live`] under
/// `plan`, `left` tokens left (at least the request's cost, which is within the plan's
/// capacity): the headers the general path computes (the test
/// `the_common_path_answers_as_the_general_one` compares them), with `t` 0.
#[inline(always)]
fn allowed<S, ReqBody, ResBody, B>(
    inner: &mut S,
    req: Request<ReqBody>,
    plan: &Plan,
    left: u64,
    remaining_header: bool,
) -> ResponseFuture<S, ReqBody, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let headers = RateHeaders {
        policy: plan.policy_header().clone(),
        ratelimit: headers::allowed_value(plan, left),
        remaining: remaining_header.then_some(left),
    };
    ResponseFuture {
        state: State::Calling {
            fut: inner.call(req),
            headers: Some(headers),
        },
    }
}

/// [`answer`] out of line, for the outcomes of a known client that the common path of
/// [`RateLimit::call`] hands on (`LiveTake::Other`).
#[inline(never)]
fn answer_live<S, ReqBody, ResBody, B>(
    inner: &mut S,
    req: Request<ReqBody>,
    plan: &Plan,
    decision: Decision,
    ratelimit: Option<HeaderValue>,
    remaining_header: bool,
    cost: u64,
) -> ResponseFuture<S, ReqBody, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
{
    answer(
        inner,
        req,
        plan,
        decision,
        ratelimit,
        remaining_header,
        cost,
    )
}

/// The in-process decision answered: the allowed request's response future built in place
/// (no intermediate state to move), or the layer's refusal (429, or 500 for a cost beyond
/// the plan).
#[inline(always)]
fn answer<S, ReqBody, ResBody, B>(
    inner: &mut S,
    req: Request<ReqBody>,
    plan: &Plan,
    decision: Decision,
    ratelimit: Option<HeaderValue>,
    remaining_header: bool,
    cost: u64,
) -> ResponseFuture<S, ReqBody, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
{
    let headers = RateHeaders::of(plan, ratelimit, remaining_header, &decision);
    if decision.consumed {
        return ResponseFuture {
            state: State::Calling {
                fut: inner.call(req),
                headers: Some(headers),
            },
        };
    }
    ResponseFuture::ready(refusal(plan, &decision, headers, cost))
}

/// The state of a request on a backend that does not run transactions synchronously
/// (Redis, PostgreSQL): the bucket call, boxed, with the request waiting for its answer.
/// Out of line, so that the in-process path of [`RateLimit::call`] stays compact.
#[inline(never)]
fn remote_call<S, ReqBody, ResBody, B>(
    shared: &Arc<Shared<B>>,
    bucket: Result<RemoteBucket<B>, DistributedError>,
    plan: Plan,
    cost: u64,
    inner: &mut S,
    req: Request<ReqBody>,
) -> State<S, ReqBody, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
    B: Backend,
{
    let bucket = match bucket {
        Ok(b) => b,
        Err(_) => {
            return State::Ready {
                resp: Some(key_problem(
                    shared.missing_key,
                    "the client key is too long",
                )),
            };
        }
    };
    let op: Op<B> = Box::pin(async move {
        let result = bucket
            .verbose()
            .try_consume_and_return_remaining(cost)
            .await;
        (bucket, result)
    });
    // The clone is not necessarily ready: keep the one that was polled.
    let fresh = inner.clone();
    let inner = core::mem::replace(inner, fresh);
    State::Deciding {
        op,
        waiting: Some(Box::new(Waiting {
            inner,
            req,
            shared: Arc::clone(shared),
            plan,
            cost,
        })),
    }
}

/// The answer to a request without a usable client key.
#[cold]
#[inline(never)]
fn missing_key<S, ReqBody, ResBody, B>(status: StatusCode) -> ResponseFuture<S, ReqBody, B>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
{
    ResponseFuture::ready(key_problem(
        status,
        "the request carries no usable client key",
    ))
}

#[cold]
#[inline(never)]
fn cost_exceeds_capacity<ResBody: From<Bytes>>(plan: &Plan, cost: u64) -> Response<ResBody> {
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

#[cold]
#[inline(never)]
fn unavailable_response<ResBody: From<Bytes>>(why: &str) -> Response<ResBody> {
    let mut r = Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the rate limiter cannot decide: {why}"),
    )
    .into_response::<ResBody>();
    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u32));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucket4rs_core::ops::TryConsumeAndReturnRemaining;
    use bucket4rs_core::{Bandwidth, ManualClock};
    use core::time::Duration;
    use std::cell::Cell;
    use tower::ServiceExt;

    std::thread_local! {
        /// How many requests the common path of `call` answered on this thread.
        pub(super) static COMMON_PATH: Cell<u64> = const { Cell::new(0) };
    }

    /// Status, every header (sorted) and the body of a response.
    type Answer = (StatusCode, Vec<(String, String)>, Bytes);

    async fn answer_of<S>(svc: &S, key: &str, path: &str) -> Answer
    where
        S: Service<Request<()>, Response = Response<Bytes>, Error = core::convert::Infallible>
            + Clone,
    {
        let req = Request::get(path)
            .header("x-api-key", key)
            .body(())
            .unwrap();
        let resp = svc.clone().oneshot(req).await.unwrap();
        let mut headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        headers.sort();
        (resp.status(), headers, resp.into_body())
    }

    /// The common path of `call` (fixed plans, a known client's one-bandwidth bucket that
    /// keeps the cost) answers exactly as the general path does: the same random requests
    /// (keys of four plans: greedy, interval refill, two bandwidths, and an unknown key;
    /// costs up to beyond a plan's capacity; instants from the same nanosecond to past
    /// expiry) through a layer with fixed plans and one resolving each request, compared
    /// response by response, with and without `X-Rate-Limit-Remaining`.
    #[tokio::test]
    async fn the_common_path_answers_as_the_general_one() {
        let table = || {
            crate::PlanTable::from_toml(
                r#"
                [plans.free]
                limits = [{ id = "burst", capacity = 20, refill = 20, period = "1 minute" }]
                [plans.pro]
                limits = [{ id = "pro", capacity = 200, refill = 7, period = "1s" }]
                [plans.stepped]
                limits = [{ capacity = 12, refill = 4, period = "10s", refill_kind = "intervally" }]
                [plans.two]
                limits = [
                    { id = "burst", capacity = 6, refill = 6, period = "1s" },
                    { id = "daily", capacity = 40, refill = 40, period = "1 day" },
                ]
                [keys]
                f = "free"
                p = "pro"
                s = "stepped"
                t = "two"
                "#,
            )
            .unwrap()
        };
        let hello = tower::service_fn(|_: Request<()>| async {
            Ok::<_, core::convert::Infallible>(Response::new(Bytes::from_static(b"hello")))
        });
        let cost = |r: &RequestInfo<'_>| match r.uri().path() {
            "/c3" => 3,
            "/c7" => 7,
            "/c30" => 30,
            "/free" => 0,
            _ => 1,
        };
        for remaining_header in [false, true] {
            let fixed_clock = ManualClock::new(1_000_000_000);
            let general_clock = ManualClock::new(1_000_000_000);
            let fixed = RateLimitLayer::builder()
                .backend(ProxyManager::new(EmbeddedBackend::with_clock(
                    fixed_clock.clone(),
                )))
                .plans(table())
                .cost(cost)
                .remaining_header(remaining_header)
                .build();
            assert!(fixed.shared.fixed.is_some(), "a plans table is fixed");
            let fixed = fixed.layer(hello);
            let resolving = table();
            let general = RateLimitLayer::builder()
                .backend(ProxyManager::new(EmbeddedBackend::with_clock(
                    general_clock.clone(),
                )))
                .plans(move |key: &str| resolving.resolve(key))
                .cost(cost)
                .remaining_header(remaining_header)
                .build();
            assert!(general.shared.fixed.is_none());
            let general = general.layer(hello);
            let steps: [i64; 8] = [
                0,
                1,
                1_000,
                50_000_000,
                400_000_000,
                2_500_000_000,
                30_000_000_000,
                7_200_000_000_000,
            ];
            let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
            let mut next = |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n
            };
            let common_before = COMMON_PATH.with(Cell::get);
            let (mut allowed, mut refused) = (0, 0);
            for step in 0..4_000 {
                let key = ["f", "p", "s", "t", "u"][next(5) as usize];
                let path = ["/c1", "/c1", "/c3", "/c7", "/c30", "/free"][next(6) as usize];
                let a = answer_of(&fixed, key, path).await;
                let b = answer_of(&general, key, path).await;
                assert_eq!(a, b, "step {step}: {key} {path}");
                allowed += usize::from(a.0 == StatusCode::OK);
                refused += usize::from(a.0 == StatusCode::TOO_MANY_REQUESTS);
                // Mostly short steps, so that buckets run out.
                let by = steps[next(steps.len() as u64).min(next(steps.len() as u64)) as usize];
                fixed_clock.advance_nanos(by);
                general_clock.advance_nanos(by);
            }
            let common = COMMON_PATH.with(Cell::get) - common_before;
            assert!(
                allowed > 1_000 && refused > 300,
                "{allowed} allowed, {refused} refused"
            );
            assert!(common > 500, "{common} on the common path");
        }
    }

    /// Fixed plans are used only when each plan's configuration tells it apart (its own
    /// allocation; equal contents are fine), there are at most 16, and the resolver says
    /// its answers are fixed; a bucket's configuration maps back to its own plan.
    #[test]
    fn fixed_plans_need_a_configuration_of_their_own() {
        let config = configs().remove(0);
        let equal = BucketConfiguration::new(config.bandwidths().to_vec()).unwrap();
        let a = Plan::new("a", config.clone());
        let b = Plan::new("b", equal);
        // A resolver answering `fixed_plans` with the given plans.
        struct Fixed(Vec<Plan>);
        impl PlanResolver for Fixed {
            fn resolve(&self, _: &str) -> Option<Plan> {
                self.0.first().cloned()
            }
            fn fixed_plans(&self) -> Option<Vec<Plan>> {
                Some(self.0.clone())
            }
        }
        let both = FixedPlans::of(&Fixed(vec![a.clone(), b.clone()])).expect("told apart");
        assert_eq!(both.plan_of(a.configuration()), Some(&a));
        assert_eq!(both.plan_of(b.configuration()).map(Plan::name), Some("b"));
        assert_eq!(
            both.plan_of(&config),
            Some(&a),
            "a clone is the same configuration"
        );
        let unknown = BucketConfiguration::new(config.bandwidths().to_vec()).unwrap();
        assert_eq!(
            both.plan_of(&unknown),
            None,
            "equal, but not one of the plans'"
        );

        let shared = Plan::new("shared", config.clone());
        assert!(FixedPlans::of(&Fixed(vec![a.clone(), shared])).is_none());
        assert!(FixedPlans::of(&Fixed(Vec::new())).is_none());
        let many: Vec<Plan> = (0..=MAX_FIXED_PLANS)
            .map(|i| {
                let c = BucketConfiguration::new(config.bandwidths().to_vec()).unwrap();
                Plan::new(i.to_string(), c)
            })
            .collect();
        assert!(FixedPlans::of(&Fixed(many[1..].to_vec())).is_some());
        assert!(FixedPlans::of(&Fixed(many)).is_none());
        let closure = move |_: &str| Some(a.clone());
        assert!(FixedPlans::of(&closure).is_none());
    }

    /// The default store's clock counts epoch nanoseconds (what TTLs and aligned refills
    /// assume) and never goes back between operations.
    #[test]
    fn the_default_store_runs_on_a_monotonic_epoch_clock() {
        use std::time::{SystemTime, UNIX_EPOCH};
        let manager = ProxyManager::new(embedded_backend());
        let config = configs().remove(0);
        let bucket = manager
            .in_process_bucket("k", &config)
            .unwrap()
            .expect("the embedded store runs transactions in process");
        let mut last = 0;
        for _ in 0..1_000 {
            let now = bucket.try_consume_with(1, |v| v.now_nanos).unwrap();
            assert!(now >= last, "{now} after {last}");
            last = now;
        }
        let system = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos(),
        )
        .unwrap();
        assert!(
            (system - last).abs() < 5_000_000_000,
            "{last} vs system {system}"
        );
    }

    fn max_capacity(config: &BucketConfiguration) -> u64 {
        config
            .bandwidths()
            .iter()
            .map(Bandwidth::capacity)
            .max()
            .unwrap()
    }

    fn configs() -> Vec<BucketConfiguration> {
        let secs = Duration::from_secs;
        let build = |limits: Vec<Bandwidth>| {
            let mut b = BucketConfiguration::builder();
            for l in limits {
                b = b.add_limit(l);
            }
            b.build().unwrap()
        };
        vec![
            build(vec![Bandwidth::simple(10, secs(10)).unwrap()]),
            build(vec![
                Bandwidth::builder()
                    .capacity(5)
                    .refill_intervally(5, secs(3))
                    .build()
                    .unwrap(),
            ]),
            build(vec![
                Bandwidth::builder()
                    .capacity(10)
                    .refill_greedy(7, Duration::from_millis(1300))
                    .initial_tokens(2)
                    .build()
                    .unwrap(),
            ]),
            build(vec![
                Bandwidth::builder()
                    .capacity(3)
                    .refill_greedy(3, secs(1))
                    .id("burst")
                    .build()
                    .unwrap(),
                Bandwidth::builder()
                    .capacity(20)
                    .refill_intervally(20, secs(60))
                    .id("minute")
                    .build()
                    .unwrap(),
            ]),
        ]
    }

    /// The in-process path runs `try_consume` and derives its decision (and, on the rare
    /// paths, the whole probe) from the state: exactly what
    /// `try_consume_and_return_remaining` reports, with the same state change, for fresh,
    /// overdrawn and force-filled buckets at many instants and costs.
    #[test]
    fn the_try_consume_decision_is_the_probe() {
        let mut checked = 0;
        for config in configs() {
            let max_cap = max_capacity(&config);
            let mut starts = vec![BucketState::new(&config, 0)];
            for k in [1, 4, 13] {
                let mut s = BucketState::new(&config, 0);
                s.consume_ignoring_rate_limits(&config, 0, k).unwrap();
                starts.push(s);
                let mut s = BucketState::new(&config, 0);
                s.force_add_tokens(&config, 0, k).unwrap();
                starts.push(s);
            }
            for start in &starts {
                for now in [
                    0,
                    1,
                    333_333_333,
                    1_000_000_000,
                    2_999_999_999,
                    60_000_000_001,
                ] {
                    for cost in 1..=max_cap + 16 {
                        let mut with_probe = start.clone();
                        let probe = with_probe
                            .apply(&config, now, &TryConsumeAndReturnRemaining(cost))
                            .unwrap();
                        let mut plain = start.clone();
                        let consumed = plain.try_consume(&config, now, cost).unwrap();
                        assert_eq!(plain, with_probe, "{config:?} at {now}, cost {cost}");
                        assert_eq!(
                            probe_of(consumed, &config, &plain, now, cost),
                            probe,
                            "{config:?} from {start:?} at {now}, cost {cost}"
                        );
                        assert_eq!(
                            Decision::of_try_consume(consumed, &config, &plain, now, cost),
                            Decision::of_probe(&probe)
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 1000);
    }

    /// The `RateLimit` value as the draft defines it, formatted plainly: per bandwidth, the
    /// tokens left and `request_wait` in whole seconds.
    fn reference_ratelimit(plan: &Plan, state: &BucketState, now: i64, cost: u64) -> String {
        let states = state.bandwidths();
        let mut items = Vec::new();
        for (i, (q, single)) in plan.quotas().iter().zip(plan.singles()).enumerate() {
            let view = Refilled::new(single, now, |_| states[i]);
            let r = u64::try_from(view.get(0).tokens())
                .unwrap_or(0)
                .min(999_999_999_999_999);
            let t = view
                .request_wait(cost, true)
                .div_ceil(1_000_000_000)
                .min(999_999_999_999_999);
            items.push(format!("\"{}\";r={r};t={t}", q.name()));
        }
        items.join(", ")
    }

    /// The `RateLimit` value (formatted on the stack, with no wait computed when the
    /// bandwidth holds the cost) equals the plain formatting, including for force-filled
    /// buckets above their capacity and costs above it.
    #[test]
    fn the_ratelimit_value_is_the_plain_one() {
        for config in configs() {
            let plan = Plan::new("p", config.clone());
            let max_cap = max_capacity(&config);
            for k in [0, 2, 9, 40] {
                for force in [false, true] {
                    let mut state = BucketState::new(&config, 0);
                    if force {
                        state.force_add_tokens(&config, 0, k + 1).unwrap();
                    } else if k > 0 {
                        state.consume_ignoring_rate_limits(&config, 0, k).unwrap();
                    }
                    for now in [0, 999_999_999, 1_000_000_000, 7_000_000_001] {
                        for cost in 1..=max_cap + 45 {
                            let got = headers::ratelimit_header(&plan, &state, now, cost).unwrap();
                            assert_eq!(
                                got.to_str().unwrap(),
                                reference_ratelimit(&plan, &state, now, cost),
                                "{config:?} {state:?} at {now}, cost {cost}"
                            );
                        }
                    }
                }
            }
        }
    }
}
