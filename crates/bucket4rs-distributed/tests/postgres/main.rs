//! The PostgreSQL backend against a real PostgreSQL (`BUCKET4RS_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`). An unreachable PostgreSQL fails these tests
//! loudly. Every test uses its own table and drops it at the end; the restart test and the
//! fault tests (`fault.rs`, `exhaustion.rs`) run throwaway servers of their own (`own.rs`)
//! and never touch the shared one.
#![cfg(feature = "postgres")]

mod boundary;
#[path = "../it/certs.rs"]
mod certs;
#[path = "../it/common.rs"]
#[allow(dead_code)] // shared with the `it` binary, which uses more of it
mod common;
mod exhaustion;
mod fault;
mod kit;
mod leasing;
mod own;
mod tls;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bucket4rs_distributed::{
    BackendErrorKind, DistributedError, FormatError, PostgresBackend, PostgresOptions,
    PostgresStats, ProxyManager, RemoteBucket, TimeSource,
};

use crate::common::{
    drain_after_restart, dropped_waits_give_back_what_they_reserved, epoch_ms, hammer_hot_key,
    patient, reported, run_children, runtime, simple, unique_prefix,
};
use crate::own::OwnPostgres;

fn url() -> String {
    std::env::var("BUCKET4RS_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A table name no other test (or run) uses: `[a-z0-9_]`.
fn unique_table(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("b4t_{test}_{}_{nanos}", std::process::id())
}

/// Drops its table when the test ends, also on panic.
struct Table {
    name: String,
    url: String,
}

impl Table {
    fn new(test: &str) -> Self {
        Self {
            name: unique_table(test),
            url: url(),
        }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &self.url,
                "-qc",
                &format!("DROP TABLE IF EXISTS \"{}\"", self.name),
            ])
            .output();
    }
}

async fn backend_with(table: &str, options: PostgresOptions, url: &str) -> PostgresBackend {
    // The table first, with patient timeouts: concurrent tests migrate their own tables, and
    // DDL waits for catalog locks longer than a test's short lock timeout may allow.
    let setup = PostgresOptions::default()
        .lock_timeout(Duration::from_secs(10))
        .statement_timeout(Duration::from_secs(10));
    connected(table, setup, url)
        .await
        .migrate()
        .await
        .expect("migrate");
    connected(table, options, url).await
}

async fn connected(table: &str, options: PostgresOptions, url: &str) -> PostgresBackend {
    let options = options.table(table).expect("valid table name");
    let backend = PostgresBackend::connect(url, options)
        .await
        .unwrap_or_else(|e| panic!("a backend for {url}: {e}"));
    answering(&backend, url).await;
    backend
}

