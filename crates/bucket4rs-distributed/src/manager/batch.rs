//! Request batching (see [`ManagerBuilder::batching`](super::ManagerBuilder::batching)).
//!
//! A key with an operation in flight through this manager has a `Lane` in `Inner::lanes`.
//! The first operation on an idle key inserts the lane and runs alone, at once. Operations
//! arriving meanwhile are queued in the lane as type-erased `Pending` items, each with a
//! oneshot channel to its caller. When the lane's in-flight work completes (or its caller is
//! cancelled), the queue is cut into a batch (closed channels, i.e. withdrawn callers,
//! skipped) and a spawned task runs it as ONE `BatchTx`, then the next batch, until the queue
//! is empty and the lane is removed, all under the map's shard lock so no item is stranded.
//!
//! A leased key's round trip (`lease/`) takes the lane too ([`take_lane`]), so a process
//! never has two transactions of one key in flight: on a busy lane it waits for its *turn*,
//! which the lane gives it before the next batch.

use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::sync::Arc;
use std::time::Instant;

use bucket4rs_core::{Answer, Clock};
use dashmap::mapref::entry::Entry;
use tokio::sync::oneshot;

use super::{ProxyManager, RemoteBucket, with_timeout};
use crate::backend::{Backend, Command, OperationId, Transaction, Write};
use crate::error::{BackendError, BackendErrorKind, DistributedError};
use crate::format::Record;
use crate::key::StorageKey;
use crate::record::{self, Job, Outcome, Supplier};

/// Per-key request batching (group commit) of a manager: at most `max` operations per batch
/// (1: off). See [`ManagerBuilder::max_batch`](super::ManagerBuilder::max_batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Batching {
    max: usize,
}

impl Batching {
    /// The default largest batch.
    pub(crate) const DEFAULT_MAX_BATCH: usize = 64;

    /// Batches of at most `max_batch_size` operations (0 and 1 disable batching).
    pub(crate) const fn up_to(max_batch_size: usize) -> Self {
        Self {
            max: if max_batch_size == 0 {
                1
            } else {
                max_batch_size
            },
        }
    }

    /// Whether operations are batched.
    pub(crate) const fn is_enabled(&self) -> bool {
        self.max > 1
    }
}

impl Default for Batching {
    /// On, at most [`DEFAULT_MAX_BATCH`](Self::DEFAULT_MAX_BATCH) operations per batch.
    fn default() -> Self {
        Self::up_to(Self::DEFAULT_MAX_BATCH)
    }
}

/// The operations queued behind the one in flight on a key.
#[derive(Default)]
pub(super) struct Lane {
    queue: Vec<Box<dyn Queued>>,
    /// A leased round trip waiting for the lane: it goes next, before the queue.
    turn: Option<oneshot::Sender<()>>,
}

/// One queued operation with its caller's reply channel, its type erased.
trait Queued: Send + Sync {
    fn command(&self) -> Command;
    /// The caller went away (dropped its future or timed out) before the batch was formed.
    fn is_withdrawn(&self) -> bool;
    /// When the caller stops waiting (it queued, then waits at most the manager's timeout).
    fn deadline(&self) -> Instant;
    /// The operation was cut into a batch: from now on it may be sent, so a caller that goes
    /// away no longer withdraws it.
    fn mark_sent(&self);
    /// Runs the operation on `record` at `now` exactly as a lone transaction would (the
    /// supplier creates the record when `None`; on an error the record is left as it was)
    /// and keeps the outcome. Whether the record must be written.
    fn apply(&mut self, record: &mut Option<Record>, now: i64, wall: bool) -> bool;
    /// Replaces the outcome with an error (the batch failed as a whole).
    fn fail(&mut self, e: DistributedError);
    /// Sends the outcome to the caller (if it is still there).
    fn deliver(self: Box<Self>);
}

struct Pending<J: Job> {
    job: J,
    command: Command,
    supplier: Supplier,
    out: Option<Outcome<J::Output>>,
    reply: oneshot::Sender<Outcome<J::Output>>,
    deadline: Instant,
    /// Shared with the caller: whether the operation went into a batch (see
    /// [`Queued::mark_sent`]).
    sent: Arc<AtomicBool>,
}

