//! Consuming and probing: `try_consume`, the consumption probe (remaining tokens, the wait
//! for refill and for reset), estimates that take nothing, "as much as possible", adding,
//! force-adding and resetting tokens, and consuming into debt.
//!
//! ```text
//! cargo run -p bucket4rs-examples --example probes
//! ```

use std::io::Write;
use std::time::Duration;

use bucket4rs::{Bucket, ManualClock};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

fn run(out: &mut dyn Write) -> Outcome {
    // 10 tokens, refilled greedily at 10 per second: one token every 100 ms.
    let clock = ManualClock::new(0);
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
        .with_clock(clock.clone())
        .build()?;

    writeln!(out, "try_consume(1): {}", bucket.try_consume(1)?)?;
    writeln!(out, "available: {}", bucket.available_tokens())?;

    let probe = bucket.try_consume_and_return_remaining(5)?;
    writeln!(
        out,
        "probe for 5: consumed {}, remaining {}, full again in {:?}",
        probe.is_consumed(),
        probe.remaining_tokens(),
        probe.wait_for_reset()
    )?;
    let probe = bucket.try_consume_and_return_remaining(7)?;
    writeln!(
        out,
        "probe for 7: consumed {}, remaining {}, retry in {:?}",
        probe.is_consumed(),
        probe.remaining_tokens(),
        probe.wait_for_refill()
    )?;
    let probe = bucket.try_consume_and_return_remaining(11)?;
    writeln!(
        out,
        "probe for 11 (above the capacity): never possible {}, wait {} ns",
        probe.is_never_possible(),
        probe.wait_for_refill().as_nanos() as u64
    )?;

    let estimate = bucket.estimate_ability_to_consume(10)?;
    writeln!(
        out,
        "estimate for 10: can {}, wait {:?}; still {} available (an estimate takes nothing)",
        estimate.can_be_consumed(),
        estimate.wait_for_refill(),
        bucket.available_tokens()
    )?;

    clock.advance(Duration::from_millis(250)); // 2.5 tokens: 2 whole ones, half a token kept
    writeln!(
        out,
        "after 250 ms, as much as possible: {}",
        bucket.try_consume_as_much_as_possible()
    )?;
    clock.advance(Duration::from_secs(1));
    writeln!(
        out,
        "after 1 s more (full again), at most 3: {}; available {}",
        bucket.try_consume_as_much_as_possible_with_limit(3)?,
        bucket.available_tokens()
    )?;

    bucket.add_tokens(100)?;
    writeln!(
        out,
        "add_tokens(100): {} (never above the capacity)",
        bucket.available_tokens()
    )?;
    bucket.force_add_tokens(5)?;
    writeln!(
        out,
        "force_add_tokens(5): {} (above the capacity)",
        bucket.available_tokens()
    )?;
    bucket.try_consume(15)?;
    bucket.reset();
    writeln!(out, "after reset: {}", bucket.available_tokens())?;

    let debt = bucket.consume_ignoring_rate_limits(25)?;
    writeln!(
        out,
        "consume_ignoring_rate_limits(25): available {}, debt repaid in {debt:?}",
        bucket.available_tokens()
    )?;
    writeln!(out, "try_consume(1) in debt: {}", bucket.try_consume(1)?)?;

    // A zero count is the one argument error (a typed error, not an exception).
    if let Err(e) = bucket.try_consume(0) {
        writeln!(out, "try_consume(0): {e}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn prints_the_guide_values() {
        let text = bucket4rs_examples::output_of(super::run);
        bucket4rs_examples::assert_prints(
            &text,
            &[
                "try_consume(1): true",
                "available: 9",
                "probe for 5: consumed true, remaining 4, full again in 600ms",
                "probe for 7: consumed false, remaining 4, retry in 300ms",
                "probe for 11 (above the capacity): never possible true, wait 9223372036854775807 ns",
                "estimate for 10: can false, wait 600ms; still 4 available",
                "after 250 ms, as much as possible: 6",
                "after 1 s more (full again), at most 3: 3; available 7",
                "add_tokens(100): 10 (never above the capacity)",
                "force_add_tokens(5): 15 (above the capacity)",
                "after reset: 10",
                "consume_ignoring_rate_limits(25): available -15, debt repaid in 1.5s",
                "try_consume(1) in debt: false",
                "try_consume(0): the number of tokens must be at least 1",
            ],
        );
    }
}
