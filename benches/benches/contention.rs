//! Threads on one bucket, released together by a barrier. Criterion's time per iteration is
//! the aggregate time per operation (wall time / operations of all threads), and its
//! throughput is the aggregate rate. Thread counts above the core count are labelled
//! `N-oversubscribed`: there the OS time-slices the threads.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use bucket4rs_benches::{
    HUGE, TextbookParkingLot, TextbookStd, never_dry, run_threads, slow, threads_label,
};
use criterion::{BenchmarkId, Criterion, Throughput};
use governor::{Quota, RateLimiter};

const THREADS: [usize; 4] = [1, 2, 4, 8];

pub(crate) fn bench(c: &mut Criterion) {
    success(c);
    rejection(c);
}

macro_rules! contenders {
    ($g:ident, $( $name:literal => $op:expr ),* $(,)?) => {
        for threads in THREADS {
            $(
                $g.bench_with_input(
                    BenchmarkId::new($name, threads_label(threads)),
                    &threads,
                    |b, &t| b.iter_custom(|iters| run_threads(t, iters, || { let _ = black_box($op); })),
                );
            )*
        }
    };
}

fn success(c: &mut Criterion) {
    let mut g = c.benchmark_group("contention/success");
    g.throughput(Throughput::Elements(1));
    let lf = never_dry().build().expect("config");
    let sy = never_dry().build_synchronized().expect("config");
    let gov = RateLimiter::direct(Quota::per_second(NonZeroU32::MAX));
    let rl = ratelimit::Ratelimiter::builder(HUGE)
        .max_tokens(HUGE)
        .initial_available(HUGE)
        .build()
        .expect("ratelimit config");
    let tb_std = TextbookStd::new(HUGE, 1e12, HUGE);
    let tb_pl = TextbookParkingLot::new(HUGE, 1e12, HUGE);
    let floor = AtomicU64::new(u64::MAX);
    contenders!(g,
        "lock-free" => matches!(lf.try_consume(1), Ok(true)),
        "synchronized" => matches!(sy.try_consume(1), Ok(true)),
        "governor" => gov.check().is_ok(),
        "ratelimit" => rl.try_wait().is_ok(),
        "mutex-f64-std" => tb_std.try_acquire(),
        "mutex-f64-parking_lot" => tb_pl.try_acquire(),
        "floor fetch_sub" => floor.fetch_sub(1, Ordering::AcqRel),
    );
    g.finish();
    // Every call above must have succeeded; a denial would mean a misconfigured benchmark.
    assert!(lf.try_consume(1).expect("op") && sy.try_consume(1).expect("op"));
    assert!(gov.check().is_ok() && rl.try_wait().is_ok());
}

fn rejection(c: &mut Criterion) {
    let mut g = c.benchmark_group("contention/rejection");
    g.throughput(Throughput::Elements(1));
    let lf = slow().build().expect("config");
    let sy = slow().build_synchronized().expect("config");
    let gov = RateLimiter::direct(Quota::per_hour(NonZeroU32::MIN));
    let rl = ratelimit::Ratelimiter::builder(1)
        .period(std::time::Duration::from_secs(3600))
        .max_tokens(1)
        .initial_available(1)
        .build()
        .expect("ratelimit config");
    for _ in 0..2 {
        let _ = (
            lf.try_consume(1),
            sy.try_consume(1),
            gov.check(),
            rl.try_wait(),
        );
    }
    contenders!(g,
        "lock-free" => matches!(lf.try_consume(1), Ok(true)),
        "synchronized" => matches!(sy.try_consume(1), Ok(true)),
        "governor" => gov.check().is_ok(),
        "ratelimit" => rl.try_wait().is_ok(),
    );
    g.finish();
}
