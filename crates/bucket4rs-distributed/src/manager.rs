//! Proxy managers and remote buckets: the local bucket API over any [`Backend`].

use core::fmt;
use core::time::Duration;
use std::sync::Arc;

use bucket4rs_core::ops::{self, Operation};
use bucket4rs_core::{
    BucketConfiguration, BucketState, Clock, ConsumptionProbe, EstimationProbe, OperationError,
    SystemNanosClock, TokensInheritanceStrategy,
};
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use rand::Rng;
use tokio::sync::oneshot;

use crate::backend::{Backend, BackendClock, Command, DecodedWrite, Transaction, Write};
use crate::embedded::EmbeddedBackend;
use crate::error::{BackendError, BackendErrorKind, DistributedError, FormatError};
use crate::format;
use crate::key::{EncodedKey, KeyPolicy, StorageKey, StorageKeyRef};

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
/// assert!(!t.is_backend());
/// assert!(TimeSource::backend().is_backend());
/// ```
#[derive(Clone)]
pub struct TimeSource(Option<Arc<dyn Clock + Send + Sync>>);

impl TimeSource {
    /// The backend's clock.
    ///
    /// ```
    /// assert!(bucket4rs_distributed::TimeSource::backend().is_backend());
    /// ```
    pub fn backend() -> Self {
        Self(None)
    }

    /// The given client clock.
    ///
    /// ```
    /// # use bucket4rs_distributed::TimeSource;
    /// let t = TimeSource::client(bucket4rs_core::SystemNanosClock);
    /// # assert!(!t.is_backend());
    /// ```
    pub fn client(clock: impl Clock + Send + Sync + 'static) -> Self {
        Self(Some(Arc::new(clock)))
    }

    /// Whether this is the backend's clock.
    ///
    /// ```
    /// assert!(bucket4rs_distributed::TimeSource::backend().is_backend());
    /// ```
    pub fn is_backend(&self) -> bool {
        self.0.is_none()
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
/// assert_eq!(r.max_attempts(), 5);
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
    /// assert_eq!(RetryPolicy::new(0, Duration::ZERO, Duration::ZERO).max_attempts(), 1);
    /// ```
    pub fn new(max_attempts: u32, base: Duration, max_backoff: Duration) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            base,
            max_backoff,
        }
    }

    /// The attempt limit.
    ///
    /// ```
    /// # use bucket4rs_distributed::RetryPolicy;
    /// assert_eq!(RetryPolicy::default().max_attempts(), 10);
    /// ```
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
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

struct Inner<B> {
    backend: B,
    keys: KeyPolicy,
    time: TimeSource,
    wall: bool,
    timeout: Duration,
    retry: RetryPolicy,
    ttl_margin: Duration,
    batching: Batching,
    /// Keys with an operation in flight through the batching path, and what queued behind it.
    lanes: DashMap<StorageKey, Lane>,
}

/// Per-key request batching (group commit) of a [`ProxyManager`]; see
/// [`ManagerBuilder::batching`].
///
/// While an operation on a key is in flight to the backend, further operations on the same
/// key from the same manager queue up; when it completes, the queued ones (at most
/// [`max_batch_size`](Self::max_batch_size)) go to the backend together as **one**
/// transaction that applies them in arrival order, each getting exactly the result it would
/// have got alone at that instant. An idle key sends its first operation at once.
///
/// ```
/// use bucket4rs_distributed::Batching;
/// assert!(Batching::default().is_enabled());
/// assert_eq!(Batching::up_to(16).max_batch_size(), 16);
/// assert!(!Batching::disabled().is_enabled());
/// assert!(!Batching::up_to(1).is_enabled());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Batching {
    max: usize,
}

impl Batching {
    /// The default largest batch.
    pub const DEFAULT_MAX_BATCH: usize = 64;

    /// No batching: every operation is its own backend transaction, sent at once.
    ///
    /// ```
    /// assert_eq!(bucket4rs_distributed::Batching::disabled().max_batch_size(), 1);
    /// ```
    pub const fn disabled() -> Self {
        Self { max: 1 }
    }

    /// Batches of at most `max_batch_size` operations (0 and 1 disable batching).
    ///
    /// ```
    /// assert!(bucket4rs_distributed::Batching::up_to(8).is_enabled());
    /// ```
    pub const fn up_to(max_batch_size: usize) -> Self {
        Self {
            max: if max_batch_size == 0 {
                1
            } else {
                max_batch_size
            },
        }
    }

    /// Whether operations are batched.
    ///
    /// ```
    /// assert!(!bucket4rs_distributed::Batching::disabled().is_enabled());
    /// ```
    pub const fn is_enabled(&self) -> bool {
        self.max > 1
    }

    /// The largest number of operations sent in one transaction.
    ///
    /// ```
    /// assert_eq!(bucket4rs_distributed::Batching::default().max_batch_size(), 64);
    /// ```
    pub const fn max_batch_size(&self) -> usize {
        self.max
    }
}

impl Default for Batching {
    /// On, at most [`DEFAULT_MAX_BATCH`](Self::DEFAULT_MAX_BATCH) operations per batch.
    fn default() -> Self {
        Self::up_to(Self::DEFAULT_MAX_BATCH)
    }
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
    batching: Batching,
}

impl<B: Backend> ManagerBuilder<B> {
    /// Per-key request batching (default: on, [`Batching::default`]).
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
    /// # use bucket4rs_distributed::{Batching, EmbeddedBackend, ProxyManager};
    /// let m = ProxyManager::configure(EmbeddedBackend::new())
    ///     .batching(Batching::up_to(32))
    ///     .build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn batching(mut self, batching: Batching) -> Self {
        self.batching = batching;
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

    /// The longest storage key, in bytes (default 512).
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

    /// The longest any call may take, retries included (default 1 s). Always finite.
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

    /// The retry policy (default [`RetryPolicy::default`]).
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

    /// Builds the manager.
    ///
    /// # Errors
    /// [`DistributedError::Key`] for an invalid prefix; [`DistributedError::Backend`] when
    /// the backend clock is asked for but the backend has none.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let m = ProxyManager::configure(EmbeddedBackend::new()).build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn build(self) -> Result<ProxyManager<B>, DistributedError> {
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
        Ok(ProxyManager {
            inner: Arc::new(Inner {
                backend: self.backend,
                keys,
                time,
                wall,
                timeout: self.timeout,
                retry: self.retry,
                ttl_margin: self.ttl_margin,
                batching: self.batching,
                lanes: DashMap::new(),
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
///     .add_limit(Bandwidth::simple(3, Duration::from_secs(60))?)
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
            batching: Batching::default(),
        }
    }

    /// Starts building a remote bucket.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(&self) -> RemoteBucketBuilder<B> {
        RemoteBucketBuilder {
            manager: self.clone(),
        }
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

    /// The bucket of `key` for synchronous calls, when the backend can run a transaction
    /// synchronously ([`Backend::supports_transact_now`], e.g. the [`EmbeddedBackend`](crate::EmbeddedBackend));
    /// `None` otherwise: use [`builder`](Self::builder).
    ///
    /// The same transactions as a [`RemoteBucket`]'s with the same results, run at once on
    /// the calling thread ([`Backend::transact_now`]): no future, no key or supplier
    /// allocation (the key is encoded on the stack when short, `configuration` is borrowed
    /// and cloned only when the key has no bucket yet). For hot paths such as a
    /// per-request limiter in an HTTP layer.
    ///
    /// On an [`EmbeddedBackend`](crate::EmbeddedBackend) with the backend's clock (the
    /// default [`TimeSource`]), the `*_with` consumptions of a live key skip even the
    /// transaction: the operation runs on the key's record in place, with the steps and
    /// results of the transaction it stands for.
    ///
    /// # Errors
    /// [`DistributedError::Key`] when the key is too long.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.in_process_bucket("user-42", &config)?.expect("embedded is in-process");
    /// let v = bucket.try_consume_and_return_remaining(2)?;
    /// assert!(v.value.is_consumed());
    /// assert_eq!(v.state.bandwidths()[0].tokens(), 1);
    /// assert_eq!(bucket.key().as_str(), "bucket4rs:user-42");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_process_bucket<'a>(
        &'a self,
        key: impl AsRef<[u8]>,
        configuration: &'a BucketConfiguration,
    ) -> Result<Option<InProcessBucket<'a, B>>, DistributedError> {
        if !self.inner.backend.supports_transact_now() {
            return Ok(None);
        }
        let key = self.inner.keys.encode(key.as_ref())?;
        Ok(Some(InProcessBucket {
            manager: self,
            key,
            configuration,
        }))
    }

