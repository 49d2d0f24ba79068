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
#[cfg(feature = "distributed")]
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

/// A verdict now, or one to wait for (a shared store's).
type Pending<R> = Result<Verdict<R>, BoxFuture<Verdict<R>>>;

/// The request's verdict: its key, cost and plan, then the store's answer.
#[inline]
fn decide<ReqBody, ResBody: From<Bytes> + Send + 'static>(
    shared: &Arc<Shared>,
    req: &Request<ReqBody>,
) -> Pending<Response<ResBody>> {
    let info = RequestInfo::new(req);
    let Some(key) = shared.key.extract(&info) else {
        return Ok(Verdict::Answer(response::key_problem(
            shared.missing_key,
            "the request carries no usable client key",
        )));
    };
    let cost = (shared.cost)(&info);
    let Some(plan) = shared.plans.as_ref().and_then(|p| p.resolve(&key)) else {
        return Ok(unknown(shared));
    };
    if cost == 0 {
        // Unmetered: no bucket, no headers (the key must still be known).
        return Ok(Verdict::Allow(None));
    }
    if cost > plan.min_capacity() {
        return Ok(Verdict::Answer(response::cost_exceeds_capacity(
            &plan, cost,
        )));
    }
    match &shared.store {
        Store::Local(local) => Ok(match local.ask(&key, &plan, cost) {
            Ok(answer) => response::verdict(&plan, &answer, cost, shared.remaining_header),
            Err(e) => failed(shared, &key, cost, e),
        }),
        #[cfg(feature = "distributed")]
        Store::Remote(remote) => ask_remote(shared, &**remote, &key, plan, cost),
    }
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
) -> Pending<Response<ResBody>> {
    let asked = match remote.ask(key, &plan, cost) {
        Ok(f) => f,
        Err(e) => return Ok(failed(shared, key, cost, e)),
    };
    let (shared, key) = (Arc::clone(shared), key.to_owned());
    Err(Box::pin(async move {
        match asked.await {
            Ok(answer) => response::verdict(&plan, &answer, cost, shared.remaining_header),
            Err(e) => failed(&shared, &key, cost, e),
        }
    }))
}

/// A store that did not answer: the failure policy for a store that cannot decide, a 500
/// for one that failed otherwise. The store's error goes to the logs (without the key, which
/// may be a credential), never into the answer; at most one event a second per layer.
#[cold]
#[inline(never)]
fn failed<ResBody: From<Bytes>>(
    shared: &Shared,
    key: &str,
    cost: u64,
    e: StoreError,
) -> Verdict<Response<ResBody>> {
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
        Decided::Error => Verdict::Answer(response::unavailable(why)),
        Decided::Deny => Verdict::Answer(response::denied_on_failure()),
        Decided::Fallback(answer) => fallback_verdict(shared, &answer, cost),
    }
}

/// The fallback limit's answer, as any limit's.
fn fallback_verdict<ResBody: From<Bytes>>(
    shared: &Shared,
    answer: &Answer,
    cost: u64,
) -> Verdict<Response<ResBody>> {
    match shared.failure.plan() {
        Some(plan) => response::verdict(plan, answer, cost, shared.remaining_header),
        None => Verdict::Answer(response::denied_on_failure()),
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
