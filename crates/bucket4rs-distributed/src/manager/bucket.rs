//! Remote buckets: the local bucket API, one transaction (or one place in a batch) per call;
//! their waits (cancellation safe) and their blocking view.

use core::fmt;
use core::future::Future;
use core::marker::PhantomData;
use core::time::Duration;
use std::sync::{Arc, OnceLock};

use bucket4rs_core::ops;
use bucket4rs_core::{
    Answer, BucketConfiguration, BucketListener, ConsumptionProbe, EstimationProbe, Plain,
    TokensInheritanceStrategy, Verbose, VerboseResult,
};

use super::batch::{self, not_run};
use super::{Leasing, ProxyManager};
use crate::backend::{Backend, Command};
use crate::error::DistributedError;
use crate::key::StorageKey;
use crate::record::{Job, OpJob, OpTx, RemoteOp, ReplaceJob, Supplier};

/// A remote bucket's listener, shared by its clones and views.
type SharedListener = Arc<dyn BucketListener + Send + Sync>;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Builds [`RemoteBucket`]s; from [`ProxyManager::builder`].
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct RemoteBucketBuilder<B> {
    pub(super) manager: ProxyManager<B>,
    pub(super) listener: Option<SharedListener>,
    pub(super) leasing: Option<Arc<Leasing>>,
}

impl<B: fmt::Debug> fmt::Debug for RemoteBucketBuilder<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteBucketBuilder")
            .field("manager", &self.manager)
            .field("listener", &self.listener.is_some())
            .field("leasing", &self.leasing)
            .finish()
    }
}

impl<B: Backend> RemoteBucketBuilder<B> {
    /// Leasing for this bucket (`None`: off), whatever the manager's
    /// ([`ManagerBuilder::leasing`](super::ManagerBuilder::leasing)): its calls are served in
    /// this process from blocks of tokens taken from the shared bucket, with no over-grant
    /// (see [`Leasing`]). Every bucket of a key in one manager shares the key's lease; the
    /// settings of the first one that leases it hold. [`build`](Self::build) refuses
    /// settings that can only break things.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// use bucket4rs_distributed::{EmbeddedBackend, Leasing, ProxyManager};
    /// # use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10_000, Duration::from_secs(1))?).build()?;
    /// let hot = manager.builder().leasing(Some(Leasing::new())).build("global", move || config.clone())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn leasing(mut self, leasing: Option<Leasing>) -> Self {
        self.leasing = leasing.map(Arc::new);
        self
    }

    /// The listener the bucket notifies (Bucket4j's `withListener`), with the events of a
    /// local bucket: `on_consumed` / `on_rejected` when a consuming call's result arrives
    /// (after the backend committed it; a failed call notifies nothing), `on_delayed` when a
    /// waiting call must wait, `on_interrupted` when such a wait is dropped, and
    /// `on_before_parking` / `on_parked` around a blocking wait. Estimates, reads, adding
    /// tokens and resets stay silent. Every clone and view of the bucket shares it.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketListener};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    ///
    /// #[derive(Default)]
    /// struct Rejected(AtomicU64);
    /// impl BucketListener for Rejected {
    ///     fn on_rejected(&self, tokens: u64) {
    ///         self.0.fetch_add(tokens, Ordering::Relaxed);
    ///     }
    /// }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let rejected = Arc::new(Rejected::default());
    /// let bucket = manager.builder().with_listener(Arc::clone(&rejected)).build("k", move || config.clone())?;
    /// assert!(bucket.try_consume(3).await?);
    /// assert!(!bucket.try_consume(2).await?);
    /// assert_eq!(rejected.0.load(Ordering::Relaxed), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_listener(mut self, listener: impl BucketListener + Send + Sync + 'static) -> Self {
        self.listener = Some(Arc::new(listener));
        self
    }

    /// The remote bucket of `key`. `configuration` is called only when the key has no
    /// stored state yet (first use, or after expiry or removal); afterwards the stored
    /// configuration rules until [`RemoteBucket::replace_configuration`].
    ///
    /// No round trip happens here.
    ///
    /// # Errors
    /// [`DistributedError::Key`] when the key is too long;
    /// [`DistributedError::InvalidSetting`] for leasing settings that can only break things.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// assert!(manager.builder().build([b'k'; 1000], move || config.clone()).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(
        self,
        key: impl AsRef<[u8]>,
        configuration: impl Fn() -> BucketConfiguration + Send + Sync + 'static,
    ) -> Result<RemoteBucket<B>, DistributedError> {
        let key = self.manager.storage_key(key)?;
        if let Some(l) = &self.leasing {
            l.check()?;
        }
        Ok(RemoteBucket {
            manager: self.manager,
            key,
            supplier: Arc::new(configuration),
            listener: self.listener,
            leasing: self.leasing,
            answer: PhantomData,
        })
    }
}

