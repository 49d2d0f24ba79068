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

use crate::config::{Bandwidth, BucketConfiguration};
use crate::error::OperationError;
use crate::listener::BucketListener;
use crate::math;
use crate::state::{BandwidthState, ScaledState};

mod consume;
mod tokens;
mod verbose;

pub use consume::{
    ConsumeIgnoringRateLimits, ConsumptionProbe, EstimateAbilityToConsume, EstimationProbe,
    Reserve, TryConsume, TryConsumeAndReturnRemaining, TryConsumeAsMuchAsPossible,
};
pub use tokens::{AddTokens, AvailableTokens, ForceAddTokens, Reset};
pub use verbose::Verbose;

/// How many refilled bandwidth states are cached on the stack; beyond this they are recomputed
/// on each access (still without allocating).
const INLINE: usize = 2;

/// A read-only view of a bucket's state, refilled to `now`: what operations plan on, and what a
/// caller that keeps a state reads its tokens and waits from (the HTTP layer computes its
/// `RateLimit` fields on it) without running an operation.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::Refilled};
/// use core::time::Duration;
/// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let state = BucketState::new(&config, 0);
/// let view = Refilled::new(&config, 0, |i| state.bandwidths()[i]);
/// assert_eq!((view.available(), view.reset_wait(4)), (10, 400_000_000));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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

/// One bucket operation: the value every bucket's `execute` takes.
///
/// Sealed: the operations are the structs of this module, and how they plan is the core's own.
/// Buckets of every kind run them through one engine, so all of them compute the same results;
/// run them on a bucket, on a [`BucketState`](crate::BucketState) with `apply`, or on states
/// you keep with [`plan`] and [`execute`].
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::AvailableTokens};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let mut state = BucketState::new(&config, 0);
/// assert_eq!(state.apply(&config, 0, &AvailableTokens)?, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Operation: sealed::Plan<<Self as Operation>::Output> {
    /// What the operation returns.
    type Output;

    /// Tells `listener` what the operation did, given its output (only the operations that
    /// consume notify): what a bucket calls once the operation's change is committed, so that
    /// a storage running operations with [`execute`] notifies listeners as a bucket does.
    ///
    /// ```
    /// use bucket4rs_core::{BucketListener, ops::{Operation, TryConsume}};
    /// use core::sync::atomic::{AtomicU64, Ordering};
    /// #[derive(Default)]
    /// struct Rejected(AtomicU64);
    /// impl BucketListener for Rejected {
    ///     fn on_rejected(&self, tokens: u64) { self.0.fetch_add(tokens, Ordering::Relaxed); }
    /// }
    /// let listener = Rejected::default();
    /// TryConsume(3).notify(&false, &listener);
    /// assert_eq!(listener.0.load(Ordering::Relaxed), 3);
    /// ```
    fn notify<L: BucketListener + ?Sized>(&self, _output: &Self::Output, _listener: &L) {}
}

/// How an operation plans: the core's own, out of reach of other crates (which seals
/// [`Operation`]).
pub(crate) mod sealed {
    use super::{Refilled, Scaled, Single};
    use crate::config::Bandwidth;
    use crate::error::OperationError;
    use crate::math::MAX;
    use crate::state::{BandwidthState, ScaledState};

    /// An operation's planning, for its output `T`.
    pub trait Plan<T> {
        /// Decides the output, and the state change if any, from the refilled view.
        fn plan<R: Fn(usize) -> BandwidthState>(
            &self,
            view: &Refilled<'_, R>,
        ) -> Result<(T, Option<Mutation>), OperationError>;

        /// Whether [`plan_single`](Plan::plan_single) is implemented (a compile-time switch,
        /// so operations without a shortcut pay nothing for it).
        const HAS_SINGLE: bool = false;

        /// A shortcut for a bucket with a single bandwidth `b` whose refilled state is `s`:
        /// the same result as [`plan`](Plan::plan), computed directly, with the new state when
        /// it changes. `None` (the default) means "use `plan`".
        #[inline]
        fn plan_single(&self, _b: &Bandwidth, _s: BandwidthState, _now: i64) -> Option<Single<T>> {
            None
        }

        /// For an operation that takes a fixed number of tokens when the bucket has them and
        /// nothing otherwise (`try_consume`): that number and its output either way. A compact
        /// one-bandwidth bucket runs such an operation as the GCRA's step. `None` (the
        /// default): not such an operation. It must agree with [`plan`](Plan::plan).
        #[inline]
        fn take(&self) -> Option<Take<T>> {
            None
        }

        /// Whether [`plan_scaled`](Plan::plan_scaled) is implemented (a compile-time switch).
        const HAS_SCALED: bool = false;

        /// A shortcut on the scaled form of a single greedy bandwidth `b` whose refilled state
        /// is `s`: the same result as [`plan_single`](Plan::plan_single), computed without
        /// division. `None` (the default, or when a value does not fit) means "decode and use
        /// `plan_single`".
        #[inline]
        fn plan_scaled(&self, _b: &Bandwidth, _s: ScaledState) -> Option<Scaled<T>> {
            None
        }
    }

    /// What [`Plan::take`] describes: a fixed take and the output either way.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Take<T> {
        /// The tokens taken, or why the request is invalid.
        pub tokens: Result<u64, OperationError>,
        /// The output when they were taken.
        pub taken: T,
        /// The output when they were not.
        pub refused: T,
    }
    /// A state change, applied to every refilled bandwidth state.

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
}

pub(crate) use sealed::{Mutation, Plan as Planning, Take};

/// The result of [`plan_one`]: the output and the new state, if it changed.
pub type Single<T> = Result<(T, Option<BandwidthState>), OperationError>;

/// The result of [`plan_scaled`]: the output and the new scaled state, if it changed.
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
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops}; use bucket4rs_core::forms::{ScaledState};
/// # use core::time::Duration;
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let b = &config.bandwidths()[0];
/// let s = ScaledState::from_state(b, BucketState::new(&config, 0).bandwidths()[0]).expect("fits");
/// let (taken, new) = ops::plan_scaled(&bucket4rs_core::ops::TryConsume(3), b, 0, s).expect("shortcut")?;
/// assert!(taken);
/// assert_eq!(new.map(|s| s.to_state(b).tokens()), Some(7));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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

#[cfg(test)]
mod tests;
