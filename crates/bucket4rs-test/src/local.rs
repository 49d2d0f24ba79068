//! The conformance engine for local buckets (feature `local`): every non-blocking step goes
//! through the bucket's API; blocking steps go through a [`BlockingSteps`] implementation, so
//! the local crate replays them with a plain reservation and the blocking crate through its
//! own view.

use core::time::Duration;

use bucket4rs_core::ops::{ConsumeIgnoringRateLimits, Reserve, TryConsumeAsMuchAsPossible};
use bucket4rs_local::{Bucket, KeyedBucket, KeyedError, ManualClock, OperationError, Storage};
use serde_json::Value;

use crate::{Engine, Op, outcome};

/// How a replay runs `blocking_try_consume` and `blocking_consume`: each returns the nanoseconds
/// parked (which must also have moved the bucket's manual clock).
pub trait BlockingSteps<S> {
    /// `blocking_try_consume`: `Some(parked)` when consumed, `None` when refused.
    ///
    /// # Errors
    /// A description of the error.
    fn try_consume(
        &mut self,
        bucket: &Bucket<S, ManualClock>,
        tokens: u64,
        max_wait_nanos: u64,
    ) -> Result<Option<u64>, String>;

    /// `blocking_consume`: the nanoseconds parked.
    ///
    /// # Errors
    /// A description of the error.
    fn consume(&mut self, bucket: &Bucket<S, ManualClock>, tokens: u64) -> Result<u64, String>;
}

/// Blocking steps as a reservation followed by advancing the manual clock by the wait: what
/// the blocking view does, without it.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReserveAndAdvance;

impl<S: Storage> BlockingSteps<S> for ReserveAndAdvance {
    fn try_consume(
        &mut self,
        bucket: &Bucket<S, ManualClock>,
        tokens: u64,
        max_wait_nanos: u64,
    ) -> Result<Option<u64>, String> {
        let parked = bucket
            .execute(Reserve {
                tokens,
                max_wait_nanos,
            })
            .map_err(|e| e.to_string())?;
        if let Some(w) = parked {
            bucket.clock().advance_nanos(w as i64);
        }
        Ok(parked)
    }

    fn consume(&mut self, bucket: &Bucket<S, ManualClock>, tokens: u64) -> Result<u64, String> {
        let w = nanos(
            bucket
                .consume_ignoring_rate_limits(tokens)
                .map_err(|e| e.to_string())?,
        );
        bucket.clock().advance_nanos(w as i64);
        Ok(w)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A local bucket under test.
#[derive(Debug)]
pub struct LocalEngine<S, B> {
    /// The bucket.
    pub bucket: Bucket<S, ManualClock>,
    /// How blocking steps run.
    pub blocking: B,
}

impl<S: Storage, B: BlockingSteps<S>> Engine for LocalEngine<S, B> {
    fn execute(&mut self, op: &Op) -> Result<Value, String> {
        let b = &self.bucket;
        let e = |e: OperationError| e.to_string();
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
            } => outcome::blocking_try(self.blocking.try_consume(b, *tokens, *max_wait_nanos)?),
            Op::BlockingConsume(n) => outcome::blocking(self.blocking.consume(b, *n)?),
        })
    }

    fn snapshot(&mut self) -> String {
        format!("{:?}", self.bucket.snapshot())
    }
}

/// The conformance engine for a [`KeyedBucket`]: every step on one key, whose bucket the
/// engine asks the keyed bucket to forget after every step when it can (a forgotten key must
/// answer as the kept one would), beside a bystander key that no step touches.
pub struct KeyedEngine {
    /// The keyed bucket under test.
    pub keyed: KeyedBucket<String, ManualClock>,
}

/// The key every step of a trace runs on.
const KEY: &str = "trace";
/// A key the steps never touch (its bucket must not change).
const BYSTANDER: &str = "bystander";

impl KeyedEngine {
    /// An engine over `keyed`. The trace's bucket is created now, as the trace's bucket is
    /// built at its start (a key's bucket is created when the key is first used, and for
    /// interval refill or initial tokens below capacity that moment shows); the bystander's
    /// too, with one token taken when it can be.
    pub fn new(keyed: KeyedBucket<String, ManualClock>) -> Self {
        let _ = keyed.available_tokens(KEY);
        let _ = keyed.try_consume(BYSTANDER, 1);
        Self { keyed }
    }
}

impl core::fmt::Debug for KeyedEngine {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyedEngine")
            .field("keyed", &self.keyed)
            .finish()
    }
}

impl Engine for KeyedEngine {
    fn execute(&mut self, op: &Op) -> Result<Value, String> {
        let b = &self.keyed;
        let e = |e: KeyedError| e.to_string();
        let out = match op {
            Op::TryConsume(n) => Value::from(b.try_consume(KEY, *n).map_err(e)?),
            Op::TryConsumeAndReturnRemaining(n) => {
                outcome::probe(&b.try_consume_and_return_remaining(KEY, *n).map_err(e)?)
            }
            Op::EstimateAbilityToConsume(n) => {
                outcome::estimate(&b.estimate_ability_to_consume(KEY, *n).map_err(e)?)
            }
            Op::TryConsumeAsMuchAsPossible(l) => {
                Value::from(b.execute(KEY, TryConsumeAsMuchAsPossible(*l)).map_err(e)?)
            }
            Op::AddTokens(n) => {
                b.add_tokens(KEY, *n).map_err(e)?;
                outcome::unit()
            }
            Op::ForceAddTokens(n) => {
                b.force_add_tokens(KEY, *n).map_err(e)?;
                outcome::unit()
            }
            Op::Reset => {
                b.reset(KEY).map_err(e)?;
                outcome::unit()
            }
            Op::AvailableTokens => Value::from(b.available_tokens(KEY).map_err(e)?),
            Op::ConsumeIgnoringRateLimits(n) => {
                Value::from(b.execute(KEY, ConsumeIgnoringRateLimits(*n)).map_err(e)?)
            }
            Op::ReplaceConfiguration(c, s) => {
                b.replace_configuration(KEY, c.clone(), *s).map_err(e)?;
                outcome::unit()
            }
            Op::BlockingTryConsume {
                tokens,
                max_wait_nanos,
            } => {
                let parked = b
                    .execute(
                        KEY,
                        Reserve {
                            tokens: *tokens,
                            max_wait_nanos: *max_wait_nanos,
                        },
                    )
                    .map_err(e)?;
                if let Some(w) = parked {
                    b.clock().advance_nanos(w as i64);
                }
                outcome::blocking_try(parked)
            }
            Op::BlockingConsume(n) => {
                let w = b.execute(KEY, ConsumeIgnoringRateLimits(*n)).map_err(e)?;
                b.clock().advance_nanos(w as i64);
                outcome::blocking(w)
            }
        };
        // Whatever can be forgotten now is: the next step must not notice.
        b.sweep();
        Ok(out)
    }

    fn snapshot(&mut self) -> String {
        format!(
            "{:?} / {:?}",
            self.keyed.snapshot(KEY),
            self.keyed.snapshot(BYSTANDER)
        )
    }
}
