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
pub use exclusive::{Synchronized, Unsynchronized};
pub use lock_free::LockFree;

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::LockFree {}
    impl Sealed for super::Synchronized {}
    impl Sealed for super::Unsynchronized {}
    impl Sealed for super::AnyStorage {}
    impl<S: Sealed + ?Sized> Sealed for &S {}
}

/// A computed replacement: the new configuration and its state.
pub(crate) type Replacement = Result<(BucketConfiguration, BucketState), ConfigError>;

/// Where a bucket keeps its configuration and state, and how it serializes access.
///
/// Sealed: the strategies are [`LockFree`], [`Synchronized`] and [`Unsynchronized`]. All three
/// run the same pure operations of `bucket4rs-core`, so they compute identical results.
pub trait Storage: sealed::Sealed {
    /// Runs `op` at clock reading `now`.
    #[doc(hidden)]
    fn execute<O: Operation>(&self, op: &O, now: i64) -> Result<O::Output, OperationError>;

    /// Runs `op` and also returns the configuration it ran under.
    #[doc(hidden)]
    fn execute_with_config<O: Operation>(
        &self,
        op: &O,
        now: i64,
    ) -> Result<(O::Output, BucketConfiguration), OperationError>;

    /// Replaces configuration and state with what `f` computes from the current ones,
    /// atomically, at clock reading `now`. `f` may be called more than once (a lost race);
    /// what is committed is what its last call returned.
    #[doc(hidden)]
    fn replace_with<F>(&self, now: i64, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement;

    /// A consistent copy of configuration and state at clock reading `now`: the stored state,
    /// or (a lock-free bucket's compact word, which keeps no last refill time) the state
    /// refilled to `now`, which every later operation sees the same way.
    #[doc(hidden)]
    fn snapshot(&self, now: i64) -> (BucketConfiguration, BucketState);
}

/// Storages that can be created from a configuration and state.
pub trait NewStorage: Storage + Sized {
    /// Creates the storage; `monotonic_clock` says whether the bucket's clock never goes back
    /// ([`Clock::is_monotonic`](bucket4rs_core::Clock::is_monotonic)).
    #[doc(hidden)]
    fn new(config: BucketConfiguration, state: BucketState, monotonic_clock: bool) -> Self;
}

impl<S: Storage + ?Sized> Storage for &S {
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
