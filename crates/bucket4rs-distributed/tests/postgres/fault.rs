//! Faults against a PostgreSQL of the test's own (never the shared one): a frozen server, a
//! restart, rows corrupted or edited by hand, expiry of buckets that start empty, readings at
//! the extremes of the clock. Each test prints what it measured (`fault: …`).

use std::time::{Duration, Instant};

use bucket4rs_core::{Bandwidth, BucketConfiguration, ManualClock, ops::TryConsume};
use bucket4rs_distributed::{
    BackendErrorKind, DistributedError, PostgresBackend, PostgresOptions, ProxyManager,
    RemoteBucket, TimeSource, format,
};

use super::{backend_with, multi_thread, raw_at};
use crate::common::simple;
use crate::own::OwnPostgres;

/// A started cluster of our own, a connected backend on `table` (migrated), and a raw client.
pub(super) async fn own_backend(
    server: &OwnPostgres,
    table: &str,
    options: PostgresOptions,
) -> (PostgresBackend, tokio_postgres::Client) {
    // Made with the default timeouts: a just-started cluster on a loaded machine can take
    // longer than a test's short ones to answer its first connection.
    backend_with(table, PostgresOptions::default(), &server.url()).await;
    let options = options.table(table).expect("valid table name");
    let backend = PostgresBackend::connect(&server.url(), options)
        .await
        .unwrap();
    super::answering(&backend, &server.url()).await;
    (backend, raw_at(&server.url()).await)
}

pub(super) fn started() -> OwnPostgres {
    let server = OwnPostgres::init();
    server.start();
    server
}

/// The stored row of `key`: state, version, expiry (µs since the epoch, `None`: never).
pub(super) async fn row(
    raw: &tokio_postgres::Client,
    table: &str,
    key: &str,
) -> Option<(Vec<u8>, i64, Option<i64>)> {
    raw.query_opt(
        &format!(
            "SELECT state, version, (extract(epoch FROM expires_at) * 1000000)::int8 \
             FROM \"{table}\" WHERE key = $1"
        ),
        &[&key],
    )
    .await
    .unwrap()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
}

