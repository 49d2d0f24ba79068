//! Operations as values: each one plans its result and its state change on a refilled view of
//! the state (SEMANTICS.md section 6).
//!
//! [`execute`] is the single engine every bucket runs: it reads each bandwidth's state through
//! a closure, refills it, lets the operation decide, and — only when the state changes — writes
//! each new bandwidth state through a second closure. Local buckets point the closures at their
//! atomics, mutex or cell; distributed backends at decoded bytes. No allocation, no clock.
//!
//! ```
//! use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, BucketState, ops};
//! use core::time::Duration;
//!
//! let config = BucketConfiguration::builder()
//!     .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?)
//!     .build()?;
//! let mut slot = BucketState::new(&config, 0).bandwidths()[0];
//! let cell = core::cell::Cell::new(slot);
//! let taken = ops::execute(&bucket4rs_core::ops::TryConsume(4), &config, 0, |_| cell.get(), |_, s| cell.set(s))?;
//! assert!(taken);
//! assert_eq!(cell.get().tokens(), 6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use core::time::Duration;

use crate::config::{Bandwidth, BucketConfiguration};
use crate::error::OperationError;
use crate::listener::BucketListener;
use crate::math::{self, MAX};
use crate::state::{BandwidthState, ScaledState};

/// How many refilled bandwidth states are cached on the stack; beyond this they are recomputed
/// on each access (still without allocating).
const INLINE: usize = 2;

/// A read-only view of a bucket's state, refilled to `now`, that operations plan on.
#[derive(Debug)]
pub struct Refilled<'a, R> {
    config: &'a BucketConfiguration,
    now: i64,
    read: R,
    cache: [BandwidthState; INLINE],
}

impl<'a, R: Fn(usize) -> BandwidthState> Refilled<'a, R> {
    /// Refills the states returned by `read` to `now`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Refilled};
    /// # use core::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// let state = BucketState::new(&config, 0);
    /// let view = Refilled::new(&config, 0, |i| state.bandwidths()[i]);
    /// assert_eq!(view.available(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(config: &'a BucketConfiguration, now: i64, read: R) -> Self {
        let mut cache = [BandwidthState::default(); INLINE];
        for (i, (slot, b)) in cache.iter_mut().zip(config.bandwidths()).enumerate() {
            *slot = math::refill(b, read(i), now);
        }
        Self {
            config,
            now,
            read,
            cache,
        }
    }

    /// The configuration the view's state belongs to.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Refilled};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// assert_eq!(Refilled::new(&config, 0, |i| state.bandwidths()[i]).configuration(), &config);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn configuration(&self) -> &'a BucketConfiguration {
        self.config
    }

    /// The clock reading the view is refilled to.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Refilled};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// assert_eq!(Refilled::new(&config, 42, |i| state.bandwidths()[i]).now(), 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn now(&self) -> i64 {
        self.now
    }

    /// Number of bandwidths.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Refilled};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// assert_eq!(Refilled::new(&config, 0, |i| state.bandwidths()[i]).len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[allow(clippy::len_without_is_empty)] // a configuration is never empty
    pub fn len(&self) -> usize {
        self.config.bandwidths().len()
    }

    /// The refilled state of bandwidth `i`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Refilled};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// assert_eq!(Refilled::new(&config, 0, |i| state.bandwidths()[i]).get(0).tokens(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn get(&self, i: usize) -> BandwidthState {
        if i < INLINE {
            self.cache[i]
        } else {
            math::refill(&self.config.bandwidths()[i], (self.read)(i), self.now)
        }
    }

    #[inline]
    fn each(&self) -> impl Iterator<Item = (&Bandwidth, BandwidthState)> + '_ {
        self.config
            .bandwidths()
            .iter()
            .enumerate()
            .map(|(i, b)| (b, self.get(i)))
    }

    /// Available tokens: the minimum balance over the bandwidths.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Refilled};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// assert_eq!(Refilled::new(&config, 0, |i| state.bandwidths()[i]).available(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn available(&self) -> i64 {
        self.each().map(|(_, s)| s.tokens).min().unwrap_or(0)
    }

    /// Wait for `n` tokens (section 5.2); `strict` makes requests above a capacity wait `MAX`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Refilled};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// let view = Refilled::new(&config, 0, |i| state.bandwidths()[i]);
    /// assert_eq!(view.request_wait(11, true), i64::MAX as u64);
    /// assert_eq!(view.request_wait(11, false), 100_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn request_wait(&self, n: u64, strict: bool) -> u64 {
        self.each()
            .map(|(b, s)| math::request_wait(b, &s, self.now, n, strict))
            .max()
            .unwrap_or(0) as u64
    }

    /// Time until every bandwidth is full, after subtracting `consumed` tokens (section 5.3).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Refilled};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// let view = Refilled::new(&config, 0, |i| state.bandwidths()[i]);
    /// assert_eq!(view.reset_wait(0), 0);
    /// assert_eq!(view.reset_wait(5), 500_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset_wait(&self, consumed: u64) -> u64 {
        self.each()
            .map(|(b, s)| {
                let s = if consumed == 0 {
                    s
                } else {
                    Mutation::Consume(consumed).apply(b, s)
                };
                math::reset_wait(b, &s, self.now)
            })
            .max()
            .unwrap_or(0) as u64
    }
}