impl<J: Job> Queued for Pending<J> {
    fn command(&self) -> Command {
        self.command
    }

    fn is_withdrawn(&self) -> bool {
        self.reply.is_closed()
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    fn mark_sent(&self) {
        self.sent.store(true, Ordering::Release);
    }

    fn apply(&mut self, record: &mut Option<Record>, now: i64, wall: bool) -> bool {
        let (changed, out) = record::step(&self.job, record, &self.supplier, now, wall);
        self.out = Some(out);
        changed
    }

    fn fail(&mut self, e: DistributedError) {
        self.out = Some(Err(e));
    }

    fn deliver(self: Box<Self>) {
        let out = self.out.unwrap_or_else(|| Err(not_run()));
        // A caller that went away meanwhile simply does not read it.
        let _ = self.reply.send(out);
    }
}

/// Several queued operations of one key as one transaction: `apply` runs them in order on
/// the record, at one instant, and writes the final state once.
struct BatchTx<'a> {
    items: &'a mut [Box<dyn Queued>],
    commands: Vec<Command>,
    clock: Option<&'a (dyn Clock + Send + Sync)>,
    wall: bool,
    margin: Duration,
    /// The earliest deadline of its callers: a server must not run the batch after any of
    /// them gave up, or that caller would be charged for a call it saw time out.
    deadline: Option<Instant>,
    /// The batch's id (remote backends), see [`Transaction::operation`].
    id: Option<OperationId>,
    /// Whether the last `apply` returned a write.
    wrote: bool,
}

impl Transaction for BatchTx<'_> {
    fn command(&self) -> Command {
        match self.commands.as_slice() {
            [one] => *one,
            many => Command::Batch(many.len()),
        }
    }

    fn batch(&self) -> Option<&[Command]> {
        (self.commands.len() > 1).then_some(self.commands.as_slice())
    }

    fn needs_backend_clock(&self) -> bool {
        self.clock.is_none()
    }

    fn client_now(&self) -> Option<i64> {
        self.clock.map(|c| c.now_nanos())
    }

    fn ttl_margin(&self) -> Duration {
        self.margin
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    fn operation(&self) -> Option<&OperationId> {
        self.id.as_ref()
    }

    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> Write {
        self.wrote = false;
        let ledger = self.id.as_ref().map(|id| (id, self.commands.as_slice()));
        let written = record::reading(backend_now, self.clock).and_then(|now| {
            let (items, wall) = (&mut *self.items, self.wall);
            record::apply_bytes(current, now, self.margin, ledger, |record| {
                // Every operation in arrival order, at one instant, each as if alone.
                let mut changed = false;
                for item in items.iter_mut() {
                    changed |= item.apply(record, now, wall);
                }
                changed
            })
        });
        let write = written.unwrap_or_else(|e| {
            for item in self.items.iter_mut() {
                item.fail(duplicate(&e));
            }
            Write::Keep
        });
        self.wrote = matches!(write, Write::Put { .. });
        write
    }
}

/// Held by the operation that runs alone on an idle key: when it completes or is dropped,
/// hands the lane's queue to a batch task (or removes the lane when nothing queued).
pub(super) struct LaneGuard<'a, B: Backend> {
    manager: &'a ProxyManager<B>,
    key: &'a StorageKey,
    handle: tokio::runtime::Handle,
}

impl<B: Backend> Drop for LaneGuard<'_, B> {
    fn drop(&mut self) {
        if let Some(batch) = self.manager.next_batch(self.key) {
            let drain = Drain {
                manager: self.manager.clone(),
                key: self.key.clone(),
                finished: false,
            };
            // On a runtime that is shutting down the task is dropped at once: `Drain`'s
            // drop then releases the lane and the queued callers get an error.
            self.handle.spawn(drain.run(batch));
        }
    }
}

/// The task running a lane's batches until its queue is empty.
struct Drain<B: Backend> {
    manager: ProxyManager<B>,
    key: StorageKey,
    finished: bool,
}

impl<B: Backend> Drain<B> {
    async fn run(mut self, mut batch: Vec<Box<dyn Queued>>) {
        loop {
            self.manager.run_batch(&self.key, &mut batch).await;
            match self.manager.next_batch(&self.key) {
                Some(next) => batch = next,
                None => break,
            }
        }
        self.finished = true;
    }
}

