//! Throughput of the Redis backend next to `redis-benchmark -t incr`, in the same run.
//!
//! ```text
//! cargo run --release -p bucket4rs-benches --features redis --example redis_bench [seconds]
//! ```
//!
//! Reports ops/s and round trips per operation for 1 and 16 concurrent clients on one hot
//! key and spread over 10,000 keys, with request batching (the default) and without
//! (`max_batch(1)`), and raw INCR at the same concurrency. Uses
//! `BUCKET4RS_REDIS_URL` (default `redis://127.0.0.1:6379`).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bucket4rs_core::{Bandwidth, BucketConfiguration};
use bucket4rs_distributed::{ProxyManager, RedisBackend, RedisOptions, RemoteBucket};

fn redis_benchmark_incr(port: &str, clients: usize) -> String {
    let out = Command::new("redis-benchmark")
        .args(["-p", port, "-t", "incr", "-n", "200000", "-q", "-c"])
        .arg(clients.to_string())
        .output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.rsplit('\r').next().unwrap_or(&text).trim().to_owned()
        }
        Err(e) => format!("redis-benchmark unavailable: {e}"),
    }
}

async fn run(
    backend: &RedisBackend,
    prefix: &str,
    clients: usize,
    keys: usize,
    secs: f64,
    max_batch: usize,
) -> (f64, f64) {
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
    (ops / elapsed, trips / ops)
}

fn main() {
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
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
                let (ops, trips) =
                    rt.block_on(run(&backend, &prefix, clients, keys, secs, batching));
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
            for k in 0..10_000 {
                let _: Result<i64, _> = redis::cmd("DEL")
                    .arg(format!("{prefix}:k{k}"))
                    .query_async(&mut c)
                    .await;
            }
        }
    });
}