/// A state change, applied to every refilled bandwidth state.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BandwidthState, ops::Mutation}; use core::time::Duration;
/// let b = Bandwidth::simple(10, Duration::from_secs(1))?;
/// let s = Mutation::AddTokens(100).apply(&b, BandwidthState::from_parts(0, 3, 0));
/// assert_eq!(s.tokens(), 10);
/// # Ok::<(), bucket4rs_core::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mutation {
    /// Subtract tokens (callers guarantee the result stays above `-i64::MAX`).
    Consume(u64),
    /// Add tokens up to capacity.
    AddTokens(u64),
    /// Add tokens beyond capacity, saturating at `i64::MAX`.
    ForceAddTokens(u64),
    /// Set the balance to capacity.
    Reset,
}

impl Mutation {
    /// The new state of bandwidth `b` whose refilled state is `s`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BandwidthState, ops::Mutation}; use core::time::Duration;
    /// let b = Bandwidth::simple(10, Duration::from_secs(1))?;
    /// assert_eq!(Mutation::Consume(4).apply(&b, BandwidthState::from_parts(0, 3, 0)).tokens(), -1);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    #[inline]
    pub fn apply(self, b: &Bandwidth, s: BandwidthState) -> BandwidthState {
        let tokens = s.tokens as i128;
        match self {
            Self::Consume(n) => {
                let t = (tokens - n as i128).max(i64::MIN as i128 + 1);
                BandwidthState {
                    tokens: t as i64,
                    ..s
                }
            }
            Self::AddTokens(n) => {
                if tokens + n as i128 >= b.capacity as i128 {
                    BandwidthState {
                        tokens: b.capacity,
                        remainder: 0,
                        ..s
                    }
                } else {
                    BandwidthState {
                        tokens: (tokens + n as i128) as i64,
                        ..s
                    }
                }
            }
            Self::ForceAddTokens(n) => {
                if tokens + n as i128 > MAX as i128 {
                    BandwidthState {
                        tokens: MAX,
                        remainder: 0,
                        ..s
                    }
                } else {
                    BandwidthState {
                        tokens: (tokens + n as i128) as i64,
                        ..s
                    }
                }
            }
            Self::Reset => BandwidthState {
                tokens: b.capacity,
                remainder: 0,
                ..s
            },
        }
    }
}

/// One bucket operation: plans its output and state change on a refilled view.
///
/// Implemented by the structs of this module; buckets of every kind run them through
/// [`execute`], so all of them compute the same results.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::{AvailableTokens, Operation, Refilled}};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// # let state = BucketState::new(&config, 0);
/// let view = Refilled::new(&config, 0, |i| state.bandwidths()[i]);
/// let (available, change) = AvailableTokens.plan(&view)?;
/// assert_eq!((available, change), (10, None));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Operation {
    /// What the operation returns.
    type Output;

    /// Decides the output, and the state change if any, from the refilled view.
    ///
    /// # Errors
    /// An [`OperationError`] for invalid arguments or an impossible reservation.
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(Self::Output, Option<Mutation>), OperationError>;

    /// Tells `listener` what the operation did (only consumption notifies).
    fn notify<L: BucketListener + ?Sized>(&self, _output: &Self::Output, _listener: &L) {}

    /// Whether [`plan_single`](Operation::plan_single) is implemented (a compile-time switch,
    /// so operations without a shortcut pay nothing for it).
    #[doc(hidden)]
    const HAS_SINGLE: bool = false;

    /// A shortcut for a bucket with a single bandwidth `b` whose refilled state is `s`: the
    /// same result as [`plan`](Operation::plan), computed directly, with the new state when it
    /// changes. `None` (the default) means "use `plan`".
    #[doc(hidden)]
    #[inline]
    fn plan_single(
        &self,
        _b: &Bandwidth,
        _s: BandwidthState,
        _now: i64,
    ) -> Option<Single<Self::Output>> {
        None
    }

    /// For an operation that takes a fixed number of tokens when the bucket has them and
    /// nothing otherwise (`try_consume`): that number and its output either way. A compact
    /// one-bandwidth bucket (the core's compact form) runs such an operation as the GCRA's step, with
    /// the fewest operations between the clock reading and the compare-and-swap. `None` (the
    /// default): not such an operation. It must agree with [`plan`](Operation::plan).
    ///
    /// ```
    /// # use bucket4rs_core::ops::{Operation, TryConsume};
    /// let take = TryConsume(3).take().expect("try_consume takes");
    /// assert_eq!((take.tokens, take.taken, take.refused), (Ok(3), true, false));
    /// ```
    #[doc(hidden)]
    #[inline]
    fn take(&self) -> Option<Take<Self::Output>> {
        None
    }

    /// Whether [`plan_scaled`](Operation::plan_scaled) is implemented (a compile-time switch).
    #[doc(hidden)]
    const HAS_SCALED: bool = false;

    /// A shortcut on the scaled form of a single greedy bandwidth `b` whose refilled state is
    /// `s` (see `ScaledState`): the same result as [`plan_single`](Operation::plan_single),
    /// computed without division. `None` (the default, or when a value does not fit) means
    /// "decode and use `plan_single`".
    #[doc(hidden)]
    #[inline]
    fn plan_scaled(&self, _b: &Bandwidth, _s: ScaledState) -> Option<Scaled<Self::Output>> {
        None
    }
}

