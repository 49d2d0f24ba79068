//! Where the layer's buckets live, and the one question a request asks there.
//!
//! Both stores answer the same question the same way: a verbose
//! `try_consume_and_return_remaining(cost)` on the key's bucket — in this process on a
//! [`KeyedBucket`]'s verbose view (the default), in a shared store on a
//! [`RemoteBucket`](bucket4rs_distributed::RemoteBucket)'s (feature `distributed`). The
//! answer ([`Answer`]) is the core's probe with the configuration the bucket decided under,
//! the state it left and the reading; `response::verdict` turns it into the response. A
//! bucket found under another configuration than its key's plan (the key changed plan, or
//! the plans did) answers under the configuration it has, and is then switched to the plan's,
//! its tokens carried over ([`PLAN_CHANGE`]): in both stores alike.

use core::fmt;
use std::sync::Arc;

use bucket4rs_core::{
    BucketConfiguration, Clock, ConsumptionProbe, TokensInheritanceStrategy, Verbose, VerboseResult,
};
use bucket4rs_local::{DefaultHasher, KeyedBucket, KeyedError};

use crate::plan::Plan;

/// The clock of the layer's in-process buckets.
pub(crate) type SharedClock = Arc<dyn Clock + Send + Sync>;

/// The layer's in-process store: a bucket per client key.
pub type LocalStore = KeyedBucket<String, SharedClock>;

/// The in-process store's verbose view (the same buckets).
pub(crate) type VerboseStore =
    KeyedBucket<String, SharedClock, bucket4rs_core::NoopListener, DefaultHasher, Verbose>;

/// A store's answer to a request: `try_consume_and_return_remaining(cost)`, verbose.
pub(crate) type Answer = VerboseResult<ConsumptionProbe>;

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = core::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// How a bucket found under another configuration is switched to its key's current plan: its
/// tokens are carried over as they are.
pub(crate) const PLAN_CHANGE: TokensInheritanceStrategy = TokensInheritanceStrategy::AsIs;

/// Where the layer's buckets are. One per layer, built once and held in the layer's `Arc`.
pub(crate) enum Store {
    /// In this process.
    Local(Local),
    /// Behind a proxy manager (the backend's type erased).
    #[cfg(feature = "distributed")]
    Remote(Box<dyn crate::remote::Remote>),
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(local) => f.debug_tuple("Local").field(&local.plain.len()).finish(),
            #[cfg(feature = "distributed")]
            Self::Remote(remote) => f.debug_tuple("Remote").field(remote).finish(),
        }
    }
}

/// Buckets in this process: a keyed bucket, and its verbose view (made once, not per
/// request).
pub(crate) struct Local {
    pub(crate) plain: LocalStore,
    verbose: VerboseStore,
}

impl Local {
    /// The in-process store over `keyed`.
    pub(crate) fn new(keyed: LocalStore) -> Self {
        Self {
            verbose: keyed.as_verbose(),
            plain: keyed,
        }
    }

    /// The question: a verbose `try_consume_and_return_remaining(cost)` on `key`'s bucket
    /// (created under `plan` when it has none). A bucket under another configuration answers
    /// under it and is then switched to `plan`'s.
    ///
    /// # Errors
    /// The keyed bucket's: a full store ([`KeyedError::TooManyKeys`]), mostly.
    #[inline(always)]
    pub(crate) fn ask(&self, key: &str, plan: &Plan, cost: u64) -> Result<Answer, StoreError> {
        let answer = self.verbose.try_consume_and_return_remaining(key, cost)?;
        if !same(answer.configuration(), plan.configuration()) {
            self.switch(key, plan);
        }
        Ok(answer)
    }

    /// Gives `tokens` back to `key`'s bucket (never above its capacity).
    pub(crate) fn give_back(&self, key: &str, tokens: u64) -> Result<(), StoreError> {
        Ok(self.plain.add_tokens(key, tokens)?)
    }

    /// Switches `key`'s bucket to `plan` (after it answered under another configuration). A
    /// failure leaves the bucket as it was: the next request tries again.
    #[cold]
    #[inline(never)]
    fn switch(&self, key: &str, plan: &Plan) {
        let config = plan.configuration().clone();
        if let Err(e) = self.plain.replace_configuration(key, config, PLAN_CHANGE) {
            tracing::debug!(error = %e, plan = plan.name(), "switching a bucket to its plan failed");
        }
    }
}

/// Whether two configurations are equal: by identity first (a bucket created from a plan
/// shares its configuration's bandwidths), element by element otherwise (a bucket decoded by
/// a remote backend).
#[inline]
pub(crate) fn same(a: &BucketConfiguration, b: &BucketConfiguration) -> bool {
    core::ptr::eq(a.bandwidths(), b.bandwidths()) || a == b
}

/// Why a store did not answer a request.
#[derive(Debug)]
#[cfg_attr(not(feature = "distributed"), allow(dead_code))]
pub(crate) enum StoreError {
    /// The store cannot decide now (down, timed out): the failure policy answers.
    Unavailable(Box<dyn core::error::Error + Send + Sync>),
    /// The store is full of clients it cannot forget: the failure policy answers.
    Full(Box<dyn core::error::Error + Send + Sync>),
    /// The key cannot be a storage key (too long for the store).
    Key,
    /// The key has no plan (a plan resolver that changed its answer meanwhile).
    UnknownKey,
    /// The stored record is not one this server can read.
    Unreadable(Box<dyn core::error::Error + Send + Sync>),
    /// Anything else.
    Other(Box<dyn core::error::Error + Send + Sync>),
}

impl StoreError {
    /// The `kind` label of the store-error metric.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "unavailable",
            Self::Full(_) => "full",
            Self::Key => "key",
            Self::UnknownKey => "unknown_key",
            Self::Unreadable(_) => "unreadable",
            Self::Other(_) => "other",
        }
    }
}

impl From<KeyedError> for StoreError {
    fn from(e: KeyedError) -> Self {
        match e {
            e @ KeyedError::TooManyKeys { .. } => Self::Full(Box::new(e)),
            KeyedError::UnknownKey => Self::UnknownKey,
            e => Self::Other(Box::new(e)),
        }
    }
}