/// Stores `state` (and `version`, `expires_at` in µs) for `key` by hand.
async fn put_row(
    raw: &tokio_postgres::Client,
    table: &str,
    key: &str,
    (state, version, expires): &(Vec<u8>, i64, Option<i64>),
) {
    let n = raw
        .execute(
            &format!(
                "UPDATE \"{table}\" SET state = $2, version = $3, expires_at = \
                 CASE WHEN $4::int8 IS NULL THEN NULL ELSE to_timestamp($4::int8 / 1e6) END \
                 WHERE key = $1"
            ),
            &[&key, state, version, expires],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
}

pub(super) fn tokens(bytes: &[u8]) -> i64 {
    format::decode(bytes).unwrap().state.bandwidths()[0].tokens()
}

/// Freeze every process of the cluster (SIGSTOP), let calls time out, resume it (SIGCONT):
/// the statements that sat in the sockets run on resume, past their callers' deadlines, and
/// write nothing. The balance is exactly the initial one minus what the successful calls took.
/// Three ways in: the database clock, a client clock (no clock guard in the statement: only
/// the deadline refuses it), and the locking fallback on every call.
#[test]
fn fault_postgres_frozen_calls_that_time_out_charge_nothing() {
    let server = started();
    let rt = multi_thread();
    rt.block_on(async {
        let table = "frozen";
        for (n, (how, time, rounds)) in [
            ("database clock", TimeSource::backend(), 2),
            (
                "client clock",
                TimeSource::client(bucket4rs_core::SystemNanosClock),
                2,
            ),
            (
                "locking, client clock",
                TimeSource::client(bucket4rs_core::SystemNanosClock),
                0,
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let options = PostgresOptions::default().optimistic_rounds(rounds);
            let (backend, raw) = own_backend(&server, table, options).await;
            let timeout = Duration::from_millis(200);
            let manager = ProxyManager::configure(backend.clone())
                .timeout(timeout)
                .time_source(time.clone())
                .build()
                .unwrap();
            let config = || simple(1_000, Duration::from_secs(1_000_000_000));
            let name = format!("k{n}");
            let b = manager.builder().build(&name, config).unwrap();
            let mut ok = 0u64;
            for _ in 0..20 {
                assert!(b.try_consume(1).await.unwrap());
                ok += 1;
            }
            let frozen = server.signal("STOP");
            assert!(frozen >= 2, "froze {frozen} processes");
            let t = Instant::now();
            let mut failed = 0u64;
            let mut slowest = Duration::ZERO;
            for _ in 0..3 {
                let calls = (0..8).map(|_| async {
                    let t = Instant::now();
                    (b.try_consume(1).await, t.elapsed())
                });
                for (r, took) in futures_util::future::join_all(calls).await {
                    assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
                    slowest = slowest.max(took);
                    failed += 1;
                }
            }
            let frozen_for = t.elapsed();
            // Resumed well after every deadline.
            tokio::time::sleep(Duration::from_millis(300)).await;
            server.signal("CONT");
            // Until the queued statements have run: the same balance twice, 300 ms apart.
            let key = b.key().as_str().to_owned();
            let mut last = None;
            let by = Instant::now() + Duration::from_secs(15);
            loop {
                let now = row(&raw, table, &key).await.map(|r| (tokens(&r.0), r.1));
                if now.is_some() && now == last {
                    break;
                }
                last = now;
                assert!(Instant::now() < by, "the server did not come back");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let lenient = ProxyManager::configure(backend)
                .time_source(time)
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            let after = lenient.builder().build(&name, config).unwrap();
            for _ in 0..5 {
                assert!(after.try_consume(1).await.unwrap());
                ok += 1;
            }
            let left = after.available_tokens().await.unwrap();
            println!(
                "fault: postgres frozen ({how}): {ok} calls succeeded, {failed} timed out \
                 (slowest {slowest:?}, frozen {frozen_for:?}); charged {} of 1000 tokens, \
                 expected {ok}",
                1_000 - left
            );
            assert_eq!(left, 1_000 - i64::try_from(ok).unwrap(), "{how}");
            let stored = row(&raw, table, &key).await.unwrap();
            assert_eq!(tokens(&stored.0), left, "{how}");
        }
    });
}

/// `pg_ctl stop -m immediate`, then a start on the same port: the first request after the
/// restart succeeds, and no token is charged twice.
/// A backend created while its server is down (initialised, not started): created at once,
/// its calls fail at once with a retryable `Unavailable`, and once the server starts (and the
/// table is made) the calls succeed with no restart of the application, charging exactly once.
#[test]
fn fault_postgres_backend_created_while_the_server_is_down_serves_once_it_starts() {
    let server = OwnPostgres::init();
    multi_thread().block_on(async {
        let t = Instant::now();
        let options = PostgresOptions::default().table("down").unwrap();
        let backend = PostgresBackend::connect(&server.url(), options)
            .await
            .expect("created while the server is down");
        let created = t.elapsed();
        let manager = ProxyManager::configure(backend.clone())
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        let mut slowest = Duration::ZERO;
        for _ in 0..5 {
            let t = Instant::now();
            let e = bucket4rs_distributed::Backend::read(&backend, b.key())
                .await
                .unwrap_err();
            slowest = slowest.max(t.elapsed());
            assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
            assert!(e.is_retryable(), "nothing was sent: {e}");
        }
        let r = b.try_consume(1).await;
        assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
        server.start();
        let started = Instant::now();
        super::answering(&backend, &server.url()).await; // and migrated
        let first = b.try_consume(1).await;
        let took = started.elapsed();
        println!(
            "fault: postgres created while down: created in {created:?}; calls failed in at most {slowest:?} (retryable Unavailable); first success {took:?} after the server started (its migration included): {first:?}"
        );
        assert!(first.unwrap());
        assert!(created < Duration::from_millis(100), "{created:?}");
        assert!(slowest < Duration::from_millis(100), "{slowest:?}");
        assert_eq!(b.available_tokens().await.unwrap(), 99);
    });
}

#[test]
fn fault_postgres_restart_first_request_succeeds_and_charges_once() {
    let server = started();
    let rt = multi_thread();
    rt.block_on(async {
        let table = "restart_first";
        let options = PostgresOptions::default()
            .connect_timeout(Duration::from_millis(300))
            .wait_timeout(Duration::from_millis(300));
        let (backend, _raw) = own_backend(&server, table, options).await;
        let timeout = Duration::from_millis(1_000);
        let manager = ProxyManager::configure(backend.clone())
            .timeout(timeout)
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000_000)))
            .unwrap();
        // Several pooled connections, all of which the restart breaks.
        let warm = (0..8).map(|_| b.try_consume(1));
        for r in futures_util::future::join_all(warm).await {
            assert!(r.unwrap());
        }
        let mut ok = 8;
        server.stop("immediate");
        server.start();
        let t = Instant::now();
        let first = b.try_consume(1).await;
        let took = t.elapsed();
        println!("fault: postgres restart: first request after restart {first:?} in {took:?}");
        assert!(first.as_ref().is_ok_and(|g| *g), "{first:?}");
        ok += 1;
        for _ in 0..10 {
            assert!(b.try_consume(1).await.unwrap());
            ok += 1;
        }
        let left = b.available_tokens().await.unwrap();
        println!(
            "fault: postgres restart: charged {} of 100, granted {ok}",
            100 - left
        );
        assert_eq!(left, 100 - ok);
    });
}