/// A bucket stored in a backend, with the local bucket API.
///
/// Every call is one atomic transaction on the backend, bounded by the manager's timeout.
/// The arguments and answers are the local [`Bucket`](bucket4rs_local::Bucket)'s (counts as
/// `u64`, waits as [`Duration`]); the waiting calls ([`consume`](Self::consume),
/// [`try_consume_within`](Self::try_consume_within)) are those of the local async view, and
/// cancellation safe the same way. `A` is how it answers ([`Answer`]): [`Plain`] values by
/// default, or on the view [`as_verbose`](RemoteBucket::as_verbose) gives, [`Verbose`]
/// results with the configuration and state (a signature's `A::Of<T>` is `T` on a plain
/// bucket).
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(60))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?;
/// let probe = bucket.try_consume_and_return_remaining(4).await?;
/// assert!(probe.is_consumed());
/// assert_eq!(probe.remaining_tokens(), 6);
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RemoteBucket<B, A = Plain> {
    pub(super) manager: ProxyManager<B>,
    pub(super) key: StorageKey,
    pub(super) supplier: Supplier,
    pub(super) listener: Option<SharedListener>,
    pub(super) leasing: Option<Arc<Leasing>>,
    pub(super) answer: PhantomData<fn() -> A>,
}

impl<B, A> Clone for RemoteBucket<B, A> {
    fn clone(&self) -> Self {
        self.answering()
    }
}

impl<B, A> RemoteBucket<B, A> {
    /// A handle on the same bucket answering as `A2`.
    fn answering<A2>(&self) -> RemoteBucket<B, A2> {
        RemoteBucket {
            manager: self.manager.clone(),
            key: self.key.clone(),
            supplier: Arc::clone(&self.supplier),
            listener: self.listener.clone(),
            leasing: self.leasing.clone(),
            answer: PhantomData,
        }
    }

    /// The storage key.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.key().as_str(), "bucket4rs:k");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(&self) -> &StorageKey {
        &self.key
    }

    fn notify(&self, event: impl FnOnce(&dyn BucketListener)) {
        if let Some(l) = &self.listener {
            event(&**l);
        }
    }
}

impl<B: fmt::Debug, A> fmt::Debug for RemoteBucket<B, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteBucket")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> RemoteBucket<B> {
    /// The same bucket answering verbosely (Bucket4j's `asVerbose()`): every call answers a
    /// [`VerboseResult`] with the configuration and the state it left, as the local
    /// bucket's `as_verbose` does.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.as_verbose().available_tokens().await?.into_value(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_verbose(&self) -> RemoteBucket<B, Verbose> {
        self.answering()
    }

    /// The blocking view, for threads that may block (Bucket4j's `asBlocking()`): waiting
    /// calls park the thread, any other call runs to completion with
    /// [`block_on`](BlockingRemoteBucket::block_on). No runtime is needed: the calls' I/O and
    /// timers are driven by one background thread shared by every blocking view of the
    /// process (`bucket4rs-remote`, started by the first blocking call), so a blocking caller
    /// never depends on a runtime of its own being driven.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// let blocking = bucket.as_blocking();
    /// assert!(blocking.block_on(|b| b.try_consume(1))?);
    /// assert!(blocking.try_consume(2, Duration::from_millis(1))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_blocking(&self) -> BlockingRemoteBucket<B> {
        BlockingRemoteBucket {
            bucket: self.clone(),
        }
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.raw_record().await?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(hidden)]
    pub async fn raw_record(&self) -> Result<Option<Vec<u8>>, DistributedError> {
        let inner = &self.manager.inner;
        let key = &self.key;
        self.manager
            .call(key, false, || inner.backend.read(key))
            .await
    }
}

