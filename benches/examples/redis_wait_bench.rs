//! What `RedisOptions::wait_for_replicas` costs: the Redis backend with and without waiting
//! for one replica per write, side by side in one run, against a master and one replica this
//! example starts itself (`redis-server` on free loopback ports, killed at the end).
//!
//! ```text
//! cargo run --release -p bucket4rs-benches --features redis --example redis_wait_bench [seconds]
//! ```
//!
//! Reports ops/s of `try_consume(1)` (always granted) for 1 and 16 concurrent clients over
//! 1,000 keys, without and with `wait_for_replicas(1, 100 ms)`, in five rounds (each runs both,
//! in alternating order), the ratio of each pair and the median ratio.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bucket4rs_core::{Bandwidth, BucketConfiguration};
use bucket4rs_distributed::{ProxyManager, RedisBackend, RedisOptions, RemoteBucket};

/// Rounds of each scenario (each runs both backends; the median ratio is reported).
const ROUNDS: usize = 5;

/// A redis-server without persistence on a free loopback port, its files (a replica's copy
/// of the master's data) in a directory of its own; killed and removed on drop.
struct Server {
    port: u16,
    dir: std::path::PathBuf,
    child: Child,
}

impl Server {
    fn start(extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir = std::env::temp_dir().join(format!("b4-wait-bench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for redis-server");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { port, dir, child }
    }

    fn info(&self) -> String {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "INFO", "replication"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// ops/s of `clients` tasks calling `try_consume(1)` over `keys` keys for `secs` seconds.
async fn run(backend: &RedisBackend, prefix: &str, clients: usize, keys: usize, secs: f64) -> f64 {
    let manager = ProxyManager::configure(backend.clone())
        .key_prefix(prefix)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("manager");
    let config = BucketConfiguration::builder()
        .add_bandwidth(
            // As redis_bench: never exhausted, and the warm-up's 1,000 tokens keep the keys
            // from expiring mid-run.
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
    for b in &buckets {
        b.try_consume(1_000).await.expect("warm-up");
    }
    let buckets = Arc::new(buckets);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (buckets, stop, done) = (buckets.clone(), stop.clone(), done.clone());
        let failed = failed.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = c;
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let b = &buckets[i % buckets.len()];
                match b.try_consume(1).await {
                    Ok(granted) => assert!(granted, "never exhausted"),
                    // Counted, not timed: a stall of this shared machine, say.
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
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
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        println!("    ({failed} calls failed and are not counted)");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let master = Server::start(&[]);
    let replica = Server::start(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !replica.info().contains("master_link_status:up") {
        assert!(Instant::now() < deadline, "the replica did not sync");
        std::thread::sleep(Duration::from_millis(50));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let url = format!("redis://127.0.0.1:{}", master.port);
    let (plain, waiting) = rt.block_on(async {
        // A response timeout that rides out a stall of a loaded machine.
        let options = RedisOptions::default().response_timeout(Duration::from_secs(2));
        let plain = RedisBackend::connect(&url, options.clone()).await;
        let waiting = options.wait_for_replicas(1, Duration::from_millis(100));
        let waiting = RedisBackend::connect(&url, waiting).await;
        (plain.expect("a backend"), waiting.expect("a backend"))
    });
    println!(
        "bucket4rs Redis backend on a master with one replica (loopback), {secs} s per \
         scenario, try_consume(1) always granted, 1,000 keys"
    );
    for clients in [1usize, 16] {
        let mut ratios = Vec::new();
        for round in 0..ROUNDS {
            // Alternating which goes first, so that a drift of the machine's load between the
            // two halves of a round does not favour one side.
            let mut pair = [0.0; 2];
            for side in [round % 2, 1 - round % 2] {
                let (backend, name) = [(&plain, "plain"), (&waiting, "wait")][side];
                let prefix = format!("{name}{round}-{clients}");
                pair[side] = rt.block_on(run(backend, &prefix, clients, 1_000, secs));
            }
            let [without, with] = pair;
            ratios.push(with / without);
            println!(
                "  clients={clients:>2} round {round}: without {without:>8.0} ops/s, with \
                 wait_for_replicas(1) {with:>8.0} ops/s: {:.2}x",
                with / without
            );
        }
        ratios.sort_by(f64::total_cmp);
        println!(
            "  clients={clients:>2}: median ratio {:.2}x (of {ROUNDS} rounds)",
            ratios[ROUNDS / 2]
        );
    }
    println!("stats without: {:?}", plain.stats());
    println!("stats with:    {:?}", waiting.stats());
}
