//! # bucket4rs-core
//!
//! The pure heart of [bucket4rs](https://docs.rs/bucket4rs): token-bucket configurations,
//! state, and every operation as an exact integer transition on
//! `(configuration, state, now)`. No I/O, no clock reads, no threads, no floating point, no
//! `unsafe`; `#![no_std]` with `alloc`.
//!
//! The semantics follow Bucket4j 8.x with four deliberate fixes (exact arithmetic, fractional
//! tokens kept across replacement, waits rounded up, replacement validated like building); the
//! repository's `testdata/conformance` traces, recorded from Bucket4j, are replayed against
//! this crate by its test suite.
//!
//! ```
//! use bucket4rs_core::{BucketConfiguration, BucketState};
//! use core::time::Duration;
//!
//! let config = BucketConfiguration::builder()
//!     .add_limit(|l| l.capacity(20).refill_greedy(20, Duration::from_secs(60))) // 20 per minute
//!     .build()?;
//! let mut state = BucketState::new(&config, 0);
//! assert!(state.apply(&config, 0, &bucket4rs_core::ops::TryConsume(20))?);
//! let probe = state.apply(&config, 0, &bucket4rs_core::ops::TryConsumeAndReturnRemaining(1))?;
//! assert!(!probe.is_consumed());
//! assert_eq!(probe.wait_for_refill(), Duration::from_secs(3)); // one token every 3 s
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Crate features
//! - `std` (default): the standard-library clocks [`MonotonicClock`], [`SystemMillisClock`]
//!   and [`SystemNanosClock`].
//! - `serde`: `Serialize`/`Deserialize` for configurations, states and probes.
#![no_std]
#![forbid(unsafe_code)]
// Keep the no_std crate honest (these lints are only useful here, so not workspace-wide).
#![warn(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]
#![cfg_attr(bucket4rs_docsrs, feature(doc_cfg))]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod clock;
mod config;
mod error;
mod listener;
mod math;
pub mod ops;
mod replace;
#[cfg(feature = "serde")]
mod serde_impls;
mod state;
mod verbose;

pub use clock::{Clock, ManualClock};
#[cfg(feature = "std")]
pub use clock::{MonotonicClock, SystemMillisClock, SystemNanosClock};
pub use config::{
    Bandwidth, BandwidthBuilder, BucketConfiguration, ConfigurationBuilder, RefillKind,
};
pub use error::{ConfigError, OperationError};
pub use listener::{BucketListener, NoopListener};
pub use ops::{ConsumptionProbe, EstimationProbe};
pub use replace::TokensInheritanceStrategy;
pub use state::{BandwidthState, BucketState, StateError};
pub use verbose::{Answer, Plain, Verbose, VerboseResult};

/// What the other bucket4rs crates need from the core's fast forms, outside semver: the
/// compact and scaled one-bandwidth states and the single-bandwidth planning shortcuts that
/// local storages run before the general engine. Not for use outside bucket4rs.
#[doc(hidden)]
pub mod __private {
    pub use crate::ops::{
        Mutation, Plan, Refilled, Scaled, Single, Take, plan, plan_one, plan_scaled,
    };
    pub use crate::state::{CompactForm, CompactStop, ScaledState};
}

/// The largest value of every wait and balance: `i64::MAX`. A wait of `MAX_NANOS` means the
/// request can never be served (it exceeds a capacity) or would take longer than ~292 years.
///
/// ```
/// assert_eq!(bucket4rs_core::MAX_NANOS, i64::MAX as u64);
/// ```
pub const MAX_NANOS: u64 = i64::MAX as u64;
