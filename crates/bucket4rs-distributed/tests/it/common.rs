//! Helpers shared by the backends' tests (the `it`, `postgres` and `sqlite` binaries): random
//! operations checked against the core, hot-key hammers, child processes, restarts.

use std::time::Duration;

use bucket4rs_core::{Bandwidth, BucketConfiguration, BucketState, ManualClock, ops};
use bucket4rs_distributed::{Backend, DistributedError, ProxyManager, RemoteBucket, TimeSource};
use rand::Rng;
use tokio::runtime::Runtime;

/// A wait in nanoseconds, as the core gives it.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("waits fit in u64")
}

/// A current-thread runtime for a test.
pub(crate) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A runtime of two workers, for a test whose tasks run while it blocks (a server killed,
/// a command run with `block_in_place`).
pub(crate) fn multi_thread_runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A prefix no other test (or earlier run) uses.
pub(crate) fn unique_prefix(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("b4t-{test}-{}-{nanos}", std::process::id())
}

/// `n` tokens per `period`, greedy.
pub(crate) fn simple(capacity: u64, period: std::time::Duration) -> BucketConfiguration {
    BucketConfiguration::builder()
        .add_bandwidth(bucket4rs_core::Bandwidth::simple(capacity, period).expect("bandwidth"))
        .build()
        .expect("configuration")
}

#[cfg(any(feature = "redis", feature = "postgres"))]
/// Epoch milliseconds now.
pub(crate) fn epoch_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// A manager whose calls may take 20 s: for the calls a test needs to succeed on a loaded
/// machine (a test about latency keeps its own short timeout).
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) fn patient<B: Backend>(backend: B) -> ProxyManager<B> {
    ProxyManager::configure(backend)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("a valid manager")
}

#[cfg(any(feature = "redis", feature = "postgres"))]
/// Multi-process tests: in a child, waits until epoch millisecond `start_ms` (so the children
/// start together), then runs 4 tasks × 1,000 `try_consume(1)` on key `hot`; the tokens
/// granted.
pub(crate) async fn hammer_hot_key<B: Backend>(
    manager: &ProxyManager<B>,
    config: fn() -> BucketConfiguration,
    start_ms: u128,
) -> u64 {
    let now_ms = epoch_ms();
    if start_ms > now_ms {
        tokio::time::sleep(std::time::Duration::from_millis((start_ms - now_ms) as u64)).await;
    }
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let b = manager.builder().build("hot", config).unwrap();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            for _ in 0..1_000 {
                if b.try_consume(1).await.unwrap() {
                    n += 1;
                }
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

#[cfg(any(feature = "redis", feature = "postgres"))]
/// Multi-process tests: runs `test` of this test binary in 4 child processes with `env` set to
/// `value`; each must succeed. Their standard outputs.
pub(crate) fn run_children(test: &str, env: &str, value: &str) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--exact", test, "--nocapture", "--test-threads=1"])
                .env(env, value)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "child failed: {out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect()
}

#[cfg(any(feature = "redis", feature = "postgres"))]
/// What a child printed after `tag` (libtest may print "test … ... " in front of its first
/// line, so the tag is searched anywhere in a line).
pub(crate) fn reported<'t>(text: &'t str, tag: &str) -> &'t str {
    text.lines()
        .find_map(|l| l.split_once(tag).map(|(_, v)| v.trim()))
        .unwrap_or_else(|| panic!("child printed no {tag:?}: {text}"))
}

