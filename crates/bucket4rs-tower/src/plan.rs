//! What a key is allowed: plans and how keys map to them.

use core::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bucket4rs_core::BucketConfiguration;
use http::HeaderValue;

use crate::headers::{self, Quota};

#[derive(Clone)]
struct Inner {
    /// Unique per `Plan::new` (never reused): keys the per-thread `RateLimit` value cache.
    id: u64,
    name: Arc<str>,
    /// Decided and reported as usual, never refused ([`Plan::shadow`]).
    shadow: bool,
    /// How this plan's buckets lease on a shared store ([`Plan::with_leasing`]); `None`: as
    /// the store's manager says.
    #[cfg(feature = "distributed")]
    leasing: Option<bucket4rs_distributed::Leasing>,
    /// The counters of this plan's decisions, registered with the `metrics` recorder of
    /// its first decision.
    counters: Arc<std::sync::OnceLock<crate::metrics::Counters>>,
    config: BucketConfiguration,
    /// One single-bandwidth configuration per bandwidth, for per-bandwidth waits.
    singles: Box<[BucketConfiguration]>,
    quotas: Box<[Quota]>,
    policy_header: HeaderValue,
    min_capacity: u64,
}

/// A named bucket configuration (`free`, `pro`, …) with its `RateLimit-Policy` header
/// precomputed. Cheap to clone.
///
/// Each bandwidth becomes one quota policy, named by its id (when it is a valid
/// structured-field string) or else by its index (`"0"`, `"1"`, …).
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_tower::Plan;
/// use std::time::Duration;
/// let config = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::builder().capacity(20).refill_greedy(20, Duration::from_secs(60)).id("burst").build()?)
///     .add_bandwidth(Bandwidth::simple(1000, Duration::from_secs(86_400))?)
///     .build()?;
/// let plan = Plan::new("free", config);
/// assert_eq!(plan.policy_header(), r#""burst";q=20;w=60, "1";q=1000;w=86400"#);
/// assert_eq!(plan.min_capacity(), 20);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Plan(Arc<Inner>);

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Plan");
        d.field("name", &self.0.name)
            .field("config", &self.0.config);
        #[cfg(feature = "distributed")]
        d.field("leasing", &self.0.leasing);
        d.finish()
    }
}

impl PartialEq for Plan {
    fn eq(&self, other: &Self) -> bool {
        #[cfg(feature = "distributed")]
        if self.0.leasing != other.0.leasing {
            return false;
        }
        self.0.name == other.0.name
            && self.0.config == other.0.config
            && self.0.shadow == other.0.shadow
    }
}

