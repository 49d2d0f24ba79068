//! The Redis backend against a real Redis (`BUCKET4RS_REDIS_URL`, default
//! `redis://127.0.0.1:6379`). An unreachable Redis fails these tests loudly.

use std::time::{Duration, Instant};

use bucket4rs_core::{BucketState, Clock, ManualClock};
use bucket4rs_distributed::{
    DistributedError, FormatError, ProxyManager, RedisBackend, RedisOptions, TimeSource, format,
};
use rand::Rng;
use redis::AsyncCommands;

use crate::common::{
    RandomOp, concurrent_and_core, core_result, drain_after_restart,
    dropped_waits_give_back_what_they_reserved, epoch_ms, hammer_hot_key, patient, random_config,
    random_op, remote_result, reported, run_children, runtime, simple, unique_prefix,
};
use crate::redis_faults::OwnRedis;

pub(crate) fn url() -> String {
    std::env::var("BUCKET4RS_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

async fn backend_at(url: &str) -> RedisBackend {
    RedisBackend::connect(url, RedisOptions::default())
        .await
        .unwrap_or_else(|e| panic!("Redis at {url} is required for these tests: {e}"))
}

pub(crate) async fn backend() -> RedisBackend {
    backend_at(&url()).await
}

pub(crate) async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis at {} is required: {e}", url()))
}

/// Waiting calls dropped mid-wait give their reservation back on Redis too (the refund is an
/// `add_tokens` round trip of its own; the reservations go through batching).
#[test]
fn redis_dropped_waits_give_back_what_they_reserved() {
    runtime().block_on(async {
        let took = dropped_waits_give_back_what_they_reserved(
            backend().await,
            &unique_prefix("dropped-waits"),
        )
        .await;
        println!("redis: dropped waits' refunds landed within {took:?}");
    });
}

/// A random configuration's bucket whose Redis record is a random valid state (reached through
/// the core: a random start, then up to 3 random operations), on a manager whose manual client
/// clock reads the last operation's time plus `later`.
struct Seeded {
    config: bucket4rs_core::BucketConfiguration,
    state: BucketState,
    clock: ManualClock,
    bucket: bucket4rs_distributed::RemoteBucket<RedisBackend>,
}

async fn seeded(
    rng: &mut impl Rng,
    backend: &RedisBackend,
    raw: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    case: u64,
    later: i64,
) -> Seeded {
    let config = random_config(rng);
    let t0: i64 = rng.random_range(-1_000_000_000_000..=2_000_000_000_000_000_000);
    let mut state = BucketState::new(&config, t0);
    let mut now = t0;
    for _ in 0..rng.random_range(0..4) {
        now += rng.random_range(-1_000..=5_000_000_000);
        let _ = core_result(random_op(rng), &config, &mut state, now);
    }
    let clock = ManualClock::new(now + later);
    let manager = ProxyManager::configure(backend.clone())
        .key_prefix(prefix)
        .time_source(TimeSource::client(clock.clone()))
        .ttl_margin(MARGIN)
        .build()
        .unwrap();
    let c2 = config.clone();
    let bucket = manager
        .builder()
        .build(format!("k{case}"), move || c2.clone())
        .unwrap();
    let _: () = raw
        .set(bucket.key().as_str(), format::encode(&config, &state))
        .await
        .unwrap();
    Seeded {
        config,
        state,
        clock,
        bucket,
    }
}

/// An expiry no write sets: a key that still has it was not written.
pub(crate) const SENTINEL_MS: i64 = 3_000_000_000_000;

/// The TTL margin of the cross-checks (with a part below a millisecond, which both paths
/// round up the same way).
pub(crate) const MARGIN: Duration = Duration::from_nanos(1_500_000_300);

/// The PTTL a write of `state` at `now` must leave: the core's `forgettable_at` plus the
/// margin, rounded up to milliseconds; -1 (no expiry) when the state is never forgettable.
pub(crate) fn expected_pttl(
    config: &bucket4rs_core::BucketConfiguration,
    state: &BucketState,
    now: i64,
) -> i64 {
    match state.forgettable_at(config, now) {
        None => -1,
        Some(at) => {
            let ns = u128::try_from(i128::from(at) - i128::from(now)).unwrap() + MARGIN.as_nanos();
            let ms = ns.div_ceil(1_000_000).max(1);
            if ms >= 4_000_000_000_000_000 {
                -1
            } else {
                ms as i64
            }
        }
    }
}

#[test]
fn lua_fast_path_is_byte_identical_to_the_core_on_random_states() {
    let rt = runtime();
    rt.block_on(async {
        let backend = backend().await;
        let mut raw = raw().await;
        let prefix = unique_prefix("random");
        let mut rng = rand::rng();
        let cases = 1_500;
        let (mut ttls_checked, mut no_expiry) = (0u64, 0u64);
        for case in 0..cases {
            let Seeded {
                config,
                mut state,
                clock,
                bucket,
            } = seeded(&mut rng, &backend, &mut raw, &prefix, case, 0).await;
            for _ in 0..3 {
                let step = if rng.random_bool(0.5) {
                    rng.random_range(0..=2_000_000_000)
                } else {
                    rng.random_range(-10..=10)
                };
                clock.advance_nanos(step);
                let key = bucket.key().as_str();
                // A sentinel expiry: a write replaces it with its own.
                let _: () = raw.pexpire(key, SENTINEL_MS).await.unwrap();
                let before: Vec<u8> = raw.get(key).await.unwrap();
                let op = random_op(&mut rng);
                let expected = core_result(op, &config, &mut state, clock.now_nanos());
                let got = remote_result(op, &bucket).await;
                assert_eq!(got, expected, "case {case}: {op:?} on {config:?}");
                let stored: Vec<u8> = raw.get(key).await.unwrap();
                let record = format::decode(&stored).unwrap();
                assert_eq!(
                    (record.config, record.state),
                    (config.clone(), state.clone()),
                    "case {case}: {op:?}"
                );
                // Whichever path wrote (the script, or the client's compare-and-set), the
                // expiry is the core's.
                let pttl: i64 = raw.pttl(key).await.unwrap();
                let untouched = (SENTINEL_MS - 5_000..=SENTINEL_MS).contains(&pttl);
                if stored != before || !untouched {
                    let want = expected_pttl(&config, &state, clock.now_nanos());
                    let fits = if want == -1 {
                        pttl == -1
                    } else {
                        (want - 5_000..=want).contains(&pttl)
                    };
                    assert!(fits, "case {case}: {op:?} on {config:?}: PTTL {pttl}, expected {want}");
                    ttls_checked += 1;
                    no_expiry += u64::from(want == -1);
                }
            }
        }
        let stats = backend.stats();
        println!(
            "random cross-check stats: {stats:?}; {ttls_checked} writes' PTTL checked ({no_expiry} without expiry)"
        );
        assert!(ttls_checked > cases && no_expiry > 0 && no_expiry < ttls_checked);
        assert!(
            stats.fast_path > 3 * cases * 7 / 10,
            "the fast path was rarely taken: {stats:?}"
        );
        assert!(stats.exact_path > 0, "{stats:?}");
    });
}

/// Batches (several queued operations of one key in one `EVALSHA`, the script looping over
/// them) give every caller the core's sequential result and store the core's bytes.
#[test]
fn lua_batches_are_byte_identical_to_the_core_applied_in_order() {
    let rt = runtime();
    rt.block_on(async {
        let backend = backend().await;
        let mut raw = raw().await;
        let prefix = unique_prefix("batch");
        let mut rng = rand::rng();
        let cases = 400;
        let mut ops_sent = 0u64;
        let mut ttls_checked = 0u64;
        let before = backend.stats();
        for case in 0..cases {
            let later = rng.random_range(0..=2_000_000_000);
            let Seeded {
                config,
                mut state,
                clock,
                bucket,
            } = seeded(&mut rng, &backend, &mut raw, &prefix, case, later).await;
            let now = clock.now_nanos();
            // The first goes alone; the others queue behind it and go as one batch.
            let ops: Vec<RandomOp> = (0..rng.random_range(2..=9))
                .map(|_| random_op(&mut rng))
                .collect();
            ops_sent += ops.len() as u64;
            let key = bucket.key().as_str();
            let _: () = raw.pexpire(key, SENTINEL_MS).await.unwrap();
            let before: Vec<u8> = raw.get(key).await.unwrap();
            let (got, expected) =
                concurrent_and_core(&ops, &bucket, &config, &mut state, now).await;
            assert_eq!(got, expected, "case {case}: {ops:?} on {config:?}");
            let stored: Vec<u8> = raw.get(key).await.unwrap();
            let record = format::decode(&stored).unwrap();
            assert_eq!(
                (record.config, record.state),
                (config.clone(), state.clone()),
                "case {case}: {ops:?}"
            );
            // Every operation ran at `now`: whichever transaction wrote last, the expiry is
            // the core's for the final state.
            let pttl: i64 = raw.pttl(key).await.unwrap();
            if stored != before || !(SENTINEL_MS - 5_000..=SENTINEL_MS).contains(&pttl) {
                let want = expected_pttl(&config, &state, now);
                let fits = if want == -1 {
                    pttl == -1
                } else {
                    (want - 5_000..=want).contains(&pttl)
                };
                assert!(fits, "case {case}: {ops:?} on {config:?}: PTTL {pttl}, expected {want}");
                ttls_checked += 1;
            }
        }
        let stats = backend.stats();
        let trips = stats.round_trips - before.round_trips;
        let fast = stats.fast_path - before.fast_path;
        println!(
            "batch cross-check: {ops_sent} operations, {trips} round trips, {ttls_checked} PTTLs checked, {stats:?}"
        );
        assert!(ttls_checked > cases / 2, "{ttls_checked}");
        // Two transactions per case (the lone first operation, then the batch); the exact
        // path adds a compare-and-set round trip when a value is out of the script's range.
        assert!(
            trips < ops_sent * 2 / 3,
            "{trips} round trips for {ops_sent} operations"
        );
        assert!(
            fast > cases * 2 * 7 / 10,
            "the batch script was rarely taken: {stats:?}"
        );
    });
}

const CHILD_ENV: &str = "BUCKET4RS_TEST_CHILD_KEY";

#[test]
fn four_processes_share_one_key_and_grant_exactly_its_tokens() {
    let config = || simple(5_000, Duration::from_secs(1_000_000)); // no refill in the window
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        // Child process: 4 tasks × 1000 attempts, then report.
        let (prefix, start_ms) = spec.split_once('|').unwrap();
        let start_ms: u128 = start_ms.parse().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let granted: u64 = rt.block_on(async {
            // Exactness and progress are checked, not latency: 16 tasks in 4 processes on one
            // key of a shared server, on a loaded machine, get patient timeouts.
            let options = RedisOptions::default().response_timeout(Duration::from_secs(5));
            let backend = RedisBackend::connect(&url(), options)
                .await
                .unwrap_or_else(|e| panic!("Redis at {} is required: {e}", url()));
            let manager = ProxyManager::configure(backend)
                .key_prefix(prefix)
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap();
            hammer_hot_key(&manager, config, start_ms).await
        });
        println!("GRANTED {granted}");
        return;
    }
    let prefix = unique_prefix("procs");
    let rt = runtime();
    let manager = rt.block_on(async {
        ProxyManager::configure(backend().await)
            .key_prefix(prefix.as_str())
            .build()
            .unwrap()
    });
    let bucket = manager.builder().build("hot", config).unwrap();
    assert_eq!(rt.block_on(bucket.available_tokens()).unwrap(), 5_000);
    let start_ms = epoch_ms() + 700;
    let outputs = run_children(
        "redis::four_processes_share_one_key_and_grant_exactly_its_tokens",
        CHILD_ENV,
        &format!("{prefix}|{start_ms}"),
    );
    let per_child: Vec<u64> = outputs
        .iter()
        .map(|text| reported(text, "GRANTED ").parse().unwrap())
        .collect();
    let total: u64 = per_child.iter().sum();
    println!("granted per process: {per_child:?}");
    assert_eq!(total, 5_000, "per process: {per_child:?}");
    assert_eq!(rt.block_on(bucket.available_tokens()).unwrap(), 0);
}

