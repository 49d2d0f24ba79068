//! The bucket type and its whole API, shared by every strategy.

use core::time::Duration;

use core::marker::PhantomData;

use bucket4rs_core::ops::{self, Operation};
use bucket4rs_core::{
    Answer, BucketConfiguration, BucketListener, BucketState, Clock, ConfigError, ConsumptionProbe,
    EstimationProbe, NoopListener, OperationError, Plain, TokensInheritanceStrategy, Verbose,
    VerboseResult,
};

use crate::builder::BucketBuilder;
use crate::clock::FastClock;
use crate::storage::{LockFree, Storage, Synchronized, Unsynchronized};

/// A token bucket held in process memory.
///
/// `S` is the synchronization strategy ([`LockFree`], [`Synchronized`] or [`Unsynchronized`]),
/// `C` the clock and `L` the listener; all three are type parameters, so every call is
/// monomorphized: no dynamic dispatch, no boxing, and the default [`NoopListener`] compiles
/// away. Use the aliases [`LockFreeBucket`], [`SynchronizedBucket`] and [`UnsyncBucket`].
///
/// `A` is how the bucket answers: [`Plain`] (the default: `try_consume` answers a `bool`) or,
/// on the view [`as_verbose`](Bucket::as_verbose) gives ([`VerboseBucket`]), [`Verbose`]: the
/// same methods, each answering a [`VerboseResult`] with the configuration and state. Where a
/// signature reads `A::Of<T>`, a plain bucket answers `T`.
///
/// ```
/// use bucket4rs_local::{Bucket, LockFreeBucket};
/// use std::time::Duration;
///
/// // 20 requests per minute, in bursts of at most 20.
/// let bucket: LockFreeBucket = Bucket::builder()
///     .add_limit(|l| l.capacity(20).refill_greedy(20, Duration::from_secs(60)))
///     .build()?;
/// if bucket.try_consume(1)? {
///     // serve the request
/// }
/// let probe = bucket.try_consume_and_return_remaining(1)?;
/// assert!(probe.is_consumed());
/// assert_eq!(probe.remaining_tokens(), 18);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Bucket<S = LockFree, C = FastClock, L = NoopListener, A = Plain> {
    storage: S,
    clock: C,
    listener: L,
    answer: PhantomData<fn() -> A>,
}

/// The verbose view of a bucket ([`Bucket::as_verbose`]): the same operations, each answering
/// a [`VerboseResult`] with the configuration, the state after the operation and its reading,
/// from which the diagnostics (tokens per bandwidth, time until full) are read. Costs more
/// than the plain API (the configuration and state are copied out), so use it where the answer
/// needs them, as for rate-limit response headers.
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
pub type VerboseBucket<'a, S, C, L> = Bucket<&'a S, &'a C, &'a L, Verbose>;

/// A lock-free bucket (the default strategy).
pub type LockFreeBucket<C = FastClock, L = NoopListener> = Bucket<LockFree, C, L>;
/// A bucket behind a `parking_lot` mutex.
pub type SynchronizedBucket<C = FastClock, L = NoopListener> = Bucket<Synchronized, C, L>;
/// A single-threaded bucket: `Send` but not `Sync`, so sharing it between threads does not
/// compile (the compiler then suggests a `RwLock` or a `Mutex`; the answer is a bucket built
/// to be shared: [`BucketBuilder::build`] for a lock-free one, or
/// [`BucketBuilder::build_synchronized`]).
///
/// ```compile_fail,E0277
/// # use bucket4rs_local::Bucket; use std::time::Duration;
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
///     .build_unsynchronized()?;
/// std::thread::scope(|s| {
///     s.spawn(|| bucket.try_consume(1)); // `RefCell<…>` cannot be shared between threads safely
/// });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// ```
/// # use bucket4rs_local::Bucket; use std::time::Duration;
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
///     .build()?; // lock-free: shared as it is
/// std::thread::scope(|s| {
///     s.spawn(|| bucket.try_consume(1));
///     s.spawn(|| bucket.try_consume(1));
/// });
/// assert_eq!(bucket.available_tokens(), 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type UnsyncBucket<C = FastClock, L = NoopListener> = Bucket<Unsynchronized, C, L>;

