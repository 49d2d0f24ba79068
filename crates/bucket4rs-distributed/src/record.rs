//! The one record envelope every backend and every batch runs an operation in: the key's
//! record is created from the bucket's configuration if it has none, the core operation runs
//! on it, and the record is written back only if that changed it (or created it), with the
//! expiry that goes with the new state. Backends store the bytes; the token math is the core's.

use core::time::Duration;
use std::sync::Arc;

use bucket4rs_core::ops::{self, Operation};
use bucket4rs_core::{
    BucketConfiguration, BucketListener, BucketState, Clock, OperationError,
    TokensInheritanceStrategy, VerboseResult,
};

use crate::backend::{Command, OperationId, Transaction, Write};
use crate::error::{BackendError, BackendErrorKind, DistributedError};
use crate::format::{self, Record};

/// Where a bucket's configuration comes from when its key has no record.
pub(crate) type Supplier = Arc<dyn Fn() -> BucketConfiguration + Send + Sync>;

/// What an operation answers: its value with the record it left, or why it failed.
pub(crate) type Outcome<T> = Result<VerboseResult<T>, DistributedError>;

/// What a step does to a decoded (or freshly created) record, in place.
pub(crate) trait Job: Send + Sync {
    type Output: Send + Sync;
    /// The output and whether the record changed. On an error `record` is left untouched.
    fn run(
        &self,
        record: &mut Record,
        now: i64,
        wall: bool,
    ) -> Result<(Self::Output, bool), DistributedError>;
}

/// A core operation as a step.
pub(crate) struct OpJob<O>(pub(crate) O);

impl<O> Job for OpJob<O>
where
    O: Operation + Send + Sync,
    O::Output: Send + Sync,
{
    type Output = O::Output;
    fn run(
        &self,
        record: &mut Record,
        now: i64,
        _wall: bool,
    ) -> Result<(O::Output, bool), DistributedError> {
        let Record { config, state, .. } = record;
        // `apply` computes everything before its first write, so an error leaves the state
        // untouched; the record is rewritten only when the operation changed the state.
        let before = state.clone();
        let value = state.apply(config, now, &self.0)?;
        let wrote = *state != before;
        Ok((value, wrote))
    }
}

/// A configuration replacement as a step.
pub(crate) struct ReplaceJob(
    pub(crate) BucketConfiguration,
    pub(crate) TokensInheritanceStrategy,
);

impl Job for ReplaceJob {
    type Output = ();
    fn run(
        &self,
        record: &mut Record,
        now: i64,
        wall: bool,
    ) -> Result<((), bool), DistributedError> {
        format::check_storable(&self.0)?;
        let new = record
            .state
            .replace_configuration(&record.config, &self.0, now, self.1, wall)?;
        record.config = self.0.clone();
        record.state = new;
        Ok(((), true))
    }
}

/// A core operation the remote buckets send: the command backends see, its argument check
/// (made before anything is sent), and what a bucket's listener hears once its result is
/// known (the local buckets' events: only consumption notifies).
pub(crate) trait RemoteOp: Operation + Send + Sync {
    fn command(&self) -> Command;
    fn validate(&self) -> Result<(), OperationError>;
    fn notify_listener(&self, _output: &Self::Output, _listener: &dyn BucketListener) {}
}

/// `tokens` consumed, or refused.
fn consumed_or_rejected(listener: &dyn BucketListener, consumed: bool, tokens: u64) {
    if consumed {
        listener.on_consumed(tokens);
    } else {
        listener.on_rejected(tokens);
    }
}

fn nonzero(n: u64) -> Result<(), OperationError> {
    if n == 0 {
        Err(OperationError::ZeroTokens)
    } else {
        Ok(())
    }
}

macro_rules! remote_op {
    ($t:ty, |$s:ident| $cmd:expr, $check:expr $(, notify |$o:ident, $l:ident| $notify:expr)?) => {
        impl RemoteOp for $t {
            fn command(&self) -> Command {
                let $s = self;
                let _ = $s;
                $cmd
            }
            fn validate(&self) -> Result<(), OperationError> {
                let $s = self;
                let _ = $s;
                $check
            }
            $(
                fn notify_listener(&self, $o: &Self::Output, $l: &dyn BucketListener) {
                    let $s = self;
                    $notify
                }
            )?
        }
    };
}

