//! The boundary differential of the Lua script's arithmetic (issue 33): clock readings and
//! last refills at the edges of the range doubles hold exactly, through Redis and through the
//! core, with equal answers, equal stored bytes and the core's expiry; on a client clock
//! (readings around ±2^53 ns, ±2^32 around them, the clock's extremes) and on the server's
//! clock (last refills 2^53 ns and around before and after its `TIME`).

use std::time::Duration;

use bucket4rs_core::{BucketConfiguration, BucketState, ManualClock};
use bucket4rs_distributed::{ProxyManager, RedisBackend, RemoteBucket, TimeSource, format};
use redis::AsyncCommands;

use crate::common::{
    RandomOp, boundary, core_result, remote_result, remote_verbose_result, runtime, unique_prefix,
};
use crate::redis::{MARGIN, SENTINEL_MS, backend, expected_pttl, raw};

/// What differs between the remote bucket and the core after `op` at `now`, if anything:
/// the answer, the stored bytes or the expiry (a write sets the core's; a sentinel expiry
/// still there means nothing was written, which only the core's unchanged bytes allow).
async fn compare(
    raw: &mut redis::aio::MultiplexedConnection,
    key: &str,
    config: &BucketConfiguration,
    state: &BucketState,
    before: &[u8],
    (got, expected): (&str, &str),
    now: i64,
) -> Option<String> {
    if got != expected {
        return Some(format!("answered {got}, the core {expected}"));
    }
    let stored: Vec<u8> = raw.get(key).await.unwrap();
    let same = format::decode(&stored).is_ok_and(|r| r.config == *config && r.state == *state);
    if !same {
        let found = format::decode(&stored).map(|r| r.state);
        return Some(format!("stored {found:?}, the core {state:?}"));
    }
    let pttl: i64 = raw.pttl(key).await.unwrap();
    let untouched = (SENTINEL_MS - 5_000..=SENTINEL_MS).contains(&pttl);
    if stored != before || !untouched {
        let want = expected_pttl(config, state, now);
        let fits = if want == -1 {
            pttl == -1
        } else {
            (want - 5_000..=want).contains(&pttl)
        };
        if !fits {
            return Some(format!("PTTL {pttl}, the core's {want}"));
        }
    }
    let _: () = raw.pexpire(key, SENTINEL_MS).await.unwrap();
    None
}

async fn seed(
    raw: &mut redis::aio::MultiplexedConnection,
    bucket: &RemoteBucket<RedisBackend>,
    config: &BucketConfiguration,
    state: &BucketState,
) {
    let key = bucket.key().as_str();
    let _: () = raw.set(key, format::encode(config, state)).await.unwrap();
    let _: () = raw.pexpire(key, SENTINEL_MS).await.unwrap();
}

/// The issue's reproduction: 10 tokens, one a second; consume 1, add 1 at 0; the client
/// clock at 2^53 + 1 ns: `try_consume(1)` succeeds, as the core does, and stores the core's
/// state (the script used to write L = 2^53, the client rejected it as `Inconsistent` and
/// the token was charged anyway).
#[test]
fn the_issue_case_at_two_to_the_53_plus_one_is_the_cores() {
    runtime().block_on(async {
        let backend = backend().await;
        let mut raw = raw().await;
        let clock = ManualClock::new(0);
        let manager = ProxyManager::configure(backend)
            .key_prefix(unique_prefix("issue33"))
            .time_source(TimeSource::client(clock.clone()))
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let config = boundary::configs().remove(0);
        let c2 = config.clone();
        let b = manager.builder().build("k", move || c2.clone()).unwrap();
        assert!(b.try_consume(1).await.unwrap());
        b.add_tokens(1).await.unwrap();
        clock.set_nanos((1 << 53) + 1);
        assert!(b.try_consume(1).await.unwrap());
        let mut state = BucketState::new(&config, 0);
        for (now, op) in [
            (0, RandomOp::TryConsume(1)),
            (0, RandomOp::Add(1)),
            ((1 << 53) + 1, RandomOp::TryConsume(1)),
        ] {
            core_result(op, &config, &mut state, now);
        }
        let stored: Vec<u8> = raw.get(b.key().as_str()).await.unwrap();
        let record = format::decode(&stored).unwrap();
        assert_eq!(
            (record.config, record.state),
            (config.clone(), state.clone())
        );
        assert_eq!(b.available_tokens().await.unwrap(), 9);
    });
}

