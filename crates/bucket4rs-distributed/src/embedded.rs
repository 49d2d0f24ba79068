//! The embedded backend: a store in this process's memory, keys to record bytes with the
//! expiry the manager asks for, honoured as Redis honours `PX`.

use core::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bucket4rs_core::{Clock, ConfigError};
use bucket4rs_local::FastClock;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use crate::backend::{Backend, BackendClock, Transaction, Write};
use crate::error::{BackendError, BackendErrorKind};
use crate::key::StorageKey;

type SharedClock = Arc<dyn Clock + Send + Sync>;

/// The least number of keys between two automatic sweeps.
const MIN_SWEEP_INTERVAL: usize = 1024;

/// A store of bucket records in this process's memory: each key holds the record bytes the
/// manager wrote and the moment they expire, the way a Redis key holds a string set with
/// `PX`. It is written against the public [`Backend`] trait only, as a backend of your own
/// would be, and serves a [`ProxyManager`](crate::ProxyManager) like any remote store: the
/// stand-in for one in tests, and the store of a single process whose code is written for a
/// shared one.
///
/// For a per-key limit in one process, use [`KeyedBucket`](bucket4rs_local::KeyedBucket):
/// no async manager, no records, no codec, one lock-free word per key.
///
/// - **Atomic per key**: a transaction runs with the key's shard of a sharded map locked
///   exclusively, so it reads, applies and writes once, with no retry loop; the backend is
///   [in-process](Backend::is_in_process) (the manager skips its timeout and retries).
/// - **Expiry, as asked**: a record written with a TTL expires that long after the write, on
///   this backend's clock; an expired record reads as absent and is dropped when it is next
///   touched, by a sweep once the map has doubled since the last one, when the key cap is
///   reached, or by [`sweep`](Self::sweep). The manager asks for the TTL after which a bucket
///   recreated from the record's configuration answers every request as the stored one, plus
///   its [margin](crate::ManagerBuilder::ttl_margin), so expiry never changes an answer; a
///   record written without one stays until it is removed.
/// - **Optional hard cap** ([`with_max_keys`](Self::with_max_keys)): once that many keys hold
///   a record that has not expired, a new key is refused with
///   [`BackendErrorKind::CapacityExhausted`], never by evicting a live record.
/// - **Clock**: [`FastClock`] by default (epoch nanoseconds advanced by the CPU's counter: never
///   steps back with the wall clock), or any [`Clock`] ([`with_clock`](Self::with_clock)).
///   Managers read it as the backend's time ([`TimeSource::backend`](crate::TimeSource::backend),
///   their default here); expiry is judged on it whatever the manager's time source.
/// - **Keys** are hashed with SipHash under a random key (`std`'s `RandomState`), as storage
///   keys come from clients.
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
    map: DashMap<StorageKey, Stored>,
    clock: SharedClock,
    max_keys: Option<usize>,
    /// Keys in the map (expired ones included until dropped): what the cap counts.
    len: AtomicUsize,
    /// The length above which the next write sweeps.
    next_sweep: AtomicUsize,
}

/// A key's record and when it expires (a reading of the backend's clock; `None`: never).
struct Stored {
    record: Vec<u8>,
    expires_at: Option<i64>,
}

impl Stored {
    fn live(&self, now: i64) -> bool {
        self.expires_at.is_none_or(|at| now < at)
    }
}