impl Plan {
    /// A plan named `name` over `config`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// assert_eq!(bucket4rs_tower::Plan::new("basic", c).name(), "basic");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(name: impl Into<Arc<str>>, config: BucketConfiguration) -> Self {
        let quotas: Box<[Quota]> = config
            .bandwidths()
            .iter()
            .enumerate()
            .map(|(i, b)| Quota::of(i, b))
            .collect();
        Self::with_quotas(name.into(), config, quotas)
    }

    /// The plan of a further limit named `name` (see [`Limit`](crate::Limit)): its policies
    /// are named by the limit (`name`, or `name.<bandwidth>` for several bandwidths), so
    /// that they never clash with a client plan's.
    pub(crate) fn for_limit(name: Arc<str>, config: BucketConfiguration) -> Self {
        let several = config.bandwidths().len() > 1;
        let quotas: Box<[Quota]> = config
            .bandwidths()
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let own = Quota::of(i, b);
                if several {
                    Quota::named(&format!("{name}.{}", own.name()), b)
                } else {
                    Quota::named(&name, b)
                }
            })
            .collect();
        Self::with_quotas(name, config, quotas)
    }

    fn with_quotas(name: Arc<str>, config: BucketConfiguration, quotas: Box<[Quota]>) -> Self {
        let singles = config
            .bandwidths()
            .iter()
            .map(|b| single(b.clone()))
            .collect();
        let min_capacity = config
            .bandwidths()
            .iter()
            .map(|b| b.capacity())
            .min()
            .unwrap_or(0);
        let policy_header = headers::policy_header(&quotas);
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Self(Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name,
            shadow: false,
            #[cfg(feature = "distributed")]
            leasing: None,
            counters: Arc::default(),
            config,
            singles,
            quotas,
            policy_header,
            min_capacity,
        }))
    }

    /// The plan's name.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// assert_eq!(bucket4rs_tower::Plan::new("pro", c).name(), "pro");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// This plan in shadow mode: its requests are decided, counted and given their
    /// `RateLimit` fields as usual, but one it would refuse is served, marked with a
    /// [`ShadowRefusal`](crate::ShadowRefusal) response extension (for a safe rollout of a
    /// new limit).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// let trial = bucket4rs_tower::Plan::new("trial", c).shadow();
    /// assert!(trial.is_shadow());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn shadow(self) -> Self {
        let mut inner = Inner::clone(&self.0);
        inner.shadow = true;
        inner.counters = Arc::default();
        Self(Arc::new(inner))
    }

    /// Whether this plan is in shadow mode ([`shadow`](Self::shadow)).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// assert!(!bucket4rs_tower::Plan::new("free", c).is_shadow());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_shadow(&self) -> bool {
        self.0.shadow
    }

    /// This plan with its buckets leasing on a shared store (feature `distributed`): a key
    /// of this plan that is hot — a global limit every request passes, a busy client — is
    /// served in this process from blocks of tokens taken from the shared bucket, with no
    /// over-grant; one process answers exactly as without leasing (see
    /// [`Leasing`](bucket4rs_distributed::Leasing) and docs/http.md, "Leasing"). Without
    /// it, the plan's buckets lease as the store's manager says
    /// ([`ManagerBuilder::leasing`](bucket4rs_distributed::ManagerBuilder::leasing); off by
    /// default).
    ///
    /// The in-process store accepts a leasing plan and has nothing to lease: its buckets are
    /// already in this process, each answered by one compare-and-swap. So one plans file
    /// serves a shared store in production and the in-process store in development.
    ///
    /// # Errors
    /// [`DistributedError::InvalidSetting`](bucket4rs_distributed::DistributedError::InvalidSetting)
    /// for settings that can only break things ([`Leasing::check`](bucket4rs_distributed::Leasing::check)).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// use bucket4rs_distributed::Leasing;
    /// use bucket4rs_tower::Plan;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10_000, Duration::from_secs(1))?).build()?;
    /// let hot = Plan::new("partner", c.clone()).with_leasing(Leasing::new().processes(4))?;
    /// assert_eq!(hot.leasing(), Some(Leasing::new().processes(4)));
    /// assert!(Plan::new("partner", c).with_leasing(Leasing::new().processes(0)).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "distributed")]
    pub fn with_leasing(
        self,
        leasing: bucket4rs_distributed::Leasing,
    ) -> Result<Self, bucket4rs_distributed::DistributedError> {
        leasing.check()?;
        let mut inner = Inner::clone(&self.0);
        inner.leasing = Some(leasing);
        Ok(Self(Arc::new(inner)))
    }

    /// How this plan's buckets lease on a shared store ([`with_leasing`](Self::with_leasing));
    /// `None` when the plan leaves it to the store's manager.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// assert_eq!(bucket4rs_tower::Plan::new("free", c).leasing(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "distributed")]
    pub fn leasing(&self) -> Option<bucket4rs_distributed::Leasing> {
        self.0.leasing
    }

    /// The bucket configuration.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// assert_eq!(bucket4rs_tower::Plan::new("p", c.clone()).configuration(), &c);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn configuration(&self) -> &BucketConfiguration {
        &self.0.config
    }

    /// The smallest capacity over the bandwidths: no request may cost more.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// assert_eq!(bucket4rs_tower::Plan::new("p", c).min_capacity(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn min_capacity(&self) -> u64 {
        self.0.min_capacity
    }

    /// The `RateLimit-Policy` header value.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// assert_eq!(bucket4rs_tower::Plan::new("p", c).policy_header(), r#""0";q=5;w=1"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy_header(&self) -> &HeaderValue {
        &self.0.policy_header
    }

    /// The quota policies, one per bandwidth.
    pub(crate) fn quotas(&self) -> &[Quota] {
        &self.0.quotas
    }

    pub(crate) fn singles(&self) -> &[BucketConfiguration] {
        &self.0.singles
    }

    /// This plan's identity: shared by its clones, different from every other plan's
    /// (2^64 plans would have to be built for a value to repeat).
    pub(crate) fn id(&self) -> u64 {
        self.0.id
    }

    /// The counters of this plan's decisions, as the limit `limit` of requests.
    pub(crate) fn counters(&self, limit: &str) -> &crate::metrics::Counters {
        self.0
            .counters
            .get_or_init(|| crate::metrics::Counters::new(self.name(), limit))
    }
}