    /// Whether consumptions of a live key run in place, so that
    /// [`try_consume_live_with`](Self::try_consume_live_with) can answer `Some`: an
    /// [`EmbeddedBackend`] with the backend's clock (the default [`TimeSource`]).
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager, TimeSource};
    /// assert!(ProxyManager::new(EmbeddedBackend::new()).runs_in_place());
    /// let client_clock = ProxyManager::configure(EmbeddedBackend::new())
    ///     .time_source(TimeSource::client(bucket4rs_core::SystemNanosClock))
    ///     .build()?;
    /// assert!(!client_clock.runs_in_place());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn runs_in_place(&self) -> bool {
        self.in_place_backend().is_some()
    }

    /// The backend, when consumptions run in place on it: an [`EmbeddedBackend`] at its
    /// own clock. The one test behind both [`runs_in_place`](Self::runs_in_place) and
    /// [`in_place`](Self::in_place), so that what the first promises the second does.
    #[inline]
    fn in_place_backend(&self) -> Option<&EmbeddedBackend> {
        if self.inner.time.0.is_some() {
            return None;
        }
        (&self.inner.backend as &dyn core::any::Any).downcast_ref::<EmbeddedBackend>()
    }

    /// [`InProcessBucket::try_consume_with`] on the *live* bucket of `key`, under whatever
    /// configuration it holds, without naming one. `select` sees that configuration first:
    /// its `None` leaves the bucket untouched; with `Some(p)` the tokens are consumed and
    /// `f` is given `p` and the result, configuration and state, as `try_consume_with`
    /// lends them.
    ///
    /// `Ok(None)`, with nothing changed and `f` not called, when `select` declines, the key
    /// has no live bucket (absent or expired), or the in-place path does not apply
    /// ([`runs_in_place`](Self::runs_in_place) is false). The caller then takes
    /// [`in_process_bucket`](Self::in_process_bucket) (or [`builder`](Self::builder)), which
    /// creates the bucket.
    ///
    /// For a caller that learns what it needs from the bucket itself: an HTTP layer whose
    /// plan of a key never changes finds a known client's plan from its bucket's
    /// configuration, and so looks the key up once rather than once in its plan table and
    /// once here. The operation on a live bucket is `try_consume_with`'s (the configuration
    /// given to a transaction only ever creates a bucket), with the same results, state and
    /// expiry.
    ///
    /// # Errors
    /// [`DistributedError::Key`] when the key is too long, and those of `try_consume`
    /// (`tokens` of 0); nothing is then changed and neither closure called.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let capacity = |c: &BucketConfiguration| Some(c.bandwidths()[0].capacity());
    /// // No bucket yet: nothing runs.
    /// assert_eq!(manager.try_consume_live_with("k", 1, capacity, |_, v| v.value)?, None);
    /// manager.in_process_bucket("k", &config)?.unwrap().try_consume(1)?;
    /// let seen = manager.try_consume_live_with("k", 1, capacity, |capacity, v| {
    ///     (capacity, v.state.bandwidths()[0].tokens())
    /// })?;
    /// assert_eq!(seen, Some((3, 1)));
    /// // Declined: the bucket is left as it is.
    /// assert_eq!(manager.try_consume_live_with("k", 1, |_| None::<()>, |_, v| v.value)?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_live_with<P, R>(
        &self,
        key: impl AsRef<[u8]>,
        tokens: u64,
        select: impl FnOnce(&BucketConfiguration) -> Option<P>,
        f: impl FnOnce(P, VerboseRef<'_, bool>) -> R,
    ) -> Result<Option<R>, DistributedError> {
        let op = ops::TryConsume(tokens);
        op.validate()?;
        let key = self.inner.keys.encode(key.as_ref())?;
        self.in_place(key.as_bytes(), &op, select, f).transpose()
    }

    /// [`try_consume_live_with`](Self::try_consume_live_with) with a shortcut for a
    /// per-request hot path. When the *live* bucket of `key` holds one bandwidth and at
    /// least `tokens + leave` tokens are available (after refill), `tokens` are taken and
    /// the answer is [`LiveTake::Taken`]: what `select` chose from the configuration, and
    /// the tokens left (at least `leave`). Any other live bucket that `select` accepts (a
    /// refusal, fewer than `leave` left, several bandwidths) runs `try_consume(tokens)` as
    /// `try_consume_live_with` does, and the answer is [`LiveTake::Other`] with what
    /// `otherwise` made of the lent result, configuration and state. Either way the state,
    /// results and expiry are those of `try_consume(tokens)`, and the key is looked up
    /// once.
    ///
    /// `Ok(None)`, with nothing changed and neither closure called after `select`, in the
    /// cases of `try_consume_live_with` (no live bucket, `select` declines, the in-place
    /// path does not apply).
    ///
    /// An HTTP layer passes its cost as `leave`, so that the tokens left also cover the
    /// next request of that cost, and its `RateLimit` field needs no wait computed. What
    /// the shortcut spares is code rather than work: no verbose snapshot is lent and no
    /// general operation engine runs (that is out of line, for `Other`), so the path a
    /// server runs for every request is shorter (docs/http-overhead.md, "A path for the
    /// common case").
    ///
    /// # Errors
    /// [`DistributedError::Key`] when the key is too long, and those of `try_consume`
    /// (`tokens` of 0); nothing is then changed and no closure called.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, LiveTake, ProxyManager}; use std::time::Duration;
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(5, Duration::from_secs(60))?).build()?;
    /// let any = |_: &BucketConfiguration| Some(());
    /// let value = |(), v: bucket4rs_distributed::VerboseRef<'_, bool>| v.value;
    /// // No bucket yet: nothing runs.
    /// assert_eq!(manager.try_take_live("k", 2, 0, any, value)?, None);
    /// manager.in_process_bucket("k", &config)?.unwrap().try_consume(1)?;
    /// assert_eq!(manager.try_take_live("k", 2, 0, any, value)?, Some(LiveTake::Taken((), 2)));
    /// // 2 more would leave none, not the 1 asked for: taken the general way.
    /// assert_eq!(manager.try_take_live("k", 2, 1, any, value)?, Some(LiveTake::Other(true)));
    /// // A refusal.
    /// assert_eq!(manager.try_take_live("k", 1, 0, any, value)?, Some(LiveTake::Other(false)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_take_live<P, R>(
        &self,
        key: impl AsRef<[u8]>,
        tokens: u64,
        leave: u64,
        select: impl FnOnce(&BucketConfiguration) -> Option<P>,
        otherwise: impl FnOnce(P, VerboseRef<'_, bool>) -> R,
    ) -> Result<Option<LiveTake<P, R>>, DistributedError> {
        let op = ops::TryConsume(tokens);
        op.validate()?;
        let key = self.inner.keys.encode(key.as_ref())?;
        let Some(backend) = self.in_place_backend() else {
            return Ok(None);
        };
        backend
            .take_live(key.as_bytes(), self.inner.ttl_margin, |record, now| {
                let Some(selected) = select(&record.config) else {
                    return (None, false);
                };
                let format::Record { config, state } = record;
                if let ([_], [s]) = (config.bandwidths(), state.bandwidths_mut()) {
                    // The refilled state with `tokens` taken, if it has them (the
                    // single-bandwidth step of the engine `run_op` runs), kept when `leave`
                    // are left.
                    if let Some(Ok((true, Some(new)))) = ops::plan_one(&op, config, now, || *s) {
                        if let Ok(left) = u64::try_from(new.tokens()) {
                            if left >= leave {
                                *s = new;
                                #[cfg(test)]
                                tests::TAKE_RUNS.with(|n| n.set(n.get() + 1));
                                return (Some(Ok(LiveTake::Taken(selected, left))), true);
                            }
                        }
                    }
                }
                take_otherwise(&op, record, now, selected, otherwise)
            })
            .flatten()
            .transpose()
    }

    /// `op` on the live record of `key` (encoded) of an [`EmbeddedBackend`] without a
    /// transaction, when the manager computes at the backend's clock, `op` only takes
    /// tokens and `select` accepts the record's configuration: the steps (and results) of
    /// the transaction [`InProcessBucket::op_with`] runs otherwise, whose backend would
    /// answer [`DecodedWrite::Consumed`] or [`DecodedWrite::Keep`]. `None`, with nothing
    /// run, in any other case (another backend or clock, another operation, an absent or
    /// expired key, a configuration `select` declines).
    #[inline]
    fn in_place<O, P, R>(
        &self,
        key: &[u8],
        op: &O,
        select: impl FnOnce(&BucketConfiguration) -> Option<P>,
        f: impl FnOnce(P, VerboseRef<'_, O::Output>) -> R,
    ) -> Option<Result<R, DistributedError>>
    where
        O: RemoteOp,
    {
        if !only_takes_tokens(op.command()) {
            return None;
        }
        self.in_place_backend()?
            .take_live(key, self.inner.ttl_margin, |record, now| {
                let Some(selected) = select(&record.config) else {
                    return (None, false);
                };
                run_lent(op, record, now, selected, f)
            })
            .flatten()
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
        inner.call(|| inner.backend.remove(&key)).await
    }

    /// The stored configuration of a key, if it has a bucket.
    ///
    /// # Errors
    /// Key, format, timeout and backend errors.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// assert_eq!(manager.configuration("nobody").await?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn configuration(
        &self,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<BucketConfiguration>, DistributedError> {
        let key = self.storage_key(key)?;
        Ok(self.read_record(&key).await?.map(|r| r.config))
    }

    async fn read_record(
        &self,
        key: &StorageKey,
    ) -> Result<Option<format::Record>, DistributedError> {
        let inner = &self.inner;
        let bytes = inner.call(|| inner.backend.read(key)).await?;
        match bytes {
            None => Ok(None),
            Some(b) => Ok(Some(format::decode(&b)?)),
        }
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
        // Boxed (one allocation next to a network round trip): the timer and the retry
        // sleep would otherwise be part of every call's future, in-process ones too.
        Box::pin(with_timeout(inner.timeout, async {
            let mut attempt = 0;
            loop {
                match inner.backend.transact(key, tx).await {
                    Ok(()) => return Ok(()),
                    Err(e) if e.is_retryable() && attempt + 1 < inner.retry.max_attempts => {
                        tokio::time::sleep(inner.retry.backoff(attempt)).await;
                        attempt += 1;
                    }
                    Err(e) => return Err(backend_error(e)),
                }
            }
        }))
        .await
    }
}

impl<B: Backend> Inner<B> {
    /// One backend call: bounded by the timeout and retried when retryable, except on an
    /// in-process backend (which never waits and whose errors are final).
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, DistributedError>
    where
        F: FnMut() -> Fut,
        Fut: core::future::Future<Output = Result<T, BackendError>>,
    {
        if self.backend.is_in_process() {
            let mut f = f;
            return f().await.map_err(backend_error);
        }
        with_timeout(self.timeout, async { retrying(&self.retry, f).await }).await
    }
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

async fn with_timeout<T>(
    timeout: Duration,
    fut: impl core::future::Future<Output = Result<T, DistributedError>>,
) -> Result<T, DistributedError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(DistributedError::Timeout { after: timeout }),
    }
}

type Supplier = Arc<dyn Fn() -> BucketConfiguration + Send + Sync>;

/// Builds [`RemoteBucket`]s; from [`ProxyManager::builder`].
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct RemoteBucketBuilder<B> {
    manager: ProxyManager<B>,
}

impl<B: Backend> RemoteBucketBuilder<B> {
    /// The remote bucket of `key`. `configuration` is called only when the key has no
    /// stored state yet (first use, or after expiry or removal); afterwards the stored
    /// configuration rules until [`RemoteBucket::replace_configuration`].
    ///
    /// No round trip happens here.
    ///
    /// # Errors
    /// [`DistributedError::Key`] when the key is too long.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// assert!(manager.builder().build([b'k'; 1000], move || config.clone()).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(
        self,
        key: impl AsRef<[u8]>,
        configuration: impl Fn() -> BucketConfiguration + Send + Sync + 'static,
    ) -> Result<RemoteBucket<B>, DistributedError> {
        let key = self.manager.storage_key(key)?;
        Ok(RemoteBucket {
            manager: self.manager,
            key,
            supplier: Arc::new(configuration),
        })
    }
}

