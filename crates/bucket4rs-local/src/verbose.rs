//! The verbose view of a bucket: every operation's answer together with the configuration, the
//! state it left and the reading it ran at ([`VerboseResult`], shared with the distributed
//! buckets).

use core::time::Duration;

use bucket4rs_core::ops::{self, Operation};
use bucket4rs_core::{
    BucketConfiguration, BucketListener, Clock, ConfigError, ConsumptionProbe, EstimationProbe,
    OperationError, TokensInheritanceStrategy, VerboseResult,
};

use crate::bucket::Bucket;
use crate::storage::Storage;

/// The verbose view of a [`Bucket`] ([`Bucket::as_verbose`]): the same operations, each
/// answering a [`VerboseResult`] with the configuration, the state after the operation and its
/// reading, from which the diagnostics (tokens per bandwidth, time until full) are read. Costs
/// more than the plain API (the configuration and state are copied out), so use it where the
/// answer needs them, as for rate-limit response headers.
///
/// Every operation of [`Bucket`] is here, `replace_configuration` included.
///
/// ```
/// use bucket4rs_local::Bucket;
/// use std::time::Duration;
///
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
///     .build()?;
/// let verbose = bucket.as_verbose();
/// let r = verbose.try_consume(4)?;
/// assert!(*r.value());
/// assert_eq!(r.available_tokens_per_bandwidth(), [6]);
/// verbose.add_tokens(1)?;
/// assert_eq!(verbose.available_tokens().into_value(), 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct VerboseBucket<'a, S, C, L> {
    bucket: &'a Bucket<S, C, L>,
}

impl<'a, S: Storage, C: Clock, L: BucketListener> VerboseBucket<'a, S, C, L> {
    pub(crate) fn new(bucket: &'a Bucket<S, C, L>) -> Self {
        Self { bucket }
    }

