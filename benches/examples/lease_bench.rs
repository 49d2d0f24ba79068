//! Leasing on a hot key (issue #31): throughput with leasing on beside request batching (the
//! default, leasing off), on Redis and on PostgreSQL, in one process and in four, in the
//! same run; round trips per operation; and on a key that is drawn dry, the tokens granted
//! beside what the bucket allowed, with the under-grant's bound.
//!
//! ```text
//! cargo run --release -p bucket4rs-benches --features redis,postgres --example lease_bench [seconds]
//! ```
//!
//! Each scenario runs `seconds` (default 3), batched and leased alternating, three rounds.
//! `BUCKET4RS_BENCH_STORES=redis` (or `postgres`) runs one store only.
//! The four-process scenarios run this example again as four children started together.
//! Uses `BUCKET4RS_REDIS_URL` (default `redis://127.0.0.1:6379`) and
//! `BUCKET4RS_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`); removes its
//! keys and drops its tables at the end.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bucket4rs_core::{Bandwidth, BucketConfiguration};
use bucket4rs_distributed::{
    Backend, Leasing, ManagerBuilder, PostgresBackend, PostgresOptions, ProxyManager, RedisBackend,
    RedisOptions,
};

/// Tasks per process.
const CLIENTS: usize = 16;

/// The leasing of every leased scenario: 4 processes, at most 10 % of the key held.
fn leasing() -> Leasing {
    Leasing::new().processes(4).max_held_percent(10)
}

/// Never drawn dry within a run (a million tokens a second come back).
fn plenty() -> BucketConfiguration {
    BucketConfiguration::builder()
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(1_000_000_000)
                .refill_greedy(1_000_000_000, Duration::from_secs(1_000))
                .build()
                .expect("bandwidth"),
        )
        .build()
        .expect("configuration")
}

/// Drawn dry at once, then refilled 20,000 tokens a second.
const SCARCE: u64 = 20_000;

fn scarce() -> BucketConfiguration {
    BucketConfiguration::builder()
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(SCARCE)
                .refill_greedy(SCARCE, Duration::from_secs(1))
                .build()
                .expect("bandwidth"),
        )
        .build()
        .expect("configuration")
}

fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// One store: how to connect, and its round-trip counter.
#[derive(Clone, Copy, Debug)]
enum Store {
    Redis,
    Postgres,
}

impl Store {
    fn parse(s: &str) -> Self {
        if s == "redis" {
            Self::Redis
        } else {
            Self::Postgres
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Postgres => "postgres",
        }
    }
}