/// A bucket of an in-process backend called synchronously; from
/// [`ProxyManager::in_process_bucket`].
///
/// Its operations are those of [`RemoteBucket`], in their verbose form, without `async`:
/// each runs one transaction through [`Backend::transact_now`] (or, for the `*_with`
/// consumptions of a live [`EmbeddedBackend`](crate::EmbeddedBackend) key at the backend's
/// clock, the same steps in place, see [`ProxyManager::in_process_bucket`]) and returns the
/// same [`Verbose`] result the async call would.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// let manager = ProxyManager::new(EmbeddedBackend::new());
/// let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
/// if let Some(bucket) = manager.in_process_bucket("k", &config)? {
///     assert!(bucket.try_consume(3)?.value);
///     assert!(!bucket.try_consume(1)?.value);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct InProcessBucket<'a, B> {
    manager: &'a ProxyManager<B>,
    key: EncodedKey,
    configuration: &'a BucketConfiguration,
}

impl<B: fmt::Debug> fmt::Debug for InProcessBucket<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessBucket")
            .field("key", &self.key.as_key_ref())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> InProcessBucket<'_, B> {
    /// The storage key.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.in_process_bucket("k", &config)?.unwrap();
    /// assert_eq!(bucket.key().as_str(), "bucket4rs:k");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(&self) -> StorageKeyRef<'_> {
        self.key.as_key_ref()
    }

    /// [`try_consume_and_return_remaining`](Self::try_consume_and_return_remaining) with the
    /// result, configuration and state lent to `f` rather than cloned into a [`Verbose`]
    /// (no allocation for the state): `f`'s answer is returned.
    ///
    /// `f` runs while the backend holds the key (keep it short, and do not use this bucket's
    /// key from it); a backend that retries a transaction may call it more than once, and
    /// only the last answer is returned. It is not called when the operation fails.
    ///
    /// # Errors
    /// As `try_consume_and_return_remaining`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.in_process_bucket("k", &config)?.unwrap();
    /// let left = bucket.try_consume_and_return_remaining_with(2, |v| {
    ///     assert!(v.value.is_consumed());
    ///     v.state.bandwidths()[0].tokens()
    /// })?;
    /// assert_eq!(left, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_and_return_remaining_with<R: Send>(
        &self,
        tokens: u64,
        f: impl FnMut(VerboseRef<'_, ConsumptionProbe>) -> R + Send,
    ) -> Result<R, DistributedError> {
        self.op_with(ops::TryConsumeAndReturnRemaining(tokens), f)
    }

    /// [`try_consume`](Self::try_consume) with the result, configuration and state lent to
    /// `f` rather than cloned into a [`Verbose`], as
    /// [`try_consume_and_return_remaining_with`](Self::try_consume_and_return_remaining_with)
    /// does: for a caller that derives what it needs from the state, without the probe's
    /// waits. The state is refilled to `now_nanos` when the tokens were consumed, and left
    /// as stored when they were not (refill it with `bucket4rs_core::ops::Refilled`).
    ///
    /// # Errors
    /// As `try_consume`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.in_process_bucket("k", &config)?.unwrap();
    /// let left = bucket.try_consume_with(2, |v| v.value.then(|| v.state.bandwidths()[0].tokens()))?;
    /// assert_eq!(left, Some(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_with<R: Send>(
        &self,
        tokens: u64,
        f: impl FnMut(VerboseRef<'_, bool>) -> R + Send,
    ) -> Result<R, DistributedError> {
        self.op_with(ops::TryConsume(tokens), f)
    }

    /// `op` with its verbose result lent to `f`.
    fn op_with<O, R, F>(&self, op: O, f: F) -> Result<R, DistributedError>
    where
        O: RemoteOp,
        O::Output: Send + Sync,
        R: Send,
        F: FnMut(VerboseRef<'_, O::Output>) -> R + Send,
    {
        op.validate()?;
        let mut f = f;
        if let Some(done) = self.in_place(&op, &mut f) {
            return done;
        }
        self.op_with_tx(op, f)
    }

    /// [`op_with`](Self::op_with) through a transaction. Out of line: a live key of the
    /// embedded backend does not need it, and the in-place path stays compact.
    #[inline(never)]
    fn op_with_tx<O, R, F>(&self, op: O, f: F) -> Result<R, DistributedError>
    where
        O: RemoteOp,
        O::Output: Send + Sync,
        R: Send,
        F: FnMut(VerboseRef<'_, O::Output>) -> R + Send,
    {
        let config = self.configuration;
        let supplier = move || config.clone();
        let mut tx = InspectTx {
            tx: self.tx(op, &supplier),
            f,
            out: None,
        };
        self.transact(&mut tx)?;
        tx.out.unwrap_or_else(|| Err(not_run()))
    }

    /// `op` on the live record in place when that applies ([`ProxyManager::in_place`]).
    #[inline]
    fn in_place<O, R, F>(&self, op: &O, f: &mut F) -> Option<Result<R, DistributedError>>
    where
        O: RemoteOp,
        F: FnMut(VerboseRef<'_, O::Output>) -> R,
    {
        self.manager
            .in_place(self.key.as_bytes(), op, |_| Some(()), |(), v| f(v))
    }

    fn tx<'s, O>(
        &'s self,
        op: O,
        supplier: &'s (dyn Fn() -> BucketConfiguration + Send + Sync),
    ) -> OpTx<'s, OpJob<O>>
    where
        O: RemoteOp,
        O::Output: Send + Sync,
    {
        let inner = &self.manager.inner;
        OpTx {
            command: op.command(),
            job: OpJob(op),
            supplier,
            clock: inner.time.0.as_deref(),
            wall: inner.wall,
            margin: inner.ttl_margin,
            out: None,
        }
    }

    fn transact(&self, tx: &mut dyn Transaction) -> Result<(), DistributedError> {
        match self
            .manager
            .inner
            .backend
            .transact_now(self.key.as_key_ref(), tx)
        {
            Some(r) => r.map_err(backend_error),
            None => Err(DistributedError::Backend(BackendError::new(
                BackendErrorKind::Other,
                "the backend does not run transactions synchronously (Backend::transact_now)",
            ))),
        }
    }

    fn op<O>(&self, op: O) -> Result<Verbose<O::Output>, DistributedError>
    where
        O: RemoteOp,
        O::Output: Send + Sync,
    {
        op.validate()?;
        let config = self.configuration;
        let supplier = move || config.clone();
        let mut tx = self.tx(op, &supplier);
        self.transact(&mut tx)?;
        tx.out.unwrap_or_else(|| Err(not_run()))
    }
}

/// An operation's result together with the configuration and state it left behind.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?;
/// let v = bucket.verbose().try_consume(1).await?;
/// assert!(v.value);
/// assert_eq!(v.state.bandwidths()[0].tokens(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verbose<T> {
    /// The operation's result.
    pub value: T,
    /// The configuration in force.
    pub configuration: BucketConfiguration,
    /// The state after the operation (refilled to the operation's `now` where it wrote).
    pub state: BucketState,
    /// The clock reading the operation ran at.
    pub now_nanos: i64,
}

impl<T> Verbose<T> {
    /// The same snapshot with the result mapped by `f`.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.in_process_bucket("k", &config)?.unwrap();
    /// let v = bucket.try_consume(1)?.map(|consumed| if consumed { "yes" } else { "no" });
    /// assert_eq!((v.value, v.state.bandwidths()[0].tokens()), ("yes", 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Verbose<U> {
        Verbose {
            value: f(self.value),
            configuration: self.configuration,
            state: self.state,
            now_nanos: self.now_nanos,
        }
    }
}

/// An operation's result with the configuration and state it left behind, lent for the
/// duration of a callback ([`InProcessBucket::try_consume_and_return_remaining_with`]).
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager, Verbose}; use std::time::Duration;
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
/// let bucket = manager.in_process_bucket("k", &config)?.unwrap();
/// let owned: Verbose<_> = bucket.try_consume_and_return_remaining_with(1, |v| v.to_verbose())?;
/// assert_eq!(owned.configuration, config);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerboseRef<'r, T> {
    /// The operation's result.
    pub value: T,
    /// The configuration in force.
    pub configuration: &'r BucketConfiguration,
    /// The state after the operation (refilled to the operation's `now` where it wrote).
    pub state: &'r BucketState,
    /// The clock reading the operation ran at.
    pub now_nanos: i64,
}

impl<T: Clone> VerboseRef<'_, T> {
    /// An owned copy (clones the configuration and the state).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.in_process_bucket("k", &config)?.unwrap();
    /// let v = bucket.try_consume_and_return_remaining_with(1, |v| v.to_verbose())?;
    /// assert_eq!(v.state.bandwidths()[0].tokens(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn to_verbose(&self) -> Verbose<T> {
        Verbose {
            value: self.value.clone(),
            configuration: self.configuration.clone(),
            state: self.state.clone(),
            now_nanos: self.now_nanos,
        }
    }
}

/// A bucket stored in a backend, with the local bucket API.
///
/// Every call is one atomic transaction on the backend, bounded by the manager's timeout.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(10, Duration::from_secs(60))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?;
/// let probe = bucket.try_consume_and_return_remaining(4).await?;
/// assert!(probe.is_consumed());
/// assert_eq!(probe.remaining_tokens(), 6);
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RemoteBucket<B> {
    manager: ProxyManager<B>,
    key: StorageKey,
    supplier: Supplier,
}

