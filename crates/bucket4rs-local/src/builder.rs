//! The bucket builder.

use bucket4rs_core::{
    Bandwidth, BandwidthBuilder, BucketConfiguration, BucketListener, BucketState, Clock,
    ConfigError, ConfigurationBuilder, NoopListener, StateError,
};

use crate::bucket::{Bucket, BucketSnapshot, LockFreeBucket, SynchronizedBucket, UnsyncBucket};
use crate::clock::FastClock;
use crate::storage::{AnyStorage, NewStorage, SynchronizationStrategy};

/// Builds a [`Bucket`]: limits, clock, listener, then the strategy by the build method.
///
/// ```
/// use bucket4rs_local::{Bucket, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(0);
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
///     .with_clock(clock.clone())
///     .build_synchronized()?;
/// assert!(bucket.try_consume(10)?);
/// clock.advance(Duration::from_millis(100));
/// assert!(bucket.try_consume(1)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct BucketBuilder<C = FastClock, L = NoopListener> {
    /// The limits, and the first error of one that did not build.
    limits: ConfigurationBuilder,
    state: Option<BucketState>,
    clock: C,
    listener: L,
}

impl Default for BucketBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BucketBuilder {
    /// A builder with no limits, the [`FastClock`] and no listener.
    pub(crate) fn new() -> Self {
        Self {
            limits: ConfigurationBuilder::default(),
            state: None,
            clock: FastClock,
            listener: NoopListener,
        }
    }
}

