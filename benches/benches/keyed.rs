//! Keyed limiters: one bucket per key, the keys visited round-robin. governor's
//! `DefaultKeyedRateLimiter` (dashmap) next to bucket4rs-distributed's embedded backend (also
//! dashmap, through the async `ProxyManager`, polled in place as an `.await` would), and the
//! Redis and PostgreSQL backends when built with `--features redis,postgres` and the server
//! answers (`BUCKET4RS_REDIS_URL`, `BUCKET4RS_POSTGRES_URL`); otherwise the run notes why
//! they were skipped instead of failing.

use std::hint::black_box;
use std::num::NonZeroU32;

use bucket4rs_benches::{keyed_config, note, run_now};
use bucket4rs_distributed::{EmbeddedBackend, ProxyManager, RemoteBucket};
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput, measurement::WallTime};
use governor::{Quota, RateLimiter};

const KEYS: [usize; 2] = [1, 10_000];

pub(crate) fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed/try_consume");
    g.throughput(Throughput::Elements(1));
    governor_keyed(&mut g);
    embedded(&mut g);
    g.finish();
    // Network round trips take 0.05–5 ms: 10 samples are plenty, and keep a full run short.
    let mut g = c.benchmark_group("keyed_remote/try_consume");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    redis(&mut g);
    postgres(&mut g);
    g.finish();
}

fn governor_keyed(g: &mut BenchmarkGroup<'_, WallTime>) {
    for n in KEYS {
        let gov: governor::DefaultKeyedRateLimiter<u64> =
            RateLimiter::dashmap(Quota::per_second(NonZeroU32::MAX));
        for k in 0..n as u64 {
            assert!(gov.check_key(&k).is_ok());
        }
        g.bench_with_input(BenchmarkId::new("governor keyed", n), &n, |b, &n| {
            let mut i = 0_u64;
            b.iter(|| {
                i = if i + 1 == n as u64 { 0 } else { i + 1 };
                black_box(gov.check_key(&i).is_ok())
            });
        });
    }
}

fn buckets<B: bucket4rs_distributed::Backend>(
    manager: &ProxyManager<B>,
    n: usize,
) -> Vec<RemoteBucket<B>> {
    (0..n)
        .map(|k| {
            manager
                .builder()
                .build(format!("k{k}"), keyed_config)
                .expect("bucket")
        })
        .collect()
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn embedded(g: &mut BenchmarkGroup<'_, WallTime>) {
    let rt = current_thread();
    for n in KEYS {
        let manager = ProxyManager::new(EmbeddedBackend::new());
        let all = buckets(&manager, n);
        for b in &all {
            assert!(run_now(&rt, b.try_consume(1)).expect("embedded op"));
        }
        g.bench_with_input(BenchmarkId::new("embedded", n), &n, |bn, &n| {
            let mut i = 0;
            bn.iter(|| {
                i = if i + 1 == n { 0 } else { i + 1 };
                black_box(run_now(&rt, all[i].try_consume(1)).is_ok())
            });
        });
    }
}

#[cfg(not(feature = "redis"))]
fn redis(_: &mut BenchmarkGroup<'_, WallTime>) {
    note("keyed: Redis backend skipped: built without `--features redis`");
}

#[cfg(feature = "redis")]
fn redis(g: &mut BenchmarkGroup<'_, WallTime>) {
    use bucket4rs_distributed::{RedisBackend, RedisOptions};
    use std::time::Duration;

    let url =
        std::env::var("BUCKET4RS_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let rt = current_thread();
    let options = RedisOptions::default().connect_timeout(Duration::from_secs(2));
    match rt.block_on(RedisBackend::connect(&url, options)) {
        Ok(backend) => remote(g, "redis", &rt, backend, &KEYS),
        Err(e) => note(&format!(
            "keyed: Redis backend skipped: {url} unreachable: {e}"
        )),
    }
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &mut BenchmarkGroup<'_, WallTime>) {
    note("keyed: PostgreSQL backend skipped: built without `--features postgres`");
}

#[cfg(feature = "postgres")]
fn postgres(g: &mut BenchmarkGroup<'_, WallTime>) {
    use bucket4rs_distributed::{PostgresBackend, PostgresOptions};
    use std::time::Duration;

    let url = std::env::var("BUCKET4RS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let rt = current_thread();
    let options = match PostgresOptions::default().table("bucket4rs_bench") {
        Ok(o) => o.connect_timeout(Duration::from_secs(2)),
        Err(e) => return note(&format!("keyed: PostgreSQL backend skipped: {e}")),
    };
    let backend = match rt.block_on(PostgresBackend::connect(&url, options)) {
        Ok(b) => b,
        Err(e) => {
            return note(&format!(
                "keyed: PostgreSQL backend skipped: {url} unreachable: {e}"
            ));
        }
    };
    if let Err(e) = rt.block_on(backend.migrate()) {
        return note(&format!(
            "keyed: PostgreSQL backend skipped: migration: {e}"
        ));
    }
    // Each write is a committed transaction (milliseconds): 1,000 keys, not 10,000, keep the
    // setup and clean-up within seconds.
    remote(g, "postgres", &rt, backend, &[1, 1_000]);
}

/// One call at a time through `block_on` on a current-thread runtime: one round trip each.
/// The keys are removed afterwards.
#[cfg(any(feature = "redis", feature = "postgres"))]
fn remote<B: bucket4rs_distributed::Backend>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    rt: &tokio::runtime::Runtime,
    backend: B,
    keys: &[usize],
) {
    let prefix = format!("bucket4rs-bench-{}", std::process::id());
    let manager = match ProxyManager::configure(backend).key_prefix(prefix).build() {
        Ok(m) => m,
        Err(e) => return note(&format!("keyed: {name} backend skipped: manager: {e}")),
    };
    for &n in keys {
        let all = buckets(&manager, n);
        if let Err(e) = all
            .iter()
            .try_for_each(|b| rt.block_on(b.try_consume(1)).map(drop))
        {
            note(&format!("keyed: {name} backend skipped: {e}"));
            break;
        }
        g.bench_with_input(BenchmarkId::new(name, n), &n, |bn, &n| {
            let mut i = 0;
            bn.iter(|| {
                i = if i + 1 == n { 0 } else { i + 1 };
                black_box(rt.block_on(all[i].try_consume(1)).is_ok())
            });
        });
        for k in 0..n {
            let _ = rt.block_on(manager.remove(format!("k{k}")));
        }
    }
}