impl<B> Clone for RemoteBucket<B> {
    fn clone(&self) -> Self {
        Self {
            manager: self.manager.clone(),
            key: self.key.clone(),
            supplier: Arc::clone(&self.supplier),
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for RemoteBucket<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteBucket")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// The core operations a remote bucket runs, with the command a native backend sees.
trait RemoteOp: Operation + Send + Sync {
    fn command(&self) -> Command;
    fn validate(&self) -> Result<(), OperationError>;
}

fn nonzero(n: u64) -> Result<(), OperationError> {
    if n == 0 {
        Err(OperationError::ZeroTokens)
    } else {
        Ok(())
    }
}

macro_rules! remote_op {
    ($t:ty, |$s:ident| $cmd:expr, $check:expr) => {
        impl RemoteOp for $t {
            fn command(&self) -> Command {
                let $s = self;
                let _ = $s;
                $cmd
            }
            fn validate(&self) -> Result<(), OperationError> {
                let $s = self;
                let _ = $s;
                $check
            }
        }
    };
}

remote_op!(ops::TryConsume, |s| Command::TryConsume(s.0), nonzero(s.0));
remote_op!(
    ops::TryConsumeAndReturnRemaining,
    |s| Command::TryConsumeAndReturnRemaining(s.0),
    nonzero(s.0)
);
remote_op!(
    ops::EstimateAbilityToConsume,
    |s| Command::EstimateAbilityToConsume(s.0),
    nonzero(s.0)
);
remote_op!(
    ops::TryConsumeAsMuchAsPossible,
    |s| Command::TryConsumeAsMuchAsPossible(s.0),
    if s.0 == Some(0) {
        Err(OperationError::ZeroLimit)
    } else {
        Ok(())
    }
);
remote_op!(ops::AddTokens, |s| Command::AddTokens(s.0), nonzero(s.0));
remote_op!(
    ops::ForceAddTokens,
    |s| Command::ForceAddTokens(s.0),
    nonzero(s.0)
);
remote_op!(ops::Reset, |s| Command::Reset, Ok(()));
remote_op!(ops::AvailableTokens, |s| Command::AvailableTokens, Ok(()));
remote_op!(
    ops::ConsumeIgnoringRateLimits,
    |s| Command::ConsumeIgnoringRateLimits(s.0),
    nonzero(s.0)
);
remote_op!(
    ops::Reserve,
    |s| Command::Reserve {
        tokens: s.tokens,
        max_wait_nanos: s.max_wait_nanos
    },
    if s.max_wait_nanos == 0 {
        nonzero(s.tokens).and(Err(OperationError::ZeroMaxWait))
    } else {
        nonzero(s.tokens)
    }
);

/// What a transaction does to a decoded (or freshly created) record, in place.
trait Job: Send + Sync {
    type Output: Send + Sync;
    /// The output and whether the record changed. On an error `record` is left untouched.
    fn run(
        &self,
        record: &mut format::Record,
        now: i64,
        wall: bool,
    ) -> Result<(Self::Output, bool), DistributedError>;
}

struct OpJob<O>(O);

impl<O> Job for OpJob<O>
where
    O: Operation + Send + Sync,
    O::Output: Send + Sync,
{
    type Output = O::Output;
    fn run(
        &self,
        record: &mut format::Record,
        now: i64,
        _wall: bool,
    ) -> Result<(O::Output, bool), DistributedError> {
        run_op(&self.0, record, now)
    }
}

/// `op` on `record` at `now`: its output and whether it wrote the state. On an error
/// `record` is left untouched.
fn run_op<O: Operation>(
    op: &O,
    record: &mut format::Record,
    now: i64,
) -> Result<(O::Output, bool), DistributedError> {
    let format::Record { config, state } = record;
    if state.bandwidths().len() != config.bandwidths().len() {
        return Err(OperationError::StateMismatch.into());
    }
    // `execute` computes everything before its first write, so an error leaves the
    // state untouched.
    let cells = core::cell::Cell::from_mut(state.bandwidths_mut()).as_slice_of_cells();
    let mut wrote = false;
    let value = ops::execute(
        op,
        config,
        now,
        |i| cells[i].get(),
        |i, s| {
            cells[i].set(s);
            wrote = true;
        },
    )?;
    Ok((value, wrote))
}

/// What [`ProxyManager::try_take_live`] answers for a live bucket `select` accepted.
type LiveResult<P, R> = Result<LiveTake<P, R>, DistributedError>;

/// The in-place step of [`ProxyManager::in_place`]: `op` run on the live record at `now`,
/// its result, the configuration and the state lent to `f` with what `select` chose
/// (`selected`); the answer for [`EmbeddedBackend::take_live`], whether the state changed
/// with it.
#[inline]
fn run_lent<O: Operation, P, R>(
    op: &O,
    record: &mut format::Record,
    now: i64,
    selected: P,
    f: impl FnOnce(P, VerboseRef<'_, O::Output>) -> R,
) -> (Option<Result<R, DistributedError>>, bool) {
    #[cfg(test)]
    tests::IN_PLACE_RUNS.with(|n| n.set(n.get() + 1));
    match run_op(op, record, now) {
        Ok((value, took)) => {
            let out = f(
                selected,
                VerboseRef {
                    value,
                    configuration: &record.config,
                    state: &record.state,
                    now_nanos: now,
                },
            );
            (Some(Ok(out)), took)
        }
        Err(e) => (Some(Err(e)), false),
    }
}

/// [`ProxyManager::try_take_live`] past its shortcut: `op` run on the record as
/// [`ProxyManager::try_consume_live_with`] runs it ([`run_lent`]), the answer
/// [`LiveTake::Other`]. Out of line, so that the shortcut's code stays compact.
#[inline(never)]
fn take_otherwise<P, R>(
    op: &ops::TryConsume,
    record: &mut format::Record,
    now: i64,
    selected: P,
    f: impl FnOnce(P, VerboseRef<'_, bool>) -> R,
) -> (Option<LiveResult<P, R>>, bool) {
    let (out, took) = run_lent(op, record, now, selected, f);
    (out.map(|r| r.map(LiveTake::Other)), took)
}

/// What [`ProxyManager::try_take_live`] did with a live bucket.
///
/// ```
/// use bucket4rs_distributed::LiveTake;
/// let taken: LiveTake<&str, bool> = LiveTake::Taken("free", 19);
/// assert!(matches!(taken, LiveTake::Taken(_, 19)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveTake<P, R> {
    /// The shortcut: the tokens were taken and at least `leave` are left. What `select`
    /// chose, and the tokens left.
    Taken(P, u64),
    /// Anything else `select` accepted (a refusal included), run as
    /// [`ProxyManager::try_consume_live_with`] runs it: what `otherwise` answered.
    Other(R),
}

struct ReplaceJob(BucketConfiguration, TokensInheritanceStrategy);

impl Job for ReplaceJob {
    type Output = ();
    fn run(
        &self,
        record: &mut format::Record,
        now: i64,
        wall: bool,
    ) -> Result<((), bool), DistributedError> {
        format::check_storable(&self.0)?;
        let new = record
            .state
            .replace_configuration(&record.config, &self.0, now, self.1, wall)?;
        record.config = self.0.clone();
        record.state = new;
        Ok(((), true))
    }
}

struct OpTx<'a, J: Job> {
    job: J,
    command: Command,
    supplier: &'a (dyn Fn() -> BucketConfiguration + Send + Sync),
    clock: Option<&'a (dyn Clock + Send + Sync)>,
    wall: bool,
    margin: Duration,
    out: Option<Result<Verbose<J::Output>, DistributedError>>,
}

/// The TTL of a stored state: time until every bandwidth is full, plus the margin.
pub(crate) fn ttl_of(
    config: &BucketConfiguration,
    state: &BucketState,
    now: i64,
    margin: Duration,
) -> Option<Duration> {
    let b = state.bandwidths();
    let wait =
        ops::Refilled::new(config, now, |i| b.get(i).copied().unwrap_or_default()).reset_wait(0);
    if wait >= bucket4rs_core::MAX_NANOS {
        None
    } else {
        Some(Duration::from_nanos(wait).saturating_add(margin))
    }
}

impl<J: Job> Transaction for OpTx<'_, J> {
    fn command(&self) -> Command {
        self.command
    }

    fn needs_backend_clock(&self) -> bool {
        self.clock.is_none()
    }

    fn ttl_margin(&self) -> Duration {
        self.margin
    }

    fn client_now(&self) -> Option<i64> {
        self.clock.map(|c| c.now_nanos())
    }

    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> Write {
        let (write, out) = self.run_bytes(current, backend_now);
        self.out = Some(out);
        write
    }

    fn apply_decoded(
        &mut self,
        current: Option<&mut format::Record>,
        backend_now: Option<i64>,
    ) -> DecodedWrite {
        let (write, out) = self.run_decoded(current, backend_now, false);
        self.out = Some(out);
        write
    }

    fn apply_decoded_lazy(
        &mut self,
        current: Option<&mut format::Record>,
        backend_now: Option<i64>,
    ) -> DecodedWrite {
        let (write, out) = self.run_decoded(current, backend_now, true);
        self.out = Some(out);
        write
    }
}

/// Whether `command` only takes tokens when it writes (after refilling to its instant),
/// with the configuration unchanged: then the instant the bucket is full again does not
/// move earlier (fewer tokens never fill up sooner), so a previous expiry of the key is a
/// lower bound of the new one ([`DecodedWrite::Consumed`]).
fn only_takes_tokens(command: Command) -> bool {
    matches!(
        command,
        Command::TryConsume(_)
            | Command::TryConsumeAndReturnRemaining(_)
            | Command::TryConsumeAsMuchAsPossible(_)
            | Command::ConsumeIgnoringRateLimits(_)
            | Command::Reserve { .. }
    )
}

type Outcome<T> = Result<Verbose<T>, DistributedError>;

/// A new record from `supplier` (the key has none).
fn create_record(
    supplier: &(dyn Fn() -> BucketConfiguration + Send + Sync),
    now: i64,
    wall: bool,
) -> Result<format::Record, DistributedError> {
    let config = supplier();
    config.check_clock(wall)?;
    format::check_storable(&config)?;
    let state = BucketState::new(&config, now);
    Ok(format::Record { config, state })
}

impl<J: Job> OpTx<'_, J> {
    fn now(&self, backend_now: Option<i64>) -> Result<i64, DistributedError> {
        match (backend_now, self.clock) {
            (Some(n), _) => Ok(n),
            (None, Some(c)) => Ok(c.now_nanos()),
            (None, None) => Err(DistributedError::Backend(BackendError::new(
                BackendErrorKind::Protocol,
                "the backend did not pass its clock reading",
            ))),
        }
    }

    /// A new record from the supplier (the key has none).
    fn create(&self, now: i64) -> Result<format::Record, DistributedError> {
        create_record(self.supplier, now, self.wall)
    }

    fn run_bytes(
        &self,
        current: Option<&[u8]>,
        backend_now: Option<i64>,
    ) -> (Write, Outcome<J::Output>) {
        let now = match self.now(backend_now) {
            Ok(n) => n,
            Err(e) => return (Write::Keep, Err(e)),
        };
        let (mut record, created) = match current {
            None => match self.create(now) {
                Ok(r) => (r, true),
                Err(e) => return (Write::Keep, Err(e)),
            },
            Some(bytes) => match format::decode(bytes) {
                Ok(r) => (r, false),
                Err(e) => return (Write::Keep, Err(e.into())),
            },
        };
        let (value, wrote) = match self.job.run(&mut record, now, self.wall) {
            Ok(r) => r,
            Err(e) => return (Write::Keep, Err(e)),
        };
        let write = if wrote || created {
            Write::Put {
                record: format::encode(&record.config, &record.state),
                ttl: ttl_of(&record.config, &record.state, now, self.margin),
            }
        } else {
            Write::Keep
        };
        let verbose = Verbose {
            value,
            configuration: record.config,
            state: record.state,
            now_nanos: now,
        };
        (write, Ok(verbose))
    }

    /// The same steps as [`run_bytes`](Self::run_bytes) on a record kept decoded: no
    /// decoding, no checksum, no encoding; the TTL is computed only when the state changed.
    fn run_decoded(
        &self,
        current: Option<&mut format::Record>,
        backend_now: Option<i64>,
        lazy: bool,
    ) -> (DecodedWrite, Outcome<J::Output>) {
        self.run_decoded_with(current, backend_now, lazy, |value, record, now| {
            Ok(Verbose {
                value,
                configuration: record.config.clone(),
                state: record.state.clone(),
                now_nanos: now,
            })
        })
    }

    /// [`run_decoded`](Self::run_decoded) with the output made by `out` from the value and
    /// the record it left (borrowed), at the operation's instant.
    ///
    /// With `lazy` (from [`Transaction::apply_decoded_lazy`]), an update by an operation that
    /// only takes tokens is answered with [`DecodedWrite::Consumed`], its TTL uncomputed.
    fn run_decoded_with<T>(
        &self,
        current: Option<&mut format::Record>,
        backend_now: Option<i64>,
        lazy: bool,
        out: impl FnOnce(J::Output, &format::Record, i64) -> Result<T, DistributedError>,
    ) -> (DecodedWrite, Result<T, DistributedError>) {
        let now = match self.now(backend_now) {
            Ok(n) => n,
            Err(e) => return (DecodedWrite::Keep, Err(e)),
        };
        match current {
            Some(record) => match self.job.run(record, now, self.wall) {
                Ok((value, true)) if lazy && only_takes_tokens(self.command) => {
                    let write = DecodedWrite::Consumed {
                        now,
                        margin: self.margin,
                    };
                    (write, out(value, record, now))
                }
                Ok((value, true)) => {
                    let ttl = ttl_of(&record.config, &record.state, now, self.margin);
                    (DecodedWrite::Updated { ttl }, out(value, record, now))
                }
                Ok((value, false)) => (DecodedWrite::Keep, out(value, record, now)),
                Err(e) => (DecodedWrite::Keep, Err(e)),
            },
            None => {
                let mut record = match self.create(now) {
                    Ok(r) => r,
                    Err(e) => return (DecodedWrite::Keep, Err(e)),
                };
                match self.job.run(&mut record, now, self.wall) {
                    Ok((value, _)) => {
                        let ttl = ttl_of(&record.config, &record.state, now, self.margin);
                        let out = out(value, &record, now);
                        (DecodedWrite::Created { record, ttl }, out)
                    }
                    Err(e) => (DecodedWrite::Keep, Err(e)),
                }
            }
        }
    }
}

/// An [`OpTx`] whose result goes to a callback with the record borrowed (no clone of the
/// configuration and state): [`InProcessBucket::try_consume_and_return_remaining_with`].
struct InspectTx<'a, J: Job, F, R> {
    tx: OpTx<'a, J>,
    f: F,
    out: Option<Result<R, DistributedError>>,
}

