//! Bucket state: three integers per bandwidth, and the typed operations on a whole bucket.

use alloc::vec::Vec;

use smallvec::SmallVec;
use strength_reduce::StrengthReducedU64;

use crate::config::{Bandwidth, BucketConfiguration};
use crate::error::{ConfigError, OperationError};
use crate::math;
use crate::ops::{self, Operation};
use crate::replace::{self, TokensInheritanceStrategy};

/// The state of one bandwidth: last refill time, balance and refill remainder.
///
/// The exact holding is `tokens + remainder / period_nanos` tokens. Plain data: it is what local
/// buckets keep in atomics and what distributed backends store.
///
/// ```
/// use bucket4rs_core::BandwidthState;
/// let s = BandwidthState::from_parts(0, 10, 0);
/// assert_eq!((s.last_refill_nanos(), s.tokens(), s.remainder()), (0, 10, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BandwidthState {
    pub(crate) last_refill: i64,
    pub(crate) tokens: i64,
    pub(crate) remainder: i64,
}

impl BandwidthState {
    /// A state from its three fields: how a state kept elsewhere (a record in a store, a
    /// format of your own) is restored. Operations never panic on any values; use
    /// [`BucketState::check`] to validate a restored state against its configuration.
    ///
    /// ```
    /// # use bucket4rs_core::BandwidthState;
    /// assert_eq!(BandwidthState::from_parts(5, -3, 1).tokens(), -3);
    /// ```
    pub const fn from_parts(last_refill_nanos: i64, tokens: i64, remainder: i64) -> Self {
        Self {
            last_refill: last_refill_nanos,
            tokens,
            remainder,
        }
    }

    /// Clock reading of the last refill (may lie in the future).
    ///
    /// ```
    /// # use bucket4rs_core::BandwidthState;
    /// assert_eq!(BandwidthState::from_parts(5, 0, 0).last_refill_nanos(), 5);
    /// ```
    pub const fn last_refill_nanos(&self) -> i64 {
        self.last_refill
    }

    /// Whole tokens; negative while the bucket is in debt.
    ///
    /// ```
    /// # use bucket4rs_core::BandwidthState;
    /// assert_eq!(BandwidthState::from_parts(0, 7, 0).tokens(), 7);
    /// ```
    pub const fn tokens(&self) -> i64 {
        self.tokens
    }

    /// The refill remainder in units of `1 / period_nanos` token (`0 <= remainder < period`).
    ///
    /// ```
    /// # use bucket4rs_core::BandwidthState;
    /// assert_eq!(BandwidthState::from_parts(0, 7, 3).remainder(), 3);
    /// ```
    pub const fn remainder(&self) -> i64 {
        self.remainder
    }

    /// The exact holding as one integer: `tokens × u + remainder / q`, in units of `q / period`
    /// token of bandwidth `b`, where the quantum `q` divides every remainder a bandwidth can
    /// reach (`gcd(refill tokens, period)` for a greedy refill, the period for interval
    /// refills, whose remainder is always 0) and `u = period / q` is one token.
    ///
    /// With the last refill time this is the whole state in two words: local lock-free buckets
    /// with one bandwidth keep it in a single 128-bit atomic. `None` when the remainder is not a
    /// multiple of `q` in `0..period` or the result does not fit `i64`; the encoding is
    /// otherwise exact and [`from_scaled_balance`](Self::from_scaled_balance) inverts it.
    /// (`ScaledState::from_state` is the public form, with examples).
    #[inline]
    pub(crate) fn scaled_balance(&self, b: &Bandwidth) -> Option<i64> {
        let (q, e) = (b.remainder_quantum, self.remainder);
        if e < 0 || e >= b.refill_period || e % q != 0 {
            return None;
        }
        let unit = b.refill_period / q;
        match self.tokens.checked_mul(unit) {
            Some(t) => t.checked_add(e / q),
            // A debt whose product alone is below `i64::MIN` may still fit with the remainder.
            None => i64::try_from(self.tokens as i128 * unit as i128 + (e / q) as i128).ok(),
        }
    }

