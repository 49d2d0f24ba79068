//! One key's bucket: the compact word where it applies, a locked general bucket otherwise.
//!
//! An entry is shared by every thread that found it in the map, and stays readable by them
//! after the map lets go of it. So an entry that leaves the map (forgotten, removed, or
//! replaced by another entry of the same key) is first marked gone, in the same atomic step
//! that checked it: the word is swapped to [`GONE`] by a compare-and-swap from the value that
//! was judged, the general bucket is taken out under its lock. An operation that meets a gone
//! entry did not run; it looks the key up again once the map's structural change is over.
//! Every token an operation takes is therefore taken from the entry that is the key's bucket at
//! that instant, and a bucket is dropped only in a state a fresh one would have.

use bucket4rs_core::ops::Operation;
use bucket4rs_core::{BucketConfiguration, BucketState, ConfigError, OperationError};

use super::plans::{Plan, Plans};
use crate::primitive::Mutex;
use crate::storage::word::{self, CompactWord, Exit};

/// The word of an entry that is no longer its key's bucket.
pub(crate) const GONE: u64 = word::marker(0);

/// A key's bucket. Sixteen bytes: the compact word and its plan's index, or a box.
#[derive(Debug)]
pub(crate) enum Entry {
    /// One greedy bandwidth on a monotonic clock, in a plan of the table: the lock-free
    /// bucket's compact word, one load and at most one compare-and-swap per operation.
    Compact { plan: u32, word: CompactWord },
    /// Anything else (several bandwidths, interval refill, a clock that may go back, a state
    /// the word cannot hold): the configuration and state behind a lock, `None` once gone.
    General(Box<Mutex<Option<Bucket>>>),
}

/// A general entry's configuration and state.
type Bucket = (BucketConfiguration, BucketState);

/// Why [`Entry::run`] could not finish an operation in place.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The operation's argument is invalid (nothing changed).
    Invalid(OperationError),
    /// The new state does not fit the compact word (nothing changed): the entry must become a
    /// general one first, a structural change of the map.
    Upgrade,
    /// The entry is no longer the key's bucket (nothing changed): look the key up again.
    Gone,
}

impl Entry {
    /// The entry of a bucket of `config` in `state`, at reading `now`: compact when the clock
    /// is `monotonic`, the configuration has a plan and the state fits the word.
    pub(crate) fn new(
        plans: &Plans,
        config: &BucketConfiguration,
        state: BucketState,
        now: i64,
        monotonic: bool,
    ) -> Self {
        if let (true, [b], [st]) = (monotonic, config.bandwidths(), state.bandwidths())
            && let Some(i) = plans.intern(config, now)
            && let Some(w) = plans.get(i).and_then(|p| word::encode(&p.form, b, *st))
        {
            return Self::Compact {
                plan: i,
                word: CompactWord::new(w),
            };
        }
        Self::general(config.clone(), state)
    }

    /// A general entry.
    pub(crate) fn general(config: BucketConfiguration, state: BucketState) -> Self {
        Self::General(Box::new(Mutex::new(Some((config, state)))))
    }

    /// The compact word's value now, if this is a compact entry (to tell later whether an
    /// operation changed it).
    pub(crate) fn word(&self) -> Option<u64> {
        match self {
            Self::Compact { word, .. } => Some(word.load()),
            Self::General(_) => None,
        }
    }

    /// Runs `op` at `now` in place (any thread that found the entry may).
    #[inline(always)]
    pub(crate) fn run<O: Operation>(
        &self,
        plans: &Plans,
        op: &O,
        now: i64,
    ) -> Result<O::Output, Stop> {
        match self {
            Self::Compact { plan, word } => {
                let Some(plan) = plans.get(*plan) else {
                    return Err(Stop::Upgrade);
                };
                match word.run(&plan.form, &plan.config, op, now, &|| {}) {
                    Ok(result) => result.map_err(Stop::Invalid),
                    // An entry's word holds one marker: gone.
                    Err(Exit::Marker(_)) => Err(Stop::Gone),
                    Err(Exit::Leave(_)) => Err(Stop::Upgrade),
                }
            }
            Self::General(bucket) => bucket.with(|b| match b {
                Some((config, state)) => {
                    crate::storage::run_exclusive(op, config, state, now).map_err(Stop::Invalid)
                }
                None => Err(Stop::Gone),
            }),
        }
    }