impl Bucket {
    /// Starts a bucket builder (default clock [`FastClock`], no listener).
    ///
    /// ```
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(5).refill_intervally(5, Duration::from_secs(1)))
    ///     .build()?;
    /// assert_eq!(bucket.available_tokens(), 5);
    /// # Ok::<(), bucket4rs_local::ConfigError>(())
    /// ```
    pub fn builder() -> BucketBuilder {
        BucketBuilder::new()
    }
}

impl<S, C, L, A> Bucket<S, C, L, A> {
    pub(crate) fn from_parts(storage: S, clock: C, listener: L) -> Self {
        Self {
            storage,
            clock,
            listener,
            answer: PhantomData,
        }
    }

    /// The storage (this crate's tests read a strategy's own diagnostics through it).
    #[cfg(test)]
    pub(crate) fn storage(&self) -> &S {
        &self.storage
    }

    /// The clock.
    ///
    /// ```
    /// # use bucket4rs_local::{Bucket, Clock, ManualClock}; use std::time::Duration;
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .with_clock(ManualClock::new(7))
    ///     .build()?;
    /// assert_eq!(bucket.clock().now_nanos(), 7);
    /// # Ok::<(), bucket4rs_local::ConfigError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The listener.
    ///
    /// ```
    /// # use bucket4rs_local::{Bucket, NoopListener}; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1))).build()?;
    /// assert_eq!(*bucket.listener(), NoopListener);
    /// # Ok::<(), bucket4rs_local::ConfigError>(())
    /// ```
    pub fn listener(&self) -> &L {
        &self.listener
    }

