//! Replays every Bucket4j conformance trace against each local strategy.
//!
//! Set `BUCKET4RS_CONFORMANCE_DIR` to replay another directory of traces of the same format.

use bucket4rs_local::{Bucket, KeyedBucket, NewStorage, SynchronizationStrategy};
use bucket4rs_test::local::{KeyedEngine, LocalEngine, ReserveAndAdvance};
use bucket4rs_test::{replay_all, replay_all_monotonic};

fn replay<S: NewStorage>(label: &str) {
    replay_all(label, |config, clock| {
        let bucket = Bucket::builder()
            .with_configuration(&config)
            .with_clock(clock)
            .build_storage::<S>()
            .map_err(|e| e.to_string())?;
        Ok(LocalEngine {
            bucket,
            blocking: ReserveAndAdvance,
        })
    });
}

#[test]
fn every_trace_replays_on_the_lock_free_bucket() {
    replay::<bucket4rs_local::LockFree>("lock-free");
}

#[test]
fn every_trace_replays_on_the_synchronized_bucket() {
    replay::<bucket4rs_local::Synchronized>("synchronized");
}

#[test]
fn every_trace_replays_on_the_unsynchronized_bucket() {
    replay::<bucket4rs_local::Unsynchronized>("none");
}

#[test]
fn every_trace_replays_on_run_time_chosen_strategies() {
    for (label, strategy) in [
        ("any/lock-free", SynchronizationStrategy::LockFree),
        ("any/synchronized", SynchronizationStrategy::Synchronized),
    ] {
        replay_all(label, |config, clock| {
            let bucket = Bucket::builder()
                .with_configuration(&config)
                .with_clock(clock)
                .build_with(strategy)
                .map_err(|e| e.to_string())?;
            Ok(LocalEngine {
                bucket,
                blocking: ReserveAndAdvance,
            })
        });
    }
}

/// The traces whose clock never goes back, on a clock that says so: one-bandwidth greedy
/// lock-free buckets then run on the compact 64-bit word. (That such buckets do start on the
/// word is checked with data of its own in `tests/compact.rs`, not here: this runner must pass
/// on any directory of valid traces.)
#[test]
fn every_forward_trace_replays_on_the_compact_lock_free_bucket() {
    replay_all_monotonic("lock-free", |config, clock| {
        let bucket = Bucket::builder()
            .with_configuration(&config)
            .with_clock(clock)
            .build_storage::<bucket4rs_local::LockFree>()
            .map_err(|e| e.to_string())?;
        Ok(LocalEngine {
            bucket,
            blocking: ReserveAndAdvance,
        })
    });
}

/// A keyed bucket, every trace on one of its keys, the key forgotten after each step whenever
/// it can be: on a clock that may go back, every key's bucket is a synchronized one.
#[test]
fn every_trace_replays_on_a_key_of_a_keyed_bucket() {
    replay_all("keyed", |config, clock| {
        let keyed = KeyedBucket::builder()
            .with_configuration(&config)
            .with_clock(clock)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(KeyedEngine::new(keyed))
    });
}

/// The same on a monotonic clock: one-greedy-bandwidth keys run on the compact word.
#[test]
fn every_forward_trace_replays_on_a_compact_key_of_a_keyed_bucket() {
    replay_all_monotonic("keyed", |config, clock| {
        let keyed = KeyedBucket::builder()
            .with_configuration(&config)
            .with_clock(clock)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(KeyedEngine::new(keyed))
    });
}
