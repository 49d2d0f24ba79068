//! Leasing ([`Leasing`]): a hot key's calls served in process from blocks of the shared
//! bucket, with no over-grant. The backend kit replays every trace through a leased bucket
//! ("conformance leased"); these tests cover what one process cannot show: several managers
//! (processes) on one key, a process that dies with a lease, a configuration replaced while
//! leases are out, leases given back when idle or dropped, a backend that goes down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bucket4rs_core::{BucketConfiguration, ManualClock, TokensInheritanceStrategy};
use bucket4rs_distributed::{
    Backend, BackendClock, BackendError, BackendErrorKind, CircuitBreaker, Command,
    EmbeddedBackend, Leasing, ProxyManager, RetryPolicy, StorageKey, TimeSource, Transaction,
};

use crate::common::{Recorder, runtime, simple};

/// An in-process store seen as a remote one: every transaction counted, and a switch that
/// makes it refuse (a retryable `Unavailable`, nothing applied), as a server that is down.
#[derive(Debug, Default)]
struct Remote {
    store: EmbeddedBackend,
    transactions: AtomicU64,
    down: AtomicBool,
    /// Each transaction waits this long (milliseconds) before it runs.
    delay_ms: AtomicU64,
    /// Transactions in flight now, and the most seen at once.
    in_flight: AtomicU64,
    most_in_flight: AtomicU64,
    /// Transactions that took a lease, and batches of several calls.
    leases: AtomicU64,
    batches: AtomicU64,
}

/// A transaction counted in flight until it ends (or its future is dropped).
struct Flying<'a>(&'a AtomicU64);

impl Drop for Flying<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Remote {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            store: EmbeddedBackend::with_clock(ManualClock::new(0)),
            ..Self::default()
        })
    }

    fn refuse(&self) -> Result<(), BackendError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(BackendError::new(BackendErrorKind::Unavailable, "down").retryable(true));
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for Remote {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        self.refuse()?;
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.most_in_flight.fetch_max(now, Ordering::Relaxed);
        let _flying = Flying(&self.in_flight);
        match tx.batch() {
            Some(ops) if ops.iter().any(|c| matches!(c, Command::Lease { .. })) => {
                self.leases.fetch_add(1, Ordering::Relaxed)
            }
            Some(_) => self.batches.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
        let delay = self.delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.store.transact(key, tx).await
    }
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        self.refuse()?;
        self.store.read(key).await
    }
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        self.refuse()?;
        self.store.remove(key).await
    }
    fn clock(&self) -> BackendClock {
        BackendClock::Monotonic
    }
}

/// No refill within a test.
fn still(capacity: u64) -> BucketConfiguration {
    simple(capacity, Duration::from_secs(1_000_000_000))
}

/// A manager ("process") leasing on `backend`, on a client clock that never moves.
fn process(backend: &Arc<Remote>, leasing: Leasing) -> ProxyManager<Arc<Remote>> {
    ProxyManager::configure(Arc::clone(backend))
        .time_source(TimeSource::client(ManualClock::new(1_000)))
        .timeout(Duration::from_secs(20))
        .leasing(leasing)
        .build()
        .unwrap()
}

