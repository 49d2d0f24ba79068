//! The PostgreSQL backend's statements, replies and counters.

use core::future::Future;
use core::pin::pin;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::task::Poll;
use core::time::Duration;
use std::sync::Arc;

use deadpool_postgres::PoolError;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;

use crate::error::{BackendError, BackendErrorKind};

/// TTLs beyond this are stored as "never expires" (`expires_at` NULL) rather than overflow
/// `timestamptz`.
const MAX_TTL_MICROS: u128 = 1_000 * 365 * 86_400 * 1_000_000;

/// Counters of a [`PostgresBackend`](crate::PostgresBackend).
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
    /// Expired rows deleted by [`PostgresBackend::reap_expired`](crate::PostgresBackend::reap_expired).
    pub reaped: u64,
    /// Calls that lost [`PostgresOptions::optimistic_rounds`](crate::PostgresOptions::optimistic_rounds) compare-and-sets in a row and
    /// took the row lock (`SELECT … FOR UPDATE`) instead.
    pub pessimistic: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) round_trips: AtomicU64,
    pub(super) one_round_trip: AtomicU64,
    pub(super) conflicts: AtomicU64,
    pub(super) reaped: AtomicU64,
    pub(super) pessimistic: AtomicU64,
}

/// What this process believes the row of a key is.
#[derive(Clone, Debug)]
pub(super) enum Basis {
    Absent,
    Row {
        version: i64,
        record: Vec<u8>,
        expired: bool,
    },
}

impl Basis {
    pub(super) fn live(&self) -> Option<&[u8]> {
        match self {
            Self::Row {
                record,
                expired: false,
                ..
            } => Some(record),
            _ => None,
        }
    }

    pub(super) fn same_row(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Absent, Self::Absent) => true,
            // The bytes as well as the version: a row edited by hand without a new version
            // is another row.
            (
                Self::Row {
                    version: a,
                    record: r,
                    expired: x,
                },
                Self::Row {
                    version: b,
                    record: s,
                    expired: y,
                },
            ) => a == b && x == y && r == s,
            _ => false,
        }
    }
}

pub(super) type Slot = Arc<tokio::sync::Mutex<Option<Basis>>>;

pub(super) struct Sql {
    pub(super) insert: String,
    pub(super) update: String,
    pub(super) read: String,
    pub(super) lock_read: String,
    pub(super) lock_insert: String,
    pub(super) lock_update: String,
    pub(super) remove: String,
    pub(super) reap: String,
    pub(super) migrate: String,
}

pub(super) const CLOCK_CTE: &str =
    "c AS MATERIALIZED (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS us)";
pub(super) const GUARD: &str =
    "($4::int8 IS NULL OR ($4::int8 <= c.us AND $4::int8 >= c.us - $5::int8))";
pub(super) const EXPIRES: &str =
    "CASE WHEN $3::int8 IS NULL THEN NULL ELSE now() + $3::int8 * interval '1 microsecond' END";
/// Inside an explicit transaction `now()` is the transaction's start (before a lock wait):
/// the locking fallback uses the clock itself.
pub(super) const LOCK_EXPIRES: &str = "CASE WHEN $3::int8 IS NULL THEN NULL \
     ELSE clock_timestamp() + $3::int8 * interval '1 microsecond' END";

/// `clock_timestamp()` in µs since the epoch, read where it is evaluated: in an `UPDATE`'s
/// `WHERE`, again after a wait for the row lock (PostgreSQL re-checks the row's conditions).
const CLOCK_US: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::int8";

/// The write's deadline condition: parameter `$n` (µs on the database clock, NULL: none) not
/// passed yet.
fn in_time(n: u8) -> String {
    format!("(${n}::int8 IS NULL OR {CLOCK_US} <= ${n}::int8)")
}

/// Whether the deadline `$n` has passed (the `late` column of a write that did not happen).
fn late(n: u8) -> String {
    format!("(${n}::int8 IS NOT NULL AND {CLOCK_US} > ${n}::int8)")
}

