//! The blocking view of a bucket.

use core::convert::Infallible;
use core::fmt;
use core::marker::PhantomData;
use core::time::Duration;

use bucket4rs_core::{Answer, BucketListener, Clock, OperationError, Plain, Verbose};
use bucket4rs_local::{Bucket, Storage};

use crate::guard;
use crate::park::{Interrupted, ParkStrategy, ThreadPark};

/// Why a blocking call with a [`ParkStrategy`] failed.
///
/// ```
/// use bucket4rs_blocking::WaitError;
/// use bucket4rs_core::OperationError;
/// let e = WaitError::from(OperationError::ZeroTokens);
/// assert_eq!(e, WaitError::Operation(OperationError::ZeroTokens));
/// assert_eq!(WaitError::Interrupted.to_string(), "the wait was interrupted; the reserved tokens were given back");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitError {
    /// The bucket refused the arguments; nothing was reserved.
    Operation(OperationError),
    /// The park strategy cancelled the wait; the reserved tokens were given back.
    Interrupted,
}

impl From<OperationError> for WaitError {
    fn from(e: OperationError) -> Self {
        Self::Operation(e)
    }
}

impl From<Interrupted> for WaitError {
    fn from(_: Interrupted) -> Self {
        Self::Interrupted
    }
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Operation(e) => fmt::Display::fmt(e, f),
            Self::Interrupted => {
                f.write_str("the wait was interrupted; the reserved tokens were given back")
            }
        }
    }
}

impl core::error::Error for WaitError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Operation(e) => Some(e),
            Self::Interrupted => None,
        }
    }
}

/// A blocking view of a bucket: calls wait on the calling thread until their tokens are paid
/// for. Cheap to make (one reference); get it with
/// [`as_blocking`](BlockingBucketExt::as_blocking) or [`BlockingBucket::new`].
///
/// ```
/// use bucket4rs_blocking::BlockingBucketExt;
/// use bucket4rs_local::Bucket;
/// use std::time::Duration;
///
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(1)))
///     .build()?;
/// let blocking = bucket.as_blocking();
/// blocking.consume(100)?; // free: the bucket starts full
/// assert!(!blocking.try_consume(50, Duration::from_millis(1))?); // needs 500 ms: refused at once
/// assert!(blocking.try_consume(1, Duration::from_millis(100))?); // waits ~10 ms
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// `A` is how the view answers, as for the bucket: [`Plain`] values, or on the view
/// [`as_verbose`](BlockingBucket::as_verbose) gives, [`Verbose`] results of each wait's
/// reservation.
#[derive(Debug)]
pub struct BlockingBucket<'a, B: ?Sized, A = Plain> {
    bucket: &'a B,
    answer: PhantomData<fn() -> A>,
}

impl<B: ?Sized, A> Clone for BlockingBucket<'_, B, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: ?Sized, A> Copy for BlockingBucket<'_, B, A> {}