/// Waits until `backend`'s server answers, and makes its table (a backend is created at once
/// and connects in the background, failing its calls with a retryable error until then). The
/// setup, not what a test measures (`migrate` counts no round trip): a loaded machine
/// (throwaway clusters starting beside the shared server) can take longer than the connect
/// timeout to answer, so up to 20 s before the server counts as unreachable.
pub(crate) async fn answering(backend: &PostgresBackend, url: &str) {
    let by = Instant::now() + Duration::from_secs(20);
    loop {
        match backend.migrate().await {
            Err(e) if e.is_retryable() || e.kind() == BackendErrorKind::Unavailable => {
                assert!(
                    Instant::now() < by,
                    "PostgreSQL at {url} is required for these tests: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            r => return r.expect("migrate"),
        }
    }
}

async fn backend(table: &Table) -> PostgresBackend {
    backend_with(&table.name, PostgresOptions::default(), &url()).await
}

async fn raw_at(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} is required: {e}"));
    tokio::spawn(conn);
    client
}

async fn raw() -> tokio_postgres::Client {
    raw_at(&url()).await
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

const CHILD_ENV: &str = "BUCKET4RS_TEST_PG_CHILD";

/// The call timeout of the managers whose tests are not about timeouts: the default second is
/// too short for a statement on the shared server while the rest of the suite loads the
/// machine (a replace once took longer in CI), and such a test must not fail for it.
const PATIENT: Duration = Duration::from_secs(10);

#[test]
fn four_processes_share_one_key_and_grant_exactly_its_tokens() {
    let config = || simple(5_000, Duration::from_secs(1_000_000)); // no refill in the window
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let mut parts = spec.split('|');
        let (table, start_ms) = (parts.next().unwrap(), parts.next().unwrap());
        let start_ms: u128 = start_ms.parse().unwrap();
        let rt = multi_thread();
        let (granted, stats) = rt.block_on(async {
            let backend = backend_with(table, PostgresOptions::default(), &url()).await;
            // 16 tasks in 4 processes on one row, one commit (~ms) each: under load a call
            // may wait behind many commits, and this test checks exactness and progress (no
            // call fails, with the DEFAULT retry policy), not latency.
            let manager = patient(backend.clone());
            let total = hammer_hot_key(&manager, config, start_ms).await;
            (total, backend.stats())
        });
        println!("STATS {stats:?}");
        println!("GRANTED {granted}");
        return;
    }
    let table = Table::new("procs");
    let rt = runtime();
    let manager = rt.block_on(async {
        ProxyManager::configure(backend(&table).await)
            .timeout(PATIENT)
            .build()
            .unwrap()
    });
    let bucket = manager.builder().build("hot", config).unwrap();
    assert_eq!(rt.block_on(bucket.available_tokens()).unwrap(), 5_000);
    let start_ms = epoch_ms() + 1_000;
    let outputs = run_children(
        "four_processes_share_one_key_and_grant_exactly_its_tokens",
        CHILD_ENV,
        &format!("{}|{start_ms}", table.name),
    );
    let mut per_child = Vec::new();
    let mut pessimistic = 0;
    for text in &outputs {
        let stats = reported(text, "STATS ");
        println!("STATS {stats}");
        pessimistic += stats
            .split_once("pessimistic: ")
            .and_then(|(_, n)| n.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no pessimistic count in {stats}"));
        per_child.push(reported(text, "GRANTED ").parse::<u64>().unwrap());
    }
    let total: u64 = per_child.iter().sum();
    println!("granted per process: {per_child:?}; locking fallbacks: {pessimistic}");
    assert_eq!(total, 5_000, "per process: {per_child:?}");
    assert_eq!(rt.block_on(bucket.available_tokens()).unwrap(), 0);
    // 4 processes writing one row at once lose compare-and-sets in a row: the locking
    // fallback is what guarantees their progress.
    assert!(pessimistic >= 1, "the locking fallback never ran");
}

/// A client of its own (own pool of `connections`, own cache) on `table`.
async fn client_with(
    table: &str,
    options: PostgresOptions,
) -> (PostgresBackend, ProxyManager<PostgresBackend>) {
    let backend = backend_with(table, options, &url()).await;
    let manager = ProxyManager::configure(backend.clone())
        .time_source(TimeSource::client(bucket4rs_core::SystemNanosClock))
        .timeout(PATIENT)
        .build()
        .unwrap();
    (backend, manager)
}

#[test]
fn the_locking_fallback_creates_and_updates_exactly_and_hands_back_to_compare_and_set() {
    let rt = multi_thread();
    let table = Table::new("locking");
    rt.block_on(async {
        let cfg = || simple(100, Duration::from_secs(1_000_000));
        // 16 clients that always lock (0 optimistic rounds), database clock (the default),
        // create the SAME absent key at once: the losers of the INSERT lock the winner's row.
        // The 16 queue on one row lock; on a loaded machine the last ones can wait longer
        // than the default lock, statement and call timeouts, whose retry would take the
        // locking path twice: generous timeouts keep this test about the locking path.
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let backend = backend_with(
                &table.name,
                PostgresOptions::default()
                    .optimistic_rounds(0)
                    .max_connections(1)
                    .lock_timeout(Duration::from_secs(20))
                    .statement_timeout(Duration::from_secs(30)),
                &url(),
            )
            .await;
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let manager = ProxyManager::configure(backend.clone())
                    .timeout(Duration::from_secs(60))
                    .build()
                    .unwrap();
                let b = manager.builder().build("same", cfg).unwrap();
                barrier.wait().await;
                let v = b.as_verbose().try_consume(1).await;
                (v, backend.stats())
            }));
        }
        let mut fallback_rts = 0;
        for t in tasks {
            let (v, stats) = t.await.unwrap();
            assert!(*v.expect("no surfaced error").value(), "{stats:?}");
            assert_eq!(stats.pessimistic, 1, "{stats:?}");
            fallback_rts += stats.round_trips;
        }
        // 2 round trips each, plus one locked retry (2 more) per INSERT lost to a creator.
        assert!((32..=62).contains(&fallback_rts), "{fallback_rts}");
        let (_, checker) = client_with(&table.name, PostgresOptions::default()).await;
        let same = checker.builder().build("same", cfg).unwrap();
        assert_eq!(same.available_tokens().await.unwrap(), 84);

        // Computed at the database clock read under the lock: never ahead of it.
        let backend = backend_with(
            &table.name,
            PostgresOptions::default().optimistic_rounds(0),
            &url(),
        )
        .await;
        let db_clock = ProxyManager::new(backend.clone());
        let b = db_clock.builder().build("clock", cfg).unwrap();
        let v = b.as_verbose().try_consume(1).await.unwrap();
        let db_now: i64 = raw()
            .await
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::int8",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(*v.value());
        assert!(
            (0..5_000_000_000).contains(&(db_now - v.now_nanos())),
            "computed {} ns before the database clock",
            db_now - v.now_nanos()
        );

        // Two clients allowed ONE optimistic round each, alternating on one key: every
        // stale compare-and-set loses once and falls back (1 + 2 round trips); the commit
        // refreshes the cache, so the same client's next call is one statement again.
        let one = || PostgresOptions::default().optimistic_rounds(1);
        let (ba, a) = client_with(&table.name, one()).await;
        let (bb, b) = client_with(&table.name, one()).await;
        let a = a.builder().build("pair", cfg).unwrap();
        let b = b.builder().build("pair", cfg).unwrap();
        let rt_of = |s: PostgresStats| (s.round_trips, s.pessimistic, s.one_round_trip);
        assert!(a.try_consume(1).await.unwrap()); // creates: 1 statement
        assert_eq!(rt_of(ba.stats()), (1, 0, 1));
        assert!(b.try_consume(2).await.unwrap()); // INSERT loses, then locks
        assert_eq!(rt_of(bb.stats()), (3, 1, 0));
        assert!(a.try_consume(3).await.unwrap()); // stale UPDATE loses, then locks
        assert_eq!(rt_of(ba.stats()), (4, 1, 1));
        assert!(a.try_consume(4).await.unwrap()); // cache from the commit: 1 statement
        assert_eq!(rt_of(ba.stats()), (5, 1, 2));
        assert!(b.try_consume(5).await.unwrap());
        assert_eq!(rt_of(bb.stats()), (6, 2, 0));
        assert!(b.try_consume(6).await.unwrap());
        assert_eq!(rt_of(bb.stats()), (7, 2, 1));
        assert_eq!(a.available_tokens().await.unwrap(), 100 - 21);
        assert_eq!(ba.stats().pessimistic, 2);
        assert!(!b.try_consume(80).await.unwrap());
        assert!(b.try_consume(79).await.unwrap());
        assert_eq!(a.available_tokens().await.unwrap(), 0);
    });
}

