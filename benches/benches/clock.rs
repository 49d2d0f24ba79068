//! The clock reads under the limiters: on one thread the clock is half or more of the cost.

use std::hint::black_box;
use std::time::Instant;

use bucket4rs_benches::QuantaClock;
use bucket4rs_core::Clock as _;
use bucket4rs_local::{FastClock, MonotonicClock, SystemMillisClock, SystemNanosClock};
use criterion::{Criterion, Throughput};
use governor::clock::Clock as _;

pub(crate) fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock/read");
    g.throughput(Throughput::Elements(1));
    g.bench_function("Instant::now", |b| b.iter(|| black_box(Instant::now())));
    let q = quanta::Clock::new();
    g.bench_function("quanta::Clock::now", |b| b.iter(|| black_box(q.now())));
    g.bench_function("quanta::Clock::raw", |b| b.iter(|| black_box(q.raw())));
    let fast = FastClock;
    g.bench_function("bucket4rs FastClock (default)", |b| {
        b.iter(|| black_box(fast.now_nanos()));
    });
    let qc = QuantaClock::new();
    g.bench_function("bucket4rs QuantaClock (bench)", |b| {
        b.iter(|| black_box(qc.now_nanos()));
    });
    let mono = MonotonicClock::new();
    g.bench_function("bucket4rs MonotonicClock", |b| {
        b.iter(|| black_box(mono.now_nanos()));
    });
    g.bench_function("bucket4rs SystemMillisClock", |b| {
        b.iter(|| black_box(SystemMillisClock.now_nanos()));
    });
    g.bench_function("bucket4rs SystemNanosClock", |b| {
        b.iter(|| black_box(SystemNanosClock.now_nanos()));
    });
    let gq = governor::clock::QuantaClock::default();
    g.bench_function("governor QuantaClock (default)", |b| {
        b.iter(|| black_box(gq.now()));
    });
    let gm = governor::clock::MonotonicClock;
    g.bench_function("governor MonotonicClock", |b| {
        b.iter(|| black_box(gm.now()));
    });
    g.finish();
}