impl Sql {
    pub(super) fn new(t: &str) -> Self {
        // Result columns of every statement: version (NULL: no row), state, expired,
        // clock (µs since the epoch, `clock_timestamp()`), ok (the write happened), late (the
        // write did not happen because its deadline had passed).
        let fallback = |deadline: u8| {
            format!(
                "SELECT r.version, r.state, (r.expires_at IS NOT NULL AND r.expires_at <= now()), \
                 c.us, false, {} FROM c LEFT JOIN {t} r ON r.key = $1::text \
                 WHERE NOT EXISTS (SELECT 1 FROM w)",
                late(deadline)
            )
        };
        // Parameters: $1 key, $2 record, $3 TTL (µs), $4 the instant computed at (µs, NULL:
        // client clock), $5 its tolerance (µs), $6 the deadline (µs, database clock).
        let insert = format!(
            "WITH {CLOCK_CTE}, w AS (INSERT INTO {t} AS r (key, state, version, expires_at) \
             SELECT $1::text, $2::bytea, 1, {EXPIRES} FROM c WHERE {GUARD} AND {} \
             ON CONFLICT (key) DO NOTHING RETURNING r.version) \
             SELECT w.version, NULL::bytea, false, c.us, true, false FROM w, c UNION ALL {}",
            in_time(6),
            fallback(6)
        );
        // Parameters: as `insert` up to $5, then $6 the basis's version, $7 whether the basis
        // had expired, $8 the basis's bytes (a row edited without a new version differs), $9
        // the deadline.
        let update = format!(
            "WITH {CLOCK_CTE}, w AS (UPDATE {t} AS r SET state = $2::bytea, version = r.version + 1, \
             expires_at = {EXPIRES} FROM c WHERE r.key = $1::text AND r.version = $6::int8 \
             AND r.state = $8::bytea \
             AND ($7::bool OR r.expires_at IS NULL OR r.expires_at > now()) AND {GUARD} AND {} \
             RETURNING r.version) \
             SELECT w.version, NULL::bytea, false, c.us, true, false FROM w, c UNION ALL {}",
            in_time(9),
            fallback(9)
        );
        let read = format!(
            "WITH {CLOCK_CTE} SELECT r.version, r.state, \
             (r.expires_at IS NOT NULL AND r.expires_at <= now()), c.us, false, false \
             FROM c LEFT JOIN {t} r ON r.key = $1::text"
        );
        // The locking fallback. Columns: version (NULL: no row), state, expires_at (µs since
        // the epoch, NULL: never), clock (µs, `clock_timestamp()`). The clock is projected
        // above the join, so it is read after the row lock was granted; FOR UPDATE sits in
        // the subquery because it cannot apply to the nullable side of an outer join.
        let lock_read = format!(
            "SELECT x.version, x.state, x.exp, {CLOCK_US} \
             FROM (VALUES (1)) AS d(one) LEFT JOIN (SELECT r.version, r.state, \
             (extract(epoch FROM r.expires_at) * 1000000)::int8 AS exp \
             FROM {t} AS r WHERE r.key = $1::text FOR UPDATE) AS x ON true"
        );
        // The locked writes answer one row: the new version (NULL: nothing written) and
        // whether the deadline had passed. Parameters: $1 key, $2 record, $3 TTL (µs), $4
        // the deadline (insert) or the locked version (update, then $5 the deadline).
        let lock_insert = format!(
            "WITH w AS (INSERT INTO {t} AS r (key, state, version, expires_at) \
             SELECT $1::text, $2::bytea, 1, {LOCK_EXPIRES} WHERE {} \
             ON CONFLICT (key) DO NOTHING RETURNING r.version) \
             SELECT (SELECT version FROM w), {}",
            in_time(4),
            late(4)
        );
        let lock_update = format!(
            "WITH w AS (UPDATE {t} AS r SET state = $2::bytea, version = r.version + 1, \
             expires_at = {LOCK_EXPIRES} WHERE r.key = $1::text AND r.version = $4::int8 \
             AND {} RETURNING r.version) \
             SELECT (SELECT version FROM w), {}",
            in_time(5),
            late(5)
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

pub(super) fn map_pg(e: tokio_postgres::Error) -> BackendError {
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
        // Also a server that takes no more connections (every slot used: `53300`, which the
        // pool makes retryable: nothing was sent) and one that refuses writes (`25006`: a
        // hot standby, `default_transaction_read_only`; the statement rolled back, but a
        // retry within the call would meet the same refusal).
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::TOO_MANY_CONNECTIONS
                || *c == SqlState::READ_ONLY_SQL_TRANSACTION
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

/// An error of a statement that writes (or commits a write): one the statement itself failed
/// with rolled its transaction back ([`map_pg`]); a lost connection or a server shutting down
/// ends the session without saying whether the commit happened, so the write is in doubt.
pub(super) fn map_write(e: tokio_postgres::Error) -> BackendError {
    let lost = match e.code() {
        None => true,
        Some(c) => {
            *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || c.code().starts_with("08")
        }
    };
    if !lost {
        return map_pg(e);
    }
    BackendError::new(
        BackendErrorKind::InDoubt,
        format!(
            "the connection to PostgreSQL ended with a write in flight ({e}): it may have committed"
        ),
    )
    .with_source(e)
}

pub(super) fn map_pool(e: PoolError) -> BackendError {
    match e {
        // Nothing was sent: safe to retry.
        PoolError::Timeout(t) => BackendError::new(
            BackendErrorKind::Timeout,
            format!("no PostgreSQL connection available ({t:?} timeout)"),
        )
        .retryable(true),
        PoolError::Backend(e) => {
            // A refused certificate, a plaintext server where TLS is required: typed, and
            // not retried within the call (the same handshake would fail again).
            if let Some(tls) = super::connect::tls_cause(&e) {
                return tls.into_backend();
            }
            let mut err = map_pg(e);
            if err.kind() == BackendErrorKind::Unavailable {
                err = err.retryable(true);
            }
            err
        }
        other => BackendError::new(BackendErrorKind::Unavailable, other.to_string()),
    }
}

pub(super) fn protocol(what: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Protocol,
        format!("unexpected PostgreSQL reply: {what}"),
    )
}

/// A write refused by PostgreSQL because the call's deadline had passed on its clock: nothing
/// was written (the caller has given up, or is about to).
pub(super) fn late_error() -> BackendError {
    BackendError::new(
        BackendErrorKind::Timeout,
        "the call's deadline had passed when PostgreSQL ran its write: nothing was written",
    )
}

pub(super) struct Reply {
    pub(super) basis: Basis,
    pub(super) clock_us: i64,
    pub(super) ok: bool,
    pub(super) late: bool,
    pub(super) version: Option<i64>,
}

pub(super) fn reply(row: &Row) -> Result<Reply, BackendError> {
    let get = |e: tokio_postgres::Error| protocol(&e.to_string());
    let version: Option<i64> = row.try_get(0).map_err(get)?;
    let state: Option<Vec<u8>> = row.try_get(1).map_err(get)?;
    let expired: Option<bool> = row.try_get(2).map_err(get)?;
    let clock_us: i64 = row.try_get(3).map_err(get)?;
    let ok: bool = row.try_get(4).map_err(get)?;
    let late: bool = row.try_get(5).map_err(get)?;
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
        late,
        version,
    })
}

/// The row as `lock_read` returned it (locked when present), and the clock in µs.
pub(super) fn locked_reply(row: &Row) -> Result<(Basis, i64), BackendError> {
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
pub(super) async fn both<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let mut a = pin!(a);
    let mut b = pin!(b);
    let (mut ra, mut rb) = (None, None);
    core::future::poll_fn(|cx| {
        if ra.is_none()
            && let Poll::Ready(v) = a.as_mut().poll(cx)
        {
            ra = Some(v);
        }
        if rb.is_none()
            && let Poll::Ready(v) = b.as_mut().poll(cx)
        {
            rb = Some(v);
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
pub(super) struct TxClient {
    pub(super) client: Option<deadpool_postgres::Object>,
    pub(super) open: AtomicBool,
}

impl TxClient {
    pub(super) fn get(&self) -> Result<&deadpool_postgres::Object, BackendError> {
        self.client
            .as_ref()
            .ok_or_else(|| protocol("connection already released"))
    }

    pub(super) fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::Relaxed);
    }
}

impl Drop for TxClient {
    fn drop(&mut self) {
        if self.open.load(Ordering::Relaxed)
            && let Some(client) = self.client.take()
        {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

pub(super) fn ttl_micros(ttl: Option<Duration>) -> Option<i64> {
    let t = ttl?;
    let us = t.as_nanos().div_ceil(1_000).max(1);
    if us >= MAX_TTL_MICROS {
        None
    } else {
        i64::try_from(us).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_rounded_up_to_microseconds_and_capped() {
        assert_eq!(ttl_micros(None), None);
        assert_eq!(ttl_micros(Some(Duration::from_nanos(1))), Some(1));
        assert_eq!(ttl_micros(Some(Duration::from_nanos(1_001))), Some(2));
        assert_eq!(ttl_micros(Some(Duration::MAX)), None);
    }
}
