//! A batch job throttled to N items per second with the blocking view: each item waits for
//! its token instead of failing, and a second worker queues behind the first.
//!
//! ```text
//! cargo run --release -p bucket4rs-examples --example batch_job
//! ```

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bucket4rs_blocking::{BlockingBucketExt, CancelToken, WaitError};
use bucket4rs_examples::Outcome;
use bucket4rs_local::Bucket;

const ITEMS_PER_SECOND: u64 = 20;

fn main() -> Outcome {
    run(&mut std::io::stdout())
}

fn run(out: &mut dyn Write) -> Outcome {
    // 20 items per second, with a burst of 5 to start quickly.
    let bucket = Arc::new(
        Bucket::builder()
            .add_limit(|l| {
                l.capacity(5)
                    .refill_greedy(ITEMS_PER_SECOND, Duration::from_secs(1))
            })
            .build()?,
    );
    let start = Instant::now();

    // Two workers share the limit; 30 items in all. Each notes when it processed an item;
    // the lines are printed in time order once both are done.
    let mut log: Vec<(Duration, String)> = std::thread::scope(|s| {
        let workers: Vec<_> = ["A", "B"]
            .into_iter()
            .map(|worker| {
                let bucket = Arc::clone(&bucket);
                s.spawn(move || -> Result<Vec<(Duration, String)>, bucket4rs_local::OperationError> {
                    let mut lines = Vec::new();
                    for item in 0..15 {
                        bucket.as_blocking().consume(1)?; // parks the thread; never spins
                        let at = start.elapsed();
                        lines.push((
                            at,
                            format!(
                                "{:>7.3} s  worker {worker} processed item {item:>2}  (balance {:>3})",
                                at.as_secs_f64(),
                                bucket.available_tokens()
                            ),
                        ));
                    }
                    Ok(lines)
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            match w.join() {
                Ok(Ok(lines)) => all.extend(lines),
                Ok(Err(e)) => all.push((Duration::MAX, format!("a worker failed: {e}"))),
                Err(_) => all.push((Duration::MAX, "a worker panicked".to_owned())),
            }
        }
        all
    });
    log.sort();
    for (_, line) in &log {
        writeln!(out, "{line}")?;
    }
    let elapsed = start.elapsed();
    writeln!(
        out,
        "30 items in {:.2} s: {:.1} items/s after the burst of 5 (limit {ITEMS_PER_SECOND}/s)",
        elapsed.as_secs_f64(),
        25.0 / elapsed.as_secs_f64()
    )?;

    // A big chunk is allowed: the debt is paid by waiting, and later callers see it.
    let blocking = bucket.as_blocking();
    let t = Instant::now();
    blocking.consume(10)?;
    writeln!(
        out,
        "a chunk of 10 items waited {:.2} s",
        t.elapsed().as_secs_f64()
    )?;

    // Give up instead of waiting too long.
    let accepted = blocking.try_consume(20, Duration::from_millis(100))?;
    writeln!(out, "20 more within 100 ms? {accepted} (it would take 1 s)")?;

    // A cancellable wait: a supervisor cancels it; the reserved tokens are given back.
    let token = CancelToken::new();
    let before = bucket.available_tokens();
    let result = std::thread::scope(|s| {
        let supervisor = token.clone();
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            supervisor.cancel();
        });
        blocking.consume_with(40, &token)
    });
    match result {
        Err(WaitError::Interrupted) => writeln!(
            out,
            "a 2 s wait for 40 items was cancelled after ~50 ms; balance {before} before, {} after (all 40 given back; ~1 refilled meanwhile)",
            bucket.available_tokens()
        )?,
        other => writeln!(out, "unexpected: {other:?}")?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Real time: the check is on what happened, not on the measured times.
    #[test]
    fn throttles_queues_and_cancels() {
        let text = bucket4rs_examples::output_of(super::run);
        bucket4rs_examples::assert_prints(&text, &["worker A processed item 14"]);
        bucket4rs_examples::assert_prints(&text, &["worker B processed item 14"]);
        bucket4rs_examples::assert_prints(
            &text,
            &[
                "30 items in ",
                "a chunk of 10 items waited ",
                "20 more within 100 ms? false (it would take 1 s)",
                "a 2 s wait for 40 items was cancelled after ~50 ms",
            ],
        );
    }
}
