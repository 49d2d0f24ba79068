//! Keyed limiters: one bucket per key, `String` keys on both sides. bucket4rs-local's
//! `KeyedBucket` (papaya's map of the key to a 64-bit GCRA word) next to governor's
//! `DefaultKeyedRateLimiter<String>` (a dashmap of the key to a 64-bit GCRA word), at 1, 10,000
//! and 100,000 keys and 1 and 2 threads, in three regimes: busy keys allowed (`keyed/success`:
//! a limit no key fills up again), busy keys refused (`keyed/rejection`), and light keys
//! (`keyed/light`: a limit that refills faster than a key comes back, so every bucket is full,
//! and may be forgotten, between two visits; every call allowed). `KeyedBucket (SipHash)` is
//! the same limiter on std's `RandomState`, governor's hasher, which separates the hasher from
//! the rest. The keys are rendered once (`"k0"`, `"k1"`, …) and visited round-robin, each thread
//! from its own offset; every run checks that every call was answered as expected (all
//! allowed, all refused) and, for busy keys, that no key was dropped.
//!
//! `keyed/cap`: a `KeyedBucket` whose key cap is full of buckets that can never be forgotten,
//! at 1,000, 100,000 and 1,000,000 keys: the time of a new key refused at the cap beside the
//! time of a known key's call, one thread (flat in the map's size when the cap costs no sweep
//! per refused key).
//!
//! Then the Redis and PostgreSQL backends when built with `--features redis,postgres` and the
//! server answers (`BUCKET4RS_REDIS_URL`, `BUCKET4RS_POSTGRES_URL`); otherwise the run notes
//! why they were skipped instead of failing.

use std::hash::RandomState;
#[cfg(any(feature = "redis", feature = "postgres"))]
use std::hint::black_box;

use bucket4rs_benches::KEYED_CAPACITY;
use bucket4rs_benches::{
    governor_light, governor_never_dry, governor_slow, keyed_label, keyed_light, keyed_never_dry,
    keyed_slow, keys, note, run_threads_over,
};
use bucket4rs_local::{KeyedBucket, KeyedBucketBuilder, KeyedError};
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput, measurement::WallTime};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

const KEYS: [usize; 3] = [1, 10_000, 100_000];
const CAP_KEYS: [usize; 3] = [1_000, 100_000, 1_000_000];
const THREADS: [usize; 2] = [1, 2];

pub(crate) fn bench(c: &mut Criterion) {
    let all = keys(KEYS[KEYS.len() - 1]);
    let mut g = c.benchmark_group("keyed/success");
    g.throughput(Throughput::Elements(1));
    matrix(&mut g, &all, &Path::Success);
    g.finish();
    let mut g = c.benchmark_group("keyed/rejection");
    g.throughput(Throughput::Elements(1));
    matrix(&mut g, &all, &Path::Rejection);
    g.finish();
    let mut g = c.benchmark_group("keyed/light");
    g.throughput(Throughput::Elements(1));
    matrix(&mut g, &all, &Path::Light);
    g.finish();
    let mut g = c.benchmark_group("keyed/cap");
    g.throughput(Throughput::Elements(1));
    cap(&mut g);
    g.finish();
    // Network round trips take 0.05–5 ms: 10 samples are plenty, and keep a full run short.
    let mut g = c.benchmark_group("keyed_remote/try_consume");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    redis(&mut g);
    postgres(&mut g);
    g.finish();
}

/// Which outcome every measured call must have.
enum Path {
    /// A limit that never runs dry: every call allowed.
    Success,
    /// One token an hour, taken from every key before measuring: every call refused.
    Rejection,
    /// A limit that refills faster than a key comes back: every call allowed, every bucket
    /// forgettable between two visits.
    Light,
}

impl Path {
    fn keyed<K>(&self) -> KeyedBucketBuilder<K> {
        match self {
            Self::Success => keyed_never_dry(),
            Self::Rejection => keyed_slow(),
            Self::Light => keyed_light(),
        }
    }

    fn quota(&self) -> Quota {
        match self {
            Self::Success => governor_never_dry(),
            Self::Rejection => governor_slow(),
            Self::Light => governor_light(),
        }
    }

    fn allowed(&self) -> bool {
        !matches!(self, Self::Rejection)
    }

    /// Whether every key's bucket must stay stored (a light key's may be forgotten).
    fn kept(&self) -> bool {
        !matches!(self, Self::Light)
    }
}

