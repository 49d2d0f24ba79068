//! Proxy managers and remote buckets: the local bucket API over any [`Backend`].
//!
//! `mod.rs` holds the manager and its settings; `bucket.rs` the remote bucket and its
//! verbose and blocking views; `batch.rs` request batching. Every operation runs in the one
//! record envelope of `crate::record`.

mod batch;
mod breaker;
mod bucket;
mod lease;
mod settle;

use core::fmt;
use core::time::Duration;
use std::sync::Arc;

use bucket4rs_core::{Clock, SystemNanosClock};
use dashmap::DashMap;
use rand::Rng;

use crate::backend::{Backend, BackendClock, OperationId, Transaction};
use crate::error::{BackendError, BackendErrorKind, DistributedError, FormatError};
use crate::format;
use crate::key::{KeyPolicy, StorageKey};

use batch::{Batching, Lane};
use breaker::Breaker;
pub use breaker::CircuitBreaker;
pub use bucket::{BlockingRemoteBucket, RemoteBucket, RemoteBucketBuilder};
pub use lease::Leasing;

/// Where remote buckets read `now` from.
///
/// - [`TimeSource::backend`] (the default when the backend has a clock): every client uses
///   the backend's clock (Redis `TIME`), so skew between application hosts cannot matter;
///   the clock is read inside the atomic step.
/// - [`TimeSource::client`]: the caller's clock, which must be shared by every client of the
///   same keys (e.g. [`SystemNanosClock`] on NTP-synchronised hosts); skew between hosts
///   shifts refill by the skew. Needed for tests with a `ManualClock` and for backends
///   without a clock.
///
/// ```
/// use bucket4rs_distributed::TimeSource;
/// use bucket4rs_core::ManualClock;
/// let t = TimeSource::client(ManualClock::new(0));
/// assert_eq!(format!("{t:?}"), "TimeSource::Client { wall_clock_based: false }");
/// assert_eq!(format!("{:?}", TimeSource::backend()), "TimeSource::Backend");
/// ```
#[derive(Clone)]
pub struct TimeSource(Option<Arc<dyn Clock + Send + Sync>>);

impl TimeSource {
    /// The backend's clock.
    ///
    /// ```
    /// let t = bucket4rs_distributed::TimeSource::backend();
    /// assert_eq!(format!("{t:?}"), "TimeSource::Backend");
    /// ```
    pub fn backend() -> Self {
        Self(None)
    }

    /// The given client clock.
    ///
    /// ```
    /// # use bucket4rs_distributed::TimeSource;
    /// let t = TimeSource::client(bucket4rs_core::SystemNanosClock);
    /// assert_eq!(format!("{t:?}"), "TimeSource::Client { wall_clock_based: true }");
    /// ```
    pub fn client(clock: impl Clock + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(clock)))
    }
}

impl fmt::Debug for TimeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("TimeSource::Backend"),
            Some(c) => write!(
                f,
                "TimeSource::Client {{ wall_clock_based: {} }}",
                c.is_wall_clock_based()
            ),
        }
    }
}

/// Bounded retries with exponential, fully jittered backoff, for retryable backend errors
/// (lost compare-and-set races, requests that were certainly not sent).
///
/// ```
/// use bucket4rs_distributed::RetryPolicy;
/// use std::time::Duration;
/// let r = RetryPolicy::new(5, Duration::from_millis(1), Duration::from_millis(50));
/// assert_eq!(format!("{r:?}"), "RetryPolicy { max_attempts: 5, base: 1ms, max_backoff: 50ms }");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    base: Duration,
    max_backoff: Duration,
}

