//! The rate-limiting service: one path per request — the key and the cost read once, one
//! consumption in the store, one verdict.

use core::fmt;
use core::task::{Context, Poll};
use std::sync::Arc;

use bucket4rs_distributed::{BackendErrorKind, Decision, DistributedError};
use bucket4rs_local::KeyedError;
use bytes::Bytes;
use http::{Request, Response};
use tower::Service;

use crate::future::ResponseFuture;
use crate::key::RequestInfo;
use crate::layer::Shared;
use crate::plan::Plan;
use crate::response::{self, Failed, Unavailable, Verdict};
use crate::store::{
    BoxFuture, Decided, LocalStore, PLAN_CHANGE, Plans, Remote, Store, Take, Taken, same,
};

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
        let shared = &*self.shared;
        let decision = {
            let info = RequestInfo::new(&req);
            match shared.key.extract(&info) {
                None => Err(response::key_problem(
                    shared.missing_key,
                    "the request carries no usable client key",
                )),
                Some(key) => {
                    let cost = (shared.cost)(&info);
                    Ok(match &shared.store {
                        Store::Local(keyed) => Ok(decide_local(shared, keyed, &key, cost)),
                        Store::Remote(remote) => decide_remote(&self.shared, &**remote, &key, cost),
                    })
                }
            }
        };
        match decision {
            Ok(Ok(Verdict::Allow(headers))) => {
                ResponseFuture::calling(self.inner.call(req), headers)
            }
            Ok(Ok(Verdict::Answer(resp))) | Err(resp) => ResponseFuture::ready(resp),
            Ok(Err(verdict)) => {
                // The clone is not necessarily ready: keep the one that was polled.
                let fresh = self.inner.clone();
                let inner = core::mem::replace(&mut self.inner, fresh);
                ResponseFuture::deciding(verdict, inner, req)
            }
        }
    }
}

/// The plan of `key`, if the resolver knows it.
fn resolve(shared: &Shared, key: &str) -> Option<Plan> {
    shared.plans.as_ref().and_then(|p| p.resolve(key))
}

#[cold]
#[inline(never)]
fn unknown<ResBody: From<Bytes>>(shared: &Shared) -> Verdict<Response<ResBody>> {
    Verdict::Answer(response::key_problem(
        shared.unknown_key,
        "unknown client key",
    ))
}

/// A request on the in-process store, decided at once: one [`Take`] on the key's bucket
/// (whose plan, with fixed plans, is read off the bucket: one lookup of the key).
#[inline]
fn decide_local<ResBody: From<Bytes>>(
    shared: &Shared,
    keyed: &LocalStore,
    key: &str,
    cost: u64,
) -> Verdict<Response<ResBody>> {
    if cost == 0 {
        return unmetered(shared, key);
    }
    let resolved;
    let plans = match &shared.fixed {
        Some(fixed) => Plans::Fixed(fixed),
        None => match resolve(shared, key) {
            Some(plan) => {
                resolved = plan;
                Plans::One(&resolved)
            }
            None => return unknown(shared),
        },
    };
    match keyed.execute(key, Take { cost, plans }) {
        Ok(Taken::Decided(d)) => response::verdict(&d, cost, shared.remaining_header),
        other => local_otherwise(shared, keyed, key, cost, other),
    }
}

/// A request that costs nothing is not metered, but its key must be known.
#[cold]
#[inline(never)]
fn unmetered<ResBody: From<Bytes>>(shared: &Shared, key: &str) -> Verdict<Response<ResBody>> {
    match resolve(shared, key) {
        Some(_) => Verdict::Allow(None),
        None => unknown(shared),
    }
}

/// The in-process store's other answers: the cost beyond the plan, a bucket under another
/// configuration (switched to the key's plan, then asked again), an unknown key, a full store.
#[cold]
#[inline(never)]
fn local_otherwise<ResBody: From<Bytes>>(
    shared: &Shared,
    keyed: &LocalStore,
    key: &str,
    cost: u64,
    taken: Result<Taken<'_>, KeyedError>,
) -> Verdict<Response<ResBody>> {
    match taken {
        Ok(Taken::Decided(d)) => response::verdict(&d, cost, shared.remaining_header),
        Ok(Taken::TooCostly(plan)) => Verdict::Answer(response::cost_exceeds_capacity(plan, cost)),
        Ok(Taken::Stale) => {
            // Not one of the fixed plans' configurations (by identity): the key's plan, by
            // value, may still be the bucket's configuration (set through `local_store`, say).
            // Otherwise the key changed plan, or the plans did: the bucket follows the plan in
            // force, its tokens carried over, and the request is decided under it. A cost
            // beyond the plan switches nothing.
            let Some(plan) = resolve(shared, key) else {
                return unknown(shared);
            };
            if cost > plan.min_capacity() {
                return Verdict::Answer(response::cost_exceeds_capacity(&plan, cost));
            }
            let take = Take {
                cost,
                plans: Plans::One(&plan),
            };
            let switched = match keyed.execute(key, take) {
                Ok(Taken::Stale) => keyed
                    .replace_configuration(key, plan.configuration().clone(), PLAN_CHANGE)
                    .and_then(|()| keyed.execute(key, take)),
                other => other,
            };
            match switched {
                Ok(Taken::Decided(d)) => response::verdict(&d, cost, shared.remaining_header),
                Ok(Taken::TooCostly(plan)) => {
                    Verdict::Answer(response::cost_exceeds_capacity(plan, cost))
                }
                // Changed again meanwhile, by another request: it decided; this one is told
                // to come back.
                Ok(Taken::Stale) => Verdict::Answer(response::unavailable(Unavailable::Busy)),
                Err(e) => local_error(shared, key, cost, e),
            }
        }
        Err(e) => local_error(shared, key, cost, e),
    }
}

