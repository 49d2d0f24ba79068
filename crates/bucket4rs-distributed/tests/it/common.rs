//! The conformance engine shared by every backend.

use bucket4rs_core::{BucketConfiguration, Clock, ManualClock};
use bucket4rs_distributed::{Backend, DistributedError, ProxyManager, RemoteBucket, TimeSource};
use bucket4rs_test::{Engine, Op, outcome};
use serde_json::Value;
use tokio::runtime::Runtime;

/// A remote bucket driven through the trace replayer.
pub(crate) struct Remote<'r, B> {
    pub(crate) bucket: RemoteBucket<B>,
    pub(crate) clock: ManualClock,
    pub(crate) rt: &'r Runtime,
}

fn e(e: DistributedError) -> String {
    e.to_string()
}

impl<B: Backend> Engine for Remote<'_, B> {
    fn execute(&mut self, op: &Op) -> Result<Value, String> {
        let b = &self.bucket;
        self.rt.block_on(async {
            Ok(match op {
                Op::TryConsume(n) => Value::from(b.try_consume(*n).await.map_err(e)?),
                Op::TryConsumeAndReturnRemaining(n) => {
                    outcome::probe(&b.try_consume_and_return_remaining(*n).await.map_err(e)?)
                }
                Op::EstimateAbilityToConsume(n) => {
                    outcome::estimate(&b.estimate_ability_to_consume(*n).await.map_err(e)?)
                }
                Op::TryConsumeAsMuchAsPossible(None) => {
                    Value::from(b.try_consume_as_much_as_possible().await.map_err(e)?)
                }
                Op::TryConsumeAsMuchAsPossible(Some(l)) => Value::from(
                    b.try_consume_as_much_as_possible_with_limit(*l)
                        .await
                        .map_err(e)?,
                ),
                Op::AddTokens(n) => {
                    b.add_tokens(*n).await.map_err(e)?;
                    outcome::unit()
                }
                Op::ForceAddTokens(n) => {
                    b.force_add_tokens(*n).await.map_err(e)?;
                    outcome::unit()
                }
                Op::Reset => {
                    b.reset().await.map_err(e)?;
                    outcome::unit()
                }
                Op::AvailableTokens => Value::from(b.available_tokens().await.map_err(e)?),
                Op::ConsumeIgnoringRateLimits(n) => {
                    Value::from(b.consume_ignoring_rate_limits(*n).await.map_err(e)?)
                }
                Op::ReplaceConfiguration(c, s) => {
                    b.replace_configuration(c.clone(), *s).await.map_err(e)?;
                    outcome::unit()
                }
                Op::BlockingTryConsume {
                    tokens,
                    max_wait_nanos,
                } => {
                    let parked = b.reserve(*tokens, *max_wait_nanos).await.map_err(e)?;
                    if let Some(w) = parked {
                        self.clock.advance_nanos(w as i64);
                    }
                    outcome::blocking_try(parked)
                }
                Op::BlockingConsume(n) => {
                    let w = b.consume_ignoring_rate_limits(*n).await.map_err(e)?;
                    self.clock.advance_nanos(w as i64);
                    outcome::blocking(w)
                }
            })
        })
    }

    fn snapshot(&mut self) -> String {
        match self.rt.block_on(self.bucket.raw_record()) {
            Ok(Some(bytes)) => format!("{bytes:02x?}"),
            Ok(None) => "absent".into(),
            Err(err) => format!("error: {err}"),
        }
    }
}

/// Builds the engine for one trace on `backend`, with a manager on the trace's manual
/// clock; the bucket is materialised at the trace's start time.
pub(crate) fn build<'r, B: Backend>(
    rt: &'r Runtime,
    backend: B,
    prefix: &str,
    key: &str,
    config: BucketConfiguration,
    clock: ManualClock,
) -> Result<Remote<'r, B>, String> {
    config
        .check_clock(clock.is_wall_clock_based())
        .map_err(|e| e.to_string())?;
    let manager = ProxyManager::configure(backend)
        .key_prefix(prefix)
        .time_source(TimeSource::client(clock.clone()))
        .build()
        .map_err(e)?;
    let bucket = manager
        .builder()
        .build(key, move || config.clone())
        .map_err(e)?;
    rt.block_on(bucket.available_tokens()).map_err(e)?;
    Ok(Remote { bucket, clock, rt })
}

/// A current-thread runtime for a test.
pub(crate) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A prefix no other test (or earlier run) uses.
#[cfg(feature = "redis")]
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
        .add_limit(bucket4rs_core::Bandwidth::simple(capacity, period).expect("bandwidth"))
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
