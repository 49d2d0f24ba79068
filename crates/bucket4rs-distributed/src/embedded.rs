//! The embedded in-memory backend: the default, and a keyed in-process limiter.

use core::borrow::Borrow;
use core::fmt;
use core::hash::{Hash, Hasher};
use core::sync::atomic::{AtomicUsize, Ordering};
use core::time::Duration;
use std::sync::Arc;

use async_trait::async_trait;
use bucket4rs_core::{Clock, SystemNanosClock};
use dashmap::DashMap;
use dashmap::mapref::entry::Entry as MapEntry;
use foldhash::fast::RandomState;
use smallvec::SmallVec;

use crate::backend::{Backend, BackendClock, DecodedWrite, Transaction};
use crate::error::{BackendError, BackendErrorKind};
use crate::format::{self, Record};
use crate::key::{StorageKey, StorageKeyRef};

/// A key's record, kept decoded: the configuration is an `Arc` shared with the supplier that
/// created it, the state a small vector updated in place.
///
/// Expiry is tracked lazily for consumptions: an operation that only takes tokens never
/// brings the instant the bucket is full again earlier ([`DecodedWrite::Consumed`]), so the
/// expiry computed at an earlier write stays a valid lower bound, and the exact instant is
/// computed from the last write only once that bound has passed (or on a read). A key is
/// therefore dropped exactly when it would have been with a TTL computed at every write.
///
/// 64 bytes besides the key (the expiry fields add 8 to the 56 of a record and an
/// `Option<i64>` expiry).
struct Slot {
    record: Record,
    /// Backend-clock reading after which the key may be dropped ([`NEVER`]: never); while
    /// `lazy` is set (not [`NOT_LAZY`]), a lower bound of that instant.
    expires_at: i64,
    /// The TTL margin `expires_at` was computed with, in nanoseconds (saturated).
    margin: u64,
    /// The instant of the last write when it left its TTL uncomputed ([`NOT_LAZY`] when
    /// it did not): the exact expiry is then `lazy + record.ttl(lazy, margin)`. Only for
    /// operations computed at the backend-clock reading of the write (the default time
    /// source; with a client clock the TTL is computed at once).
    lazy: i64,
}

/// A `lazy` for a slot whose `expires_at` is exact (a write at that very reading is not
/// made lazy).
const NOT_LAZY: i64 = i64::MIN;

/// An `expires_at` that never comes (a TTL that reaches the end of the clock's range counts
/// as never too).
const NEVER: i64 = i64::MAX;

fn nanos(margin: Duration) -> u64 {
    u64::try_from(margin.as_nanos()).unwrap_or(u64::MAX)
}

impl Slot {
    fn new(record: Record, at: i64, ttl: Option<Duration>, margin: Duration) -> Self {
        Self {
            record,
            expires_at: expiry(at, ttl),
            margin: nanos(margin),
            lazy: NOT_LAZY,
        }
    }

    /// After a write at backend-clock reading `at` that gave its TTL.
    fn updated(&mut self, at: i64, ttl: Option<Duration>, margin: Duration) {
        self.expires_at = expiry(at, ttl);
        self.margin = nanos(margin);
        self.lazy = NOT_LAZY;
    }

    /// After a write at `at` answered with [`DecodedWrite::Consumed`] (`now`: the operation's
    /// instant): the current expiry stays as a lower bound, unless there is none to keep
    /// (the key never expired), it was computed with another margin, or the operation ran
    /// on another clock than the backend's.
    ///
    /// Inlined (it runs on every consumption); the exact TTL is computed out of line.
    #[inline]
    fn consumed(&mut self, at: i64, now: i64, margin: Duration) {
        if self.expires_at != NEVER && self.margin == nanos(margin) && at == now && now != NOT_LAZY
        {
            self.lazy = now;
        } else {
            self.consumed_exact(at, now, margin);
        }
    }

    /// [`consumed`](Self::consumed) when the expiry must be computed now.
    #[inline(never)]
    fn consumed_exact(&mut self, at: i64, now: i64, margin: Duration) {
        let ttl = self.record.ttl(now, margin);
        self.updated(at, ttl, margin);
    }

    /// The exact expiry instant ([`NEVER`]: never).
    fn exact_expiry(&self) -> i64 {
        match self.lazy {
            NOT_LAZY => self.expires_at,
            at => expiry(at, self.record.ttl(at, Duration::from_nanos(self.margin))),
        }
    }

    /// Whether the key has expired at `now`, without updating the slot.
    fn expired(&self, now: i64) -> bool {
        now >= self.expires_at && self.expires_at != NEVER && now >= self.exact_expiry()
    }

