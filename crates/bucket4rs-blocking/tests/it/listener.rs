//! The listener hears Bucket4j's events, in Bucket4j's order.

use std::time::Duration;

use bucket4rs_blocking::{
    BlockingBucketExt, Interrupted, ManualClockPark, ParkStrategy, WaitError,
};
use bucket4rs_local::{Clock, OperationError};

use crate::support::{Event, Event::*, recorded};

/// Fails every park without waiting.
struct Cancelled;
impl ParkStrategy for Cancelled {
    fn park(&self, _: Duration) -> Result<(), Interrupted> {
        Err(Interrupted)
    }
}

#[test]
fn consume_that_waits_reports_consumed_before_parking_parked() {
    let (bucket, clock, rec) = recorded(10, Duration::from_secs(1));
    let park = ManualClockPark::new(clock.clone());
    bucket.as_blocking().consume_with(13, &park).unwrap();
    assert_eq!(
        rec.take(),
        [
            Consumed(13),
            BeforeParking(300_000_000),
            Parked(300_000_000)
        ]
    );
    assert_eq!(clock.now_nanos(), 300_000_000);
    assert_eq!(bucket.available_tokens(), 0);
}

#[test]
fn calls_without_a_wait_only_report_consumed_and_never_park() {
    let (bucket, clock, rec) = recorded(10, Duration::from_secs(1));
    let park = ManualClockPark::new(clock);
    let blocking = bucket.as_blocking();
    blocking.consume_with(4, &park).unwrap();
    assert!(
        blocking
            .try_consume_with(6, Duration::from_nanos(1), &park)
            .unwrap()
    );
    blocking.consume(0).unwrap_err();
    assert_eq!(rec.take(), [Consumed(4), Consumed(6)]);
    assert!(park.parks().is_empty());
}

#[test]
fn try_consume_that_waits_reports_consumed_before_parking_parked() {
    let (bucket, clock, rec) = recorded(10, Duration::from_secs(1));
    let park = ManualClockPark::new(clock);
    let blocking = bucket.as_blocking();
    assert!(
        blocking
            .try_consume_with(12, Duration::from_millis(200), &park)
            .unwrap()
    );
    assert_eq!(
        rec.take(),
        [
            Consumed(12),
            BeforeParking(200_000_000),
            Parked(200_000_000)
        ]
    );
}

#[test]
fn a_timeout_without_waiting_is_rejected_and_takes_nothing() {
    let (bucket, clock, rec) = recorded(10, Duration::from_secs(1));
    let park = ManualClockPark::new(clock.clone());
    let blocking = bucket.as_blocking();
    assert!(
        !blocking
            .try_consume_with(12, Duration::from_millis(199), &park)
            .unwrap()
    );
    assert!(
        !blocking
            .try_consume(12, Duration::from_millis(199))
            .unwrap()
    );
    assert_eq!(rec.take(), [Rejected(12), Rejected(12)]);
    assert_eq!(bucket.available_tokens(), 10);
    assert_eq!(clock.now_nanos(), 0);
    assert!(park.parks().is_empty());
}

#[test]
fn an_interrupted_wait_reports_interrupted_instead_of_parked_and_gives_tokens_back() {
    let (bucket, _clock, rec) = recorded(10, Duration::from_secs(1));
    let blocking = bucket.as_blocking();
    assert_eq!(
        blocking.consume_with(15, &Cancelled),
        Err(WaitError::Interrupted)
    );
    assert_eq!(
        rec.take(),
        [Consumed(15), BeforeParking(500_000_000), Event::Interrupted]
    );
    assert_eq!(
        bucket.available_tokens(),
        10,
        "given back, capped at capacity"
    );

    bucket.try_consume(8).unwrap();
    rec.take();
    assert_eq!(
        blocking.try_consume_with(3, Duration::from_secs(1), &Cancelled),
        Err(WaitError::Interrupted)
    );
    assert_eq!(
        rec.take(),
        [Consumed(3), BeforeParking(100_000_000), Event::Interrupted]
    );
    assert_eq!(
        bucket.available_tokens(),
        2,
        "all 3 reserved tokens came back"
    );
}

#[test]
fn bad_arguments_are_typed_errors_that_change_nothing_and_notify_nobody() {
    let (bucket, clock, rec) = recorded(10, Duration::from_secs(1));
    let park = ManualClockPark::new(clock);
    let blocking = bucket.as_blocking();
    assert_eq!(blocking.consume(0), Err(OperationError::ZeroTokens));
    assert_eq!(
        blocking.try_consume(1, Duration::ZERO),
        Err(OperationError::ZeroMaxWait)
    );
    assert_eq!(
        blocking.try_consume_with(0, Duration::from_secs(1), &park),
        Err(WaitError::Operation(OperationError::ZeroTokens))
    );
    // A debt that could never be repaid: refused, not an endless wait.
    assert_eq!(
        blocking.consume_with(u64::MAX, &park),
        Err(WaitError::Operation(OperationError::WaitTooLong))
    );
    assert!(
        !blocking
            .try_consume_with(u64::MAX, Duration::MAX, &park)
            .unwrap()
    );
    assert_eq!(rec.take(), [Rejected(u64::MAX)]);
    assert_eq!(bucket.available_tokens(), 10);
    assert!(park.parks().is_empty());
}
