//! Leasing (see [`Leasing`]): on a hot key, a manager takes a block of tokens from the
//! shared bucket in one round trip and serves its callers from it in this process.
//!
//! Per key the manager keeps a [`Slot`]: the *lease* (the tokens taken and not used yet, and
//! the operation whose ledger entry took them) and the *view* (the record as the last round
//! trip left it, lease included: the shared bucket as this process last saw it). A call runs
//! on the view at the current reading:
//! - the view refuses it (or it only reads): answered here, from the view;
//! - the view grants it with no debt and the lease holds what it takes: answered here, the
//!   lease and the view drawn down;
//! - otherwise one round trip ([`LeaseTx`]): the lease's unused tokens go back (an exact
//!   partial settlement of its entry, `crate::ledger`), the call runs on the shared bucket,
//!   and a new lease is taken (`Command::Lease`) after a consuming call, sized to what this
//!   process used per [`Leasing::period`] and to its share of what the bucket had.
//!
//! One transaction of a key in flight per process: callers that find the key's round trip in
//! flight take the batching path (`batch.rs`; without batching they wait for it and are
//! answered at its reading), and the round trip takes its turn in the key's batching lane
//! (`batch::take_lane`). The settings are [`Leasing`] (`settings.rs`). A lease ends at its lifetime, after an idle spell (the keeper task), at the
//! next round trip, and on [`ProxyManager::release_leases`]; its unused tokens are given back
//! by the settler (`settle.rs`) like a settlement, so a lease whose process dies is lost from
//! the bucket, never granted twice.

use core::fmt;
use core::time::Duration;
use std::sync::{Arc, Mutex, MutexGuard};

use bucket4rs_core::ops::{AvailableTokens, Refilled, TryConsumeAsMuchAsPossible};
use bucket4rs_core::{Answer, BucketConfiguration, BucketState, VerboseResult};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::settle::End;
use super::{ProxyManager, RemoteBucket, batch, with_timeout};
use crate::backend::{Backend, Command, OperationId, Transaction, Write};
use crate::error::DistributedError;
use crate::format::Record;
use crate::key::StorageKey;
use crate::ledger::MAX_ENTRIES;
use crate::record::{self, Job, Outcome, Supplier};

mod settings;

pub use settings::Leasing;

/// Leases a key may hold in its record's ledger at once (the rest of the ledger is kept for
/// settling in-doubt calls); a process that finds no room takes no lease and sends its calls.
pub(crate) const LEASE_ROOM: usize = MAX_ENTRIES - 8;

/// How long past its lifetime a lease's ledger entry waits for its return (a return later
/// than that, after an outage, gives nothing back).
const RETURN_GRACE: Duration = Duration::from_secs(10);

/// What this process last saw of a key's shared bucket: its record after the last round
/// trip's call (the lease's tokens still in it), at that round trip's reading.
struct View {
    record: Record,
    reading: i64,
    /// When the reply arrived (what the backend's clock has moved since is measured from
    /// here: a view refills no sooner than the bucket).
    at: Instant,
    /// When its round trip was sent: the view and the lease taken with it end a lifetime
    /// later, so a lease is never used more than a lifetime after the bucket gave it.
    sent: Instant,
}

/// What the operation `seq` took from the shared bucket and is not used yet, per bandwidth
/// in refill units (a refill that fills what this process sees of the bucket takes its
/// overflow from here first, as it would from the bucket: see `RemoteBucket::local`).
struct Lease {
    seq: u64,
    left: Vec<u128>,
    taken: Instant,
}

impl Lease {
    /// Whole tokens left (the fewest of any bandwidth).
    fn tokens(&self, config: &BucketConfiguration) -> u64 {
        config
            .bandwidths()
            .iter()
            .zip(&self.left)
            .map(|(b, &u)| u / b.refill_period().as_nanos().max(1))
            .min()
            .map_or(0, |t| u64::try_from(t).unwrap_or(u64::MAX))
    }
}

