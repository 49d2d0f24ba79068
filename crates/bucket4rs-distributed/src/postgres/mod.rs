//! The PostgreSQL backend: one statement (one round trip, one implicit transaction) per
//! operation in the common case, first use of a key included.
//!
//! Protocol (see `docs/distributed.md`, section PostgreSQL):
//!
//! - Each process keeps, per key, the record and `version` it last read or wrote, behind a
//!   per-key async mutex (tasks of one process never race each other on the database).
//! - The core computes the operation on that cached record (absent key: on nothing), and the
//!   result is written with ONE compare-and-set statement: `INSERT … ON CONFLICT DO NOTHING`
//!   when the key was believed absent, `UPDATE … WHERE key = $1 AND version = $v AND state =
//!   $bytes` otherwise (the bytes too: a row edited by hand without a new version is noticed).
//!   The same statement returns the row as it currently is when the compare-and-set lost, so
//!   a retry needs one more statement, not a read plus a write.
//! - Read-only results are confirmed by a plain `SELECT` of the version (one round trip).
//! - A call that lost [`PostgresOptions::optimistic_rounds`] compare-and-sets in a row (2 by
//!   default) takes the row lock instead, which always makes progress: `BEGIN` +
//!   `SELECT … FOR UPDATE` (pipelined, one round trip), compute, `UPDATE`/`INSERT` + `COMMIT`
//!   (pipelined, one round trip). The lock is held for one client round trip.
//! - Otherwise rows are locked only inside one autocommit statement; `lock_timeout` and
//!   `statement_timeout` are set on every connection at start-up.
//! - Every write carries the caller's deadline ([`Transaction::deadline`]) converted to the
//!   database clock, and writes nothing when `clock_timestamp()` has passed it (a statement
//!   that sat in a frozen server's socket, say): the call then fails with a timeout and has
//!   changed nothing. The conversion errs early: the offset between the clocks is the
//!   tightest bound of the last 10 s, measured on every reply (a reading lags by its reply's
//!   transit, so a slow reply gives a looser bound, which is ignored: `crate::skew`), and a
//!   reply margin (twice the last round trip, at least 1 ms, at most half the time left) is
//!   subtracted for the write's own commit and reply.

mod connect;
mod options;
mod sql;

use core::fmt;

use core::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use core::time::Duration;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use dashmap::DashMap;
use deadpool_postgres::{Pool, Runtime};

use crate::backend::{Backend, BackendClock, Transaction, Write};
use crate::error::{BackendError, BackendErrorKind};
use crate::key::StorageKey;
use crate::reaper::Reaper;
use crate::skew::{ClockOffset, host_micros};
use crate::tls::TlsOptions;

pub use options::{InvalidTableName, PostgresOptions, SslMode};
pub use sql::PostgresStats;
use sql::*;

/// Advisory lock key serialising concurrent `migrate()` calls (`b4rsmig` in ASCII).
const MIGRATE_LOCK: i64 = 0x0062_3472_736d_6967;
/// Locked transactions one call may run: the first can find the key absent and lose the
/// `INSERT` to a concurrent creator (the row is locked by nobody yet); the second then locks
/// the row. More are needed only if the row is deleted in between (`remove`).
const LOCKED_ATTEMPTS: u32 = 4;
/// The first wait of the background clock reading after a failure; it doubles up to
/// [`MAX_START_BACKOFF`].
const START_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait of the background clock reading between two attempts.
const MAX_START_BACKOFF: Duration = Duration::from_secs(5);