impl RetryPolicy {
    /// At most `max_attempts` attempts (at least 1); before attempt `k+1`, sleep a uniform
    /// random time in `[0, min(max_backoff, base * 2^k)]`.
    ///
    /// ```
    /// # use bucket4rs_distributed::RetryPolicy; use std::time::Duration;
    /// let none = Duration::ZERO;
    /// assert_eq!(RetryPolicy::new(0, none, none), RetryPolicy::new(1, none, none));
    /// ```
    pub fn new(max_attempts: u32, base: Duration, max_backoff: Duration) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            base,
            max_backoff,
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let cap = self
            .base
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max_backoff);
        let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }
}

impl Default for RetryPolicy {
    /// 10 attempts, backoff from 1 ms up to 50 ms.
    fn default() -> Self {
        Self::new(10, Duration::from_millis(1), Duration::from_millis(50))
    }
}

/// The longest call timeout a manager accepts.
const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// The largest TTL margin a manager accepts.
const MAX_TTL_MARGIN: Duration = Duration::from_secs(365 * 24 * 60 * 60);

struct Inner<B> {
    backend: B,
    keys: KeyPolicy,
    time: TimeSource,
    wall: bool,
    timeout: Duration,
    retry: RetryPolicy,
    ttl_margin: Duration,
    batching: Batching,
    /// `None` when off or for an in-process backend.
    breaker: Option<Breaker>,
    /// Keys with an operation in flight through the batching path, and what queued behind it.
    lanes: DashMap<StorageKey, Lane>,
    /// Operation ids, the calls in doubt and the leases' returns.
    settler: settle::Settler,
    /// The leasing of buckets that do not choose their own (`None`: off); shared, so that a
    /// bucket carries a pointer, not the settings.
    leasing: Option<Arc<Leasing>>,
    /// Leased keys: their lease and what this manager last saw of their bucket.
    leases: DashMap<StorageKey, Arc<lease::Slot>>,
    /// Whether the task that ends old and idle leases runs.
    keeper: core::sync::atomic::AtomicBool,
    /// Run by a handle's drop: gives the leases back when it was the last handle
    /// (`lease::release_on_last_drop` for this backend type, which `Drop` cannot name).
    on_drop: fn(&Arc<Inner<B>>),
}

/// Configures a [`ProxyManager`]: key prefix and length limit, time source, timeout,
/// retries and TTL margin.
///
/// ```
/// use bucket4rs_distributed::{EmbeddedBackend, ProxyManager, TimeSource};
/// use std::time::Duration;
/// let manager = ProxyManager::configure(EmbeddedBackend::new())
///     .key_prefix("api")
///     .timeout(Duration::from_millis(200))
///     .ttl_margin(Duration::from_secs(5))
///     .build()?;
/// # Ok::<(), bucket4rs_distributed::DistributedError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct ManagerBuilder<B> {
    backend: B,
    prefix: String,
    max_key_len: usize,
    time: Option<TimeSource>,
    timeout: Duration,
    retry: RetryPolicy,
    ttl_margin: Duration,
    max_batch: usize,
    breaker: CircuitBreaker,
    leasing: Option<Leasing>,
}

