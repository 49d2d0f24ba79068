//! The circuit breaker: after a run of consecutive calls that found the backend down, a
//! manager's calls fail at once while a background probe checks the backend.
//!
//! The state is two atomics in the manager (`Breaker`): the count of consecutive "down"
//! outcomes and whether the breaker is open. A closed breaker costs a call one atomic load
//! before it goes out and one after (a store only when the count was not already zero): no
//! lock, no allocation. The caller whose failure reaches the threshold opens the breaker (a
//! new generation) and spawns the probe task of that generation; a task ends when its
//! generation is over. A probe task that cannot run (its runtime is not being driven, e.g. a
//! current-thread runtime entered only by `block_on` calls that fail at once) leaves its
//! timestamp stale: a call that finds it stale probes in its stead, once per interval.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use core::time::Duration;
use std::sync::{Arc, Weak};
use tokio::time::Instant;

use super::{Inner, backend_error, with_timeout};
use crate::backend::Backend;
use crate::error::{BackendError, BackendErrorKind, DistributedError};
use crate::key::StorageKey;

/// When a [`ProxyManager`](super::ProxyManager) stops sending calls to a backend that is
/// down, and how it finds out that the backend is back.
///
/// After `failures` consecutive calls that found the backend unavailable (a timeout, or a
/// [`BackendErrorKind::Unavailable`], [`BackendErrorKind::Timeout`] or
/// [`BackendErrorKind::InDoubt`] error; never invalid input, unreadable records or lost
/// compare-and-set races), the breaker opens: every call
/// then fails at once with a [`BackendErrorKind::Unavailable`] error
/// ([`DistributedError::is_unavailable`], so a failure policy, such as the HTTP layer's,
/// decides as for any outage) without reaching the backend. Meanwhile a background task
/// probes the backend every `probe_every` by reading the key of the call that opened the
/// breaker ([`Backend::read`]: a read, which never charges a token); the first probe that
/// gets an answer closes the breaker and calls go through again. Any call that reaches the
/// backend and gets an answer resets the count.
///
/// The default opens after 5 consecutive failures and probes every 500 ms.
/// [`CircuitBreaker::off`] turns it off. In-process backends ([`Backend::is_in_process`])
/// never wait and never have a breaker. The probe runs on the tokio runtime of the call
/// that opened the breaker; if that runtime shuts down, the breaker closes, and while it is
/// not being driven (a current-thread runtime between `block_on` calls), a call made after
/// two missed probes runs the probe's read itself before it is answered.
///
/// ```
/// use bucket4rs_distributed::{CircuitBreaker, EmbeddedBackend, ProxyManager};
/// use std::time::Duration;
/// let manager = ProxyManager::configure(EmbeddedBackend::new())
///     .circuit_breaker(CircuitBreaker::new(3, Duration::from_millis(200)))
///     .build()?;
/// # Ok::<(), bucket4rs_distributed::DistributedError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CircuitBreaker {
    /// `(failures, probe_every)`, `None` when off.
    settings: Option<(u32, Duration)>,
}

impl CircuitBreaker {
    /// The longest probe interval [`ManagerBuilder::build`](super::ManagerBuilder::build)
    /// accepts: a longer one would leave callers failing long after the backend is back.
    pub(super) const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(60 * 60);

    /// Opens after `failures` consecutive unavailable calls; probes every `probe_every`.
    /// [`ManagerBuilder::build`](super::ManagerBuilder::build) refuses `failures == 0`
    /// (always open) and a `probe_every` of zero (a probe loop hammering the backend) or
    /// above one hour.
    ///
    /// ```
    /// # use bucket4rs_distributed::{CircuitBreaker, EmbeddedBackend, ProxyManager};
    /// # use std::time::Duration;
    /// let zero = CircuitBreaker::new(0, Duration::from_millis(500));
    /// assert!(ProxyManager::configure(EmbeddedBackend::new()).circuit_breaker(zero).build().is_err());
    /// ```
    pub fn new(failures: u32, probe_every: Duration) -> Self {
        Self {
            settings: Some((failures, probe_every)),
        }
    }

    /// No breaker: every call goes to the backend and waits for its timeout.
    ///
    /// ```
    /// # use bucket4rs_distributed::{CircuitBreaker, EmbeddedBackend, ProxyManager};
    /// let m = ProxyManager::configure(EmbeddedBackend::new()).circuit_breaker(CircuitBreaker::off()).build()?;
    /// # Ok::<(), bucket4rs_distributed::DistributedError>(())
    /// ```
    pub fn off() -> Self {
        Self { settings: None }
    }

