//! The public backend trait: how a storage engine holds bucket records.
//!
//! A backend stores opaque records (see [`format`](crate::format)) under
//! [`StorageKey`]s and runs a [`Transaction`] on one key atomically: it reads the record,
//! calls [`Transaction::apply`], and writes what that returns, with no other writer of the
//! key in between. The manager's transaction runs the core's exact
//! [`Operation`](bucket4rs_core::ops::Operation)s, so a backend never does token math
//! unless it wants a native fast path (the Redis backend runs a Lua script and has the
//! result checked by the same transaction).
//!
//! See `docs/custom-backend.md` for a worked example.

use core::fmt;
use core::time::Duration;

use async_trait::async_trait;

use crate::error::BackendError;
use crate::key::StorageKey;

/// What a transaction asks the backend to do with the key.
///
/// ```
/// use bucket4rs_distributed::Write;
/// assert_eq!(Write::Keep, Write::Keep);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Write {
    /// Leave the key as it is (also when the operation failed).
    Keep,
    /// Store `record` under the key; let it expire after `ttl` (`None`: never).
    ///
    /// The TTL runs to the moment a bucket recreated from the record's configuration would
    /// answer every later request as the stored one
    /// ([`BucketState::forgettable_at`](bucket4rs_core::BucketState::forgettable_at)), plus the
    /// manager's margin: dropping the key then is indistinguishable from keeping it. `None`
    /// when no such moment exists (initial tokens below capacity, interval refill).
    Put {
        /// The encoded record.
        record: Vec<u8>,
        /// When the key may expire.
        ttl: Option<Duration>,
    },
}

/// The operation a transaction performs, for backends that can run some natively.
///
/// A backend that ignores it (calling [`Transaction::apply`] instead) is always correct.
///
/// ```
/// use bucket4rs_distributed::Command;
/// assert_ne!(Command::TryConsume(1), Command::AvailableTokens);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// `try_consume(n)`
    TryConsume(u64),
    /// `try_consume_and_return_remaining(n)`
    TryConsumeAndReturnRemaining(u64),
    /// `estimate_ability_to_consume(n)` (read-only)
    EstimateAbilityToConsume(u64),
    /// `try_consume_as_much_as_possible(limit)`
    TryConsumeAsMuchAsPossible(Option<u64>),
    /// `add_tokens(n)`
    AddTokens(u64),
    /// `force_add_tokens(n)`
    ForceAddTokens(u64),
    /// `reset()`
    Reset,
    /// `available_tokens()` (read-only)
    AvailableTokens,
    /// `consume_ignoring_rate_limits(n)`
    ConsumeIgnoringRateLimits(u64),
    /// `reserve(tokens, max_wait_nanos)`
    Reserve {
        /// Tokens.
        tokens: u64,
        /// Longest acceptable wait.
        max_wait_nanos: u64,
    },
    /// `replace_configuration(..)`: only through [`Transaction::apply`].
    ReplaceConfiguration,
    /// Takes into a lease that the manager serves its callers from (see
    /// [`ManagerBuilder::leasing`](crate::ManagerBuilder::leasing)) this process's share of
    /// what every bandwidth has: the fewest tokens of any bandwidth (none when one is empty
    /// or in debt) divided by `processes`, rounded down, at most `tokens`. The last operation
    /// of a batch, after the call it rides with. Taken only while the record's ledger holds
    /// fewer than 24 leases of other managers, so that calls in doubt can still be settled. A
    /// native path that does not know it computes the transaction with
    /// [`Transaction::apply`].
    Lease {
        /// The most it takes.
        tokens: u64,
        /// How many processes share what there is.
        processes: u32,
    },
    /// Several operations of one key applied in arrival order in one transaction (the
    /// manager's request batching, see [`ManagerBuilder::max_batch`](crate::ManagerBuilder::max_batch));
    /// the operations are listed by [`Transaction::batch`]. A backend without a native
    /// batch path just calls [`Transaction::apply`], which runs them all.
    Batch(usize),
}

/// How a manager names one writing transaction, so that a call whose reply was lost can be
/// settled (see `docs/distributed.md`, "In-doubt calls are settled").
///
/// [`Transaction::apply`] keeps the record's ledger with it: a backend that stores what
/// `apply` returns needs nothing else. A native path that computes the record server-side
/// (the Redis script) must keep the ledger exactly as `apply` does.
///
/// ```
/// use bucket4rs_distributed::OperationId;
/// let id = OperationId::default();
/// assert!(id.settles.is_empty() && id.returns.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OperationId {
    /// The manager that sends it (random per [`ProxyManager`](crate::ProxyManager)).
    pub owner: u64,
    /// Its number in that manager (from 1, increasing).
    pub seq: u64,
    /// Every operation of the same owner numbered below this is answered or settled: the
    /// record may forget them.
    pub floor: u64,
    /// Operations of the same owner on this key whose calls are in doubt, to settle before
    /// this one runs.
    pub settles: Vec<u64>,
    /// Leases of the same owner on this key that ended, each with what it did not use, to
    /// give back before this one runs: `(seq, per bandwidth in refill units)` (tokens ×
    /// refill period in nanoseconds, plus the remainder). See `docs/distributed.md`, "Hot
    /// keys: batching and leasing".
    pub returns: Vec<(u64, Vec<u128>)>,
    /// How long the record keeps the entry, in units of 2^20 ns of the bucket's clock.
    pub window: i64,
}

