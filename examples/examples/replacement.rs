//! Replacing a bucket's configuration on the fly (a customer upgrades their plan): the four
//! ways tokens carry over, and bandwidth ids, which say which old limit becomes which new one.
//!
//! ```text
//! cargo run -p bucket4rs-examples --example replacement
//! ```

use std::io::Write;
use std::time::Duration;

use bucket4rs::{Bucket, BucketConfiguration, ManualClock, TokensInheritanceStrategy};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

fn per_minute(n: u64) -> Result<BucketConfiguration, bucket4rs::ConfigError> {
    BucketConfiguration::builder()
        .add_limit(|l| l.capacity(n).refill_greedy(n, Duration::from_secs(60)))
        .build()
}

fn run(out: &mut dyn Write) -> Outcome {
    let strategies = [
        TokensInheritanceStrategy::Proportionally,
        TokensInheritanceStrategy::AsIs,
        TokensInheritanceStrategy::Additive,
        TokensInheritanceStrategy::Reset,
    ];
    // 100 per minute with 40 tokens left, replaced by 200 per minute, then by 30 per minute.
    for new_capacity in [200, 30] {
        writeln!(
            out,
            "100 per minute, 40 left, replaced by {new_capacity} per minute:"
        )?;
        for strategy in strategies {
            let bucket = Bucket::builder()
                .with_configuration(&per_minute(100)?)
                .with_clock(ManualClock::new(0))
                .build()?;
            bucket.try_consume(60)?;
            bucket.replace_configuration(per_minute(new_capacity)?, strategy)?;
            writeln!(out, "  {strategy:?}: {}", bucket.available_tokens())?;
        }
    }

    // Several limits: the ids match old to new; a new limit without a match starts as a new
    // bucket would (full), and an old one without a match is dropped.
    let clock = ManualClock::new(0);
    let bucket = Bucket::builder()
        .add_limit(|l| {
            l.capacity(100)
                .refill_greedy(100, Duration::from_secs(60))
                .id("minute")
        })
        .add_limit(|l| {
            l.capacity(1_000)
                .refill_greedy(1_000, Duration::from_secs(3600))
                .id("hour")
        })
        .with_clock(clock)
        .build()?;
    bucket.try_consume(60)?;
    let before = bucket.as_verbose().available_tokens();
    writeln!(
        out,
        "minute and hour, after 60 requests: {:?}",
        before.available_tokens_per_bandwidth()
    )?;
    let upgraded = BucketConfiguration::builder()
        .add_limit(|l| {
            l.capacity(10_000)
                .refill_greedy(10_000, Duration::from_secs(86_400))
                .id("day")
        })
        .add_limit(|l| {
            l.capacity(2_000)
                .refill_greedy(2_000, Duration::from_secs(3600))
                .id("hour")
        })
        .build()?;
    bucket.replace_configuration(upgraded, TokensInheritanceStrategy::AsIs)?;
    let after = bucket.as_verbose().available_tokens();
    let ids: Vec<_> = after
        .configuration()
        .bandwidths()
        .iter()
        .map(|b| b.id().unwrap_or("?"))
        .collect();
    writeln!(
        out,
        "replaced by day and hour (AsIs): {ids:?} = {:?}",
        after.available_tokens_per_bandwidth()
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
                "replaced by 200 per minute:",
                "  Proportionally: 80",
                "  AsIs: 40",
                "  Additive: 140",
                "  Reset: 200",
                "replaced by 30 per minute:",
                "  Proportionally: 12",
                "  AsIs: 30",
                "  Additive: 30",
                "  Reset: 30",
                "minute and hour, after 60 requests: [40, 940]",
                r#"replaced by day and hour (AsIs): ["day", "hour"] = [10000, 940]"#,
            ],
        );
    }
}
