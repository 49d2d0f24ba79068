//! Bandwidths (limits) and bucket configurations.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::time::Duration;

use strength_reduce::StrengthReducedU64;

use crate::error::ConfigError;

/// How a bandwidth regains tokens.
///
/// ```
/// use bucket4rs_core::{Bandwidth, RefillKind};
/// use core::time::Duration;
///
/// let b = Bandwidth::builder().capacity(5).refill_intervally(5, Duration::from_secs(1)).build()?;
/// assert_eq!(b.refill_kind(), RefillKind::Intervally);
/// # Ok::<(), bucket4rs_core::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefillKind {
    /// Tokens arrive continuously, `tokens` per `period`; fractions of a token are kept exactly.
    Greedy,
    /// All `tokens` arrive at once, each time a whole period has passed since the last refill.
    Intervally,
    /// Like [`RefillKind::Intervally`], on a grid `first_refill_nanos + k * period` of epoch time.
    IntervallyAligned {
        /// Epoch nanoseconds of the first refill, rounded down to a whole millisecond.
        first_refill_nanos: i64,
        /// Whether initial tokens are derived from the time left before the first refill.
        adaptive_initial_tokens: bool,
    },
}

impl RefillKind {
    /// `true` for the two interval kinds.
    pub(crate) const fn is_interval(self) -> bool {
        !matches!(self, Self::Greedy)
    }
}

/// One limit of a bucket: a capacity and the rate at which it refills.
///
/// Built with [`Bandwidth::builder`] (or [`Bandwidth::simple`]); every value is validated, so a
/// `Bandwidth` you hold is always usable. Cheap to clone.
///
/// ```
/// use bucket4rs_core::Bandwidth;
/// use core::time::Duration;
///
/// // 20 tokens, refilled greedily at 20 per minute, starting with 5, matched by id "burst".
/// let b = Bandwidth::builder()
///     .capacity(20)
///     .refill_greedy(20, Duration::from_secs(60))
///     .initial_tokens(5)
///     .id("burst")
///     .build()?;
/// assert_eq!(b.capacity(), 20);
/// assert_eq!(b.initial_tokens(), 5);
/// assert_eq!(b.id(), Some("burst"));
/// # Ok::<(), bucket4rs_core::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Bandwidth {
    pub(crate) capacity: i64,
    pub(crate) refill_tokens: i64,
    pub(crate) refill_period: i64,
    /// `refill_period` as a precomputed reciprocal, for division on the hot path.
    pub(crate) period_divisor: StrengthReducedU64,
    /// Every reachable remainder is a multiple of this quantum: `gcd(refill_tokens, period)`
    /// for a greedy refill (a refill adds multiples of `refill_tokens` modulo the period), the
    /// period itself for interval refills (their remainder is always 0).
    pub(crate) remainder_quantum: i64,
    /// `refill_period / remainder_quantum`: one token in units of the quantum, precomputed.
    pub(crate) balance_unit: StrengthReducedU64,
    /// A greedy refill's rate in scaled units per nanosecond: `refill_tokens / quantum`.
    pub(crate) scaled_rate: u64,
    /// The capacity in scaled units (`capacity × unit`), when it fits `i64`.
    pub(crate) scaled_capacity: Option<i64>,
    pub(crate) kind: RefillKind,
    pub(crate) initial_tokens: Option<i64>,
    pub(crate) id: Option<Arc<str>>,
}

impl Bandwidth {
    fn key(&self) -> (i64, i64, i64, RefillKind, Option<i64>, Option<&str>) {
        let (c, t, p) = (self.capacity, self.refill_tokens, self.refill_period);
        (c, t, p, self.kind, self.initial_tokens, self.id.as_deref())
    }
}

// The divisor is derived from `refill_period`, so it takes no part in equality or hashing.
impl PartialEq for Bandwidth {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Bandwidth {}

impl core::hash::Hash for Bandwidth {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl Bandwidth {
    /// Starts a bandwidth builder.
    ///
    /// ```
    /// use bucket4rs_core::Bandwidth;
    /// use core::time::Duration;
    /// let b = Bandwidth::builder().capacity(3).refill_greedy(1, Duration::from_secs(1)).build();
    /// assert!(b.is_ok());
    /// ```
    pub fn builder() -> BandwidthBuilder {
        BandwidthBuilder::default()
    }