impl<'a, B: ?Sized> BlockingBucket<'a, B> {
    /// The blocking view of `bucket`.
    ///
    /// ```
    /// use bucket4rs_blocking::BlockingBucket;
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1))).build()?;
    /// BlockingBucket::new(&bucket).consume(1)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(bucket: &'a B) -> Self {
        guard::check_thread();
        Self {
            bucket,
            answer: PhantomData,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<S: Storage, C: Clock, L: BucketListener, A: Answer> BlockingBucket<'_, Bucket<S, C, L>, A> {
    /// The bucket answering as this view does.
    fn answering(&self) -> Bucket<&S, &C, &L, A> {
        self.bucket.answering()
    }

    /// Consumes `tokens`, parking the thread (never spinning) for as long as needed. `tokens`
    /// may exceed the capacity: the debt is paid by waiting. Tokens are reserved before the
    /// wait, so a later caller queues behind this one and `available_tokens` shows the debt.
    ///
    /// Listener: `on_consumed(tokens)`, then, when it must wait, `on_before_parking(nanos)`
    /// and `on_parked(nanos)`. Answers the wait it parked for.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], or [`OperationError::WaitTooLong`] when the wait would
    /// not fit below `i64::MAX` nanoseconds; nothing is consumed then.
    ///
    /// ```
    /// use bucket4rs_blocking::BlockingBucketExt;
    /// use bucket4rs_local::Bucket;
    /// use std::time::{Duration, Instant};
    ///
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_millis(100)))
    ///     .build()?;
    /// let start = Instant::now();
    /// bucket.as_blocking().consume(12)?; // 10 now, 2 more take 20 ms
    /// assert!(start.elapsed() >= Duration::from_millis(19));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "consume_uninterruptibly")]
    pub fn consume(&self, tokens: u64) -> Result<A::Of<Duration>, OperationError> {
        let reserved = self.answering().consume_ignoring_rate_limits(tokens)?;
        match park_reserved(self.bucket, tokens, *A::value(&reserved), sleep) {
            Ok(()) => Ok(reserved),
            Err(never) => match never {},
        }
    }

    /// Consumes `tokens` if the wait for them is at most `max_wait`, parking the thread for
    /// that wait; returns `false` at once, taking nothing, when the wait would be longer.
    ///
    /// Listener: `on_rejected(tokens)` when refused; otherwise `on_consumed(tokens)`, then,
    /// when it must wait, `on_before_parking(nanos)` and `on_parked(nanos)`.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], or [`OperationError::ZeroMaxWait`] for a zero
    /// `max_wait`.
    ///
    /// ```
    /// use bucket4rs_blocking::BlockingBucketExt;
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    ///
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(10)))
    ///     .build()?;
    /// let blocking = bucket.as_blocking();
    /// assert!(blocking.try_consume(10, Duration::from_millis(1))?);
    /// assert!(!blocking.try_consume(1, Duration::from_millis(10))?); // needs a second
    /// assert_eq!(bucket.available_tokens(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[doc(alias = "try_consume_uninterruptibly")]
    pub fn try_consume(
        &self,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<A::Of<bool>, OperationError> {
        let reserved = self.answering().reserve(tokens, max_wait)?;
        if let Some(wait) = *A::value(&reserved) {
            match park_reserved(self.bucket, tokens, wait, sleep) {
                Ok(()) => {}
                Err(never) => match never {},
            }
        }
        Ok(A::map(reserved, |w| w.is_some()))
    }

    /// [`consume`](Self::consume) with a park strategy, e.g. a [`CancelToken`](crate::CancelToken)
    /// or, in tests, a [`ManualClockPark`](crate::ManualClockPark).
    ///
    /// When the strategy fails, the wait is cancelled: the reserved tokens are given back with
    /// `add_tokens` (never above capacity), the listener hears `on_interrupted` (after
    /// `on_consumed` and `on_before_parking`, and instead of `on_parked`), and the call returns
    /// [`WaitError::Interrupted`].
    ///
    /// # Errors
    /// [`WaitError::Operation`] as for [`consume`](Self::consume) (nothing reserved), or
    /// [`WaitError::Interrupted`].
    ///
    /// ```
    /// use bucket4rs_blocking::{BlockingBucketExt, ManualClockPark};
    /// use bucket4rs_local::{Bucket, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new(0);
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .with_clock(clock.clone())
    ///     .build()?;
    /// let park = ManualClockPark::new(clock);
    /// bucket.as_blocking().consume_with(3, &park)?;
    /// assert_eq!(park.parks(), [Duration::from_secs(2)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn consume_with<P: ParkStrategy + ?Sized>(
        &self,
        tokens: u64,
        park: &P,
    ) -> Result<A::Of<Duration>, WaitError> {
        let reserved = self.answering().consume_ignoring_rate_limits(tokens)?;
        park_reserved(self.bucket, tokens, *A::value(&reserved), |d| park.park(d))?;
        Ok(reserved)
    }

    /// [`try_consume`](Self::try_consume) with a park strategy; a failing strategy cancels the
    /// wait as described for [`consume_with`](Self::consume_with).
    ///
    /// # Errors
    /// [`WaitError::Operation`] as for [`try_consume`](Self::try_consume) (nothing reserved),
    /// or [`WaitError::Interrupted`].
    ///
    /// ```
    /// use bucket4rs_blocking::{BlockingBucketExt, ManualClockPark};
    /// use bucket4rs_local::{Bucket, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new(0);
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .with_clock(clock.clone())
    ///     .build()?;
    /// let park = ManualClockPark::new(clock);
    /// let blocking = bucket.as_blocking();
    /// assert!(blocking.try_consume_with(2, Duration::from_secs(1), &park)?);
    /// assert!(!blocking.try_consume_with(1, Duration::from_millis(999), &park)?);
    /// assert_eq!(park.parks(), [Duration::from_secs(1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_consume_with<P: ParkStrategy + ?Sized>(
        &self,
        tokens: u64,
        max_wait: Duration,
        park: &P,
    ) -> Result<A::Of<bool>, WaitError> {
        let reserved = self.answering().reserve(tokens, max_wait)?;
        if let Some(wait) = *A::value(&reserved) {
            park_reserved(self.bucket, tokens, wait, |d| park.park(d))?;
        }
        Ok(A::map(reserved, |w| w.is_some()))
    }
}

