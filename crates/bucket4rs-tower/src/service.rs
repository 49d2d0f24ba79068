//! The rate-limiting service: one path per request — the key, the cost and the plan read
//! once, one question to the store, one verdict.

use core::fmt;
use core::task::{Context, Poll};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use tower::Service;

use crate::future::ResponseFuture;
use crate::key::RequestInfo;
use crate::layer::Shared;
use crate::plan::Plan;
use crate::policy::Decided;
use crate::response::{self, Failed, Unavailable, Verdict};
use crate::store::{Answer, BoxFuture, Store, StoreError};

/// The rate-limiting service made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// ```
/// use bucket4rs_tower::{Plan, RateLimitLayer};
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use std::time::Duration;
/// use tower::Layer;
/// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
/// let layer = RateLimitLayer::builder().plans(Plan::new("free", config)).build()?;
/// let svc = layer.layer(tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(bytes::Bytes::new()))
/// }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }
}

impl<S: Clone> Clone for RateLimit<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        match decide(&self.shared, &req) {
            Ok(Verdict::Allow(headers)) => ResponseFuture::calling(self.inner.call(req), headers),
            Ok(Verdict::Answer(resp)) => ResponseFuture::ready(resp),
            Err(verdict) => {
                // The clone is not necessarily ready: keep the one that was polled.
                let fresh = self.inner.clone();
                let inner = core::mem::replace(&mut self.inner, fresh);
                ResponseFuture::deciding(verdict, inner, req)
            }
        }
    }
}

/// A verdict now, or one to wait for (a shared store's, or several limits').
type Pending<R> = Result<Verdict<R>, BoxFuture<Verdict<R>>>;

/// The request's verdict: its key, cost and plan, then the store's answer; in a `debug`
/// span when a subscriber wants one (without, one load of tracing's global level filter).
#[inline]
fn decide<ReqBody, ResBody: From<Bytes> + Send + 'static>(
    shared: &Arc<Shared>,
    req: &Request<ReqBody>,
) -> Pending<Response<ResBody>> {
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return decide_in(shared, req, None);
    }
    decide_traced(shared, req)
}

/// [`decide`] in its span.
#[cold]
#[inline(never)]
fn decide_traced<ReqBody, ResBody: From<Bytes> + Send + 'static>(
    shared: &Arc<Shared>,
    req: &Request<ReqBody>,
) -> Pending<Response<ResBody>> {
    let span = tracing::debug_span!(
        "rate_limit",
        plan = tracing::field::Empty,
        cost = tracing::field::Empty,
        status = tracing::field::Empty
    );
    let _entered = span.enter();
    let pending = decide_in(shared, req, Some(&span));
    if let Ok(v) = &pending {
        let status = match v {
            Verdict::Allow(_) => 0,
            Verdict::Answer(r) => r.status().as_u16(),
        };
        span.record("status", status);
    }
    pending
}

