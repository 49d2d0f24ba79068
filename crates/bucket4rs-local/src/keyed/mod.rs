//! The keyed bucket: one bucket per key in a concurrent map — the per-key counterpart of
//! [`Bucket`](crate::Bucket), for a limit per API key, tenant or client address in one
//! process.
//!
//! # How it works
//!
//! The map is a sharded `DashMap` from the key to a sixteen-byte [`Entry`]. A known key is one
//! lookup under its shard's read lock: a bucket of one greedy bandwidth on a monotonic clock
//! (the default) is the lock-free bucket's compact word (one load and at most one
//! compare-and-swap, see `storage::word`), its configuration shared by every key of that
//! configuration through an interned plan; any other bucket is a synchronized one of its own.
//! A key without a bucket answers as a bucket created now; it is stored only when the operation
//! changes that state, or when forgetting it would change a later answer.
//!
//! Memory is bounded by forgetting: a bucket is dropped only when a bucket created afresh from
//! the key's configuration would answer every later request exactly as the kept one
//! ([`BucketState::forgettable_at`]: a full greedy bucket whose initial tokens are its
//! capacity, for instance). Buckets that can never be forgotten (interval refill, initial
//! tokens below capacity, a replaced configuration) stay until removed, bounded by the
//! optional key cap. Forgettable buckets are swept when the map has doubled since the last
//! sweep, when the cap is reached, and on [`KeyedBucket::sweep`].

mod builder;
mod entry;
mod error;
mod plans;

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::marker::PhantomData;
use core::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bucket4rs_core::ops::{self, Operation};
use bucket4rs_core::{
    Answer, BucketConfiguration, BucketListener, BucketState, Clock, ConsumptionProbe,
    EstimationProbe, OperationError, Plain, TokensInheritanceStrategy, Verbose, VerboseResult,
};
use dashmap::DashMap;
use dashmap::mapref::entry::Entry as MapEntry;

pub use builder::KeyedBucketBuilder;
use entry::{Entry, Recreated, Stop};
pub use error::KeyedError;
use plans::Plans;

use crate::bucket::BucketSnapshot;
use crate::clock::FastClock;
use crate::storage::Synchronized;
use crate::storage::sealed::New;
use bucket4rs_core::NoopListener;

/// The hasher of a keyed bucket's map by default: foldhash, seeded per map. Fast, and
/// minimally resistant to hash flooding; for keys an attacker chooses in a process whose
/// seed they might learn by timing, [`std::hash::RandomState`] (SipHash) is the cautious
/// choice ([`KeyedBucketBuilder::with_hasher`]).
pub type DefaultHasher = foldhash::fast::RandomState;

/// The least number of keys between two automatic sweeps.
const MIN_SWEEP_INTERVAL: usize = 1024;

/// A configuration chosen per key ([`KeyedBucketBuilder::configuration_per_key`]).
type PerKey<K> = Box<dyn Fn(&K) -> Option<BucketConfiguration> + Send + Sync>;

/// Where a key's configuration comes from when it has no bucket.
enum Source<K> {
    /// Every key the same.
    One(BucketConfiguration),
    /// Chosen per key on first use; `None`: the key is unknown.
    PerKey(PerKey<K>),
    /// Stored by the callers of [`update`](KeyedBucket::update), who bring a key's
    /// configuration each time (the distributed crate's embedded backend): a key is
    /// recreated from its own configuration.
    Stored,
}

/// What the keyed bucket's update of a key does with its bucket.
// Hidden: part of `__private` (the embedded backend's store mode), which #30 deletes.
#[doc(hidden)]
#[derive(Debug)]
pub enum Update {
    /// Leave it as it is (or absent).
    Keep,
    /// Store this configuration and state.
    Put(BucketConfiguration, BucketState),
}

