//! Where the layer's buckets live, and the one consumption a request makes there.
//!
//! In this process, a [`KeyedBucket`] (the default): a request's consumption is one
//! [`Take`] on the key's bucket, whose output is what the response needs, computed while the
//! bucket's state is at hand (no copy of the configuration, no second lookup of the key). In a
//! shared store, a [`ProxyManager`] over any backend: the same question as a verbose
//! `try_consume_and_return_remaining`, answered asynchronously. Both answers are a
//! [`Decided`]: the core's probe of that operation and the state it left.

use core::fmt;
use std::sync::Arc;

use bucket4rs_core::__private::Single;
use bucket4rs_core::ops::{Mutation, Operation, Refilled, TryConsumeAndReturnRemaining};
use bucket4rs_core::{
    Bandwidth, BandwidthState, BucketConfiguration, BucketListener, BucketState, Clock,
    ConsumptionProbe, OperationError, TokensInheritanceStrategy, VerboseResult,
};
use bucket4rs_distributed::{Backend, DistributedError, ProxyManager};
use bucket4rs_local::KeyedBucket;

use crate::plan::Plan;

/// The clock of the layer's in-process store.
pub(crate) type SharedClock = Arc<dyn Clock + Send + Sync>;

/// The layer's in-process store: a bucket per client key.
pub type LocalStore = KeyedBucket<String, SharedClock>;

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = core::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// How a bucket found under another configuration is switched to its key's current plan: its
/// tokens are carried over as they are.
pub(crate) const PLAN_CHANGE: TokensInheritanceStrategy = TokensInheritanceStrategy::AsIs;

/// Where the layer's buckets are. One per layer, built once and held in the layer's `Arc`:
/// the in-process store is kept inline (no indirection on the request's path) however much
/// larger than the other variant it is.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Store {
    /// In this process.
    Local(LocalStore),
    /// Behind a proxy manager (the backend's type erased).
    Remote(Box<dyn Remote>),
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(keyed) => f.debug_tuple("Local").field(&keyed.len()).finish(),
            Self::Remote(remote) => f.debug_tuple("Remote").field(remote).finish(),
        }
    }
}