/// The result of [`Operation::plan_single`]: the output and the new state, if it changed.
#[doc(hidden)]
pub type Single<T> = Result<(T, Option<BandwidthState>), OperationError>;

/// The result of [`Operation::plan_scaled`]: the output and the new scaled state, if it changed.
#[doc(hidden)]
pub type Scaled<T> = Result<(T, Option<ScaledState>), OperationError>;

/// An operation's decision, made on a refilled view and not yet written anywhere.
///
/// Produced by [`plan`]; [`Plan::write`] hands out the new bandwidth states when the operation
/// changes the state. Local lock-free buckets use it to decide before claiming a slot.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let state = BucketState::new(&config, 0);
/// let plan = ops::plan(&bucket4rs_core::ops::TryConsume(4), &config, 0, |i| state.bandwidths()[i])?;
/// assert!(plan.changes());
/// let mut tokens = 0;
/// plan.write(|_, s| tokens = s.tokens());
/// assert_eq!(tokens, 6);
/// assert!(plan.into_output());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(hidden)]
#[derive(Debug)]
pub struct Plan<'a, R, T> {
    output: T,
    change: Change<'a, R>,
}

#[derive(Debug)]
enum Change<'a, R> {
    /// A single bandwidth's new state, if any.
    Single(Option<BandwidthState>),
    /// A mutation of every bandwidth of the refilled view.
    General(Refilled<'a, R>, Option<Mutation>),
}

impl<R: Fn(usize) -> BandwidthState, T> Plan<'_, R, T> {
    /// Whether the operation changes the state.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// assert!(!ops::plan(&bucket4rs_core::ops::AvailableTokens, &config, 0, |i| state.bandwidths()[i])?.changes());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn changes(&self) -> bool {
        match &self.change {
            Change::Single(s) => s.is_some(),
            Change::General(_, m) => m.is_some(),
        }
    }

    /// Passes every bandwidth's new state to `write` (nothing when the state is unchanged).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// let mut calls = 0;
    /// ops::plan(&bucket4rs_core::ops::Reset, &config, 0, |i| state.bandwidths()[i])?.write(|_, _| calls += 1);
    /// assert_eq!(calls, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn write(&self, mut write: impl FnMut(usize, BandwidthState)) {
        match &self.change {
            Change::Single(Some(s)) => write(0, *s),
            Change::Single(None) | Change::General(_, None) => {}
            Change::General(view, Some(m)) => {
                for (i, b) in view.config.bandwidths().iter().enumerate() {
                    write(i, m.apply(b, view.get(i)));
                }
            }
        }
    }

    /// The operation's output.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops};
    /// # use core::time::Duration;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// # let state = BucketState::new(&config, 0);
    /// assert_eq!(ops::plan(&bucket4rs_core::ops::AvailableTokens, &config, 0, |i| state.bandwidths()[i])?.into_output(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn into_output(self) -> T {
        self.output
    }
}

/// Plans `op` on the state read through `read`, refilled to `now`, without writing anything.
///
/// # Errors
/// The operation's [`OperationError`].
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// # let state = BucketState::new(&config, 0);
/// assert!(ops::plan(&bucket4rs_core::ops::TryConsume(0), &config, 0, |i| state.bandwidths()[i]).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(hidden)]
#[inline]
pub fn plan<'a, O, R>(
    op: &O,
    config: &'a BucketConfiguration,
    now: i64,
    read: R,
) -> Result<Plan<'a, R, O::Output>, OperationError>
where
    O: Operation + ?Sized,
    R: Fn(usize) -> BandwidthState,
{
    if let Some(single) = plan_one(op, config, now, || read(0)) {
        let (output, state) = single?;
        return Ok(Plan {
            output,
            change: Change::Single(state),
        });
    }
    let view = Refilled::new(config, now, read);
    let (output, mutation) = op.plan(&view)?;
    Ok(Plan {
        output,
        change: Change::General(view, mutation),
    })
}

