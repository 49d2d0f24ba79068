//! Faults of the Redis backend, each against a redis-server of the test's own on a free
//! loopback port (never the shared one): frozen, killed, restarted, refusing connections, out
//! of memory, holding corrupt records. Each test prints what it measured (`fault: …`).

use std::time::{Duration, Instant};

use bucket4rs_core::{Bandwidth, BucketConfiguration, ManualClock};
use bucket4rs_distributed::{
    Backend, BackendErrorKind, CircuitBreaker, DistributedError, ProxyManager, RedisBackend,
    RedisOptions, RetryPolicy, TimeSource, format,
};
use redis::AsyncCommands;

use crate::common::multi_thread_runtime as runtime;
use crate::common::{patient, simple, unique_prefix};

/// A redis-server of our own on a free loopback port (never the shared one), with an
/// append-only file fsynced on every write so a restart keeps every acknowledged write.
/// Killed on drop (also when frozen, also on a panic).
pub(crate) struct OwnRedis {
    pub(crate) port: u16,
    pub(crate) dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl OwnRedis {
    /// A server on `port` (a free one if `None`) keeping its files in `dir` (a fresh one if
    /// `None`), with `extra` arguments; waits until it accepts connections.
    pub(crate) fn start(port: Option<u16>, dir: Option<std::path::PathBuf>) -> Self {
        Self::start_with(port, dir, &[])
    }

    pub(crate) fn start_with(
        port: Option<u16>,
        dir: Option<std::path::PathBuf>,
        extra: &[&str],
    ) -> Self {
        let port = port.unwrap_or_else(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        });
        let dir = dir.unwrap_or_else(|| {
            let d = std::env::temp_dir().join(unique_prefix("redis-data"));
            std::fs::create_dir_all(&d).unwrap();
            d
        });
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed for the fault tests");
        let me = Self {
            port,
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "own redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill {sig} {pid} failed");
    }

    /// `kill -STOP`: the server holds every connection open and answers nothing.
    pub(crate) fn freeze(&self) {
        self.signal("-STOP");
    }

    /// `kill -CONT`.
    pub(crate) fn resume(&self) {
        self.signal("-CONT");
    }

