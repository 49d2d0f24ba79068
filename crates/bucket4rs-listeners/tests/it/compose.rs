//! Composition (tuples, `and_listener`) versus replacement (`to_listenable`).

use std::sync::Arc;

use bucket4rs_core::{BucketListener, NoopListener};
use bucket4rs_listeners::SimpleBucketListener;
use bucket4rs_local::NewStorage;

use crate::{bucket, on_every_strategy, totals};

on_every_strategy!(
    tuple_of_two_notifies_both,
    tuple_of_three_notifies_all,
    and_listener_keeps_the_bucket_listener,
    and_listener_nests,
    to_listenable_replaces,
    arc_and_reference_share_totals,
);

fn tuple_of_two_notifies_both<S: NewStorage>() {
    let (a, b) = (SimpleBucketListener::new(), SimpleBucketListener::new());
    let (bucket, _) = bucket::<S, _>((&a, &b));
    assert_eq!(bucket.try_consume(4), Ok(true));
    assert_eq!(bucket.try_consume(7), Ok(false));
    assert_eq!(totals(&a), [4, 7, 0, 0, 0, 0]);
    assert_eq!(totals(&b), [4, 7, 0, 0, 0, 0]);
}

fn tuple_of_three_notifies_all<S: NewStorage>() {
    let (a, b) = (SimpleBucketListener::new(), SimpleBucketListener::new());
    let (bucket, _) = bucket::<S, _>((&a, NoopListener, Arc::new(&b)));
    assert_eq!(bucket.try_consume_as_much_as_possible(), 10);
    assert_eq!(totals(&a), [10, 0, 0, 0, 0, 0]);
    assert_eq!(totals(&b), [10, 0, 0, 0, 0, 0]);
}

fn and_listener_keeps_the_bucket_listener<S: NewStorage>() {
    let (own, extra) = (SimpleBucketListener::new(), SimpleBucketListener::new());
    let (bucket, _) = bucket::<S, _>(&own);
    let view = bucket.and_listener(&extra);
    assert_eq!(view.try_consume(6), Ok(true));
    assert_eq!(view.try_consume(6), Ok(false));
    assert_eq!(bucket.try_consume(1), Ok(true)); // through the bucket: only `own`
    assert_eq!(totals(&own), [7, 6, 0, 0, 0, 0]);
    assert_eq!(totals(&extra), [6, 6, 0, 0, 0, 0]);
    // One state behind both.
    assert_eq!(bucket.available_tokens(), 3);
    assert_eq!(view.available_tokens(), 3);
}

fn and_listener_nests<S: NewStorage>() {
    let ls = [
        SimpleBucketListener::new(),
        SimpleBucketListener::new(),
        SimpleBucketListener::new(),
    ];
    let (bucket, _) = bucket::<S, _>(&ls[0]);
    let view = bucket.and_listener(&ls[1]);
    view.and_listener(&ls[2]).try_consume(2).unwrap();
    view.try_consume(1).unwrap();
    assert_eq!(ls.each_ref().map(SimpleBucketListener::consumed), [3, 3, 2]);
}

fn to_listenable_replaces<S: NewStorage>() {
    let (own, other) = (SimpleBucketListener::new(), SimpleBucketListener::new());
    let (bucket, _) = bucket::<S, _>(&own);
    let view = bucket.to_listenable(&other);
    assert_eq!(view.try_consume(4), Ok(true));
    assert_eq!(view.try_consume(40), Ok(false));
    // Bucket4j's semantics: the bucket's own listener hears nothing from the view.
    assert_eq!(totals(&own), [0; 6]);
    assert_eq!(totals(&other), [4, 40, 0, 0, 0, 0]);
    assert_eq!(bucket.available_tokens(), 6);
}

fn arc_and_reference_share_totals<S: NewStorage>() {
    let shared = Arc::new(SimpleBucketListener::new());
    let (one, _) = bucket::<S, _>(Arc::clone(&shared));
    let (two, _) = bucket::<S, _>(Arc::clone(&shared));
    one.try_consume(3).unwrap();
    two.try_consume(4).unwrap();
    two.try_consume(20).unwrap();
    assert_eq!(totals(&shared), [7, 20, 0, 0, 0, 0]);
}

/// A tuple forwards every event, not only the ones buckets emit themselves.
#[test]
fn tuples_forward_every_event() {
    let (a, b, c) = (
        SimpleBucketListener::new(),
        SimpleBucketListener::new(),
        SimpleBucketListener::new(),
    );
    for l in [&(&a, &b) as &dyn BucketListener, &(&c, NoopListener, &a)] {
        l.on_consumed(1);
        l.on_rejected(2);
        l.on_delayed(3);
        l.on_before_parking(4);
        l.on_parked(5);
        l.on_interrupted();
    }
    assert_eq!(totals(&a), [2, 4, 6, 8, 10, 2]);
    assert_eq!(totals(&b), [1, 2, 3, 4, 5, 1]);
    assert_eq!(totals(&c), [1, 2, 3, 4, 5, 1]);
}