#[derive(Default)]
struct SlotState {
    view: Option<View>,
    lease: Option<Lease>,
    /// A round trip is in flight: callers wait for it.
    busy: bool,
    /// Tokens this process's calls took on the key since `since`, or asked for when they
    /// went the batching path (for the next lease's size).
    used: u64,
    since: Option<Instant>,
    last_call: Option<Instant>,
}

/// One key's lease and view in a manager.
pub(super) struct Slot {
    settings: Leasing,
    state: Mutex<SlotState>,
    done: Notify,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("Slot")
            .field("lease", &s.lease.as_ref().map(|l| &l.left))
            .field("busy", &s.busy)
            .finish_non_exhaustive()
    }
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a call goes after looking at its slot.
enum Next<'s, T> {
    Answer(Outcome<T>),
    Trip(u64, Busy<'s>),
    /// The batching path, on this runtime.
    Batch(tokio::runtime::Handle),
}

/// What a call does next.
enum Step<'s, T> {
    /// Answered in process.
    Answer(Outcome<T>),
    /// A round trip is in flight: wait for it, then look again.
    Wait,
    /// Go to the backend, ending the lease (its unused tokens ride along), then maybe take
    /// a new one of this size. The slot is marked busy until `busy` is dropped.
    Trip { size: u64, busy: Busy<'s> },
}

/// Whether a command can take tokens (and a lease after it).
fn consumes(command: Command) -> bool {
    matches!(
        command,
        Command::TryConsume(_)
            | Command::TryConsumeAndReturnRemaining(_)
            | Command::TryConsumeAsMuchAsPossible(_)
            | Command::ConsumeIgnoringRateLimits(_)
            | Command::Reserve { .. }
    )
}

/// The tokens a call asks for (0: it takes none, or as many as it can).
fn asks(command: Command) -> u64 {
    match command {
        Command::TryConsume(n)
        | Command::TryConsumeAndReturnRemaining(n)
        | Command::ConsumeIgnoringRateLimits(n)
        | Command::Reserve { tokens: n, .. } => n,
        _ => 0,
    }
}

/// Tokens the state lost from `before` (refilled to `now`) to `after`, on the first
/// bandwidth (a consumption takes the same from each), and whether `after` is in debt.
fn drawn(
    config: &BucketConfiguration,
    before: &BucketState,
    after: &BucketState,
    now: i64,
) -> (u64, bool) {
    let refilled = Refilled::new(config, now, |i| before.bandwidths()[i]).get(0);
    let after0 = after.bandwidths()[0].tokens();
    let debt = after.bandwidths().iter().any(|b| b.tokens() < 0);
    (
        u64::try_from(refilled.tokens().saturating_sub(after0)).unwrap_or(0),
        debt,
    )
}

/// A lease's size from what this process used over the time since the last one: `used`
/// tokens per `elapsed`, scaled to the period, at most the cap; none below two tokens.
fn lease_size(
    settings: &Leasing,
    config: &BucketConfiguration,
    used: u64,
    elapsed: Duration,
) -> u64 {
    let capacity = config
        .bandwidths()
        .iter()
        .map(|b| b.capacity())
        .min()
        .unwrap_or(0);
    let cap = settings.lease_cap(capacity);
    let elapsed = elapsed.as_nanos().max(1);
    let wanted = u128::from(used) * settings.period.as_nanos() / elapsed;
    let size = u64::try_from(wanted).unwrap_or(u64::MAX).min(cap);
    if size < 2 { 0 } else { size }
}

impl<B: Backend> ProxyManager<B> {
    /// The key's slot, created on first use (and the keeper with the first one).
    fn slot(&self, key: &StorageKey, settings: Leasing) -> Arc<Slot> {
        if let Some(s) = self.inner.leases.get(key) {
            return Arc::clone(&s);
        }
        let slot = Arc::clone(&self.inner.leases.entry(key.clone()).or_insert_with(|| {
            Arc::new(Slot {
                settings,
                state: Mutex::new(SlotState::default()),
                done: Notify::new(),
            })
        }));
        self.spawn_keeper();
        slot
    }

