//! A controllable clock: `ManualClock` moves only when told to, which makes refill visible
//! step by step. Greedy refill adds tokens continuously, interval refill all at once per
//! period, aligned interval refill on a grid of wall-clock time; and every wait is exact.
//!
//! ```text
//! cargo run -p bucket4rs-examples --example manual_clock
//! ```

use std::io::Write;
use std::time::Duration;

use bucket4rs::{Bucket, Clock, ManualClock};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

fn run(out: &mut dyn Write) -> Outcome {
    let clock = ManualClock::new(0); // clones share the reading
    let greedy = Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(10)))
        .with_clock(clock.clone())
        .build()?;
    let interval = Bucket::builder()
        .add_limit(|l| {
            l.capacity(10)
                .refill_intervally(10, Duration::from_secs(10))
        })
        .with_clock(clock.clone())
        .build()?;
    greedy.try_consume(10)?;
    interval.try_consume(10)?;
    for (label, by) in [
        ("2.5 s", Duration::from_millis(2500)),
        ("9.999 s", Duration::from_millis(7499)),
        ("10 s", Duration::from_millis(1)),
    ] {
        clock.advance(by);
        writeln!(
            out,
            "after {label}: greedy {}, interval {}",
            greedy.available_tokens(),
            interval.available_tokens()
        )?;
    }

    // Exact waits: waiting the reported time is enough, one nanosecond less is not.
    greedy.try_consume(10)?;
    let probe = greedy.try_consume_and_return_remaining(3)?;
    let wait = probe.wait_for_refill().as_nanos() as u64;
    clock.advance_nanos(i64::try_from(wait)? - 1);
    let early = greedy.try_consume(3)?;
    clock.advance_nanos(1);
    let on_time = greedy.try_consume(3)?;
    writeln!(
        out,
        "3 tokens in {:?}: 1 ns early {early}, on time {on_time}",
        Duration::from_nanos(wait)
    )?;

    // Aligned refill: 10 tokens at the start of every minute of wall-clock time. The manual
    // clock declares itself wall-clock based; it starts 15 s into a minute.
    let minute = 1_700_000_040; // a whole minute, in seconds since the epoch
    let wall = ManualClock::wall_clock((minute + 15) * 1_000_000_000);
    let aligned = Bucket::builder()
        .add_limit(|l| {
            l.capacity(10).refill_intervally_aligned(
                10,
                Duration::from_secs(60),
                Duration::from_secs(minute as u64),
            )
        })
        .with_clock(wall.clone())
        .build()?;
    aligned.try_consume(10)?;
    let wait = aligned.estimate_ability_to_consume(1)?.wait_for_refill();
    writeln!(
        out,
        "aligned, 15 s into the minute: next refill in {wait:?}"
    )?;
    wall.advance(wait);
    writeln!(
        out,
        "at the minute ({} s since the epoch): {} tokens",
        wall.now_nanos() / 1_000_000_000,
        aligned.available_tokens()
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
                "after 2.5 s: greedy 2, interval 0",
                "after 9.999 s: greedy 9, interval 0",
                "after 10 s: greedy 10, interval 10",
                "3 tokens in 3s: 1 ns early false, on time true",
                "aligned, 15 s into the minute: next refill in 45s",
                "at the minute (1700000100 s since the epoch): 10 tokens",
            ],
        );
    }
}
