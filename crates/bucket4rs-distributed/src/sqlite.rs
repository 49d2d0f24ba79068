//! The SQLite backend: one file on this machine, shared exactly by every process that opens
//! it, kept across restarts. Written against the public [`Backend`] trait only, as a backend
//! of your own would be (`docs/custom-backend.md` walks through it).

use core::fmt;
use core::time::Duration;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Instant;

use async_trait::async_trait;
use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};
use tokio::sync::oneshot;

use crate::backend::{Backend, BackendClock, Transaction, Write};
use crate::error::{BackendError, BackendErrorKind};
use crate::key::StorageKey;
use crate::reaper::Reaper;

/// The schema: one row per key, the record and when it expires (Unix nanoseconds; `NULL`:
/// never). `WITHOUT ROWID`: the key is the table's own order.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bucket4rs (
    key TEXT PRIMARY KEY NOT NULL,
    record BLOB NOT NULL,
    expires_at INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS bucket4rs_expires_at ON bucket4rs (expires_at)
    WHERE expires_at IS NOT NULL;";

/// Settings of a [`SqliteBackend`].
///
/// ```
/// use bucket4rs_distributed::SqliteOptions;
/// use std::time::Duration;
/// let options = SqliteOptions::default().busy_timeout(Duration::from_millis(500));
/// # drop(options);
/// ```
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(1),
        }
    }
}

impl SqliteOptions {
    /// How long an operation waits for another process's write to finish before it fails
    /// with a retryable [`BackendErrorKind::Timeout`] (default 1 s; SQLite's `busy_timeout`).
    /// Nothing is written by an operation that gave up.
    ///
    /// ```
    /// # use bucket4rs_distributed::SqliteOptions; use std::time::Duration;
    /// let options = SqliteOptions::default().busy_timeout(Duration::from_millis(200));
    /// # drop(options);
    /// ```
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }
}

/// Work for the backend's thread.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Buckets in one SQLite file on this machine: for a service on one machine whose limits must
/// survive a restart (a daily quota is not handed out afresh by a deploy), and for several
/// processes on the machine sharing one limit exactly.
///
/// - **One transaction per operation**: `BEGIN IMMEDIATE` (the file's write lock), read the
///   key's row, [`Transaction::apply`], write, `COMMIT`. Several processes on one file are
///   serialised by SQLite's lock, so every limit is exact across them.
/// - **Durable**: WAL journal, `synchronous = FULL` (every commit is on disk before the call
///   returns), so a crash or a power cut loses no charge.
/// - **Async callers never wait on its I/O**: each backend owns a thread with its connection;
///   calls hand it their work and await the answer (clones share the thread). A call whose
///   future is dropped mid-way is rolled back.
/// - **Deadlines**: a call is refused, and writes nothing, once its caller's deadline has
///   passed (checked when the lock is taken and again before the commit).
/// - **Locked, busy or damaged files** give typed errors and change nothing: another
///   process's write held longer than [`SqliteOptions::busy_timeout`] is a retryable
///   [`BackendErrorKind::Timeout`]; a file that is not a database, or a damaged one,
///   [`BackendErrorKind::Protocol`]; a file that cannot be opened or written,
///   [`BackendErrorKind::Unavailable`].
/// - **Time**: the machine's wall clock, read under the lock ([`BackendClock::WallClock`]),
///   so every process computes on one timeline.
/// - **Expiry**: each row carries its expiry; an expired row reads as absent; delete them with
///   [`reap_expired`](Self::reap_expired) or [`spawn_reaper`](Self::spawn_reaper).
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_distributed::{ProxyManager, SqliteBackend, SqliteOptions};
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// # let dir = std::env::temp_dir().join(format!("b4rs-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let backend = SqliteBackend::open(dir.join("limits.db"), SqliteOptions::default()).await?;
/// let manager = ProxyManager::new(backend);
/// let config = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::simple(1_000, Duration::from_secs(86_400))?) // 1000 a day
///     .build()?;
/// let bucket = manager.builder().build("tenant-1", move || config.clone())?;
/// assert!(bucket.try_consume(1).await?);
/// # drop((bucket, manager)); std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct SqliteBackend {
    inner: Arc<Inner>,
}

struct Inner {
    jobs: mpsc::Sender<Job>,
    path: PathBuf,
    options: SqliteOptions,
}

impl fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("path", &self.inner.path)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// The machine's wall clock in nanoseconds since the Unix epoch.
fn wall_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A driver error as a backend error. Nothing was written by a statement that failed.
fn map(e: rusqlite::Error) -> BackendError {
    let kind = match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            return BackendError::new(
                BackendErrorKind::Timeout,
                format!("the SQLite file is locked by another writer: {e}"),
            )
            .retryable(true);
        }
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => BackendErrorKind::Protocol,
        Some(
            ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::FileLockingProtocolFailed,
        ) => BackendErrorKind::Unavailable,
        _ => BackendErrorKind::Other,
    };
    BackendError::new(kind, format!("SQLite: {e}")).with_source(e)
}