/// One atomic read-modify-write on a key, made by the manager and run by a backend.
///
/// `apply` may be called more than once (a backend retrying an optimistic write calls it
/// again on the newer record); only the last call's result counts.
pub trait Transaction: Send {
    /// The operation, for native fast paths ([`Command::Batch`] for a batch).
    fn command(&self) -> Command;

    /// For a [`Command::Batch`]: its operations, in the order [`apply`](Self::apply) runs
    /// them on the record (each on the state the previous one left, all at the same
    /// instant). `None` (the default) for a single operation.
    ///
    /// A native path that runs a batch server-side must apply exactly these operations in
    /// this order and then, like for one operation, call `apply` on the record it read and
    /// store what that returns.
    fn batch(&self) -> Option<&[Command]> {
        None
    }

    /// Whether `apply` needs the backend's clock (`backend_now` must then be `Some`).
    fn needs_backend_clock(&self) -> bool;

    /// A reading of the client clock when the manager uses one (`None` with the backend
    /// clock). A native path that sends the time to its server passes the same value back
    /// as `backend_now`, so both compute at the same instant.
    fn client_now(&self) -> Option<i64>;

    /// The margin the manager adds to every TTL (for native paths that compute TTLs).
    fn ttl_margin(&self) -> Duration;

    /// When the caller stops waiting: the call's start plus the manager's
    /// [`timeout`](crate::ManagerBuilder::timeout) (`None` on an in-process backend, which
    /// never waits). A call that failed with a timeout must have changed nothing, so a remote
    /// backend hands this moment to its server and the server refuses to run a transaction
    /// that reaches it later (a command that sat in a frozen server's socket, say). The
    /// default, `None`, is for transactions built outside a manager.
    fn deadline(&self) -> Option<std::time::Instant> {
        None
    }

    /// The operation's id for in-doubt settlement (`None`, the default: a transaction built
    /// outside a manager, or for an in-process backend, which is never in doubt).
    fn operation(&self) -> Option<&OperationId> {
        None
    }

    /// Decides what to write given the key's current record (`None`: absent or expired).
    ///
    /// `backend_now` is the instant to compute at: the backend's clock (nanoseconds since
    /// the Unix epoch) when [`needs_backend_clock`](Self::needs_backend_clock), or a value
    /// of [`client_now`](Self::client_now); with `None` the client clock is read.
    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> Write;
}

/// Whether and how a backend can tell the time (for [`TimeSource::backend`](crate::TimeSource::backend)).
///
/// ```
/// use bucket4rs_distributed::BackendClock;
/// assert_ne!(BackendClock::None, BackendClock::WallClock);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendClock {
    /// The backend has no clock: managers must use a client clock.
    None,
    /// Nanoseconds since the Unix epoch (aligned refill allowed).
    WallClock,
    /// Some other timeline shared by all clients (aligned refill refused).
    Monotonic,
}

/// A storage engine for remote buckets.
///
/// Implementations must make [`transact`](Backend::transact) atomic per key against every
/// other client of the same storage (other tasks, processes and machines). Everything else
/// (argument checks, math, TTLs, retries, timeouts) is the manager's.
///
/// ```
/// use async_trait::async_trait;
/// use bucket4rs_distributed::{Backend, BackendError, StorageKey, Transaction, Write};
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// /// The smallest correct backend: one mutex around a map.
/// #[derive(Debug, Default)]
/// struct MapBackend(Mutex<HashMap<StorageKey, Vec<u8>>>);
///
/// #[async_trait]
/// impl Backend for MapBackend {
///     async fn transact(&self, key: &StorageKey, tx: &mut dyn Transaction) -> Result<(), BackendError> {
///         let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
///         if let Write::Put { record, .. } = tx.apply(map.get(key).map(Vec::as_slice), None) {
///             map.insert(key.clone(), record);
///         }
///         Ok(())
///     }
///     async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
///         Ok(self.0.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned())
///     }
///     async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
///         Ok(self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key).is_some())
///     }
/// }
/// ```
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Runs `tx` atomically on the record of `key`: read it, call [`Transaction::apply`],
    /// store the result. When `tx.needs_backend_clock()`, pass the backend's time.
    ///
    /// # Errors
    /// A [`BackendError`]; mark it [retryable](BackendError::retryable) only when the
    /// transaction certainly did not take effect.
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError>;

    /// The raw record of `key`, if any (expired keys count as absent).
    ///
    /// # Errors
    /// A [`BackendError`].
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError>;

    /// Deletes `key`; whether it existed.
    ///
    /// # Errors
    /// A [`BackendError`].
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError>;

    /// The backend's clock, if it has one. Default: none.
    fn clock(&self) -> BackendClock {
        BackendClock::None
    }

    /// Whether every call completes in this process without waiting (no I/O, no sleep, no
    /// lock held across an `.await`) and its errors are final (never
    /// [retryable](BackendError::retryable)). The manager then calls the backend directly:
    /// no `tokio::time::timeout`, no retry loop. Default: `false` (remote backends, custom
    /// backends). The [`EmbeddedBackend`](crate::EmbeddedBackend) says `true`.
    fn is_in_process(&self) -> bool {
        false
    }
}

#[async_trait]
impl<B: Backend + ?Sized> Backend for std::sync::Arc<B> {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        (**self).transact(key, tx).await
    }
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        (**self).read(key).await
    }
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        (**self).remove(key).await
    }
    fn clock(&self) -> BackendClock {
        (**self).clock()
    }
    fn is_in_process(&self) -> bool {
        (**self).is_in_process()
    }
}