#[inline(always)]
fn decide_in<ReqBody, ResBody: From<Bytes> + Send + 'static>(
    shared: &Arc<Shared>,
    req: &Request<ReqBody>,
    span: Option<&tracing::Span>,
) -> Pending<Response<ResBody>> {
    let info = RequestInfo::new(req);
    let Some(key) = shared.key.extract(&info) else {
        return Ok(Verdict::Answer(response::key_problem(
            shared.missing_key,
            "the request carries no usable client key",
        )));
    };
    if shared.exempt.is_some() && exempt(shared, &key, &info) {
        return Ok(Verdict::Allow(None));
    }
    let cost = (shared.cost)(&info);
    let Some(plan) = shared.plans.as_ref().and_then(|p| p.resolve(&key)) else {
        return Ok(unknown(shared));
    };
    if let Some(span) = span {
        span.record("plan", plan.name());
        span.record("cost", cost);
    }
    if cost == 0 {
        // Unmetered: no bucket, no headers (the key must still be known).
        return Ok(Verdict::Allow(None));
    }
    if cost > plan.min_capacity() {
        return Ok(Verdict::Answer(response::cost_exceeds_capacity(
            &plan, cost,
        )));
    }
    if !shared.limits.is_empty() {
        let grpc = response::is_grpc(info.headers());
        let applicable: Vec<usize> = (0..shared.limits.len())
            .filter(|&i| shared.limits[i].limit.applies(&info))
            .collect();
        if !applicable.is_empty() {
            return Err(Box::pin(decide_many(
                Arc::clone(shared),
                key.into_owned(),
                plan,
                cost,
                applicable,
                grpc,
            )));
        }
    }
    // Whether it is a gRPC call matters to a refusal only: read then.
    let grpc = || response::is_grpc(info.headers());
    match &shared.store {
        Store::Local(local) => Ok(match local.ask(&key, &plan, cost) {
            Ok(answer) => response::verdict(shared, &plan, &answer, cost, grpc),
            Err(e) => failed(
                shared,
                (&plan, crate::metrics::CLIENT),
                &key,
                cost,
                grpc(),
                e,
            ),
        }),
        #[cfg(feature = "distributed")]
        Store::Remote(remote) => ask_remote(shared, &**remote, &key, plan, cost, grpc()),
    }
}

/// Whether the allowlist lets the request through unmetered (its key, or its client's
/// network).
#[cold]
#[inline(never)]
fn exempt(shared: &Shared, key: &str, info: &RequestInfo<'_>) -> bool {
    let Some(ex) = &shared.exempt else {
        return false;
    };
    let by_key = ex.keys.contains(key);
    let by_net = !by_key
        && !ex.networks.is_empty()
        && ex
            .client
            .client_addr(info)
            .is_some_and(|ip| ex.networks.iter().any(|n| n.contains(&ip)));
    if by_key || by_net {
        crate::metrics::exempt();
    }
    by_key || by_net
}

#[cold]
#[inline(never)]
fn unknown<ResBody: From<Bytes>>(shared: &Shared) -> Verdict<Response<ResBody>> {
    Verdict::Answer(response::key_problem(
        shared.unknown_key,
        "unknown client key",
    ))
}

/// A request on a shared store: the question as a future.
#[cfg(feature = "distributed")]
#[inline(never)]
fn ask_remote<ResBody: From<Bytes> + Send + 'static>(
    shared: &Arc<Shared>,
    remote: &dyn crate::remote::Remote,
    key: &str,
    plan: Plan,
    cost: u64,
    grpc: bool,
) -> Pending<Response<ResBody>> {
    let asked = match remote.ask(key, &plan, cost) {
        Ok(f) => f,
        Err(e) => {
            return Ok(failed(
                shared,
                (&plan, crate::metrics::CLIENT),
                key,
                cost,
                grpc,
                e,
            ));
        }
    };
    let (shared, key) = (Arc::clone(shared), key.to_owned());
    Err(Box::pin(async move {
        let answered = asked.await;
        observe_breaker(&shared);
        match answered {
            Ok(answer) => response::verdict(&shared, &plan, &answer, cost, || grpc),
            Err(e) => failed(
                &shared,
                (&plan, crate::metrics::CLIENT),
                &key,
                cost,
                grpc,
                e,
            ),
        }
    }))
}

/// Reports the shared store's circuit breaker when a request sees it change.
#[cfg(feature = "distributed")]
fn observe_breaker(shared: &Shared) {
    if let Store::Remote(remote) = &shared.store {
        shared.breaker.observe(remote.circuit_open());
    }
}

/// Where a limit's buckets are: the client's plan's store, or a further limit's.
#[derive(Clone, Copy)]
enum Target {
    Client,
    Limit(usize),
}

/// A limit's buckets when they are in this process (`None`: the shared store).
fn local_of(shared: &Shared, target: Target) -> Option<&crate::store::Local> {
    match target {
        Target::Client => match &shared.store {
            Store::Local(local) => Some(local),
            #[cfg(feature = "distributed")]
            Store::Remote(_) => None,
        },
        Target::Limit(i) => shared.limits[i].local.as_ref(),
    }
}

