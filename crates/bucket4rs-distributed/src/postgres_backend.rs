//! The PostgreSQL backend: one statement (one round trip, one implicit transaction) per
//! operation in the common case, first use of a key included.
//!
//! Protocol (see `docs/distributed.md`, section PostgreSQL):
//!
//! - Each process keeps, per key, the record and `version` it last read or wrote, behind a
//!   per-key async mutex (tasks of one process never race each other on the database).
//! - The core computes the operation on that cached record (absent key: on nothing), and the
//!   result is written with ONE compare-and-set statement: `INSERT … ON CONFLICT DO NOTHING`
//!   when the key was believed absent, `UPDATE … WHERE key = $1 AND version = $v` otherwise.
//!   The same statement returns the row as it currently is when the compare-and-set lost, so
//!   a retry needs one more statement, not a read plus a write.
//! - Read-only results are confirmed by a plain `SELECT` of the version (one round trip).
//! - A call that lost [`PostgresOptions::optimistic_rounds`] compare-and-sets in a row (2 by
//!   default) takes the row lock instead, which always makes progress: `BEGIN` +
//!   `SELECT … FOR UPDATE` (pipelined, one round trip), compute, `UPDATE`/`INSERT` + `COMMIT`
//!   (pipelined, one round trip). The lock is held for one client round trip.
//! - Otherwise rows are locked only inside one autocommit statement; `lock_timeout` and
//!   `statement_timeout` are set on every connection at start-up.

use core::fmt;
use core::future::Future;
use core::pin::pin;
use core::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use core::task::Poll;
use core::time::Duration;
use std::sync::Arc;

use async_trait::async_trait;
use dashmap::DashMap;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Row};

use crate::backend::{Backend, BackendClock, Transaction, Write};
use crate::error::{BackendError, BackendErrorKind};
use crate::key::StorageKey;

/// Longest table (or schema) name accepted: PostgreSQL's `NAMEDATALEN - 1`.
const MAX_IDENT: usize = 63;
/// TTLs beyond this are stored as "never expires" (`expires_at` NULL) rather than overflow
/// `timestamptz`.
const MAX_TTL_MICROS: u128 = 1_000 * 365 * 86_400 * 1_000_000;
/// Advisory lock key serialising concurrent `migrate()` calls (`b4rsmig` in ASCII).
const MIGRATE_LOCK: i64 = 0x0062_3472_736d_6967;
/// Locked transactions one call may run: the first can find the key absent and lose the
/// `INSERT` to a concurrent creator (the row is locked by nobody yet); the second then locks
/// the row. More are needed only if the row is deleted in between (`remove`).
const LOCKED_ATTEMPTS: u32 = 4;

/// A table name refused by [`PostgresOptions::table`].
///
/// Accepted: `name` or `schema.name`, each part 1 to 63 bytes of `[a-z0-9_]`, not starting
/// with a digit. The name is always double-quoted in SQL as well, so reserved words are
/// harmless; nothing else can reach the SQL text (every value is a bound parameter).
///
/// ```
/// use bucket4rs_distributed::PostgresOptions;
/// assert!(PostgresOptions::default().table("rate_limits").is_ok());
/// assert!(PostgresOptions::default().table("limits; DROP TABLE users").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvalidTableName {
    /// Why the name was refused.
    pub reason: &'static str,
}

impl fmt::Display for InvalidTableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid PostgreSQL table name: {}", self.reason)
    }
}

impl std::error::Error for InvalidTableName {}

fn check_ident(part: &str) -> Result<(), InvalidTableName> {
    let bad = |reason| Err(InvalidTableName { reason });
    if part.is_empty() {
        return bad("empty name part");
    }
    if part.len() > MAX_IDENT {
        return bad("a name part is longer than 63 bytes");
    }
    if part.as_bytes()[0].is_ascii_digit() {
        return bad("a name part starts with a digit");
    }
    if !part
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return bad("only [a-z0-9_] are allowed");
    }
    Ok(())
}

/// The validated, quoted form of a table name.
fn quote_table(name: &str) -> Result<String, InvalidTableName> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(InvalidTableName {
            reason: "at most one '.' (schema.table)",
        });
    }
    let mut quoted = String::new();
    for (i, p) in parts.iter().enumerate() {
        check_ident(p)?;
        if i > 0 {
            quoted.push('.');
        }
        quoted.push('"');
        quoted.push_str(p);
        quoted.push('"');
    }
    Ok(quoted)
}

/// Settings of a [`PostgresBackend`].
///
/// ```
/// use bucket4rs_distributed::PostgresOptions;
/// use std::time::Duration;
/// let o = PostgresOptions::default()
///     .table("api_limits")?
///     .max_connections(8)
///     .lock_timeout(Duration::from_millis(100));
/// # Ok::<(), bucket4rs_distributed::InvalidTableName>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct PostgresOptions {
    table: String,
    quoted: String,
    max_connections: usize,
    connect_timeout: Duration,
    wait_timeout: Duration,
    statement_timeout: Duration,
    lock_timeout: Duration,
    clock_tolerance: Duration,
    cache_capacity: usize,
    rounds: u32,
}