fn past_deadline() -> BackendError {
    BackendError::new(
        BackendErrorKind::Timeout,
        "the caller's deadline passed before the SQLite write",
    )
}

fn thread_gone() -> BackendError {
    BackendError::new(
        BackendErrorKind::Unavailable,
        "the SQLite thread has stopped",
    )
}

/// Opens `path` with the schema in place, in WAL mode. A file already set up is only read
/// (in WAL mode readers never wait for writers), so opening it while other processes write
/// does not queue for the write lock.
fn connect(path: &Path, options: &SqliteOptions) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(options.busy_timeout)?;
    // The first statements read the file: a file that is not a database fails here.
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(format!("journal mode {mode}, not WAL")),
            ));
        }
    }
    conn.execute_batch("PRAGMA synchronous = FULL;")?;
    let ready: bool = conn.query_row(
        "SELECT count(*) = 2 FROM sqlite_master WHERE name IN ('bucket4rs', 'bucket4rs_expires_at')",
        [],
        |r| r.get(0),
    )?;
    if !ready {
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} COMMIT;"))?;
    }
    Ok(conn)
}

/// The row of `key` if it has not expired at `now`.
fn live_record(conn: &Connection, key: &str, now: i64) -> Result<Option<Vec<u8>>, rusqlite::Error> {
    conn.query_row(
        "SELECT record FROM bucket4rs WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)",
        params![key, now],
        |r| r.get(0),
    )
    .optional()
}

/// What the caller decided to write (`None`: nothing) and when it must be committed by.
type Decision = Option<(Vec<u8>, Option<Duration>)>;

