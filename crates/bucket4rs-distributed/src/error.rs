//! Typed errors of remote buckets and backends.

use core::fmt;
use core::time::Duration;
use std::error::Error as StdError;

use bucket4rs_core::{ConfigError, OperationError, StateError};

/// Why stored bytes could not be read as a bucket record (see `docs/distributed.md`).
///
/// Every malformed input maps to one of these; decoding never panics and never returns a
/// record that was not written as such.
///
/// ```
/// use bucket4rs_distributed::{FormatError, format};
/// assert_eq!(format::decode(b"b4").unwrap_err(), FormatError::Truncated);
/// assert!(matches!(format::decode(b"xxxxxxxxxxxx"), Err(FormatError::BadMagic)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FormatError {
    /// The bytes end before the record does.
    Truncated,
    /// The bytes do not start with the record magic (`b4rs`): not a bucket record.
    BadMagic,
    /// The record was written by a newer format version than this library reads.
    UnsupportedVersion {
        /// The version found in the record.
        found: u8,
        /// The newest version this library reads.
        newest_supported: u8,
    },
    /// A field holds a value no writer produces (named by `what`).
    Invalid {
        /// The offending field.
        what: &'static str,
    },
    /// The configuration section does not match its checksum.
    ChecksumMismatch,
    /// Bytes remain after the record.
    TrailingBytes,
    /// The stored configuration is not a valid configuration.
    Config(ConfigError),
    /// The stored state does not fit the stored configuration.
    State(StateError),
    /// The storage holds something else under the key (e.g. a Redis list).
    WrongType {
        /// What the storage reported.
        found: String,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => f.write_str("stored bucket record is truncated"),
            Self::BadMagic => f.write_str("stored value is not a bucket record (bad magic)"),
            Self::UnsupportedVersion {
                found,
                newest_supported,
            } => write!(
                f,
                "stored bucket record has format version {found}; this library reads up to {newest_supported}"
            ),
            Self::Invalid { what } => write!(f, "stored bucket record has an invalid {what}"),
            Self::ChecksumMismatch => {
                f.write_str("stored bucket configuration does not match its checksum")
            }
            Self::TrailingBytes => f.write_str("stored bucket record has trailing bytes"),
            Self::Config(e) => write!(f, "stored bucket configuration is invalid: {e}"),
            Self::State(e) => write!(f, "stored bucket state is invalid: {e}"),
            Self::WrongType { found } => {
                write!(
                    f,
                    "the key holds a value of type {found}, not a bucket record"
                )
            }
        }
    }
}

impl StdError for FormatError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::Config(e) => Some(e),
            Self::State(e) => Some(e),
            _ => None,
        }
    }
}

/// Why a key cannot be used.
///
/// ```
/// use bucket4rs_distributed::{DistributedError, EmbeddedBackend, KeyError, ProxyManager};
/// let manager = ProxyManager::configure(EmbeddedBackend::new()).max_key_len(16).build()?;
/// assert!(matches!(
///     manager.storage_key([b'x'; 100]),
///     Err(DistributedError::Key(KeyError::TooLong { .. }))
/// ));
/// # Ok::<(), DistributedError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The encoded key is longer than the limit.
    TooLong {
        /// Length of the encoded storage key, in bytes.
        len: usize,
        /// The configured limit.
        max: usize,
    },
    /// The prefix is empty, too long, or contains a byte outside `[A-Za-z0-9._:/-]`.
    InvalidPrefix,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong { len, max } => {
                write!(f, "storage key of {len} bytes exceeds the limit of {max}")
            }
            Self::InvalidPrefix => f.write_str(
                "key prefix must be 1 to 64 bytes of [A-Za-z0-9._:/-] (no braces: no hash tags)",
            ),
        }
    }
}

impl StdError for KeyError {}