impl Default for PostgresOptions {
    /// Table `bucket4rs_buckets`, 16 connections, 1 s connect timeout, 1 s pool wait,
    /// `statement_timeout` 1 s, `lock_timeout` 250 ms, 50 ms clock tolerance, 65,536 cached
    /// keys, 2 compare-and-set rounds before the locking fallback.
    fn default() -> Self {
        Self {
            table: "bucket4rs_buckets".into(),
            quoted: "\"bucket4rs_buckets\"".into(),
            max_connections: 16,
            connect_timeout: Duration::from_secs(1),
            wait_timeout: Duration::from_secs(1),
            statement_timeout: Duration::from_secs(1),
            lock_timeout: Duration::from_millis(250),
            clock_tolerance: Duration::from_millis(50),
            cache_capacity: 65_536,
            rounds: 2,
        }
    }
}

impl PostgresOptions {
    /// The table (`name` or `schema.name`, `[a-z0-9_]`, ≤ 63 bytes per part).
    ///
    /// # Errors
    /// [`InvalidTableName`] for anything else.
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions;
    /// assert!(PostgresOptions::default().table("limits.per_tenant").is_ok());
    /// assert!(PostgresOptions::default().table("x\"; --").is_err());
    /// ```
    pub fn table(mut self, name: &str) -> Result<Self, InvalidTableName> {
        self.quoted = quote_table(name)?;
        self.table = name.to_owned();
        Ok(self)
    }

    /// The table name.
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions;
    /// assert_eq!(PostgresOptions::default().table_name(), "bucket4rs_buckets");
    /// ```
    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// Pool size (at least 1).
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions;
    /// let o = PostgresOptions::default().max_connections(32);
    /// ```
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long opening one connection may take.
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions; use std::time::Duration;
    /// let o = PostgresOptions::default().connect_timeout(Duration::from_millis(300));
    /// ```
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// How long a call may wait for a free pooled connection.
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions; use std::time::Duration;
    /// let o = PostgresOptions::default().wait_timeout(Duration::from_millis(300));
    /// ```
    pub fn wait_timeout(mut self, d: Duration) -> Self {
        self.wait_timeout = d;
        self
    }

    /// `statement_timeout` of every connection (at least 1 ms).
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions; use std::time::Duration;
    /// let o = PostgresOptions::default().statement_timeout(Duration::from_millis(500));
    /// ```
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.statement_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// `lock_timeout` of every connection (at least 1 ms): how long a statement waits for a
    /// row lock held by someone else before failing with a retryable timeout.
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions; use std::time::Duration;
    /// let o = PostgresOptions::default().lock_timeout(Duration::from_millis(50));
    /// ```
    pub fn lock_timeout(mut self, d: Duration) -> Self {
        self.lock_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// With the database clock ([`TimeSource::backend`](crate::TimeSource::backend)): how
    /// far behind PostgreSQL's `clock_timestamp()` the instant an operation computes at may
    /// be. The statement itself checks it; a miss costs one more round trip.
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions; use std::time::Duration;
    /// let o = PostgresOptions::default().clock_tolerance(Duration::from_millis(10));
    /// ```
    pub fn clock_tolerance(mut self, d: Duration) -> Self {
        self.clock_tolerance = d;
        self
    }

    /// How many keys' last records are remembered (the compare-and-set basis).
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions;
    /// let o = PostgresOptions::default().cache_capacity(1_000_000);
    /// ```
    pub fn cache_capacity(mut self, n: usize) -> Self {
        self.cache_capacity = n.max(1);
        self
    }

    /// How many compare-and-set statements a call may lose before it takes the row lock
    /// (`SELECT … FOR UPDATE` in a transaction: two round trips, always makes progress).
    /// Default 2: one loss is the normal cost of a cache made stale by another process (the
    /// retry, on the row the losing statement returned, nearly always wins); a second one in
    /// a row means another writer committed within one round trip, i.e. real contention,
    /// where more optimistic rounds cost round trips without guaranteeing progress. 0 takes
    /// the lock on every call.
    ///
    /// ```
    /// # use bucket4rs_distributed::PostgresOptions;
    /// let o = PostgresOptions::default().optimistic_rounds(4);
    /// ```
    pub fn optimistic_rounds(mut self, n: u32) -> Self {
        self.rounds = n;
        self
    }

    fn session_options(&self) -> String {
        let ms = |d: Duration| d.as_millis().clamp(1, i32::MAX as u128);
        format!(
            "-c lock_timeout={} -c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            ms(self.lock_timeout),
            ms(self.statement_timeout),
            ms(self.statement_timeout.saturating_mul(4)),
        )
    }
}

/// Counters of a [`PostgresBackend`].
///
/// ```
/// let s = bucket4rs_distributed::PostgresStats::default();
/// assert_eq!(s.round_trips, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresStats {
    /// Round trips: one per statement, or per pipelined pair of the locking fallback
    /// (`BEGIN` + `SELECT … FOR UPDATE`, then the write + `COMMIT`). One-time `PREPARE`s per
    /// connection are not counted.
    pub round_trips: u64,
    /// Operations that completed in their first statement.
    pub one_round_trip: u64,
    /// Compare-and-set statements that lost (stale basis, concurrent writer, expired row, or
    /// a database-clock estimate out of tolerance).
    pub conflicts: u64,
    /// Expired rows deleted by [`PostgresBackend::reap_expired`].
    pub reaped: u64,
    /// Calls that lost [`PostgresOptions::optimistic_rounds`] compare-and-sets in a row and
    /// took the row lock (`SELECT … FOR UPDATE`) instead.
    pub pessimistic: u64,
}

