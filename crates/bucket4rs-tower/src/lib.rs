//! # bucket4rs-tower
//!
//! HTTP rate limiting for [tower] and axum on top of bucket4rs: one token bucket per client
//! key (an API key header, the client IP, or anything a closure extracts), a plan per key
//! (free, pro, …), a cost per request (a search costs 5, a lookup 1), and a bucket store — in
//! this process by default (a [`KeyedBucket`](bucket4rs_local::KeyedBucket): one lookup and
//! one compare-and-swap per request), or, with feature `distributed`, a Redis or PostgreSQL
//! `ProxyManager` so that every instance of a service shares one limit.
//!
//! Responses speak the standards:
//!
//! - allowed requests carry `RateLimit-Policy` and `RateLimit` (the structured-field syntax of
//!   draft-ietf-httpapi-ratelimit-headers), one entry per bandwidth of the plan, computed from
//!   that bandwidth's own state (and, on request, Bucket4j's `X-Rate-Limit-Remaining`);
//! - rejected requests get **429 Too Many Requests** with `Retry-After` in whole seconds
//!   (rounded up, at least 1) and an RFC 9457 `application/problem+json` body;
//! - a request whose cost exceeds the plan's capacity is a configuration error (500), not a
//!   429 with an absurd `Retry-After`; a missing or unknown key is 401 (configurable);
//! - a store that cannot decide (a remote backend down, the in-process store full of keys)
//!   follows the [`FailurePolicy`] (error → 503, deny → 429, fallback → a local limit that
//!   answers as a limit does) — never a silent allow.
//!
//! ```
//! use bucket4rs_core::{Bandwidth, BucketConfiguration};
//! use bucket4rs_tower::{KeyExtractor, Plan, RateLimitLayer};
//! use http::{Request, Response, StatusCode};
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt};
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let per_minute = BucketConfiguration::builder()
//!     .add_bandwidth(Bandwidth::builder().capacity(2).refill_greedy(2, Duration::from_secs(60)).id("minute").build()?)
//!     .build()?;
//! let layer = RateLimitLayer::builder()
//!     .key(KeyExtractor::header("x-api-key"))
//!     .plans(Plan::new("free", per_minute)) // every key gets this plan
//!     .build()?;
//! let svc = ServiceBuilder::new().layer(layer).service_fn(|_req: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(bytes::Bytes::from_static(b"hello")))
//! });
//! let call = |svc: &_| {
//!     let req = Request::get("/").header("x-api-key", "k1").body(()).unwrap();
//!     tower::ServiceExt::oneshot(Clone::clone(svc), req)
//! };
//! let ok = call(&svc).await?;
//! assert_eq!(ok.headers()["ratelimit"], r#""minute";r=1;t=0"#);
//! assert_eq!(ok.headers()["ratelimit-policy"], r#""minute";q=2;w=60"#);
//! call(&svc).await?;
//! let limited = call(&svc).await?;
//! assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(limited.headers()["retry-after"], "30");
//! assert_eq!(limited.headers()["content-type"], "application/problem+json");
//! # Ok::<(), Box<dyn std::error::Error>>(()) })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See `docs/http.md` for the guide: headers, failure policy, the plans file format and
//! measured overhead.
//!
//! # Crate features
//! - `toml` (default): [`PlanTable::from_toml`], plans files with human durations.
//! - `axum`: [`KeyExtractor::client_ip`] also reads axum's `ConnectInfo<SocketAddr>`.
//! - `distributed`: shared stores, `RateLimitLayerBuilder::backend` over any
//!   `bucket4rs_distributed::ProxyManager` (Redis, PostgreSQL, your own backend). Without it
//!   the crate depends on no I/O crate: `cargo tree -p bucket4rs-tower --no-default-features
//!   -e normal` shows the core, the local buckets, `http`, `bytes`, `tower`, `tracing`,
//!   `metrics`, `ipnet` and `serde_json`, and no `bucket4rs-distributed`, `redis`,
//!   `tokio-postgres`, `rand` or `async-trait` (`cargo xtask check-deps` checks it). The
//!   tests' dev-dependencies include the distributed crate.
#![forbid(unsafe_code)]

mod client_ip;
#[cfg(feature = "toml")]
mod file;
mod future;
mod headers;
mod key;
mod layer;
mod limit;
mod metrics;
mod plan;
mod policy;
mod problem;
#[cfg(feature = "distributed")]
mod remote;
mod response;
mod service;
mod store;

pub use client_ip::ClientIp;
#[cfg(feature = "toml")]
pub use file::{PlanTable, PlansError};
pub use future::ResponseFuture;
pub use key::{KeyExtractor, RequestInfo};
pub use layer::{DEFAULT_MAX_KEYS, RateLimitLayer, RateLimitLayerBuilder};
pub use limit::Limit;
pub use plan::{Plan, PlanResolver};
pub use policy::FailurePolicy;
pub use response::{Refusal, ShadowRefusal};
pub use service::RateLimit;
pub use store::LocalStore;