    /// This bucket answering as `B`: a view with the same storage, clock and listener, whose
    /// operations answer `B::Of<T>`. [`as_verbose`](Bucket::as_verbose) is
    /// `answering::<Verbose>()`; code generic over the answer (as the blocking and async views
    /// are) runs on the bucket answering as it does.
    ///
    /// ```
    /// use bucket4rs_local::{Answer, Bucket, Plain, Storage, Verbose};
    /// use std::time::Duration;
    ///
    /// // Takes a token and answers as `A` does.
    /// fn take<S: Storage, A: Answer>(bucket: &Bucket<S>) -> A::Of<bool> {
    ///     bucket.answering::<A>().try_consume(1).expect("one token is a valid request")
    /// }
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(60)))
    ///     .build()?;
    /// assert!(take::<_, Plain>(&bucket));
    /// assert_eq!(take::<_, Verbose>(&bucket).available_tokens(), 0);
    /// # Ok::<(), bucket4rs_local::ConfigError>(())
    /// ```
    pub fn answering<B: Answer>(&self) -> Bucket<&S, &C, &L, B> {
        Bucket::from_parts(&self.storage, &self.clock, &self.listener)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<S: Storage, C: Clock, L: BucketListener, A: Answer> Bucket<S, C, L, A> {
    /// Runs any core [`Operation`] at the current time and notifies the listener. The typed
    /// methods below are shorthands for it.
    ///
    /// # Errors
    /// The operation's [`OperationError`]; nothing changes then.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// use bucket4rs_core::ops::TryConsume;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(1))).build()?;
    /// assert!(bucket.execute(TryConsume(2))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn execute<O: Operation>(&self, op: O) -> Result<A::Of<O::Output>, OperationError> {
        A::pick(
            op,
            // A closure does not inherit `inline(always)`: without it the plain path is a
            // call of its own on every operation.
            #[inline(always)]
            |op| {
                let now = self.clock.now_nanos();
                let out = self.storage.execute(&op, now)?;
                // The state change is committed: a panicking listener cannot corrupt the bucket.
                op.notify(&out, &self.listener);
                Ok(out)
            },
            |op| {
                let now = self.clock.now_nanos();
                let op = ops::Verbose(op);
                let ((value, state), config) = self.storage.execute_with_config(&op, now)?;
                op.0.notify(&value, &self.listener);
                Ok(VerboseResult::new(value, config, state, now))
            },
        )
    }

    /// An operation without arguments, which has no error to report.
    #[inline(always)]
    fn infallible<O: Operation>(&self, op: O) -> A::Of<O::Output> {
        match self.execute(op) {
            Ok(answer) => answer,
            // Only argument checks fail, and these operations take no argument.
            Err(_) => unreachable!("an operation without arguments has no error"),
        }
    }

    /// Consumes `tokens` if every limit has them; `Ok(false)` (taking nothing) otherwise.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(60))).build()?;
    /// assert!(bucket.try_consume(2)?);
    /// assert!(!bucket.try_consume(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn try_consume(&self, tokens: u64) -> Result<A::Of<bool>, OperationError> {
        self.execute(ops::TryConsume(tokens))
    }

    /// Like [`try_consume`](Self::try_consume), also reporting the remaining tokens, the wait
    /// until the request could succeed and the wait until the bucket is full.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(60))).build()?;
    /// bucket.try_consume(2)?;
    /// let probe = bucket.try_consume_and_return_remaining(1)?;
    /// assert!(!probe.is_consumed());
    /// assert!(probe.wait_for_refill() <= Duration::from_secs(30));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_consume_and_return_remaining(
        &self,
        tokens: u64,
    ) -> Result<A::Of<ConsumptionProbe>, OperationError> {
        self.execute(ops::TryConsumeAndReturnRemaining(tokens))
    }

    /// Whether `tokens` could be consumed now, and the wait otherwise. Consumes nothing and
    /// notifies nobody.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(60))).build()?;
    /// assert!(bucket.estimate_ability_to_consume(2)?.can_be_consumed());
    /// assert_eq!(bucket.available_tokens(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn estimate_ability_to_consume(
        &self,
        tokens: u64,
    ) -> Result<A::Of<EstimationProbe>, OperationError> {
        self.execute(ops::EstimateAbilityToConsume(tokens))
    }

    /// Consumes every available token; returns how many (0 when empty or in debt).
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// assert_eq!(bucket.try_consume_as_much_as_possible(), 5);
    /// assert_eq!(bucket.try_consume_as_much_as_possible(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_as_much_as_possible(&self) -> A::Of<u64> {
        self.infallible(ops::TryConsumeAsMuchAsPossible(None))
    }

    /// Consumes the available tokens, at most `limit`; returns how many.
    ///
    /// # Errors
    /// [`OperationError::ZeroLimit`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// assert_eq!(bucket.try_consume_as_much_as_possible_with_limit(3)?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_as_much_as_possible_with_limit(
        &self,
        limit: u64,
    ) -> Result<A::Of<u64>, OperationError> {
        self.execute(ops::TryConsumeAsMuchAsPossible(Some(limit)))
    }

    /// Adds tokens, never above capacity.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// bucket.try_consume(5)?;
    /// bucket.add_tokens(2)?;
    /// assert_eq!(bucket.available_tokens(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_tokens(&self, tokens: u64) -> Result<A::Of<()>, OperationError> {
        self.execute(ops::AddTokens(tokens))
    }

    /// Adds tokens even above capacity (saturating at `i64::MAX`).
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`].
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// bucket.force_add_tokens(10)?;
    /// assert_eq!(bucket.available_tokens(), 15);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn force_add_tokens(&self, tokens: u64) -> Result<A::Of<()>, OperationError> {
        self.execute(ops::ForceAddTokens(tokens))
    }

    /// Refills every limit to exactly its capacity.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// bucket.try_consume(5)?;
    /// bucket.reset();
    /// assert_eq!(bucket.available_tokens(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset(&self) -> A::Of<()> {
        self.infallible(ops::Reset)
    }

    /// The tokens available now; negative while in debt.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// bucket.consume_ignoring_rate_limits(7)?;
    /// assert_eq!(bucket.available_tokens(), -2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn available_tokens(&self) -> A::Of<i64> {
        self.infallible(ops::AvailableTokens)
    }

    /// Consumes `tokens` whatever the balance and returns how long until the debt is repaid
    /// (zero without debt).
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], or [`OperationError::WaitTooLong`] when the debt could
    /// never be repaid (the wait exceeds `i64::MAX` nanoseconds); nothing is consumed then.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// assert_eq!(bucket.consume_ignoring_rate_limits(12)?, Duration::from_millis(200));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consume_ignoring_rate_limits(
        &self,
        tokens: u64,
    ) -> Result<A::Of<Duration>, OperationError> {
        let answer = self.execute(ops::ConsumeIgnoringRateLimits(tokens))?;
        Ok(A::map(answer, Duration::from_nanos))
    }

    /// Reserves `tokens` if the wait until they are paid for is at most `max_wait`, taking them
    /// now: returns the wait (the caller must then wait before acting), or `None` when it would
    /// be longer (nothing is taken). The primitive behind blocking and async consumption.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], or [`OperationError::ZeroMaxWait`] for a zero `max_wait`.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))).build()?;
    /// assert_eq!(bucket.reserve(15, Duration::from_secs(1))?, Some(Duration::from_millis(500)));
    /// assert_eq!(bucket.reserve(15, Duration::from_secs(1))?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve(
        &self,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<A::Of<Option<Duration>>, OperationError> {
        let op = ops::Reserve {
            tokens,
            max_wait_nanos: nanos(max_wait),
        };
        let answer = self.execute(op)?;
        Ok(A::map(answer, |w| w.map(Duration::from_nanos)))
    }

    /// Replaces the configuration; `strategy` says how tokens carry over (bandwidths are matched
    /// by id). Atomic with respect to concurrent consumption.
    ///
    /// # Errors
    /// [`ConfigError::AlignedRefillNeedsWallClock`] when the new configuration uses aligned
    /// refill and the clock is not wall-clock based; nothing changes then.
    ///
    /// ```
    /// # use bucket4rs_local::{Bandwidth, Bucket, BucketConfiguration, TokensInheritanceStrategy};
    /// # use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(60))).build()?;
    /// bucket.try_consume(60)?;
    /// let pro = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(200, Duration::from_secs(60))?).build()?;
    /// bucket.replace_configuration(pro, TokensInheritanceStrategy::Proportionally)?;
    /// assert_eq!(bucket.available_tokens(), 80);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replace_configuration(
        &self,
        config: BucketConfiguration,
        strategy: TokensInheritanceStrategy,
    ) -> Result<A::Of<()>, ConfigError> {
        let (config, state, now) = self.replace(config, strategy)?;
        Ok(A::from_verbose(VerboseResult::new((), config, state, now)))
    }

    /// [`replace_configuration`](Self::replace_configuration), answering the state it
    /// committed and the reading it ran at.
    pub(crate) fn replace(
        &self,
        config: BucketConfiguration,
        strategy: TokensInheritanceStrategy,
    ) -> Result<(BucketConfiguration, BucketState, i64), ConfigError> {
        let wall = self.clock.is_wall_clock_based();
        config.check_clock(wall)?;
        let now = self.clock.now_nanos();
        // A storage commits what its last call of the closure returned (a lock-free one may
        // call it again after a lost race).
        let committed = core::cell::RefCell::new(None);
        self.storage.replace_with(now, |old, read| {
            let list = (0..old.bandwidths().len()).map(read).collect();
            let state = BucketState::from_bandwidths(list)
                .replace_configuration(old, &config, now, strategy, wall)?;
            *committed.borrow_mut() = Some(state.clone());
            Ok((config.clone(), state))
        })?;
        let state = committed
            .into_inner()
            .unwrap_or_else(|| self.storage.snapshot(now).1);
        Ok((config, state, now))
    }
}