#[derive(Default)]
struct Counters {
    round_trips: AtomicU64,
    one_round_trip: AtomicU64,
    conflicts: AtomicU64,
    reaped: AtomicU64,
    pessimistic: AtomicU64,
}

/// What this process believes the row of a key is.
#[derive(Clone, Debug)]
enum Basis {
    Absent,
    Row {
        version: i64,
        record: Vec<u8>,
        expired: bool,
    },
}

impl Basis {
    fn live(&self) -> Option<&[u8]> {
        match self {
            Self::Row {
                record,
                expired: false,
                ..
            } => Some(record),
            _ => None,
        }
    }

    fn same_row(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Absent, Self::Absent) => true,
            (
                Self::Row {
                    version: a,
                    expired: x,
                    ..
                },
                Self::Row {
                    version: b,
                    expired: y,
                    ..
                },
            ) => a == b && x == y,
            _ => false,
        }
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Basis>>>;

struct Sql {
    insert: String,
    update: String,
    read: String,
    lock_read: String,
    lock_insert: String,
    lock_update: String,
    remove: String,
    reap: String,
    migrate: String,
}

const CLOCK_CTE: &str =
    "c AS MATERIALIZED (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS us)";
const GUARD: &str = "($4::int8 IS NULL OR ($4::int8 <= c.us AND $4::int8 >= c.us - $5::int8))";
const EXPIRES: &str =
    "CASE WHEN $3::int8 IS NULL THEN NULL ELSE now() + $3::int8 * interval '1 microsecond' END";
/// Inside an explicit transaction `now()` is the transaction's start (before a lock wait):
/// the locking fallback uses the clock itself.
const LOCK_EXPIRES: &str = "CASE WHEN $3::int8 IS NULL THEN NULL \
     ELSE clock_timestamp() + $3::int8 * interval '1 microsecond' END";

impl Sql {
    fn new(t: &str) -> Self {
        // Result columns of every statement: version (NULL: no row), state, expired,
        // clock (µs since the epoch, `clock_timestamp()`), ok (the write happened).
        let fallback = format!(
            "SELECT r.version, r.state, (r.expires_at IS NOT NULL AND r.expires_at <= now()), c.us, false \
             FROM c LEFT JOIN {t} r ON r.key = $1::text WHERE NOT EXISTS (SELECT 1 FROM w)"
        );
        let insert = format!(
            "WITH {CLOCK_CTE}, w AS (INSERT INTO {t} AS r (key, state, version, expires_at) \
             SELECT $1::text, $2::bytea, 1, {EXPIRES} FROM c WHERE {GUARD} \
             ON CONFLICT (key) DO NOTHING RETURNING r.version) \
             SELECT w.version, NULL::bytea, false, c.us, true FROM w, c UNION ALL {fallback}"
        );
        let update = format!(
            "WITH {CLOCK_CTE}, w AS (UPDATE {t} AS r SET state = $2::bytea, version = r.version + 1, \
             expires_at = {EXPIRES} FROM c WHERE r.key = $1::text AND r.version = $6::int8 \
             AND ($7::bool OR r.expires_at IS NULL OR r.expires_at > now()) AND {GUARD} \
             RETURNING r.version) \
             SELECT w.version, NULL::bytea, false, c.us, true FROM w, c UNION ALL {fallback}"
        );
        let read = format!(
            "WITH {CLOCK_CTE} SELECT r.version, r.state, \
             (r.expires_at IS NOT NULL AND r.expires_at <= now()), c.us, false \
             FROM c LEFT JOIN {t} r ON r.key = $1::text"
        );
        // The locking fallback. Columns: version (NULL: no row), state, expires_at (µs since
        // the epoch, NULL: never), clock (µs, `clock_timestamp()`). The clock is projected
        // above the join, so it is read after the row lock was granted; FOR UPDATE sits in
        // the subquery because it cannot apply to the nullable side of an outer join.
        let lock_read = format!(
            "SELECT x.version, x.state, x.exp, \
             (extract(epoch FROM clock_timestamp()) * 1000000)::int8 \
             FROM (VALUES (1)) AS d(one) LEFT JOIN (SELECT r.version, r.state, \
             (extract(epoch FROM r.expires_at) * 1000000)::int8 AS exp \
             FROM {t} AS r WHERE r.key = $1::text FOR UPDATE) AS x ON true"
        );
        let lock_insert = format!(
            "INSERT INTO {t} AS r (key, state, version, expires_at) \
             VALUES ($1::text, $2::bytea, 1, {LOCK_EXPIRES}) \
             ON CONFLICT (key) DO NOTHING RETURNING r.version"
        );
        let lock_update = format!(
            "UPDATE {t} AS r SET state = $2::bytea, version = r.version + 1, \
             expires_at = {LOCK_EXPIRES} WHERE r.key = $1::text AND r.version = $4::int8 \
             RETURNING r.version"
        );
        let remove = format!(
            "DELETE FROM {t} WHERE key = $1::text \
             RETURNING (expires_at IS NULL OR expires_at > now())"
        );
        let reap = format!(
            "DELETE FROM {t} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {t} \
             WHERE expires_at < now() LIMIT $1::int8 FOR UPDATE SKIP LOCKED)) \
             AND expires_at < now()"
        );
        let migrate = format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
             key text COLLATE \"C\" PRIMARY KEY, \
             state bytea NOT NULL, \
             version bigint NOT NULL, \
             expires_at timestamptz) WITH (fillfactor = 80)"
        );
        Self {
            insert,
            update,
            read,
            lock_read,
            lock_insert,
            lock_update,
            remove,
            reap,
            migrate,
        }
    }
}

