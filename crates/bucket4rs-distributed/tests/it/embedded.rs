//! The embedded backend: conformance, concurrency, expiry as asked and the key cap.

use std::sync::Arc;
use std::time::Duration;

use bucket4rs_core::{Bandwidth, BucketConfiguration, Clock, ManualClock};
use bucket4rs_distributed::{
    Backend, BackendErrorKind, DistributedError, EmbeddedBackend, ProxyManager, TimeSource,
};

use crate::common::{self, runtime, simple};

/// Every promise of the backend trait, through the public kit, on one store shared by all of
/// its clients.
#[test]
fn the_embedded_backend_replays_the_backend_kit() {
    let store = Arc::new(EmbeddedBackend::new());
    bucket4rs_testkit::BackendKit::new("embedded", move || {
        let store = Arc::clone(&store);
        async move { Ok::<_, String>(store) }
    })
    .run();
}

fn manual(clock: &ManualClock, backend: EmbeddedBackend) -> ProxyManager<EmbeddedBackend> {
    ProxyManager::configure(backend)
        .time_source(TimeSource::client(clock.clone()))
        .ttl_margin(Duration::ZERO)
        .build()
        .unwrap()
}

#[test]
fn idle_key_is_dropped_exactly_when_full_again_never_earlier() {
    let rt = runtime();
    let clock = ManualClock::new(1_000);
    let m = manual(&clock, EmbeddedBackend::with_clock(clock.clone()));
    let config = simple(10, Duration::from_secs(10)); // 1 token per second
    let bucket = m.builder().build("idle", move || config.clone()).unwrap();
    rt.block_on(async {
        assert!(bucket.try_consume(3).await.unwrap());
        // Full again after exactly 3 s: one nanosecond earlier it must still be there.
        clock.advance_nanos(3_000_000_000 - 1);
        assert_eq!(m.backend().sweep(), 0);
        assert!(bucket.raw_record().await.unwrap().is_some());
        clock.advance_nanos(1);
        assert_eq!(m.backend().sweep(), 1);
        assert!(m.backend().is_empty());
        // A recreated bucket is indistinguishable from the kept one: full.
        assert_eq!(bucket.available_tokens().await.unwrap(), 10);
    });
}

/// A key in use is never forgotten; once idle its record expires exactly when a fresh bucket
/// would hold what it holds (full again) plus the manager's TTL margin, never a nanosecond
/// earlier: the store honours the TTL it is given, as Redis honours `PX`.
#[test]
fn a_busy_key_is_never_forgotten_and_an_idle_one_exactly_when_full() {
    let rt = runtime();
    let clock = ManualClock::new(1_000);
    let m = ProxyManager::configure(EmbeddedBackend::with_clock(clock.clone()))
        .ttl_margin(Duration::from_millis(700))
        .build()
        .unwrap();
    let config = simple(10, Duration::from_secs(10)); // 1 token per second
    let bucket = m.builder().build("busy", move || config.clone()).unwrap();
    let mut tokens: i64 = 10;
    for step in 0..200 {
        // Faster than the refill at first (the bucket drains), then slower (it refills).
        let gap: i64 = if step < 100 {
            400_000_000
        } else {
            1_300_000_000
        };
        clock.advance_nanos(gap);
        // Refill of the gap, in whole tokens (the remainder is tracked by the bucket).
        let consumed = rt.block_on(bucket.try_consume(1)).unwrap();
        assert_eq!(m.backend().sweep(), 0, "step {step}: a key in use stays");
        let left = rt.block_on(bucket.available_tokens()).unwrap();
        assert!(left < 10 || !consumed, "step {step}");
        tokens = left;
    }
    // Idle: full again after (10 - tokens) seconds less what the remainder already holds;
    // found by the bucket's own wait, then checked on both sides of it.
    let full_in = rt
        .block_on(bucket.as_verbose().available_tokens())
        .unwrap()
        .time_until_full();
    assert!(tokens < 10 && !full_in.is_zero());
    clock.advance(full_in + Duration::from_millis(700) - Duration::from_nanos(1));
    assert_eq!(m.backend().sweep(), 0);
    clock.advance_nanos(1);
    assert_eq!(m.backend().sweep(), 1);
    assert!(m.backend().is_empty());
    assert_eq!(rt.block_on(bucket.available_tokens()).unwrap(), 10);
}