/// A row edited by hand without a new version: the compare-and-set compares the bytes as
/// well, so the call works from the row's real content instead of overwriting it from the
/// cache.
#[test]
fn fault_postgres_a_row_edited_without_a_new_version_is_read_not_overwritten() {
    let server = started();
    let rt = multi_thread();
    rt.block_on(async {
        let table = "edited";
        let (backend, raw) = own_backend(&server, table, PostgresOptions::default()).await;
        let clock = ManualClock::wall_clock(1_700_000_000_000_000_000);
        let manager = ProxyManager::configure(backend)
            .time_source(TimeSource::client(clock.clone()))
            .build()
            .unwrap();
        let config = || simple(10, Duration::from_secs(1_000_000));
        let a = manager.builder().build("a", config).unwrap();
        let other = manager.builder().build("b", config).unwrap();
        assert!(a.try_consume(1).await.unwrap()); // cached: 9 tokens
        assert!(other.try_consume(7).await.unwrap()); // 3 tokens, same instant
        let edited = row(&raw, table, other.key().as_str()).await.unwrap();
        let mut stored = row(&raw, table, a.key().as_str()).await.unwrap();
        stored.0 = edited.0.clone();
        put_row(&raw, table, a.key().as_str(), &stored).await; // same version, 3 tokens
        assert!(a.try_consume(1).await.unwrap());
        let left = a.available_tokens().await.unwrap();
        println!(
            "fault: postgres hand-edited row (3 tokens, same version): {left} left after one more"
        );
        assert_eq!(left, 2);
        let now = row(&raw, table, a.key().as_str()).await.unwrap();
        assert_eq!(now.1, stored.1 + 1);
        assert_eq!(tokens(&now.0), 2);
        // A read computed on the cache is confirmed on the bytes too: edited back to 3 tokens
        // without a new version, the bucket reads 3.
        let mut back = now.clone();
        back.0 = edited.0.clone();
        put_row(&raw, table, a.key().as_str(), &back).await;
        let read = a.available_tokens().await.unwrap();
        println!("fault: postgres hand-edited row read back: {read} tokens (edited to 3)");
        assert_eq!(read, 3);
    });
}

