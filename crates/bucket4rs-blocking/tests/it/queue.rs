//! Tokens are reserved before the wait: later callers queue behind earlier ones and the debt
//! shows in `available_tokens`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bucket4rs_blocking::{BlockingBucketExt, Interrupted, ParkStrategy};

use crate::support::recorded;

/// Records the requested waits without letting any time pass, so several callers are "waiting"
/// at the same clock reading.
#[derive(Default)]
struct Frozen(Mutex<Vec<Duration>>);
impl ParkStrategy for Frozen {
    fn park(&self, d: Duration) -> Result<(), Interrupted> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(d);
        Ok(())
    }
}

#[test]
fn a_second_caller_queues_behind_the_first_and_the_debt_is_visible() {
    // 10 tokens per second, capacity 1: one token every 100 ms.
    let (bucket, _clock, _rec) = recorded(1, Duration::from_millis(100));
    let frozen = Frozen::default();
    let blocking = bucket.as_blocking();
    blocking.consume_with(1, &frozen).unwrap(); // free
    blocking.consume_with(3, &frozen).unwrap(); // 300 ms
    assert_eq!(bucket.available_tokens(), -3);
    blocking.consume_with(2, &frozen).unwrap(); // behind the first: 500 ms
    assert!(
        blocking
            .try_consume_with(1, Duration::from_millis(600), &frozen)
            .unwrap()
    );
    assert!(
        !blocking
            .try_consume_with(1, Duration::from_millis(699), &frozen)
            .unwrap()
    );
    assert_eq!(bucket.available_tokens(), -6);
    let ms: Vec<u128> = frozen
        .0
        .lock()
        .unwrap()
        .iter()
        .map(Duration::as_millis)
        .collect();
    assert_eq!(ms, [300, 500, 600]);
}

#[test]
fn threads_waiting_in_parallel_each_get_their_own_place_in_the_queue() {
    let (bucket, _clock, _rec) = recorded(1, Duration::from_millis(100));
    let bucket = Arc::new(bucket);
    bucket.try_consume(1).unwrap();
    let frozen = Arc::new(Frozen::default());
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (b, f) = (Arc::clone(&bucket), Arc::clone(&frozen));
            s.spawn(move || b.as_blocking().consume_with(1, &*f).unwrap());
        }
    });
    let mut ms: Vec<u128> = frozen
        .0
        .lock()
        .unwrap()
        .iter()
        .map(Duration::as_millis)
        .collect();
    ms.sort_unstable();
    assert_eq!(ms, [100, 200, 300, 400, 500, 600, 700, 800]);
    assert_eq!(bucket.available_tokens(), -8);
}