remote_op!(
    ops::TryConsume,
    |s| Command::TryConsume(s.0),
    nonzero(s.0),
    notify | out,
    l | consumed_or_rejected(l, *out, s.0)
);
remote_op!(
    ops::TryConsumeAndReturnRemaining,
    |s| Command::TryConsumeAndReturnRemaining(s.0),
    nonzero(s.0),
    notify | out,
    l | consumed_or_rejected(l, out.is_consumed(), s.0)
);
remote_op!(
    ops::EstimateAbilityToConsume,
    |s| Command::EstimateAbilityToConsume(s.0),
    nonzero(s.0)
);
remote_op!(
    ops::TryConsumeAsMuchAsPossible,
    |s| Command::TryConsumeAsMuchAsPossible(s.0),
    if s.0 == Some(0) {
        Err(OperationError::ZeroLimit)
    } else {
        Ok(())
    },
    notify | out,
    l | if *out > 0 {
        let _ = s;
        l.on_consumed(*out);
    }
);
remote_op!(ops::AddTokens, |s| Command::AddTokens(s.0), nonzero(s.0));
remote_op!(
    ops::ForceAddTokens,
    |s| Command::ForceAddTokens(s.0),
    nonzero(s.0)
);
remote_op!(ops::Reset, |s| Command::Reset, Ok(()));
remote_op!(ops::AvailableTokens, |s| Command::AvailableTokens, Ok(()));
remote_op!(
    ops::ConsumeIgnoringRateLimits,
    |s| Command::ConsumeIgnoringRateLimits(s.0),
    nonzero(s.0),
    notify | _out,
    l | l.on_consumed(s.0)
);
remote_op!(
    ops::Reserve,
    |s| Command::Reserve {
        tokens: s.tokens,
        max_wait_nanos: s.max_wait_nanos
    },
    if s.max_wait_nanos == 0 {
        nonzero(s.tokens).and(Err(OperationError::ZeroMaxWait))
    } else {
        nonzero(s.tokens)
    },
    notify | out,
    l | consumed_or_rejected(l, out.is_some(), s.tokens)
);

/// A new record from `supplier` (the key has none), checked against the clock and the format.
fn create(supplier: &Supplier, now: i64, wall: bool) -> Result<Record, DistributedError> {
    let config = supplier();
    config.check_clock(wall)?;
    format::check_storable(&config)?;
    let state = BucketState::new(&config, now);
    Ok(Record {
        config,
        state,
        ledger: format::Ledger::default(),
    })
}

/// One operation on a key's record at `now`: the record is created from `supplier` when the
/// key has none, `job` runs on it, and the answer says whether the record must be written
/// (the job changed it, or it was created). On an error nothing changes: a record created for
/// the step is dropped again, so the key stays as it was.
pub(crate) fn step<J: Job>(
    job: &J,
    record: &mut Option<Record>,
    supplier: &Supplier,
    now: i64,
    wall: bool,
) -> (bool, Outcome<J::Output>) {
    let created = record.is_none();
    let rec = match record {
        Some(r) => r,
        None => match create(supplier, now, wall) {
            Ok(r) => record.insert(r),
            Err(e) => return (false, Err(e)),
        },
    };
    match job.run(rec, now, wall) {
        Ok((value, wrote)) => {
            let verbose = VerboseResult::new(value, rec.config.clone(), rec.state.clone(), now);
            (wrote || created, Ok(verbose))
        }
        Err(e) => {
            if created {
                *record = None;
            }
            (false, Err(e))
        }
    }
}

