//! Only consumption notifies, with exact token totals, on every strategy.

use std::time::Duration;

use bucket4rs_core::{Bandwidth, BucketConfiguration, OperationError, TokensInheritanceStrategy};
use bucket4rs_listeners::SimpleBucketListener;
use bucket4rs_local::NewStorage;

use crate::{bucket, on_every_strategy, totals};

on_every_strategy!(
    try_consume_success,
    try_consume_failure,
    probe_success_and_failure,
    estimate_is_silent,
    available_tokens_is_silent,
    as_much_as_possible,
    as_much_as_possible_with_limit,
    consume_ignoring_rate_limits,
    reserve_success_and_failure,
    adding_resetting_replacing_is_silent,
    errors_are_silent,
    verbose_view_notifies_like_the_bucket,
);

fn try_consume_success<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    assert_eq!(b.try_consume(4), Ok(true));
    assert_eq!(b.try_consume(1), Ok(true));
    assert_eq!(totals(&l), [5, 0, 0, 0, 0, 0]);
    assert_eq!(b.available_tokens(), 5);
}

fn try_consume_failure<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    assert_eq!(b.try_consume(11), Ok(false));
    assert_eq!(b.try_consume(10), Ok(true));
    assert_eq!(b.try_consume(3), Ok(false));
    // Rejected counts tokens (11 + 3), not calls.
    assert_eq!(totals(&l), [10, 14, 0, 0, 0, 0]);
}

fn probe_success_and_failure<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    let ok = b.try_consume_and_return_remaining(3).unwrap();
    assert!(ok.is_consumed());
    assert_eq!(totals(&l), [3, 0, 0, 0, 0, 0]);
    let no = b.try_consume_and_return_remaining(8).unwrap();
    assert!(!no.is_consumed());
    assert_eq!(totals(&l), [3, 8, 0, 0, 0, 0]);
}

fn estimate_is_silent<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    assert!(b.estimate_ability_to_consume(5).unwrap().can_be_consumed());
    assert!(!b.estimate_ability_to_consume(50).unwrap().can_be_consumed());
    assert_eq!(totals(&l), [0; 6]);
}

fn available_tokens_is_silent<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    assert_eq!(b.available_tokens(), 10);
    let _ = b.configuration();
    let _ = b.snapshot();
    assert_eq!(totals(&l), [0; 6]);
}

fn as_much_as_possible<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, clock) = bucket::<S, _>(&l);
    assert_eq!(b.try_consume(3), Ok(true));
    assert_eq!(b.try_consume_as_much_as_possible(), 7);
    assert_eq!(totals(&l), [10, 0, 0, 0, 0, 0]);
    // Nothing available: nothing consumed, and it is not a rejection either.
    assert_eq!(b.try_consume_as_much_as_possible(), 0);
    assert_eq!(totals(&l), [10, 0, 0, 0, 0, 0]);
    clock.advance(Duration::from_millis(200));
    assert_eq!(b.try_consume_as_much_as_possible(), 2);
    assert_eq!(totals(&l), [12, 0, 0, 0, 0, 0]);
}

fn as_much_as_possible_with_limit<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    assert_eq!(b.try_consume_as_much_as_possible_with_limit(4), Ok(4));
    assert_eq!(b.try_consume_as_much_as_possible_with_limit(100), Ok(6));
    assert_eq!(b.try_consume_as_much_as_possible_with_limit(1), Ok(0));
    assert_eq!(totals(&l), [10, 0, 0, 0, 0, 0]);
}

fn consume_ignoring_rate_limits<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    assert_eq!(
        b.consume_ignoring_rate_limits(15),
        Ok(Duration::from_millis(500))
    );
    assert_eq!(totals(&l), [15, 0, 0, 0, 0, 0]);
    assert_eq!(b.available_tokens(), -5);
    // A debt that could never be repaid is refused: nothing consumed, nobody notified.
    assert_eq!(
        b.consume_ignoring_rate_limits(i64::MAX as u64),
        Err(OperationError::WaitTooLong)
    );
    assert_eq!(totals(&l), [15, 0, 0, 0, 0, 0]);
    assert_eq!(b.available_tokens(), -5);
}

fn reserve_success_and_failure<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    assert_eq!(
        b.reserve(15, Duration::from_secs(1)),
        Ok(Some(Duration::from_millis(500)))
    );
    assert_eq!(totals(&l), [15, 0, 0, 0, 0, 0]);
    assert_eq!(b.reserve(2, Duration::from_millis(1)), Ok(None));
    assert_eq!(totals(&l), [15, 2, 0, 0, 0, 0]);
    // The reservation itself is not a wait: the blocking and async layers report those.
    assert_eq!(b.available_tokens(), -5);
}

fn adding_resetting_replacing_is_silent<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    assert_eq!(b.try_consume(8), Ok(true));
    let before = totals(&l);
    b.add_tokens(3).unwrap();
    b.force_add_tokens(20).unwrap();
    assert_eq!(b.available_tokens(), 25);
    b.reset();
    assert_eq!(b.available_tokens(), 10);
    let bigger = BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(20, Duration::from_secs(1)).unwrap())
        .build()
        .unwrap();
    b.replace_configuration(bigger, TokensInheritanceStrategy::AsIs)
        .unwrap();
    assert_eq!(b.available_tokens(), 10);
    assert_eq!(totals(&l), before);
    assert_eq!(before, [8, 0, 0, 0, 0, 0]);
}

fn errors_are_silent<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    assert_eq!(b.try_consume(0), Err(OperationError::ZeroTokens));
    assert!(b.try_consume_and_return_remaining(0).is_err());
    assert!(b.try_consume_as_much_as_possible_with_limit(0).is_err());
    assert!(b.consume_ignoring_rate_limits(0).is_err());
    assert!(b.reserve(0, Duration::from_secs(1)).is_err());
    assert!(b.reserve(1, Duration::ZERO).is_err());
    assert_eq!(totals(&l), [0; 6]);
    assert_eq!(b.available_tokens(), 10);
}

fn verbose_view_notifies_like_the_bucket<S: NewStorage>() {
    let l = SimpleBucketListener::new();
    let (b, _) = bucket::<S, _>(&l);
    let v = b.as_verbose();
    assert!(*v.try_consume(2).unwrap().value());
    assert!(!*v.try_consume(9).unwrap().value());
    assert!(
        v.estimate_ability_to_consume(1)
            .unwrap()
            .value()
            .can_be_consumed()
    );
    assert_eq!(*v.available_tokens().value(), 8);
    assert_eq!(totals(&l), [2, 9, 0, 0, 0, 0]);
}

/// "No listener" is not a separate code path: a bucket built without a listener has exactly
/// the type of one built with an explicit `NoopListener` (this compiles only if so), and the
/// listener takes no space.
#[test]
fn no_listener_is_the_noop_listener() {
    use bucket4rs_core::NoopListener;
    use bucket4rs_local::{Bucket, FastClock, LockFreeBucket};

    let limit = |l: bucket4rs_core::BandwidthBuilder| {
        l.capacity(1).refill_greedy(1, Duration::from_secs(1))
    };
    let implicit = Bucket::builder().add_limit(limit).build().unwrap();
    let explicit = Bucket::builder()
        .add_limit(limit)
        .with_listener(NoopListener)
        .build()
        .unwrap();
    let both: [LockFreeBucket<FastClock, NoopListener>; 2] = [implicit, explicit];
    assert_eq!(size_of::<NoopListener>(), 0);
    assert_eq!(
        size_of_val(&both[0]),
        size_of::<bucket4rs_local::Bucket<bucket4rs_local::LockFree, FastClock, ()>>()
    );
}
