//! Throughput of the PostgreSQL backend next to `pgbench` running a single-row UPDATE at
//! the same client count, in the same run; and (`tls`) with and without TLS.
//!
//! ```text
//! cargo run --release -p bucket4rs-benches --features postgres --example postgres_bench [seconds]
//! cargo run --release -p bucket4rs-benches --features postgres --example postgres_bench tls [seconds] [runs]
//! ```
//!
//! For 1 and 16 concurrent clients, on one hot key and spread over 10,000 keys, reports
//! bucket4rs ops/s (`try_consume(1)`, database clock, always granted) with statements per
//! operation, with request batching (the default) and without (`max_batch(1)`), and `pgbench -n -f script.sql -c N -j N -T <seconds>` tps for
//! `UPDATE t SET v = v + 1 WHERE k = …` on a throwaway table. Uses `BUCKET4RS_POSTGRES_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`); drops its tables at the end.
//!
//! `tls` starts a PostgreSQL cluster of its own with `ssl = on` (certificates made at run
//! time) and runs the same scenarios with `sslmode=disable` and with `sslmode=verify-full` on
//! it in turn, and pgbench at 16 clients with each: the TLS ÷ plaintext ratio per scenario.
//! See benches/README.md.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bucket4rs_benches::runs::{each_run, in_order, median, median_and_range, runtime};
use bucket4rs_benches::servers::{Certs, Postgres};
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

/// pgbench's throwaway table: 10,000 rows `(k, 0)`.
fn pgbench_table(url: &str, table: &str) {
    psql(
        url,
        &format!(
            "CREATE TABLE {table} (k int PRIMARY KEY, v bigint NOT NULL) WITH (fillfactor = 80); \
             INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 10000) g; ANALYZE {table};"
        ),
    );
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("tls") {
        return tls_mode(&args[1..]);
    }
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let url = std::env::var("BUCKET4RS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pid = std::process::id();
    let ours = format!("b4rs_bench_{pid}");
    let theirs = format!("b4rs_pgbench_{pid}");
    pgbench_table(&url, &theirs);
    let rt = runtime();
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

/// `tls [seconds] [runs]`: a PostgreSQL cluster of its own with `ssl = on` (certificates made
/// at run time), the default mode's scenarios with `sslmode=disable` and with
/// `sslmode=verify-full` in turn (the order alternating between runs), and pgbench's
/// single-row UPDATE at 16 clients over 10,000 rows with each: the TLS ÷ plaintext ratios.
fn tls_mode(args: &[String]) {
    let secs: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(3);
    let runs: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let certs = Certs::new();
    let server = Postgres::start_with_tls(&certs);
    let urls = [
        format!("{}?sslmode=disable", server.url("127.0.0.1")),
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            server.url("localhost"),
            certs.path("ca.pem").display()
        ),
    ];
    let ours = "b4rs_bench";
    let theirs = "b4rs_pgbench";
    pgbench_table(&urls[0], theirs);
    let rt = runtime();
    println!(
        "bucket4rs PostgreSQL backend, sslmode=disable and sslmode=verify-full on one server of its own (fsync off), {secs} s per scenario, {runs} runs"
    );
    // (scenario, plaintext ops/s, TLS ops/s, plaintext and TLS statements per operation)
    let mut rows: Vec<(String, f64, f64, f64, f64)> = Vec::new();
    for run_no in 0..runs {
        println!("run {}:", run_no + 1);
        let order = if run_no % 2 == 0 { [0, 1] } else { [1, 0] };
        for clients in [1usize, 16] {
            let backends: Vec<PostgresBackend> = urls
                .iter()
                .map(|url| {
                    let backend = rt
                        .block_on(PostgresBackend::connect(
                            url,
                            PostgresOptions::default()
                                .table(ours)
                                .expect("table name")
                                .max_connections(clients),
                        ))
                        .expect("backend");
                    rt.block_on(backend.migrate()).expect("migrate");
                    backend
                })
                .collect();
            for keys in [1usize, 10_000] {
                for (name, batching) in [("batched", 64), ("unbatched", 1)] {
                    let mut by_side = [(0.0, 0.0); 2];
                    for side in order {
                        by_side[side] =
                            rt.block_on(run(&backends[side], clients, keys, secs, batching));
                    }
                    let [(p, ps), (t, ts)] = by_side;
                    println!(
                        "  clients={clients:>2} keys={keys:>5} {name:>9}: disable {p:>7.0} ops/s, verify-full {t:>7.0} ops/s ({:.2}), {ps:.3} / {ts:.3} statements/op",
                        t / p
                    );
                    rows.push((
                        format!("{clients} clients, {keys} keys, {name}"),
                        p,
                        t,
                        ps,
                        ts,
                    ));
                }
            }
        }
        let mut tps = [0.0; 2];
        for side in order {
            tps[side] = pgbench(&urls[side], theirs, 16, 10_000, secs)
                .parse()
                .unwrap_or(f64::NAN);
        }
        println!(
            "  pgbench -c 16 (UPDATE of one of 10,000 rows): disable {:.0} tps, verify-full {:.0} tps ({:.2})",
            tps[0],
            tps[1],
            tps[1] / tps[0]
        );
        rows.push((
            "`pgbench -c 16`, 10000 rows".into(),
            tps[0],
            tps[1],
            f64::NAN,
            f64::NAN,
        ));
    }
    println!(
        "\n| scenario | sslmode=disable ops/s, each run | verify-full ops/s, each run | statements/op | TLS ÷ plain, median (range) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    for name in in_order(rows.iter().map(|r| r.0.as_str())) {
        let of: Vec<_> = rows.iter().filter(|r| r.0 == name).collect();
        let ratios: Vec<f64> = of.iter().map(|r| r.2 / r.1).collect();
        let stmts = median(of.iter().flat_map(|r| [r.3, r.4]).collect());
        println!(
            "| {name} | {} | {} | {} | {} |",
            each_run(&of.iter().map(|r| r.1).collect::<Vec<_>>()),
            each_run(&of.iter().map(|r| r.2).collect::<Vec<_>>()),
            if stmts.is_nan() {
                "-".to_owned()
            } else {
                format!("{stmts:.3}")
            },
            median_and_range(&ratios)
        );
    }
}