impl<B: Backend, A: Answer> RemoteBucket<B, A> {
    async fn run<J>(
        &self,
        job: J,
        command: Command,
    ) -> Result<VerboseResult<J::Output>, DistributedError>
    where
        J: Job + 'static,
        J::Output: 'static,
    {
        let inner = &self.manager.inner;
        if let Some(leasing) = &self.leasing {
            // No breaker check here: a lease serves its tokens while the backend is down; a
            // round trip meets the breaker in `transact`.
            return Box::pin(self.run_leased(job, command, **leasing)).await;
        }
        if inner.batching.is_enabled() && !inner.backend.is_in_process() {
            // An open breaker refuses at once, also a call that would queue behind its key.
            if let Some(b) = inner.breaker.as_ref().filter(|b| b.is_open()) {
                super::breaker::while_open(inner, b, &self.key).await?;
            }
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                // Boxed: the batching path's state (queue reply, timer) would otherwise be
                // part of every call's future, in-process ones too (over 1 KiB, a large
                // allocation wherever the caller boxes it, e.g. the tower layer).
                return Box::pin(batch::run_batched(self, job, command, handle)).await;
            }
        }
        self.run_alone(job, command).await
    }

    /// One operation as its own backend transaction.
    pub(super) async fn run_alone<J: Job>(
        &self,
        job: J,
        command: Command,
    ) -> Result<VerboseResult<J::Output>, DistributedError> {
        let inner = &self.manager.inner;
        let mut tx = OpTx {
            job,
            command,
            supplier: &self.supplier,
            clock: inner.time.0.as_deref(),
            wall: inner.wall,
            margin: inner.ttl_margin,
            out: None,
            id: self.manager.begin_operation(&self.key),
            wrote: false,
        };
        let in_flight = super::settle::InFlight {
            manager: &self.manager,
            key: &self.key,
            id: tx.id.clone(),
        };
        let result = self.manager.transact(&self.key, &mut tx).await;
        in_flight.finished();
        let (id, wrote) = (tx.id.take(), tx.wrote);
        self.manager.end_operation(&self.key, id, &result, wrote);
        result?;
        tx.out.unwrap_or_else(|| Err(not_run()))
    }

    /// Checks the arguments, runs the operation, and tells the listener what it did once its
    /// result is back (the backend committed it).
    async fn op<O>(&self, op: O) -> Result<VerboseResult<O::Output>, DistributedError>
    where
        O: RemoteOp + Copy + 'static,
        O::Output: Send + Sync + 'static,
    {
        op.validate()?;
        let command = op.command();
        let result = self.run(OpJob(op), command).await?;
        self.notify(|l| op.notify_listener(result.value(), l));
        Ok(result)
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
    /// let small = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60))?).build()?;
    /// let big = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(200, Duration::from_secs(60))?).build()?;
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
    ) -> Result<A::Of<()>, DistributedError> {
        let result = self
            .run(
                ReplaceJob(configuration, strategy),
                Command::ReplaceConfiguration,
            )
            .await?;
        Ok(A::from_verbose(result))
    }

    /// Consumes `tokens` whatever the balance and returns how long until the debt is repaid
    /// (zero without debt).
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`](bucket4rs_core::OperationError::ZeroTokens), or
    /// [`OperationError::WaitTooLong`](bucket4rs_core::OperationError::WaitTooLong) when the
    /// debt could never be repaid (nothing is consumed then); format, timeout and backend
    /// errors.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.consume_ignoring_rate_limits(4).await?, Duration::from_secs(20));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn consume_ignoring_rate_limits(
        &self,
        tokens: u64,
    ) -> Result<A::Of<Duration>, DistributedError> {
        let result = self.op(ops::ConsumeIgnoringRateLimits(tokens)).await?;
        Ok(A::from_verbose(result.map(Duration::from_nanos)))
    }

    /// Reserves `tokens` if the wait until they are paid for is at most `max_wait`, taking
    /// them now: returns the wait (the caller must then wait before acting), or `None` when
    /// it would be longer (nothing is taken). The primitive behind waiting consumption.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`](bucket4rs_core::OperationError::ZeroTokens), or
    /// [`OperationError::ZeroMaxWait`](bucket4rs_core::OperationError::ZeroMaxWait) for a
    /// zero `max_wait`; format, timeout and backend errors.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.reserve(4, Duration::from_secs(30)).await?, Some(Duration::from_secs(20)));
    /// assert_eq!(bucket.reserve(4, Duration::from_secs(30)).await?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn reserve(
        &self,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<A::Of<Option<Duration>>, DistributedError> {
        let op = ops::Reserve {
            tokens,
            max_wait_nanos: nanos(max_wait),
        };
        let result = self.op(op).await?;
        Ok(A::from_verbose(result.map(|w| w.map(Duration::from_nanos))))
    }

    /// Consumes `tokens`, waiting (asynchronously) as long as needed; `tokens` may exceed the
    /// capacity, the debt being paid by waiting. Answers the wait it slept for. The local
    /// async view's `consume`.
    ///
    /// Lazy: the future reserves the tokens (one call to the backend) when first polled,
    /// then sleeps for the reservation's wait. Listener: `on_consumed(tokens)`, then
    /// `on_delayed(nanos)` when it must wait.
    ///
    /// **Cancellation safe.** Dropping the future during its wait gives every reserved token
    /// back (an `add_tokens` sent at once, never above capacity, retried while the backend
    /// is unavailable) and the listener hears `on_interrupted()`. Dropped before its first
    /// poll, it took nothing; dropped while its reservation is in flight, the reservation
    /// is like any call cancelled in flight (see `docs/distributed.md`).
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`](bucket4rs_core::OperationError::ZeroTokens),
    /// [`OperationError::WaitTooLong`](bucket4rs_core::OperationError::WaitTooLong) (nothing
    /// consumed); format, timeout and backend errors of the reservation (the timeout bounds
    /// the call to the backend, not the wait).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::with_clock(bucket4rs_core::ManualClock::new(0)));
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.consume(2).await?, Duration::ZERO);
    /// assert_eq!(bucket.consume(2).await?, Duration::from_secs(20)); // slept 20 s for the second token
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "consume_uninterruptibly")]
    pub async fn consume(&self, tokens: u64) -> Result<A::Of<Duration>, DistributedError> {
        let reserved = self
            .op(ops::ConsumeIgnoringRateLimits(tokens))
            .await?
            .map(Duration::from_nanos);
        self.wait_reserved(tokens, *reserved.value()).await;
        Ok(A::from_verbose(reserved))
    }

    /// Consumes `tokens` if the wait for them is at most `max_wait`, then waits that long;
    /// resolves to `false` at once, taking nothing, when the wait would be longer. The local
    /// async view's `try_consume` (this bucket's [`try_consume`](Self::try_consume) never
    /// waits).
    ///
    /// Lazy and cancellation safe like [`consume`](Self::consume). Listener:
    /// `on_rejected(tokens)` when refused; otherwise `on_consumed(tokens)`, then
    /// `on_delayed(nanos)` when it must wait (and `on_interrupted()` if dropped mid-wait).
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`](bucket4rs_core::OperationError::ZeroTokens),
    /// [`OperationError::ZeroMaxWait`](bucket4rs_core::OperationError::ZeroMaxWait); format,
    /// timeout and backend errors.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    ) -> Result<A::Of<bool>, DistributedError> {
        let op = ops::Reserve {
            tokens,
            max_wait_nanos: nanos(max_wait),
        };
        let reserved = self.op(op).await?;
        if let Some(wait) = *reserved.value() {
            self.wait_reserved(tokens, Duration::from_nanos(wait)).await;
        }
        Ok(A::from_verbose(reserved.map(|w| w.is_some())))
    }

    /// Waits `wait` for `tokens` already reserved, giving them back if dropped first.
    async fn wait_reserved(&self, tokens: u64, wait: Duration) {
        if wait.is_zero() {
            return;
        }
        self.notify(|l| l.on_delayed(nanos(wait)));
        let mut refund = Refund {
            bucket: self,
            tokens,
            armed: true,
        };
        tokio::time::sleep(wait).await;
        refund.armed = false;
    }
}

