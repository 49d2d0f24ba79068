//! A listener that records every event in order, for tests that assert event sequences.
//!
//! ```
//! use bucket4rs_core::BucketListener;
//! use bucket4rs_test::recorder::{Event, Recorder};
//! let r = Recorder::default();
//! r.on_consumed(2);
//! r.on_interrupted();
//! assert_eq!(r.take(), vec![Event::Consumed(2), Event::Interrupted]);
//! ```

use std::sync::{Mutex, PoisonError};

use bucket4rs_core::BucketListener;

/// One listener event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the variants are the listener methods
pub enum Event {
    Consumed(u64),
    Rejected(u64),
    Delayed(u64),
    BeforeParking(u64),
    Parked(u64),
    Interrupted,
}

/// Records every event, in order.
#[derive(Debug, Default)]
pub struct Recorder(Mutex<Vec<Event>>);

impl Recorder {
    fn push(&self, e: Event) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e);
    }
    /// The events so far, forgetting them.
    pub fn take(&self) -> Vec<Event> {
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