    /// The state whose [`scaled_balance`](Self::scaled_balance) for `b` is `scaled`, last
    /// refilled at `last_refill_nanos`. Total: any `scaled` gives a state whose remainder is a
    /// multiple of the quantum in `0..period`.
    #[inline]
    pub(crate) fn from_scaled_balance(b: &Bandwidth, last_refill_nanos: i64, scaled: i64) -> Self {
        let (tokens, units) = if scaled >= 0 {
            let (q, r) = StrengthReducedU64::div_rem(scaled as u64, b.balance_unit);
            // q <= scaled and r < unit: both fit i64.
            (q as i64, r as i64)
        } else {
            // The unit is positive, so neither can overflow.
            let unit = b.refill_period / b.remainder_quantum;
            (scaled.div_euclid(unit), scaled.rem_euclid(unit))
        };
        Self {
            last_refill: last_refill_nanos,
            tokens,
            // units < period / q, so the product is below the period.
            remainder: units * b.remainder_quantum,
        }
    }
}

/// One bandwidth's state in the scaled form: the last refill time and the balance in units of
/// `q / period` token, where the quantum `q` divides every remainder the bandwidth can reach
/// (`gcd(refill tokens, period)` for a greedy refill) and `period / q` units are one token.
///
/// Greedy refill and consumption are additions and comparisons in this form, with no
/// division: [`ops::plan_scaled`] runs operations on it directly, and one-bandwidth lock-free
/// buckets keep it in one 128-bit atomic.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BandwidthState}; use bucket4rs_core::forms::{ScaledState};
/// # use core::time::Duration;
/// let b = Bandwidth::simple(10, Duration::from_secs(1))?;
/// let s = ScaledState::from_state(&b, BandwidthState::from_parts(0, 4, 0)).expect("fits");
/// assert_eq!(s.to_state(&b), BandwidthState::from_parts(0, 4, 0));
/// assert_eq!(s.last_refill_nanos(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScaledState {
    last_refill: i64,
    balance: i64,
}

impl ScaledState {
    /// A scaled state from its parts.
    ///
    /// ```
    /// # use bucket4rs_core::forms::ScaledState;
    /// let s = ScaledState::new(5, -7);
    /// assert_eq!((s.last_refill_nanos(), s.balance()), (5, -7));
    /// ```
    pub const fn new(last_refill_nanos: i64, balance: i64) -> Self {
        Self {
            last_refill: last_refill_nanos,
            balance,
        }
    }

    /// `st` in the scaled form of bandwidth `b`: the balance `tokens × (period / q) +
    /// remainder / q`. `None` when the remainder is not a multiple of `q` in `0..period` or the
    /// balance does not fit `i64`; otherwise exact, and [`to_state`](Self::to_state) inverts it.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BandwidthState}; use bucket4rs_core::forms::{ScaledState};
    /// # use core::time::Duration;
    /// // 4 tokens per 100 ns: remainders are multiples of gcd(4, 100) = 4, a token is 25 units.
    /// let b = Bandwidth::builder().capacity(10).refill_greedy(4, Duration::from_nanos(100)).build()?;
    /// let s = BandwidthState::from_parts(7, 3, 40);
    /// let scaled = ScaledState::from_state(&b, s).expect("fits");
    /// assert_eq!(scaled, ScaledState::new(7, 3 * 25 + 10));
    /// assert_eq!(scaled.to_state(&b), s);
    /// assert!(ScaledState::from_state(&b, BandwidthState::from_parts(7, 3, 41)).is_none());
    /// assert!(ScaledState::from_state(&b, BandwidthState::from_parts(7, i64::MAX, 0)).is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn from_state(b: &Bandwidth, st: BandwidthState) -> Option<Self> {
        Some(Self::new(st.last_refill, st.scaled_balance(b)?))
    }

    /// The three-field state of bandwidth `b` this one encodes. Total: any balance gives a
    /// state whose remainder is a multiple of the quantum in `0..period`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BandwidthState}; use bucket4rs_core::forms::{ScaledState};
    /// # use core::time::Duration;
    /// let b = Bandwidth::simple(10, Duration::from_secs(1))?;
    /// // 10 tokens a second: remainders are multiples of gcd(10, 10^9) = 10 ns, so a token
    /// // is 10^9 / 10 = 10^8 units.
    /// assert_eq!(ScaledState::new(3, 250_000_000).to_state(&b), BandwidthState::from_parts(3, 2, 500_000_000));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn to_state(self, b: &Bandwidth) -> BandwidthState {
        BandwidthState::from_scaled_balance(b, self.last_refill, self.balance)
    }

    /// Clock reading of the last refill.
    ///
    /// ```
    /// # use bucket4rs_core::forms::ScaledState;
    /// assert_eq!(ScaledState::new(9, 0).last_refill_nanos(), 9);
    /// ```
    pub const fn last_refill_nanos(self) -> i64 {
        self.last_refill
    }

    /// The balance in scaled units.
    ///
    /// ```
    /// # use bucket4rs_core::forms::ScaledState;
    /// assert_eq!(ScaledState::new(0, 42).balance(), 42);
    /// ```
    pub const fn balance(self) -> i64 {
        self.balance
    }
}

