//! A recording listener and bucket helpers shared by the tests.

use std::sync::Arc;
use std::time::Duration;

use bucket4rs_local::{Bucket, LockFreeBucket, ManualClock};

pub(crate) use bucket4rs_test::recorder::{Event, Recorder};

/// A lock-free bucket of `capacity` refilling `capacity` tokens per `period`, full, on a manual
/// clock at 0, with a recording listener.
pub(crate) fn recorded(
    capacity: u64,
    period: Duration,
) -> (
    LockFreeBucket<ManualClock, Arc<Recorder>>,
    ManualClock,
    Arc<Recorder>,
) {
    let clock = ManualClock::new(0);
    let recorder = Arc::new(Recorder::default());
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(capacity).refill_greedy(capacity, period))
        .with_clock(clock.clone())
        .with_listener(Arc::clone(&recorder))
        .build()
        .expect("valid configuration");
    (bucket, clock, recorder)
}
