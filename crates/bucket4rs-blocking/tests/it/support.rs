//! A recording listener and bucket helpers shared by the tests.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bucket4rs_local::{Bucket, BucketListener, LockFreeBucket, ManualClock};

/// One listener event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Consumed(u64),
    Rejected(u64),
    Delayed(u64),
    BeforeParking(u64),
    Parked(u64),
    Interrupted,
}

/// Records every event, in order.
#[derive(Debug, Default)]
pub(crate) struct Recorder(Mutex<Vec<Event>>);

impl Recorder {
    fn push(&self, e: Event) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e);
    }
    /// The events so far, forgetting them.
    pub(crate) fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl BucketListener for Recorder {
    fn on_consumed(&self, tokens: u64) {
        self.push(Event::Consumed(tokens));
    }
    fn on_rejected(&self, tokens: u64) {
        self.push(Event::Rejected(tokens));
    }
    fn on_delayed(&self, nanos: u64) {
        self.push(Event::Delayed(nanos));
    }
    fn on_before_parking(&self, nanos: u64) {
        self.push(Event::BeforeParking(nanos));
    }
    fn on_parked(&self, nanos: u64) {
        self.push(Event::Parked(nanos));
    }
    fn on_interrupted(&self) {
        self.push(Event::Interrupted);
    }
}

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