/// A transaction's [`apply`](Transaction::apply) around `steps`: the stored bytes decoded
/// into a record (or none), the steps run on it, and the bytes to store when any of them
/// changed it, with the expiry of the final state at `now`. Undecodable bytes are reported
/// and left untouched.
///
/// With an operation id (`ledger`: the id and the transaction's commands), the record's
/// ledger is kept as well (see `crate::ledger`): an operation it has seen already is refused
/// untouched, the listed settlements are made first, and a write records the operation.
pub(crate) fn apply_bytes(
    current: Option<&[u8]>,
    now: i64,
    margin: Duration,
    ledger: Option<(&OperationId, &[Command])>,
    steps: impl FnOnce(&mut Option<Record>) -> bool,
) -> Result<Write, DistributedError> {
    let mut record = current.map(format::decode).transpose()?;
    let prepared = match (ledger, record.as_mut()) {
        (Some((id, _)), Some(r)) => Some(crate::ledger::before(r, id, now).map_err(|_| {
            DistributedError::Backend(BackendError::new(
                BackendErrorKind::Conflict,
                "this operation was applied or settled already: it is not applied again",
            ))
        })?),
        _ => None,
    };
    // With a ledger, operations that leave the record as they found it (a force-add taken
    // back by a consumption in the same batch) write nothing, as the Redis script does: the
    // ledger's bookkeeping alone is no reason to write.
    let stored = ledger
        .and(record.as_ref())
        .map(|r| (r.config.clone(), r.state.clone()));
    let mut changed = steps(&mut record);
    if let (Some((config, state)), Some(r)) = (&stored, &record) {
        changed &= r.config != *config || r.state != *state;
    }
    let changed = changed || prepared.as_ref().is_some_and(|p| p.changed);
    Ok(match record {
        Some(mut r) if changed => {
            if let Some((id, commands)) = ledger {
                crate::ledger::after(&mut r, id, prepared.as_ref(), commands, now);
            }
            Write::Put {
                record: format::encode_with(&r.config, &r.state, &r.ledger),
                ttl: ttl_of(&r.config, &r.state, now, margin),
            }
        }
        _ => Write::Keep,
    })
}

/// The TTL of a stored state: from `now` until the moment a record recreated from its
/// configuration would answer every later request exactly as this one
/// ([`BucketState::forgettable_at`]), plus the margin; `None` (keep the record) when no such
/// moment exists: initial tokens below capacity, interval refill, tokens above capacity.
/// Expiry then never changes an answer.
pub(crate) fn ttl_of(
    config: &BucketConfiguration,
    state: &BucketState,
    now: i64,
    margin: Duration,
) -> Option<Duration> {
    let at = state.forgettable_at(config, now)?;
    // Up to 2^64 - 1 ns apart (a reading near i64::MIN, a last refill near i64::MAX): exact
    // in u64, where a saturating i64 difference cut it short.
    let wait = u64::try_from(i128::from(at) - i128::from(now)).unwrap_or(0);
    Some(Duration::from_nanos(wait).saturating_add(margin))
}

/// The reading a transaction runs at: the backend's, else the client clock's.
pub(crate) fn reading(
    backend_now: Option<i64>,
    clock: Option<&(dyn Clock + Send + Sync)>,
) -> Result<i64, DistributedError> {
    match (backend_now, clock) {
        (Some(n), _) => Ok(n),
        (None, Some(c)) => Ok(c.now_nanos()),
        (None, None) => Err(DistributedError::Backend(BackendError::new(
            BackendErrorKind::Protocol,
            "the backend did not pass its clock reading",
        ))),
    }
}

/// One operation's transaction.
pub(crate) struct OpTx<'a, J: Job> {
    pub(crate) job: J,
    pub(crate) command: Command,
    pub(crate) supplier: &'a Supplier,
    pub(crate) clock: Option<&'a (dyn Clock + Send + Sync)>,
    pub(crate) wall: bool,
    pub(crate) margin: Duration,
    pub(crate) out: Option<Outcome<J::Output>>,
    /// The operation's id (remote backends), see [`Transaction::operation`].
    pub(crate) id: Option<OperationId>,
    /// Whether the last `apply` returned a write.
    pub(crate) wrote: bool,
}

impl<J: Job> Transaction for OpTx<'_, J> {
    fn command(&self) -> Command {
        self.command
    }

    fn needs_backend_clock(&self) -> bool {
        self.clock.is_none()
    }

    fn ttl_margin(&self) -> Duration {
        self.margin
    }

    fn client_now(&self) -> Option<i64> {
        self.clock.map(|c| c.now_nanos())
    }

    fn operation(&self) -> Option<&OperationId> {
        self.id.as_ref()
    }

    fn apply(&mut self, current: Option<&[u8]>, backend_now: Option<i64>) -> Write {
        self.wrote = false;
        let now = match reading(backend_now, self.clock) {
            Ok(n) => n,
            Err(e) => {
                self.out = Some(Err(e));
                return Write::Keep;
            }
        };
        let (job, supplier, wall) = (&self.job, self.supplier, self.wall);
        let mut out = None;
        let ledger = self
            .id
            .as_ref()
            .map(|id| (id, core::slice::from_ref(&self.command)));
        let write = apply_bytes(current, now, self.margin, ledger, |record| {
            let (changed, outcome) = step(job, record, supplier, now, wall);
            out = Some(outcome);
            changed
        });
        match write {
            Ok(w) => {
                self.out = out;
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
