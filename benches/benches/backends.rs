//! The backends of bucket4rs-distributed side by side (`backends/try_consume`): the embedded
//! store, SQLite (a file on this machine's disk, built with `--features sqlite`) and
//! PostgreSQL (`--features postgres`, when `BUCKET4RS_POSTGRES_URL` answers), each with 1 and
//! 16 clients on 1 and 10,000 keys.
//!
//! A client is a task calling `try_consume(1)` (always granted) in a loop on a manager shared by
//! all of them (one backend: the embedded store, one SQLite connection on its thread, one
//! PostgreSQL pool of 16 connections), on a tokio runtime of two workers; each client visits
//! the keys round-robin from its own offset. The figure is the aggregate time per operation:
//! the wall time of a sample divided by every client's operations. The keys are created (and,
//! on PostgreSQL, removed) outside the measurement. SQLite commits every write to disk
//! (`synchronous = FULL`), so its 10,000 keys take some seconds to create.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bucket4rs_benches::note;
use bucket4rs_distributed::{Backend, ProxyManager, RemoteBucket};
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput, measurement::WallTime};

const KEYS: [usize; 2] = [1, 10_000];
const CLIENTS: [usize; 2] = [1, 16];

pub(crate) fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Calls take microseconds to milliseconds: 10 samples, as for the remote groups.
    let mut g = c.benchmark_group("backends/try_consume");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    let embedded = bucket4rs_distributed::EmbeddedBackend::new();
    matrix(&mut g, "embedded", &rt, embedded);
    sqlite(&mut g, &rt);
    postgres(&mut g, &rt);
    g.finish();
}

/// `"1 key, 16 clients"`.
fn label(keys: usize, clients: usize) -> String {
    let k = if keys == 1 { "key" } else { "keys" };
    let c = if clients == 1 { "client" } else { "clients" };
    format!("{keys} {k}, {clients} {c}")
}

/// Every cell of the matrix on `backend`; the keys are removed afterwards.
fn matrix<B: Backend>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    rt: &tokio::runtime::Runtime,
    backend: B,
) {
    let manager = match ProxyManager::configure(backend)
        .key_prefix(format!("bucket4rs-bench-backends-{}", std::process::id()))
        .timeout(Duration::from_secs(30))
        .build()
    {
        Ok(m) => m,
        Err(e) => return note(&format!("backends: {name} skipped: manager: {e}")),
    };
    for keys in KEYS {
        let buckets: Arc<Vec<RemoteBucket<B>>> = Arc::new(
            (0..keys)
                .map(|k| {
                    manager
                        .builder()
                        .build(format!("k{k}"), bucket4rs_benches::keyed_config)
                        .expect("bucket")
                })
                .collect(),
        );
        let started = Instant::now();
        if let Err(e) = rt.block_on(each_key(&buckets, 16, |b| async move {
            b.try_consume(1).await.map(drop)
        })) {
            note(&format!("backends: {name} skipped: creating the keys: {e}"));
            return;
        }
        eprintln!(
            "backends: {name}: {} created in {:.1} s",
            label(keys, 1).split(',').next().unwrap_or_default(),
            started.elapsed().as_secs_f64()
        );
        for clients in CLIENTS {
            g.bench_with_input(
                BenchmarkId::new(name, label(keys, clients)),
                &clients,
                |bn, &clients| {
                    bn.iter_custom(|iters| rt.block_on(run(&buckets, clients, iters)));
                },
            );
        }
        let removed = rt.block_on(each_key(&buckets, 16, |b| {
            let key = b.key().clone();
            let backend = manager.backend();
            async move { backend.remove(&key).await.map(drop) }
        }));
        if let Err(e) = removed {
            note(&format!("backends: {name}: removing the keys: {e}"));
        }
    }
}

