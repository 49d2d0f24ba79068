//! [`KeyedError`]: why a keyed bucket could not run an operation.

use core::fmt;

use bucket4rs_core::{ConfigError, OperationError};

// Only named by the documentation's links.
#[cfg(doc)]
use super::KeyedBucketBuilder;

/// Why a keyed bucket could not run an operation. Nothing changed.
///
/// ```
/// use bucket4rs_local::{KeyedBucket, KeyedError, OperationError};
/// use std::time::Duration;
///
/// let limiter: KeyedBucket<u64> = KeyedBucket::builder()
///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
///     .build()?;
/// assert_eq!(limiter.try_consume(&7, 0), Err(KeyedError::Operation(OperationError::ZeroTokens)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyedError {
    /// The operation's arguments are invalid, as for a [`Bucket`](crate::Bucket).
    Operation(OperationError),
    /// The key has no bucket, and the map holds its maximum number of keys, none of which
    /// could be forgotten when the map last looked: a sweep at the cap that frees nothing
    /// notes when the first kept bucket could go, and new keys are refused without another
    /// look until then (a bucket filled early by `add_tokens` or `reset` waits for that sweep,
    /// or for [`KeyedBucket::sweep`](super::KeyedBucket::sweep)); a removal makes room at once.
    TooManyKeys {
        /// The cap ([`KeyedBucketBuilder::max_keys`]).
        max: usize,
    },
    /// The configuration source has no configuration for this key.
    UnknownKey,
    /// The configuration is invalid for this bucket (a replacement, or a configuration chosen
    /// for a key, that needs a wall clock the bucket does not have).
    Configuration(ConfigError),
}

impl fmt::Display for KeyedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Operation(e) => e.fmt(f),
            Self::TooManyKeys { max } => write!(
                f,
                "the keyed bucket holds its maximum of {max} keys and none can be forgotten yet"
            ),
            Self::UnknownKey => f.write_str("no configuration for this key"),
            Self::Configuration(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for KeyedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Operation(e) => Some(e),
            Self::Configuration(e) => Some(e),
            Self::TooManyKeys { .. } | Self::UnknownKey => None,
        }
    }
}

impl From<OperationError> for KeyedError {
    fn from(e: OperationError) -> Self {
        Self::Operation(e)
    }
}

impl From<ConfigError> for KeyedError {
    fn from(e: ConfigError) -> Self {
        Self::Configuration(e)
    }
}