/// A random valid configuration of 1..=3 bandwidths, mostly with values where the Lua fast
/// path applies, sometimes not.
pub(crate) fn random_config(rng: &mut impl Rng) -> BucketConfiguration {
    let n = rng.random_range(1..=3);
    let mut builder = BucketConfiguration::builder();
    for _ in 0..n {
        let big = rng.random_bool(0.05);
        let capacity = if big {
            rng.random_range(1u64..=i64::MAX as u64)
        } else {
            rng.random_range(1u64..=10_000)
        };
        let period = if rng.random_bool(0.5) {
            rng.random_range(1u64..=1_000_000_000_000)
        } else {
            rng.random_range(1u64..=10_000)
        };
        let tokens = rng.random_range(1..=period.min(capacity.saturating_mul(3)).min(1 << 40));
        let b = Bandwidth::builder().capacity(capacity);
        let b = if rng.random_bool(0.6) {
            b.refill_greedy(tokens, Duration::from_nanos(period))
        } else {
            b.refill_intervally(tokens, Duration::from_nanos(period))
        };
        let b = if rng.random_bool(0.2) {
            b.initial_tokens(rng.random_range(0..=capacity))
        } else {
            b
        };
        builder = builder.add_bandwidth(b.build().unwrap());
    }
    builder.build().unwrap()
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum RandomOp {
    TryConsume(u64),
    Probe(u64),
    Estimate(u64),
    AsMuch(Option<u64>),
    Add(u64),
    Force(u64),
    Reset,
    Available,
    Ignoring(u64),
    Reserve(u64, u64),
}

pub(crate) fn random_op(rng: &mut impl Rng) -> RandomOp {
    let n = if rng.random_bool(0.9) {
        rng.random_range(1..=200)
    } else {
        rng.random_range(1..=1u64 << 40)
    };
    match rng.random_range(0..10) {
        0 => RandomOp::TryConsume(n),
        1 => RandomOp::Probe(n),
        2 => RandomOp::Estimate(n),
        3 => RandomOp::AsMuch(rng.random_bool(0.5).then_some(n)),
        4 => RandomOp::Add(n),
        5 => RandomOp::Force(n),
        6 => RandomOp::Reset,
        7 => RandomOp::Available,
        8 => RandomOp::Ignoring(n),
        _ => RandomOp::Reserve(n, rng.random_range(1..=u64::MAX)),
    }
}

/// The result of an operation, comparable across the core and the remote bucket.
pub(crate) fn core_result(
    op: RandomOp,
    c: &BucketConfiguration,
    s: &mut BucketState,
    now: i64,
) -> String {
    let r = match op {
        RandomOp::TryConsume(n) => s
            .apply(c, now, &ops::TryConsume(n))
            .map(|v| format!("{v:?}")),
        RandomOp::Probe(n) => s
            .apply(c, now, &ops::TryConsumeAndReturnRemaining(n))
            .map(|v| format!("{v:?}")),
        RandomOp::Estimate(n) => s
            .apply(c, now, &ops::EstimateAbilityToConsume(n))
            .map(|v| format!("{v:?}")),
        RandomOp::AsMuch(l) => s
            .apply(c, now, &ops::TryConsumeAsMuchAsPossible(l))
            .map(|v| format!("{v:?}")),
        RandomOp::Add(n) => s
            .apply(c, now, &ops::AddTokens(n))
            .map(|v| format!("{v:?}")),
        RandomOp::Force(n) => s
            .apply(c, now, &ops::ForceAddTokens(n))
            .map(|v| format!("{v:?}")),
        RandomOp::Reset => s.apply(c, now, &ops::Reset).map(|v| format!("{v:?}")),
        RandomOp::Available => s
            .apply(c, now, &ops::AvailableTokens)
            .map(|v| format!("{v:?}")),
        RandomOp::Ignoring(n) => s
            .apply(c, now, &ops::ConsumeIgnoringRateLimits(n))
            .map(|v| format!("{v:?}")),
        RandomOp::Reserve(n, w) => s
            .apply(
                c,
                now,
                &ops::Reserve {
                    tokens: n,
                    max_wait_nanos: w,
                },
            )
            .map(|v| format!("{v:?}")),
    };
    match r {
        Ok(v) => v,
        Err(e) => format!("error: {e}"),
    }
}

pub(crate) async fn remote_result<B: bucket4rs_distributed::Backend>(
    op: RandomOp,
    b: &bucket4rs_distributed::RemoteBucket<B>,
) -> String {
    fn show<T: std::fmt::Debug>(r: Result<T, DistributedError>) -> String {
        match r {
            Ok(v) => format!("{v:?}"),
            Err(DistributedError::Operation(e)) => format!("error: {e}"),
            // Reported, not panicked on: the caller's comparison names the case.
            Err(e) => format!("backend failure: {e}"),
        }
    }
    match op {
        RandomOp::TryConsume(n) => show(b.try_consume(n).await),
        RandomOp::Probe(n) => show(b.try_consume_and_return_remaining(n).await),
        RandomOp::Estimate(n) => show(b.estimate_ability_to_consume(n).await),
        RandomOp::AsMuch(None) => show(b.try_consume_as_much_as_possible().await),
        RandomOp::AsMuch(Some(l)) => show(b.try_consume_as_much_as_possible_with_limit(l).await),
        RandomOp::Add(n) => show(b.add_tokens(n).await),
        RandomOp::Force(n) => show(b.force_add_tokens(n).await),
        RandomOp::Reset => show(b.reset().await),
        RandomOp::Available => show(b.available_tokens().await),
        RandomOp::Ignoring(n) => show(b.consume_ignoring_rate_limits(n).await.map(nanos)),
        RandomOp::Reserve(n, w) => show(
            b.reserve(n, Duration::from_nanos(w))
                .await
                .map(|r| r.map(nanos)),
        ),
    }
}

/// [`remote_result`] through the verbose view: the answer, with the clock reading it was
/// computed at (`None` for an error: no reading comes back).
pub(crate) async fn remote_verbose_result<B: Backend>(
    op: RandomOp,
    b: &RemoteBucket<B, bucket4rs_core::Verbose>,
) -> (String, Option<i64>) {
    fn show<T: std::fmt::Debug>(
        r: Result<bucket4rs_core::VerboseResult<T>, DistributedError>,
    ) -> (String, Option<i64>) {
        match r {
            Ok(v) => (format!("{:?}", v.value()), Some(v.now_nanos())),
            Err(DistributedError::Operation(e)) => (format!("error: {e}"), None),
            Err(e) => (format!("backend failure: {e}"), None),
        }
    }
    match op {
        RandomOp::TryConsume(n) => show(b.try_consume(n).await),
        RandomOp::Probe(n) => show(b.try_consume_and_return_remaining(n).await),
        RandomOp::Estimate(n) => show(b.estimate_ability_to_consume(n).await),
        RandomOp::AsMuch(None) => show(b.try_consume_as_much_as_possible().await),
        RandomOp::AsMuch(Some(l)) => show(b.try_consume_as_much_as_possible_with_limit(l).await),
        RandomOp::Add(n) => show(b.add_tokens(n).await),
        RandomOp::Force(n) => show(b.force_add_tokens(n).await),
        RandomOp::Reset => show(b.reset().await),
        RandomOp::Available => show(b.available_tokens().await),
        RandomOp::Ignoring(n) => show(
            b.consume_ignoring_rate_limits(n)
                .await
                .map(|v| v.map(nanos)),
        ),
        RandomOp::Reserve(n, w) => show(
            b.reserve(n, Duration::from_nanos(w))
                .await
                .map(|v| v.map(|r| r.map(nanos))),
        ),
    }
}

/// Sends `ops` on `bucket` at once, in order (the first goes alone, the others queue behind it
/// and go as batches), and returns what each caller got, together with what the core gives
/// applying them one by one to `state` (which it advances) at `now`.
pub(crate) async fn concurrent_and_core<B: Backend>(
    ops: &[RandomOp],
    bucket: &RemoteBucket<B>,
    config: &BucketConfiguration,
    state: &mut BucketState,
    now: i64,
) -> (Vec<String>, Vec<String>) {
    let expected = ops
        .iter()
        .map(|op| core_result(*op, config, state, now))
        .collect();
    let got = join_in_order(
        ops.iter()
            .map(|op| {
                Box::pin(remote_result(*op, bucket))
                    as std::pin::Pin<Box<dyn std::future::Future<Output = String>>>
            })
            .collect(),
    )
    .await;
    (got, expected)
}

/// Polls `futures` to completion, each first poll in order: the first one starts (and, on a
/// remote backend, goes in flight) before the second is polled, and so on. Their outputs, in
/// order.
pub(crate) async fn join_in_order<T>(
    futures: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = T> + '_>>>,
) -> Vec<T> {
    let mut futures = futures;
    let mut out: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|o| o.expect("every future completed"))
        .collect()
}

