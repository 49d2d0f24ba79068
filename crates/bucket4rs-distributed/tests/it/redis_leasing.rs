//! Leasing on Redis across real processes: four children drain one key with leasing on, and
//! a child killed (SIGKILL) while it holds a lease.

use std::time::Duration;

use bucket4rs_distributed::{ProxyManager, RedisBackend, RedisOptions};

use crate::common::leased::{self, K};
use crate::common::{epoch_ms, reported, run_children, runtime, unique_prefix};
use crate::redis::url;

const CHILD_ENV: &str = "BUCKET4RS_TEST_LEASING_CHILD";

fn child_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A leasing manager of a child on `prefix`, and its backend (for its round-trip count).
async fn leasing_manager(prefix: &str) -> (ProxyManager<RedisBackend>, RedisBackend) {
    // Exactness and progress are checked, not latency: patient timeouts on a loaded machine.
    let options = RedisOptions::default().response_timeout(Duration::from_secs(5));
    let backend = RedisBackend::connect(&url(), options)
        .await
        .unwrap_or_else(|e| panic!("Redis at {} is required: {e}", url()));
    let manager = ProxyManager::configure(backend.clone())
        .key_prefix(prefix)
        .timeout(Duration::from_secs(20))
        .leasing(leased::leasing())
        .build()
        .unwrap();
    (manager, backend)
}

/// What is left of `hot` under `prefix`, read without leasing.
async fn left(prefix: &str) -> i64 {
    let backend = RedisBackend::connect(&url(), RedisOptions::default())
        .await
        .unwrap();
    ProxyManager::configure(backend)
        .key_prefix(prefix)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
        .builder()
        .build("hot", leased::config)
        .unwrap()
        .available_tokens()
        .await
        .unwrap()
}

/// 4 processes × 4 tasks on one key of K tokens on Redis, leasing on: never above K, every
/// token accounted for once the leases are back, at most the leases' bound short, and a
/// small fraction of a round trip per call.
#[test]
fn four_leasing_processes_on_redis_grant_at_most_k_and_account_for_every_token() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (prefix, start_ms) = spec.split_once('|').unwrap();
        let start_ms: u128 = start_ms.parse().unwrap();
        child_runtime().block_on(async {
            let (manager, backend) = leasing_manager(prefix).await;
            leased::drain(&manager, start_ms).await;
            let stats = backend.stats();
            println!("TRIPS {}", stats.round_trips);
            println!("CLIENT {}", stats.exact_path);
        });
        return;
    }
    let prefix = unique_prefix("leasing-procs");
    let rt = runtime();
    assert_eq!(rt.block_on(left(&prefix)), K as i64);
    let outputs = run_children(
        "redis_leasing::four_leasing_processes_on_redis_grant_at_most_k_and_account_for_every_token",
        CHILD_ENV,
        &format!("{prefix}|{}", epoch_ms() + 700),
    );
    let sum = |tag| -> u64 {
        outputs
            .iter()
            .map(|text| reported(text, tag).parse::<u64>().unwrap())
            .sum()
    };
    let (granted, held, trips) = (sum("GRANTED "), sum("HELD "), sum("TRIPS "));
    let client = sum("CLIENT ");
    let after = rt.block_on(left(&prefix));
    println!(
        "leasing on redis: 4 processes: {granted} of {K} granted, {held} held in leases when \
         they stopped, {after} left after their return, {trips} round trips ({:.4} per call), \
         {client} of them computed by the client",
        trips as f64 / granted as f64
    );
    assert!(granted <= K, "over-grant: {granted} > {K}");
    assert_eq!(granted + after as u64, K, "a token lost or doubled");
    assert!(K - granted <= leased::bound(), "under-grant over the bound");
    assert!(
        trips * 20 < granted,
        "{trips} round trips for {granted} calls"
    );
}

/// A process killed (SIGKILL) while it holds a lease on Redis loses that lease from the
/// bucket and nothing more: the others get exactly what was left.
#[test]
fn a_redis_process_killed_with_a_lease_loses_only_that_lease() {
    if let Ok(prefix) = std::env::var(CHILD_ENV) {
        child_runtime().block_on(async {
            let (manager, _) = leasing_manager(&prefix).await;
            leased::doomed(&manager).await;
        });
        return;
    }
    let prefix = unique_prefix("leasing-killed");
    let (granted, leased) = leased::kill_doomed(
        "redis_leasing::a_redis_process_killed_with_a_lease_loses_only_that_lease",
        CHILD_ENV,
        &prefix,
    );
    assert!(leased > 0, "the child took no lease");
    let rest = runtime().block_on(left(&prefix));
    println!(
        "leasing on redis: a killed process: {granted} granted, {leased} lost in its lease, \
         {rest} left"
    );
    assert_eq!(granted + leased + rest as u64, K);
}

/// The script takes a lease only while the key's ledger has room (24 live entries), as the
/// client computes it: of 30 busy managers, at most 24 hold a lease, every lease is taken by
/// the script, and every token counts once the leases are back.
#[test]
fn the_script_leases_while_the_ledger_has_room_and_no_longer() {
    let rt = runtime();
    let prefix = unique_prefix("leasing-room");
    rt.block_on(async {
        let mut managers = Vec::new();
        let mut backends = Vec::new();
        for _ in 0..30 {
            let backend = RedisBackend::connect(&url(), RedisOptions::default())
                .await
                .unwrap();
            let leasing = leased::leasing().processes(30).max_held_percent(100);
            managers.push(
                ProxyManager::configure(backend.clone())
                    .key_prefix(&prefix)
                    .timeout(Duration::from_secs(20))
                    .leasing(leasing)
                    .build()
                    .unwrap(),
            );
            backends.push(backend);
        }
        for m in &managers {
            let b = m.builder().build("hot", leased::config).unwrap();
            for _ in 0..20 {
                assert!(b.try_consume(1).await.unwrap());
            }
        }
        let holding = managers.iter().filter(|m| m.leased_tokens() > 0).count();
        let client: u64 = backends.iter().map(|b| b.stats().exact_path).sum();
        println!("leasing on redis: 30 managers on one key: {holding} hold leases; {client} calls computed by the client");
        assert!((20..=24).contains(&holding), "{holding} managers hold a lease");
        // Only the key's creation: every lease, and every refusal of one, by the script.
        assert!(client <= 1, "{client} calls computed by the client");
        for m in &managers {
            m.release_leases().await.unwrap();
        }
        assert_eq!(left(&prefix).await, (K - 30 * 20) as i64);
    });
}