    /// `capacity` tokens, refilled greedily at `capacity` tokens per `period`.
    ///
    /// ```
    /// use bucket4rs_core::Bandwidth;
    /// use core::time::Duration;
    /// let b = Bandwidth::simple(100, Duration::from_secs(60))?;
    /// assert_eq!(b.refill_tokens(), 100);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn simple(capacity: u64, period: Duration) -> Result<Self, ConfigError> {
        Self::builder()
            .capacity(capacity)
            .refill_greedy(capacity, period)
            .build()
    }

    /// The maximum number of tokens refill can bring this bandwidth up to.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use core::time::Duration;
    /// assert_eq!(Bandwidth::simple(7, Duration::from_secs(1)).unwrap().capacity(), 7);
    /// ```
    pub fn capacity(&self) -> u64 {
        self.capacity as u64
    }

    /// Tokens added per refill period.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use core::time::Duration;
    /// let b = Bandwidth::builder().capacity(9).refill_greedy(3, Duration::from_secs(1)).build()?;
    /// assert_eq!(b.refill_tokens(), 3);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn refill_tokens(&self) -> u64 {
        self.refill_tokens as u64
    }

    /// The refill period.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use core::time::Duration;
    /// let b = Bandwidth::simple(1, Duration::from_millis(250))?;
    /// assert_eq!(b.refill_period(), Duration::from_millis(250));
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn refill_period(&self) -> Duration {
        Duration::from_nanos(self.refill_period as u64)
    }

    /// How this bandwidth refills.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, RefillKind}; use core::time::Duration;
    /// assert_eq!(Bandwidth::simple(1, Duration::from_secs(1))?.refill_kind(), RefillKind::Greedy);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn refill_kind(&self) -> RefillKind {
        self.kind
    }

    /// Tokens at build time when they were given explicitly, else `None`.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use core::time::Duration;
    /// assert_eq!(Bandwidth::simple(4, Duration::from_secs(1))?.explicit_initial_tokens(), None);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn explicit_initial_tokens(&self) -> Option<u64> {
        self.initial_tokens.map(|t| t as u64)
    }

    /// Tokens at build time: the explicit initial tokens, or the capacity. (Adaptive aligned
    /// bandwidths compute theirs from the clock; see `BucketState::new`.)
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use core::time::Duration;
    /// assert_eq!(Bandwidth::simple(4, Duration::from_secs(1))?.initial_tokens(), 4);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn initial_tokens(&self) -> u64 {
        self.initial_tokens.unwrap_or(self.capacity) as u64
    }

    /// The id used to match this bandwidth when a configuration is replaced.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use core::time::Duration;
    /// assert_eq!(Bandwidth::simple(4, Duration::from_secs(1))?.id(), None);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }
}

/// Builder for a [`Bandwidth`]: a capacity and one refill are required.
///
/// ```
/// use bucket4rs_core::{Bandwidth, RefillKind};
/// use core::time::Duration;
///
/// // Refill 400 tokens at the top of every hour, starting full.
/// let top_of_hour = Duration::from_secs(1_700_000_000 / 3600 * 3600 + 3600);
/// let b = Bandwidth::builder()
///     .capacity(400)
///     .refill_intervally_aligned(400, Duration::from_secs(3600), top_of_hour)
///     .build()?;
/// assert!(matches!(b.refill_kind(), RefillKind::IntervallyAligned { .. }));
/// # Ok::<(), bucket4rs_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct BandwidthBuilder {
    capacity: Option<u64>,
    refill: Option<(u64, Duration, RefillSpec)>,
    initial_tokens: Option<u64>,
    id: Option<Arc<str>>,
}

#[derive(Clone, Copy, Debug)]
enum RefillSpec {
    Greedy,
    Intervally,
    Aligned {
        first_refill: Duration,
        adaptive: bool,
    },
}