/// `tasks` tasks of `manager` take one token at a time from `key` until refused; the tokens
/// granted.
async fn drain(manager: &ProxyManager<Arc<Remote>>, key: &str, capacity: u64, tasks: usize) -> u64 {
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let b = manager
            .builder()
            .build(key, move || still(capacity))
            .unwrap();
        handles.push(tokio::spawn(async move {
            let mut n = 0;
            while b.try_consume(1).await.unwrap() {
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total
}

/// What an unleased bucket of `key` holds (read through a manager without leasing).
async fn left(backend: &Arc<Remote>, key: &str, capacity: u64) -> i64 {
    ProxyManager::configure(Arc::clone(backend))
        .time_source(TimeSource::client(ManualClock::new(1_000)))
        .build()
        .unwrap()
        .builder()
        .build(key, move || still(capacity))
        .unwrap()
        .available_tokens()
        .await
        .unwrap()
}

/// 4 processes × 4 tasks on one key of K tokens: never more than K granted, every token
/// accounted for once the leases are back (granted + left == K), at most the leases' bound
/// short, and a small fraction of a round trip per call.
#[test]
fn four_leasing_processes_grant_at_most_the_bucket_and_account_for_every_token() {
    let rt = runtime();
    let k = 40_000;
    let leasing = Leasing::new().processes(4).max_held_percent(20);
    let bound = 4 * leasing.lease_cap(k);
    for run in 0..3 {
        let backend = Remote::new();
        let processes: Vec<_> = (0..4).map(|_| process(&backend, leasing)).collect();
        let granted: u64 = rt.block_on(async {
            let runs = processes.iter().map(|p| drain(p, "hot", k, 4));
            futures_util::future::join_all(runs).await.into_iter().sum()
        });
        let held: u64 = processes.iter().map(ProxyManager::leased_tokens).sum();
        rt.block_on(async {
            for p in &processes {
                p.release_leases().await.unwrap();
            }
        });
        let after = rt.block_on(left(&backend, "hot", k));
        let trips = backend.transactions.load(Ordering::Relaxed);
        println!(
            "leasing: run {run}: {granted} of {k} granted, {held} held in leases at the end, \
             {after} left after their return, {trips} transactions ({:.4} per call)",
            trips as f64 / granted as f64
        );
        assert!(granted <= k, "over-grant: {granted} > {k}");
        assert_eq!(granted + after as u64, k, "a token lost or doubled");
        assert!(
            k - granted <= bound,
            "under-grant {} over the bound {bound}",
            k - granted
        );
        // Each lease serves up to 2,000 calls (20 % of 40,000 over 4 processes); the first
        // calls of each process go alone until its rate is known.
        assert!(
            trips * 50 < granted,
            "{trips} transactions for {granted} calls: leases not used"
        );
    }
}

/// A process that dies with a lease takes it out of the bucket and nothing more: what the
/// others are granted afterwards is exactly what was left, the dead lease lost (under-grant,
/// never over-grant).
#[test]
fn a_process_that_dies_with_a_lease_loses_only_its_lease() {
    let k = 10_000;
    let backend = Remote::new();
    let leasing = Leasing::new().max_held_percent(50);
    // The doomed process on a runtime of its own, which dies with it.
    let doomed_rt = runtime();
    let doomed = process(&backend, leasing);
    let (granted_before, leased) = doomed_rt.block_on(async {
        let b = doomed.builder().build("hot", move || still(k)).unwrap();
        let mut n = 0;
        for _ in 0..500 {
            assert!(b.try_consume(1).await.unwrap());
            n += 1;
        }
        (n, doomed.leased_tokens())
    });
    assert!(leased > 0, "the process took no lease");
    // Killed: its tasks end with its runtime, and nothing of it runs again (no drop, which
    // would give the lease back).
    drop(doomed_rt);
    std::mem::forget(doomed);
    let rt = runtime();
    let survivor = process(&backend, leasing);
    let granted_after = rt.block_on(drain(&survivor, "hot", k, 4));
    rt.block_on(survivor.release_leases()).unwrap();
    println!(
        "leasing: a dead process: {granted_before} granted before, {leased} lost in its \
         lease, {granted_after} granted after"
    );
    assert_eq!(granted_before + leased + granted_after, k);
    assert_eq!(rt.block_on(left(&backend, "hot", k)), 0);
}

/// A configuration replaced while another process holds a lease ends the lease's claim on
/// the bucket: its return gives nothing into the new configuration's bucket, the holder
/// takes the new configuration at its next round trip, and no more than the bucket allowed
/// is granted.
#[test]
fn a_configuration_replaced_while_leases_are_out_ends_them() {
    let rt = runtime();
    let k = 10_000;
    let backend = Remote::new();
    let leasing = Leasing::new().max_held_percent(50);
    let (a, b) = (process(&backend, leasing), process(&backend, leasing));
    rt.block_on(async {
        let bucket_a = a.builder().build("hot", move || still(k)).unwrap();
        for _ in 0..200 {
            assert!(bucket_a.try_consume(1).await.unwrap());
        }
        let leased = a.leased_tokens();
        assert!(leased > 0);
        let bucket_b = b.builder().build("hot", move || still(k)).unwrap();
        let bigger = still(2 * k);
        bucket_b
            .replace_configuration(bigger.clone(), TokensInheritanceStrategy::AsIs)
            .await
            .unwrap();
        let stored = left(&backend, "hot", 2 * k).await;
        // A's return finds its entry gone with the old configuration: nothing comes back.
        a.release_leases().await.unwrap();
        assert_eq!(left(&backend, "hot", 2 * k).await, stored);
        // A's next round trip answers under the new configuration.
        let probe = bucket_a.as_verbose().try_consume(1).await.unwrap();
        assert_eq!(probe.configuration(), &bigger);
        let rest = drain(&a, "hot", k, 2).await + drain(&b, "hot", k, 2).await;
        for p in [&a, &b] {
            p.release_leases().await.unwrap();
        }
        let granted = 200 + 1 + rest;
        println!(
            "leasing: configuration replaced with {leased} leased out: {granted} granted, \
             {} left",
            left(&backend, "hot", 2 * k).await
        );
        assert_eq!(granted, k - leased, "the lease lost, nothing else");
    });
}

/// A lease unused for its idle time goes back by itself: the bucket gets exactly what it did
/// not use, and the process holds nothing.
#[test]
fn an_idle_lease_goes_back_by_itself() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let k = 10_000;
    let backend = Remote::new();
    let manager = process(&backend, Leasing::new().idle(Duration::from_millis(50)));
    rt.block_on(async {
        let b = manager.builder().build("hot", move || still(k)).unwrap();
        for _ in 0..300 {
            assert!(b.try_consume(1).await.unwrap());
        }
        assert!(manager.leased_tokens() > 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(manager.leased_tokens(), 0);
        assert_eq!(left(&backend, "hot", k).await, (k - 300) as i64);
    });
}

/// The last handle of a manager, dropped, gives its leases back.
#[test]
fn dropping_the_last_handle_gives_the_leases_back() {
    let rt = runtime();
    let k = 10_000;
    let backend = Remote::new();
    rt.block_on(async {
        let manager = process(&backend, Leasing::new().lifetime(Duration::from_secs(30)));
        let b = manager.builder().build("hot", move || still(k)).unwrap();
        for _ in 0..300 {
            assert!(b.try_consume(1).await.unwrap());
        }
        assert!(manager.leased_tokens() > 0);
        drop((manager, b));
        for _ in 0..200 {
            if left(&backend, "hot", k).await == (k - 300) as i64 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the dropped manager's lease never came back");
    });
}

/// A lease keeps serving what it holds while the backend is down; past it, the calls fail
/// as they would without leasing.
#[test]
fn a_lease_serves_its_tokens_while_the_backend_is_down() {
    let rt = runtime();
    let k = 10_000;
    let backend = Remote::new();
    let manager = ProxyManager::configure(Arc::clone(&backend))
        .time_source(TimeSource::client(ManualClock::new(1_000)))
        .timeout(Duration::from_millis(200))
        .retry(RetryPolicy::new(1, Duration::ZERO, Duration::ZERO))
        .circuit_breaker(CircuitBreaker::off())
        .leasing(Leasing::new().max_held_percent(50))
        .build()
        .unwrap();
    rt.block_on(async {
        let b = manager.builder().build("hot", move || still(k)).unwrap();
        for _ in 0..300 {
            assert!(b.try_consume(1).await.unwrap());
        }
        let leased = manager.leased_tokens();
        assert!(leased > 0);
        backend.down.store(true, Ordering::Relaxed);
        let mut served = 0;
        let error = loop {
            match b.try_consume(1).await {
                Ok(granted) => {
                    assert!(granted);
                    served += 1;
                }
                Err(e) => break e,
            }
        };
        assert_eq!(served, leased, "the lease's tokens, then an error");
        assert!(error.is_unavailable() && !error.is_in_doubt(), "{error}");
        backend.down.store(false, Ordering::Relaxed);
        assert!(b.try_consume(1).await.unwrap());
    });
}

/// A leased bucket's listener hears what an unleased one's does, call by call, also when the
/// calls are served from the lease.
#[test]
fn a_leased_bucket_notifies_its_listener_as_an_unleased_one() {
    let rt = runtime();
    let backend = Remote::new();
    let manager = process(&backend, Leasing::new());
    rt.block_on(async {
        let (leased, plain) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
        let config = || simple(100, Duration::from_secs(1_000_000));
        let a = manager
            .builder()
            .with_listener(Arc::clone(&leased))
            .build("a", config)
            .unwrap();
        let b = manager
            .builder()
            .leasing(None)
            .with_listener(Arc::clone(&plain))
            .build("b", config)
            .unwrap();
        for n in [1, 2, 3, 1, 50, 1, 40, 5, 1, 1] {
            assert_eq!(
                a.try_consume(n).await.unwrap(),
                b.try_consume(n).await.unwrap()
            );
        }
        assert_eq!(a.try_consume_as_much_as_possible().await.unwrap(), 0);
        assert_eq!(b.try_consume_as_much_as_possible().await.unwrap(), 0);
        assert_eq!(leased.events(), plain.events());
    });
}

/// Every bucket of a key in one manager shares the key's lease, the blocking view included.
#[test]
fn the_blocking_view_of_a_leased_bucket_draws_on_the_same_lease() {
    let k = 10_000;
    let backend = Remote::new();
    let manager = process(&backend, Leasing::new());
    let b = manager.builder().build("hot", move || still(k)).unwrap();
    let blocking = b.as_blocking();
    for _ in 0..300 {
        assert_eq!(blocking.consume(1).unwrap(), Duration::ZERO);
    }
    let trips = backend.transactions.load(Ordering::Relaxed);
    assert!(trips < 30, "{trips} transactions for 300 calls");
    assert!(manager.leased_tokens() > 0);
}

/// A key holds at most 24 leases (its ledger keeps room for settling calls in doubt): of 30
/// busy processes, the others go to the bucket call by call, and every token still counts.
#[test]
fn a_key_holds_at_most_twenty_four_leases() {
    let rt = runtime();
    let k = 100_000;
    let backend = Remote::new();
    let leasing = Leasing::new().max_held_percent(100).processes(30);
    let processes: Vec<_> = (0..30).map(|_| process(&backend, leasing)).collect();
    rt.block_on(async {
        for p in &processes {
            let b = p.builder().build("hot", move || still(k)).unwrap();
            for _ in 0..20 {
                assert!(b.try_consume(1).await.unwrap());
            }
        }
    });
    let holding = processes.iter().filter(|p| p.leased_tokens() > 0).count();
    let held: u64 = processes.iter().map(ProxyManager::leased_tokens).sum();
    println!("leasing: 30 processes on one key: {holding} hold leases ({held} tokens)");
    assert!(
        (20..=24).contains(&holding),
        "{holding} processes hold a lease"
    );
    rt.block_on(async {
        for p in &processes {
            p.release_leases().await.unwrap();
        }
        assert_eq!(left(&backend, "hot", k).await, (k - 30 * 20) as i64);
    });
}

/// Settings that can only break things are refused when the bucket is built.
#[test]
fn leasing_settings_that_cannot_work_are_refused() {
    let manager = ProxyManager::new(EmbeddedBackend::new());
    for (bad, why) in [
        (Leasing::new().processes(0), "processes"),
        (Leasing::new().max_held_percent(0), "max_held_percent"),
        (Leasing::new().max_held_percent(101), "max_held_percent"),
        (Leasing::new().lifetime(Duration::ZERO), "lifetime"),
        (Leasing::new().lifetime(Duration::from_secs(31)), "lifetime"),
        (Leasing::new().period(Duration::from_secs(2)), "period"),
        (Leasing::new().idle(Duration::ZERO), "idle"),
    ] {
        let err = manager
            .builder()
            .leasing(Some(bad))
            .build("k", || still(10))
            .unwrap_err();
        assert!(err.to_string().contains(why), "{bad:?}: {err}");
        let err = ProxyManager::configure(EmbeddedBackend::new())
            .leasing(bad)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains(why), "{bad:?}: {err}");
    }
}

/// A caller that goes away while its key's round trip is in flight lets the callers waiting
/// behind it go on (none hangs), and its call is settled like any call dropped in flight.
#[test]
fn a_leased_call_dropped_in_flight_frees_its_key_and_is_settled() {
    let rt = runtime();
    let k = 10_000;
    let backend = Remote::new();
    // Batching off: the caller behind waits for the round trip itself.
    let manager = ProxyManager::configure(Arc::clone(&backend))
        .time_source(TimeSource::client(ManualClock::new(1_000)))
        .timeout(Duration::from_secs(20))
        .max_batch(1)
        .leasing(Leasing::new())
        .build()
        .unwrap();
    rt.block_on(async {
        let b = manager.builder().build("hot", move || still(k)).unwrap();
        assert!(b.try_consume(1).await.unwrap());
        backend.delay_ms.store(300, Ordering::Relaxed);
        // The first call's round trip is slow; the second waits behind it. The first goes
        // away mid-flight.
        let (first, second) = (b.clone(), b.clone());
        let dropped = tokio::time::timeout(
            Duration::from_millis(50),
            first.consume_ignoring_rate_limits(5),
        );
        let waiting = tokio::spawn(async move { second.try_consume(1).await });
        assert!(dropped.await.is_err(), "the slow call was not dropped");
        backend.delay_ms.store(0, Ordering::Relaxed);
        let granted = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the caller behind the dropped one hangs")
            .unwrap()
            .unwrap();
        assert!(granted);
        for _ in 0..100 {
            if manager.unsettled() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(manager.unsettled(), 0, "the dropped call was never settled");
        manager.release_leases().await.unwrap();
        assert_eq!(left(&backend, "hot", k).await, (k - 2) as i64);
    });
}

/// Calls of other processes leave entries in the key's ledger until their next call (or a
/// minute); only leases count towards the 24 a key may hold, so a busy process still leases
/// after forty others made one call each.
#[test]
fn other_processes_calls_do_not_take_a_leases_room() {
    let rt = runtime();
    let k = 100_000;
    let backend = Remote::new();
    rt.block_on(async {
        for _ in 0..40 {
            let light = process(&backend, Leasing::new());
            let b = light.builder().build("hot", move || still(k)).unwrap();
            assert!(b.try_consume(1).await.unwrap());
            std::mem::forget(light); // gone without another word: its entry stays
        }
        let busy = process(&backend, Leasing::new());
        let b = busy.builder().build("hot", move || still(k)).unwrap();
        let before = backend.transactions.load(Ordering::Relaxed);
        for _ in 0..1_000 {
            assert!(b.try_consume(1).await.unwrap());
        }
        let trips = backend.transactions.load(Ordering::Relaxed) - before;
        assert!(
            trips < 20,
            "{trips} transactions for 1,000 calls: no lease taken"
        );
        assert!(busy.leased_tokens() > 0);
    });
}

/// On a key drawn dry, callers that waited for the key's round trip are answered at its
/// reading (as a batch answers the calls queued behind it): refused when the bucket then had
/// nothing for them, not sent one round trip after another until their timeout.
#[test]
fn callers_behind_a_round_trip_on_a_dry_key_are_refused_at_once() {
    // Batched behind it (the default), and waiting for it when batching is off.
    for max_batch in [64, 1] {
        callers_behind_a_round_trip_on_a_dry_key(max_batch);
    }
}

fn callers_behind_a_round_trip_on_a_dry_key(max_batch: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let backend = Remote::new();
    backend.delay_ms.store(1, Ordering::Relaxed);
    let manager = ProxyManager::configure(Arc::clone(&backend))
        .time_source(TimeSource::client(bucket4rs_async::TokioClock::new()))
        .timeout(Duration::from_secs(1))
        .max_batch(max_batch)
        .leasing(Leasing::new())
        .build()
        .unwrap();
    let config = || simple(10_000, Duration::from_secs(1)); // 10 a millisecond
    let (granted, refused, slowest) = rt.block_on(async {
        let b = manager.builder().build("hot", config).unwrap();
        let mut calls = Vec::new();
        // 40 calls a millisecond for a second: twice what the key holds and refills in it.
        for _ in 0..1_000 {
            for _ in 0..40 {
                let b = b.clone();
                calls.push(tokio::spawn(async move {
                    let start = tokio::time::Instant::now();
                    let granted = b.try_consume(1).await.unwrap();
                    (granted, start.elapsed())
                }));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (mut granted, mut refused, mut slowest) = (0u64, 0u64, Duration::ZERO);
        for c in calls {
            let (g, took) = c.await.unwrap();
            if g {
                granted += 1
            } else {
                refused += 1
            }
            slowest = slowest.max(took);
        }
        (granted, refused, slowest)
    });
    println!(
        "leasing: a key drawn dry, 40 calls a ms for 1 s (batches of {max_batch}): {granted} \
         granted, {refused} refused, the slowest answered in {slowest:?}"
    );
    // 10,000 held and 10,000 refilled over the second (and a few in the last answers').
    assert!(granted <= 20_100, "{granted} granted");
    assert!(refused >= 19_900, "{refused} refused");
    assert!(
        slowest < Duration::from_millis(50),
        "a call waited {slowest:?}"
    );
    // The round trips that take leases and the batches go one at a time on the key.
    assert_eq!(backend.most_in_flight.load(Ordering::Relaxed), 1);
}

/// A process has one transaction of a leased key in flight at a time: its round trips that
/// take leases and the batches of the calls that found one in flight take turns on the key
/// (on Redis and PostgreSQL two at once would conflict, and a round trip returning a lease
/// could lose to a stream of batches until its retries ran out). 16 tasks hammer a key that
/// they draw dry, leases being taken again and again.
#[test]
fn a_process_sends_one_transaction_of_a_leased_key_at_a_time() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let backend = Remote::new();
    backend.delay_ms.store(1, Ordering::Relaxed);
    let manager = ProxyManager::configure(Arc::clone(&backend))
        .time_source(TimeSource::client(bucket4rs_async::TokioClock::new()))
        .timeout(Duration::from_secs(5))
        .leasing(Leasing::new().idle(Duration::from_millis(5)))
        .build()
        .unwrap();
    let config = || simple(1_000, Duration::from_secs(1)); // 1 a millisecond
    let start = std::time::Instant::now();
    let (granted, calls) = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let b = manager.builder().build("hot", config).unwrap();
            tasks.push(tokio::spawn(async move {
                let (mut granted, mut calls) = (0u64, 0u64);
                let stop = tokio::time::Instant::now() + Duration::from_millis(300);
                while tokio::time::Instant::now() < stop {
                    granted += u64::from(b.try_consume(1).await.unwrap());
                    calls += 1;
                    if calls % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                (granted, calls)
            }));
        }
        let mut sum = (0, 0);
        for t in tasks {
            let (g, c) = t.await.unwrap();
            sum = (sum.0 + g, sum.1 + c);
        }
        sum
    });
    let elapsed = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    let trips = backend.transactions.load(Ordering::Relaxed);
    let leases = backend.leases.load(Ordering::Relaxed);
    let batches = backend.batches.load(Ordering::Relaxed);
    println!(
        "leasing: 16 tasks for 300 ms: {calls} calls, {granted} granted, {trips} round trips \
         ({leases} took leases, {batches} batches)"
    );
    // The bucket and its refill over the run, no more (the client clock runs with the test).
    assert!(
        granted <= 1_000 + elapsed + 1,
        "{granted} granted in {elapsed} ms"
    );
    assert!(calls > granted, "the key was never drawn dry");
    assert!(leases > 1, "{leases} leases: leases were not taken again");
    assert!(batches > 0, "no call went the batching path");
    assert_eq!(backend.most_in_flight.load(Ordering::Relaxed), 1);
}
