//! The kit's checks after `conformance`, each one promise of the backend trait; those that
//! break the store on purpose are in `faults`.

use core::future::Future;
use core::pin::Pin;
use core::time::Duration;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use async_trait::async_trait;
use bucket4rs_core::{
    Bandwidth, BucketConfiguration, BucketState, Clock, ManualClock, TokensInheritanceStrategy, ops,
};
use bucket4rs_distributed::{
    Backend, BackendClock, BackendError, Command, DistributedError, RemoteBucket, StorageKey,
    TimeSource, Transaction, Write,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Ctx, raw};

type Check<B> = fn(Arc<Ctx<B>>) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;

/// Every check after `conformance`, in the order they run.
pub(super) fn all<B: Backend>() -> Vec<(&'static str, Check<B>)> {
    vec![
        ("exact_under_concurrency", |c| {
            Box::pin(exact_under_concurrency(c))
        }),
        ("retryable_errors", |c| Box::pin(retryable_errors(c))),
        ("creation_race", |c| Box::pin(creation_race(c))),
        ("expiry", |c| Box::pin(expiry(c))),
        ("corrupt_records", |c| Box::pin(corrupt_records(c))),
        ("foreign_records", |c| Box::pin(foreign_records(c))),
        ("hostile_keys", |c| Box::pin(hostile_keys(c))),
        ("deadline", |c| Box::pin(deadline(c))),
        ("batching", |c| Box::pin(batching(c))),
        ("stopped", |c| Box::pin(stopped(c))),
        ("frozen", |c| Box::pin(frozen(c))),
        ("restart", |c| Box::pin(restart(c))),
    ]
}

/// Fails the check with a message unless `cond`.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

mod faults;
use faults::{frozen, restart, stopped};

fn e(e: DistributedError) -> String {
    e.to_string()
}

/// `capacity` tokens refilled over `period`, greedy, starting full.
fn simple(capacity: u64, period: Duration) -> BucketConfiguration {
    BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(capacity, period).expect("a valid bandwidth"))
        .build()
        .expect("a valid configuration")
}

/// A limit that does not refill within any run.
fn no_refill(capacity: u64) -> BucketConfiguration {
    simple(capacity, Duration::from_secs(1_000_000_000))
}

/// A bucket of `config` on `key`.
fn bucket<X: Backend>(
    manager: &bucket4rs_distributed::ProxyManager<X>,
    key: &str,
    config: &BucketConfiguration,
) -> Result<RemoteBucket<X>, String> {
    let c = config.clone();
    manager.builder().build(key, move || c.clone()).map_err(e)
}

/// A backend that counts its transactions and the retryable errors it returned.
#[derive(Debug)]
struct Watch<X> {
    inner: X,
    transactions: AtomicU64,
    retryable: AtomicU64,
}

impl<X> Watch<X> {
    fn new(inner: X) -> Arc<Self> {
        Arc::new(Self {
            inner,
            transactions: AtomicU64::new(0),
            retryable: AtomicU64::new(0),
        })
    }
}

#[async_trait]
impl<X: Backend> Backend for Watch<X> {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        self.transactions.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.transact(key, tx).await;
        if r.as_ref().is_err_and(BackendError::is_retryable) {
            self.retryable.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        self.inner.read(key).await
    }
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        self.inner.remove(key).await
    }
    fn clock(&self) -> BackendClock {
        self.inner.clock()
    }
    fn is_in_process(&self) -> bool {
        self.inner.is_in_process()
    }
}

/// A transaction that stores `bytes` whatever the key holds: how the kit puts a damaged or
/// foreign record in place through the public trait, and asks for a write past a deadline.
struct RawWrite {
    bytes: Vec<u8>,
    deadline: Option<Instant>,
}

