//! Request batching in the manager, over a backend that counts its transactions and holds
//! each one in flight for a while (so later operations on the key queue behind it).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bucket4rs_core::{BucketState, ManualClock};
use bucket4rs_distributed::{
    Backend, BackendError, Command, ProxyManager, RemoteBucket, StorageKey, TimeSource,
    Transaction, format,
};
use rand::Rng;

use crate::common::{
    RandomOp, concurrent_and_core, core_result, join_in_order, random_config, random_op, runtime,
    simple,
};
use crate::custom_backend::MapBackend;

/// Wraps a backend: counts transactions, records each one's number of operations, and
/// sleeps `delay` before running it (an in-flight round trip).
#[derive(Debug)]
struct Counting<B> {
    inner: B,
    delay: Duration,
    transactions: AtomicU64,
    sizes: Mutex<Vec<usize>>,
    deadlines: Mutex<Vec<Option<Instant>>>,
}

impl<B> Counting<B> {
    fn new(inner: B, delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            inner,
            delay,
            transactions: AtomicU64::new(0),
            sizes: Mutex::new(Vec::new()),
            deadlines: Mutex::new(Vec::new()),
        })
    }

    fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::SeqCst)
    }

    fn sizes(&self) -> Vec<usize> {
        self.sizes.lock().unwrap().clone()
    }
}

#[async_trait]
impl<B: Backend> Backend for Counting<B> {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        self.transactions.fetch_add(1, Ordering::SeqCst);
        let size = match (tx.command(), tx.batch()) {
            (Command::Batch(n), Some(list)) => {
                assert_eq!(n, list.len());
                n
            }
            (Command::Batch(_), None) => panic!("a batch without its operations"),
            (_, Some(_)) => panic!("operations listed for a single command"),
            _ => 1,
        };
        self.sizes.lock().unwrap().push(size);
        self.deadlines.lock().unwrap().push(tx.deadline());
        tokio::time::sleep(self.delay).await;
        self.inner.transact(key, tx).await
    }
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        self.inner.read(key).await
    }
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        self.inner.remove(key).await
    }
}

type Boxed<'a, T> = Pin<Box<dyn std::future::Future<Output = T> + 'a>>;

fn manager(
    backend: Arc<Counting<MapBackend>>,
    clock: &ManualClock,
    max_batch: usize,
) -> ProxyManager<Arc<Counting<MapBackend>>> {
    ProxyManager::configure(backend)
        .time_source(TimeSource::client(clock.clone()))
        .max_batch(max_batch)
        .build()
        .unwrap()
}

/// Random configurations, states and operations: the first operation goes alone, the rest
/// queue behind it and go as one batch; every caller gets what the core gives applying the
/// operations one by one in arrival order, and the stored record is the core's.
#[test]
fn every_caller_of_a_batch_gets_the_core_result_of_sequential_application() {
    let rt = runtime();
    rt.block_on(async {
        let backend = Counting::new(MapBackend::default(), Duration::from_millis(1));
        let mut rng = rand::rng();
        let cases = 300;
        let mut ops_sent = 0u64;
        for case in 0..cases {
            let config = random_config(&mut rng);
            let t0: i64 = rng.random_range(0..=2_000_000_000_000_000_000);
            let mut state = BucketState::new(&config, t0);
            let mut now = t0;
            for _ in 0..rng.random_range(0..4) {
                now += rng.random_range(0..=5_000_000_000);
                let _ = core_result(random_op(&mut rng), &config, &mut state, now);
            }
            now += rng.random_range(0..=2_000_000_000);
            let clock = ManualClock::new(now);
            let m = manager(backend.clone(), &clock, 64);
            let c2 = config.clone();
            let bucket = m
                .builder()
                .build(format!("k{case}"), move || c2.clone())
                .unwrap();
            // Start from the core's state (the key exists).
            let written = backend.transactions();
            let record = format::encode(&config, &state);
            seed(&backend.inner, bucket.key(), record).await;
            let ops: Vec<RandomOp> = (0..rng.random_range(2..=20))
                .map(|_| random_op(&mut rng))
                .collect();
            ops_sent += ops.len() as u64;
            let (got, expected) =
                concurrent_and_core(&ops, &bucket, &config, &mut state, now).await;
            assert_eq!(got, expected, "case {case}: {ops:?} on {config:?}");
            let stored = backend.inner.read(bucket.key()).await.unwrap().unwrap();
            let stored = format::decode(&stored).unwrap();
            assert_eq!(
                (stored.config, stored.state),
                (config.clone(), state.clone()),
                "case {case}"
            );
            // Batching happened: the lone first operation, then one batch of the rest.
            assert_eq!(backend.transactions() - written, 2, "case {case}: {ops:?}");
        }
        let sizes = backend.sizes();
        assert_eq!(sizes.len() as u64, 2 * cases);
        assert_eq!(sizes.iter().sum::<usize>() as u64, ops_sent);
    });
}

async fn seed(map: &MapBackend, key: &StorageKey, record: Vec<u8>) {
    struct Put(Vec<u8>);
    impl Transaction for Put {
        fn command(&self) -> Command {
            Command::Reset
        }
        fn needs_backend_clock(&self) -> bool {
            false
        }
        fn client_now(&self) -> Option<i64> {
            None
        }
        fn ttl_margin(&self) -> Duration {
            Duration::ZERO
        }
        fn apply(&mut self, _: Option<&[u8]>, _: Option<i64>) -> bucket4rs_distributed::Write {
            bucket4rs_distributed::Write::Put {
                record: self.0.clone(),
                ttl: None,
            }
        }
    }
    map.transact(key, &mut Put(record)).await.unwrap();
}

