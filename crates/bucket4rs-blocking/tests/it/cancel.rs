//! Cancelling a wait from another thread gives the reserved tokens back, never above capacity.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bucket4rs_blocking::{BlockingBucketExt, CancelToken, Interrupted, ParkStrategy, WaitError};
use bucket4rs_local::{Bucket, ManualClock};

use crate::support::{Event, Event::*, Recorder, recorded};

/// Cancels `token` once `bucket_debt` says the waiter has reserved, then returns.
fn cancel_when(token: &CancelToken, reserved: impl Fn() -> bool) {
    let start = Instant::now();
    while !reserved() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the waiter never reserved"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    token.cancel();
}

#[test]
fn a_cancelled_wait_returns_at_once_and_gives_every_reserved_token_back() {
    // One token per hour on a frozen manual clock: balances are exact.
    let (bucket, _clock, rec) = recorded(5, Duration::from_secs(5 * 3600));
    bucket.try_consume(5).unwrap();
    rec.take();
    let token = CancelToken::new();
    let start = Instant::now();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| bucket.as_blocking().consume_with(3, &token));
        cancel_when(&token, || bucket.available_tokens() == -3);
        assert_eq!(waiter.join().unwrap(), Err(WaitError::Interrupted));
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "woken by the cancel, not the deadline"
    );
    assert_eq!(bucket.available_tokens(), 0);
    let hours3 = 3 * 3_600_000_000_000;
    assert_eq!(
        rec.take(),
        [Consumed(3), BeforeParking(hours3), Event::Interrupted]
    );
}

#[test]
fn tokens_given_back_never_exceed_capacity_on_any_limit() {
    let clock = ManualClock::new(0);
    let recorder = Arc::new(Recorder::default());
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(5).refill_greedy(5, Duration::from_secs(3600)))
        .add_limit(|l| {
            l.capacity(100)
                .refill_greedy(100, Duration::from_secs(3600))
        })
        .with_clock(clock.clone())
        .with_listener(Arc::clone(&recorder))
        .build_synchronized()
        .unwrap();
    let token = CancelToken::new();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| bucket.as_blocking().consume_with(8, &token));
        cancel_when(&token, || bucket.available_tokens() == -3);
        assert_eq!(waiter.join().unwrap(), Err(WaitError::Interrupted));
    });
    // Limit 1: -3 + 8 = 5 = capacity. Limit 2: 92 + 8 = 100 = capacity. Nothing above.
    let snapshot = bucket.snapshot();
    let tokens: Vec<i64> = snapshot
        .state()
        .bandwidths()
        .iter()
        .map(|b| b.tokens())
        .collect();
    assert_eq!(tokens, [5, 100]);
    // Now let time pass during the wait: the refill plus the give-back would exceed the
    // capacity, and the bucket stops at it.
    struct AdvanceThenFail(ManualClock, Duration);
    impl ParkStrategy for AdvanceThenFail {
        fn park(&self, _: Duration) -> Result<(), Interrupted> {
            self.0.advance(self.1);
            Err(Interrupted)
        }
    }
    let two_hours = AdvanceThenFail(clock, Duration::from_secs(2 * 3600));
    assert_eq!(
        bucket.as_blocking().consume_with(8, &two_hours),
        Err(WaitError::Interrupted)
    );
    // Limit 1: 5 - 8 + 2 (refill) + 8 = 7, capped at 5. Limit 2: 92, refilled to 100, + 8 capped.
    let snapshot = bucket.snapshot();
    let tokens: Vec<i64> = snapshot
        .state()
        .bandwidths()
        .iter()
        .map(|b| b.tokens())
        .collect();
    assert_eq!(tokens, [5, 100]);
    assert_eq!(bucket.available_tokens(), 5);
}

#[test]
fn callers_behind_a_cancelled_one_keep_their_wait_and_later_ones_gain_its_tokens() {
    let (bucket, _clock, _rec) = recorded(1, Duration::from_millis(100));
    bucket.try_consume(1).unwrap();
    struct Record(std::sync::Mutex<Vec<Duration>>);
    impl ParkStrategy for Record {
        fn park(&self, d: Duration) -> Result<(), Interrupted> {
            self.0.lock().unwrap().push(d);
            Ok(())
        }
    }
    let record = Record(Default::default());
    let cancelled = CancelToken::new();
    cancelled.cancel();
    let blocking = bucket.as_blocking();
    blocking.consume_with(1, &record).unwrap(); // 100 ms
    assert_eq!(
        blocking.consume_with(2, &cancelled),
        Err(WaitError::Interrupted)
    ); // 300 ms, cancelled
    blocking.consume_with(1, &record).unwrap(); // 200 ms: as if the cancelled call never came
    assert_eq!(
        *record.0.lock().unwrap(),
        [Duration::from_millis(100), Duration::from_millis(200)]
    );
}

#[test]
fn cancellation_is_sticky_but_calls_that_need_no_wait_still_succeed() {
    let (bucket, _clock, _rec) = recorded(2, Duration::from_secs(1));
    let token = CancelToken::new();
    token.clone().cancel();
    assert!(token.is_cancelled());
    let blocking = bucket.as_blocking();
    blocking.consume_with(2, &token).unwrap();
    assert_eq!(
        blocking.try_consume_with(1, Duration::from_secs(1), &token),
        Err(WaitError::Interrupted)
    );
    assert_eq!(bucket.available_tokens(), 0);
    assert_eq!(token.park(Duration::from_secs(3600)), Err(Interrupted));
}