    /// Runs any core [`Operation`] verbosely (the typed methods below are shorthands).
    ///
    /// # Errors
    /// The operation's [`OperationError`]; nothing changes then.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// let r = bucket.as_verbose().execute(bucket4rs_core::ops::TryConsume(3))?;
    /// assert_eq!(r.available_tokens(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execute<O: Operation>(&self, op: O) -> Result<VerboseResult<O::Output>, OperationError> {
        let ((value, state), configuration, now) = self.bucket.run_verbose(ops::Verbose(op))?;
        Ok(VerboseResult::new(value, configuration, state, now))
    }

    /// [`Bucket::try_consume`], verbosely.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// assert!(*bucket.as_verbose().try_consume(10)?.value());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume(&self, tokens: u64) -> Result<VerboseResult<bool>, OperationError> {
        self.execute(ops::TryConsume(tokens))
    }

    /// [`Bucket::try_consume_and_return_remaining`], verbosely.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// let r = bucket.as_verbose().try_consume_and_return_remaining(3)?;
    /// assert_eq!(r.value().remaining_tokens(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_and_return_remaining(
        &self,
        tokens: u64,
    ) -> Result<VerboseResult<ConsumptionProbe>, OperationError> {
        self.execute(ops::TryConsumeAndReturnRemaining(tokens))
    }

    /// [`Bucket::estimate_ability_to_consume`], verbosely.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// assert!(bucket.as_verbose().estimate_ability_to_consume(10)?.value().can_be_consumed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn estimate_ability_to_consume(
        &self,
        tokens: u64,
    ) -> Result<VerboseResult<EstimationProbe>, OperationError> {
        self.execute(ops::EstimateAbilityToConsume(tokens))
    }

    /// [`Bucket::try_consume_as_much_as_possible`], verbosely.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// assert_eq!(bucket.as_verbose().try_consume_as_much_as_possible().into_value(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_as_much_as_possible(&self) -> VerboseResult<u64> {
        self.infallible(ops::TryConsumeAsMuchAsPossible(None))
    }

    /// [`Bucket::try_consume_as_much_as_possible_with_limit`], verbosely.
    ///
    /// # Errors
    /// [`OperationError::ZeroLimit`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// let r = bucket.as_verbose().try_consume_as_much_as_possible_with_limit(4)?;
    /// assert_eq!((*r.value(), r.available_tokens()), (4, 6));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_as_much_as_possible_with_limit(
        &self,
        limit: u64,
    ) -> Result<VerboseResult<u64>, OperationError> {
        self.execute(ops::TryConsumeAsMuchAsPossible(Some(limit)))
    }

    /// [`Bucket::add_tokens`], verbosely.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// bucket.try_consume(5)?;
    /// assert_eq!(bucket.as_verbose().add_tokens(2)?.available_tokens(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_tokens(&self, tokens: u64) -> Result<VerboseResult<()>, OperationError> {
        self.execute(ops::AddTokens(tokens))
    }

    /// [`Bucket::force_add_tokens`], verbosely.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// assert_eq!(bucket.as_verbose().force_add_tokens(5)?.available_tokens(), 15);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn force_add_tokens(&self, tokens: u64) -> Result<VerboseResult<()>, OperationError> {
        self.execute(ops::ForceAddTokens(tokens))
    }

    /// [`Bucket::reset`], verbosely.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// bucket.try_consume(10)?;
    /// assert_eq!(bucket.as_verbose().reset().available_tokens(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset(&self) -> VerboseResult<()> {
        self.infallible(ops::Reset)
    }

    /// [`Bucket::available_tokens`], verbosely.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// assert_eq!(bucket.as_verbose().available_tokens().into_value(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available_tokens(&self) -> VerboseResult<i64> {
        self.infallible(ops::AvailableTokens)
    }

    /// [`Bucket::consume_ignoring_rate_limits`], verbosely.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], or [`OperationError::WaitTooLong`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// let r = bucket.as_verbose().consume_ignoring_rate_limits(15)?;
    /// assert_eq!((*r.value(), r.available_tokens()), (Duration::from_millis(500), -5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consume_ignoring_rate_limits(
        &self,
        tokens: u64,
    ) -> Result<VerboseResult<Duration>, OperationError> {
        let r = self.execute(ops::ConsumeIgnoringRateLimits(tokens))?;
        Ok(r.map(Duration::from_nanos))
    }

    /// [`Bucket::reserve`], verbosely: the value is the wait for the reserved tokens, or
    /// `None` when the wait would exceed `max_wait` (nothing taken). The primitive behind the
    /// verbose blocking and async views.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], or [`OperationError::ZeroMaxWait`] for a zero
    /// `max_wait`.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// let r = bucket.as_verbose().reserve(15, Duration::from_secs(1))?;
    /// assert_eq!((*r.value(), r.available_tokens()), (Some(Duration::from_millis(500)), -5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(
        &self,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<VerboseResult<Option<Duration>>, OperationError> {
        let op = ops::Reserve {
            tokens,
            max_wait_nanos: u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX),
        };
        let r = self.execute(op)?;
        Ok(r.map(|w| w.map(Duration::from_nanos)))
    }

    /// [`Bucket::replace_configuration`], verbosely: the new configuration and the state the
    /// replacement left, at the reading it ran at.
    ///
    /// # Errors
    /// [`ConfigError::AlignedRefillNeedsWallClock`](bucket4rs_core::ConfigError::AlignedRefillNeedsWallClock)
    /// when the new configuration uses aligned refill and the clock is not wall-clock based;
    /// nothing changes then.
    ///
    /// ```
    /// # use bucket4rs_local::{Bandwidth, Bucket, BucketConfiguration, TokensInheritanceStrategy};
    /// # use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(60))).build()?;
    /// bucket.try_consume(60)?;
    /// let pro = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(200, Duration::from_secs(60))?).build()?;
    /// let r = bucket.as_verbose().replace_configuration(pro, TokensInheritanceStrategy::Proportionally)?;
    /// assert_eq!(r.configuration().bandwidths()[0].capacity(), 200);
    /// assert_eq!(r.available_tokens(), 80);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replace_configuration(
        &self,
        config: BucketConfiguration,
        strategy: TokensInheritanceStrategy,
    ) -> Result<VerboseResult<()>, ConfigError> {
        let (config, state, now) = self.bucket.replace(config, strategy)?;
        Ok(VerboseResult::new((), config, state, now))
    }

    /// An operation that never fails (no argument to check).
    fn infallible<O: Operation>(&self, op: O) -> VerboseResult<O::Output> {
        match self.execute(op) {
            Ok(r) => r,
            // Only argument checks fail, and these operations have none.
            Err(_) => unreachable!("an operation without arguments has no error"),
        }
    }
}
