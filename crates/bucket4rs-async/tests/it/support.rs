//! A recording listener and bucket helpers shared by the tests.

use std::sync::{Mutex, PoisonError};

use bucket4rs_local::BucketListener;

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