impl<B: Backend> Drop for Drain<B> {
    fn drop(&mut self) {
        if !self.finished {
            // Dropped mid-way (runtime shut down): nobody will run the queue. Dropping it
            // closes every queued caller's channel (they get an error and nothing of theirs
            // was sent); the in-flight batch's callers likewise, with an unknown outcome, as
            // for any call cancelled in flight.
            self.manager.inner.lanes.remove(&self.key);
        }
    }
}

/// A leased round trip waiting for its turn on a busy lane. Dropped with the turn given
/// but not taken (its caller went away meanwhile), it passes the lane on.
struct Turn<'a, B: Backend> {
    rx: oneshot::Receiver<()>,
    manager: &'a ProxyManager<B>,
    key: &'a StorageKey,
    handle: tokio::runtime::Handle,
}

impl<B: Backend> Drop for Turn<'_, B> {
    fn drop(&mut self) {
        if self.rx.try_recv().is_ok() {
            drop(LaneGuard {
                manager: self.manager,
                key: self.key,
                handle: self.handle.clone(),
            });
        }
    }
}

/// Takes `key`'s lane for a transaction of the caller's own (a leased key's round trip):
/// at once when the key is idle, else after the batch in flight (before the calls queued
/// behind it). The calls batched meanwhile queue behind it and go as one batch when the
/// guard is dropped.
pub(super) async fn take_lane<'a, B: Backend>(
    manager: &'a ProxyManager<B>,
    key: &'a StorageKey,
    handle: tokio::runtime::Handle,
) -> LaneGuard<'a, B> {
    loop {
        let rx = match manager.inner.lanes.entry(key.clone()) {
            Entry::Vacant(v) => {
                v.insert(Lane::default());
                return LaneGuard {
                    manager,
                    key,
                    handle,
                };
            }
            Entry::Occupied(mut o) => {
                let (tx, rx) = oneshot::channel();
                o.get_mut().turn = Some(tx);
                rx
            }
        };
        let mut turn = Turn {
            rx,
            manager,
            key,
            handle: handle.clone(),
        };
        // Given: the lane is ours (occupied all along). Not given (the lane's task was
        // dropped, and the lane with it): look again.
        if (&mut turn.rx).await.is_ok() {
            return LaneGuard {
                manager,
                key,
                handle,
            };
        }
    }
}

impl<B: Backend> ProxyManager<B> {
    /// Cuts the next batch from a lane's queue, skipping withdrawn callers; removes the
    /// lane (the key is idle again) when nothing is left. Under the shard lock, so an
    /// operation queued concurrently is either in the batch or finds no lane and goes alone.
    /// A leased round trip waiting for its turn goes first: it is given the lane, and no
    /// batch is cut.
    fn next_batch(&self, key: &StorageKey) -> Option<Vec<Box<dyn Queued>>> {
        let max = self.inner.batching.max;
        match self.inner.lanes.entry(key.clone()) {
            Entry::Vacant(_) => None,
            Entry::Occupied(mut o) => {
                if let Some(turn) = o.get_mut().turn.take()
                    && turn.send(()).is_ok()
                {
                    return None;
                }
                let queue = &mut o.get_mut().queue;
                queue.retain(|q| !q.is_withdrawn());
                if queue.is_empty() {
                    o.remove();
                    return None;
                }
                let rest = if queue.len() > max {
                    queue.split_off(max)
                } else {
                    Vec::new()
                };
                let batch = core::mem::replace(queue, rest);
                for item in &batch {
                    item.mark_sent();
                }
                Some(batch)
            }
        }
    }