/// A bucket that starts short is never forgotten, even once full: a recreated one would
/// start short again (the answers would change).
#[test]
fn a_bucket_that_starts_short_is_kept() {
    let rt = runtime();
    let clock = ManualClock::new(0);
    let m = ProxyManager::new(EmbeddedBackend::with_clock(clock.clone()));
    let config = BucketConfiguration::builder()
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(5)
                .refill_greedy(5, Duration::from_secs(2))
                .initial_tokens(0)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let bucket = m.builder().build("short", move || config.clone()).unwrap();
    rt.block_on(async {
        assert!(!bucket.try_consume(1).await.unwrap());
        clock.advance(Duration::from_secs(60));
        assert_eq!(m.backend().sweep(), 0);
        assert!(bucket.try_consume(5).await.unwrap());
    });
}

#[test]
fn key_cap_refuses_new_keys_but_never_evicts_a_non_full_bucket() {
    let rt = runtime();
    let clock = ManualClock::new(0);
    let m = manual(
        &clock,
        EmbeddedBackend::with_clock(clock.clone())
            .with_max_keys(2)
            .unwrap(),
    );
    let config = simple(5, Duration::from_secs(5));
    let make = |k: &str| {
        let c = config.clone();
        m.builder().build(k, move || c.clone()).unwrap()
    };
    rt.block_on(async {
        assert!(make("a").try_consume(5).await.unwrap());
        assert!(make("b").try_consume(1).await.unwrap());
        let err = make("c").try_consume(1).await.unwrap_err();
        match err {
            DistributedError::Backend(e) => {
                assert_eq!(e.kind(), BackendErrorKind::CapacityExhausted)
            }
            other => panic!("unexpected {other:?}"),
        }
        // "a" is still empty: not evicted.
        assert!(!make("a").try_consume(1).await.unwrap());
        // Once "b" is full again (1 s), its slot is reclaimed for "c".
        clock.advance(Duration::from_secs(1));
        assert!(make("c").try_consume(1).await.unwrap());
        assert_eq!(m.backend().len(), 2);
    });
}

