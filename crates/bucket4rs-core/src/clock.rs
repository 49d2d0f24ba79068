//! Time meters: where buckets get `now` from. The core itself never reads a clock; it only
//! defines the trait and ships implementations for the crates above it.

use alloc::sync::Arc;
use core::sync::atomic::{AtomicI64, Ordering};
use core::time::Duration;

/// A source of clock readings in nanoseconds.
///
/// Readings only need to be consistent for one bucket: a monotonic clock may count from any
/// origin. A clock that counts wall-clock nanoseconds since the Unix epoch says so with
/// [`is_wall_clock_based`](Clock::is_wall_clock_based); aligned interval refill needs one.
///
/// ```
/// use bucket4rs_core::{Clock, ManualClock};
/// let clock = ManualClock::new(5);
/// assert_eq!(clock.now_nanos(), 5);
/// assert!(!clock.is_wall_clock_based());
/// ```
#[doc(alias = "time_meter")]
pub trait Clock {
    /// The current reading in nanoseconds.
    fn now_nanos(&self) -> i64;

    /// Whether readings are wall-clock nanoseconds since the Unix epoch.
    fn is_wall_clock_based(&self) -> bool {
        false
    }

    /// Whether readings never go back, on any thread: a reading taken after another (in
    /// happens-before order) is never smaller.
    ///
    /// A monotonic clock lets a one-bandwidth greedy lock-free bucket keep its whole state in
    /// one 64-bit word: with readings that never go back, the last refill time is implied by
    /// the balance and need not be stored (see `bucket4rs-local`). A clock that says so but
    /// does go back does not corrupt a bucket; it makes it conservative — a reading older than
    /// the last change sees the refill only up to that reading. `false` by default.
    ///
    /// ```
    /// use bucket4rs_core::{Clock, ManualClock};
    /// assert!(!ManualClock::new(0).is_monotonic());
    /// assert!(ManualClock::monotonic(0).is_monotonic());
    /// ```
    fn is_monotonic(&self) -> bool {
        false
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_nanos(&self) -> i64 {
        (**self).now_nanos()
    }
    fn is_wall_clock_based(&self) -> bool {
        (**self).is_wall_clock_based()
    }
    fn is_monotonic(&self) -> bool {
        (**self).is_monotonic()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_nanos(&self) -> i64 {
        (**self).now_nanos()
    }
    fn is_wall_clock_based(&self) -> bool {
        (**self).is_wall_clock_based()
    }
    fn is_monotonic(&self) -> bool {
        (**self).is_monotonic()
    }
}

/// A clock that only moves when told to: for tests, yours and ours.
///
/// Clones share the same reading, so a test keeps one clone and hands another to the bucket.
///
/// ```
/// use bucket4rs_core::{Clock, ManualClock};
/// use core::time::Duration;
///
/// let clock = ManualClock::new(0);
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(3));
/// assert_eq!(shared.now_nanos(), 3_000_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicI64>,
    wall_clock_based: bool,
    monotonic: bool,
}

impl ManualClock {
    /// A manual clock starting at `start_nanos`. It does not declare itself
    /// [monotonic](Clock::is_monotonic): tests move it back as well as forward.
    ///
    /// ```
    /// # use bucket4rs_core::{Clock, ManualClock};
    /// assert_eq!(ManualClock::new(-7).now_nanos(), -7);
    /// ```
    pub fn new(start_nanos: i64) -> Self {
        Self {
            nanos: Arc::new(AtomicI64::new(start_nanos)),
            wall_clock_based: false,
            monotonic: false,
        }
    }

    /// A manual clock that declares itself [monotonic](Clock::is_monotonic), as real clocks
    /// do: one-bandwidth lock-free buckets then use their 64-bit word. The test that holds it
    /// promises to only move it forward (moving it back is allowed, to test what a bucket
    /// does when a clock breaks that promise).
    ///
    /// ```
    /// # use bucket4rs_core::{Clock, ManualClock};
    /// let c = ManualClock::monotonic(5);
    /// assert!(c.is_monotonic());
    /// assert_eq!(c.now_nanos(), 5);
    /// ```
    pub fn monotonic(start_nanos: i64) -> Self {
        Self {
            monotonic: true,
            ..Self::new(start_nanos)
        }
    }

    /// A manual clock whose readings count as epoch nanoseconds (for aligned refill tests).
    ///
    /// ```
    /// # use bucket4rs_core::{Clock, ManualClock};
    /// assert!(ManualClock::wall_clock(1_700_000_000_000_000_000).is_wall_clock_based());
    /// ```
    pub fn wall_clock(start_epoch_nanos: i64) -> Self {
        Self {
            nanos: Arc::new(AtomicI64::new(start_epoch_nanos)),
            wall_clock_based: true,
            monotonic: false,
        }
    }