    /// Refuses settings that can only break things.
    pub(super) fn check(&self) -> Result<(), DistributedError> {
        let Some((failures, every)) = self.settings else {
            return Ok(());
        };
        let refuse = |reason| {
            Err(DistributedError::InvalidSetting {
                setting: "circuit_breaker",
                reason,
            })
        };
        if failures == 0 {
            return refuse(
                "the failure threshold must be at least 1 (0 would never let a call through)",
            );
        }
        if every.is_zero() {
            return refuse("the probe interval must be more than zero");
        }
        if every > Self::MAX_PROBE_INTERVAL {
            return refuse("the probe interval must be at most one hour");
        }
        Ok(())
    }

    /// The breaker state for a manager of `backend` (none when off or in-process).
    pub(super) fn state_for(&self, backend: &impl Backend) -> Option<Breaker> {
        let (threshold, probe_every) = self.settings?;
        (!backend.is_in_process()).then(|| Breaker {
            threshold,
            probe_every,
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            epoch: Instant::now(),
            probed_at: AtomicU64::new(0),
            refused_until_fixed: AtomicBool::new(false),
        })
    }
}

impl Default for CircuitBreaker {
    /// Opens after 5 consecutive unavailable calls, probes every 500 ms.
    fn default() -> Self {
        Self::new(5, Duration::from_millis(500))
    }
}

/// A manager's breaker state.
#[derive(Debug)]
pub(super) struct Breaker {
    threshold: u32,
    probe_every: Duration,
    /// Consecutive calls that found the backend down.
    failures: AtomicU32,
    open: AtomicBool,
    /// Incremented each time the breaker opens; its probe task serves that generation.
    generation: AtomicU64,
    /// The origin of `probed_at`.
    epoch: Instant,
    /// When a probe last started or ended, in nanoseconds since `epoch`.
    probed_at: AtomicU64,
    /// Whether the last failure seen was a refusal that fails until the configuration
    /// changes (a refused TLS handshake): the open breaker's refusals say so too, so a caller
    /// keeps seeing a non-retryable error rather than a retryable "breaker open".
    refused_until_fixed: AtomicBool,
}

impl Breaker {
    /// Whether calls are refused.
    #[inline]
    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn stamp(&self) {
        self.probed_at.store(self.now(), Ordering::Release);
    }

    /// Whether the probe has missed two rounds (its task is not running) and this caller
    /// claimed the round in its stead.
    fn claim_stalled_probe(&self, timeout: Duration) -> bool {
        let round = self.probe_every.saturating_add(timeout).saturating_mul(2);
        let stale = u64::try_from(round.as_nanos()).unwrap_or(u64::MAX);
        let (now, last) = (self.now(), self.probed_at.load(Ordering::Acquire));
        now.saturating_sub(last) > stale
            && self
                .probed_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    #[cold]
    fn open_error(&self) -> DistributedError {
        let until_fixed = self.refused_until_fixed.load(Ordering::Relaxed);
        let e = BackendError::new(
            BackendErrorKind::Unavailable,
            format!(
                "the backend is unavailable: {} consecutive calls failed{}; calls fail at once \
                 until a probe (every {:?}) reaches it",
                self.threshold,
                if until_fixed {
                    ", the last with a refused TLS handshake or refused credentials (it fails \
                     the same way until the certificates, the credentials or the URL change)"
                } else {
                    ""
                },
                self.probe_every
            ),
        );
        DistributedError::Backend(e.refused_until_fixed(until_fixed))
    }

    /// Notes whether the failure just seen fails until the configuration changes.
    fn note(&self, e: &DistributedError) {
        let until_fixed = matches!(e, DistributedError::Backend(b) if b.is_refused_until_fixed());
        self.refused_until_fixed
            .store(until_fixed, Ordering::Relaxed);
    }

    /// The backend answered: the run of failures is over.
    #[inline]
    fn succeeded(&self) {
        // Read first: on the common path the count is zero and the cache line stays shared.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// The backend was found down; the generation this failure opened, if it opened the
    /// breaker (its caller then starts the probe).
    #[cold]
    fn failed(&self) -> Option<u64> {
        let before = self
            .failures
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(1))
            })
            .unwrap_or(u32::MAX);
        let opened = before.saturating_add(1) >= self.threshold
            && self
                .open
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        opened.then(|| {
            self.stamp();
            self.generation
                .fetch_add(1, Ordering::AcqRel)
                .wrapping_add(1)
        })
    }

    /// Whether `generation` is the open breaker's.
    fn serves(&self, generation: u64) -> bool {
        self.is_open() && self.generation.load(Ordering::Acquire) == generation
    }

    fn close(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }
}

