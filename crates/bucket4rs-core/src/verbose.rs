//! Verbose results: an operation's value together with the bucket as the operation left it.

use alloc::vec::Vec;
use core::time::Duration;

use crate::config::BucketConfiguration;
use crate::ops::Refilled;
use crate::state::BucketState;

/// What a verbose operation returns: its value, the configuration it ran under, the state it
/// left and the clock reading it ran at — Bucket4j's `VerboseResult`, for local and distributed
/// buckets alike.
///
/// The diagnostics ([`available_tokens`](Self::available_tokens),
/// [`available_tokens_per_bandwidth`](Self::available_tokens_per_bandwidth),
/// [`time_until_full`](Self::time_until_full)) are computed from the state refilled to the
/// operation's reading, so they describe the bucket at the instant of the operation.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
/// use core::time::Duration;
///
/// let config = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(10))?)
///     .build()?;
/// let mut state = BucketState::new(&config, 0);
/// let taken = state.apply(&config, 0, &bucket4rs_core::ops::TryConsume(4))?;
/// let result = VerboseResult::new(taken, config, state, 0);
/// assert!(*result.value());
/// assert_eq!(result.available_tokens(), 6);
/// assert_eq!(result.time_until_full(), Duration::from_secs(4));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[doc(alias = "diagnostics")]
pub struct VerboseResult<T> {
    value: T,
    configuration: BucketConfiguration,
    state: BucketState,
    now_nanos: i64,
}

impl<T> VerboseResult<T> {
    /// A result: `value`, computed on `state` under `configuration` at clock reading
    /// `now_nanos`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// let r = VerboseResult::new("x", config.clone(), BucketState::new(&config, 5), 5);
    /// assert_eq!((*r.value(), r.now_nanos()), ("x", 5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(
        value: T,
        configuration: BucketConfiguration,
        state: BucketState,
        now_nanos: i64,
    ) -> Self {
        Self {
            value,
            configuration,
            state,
            now_nanos,
        }
    }

    /// The operation's value.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// assert_eq!(*VerboseResult::new(7, config.clone(), BucketState::new(&config, 0), 0).value(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The operation's value, by value.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// assert_eq!(VerboseResult::new(7, config.clone(), BucketState::new(&config, 0), 0).into_value(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_value(self) -> T {
        self.value
    }

    /// The same result with its value mapped by `f`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// let r = VerboseResult::new(7, config.clone(), BucketState::new(&config, 0), 0).map(|v| v * 2);
    /// assert_eq!(*r.value(), 14);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> VerboseResult<U> {
        VerboseResult {
            value: f(self.value),
            configuration: self.configuration,
            state: self.state,
            now_nanos: self.now_nanos,
        }
    }

    /// The configuration the operation ran under.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// let r = VerboseResult::new((), config.clone(), BucketState::new(&config, 0), 0);
    /// assert_eq!(r.configuration(), &config);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn configuration(&self) -> &BucketConfiguration {
        &self.configuration
    }

    /// The state the operation left (not necessarily refilled to the operation's reading: a
    /// store may keep the state an operation that changed nothing found).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// let r = VerboseResult::new((), config.clone(), BucketState::new(&config, 0), 0);
    /// assert_eq!(r.state().bandwidths()[0].tokens(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn state(&self) -> &BucketState {
        &self.state
    }

    /// The clock reading the operation ran at, in nanoseconds (Bucket4j's
    /// `getOperationTimeNanos`).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// assert_eq!(VerboseResult::new((), config.clone(), BucketState::new(&config, 0), 42).now_nanos(), 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "operation_time_nanos")]
    pub fn now_nanos(&self) -> i64 {
        self.now_nanos
    }

    fn view(&self) -> Refilled<'_, impl Fn(usize) -> crate::BandwidthState + '_> {
        let b = self.state.bandwidths();
        Refilled::new(&self.configuration, self.now_nanos, move |i| {
            b.get(i).copied().unwrap_or_default()
        })
    }

    /// Tokens available at the operation's reading: the minimum over the bandwidths (negative
    /// while the bucket is in debt).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// let r = VerboseResult::new((), config.clone(), BucketState::new(&config, 0), 0);
    /// assert_eq!(r.available_tokens(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available_tokens(&self) -> i64 {
        self.view().available()
    }

    /// Tokens of each bandwidth at the operation's reading, in configuration order.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// let config = BucketConfiguration::builder()
    ///     .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?)
    ///     .add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60))?)
    ///     .build()?;
    /// let r = VerboseResult::new((), config.clone(), BucketState::new(&config, 0), 0);
    /// assert_eq!(r.available_tokens_per_bandwidth(), [10, 100]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "available_tokens_per_each_bandwidth")]
    pub fn available_tokens_per_bandwidth(&self) -> Vec<i64> {
        let view = self.view();
        (0..view.len()).map(|i| view.get(i).tokens()).collect()
    }

    /// Time from the operation's reading until every bandwidth is full again (zero when it
    /// is; saturating at `i64::MAX` nanoseconds).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, VerboseResult};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// let mut state = BucketState::new(&config, 0);
    /// state.apply(&config, 0, &bucket4rs_core::ops::TryConsume(5))?;
    /// let r = VerboseResult::new((), config, state, 0);
    /// assert_eq!(r.time_until_full(), Duration::from_millis(500));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "calculate_full_refilling_time")]
    pub fn time_until_full(&self) -> Duration {
        Duration::from_nanos(self.view().reset_wait(0))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Plain {}
    impl Sealed for super::Verbose {}
}