/// The question to a limit's store, about `key` under `plan`: consume `cost` (`take`), or
/// only say what consuming it would answer (`!take`: asked of leased buckets alone, which
/// are never in this process).
async fn ask(
    shared: &Shared,
    target: Target,
    key: &str,
    plan: &Plan,
    cost: u64,
    take: bool,
) -> Result<Answer, StoreError> {
    if let Some(local) = local_of(shared, target) {
        return local.ask(key, plan, cost);
    }
    #[cfg(feature = "distributed")]
    if let Store::Remote(remote) = &shared.store {
        let asked = if take {
            remote.ask(key, plan, cost)
        } else {
            remote.look(key, plan, cost)
        };
        let answered = asked?.await;
        observe_breaker(shared);
        return answered;
    }
    let _ = take;
    Err(StoreError::Other("no store for a limit".into()))
}

/// Whether a limit's buckets lease (on a shared store, by their plan or the manager).
fn leases(shared: &Shared, target: Target, plan: &Plan) -> bool {
    if local_of(shared, target).is_some() {
        return false;
    }
    match &shared.store {
        #[cfg(feature = "distributed")]
        Store::Remote(remote) => remote.leases(plan),
        _ => {
            let _ = plan;
            false
        }
    }
}

/// Gives `cost` back to `key`'s bucket of `plan` in a limit's store (a request another
/// limit refused). A failure is logged and counted: those tokens stay taken.
async fn give_back(shared: &Shared, target: Target, key: &str, plan: &Plan, cost: u64) {
    let result = match local_of(shared, target) {
        Some(local) => local.give_back(key, cost),
        #[cfg(feature = "distributed")]
        None => match &shared.store {
            Store::Remote(remote) => remote.give_back(key, plan, cost).await,
            Store::Local(_) => Ok(()),
        },
        #[cfg(not(feature = "distributed"))]
        None => Ok(()),
    };
    if let Err(e) = result {
        crate::metrics::give_back_failed();
        tracing::warn!(error = ?e, limit = plan.name(), tokens = cost, "giving tokens back failed");
    }
}

/// A limit asked about a request: where its bucket is, its key and plan, and the store's
/// answer with whether it took the cost.
struct Question {
    target: Target,
    bucket: String,
    plan: Plan,
    answer: Option<(Answer, bool)>,
}

/// A request several limits apply to: the limits whose buckets do not lease are asked first,
/// in a fixed order (the client's plan, then the further limits in the order they were
/// added), each consuming `cost`; then the leased ones in the same order, each consuming
/// `cost` only while no limit refused the request, and otherwise only read (what consuming
/// would answer, computed on the bucket as read). When one that is not in shadow mode
/// refused, every token taken is given back. So a leased bucket — a hot key served from its
/// lease — is not charged for a request another limit refuses, nor given tokens back, which
/// would be a round trip that ends its lease. The answers are those of every limit consuming
/// in turn; they are listed in the fixed order. See docs/http.md for the guarantee under
/// concurrency.
async fn decide_many<ResBody: From<Bytes> + Send + 'static>(
    shared: Arc<Shared>,
    key: String,
    plan: Plan,
    cost: u64,
    limits: Vec<usize>,
    grpc: bool,
) -> Verdict<Response<ResBody>> {
    let mut asked: Vec<Question> = core::iter::once((Target::Client, key.clone(), plan))
        .chain(limits.iter().map(|&i| {
            let l = &shared.limits[i].limit;
            (Target::Limit(i), l.key(&key), l.plan().clone())
        }))
        .map(|(target, bucket, plan)| Question {
            target,
            bucket,
            plan,
            answer: None,
        })
        .collect();
    let leased: Vec<bool> = asked
        .iter()
        .map(|a| leases(&shared, a.target, &a.plan))
        .collect();
    let order = (0..asked.len())
        .filter(|&i| !leased[i])
        .chain((0..asked.len()).filter(|&i| leased[i]));
    let mut refused = false;
    for i in order {
        let a = &asked[i];
        let take = !(refused && leased[i]);
        match ask(&shared, a.target, &a.bucket, &a.plan, cost, take).await {
            Ok(answer) => {
                refused |= response::blocks(&shared, &a.plan, &answer);
                asked[i].answer = Some((answer, take));
            }
            Err(e) => {
                give_back_all(&shared, &asked, cost).await;
                let a = &asked[i];
                let limit = match a.target {
                    Target::Client => crate::metrics::CLIENT,
                    Target::Limit(_) => a.plan.name(),
                };
                return failed(&shared, (&a.plan, limit), &key, cost, grpc, e);
            }
        }
    }
    if refused {
        give_back_all(&shared, &asked, cost).await;
    }
    let views: Vec<response::Asked<'_>> = asked
        .iter()
        .filter_map(|a| {
            let (answer, _) = a.answer.as_ref()?;
            Some(response::Asked {
                plan: &a.plan,
                answer,
            })
        })
        .collect();
    response::verdict_many(&shared, &views, cost, grpc)
}

