//! Every Bucket4j conformance trace replayed through the layer.
//!
//! A trace's consumptions (`try_consume(n)`, `try_consume_and_return_remaining(n)`) are
//! requests of cost `n` (header `x-cost`) on one client key: the layer consumes, and its
//! answer is checked against the exact values read afterwards from the store it consumed
//! from (200 ↔ consumed, 429 or 500 ↔ not; `X-Rate-Limit-Remaining` = the remaining tokens;
//! `Retry-After` = the wait rounded up to whole seconds, at least 1). The probe the trace
//! expects is built from those values, so a layer that consumed when Bucket4j would not (or
//! the reverse) fails the trace, and so does a response that disagrees with the store. Every
//! other operation goes to the same store directly; a replaced configuration becomes the
//! key's plan, so that the layer finds the bucket under its current plan. On a remote store
//! the traces run twice: once as they are, once with every bucket leasing (one process: a
//! leased bucket answers exactly as an unleased one).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bucket4rs_core::ops;
use bucket4rs_core::{BucketConfiguration, ConsumptionProbe, EstimationProbe, ManualClock};
use bucket4rs_distributed::{EmbeddedBackend, Leasing, ProxyManager, RemoteBucket, TimeSource};
use bucket4rs_test::{Engine, Op, outcome, replay_all, replay_all_monotonic};
use bucket4rs_tower::{LocalStore, Plan, RateLimitLayer, RequestInfo};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use serde_json::Value;
use tokio::runtime::Runtime;
use tower::{Layer, ServiceExt};

/// The client key every step runs on.
const KEY: &str = "trace";
/// A client key that makes one request at the start and none after (its bucket must not
/// change when a step fails).
const BYSTANDER: &str = "bystander";
/// The in-process store's key cap: room for the two keys.
const MAX_KEYS: usize = 4;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The request's cost: its `x-cost` header.
fn cost(req: &RequestInfo<'_>) -> u64 {
    req.headers()
        .get("x-cost")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("every request carries its cost")
}

/// The key's plan of the moment (the trace's configuration, replaced by its steps), shared
/// by the engine and the layer's resolver; counts the resolver's calls.
#[derive(Clone)]
struct Current {
    plan: Arc<Mutex<Plan>>,
    resolves: Arc<AtomicUsize>,
}

