//! The three synchronization strategies, as storage types behind one sealed trait.

use bucket4rs_core::ops::Operation;
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
};

mod any;
mod exclusive;
mod lock_free;
pub(crate) mod word;

pub use any::{AnyStorage, SynchronizationStrategy, UnknownStrategy};
pub(crate) use exclusive::run as run_exclusive;
pub use exclusive::{Synchronized, Unsynchronized};
pub use lock_free::LockFree;

/// A computed replacement: the new configuration and its state.
pub(crate) type Replacement = Result<(BucketConfiguration, BucketState), ConfigError>;

/// What a storage does, for this crate's buckets only: the methods of [`Storage`] and
/// [`NewStorage`] live here, out of reach of other crates, so that the public traits are
/// sealed and show nothing a reader could implement.
pub(crate) mod sealed {
    use super::Replacement;
    use bucket4rs_core::ops::Operation;
    use bucket4rs_core::{
        BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
    };

    /// The storage's side of every operation.
    pub trait Sealed {
        /// Runs `op` at clock reading `now`.
        fn execute<O: Operation>(&self, op: &O, now: i64) -> Result<O::Output, OperationError>;

        /// Runs `op` and also returns the configuration it ran under.
        fn execute_with_config<O: Operation>(
            &self,
            op: &O,
            now: i64,
        ) -> Result<(O::Output, BucketConfiguration), OperationError>;

        /// Replaces configuration and state with what `f` computes from the current ones,
        /// atomically, at clock reading `now`. `f` may be called more than once (a lost race);
        /// what is committed is what its last call returned.
        fn replace_with<F>(&self, now: i64, f: F) -> Result<(), ConfigError>
        where
            F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement;

        /// A consistent copy of configuration and state at clock reading `now`: the stored
        /// state, or (a lock-free bucket's compact word, which keeps no last refill time) the
        /// state refilled to `now`, which every later operation sees the same way.
        fn snapshot(&self, now: i64) -> (BucketConfiguration, BucketState);
    }

    /// Making a storage.
    pub trait New: Sized {
        /// Creates the storage; `monotonic_clock` says whether the bucket's clock never goes
        /// back ([`Clock::is_monotonic`](bucket4rs_core::Clock::is_monotonic)).
        fn new(config: BucketConfiguration, state: BucketState, monotonic_clock: bool) -> Self;
    }
}

/// Where a bucket keeps its configuration and state, and how it serializes access: the `S` of
/// [`Bucket<S, C, L>`](crate::Bucket).
///
/// Sealed: the strategies are [`LockFree`], [`Synchronized`], [`Unsynchronized`] and
/// [`AnyStorage`] (and a reference to any of them), and what they do is this crate's own. All
/// of them run the same pure operations of `bucket4rs-core`, so they compute identical
/// results. Name it in bounds, as the blocking and async views do:
///
/// ```
/// use bucket4rs_local::{Bucket, Storage, Synchronized};
/// use std::time::Duration;
///
/// fn drain<S: Storage>(bucket: &Bucket<S>) -> u64 {
///     bucket.try_consume_as_much_as_possible()
/// }
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(3).refill_greedy(3, Duration::from_secs(1)))
///     .build_storage::<Synchronized>()?;
/// assert_eq!(drain(&bucket), 3);
/// # Ok::<(), bucket4rs_local::ConfigError>(())
/// ```
pub trait Storage: sealed::Sealed {}

/// The storages a builder can create from a configuration and a state
/// ([`BucketBuilder::build_storage`](crate::BucketBuilder::build_storage)): [`LockFree`],
/// [`Synchronized`] and [`Unsynchronized`]. Sealed, as [`Storage`] is.
///
/// ```
/// use bucket4rs_local::{Bucket, NewStorage, Unsynchronized};
/// use std::time::Duration;
///
/// fn one_per_second<S: NewStorage>() -> Bucket<S> {
///     Bucket::builder()
///         .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
///         .build_storage::<S>()
///         .expect("valid")
/// }
/// assert!(one_per_second::<Unsynchronized>().try_consume(1)?);
/// # Ok::<(), bucket4rs_local::OperationError>(())
/// ```
pub trait NewStorage: Storage + sealed::New {}

impl<S: Storage + ?Sized> Storage for &S {}

impl<S: sealed::Sealed + ?Sized> sealed::Sealed for &S {
    #[inline]
    fn execute<O: Operation>(&self, op: &O, now: i64) -> Result<O::Output, OperationError> {
        (**self).execute(op, now)
    }
    fn execute_with_config<O: Operation>(
        &self,
        op: &O,
        now: i64,
    ) -> Result<(O::Output, BucketConfiguration), OperationError> {
        (**self).execute_with_config(op, now)
    }
    fn replace_with<F>(&self, now: i64, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement,
    {
        (**self).replace_with(now, f)
    }
    fn snapshot(&self, now: i64) -> (BucketConfiguration, BucketState) {
        (**self).snapshot(now)
    }
}