/// The single-bandwidth shortcut: for a one-bandwidth `config` and an operation that has one,
/// the output and the new state of that bandwidth (if it changes), read through `read`;
/// `None` otherwise (then use [`plan`]). Storages call it first to skip the general engine.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let state = BucketState::new(&config, 0);
/// let (taken, new) = ops::plan_one(&bucket4rs_core::ops::TryConsume(3), &config, 0, || state.bandwidths()[0])
///     .expect("one bandwidth, and try_consume has a shortcut")?;
/// assert!(taken);
/// assert_eq!(new.map(|s| s.tokens()), Some(7));
/// assert!(ops::plan_one(&bucket4rs_core::ops::Reset, &config, 0, || state.bandwidths()[0]).is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(hidden)]
#[inline]
pub fn plan_one<O, R>(
    op: &O,
    config: &BucketConfiguration,
    now: i64,
    read: R,
) -> Option<Single<O::Output>>
where
    O: Operation + ?Sized,
    R: FnOnce() -> BandwidthState,
{
    if !O::HAS_SINGLE {
        return None;
    }
    match config.bandwidths() {
        [b] => op.plan_single(b, math::refill(b, read(), now), now),
        _ => None,
    }
}

/// The operation on a one-bandwidth bucket, whose only bandwidth is `b` and whose state is held
/// in the scaled form (see [`ScaledState`]): refill and decision without division, exactly as
/// [`plan_one`] decides. `None` when the operation has no scaled shortcut, `b` is not a greedy
/// bandwidth whose scaled capacity fits `i64`, or a value does not fit: decode and use
/// [`plan_one`] then.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops}; use bucket4rs_core::__private::{ScaledState};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let b = &config.bandwidths()[0];
/// let s = ScaledState::from_state(b, BucketState::new(&config, 0).bandwidths()[0]).expect("fits");
/// let (taken, new) = ops::plan_scaled(&bucket4rs_core::ops::TryConsume(3), b, 0, s).expect("shortcut")?;
/// assert!(taken);
/// assert_eq!(new.map(|s| s.to_state(b).tokens()), Some(7));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[doc(hidden)]
#[inline]
pub fn plan_scaled<O>(op: &O, b: &Bandwidth, now: i64, s: ScaledState) -> Option<Scaled<O::Output>>
where
    O: Operation + ?Sized,
{
    if !O::HAS_SCALED {
        return None;
    }
    op.plan_scaled(b, math::refill_scaled(b, s, now)?)
}

/// What [`Operation::take`] describes: a fixed take and the output either way.
///
/// ```
/// # use bucket4rs_core::{OperationError, ops::{Operation, TryConsume}};
/// assert_eq!(TryConsume(0).take().map(|t| t.tokens), Some(Err(OperationError::ZeroTokens)));
/// ```
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Take<T> {
    /// The tokens taken, or why the request is invalid.
    pub tokens: Result<u64, OperationError>,
    /// The output when they were taken.
    pub taken: T,
    /// The output when they were not.
    pub refused: T,
}

/// Runs `op` on the state read through `read` at clock reading `now`; when the state changes,
/// every bandwidth's new state is passed to `write` (after all reads).
///
/// # Errors
/// The operation's [`OperationError`]; `write` is then never called.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let state = BucketState::new(&config, 0);
/// let mut written = 0;
/// let ok = ops::execute(&bucket4rs_core::ops::TryConsume(1), &config, 0, |i| state.bandwidths()[i], |_, _| written += 1)?;
/// assert!(ok);
/// assert_eq!(written, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[inline]
pub fn execute<O, R, W>(
    op: &O,
    config: &BucketConfiguration,
    now: i64,
    read: R,
    write: W,
) -> Result<O::Output, OperationError>
where
    O: Operation + ?Sized,
    R: Fn(usize) -> BandwidthState,
    W: FnMut(usize, BandwidthState),
{
    let plan = plan(op, config, now, read)?;
    plan.write(write);
    Ok(plan.into_output())
}

fn check_tokens(n: u64) -> Result<u64, OperationError> {
    if n == 0 {
        Err(OperationError::ZeroTokens)
    } else {
        Ok(n)
    }
}

/// Consume `n` tokens if every bandwidth has them. Output: whether they were consumed.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::TryConsume};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// assert!(!state.apply(&config, 0, &TryConsume(11))?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TryConsume(pub u64);

impl Operation for TryConsume {
    type Output = bool;
    const HAS_SINGLE: bool = true;
    #[inline]
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(bool, Option<Mutation>), OperationError> {
        let n = check_tokens(self.0)?;
        if n as i128 <= view.available() as i128 {
            Ok((true, Some(Mutation::Consume(n))))
        } else {
            Ok((false, None))
        }
    }
    fn notify<L: BucketListener + ?Sized>(&self, consumed: &bool, listener: &L) {
        if *consumed {
            listener.on_consumed(self.0)
        } else {
            listener.on_rejected(self.0)
        }
    }
    #[inline]
    fn plan_single(&self, b: &Bandwidth, s: BandwidthState, _now: i64) -> Option<Single<bool>> {
        Some(check_tokens(self.0).map(|n| {
            if n as i128 <= s.tokens as i128 {
                (true, Some(Mutation::Consume(n).apply(b, s)))
            } else {
                (false, None)
            }
        }))
    }
    #[inline]
    fn take(&self) -> Option<Take<bool>> {
        Some(Take {
            tokens: check_tokens(self.0),
            taken: true,
            refused: false,
        })
    }
    const HAS_SCALED: bool = true;
    #[inline]
    fn plan_scaled(&self, b: &Bandwidth, s: ScaledState) -> Option<Scaled<bool>> {
        let n = match check_tokens(self.0) {
            Ok(n) => n,
            Err(e) => return Some(Err(e)),
        };
        // tokens >= n  <=>  balance >= n × unit (the remainder part is below one unit). A
        // product beyond i64 exceeds every balance: rejected.
        let need = i64::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(b.balance_unit.get() as i64));
        match need {
            // balance >= need >= 0: no overflow.
            Some(need) if s.balance() >= need => {
                let left = ScaledState::new(s.last_refill_nanos(), s.balance() - need);
                Some(Ok((true, Some(left))))
            }
            _ => Some(Ok((false, None))),
        }
    }
}

