//! Throughput of the PostgreSQL backend next to `pgbench` running a single-row UPDATE at
//! the same client count, in the same run.
//!
//! ```text
//! cargo run --release -p bucket4rs-benches --features postgres --example postgres_bench [seconds]
//! ```
//!
//! For 1 and 16 concurrent clients, on one hot key and spread over 10,000 keys, reports
//! bucket4rs ops/s (`try_consume(1)`, database clock, always granted) with statements per
//! operation, with request batching (the default) and without (`max_batch(1)`), and `pgbench -n -f script.sql -c N -j N -T <seconds>` tps for
//! `UPDATE t SET v = v + 1 WHERE k = …` on a throwaway table. Uses `BUCKET4RS_POSTGRES_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`); drops its tables at the end.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bucket4rs_core::{Bandwidth, BucketConfiguration};
use bucket4rs_distributed::{PostgresBackend, PostgresOptions, ProxyManager, RemoteBucket};

/// Numbers the runs: each uses its own keys.
static RUN: AtomicU64 = AtomicU64::new(0);

fn psql(url: &str, sql: &str) {
    let out = Command::new("psql")
        .args([url, "-qc", sql])
        .output()
        .expect("psql is required");
    assert!(out.status.success(), "psql: {out:?}");
}

/// `pgbench` tps for a single-row UPDATE on one of `keys` rows.
fn pgbench(url: &str, table: &str, clients: usize, keys: usize, secs: u64) -> String {
    let script = std::env::temp_dir().join(format!("{table}_{keys}.sql"));
    let body = if keys == 1 {
        format!("UPDATE {table} SET v = v + 1 WHERE k = 1;\n")
    } else {
        format!("\\set k random(1, {keys})\nUPDATE {table} SET v = v + 1 WHERE k = :k;\n")
    };
    std::fs::write(&script, body).expect("script");
    let n = clients.to_string();
    let out = Command::new("pgbench")
        .args(["-n", "-f"])
        .arg(&script)
        .args(["-c", &n, "-j", &n, "-T", &secs.to_string(), url])
        .output();
    let _ = std::fs::remove_file(&script);
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.lines()
                .find_map(|l| l.strip_prefix("tps = "))
                .and_then(|l| l.split_whitespace().next())
                .map(str::to_owned)
                .unwrap_or_else(|| format!("pgbench failed: {o:?}"))
        }
        Err(e) => format!("pgbench unavailable: {e}"),
    }
}

async fn run(
    backend: &PostgresBackend,
    clients: usize,
    keys: usize,
    secs: u64,
    max_batch: usize,
) -> (f64, f64) {
    let manager = ProxyManager::configure(backend.clone())
        .key_prefix(format!(
            "c{clients}r{}",
            RUN.fetch_add(1, Ordering::Relaxed)
        ))
        .max_batch(max_batch)
        .build()
        .expect("manager");
    let config = BucketConfiguration::builder()
        .add_bandwidth(
            // Never exhausted in a run; a consumed token takes 1000 s to come back, so rows
            // do not expire mid-run.
            Bandwidth::builder()
                .capacity(1_000_000_000)
                .refill_greedy(1_000, Duration::from_secs(1_000_000))
                .build()
                .expect("bandwidth"),
        )
        .build()
        .expect("configuration");
    let buckets: Vec<RemoteBucket<PostgresBackend>> = (0..keys)
        .map(|k| {
            let c = config.clone();
            manager
                .builder()
                .build(format!("k{k}"), move || c.clone())
                .expect("bucket")
        })
        .collect();
    for b in &buckets {
        b.try_consume(1).await.expect("warm-up");
    }
    let buckets = Arc::new(buckets);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let before = backend.stats().round_trips;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (buckets, stop, done) = (buckets.clone(), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let b = &buckets[i % buckets.len()];
                assert!(b.try_consume(1).await.expect("try_consume"));
                i = i.wrapping_add(7919);
                n += 1;
            }
            done.fetch_add(n, Ordering::Relaxed);
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let ops = done.load(Ordering::Relaxed) as f64;
    let trips = (backend.stats().round_trips - before) as f64;
    (ops / elapsed, trips / ops)
}

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let url = std::env::var("BUCKET4RS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pid = std::process::id();
    let ours = format!("b4rs_bench_{pid}");
    let theirs = format!("b4rs_pgbench_{pid}");
    psql(
        &url,
        &format!(
            "CREATE TABLE {theirs} (k int PRIMARY KEY, v bigint NOT NULL) WITH (fillfactor = 80); \
             INSERT INTO {theirs} SELECT g, 0 FROM generate_series(1, 10000) g; ANALYZE {theirs};"
        ),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("bucket4rs PostgreSQL backend vs pgbench (single-row UPDATE), {secs} s per scenario");
    println!(
        "| clients | keys   | batched ops/s | stmts/op | unbatched ops/s | stmts/op | pgbench tps | batched/pgbench | unbatched/pgbench |"
    );
    println!(
        "|--------:|-------:|--------------:|---------:|----------------:|---------:|------------:|------:|------:|"
    );
    for clients in [1usize, 16] {
        let backend = rt
            .block_on(PostgresBackend::connect(
                &url,
                PostgresOptions::default()
                    .table(&ours)
                    .expect("table name")
                    .max_connections(clients),
            ))
            .expect("PostgreSQL is required");
        rt.block_on(backend.migrate()).expect("migrate");
        for keys in [1usize, 10_000] {
            // Unbatched first, then batched, each on its own keys, then pgbench.
            let (ops1, trips1) = rt.block_on(run(&backend, clients, keys, secs, 1));
            let (ops, trips) = rt.block_on(run(&backend, clients, keys, secs, 64));
            let tps = pgbench(&url, &theirs, clients, keys, secs);
            let ratio = |ops: f64| {
                tps.parse::<f64>()
                    .map(|t| format!("{:.2}", ops / t))
                    .unwrap_or_else(|_| "-".into())
            };
            println!(
                "| {clients:>7} | {keys:>6} | {ops:>13.0} | {trips:>8.3} | {ops1:>15.0} | {trips1:>8.3} | {tps:>11} | {:>5} | {:>5} |",
                ratio(ops),
                ratio(ops1)
            );
        }
        println!("stats ({clients} clients): {:?}", backend.stats());
    }
    psql(
        &url,
        &format!("DROP TABLE IF EXISTS {ours}; DROP TABLE IF EXISTS {theirs};"),
    );
}
