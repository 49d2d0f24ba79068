//! The manager's side of in-doubt settlement and lease returns (the record's side is
//! `crate::ledger`).
//!
//! Every writing transaction to a remote backend (and every transaction of a leased key) gets
//! an [`OperationId`]. One that ends in doubt (sent, no reply) is remembered for its key; the
//! next transaction on the key lists it, and so does a background task that retries on its
//! own until the key answers, so a key with no more traffic is settled too. A lease that
//! ended is remembered the same way with the tokens it did not use, until a transaction has
//! given them back. A doubt or return older than [`WINDOW`] is given up: the record has
//! forgotten it by then (see `docs/distributed.md`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Command, OperationId, Transaction, Write};
use crate::error::DistributedError;
use crate::key::StorageKey;
use crate::ledger::{self, SHIFT};
use crate::record;

use super::ProxyManager;

/// How long a record remembers an operation, and a manager tries to settle it.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// The operations of one manager that are not answered yet, those in doubt and the leases
/// whose unused tokens are still to be given back, per key.
#[derive(Debug)]
pub(super) struct Settler {
    owner: u64,
    next: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<StorageKey, Open>,
    /// Whether the background task runs.
    task: bool,
}

/// One key's operations that the record must not forget yet.
#[derive(Debug, Default)]
struct Open {
    /// In flight, in doubt, or a live lease: the key's floor is the smallest.
    seqs: BTreeSet<u64>,
    doubts: Vec<(u64, Instant)>,
    /// Ended leases with what they did not use: `(seq, refill units per bandwidth, since)`.
    returns: Vec<(u64, Vec<u128>, Instant)>,
}

impl Open {
    fn is_empty(&self) -> bool {
        self.seqs.is_empty() && self.doubts.is_empty() && self.returns.is_empty()
    }
}

/// How a transaction with an id ended.
pub(super) enum End {
    /// The backend wrote the record this transaction computed (its settlements and returns
    /// included).
    Written,
    /// Written, and it took a lease that this manager now serves from (its entry is marked,
    /// and kept until the lease's return: [`Settler::release`]).
    Leased,
    /// It certainly changed nothing, or wrote nothing (a read): its settlements and returns,
    /// if any, are still to be made.
    Unchanged,
    /// It may have been applied.
    InDoubt,
}

impl End {
    pub(super) fn of(result: &Result<(), DistributedError>, wrote: bool) -> Self {
        match result {
            Ok(()) if wrote => Self::Written,
            Err(e) if e.is_in_doubt() => Self::InDoubt,
            _ => Self::Unchanged,
        }
    }
}

impl Settler {
    pub(super) fn new() -> Self {
        Self {
            owner: rand::random(),
            next: AtomicU64::new(1),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The id of a new transaction on `key`, listing the key's operations in doubt and the
    /// unused tokens of its ended leases. The floor is the key's: the record holds only this
    /// key's operations.
    pub(super) fn begin(&self, key: &StorageKey) -> OperationId {
        self.begin_kept(key, WINDOW)
    }

    /// [`begin`](Self::begin) for an operation whose entry the record keeps `window` (at
    /// most [`WINDOW`]).
    pub(super) fn begin_kept(&self, key: &StorageKey, window: Duration) -> OperationId {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let mut s = self.lock();
        let open = match s.keys.get_mut(key) {
            Some(o) => o,
            None => s.keys.entry(key.clone()).or_default(),
        };
        open.seqs.insert(seq);
        OperationId {
            owner: self.owner,
            seq,
            floor: open.seqs.first().copied().unwrap_or(seq),
            settles: open.doubts.iter().map(|&(q, _)| q).collect(),
            returns: open
                .returns
                .iter()
                .map(|(q, unused, _)| (*q, unused.clone()))
                .collect(),
            window: (window.min(WINDOW).as_nanos() >> SHIFT) as i64,
        }
    }

    /// Records how `id` ended; whether a background settlement task must be started.
    pub(super) fn end(&self, key: &StorageKey, id: &OperationId, end: End) -> bool {
        let mut s = self.lock();
        let Some(open) = s.keys.get_mut(key) else {
            return false;
        };
        let start = match end {
            End::Written | End::Leased => {
                open.seqs.remove(&id.seq);
                open.doubts.retain(|(q, _)| !id.settles.contains(q));
                for q in &id.settles {
                    open.seqs.remove(q);
                }
                open.returns
                    .retain(|(q, _, _)| !id.returns.iter().any(|(r, _)| r == q));
                false
            }
            End::Unchanged => {
                open.seqs.remove(&id.seq);
                false
            }
            End::InDoubt => {
                open.doubts.push((id.seq, Instant::now()));
                !core::mem::replace(&mut s.task, true)
            }
        };
        if s.keys.get(key).is_some_and(Open::is_empty) {
            s.keys.remove(key);
        }
        start
    }

    /// A lease (its entry marked `seq` on `key`) ended with `unused` (refill units per
    /// bandwidth): given back by the key's next transaction, or by the background task;
    /// whether that task must be started. With nothing to give back there is nothing to do:
    /// the entry goes with this manager's next lease of the key, or expires.
    pub(super) fn release(&self, key: &StorageKey, seq: u64, unused: Vec<u128>) -> bool {
        if unused.iter().all(|&u| u == 0) {
            return false;
        }
        let mut s = self.lock();
        let open = match s.keys.get_mut(key) {
            Some(o) => o,
            None => s.keys.entry(key.clone()).or_default(),
        };
        open.returns.push((seq, unused, Instant::now()));
        !core::mem::replace(&mut s.task, true)
    }

    /// Forgets doubts and returns older than [`WINDOW`] (the record has forgotten their
    /// entries); the keys with something still to settle or return (`None`: none, the task
    /// ends).
    fn pending(&self) -> Option<Vec<StorageKey>> {
        let mut s = self.lock();
        let now = Instant::now();
        let young = |since: Instant| now.duration_since(since) < WINDOW;
        s.keys.retain(|_, open| {
            let old: Vec<u64> = (open.doubts.iter())
                .filter(|&&(_, since)| !young(since))
                .map(|&(q, _)| q)
                .collect();
            open.doubts.retain(|&(_, since)| young(since));
            open.returns.retain(|(_, _, since)| young(*since));
            for q in old {
                open.seqs.remove(&q);
            }
            !open.is_empty()
        });
        let keys: Vec<StorageKey> = s
            .keys
            .iter()
            .filter(|(_, o)| !o.doubts.is_empty() || !o.returns.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        if keys.is_empty() {
            s.task = false;
            return None;
        }
        Some(keys)
    }

    /// Whether settlements or returns are pending and the background task must be started
    /// for them.
    pub(super) fn kick(&self) -> bool {
        let mut s = self.lock();
        let pending = s
            .keys
            .values()
            .any(|o| !o.doubts.is_empty() || !o.returns.is_empty());
        pending && !core::mem::replace(&mut s.task, true)
    }

    /// Operations in doubt, all keys (for tests and `Debug`).
    pub(super) fn in_doubt(&self) -> usize {
        self.lock().keys.values().map(|o| o.doubts.len()).sum()
    }
}

/// Ends an operation whose future was dropped before it finished (a caller that went away
/// with the request possibly in flight): in doubt, so it is settled like any other, and the
/// owner's floor moves on.
pub(super) struct InFlight<'a, B: Backend> {
    pub(super) manager: &'a ProxyManager<B>,
    pub(super) key: &'a StorageKey,
    pub(super) id: Option<OperationId>,
}

impl<B: Backend> InFlight<'_, B> {
    /// The operation finished: the caller records how.
    pub(super) fn finished(mut self) {
        self.id = None;
    }
}

impl<B: Backend> Drop for InFlight<'_, B> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.manager.end_with(self.key, &id, End::InDoubt);
        }
    }
}

