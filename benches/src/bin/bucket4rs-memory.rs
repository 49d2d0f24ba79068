//! Memory figures for `cargo xtask bench`: bytes per local bucket (`size_of` plus heap) for
//! each strategy and 1, 2, 4 and 8 bandwidths, heap allocations per operation, and heap bytes
//! per key of the keyed limiters (`KeyedBucket` and governor's, `String` and `u64` keys) at
//! 1,000,000 keys. Prints one JSON document on stdout.
//!
//! Heap bytes are what the program asked the allocator for (a counting global allocator);
//! the allocator's own per-block overhead is not included.

use std::hint::black_box;
use std::mem::size_of;
use std::num::NonZeroU32;

use bucket4rs_benches::{CountingAllocator, governor_slow, keyed_slow, never_dry_n, slow};
use bucket4rs_local::{KeyedBucket, LockFreeBucket, SynchronizedBucket, UnsyncBucket};
use governor::RateLimiter;
use serde_json::{Value, json};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator::new();

const BUCKETS: usize = 10_000;
const OPS: u64 = 100_000;
const KEYS: usize = 1_000_000;

/// Average heap bytes per value held, over `BUCKETS` values made by `make` and then each
/// used once by `use_it`: (after building, after the first use).
#[allow(clippy::cast_precision_loss)]
fn heap_per<T>(make: impl Fn() -> T, use_it: impl Fn(&T)) -> (f64, f64) {
    let warm = make();
    use_it(&warm);
    drop(warm);
    let mut all = Vec::with_capacity(BUCKETS);
    let before = ALLOC.live();
    for _ in 0..BUCKETS {
        all.push(make());
    }
    let built = ALLOC.live();
    for b in &all {
        use_it(b);
    }
    let used = ALLOC.live();
    drop(all);
    let n = BUCKETS as f64;
    ((built - before) as f64 / n, (used - before) as f64 / n)
}

/// Heap allocation calls and net bytes per call of `op` (after one warm-up call).
#[allow(clippy::cast_precision_loss)]
fn allocs_per_op(op: impl Fn()) -> (f64, f64) {
    op();
    let (calls, live) = (ALLOC.calls(), ALLOC.live());
    for _ in 0..OPS {
        op();
    }
    (
        (ALLOC.calls() - calls) as f64 / OPS as f64,
        (ALLOC.live() - live) as f64 / OPS as f64,
    )
}

fn local() -> Vec<Value> {
    let mut rows = Vec::new();
    for n in [1_usize, 2, 4, 8] {
        macro_rules! row {
            ($name:literal, $ty:ty, $build:ident) => {{
                let (built, used) = heap_per(
                    || never_dry_n(n).$build().expect("config"),
                    |b| {
                        let _ = black_box(b.try_consume(1));
                    },
                );
                let ok = never_dry_n(n).$build().expect("config");
                let (calls, bytes) = allocs_per_op(|| {
                    let _ = black_box(ok.try_consume(1));
                });
                let denied = slow().$build().expect("config");
                let _ = denied.try_consume(1);
                let (d_calls, d_bytes) = allocs_per_op(|| {
                    let _ = black_box(denied.try_consume(1));
                });
                rows.push(json!({
                    "strategy": $name,
                    "bandwidths": n,
                    "size_of": size_of::<$ty>(),
                    "heap_after_build": built,
                    "heap_after_use": used,
                    "allocs_per_success": calls,
                    "bytes_per_success": bytes,
                    "allocs_per_denial": d_calls,
                    "bytes_per_denial": d_bytes,
                }));
            }};
        }
        row!("lock-free", LockFreeBucket, build);
        row!("synchronized", SynchronizedBucket, build_synchronized);
        row!("unsync", UnsyncBucket, build_unsynchronized);
    }
    rows
}

