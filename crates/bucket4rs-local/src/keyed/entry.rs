//! One key's bucket: the compact word where it applies, a synchronized bucket otherwise.

use bucket4rs_core::ops::Operation;
use bucket4rs_core::{BucketConfiguration, BucketState, ConfigError, OperationError};

use super::plans::Plans;
use crate::storage::Synchronized;
use crate::storage::sealed::{New, Sealed};
use crate::storage::word::{self, CompactWord, Exit};

/// A key's bucket. Sixteen bytes: the compact word and its plan's index, or a box.
#[derive(Debug)]
pub(crate) enum Entry {
    /// One greedy bandwidth on a monotonic clock, in a plan of the table: the lock-free
    /// bucket's compact word, one load and at most one compare-and-swap per operation.
    Compact { plan: u32, word: CompactWord },
    /// Anything else (several bandwidths, interval refill, a clock that may go back, a state
    /// the word cannot hold): the synchronized bucket, with its own configuration.
    General(Box<Synchronized>),
}

/// Why [`Entry::run`] could not finish an operation in place.
pub(crate) enum Stop {
    /// The operation's argument is invalid (nothing changed).
    Invalid(OperationError),
    /// The new state does not fit the compact word (nothing changed): the entry must become
    /// [`Entry::General`] first, which needs the map's exclusive access.
    Upgrade,
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
        {
            let plan = plans.get(i);
            if let Some(w) = plan.and_then(|p| word::encode(&p.form, b, *st)) {
                return Self::Compact {
                    plan: i,
                    word: CompactWord::new(w),
                };
            }
        }
        Self::General(Box::new(Synchronized::new(
            config.clone(),
            state,
            monotonic,
        )))
    }

    /// Runs `op` at `now` in place (the map's shared access is enough).
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
                    // An entry's word never holds a marker; a state it cannot hold moves out.
                    Err(Exit::Leave(_) | Exit::Marker(_)) => Err(Stop::Upgrade),
                }
            }
            Self::General(bucket) => bucket.execute(op, now).map_err(Stop::Invalid),
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
            Self::General(bucket) => bucket.execute_with_config(op, now).map_err(Stop::Invalid),
        }
    }

    /// The configuration and the state, refilled to `now` for a compact entry (its word keeps
    /// no last refill time), as stored otherwise.
    pub(crate) fn snapshot(
        &self,
        plans: &Plans,
        now: i64,
    ) -> Option<(BucketConfiguration, BucketState)> {
        match self {
            Self::Compact { plan, word } => {
                let plan = plans.get(*plan)?;
                let [b] = plan.config.bandwidths() else {
                    return None;
                };
                let w = word.load();
                let st = word::decode(&plan.form, b, word::value(w), now);
                Some((plan.config.clone(), BucketState::from_bandwidths(vec![st])))
            }
            Self::General(bucket) => Some(bucket.snapshot(now)),
        }
    }

    /// Makes this entry a synchronized bucket holding the same state at `now` (the caller
    /// has exclusive access: no operation runs on the word meanwhile).
    pub(crate) fn upgrade(&mut self, plans: &Plans, now: i64) {
        if let Self::Compact { .. } = self
            && let Some((config, state)) = self.snapshot(plans, now)
        {
            *self = Self::General(Box::new(Synchronized::new(config, state, true)));
        }
    }

    /// Replaces the configuration with what `f` makes of the current one and its state (the
    /// caller has exclusive access); the entry is rebuilt, compact again where it applies.
    pub(crate) fn replace(
        &mut self,
        plans: &Plans,
        now: i64,
        monotonic: bool,
        f: impl FnOnce(
            &BucketConfiguration,
            &BucketState,
        ) -> Result<(BucketConfiguration, BucketState), ConfigError>,
    ) -> Result<(), ConfigError> {
        let Some((config, state)) = self.snapshot(plans, now) else {
            return Ok(());
        };
        let (config, state) = f(&config, &state)?;
        *self = Self::new(plans, &config, state, now, monotonic);
        Ok(())
    }

    /// Whether forgetting this entry at `now` changes no answer, given the configuration a
    /// recreated bucket would get: the state must be forgettable and the configuration the one
    /// it would be recreated with.
    pub(crate) fn forgettable(&self, plans: &Plans, now: i64, recreated: &Recreated) -> bool {
        let same = |config: &BucketConfiguration| match recreated {
            Recreated::Never => false,
            Recreated::Same => true,
            Recreated::With(source) => same(config, source),
        };
        match self {
            Self::Compact { plan, word } => {
                let Some(plan) = plans.get(*plan) else {
                    return false;
                };
                let [b] = plan.config.bandwidths() else {
                    return false;
                };
                // A greedy bucket whose fresh state is full may go once it is full again.
                let st = word::decode(&plan.form, b, word::value(word.load()), now);
                plan.fresh_is_full
                    && u64::try_from(st.tokens()).ok() == Some(b.capacity())
                    && st.remainder() == 0
                    && same(&plan.config)
            }
            Self::General(bucket) => {
                let (config, state) = bucket.snapshot(now);
                state.forgettable_at(&config, now) == Some(now) && same(&config)
            }
        }
    }
}

/// The configuration a key would be recreated with after its bucket is forgotten.
pub(crate) enum Recreated {
    /// None: the key would be unknown, so its bucket is never forgotten.
    Never,
    /// Its own (the caller brings it each time).
    Same,
    /// This one.
    With(BucketConfiguration),
}

/// Whether two configurations are equal (by identity first: the usual case).
#[inline]
pub(crate) fn same(a: &BucketConfiguration, b: &BucketConfiguration) -> bool {
    core::ptr::eq(a.bandwidths(), b.bandwidths()) || a == b
}