    /// Whether the key has expired at `now`; computes and keeps the exact expiry when the
    /// lower bound has passed.
    ///
    /// Inlined for its common answer (the lower bound has not passed); the rest is out of
    /// line.
    #[inline]
    fn expired_mut(&mut self, now: i64) -> bool {
        if now < self.expires_at || self.expires_at == NEVER {
            return false;
        }
        self.expired_exact(now)
    }

    /// [`expired_mut`](Self::expired_mut) once the lower bound has passed.
    #[inline(never)]
    fn expired_exact(&mut self, now: i64) -> bool {
        if self.lazy != NOT_LAZY {
            self.expires_at = self.exact_expiry();
            self.lazy = NOT_LAZY;
        }
        now >= self.expires_at && self.expires_at != NEVER
    }
}

/// The backend-clock reading `ttl` after `at` ([`NEVER`] for `None`).
fn expiry(at: i64, ttl: Option<Duration>) -> i64 {
    ttl.map_or(NEVER, |t| {
        at.saturating_add(i64::try_from(t.as_nanos()).unwrap_or(i64::MAX))
    })
}

/// A key of the map: a [`StorageKey`]'s bytes, looked up by them (`[u8]`'s hashing and
/// equality), so a key encoded on the stack needs no UTF-8 check to be found
/// ([`EmbeddedBackend::take_live`]).
///
/// Up to [`INLINE_KEY`] bytes are kept in the map's entry itself, beside the record (whose
/// state is inline too for a one-bandwidth bucket, see `BucketState`): a live key's lookup
/// then reads the entry (104 bytes, `tests::an_entry_is_104_bytes`) and no other
/// allocation. With many clients each lookup reads its key's data cold, and the lines it
/// reads are what a request costs (docs/http-overhead.md, "Both at once"). Longer keys are
/// kept on the heap.
#[derive(PartialEq, Eq)]
struct MapKey(SmallVec<[u8; INLINE_KEY]>);

/// The longest key kept inline in the map's entry: with the manager's default prefix
/// (`bucket4rs:`), a client key of up to 14 bytes, such as a short API key or most IPv4
/// addresses. The key takes 32 bytes of the entry (`smallvec`'s `union` feature).
const INLINE_KEY: usize = 24;

impl Hash for MapKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.as_slice().hash(state);
    }
}

