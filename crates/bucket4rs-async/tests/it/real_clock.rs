//! Real time: a smoke test with a generous tolerance, and proof that waiting does not block
//! the executor thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bucket4rs_async::AsyncBucketExt;
use bucket4rs_local::Bucket;

#[tokio::test(flavor = "current_thread")]
async fn consume_waits_for_the_refill_without_blocking_the_executor() {
    // 20 per second, capacity 1: 5 tokens take 4 × 50 ms.
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_millis(50)))
        .build()
        .unwrap();
    // A ticker on the same (single) executor thread: it only advances if the waits yield.
    let ticks = Arc::new(AtomicU32::new(0));
    let ticker = tokio::spawn({
        let ticks = Arc::clone(&ticks);
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let start = Instant::now();
    for _ in 0..5 {
        bucket.as_async().consume(1).await.unwrap();
    }
    let elapsed = start.elapsed();
    ticker.abort();
    assert!(elapsed >= Duration::from_millis(190), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    let ticks = ticks.load(Ordering::Relaxed);
    assert!(
        ticks >= 5,
        "the executor was blocked: {ticks} ticks in {elapsed:?}"
    );
    let start = Instant::now();
    assert!(
        !bucket
            .as_async()
            .try_consume(20, Duration::from_millis(500))
            .await
            .unwrap()
    );
    // 20 tokens need about 1 s: refused at once, not after sleeping the 500 ms budget.
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
}
