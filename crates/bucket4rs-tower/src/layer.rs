//! The tower layer and its builder.

use core::fmt;
use std::sync::Arc;

use bucket4rs_core::{Clock, ConfigError};
use bucket4rs_local::{FastClock, KeyedBucket};
use http::StatusCode;
use tower::Layer;

use std::collections::HashSet;

use bytes::Bytes;
use http::Response;
use ipnet::IpNet;

use crate::client_ip::ClientIp;
use crate::key::{KeyExtractor, RequestInfo};
use crate::limit::Limit;
use crate::plan::PlanResolver;
use crate::policy::{FailurePolicy, Policy};
use crate::response::Refusal;
use crate::service::RateLimit;
use crate::store::{Local, LocalStore, SharedClock, Store};

/// The in-process store's key cap unless [`RateLimitLayerBuilder::max_keys`] says otherwise.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

type CostFn = dyn for<'a> Fn(&RequestInfo<'a>) -> u64 + Send + Sync;

/// The refusal hook: shapes the response of a refused request.
pub(crate) type RefusalHook = dyn Fn(&Refusal, &mut Response<Bytes>) + Send + Sync;

/// A further limit, with its buckets when they are in this process.
pub(crate) struct LimitStore {
    pub(crate) limit: Limit,
    pub(crate) local: Option<Local>,
}

/// The allowlist: keys and client networks let through unmetered.
pub(crate) struct Exempt {
    pub(crate) keys: HashSet<String, foldhash::fast::RandomState>,
    pub(crate) networks: Vec<IpNet>,
    /// How a request's client address is found (the key extractor's, when it reads one).
    pub(crate) client: ClientIp,
}

/// What every service of one layer shares.
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) key: KeyExtractor,
    pub(crate) plans: Option<Arc<dyn PlanResolver>>,
    pub(crate) cost: Arc<CostFn>,
    pub(crate) failure: Policy,
    pub(crate) missing_key: StatusCode,
    pub(crate) unknown_key: StatusCode,
    pub(crate) remaining_header: bool,
    /// Further limits, in the order they are asked (after the client's plan).
    pub(crate) limits: Vec<LimitStore>,
    /// Every limit in shadow mode.
    pub(crate) shadow: bool,
    pub(crate) exempt: Option<Exempt>,
    pub(crate) on_refusal: Option<Arc<RefusalHook>>,
    /// At most one log event per second for a failing store (see [`LogGate`]).
    pub(crate) log_gate: LogGate,
    /// The shared store's circuit breaker, as last reported.
    #[cfg(feature = "distributed")]
    pub(crate) breaker: crate::metrics::BreakerGauge,
}

/// Lets one event through per second and counts the ones it holds back, so a store that
/// fails under a flood of requests logs a line a second, not a line a request.
#[derive(Debug, Default)]
pub(crate) struct LogGate {
    /// The second (of a monotonic clock) of the last event let through, plus one; 0: none.
    last: std::sync::atomic::AtomicU64,
    held: std::sync::atomic::AtomicU64,
}

impl LogGate {
    /// `Some(n)`: log now, and say `n` events were held back since the last one.
    pub(crate) fn admit(&self) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let now = monotonic_secs().saturating_add(1);
        let last = self.last.load(Relaxed);
        if last != now
            && self
                .last
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            Some(self.held.swap(0, Relaxed))
        } else {
            self.held.fetch_add(1, Relaxed);
            None
        }
    }
}

/// Whole seconds since the first call in this process.
fn monotonic_secs() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs()
}