/// The compact form of one greedy bandwidth's state: a single integer `u`, the reading (in
/// scaled units, `rate` per nanosecond, counted from `base`) at which the bucket is full again
/// — the GCRA's "theoretical arrival time", kept exact in the scaled units of
/// [`ScaledState`].
///
/// With `p = (t − base) × rate`, the balance at reading `t` is `capacity − max(0, u − p)`: a
/// greedy refill adds `rate` units per nanosecond up to the capacity, so the last refill time
/// need not be stored — provided readings never go back, which is why one-bandwidth lock-free
/// buckets keep this form (in one 64-bit word) only on a
/// [monotonic](crate::Clock::is_monotonic) clock. Everything is precomputed from the
/// bandwidth, so [`plan`](Self::plan) reads no configuration.
///
/// ```
/// # use bucket4rs_core::{Bandwidth}; use bucket4rs_core::forms::{CompactForm, ScaledState};
/// # use core::time::Duration;
/// // 10 tokens per second: a token is 10^8 units, and the rate 1 unit per nanosecond.
/// let b = Bandwidth::simple(10, Duration::from_secs(1))?;
/// let form = CompactForm::new(&b, 0).expect("greedy");
/// let u = form.encode(ScaledState::new(1_000, 4 * 100_000_000)).expect("fits");
/// // 6 tokens short: full 0.6 s after the last refill.
/// assert_eq!(u, 1_000 + 600_000_000);
/// // 0.3 s later, 3 tokens more.
/// assert_eq!(form.decode(u, 300_001_000), ScaledState::new(300_001_000, 7 * 100_000_000));
/// // Above capacity: no compact value.
/// assert_eq!(form.encode(ScaledState::new(0, 11 * 100_000_000)), None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompactForm {
    base: i64,
    rate: i64,
    capacity: i64,
    unit: i64,
    /// `base == 0 && rate == 1`: readings are used as they are.
    direct: bool,
}

