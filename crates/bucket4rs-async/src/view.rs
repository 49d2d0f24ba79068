//! The async view of a bucket.

use core::time::Duration;

use core::marker::PhantomData;

use bucket4rs_core::{Answer, BucketListener, Clock, OperationError, Plain, Verbose};
use bucket4rs_local::{Bucket, Storage};

use crate::sleep::Sleeper;

/// An async view of a bucket: calls await their tokens without blocking the executor. Cheap
/// to make (a reference and a sleeper); get it with
/// [`with_sleeper`](AsyncBucketExt::with_sleeper), `as_async` (feature `tokio`) or
/// [`AsyncBucket::new`].
///
/// ```
/// use bucket4rs_async::AsyncBucketExt;
/// use bucket4rs_local::Bucket;
/// use std::time::Duration;
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let bucket = Bucket::builder()
///         .add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_millis(200)))
///         .build()?;
///     let view = bucket.with_sleeper(tokio::time::sleep);
///     view.consume(3).await?; // 2 now, 1 after 100 ms
///     // 2 more would take 200 ms: not within 1 ms.
///     assert!(!view.try_consume(2, Duration::from_millis(1)).await?);
///     Ok(())
/// }
/// ```
///
/// # The tokens are reserved when the future is first polled
/// `consume` and `try_consume` are `async fn`s: calling one does nothing yet. The returned
/// future reserves its tokens on its first poll (its first `.await`, or when a `join!` or a
/// spawned task first runs it), then sleeps. So waiters queue in the order they are first
/// polled, not the order the futures were made, and a future dropped before it was polled
/// never took anything. (Bucket4j's `asScheduler().consume(…)` reserves when called and
/// returns a running `CompletableFuture`.)
///
/// The future borrows the view, so a view made in the same expression must outlive it:
///
/// ```compile_fail,E0716
/// # use bucket4rs_async::AsyncBucketExt;
/// # use bucket4rs_local::Bucket;
/// # use std::time::Duration;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// # let bucket = Bucket::builder().add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1))).build()?;
/// // error[E0716]: temporary value dropped while borrowed (the view, at the end of the line)
/// let later = bucket.with_sleeper(tokio::time::sleep).try_consume(1, Duration::from_secs(1));
/// later.await?;
/// # Ok(()) }
/// ```
///
/// Bind the view first (awaiting in the same expression, `bucket.as_async().consume(1).await`,
/// needs nothing):
///
/// ```
/// # use bucket4rs_async::AsyncBucketExt;
/// # use bucket4rs_local::Bucket;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let bucket = Bucket::builder().add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1))).build()?;
/// let limiter = bucket.with_sleeper(tokio::time::sleep);
/// let later = limiter.try_consume(1, Duration::from_secs(1)); // nothing reserved yet
/// assert_eq!(bucket.available_tokens(), 1);
/// assert!(later.await?); // reserved (and served at once) here
/// assert_eq!(bucket.available_tokens(), 0);
/// # Ok(()) }
/// ```
///
/// `A` is how the view answers, as for the bucket: [`Plain`] values, or on the view
/// [`as_verbose`](AsyncBucket::as_verbose) gives, [`Verbose`] results of each wait's
/// reservation.
#[derive(Debug)]
pub struct AsyncBucket<'a, B: ?Sized, Z, A = Plain> {
    bucket: &'a B,
    sleeper: Z,
    answer: PhantomData<fn() -> A>,
}

impl<B: ?Sized, Z: Clone, A> Clone for AsyncBucket<'_, B, Z, A> {
    fn clone(&self) -> Self {
        Self {
            bucket: self.bucket,
            sleeper: self.sleeper.clone(),
            answer: PhantomData,
        }
    }
}

