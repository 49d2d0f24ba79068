//! Loom models of the keyed map's protocol: lookups and operations on an entry racing with the
//! structural changes (forgetting by a sweep, removal, replacing the configuration, moving a
//! state out of the compact word), two threads storing one new key, and the key cap. Every
//! atomic and lock of the keyed code comes from `primitive`, and the map is its loom stand-in
//! (values stay usable by whoever found them after they are removed, as papaya's do).

use std::sync::Arc;
use std::time::Duration;

use loom::thread;

use crate::{
    Bandwidth, BucketConfiguration, KeyedBucket, KeyedError, ManualClock, TokensInheritanceStrategy,
};

/// Runs `f` under loom with at most `preemptions` forced preemptions per execution (an explicit
/// `LOOM_MAX_PREEMPTIONS` overrides it).
fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    builder.check(f);
}

type Keyed = Arc<KeyedBucket<u8, ManualClock>>;

/// A keyed bucket of `capacity` tokens refilling `capacity` per second, on a monotonic manual
/// clock: every key on the compact word.
fn keyed(capacity: u64, clock: &ManualClock, max_keys: Option<usize>) -> Keyed {
    let mut b = KeyedBucket::builder()
        .add_limit(|l| {
            l.capacity(capacity)
                .refill_greedy(capacity, Duration::from_secs(1))
        })
        .with_clock(clock.clone());
    if let Some(max) = max_keys {
        b = b.max_keys(max);
    }
    Arc::new(b.build().expect("valid"))
}

fn spawn<T: Send + 'static>(
    k: &Keyed,
    f: impl FnOnce(&Keyed) -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let k = Arc::clone(k);
    thread::spawn(move || f(&k))
}

/// A token taken while a sweep may forget the full bucket: the token is taken exactly once,
/// from the kept bucket or from a fresh one, and the key is left one token short either way.
#[test]
fn consume_races_a_sweep_that_forgets() {
    model(3, || {
        let clock = ManualClock::monotonic(0);
        let k = keyed(2, &clock, None);
        assert!(k.try_consume(&1, 1).expect("valid"));
        clock.advance(Duration::from_secs(1)); // full again: forgettable
        let consumer = spawn(&k, |k| k.try_consume(&1, 1).expect("valid"));
        let sweeper = spawn(&k, |k| k.sweep());
        assert!(consumer.join().expect("no panic"));
        let forgotten = sweeper.join().expect("no panic");
        assert!(forgotten <= 1);
        assert_eq!(k.available_tokens(&1).expect("valid"), 1);
        assert_eq!(k.len(), 1);
    });
}

/// Two threads store the same new key: one bucket, and the tokens of one bucket.
#[test]
fn two_threads_store_one_new_key() {
    model(3, || {
        let clock = ManualClock::monotonic(0);
        let k = keyed(1, &clock, None);
        let a = spawn(&k, |k| k.try_consume(&7, 1).expect("valid"));
        let b = spawn(&k, |k| k.try_consume(&7, 1).expect("valid"));
        let wins =
            usize::from(a.join().expect("no panic")) + usize::from(b.join().expect("no panic"));
        assert_eq!(wins, 1, "one token, one winner");
        assert_eq!(k.len(), 1);
    });
}

/// A removal racing a consumption: the key ends with a fresh bucket (removed last) or one token
/// short of it (consumed last), and the count of keys matches.
#[test]
fn remove_races_consume() {
    model(3, || {
        let clock = ManualClock::monotonic(0);
        let k = keyed(2, &clock, None);
        assert!(k.try_consume(&1, 1).expect("valid"));
        let consumer = spawn(&k, |k| k.try_consume(&1, 1).expect("valid"));
        let remover = spawn(&k, |k| k.remove(&1));
        assert!(consumer.join().expect("no panic"));
        assert!(remover.join().expect("no panic"), "the key had a bucket");
        let left = k.available_tokens(&1).expect("valid");
        assert!(left == 1 || left == 2, "{left}");
        assert_eq!(k.len(), usize::from(left == 1));
    });
}

/// Replacing the configuration while a token is taken: the token counts once, before or after.
#[test]
fn replace_races_consume() {
    model(3, || {
        let clock = ManualClock::monotonic(0);
        let k = keyed(4, &clock, None);
        assert!(k.try_consume(&1, 1).expect("valid"));
        let consumer = spawn(&k, |k| k.try_consume(&1, 1).expect("valid"));
        let replacer = spawn(&k, |k| {
            let bigger = BucketConfiguration::new(vec![
                Bandwidth::simple(10, Duration::from_secs(1)).expect("valid"),
            ])
            .expect("valid");
            k.replace_configuration(&1, bigger, TokensInheritanceStrategy::AsIs)
        });
        assert!(consumer.join().expect("no panic"));
        replacer.join().expect("no panic").expect("valid");
        // 4 − 1, then − 1 under either configuration (tokens carried as they are).
        assert_eq!(k.available_tokens(&1).expect("valid"), 2);
    });
}

/// A state that leaves the compact word (tokens above capacity) while another thread takes a
/// token: both count.
#[test]
fn upgrade_races_consume() {
    model(3, || {
        let clock = ManualClock::monotonic(0);
        let k = keyed(2, &clock, None);
        assert!(k.try_consume(&1, 1).expect("valid"));
        let adder = spawn(&k, |k| k.force_add_tokens(&1, 5).expect("valid"));
        let consumer = spawn(&k, |k| k.try_consume(&1, 1).expect("valid"));
        adder.join().expect("no panic");
        assert!(consumer.join().expect("no panic"));
        assert_eq!(k.available_tokens(&1).expect("valid"), 1 + 5 - 1);
    });
}

/// Two new keys against a cap of one, while a sweep may free the slot a full bucket holds: no
/// more keys than the cap, and a refusal only while the slot is held.
#[test]
fn the_cap_holds_under_racing_new_keys() {
    model(2, || {
        let clock = ManualClock::monotonic(0);
        let k = keyed(1, &clock, Some(1));
        assert!(k.try_consume(&0, 1).expect("valid"));
        clock.advance(Duration::from_secs(1)); // key 0 is full again: it can go
        let a = spawn(&k, |k| k.try_consume(&1, 1));
        let b = spawn(&k, |k| k.try_consume(&2, 1));
        let answers = [a.join().expect("no panic"), b.join().expect("no panic")];
        let served = answers.iter().filter(|r| **r == Ok(true)).count();
        let refused = answers
            .iter()
            .filter(|r| **r == Err(KeyedError::TooManyKeys { max: 1 }))
            .count();
        assert_eq!((served, refused), (1, 1), "{answers:?}");
        assert_eq!(k.len(), 1);
    });
}

/// A bucket stored while a sweep looks for room: whichever finishes last, the reading from
/// which the map looks again at the cap is no later than when that bucket can go, so a new
/// key then finds room.
#[test]
fn a_bucket_stored_during_a_sweep_is_not_lost_from_the_cap() {
    model(3, || {
        let clock = ManualClock::monotonic(0);
        let k = keyed(2, &clock, Some(2));
        assert!(k.try_consume(&0, 2).expect("valid")); // full again at 1 s
        let storer = spawn(&k, |k| k.try_consume(&1, 1).expect("valid")); // at 0.5 s
        let sweeper = spawn(&k, |k| k.sweep());
        assert!(storer.join().expect("no panic"));
        assert_eq!(sweeper.join().expect("no panic"), 0, "nothing is full yet");
        clock.advance(Duration::from_millis(500));
        assert_eq!(k.try_consume(&2, 1), Ok(true), "key 1 can go: room");
        assert_eq!(k.len(), 2);
    });
}