    /// `kill -9` (SIGKILL), waited for.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A backend on `server`, retrying the first connection for a while (a server that has just
/// started on a loaded machine).
async fn connect(server: &OwnRedis, options: RedisOptions) -> RedisBackend {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match RedisBackend::connect(&server.url(), options.clone()).await {
            Ok(b) => return b,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "own redis-server did not answer: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn raw(server: &OwnRedis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("own redis-server at {} answers: {e}", server.url()))
}

/// The issue's plan, scaled down: 5 tokens per 400 ms, starting empty. Expiry at "full again
/// plus the margin" would recreate it empty after an idle spell and refuse a full bucket.
#[test]
fn fault_redis_idle_bucket_with_initial_tokens_below_capacity_keeps_its_tokens() {
    let server = OwnRedis::start(None, None);
    runtime().block_on(async {
        let manager = ProxyManager::configure(connect(&server, RedisOptions::default()).await)
            .ttl_margin(Duration::from_millis(100))
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let config = || {
            BucketConfiguration::builder()
                .add_bandwidth(
                    Bandwidth::builder()
                        .capacity(5)
                        .refill_greedy(5, Duration::from_millis(400))
                        .initial_tokens(0)
                        .build()
                        .unwrap(),
                )
                .build()
                .unwrap()
        };
        let b = manager.builder().build("idle", config).unwrap();
        assert!(!b.try_consume(1).await.unwrap(), "starts empty");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut first = 0;
        for _ in 0..3 {
            first += u32::from(b.try_consume(1).await.unwrap());
        }
        assert_eq!(first, 3, "full after one period");
        let mut raw = raw(&server).await;
        let pttl: i64 = raw.pttl(b.key().as_str()).await.unwrap();
        // Well past "full again (240 ms) plus the margin (100 ms)".
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let mut granted = 0;
        for _ in 0..5 {
            granted += u32::from(b.try_consume(1).await.unwrap());
        }
        println!(
            "fault: redis idle bucket, initial 0 < capacity 5: granted {granted} of 5 after 1 s idle (PTTL after the fast path: {pttl})"
        );
        assert_eq!(pttl, -1, "a record that cannot be recreated exactly has no expiry");
        assert_eq!(granted, 5);
    });
}

/// Calls that time out while Redis is frozen sit in its socket; on resume the script sees
/// that their deadline has passed and runs none of them: single operations and batches.
#[test]
fn fault_redis_frozen_calls_time_out_and_charge_nothing_after_resume() {
    let server = OwnRedis::start(None, None);
    runtime().block_on(async {
        let timeout = Duration::from_millis(200);
        // Every call must reach the frozen server: no circuit breaker answering for it.
        let strict = ProxyManager::configure(connect(&server, RedisOptions::default()).await)
            .timeout(timeout)
            .circuit_breaker(CircuitBreaker::off())
            .build()
            .unwrap();
        let lenient = patient(connect(&server, RedisOptions::default()).await);
        let config = || simple(100, Duration::from_secs(1_000_000));
        let keys = ["a", "b", "c"];
        for k in keys {
            let b = lenient.builder().build(k, config).unwrap();
            assert!(b.try_consume(10).await.unwrap());
        }
        // The strict client has talked to the server (and learnt its clock) before.
        let warm = strict.builder().build("warm", config).unwrap();
        assert!(warm.try_consume(1).await.unwrap());
        server.freeze();
        let mut calls = Vec::new();
        for k in keys {
            for _ in 0..8 {
                // Eight at once per key: the first goes alone, the others as one batch.
                let b = strict.builder().build(k, config).unwrap();
                calls.push(tokio::spawn(async move {
                    let t = Instant::now();
                    (b.try_consume(1).await, t.elapsed())
                }));
            }
        }
        let mut timed_out = 0;
        let mut slowest = Duration::ZERO;
        for c in calls {
            let (r, took) = c.await.unwrap();
            // At the deadline: in doubt when the command was sent (the backend's wait for
            // the reply, or the manager's timer with a batch in flight), not applied when it
            // was still queued behind its key's batch or its deadline passed before sending.
            let timed_out_here = match &r {
                Err(DistributedError::Timeout { .. }) => true,
                Err(DistributedError::Backend(e)) => matches!(
                    e.kind(),
                    BackendErrorKind::InDoubt | BackendErrorKind::Timeout
                ),
                _ => false,
            };
            assert!(timed_out_here, "a call to a frozen server: {r:?}");
            timed_out += 1;
            slowest = slowest.max(took);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.resume();
        // Let everything queued in the server's sockets run (or be refused).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut charged = 0;
        for k in keys {
            let b = lenient.builder().build(k, config).unwrap();
            charged += 90 - b.available_tokens().await.unwrap();
        }
        println!(
            "fault: redis frozen: {timed_out} calls timed out (slowest {slowest:?}), tokens charged after resume: {charged} (allowed 0)"
        );
        assert_eq!(charged, 0);
        // And the strict client works again.
        assert!(warm.try_consume(1).await.unwrap());
    });
}

/// The scripts themselves refuse a command past its deadline (on the server's clock): nothing
/// read, nothing written; and run it before.
#[test]
fn fault_redis_scripts_refuse_to_run_past_the_deadline() {
    let server = OwnRedis::start(None, None);
    runtime().block_on(async {
        let mut raw = raw(&server).await;
        let config = simple(10, Duration::from_secs(10));
        let record = format::encode(&config, &bucket4rs_core::BucketState::new(&config, 0));
        let _: () = raw.set("k", record.clone()).await.unwrap();
        let op = redis::Script::new(include_str!("../../src/lua/op.lua"));
        let cas = redis::Script::new(include_str!("../../src/lua/cas.lua"));
        let now_us = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros()
                .to_string()
        };
        let op_at = |deadline: &str| {
            let mut inv = op.prepare_invoke();
            inv.key("k");
            // try_consume(1) at client time 1 s, margin 0
            for a in ["1", "1", "0", "0", "1000000000", "0", "0", deadline] {
                inv.arg(a);
            }
            inv
        };
        let past = "1";
        let reply: Vec<redis::Value> = op_at(past).invoke_async(&mut raw).await.unwrap();
        assert_eq!(reply[0], redis::Value::Int(4), "{reply:?}");
        let stored: Vec<u8> = raw.get("k").await.unwrap();
        assert_eq!(stored, record, "nothing written past the deadline");
        let r: i64 = cas
            .key("k")
            .arg("1")
            .arg(record.clone())
            .arg(b"new".to_vec())
            .arg("")
            .arg(past)
            .invoke_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(r, -2);
        let stored: Vec<u8> = raw.get("k").await.unwrap();
        assert_eq!(stored, record, "no compare-and-set past the deadline");
        // A deadline a minute ahead on this host's clock (the server shares it here) runs.
        let later = (now_us().parse::<u128>().unwrap() + 60_000_000).to_string();
        let reply: Vec<redis::Value> = op_at(&later).invoke_async(&mut raw).await.unwrap();
        assert_eq!(reply[0], redis::Value::Int(1), "{reply:?}");
        let stored: Vec<u8> = raw.get("k").await.unwrap();
        assert_ne!(stored, record, "the consumption ran before the deadline");
        println!("fault: redis scripts past the deadline: op status 4, cas -2, record untouched");
    });
}

/// A record the client's decoder rejects is never rewritten by the script, and its TTL never
/// reset: every byte flipped (two ways), one byte appended, one removed.
#[test]
fn fault_redis_corrupt_records_are_never_rewritten() {
    let server = OwnRedis::start(None, None);
    runtime().block_on(async {
        let mut raw = raw(&server).await;
        let clock = ManualClock::new(1_700_000_000_000_000_000);
        let manager = ProxyManager::configure(connect(&server, RedisOptions::default()).await)
            .time_source(TimeSource::client(clock.clone()))
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        // Two bandwidths, one with an id and explicit initial tokens: every section of the
        // format (header, blocks, tail) is present.
        let config = BucketConfiguration::builder()
            .add_bandwidth(Bandwidth::simple(100, Duration::from_secs(100)).unwrap())
            .add_bandwidth(
                Bandwidth::builder()
                    .capacity(1_000)
                    .refill_greedy(1_000, Duration::from_secs(3_600))
                    .initial_tokens(1_000)
                    .id("hourly")
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let c2 = config.clone();
        let b = manager
            .builder()
            .build("corrupt", move || c2.clone())
            .unwrap();
        let key = b.key().as_str().to_owned();
        assert!(b.try_consume(1).await.unwrap());
        let valid: Vec<u8> = raw.get(&key).await.unwrap();
        let mut variants: Vec<Vec<u8>> = Vec::new();
        for i in 0..valid.len() {
            for mask in [0x01u8, 0xff] {
                let mut v = valid.clone();
                v[i] ^= mask;
                variants.push(v);
            }
        }
        let mut longer = valid.clone();
        longer.push(0);
        variants.push(longer);
        variants.push(valid[..valid.len() - 1].to_vec());
        const SENTINEL_MS: i64 = 900_000_000;
        let (mut rejected, mut rewritten, mut reset) = (0, 0, 0);
        for v in &variants {
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg(v.clone())
                .arg("PX")
                .arg(SENTINEL_MS)
                .query_async(&mut raw)
                .await
                .unwrap();
            let r = b.try_consume(1).await;
            let stored: Vec<u8> = raw.get(&key).await.unwrap();
            let pttl: i64 = raw.pttl(&key).await.unwrap();
            if let Err(e) = format::decode(v) {
                rejected += 1;
                assert!(
                    matches!(&r, Err(DistributedError::Format(f)) if *f == e),
                    "the caller gets the decoder's typed error {e:?}: {r:?}"
                );
                rewritten += usize::from(stored != *v);
                reset += usize::from(!(SENTINEL_MS - 60_000..=SENTINEL_MS).contains(&pttl));
            } else {
                // A record that still decodes is a valid (other) bucket: the call is answered.
                assert!(r.is_ok(), "{r:?}");
            }
        }
        println!(
            "fault: redis corrupt records: {} variants, {rejected} rejected by the decoder, {rewritten} rewritten, {reset} TTLs reset (allowed 0, 0)",
            variants.len()
        );
        assert!(rejected > variants.len() / 2, "{rejected}");
        assert_eq!((rewritten, reset), (0, 0));
    });
}

/// After `kill -9` and a restart on the same port, the first request succeeds: the ended
/// connection is replaced before anything is sent on it.
#[test]
fn fault_redis_first_request_after_a_restart_succeeds() {
    let mut server = OwnRedis::start(None, None);
    runtime().block_on(async {
        let manager = ProxyManager::configure(connect(&server, RedisOptions::default()).await)
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        assert!(b.try_consume(1).await.unwrap());
        let (port, dir) = (server.port, server.dir.clone());
        server.kill();
        let restarted = OwnRedis::start(Some(port), Some(dir));
        // The client notices the closed connection while idle (here: within this sleep).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = Instant::now();
        let first = b.try_consume(1).await;
        let took = t.elapsed();
        println!(
            "fault: redis restart: first request after kill -9 + restart: {first:?} in {took:?}"
        );
        assert!(first.unwrap());
        // The append-only file kept the state: 2 taken.
        assert_eq!(b.available_tokens().await.unwrap(), 98);
        drop(restarted);
    });
}

/// A backend created while its server is down (nothing listens on the port): created at
/// once, its calls fail at once with a retryable `Unavailable`, and once a server starts on
/// the port the calls succeed with no restart of the application, charging exactly once.
#[test]
fn fault_redis_backend_created_while_the_server_is_down_serves_once_it_starts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    runtime().block_on(async {
        let t = Instant::now();
        let backend = RedisBackend::connect(
            &format!("redis://127.0.0.1:{port}"),
            RedisOptions::default(),
        )
        .await
        .expect("created while the server is down");
        let created = t.elapsed();
        let manager = ProxyManager::configure(backend.clone())
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        let mut slowest = Duration::ZERO;
        for _ in 0..5 {
            let t = Instant::now();
            let e = backend.read(b.key()).await.unwrap_err();
            slowest = slowest.max(t.elapsed());
            assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
            assert!(e.is_retryable(), "nothing was sent: {e}");
        }
        let r = b.try_consume(1).await;
        assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
        let server = OwnRedis::start(Some(port), None);
        let started = Instant::now();
        let mut failed = 0;
        loop {
            match b.try_consume(1).await {
                Ok(granted) => {
                    assert!(granted);
                    break;
                }
                Err(e) if e.is_unavailable() && started.elapsed() < Duration::from_secs(10) => {
                    failed += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("no success 10 s after the server started: {e}"),
            }
        }
        let first = started.elapsed();
        println!(
            "fault: redis created while down: created in {created:?}; calls failed in at most {slowest:?} (retryable Unavailable); first success {first:?} after the server started ({failed} calls failed meanwhile)"
        );
        assert!(created < Duration::from_millis(100), "{created:?}");
        assert!(slowest < Duration::from_millis(100), "{slowest:?}");
        assert_eq!(b.available_tokens().await.unwrap(), 99);
        drop(server);
    });
}

/// With Redis refusing connections, each call fails promptly with a retryable `Unavailable`
/// (no reconnect backoff inside the backend): the manager's retry policy and timeout alone
/// decide how long a caller waits.
#[test]
fn fault_redis_refused_connections_fail_fast() {
    let mut server = OwnRedis::start(None, None);
    runtime().block_on(async {
        let backend = connect(&server, RedisOptions::default()).await;
        let single = ProxyManager::configure(backend.clone())
            .timeout(Duration::from_secs(1))
            .retry(RetryPolicy::new(1, Duration::from_millis(1), Duration::from_millis(1)))
            .build()
            .unwrap();
        let default = ProxyManager::configure(backend.clone())
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let config = || simple(100, Duration::from_secs(1_000_000));
        let b1 = single.builder().build("k", config).unwrap();
        let b2 = default.builder().build("k", config).unwrap();
        assert!(b1.try_consume(1).await.unwrap());
        let key = b1.key().clone();
        server.kill();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut backend_max = Duration::ZERO;
        let mut one_max = Duration::ZERO;
        let mut default_max = Duration::ZERO;
        let (mut backend_errors, mut one_results, mut default_results) =
            (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..10 {
            let t = Instant::now();
            backend_errors.push(backend.read(&key).await.unwrap_err());
            backend_max = backend_max.max(t.elapsed());
            let t = Instant::now();
            one_results.push(b1.try_consume(1).await);
            one_max = one_max.max(t.elapsed());
            let t = Instant::now();
            default_results.push(b2.try_consume(1).await);
            default_max = default_max.max(t.elapsed());
        }
        println!(
            "fault: redis refusing connections: time to error, backend call max {backend_max:?}, manager without retries max {one_max:?}, manager with the default retries max {default_max:?} (timeout 1 s)"
        );
        for e in &backend_errors {
            assert_eq!(e.kind(), BackendErrorKind::Unavailable, "{e}");
            assert!(e.is_retryable(), "nothing was sent: {e}");
        }
        for r in &one_results {
            assert!(
                matches!(r, Err(DistributedError::Backend(e)) if e.kind() == BackendErrorKind::Unavailable),
                "{r:?}"
            );
        }
        assert!(default_results.iter().all(|r| r.as_ref().is_err_and(|e| e.is_unavailable())));
        assert!(backend_max < Duration::from_millis(100), "{backend_max:?}");
        assert!(one_max < Duration::from_millis(100), "{one_max:?}");
    });
}

/// A full server (`maxmemory`, `noeviction`): calls get a typed error and change nothing;
/// once memory is freed they work again.
#[test]
fn fault_redis_out_of_memory_is_a_typed_error_and_changes_nothing() {
    let server = OwnRedis::start_with(
        None,
        None,
        &["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"],
    );
    runtime().block_on(async {
        let mut raw = raw(&server).await;
        let manager = ProxyManager::configure(connect(&server, RedisOptions::default()).await)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        assert!(b.try_consume(10).await.unwrap());
        let key = b.key().as_str().to_owned();
        let before: Vec<u8> = raw.get(&key).await.unwrap();
        // Fill it up until even a one-byte value is refused (a big value's own query buffer
        // counts while it is read: smaller and smaller chunks get to the limit).
        let (mut filled, mut chunk) = (0, 256 << 10);
        loop {
            let r: redis::RedisResult<()> =
                raw.set(format!("filler{filled}"), vec![b'x'; chunk]).await;
            match r {
                Ok(()) => filled += 1,
                Err(e) if chunk == 1 => {
                    assert_eq!(e.code(), Some("OOM"), "{e}");
                    break;
                }
                Err(e) => {
                    assert_eq!(e.code(), Some("OOM"), "{e}");
                    chunk /= 2;
                }
            }
            assert!(filled < 10_000, "maxmemory not enforced");
        }
        let mut errors = Vec::new();
        for _ in 0..5 {
            match b.try_consume(1).await {
                Err(DistributedError::Backend(e)) => errors.push(e.kind()),
                other => panic!("a full Redis must refuse: {other:?}"),
            }
        }
        let during: Vec<u8> = raw.get(&key).await.unwrap();
        assert_eq!(during, before, "nothing changed while out of memory");
        for i in 0..filled {
            let _: () = raw.del(format!("filler{i}")).await.unwrap();
        }
        let after = b.try_consume(1).await;
        let left = b.available_tokens().await;
        println!(
            "fault: redis out of memory: {} calls refused with {:?}, record unchanged; after freeing: {after:?}, {left:?} tokens left (expected 89)",
            errors.len(),
            errors[0]
        );
        assert!(errors.iter().all(|k| *k == BackendErrorKind::CapacityExhausted));
        assert!(after.unwrap());
        assert_eq!(left.unwrap(), 89);
    });
}

/// Timeouts that could only fail every call are refused up front.
#[test]
fn fault_redis_zero_timeouts_are_refused() {
    let server = OwnRedis::start(None, None);
    runtime().block_on(async {
        for options in [
            RedisOptions::default().response_timeout(Duration::ZERO),
            RedisOptions::default().connect_timeout(Duration::ZERO),
        ] {
            let e = RedisBackend::connect(&server.url(), options)
                .await
                .unwrap_err();
            println!("fault: redis zero timeout refused: {e}");
            assert_eq!(e.kind(), BackendErrorKind::Other);
            assert!(e.message().contains("above zero"), "{e}");
        }
    });
}

/// A server busy with a long-running script answers `BUSY` to everything else: the call runs
/// nothing, is retried (the command was refused, not run) until its timeout, and charges
/// nothing; once the script is killed, calls work.
#[test]
fn fault_redis_busy_server_is_retried_and_charges_nothing() {
    let server = OwnRedis::start_with(None, None, &["--busy-reply-threshold", "50"]);
    runtime().block_on(async {
        let backend = connect(&server, RedisOptions::default()).await;
        let manager = ProxyManager::configure(backend.clone())
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let b = manager
            .builder()
            .build("k", || simple(100, Duration::from_secs(1_000_000)))
            .unwrap();
        assert!(b.try_consume(10).await.unwrap());
        // A script that never ends, on a connection of its own (it never gets a reply).
        let mut blocker = raw(&server).await;
        let busy = tokio::spawn(async move {
            let r: redis::RedisResult<()> = redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query_async(&mut blocker)
                .await;
            r
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let key = b.key().clone();
        let direct = backend.read(&key).await.unwrap_err();
        let t = Instant::now();
        let r = b.try_consume(1).await;
        let took = t.elapsed();
        let mut killer = raw(&server).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("KILL")
            .query_async(&mut killer)
            .await
            .unwrap();
        assert!(busy.await.unwrap().is_err(), "the killed script fails");
        let left = b.available_tokens().await.unwrap();
        println!(
            "fault: redis busy (a script running): backend error {:?} retryable {}, call answered {r:?} after {took:?}; tokens after the script was killed: {left} (expected 90)",
            direct.kind(),
            direct.is_retryable()
        );
        assert_eq!(direct.kind(), BackendErrorKind::Unavailable, "{direct}");
        assert!(direct.is_retryable(), "{direct}");
        assert!(r.is_err_and(|e| e.is_unavailable()));
        assert_eq!(left, 90);
        assert!(b.try_consume(1).await.unwrap());
    });
}

/// Issue 33's "Done when", on Redis: a server stopped and resumed every 300 ms for 10 s
/// (`SIGSTOP`/`SIGCONT`) under 4 clients (4 managers, each with a backend of its own, as 4
/// processes would have) with a 250 ms timeout, each calling `try_consume(1..=5)` on one key
/// of a bucket that cannot run out (1,000,000 tokens, 1 back per hour: every token gone is
/// one a call took). A call whose reply was lost across a stop is in doubt; once the server
/// runs again and settlement has had its chance (every manager's next round trip for the key,
/// or a background task, within 5 s), the tokens gone must be exactly the tokens of the calls
/// that returned success, in every run (a key each). No circuit breaker: every call reaches
/// the stopped server and waits for its timeout, so as many calls as possible are in doubt.
#[test]
fn fault_redis_flapping_server_charges_only_successful_calls() {
    use crate::common::charged::{Tally, clients, round, settle};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    const CAPACITY: u64 = 1_000_000;
    const RUNS: usize = 3;
    const FLAPPING: Duration = Duration::from_secs(10);
    const HALF: Duration = Duration::from_millis(300);
    let timeout = Duration::from_millis(250);
    let server = OwnRedis::start(None, None);
    let rt = runtime();
    let managers: Vec<ProxyManager<RedisBackend>> = rt.block_on(async {
        let mut managers = Vec::new();
        for _ in 0..4 {
            let backend = connect(&server, RedisOptions::default().response_timeout(timeout)).await;
            managers.push(
                ProxyManager::configure(backend)
                    .timeout(timeout)
                    .circuit_breaker(CircuitBreaker::off())
                    .build()
                    .unwrap(),
            );
        }
        managers
    });
    // 1 token per hour: within the test nothing comes back.
    let config = || simple(CAPACITY, Duration::from_secs(3_600 * CAPACITY));
    let mut runs: Vec<(Tally, u64, u32)> = Vec::new();
    for run in 0..RUNS {
        let buckets: Vec<_> = managers
            .iter()
            .map(|m| {
                m.builder()
                    .build(format!("flapping-{run}"), config)
                    .unwrap()
            })
            .collect();
        let mut tally = Tally::default();
        // Every client has talked to the server before it first stops.
        rt.block_on(round(
            &buckets,
            &mut tally,
            Instant::now() + Duration::from_secs(10),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let (load, stops) = std::thread::scope(|s| {
            let flapper = s.spawn(|| {
                let until = Instant::now() + FLAPPING;
                let mut stops = 0;
                while Instant::now() < until {
                    server.freeze();
                    std::thread::sleep(HALF);
                    server.resume();
                    stops += 1;
                    std::thread::sleep(HALF);
                }
                stop.store(true, Ordering::Relaxed);
                stops
            });
            let load = rt.block_on(clients(&buckets, &stop));
            (load, flapper.join().expect("the flapper"))
        });
        tally.add(load);
        let gone = rt.block_on(settle(
            &buckets,
            CAPACITY,
            &mut tally,
            Duration::from_secs(5),
        ));
        println!(
            "fault: flapping: run {run}: {stops} stops in {FLAPPING:?}: {} calls ok, {} errors ({} in doubt), tokens gone {gone}, successful {}",
            tally.ok, tally.errors, tally.in_doubt, tally.tokens
        );
        runs.push((tally, gone, stops));
    }
    // Not vacuous: the server did stop, calls failed, and some of them in doubt.
    for (run, (tally, _, stops)) in runs.iter().enumerate() {
        assert!(*stops > 0, "run {run}: the server was never stopped");
        assert!(tally.errors > 0, "run {run}: no call failed: {tally:?}");
        assert!(
            tally.in_doubt > 0,
            "run {run}: no call was in doubt: {tally:?}"
        );
    }
    let wrong: Vec<String> = runs
        .iter()
        .enumerate()
        .filter(|(_, (tally, gone, _))| *gone != tally.tokens)
        .map(|(run, (tally, gone, _))| {
            format!(
                "run {run}: {gone} tokens gone, {} successful ({} in doubt)",
                tally.tokens, tally.in_doubt
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {RUNS} runs charged tokens for calls that failed (or applied one twice): {}",
        wrong.len(),
        wrong.join("; ")
    );
}

/// `RedisOptions::wait_for_replicas` that could only fail every write is refused by every
/// constructor, with a typed error and nothing connected.
#[test]
fn wait_for_replicas_that_can_only_fail_is_refused_at_construction() {
    runtime().block_on(async {
        let ms = Duration::from_millis;
        for (what, options) in [
            (
                "no replica",
                RedisOptions::default().wait_for_replicas(0, ms(50)),
            ),
            (
                "a zero timeout",
                RedisOptions::default().wait_for_replicas(1, ms(0)),
            ),
            (
                "a timeout as long as the response timeout",
                RedisOptions::default()
                    .response_timeout(ms(200))
                    .wait_for_replicas(1, ms(200)),
            ),
        ] {
            let errors = [
                RedisBackend::connect("redis://127.0.0.1:1", options.clone())
                    .await
                    .unwrap_err(),
                RedisBackend::connect_cluster(["redis://127.0.0.1:1"], options.clone())
                    .await
                    .unwrap_err(),
                RedisBackend::connect_sentinel(["redis://127.0.0.1:1"], "s", options.clone())
                    .await
                    .unwrap_err(),
            ];
            for e in errors {
                assert_eq!(e.kind(), BackendErrorKind::Other, "{what}: {e}");
                assert!(!e.is_retryable(), "{what}: {e}");
                assert!(e.message().contains("wait_for_replicas"), "{what}: {e}");
            }
        }
        let fine = RedisOptions::default().wait_for_replicas(2, Duration::from_millis(499));
        assert!(
            RedisBackend::connect("redis://127.0.0.1:1", fine)
                .await
                .is_ok()
        );
    });
}

/// A master with one replica that replicates as an ACL user of its own, and a backend
/// waiting for that replica (`wait_for_replicas(1, 200 ms)`): writes are granted while the
/// replica acknowledges them, each in one round trip as without the opt-in; once the
/// replica is cut off a write is in doubt (applied on the master, not granted) while reads
/// still answer at once (no WAIT); once it is back, the next call settles the one in doubt
/// (given back on the master, which survived) and is granted.
#[test]
fn waiting_for_a_replica_grants_only_writes_it_acknowledged() {
    let (user, pass) = crate::redis_sentinel::REPL_CREDENTIALS;
    let pass_arg = format!(">{pass}");
    let master = OwnRedis::start_with(
        None,
        None,
        &[
            "--user",
            user,
            "on",
            &pass_arg,
            "+psync",
            "+replconf",
            "+ping",
        ],
    );
    let port = master.port.to_string();
    let replica = OwnRedis::start_with(
        None,
        None,
        &[
            "--replicaof",
            "127.0.0.1",
            &port,
            "--masteruser",
            user,
            "--masterauth",
            pass,
        ],
    );
    let cli = crate::redis_cluster::cli;
    let by = Instant::now() + Duration::from_secs(20);
    while !cli(replica.port, &["INFO", "replication"]).contains("master_link_status:up") {
        assert!(Instant::now() < by, "the replica did not sync");
        std::thread::sleep(Duration::from_millis(20));
    }
    runtime().block_on(async {
        let wait = Duration::from_millis(200);
        let waiting = connect(&master, RedisOptions::default().wait_for_replicas(1, wait)).await;
        let plain = connect(&master, RedisOptions::default()).await;
        let prefix = unique_prefix("wait");
        let manager = |backend: &RedisBackend| {
            ProxyManager::configure(backend.clone())
                .key_prefix(prefix.as_str())
                .circuit_breaker(CircuitBreaker::off())
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap()
        };
        let config = || simple(100, Duration::from_secs(1_000_000));
        let b = manager(&waiting).builder().build("k", config).unwrap();
        let other = manager(&plain).builder().build("other", config).unwrap();
        let probe = manager(&plain).builder().build("k", config).unwrap();
        // Reads through the waiting backend, on a manager with no call in doubt to settle.
        let reader = manager(&waiting).builder().build("k", config).unwrap();
        // Connected, the servers' clocks read.
        assert_eq!(b.available_tokens().await.unwrap(), 100);
        assert_eq!(other.available_tokens().await.unwrap(), 100);
        let (w0, p0) = (waiting.stats().round_trips, plain.stats().round_trips);
        for _ in 0..10 {
            assert!(b.try_consume(1).await.unwrap());
            assert!(other.try_consume(1).await.unwrap());
        }
        let (w, p) = (
            waiting.stats().round_trips - w0,
            plain.stats().round_trips - p0,
        );
        assert_eq!((w, p), (10, 10), "one round trip per call, WAIT included");
        let key = b.key().as_str().to_owned();
        assert_eq!(
            cli(replica.port, &["EXISTS", &key]),
            "1",
            "granted: the replica has it"
        );

        tokio::task::block_in_place(|| {
            crate::failover::cut_replication(&cli, master.port, replica.port, user);
        });
        let t = Instant::now();
        let e = b.try_consume(1).await.unwrap_err();
        let write_took = t.elapsed();
        println!("wait for replicas, replica cut off: {e} (in {write_took:?})");
        assert!(e.is_in_doubt() && !e.is_retryable(), "{e}");
        assert!(e.to_string().contains("0 of the 1 replicas"), "{e}");
        assert!(
            write_took >= wait,
            "answered before the WAIT's timeout: {write_took:?}"
        );
        let t = Instant::now();
        assert_eq!(
            reader.available_tokens().await.unwrap(),
            89,
            "applied on the master"
        );
        let read_took = t.elapsed();
        assert!(
            read_took < wait,
            "a read waited for replicas: {read_took:?}"
        );

        cli(master.port, &["ACL", "SETUSER", user, "on"]);
        let by = Instant::now() + Duration::from_secs(20);
        while !cli(replica.port, &["INFO", "replication"]).contains("master_link_status:up") {
            assert!(Instant::now() < by, "the replica did not come back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The settlement of the call in doubt rides on this one.
        assert!(b.try_consume(1).await.unwrap());
        assert_eq!(
            probe.available_tokens().await.unwrap(),
            89,
            "given back, then one taken"
        );
        println!(
            "wait for replicas: {w} round trips for 10 calls (10 without); a write with the \
             replica cut off: in doubt after {write_took:?}; a read then: {read_took:?}"
        );
    });
}

/// A server that refuses the backend's credentials (a wrong password, none where one is
/// needed): every call fails at once with an `Unavailable` that is not retryable (the same
/// connection fails the same way until the configuration changes), naming the cause;
/// nothing is sent.
#[test]
fn refused_credentials_are_not_retryable() {
    let server = OwnRedis::start_with(None, None, &["--requirepass", "right"]);
    runtime().block_on(async {
        for (what, url) in [
            (
                "a wrong password",
                format!("redis://:wrong@127.0.0.1:{}", server.port),
            ),
            ("no password", server.url()),
        ] {
            let backend = RedisBackend::connect(&url, RedisOptions::default())
                .await
                .unwrap();
            let manager = ProxyManager::configure(backend.clone())
                .circuit_breaker(CircuitBreaker::off())
                .build()
                .unwrap();
            let b = manager
                .builder()
                .build("k", || simple(10, Duration::from_secs(60)))
                .unwrap();
            let e = b.try_consume(1).await.unwrap_err();
            println!("refused credentials, {what}: {e}");
            let DistributedError::Backend(be) = &e else {
                panic!("{what}: a backend error: {e}");
            };
            assert_eq!(be.kind(), BackendErrorKind::Unavailable, "{what}: {e}");
            assert!(!e.is_retryable(), "{what}: {e}");
            assert!(
                e.to_string().contains("refused the credentials"),
                "{what}: {e}"
            );
            assert_eq!(backend.stats().round_trips, 0, "{what}");
        }
    });
}
