//! What the layer answers while its store cannot decide: an error, a denial, or a local
//! limit that answers as the store would have — never a silent allow.

use core::fmt;

use bucket4rs_core::ConfigError;
use bucket4rs_local::KeyedBucket;

use crate::plan::Plan;
use crate::store::{Answer, Local, SharedClock};

/// The keys a fallback limit holds at most: past that, new keys are denied.
const FALLBACK_KEYS: usize = 100_000;

/// What the layer answers while its store cannot decide: a remote store that is down or
/// too slow (the manager's timeout), or the in-process store at its key cap.
///
/// - [`error`](Self::error) (the default): 503 with `Retry-After: 1`;
/// - [`deny`](Self::deny): 429 with `Retry-After: 1`;
/// - [`fallback`](Self::fallback): a bucket per key in this process, of the given plan,
///   decides, and answers as any limit does — 429 with its own `Retry-After`, and the
///   `RateLimit` fields of its plan. Choose it as the shared limit divided by the number of
///   instances, so the fleet stays near the shared limit while the store is down. At most
///   100,000 keys; past that, new keys are denied.
///
/// There is deliberately no "allow everything" policy.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_tower::{FailurePolicy, Plan, RateLimitLayer};
/// use std::time::Duration;
/// let local = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(2, Duration::from_secs(1))?).build()?;
/// let layer = RateLimitLayer::builder()
///     .plans(Plan::new("free", local.clone()))
///     .failure_policy(FailurePolicy::fallback(Plan::new("fallback", local)))
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct FailurePolicy(Kind);

#[derive(Clone, Debug)]
enum Kind {
    Error,
    Deny,
    Fallback(Plan),
}

impl FailurePolicy {
    /// Answer 503 (`Retry-After: 1`).
    ///
    /// ```
    /// let p = bucket4rs_tower::FailurePolicy::error();
    /// ```
    pub fn error() -> Self {
        Self(Kind::Error)
    }

    /// Answer 429 (`Retry-After: 1`).
    ///
    /// ```
    /// let p = bucket4rs_tower::FailurePolicy::deny();
    /// ```
    pub fn deny() -> Self {
        Self(Kind::Deny)
    }

    /// Decide with a bucket per key of `plan`, in this process (see the type's docs). The
    /// buckets run on the layer's clock ([`clock`](crate::RateLimitLayerBuilder::clock));
    /// a plan that clock cannot run (interval refill aligned to the wall clock on a clock
    /// that is not one) is refused by the layer's
    /// [`build`](crate::RateLimitLayerBuilder::build).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// let local = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(2, Duration::from_secs(1))?).build()?;
    /// let p = bucket4rs_tower::FailurePolicy::fallback(bucket4rs_tower::Plan::new("fallback", local));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fallback(plan: Plan) -> Self {
        Self(Kind::Fallback(plan))
    }
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self::error()
    }
}

/// A layer's failure policy, with the fallback's buckets.
pub(crate) enum Policy {
    Error,
    Deny,
    Fallback { plan: Plan, buckets: Local },
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Error => f.write_str("Error"),
            Self::Deny => f.write_str("Deny"),
            Self::Fallback { plan, .. } => f.debug_tuple("Fallback").field(&plan.name()).finish(),
        }
    }
}

/// What the policy decided for a request its store could not decide.
pub(crate) enum Decided {
    /// 503.
    Error,
    /// 429 with `Retry-After: 1`.
    Deny,
    /// The fallback limit answered, as a store does.
    Fallback(Answer),
}

impl Policy {
    /// The policy of `policy`, its fallback buckets on `clock`.
    pub(crate) fn new(policy: &FailurePolicy, clock: SharedClock) -> Result<Self, ConfigError> {
        Ok(match &policy.0 {
            Kind::Error => Self::Error,
            Kind::Deny => Self::Deny,
            Kind::Fallback(plan) => {
                let keyed = KeyedBucket::builder()
                    .with_configuration(plan.configuration())
                    .with_clock(clock)
                    .max_keys(FALLBACK_KEYS)
                    .build()?;
                Self::Fallback {
                    plan: plan.clone(),
                    buckets: Local::new(keyed),
                }
            }
        })
    }

    /// What the policy says of `cost` tokens for `key`.
    pub(crate) fn decide(&self, key: &str, cost: u64) -> Decided {
        match self {
            Self::Error => Decided::Error,
            Self::Deny => Decided::Deny,
            Self::Fallback { plan, buckets } => match buckets.ask(key, plan, cost) {
                Ok(answer) => Decided::Fallback(answer),
                // Full of keys (or failed): deny rather than allow blindly.
                Err(_) => Decided::Deny,
            },
        }
    }

    /// The fallback's plan, if it has one.
    pub(crate) fn plan(&self) -> Option<&Plan> {
        match self {
            Self::Fallback { plan, .. } => Some(plan),
            _ => None,
        }
    }
}
