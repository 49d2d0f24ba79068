//! `SimpleBucketListener`: atomic totals.

use core::sync::atomic::{AtomicU64, Ordering};

use bucket4rs_core::BucketListener;

/// A listener that keeps totals in atomic counters (Bucket4j's `SimpleBucketListener`).
///
/// `consumed` and `rejected` count **tokens**, not calls: rejecting a request for 5 tokens adds
/// 5. Waits are totals in nanoseconds. Every total saturates at `u64::MAX` instead of wrapping.
/// Counters use relaxed atomics: each total is exact, but two getters called one after the
/// other are not a consistent snapshot while the bucket is in use.
///
/// Share it with a bucket by reference (`with_listener(&listener)`) or through an `Arc`
/// (`with_listener(Arc::clone(&listener))`); both implement [`BucketListener`]. `new` is
/// `const`, so it can also live in a `static`.
///
/// ```
/// use bucket4rs_listeners::SimpleBucketListener;
/// use bucket4rs_local::Bucket;
/// use std::time::Duration;
///
/// static STATS: SimpleBucketListener = SimpleBucketListener::new();
///
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
///     .with_listener(&STATS)
///     .build()?;
/// assert!(bucket.try_consume(4)?);
/// assert!(!bucket.try_consume(7)?);
/// assert_eq!((STATS.consumed(), STATS.rejected()), (4, 7));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default)]
pub struct SimpleBucketListener {
    consumed: AtomicU64,
    rejected: AtomicU64,
    delayed_nanos: AtomicU64,
    before_parking_nanos: AtomicU64,
    parked_nanos: AtomicU64,
    interrupted: AtomicU64,
}

/// Adds `n` to `counter`, saturating at `u64::MAX`.
#[inline]
fn add(counter: &AtomicU64, n: u64) {
    // An uncontended compare-exchange costs about what a `fetch_add` does; unlike it, this
    // cannot wrap around to a small total.
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_add(n))
    });
}

impl SimpleBucketListener {
    /// A listener with every total at zero.
    ///
    /// ```
    /// use bucket4rs_listeners::SimpleBucketListener;
    /// let l = SimpleBucketListener::new();
    /// assert_eq!(l.consumed(), 0);
    /// ```
    pub const fn new() -> Self {
        Self {
            consumed: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            delayed_nanos: AtomicU64::new(0),
            before_parking_nanos: AtomicU64::new(0),
            parked_nanos: AtomicU64::new(0),
            interrupted: AtomicU64::new(0),
        }
    }

    /// Total tokens consumed.
    ///
    /// ```
    /// use bucket4rs_listeners::{BucketListener, SimpleBucketListener};
    /// let l = SimpleBucketListener::new();
    /// l.on_consumed(3);
    /// l.on_consumed(4);
    /// assert_eq!(l.consumed(), 7);
    /// ```
    pub fn consumed(&self) -> u64 {
        self.consumed.load(Ordering::Relaxed)
    }

    /// Total tokens rejected (the sum of the rejected requests' sizes).
    ///
    /// ```
    /// use bucket4rs_listeners::{BucketListener, SimpleBucketListener};
    /// let l = SimpleBucketListener::new();
    /// l.on_rejected(5);
    /// assert_eq!(l.rejected(), 5);
    /// ```
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Total nanoseconds async reservations were told to wait.
    ///
    /// ```
    /// use bucket4rs_listeners::{BucketListener, SimpleBucketListener};
    /// let l = SimpleBucketListener::new();
    /// l.on_delayed(1_000);
    /// assert_eq!(l.delayed_nanos(), 1_000);
    /// ```
    pub fn delayed_nanos(&self) -> u64 {
        self.delayed_nanos.load(Ordering::Relaxed)
    }

    /// Total nanoseconds blocking callers announced they would park (reported before parking;
    /// compare [`parked_nanos`](Self::parked_nanos), reported after).
    ///
    /// ```
    /// use bucket4rs_listeners::{BucketListener, SimpleBucketListener};
    /// let l = SimpleBucketListener::new();
    /// l.on_before_parking(2_000);
    /// assert_eq!(l.before_parking_nanos(), 2_000);
    /// ```
    pub fn before_parking_nanos(&self) -> u64 {
        self.before_parking_nanos.load(Ordering::Relaxed)
    }

    /// Total nanoseconds blocking callers parked.
    ///
    /// ```
    /// use bucket4rs_listeners::{BucketListener, SimpleBucketListener};
    /// let l = SimpleBucketListener::new();
    /// l.on_parked(2_000);
    /// assert_eq!(l.parked_nanos(), 2_000);
    /// ```
    pub fn parked_nanos(&self) -> u64 {
        self.parked_nanos.load(Ordering::Relaxed)
    }

    /// How many waits were interrupted or cancelled.
    ///
    /// ```
    /// use bucket4rs_listeners::{BucketListener, SimpleBucketListener};
    /// let l = SimpleBucketListener::new();
    /// l.on_interrupted();
    /// assert_eq!(l.interrupted(), 1);
    /// ```
    pub fn interrupted(&self) -> u64 {
        self.interrupted.load(Ordering::Relaxed)
    }
}

impl BucketListener for SimpleBucketListener {
    #[inline]
    fn on_consumed(&self, tokens: u64) {
        add(&self.consumed, tokens);
    }
    #[inline]
    fn on_rejected(&self, tokens: u64) {
        add(&self.rejected, tokens);
    }
    #[inline]
    fn on_delayed(&self, nanos: u64) {
        add(&self.delayed_nanos, nanos);
    }
    #[inline]
    fn on_before_parking(&self, nanos: u64) {
        add(&self.before_parking_nanos, nanos);
    }
    #[inline]
    fn on_parked(&self, nanos: u64) {
        add(&self.parked_nanos, nanos);
    }
    #[inline]
    fn on_interrupted(&self) {
        add(&self.interrupted, 1);
    }
}

#[cfg(test)]
mod tests;
