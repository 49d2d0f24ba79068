//! Building a bucket: both ways to add a limit, several limits on one bucket, initial tokens
//! and ids, a configuration built on its own, and the typed errors of a bad configuration.
//!
//! ```text
//! cargo run -p bucket4rs-examples --example builder
//! ```

use std::io::Write;
use std::time::Duration;

use bucket4rs::{Bandwidth, Bucket, BucketConfiguration, ConfigError, ManualClock};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

fn run(out: &mut dyn Write) -> Outcome {
    let clock = ManualClock::new(0); // a clock that moves only when told to (see manual_clock)

    // A limit configured by a closure on the bandwidth builder: 10 tokens, refilled greedily
    // at 10 per minute (one token every 6 s).
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(60)))
        .with_clock(clock.clone())
        .build()?;
    writeln!(
        out,
        "10 per minute: {} tokens available",
        bucket.available_tokens()
    )?;

    // Several limits: a request is served only when every one of them has the tokens. A
    // prebuilt bandwidth goes to `add_bandwidth`; this one starts with 5 tokens, not 50.
    let burst = Bandwidth::builder()
        .capacity(50)
        .refill_greedy(50, Duration::from_secs(1))
        .initial_tokens(5)
        .id("burst")
        .build()?;
    let config = BucketConfiguration::builder()
        .add_bandwidth(burst)
        .add_limit(|l| {
            l.capacity(1_000)
                .refill_intervally(1_000, Duration::from_secs(3600))
                .id("hourly")
        })
        .build()?;
    let bucket = Bucket::builder()
        .with_configuration(&config)
        .with_clock(clock.clone())
        .build()?;
    let ids: Vec<_> = config.bandwidths().iter().map(|b| b.id()).collect();
    writeln!(out, "two limits {ids:?}")?;
    let v = bucket.as_verbose().available_tokens();
    writeln!(
        out,
        "available: {} (per limit {:?})",
        v.value(),
        v.available_tokens_per_bandwidth()
    )?;
    clock.advance(Duration::from_millis(100)); // 50 per second: 5 more tokens in 100 ms
    bucket.try_consume(10)?;
    let v = bucket.as_verbose().available_tokens();
    writeln!(
        out,
        "100 ms later, after taking 10: {} (per limit {:?})",
        v.value(),
        v.available_tokens_per_bandwidth()
    )?;

    // Bad configurations are typed errors from `build()`: a limit added by a closure that
    // does not build is reported there, so one `?` covers the whole chain.
    let secs = Duration::from_secs;
    let errors: [(&str, Result<BucketConfiguration, ConfigError>); 4] = [
        (
            "zero capacity",
            BucketConfiguration::builder()
                .add_limit(|l| l.capacity(0).refill_greedy(1, secs(1)))
                .build(),
        ),
        (
            "refill faster than 1 token per ns",
            BucketConfiguration::builder()
                .add_limit(|l| l.capacity(10).refill_greedy(2_000_000_000, secs(1)))
                .build(),
        ),
        (
            "the same id twice",
            BucketConfiguration::builder()
                .add_limit(|l| l.capacity(1).refill_greedy(1, secs(1)).id("a"))
                .add_limit(|l| l.capacity(2).refill_greedy(2, secs(1)).id("a"))
                .build(),
        ),
        ("no limit at all", BucketConfiguration::builder().build()),
    ];
    for (what, result) in errors {
        match result {
            Ok(_) => writeln!(out, "{what}: accepted?")?,
            Err(e) => writeln!(out, "{what}: {e} ({e:?})")?,
        }
    }
    // Aligned refill needs a wall-clock based clock; this manual clock is not one.
    let aligned = Bucket::builder()
        .add_limit(|l| {
            l.capacity(1)
                .refill_intervally_aligned(1, secs(60), secs(0))
        })
        .with_clock(clock)
        .build();
    if let Err(e) = aligned {
        writeln!(out, "aligned refill on a non-wall clock: {e:?}")?;
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
                "10 per minute: 10 tokens available",
                r#"two limits [Some("burst"), Some("hourly")]"#,
                "available: 5 (per limit [5, 1000])",
                "100 ms later, after taking 10: 0 (per limit [0, 990])",
                "zero capacity: capacity must be at least 1 (ZeroCapacity)",
                "refill faster than 1 token per ns: ",
                "RefillRateTooHigh",
                "the same id twice: ",
                "DuplicateId",
                "no limit at all: ",
                "NoBandwidths",
                "aligned refill on a non-wall clock: AlignedRefillNeedsWallClock",
            ],
        );
    }
}
