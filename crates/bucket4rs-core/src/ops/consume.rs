//! The operations that consume tokens (or estimate consuming them), and their probes.

use core::time::Duration;

use super::{Mutation, Operation, Planning, Refilled, Scaled, Single, Take, check_tokens};
use crate::config::Bandwidth;
use crate::error::OperationError;
use crate::listener::BucketListener;
use crate::math::{self, MAX};
use crate::state::{BandwidthState, ScaledState};

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
    fn notify<L: BucketListener + ?Sized>(&self, consumed: &bool, listener: &L) {
        if *consumed {
            listener.on_consumed(self.0)
        } else {
            listener.on_rejected(self.0)
        }
    }
}

impl Planning<bool> for TryConsume {
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
/// assert_eq!(probe.wait_for_refill().as_nanos() as u64, i64::MAX as u64); // 11 > capacity: never
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
    /// The wait until the request could succeed: zero when consumed, `i64::MAX` nanoseconds
    /// for never (Bucket4j's `getNanosToWaitForRefill`; `as_nanos()` gives the same number).
    ///
    /// ```
    /// # use bucket4rs_core::ConsumptionProbe; use core::time::Duration;
    /// assert_eq!(ConsumptionProbe::new(false, 0, 9, 9).wait_for_refill(), Duration::from_nanos(9));
    /// ```
    #[doc(alias = "getNanosToWaitForRefill")]
    pub const fn wait_for_refill(&self) -> Duration {
        Duration::from_nanos(self.nanos_to_wait_for_refill)
    }
    /// The wait until every bandwidth is full again (Bucket4j's `getNanosToWaitForReset`).
    ///
    /// ```
    /// # use bucket4rs_core::ConsumptionProbe; use core::time::Duration;
    /// assert_eq!(ConsumptionProbe::new(true, 3, 0, 5).wait_for_reset(), Duration::from_nanos(5));
    /// ```
    #[doc(alias = "getNanosToWaitForReset")]
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
    fn notify<L: BucketListener + ?Sized>(&self, probe: &ConsumptionProbe, listener: &L) {
        if probe.consumed {
            listener.on_consumed(self.0)
        } else {
            listener.on_rejected(self.0)
        }
    }
}

impl Planning<ConsumptionProbe> for TryConsumeAndReturnRemaining {
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
    /// The wait until the request could succeed, `i64::MAX` nanoseconds for never (Bucket4j's
    /// `getNanosToWaitForRefill`).
    ///
    /// ```
    /// # use bucket4rs_core::EstimationProbe; use core::time::Duration;
    /// assert_eq!(EstimationProbe::new(false, 0, 7).wait_for_refill(), Duration::from_nanos(7));
    /// ```
    #[doc(alias = "getNanosToWaitForRefill")]
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
}

impl Planning<EstimationProbe> for EstimateAbilityToConsume {
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
    fn notify<L: BucketListener + ?Sized>(&self, consumed: &u64, listener: &L) {
        if *consumed > 0 {
            listener.on_consumed(*consumed);
        }
    }
}

impl Planning<u64> for TryConsumeAsMuchAsPossible {
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
    fn notify<L: BucketListener + ?Sized>(&self, _wait: &u64, listener: &L) {
        listener.on_consumed(self.0);
    }
}

impl Planning<u64> for ConsumeIgnoringRateLimits {
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
    fn notify<L: BucketListener + ?Sized>(&self, out: &Option<u64>, listener: &L) {
        match out {
            Some(_) => listener.on_consumed(self.tokens),
            None => listener.on_rejected(self.tokens),
        }
    }
}

impl Planning<Option<u64>> for Reserve {
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
}
