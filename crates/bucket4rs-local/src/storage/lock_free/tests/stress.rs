//! Concurrency stress: every token is counted.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{Bucket, FastClock, LockFree, ManualClock, NewStorage, Storage, Synchronized};

const THREADS: usize = 8;
const ATTEMPTS: usize = 500;
const TOKENS: u64 = 1_000;

fn hourly<S: NewStorage + Storage>(clock: ManualClock) -> Bucket<S, ManualClock> {
    Bucket::builder()
        .add_limit(|l| {
            l.capacity(TOKENS)
                .refill_greedy(TOKENS, Duration::from_secs(3600))
        })
        .with_clock(clock)
        .build_storage::<S>()
        .expect("valid configuration")
}

/// 8 threads x 500 `try_consume(1)` on 1,000 tokens with a frozen clock: exactly 1,000 succeed.
fn exact_successes<S: NewStorage + Storage + Sync>(bucket: &Bucket<S, ManualClock>) -> u64 {
    let successes = AtomicU64::new(0);
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                barrier.wait();
                let mut mine = 0;
                for _ in 0..ATTEMPTS {
                    if bucket.try_consume(1).expect("1 is a valid token count") {
                        mine += 1;
                    }
                }
                successes.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    successes.load(Ordering::Relaxed)
}

/// The two one-bandwidth words: packed (a clock that may go back) and compact (monotonic).
fn one_word_clocks() -> [(ManualClock, bool); 2] {
    [
        (ManualClock::new(0), false),
        (ManualClock::monotonic(0), true),
    ]
}

#[test]
fn lock_free_grants_exactly_the_capacity_and_really_retries() {
    for (clock, compact) in one_word_clocks() {
        let mut retries = 0;
        // 100 runs, and more (up to 20 s) while none retried: on a machine busy with other
        // tests the threads may have run one after another, without contention.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut runs = 0;
        while runs < 100 || (retries == 0 && Instant::now() < deadline) {
            runs += 1;
            let bucket = hourly::<LockFree>(clock.clone());
            assert!(
                bucket.storage().is_packed(),
                "one bandwidth runs on one word"
            );
            assert_eq!(bucket.storage().is_compact(), compact);
            assert_eq!(exact_successes(&bucket), TOKENS);
            assert_eq!(bucket.available_tokens(), 0);
            assert_eq!(bucket.storage().is_compact(), compact);
            assert!(bucket.storage().is_packed());
            retries += bucket.storage().contention_retries();
        }
        // The compare-and-swap loop must actually have been exercised by contention.
        assert!(
            retries > 0,
            "no CAS retry in {runs} contended runs (compact: {compact}): the test proves nothing"
        );
    }
}

/// A forced addition beyond what the one-bandwidth word holds (above capacity for the compact
/// word, beyond 62 bits for the packed one), made and taken back while 8 threads consume, moves
/// the bucket to the slots mid-run: every token is still counted.
#[test]
fn leaving_packed_mode_mid_run_keeps_every_token() {
    // 1,000 per hour: a token is 3.6e9 scaled units, so 10^9 extra tokens exceed 62 bits.
    const EXTRA: u64 = 1_000_000_000;
    for (clock, compact) in one_word_clocks().into_iter().cycle().take(40) {
        let bucket = hourly::<LockFree>(clock.clone());
        assert_eq!(bucket.storage().is_compact(), compact);
        let successes = AtomicU64::new(0);
        let barrier = Barrier::new(THREADS + 1);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    barrier.wait();
                    let mut mine = 0;
                    for _ in 0..ATTEMPTS / 4 {
                        if bucket.try_consume(1).expect("valid") {
                            mine += 1;
                        }
                    }
                    successes.fetch_add(mine, Ordering::Relaxed);
                });
            }
            s.spawn(|| {
                barrier.wait();
                std::thread::yield_now();
                bucket.force_add_tokens(EXTRA).expect("valid");
                bucket.consume_ignoring_rate_limits(EXTRA).expect("valid");
            });
        });
        assert!(
            !bucket.storage().is_packed(),
            "the forced addition moved the bucket to the slots"
        );
        let taken = successes.load(Ordering::Relaxed);
        assert!(taken <= TOKENS);
        assert_eq!(bucket.available_tokens(), (TOKENS - taken) as i64);
    }
}

#[test]
fn synchronized_grants_exactly_the_capacity() {
    for _ in 0..100 {
        let bucket = hourly::<Synchronized>(ManualClock::new(0));
        assert_eq!(exact_successes(&bucket), TOKENS);
        assert_eq!(bucket.available_tokens(), 0);
    }
}

#[test]
fn two_bandwidths_lock_free_grant_exactly_the_smaller_capacity() {
    for _ in 0..20 {
        let bucket = Bucket::builder()
            .add_limit(|l| {
                l.capacity(5_000)
                    .refill_greedy(5_000, Duration::from_secs(3600))
            })
            .add_limit(|l| {
                l.capacity(700)
                    .refill_greedy(700, Duration::from_secs(3600))
            })
            .with_clock(ManualClock::new(0))
            .build()
            .expect("valid");
        assert_eq!(exact_successes(&bucket), 700);
        assert_eq!(
            bucket
                .as_verbose()
                .available_tokens()
                .available_tokens_per_bandwidth(),
            vec![4_300, 0]
        );
    }
}

