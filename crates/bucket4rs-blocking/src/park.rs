//! How a blocking caller waits: the [`ParkStrategy`] trait and its implementations.

use core::fmt;
use core::time::Duration;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use bucket4rs_core::ManualClock;

/// A wait was cut short (Rust threads have no interrupt: a [`ParkStrategy`] reports it).
///
/// ```
/// use bucket4rs_blocking::Interrupted;
/// assert_eq!(Interrupted.to_string(), "the wait was interrupted");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Interrupted;

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the wait was interrupted")
    }
}

impl core::error::Error for Interrupted {}

/// How a blocking caller waits for its reserved tokens (Bucket4j's `BlockingStrategy`).
///
/// `park` is only called with a non-zero duration and must return once *at least* that long
/// has passed on the bucket's clock, or fail with [`Interrupted`] to cancel the wait (the
/// caller then gives its tokens back). Implementations: [`ThreadPark`] (the default),
/// [`CancelToken`] (cancellable from another thread), [`ManualClockPark`] (tests).
///
/// ```
/// use bucket4rs_blocking::{Interrupted, ParkStrategy};
/// use std::time::Duration;
///
/// /// Refuses to wait more than a second: longer waits are cancelled at once.
/// struct Impatient;
/// impl ParkStrategy for Impatient {
///     fn park(&self, duration: Duration) -> Result<(), Interrupted> {
///         if duration > Duration::from_secs(1) {
///             return Err(Interrupted);
///         }
///         std::thread::sleep(duration);
///         Ok(())
///     }
/// }
/// assert_eq!(Impatient.park(Duration::from_secs(5)), Err(Interrupted));
/// ```
#[doc(alias = "blocking_strategy")]
pub trait ParkStrategy {
    /// Waits `duration`, or fails with [`Interrupted`] when the wait is cancelled.
    ///
    /// # Errors
    /// [`Interrupted`] when the wait is cancelled before `duration` has passed.
    fn park(&self, duration: Duration) -> Result<(), Interrupted>;
}

impl<P: ParkStrategy + ?Sized> ParkStrategy for &P {
    fn park(&self, duration: Duration) -> Result<(), Interrupted> {
        (**self).park(duration)
    }
}

impl<P: ParkStrategy + ?Sized> ParkStrategy for Arc<P> {
    fn park(&self, duration: Duration) -> Result<(), Interrupted> {
        (**self).park(duration)
    }
}

/// The default strategy: the thread sleeps until the deadline (a `std::thread::sleep` loop
/// against `Instant`, so an early wake-up sleeps again). It never spins and cannot be
/// interrupted.
///
/// ```
/// use bucket4rs_blocking::{ParkStrategy, ThreadPark};
/// use std::time::{Duration, Instant};
///
/// let start = Instant::now();
/// ThreadPark.park(Duration::from_millis(5))?;
/// assert!(start.elapsed() >= Duration::from_millis(5));
/// # Ok::<(), bucket4rs_blocking::Interrupted>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ThreadPark;

impl ThreadPark {
    /// Sleeps at least `duration` (infallible form of [`ParkStrategy::park`]).
    pub(crate) fn sleep(&self, duration: Duration) {
        let start = Instant::now();
        loop {
            let elapsed = start.elapsed();
            if elapsed >= duration {
                return;
            }
            std::thread::sleep(duration - elapsed);
        }
    }
}

impl ParkStrategy for ThreadPark {
    fn park(&self, duration: Duration) -> Result<(), Interrupted> {
        self.sleep(duration);
        Ok(())
    }
}

#[derive(Debug, Default)]
struct CancelState {
    cancelled: Mutex<bool>,
    wake: Condvar,
}

/// A cancellable park strategy: waits on a condition variable until the deadline, and fails
/// with [`Interrupted`] as soon as any clone of the token is [cancelled](CancelToken::cancel).
///
/// Cancellation is sticky, like `tokio_util`'s `CancellationToken`: once cancelled, every
/// later wait on the token fails at once (waits of zero never park, so they still succeed).
/// A cancelled wait gives its reserved tokens back to the bucket; see the crate docs.
///
/// ```
/// use bucket4rs_blocking::{BlockingBucketExt, CancelToken, WaitError};
/// use bucket4rs_local::Bucket;
/// use std::time::{Duration, Instant};
///
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(3600)))
///     .build()?;
/// let token = CancelToken::new();
/// let canceller = token.clone();
/// let start = Instant::now();
/// std::thread::scope(|s| {
///     s.spawn(move || {
///         std::thread::sleep(Duration::from_millis(20));
///         canceller.cancel();
///     });
///     // 2 tokens: one now, one in an hour; cancelled after ~20 ms instead.
///     let result = bucket.as_blocking().consume_with(2, &token);
///     assert_eq!(result, Err(WaitError::Interrupted));
/// });
/// assert!(start.elapsed() < Duration::from_secs(60));
/// assert_eq!(bucket.available_tokens(), 1); // both reserved tokens came back, capped at capacity
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct CancelToken {
    state: Arc<CancelState>,
}