impl Borrow<[u8]> for MapKey {
    fn borrow(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Sweeps never run more often than this many new keys apart.
const MIN_SWEEP_INTERVAL: usize = 1024;

/// Buckets in this process's memory, in a sharded concurrent map ([`dashmap`]).
///
/// - **Atomic per key**: a transaction runs under the write lock of the key's shard, so the
///   core runs once per call with no retry loop.
/// - **Decoded records**: records are held as configuration + state, never as bytes;
///   transactions run through [`Transaction::apply_decoded_lazy`] (no decoding, checksum,
///   encoding or buffer per call), and the backend is [in-process](Backend::is_in_process)
///   (the manager skips its timeout and retries). [`read`](Backend::read) encodes on demand.
///   The manager's in-process consumptions of a live key skip the transaction and run on
///   the record in place ([`ProxyManager::in_process_bucket`](crate::ProxyManager::in_process_bucket)).
/// - **Bounded memory**: an idle key is dropped once its bucket would be full again (plus
///   the manager's TTL margin) — never earlier, which would hand its client a fresh bucket.
///   Expired keys read as absent at once and are swept when the map has doubled since the
///   last sweep (amortised O(1) per new key), or by [`sweep`](Self::sweep). The expiry
///   instant is computed lazily for consumptions ([`Transaction::apply_decoded_lazy`]): the
///   one of an earlier write stays as a lower bound (taking tokens never makes a bucket full
///   sooner), and the exact one is computed from the last write once that bound has passed —
///   so a key is dropped exactly when a TTL computed at every write would drop it.
/// - **Optional hard cap** ([`with_max_keys`](Self::with_max_keys)): once that many live keys
///   exist, a new key is refused with [`BackendErrorKind::CapacityExhausted`] (after a sweep)
///   rather than evicting a key whose bucket is not full.
///
/// - **Hashing**: keys are hashed with [`foldhash`]'s `fast::RandomState` (the default of
///   `hashbrown`), seeded at random per map, rather than std's SipHash-1-3: about a tenth of
///   the instructions for a short key, which matters on a per-request path. Keys are often
///   chosen by clients (IP addresses, API keys), so the hasher must resist hash flooding;
///   foldhash's per-map random seed is the common trade-off (an attacker cannot precompute
///   colliding keys offline), though it does not claim SipHash's cryptographic strength
///   against an adversary who can observe timings at length.
///
/// Why `dashmap`: its `entry` API gives an exclusive per-shard lock for a read-modify-write
/// without a per-key mutex or a compare-and-swap loop; it is mature, widely used, and its
/// shard count scales with the cores. A lock-free map (`papaya`) would need a CAS loop and a
/// clone per update; `scc` is comparable but less common.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let limiter = ProxyManager::new(EmbeddedBackend::new().with_max_keys(100_000));
/// let per_ip = BucketConfiguration::builder()
///     .add_limit(Bandwidth::simple(2, Duration::from_secs(1))?)
///     .build()?;
/// for ip in ["10.0.0.1", "10.0.0.2"] {
///     let c = per_ip.clone();
///     let bucket = limiter.builder().build(ip, move || c.clone())?;
///     assert!(bucket.try_consume(2).await?);
///     assert!(!bucket.try_consume(1).await?);
/// }
/// assert_eq!(limiter.backend().len(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct EmbeddedBackend {
    map: DashMap<MapKey, Slot, RandomState>,
    clock: Arc<dyn Clock + Send + Sync>,
    max_keys: Option<usize>,
    live: AtomicUsize,
    next_sweep: AtomicUsize,
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
    /// An empty backend on the system clock (nanoseconds since the epoch), without a key cap.
    ///
    /// ```
    /// assert!(bucket4rs_distributed::EmbeddedBackend::new().is_empty());
    /// ```
    pub fn new() -> Self {
        Self::with_clock(SystemNanosClock)
    }

    /// An empty backend on `clock` (its time source for [`TimeSource::backend`](crate::TimeSource::backend)
    /// and for expiry).
    ///
    /// ```
    /// use bucket4rs_core::ManualClock;
    /// let backend = bucket4rs_distributed::EmbeddedBackend::with_clock(ManualClock::new(0));
    /// ```
    pub fn with_clock(clock: impl Clock + Send + Sync + 'static) -> Self {
        Self {
            map: DashMap::with_hasher(RandomState::default()),
            clock: Arc::new(clock),
            max_keys: None,
            live: AtomicUsize::new(0),
            next_sweep: AtomicUsize::new(MIN_SWEEP_INTERVAL),
        }
    }

    /// Caps the number of keys.
    ///
    /// ```
    /// let backend = bucket4rs_distributed::EmbeddedBackend::new().with_max_keys(10);
    /// ```
    #[must_use]
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// Keys held, including expired ones not yet swept.
    ///
    /// ```
    /// assert_eq!(bucket4rs_distributed::EmbeddedBackend::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Whether no key is held.
    ///
    /// ```
    /// assert!(bucket4rs_distributed::EmbeddedBackend::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired key now; how many.
    ///
    /// ```
    /// assert_eq!(bucket4rs_distributed::EmbeddedBackend::new().sweep(), 0);
    /// ```
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_nanos();
        let mut dropped = 0;
        self.map.retain(|_, slot| {
            let keep = !slot.expired_mut(now);
            if !keep {
                dropped += 1;
            }
            keep
        });
        self.live.fetch_sub(dropped, Ordering::AcqRel);
        let left = self.len();
        self.next_sweep.store(
            left.saturating_mul(2).max(MIN_SWEEP_INTERVAL),
            Ordering::Release,
        );
        dropped
    }

