//! The remote bucket speaks the local bucket's language: its waits give back what a dropped
//! future reserved, and its listener hears what a local bucket's hears.

use std::sync::Arc;
use std::time::Duration;

use bucket4rs_async::AsyncBucketExt;
use bucket4rs_core::{BucketConfiguration, ManualClock};
use bucket4rs_distributed::{EmbeddedBackend, ProxyManager, RemoteBucket, TimeSource};
use bucket4rs_local::Bucket;
use rand::{Rng, SeedableRng};

use crate::common::{
    RandomOp, Recorder, dropped_waits_give_back_what_they_reserved, random_config, random_op,
    runtime, simple,
};

#[test]
fn embedded_dropped_waits_give_back_what_they_reserved() {
    runtime().block_on(async {
        dropped_waits_give_back_what_they_reserved(EmbeddedBackend::new(), "waits").await;
    });
}

/// A wait dropped where no runtime runs (a future moved out of its runtime and dropped on a
/// plain thread) still gives its tokens back: the refund goes to the blocking views' runtime.
#[test]
fn a_wait_dropped_outside_any_runtime_still_gives_back() {
    let rt = runtime();
    let m = ProxyManager::configure(EmbeddedBackend::new())
        .time_source(TimeSource::client(ManualClock::new(0)))
        .build()
        .unwrap();
    let b = m
        .builder()
        .build("outside", || simple(2, Duration::from_secs(2_000)))
        .unwrap();
    let mut waiting = Box::pin(b.consume(5));
    rt.block_on(async {
        let polled = tokio::time::timeout(Duration::from_millis(20), waiting.as_mut()).await;
        assert!(polled.is_err(), "it waits for 3,000 s");
        assert_eq!(b.available_tokens().await.unwrap(), -3);
    });
    drop(rt);
    drop(waiting);
    let blocking = b.as_blocking();
    let started = std::time::Instant::now();
    while blocking.block_on(|b| b.available_tokens()).unwrap() != 2 {
        assert!(started.elapsed() < Duration::from_secs(10), "no refund");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One operation on a local bucket, the listener's events being what counts.
fn on_local(op: RandomOp, b: &Bucket<bucket4rs_local::LockFree, ManualClock, Arc<Recorder>>) {
    let _ = match op {
        RandomOp::TryConsume(n) => b.try_consume(n).map(drop),
        RandomOp::Probe(n) => b.try_consume_and_return_remaining(n).map(drop),
        RandomOp::Estimate(n) => b.estimate_ability_to_consume(n).map(drop),
        RandomOp::AsMuch(None) => Ok(b.try_consume_as_much_as_possible()).map(|_| ()),
        RandomOp::AsMuch(Some(l)) => b.try_consume_as_much_as_possible_with_limit(l).map(drop),
        RandomOp::Add(n) => b.add_tokens(n),
        RandomOp::Force(n) => b.force_add_tokens(n),
        RandomOp::Reset => {
            b.reset();
            Ok(())
        }
        RandomOp::Available => Ok(b.available_tokens()).map(|_| ()),
        RandomOp::Ignoring(n) => b.consume_ignoring_rate_limits(n).map(drop),
        RandomOp::Reserve(n, w) => b.reserve(n, Duration::from_nanos(w)).map(drop),
    };
}

async fn on_remote(op: RandomOp, b: &RemoteBucket<EmbeddedBackend>) {
    let _ = match op {
        RandomOp::TryConsume(n) => b.try_consume(n).await.map(drop),
        RandomOp::Probe(n) => b.try_consume_and_return_remaining(n).await.map(drop),
        RandomOp::Estimate(n) => b.estimate_ability_to_consume(n).await.map(drop),
        RandomOp::AsMuch(None) => b.try_consume_as_much_as_possible().await.map(drop),
        RandomOp::AsMuch(Some(l)) => b
            .try_consume_as_much_as_possible_with_limit(l)
            .await
            .map(drop),
        RandomOp::Add(n) => b.add_tokens(n).await,
        RandomOp::Force(n) => b.force_add_tokens(n).await,
        RandomOp::Reset => b.reset().await,
        RandomOp::Available => b.available_tokens().await.map(drop),
        RandomOp::Ignoring(n) => b.consume_ignoring_rate_limits(n).await.map(drop),
        RandomOp::Reserve(n, w) => b.reserve(n, Duration::from_nanos(w)).await.map(drop),
    };
}

/// On random configurations and operation sequences (the waiting calls included, on tokio's
/// paused clock, some dropped mid-wait), a remote bucket's listener hears exactly what a local
/// bucket's hears, in the same order, at the same manual clock readings.
#[test]
fn remote_listener_hears_what_a_local_one_hears() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x0b4e_5733);
    let mut compared = 0;
    // Which kinds of event were compared: the waits' as well as the plain calls'.
    let mut kinds = std::collections::BTreeSet::new();
    for case in 0..200 {
        let config: BucketConfiguration = random_config(&mut rng);
        let clock = ManualClock::new(rng.random_range(0..1_000_000_000_000));
        let local_heard = Arc::new(Recorder::default());
        let local = Bucket::builder()
            .with_configuration(&config)
            .with_clock(clock.clone())
            .with_listener(Arc::clone(&local_heard))
            .build()
            .unwrap();
        let remote_heard = Arc::new(Recorder::default());
        let manager = ProxyManager::configure(EmbeddedBackend::with_clock(clock.clone()))
            .time_source(TimeSource::client(clock.clone()))
            .build()
            .unwrap();
        let c = config.clone();
        let remote = manager
            .builder()
            .with_listener(Arc::clone(&remote_heard))
            .build(format!("k{case}"), move || c.clone())
            .unwrap();
        rt.block_on(async {
            for _ in 0..rng.random_range(1..30) {
                match rng.random_range(0..4) {
                    // A waiting call on both, maybe dropped before its wait ends (the clock
                    // stands still: only tokio's paused clock runs the waits).
                    0 => {
                        let n = rng.random_range(1..=20);
                        let patience = Duration::from_nanos(rng.random_range(1..=3_000_000_000));
                        let cap = Duration::from_nanos(rng.random_range(1..=10_000_000_000));
                        let view = local.as_async();
                        if rng.random_bool(0.5) {
                            let _ = tokio::time::timeout(patience, view.consume(n)).await;
                            let _ = tokio::time::timeout(patience, remote.consume(n)).await;
                        } else {
                            let _ = tokio::time::timeout(patience, view.try_consume(n, cap)).await;
                            let _ =
                                tokio::time::timeout(patience, remote.try_consume_within(n, cap))
                                    .await;
                        }
                        // Let the remote refund task (if any) land before the next step.
                        tokio::task::yield_now().await;
                    }
                    _ => {
                        let op = random_op(&mut rng);
                        on_local(op, &local);
                        on_remote(op, &remote).await;
                    }
                }
                if rng.random_bool(0.3) {
                    clock.advance_nanos(rng.random_range(0..5_000_000_000));
                }
                assert_eq!(
                    local.available_tokens(),
                    remote.available_tokens().await.unwrap(),
                    "case {case}: the two buckets drifted apart"
                );
            }
        });
        let (l, r) = (local_heard.events(), remote_heard.events());
        assert_eq!(l, r, "case {case}: {config:?}");
        compared += l.len();
        kinds.extend(
            l.iter()
                .map(|e| format!("{e:?}").split('(').next().unwrap().to_owned()),
        );
    }
    println!("listener events compared: {compared} ({kinds:?})");
    assert!(compared > 1_000, "{compared}");
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["Consumed", "Delayed", "Interrupted", "Rejected"]
    );
}

/// The blocking view parks with the local blocking view's events, and its verbose form
/// answers the reservation.
#[test]
fn blocking_waits_park_with_the_local_events() {
    let heard = Arc::new(Recorder::default());
    let m = ProxyManager::new(EmbeddedBackend::new());
    // 1 token per millisecond.
    let b = m
        .builder()
        .with_listener(Arc::clone(&heard))
        .build("parks", || simple(1_000, Duration::from_secs(1)))
        .unwrap()
        .as_blocking();
    assert_eq!(b.consume(1_000).unwrap(), Duration::ZERO);
    let parked = b.consume(2).unwrap();
    assert!(
        parked > Duration::ZERO && parked <= Duration::from_millis(2),
        "{parked:?}"
    );
    let n = u64::try_from(parked.as_nanos()).unwrap();
    let refused = b
        .as_verbose()
        .try_consume(500, Duration::from_millis(1))
        .unwrap();
    assert!(!*refused.value());
    assert!(refused.available_tokens() < 0 || refused.available_tokens() < 500);
    use crate::common::Event::*;
    assert_eq!(
        heard.events(),
        [
            Consumed(1_000),
            Consumed(2),
            BeforeParking(n),
            Parked(n),
            Rejected(500)
        ]
    );
}
