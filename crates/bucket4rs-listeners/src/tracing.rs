//! `TracingListener`: `tracing` events.

use std::borrow::Cow;

use bucket4rs_core::BucketListener;

/// Emits one [`tracing`](https://docs.rs/tracing) event per bucket event, with target
/// `bucket4rs` and the field `bucket` set to the name given to [`new`](Self::new):
///
/// | bucket event | level | fields | message |
/// |---|---|---|---|
/// | consumed | `TRACE` | `bucket`, `tokens` | `tokens consumed` |
/// | rejected | `DEBUG` | `bucket`, `tokens` | `tokens rejected` |
/// | delayed (async reservation) | `DEBUG` | `bucket`, `nanos` | `waiting for tokens` |
/// | before parking (blocking) | `TRACE` | `bucket`, `nanos` | `parking for tokens` |
/// | parked (blocking) | `DEBUG` | `bucket`, `nanos` | `parked for tokens` |
/// | interrupted | `DEBUG` | `bucket` | `wait for tokens interrupted` |
///
/// Rejections and waits are the interesting events, so they sit one level above the routine
/// consumption. With no subscriber interested (the usual production setting for `TRACE`) an
/// event costs a cached interest check.
///
/// ```
/// use bucket4rs_listeners::TracingListener;
/// use bucket4rs_local::Bucket;
/// use std::time::Duration;
///
/// let bucket = Bucket::builder()
///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
///     .with_listener(TracingListener::new("login"))
///     .build()?;
/// bucket.try_consume(11)?; // a DEBUG event: "tokens rejected" bucket="login" tokens=11
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct TracingListener {
    name: Cow<'static, str>,
}

impl TracingListener {
    /// A listener whose events carry `bucket = name`.
    ///
    /// ```
    /// use bucket4rs_listeners::TracingListener;
    /// assert_eq!(TracingListener::new(String::from("api")).name(), "api");
    /// ```
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self { name: name.into() }
    }

    /// The bucket name the events carry.
    ///
    /// ```
    /// use bucket4rs_listeners::TracingListener;
    /// assert_eq!(TracingListener::new("api").name(), "api");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl BucketListener for TracingListener {
    #[inline]
    fn on_consumed(&self, tokens: u64) {
        tracing::trace!(target: "bucket4rs", bucket = self.name(), tokens, "tokens consumed");
    }
    #[inline]
    fn on_rejected(&self, tokens: u64) {
        tracing::debug!(target: "bucket4rs", bucket = self.name(), tokens, "tokens rejected");
    }
    #[inline]
    fn on_delayed(&self, nanos: u64) {
        tracing::debug!(target: "bucket4rs", bucket = self.name(), nanos, "waiting for tokens");
    }
    #[inline]
    fn on_before_parking(&self, nanos: u64) {
        tracing::trace!(target: "bucket4rs", bucket = self.name(), nanos, "parking for tokens");
    }
    #[inline]
    fn on_parked(&self, nanos: u64) {
        tracing::debug!(target: "bucket4rs", bucket = self.name(), nanos, "parked for tokens");
    }
    #[inline]
    fn on_interrupted(&self) {
        tracing::debug!(target: "bucket4rs", bucket = self.name(), "wait for tokens interrupted");
    }
}
