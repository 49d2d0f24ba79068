//! The synchronous in-process entry point (`ProxyManager::in_process_bucket`): the same
//! results as the async path and as the core, the same records and the same expiry.

use std::fmt::Debug;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use bucket4rs_core::{BucketConfiguration, BucketState, Clock, ManualClock};
use bucket4rs_distributed::{
    Backend, BackendError, DistributedError, EmbeddedBackend, InProcessBucket, KeyError,
    ProxyManager, StorageKey, StorageKeyRef, TimeSource, Transaction, Verbose, VerboseRef, Write,
    format,
};
use rand::Rng;

use crate::common::{RandomOp, core_result, random_config, random_op, remote_result, runtime};
use crate::custom_backend::MapBackend;

fn manager<B: Backend>(backend: B, clock: &ManualClock, margin: Duration) -> ProxyManager<B> {
    ProxyManager::configure(backend)
        .time_source(TimeSource::client(clock.clone()))
        .ttl_margin(margin)
        .build()
        .unwrap()
}

/// An operation through the synchronous path, shown as `remote_result` shows the async one,
/// plus the verbose snapshot (configuration, state, instant).
fn sync_result<B: Backend>(op: RandomOp, b: &InProcessBucket<'_, B>) -> (String, Option<String>) {
    fn show<T: Debug>(r: Result<Verbose<T>, DistributedError>) -> (String, Option<String>) {
        match r {
            Ok(v) => (
                format!("{:?}", v.value),
                Some(format!(
                    "{:?} {:?} {}",
                    v.configuration, v.state, v.now_nanos
                )),
            ),
            Err(DistributedError::Operation(e)) => (format!("error: {e}"), None),
            Err(e) => panic!("backend failure: {e:?}"),
        }
    }
    match op {
        RandomOp::TryConsume(n) => show(b.try_consume(n)),
        // Both forms: the callback one lends what the other clones.
        RandomOp::Probe(n) if n % 2 == 0 => show(b.try_consume_and_return_remaining(n)),
        RandomOp::Probe(n) => show(b.try_consume_and_return_remaining_with(n, |v| v.to_verbose())),
        RandomOp::Estimate(n) => show(b.estimate_ability_to_consume(n)),
        RandomOp::AsMuch(None) => show(b.try_consume_as_much_as_possible()),
        RandomOp::AsMuch(Some(l)) => show(b.try_consume_as_much_as_possible_with_limit(l)),
        RandomOp::Add(n) => show(b.add_tokens(n)),
        RandomOp::Force(n) => show(b.force_add_tokens(n)),
        RandomOp::Reset => show(b.reset()),
        RandomOp::Available => show(b.available_tokens()),
        RandomOp::Ignoring(n) => show(b.consume_ignoring_rate_limits(n)),
        RandomOp::Reserve(n, w) => show(b.reserve(n, w)),
    }
}

