//! Loom models of the lock-free bucket: every interleaving of 2–3 threads (bounded by
//! `LOOM_MAX_PREEMPTIONS`) keeps exact token accounting.
//!
//! Run with `cargo xtask loom` (it sets `--cfg bucket4rs_loom` and the preemption bound).

use std::sync::Arc;
use std::time::Duration;

use crate::{
    Bandwidth, Bucket, BucketConfiguration, LockFreeBucket, ManualClock, TokensInheritanceStrategy,
};
use loom::thread;

/// Runs `f` under loom with at most `preemptions` forced preemptions per execution (an explicit
/// `LOOM_MAX_PREEMPTIONS` overrides it, e.g. for a deeper search).
fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    builder.check(f);
}

/// A one-bandwidth bucket on the packed 128-bit word (a clock that may go back).
fn bucket(capacity: u64, initial: u64) -> Arc<LockFreeBucket<ManualClock>> {
    let b = bucket_on(capacity, initial, ManualClock::new(0));
    assert!(b.storage().is_packed() && !b.storage().is_compact());
    b
}

/// The same on the compact 64-bit word (a monotonic clock).
fn compact_bucket(capacity: u64, initial: u64) -> Arc<LockFreeBucket<ManualClock>> {
    let b = bucket_on(capacity, initial, ManualClock::monotonic(0));
    assert!(b.storage().is_compact());
    b
}

fn bucket_on(capacity: u64, initial: u64, clock: ManualClock) -> Arc<LockFreeBucket<ManualClock>> {
    Arc::new(
        Bucket::builder()
            .add_limit(|l| {
                l.capacity(capacity)
                    .refill_greedy(1, Duration::from_secs(3600))
                    .initial_tokens(initial)
                    .id("a")
            })
            .with_clock(clock)
            .build()
            .expect("valid"),
    )
}

/// How many of `threads` concurrent `try_consume(tokens)` calls on `b` succeed.
fn wins(b: &Arc<LockFreeBucket<ManualClock>>, threads: usize, tokens: u64) -> usize {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let b = b.clone();
            thread::spawn(move || b.try_consume(tokens).expect("valid"))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .filter(|w| *w)
        .count()
}

/// Two requests of 2 on 3 tokens: exactly one is served.
fn consume_consume(b: &Arc<LockFreeBucket<ManualClock>>) {
    assert_eq!(wins(b, 2, 2), 1, "3 tokens serve exactly one request of 2");
    assert_eq!(b.available_tokens(), 1);
}

/// `add_tokens(5)` racing `try_consume(1)` on 1 token: both count.
fn consume_and_add(b: &Arc<LockFreeBucket<ManualClock>>) {
    let adder = {
        let b = b.clone();
        thread::spawn(move || b.add_tokens(5).expect("valid"))
    };
    let consumer = {
        let b = b.clone();
        thread::spawn(move || b.try_consume(1).expect("valid"))
    };
    adder.join().expect("no panic");
    assert!(
        consumer.join().expect("no panic"),
        "one token was there from the start"
    );
    assert_eq!(b.available_tokens(), 5);
}

#[test]
fn consume_consume_never_oversells() {
    model(3, || {
        let b = bucket(10, 3);
        assert!(b.storage().is_packed());
        consume_consume(&b);
    });
}

#[test]
fn three_consumers_take_exactly_the_balance() {
    model(2, || {
        let b = bucket(10, 2);
        assert_eq!(wins(&b, 3, 1), 2);
        assert_eq!(b.available_tokens(), 0);
    });
}

#[test]
fn consume_and_add_are_both_applied() {
    model(3, || consume_and_add(&bucket(100, 1)));
}

#[test]
fn compact_consume_consume_never_oversells() {
    model(3, || consume_consume(&compact_bucket(10, 3)));
}

#[test]
fn compact_three_consumers_take_exactly_the_balance() {
    model(2, || {
        let b = compact_bucket(10, 2);
        assert_eq!(wins(&b, 3, 1), 2);
        assert_eq!(b.available_tokens(), 0);
    });
}

/// `add_tokens` runs on the decoded compact word (no GCRA step for it).
#[test]
fn compact_consume_and_add_are_both_applied() {
    model(3, || consume_and_add(&compact_bucket(100, 1)));
}

