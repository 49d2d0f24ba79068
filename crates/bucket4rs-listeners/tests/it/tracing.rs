//! `TracingListener` against a layer that captures every event.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use bucket4rs_core::BucketListener;
use bucket4rs_listeners::TracingListener;
use bucket4rs_local::Synchronized;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

use crate::bucket;

/// One captured event: level, target and fields (`message` included), rendered as text.
#[derive(Debug, PartialEq)]
struct Captured {
    level: Level,
    target: String,
    fields: BTreeMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Captured {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields,
        });
    }
}

fn event(level: Level, fields: &[(&str, &str)]) -> Captured {
    Captured {
        level,
        target: "bucket4rs".to_owned(),
        fields: fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

/// tracing-core caches each callsite's interest for the whole process, rebuilt as
/// dispatchers come and go: a test filtering at `DEBUG` on another thread could race a
/// capture of `TRACE` events. The tests of this file install their subscribers one at a time.
static ONE_SUBSCRIBER_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_SUBSCRIBER_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn capture(f: impl FnOnce()) -> Vec<Captured> {
    let _serial = serial();
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::with_default(subscriber, f);
    std::mem::take(&mut *capture.0.lock().unwrap())
}

#[test]
fn bucket_events_become_tracing_events() {
    let events = capture(|| {
        let (b, _) = bucket::<Synchronized, _>(TracingListener::new("login"));
        assert_eq!(b.try_consume(4), Ok(true));
        assert_eq!(b.try_consume(7), Ok(false));
        // Silent operations.
        let _ = b.estimate_ability_to_consume(1);
        let _ = b.available_tokens();
        b.force_add_tokens(1).unwrap();
        b.reset();
    });
    assert_eq!(
        events,
        [
            event(
                Level::TRACE,
                &[
                    ("bucket", "login"),
                    ("message", "tokens consumed"),
                    ("tokens", "4")
                ]
            ),
            event(
                Level::DEBUG,
                &[
                    ("bucket", "login"),
                    ("message", "tokens rejected"),
                    ("tokens", "7")
                ]
            ),
        ]
    );
}

#[test]
fn waits_and_interruptions() {
    let events = capture(|| {
        let l = TracingListener::new(String::from("jobs"));
        l.on_delayed(10);
        l.on_before_parking(20);
        l.on_parked(30);
        l.on_interrupted();
    });
    assert_eq!(
        events,
        [
            event(
                Level::DEBUG,
                &[
                    ("bucket", "jobs"),
                    ("message", "waiting for tokens"),
                    ("nanos", "10")
                ]
            ),
            event(
                Level::TRACE,
                &[
                    ("bucket", "jobs"),
                    ("message", "parking for tokens"),
                    ("nanos", "20")
                ]
            ),
            event(
                Level::DEBUG,
                &[
                    ("bucket", "jobs"),
                    ("message", "parked for tokens"),
                    ("nanos", "30")
                ]
            ),
            event(
                Level::DEBUG,
                &[
                    ("bucket", "jobs"),
                    ("message", "wait for tokens interrupted")
                ]
            ),
        ]
    );
}

/// A subscriber filtering at `DEBUG` sees rejections but not routine consumption.
#[test]
fn levels_filter() {
    let _serial = serial();
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(
        capture
            .clone()
            .with_filter(tracing_subscriber::filter::LevelFilter::DEBUG),
    );
    tracing::subscriber::with_default(subscriber, || {
        let (b, _) = bucket::<Synchronized, _>(TracingListener::new("api"));
        let _ = b.try_consume(10);
        let _ = b.try_consume(1);
    });
    let events = capture.0.lock().unwrap();
    assert_eq!(
        *events,
        [event(
            Level::DEBUG,
            &[
                ("bucket", "api"),
                ("message", "tokens rejected"),
                ("tokens", "1")
            ]
        )]
    );
}