impl Current {
    fn new(config: BucketConfiguration) -> Self {
        Self {
            plan: Arc::new(Mutex::new(Plan::new("trace", config))),
            resolves: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn get(&self) -> Plan {
        self.plan.lock().expect("not poisoned").clone()
    }

    fn set(&self, config: BucketConfiguration) {
        *self.plan.lock().expect("not poisoned") = Plan::new("trace", config);
    }

    fn resolve(&self) -> Option<Plan> {
        self.resolves.fetch_add(1, Ordering::SeqCst);
        Some(self.get())
    }
}

/// Where the layer's buckets are, seen by the engine.
enum Target {
    /// The layer's in-process store (`layer.local_store()`).
    Local,
    /// A remote store: the key's bucket (and the bystander's) through the layer's manager.
    Remote {
        manager: ProxyManager<EmbeddedBackend>,
        bucket: RemoteBucket<EmbeddedBackend>,
        bystander: RemoteBucket<EmbeddedBackend>,
    },
}

/// The layer under test, with the store it consumes from.
struct LayerEngine<'r> {
    layer: RateLimitLayer,
    current: Current,
    /// Whether a step replaced the configuration (the fixed plans no longer hold it).
    replaced: bool,
    target: Target,
    /// Whether the remote buckets lease (their records then hold less than the buckets: the
    /// leases are out).
    leased: bool,
    clock: ManualClock,
    rt: &'r Runtime,
    /// Requests answered 500 (cost beyond the plan's capacity) that Bucket4j would have
    /// consumed, the bucket holding force-added tokens beyond its capacity.
    beyond: Arc<AtomicUsize>,
}

/// What the store says about the key right after a request.
struct Exact {
    /// Tokens available (negative in debt).
    available: i64,
    /// Until every bandwidth is full.
    until_full: u64,
    /// The estimate of a request of the same cost.
    estimate: EstimationProbe,
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<'r> LayerEngine<'r> {
    /// The layer on the in-process store on `clock`, the key's bucket created now.
    fn local(
        rt: &'r Runtime,
        beyond: &Arc<AtomicUsize>,
        config: BucketConfiguration,
        clock: ManualClock,
    ) -> Result<Self, String> {
        let current = Current::new(config);
        let builder = RateLimitLayer::builder()
            .clock(clock.clone())
            .max_keys(MAX_KEYS);
        let c = current.clone();
        let builder = builder.plans(move |_: &str| c.resolve());
        let layer = builder
            .cost(cost)
            .remaining_header(true)
            .build()
            .map_err(text)?;
        let store = layer
            .local_store()
            .ok_or("the layer has no in-process store")?;
        // A trace's bucket exists from its start; a key's is created at its first use.
        store.available_tokens(KEY).map_err(text)?;
        let mut engine = Self {
            layer,
            current,
            replaced: false,
            target: Target::Local,
            leased: false,
            clock,
            rt,
            beyond: Arc::clone(beyond),
        };
        engine.bystander()?;
        Ok(engine)
    }

    /// The layer on a `ProxyManager<EmbeddedBackend>` whose backend runs on `clock`.
    fn remote(
        rt: &'r Runtime,
        beyond: &Arc<AtomicUsize>,
        config: BucketConfiguration,
        clock: ManualClock,
    ) -> Result<Self, String> {
        let manager = ProxyManager::new(EmbeddedBackend::with_clock(clock.clone()));
        Self::shared(rt, beyond, config, clock, manager, false)
    }

    /// [`remote`](Self::remote) with every bucket leasing: the plans the layer resolves (and
    /// the buckets the engine reads, through the manager's setting), the leases' views on
    /// `clock`.
    fn leased(
        rt: &'r Runtime,
        beyond: &Arc<AtomicUsize>,
        config: BucketConfiguration,
        clock: ManualClock,
    ) -> Result<Self, String> {
        let manager = ProxyManager::configure(EmbeddedBackend::with_clock(clock.clone()))
            .time_source(TimeSource::client(clock.clone()))
            .leasing(Leasing::new())
            .build()
            .map_err(text)?;
        Self::shared(rt, beyond, config, clock, manager, true)
    }

    fn shared(
        rt: &'r Runtime,
        beyond: &Arc<AtomicUsize>,
        config: BucketConfiguration,
        clock: ManualClock,
        manager: ProxyManager<EmbeddedBackend>,
        leased: bool,
    ) -> Result<Self, String> {
        let current = Current::new(config);
        let c = current.clone();
        let layer = RateLimitLayer::builder()
            .backend(manager.clone())
            .plans(move |_: &str| {
                let plan = c.resolve()?;
                Some(if leased {
                    plan.with_leasing(Leasing::new()).expect("valid settings")
                } else {
                    plan
                })
            })
            .cost(cost)
            .remaining_header(true)
            .build()
            .map_err(text)?;
        if layer.local_store().is_some() {
            return Err("a remote layer has an in-process store".into());
        }
        // As the layer's: the configuration of the key's current plan.
        let bucket_of = |key: &str| {
            let c = current.clone();
            manager
                .builder()
                .build(key, move || c.get().configuration().clone())
                .map_err(text)
        };
        let (bucket, bystander) = (bucket_of(KEY)?, bucket_of(BYSTANDER)?);
        rt.block_on(bucket.available_tokens()).map_err(text)?;
        let mut engine = Self {
            layer,
            current,
            replaced: false,
            target: Target::Remote {
                manager,
                bucket,
                bystander,
            },
            leased,
            clock,
            rt,
            beyond: Arc::clone(beyond),
        };
        engine.bystander()?;
        Ok(engine)
    }

    fn store(&self) -> &LocalStore {
        self.layer
            .local_store()
            .expect("an in-process engine's layer has its store")
    }

    /// The bystander's one request.
    fn bystander(&mut self) -> Result<(), String> {
        let r = self.request(BYSTANDER, 1);
        match r.status() {
            StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => Ok(()),
            s => Err(format!("the bystander's request was answered {s}")),
        }
    }

    /// A request of `cost` on `key` through the layer.
    fn request(&self, key: &str, cost: u64) -> Response<Bytes> {
        let svc = self.layer.layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Bytes::from_static(b"served")))
        }));
        let req = Request::get("/")
            .header("x-api-key", key)
            .header("x-cost", cost)
            .body(())
            .expect("a valid request");
        match self.rt.block_on(svc.oneshot(req)) {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }

    /// The store's exact values for `key` now, and its estimate of `n` tokens.
    fn exact(&self, n: u64) -> Result<Exact, String> {
        match &self.target {
            Target::Local => {
                let store = self.store();
                let v = store.as_verbose().available_tokens(KEY).map_err(text)?;
                Ok(Exact {
                    available: *v.value(),
                    until_full: nanos(v.time_until_full()),
                    estimate: store.estimate_ability_to_consume(KEY, n).map_err(text)?,
                })
            }
            Target::Remote { bucket, .. } => self.rt.block_on(async {
                let v = bucket.as_verbose().available_tokens().await.map_err(text)?;
                Ok(Exact {
                    available: *v.value(),
                    until_full: nanos(v.time_until_full()),
                    estimate: bucket.estimate_ability_to_consume(n).await.map_err(text)?,
                })
            }),
        }
    }

    /// `try_consume_and_return_remaining(n)` as a request of cost `n`: the probe, from the
    /// layer's answer and the store's exact values, which must agree.
    fn consume(&mut self, n: u64) -> Result<ConsumptionProbe, String> {
        let before = self.snapshot();
        let r = self.request(KEY, n);
        // Before the probes below (a remote bucket's first read stores its record).
        let after = self.snapshot();
        let header = |name: &str| {
            r.headers()
                .get(name)
                .map(|v| v.to_str().unwrap_or("<not text>").to_owned())
        };
        if n == 0 {
            // Bucket4j refuses zero tokens; the layer lets a request of cost 0 through
            // unmetered. The runner, which expects the error, checks that nothing changed.
            let metered = ["ratelimit-policy", "ratelimit", "x-rate-limit-remaining"]
                .iter()
                .any(|h| header(h).is_some());
            assert!(
                r.status() == StatusCode::OK && !metered && r.body() == "served",
                "a request of cost 0 must pass unmetered, got {} {:?}",
                r.status(),
                r.headers()
            );
            return Err("zero tokens: let through unmetered by the layer".into());
        }
        let plan = self.current.get();
        let exact = self.exact(n)?;
        let est = exact.estimate;
        let disagree = |what: String| Err(format!("layer disagrees with the store: {what}"));
        let remaining = header("x-rate-limit-remaining");
        match r.status() {
            StatusCode::OK => {
                if r.body() != "served" {
                    return disagree("200 without the inner service's answer".into());
                }
                let Some(remaining) = remaining.and_then(|v| v.parse::<u64>().ok()) else {
                    return disagree("200 without X-Rate-Limit-Remaining".into());
                };
                if i128::from(remaining) != i128::from(exact.available) {
                    return disagree(format!(
                        "200 with X-Rate-Limit-Remaining {remaining}, the store has {} left",
                        exact.available
                    ));
                }
                if header("ratelimit-policy").as_deref() != plan.policy_header().to_str().ok() {
                    return disagree(format!(
                        "200 with policy {:?}, the plan's is {:?}",
                        header("ratelimit-policy"),
                        plan.policy_header()
                    ));
                }
                if header("ratelimit").is_none() || header("retry-after").is_some() {
                    return disagree(format!("200 with headers {:?}", r.headers()));
                }
                Ok(ConsumptionProbe::new(true, remaining, 0, exact.until_full))
            }
            StatusCode::TOO_MANY_REQUESTS => {
                if est.can_be_consumed() {
                    return disagree(format!("429, the store could consume {n} now"));
                }
                if remaining != Some(est.remaining_tokens().to_string()) {
                    return disagree(format!(
                        "429 with X-Rate-Limit-Remaining {remaining:?}, the store has {}",
                        est.remaining_tokens()
                    ));
                }
                let retry = (est.wait_for_refill().as_nanos() as u64)
                    .div_ceil(1_000_000_000)
                    .max(1);
                if header("retry-after") != Some(retry.to_string()) {
                    return disagree(format!(
                        "429 with Retry-After {:?}, the store waits {} ns",
                        header("retry-after"),
                        est.wait_for_refill().as_nanos() as u64
                    ));
                }
                let body: Value = serde_json::from_slice(r.body()).map_err(text)?;
                let expected = serde_json::json!({
                    "retry_after": retry, "cost": n,
                    "remaining": est.remaining_tokens(), "plan": plan.name(),
                });
                for (field, value) in expected.as_object().into_iter().flatten() {
                    if &body[field] != value {
                        return disagree(format!("429 body {body}, expected {field} = {value}"));
                    }
                }
                if header("ratelimit-policy").as_deref() != plan.policy_header().to_str().ok() {
                    return disagree(format!("429 with headers {:?}", r.headers()));
                }
                Ok(ConsumptionProbe::new(
                    false,
                    est.remaining_tokens(),
                    est.wait_for_refill().as_nanos() as u64,
                    exact.until_full,
                ))
            }
            StatusCode::INTERNAL_SERVER_ERROR => {
                // The cost beyond the plan's capacity: a configuration error of the service.
                if n <= plan.min_capacity() {
                    return disagree(format!(
                        "500 for a cost of {n} within the capacity {}: {:?}",
                        plan.min_capacity(),
                        r.body()
                    ));
                }
                let body: Value = serde_json::from_slice(r.body()).map_err(text)?;
                let detail = body["detail"].as_str().unwrap_or_default();
                if !detail.starts_with("cost exceeds capacity")
                    || body["capacity"] != plan.min_capacity()
                    || header("ratelimit").is_some()
                {
                    return disagree(format!("500 {body} with headers {:?}", r.headers()));
                }
                if after != before {
                    return disagree(format!("500 changed the bucket:\n{before}\n{after}"));
                }
                if est.can_be_consumed() {
                    // The bucket holds force-added tokens beyond its capacity: Bucket4j
                    // consumes, the layer answers its configuration error by design. The
                    // step is then run on the store, so the trace goes on.
                    self.beyond.fetch_add(1, Ordering::SeqCst);
                    return match &self.target {
                        Target::Local => self
                            .store()
                            .try_consume_and_return_remaining(KEY, n)
                            .map_err(text),
                        Target::Remote { bucket, .. } => self
                            .rt
                            .block_on(bucket.try_consume_and_return_remaining(n))
                            .map_err(text),
                    };
                }
                Ok(ConsumptionProbe::new(
                    false,
                    est.remaining_tokens(),
                    est.wait_for_refill().as_nanos() as u64,
                    exact.until_full,
                ))
            }
            s => disagree(format!("answered {s}: {:?}", r.body())),
        }
    }

    /// Any other operation, on the layer's store directly.
    fn direct(&mut self, op: &Op) -> Result<Value, String> {
        let clock = self.clock.clone();
        match &self.target {
            Target::Local => {
                let b = self.store();
                Ok(match op {
                    Op::TryConsume(_) | Op::TryConsumeAndReturnRemaining(_) => {
                        unreachable!("through the layer")
                    }
                    Op::EstimateAbilityToConsume(n) => {
                        outcome::estimate(&b.estimate_ability_to_consume(KEY, *n).map_err(text)?)
                    }
                    Op::TryConsumeAsMuchAsPossible(l) => Value::from(
                        b.execute(KEY, ops::TryConsumeAsMuchAsPossible(*l))
                            .map_err(text)?,
                    ),
                    Op::AddTokens(n) => {
                        b.add_tokens(KEY, *n).map_err(text)?;
                        outcome::unit()
                    }
                    Op::ForceAddTokens(n) => {
                        b.force_add_tokens(KEY, *n).map_err(text)?;
                        outcome::unit()
                    }
                    Op::Reset => {
                        b.reset(KEY).map_err(text)?;
                        outcome::unit()
                    }
                    Op::AvailableTokens => Value::from(b.available_tokens(KEY).map_err(text)?),
                    Op::ConsumeIgnoringRateLimits(n) => Value::from(
                        b.execute(KEY, ops::ConsumeIgnoringRateLimits(*n))
                            .map_err(text)?,
                    ),
                    Op::ReplaceConfiguration(c, s) => {
                        b.replace_configuration(KEY, c.clone(), *s).map_err(text)?;
                        self.current.set(c.clone());
                        self.replaced = true;
                        outcome::unit()
                    }
                    Op::BlockingTryConsume {
                        tokens,
                        max_wait_nanos,
                    } => {
                        let parked = b
                            .execute(
                                KEY,
                                ops::Reserve {
                                    tokens: *tokens,
                                    max_wait_nanos: *max_wait_nanos,
                                },
                            )
                            .map_err(text)?;
                        if let Some(w) = parked {
                            clock.advance_nanos(w as i64);
                        }
                        outcome::blocking_try(parked)
                    }
                    Op::BlockingConsume(n) => {
                        let w = b
                            .execute(KEY, ops::ConsumeIgnoringRateLimits(*n))
                            .map_err(text)?;
                        clock.advance_nanos(w as i64);
                        outcome::blocking(w)
                    }
                })
            }
            Target::Remote { bucket: b, .. } => {
                let current = &self.current;
                let replaced = &mut self.replaced;
                self.rt.block_on(async {
                    Ok(match op {
                        Op::TryConsume(_) | Op::TryConsumeAndReturnRemaining(_) => {
                            unreachable!("through the layer")
                        }
                        Op::EstimateAbilityToConsume(n) => outcome::estimate(
                            &b.estimate_ability_to_consume(*n).await.map_err(text)?,
                        ),
                        Op::TryConsumeAsMuchAsPossible(None) => {
                            Value::from(b.try_consume_as_much_as_possible().await.map_err(text)?)
                        }
                        Op::TryConsumeAsMuchAsPossible(Some(l)) => Value::from(
                            b.try_consume_as_much_as_possible_with_limit(*l)
                                .await
                                .map_err(text)?,
                        ),
                        Op::AddTokens(n) => {
                            b.add_tokens(*n).await.map_err(text)?;
                            outcome::unit()
                        }
                        Op::ForceAddTokens(n) => {
                            b.force_add_tokens(*n).await.map_err(text)?;
                            outcome::unit()
                        }
                        Op::Reset => {
                            b.reset().await.map_err(text)?;
                            outcome::unit()
                        }
                        Op::AvailableTokens => {
                            Value::from(b.available_tokens().await.map_err(text)?)
                        }
                        Op::ConsumeIgnoringRateLimits(n) => Value::from(nanos(
                            b.consume_ignoring_rate_limits(*n).await.map_err(text)?,
                        )),
                        Op::ReplaceConfiguration(c, s) => {
                            b.replace_configuration(c.clone(), *s).await.map_err(text)?;
                            current.set(c.clone());
                            *replaced = true;
                            outcome::unit()
                        }
                        Op::BlockingTryConsume {
                            tokens,
                            max_wait_nanos,
                        } => {
                            let parked = b
                                .reserve(*tokens, std::time::Duration::from_nanos(*max_wait_nanos))
                                .await
                                .map_err(text)?
                                .map(nanos);
                            if let Some(w) = parked {
                                clock.advance_nanos(w as i64);
                            }
                            outcome::blocking_try(parked)
                        }
                        Op::BlockingConsume(n) => {
                            let w = nanos(b.consume_ignoring_rate_limits(*n).await.map_err(text)?);
                            clock.advance_nanos(w as i64);
                            outcome::blocking(w)
                        }
                    })
                })
            }
        }
    }
}