impl CancelToken {
    /// A token that is not cancelled.
    ///
    /// ```
    /// assert!(!bucket4rs_blocking::CancelToken::new().is_cancelled());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the token: every wait on it (or on a clone) fails with [`Interrupted`], now and
    /// later. Wakes the waiting threads at once.
    ///
    /// ```
    /// use bucket4rs_blocking::{CancelToken, Interrupted, ParkStrategy};
    /// use std::time::Duration;
    /// let token = CancelToken::new();
    /// token.clone().cancel();
    /// assert_eq!(token.park(Duration::from_secs(3600)), Err(Interrupted));
    /// ```
    #[doc(alias = "interrupt")]
    pub fn cancel(&self) {
        let mut cancelled = self
            .state
            .cancelled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *cancelled = true;
        drop(cancelled);
        self.state.wake.notify_all();
    }

    /// Whether the token was cancelled.
    ///
    /// ```
    /// let token = bucket4rs_blocking::CancelToken::new();
    /// token.cancel();
    /// assert!(token.is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        *self
            .state
            .cancelled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl ParkStrategy for CancelToken {
    fn park(&self, duration: Duration) -> Result<(), Interrupted> {
        let start = Instant::now();
        let mut cancelled = self
            .state
            .cancelled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if *cancelled {
                return Err(Interrupted);
            }
            let elapsed = start.elapsed();
            if elapsed >= duration {
                return Ok(());
            }
            cancelled = self
                .state
                .wake
                .wait_timeout(cancelled, duration - elapsed)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// A test strategy: instead of waiting, advances a [`ManualClock`] by exactly the requested
/// duration and records it. Waits then take no real time and tests are deterministic.
///
/// ```
/// use bucket4rs_blocking::{BlockingBucketExt, ManualClockPark};
/// use bucket4rs_local::{Bucket, Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(0);
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
///     .with_clock(clock.clone())
///     .build()?;
/// let park = ManualClockPark::new(clock.clone());
/// bucket.as_blocking().consume_with(15, &park)?; // 10 now, 5 more in 500 ms
/// assert_eq!(park.parks(), [Duration::from_millis(500)]);
/// assert_eq!(clock.now_nanos(), 500_000_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct ManualClockPark {
    clock: ManualClock,
    parks: Mutex<Vec<Duration>>,
}

impl ManualClockPark {
    /// A strategy advancing `clock` (give the bucket a clone of the same clock).
    ///
    /// ```
    /// use bucket4rs_blocking::ManualClockPark;
    /// use bucket4rs_local::ManualClock;
    /// assert!(ManualClockPark::new(ManualClock::new(0)).parks().is_empty());
    /// ```
    pub fn new(clock: ManualClock) -> Self {
        Self {
            clock,
            parks: Mutex::new(Vec::new()),
        }
    }

    /// Every park so far, in order.
    ///
    /// ```
    /// use bucket4rs_blocking::{ManualClockPark, ParkStrategy};
    /// use bucket4rs_local::ManualClock;
    /// use std::time::Duration;
    /// let park = ManualClockPark::new(ManualClock::new(0));
    /// park.park(Duration::from_nanos(3))?;
    /// assert_eq!(park.parks(), [Duration::from_nanos(3)]);
    /// # Ok::<(), bucket4rs_blocking::Interrupted>(())
    /// ```
    pub fn parks(&self) -> Vec<Duration> {
        self.parks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Returns the parks so far and forgets them.
    ///
    /// ```
    /// use bucket4rs_blocking::{ManualClockPark, ParkStrategy};
    /// use bucket4rs_local::ManualClock;
    /// use std::time::Duration;
    /// let park = ManualClockPark::new(ManualClock::new(0));
    /// park.park(Duration::from_nanos(3))?;
    /// assert_eq!(park.take_parks(), [Duration::from_nanos(3)]);
    /// assert!(park.parks().is_empty());
    /// # Ok::<(), bucket4rs_blocking::Interrupted>(())
    /// ```
    pub fn take_parks(&self) -> Vec<Duration> {
        core::mem::take(&mut *self.parks.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl ParkStrategy for ManualClockPark {
    fn park(&self, duration: Duration) -> Result<(), Interrupted> {
        self.clock.advance(duration);
        self.parks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(duration);
        Ok(())
    }
}
