//! The circuit breaker: after a run of consecutive calls that found the backend down, a
//! manager's calls fail at once while a background probe checks the backend.
//!
//! The state is two atomics in the manager (`Breaker`): the count of consecutive "down"
//! outcomes and whether the breaker is open. A closed breaker costs a call one atomic load
//! before it goes out and one after (a store only when the count was not already zero): no
//! lock, no allocation. The caller whose failure reaches the threshold opens the breaker and
//! spawns the probe task; the probe task is the only thing that closes it, so an open breaker
//! always has exactly one probe.

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use core::time::Duration;
use std::sync::{Arc, Weak};

use super::{Inner, backend_error, with_timeout};
use crate::backend::Backend;
use crate::error::{BackendError, BackendErrorKind, DistributedError};
use crate::key::StorageKey;

/// When a [`ProxyManager`](super::ProxyManager) stops sending calls to a backend that is
/// down, and how it finds out that the backend is back.
///
/// After `failures` consecutive calls that found the backend unavailable (a timeout, or a
/// [`BackendErrorKind::Unavailable`] / [`BackendErrorKind::Timeout`] error; never invalid
/// input, unreadable records or lost compare-and-set races), the breaker opens: every call
/// then fails at once with a [`BackendErrorKind::Unavailable`] error
/// ([`DistributedError::is_unavailable`], so a [`FailurePolicy`](crate::FailurePolicy)
/// decides as for any outage) without reaching the backend. Meanwhile a background task
/// probes the backend every `probe_every` by reading the key of the call that opened the
/// breaker ([`Backend::read`]: a read, which never charges a token); the first probe that
/// gets an answer closes the breaker and calls go through again. Any call that reaches the
/// backend and gets an answer resets the count.
///
/// The default opens after 5 consecutive failures and probes every 500 ms.
/// [`CircuitBreaker::off`] turns it off. In-process backends ([`Backend::is_in_process`])
/// never wait and never have a breaker. The probe runs on the tokio runtime of the call
/// that opened the breaker; if that runtime shuts down, the breaker closes.
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
}

impl Breaker {
    /// The error of a call refused while the breaker is open, if it is.
    #[inline]
    pub(super) fn refuse(&self) -> Result<(), DistributedError> {
        if !self.open.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(self.open_error())
    }

    #[cold]
    fn open_error(&self) -> DistributedError {
        DistributedError::Backend(BackendError::new(
            BackendErrorKind::Unavailable,
            format!(
                "the backend is unavailable: {} consecutive calls failed; calls fail at once \
                 until a probe (every {:?}) reaches it",
                self.threshold, self.probe_every
            ),
        ))
    }

    /// The backend answered: the run of failures is over.
    #[inline]
    fn succeeded(&self) {
        // Read first: on the common path the count is zero and the cache line stays shared.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// The backend was found down; whether this failure opened the breaker (its caller
    /// then starts the probe).
    #[cold]
    fn failed(&self) -> bool {
        let before = self
            .failures
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(1))
            })
            .unwrap_or(u32::MAX);
        before.saturating_add(1) >= self.threshold
            && self
                .open
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    fn close(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }
}

/// Whether an error means that the backend is down (what the breaker counts).
pub(super) fn means_down(e: &DistributedError) -> bool {
    match e {
        DistributedError::Timeout { .. } => true,
        DistributedError::Backend(b) => matches!(
            b.kind(),
            BackendErrorKind::Unavailable | BackendErrorKind::Timeout
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
        Err(e) if means_down(e) => {}
        _ => return breaker.succeeded(),
    }
    // Without a runtime to probe on, the breaker does not open (calls keep their timeout).
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if breaker.failed() {
        handle.spawn(probe(Arc::downgrade(inner), key.clone()));
    }
}

/// Closes the breaker when the probe task ends, however it ends (the backend answered, the
/// manager was dropped, or the runtime shut down and dropped the task).
struct CloseOnDrop<B: Backend>(Weak<Inner<B>>);

impl<B: Backend> Drop for CloseOnDrop<B> {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            if let Some(b) = &inner.breaker {
                b.close();
            }
        }
    }
}

/// The probe task: every `probe_every`, reads `key` (within the manager's timeout) until the
/// backend answers.
async fn probe<B: Backend>(inner: Weak<Inner<B>>, key: StorageKey) {
    let _close = CloseOnDrop(inner.clone());
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
        let read = with_timeout(i.timeout, async {
            i.backend.read(&key).await.map_err(backend_error)
        })
        .await;
        match read {
            Err(e) if means_down(&e) => {}
            // An answer, even an error about the key (e.g. a wrong type): the backend is up.
            _ => return,
        }
    }
}
