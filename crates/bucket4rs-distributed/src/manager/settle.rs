//! The manager's side of in-doubt settlement (the record's side is `crate::ledger`).
//!
//! Every writing transaction to a remote backend gets an [`OperationId`]. One that ends in
//! doubt (sent, no reply) is remembered for its key; the next transaction on the key lists
//! it, and so does a background task that retries on its own until the key answers, so a
//! key with no more traffic is settled too. A doubt older than [`WINDOW`] is given up: the
//! record has forgotten it by then (see `docs/distributed.md`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::backend::{Backend, Command, OperationId, Transaction, Write};
use crate::error::DistributedError;
use crate::key::StorageKey;
use crate::ledger::{self, SHIFT};
use crate::record;

use super::ProxyManager;

/// How long a record remembers an operation, and a manager tries to settle it.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// The operations of one manager that are not answered yet, and those in doubt per key.
#[derive(Debug)]
pub(super) struct Settler {
    owner: u64,
    next: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// In flight or in doubt: the floor is the smallest.
    open: BTreeSet<u64>,
    doubts: HashMap<StorageKey, Vec<(u64, Instant)>>,
    /// Whether the background task runs.
    task: bool,
}

/// How a transaction with an id ended.
pub(super) enum End {
    /// The backend wrote the record this transaction computed (its settlements included).
    Written,
    /// It certainly changed nothing, or wrote nothing (a read): its settlements, if any,
    /// are still to be made.
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

    /// The id of a new transaction on `key`, listing the key's operations in doubt.
    pub(super) fn begin(&self, key: &StorageKey) -> OperationId {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let mut s = self.lock();
        s.open.insert(seq);
        let floor = s.open.first().copied().unwrap_or(seq);
        let settles = s
            .doubts
            .get(key)
            .map(|d| d.iter().map(|&(q, _)| q).collect())
            .unwrap_or_default();
        OperationId {
            owner: self.owner,
            seq,
            floor,
            settles,
            window: (WINDOW.as_nanos() >> SHIFT) as i64,
        }
    }

    /// Records how `id` ended; whether a background settlement task must be started.
    pub(super) fn end(&self, key: &StorageKey, id: &OperationId, end: End) -> bool {
        let mut s = self.lock();
        match end {
            End::Written => {
                s.open.remove(&id.seq);
                if !id.settles.is_empty() {
                    if let Some(d) = s.doubts.get_mut(key) {
                        d.retain(|(q, _)| !id.settles.contains(q));
                        if d.is_empty() {
                            s.doubts.remove(key);
                        }
                    }
                    for q in &id.settles {
                        s.open.remove(q);
                    }
                }
                false
            }
            End::Unchanged => {
                s.open.remove(&id.seq);
                false
            }
            End::InDoubt => {
                s.doubts
                    .entry(key.clone())
                    .or_default()
                    .push((id.seq, Instant::now()));
                !core::mem::replace(&mut s.task, true)
            }
        }
    }

    /// Forgets doubts older than [`WINDOW`]; the keys still in doubt (`None`: none, the task
    /// ends).
    fn pending(&self) -> Option<Vec<StorageKey>> {
        let mut s = self.lock();
        let now = Instant::now();
        let mut gone = Vec::new();
        s.doubts.retain(|_, d| {
            d.retain(|&(q, since)| {
                let keep = now.duration_since(since) < WINDOW;
                if !keep {
                    gone.push(q);
                }
                keep
            });
            !d.is_empty()
        });
        for q in gone {
            s.open.remove(&q);
        }
        if s.doubts.is_empty() {
            s.task = false;
            return None;
        }
        Some(s.doubts.keys().cloned().collect())
    }

    /// Operations in doubt, all keys (for tests and `Debug`).
    pub(super) fn in_doubt(&self) -> usize {
        self.lock().doubts.values().map(Vec::len).sum()
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

/// A transaction that only settles: runs the ledger's settlement on the key's record and
/// writes it back (nothing to do on an absent record: nothing of it is stored any more).
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
            Ok(p) if p.changed => {
                self.wrote = true;
                Write::Put {
                    record: crate::format::encode_with(&rec.config, &rec.state, &rec.ledger),
                    ttl: record::ttl_of(&rec.config, &rec.state, now, self.margin),
                }
            }
            _ => Write::Keep,
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
                    let id = manager.inner.settler.begin(&key);
                    if id.settles.is_empty() {
                        manager.inner.settler.end(&key, &id, End::Unchanged);
                        continue;
                    }
                    let mut tx = SettleTx {
                        id,
                        clock: manager.inner.time.0.clone(),
                        margin: manager.inner.ttl_margin,
                        wrote: false,
                    };
                    let result = manager.transact(&key, &mut tx).await;
                    let end = End::of(&result, tx.wrote);
                    if matches!(end, End::Written) {
                        pause = Duration::from_millis(50);
                    }
                    // A settlement in doubt is simply made again (it is idempotent): it is
                    // not a doubt of its own.
                    let end = if matches!(end, End::InDoubt) {
                        End::Unchanged
                    } else {
                        end
                    };
                    manager.inner.settler.end(&key, &tx.id, end);
                }
            }
        });
    }
}
