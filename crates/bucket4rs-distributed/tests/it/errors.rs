//! Every failure says what became of the call: not applied (and whether trying again may
//! help), or in doubt. Over a backend that fails on demand, with the stored record checked
//! after each failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bucket4rs_core::{ManualClock, OperationError};
use bucket4rs_distributed::{
    Backend, BackendError, BackendErrorKind, CircuitBreaker, DistributedError, ProxyManager,
    RetryPolicy, StorageKey, TimeSource, Transaction, Write,
};

use crate::common::{runtime, simple};
use crate::custom_backend::MapBackend;

/// How [`Failing`] answers a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Fail {
    No = 0,
    /// The connection was refused: nothing sent (retryable).
    Refused = 1,
    /// The server refused the command past the caller's deadline.
    Late = 2,
    /// Applied, then the reply was lost.
    LostReply = 3,
    /// Applied, then no reply ever (a frozen server): the manager's timeout ends the call.
    Hang = 4,
}

#[derive(Debug, Default)]
struct Failing {
    map: MapBackend,
    fail: AtomicU8,
}

impl Failing {
    fn set(&self, f: Fail) {
        self.fail.store(f as u8, Ordering::SeqCst);
    }
}

#[async_trait]
impl Backend for Failing {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        let err = |kind, what: &str| Err(BackendError::new(kind, what));
        match self.fail.load(Ordering::SeqCst) {
            1 => Err(BackendError::new(BackendErrorKind::Unavailable, "refused").retryable(true)),
            2 => err(BackendErrorKind::Timeout, "past the deadline"),
            3 => {
                self.map.transact(key, tx).await?;
                err(BackendErrorKind::InDoubt, "reset after sending")
            }
            4 => {
                self.map.transact(key, tx).await?;
                tokio::time::sleep(Duration::from_secs(3_600)).await;
                Ok(())
            }
            _ => self.map.transact(key, tx).await,
        }
    }
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        self.map.read(key).await
    }
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        self.map.remove(key).await
    }
}

/// What a failed call says about itself.
fn says(e: &DistributedError) -> (bool, bool) {
    (e.is_in_doubt(), e.is_retryable())
}

#[test]
fn every_failure_says_whether_it_was_applied() {
    let rt = runtime();
    let backend = Arc::new(Failing::default());
    let manager = ProxyManager::configure(Arc::clone(&backend))
        .time_source(TimeSource::client(ManualClock::new(0)))
        .timeout(Duration::from_millis(150))
        .retry(RetryPolicy::new(
            3,
            Duration::from_millis(1),
            Duration::from_millis(2),
        ))
        .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(3_600)))
        .max_batch(2)
        .build()
        .unwrap();
    let b = manager
        .builder()
        .build("k", || simple(100, Duration::from_secs(1_000_000)))
        .unwrap();
    rt.block_on(async {
        assert!(b.try_consume(1).await.unwrap());
        let tokens = || async { b.available_tokens().await.unwrap() };

        // Rejected as invalid: never sent.
        let e = b.try_consume(0).await.unwrap_err();
        assert_eq!(e, DistributedError::Operation(OperationError::ZeroTokens));
        assert_eq!(says(&e), (false, false));

        // Never sent (connection refused, retried by the manager until it gave up).
        backend.set(Fail::Refused);
        let e = b.try_consume(1).await.unwrap_err();
        assert!(
            matches!(&e, DistributedError::Backend(b) if b.kind() == BackendErrorKind::Unavailable)
        );
        assert_eq!(says(&e), (false, true), "{e}");
        // Refused by the server's deadline.
        backend.set(Fail::Late);
        let e = b.try_consume(1).await.unwrap_err();
        assert!(
            matches!(&e, DistributedError::Backend(b) if b.kind() == BackendErrorKind::Timeout)
        );
        assert_eq!(says(&e), (false, true), "{e}");
        backend.set(Fail::No);
        assert_eq!(tokens().await, 99, "neither was applied");

        // Sent, applied, the reply lost: in doubt, and indeed applied; the next call on the
        // key settles it (gives its token back).
        backend.set(Fail::LostReply);
        let e = b.try_consume(1).await.unwrap_err();
        assert!(
            matches!(&e, DistributedError::Backend(b) if b.kind() == BackendErrorKind::InDoubt)
        );
        assert_eq!(says(&e), (true, false), "{e}");
        assert_eq!(manager.unsettled(), 1);
        backend.set(Fail::No);
        assert!(b.try_consume(1).await.unwrap(), "settles, then consumes");
        assert_eq!(manager.unsettled(), 0);
        assert_eq!(
            tokens().await,
            98,
            "one token each for the two successful calls"
        );

        // Sent, then no reply: the manager's timeout with the call in flight is in doubt;
        // of the calls queued behind it, those whose batch was formed are in doubt, and one
        // still queued when its time ran out (max_batch 2) was not sent.
        backend.set(Fail::Hang);
        let call = || {
            let b = b.clone();
            tokio::spawn(async move { b.try_consume(1).await })
        };
        let mut calls = vec![call()];
        // Queued well after the lone call, so its batch is formed (sent) before their time
        // runs out; a batch then runs until its earliest caller's deadline, and the third
        // call, left queued behind it, is cut into the next batch at its own deadline's
        // instant: sent or not, as that race goes.
        tokio::time::sleep(Duration::from_millis(20)).await;
        calls.extend((0..3).map(|_| call()));
        let mut outcomes = Vec::new();
        for c in calls {
            let e = c.await.unwrap().unwrap_err();
            outcomes.push(says(&e));
        }
        assert_eq!(
            outcomes[..3],
            [(true, false), (true, false), (true, false)],
            "the lone call, its batch of two"
        );
        assert!(
            [(true, false), (false, true)].contains(&outcomes[3]),
            "the call left queued: {:?}",
            outcomes[3]
        );

        // The breaker counts the failed transactions (the calls', and the settlement's own
        // attempts to give back what the calls in doubt took): after at most one more call
        // in doubt it is open, and calls are refused at once, not applied.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut e = b.try_consume(1).await.unwrap_err();
        if says(&e) == (true, false) {
            e = b.try_consume(1).await.unwrap_err();
        }
        assert!(
            matches!(&e, DistributedError::Backend(b) if b.kind() == BackendErrorKind::Unavailable),
            "{e:?}"
        );
        assert_eq!(says(&e), (false, true), "{e}");
    });
}