/// An in-process store's error: an unknown key, or a full store (the failure policy decides).
fn local_error<ResBody: From<Bytes>>(
    shared: &Shared,
    key: &str,
    cost: u64,
    e: KeyedError,
) -> Verdict<Response<ResBody>> {
    match e {
        KeyedError::UnknownKey => unknown(shared),
        KeyedError::TooManyKeys { .. } => {
            let e = DistributedError::Backend(bucket4rs_distributed::BackendError::new(
                bucket4rs_distributed::BackendErrorKind::CapacityExhausted,
                e.to_string(),
            ));
            on_failure(shared, key, cost, e)
        }
        e => failed(shared, &e, Failed::Other),
    }
}

/// A store error no retry mends: the detail to the logs (the key stays out of them: it may
/// be a credential), a 500 that says what happened in the client's terms.
#[cold]
#[inline(never)]
fn failed<ResBody: From<Bytes>>(
    shared: &Shared,
    e: &dyn std::error::Error,
    what: Failed,
) -> Verdict<Response<ResBody>> {
    if let Some(held) = shared.log_gate.admit() {
        tracing::error!(error = %e, similar_before = held, "rate-limit store failed; answered 500");
    }
    Verdict::Answer(response::internal_error(what))
}

/// What the failure policy makes of a store that cannot decide. The store's error goes to
/// the logs (without the key, which may be a credential), never into the answer.
#[cold]
#[inline(never)]
fn on_failure<ResBody: From<Bytes>>(
    shared: &Shared,
    key: &str,
    cost: u64,
    e: DistributedError,
) -> Verdict<Response<ResBody>> {
    let why = match &e {
        DistributedError::Backend(b) if b.kind() == BackendErrorKind::CapacityExhausted => {
            Unavailable::Full
        }
        _ => Unavailable::Store,
    };
    if let Some(held) = shared.log_gate.admit() {
        tracing::warn!(
            error = %e,
            similar_before = held,
            "rate-limit store cannot decide; the failure policy answers"
        );
    }
    match shared.failure.on_failure(key.as_bytes(), cost, e) {
        Ok(d) if d.is_allowed() => Verdict::Allow(None),
        Ok(Decision::DeniedOnFailure | Decision::Fallback(false)) => {
            Verdict::Answer(response::denied_on_failure())
        }
        Ok(_) | Err(_) => Verdict::Answer(response::unavailable(why)),
    }
}

/// A request on a shared store: the answers that need no round trip at once, the
/// consumption as a future.
#[inline(never)]
fn decide_remote<ResBody: From<Bytes> + Send + 'static>(
    shared: &Arc<Shared>,
    remote: &dyn Remote,
    key: &str,
    cost: u64,
) -> Result<Verdict<Response<ResBody>>, BoxFuture<Verdict<Response<ResBody>>>> {
    if cost == 0 {
        return Ok(unmetered(shared, key));
    }
    let Some(plan) = resolve(shared, key) else {
        return Ok(unknown(shared));
    };
    if cost > plan.min_capacity() {
        return Ok(Verdict::Answer(response::cost_exceeds_capacity(
            &plan, cost,
        )));
    }
    let consumption = match remote.consume(key, &plan, cost) {
        Ok(f) => f,
        Err(_) => {
            return Ok(Verdict::Answer(response::key_problem(
                shared.missing_key,
                "the client key is too long",
            )));
        }
    };
    let (shared, key) = (Arc::clone(shared), key.to_owned());
    Err(Box::pin(async move {
        match consumption.await {
            Ok(v) => {
                let stale;
                let decided_under = if same(v.configuration(), plan.configuration()) {
                    &plan
                } else {
                    // What decided: the bucket's configuration (now switched to the plan's).
                    stale = Plan::new(plan.name().to_owned(), v.configuration().clone());
                    &stale
                };
                let d = Decided {
                    plan: decided_under,
                    probe: *v.value(),
                    after: v.state().clone(),
                    now: v.now_nanos(),
                };
                response::verdict(&d, cost, shared.remaining_header)
            }
            Err(e) if e.is_unavailable() => on_failure(&shared, &key, cost, e),
            Err(DistributedError::Key(_)) => Verdict::Answer(response::key_problem(
                shared.missing_key,
                "the client key is too long",
            )),
            Err(e @ DistributedError::Format(_)) => failed(&shared, &e, Failed::Unreadable),
            Err(e) => failed(&shared, &e, Failed::Other),
        }
    }))
}
