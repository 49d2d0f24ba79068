//! `MetricsListener`: the `metrics` facade.

use metrics::{Counter, Histogram, SharedString, Unit};

use bucket4rs_core::BucketListener;

const CONSUMED: &str = "bucket4rs_tokens_consumed_total";
const REJECTED: &str = "bucket4rs_tokens_rejected_total";
const INTERRUPTED: &str = "bucket4rs_waits_interrupted_total";
const WAIT: &str = "bucket4rs_wait_seconds";
const BUCKET: &str = "bucket";
const KIND: &str = "kind";

/// Reports a bucket's events through the [`metrics`](https://docs.rs/metrics) facade, to
/// whatever recorder (Prometheus exporter, StatsD, …) the program installs.
///
/// Every metric carries the label `bucket` with the name given to [`new`](Self::new):
///
/// | metric | kind | value |
/// |---|---|---|
/// | `bucket4rs_tokens_consumed_total` | counter | tokens consumed |
/// | `bucket4rs_tokens_rejected_total` | counter | tokens rejected (the size of each rejected request) |
/// | `bucket4rs_wait_seconds{kind="delayed"}` | histogram | each wait an async reservation was told to make |
/// | `bucket4rs_wait_seconds{kind="parked"}` | histogram | each time a blocking caller parked |
/// | `bucket4rs_waits_interrupted_total` | counter | waits interrupted or cancelled |
///
/// The announcement before parking (`on_before_parking`) is not recorded: the parking itself
/// is, once it has happened.
///
/// The metric handles are registered once, in `new`, with the recorder in force *then* (the
/// global one, or a local one from `metrics::with_local_recorder`), so every event costs one
/// atomic update and no lookup or allocation: create the listener after installing the
/// recorder. Share one listener between buckets (by reference or `Arc`) to add their figures
/// up under one name. [`describe`](Self::describe) registers units and descriptions.
///
/// ```
/// use bucket4rs_listeners::MetricsListener;
/// use bucket4rs_local::Bucket;
/// use metrics_util::debugging::{DebugValue, DebuggingRecorder};
/// use std::time::Duration;
///
/// let recorder = DebuggingRecorder::new();
/// let snapshotter = recorder.snapshotter();
/// metrics::with_local_recorder(&recorder, || -> Result<(), Box<dyn std::error::Error>> {
///     let bucket = Bucket::builder()
///         .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
///         .with_listener(MetricsListener::new("login"))
///         .build()?;
///     bucket.try_consume(4)?;
///     Ok(())
/// })?;
/// let consumed = snapshotter.snapshot().into_vec().into_iter().find_map(|(key, _, _, value)| {
///     (key.key().name() == "bucket4rs_tokens_consumed_total").then_some(value)
/// });
/// assert_eq!(consumed, Some(DebugValue::Counter(4)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MetricsListener {
    name: SharedString,
    consumed: Counter,
    rejected: Counter,
    interrupted: Counter,
    delayed: Histogram,
    parked: Histogram,
}

impl MetricsListener {
    /// A listener labelling its metrics `bucket = name`, registered with the current recorder.
    ///
    /// ```
    /// use bucket4rs_listeners::MetricsListener;
    /// let listener = MetricsListener::new(format!("tenant-{}", 42));
    /// assert_eq!(listener.name(), "tenant-42");
    /// ```
    pub fn new(name: impl Into<SharedString>) -> Self {
        let name = name.into();
        Self {
            consumed: metrics::counter!(CONSUMED, BUCKET => name.clone()),
            rejected: metrics::counter!(REJECTED, BUCKET => name.clone()),
            interrupted: metrics::counter!(INTERRUPTED, BUCKET => name.clone()),
            delayed: metrics::histogram!(WAIT, BUCKET => name.clone(), KIND => "delayed"),
            parked: metrics::histogram!(WAIT, BUCKET => name.clone(), KIND => "parked"),
            name,
        }
    }

    /// The bucket name the metrics are labelled with.
    ///
    /// ```
    /// use bucket4rs_listeners::MetricsListener;
    /// assert_eq!(MetricsListener::new("api").name(), "api");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Describes the metrics (unit and help text) to the current recorder; call it once, after
    /// installing the recorder.
    ///
    /// ```
    /// use bucket4rs_listeners::MetricsListener;
    /// use metrics_util::debugging::DebuggingRecorder;
    ///
    /// let recorder = DebuggingRecorder::new();
    /// let snapshotter = recorder.snapshotter();
    /// metrics::with_local_recorder(&recorder, || {
    ///     MetricsListener::describe();
    ///     MetricsListener::new("api"); // the snapshot lists registered metrics only
    /// });
    /// let units: Vec<_> = snapshotter.snapshot().into_vec().into_iter()
    ///     .filter(|(key, ..)| key.key().name() == "bucket4rs_wait_seconds")
    ///     .map(|(_, unit, ..)| unit)
    ///     .collect();
    /// assert_eq!(units, [Some(metrics::Unit::Seconds); 2]); // delayed and parked
    /// ```
    pub fn describe() {
        metrics::describe_counter!(CONSUMED, Unit::Count, "Tokens consumed from the bucket.");
        metrics::describe_counter!(
            REJECTED,
            Unit::Count,
            "Tokens requested but rejected (the size of each rejected request)."
        );
        metrics::describe_counter!(
            INTERRUPTED,
            Unit::Count,
            "Waits for tokens that were interrupted or cancelled."
        );
        metrics::describe_histogram!(
            WAIT,
            Unit::Seconds,
            "Waits for tokens: kind=delayed (async reservations), kind=parked (blocking callers)."
        );
    }
}

/// Nanoseconds as seconds.
fn seconds(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

impl BucketListener for MetricsListener {
    #[inline]
    fn on_consumed(&self, tokens: u64) {
        self.consumed.increment(tokens);
    }
    #[inline]
    fn on_rejected(&self, tokens: u64) {
        self.rejected.increment(tokens);
    }
    #[inline]
    fn on_delayed(&self, nanos: u64) {
        self.delayed.record(seconds(nanos));
    }
    #[inline]
    fn on_parked(&self, nanos: u64) {
        self.parked.record(seconds(nanos));
    }
    #[inline]
    fn on_interrupted(&self) {
        self.interrupted.increment(1);
    }
}