/// The broad class of a [`BackendError`], and with it what is known about the operation.
///
/// Every kind but two says the operation was **not applied**: the backend was not reached,
/// refused it, or rolled it back, so a failed call changed nothing. [`InDoubt`](Self::InDoubt)
/// and [`Inconsistent`](Self::Inconsistent) say it **may have been applied**
/// ([`DistributedError::is_in_doubt`]). A backend reports a failure after which its request
/// may have run (sent, then no reply) as `InDoubt`, whatever its cause.
///
/// ```
/// use bucket4rs_distributed::{BackendError, BackendErrorKind, DistributedError};
/// let e = BackendError::new(BackendErrorKind::Unavailable, "connection refused");
/// assert_eq!(e.kind(), BackendErrorKind::Unavailable);
/// assert!(!DistributedError::Backend(e).is_in_doubt());
/// let lost = BackendError::new(BackendErrorKind::InDoubt, "connection reset after sending");
/// assert!(DistributedError::Backend(lost).is_in_doubt());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The backend cannot be reached or refuses the operation (no connection, connection
    /// refused, the circuit breaker open, a read-only server): not applied.
    Unavailable,
    /// The backend did not run the operation in time: its server refused it past the caller's
    /// deadline, the deadline passed before it was sent, or a lock wait timed out and the
    /// server rolled it back. Not applied.
    Timeout,
    /// The request was sent and no reply came (the connection was lost after sending, or the
    /// reply did not arrive in time): the operation **may have been applied**.
    InDoubt,
    /// The backend answered something this library does not understand, before anything
    /// was applied.
    Protocol,
    /// An optimistic write lost against a concurrent writer (retried by the manager): not
    /// applied.
    Conflict,
    /// The key holds a value of another type (the message names it); reported to callers
    /// as [`FormatError::WrongType`]. Not applied.
    WrongType,
    /// The backend refuses new keys (e.g. the embedded backend's key cap, a full Redis): not
    /// applied.
    CapacityExhausted,
    /// The backend wrote a state that differs from the core's (a bug, reported loudly): the
    /// write happened, so the operation is in doubt.
    Inconsistent,
    /// Anything else the backend reports as not applied.
    Other,
}