impl BandwidthBuilder {
    /// Sets the capacity (at least 1).
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use core::time::Duration;
    /// let b = Bandwidth::builder().capacity(2).refill_greedy(2, Duration::from_secs(1)).build()?;
    /// assert_eq!(b.capacity(), 2);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = Some(capacity);
        self
    }

    /// Greedy refill: `tokens` per `period`, added continuously (10 per second gives one token
    /// every 100 ms).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, RefillKind}; use core::time::Duration;
    /// let b = Bandwidth::builder().capacity(10).refill_greedy(10, Duration::from_secs(1)).build()?;
    /// assert_eq!(b.refill_kind(), RefillKind::Greedy);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn refill_greedy(mut self, tokens: u64, period: Duration) -> Self {
        self.refill = Some((tokens, period, RefillSpec::Greedy));
        self
    }

    /// Interval refill: all `tokens` at once, after each whole `period`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, RefillKind}; use core::time::Duration;
    /// let b = Bandwidth::builder().capacity(10).refill_intervally(10, Duration::from_secs(1)).build()?;
    /// assert_eq!(b.refill_kind(), RefillKind::Intervally);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn refill_intervally(mut self, tokens: u64, period: Duration) -> Self {
        self.refill = Some((tokens, period, RefillSpec::Intervally));
        self
    }

    /// Aligned interval refill: `tokens` at `first_refill + k * period`, where `first_refill` is
    /// measured from the Unix epoch and kept to the millisecond (rounded down). Needs a
    /// wall-clock based clock.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, RefillKind}; use core::time::Duration;
    /// let b = Bandwidth::builder()
    ///     .capacity(10)
    ///     .refill_intervally_aligned(10, Duration::from_secs(60), Duration::from_nanos(1_999_999))
    ///     .build()?;
    /// assert_eq!(
    ///     b.refill_kind(),
    ///     RefillKind::IntervallyAligned { first_refill_nanos: 1_000_000, adaptive_initial_tokens: false }
    /// );
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn refill_intervally_aligned(
        mut self,
        tokens: u64,
        period: Duration,
        first_refill: Duration,
    ) -> Self {
        let spec = RefillSpec::Aligned {
            first_refill,
            adaptive: false,
        };
        self.refill = Some((tokens, period, spec));
        self
    }

    /// Aligned interval refill whose initial tokens depend on how long remains before the first
    /// refill (Bucket4j's adaptive initial tokens). Excludes [`initial_tokens`](Self::initial_tokens).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, RefillKind}; use core::time::Duration;
    /// let b = Bandwidth::builder()
    ///     .capacity(10)
    ///     .refill_intervally_aligned_adaptive(10, Duration::from_secs(60), Duration::from_secs(60))
    ///     .build()?;
    /// assert!(matches!(
    ///     b.refill_kind(),
    ///     RefillKind::IntervallyAligned { adaptive_initial_tokens: true, .. }
    /// ));
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    #[doc(alias = "refill_intervally_aligned_with_adaptive_initial_tokens")]
    pub fn refill_intervally_aligned_adaptive(
        mut self,
        tokens: u64,
        period: Duration,
        first_refill: Duration,
    ) -> Self {
        let spec = RefillSpec::Aligned {
            first_refill,
            adaptive: true,
        };
        self.refill = Some((tokens, period, spec));
        self
    }

    /// Tokens at build time instead of the capacity (0 allowed; above the capacity allowed).
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use core::time::Duration;
    /// let b = Bandwidth::builder()
    ///     .capacity(10)
    ///     .refill_greedy(10, Duration::from_secs(1))
    ///     .initial_tokens(0)
    ///     .build()?;
    /// assert_eq!(b.initial_tokens(), 0);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn initial_tokens(mut self, tokens: u64) -> Self {
        self.initial_tokens = Some(tokens);
        self
    }

    /// An id, to match this bandwidth by when the configuration is replaced.
    ///
    /// ```
    /// # use bucket4rs_core::Bandwidth; use core::time::Duration;
    /// let b = Bandwidth::builder().capacity(1).refill_greedy(1, Duration::from_secs(1)).id("a").build()?;
    /// assert_eq!(b.id(), Some("a"));
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn id(mut self, id: impl Into<Arc<str>>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Validates and builds the bandwidth.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first rule broken.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, ConfigError}; use core::time::Duration;
    /// let too_fast = Bandwidth::builder().capacity(10).refill_greedy(1001, Duration::from_nanos(1000)).build();
    /// assert!(matches!(too_fast, Err(ConfigError::RefillRateTooHigh { .. })));
    /// ```
    pub fn build(self) -> Result<Bandwidth, ConfigError> {
        let capacity = self.capacity.ok_or(ConfigError::MissingCapacity)?;
        let (tokens, period, spec) = self.refill.ok_or(ConfigError::MissingRefill)?;
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        let capacity =
            i64::try_from(capacity).map_err(|_| ConfigError::CapacityTooLarge { capacity })?;
        if tokens == 0 {
            return Err(ConfigError::ZeroRefillTokens);
        }
        let refill_tokens =
            i64::try_from(tokens).map_err(|_| ConfigError::RefillTokensTooLarge { tokens })?;
        let period_nanos = period.as_nanos();
        if period_nanos == 0 {
            return Err(ConfigError::ZeroRefillPeriod);
        }
        let refill_period =
            i64::try_from(period_nanos).map_err(|_| ConfigError::RefillPeriodTooLong)?;
        if refill_tokens > refill_period {
            return Err(ConfigError::RefillRateTooHigh {
                tokens,
                period_nanos: period_nanos as u64,
            });
        }
        let initial_tokens = match self.initial_tokens {
            None => None,
            Some(t) => Some(
                i64::try_from(t).map_err(|_| ConfigError::InitialTokensTooLarge { tokens: t })?,
            ),
        };
        let kind = match spec {
            RefillSpec::Greedy => RefillKind::Greedy,
            RefillSpec::Intervally => RefillKind::Intervally,
            RefillSpec::Aligned {
                first_refill,
                adaptive,
            } => {
                if adaptive && initial_tokens.is_some() {
                    return Err(ConfigError::InitialTokensWithAdaptiveRefill);
                }
                let nanos = i64::try_from(first_refill.as_nanos())
                    .map_err(|_| ConfigError::FirstRefillTooLate)?;
                RefillKind::IntervallyAligned {
                    first_refill_nanos: nanos / 1_000_000 * 1_000_000,
                    adaptive_initial_tokens: adaptive,
                }
            }
        };
        let remainder_quantum = if kind.is_interval() {
            refill_period
        } else {
            gcd(refill_tokens as u64, refill_period as u64) as i64
        };
        Ok(Bandwidth {
            capacity,
            refill_tokens,
            refill_period,
            // refill_period >= 1 was checked above, so the reciprocal exists.
            period_divisor: StrengthReducedU64::new(refill_period as u64),
            remainder_quantum,
            // The quantum divides the period, so the unit is in 1..=period.
            balance_unit: StrengthReducedU64::new((refill_period / remainder_quantum) as u64),
            scaled_rate: (refill_tokens / remainder_quantum) as u64,
            scaled_capacity: capacity.checked_mul(refill_period / remainder_quantum),
            kind,
            initial_tokens,
            id: self.id,
        })
    }
}