    /// Runs `op` at `now`, with the configuration it ran under.
    pub(crate) fn run_with_config<O: Operation>(
        &self,
        plans: &Plans,
        op: &O,
        now: i64,
    ) -> Result<(O::Output, BucketConfiguration), Stop> {
        match self {
            Self::Compact { plan: i, .. } => {
                let out = self.run(plans, op, now)?;
                let config = plans.get(*i).map(|p| p.config.clone());
                config.map(|c| (out, c)).ok_or(Stop::Upgrade)
            }
            Self::General(bucket) => bucket.with(|b| match b {
                Some((config, state)) => {
                    let out = state.apply(config, now, op).map_err(Stop::Invalid)?;
                    Ok((out, config.clone()))
                }
                None => Err(Stop::Gone),
            }),
        }
    }

    /// The configuration and the state, refilled to `now` for a compact entry (its word keeps
    /// no last refill time), as stored otherwise; `None` once gone.
    pub(crate) fn snapshot(&self, plans: &Plans, now: i64) -> Option<Bucket> {
        match self {
            Self::Compact { plan, word } => compact_state(plans.get(*plan)?, word.load(), now),
            Self::General(bucket) => bucket.with(|b| b.clone()),
        }
    }

    /// Marks the entry gone and answers its configuration and state at `now`, the last ones
    /// it had (`None` if it was gone already): for a structural change that replaces it.
    pub(crate) fn freeze(&self, plans: &Plans, now: i64) -> Option<Bucket> {
        match self {
            Self::Compact { plan, word } => {
                let plan = plans.get(*plan)?;
                let mut w = word.load();
                loop {
                    let state = compact_state(plan, w, now)?;
                    match word.swap(w, GONE) {
                        Ok(_) => return Some(state),
                        Err(seen) => w = seen,
                    }
                }
            }
            Self::General(bucket) => bucket.with(Option::take),
        }
    }

    /// Marks the entry gone, whatever its state (a removal); whether it was its key's bucket
    /// until then.
    pub(crate) fn kill(&self) -> bool {
        match self {
            Self::Compact { word, .. } => word::is_value(word.swap_any(GONE)),
            Self::General(bucket) => bucket.with(Option::take).is_some(),
        }
    }

    /// Whether the entry is gone.
    pub(crate) fn is_gone(&self) -> bool {
        match self {
            Self::Compact { word, .. } => !word::is_value(word.load()),
            Self::General(bucket) => bucket.with(|b| b.is_none()),
        }
    }