    /// The reading a view is at now: the client clock, or the backend's as last read plus
    /// the time since (a little behind the backend's, by the reply's way back: a view refills
    /// no sooner than the bucket).
    fn view_now(&self, view: &View) -> i64 {
        match &self.inner.time.0 {
            Some(clock) => clock.now_nanos(),
            None => {
                let since = Instant::now().saturating_duration_since(view.at);
                view.reading
                    .saturating_add(i64::try_from(since.as_nanos()).unwrap_or(i64::MAX))
            }
        }
    }

    /// Tokens this manager holds in live leases: taken from the shared buckets and not used
    /// yet. What its leased buckets can grant without a round trip, and the most a crash of
    /// this process takes from the buckets without granting it (see
    /// [`Leasing`]). Zero without leasing.
    ///
    /// ```
    /// # use bucket4rs_distributed::{EmbeddedBackend, ProxyManager};
    /// let manager = ProxyManager::new(EmbeddedBackend::new());
    /// assert_eq!(manager.leased_tokens(), 0);
    /// ```
    pub fn leased_tokens(&self) -> u64 {
        self.inner
            .leases
            .iter()
            .filter_map(|s| {
                let s = s.lock();
                Some(s.lease.as_ref()?.tokens(&s.view.as_ref()?.record.config))
            })
            .fold(0, u64::saturating_add)
    }

    /// Ends every lease of this manager and gives their unused tokens back now (a graceful
    /// shutdown: call it before the process exits). Buckets keep working: a later call
    /// takes a new lease. A return that fails is retried in the background.
    ///
    /// # Errors
    /// The first failed return (the others are still made).
    ///
    /// ```
    /// # use bucket4rs_core::{Bandwidth, BucketConfiguration};
    /// # use bucket4rs_distributed::{EmbeddedBackend, Leasing, ProxyManager}; use std::time::Duration;
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// let manager = ProxyManager::configure(EmbeddedBackend::new()).leasing(Leasing::new()).build()?;
    /// # let config = BucketConfiguration::builder().add_bandwidth(Bandwidth::simple(1_000, Duration::from_secs(1))?).build()?;
    /// let bucket = manager.builder().build("hot", move || config.clone())?;
    /// for _ in 0..10 {
    ///     bucket.try_consume(1).await?;
    /// }
    /// manager.release_leases().await?;
    /// assert_eq!(manager.leased_tokens(), 0);
    /// assert_eq!(bucket.as_verbose().available_tokens().await?.into_value(), 990);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn release_leases(&self) -> Result<(), DistributedError> {
        let keys: Vec<StorageKey> = self
            .inner
            .leases
            .iter()
            .filter_map(|entry| {
                let lease = entry.value().lock().lease.take()?;
                self.inner
                    .settler
                    .release(entry.key(), lease.seq, lease.left);
                Some(entry.key().clone())
            })
            .collect();
        let mut first = Ok(());
        for key in keys {
            if let Err(e) = self.settle_key(&key).await {
                first = first.and(Err(e));
            }
        }
        if self.inner.settler.kick() {
            self.spawn_settler();
        }
        first
    }

    /// Ends leases past their lifetime or idle (the keeper's round).
    fn expire_leases(&self) {
        let now = Instant::now();
        let mut ended = false;
        self.inner.leases.retain(|key, slot| {
            let mut s = slot.lock();
            if s.busy {
                return true;
            }
            let settings = slot.settings;
            let ends = s.lease.as_ref().is_some_and(|lease| {
                now.saturating_duration_since(lease.taken) >= settings.lifetime
                    || s.last_call
                        .is_none_or(|t| now.saturating_duration_since(t) >= settings.idle)
            });
            if let Some(lease) = s.lease.take_if(|_| ends) {
                ended |= self.inner.settler.release(key, lease.seq, lease.left);
            }
            // A slot goes once its key has been left alone a lifetime (its view, kept past
            // its lifetime for the next lease's size, goes with it).
            s.lease.is_some()
                || s.last_call
                    .is_some_and(|t| now.saturating_duration_since(t) < settings.lifetime)
        });
        if ended {
            self.spawn_settler();
        }
    }

    /// Starts the keeper (on the current runtime) unless it runs: every tick it ends the
    /// leases past their lifetime or idle, until the manager has no slot left.
    fn spawn_keeper(&self) {
        use core::sync::atomic::Ordering;
        if self.inner.keeper.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.inner.keeper.store(false, Ordering::Release);
            return;
        };
        // Held weakly: a dropped manager ends it.
        let weak = Arc::downgrade(&self.inner);
        handle.spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let tick = inner
                    .leases
                    .iter()
                    .map(|s| s.settings.idle.min(s.settings.lifetime) / 4)
                    .min();
                let Some(tick) = tick else {
                    inner.keeper.store(false, Ordering::Release);
                    // A slot made after the look and before the flag fell started no keeper
                    // of its own: this one goes on.
                    if inner.leases.is_empty() || inner.keeper.swap(true, Ordering::AcqRel) {
                        return;
                    }
                    continue;
                };
                drop(inner);
                tokio::time::sleep(tick.max(Duration::from_millis(1))).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                ProxyManager { inner }.expire_leases();
            }
        });
    }
}