#[test]
fn script_flush_mid_run_is_invisible_to_callers() {
    let rt = runtime();
    rt.block_on(async {
        let backend = backend().await;
        let mut raw = raw().await;
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(unique_prefix("flush").as_str())
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(1_000, Duration::from_secs(1_000_000)))
            .unwrap();
        let mut granted = 0;
        for i in 0..300 {
            if i % 50 == 25 {
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query_async(&mut raw)
                    .await
                    .unwrap();
            }
            if b.try_consume(1).await.unwrap() {
                granted += 1;
            }
        }
        assert_eq!(granted, 300);
        assert_eq!(b.available_tokens().await.unwrap(), 700);
        // Each of the 6 flushes makes the next EVALSHA of *some* client fail with NOSCRIPT;
        // tests running in parallel share the server's script cache, so another client may
        // reload first. At least one reload must have been ours, or the flushes went unseen.
        assert!(backend.stats().script_reloads >= 1, "{:?}", backend.stats());
    });
}

#[test]
fn keys_expire_when_full_again_plus_the_margin() {
    let rt = runtime();
    rt.block_on(async {
        let mut raw = raw().await;
        // A stopped client clock: both writes happen at one instant, so each TTL is exact
        // and the checks below only allow for the time until `PTTL` reads it (up to 1 s).
        let manager = ProxyManager::configure(backend().await)
            .key_prefix(unique_prefix("ttl").as_str())
            .ttl_margin(Duration::from_millis(2_000))
            .time_source(TimeSource::client(ManualClock::new(
                1_700_000_000_000_000_000,
            )))
            .build()
            .unwrap();
        // 1 token per second: 3 consumed → full again after 3 s.
        let b = manager
            .builder()
            .build("k", || simple(10, Duration::from_secs(10)))
            .unwrap();
        assert!(b.try_consume(3).await.unwrap());
        let pttl: i64 = raw.pttl(b.key().as_str()).await.unwrap();
        assert!((4_000..=5_000).contains(&pttl), "PTTL {pttl}");
        // An exact-path write (replacement) sets the TTL as well.
        b.replace_configuration(
            simple(10, Duration::from_secs(100)),
            bucket4rs_core::TokensInheritanceStrategy::AsIs,
        )
        .await
        .unwrap();
        // 3 missing tokens at 0.1 per second: 30 s, plus the margin.
        let pttl: i64 = raw.pttl(b.key().as_str()).await.unwrap();
        assert!((31_000..=32_000).contains(&pttl), "PTTL {pttl}");
    });
}

