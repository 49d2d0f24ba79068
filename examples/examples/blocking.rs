//! Blocking consumption (Bucket4j's `asBlocking()`): a call waits on its thread until its
//! tokens are paid for. The tokens are reserved first, so callers queue in order and a request
//! may exceed the capacity; a park strategy decides how the thread waits, and a cancel token
//! stands in for Java's thread interrupt.
//!
//! Most of this runs on a manual clock with `ManualClockPark` (which advances the clock
//! instead of sleeping), so every wait printed is exact; the last part sleeps for real.
//!
//! ```text
//! cargo run -p bucket4rs-examples --example blocking
//! ```

use std::io::Write;
use std::time::{Duration, Instant};

use bucket4rs::blocking::{BlockingBucketExt, CancelToken, ManualClockPark, WaitError};
use bucket4rs::{Bucket, ManualClock};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

fn run(out: &mut dyn Write) -> Outcome {
    // 10 tokens, one every 100 ms.
    let clock = ManualClock::new(0);
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
        .with_clock(clock.clone())
        .build()?;
    let park = ManualClockPark::new(clock.clone());
    let blocking = bucket.as_blocking();

    blocking.consume_with(10, &park)?;
    writeln!(out, "consume(10): parked {:?}", park.take_parks())?;
    blocking.consume_with(5, &park)?;
    writeln!(out, "consume(5): parked {:?}", park.take_parks())?;
    let taken = blocking.try_consume_with(10, Duration::from_millis(500), &park)?;
    writeln!(
        out,
        "try_consume(10, at most 500 ms): {taken} (it needs 1 s), parked {:?}",
        park.take_parks()
    )?;
    let taken = blocking.try_consume_with(2, Duration::from_secs(1), &park)?;
    writeln!(
        out,
        "try_consume(2, at most 1 s): {taken}, parked {:?}",
        park.take_parks()
    )?;

    // More than the capacity: the debt is paid by waiting.
    blocking.consume_with(25, &park)?;
    writeln!(out, "consume(25): parked {:?}", park.take_parks())?;

    // Verbose: the result of the reservation, before the park.
    let r = blocking.as_verbose().consume_with(3, &park)?;
    writeln!(
        out,
        "verbose consume(3): parked {:?}, {} tokens at the reservation",
        r.value(),
        r.available_tokens()
    )?;

    // Cancelling: Rust threads have no interrupt; a cancel token makes the wait fail, and the
    // reserved tokens are given back.
    let token = CancelToken::new();
    let before = bucket.available_tokens();
    let waited = std::thread::scope(|s| {
        s.spawn(|| token.cancel()); // another thread gives up on the wait
        let reserved = bucket.as_blocking();
        // Waits until the token is cancelled (a 40 s wait otherwise): the token, not the
        // manual clock, parks this thread.
        reserved.consume_with(400, &token)
    });
    match waited {
        Err(WaitError::Interrupted) => writeln!(
            out,
            "a cancelled consume(400): interrupted; {before} tokens before, {} after",
            bucket.available_tokens()
        )?,
        other => writeln!(out, "a cancelled consume(400): {other:?}?")?,
    }

    // For real: `consume` parks the thread (never spins) with the default strategy.
    let real = Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_millis(100)))
        .build()?;
    let start = Instant::now();
    real.as_blocking().consume(12)?; // 2 tokens of debt: 20 ms
    let waited = start.elapsed() >= Duration::from_millis(19);
    writeln!(
        out,
        "a real consume(12) on 100 per second waited 20 ms: {waited}"
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
                "consume(10): parked []",
                "consume(5): parked [500ms]",
                "try_consume(10, at most 500 ms): false (it needs 1 s), parked []",
                "try_consume(2, at most 1 s): true, parked [200ms]",
                "consume(25): parked [2.5s]",
                "verbose consume(3): parked 300ms, -3 tokens at the reservation",
                "a cancelled consume(400): interrupted; 0 tokens before, 0 after",
                "a real consume(12) on 100 per second waited 20 ms: true",
            ],
        );
    }
}
