//! Deterministic waits in tokio's paused time: rate 10/s, capacity 1, 1,000 waiters; the k-th
//! completes at (k − 1) · 100 ms of virtual time.

use std::sync::Arc;
use std::time::Duration;

use bucket4rs_async::{AsyncBucketExt, TokioClock};
use bucket4rs_local::{Bucket, LockFreeBucket};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const WAITERS: usize = 1000;

fn ten_per_second() -> Arc<LockFreeBucket<TokioClock>> {
    Arc::new(
        Bucket::builder()
            .add_limit(|l| l.capacity(1).refill_greedy(10, Duration::from_secs(1)))
            .with_clock(TokioClock::new())
            .build()
            .unwrap(),
    )
}

/// Spawns the waiters (in order) and lets each reserve, without letting virtual time move.
async fn spawn_waiters(
    bucket: &Arc<LockFreeBucket<TokioClock>>,
    start: Instant,
) -> Vec<JoinHandle<Duration>> {
    let handles: Vec<_> = (0..WAITERS)
        .map(|_| {
            let bucket = Arc::clone(bucket);
            tokio::spawn(async move {
                bucket.as_async().consume(1).await.unwrap();
                start.elapsed()
            })
        })
        .collect();
    for _ in 0..100 {
        if bucket.available_tokens() == 1 - WAITERS as i64 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(
        bucket.available_tokens(),
        1 - WAITERS as i64,
        "all 1,000 reserved; the debt is visible"
    );
    handles
}

#[tokio::test(start_paused = true)]
async fn stepping_virtual_time_by_100_ms_releases_exactly_one_waiter_per_step() {
    let bucket = ten_per_second();
    let start = Instant::now();
    let handles = spawn_waiters(&bucket, start).await;
    for k in 1..=WAITERS {
        // Waiter k is due at (k - 1) · 100 ms: run the ready tasks, check, then step.
        for _ in 0..100 {
            if handles[k - 1].is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(
            handles[k - 1].is_finished(),
            "waiter {k} not done at {:?}",
            start.elapsed()
        );
        if k < WAITERS {
            assert!(!handles[k].is_finished(), "waiter {} early", k + 1);
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(
            h.await.unwrap(),
            Duration::from_millis(i as u64 * 100),
            "waiter {}",
            i + 1
        );
    }
}

#[tokio::test(start_paused = true)]
async fn with_auto_advance_the_kth_of_1000_waiters_completes_at_k_minus_1_times_100_ms() {
    let bucket = ten_per_second();
    let start = Instant::now();
    let handles = spawn_waiters(&bucket, start).await;
    for (i, h) in handles.into_iter().enumerate() {
        let k = i as u64 + 1;
        assert_eq!(
            h.await.unwrap(),
            Duration::from_millis((k - 1) * 100),
            "waiter {k}"
        );
    }
    assert_eq!(start.elapsed(), Duration::from_millis(99_900));
    assert_eq!(bucket.available_tokens(), 0);
}