impl<C: Clock, L: BucketListener> BucketBuilder<C, L> {
    /// Adds a limit configured by a closure on a [`BandwidthBuilder`]. A bad limit makes
    /// [`build`](Self::build) fail with its error.
    ///
    /// ```
    /// # use bucket4rs_local::{Bucket, ConfigError}; use std::time::Duration;
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(20).refill_greedy(20, Duration::from_secs(60)))
    ///     .build()?;
    /// assert_eq!(bucket.available_tokens(), 20);
    /// let err = Bucket::builder().add_limit(|l| l.capacity(0).refill_greedy(1, Duration::from_secs(1))).build();
    /// assert_eq!(err.unwrap_err(), ConfigError::ZeroCapacity);
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn add_limit(mut self, limit: impl FnOnce(BandwidthBuilder) -> BandwidthBuilder) -> Self {
        self.limits = core::mem::take(&mut self.limits).add_limit(limit);
        self
    }

    /// Adds a prebuilt limit.
    ///
    /// ```
    /// # use bucket4rs_local::{Bandwidth, Bucket}; use std::time::Duration;
    /// let bucket = Bucket::builder()
    ///     .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?)
    ///     .add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(60)))
    ///     .build()?;
    /// assert_eq!(bucket.configuration().bandwidths().len(), 2);
    /// # Ok::<(), bucket4rs_local::ConfigError>(())
    /// ```
    pub fn add_bandwidth(mut self, bandwidth: Bandwidth) -> Self {
        self.limits = core::mem::take(&mut self.limits).add_bandwidth(bandwidth);
        self
    }

    /// Uses every limit of `config` (after any added before).
    ///
    /// ```
    /// # use bucket4rs_local::{Bandwidth, Bucket, BucketConfiguration}; use std::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(1))?).build()?;
    /// let bucket = Bucket::builder().with_configuration(&config).build()?;
    /// assert_eq!(bucket.configuration(), config);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_configuration(self, config: &BucketConfiguration) -> Self {
        config
            .bandwidths()
            .iter()
            .cloned()
            .fold(self, Self::add_bandwidth)
    }

    /// Starts from a snapshot's configuration and state (replacing any limits added so far).
    ///
    /// # Errors
    /// A [`StateError`] when the snapshot's state does not fit its configuration.
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let a = Bucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(60))).build()?;
    /// a.try_consume(5)?;
    /// let b = Bucket::builder().with_snapshot(a.snapshot())?.build_synchronized()?;
    /// assert!(b.available_tokens() < 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_snapshot(mut self, snapshot: BucketSnapshot) -> Result<Self, StateError> {
        let (config, state) = snapshot.into_parts();
        state.check(&config)?;
        self.limits = ConfigurationBuilder::default();
        self.state = Some(state);
        Ok(self.with_configuration(&config))
    }

    /// Sets the clock (default [`FastClock`]); e.g. a
    /// [`ManualClock`](bucket4rs_core::ManualClock) in tests,
    /// [`SystemMillisClock`](bucket4rs_core::SystemMillisClock) for Bucket4j's default time
    /// meter (`withMillisecondPrecision`), or
    /// [`MonotonicClock`](bucket4rs_core::MonotonicClock) for its `SYSTEM_NANOTIME`
    /// (`withNanosecondPrecision`).
    ///
    /// ```
    /// # use bucket4rs_local::{Bucket, MonotonicClock}; use std::time::Duration;
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .with_clock(MonotonicClock::new())
    ///     .build()?;
    /// assert!(bucket.try_consume(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "with_nanosecond_precision")]
    #[doc(alias = "with_millisecond_precision")]
    #[doc(alias = "with_custom_time_precision")]
    pub fn with_clock<C2: Clock>(self, clock: C2) -> BucketBuilder<C2, L> {
        BucketBuilder {
            limits: self.limits,
            state: self.state,
            clock,
            listener: self.listener,
        }
    }

    /// Sets the listener (default: none, at zero cost).
    ///
    /// ```
    /// # use bucket4rs_local::{Bucket, NoopListener}; use std::time::Duration;
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .with_listener(NoopListener)
    ///     .build()?;
    /// assert!(bucket.try_consume(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_listener<L2: BucketListener>(self, listener: L2) -> BucketBuilder<C, L2> {
        BucketBuilder {
            limits: self.limits,
            state: self.state,
            clock: self.clock,
            listener,
        }
    }

    fn parts(self) -> Result<(BucketConfiguration, BucketState, C, L), ConfigError> {
        let config = self.limits.build()?;
        config.check_clock(self.clock.is_wall_clock_based())?;
        let state = match self.state {
            Some(s) => s,
            None => BucketState::new(&config, self.clock.now_nanos()),
        };
        Ok((config, state, self.clock, self.listener))
    }

    /// Builds a bucket on any storage type `S` (generic code; prefer the named methods).
    ///
    /// # Errors
    /// See [`build`](Self::build).
    ///
    /// ```
    /// # use bucket4rs_local::{Bucket, Synchronized}; use std::time::Duration;
    /// let b = Bucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .build_storage::<Synchronized>()?;
    /// assert!(b.try_consume(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_storage<S: NewStorage>(self) -> Result<Bucket<S, C, L>, ConfigError> {
        let (config, state, clock, listener) = self.parts()?;
        let monotonic = clock.is_monotonic();
        Ok(Bucket::from_parts(
            S::new(config, state, monotonic),
            clock,
            listener,
        ))
    }

    /// Builds a lock-free bucket (the default strategy).
    ///
    /// # Errors
    /// The first [`ConfigError`]: a bad limit, no limit, duplicate ids, or aligned refill on a
    /// clock that is not wall-clock based.
    ///
    /// ```
    /// # use bucket4rs_local::{Bucket, ConfigError};
    /// assert_eq!(Bucket::builder().build().unwrap_err(), ConfigError::NoBandwidths);
    /// ```
    pub fn build(self) -> Result<LockFreeBucket<C, L>, ConfigError> {
        self.build_storage()
    }

    /// Builds a bucket behind a `parking_lot` mutex.
    ///
    /// # Errors
    /// See [`build`](Self::build).
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let b = Bucket::builder().add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1))).build_synchronized()?;
    /// assert!(b.try_consume(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_synchronized(self) -> Result<SynchronizedBucket<C, L>, ConfigError> {
        self.build_storage()
    }

    /// Builds a single-threaded bucket (Bucket4j's `SynchronizationStrategy.NONE`): `Send` but
    /// not `Sync`, so it cannot be shared between threads; the compiler says so where it would
    /// be. To share a bucket, build it with [`build`](Self::build) (lock-free, no locking
    /// needed, put it in an `Arc` or a `static`) or [`build_synchronized`](Self::build_synchronized)
    /// instead of wrapping this one in a lock: the compiler's advice to use a `RwLock` or a
    /// `Mutex` works, but it is a slower synchronized bucket.
    ///
    /// # Errors
    /// See [`build`](Self::build).
    ///
    /// ```
    /// # use bucket4rs_local::Bucket; use std::time::Duration;
    /// let b = Bucket::builder().add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1))).build_unsynchronized()?;
    /// assert!(b.try_consume(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_unsynchronized(self) -> Result<UnsyncBucket<C, L>, ConfigError> {
        self.build_storage()
    }

    /// Builds a thread-safe bucket whose strategy is chosen at run time (e.g. read from a
    /// configuration file). The single-threaded strategy is not offered here: only the type
    /// system can prove a bucket stays on one thread, so it must be chosen at compile time.
    ///
    /// # Errors
    /// See [`build`](Self::build).
    ///
    /// ```
    /// # use bucket4rs_local::{Bucket, SynchronizationStrategy}; use std::time::Duration;
    /// let strategy: SynchronizationStrategy = "synchronized".parse()?;
    /// let b = Bucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .build_with(strategy)?;
    /// assert!(b.try_consume(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "with_synchronization_strategy")]
    pub fn build_with(
        self,
        strategy: SynchronizationStrategy,
    ) -> Result<Bucket<AnyStorage, C, L>, ConfigError> {
        let (config, state, clock, listener) = self.parts()?;
        let monotonic = clock.is_monotonic();
        Ok(Bucket::from_parts(
            AnyStorage::new_with(strategy, config, state, monotonic),
            clock,
            listener,
        ))
    }
}
