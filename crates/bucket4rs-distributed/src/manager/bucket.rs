//! Remote buckets: the local bucket API, one transaction (or one place in a batch) per call.

use core::fmt;
use core::future::Future;
use core::marker::PhantomData;
use core::time::Duration;
use std::sync::Arc;

use bucket4rs_core::ops;
use bucket4rs_core::{
    Answer, BucketConfiguration, ConsumptionProbe, EstimationProbe, Plain,
    TokensInheritanceStrategy, Verbose, VerboseResult,
};

use super::ProxyManager;
use super::batch::{self, not_run};
use crate::backend::{Backend, Command};
use crate::error::DistributedError;
use crate::key::StorageKey;
use crate::record::{Job, OpJob, OpTx, RemoteOp, ReplaceJob, Supplier};

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
#[derive(Debug)]
#[must_use]
pub struct RemoteBucketBuilder<B> {
    pub(super) manager: ProxyManager<B>,
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
        Ok(RemoteBucket {
            manager: self.manager,
            key,
            supplier: Arc::new(configuration),
            answer: PhantomData,
        })
    }
}

/// A bucket stored in a backend, with the local bucket API.
///
/// Every call is one atomic transaction on the backend, bounded by the manager's timeout.
/// `A` is how it answers ([`Answer`]): [`Plain`] values by default, or on the view
/// [`verbose`](RemoteBucket::verbose) gives, [`Verbose`] results with the configuration and
/// state (a signature's `A::Of<T>` is `T` on a plain bucket).
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
            answer: PhantomData,
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

    /// The form of this bucket whose calls also return the configuration and state.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.verbose().available_tokens().await?.into_value(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn verbose(&self) -> RemoteBucket<B, Verbose> {
        self.answering()
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?.blocking(rt.handle().clone());
    /// assert!(bucket.block_on(|b| b.try_consume(1))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn blocking(&self, handle: tokio::runtime::Handle) -> BlockingRemoteBucket<B> {
        BlockingRemoteBucket {
            bucket: self.clone(),
            handle,
        }
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
        if inner.batching.is_enabled()
            && !inner.backend.is_in_process()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            // Boxed: the batching path's state (queue reply, timer) would otherwise be
            // part of every call's future, in-process ones too (over 1 KiB, a large
            // allocation wherever the caller boxes it, e.g. the tower layer).
            return Box::pin(batch::run_batched(self, job, command, handle)).await;
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
        };
        self.manager.transact(&self.key, &mut tx).await?;
        tx.out.unwrap_or_else(|| Err(not_run()))
    }

    async fn op<O>(&self, op: O) -> Result<VerboseResult<O::Output>, DistributedError>
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
}

impl<B: Backend> RemoteBucket<B> {
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
        self.manager.call(key, || inner.backend.read(key)).await
    }

    /// Consumes `tokens`, sleeping (asynchronously) until they are paid for; returns the
    /// time slept. Like Bucket4j's blocking `consume`, requests above capacity create debt.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`](bucket4rs_core::OperationError::ZeroTokens), [`OperationError::WaitTooLong`](bucket4rs_core::OperationError::WaitTooLong); timeout and backend
    /// errors (the timeout bounds the backend call, not the sleep).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// [`OperationError::ZeroTokens`](bucket4rs_core::OperationError::ZeroTokens), [`OperationError::ZeroMaxWait`](bucket4rs_core::OperationError::ZeroMaxWait); timeout and backend
    /// errors.
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

    /// Consumes `tokens` whatever the balance; nanoseconds until the debt is repaid.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(bucket.reserve(4, u64::MAX).await?, Some(20_000_000_000));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn reserve(tokens: u64, max_wait_nanos: u64) -> Option<u64> =
        ops::Reserve { tokens, max_wait_nanos };
}

/// The blocking form of a [`RemoteBucket`]; from [`RemoteBucket::blocking`].
///
/// ```
/// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
/// let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
/// # let manager = ProxyManager::new(EmbeddedBackend::new());
/// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?.blocking(rt.handle().clone());
/// assert!(bucket.block_on(|b| b.try_consume(1))?);
/// assert_eq!(bucket.block_on(|b| b.available_tokens())?, 2);
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?.blocking(rt.handle().clone());
    /// assert_eq!(bucket.as_async().key().as_str(), "bucket4rs:k");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_async(&self) -> &RemoteBucket<B> {
        &self.bucket
    }

    /// Runs any operation of the [`RemoteBucket`] to completion on the runtime, from a thread
    /// that may block: `bucket.block_on(|b| b.try_consume(1))`.
    ///
    /// # Errors
    /// The operation's, plus [`DistributedError::Blocking`] inside an async context (which
    /// would stall its runtime) or on a current-thread runtime (which cannot drive the I/O).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration, TokensInheritanceStrategy};
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager}; use std::time::Duration;
    /// # let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let small = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60))?).build()?;
    /// # let big = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(200, Duration::from_secs(60))?).build()?;
    /// let bucket = manager.builder().build("k", move || small.clone())?.blocking(rt.handle().clone());
    /// bucket.block_on(|b| b.replace_configuration(big, TokensInheritanceStrategy::Reset))?;
    /// assert_eq!(bucket.block_on(|b| b.available_tokens())?, 200);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn block_on<'a, T, F>(
        &'a self,
        op: impl FnOnce(&'a RemoteBucket<B>) -> F,
    ) -> Result<T, DistributedError>
    where
        F: Future<Output = Result<T, DistributedError>>,
    {
        self.check()?;
        self.handle.block_on(op(&self.bucket))
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
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(3, Duration::from_secs(60))?).build()?;
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
