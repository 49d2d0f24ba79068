//! A counting global allocator shows that no strategy allocates per operation after `build()`,
//! and that a keyed bucket allocates only to store a key.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use bucket4rs_local::{Bucket, BucketListener, ManualClock, NewStorage, Storage};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to the system allocator; the thread-local counter
// is a const-initialized `Cell` whose access never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

fn workload<S: Storage, L: BucketListener>(bucket: &Bucket<S, ManualClock, L>) {
    for i in 0..10_000u64 {
        let _ = bucket.try_consume(1 + i % 3);
        let _ = bucket.try_consume_and_return_remaining(2);
        let _ = bucket.estimate_ability_to_consume(5);
        let _ = bucket.available_tokens();
        if i % 7 == 0 {
            let _ = bucket.add_tokens(3);
        }
        if i % 11 == 0 {
            let _ = bucket.consume_ignoring_rate_limits(2);
        }
        if i % 13 == 0 {
            let _ = bucket.try_consume_as_much_as_possible();
        }
        bucket.clock().advance_nanos(1_000);
    }
}

fn zero_allocations<S: NewStorage + Storage>(bandwidths: u64) {
    // A clock that may go back (packed word for one lock-free bandwidth) and a monotonic one
    // (compact word).
    for clock in [ManualClock::new(0), ManualClock::monotonic(0)] {
        zero_allocations_on::<S>(bandwidths, clock);
    }
}

fn zero_allocations_on<S: NewStorage + Storage>(bandwidths: u64, clock: ManualClock) {
    let mut builder = Bucket::builder().with_clock(clock);
    for k in 0..bandwidths {
        builder = builder.add_limit(move |l| {
            l.capacity(100 + k)
                .refill_greedy(10 + k, Duration::from_millis(10))
        });
    }
    let bucket = builder.build_storage::<S>().expect("valid");
    let n = allocations_during(|| workload(&bucket));
    assert_eq!(
        n, 0,
        "{bandwidths} bandwidths: {n} allocations in 70k operations"
    );
}

#[test]
fn lock_free_allocates_nothing_per_operation() {
    for k in [1, 2, 3, 6] {
        zero_allocations::<bucket4rs_local::LockFree>(k);
    }
}

#[test]
fn synchronized_allocates_nothing_per_operation() {
    for k in [1, 3, 6] {
        zero_allocations::<bucket4rs_local::Synchronized>(k);
    }
}

#[test]
fn unsynchronized_allocates_nothing_per_operation() {
    for k in [1, 3, 6] {
        zero_allocations::<bucket4rs_local::Unsynchronized>(k);
    }
}

#[test]
fn the_counter_does_count() {
    // Guard against a counter that always reads zero.
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 64]))) >= 1);
}

/// A keyed bucket allocates nothing for a key it holds (looked up by `&str`), nor for a key
/// it does not need to store (an estimate leaves a fresh bucket as it is); a key it stores
/// costs its owned `String` and the map's node.
#[test]
fn keyed_allocates_only_to_store_a_key() {
    use bucket4rs_local::KeyedBucket;
    let clock = ManualClock::monotonic(0);
    let keyed: KeyedBucket<String, ManualClock> = KeyedBucket::builder()
        .add_limit(|l| {
            l.capacity(1_000)
                .refill_greedy(1_000, Duration::from_secs(1))
        })
        .with_clock(clock.clone())
        .build()
        .expect("valid");
    let keys: Vec<String> = (0..1_000).map(|i| format!("k{i}")).collect();
    for k in &keys {
        assert!(keyed.try_consume(k.as_str(), 1).expect("valid"));
    }
    let known = allocations_during(|| {
        for _ in 0..10 {
            for k in &keys {
                let _ = keyed.try_consume(k.as_str(), 1);
                let _ = keyed.available_tokens(k.as_str());
            }
            clock.advance_nanos(1_000);
        }
    });
    assert_eq!(known, 0, "known keys");
    let unknown = allocations_during(|| {
        for i in 0..1_000 {
            let probe = keyed.estimate_ability_to_consume(unknown_key(i), 1);
            assert!(probe.expect("valid").can_be_consumed());
        }
    });
    assert_eq!(unknown, 0, "keys left fresh are not stored");
    let stored = allocations_during(|| {
        assert!(keyed.try_consume("a new key", 1).expect("valid"));
    });
    assert!(stored >= 1, "storing a key makes its String");
}

/// A key the test above never stores, named without allocating on the counted thread.
fn unknown_key(i: usize) -> &'static str {
    const NAMES: [&str; 4] = ["x0", "x1", "x2", "x3"];
    NAMES[i % NAMES.len()]
}