/// Random configurations and operation sequences, on two embedded backends sharing one
/// manual clock: one driven through `RemoteBucket` (async), one through `InProcessBucket`
/// (sync). Both give the core's results while the key lives; with long idle gaps (keys
/// expire and are recreated) they still agree with each other on every result, every
/// stored record and every key count.
#[test]
fn the_sync_path_gives_the_async_path_and_the_core_results() {
    let rt = runtime();
    let mut rng = rand::rng();
    for case in 0..400 {
        let config = random_config(&mut rng);
        let t0: i64 = rng.random_range(0..=1_000_000_000_000_000_000);
        let clock = ManualClock::new(t0);
        let margin = Duration::from_nanos(rng.random_range(0..=2_000_000_000));
        let a = manager(EmbeddedBackend::with_clock(clock.clone()), &clock, margin);
        let s = manager(EmbeddedBackend::with_clock(clock.clone()), &clock, margin);
        // The reference for expiry: TTLs computed at every write, through the byte path.
        let e = manager(EagerMap::new(&clock), &clock, margin);
        // Keys of both sides of the stack/heap limit of the sync path's key encoding.
        let user_key = if rng.random_bool(0.2) {
            "k{é}/".repeat(rng.random_range(1..=30))
        } else {
            format!("user-{case}")
        };
        let c2 = config.clone();
        let remote = a.builder().build(&user_key, move || c2.clone()).unwrap();
        let c3 = config.clone();
        let eager = e.builder().build(&user_key, move || c3.clone()).unwrap();
        let mut state = BucketState::new(&config, t0);
        let steps = rng.random_range(1..=40);
        for step in 0..steps {
            // Mostly short gaps (some keys expire even so); sometimes long ones.
            let gap = if rng.random_bool(0.1) {
                rng.random_range(0..=1_000_000_000_000_000)
            } else {
                rng.random_range(0..=3_000_000_000)
            };
            clock.advance_nanos(gap);
            let now = clock.now_nanos();
            let op = random_op(&mut rng);
            let before = rt.block_on(s.backend().read(remote.key())).unwrap();
            let sync = s.in_process_bucket(&user_key, &config).unwrap().unwrap();
            assert_eq!(sync.key().as_str(), remote.key().as_str());
            let (got, snapshot) = sync_result(op, &sync);
            let expected = rt.block_on(remote_result(op, &remote));
            assert_eq!(
                got, expected,
                "case {case} step {step}: {op:?} on {config:?}"
            );
            assert_eq!(
                rt.block_on(remote_result(op, &eager)),
                expected,
                "case {case} step {step}: {op:?} on {config:?} (eager TTLs)"
            );
            // The core agrees, from a new state whenever the key had none (first use, or
            // expired: the bucket would have been full again).
            if before.is_none() {
                state = BucketState::new(&config, now);
            }
            assert_eq!(
                got,
                core_result(op, &config, &mut state, now),
                "case {case} step {step}: {op:?} (core)"
            );
            if let Some(snapshot) = snapshot {
                let record = rt.block_on(remote.raw_record()).unwrap();
                if let Some(bytes) = record {
                    let r = format::decode(&bytes).unwrap();
                    assert_eq!(snapshot, format!("{:?} {:?} {now}", r.config, r.state));
                }
            }
            let key = remote.key();
            assert_eq!(
                rt.block_on(s.backend().read(key)).unwrap(),
                rt.block_on(a.backend().read(key)).unwrap(),
                "case {case} step {step}: records"
            );
            // Lazy expiry drops keys exactly when TTLs computed at every write say: just
            // before and at the next instants either could fall on, and after this step.
            for probe in [0, 1, rng.random_range(0..=3_000_000_000)] {
                clock.set_nanos(now + probe);
                assert_eq!(
                    rt.block_on(s.backend().read(key)).unwrap(),
                    rt.block_on(e.backend().read(key)).unwrap(),
                    "case {case} step {step}: expiry {probe} ns later"
                );
            }
            clock.set_nanos(now);
            assert_eq!(s.backend().len(), a.backend().len());
            assert_eq!(s.backend().sweep(), a.backend().sweep());
        }
    }
}

/// A byte-map backend that honours TTLs on a manual clock: the manager computes the TTL of
/// every write (`Write::Put`), so expiry here is exact by construction, the reference for the
/// embedded backend's lazy expiry.
#[derive(Debug)]
struct EagerMap {
    clock: ManualClock,
    /// Record bytes and the instant they expire at.
    map: std::sync::Mutex<std::collections::HashMap<StorageKey, Stored>>,
}

type Stored = (Vec<u8>, Option<i64>);

impl EagerMap {
    fn new(clock: &ManualClock) -> Self {
        Self {
            clock: clock.clone(),
            map: std::sync::Mutex::default(),
        }
    }

    fn live(&self, key: &StorageKey) -> Option<Vec<u8>> {
        let now = self.clock.now_nanos();
        let map = self.map.lock().unwrap();
        let (bytes, expires_at) = map.get(key)?;
        (!expires_at.is_some_and(|at| now >= at)).then(|| bytes.clone())
    }
}

#[async_trait]
impl Backend for EagerMap {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        let current = self.live(key);
        let now = self.clock.now_nanos();
        if let Write::Put { record, ttl } = tx.apply(current.as_deref(), None) {
            let expires_at =
                ttl.map(|t| now.saturating_add(i64::try_from(t.as_nanos()).unwrap_or(i64::MAX)));
            self.map
                .lock()
                .unwrap()
                .insert(key.clone(), (record, expires_at));
        }
        Ok(())
    }
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.live(key))
    }
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        Ok(self.map.lock().unwrap().remove(key).is_some())
    }
}

