//! The manager's circuit breaker, over a backend that fails on demand, and the settings the
//! manager refuses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bucket4rs_core::ManualClock;
use bucket4rs_distributed::{
    Backend, BackendError, BackendErrorKind, CircuitBreaker, DistributedError, EmbeddedBackend,
    ProxyManager, RemoteBucket, StorageKey, TimeSource, Transaction,
};

use crate::common::{runtime, simple};
use crate::custom_backend::MapBackend;

/// How the [`Flaky`] backend answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    Up = 0,
    /// `Unavailable` after the delay (a refused or lost connection).
    Down = 1,
    /// Hangs past any timeout.
    Hang = 2,
    /// Answers with a protocol error (the backend is up but said something odd).
    Protocol = 3,
    /// Loses every compare-and-set (retryable conflicts, until the manager gives up).
    Conflict = 4,
    /// Reports the key as holding another type.
    WrongType = 5,
}

/// A map backend that fails on demand and counts the calls that reach it.
#[derive(Debug)]
struct Flaky {
    map: MapBackend,
    mode: AtomicU8,
    delay: Duration,
    in_process: bool,
    transactions: AtomicU64,
    reads: AtomicU64,
}

impl Flaky {
    fn new(delay: Duration) -> Arc<Self> {
        Self::build(delay, false)
    }

    fn build(delay: Duration, in_process: bool) -> Arc<Self> {
        Arc::new(Self {
            map: MapBackend::default(),
            mode: AtomicU8::new(Mode::Up as u8),
            delay,
            in_process,
            transactions: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        })
    }

    fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::SeqCst)
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }

    /// Fails as the mode says, or `Ok` to go on.
    async fn fail(&self) -> Result<(), BackendError> {
        let mode = self.mode.load(Ordering::SeqCst);
        let err = |kind, msg: &str| Err(BackendError::new(kind, msg));
        match mode {
            m if m == Mode::Down as u8 => {
                tokio::time::sleep(self.delay).await;
                err(BackendErrorKind::Unavailable, "connection refused")
            }
            m if m == Mode::Hang as u8 => {
                tokio::time::sleep(Duration::from_secs(3_600)).await;
                err(BackendErrorKind::Timeout, "hung")
            }
            m if m == Mode::Protocol as u8 => err(BackendErrorKind::Protocol, "odd reply"),
            m if m == Mode::Conflict as u8 => {
                Err(BackendError::new(BackendErrorKind::Conflict, "lost").retryable(true))
            }
            m if m == Mode::WrongType as u8 => err(BackendErrorKind::WrongType, "list"),
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl Backend for Flaky {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        self.transactions.fetch_add(1, Ordering::SeqCst);
        self.fail().await?;
        self.map.transact(key, tx).await
    }
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.fail().await?;
        self.map.read(key).await
    }
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        self.fail().await?;
        self.map.remove(key).await
    }
    fn is_in_process(&self) -> bool {
        self.in_process
    }
}

fn manager(backend: &Arc<Flaky>, breaker: CircuitBreaker) -> ProxyManager<Arc<Flaky>> {
    ProxyManager::configure(Arc::clone(backend))
        .time_source(TimeSource::client(ManualClock::new(0)))
        .timeout(Duration::from_millis(200))
        .circuit_breaker(breaker)
        .build()
        .unwrap()
}

fn bucket(m: &ProxyManager<Arc<Flaky>>, key: &str) -> RemoteBucket<Arc<Flaky>> {
    m.builder()
        .build(key, || simple(10, Duration::from_secs(1_000_000)))
        .unwrap()
}

/// Longer than any refused call takes, even on a loaded machine; shorter than any call that
/// waits for the backend in these tests (50 ms and more).
const FAST: Duration = Duration::from_millis(25);

/// A probe interval no test waits for.
const NEVER: Duration = Duration::from_secs(3_600);

/// One failing call: its error and how long it took.
async fn failing(b: &RemoteBucket<Arc<Flaky>>) -> (DistributedError, Duration) {
    let t = Instant::now();
    let e = b.try_consume(1).await.unwrap_err();
    (e, t.elapsed())
}

