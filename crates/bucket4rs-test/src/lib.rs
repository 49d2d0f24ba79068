//! Test support shared by the bucket4rs crates: the conformance trace replayer (re-exported
//! from the published `bucket4rs-testkit`, which bundles the traces), the engine of the local
//! buckets, and a recording listener.
//!
//! One loader, many engines: each bucket implementation (the pure core, each local strategy,
//! the blocking view, every distributed backend) implements [`Engine`] and is replayed against
//! the same traces by [`replay_all`].
//!
//! ```
//! assert!(!bucket4rs_test::traces().is_empty());
//! ```

pub use bucket4rs_testkit::conformance::*;

#[cfg(feature = "local")]
pub mod local;
pub mod recorder;