impl<J, F, R> Transaction for InspectTx<'_, J, F, R>
where
    J: Job,
    F: FnMut(VerboseRef<'_, J::Output>) -> R + Send,
    R: Send,
{
    fn command(&self) -> Command {
        self.tx.command()
    }

    fn needs_backend_clock(&self) -> bool {
        self.tx.needs_backend_clock()
    }

    fn ttl_margin(&self) -> Duration {
        self.tx.ttl_margin()
    }

    fn client_now(&self) -> Option<i64> {
        self.tx.client_now()
    }

    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> Write {
        let (write, out) = self.tx.run_bytes(current, backend_now);
        let f = &mut self.f;
        self.out = Some(out.map(|v| {
            f(VerboseRef {
                value: v.value,
                configuration: &v.configuration,
                state: &v.state,
                now_nanos: v.now_nanos,
            })
        }));
        write
    }

    fn apply_decoded(
        &mut self,
        current: Option<&mut format::Record>,
        backend_now: Option<i64>,
    ) -> DecodedWrite {
        self.run_decoded(current, backend_now, false)
    }

    fn apply_decoded_lazy(
        &mut self,
        current: Option<&mut format::Record>,
        backend_now: Option<i64>,
    ) -> DecodedWrite {
        self.run_decoded(current, backend_now, true)
    }
}

impl<J, F, R> InspectTx<'_, J, F, R>
where
    J: Job,
    F: FnMut(VerboseRef<'_, J::Output>) -> R + Send,
    R: Send,
{
    fn run_decoded(
        &mut self,
        current: Option<&mut format::Record>,
        backend_now: Option<i64>,
        lazy: bool,
    ) -> DecodedWrite {
        let f = &mut self.f;
        let (write, out) =
            self.tx
                .run_decoded_with(current, backend_now, lazy, |value, record, now| {
                    Ok(f(VerboseRef {
                        value,
                        configuration: &record.config,
                        state: &record.state,
                        now_nanos: now,
                    }))
                });
        self.out = Some(out);
        write
    }
}

// ---------------------------------------------------------------------------------------
// Request batching (see `ManagerBuilder::batching` and docs/distributed.md).
//
// A key with an operation in flight through this manager has a `Lane` in `Inner::lanes`.
// The first operation on an idle key inserts the lane and runs alone, at once. Operations
// arriving meanwhile are queued in the lane as type-erased `Pending` items, each with a
// oneshot channel to its caller. When the lane's in-flight work completes (or its caller is
// cancelled), the queue is cut into a batch (closed channels, i.e. withdrawn callers,
// skipped) and a spawned task runs it as ONE `BatchTx`, then the next batch, until the queue
// is empty and the lane is removed, all under the map's shard lock so no item is stranded.

#[derive(Default)]
struct Lane {
    queue: Vec<Box<dyn Queued>>,
}

/// One queued operation with its caller's reply channel, its type erased.
trait Queued: Send + Sync {
    fn command(&self) -> Command;
    /// The caller went away (dropped its future or timed out) before the batch was formed.
    fn is_withdrawn(&self) -> bool;
    /// Runs the operation on `record` at `now` exactly as a lone transaction would (the
    /// supplier creates the record when `None`; on an error the record is left as it was)
    /// and keeps the outcome. Whether the record must be written.
    fn apply(&mut self, record: &mut Option<format::Record>, now: i64, wall: bool) -> bool;
    /// Replaces the outcome with an error (the batch failed as a whole).
    fn fail(&mut self, e: DistributedError);
    /// Sends the outcome to the caller (if it is still there).
    fn deliver(self: Box<Self>);
}

struct Pending<J: Job> {
    job: J,
    command: Command,
    supplier: Supplier,
    out: Option<Outcome<J::Output>>,
    reply: oneshot::Sender<Outcome<J::Output>>,
}

impl<J: Job> Queued for Pending<J> {
    fn command(&self) -> Command {
        self.command
    }

    fn is_withdrawn(&self) -> bool {
        self.reply.is_closed()
    }

    fn apply(&mut self, record: &mut Option<format::Record>, now: i64, wall: bool) -> bool {
        let created = record.is_none();
        let rec = match record {
            Some(r) => r,
            None => match create_record(&*self.supplier, now, wall) {
                Ok(r) => record.insert(r),
                Err(e) => {
                    self.out = Some(Err(e));
                    return false;
                }
            },
        };
        match self.job.run(rec, now, wall) {
            Ok((value, wrote)) => {
                self.out = Some(Ok(Verbose {
                    value,
                    configuration: rec.config.clone(),
                    state: rec.state.clone(),
                    now_nanos: now,
                }));
                wrote || created
            }
            Err(e) => {
                if created {
                    // Alone, this operation would have written nothing: the key stays absent.
                    *record = None;
                }
                self.out = Some(Err(e));
                false
            }
        }
    }

    fn fail(&mut self, e: DistributedError) {
        self.out = Some(Err(e));
    }

    fn deliver(self: Box<Self>) {
        let out = self.out.unwrap_or_else(|| Err(not_run()));
        // A caller that went away meanwhile simply does not read it.
        let _ = self.reply.send(out);
    }
}

/// Several queued operations of one key as one transaction: `apply` runs them in order on
/// the record, at one instant, and writes the final state once.
struct BatchTx<'a> {
    items: &'a mut [Box<dyn Queued>],
    commands: Vec<Command>,
    clock: Option<&'a (dyn Clock + Send + Sync)>,
    wall: bool,
    margin: Duration,
}

impl Transaction for BatchTx<'_> {
    fn command(&self) -> Command {
        match self.commands.as_slice() {
            [one] => *one,
            many => Command::Batch(many.len()),
        }
    }

    fn batch(&self) -> Option<&[Command]> {
        (self.commands.len() > 1).then_some(self.commands.as_slice())
    }

    fn needs_backend_clock(&self) -> bool {
        self.clock.is_none()
    }

    fn client_now(&self) -> Option<i64> {
        self.clock.map(|c| c.now_nanos())
    }

    fn ttl_margin(&self) -> Duration {
        self.margin
    }

    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> Write {
        let now = match (backend_now, self.clock) {
            (Some(n), _) => n,
            (None, Some(c)) => c.now_nanos(),
            (None, None) => {
                for item in self.items.iter_mut() {
                    item.fail(DistributedError::Backend(BackendError::new(
                        BackendErrorKind::Protocol,
                        "the backend did not pass its clock reading",
                    )));
                }
                return Write::Keep;
            }
        };
        let mut record = match current.map(format::decode) {
            None => None,
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => {
                for item in self.items.iter_mut() {
                    item.fail(DistributedError::Format(e.clone()));
                }
                return Write::Keep;
            }
        };
        let mut changed = false;
        for item in self.items.iter_mut() {
            changed |= item.apply(&mut record, now, self.wall);
        }
        match record {
            Some(r) if changed => Write::Put {
                record: format::encode(&r.config, &r.state),
                ttl: ttl_of(&r.config, &r.state, now, self.margin),
            },
            _ => Write::Keep,
        }
    }
}