    /// Moves the clock forward (saturating at `i64::MAX`).
    ///
    /// ```
    /// # use bucket4rs_core::{Clock, ManualClock}; use core::time::Duration;
    /// let c = ManualClock::new(0);
    /// c.advance(Duration::from_nanos(9));
    /// assert_eq!(c.now_nanos(), 9);
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_nanos()).unwrap_or(i64::MAX);
        self.advance_nanos(by);
    }

    /// Moves the clock by `nanos`, which may be negative (clocks do go backwards), saturating.
    ///
    /// ```
    /// # use bucket4rs_core::{Clock, ManualClock};
    /// let c = ManualClock::new(10);
    /// c.advance_nanos(-4);
    /// assert_eq!(c.now_nanos(), 6);
    /// ```
    pub fn advance_nanos(&self, nanos: i64) {
        let _ = self
            .nanos
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_add(nanos))
            });
    }

    /// Sets the reading.
    ///
    /// ```
    /// # use bucket4rs_core::{Clock, ManualClock};
    /// let c = ManualClock::new(10);
    /// c.set_nanos(3);
    /// assert_eq!(c.now_nanos(), 3);
    /// ```
    pub fn set_nanos(&self, nanos: i64) {
        self.nanos.store(nanos, Ordering::Release);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_nanos(&self) -> i64 {
        self.nanos.load(Ordering::Acquire)
    }
    fn is_wall_clock_based(&self) -> bool {
        self.wall_clock_based
    }
    fn is_monotonic(&self) -> bool {
        self.monotonic
    }
}

#[cfg(feature = "std")]
mod std_clocks {
    use super::Clock;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    #[cold]
    #[inline(never)]
    fn saturated() -> i64 {
        i64::MAX
    }

    fn epoch_nanos() -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
        }
    }

    /// Monotonic nanoseconds from `std::time::Instant`, counted from when the clock was made
    /// (Bucket4j's `TimeMeter.SYSTEM_NANOTIME`, which reads `System.nanoTime()`).
    ///
    /// Never goes backwards and is immune to wall-clock adjustments; not usable for aligned
    /// refill.
    ///
    /// ```
    /// use bucket4rs_core::{Clock, MonotonicClock};
    /// let clock = MonotonicClock::new();
    /// let a = clock.now_nanos();
    /// assert!(clock.now_nanos() >= a);
    /// ```
    #[derive(Clone, Copy, Debug)]
    #[doc(alias = "system_nanotime")]
    pub struct MonotonicClock {
        origin: Instant,
    }

    impl MonotonicClock {
        /// A clock reading 0 now.
        ///
        /// ```
        /// # use bucket4rs_core::{Clock, MonotonicClock};
        /// assert!(MonotonicClock::new().now_nanos() >= 0);
        /// ```
        pub fn new() -> Self {
            Self {
                origin: Instant::now(),
            }
        }
    }

    impl Default for MonotonicClock {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Clock for MonotonicClock {
        #[inline]
        fn now_nanos(&self) -> i64 {
            let d = Instant::now().saturating_duration_since(self.origin);
            // In 64-bit arithmetic with a branch to the saturation (292 years of uptime),
            // rather than `as_nanos` in 128 bits and a conditional move.
            match i64::try_from(d.as_secs())
                .ok()
                .and_then(|s| s.checked_mul(1_000_000_000))
                .and_then(|n| n.checked_add(i64::from(d.subsec_nanos())))
            {
                Some(n) => n,
                None => saturated(),
            }
        }
        fn is_monotonic(&self) -> bool {
            true
        }
    }

    /// Wall-clock time since the Unix epoch, truncated to whole milliseconds (Bucket4j's
    /// default time meter, `TimeMeter.SYSTEM_MILLISECONDS`).
    ///
    /// ```
    /// use bucket4rs_core::{Clock, SystemMillisClock};
    /// let now = SystemMillisClock.now_nanos();
    /// assert_eq!(now % 1_000_000, 0);
    /// assert!(SystemMillisClock.is_wall_clock_based());
    /// ```
    #[derive(Clone, Copy, Debug, Default)]
    #[doc(alias = "system_milliseconds")]
    pub struct SystemMillisClock;

    impl Clock for SystemMillisClock {
        #[inline]
        fn now_nanos(&self) -> i64 {
            epoch_nanos()
                .div_euclid(1_000_000)
                .saturating_mul(1_000_000)
        }
        fn is_wall_clock_based(&self) -> bool {
            true
        }
    }

    /// Wall-clock nanoseconds since the Unix epoch, from `SystemTime`.
    ///
    /// **Not** Bucket4j's `TimeMeter.SYSTEM_NANOTIME`, whatever the name suggests: that one is
    /// monotonic, and its counterpart is [`MonotonicClock`]. This clock jumps when the system
    /// time is set (forward: the bucket refills for time that did not pass), so use it only
    /// where aligned refill needs wall-clock time at nanosecond precision; `bucket4rs-local`'s
    /// default `FastClock` is epoch-based too and never jumps.
    ///
    /// ```
    /// use bucket4rs_core::{Clock, SystemNanosClock};
    /// assert!(SystemNanosClock.now_nanos() > 1_600_000_000_000_000_000);
    /// ```
    #[derive(Clone, Copy, Debug, Default)]
    pub struct SystemNanosClock;

    impl Clock for SystemNanosClock {
        #[inline]
        fn now_nanos(&self) -> i64 {
            epoch_nanos()
        }
        fn is_wall_clock_based(&self) -> bool {
            true
        }
    }
}

#[cfg(feature = "std")]
pub use std_clocks::{MonotonicClock, SystemMillisClock, SystemNanosClock};