impl CompactForm {
    /// The compact form of greedy bandwidth `b` with values counted from reading `base`;
    /// `None` for interval refills and for a capacity whose scaled form does not fit `i64`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth}; use bucket4rs_core::forms::{CompactForm};
    /// # use core::time::Duration;
    /// let interval = Bandwidth::builder().capacity(5).refill_intervally(5, Duration::from_secs(1)).build()?;
    /// assert_eq!(CompactForm::new(&interval, 0), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(b: &Bandwidth, base: i64) -> Option<Self> {
        if b.kind.is_interval() {
            return None;
        }
        // The rate is at most the refill tokens and the unit at most the period: both fit.
        let rate = i64::try_from(b.scaled_rate).ok()?;
        Some(Self {
            base,
            rate,
            capacity: b.scaled_capacity?,
            unit: i64::try_from(b.balance_unit.get()).ok()?,
            direct: base == 0 && rate == 1,
        })
    }

    /// `st` as a compact value: `(last_refill − base) × rate + (capacity − balance)`. `None`
    /// for a balance above capacity or a value beyond `i64`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth}; use bucket4rs_core::forms::{CompactForm, ScaledState}; use core::time::Duration;
    /// let b = Bandwidth::simple(10, Duration::from_secs(1))?;
    /// let form = CompactForm::new(&b, 0).expect("greedy");
    /// assert_eq!(form.encode(ScaledState::new(5, 1_000_000_000)), Some(5)); // full at 5
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn encode(&self, st: ScaledState) -> Option<i64> {
        if st.balance > self.capacity {
            return None;
        }
        // |elapsed| < 2^64 and rate < 2^63: the product and the sum fit i128.
        let elapsed = st.last_refill as i128 - self.base as i128;
        let short = self.capacity as i128 - st.balance as i128;
        i64::try_from(elapsed * self.rate as i128 + short).ok()
    }

    /// The state with compact value `u` refilled to reading `at`: last refill `at`, balance
    /// `capacity − max(0, u − (at − base) × rate)`.
    ///
    /// Exact for any `at` not before the last refill of the state `u` encodes. An earlier `at`
    /// gives a smaller balance (the refill "taken back" down to `at`), never a larger one; a
    /// balance below `i64::MIN` (a reading absurdly far back) saturates there.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth}; use bucket4rs_core::forms::{CompactForm, ScaledState}; use core::time::Duration;
    /// let b = Bandwidth::simple(10, Duration::from_secs(1))?;
    /// let form = CompactForm::new(&b, 0).expect("greedy");
    /// let u = form.encode(ScaledState::new(0, 0)).expect("fits");
    /// // Empty at 0; full (10 × 10^8 units) from 1 s on, and never above.
    /// assert_eq!(form.decode(u, 5_000_000_000).balance(), 1_000_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn decode(&self, u: i64, at: i64) -> ScaledState {
        let p = (at as i128 - self.base as i128) * self.rate as i128;
        let balance = self.capacity as i128 - (u as i128 - p).max(0);
        // balance <= capacity fits i64 from above; saturate a (far-back) debt below.
        ScaledState::new(at, balance.max(i64::MIN as i128) as i64)
    }

    /// The earliest reading from which the bucket of compact value `u` is full: `u` counted
    /// back from scaled units to a reading, rounded up (`i64::MAX` when that is beyond `i64`).
    /// Left alone, the bucket stays full from then on.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use bucket4rs_core::forms::{CompactForm, ScaledState};
    /// # use core::time::Duration;
    /// let b = Bandwidth::simple(10, Duration::from_secs(1))?; // a token every 100 ms
    /// let form = CompactForm::new(&b, 0).expect("greedy");
    /// let u = form.encode(ScaledState::new(1_000, 7 * 100_000_000)).expect("fits");
    /// assert_eq!(form.full_at(u), 1_000 + 300_000_000); // 3 tokens short at 1 µs
    /// assert_eq!(form.decode(u, form.full_at(u)).balance(), 1_000_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn full_at(&self, u: i64) -> i64 {
        if self.direct {
            return u;
        }
        // The smallest t with (t − base) × rate >= u; the rate is positive.
        let t = self.base as i128
            + (u as i128).div_euclid(self.rate as i128)
            + i128::from((u as i128).rem_euclid(self.rate as i128) != 0);
        i64::try_from(t).unwrap_or(if t < 0 { i64::MIN } else { i64::MAX })
    }

    /// Runs `op` on compact value `u` at reading `now`. Only operations with a fixed take
    /// (`try_consume`: a fixed number of tokens, taken or not) run here, as the GCRA's step: with
    /// `p = (now − base) × rate`, `u' = max(u, p) + need`, taken when `u' − p <= capacity`,
    /// that is when `p >= u − (capacity − need)`, a bound computed without the reading.
    /// Between the clock reading and the decision that is one comparison, and to the new value
    /// a comparison and an addition (the multiplication too unless `base` is 0 and the rate 1
    /// unit per nanosecond, the common case). Returns the output and the new value, which
    /// equals `u` when nothing changed.
    ///
    /// Exact — the same decision and state as [`ops::plan_one`] on the state `u` encodes —
    /// whenever `now` is not before that state's last refill.
    ///
    /// # Errors
    /// [`CompactStop::Invalid`] with the operation's error (nothing changes then), or
    /// [`CompactStop::Decline`] when the operation has no fixed take or a value does not fit
    /// `i64`: decode and plan then.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, ops::TryConsume}; use bucket4rs_core::forms::{CompactForm, ScaledState};
    /// # use core::time::Duration;
    /// let b = Bandwidth::simple(10, Duration::from_secs(1))?;
    /// let form = CompactForm::new(&b, 0).expect("greedy");
    /// let u = form.encode(ScaledState::new(0, 1_000_000_000)).expect("fits"); // full at 0
    /// let (taken, new) = form.plan(&TryConsume(3), u, 0)?;
    /// assert!(taken);
    /// assert_eq!(form.decode(new, 0).balance(), 700_000_000);
    /// // Refused: the value is unchanged.
    /// assert_eq!(form.plan(&TryConsume(8), new, 0)?, (false, new));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    // The flat result (no `Option` around a `Result` around an `Option`) matters: inlined into
    // a bucket's hot path, it stays in two registers instead of going through the stack.
    #[inline]
    pub fn plan<O>(&self, op: &O, u: i64, now: i64) -> Result<(O::Output, i64), CompactStop>
    where
        O: Operation + ?Sized,
    {
        use CompactStop::Decline;
        let take = op.take().ok_or(Decline)?;
        let p = if self.direct {
            now
        } else {
            now.checked_sub(self.base)
                .and_then(|e| e.checked_mul(self.rate))
                .ok_or(Decline)?
        };
        let n = take.tokens.map_err(CompactStop::Invalid)?;
        let need = i64::try_from(n).ok().and_then(|n| n.checked_mul(self.unit));
        // More than the capacity can ever hold: refused, nothing changes.
        let Some(need) = need.filter(|need| *need <= self.capacity) else {
            return Ok((take.refused, u));
        };
        // The refilled state's value is max(u, p); taking `need` moves it by `need`, and the
        // balance stays >= 0 while the value stays within `capacity` of `p`:
        // max(u − p, 0) + need <= capacity, that is p >= u − (capacity − need). The bound
        // does not depend on the reading, so the reading meets one comparison before the
        // decision (a bound below i64::MIN: every reading meets it).
        if let Some(bound) = u.checked_sub(self.capacity - need)
            && p < bound
        {
            return Ok((take.refused, u));
        }
        Ok((take.taken, u.max(p).checked_add(need).ok_or(Decline)?))
    }
}