/// One token bucket per key, all in one concurrent map: the per-key counterpart of
/// [`Bucket`](crate::Bucket) (what governor's keyed `RateLimiter` is to its direct one, and
/// what Bucket4j users build from a Caffeine map of buckets).
///
/// Every bucket operation takes the key: [`try_consume`](Self::try_consume), the probes,
/// estimates, additions, [`reset`](Self::reset), [`available_tokens`](Self::available_tokens),
/// [`replace_configuration`](Self::replace_configuration), the verbose forms through
/// [`as_verbose`](Self::as_verbose), and any other core operation through
/// [`execute`](Self::execute) (`ops::Reserve`, `ops::ConsumeIgnoringRateLimits`, ...). Lookups borrow: a `KeyedBucket<String>` takes `&str`. The
/// configuration is one for all keys, or chosen per key when it is first used
/// ([`KeyedBucketBuilder::configuration_per_key`]). Buckets run the same exact core math as a
/// [`Bucket`](crate::Bucket), on the lock-free compact word where it applies; memory stays
/// bounded by dropping buckets that a fresh one would replace exactly, plus an optional key
/// cap ([`KeyedBucketBuilder::max_keys`]). Listeners see every key's operations. `A` is how it
/// answers, as for [`Bucket`](crate::Bucket): [`Plain`] values, or on the view
/// [`as_verbose`](KeyedBucket::as_verbose) gives, [`Verbose`] results.
///
/// ```
/// use bucket4rs_local::KeyedBucket;
/// use std::time::Duration;
///
/// let per_client: KeyedBucket<String> = KeyedBucket::builder()
///     .add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(1)))
///     .build()?;
/// assert!(per_client.try_consume("alice", 2)?);
/// assert!(!per_client.try_consume("alice", 1)?); // alice is out of tokens
/// assert!(per_client.try_consume("bob", 1)?); // bob has a bucket of his own
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedBucket<K, C = FastClock, L = NoopListener, S = DefaultHasher, A = Plain> {
    shared: Arc<Shared<K, C, L, S>>,
    answer: PhantomData<fn() -> A>,
}

/// What a keyed bucket and its verbose view share.
struct Shared<K, C, L, S> {
    map: DashMap<K, Entry, S>,
    plans: Plans,
    source: Source<K>,
    clock: C,
    listener: L,
    monotonic: bool,
    wall_clock: bool,
    max_keys: Option<usize>,
    /// Entries in the map (kept beside it: the cap is checked on every insertion).
    len: AtomicUsize,
    /// The size at which the next automatic sweep runs.
    next_sweep: AtomicUsize,
}

impl<K, C, L, S> KeyedBucket<K, C, L, S> {
    fn from_shared(shared: Shared<K, C, L, S>) -> Self {
        Self {
            shared: Arc::new(shared),
            answer: PhantomData,
        }
    }
}

impl<K, C: fmt::Debug, L, S, A> fmt::Debug for KeyedBucket<K, C, L, S, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBucket")
            .field("keys", &self.shared.len.load(Ordering::Relaxed))
            .field("max_keys", &self.shared.max_keys)
            .field("clock", &self.shared.clock)
            .finish_non_exhaustive()
    }
}

impl KeyedBucket<()> {
    /// Starts a builder: limits as for a [`Bucket`](crate::Bucket), then the key type at
    /// [`build`](KeyedBucketBuilder::build).
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// let limiter: KeyedBucket<u32> = KeyedBucket::builder()
    ///     .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1)))
    ///     .max_keys(10_000)
    ///     .build()?;
    /// assert!(limiter.try_consume(&42, 5)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder<K>() -> KeyedBucketBuilder<K> {
        KeyedBucketBuilder::new()
    }
}

