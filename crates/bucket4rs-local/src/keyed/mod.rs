//! The keyed bucket: one bucket per key in a concurrent map — the per-key counterpart of
//! [`Bucket`](crate::Bucket), for a limit per API key, tenant or client address in one
//! process.
//!
//! # How it works
//!
//! The map is papaya's lock-free hash map from the key to a sixteen-byte [`Entry`]. A known
//! key is one guarded lookup that writes no shared memory, then its bucket: a bucket of one
//! greedy bandwidth on a monotonic clock (the default) is the lock-free bucket's compact word
//! (one load and at most one compare-and-swap, see `storage::word`), its configuration shared
//! by every key of that configuration through an interned plan; any other bucket is a locked
//! one of its own. A key without a bucket answers as a bucket created now; it is stored (its
//! key made owned, the entry inserted) only when the operation changes that state, or when
//! forgetting it would change a later answer.
//!
//! Memory is bounded by forgetting: a bucket is dropped only when a bucket created afresh from
//! the key's configuration would answer every later request exactly as the kept one
//! ([`BucketState::forgettable_at`]: a full greedy bucket whose initial tokens are its
//! capacity, for instance), and the map marks it gone in the same atomic step that judged it
//! (see `entry.rs`). Buckets that can never be forgotten (interval refill, initial tokens below
//! capacity, a replaced configuration) stay until removed, bounded by the optional key cap.
//!
//! When to look: the map is swept when it has doubled since the last sweep, and a bucket is
//! forgotten by such a sweep only if it was already forgettable at the previous one and has
//! been so for a second (a key that comes back between two sweeps, or within a second, keeps
//! its bucket, so a working set of light keys is not forgotten and re-stored over and over:
//! counting alone cannot tell such a working set, visited in turn, from a flood of new keys).
//! Memory stays bounded by the keys met within about a second, and by the key cap if set.
//! At the key cap, a new key makes
//! the map sweep for room, forgetting every bucket it can; when none can be, the sweep
//! remembers the earliest reading at which one could, and new keys before it are refused at
//! once, without looking. [`KeyedBucket::sweep`] forgets every forgettable bucket now.
//!
//! Structural changes of the map — sweeps, removals, replacing a key's entry — take one lock;
//! lookups and the operations on a bucket never do.

mod builder;
mod entry;
mod error;
mod plans;
#[cfg(test)]
mod tests;

use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::marker::PhantomData;
use std::borrow::Cow;
use std::sync::Arc;

use bucket4rs_core::ops::{self, Operation};
use bucket4rs_core::{
    Answer, BucketConfiguration, BucketListener, BucketState, Clock, ConsumptionProbe,
    EstimationProbe, OperationError, Plain, TokensInheritanceStrategy, Verbose, VerboseResult,
};

pub use builder::KeyedBucketBuilder;
use entry::{Entry, Recreated, Stop};
pub use error::KeyedError;
use plans::Plans;

use crate::bucket::BucketSnapshot;
use crate::clock::FastClock;
use crate::primitive::{AtomicI64, AtomicUsize, Map, Mutex, Ordering};
use bucket4rs_core::NoopListener;

/// The hasher of a keyed bucket's map by default: foldhash, seeded per map. Fast, and
/// minimally resistant to hash flooding; for keys an attacker chooses in a process whose
/// seed they might learn by timing, [`std::hash::RandomState`] (SipHash) is the cautious
/// choice ([`KeyedBucketBuilder::with_hasher`]).
pub type DefaultHasher = foldhash::fast::RandomState;

/// The least number of keys between two automatic sweeps.
const MIN_SWEEP_INTERVAL: usize = 1024;

/// How long a bucket stays forgettable before an automatic sweep forgets it: a second of the
/// bucket's clock. Counting alone cannot tell a flood of new keys from a working set visited
/// in turn that is larger than what the last sweep left (both only ever meet keys the map
/// does not hold); without this, the second chance spares exactly the keys just visited and
/// forgets the ones that come next, so every call stores its key again.
const FORGET_AFTER: i64 = 1_000_000_000;

/// A configuration chosen per key ([`KeyedBucketBuilder::configuration_per_key`]).
type PerKey<K> = Box<dyn Fn(&K) -> Option<BucketConfiguration> + Send + Sync>;

/// Where a key's configuration comes from when it has no bucket.
enum Source<K> {
    /// Every key the same.
    One(BucketConfiguration),
    /// Chosen per key on first use; `None`: the key is unknown.
    PerKey(PerKey<K>),
}

