//! The keyed bucket's builder.

use core::hash::{BuildHasher, Hash};

use bucket4rs_core::{
    Bandwidth, BandwidthBuilder, BucketConfiguration, BucketListener, Clock, ConfigError,
    ConfigurationBuilder, NoopListener,
};

use super::{DefaultHasher, KeyedBucket, PerKey, Shared, Source};
use crate::clock::FastClock;
use crate::primitive::Map;

/// Builds a [`KeyedBucket`]: the limits of every key (as for a
/// [`Bucket`](crate::Bucket)), or a configuration chosen per key; the clock, the listener, the
/// key cap and the hasher.
///
/// ```
/// use bucket4rs_local::{Bandwidth, BucketConfiguration, KeyedBucket};
/// use std::time::Duration;
///
/// let free = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::simple(20, Duration::from_secs(60))?)
///     .build()?;
/// let pro = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::simple(200, Duration::from_secs(60))?)
///     .build()?;
/// // A tier per API key, chosen when the key is first seen; unknown keys get none.
/// let limiter: KeyedBucket<String> = KeyedBucket::builder()
///     .configuration_per_key(move |key: &String| match key.as_str() {
///         "pro-key" => Some(pro.clone()),
///         "free-key" => Some(free.clone()),
///         _ => None,
///     })
///     .max_keys(100_000)
///     .build()?;
/// assert!(limiter.try_consume("pro-key", 200)?);
/// assert!(!limiter.try_consume("free-key", 21)?);
/// assert!(limiter.try_consume("stranger", 1).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct KeyedBucketBuilder<K, C = FastClock, L = NoopListener, S = DefaultHasher> {
    /// The limits every key gets, and the first error of one that did not build.
    limits: ConfigurationBuilder,
    per_key: Option<PerKey<K>>,
    clock: C,
    listener: L,
    hasher: S,
    max_keys: Option<usize>,
}

impl<K, C: core::fmt::Debug, L: core::fmt::Debug, S> core::fmt::Debug
    for KeyedBucketBuilder<K, C, L, S>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyedBucketBuilder")
            .field("limits", &self.limits)
            .field("per_key", &self.per_key.is_some())
            .field("clock", &self.clock)
            .field("listener", &self.listener)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl<K> KeyedBucketBuilder<K> {
    pub(super) fn new() -> Self {
        Self {
            limits: ConfigurationBuilder::default(),
            per_key: None,
            clock: FastClock,
            listener: NoopListener,
            hasher: DefaultHasher::default(),
            max_keys: None,
        }
    }
}