impl<B: Backend> ManagerBuilder<B> {
    /// Leasing for every bucket of the manager (default: off; a bucket may choose otherwise
    /// with [`RemoteBucketBuilder::leasing`]): a hot key's calls are served in this process
    /// from blocks of tokens taken from the shared bucket, with no over-grant (see
    /// [`Leasing`]). [`build`](Self::build) refuses settings that can only break things.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// use bucket4rs_distributed::{EmbeddedBackend, Leasing, ProxyManager};
    /// # use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// let manager = ProxyManager::configure(EmbeddedBackend::new())
    ///     .leasing(Leasing::new().processes(4))
    ///     .build()?;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10_000, Duration::from_secs(1))?).build()?;
    /// let bucket = manager.builder().build("global", move || config.clone())?;
    /// for _ in 0..100 {
    ///     assert!(bucket.try_consume(1).await?); // most of them from this process's lease
    /// }
    /// assert!(manager.leased_tokens() > 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn leasing(mut self, leasing: Leasing) -> Self {
        self.leasing = Some(leasing);
        self
    }

    /// Per-key request batching: at most `max` operations per batch (default 64; 1 turns
    /// batching off; 0 is refused by [`build`](Self::build)).
    ///
    /// With batching, operations on a key that arrive while another operation on the same
    /// key is in flight wait for it and then go to the backend together, as one transaction
    /// applying them in arrival order at one instant: one round trip (Redis: one script; PostgreSQL:
    /// one compare-and-set statement) for the whole batch, each caller getting the result it
    /// would have got alone at that instant. On a hot key this turns N round trips into one;
    /// an idle key is not delayed. In-process backends
    /// ([`Backend::is_in_process`]) are never batched: they have no round trip to save.
    ///
    /// A queued operation dropped (or timed out) before its batch is sent is never applied;
    /// once sent it is applied whatever happens to its caller, like an unbatched call
    /// cancelled while its request is in flight. See `docs/distributed.md`.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let m = ProxyManager::configure(EmbeddedBackend::new()).max_batch(32).build()?;
    /// let unbatched = ProxyManager::configure(EmbeddedBackend::new()).max_batch(1).build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn max_batch(mut self, max: usize) -> Self {
        self.max_batch = max;
        self
    }

    /// The key prefix (default `bucket4rs`).
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// assert!(ProxyManager::configure(EmbeddedBackend::new()).key_prefix("{bad}").build().is_err());
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest storage key, in bytes (default 512). [`build`](Self::build) refuses a
    /// limit that leaves no room for a key after the prefix and its `:`.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let m = ProxyManager::configure(EmbeddedBackend::new()).max_key_len(20).build()?;
    /// assert!(m.storage_key([b'x'; 30]).is_err());
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    /// Where `now` comes from (default: the backend's clock when it has one, else
    /// [`SystemNanosClock`]).
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager, TimeSource};
    /// let m = ProxyManager::configure(EmbeddedBackend::new())
    ///     .time_source(TimeSource::client(bucket4rs_core::ManualClock::new(0)))
    ///     .build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.time = Some(time);
        self
    }

    /// The longest any call may take, retries included (default 1 s). [`build`](Self::build)
    /// refuses zero (every call would fail) and more than one hour.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// let m = ProxyManager::configure(EmbeddedBackend::new()).timeout(Duration::from_millis(50)).build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The retry policy (default [`RetryPolicy::default`]). Every policy is accepted: it
    /// makes at least one attempt, and its backoff sleeps count against the call's timeout.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager, RetryPolicy};
    /// let m = ProxyManager::configure(EmbeddedBackend::new()).retry(RetryPolicy::default()).build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Added to every key's TTL (default 1 s): keys expire this long after their bucket
    /// would be full again. Covers clock skew between clients and the backend.
    /// [`build`](Self::build) refuses more than one year (a margin that large would keep
    /// records forever, disabling expiry).
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// let m = ProxyManager::configure(EmbeddedBackend::new()).ttl_margin(Duration::ZERO).build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn ttl_margin(mut self, margin: Duration) -> Self {
        self.ttl_margin = margin;
        self
    }

    /// The circuit breaker (default [`CircuitBreaker::default`]: open after 5 consecutive
    /// unavailable calls, probe every 500 ms; [`CircuitBreaker::off`] for none). Ignored
    /// for in-process backends.
    ///
    /// ```
    /// # use bucket4rs_distributed::{CircuitBreaker, EmbeddedBackend, ProxyManager};
    /// # use std::time::Duration;
    /// let m = ProxyManager::configure(EmbeddedBackend::new())
    ///     .circuit_breaker(CircuitBreaker::new(10, Duration::from_secs(1)))
    ///     .build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// Refuses the settings that can only break things.
    fn check(&self) -> Result<(), DistributedError> {
        let refuse = |setting, reason| Err(DistributedError::InvalidSetting { setting, reason });
        if self.timeout.is_zero() {
            return refuse(
                "timeout",
                "must be more than zero (a zero timeout fails every call)",
            );
        }
        if self.timeout > MAX_TIMEOUT {
            return refuse("timeout", "must be at most one hour");
        }
        if self.ttl_margin > MAX_TTL_MARGIN {
            return refuse(
                "ttl_margin",
                "must be at most one year (a larger margin keeps records forever)",
            );
        }
        if self.max_batch == 0 {
            return refuse("max_batch", "must be at least 1 (1 turns batching off)");
        }
        if let Some(l) = &self.leasing {
            l.check()?;
        }
        // Room for the prefix, its `:` and at least one byte of key.
        if self.max_key_len < self.prefix.len().saturating_add(2) {
            return refuse(
                "max_key_len",
                "leaves no room for a key after the prefix and its `:`",
            );
        }
        self.breaker.check()
    }

    /// Builds the manager.
    ///
    /// # Errors
    /// [`DistributedError::Key`] for an invalid prefix; [`DistributedError::InvalidSetting`]
    /// for a setting that can only break things (a zero timeout or one above an hour, a TTL
    /// margin above a year, a zero batch size, a key length limit with no room for a key, a
    /// circuit breaker that never closes or never lets a call through);
    /// [`DistributedError::Backend`] when the backend clock is asked for but the backend has
    /// none.
    ///
    /// ```
    /// # use bucket4rs_distributed::{DistributedError, EmbeddedBackend, ProxyManager};
    /// # use std::time::Duration;
    /// let zero = ProxyManager::configure(EmbeddedBackend::new()).timeout(Duration::ZERO).build();
    /// assert!(matches!(zero, Err(DistributedError::InvalidSetting { setting: "timeout", .. })));
    /// ```
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let m = ProxyManager::configure(EmbeddedBackend::new()).build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn build(self) -> Result<ProxyManager<B>, DistributedError> {
        self.check()?;
        let keys = KeyPolicy::new(self.prefix)?.max_len(self.max_key_len);
        let clock = self.backend.clock();
        let time = match self.time {
            Some(t) => t,
            None if clock == BackendClock::None => TimeSource::client(SystemNanosClock),
            None => TimeSource::backend(),
        };
        let wall = match &time.0 {
            Some(c) => c.is_wall_clock_based(),
            None => match clock {
                BackendClock::WallClock => true,
                BackendClock::Monotonic => false,
                _ => {
                    return Err(DistributedError::Backend(BackendError::new(
                        BackendErrorKind::Other,
                        "the backend has no clock: use TimeSource::client",
                    )));
                }
            },
        };
        let breaker = self.breaker.state_for(&self.backend);
        Ok(ProxyManager {
            inner: Arc::new(Inner {
                backend: self.backend,
                keys,
                time,
                wall,
                timeout: self.timeout,
                retry: self.retry,
                ttl_margin: self.ttl_margin,
                batching: Batching::up_to(self.max_batch),
                breaker,
                lanes: DashMap::new(),
                settler: settle::Settler::new(),
                leasing: self.leasing.map(Arc::new),
                leases: DashMap::new(),
                keeper: core::sync::atomic::AtomicBool::new(false),
                on_drop: lease::release_on_last_drop::<B>,
            }),
        })
    }
}