/// Builds a [`RateLimitLayer`]; from [`RateLimitLayer::builder`].
///
/// Defaults: the `X-API-Key` header as the key, no plans (every key is unknown: set
/// [`plans`](Self::plans)), cost 1, [`FailurePolicy::error`] (503 when the store cannot
/// decide), 401 for missing and unknown keys, and buckets in this process (a
/// [`KeyedBucket`] on [`FastClock`]) capped at [`DEFAULT_MAX_KEYS`] keys.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_tower::{FailurePolicy, KeyExtractor, Plan, RateLimitLayer};
/// use std::time::Duration;
/// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(20, Duration::from_secs(60))?).build()?;
/// let layer = RateLimitLayer::builder()
///     .max_keys(100_000)
///     .key(KeyExtractor::header("x-api-key"))
///     .plans(Plan::new("free", config))
///     .cost(|req| if req.uri().path().ends_with("/search") { 5 } else { 1 })
///     .failure_policy(FailurePolicy::deny())
///     .unknown_key_status(http::StatusCode::FORBIDDEN)
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct RateLimitLayerBuilder {
    /// The clock of the buckets in this process (the store's, the fallback's).
    clock: SharedClock,
    max_keys: usize,
    #[cfg(feature = "distributed")]
    remote: Option<Box<dyn crate::remote::Remote>>,
    key: KeyExtractor,
    plans: Option<Arc<dyn PlanResolver>>,
    cost: Arc<CostFn>,
    failure: FailurePolicy,
    missing_key: StatusCode,
    unknown_key: StatusCode,
    remaining_header: bool,
    limits: Vec<Limit>,
    shadow: bool,
    exempt_keys: Vec<String>,
    exempt_networks: Vec<IpNet>,
    on_refusal: Option<Arc<RefusalHook>>,
}

