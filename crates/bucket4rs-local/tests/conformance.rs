//! Replays every Bucket4j conformance trace against each local strategy.
//!
//! Set `BUCKET4RS_CONFORMANCE_DIR` to replay another directory of traces of the same format.

use std::time::Duration;

use bucket4rs_core::ops::Reserve;
use bucket4rs_local::{Bucket, ManualClock, NewStorage, Storage, SynchronizationStrategy};
use bucket4rs_test::{Engine, Op, outcome, replay_all};
use serde_json::Value;

struct Local<S> {
    bucket: Bucket<S, ManualClock>,
}

impl<S: Storage> Engine for Local<S> {
    fn execute(&mut self, op: &Op) -> Result<Value, String> {
        let b = &self.bucket;
        let e = |e: bucket4rs_local::OperationError| e.to_string();
        let nanos = |d: Duration| d.as_nanos() as u64;
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
                Value::from(nanos(b.consume_ignoring_rate_limits(*n).map_err(e)?))
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
                let op = Reserve {
                    tokens: *tokens,
                    max_wait_nanos: *max_wait_nanos,
                };
                let parked = b.execute(op).map_err(e)?;
                if let Some(w) = parked {
                    b.clock().advance_nanos(w as i64);
                }
                outcome::blocking_try(parked)
            }
            Op::BlockingConsume(n) => {
                let w = nanos(b.consume_ignoring_rate_limits(*n).map_err(e)?);
                b.clock().advance_nanos(w as i64);
                outcome::blocking(w)
            }
        })
    }

    fn snapshot(&mut self) -> String {
        format!("{:?}", self.bucket.snapshot())
    }
}

fn replay<S: Storage + NewStorage>(label: &str) {
    let summary = replay_all(label, |config, clock| {
        let bucket = Bucket::builder()
            .with_configuration(&config)
            .with_clock(clock)
            .build_storage::<S>()
            .map_err(|e| e.to_string())?;
        Ok(Local { bucket })
    });
    assert!(summary.steps > summary.traces);
}

#[test]
fn every_trace_replays_on_the_lock_free_bucket() {
    replay::<bucket4rs_local::LockFree>("lock-free");
}

#[test]
fn every_trace_replays_on_the_synchronized_bucket() {
    replay::<bucket4rs_local::Synchronized>("synchronized");
}

#[test]
fn every_trace_replays_on_the_unsynchronized_bucket() {
    replay::<bucket4rs_local::Unsynchronized>("none");
}

#[test]
fn every_trace_replays_on_run_time_chosen_strategies() {
    for (label, strategy) in [
        ("any/lock-free", SynchronizationStrategy::LockFree),
        ("any/synchronized", SynchronizationStrategy::Synchronized),
    ] {
        let summary = replay_all(label, |config, clock| {
            let bucket = Bucket::builder()
                .with_configuration(&config)
                .with_clock(clock)
                .build_with(strategy)
                .map_err(|e| e.to_string())?;
            Ok(Local { bucket })
        });
        assert!(summary.steps > summary.traces);
    }
}