/// Hands out remote buckets stored in one backend.
///
/// Cheap to clone (an `Arc`); share one per backend.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let manager = ProxyManager::new(EmbeddedBackend::new());
/// let config = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?)
///     .build()?;
/// let bucket = manager.builder().build("user-42", move || config.clone())?;
/// assert!(bucket.try_consume(3).await?);
/// assert!(!bucket.try_consume(1).await?);
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ProxyManager<B> {
    inner: Arc<Inner<B>>,
}

impl<B> Clone for ProxyManager<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B> Drop for ProxyManager<B> {
    /// The last handle of a manager gives its leases back, on a task of its own (see
    /// [`ProxyManager::release_leases`]).
    fn drop(&mut self) {
        (self.inner.on_drop)(&self.inner);
    }
}

impl<B: fmt::Debug> fmt::Debug for ProxyManager<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyManager")
            .field("backend", &self.inner.backend)
            .field("prefix", &self.inner.keys.prefix())
            .field("time", &self.inner.time)
            .field("timeout", &self.inner.timeout)
            .field("retry", &self.inner.retry)
            .field("ttl_margin", &self.inner.ttl_margin)
            .field("batching", &self.inner.batching)
            .field("breaker", &self.inner.breaker)
            .field("leasing", &self.inner.leasing)
            .finish()
    }
}