#[test]
fn boundary_readings_on_a_client_clock_match_the_core() {
    runtime().block_on(async {
        let backend = backend().await;
        let mut raw = raw().await;
        let prefix = unique_prefix("boundary-client");
        let cases = boundary::cases();
        let mut failures = Vec::new();
        for (i, case) in cases.iter().enumerate() {
            let manager = ProxyManager::configure(backend.clone())
                .key_prefix(prefix.as_str())
                .time_source(TimeSource::client(ManualClock::new(case.now)))
                .ttl_margin(MARGIN)
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap();
            let c2 = case.config.clone();
            let bucket = manager
                .builder()
                .build(format!("k{i}"), move || c2.clone())
                .unwrap();
            seed(&mut raw, &bucket, &case.config, &case.state).await;
            let key = bucket.key().as_str();
            let mut state = case.state.clone();
            for op in case.ops {
                let before: Vec<u8> = raw.get(key).await.unwrap();
                let expected = core_result(op, &case.config, &mut state, case.now);
                let got = remote_result(op, &bucket).await;
                let answers = (got.as_str(), expected.as_str());
                if let Some(why) = compare(
                    &mut raw,
                    key,
                    &case.config,
                    &state,
                    &before,
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
        let stats = backend.stats();
        println!("boundary (client clock): {} cases, {stats:?}", cases.len());
        boundary::report(&failures, cases.len());
        // Both paths were taken: the script where it is exact, the client where it is not.
        assert!(stats.fast_path > 0 && stats.exact_path > 0, "{stats:?}");
    });
}

#[test]
fn boundary_distances_on_the_server_clock_match_the_core() {
    runtime().block_on(async {
        let backend = backend().await;
        let mut raw = raw().await;
        // The default time source: the server's TIME.
        let manager = ProxyManager::configure(backend.clone())
            .key_prefix(unique_prefix("boundary-server"))
            .ttl_margin(MARGIN)
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let ops = boundary::ops();
        let mut failures = Vec::new();
        let mut n = 0usize;
        for d in boundary::distances() {
            for (c, config) in boundary::configs().into_iter().enumerate() {
                for variant in 0..4 {
                    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
                    let server_now = s * 1_000_000_000 + us * 1_000;
                    let Some(last_refill) = server_now.checked_sub(d) else {
                        continue;
                    };
                    n += 1;
                    let mut state = boundary::state(&config, last_refill, variant);
                    let c2 = config.clone();
                    let bucket = manager
                        .builder()
                        .build(format!("k{n}"), move || c2.clone())
                        .unwrap();
                    seed(&mut raw, &bucket, &config, &state).await;
                    let key = bucket.key().as_str();
                    let verbose = bucket.as_verbose();
                    let pair = [ops[n % ops.len()], ops[(n / ops.len() + c) % ops.len()]];
                    for op in pair {
                        let before: Vec<u8> = raw.get(key).await.unwrap();
                        let (got, now) = remote_verbose_result(op, &verbose).await;
                        // The reading the script computed at (an error carries none: the
                        // reading just before the call, at which the core must err too).
                        let now = now.unwrap_or(server_now);
                        let expected = core_result(op, &config, &mut state, now);
                        let answers = (got.as_str(), expected.as_str());
                        if let Some(why) =
                            compare(&mut raw, key, &config, &state, &before, answers, now).await
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
        let stats = backend.stats();
        println!("boundary (server clock): {n} cases, {stats:?}");
        boundary::report(&failures, n);
        assert!(stats.fast_path > 0 && stats.exact_path > 0, "{stats:?}");
    });
}
