//! The load of the failover tests (a Redis Cluster master, a Sentinel's master killed under
//! it): tasks that consume one token at a time until stopped, counting grants and failures,
//! and noting the first success of a call that started after the kill.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bucket4rs_distributed::{Backend, RemoteBucket};

#[derive(Default)]
struct Tally {
    stop: AtomicBool,
    granted: AtomicU64,
    failed: AtomicU64,
    killed_at: Mutex<Option<Instant>>,
    first_after: Mutex<Option<Instant>>,
}

/// One task per bucket, each calling `try_consume(1)` in a loop; every bucket must have
/// tokens enough for the whole test (a refusal fails it), and a failed call must end within
/// 2 s (its deadline).
pub(crate) struct Load {
    tally: Arc<Tally>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What a stopped [`Load`] counted.
pub(crate) struct Counted {
    pub(crate) granted: u64,
    pub(crate) failed: u64,
    /// The first success of a call that started after [`Load::killed`].
    pub(crate) first_after_kill: Instant,
    /// Tokens left in the probed bucket after the stop.
    pub(crate) left: u64,
    /// Granted and left beyond the capacity (over-granted), and short of it (taken by calls
    /// in doubt at the kill).
    pub(crate) over: u64,
    pub(crate) under: u64,
}

impl Load {
    pub(crate) fn start<B: Backend>(buckets: Vec<RemoteBucket<B>>) -> Self {
        let tally = Arc::new(Tally::default());
        let tasks = buckets
            .into_iter()
            .map(|b| {
                let tally = Arc::clone(&tally);
                tokio::spawn(async move {
                    while !tally.stop.load(Ordering::Acquire) {
                        let t = Instant::now();
                        match b.try_consume(1).await {
                            Ok(true) => {
                                tally.granted.fetch_add(1, Ordering::Relaxed);
                                let killed = *tally.killed_at.lock().unwrap();
                                if killed.is_some_and(|k| t > k) {
                                    tally
                                        .first_after
                                        .lock()
                                        .unwrap()
                                        .get_or_insert(Instant::now());
                                }
                            }
                            Ok(false) => panic!("denied with tokens left"),
                            Err(_) => {
                                tally.failed.fetch_add(1, Ordering::Relaxed);
                                assert!(
                                    t.elapsed() < Duration::from_secs(2),
                                    "a failed call took {:?}, past its deadline",
                                    t.elapsed()
                                );
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Self { tally, tasks }
    }

    /// Tokens granted so far.
    pub(crate) fn granted(&self) -> u64 {
        self.tally.granted.load(Ordering::Relaxed)
    }

    /// Waits until `n` tokens were granted.
    pub(crate) async fn until_granted(&self, n: u64) {
        while self.granted() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Notes that the master was killed now; the moment.
    pub(crate) fn killed(&self) -> Instant {
        let now = Instant::now();
        *self.tally.killed_at.lock().unwrap() = Some(now);
        now
    }

    /// Whether a call that started after the kill succeeded.
    pub(crate) fn succeeded_after_kill(&self) -> bool {
        self.tally.first_after.lock().unwrap().is_some()
    }

    /// Lets the tasks run 300 ms more (calls on the new master), stops them, and counts,
    /// reading what is left through `probe`, a bucket of `capacity` on the same key.
    pub(crate) async fn stop<B: Backend>(self, probe: &RemoteBucket<B>, capacity: u64) -> Counted {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.tally.stop.store(true, Ordering::Release);
        for t in self.tasks {
            t.await.unwrap();
        }
        let first = self
            .tally
            .first_after
            .lock()
            .unwrap()
            .expect("a success after the kill");
        let granted = self.tally.granted.load(Ordering::Relaxed);
        let left = u64::try_from(probe.available_tokens().await.unwrap()).expect("not in debt");
        Counted {
            granted,
            failed: self.tally.failed.load(Ordering::Relaxed),
            first_after_kill: first,
            left,
            over: (granted + left).saturating_sub(capacity),
            under: capacity.saturating_sub(granted + left),
        }
    }
}