/// Why [`CompactForm::plan`] gave no result.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, OperationError, ops}; use bucket4rs_core::forms::{CompactForm, CompactStop};
/// # use core::time::Duration;
/// let form = CompactForm::new(&Bandwidth::simple(10, Duration::from_secs(1))?, 0).expect("greedy");
/// assert_eq!(form.plan(&bucket4rs_core::ops::TryConsume(0), 0, 0), Err(CompactStop::Invalid(OperationError::ZeroTokens)));
/// assert_eq!(form.plan(&bucket4rs_core::ops::Reset, 0, 0), Err(CompactStop::Decline));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactStop {
    /// The operation's input is invalid; nothing changes.
    Invalid(OperationError),
    /// No compact path here: decode and plan.
    Decline,
}

impl core::fmt::Display for CompactStop {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Invalid(e) => e.fmt(f),
            Self::Decline => f.write_str("no compact path for this operation or state"),
        }
    }
}

impl core::error::Error for CompactStop {}

/// Why a stored state does not fit a configuration.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, BucketState, StateError};
/// # use core::time::Duration;
/// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
/// let state = BucketState::from_bandwidths(vec![]);
/// assert_eq!(state.check(&config), Err(StateError::BandwidthCount { expected: 1, found: 0 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateError {
    /// The state has a different number of bandwidths than the configuration.
    BandwidthCount {
        /// Bandwidths in the configuration.
        expected: usize,
        /// Bandwidths in the state.
        found: usize,
    },
    /// A remainder lies outside `0..period` (or is non-zero for an interval refill).
    Remainder {
        /// Index of the offending bandwidth.
        index: usize,
    },
}