impl<S: Storage, C: Clock, L: BucketListener> Bucket<S, C, L> {
    /// The configuration in force.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// assert_eq!(bucket.configuration().bandwidths()[0].capacity(), 5);
    /// # Ok::<(), bucket4rs_local::ConfigError>(())
    /// ```
    pub fn configuration(&self) -> BucketConfiguration {
        self.storage.snapshot(self.clock.now_nanos()).0
    }

    /// A consistent copy of configuration and state, to persist and later restore with
    /// [`BucketBuilder::with_snapshot`]. State times are readings of this bucket's clock, so
    /// restore onto a clock with the same timeline (epoch-based clocks, such as the default,
    /// survive restarts).
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// bucket.try_consume(3)?;
    /// let copy = Bucket::builder().with_snapshot(bucket.snapshot())?.build()?;
    /// assert_eq!(copy.available_tokens(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot(&self) -> BucketSnapshot {
        let (configuration, state) = self.storage.snapshot(self.clock.now_nanos());
        BucketSnapshot {
            configuration,
            state,
        }
    }

    /// A view of this bucket whose operations also return the configuration and a diagnostics
    /// snapshot (Bucket4j's `asVerbose`).
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(5))).build()?;
    /// let result = bucket.as_verbose().try_consume(2)?;
    /// assert!(*result.value());
    /// assert_eq!(result.available_tokens_per_bandwidth(), vec![3]);
    /// assert_eq!(result.time_until_full(), Duration::from_secs(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_verbose(&self) -> VerboseBucket<'_, S, C, L> {
        self.answering()
    }

    /// A view sharing this bucket's state but notifying `listener` instead of this bucket's
    /// listener (Bucket4j's `toListenable`, which *replaces* the listener).
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// use bucket4rs_core::BucketListener;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    ///
    /// #[derive(Default)]
    /// struct Consumed(AtomicU64);
    /// impl BucketListener for Consumed {
    ///     fn on_consumed(&self, n: u64) { self.0.fetch_add(n, Ordering::Relaxed); }
    /// }
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(5))).build()?;
    /// let counter = Consumed::default();
    /// bucket.to_listenable(&counter).try_consume(2)?;
    /// assert_eq!(counter.0.load(Ordering::Relaxed), 2);
    /// assert_eq!(bucket.available_tokens(), 3); // same state
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_listenable<L2: BucketListener>(&self, listener: L2) -> Bucket<&S, &C, L2> {
        Bucket::from_parts(&self.storage, &self.clock, listener)
    }

    /// A view sharing this bucket's state that notifies this bucket's listener *and then*
    /// `listener` (composition; compare [`to_listenable`](Self::to_listenable), which
    /// replaces). The views can nest: `bucket.and_listener(a).and_listener(b)`.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// use bucket4rs_core::BucketListener;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    ///
    /// #[derive(Default)]
    /// struct Consumed(AtomicU64);
    /// impl BucketListener for Consumed {
    ///     fn on_consumed(&self, n: u64) { self.0.fetch_add(n, Ordering::Relaxed); }
    /// }
    /// let (first, second) = (Consumed::default(), Consumed::default());
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(5)))
    ///     .with_listener(&first)
    ///     .build()?;
    /// bucket.and_listener(&second).try_consume(2)?;
    /// assert_eq!(first.0.load(Ordering::Relaxed), 2); // kept
    /// assert_eq!(second.0.load(Ordering::Relaxed), 2); // added
    /// assert_eq!(bucket.available_tokens(), 3); // same state
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn and_listener<L2: BucketListener>(&self, listener: L2) -> Bucket<&S, &C, (&L, L2)> {
        Bucket::from_parts(&self.storage, &self.clock, (&self.listener, listener))
    }
}

