//! Replays every Bucket4j conformance trace through the pure core.
//!
//! Set `BUCKET4RS_CONFORMANCE_DIR` to replay another directory of traces of the same format.

use bucket4rs_core::ops;
use bucket4rs_core::{BucketConfiguration, BucketState, Clock, ManualClock};
use bucket4rs_test::{Engine, Op, outcome, replay_all};
use serde_json::Value;

struct Core {
    config: BucketConfiguration,
    state: BucketState,
    clock: ManualClock,
}

impl Engine for Core {
    fn execute(&mut self, op: &Op) -> Result<Value, String> {
        let (c, now) = (&self.config, self.clock.now_nanos());
        let s = &mut self.state;
        let e = |e: bucket4rs_core::OperationError| e.to_string();
        Ok(match op {
            Op::TryConsume(n) => Value::from(s.apply(c, now, &ops::TryConsume(*n)).map_err(e)?),
            Op::TryConsumeAndReturnRemaining(n) => outcome::probe(
                &s.apply(c, now, &ops::TryConsumeAndReturnRemaining(*n))
                    .map_err(e)?,
            ),
            Op::EstimateAbilityToConsume(n) => outcome::estimate(
                &s.apply(c, now, &ops::EstimateAbilityToConsume(*n))
                    .map_err(e)?,
            ),
            Op::TryConsumeAsMuchAsPossible(l) => Value::from(
                s.apply(c, now, &ops::TryConsumeAsMuchAsPossible(*l))
                    .map_err(e)?,
            ),
            Op::AddTokens(n) => {
                s.apply(c, now, &ops::AddTokens(*n)).map_err(e)?;
                outcome::unit()
            }
            Op::ForceAddTokens(n) => {
                s.apply(c, now, &ops::ForceAddTokens(*n)).map_err(e)?;
                outcome::unit()
            }
            Op::Reset => {
                s.apply(c, now, &ops::Reset).map_err(e)?;
                outcome::unit()
            }
            Op::AvailableTokens => Value::from(s.available_tokens(c, now)),
            Op::ConsumeIgnoringRateLimits(n) => Value::from(
                s.apply(c, now, &ops::ConsumeIgnoringRateLimits(*n))
                    .map_err(e)?,
            ),
            Op::ReplaceConfiguration(new, strategy) => {
                let wall = self.clock.is_wall_clock_based();
                self.state = s
                    .replace_configuration(c, new, now, *strategy, wall)
                    .map_err(|e| e.to_string())?;
                self.config = new.clone();
                outcome::unit()
            }
            Op::BlockingTryConsume {
                tokens,
                max_wait_nanos,
            } => {
                let parked = s
                    .apply(
                        c,
                        now,
                        &ops::Reserve {
                            tokens: *tokens,
                            max_wait_nanos: *max_wait_nanos,
                        },
                    )
                    .map_err(e)?;
                if let Some(w) = parked {
                    self.clock.advance_nanos(w as i64);
                }
                outcome::blocking_try(parked)
            }
            Op::BlockingConsume(n) => {
                let w = s
                    .apply(c, now, &ops::ConsumeIgnoringRateLimits(*n))
                    .map_err(e)?;
                self.clock.advance_nanos(w as i64);
                outcome::blocking(w)
            }
        })
    }

    fn snapshot(&mut self) -> String {
        format!("{:?} {:?}", self.config, self.state)
    }
}

#[test]
fn every_trace_replays_through_the_core() {
    replay_all("core", |config, clock| {
        config
            .check_clock(clock.is_wall_clock_based())
            .map_err(|e| e.to_string())?;
        let state = BucketState::new(&config, clock.now_nanos());
        Ok(Core {
            config,
            state,
            clock,
        })
    });
}
