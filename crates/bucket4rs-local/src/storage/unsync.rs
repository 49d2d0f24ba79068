use core::cell::RefCell;

use bucket4rs_core::ops::Operation;
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
};

use super::synchronized::run_in_place;
use super::{NewStorage, Replacement, Storage};

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
#[derive(Debug)]
pub struct Unsynchronized {
    inner: RefCell<(BucketConfiguration, BucketState)>,
}

impl NewStorage for Unsynchronized {
    fn new(config: BucketConfiguration, state: BucketState) -> Self {
        Self {
            inner: RefCell::new((config, state)),
        }
    }
}

impl Storage for Unsynchronized {
    #[inline]
    fn execute<O: Operation>(&self, op: &O, now: i64) -> Result<O::Output, OperationError> {
        let mut guard = self.inner.borrow_mut();
        let (config, state) = &mut *guard;
        run_in_place(op, config, state, now)
    }

    fn execute_with_config<O: Operation>(
        &self,
        op: &O,
        now: i64,
    ) -> Result<(O::Output, BucketConfiguration), OperationError> {
        let mut guard = self.inner.borrow_mut();
        let (config, state) = &mut *guard;
        Ok((run_in_place(op, config, state, now)?, config.clone()))
    }

    fn replace_with<F>(&self, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement,
    {
        let mut guard = self.inner.borrow_mut();
        let (config, state) = &*guard;
        let list = state.bandwidths();
        let (c, s) = f(config, &|i| list.get(i).copied().unwrap_or_default())?;
        *guard = (c, s);
        Ok(())
    }

    fn snapshot(&self) -> (BucketConfiguration, BucketState) {
        self.inner.borrow().clone()
    }
}