/// Gives reserved tokens back unless disarmed: lives across a wait's `.await`, so dropping
/// the future mid-wait runs it.
struct Refund<'a, B: Backend, A> {
    bucket: &'a RemoteBucket<B, A>,
    tokens: u64,
    armed: bool,
}

impl<B: Backend, A> Drop for Refund<'_, B, A> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // A drop cannot wait for the backend: the refund is a task of its own, on the
        // runtime the future was dropped on (or the blocking views' runtime outside one).
        let give_back = refund(self.bucket.answering::<Plain>(), self.tokens);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(give_back);
            }
            Err(_) => {
                if let Ok(handle) = blocking_runtime() {
                    handle.spawn(give_back);
                }
            }
        }
        self.bucket.notify(|l| l.on_interrupted());
    }
}

/// How long a refund keeps trying while the backend is unavailable.
const REFUND_PATIENCE: Duration = Duration::from_secs(60);

/// Adds `tokens` back to `bucket` (a cancelled wait's reservation): retried with backoff
/// while the failure is one that applied nothing and may pass, for up to
/// [`REFUND_PATIENCE`].
async fn refund<B: Backend>(bucket: RemoteBucket<B>, tokens: u64) {
    let give_up = tokio::time::Instant::now() + REFUND_PATIENCE;
    let mut pause = Duration::from_millis(20);
    loop {
        match bucket.op(ops::AddTokens(tokens)).await {
            Err(e) if e.is_retryable() && tokio::time::Instant::now() + pause < give_up => {
                tokio::time::sleep(pause).await;
                pause = pause.saturating_mul(2).min(Duration::from_secs(2));
            }
            _ => return,
        }
    }
}

