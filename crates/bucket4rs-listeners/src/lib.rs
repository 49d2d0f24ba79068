//! # bucket4rs-listeners
//!
//! Observers for [bucket4rs](https://docs.rs/bucket4rs) buckets. A bucket reports what it
//! does to its [`BucketListener`] (the trait lives in `bucket4rs-core`): tokens consumed,
//! tokens rejected, waits of blocking and async callers, interruptions. This crate ships the
//! listeners:
//!
//! | listener | what it does | feature |
//! |---|---|---|
//! | [`SimpleBucketListener`] | atomic totals you read with getters (Bucket4j's `SimpleBucketListener`) | — |
//! | `(A, B)`, `(A, B, C)` | notifies every member, in order (composition) | — |
//! | `MetricsListener` | counters and a wait histogram through the `metrics` facade | `metrics` |
//! | `TracingListener` | one `tracing` event per bucket event | `tracing` |
//!
//! ```
//! use bucket4rs_listeners::SimpleBucketListener;
//! use bucket4rs_local::Bucket;
//! use std::time::Duration;
//!
//! let stats = SimpleBucketListener::new();
//! let bucket = Bucket::builder()
//!     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
//!     .with_listener(&stats) // or an `Arc<SimpleBucketListener>`
//!     .build()?;
//! bucket.try_consume(7)?;
//! bucket.try_consume(5)?; // rejected: only 3 left
//! assert_eq!(stats.consumed(), 7); // tokens, not calls
//! assert_eq!(stats.rejected(), 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What notifies
//! Only consumption: `try_consume*`, `consume_ignoring_rate_limits`, `reserve` and the blocking
//! and async consumers built on it. Estimates, `available_tokens`, adding tokens, resets,
//! configuration replacement and snapshots notify nobody. A bucket calls its listener *after*
//! its state change is committed (and, for the synchronized strategy, after its lock is
//! released), so a listener that panics cannot corrupt the bucket; the panic reaches the
//! caller of the operation, whose effect stands.
//!
//! # Cost
//! The default listener is `NoopListener`; buckets are generic over the listener, so it
//! compiles away: a bucket with no listener and one with an explicit `NoopListener` run the
//! same code. The `listener` benchmarks of the repository's `benches` package measure it
//! (figures and command in `docs/listeners.md` at the repository root).
//!
//! # Replacing or adding a listener
//! Bucket4j's `toListenable` *replaces* a bucket's listener, a known pitfall when two parts of
//! a program each want to observe the same bucket. bucket4rs offers both, named apart:
//! `to_listenable(l)` (replaces, as in Bucket4j) and `and_listener(l)` (keeps the bucket's own
//! listener and adds `l`) on `bucket4rs_local::Bucket`. For the builder, pass a tuple:
//!
//! ```
//! use bucket4rs_listeners::SimpleBucketListener;
//! use bucket4rs_local::Bucket;
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! let per_bucket = SimpleBucketListener::new();
//! let global = Arc::new(SimpleBucketListener::new()); // shared by many buckets
//! let bucket = Bucket::builder()
//!     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
//!     .with_listener((&per_bucket, Arc::clone(&global)))
//!     .build()?;
//! bucket.try_consume(2)?;
//!
//! let audit = SimpleBucketListener::new();
//! bucket.and_listener(&audit).try_consume(3)?; // all three see these 3 tokens
//! bucket.to_listenable(&audit).try_consume(1)?; // only `audit` sees this one
//!
//! assert_eq!((per_bucket.consumed(), global.consumed(), audit.consumed()), (5, 5, 4));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Crate features
//! All features are additive and off by default.
//! - `metrics`: `MetricsListener`, reporting through the [`metrics`](https://docs.rs/metrics)
//!   facade to whatever recorder is installed.
//! - `tracing`: `TracingListener`, emitting [`tracing`](https://docs.rs/tracing) events.
#![forbid(unsafe_code)]
#![cfg_attr(bucket4rs_docsrs, feature(doc_cfg))]

#[cfg(feature = "metrics")]
mod metrics;
mod simple;
#[cfg(feature = "tracing")]
mod tracing;

#[cfg(feature = "metrics")]
#[cfg_attr(bucket4rs_docsrs, doc(cfg(feature = "metrics")))]
pub use crate::metrics::MetricsListener;
pub use crate::simple::SimpleBucketListener;
#[cfg(feature = "tracing")]
#[cfg_attr(bucket4rs_docsrs, doc(cfg(feature = "tracing")))]
pub use crate::tracing::TracingListener;

pub use bucket4rs_core::{BucketListener, NoopListener};
