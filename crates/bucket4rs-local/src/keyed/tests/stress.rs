//! Every token of every key counted while the map changes under the consumers: threads take
//! tokens from a few keys while the clock moves (so buckets fill up and become forgettable),
//! one thread sweeps, one removes and replaces other keys, one floods the capped map with new
//! keys. No key is ever granted more than its limit allows over the run — which a bucket
//! forgotten while short of full, or a token taken from a bucket after it was forgotten, would
//! exceed — and the map's count of keys matches what it holds.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::{
    Bandwidth, BucketConfiguration, KeyedBucket, KeyedError, ManualClock, TokensInheritanceStrategy,
};

const CAPACITY: u64 = 4;
/// The limit refills `CAPACITY` tokens per `PERIOD`.
const PERIOD: Duration = Duration::from_millis(1);
const COUNTED: u64 = 8;
const CONSUMERS: usize = 3;
const STEPS: u64 = 200;

#[test]
fn no_key_is_granted_more_than_its_limit_while_the_map_changes() {
    let clock = ManualClock::monotonic(0);
    let keyed: KeyedBucket<u64, ManualClock> = KeyedBucket::builder()
        .add_limit(|l| l.capacity(CAPACITY).refill_greedy(CAPACITY, PERIOD))
        .with_clock(clock.clone())
        .max_keys(64)
        .build()
        .expect("valid");
    let granted: Vec<AtomicU64> = (0..COUNTED).map(|_| AtomicU64::new(0)).collect();
    let (forgotten, refused, removed) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let flooded = AtomicUsize::new(0);
    let other = BucketConfiguration::new(vec![
        Bandwidth::simple(2, Duration::from_secs(1)).expect("valid"),
    ])
    .expect("valid");
    for k in 1_000..1_016_u64 {
        keyed
            .replace_configuration(&k, other.clone(), TokensInheritanceStrategy::AsIs)
            .expect("room");
    }
    let done = AtomicBool::new(false);
    let barrier = Barrier::new(CONSUMERS + 4);
    std::thread::scope(|s| {
        for t in 0..CONSUMERS {
            let (keyed, granted, done, barrier) = (&keyed, &granted, &done, &barrier);
            s.spawn(move || {
                barrier.wait();
                let mut k = t as u64;
                while !done.load(Ordering::Relaxed) {
                    k = (k + 1) % COUNTED;
                    match keyed.try_consume(&k, 1) {
                        Ok(true) => {
                            granted[k as usize].fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(false) | Err(KeyedError::TooManyKeys { .. }) => {}
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            });
        }
        // The sweeper.
        s.spawn(|| {
            barrier.wait();
            while !done.load(Ordering::Relaxed) {
                forgotten.fetch_add(keyed.sweep(), Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        // Other keys removed and replaced: each starts stored under another configuration
        // (never forgotten), so the first removal of each finds it.
        s.spawn(|| {
            barrier.wait();
            let mut k = 1_000_u64;
            // Until the end, and at least one removal (the first one removes a stored key).
            while !done.load(Ordering::Relaxed) || removed.load(Ordering::Relaxed) == 0 {
                k = 1_000 + (k + 1) % 16;
                removed.fetch_add(usize::from(keyed.remove(&k)), Ordering::Relaxed);
                let _ = keyed.try_consume(&k, 1);
                if k.is_multiple_of(2) {
                    let _ = keyed.replace_configuration(
                        &k,
                        other.clone(),
                        TokensInheritanceStrategy::AsIs,
                    );
                }
            }
        });
        // New keys against the cap.
        s.spawn(|| {
            barrier.wait();
            let mut k = 1_000_000_u64;
            // Until the end, and at least one refusal (without the clock moving, the cap fills).
            while !done.load(Ordering::Relaxed) || refused.load(Ordering::Relaxed) == 0 {
                k += 1;
                match keyed.try_consume(&k, 1) {
                    Err(KeyedError::TooManyKeys { .. }) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(true) => {
                        flooded.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("a new key: {other:?}"),
                }
            }
        });
        // The clock: a quarter of the period at a time, once the consumers took a few tokens
        // since the last step (or after a bounded wait).
        barrier.wait();
        let total = || {
            granted
                .iter()
                .map(|g| g.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        for _ in 0..STEPS {
            let seen = total();
            for _ in 0..1_000 {
                if total() > seen {
                    break;
                }
                std::thread::yield_now();
            }
            clock.advance(PERIOD / 4);
        }
        done.store(true, Ordering::Relaxed);
    });
    // Over the run, a key's limit allows its capacity plus the refill of the time that
    // passed; every consumer has stopped, so each count is final.
    let elapsed = u64::try_from(crate::Clock::now_nanos(&clock)).expect("after 0");
    let allowed = CAPACITY + CAPACITY * elapsed / PERIOD.as_nanos() as u64;
    for (k, g) in granted.iter().enumerate() {
        let g = g.load(Ordering::Relaxed);
        assert!(
            g <= allowed,
            "key {k}: {g} tokens granted during the run, {allowed} allowed"
        );
        assert!(g > CAPACITY, "key {k} was served ({g})");
    }
    // Every bucket is full 10 periods later, and a sweep forgets them.
    clock.advance(PERIOD * 10);
    forgotten.fetch_add(keyed.sweep(), Ordering::Relaxed);
    // A forgotten bucket comes back as a fresh one: exactly its capacity, never more.
    for k in 0..COUNTED {
        let mut left = 0;
        while keyed.try_consume(&k, 1) == Ok(true) {
            left += 1;
        }
        assert_eq!(left, CAPACITY, "key {k} after the final sweep");
    }
    // The run did what it is for: buckets were forgotten, keys removed, new keys refused.
    assert!(
        forgotten.load(Ordering::Relaxed) > 0,
        "nothing was forgotten"
    );
    assert!(removed.load(Ordering::Relaxed) > 0, "nothing was removed");
    assert!(refused.load(Ordering::Relaxed) > 0, "the cap was never hit");
    assert!(keyed.len() <= 64);
    let mut held = 0;
    keyed.shared.map.retain(|_, e| {
        held += usize::from(!e.is_gone());
        true
    });
    assert_eq!(keyed.len(), held, "the count of keys is what the map holds");
}