/// The result of [`TryConsumeAndReturnRemaining`].
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// let probe = state.apply(&config, 0, &bucket4rs_core::ops::TryConsumeAndReturnRemaining(11))?;
/// assert!(!probe.is_consumed());
/// assert_eq!(probe.remaining_tokens(), 10);
/// assert_eq!(probe.nanos_to_wait_for_refill(), i64::MAX as u64); // 11 > capacity: never
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConsumptionProbe {
    consumed: bool,
    remaining_tokens: u64,
    nanos_to_wait_for_refill: u64,
    nanos_to_wait_for_reset: u64,
}

impl ConsumptionProbe {
    /// A probe from its parts (used by backends that decode results).
    ///
    /// ```
    /// # use bucket4rs_core::ConsumptionProbe;
    /// assert!(ConsumptionProbe::new(true, 1, 0, 5).is_consumed());
    /// ```
    #[doc(hidden)]
    pub const fn new(
        consumed: bool,
        remaining: u64,
        wait_for_refill: u64,
        wait_for_reset: u64,
    ) -> Self {
        Self {
            consumed,
            remaining_tokens: remaining,
            nanos_to_wait_for_refill: wait_for_refill,
            nanos_to_wait_for_reset: wait_for_reset,
        }
    }
    /// Whether the tokens were consumed.
    ///
    /// ```
    /// # use bucket4rs_core::ConsumptionProbe;
    /// assert!(!ConsumptionProbe::new(false, 0, 9, 9).is_consumed());
    /// ```
    pub const fn is_consumed(&self) -> bool {
        self.consumed
    }
    /// Tokens left (never negative: a debt shows as 0).
    ///
    /// ```
    /// # use bucket4rs_core::ConsumptionProbe;
    /// assert_eq!(ConsumptionProbe::new(true, 3, 0, 5).remaining_tokens(), 3);
    /// ```
    pub const fn remaining_tokens(&self) -> u64 {
        self.remaining_tokens
    }
    /// Nanoseconds until the request could succeed (0 when consumed; `i64::MAX` for never).
    ///
    /// ```
    /// # use bucket4rs_core::ConsumptionProbe;
    /// assert_eq!(ConsumptionProbe::new(false, 0, 9, 9).nanos_to_wait_for_refill(), 9);
    /// ```
    pub const fn nanos_to_wait_for_refill(&self) -> u64 {
        self.nanos_to_wait_for_refill
    }
    /// Nanoseconds until every bandwidth is full again.
    ///
    /// ```
    /// # use bucket4rs_core::ConsumptionProbe;
    /// assert_eq!(ConsumptionProbe::new(true, 3, 0, 5).nanos_to_wait_for_reset(), 5);
    /// ```
    pub const fn nanos_to_wait_for_reset(&self) -> u64 {
        self.nanos_to_wait_for_reset
    }
    /// [`nanos_to_wait_for_refill`](Self::nanos_to_wait_for_refill) as a `Duration`.
    ///
    /// ```
    /// # use bucket4rs_core::ConsumptionProbe; use core::time::Duration;
    /// assert_eq!(ConsumptionProbe::new(false, 0, 9, 9).wait_for_refill(), Duration::from_nanos(9));
    /// ```
    pub const fn wait_for_refill(&self) -> Duration {
        Duration::from_nanos(self.nanos_to_wait_for_refill)
    }
    /// [`nanos_to_wait_for_reset`](Self::nanos_to_wait_for_reset) as a `Duration`.
    ///
    /// ```
    /// # use bucket4rs_core::ConsumptionProbe; use core::time::Duration;
    /// assert_eq!(ConsumptionProbe::new(true, 3, 0, 5).wait_for_reset(), Duration::from_nanos(5));
    /// ```
    pub const fn wait_for_reset(&self) -> Duration {
        Duration::from_nanos(self.nanos_to_wait_for_reset)
    }

