//! Replays every Bucket4j conformance trace against each local strategy.
//!
//! Set `BUCKET4RS_CONFORMANCE_DIR` to replay another directory of traces of the same format.

use bucket4rs_local::{Bucket, NewStorage, SynchronizationStrategy};
use bucket4rs_test::local::{LocalEngine, ReserveAndAdvance};
use bucket4rs_test::replay_all;

fn replay<S: NewStorage>(label: &str) {
    let summary = replay_all(label, |config, clock| {
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
    assert!(summary.steps > summary.traces);
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
        let summary = replay_all(label, |config, clock| {
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
        assert!(summary.steps > summary.traces);
    }
}