/// After the backend's server restarted: consumes one token at a time from `b` (whose
/// capacity is `capacity`, `granted` of them granted before) until it is empty, within
/// `deadline`, and accounts for every token exactly.
///
/// `stored` reads `b`'s record straight from the server (`None` while it cannot be
/// reached). Before the first call it must hold what was not granted (the state
/// survived the restart, nothing granted twice). A call that fails may still have consumed
/// (a timeout after its request was sent): after each failure, once the server answers and
/// any request still in flight has landed, the stored tokens say whether it did. In the
/// end every token is either granted or taken by such a call, and none twice.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) async fn drain_after_restart<B, F, Fut>(
    b: &RemoteBucket<B>,
    capacity: u64,
    mut granted: u64,
    deadline: std::time::Instant,
    stored: F,
) where
    B: Backend,
    F: Fn() -> Fut,
    Fut: core::future::Future<Output = Option<Vec<u8>>>,
{
    // The tokens of the stored record.
    let stored_now = async || loop {
        if let Some(bytes) = stored().await {
            let record = bucket4rs_distributed::format::decode(&bytes).unwrap();
            return u64::try_from(record.state.bandwidths()[0].tokens()).unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not come back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        stored_now().await,
        capacity - granted,
        "state lost in the restart"
    );
    // Calls that failed after they had consumed.
    let mut taken_by_failures = 0;
    loop {
        match b.try_consume(1).await {
            Ok(true) => granted += 1,
            Ok(false) => break,
            Err(e) => {
                assert!(e.is_unavailable(), "{e}");
                assert!(std::time::Instant::now() < deadline, "no recovery: {e}");
                // Until a request sent before the timeout has been applied: two readings
                // 300 ms apart that agree (a loaded machine can hold a request back longer).
                tokio::time::sleep(Duration::from_millis(200)).await;
                let mut left = stored_now().await;
                loop {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let again = stored_now().await;
                    if again == left {
                        break;
                    }
                    left = again;
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the state kept moving"
                    );
                }
                let expected = capacity - granted - taken_by_failures;
                assert!(
                    left == expected || left + 1 == expected,
                    "{left} tokens stored after a failed call, {expected} expected"
                );
                taken_by_failures += expected - left;
            }
        }
    }
    assert_eq!(
        granted + taken_by_failures,
        capacity,
        "{granted} granted, {taken_by_failures} taken by failed calls"
    );
    assert_eq!(stored_now().await, 0);
}