/// A transaction that only settles and returns: runs the ledger's settlements and lease
/// returns on the key's record and writes it back (nothing to do on an absent record:
/// nothing of it is stored any more).
struct SettleTx {
    id: OperationId,
    clock: Option<std::sync::Arc<dyn bucket4rs_core::Clock + Send + Sync>>,
    margin: Duration,
    wrote: bool,
}

impl Transaction for SettleTx {
    fn command(&self) -> Command {
        Command::AvailableTokens
    }
    fn needs_backend_clock(&self) -> bool {
        self.clock.is_none()
    }
    fn client_now(&self) -> Option<i64> {
        self.clock.as_ref().map(|c| c.now_nanos())
    }
    fn ttl_margin(&self) -> Duration {
        self.margin
    }
    fn operation(&self) -> Option<&OperationId> {
        Some(&self.id)
    }
    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> Write {
        self.wrote = false;
        let Ok(now) = record::reading(backend_now, self.clock.as_deref()) else {
            return Write::Keep;
        };
        let Some(bytes) = current else {
            self.wrote = true;
            return Write::Keep;
        };
        let Ok(mut rec) = crate::format::decode(bytes) else {
            return Write::Keep;
        };
        match ledger::before(&mut rec, &self.id, now) {
            Ok(p) => {
                // Made: written, or nothing to write (a return whose entry is gone).
                self.wrote = true;
                if !p.changed {
                    return Write::Keep;
                }
                Write::Put {
                    record: crate::format::encode_with(&rec.config, &rec.state, &rec.ledger),
                    ttl: record::ttl_of(&rec.config, &rec.state, now, self.margin),
                }
            }
            Err(_) => Write::Keep,
        }
    }
}

impl<B: Backend> ProxyManager<B> {
    /// Starts the background settlement task (on the current runtime; without one, the
    /// doubts are settled by the keys' next transactions only).
    pub(super) fn spawn_settler(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.inner.settler.lock().task = false;
            return;
        };
        // Held weakly, as the breaker's probe: a dropped manager ends the task (its doubts
        // stay charged, as for a process that stops).
        let weak = std::sync::Arc::downgrade(&self.inner);
        handle.spawn(async move {
            let mut pause = Duration::from_millis(50);
            loop {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let manager = ProxyManager { inner };
                let Some(keys) = manager.inner.settler.pending() else {
                    return;
                };
                for key in keys {
                    if let Ok(true) = manager.settle_key(&key).await {
                        pause = Duration::from_millis(50);
                    }
                }
            }
        });
    }
}

impl<B: Backend> ProxyManager<B> {
    /// One transaction that makes the settlements and returns pending on `key`; whether it
    /// made them (`false`: nothing was pending, or they are still pending after a failure).
    pub(super) async fn settle_key(&self, key: &StorageKey) -> Result<bool, DistributedError> {
        let id = self.inner.settler.begin(key);
        if id.settles.is_empty() && id.returns.is_empty() {
            self.inner.settler.end(key, &id, End::Unchanged);
            return Ok(false);
        }
        let mut tx = SettleTx {
            id,
            clock: self.inner.time.0.clone(),
            margin: self.inner.ttl_margin,
            wrote: false,
        };
        let result = self.transact(key, &mut tx).await;
        let end = match End::of(&result, tx.wrote) {
            // A settlement in doubt is simply made again (it is idempotent): it is not a
            // doubt of its own.
            End::InDoubt => End::Unchanged,
            end => end,
        };
        let made = matches!(end, End::Written);
        self.inner.settler.end(key, &tx.id, end);
        result.map(|()| made)
    }
}