/// Buckets in PostgreSQL.
///
/// One row per key in a table this library creates ([`migrate`](Self::migrate)):
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS "bucket4rs_buckets" (
///     key        text COLLATE "C" PRIMARY KEY,  -- the storage key (ASCII, percent-encoded)
///     state      bytea NOT NULL,                -- the shared record format (crate::format)
///     version    bigint NOT NULL,               -- +1 on every write (compare-and-set)
///     expires_at timestamptz                    -- forgettable + margin; NULL: never
/// ) WITH (fillfactor = 80);                     -- room for HOT updates
/// ```
///
/// An operation is one autocommit statement in the common case, also on a key's first
/// use; under contention from other processes, one more per lost compare-and-set, and after
/// [`PostgresOptions::optimistic_rounds`] lost ones in a row a locking transaction of two
/// round trips that always makes progress. A write never takes effect after the caller's
/// deadline ([`Transaction::deadline`], judged on the database clock), and the compare-and-set
/// compares the stored bytes as well as the version. A row expires only when a recreated
/// bucket would answer alike (else `expires_at` is NULL); expired
/// rows read as absent and are deleted in batches by [`reap_expired`](Self::reap_expired)
/// or a [`spawn_reaper`](Self::spawn_reaper) task. Blocking callers use
/// [`RemoteBucket::as_blocking`](crate::RemoteBucket::as_blocking), as with every backend.
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
///     .add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60))?)
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
    /// `clock_timestamp()` against the client's wall clock: the tightest recent bound.
    offset: ClockOffset,
    /// The last statement's round trip, in ns.
    rtt: AtomicI64,
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

impl PostgresBackend {
    /// A backend with a pool of connections to `url` (`postgres://user@host:port/db`, or a
    /// key=value string) and `options`.
    ///
    /// Creating it never waits for the server and never fails because the server is down:
    /// it connects in the background (on the current tokio runtime), and until PostgreSQL
    /// answers every call fails at once with a retryable [`BackendErrorKind::Unavailable`]
    /// (nothing was sent), which the manager's retries, its circuit breaker and a
    /// failure policy (`bucket4rs-tower`'s `FailurePolicy`) handle as any outage.
    ///
    /// # Errors
    /// [`BackendErrorKind::Other`] for a malformed URL.
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
        let (url, ssl) = connect::split_ssl(url)?;
        let config: tokio_postgres::Config = url.parse().map_err(|e| {
            BackendError::new(BackendErrorKind::Other, format!("bad PostgreSQL URL: {e}"))
        })?;
        let mode = options
            .ssl_mode
            .or(ssl.mode)
            .unwrap_or_else(|| connect::mode_of(&config));
        let tls = ssl.certificates(&options.tls)?;
        Self::pooled(config, mode, &tls, options)
    }

    /// A backend with a pool of connections made from the application's own
    /// [`tokio_postgres::Config`] (host, user, password, database, its own options); otherwise
    /// as [`connect`](Self::connect). The backend adds its session settings
    /// (`lock_timeout`, `statement_timeout`, `idle_in_transaction_session_timeout`, from
    /// `options`) to the config's `options`, and `options`' connect timeout. TLS as
    /// [`PostgresOptions::ssl_mode`] says, else as the config's `ssl_mode` (its `disable`,
    /// `prefer` or `require`).
    ///
    /// # Errors
    /// [`BackendErrorKind::Other`] if the pool cannot be built.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{PostgresBackend, PostgresOptions, SslMode};
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut config = tokio_postgres::Config::new();
    /// config.host("db.internal").user("app").password("secret").dbname("app");
    /// let options = PostgresOptions::default().ssl_mode(SslMode::VerifyFull);
    /// let backend = PostgresBackend::with_config(config, options)?;
    /// # Ok(()) }
    /// ```
    pub fn with_config(
        config: tokio_postgres::Config,
        options: PostgresOptions,
    ) -> Result<Self, BackendError> {
        let mode = options
            .ssl_mode
            .unwrap_or_else(|| connect::mode_of(&config));
        let tls = options.tls.clone();
        Self::pooled(config, mode, &tls, options)
    }

    fn pooled(
        mut config: tokio_postgres::Config,
        mode: SslMode,
        tls: &TlsOptions,
        options: PostgresOptions,
    ) -> Result<Self, BackendError> {
        let mut session = options.session_options();
        if let Some(user) = config.get_options() {
            session = format!("{user} {session}");
        }
        config
            .options(&session)
            .connect_timeout(options.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("bucket4rs");
        }
        let manager = connect::manager(config, mode, tls)?;
        let pool = Pool::builder(manager)
            .max_size(options.max_connections)
            .wait_timeout(Some(options.wait_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| BackendError::new(BackendErrorKind::Other, e.to_string()))?;
        Ok(Self::with_pool(pool, options))
    }

    /// A backend on the application's own `deadpool-postgres` [`Pool`](deadpool_postgres::Pool),
    /// with its connections, TLS and pool settings as they are; `options` gives the table,
    /// the clock tolerance, the cache and the optimistic rounds (its pool, connection and
    /// session settings are the pool's business here). Set `lock_timeout` and
    /// `statement_timeout` on the pool's connections (their `options`): without them a
    /// statement waits for a row lock as long as PostgreSQL lets it, bounded only by the
    /// manager's timeout (a late write is still refused: every write checks the caller's
    /// deadline on the database clock). Connects in the background as [`connect`](Self::connect)
    /// does.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{PostgresBackend, PostgresOptions};
    /// # fn run(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = PostgresBackend::with_pool(pool.clone(), PostgresOptions::default());
    /// # Ok(()) }
    /// ```
    pub fn with_pool(pool: Pool, options: PostgresOptions) -> Self {
        let sql = Sql::new(&options.quoted);
        let backend = Self {
            inner: Arc::new(Inner {
                pool,
                options,
                sql,
                slots: DashMap::new(),
                offset: ClockOffset::new(),
                rtt: AtomicI64::new(0),
                counters: Counters::default(),
            }),
        };
        backend.start();
        backend
    }

    /// Reads the database clock in the background on the current tokio runtime (none: the
    /// first statement's reply does), retrying with a backoff (50 ms, doubling up to 5 s)
    /// until the server answers, so that a backend can be created while its server is down.
    /// Ends when it has answered or the backend is dropped.
    fn start(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            let mut wait = START_BACKOFF;
            loop {
                let Some(inner) = inner.upgrade() else { return };
                let backend = Self { inner };
                let budget = backend.inner.options.connect_timeout.saturating_mul(2);
                if backend.read_clock(budget).await.is_ok() {
                    return;
                }
                drop(backend);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_START_BACKOFF);
            }
        });
    }

    /// One reading of `clock_timestamp()` for the estimate of the database clock.
    async fn read_clock(&self, budget: Duration) -> Result<(), BackendError> {
        self.bounded(budget, async {
            let client = self.inner.pool.get().await.map_err(map_pool)?;
            let row = client
                .query_one(
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8",
                    &[],
                )
                .await
                .map_err(map_pg)?;
            let us: i64 = row.try_get(0).map_err(|e| protocol(&e.to_string()))?;
            self.observe_clock(us);
            Ok(())
        })
        .await
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
        Reaper::new(task)
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
        self.inner.offset.observe(clock_us, host_micros());
    }

    /// An estimate of `clock_timestamp()` in ns, slightly behind it (the reading the estimate
    /// comes from was taken before its reply arrived).
    fn estimate_db_now(&self) -> i64 {
        self.inner.offset.server_now_us().saturating_mul(1_000)
    }

    fn observe_rtt(&self, since: Instant) {
        let ns = i64::try_from(since.elapsed().as_nanos()).unwrap_or(i64::MAX);
        self.inner.rtt.store(ns, Ordering::Relaxed);
    }

    /// The caller's deadline on the database clock, in µs: the estimate of
    /// `clock_timestamp()` (which lags it by up to the last reply's transit, so it errs
    /// early) plus the time left, less a reply margin of twice the last round trip, at least
    /// 1 ms, at most half the time left (the write's commit and reply must arrive before the
    /// caller gives up). A statement that runs later writes nothing.
    fn db_deadline_us(&self, deadline: Option<Instant>) -> Option<i64> {
        let deadline = deadline?;
        let left = deadline.saturating_duration_since(Instant::now());
        let left = i64::try_from(left.as_nanos()).unwrap_or(i64::MAX);
        let margin = self
            .inner
            .rtt
            .load(Ordering::Relaxed)
            .saturating_mul(2)
            .max(1_000_000)
            .min(left / 2);
        Some(
            self.inner
                .offset
                .on_server(deadline)
                .saturating_sub(margin.div_euclid(1_000)),
        )
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
            let deadline_us = self.db_deadline_us(tx.deadline());
            inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let (written, committed) = match &basis {
                Basis::Absent => {
                    both(
                        c.query_one(&insert, &[&key_str, &record, &ttl_us, &deadline_us]),
                        c.batch_execute("COMMIT"),
                    )
                    .await
                }
                Basis::Row { version, .. } => {
                    both(
                        c.query_one(
                            &update,
                            &[&key_str, &record, &ttl_us, version, &deadline_us],
                        ),
                        c.batch_execute("COMMIT"),
                    )
                    .await
                }
            };
            let written = written.map(|row| {
                let get = |e: tokio_postgres::Error| protocol(&e.to_string());
                let version: Option<i64> = row.try_get(0).map_err(get)?;
                let late: bool = row.try_get(1).map_err(get)?;
                Ok::<_, BackendError>((version, late))
            });
            match (written, committed) {
                // The transaction ended either way: a COMMIT after a failed statement rolls
                // back (and reports no error).
                (Ok(Ok((Some(version), _))), Ok(())) => {
                    conn.set_open(false);
                    *cached = Some(Basis::Row {
                        version,
                        record,
                        expired: false,
                    });
                    return Ok(());
                }
                (Ok(Ok((None, true))), Ok(())) => {
                    conn.set_open(false);
                    *cached = Some(basis);
                    return Err(late_error());
                }
                (Ok(Err(e)), Ok(())) => {
                    conn.set_open(false);
                    return Err(e);
                }
                (Err(e), Ok(())) => {
                    conn.set_open(false);
                    return Err(map_write(e));
                }
                // The key was absent when read (nothing to lock) and another client created
                // it since: nothing was written; lock the row it created.
                (Ok(Ok((None, false))), Ok(())) => {
                    conn.set_open(false);
                    inner.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                }
                (written, Err(e)) => {
                    self.rollback(&conn).await;
                    let first = match written {
                        Err(w) => map_write(w),
                        _ => map_write(e),
                    };
                    return Err(first);
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
            let deadline_us = self.db_deadline_us(tx.deadline());
            inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let sent = Instant::now();
            let row = match &record {
                None => client.query_one(&stmt, &[&key_str]).await,
                Some((rec, ttl)) => {
                    let ttl_us = ttl_micros(*ttl);
                    match &basis {
                        Basis::Absent => {
                            client
                                .query_one(
                                    &stmt,
                                    &[
                                        &key_str,
                                        rec,
                                        &ttl_us,
                                        &guard_us,
                                        &tolerance_us,
                                        &deadline_us,
                                    ],
                                )
                                .await
                        }
                        Basis::Row {
                            version,
                            expired,
                            record: was,
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
                                        was,
                                        &deadline_us,
                                    ],
                                )
                                .await
                        }
                    }
                }
            }
            .map_err(|e| match record {
                Some(_) => map_write(e),
                None => map_pg(e),
            })?;
            self.observe_rtt(sent);
            let r = reply(&row)?;
            self.observe_clock(r.clock_us);
            if r.late && !r.ok {
                // Nothing written; the row it answered is the key's real one.
                *cached = Some(r.basis);
                return Err(late_error());
            }
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
            .map_err(map_write)?;
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
