//! The one thing a runtime provides: a timer future.

use core::future::Future;
use core::time::Duration;

/// Makes futures that complete after a duration: the only runtime service
/// [`AsyncBucket`](crate::AsyncBucket) needs. Any `Fn(Duration) -> impl Future<Output = ()>`
/// is a sleeper, so plugging in a runtime is one closure or function name; the `tokio` feature
/// adds [`TokioSleeper`](crate::TokioSleeper).
///
/// The future must complete once *at least* the duration has passed on the bucket's clock,
/// and must not block the thread that polls it.
///
/// ```
/// use bucket4rs_async::Sleeper;
/// use std::time::Duration;
///
/// fn takes_a_sleeper<Z: Sleeper>(z: Z) -> Z::Sleep {
///     z.sleep(Duration::from_millis(1))
/// }
/// // A function is a sleeper: here tokio's (any runtime's works the same way).
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
/// runtime.block_on(async { takes_a_sleeper(tokio::time::sleep).await });
/// # Ok::<(), std::io::Error>(())
/// ```
pub trait Sleeper {
    /// The timer future.
    type Sleep: Future<Output = ()>;

    /// A future completing after `duration`.
    fn sleep(&self, duration: Duration) -> Self::Sleep;
}

impl<F, Fut> Sleeper for F
where
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    type Sleep = Fut;
    fn sleep(&self, duration: Duration) -> Fut {
        self(duration)
    }
}

#[cfg(feature = "tokio")]
mod tokio_impl {
    use super::Sleeper;
    use bucket4rs_core::Clock;
    use core::time::Duration;

    /// Tokio's timer (`tokio::time::sleep`). Needs a runtime with the time driver enabled.
    ///
    /// ```
    /// use bucket4rs_async::{AsyncBucketExt, TokioSleeper};
    /// use bucket4rs_local::Bucket;
    /// use std::time::Duration;
    ///
    /// #[tokio::main(flavor = "current_thread")]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let bucket = Bucket::builder()
    ///         .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_millis(5)))
    ///         .build()?;
    ///     let view = bucket.with_sleeper(TokioSleeper); // same as `bucket.as_async()`
    ///     view.consume(2).await?;
    ///     Ok(())
    /// }
    /// ```
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct TokioSleeper;

    impl Sleeper for TokioSleeper {
        type Sleep = tokio::time::Sleep;
        fn sleep(&self, duration: Duration) -> tokio::time::Sleep {
            // `sleep` panics when the deadline overflows an `Instant`; no reservation waits
            // that long, but a far deadline is clamped rather than trusted.
            match tokio::time::Instant::now().checked_add(duration) {
                Some(deadline) => tokio::time::sleep_until(deadline),
                None => tokio::time::sleep(Duration::from_secs(86_400 * 365 * 30)),
            }
        }
    }

    /// A monotonic clock reading tokio's `Instant`, which follows tokio's *paused* time
    /// (`start_paused`, `tokio::time::advance`): give it to a bucket so that tests with
    /// virtual time see the bucket refill in virtual time.
    ///
    /// Paused time is a tokio feature of its own: the example below needs tokio with
    /// `test-util` (and `rt`, `macros`, `time`), usually as a dev-dependency:
    /// `tokio = { version = "1", features = ["rt", "macros", "time", "test-util"] }`.
    /// Without `test-util`, `start_paused` and `tokio::time::advance` do not exist.
    ///
    /// ```
    /// use bucket4rs_async::TokioClock;
    /// use bucket4rs_local::Clock;
    /// use std::time::Duration;
    ///
    /// #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// async fn main() {
    ///     let clock = TokioClock::new();
    ///     tokio::time::advance(Duration::from_secs(3)).await;
    ///     assert_eq!(clock.now_nanos(), 3_000_000_000);
    /// }
    /// ```
    #[derive(Clone, Copy, Debug)]
    pub struct TokioClock {
        origin: tokio::time::Instant,
    }

    impl TokioClock {
        /// A clock reading 0 now (on tokio's clock, virtual when paused).
        ///
        /// ```
        /// use bucket4rs_async::TokioClock;
        /// use bucket4rs_local::Clock;
        /// assert!(TokioClock::new().now_nanos() >= 0);
        /// ```
        pub fn new() -> Self {
            Self {
                origin: tokio::time::Instant::now(),
            }
        }
    }

    impl Default for TokioClock {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Clock for TokioClock {
        fn now_nanos(&self) -> i64 {
            i64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(i64::MAX)
        }
        /// Tokio's clock never goes back, paused or not (a paused clock only advances).
        fn is_monotonic(&self) -> bool {
            true
        }
    }
}

#[cfg(feature = "tokio")]
pub use tokio_impl::{TokioClock, TokioSleeper};
