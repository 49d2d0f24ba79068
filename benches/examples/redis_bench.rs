//! Throughput of the Redis backend next to `redis-benchmark -t incr`, in the same run.
//!
//! ```text
//! cargo run --release -p bucket4rs-benches --features redis --example redis_bench [seconds]
//! cargo run --release -p bucket4rs-benches --features redis --example redis_bench cluster [seconds] [runs]
//! cargo run --release -p bucket4rs-benches --features redis --example redis_bench tls [seconds] [runs]
//! ```
//!
//! The default mode reports ops/s and round trips per operation for 1 and 16 concurrent
//! clients on one hot key and spread over 10,000 keys, with request batching (the default)
//! and without (`max_batch(1)`), and raw INCR at the same concurrency, on the Redis at
//! `BUCKET4RS_REDIS_URL` (default `redis://127.0.0.1:6379`).
//!
//! `cluster` starts a Redis Cluster of three masters of its own and runs 16 clients on 10,000
//! keys and on one hot key, batched and unbatched, beside `redis-benchmark --cluster -t incr
//! -c 16` on the same cluster, in alternating runs: the ratio to INCR per run, and the
//! servers' time per `EVALSHA` (`INFO commandstats`). `tls` starts two redis-servers of its own,
//! one plaintext and one on TLS only (certificates made at run time), and runs the default
//! mode's scenarios on each in turn: the TLS ÷ plaintext ratio per scenario, and the same for
//! `redis-benchmark -t incr -c 16`. See benches/README.md.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bucket4rs_benches::runs::{each_run, in_order, median, median_and_range, runtime};
use bucket4rs_benches::servers::{Certs, RedisCluster, RedisServer};
use bucket4rs_core::{Bandwidth, BucketConfiguration};
use bucket4rs_distributed::{
    Backend, ProxyManager, RedisBackend, RedisOptions, RemoteBucket, TlsOptions,
};

fn redis_benchmark_incr(port: &str, clients: usize) -> String {
    redis_benchmark(&[
        "-p",
        port,
        "-t",
        "incr",
        "-n",
        "200000",
        "-c",
        &clients.to_string(),
    ])
}

/// `redis-benchmark -q args…`: its summary line (`INCR: … requests per second, …`).
fn redis_benchmark(args: &[&str]) -> String {
    let out = Command::new("redis-benchmark")
        .arg("-q")
        .args(args)
        .output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.rsplit('\r').next().unwrap_or(&text).trim().to_owned()
        }
        Err(e) => format!("redis-benchmark unavailable: {e}"),
    }
}