impl<B: Backend> ProxyManager<B> {
    /// A manager with every default (prefix `bucket4rs`, backend clock when there is one,
    /// 1 s timeout, default retries, 1 s TTL margin).
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// ```
    pub fn new(backend: B) -> Self {
        match Self::configure(backend).build() {
            Ok(m) => m,
            // Unreachable: the default prefix is valid and a clockless backend gets a client
            // clock. Kept total anyway.
            Err(_) => unreachable_default(),
        }
    }

    /// Starts configuring a manager.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let manager = ProxyManager::configure(EmbeddedBackend::new()).key_prefix("x").build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn configure(backend: B) -> ManagerBuilder<B> {
        ManagerBuilder {
            backend,
            prefix: "bucket4rs".into(),
            max_key_len: KeyPolicy::DEFAULT_MAX_LEN,
            time: None,
            timeout: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            ttl_margin: Duration::from_secs(1),
            max_batch: Batching::DEFAULT_MAX_BATCH,
            breaker: CircuitBreaker::default(),
            leasing: None,
        }
    }

    /// Starts building a remote bucket.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(&self) -> RemoteBucketBuilder<B> {
        RemoteBucketBuilder {
            manager: self.clone(),
            listener: None,
            leasing: self.inner.leasing.clone(),
        }
    }

    /// The leasing of the buckets that do not choose their own
    /// ([`ManagerBuilder::leasing`]; `None`: off).
    ///
    /// ```
    /// use bucket4rs_distributed::{EmbeddedBackend, Leasing, ProxyManager};
    /// assert_eq!(ProxyManager::new(EmbeddedBackend::new()).leasing(), None);
    /// let leasing = Leasing::new().processes(4);
    /// let manager = ProxyManager::configure(EmbeddedBackend::new()).leasing(leasing).build()?;
    /// assert_eq!(manager.leasing(), Some(leasing));
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn leasing(&self) -> Option<Leasing> {
        self.inner.leasing.as_deref().copied()
    }

    /// The backend.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// assert_eq!(manager.backend().len(), 0);
    /// ```
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// Whether the circuit breaker is open: calls fail at once (with a retryable
    /// `Unavailable` error, not applied) until its probe reaches the backend again. Always
    /// `false` with the breaker off and for in-process backends, which have none. For an
    /// operator's gauge or a health check.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// assert!(!manager.is_circuit_open());
    /// ```
    pub fn is_circuit_open(&self) -> bool {
        self.inner.breaker.as_ref().is_some_and(Breaker::is_open)
    }

    /// The storage key of a user key.
    ///
    /// # Errors
    /// [`DistributedError::Key`] when it is too long.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// assert_eq!(manager.storage_key("a b")?.as_str(), "bucket4rs:a%20b");
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn storage_key(&self, key: impl AsRef<[u8]>) -> Result<StorageKey, DistributedError> {
        Ok(self.inner.keys.key(key)?)
    }

    /// Deletes a key's bucket; whether it existed. The next use recreates it from its
    /// configuration supplier.
    ///
    /// # Errors
    /// Key, timeout and backend errors.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// assert!(!manager.remove("nobody").await?);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn remove(&self, key: impl AsRef<[u8]>) -> Result<bool, DistributedError> {
        let key = self.storage_key(key)?;
        let inner = &self.inner;
        self.call(&key, true, || inner.backend.remove(&key)).await
    }

    async fn read_record(
        &self,
        key: &StorageKey,
    ) -> Result<Option<format::Record>, DistributedError> {
        let inner = &self.inner;
        let bytes = self.call(key, false, || inner.backend.read(key)).await?;
        match bytes {
            None => Ok(None),
            Some(b) => Ok(Some(format::decode(&b)?)),
        }
    }

    /// A new operation id for a transaction on `key` (`None` for an in-process backend,
    /// whose calls are never in doubt).
    fn begin_operation(&self, key: &StorageKey) -> Option<OperationId> {
        (!self.inner.backend.is_in_process()).then(|| self.inner.settler.begin(key))
    }

    /// Records how the transaction `id` ended (`wrote`: its last `apply` asked for a write);
    /// one in doubt is settled later.
    fn end_operation(
        &self,
        key: &StorageKey,
        id: Option<OperationId>,
        result: &Result<(), DistributedError>,
        wrote: bool,
    ) {
        if let Some(id) = id {
            self.end_with(key, &id, settle::End::of(result, wrote));
        }
    }

    fn end_with(&self, key: &StorageKey, id: &OperationId, end: settle::End) {
        if self.inner.settler.end(key, id, end) {
            self.spawn_settler();
        }
    }

    /// Calls in doubt that this manager has not settled yet (they are settled by the key's
    /// next operation or by a background task, within a minute).
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// assert_eq!(manager.unsettled(), 0);
    /// ```
    pub fn unsettled(&self) -> usize {
        self.inner.settler.in_doubt()
    }

    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), DistributedError> {
        let inner = &self.inner;
        if inner.backend.is_in_process() {
            // Never waits and never asks for a retry: no timer, no retry loop.
            return inner.backend.transact(key, tx).await.map_err(backend_error);
        }
        if let Some(b) = inner.breaker.as_ref().filter(|b| b.is_open()) {
            breaker::while_open(inner, b, key).await?;
        }
        // Every attempt carries the moment the caller gives up, for the server to check
        // (the timeout is at most an hour: the sum cannot overflow).
        // A batch brings the earliest deadline of its callers.
        let own = now() + inner.timeout;
        let mut tx = Deadlined {
            deadline: tx.deadline().map_or(own, |d| d.min(own)),
            tx,
        };
        // Boxed (one allocation next to a network round trip): the timer and the retry
        // sleep would otherwise be part of every call's future, in-process ones too.
        // Bounded by the deadline, not by a timeout from now: a batch whose earliest caller
        // gives up is in doubt for all of them together, never applied for some callers who
        // saw an error and answered to the others.
        let until = tx.deadline;
        let outcome = Box::pin(writing_within(inner.timeout, Some(until), async {
            let mut attempt = 0;
            loop {
                match inner.backend.transact(key, &mut tx).await {
                    Ok(()) => return Ok(()),
                    Err(e) if e.is_retryable() && attempt + 1 < inner.retry.max_attempts => {
                        tokio::time::sleep(inner.retry.backoff(attempt)).await;
                        attempt += 1;
                    }
                    Err(e) => return Err(backend_error(e)),
                }
            }
        }))
        .await;
        breaker::record(inner, key, &outcome);
        outcome
    }

    /// One backend call on `key`: refused at once while the circuit breaker is open, else
    /// bounded by the timeout and retried when retryable, except on an in-process backend
    /// (which never waits and whose errors are final). A call that `writes` and times out is
    /// in doubt; a read that times out changed nothing.
    async fn call<T, F, Fut>(
        &self,
        key: &StorageKey,
        writes: bool,
        f: F,
    ) -> Result<T, DistributedError>
    where
        F: FnMut() -> Fut,
        Fut: core::future::Future<Output = Result<T, BackendError>>,
    {
        let inner = &self.inner;
        if inner.backend.is_in_process() {
            let mut f = f;
            return f().await.map_err(backend_error);
        }
        if let Some(b) = inner.breaker.as_ref().filter(|b| b.is_open()) {
            breaker::while_open(inner, b, key).await?;
        }
        let calling = async { retrying(&inner.retry, f).await };
        let outcome = if writes {
            writing_within(inner.timeout, None, calling).await
        } else {
            with_timeout(inner.timeout, calling).await
        };
        breaker::record(inner, key, &outcome);
        outcome
    }
}