impl core::fmt::Display for StateError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::BandwidthCount { expected, found } => {
                write!(
                    f,
                    "state has {found} bandwidths, configuration has {expected}"
                )
            }
            Self::Remainder { index } => write!(f, "bandwidth {index} has an invalid remainder"),
        }
    }
}

impl core::error::Error for StateError {}

/// The whole state of a bucket, one [`BandwidthState`] per bandwidth of its configuration.
///
/// Every operation is a pure method taking the configuration and the clock reading `now` (in
/// nanoseconds on the clock's own timeline). Nothing here reads a clock or allocates except
/// [`BucketState::new`] and [`BucketState::replace_configuration`].
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState};
/// use core::time::Duration;
///
/// let config = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?)
///     .build()?;
/// let mut state = BucketState::new(&config, 0);
/// assert!(state.apply(&config, 0, &bucket4rs_core::ops::TryConsume(10))?);
/// assert!(!state.apply(&config, 0, &bucket4rs_core::ops::TryConsume(1))?);
/// // 100 ms later one token has been refilled.
/// assert!(state.apply(&config, 100_000_000, &bucket4rs_core::ops::TryConsume(1))?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BucketState {
    /// Up to [`INLINE_BANDWIDTHS`] states inline, so that the state of a one-limit bucket
    /// is part of whatever holds it (a lock, a map entry) rather than an allocation of its
    /// own: a keyed store reads one line of memory fewer per key, and allocates once less.
    /// Serialized as a sequence, as a `Vec` is.
    bandwidths: SmallVec<[BandwidthState; INLINE_BANDWIDTHS]>,
}

/// How many bandwidth states [`BucketState`] keeps without allocating: one, the most common
/// bucket. Two would take in a burst limit with a sustained one, but make every state 24
/// bytes larger, and a keyed store's entries with it (with the embedded backend's flood of
/// 1,000,000 keys capped at 100,000, peak memory 37 MiB against 30 MiB with one).
const INLINE_BANDWIDTHS: usize = 1;

/// A state's bandwidth list, inline up to [`INLINE_BANDWIDTHS`].
pub(crate) type Bandwidths = SmallVec<[BandwidthState; INLINE_BANDWIDTHS]>;

/// A state from per-bandwidth states, in configuration order (one bandwidth is kept inline:
/// collecting it allocates nothing).
///
/// ```
/// # use bucket4rs_core::{BandwidthState, BucketState};
/// let s: BucketState = [BandwidthState::from_parts(0, 1, 0)].into_iter().collect();
/// assert_eq!(s.bandwidths()[0].tokens(), 1);
/// ```
impl FromIterator<BandwidthState> for BucketState {
    fn from_iter<I: IntoIterator<Item = BandwidthState>>(iter: I) -> Self {
        Self {
            bandwidths: iter.into_iter().collect(),
        }
    }
}