    /// Runs one batch as one backend transaction (with the manager's timeout and retries)
    /// and delivers every outcome.
    async fn run_batch(&self, key: &StorageKey, items: &mut Vec<Box<dyn Queued>>) {
        let inner = &self.inner;
        let commands = items.iter().map(|q| q.command()).collect();
        let deadline = items.iter().map(|q| q.deadline()).min();
        let mut tx = BatchTx {
            items: items.as_mut_slice(),
            commands,
            clock: inner.time.0.as_deref(),
            wall: inner.wall,
            margin: inner.ttl_margin,
            deadline,
            id: self.begin_operation(key),
            wrote: false,
        };
        let in_flight = super::settle::InFlight {
            manager: self,
            key,
            id: tx.id.clone(),
        };
        let result = self.transact(key, &mut tx).await;
        in_flight.finished();
        let (id, wrote) = (tx.id.take(), tx.wrote);
        self.end_operation(key, id, &result, wrote);
        if let Err(e) = result {
            // Every caller gets the error; the last one the original (with its source).
            let n = items.len();
            for item in items.iter_mut().take(n.saturating_sub(1)) {
                item.fail(duplicate(&e));
            }
            if let Some(last) = items.last_mut() {
                last.fail(e);
            }
        }
        for item in items.drain(..) {
            item.deliver();
        }
    }
}

/// A copy of `e` for another caller of the same batch (a backend error's source, which is
/// not clonable, stays with the original).
fn duplicate(e: &DistributedError) -> DistributedError {
    match e {
        DistributedError::Operation(o) => DistributedError::Operation(*o),
        DistributedError::Config(c) => DistributedError::Config(c.clone()),
        DistributedError::Key(k) => DistributedError::Key(k.clone()),
        DistributedError::Format(f) => DistributedError::Format(f.clone()),
        DistributedError::Timeout { after } => DistributedError::Timeout { after: *after },
        // The backend's verdict on retrying goes to every caller, not only the last.
        DistributedError::Backend(b) => DistributedError::Backend(
            BackendError::new(b.kind(), b.message())
                .retryable(b.is_retryable())
                .refused_until_fixed(b.is_refused_until_fixed()),
        ),
        DistributedError::Blocking(s) => DistributedError::Blocking(s),
        DistributedError::InvalidSetting { setting, reason } => {
            DistributedError::InvalidSetting { setting, reason }
        }
    }
}

pub(super) fn not_run() -> DistributedError {
    DistributedError::Backend(BackendError::new(
        BackendErrorKind::Protocol,
        "the backend completed without running the transaction",
    ))
}

/// A queued call whose batch task was dropped (its runtime shut down) before it answered:
/// in doubt when its batch had been formed (it may have been sent), else not applied.
fn abandoned(sent: bool) -> DistributedError {
    DistributedError::Backend(if sent {
        BackendError::new(
            BackendErrorKind::InDoubt,
            "the task running this call's batch was dropped (runtime shut down) with the batch \
             possibly in flight: it may have been applied",
        )
    } else {
        BackendError::new(
            BackendErrorKind::Unavailable,
            "the task running this call's batch was dropped (runtime shut down) before the \
             call was sent: it was not applied",
        )
    })
}

/// A queued call that timed out after its batch was formed: its batch may be in flight.
fn timed_out_in_flight(after: Duration) -> DistributedError {
    DistributedError::Backend(BackendError::new(
        BackendErrorKind::InDoubt,
        format!(
            "no reply within the timeout ({after:?}) with the call's batch possibly in flight: \
             it may have been applied"
        ),
    ))
}

