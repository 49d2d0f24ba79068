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
//! | one limit per key shared by many processes | [`distributed`] (`redis`/`postgres` features; `sqlite` on one machine) | exact, atomic, one round trip per operation |
//! | one limit per key inside one process | [`KeyedBucket`] | one lock-free word per key, looked up by `&str`; bounded memory: a key's bucket is dropped once a fresh one would answer the same |
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
//! | `tokio` | | the tokio sleeper and clock for [`asynchronous`]; with `blocking`, a debug-build warning when a blocking view is made on a thread that runs tokio tasks |
//! | `listeners` | | [`listeners`]: counters and composition |
//! | `metrics` | | a listener reporting through the `metrics` facade |
//! | `tracing` | | a listener emitting `tracing` events |
//! | `distributed` | | [`distributed`]: proxy manager, backend trait, embedded store (an in-process stand-in for a remote store) |
//! | `redis` | | the Redis backend |
//! | `postgres` | | the PostgreSQL backend |
//! | `sqlite` | | the SQLite backend: one file on this machine, kept across restarts |
//! | `tower` | | [`tower`]: the HTTP layer for tower and axum (429, `Retry-After`, `RateLimit` headers, plans files) |
//! | `axum` | | the HTTP layer also reads axum's `ConnectInfo` for the client IP |
//! | `full` | | all of the above |
//!
//! Features are additive. The pure core ([`core`]) is always there and is `no_std`-capable on
//! its own (depend on `bucket4rs-core` with `default-features = false`). Every name this page
//! shows at the crate root is there with the feature that its row names; the repository's
//! `cargo xtask test` builds a small program against each feature alone to keep it so.
//!
//! # Minimum supported Rust version
//!
//! Rust 1.89 (edition 2024). Raising it is a minor-version change.
//!
//! # Coming from Bucket4j
//!
//! The operations keep Bucket4j's names in snake case (`tryConsume` → `try_consume`). Counts
//! are `u64` and durations [`Duration`](std::time::Duration); bad arguments are typed errors
//! ([`OperationError`], [`ConfigError`]) instead of `IllegalArgumentException`; being rate
//! limited is a value (`false`, a probe), never an error. Where the Java name has no
//! counterpart, rustdoc's search knows the usual ones (search for `consume_uninterruptibly`,
//! `as_scheduler` or `with_synchronization_strategy`). The deliberate differences of results
//! (exact arithmetic, waits rounded up, fractional tokens kept on replacement, replacement
//! validated like building) are in the repository's `docs/differences-from-bucket4j.md`,
//! which has this table too.
//!
//! ## Building a bucket
//!
//! | Bucket4j | bucket4rs | notes |
//! |---|---|---|
//! | `Bucket.builder()` | [`Bucket::builder`] | |
//! | `.addLimit(limit -> limit.capacity(c).refillGreedy(n, period))` | [`BucketBuilder::add_limit`]`(\|l\| l.capacity(c).refill_greedy(n, period))` | a limit that does not build makes `build()` fail with its [`ConfigError`] |
//! | `.addLimit(bandwidth)` | [`BucketBuilder::add_bandwidth`] | Rust has no overloading: two names |
//! | `BucketConfiguration.builder().addLimit(…)` | [`BucketConfiguration::builder`], then [`ConfigurationBuilder::add_limit`] (closure) or [`ConfigurationBuilder::add_bandwidth`] | the same two forms as the bucket builder |
//! | `Bandwidth.builder().capacity(c)` | [`Bandwidth::builder`]`().capacity(c)` ([`BandwidthBuilder`]) | |
//! | `.refillGreedy(n, period)`, `.refillIntervally(n, period)` | [`BandwidthBuilder::refill_greedy`], [`BandwidthBuilder::refill_intervally`] | |
//! | `.refillIntervallyAligned(n, period, timeOfFirstRefill)` | [`BandwidthBuilder::refill_intervally_aligned`] | the first refill is a [`Duration`](std::time::Duration) since the Unix epoch; needs a wall-clock based clock |
//! | `.refillIntervallyAlignedWithAdaptiveInitialTokens(…)` | [`BandwidthBuilder::refill_intervally_aligned_adaptive`] | |
//! | `.initialTokens(n)`, `.id("x")`, `.build()` | [`BandwidthBuilder::initial_tokens`], [`BandwidthBuilder::id`], [`BandwidthBuilder::build`] | `build` returns `Result` |
//! | `Bandwidth.simple(c, period)`, `Bandwidth.classic(c, Refill.greedy(…))` | [`Bandwidth::simple`]; the builder for the rest | no `Refill` type: the refill is a builder step |
//! | `.withSynchronizationStrategy(LOCK_FREE)` | [`BucketBuilder::build`] (or `build_lock_free`) → [`LockFreeBucket`] | the strategy is the bucket's type |
//! | `.withSynchronizationStrategy(SYNCHRONIZED)` | [`BucketBuilder::build_synchronized`] → [`SynchronizedBucket`] | a `parking_lot` mutex |
//! | `.withSynchronizationStrategy(NONE)` | [`BucketBuilder::build_unsynchronized`] → [`UnsyncBucket`] | `!Sync`: sharing it between threads does not compile; use `build()` for a shared bucket |
//! | a strategy read from configuration | [`BucketBuilder::build_with`]`("lock_free".parse()?)` ([`SynchronizationStrategy`], [`UnknownStrategy`]) | the two thread-safe strategies only |
//! | `.withMillisecondPrecision()` (the default in Bucket4j) | [`BucketBuilder::with_clock`]`(`[`SystemMillisClock`]`)` | bucket4rs's default clock is [`FastClock`] (nanoseconds, see below) |
//! | `.withNanosecondPrecision()` | [`BucketBuilder::with_clock`]`(`[`MonotonicClock::new`]`())` | or keep the default [`FastClock`], which has nanosecond precision too |
//! | `.withCustomTimePrecision(timeMeter)` | [`BucketBuilder::with_clock`] with your [`Clock`] | |
//! | `.withListener(listener)` | [`BucketBuilder::with_listener`] | |
//! | `.build()` | [`BucketBuilder::build`] | returns `Result<_, ConfigError>` |
//!
//! ## Consuming
//!
//! | Bucket4j | bucket4rs | notes |
//! |---|---|---|
//! | `tryConsume(n)` | [`Bucket::try_consume`] | `Ok(false)` when limited; `Err` only for `n = 0` |
//! | `tryConsumeAndReturnRemaining(n)` | [`Bucket::try_consume_and_return_remaining`] → [`ConsumptionProbe`] | |
//! | `probe.isConsumed()`, `getRemainingTokens()` | [`ConsumptionProbe::is_consumed`], [`ConsumptionProbe::remaining_tokens`] | |
//! | `probe.getNanosToWaitForRefill()`, `getNanosToWaitForReset()` | [`ConsumptionProbe::wait_for_refill`], [`ConsumptionProbe::wait_for_reset`] (a `Duration`; `as_nanos()` for the number) | waits round up: waiting the reported time always succeeds |
//! | `X-Rate-Limit-Retry-After-Seconds` from `getNanosToWaitForRefill()` | [`ConsumptionProbe::retry_after_secs`] | rounded up, at least 1; `wait_for_refill().as_secs()` truncates a 0.4 s wait to 0 |
//! | a request above the capacity (waits `Long.MAX_VALUE`) | [`ConsumptionProbe::is_never_possible`] | answer it as an error, not with a retry |
//! | `estimateAbilityToConsume(n)` | [`Bucket::estimate_ability_to_consume`] → [`EstimationProbe`] | |
//! | `tryConsumeAsMuchAsPossible()`, `(limit)` | [`Bucket::try_consume_as_much_as_possible`], [`Bucket::try_consume_as_much_as_possible_with_limit`] | two names (no overloading) |
//! | `consumeIgnoringRateLimits(n)` | [`Bucket::consume_ignoring_rate_limits`] | returns the debt's wait as a `Duration` |
//! | `addTokens(n)`, `forceAddTokens(n)`, `reset()` | [`Bucket::add_tokens`], [`Bucket::force_add_tokens`], [`Bucket::reset`] | |
//! | `getAvailableTokens()` | [`Bucket::available_tokens`] | negative while in debt |
//! | `replaceConfiguration(config, strategy)` | [`Bucket::replace_configuration`] with [`TokensInheritanceStrategy`] (`Proportionally`, `AsIs`, `Additive`, `Reset`) | validated like building; bandwidths matched by id |
//! | `getConfiguration()` | [`Bucket::configuration`] | also [`Bucket::snapshot`] to persist and restore |
//!
//! ## Blocking (`asBlocking()`, feature `blocking`)
//!
//! | Bucket4j | bucket4rs | notes |
//! |---|---|---|
//! | `bucket.asBlocking()` | [`blocking::BlockingBucketExt::as_blocking`] | never on a thread that runs async tasks: use the async view there |
//! | `consume(n)`, `consumeUninterruptibly(n)` | [`blocking::BlockingBucket::consume`] | one method: a Rust thread has no interrupt, so a plain wait is already uninterruptible |
//! | `tryConsume(n, maxWait)`, `tryConsumeUninterruptibly(n, maxWait)` | [`blocking::BlockingBucket::try_consume`] | `maxWait` is a `Duration` |
//! | `consume(n, strategy)`, `tryConsume(n, maxWait, strategy)` | [`blocking::BlockingBucket::consume_with`], [`blocking::BlockingBucket::try_consume_with`] with a [`blocking::ParkStrategy`] | |
//! | `BlockingStrategy.PARKING`, `UninterruptibleBlockingStrategy.PARKING` | [`blocking::ThreadPark`] (what `consume`/`try_consume` use) | sleeps until the deadline, never spins |
//! | `Thread.interrupt()` of a waiting thread | [`blocking::CancelToken`] given to `consume_with`, then [`blocking::CancelToken::cancel`] | the wait returns [`blocking::WaitError::Interrupted`] and gives its tokens back (Bucket4j keeps them) |
//! | a lambda `BlockingStrategy` (`nanos -> …`) | a type implementing [`blocking::ParkStrategy`] (one method, `park(Duration) -> Result<(), Interrupted>`) | Rust has no anonymous implementations of a trait; failing the park is how a strategy cancels |
//! | a `BlockingStrategy` mock in tests | [`blocking::ManualClockPark`] | advances a [`ManualClock`] instead of sleeping |
//!
//! ## Scheduling (`asScheduler()`, features `async` and `tokio`)
//!
//! | Bucket4j | bucket4rs | notes |
//! |---|---|---|
//! | `bucket.asScheduler()` | `as_async()` (feature `tokio`) or [`asynchronous::AsyncBucketExt::with_sleeper`] with any runtime's sleep function | a [`asynchronous::Sleeper`] replaces the `ScheduledExecutorService` |
//! | `consume(n, executor)` → `CompletableFuture<Void>` | [`asynchronous::AsyncBucket::consume`]`(n).await` | |
//! | `tryConsume(n, maxWait, executor)` → `CompletableFuture<Boolean>` | [`asynchronous::AsyncBucket::try_consume`]`(n, max_wait).await` | |
//! | the future reserves when `consume` is called | the future reserves when it is **first polled** | Rust futures are lazy; a future dropped before its first poll took nothing, and one dropped while waiting gives its tokens back |
//! | `var f = scheduler.tryConsume(…)` | `let view = bucket.as_async(); let f = view.try_consume(…);` | the future borrows the view: `let f = bucket.as_async().try_consume(…);` is `E0716` (see [`asynchronous::AsyncBucket`]) |
//! | a test with a mocked time meter | [`asynchronous::TokioClock`] with tokio's paused time | needs tokio's `test-util` feature |
//!
//! ## Verbose API and diagnostics
//!
//! | Bucket4j | bucket4rs | notes |
//! |---|---|---|
//! | `bucket.asVerbose()` | [`Bucket::as_verbose`] → [`VerboseBucket`] | every operation of the bucket, each answering a [`VerboseResult`] (`replace_configuration` included) |
//! | `asBlocking().asVerbose()` | [`blocking::BlockingBucket::as_verbose`] → the same view with the [`Verbose`] answer | the result of the reservation, before the park |
//! | `asScheduler()` with verbose results | [`asynchronous::AsyncBucket::as_verbose`] → the same view with the [`Verbose`] answer | the result of the reservation, at the first poll |
//! | `result.getValue()`, `getConfiguration()`, `getState()`, `getOperationTimeNanos()` | [`VerboseResult::value`] (or `into_value`), [`VerboseResult::configuration`], [`VerboseResult::state`], [`VerboseResult::now_nanos`] | |
//! | `result.getDiagnostics().getAvailableTokens()` | [`VerboseResult::available_tokens`] | the diagnostics are methods of the result |
//! | `getDiagnostics().getAvailableTokensPerEachBandwidth()` | [`VerboseResult::available_tokens_per_bandwidth`] | |
//! | `getDiagnostics().calculateFullRefillingTime()` | [`VerboseResult::time_until_full`] | a `Duration` |
//! | `result.map(f)` | [`VerboseResult::map`] | |
//!
//! ## Time meters and clocks
//!
//! | Bucket4j | bucket4rs | notes |
//! |---|---|---|
//! | `TimeMeter.SYSTEM_MILLISECONDS` (Bucket4j's default) | [`SystemMillisClock`] | wall clock, whole milliseconds |
//! | `TimeMeter.SYSTEM_NANOTIME` | [`MonotonicClock`] (`std::time::Instant`) | **not** [`SystemNanosClock`]: despite its name that one reads the wall clock (`SystemTime`), which jumps when the system time is set |
//! | — | [`FastClock`] (bucket4rs's default) | epoch nanoseconds advanced by the CPU's counter: never jumps, cheap, supports aligned refill |
//! | — | [`SystemNanosClock`] | wall-clock nanoseconds; only for aligned refill at nanosecond precision, prefer [`FastClock`] |
//! | a custom `TimeMeter` (`currentTimeNanos`, `isWallClockBased`) | a type implementing [`Clock`] ([`Clock::now_nanos`], [`Clock::is_wall_clock_based`], [`Clock::is_monotonic`]) | |
//! | a mocked time meter in tests | [`ManualClock`] (`advance`, `set_nanos`) | clones share the reading |
//!
//! ## Listeners
//!
//! | Bucket4j | bucket4rs | notes |
//! |---|---|---|
//! | `BucketListener` (`onConsumed`, `onRejected`, `onDelayed`, `onParked`, `onInterrupted`) | [`BucketListener`] (`on_consumed`, `on_rejected`, `on_delayed`, `on_before_parking`, `on_parked`, `on_interrupted`) | every method has an empty default; `on_interrupted` takes no exception |
//! | `SimpleBucketListener` | [`listeners::SimpleBucketListener`] (feature `listeners`) | also `MetricsListener`, `TracingListener` |
//! | `bucket.toListenable(listener)` | [`Bucket::to_listenable`] | *replaces* the listener, as in Bucket4j |
//! | several listeners | [`Bucket::and_listener`] (adds one), or a tuple `(a, b)` given to `with_listener` | |
//!
//! ## Distributed buckets (`ProxyManager`, feature `distributed`)
//!
//! | Bucket4j | bucket4rs | notes |
//! |---|---|---|
//! | `proxyManager.builder().build(key, configurationSupplier)` | [`distributed::ProxyManager::builder`], then [`distributed::RemoteBucketBuilder::build`] | no round trip; the supplier is called only when the key has no stored state |
//! | `RemoteBucketBuilder.withListener(listener)` | [`distributed::RemoteBucketBuilder::with_listener`] | the local bucket's events, once the backend has committed the call; a failed call notifies nothing |
//! | `BucketProxy` operations (`tryConsume`, `reserve`, …) | [`distributed::RemoteBucket`] | the local bucket's operations as `async fn`s, with its arguments and answers (counts, `Duration`s) |
//! | `bucketProxy.asVerbose()` | [`distributed::RemoteBucket::as_verbose`] | the same bucket answering `VerboseResult`s, as locally |
//! | `bucketProxy.asBlocking()` | [`distributed::RemoteBucket::as_blocking`] → [`distributed::BlockingRemoteBucket`] | no runtime needed (one background thread drives the calls); refused on a thread that runs async tasks |
//! | `bucketProxy.asScheduler()` (`consume`, `tryConsume(n, maxWait)`) | [`distributed::RemoteBucket::consume`], [`distributed::RemoteBucket::try_consume_within`] | cancellation safe like the local async view: a wait dropped mid-way gives its tokens back |
//! | `proxyManager.getProxyConfiguration(key)` | [`distributed::RemoteBucket::configuration`] |  |
//! | `proxyManager.removeProxy(key)` | [`distributed::ProxyManager::remove`] |  |
//! | a remote call failed with an exception (`TimeoutException`, a lost connection) | [`distributed::DistributedError`] with [`distributed::DistributedError::is_in_doubt`] and [`distributed::DistributedError::is_retryable`] | says whether the call was applied: not applied, or in doubt (sent, no reply) |
#![forbid(unsafe_code)]
#![cfg_attr(bucket4rs_docsrs, feature(doc_cfg))]