impl Engine for LayerEngine<'_> {
    fn execute(&mut self, op: &Op) -> Result<Value, String> {
        let out = match op {
            Op::TryConsume(n) => Value::from(self.consume(*n)?.is_consumed()),
            Op::TryConsumeAndReturnRemaining(n) => outcome::probe(&self.consume(*n)?),
            other => self.direct(other)?,
        };
        // Whatever can be forgotten now is (as the store may do on its own at any time):
        // the next step must not notice.
        match &self.target {
            Target::Local => {
                self.store().sweep();
            }
            Target::Remote { manager, .. } => {
                manager.backend().sweep();
            }
        }
        Ok(out)
    }

    fn snapshot(&mut self) -> String {
        match &self.target {
            Target::Local => {
                let store = self.store();
                format!(
                    "{:?} / {:?}",
                    store.snapshot(KEY),
                    store.snapshot(BYSTANDER)
                )
            }
            Target::Remote {
                bucket, bystander, ..
            } if self.leased => self.rt.block_on(async {
                // What the buckets answer, not their records: a return of a lease changes
                // the record, never an answer.
                let seen = |r: Result<bucket4rs_core::VerboseResult<i64>, _>| match r {
                    Ok(r) => format!("{:?} {:?}", r.configuration(), r.state()),
                    Err(e) => format!("error: {e}"),
                };
                format!(
                    "{} / {}",
                    seen(bucket.as_verbose().available_tokens().await),
                    seen(bystander.as_verbose().available_tokens().await)
                )
            }),
            Target::Remote {
                bucket, bystander, ..
            } => self.rt.block_on(async {
                let record = |r: Result<Option<Vec<u8>>, _>| match r {
                    Ok(Some(bytes)) => format!("{bytes:02x?}"),
                    Ok(None) => "absent".to_owned(),
                    Err(e) => format!("error: {e}"),
                };
                format!(
                    "{} / {}",
                    record(bucket.raw_record().await),
                    record(bystander.raw_record().await)
                )
            }),
        }
    }
}