/// Held by the operation that runs alone on an idle key: when it completes or is dropped,
/// hands the lane's queue to a batch task (or removes the lane when nothing queued).
struct LaneGuard<'a, B: Backend> {
    manager: &'a ProxyManager<B>,
    key: &'a StorageKey,
    handle: tokio::runtime::Handle,
}

impl<B: Backend> Drop for LaneGuard<'_, B> {
    fn drop(&mut self) {
        if let Some(batch) = self.manager.next_batch(self.key) {
            let drain = Drain {
                manager: self.manager.clone(),
                key: self.key.clone(),
                finished: false,
            };
            // On a runtime that is shutting down the task is dropped at once: `Drain`'s
            // drop then releases the lane and the queued callers get an error.
            self.handle.spawn(drain.run(batch));
        }
    }
}

/// The task running a lane's batches until its queue is empty.
struct Drain<B: Backend> {
    manager: ProxyManager<B>,
    key: StorageKey,
    finished: bool,
}

impl<B: Backend> Drain<B> {
    async fn run(mut self, mut batch: Vec<Box<dyn Queued>>) {
        loop {
            self.manager.run_batch(&self.key, &mut batch).await;
            match self.manager.next_batch(&self.key) {
                Some(next) => batch = next,
                None => break,
            }
        }
        self.finished = true;
    }
}

impl<B: Backend> Drop for Drain<B> {
    fn drop(&mut self) {
        if !self.finished {
            // Dropped mid-way (runtime shut down): nobody will run the queue. Dropping it
            // closes every queued caller's channel (they get an error and nothing of theirs
            // was sent); the in-flight batch's callers likewise, with an unknown outcome, as
            // for any call cancelled in flight.
            self.manager.inner.lanes.remove(&self.key);
        }
    }
}

impl<B: Backend> ProxyManager<B> {
    /// Cuts the next batch from a lane's queue, skipping withdrawn callers; removes the
    /// lane (the key is idle again) when nothing is left. Under the shard lock, so an
    /// operation queued concurrently is either in the batch or finds no lane and goes alone.
    fn next_batch(&self, key: &StorageKey) -> Option<Vec<Box<dyn Queued>>> {
        let max = self.inner.batching.max;
        match self.inner.lanes.entry(key.clone()) {
            Entry::Vacant(_) => None,
            Entry::Occupied(mut o) => {
                let queue = &mut o.get_mut().queue;
                queue.retain(|q| !q.is_withdrawn());
                if queue.is_empty() {
                    o.remove();
                    return None;
                }
                let rest = if queue.len() > max {
                    queue.split_off(max)
                } else {
                    Vec::new()
                };
                Some(core::mem::replace(queue, rest))
            }
        }
    }

    /// Runs one batch as one backend transaction (with the manager's timeout and retries)
    /// and delivers every outcome.
    async fn run_batch(&self, key: &StorageKey, items: &mut Vec<Box<dyn Queued>>) {
        let inner = &self.inner;
        let commands = items.iter().map(|q| q.command()).collect();
        let mut tx = BatchTx {
            items: items.as_mut_slice(),
            commands,
            clock: inner.time.0.as_deref(),
            wall: inner.wall,
            margin: inner.ttl_margin,
        };
        if let Err(e) = self.transact(key, &mut tx).await {
            // Every caller gets the error; the last one the original (with its source).
            let n = items.len();
            for item in items.iter_mut().take(n.saturating_sub(1)) {
                item.fail(duplicate(&e));
            }
            if let Some(last) = items.last_mut() {
                last.fail(e);
            }
        }
        for item in items.drain(..) {
            item.deliver();
        }
    }
}

/// A copy of `e` for another caller of the same batch (a backend error's source, which is
/// not clonable, stays with the original).
fn duplicate(e: &DistributedError) -> DistributedError {
    match e {
        DistributedError::Operation(o) => DistributedError::Operation(*o),
        DistributedError::Config(c) => DistributedError::Config(c.clone()),
        DistributedError::Key(k) => DistributedError::Key(k.clone()),
        DistributedError::Format(f) => DistributedError::Format(f.clone()),
        DistributedError::Timeout { after } => DistributedError::Timeout { after: *after },
        DistributedError::Backend(b) => DistributedError::Backend(
            BackendError::new(b.kind(), b.message()).retryable(b.is_retryable()),
        ),
        DistributedError::Blocking(s) => DistributedError::Blocking(s),
    }
}

fn not_run() -> DistributedError {
    DistributedError::Backend(BackendError::new(
        BackendErrorKind::Protocol,
        "the backend completed without running the transaction",
    ))
}

/// A queued call whose batch task was dropped (its runtime shut down) before it answered.
fn abandoned() -> DistributedError {
    DistributedError::Backend(BackendError::new(
        BackendErrorKind::Other,
        "the task running this call's batch was dropped (runtime shut down); \
         the operation may or may not have been applied",
    ))
}

