//! Quick start: a bucket with two limits, driven by a manual clock so the output is the same
//! on every run.
//!
//! ```text
//! cargo run --release -p bucket4rs-examples --example quickstart
//! ```
//!
//! This uses the pure core directly: a `BucketConfiguration` (shared, immutable), a
//! `BucketState` (the tokens), and the clock reading passed to every call. The buckets of
//! `bucket4rs-local` wrap exactly this, with a real clock and thread-safe state.

use core::time::Duration;
use std::io::Write;

use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, Clock, ManualClock, ops};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

fn run(out: &mut dyn Write) -> Outcome {
    // 5 requests per second with bursts of up to 5, and at most 20 per minute on top.
    let config = BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1))?)
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(20)
                .refill_intervally(20, Duration::from_secs(60))
                .id("per-minute")
                .build()?,
        )
        .build()?;
    let clock = ManualClock::new(0);
    let mut state = BucketState::new(&config, clock.now_nanos());

    writeln!(
        out,
        "limits: 5 per second (greedy refill) and 20 per minute (refilled each minute)\n"
    )?;

    let mut served = 0; // tokens consumed, for the per-minute count at the end

    writeln!(out, "a burst of 7 requests at once:")?;
    for request in 1..=7 {
        let probe = state.apply(
            &config,
            clock.now_nanos(),
            &ops::TryConsumeAndReturnRemaining(1),
        )?;
        if probe.is_consumed() {
            served += 1;
            writeln!(
                out,
                "  {} request {request}: allowed, {} left",
                at(&clock),
                probe.remaining_tokens()
            )?;
        } else {
            writeln!(
                out,
                "  {} request {request}: denied, retry after {:?}",
                at(&clock),
                probe.wait_for_refill()
            )?;
        }
    }

    // A denied probe's wait is exact: one nanosecond earlier is still too early.
    let wait = state
        .apply(
            &config,
            clock.now_nanos(),
            &ops::EstimateAbilityToConsume(1),
        )?
        .wait_for_refill()
        .as_nanos() as u64;
    clock.advance_nanos(wait as i64 - 1);
    let early = state.apply(&config, clock.now_nanos(), &ops::TryConsume(1))?;
    clock.advance_nanos(1);
    let on_time = state.apply(&config, clock.now_nanos(), &ops::TryConsume(1))?;
    served += u64::from(early) + u64::from(on_time);
    writeln!(out, "\nwaiting exactly {:?}:", Duration::from_nanos(wait))?;
    writeln!(
        out,
        "  1 ns early: allowed = {early}; on time: allowed = {on_time}"
    )?;

    clock.advance(Duration::from_millis(700));
    let estimate = state.apply(
        &config,
        clock.now_nanos(),
        &ops::EstimateAbilityToConsume(5),
    )?;
    writeln!(
        out,
        "\n{} can 5 be consumed? {} ({} available, wait {:?})",
        at(&clock),
        estimate.can_be_consumed(),
        estimate.remaining_tokens(),
        estimate.wait_for_refill()
    )?;
    let taken = state.apply(
        &config,
        clock.now_nanos(),
        &ops::TryConsumeAsMuchAsPossible(None),
    )?;
    writeln!(out, "{} took as much as possible: {taken}", at(&clock))?;

    writeln!(
        out,
        "\na steady 5 per second until the per-minute limit bites:"
    )?;
    served += taken;
    loop {
        clock.advance(Duration::from_millis(200));
        let probe = state.apply(
            &config,
            clock.now_nanos(),
            &ops::TryConsumeAndReturnRemaining(1),
        )?;
        if !probe.is_consumed() {
            writeln!(
                out,
                "  {} denied: {served} tokens served this minute; next token in {:?}",
                at(&clock),
                probe.wait_for_refill()
            )?;
            break;
        }
        served += 1;
    }
    clock.advance(Duration::from_nanos(
        state
            .apply(
                &config,
                clock.now_nanos(),
                &ops::EstimateAbilityToConsume(1),
            )?
            .wait_for_refill()
            .as_nanos() as u64,
    ));
    writeln!(
        out,
        "  {} the minute is over: {} tokens available",
        at(&clock),
        state.available_tokens(&config, clock.now_nanos())
    )?;
    Ok(())
}

/// The clock reading as `t=1.234s`.
fn at(clock: &ManualClock) -> String {
    let nanos = clock.now_nanos();
    format!(
        "t={}.{:03}s",
        nanos / 1_000_000_000,
        nanos % 1_000_000_000 / 1_000_000
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn prints_the_same_on_every_run() {
        let text = bucket4rs_examples::output_of(super::run);
        bucket4rs_examples::assert_prints(
            &text,
            &[
                "t=0.000s request 5: allowed, 0 left",
                "t=0.000s request 6: denied, retry after 200ms",
                "1 ns early: allowed = false; on time: allowed = true",
            ],
        );
    }
}
