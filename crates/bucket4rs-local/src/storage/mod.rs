//! The three synchronization strategies, as storage types behind one sealed trait.

use bucket4rs_core::ops::Operation;
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
};

mod any;
mod exclusive;
mod lock_free;

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

    /// Replaces configuration and state with what `f` computes from the current ones, atomically.
    #[doc(hidden)]
    fn replace_with<F>(&self, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement;

    /// A consistent copy of configuration and (unrefilled) state.
    #[doc(hidden)]
    fn snapshot(&self) -> (BucketConfiguration, BucketState);
}

/// Storages that can be created from a configuration and state.
pub trait NewStorage: Storage + Sized {
    /// Creates the storage.
    #[doc(hidden)]
    fn new(config: BucketConfiguration, state: BucketState) -> Self;
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
    fn replace_with<F>(&self, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement,
    {
        (**self).replace_with(f)
    }
    fn snapshot(&self) -> (BucketConfiguration, BucketState) {
        (**self).snapshot()
    }
}
