//! A panicking listener cannot corrupt a bucket: the state change is committed first.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock, Weak, mpsc};
use std::time::Duration;

use bucket4rs_core::{BucketListener, NoopListener};
use bucket4rs_listeners::SimpleBucketListener;
use bucket4rs_local::NewStorage;

use crate::{bucket, on_every_strategy, totals};

/// Panics on every consumption event.
#[derive(Debug)]
struct Panicking;

impl BucketListener for Panicking {
    fn on_consumed(&self, tokens: u64) {
        panic!("listener failed on {tokens} consumed tokens");
    }
    fn on_rejected(&self, tokens: u64) {
        panic!("listener failed on {tokens} rejected tokens");
    }
}

on_every_strategy!(
    consumption_stands_after_a_panic,
    rejection_changes_nothing_after_a_panic,
    every_consuming_operation_commits_before_a_panic,
    composed_listeners_before_the_panic_are_notified,
);

fn consumption_stands_after_a_panic<S: NewStorage>() {
    let (b, _) = bucket::<S, _>(Panicking);
    let caught = catch_unwind(AssertUnwindSafe(|| b.try_consume(4)));
    assert!(caught.is_err(), "the listener's panic reaches the caller");
    assert_eq!(
        b.available_tokens(),
        6,
        "the 4 tokens were taken exactly once"
    );
    // The bucket still works (here through a quiet view of the same state).
    let quiet = b.to_listenable(NoopListener);
    assert_eq!(quiet.try_consume(6), Ok(true));
    assert_eq!(quiet.try_consume(1), Ok(false));
    assert_eq!(b.available_tokens(), 0);
}

fn rejection_changes_nothing_after_a_panic<S: NewStorage>() {
    let (b, _) = bucket::<S, _>(Panicking);
    assert!(catch_unwind(AssertUnwindSafe(|| b.try_consume(11))).is_err());
    assert_eq!(b.available_tokens(), 10);
    assert_eq!(b.to_listenable(NoopListener).try_consume(10), Ok(true));
}

fn every_consuming_operation_commits_before_a_panic<S: NewStorage>() {
    let (b, clock) = bucket::<S, _>(Panicking);
    let panics = |f: &dyn Fn()| catch_unwind(AssertUnwindSafe(f)).is_err();
    assert!(panics(&|| {
        let _ = b.try_consume_and_return_remaining(2);
    }));
    assert_eq!(b.available_tokens(), 8);
    assert!(panics(&|| {
        let _ = b.try_consume_as_much_as_possible_with_limit(3);
    }));
    assert_eq!(b.available_tokens(), 5);
    assert!(panics(&|| {
        let _ = b.consume_ignoring_rate_limits(7);
    }));
    assert_eq!(b.available_tokens(), -2);
    assert!(panics(&|| {
        let _ = b.reserve(3, Duration::from_secs(1));
    }));
    assert_eq!(b.available_tokens(), -5);
    assert!(panics(&|| {
        let _ = b.as_verbose().try_consume(1);
    }));
    assert_eq!(b.available_tokens(), -5, "a rejection takes nothing");
    // Time still refills it normally.
    clock.advance(Duration::from_secs(1));
    assert_eq!(b.available_tokens(), 5);
    assert_eq!(b.to_listenable(NoopListener).try_consume(5), Ok(true));
}

fn composed_listeners_before_the_panic_are_notified<S: NewStorage>() {
    let (first, last) = (SimpleBucketListener::new(), SimpleBucketListener::new());
    let (b, _) = bucket::<S, _>((&first, Panicking, &last));
    assert!(catch_unwind(AssertUnwindSafe(|| b.try_consume(3))).is_err());
    assert_eq!(totals(&first), [3, 0, 0, 0, 0, 0]);
    assert_eq!(
        totals(&last),
        [0; 6],
        "members after a panicking one are skipped"
    );
    assert_eq!(b.available_tokens(), 7);
}

/// The synchronized strategy releases its lock before notifying: after a listener panic, the
/// mutex is neither held nor poisoned, and another thread can use the bucket at once. (Were
/// the lock still held, the other thread would block: it gets 10 s before the test fails.)
#[test]
fn synchronized_lock_is_released_before_the_listener_runs() {
    let (b, _) = bucket::<bucket4rs_local::Synchronized, _>(Panicking);
    assert!(catch_unwind(AssertUnwindSafe(|| b.try_consume(4))).is_err());
    let b = Arc::new(b);
    let (tx, rx) = mpsc::channel();
    let other = Arc::clone(&b);
    std::thread::spawn(move || {
        let quiet = other.to_listenable(NoopListener);
        let _ = tx.send((quiet.try_consume(6), quiet.available_tokens()));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    assert_eq!(
        got,
        Ok((Ok(true), 0)),
        "the lock was left held after the panic"
    );
}

type Reentrant = bucket4rs_local::Bucket<
    bucket4rs_local::Synchronized,
    bucket4rs_local::ManualClock,
    Arc<SeesTheBucket>,
>;

/// Reads its own bucket's balance while being notified.
#[derive(Default)]
struct SeesTheBucket {
    bucket: OnceLock<Weak<Reentrant>>,
    seen: Mutex<Vec<i64>>,
}

impl BucketListener for SeesTheBucket {
    fn on_consumed(&self, _tokens: u64) {
        if let Some(bucket) = self.bucket.get().and_then(Weak::upgrade) {
            let balance = bucket.to_listenable(NoopListener).available_tokens();
            self.seen.lock().unwrap().push(balance);
        }
    }
}

/// While a synchronized bucket notifies its listener, its lock is free: the listener can use
/// the bucket (with the lock held this would deadlock; the test gives it 10 s).
#[test]
fn synchronized_listener_runs_outside_the_lock() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let listener = Arc::new(SeesTheBucket::default());
        let (b, _) = bucket::<bucket4rs_local::Synchronized, _>(Arc::clone(&listener));
        let b = Arc::new(b);
        let _ = listener.bucket.set(Arc::downgrade(&b));
        let consumed = b.try_consume(4);
        let seen = listener.seen.lock().unwrap().clone();
        let _ = tx.send((consumed, seen));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    assert_eq!(got, Ok((Ok(true), vec![6])));
}