    /// Whether the request can never be served as it stands: it was refused and its wait is
    /// [`MAX_NANOS`](crate::MAX_NANOS), because it asks for more tokens than a limit's
    /// capacity (or the wait would exceed ~292 years). Retrying cannot help, so an HTTP
    /// server should not answer it with `429` and a `Retry-After`, but as a bad request or
    /// a misconfigured cost.
    ///
    /// ```
    /// # use bucket4rs_core::{BucketConfiguration, BucketState};
    /// use bucket4rs_core::ops::{TryConsume, TryConsumeAndReturnRemaining};
    /// # use core::time::Duration;
    /// let config = BucketConfiguration::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .build()?;
    /// let mut state = BucketState::new(&config, 0);
    /// assert!(state.apply(&config, 0, &TryConsumeAndReturnRemaining(11))?.is_never_possible());
    /// state.apply(&config, 0, &TryConsume(10))?;
    /// assert!(!state.apply(&config, 0, &TryConsumeAndReturnRemaining(10))?.is_never_possible()); // in 1 s
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn is_never_possible(&self) -> bool {
        !self.consumed && self.nanos_to_wait_for_refill >= crate::MAX_NANOS
    }

    /// The value of an HTTP `Retry-After` header for this probe: `None` when the tokens were
    /// consumed; otherwise the wait for refill in whole seconds, **rounded up** and at least
    /// 1, so a client that waits that long is served. (The usual Java conversion,
    /// `nanosToWaitForRefill / 1_000_000_000` or `TimeUnit.NANOSECONDS.toSeconds`, truncates a
    /// 0.4 s wait to 0; so does `wait_for_refill().as_secs()`.) Saturating: a request that
    /// [can never be served](Self::is_never_possible) answers the largest value,
    /// `Some(9_223_372_037)` (`MAX_NANOS` rounded up to seconds); check `is_never_possible`
    /// first to answer such a request differently.
    ///
    /// ```
    /// # use bucket4rs_core::{BucketConfiguration, BucketState};
    /// use bucket4rs_core::ops::TryConsumeAndReturnRemaining;
    /// # use core::time::Duration;
    /// let config = BucketConfiguration::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(4))) // 1 per 400 ms
    ///     .build()?;
    /// let mut state = BucketState::new(&config, 0);
    /// let probe = state.apply(&config, 0, &TryConsumeAndReturnRemaining(10))?;
    /// assert_eq!(probe.retry_after_secs(), None); // consumed: no header
    /// let probe = state.apply(&config, 0, &TryConsumeAndReturnRemaining(1))?;
    /// assert_eq!(probe.wait_for_refill(), Duration::from_millis(400));
    /// assert_eq!(probe.wait_for_refill().as_secs(), 0); // the pitfall: "retry in 0 s"
    /// assert_eq!(probe.retry_after_secs(), Some(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "retry_after")]
    pub const fn retry_after_secs(&self) -> Option<u64> {
        if self.consumed {
            return None;
        }
        let secs = self.nanos_to_wait_for_refill.div_ceil(1_000_000_000);
        Some(if secs == 0 { 1 } else { secs })
    }
}

/// Consume `n` tokens if possible, reporting remaining tokens and waits.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::TryConsumeAndReturnRemaining};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// let probe = state.apply(&config, 0, &TryConsumeAndReturnRemaining(4))?;
/// assert_eq!(probe.remaining_tokens(), 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TryConsumeAndReturnRemaining(pub u64);

impl Operation for TryConsumeAndReturnRemaining {
    type Output = ConsumptionProbe;
    const HAS_SINGLE: bool = true;
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(ConsumptionProbe, Option<Mutation>), OperationError> {
        let n = check_tokens(self.0)?;
        let a = view.available();
        if n as i128 <= a as i128 {
            let probe =
                ConsumptionProbe::new(true, (a as i128 - n as i128) as u64, 0, view.reset_wait(n));
            Ok((probe, Some(Mutation::Consume(n))))
        } else {
            let probe = ConsumptionProbe::new(
                false,
                a.max(0) as u64,
                view.request_wait(n, true),
                view.reset_wait(0),
            );
            Ok((probe, None))
        }
    }
    fn notify<L: BucketListener + ?Sized>(&self, probe: &ConsumptionProbe, listener: &L) {
        if probe.consumed {
            listener.on_consumed(self.0)
        } else {
            listener.on_rejected(self.0)
        }
    }
    #[inline]
    fn plan_single(
        &self,
        b: &Bandwidth,
        s: BandwidthState,
        now: i64,
    ) -> Option<Single<ConsumptionProbe>> {
        Some(check_tokens(self.0).map(|n| {
            let a = s.tokens;
            if n as i128 <= a as i128 {
                let after = Mutation::Consume(n).apply(b, s);
                let reset = math::reset_wait(b, &after, now) as u64;
                let remaining = (a as i128 - n as i128) as u64;
                (
                    ConsumptionProbe::new(true, remaining, 0, reset),
                    Some(after),
                )
            } else {
                let wait = math::request_wait(b, &s, now, n, true) as u64;
                let reset = math::reset_wait(b, &s, now) as u64;
                (
                    ConsumptionProbe::new(false, a.max(0) as u64, wait, reset),
                    None,
                )
            }
        }))
    }
}

/// The result of [`EstimateAbilityToConsume`].
///
/// ```
/// # use bucket4rs_core::EstimationProbe;
/// let p = EstimationProbe::new(false, 0, 100);
/// assert!(!p.can_be_consumed());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct EstimationProbe {
    can_be_consumed: bool,
    remaining_tokens: u64,
    nanos_to_wait_for_refill: u64,
}