/// A transaction with the caller's deadline (see [`Transaction::deadline`]).
struct Deadlined<'a> {
    tx: &'a mut dyn Transaction,
    deadline: std::time::Instant,
}

impl Transaction for Deadlined<'_> {
    fn command(&self) -> crate::backend::Command {
        self.tx.command()
    }
    fn batch(&self) -> Option<&[crate::backend::Command]> {
        self.tx.batch()
    }
    fn needs_backend_clock(&self) -> bool {
        self.tx.needs_backend_clock()
    }
    fn client_now(&self) -> Option<i64> {
        self.tx.client_now()
    }
    fn ttl_margin(&self) -> Duration {
        self.tx.ttl_margin()
    }
    fn deadline(&self) -> Option<std::time::Instant> {
        Some(self.deadline)
    }
    fn operation(&self) -> Option<&OperationId> {
        self.tx.operation()
    }
    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> crate::backend::Write {
        self.tx.apply(current, backend_now)
    }
}

/// The time on tokio's clock (the real one, unless a test paused it), as the std instant that
/// deadlines are given in ([`Transaction::deadline`]): the manager's deadlines, timers and
/// sleeps all run on one clock, so a simulation on paused time keeps them in step.
pub(crate) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

#[cold]
fn unreachable_default<T>() -> T {
    // The defaults of `configure` always build; reaching this is a bug in this crate.
    unreachable!("default manager settings are valid")
}