/// A key holding another Redis type (a list) is a typed error naming the type, never
/// overwritten. (Text, damaged and future-version records: the kit's `corrupt_records` and
/// `foreign_records`, in `redis_kit.rs`.)
#[test]
fn a_key_of_another_redis_type_is_a_typed_error() {
    let rt = runtime();
    rt.block_on(async {
        let mut raw = raw().await;
        let manager = ProxyManager::configure(backend().await)
            .key_prefix(unique_prefix("corrupt").as_str())
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(10, Duration::from_secs(10)))
            .unwrap();
        let key = b.key().as_str().to_owned();
        let _: () = raw.lpush(&key, "x").await.unwrap();
        match b.try_consume(1).await {
            Err(DistributedError::Format(FormatError::WrongType { found })) => {
                assert_eq!(found, "list")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            b.configuration().await,
            Err(DistributedError::Format(FormatError::WrongType { .. }))
        ));
        let kept: Vec<String> = raw.lrange(&key, 0, -1).await.unwrap();
        assert_eq!(kept, ["x"], "the list was changed");
        let _: () = raw.del(&key).await.unwrap();
    });
}

#[test]
fn fault_redis_outage_errors_within_the_timeout_and_resumes_without_granting_twice() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut server = OwnRedis::start(None, None);
    let timeout = Duration::from_millis(300);
    rt.block_on(async {
        // The short timeouts are for the outage below. The first connection, to a server
        // that has just started while other tests load the machine, is retried (CI once
        // saw it take longer than the 800 ms connect budget).
        let deadline = Instant::now() + Duration::from_secs(20);
        let backend = loop {
            let options = RedisOptions::default()
                .response_timeout(Duration::from_millis(200))
                .connect_timeout(Duration::from_millis(200));
            match RedisBackend::connect(&server.url(), options).await {
                Ok(b) => break b,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "own redis-server did not answer: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let manager = ProxyManager::configure(backend)
            .timeout(timeout)
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        // The consumptions before the outage must all succeed: a client with the default
        // timeouts takes them (a loaded machine can delay an answer past 200 ms).
        let lenient = RedisBackend::connect(&server.url(), RedisOptions::default())
            .await
            .expect("own redis-server answers");
        let lenient = patient(lenient);
        let sure = lenient
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        let mut granted = 0;
        for _ in 0..40 {
            assert!(sure.try_consume(1).await.unwrap());
            granted += 1;
        }
        server.kill();
        for _ in 0..10 {
            let t = Instant::now();
            let r = b.try_consume(1).await;
            let took = t.elapsed();
            assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
            // Bounded by the call's timeout (the server stays down): slack for a loaded machine.
            assert!(took <= timeout + Duration::from_secs(1), "took {took:?}");
        }
        let restarted = OwnRedis::start(Some(server.port), Some(server.dir.clone()));
        // Service resumes (the connection manager reconnects), with the state kept.
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(server.url()).unwrap();
        let key = b.key().as_str().to_owned();
        let stored = || {
            let (client, key) = (client.clone(), key.clone());
            async move {
                let budget = Duration::from_millis(500);
                let connect = client.get_multiplexed_async_connection();
                let mut c = tokio::time::timeout(budget, connect).await.ok()?.ok()?;
                tokio::time::timeout(budget, c.get(&key)).await.ok()?.ok()
            }
        };
        drain_after_restart(&b, 100, granted, deadline, stored).await;
        drop(restarted);
    });
}

/// Created against a port nobody listens on: creation succeeds at once, and every call fails
/// at once with a retryable `Unavailable` (nothing was sent), so a start-up loop keyed on
/// `is_retryable()` keeps trying (before, `connect` failed after 0.8 ms with a non-retryable
/// `Timeout`, "could not connect to Redis within 1s").
#[test]
fn an_unreachable_redis_is_created_and_its_calls_fail_fast_and_retryably() {
    let rt = runtime();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    rt.block_on(async {
        let t = Instant::now();
        let backend = RedisBackend::connect(
            &format!("redis://127.0.0.1:{port}"),
            RedisOptions::default(),
        )
        .await
        .expect("creation does not wait for the server");
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
        let manager = ProxyManager::new(backend.clone());
        let key = manager.storage_key("k").unwrap();
        for _ in 0..5 {
            let t = Instant::now();
            let e = bucket4rs_distributed::Backend::read(&backend, &key)
                .await
                .unwrap_err();
            assert_eq!(
                e.kind(),
                bucket4rs_distributed::BackendErrorKind::Unavailable,
                "{e}"
            );
            assert!(e.is_retryable(), "nothing was sent: {e}");
            assert!(
                t.elapsed() < Duration::from_millis(100),
                "{:?}",
                t.elapsed()
            );
        }
    });
}

/// The application's own `redis::Client` (here with the database in the URL): the backend
/// uses its settings and keeps its limits exactly.
#[test]
fn a_backend_on_the_applications_own_client_keeps_its_limits() {
    let rt = runtime();
    rt.block_on(async {
        let client = redis::Client::open(url()).unwrap();
        let backend = RedisBackend::with_client(client, RedisOptions::default()).unwrap();
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(unique_prefix("own-client"))
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(3, Duration::from_secs(3_600)))
            .unwrap();
        let granted = [
            b.try_consume(1).await.unwrap(),
            b.try_consume(1).await.unwrap(),
            b.try_consume(1).await.unwrap(),
            b.try_consume(1).await.unwrap(),
        ];
        assert_eq!(granted, [true, true, true, false]);
        let mut raw = raw().await;
        let stored: Option<Vec<u8>> = raw.get(b.key().as_str()).await.unwrap();
        assert!(stored.is_some_and(|r| format::decode(&r).is_ok()));
        assert!(manager.remove("k").await.unwrap());
    });
}

