//! The boundary differential (issue 33) on PostgreSQL: the same clock readings and last
//! refills as the Redis script's (`common::boundary`), through the backend and through the
//! core, with equal answers, equal stored bytes, and no expiry exactly when the core has no
//! forgettable moment. PostgreSQL computes nothing itself (the client computes with the core
//! and compare-and-sets the bytes), so this proves the path around it: the encoding of the
//! extreme states, the TTL of far-apart readings and the statements' parameters.

use bucket4rs_core::{BucketConfiguration, BucketState, ManualClock};
use bucket4rs_distributed::{PostgresBackend, ProxyManager, RemoteBucket, TimeSource, format};

use super::{PATIENT, Table, backend, raw};
use crate::common::{boundary, core_result, remote_result, remote_verbose_result, runtime};

/// The stored row of `key`: version, record, whether it never expires.
async fn row(raw: &tokio_postgres::Client, table: &str, key: &str) -> (i64, Vec<u8>, bool) {
    let r = raw
        .query_one(
            &format!("SELECT version, state, expires_at IS NULL FROM \"{table}\" WHERE key = $1"),
            &[&key],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

async fn seed(
    raw: &tokio_postgres::Client,
    table: &str,
    bucket: &RemoteBucket<PostgresBackend>,
    config: &BucketConfiguration,
    state: &BucketState,
) {
    raw.execute(
        &format!(
            "INSERT INTO \"{table}\" (key, state, version, expires_at) VALUES ($1, $2, 1, NULL)"
        ),
        &[&bucket.key().as_str(), &format::encode(config, state)],
    )
    .await
    .unwrap();
}

/// What differs between the backend and the core after one operation at `now`.
#[allow(clippy::too_many_arguments)] // one comparison, spelled out
async fn compare(
    raw: &tokio_postgres::Client,
    table: &str,
    key: &str,
    config: &BucketConfiguration,
    state: &BucketState,
    version_before: i64,
    (got, expected): (&str, &str),
    now: i64,
) -> Option<String> {
    if got != expected {
        return Some(format!("answered {got}, the core {expected}"));
    }
    let (version, stored, never) = row(raw, table, key).await;
    if !format::decode(&stored).is_ok_and(|r| r.config == *config && r.state == *state) {
        let found = format::decode(&stored).map(|r| r.state);
        return Some(format!("stored {found:?}, the core {state:?}"));
    }
    // A write sets the expiry; seeded without one, an unwritten row keeps none.
    let forever = state.forgettable_at(config, now).is_none();
    if version != version_before && never != forever {
        return Some(format!(
            "written with expires_at NULL = {never}, the core never forgettable = {forever}"
        ));
    }
    None
}

#[test]
fn postgres_boundary_readings_on_a_client_clock_match_the_core() {
    let table = Table::new("boundary_client");
    runtime().block_on(async {
        let backend = backend(&table).await;
        let raw = raw().await;
        let cases = boundary::cases();
        let mut failures = Vec::new();
        for (i, case) in cases.iter().enumerate() {
            let manager = ProxyManager::configure(backend.clone())
                .time_source(TimeSource::client(ManualClock::new(case.now)))
                .timeout(PATIENT)
                .build()
                .unwrap();
            let c2 = case.config.clone();
            let bucket = manager
                .builder()
                .build(format!("k{i}"), move || c2.clone())
                .unwrap();
            seed(&raw, &table.name, &bucket, &case.config, &case.state).await;
            let key = bucket.key().as_str();
            let mut state = case.state.clone();
            for op in case.ops {
                let (version, _, _) = row(&raw, &table.name, key).await;
                let expected = core_result(op, &case.config, &mut state, case.now);
                let got = remote_result(op, &bucket).await;
                let answers = (got.as_str(), expected.as_str());
                if let Some(why) = compare(
                    &raw,
                    &table.name,
                    key,
                    &case.config,
                    &state,
                    version,
                    answers,
                    case.now,
                )
                .await
                {
                    failures.push(format!("case {i}: {op:?} on {case:?}: {why}"));
                    break;
                }
            }
        }
        println!(
            "postgres boundary (client clock): {} cases, {:?}",
            cases.len(),
            backend.stats()
        );
        boundary::report(&failures, cases.len());
    });
}

/// On the database clock (the default time source): last refills 2^53 ns and around before
/// and after it; each answer is compared with the core at the reading it was computed at
/// (the verbose view's).
#[test]
fn postgres_boundary_distances_on_the_database_clock_match_the_core() {
    let table = Table::new("boundary_db");
    runtime().block_on(async {
        let backend = backend(&table).await;
        let raw = raw().await;
        let manager = ProxyManager::configure(backend.clone())
            .timeout(PATIENT)
            .build()
            .unwrap();
        let ops = boundary::ops();
        let mut failures = Vec::new();
        let mut n = 0usize;
        for d in boundary::distances() {
            for (c, config) in boundary::configs().into_iter().enumerate() {
                for variant in 0..4 {
                    let db_now: i64 = raw
                        .query_one(
                            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::int8",
                            &[],
                        )
                        .await
                        .unwrap()
                        .get(0);
                    let Some(last_refill) = db_now.checked_sub(d) else {
                        continue;
                    };
                    n += 1;
                    let mut state = boundary::state(&config, last_refill, variant);
                    let c2 = config.clone();
                    let bucket = manager
                        .builder()
                        .build(format!("k{n}"), move || c2.clone())
                        .unwrap();
                    seed(&raw, &table.name, &bucket, &config, &state).await;
                    let key = bucket.key().as_str();
                    let verbose = bucket.as_verbose();
                    let pair = [ops[n % ops.len()], ops[(n / ops.len() + c) % ops.len()]];
                    for op in pair {
                        let (version, _, _) = row(&raw, &table.name, key).await;
                        let (got, now) = remote_verbose_result(op, &verbose).await;
                        // An error carries no reading: the one just before the call.
                        let now = now.unwrap_or(db_now);
                        let expected = core_result(op, &config, &mut state, now);
                        let answers = (got.as_str(), expected.as_str());
                        if let Some(why) = compare(
                            &raw,
                            &table.name,
                            key,
                            &config,
                            &state,
                            version,
                            answers,
                            now,
                        )
                        .await
                        {
                            failures.push(format!(
                                "case {n}: {op:?} at {now}, last refill {d} ns before, config #{c}: {why}"
                            ));
                            break;
                        }
                    }
                }
            }
        }
        println!(
            "postgres boundary (database clock): {n} cases, {:?}",
            backend.stats()
        );
        boundary::report(&failures, n);
    });
}
