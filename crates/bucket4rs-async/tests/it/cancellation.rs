//! Cancellation safety: 1,000 waiters, half of them dropped at seeded random points of their
//! wait; every dropped waiter gives its token back, and the final balance is exact.

use std::sync::Arc;
use std::time::Duration;

use bucket4rs_async::{AsyncBucketExt, TokioClock};
use bucket4rs_local::Bucket;
use tokio::time::Instant;

use crate::support::{Event, Recorder};

/// SplitMix64: a seeded generator, so every run drops the same waiters at the same times.
struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const WAITERS: usize = 1000;
const DROP_BEFORE_MS: u64 = 40_000;
const OBSERVE_AT_MS: u64 = 45_000;

#[tokio::test(start_paused = true)]
async fn half_of_1000_waiters_dropped_at_random_points_give_back_exactly_their_tokens() {
    // Limit A: 10/s, capacity 1 — every waiter queues on it. Limit B: 1000/s, capacity 1000 —
    // never the bottleneck, so it refills to its capacity while the waiters wait, and the
    // tokens given back must not push it above 1000.
    let recorder = Arc::new(Recorder::default());
    let bucket = Arc::new(
        Bucket::builder()
            .add_limit(|l| l.capacity(1).refill_greedy(10, Duration::from_secs(1)))
            .add_limit(|l| l.capacity(1000).refill_greedy(1000, Duration::from_secs(1)))
            .with_clock(TokioClock::new())
            .with_listener(Arc::clone(&recorder))
            .build()
            .unwrap(),
    );
    // Waiter k (0-based) waits k × 100 ms. Choose 500 of waiters 1..1000 (a seeded partial
    // Fisher–Yates) and, for each, a drop time strictly inside its wait and before 40 s.
    let mut rng = SplitMix(0x0B0C_4E75);
    let mut candidates: Vec<usize> = (1..WAITERS).collect();
    let mut drop_at = vec![None; WAITERS];
    for i in 0..WAITERS / 2 {
        let j = i + rng.below((candidates.len() - i) as u64) as usize;
        candidates.swap(i, j);
        let k = candidates[i];
        let limit_ms = (k as u64 * 100).min(DROP_BEFORE_MS);
        // 1 ms ≤ drop time < min(deadline, 40 s)
        drop_at[k] = Some(Duration::from_millis(1 + rng.below(limit_ms - 1)));
    }
    let dropped = drop_at.iter().filter(|d| d.is_some()).count();
    assert_eq!(dropped, WAITERS / 2);

    let start = Instant::now();
    let handles: Vec<_> = drop_at
        .iter()
        .map(|&drop_after| {
            let bucket = Arc::clone(&bucket);
            tokio::spawn(async move {
                let view = bucket.as_async();
                match drop_after {
                    // `timeout` drops the consume future when it fires: mid-wait.
                    Some(d) => {
                        let r = tokio::time::timeout(d, view.consume(1)).await;
                        assert!(r.is_err(), "the waiter completed before its drop");
                        None
                    }
                    None => {
                        view.consume(1).await.unwrap();
                        Some(start.elapsed())
                    }
                }
            })
        })
        .collect();

    // Observe the balance once every drop has happened and before limit A can fill up.
    tokio::time::sleep_until(start + Duration::from_millis(OBSERVE_AT_MS)).await;
    let finished_drops = handles
        .iter()
        .zip(&drop_at)
        .filter(|(h, d)| d.is_some() && h.is_finished())
        .count();
    assert_eq!(finished_drops, dropped);
    // Expected, exactly: A starts with 1, 1,000 reservations take 1,000, the 500 dropped
    // waiters give 500 back, and 45 s at 10/s refill 450 (A never reaches its capacity on
    // the way: its balance is at most 1 - 1000 + 500 + 400 = -99 before 40 s).
    let expected_a: i64 = 1 - WAITERS as i64 + dropped as i64 + (OBSERVE_AT_MS as i64 * 10 / 1000);
    assert_eq!(expected_a, -49);
    assert_eq!(bucket.available_tokens(), expected_a);
    // B was written by the last give-back (before 40 s), after refilling to 1000: the
    // returned tokens were capped, not added on top.
    let snapshot = bucket.snapshot();
    assert_eq!(snapshot.state().bandwidths()[1].tokens(), 1000);

    // Waiters behind dropped ones kept their deadlines.
    for (k, h) in handles.into_iter().enumerate() {
        let done = h.await.unwrap();
        match drop_at[k] {
            Some(_) => assert_eq!(done, None),
            None => assert_eq!(
                done,
                Some(Duration::from_millis(k as u64 * 100)),
                "waiter {k}"
            ),
        }
    }
    // The listener heard one interruption per dropped waiter.
    let events = recorder.take();
    let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count();
    assert_eq!(count(|e| matches!(e, Event::Consumed(1))), WAITERS);
    assert_eq!(count(|e| matches!(e, Event::Delayed(_))), WAITERS - 1);
    assert_eq!(count(|e| matches!(e, Event::Interrupted)), dropped);
    assert_eq!(events.len(), 2 * WAITERS - 1 + dropped);
}