impl<B: Backend> RemoteBucket<B> {
    /// The storage key.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.key().as_str(), "bucket4rs:k");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(&self) -> &StorageKey {
        &self.key
    }

    /// The form of this bucket whose calls also return the configuration and state.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.verbose().available_tokens().await?.value, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn verbose(&self) -> VerboseRemoteBucket<'_, B> {
        VerboseRemoteBucket { bucket: self }
    }

    /// A blocking view for code outside async contexts, driving calls on `handle`, which
    /// must belong to a multi-thread tokio runtime (a current-thread runtime cannot drive
    /// I/O from another thread; such calls fail with [`DistributedError::Blocking`]).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?.blocking(rt.handle().clone());
    /// assert!(bucket.try_consume(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn blocking(&self, handle: tokio::runtime::Handle) -> BlockingRemoteBucket<B> {
        BlockingRemoteBucket {
            bucket: self.clone(),
            handle,
        }
    }

    async fn run<J>(&self, job: J, command: Command) -> Result<Verbose<J::Output>, DistributedError>
    where
        J: Job + 'static,
        J::Output: 'static,
    {
        let inner = &self.manager.inner;
        if inner.batching.is_enabled() && !inner.backend.is_in_process() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                // Boxed: the batching path's state (queue reply, timer) would otherwise be
                // part of every call's future, in-process ones too (over 1 KiB, a large
                // allocation wherever the caller boxes it, e.g. the tower layer).
                return Box::pin(self.run_batched(job, command, handle)).await;
            }
        }
        self.run_alone(job, command).await
    }

    /// One operation as its own backend transaction.
    async fn run_alone<J: Job>(
        &self,
        job: J,
        command: Command,
    ) -> Result<Verbose<J::Output>, DistributedError> {
        let inner = &self.manager.inner;
        let mut tx = OpTx {
            job,
            command,
            supplier: &*self.supplier,
            clock: inner.time.0.as_deref(),
            wall: inner.wall,
            margin: inner.ttl_margin,
            out: None,
        };
        self.manager.transact(&self.key, &mut tx).await?;
        tx.out.unwrap_or_else(|| Err(not_run()))
    }

    /// The batching path: goes at once when the key has nothing in flight (and hands what
    /// queued meanwhile to a batch task when done), else queues behind it.
    async fn run_batched<J>(
        &self,
        job: J,
        command: Command,
        handle: tokio::runtime::Handle,
    ) -> Result<Verbose<J::Output>, DistributedError>
    where
        J: Job + 'static,
        J::Output: 'static,
    {
        let inner = &self.manager.inner;
        let (job, reply) = match inner.lanes.entry(self.key.clone()) {
            Entry::Vacant(v) => {
                v.insert(Lane::default());
                (Some(job), None)
            }
            Entry::Occupied(mut o) => {
                let (tx, rx) = oneshot::channel();
                o.get_mut().queue.push(Box::new(Pending {
                    job,
                    command,
                    supplier: Arc::clone(&self.supplier),
                    out: None,
                    reply: tx,
                }));
                (None, Some(rx))
            }
        };
        if let Some(job) = job {
            // Released on completion and on cancellation alike.
            let _lane = LaneGuard {
                manager: &self.manager,
                key: &self.key,
                handle,
            };
            return self.run_alone(job, command).await;
        }
        let Some(rx) = reply else {
            return Err(not_run());
        };
        // Dropping `rx` (timeout or cancellation) before the batch is formed withdraws the
        // operation: the batch task skips closed channels.
        with_timeout(inner.timeout, async move {
            rx.await.unwrap_or_else(|_| Err(abandoned()))
        })
        .await
    }

    async fn op<O>(&self, op: O) -> Result<Verbose<O::Output>, DistributedError>
    where
        O: RemoteOp + 'static,
        O::Output: Send + Sync + 'static,
    {
        op.validate()?;
        let command = op.command();
        self.run(OpJob(op), command).await
    }

    /// Replaces the stored configuration, carrying tokens over with `strategy`.
    ///
    /// # Errors
    /// [`DistributedError::Config`] for a configuration the bucket's clock cannot serve;
    /// key, format, timeout and backend errors.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, TokensInheritanceStrategy};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// let small = BucketConfiguration::builder().add_limit(Bandwidth::simple(100, Duration::from_secs(60))?).build()?;
    /// let big = BucketConfiguration::builder().add_limit(Bandwidth::simple(200, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || small.clone())?;
    /// bucket.try_consume(60).await?;
    /// bucket.replace_configuration(big, TokensInheritanceStrategy::Proportionally).await?;
    /// assert_eq!(bucket.available_tokens().await?, 80);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn replace_configuration(
        &self,
        configuration: BucketConfiguration,
        strategy: TokensInheritanceStrategy,
    ) -> Result<(), DistributedError> {
        self.verbose()
            .replace_configuration(configuration, strategy)
            .await
            .map(|v| v.value)
    }

    /// The stored configuration (`None` before first use).
    ///
    /// # Errors
    /// Format, timeout and backend errors.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let c = config.clone();
    /// let bucket = manager.builder().build("k", move || c.clone())?;
    /// assert_eq!(bucket.configuration().await?, None);
    /// bucket.available_tokens().await?;
    /// assert_eq!(bucket.configuration().await?, Some(config));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn configuration(&self) -> Result<Option<BucketConfiguration>, DistributedError> {
        Ok(self.manager.read_record(&self.key).await?.map(|r| r.config))
    }

    /// The raw stored record (for diagnostics and tests).
    ///
    /// # Errors
    /// Timeout and backend errors.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.raw_record().await?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn raw_record(&self) -> Result<Option<Vec<u8>>, DistributedError> {
        let inner = &self.manager.inner;
        let key = &self.key;
        inner.call(|| inner.backend.read(key)).await
    }

    /// Consumes `tokens`, sleeping (asynchronously) until they are paid for; returns the
    /// time slept. Like Bucket4j's blocking `consume`, requests above capacity create debt.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], [`OperationError::WaitTooLong`]; timeout and backend
    /// errors (the timeout bounds the backend call, not the sleep).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.consume(2).await?, Duration::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn consume(&self, tokens: u64) -> Result<Duration, DistributedError> {
        let wait = Duration::from_nanos(self.consume_ignoring_rate_limits(tokens).await?);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(wait)
    }

    /// Consumes `tokens` if they will be paid for within `max_wait`, sleeping until then;
    /// whether they were consumed.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], [`OperationError::ZeroMaxWait`]; timeout and backend
    /// errors.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert!(bucket.try_consume_within(3, Duration::from_millis(1)).await?);
    /// assert!(!bucket.try_consume_within(3, Duration::from_millis(1)).await?);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn try_consume_within(
        &self,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<bool, DistributedError> {
        let max = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        match self.reserve(tokens, max).await? {
            Some(w) => {
                if w > 0 {
                    tokio::time::sleep(Duration::from_nanos(w)).await;
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

macro_rules! operations {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident: $ty:ty),*) -> $out:ty = $op:expr;
    )*) => {
        impl<B: Backend> RemoteBucket<B> {
            $(
                $(#[$doc])*
                ///
                /// # Errors
                /// Invalid arguments ([`DistributedError::Operation`], checked before any
                /// round trip); format, timeout and backend errors.
                pub async fn $name(&self, $($arg: $ty),*) -> Result<$out, DistributedError> {
                    self.op($op).await.map(|v| v.value)
                }
            )*
        }

        impl<B: Backend> VerboseRemoteBucket<'_, B> {
            $(
                $(#[$doc])*
                ///
                /// Verbose form: also returns the configuration and state.
                ///
                /// # Errors
                /// As the plain form.
                pub async fn $name(&self, $($arg: $ty),*) -> Result<Verbose<$out>, DistributedError> {
                    self.bucket.op($op).await
                }
            )*
        }

        impl<B: Backend> InProcessBucket<'_, B> {
            $(
                $(#[$doc])*
                ///
                /// In-process form: synchronous, and verbose (also returns the
                /// configuration and state).
                ///
                /// # Errors
                /// As the async form (never a timeout).
                pub fn $name(&self, $($arg: $ty),*) -> Result<Verbose<$out>, DistributedError> {
                    self.op($op)
                }
            )*
        }

        impl<B: Backend> BlockingRemoteBucket<B> {
            $(
                $(#[$doc])*
                ///
                /// Blocking form.
                ///
                /// # Errors
                /// As the async form, plus [`DistributedError::Blocking`] inside an async
                /// context or on a current-thread runtime.
                pub fn $name(&self, $($arg: $ty),*) -> Result<$out, DistributedError> {
                    self.check()?;
                    self.handle.block_on(self.bucket.$name($($arg),*))
                }
            )*
        }
    };
}

operations! {
    /// Consumes `tokens` if every bandwidth has them; whether it did.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert!(bucket.try_consume(3).await?);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn try_consume(tokens: u64) -> bool = ops::TryConsume(tokens);

    /// Consumes `tokens` if possible and reports remaining tokens and waits.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.try_consume_and_return_remaining(1).await?.remaining_tokens(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn try_consume_and_return_remaining(tokens: u64) -> ConsumptionProbe =
        ops::TryConsumeAndReturnRemaining(tokens);

    /// Whether `tokens` could be consumed now; changes nothing.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert!(!bucket.estimate_ability_to_consume(4).await?.can_be_consumed());
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn estimate_ability_to_consume(tokens: u64) -> EstimationProbe =
        ops::EstimateAbilityToConsume(tokens);

    /// Consumes every available token; how many.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.try_consume_as_much_as_possible().await?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn try_consume_as_much_as_possible() -> u64 = ops::TryConsumeAsMuchAsPossible(None);

    /// Consumes the available tokens, at most `limit`; how many.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.try_consume_as_much_as_possible_with_limit(2).await?, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn try_consume_as_much_as_possible_with_limit(limit: u64) -> u64 =
        ops::TryConsumeAsMuchAsPossible(Some(limit));

    /// Adds tokens, never above capacity.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// bucket.add_tokens(5).await?;
    /// assert_eq!(bucket.available_tokens().await?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn add_tokens(tokens: u64) -> () = ops::AddTokens(tokens);

    /// Adds tokens, even above capacity.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// bucket.force_add_tokens(5).await?;
    /// assert_eq!(bucket.available_tokens().await?, 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn force_add_tokens(tokens: u64) -> () = ops::ForceAddTokens(tokens);

    /// Sets every bandwidth to its capacity.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// bucket.try_consume(3).await?;
    /// bucket.reset().await?;
    /// assert_eq!(bucket.available_tokens().await?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn reset() -> () = ops::Reset;

    /// The balance after refill (negative in debt).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.available_tokens().await?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn available_tokens() -> i64 = ops::AvailableTokens;

    /// Consumes `tokens` whatever the balance; nanoseconds until the debt is repaid.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.consume_ignoring_rate_limits(4).await?, 20_000_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn consume_ignoring_rate_limits(tokens: u64) -> u64 = ops::ConsumeIgnoringRateLimits(tokens);

    /// Reserves `tokens` if they will be paid for within `max_wait_nanos`: `Some(wait)`
    /// (the caller then waits) or `None`. The primitive behind waiting consumption.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.reserve(4, u64::MAX).await?, Some(20_000_000_000));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn reserve(tokens: u64, max_wait_nanos: u64) -> Option<u64> =
        ops::Reserve { tokens, max_wait_nanos };
}

/// The verbose form of a [`RemoteBucket`]: every call also returns the configuration and
/// state snapshot ([`Verbose`]).
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?;
/// let v = bucket.verbose().try_consume_as_much_as_possible().await?;
/// assert_eq!((v.value, v.state.bandwidths()[0].tokens()), (3, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct VerboseRemoteBucket<'a, B> {
    bucket: &'a RemoteBucket<B>,
}

impl<B: Backend> VerboseRemoteBucket<'_, B> {
    /// Verbose [`RemoteBucket::replace_configuration`].
    ///
    /// # Errors
    /// As the plain form.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, TokensInheritanceStrategy};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let small = BucketConfiguration::builder().add_limit(Bandwidth::simple(100, Duration::from_secs(60))?).build()?;
    /// # let big = BucketConfiguration::builder().add_limit(Bandwidth::simple(200, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || small.clone())?;
    /// let v = bucket.verbose().replace_configuration(big.clone(), TokensInheritanceStrategy::AsIs).await?;
    /// assert_eq!(v.configuration, big);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn replace_configuration(
        &self,
        configuration: BucketConfiguration,
        strategy: TokensInheritanceStrategy,
    ) -> Result<Verbose<()>, DistributedError> {
        self.bucket
            .run(
                ReplaceJob(configuration, strategy),
                Command::ReplaceConfiguration,
            )
            .await
    }
}

/// The blocking form of a [`RemoteBucket`]; from [`RemoteBucket::blocking`].
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?.blocking(rt.handle().clone());
/// assert_eq!(bucket.available_tokens()?, 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct BlockingRemoteBucket<B> {
    bucket: RemoteBucket<B>,
    handle: tokio::runtime::Handle,
}