/// The plans a [`Take`] decides under.
#[derive(Clone, Copy)]
pub(crate) enum Plans<'p> {
    /// Plans that never change, each with a configuration of its own: the plan is the one
    /// whose configuration the bucket has.
    Fixed(&'p FixedPlans),
    /// The plan resolved for this request: the bucket must have its configuration.
    One(&'p Plan),
}

/// The plans of a resolver whose answers never change
/// ([`PlanResolver::fixed_plans`](crate::PlanResolver::fixed_plans)), each with a
/// configuration of its own (by identity).
///
/// A key that has a bucket got it under its plan, so the bucket holds that plan's
/// configuration (the same `Arc`): the layer consumes first and reads the plan off the
/// configuration it finds, so a known client's key is looked up once per request (the plan
/// table's lookup happens only when the key has no bucket).
#[derive(Debug)]
pub(crate) struct FixedPlans {
    plans: Box<[Plan]>,
}

/// The most plans [`FixedPlans`] takes: a known client's plan is found by comparing its
/// bucket's configuration with each plan's, which stays cheaper than a key lookup only for
/// a few plans.
const MAX_FIXED_PLANS: usize = 16;

impl FixedPlans {
    /// `None` when the resolver's answers may change, or it has no plans, more than
    /// [`MAX_FIXED_PLANS`], or two plans of equal configurations (a bucket's configuration
    /// would not tell them apart: the store keeps one copy of equal configurations).
    pub(crate) fn of(resolver: &dyn crate::PlanResolver) -> Option<Self> {
        let plans = resolver.fixed_plans()?;
        if plans.is_empty() || plans.len() > MAX_FIXED_PLANS {
            return None;
        }
        for (i, a) in plans.iter().enumerate() {
            if plans[..i]
                .iter()
                .any(|b| a.configuration() == b.configuration())
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

/// Whether two configurations are equal: by identity first (a bucket created from a plan
/// shares its configuration), element by element otherwise (a bucket decoded by a remote
/// backend).
#[inline]
pub(crate) fn same(a: &BucketConfiguration, b: &BucketConfiguration) -> bool {
    identical(a, b) || a == b
}

/// The request's consumption: `try_consume(cost)` under the key's plan, with what the
/// response needs. `cost` is at least 1 (a request that costs nothing is not metered).
#[derive(Clone, Copy)]
pub(crate) struct Take<'p> {
    pub(crate) cost: u64,
    pub(crate) plans: Plans<'p>,
}

/// What a [`Take`] found.
pub(crate) enum Taken<'p> {
    /// Decided under `plan`.
    Decided(Decided<'p>),
    /// The cost exceeds the plan's capacity (a configuration error): nothing was taken.
    TooCostly(&'p Plan),
    /// The bucket's configuration is not its plan's: nothing was taken.
    Stale,
}

/// A consumption decided under a plan: the probe of `try_consume_and_return_remaining`
/// (computed by the core's operation, in process as on a remote store), and the state it left.
pub(crate) struct Decided<'p> {
    pub(crate) plan: &'p Plan,
    pub(crate) probe: ConsumptionProbe,
    /// Every bandwidth's state after the request, refilled to `now`.
    pub(crate) after: BucketState,
    pub(crate) now: i64,
}

impl<'p> Operation for Take<'p> {
    type Output = Taken<'p>;

    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(Taken<'p>, Option<Mutation>), OperationError> {
        let config = view.configuration();
        let plan = match self.plans {
            Plans::Fixed(fixed) => fixed.plan_of(config),
            Plans::One(plan) => same(plan.configuration(), config).then_some(plan),
        };
        let Some(plan) = plan else {
            return Ok((Taken::Stale, None));
        };
        if self.cost > plan.min_capacity() {
            return Ok((Taken::TooCostly(plan), None));
        }
        let (probe, mutation) = TryConsumeAndReturnRemaining(self.cost).plan(view)?;
        let after = (0..view.len())
            .map(|i| match mutation {
                Some(m) => m.apply(&config.bandwidths()[i], view.get(i)),
                None => view.get(i),
            })
            .collect();
        let decided = Decided {
            plan,
            probe,
            after,
            now: view.now(),
        };
        Ok((Taken::Decided(decided), mutation))
    }

    const HAS_SINGLE: bool = true;

    /// A bucket of one bandwidth, the common case: the same decision without the refilled
    /// view, when `b` is (by identity) the only bandwidth of the plan's configuration;
    /// `plan` decides otherwise.
    #[inline]
    fn plan_single(&self, b: &Bandwidth, s: BandwidthState, now: i64) -> Option<Single<Taken<'p>>> {
        let of = |plan: &Plan| {
            core::ptr::eq(plan.configuration().bandwidths(), core::slice::from_ref(b))
        };
        let plan = match self.plans {
            Plans::Fixed(fixed) => fixed.plans.iter().find(|p| of(p))?,
            Plans::One(plan) => of(plan).then_some(plan)?,
        };
        if self.cost > plan.min_capacity() {
            return Some(Ok((Taken::TooCostly(plan), None)));
        }
        let single = TryConsumeAndReturnRemaining(self.cost).plan_single(b, s, now)?;
        Some(single.map(|(probe, new)| {
            let decided = Decided {
                plan,
                probe,
                after: core::iter::once(new.unwrap_or(s)).collect(),
                now,
            };
            (Taken::Decided(decided), new)
        }))
    }

    fn notify<L: BucketListener + ?Sized>(&self, out: &Taken<'p>, listener: &L) {
        if let Taken::Decided(d) = out {
            TryConsumeAndReturnRemaining(self.cost).notify(&d.probe, listener);
        }
    }
}

/// A shared store, its backend type erased: one consumption per request.
pub(crate) trait Remote: Send + Sync + fmt::Debug {
    /// `try_consume_and_return_remaining(cost)` on `key`'s bucket, created under `plan` when
    /// the key has none; a bucket found under another configuration answers under it and is
    /// then switched to `plan`'s ([`PLAN_CHANGE`]). `Err` at once when the key cannot be a
    /// storage key.
    fn consume(
        &self,
        key: &str,
        plan: &Plan,
        cost: u64,
    ) -> Result<
        BoxFuture<Result<VerboseResult<ConsumptionProbe>, DistributedError>>,
        DistributedError,
    >;
}

impl<B: Backend> Remote for ProxyManager<B> {
    fn consume(
        &self,
        key: &str,
        plan: &Plan,
        cost: u64,
    ) -> Result<
        BoxFuture<Result<VerboseResult<ConsumptionProbe>, DistributedError>>,
        DistributedError,
    > {
        let config = plan.configuration().clone();
        let supplied = config.clone();
        let bucket = self
            .builder()
            .build(key.as_bytes(), move || supplied.clone())?;
        Ok(Box::pin(async move {
            let v = bucket
                .verbose()
                .try_consume_and_return_remaining(cost)
                .await?;
            if !same(v.configuration(), &config) {
                // Rare: the key changed plan, or the plans did. The answer stands; the
                // bucket follows the plan from the next request on.
                let _ = bucket.replace_configuration(config, PLAN_CHANGE).await;
            }
            Ok(v)
        }))
    }
}