/// Buckets in PostgreSQL.
///
/// One row per key in a table this library creates ([`migrate`](Self::migrate)):
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS "bucket4rs_buckets" (
///     key        text COLLATE "C" PRIMARY KEY,  -- the storage key (ASCII, percent-encoded)
///     state      bytea NOT NULL,                -- the shared record format (crate::format)
///     version    bigint NOT NULL,               -- +1 on every write (compare-and-set)
///     expires_at timestamptz                    -- full again + margin; NULL: never
/// ) WITH (fillfactor = 80);                     -- room for HOT updates
/// ```
///
/// An operation is one autocommit statement in the common case, also on a key's first
/// use; under contention from other processes, one more per lost compare-and-set, and after
/// [`PostgresOptions::optimistic_rounds`] lost ones in a row a locking transaction of two
/// round trips that always makes progress. Expired
/// rows read as absent and are deleted in batches by [`reap_expired`](Self::reap_expired)
/// or a [`spawn_reaper`](Self::spawn_reaper) task. Blocking callers use
/// [`RemoteBucket::blocking`](crate::RemoteBucket::blocking), as with every backend.
///
/// ```no_run
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_distributed::{PostgresBackend, PostgresOptions, ProxyManager};
/// use std::time::Duration;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let options = PostgresOptions::default().table("api_limits")?;
/// let backend = PostgresBackend::connect("postgres://app@db.internal/app", options).await?;
/// backend.migrate().await?; // idempotent
/// let _reaper = backend.spawn_reaper(Duration::from_secs(60), 1_000);
/// let manager = ProxyManager::configure(backend).key_prefix("api").build()?;
/// let config = BucketConfiguration::builder()
///     .add_limit(Bandwidth::simple(100, Duration::from_secs(60))?)
///     .build()?;
/// let bucket = manager.builder().build("tenant-1", move || config.clone())?;
/// if !bucket.try_consume(1).await? {
///     // reply 429
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    options: PostgresOptions,
    sql: Sql,
    slots: DashMap<StorageKey, Slot>,
    /// `clock_timestamp()` minus the client's wall clock, in ns (last measurement).
    offset: AtomicI64,
    counters: Counters,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("table", &self.inner.options.table)
            .field("max_connections", &self.inner.options.max_connections)
            .field("stats", &self.stats())
            .finish()
    }
}

fn map_pg(e: tokio_postgres::Error) -> BackendError {
    let (kind, retryable) = match e.code() {
        Some(c)
            if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::UNIQUE_VIOLATION =>
        {
            (BackendErrorKind::Conflict, true)
        }
        // The statement was cancelled, so its implicit transaction rolled back.
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::QUERY_CANCELED => {
            (BackendErrorKind::Timeout, true)
        }
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || c.code().starts_with("08") =>
        {
            (BackendErrorKind::Unavailable, false)
        }
        Some(c) if *c == SqlState::UNDEFINED_TABLE => {
            return BackendError::new(
                BackendErrorKind::Other,
                format!("{e}: create the table with PostgresBackend::migrate()"),
            )
            .with_source(e);
        }
        Some(_) => (BackendErrorKind::Other, false),
        None if e.is_closed() => (BackendErrorKind::Unavailable, false),
        None => (BackendErrorKind::Unavailable, false),
    };
    let message = match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    };
    BackendError::new(kind, message)
        .retryable(retryable)
        .with_source(e)
}

fn map_pool(e: PoolError) -> BackendError {
    match e {
        // Nothing was sent: safe to retry.
        PoolError::Timeout(t) => BackendError::new(
            BackendErrorKind::Timeout,
            format!("no PostgreSQL connection available ({t:?} timeout)"),
        )
        .retryable(true),
        PoolError::Backend(e) => {
            let mut err = map_pg(e);
            if err.kind() == BackendErrorKind::Unavailable {
                err = err.retryable(true);
            }
            err
        }
        other => BackendError::new(BackendErrorKind::Unavailable, other.to_string()),
    }
}

fn protocol(what: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Protocol,
        format!("unexpected PostgreSQL reply: {what}"),
    )
}

struct Reply {
    basis: Basis,
    clock_us: i64,
    ok: bool,
    version: Option<i64>,
}

fn reply(row: &Row) -> Result<Reply, BackendError> {
    let get = |e: tokio_postgres::Error| protocol(&e.to_string());
    let version: Option<i64> = row.try_get(0).map_err(get)?;
    let state: Option<Vec<u8>> = row.try_get(1).map_err(get)?;
    let expired: Option<bool> = row.try_get(2).map_err(get)?;
    let clock_us: i64 = row.try_get(3).map_err(get)?;
    let ok: bool = row.try_get(4).map_err(get)?;
    let basis = match (version, state) {
        (Some(version), Some(record)) => Basis::Row {
            version,
            record,
            expired: expired.unwrap_or(false),
        },
        _ => Basis::Absent,
    };
    Ok(Reply {
        basis,
        clock_us,
        ok,
        version,
    })
}