impl<B: Backend> BlockingRemoteBucket<B> {
    fn check(&self) -> Result<(), DistributedError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(DistributedError::Blocking(
                "a blocking call inside an async context would stall the runtime",
            ));
        }
        if self.handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
            return Err(DistributedError::Blocking(
                "a current-thread runtime cannot drive I/O for a blocking call",
            ));
        }
        Ok(())
    }

    /// The async bucket.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?.blocking(rt.handle().clone());
    /// assert_eq!(bucket.as_async().key().as_str(), "bucket4rs:k");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_async(&self) -> &RemoteBucket<B> {
        &self.bucket
    }

    /// Blocking [`RemoteBucket::replace_configuration`].
    ///
    /// # Errors
    /// As the async form, plus [`DistributedError::Blocking`].
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, TokensInheritanceStrategy};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let small = BucketConfiguration::builder().add_limit(Bandwidth::simple(100, Duration::from_secs(60))?).build()?;
    /// # let big = BucketConfiguration::builder().add_limit(Bandwidth::simple(200, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || small.clone())?.blocking(rt.handle().clone());
    /// bucket.replace_configuration(big, TokensInheritanceStrategy::Reset)?;
    /// assert_eq!(bucket.available_tokens()?, 200);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replace_configuration(
        &self,
        configuration: BucketConfiguration,
        strategy: TokensInheritanceStrategy,
    ) -> Result<(), DistributedError> {
        self.check()?;
        self.handle
            .block_on(self.bucket.replace_configuration(configuration, strategy))
    }

    /// Blocking [`RemoteBucket::consume`]: parks the thread until the tokens are paid for.
    ///
    /// # Errors
    /// As the async form, plus [`DistributedError::Blocking`].
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?.blocking(rt.handle().clone());
    /// assert_eq!(bucket.consume(1)?, Duration::ZERO);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consume(&self, tokens: u64) -> Result<Duration, DistributedError> {
        self.check()?;
        let wait = Duration::from_nanos(
            self.handle
                .block_on(self.bucket.consume_ignoring_rate_limits(tokens))?,
        );
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        Ok(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucket4rs_core::{Bandwidth, ManualClock};
    use std::cell::Cell;

    std::thread_local! {
        /// How many operations [`InProcessBucket::in_place`] ran on this thread.
        pub(super) static IN_PLACE_RUNS: Cell<u64> = const { Cell::new(0) };
        /// How many `try_take_live` calls took tokens on this thread.
        pub(super) static TAKE_RUNS: Cell<u64> = const { Cell::new(0) };
        /// How many `try_consume_live_with` callbacks ran on this thread.
        static LIVE_RUNS: Cell<u64> = const { Cell::new(0) };
        /// How many `try_take_live` calls of the test's `Via::Take` steps took tokens.
        static TAKE_SEEN: Cell<u64> = const { Cell::new(0) };
        /// How many `try_take_live` calls ran the general way (`LiveTake::Other`).
        static TAKE_OTHER: Cell<u64> = const { Cell::new(0) };
        /// How many live buckets their `select` declined on this thread.
        static DECLINED: Cell<u64> = const { Cell::new(0) };
    }

    /// An [`EmbeddedBackend`] the manager does not recognise: every operation goes through
    /// a transaction (the generic path).
    #[derive(Debug)]
    struct Generic(EmbeddedBackend);

    #[async_trait::async_trait]
    impl Backend for Generic {
        async fn transact(
            &self,
            key: &StorageKey,
            tx: &mut dyn Transaction,
        ) -> Result<(), BackendError> {
            self.0.transact(key, tx).await
        }
        fn supports_transact_now(&self) -> bool {
            self.0.supports_transact_now()
        }
        fn transact_now(
            &self,
            key: StorageKeyRef<'_>,
            tx: &mut dyn Transaction,
        ) -> Option<Result<(), BackendError>> {
            self.0.transact_now(key, tx)
        }
        async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
            self.0.read(key).await
        }
        async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
            self.0.remove(key).await
        }
        fn is_in_process(&self) -> bool {
            self.0.is_in_process()
        }
        fn clock(&self) -> BackendClock {
            self.0.clock()
        }
    }

    /// What a consumption answered: the callback's view, or the error.
    type Seen = Result<(String, BucketConfiguration, BucketState, i64), String>;

    /// How a step consumes.
    #[derive(Clone, Copy, Debug)]
    enum Via {
        TryConsume,
        WithRemaining,
        /// `try_consume_live_with` first; `try_consume_with` when it answers `None`.
        Live,
        /// `try_take_live` first, leaving the given tokens; `try_consume_with` when it
        /// answers `None`. The instant is not compared (`LiveTake::Taken` does not report
        /// it).
        Take(u64),
    }

    fn consume<B: Backend>(
        manager: &ProxyManager<B>,
        key: &str,
        config: &BucketConfiguration,
        tokens: u64,
        via: Via,
        rt: &tokio::runtime::Runtime,
    ) -> Seen {
        if let Via::Take(leave) = via {
            let otherwise = |(), v: VerboseRef<'_, bool>| {
                TAKE_OTHER.with(|n| n.set(n.get() + 1));
                let value = format!("{:?}", v.value);
                (value, v.configuration.clone(), v.state.clone(), 0)
            };
            match manager.try_take_live(key, tokens, leave, |_| Some(()), otherwise) {
                Ok(Some(LiveTake::Other(seen))) => return Ok(seen),
                Ok(Some(LiveTake::Taken((), left))) => {
                    // What the transaction would have lent: the record as stored now.
                    let k = manager.storage_key(key).unwrap();
                    let bytes = rt.block_on(manager.backend().read(&k)).unwrap();
                    let record = format::decode(&bytes.expect("taken from a live key")).unwrap();
                    let [s] = record.state.bandwidths() else {
                        panic!("taken from a bucket of several bandwidths");
                    };
                    assert_eq!(Ok(left), u64::try_from(s.tokens()), "the tokens left");
                    assert!(left >= leave, "{left} left, {leave} asked for");
                    TAKE_SEEN.with(|n| n.set(n.get() + 1));
                    return Ok(("true".to_owned(), record.config, record.state, 0));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("{e:?}")),
            }
            return consume(manager, key, config, tokens, Via::TryConsume, rt)
                .map(|(value, config, state, _)| (value, config, state, 0));
        }
        if let Via::Live = via {
            // Declined for a one-bandwidth bucket: then untouched, as the transaction
            // that follows must show.
            let select = |c: &BucketConfiguration| {
                let accept = c.bandwidths().len() > 1;
                DECLINED.with(|n| n.set(n.get() + u64::from(!accept)));
                accept.then_some(())
            };
            let live = manager.try_consume_live_with(key, tokens, select, |(), v| {
                LIVE_RUNS.with(|n| n.set(n.get() + 1));
                let value = format!("{:?}", v.value);
                (value, v.configuration.clone(), v.state.clone(), v.now_nanos)
            });
            match live {
                Ok(Some(seen)) => return Ok(seen),
                Ok(None) => {}
                Err(e) => return Err(format!("{e:?}")),
            }
        }
        let with_remaining = matches!(via, Via::WithRemaining);
        let bucket = manager
            .in_process_bucket(key, config)
            .map_err(|e| format!("{e:?}"))?
            .expect("in-process");
        let result = if with_remaining {
            bucket.try_consume_and_return_remaining_with(tokens, |v| {
                let value = format!("{:?}", v.value);
                (value, v.configuration.clone(), v.state.clone(), v.now_nanos)
            })
        } else {
            bucket.try_consume_with(tokens, |v| {
                let value = format!("{:?}", v.value);
                (value, v.configuration.clone(), v.state.clone(), v.now_nanos)
            })
        };
        result.map_err(|e| format!("{e:?}"))
    }

    /// The in-place path gives the results, states and expiries of the transaction it
    /// stands for: the same random sequence of consumptions (refills, exhausted tokens,
    /// invalid arguments, keys expiring, a key cap refusing a new key, a configuration
    /// other than the stored one) through both, compared step by step. A quarter of the
    /// steps go through `try_consume_live_with` first, and a quarter through
    /// `try_take_live` (each taking the transaction when it answers `None`, which must
    /// then have changed nothing).
    #[test]
    fn in_place_matches_the_transaction() {
        let fast_clock = ManualClock::new(1_000);
        let slow_clock = ManualClock::new(1_000);
        let fast =
            ProxyManager::new(EmbeddedBackend::with_clock(fast_clock.clone()).with_max_keys(2));
        let slow = ProxyManager::new(Generic(
            EmbeddedBackend::with_clock(slow_clock.clone()).with_max_keys(2),
        ));
        let secs = Duration::from_secs;
        let configs = [
            BucketConfiguration::builder()
                .add_limit(Bandwidth::simple(5, secs(1)).unwrap())
                .add_limit(Bandwidth::simple(12, secs(20)).unwrap())
                .build()
                .unwrap(),
            BucketConfiguration::builder()
                .add_limit(Bandwidth::simple(3, secs(2)).unwrap())
                .build()
                .unwrap(),
            BucketConfiguration::builder()
                .add_limit(
                    Bandwidth::builder()
                        .capacity(30)
                        .refill_intervally(7, secs(1))
                        .build()
                        .unwrap(),
                )
                .build()
                .unwrap(),
        ];
        let keys = ["a", "b", "c"];
        let steps = [
            0,
            0,
            1,
            10,
            1_000,
            300_000,
            1_000_000_000,
            4_000_000_000,
            30_000_000_000,
        ];
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let before = IN_PLACE_RUNS.with(Cell::get);
        let take_before = (
            TAKE_RUNS.with(Cell::get),
            TAKE_SEEN.with(Cell::get),
            TAKE_OTHER.with(Cell::get),
        );
        let live_before = LIVE_RUNS.with(Cell::get);
        let declined_before = DECLINED.with(Cell::get);
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut refused = 0;
        for step in 0..8_000 {
            let key = keys[next(keys.len() as u64) as usize];
            let config = &configs[next(configs.len() as u64) as usize];
            let tokens = next(8);
            let via = [
                Via::TryConsume,
                Via::WithRemaining,
                Via::Live,
                Via::Take(next(4)),
            ][next(4) as usize];
            let a = consume(&fast, key, config, tokens, via, &rt);
            let b = consume(&slow, key, config, tokens, via, &rt);
            assert_eq!(a, b, "step {step}: {key} {tokens}");
            refused += usize::from(a.as_ref().is_err_and(|e| e.contains("CapacityExhausted")));
            let by = steps[next(steps.len() as u64) as usize];
            fast_clock.advance_nanos(by);
            slow_clock.advance_nanos(by);
            assert_eq!(fast.backend().len(), slow.backend().0.len(), "step {step}");
            for k in keys {
                let k = fast.storage_key(k).unwrap();
                let a = rt.block_on(fast.backend().read(&k)).unwrap();
                let b = rt.block_on(slow.backend().read(&k)).unwrap();
                assert_eq!(a, b, "step {step}: {k}");
            }
        }
        let runs = IN_PLACE_RUNS.with(Cell::get) - before;
        assert!(runs > 1_000, "{runs} operations in place");
        // Only the recognised backend runs the live path (the generic one always answers
        // `None`): about a quarter of the steps, half of them declined.
        let live = LIVE_RUNS.with(Cell::get) - live_before;
        let declined = DECLINED.with(Cell::get) - declined_before;
        assert!(
            live > 200 && declined > 200,
            "{live} live, {declined} declined"
        );
        assert!(refused > 0, "the key cap never refused a key");
        // A quarter of the steps try `try_take_live`: on the recognised backend it takes
        // from a one-bandwidth bucket that has the tokens (and those to leave), and runs
        // any other live bucket the general way.
        let takes = TAKE_RUNS.with(Cell::get) - take_before.0;
        assert_eq!(takes, TAKE_SEEN.with(Cell::get) - take_before.1);
        let other = TAKE_OTHER.with(Cell::get) - take_before.2;
        assert!(
            takes > 100 && other > 100,
            "{takes} taken, {other} the other way"
        );
    }
}