impl fmt::Debug for EmbeddedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedBackend")
            .field("keys", &self.len())
            .field("max_keys", &self.max_keys)
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
        Self {
            map: DashMap::new(),
            clock: Arc::new(clock),
            max_keys: None,
            len: AtomicUsize::new(0),
            next_sweep: AtomicUsize::new(MIN_SWEEP_INTERVAL),
        }
    }

    /// The same backend holding at most `max_keys` keys with a live record at once.
    ///
    /// # Errors
    /// [`ConfigError::ZeroMaxKeys`]: a cap of zero would refuse every key.
    ///
    /// ```
    /// let backend = bucket4rs_distributed::EmbeddedBackend::new().with_max_keys(1_000)?;
    /// assert!(bucket4rs_distributed::EmbeddedBackend::new().with_max_keys(0).is_err());
    /// # Ok::<(), bucket4rs_core::ConfigError>(())
    /// ```
    pub fn with_max_keys(mut self, max_keys: usize) -> Result<Self, ConfigError> {
        if max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        self.max_keys = Some(max_keys);
        Ok(self)
    }

    /// How many keys hold a record (expired records not yet dropped included).
    ///
    /// ```
    /// assert_eq!(bucket4rs_distributed::EmbeddedBackend::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether no key holds a record.
    ///
    /// ```
    /// assert!(bucket4rs_distributed::EmbeddedBackend::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired record; returns how many.
    ///
    /// ```
    /// assert_eq!(bucket4rs_distributed::EmbeddedBackend::new().sweep(), 0);
    /// ```
    pub fn sweep(&self) -> usize {
        self.sweep_at(self.clock.now_nanos())
    }

    fn sweep_at(&self, now: i64) -> usize {
        let mut dropped = 0;
        self.map.retain(|_, stored| {
            let live = stored.live(now);
            dropped += usize::from(!live);
            live
        });
        let left = self
            .len
            .fetch_sub(dropped, Ordering::Relaxed)
            .saturating_sub(dropped);
        self.next_sweep.store(
            left.saturating_mul(2).max(MIN_SWEEP_INTERVAL),
            Ordering::Relaxed,
        );
        dropped
    }

    /// Counts one more key, within the cap.
    fn count_key(&self) -> bool {
        match self.max_keys {
            None => {
                self.len.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(max) => self
                .len
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < max).then_some(n + 1)
                })
                .is_ok(),
        }
    }

    /// Runs `tx` on the absent (or expired, then dropped) key of `entry`.
    fn create(
        &self,
        entry: Entry<'_, StorageKey, Stored>,
        tx: &mut dyn Transaction,
        now: i64,
    ) -> Result<(), BackendError> {
        let backend_now = tx.needs_backend_clock().then_some(now);
        let write = tx.apply(None, backend_now);
        match (entry, write) {
            (Entry::Occupied(mut o), Write::Put { record, ttl }) => {
                *o.get_mut() = Stored::new(record, ttl, now);
            }
            (Entry::Occupied(o), _) => {
                o.remove();
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            (Entry::Vacant(v), Write::Put { record, ttl }) => {
                if !self.count_key() {
                    return Err(BackendError::new(
                        BackendErrorKind::CapacityExhausted,
                        "the embedded backend holds its maximum number of keys",
                    ));
                }
                v.insert(Stored::new(record, ttl, now));
            }
            (Entry::Vacant(_), _) => {}
        }
        Ok(())
    }
}

impl Stored {
    fn new(record: Vec<u8>, ttl: Option<core::time::Duration>, now: i64) -> Self {
        // A TTL beyond the clock's range never comes: the record is kept.
        let expires_at = ttl
            .and_then(|t| i64::try_from(t.as_nanos()).ok())
            .and_then(|t| now.checked_add(t));
        Self { record, expires_at }
    }

    /// Runs `tx` on this live record and stores what it writes.
    fn run(&mut self, tx: &mut dyn Transaction, now: i64) {
        let backend_now = tx.needs_backend_clock().then_some(now);
        if let Write::Put { record, ttl } = tx.apply(Some(&self.record), backend_now) {
            *self = Self::new(record, ttl, now);
        }
    }
}

#[async_trait]
impl Backend for EmbeddedBackend {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        let now = self.clock.now_nanos();
        // A key with a record: found without allocating, its shard locked while `tx` runs.
        if let Some(mut stored) = self.map.get_mut(key)
            && stored.live(now)
        {
            stored.run(tx, now);
            return Ok(());
        }
        // Room is made before the key's shard is locked (a sweep locks every shard).
        let full = self.max_keys.is_some_and(|max| self.len() >= max);
        if full || self.len() > self.next_sweep.load(Ordering::Relaxed) {
            self.sweep_at(now);
        }
        match self.map.entry(key.clone()) {
            // Written by another caller since the look-up: run on that record.
            Entry::Occupied(mut o) if o.get().live(now) => {
                o.get_mut().run(tx, now);
                Ok(())
            }
            entry => self.create(entry, tx, now),
        }
    }

    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        let now = self.clock.now_nanos();
        Ok(self
            .map
            .get(key)
            .filter(|s| s.live(now))
            .map(|s| s.record.clone()))
    }

    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        let now = self.clock.now_nanos();
        match self.map.remove(key) {
            Some((_, stored)) => {
                self.len.fetch_sub(1, Ordering::Relaxed);
                Ok(stored.live(now))
            }
            None => Ok(false),
        }
    }

    fn is_in_process(&self) -> bool {
        true
    }

    fn clock(&self) -> BackendClock {
        if self.clock.is_wall_clock_based() {
            BackendClock::WallClock
        } else {
            BackendClock::Monotonic
        }
    }
}
