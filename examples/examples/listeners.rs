//! Listeners: counting what a bucket does, replacing or adding a listener on a view, and a
//! listener of your own. Blocking and async waits report their parks and delays too.
//!
//! ```text
//! cargo run -p bucket4rs-examples --example listeners
//! ```

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use bucket4rs::blocking::{BlockingBucketExt, ManualClockPark};
use bucket4rs::listeners::SimpleBucketListener;
use bucket4rs::{Bucket, BucketListener, ManualClock};
use bucket4rs_examples::Outcome;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

/// A listener of your own: every method has an empty default, so implement what you need.
#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl BucketListener for Log {
    fn on_rejected(&self, tokens: u64) {
        self.push(format!("rejected {tokens}"));
    }
    fn on_parked(&self, nanos: u64) {
        self.push(format!("parked {:?}", Duration::from_nanos(nanos)));
    }
}

impl Log {
    fn push(&self, line: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn run(out: &mut dyn Write) -> Outcome {
    let clock = ManualClock::new(0);
    let counts = SimpleBucketListener::new();
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(1)))
        .with_clock(clock.clone())
        .with_listener(&counts)
        .build()?;

    bucket.try_consume(3)?;
    bucket.try_consume(3)?; // refused: 2 left
    bucket.try_consume_and_return_remaining(2)?;
    bucket
        .as_blocking()
        .consume_with(1, &ManualClockPark::new(clock.clone()))?;
    writeln!(
        out,
        "tokens consumed {}, tokens rejected {}, parked {:?}",
        counts.consumed(),
        counts.rejected(),
        Duration::from_nanos(counts.parked_nanos())
    )?;

    // `to_listenable` gives a view whose listener *replaces* the bucket's (as in Bucket4j);
    // `and_listener` one that notifies both.
    let log = Log::default();
    bucket.to_listenable(&log).try_consume(10)?;
    writeln!(
        out,
        "to_listenable: log {:?}; the bucket's counter still says {} rejected",
        log.lines(),
        counts.rejected()
    )?;
    bucket.and_listener(&log).try_consume(10)?;
    writeln!(
        out,
        "and_listener: log {:?}; the counter says {} rejected",
        log.lines(),
        counts.rejected()
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
                "tokens consumed 6, tokens rejected 3, parked 200ms",
                r#"to_listenable: log ["rejected 10"]; the bucket's counter still says 3 rejected"#,
                r#"and_listener: log ["rejected 10", "rejected 10"]; the counter says 13 rejected"#,
            ],
        );
    }
}