impl<'a, S: Storage, C: Clock, L: BucketListener> BlockingBucket<'a, Bucket<S, C, L>> {
    /// The verbose view of this blocking view (Bucket4j's `asBlocking().asVerbose()`): the
    /// same waits, each answering the [`VerboseResult`](bucket4rs_core::VerboseResult) of its
    /// **reservation**, then parking as the plain view does.
    ///
    /// A wait is two steps: the reservation takes the tokens at once (possibly into debt) and
    /// says how long until they are paid for; then the thread parks that long. The verbose
    /// result describes the first step: its configuration, the state the reservation left and
    /// the clock reading it ran at, so `available_tokens` is negative by the debt this call
    /// (and the callers queued before it) is still paying, and `time_until_full` counts from
    /// the reservation. Read the bucket again after the call for its state once the park is
    /// over. An interrupted wait returns [`WaitError::Interrupted`] (its tokens given back),
    /// not a verbose result.
    ///
    /// ```
    /// use bucket4rs_blocking::{BlockingBucketExt, ManualClockPark};
    /// use bucket4rs_local::{Bucket, ManualClock};
    /// use std::time::Duration;
    ///
    /// let clock = ManualClock::new(0);
    /// let bucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .with_clock(clock.clone())
    ///     .build()?;
    /// let park = ManualClockPark::new(clock);
    /// let r = bucket.as_blocking().as_verbose().consume_with(12, &park)?;
    /// assert_eq!(*r.value(), Duration::from_millis(200)); // it parked 200 ms
    /// assert_eq!(r.available_tokens(), -2); // the debt at the reservation, paid by the park
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_verbose(&self) -> BlockingBucket<'a, Bucket<S, C, L>, Verbose> {
        BlockingBucket {
            bucket: self.bucket,
            answer: PhantomData,
        }
    }
}

/// Waits for `tokens` already reserved on `bucket`; on failure gives them back and says so.
fn park_reserved<S: Storage, C: Clock, L: BucketListener, E>(
    bucket: &Bucket<S, C, L>,
    tokens: u64,
    wait: Duration,
    park: impl FnOnce(Duration) -> Result<(), E>,
) -> Result<(), E> {
    if wait.is_zero() {
        return Ok(());
    }
    let listener = bucket.listener();
    let n = nanos(wait);
    listener.on_before_parking(n);
    match park(wait) {
        Ok(()) => {
            listener.on_parked(n);
            Ok(())
        }
        Err(e) => {
            // `tokens` is at least 1 (the reservation succeeded), so this cannot fail.
            let _ = bucket.add_tokens(tokens);
            listener.on_interrupted();
            Err(e)
        }
    }
}

/// Parks the calling thread with [`ThreadPark`], which cannot fail.
fn sleep(d: Duration) -> Result<(), Infallible> {
    ThreadPark.sleep(d);
    Ok(())
}

/// Adds [`as_blocking`](BlockingBucketExt::as_blocking) to the buckets of `bucket4rs-local`.
///
/// ```
/// use bucket4rs_blocking::BlockingBucketExt;
/// use bucket4rs_local::Bucket;
/// use std::time::Duration;
/// let bucket = Bucket::builder().add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(1))).build_synchronized()?;
/// bucket.as_blocking().consume(2)?;
/// assert_eq!(bucket.available_tokens(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait BlockingBucketExt {
    /// The blocking view of this bucket.
    ///
    /// ```
    /// use bucket4rs_blocking::BlockingBucketExt;
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    /// let bucket = Bucket::builder().add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(1))).build()?;
    /// assert!(bucket.as_blocking().try_consume(2, Duration::from_millis(1))?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn as_blocking(&self) -> BlockingBucket<'_, Self>;
}

impl<S: Storage, C: Clock, L: BucketListener> BlockingBucketExt for Bucket<S, C, L> {
    fn as_blocking(&self) -> BlockingBucket<'_, Self> {
        BlockingBucket::new(self)
    }
}
