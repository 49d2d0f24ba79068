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

pub mod forms {
    //! The exact one-bandwidth forms of a bucket's state, for storages that keep it in one or
    //! two machine words and run operations on it directly.
    //!
    //! A [`BandwidthState`](crate::BandwidthState) is three integers. For one greedy bandwidth,
    //! two smaller forms hold the same exact state:
    //!
    //! - [`ScaledState`]: the last refill time and the balance in units of `q / period` token
    //!   (`q` the refill's remainder quantum), so that refill and consumption are additions and
    //!   comparisons; [`ops::plan_scaled`](crate::ops::plan_scaled) runs an operation on it
    //!   without dividing. Two words.
    //! - [`CompactForm`]: one word `u`, the reading at which the bucket is full again (the
    //!   GCRA's theoretical arrival time, without its rounding), valid on a clock that never
    //!   goes back; [`CompactForm::plan`] runs `try_consume` on it as the GCRA's step.
    //!
    //! Both give exactly the answers of the general engine ([`ops::plan`](crate::ops::plan)),
    //! and say so when they cannot ([`CompactStop::Decline`], `None`): the caller decodes the
    //! state and plans generally then. `bucket4rs-local` keeps its lock-free buckets and its
    //! keyed buckets' entries in these forms.
    //!
    //! ```
    //! use bucket4rs_core::forms::{CompactForm, ScaledState};
    //! use bucket4rs_core::{Bandwidth, BandwidthState, ops::TryConsume};
    //! use core::time::Duration;
    //!
    //! let b = Bandwidth::simple(10, Duration::from_secs(1))?;
    //! // A full bucket at reading 0, as one word.
    //! let form = CompactForm::new(&b, 0).expect("greedy");
    //! let full = ScaledState::from_state(&b, BandwidthState::from_parts(0, 10, 0)).expect("fits");
    //! let u = form.encode(full).expect("fits");
    //! let (taken, u) = form.plan(&TryConsume(4), u, 0)?;
    //! assert!(taken);
    //! assert_eq!(form.decode(u, 0).to_state(&b).tokens(), 6);
    //! # Ok::<(), Box<dyn std::error::Error>>(())
    //! ```
    pub use crate::state::{CompactForm, CompactStop, ScaledState};
}

/// The largest value of every wait and balance: `i64::MAX`. A wait of `MAX_NANOS` means the
/// request can never be served (it exceeds a capacity) or would take longer than ~292 years.
///
/// ```
/// assert_eq!(bucket4rs_core::MAX_NANOS, i64::MAX as u64);
/// ```
pub const MAX_NANOS: u64 = i64::MAX as u64;
