//! Further limits a request must also pass: per route, global, per client.

use core::fmt;
use std::sync::Arc;

use bucket4rs_core::BucketConfiguration;

use crate::key::RequestInfo;
use crate::plan::Plan;

type MatchFn = dyn for<'a> Fn(&RequestInfo<'a>) -> bool + Send + Sync;

/// A limit a request must pass besides its client's plan: a global limit (one bucket for
/// every request it applies to), or a limit per client (a bucket per client key), on every
/// request or on some ([`when`](Self::when), [`path_prefix`](Self::path_prefix): a per-route
/// limit). Added with
/// [`RateLimitLayerBuilder::limit`](crate::RateLimitLayerBuilder::limit).
///
/// Every limit that applies must allow a request. They are asked in a fixed order — the
/// client's plan, then the further limits in the order they were added — each consuming the
/// request's cost; when one refuses, the tokens the others took are given back
/// (`add_tokens`), so a refused request leaves every bucket as it would be had it never come.
/// `Retry-After` is the longest wait of the limits that refused, and the `RateLimit` fields
/// list every policy of every limit asked. A limit's policies are named after it (`name`, or
/// `name.<bandwidth>` for a limit of several bandwidths). See docs/http.md for the exact
/// guarantee under concurrency.
///
/// ```
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_tower::{Limit, Plan, RateLimitLayer};
/// use std::time::Duration;
/// let rate = |n, secs| BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(n, Duration::from_secs(secs))?).build();
/// let layer = RateLimitLayer::builder()
///     .plans(Plan::new("free", rate(20, 60)?))
///     .limit(Limit::global("search", rate(100, 60)?).path_prefix("/books/search"))
///     .limit(Limit::global("all", rate(10_000, 1)?))
///     .build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Limit {
    plan: Plan,
    per_client: bool,
    when: Option<Arc<MatchFn>>,
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.plan.name())
            .field("per_client", &self.per_client)
            .field("conditional", &self.when.is_some())
            .finish()
    }
}

impl Limit {
    /// One bucket of `config` shared by every request the limit applies to.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(100, Duration::from_secs(1))?).build()?;
    /// let all = bucket4rs_tower::Limit::global("all", c);
    /// assert_eq!(all.name(), "all");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn global(name: impl Into<Arc<str>>, config: BucketConfiguration) -> Self {
        Self {
            plan: Plan::for_limit(name.into(), config),
            per_client: false,
            when: None,
        }
    }

    /// A bucket of `config` per client key (a per-client, per-route limit with
    /// [`path_prefix`](Self::path_prefix)).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(60))?).build()?;
    /// let exports = bucket4rs_tower::Limit::per_client("exports", c).path_prefix("/export");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn per_client(name: impl Into<Arc<str>>, config: BucketConfiguration) -> Self {
        Self {
            per_client: true,
            ..Self::global(name, config)
        }
    }

    /// Applies only to the requests `f` accepts.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(60))?).build()?;
    /// let writes = bucket4rs_tower::Limit::global("writes", c).when(|r| r.method() != http::Method::GET);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn when(
        mut self,
        f: impl for<'a> Fn(&RequestInfo<'a>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.when = Some(Arc::new(f));
        self
    }

    /// Applies only to requests whose path starts with `prefix` (a route).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(60))?).build()?;
    /// let search = bucket4rs_tower::Limit::global("search", c).path_prefix("/books/search");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn path_prefix(self, prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        self.when(move |r| r.uri().path().starts_with(prefix.as_str()))
    }

    /// This limit in shadow mode (see [`Plan::shadow`]).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(60))?).build()?;
    /// let trial = bucket4rs_tower::Limit::global("all", c).shadow();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn shadow(mut self) -> Self {
        self.plan = self.plan.shadow();
        self
    }

    /// This limit with its buckets leasing on a shared store (feature `distributed`; see
    /// [`Plan::with_leasing`]): for a global limit, the one key every request it applies to
    /// passes, each instance serves its requests from blocks of tokens taken from the shared
    /// bucket. The layer asks a leasing limit after the others and takes from it only when
    /// they allowed the request (docs/http.md, "Several limits per request").
    ///
    /// # Errors
    /// [`DistributedError::InvalidSetting`](bucket4rs_distributed::DistributedError::InvalidSetting)
    /// for settings that can only break things.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(10_000, Duration::from_secs(1))?).build()?;
    /// use bucket4rs_distributed::Leasing;
    /// let all = bucket4rs_tower::Limit::global("all", c).with_leasing(Leasing::new())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "distributed")]
    pub fn with_leasing(
        mut self,
        leasing: bucket4rs_distributed::Leasing,
    ) -> Result<Self, bucket4rs_distributed::DistributedError> {
        self.plan = self.plan.with_leasing(leasing)?;
        Ok(self)
    }

    /// The limit's name.
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration}; use std::time::Duration;
    /// # let c = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(5, Duration::from_secs(60))?).build()?;
    /// assert_eq!(bucket4rs_tower::Limit::global("all", c).name(), "all");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &str {
        self.plan.name()
    }

    pub(crate) fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Whether the limit applies to `req`.
    pub(crate) fn applies(&self, req: &RequestInfo<'_>) -> bool {
        self.when.as_ref().is_none_or(|f| f(req))
    }

    /// The key of this limit's bucket for a request of `client`: the client's for a limit
    /// per client, one for all otherwise. A byte no client key has (a header value or an
    /// address never holds NUL) keeps these keys apart from the clients' in a shared store.
    pub(crate) fn key(&self, client: &str) -> String {
        if self.per_client {
            format!("\0{}\0{client}", self.plan.name())
        } else {
            format!("\0{}", self.plan.name())
        }
    }
}
