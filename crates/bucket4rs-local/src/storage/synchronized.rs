use bucket4rs_core::ops::Operation;
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
};
use parking_lot::Mutex;

use super::{NewStorage, Replacement, Storage};

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
#[derive(Debug)]
pub struct Synchronized {
    inner: Mutex<(BucketConfiguration, BucketState)>,
}

impl NewStorage for Synchronized {
    fn new(config: BucketConfiguration, state: BucketState) -> Self {
        Self {
            inner: Mutex::new((config, state)),
        }
    }
}

/// Runs `op` on a configuration and an owned state in place.
#[inline]
pub(super) fn run_in_place<O: Operation>(
    op: &O,
    config: &BucketConfiguration,
    state: &mut BucketState,
    now: i64,
) -> Result<O::Output, OperationError> {
    state.apply(config, now, op)
}

impl Storage for Synchronized {
    #[inline]
    fn execute<O: Operation>(&self, op: &O, now: i64) -> Result<O::Output, OperationError> {
        let mut guard = self.inner.lock();
        let (config, state) = &mut *guard;
        run_in_place(op, config, state, now)
    }

    fn execute_with_config<O: Operation>(
        &self,
        op: &O,
        now: i64,
    ) -> Result<(O::Output, BucketConfiguration), OperationError> {
        let mut guard = self.inner.lock();
        let (config, state) = &mut *guard;
        Ok((run_in_place(op, config, state, now)?, config.clone()))
    }

    fn replace_with<F>(&self, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement,
    {
        let mut guard = self.inner.lock();
        let (config, state) = &mut *guard;
        let list = state.bandwidths();
        let (c, s) = f(config, &|i| list.get(i).copied().unwrap_or_default())?;
        *guard = (c, s);
        Ok(())
    }

    fn snapshot(&self) -> (BucketConfiguration, BucketState) {
        self.inner.lock().clone()
    }
}