#[test]
fn supplier_is_called_only_when_the_key_has_no_state() {
    let rt = runtime();
    let m = ProxyManager::new(EmbeddedBackend::new());
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c2 = calls.clone();
    let bucket = m
        .builder()
        .build("lazy", move || {
            c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            simple(5, Duration::from_secs(5))
        })
        .unwrap();
    rt.block_on(async {
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
        for _ in 0..3 {
            bucket.try_consume(1).await.unwrap();
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(m.remove("lazy").await.unwrap());
        bucket.try_consume(1).await.unwrap();
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    });
}

#[test]
fn aligned_refill_needs_a_wall_clock_and_verbose_returns_the_snapshot() {
    let rt = runtime();
    let clock = ManualClock::new(0); // not wall-clock based
    let m = manual(&clock, EmbeddedBackend::new());
    let aligned = BucketConfiguration::builder()
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(10)
                .refill_intervally_aligned(10, Duration::from_secs(60), Duration::ZERO)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let bucket = m
        .builder()
        .build("aligned", move || aligned.clone())
        .unwrap();
    rt.block_on(async {
        assert!(matches!(
            bucket.try_consume(1).await,
            Err(DistributedError::Config(_))
        ));
        assert_eq!(bucket.raw_record().await.unwrap(), None);
    });
    let config = simple(10, Duration::from_secs(1));
    let c = config.clone();
    let bucket = m.builder().build("verbose", move || c.clone()).unwrap();
    rt.block_on(async {
        let v = bucket
            .as_verbose()
            .try_consume_and_return_remaining(4)
            .await
            .unwrap();
        assert!(v.value().is_consumed());
        assert_eq!(v.configuration(), &config);
        assert_eq!(v.state().bandwidths()[0].tokens(), 6);
        assert_eq!(v.now_nanos(), clock.now_nanos());
        assert_eq!(v.available_tokens(), 6);
    });
}

#[test]
fn blocking_form_works_off_runtime_and_refuses_threads_that_run_tasks() {
    let m = ProxyManager::new(EmbeddedBackend::new());
    // Slow refill: the refusal below must not depend on how fast the calls run.
    let config = simple(3, Duration::from_secs(1_000));
    let bucket = m
        .builder()
        .build("blocking", move || config.clone())
        .unwrap()
        .as_blocking();
    // A plain thread, no runtime anywhere.
    assert!(bucket.block_on(|b| b.try_consume(2)).unwrap());
    assert!(!bucket.block_on(|b| b.try_consume(2)).unwrap());
    // Inside a current-thread runtime's `block_on`, and on a multi-thread worker: refused.
    let current = common::runtime();
    let inside = current.block_on(async { bucket.block_on(|b| b.try_consume(1)) });
    assert!(
        matches!(inside, Err(DistributedError::Blocking(_))),
        "{inside:?}"
    );
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let shared = std::sync::Arc::new(bucket);
    let on_worker = {
        let b = std::sync::Arc::clone(&shared);
        multi.block_on(async move {
            tokio::spawn(async move { b.block_on(|b| b.available_tokens()) })
                .await
                .unwrap()
        })
    };
    assert!(
        matches!(on_worker, Err(DistributedError::Blocking(_))),
        "{on_worker:?}"
    );
    // A blocking thread of the runtime may block: allowed.
    let on_blocking_thread = {
        let b = std::sync::Arc::clone(&shared);
        multi.block_on(async move {
            tokio::task::spawn_blocking(move || b.try_consume(1, Duration::from_millis(1)))
                .await
                .unwrap()
        })
    };
    assert_eq!(on_blocking_thread, Ok(true));
    assert_eq!(shared.block_on(|b| b.available_tokens()), Ok(0));
}

#[test]
fn zero_arguments_are_rejected_before_touching_the_backend() {
    let rt = runtime();
    let m = ProxyManager::new(EmbeddedBackend::new());
    let config = simple(2, Duration::from_secs(1));
    let bucket = m.builder().build("args", move || config.clone()).unwrap();
    rt.block_on(async {
        use bucket4rs_core::OperationError::*;
        assert_eq!(
            bucket.try_consume(0).await,
            Err(DistributedError::Operation(ZeroTokens))
        );
        assert_eq!(
            bucket.try_consume_as_much_as_possible_with_limit(0).await,
            Err(DistributedError::Operation(ZeroLimit))
        );
        assert_eq!(
            bucket.reserve(1, Duration::ZERO).await,
            Err(DistributedError::Operation(ZeroMaxWait))
        );
        assert!(m.backend().is_empty());
    });
}

/// Storage keys of many lengths each get a bucket of their own, found and removed by their
/// storage key.
#[test]
fn keys_of_every_length_are_distinct_buckets() {
    let rt = runtime();
    let clock = ManualClock::new(1_000);
    let config = simple(100, Duration::from_secs(100));
    // With the prefix "p" ("p:", 2 bytes), user keys of 1..=40 bytes: storage keys of 3..=42.
    let m = ProxyManager::configure(EmbeddedBackend::with_clock(clock.clone()))
        .key_prefix("p")
        .build()
        .unwrap();
    let keys: Vec<String> = (1..=40).map(|n| "k".repeat(n)).collect();
    rt.block_on(async {
        for (i, k) in keys.iter().enumerate() {
            let c = config.clone();
            let bucket = m.builder().build(k, move || c.clone()).unwrap();
            // Key i takes i + 1 tokens, so every key's bucket ends in a state of its own.
            let n = u64::try_from(i).unwrap() + 1;
            assert!(
                bucket.try_consume(n).await.unwrap(),
                "key of {} bytes",
                k.len()
            );
        }
        assert_eq!(m.backend().len(), keys.len());
        for (i, k) in keys.iter().enumerate() {
            let c = config.clone();
            let bucket = m.builder().build(k, move || c.clone()).unwrap();
            let left = 100 - (i64::try_from(i).unwrap() + 1);
            assert_eq!(bucket.available_tokens().await.unwrap(), left, "{k}");
        }
        for k in &keys {
            let storage = m.storage_key(k).unwrap();
            assert!(m.backend().remove(&storage).await.unwrap(), "{k}");
        }
        assert!(m.backend().is_empty());
    });
}

/// Readings at the extremes of the clock (near `i64::MAX`, around 0, negative): a used bucket
/// is never counted as forgettable and answers as a local bucket on the same clock would;
/// a full one is forgotten only where it is full.
#[test]
fn fault_embedded_expiry_is_total_at_the_extremes_of_the_clock() {
    let rt = runtime();
    for start in [
        i64::MAX - 1,
        i64::MAX - 1_000_000_000,
        i64::MAX / 2,
        1,
        0,
        -1,
        -1_000_000_000_000_000_000,
        i64::MIN + 1,
    ] {
        let clock = ManualClock::new(start);
        let m = ProxyManager::configure(EmbeddedBackend::with_clock(clock.clone()))
            .ttl_margin(Duration::ZERO)
            .build()
            .unwrap();
        let config = simple(10, Duration::from_secs(10));
        let local = bucket4rs_local::Bucket::builder()
            .with_configuration(&config)
            .with_clock(clock.clone())
            .build()
            .unwrap();
        let bucket = m.builder().build("edge", move || config.clone()).unwrap();
        rt.block_on(async {
            assert_eq!(
                bucket.try_consume(3).await.unwrap(),
                local.try_consume(3).unwrap(),
                "{start}"
            );
            assert_eq!(m.backend().sweep(), 0, "a used bucket forgotten at {start}");
            assert_eq!(m.backend().len(), 1, "{start}");
            clock.advance_nanos(1);
            assert_eq!(
                bucket.available_tokens().await.unwrap(),
                local.available_tokens(),
                "{start}"
            );
            // 3 s later the bucket is full again, unless that reading is past the clock's end.
            clock.advance(Duration::from_secs(3));
            let full = start.checked_add(3_000_000_001).is_some();
            assert_eq!(m.backend().sweep(), usize::from(full), "{start}");
            assert_eq!(
                bucket.available_tokens().await.unwrap(),
                local.available_tokens(),
                "{start}"
            );
        });
    }
    println!("fault: embedded clock extremes: 8 readings from i64::MIN+1 to i64::MAX-1 agree");
}

/// A wall-clock-based clock that steps backwards: `reset` and `add_tokens` while behind, then
/// sweeps, never hand out more tokens than a local bucket on the same clock (the issue saw
/// 5 against 0 through an expiry and recreation).
#[test]
fn fault_a_clock_stepping_back_never_lets_a_recreated_bucket_grant_more_than_a_local_one() {
    let rt = runtime();
    let t0: i64 = 1_700_000_000_000_000_000;
    let clock = ManualClock::wall_clock(t0);
    let m = ProxyManager::configure(EmbeddedBackend::with_clock(clock.clone()))
        .time_source(TimeSource::client(clock.clone()))
        .build()
        .unwrap();
    let config = simple(5, Duration::from_secs(50));
    let local = bucket4rs_local::Bucket::builder()
        .with_configuration(&config)
        .with_clock(clock.clone())
        .build()
        .unwrap();
    let bucket = m.builder().build("back", move || config.clone()).unwrap();
    let (mut remote_granted, mut local_granted) = (0, 0);
    rt.block_on(async {
        let drain = async |remote: &mut u32, here: &mut u32| {
            for _ in 0..5 {
                *remote += u32::from(bucket.try_consume(1).await.unwrap());
                *here += u32::from(local.try_consume(1).unwrap());
            }
        };
        drain(&mut remote_granted, &mut local_granted).await;
        // The wall clock steps back a minute.
        clock.set_nanos(t0 - 60_000_000_000);
        bucket.reset().await.unwrap();
        local.reset();
        drain(&mut remote_granted, &mut local_granted).await;
        m.backend().sweep();
        clock.advance(Duration::from_secs(1));
        bucket.add_tokens(1).await.unwrap();
        local.add_tokens(1).unwrap();
        m.backend().sweep();
        drain(&mut remote_granted, &mut local_granted).await;
        // Back to the true time, and a little later.
        clock.set_nanos(t0 + 1_000_000_000);
        m.backend().sweep();
        drain(&mut remote_granted, &mut local_granted).await;
        assert_eq!(
            bucket.available_tokens().await.unwrap(),
            local.available_tokens()
        );
    });
    println!(
        "fault: embedded clock stepping back: granted {remote_granted}, a local bucket {local_granted}"
    );
    assert!(
        remote_granted <= local_granted,
        "{remote_granted} > {local_granted}"
    );
    assert_eq!(remote_granted, local_granted);
}
