//! The verbose API: every operation also answers the configuration, the state it left and
//! diagnostics (tokens overall and per limit, time until full), which is what rate-limit
//! response headers are made of.
//!
//! ```text
//! cargo run -p bucket4rs-examples --example verbose_headers
//! ```

use std::io::Write;
use std::time::Duration;

use bucket4rs::{Bucket, ConsumptionProbe, ManualClock, VerboseResult};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

/// The headers of Bucket4j's HTTP examples, and a per-limit breakdown, from a verbose probe.
fn headers(r: &VerboseResult<ConsumptionProbe>) -> Vec<String> {
    let probe = r.value();
    let mut h = vec![format!(
        "X-Rate-Limit-Remaining: {}",
        probe.remaining_tokens()
    )];
    if let Some(secs) = probe.retry_after_secs() {
        h.push(format!("X-Rate-Limit-Retry-After-Seconds: {secs}"));
    }
    let ids = r.configuration().bandwidths().iter().map(|b| b.id());
    let per_limit: Vec<String> = ids
        .zip(r.available_tokens_per_bandwidth())
        .map(|(id, tokens)| format!("{}={tokens}", id.unwrap_or("?")))
        .collect();
    h.push(format!("X-Rate-Limit-Per-Limit: {}", per_limit.join(", ")));
    h.push(format!(
        "X-Rate-Limit-Full-In-Seconds: {}",
        r.time_until_full().as_secs()
    ));
    h
}

fn run(out: &mut dyn Write) -> Outcome {
    // 20 requests a minute (one every 3 s) and 100 an hour (one every 36 s).
    let clock = ManualClock::new(0);
    let bucket = Bucket::builder()
        .add_limit(|l| {
            l.capacity(20)
                .refill_greedy(20, Duration::from_secs(60))
                .id("minute")
        })
        .add_limit(|l| {
            l.capacity(100)
                .refill_greedy(100, Duration::from_secs(3600))
                .id("hour")
        })
        .with_clock(clock.clone())
        .build()?;
    let verbose = bucket.as_verbose();

    let first = verbose.try_consume_and_return_remaining(1)?;
    writeln!(out, "request 1: {}", headers(&first).join("; "))?;
    for _ in 2..=20 {
        verbose.try_consume_and_return_remaining(1)?;
    }
    let refused = verbose.try_consume_and_return_remaining(1)?;
    writeln!(
        out,
        "request 21: consumed {}; {}",
        refused.value().is_consumed(),
        headers(&refused).join("; ")
    )?;
    writeln!(
        out,
        "  operation time {} ns; state: {} bandwidths",
        refused.now_nanos(),
        refused.state().bandwidths().len()
    )?;

    // Every other operation has its verbose form too.
    clock.advance(Duration::from_secs(3));
    let added = verbose.add_tokens(1)?;
    writeln!(
        out,
        "3 s later, add_tokens(1): per limit {:?}",
        added.available_tokens_per_bandwidth()
    )?;
    let drained = verbose.try_consume_as_much_as_possible_with_limit(10)?;
    writeln!(
        out,
        "as much as possible (at most 10): took {}, {} left",
        drained.value(),
        drained.available_tokens()
    )?;
    let reset = verbose.reset();
    writeln!(
        out,
        "reset: per limit {:?}, full in {:?}",
        reset.available_tokens_per_bandwidth(),
        reset.time_until_full()
    )?;
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
                "request 1: X-Rate-Limit-Remaining: 19; X-Rate-Limit-Per-Limit: minute=19, hour=99; X-Rate-Limit-Full-In-Seconds: 36",
                "request 21: consumed false; X-Rate-Limit-Remaining: 0; X-Rate-Limit-Retry-After-Seconds: 3; X-Rate-Limit-Per-Limit: minute=0, hour=80; X-Rate-Limit-Full-In-Seconds: 720",
                "operation time 0 ns; state: 2 bandwidths",
                "3 s later, add_tokens(1): per limit [2, 81]",
                "as much as possible (at most 10): took 2, 0 left",
                "reset: per limit [20, 100], full in 0ns",
            ],
        );
    }
}
