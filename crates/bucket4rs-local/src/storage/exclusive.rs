//! The two strategies that give one caller at a time exclusive access to configuration and
//! state — a `parking_lot` mutex, or a `RefCell` for one thread — share everything but the
//! cell type.

use core::cell::RefCell;

use bucket4rs_core::ops::{self, Operation};
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
};
use parking_lot::Mutex;

use super::sealed::{New, Sealed};
use super::{NewStorage, Replacement, Storage};

type Inner = (BucketConfiguration, BucketState);

/// A cell granting exclusive access to the configuration and state.
trait Exclusive {
    fn new(inner: Inner) -> Self;
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R;
}

impl Exclusive for Mutex<Inner> {
    fn new(inner: Inner) -> Self {
        Mutex::new(inner)
    }
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.lock())
    }
}

impl Exclusive for RefCell<Inner> {
    fn new(inner: Inner) -> Self {
        RefCell::new(inner)
    }
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.borrow_mut())
    }
}

/// Runs `op` in place: the single-bandwidth shortcut when it applies, else the general engine.
#[inline]
pub(crate) fn run<O: Operation>(
    op: &O,
    config: &BucketConfiguration,
    state: &mut BucketState,
    now: i64,
) -> Result<O::Output, OperationError> {
    if let [only] = state.bandwidths_mut()
        && let Some(single) = ops::plan_one(op, config, now, || *only)
    {
        let (out, new) = single?;
        if let Some(new) = new {
            *only = new;
        }
        return Ok(out);
    }
    state.apply(config, now, op)
}

macro_rules! exclusive_storage {
    ($(#[$doc:meta])* $name:ident, $cell:ty) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            inner: $cell,
        }

        impl NewStorage for $name {}

        impl New for $name {
            fn new(config: BucketConfiguration, state: BucketState, _monotonic_clock: bool) -> Self {
                Self { inner: Exclusive::new((config, state)) }
            }
        }

        impl Storage for $name {}

        impl Sealed for $name {
            #[inline]
            fn execute<O: Operation>(&self, op: &O, now: i64) -> Result<O::Output, OperationError> {
                self.inner.with(|(config, state)| run(op, config, state, now))
            }

            fn execute_with_config<O: Operation>(
                &self,
                op: &O,
                now: i64,
            ) -> Result<(O::Output, BucketConfiguration), OperationError> {
                self.inner.with(|(config, state)| Ok((state.apply(config, now, op)?, config.clone())))
            }

            fn replace_with<F>(&self, _now: i64, f: F) -> Result<(), ConfigError>
            where
                F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement,
            {
                self.inner.with(|inner| {
                    let list = inner.1.bandwidths();
                    let next = f(&inner.0, &|i| list.get(i).copied().unwrap_or_default())?;
                    *inner = next;
                    Ok(())
                })
            }

            fn snapshot(&self, _now: i64) -> (BucketConfiguration, BucketState) {
                self.inner.with(|inner| inner.clone())
            }
        }
    };
}

exclusive_storage!(
    /// Synchronized strategy: configuration and state behind a `parking_lot` mutex.
    ///
    /// Under contention the losing thread parks instead of retrying, which keeps the winner's cache
    /// line hot; uncontended it costs one lock/unlock pair.
    ///
    /// ```
    /// use bucket4rs_local::{Bucket, SynchronizedBucket};
    /// use std::time::Duration;
    ///
    /// let bucket: SynchronizedBucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .build_synchronized()?;
    /// assert!(bucket.try_consume(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    Synchronized,
    Mutex<Inner>
);

exclusive_storage!(
    /// Single-threaded strategy: no synchronization at all.
    ///
    /// The state lives in a `RefCell`, so the bucket is `Send` but not `Sync`: sharing it between
    /// threads does not compile, where Bucket4j's `NONE` strategy silently corrupts state.
    ///
    /// ```compile_fail
    /// use bucket4rs_local::{Bucket, UnsyncBucket};
    /// use std::time::Duration;
    ///
    /// let bucket: UnsyncBucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .build_unsynchronized()
    ///     .unwrap();
    /// std::thread::scope(|s| {
    ///     s.spawn(|| bucket.try_consume(1)); // error: `RefCell<..>` cannot be shared between threads
    /// });
    /// ```
    ///
    /// On one thread it is the cheapest strategy:
    ///
    /// ```
    /// use bucket4rs_local::{Bucket, UnsyncBucket};
    /// use std::time::Duration;
    ///
    /// let bucket: UnsyncBucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .build_unsynchronized()?;
    /// assert!(bucket.try_consume(10)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    Unsynchronized,
    RefCell<Inner>
);