/// A form of a key of type `K` that a keyed bucket's methods take, as `HashMap::get` does:
/// `K` itself, or any type `K` borrows as (`str` for `String` keys). A lookup uses it as it
/// is; it becomes an owned `K` only when the key's bucket must be stored.
///
/// Sealed: implemented for every `Q` where `K: Borrow<Q>`, `Q: Hash + Eq + ToOwned` and
/// `Q::Owned: Into<K>`; the bound names those once.
///
/// ```
/// use bucket4rs_local::{KeyRef, KeyedBucket};
/// use std::time::Duration;
///
/// fn allowed<Q: KeyRef<String> + ?Sized>(limiter: &KeyedBucket<String>, key: &Q) -> bool {
///     limiter.try_consume(key, 1).unwrap_or(false)
/// }
/// let limiter: KeyedBucket<String> = KeyedBucket::builder()
///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(60)))
///     .build()?;
/// assert!(allowed(&limiter, "alice")); // a `&str`: no `String` made to look it up
/// assert!(!allowed(&limiter, &"alice".to_owned()));
/// # Ok::<(), bucket4rs_local::ConfigError>(())
/// ```
pub trait KeyRef<K>: Hash + sealed::Key<K> {}

impl<K, Q> KeyRef<K> for Q
where
    K: Borrow<Q>,
    Q: Hash + Eq + ToOwned + ?Sized,
    Q::Owned: Into<K>,
{
}

mod sealed {
    use core::borrow::Borrow;

    /// What the map does with a [`KeyRef`](super::KeyRef).
    pub trait Key<K> {
        /// Whether `key` is this one.
        fn is(&self, key: &K) -> bool;
        /// This key, owned.
        fn to_key(&self) -> K;
    }

    impl<K, Q> Key<K> for Q
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        #[inline]
        fn is(&self, key: &K) -> bool {
            key.borrow() == self
        }

        fn to_key(&self) -> K {
            self.to_owned().into()
        }
    }
}

impl<K, Q: KeyRef<K> + ?Sized> crate::primitive::Probe<K> for Q {
    #[inline]
    fn is(&self, key: &K) -> bool {
        sealed::Key::is(self, key)
    }
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
    map: Map<K, Entry, S>,
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
    /// The reading of the last sweep: an automatic sweep forgets only what was forgettable
    /// then already.
    swept_at: AtomicI64,
    /// The earliest reading at which the last sweep found that a kept bucket could be
    /// forgotten: at the cap, a new key before it is refused without a sweep.
    room_at: AtomicI64,
    /// Held by every structural change: sweeps, removals, replacing a key's entry.
    structure: Mutex<()>,
    /// Entries the sweeps have looked at (the tests count the work of the key cap).
    #[cfg(test)]
    visited: AtomicUsize,
}