fn peers() -> Vec<Value> {
    let quota = governor::Quota::per_second(NonZeroU32::MAX);
    let (gov, _) = heap_per(
        || governor::RateLimiter::direct(quota),
        |g| {
            let _ = g.check();
        },
    );
    let (rl, _) = heap_per(
        || {
            ratelimit::Ratelimiter::builder(1000)
                .build()
                .expect("config")
        },
        |r| {
            let _ = r.try_wait();
        },
    );
    vec![
        json!({"name": "governor direct", "size_of": size_of::<governor::DefaultDirectRateLimiter>(), "heap": gov}),
        json!({"name": "ratelimit", "size_of": size_of::<ratelimit::Ratelimiter>(), "heap": rl}),
        json!({"name": "mutex-f64-std", "size_of": size_of::<bucket4rs_benches::TextbookStd>(), "heap": 0.0}),
        json!({"name": "mutex-f64-parking_lot", "size_of": size_of::<bucket4rs_benches::TextbookParkingLot>(), "heap": 0.0}),
    ]
}

/// Heap bytes per key once `KEYS` keys are held: `insert(key)` is called with each key
/// `"k<n>"` or `n` (made, then dropped, by the caller: what stays is the limiter's own copy),
/// and `len()` must then count every key.
#[allow(clippy::cast_precision_loss)]
fn per_key<T, K>(
    limiter: &T,
    key: impl Fn(usize) -> K,
    insert: impl Fn(&T, &K),
    len: impl Fn(&T) -> usize,
) -> f64 {
    let before = ALLOC.live();
    for n in 0..KEYS {
        let k = key(n);
        insert(limiter, &k);
    }
    let bytes = (ALLOC.live() - before) as f64;
    assert_eq!(len(limiter), KEYS, "a key was dropped or never stored");
    bytes / KEYS as f64
}

/// Heap bytes per key of `KeyedBucket` and of governor's `DefaultKeyedRateLimiter` at
/// `KEYS` keys, with `String` keys (`"k<n>"`; each side owns its copy, whose heap is counted)
/// and with `u64` keys. Each key's first call takes its one token of the hour: the bucket is
/// not full, so no sweep may forget it during the run, and governor keeps every key anyway.
/// The empty maps (built before counting) are left out.
fn keyed() -> Vec<Value> {
    let string_key = |n: usize| format!("k{n}");
    let u64_key = |n: usize| n as u64;

    let ours: KeyedBucket<String> = keyed_slow().build().expect("config");
    let ours_string = per_key(
        &ours,
        string_key,
        |l, k| assert!(l.try_consume(k, 1).expect("op")),
        KeyedBucket::len,
    );
    drop(ours);
    let gov: governor::DefaultKeyedRateLimiter<String> = RateLimiter::dashmap(governor_slow());
    let gov_string = per_key(
        &gov,
        string_key,
        |l, k| assert!(l.check_key(k).is_ok()),
        RateLimiter::len,
    );
    drop(gov);
    let ours: KeyedBucket<u64> = keyed_slow().build().expect("config");
    let ours_u64 = per_key(
        &ours,
        u64_key,
        |l, k| assert!(l.try_consume(k, 1).expect("op")),
        KeyedBucket::len,
    );
    drop(ours);
    let gov: governor::DefaultKeyedRateLimiter<u64> = RateLimiter::dashmap(governor_slow());
    let gov_u64 = per_key(
        &gov,
        u64_key,
        |l, k| assert!(l.check_key(k).is_ok()),
        RateLimiter::len,
    );
    drop(gov);

    let row = |name: &str, contender: &str, key: &str, bytes: f64| {
        json!({"name": name, "contender": contender, "keys": KEYS, "key": key,
            "heap_bytes_per_key": bytes})
    };
    vec![
        row(
            "KeyedBucket<String> (foldhash)",
            "KeyedBucket",
            "String",
            ours_string,
        ),
        row(
            "governor DefaultKeyedRateLimiter<String> (SipHash)",
            "governor keyed",
            "String",
            gov_string,
        ),
        row(
            "KeyedBucket<u64> (foldhash)",
            "KeyedBucket",
            "u64",
            ours_u64,
        ),
        row(
            "governor DefaultKeyedRateLimiter<u64> (SipHash)",
            "governor keyed",
            "u64",
            gov_u64,
        ),
    ]
}

fn main() {
    let doc = json!({
        "local": local(),
        "peers": peers(),
        "keyed": keyed(),
    });
    println!("{doc:#}");
}