/// Issue 33's "Done when", on PostgreSQL: 4 clients (4 managers, each with a backend and pool
/// of its own, as 4 processes would have; the default circuit breaker) calling
/// `try_consume(1..=5)` on one key of a bucket that cannot run out (1,000,000 tokens, 1 back
/// per hour: every token gone is one a call took), while the server is stopped with
/// `pg_ctl stop -m immediate` and started again, three times. A call whose connection was cut
/// after its statement was sent is in doubt (its transaction may have committed); once the
/// server runs again and settlement has had its chance (every manager's next round trip for
/// the key, or a background task, within 5 s), the tokens gone must be exactly the tokens of
/// the calls that returned success, in every run (a key each). A stop catches a commit that
/// recovery keeps in about half the stops, so three runs of three stops.
#[test]
fn fault_postgres_immediate_stop_under_load_charges_only_successful_calls() {
    use crate::common::charged::{Tally, clients, round, settle};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    const CAPACITY: u64 = 1_000_000;
    const RUNS: usize = 3;
    const STOPS: usize = 3;
    // fsync on (the own clusters run without it): a commit then waits for its WAL flush, and
    // a stop that cuts the connection in that wait leaves a transaction that recovery finds
    // committed although its caller got an error, as on a production server. (With fsync off
    // the window is the few microseconds between the commit and its reply.)
    const DURABLE: &str = "-c fsync=on";
    let server = OwnPostgres::init();
    server.start_with(DURABLE);
    let rt = multi_thread();
    let table = "immediate_stop";
    let options = PostgresOptions::default()
        .connect_timeout(Duration::from_millis(300))
        .wait_timeout(Duration::from_millis(300));
    let managers: Vec<ProxyManager<PostgresBackend>> = rt.block_on(async {
        let mut managers = Vec::new();
        for _ in 0..4 {
            let (backend, _raw) = own_backend(&server, table, options.clone()).await;
            managers.push(
                ProxyManager::configure(backend)
                    .timeout(Duration::from_secs(1))
                    .build()
                    .unwrap(),
            );
        }
        managers
    });
    // 1 token per hour: within the test nothing comes back.
    let config = || simple(CAPACITY, Duration::from_secs(3_600 * CAPACITY));
    let mut runs: Vec<(Tally, u64)> = Vec::new();
    for run in 0..RUNS {
        let buckets: Vec<_> = managers
            .iter()
            .map(|m| m.builder().build(format!("hot-{run}"), config).unwrap())
            .collect();
        let mut tally = Tally::default();
        rt.block_on(round(
            &buckets,
            &mut tally,
            Instant::now() + Duration::from_secs(20),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let (load, downtime) = std::thread::scope(|s| {
            let killer = s.spawn(|| {
                let mut downtime = Vec::new();
                for _ in 0..STOPS {
                    // Under load for a while, then stopped mid-call.
                    std::thread::sleep(Duration::from_millis(800));
                    let t = Instant::now();
                    server.stop("immediate");
                    server.start_with(DURABLE);
                    downtime.push(t.elapsed());
                }
                // Under load once more after the last restart.
                std::thread::sleep(Duration::from_millis(800));
                stop.store(true, Ordering::Relaxed);
                downtime
            });
            let load = rt.block_on(clients(&buckets, &stop));
            (load, killer.join().expect("the killer"))
        });
        tally.add(load);
        let gone = rt.block_on(settle(
            &buckets,
            CAPACITY,
            &mut tally,
            Duration::from_secs(5),
        ));
        println!(
            "fault: postgres immediate stop: run {run}: {STOPS} stops under load (down {downtime:?}): {} calls ok, {} errors ({} in doubt), tokens gone {gone}, successful {}",
            tally.ok, tally.errors, tally.in_doubt, tally.tokens
        );
        runs.push((tally, gone));
    }
    // Not vacuous: calls failed while the server was down, and some were cut off in flight.
    for (run, (tally, _)) in runs.iter().enumerate() {
        assert!(tally.errors > 0, "run {run}: no call failed: {tally:?}");
        assert!(
            tally.in_doubt > 0,
            "run {run}: no call was in doubt: {tally:?}"
        );
    }
    let wrong: Vec<String> = runs
        .iter()
        .enumerate()
        .filter(|(_, (tally, gone))| *gone != tally.tokens)
        .map(|(run, (tally, gone))| {
            format!(
                "run {run}: {gone} tokens gone, {} successful ({} in doubt)",
                tally.tokens, tally.in_doubt
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {RUNS} runs charged tokens for calls that failed (or applied one twice): {}",
        wrong.len(),
        wrong.join("; ")
    );
}

/// Every byte of a stored record flipped, a byte appended, truncations: a record that no
/// longer decodes is a typed error and the row is untouched (bytes, version and expiry); one
/// that still decodes (a state byte: the checksum covers the configuration) is worked on as
/// stored, exactly as the core computes it. The version is never bumped by the corruption,
/// so a cached basis would otherwise hide it.
#[test]
fn fault_postgres_corrupt_rows_are_typed_errors_and_left_untouched() {
    let server = started();
    let rt = multi_thread();
    rt.block_on(async {
        let table = "corrupt";
        let (backend, raw) = own_backend(&server, table, PostgresOptions::default()).await;
        let at: i64 = 1_700_000_000_000_000_000;
        let clock = ManualClock::wall_clock(at);
        let manager = ProxyManager::configure(backend)
            .time_source(TimeSource::client(clock.clone()))
            .build()
            .unwrap();
        let config = BucketConfiguration::builder()
            .add_bandwidth(Bandwidth::simple(10, Duration::from_secs(10)).unwrap())
            .add_bandwidth(
                Bandwidth::builder()
                    .capacity(100)
                    .refill_greedy(100, Duration::from_secs(3_600))
                    .id("hourly")
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let supplied = config.clone();
        let b = manager
            .builder()
            .build("k", move || supplied.clone())
            .unwrap();
        assert!(b.try_consume(1).await.unwrap());
        let key = b.key().as_str().to_owned();
        let good = row(&raw, table, &key).await.unwrap();
        let len = good.0.len();
        let mut corruptions: Vec<(String, Vec<u8>)> = Vec::new();
        for i in 0..len {
            for mask in [0x01u8, 0xFF] {
                let mut bad = good.0.clone();
                bad[i] ^= mask;
                corruptions.push((format!("byte {i} ^ {mask:#04x}"), bad));
            }
        }
        let mut appended = good.0.clone();
        appended.push(0);
        corruptions.push(("a byte appended".into(), appended));
        for cut in [1, len / 2, len - 1] {
            corruptions.push((format!("truncated to {cut}"), good.0[..cut].to_vec()));
        }
        let (mut refused, mut worked) = (0, 0);
        for (what, bad) in &corruptions {
            let corrupt = (bad.clone(), good.1, good.2);
            put_row(&raw, table, &key, &corrupt).await;
            let r = b.try_consume(1).await;
            let after = row(&raw, table, &key).await.unwrap();
            match format::decode(bad) {
                Err(_) => {
                    assert!(
                        matches!(r, Err(DistributedError::Format(_))),
                        "{what}: {r:?}"
                    );
                    assert_eq!(after, corrupt, "{what}: the row changed");
                    refused += 1;
                }
                Ok(record) => {
                    let mut state = record.state.clone();
                    let expected = state.apply(&record.config, at, &TryConsume(1));
                    match expected {
                        Ok(granted) => {
                            assert_eq!(r.as_ref().ok(), Some(&granted), "{what}: {r:?}");
                        }
                        Err(_) => assert!(r.is_err(), "{what}: {r:?}"),
                    }
                    worked += 1;
                }
            }
            put_row(&raw, table, &key, &good).await;
        }
        println!(
            "fault: postgres corrupt rows: {} corruptions of a {len}-byte record: {refused} typed \
             errors with the row untouched, {worked} still-valid records worked on as stored",
            corruptions.len()
        );
        assert!(refused > len, "{refused}");
        // The row as it was: the bucket goes on from it.
        assert!(b.try_consume(1).await.unwrap());
        assert_eq!(b.available_tokens().await.unwrap(), 8);
    });
}

fn starts_empty(period: Duration) -> BucketConfiguration {
    BucketConfiguration::builder()
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(5)
                .refill_greedy(5, period)
                .initial_tokens(0)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

/// The scenario on the database clock, in real time: a plan whose buckets start empty
/// (capacity 5, 5 per 400 ms, initial 0). One request, wait past full, three requests, wait
/// past full plus the margin (and reap), five requests: all five granted. The row never
/// expires (`expires_at` NULL) and the reaper leaves it.
#[test]
fn fault_postgres_expiry_never_takes_tokens_from_a_bucket_that_starts_empty() {
    let server = started();
    let rt = multi_thread();
    rt.block_on(async {
        let table = "starts_empty";
        let (backend, raw) = own_backend(&server, table, PostgresOptions::default()).await;
        let manager = ProxyManager::configure(backend.clone())
            .ttl_margin(Duration::from_millis(100))
            .build()
            .unwrap();
        let period = Duration::from_millis(400);
        let b = manager
            .builder()
            .build("idle", move || starts_empty(period))
            .unwrap();
        assert!(!b.try_consume(1).await.unwrap());
        tokio::time::sleep(Duration::from_millis(500)).await;
        for _ in 0..3 {
            assert!(b.try_consume(1).await.unwrap());
        }
        let stored = row(&raw, table, b.key().as_str()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let reaped = backend.reap_expired(100).await.unwrap();
        let mut granted = 0;
        for _ in 0..5 {
            granted += u32::from(b.try_consume(1).await.unwrap());
        }
        println!(
            "fault: postgres expiry, initial 0: granted {granted} of 5 after idling full; \
             expires_at {:?}, reaped {reaped}",
            stored.2
        );
        assert_eq!(stored.2, None, "a record that starts empty got an expiry");
        assert_eq!(reaped, 0);
        assert_eq!(granted, 5);
    });
}

/// Client clock readings at the extremes (near `i64::MAX`, around 0, negative): each call
/// answers as the core does, the row's expiry is never in the past (NULL or later than
/// now), and the reaper leaves every used bucket.
#[test]
fn fault_postgres_expiry_is_total_at_the_extremes_of_the_clock() {
    let server = started();
    let rt = multi_thread();
    rt.block_on(async {
        let table = "extremes";
        let (backend, raw) = own_backend(&server, table, PostgresOptions::default()).await;
        let readings = [
            i64::MAX - 1,
            i64::MAX - 1_000_000_000,
            1,
            0,
            -1,
            -1_000_000_000_000_000_000,
            i64::MIN + 1,
        ];
        let mut buckets: Vec<(i64, RemoteBucket<PostgresBackend>, ManualClock)> = Vec::new();
        for (n, &start) in readings.iter().enumerate() {
            let clock = ManualClock::new(start);
            let manager = ProxyManager::configure(backend.clone())
                .time_source(TimeSource::client(clock.clone()))
                .build()
                .unwrap();
            let b = manager
                .builder()
                .build(format!("edge{n}"), || simple(10, Duration::from_secs(10)))
                .unwrap();
            assert!(b.try_consume(3).await.unwrap(), "{start}");
            clock.advance_nanos(1);
            assert_eq!(b.available_tokens().await.unwrap(), 7, "{start}");
            let stored = row(&raw, table, b.key().as_str()).await.unwrap();
            let now_us: i64 = raw
                .query_one("SELECT (extract(epoch FROM now()) * 1000000)::int8", &[])
                .await
                .unwrap()
                .get(0);
            assert!(
                stored.2.is_none_or(|e| e > now_us),
                "{start}: expires {:?}",
                stored.2
            );
            buckets.push((start, b, clock));
        }
        assert_eq!(backend.reap_expired(100).await.unwrap(), 0);
        for (start, b, _clock) in &buckets {
            assert!(b.try_consume(1).await.unwrap(), "{start}");
            assert_eq!(b.available_tokens().await.unwrap(), 6, "{start}");
        }
        println!(
            "fault: postgres clock extremes: {} readings from i64::MIN+1 to i64::MAX-1 answered \
             as the core, none reaped",
            readings.len()
        );
    });
}

/// A transaction that writes fixed bytes, with a deadline of its own.
struct Late {
    record: Vec<u8>,
    deadline: Instant,
    applied: u32,
}

impl bucket4rs_distributed::Transaction for Late {
    fn command(&self) -> bucket4rs_distributed::Command {
        bucket4rs_distributed::Command::TryConsume(1)
    }
    fn needs_backend_clock(&self) -> bool {
        false
    }
    fn client_now(&self) -> Option<i64> {
        Some(0)
    }
    fn ttl_margin(&self) -> Duration {
        Duration::ZERO
    }
    fn deadline(&self) -> Option<Instant> {
        Some(self.deadline)
    }
    fn apply(&mut self, _: Option<&[u8]>, _: Option<i64>) -> bucket4rs_distributed::Write {
        self.applied += 1;
        bucket4rs_distributed::Write::Put {
            record: self.record.clone(),
            ttl: None,
        }
    }
}

/// A write that reaches PostgreSQL after its deadline writes nothing, on every path: the
/// one-statement `INSERT` and `UPDATE` and the locking fallback's (whose `COMMIT` follows in
/// the same pipeline). The same writes in time go through.
#[test]
fn fault_postgres_a_write_past_its_deadline_changes_nothing_on_every_path() {
    use bucket4rs_distributed::{Backend, BackendErrorKind};
    let server = started();
    let rt = multi_thread();
    rt.block_on(async {
        let table = "deadline";
        let mut refused = 0;
        for rounds in [2, 0] {
            let options = PostgresOptions::default().optimistic_rounds(rounds);
            let (backend, raw) = own_backend(&server, table, options).await;
            let manager = ProxyManager::new(backend.clone());
            let b = manager
                .builder()
                .build(format!("r{rounds}"), || simple(10, Duration::from_secs(10)))
                .unwrap();
            let key = b.key().clone();
            let config = simple(10, Duration::from_secs(10));
            let bytes = |tokens: i64| {
                let state = bucket4rs_core::BucketState::from_bandwidths(vec![
                    bucket4rs_core::BandwidthState::from_parts(0, tokens, 0),
                ]);
                format::encode(&config, &state)
            };
            // Absent key, then a present one (the cached basis is the row just written).
            for (tokens, before) in [(7, None), (3, Some(bytes(5)))] {
                if let Some(present) = &before {
                    let mut on_time = Late {
                        record: present.clone(),
                        deadline: Instant::now() + Duration::from_secs(5),
                        applied: 0,
                    };
                    backend.transact(&key, &mut on_time).await.unwrap();
                }
                let was = row(&raw, table, key.as_str()).await;
                let mut late = Late {
                    record: bytes(tokens),
                    // Already past: the statement arrives after it however fast it is.
                    deadline: Instant::now() - Duration::from_millis(1),
                    applied: 0,
                };
                let r = backend.transact(&key, &mut late).await;
                assert!(
                    r.as_ref()
                        .is_err_and(|e| e.kind() == BackendErrorKind::Timeout),
                    "rounds {rounds}: {r:?}"
                );
                assert!(late.applied >= 1);
                assert_eq!(row(&raw, table, key.as_str()).await, was, "rounds {rounds}");
                refused += 1;
                let mut in_time = Late {
                    record: bytes(tokens),
                    deadline: Instant::now() + Duration::from_secs(5),
                    applied: 0,
                };
                backend.transact(&key, &mut in_time).await.unwrap();
                let now = row(&raw, table, key.as_str()).await.unwrap();
                assert_eq!(now.0, bytes(tokens), "rounds {rounds}");
            }
        }
        println!(
            "fault: postgres writes past their deadline: {refused} of 4 refused, rows unchanged"
        );
    });
}
