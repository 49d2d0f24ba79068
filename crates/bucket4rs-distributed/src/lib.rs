//! # bucket4rs-distributed
//!
//! Remote token buckets shared by many instances of a service — one limit per API key,
//! tenant or IP — with the local bucket API and the exact math of
//! [`bucket4rs_core`]: every backend runs the core's
//! [`Operation`](bucket4rs_core::ops::Operation)s, so results are identical to a local
//! bucket's, to the nanosecond and the token.
//!
//! - [`ProxyManager`] hands out [`RemoteBucket`]s: `manager.builder().build(key, supplier)`.
//!   The configuration is stored with the state and supplied lazily (only when the key has
//!   no state yet); replacing it is explicit. Async first (tokio), with a
//!   [blocking form](RemoteBucket::as_blocking) and a [verbose form](RemoteBucket::as_verbose).
//! - [`Backend`] is the public storage trait (see `docs/custom-backend.md`).
//! - [`EmbeddedBackend`] (default): an in-process store of record bytes with the expiry the
//!   manager asks for, a stand-in for a remote store written against the public backend
//!   trait only. For a per-key limit in one process, use
//!   [`KeyedBucket`](bucket4rs_local::KeyedBucket).
//! - `RedisBackend` (feature `redis`): one round trip per operation, atomic under any number
//!   of clients, exact despite Lua's doubles (see `docs/distributed.md`); on one server, a
//!   Redis Cluster (`RedisBackend::connect_cluster`) or the master of a Redis Sentinel
//!   service (`RedisBackend::connect_sentinel`).
//! - `PostgresBackend` (feature `postgres`): one statement per operation in the common case,
//!   shipped schema and migration, expiry reaper (see `docs/distributed.md`).
//! - `SqliteBackend` (feature `sqlite`): one file on this machine, shared exactly by its
//!   processes and kept across restarts; one transaction per operation on a thread of its
//!   own, so async callers never wait on its I/O.
//! - [`format`](mod@format): the compact, versioned record; [`StorageKey`]: safe key names.
//!   What to answer while a backend is down is the caller's decision
//!   ([`DistributedError::is_unavailable`]; the HTTP layer's `FailurePolicy`).
//!
//! ```
//! use bucket4rs_core::{Bandwidth, BucketConfiguration};
//! use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
//! use std::time::Duration;
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let manager = ProxyManager::new(EmbeddedBackend::new());
//! let config = BucketConfiguration::builder()
//!     .add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60))?)
//!     .build()?;
//! let bucket = manager.builder().build("tenant-7", move || config.clone())?;
//! let probe = bucket.try_consume_and_return_remaining(1).await?;
//! assert!(probe.is_consumed());
//! assert_eq!(probe.remaining_tokens(), 99);
//! # Ok::<(), Box<dyn std::error::Error>>(()) })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Crate features
//! - `redis`: the Redis backend (`redis` crate with tokio, its multiplexed connections, its
//!   async cluster connection and its Sentinel client).
//! - `postgres`: the PostgreSQL backend (`tokio-postgres` with a `deadpool-postgres` pool).
//! - `sqlite`: the SQLite backend (`rusqlite` with the library bundled: nothing to install).
#![forbid(unsafe_code)]
#![cfg_attr(bucket4rs_docsrs, feature(doc_cfg))]

mod backend;
mod embedded;
mod error;
#[doc(hidden)]
pub mod format;
mod key;
mod ledger;
mod manager;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod reaper;
mod record;
#[cfg(feature = "redis")]
mod redis_backend;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod skew;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod tls;

pub use backend::{Backend, BackendClock, Command, OperationId, Transaction, Write};
pub use embedded::EmbeddedBackend;
pub use error::{BackendError, BackendErrorKind, DistributedError, FormatError, KeyError};
pub use key::StorageKey;
pub use manager::{
    BlockingRemoteBucket, CircuitBreaker, Leasing, ManagerBuilder, ProxyManager, RemoteBucket,
    RemoteBucketBuilder, RetryPolicy, TimeSource,
};
#[cfg(feature = "postgres")]
pub use postgres::{InvalidTableName, PostgresBackend, PostgresOptions, PostgresStats, SslMode};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use reaper::Reaper;
#[cfg(feature = "redis")]
pub use redis_backend::{RedisBackend, RedisOptions, RedisStats};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteBackend, SqliteOptions};
#[cfg(any(feature = "redis", feature = "postgres"))]
pub use tls::{TlsError, TlsOptions};

/// The `deadpool-postgres` crate of the PostgreSQL backend's pool, for
/// [`PostgresBackend::with_pool`].
#[cfg(feature = "postgres")]
pub use deadpool_postgres;
/// The `redis` crate the Redis backend is built on (1.x), for
/// [`RedisBackend::with_client`] with the very version the backend takes.
#[cfg(feature = "redis")]
pub use redis;
/// The `tokio-postgres` crate the PostgreSQL backend is built on, for
/// [`PostgresBackend::with_config`].
#[cfg(feature = "postgres")]
pub use tokio_postgres;