/// The runtime that drives the blocking views' calls: one worker thread, started by the
/// first blocking call and kept for the life of the process (a static is never dropped, so
/// it is never shut down under a caller). Blocking callers run their call's future on their
/// own thread (`Handle::block_on`); the runtime's worker drives the I/O, the timers and the
/// tasks the call spawns (a Redis connection's driver, a batch, the breaker's probe), which
/// therefore never depend on a runtime of the caller's that may not be running.
pub(super) fn blocking_runtime() -> Result<&'static tokio::runtime::Handle, DistributedError> {
    static RUNTIME: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("bucket4rs-remote")
                .enable_all()
                .build()
                .ok()
        })
        .as_ref()
        .map(tokio::runtime::Runtime::handle)
        .ok_or(DistributedError::Blocking(
            "the runtime of the blocking views could not be started",
        ))
}

/// The blocking form of a [`RemoteBucket`]; from [`RemoteBucket::as_blocking`]. The local
/// blocking view's calls (`consume`, `try_consume` with a longest wait), plus
/// [`block_on`](Self::block_on) for any other call of the bucket.
///
/// Calls are refused with [`DistributedError::Blocking`] on a thread that runs async tasks
/// (a tokio worker, or inside `block_on` of a runtime): parking it would stall them. Call it
/// from plain threads or tokio's `spawn_blocking`.
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?.as_blocking();
/// assert!(bucket.block_on(|b| b.try_consume(1))?);
/// assert_eq!(bucket.block_on(|b| b.available_tokens())?, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BlockingRemoteBucket<B, A = Plain> {
    bucket: RemoteBucket<B, A>,
}

impl<B: fmt::Debug, A> fmt::Debug for BlockingRemoteBucket<B, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingRemoteBucket")
            .field("bucket", &self.bucket)
            .finish()
    }
}

impl<B: Backend> BlockingRemoteBucket<B> {
    /// The same view answering verbosely (Bucket4j's `asBlocking().asVerbose()`): each
    /// waiting call answers the [`VerboseResult`] of its reservation, then parks as the plain
    /// view does.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?.as_blocking();
    /// let r = bucket.as_verbose().consume(2)?;
    /// assert_eq!((*r.value(), r.available_tokens()), (Duration::ZERO, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_verbose(&self) -> BlockingRemoteBucket<B, Verbose> {
        BlockingRemoteBucket {
            bucket: self.bucket.answering(),
        }
    }
}

