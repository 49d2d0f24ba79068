//! [`VerboseKeyedBucket`]: the verbose view of a keyed bucket.

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};

use bucket4rs_core::ops::{self, Operation};
use bucket4rs_core::{BucketListener, Clock, ConsumptionProbe, EstimationProbe, VerboseResult};

use super::{KeyedBucket, KeyedError};

/// The verbose view of a [`KeyedBucket`] ([`KeyedBucket::as_verbose`]).
///
/// ```
/// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
/// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
/// let verbose = limiter.as_verbose();
/// let probe = verbose.try_consume_and_return_remaining("k", 5)?;
/// assert_eq!(probe.time_until_full(), Duration::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct VerboseKeyedBucket<'a, K, C, L, S> {
    pub(super) keyed: &'a KeyedBucket<K, C, L, S>,
}

impl<K, C: fmt::Debug, L, S> fmt::Debug for VerboseKeyedBucket<'_, K, C, L, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("VerboseKeyedBucket")
            .field(self.keyed)
            .finish()
    }
}

impl<K, C, L, S> VerboseKeyedBucket<'_, K, C, L, S>
where
    K: Hash + Eq,
    C: Clock,
    L: BucketListener,
    S: BuildHasher + Clone,
{
    /// [`KeyedBucket::execute`], verbosely.
    ///
    /// # Errors
    /// As [`KeyedBucket::execute`].
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// let r = limiter.as_verbose().execute("k", bucket4rs_core::ops::Reset)?;
    /// assert_eq!(r.available_tokens(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execute<Q, O>(&self, key: &Q, op: O) -> Result<VerboseResult<O::Output>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
        O: Operation,
    {
        self.keyed.execute_verbose(key, op)
    }

    /// [`KeyedBucket::try_consume`], verbosely.
    ///
    /// # Errors
    /// As [`KeyedBucket::try_consume`].
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert_eq!(limiter.as_verbose().try_consume("k", 1)?.available_tokens_per_bandwidth(), [4]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume<Q>(&self, key: &Q, tokens: u64) -> Result<VerboseResult<bool>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::TryConsume(tokens))
    }

    /// [`KeyedBucket::try_consume_and_return_remaining`], verbosely.
    ///
    /// # Errors
    /// As [`KeyedBucket::try_consume`].
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert!(limiter.as_verbose().try_consume_and_return_remaining("k", 1)?.value().is_consumed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_and_return_remaining<Q>(
        &self,
        key: &Q,
        tokens: u64,
    ) -> Result<VerboseResult<ConsumptionProbe>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::TryConsumeAndReturnRemaining(tokens))
    }

    /// [`KeyedBucket::estimate_ability_to_consume`], verbosely.
    ///
    /// # Errors
    /// As [`KeyedBucket::try_consume`].
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert!(limiter.as_verbose().estimate_ability_to_consume("k", 5)?.value().can_be_consumed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn estimate_ability_to_consume<Q>(
        &self,
        key: &Q,
        tokens: u64,
    ) -> Result<VerboseResult<EstimationProbe>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::EstimateAbilityToConsume(tokens))
    }

    /// [`KeyedBucket::available_tokens`], verbosely.
    ///
    /// # Errors
    /// As [`KeyedBucket::available_tokens`].
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert_eq!(limiter.as_verbose().available_tokens("k")?.time_until_full(), Duration::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available_tokens<Q>(&self, key: &Q) -> Result<VerboseResult<i64>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::AvailableTokens)
    }
}