impl fmt::Debug for RateLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("key", &self.key)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayerBuilder {
    /// Caps the in-process store at `max_keys` keys at once: a bucket is forgotten only when
    /// a fresh one would answer the same (full again); at the cap, a new key meets the
    /// failure policy. A cap of zero is refused by [`build`](Self::build).
    ///
    /// ```
    /// # use bucket4rs_tower::{Plan, RateLimitLayer};
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// let layer = RateLimitLayer::builder().plans(Plan::new("p", config)).max_keys(10_000).build()?;
    /// assert!(RateLimitLayer::builder().max_keys(0).build().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The clock of the buckets kept in this process — the in-process store's and the
    /// fallback limit's (the default is [`FastClock`]: epoch nanoseconds advanced by the
    /// CPU's counter, never stepping back). A test passes a
    /// [`ManualClock`](bucket4rs_core::ManualClock).
    ///
    /// ```
    /// # use bucket4rs_tower::{Plan, RateLimitLayer};
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, ManualClock}; use std::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// let clock = ManualClock::monotonic(0);
    /// let layer = RateLimitLayer::builder().plans(Plan::new("p", config)).clock(clock.clone()).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock(mut self, clock: impl Clock + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Keeps the buckets behind `manager` (Redis, PostgreSQL, the embedded backend or your
    /// own), so that every instance of a service shares one limit (feature `distributed`).
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let b = bucket4rs_tower::RateLimitLayer::builder().backend(ProxyManager::new(EmbeddedBackend::new()));
    /// ```
    #[cfg(feature = "distributed")]
    pub fn backend<B: bucket4rs_distributed::Backend>(
        mut self,
        manager: bucket4rs_distributed::ProxyManager<B>,
    ) -> Self {
        self.remote = Some(Box::new(manager));
        self
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

    /// Maps keys to plans ([`Plan`](crate::Plan) for one plan for all, a `PlanTable`, or a
    /// closure).
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

    /// What happens when the store cannot decide (a remote store down, the in-process store
    /// full of keys): an error (503, the default), a denial (429), or a local fallback limit.
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().failure_policy(bucket4rs_tower::FailurePolicy::deny());
    /// ```
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The status of a request without a usable key (default 401).
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().missing_key_status(http::StatusCode::BAD_REQUEST);
    /// ```
    pub fn missing_key_status(mut self, status: StatusCode) -> Self {
        self.missing_key = status;
        self
    }

    /// The status of a request whose key has no plan (default 401).
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().unknown_key_status(http::StatusCode::FORBIDDEN);
    /// ```
    pub fn unknown_key_status(mut self, status: StatusCode) -> Self {
        self.unknown_key = status;
        self
    }

    /// Also adds Bucket4j's `X-Rate-Limit-Remaining` to metered responses (off by default).
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().remaining_header(true);
    /// ```
    pub fn remaining_header(mut self, on: bool) -> Self {
        self.remaining_header = on;
        self
    }

    /// Adds a limit every request it applies to must also pass (a global or per-route
    /// limit; see [`Limit`]). Limits are asked after the client's plan, in the order added.
    ///
    /// ```
    /// # use bucket4rs_tower::{Limit, RateLimitLayer};
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1000, Duration::from_secs(1))?).build()?;
    /// let b = RateLimitLayer::builder().limit(Limit::global("all", c));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// Shadow mode for the whole layer: every request is decided, counted and given its
    /// `RateLimit` fields as usual, and none is refused; one that would have been carries a
    /// [`ShadowRefusal`](crate::ShadowRefusal) response extension and counts as
    /// `shadow_refused`. (Per plan: [`Plan::shadow`](crate::Plan::shadow).)
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().shadow(true);
    /// ```
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// Keys let through unmetered (no bucket, no headers): internal services, monitors.
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().exempt_keys(["internal-batch-key"]);
    /// ```
    pub fn exempt_keys<I: IntoIterator<Item = S>, S: Into<String>>(mut self, keys: I) -> Self {
        self.exempt_keys.extend(keys.into_iter().map(Into::into));
        self
    }

    /// Client networks let through unmetered. The client's address is found as the key
    /// extractor finds it when it reads one ([`KeyExtractor::client`]: behind trusted
    /// proxies), else it is the peer's.
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().exempt_networks(["10.0.0.0/8".parse()?]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exempt_networks(mut self, networks: impl IntoIterator<Item = IpNet>) -> Self {
        self.exempt_networks
            .extend(networks.into_iter().map(|n| n.trunc()));
        self
    }

    /// Shapes the answer to a refused request: `hook` gets what the refusal says and the
    /// response the layer made (429 with `Retry-After`, the `RateLimit` fields and a problem
    /// body; for gRPC `grpc-status: 8`), and may change its status, headers and body.
    ///
    /// ```
    /// # use bucket4rs_tower::RateLimitLayer;
    /// let b = RateLimitLayer::builder().on_refusal(|refusal, resp| {
    ///     if !refusal.is_grpc() {
    ///         *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    ///         *resp.body_mut() = bytes::Bytes::from(format!("slow down for {} s", refusal.retry_after_secs()));
    ///     }
    /// });
    /// ```
    pub fn on_refusal(
        mut self,
        hook: impl Fn(&Refusal, &mut Response<Bytes>) + Send + Sync + 'static,
    ) -> Self {
        self.on_refusal = Some(Arc::new(hook));
        self
    }

    /// Builds the layer.
    ///
    /// # Errors
    /// [`ConfigError::ZeroMaxKeys`] for an in-process store capped at zero keys; the
    /// [`ConfigError`] of a fallback plan the layer's clock cannot run.
    ///
    /// ```
    /// # use bucket4rs_tower::{Plan, RateLimitLayer};
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// let layer = RateLimitLayer::builder().plans(Plan::new("p", config)).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        #[cfg(feature = "distributed")]
        let remote = self.remote.is_some();
        #[cfg(not(feature = "distributed"))]
        let remote = false;
        let mut limits = Vec::with_capacity(self.limits.len());
        for limit in self.limits {
            let local = if remote {
                None
            } else {
                let keyed: LocalStore = KeyedBucket::builder()
                    .with_configuration(limit.plan().configuration())
                    .with_clock(Arc::clone(&self.clock))
                    .max_keys(self.max_keys)
                    .build()?;
                Some(Local::new(keyed))
            };
            limits.push(LimitStore { limit, local });
        }
        let exempt =
            (!self.exempt_keys.is_empty() || !self.exempt_networks.is_empty()).then(|| Exempt {
                keys: self.exempt_keys.into_iter().collect(),
                networks: self.exempt_networks,
                client: self.key.client_reader().cloned().unwrap_or_default(),
            });
        #[cfg(feature = "distributed")]
        let store = match self.remote {
            Some(remote) => Store::Remote(remote),
            None => local_store(self.plans.clone(), &self.clock, self.max_keys)?,
        };
        #[cfg(not(feature = "distributed"))]
        let store = local_store(self.plans.clone(), &self.clock, self.max_keys)?;
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                store,
                key: self.key,
                plans: self.plans,
                cost: self.cost,
                failure: Policy::new(&self.failure, self.clock)?,
                missing_key: self.missing_key,
                unknown_key: self.unknown_key,
                remaining_header: self.remaining_header,
                limits,
                shadow: self.shadow,
                exempt,
                on_refusal: self.on_refusal,
                log_gate: LogGate::default(),
                #[cfg(feature = "distributed")]
                breaker: crate::metrics::BreakerGauge::default(),
            }),
        })
    }
}

