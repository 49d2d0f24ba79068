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
use crate::format::{self, Record};
use crate::key::{StorageKey, StorageKeyRef};

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
    /// The TTL is the time until the bucket would be full again plus the manager's margin:
    /// after that, dropping the key is indistinguishable from keeping it.
    Put {
        /// The encoded record.
        record: Vec<u8>,
        /// When the key may expire.
        ttl: Option<Duration>,
    },
}

/// What [`Transaction::apply_decoded`] did to a key held as a decoded [`Record`].
///
/// ```
/// use bucket4rs_distributed::DecodedWrite;
/// assert_eq!(DecodedWrite::Keep, DecodedWrite::Keep);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodedWrite {
    /// Nothing changed: leave the key as it is (an absent key stays absent).
    Keep,
    /// The record passed in was updated in place; it may expire after `ttl` (`None`: never).
    Updated {
        /// When the key may expire, from now.
        ttl: Option<Duration>,
    },
    /// The key had no record: store this one; it may expire after `ttl` (`None`: never).
    Created {
        /// The new record.
        record: Record,
        /// When the key may expire, from now.
        ttl: Option<Duration>,
    },
    /// Only from [`Transaction::apply_decoded_lazy`]: the record passed in was updated in
    /// place by an operation that only takes tokens (a consumption or a reservation; same
    /// configuration), so the instant its bucket is full again did not move earlier, and an
    /// expiry computed for the key before is still a lower bound of the new one. Its TTL
    /// was left uncomputed: it is [`Record::ttl`]`(now, margin)` of the updated record, the
    /// value [`Updated`](Self::Updated) would have carried.
    ///
    /// ```
    /// use bucket4rs_distributed::DecodedWrite;
    /// let w = DecodedWrite::Consumed { now: 5, margin: std::time::Duration::ZERO };
    /// assert_ne!(w, DecodedWrite::Keep);
    /// ```
    Consumed {
        /// The operation's instant (on the clock it computed with).
        now: i64,
        /// The manager's TTL margin.
        margin: Duration,
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
    /// Several operations of one key applied in arrival order in one transaction (the
    /// manager's request batching, see [`ManagerBuilder::batching`](crate::ManagerBuilder::batching));
    /// the operations are listed by [`Transaction::batch`]. A backend without a native
    /// batch path just calls [`Transaction::apply`], which runs them all.
    Batch(usize),
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

    /// Decides what to write given the key's current record (`None`: absent or expired).
    ///
    /// `backend_now` is the instant to compute at: the backend's clock (nanoseconds since
    /// the Unix epoch) when [`needs_backend_clock`](Self::needs_backend_clock), or a value
    /// of [`client_now`](Self::client_now); with `None` the client clock is read.
    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> Write;

    /// [`apply`](Self::apply) for in-process backends that keep records decoded (the
    /// [`EmbeddedBackend`](crate::EmbeddedBackend)): works on `current` in place, with no
    /// decoding, checksum, encoding or allocation of record bytes. Same contract and same
    /// results as `apply`: on an error `current` is left untouched and the answer is
    /// [`DecodedWrite::Keep`].
    ///
    /// The default goes through the byte path (encodes `current`, calls `apply`, decodes
    /// what it writes), so transactions written before this method existed keep working;
    /// written bytes that do not decode leave the key unchanged. The manager's transactions
    /// override it.
    fn apply_decoded(
        &mut self,
        current: Option<&mut Record>,
        backend_now: Option<i64>,
    ) -> DecodedWrite {
        let bytes = current
            .as_deref()
            .map(|r| format::encode(&r.config, &r.state));
        match self.apply(bytes.as_deref(), backend_now) {
            Write::Keep => DecodedWrite::Keep,
            Write::Put { record, ttl } => match (format::decode(&record), current) {
                (Ok(decoded), Some(current)) => {
                    *current = decoded;
                    DecodedWrite::Updated { ttl }
                }
                (Ok(decoded), None) => DecodedWrite::Created {
                    record: decoded,
                    ttl,
                },
                (Err(_), _) => DecodedWrite::Keep,
            },
        }
    }

    /// [`apply_decoded`](Self::apply_decoded) for backends that keep track of expiry
    /// lazily (the [`EmbeddedBackend`](crate::EmbeddedBackend)): the same, except that an
    /// update in place by an operation that only takes tokens may be answered with
    /// [`DecodedWrite::Consumed`], leaving the TTL for the backend to compute if and when it
    /// needs it (once the previous expiry, a lower bound, has passed). The default calls
    /// `apply_decoded`; the manager's transactions override it.
    fn apply_decoded_lazy(
        &mut self,
        current: Option<&mut Record>,
        backend_now: Option<i64>,
    ) -> DecodedWrite {
        self.apply_decoded(current, backend_now)
    }
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

    /// Whether [`transact_now`](Self::transact_now) is implemented (it then never answers
    /// `None`). Default: `false`. The [`EmbeddedBackend`](crate::EmbeddedBackend) says `true`.
    ///
    /// ```
    /// use bucket4rs_distributed::{Backend, EmbeddedBackend};
    /// assert!(EmbeddedBackend::new().supports_transact_now());
    /// ```
    fn supports_transact_now(&self) -> bool {
        false
    }

    /// [`transact`](Self::transact) run to completion synchronously, on the calling thread,
    /// for backends that can (see [`supports_transact_now`](Self::supports_transact_now)):
    /// same contract and same effect as `transact`. `None` when this backend cannot (the
    /// default). The manager's synchronous entry point
    /// ([`ProxyManager::in_process_bucket`](crate::ProxyManager::in_process_bucket)) calls
    /// it; the key is borrowed, so a backend that finds the key needs no owned copy.
    ///
    /// ```
    /// # use bucket4rs_distributed::{Backend, EmbeddedBackend, KeyPolicy, Transaction, Write, Command};
    /// # struct Noop;
    /// # impl Transaction for Noop {
    /// #     fn command(&self) -> Command { Command::AvailableTokens }
    /// #     fn needs_backend_clock(&self) -> bool { true }
    /// #     fn client_now(&self) -> Option<i64> { None }
    /// #     fn ttl_margin(&self) -> std::time::Duration { std::time::Duration::ZERO }
    /// #     fn apply(&mut self, _: Option<&[u8]>, _: Option<i64>) -> Write { Write::Keep }
    /// # }
    /// let key = KeyPolicy::new("p")?.key("k")?;
    /// let backend = EmbeddedBackend::new();
    /// assert!(matches!(backend.transact_now(key.as_key_ref(), &mut Noop), Some(Ok(()))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn transact_now(
        &self,
        key: StorageKeyRef<'_>,
        tx: &mut dyn Transaction,
    ) -> Option<Result<(), BackendError>> {
        let _ = (key, tx);
        None
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
    fn supports_transact_now(&self) -> bool {
        (**self).supports_transact_now()
    }
    fn transact_now(
        &self,
        key: StorageKeyRef<'_>,
        tx: &mut dyn Transaction,
    ) -> Option<Result<(), BackendError>> {
        (**self).transact_now(key, tx)
    }
}