impl BucketState {
    /// The state of a bucket built at clock reading `now`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState}; use core::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(4, Duration::from_secs(1))?).build()?;
    /// assert_eq!(BucketState::new(&config, 0).available_tokens(&config, 0), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(config: &BucketConfiguration, now: i64) -> Self {
        Self {
            bandwidths: config
                .bandwidths()
                .iter()
                .map(|b| math::fresh(b, now))
                .collect(),
        }
    }

    /// A state from a list already inline (the core's own constructions).
    pub(crate) fn from_inline(bandwidths: Bandwidths) -> Self {
        Self { bandwidths }
    }

    /// A state from raw per-bandwidth states: how a state kept elsewhere is restored (check
    /// it against its configuration with [`check`](Self::check)).
    ///
    /// ```
    /// # use bucket4rs_core::{BandwidthState, BucketState};
    /// let s = BucketState::from_bandwidths(vec![BandwidthState::from_parts(0, 1, 0)]);
    /// assert_eq!(s.bandwidths().len(), 1);
    /// ```
    pub fn from_bandwidths(bandwidths: Vec<BandwidthState>) -> Self {
        // Inline when it fits, otherwise the vector's own allocation is kept.
        Self {
            bandwidths: SmallVec::from_vec(bandwidths),
        }
    }

    /// The per-bandwidth states, in configuration order.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState}; use core::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(4, Duration::from_secs(1))?).build()?;
    /// assert_eq!(BucketState::new(&config, 0).bandwidths()[0].tokens(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bandwidths(&self) -> &[BandwidthState] {
        &self.bandwidths
    }

    /// The per-bandwidth states, mutably (their number stays fixed): for storage layers that
    /// keep states decoded and update them in place with [`ops::execute`](crate::ops::execute).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, BucketState}; use core::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(4, Duration::from_secs(1))?).build()?;
    /// let mut state = BucketState::new(&config, 0);
    /// state.bandwidths_mut()[0] = BandwidthState::from_parts(0, 1, 0);
    /// assert_eq!(state.bandwidths()[0].tokens(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bandwidths_mut(&mut self) -> &mut [BandwidthState] {
        &mut self.bandwidths
    }

    /// Checks that this state can belong to `config` (for states read from storage).
    ///
    /// # Errors
    /// A [`StateError`] describing the mismatch.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState}; use core::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(4, Duration::from_secs(1))?).build()?;
    /// assert!(BucketState::new(&config, 0).check(&config).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(&self, config: &BucketConfiguration) -> Result<(), StateError> {
        let bws = config.bandwidths();
        if bws.len() != self.bandwidths.len() {
            return Err(StateError::BandwidthCount {
                expected: bws.len(),
                found: self.bandwidths.len(),
            });
        }
        for (index, (b, s)) in bws.iter().zip(&self.bandwidths).enumerate() {
            let limit = if b.kind.is_interval() {
                1
            } else {
                b.refill_period
            };
            if s.remainder < 0 || s.remainder >= limit {
                return Err(StateError::Remainder { index });
            }
        }
        Ok(())
    }

    /// The earliest clock reading, at or after `now`, from which this state — left alone —
    /// answers every operation exactly as a bucket created afresh from `config` at that
    /// reading or later would. From then on a store may forget the state: recreating it on the
    /// next request changes no answer. `None` when that never happens, and the state must be
    /// kept to stay exact.
    ///
    /// A state becomes forgettable when every bandwidth is exactly full and a fresh one would
    /// be too: a greedy bandwidth whose initial tokens are its capacity, once refilled to it;
    /// an aligned interval bandwidth, once full on its fixed grid and past the periods a fresh
    /// one needs to fill up. Never for an interval bandwidth (a fresh one would start a new
    /// refill grid), initial tokens below capacity on a greedy bandwidth (a fresh bucket would
    /// start short), or tokens above capacity (they never decay). The answer assumes the
    /// bucket would be recreated from the same `config`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState}; use core::time::Duration;
    /// let config = BucketConfiguration::builder()
    ///     .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(10))?) // one token a second
    ///     .build()?;
    /// let mut state = BucketState::new(&config, 0);
    /// assert_eq!(state.forgettable_at(&config, 0), Some(0)); // full, like a fresh bucket
    /// state.apply(&config, 0, &bucket4rs_core::ops::TryConsume(3))?;
    /// assert_eq!(state.forgettable_at(&config, 0), Some(3_000_000_000)); // full again at 3 s
    ///
    /// let short = BucketConfiguration::builder()
    ///     .add_bandwidth(Bandwidth::builder().capacity(10).refill_greedy(10, Duration::from_secs(10)).initial_tokens(0).build()?)
    ///     .build()?;
    /// assert_eq!(BucketState::new(&short, 0).forgettable_at(&short, 60_000_000_000), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forgettable_at(&self, config: &BucketConfiguration, now: i64) -> Option<i64> {
        let bandwidths = config.bandwidths();
        if bandwidths.len() != self.bandwidths.len() {
            return None;
        }
        let mut at = now;
        for (b, s) in bandwidths.iter().zip(self.bandwidths.iter()) {
            at = at.max(math::forgettable_at(b, *s, now)?);
        }
        // Each bandwidth stays forgettable from its own reading on, so from the latest too.
        Some(at)
    }

    /// Runs any [`Operation`] on this state in place. The typed methods below are shorthands.
    ///
    /// # Errors
    /// The operation's [`OperationError`]; the state is then unchanged.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ops::TryConsume};
    /// # use core::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(4, Duration::from_secs(1))?).build()?;
    /// let mut state = BucketState::new(&config, 0);
    /// assert!(state.apply(&config, 0, &TryConsume(3))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn apply<O: Operation>(
        &mut self,
        config: &BucketConfiguration,
        now: i64,
        op: &O,
    ) -> Result<O::Output, OperationError> {
        // The slice once: each access through the `SmallVec` tests where it is stored.
        let bandwidths: &mut [BandwidthState] = &mut self.bandwidths;
        if config.bandwidths().len() != bandwidths.len() {
            return Err(OperationError::StateMismatch);
        }
        let cells = core::cell::Cell::from_mut(bandwidths).as_slice_of_cells();
        ops::execute(op, config, now, |i| cells[i].get(), |i, s| cells[i].set(s))
    }

    /// The balance after refill: the minimum over the bandwidths, negative in debt.
    /// (For a state that does not belong to `config` the value is meaningless but computed
    /// without panicking; see [`BucketState::check`].)
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState}; use core::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
    /// let mut state = BucketState::new(&config, 0);
    /// state.apply(&config, 0, &bucket4rs_core::ops::ConsumeIgnoringRateLimits(13))?;
    /// assert_eq!(state.available_tokens(&config, 0), -3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available_tokens(&self, config: &BucketConfiguration, now: i64) -> i64 {
        let b: &[BandwidthState] = &self.bandwidths;
        ops::Refilled::new(config, now, |i| b.get(i).copied().unwrap_or_default()).available()
    }

    /// Replaces the configuration, carrying tokens over with `strategy` (section 7 of the
    /// semantics). Returns the new state; `self` is untouched on error.
    ///
    /// `wall_clock_based` tells whether the bucket's clock counts epoch time (aligned refill
    /// needs it).
    ///
    /// # Errors
    /// [`ConfigError::AlignedRefillNeedsWallClock`].
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, TokensInheritanceStrategy};
    /// # use core::time::Duration;
    /// let old = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60))?).build()?;
    /// let new = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(200, Duration::from_secs(60))?).build()?;
    /// let mut state = BucketState::new(&old, 0);
    /// state.apply(&old, 0, &bucket4rs_core::ops::TryConsume(60))?;
    /// let state = state.replace_configuration(&old, &new, 0, TokensInheritanceStrategy::Proportionally, false)?;
    /// assert_eq!(state.available_tokens(&new, 0), 80);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replace_configuration(
        &self,
        old: &BucketConfiguration,
        new: &BucketConfiguration,
        now: i64,
        strategy: TokensInheritanceStrategy,
        wall_clock_based: bool,
    ) -> Result<BucketState, ConfigError> {
        let b: &[BandwidthState] = &self.bandwidths;
        replace::replace(
            old,
            |i| b.get(i).copied().unwrap_or_default(),
            new,
            now,
            strategy,
            wall_clock_based,
        )
    }
}
