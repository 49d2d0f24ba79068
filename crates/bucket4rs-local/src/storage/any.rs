use core::fmt;
use core::str::FromStr;

use bucket4rs_core::ops::Operation;
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
};

use super::sealed::{New, Sealed};
use super::{LockFree, Replacement, Storage, Synchronized};

/// A thread-safe strategy chosen at run time.
///
/// ```
/// use bucket4rs_local::SynchronizationStrategy;
/// assert_eq!("lock_free".parse(), Ok(SynchronizationStrategy::LockFree));
/// assert!("none".parse::<SynchronizationStrategy>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum SynchronizationStrategy {
    /// [`LockFree`].
    #[default]
    LockFree,
    /// [`Synchronized`].
    Synchronized,
}

/// An unknown strategy name.
///
/// ```
/// use bucket4rs_local::SynchronizationStrategy;
/// let err = "spin".parse::<SynchronizationStrategy>().unwrap_err();
/// assert!(err.to_string().contains("spin"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownStrategy(String);

impl fmt::Display for UnknownStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown synchronization strategy {:?} (expected lock_free or synchronized)",
            self.0
        )
    }
}

impl std::error::Error for UnknownStrategy {}

impl FromStr for SynchronizationStrategy {
    type Err = UnknownStrategy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "lock_free" | "lockfree" => Ok(Self::LockFree),
            "synchronized" | "mutex" => Ok(Self::Synchronized),
            _ => Err(UnknownStrategy(s.to_owned())),
        }
    }
}

/// Storage of a bucket whose strategy was chosen at run time: a two-way `match`, still no
/// dynamic dispatch.
///
/// ```
/// use bucket4rs_local::{AnyStorage, Bucket};
/// use std::time::Duration;
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
///     .build_with("synchronized".parse()?)?;
/// let _: &Bucket<AnyStorage> = &bucket;
/// assert!(bucket.try_consume(1)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
// The lock-free variant is the state's cache-line-aligned hot words, held inline on purpose:
// boxing it would add a pointer chase to every operation of a run-time-chosen bucket.
#[allow(clippy::large_enum_variant)]
pub enum AnyStorage {
    /// Lock-free.
    LockFree(LockFree),
    /// Mutex.
    Synchronized(Synchronized),
}

impl AnyStorage {
    pub(crate) fn new_with(
        strategy: SynchronizationStrategy,
        config: BucketConfiguration,
        state: BucketState,
        monotonic_clock: bool,
    ) -> Self {
        match strategy {
            SynchronizationStrategy::LockFree => {
                Self::LockFree(LockFree::new(config, state, monotonic_clock))
            }
            SynchronizationStrategy::Synchronized => {
                Self::Synchronized(Synchronized::new(config, state, monotonic_clock))
            }
        }
    }
}

impl Storage for AnyStorage {}

impl Sealed for AnyStorage {
    #[inline]
    fn execute<O: Operation>(&self, op: &O, now: i64) -> Result<O::Output, OperationError> {
        match self {
            Self::LockFree(s) => s.execute(op, now),
            Self::Synchronized(s) => s.execute(op, now),
        }
    }
    fn execute_with_config<O: Operation>(
        &self,
        op: &O,
        now: i64,
    ) -> Result<(O::Output, BucketConfiguration), OperationError> {
        match self {
            Self::LockFree(s) => s.execute_with_config(op, now),
            Self::Synchronized(s) => s.execute_with_config(op, now),
        }
    }
    fn replace_with<F>(&self, now: i64, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement,
    {
        match self {
            Self::LockFree(s) => s.replace_with(now, f),
            Self::Synchronized(s) => s.replace_with(now, f),
        }
    }
    fn snapshot(&self, now: i64) -> (BucketConfiguration, BucketState) {
        match self {
            Self::LockFree(s) => s.snapshot(now),
            Self::Synchronized(s) => s.snapshot(now),
        }
    }
}