fn redis_url() -> String {
    std::env::var("BUCKET4RS_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn postgres_url() -> String {
    std::env::var("BUCKET4RS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// What a run measured.
#[derive(Clone, Copy, Debug, Default)]
struct Measured {
    ops: u64,
    granted: u64,
    trips: u64,
    secs: f64,
    /// Tokens in leases when the clients stopped.
    held: u64,
}

/// `CLIENTS` tasks take one token at a time from `key` for `secs` (from epoch millisecond
/// `start_ms`); `trips` reads the backend's round-trip count.
async fn hammer<B: Backend>(
    manager: &ProxyManager<B>,
    key: &str,
    config: fn() -> BucketConfiguration,
    secs: f64,
    start_ms: u128,
    trips: impl Fn() -> u64,
) -> Measured {
    let now_ms = epoch_ms();
    if start_ms > now_ms {
        tokio::time::sleep(Duration::from_millis((start_ms - now_ms) as u64)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (ops, granted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let before = trips();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let b = manager.builder().build(key, config).expect("bucket");
        let (stop, ops, granted) = (stop.clone(), ops.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let (mut n, mut g) = (0, 0);
            while !stop.load(Ordering::Relaxed) {
                g += u64::from(b.try_consume(1).await.expect("try_consume"));
                n += 1;
            }
            ops.fetch_add(n, Ordering::Relaxed);
            granted.fetch_add(g, Ordering::Relaxed);
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("task");
    }
    let m = Measured {
        ops: ops.load(Ordering::Relaxed),
        granted: granted.load(Ordering::Relaxed),
        trips: trips() - before,
        secs: start.elapsed().as_secs_f64(),
        held: manager.leased_tokens(),
    };
    manager.release_leases().await.expect("leases back");
    m
}

/// One process's run on `store` (this process, or a child's).
async fn run_one(
    store: Store,
    prefix: &str,
    leased: bool,
    config: fn() -> BucketConfiguration,
    secs: f64,
    start_ms: u128,
) -> Measured {
    fn configure<B: Backend>(m: ManagerBuilder<B>, leased: bool) -> ManagerBuilder<B> {
        let m = m.timeout(Duration::from_secs(10));
        if leased { m.leasing(leasing()) } else { m }
    }
    match store {
        Store::Redis => {
            let backend = RedisBackend::connect(&redis_url(), RedisOptions::default())
                .await
                .expect("Redis is required");
            let manager = configure(
                ProxyManager::configure(backend.clone()).key_prefix(prefix),
                leased,
            )
            .build()
            .expect("manager");
            hammer(&manager, "hot", config, secs, start_ms, || {
                backend.stats().round_trips
            })
            .await
        }
        Store::Postgres => {
            let options = PostgresOptions::default()
                .table(prefix)
                .expect("table name");
            let backend = PostgresBackend::connect(&postgres_url(), options)
                .await
                .expect("PostgreSQL is required");
            let deadline = Instant::now() + Duration::from_secs(20);
            while let Err(e) = backend.migrate().await {
                assert!(Instant::now() < deadline, "PostgreSQL is required: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let manager = configure(ProxyManager::configure(backend.clone()), leased)
                .build()
                .expect("manager");
            hammer(&manager, "hot", config, secs, start_ms, || {
                backend.stats().round_trips
            })
            .await
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Four children of this example, started together; their runs summed (ops/s over the
/// common window).
fn four_processes(store: Store, prefix: &str, leased: bool, dry: bool, secs: f64) -> Measured {
    let exe = std::env::current_exe().expect("this example");
    let start_ms = epoch_ms() + 1_500;
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "child",
                    store.name(),
                    prefix,
                    if leased { "leased" } else { "batched" },
                    if dry { "scarce" } else { "plenty" },
                    &secs.to_string(),
                    &start_ms.to_string(),
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("a child")
        })
        .collect();
    let mut sum = Measured::default();
    for child in children {
        let out = child.wait_with_output().expect("child output");
        assert!(out.status.success(), "child failed: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("MEASURED "))
            .unwrap_or_else(|| panic!("child printed nothing: {text}"));
        let v: Vec<f64> = line
            .split_whitespace()
            .map(|x| x.parse().expect("number"))
            .collect();
        sum.ops += v[0] as u64;
        sum.granted += v[1] as u64;
        sum.trips += v[2] as u64;
        sum.secs = sum.secs.max(v[3]);
        sum.held += v[4] as u64;
    }
    sum
}

fn child(args: &[String]) {
    let store = Store::parse(&args[0]);
    let (prefix, leased, dry) = (&args[1], args[2] == "leased", args[3] == "scarce");
    let secs: f64 = args[4].parse().expect("seconds");
    let start_ms: u128 = args[5].parse().expect("start");
    let config = if dry { scarce } else { plenty };
    let m = runtime().block_on(run_one(store, prefix, leased, config, secs, start_ms));
    println!(
        "MEASURED {} {} {} {} {}",
        m.ops, m.granted, m.trips, m.secs, m.held
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        child(&args[1..]);
        return;
    }
    let secs: f64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let rt = runtime();
    let mut used = Vec::new();
    let mut fresh = |store: Store, what: &str| {
        let name = format!("b4lease_{}_{}_{what}", store.name(), std::process::id());
        used.push((store, name.clone()));
        name
    };
    println!(
        "bucket4rs leasing on one hot key: {CLIENTS} clients per process, {secs} s per run, \
         batched (leasing off) and leased alternating, 3 rounds; {:?}",
        leasing()
    );
    // BUCKET4RS_BENCH_STORES=redis (or postgres) runs one store only.
    let only = std::env::var("BUCKET4RS_BENCH_STORES").ok();
    let stores = [Store::Redis, Store::Postgres]
        .into_iter()
        .filter(|s| only.as_deref().is_none_or(|o| o.contains(s.name())));
    for store in stores {
        for processes in [1, 4] {
            let mut ratios = Vec::new();
            for round in 0..3 {
                let mut measured = [Measured::default(); 2];
                for (i, leased) in [false, true].into_iter().enumerate() {
                    let prefix = fresh(store, &format!("p{processes}r{round}l{i}"));
                    measured[i] = if processes == 1 {
                        rt.block_on(run_one(store, &prefix, leased, plenty, secs, 0))
                    } else {
                        four_processes(store, &prefix, leased, false, secs)
                    };
                }
                let rate = |m: &Measured| m.ops as f64 / m.secs;
                let per = |m: &Measured| m.trips as f64 / m.ops.max(1) as f64;
                let [b, l] = measured;
                ratios.push(rate(&l) / rate(&b));
                println!(
                    "  {} {processes} process(es), round {round}: batched {:>9.0} ops/s \
                     ({:.4} round trips/op), leased {:>9.0} ops/s ({:.5} round trips/op): \
                     {:.1}x",
                    store.name(),
                    rate(&b),
                    per(&b),
                    rate(&l),
                    per(&l),
                    rate(&l) / rate(&b)
                );
            }
            ratios.sort_by(f64::total_cmp);
            println!(
                "  {} {processes} process(es): leased / batched, median {:.1}x (runs {:.1}–{:.1}x)",
                store.name(),
                ratios[1],
                ratios[0],
                ratios[2]
            );
        }
        // A key drawn dry: what leasing grants beside what the bucket allowed over the run.
        for processes in [1u64, 4] {
            let prefix = fresh(store, &format!("dry{processes}"));
            let m = if processes == 1 {
                rt.block_on(run_one(store, &prefix, true, scarce, secs, 0))
            } else {
                four_processes(store, &prefix, true, true, secs)
            };
            let allowed = SCARCE as f64 * (1.0 + m.secs);
            let cap = leasing().lease_cap(SCARCE);
            println!(
                "  {} {processes} process(es) on a key drawn dry ({SCARCE} tokens, {SCARCE}/s): \
                 {} granted of about {allowed:.0} allowed in {:.2} s (under-grant about {:.0}, \
                 {:.2} %), {} held in leases at the end; bound: {} in leases, as much again \
                 in returns on their way and in stale views = {}",
                store.name(),
                m.granted,
                m.secs,
                allowed - m.granted as f64,
                100.0 * (allowed - m.granted as f64) / allowed,
                m.held,
                processes * cap,
                3 * processes * cap
            );
        }
    }
    // Leave nothing behind.
    rt.block_on(async {
        for (store, name) in used {
            match store {
                Store::Redis => {
                    if let Ok(client) = redis::Client::open(redis_url().as_str())
                        && let Ok(mut c) = client.get_multiplexed_async_connection().await
                    {
                        let _: Result<i64, _> = redis::cmd("DEL")
                            .arg(format!("{name}:hot"))
                            .query_async(&mut c)
                            .await;
                    }
                }
                Store::Postgres => {
                    let _ = Command::new("psql")
                        .args([
                            &postgres_url(),
                            "-qc",
                            &format!("DROP TABLE IF EXISTS {name}"),
                        ])
                        .output();
                }
            }
        }
    });
}
