//! Typed errors for bad configurations and bad operation arguments.

use alloc::sync::Arc;
use core::fmt;

/// Why a [`Bandwidth`](crate::Bandwidth) or a
/// [`BucketConfiguration`](crate::BucketConfiguration) was rejected.
///
/// Every rule Bucket4j enforces when a bucket is built has a variant here (rules V1–V9 of the
/// conformance suite's `SEMANTICS.md`). Values that Bucket4j rejects for being negative cannot be
/// expressed at all, because the builders take `u64` and [`Duration`](core::time::Duration).
///
/// ```
/// use bucket4rs_core::{Bandwidth, ConfigError};
/// use core::time::Duration;
///
/// let err = Bandwidth::builder().capacity(0).refill_greedy(1, Duration::from_secs(1)).build();
/// assert_eq!(err.unwrap_err(), ConfigError::ZeroCapacity);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A configuration needs at least one bandwidth (V1).
    NoBandwidths,
    /// The bandwidth builder was not given a capacity.
    MissingCapacity,
    /// The bandwidth builder was not given a refill.
    MissingRefill,
    /// Capacity must be at least 1 (V2).
    ZeroCapacity,
    /// Capacity must fit in a signed 64-bit integer.
    CapacityTooLarge {
        /// The rejected capacity.
        capacity: u64,
    },
    /// A refill must add at least one token (V3).
    ZeroRefillTokens,
    /// Refill tokens must fit in a signed 64-bit integer.
    RefillTokensTooLarge {
        /// The rejected token count.
        tokens: u64,
    },
    /// A refill period must be at least one nanosecond (V3).
    ZeroRefillPeriod,
    /// A refill period must be at most `i64::MAX` nanoseconds (about 292 years).
    RefillPeriodTooLong,
    /// At most one token per nanosecond can be refilled (V4).
    RefillRateTooHigh {
        /// Tokens per period.
        tokens: u64,
        /// The period in nanoseconds.
        period_nanos: u64,
    },
    /// Initial tokens must fit in a signed 64-bit integer.
    InitialTokensTooLarge {
        /// The rejected amount.
        tokens: u64,
    },
    /// Adaptive initial tokens and explicit initial tokens exclude each other (V6).
    InitialTokensWithAdaptiveRefill,
    /// The time of the first aligned refill must be at most `i64::MAX` nanoseconds after the epoch.
    FirstRefillTooLate,
    /// Two bandwidths share an id (V8).
    DuplicateId {
        /// The repeated id.
        id: Arc<str>,
    },
    /// Aligned interval refill needs a clock that counts wall-clock time since the Unix epoch (V9).
    AlignedRefillNeedsWallClock,
    /// A store of buckets per key was given a key cap of zero, which would refuse every key.
    ZeroMaxKeys,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoBandwidths => {
                f.write_str("a bucket configuration needs at least one bandwidth")
            }
            Self::MissingCapacity => f.write_str("the bandwidth has no capacity"),
            Self::MissingRefill => f.write_str("the bandwidth has no refill"),
            Self::ZeroCapacity => f.write_str("capacity must be at least 1"),
            Self::CapacityTooLarge { capacity } => {
                write!(f, "capacity {capacity} is larger than i64::MAX")
            }
            Self::ZeroRefillTokens => f.write_str("refill tokens must be at least 1"),
            Self::RefillTokensTooLarge { tokens } => {
                write!(f, "refill tokens {tokens} is larger than i64::MAX")
            }
            Self::ZeroRefillPeriod => f.write_str("refill period must be at least 1 ns"),
            Self::RefillPeriodTooLong => f.write_str("refill period is longer than i64::MAX ns"),
            Self::RefillRateTooHigh {
                tokens,
                period_nanos,
            } => write!(
                f,
                "refill of {tokens} tokens per {period_nanos} ns is faster than 1 token per nanosecond"
            ),
            Self::InitialTokensTooLarge { tokens } => {
                write!(f, "initial tokens {tokens} is larger than i64::MAX")
            }
            Self::InitialTokensWithAdaptiveRefill => f.write_str(
                "explicit initial tokens cannot be combined with adaptive initial tokens",
            ),
            Self::FirstRefillTooLate => {
                f.write_str("time of first refill is later than i64::MAX ns after the epoch")
            }
            Self::DuplicateId { id } => write!(f, "bandwidth id {id:?} is used more than once"),
            Self::AlignedRefillNeedsWallClock => f.write_str(
                "aligned interval refill needs a wall-clock based time meter (the Unix epoch)",
            ),
            Self::ZeroMaxKeys => f.write_str("a key cap of zero would refuse every key"),
        }
    }
}

impl core::error::Error for ConfigError {}

/// Why an operation's arguments were rejected. A rejected operation changes nothing.
///
/// Being rate limited is *not* an error: `try_consume` returns `false`, probes say how long to
/// wait. These errors are for arguments that can never make sense.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, OperationError};
/// use core::time::Duration;
///
/// let config = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1)).unwrap())
///     .build()
///     .unwrap();
/// let mut state = BucketState::new(&config, 0);
/// assert_eq!(state.apply(&config, 0, &bucket4rs_core::ops::TryConsume(0)), Err(OperationError::ZeroTokens));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OperationError {
    /// Token counts must be at least 1.
    ZeroTokens,
    /// A limit on consumed tokens must be at least 1.
    ZeroLimit,
    /// A maximum wait must be at least one nanosecond.
    ZeroMaxWait,
    /// A reservation whose wait does not fit below `i64::MAX` nanoseconds (about 292 years):
    /// it could never be served, so it is refused instead of creating an unpayable debt.
    WaitTooLong,
    /// The state passed to a pure operation does not have one entry per bandwidth of the
    /// configuration passed with it.
    StateMismatch,
}

impl fmt::Display for OperationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ZeroTokens => "the number of tokens must be at least 1",
            Self::ZeroLimit => "the limit must be at least 1",
            Self::ZeroMaxWait => "the maximum wait must be at least 1 ns",
            Self::WaitTooLong => "the reservation would have to wait longer than i64::MAX ns",
            Self::StateMismatch => "the state does not belong to the configuration",
        })
    }
}

impl core::error::Error for OperationError {}
