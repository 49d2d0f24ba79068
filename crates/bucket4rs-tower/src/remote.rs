//! A shared store (feature `distributed`): any [`ProxyManager`], its backend's type erased.

use core::fmt;

use bucket4rs_core::ops::TryConsumeAndReturnRemaining;
use bucket4rs_core::{BucketConfiguration, VerboseResult};
use bucket4rs_distributed::{
    Backend, BackendErrorKind, DistributedError, ProxyManager, RemoteBucket,
};

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

    /// What [`ask`](Self::ask) would answer, taking nothing: the bucket read (from its lease's
    /// view, without a round trip, when it leases), and the consumption computed on what was
    /// read. For a request another limit refused, so that a leased bucket is not charged and
    /// then given tokens back (a round trip that ends its lease).
    fn look(
        &self,
        key: &str,
        plan: &Plan,
        cost: u64,
    ) -> Result<BoxFuture<Result<Answer, StoreError>>, StoreError>;

    /// Gives `tokens` back to `key`'s bucket (never above its capacity).
    fn give_back(&self, key: &str, plan: &Plan, tokens: u64) -> BoxFuture<Result<(), StoreError>>;

    /// Whether the buckets of `plan` lease: the plan's leasing, else the manager's.
    fn leases(&self, plan: &Plan) -> bool;

    /// Ends every lease and gives its unused tokens back ([`ProxyManager::release_leases`]).
    fn release_leases(&self) -> BoxFuture<Result<(), DistributedError>>;

    /// Whether the store's circuit breaker is open.
    fn circuit_open(&self) -> bool;
}

/// `key`'s bucket under `plan`, leasing as the plan says (else as the manager does).
fn bucket<B: Backend>(
    manager: &ProxyManager<B>,
    key: &str,
    plan: &Plan,
) -> Result<RemoteBucket<B>, DistributedError> {
    let config = plan.configuration().clone();
    let mut builder = manager.builder();
    if let Some(leasing) = plan.leasing() {
        builder = builder.leasing(Some(leasing));
    }
    builder.build(key.as_bytes(), move || config.clone())
}

/// After an answer under another configuration than `plan`'s (the key changed plan, or the
/// plans did): the answer stands, and the bucket follows the plan from the next request on.
/// A failure leaves it as it was.
async fn follow<B: Backend>(bucket: &RemoteBucket<B>, plan: BucketConfiguration, answer: &Answer) {
    if !same(answer.configuration(), &plan)
        && let Err(e) = bucket.replace_configuration(plan, PLAN_CHANGE).await
    {
        tracing::debug!(error = %e, "switching a bucket to its plan failed");
    }
}

impl<B: Backend> Remote for ProxyManager<B> {
    fn ask(
        &self,
        key: &str,
        plan: &Plan,
        cost: u64,
    ) -> Result<BoxFuture<Result<Answer, StoreError>>, StoreError> {
        let config = plan.configuration().clone();
        let bucket = bucket(self, key, plan).map_err(from_distributed)?;
        Ok(Box::pin(async move {
            let answer = bucket
                .as_verbose()
                .try_consume_and_return_remaining(cost)
                .await
                .map_err(from_distributed)?;
            follow(&bucket, config, &answer).await;
            Ok(answer)
        }))
    }

    fn look(
        &self,
        key: &str,
        plan: &Plan,
        cost: u64,
    ) -> Result<BoxFuture<Result<Answer, StoreError>>, StoreError> {
        let config = plan.configuration().clone();
        let bucket = bucket(self, key, plan).map_err(from_distributed)?;
        Ok(Box::pin(async move {
            let read = bucket
                .as_verbose()
                .available_tokens()
                .await
                .map_err(from_distributed)?;
            let answer = as_if_consumed(&read, cost)?;
            follow(&bucket, config, &answer).await;
            Ok(answer)
        }))
    }

    fn give_back(&self, key: &str, plan: &Plan, tokens: u64) -> BoxFuture<Result<(), StoreError>> {
        let bucket = bucket(self, key, plan);
        Box::pin(async move {
            let bucket = bucket.map_err(from_distributed)?;
            bucket.add_tokens(tokens).await.map_err(from_distributed)
        })
    }

    fn leases(&self, plan: &Plan) -> bool {
        plan.leasing().or_else(|| self.leasing()).is_some()
    }

    fn release_leases(&self) -> BoxFuture<Result<(), DistributedError>> {
        let manager = self.clone();
        Box::pin(async move { manager.release_leases().await })
    }

    fn circuit_open(&self) -> bool {
        self.is_circuit_open()
    }
}

/// The answer a consumption of `cost` would have given on the bucket `read` describes: the
/// core's operation on the state read, at its reading (what the store runs on a consumption).
fn as_if_consumed<T>(read: &VerboseResult<T>, cost: u64) -> Result<Answer, StoreError> {
    let config = read.configuration().clone();
    let mut state = read.state().clone();
    let probe = state
        .apply(
            &config,
            read.now_nanos(),
            &TryConsumeAndReturnRemaining(cost),
        )
        .map_err(|e| StoreError::Unreadable(Box::new(e)))?;
    Ok(VerboseResult::new(probe, config, state, read.now_nanos()))
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