/// The in-process store: a bucket per key, created under the key's plan.
fn local_store(
    plans: Option<Arc<dyn PlanResolver>>,
    clock: &SharedClock,
    max_keys: usize,
) -> Result<Store, ConfigError> {
    let keyed: LocalStore = KeyedBucket::builder()
        .configuration_per_key(move |key: &String| {
            plans
                .as_ref()
                .and_then(|p| p.resolve(key))
                .map(|plan| plan.configuration().clone())
        })
        .with_clock(Arc::clone(clock))
        .max_keys(max_keys)
        .build()?;
    Ok(Store::Local(Local::new(keyed)))
}

/// Rate limits HTTP requests per client key: see the [crate docs](crate).
///
/// ```
/// # use bucket4rs_tower::{Plan, RateLimitLayer};
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
/// let layer = RateLimitLayer::builder().plans(Plan::new("p", config)).build()?;
/// let app = tower::ServiceBuilder::new().layer(layer.clone());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("store", &self.shared.store)
            .field("key", &self.shared.key)
            .field("failure", &self.shared.failure)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// Starts a builder (see [`RateLimitLayerBuilder`] for the defaults).
    ///
    /// ```
    /// let builder = bucket4rs_tower::RateLimitLayer::builder();
    /// ```
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            clock: Arc::new(FastClock),
            max_keys: DEFAULT_MAX_KEYS,
            #[cfg(feature = "distributed")]
            remote: None,
            key: KeyExtractor::header("x-api-key"),
            plans: None,
            cost: Arc::new(|_| 1),
            failure: FailurePolicy::error(),
            missing_key: StatusCode::UNAUTHORIZED,
            unknown_key: StatusCode::UNAUTHORIZED,
            remaining_header: false,
            limits: Vec::new(),
            shadow: false,
            exempt_keys: Vec::new(),
            exempt_networks: Vec::new(),
            on_refusal: None,
        }
    }

    /// The in-process store, if the buckets are kept in this process: every client key's
    /// [`KeyedBucket`], to inspect, reset or remove a client's bucket.
    ///
    /// ```
    /// # use bucket4rs_tower::{Plan, RateLimitLayer};
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// let layer = RateLimitLayer::builder().plans(Plan::new("p", config)).build()?;
    /// let store = layer.local_store().expect("in process by default");
    /// assert_eq!(store.available_tokens("some client")?, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn local_store(&self) -> Option<&LocalStore> {
        match &self.shared.store {
            Store::Local(local) => Some(&local.plain),
            #[cfg(feature = "distributed")]
            Store::Remote(_) => None,
        }
    }

    /// Ends the leases of a shared store's buckets and gives their unused tokens back now
    /// ([`ProxyManager::release_leases`](bucket4rs_distributed::ProxyManager::release_leases)):
    /// call it at a graceful shutdown, after the last request was answered, so that the
    /// tokens this process held in leases are not lost from the shared buckets. Without it,
    /// dropping the layer's last handle on the manager starts the same return on a task of its
    /// own, which a process that exits at once does not wait for: the tokens are then lost
    /// until they refill (an under-grant, never an over-grant). Nothing to do for the
    /// in-process store or without leasing.
    ///
    /// # Errors
    /// The store's, for the first return that failed (the others are still made).
    ///
    /// ```
    /// # use bucket4rs_tower::{Plan, RateLimitLayer};
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// let layer = RateLimitLayer::builder().plans(Plan::new("p", config)).build()?;
    /// // … serve until the shutdown signal, then:
    /// layer.release_leases().await?;
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "distributed")]
    pub async fn release_leases(&self) -> Result<(), bucket4rs_distributed::DistributedError> {
        match &self.shared.store {
            Store::Local(_) => Ok(()),
            Store::Remote(remote) => remote.release_leases().await,
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.shared))
    }
}