/// The row as `lock_read` returned it (locked when present), and the clock in µs.
fn locked_reply(row: &Row) -> Result<(Basis, i64), BackendError> {
    let get = |e: tokio_postgres::Error| protocol(&e.to_string());
    let version: Option<i64> = row.try_get(0).map_err(get)?;
    let state: Option<Vec<u8>> = row.try_get(1).map_err(get)?;
    let expires_us: Option<i64> = row.try_get(2).map_err(get)?;
    let clock_us: i64 = row.try_get(3).map_err(get)?;
    let basis = match (version, state) {
        (Some(version), Some(record)) => Basis::Row {
            version,
            record,
            // As `expires_at <= now()` in the compare-and-set path.
            expired: expires_us.is_some_and(|e| e <= clock_us),
        },
        _ => Basis::Absent,
    };
    Ok((basis, clock_us))
}

/// Polls both futures until both are ready, `a` first: with tokio-postgres, two requests
/// polled this way are pipelined (both sent, in this order, before either reply arrives).
async fn both<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let mut a = pin!(a);
    let mut b = pin!(b);
    let (mut ra, mut rb) = (None, None);
    core::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        match (ra.take(), rb.take()) {
            (Some(x), Some(y)) => Poll::Ready((x, y)),
            (x, y) => {
                ra = x;
                rb = y;
                Poll::Pending
            }
        }
    })
    .await
}

/// A pooled connection running an explicit transaction (the locking fallback).
///
/// Dropped while its transaction may still be open (the call was cancelled mid-way, e.g. by
/// the manager's timeout, or a `ROLLBACK` failed), the connection is closed instead of going
/// back to the pool: the server rolls the transaction back and frees the row lock, and no
/// later call can run inside a leftover transaction.
struct TxClient {
    client: Option<deadpool_postgres::Object>,
    open: AtomicBool,
}

impl TxClient {
    fn get(&self) -> Result<&deadpool_postgres::Object, BackendError> {
        self.client
            .as_ref()
            .ok_or_else(|| protocol("connection already released"))
    }

    fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::Relaxed);
    }
}

impl Drop for TxClient {
    fn drop(&mut self) {
        if self.open.load(Ordering::Relaxed) {
            if let Some(client) = self.client.take() {
                drop(deadpool_postgres::Object::take(client));
            }
        }
    }
}

fn ttl_micros(ttl: Option<Duration>) -> Option<i64> {
    let t = ttl?;
    let us = t.as_nanos().div_ceil(1_000).max(1);
    if us >= MAX_TTL_MICROS {
        None
    } else {
        i64::try_from(us).ok()
    }
}