/// `f` on every bucket, from `tasks` tasks at once; the first error.
async fn each_key<'a, B, F, Fut, E>(
    buckets: &'a [RemoteBucket<B>],
    tasks: usize,
    f: F,
) -> Result<(), String>
where
    B: Backend,
    F: Fn(&'a RemoteBucket<B>) -> Fut,
    Fut: core::future::Future<Output = Result<(), E>> + 'a,
    E: core::fmt::Display,
{
    let chunks = buckets.chunks(buckets.len().div_ceil(tasks));
    let work = chunks.map(|chunk| {
        let f = &f;
        async move {
            for b in chunk {
                f(b).await.map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(())
        }
    });
    let mut all = Vec::new();
    for w in work {
        all.push(w);
    }
    for r in futures_util::future::join_all(all).await {
        r?;
    }
    Ok(())
}

/// `iters` calls shared out among `clients` spawned tasks, each on the keys from its own
/// offset: the wall time from their start to the last one's end.
async fn run<B: Backend>(
    buckets: &Arc<Vec<RemoteBucket<B>>>,
    clients: usize,
    iters: u64,
) -> Duration {
    let clients64 = clients as u64;
    let barrier = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (buckets, barrier) = (Arc::clone(buckets), Arc::clone(&barrier));
            let n = iters / clients64 + u64::from((c as u64) < iters % clients64);
            tokio::spawn(async move {
                let len = buckets.len();
                let mut i = c * len / clients;
                barrier.wait().await;
                for _ in 0..n {
                    i = if i + 1 >= len { 0 } else { i + 1 };
                    let granted = buckets[i].try_consume(1).await.expect("try_consume");
                    assert!(granted, "a key ran dry");
                }
            })
        })
        .collect();
    barrier.wait().await;
    let started = Instant::now();
    for t in tasks {
        t.await.expect("a client panicked");
    }
    started.elapsed()
}

#[cfg(not(feature = "sqlite"))]
fn sqlite(_: &mut BenchmarkGroup<'_, WallTime>, _: &tokio::runtime::Runtime) {
    note("backends: SQLite skipped: built without `--features sqlite`");
}

/// A file in a fresh directory under the system's temporary directory (on this machine's
/// disk), removed afterwards.
#[cfg(feature = "sqlite")]
fn sqlite(g: &mut BenchmarkGroup<'_, WallTime>, rt: &tokio::runtime::Runtime) {
    use bucket4rs_distributed::{SqliteBackend, SqliteOptions};

    let dir = std::env::temp_dir().join(format!("bucket4rs-bench-sqlite-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return note(&format!("backends: SQLite skipped: {}: {e}", dir.display()));
    }
    match rt.block_on(SqliteBackend::open(
        dir.join("limits.db"),
        SqliteOptions::default(),
    )) {
        Ok(backend) => matrix(g, "sqlite", rt, backend),
        Err(e) => note(&format!("backends: SQLite skipped: {e}")),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &mut BenchmarkGroup<'_, WallTime>, _: &tokio::runtime::Runtime) {
    note("backends: PostgreSQL skipped: built without `--features postgres`");
}

/// Table `bucket4rs_bench` (as `keyed_remote`), a pool of one connection per client.
#[cfg(feature = "postgres")]
fn postgres(g: &mut BenchmarkGroup<'_, WallTime>, rt: &tokio::runtime::Runtime) {
    use bucket4rs_distributed::{PostgresBackend, PostgresOptions};

    let url = std::env::var("BUCKET4RS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let options = match PostgresOptions::default().table("bucket4rs_bench") {
        Ok(o) => o
            .connect_timeout(Duration::from_secs(2))
            .max_connections(CLIENTS[CLIENTS.len() - 1]),
        Err(e) => return note(&format!("backends: PostgreSQL skipped: {e}")),
    };
    let backend = match rt.block_on(PostgresBackend::connect(&url, options)) {
        Ok(b) => b,
        Err(e) => {
            return note(&format!(
                "backends: PostgreSQL skipped: {url} unreachable: {e}"
            ));
        }
    };
    if let Err(e) = rt.block_on(backend.migrate()) {
        return note(&format!("backends: PostgreSQL skipped: migration: {e}"));
    }
    matrix(g, "postgres", rt, backend);
}