/// Replays every trace through the engine `build` makes, on both clocks (one that may go
/// back, and the monotonic one of production, where one-bandwidth buckets keep their
/// compact word).
fn replay_both<'r>(
    label: &str,
    rt: &'r Runtime,
    build: impl Fn(
        &'r Runtime,
        &Arc<AtomicUsize>,
        BucketConfiguration,
        ManualClock,
    ) -> Result<LayerEngine<'r>, String>,
) {
    let beyond = Arc::new(AtomicUsize::new(0));
    replay_all(label, |config, clock| build(rt, &beyond, config, clock));
    replay_all_monotonic(label, |config, clock| build(rt, &beyond, config, clock));
    println!(
        "{label}: {} requests costing more than their plan's capacity answered 500 (by \
         design) where Bucket4j consumed force-added tokens; run on the store directly",
        beyond.load(Ordering::SeqCst)
    );
}

#[test]
fn every_trace_replays_through_the_layer_with_resolved_plans() {
    let rt = runtime();
    replay_both("tower/resolved plans", &rt, |rt, beyond, config, clock| {
        LayerEngine::local(rt, beyond, config, clock)
    });
}

#[test]
fn every_trace_replays_through_the_layer_on_a_remote_store() {
    let rt = runtime();
    replay_both("tower/remote store", &rt, LayerEngine::remote);
}

#[test]
fn every_trace_replays_through_the_layer_on_a_leased_remote_store() {
    let rt = runtime();
    replay_both("tower/leased remote store", &rt, LayerEngine::leased);
}