impl<K, C, L, S, A> KeyedBucket<K, C, L, S, A>
where
    K: Hash + Eq,
    C: Clock,
    L: BucketListener,
    S: BuildHasher + Clone,
    A: Answer,
{
    /// Runs any core [`Operation`] on `key`'s bucket (the typed methods are shorthands),
    /// notifying the listener once the change is committed.
    ///
    /// # Errors
    /// The operation's [`OperationError`], or for a key without a bucket
    /// [`KeyedError::TooManyKeys`], [`KeyedError::UnknownKey`] or
    /// [`KeyedError::Configuration`].
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert_eq!(limiter.execute("k", bucket4rs_core::ops::AvailableTokens)?, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn execute<Q, O>(&self, key: &Q, op: O) -> Result<A::Of<O::Output>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
        O: Operation,
    {
        A::pick(
            op,
            // A closure does not inherit `inline(always)`: without it the plain path is a
            // call of its own on every operation.
            #[inline(always)]
            |op| {
                let now = self.shared.clock.now_nanos();
                let out = self.run(key, &op, now)?;
                // Committed: a panicking listener cannot corrupt the bucket.
                op.notify(&out, &self.shared.listener);
                Ok(out)
            },
            |op| {
                let now = self.shared.clock.now_nanos();
                let op = ops::Verbose(op);
                let ((value, state), config) =
                    self.run_with(key, now, |e, plans| e.run_with_config(plans, &op, now))?;
                op.0.notify(&value, &self.shared.listener);
                Ok(VerboseResult::new(value, config, state, now))
            },
        )
    }

    /// `op` on `key`'s bucket at `now`: in place for a known key, else the slow paths.
    #[inline(always)]
    fn run<Q, O>(&self, key: &Q, op: &O, now: i64) -> Result<O::Output, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
        O: Operation,
    {
        self.run_with(key, now, |e, plans| e.run(plans, op, now))
    }

    /// `run` on `key`'s entry: under the shard's read lock for a known key (the common case,
    /// inline), else on the slow paths.
    #[inline(always)]
    fn run_with<Q, T>(
        &self,
        key: &Q,
        now: i64,
        run: impl Fn(&Entry, &Plans) -> Result<T, Stop>,
    ) -> Result<T, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        if let Some(entry) = self.shared.map.get(key) {
            match run(&entry, &self.shared.plans) {
                Ok(out) => return Ok(out),
                Err(Stop::Invalid(e)) => return Err(e.into()),
                Err(Stop::Upgrade) => {}
            }
        }
        self.run_slow(key, now, &run)
    }

    /// A key without a bucket, or whose state must leave the compact word: under the
    /// shard's exclusive lock.
    #[cold]
    #[inline(never)]
    fn run_slow<Q, T>(
        &self,
        key: &Q,
        now: i64,
        run: &impl Fn(&Entry, &Plans) -> Result<T, Stop>,
    ) -> Result<T, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        if let Some(mut entry) = self.shared.map.get_mut(key) {
            return exclusive(&mut entry, &self.shared.plans, now, run);
        }
        let owned: K = key.to_owned().into();
        let config = self.configuration_for(&owned)?;
        let fresh = BucketState::new(&config, now);
        // First on a bucket created now and not stored: an invalid request stores nothing,
        // and a request that leaves a forgettable fresh bucket as it was needs no bucket.
        let probe = Entry::General(Box::new(Synchronized::new(
            config.clone(),
            fresh.clone(),
            false,
        )));
        let out = run(&probe, &self.shared.plans).map_err(stop)?;
        let unchanged = probe
            .snapshot(&self.shared.plans, now)
            .is_some_and(|(_, s)| s == fresh);
        if unchanged && fresh.forgettable_at(&config, now) == Some(now) {
            return Ok(out);
        }
        self.insert(owned, &config, fresh, now, |entry, _| {
            exclusive(entry, &self.shared.plans, now, run)
        })
    }

    /// Stores a bucket of `config` in `state` for `key` at `now`, then runs `f` on the stored
    /// entry with exclusive access (`true`: it was just stored; `false`: another thread
    /// stored one first, and `f` runs on that one).
    fn insert<T>(
        &self,
        mut key: K,
        config: &BucketConfiguration,
        state: BucketState,
        now: i64,
        f: impl FnOnce(&mut Entry, bool) -> Result<T, KeyedError>,
    ) -> Result<T, KeyedError> {
        let mut state = Some(state);
        let mut swept = false;
        loop {
            match self.shared.map.entry(key) {
                MapEntry::Occupied(mut o) => return f(o.get_mut(), false),
                MapEntry::Vacant(v) => {
                    if !self.count_key() {
                        if swept {
                            return Err(KeyedError::TooManyKeys {
                                max: self.shared.max_keys.unwrap_or(usize::MAX),
                            });
                        }
                        // Sweeping takes every shard's lock: let go of this one first.
                        key = v.into_key();
                        self.sweep_at(now);
                        swept = true;
                        continue;
                    }
                    let state = state
                        .take()
                        .unwrap_or_else(|| BucketState::new(config, now));
                    let entry = Entry::new(
                        &self.shared.plans,
                        config,
                        state,
                        now,
                        self.shared.monotonic,
                    );
                    let mut stored = v.insert(entry);
                    let result = f(&mut stored, true);
                    drop(stored);
                    let grown = self.shared.len.load(Ordering::Relaxed);
                    if grown > self.shared.next_sweep.load(Ordering::Relaxed) {
                        self.sweep_at(now);
                    }
                    return result;
                }
            }
        }
    }

    /// Counts one more key, within the cap.
    fn count_key(&self) -> bool {
        match self.shared.max_keys {
            None => {
                self.shared.len.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(max) => self
                .shared
                .len
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok(),
        }
    }

    /// The configuration a key without a bucket gets.
    fn configuration_for(&self, key: &K) -> Result<BucketConfiguration, KeyedError> {
        let config = match &self.shared.source {
            Source::One(config) => return Ok(config.clone()),
            Source::PerKey(f) => f(key).ok_or(KeyedError::UnknownKey)?,
            Source::Stored => return Err(KeyedError::UnknownKey),
        };
        config.check_clock(self.shared.wall_clock)?;
        Ok(config)
    }

    /// The configuration a key would get now, if any (for forgetting: a bucket is dropped only
    /// if it would be recreated from the same configuration).
    fn source_of(&self, key: &K) -> Recreated {
        match &self.shared.source {
            Source::One(config) => Recreated::With(config.clone()),
            Source::PerKey(f) => f(key).map_or(Recreated::Never, Recreated::With),
            Source::Stored => Recreated::Same,
        }
    }

    /// Drops every bucket that a fresh one would replace exactly (see the type's docs),
    /// returning how many. Runs on its own when the map has doubled since the last sweep and
    /// when the key cap is reached; call it from a timer to keep the map small between.
    ///
    /// ```
    /// # use bucket4rs_local::{KeyedBucket, ManualClock}; use std::time::Duration;
    /// let clock = ManualClock::monotonic(0);
    /// let limiter: KeyedBucket<u32, ManualClock> = KeyedBucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .with_clock(clock.clone())
    ///     .build()?;
    /// limiter.try_consume(&1, 5)?;
    /// assert_eq!(limiter.sweep(), 0); // half empty: a fresh bucket would differ
    /// clock.advance(Duration::from_millis(500));
    /// assert_eq!(limiter.sweep(), 1); // full again: a fresh bucket is the same
    /// assert!(limiter.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sweep(&self) -> usize {
        self.sweep_at(self.shared.clock.now_nanos())
    }

    fn sweep_at(&self, now: i64) -> usize {
        let mut dropped = 0;
        self.shared.map.retain(|key, entry| {
            let keep = !entry.forgettable(&self.shared.plans, now, &self.source_of(key));
            dropped += usize::from(!keep);
            keep
        });
        let left = self.shared.len.fetch_sub(dropped, Ordering::Relaxed) - dropped;
        self.shared.next_sweep.store(
            left.saturating_mul(2).max(MIN_SWEEP_INTERVAL),
            Ordering::Relaxed,
        );
        dropped
    }

    /// Tries to consume `tokens` from `key`'s bucket: `true` if they were consumed.
    ///
    /// # Errors
    /// [`KeyedError::Operation`] for zero tokens; for a key without a bucket, the errors of
    /// [`execute`](Self::execute).
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert!(limiter.try_consume("k", 5)?);
    /// assert!(!limiter.try_consume("k", 1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_consume<Q>(&self, key: &Q, tokens: u64) -> Result<A::Of<bool>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::TryConsume(tokens))
    }

    /// Like [`try_consume`](Self::try_consume), answering a probe with the tokens left and,
    /// when refused, the wait until the request could succeed.
    ///
    /// # Errors
    /// As [`try_consume`](Self::try_consume).
    ///
    /// ```
    /// # use bucket4rs_local::{KeyedBucket, ManualClock}; use std::time::Duration;
    /// let limiter: KeyedBucket<String, ManualClock> = KeyedBucket::builder()
    ///     .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1)))
    ///     .with_clock(ManualClock::monotonic(0))
    ///     .build()?;
    /// limiter.try_consume("k", 5)?;
    /// let probe = limiter.try_consume_and_return_remaining("k", 1)?;
    /// assert_eq!(probe.wait_for_refill(), Duration::from_millis(200));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_and_return_remaining<Q>(
        &self,
        key: &Q,
        tokens: u64,
    ) -> Result<A::Of<ConsumptionProbe>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::TryConsumeAndReturnRemaining(tokens))
    }

    /// Whether `tokens` could be consumed from `key`'s bucket now, and the wait if not;
    /// consumes nothing.
    ///
    /// # Errors
    /// As [`try_consume`](Self::try_consume).
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert!(limiter.estimate_ability_to_consume("k", 5)?.can_be_consumed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn estimate_ability_to_consume<Q>(
        &self,
        key: &Q,
        tokens: u64,
    ) -> Result<A::Of<EstimationProbe>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::EstimateAbilityToConsume(tokens))
    }

    /// Adds `tokens` to `key`'s bucket, never above capacity.
    ///
    /// # Errors
    /// As [`try_consume`](Self::try_consume).
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// limiter.try_consume("k", 5)?;
    /// limiter.add_tokens("k", 2)?;
    /// assert_eq!(limiter.available_tokens("k")?, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_tokens<Q>(&self, key: &Q, tokens: u64) -> Result<A::Of<()>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::AddTokens(tokens))
    }

    /// Adds `tokens` to `key`'s bucket, beyond capacity if need be.
    ///
    /// # Errors
    /// As [`try_consume`](Self::try_consume).
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// limiter.force_add_tokens("k", 10)?;
    /// assert_eq!(limiter.available_tokens("k")?, 15);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn force_add_tokens<Q>(&self, key: &Q, tokens: u64) -> Result<A::Of<()>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::ForceAddTokens(tokens))
    }

    /// Fills `key`'s bucket to capacity.
    ///
    /// # Errors
    /// For a key without a bucket, the errors of [`execute`](Self::execute).
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// limiter.try_consume("k", 5)?;
    /// limiter.reset("k")?;
    /// assert_eq!(limiter.available_tokens("k")?, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> Result<A::Of<()>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::Reset)
    }

    /// The tokens `key`'s bucket has now (negative while in debt).
    ///
    /// # Errors
    /// For a key without a bucket, the errors of [`execute`](Self::execute).
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert_eq!(limiter.available_tokens("new key")?, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available_tokens<Q>(&self, key: &Q) -> Result<A::Of<i64>, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.execute(key, ops::AvailableTokens)
    }

    /// Runs `f` on `key`'s configuration and state (`None`: no bucket), at the reading it is
    /// given, with exclusive access to the key, and stores what it answers. For the callers
    /// that keep a configuration per key themselves (see `Source::Stored`).
    pub(crate) fn update<Q, T>(
        &self,
        key: &Q,
        f: impl FnOnce(Option<(&BucketConfiguration, &BucketState)>, i64) -> (T, Update),
    ) -> Result<T, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let now = self.shared.clock.now_nanos();
        let (plans, monotonic) = (&self.shared.plans, self.shared.monotonic);
        // Room is made before the key's shard is locked (a sweep locks every shard).
        if self.shared.max_keys.is_some_and(|max| self.len() >= max) {
            self.sweep_at(now);
        }
        let owned: K = key.to_owned().into();
        let out = match self.shared.map.entry(owned) {
            MapEntry::Occupied(mut o) => {
                let Some((config, state)) = o.get().snapshot(plans, now) else {
                    return Err(KeyedError::UnknownKey);
                };
                let (out, update) = f(Some((&config, &state)), now);
                if let Update::Put(config, state) = update {
                    *o.get_mut() = Entry::new(plans, &config, state, now, monotonic);
                }
                return Ok(out);
            }
            MapEntry::Vacant(v) => {
                let (out, update) = f(None, now);
                if let Update::Put(config, state) = update {
                    if !self.count_key() {
                        return Err(KeyedError::TooManyKeys {
                            max: self.shared.max_keys.unwrap_or(usize::MAX),
                        });
                    }
                    v.insert(Entry::new(plans, &config, state, now, monotonic));
                }
                out
            }
        };
        if self.len() > self.shared.next_sweep.load(Ordering::Relaxed) {
            self.sweep_at(now);
        }
        Ok(out)
    }
}

