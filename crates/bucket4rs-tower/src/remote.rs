//! A shared store (feature `distributed`): any [`ProxyManager`], its backend's type erased.

use core::fmt;

use bucket4rs_distributed::{Backend, BackendErrorKind, DistributedError, ProxyManager};

use crate::plan::Plan;
use crate::store::{Answer, BoxFuture, PLAN_CHANGE, StoreError, same};

/// A shared store: the same question as in process, answered asynchronously.
pub(crate) trait Remote: Send + Sync + fmt::Debug {
    /// A verbose `try_consume_and_return_remaining(cost)` on `key`'s bucket, created under
    /// `plan` when the key has none; a bucket found under another configuration answers
    /// under it and is then switched to `plan`'s ([`PLAN_CHANGE`]). `Err` at once when the
    /// key cannot be a storage key.
    fn ask(
        &self,
        key: &str,
        plan: &Plan,
        cost: u64,
    ) -> Result<BoxFuture<Result<Answer, StoreError>>, StoreError>;

    /// Gives `tokens` back to `key`'s bucket (never above its capacity).
    fn give_back(&self, key: &str, plan: &Plan, tokens: u64) -> BoxFuture<Result<(), StoreError>>;

    /// Whether the store's circuit breaker is open.
    fn circuit_open(&self) -> bool;
}

impl<B: Backend> Remote for ProxyManager<B> {
    fn ask(
        &self,
        key: &str,
        plan: &Plan,
        cost: u64,
    ) -> Result<BoxFuture<Result<Answer, StoreError>>, StoreError> {
        let config = plan.configuration().clone();
        let supplied = config.clone();
        let bucket = self
            .builder()
            .build(key.as_bytes(), move || supplied.clone())
            .map_err(from_distributed)?;
        Ok(Box::pin(async move {
            let answer = bucket
                .as_verbose()
                .try_consume_and_return_remaining(cost)
                .await
                .map_err(from_distributed)?;
            if !same(answer.configuration(), &config) {
                // The key changed plan, or the plans did: the answer stands, and the bucket
                // follows the plan from the next request on. A failure leaves it as it was.
                if let Err(e) = bucket.replace_configuration(config, PLAN_CHANGE).await {
                    tracing::debug!(error = %e, "switching a bucket to its plan failed");
                }
            }
            Ok(answer)
        }))
    }

    fn give_back(&self, key: &str, plan: &Plan, tokens: u64) -> BoxFuture<Result<(), StoreError>> {
        let config = plan.configuration().clone();
        let bucket = self.builder().build(key.as_bytes(), move || config.clone());
        Box::pin(async move {
            let bucket = bucket.map_err(from_distributed)?;
            bucket.add_tokens(tokens).await.map_err(from_distributed)
        })
    }

    fn circuit_open(&self) -> bool {
        self.is_circuit_open()
    }
}

/// What the layer makes of a shared store's error.
pub(crate) fn from_distributed(e: DistributedError) -> StoreError {
    match e {
        DistributedError::Backend(b) if b.kind() == BackendErrorKind::CapacityExhausted => {
            StoreError::Full(Box::new(DistributedError::Backend(b)))
        }
        e if e.is_unavailable() => StoreError::Unavailable(Box::new(e)),
        DistributedError::Key(_) => StoreError::Key,
        e @ DistributedError::Format(_) => StoreError::Unreadable(Box::new(e)),
        e => StoreError::Other(Box::new(e)),
    }
}