#[test]
fn the_locking_fallback_waits_only_until_the_timeouts_and_never_leaks_a_transaction() {
    let rt = multi_thread();
    let table = Table::new("lockfallback");
    rt.block_on(async {
        let cfg = || simple(100, Duration::from_secs(1_000_000));
        // One connection, always locking: whatever a failed or cancelled call left behind,
        // the next call runs on that pool.
        let options = || {
            PostgresOptions::default()
                .optimistic_rounds(0)
                .max_connections(1)
        };
        let backend = backend_with(
            &table.name,
            options().lock_timeout(Duration::from_millis(100)),
            &url(),
        )
        .await;
        let timeout = Duration::from_millis(600);
        let manager = ProxyManager::configure(backend.clone())
            .timeout(timeout)
            .build()
            .unwrap();
        let b = manager.builder().build("k", cfg).unwrap();
        // The calls that must succeed go through a patient manager on the same pool: on a
        // loaded machine a fresh connection and its statements can take longer than 600 ms.
        let lenient = patient(backend.clone());
        let sure = lenient.builder().build("k", cfg).unwrap();
        assert!(sure.try_consume(1).await.unwrap());
        let t = &table.name;
        let mut holder = raw().await;
        let hold = holder.transaction().await.unwrap();
        let lock = format!("SELECT 1 FROM \"{t}\" WHERE key = $1 FOR UPDATE");
        hold.query(&lock, &[&b.key().as_str()]).await.unwrap();
        // lock_timeout (55P03) is retryable: rolled back, retried, until the call's timeout.
        let started = Instant::now();
        let r = b.try_consume(1).await;
        assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
        // The lock is held until the commit below: an unbounded call would never return.
        assert!(started.elapsed() <= timeout + Duration::from_secs(2));
        hold.commit().await.unwrap();
        assert!(sure.try_consume(1).await.unwrap());
        assert_eq!(sure.available_tokens().await.unwrap(), 98);

        // A call cancelled while it waits for the lock inside its transaction (lock_timeout
        // longer than the call's timeout): its connection must not go back to the pool.
        let backend = backend_with(
            &table.name,
            options().lock_timeout(Duration::from_secs(5)),
            &url(),
        )
        .await;
        let manager = ProxyManager::configure(backend.clone())
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let lenient = patient(backend.clone());
        let b = manager.builder().build("k", cfg).unwrap();
        let sure = lenient.builder().build("k", cfg).unwrap();
        let other = lenient.builder().build("other", cfg).unwrap();
        let hold = holder.transaction().await.unwrap();
        hold.query(&lock, &[&b.key().as_str()]).await.unwrap();
        let r = b.try_consume(1).await;
        // Its statement was waiting for the lock when the call gave up: in doubt.
        assert!(r.as_ref().is_err_and(|e| e.is_in_doubt()), "{r:?}");
        // The only pooled connection was dropped: another key works at once and commits. Had
        // the connection gone back to the pool still waiting for the lock, this call would
        // wait for that statement's 5 s lock timeout first.
        let started = Instant::now();
        assert!(other.try_consume(1).await.unwrap());
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let n: i64 = raw()
            .await
            .query_one(
                &format!("SELECT count(*) FROM \"{t}\" WHERE key = $1"),
                &[&other.key().as_str()],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "the write was not committed");
        hold.commit().await.unwrap();
        assert!(sure.try_consume(1).await.unwrap());
        assert_eq!(sure.available_tokens().await.unwrap(), 97);
        assert!(backend.stats().pessimistic >= 4, "{:?}", backend.stats());
    });
}

