//! Every Bucket4j conformance trace, with the blocking operations going through the blocking
//! view and a [`ManualClockPark`] (the park moves the trace's manual clock by exactly the wait).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use bucket4rs_blocking::{BlockingBucketExt, ManualClockPark, WaitError};
use bucket4rs_local::{Bucket, ManualClock, NewStorage, Storage};
use bucket4rs_test::local::{BlockingSteps, LocalEngine};
use bucket4rs_test::replay_all;

/// Blocking steps through this crate's view, parking on the trace's manual clock.
struct ThroughBlockingView {
    park: ManualClockPark,
    /// (blocking calls, calls that parked), shared across the engines of one replay.
    seen: Rc<Cell<(usize, usize)>>,
}

impl ThroughBlockingView {
    /// The one park of the last call (0 when it did not park), counted.
    fn parked(&self) -> Result<u64, String> {
        let parks = self.park.take_parks();
        let nanos = match parks.as_slice() {
            [] => 0,
            [one] => u64::try_from(one.as_nanos()).map_err(|e| e.to_string())?,
            more => return Err(format!("one call parked {} times", more.len())),
        };
        let (calls, parked) = self.seen.get();
        self.seen.set((calls + 1, parked + usize::from(nanos > 0)));
        Ok(nanos)
    }
}

impl<S: Storage> BlockingSteps<S> for ThroughBlockingView {
    fn try_consume(
        &mut self,
        bucket: &Bucket<S, ManualClock>,
        tokens: u64,
        max_wait_nanos: u64,
    ) -> Result<Option<u64>, String> {
        let max_wait = Duration::from_nanos(max_wait_nanos);
        let consumed = bucket
            .as_blocking()
            .try_consume_with(tokens, max_wait, &self.park)
            .map_err(|e: WaitError| e.to_string())?;
        let nanos = self.parked()?;
        if !consumed && nanos != 0 {
            return Err("a refused call parked".into());
        }
        Ok(consumed.then_some(nanos))
    }

    fn consume(&mut self, bucket: &Bucket<S, ManualClock>, tokens: u64) -> Result<u64, String> {
        bucket
            .as_blocking()
            .consume_with(tokens, &self.park)
            .map_err(|e: WaitError| e.to_string())?;
        self.parked()
    }
}

fn replay<S: NewStorage>(label: &str) {
    let seen = Rc::new(Cell::new((0, 0)));
    replay_all(label, |config, clock| {
        let bucket = Bucket::builder()
            .with_configuration(&config)
            .with_clock(clock.clone())
            .build_storage::<S>()
            .map_err(|e| e.to_string())?;
        let blocking = ThroughBlockingView {
            park: ManualClockPark::new(clock),
            seen: Rc::clone(&seen),
        };
        Ok(LocalEngine { bucket, blocking })
    });
    // What the traces exercised of this crate (they decide: any directory of valid traces
    // must pass; the blocking view's own tests cover parking with data of their own).
    let (calls, parks) = seen.get();
    println!("{label}: {calls} blocking calls, {parks} parked");
}

#[test]
fn every_trace_replays_through_the_blocking_view_of_a_lock_free_bucket() {
    replay::<bucket4rs_local::LockFree>("blocking/lock-free");
}

#[test]
fn every_trace_replays_through_the_blocking_view_of_a_synchronized_bucket() {
    replay::<bucket4rs_local::Synchronized>("blocking/synchronized");
}

#[test]
fn every_trace_replays_through_the_blocking_view_of_an_unsynchronized_bucket() {
    replay::<bucket4rs_local::Unsynchronized>("blocking/none");
}
