//! A batch job throttled to N items per second with the blocking view: each item waits for
//! its token instead of failing, and a second worker queues behind the first.
//!
//! ```text
//! cargo run --release -p bucket4rs-examples --example batch_job
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use bucket4rs_blocking::{BlockingBucketExt, CancelToken, WaitError};
use bucket4rs_local::Bucket;

const ITEMS_PER_SECOND: u64 = 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
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

    // Two workers share the limit; 30 items in all.
    std::thread::scope(|s| {
        for worker in ["A", "B"] {
            let bucket = Arc::clone(&bucket);
            s.spawn(move || -> Result<(), bucket4rs_local::OperationError> {
                for item in 0..15 {
                    bucket.as_blocking().consume(1)?; // parks the thread; never spins
                    println!(
                        "{:>7.3} s  worker {worker} processed item {item:>2}  (balance {:>3})",
                        start.elapsed().as_secs_f64(),
                        bucket.available_tokens()
                    );
                }
                Ok(())
            });
        }
    });
    let elapsed = start.elapsed();
    println!(
        "30 items in {:.2} s: {:.1} items/s after the burst of 5 (limit {ITEMS_PER_SECOND}/s)",
        elapsed.as_secs_f64(),
        25.0 / elapsed.as_secs_f64()
    );

    // A big chunk is allowed: the debt is paid by waiting, and later callers see it.
    let blocking = bucket.as_blocking();
    let t = Instant::now();
    blocking.consume(10)?;
    println!(
        "a chunk of 10 items waited {:.2} s",
        t.elapsed().as_secs_f64()
    );

    // Give up instead of waiting too long.
    let accepted = blocking.try_consume(20, Duration::from_millis(100))?;
    println!("20 more within 100 ms? {accepted} (it would take 1 s)");

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
        Err(WaitError::Interrupted) => println!(
            "a 2 s wait for 40 items was cancelled after ~50 ms; balance {before} before, {} after (all 40 given back; ~1 refilled meanwhile)",
            bucket.available_tokens()
        ),
        other => println!("unexpected: {other:?}"),
    }
    Ok(())
}