/// The batching path: goes at once when the key has nothing in flight (and hands what
/// queued meanwhile to a batch task when done), else queues behind it.
pub(super) async fn run_batched<B: Backend, A: Answer, J>(
    bucket: &RemoteBucket<B, A>,
    job: J,
    command: Command,
    handle: tokio::runtime::Handle,
) -> Outcome<J::Output>
where
    J: Job + 'static,
    J::Output: 'static,
{
    let inner = &bucket.manager.inner;
    let sent = Arc::new(AtomicBool::new(false));
    let (job, reply) = match inner.lanes.entry(bucket.key.clone()) {
        Entry::Vacant(v) => {
            v.insert(Lane::default());
            (Some(job), None)
        }
        Entry::Occupied(mut o) => {
            let (tx, rx) = oneshot::channel();
            o.get_mut().queue.push(Box::new(Pending {
                job,
                command,
                supplier: Arc::clone(&bucket.supplier),
                out: None,
                reply: tx,
                // Taken before the caller's timer starts below, so never later than it.
                deadline: super::now() + inner.timeout,
                sent: Arc::clone(&sent),
            }));
            (None, Some(rx))
        }
    };
    if let Some(job) = job {
        // Released on completion and on cancellation alike.
        let _lane = LaneGuard {
            manager: &bucket.manager,
            key: &bucket.key,
            handle,
        };
        return bucket.run_alone(job, command).await;
    }
    let Some(rx) = reply else {
        return Err(not_run());
    };
    // Dropping `rx` (timeout or cancellation) before the batch is formed withdraws the
    // operation: the batch task skips closed channels.
    let mut rx = rx;
    let answer = |r: Result<Outcome<J::Output>, oneshot::error::RecvError>| {
        r.unwrap_or_else(|_| Err(abandoned(sent.load(Ordering::Acquire))))
    };
    let waited = with_timeout(inner.timeout, async { Ok(answer((&mut rx).await)) }).await;
    match waited {
        Ok(outcome) => outcome,
        Err(DistributedError::Timeout { after }) if sent.load(Ordering::Acquire) => {
            // The batch runs within its earliest caller's deadline, so its outcome (this
            // call's, applied or in doubt for the whole batch) is due now: wait for it rather
            // than report a call in doubt that the batch then answers for.
            match tokio::time::timeout(OUTCOME_GRACE, rx).await {
                Ok(r) => answer(r),
                Err(_) => Err(timed_out_in_flight(after)),
            }
        }
        Err(e) => Err(e),
    }
}

/// How long a caller whose batch was sent waits past its own timeout for the batch's
/// outcome, which the batch's deadline makes due at that moment (scheduling slack).
const OUTCOME_GRACE: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use core::pin::pin;
    use core::task::{Context, Poll, Waker};

    use super::*;
    use crate::EmbeddedBackend;

    /// A leased round trip waiting for the lane, polled once (its turn asked for), while a
    /// batch is in flight on `key` (the lane taken).
    fn busy() -> (
        tokio::runtime::Runtime,
        ProxyManager<EmbeddedBackend>,
        StorageKey,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let manager = ProxyManager::configure(EmbeddedBackend::new())
            .build()
            .unwrap();
        let key = manager.storage_key("hot").unwrap();
        manager.inner.lanes.insert(key.clone(), Lane::default());
        (rt, manager, key)
    }

    #[test]
    fn a_turn_taken_holds_the_lane_until_its_round_trip_ends() {
        let (rt, manager, key) = busy();
        let mut cx = Context::from_waker(Waker::noop());
        let mut turn = pin!(take_lane(&manager, &key, rt.handle().clone()));
        assert!(turn.as_mut().poll(&mut cx).is_pending());
        // The batch in flight ends: the lane goes to the round trip, no batch is cut.
        assert!(manager.next_batch(&key).is_none());
        let Poll::Ready(lane) = turn.as_mut().poll(&mut cx) else {
            panic!("the turn was given");
        };
        assert!(manager.inner.lanes.contains_key(&key));
        drop(lane);
        assert!(!manager.inner.lanes.contains_key(&key), "the key is idle");
    }

    #[test]
    fn a_turn_given_but_not_taken_passes_the_lane_on() {
        let (rt, manager, key) = busy();
        let mut cx = Context::from_waker(Waker::noop());
        {
            let mut turn = pin!(take_lane(&manager, &key, rt.handle().clone()));
            assert!(turn.as_mut().poll(&mut cx).is_pending());
            assert!(manager.next_batch(&key).is_none());
            assert!(manager.inner.lanes.contains_key(&key));
            // Its caller goes away before taking it.
        }
        assert!(
            !manager.inner.lanes.contains_key(&key),
            "the lane was left taken by nobody"
        );
    }

    #[test]
    fn a_turn_dropped_before_it_is_given_leaves_the_lane_to_its_batch() {
        let (rt, manager, key) = busy();
        let mut cx = Context::from_waker(Waker::noop());
        {
            let mut turn = pin!(take_lane(&manager, &key, rt.handle().clone()));
            assert!(turn.as_mut().poll(&mut cx).is_pending());
        }
        assert!(
            manager.inner.lanes.contains_key(&key),
            "the batch still holds it"
        );
        // The batch ends with nothing queued: the key is idle.
        assert!(manager.next_batch(&key).is_none());
        assert!(!manager.inner.lanes.contains_key(&key));
    }
}