/// Producers force-add tokens while consumers take them; the final balance is exactly
/// added − consumed.
fn mixed_workload<S: NewStorage + Storage + Sync>(clock: ManualClock) {
    // 2^30 tokens fit both one-word forms (a token is 10^9 scaled units).
    let bucket = Bucket::builder()
        .add_limit(|l| {
            l.capacity(1 << 30)
                .refill_greedy(1, Duration::from_secs(1))
                .initial_tokens(0)
        })
        .with_clock(clock)
        .build_storage::<S>()
        .expect("valid");
    let consumed = AtomicU64::new(0);
    let added = AtomicU64::new(0);
    let barrier = Barrier::new(4);
    std::thread::scope(|s| {
        for p in 0..2u64 {
            let (bucket, added, barrier) = (&bucket, &added, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..2_000u64 {
                    let n = 1 + (i + p) % 3;
                    if i % 2 == 0 {
                        bucket.add_tokens(n).expect("valid");
                    } else {
                        bucket.force_add_tokens(n).expect("valid");
                    }
                    added.fetch_add(n, Ordering::Relaxed);
                }
            });
        }
        for _ in 0..2 {
            s.spawn(|| {
                barrier.wait();
                for i in 0..3_000u64 {
                    let n = 1 + i % 2;
                    if bucket.try_consume(n).expect("valid") {
                        consumed.fetch_add(n, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let expected = added.load(Ordering::Relaxed) - consumed.load(Ordering::Relaxed);
    assert_eq!(bucket.available_tokens(), expected as i64);
}

#[test]
fn mixed_add_and_consume_balance_is_exact_lock_free() {
    for (clock, _) in one_word_clocks() {
        for _ in 0..10 {
            mixed_workload::<LockFree>(clock.clone());
        }
    }
}

#[test]
fn mixed_add_and_consume_balance_is_exact_synchronized() {
    for _ in 0..10 {
        mixed_workload::<Synchronized>(ManualClock::new(0));
    }
}

#[test]
fn replacing_the_configuration_while_consuming_loses_no_update() {
    for (clock, _) in one_word_clocks() {
        replace_while_consuming(clock);
    }
}

fn replace_while_consuming(clock: ManualClock) {
    // Capacity 10_000 in both configurations, AS_IS keeps the balance exactly: every successful
    // consume must be visible in the final balance even while replacements race with it.
    let bucket = Bucket::builder()
        .add_limit(|l| {
            l.capacity(10_000)
                .refill_greedy(1, Duration::from_secs(3600))
                .id("a")
        })
        .with_clock(clock)
        .build()
        .expect("valid");
    let other = crate::BucketConfiguration::builder()
        .add_bandwidth(
            crate::Bandwidth::builder()
                .capacity(10_000)
                .refill_intervally(1, Duration::from_secs(7200))
                .id("a")
                .build()
                .expect("valid"),
        )
        .build()
        .expect("valid");
    let first = bucket.configuration();
    let consumed = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..300 {
                let c = if i % 2 == 0 {
                    other.clone()
                } else {
                    first.clone()
                };
                bucket
                    .replace_configuration(c, crate::TokensInheritanceStrategy::AsIs)
                    .expect("valid");
            }
        });
        for _ in 0..3 {
            s.spawn(|| {
                for _ in 0..2_000 {
                    if bucket.try_consume(1).expect("valid") {
                        consumed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(
        bucket.available_tokens(),
        10_000 - consumed.load(Ordering::Relaxed) as i64
    );
    // Only two distinct configurations were ever used: the interned table did not grow.
    assert_eq!(bucket.configuration(), first);
}

#[test]
fn real_clock_never_grants_more_than_capacity_plus_refill() {
    // 100 tokens, 1,000 per second: over the run at most 100 + 1,000 * elapsed + 1 tokens.
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(100).refill_greedy(1_000, Duration::from_secs(1)))
        .with_clock(FastClock)
        .build()
        .expect("valid");
    assert!(
        bucket.storage().is_compact(),
        "the default clock is monotonic"
    );
    let granted = AtomicU64::new(0);
    let start = Instant::now();
    // At least 200 ms, and on until 200 tokens (twice the capacity) were granted: threads
    // starved by a busy machine lose the refill that overflowed the full bucket meanwhile.
    let wanted = 200;
    let deadline = Duration::from_secs(20);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let elapsed = start.elapsed();
                    let enough = granted.load(Ordering::Relaxed) >= wanted;
                    if (elapsed >= Duration::from_millis(200) && enough) || elapsed >= deadline {
                        break;
                    }
                    if bucket.try_consume(1).expect("valid") {
                        granted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let granted = granted.load(Ordering::Relaxed);
    let bound = 100.0 + 1_000.0 * elapsed + 2.0;
    assert!(
        granted as f64 <= bound,
        "granted {granted} tokens in {elapsed:.3} s, bound {bound}"
    );
    // And the limiter really lets the refill through.
    assert!(
        granted >= wanted,
        "granted only {granted} in {elapsed:.3} s"
    );
}