impl Transaction for RawWrite {
    fn command(&self) -> Command {
        // Only through `apply`: no native path computes it.
        Command::ReplaceConfiguration
    }
    fn needs_backend_clock(&self) -> bool {
        false
    }
    fn client_now(&self) -> Option<i64> {
        Some(bucket4rs_core::SystemNanosClock.now_nanos())
    }
    fn ttl_margin(&self) -> Duration {
        Duration::ZERO
    }
    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
    fn apply(&mut self, _current: Option<&[u8]>, _now: Option<i64>) -> Write {
        Write::Put {
            record: self.bytes.clone(),
            ttl: None,
        }
    }
}

/// Stores `bytes` under `key`, bypassing the manager.
async fn put_raw<X: Backend>(backend: &X, key: &StorageKey, bytes: &[u8]) -> Result<(), String> {
    let mut tx = RawWrite {
        bytes: bytes.to_vec(),
        deadline: Some(Instant::now() + Duration::from_secs(10)),
    };
    backend
        .transact(key, &mut tx)
        .await
        .map_err(|e| format!("writing a raw record under {key}: {e}"))
}

/// What [`hammer`] saw.
struct Hammered {
    /// Tokens granted.
    granted: u64,
    /// Retryable errors the backend returned (retried by the managers).
    retryable: u64,
    /// Calls that failed with a retryable error once the manager's retry policy was spent
    /// (under contention an optimistic store may lose every round): each took no token.
    refused: u64,
    /// Tokens left afterwards.
    left: i64,
}

impl Hammered {
    /// Every token taken was granted once, and (when enough calls were answered) all were.
    fn exact(&self, calls: u64, capacity: u64) -> Result<(), String> {
        let Hammered {
            granted,
            retryable,
            refused,
            left,
        } = *self;
        let taken = i64::try_from(capacity).unwrap_or(i64::MAX) - left;
        ensure!(
            i64::try_from(granted).unwrap_or(i64::MAX) == taken,
            "{granted} granted but {taken} taken ({retryable} retryable errors, {refused} calls \
             refused after their retries): a call was charged twice, or granted for nothing"
        );
        ensure!(
            calls - refused < capacity || granted == capacity,
            "{} calls answered on {capacity} tokens granted {granted}",
            calls - refused
        );
        Ok(())
    }
}

/// `managers` clients × `tasks` tasks each × `attempts` `try_consume(1)` on one key holding
/// `capacity` tokens that do not refill.
async fn hammer<B: Backend>(
    ctx: &Ctx<B>,
    check: &str,
    batched: bool,
    (managers, tasks, attempts, capacity): (usize, usize, usize, u64),
) -> Result<Hammered, String> {
    let config = no_refill(capacity);
    let mut watches = Vec::new();
    let mut handles = Vec::new();
    let mut first = None;
    for _ in 0..managers {
        let watch = Watch::new(ctx.connect().await?);
        let mut m = ctx.manager(Arc::clone(&watch), check);
        if !batched {
            m = m.max_batch(1);
        }
        let manager = m.build().map_err(e)?;
        for _ in 0..tasks {
            let b = bucket(&manager, "hot", &config)?;
            handles.push(tokio::spawn(async move {
                let (mut granted, mut refused) = (0u64, 0u64);
                for _ in 0..attempts {
                    match b.try_consume(1).await {
                        Ok(v) => granted += u64::from(v),
                        Err(err) if err.is_retryable() && !err.is_in_doubt() => refused += 1,
                        Err(err) => return Err(e(err)),
                    }
                }
                Ok::<_, String>((granted, refused))
            }));
        }
        first.get_or_insert(manager);
        watches.push(watch);
    }
    let (mut granted, mut refused) = (0, 0);
    for h in handles {
        let (g, r) = h.await.map_err(|e| e.to_string())??;
        granted += g;
        refused += r;
    }
    let manager = first.ok_or("no manager")?;
    let left = bucket(&manager, "hot", &config)?
        .available_tokens()
        .await
        .map_err(e)?;
    manager.remove("hot").await.map_err(e)?;
    let retryable = watches
        .iter()
        .map(|w| w.retryable.load(Ordering::Relaxed))
        .sum();
    Ok(Hammered {
        granted,
        retryable,
        refused,
        left,
    })
}