impl<'a, B: ?Sized, Z> AsyncBucket<'a, B, Z> {
    /// The async view of `bucket`, waiting with `sleeper`.
    ///
    /// ```
    /// use bucket4rs_async::AsyncBucket;
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    ///
    /// #[tokio::main(flavor = "current_thread")]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let bucket = Bucket::builder().add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1))).build()?;
    ///     AsyncBucket::new(&bucket, tokio::time::sleep).consume(1).await?;
    ///     Ok(())
    /// }
    /// ```
    pub fn new(bucket: &'a B, sleeper: Z) -> Self {
        Self {
            bucket,
            sleeper,
            answer: PhantomData,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Gives reserved tokens back unless disarmed: lives across the `.await`, so dropping the
/// future mid-wait runs it.
struct Refund<'a, S: Storage, C: Clock, L: BucketListener> {
    bucket: &'a Bucket<S, C, L>,
    tokens: u64,
    armed: bool,
}

impl<S: Storage, C: Clock, L: BucketListener> Drop for Refund<'_, S, C, L> {
    fn drop(&mut self) {
        if self.armed {
            // `tokens` is at least 1 (the reservation succeeded), so this cannot fail.
            let _ = self.bucket.add_tokens(self.tokens);
            self.bucket.listener().on_interrupted();
        }
    }
}

impl<S: Storage, C: Clock, L: BucketListener, Z: Sleeper, A: Answer>
    AsyncBucket<'_, Bucket<S, C, L>, Z, A>
{
    /// The bucket answering as this view does.
    fn answering(&self) -> Bucket<&S, &C, &L, A> {
        self.bucket.answering()
    }

    /// Consumes `tokens`, waiting (asynchronously) as long as needed; `tokens` may exceed the
    /// capacity, the debt being paid by waiting.
    ///
    /// The future is lazy: it reserves the tokens when first polled (so callers queue in the
    /// order they are first polled) and then sleeps for the reservation's wait. Listener:
    /// `on_consumed(tokens)`, then `on_delayed(nanos)` when it must wait. Answers the wait it
    /// slept for.
    ///
    /// **Cancellation safe.** Dropping the future after it reserved and before it completed
    /// gives all the reserved tokens back with `add_tokens` (never above capacity) and the
    /// listener hears `on_interrupted()`. Dropping it before its first poll changes nothing.
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], or [`OperationError::WaitTooLong`] when the wait would
    /// not fit below `i64::MAX` nanoseconds; nothing is consumed then.
    ///
    /// ```
    /// use bucket4rs_async::AsyncBucketExt;
    /// use bucket4rs_local::Bucket;
    /// use std::time::{Duration, Instant};
    ///
    /// #[tokio::main(flavor = "current_thread")]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let bucket = Bucket::builder()
    ///         .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_millis(100)))
    ///         .build()?;
    ///     let start = Instant::now();
    ///     bucket.with_sleeper(tokio::time::sleep).consume(12).await?; // 2 tokens take 20 ms
    ///     assert!(start.elapsed() >= Duration::from_millis(19));
    ///     Ok(())
    /// }
    /// ```
    pub async fn consume(&self, tokens: u64) -> Result<A::Of<Duration>, OperationError> {
        let reserved = self.answering().consume_ignoring_rate_limits(tokens)?;
        let wait = *A::value(&reserved);
        wait_reserved(self.bucket, &self.sleeper, tokens, wait).await;
        Ok(reserved)
    }

    /// Consumes `tokens` if the wait for them is at most `max_wait`, then waits that long;
    /// resolves to `false` at once, taking nothing, when the wait would be longer.
    ///
    /// Lazy and cancellation safe like [`consume`](Self::consume). Listener:
    /// `on_rejected(tokens)` when refused; otherwise `on_consumed(tokens)`, then
    /// `on_delayed(nanos)` when it must wait (and `on_interrupted()` if dropped mid-wait).
    ///
    /// # Errors
    /// [`OperationError::ZeroTokens`], or [`OperationError::ZeroMaxWait`] for a zero
    /// `max_wait`.
    ///
    /// ```
    /// use bucket4rs_async::AsyncBucketExt;
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    ///
    /// #[tokio::main(flavor = "current_thread")]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let bucket = Bucket::builder()
    ///         .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(50)))
    ///         .build()?;
    ///     let view = bucket.with_sleeper(tokio::time::sleep);
    ///     assert!(view.try_consume(5, Duration::from_millis(1)).await?);
    ///     assert!(!view.try_consume(1, Duration::from_millis(1)).await?); // needs 10 s
    ///     assert_eq!(bucket.available_tokens(), 0);
    ///     Ok(())
    /// }
    /// ```
    pub async fn try_consume(
        &self,
        tokens: u64,
        max_wait: Duration,
    ) -> Result<A::Of<bool>, OperationError> {
        let reserved = self.answering().reserve(tokens, max_wait)?;
        if let Some(wait) = *A::value(&reserved) {
            wait_reserved(self.bucket, &self.sleeper, tokens, wait).await;
        }
        Ok(A::map(reserved, |w| w.is_some()))
    }
}