/// The pure core: configurations, state and every operation as an exact transition.
pub use bucket4rs_core as core;

pub use bucket4rs_core::{
    Answer, Bandwidth, BandwidthBuilder, BandwidthState, BucketConfiguration, BucketListener,
    BucketState, Clock, ConfigError, ConfigurationBuilder, ConsumptionProbe, EstimationProbe,
    MAX_NANOS, ManualClock, MonotonicClock, NoopListener, OperationError, Plain, RefillKind,
    StateError, SystemMillisClock, SystemNanosClock, TokensInheritanceStrategy, Verbose,
    VerboseResult,
};

#[cfg(feature = "local")]
pub use bucket4rs_local::{
    AnyStorage, Bucket, BucketBuilder, BucketSnapshot, FastClock, KeyedBucket, KeyedBucketBuilder,
    KeyedError, LockFree, LockFreeBucket, NewStorage, Storage, SynchronizationStrategy,
    Synchronized, SynchronizedBucket, UnknownStrategy, UnsyncBucket, Unsynchronized, VerboseBucket,
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

/// The HTTP layer for tower and axum (feature `tower`; `axum` adds the client IP from axum's
/// `ConnectInfo`).
#[cfg(feature = "tower")]
pub use bucket4rs_tower as tower;

// The repository's README, whose examples use this crate, is tested with its doctests.
#[cfg(all(doctest, feature = "local", feature = "tower"))]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadme;