/// Every contender at every key and thread count, side by side: for each parameter, a fresh
/// limiter per contender whose keys were each used once (stored, and for the denied path
/// drained), then measured.
fn matrix(g: &mut BenchmarkGroup<'_, WallTime>, all: &[String], path: &Path) {
    let allowed = path.allowed();
    for n in KEYS {
        let keys = &all[..n];
        for threads in THREADS {
            let id = |name| BenchmarkId::new(name, keyed_label(n, threads));

            let ours: KeyedBucket<String> = path.keyed().build().expect("config");
            prepare(keys, path, |k| ours.try_consume(k, 1).expect("op"));
            g.bench_function(id("KeyedBucket"), |b| {
                b.iter_custom(|iters| {
                    measure(
                        threads,
                        iters,
                        keys,
                        allowed,
                        |k| matches!(ours.try_consume(k, 1), Ok(a) if a == allowed),
                    )
                });
            });
            assert!(
                ours.len() == n || !path.kept(),
                "KeyedBucket dropped a key mid-run"
            );

            let sip: KeyedBucket<String, _, _, RandomState> = path
                .keyed()
                .with_hasher(RandomState::new())
                .build()
                .expect("config");
            prepare(keys, path, |k| sip.try_consume(k, 1).expect("op"));
            g.bench_function(id("KeyedBucket (SipHash)"), |b| {
                b.iter_custom(|iters| {
                    measure(
                        threads,
                        iters,
                        keys,
                        allowed,
                        |k| matches!(sip.try_consume(k, 1), Ok(a) if a == allowed),
                    )
                });
            });
            assert!(
                sip.len() == n || !path.kept(),
                "KeyedBucket (SipHash) dropped a key mid-run"
            );

            let gov: DefaultKeyedRateLimiter<String> = RateLimiter::dashmap(path.quota());
            prepare(keys, path, |k| gov.check_key(k).is_ok());
            g.bench_function(id("governor keyed"), |b| {
                b.iter_custom(|iters| {
                    measure(threads, iters, keys, allowed, |k| {
                        gov.check_key(k).is_ok() == allowed
                    })
                });
            });
            assert_eq!(gov.len(), n, "governor keyed dropped a key mid-run");
        }
    }
}

/// Uses every key once, which must be allowed (the key is stored); on the denied path a
/// second call must then be refused.
fn prepare(keys: &[String], path: &Path, take: impl Fn(&String) -> bool) {
    for k in keys {
        assert!(take(k), "the first call on {k} was refused");
        if !path.allowed() {
            assert!(!take(k), "{k} was not drained by one call");
        }
    }
}

/// `iters` calls over `threads` threads walking `keys`; panics unless every call answered as
/// expected (`expected(key)` says whether it did).
fn measure(
    threads: usize,
    iters: u64,
    keys: &[String],
    allowed: bool,
    expected: impl Fn(&String) -> bool + Sync,
) -> std::time::Duration {
    let (time, wrong) = run_threads_over(threads, iters, keys.len(), |i| expected(&keys[i]));
    assert_eq!(
        wrong,
        0,
        "{wrong} of {iters} calls were not {}",
        if allowed { "allowed" } else { "refused" }
    );
    time
}

/// A refused new key and a known key's call on a map whose key cap is full of buckets that can
/// never be forgotten (they start short of capacity), at each size of [`CAP_KEYS`].
fn cap(g: &mut BenchmarkGroup<'_, WallTime>) {
    let fresh = keys(100_000);
    let fresh: Vec<String> = fresh.iter().map(|k| format!("new-{k}")).collect();
    for n in CAP_KEYS {
        let keyed: KeyedBucket<String> = KeyedBucket::builder()
            .add_limit(|l| {
                l.capacity(KEYED_CAPACITY)
                    .refill_greedy(1, std::time::Duration::from_secs(1))
                    .initial_tokens(KEYED_CAPACITY / 2)
            })
            .max_keys(n)
            .build()
            .expect("config");
        let stored = keys(n);
        for k in &stored {
            assert!(
                keyed.try_consume(k.as_str(), 1).expect("room"),
                "{k} refused"
            );
        }
        assert_eq!(keyed.len(), n);
        g.bench_function(BenchmarkId::new("refused new key", n), |b| {
            b.iter_custom(|iters| {
                measure(1, iters, &fresh, false, |k| {
                    matches!(
                        keyed.try_consume(k.as_str(), 1),
                        Err(KeyedError::TooManyKeys { .. })
                    )
                })
            });
        });
        g.bench_function(BenchmarkId::new("known key", n), |b| {
            b.iter_custom(|iters| {
                measure(1, iters, &stored, true, |k| {
                    matches!(keyed.try_consume(k.as_str(), 1), Ok(true))
                })
            });
        });
        assert_eq!(keyed.len(), n);
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

#[cfg(any(feature = "redis", feature = "postgres"))]
fn buckets<B: bucket4rs_distributed::Backend>(
    manager: &bucket4rs_distributed::ProxyManager<B>,
    n: usize,
) -> Vec<bucket4rs_distributed::RemoteBucket<B>> {
    (0..n)
        .map(|k| {
            manager
                .builder()
                .build(format!("k{k}"), bucket4rs_benches::keyed_config)
                .expect("bucket")
        })
        .collect()
}

#[cfg(any(feature = "redis", feature = "postgres"))]
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
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
    let manager = match bucket4rs_distributed::ProxyManager::configure(backend)
        .key_prefix(prefix)
        .build()
    {
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