/// A manager over a [`Failing`] backend on a manual clock, and its bucket `key` of 100 tokens
/// that do not come back during a test.
fn settling(
    timeout: Duration,
    key: &str,
) -> (
    Arc<Failing>,
    ProxyManager<Arc<Failing>>,
    bucket4rs_distributed::RemoteBucket<Arc<Failing>>,
) {
    let backend = Arc::new(Failing::default());
    let manager = ProxyManager::configure(Arc::clone(&backend))
        .time_source(TimeSource::client(ManualClock::new(0)))
        .timeout(timeout)
        .build()
        .unwrap();
    let b = manager
        .builder()
        .build(key, || simple(100, Duration::from_secs(1_000_000)))
        .unwrap();
    (backend, manager, b)
}

/// Waits (at most 5 s) until `manager` has settled every call in doubt, with nobody calling.
async fn until_settled(manager: &ProxyManager<Arc<Failing>>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while manager.unsettled() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "not settled within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The record of `b`'s key as stored (not through the manager, which would settle).
async fn stored(
    backend: &Failing,
    b: &bucket4rs_distributed::RemoteBucket<Arc<Failing>>,
) -> bucket4rs_distributed::format::Record {
    let bytes = backend.read(b.key()).await.unwrap().unwrap();
    bucket4rs_distributed::format::decode(&bytes).unwrap()
}

/// A call in doubt on a key that sees no more traffic is settled by the manager's background
/// task: what it took comes back without another call on the key.
#[test]
fn a_call_in_doubt_is_settled_in_the_background() {
    let rt = runtime();
    let (backend, manager, b) = settling(Duration::from_millis(150), "idle");
    rt.block_on(async {
        assert!(b.try_consume(5).await.unwrap());
        backend.set(Fail::LostReply);
        assert!(b.try_consume(7).await.unwrap_err().is_in_doubt());
        let applied = stored(&backend, &b).await;
        assert_eq!(applied.state.bandwidths()[0].tokens(), 88, "applied");
        assert_eq!(manager.unsettled(), 1);
        // The store answers again; nobody calls the key.
        backend.set(Fail::No);
        until_settled(&manager).await;
        let record = stored(&backend, &b).await;
        assert_eq!(
            record.state.bandwidths()[0].tokens(),
            95,
            "the 7 tokens came back"
        );
        // Only the settled call's tombstone: the first call's entry went with the second
        // call's write (the manager had its answer), the second's with its settlement.
        assert_eq!(record.ledger.len(), 1);
        assert_eq!(b.available_tokens().await.unwrap(), 95);
    });
}

/// A call whose future is dropped with its request in flight is in doubt like any other:
/// settled (its token comes back), and the ledger does not keep the manager's later calls
/// (the dropped call no longer holds the manager's floor).
#[test]
fn a_call_dropped_in_flight_is_settled_and_frees_the_ledger() {
    let rt = runtime();
    let (backend, manager, b) = settling(Duration::from_secs(10), "dropped");
    rt.block_on(async {
        backend.set(Fail::Hang);
        let dropped = tokio::time::timeout(Duration::from_millis(50), b.try_consume(3)).await;
        assert!(dropped.is_err(), "still in flight when dropped");
        assert_eq!(manager.unsettled(), 1);
        backend.set(Fail::No);
        until_settled(&manager).await;
        assert_eq!(
            b.available_tokens().await.unwrap(),
            100,
            "the 3 tokens came back"
        );
        for _ in 0..10 {
            assert!(b.try_consume(1).await.unwrap());
        }
        let ledger = stored(&backend, &b).await.ledger;
        assert!(ledger.len() <= 2, "{ledger:?}");
    });
}

/// The taxonomy as a table: which kinds say "in doubt" and which "try again".
#[test]
fn kinds_say_in_doubt_or_not_applied() {
    use BackendErrorKind::*;
    for (kind, in_doubt, retryable) in [
        (Unavailable, false, true),
        (Timeout, false, true),
        (InDoubt, true, false),
        (Protocol, false, false),
        (Conflict, false, true),
        (WrongType, false, false),
        (CapacityExhausted, false, false),
        (Inconsistent, true, false),
        (Other, false, false),
    ] {
        let e = DistributedError::Backend(BackendError::new(kind, "x"));
        assert_eq!(says(&e), (in_doubt, retryable), "{kind:?}");
        assert!(e.is_unavailable(), "{kind:?}");
    }
    let timeout = DistributedError::Timeout {
        after: Duration::from_secs(1),
    };
    assert_eq!(says(&timeout), (false, true));
    let _ = Write::Keep;
}
