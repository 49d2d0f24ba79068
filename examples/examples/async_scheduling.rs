//! Async consumption (Bucket4j's `asScheduler()`): calls await their tokens without blocking
//! the executor. A future reserves its tokens when first polled, so waiters queue in the
//! order they start; dropping a waiting future gives its tokens back.
//!
//! It runs in tokio's paused time (tokio's `test-util` feature), with the bucket on
//! `TokioClock`, so the times printed are exact; in a service, drop `start_paused` and
//! `TokioClock` (the default clock is fine).
//!
//! ```text
//! cargo run -p bucket4rs-examples --example async_scheduling
//! ```

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use bucket4rs::Bucket;
use bucket4rs::asynchronous::{AsyncBucketExt, TokioClock};
use bucket4rs_examples::Outcome;
use tokio::time::Instant;

fn main() -> Outcome {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?
        .block_on(run(&mut std::io::stdout()))
}

async fn run(out: &mut dyn Write) -> Outcome {
    // One token at a time, 10 per second: one every 100 ms.
    let bucket = Arc::new(
        Bucket::builder()
            .add_limit(|l| l.capacity(1).refill_greedy(10, Duration::from_secs(1)))
            .with_clock(TokioClock::new())
            .build()?,
    );
    let start = Instant::now();

    // Five tasks ask for a token at once: they are served one every 100 ms, in order.
    let tasks: Vec<_> = (1..=5)
        .map(|n| {
            let bucket = Arc::clone(&bucket);
            tokio::spawn(async move {
                bucket
                    .as_async()
                    .consume(1)
                    .await
                    .map(|_waited| (n, start.elapsed()))
            })
        })
        .collect();
    for task in tasks {
        let (n, at) = task.await??;
        writeln!(out, "task {n} served at {at:?}")?;
    }

    // A future does nothing until polled: the reservation happens at the first `.await`.
    // (The view must outlive the future: `let f = bucket.as_async().consume(1);` would be
    // E0716, a borrowed temporary.)
    let limiter = bucket.as_async();
    let pending = limiter.consume(1);
    writeln!(
        out,
        "a future made, not polled: {} available",
        bucket.available_tokens()
    )?;
    let before = start.elapsed();
    pending.await?;
    writeln!(out, "awaited: served after {:?}", start.elapsed() - before)?;

    // Give up instead of waiting longer than 50 ms (the next token is 100 ms away).
    let served = limiter.try_consume(1, Duration::from_millis(50)).await?;
    writeln!(out, "try_consume(1, at most 50 ms): {served}")?;

    // Cancellation safety: a wait dropped by a timeout gives its tokens back.
    let before = bucket.available_tokens();
    let cut = tokio::time::timeout(Duration::from_millis(10), limiter.consume(3)).await;
    writeln!(
        out,
        "consume(3) dropped after 10 ms: {}; {before} tokens before, {} after",
        if cut.is_err() {
            "timed out"
        } else {
            "completed"
        },
        bucket.available_tokens()
    )?;

    // Verbose: the result of the reservation, and how long the call slept.
    tokio::time::sleep(Duration::from_secs(1)).await; // full again
    let r = limiter.as_verbose().consume(3).await?;
    writeln!(
        out,
        "verbose consume(3): slept {:?}, {} tokens at the reservation",
        r.value(),
        r.available_tokens()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(start_paused = true)]
    async fn prints_the_guide_values() {
        let mut out = Vec::new();
        if let Err(e) = super::run(&mut out).await {
            panic!("the example failed: {e}");
        }
        let text = String::from_utf8(out).expect("UTF-8");
        bucket4rs_examples::assert_prints(
            &text,
            &[
                "task 1 served at 0ns",
                "task 2 served at 100ms",
                "task 3 served at 200ms",
                "task 4 served at 300ms",
                "task 5 served at 400ms",
                "a future made, not polled: 0 available",
                "awaited: served after 100ms",
                "try_consume(1, at most 50 ms): false",
                "consume(3) dropped after 10 ms: timed out; 0 tokens before, 0 after",
                "verbose consume(3): slept 200ms, -2 tokens at the reservation",
            ],
        );
    }
}