async fn exact_under_concurrency<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let shape = (4, 4, 40, 300);
    let h = hammer(&ctx, "exact", true, shape).await?;
    h.exact(640, 300)?;
    Ok(format!(
        "4 managers × 4 tasks, 640 calls on one key of 300 tokens: {} granted, {} retryable \
         errors{}",
        h.granted,
        h.retryable,
        refused_note(h.refused)
    ))
}

/// How many calls gave up after their retries, when any did.
fn refused_note(refused: u64) -> String {
    if refused == 0 {
        String::new()
    } else {
        format!(", {refused} calls refused (retryably) after their retries")
    }
}

async fn retryable_errors<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    // Unbatched: every call its own transaction, so optimistic stores lose races and retry.
    // A retryable error after a write would charge the retried call twice: fewer grants than
    // tokens taken.
    let shape = (4, 4, 30, 200);
    let h = hammer(&ctx, "retry", false, shape).await?;
    h.exact(480, 200)?;
    Ok(format!(
        "unbatched, 480 calls on 200 tokens: {} granted, {} retryable errors retried without \
         a double charge{}",
        h.granted,
        h.retryable,
        refused_note(h.refused)
    ))
}

async fn creation_race<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let config = no_refill(10);
    let mut managers = Vec::new();
    for _ in 0..8 {
        managers.push(
            ctx.manager(ctx.connect().await?, "race")
                .build()
                .map_err(e)?,
        );
    }
    for round in 0..3 {
        let key = format!("new-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let mut handles = Vec::new();
        for m in &managers {
            for _ in 0..2 {
                let b = bucket(m, &key, &config)?;
                let barrier = Arc::clone(&barrier);
                handles.push(tokio::spawn(async move {
                    barrier.wait().await;
                    b.try_consume(1).await.map_err(e)
                }));
            }
        }
        let mut granted = 0;
        for h in handles {
            granted += u64::from(h.await.map_err(|e| e.to_string())??);
        }
        let left = bucket(&managers[0], &key, &config)?
            .available_tokens()
            .await
            .map_err(e)?;
        managers[0].remove(&key).await.map_err(e)?;
        ensure!(
            granted == 10 && left == 0,
            "round {round}: 16 first calls at once on an absent key of 10 tokens granted \
             {granted}, {left} left"
        );
    }
    Ok("3 rounds of 16 first calls (8 managers) on an absent key: 10 of 10 granted".into())
}

async fn expiry<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let epoch = bucket4rs_core::SystemNanosClock.now_nanos();
    let clock = ManualClock::wall_clock(epoch);
    let backend = ctx.connect().await?;
    let manager = ctx
        .manager(Arc::clone(&backend), "expiry")
        .time_source(TimeSource::client(clock.clone()))
        .ttl_margin(Duration::ZERO)
        .build()
        .map_err(e)?;
    // Never forgettable: a recreated bucket would start empty again, so it has no TTL.
    let starts_empty = BucketConfiguration::builder()
        .add_bandwidth(
            Bandwidth::builder()
                .capacity(5)
                .refill_greedy(5, Duration::from_millis(200))
                .initial_tokens(0)
                .build()
                .map_err(|e| e.to_string())?,
        )
        .build()
        .map_err(|e| e.to_string())?;
    let kept = bucket(&manager, "kept", &starts_empty)?;
    ensure!(
        !kept.try_consume(1).await.map_err(e)?,
        "a bucket that starts empty granted a token"
    );
    // Forgettable 60 ms after the call: a TTL of 60 ms.
    let full = simple(5, Duration::from_millis(100));
    let short = bucket(&manager, "short", &full)?;
    ensure!(
        short.try_consume(3).await.map_err(e)?,
        "a full bucket refused"
    );
    // Forgettable in 12 minutes.
    let long = bucket(&manager, "long", &simple(5, Duration::from_secs(3600)))?;
    ensure!(
        long.try_consume(1).await.map_err(e)?,
        "a full bucket refused"
    );
    // The computations' clock moves on first, so that every answer below is the same whether
    // the store has dropped the short record yet or not.
    clock.advance(Duration::from_secs(10));
    let short_key = manager.storage_key("short").map_err(e)?;
    let waited = Instant::now();
    let mut expired = false;
    while waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if raw(&*backend, &short_key).await?.is_none() {
            expired = true;
            break;
        }
    }
    let waited = waited.elapsed();
    if ctx.expires {
        ensure!(
            expired,
            "a record written with a TTL of 60 ms was still there after {waited:?}"
        );
    }
    let long_key = manager.storage_key("long").map_err(e)?;
    ensure!(
        raw(&*backend, &long_key).await?.is_some(),
        "a record with a TTL of 12 minutes was gone after {waited:?}"
    );
    let kept_key = manager.storage_key("kept").map_err(e)?;
    ensure!(
        raw(&*backend, &kept_key).await?.is_some(),
        "a record written without a TTL was gone after {waited:?}"
    );
    let mut granted = 0;
    for _ in 0..6 {
        granted += u32::from(kept.try_consume(1).await.map_err(e)?);
    }
    ensure!(
        granted == 5,
        "a kept bucket that filled up granted {granted} of 5 (dropped and recreated empty?)"
    );
    let available = short.available_tokens().await.map_err(e)?;
    ensure!(
        available == 5,
        "the expired bucket answers {available} tokens, not 5"
    );
    for k in ["kept", "short", "long"] {
        manager.remove(k).await.map_err(e)?;
    }
    Ok(if ctx.expires {
        format!("a 60 ms TTL expired within {waited:?}; records without one, or a longer one, kept")
    } else {
        "records kept past their TTL (declared); answers unchanged".into()
    })
}