/// What a listener heard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Consumed(u64),
    Rejected(u64),
    Delayed(u64),
    BeforeParking(u64),
    Parked(u64),
    Interrupted,
}

/// A listener that records every event, in order.
#[derive(Debug, Default)]
pub(crate) struct Recorder(std::sync::Mutex<Vec<Event>>);

impl Recorder {
    fn push(&self, e: Event) {
        self.0.lock().unwrap().push(e);
    }

    pub(crate) fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }

    /// How many events `pick` selects, and the sum of the numbers it picks out of them.
    pub(crate) fn tally(&self, pick: impl Fn(&Event) -> Option<u64>) -> (usize, u64) {
        let picked: Vec<u64> = self.events().iter().filter_map(pick).collect();
        (picked.len(), picked.iter().sum())
    }
}

impl bucket4rs_core::BucketListener for Recorder {
    fn on_consumed(&self, tokens: u64) {
        self.push(Event::Consumed(tokens));
    }
    fn on_rejected(&self, tokens: u64) {
        self.push(Event::Rejected(tokens));
    }
    fn on_delayed(&self, nanos: u64) {
        self.push(Event::Delayed(nanos));
    }
    fn on_before_parking(&self, nanos: u64) {
        self.push(Event::BeforeParking(nanos));
    }
    fn on_parked(&self, nanos: u64) {
        self.push(Event::Parked(nanos));
    }
    fn on_interrupted(&self) {
        self.push(Event::Interrupted);
    }
}

