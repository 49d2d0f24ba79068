//! Integration tests of bucket4rs-listeners (one binary, matklad-style).

mod async_path;
mod blocking;
mod compose;
#[cfg(feature = "metrics")]
mod metrics;
mod notify;
mod panic;
#[cfg(feature = "tracing")]
mod tracing;

use std::time::Duration;

use bucket4rs_core::BucketListener;
use bucket4rs_listeners::SimpleBucketListener;
use bucket4rs_local::{Bucket, ManualClock, NewStorage};

/// A bucket of 10 tokens refilled greedily at 10 per second, on strategy `S`, a manual clock
/// (returned too) and `listener`.
fn bucket<S: NewStorage, L: BucketListener>(
    listener: L,
) -> (Bucket<S, ManualClock, L>, ManualClock) {
    let clock = ManualClock::new(0);
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
        .with_clock(clock.clone())
        .with_listener(listener)
        .build_storage::<S>()
        .expect("a valid configuration");
    (bucket, clock)
}

/// Every total of a [`SimpleBucketListener`]:
/// `[consumed, rejected, delayed, before_parking, parked, interrupted]`.
fn totals(l: &SimpleBucketListener) -> [u64; 6] {
    [
        l.consumed(),
        l.rejected(),
        l.delayed_nanos(),
        l.before_parking_nanos(),
        l.parked_nanos(),
        l.interrupted(),
    ]
}

/// Generates, for each local strategy, a module with one `#[test]` per generic case
/// `fn case<S: NewStorage>()` of the enclosing module.
macro_rules! on_every_strategy {
    ($($case:ident),+ $(,)?) => {
        mod lock_free {
            $(#[test] fn $case() { super::$case::<bucket4rs_local::LockFree>() })+
        }
        mod synchronized {
            $(#[test] fn $case() { super::$case::<bucket4rs_local::Synchronized>() })+
        }
        mod unsynchronized {
            $(#[test] fn $case() { super::$case::<bucket4rs_local::Unsynchronized>() })+
        }
    };
}
use on_every_strategy;