fn bucket(
    m: &ProxyManager<Arc<Counting<MapBackend>>>,
    capacity: u64,
) -> RemoteBucket<Arc<Counting<MapBackend>>> {
    m.builder()
        .build("hot", move || {
            simple(capacity, Duration::from_secs(1_000_000))
        })
        .unwrap()
}

/// Without batching every operation is its own transaction; with it, a key's queue is cut
/// into batches of at most the configured size.
#[test]
fn batches_respect_the_size_limit_and_disabled_batching_sends_each_operation() {
    let rt = runtime();
    rt.block_on(async {
        for (batching, sizes) in [(1, vec![1; 11]), (4, vec![1, 4, 4, 2]), (64, vec![1, 10])] {
            let backend = Counting::new(MapBackend::default(), Duration::from_millis(2));
            let clock = ManualClock::new(0);
            let m = manager(backend.clone(), &clock, batching);
            let b = bucket(&m, 100);
            let got = join_in_order(
                (0..11)
                    .map(|_| Box::pin(b.try_consume(3)) as Boxed<'_, _>)
                    .collect(),
            )
            .await;
            assert!(got.into_iter().all(|r: Result<bool, _>| r.unwrap()));
            assert_eq!(backend.sizes(), sizes, "{batching:?}");
            assert_eq!(b.available_tokens().await.unwrap(), 100 - 33);
        }
    });
}

/// A queued caller that goes away before its batch is sent (its future dropped, or its own
/// timeout) is never applied; the others are applied exactly once.
#[test]
fn callers_withdrawn_before_their_batch_is_sent_are_not_applied() {
    // Paused time on one thread: the sleeps below order the callers exactly, whatever the
    // machine's load (`Counting` and the manager's timers run on tokio's clock).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let backend = Counting::new(MapBackend::default(), Duration::from_millis(100));
        let clock = ManualClock::new(0);
        let m = manager(backend.clone(), &clock, 64);
        let b = bucket(&m, 1_000);
        let leader = {
            let b = b.clone();
            tokio::spawn(async move { b.try_consume(1).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await; // the leader is in flight
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for i in 0..10 {
            let b = b.clone();
            let task = tokio::spawn(async move { b.try_consume(10).await });
            if i % 2 == 0 {
                kept.push(task)
            } else {
                dropped.push(task)
            }
        }
        // Timed out by the caller while queued.
        let timed_out = tokio::time::timeout(Duration::from_millis(10), b.try_consume(100)).await;
        assert!(timed_out.is_err());
        tokio::time::sleep(Duration::from_millis(10)).await; // all queued
        for t in &dropped {
            t.abort();
        }
        assert!(leader.await.unwrap().unwrap());
        for t in kept {
            assert!(t.await.unwrap().unwrap());
        }
        for t in dropped {
            assert!(t.await.unwrap_err().is_cancelled());
        }
        // 1 + 5 × 10 consumed; the 5 aborted callers and the timed-out one never were.
        assert_eq!(b.available_tokens().await.unwrap(), 1_000 - 51);
        assert_eq!(backend.sizes(), vec![1, 5, 1]);
    });
}

/// An idle key is not delayed and not batched: one operation, one transaction, at once.
#[test]
fn an_idle_key_sends_its_operation_at_once() {
    let rt = runtime();
    rt.block_on(async {
        let backend = Counting::new(MapBackend::default(), Duration::ZERO);
        let clock = ManualClock::new(0);
        let m = manager(backend.clone(), &clock, 64);
        let b = bucket(&m, 10);
        for _ in 0..5 {
            assert!(b.try_consume(1).await.unwrap());
        }
        assert_eq!(backend.sizes(), vec![1; 5]);
    });
}

/// A batch carries the earliest deadline of its callers, not its own start plus the timeout:
/// a caller queued behind a slow operation has been waiting already, and a server that ran
/// the batch after that caller gave up would charge it for a call it saw time out.
#[test]
fn a_batch_carries_the_earliest_deadline_of_its_callers() {
    let rt = runtime();
    rt.block_on(async {
        let timeout = Duration::from_secs(1);
        let backend = Counting::new(MapBackend::default(), Duration::from_millis(300));
        let clock = ManualClock::new(0);
        let m = ProxyManager::configure(backend.clone())
            .time_source(TimeSource::client(clock.clone()))
            .timeout(timeout)
            .build()
            .unwrap();
        let b = bucket(&m, 100);
        let leader = {
            let b = b.clone();
            tokio::spawn(async move { b.try_consume(1).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await; // the leader is in flight
        let before = Instant::now();
        let queued = {
            let b = b.clone();
            tokio::spawn(async move { b.try_consume(1).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await; // queued behind the leader
        let after = Instant::now();
        assert!(leader.await.unwrap().unwrap());
        assert!(queued.await.unwrap().unwrap());
        assert_eq!(backend.sizes(), vec![1, 1]);
        let batch = backend.deadlines.lock().unwrap()[1].expect("a remote call has a deadline");
        // Formed when the leader finished (~300 ms later): its own start plus the timeout
        // would lie ~270 ms past the queued caller's deadline.
        assert!(
            batch >= before + timeout && batch <= after + timeout,
            "the batch's deadline is {:?} after the caller queued (timeout {timeout:?})",
            batch.saturating_duration_since(before)
        );
    });
}