/// Every operation kind on a bucket whose record is `bytes` must fail with a typed format error
/// and leave the bytes as they are.
async fn refused_everywhere<X: Backend>(
    manager: &bucket4rs_distributed::ProxyManager<X>,
    key: &str,
    bytes: &[u8],
    what: &str,
) -> Result<(), String> {
    let config = no_refill(10);
    let b = bucket(manager, key, &config)?;
    let storage = manager.storage_key(key).map_err(e)?;
    put_raw(manager.backend(), &storage, bytes).await?;
    let typed = |r: Result<(), DistributedError>, op: &str| match r {
        Err(DistributedError::Format(_)) => Ok(()),
        Err(DistributedError::Backend(err))
            if err.kind() == bucket4rs_distributed::BackendErrorKind::WrongType =>
        {
            Ok(())
        }
        other => Err(format!(
            "{what}: {op} answered {other:?}, not a format error"
        )),
    };
    typed(b.try_consume(1).await.map(drop), "try_consume")?;
    typed(b.add_tokens(1).await, "add_tokens")?;
    typed(b.reset().await, "reset")?;
    typed(b.available_tokens().await.map(drop), "available_tokens")?;
    typed(
        b.replace_configuration(no_refill(20), TokensInheritanceStrategy::AsIs)
            .await,
        "replace_configuration",
    )?;
    let after = raw(manager.backend(), &storage).await?;
    ensure!(
        after.as_deref() == Some(bytes),
        "{what}: the record changed after refused operations"
    );
    Ok(())
}

/// A valid record of a bucket of 10 tokens with one taken, stored under `key`.
async fn valid_record<X: Backend>(
    manager: &bucket4rs_distributed::ProxyManager<X>,
    key: &str,
) -> Result<Vec<u8>, String> {
    let b = bucket(manager, key, &no_refill(10))?;
    ensure!(b.try_consume(1).await.map_err(e)?, "a full bucket refused");
    let storage = manager.storage_key(key).map_err(e)?;
    raw(manager.backend(), &storage)
        .await?
        .ok_or_else(|| "a written record reads as absent".into())
}