/// A custom backend implementing `transact_now` gets the same results through the sync path
/// as the same backend through the async one; a backend without it gets no in-process
/// bucket; a too-long key is refused as by `RemoteBucketBuilder::build`.
#[test]
fn default_transact_now_other_backends_and_long_keys() {
    /// An in-process wrapper of the test map, with `transact_now` (`sync`) or without it.
    #[derive(Debug, Default)]
    struct InProcessMap {
        map: MapBackend,
        sync: bool,
    }
    #[async_trait]
    impl Backend for InProcessMap {
        async fn transact(
            &self,
            key: &StorageKey,
            tx: &mut dyn Transaction,
        ) -> Result<(), BackendError> {
            self.map.transact(key, tx).await
        }
        async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
            self.map.read(key).await
        }
        async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
            self.map.remove(key).await
        }
        fn is_in_process(&self) -> bool {
            true
        }
        fn supports_transact_now(&self) -> bool {
            self.sync
        }
        fn transact_now(
            &self,
            key: StorageKeyRef<'_>,
            tx: &mut dyn Transaction,
        ) -> Option<Result<(), BackendError>> {
            if !self.sync {
                return None;
            }
            // `MapBackend::transact` never waits: one poll completes it.
            let key = key.to_owned();
            let mut fut = self.map.transact(&key, tx);
            match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
                Poll::Ready(r) => Some(r),
                Poll::Pending => None,
            }
        }
    }

    let rt = runtime();
    let mut rng = rand::rng();
    let clock = ManualClock::new(1_000);
    let sync = InProcessMap {
        sync: true,
        ..InProcessMap::default()
    };
    let m = manager(Arc::new(sync), &clock, Duration::ZERO);
    let r = manager(MapBackend::default(), &clock, Duration::ZERO);
    for case in 0..100 {
        let config = random_config(&mut rng);
        let key = format!("k{case}");
        for _ in 0..10 {
            clock.advance_nanos(rng.random_range(0..=1_000_000_000));
            let op = random_op(&mut rng);
            let (x, _) = sync_result(op, &m.in_process_bucket(&key, &config).unwrap().unwrap());
            let c2 = config.clone();
            let remote = r.builder().build(&key, move || c2.clone()).unwrap();
            let y = rt.block_on(remote_result(op, &remote));
            assert_eq!(x, y, "case {case}: {op:?} on {config:?}");
        }
        let sk = m.storage_key(&key).unwrap();
        assert_eq!(
            rt.block_on(m.backend().read(&sk)).unwrap(),
            rt.block_on(r.backend().read(&sk)).unwrap()
        );
    }

    let config = random_config(&mut rng);
    assert!(r.in_process_bucket("k", &config).unwrap().is_none());
    // In-process, but without `transact_now`.
    let n = manager(InProcessMap::default(), &clock, Duration::ZERO);
    assert!(n.in_process_bucket("k", &config).unwrap().is_none());
    let e = manager(
        EmbeddedBackend::with_clock(clock.clone()),
        &clock,
        Duration::ZERO,
    );

    let long = "x".repeat(600);
    assert!(matches!(
        e.in_process_bucket(&long, &config),
        Err(DistributedError::Key(KeyError::TooLong { .. }))
    ));
    assert!(matches!(
        e.builder().build(&long, || unreachable!()),
        Err(DistributedError::Key(KeyError::TooLong { .. }))
    ));
}

/// The configuration is cloned only for a key without a bucket: afterwards the stored one
/// rules (a caller passing another configuration still gets the stored bucket's answers).
#[test]
fn the_stored_configuration_rules_as_with_a_supplier() {
    let clock = ManualClock::new(0);
    let m = manager(
        EmbeddedBackend::with_clock(clock.clone()),
        &clock,
        Duration::ZERO,
    );
    let small = crate::common::simple(2, Duration::from_secs(60));
    let big = crate::common::simple(100, Duration::from_secs(60));
    let b = m.in_process_bucket("k", &small).unwrap().unwrap();
    assert!(b.try_consume(2).unwrap().value);
    let b = m.in_process_bucket("k", &big).unwrap().unwrap();
    let v = b.try_consume(1).unwrap();
    assert!(!v.value);
    assert_eq!(v.configuration, small);
    assert_eq!(m.backend().len(), 1);
}