/// A handle of `inner` is dropped: when it is the last one and leases are out, a task of its
/// own (on the current runtime, else the blocking views') gives them back, holding the
/// manager until it is done. Best effort: a runtime shutting down drops the task and the
/// leases with it (lost from the bucket, never granted twice).
pub(super) fn release_on_last_drop<B: Backend>(inner: &Arc<super::Inner<B>>) {
    if Arc::strong_count(inner) != 1 || !inner.leases.iter().any(|s| s.lock().lease.is_some()) {
        return;
    }
    let manager = ProxyManager {
        inner: Arc::clone(inner),
    };
    let release = async move {
        // Failed returns stay pending with the settler, whose task holds the manager weakly:
        // with this last handle gone they are lost, as for a process that stops.
        let _ = manager.release_leases().await;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(release);
        }
        Err(_) => {
            if let Ok(handle) = super::bucket::blocking_runtime() {
                handle.spawn(release);
            }
        }
    }
}

impl<B: Backend, A: Answer> RemoteBucket<B, A> {
    /// A call on a leased bucket: answered from the lease and the view when they can, else
    /// one round trip (at a time per key). A call that would have to wait for the key's round
    /// trip in flight goes the batching path instead (with the calls of the key's other
    /// waiting callers, one transaction per batch), so a key on which leases cannot serve
    /// (no room, a key running dry) gets what batching gives.
    pub(super) async fn run_leased<J: Job + 'static>(
        &self,
        job: J,
        command: Command,
        settings: Leasing,
    ) -> Outcome<J::Output>
    where
        J::Output: 'static,
    {
        let manager = &self.manager;
        let inner = &manager.inner;
        let slot = manager.slot(&self.key, settings);
        let batching = inner.batching.is_enabled() && !inner.backend.is_in_process();
        let next = with_timeout(inner.timeout, async {
            let mut waited = false;
            loop {
                let done = slot.done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                match self.local(&slot, &job, command, waited) {
                    Step::Answer(out) => return Ok(Next::Answer(out)),
                    Step::Trip { size, busy } => return Ok(Next::Trip(size, busy)),
                    Step::Wait => {
                        if let (true, Ok(handle)) =
                            (batching, tokio::runtime::Handle::try_current())
                        {
                            return Ok(Next::Batch(handle));
                        }
                        done.await;
                        waited = true;
                    }
                }
            }
        });
        match next.await? {
            Next::Answer(answer) => answer,
            Next::Trip(size, busy) => {
                // One transaction of the key in flight per process: the round trip takes the
                // key's lane (waiting for a batch in flight), and the calls batched meanwhile
                // go after it.
                let _lane = match tokio::runtime::Handle::try_current() {
                    Ok(handle) if batching => {
                        let lane = batch::take_lane(manager, &self.key, handle);
                        Some(with_timeout(inner.timeout, async { Ok(lane.await) }).await?)
                    }
                    _ => None,
                };
                self.trip(&slot, busy, job, command, size).await
            }
            Next::Batch(handle) => {
                // What it asks counts in this process's use, which sizes the next lease.
                {
                    let mut s = slot.lock();
                    s.used = s.used.saturating_add(asks(command));
                }
                batch::run_batched(self, job, command, handle).await
            }
        }
    }

    /// The call in process, if the view and the lease can answer it. A call that `waited`
    /// for the key's round trip (no batching: an in-process backend, or no runtime) is
    /// answered at that round trip's reading, as a call queued behind a batch is answered at
    /// the batch's instant: from the lease if it covers it, refused if the bucket then could
    /// not, and only then sent.
    fn local<'s, J: Job>(
        &self,
        slot: &'s Slot,
        job: &J,
        command: Command,
        waited: bool,
    ) -> Step<'s, J::Output> {
        let manager = &self.manager;
        let now_instant = Instant::now();
        let mut guard = slot.lock();
        let s = &mut *guard;
        // While the key's round trip is in flight the view still answers what it refuses
        // (the lease went with the round trip: anything else waits, or is batched).
        s.last_call = Some(now_instant);
        let since = *s.since.get_or_insert(now_instant);
        let used = s.used;
        let size_now = |config: &BucketConfiguration| {
            lease_size(
                &slot.settings,
                config,
                used,
                now_instant.saturating_duration_since(since),
            )
        };
        let changes_bucket = matches!(
            command,
            Command::AddTokens(_)
                | Command::ForceAddTokens(_)
                | Command::Reset
                | Command::ReplaceConfiguration
        );
        let live = s.view.as_ref().is_some_and(|v| {
            now_instant.saturating_duration_since(v.sent) < slot.settings.lifetime
        });
        let (false, true, Some(view)) = (changes_bucket, live, s.view.as_mut()) else {
            if s.busy {
                return Step::Wait;
            }
            let size = match &s.view {
                Some(v) if consumes(command) => size_now(&v.record.config),
                _ => 0,
            };
            s.busy = true;
            return Step::Trip {
                size,
                busy: Busy(slot),
            };
        };
        let now = if waited {
            view.reading
        } else {
            manager.view_now(view)
        };
        if let Some(lease) = s.lease.as_mut() {
            // The bucket as this process sees it refills, its lease included: what that
            // refill loses to the capacity comes out of the lease first. Taking the lease
            // early made room in the shared bucket for exactly that refill, which one bucket
            // would have lost; so the lease no longer holds it, and its return gives back
            // only the rest (one process then answers exactly as an unleased bucket). The
            // view keeps the refilled state, so no refill is counted twice.
            let config = &view.record.config;
            let lost = crate::ledger::overflow(config, &view.record.state, now);
            for (left, lost) in lease.left.iter_mut().zip(lost) {
                *left = left.saturating_sub(lost);
            }
            let refilled = Refilled::new(config, now, |i| view.record.state.bandwidths()[i]);
            let n = config.bandwidths().len();
            view.record.state =
                BucketState::from_bandwidths((0..n).map(|i| refilled.get(i)).collect());
        }
        let before = view.record.state.clone();
        let out = match job.run(&mut view.record, now, manager.inner.wall) {
            Err(e) => return Step::Answer(Err(e)),
            Ok((value, changed)) => {
                if changed {
                    let config = &view.record.config;
                    let (took, debt) = drawn(config, &before, &view.record.state, now);
                    let need = crate::ledger::units_of(config, took);
                    let lease = s
                        .lease
                        .as_mut()
                        .filter(|l| l.left.iter().zip(&need).all(|(left, need)| left >= need));
                    match lease {
                        Some(l) if !debt && consumes(command) => {
                            for (left, need) in l.left.iter_mut().zip(need) {
                                *left -= need;
                            }
                            s.used = s.used.saturating_add(took);
                        }
                        _ => {
                            let size = size_now(&view.record.config);
                            view.record.state = before;
                            if s.busy {
                                return Step::Wait;
                            }
                            s.busy = true;
                            return Step::Trip {
                                size,
                                busy: Busy(slot),
                            };
                        }
                    }
                }
                VerboseResult::new(
                    value,
                    view.record.config.clone(),
                    view.record.state.clone(),
                    now,
                )
            }
        };
        Step::Answer(Ok(out))
    }

    /// One round trip for a call the lease could not answer: the lease's unused tokens go
    /// back, the call runs on the shared bucket, and a new lease of up to `size` is taken
    /// (none for a size of 0).
    async fn trip<J: Job>(
        &self,
        slot: &Slot,
        // Waiters are let go however this ends (a dropped future included).
        _busy: Busy<'_>,
        job: J,
        command: Command,
        size: u64,
    ) -> Outcome<J::Output> {
        let manager = &self.manager;
        let key = &self.key;
        let sent = Instant::now();
        let ended = {
            let mut s = slot.lock();
            s.used = 0;
            s.since = Some(sent);
            s.lease.take()
        };
        // A lease takes this process's share of what the bucket has.
        let processes = slot.settings.processes.max(1);
        if let Some(lease) = ended {
            // Carried by this round trip's id; kept for the next one if it fails.
            if manager.inner.settler.release(key, lease.seq, lease.left) {
                manager.spawn_settler();
            }
        }
        let inner = &manager.inner;
        let mut tx = LeaseTx {
            job,
            command,
            commands: if size > 0 {
                vec![
                    command,
                    Command::Lease {
                        tokens: size,
                        processes,
                    },
                ]
            } else {
                vec![command]
            },
            size,
            processes: u64::from(processes),
            supplier: &self.supplier,
            clock: inner.time.0.as_deref(),
            wall: inner.wall,
            margin: inner.ttl_margin,
            // A lease's entry is kept its lifetime and a grace for its return, not the minute
            // of other operations: the entries of ended leases make room for others sooner.
            id: inner
                .settler
                .begin_kept(key, slot.settings.lifetime + RETURN_GRACE),
            out: None,
            view: None,
            took: 0,
            leased: 0,
            wrote: false,
        };
        let in_flight = super::settle::InFlight {
            manager,
            key,
            id: Some(tx.id.clone()),
        };
        let result = manager.transact(key, &mut tx).await;
        in_flight.finished();
        let leased = if result.is_ok() && tx.wrote {
            tx.leased
        } else {
            0
        };
        let end = if leased > 0 {
            End::Leased
        } else {
            End::of(&result, tx.wrote)
        };
        manager.end_with(key, &tx.id, end);
        result?;
        let out = tx
            .out
            .take()
            .unwrap_or_else(|| Err(super::batch::not_run()));
        let mut s = slot.lock();
        if let Some((record, reading)) = tx.view.take() {
            s.view = Some(View {
                record,
                reading,
                at: Instant::now(),
                sent,
            });
        }
        s.used = s.used.saturating_add(tx.took);
        if let (true, Some(view)) = (leased > 0, &s.view) {
            s.lease = Some(Lease {
                seq: tx.id.seq | crate::ledger::LEASE_BIT,
                left: crate::ledger::units_of(&view.record.config, leased),
                taken: sent,
            });
        }
        drop(s);
        out
    }
}

