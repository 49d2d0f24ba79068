//! Every Bucket4j conformance trace, with the blocking operations going through the blocking
//! view and a [`ManualClockPark`] (the park moves the trace's manual clock by exactly the wait).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use bucket4rs_blocking::{BlockingBucketExt, ManualClockPark, WaitError};
use bucket4rs_local::{Bucket, ManualClock, NewStorage, Storage};
use bucket4rs_test::{Engine, Op, outcome, replay_all};
use serde_json::Value;

struct BlockingEngine<S> {
    bucket: Bucket<S, ManualClock>,
    park: ManualClockPark,
    /// (blocking calls, calls that parked), shared across the engines of one replay.
    seen: Rc<Cell<(usize, usize)>>,
}

impl<S> BlockingEngine<S> {
    fn count(&self, nanos: u64) {
        let (calls, parks) = self.seen.get();
        self.seen.set((calls + 1, parks + usize::from(nanos > 0)));
    }
}

fn parked(park: &ManualClockPark) -> Result<u64, String> {
    let parks = park.take_parks();
    match parks.as_slice() {
        [] => Ok(0),
        [one] => u64::try_from(one.as_nanos()).map_err(|e| e.to_string()),
        more => Err(format!("one call parked {} times", more.len())),
    }
}

impl<S: Storage> Engine for BlockingEngine<S> {
    fn execute(&mut self, op: &Op) -> Result<Value, String> {
        let b = &self.bucket;
        let e = |e: bucket4rs_local::OperationError| e.to_string();
        let w = |e: WaitError| e.to_string();
        Ok(match op {
            Op::TryConsume(n) => Value::from(b.try_consume(*n).map_err(e)?),
            Op::TryConsumeAndReturnRemaining(n) => {
                outcome::probe(&b.try_consume_and_return_remaining(*n).map_err(e)?)
            }
            Op::EstimateAbilityToConsume(n) => {
                outcome::estimate(&b.estimate_ability_to_consume(*n).map_err(e)?)
            }
            Op::TryConsumeAsMuchAsPossible(None) => {
                Value::from(b.try_consume_as_much_as_possible())
            }
            Op::TryConsumeAsMuchAsPossible(Some(l)) => Value::from(
                b.try_consume_as_much_as_possible_with_limit(*l)
                    .map_err(e)?,
            ),
            Op::AddTokens(n) => {
                b.add_tokens(*n).map_err(e)?;
                outcome::unit()
            }
            Op::ForceAddTokens(n) => {
                b.force_add_tokens(*n).map_err(e)?;
                outcome::unit()
            }
            Op::Reset => {
                b.reset();
                outcome::unit()
            }
            Op::AvailableTokens => Value::from(b.available_tokens()),
            Op::ConsumeIgnoringRateLimits(n) => {
                Value::from(b.consume_ignoring_rate_limits(*n).map_err(e)?.as_nanos() as u64)
            }
            Op::ReplaceConfiguration(c, s) => {
                b.replace_configuration(c.clone(), *s)
                    .map_err(|e| e.to_string())?;
                outcome::unit()
            }
            Op::BlockingTryConsume {
                tokens,
                max_wait_nanos,
            } => {
                let consumed = b
                    .as_blocking()
                    .try_consume_with(*tokens, Duration::from_nanos(*max_wait_nanos), &self.park)
                    .map_err(w)?;
                let nanos = parked(&self.park)?;
                self.count(nanos);
                if !consumed && nanos != 0 {
                    return Err("a refused call parked".into());
                }
                outcome::blocking_try(consumed.then_some(nanos))
            }
            Op::BlockingConsume(n) => {
                b.as_blocking().consume_with(*n, &self.park).map_err(w)?;
                let nanos = parked(&self.park)?;
                self.count(nanos);
                outcome::blocking(nanos)
            }
        })
    }

    fn snapshot(&mut self) -> String {
        format!("{:?}", self.bucket.snapshot())
    }
}

fn replay<S: NewStorage>(label: &str) {
    let seen = Rc::new(Cell::new((0, 0)));
    let summary = replay_all(label, |config, clock| {
        let bucket = Bucket::builder()
            .with_configuration(&config)
            .with_clock(clock.clone())
            .build_storage::<S>()
            .map_err(|e| e.to_string())?;
        Ok(BlockingEngine {
            bucket,
            park: ManualClockPark::new(clock),
            seen: Rc::clone(&seen),
        })
    });
    assert!(summary.steps > summary.traces);
    assert!(summary.failures.is_empty());
    // The traces do exercise this crate: blocking calls, and calls that parked.
    let (calls, parks) = seen.get();
    println!("{label}: {calls} blocking calls, {parks} parked");
    assert!(
        calls >= 20 && parks >= 5,
        "{calls} blocking calls, {parks} parked"
    );
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