/// Runs one scenario: ops/s, round trips per operation and, when `nodes` are given, the
/// servers' time per `EVALSHA` in µs over the timed part (summed over the nodes).
async fn run(
    backend: &RedisBackend,
    prefix: &str,
    clients: usize,
    keys: usize,
    secs: f64,
    max_batch: usize,
    nodes: &[Node],
) -> (f64, f64, Option<f64>) {
    let manager = ProxyManager::configure(backend.clone())
        .key_prefix(prefix)
        .max_batch(max_batch)
        .build()
        .expect("manager");
    let config = BucketConfiguration::builder()
        .add_bandwidth(
            // Never exhausted in a run; one token a second comes back, and the warm-up takes
            // 1,000 from every key, so keys do not expire mid-run (they would be recreated:
            // two round trips). Slower refill puts the script's TTL (the wait for the deficit)
            // beyond what doubles hold exactly on a hot key, and every write then goes the
            // client's compare-and-set path, which 16 unbatched clients lose (Conflict).
            Bandwidth::builder()
                .capacity(1_000_000_000)
                .refill_greedy(1_000, Duration::from_secs(1_000))
                .build()
                .expect("bandwidth"),
        )
        .build()
        .expect("configuration");
    let buckets: Vec<RemoteBucket<RedisBackend>> = (0..keys)
        .map(|k| {
            let c = config.clone();
            manager
                .builder()
                .build(format!("k{k}"), move || c.clone())
                .expect("bucket")
        })
        .collect();
    // Create every key first (creation takes a second round trip). Consume 1,000 tokens so the
    // key's TTL is long: a full bucket may expire after the margin, and would be recreated.
    for b in &buckets {
        b.try_consume(1_000).await.expect("warm-up");
    }
    let buckets = Arc::new(buckets);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let before = backend.stats().round_trips;
    let server_before = evalsha_time(nodes);
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
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let ops = done.load(Ordering::Relaxed) as f64;
    let trips = (backend.stats().round_trips - before) as f64;
    let (calls, usec) = evalsha_time(nodes);
    let server = (calls > server_before.0)
        .then(|| (usec - server_before.1) as f64 / (calls - server_before.0) as f64);
    (ops / elapsed, trips / ops, server)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("cluster") => return cluster_mode(&args[1..]),
        Some("tls") => return tls_mode(&args[1..]),
        _ => {}
    }
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let url =
        std::env::var("BUCKET4RS_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let port = url
        .rsplit(':')
        .next()
        .unwrap_or("6379")
        .trim_end_matches('/')
        .to_owned();
    // Multiplexed connections used round-robin (default 1); BUCKET4RS_BENCH_CONNECTIONS=n.
    let connections = std::env::var("BUCKET4RS_BENCH_CONNECTIONS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
    let rt = runtime();
    let backend = rt
        .block_on(RedisBackend::connect(
            &url,
            RedisOptions::default().connections(connections),
        ))
        .expect("Redis is required");
    let prefix = format!("b4bench-{}", std::process::id());
    println!("bucket4rs Redis backend, {secs} s per scenario, try_consume(1) always granted");
    for clients in [1usize, 16] {
        for keys in [1usize, 10_000] {
            for (name, batching) in [("batched", 64), ("unbatched", 1)] {
                // Fresh keys per scenario: a manager's entries stay in a key's ledger for a
                // minute, and would make the next scenario's writes dearer.
                let prefix = format!("{prefix}-{clients}-{keys}-{name}");
                let (ops, trips, _) =
                    rt.block_on(run(&backend, &prefix, clients, keys, secs, batching, &[]));
                println!(
                    "  clients={clients:>2} keys={keys:>5} {name:>9}: {ops:>9.0} ops/s, {trips:.3} round trips/op"
                );
            }
        }
        println!(
            "  redis-benchmark -t incr -c {clients}: {}",
            redis_benchmark_incr(&port, clients)
        );
    }
    println!("stats: {:?}", backend.stats());
    // Leave no benchmark keys behind.
    rt.block_on(async {
        if let Ok(client) = redis::Client::open(url.as_str())
            && let Ok(mut c) = client.get_multiplexed_async_connection().await
        {
            let mut cursor = 0u64;
            loop {
                let Ok((next, keys)): Result<(u64, Vec<String>), _> = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{prefix}-*"))
                    .arg("COUNT")
                    .arg(1_000)
                    .query_async(&mut c)
                    .await
                else {
                    break;
                };
                if !keys.is_empty() {
                    let _: Result<i64, _> =
                        redis::cmd("UNLINK").arg(&keys).query_async(&mut c).await;
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
    });
}

/// A redis-server whose `INFO commandstats` a scenario reads: its port, and the CA file to
/// trust when it listens on TLS only.
struct Node {
    port: u16,
    ca: Option<PathBuf>,
}

/// `redis-benchmark`'s arguments for `INCR` from 16 clients, `requests` of them, on `port`,
/// after `first` (`--cluster`, the TLS options).
fn incr_16<'a>(first: &[&'a str], port: &'a str, requests: &'a str) -> Vec<&'a str> {
    let mut args = first.to_vec();
    args.extend(["-p", port, "-t", "incr", "-c", "16", "-n", requests]);
    args
}

/// `EVALSHA` calls and µs spent in them so far, summed over `nodes` (`INFO commandstats`).
fn evalsha_time(nodes: &[Node]) -> (u64, u64) {
    let mut total = (0, 0);
    for node in nodes {
        let mut cli = Command::new("redis-cli");
        if let Some(ca) = &node.ca {
            cli.args(["--tls", "-h", "localhost", "--cacert"]).arg(ca);
        }
        let out = cli
            .args(["-p", &node.port.to_string(), "INFO", "commandstats"])
            .output()
            .expect("redis-cli is required");
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(line) = text
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        {
            let field = |name: &str| -> u64 {
                line.split(',')
                    .find_map(|f| f.strip_prefix(name))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            total.0 += field("calls=");
            total.1 += field("usec=");
        }
    }
    total
}

/// The rate of a `redis-benchmark` summary line (`INCR: 123.45 requests per second, …`).
fn rate(line: &str) -> f64 {
    line.split_whitespace()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("redis-benchmark: {line}"))
}

/// `[seconds per scenario] [runs]` after the mode's name (defaults: 3 s, 3 runs).
fn secs_and_runs(args: &[String]) -> (f64, usize) {
    let secs = args.first().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let runs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    (secs, runs)
}

/// Waits until `backend` answers (it connects in the background).
async fn answering(backend: &RedisBackend) {
    let key = ProxyManager::new(backend.clone())
        .storage_key("probe")
        .expect("a key");
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = backend.read(&key).await {
        assert!(Instant::now() < deadline, "the server does not answer: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One measured scenario of a run.
struct Row {
    name: String,
    ops: f64,
    trips: f64,
    server: Option<f64>,
    /// ops ÷ the rate it is compared with in the same run.
    ratio: f64,
}

/// Per scenario over the runs: the ops/s of each run, round trips per operation, server µs per
/// `EVALSHA` (medians) and the median ratio with its range.
fn summary(rows: &[Row], ratio_name: &str) {
    println!(
        "\n| scenario | ops/s, each run | round trips/op | server µs per EVALSHA | {ratio_name}, median (range) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    for name in in_order(rows.iter().map(|r| r.name.as_str())) {
        let of: Vec<&Row> = rows.iter().filter(|r| r.name == name).collect();
        let ops: Vec<f64> = of.iter().map(|r| r.ops).collect();
        let ratios: Vec<f64> = of.iter().map(|r| r.ratio).collect();
        println!(
            "| {name} | {} | {:.3} | {} | {} |",
            each_run(&ops),
            median(of.iter().map(|r| r.trips).collect()),
            server_median(of.iter().filter_map(|r| r.server).collect()),
            median_and_range(&ratios),
        );
    }
}

/// The median of the servers' µs per `EVALSHA`, or `-` when none was read.
fn server_median(v: Vec<f64>) -> String {
    if v.is_empty() {
        "-".to_owned()
    } else {
        format!("{:.1}", median(v))
    }
}

/// `cluster`: a Redis Cluster of three masters started here, 16 clients on 10,000 keys and on
/// one hot key, batched and unbatched, beside `redis-benchmark --cluster -t incr -c 16` on the
/// same cluster, in alternating runs.
fn cluster_mode(args: &[String]) {
    let (secs, runs) = secs_and_runs(args);
    let cluster = RedisCluster::start(3);
    let rt = runtime();
    let backend = rt
        .block_on(RedisBackend::connect_cluster(
            cluster.urls(),
            RedisOptions::default(),
        ))
        .expect("cluster backend");
    rt.block_on(answering(&backend));
    let nodes: Vec<Node> = cluster
        .ports()
        .into_iter()
        .map(|port| Node { port, ca: None })
        .collect();
    let port = nodes[0].port.to_string();
    let requests = ((secs * 100_000.0) as u64).to_string();
    let incr_args = incr_16(&["--cluster"], &port, &requests);
    println!(
        "bucket4rs Redis Cluster backend: 3 masters of its own (ports {:?}), 16 clients, try_consume(1) always granted, {secs} s per scenario, {runs} runs",
        cluster.ports()
    );
    let mut rows = Vec::new();
    for run_no in 0..runs {
        // INCR first in runs 1, 3, …, last in runs 2, 4, ….
        let mut incr = None;
        if run_no % 2 == 0 {
            incr = Some(redis_benchmark(&incr_args));
        }
        let mut measured = Vec::new();
        for keys in [10_000usize, 1] {
            for (name, batching) in [("unbatched", 1), ("batched", 64)] {
                let prefix = format!("b4bench-{}-{run_no}-{keys}-{name}", std::process::id());
                let (ops, trips, server) =
                    rt.block_on(run(&backend, &prefix, 16, keys, secs, batching, &nodes));
                measured.push((format!("{keys} keys, {name}"), ops, trips, server));
            }
        }
        let incr = incr.unwrap_or_else(|| redis_benchmark(&incr_args));
        let incr_rate = rate(&incr);
        println!(
            "run {}: redis-benchmark --cluster -t incr -c 16: {incr}",
            run_no + 1
        );
        for (name, ops, trips, server) in measured {
            println!(
                "  {name:>22}: {ops:>8.0} ops/s, {trips:.3} round trips/op, {} µs server per EVALSHA, {:.2} of INCR",
                server.map_or("-".into(), |s| format!("{s:.1}")),
                ops / incr_rate
            );
            rows.push(Row {
                name,
                ops,
                trips,
                server,
                ratio: ops / incr_rate,
            });
        }
    }
    summary(&rows, "÷ INCR of the same run");
    println!("stats: {:?}", backend.stats());
}

/// One scenario on both servers of a run: (ops/s, round trips per operation, server µs per
/// `EVALSHA`) on the plaintext one, then on the TLS one.
struct Pair {
    name: String,
    plain: (f64, f64, Option<f64>),
    tls: (f64, f64, Option<f64>),
}

/// Per scenario over the runs: each side's ops/s, round trips per operation and server µs per
/// `EVALSHA` (medians), and the median TLS ÷ plaintext ratio with its range.
fn tls_summary(pairs: &[Pair]) {
    println!(
        "\n| scenario | plaintext ops/s, each run | TLS ops/s, each run | round trips/op | server µs per EVALSHA, plain / TLS | TLS ÷ plain, median (range) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for name in in_order(pairs.iter().map(|p| p.name.as_str())) {
        let of: Vec<&Pair> = pairs.iter().filter(|p| p.name == name).collect();
        let ratios: Vec<f64> = of.iter().map(|p| p.tls.0 / p.plain.0).collect();
        let trips = median(of.iter().flat_map(|p| [p.plain.1, p.tls.1]).collect());
        println!(
            "| {name} | {} | {} | {} | {} / {} | {} |",
            each_run(&of.iter().map(|p| p.plain.0).collect::<Vec<_>>()),
            each_run(&of.iter().map(|p| p.tls.0).collect::<Vec<_>>()),
            if trips.is_nan() {
                "-".to_owned()
            } else {
                format!("{trips:.3}")
            },
            server_median(of.iter().filter_map(|p| p.plain.2).collect()),
            server_median(of.iter().filter_map(|p| p.tls.2).collect()),
            median_and_range(&ratios),
        );
    }
}

/// `tls`: two redis-servers started here, one plaintext and one on TLS only (certificates
/// made at run time), the scenarios of the default mode on each in turn (the order alternating
/// between runs), and `redis-benchmark -t incr -c 16` on each.
fn tls_mode(args: &[String]) {
    let (secs, runs) = secs_and_runs(args);
    let certs = Certs::new();
    let plain_server = RedisServer::plain();
    let tls_server = RedisServer::tls(&certs);
    let rt = runtime();
    let plain = rt
        .block_on(RedisBackend::connect(
            &format!("redis://127.0.0.1:{}", plain_server.port),
            RedisOptions::default(),
        ))
        .expect("plaintext backend");
    let tls = rt
        .block_on(RedisBackend::connect(
            &format!("rediss://localhost:{}", tls_server.port),
            RedisOptions::default().tls(
                TlsOptions::default()
                    .ca_file(certs.path("ca.pem"))
                    .expect("the CA file"),
            ),
        ))
        .expect("TLS backend");
    rt.block_on(answering(&plain));
    rt.block_on(answering(&tls));
    let sides = [
        (
            &plain,
            [Node {
                port: plain_server.port,
                ca: None,
            }],
        ),
        (
            &tls,
            [Node {
                port: tls_server.port,
                ca: Some(certs.path("ca.pem")),
            }],
        ),
    ];
    let requests = ((secs * 100_000.0) as u64).to_string();
    let ca = certs.path("ca.pem").display().to_string();
    let (plain_port, tls_port) = (plain_server.port.to_string(), tls_server.port.to_string());
    let incr_plain = incr_16(&[], &plain_port, &requests);
    let incr_tls = incr_16(
        &["--tls", "--cacert", &ca, "-h", "localhost"],
        &tls_port,
        &requests,
    );
    println!(
        "bucket4rs Redis backend on plaintext and on TLS only (own redis-servers, ports {} and {}), try_consume(1) always granted, {secs} s per scenario, {runs} runs",
        plain_server.port, tls_server.port
    );
    let mut pairs = Vec::new();
    for run_no in 0..runs {
        println!("run {}:", run_no + 1);
        // Plaintext first in runs 1, 3, …, TLS first in runs 2, 4, ….
        let order = if run_no % 2 == 0 { [0, 1] } else { [1, 0] };
        for clients in [1usize, 16] {
            for keys in [1usize, 10_000] {
                for (name, batching) in [("batched", 64), ("unbatched", 1)] {
                    let mut by_side = [(0.0, 0.0, None); 2];
                    for side in order {
                        let (backend, nodes) = &sides[side];
                        let prefix = format!(
                            "b4bench-{}-{run_no}-{clients}-{keys}-{name}",
                            std::process::id()
                        );
                        by_side[side] = rt
                            .block_on(run(backend, &prefix, clients, keys, secs, batching, nodes));
                    }
                    let [p, t] = by_side;
                    println!(
                        "  clients={clients:>2} keys={keys:>5} {name:>9}: plain {:>8.0} ops/s, TLS {:>8.0} ops/s ({:.2}), {:.3} / {:.3} round trips/op, {} / {} µs server per EVALSHA",
                        p.0,
                        t.0,
                        t.0 / p.0,
                        p.1,
                        t.1,
                        p.2.map_or("-".into(), |s| format!("{s:.1}")),
                        t.2.map_or("-".into(), |s| format!("{s:.1}")),
                    );
                    pairs.push(Pair {
                        name: format!("{clients} clients, {keys} keys, {name}"),
                        plain: p,
                        tls: t,
                    });
                }
            }
        }
        let mut incr = [String::new(), String::new()];
        for side in order {
            incr[side] = redis_benchmark(if side == 0 {
                &incr_plain[..]
            } else {
                &incr_tls[..]
            });
        }
        println!(
            "  redis-benchmark -t incr -c 16: plain {}; TLS {}",
            incr[0], incr[1]
        );
        pairs.push(Pair {
            name: "`redis-benchmark -t incr -c 16`".into(),
            plain: (rate(&incr[0]), f64::NAN, None),
            tls: (rate(&incr[1]), f64::NAN, None),
        });
    }
    tls_summary(&pairs);
    println!("stats: plain {:?}; TLS {:?}", plain.stats(), tls.stats());
}