impl<K, C, L, S> KeyedBucket<K, C, L, S>
where
    K: Hash + Eq,
    C: Clock,
    L: BucketListener,
    S: BuildHasher + Clone,
{
    /// Replaces `key`'s configuration, carrying its tokens over by `strategy` (a key without a
    /// bucket gets one, from its configuration, first). A bucket with a replaced configuration
    /// is only forgotten once the key's configuration source answers that configuration again.
    ///
    /// # Errors
    /// [`KeyedError::Configuration`] when `config` needs a wall clock the bucket does not have;
    /// for a key without a bucket, the errors of [`execute`](Self::execute).
    ///
    /// ```
    /// # use bucket4rs_local::{KeyedBucket, TokensInheritanceStrategy, BucketConfiguration, Bandwidth};
    /// # use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// let pro = BucketConfiguration::builder()
    ///     .add_bandwidth(Bandwidth::simple(50, Duration::from_secs(1))?)
    ///     .build()?;
    /// limiter.replace_configuration("k", pro, TokensInheritanceStrategy::Reset)?;
    /// assert_eq!(limiter.available_tokens("k")?, 50);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replace_configuration<Q>(
        &self,
        key: &Q,
        config: BucketConfiguration,
        strategy: TokensInheritanceStrategy,
    ) -> Result<(), KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        config.check_clock(self.shared.wall_clock)?;
        let now = self.shared.clock.now_nanos();
        let wall = self.shared.wall_clock;
        let replace = |old: &BucketConfiguration, state: &BucketState| {
            let new = state.replace_configuration(old, &config, now, strategy, wall)?;
            Ok((config.clone(), new))
        };
        let (plans, monotonic) = (&self.shared.plans, self.shared.monotonic);
        if let Some(mut entry) = self.shared.map.get_mut(key) {
            return Ok(entry.replace(plans, now, monotonic, replace)?);
        }
        // A key without a bucket: its bucket is created and replaced at once.
        let owned: K = key.to_owned().into();
        let source = self.configuration_for(&owned)?;
        let (new_config, state) = replace(&source, &BucketState::new(&source, now))?;
        self.insert(owned, &new_config, state, now, |entry, stored| {
            if stored {
                Ok(())
            } else {
                Ok(entry.replace(plans, now, monotonic, replace)?)
            }
        })
    }

    /// `key`'s configuration and state (refilled to now where the bucket keeps no last refill
    /// time), or `None` if the key has no bucket (it would answer as a fresh one).
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert!(limiter.snapshot("k").is_none());
    /// limiter.try_consume("k", 2)?;
    /// assert_eq!(limiter.snapshot("k").expect("stored").state().bandwidths()[0].tokens(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn snapshot<Q>(&self, key: &Q) -> Option<BucketSnapshot>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.shared.clock.now_nanos();
        let entry = self.shared.map.get(key)?;
        let (config, state) = entry.snapshot(&self.shared.plans, now)?;
        Some(BucketSnapshot::new(config, state))
    }

    /// Drops `key`'s bucket: the key starts afresh. `true` if it had one.
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// limiter.try_consume("k", 5)?;
    /// assert!(limiter.remove("k"));
    /// assert_eq!(limiter.available_tokens("k")?, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let removed = self.shared.map.remove(key).is_some();
        if removed {
            self.shared.len.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// The verbose view: the same operations, each answering a [`VerboseResult`] with the
    /// key's configuration, the state the operation left and its reading.
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// let r = limiter.as_verbose().try_consume("k", 2)?;
    /// assert_eq!((*r.value(), r.available_tokens()), (true, 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_verbose(&self) -> KeyedBucket<K, C, L, S, Verbose> {
        KeyedBucket {
            shared: Arc::clone(&self.shared),
            answer: PhantomData,
        }
    }
}