/// Greatest common divisor (Euclid); `gcd(a, 0) = a`.
const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

/// An immutable, validated list of bandwidths: the whole rule set of one bucket.
///
/// Cheap to clone (the bandwidths are shared), comparable and hashable. A request is served only
/// when every bandwidth has the tokens, so the classic "burst plus sustained rate" is two limits:
///
/// ```
/// use bucket4rs_core::BucketConfiguration;
/// use core::time::Duration;
///
/// let config = BucketConfiguration::builder()
///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))) // bursts of 10
///     .add_limit(|l| l.capacity(1_000).refill_greedy(1_000, Duration::from_secs(3600))) // 1000 an hour
///     .build()?;
/// assert_eq!(config.bandwidths().len(), 2);
/// # Ok::<(), bucket4rs_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BucketConfiguration {
    bandwidths: Arc<[Bandwidth]>,
}

impl BucketConfiguration {
    /// Starts a configuration builder.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use core::time::Duration;
    /// let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// assert_eq!(c.bandwidths()[0].capacity(), 1);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn builder() -> ConfigurationBuilder {
        ConfigurationBuilder::default()
    }

    /// A configuration from a list of bandwidths, validated like the builder.
    ///
    /// # Errors
    /// [`ConfigError::NoBandwidths`] or [`ConfigError::DuplicateId`].
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, ConfigError};
    /// assert_eq!(BucketConfiguration::new(Vec::new()), Err(ConfigError::NoBandwidths));
    /// ```
    pub fn new(bandwidths: Vec<Bandwidth>) -> Result<Self, ConfigError> {
        if bandwidths.is_empty() {
            return Err(ConfigError::NoBandwidths);
        }
        for (i, b) in bandwidths.iter().enumerate() {
            if let Some(id) = &b.id
                && bandwidths[..i].iter().any(|o| o.id.as_deref() == Some(id))
            {
                return Err(ConfigError::DuplicateId { id: id.clone() });
            }
        }
        Ok(Self {
            bandwidths: bandwidths.into(),
        })
    }

    /// The bandwidths, in the order they were added.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use core::time::Duration;
    /// let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(1))?).build()?;
    /// assert_eq!(c.bandwidths().len(), 1);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn bandwidths(&self) -> &[Bandwidth] {
        &self.bandwidths
    }

    /// Whether any bandwidth uses aligned interval refill (which needs a wall clock).
    pub(crate) fn needs_wall_clock(&self) -> bool {
        self.bandwidths
            .iter()
            .any(|b| matches!(b.kind, RefillKind::IntervallyAligned { .. }))
    }

    /// Checks rule V9: aligned refill is only allowed with a wall-clock based clock.
    ///
    /// # Errors
    /// [`ConfigError::AlignedRefillNeedsWallClock`].
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, ConfigError}; use core::time::Duration;
    /// let aligned = Bandwidth::builder()
    ///     .capacity(1)
    ///     .refill_intervally_aligned(1, Duration::from_secs(1), Duration::ZERO)
    ///     .build()?;
    /// let c = BucketConfiguration::builder().add_bandwidth(aligned).build()?;
    /// assert_eq!(c.check_clock(false), Err(ConfigError::AlignedRefillNeedsWallClock));
    /// assert_eq!(c.check_clock(true), Ok(()));
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn check_clock(&self, wall_clock_based: bool) -> Result<(), ConfigError> {
        if !wall_clock_based && self.needs_wall_clock() {
            return Err(ConfigError::AlignedRefillNeedsWallClock);
        }
        Ok(())
    }
}

