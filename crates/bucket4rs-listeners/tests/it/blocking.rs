//! `SimpleBucketListener` on the blocking path (bucket4rs-blocking): consumed, before-parking,
//! parked, rejected and interrupted.

use std::time::Duration;

use bucket4rs_blocking::{BlockingBucketExt, CancelToken, ManualClockPark, WaitError};
use bucket4rs_listeners::SimpleBucketListener;
use bucket4rs_local::NewStorage;

use crate::{bucket, on_every_strategy, totals};

on_every_strategy!(
    consume_reports_the_park,
    try_consume_reports_rejection_or_park,
    cancelled_wait_is_interrupted
);

fn consume_reports_the_park<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, clock) = bucket::<S, _>(&l);
    let park = ManualClockPark::new(clock);
    let blocking = b.as_blocking();
    blocking.consume_with(4, &park).unwrap(); // no wait: no parking
    assert_eq!(totals(&l), [4, 0, 0, 0, 0, 0]);
    blocking.consume_with(11, &park).unwrap(); // 6 now, 5 more in 500 ms
    assert_eq!(park.take_parks(), [Duration::from_millis(500)]);
    assert_eq!(totals(&l), [15, 0, 0, 500_000_000, 500_000_000, 0]);
}

fn try_consume_reports_rejection_or_park<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, clock) = bucket::<S, _>(&l);
    let park = ManualClockPark::new(clock);
    let blocking = b.as_blocking();
    assert_eq!(
        blocking.try_consume_with(12, Duration::from_millis(100), &park),
        Ok(false)
    );
    assert_eq!(totals(&l), [0, 12, 0, 0, 0, 0]);
    assert_eq!(
        blocking.try_consume_with(12, Duration::from_millis(200), &park),
        Ok(true)
    );
    assert_eq!(totals(&l), [12, 12, 0, 200_000_000, 200_000_000, 0]);
}

fn cancelled_wait_is_interrupted<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    let token = CancelToken::new();
    token.cancel();
    let blocking = b.as_blocking();
    assert!(matches!(
        blocking.consume_with(13, &token),
        Err(WaitError::Interrupted)
    ));
    // Consumed (the reservation), announced the park, then interrupted instead of parked.
    assert_eq!(totals(&l), [13, 0, 0, 300_000_000, 0, 1]);
    assert_eq!(b.available_tokens(), 10, "the reserved tokens came back");
}
