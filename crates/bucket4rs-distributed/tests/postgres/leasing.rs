//! Leasing on PostgreSQL across real processes: four children drain one key with leasing
//! on, and a child killed (SIGKILL) while it holds a lease.

use bucket4rs_distributed::{PostgresBackend, PostgresOptions, ProxyManager};

use crate::common::leased::{self, K};
use crate::common::{epoch_ms, reported, run_children, runtime};
use crate::{PATIENT, Table, backend_with, multi_thread, url};

const CHILD_ENV: &str = "BUCKET4RS_TEST_PG_LEASING_CHILD";

/// A leasing manager of a child on `table`, and its backend (for its round-trip count).
async fn leasing_manager(table: &str) -> (ProxyManager<PostgresBackend>, PostgresBackend) {
    let backend = backend_with(table, PostgresOptions::default(), &url()).await;
    let manager = ProxyManager::configure(backend.clone())
        .timeout(PATIENT)
        .leasing(leased::leasing())
        .build()
        .unwrap();
    (manager, backend)
}

/// What is left of `hot` in `table`, read without leasing.
async fn left(table: &str) -> i64 {
    let backend = backend_with(table, PostgresOptions::default(), &url()).await;
    ProxyManager::configure(backend)
        .timeout(PATIENT)
        .build()
        .unwrap()
        .builder()
        .build("hot", leased::config)
        .unwrap()
        .available_tokens()
        .await
        .unwrap()
}

/// 4 processes × 4 tasks on one row of K tokens, leasing on: never above K, every token
/// accounted for once the leases are back, at most the leases' bound short, and a small
/// fraction of a statement per call (against one per call, or per batch, without leasing).
#[test]
fn four_leasing_processes_on_postgres_grant_at_most_k_and_account_for_every_token() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (table, start_ms) = spec.split_once('|').unwrap();
        let start_ms: u128 = start_ms.parse().unwrap();
        multi_thread().block_on(async {
            let (manager, backend) = leasing_manager(table).await;
            leased::drain(&manager, start_ms).await;
            println!("TRIPS {}", backend.stats().round_trips);
        });
        return;
    }
    let table = Table::new("leasing_procs");
    let rt = runtime();
    assert_eq!(rt.block_on(left(&table.name)), K as i64);
    let outputs = run_children(
        "leasing::four_leasing_processes_on_postgres_grant_at_most_k_and_account_for_every_token",
        CHILD_ENV,
        &format!("{}|{}", table.name, epoch_ms() + 1_000),
    );
    let sum = |tag| -> u64 {
        outputs
            .iter()
            .map(|text| reported(text, tag).parse::<u64>().unwrap())
            .sum()
    };
    let (granted, held, trips) = (sum("GRANTED "), sum("HELD "), sum("TRIPS "));
    let after = rt.block_on(left(&table.name));
    println!(
        "leasing on postgres: 4 processes: {granted} of {K} granted, {held} held in leases \
         when they stopped, {after} left after their return, {trips} round trips ({:.4} per \
         call)",
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

/// A process killed (SIGKILL) while it holds a lease on PostgreSQL loses that lease from the
/// bucket and nothing more.
#[test]
fn a_postgres_process_killed_with_a_lease_loses_only_that_lease() {
    if let Ok(table) = std::env::var(CHILD_ENV) {
        multi_thread().block_on(async {
            let (manager, _) = leasing_manager(&table).await;
            leased::doomed(&manager).await;
        });
        return;
    }
    let table = Table::new("leasing_killed");
    let (granted, leased) = leased::kill_doomed(
        "leasing::a_postgres_process_killed_with_a_lease_loses_only_that_lease",
        CHILD_ENV,
        &table.name,
    );
    assert!(leased > 0, "the child took no lease");
    let rest = runtime().block_on(left(&table.name));
    println!(
        "leasing on postgres: a killed process: {granted} granted, {leased} lost in its \
         lease, {rest} left"
    );
    assert_eq!(granted + leased + rest as u64, K);
}
