//! Verbose results: each answer together with the configuration and a diagnostics snapshot.

use core::time::Duration;

use bucket4rs_core::ops::{self, Operation, Refilled};
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketListener, Clock, ConsumptionProbe, EstimationProbe,
    OperationError,
};

use crate::bucket::Bucket;
use crate::storage::Storage;

/// A result with the configuration it was computed under and the state right after it.
///
/// ```
/// # use bucket4rs_local::Bucket; use std::time::Duration;
/// let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
/// let r = bucket.as_verbose().try_consume_and_return_remaining(1)?;
/// assert_eq!(r.value().remaining_tokens(), 3);
/// assert_eq!(r.configuration().bandwidths()[0].capacity(), 4);
/// assert_eq!(r.state()[0].tokens(), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerboseResult<T> {
    value: T,
    configuration: BucketConfiguration,
    state: Vec<BandwidthState>,
    now_nanos: i64,
}

impl<T> VerboseResult<T> {
    /// The operation's result.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert_eq!(*bucket.as_verbose().available_tokens().value(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn value(&self) -> &T {
        &self.value
    }
    /// Unwraps the result.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert_eq!(bucket.as_verbose().available_tokens().into_value(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_value(self) -> T {
        self.value
    }
    /// The configuration the operation ran under.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert_eq!(bucket.as_verbose().available_tokens().configuration(), &bucket.configuration());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn configuration(&self) -> &BucketConfiguration {
        &self.configuration
    }
    /// Per-bandwidth state right after the operation, refilled to its clock reading.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert_eq!(bucket.as_verbose().available_tokens().state().len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn state(&self) -> &[BandwidthState] {
        &self.state
    }
    /// The clock reading the operation ran at.
    ///
    /// ```
    /// # use bucket4rs_local::{Bucket, ManualClock}; use std::time::Duration;
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4)))
    ///     .with_clock(ManualClock::new(42)).build()?;
    /// assert_eq!(bucket.as_verbose().available_tokens().now_nanos(), 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn now_nanos(&self) -> i64 {
        self.now_nanos
    }
    /// Tokens of each bandwidth, in configuration order.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4)))
    ///     .add_limit(|l| l.capacity(9).refill_greedy(9, Duration::from_secs(60)))
    ///     .build()?;
    /// assert_eq!(bucket.as_verbose().try_consume(1)?.available_tokens_per_bandwidth(), vec![3, 8]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available_tokens_per_bandwidth(&self) -> Vec<i64> {
        self.state.iter().map(BandwidthState::tokens).collect()
    }
    /// Time until every bandwidth is full again.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert_eq!(bucket.as_verbose().try_consume(2)?.time_until_full(), Duration::from_secs(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn time_until_full(&self) -> Duration {
        let s = &self.state;
        let view = Refilled::new(&self.configuration, self.now_nanos, |i| s[i]);
        Duration::from_nanos(view.reset_wait(0))
    }
}

/// The verbose view of a bucket (see [`Bucket::as_verbose`]).
///
/// ```
/// # use bucket4rs_local::Bucket; use std::time::Duration;
/// let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
/// let verbose = bucket.as_verbose();
/// assert_eq!(verbose.try_consume_as_much_as_possible().into_value(), 4);
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

    /// Runs any core operation verbosely.
    ///
    /// # Errors
    /// The operation's error.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// use bucket4rs_core::ops::AddTokens;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// let r = bucket.as_verbose().execute(AddTokens(1))?;
    /// assert_eq!(r.available_tokens_per_bandwidth(), vec![4]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn execute<O: Operation>(&self, op: O) -> Result<VerboseResult<O::Output>, OperationError> {
        let ((value, state), configuration, now_nanos) =
            self.bucket.run_verbose(ops::Verbose(op))?;
        Ok(VerboseResult {
            value,
            configuration,
            state,
            now_nanos,
        })
    }

    /// Verbose [`Bucket::try_consume`].
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert!(bucket.as_verbose().try_consume(4)?.into_value());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume(&self, tokens: u64) -> Result<VerboseResult<bool>, OperationError> {
        self.execute(ops::TryConsume(tokens))
    }

    /// Verbose [`Bucket::try_consume_and_return_remaining`].
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert!(bucket.as_verbose().try_consume_and_return_remaining(4)?.value().is_consumed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_and_return_remaining(
        &self,
        tokens: u64,
    ) -> Result<VerboseResult<ConsumptionProbe>, OperationError> {
        self.execute(ops::TryConsumeAndReturnRemaining(tokens))
    }

    /// Verbose [`Bucket::estimate_ability_to_consume`].
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert!(bucket.as_verbose().estimate_ability_to_consume(4)?.value().can_be_consumed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn estimate_ability_to_consume(
        &self,
        tokens: u64,
    ) -> Result<VerboseResult<EstimationProbe>, OperationError> {
        self.execute(ops::EstimateAbilityToConsume(tokens))
    }

    /// Verbose [`Bucket::try_consume_as_much_as_possible`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert_eq!(bucket.as_verbose().try_consume_as_much_as_possible().into_value(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_as_much_as_possible(&self) -> VerboseResult<u64> {
        match self.execute(ops::TryConsumeAsMuchAsPossible(None)) {
            Ok(r) => r,
            Err(_) => unreachable!("an unlimited consume-as-much-as-possible has no error"),
        }
    }

    /// Verbose [`Bucket::available_tokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// assert_eq!(bucket.as_verbose().available_tokens().into_value(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available_tokens(&self) -> VerboseResult<i64> {
        match self.execute(ops::AvailableTokens) {
            Ok(r) => r,
            Err(_) => unreachable!("available_tokens has no error"),
        }
    }

    /// Verbose [`Bucket::consume_ignoring_rate_limits`] (the value is the wait).
    ///
    /// # Errors
    /// See [`Bucket::consume_ignoring_rate_limits`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// # let bucket = Bucket::builder().add_limit(|l| l.capacity(4).refill_greedy(4, Duration::from_secs(4))).build()?;
    /// let r = bucket.as_verbose().consume_ignoring_rate_limits(5)?;
    /// assert_eq!(*r.value(), Duration::from_secs(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consume_ignoring_rate_limits(
        &self,
        tokens: u64,
    ) -> Result<VerboseResult<Duration>, OperationError> {
        let r = self.execute(ops::ConsumeIgnoringRateLimits(tokens))?;
        Ok(VerboseResult {
            value: Duration::from_nanos(r.value),
            configuration: r.configuration,
            state: r.state,
            now_nanos: r.now_nanos,
        })
    }
}