#[test]
fn a_hundred_absent_keys_are_created_at_once_in_one_statement_each() {
    let rt = multi_thread();
    let table = Table::new("create");
    rt.block_on(async {
        // What is counted here is statements, not the clock guard: with the default 50 ms
        // tolerance a loaded machine (this file's other tests start servers) can delay one of
        // the hundred past it, and the guard's retry would count as a second round trip.
        let backend = backend_with(
            &table.name,
            PostgresOptions::default().clock_tolerance(Duration::from_secs(60)),
            &url(),
        )
        .await;
        let manager = patient(backend.clone());
        let barrier = Arc::new(tokio::sync::Barrier::new(100));
        let mut tasks = Vec::new();
        for k in 0..100 {
            let b = manager
                .builder()
                .build(format!("k{k}"), || simple(10, Duration::from_secs(1_000)))
                .unwrap();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                b.try_consume(1).await
            }));
        }
        for t in tasks {
            assert!(t.await.unwrap().expect("no surfaced error"));
        }
        let stats = backend.stats();
        println!("creation stats: {stats:?}");
        assert_eq!(stats.round_trips, 100, "{stats:?}");
        assert_eq!(stats.one_round_trip, 100, "{stats:?}");
        let n: i64 = raw()
            .await
            .query_one(&format!("SELECT count(*) FROM \"{}\"", table.name), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 100);

        // 16 separate clients (own pools, own caches) create the SAME absent key at once.
        // They queue on one row lock: timeouts as generous as the locking test's keep this
        // about creation, not about how long the last one waits on a loaded machine.
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let manager = ProxyManager::configure(
                backend_with(
                    &table.name,
                    PostgresOptions::default()
                        .max_connections(1)
                        .lock_timeout(Duration::from_secs(20))
                        .statement_timeout(Duration::from_secs(30)),
                    &url(),
                )
                .await,
            )
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let b = manager
                    .builder()
                    .build("same", || simple(100, Duration::from_secs(1_000_000)))
                    .unwrap();
                barrier.wait().await;
                b.try_consume(1).await
            }));
        }
        for t in tasks {
            assert!(t.await.unwrap().expect("no surfaced error"));
        }
        let b = manager
            .builder()
            .build("same", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        assert_eq!(b.available_tokens().await.unwrap(), 84);
    });
}

