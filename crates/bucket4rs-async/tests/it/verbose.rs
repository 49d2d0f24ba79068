//! The verbose async view in tokio's paused time: lazy like the plain view, the verbose result
//! of the reservation, and a dropped future gives its tokens back.

use std::time::Duration;

use bucket4rs_async::{AsyncBucketExt, TokioClock};
use bucket4rs_local::Bucket;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn verbose_waits_report_their_reservation_and_sleep_its_wait() {
    // 10 tokens, one every 100 ms.
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
        .with_clock(TokioClock::new())
        .build()
        .unwrap();
    let verbose = bucket.as_async().as_verbose();
    let start = Instant::now();

    let pending = verbose.consume(12);
    assert_eq!(
        bucket.available_tokens(),
        10,
        "nothing reserved before the first poll"
    );
    let r = pending.await.unwrap();
    assert_eq!(*r.value(), Duration::from_millis(200));
    assert_eq!(r.available_tokens(), -2);
    assert_eq!(r.time_until_full(), Duration::from_millis(1200));
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    assert_eq!(bucket.available_tokens(), 0);

    let refused = verbose
        .try_consume(5, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(!*refused.value());
    assert_eq!(refused.available_tokens(), 0);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(200),
        "refused at once"
    );

    let served = verbose
        .try_consume(2, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(*served.value());
    assert_eq!(served.available_tokens(), -2);
    assert_eq!(start.elapsed(), Duration::from_millis(400));

    assert!(verbose.consume(0).await.is_err());
    assert!(verbose.try_consume(1, Duration::ZERO).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_verbose_wait_gives_its_tokens_back() {
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(5)))
        .with_clock(TokioClock::new())
        .build()
        .unwrap();
    let verbose = bucket.as_async().as_verbose();
    let abandoned = tokio::time::timeout(Duration::from_millis(10), verbose.consume(8)).await;
    assert!(abandoned.is_err(), "the 3 s wait was cut short");
    assert_eq!(bucket.available_tokens(), 5);
    let abandoned = tokio::time::timeout(
        Duration::from_millis(10),
        verbose.try_consume(7, Duration::from_secs(5)),
    )
    .await;
    assert!(abandoned.is_err());
    assert_eq!(bucket.available_tokens(), 5);
}

#[tokio::test(start_paused = true)]
async fn plain_waits_answer_the_wait_they_slept() {
    // 10 tokens, one every 100 ms.
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
        .with_clock(TokioClock::new())
        .build()
        .unwrap();
    let plain = bucket.as_async();
    let start = Instant::now();
    assert_eq!(plain.consume(12).await.unwrap(), Duration::from_millis(200));
    assert_eq!(plain.consume(1).await.unwrap(), Duration::from_millis(100));
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}