fn wall_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl PostgresBackend {
    /// Connects a pool to `url` (`postgres://user@host:port/db`, or a key=value string).
    /// Checks one connection, so an unreachable server is an error here.
    ///
    /// # Errors
    /// [`BackendErrorKind::Other`] for a malformed URL, [`BackendErrorKind::Unavailable`] /
    /// [`BackendErrorKind::Timeout`] when the server cannot be reached in time.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{PostgresBackend, PostgresOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = PostgresBackend::connect(
    ///     "postgres://postgres@127.0.0.1:5432/test",
    ///     PostgresOptions::default(),
    /// ).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self, BackendError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            BackendError::new(BackendErrorKind::Other, format!("bad PostgreSQL URL: {e}"))
        })?;
        let mut session = options.session_options();
        if let Some(user) = config.get_options() {
            session = format!("{user} {session}");
        }
        config
            .options(&session)
            .connect_timeout(options.connect_timeout)
            .application_name("bucket4rs");
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.max_connections)
            .wait_timeout(Some(options.wait_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| BackendError::new(BackendErrorKind::Other, e.to_string()))?;
        let sql = Sql::new(&options.quoted);
        let backend = Self {
            inner: Arc::new(Inner {
                pool,
                options,
                sql,
                slots: DashMap::new(),
                offset: AtomicI64::new(0),
                counters: Counters::default(),
            }),
        };
        let budget = backend.inner.options.connect_timeout.saturating_mul(2);
        backend
            .bounded(budget, async {
                let client = backend.inner.pool.get().await.map_err(map_pool)?;
                let row = client
                    .query_one(
                        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8",
                        &[],
                    )
                    .await
                    .map_err(map_pg)?;
                let us: i64 = row.try_get(0).map_err(|e| protocol(&e.to_string()))?;
                backend.observe_clock(us);
                Ok(())
            })
            .await?;
        Ok(backend)
    }

    /// The options in use.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{PostgresBackend, PostgresOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # let backend = PostgresBackend::connect("postgres://postgres@127.0.0.1/test", PostgresOptions::default()).await?;
    /// assert_eq!(backend.options().table_name(), "bucket4rs_buckets");
    /// # Ok(()) }
    /// ```
    pub fn options(&self) -> &PostgresOptions {
        &self.inner.options
    }

    /// Creates the table if it does not exist (idempotent, safe to run from many processes
    /// at once: serialised by an advisory lock).
    ///
    /// # Errors
    /// A [`BackendError`] (e.g. no `CREATE` privilege).
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{PostgresBackend, PostgresOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # let backend = PostgresBackend::connect("postgres://postgres@127.0.0.1/test", PostgresOptions::default()).await?;
    /// backend.migrate().await?;
    /// backend.migrate().await?; // no-op
    /// # Ok(()) }
    /// ```
    pub async fn migrate(&self) -> Result<(), BackendError> {
        let inner = &self.inner;
        self.bounded(inner.options.statement_timeout.saturating_mul(2), async {
            let mut client = inner.pool.get().await.map_err(map_pool)?;
            let tx = client.transaction().await.map_err(map_pg)?;
            tx.execute("SELECT pg_advisory_xact_lock($1::int8)", &[&MIGRATE_LOCK])
                .await
                .map_err(map_pg)?;
            tx.batch_execute(&inner.sql.migrate).await.map_err(map_pg)?;
            tx.commit().await.map_err(map_pg)
        })
        .await
    }

    /// Deletes at most `batch` expired rows; how many it deleted.
    ///
    /// Uses `DELETE … WHERE ctid = ANY(ARRAY(SELECT ctid … WHERE expires_at < now() LIMIT n
    /// FOR UPDATE SKIP LOCKED)) AND expires_at < now()`: a row being written is skipped, and a
    /// row refilled since the reaper's snapshot is re-checked under its lock, so a live row is
    /// never deleted.
    ///
    /// # Errors
    /// A [`BackendError`].
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{PostgresBackend, PostgresOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # let backend = PostgresBackend::connect("postgres://postgres@127.0.0.1/test", PostgresOptions::default()).await?;
    /// while backend.reap_expired(1_000).await? == 1_000 {}
    /// # Ok(()) }
    /// ```
    pub async fn reap_expired(&self, batch: u32) -> Result<u64, BackendError> {
        let inner = &self.inner;
        self.bounded(inner.options.statement_timeout.saturating_mul(2), async {
            let client = inner.pool.get().await.map_err(map_pool)?;
            let stmt = client
                .prepare_cached(&inner.sql.reap)
                .await
                .map_err(map_pg)?;
            inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let n = client
                .execute(&stmt, &[&i64::from(batch)])
                .await
                .map_err(map_pg)?;
            inner.counters.reaped.fetch_add(n, Ordering::Relaxed);
            Ok(n)
        })
        .await
    }

    /// Spawns a tokio task that reaps expired rows every `every`, in batches of `batch`
    /// (repeating at once while batches come back full). Errors are retried next period.
    /// The task stops when the returned [`Reaper`] is dropped.
    ///
    /// Must be called inside a tokio runtime.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{PostgresBackend, PostgresOptions}; use std::time::Duration;
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # let backend = PostgresBackend::connect("postgres://postgres@127.0.0.1/test", PostgresOptions::default()).await?;
    /// let reaper = backend.spawn_reaper(Duration::from_secs(30), 500);
    /// // … serve …
    /// drop(reaper);
    /// # Ok(()) }
    /// ```
    pub fn spawn_reaper(&self, every: Duration, batch: u32) -> Reaper {
        let backend = self.clone();
        let batch = batch.max(1);
        let task = tokio::spawn(async move {
            loop {
                while let Ok(n) = backend.reap_expired(batch).await {
                    if n < u64::from(batch) {
                        break;
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
        Reaper { task }
    }

    /// A snapshot of the counters.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{PostgresBackend, PostgresOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # let backend = PostgresBackend::connect("postgres://postgres@127.0.0.1/test", PostgresOptions::default()).await?;
    /// println!("{:?}", backend.stats());
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> PostgresStats {
        let c = &self.inner.counters;
        PostgresStats {
            round_trips: c.round_trips.load(Ordering::Relaxed),
            one_round_trip: c.one_round_trip.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            reaped: c.reaped.load(Ordering::Relaxed),
            pessimistic: c.pessimistic.load(Ordering::Relaxed),
        }
    }

    async fn bounded<T>(
        &self,
        budget: Duration,
        fut: impl core::future::Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout(budget, fut).await {
            Ok(r) => r,
            Err(_) => Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!("PostgreSQL did not answer within {budget:?}"),
            )),
        }
    }

    fn observe_clock(&self, clock_us: i64) {
        let db = clock_us.saturating_mul(1_000);
        self.inner
            .offset
            .store(db.saturating_sub(wall_nanos()), Ordering::Relaxed);
    }

    /// An estimate of `clock_timestamp()` in ns, slightly behind it (the last reading was
    /// taken before its reply arrived).
    fn estimate_db_now(&self) -> i64 {
        wall_nanos().saturating_add(self.inner.offset.load(Ordering::Relaxed))
    }

    /// The locking fallback of [`Backend::transact`]: `BEGIN` + `SELECT … FOR UPDATE`
    /// (pipelined), compute, then the write + `COMMIT` (pipelined). On success the committed
    /// row becomes the cached basis, so the key's next call is optimistic again.
    async fn locked(
        &self,
        client: deadpool_postgres::Object,
        key: &StorageKey,
        tx: &mut dyn Transaction,
        cached: &mut Option<Basis>,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        inner.counters.pessimistic.fetch_add(1, Ordering::Relaxed);
        let conn = TxClient {
            client: Some(client),
            open: AtomicBool::new(false),
        };
        let c = conn.get()?;
        let read = c
            .prepare_cached(&inner.sql.lock_read)
            .await
            .map_err(map_pg)?;
        let insert = c
            .prepare_cached(&inner.sql.lock_insert)
            .await
            .map_err(map_pg)?;
        let update = c
            .prepare_cached(&inner.sql.lock_update)
            .await
            .map_err(map_pg)?;
        let key_str = key.as_str();
        for _ in 0..LOCKED_ATTEMPTS {
            conn.set_open(true);
            inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let (begun, row) =
                both(c.batch_execute("BEGIN"), c.query_one(&read, &[&key_str])).await;
            let parsed = begun
                .and(row)
                .map_err(map_pg)
                .and_then(|row| locked_reply(&row));
            let (basis, clock_us) = match parsed {
                Ok(p) => p,
                Err(e) => {
                    self.rollback(&conn).await;
                    return Err(e);
                }
            };
            self.observe_clock(clock_us);
            // Computed under the lock at the clock read after it was granted: exact.
            let now = tx
                .needs_backend_clock()
                .then(|| clock_us.saturating_mul(1_000));
            let (record, ttl) = match tx.apply(basis.live(), now) {
                Write::Keep => {
                    inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = c.batch_execute("COMMIT").await {
                        self.rollback(&conn).await;
                        return Err(map_pg(e));
                    }
                    conn.set_open(false);
                    *cached = Some(basis);
                    return Ok(());
                }
                Write::Put { record, ttl } => (record, ttl),
            };
            let ttl_us = ttl_micros(ttl);
            inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let (written, committed) = match &basis {
                Basis::Absent => {
                    both(
                        c.query_opt(&insert, &[&key_str, &record, &ttl_us]),
                        c.batch_execute("COMMIT"),
                    )
                    .await
                }
                Basis::Row { version, .. } => {
                    both(
                        c.query_opt(&update, &[&key_str, &record, &ttl_us, version]),
                        c.batch_execute("COMMIT"),
                    )
                    .await
                }
            };
            match (written, committed) {
                // The transaction ended either way: a COMMIT after a failed statement rolls
                // back (and reports no error).
                (Ok(Some(row)), Ok(())) => {
                    conn.set_open(false);
                    let version: i64 = row.try_get(0).map_err(|e| protocol(&e.to_string()))?;
                    *cached = Some(Basis::Row {
                        version,
                        record,
                        expired: false,
                    });
                    return Ok(());
                }
                (Err(e), Ok(())) => {
                    conn.set_open(false);
                    return Err(map_pg(e));
                }
                // The key was absent when read (nothing to lock) and another client created
                // it since: nothing was written; lock the row it created.
                (Ok(None), Ok(())) => {
                    conn.set_open(false);
                    inner.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                }
                (written, Err(e)) => {
                    self.rollback(&conn).await;
                    return Err(map_pg(written.err().unwrap_or(e)));
                }
            }
        }
        Err(BackendError::new(
            BackendErrorKind::Conflict,
            format!("key {key} was created and deleted under {LOCKED_ATTEMPTS} locking attempts"),
        )
        .retryable(true))
    }

    /// Ends a transaction left in an unknown state; if that fails too, the connection is
    /// closed when `conn` drops (see [`TxClient`]).
    async fn rollback(&self, conn: &TxClient) {
        let Ok(c) = conn.get() else { return };
        self.inner
            .counters
            .round_trips
            .fetch_add(1, Ordering::Relaxed);
        // Outside a transaction ROLLBACK only warns, so success means "no transaction open".
        if c.batch_execute("ROLLBACK").await.is_ok() {
            conn.set_open(false);
        }
    }

    fn slot(&self, key: &StorageKey) -> Slot {
        if let Some(s) = self.inner.slots.get(key) {
            return s.clone();
        }
        let slots = &self.inner.slots;
        if slots.len() >= self.inner.options.cache_capacity {
            // Forget idle keys (a forgotten key costs one extra statement on its next use).
            slots.retain(|_, s| Arc::strong_count(s) > 1);
        }
        slots.entry(key.clone()).or_default().clone()
    }
}

/// The background reaper task of [`PostgresBackend::spawn_reaper`]; stops when dropped.
///
/// ```no_run
/// # use bucket4rs_distributed::{PostgresBackend, PostgresOptions}; use std::time::Duration;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// # let backend = PostgresBackend::connect("postgres://postgres@127.0.0.1/test", PostgresOptions::default()).await?;
/// let reaper = backend.spawn_reaper(Duration::from_secs(30), 500);
/// drop(reaper); // stops it
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Reaper {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        let inner = &self.inner;
        let slot = self.slot(key);
        let mut cached = slot.lock().await;
        // Forget the basis unless this call ends with a known row.
        let mut basis = cached.take().unwrap_or(Basis::Absent);
        let mut fresh = false;
        let backend_clock = tx.needs_backend_clock();
        let mut reading: Option<i64> = None;
        let client = inner.pool.get().await.map_err(map_pool)?;
        let tolerance_us =
            i64::try_from(inner.options.clock_tolerance.as_micros()).unwrap_or(i64::MAX);
        let key_str = key.as_str();
        for round in 0..inner.options.rounds {
            // The write this round most likely sends, prepared before the clock is estimated:
            // on a connection's first use preparing is a round trip of its own, which would
            // otherwise age the estimate towards the guard's tolerance.
            let likely = match &basis {
                Basis::Absent => &inner.sql.insert,
                Basis::Row { .. } => &inner.sql.update,
            };
            let prepared = client.prepare_cached(likely).await.map_err(map_pg)?;
            let now = if backend_clock {
                Some(reading.take().unwrap_or_else(|| self.estimate_db_now()))
            } else {
                None
            };
            let guard_us = now.map(|n| n.div_euclid(1_000));
            let write = tx.apply(basis.live(), now);
            let (stmt, record) = match write {
                Write::Keep if fresh => {
                    // Computed on a row this call just read, at a database clock reading.
                    *cached = Some(basis);
                    return Ok(());
                }
                // The read's reply is held to the estimate as well; preparing it here costs
                // at most one extra round on a connection's first read.
                Write::Keep => (
                    client
                        .prepare_cached(&inner.sql.read)
                        .await
                        .map_err(map_pg)?,
                    None,
                ),
                Write::Put { record, ttl } => (prepared, Some((record, ttl))),
            };
            inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let row = match &record {
                None => client.query_one(&stmt, &[&key_str]).await,
                Some((rec, ttl)) => {
                    let ttl_us = ttl_micros(*ttl);
                    match &basis {
                        Basis::Absent => {
                            client
                                .query_one(
                                    &stmt,
                                    &[&key_str, rec, &ttl_us, &guard_us, &tolerance_us],
                                )
                                .await
                        }
                        Basis::Row {
                            version, expired, ..
                        } => {
                            client
                                .query_one(
                                    &stmt,
                                    &[
                                        &key_str,
                                        rec,
                                        &ttl_us,
                                        &guard_us,
                                        &tolerance_us,
                                        version,
                                        expired,
                                    ],
                                )
                                .await
                        }
                    }
                }
            }
            .map_err(map_pg)?;
            let r = reply(&row)?;
            self.observe_clock(r.clock_us);
            let in_tolerance = guard_us
                .is_none_or(|g| g <= r.clock_us && g >= r.clock_us.saturating_sub(tolerance_us));
            let done = match &record {
                Some((rec, _)) if r.ok => {
                    let version = r.version.ok_or_else(|| protocol("no version"))?;
                    *cached = Some(Basis::Row {
                        version,
                        record: rec.clone(),
                        expired: false,
                    });
                    true
                }
                Some(_) => false,
                None if basis.same_row(&r.basis) && in_tolerance => {
                    *cached = Some(basis);
                    if round == 0 {
                        inner
                            .counters
                            .one_round_trip
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(());
                }
                None => false,
            };
            if done {
                if round == 0 {
                    inner
                        .counters
                        .one_round_trip
                        .fetch_add(1, Ordering::Relaxed);
                }
                return Ok(());
            }
            inner.counters.conflicts.fetch_add(1, Ordering::Relaxed);
            basis = r.basis;
            fresh = true;
            reading = Some(r.clock_us.saturating_mul(1_000));
        }
        // Lost every optimistic round: take the row lock, which always makes progress.
        self.locked(client, key, tx, &mut cached).await
    }

    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        let inner = &self.inner;
        let client = inner.pool.get().await.map_err(map_pool)?;
        let stmt = client
            .prepare_cached(&inner.sql.read)
            .await
            .map_err(map_pg)?;
        inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
        let row = client
            .query_one(&stmt, &[&key.as_str()])
            .await
            .map_err(map_pg)?;
        let r = reply(&row)?;
        Ok(r.basis.live().map(<[u8]>::to_vec))
    }

    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        let inner = &self.inner;
        let slot = self.slot(key);
        let mut cached = slot.lock().await;
        *cached = None;
        let client = inner.pool.get().await.map_err(map_pool)?;
        let stmt = client
            .prepare_cached(&inner.sql.remove)
            .await
            .map_err(map_pg)?;
        inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
        let rows = client
            .query(&stmt, &[&key.as_str()])
            .await
            .map_err(map_pg)?;
        let mut live = false;
        for row in rows {
            live |= row.try_get::<_, bool>(0).unwrap_or(false);
        }
        Ok(live)
    }

    fn clock(&self) -> BackendClock {
        BackendClock::WallClock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_validated_and_quoted() {
        assert_eq!(quote_table("a_b1").unwrap(), "\"a_b1\"");
        assert_eq!(quote_table("s.t").unwrap(), "\"s\".\"t\"");
        for bad in [
            "",
            "A",
            "1x",
            "a.b.c",
            "a;b",
            "a\"b",
            "a b",
            ".t",
            "t.",
            "ä",
            &"x".repeat(64),
        ] {
            assert!(quote_table(bad).is_err(), "{bad:?}");
        }
        assert!(quote_table(&"x".repeat(63)).is_ok());
    }

    #[test]
    fn ttls_are_rounded_up_to_microseconds_and_capped() {
        assert_eq!(ttl_micros(None), None);
        assert_eq!(ttl_micros(Some(Duration::from_nanos(1))), Some(1));
        assert_eq!(ttl_micros(Some(Duration::from_nanos(1_001))), Some(2));
        assert_eq!(ttl_micros(Some(Duration::MAX)), None);
    }
}