/// `try_consume_live_with` runs only on a live bucket of the in-place path whose
/// configuration `select` accepts: nothing for an absent or expired key, a declined
/// configuration, another backend or a client clock, and a typed error (nothing changed)
/// for a bad argument or key.
#[test]
fn the_live_path_runs_only_on_a_live_bucket() {
    let clock = ManualClock::new(0);
    // The backend's clock (the default time source), no TTL margin.
    let m = ProxyManager::configure(EmbeddedBackend::with_clock(clock.clone()))
        .ttl_margin(Duration::ZERO)
        .build()
        .unwrap();
    assert!(m.runs_in_place());
    let config = crate::common::simple(3, Duration::from_secs(3));
    let any = |_: &BucketConfiguration| Some(());
    let tokens = |v: VerboseRef<'_, bool>| v.state.bandwidths()[0].tokens();
    let mut called = 0;
    assert_eq!(
        m.try_consume_live_with("k", 1, any, |(), _| called += 1)
            .unwrap(),
        None
    );
    assert_eq!(
        (called, m.backend().len()),
        (0, 0),
        "an absent key is not created"
    );

    m.in_process_bucket("k", &config)
        .unwrap()
        .unwrap()
        .try_consume(1)
        .unwrap();
    // `select` sees the stored configuration, and its answer reaches `f`.
    let seen = m
        .try_consume_live_with(
            "k",
            2,
            |c| Some(c.bandwidths()[0].capacity()),
            |capacity, v| (capacity, v.value, tokens(v)),
        )
        .unwrap();
    assert_eq!(seen, Some((3, true, 0)));
    let seen = m
        .try_consume_live_with("k", 1, any, |(), v| v.value)
        .unwrap();
    assert_eq!(seen, Some(false));

    // Declined, and bad input (a typed error): the bucket unchanged.
    clock.advance_nanos(1_000_000_000);
    assert_eq!(
        m.try_consume_live_with("k", 1, |_| None::<()>, |_, _| unreachable!())
            .unwrap(),
        None
    );
    assert!(matches!(
        m.try_consume_live_with("k", 0, any, |_, _| unreachable!()),
        Err(DistributedError::Operation(_))
    ));
    let long = "x".repeat(600);
    assert!(matches!(
        m.try_consume_live_with(&long, 1, any, |_, _| unreachable!()),
        Err(DistributedError::Key(KeyError::TooLong { .. }))
    ));
    let seen = m
        .try_consume_live_with("k", 1, any, |(), v| tokens(v))
        .unwrap();
    assert_eq!(
        seen,
        Some(0),
        "the token refilled in 1 s is still there, and taken"
    );

    // Full again after 3 s and expired (no TTL margin): the key is gone for this path.
    clock.advance_nanos(3_000_000_001);
    assert_eq!(
        m.try_consume_live_with("k", 1, any, |_, _| unreachable!())
            .unwrap(),
        None
    );

    // Another backend (no in-place path), and a client clock, with live buckets.
    let other = ProxyManager::new(MapBackend::default());
    let supplied = config.clone();
    let bucket = other
        .builder()
        .build("k", move || supplied.clone())
        .unwrap();
    assert!(runtime().block_on(bucket.try_consume(1)).unwrap());
    assert!(!other.runs_in_place());
    assert_eq!(
        other
            .try_consume_live_with("k", 1, any, |_, _| unreachable!())
            .unwrap(),
        None
    );
    let client = manager(
        EmbeddedBackend::with_clock(clock.clone()),
        &clock,
        Duration::ZERO,
    );
    client
        .in_process_bucket("k", &config)
        .unwrap()
        .unwrap()
        .try_consume(1)
        .unwrap();
    assert!(!client.runs_in_place());
    assert_eq!(
        client
            .try_consume_live_with("k", 1, any, |_, _| unreachable!())
            .unwrap(),
        None
    );
}
