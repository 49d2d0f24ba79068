//! What to do when the backend cannot answer: fail, deny, or fall back to a local limit —
//! never a silent allow.

use std::sync::Arc;

use bucket4rs_core::{BucketConfiguration, ConfigError};
use bucket4rs_local::{KeyedBucket, KeyedError};

use crate::backend::Backend;
use crate::error::DistributedError;
use crate::manager::RemoteBucket;

/// The keys the fallback limit holds at most: past that, new keys are denied.
const FALLBACK_KEYS: usize = 100_000;

/// The outcome of a call guarded by a [`FailurePolicy`].
///
/// ```
/// use bucket4rs_distributed::Decision;
/// assert!(Decision::Remote(true).is_allowed());
/// assert!(Decision::Fallback(true).is_degraded());
/// assert!(!Decision::DeniedOnFailure.is_allowed());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Decision {
    /// The backend decided (`true`: consumed).
    Remote(bool),
    /// The backend was unavailable; the local fallback limit decided.
    Fallback(bool),
    /// The backend was unavailable and the policy denies.
    DeniedOnFailure,
}

impl Decision {
    /// Whether the request may proceed.
    ///
    /// ```
    /// assert!(!bucket4rs_distributed::Decision::Remote(false).is_allowed());
    /// ```
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::Remote(true) | Self::Fallback(true))
    }

    /// Whether the backend failed and the decision was made without it.
    ///
    /// ```
    /// assert!(bucket4rs_distributed::Decision::DeniedOnFailure.is_degraded());
    /// ```
    pub fn is_degraded(&self) -> bool {
        !matches!(self, Self::Remote(_))
    }
}

#[derive(Clone, Debug)]
enum Kind {
    Error,
    Deny,
    Fallback(Arc<KeyedBucket<Box<[u8]>>>),
}

/// Applies a policy when a call fails because the backend is unavailable (timeout or
/// backend error, see [`DistributedError::is_unavailable`]). Invalid arguments and corrupt
/// stored data are always returned as errors.
///
/// - [`error`](Self::error): return the error (the caller decides);
/// - [`deny`](Self::deny): refuse the request ([`Decision::DeniedOnFailure`]);
/// - [`fallback`](Self::fallback): decide with a per-key limit held in this process
///   ([`Decision::Fallback`]). Choose it as the remote limit divided by the number of
///   instances, so the fleet stays near the global limit while the backend is down.
///
/// There is deliberately no "allow everything" policy.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_distributed::{EmbeddedBackend, FailurePolicy, ProxyManager};
/// use std::time::Duration;
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let manager = ProxyManager::new(EmbeddedBackend::new());
/// let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let local = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(2, Duration::from_secs(1))?).build()?;
/// let policy = FailurePolicy::fallback(local)?;
/// let bucket = manager.builder().build("k", move || config.clone())?;
/// assert!(policy.try_consume(&bucket, 1).await?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct FailurePolicy(Kind);

impl FailurePolicy {
    /// Return the error.
    ///
    /// ```
    /// let p = bucket4rs_distributed::FailurePolicy::error();
    /// ```
    pub fn error() -> Self {
        Self(Kind::Error)
    }

    /// Deny the request.
    ///
    /// ```
    /// let p = bucket4rs_distributed::FailurePolicy::deny();
    /// ```
    pub fn deny() -> Self {
        Self(Kind::Deny)
    }

    /// Decide with a local per-key bucket of `config` (a [`KeyedBucket`] of at most 100,000
    /// keys; past that, new keys are denied).
    ///
    /// # Errors
    /// A [`ConfigError`] if `config` needs a clock the local buckets do not have.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// let local = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(2, Duration::from_secs(1))?).build()?;
    /// let p = bucket4rs_distributed::FailurePolicy::fallback(local);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fallback(config: BucketConfiguration) -> Result<Self, ConfigError> {
        let local = KeyedBucket::builder()
            .with_configuration(&config)
            .max_keys(FALLBACK_KEYS)
            .build()?;
        Ok(Self(Kind::Fallback(Arc::new(local))))
    }

    /// `bucket.try_consume(tokens)` under this policy.
    ///
    /// # Errors
    /// Errors that are not about availability; with [`error`](Self::error), every error.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, FailurePolicy, ProxyManager, Decision};
    /// # use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// # let manager = ProxyManager::new(EmbeddedBackend::new());
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
    /// let bucket = manager.builder().build("k", move || config.clone())?;
    /// assert_eq!(FailurePolicy::deny().try_consume(&bucket, 1).await?, Decision::Remote(true));
    /// assert_eq!(FailurePolicy::deny().try_consume(&bucket, 1).await?, Decision::Remote(false));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn try_consume<B: Backend>(
        &self,
        bucket: &RemoteBucket<B>,
        tokens: u64,
    ) -> Result<Decision, DistributedError> {
        match bucket.try_consume(tokens).await {
            Ok(v) => Ok(Decision::Remote(v)),
            Err(e) if e.is_unavailable() => self.on_failure(bucket.key().as_bytes(), tokens, e),
            Err(e) => Err(e),
        }
    }

    /// What the policy decides for `tokens` of `key` when the backend failed with `error`
    /// (an [unavailable](DistributedError::is_unavailable) one): the error itself, a denial,
    /// or the fallback limit's answer for `key` (denied when its key cap is full).
    ///
    /// # Errors
    /// `error`, under [`error`](Self::error); an invalid `tokens` (zero).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// use bucket4rs_distributed::{Decision, DistributedError, FailurePolicy};
    /// let local = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1, Duration::from_secs(60))?).build()?;
    /// let policy = FailurePolicy::fallback(local)?;
    /// let down = || DistributedError::Timeout { after: Duration::from_secs(1) };
    /// assert_eq!(policy.on_failure(b"client", 1, down())?, Decision::Fallback(true));
    /// assert_eq!(policy.on_failure(b"client", 1, down())?, Decision::Fallback(false));
    /// assert_eq!(FailurePolicy::deny().on_failure(b"client", 1, down())?, Decision::DeniedOnFailure);
    /// assert!(FailurePolicy::error().on_failure(b"client", 1, down()).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_failure(
        &self,
        key: &[u8],
        tokens: u64,
        error: DistributedError,
    ) -> Result<Decision, DistributedError> {
        match &self.0 {
            Kind::Error => Err(error),
            Kind::Deny => Ok(Decision::DeniedOnFailure),
            Kind::Fallback(local) => match local.try_consume(key, tokens) {
                Ok(consumed) => Ok(Decision::Fallback(consumed)),
                // The local limiter is full of keys: deny rather than allow blindly.
                Err(KeyedError::TooManyKeys { .. }) => Ok(Decision::DeniedOnFailure),
                Err(KeyedError::Operation(e)) => Err(e.into()),
                Err(_) => Ok(Decision::DeniedOnFailure),
            },
        }
    }
}