/// Builder for a [`BucketConfiguration`], with the same two ways to add a limit as
/// `bucket4rs-local`'s `BucketBuilder`: [`add_limit`](Self::add_limit) configures one with a
/// closure on a [`BandwidthBuilder`], [`add_bandwidth`](Self::add_bandwidth) adds one built
/// already.
///
/// Building a limit in a closure can fail (a zero capacity, a refill faster than one token per
/// nanosecond, …); the builder keeps the first such error and [`build`](Self::build) returns
/// it, so a chain of `add_limit` calls needs a single `?` at the end.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use core::time::Duration;
/// let c = BucketConfiguration::builder()
///     .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1)))
///     .add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60))?)
///     .build()?;
/// assert_eq!(c.bandwidths()[0].capacity(), 5);
/// assert_eq!(c.bandwidths()[1].capacity(), 100);
/// # Ok::<(), bucket4rs_core::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct ConfigurationBuilder {
    bandwidths: Vec<Bandwidth>,
    /// The first error of a limit built by [`ConfigurationBuilder::add_limit`].
    error: Option<ConfigError>,
}

impl ConfigurationBuilder {
    /// Adds a limit configured by a closure on a [`BandwidthBuilder`] (Bucket4j's
    /// `addLimit(limit -> limit.capacity(…)…)`). A limit that does not build makes
    /// [`build`](Self::build) fail with its error (the first one, if several do).
    ///
    /// ```
    /// # use bucket4rs_core::{BucketConfiguration, ConfigError}; use core::time::Duration;
    /// let c = BucketConfiguration::builder()
    ///     .add_limit(|l| l.capacity(20).refill_greedy(20, Duration::from_secs(60)).id("minute"))
    ///     .build()?;
    /// assert_eq!(c.bandwidths()[0].id(), Some("minute"));
    ///
    /// let bad = BucketConfiguration::builder()
    ///     .add_limit(|l| l.capacity(0).refill_greedy(1, Duration::from_secs(1)))
    ///     .build();
    /// assert_eq!(bad, Err(ConfigError::ZeroCapacity));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn add_limit(self, limit: impl FnOnce(BandwidthBuilder) -> BandwidthBuilder) -> Self {
        match limit(Bandwidth::builder()).build() {
            Ok(b) => self.add_bandwidth(b),
            Err(e) => self.fail(e),
        }
    }

    /// Adds a prebuilt limit (Bucket4j's `addLimit(Bandwidth)`).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use core::time::Duration;
    /// let c = BucketConfiguration::builder()
    ///     .add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?)
    ///     .build()?;
    /// assert_eq!(c.bandwidths()[0].capacity(), 5);
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn add_bandwidth(mut self, bandwidth: Bandwidth) -> Self {
        self.bandwidths.push(bandwidth);
        self
    }

    /// Keeps the first error, for `build`.
    fn fail(mut self, error: ConfigError) -> Self {
        self.error.get_or_insert(error);
        self
    }

    /// Validates and builds the configuration.
    ///
    /// # Errors
    /// The error of the first limit [`add_limit`](Self::add_limit) could not build, else
    /// [`ConfigError::NoBandwidths`] or [`ConfigError::DuplicateId`].
    ///
    /// ```
    /// # use bucket4rs_core::{BucketConfiguration, ConfigError};
    /// assert_eq!(BucketConfiguration::builder().build(), Err(ConfigError::NoBandwidths));
    /// ```
    pub fn build(self) -> Result<BucketConfiguration, ConfigError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        BucketConfiguration::new(self.bandwidths)
    }
}
