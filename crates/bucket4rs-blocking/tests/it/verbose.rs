//! The verbose blocking view: the same waits and listener events as the plain view, each
//! answering the verbose result of its reservation.

use std::time::Duration;

use bucket4rs_blocking::{
    BlockingBucketExt, Interrupted, ManualClockPark, ParkStrategy, WaitError,
};

use bucket4rs_local::Clock;

use crate::support::{Event, Event::*, recorded};

const SEC: u64 = 1_000_000_000;

#[test]
fn verbose_waits_report_the_reservation_and_park_like_the_plain_ones() {
    // 10 tokens, one every 100 ms.
    let (bucket, clock, rec) = recorded(10, Duration::from_secs(1));
    let park = ManualClockPark::new(clock.clone());
    let verbose = bucket.as_blocking().as_verbose();

    let r = verbose.consume_with(12, &park).unwrap();
    assert_eq!(*r.value(), Duration::from_millis(200));
    assert_eq!(r.now_nanos(), 0); // the reservation's reading, before the park
    assert_eq!(r.available_tokens(), -2);
    assert_eq!(r.available_tokens_per_bandwidth(), [-2]);
    assert_eq!(r.time_until_full(), Duration::from_millis(1200));
    assert_eq!(clock.now_nanos(), 200_000_000); // parked 200 ms on the manual clock
    assert_eq!(bucket.available_tokens(), 0);
    let wait = 200_000_000;
    assert_eq!(
        rec.take(),
        [Consumed(12), BeforeParking(wait), Parked(wait)]
    );

    // Refused without waiting: nothing taken, nothing parked.
    let r = verbose
        .try_consume_with(5, Duration::from_millis(100), &park)
        .unwrap();
    assert!(!*r.value());
    assert_eq!(r.available_tokens(), 0);
    assert_eq!(rec.take(), [Rejected(5)]);

    // Accepted with a wait: the debt at the reservation, then the park.
    let r = verbose
        .try_consume_with(1, Duration::from_secs(1), &park)
        .unwrap();
    assert!(*r.value());
    assert_eq!(r.available_tokens(), -1);
    assert_eq!(
        park.take_parks(),
        [Duration::from_millis(200), Duration::from_millis(100)]
    );

    // No wait needed: no park, a zero duration.
    clock.advance(Duration::from_secs(1));
    let r = verbose.consume_with(3, &park).unwrap();
    assert_eq!(*r.value(), Duration::ZERO);
    assert_eq!(r.available_tokens(), 7);
    assert!(park.take_parks().is_empty());
    rec.take();

    // Bad arguments: an error, nothing reserved.
    assert!(matches!(
        verbose.consume_with(0, &park),
        Err(WaitError::Operation(_))
    ));
    assert!(verbose.try_consume(1, Duration::ZERO).is_err());
    assert_eq!(bucket.available_tokens(), 7);
    assert!(rec.take().is_empty());
}

#[test]
fn an_interrupted_verbose_wait_gives_its_tokens_back() {
    struct Refuse;
    impl ParkStrategy for Refuse {
        fn park(&self, _: Duration) -> Result<(), Interrupted> {
            Err(Interrupted)
        }
    }
    let (bucket, _clock, rec) = recorded(5, Duration::from_secs(5));
    let verbose = bucket.as_blocking().as_verbose();
    assert_eq!(
        verbose.consume_with(8, &Refuse),
        Err(WaitError::Interrupted)
    );
    assert_eq!(bucket.available_tokens(), 5);
    assert_eq!(
        verbose.try_consume_with(7, Duration::from_secs(5), &Refuse),
        Err(WaitError::Interrupted)
    );
    assert_eq!(bucket.available_tokens(), 5);
    let three_secs = 3 * SEC;
    let two_secs = 2 * SEC;
    assert_eq!(
        rec.take(),
        [
            Consumed(8),
            BeforeParking(three_secs),
            Event::Interrupted,
            Consumed(7),
            BeforeParking(two_secs),
            Event::Interrupted
        ]
    );
}

#[test]
fn plain_waits_answer_the_wait_the_verbose_ones_report() {
    // 10 tokens, one every 100 ms.
    let (bucket, clock, _rec) = recorded(10, Duration::from_secs(1));
    let park = ManualClockPark::new(clock.clone());
    let blocking = bucket.as_blocking();
    assert_eq!(
        blocking.consume_with(12, &park).unwrap(),
        Duration::from_millis(200)
    );
    assert_eq!(
        blocking.consume_with(1, &park).unwrap(),
        Duration::from_millis(100)
    );
    assert_eq!(clock.now_nanos(), 300_000_000);
}
