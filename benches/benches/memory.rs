//! Building a bucket of 1, 2, 4 and 8 bandwidths on each thread-safe strategy: the cost of
//! the allocations that the `bucket4rs-memory` binary counts in bytes.

use std::hint::black_box;

use bucket4rs_benches::never_dry_n;
use criterion::{BenchmarkId, Criterion};

pub(crate) fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory/build");
    for n in [1_usize, 2, 4, 8] {
        g.bench_with_input(BenchmarkId::new("lock-free", n), &n, |b, &n| {
            b.iter(|| black_box(never_dry_n(n).build().expect("config")));
        });
        g.bench_with_input(BenchmarkId::new("synchronized", n), &n, |b, &n| {
            b.iter(|| black_box(never_dry_n(n).build_synchronized().expect("config")));
        });
        g.bench_with_input(BenchmarkId::new("unsync", n), &n, |b, &n| {
            b.iter(|| black_box(never_dry_n(n).build_unsynchronized().expect("config")));
        });
    }
    g.finish();
}