/// A bucket's configuration and state, for persisting and restoring (serde with the `serde`
/// feature).
///
/// ```
/// # use bucket4rs_local::Bucket; use std::time::Duration;
/// let bucket = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
/// let snap = bucket.snapshot();
/// assert_eq!(snap.state().bandwidths()[0].tokens(), 5);
/// # Ok::<(), bucket4rs_local::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BucketSnapshot {
    configuration: BucketConfiguration,
    state: BucketState,
}

impl BucketSnapshot {
    /// A snapshot from its parts (checked when restored).
    ///
    /// ```
    /// # use bucket4rs_local::{Bandwidth, BucketConfiguration, BucketSnapshot, BucketState}; use std::time::Duration;
    /// let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// let s = BucketSnapshot::new(c.clone(), BucketState::new(&c, 0));
    /// assert_eq!(s.configuration(), &c);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(configuration: BucketConfiguration, state: BucketState) -> Self {
        Self {
            configuration,
            state,
        }
    }
    /// The configuration.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let b = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// assert_eq!(b.snapshot().configuration().bandwidths().len(), 1);
    /// # Ok::<(), bucket4rs_local::ConfigError>(())
    /// ```
    pub fn configuration(&self) -> &BucketConfiguration {
        &self.configuration
    }
    /// The state (not refilled: as last written).
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let b = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// assert_eq!(b.snapshot().state().bandwidths().len(), 1);
    /// # Ok::<(), bucket4rs_local::ConfigError>(())
    /// ```
    pub fn state(&self) -> &BucketState {
        &self.state
    }
    /// Splits the snapshot into its parts.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let b = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// let (config, state) = b.snapshot().into_parts();
    /// assert_eq!(config.bandwidths().len(), state.bandwidths().len());
    /// # Ok::<(), bucket4rs_local::ConfigError>(())
    /// ```
    pub fn into_parts(self) -> (BucketConfiguration, BucketState) {
        (self.configuration, self.state)
    }
}
