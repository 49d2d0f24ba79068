//! What to do when the backend cannot answer: fail, deny, or fall back to a local limit —
//! never a silent allow.

use bucket4rs_core::BucketConfiguration;

use crate::backend::Backend;
use crate::embedded::EmbeddedBackend;
use crate::error::DistributedError;
use crate::manager::{ProxyManager, RemoteBucket};

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
    Fallback {
        manager: ProxyManager<EmbeddedBackend>,
        config: BucketConfiguration,
    },
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
/// let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(10, Duration::from_secs(1))?).build()?;
/// let local = BucketConfiguration::builder().add_limit(Bandwidth::simple(2, Duration::from_secs(1))?).build()?;
/// let policy = FailurePolicy::fallback(local);
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

    /// Decide with a local per-key bucket of `config` (at most 100 000 keys in memory; past
    /// that, new keys are denied).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// let local = BucketConfiguration::builder().add_limit(Bandwidth::simple(2, Duration::from_secs(1))?).build()?;
    /// let p = bucket4rs_distributed::FailurePolicy::fallback(local);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fallback(config: BucketConfiguration) -> Self {
        Self(Kind::Fallback {
            manager: ProxyManager::new(EmbeddedBackend::new().with_max_keys(100_000)),
            config,
        })
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
    /// # let config = BucketConfiguration::builder().add_limit(Bandwidth::simple(1, Duration::from_secs(1))?).build()?;
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
            Err(e) if !e.is_unavailable() => Err(e),
            Err(e) => match &self.0 {
                Kind::Error => Err(e),
                Kind::Deny => Ok(Decision::DeniedOnFailure),
                Kind::Fallback { manager, config } => {
                    let c = config.clone();
                    let local = manager
                        .builder()
                        .build(bucket.key().as_bytes(), move || c.clone())?;
                    match local.try_consume(tokens).await {
                        Ok(v) => Ok(Decision::Fallback(v)),
                        // The local limiter is full of keys: deny rather than allow blindly.
                        Err(e2) if e2.is_unavailable() => Ok(Decision::DeniedOnFailure),
                        Err(e2) => Err(e2),
                    }
                }
            },
        }
    }
}
