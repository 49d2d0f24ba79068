//! The listener hears Bucket4j's async events, in order: consumed, then delayed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bucket4rs_async::{AsyncBucketExt, TokioClock};
use bucket4rs_local::{Bucket, LockFreeBucket, OperationError};

use crate::support::{Event, Event::*, Recorder};

fn bucket(recorder: &Arc<Recorder>) -> LockFreeBucket<TokioClock, Arc<Recorder>> {
    Bucket::builder()
        .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
        .with_clock(TokioClock::new())
        .with_listener(Arc::clone(recorder))
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_wait_reports_consumed_then_delayed() {
    let rec = Arc::new(Recorder::default());
    let bucket = bucket(&rec);
    let view = bucket.as_async();
    view.consume(4).await.unwrap();
    assert_eq!(rec.take(), [Consumed(4)]);
    let start = tokio::time::Instant::now();
    view.consume(9).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert!(
        view.try_consume(2, Duration::from_millis(200))
            .await
            .unwrap()
    );
    assert_eq!(
        rec.take(),
        [
            Consumed(9),
            Delayed(300_000_000),
            Consumed(2),
            Delayed(200_000_000)
        ]
    );
    assert_eq!(bucket.available_tokens(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_without_waiting_is_rejected_and_takes_nothing() {
    let rec = Arc::new(Recorder::default());
    let bucket = bucket(&rec);
    let view = bucket.as_async();
    let start = tokio::time::Instant::now();
    assert!(
        !view
            .try_consume(11, Duration::from_millis(99))
            .await
            .unwrap()
    );
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(rec.take(), [Rejected(11)]);
    assert_eq!(bucket.available_tokens(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_wait_reports_interrupted_and_gives_the_tokens_back() {
    let rec = Arc::new(Recorder::default());
    let bucket = bucket(&rec);
    let view = bucket.as_async();
    let timed_out = tokio::time::timeout(Duration::from_millis(250), view.consume(15)).await;
    assert!(timed_out.is_err());
    assert_eq!(
        rec.take(),
        [Consumed(15), Delayed(500_000_000), Event::Interrupted]
    );
    // 10 - 15 + 2.5 (250 ms of refill) + 15 = 12.5, capped at 10.
    assert_eq!(bucket.available_tokens(), 10);

    view.consume(10).await.unwrap();
    rec.take();
    let f = view.try_consume(3, Duration::from_secs(1));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), f)
            .await
            .is_err()
    );
    // 0 - 3 + 1 (100 ms of refill) + 3 = 1: all 3 came back.
    assert_eq!(bucket.available_tokens(), 1);
    assert_eq!(
        rec.take(),
        [Consumed(3), Delayed(300_000_000), Event::Interrupted]
    );
}

#[tokio::test(start_paused = true)]
async fn a_future_dropped_before_its_first_poll_changes_nothing() {
    let rec = Arc::new(Recorder::default());
    let bucket = bucket(&rec);
    drop(bucket.as_async().consume(20));
    assert_eq!(bucket.available_tokens(), 10);
    assert!(rec.take().is_empty());
}

#[tokio::test(start_paused = true)]
async fn bad_arguments_are_typed_errors_that_change_nothing() {
    let rec = Arc::new(Recorder::default());
    let bucket = bucket(&rec);
    let view = bucket.as_async();
    assert_eq!(view.consume(0).await, Err(OperationError::ZeroTokens));
    assert_eq!(
        view.try_consume(1, Duration::ZERO).await,
        Err(OperationError::ZeroMaxWait)
    );
    assert_eq!(
        view.consume(u64::MAX).await,
        Err(OperationError::WaitTooLong)
    );
    assert!(rec.take().is_empty());
    assert_eq!(bucket.available_tokens(), 10);
}

// Paused: the bucket's `TokioClock` stands still, so the wait is exact.
#[tokio::test(start_paused = true)]
async fn any_function_returning_a_future_is_a_sleeper() {
    let rec = Arc::new(Recorder::default());
    let bucket = bucket(&rec);
    let slept = Mutex::new(Vec::new());
    // A sleeper that records and returns at once: no runtime timer involved.
    let view = bucket.with_sleeper(|d: Duration| {
        slept.lock().unwrap().push(d);
        std::future::ready(())
    });
    view.consume(10).await.unwrap();
    view.consume(2).await.unwrap();
    // 2 tokens at 10 per second.
    assert_eq!(*slept.lock().unwrap(), vec![Duration::from_millis(200)]);
}