impl<K, C, L, S> Shared<K, C, L, S> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        map: Map<K, Entry, S>,
        source: Source<K>,
        clock: C,
        listener: L,
        monotonic: bool,
        wall_clock: bool,
        max_keys: Option<usize>,
    ) -> Self {
        Self {
            map,
            plans: Plans::default(),
            source,
            clock,
            listener,
            monotonic,
            wall_clock,
            max_keys,
            len: AtomicUsize::new(0),
            next_sweep: AtomicUsize::new(MIN_SWEEP_INTERVAL),
            swept_at: AtomicI64::new(i64::MIN),
            room_at: AtomicI64::new(i64::MIN),
            structure: Mutex::new(()),
            #[cfg(test)]
            visited: AtomicUsize::new(0),
        }
    }
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
        Q: KeyRef<K> + ?Sized,
        O: Operation,
    {
        A::pick(
            op,
            // A closure does not inherit `inline(always)`: without it the plain path is a
            // call of its own on every operation.
            #[inline(always)]
            |op| {
                let now = self.shared.clock.now_nanos();
                let out = self.run_with(key, now, |e, plans| e.run(plans, &op, now))?;
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

    /// `run` on `key`'s entry: in place for a known key (the common case, inline: one guarded
    /// lookup, then the bucket), else on the slow paths.
    #[inline(always)]
    fn run_with<Q, T>(
        &self,
        key: &Q,
        now: i64,
        run: impl Fn(&Entry, &Plans) -> Result<T, Stop>,
    ) -> Result<T, KeyedError>
    where
        Q: KeyRef<K> + ?Sized,
    {
        let plans = &self.shared.plans;
        match self.shared.map.get(key, |e| e.map(|e| run(e, plans))) {
            Some(Ok(out)) => Ok(out),
            Some(Err(Stop::Invalid(e))) => Err(e.into()),
            found => self.run_slow(key, now, &run, found.is_none()),
        }
    }

    /// A key without a bucket, whose state must leave the compact word, or whose entry was
    /// just replaced or forgotten.
    #[cold]
    #[inline(never)]
    fn run_slow<Q, T>(
        &self,
        key: &Q,
        now: i64,
        run: &impl Fn(&Entry, &Plans) -> Result<T, Stop>,
        absent: bool,
    ) -> Result<T, KeyedError>
    where
        Q: KeyRef<K> + ?Sized,
    {
        let shared = &*self.shared;
        // The lookup that found no entry need not be repeated.
        if absent && let Some(out) = self.run_absent(key, now, run)? {
            return Ok(out);
        }
        loop {
            match shared.map.get(key, |e| e.map(|e| run(e, &shared.plans))) {
                Some(Ok(out)) => return Ok(out),
                Some(Err(Stop::Invalid(e))) => return Err(e.into()),
                Some(Err(Stop::Gone)) => self.settle(key),
                Some(Err(Stop::Upgrade)) => self.upgrade(key, now),
                None => {
                    if let Some(out) = self.run_absent(key, now, run)? {
                        return Ok(out);
                    }
                }
            }
        }
    }

    /// `run` for a key without a bucket: on a bucket created now, stored only if the operation
    /// changed it or it could not be forgotten. `None` when another thread stored the key's
    /// bucket first (then run on that one).
    fn run_absent<Q, T>(
        &self,
        key: &Q,
        now: i64,
        run: &impl Fn(&Entry, &Plans) -> Result<T, Stop>,
    ) -> Result<Option<T>, KeyedError>
    where
        Q: KeyRef<K> + ?Sized,
    {
        let shared = &*self.shared;
        let (owned, config) = self.source_for(key)?;
        let config = &*config;
        let fresh = BucketState::new(config, now);
        // Nobody else sees this entry until it is stored: the operation runs on it first.
        let mut entry = Entry::new(&shared.plans, config, fresh.clone(), now, shared.monotonic);
        let before = entry.word();
        let out = match run(&entry, &shared.plans) {
            Err(Stop::Upgrade) => {
                entry.upgrade_unshared(&shared.plans, now);
                run(&entry, &shared.plans).map_err(stop)?
            }
            other => other.map_err(stop)?,
        };
        let unchanged = match before {
            Some(w) => entry.word() == Some(w),
            None => entry
                .snapshot(&shared.plans, now)
                .is_some_and(|(_, s)| s == fresh),
        };
        // Left as a fresh bucket that could be forgotten: nothing to store.
        if unchanged && fresh.forgettable_at(config, now) == Some(now) {
            return Ok(Some(out));
        }
        if !self.count_key(now) {
            return Err(self.too_many());
        }
        // At the cap, when the stored bucket could be forgotten (compute it before the entry
        // moves into the map; only a capped map needs it).
        let forgettable = shared.max_keys.map(|_| {
            entry
                .snapshot(&shared.plans, now)
                .and_then(|(c, s)| s.forgettable_at(&c, now))
                .unwrap_or(i64::MAX)
        });
        let owned = owned.unwrap_or_else(|| key.to_key());
        if !shared.map.try_insert(owned, entry, |stored| stored.is_ok()) {
            shared.len.fetch_sub(1, Ordering::Relaxed);
            return Ok(None);
        }
        if let Some(at) = forgettable {
            self.stored(at);
        }
        if shared.len.load(Ordering::Relaxed) > shared.next_sweep.load(Ordering::Relaxed) {
            // Forgettable at the last sweep already, and for a second at least.
            let since = shared
                .swept_at
                .load(Ordering::Relaxed)
                .min(now.saturating_sub(FORGET_AFTER));
            shared.structure.try_with(|_| self.sweep_locked(now, since));
        }
        Ok(Some(out))
    }

    /// Waits for the structural change that made `key`'s entry gone to finish; a gone entry
    /// still in the map then goes.
    fn settle<Q: KeyRef<K> + ?Sized>(&self, key: &Q) {
        self.shared.structure.with(|_| {
            self.shared.map.remove_if(key, Entry::is_gone);
        });
    }

    /// Makes `key`'s compact entry a general one holding the same state (its next state does
    /// not fit the word).
    fn upgrade<Q: KeyRef<K> + ?Sized>(&self, key: &Q, now: i64) {
        let shared = &*self.shared;
        shared.structure.with(|_| {
            let frozen = shared.map.get(key, |e| match e {
                Some(e @ Entry::Compact { .. }) => e.freeze(&shared.plans, now),
                _ => None,
            });
            if let Some((config, state)) = frozen {
                shared
                    .map
                    .insert(key.to_key(), Entry::general(config, state));
            }
        });
    }

    /// The configuration a key without a bucket gets, with the owned key when finding it made
    /// one.
    fn source_for<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
    ) -> Result<(Option<K>, Cow<'_, BucketConfiguration>), KeyedError> {
        match &self.shared.source {
            // Borrowed: no count of the shared configuration moves per new key.
            Source::One(config) => Ok((None, Cow::Borrowed(config))),
            Source::PerKey(f) => {
                let owned = key.to_key();
                let config = f(&owned).ok_or(KeyedError::UnknownKey)?;
                config.check_clock(self.shared.wall_clock)?;
                Ok((Some(owned), Cow::Owned(config)))
            }
        }
    }

    /// Counts one more key, within the cap. At the cap, one sweep looks for room, unless the
    /// last one found none before a later reading.
    fn count_key(&self, now: i64) -> bool {
        let shared = &*self.shared;
        let Some(max) = shared.max_keys else {
            shared.len.fetch_add(1, Ordering::Relaxed);
            return true;
        };
        let take = || {
            shared
                .len
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok()
        };
        if take() {
            return true;
        }
        if now < shared.room_at.load(Ordering::Relaxed) {
            return false;
        }
        shared.structure.with(|_| {
            if shared.len.load(Ordering::Relaxed) >= max
                && now >= shared.room_at.load(Ordering::Relaxed)
            {
                self.sweep_locked(now, now);
            }
        });
        take()
    }

    /// Notes a bucket just stored (in the map already) that could be forgotten from reading
    /// `at` on: at the cap, new keys look for room from then on, not only from the reading
    /// the last sweep noted. Release, with the sweep's acquiring swap: a sweep that starts
    /// after this either sees the bucket or keeps `at`.
    fn stored(&self, at: i64) {
        self.shared.room_at.fetch_min(at, Ordering::Release);
    }

    fn too_many(&self) -> KeyedError {
        KeyedError::TooManyKeys {
            max: self.shared.max_keys.unwrap_or(usize::MAX),
        }
    }

    /// The configuration `key` would be recreated with, if any (for forgetting: a bucket is
    /// dropped only if it would be recreated from the same configuration).
    fn recreated(&self, key: &K) -> Recreated<'_> {
        match &self.shared.source {
            Source::One(config) => Recreated::With(config),
            Source::PerKey(f) => f(key).map_or(Recreated::Never, Recreated::Owned),
        }
    }

    /// Drops every bucket that a fresh one would replace exactly (see the type's docs),
    /// returning how many. The map also sweeps on its own (when it has doubled since the last
    /// sweep, then sparing buckets touched since that one, and at the key cap); call it from a
    /// timer to keep the map small between.
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
        let now = self.shared.clock.now_nanos();
        self.shared.structure.with(|_| self.sweep_locked(now, now))
    }

    /// Forgets every bucket that could be forgotten at `now` and already at `since` (the
    /// caller holds the structure lock); notes when the next could be.
    fn sweep_locked(&self, now: i64, since: i64) -> usize {
        let shared = &*self.shared;
        let (mut dropped, mut room) = (0, i64::MAX);
        // Until this sweep has looked, no room is known; a bucket stored meanwhile lowers the
        // reading again (`stored`), and this sweep's own finding is merged in at the end, so
        // neither overwrites the other.
        shared.room_at.swap(i64::MAX, Ordering::AcqRel);
        shared.map.retain(|key, entry| {
            #[cfg(test)]
            shared.visited.fetch_add(1, Ordering::Relaxed);
            match entry.forget(&shared.plans, now, since, &self.recreated(key)) {
                Ok(forgotten) => {
                    dropped += usize::from(forgotten);
                    false
                }
                Err(at) => {
                    room = room.min(at);
                    true
                }
            }
        });
        let left = shared.len.fetch_sub(dropped, Ordering::Relaxed) - dropped;
        shared.next_sweep.store(
            left.saturating_mul(2).max(MIN_SWEEP_INTERVAL),
            Ordering::Relaxed,
        );
        shared.swept_at.store(now, Ordering::Relaxed);
        shared.room_at.fetch_min(room, Ordering::Release);
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
    pub fn try_consume<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        tokens: u64,
    ) -> Result<A::Of<bool>, KeyedError> {
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
    pub fn try_consume_and_return_remaining<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        tokens: u64,
    ) -> Result<A::Of<ConsumptionProbe>, KeyedError> {
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
    pub fn estimate_ability_to_consume<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        tokens: u64,
    ) -> Result<A::Of<EstimationProbe>, KeyedError> {
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
    pub fn add_tokens<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        tokens: u64,
    ) -> Result<A::Of<()>, KeyedError> {
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
    pub fn force_add_tokens<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        tokens: u64,
    ) -> Result<A::Of<()>, KeyedError> {
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
    pub fn reset<Q: KeyRef<K> + ?Sized>(&self, key: &Q) -> Result<A::Of<()>, KeyedError> {
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
    pub fn available_tokens<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
    ) -> Result<A::Of<i64>, KeyedError> {
        self.execute(key, ops::AvailableTokens)
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
    pub fn replace_configuration<Q: KeyRef<K> + ?Sized>(
        &self,
        key: &Q,
        config: BucketConfiguration,
        strategy: TokensInheritanceStrategy,
    ) -> Result<(), KeyedError> {
        config.check_clock(self.shared.wall_clock)?;
        let shared = &*self.shared;
        let now = shared.clock.now_nanos();
        let wall = shared.wall_clock;
        let replace = |old: &BucketConfiguration, state: &BucketState| {
            let new = state.replace_configuration(old, &config, now, strategy, wall)?;
            Ok((config.clone(), new))
        };
        let (plans, monotonic) = (&shared.plans, shared.monotonic);
        loop {
            let replaced = shared.structure.with(|_| {
                let done = shared.map.get(key, |e| {
                    e.filter(|e| !e.is_gone())
                        .map(|e| e.replace(plans, now, monotonic, replace))
                })?;
                Some(done.map(|next| {
                    if let Some(next) = next {
                        shared.map.insert(key.to_key(), next);
                    }
                    // Its new configuration may let it go sooner than the last sweep noted:
                    // the next refusal at the cap looks again.
                    self.stored(now);
                }))
            });
            if let Some(done) = replaced {
                return Ok(done?);
            }
            // A key without a bucket: its bucket is created and replaced at once.
            let (owned, source) = self.source_for(key)?;
            let (new_config, state) = replace(&source, &BucketState::new(&source, now))?;
            if !self.count_key(now) {
                return Err(self.too_many());
            }
            let entry = Entry::new(plans, &new_config, state, now, monotonic);
            let owned = owned.unwrap_or_else(|| key.to_key());
            if shared.map.try_insert(owned, entry, |stored| stored.is_ok()) {
                self.stored(now);
                return Ok(());
            }
            shared.len.fetch_sub(1, Ordering::Relaxed);
        }
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
    pub fn snapshot<Q: KeyRef<K> + ?Sized>(&self, key: &Q) -> Option<BucketSnapshot> {
        let now = self.shared.clock.now_nanos();
        let plans = &self.shared.plans;
        let (config, state) = self
            .shared
            .map
            .get(key, |e| e.and_then(|e| e.snapshot(plans, now)))?;
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
    pub fn remove<Q: KeyRef<K> + ?Sized>(&self, key: &Q) -> bool {
        let shared = &*self.shared;
        shared.structure.with(|_| {
            let mut killed = false;
            shared.map.remove_if(key, |e| {
                killed |= e.kill();
                true
            });
            if killed {
                shared.len.fetch_sub(1, Ordering::Relaxed);
            }
            killed
        })
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

/// Maps an in-place stop on an entry nobody else sees to the keyed error.
fn stop(s: Stop) -> KeyedError {
    match s {
        Stop::Invalid(e) => KeyedError::Operation(e),
        // Only asked of a general entry, which neither needs an upgrade nor is ever gone.
        Stop::Upgrade | Stop::Gone => KeyedError::Operation(OperationError::StateMismatch),
    }
}