/// Waiting calls dropped before their wait ends give back exactly what they reserved, on
/// `backend` (a manager of its own on a client clock that never moves, so nothing refills):
/// 20 tokens, 15 consumed, then six waiting calls of 2 (`consume` and `try_consume_within`
/// in turn), each dropped after 100 ms. The first two are served at once; the four others
/// reserve (into debt) and wait, are dropped mid-wait, and must give their 2 tokens back:
/// 1 token left. A future dropped before its first poll takes nothing. The listener hears
/// the local async view's events. Returns how long the refunds took to land.
pub(crate) async fn dropped_waits_give_back_what_they_reserved<B: Backend>(
    backend: B,
    prefix: &str,
) -> Duration {
    let manager = ProxyManager::configure(backend)
        .key_prefix(prefix)
        .time_source(TimeSource::client(ManualClock::new(1_000_000_000)))
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let heard = std::sync::Arc::new(Recorder::default());
    // 1 token per 1,000 s: a wait for 1 token is 1,000 s.
    let b = manager
        .builder()
        .with_listener(std::sync::Arc::clone(&heard))
        .build("dropped-waits", || simple(20, Duration::from_secs(20_000)))
        .unwrap();
    let never_polled = b.consume(3);
    drop(never_polled);
    assert_eq!(
        b.available_tokens().await.unwrap(),
        20,
        "an unpolled future took nothing"
    );
    assert_eq!(b.consume(15).await.unwrap(), Duration::ZERO);
    let mut served = 0;
    let mut dropped = 0;
    for i in 0..6 {
        let limit = Duration::from_millis(100);
        let outcome = if i % 2 == 0 {
            tokio::time::timeout(limit, b.consume(2))
                .await
                .map(|r| r.map(|w| w.is_zero()))
        } else {
            tokio::time::timeout(limit, b.try_consume_within(2, Duration::from_secs(86_400))).await
        };
        match outcome {
            Ok(r) => {
                assert!(r.unwrap(), "call {i}: served at once");
                served += 1;
            }
            Err(_) => dropped += 1,
        }
    }
    assert_eq!((served, dropped), (2, 4));
    // Refused at once: takes nothing, waits for nothing.
    assert!(
        !b.try_consume_within(2, Duration::from_millis(1))
            .await
            .unwrap()
    );
    // The refunds are tasks of their own: wait until they landed, then make sure nothing more
    // comes back.
    let started = std::time::Instant::now();
    loop {
        let left = b.available_tokens().await.unwrap();
        if left == 1 {
            break;
        }
        assert!(left < 1, "more given back than was reserved: {left}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the refunds did not land: {left} tokens, 1 expected"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.available_tokens().await.unwrap(), 1, "given back once");
    let consumed = heard.tally(|e| match e {
        Event::Consumed(n) => Some(*n),
        _ => None,
    });
    let rejected = heard.tally(|e| match e {
        Event::Rejected(n) => Some(*n),
        _ => None,
    });
    let delayed = heard.tally(|e| match e {
        Event::Delayed(n) => Some(*n),
        _ => None,
    });
    let interrupted = heard.tally(|e| (*e == Event::Interrupted).then_some(0));
    assert_eq!(consumed, (7, 15 + 6 * 2), "{:?}", heard.events());
    assert_eq!(rejected, (1, 2), "{:?}", heard.events());
    // One wait per reservation into debt (how long depends on whether the refund of the
    // one before landed first).
    assert_eq!(delayed.0, 4, "{:?}", heard.events());
    assert_eq!(interrupted.0, 4, "{:?}", heard.events());
    took
}

/// The boundary differential of the exact arithmetic (issue 33): clock readings and last
/// refills at the edges of the range that doubles hold exactly (2^53 ns and around, ±2^32
/// around it, the clock's extremes), for every backend to compare with the core.
pub(crate) mod boundary {
    use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, BucketState, RefillKind};
    use std::time::Duration;

    use super::RandomOp;

    const P53: i64 = 1 << 53;
    const P32: i64 = 1 << 32;

    /// Fails with the first few of `failures` (of `of` cases), if any.
    pub(crate) fn report(failures: &[String], of: usize) {
        assert!(
            failures.is_empty(),
            "{} of {of} cases differ from the core; the first:\n{}",
            failures.len(),
            failures[..failures.len().min(12)].join("\n")
        );
    }

    /// Client clock readings: around ±2^53 (±1, ±2^32 ± 1) and the extremes of the clock.
    pub(crate) fn readings() -> Vec<i64> {
        let mut v = vec![0, 1, -1, i64::MAX, i64::MAX - 1, i64::MIN + 1, i64::MIN + 2];
        for base in [P53, -P53] {
            for d in [-P32 - 1, -P32, -P32 + 1, -1, 0, 1, P32 - 1, P32, P32 + 1] {
                v.push(base + d);
            }
        }
        v
    }

    /// Distances of a last refill before a reading (a negative one: after it): 2^53 and
    /// around, 2^53 ± 2^32 and around, and far beyond.
    pub(crate) fn distances() -> Vec<i64> {
        let mut v = vec![
            0,
            1,
            P32 - 1,
            P32,
            P32 + 1,
            1 << 52,
            1 << 54,
            1 << 62,
            i64::MAX,
        ];
        for base in [P53 - P32, P53, P53 + P32] {
            for d in [-1, 0, 1] {
                v.push(base + d);
            }
        }
        let after: Vec<i64> = v.iter().filter(|&&d| d != 0).map(|&d| -d).collect();
        v.extend(after);
        v
    }

    /// The configurations: the (10 tokens, one a second, greedy), interval refill, a
    /// fast greedy refill with a period not a multiple of its tokens, and two bandwidths.
    pub(crate) fn configs() -> Vec<BucketConfiguration> {
        let one = |b: Bandwidth| {
            BucketConfiguration::builder()
                .add_bandwidth(b)
                .build()
                .unwrap()
        };
        let greedy = Bandwidth::simple(10, Duration::from_secs(10)).unwrap();
        let interval = Bandwidth::builder()
            .capacity(10)
            .refill_intervally(3, Duration::from_secs(7))
            .build()
            .unwrap();
        let fast = Bandwidth::builder()
            .capacity(1_000_000)
            .refill_greedy(999_983, Duration::from_nanos(1_000_003))
            .build()
            .unwrap();
        vec![
            one(greedy.clone()),
            one(interval.clone()),
            one(fast),
            BucketConfiguration::builder()
                .add_bandwidth(greedy)
                .add_bandwidth(interval)
                .build()
                .unwrap(),
        ]
    }

    /// A valid state of `config` last refilled at `last_refill`: full, one short (consume 1,
    /// add 1 and the like), empty with a remainder, or in debt (variant modulo 4).
    pub(crate) fn state(
        config: &BucketConfiguration,
        last_refill: i64,
        variant: usize,
    ) -> BucketState {
        let bandwidths = config
            .bandwidths()
            .iter()
            .map(|b| {
                let c = i64::try_from(b.capacity()).unwrap();
                let p = i64::try_from(b.refill_period().as_nanos()).unwrap();
                let greedy = b.refill_kind() == RefillKind::Greedy;
                let (tokens, remainder) = match variant % 4 {
                    0 => (c, 0),
                    1 => (c - 1, if greedy { p / 2 } else { 0 }),
                    2 => (0, if greedy { p - 1 } else { 0 }),
                    _ => (-5, 0),
                };
                BandwidthState::from_parts(last_refill, tokens, remainder)
            })
            .collect();
        let state = BucketState::from_bandwidths(bandwidths);
        state.check(config).unwrap();
        state
    }

    /// The operations: consumption, probes with waits, reservations (at once, within a wait,
    /// beyond it), additions, reads.
    pub(crate) fn ops() -> Vec<RandomOp> {
        vec![
            RandomOp::TryConsume(1),
            RandomOp::Probe(3),
            RandomOp::Estimate(25),
            RandomOp::AsMuch(None),
            RandomOp::AsMuch(Some(2)),
            RandomOp::Add(1),
            RandomOp::Force(5),
            RandomOp::Reset,
            RandomOp::Available,
            RandomOp::Ignoring(2),
            RandomOp::Reserve(3, u64::MAX),
            RandomOp::Reserve(12, 1_000_000_000),
            RandomOp::Reserve(40, 1 << 53),
            RandomOp::TryConsume(11),
        ]
    }

    /// One case: a configuration, a stored state, the client clock's reading and two
    /// operations made at it.
    #[derive(Clone)]
    pub(crate) struct Case {
        /// Which of [`configs`].
        pub(crate) config_no: usize,
        pub(crate) config: BucketConfiguration,
        pub(crate) state: BucketState,
        pub(crate) now: i64,
        pub(crate) ops: [RandomOp; 2],
    }

    impl std::fmt::Debug for Case {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "config #{} at {}, stored {:?}, then {:?}",
                self.config_no,
                self.now,
                self.state.bandwidths(),
                self.ops
            )
        }
    }

    /// Every reading × every distance in range × every configuration, with the state variants
    /// and operation pairs taken in turn.
    pub(crate) fn cases() -> Vec<Case> {
        let configs = configs();
        let ops = ops();
        let mut out = Vec::new();
        let mut n = 0usize;
        for now in readings() {
            for d in distances() {
                let Some(last_refill) = now.checked_sub(d) else {
                    continue;
                };
                for (config_no, config) in configs.iter().enumerate() {
                    n += 1;
                    out.push(Case {
                        config_no,
                        config: config.clone(),
                        state: state(config, last_refill, n / 3),
                        now,
                        ops: [ops[n % ops.len()], ops[(n / ops.len() + n) % ops.len()]],
                    });
                }
            }
        }
        out
    }
}

