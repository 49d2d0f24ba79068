//! # bucket4rs-async
//!
//! Async consumption for the buckets of [`bucket4rs-local`](bucket4rs_local): await tokens
//! without ever blocking an executor thread, as with Bucket4j's `bucket.asScheduler()`, but
//! **cancellation safe**: a future dropped mid-wait gives its tokens back.
//!
//! ```
//! use bucket4rs_async::AsyncBucketExt;
//! use bucket4rs_local::Bucket;
//! use std::time::Duration;
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // 100 calls per second, bursts of 10.
//!     let bucket = Bucket::builder()
//!         .add_limit(|l| l.capacity(10).refill_greedy(100, Duration::from_secs(1)))
//!         .build()?;
//!     let limiter = bucket.with_sleeper(tokio::time::sleep); // or `as_async()` (feature `tokio`)
//!     for _call in 0..12 {
//!         limiter.consume(1).await?; // the first 10 pass at once, then one every 10 ms
//!     }
//!     // Give up instead of waiting more than 1 ms (10 tokens take 100 ms):
//!     assert!(!limiter.try_consume(10, Duration::from_millis(1)).await?);
//!     Ok(())
//! }
//! ```
//!
//! # How waiting works
//! When first polled, a call *reserves* its tokens through the bucket
//! (`consume_ignoring_rate_limits` for [`consume`](AsyncBucket::consume), `reserve` for
//! [`try_consume`](AsyncBucket::try_consume)), which takes them at once and returns how long
//! until they are paid for; then it awaits a [`Sleeper`] future for exactly that long. So
//! callers queue in order, requests may exceed the capacity (the debt is paid by waiting), and
//! `available_tokens` is negative while callers wait. This crate does no token arithmetic.
//!
//! The futures are lazy: nothing is reserved until the first poll (Bucket4j's
//! `asScheduler()` reserves when called), and a future borrows its view, so
//! `let f = bucket.as_async().consume(1);` does not compile (`E0716`): bind the view first.
//! [`AsyncBucket`] shows both, with examples.
//!
//! [`AsyncBucket::as_verbose`] gives the same view answering verbosely: its waits answer the
//! `VerboseResult` of their reservation.
//!
//! No runtime is required: a [`Sleeper`] is any `Fn(Duration) -> impl Future<Output = ()>`,
//! such as `tokio::time::sleep`, `async_std::task::sleep` or `smol::Timer::after` wrapped in
//! an `async` block. The `tokio` feature adds [`TokioSleeper`] (and `as_async()`) and
//! [`TokioClock`], a bucket clock that follows tokio's paused time in tests.
//!
//! # Cancellation
//! Dropping a future after it reserved its tokens and before it completed (a `select!` that
//! lost, a timeout, an aborted task, a client that hung up):
//! 1. gives all the reserved tokens back with `add_tokens(tokens)` (however long it already
//!    waited; never above any limit's capacity);
//! 2. then tells the listener `on_interrupted()`.
//!
//! Futures dropped before their first poll never reserved anything. Waiters queued behind a
//! dropped one keep their deadlines; the returned tokens shorten later reservations. Neither
//! Bucket4j nor governor gives tokens back on cancellation.
//!
//! # Listener events
//! In Bucket4j's order, through the bucket's own listener: `on_consumed(tokens)`, then
//! `on_delayed(nanos)` when the call must wait; `on_rejected(tokens)` when `try_consume` gives
//! up without waiting; `on_interrupted()` when a waiting future is dropped.
//!
//! # Crate features
//! - `tokio`: [`TokioSleeper`], `AsyncBucketExt::as_async` and [`TokioClock`].
//!
//! The examples run on tokio; copied into a program of your own they need tokio with the
//! features `rt` and `macros` (for `#[tokio::main]`) and `time`; the [`TokioClock`] example
//! also needs `test-util` (paused time): `tokio = { version = "1", features = ["rt", "macros",
//! "time", "test-util"] }`.
#![forbid(unsafe_code)]
#![cfg_attr(bucket4rs_docsrs, feature(doc_cfg))]

mod sleep;
mod view;

pub use sleep::Sleeper;
#[cfg(feature = "tokio")]
#[cfg_attr(bucket4rs_docsrs, doc(cfg(feature = "tokio")))]
pub use sleep::{TokioClock, TokioSleeper};
pub use view::{AsyncBucket, AsyncBucketExt};
