//! The circuit breaker against a real, throwaway redis-server on a free loopback port
//! (never the shared one): killed so that connections are refused, then restarted on the
//! same port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bucket4rs_distributed::{CircuitBreaker, ProxyManager, RedisBackend, RedisOptions};

use crate::common::simple;
use crate::redis_faults::OwnRedis;

/// How long each of `n` calls of `b` takes to fail, in milliseconds.
async fn failures<B: bucket4rs_distributed::Backend>(
    b: &bucket4rs_distributed::RemoteBucket<B>,
    n: usize,
) -> Vec<f64> {
    let mut took = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let r = b.try_consume(1).await;
        took.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(r.as_ref().is_err_and(|e| e.is_unavailable()), "{r:?}");
    }
    took
}

fn range(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    format!("{min:.2}-{max:.2} ms")
}

#[test]
fn fault_breaker_fails_fast_while_redis_refuses_connections_and_recovers_after_restart() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut server = OwnRedis::start(None, None);
    let timeout = Duration::from_millis(300);
    let every = Duration::from_millis(100);
    let threshold = 5;
    rt.block_on(async {
        // A server that has just started on a loaded machine may need a few tries.
        let deadline = Instant::now() + Duration::from_secs(20);
        let backend = loop {
            let options = RedisOptions::default()
                .response_timeout(Duration::from_millis(200))
                .connect_timeout(Duration::from_millis(200));
            match RedisBackend::connect(&server.url(), options).await {
                Ok(b) => break Arc::new(b),
                Err(e) => {
                    assert!(Instant::now() < deadline, "own redis-server: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let config = || simple(100, Duration::from_secs(1_000_000));
        let manager = |breaker| {
            ProxyManager::configure(Arc::clone(&backend))
                .timeout(timeout)
                .circuit_breaker(breaker)
                .build()
                .unwrap()
        };
        let without = manager(CircuitBreaker::off());
        let with = manager(CircuitBreaker::new(threshold, every));
        let plain = without.builder().build("k", config).unwrap();
        let guarded = with.builder().build("k", config).unwrap();
        // Granted before the outage (a loaded machine may delay one answer: retried).
        let mut granted = 0;
        while granted < 10 {
            match guarded.try_consume(1).await {
                Ok(true) => granted += 1,
                Ok(false) => panic!("the bucket ran dry"),
                Err(e) => assert!(Instant::now() < deadline, "{e}"),
            }
        }
        server.kill();
        let off = failures(&plain, 10).await;
        let first = failures(&guarded, threshold as usize).await;
        let fast = failures(&guarded, 50).await;
        // Not one waits for the server (the 300 ms timeout): slack for a loaded machine;
        // the median well under a millisecond.
        let mut sorted = fast.clone();
        sorted.sort_by(f64::total_cmp);
        assert!(
            fast.iter().all(|&ms| ms < 25.0) && sorted[sorted.len() / 2] < 1.0,
            "open breaker: {}",
            range(&fast)
        );
        let restarted = OwnRedis::start(Some(server.port), Some(server.dir.clone()));
        let up = Instant::now();
        let left = loop {
            match guarded.available_tokens().await {
                Ok(n) => break n,
                Err(e) => {
                    assert!(e.is_unavailable(), "{e}");
                    assert!(up.elapsed() < Duration::from_secs(15), "no recovery: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        let recovered = up.elapsed();
        // Nothing charged while down: refused connections, fast failures and read probes.
        assert_eq!(left, 100 - granted);
        // And it consumes again (a call may still time out on a loaded machine while the
        // fresh server loads the script: the 300 ms timeout is short).
        let consumed = loop {
            match guarded.try_consume(1).await {
                Ok(c) => break c,
                Err(e) => {
                    assert!(e.is_unavailable(), "{e}");
                    assert!(up.elapsed() < Duration::from_secs(15), "no recovery: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        assert!(consumed);
        println!(
            "fault: backend down (redis-server killed, connections refused, timeout 300 ms): \
             no breaker {}; breaker: first calls {}, after {threshold} failures {} (50 calls)",
            range(&off),
            range(&first),
            range(&fast)
        );
        println!(
            "fault: recovery after a restart on the same port: answered {:.0} ms after the \
             server started (probe every 100 ms); tokens left {left} of {} (none charged \
             while down)",
            recovered.as_secs_f64() * 1e3,
            100 - granted
        );
        drop(restarted);
    });
    let _ = std::fs::remove_dir_all(&server.dir);
}