/// How a bucket view answers: with each operation's value ([`Plain`], every bucket's default),
/// or with that value inside a [`VerboseResult`] ([`Verbose`], what `as_verbose` gives).
///
/// The answer is a type parameter of the bucket types rather than a second set of methods:
/// `try_consume` is one method whose return type is `A::Of<bool>`, which is `bool` on a plain
/// bucket and `VerboseResult<bool>` on a verbose one. Sealed: [`Plain`] and [`Verbose`] are the
/// two answers; code generic over `A: Answer` uses the methods below to compute and unwrap them.
///
/// ```
/// use bucket4rs_core::{Answer, Plain, Verbose, VerboseResult};
///
/// fn plain(answer: <Plain as Answer>::Of<bool>) -> bool {
///     answer
/// }
/// fn verbose(answer: <Verbose as Answer>::Of<bool>) -> VerboseResult<bool> {
///     answer
/// }
/// # let _ = (plain, verbose);
/// ```
pub trait Answer: sealed::Sealed + Send + Sync + 'static {
    /// What an operation whose value is `T` answers: `T`, or a `VerboseResult<T>`.
    type Of<T>;

    /// Runs `plain` for a plain answer and `verbose` for a verbose one, either with `input`:
    /// how code generic over the answer (a bucket's `execute`, the blocking and async views)
    /// computes only what its answer needs. Chosen at compile time.
    ///
    /// # Errors
    /// Whatever the closure that runs returns.
    ///
    /// ```
    /// use bucket4rs_core::{Answer, Plain, Verbose, VerboseResult};
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState}; use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// fn answer<A: Answer>(config: &BucketConfiguration) -> Result<A::Of<u8>, ()> {
    ///     A::pick(
    ///         7,
    ///         |v| Ok(v),
    ///         |v| Ok(VerboseResult::new(v, config.clone(), BucketState::new(config, 0), 0)),
    ///     )
    /// }
    /// assert_eq!(answer::<Plain>(&config), Ok(7));
    /// assert_eq!(answer::<Verbose>(&config).map(|r| r.into_value()), Ok(7));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn pick<X, T, E>(
        input: X,
        plain: impl FnOnce(X) -> Result<T, E>,
        verbose: impl FnOnce(X) -> Result<VerboseResult<T>, E>,
    ) -> Result<Self::Of<T>, E>;

    /// The answer to a verbose result: its value for a plain answer, itself for a verbose one.
    ///
    /// ```
    /// use bucket4rs_core::{Answer, Plain, VerboseResult};
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState}; use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// let result = VerboseResult::new(true, config.clone(), BucketState::new(&config, 0), 0);
    /// assert!(Plain::from_verbose(result));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn from_verbose<T>(result: VerboseResult<T>) -> Self::Of<T>;

    /// Maps the value inside an answer, keeping the rest of a verbose one.
    ///
    /// ```
    /// use bucket4rs_core::{Answer, Plain};
    /// assert_eq!(Plain::map(20_u64, |n| n * 2), 40);
    /// ```
    fn map<T, U>(answer: Self::Of<T>, f: impl FnOnce(T) -> U) -> Self::Of<U>;

    /// The value inside an answer.
    ///
    /// ```
    /// use bucket4rs_core::{Answer, Plain};
    /// assert_eq!(*Plain::value(&5_u8), 5);
    /// ```
    fn value<T>(answer: &Self::Of<T>) -> &T;
}

/// The plain [`Answer`]: each operation answers its value.
///
/// ```
/// # use bucket4rs_core::{Answer, Plain};
/// let yes: <Plain as Answer>::Of<bool> = true;
/// # let _ = yes;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plain {}

/// The verbose [`Answer`]: each operation answers a [`VerboseResult`] with the configuration,
/// the state the operation left and its reading, from which the diagnostics are read.
///
/// ```
/// # use bucket4rs_core::{Answer, Verbose, VerboseResult};
/// fn value(answer: <Verbose as Answer>::Of<u64>) -> u64 {
///     answer.into_value()
/// }
/// # let _ = value;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verbose {}

impl Answer for Plain {
    type Of<T> = T;

    #[inline(always)]
    fn pick<X, T, E>(
        input: X,
        plain: impl FnOnce(X) -> Result<T, E>,
        _verbose: impl FnOnce(X) -> Result<VerboseResult<T>, E>,
    ) -> Result<T, E> {
        plain(input)
    }

    #[inline(always)]
    fn from_verbose<T>(result: VerboseResult<T>) -> T {
        result.into_value()
    }

    #[inline(always)]
    fn map<T, U>(answer: T, f: impl FnOnce(T) -> U) -> U {
        f(answer)
    }

    #[inline(always)]
    fn value<T>(answer: &T) -> &T {
        answer
    }
}

impl Answer for Verbose {
    type Of<T> = VerboseResult<T>;

    #[inline]
    fn pick<X, T, E>(
        input: X,
        _plain: impl FnOnce(X) -> Result<T, E>,
        verbose: impl FnOnce(X) -> Result<VerboseResult<T>, E>,
    ) -> Result<VerboseResult<T>, E> {
        verbose(input)
    }

    #[inline]
    fn from_verbose<T>(result: VerboseResult<T>) -> VerboseResult<T> {
        result
    }

    #[inline]
    fn map<T, U>(answer: VerboseResult<T>, f: impl FnOnce(T) -> U) -> VerboseResult<U> {
        answer.map(f)
    }

    #[inline]
    fn value<T>(answer: &VerboseResult<T>) -> &T {
        answer.value()
    }
}