/// A slot's round trip in flight (the slot was marked busy when this was made): dropped, it
/// marks the round trip over and wakes the waiters, however the call ended.
struct Busy<'a>(&'a Slot);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.lock().busy = false;
        self.0.done.notify_waiters();
    }
}

/// A leased key's round trip: the call, then (`Command::Lease`, while the ledger has room) a
/// lease of up to `size` tokens. The lease's unused tokens and the key's calls in doubt ride
/// in the id.
struct LeaseTx<'a, J: Job> {
    job: J,
    command: Command,
    commands: Vec<Command>,
    size: u64,
    /// How many processes share what the bucket has (the lease takes one share).
    processes: u64,
    supplier: &'a Supplier,
    clock: Option<&'a (dyn bucket4rs_core::Clock + Send + Sync)>,
    wall: bool,
    margin: Duration,
    id: OperationId,
    out: Option<Outcome<J::Output>>,
    /// The record as the call left it (the lease's tokens in it), and the reading.
    view: Option<(Record, i64)>,
    /// What the call took, and the lease taken after it.
    took: u64,
    leased: u64,
    wrote: bool,
}

impl<J: Job> Transaction for LeaseTx<'_, J> {
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

    fn operation(&self) -> Option<&OperationId> {
        Some(&self.id)
    }

    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> Write {
        self.wrote = false;
        self.took = 0;
        self.leased = 0;
        self.view = None;
        let now = match record::reading(backend_now, self.clock) {
            Ok(n) => n,
            Err(e) => {
                self.out = Some(Err(e));
                return Write::Keep;
            }
        };
        let (job, supplier, wall, size) = (&self.job, self.supplier, self.wall, self.size);
        let processes = self.processes;
        let id = &self.id;
        let consuming = consumes(self.command);
        let mut out = None;
        let mut view = None;
        let (mut took_now, mut leased) = (0, 0);
        let ledger = Some((id, self.commands.as_slice()));
        let write = record::apply_bytes(current, now, self.margin, ledger, |record| {
            let before = record.as_ref().map(|r| r.state.clone());
            let (changed, outcome) = record::step(job, record, supplier, now, wall);
            if let (Ok(_), Some(rec)) = (&outcome, record.as_mut()) {
                view = Some((
                    Record {
                        config: rec.config.clone(),
                        state: rec.state.clone(),
                        ledger: crate::format::Ledger::default(),
                    },
                    now,
                ));
                // Only a consumption draws (a replaced configuration has other bandwidths).
                if consuming {
                    let before = before.unwrap_or_else(|| BucketState::new(&rec.config, now));
                    took_now = drawn(&rec.config, &before, &rec.state, now).0;
                }
                // `Command::Lease`: this process's share of what every bandwidth has, up to
                // the size, while the ledger has room for the lease's entry.
                if size > 0 && crate::ledger::lease_room(&rec.ledger, id.owner, LEASE_ROOM) {
                    let has = rec
                        .state
                        .apply(&rec.config, now, &AvailableTokens)
                        .map_or(0, |a| u64::try_from(a).unwrap_or(0));
                    let share = (has / processes).min(size);
                    if share > 0 {
                        leased = rec
                            .state
                            .apply(&rec.config, now, &TryConsumeAsMuchAsPossible(Some(share)))
                            .unwrap_or(0);
                    }
                }
            }
            out = Some(outcome);
            changed || leased > 0
        });
        match write {
            // A call that failed writes nothing, not even a return riding with it (that one
            // stays for the next round trip): a failed call changes nothing.
            Ok(_) if matches!(out, Some(Err(_))) => {
                self.out = out;
                Write::Keep
            }
            Ok(w) => {
                self.out = out;
                self.view = view;
                self.took = took_now;
                self.leased = leased;
                self.wrote = matches!(w, Write::Put { .. });
                w
            }
            Err(e) => {
                self.out = Some(Err(e));
                Write::Keep
            }
        }
    }
}
