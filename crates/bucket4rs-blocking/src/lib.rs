//! # bucket4rs-blocking
//!
//! Blocking consumption for the buckets of [`bucket4rs-local`](bucket4rs_local): batch jobs
//! and API clients *wait* for tokens instead of failing, as with Bucket4j's
//! `bucket.asBlocking()`.
//!
//! ```
//! use bucket4rs_blocking::BlockingBucketExt;
//! use bucket4rs_local::Bucket;
//! use std::time::{Duration, Instant};
//!
//! // 100 items per second, bursts of 10.
//! let bucket = Bucket::builder()
//!     .add_limit(|l| l.capacity(10).refill_greedy(100, Duration::from_secs(1)))
//!     .build()?;
//! let start = Instant::now();
//! for _item in 0..12 {
//!     bucket.as_blocking().consume(1)?; // the first 10 pass at once, then one every 10 ms
//! }
//! assert!(start.elapsed() >= Duration::from_millis(19));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # How waiting works
//! A call first *reserves* its tokens through the bucket (`consume_ignoring_rate_limits` for
//! [`consume`](BlockingBucket::consume), `reserve` for
//! [`try_consume`](BlockingBucket::try_consume)), which takes them at once and returns how long
//! until they are paid for; then it parks for exactly that long. So concurrent callers queue
//! in arrival order, a request may exceed the capacity (the debt is paid by waiting), and
//! `available_tokens` is negative while callers wait. This crate does no token arithmetic of
//! its own.
//!
//! How the thread waits is a [`ParkStrategy`]: [`ThreadPark`] sleeps until the deadline
//! (never spins); [`CancelToken`] can be cancelled from another thread; [`ManualClockPark`]
//! advances a [`ManualClock`](bucket4rs_core::ManualClock) instead of waiting, for tests.
//!
//! # Cancellation
//! Rust threads have no interrupt, so a wait is cancelled by its park strategy failing with
//! [`Interrupted`] (for example [`CancelToken::cancel`] from another thread). Then, in order:
//! 1. the tokens reserved by the call are given back with `add_tokens(tokens)`: all of them,
//!    however long the call already waited, but never above any limit's capacity (an
//!    `add_tokens` cannot overflow a bucket);
//! 2. the listener hears `on_interrupted()`;
//! 3. the call returns [`WaitError::Interrupted`].
//!
//! Callers queued behind a cancelled one keep the waits they were given: the returned tokens
//! shorten the waits of later reservations. (Bucket4j keeps the tokens of an interrupted wait;
//! giving them back is a deliberate difference.)
//!
//! # Listener events
//! In Bucket4j's order, through the bucket's own listener: `on_consumed(tokens)`,
//! `on_before_parking(nanos)`, `on_parked(nanos)`; a `try_consume` refused without waiting
//! gives `on_rejected(tokens)`; a cancelled wait gives `on_interrupted()` instead of
//! `on_parked`. A call that does not need to wait parks never and only reports
//! `on_consumed`.
//!
//! # Verbose waits
//! [`BlockingBucket::as_verbose`] gives the same view answering verbosely: its waits answer the
//! `VerboseResult` of their reservation (the state right after the tokens were taken, before
//! the park), as Bucket4j's `asBlocking().asVerbose()`.
//!
//! # Not on an async runtime
//! A blocking wait parks the calling thread. On a thread that runs async tasks (a tokio
//! worker, or the thread inside a current-thread runtime's `block_on`) every task of that
//! thread stalls for the wait: use `bucket4rs-async` there, or move the call to
//! `tokio::task::spawn_blocking`. With the `tokio` feature, debug builds check this when a
//! blocking view is made ([`as_blocking`](BlockingBucketExt::as_blocking),
//! [`BlockingBucket::new`]) and print a warning to stderr, once per process, when it is
//! made on such a thread. It is a warning, not an error: release builds behave the same, and
//! nothing else changes. Tokio's blocking threads (`spawn_blocking`) are not flagged. The
//! facade `bucket4rs` turns the check on whenever its `blocking` and `tokio` features are
//! both on.
//!
//! # Crate features
//! - `tokio`: the debug-build check above (a dependency on tokio's `rt`, which a program on
//!   tokio has already).
#![forbid(unsafe_code)]

mod guard;
mod park;
mod view;

pub use park::{CancelToken, Interrupted, ManualClockPark, ParkStrategy, ThreadPark};
pub use view::{BlockingBucket, BlockingBucketExt, WaitError};