async fn corrupt_records<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let manager = ctx
        .manager(ctx.connect().await?, "corrupt")
        .build()
        .map_err(e)?;
    let good = valid_record(&manager, "k").await?;
    let mut magic = good.clone();
    magic[0] ^= 0xff;
    let mut longer = good.clone();
    longer.push(0);
    let shorter = &good[..good.len() - 1];
    for (what, bytes) in [
        ("a damaged magic", &magic[..]),
        ("a trailing byte", &longer[..]),
        ("a missing last byte", shorter),
    ] {
        refused_everywhere(&manager, "k", bytes, what).await?;
    }
    // Every single-byte flip: refused and unchanged, or (a byte of the state) a valid record.
    let config = no_refill(10);
    let b = bucket(&manager, "k", &config)?;
    let storage = manager.storage_key("k").map_err(e)?;
    let mut refused = 0;
    for i in 0..good.len() {
        let mut flipped = good.clone();
        flipped[i] ^= 0x55;
        put_raw(manager.backend(), &storage, &flipped).await?;
        match b.try_consume(1).await {
            Ok(_) => {}
            Err(DistributedError::Format(_)) => {
                refused += 1;
                let after = raw(manager.backend(), &storage).await?;
                ensure!(
                    after.as_deref() == Some(&flipped[..]),
                    "byte {i} flipped: refused, but the record changed"
                );
            }
            Err(other) => return Err(format!("byte {i} flipped: {other}")),
        }
    }
    manager.remove("k").await.map_err(e)?;
    Ok(format!(
        "3 damaged records refused by 5 operations each, and {refused} of {} byte flips; \
         every refused record unchanged",
        good.len()
    ))
}

async fn foreign_records<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let manager = ctx
        .manager(ctx.connect().await?, "foreign")
        .build()
        .map_err(e)?;
    let good = valid_record(&manager, "k").await?;
    // The format's version is its fifth byte (docs/distributed.md): a record of a later one.
    let mut future = good.clone();
    future[4] = future[4].wrapping_add(1);
    let variants: [(&str, Vec<u8>); 5] = [
        ("text", b"hello, world".to_vec()),
        ("JSON", br#"{"tokens": 5, "capacity": 10}"#.to_vec()),
        ("1 KiB of 0xff", vec![0xff; 1024]),
        ("a record of a later format version", future),
        ("an empty value", Vec::new()),
    ];
    for (what, bytes) in &variants {
        refused_everywhere(&manager, "k", bytes, what).await?;
    }
    manager.remove("k").await.map_err(e)?;
    Ok(
        "text, JSON, 1 KiB of 0xff, a later format version and an empty value: refused by 5 \
        operations each, unchanged"
            .into(),
    )
}

async fn hostile_keys<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let manager = ctx
        .manager(ctx.connect().await?, "keys")
        .build()
        .map_err(e)?;
    let prefix_len = manager.storage_key("").map_err(e)?.as_str().len();
    let longest = "z".repeat(512 - prefix_len);
    let keys: Vec<String> = vec![
        "'; DROP TABLE bucket4rs; --".into(),
        "{hash-tag}".into(),
        "a".into(),
        "A".into(),
        "a:b".into(),
        "a%3Ab".into(),
        "a b".into(),
        "nul\0byte".into(),
        "line\nbreak".into(),
        "\u{1F600} \u{00e9}".into(),
        "*".into(),
        "?".into(),
        "..".into(),
        String::new(),
        longest.clone(),
    ];
    let config = no_refill(100);
    for (i, k) in keys.iter().enumerate() {
        let b = bucket(&manager, k, &config)?;
        ensure!(
            b.try_consume(i as u64 + 1).await.map_err(e)?,
            "key {k:?} refused its first call"
        );
    }
    let mut storage = std::collections::HashSet::new();
    for (i, k) in keys.iter().enumerate() {
        let left = bucket(&manager, k, &config)?
            .available_tokens()
            .await
            .map_err(e)?;
        ensure!(
            left == 100 - (i as i64 + 1),
            "key {k:?} holds {left} tokens: it shares a record with another key"
        );
        storage.insert(manager.storage_key(k).map_err(e)?);
    }
    ensure!(storage.len() == keys.len(), "two keys share a storage key");
    let too_long = format!("{longest}z");
    ensure!(
        matches!(
            manager.storage_key(&too_long),
            Err(DistributedError::Key(_))
        ),
        "a key one byte over the limit was accepted"
    );
    for k in &storage {
        ensure!(
            manager
                .backend()
                .remove(k)
                .await
                .map_err(|e| e.to_string())?,
            "removing {k} found nothing"
        );
        ensure!(
            raw(manager.backend(), k).await?.is_none(),
            "{k} still there after removal"
        );
    }
    Ok(format!(
        "{} keys (quotes, braces, NUL, newline, emoji, empty, {} bytes stored) each a bucket \
         of its own, removed one by one",
        keys.len(),
        512
    ))
}

