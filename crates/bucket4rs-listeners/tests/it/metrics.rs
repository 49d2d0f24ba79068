//! `MetricsListener` against metrics-util's `DebuggingRecorder`, installed locally.

use std::collections::BTreeMap;

use bucket4rs_core::BucketListener;
use bucket4rs_listeners::MetricsListener;
use bucket4rs_local::LockFree;
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use crate::bucket;

/// `(name, sorted labels)` → value, for every metric the recorder holds.
type Seen = BTreeMap<(String, Vec<(String, String)>), DebugValue>;

fn seen(snapshotter: &Snapshotter) -> Seen {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            ((key.name().to_owned(), labels), value)
        })
        .collect()
}

fn key(name: &str, labels: &[(&str, &str)]) -> (String, Vec<(String, String)>) {
    (
        name.to_owned(),
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

fn seconds(values: &[f64]) -> DebugValue {
    DebugValue::Histogram(values.iter().copied().map(Into::into).collect())
}

#[test]
fn counters_count_tokens_per_bucket_name() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let (login, _) = bucket::<LockFree, _>(MetricsListener::new("login"));
        let (api, _) = bucket::<LockFree, _>(MetricsListener::new(String::from("api")));
        assert_eq!(login.try_consume(4), Ok(true));
        assert_eq!(login.try_consume(7), Ok(false));
        assert_eq!(login.try_consume(6), Ok(true));
        assert_eq!(api.try_consume_as_much_as_possible(), 10);
        // Silent operations.
        let _ = login.estimate_ability_to_consume(3);
        let _ = login.available_tokens();
        login.add_tokens(1).unwrap();
        login.reset();
    });
    let seen = seen(&snapshotter);
    let login = [("bucket", "login")];
    let api = [("bucket", "api")];
    assert_eq!(
        seen.get(&key("bucket4rs_tokens_consumed_total", &login)),
        Some(&DebugValue::Counter(10))
    );
    assert_eq!(
        seen.get(&key("bucket4rs_tokens_rejected_total", &login)),
        Some(&DebugValue::Counter(7))
    );
    assert_eq!(
        seen.get(&key("bucket4rs_tokens_consumed_total", &api)),
        Some(&DebugValue::Counter(10))
    );
    assert_eq!(
        seen.get(&key("bucket4rs_tokens_rejected_total", &api)),
        Some(&DebugValue::Counter(0))
    );
    assert_eq!(
        seen.get(&key("bucket4rs_waits_interrupted_total", &login)),
        Some(&DebugValue::Counter(0))
    );
    assert_eq!(
        seen.get(&key(
            "bucket4rs_wait_seconds",
            &[("bucket", "login"), ("kind", "delayed")]
        )),
        Some(&seconds(&[]))
    );
    assert_eq!(seen.len(), 10, "5 metrics per bucket name: {seen:#?}");
}

#[test]
fn waits_go_to_the_histogram_in_seconds() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let l = MetricsListener::new("jobs");
        l.on_delayed(1_500_000_000);
        l.on_delayed(250_000_000);
        l.on_before_parking(2_000); // an announcement, not a wait: not recorded
        l.on_parked(2_000);
        l.on_interrupted();
        l.on_interrupted();
    });
    let seen = seen(&snapshotter);
    assert_eq!(
        seen.get(&key(
            "bucket4rs_wait_seconds",
            &[("bucket", "jobs"), ("kind", "delayed")]
        )),
        Some(&seconds(&[1.5, 0.25]))
    );
    assert_eq!(
        seen.get(&key(
            "bucket4rs_wait_seconds",
            &[("bucket", "jobs"), ("kind", "parked")]
        )),
        Some(&seconds(&[2e-6]))
    );
    assert_eq!(
        seen.get(&key(
            "bucket4rs_waits_interrupted_total",
            &[("bucket", "jobs")]
        )),
        Some(&DebugValue::Counter(2))
    );
}

#[test]
fn describe_sets_units_and_help() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        MetricsListener::describe();
        let _ = MetricsListener::new("x");
    });
    let units: BTreeMap<String, (Option<Unit>, bool)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, unit, help, _)| (k.key().name().to_owned(), (unit, help.is_some())))
        .collect();
    assert_eq!(
        units.get("bucket4rs_tokens_consumed_total"),
        Some(&(Some(Unit::Count), true))
    );
    assert_eq!(
        units.get("bucket4rs_wait_seconds"),
        Some(&(Some(Unit::Seconds), true))
    );
}

/// Handles bind to the recorder in force when the listener is created: one created outside
/// the local recorder reports nothing to it.
#[test]
fn handles_bind_at_creation() {
    let early = MetricsListener::new("early");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || early.on_consumed(5));
    assert!(seen(&snapshotter).is_empty());
}