/// A forced addition above capacity does not fit the compact word: the bucket moves to the
/// slots while another thread consumes on the word. Both operations count, in either order,
/// and every thread that meets the frozen word may complete the move.
#[test]
fn leaving_the_compact_word_under_a_racing_consumer_keeps_every_token() {
    model(3, || {
        let b = compact_bucket(10, 5);
        let adder = {
            let b = b.clone();
            thread::spawn(move || b.force_add_tokens(20).expect("valid"))
        };
        let consumer = {
            let b = b.clone();
            thread::spawn(move || b.try_consume(2).expect("valid"))
        };
        adder.join().expect("no panic");
        assert!(consumer.join().expect("no panic"), "5 tokens serve 2");
        assert_eq!(b.available_tokens(), 23);
        assert!(!b.storage().is_compact());
    });
}

/// A replacement leaves the compact word (for the slots) while another thread consumes.
#[test]
fn compact_consume_and_replace_keep_the_balance() {
    model(3, || consume_and_replace(&compact_bucket(10, 5)));
}

#[test]
fn consume_and_reset_serialize() {
    model(3, || {
        let b = bucket(4, 1);
        let resetter = {
            let b = b.clone();
            thread::spawn(move || b.reset())
        };
        let consumer = {
            let b = b.clone();
            thread::spawn(move || b.try_consume(1).expect("valid"))
        };
        resetter.join().expect("no panic");
        assert!(consumer.join().expect("no panic"));
        // consume then reset -> 4; reset then consume -> 3.
        let left = b.available_tokens();
        assert!(left == 4 || left == 3, "impossible balance {left}");
    });
}

#[test]
fn consume_and_replace_keep_the_balance() {
    model(3, || consume_and_replace(&bucket(10, 5)));
}

fn consume_and_replace(b: &Arc<LockFreeBucket<ManualClock>>) {
    {
        let bigger = BucketConfiguration::builder()
            .add_bandwidth(
                Bandwidth::builder()
                    .capacity(20)
                    .refill_greedy(1, Duration::from_secs(3600))
                    .id("a")
                    .build()
                    .expect("valid"),
            )
            .build()
            .expect("valid");
        let replacer = {
            let (b, c) = (b.clone(), bigger.clone());
            thread::spawn(move || {
                b.replace_configuration(c, TokensInheritanceStrategy::AsIs)
                    .expect("valid")
            })
        };
        let consumer = {
            let b = b.clone();
            thread::spawn(move || b.try_consume(2).expect("valid"))
        };
        replacer.join().expect("no panic");
        assert!(consumer.join().expect("no panic"));
        // AS_IS keeps the balance in either order: 5 - 2.
        assert_eq!(b.available_tokens(), 3);
        assert_eq!(b.configuration(), bigger);
    }
}

/// A bucket with two bandwidths: it never uses the packed word, only the slot protocol.
fn two_bandwidth_bucket(initial: u64) -> Arc<LockFreeBucket<ManualClock>> {
    Arc::new(
        Bucket::builder()
            .add_limit(|l| {
                l.capacity(10)
                    .refill_greedy(1, Duration::from_secs(3600))
                    .initial_tokens(initial)
                    .id("a")
            })
            .add_limit(|l| l.capacity(50).refill_greedy(1, Duration::from_secs(60)))
            .with_clock(ManualClock::new(0))
            .build()
            .expect("valid"),
    )
}

#[test]
fn slots_consume_consume_never_oversells() {
    model(3, || {
        let b = two_bandwidth_bucket(3);
        assert!(!b.storage().is_packed());
        consume_consume(&b);
    });
}

#[test]
fn slots_consume_and_add_are_both_applied() {
    model(3, || consume_and_add(&two_bandwidth_bucket(1)));
}

/// A debt too deep for the packed word moves the bucket to the slots while another thread
/// consumes on the packed word: both operations count, whichever order they take, and every
/// thread that sees the frozen word may complete the move.
#[test]
fn leaving_packed_mode_under_a_racing_consumer_keeps_every_token() {
    model(3, || {
        // One token per hour: a token is 3.6e12 units of the scaled balance, so a debt of a
        // million tokens (3.6e18) does not fit 62 bits, while its wait (a million hours) is
        // still accepted.
        let b = bucket(10, 5);
        let debt: u64 = 1_000_000;
        let debtor = {
            let b = b.clone();
            thread::spawn(move || {
                b.consume_ignoring_rate_limits(debt).expect("valid");
            })
        };
        let consumer = {
            let b = b.clone();
            thread::spawn(move || b.try_consume(2).expect("valid"))
        };
        debtor.join().expect("no panic");
        let consumed = consumer.join().expect("no panic");
        let expected = if consumed {
            3 - debt as i64
        } else {
            5 - debt as i64
        };
        assert_eq!(b.available_tokens(), expected);
        // The move happened: a later operation still sees the exact state.
        assert!(!b.try_consume(1).expect("valid"));
    });
}