impl<B: Backend, A: Answer> BlockingRemoteBucket<B, A> {
    /// The runtime to block on, after refusing a thread that runs async tasks.
    fn runtime() -> Result<&'static tokio::runtime::Handle, DistributedError> {
        if tokio::runtime::worker_index().is_some() {
            return Err(DistributedError::Blocking(
                "a blocking call on a thread that runs async tasks would stall them",
            ));
        }
        blocking_runtime()
    }

    /// The async bucket.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?.as_blocking();
    /// assert_eq!(bucket.as_async().key().as_str(), "bucket4rs:k");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_async(&self) -> &RemoteBucket<B, A> {
        &self.bucket
    }

    /// Runs any call of the [`RemoteBucket`] to completion, blocking the thread:
    /// `bucket.block_on(|b| b.try_consume(1))`.
    ///
    /// # Errors
    /// The call's, plus [`DistributedError::Blocking`] on a thread that runs async tasks.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, TokensInheritanceStrategy};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let small = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60))?).build()?;
    /// # let big = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(200, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || small.clone())?.as_blocking();
    /// bucket.block_on(|b| b.replace_configuration(big, TokensInheritanceStrategy::Reset))?;
    /// assert_eq!(bucket.block_on(|b| b.available_tokens())?, 200);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn block_on<'a, T, F>(
        &'a self,
        call: impl FnOnce(&'a RemoteBucket<B, A>) -> F,
    ) -> Result<T, DistributedError>
    where
        F: Future<Output = Result<T, DistributedError>>,
    {
        Self::runtime()?.block_on(call(&self.bucket))
    }

    /// Parks the thread for `wait` (reserved already), with the listener's parking events.
    fn park(&self, wait: Duration) {
        if wait.is_zero() {
            return;
        }
        let n = nanos(wait);
        self.bucket.notify(|l| l.on_before_parking(n));
        std::thread::sleep(wait);
        self.bucket.notify(|l| l.on_parked(n));
    }

    /// Consumes `tokens`, parking the thread as long as needed (`tokens` may exceed the
    /// capacity: the debt is paid by waiting); answers the wait it parked for. The tokens are
    /// reserved before the wait, so a later caller queues behind this one.
    ///
    /// Listener: `on_consumed(tokens)`, then, when it must wait, `on_before_parking(nanos)`
    /// and `on_parked(nanos)`.
    ///
    /// # Errors
    /// As [`RemoteBucket::consume`], plus [`DistributedError::Blocking`].
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::with_clock(bucket4rs_core::ManualClock::new(0)));
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(100, Duration::from_millis(100))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?.as_blocking();
    /// assert_eq!(bucket.consume(100)?, Duration::ZERO);
    /// assert_eq!(bucket.consume(1)?, Duration::from_millis(1)); // parked 1 ms
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "consume_uninterruptibly")]
    pub fn consume(&self, tokens: u64) -> Result<A::Of<Duration>, DistributedError> {
        let reserved = self.block_on(|b| async move {
            let op = ops::ConsumeIgnoringRateLimits(tokens);
            Ok(b.op(op).await?.map(Duration::from_nanos))
        })?;
        self.park(*reserved.value());
        Ok(A::from_verbose(reserved))
    }

    /// Consumes `tokens` if the wait for them is at most `max_wait`, parking the thread for
    /// that wait; returns `false` at once, taking nothing, when the wait would be longer.
    ///
    /// Listener: `on_rejected(tokens)` when refused; otherwise `on_consumed(tokens)`, then,
    /// when it must wait, `on_before_parking(nanos)` and `on_parked(nanos)`.
    ///
    /// # Errors
    /// As [`RemoteBucket::try_consume_within`], plus [`DistributedError::Blocking`].
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(10))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?.as_blocking();
    /// assert!(bucket.try_consume(10, Duration::from_millis(1))?);
    /// assert!(!bucket.try_consume(1, Duration::from_millis(10))?); // needs a second
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "try_consume_uninterruptibly")]
    pub fn try_consume(
        &self,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<A::Of<bool>, DistributedError> {
        let reserved = self.block_on(|b| async move {
            let op = ops::Reserve {
                tokens,
                max_wait_nanos: nanos(max_wait),
            };
            b.op(op).await
        })?;
        if let Some(wait) = *reserved.value() {
            self.park(Duration::from_nanos(wait));
        }
        Ok(A::from_verbose(reserved.map(|w| w.is_some())))
    }
}

macro_rules! operations {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident: $ty:ty),*) -> $out:ty = $op:expr;
    )*) => {
        impl<B: Backend, A: Answer> RemoteBucket<B, A> {
            $(
                $(#[$doc])*
                ///
                /// # Errors
                /// Invalid arguments ([`DistributedError::Operation`], checked before any
                /// round trip); format, timeout and backend errors.
                pub async fn $name(&self, $($arg: $ty),*) -> Result<A::Of<$out>, DistributedError> {
                    self.op($op).await.map(A::from_verbose)
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.available_tokens().await?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn available_tokens() -> i64 = ops::AvailableTokens;
}