    /// Forgets the entry if a bucket created afresh from `recreated` (the configuration the
    /// key would get, `None`: none) would answer every later request exactly as it will, and
    /// it has been so since reading `since` (at most `now`): the entry is marked gone, in the
    /// same atomic step that checked it, and `Ok(true)` answered (`Ok(false)`: it was gone
    /// already). Otherwise `Err` of the reading from which it could be forgotten if left alone
    /// (`i64::MAX`: never).
    pub(crate) fn forget(
        &self,
        plans: &Plans,
        now: i64,
        since: i64,
        recreated: &Recreated<'_>,
    ) -> Result<bool, i64> {
        let same = |config: &BucketConfiguration| match recreated {
            Recreated::Never => false,
            Recreated::With(r) => same(config, r),
            Recreated::Owned(r) => same(config, r),
        };
        match self {
            Self::Compact { plan, word } => {
                let Some(plan) = plans.get(*plan) else {
                    return Err(i64::MAX);
                };
                // A greedy bucket whose fresh state is full may go once it is full again.
                if !plan.fresh_is_full || !same(&plan.config) {
                    return Err(i64::MAX);
                }
                let w = word.load();
                if !word::is_value(w) {
                    return Ok(false);
                }
                let full = plan.form.full_at(word::value(w));
                if full > since {
                    return Err(full.max(now));
                }
                // Still the value judged (no operation took a token since): gone.
                word.swap(w, GONE).map(|_| true).map_err(|_| now)
            }
            Self::General(bucket) => bucket.with(|b| {
                let Some((config, state)) = b.as_ref() else {
                    return Ok(false);
                };
                let at = state
                    .forgettable_at(config, now)
                    .filter(|_| same(config))
                    .ok_or(i64::MAX)?;
                // Untouched since `since`: its last change was no later.
                let touched = state
                    .bandwidths()
                    .iter()
                    .map(|s| s.last_refill_nanos())
                    .max();
                if at > now || touched.is_some_and(|t| t > since) {
                    return Err(at);
                }
                *b = None;
                Ok(true)
            }),
        }
    }

    /// Makes an entry no other thread can see a general one holding the same state at `now`.
    pub(crate) fn upgrade_unshared(&mut self, plans: &Plans, now: i64) {
        if let Self::Compact { .. } = self
            && let Some((config, state)) = self.snapshot(plans, now)
        {
            *self = Self::general(config, state);
        }
    }

    /// Replaces the configuration with what `f` makes of the current one and its state: in
    /// place for a general entry (`Ok(None)`); a compact entry is marked gone and the entry
    /// to store in its place answered (`Ok(Some)`), compact again where it applies. On an
    /// error nothing changes.
    pub(crate) fn replace(
        &self,
        plans: &Plans,
        now: i64,
        monotonic: bool,
        f: impl Fn(&BucketConfiguration, &BucketState) -> Result<Bucket, ConfigError>,
    ) -> Result<Option<Self>, ConfigError> {
        match self {
            Self::Compact { plan, word } => {
                let Some(plan) = plans.get(*plan) else {
                    return Ok(None);
                };
                let mut w = word.load();
                loop {
                    let Some((config, state)) = compact_state(plan, w, now) else {
                        return Ok(None);
                    };
                    let (config, state) = f(&config, &state)?;
                    match word.swap(w, GONE) {
                        Ok(_) => return Ok(Some(Self::new(plans, &config, state, now, monotonic))),
                        Err(seen) => w = seen,
                    }
                }
            }
            Self::General(bucket) => bucket.with(|b| {
                if let Some((config, state)) = b.as_mut() {
                    let (c, s) = f(config, state)?;
                    (*config, *state) = (c, s);
                }
                Ok(None)
            }),
        }
    }
}

/// The state word `w` of `plan` stands for at `now`; `None` for a marker.
fn compact_state(plan: &Plan, w: u64, now: i64) -> Option<Bucket> {
    let [b] = plan.config.bandwidths() else {
        return None;
    };
    if !word::is_value(w) {
        return None;
    }
    let st = word::decode(&plan.form, b, word::value(w), now);
    Some((plan.config.clone(), [st].into_iter().collect()))
}

/// The configuration a key would be recreated with after its bucket is forgotten.
pub(crate) enum Recreated<'a> {
    /// None: the key would be unknown, so its bucket is never forgotten.
    Never,
    /// This one.
    With(&'a BucketConfiguration),
    /// This one, chosen for the key just now.
    Owned(BucketConfiguration),
}

/// Whether two configurations are equal (by identity first: the usual case).
#[inline]
pub(crate) fn same(a: &BucketConfiguration, b: &BucketConfiguration) -> bool {
    core::ptr::eq(a.bandwidths(), b.bandwidths()) || a == b
}