    fn try_reserve(&self) -> bool {
        let Some(max) = self.max_keys else {
            self.live.fetch_add(1, Ordering::AcqRel);
            return true;
        };
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// An absent or expired key: through the map's entry (clones the key), with the key cap
    /// and the sweeps.
    fn transact_slow(
        &self,
        key: StorageKeyRef<'_>,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        let mut swept = false;
        loop {
            let now = self.clock.now_nanos();
            let backend_now = tx.needs_backend_clock().then_some(now);
            match self
                .map
                .entry(MapKey(SmallVec::from_slice(key.as_str().as_bytes())))
            {
                MapEntry::Occupied(mut o) => {
                    let live = !o.get_mut().expired_mut(now);
                    let current = if live {
                        Some(&mut o.get_mut().record)
                    } else {
                        None
                    };
                    let margin = tx.ttl_margin();
                    match tx.apply_decoded_lazy(current, backend_now) {
                        DecodedWrite::Updated { ttl } => o.get_mut().updated(now, ttl, margin),
                        DecodedWrite::Consumed {
                            now: op_now,
                            margin,
                        } => {
                            o.get_mut().consumed(now, op_now, margin);
                        }
                        DecodedWrite::Created { record, ttl } => {
                            *o.get_mut() = Slot::new(record, now, ttl, margin);
                        }
                        DecodedWrite::Keep if !live => {
                            o.remove();
                            self.live.fetch_sub(1, Ordering::AcqRel);
                        }
                        DecodedWrite::Keep => {}
                    }
                    return Ok(());
                }
                MapEntry::Vacant(v) => {
                    if !self.try_reserve() {
                        drop(v);
                        if swept {
                            return Err(BackendError::new(
                                BackendErrorKind::CapacityExhausted,
                                "the embedded backend holds its maximum number of keys",
                            ));
                        }
                        self.sweep();
                        swept = true;
                        continue;
                    }
                    match tx.apply_decoded_lazy(None, backend_now) {
                        DecodedWrite::Created { record, ttl } => {
                            v.insert(Slot::new(record, now, ttl, tx.ttl_margin()));
                        }
                        // `Updated` and `Consumed` need a record, and none was given.
                        DecodedWrite::Updated { .. }
                        | DecodedWrite::Consumed { .. }
                        | DecodedWrite::Keep => {
                            self.live.fetch_sub(1, Ordering::AcqRel);
                            return Ok(());
                        }
                    }
                    if self.len() > self.next_sweep.load(Ordering::Acquire) {
                        self.sweep();
                    }
                    return Ok(());
                }
            }
        }
    }
}

impl EmbeddedBackend {
    /// The transaction, synchronously (both [`Backend::transact`] and
    /// [`Backend::transact_now`] run this).
    fn transact_sync(
        &self,
        key: StorageKeyRef<'_>,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        let now = self.clock.now_nanos();
        let backend_now = tx.needs_backend_clock().then_some(now);
        // The common case, a live key: its shard's write lock through a borrowed key (no
        // key clone), the record updated in place.
        if let Some(mut slot) = self.map.get_mut(key.as_str().as_bytes()) {
            if !slot.expired_mut(now) {
                match tx.apply_decoded_lazy(Some(&mut slot.record), backend_now) {
                    DecodedWrite::Updated { ttl } => slot.updated(now, ttl, tx.ttl_margin()),
                    DecodedWrite::Consumed {
                        now: op_now,
                        margin,
                    } => {
                        slot.consumed(now, op_now, margin);
                    }
                    // Only for an absent key; never from a transaction given a record.
                    DecodedWrite::Created { record, ttl } => {
                        *slot = Slot::new(record, now, ttl, tx.ttl_margin());
                    }
                    DecodedWrite::Keep => {}
                }
                return Ok(());
            }
        }
        self.transact_slow(key, tx)
    }

    /// The manager's in-place path for an operation that only takes tokens, computed at
    /// this backend's clock ([`InProcessBucket`](crate::InProcessBucket) with the default
    /// time source): `run` is given the live record of `key` and the clock reading, under
    /// the key's shard lock, and answers its output and whether it took tokens. The same
    /// steps as [`transact_sync`](Self::transact_sync) with a transaction answering
    /// [`DecodedWrite::Consumed`] (or [`DecodedWrite::Keep`]), without the transaction.
    ///
    /// `None`, with `run` not called, when the key is absent or expired: the caller then
    /// runs its transaction (which creates the record, with the key cap and the sweeps).
    #[inline]
    pub(crate) fn take_live<T>(
        &self,
        key: &[u8],
        margin: Duration,
        run: impl FnOnce(&mut Record, i64) -> (T, bool),
    ) -> Option<T> {
        let now = self.clock.now_nanos();
        let mut slot = self.map.get_mut(key)?;
        if slot.expired_mut(now) {
            return None;
        }
        let (out, took) = run(&mut slot.record, now);
        if took {
            slot.consumed(now, now, margin);
        }
        Some(out)
    }
}

#[async_trait]
impl Backend for EmbeddedBackend {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        self.transact_sync(key.as_key_ref(), tx)
    }

    fn supports_transact_now(&self) -> bool {
        true
    }

    fn transact_now(
        &self,
        key: StorageKeyRef<'_>,
        tx: &mut dyn Transaction,
    ) -> Option<Result<(), BackendError>> {
        Some(self.transact_sync(key, tx))
    }

    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        let now = self.clock.now_nanos();
        Ok(self
            .map
            .get(key.as_bytes())
            .filter(|s| !s.expired(now))
            .map(|s| format::encode(&s.record.config, &s.record.state)))
    }

    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        let now = self.clock.now_nanos();
        match self.map.remove(key.as_bytes()) {
            Some((_, slot)) => {
                self.live.fetch_sub(1, Ordering::AcqRel);
                Ok(!slot.expired(now))
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

#[cfg(test)]
mod tests {
    /// The entry's size is part of what many clients cost (the lines a lookup reads) and of
    /// the memory per key: a change to `MapKey`, `Slot` or `Record` that grows it should be
    /// a decision, with the figures of docs/http-overhead.md ("Both at once") measured again.
    #[test]
    fn an_entry_is_104_bytes() {
        assert_eq!(
            core::mem::size_of::<(super::MapKey, super::Slot)>(),
            104,
            "the embedded map's entry changed size"
        );
    }
}