impl EstimationProbe {
    /// A probe from its parts.
    ///
    /// ```
    /// # use bucket4rs_core::EstimationProbe;
    /// assert_eq!(EstimationProbe::new(true, 5, 0).remaining_tokens(), 5);
    /// ```
    #[doc(hidden)]
    pub const fn new(can_be_consumed: bool, remaining: u64, wait_for_refill: u64) -> Self {
        Self {
            can_be_consumed,
            remaining_tokens: remaining,
            nanos_to_wait_for_refill: wait_for_refill,
        }
    }
    /// Whether the tokens could be consumed now.
    ///
    /// ```
    /// # use bucket4rs_core::EstimationProbe;
    /// assert!(EstimationProbe::new(true, 5, 0).can_be_consumed());
    /// ```
    pub const fn can_be_consumed(&self) -> bool {
        self.can_be_consumed
    }
    /// Tokens available (a debt shows as 0).
    ///
    /// ```
    /// # use bucket4rs_core::EstimationProbe;
    /// assert_eq!(EstimationProbe::new(true, 5, 0).remaining_tokens(), 5);
    /// ```
    pub const fn remaining_tokens(&self) -> u64 {
        self.remaining_tokens
    }
    /// Nanoseconds until the request could succeed (`i64::MAX` for never).
    ///
    /// ```
    /// # use bucket4rs_core::EstimationProbe;
    /// assert_eq!(EstimationProbe::new(false, 0, 7).nanos_to_wait_for_refill(), 7);
    /// ```
    pub const fn nanos_to_wait_for_refill(&self) -> u64 {
        self.nanos_to_wait_for_refill
    }
    /// The wait as a `Duration`.
    ///
    /// ```
    /// # use bucket4rs_core::EstimationProbe; use core::time::Duration;
    /// assert_eq!(EstimationProbe::new(false, 0, 7).wait_for_refill(), Duration::from_nanos(7));
    /// ```
    pub const fn wait_for_refill(&self) -> Duration {
        Duration::from_nanos(self.nanos_to_wait_for_refill)
    }
}

/// Whether `n` tokens could be consumed now; changes nothing.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::EstimateAbilityToConsume};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// assert!(state.apply(&config, 0, &EstimateAbilityToConsume(10))?.can_be_consumed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EstimateAbilityToConsume(pub u64);

impl Operation for EstimateAbilityToConsume {
    type Output = EstimationProbe;
    const HAS_SINGLE: bool = true;
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(EstimationProbe, Option<Mutation>), OperationError> {
        let n = check_tokens(self.0)?;
        let a = view.available();
        let probe = if n as i128 <= a as i128 {
            EstimationProbe::new(true, a as u64, 0)
        } else {
            EstimationProbe::new(false, a.max(0) as u64, view.request_wait(n, true))
        };
        Ok((probe, None))
    }
    #[inline]
    fn plan_single(
        &self,
        b: &Bandwidth,
        s: BandwidthState,
        now: i64,
    ) -> Option<Single<EstimationProbe>> {
        Some(check_tokens(self.0).map(|n| {
            let a = s.tokens;
            let probe = if n as i128 <= a as i128 {
                EstimationProbe::new(true, a as u64, 0)
            } else {
                EstimationProbe::new(
                    false,
                    a.max(0) as u64,
                    math::request_wait(b, &s, now, n, true) as u64,
                )
            };
            (probe, None)
        }))
    }
}

/// Consume what is available, at most the limit (`None`: unlimited). Output: tokens consumed.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::TryConsumeAsMuchAsPossible};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// assert_eq!(state.apply(&config, 0, &TryConsumeAsMuchAsPossible(None))?, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TryConsumeAsMuchAsPossible(pub Option<u64>);

impl Operation for TryConsumeAsMuchAsPossible {
    type Output = u64;
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(u64, Option<Mutation>), OperationError> {
        let limit = match self.0 {
            Some(0) => return Err(OperationError::ZeroLimit),
            Some(l) => l,
            None => u64::MAX,
        };
        let a = view.available();
        if a <= 0 {
            return Ok((0, None));
        }
        let c = limit.min(a as u64);
        Ok((c, Some(Mutation::Consume(c))))
    }
    fn notify<L: BucketListener + ?Sized>(&self, consumed: &u64, listener: &L) {
        if *consumed > 0 {
            listener.on_consumed(*consumed);
        }
    }
}

/// Add tokens, never above capacity.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::{AddTokens, TryConsume}};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// state.apply(&config, 0, &TryConsume(5))?;
/// state.apply(&config, 0, &AddTokens(2))?;
/// assert_eq!(state.available_tokens(&config, 0), 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddTokens(pub u64);

impl Operation for AddTokens {
    type Output = ();
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        _view: &Refilled<'_, R>,
    ) -> Result<((), Option<Mutation>), OperationError> {
        Ok(((), Some(Mutation::AddTokens(check_tokens(self.0)?))))
    }
}

