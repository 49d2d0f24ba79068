//! The PostgreSQL backend's settings: the table name, timeouts, pool and cache sizes.

use core::fmt;
use core::time::Duration;

use crate::tls::TlsOptions;

/// Longest table (or schema) name accepted: PostgreSQL's `NAMEDATALEN - 1`.
const MAX_IDENT: usize = 63;

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

pub(super) fn check_ident(part: &str) -> Result<(), InvalidTableName> {
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
pub(super) fn quote_table(name: &str) -> Result<String, InvalidTableName> {
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

/// Settings of a [`PostgresBackend`](crate::PostgresBackend).
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
    pub(super) table: String,
    pub(super) quoted: String,
    pub(super) max_connections: usize,
    pub(super) connect_timeout: Duration,
    pub(super) wait_timeout: Duration,
    pub(super) statement_timeout: Duration,
    pub(super) lock_timeout: Duration,
    pub(super) clock_tolerance: Duration,
    pub(super) cache_capacity: usize,
    pub(super) rounds: u32,
    pub(super) ssl_mode: Option<SslMode>,
    pub(super) tls: TlsOptions,
}

/// Whether and how a PostgreSQL connection uses TLS: libpq's `sslmode`, read from the URL
/// (`?sslmode=verify-full`) or set with [`PostgresOptions::ssl_mode`].
///
/// A server without TLS where TLS is required, a certificate that does not verify or a host
/// name that does not match is a typed [`TlsError`](crate::TlsError), never a fall-back to
/// plaintext.
///
/// ```
/// use bucket4rs_distributed::{PostgresOptions, SslMode};
/// assert_eq!("verify-full".parse::<SslMode>(), Ok(SslMode::VerifyFull));
/// let o = PostgresOptions::default().ssl_mode(SslMode::VerifyCa);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SslMode {
    /// Plaintext only.
    Disable,
    /// TLS if the server offers it, else plaintext; the certificate is not checked (libpq's
    /// default, and the default here).
    Prefer,
    /// TLS, or no connection; the certificate is not checked, unless a private CA is given
    /// ([`TlsOptions::ca_file`] or the URL's `sslrootcert`): then as [`VerifyCa`](Self::VerifyCa)
    /// (as libpq does with a root certificate).
    Require,
    /// TLS with a certificate signed by a trusted CA; the host name is not checked.
    VerifyCa,
    /// TLS with a certificate signed by a trusted CA and valid for the host name.
    VerifyFull,
}

impl core::str::FromStr for SslMode {
    type Err = String;

    /// libpq's names: `disable`, `prefer`, `require`, `verify-ca`, `verify-full`.
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode {other:?}: expected disable, prefer, require, verify-ca or verify-full"
                ));
            }
        })
    }
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
            ssl_mode: None,
            tls: TlsOptions::default(),
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

    /// The TLS mode, over the URL's or the configuration's `sslmode` (default: the URL's, or
    /// [`SslMode::Prefer`]).
    ///
    /// ```
    /// # use bucket4rs_distributed::{PostgresOptions, SslMode};
    /// let o = PostgresOptions::default().ssl_mode(SslMode::VerifyFull);
    /// ```
    pub fn ssl_mode(mut self, mode: SslMode) -> Self {
        self.ssl_mode = Some(mode);
        self
    }

    /// The certificates of a TLS connection: private CAs trusted besides the platform's roots
    /// (also the URL's `sslrootcert`), a client certificate for mutual TLS (also the URL's
    /// `sslcert` and `sslkey`).
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{PostgresOptions, TlsOptions};
    /// let o = PostgresOptions::default().tls(TlsOptions::default().ca_file("ca.pem")?);
    /// # Ok::<(), bucket4rs_distributed::TlsError>(())
    /// ```
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = tls;
        self
    }

    pub(super) fn session_options(&self) -> String {
        let ms = |d: Duration| d.as_millis().clamp(1, i32::MAX as u128);
        format!(
            "-c lock_timeout={} -c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            ms(self.lock_timeout),
            ms(self.statement_timeout),
            ms(self.statement_timeout.saturating_mul(4)),
        )
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
}