#[test]
fn the_database_clock_costs_one_statement_per_operation() {
    let rt = runtime();
    let table = Table::new("dbclock");
    rt.block_on(async {
        // Statements are counted, not guard retries: a tolerance no stall of a loaded
        // machine exceeds (the estimate's distance from the database clock is checked below).
        let backend = backend_with(
            &table.name,
            PostgresOptions::default().clock_tolerance(Duration::from_secs(60)),
            &url(),
        )
        .await;
        // The default time source is the backend's: PostgreSQL's clock_timestamp().
        let manager = ProxyManager::new(backend.clone());
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        let mut granted = 0;
        for _ in 0..200 {
            if b.try_consume(1).await.unwrap() {
                granted += 1;
            }
        }
        assert_eq!(granted, 100);
        // Connected before the reading, so the gap below is one loopback statement.
        let checker = raw().await;
        let v = b.as_verbose().available_tokens().await.unwrap();
        assert_eq!(*v.value(), 0);
        let db_now: i64 = checker
            .query_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::int8",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        // At most the 50 ms tolerance the server held the estimate to, plus that statement
        // (generous for a loaded machine); never ahead of the database clock.
        let behind = db_now - v.now_nanos();
        assert!(
            (0..250_000_000).contains(&behind),
            "computed {behind} ns before the database clock"
        );
        let stats = backend.stats();
        println!("database clock stats: {stats:?}");
        assert_eq!(stats.conflicts, 0, "{stats:?}");
        assert!(stats.one_round_trip >= 200, "{stats:?}");
    });
}

#[test]
fn expires_at_is_full_again_plus_the_margin_and_migrate_is_idempotent() {
    let rt = runtime();
    let table = Table::new("ttl");
    rt.block_on(async {
        let backend = backend(&table).await;
        backend.migrate().await.unwrap();
        let (a, b) = tokio::join!(backend.migrate(), backend.migrate());
        a.unwrap();
        b.unwrap();
        // A stopped client clock: both writes happen at one instant, so each TTL is exact
        // and the checks below only allow for the time until the query reads it (up to 1 s).
        let manager = ProxyManager::configure(backend.clone())
            .ttl_margin(Duration::from_millis(2_000))
            .timeout(PATIENT)
            .time_source(TimeSource::client(bucket4rs_core::ManualClock::new(
                1_700_000_000_000_000_000,
            )))
            .build()
            .unwrap();
        // 1 token per second: 3 consumed → full again after 3 s.
        let b = manager
            .builder()
            .build("k", || simple(10, Duration::from_secs(10)))
            .unwrap();
        let raw = raw().await;
        assert!(b.try_consume(3).await.unwrap());
        let q = format!(
            "SELECT (extract(epoch FROM expires_at - now()) * 1000)::int8 FROM \"{}\" WHERE key = $1",
            table.name
        );
        let ms: i64 = raw
            .query_one(&q, &[&b.key().as_str()])
            .await
            .unwrap()
            .get(0);
        assert!((4_000..=5_000).contains(&ms), "expires in {ms} ms");
        b.replace_configuration(
            simple(10, Duration::from_secs(100)),
            bucket4rs_core::TokensInheritanceStrategy::AsIs,
        )
        .await
        .unwrap();
        let ms: i64 = raw
            .query_one(&q, &[&b.key().as_str()])
            .await
            .unwrap()
            .get(0);
        // 3 missing tokens at 0.1 per second: 30 s, plus the margin.
        assert!((31_000..=32_000).contains(&ms), "expires in {ms} ms");
        assert!(manager.remove("k").await.unwrap());
        assert!(!manager.remove("k").await.unwrap());
        assert_eq!(b.available_tokens().await.unwrap(), 10);
    });
}