/// A call on `key` while the breaker of `inner` is open: refused at once, unless the probe
/// task has stalled, in which case this call runs the probe's read and, when the backend
/// answers, closes the breaker and goes on.
#[cold]
pub(super) async fn while_open<B: Backend>(
    inner: &Inner<B>,
    breaker: &Breaker,
    key: &StorageKey,
) -> Result<(), DistributedError> {
    if !breaker.claim_stalled_probe(inner.timeout) {
        return Err(breaker.open_error());
    }
    let read = probe_read(inner, key).await;
    breaker.stamp();
    if read {
        breaker.close();
        Ok(())
    } else {
        Err(breaker.open_error())
    }
}

/// One probe: a read of `key` within the manager's timeout; whether the backend answered
/// (even with an error about the key, e.g. a wrong type).
async fn probe_read<B: Backend>(inner: &Inner<B>, key: &StorageKey) -> bool {
    let read = with_timeout(inner.timeout, async {
        inner.backend.read(key).await.map_err(backend_error)
    })
    .await;
    match read {
        Err(e) if means_down(&e) => {
            // What the open breaker's refusals say follows the probe's failures.
            if let Some(b) = &inner.breaker {
                b.note(&e);
            }
            false
        }
        _ => true,
    }
}

/// Whether an error means that the backend is down (what the breaker counts).
pub(super) fn means_down(e: &DistributedError) -> bool {
    match e {
        DistributedError::Timeout { .. } => true,
        DistributedError::Backend(b) => matches!(
            b.kind(),
            BackendErrorKind::Unavailable | BackendErrorKind::Timeout | BackendErrorKind::InDoubt
        ),
        _ => false,
    }
}

/// Counts the outcome of a call that went to the backend of `inner` for `key`; opens the
/// breaker and starts its probe when this is the failure that reaches the threshold.
pub(super) fn record<B: Backend, T>(
    inner: &Arc<Inner<B>>,
    key: &StorageKey,
    outcome: &Result<T, DistributedError>,
) {
    let Some(breaker) = &inner.breaker else {
        return;
    };
    match outcome {
        Err(e) if means_down(e) => breaker.note(e),
        _ => return breaker.succeeded(),
    }
    // Without a runtime to probe on, the breaker does not open (calls keep their timeout).
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if let Some(generation) = breaker.failed() {
        handle.spawn(probe(Arc::downgrade(inner), key.clone(), generation));
    }
}

/// Closes the breaker when the probe task of its generation ends, however it ends (the
/// backend answered, or the runtime shut down and dropped the task).
struct CloseOnDrop<B: Backend>(Weak<Inner<B>>, u64);

impl<B: Backend> Drop for CloseOnDrop<B> {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade()
            && let Some(b) = inner.breaker.as_ref().filter(|b| b.serves(self.1))
        {
            b.close();
        }
    }
}

/// The probe task of `generation`: every `probe_every`, reads `key` (within the manager's
/// timeout) until the backend answers, the generation is over (the breaker was closed, e.g.
/// by a call that probed in a stalled task's stead) or the manager is dropped.
async fn probe<B: Backend>(inner: Weak<Inner<B>>, key: StorageKey, generation: u64) {
    let _close = CloseOnDrop(inner.clone(), generation);
    let Some(every) = inner
        .upgrade()
        .and_then(|i| i.breaker.as_ref().map(|b| b.probe_every))
    else {
        return;
    };
    loop {
        tokio::time::sleep(every).await;
        // Not held across the sleep: a dropped manager ends the probe.
        let Some(i) = inner.upgrade() else {
            return;
        };
        let Some(b) = i.breaker.as_ref().filter(|b| b.serves(generation)) else {
            return;
        };
        b.stamp();
        let answered = probe_read(&i, &key).await;
        b.stamp();
        if answered {
            return;
        }
    }
}
