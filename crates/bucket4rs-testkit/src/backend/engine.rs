//! The `conformance` check: every trace through a remote bucket on the store.

use core::time::Duration;
use std::sync::Arc;

use bucket4rs_core::{BucketConfiguration, Clock, ManualClock};
use bucket4rs_distributed::{Backend, DistributedError, Leasing, RemoteBucket, TimeSource};
use serde_json::Value;
use tokio::runtime::Runtime;

use super::Ctx;
use crate::conformance::{Engine, Op, outcome, replay_all};

/// A remote bucket driven by the trace replayer; its manager computes on the trace's clock.
struct Remote<'r, B> {
    bucket: RemoteBucket<Arc<B>>,
    backend: Arc<B>,
    clock: ManualClock,
    rt: &'r Runtime,
    leased: bool,
}

fn e(e: DistributedError) -> String {
    e.to_string()
}

/// A wait in the traces' unit.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<B: Backend> Engine for Remote<'_, B> {
    fn execute(&mut self, op: &Op) -> Result<Value, String> {
        let b = &self.bucket;
        self.rt.block_on(async {
            Ok(match op {
                Op::TryConsume(n) => Value::from(b.try_consume(*n).await.map_err(e)?),
                Op::TryConsumeAndReturnRemaining(n) => {
                    outcome::probe(&b.try_consume_and_return_remaining(*n).await.map_err(e)?)
                }
                Op::EstimateAbilityToConsume(n) => {
                    outcome::estimate(&b.estimate_ability_to_consume(*n).await.map_err(e)?)
                }
                Op::TryConsumeAsMuchAsPossible(None) => {
                    Value::from(b.try_consume_as_much_as_possible().await.map_err(e)?)
                }
                Op::TryConsumeAsMuchAsPossible(Some(l)) => Value::from(
                    b.try_consume_as_much_as_possible_with_limit(*l)
                        .await
                        .map_err(e)?,
                ),
                Op::AddTokens(n) => {
                    b.add_tokens(*n).await.map_err(e)?;
                    outcome::unit()
                }
                Op::ForceAddTokens(n) => {
                    b.force_add_tokens(*n).await.map_err(e)?;
                    outcome::unit()
                }
                Op::Reset => {
                    b.reset().await.map_err(e)?;
                    outcome::unit()
                }
                Op::AvailableTokens => Value::from(b.available_tokens().await.map_err(e)?),
                Op::ConsumeIgnoringRateLimits(n) => {
                    Value::from(nanos(b.consume_ignoring_rate_limits(*n).await.map_err(e)?))
                }
                Op::ReplaceConfiguration(c, s) => {
                    b.replace_configuration(c.clone(), *s).await.map_err(e)?;
                    outcome::unit()
                }
                Op::BlockingTryConsume {
                    tokens,
                    max_wait_nanos,
                } => {
                    let parked = b
                        .reserve(*tokens, Duration::from_nanos(*max_wait_nanos))
                        .await
                        .map_err(e)?
                        .map(nanos);
                    if let Some(w) = parked {
                        self.clock
                            .advance_nanos(i64::try_from(w).unwrap_or(i64::MAX));
                    }
                    outcome::blocking_try(parked)
                }
                Op::BlockingConsume(n) => {
                    let w = nanos(b.consume_ignoring_rate_limits(*n).await.map_err(e)?);
                    self.clock
                        .advance_nanos(i64::try_from(w).unwrap_or(i64::MAX));
                    outcome::blocking(w)
                }
            })
        })
    }

    fn snapshot(&mut self) -> String {
        if self.leased {
            // What the bucket answers, not the stored record: a leased bucket's record holds
            // less than the bucket (its lease is out), and a round trip's return of the lease
            // changes the record, never an answer.
            return match self
                .rt
                .block_on(self.bucket.as_verbose().available_tokens())
            {
                Ok(r) => format!("{:?} {:?}", r.configuration(), r.state()),
                Err(err) => format!("error: {err}"),
            };
        }
        match self
            .rt
            .block_on(super::raw(&*self.backend, self.bucket.key()))
        {
            Ok(Some(bytes)) => format!("{bytes:02x?}"),
            Ok(None) => "absent".into(),
            Err(err) => format!("error: {err}"),
        }
    }
}

/// Replays every trace through remote buckets on one client of the store, each trace on a
/// key of its own and a manager on the trace's manual clock (its bucket created at the
/// trace's start). `leased`: the buckets lease (one process: it answers exactly as an
/// unleased bucket, from its lease and what it saw of the bucket).
pub(super) fn conformance<B: Backend>(
    rt: &Runtime,
    ctx: &Ctx<B>,
    leased: bool,
) -> Result<String, String> {
    let backend = rt.block_on(ctx.connect())?;
    let mut n = 0;
    let label = if leased {
        format!("{} leased", ctx.name)
    } else {
        ctx.name.clone()
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        replay_all(&label, |config, clock| {
            n += 1;
            build(rt, ctx, Arc::clone(&backend), n, config, clock, leased)
        });
    }));
    match result {
        Ok(()) => Ok(format!("{n} buckets built, every step as recorded")),
        Err(p) => Err(p
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a trace failed".into())),
    }
}

fn build<'r, B: Backend>(
    rt: &'r Runtime,
    ctx: &Ctx<B>,
    backend: Arc<B>,
    n: usize,
    config: BucketConfiguration,
    clock: ManualClock,
    leased: bool,
) -> Result<Remote<'r, B>, String> {
    config
        .check_clock(clock.is_wall_clock_based())
        .map_err(|e| e.to_string())?;
    // Semantics are checked here, not latency: a patient timeout, so one slow answer of a
    // shared server on a loaded machine does not fail a whole replay.
    let manager = ctx
        .manager(Arc::clone(&backend), if leased { "leased" } else { "conf" })
        .time_source(TimeSource::client(clock.clone()))
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(e)?;
    let bucket = manager
        .builder()
        .leasing(leased.then(Leasing::new))
        .build(format!("t{n}"), move || config.clone())
        .map_err(e)?;
    rt.block_on(bucket.available_tokens()).map_err(e)?;
    Ok(Remote {
        bucket,
        backend,
        clock,
        rt,
        leased,
    })
}