#[test]
fn fault_breaker_opens_after_consecutive_unavailable_calls_and_fails_fast() {
    let rt = runtime();
    let backend = Flaky::new(Duration::from_millis(50));
    let m = manager(&backend, CircuitBreaker::new(3, NEVER));
    let b = bucket(&m, "k");
    rt.block_on(async {
        assert!(b.try_consume(1).await.unwrap());
        backend.set(Mode::Down);
        let mut before = Vec::new();
        for _ in 0..3 {
            let (e, took) = failing(&b).await;
            assert!(e.is_unavailable(), "{e}");
            assert!(took >= Duration::from_millis(50), "{took:?}");
            before.push(took);
        }
        let reached = backend.transactions();
        assert_eq!(reached, 4, "the three failures reached the backend");
        let mut after = Vec::new();
        for _ in 0..20 {
            let (e, took) = failing(&b).await;
            assert!(e.is_unavailable(), "{e}");
            // A refused call does not wait for the backend (50 ms): slack for a loaded machine.
            assert!(took < FAST, "{took:?}");
            after.push(took);
        }
        assert_eq!(backend.transactions(), reached, "open: no call reached it");
        after.sort();
        assert!(
            after[after.len() / 2] < Duration::from_millis(1),
            "{after:?}"
        );
        // Reads and removes are refused alike, at once, as unavailable: what a failure
        // policy (the HTTP layer's) acts on, as for any outage.
        assert!(b.raw_record().await.unwrap_err().is_unavailable());
        assert!(m.remove("k").await.unwrap_err().is_unavailable());
        assert_eq!(backend.reads(), 0);
        for _ in 0..3 {
            let t = Instant::now();
            assert!(b.try_consume(1).await.unwrap_err().is_unavailable());
            assert!(t.elapsed() < FAST, "{:?}", t.elapsed());
        }
        assert_eq!(backend.transactions(), reached);
        let max = |v: &[Duration]| v.iter().max().unwrap().as_secs_f64() * 1e3;
        let min = |v: &[Duration]| v.iter().min().unwrap().as_secs_f64() * 1e3;
        println!(
            "fault: breaker, backend down after 50 ms: first 3 calls {:.1}-{:.1} ms, \
             after 3 failures {:.3}-{:.3} ms (20 calls, none reached the backend)",
            min(&before),
            max(&before),
            min(&after),
            max(&after)
        );
    });
}