impl<K, C, L, S> KeyedBucketBuilder<K, C, L, S> {
    /// Adds a limit every key gets, built from a [`BandwidthBuilder`].
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// let limiter: KeyedBucket<u8> = KeyedBucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(60)))
    ///     .build()?;
    /// assert_eq!(limiter.available_tokens(&1)?, 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_limit(mut self, limit: impl FnOnce(BandwidthBuilder) -> BandwidthBuilder) -> Self {
        self.limits = core::mem::take(&mut self.limits).add_limit(limit);
        self
    }

    /// Adds a limit every key gets.
    ///
    /// ```
    /// # use bucket4rs_local::{Bandwidth, KeyedBucket}; use std::time::Duration;
    /// let limiter: KeyedBucket<u8> = KeyedBucket::builder()
    ///     .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?)
    ///     .build()?;
    /// assert_eq!(limiter.available_tokens(&1)?, 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_bandwidth(mut self, bandwidth: Bandwidth) -> Self {
        self.limits = core::mem::take(&mut self.limits).add_bandwidth(bandwidth);
        self
    }

    /// Adds the limits of `config` for every key.
    ///
    /// ```
    /// # use bucket4rs_local::{Bandwidth, BucketConfiguration, KeyedBucket}; use std::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(1))?).build()?;
    /// let limiter: KeyedBucket<u8> = KeyedBucket::builder().with_configuration(&config).build()?;
    /// assert_eq!(limiter.available_tokens(&1)?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_configuration(self, config: &BucketConfiguration) -> Self {
        config
            .bandwidths()
            .iter()
            .cloned()
            .fold(self, Self::add_bandwidth)
    }

    /// Chooses each key's configuration when the key is first used (or used again after its
    /// bucket was forgotten): `None` makes the key unknown ([`KeyedError::UnknownKey`]).
    /// Replaces the limits added to the builder. A bucket is only forgotten while `f` still
    /// answers its configuration for the key, so a key whose tier changed keeps its bucket
    /// until it is replaced or removed.
    ///
    /// [`KeyedError::UnknownKey`]: super::KeyedError::UnknownKey
    ///
    /// ```
    /// # use bucket4rs_local::{Bandwidth, BucketConfiguration, KeyedBucket}; use std::time::Duration;
    /// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(1))?).build()?;
    /// let limiter: KeyedBucket<u32> = KeyedBucket::builder()
    ///     .configuration_per_key(move |k: &u32| (*k < 10).then(|| config.clone()))
    ///     .build()?;
    /// assert!(limiter.try_consume(&3, 3)?);
    /// assert!(limiter.try_consume(&30, 1).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn configuration_per_key(
        mut self,
        f: impl Fn(&K) -> Option<BucketConfiguration> + Send + Sync + 'static,
    ) -> Self {
        self.per_key = Some(Box::new(f));
        self
    }

    /// At most `max_keys` keys have a bucket at once: a new key beyond that is refused
    /// ([`KeyedError::TooManyKeys`]) unless a sweep can forget another. Without a cap, memory
    /// is bounded by forgetting alone, which buckets that can never be forgotten escape.
    ///
    /// [`KeyedError::TooManyKeys`]: super::KeyedError::TooManyKeys
    ///
    /// ```
    /// # use bucket4rs_local::{KeyedBucket, KeyedError}; use std::time::Duration;
    /// let limiter: KeyedBucket<u32> = KeyedBucket::builder()
    ///     .add_limit(|l| l.capacity(2).refill_greedy(1, Duration::from_secs(60)))
    ///     .max_keys(1)
    ///     .build()?;
    /// assert!(limiter.try_consume(&1, 1)?);
    /// assert_eq!(limiter.try_consume(&2, 1), Err(KeyedError::TooManyKeys { max: 1 }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The clock of every key's bucket (the default is [`FastClock`]). A clock that declares
    /// itself [monotonic](Clock::is_monotonic) lets one-greedy-bandwidth buckets run on the
    /// compact word.
    ///
    /// ```
    /// # use bucket4rs_local::{KeyedBucket, ManualClock}; use std::time::Duration;
    /// let clock = ManualClock::monotonic(0);
    /// let limiter: KeyedBucket<u8, ManualClock> = KeyedBucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .with_clock(clock.clone())
    ///     .build()?;
    /// assert!(limiter.try_consume(&0, 1)?);
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.try_consume(&0, 1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_clock<C2: Clock>(self, clock: C2) -> KeyedBucketBuilder<K, C2, L, S> {
        KeyedBucketBuilder {
            limits: self.limits,
            per_key: self.per_key,
            clock,
            listener: self.listener,
            hasher: self.hasher,
            max_keys: self.max_keys,
        }
    }

    /// The listener told about every key's operations.
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// use bucket4rs_local::BucketListener;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// #[derive(Default)]
    /// struct Rejections(AtomicU64);
    /// impl BucketListener for Rejections {
    ///     fn on_rejected(&self, tokens: u64) { self.0.fetch_add(tokens, Ordering::Relaxed); }
    /// }
    /// let limiter: KeyedBucket<u8, _, Rejections> = KeyedBucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(60)))
    ///     .with_listener(Rejections::default())
    ///     .build()?;
    /// limiter.try_consume(&1, 1)?;
    /// limiter.try_consume(&1, 1)?;
    /// assert_eq!(limiter.listener().0.load(Ordering::Relaxed), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_listener<L2: BucketListener>(
        self,
        listener: L2,
    ) -> KeyedBucketBuilder<K, C, L2, S> {
        KeyedBucketBuilder {
            limits: self.limits,
            per_key: self.per_key,
            clock: self.clock,
            listener,
            hasher: self.hasher,
            max_keys: self.max_keys,
        }
    }

    /// The map's hasher (the default, [`DefaultHasher`], is foldhash seeded per map).
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// let limiter: KeyedBucket<String, _, _, std::hash::RandomState> = KeyedBucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .with_hasher(std::hash::RandomState::new())
    ///     .build()?;
    /// assert!(limiter.try_consume("k", 1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_hasher<S2: BuildHasher + Clone>(
        self,
        hasher: S2,
    ) -> KeyedBucketBuilder<K, C, L, S2> {
        KeyedBucketBuilder {
            limits: self.limits,
            per_key: self.per_key,
            clock: self.clock,
            listener: self.listener,
            hasher,
            max_keys: self.max_keys,
        }
    }
}

impl<K: Hash + Eq, C: Clock, L: BucketListener, S: BuildHasher + Clone>
    KeyedBucketBuilder<K, C, L, S>
{
    /// Builds the keyed bucket.
    ///
    /// # Errors
    /// The first invalid limit's [`ConfigError`]; [`ConfigError::NoBandwidths`] without limits
    /// or a per-key configuration; a configuration that needs a wall clock the clock is not;
    /// [`ConfigError::ZeroMaxKeys`] for a key cap of zero (it would refuse every key).
    ///
    /// ```
    /// # use bucket4rs_local::{ConfigError, KeyedBucket};
    /// let none: Result<KeyedBucket<String>, _> = KeyedBucket::builder().build();
    /// assert_eq!(none.err(), Some(ConfigError::NoBandwidths));
    /// ```
    pub fn build(self) -> Result<KeyedBucket<K, C, L, S>, ConfigError> {
        if self.max_keys == Some(0) {
            return Err(ConfigError::ZeroMaxKeys);
        }
        let wall_clock = self.clock.is_wall_clock_based();
        // A bad limit fails the build even with a per-key configuration.
        let limits = self.limits.build();
        let source = match self.per_key {
            Some(f) => match limits {
                Err(e) if e != ConfigError::NoBandwidths => return Err(e),
                _ => Source::PerKey(f),
            },
            None => {
                let config = limits?;
                config.check_clock(wall_clock)?;
                Source::One(config)
            }
        };
        let monotonic = self.clock.is_monotonic();
        Ok(KeyedBucket::from_shared(Shared::new(
            Map::with_hasher(self.hasher),
            source,
            self.clock,
            self.listener,
            monotonic,
            wall_clock,
            self.max_keys,
        )))
    }
}
