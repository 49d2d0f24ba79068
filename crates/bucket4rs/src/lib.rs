#![doc = include_str!("../README.md")]
//!
//! # Choosing a strategy
//!
//! | you have | use | why |
//! |---|---|---|
//! | a bucket shared by threads (the usual case) | [`LockFreeBucket`] (`build()`) | never blocks; rejections and probes never write shared memory; no allocation per call |
//! | a bucket hammered by many threads at once | [`SynchronizedBucket`] (`build_synchronized()`) | the losing thread parks instead of retrying, so the winner's cache line stays hot |
//! | a bucket used by one thread only | [`UnsyncBucket`] (`build_unsynchronized()`) | cheapest; `!Sync`, so sharing it is a compile error |
//! | a strategy read from a configuration file | `build_with(strategy)` | a two-way `match`, still no dynamic dispatch |
//! | one limit per key shared by many processes | [`distributed`] (`redis`/`postgres` features) | exact, atomic, one round trip per operation |
//! | one limit per key inside one process | [`distributed::EmbeddedBackend`] | bounded memory: idle keys are dropped once full again |
//!
//! `cargo xtask bench` measures the strategies against each other and against governor on your
//! machine (see `docs/benchmarks.md` in the repository).
//!
//! # Crate features
//!
//! | feature | default | adds |
//! |---|---|---|
//! | `local` | yes | in-process buckets ([`Bucket`], the three strategies, [`FastClock`]) |
//! | `serde` | | `Serialize`/`Deserialize` for configurations, states and [`BucketSnapshot`] |
//! | `blocking` | | [`blocking`]: wait for tokens on a thread, cancellable |
//! | `async` | | [`asynchronous`]: wait for tokens in async code, cancellation-safe |
//! | `tokio` | | the tokio sleeper and clock for [`asynchronous`] |
//! | `listeners` | | [`listeners`]: counters and composition |
//! | `metrics` | | a listener reporting through the `metrics` facade |
//! | `tracing` | | a listener emitting `tracing` events |
//! | `distributed` | | [`distributed`]: proxy manager, backend trait, embedded backend |
//! | `redis` | | the Redis backend |
//! | `postgres` | | the PostgreSQL backend |
//! | `full` | | all of the above |
//!
//! Features are additive. The pure core ([`core`]) is always there and is `no_std`-capable on
//! its own (depend on `bucket4rs-core` with `default-features = false`).
//!
//! # Minimum supported Rust version
//!
//! Rust 1.85 (edition 2024). Raising it is a minor-version change.
//!
//! # Coming from Bucket4j
//!
//! The operations keep Bucket4j's names in snake case (`tryConsume` → `try_consume`,
//! `tryConsumeAndReturnRemaining` → `try_consume_and_return_remaining`, `asVerbose` →
//! `as_verbose`, `toListenable` → `to_listenable`, …). Counts are `u64` and durations
//! [`Duration`](std::time::Duration); bad arguments are typed errors ([`OperationError`],
//! [`ConfigError`]) instead of `IllegalArgumentException`; being rate limited is a value
//! (`false`, a probe), never an error. The deliberate differences (exact arithmetic, waits
//! rounded up, fractional tokens kept on replacement, replacement validated like building) are
//! listed in the repository's `docs/differences-from-bucket4j.md`.
#![forbid(unsafe_code)]
#![cfg_attr(bucket4rs_docsrs, feature(doc_cfg))]

/// The pure core: configurations, state and every operation as an exact transition.
pub use bucket4rs_core as core;

pub use bucket4rs_core::{
    Bandwidth, BandwidthBuilder, BandwidthState, BucketConfiguration, BucketListener, BucketState,
    Clock, ConfigError, ConsumptionProbe, EstimationProbe, MAX_NANOS, ManualClock, MonotonicClock,
    NoopListener, OperationError, RefillKind, StateError, SystemMillisClock, SystemNanosClock,
    TokensInheritanceStrategy,
};

#[cfg(feature = "local")]
pub use bucket4rs_local::{
    AnyStorage, Bucket, BucketBuilder, BucketSnapshot, FastClock, KeyedBucket, KeyedBucketBuilder,
    KeyedError, LockFree, LockFreeBucket, SynchronizationStrategy, Synchronized,
    SynchronizedBucket, UnsyncBucket, Unsynchronized, VerboseBucket, VerboseKeyedBucket,
    VerboseResult,
};

/// Blocking consumption (feature `blocking`).
#[cfg(feature = "blocking")]
pub use bucket4rs_blocking as blocking;

/// Async consumption (feature `async`; `tokio` adds the tokio sleeper and clock).
#[cfg(feature = "async")]
pub use bucket4rs_async as asynchronous;

/// Listener implementations (feature `listeners`).
#[cfg(feature = "listeners")]
pub use bucket4rs_listeners as listeners;

/// Distributed buckets (feature `distributed`; `redis` and `postgres` add backends).
#[cfg(feature = "distributed")]
pub use bucket4rs_distributed as distributed;