/// Gives `cost` back to every bucket that took it.
async fn give_back_all(shared: &Shared, asked: &[Question], cost: u64) {
    for a in asked {
        if let Some((answer, true)) = &a.answer
            && answer.value().is_consumed()
        {
            give_back(shared, a.target, &a.bucket, &a.plan, cost).await;
        }
    }
}

/// A store that did not answer: the failure policy for a store that cannot decide, a 500
/// for one that failed otherwise. The store's error goes to the logs (without the key, which
/// may be a credential), never into the answer; at most one event a second per layer.
#[cold]
#[inline(never)]
fn failed<ResBody: From<Bytes>>(
    shared: &Shared,
    (plan, limit): (&Plan, &str),
    key: &str,
    cost: u64,
    grpc: bool,
    e: StoreError,
) -> Verdict<Response<ResBody>> {
    crate::metrics::store_error(plan.name(), limit, e.kind());
    let (why, e) = match e {
        StoreError::Unavailable(e) => (Unavailable::Store, e),
        StoreError::Full(e) => (Unavailable::Full, e),
        StoreError::Key => {
            return Verdict::Answer(response::key_problem(
                shared.missing_key,
                "the client key is too long",
            ));
        }
        StoreError::UnknownKey => return unknown(shared),
        StoreError::Unreadable(e) => return internal(shared, &*e, Failed::Unreadable),
        StoreError::Other(e) => return internal(shared, &*e, Failed::Other),
    };
    if let Some(held) = shared.log_gate.admit() {
        tracing::warn!(
            error = %e,
            similar_before = held,
            "rate-limit store cannot decide; the failure policy answers"
        );
    }
    match shared.failure.decide(key, cost) {
        Decided::Error => {
            crate::metrics::failure_policy(plan.name(), limit, "error");
            Verdict::Answer(response::unavailable(why))
        }
        Decided::Deny => {
            crate::metrics::failure_policy(plan.name(), limit, "deny");
            Verdict::Answer(response::denied_on_failure())
        }
        Decided::Fallback(answer) => match shared.failure.plan() {
            Some(fallback) => {
                let decision = if answer.value().is_consumed() {
                    "fallback_allowed"
                } else {
                    "fallback_refused"
                };
                crate::metrics::failure_policy(plan.name(), limit, decision);
                response::verdict(shared, fallback, &answer, cost, || grpc)
            }
            None => Verdict::Answer(response::denied_on_failure()),
        },
    }
}

/// A store error no retry mends: the detail to the logs, a 500 that says what happened in
/// the client's terms.
fn internal<ResBody: From<Bytes>>(
    shared: &Shared,
    e: &(dyn core::error::Error + Send + Sync),
    what: Failed,
) -> Verdict<Response<ResBody>> {
    if let Some(held) = shared.log_gate.admit() {
        tracing::error!(error = %e, similar_before = held, "rate-limit store failed; answered 500");
    }
    Verdict::Answer(response::internal_error(what))
}