fn backend_error(e: BackendError) -> DistributedError {
    if e.kind() == BackendErrorKind::WrongType {
        DistributedError::Format(FormatError::WrongType {
            found: e.message().to_owned(),
        })
    } else {
        DistributedError::Backend(e)
    }
}

async fn retrying<T, F, Fut>(retry: &RetryPolicy, mut f: F) -> Result<T, DistributedError>
where
    F: FnMut() -> Fut,
    Fut: core::future::Future<Output = Result<T, BackendError>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() && attempt + 1 < retry.max_attempts => {
                tokio::time::sleep(retry.backoff(attempt)).await;
                attempt += 1;
            }
            Err(e) => return Err(backend_error(e)),
        }
    }
}

/// A call that may write, bounded by `timeout`: when the time runs out with the call
/// outstanding, its request may be in flight, so the error is in doubt
/// ([`BackendErrorKind::InDoubt`]). The crate's remote backends honour the caller's deadline
/// themselves (and say precisely whether they had sent anything); this is the bound for a
/// backend that does not.
pub(super) async fn writing_within<T>(
    timeout: Duration,
    until: Option<std::time::Instant>,
    fut: impl core::future::Future<Output = Result<T, DistributedError>>,
) -> Result<T, DistributedError> {
    let until = until.unwrap_or_else(|| now() + timeout);
    match tokio::time::timeout_at(until.into(), fut).await {
        Ok(r) => r,
        Err(_) => Err(DistributedError::Backend(BackendError::new(
            BackendErrorKind::InDoubt,
            format!(
                "no reply within the timeout ({timeout:?}) with the request possibly in flight: \
                 it may have been applied"
            ),
        ))),
    }
}

pub(super) async fn with_timeout<T>(
    timeout: Duration,
    fut: impl core::future::Future<Output = Result<T, DistributedError>>,
) -> Result<T, DistributedError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(DistributedError::Timeout { after: timeout }),
    }
}
