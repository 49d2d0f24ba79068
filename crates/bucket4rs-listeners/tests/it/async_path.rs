//! `SimpleBucketListener` on the async path (bucket4rs-async, tokio with paused time):
//! consumed, delayed, rejected, and interrupted when a waiting future is dropped.

use std::sync::Arc;
use std::time::Duration;

use bucket4rs_async::{AsyncBucketExt, TokioClock};
use bucket4rs_listeners::SimpleBucketListener;
use bucket4rs_local::{Bucket, LockFreeBucket, SynchronizedBucket};

use crate::totals;

fn lock_free(
    l: &Arc<SimpleBucketListener>,
) -> LockFreeBucket<TokioClock, Arc<SimpleBucketListener>> {
    Bucket::builder()
        .add_limit(|b| b.capacity(10).refill_greedy(10, Duration::from_secs(1)))
        .with_clock(TokioClock::new())
        .with_listener(Arc::clone(l))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn consume_reports_the_delay() {
    let l = Arc::new(SimpleBucketListener::new());
    let b = lock_free(&l);
    let view = b.as_async();
    view.consume(4).await.unwrap();
    assert_eq!(totals(&l), [4, 0, 0, 0, 0, 0]);
    view.consume(9).await.unwrap(); // 6 now, 3 more in 300 ms
    assert_eq!(totals(&l), [13, 0, 300_000_000, 0, 0, 0]);
    assert!(
        !view
            .try_consume(5, Duration::from_millis(10))
            .await
            .unwrap()
    );
    assert_eq!(totals(&l), [13, 5, 300_000_000, 0, 0, 0]);
}

#[tokio::test(start_paused = true)]
async fn dropped_wait_is_interrupted() {
    let l = Arc::new(SimpleBucketListener::new());
    let b: SynchronizedBucket<TokioClock, _> = Bucket::builder()
        .add_limit(|b| b.capacity(10).refill_greedy(10, Duration::from_secs(1)))
        .with_clock(TokioClock::new())
        .with_listener(Arc::clone(&l))
        .build_synchronized()
        .unwrap();
    let view = b.as_async();
    let timed_out = tokio::time::timeout(Duration::from_millis(100), view.consume(15)).await;
    assert!(timed_out.is_err(), "the 500 ms wait outlasts the timeout");
    assert_eq!(totals(&l), [15, 0, 500_000_000, 0, 0, 1]);
    // -5 after the reservation, +1 refilled in 100 ms, +15 given back, capped at 10.
    assert_eq!(b.available_tokens(), 10, "the reserved tokens came back");
}
