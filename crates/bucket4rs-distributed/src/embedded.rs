//! The embedded in-memory backend: the local keyed bucket's map behind the [`Backend`] trait.

use core::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use bucket4rs_core::{Clock, ConfigError};
use bucket4rs_local::__private::{Update, record_store, update};
use bucket4rs_local::{FastClock, KeyedBucket, KeyedError};

use crate::backend::{Backend, BackendClock, Transaction, Write};
use crate::error::{BackendError, BackendErrorKind};
use crate::format;
use crate::key::StorageKey;

type SharedClock = Arc<dyn Clock + Send + Sync>;

/// Buckets in this process's memory: the map of [`bucket4rs_local::KeyedBucket`], one entry per
/// key holding the record's configuration and state, behind the [`Backend`] trait so that a
/// [`ProxyManager`](crate::ProxyManager) serves them like any other store (a single process's
/// limits, tests, the fallback of a remote store).
///
/// For a per-key limit in one process without the async manager, use
/// [`KeyedBucket`] itself: this backend runs every operation through the public
/// [`Transaction`] protocol (records as bytes), as a backend of your own would.
///
/// - **Atomic per key**: a transaction runs with the key's shard locked exclusively, so the
///   core runs once per call with no retry loop; the backend is
///   [in-process](Backend::is_in_process) (the manager skips its timeout and retries).
/// - **Bounded memory, exactly**: a record is forgotten only when a bucket recreated from its
///   configuration would answer every later request as the kept one (the keyed bucket's rule,
///   [`BucketState::forgettable_at`](bucket4rs_core::BucketState::forgettable_at)), judged on
///   this backend's clock; buckets that can never be forgotten stay until removed. Forgettable
///   records are swept when the map has doubled since the last sweep, when the key cap is
///   reached, and by [`sweep`](Self::sweep).
/// - **Optional hard cap** ([`with_max_keys`](Self::with_max_keys)): once that many keys have
///   a record and none can be forgotten, a new key is refused with
///   [`BackendErrorKind::CapacityExhausted`] rather than evicting a key whose bucket is not
///   full.
/// - **Clock**: [`FastClock`] by default (epoch nanoseconds advanced by the CPU's counter: never
///   steps back with the wall clock), or any [`Clock`] ([`with_clock`](Self::with_clock)).
///   Managers read it as the backend's time ([`TimeSource::backend`](crate::TimeSource::backend),
///   their default here); a manager on a client time source should use the same clock, since
///   forgetting is judged on this one.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let manager = ProxyManager::new(EmbeddedBackend::new().with_max_keys(100_000)?);
/// let config = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::simple(2, Duration::from_secs(60))?)
///     .build()?;
/// let bucket = manager.builder().build("ip:10.0.0.7", move || config.clone())?;
/// assert!(bucket.try_consume(2).await?);
/// assert!(!bucket.try_consume(1).await?);
/// assert_eq!(manager.backend().len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct EmbeddedBackend {
    store: KeyedBucket<Box<[u8]>, SharedClock>,
}

impl fmt::Debug for EmbeddedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedBackend")
            .field("keys", &self.len())
            .finish_non_exhaustive()
    }
}

impl Default for EmbeddedBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl EmbeddedBackend {
    /// An empty backend on [`FastClock`], without a key cap.
    ///
    /// ```
    /// assert!(bucket4rs_distributed::EmbeddedBackend::new().is_empty());
    /// ```
    pub fn new() -> Self {
        Self::with_clock(FastClock)
    }

    /// An empty backend on `clock`, without a key cap.
    ///
    /// ```
    /// use bucket4rs_core::ManualClock;
    /// let backend = bucket4rs_distributed::EmbeddedBackend::with_clock(ManualClock::new(0));
    /// assert!(backend.is_empty());
    /// ```
    pub fn with_clock(clock: impl Clock + Send + Sync + 'static) -> Self {
        Self::on(Arc::new(clock), None).unwrap_or_else(|_| unreachable!("no key cap"))
    }

    fn on(clock: SharedClock, max_keys: Option<usize>) -> Result<Self, ConfigError> {
        Ok(Self {
            store: record_store(clock, max_keys)?,
        })
    }

    /// The same backend (it must still be empty) holding at most `max_keys` keys at once.
    ///
    /// # Errors
    /// [`ConfigError::ZeroMaxKeys`]: a cap of zero would refuse every key.
    ///
    /// ```
    /// let backend = bucket4rs_distributed::EmbeddedBackend::new().with_max_keys(1_000)?;
    /// assert!(bucket4rs_distributed::EmbeddedBackend::new().with_max_keys(0).is_err());
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn with_max_keys(self, max_keys: usize) -> Result<Self, ConfigError> {
        let clock = Arc::clone(self.store.clock());
        Self::on(clock, Some(max_keys))
    }

    /// How many keys have a record.
    ///
    /// ```
    /// assert_eq!(bucket4rs_distributed::EmbeddedBackend::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no key has a record.
    ///
    /// ```
    /// assert!(bucket4rs_distributed::EmbeddedBackend::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// Forgets every record a fresh one would replace exactly; returns how many.
    ///
    /// ```
    /// assert_eq!(bucket4rs_distributed::EmbeddedBackend::new().sweep(), 0);
    /// ```
    pub fn sweep(&self) -> usize {
        self.store.sweep()
    }
}

fn capacity_exhausted(e: KeyedError) -> BackendError {
    match e {
        KeyedError::TooManyKeys { .. } => BackendError::new(
            BackendErrorKind::CapacityExhausted,
            "the embedded backend holds its maximum number of keys",
        ),
        other => BackendError::new(BackendErrorKind::Other, other.to_string()),
    }
}

#[async_trait]
impl Backend for EmbeddedBackend {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        update(&self.store, key.as_bytes(), |current, now| {
            let bytes = current.map(|(config, state)| format::encode(config, state));
            let backend_now = tx.needs_backend_clock().then_some(now);
            match tx.apply(bytes.as_deref(), backend_now) {
                Write::Put { record, .. } => match format::decode(&record) {
                    Ok(r) => ((), Update::Put(r.config, r.state)),
                    // The manager encodes what it decoded: never, but then store nothing.
                    Err(_) => ((), Update::Keep),
                },
                _ => ((), Update::Keep),
            }
        })
        .map_err(capacity_exhausted)
    }

    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self
            .store
            .snapshot(key.as_bytes())
            .map(|s| format::encode(s.configuration(), s.state())))
    }

    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        Ok(self.store.remove(key.as_bytes()))
    }

    fn is_in_process(&self) -> bool {
        true
    }

    fn clock(&self) -> BackendClock {
        if self.store.clock().is_wall_clock_based() {
            BackendClock::WallClock
        } else {
            BackendClock::Monotonic
        }
    }
}