async fn deadline<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let backend = ctx.connect().await?;
    if backend.is_in_process() {
        return Ok(
            "not run: an in-process store never waits, so the manager gives no deadline".into(),
        );
    }
    let manager = ctx
        .manager(Arc::clone(&backend), "deadline")
        .build()
        .map_err(e)?;
    let good = valid_record(&manager, "k").await?;
    let past = Instant::now()
        .checked_sub(Duration::from_millis(1))
        .ok_or("no instant in the past")?;
    for key in ["k", "absent"] {
        let storage = manager.storage_key(key).map_err(e)?;
        let before = raw(&*backend, &storage).await?;
        let mut tx = RawWrite {
            bytes: b"written after the deadline".to_vec(),
            deadline: Some(past),
        };
        let result = backend.transact(&storage, &mut tx).await;
        let after = raw(&*backend, &storage).await?;
        ensure!(
            after == before,
            "a transaction reaching the store after its deadline wrote to the {key} key"
        );
        ensure!(
            result.is_err(),
            "a transaction past its deadline answered Ok: its caller would take a result that \
             was never stored"
        );
    }
    ensure!(
        raw(&*backend, &manager.storage_key("k").map_err(e)?).await? == Some(good),
        "changed"
    );
    manager.remove("k").await.map_err(e)?;
    Ok(
        "a write past its deadline refused on an existing and an absent key, nothing written"
            .into(),
    )
}

/// An operation of the batching check.
#[derive(Clone, Copy, Debug)]
enum RandomOp {
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

fn random_op(rng: &mut impl Rng) -> RandomOp {
    let n = rng.random_range(1..=40);
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
        _ => RandomOp::Reserve(n, rng.random_range(1..=10_000_000_000)),
    }
}

fn show<T: core::fmt::Debug, E: core::fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("error: {e}"),
    }
}

fn core_result(op: RandomOp, c: &BucketConfiguration, s: &mut BucketState, now: i64) -> String {
    match op {
        RandomOp::TryConsume(n) => show(s.apply(c, now, &ops::TryConsume(n))),
        RandomOp::Probe(n) => show(s.apply(c, now, &ops::TryConsumeAndReturnRemaining(n))),
        RandomOp::Estimate(n) => show(s.apply(c, now, &ops::EstimateAbilityToConsume(n))),
        RandomOp::AsMuch(l) => show(s.apply(c, now, &ops::TryConsumeAsMuchAsPossible(l))),
        RandomOp::Add(n) => show(s.apply(c, now, &ops::AddTokens(n))),
        RandomOp::Force(n) => show(s.apply(c, now, &ops::ForceAddTokens(n))),
        RandomOp::Reset => show(s.apply(c, now, &ops::Reset)),
        RandomOp::Available => show(s.apply(c, now, &ops::AvailableTokens)),
        RandomOp::Ignoring(n) => show(s.apply(c, now, &ops::ConsumeIgnoringRateLimits(n))),
        RandomOp::Reserve(n, w) => show(s.apply(
            c,
            now,
            &ops::Reserve {
                tokens: n,
                max_wait_nanos: w,
            },
        )),
    }
}

/// A wait in nanoseconds, as the core's operations answer it.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