/// An error reported by a [`Backend`](crate::Backend).
///
/// Opaque on purpose: it carries a kind, a message, whether the manager may retry, and an
/// optional source error, but never a driver's types in its signature.
///
/// ```
/// use bucket4rs_distributed::{BackendError, BackendErrorKind};
/// let e = BackendError::new(BackendErrorKind::Conflict, "lost a race").retryable(true);
/// assert!(e.is_retryable());
/// assert_eq!(e.to_string(), "backend error (Conflict): lost a race");
/// ```
#[derive(Debug)]
pub struct BackendError {
    kind: BackendErrorKind,
    message: String,
    retryable: bool,
    /// A refusal the call would meet again until the configuration changes (a refused TLS
    /// handshake): not retryable by the caller either ([`DistributedError::is_retryable`]).
    refused_until_fixed: bool,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl BackendError {
    /// A new error; not retryable unless [`retryable`](Self::retryable) says so.
    ///
    /// ```
    /// # use bucket4rs_distributed::{BackendError, BackendErrorKind};
    /// assert!(!BackendError::new(BackendErrorKind::Other, "x").is_retryable());
    /// ```
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retryable: false,
            refused_until_fixed: false,
            source: None,
        }
    }

    /// Marks whether retrying cannot apply the operation twice (e.g. the request was never
    /// sent, or a compare-and-set lost).
    ///
    /// ```
    /// # use bucket4rs_distributed::{BackendError, BackendErrorKind};
    /// assert!(BackendError::new(BackendErrorKind::Unavailable, "x").retryable(true).is_retryable());
    /// ```
    #[must_use]
    pub fn retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Marks a refusal that making the call again cannot pass until the configuration
    /// changes (a refused TLS handshake: a certificate the client does not trust, a host name
    /// it does not name, a plaintext server; credentials the server refuses):
    /// [`DistributedError::is_retryable`] is false for
    /// it whatever its kind.
    #[must_use]
    pub(crate) fn refused_until_fixed(mut self, refused: bool) -> Self {
        self.refused_until_fixed = refused;
        self
    }

    /// Whether [`refused_until_fixed`](Self::refused_until_fixed) marks it.
    pub(crate) fn is_refused_until_fixed(&self) -> bool {
        self.refused_until_fixed
    }

    /// Attaches the underlying error.
    ///
    /// ```
    /// # use bucket4rs_distributed::{BackendError, BackendErrorKind};
    /// use std::error::Error;
    /// let io = std::io::Error::other("boom");
    /// let e = BackendError::new(BackendErrorKind::Unavailable, "x").with_source(io);
    /// assert!(e.source().is_some());
    /// ```
    #[must_use]
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The kind.
    ///
    /// ```
    /// # use bucket4rs_distributed::{BackendError, BackendErrorKind};
    /// assert_eq!(BackendError::new(BackendErrorKind::Timeout, "x").kind(), BackendErrorKind::Timeout);
    /// ```
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// Whether the manager may retry.
    ///
    /// ```
    /// # use bucket4rs_distributed::{BackendError, BackendErrorKind};
    /// assert!(!BackendError::new(BackendErrorKind::Timeout, "x").is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The message.
    ///
    /// ```
    /// # use bucket4rs_distributed::{BackendError, BackendErrorKind};
    /// assert_eq!(BackendError::new(BackendErrorKind::Other, "hi").message(), "hi");
    /// ```
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend error ({:?}): {}", self.kind, self.message)
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// The error of every remote-bucket call.
///
/// Being rate-limited is not an error (it is a `false`, a probe, …); these are invalid
/// arguments, bad stored data and backend failures.
///
/// Every error says what became of the call:
///
/// - **not applied** — nothing changed: it was rejected before it was sent (invalid
///   arguments, a key too long, an open circuit breaker, a timeout while queued), the backend
///   was not reached or refused it (its server refused it past the caller's deadline, a
///   read-only server, a lost compare-and-set), or the stored data could not be read.
///   [`is_retryable`](Self::is_retryable) says which of these may pass if the call is made
///   again (the backend unavailable, busy or late, a lost race).
/// - **in doubt** ([`is_in_doubt`](Self::is_in_doubt)) — the request was sent and no reply
///   came back (the connection was lost after sending, no reply within the timeout): the
///   backend may have applied it. The kind is [`BackendErrorKind::InDoubt`] (or
///   [`BackendErrorKind::Inconsistent`], a write the core disagrees with).
///
/// ```
/// use bucket4rs_distributed::{DistributedError, ProxyManager, EmbeddedBackend};
/// use bucket4rs_core::{Bandwidth, BucketConfiguration, OperationError};
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let manager = ProxyManager::new(EmbeddedBackend::new());
/// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?).build()?;
/// let bucket = manager.builder().build("k", move || config.clone())?;
/// let err = bucket.try_consume(0).await.unwrap_err();
/// assert_eq!(err, DistributedError::Operation(OperationError::ZeroTokens));
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum DistributedError {
    /// Invalid arguments (checked before any round trip) or a refused reservation.
    Operation(OperationError),
    /// The supplied or replacement configuration is invalid (or needs a wall clock).
    Config(ConfigError),
    /// The key cannot be stored.
    Key(KeyError),
    /// The stored bytes are not a readable bucket record.
    Format(FormatError),
    /// The call did not complete within the configured timeout before anything of it was
    /// sent (it was queued behind its key's batch in flight, or waited for a connection), or
    /// a read timed out: not applied. A call that timed out with its request in flight fails
    /// with a [`BackendErrorKind::InDoubt`] backend error instead.
    Timeout {
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The backend failed (after the bounded retries, when the failure was retryable).
    Backend(BackendError),
    /// A blocking call was made where it cannot block (inside an async context, or on a
    /// current-thread runtime that would never make progress).
    Blocking(&'static str),
    /// A manager setting that can only break things, refused by
    /// [`ManagerBuilder::build`](crate::ManagerBuilder::build).
    InvalidSetting {
        /// The builder method of the setting.
        setting: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl PartialEq for DistributedError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Operation(a), Self::Operation(b)) => a == b,
            (Self::Config(a), Self::Config(b)) => a == b,
            (Self::Key(a), Self::Key(b)) => a == b,
            (Self::Format(a), Self::Format(b)) => a == b,
            (Self::Timeout { after: a }, Self::Timeout { after: b }) => a == b,
            (Self::Backend(a), Self::Backend(b)) => a.kind == b.kind && a.message == b.message,
            (Self::Blocking(a), Self::Blocking(b)) => a == b,
            (
                Self::InvalidSetting {
                    setting: a,
                    reason: r,
                },
                Self::InvalidSetting {
                    setting: b,
                    reason: q,
                },
            ) => a == b && r == q,
            _ => false,
        }
    }
}

