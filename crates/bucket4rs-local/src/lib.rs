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