impl<K, C, L, S, A> KeyedBucket<K, C, L, S, A> {
    /// How many keys have a bucket.
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// limiter.try_consume("a", 1)?;
    /// limiter.try_consume("b", 1)?;
    /// assert_eq!(limiter.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        self.shared.len.load(Ordering::Relaxed)
    }

    /// Whether no key has a bucket.
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// assert!(limiter.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The clock.
    ///
    /// ```
    /// # use bucket4rs_local::{KeyedBucket, ManualClock}; use std::time::Duration;
    /// let limiter: KeyedBucket<String, ManualClock> = KeyedBucket::builder()
    ///     .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1)))
    ///     .with_clock(ManualClock::new(7))
    ///     .build()?;
    /// assert_eq!(bucket4rs_local::Clock::now_nanos(limiter.clock()), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.shared.clock
    }

    /// The listener.
    ///
    /// ```
    /// # use bucket4rs_local::KeyedBucket; use std::time::Duration;
    /// # let limiter: KeyedBucket<String> = KeyedBucket::builder().add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1))).build()?;
    /// let _: &bucket4rs_local::NoopListener = limiter.listener();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn listener(&self) -> &L {
        &self.shared.listener
    }
}

/// `run` on an entry the caller holds exclusively: a compact entry whose new state does not
/// fit its word becomes a synchronized bucket first.
fn exclusive<T>(
    entry: &mut Entry,
    plans: &Plans,
    now: i64,
    run: &impl Fn(&Entry, &Plans) -> Result<T, Stop>,
) -> Result<T, KeyedError> {
    match run(entry, plans) {
        Err(Stop::Upgrade) => {
            entry.upgrade(plans, now);
            run(entry, plans).map_err(stop)
        }
        other => other.map_err(stop),
    }
}

/// Maps an in-place stop that is not an upgrade to the keyed error.
fn stop(s: Stop) -> KeyedError {
    match s {
        Stop::Invalid(e) => KeyedError::Operation(e),
        // Only asked after an upgrade, which a general entry never needs.
        Stop::Upgrade => KeyedError::Operation(OperationError::StateMismatch),
    }
}

#[cfg(all(test, not(bucket4rs_loom)))]
mod tests {
    #[test]
    fn an_entry_is_sixteen_bytes() {
        // A key's whole bucket beside its key in the map: the memory figure per key rests on it.
        assert_eq!(core::mem::size_of::<super::Entry>(), 16);
    }
}