impl DistributedError {
    /// Whether this is a failure of the infrastructure (timeout or backend error) rather
    /// than of the caller's input or the stored data: what a failure policy (the HTTP
    /// layer's `FailurePolicy`, say) acts on. A call refused by an open [`CircuitBreaker`](crate::CircuitBreaker) is one
    /// (a [`BackendErrorKind::Unavailable`] backend error).
    ///
    /// ```
    /// # use bucket4rs_distributed::DistributedError; use std::time::Duration;
    /// assert!(DistributedError::Timeout { after: Duration::from_millis(5) }.is_unavailable());
    /// ```
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::Backend(_))
    }

    /// Whether the call may have been applied although it failed: its request was sent and no
    /// reply came ([`BackendErrorKind::InDoubt`]), or the backend wrote a state the core
    /// disagrees with ([`BackendErrorKind::Inconsistent`]). Every other error means the call
    /// changed nothing.
    ///
    /// ```
    /// use bucket4rs_distributed::{BackendError, BackendErrorKind, DistributedError};
    /// let lost = DistributedError::Backend(BackendError::new(BackendErrorKind::InDoubt, "reset by peer"));
    /// assert!(lost.is_in_doubt() && !lost.is_retryable());
    /// let refused = DistributedError::Backend(BackendError::new(BackendErrorKind::Unavailable, "refused"));
    /// assert!(!refused.is_in_doubt() && refused.is_retryable());
    /// ```
    pub fn is_in_doubt(&self) -> bool {
        matches!(
            self,
            Self::Backend(e) if matches!(
                e.kind(),
                BackendErrorKind::InDoubt | BackendErrorKind::Inconsistent
            )
        )
    }

    /// Whether the call was not applied and may succeed if made again: a timeout before it
    /// was sent, or a backend that was unavailable, refused it past its deadline, or lost a
    /// race ([`BackendErrorKind::Unavailable`], [`BackendErrorKind::Timeout`],
    /// [`BackendErrorKind::Conflict`]). In-doubt errors, invalid input and unreadable records
    /// are not, and neither is a refused TLS handshake (an `Unavailable` whose
    /// [`source`](StdError::source) is a `TlsError`: an untrusted certificate, a host name
    /// mismatch, a plaintext server) or refused credentials (a wrong Redis password or user),
    /// which fail the same way until the certificates, the credentials or the URL change —
    /// the backend's own verdict, kept by the manager for every caller of the call's batch.
    ///
    /// ```
    /// # use bucket4rs_distributed::DistributedError; use std::time::Duration;
    /// assert!(DistributedError::Timeout { after: Duration::from_millis(5) }.is_retryable());
    /// let invalid = DistributedError::Operation(bucket4rs_core::OperationError::ZeroTokens);
    /// assert!(!invalid.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Timeout { .. } => true,
            Self::Backend(e) => {
                !e.is_refused_until_fixed()
                    && matches!(
                        e.kind(),
                        BackendErrorKind::Unavailable
                            | BackendErrorKind::Timeout
                            | BackendErrorKind::Conflict
                    )
            }
            _ => false,
        }
    }
}

impl fmt::Display for DistributedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Operation(e) => write!(f, "{e}"),
            Self::Config(e) => write!(f, "{e}"),
            Self::Key(e) => write!(f, "{e}"),
            Self::Format(e) => write!(f, "{e}"),
            Self::Timeout { after } => write!(f, "the backend call timed out after {after:?}"),
            Self::Backend(e) => write!(f, "{e}"),
            Self::Blocking(why) => write!(f, "cannot block here: {why}"),
            Self::InvalidSetting { setting, reason } => {
                write!(f, "invalid manager setting `{setting}`: {reason}")
            }
        }
    }
}

impl StdError for DistributedError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::Operation(e) => Some(e),
            Self::Config(e) => Some(e),
            Self::Key(e) => Some(e),
            Self::Format(e) => Some(e),
            Self::Backend(e) => Some(e),
            Self::Timeout { .. } | Self::Blocking(_) | Self::InvalidSetting { .. } => None,
        }
    }
}

impl From<OperationError> for DistributedError {
    fn from(e: OperationError) -> Self {
        Self::Operation(e)
    }
}
impl From<ConfigError> for DistributedError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}
impl From<KeyError> for DistributedError {
    fn from(e: KeyError) -> Self {
        Self::Key(e)
    }
}
impl From<FormatError> for DistributedError {
    fn from(e: FormatError) -> Self {
        Self::Format(e)
    }
}
impl From<BackendError> for DistributedError {
    fn from(e: BackendError) -> Self {
        Self::Backend(e)
    }
}