#[test]
fn fault_breaker_counts_timeouts_and_recovers_once_the_probe_gets_an_answer() {
    let rt = runtime();
    let backend = Flaky::new(Duration::ZERO);
    let m = manager(&backend, CircuitBreaker::new(2, Duration::from_millis(50)));
    let b = bucket(&m, "k");
    rt.block_on(async {
        for _ in 0..3 {
            assert!(b.try_consume(1).await.unwrap());
        }
        let stored = b.raw_record().await.unwrap();
        backend.set(Mode::Hang);
        for _ in 0..2 {
            // The backend hangs with the call in flight: in doubt, and counted as down.
            let (e, took) = failing(&b).await;
            assert!(e.is_in_doubt() && !e.is_retryable(), "{e}");
            assert!(took >= Duration::from_millis(200));
        }
        let transactions = backend.transactions();
        let (_, fast) = failing(&b).await;
        assert!(fast < FAST, "{fast:?}");
        // Probes time out while the backend hangs; once it answers, the next probe closes
        // the breaker.
        tokio::time::sleep(Duration::from_millis(400)).await;
        let probes_while_down = backend.reads() - 1;
        assert!(probes_while_down >= 1, "the probe ran");
        // While the breaker was open no transaction reached the backend (the settlement of
        // the calls in doubt included: it waits for the breaker too).
        assert_eq!(backend.transactions(), transactions);
        backend.set(Mode::Up);
        let up = Instant::now();
        let back = loop {
            match b.available_tokens().await {
                Ok(n) => break n,
                Err(e) => {
                    assert!(e.is_unavailable(), "{e}");
                    assert!(up.elapsed() < Duration::from_secs(5), "no recovery");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let recovered = up.elapsed();
        // The probe only read; after it, the call that answered ran (with the settlement of
        // the calls in doubt, or after the background settlement's own transaction); the
        // bucket is the one left before the outage (its ledger holds the settled calls'
        // tombstones), and no token was charged.
        assert!((1..=2).contains(&(backend.transactions() - transactions)));
        assert_eq!(back, 7);
        let bucket = |bytes: Option<Vec<u8>>| {
            let r = bucket4rs_distributed::format::decode(&bytes.unwrap()).unwrap();
            (r.config, r.state)
        };
        assert_eq!(bucket(b.raw_record().await.unwrap()), bucket(stored));
        assert!(b.try_consume(1).await.unwrap());
        println!(
            "fault: breaker recovery: answered again {:.0} ms after the backend came back \
             (probe every 50 ms, {probes_while_down} probes while down); tokens 7 of 7 left \
             (probe charged 0)",
            recovered.as_secs_f64() * 1e3
        );
    });
}

#[test]
fn fault_breaker_recovers_on_a_runtime_driven_only_by_calls_that_fail_at_once() {
    // A current-thread runtime runs its tasks (the probe) only inside `block_on`; calls
    // refused at once never let it. A call made after two missed probe rounds (2 × (50 ms
    // + 200 ms)) probes in the stalled task's stead.
    let rt = runtime();
    let backend = Flaky::new(Duration::ZERO);
    let m = manager(&backend, CircuitBreaker::new(2, Duration::from_millis(50)));
    let b = bucket(&m, "k");
    backend.set(Mode::Down);
    for _ in 0..2 {
        assert!(rt.block_on(b.try_consume(1)).unwrap_err().is_unavailable());
    }
    let transactions = backend.transactions();
    assert!(rt.block_on(b.try_consume(1)).is_err());
    assert_eq!(backend.transactions(), transactions, "open");
    backend.set(Mode::Up);
    let up = Instant::now();
    let mut refused = 0;
    let granted = loop {
        std::thread::sleep(Duration::from_millis(20));
        match rt.block_on(b.try_consume(1)) {
            Ok(v) => break v,
            Err(e) => {
                assert!(e.is_unavailable(), "{e}");
                refused += 1;
                assert!(up.elapsed() < Duration::from_secs(3), "never recovered");
            }
        }
    };
    assert!(granted);
    assert_eq!(rt.block_on(b.available_tokens()).unwrap(), 9);
    println!(
        "fault: breaker on a runtime driven only by block_on: answered {:.0} ms after the \
         backend came back ({refused} calls refused at once meanwhile; stalled-probe \
         takeover after 500 ms)",
        up.elapsed().as_secs_f64() * 1e3
    );
}

#[test]
fn a_success_resets_the_count_of_consecutive_failures() {
    let rt = runtime();
    let backend = Flaky::new(Duration::ZERO);
    let m = manager(&backend, CircuitBreaker::new(3, NEVER));
    let b = bucket(&m, "k");
    rt.block_on(async {
        for round in 0..4 {
            backend.set(Mode::Down);
            for _ in 0..2 {
                failing(&b).await;
            }
            backend.set(Mode::Up);
            assert!(b.try_consume(1).await.unwrap(), "round {round}");
        }
        // 4 × (2 failures + 1 success), all at the backend.
        assert_eq!(backend.transactions(), 12);
        backend.set(Mode::Down);
        for _ in 0..3 {
            failing(&b).await;
        }
        assert_eq!(backend.transactions(), 15);
        failing(&b).await;
        assert_eq!(backend.transactions(), 15, "the third in a row opened it");
    });
}

#[test]
fn errors_that_do_not_mean_the_backend_is_down_never_open_the_breaker() {
    let rt = runtime();
    let backend = Flaky::new(Duration::ZERO);
    let m = manager(&backend, CircuitBreaker::new(1, NEVER));
    let b = bucket(&m, "k");
    rt.block_on(async {
        assert!(b.try_consume(1).await.unwrap());
        // Invalid input never reaches the backend.
        assert!(matches!(
            b.try_consume(0).await,
            Err(DistributedError::Operation(_))
        ));
        for mode in [Mode::Protocol, Mode::Conflict, Mode::WrongType] {
            backend.set(mode);
            for _ in 0..3 {
                let before = backend.transactions();
                let e = b.try_consume(1).await.unwrap_err();
                assert!(backend.transactions() > before, "{mode:?}: {e} was refused");
            }
        }
        // An unreadable record: the backend answered.
        backend.set(Mode::Up);
        let key = b.key().clone();
        let bad = b"not a bucket record".to_vec();
        backend.map.transact(&key, &mut Put(bad)).await.unwrap();
        for _ in 0..3 {
            let before = backend.transactions();
            assert!(matches!(
                b.try_consume(1).await,
                Err(DistributedError::Format(_))
            ));
            assert_eq!(backend.transactions(), before + 1);
        }
        assert!(matches!(
            b.configuration().await,
            Err(DistributedError::Format(_))
        ));
    });
}

/// A transaction that stores given bytes.
struct Put(Vec<u8>);

impl Transaction for Put {
    fn command(&self) -> bucket4rs_distributed::Command {
        bucket4rs_distributed::Command::Reset
    }
    fn needs_backend_clock(&self) -> bool {
        false
    }
    fn client_now(&self) -> Option<i64> {
        Some(0)
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

#[test]
fn concurrent_callers_open_one_breaker_with_one_probe_and_all_recover() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let backend = Flaky::new(Duration::from_millis(20));
    let every = Duration::from_millis(100);
    let m = manager(&backend, CircuitBreaker::new(5, every));
    rt.block_on(async {
        backend.set(Mode::Down);
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                // Half the callers share a key (batched), half have their own.
                let b = bucket(
                    &m,
                    &if i % 2 == 0 {
                        "hot".into()
                    } else {
                        format!("k{i}")
                    },
                );
                tokio::spawn(async move {
                    for _ in 0..20 {
                        assert!(b.try_consume(1).await.unwrap_err().is_unavailable());
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        // The calls that reached the backend: the 5 that opened it and those in flight.
        let reached = backend.transactions();
        assert!(
            reached <= 5 + 16,
            "{reached} of 320 calls reached the backend"
        );
        // One probe task: about one read per interval.
        let reads = backend.reads();
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let probes = backend.reads() - reads;
        assert!((5..=12).contains(&probes), "{probes} probes in 1 s");
        backend.set(Mode::Up);
        tokio::time::sleep(every * 3).await;
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let b = bucket(&m, &format!("after{i}"));
                tokio::spawn(async move { b.try_consume(1).await.unwrap() })
            })
            .collect();
        for t in tasks {
            assert!(t.await.unwrap());
        }
        println!(
            "fault: breaker, 16 concurrent callers × 20 calls on a down backend: {reached} \
             reached it, {probes} probes in 1 s (every 100 ms); all 16 answered after recovery"
        );
    });
}

#[test]
fn an_off_breaker_and_an_in_process_backend_never_fail_fast() {
    let rt = runtime();
    let off = Flaky::new(Duration::ZERO);
    let in_process = Flaky::build(Duration::ZERO, true);
    for (backend, breaker) in [
        (&off, CircuitBreaker::off()),
        (&in_process, CircuitBreaker::new(1, NEVER)),
    ] {
        let m = manager(backend, breaker);
        let b = bucket(&m, "k");
        backend.set(Mode::Down);
        rt.block_on(async {
            for n in 1..=20 {
                assert!(b.try_consume(1).await.unwrap_err().is_unavailable());
                assert_eq!(backend.transactions(), n);
            }
        });
    }
}

#[test]
fn knobs_that_can_only_break_things_are_refused_at_build() {
    let hour = Duration::from_secs(3_600);
    let year = Duration::from_secs(365 * 24 * 3_600);
    let refused = |b: bucket4rs_distributed::ManagerBuilder<EmbeddedBackend>, setting: &str| match b
        .build()
    {
        Err(DistributedError::InvalidSetting { setting: s, reason }) => {
            assert_eq!(s, setting);
            assert!(!reason.is_empty());
            let e = DistributedError::InvalidSetting { setting: s, reason };
            assert!(!e.is_unavailable());
            assert!(e.to_string().contains(setting), "{e}");
        }
        other => panic!("{setting}: {other:?}"),
    };
    let c = || ProxyManager::configure(EmbeddedBackend::new());
    refused(c().timeout(Duration::ZERO), "timeout");
    // Used to be accepted, then every remote call panicked computing its deadline.
    refused(c().timeout(Duration::MAX), "timeout");
    refused(c().timeout(hour + Duration::from_nanos(1)), "timeout");
    // Used to disable expiry silently.
    refused(c().ttl_margin(Duration::MAX), "ttl_margin");
    refused(c().ttl_margin(year + Duration::from_secs(1)), "ttl_margin");
    // Used to turn batching off silently.
    refused(c().max_batch(0), "max_batch");
    // "p:" leaves no room for a key byte.
    refused(c().key_prefix("p").max_key_len(2), "max_key_len");
    refused(c().max_key_len(0), "max_key_len");
    refused(
        c().circuit_breaker(CircuitBreaker::new(0, Duration::from_millis(500))),
        "circuit_breaker",
    );
    refused(
        c().circuit_breaker(CircuitBreaker::new(5, Duration::ZERO)),
        "circuit_breaker",
    );
    refused(
        c().circuit_breaker(CircuitBreaker::new(5, hour * 2)),
        "circuit_breaker",
    );
    // The bounds themselves are accepted, and work.
    let m = c()
        .key_prefix("p")
        .max_key_len(3)
        .timeout(hour)
        .ttl_margin(year)
        .max_batch(1)
        .circuit_breaker(CircuitBreaker::new(1, hour))
        .build()
        .unwrap();
    assert!(m.storage_key("x").is_ok());
    assert!(m.storage_key("xy").is_err());
    for retry in [
        bucket4rs_distributed::RetryPolicy::new(0, Duration::ZERO, Duration::ZERO),
        bucket4rs_distributed::RetryPolicy::new(u32::MAX, Duration::MAX, Duration::MAX),
    ] {
        assert!(c().retry(retry).build().is_ok(), "{retry:?}");
    }
}

#[test]
fn the_largest_timeout_serves_remote_calls() {
    // The deadline of a remote call is its start plus the timeout: at the bound it is
    // computed without overflow.
    let rt = runtime();
    let backend = Flaky::new(Duration::ZERO);
    let m = ProxyManager::configure(Arc::clone(&backend))
        .time_source(TimeSource::client(ManualClock::new(0)))
        .timeout(Duration::from_secs(3_600))
        .build()
        .unwrap();
    let b = bucket(&m, "k");
    assert!(rt.block_on(b.try_consume(1)).unwrap());
}