#[test]
fn the_reaper_deletes_expired_rows_and_never_a_live_one() {
    let rt = runtime();
    let table = Table::new("reaper");
    rt.block_on(async {
        let backend = backend(&table).await;
        let manager = ProxyManager::configure(backend.clone())
            .ttl_margin(Duration::ZERO)
            .timeout(PATIENT)
            .build()
            .unwrap();
        // 1 token per 10 ms: one consumed token → expires 10 ms later.
        let short = || simple(10, Duration::from_millis(100));
        let long = || simple(10, Duration::from_secs(1_000));
        let expired = manager.builder().build("expired", short).unwrap();
        let busy = manager.builder().build("busy", short).unwrap();
        let live = manager.builder().build("live", long).unwrap();
        for b in [&expired, &busy, &live] {
            assert!(b.try_consume(1).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // "busy" expired too, but a writer is refilling it right now (row locked, new
        // expiry not committed yet).
        let mut writer = raw().await;
        let t = &table.name;
        let w = writer.transaction().await.unwrap();
        w.execute(
            &format!(
                "UPDATE \"{t}\" SET expires_at = now() + interval '1 hour', version = version + 1 WHERE key = $1"
            ),
            &[&busy.key().as_str()],
        )
        .await
        .unwrap();
        assert_eq!(backend.reap_expired(100).await.unwrap(), 1);
        w.commit().await.unwrap();
        assert_eq!(backend.reap_expired(100).await.unwrap(), 0);
        let rows = raw()
            .await
            .query(&format!("SELECT key FROM \"{t}\" ORDER BY key"), &[])
            .await
            .unwrap();
        let keys: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        assert_eq!(
            keys,
            vec![busy.key().as_str().to_owned(), live.key().as_str().to_owned()]
        );
        // The reaped key is simply absent: next use starts full.
        assert_eq!(expired.available_tokens().await.unwrap(), 10);
        // The background reaper does the same.
        let _reaper = backend.spawn_reaper(Duration::from_millis(20), 10);
        let deadline = Instant::now() + Duration::from_secs(10);
        while backend.stats().reaped < 2 {
            assert!(Instant::now() < deadline, "{:?}", backend.stats());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(live.try_consume(1).await.unwrap());
        assert_eq!(live.available_tokens().await.unwrap(), 8);
    });
}

#[test]
fn corrupt_records_are_typed_errors_and_never_overwritten() {
    let rt = runtime();
    let table = Table::new("corrupt");
    rt.block_on(async {
        let manager = ProxyManager::new(backend(&table).await);
        let b = manager
            .builder()
            .build("k", || simple(10, Duration::from_secs(10)))
            .unwrap();
        assert!(b.try_consume(1).await.unwrap());
        let raw = raw().await;
        let t = &table.name;
        raw.execute(
            &format!("UPDATE \"{t}\" SET state = 'not a bucket'::bytea, version = version + 1"),
            &[],
        )
        .await
        .unwrap();
        assert!(matches!(
            b.try_consume(1).await,
            Err(DistributedError::Format(FormatError::BadMagic))
        ));
        let stored: Vec<u8> = raw
            .query_one(&format!("SELECT state FROM \"{t}\""), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(stored, b"not a bucket");
    });
}

#[test]
fn hostile_table_names_are_rejected() {
    for name in [
        "",
        "t; DROP TABLE users",
        "t\"; DROP TABLE users; --",
        "Robert'); DROP TABLE students;--",
        "t--",
        "a.b.c",
        "UPPER",
        "9lives",
        "t\0",
        "t\u{fe63}",
        &"x".repeat(64),
    ] {
        assert!(
            PostgresOptions::default().table(name).is_err(),
            "{name:?} accepted"
        );
    }
    assert!(
        PostgresOptions::default()
            .table("public.rate_limits")
            .is_ok()
    );
    assert!(PostgresOptions::default().table(&"x".repeat(63)).is_ok());
}

#[test]
fn a_lock_holder_blocks_callers_only_until_the_timeouts_and_termination_frees_the_key() {
    let rt = multi_thread();
    let table = Table::new("lock");
    rt.block_on(async {
        let backend = backend_with(
            &table.name,
            PostgresOptions::default().lock_timeout(Duration::from_millis(100)),
            &url(),
        )
        .await;
        let timeout = Duration::from_millis(600);
        let manager = ProxyManager::configure(backend.clone())
            .timeout(timeout)
            .build()
            .unwrap();
        // Calls that must succeed go through a patient manager on the same pool.
        let lenient = patient(backend);
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        let other = lenient
            .builder()
            .build("other", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        assert!(
            lenient
                .builder()
                .build("k", || simple(100, Duration::from_secs(1_000_000)))
                .unwrap()
                .try_consume(1)
                .await
                .unwrap()
        );
        let mut holder = raw().await;
        let pid: i32 = holder
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let hold = holder.transaction().await.unwrap();
        hold.query(
            &format!("SELECT 1 FROM \"{}\" WHERE key = $1 FOR UPDATE", table.name),
            &[&b.key().as_str()],
        )
        .await
        .unwrap();
        for _ in 0..3 {
            let t = Instant::now();
            let r = b.try_consume(1).await;
            let took = t.elapsed();
            assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
            // The holder never lets go: an unbounded call would never return.
            assert!(took <= timeout + Duration::from_secs(2), "took {took:?}");
        }
        // Other keys are not blocked (the lock on `k` is held until the holder is killed).
        let t = Instant::now();
        assert!(other.try_consume(1).await.unwrap());
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // The calls that failed under the lock charged nothing (a plain read does not wait
        // for the row lock).
        let sure_k = lenient
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        assert_eq!(sure_k.available_tokens().await.unwrap(), 99);
        let killed: bool = raw()
            .await
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap()
            .get(0);
        assert!(killed);
        drop(hold);
        let deadline = Instant::now() + Duration::from_secs(5);
        // Failed calls whose statement may have committed before the caller gave up (a reply
        // later than the 600 ms timeout on a loaded machine): each may have charged once.
        let mut in_doubt = 0;
        loop {
            match b.try_consume(1).await {
                Ok(r) => {
                    assert!(r);
                    break;
                }
                Err(e) => {
                    in_doubt += 1;
                    assert!(Instant::now() < deadline, "no recovery: {e}");
                }
            }
        }
        // Nothing was granted twice: one success, and at most one charge per call in doubt.
        let left = b.available_tokens().await.unwrap();
        assert!(
            (98 - in_doubt..=98).contains(&left),
            "{left} left, {in_doubt} in doubt"
        );
    });
}

#[test]
fn fault_postgres_server_restart_errors_within_the_timeout_then_recovers_without_granting_twice() {
    let server = OwnPostgres::init();
    server.start();
    let rt = multi_thread();
    let timeout = Duration::from_millis(500);
    rt.block_on(async {
        let table = "restart";
        // The table, made with the default timeouts: a just-started cluster on a loaded
        // machine can take longer than the short ones below to answer its first connection.
        backend_with(table, PostgresOptions::default(), &server.url()).await;
        let short = || {
            PostgresOptions::default()
                .connect_timeout(Duration::from_millis(200))
                .wait_timeout(Duration::from_millis(200))
                .statement_timeout(Duration::from_millis(300))
                .table(table)
                .expect("valid table name")
        };
        let backend = PostgresBackend::connect(&server.url(), short())
            .await
            .unwrap();
        answering(&backend, &server.url()).await;
        let manager = ProxyManager::configure(backend.clone())
            .timeout(timeout)
            .build()
            .unwrap();
        // The calls before the stop must all succeed: a patient manager on the same pool.
        let lenient = patient(backend);
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        let sure = lenient
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        let mut granted = 0;
        for _ in 0..40 {
            assert!(sure.try_consume(1).await.unwrap());
            granted += 1;
        }
        server.stop("immediate");
        for _ in 0..5 {
            let t = Instant::now();
            let r = b.try_consume(1).await;
            let took = t.elapsed();
            assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
            // Bounded by the call's timeout (the server stays down): slack for a loaded machine.
            assert!(took <= timeout + Duration::from_secs(1), "took {took:?}");
        }
        server.start();
        let deadline = Instant::now() + Duration::from_secs(15);
        let url = server.url();
        let key = b.key().as_str().to_owned();
        let stored = || {
            let (url, key) = (url.clone(), key.clone());
            async move {
                let budget = Duration::from_millis(500);
                let connect = tokio_postgres::connect(&url, tokio_postgres::NoTls);
                let (client, conn) = tokio::time::timeout(budget, connect).await.ok()?.ok()?;
                tokio::spawn(conn);
                let select = format!("SELECT state FROM \"{table}\" WHERE key = $1");
                let row = tokio::time::timeout(budget, client.query_one(&select, &[&key]))
                    .await
                    .ok()?
                    .ok()?;
                Some(row.get(0))
            }
        };
        drain_after_restart(&b, 100, granted, deadline, stored).await;
    });
}

/// Created against a port nobody listens on: creation succeeds at once, and every call fails
/// at once with a retryable `Unavailable` (nothing was sent).
#[test]
fn an_unreachable_postgres_is_created_and_its_calls_fail_fast_and_retryably() {
    let rt = runtime();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    rt.block_on(async {
        let t = Instant::now();
        let backend = PostgresBackend::connect(
            &format!("postgres://postgres@127.0.0.1:{port}/test"),
            PostgresOptions::default().connect_timeout(Duration::from_millis(100)),
        )
        .await
        .expect("creation does not wait for the server");
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        let key = ProxyManager::new(backend.clone()).storage_key("k").unwrap();
        for _ in 0..5 {
            let t = Instant::now();
            let e = bucket4rs_distributed::Backend::read(&backend, &key)
                .await
                .unwrap_err();
            assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
            assert!(e.is_retryable(), "nothing was sent: {e}");
            assert!(
                t.elapsed() < Duration::from_millis(100),
                "{:?}",
                t.elapsed()
            );
        }
    });
}

/// Waiting calls dropped mid-wait give their reservation back on PostgreSQL too.
#[test]
fn postgres_dropped_waits_give_back_what_they_reserved() {
    let rt = runtime();
    let table = Table::new("dropped_waits");
    rt.block_on(async {
        let took = dropped_waits_give_back_what_they_reserved(backend(&table).await, "waits").await;
        println!("postgres: dropped waits' refunds landed within {took:?}");
    });
}

#[test]
fn the_blocking_form_works_from_a_plain_thread() {
    let rt = multi_thread();
    let table = Table::new("blocking");
    let backend = rt.block_on(backend(&table));
    let manager = ProxyManager::configure(backend)
        .time_source(TimeSource::client(bucket4rs_core::SystemNanosClock))
        .timeout(PATIENT)
        .build()
        .unwrap();
    let b: RemoteBucket<PostgresBackend> = manager
        .builder()
        .build("k", || simple(5, Duration::from_secs(1_000)))
        .unwrap();
    // No runtime handle: the connections made on `rt` serve the blocking view's calls.
    let blocking = b.as_blocking();
    let granted = std::thread::spawn(move || {
        (0..10)
            .filter(|_| blocking.block_on(|b| b.try_consume(1)).unwrap())
            .count()
    })
    .join()
    .unwrap();
    assert_eq!(granted, 5);
    assert!(rt.block_on(b.raw_record()).unwrap().is_some());
}