/// Add tokens, even above capacity.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::ForceAddTokens};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// state.apply(&config, 0, &ForceAddTokens(2))?;
/// assert_eq!(state.available_tokens(&config, 0), 12);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForceAddTokens(pub u64);

impl Operation for ForceAddTokens {
    type Output = ();
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        _view: &Refilled<'_, R>,
    ) -> Result<((), Option<Mutation>), OperationError> {
        Ok(((), Some(Mutation::ForceAddTokens(check_tokens(self.0)?))))
    }
}

/// Set every bandwidth to its capacity.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::{Reset, TryConsume}};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// state.apply(&config, 0, &TryConsume(5))?;
/// state.apply(&config, 0, &Reset)?;
/// assert_eq!(state.available_tokens(&config, 0), 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reset;

impl Operation for Reset {
    type Output = ();
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        _view: &Refilled<'_, R>,
    ) -> Result<((), Option<Mutation>), OperationError> {
        Ok(((), Some(Mutation::Reset)))
    }
}

/// The balance after refill (may be negative). Never fails.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::AvailableTokens};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// assert_eq!(state.apply(&config, 0, &AvailableTokens)?, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvailableTokens;

impl Operation for AvailableTokens {
    type Output = i64;
    const HAS_SINGLE: bool = true;
    #[inline]
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(i64, Option<Mutation>), OperationError> {
        Ok((view.available(), None))
    }
    #[inline]
    fn plan_single(&self, _b: &Bandwidth, s: BandwidthState, _now: i64) -> Option<Single<i64>> {
        Some(Ok((s.tokens, None)))
    }
}

/// Consume `n` tokens whatever the balance; output: nanoseconds until the debt is repaid.
/// Fails with [`OperationError::WaitTooLong`] when that wait does not fit below `i64::MAX`.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::ConsumeIgnoringRateLimits};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// assert_eq!(state.apply(&config, 0, &ConsumeIgnoringRateLimits(11))?, 100_000_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeIgnoringRateLimits(pub u64);

impl Operation for ConsumeIgnoringRateLimits {
    type Output = u64;
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(u64, Option<Mutation>), OperationError> {
        let n = check_tokens(self.0)?;
        let w = view.request_wait(n, false);
        if w >= MAX as u64 {
            return Err(OperationError::WaitTooLong);
        }
        Ok((w, Some(Mutation::Consume(n))))
    }
    fn notify<L: BucketListener + ?Sized>(&self, _wait: &u64, listener: &L) {
        listener.on_consumed(self.0);
    }
}

/// Reserve `tokens` if the wait until they are paid for is at most `max_wait_nanos`.
/// Output: `Some(wait)` when reserved (the caller then waits), `None` when refused.
///
/// This is the primitive behind blocking and async consumption.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Reserve};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// let op = Reserve { tokens: 20, max_wait_nanos: u64::MAX };
/// assert_eq!(state.apply(&config, 0, &op)?, Some(1_000_000_000));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reserve {
    /// Tokens to reserve (may exceed the capacity: the debt is paid by waiting).
    pub tokens: u64,
    /// The longest acceptable wait, in nanoseconds (at least 1).
    pub max_wait_nanos: u64,
}

impl Operation for Reserve {
    type Output = Option<u64>;
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(Option<u64>, Option<Mutation>), OperationError> {
        let n = check_tokens(self.tokens)?;
        if self.max_wait_nanos == 0 {
            return Err(OperationError::ZeroMaxWait);
        }
        let w = view.request_wait(n, false);
        if w >= MAX as u64 || w > self.max_wait_nanos {
            return Ok((None, None));
        }
        Ok((Some(w), Some(Mutation::Consume(n))))
    }
    fn notify<L: BucketListener + ?Sized>(&self, out: &Option<u64>, listener: &L) {
        match out {
            Some(_) => listener.on_consumed(self.tokens),
            None => listener.on_rejected(self.tokens),
        }
    }
}

/// Runs an operation and also returns every bandwidth's state after it (refilled to `now`):
/// the basis of verbose results and diagnostics.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::{TryConsume, Verbose}};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// let (consumed, after) = state.apply(&config, 0, &Verbose(TryConsume(3)))?;
/// assert!(consumed);
/// assert_eq!(after.bandwidths()[0].tokens(), 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verbose<O>(pub O);

impl<O: Operation> Operation for Verbose<O> {
    type Output = (O::Output, crate::BucketState);
    fn plan<R: Fn(usize) -> BandwidthState>(
        &self,
        view: &Refilled<'_, R>,
    ) -> Result<(Self::Output, Option<Mutation>), OperationError> {
        let (out, mutation) = self.0.plan(view)?;
        let after = view
            .config
            .bandwidths()
            .iter()
            .enumerate()
            .map(|(i, b)| match mutation {
                Some(m) => m.apply(b, view.get(i)),
                None => view.get(i),
            })
            .collect::<crate::state::Bandwidths>();
        let after = crate::BucketState::from_inline(after);
        Ok(((out, after), mutation))
    }
    fn notify<L: BucketListener + ?Sized>(&self, output: &Self::Output, listener: &L) {
        self.0.notify(&output.0, listener);
    }
}