impl<'a, S: Storage, C: Clock, L: BucketListener, Z: Sleeper> AsyncBucket<'a, Bucket<S, C, L>, Z> {
    /// The verbose view of this async view (Bucket4j's `asScheduler().asVerbose()`): the
    /// same waits, each answering the [`VerboseResult`](bucket4rs_core::VerboseResult) of its
    /// **reservation**, then sleeping as the plain view does (lazily, and cancellation safe,
    /// the same way). The result describes the reservation, made when the future is first
    /// polled: its configuration, the state it left (possibly in debt, which the sleep pays)
    /// and its clock reading. A future dropped mid-sleep gives its tokens back and yields no
    /// result.
    ///
    /// ```
    /// use bucket4rs_async::AsyncBucketExt;
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    ///
    /// #[tokio::main(flavor = "current_thread")]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let bucket = Bucket::builder()
    ///         .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_millis(100)))
    ///         .build()?;
    ///     let r = bucket.with_sleeper(tokio::time::sleep).as_verbose().consume(12).await?;
    ///     assert_eq!(*r.value(), Duration::from_millis(20)); // it slept 20 ms
    ///     assert_eq!(r.available_tokens(), -2); // the debt at the reservation
    ///     Ok(())
    /// }
    /// ```
    pub fn as_verbose(&self) -> AsyncBucket<'a, Bucket<S, C, L>, Z, Verbose>
    where
        Z: Clone,
    {
        AsyncBucket {
            bucket: self.bucket,
            sleeper: self.sleeper.clone(),
            answer: PhantomData,
        }
    }
}

/// Waits `wait` for `tokens` already reserved on `bucket`, giving them back if dropped first.
async fn wait_reserved<S: Storage, C: Clock, L: BucketListener, Z: Sleeper>(
    bucket: &Bucket<S, C, L>,
    sleeper: &Z,
    tokens: u64,
    wait: Duration,
) {
    if wait.is_zero() {
        return;
    }
    bucket.listener().on_delayed(nanos(wait));
    let mut refund = Refund {
        bucket,
        tokens,
        armed: true,
    };
    sleeper.sleep(wait).await;
    refund.armed = false;
}

/// Adds async views to the buckets of `bucket4rs-local`.
///
/// ```
/// use bucket4rs_async::AsyncBucketExt;
/// use bucket4rs_local::Bucket;
/// use std::time::Duration;
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let bucket = Bucket::builder().add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(1))).build_synchronized()?;
///     bucket.with_sleeper(tokio::time::sleep).consume(2).await?;
///     assert_eq!(bucket.available_tokens(), 0);
///     Ok(())
/// }
/// ```
pub trait AsyncBucketExt {
    /// The async view of this bucket, waiting with `sleeper` (any runtime's timer).
    ///
    /// ```
    /// use bucket4rs_async::AsyncBucketExt;
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    ///
    /// #[tokio::main(flavor = "current_thread")]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let bucket = Bucket::builder().add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(1))).build()?;
    ///     assert!(bucket.with_sleeper(tokio::time::sleep).try_consume(2, Duration::from_millis(1)).await?);
    ///     Ok(())
    /// }
    /// ```
    #[doc(alias = "as_scheduler")]
    fn with_sleeper<Z: Sleeper>(&self, sleeper: Z) -> AsyncBucket<'_, Self, Z>;

    /// The async view of this bucket on tokio's timer.
    ///
    /// ```
    /// use bucket4rs_async::AsyncBucketExt;
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    ///
    /// #[tokio::main(flavor = "current_thread")]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let bucket = Bucket::builder().add_limit(|l| l.capacity(2).refill_greedy(2, Duration::from_secs(1))).build()?;
    ///     bucket.as_async().consume(2).await?;
    ///     Ok(())
    /// }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(bucket4rs_docsrs, doc(cfg(feature = "tokio")))]
    #[doc(alias = "as_scheduler")]
    fn as_async(&self) -> AsyncBucket<'_, Self, crate::TokioSleeper> {
        self.with_sleeper(crate::TokioSleeper)
    }
}

impl<S: Storage, C: Clock, L: BucketListener> AsyncBucketExt for Bucket<S, C, L> {
    fn with_sleeper<Z: Sleeper>(&self, sleeper: Z) -> AsyncBucket<'_, Self, Z> {
        AsyncBucket::new(self, sleeper)
    }
}