/// The ledger of several managers on one key (one entry each, levels that caps and adds
/// move, entries forgotten below each owner's floor) is kept by the script exactly as the core
/// keeps it: the backend checks every fast-path write byte for byte (an `Inconsistent` error
/// otherwise), and every answer is the core's.
#[test]
fn lua_ledger_of_several_managers_is_the_cores() {
    runtime().block_on(async {
        let mut rng = rand::rng();
        let prefix = unique_prefix("ledger");
        let mut fast = 0;
        for case in 0..40 {
            let config = random_config(&mut rng);
            let clock = ManualClock::new(rng.random_range(0..=1i64 << 40));
            let mut managers = Vec::new();
            for _ in 0..rng.random_range(2..=6) {
                let backend = backend().await;
                managers.push((
                    backend.clone(),
                    ProxyManager::configure(backend)
                        .key_prefix(&prefix)
                        .time_source(TimeSource::client(clock.clone()))
                        .build()
                        .unwrap(),
                ));
            }
            let key = format!("k{case}");
            let mut state: Option<BucketState> = None;
            for step in 0..30 {
                clock.advance_nanos(if rng.random_bool(0.5) {
                    rng.random_range(0..=3_000_000_000)
                } else {
                    rng.random_range(0..=10)
                });
                let (backend, manager) = &managers[rng.random_range(0..managers.len())];
                let c = config.clone();
                let bucket = manager
                    .builder()
                    .build(key.clone(), move || c.clone())
                    .unwrap();
                let now = clock.now_nanos();
                let created = state.is_none();
                let s = state.get_or_insert_with(|| BucketState::new(&config, now));
                let op = random_op(&mut rng);
                let expected = core_result(op, &config, s, now);
                // A failed first call creates no bucket: the next call does, at its own
                // reading (which moves an interval bandwidth's refill grid).
                if created && expected.starts_with("error: ") {
                    state = None;
                }
                let fast_before = backend.stats().fast_path;
                let got = remote_result(op, &bucket).await;
                assert_eq!(
                    got, expected,
                    "case {case} step {step}: {op:?} on {config:?}"
                );
                fast += backend.stats().fast_path - fast_before;
            }
        }
        assert!(fast > 200, "the script ran {fast} of the writes");
    });
}
