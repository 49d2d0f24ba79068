//! # bucket4rs-local
//!
//! In-process token buckets built on the exact math of
//! [`bucket4rs-core`](bucket4rs_core), with the whole Bucket4j API and three synchronization
//! strategies as types:
//!
//! | strategy | type | share between threads? | best for |
//! |---|---|---|---|
//! | lock-free (default) | [`LockFreeBucket`] | yes (`Sync`) | most uses; rejections never write shared memory |
//! | synchronized | [`SynchronizedBucket`] | yes (`Sync`) | heavy contention: a parked loser leaves the winner's cache line hot |
//! | none | [`UnsyncBucket`] | no (`!Sync`: sharing does not compile) | one thread, e.g. per-connection state |
//!
//! ```
//! use bucket4rs_local::Bucket;
//! use std::time::Duration;
//!
//! let bucket = Bucket::builder()
//!     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1))) // 10/s, bursts of 10
//!     .add_limit(|l| l.capacity(1_000).refill_greedy(1_000, Duration::from_secs(3600))) // 1000/h
//!     .build()?;
//! assert!(bucket.try_consume(1)?);
//! let probe = bucket.try_consume_and_return_remaining(10)?;
//! assert!(!probe.is_consumed()); // only 9 left in the burst limit
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Every strategy runs the same pure operations (`bucket4rs_core::ops`), so all of them replay
//! the Bucket4j conformance traces identically. The default clock is [`FastClock`]
//! (epoch-anchored, TSC-advanced nanoseconds); see its docs for why.
//!
//! A lock-free bucket with one greedy limit on a monotonic clock (the default) keeps its whole
//! exact state in one 64-bit word — governor's cost: one load and at most one compare-and-swap
//! (see [`LockFree`]); other one-limit buckets use one 128-bit word, several limits immutable
//! snapshots published by one compare-and-swap.
//!
//! # Crate features
//! - `serde`: `Serialize`/`Deserialize` for [`BucketSnapshot`] and [`SynchronizationStrategy`].
#![forbid(unsafe_code)]

mod bucket;
mod builder;
mod clock;
mod keyed;
mod primitive;
mod storage;

pub use bucket::{
    Bucket, BucketSnapshot, LockFreeBucket, SynchronizedBucket, UnsyncBucket, VerboseBucket,
};
pub use builder::BucketBuilder;
pub use clock::FastClock;
pub use keyed::{DefaultHasher, KeyRef, KeyedBucket, KeyedBucketBuilder, KeyedError};
pub use storage::{
    AnyStorage, LockFree, NewStorage, Storage, SynchronizationStrategy, Synchronized,
    UnknownStrategy, Unsynchronized,
};

pub use bucket4rs_core::{Answer, Plain, Verbose};
pub use bucket4rs_core::{
    Bandwidth, BandwidthBuilder, BucketConfiguration, BucketListener, BucketState, Clock,
    ConfigError, ConsumptionProbe, EstimationProbe, ManualClock, MonotonicClock, NoopListener,
    OperationError, RefillKind, StateError, SystemMillisClock, SystemNanosClock,
    TokensInheritanceStrategy, VerboseResult,
};

/// The keyed bucket as a store of configurations and states its callers bring, outside semver.
// Hidden: only bucket4rs-distributed's embedded backend uses it, and #30 deletes it with that
// backend's rewrite as a plain store.
#[doc(hidden)]
pub mod __private {
    use core::borrow::Borrow;
    use core::hash::{BuildHasher, Hash};

    use bucket4rs_core::{BucketConfiguration, BucketListener, BucketState, Clock, ConfigError};

    pub use crate::keyed::Update;

    use crate::keyed::{KeyedBucket, KeyedError};

    /// A keyed bucket whose keys' configurations come with [`update`] (none of its own): its
    /// buckets are synchronized ones of their own configuration, never the compact word (the
    /// callers may run on another clock than `clock`, which only decides when a bucket is
    /// forgotten), and a bucket is forgotten when one recreated from its own configuration
    /// would answer the same.
    ///
    /// # Errors
    /// [`ConfigError::ZeroMaxKeys`].
    pub fn record_store<K: Hash + Eq, C: Clock>(
        clock: C,
        max_keys: Option<usize>,
    ) -> Result<KeyedBucket<K, C>, ConfigError> {
        KeyedBucket::stored(clock, max_keys)
    }

    /// Runs `f` on `key`'s configuration and state (`None`: no bucket) at the store's
    /// reading, with exclusive access to the key, and stores what it answers.
    ///
    /// # Errors
    /// [`KeyedError::TooManyKeys`] when a new key does not fit.
    pub fn update<K, C, L, S, Q, T>(
        keyed: &KeyedBucket<K, C, L, S>,
        key: &Q,
        f: impl FnOnce(Option<(&BucketConfiguration, &BucketState)>, i64) -> (T, Update),
    ) -> Result<T, KeyedError>
    where
        K: Hash + Eq + Borrow<Q>,
        C: Clock,
        L: BucketListener,
        S: BuildHasher + Clone,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        keyed.update(key, f)
    }
}
