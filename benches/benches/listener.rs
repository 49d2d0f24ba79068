//! What a listener costs on the hot path: a bucket with no listener, with an explicit
//! `NoopListener` (should be identical: it compiles away), and with `SimpleBucketListener`
//! (atomic counters) for scale, on the lock-free and synchronized strategies.

use std::hint::black_box;
use std::time::Duration;

use bucket4rs_core::{BucketListener, NoopListener};
use bucket4rs_listeners::SimpleBucketListener;
use bucket4rs_local::{Bucket, BucketBuilder, NewStorage};
use criterion::Criterion;

pub(crate) fn bench(c: &mut Criterion) {
    strategy::<bucket4rs_local::LockFree>(c, "lock_free");
    strategy::<bucket4rs_local::Synchronized>(c, "synchronized");
}

/// A bucket that never runs dry during a benchmark: `try_consume(1)` always succeeds (a
/// billion tokens, refilled at one per nanosecond, faster than any loop consumes them).
fn builder() -> BucketBuilder {
    Bucket::builder().add_limit(|l| {
        l.capacity(1_000_000_000)
            .refill_greedy(1_000_000_000, Duration::from_secs(1))
    })
}

fn run<S: NewStorage, L: BucketListener>(
    c: &mut Criterion,
    strategy: &str,
    bucket: Bucket<S, bucket4rs_local::FastClock, L>,
    id: &str,
) {
    c.benchmark_group(format!("listener/{strategy}"))
        .bench_function(id, |b| b.iter(|| bucket.try_consume(black_box(1))));
}

fn strategy<S: NewStorage>(c: &mut Criterion, name: &str) {
    let simple = SimpleBucketListener::new();
    run(
        c,
        name,
        builder().build_storage::<S>().unwrap(),
        "no_listener",
    );
    run(
        c,
        name,
        builder()
            .with_listener(NoopListener)
            .build_storage::<S>()
            .unwrap(),
        "noop_listener",
    );
    run(
        c,
        name,
        builder()
            .with_listener(&simple)
            .build_storage::<S>()
            .unwrap(),
        "simple_listener",
    );
    black_box(simple.consumed());
}