/// A configuration holding one bandwidth (always valid: one bandwidth, no duplicate id).
pub(crate) fn single(b: bucket4rs_core::Bandwidth) -> BucketConfiguration {
    match BucketConfiguration::new(vec![b]) {
        Ok(c) => c,
        // A one-element list is never empty and has no duplicate id.
        Err(_) => unreachable!("a single bandwidth is a valid configuration"),
    }
}

/// Maps a client key to its plan; `None` means the key is unknown (answered with the
/// layer's unknown-key response, 401 by default).
///
/// Implemented by [`Plan`] (every key gets that plan: per-IP limiting), by
/// [`PlanTable`](crate::PlanTable) (plans file: key → plan), and by closures.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_tower::{Plan, PlanResolver};
/// use std::time::Duration;
/// let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
/// let gold = Plan::new("gold", c);
/// let resolver = move |key: &str| key.starts_with("gold-").then(|| gold.clone());
/// assert_eq!(resolver.resolve("gold-1").unwrap().name(), "gold");
/// assert!(resolver.resolve("tin-1").is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait PlanResolver: Send + Sync + 'static {
    /// The plan of `key`.
    fn resolve(&self, key: &str) -> Option<Plan>;

    /// Every plan `resolve` can answer, when its answer for each key is fixed for the
    /// resolver's life; `None` (the default) when it may change, as a closure reading a
    /// database's current plan of a customer would.
    ///
    /// With `Some` and a store that consumes in place (the embedded default), the layer
    /// looks a client key up once per request instead of twice: it consumes from the key's
    /// live bucket first and reads the plan off the bucket's configuration (each plan's
    /// own, compared by identity), and calls `resolve` only for a key without a live
    /// bucket. So a key that has a live bucket holding one of these plans' configurations
    /// is answered under that plan. The layer keeps the ordinary path when there are more
    /// than 16 plans or two plans share one configuration. [`Plan`] and
    /// [`PlanTable`](crate::PlanTable) answer `Some`.
    ///
    /// ```
    /// use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// use bucket4rs_tower::{Plan, PlanResolver};
    /// use std::time::Duration;
    /// let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
    /// let basic = Plan::new("basic", c);
    /// assert_eq!(basic.fixed_plans(), Some(vec![basic.clone()]));
    /// let changing = move |_: &str| Some(basic.clone());
    /// assert_eq!(changing.fixed_plans(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn fixed_plans(&self) -> Option<Vec<Plan>> {
        None
    }
}

impl PlanResolver for Plan {
    fn resolve(&self, _key: &str) -> Option<Plan> {
        Some(self.clone())
    }

    fn fixed_plans(&self) -> Option<Vec<Plan>> {
        Some(vec![self.clone()])
    }
}

impl<F> PlanResolver for F
where
    F: Fn(&str) -> Option<Plan> + Send + Sync + 'static,
{
    fn resolve(&self, key: &str) -> Option<Plan> {
        self(key)
    }
}