impl SqliteBackend {
    /// Opens (or creates) the database file at `path`, in WAL mode with the schema in place,
    /// on a thread of its own.
    ///
    /// # Errors
    /// [`BackendErrorKind::Protocol`] for a file that is not a database (it is left as it
    /// is); [`BackendErrorKind::Unavailable`] when it cannot be opened; a retryable
    /// [`BackendErrorKind::Timeout`] when another process holds it locked for longer than the
    /// busy timeout.
    ///
    /// ```
    /// # use bucket4rs_distributed::{BackendErrorKind, SqliteBackend, SqliteOptions};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// let not_a_database = std::env::temp_dir().join(format!("b4rs-doc-{}.txt", std::process::id()));
    /// std::fs::write(&not_a_database, b"hello, this is not a database file")?;
    /// let err = SqliteBackend::open(&not_a_database, SqliteOptions::default()).await.unwrap_err();
    /// assert_eq!(err.kind(), BackendErrorKind::Protocol);
    /// # std::fs::remove_file(&not_a_database)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn open(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, BackendError> {
        let path = path.as_ref().to_path_buf();
        let (jobs, queue) = mpsc::channel::<Job>();
        let (opened, ready) = oneshot::channel();
        let (p, o) = (path.clone(), options.clone());
        std::thread::Builder::new()
            .name("bucket4rs-sqlite".into())
            .spawn(move || {
                let mut conn = match connect(&p, &o) {
                    Ok(c) => {
                        let _ = opened.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = opened.send(Err(map(e)));
                        return;
                    }
                };
                // Until every handle on the backend is dropped.
                while let Ok(job) = queue.recv() {
                    job(&mut conn);
                }
            })
            .map_err(|e| {
                BackendError::new(BackendErrorKind::Other, "cannot start the SQLite thread")
                    .with_source(e)
            })?;
        ready.await.map_err(|_| thread_gone())??;
        Ok(Self {
            inner: Arc::new(Inner {
                jobs,
                path,
                options,
            }),
        })
    }

    /// Runs `f` on the backend's thread; its answer.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, BackendError> + Send + 'static,
    ) -> Result<T, BackendError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .jobs
            .send(Box::new(move |conn| {
                let _ = reply.send(f(conn));
            }))
            .map_err(|_| thread_gone())?;
        answer.await.map_err(|_| thread_gone())?
    }

    /// Deletes up to `limit` expired rows; how many.
    ///
    /// # Errors
    /// A [`BackendError`] (nothing deleted).
    ///
    /// ```
    /// # use bucket4rs_distributed::{SqliteBackend, SqliteOptions};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let path = std::env::temp_dir().join(format!("b4rs-doc-reap-{}.db", std::process::id()));
    /// let backend = SqliteBackend::open(&path, SqliteOptions::default()).await?;
    /// assert_eq!(backend.reap_expired(1_000).await?, 0);
    /// # drop(backend); for ext in ["", "-wal", "-shm"] { let _ = std::fs::remove_file(format!("{}{ext}", path.display())); }
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn reap_expired(&self, limit: u32) -> Result<u64, BackendError> {
        self.run(move |conn| {
            let n = conn
                .execute(
                    "DELETE FROM bucket4rs WHERE key IN (SELECT key FROM bucket4rs \
                     WHERE expires_at <= ?1 LIMIT ?2)",
                    params![wall_nanos(), limit],
                )
                .map_err(map)?;
            Ok(n as u64)
        })
        .await
    }

    /// Runs [`reap_expired`](Self::reap_expired) every `every` on the current tokio runtime,
    /// `batch` rows at a time, until the returned [`Reaper`] is dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{SqliteBackend, SqliteOptions}; use std::time::Duration;
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = SqliteBackend::open("limits.db", SqliteOptions::default()).await?;
    /// let _reaper = backend.spawn_reaper(Duration::from_secs(60), 1_000);
    /// # Ok(()) }
    /// ```
    pub fn spawn_reaper(&self, every: Duration, batch: u32) -> Reaper {
        let backend = self.clone();
        Reaper::new(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                // A failed round (a busy file) is retried at the next tick.
                let _ = backend.reap_expired(batch).await;
            }
        }))
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        let key = key.as_str().to_owned();
        let deadline = tx.deadline();
        let busy = self.inner.options.busy_timeout;
        let (read_tx, read) = oneshot::channel::<Result<(Option<Vec<u8>>, i64), BackendError>>();
        let (decide, decision) = mpsc::sync_channel::<Decision>(1);
        let (done_tx, done) = oneshot::channel::<Result<(), BackendError>>();
        // On the thread: lock, read, hand the record to the caller, wait for its decision,
        // write and commit. Whatever goes wrong in between rolls back.
        let job: Job = Box::new(move |conn| {
            let expired = |d: Option<Instant>| d.is_some_and(|d| Instant::now() >= d);
            if expired(deadline) {
                let _ = read_tx.send(Err(past_deadline()));
                return;
            }
            let sql = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
                Ok(t) => t,
                Err(e) => {
                    let _ = read_tx.send(Err(map(e)));
                    return;
                }
            };
            let now = wall_nanos();
            match live_record(&sql, &key, now) {
                Ok(current) => {
                    if read_tx.send(Ok((current, now))).is_err() {
                        return; // the caller is gone: roll back
                    }
                }
                Err(e) => {
                    let _ = read_tx.send(Err(map(e)));
                    return;
                }
            }
            // The caller computes in microseconds; it may not hold the lock for longer than
            // its deadline (or, without one, the busy timeout other writers wait).
            let wait = deadline.map_or(busy, |d| d.saturating_duration_since(Instant::now()));
            let Ok(decided) = decision.recv_timeout(wait) else {
                let _ = done_tx.send(Err(past_deadline()));
                return;
            };
            let result = (|| {
                if let Some((record, ttl)) = decided {
                    let expires_at = ttl
                        .and_then(|t| i64::try_from(t.as_nanos()).ok())
                        .and_then(|t| now.checked_add(t));
                    sql.execute(
                        "INSERT INTO bucket4rs (key, record, expires_at) VALUES (?1, ?2, ?3) \
                         ON CONFLICT (key) DO UPDATE SET record = excluded.record, \
                         expires_at = excluded.expires_at",
                        params![key, record, expires_at],
                    )
                    .map_err(map)?;
                    if expired(deadline) {
                        return Err(past_deadline());
                    }
                    sql.commit().map_err(map)
                } else {
                    Ok(())
                }
            })();
            let _ = done_tx.send(result);
        });
        self.inner.jobs.send(job).map_err(|_| thread_gone())?;
        let (current, now) = read.await.map_err(|_| thread_gone())??;
        let backend_now = tx.needs_backend_clock().then_some(now);
        let decided = match tx.apply(current.as_deref(), backend_now) {
            Write::Put { record, ttl } => Some((record, ttl)),
            _ => None,
        };
        decide.send(decided).map_err(|_| thread_gone())?;
        done.await.map_err(|_| thread_gone())?
    }

    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        let key = key.as_str().to_owned();
        self.run(move |conn| live_record(conn, &key, wall_nanos()).map_err(map))
            .await
    }

    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        let key = key.as_str().to_owned();
        self.run(move |conn| {
            let live: Option<Option<i64>> = conn
                .query_row(
                    "DELETE FROM bucket4rs WHERE key = ?1 RETURNING expires_at",
                    params![key],
                    |r| r.get(0),
                )
                .optional()
                .map_err(map)?;
            Ok(live.is_some_and(|at| at.is_none_or(|at| at > wall_nanos())))
        })
        .await
    }

    fn clock(&self) -> BackendClock {
        BackendClock::WallClock
    }
}
