//! Real time: a smoke test with a generous tolerance, prompt cancellation, and proof that a
//! waiting thread does not spin.

use std::time::{Duration, Instant};

use bucket4rs_blocking::{BlockingBucketExt, CancelToken, WaitError};
use bucket4rs_local::Bucket;

#[test]
fn consume_waits_for_the_refill_on_the_real_clock() {
    // 20 per second, capacity 1: 5 tokens take 4 × 50 ms.
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_millis(50)))
        .build()
        .unwrap();
    let blocking = bucket.as_blocking();
    let start = Instant::now();
    for _ in 0..5 {
        blocking.consume(1).unwrap();
    }
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(190), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    // Refused at once when the wait is too long: 20 tokens need about 1 s, and the
    // refusal does not first sleep the 500 ms budget.
    let start = Instant::now();
    assert!(
        !blocking
            .try_consume(20, Duration::from_millis(500))
            .unwrap()
    );
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    assert!(blocking.try_consume(1, Duration::from_secs(1)).unwrap());
}

/// CPU time (user + system) of the calling thread.
#[cfg(target_os = "linux")]
fn thread_cpu_time() -> Duration {
    // Field 1 of schedstat: nanoseconds on the CPU.
    if let Some(ns) = std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
    {
        return Duration::from_nanos(ns);
    }
    // Fallback: utime + stime (fields 14 and 15 of stat), in clock ticks (100 Hz on Linux).
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("procfs");
    let after_name = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<u64> = after_name
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    Duration::from_millis((fields[11] + fields[12]) * 10)
}

#[cfg(target_os = "linux")]
#[test]
fn a_waiting_thread_does_not_spin() {
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_millis(300)))
        .build()
        .unwrap();
    // The wall time is taken before the bucket is emptied and before each procfs read, so
    // a slow read cannot hide part of the 300 ms wait.
    let t0 = Instant::now();
    bucket.try_consume(1).unwrap();
    // Default strategy.
    let cpu0 = thread_cpu_time();
    bucket.as_blocking().consume(1).unwrap();
    let (cpu, wall) = (thread_cpu_time() - cpu0, t0.elapsed());
    assert!(wall >= Duration::from_millis(250), "{wall:?}");
    assert!(
        cpu < Duration::from_millis(30),
        "spent {cpu:?} of CPU in a {wall:?} wait"
    );
    // The cancellable strategy.
    let token = CancelToken::new();
    let t0 = Instant::now();
    let cpu0 = thread_cpu_time();
    bucket.as_blocking().consume_with(1, &token).unwrap();
    let (cpu, wall) = (thread_cpu_time() - cpu0, t0.elapsed());
    assert!(wall >= Duration::from_millis(250), "{wall:?}");
    assert!(
        cpu < Duration::from_millis(30),
        "spent {cpu:?} of CPU in a {wall:?} wait"
    );
}

#[test]
fn cancel_wakes_a_long_wait_promptly() {
    let bucket = Bucket::builder()
        .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(3600)))
        .build()
        .unwrap();
    bucket.try_consume(1).unwrap();
    let token = CancelToken::new();
    let start = Instant::now();
    std::thread::scope(|s| {
        let canceller = token.clone();
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            canceller.cancel();
        });
        assert_eq!(
            bucket.as_blocking().consume_with(1, &token),
            Err(WaitError::Interrupted)
        );
    });
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(45) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
    assert_eq!(bucket.available_tokens(), 0, "the token came back");
}