async fn remote_result<X: Backend>(op: RandomOp, b: &RemoteBucket<X>) -> String {
    fn op_only<T: core::fmt::Debug>(r: Result<T, DistributedError>) -> String {
        match r {
            Err(DistributedError::Operation(e)) => format!("error: {e}"),
            Err(e) => format!("backend failure: {e}"),
            Ok(v) => format!("{v:?}"),
        }
    }
    match op {
        RandomOp::TryConsume(n) => op_only(b.try_consume(n).await),
        RandomOp::Probe(n) => op_only(b.try_consume_and_return_remaining(n).await),
        RandomOp::Estimate(n) => op_only(b.estimate_ability_to_consume(n).await),
        RandomOp::AsMuch(None) => op_only(b.try_consume_as_much_as_possible().await),
        RandomOp::AsMuch(Some(l)) => op_only(b.try_consume_as_much_as_possible_with_limit(l).await),
        RandomOp::Add(n) => op_only(b.add_tokens(n).await),
        RandomOp::Force(n) => op_only(b.force_add_tokens(n).await),
        RandomOp::Reset => op_only(b.reset().await),
        RandomOp::Available => op_only(b.available_tokens().await),
        RandomOp::Ignoring(n) => op_only(b.consume_ignoring_rate_limits(n).await.map(nanos)),
        RandomOp::Reserve(n, w) => op_only(
            b.reserve(n, Duration::from_nanos(w))
                .await
                .map(|r| r.map(nanos)),
        ),
    }
}

type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Polls `futures` to completion, each first poll in order: the first starts (and goes in
/// flight) before the second is polled, so the others queue behind it in order.
async fn join_in_order<T>(mut futures: Vec<Pending<'_, T>>) -> Vec<T> {
    let mut out: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    core::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    core::task::Poll::Ready(v) => *o = Some(v),
                    core::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            core::task::Poll::Pending
        } else {
            core::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

async fn batching<B: Backend>(ctx: Arc<Ctx<B>>) -> Result<String, String> {
    let clock = ManualClock::new(1_000_000_000);
    let watch = Watch::new(ctx.connect().await?);
    let manager = ctx
        .manager(Arc::clone(&watch), "batch")
        .time_source(TimeSource::client(clock.clone()))
        .build()
        .map_err(e)?;
    let mut rng = StdRng::seed_from_u64(0x6b34_7273);
    let mut ops_sent = 0;
    for round in 0..4 {
        let config = BucketConfiguration::builder()
            .add_bandwidth(
                Bandwidth::builder()
                    .capacity(rng.random_range(1..=200))
                    .refill_greedy(rng.random_range(1..=100), Duration::from_millis(700))
                    .build()
                    .map_err(|e| e.to_string())?,
            )
            .add_bandwidth(
                Bandwidth::builder()
                    .capacity(rng.random_range(100..=1_000))
                    .refill_intervally(rng.random_range(1..=100), Duration::from_secs(9))
                    .build()
                    .map_err(|e| e.to_string())?,
            )
            .build()
            .map_err(|e| e.to_string())?;
        let key = format!("k{round}");
        let b = bucket(&manager, &key, &config)?;
        let now = clock.now_nanos();
        let mut state = BucketState::new(&config, now);
        // The record exists before the burst, as the core's state does.
        b.available_tokens().await.map_err(e)?;
        let ops: Vec<RandomOp> = (0..24).map(|_| random_op(&mut rng)).collect();
        let expected: Vec<String> = ops
            .iter()
            .map(|op| core_result(*op, &config, &mut state, now))
            .collect();
        let got = join_in_order(
            ops.iter()
                .map(|op| Box::pin(remote_result(*op, &b)) as Pending<'_, String>)
                .collect(),
        )
        .await;
        for (i, (g, x)) in got.iter().zip(&expected).enumerate() {
            ensure!(
                g == x,
                "round {round}, operation {i} ({:?}) answered {g}, the core one by one {x}",
                ops[i]
            );
        }
        ops_sent += ops.len();
        manager.remove(&key).await.map_err(e)?;
        clock.advance(Duration::from_millis(333));
    }
    let transactions = watch.transactions.load(Ordering::Relaxed);
    Ok(format!(
        "{ops_sent} operations sent 24 at a time on one key: each answered as the core one by \
         one ({transactions} transactions{})",
        if watch.is_in_process() {
            ", in process: not batched"
        } else {
            ""
        }
    ))
}