/// Issue 33's "Done when" under faults: clients that count the tokens of the calls that
/// succeeded, and the check that, once the in-doubt calls are settled, the tokens gone from the
/// bucket are exactly those (none charged for an error, none applied twice). The fault itself
/// (a flapping Redis, a PostgreSQL stopped immediately) is the caller's.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) mod charged {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use bucket4rs_distributed::{Backend, DistributedError, RemoteBucket};

    /// What calls came to.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub(crate) struct Tally {
        /// Calls that returned `Ok(true)`.
        pub(crate) ok: u64,
        /// The tokens of those calls: all the bucket may lose.
        pub(crate) tokens: u64,
        /// Calls that returned an error.
        pub(crate) errors: u64,
        /// Of those, the ones in doubt ([`DistributedError::is_in_doubt`]).
        pub(crate) in_doubt: u64,
    }

    impl Tally {
        pub(crate) fn add(&mut self, other: Tally) {
            self.ok += other.ok;
            self.tokens += other.tokens;
            self.errors += other.errors;
            self.in_doubt += other.in_doubt;
        }

        fn count(&mut self, tokens: u64, r: &Result<bool, DistributedError>) {
            match r {
                Ok(granted) => {
                    // The buckets of these tests are far larger than the calls can take.
                    assert!(
                        granted,
                        "a bucket that cannot run out refused {tokens} tokens"
                    );
                    self.ok += 1;
                    self.tokens += tokens;
                }
                Err(e) => {
                    // An outage, never a wrong answer (an unreadable record, a bad argument).
                    assert!(e.is_unavailable(), "not an outage's error: {e:?}");
                    self.errors += 1;
                    self.in_doubt += u64::from(e.is_in_doubt());
                }
            }
        }
    }

    /// One client: `try_consume(k)` on `bucket` in a loop, `k` going round 1..=5 from `first`,
    /// until `stop` is set. A call that fails is followed by a short pause, so that a backend
    /// refusing connections is not spun on.
    pub(crate) async fn client<B: Backend>(
        bucket: RemoteBucket<B>,
        first: u64,
        stop: Arc<AtomicBool>,
    ) -> Tally {
        let mut tally = Tally::default();
        let mut k = first;
        while !stop.load(Ordering::Relaxed) {
            let tokens = k % 5 + 1;
            k += 1;
            let r = bucket.try_consume(tokens).await;
            tally.count(tokens, &r);
            if r.is_err() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        tally
    }

    /// Runs one [`client`] per bucket (each of its own manager, as processes of their own
    /// would be) until `stop` is set; their tally.
    pub(crate) async fn clients<B: Backend>(
        buckets: &[RemoteBucket<B>],
        stop: &Arc<AtomicBool>,
    ) -> Tally {
        let tasks: Vec<_> = buckets
            .iter()
            .zip(0..)
            .map(|(b, first)| tokio::spawn(client(b.clone(), first, Arc::clone(stop))))
            .collect();
        let mut tally = Tally::default();
        for t in tasks {
            tally.add(t.await.expect("a client task"));
        }
        tally
    }

    /// Every bucket (every manager) makes one call of 1 token that succeeds, retried until it
    /// does (by `by`, else the backend did not come back); the calls are counted in `tally`.
    pub(crate) async fn round<B: Backend>(
        buckets: &[RemoteBucket<B>],
        tally: &mut Tally,
        by: Instant,
    ) {
        for b in buckets {
            loop {
                let r = b.try_consume(1).await;
                tally.count(1, &r);
                match r {
                    Ok(_) => break,
                    Err(e) => {
                        assert!(
                            Instant::now() < by,
                            "no call succeeded after the fault: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    }

    /// The tokens gone from a bucket of `capacity` tokens (read through `bucket`, retried
    /// until the backend answers, by `by`).
    pub(crate) async fn gone<B: Backend>(
        bucket: &RemoteBucket<B>,
        capacity: u64,
        by: Instant,
    ) -> u64 {
        loop {
            match bucket.available_tokens().await {
                Ok(left) => {
                    let left = u64::try_from(left).expect("no debt in these tests");
                    return capacity - left;
                }
                Err(e) => {
                    assert!(Instant::now() < by, "no reading after the fault: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// After the fault: gives the settlement of the in-doubt calls up to `within` — rounds of
    /// one successful call on every manager (the next round trip for the key, on which a
    /// manager settles what it left in doubt), then a reading of the tokens gone, 100 ms
    /// apart — until two rounds in a row find the tokens gone equal to the tokens of the calls
    /// that succeeded (also the rounds' own, added to `tally`), or the time is up. The tokens
    /// gone at the last reading, for the caller to compare with `tally.tokens`.
    pub(crate) async fn settle<B: Backend>(
        buckets: &[RemoteBucket<B>],
        capacity: u64,
        tally: &mut Tally,
        within: Duration,
    ) -> u64 {
        let by = Instant::now() + within;
        // Reaching the backend again may take longer than settling does.
        let reachable_by = by + Duration::from_secs(10);
        let mut agreed = 0;
        loop {
            round(buckets, tally, reachable_by).await;
            let gone = gone(&buckets[0], capacity, reachable_by).await;
            agreed = if gone == tally.tokens { agreed + 1 } else { 0 };
            if agreed == 2 || Instant::now() >= by {
                return gone;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Leasing across real processes (the Redis and PostgreSQL tests): children of the test
/// binary drain one key with leasing on, or die holding a lease.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) mod leased {
    use std::io::{BufRead, BufReader};
    use std::time::Duration;

    use bucket4rs_core::BucketConfiguration;
    use bucket4rs_distributed::{Backend, Leasing, ProxyManager};

    use super::{epoch_ms, simple};

    /// The key's tokens (no whole token refills within a test: K per 10^6 s, a period the
    /// Redis script computes with).
    pub(crate) const K: u64 = 20_000;

    /// 4 processes holding at most 20 % of the key together.
    pub(crate) fn leasing() -> Leasing {
        Leasing::new().processes(4).max_held_percent(20)
    }

    pub(crate) fn config() -> BucketConfiguration {
        simple(K, Duration::from_secs(1_000_000))
    }

    /// Tokens that may sit unused in the 4 processes' leases.
    pub(crate) fn bound() -> u64 {
        4 * leasing().lease_cap(K)
    }

    /// A child's part: from epoch millisecond `start_ms`, 4 tasks take one token at a time
    /// from `hot` until refused; then its leases go back. Prints `GRANTED n` and `HELD n`
    /// (tokens in its leases when the tasks stopped).
    pub(crate) async fn drain<B: Backend>(manager: &ProxyManager<B>, start_ms: u128) {
        let now_ms = epoch_ms();
        if start_ms > now_ms {
            tokio::time::sleep(Duration::from_millis((start_ms - now_ms) as u64)).await;
        }
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let b = manager.builder().build("hot", config).unwrap();
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while b.try_consume(1).await.unwrap() {
                    n += 1;
                }
                n
            }));
        }
        let mut granted = 0;
        for t in tasks {
            granted += t.await.unwrap();
        }
        let held = manager.leased_tokens();
        manager.release_leases().await.unwrap();
        println!("GRANTED {granted}");
        println!("HELD {held}");
    }

    /// A doomed child's part: takes 500 tokens of `hot`, prints `GRANTED 500` and
    /// `LEASED n` (its lease), then waits to be killed.
    pub(crate) async fn doomed<B: Backend>(manager: &ProxyManager<B>) {
        let b = manager.builder().build("hot", config).unwrap();
        for _ in 0..500 {
            assert!(b.try_consume(1).await.unwrap());
        }
        println!("GRANTED 500");
        println!("LEASED {}", manager.leased_tokens());
        tokio::time::sleep(Duration::from_secs(600)).await;
    }

    /// Runs `test` of this binary as a doomed child (`env` set to `value`), kills it with
    /// SIGKILL once it has printed its lease, and returns (granted, leased).
    pub(crate) fn kill_doomed(test: &str, env: &str, value: &str) -> (u64, u64) {
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(env, value)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut granted = None;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let leased = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("the doomed child ended: {:?}", child.wait()))
                .unwrap();
            if let Some((_, n)) = line.split_once("GRANTED ") {
                granted = Some(n.trim().parse().unwrap());
            }
            if let Some((_, n)) = line.split_once("LEASED ") {
                break n.trim().parse().unwrap();
            }
        };
        child.kill().unwrap();
        child.wait().unwrap();
        (
            granted.expect("the child printed what it was granted"),
            leased,
        )
    }
}
