//! The compact word: a one-bandwidth greedy state in one 64-bit atomic, run with one load and at
//! most one compare-and-swap per operation. Shared by the lock-free bucket (its compact mode)
//! and the keyed bucket (each key's entry).
//!
//! The word is the core's compact value `u` (see `CompactForm` in the core): the reading, in
//! exact scaled units counted from the form's base, at which the bucket is full again — the
//! GCRA's theoretical arrival time. The balance at a reading `t` is
//! `capacity − max(0, u − (t − base) × rate)`: exact while readings never go back, which is why
//! the word needs a [monotonic](bucket4rs_core::Clock::is_monotonic) clock. A reading taken
//! before another thread's change (and handed in after it) sees the refill only up to itself:
//! conservative by the nanoseconds of the race, never generous.
//!
//! try_consume is the GCRA step `u' = max(u, p) + need`, taken when `u' − p <= capacity`
//! (`CompactForm::plan`); every other operation decodes the value into a state refilled to its
//! reading, plans with the core and encodes the result. A result the word cannot hold (tokens
//! above capacity, a value out of range) is handed back to the owner ([`Exit::Leave`]), which
//! moves the state somewhere else for good.
//!
//! The lowest 2^17 values of `i64` are reserved as markers for the owner's use (the lock-free
//! bucket marks a word it left with them); a value there does not fit.

use bucket4rs_core::forms::{CompactForm, CompactStop, ScaledState};
use bucket4rs_core::ops::Operation;
use bucket4rs_core::ops::{plan, plan_one};
use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, OperationError};
use crossbeam_utils::Backoff;

use crate::primitive::{AtomicU64, Ordering};

/// The smallest compact value a word holds; everything below is a marker.
const MIN_VALUE: i64 = i64::MIN + (1 << 17);

/// Whether `w` holds a compact value (not a marker).
#[inline]
pub(crate) fn is_value(w: u64) -> bool {
    w as i64 >= MIN_VALUE
}

/// The compact value in `w` (see [`is_value`]).
#[inline]
pub(crate) fn value(w: u64) -> i64 {
    w as i64
}

/// The word holding `u`, if it is not in the markers' range.
#[inline]
pub(crate) fn encode_value(u: i64) -> Option<u64> {
    (u >= MIN_VALUE).then_some(u as u64)
}

/// The word holding `st` of `b` in `form`, if it fits.
#[inline]
pub(crate) fn encode(form: &CompactForm, b: &Bandwidth, st: BandwidthState) -> Option<u64> {
    encode_value(form.encode(ScaledState::from_state(b, st)?)?)
}

/// The state a compact value stands for, refilled to `now`.
#[inline]
pub(crate) fn decode(form: &CompactForm, b: &Bandwidth, u: i64, now: i64) -> BandwidthState {
    form.decode(u, now).to_state(b)
}

/// A marker word: `i64::MIN + n`, for `n` below 2^17.
#[inline]
pub(crate) const fn marker(n: u64) -> u64 {
    (i64::MIN as u64).wrapping_add(n & ((1 << 17) - 1))
}

/// Which marker `w` is (the `n` of [`marker`]).
#[inline]
pub(crate) const fn marker_of(w: u64) -> u64 {
    w.wrapping_sub(i64::MIN as u64)
}

/// Why [`CompactWord::run`] did not finish the operation on the word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The word holds a marker (`w`): the state is not in the word.
    Marker(u64),
    /// The operation's new state, decided on the word `w`, does not fit a word: the owner moves
    /// the state out of the word (then runs the operation where it went).
    Leave(u64),
}

/// One 64-bit word holding a compact value (or, for the lock-free bucket, a marker).
#[derive(Debug)]
pub(crate) struct CompactWord(AtomicU64);

impl CompactWord {
    /// A word holding `w` (a value from [`encode`], or a marker).
    pub(crate) fn new(w: u64) -> Self {
        Self(AtomicU64::new(w))
    }

    /// The word as it is now (Acquire: a marker's data, written before it, is visible).
    #[inline]
    pub(crate) fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Replaces `current` with `new` if the word still holds `current`.
    #[inline]
    pub(crate) fn swap(&self, current: u64, new: u64) -> Result<u64, u64> {
        self.0
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
    }

    /// Replaces the word with `new` whatever it holds; answers what it held.
    #[inline]
    pub(crate) fn swap_any(&self, new: u64) -> u64 {
        self.0.swap(new, Ordering::AcqRel)
    }

    /// Runs `op` on the word at reading `now`: the common case — a value, the GCRA step, no
    /// lost race — inline, in one load and at most one compare-and-swap; everything else
    /// ([`run_loop`](Self::run_loop): retries with backoff, operations decoded and planned by the
    /// core) out of line, so the hot path stays small. `retried` is called for each lost race.
    ///
    /// `config` must be the form's configuration: one greedy bandwidth.
    #[inline(always)]
    pub(crate) fn run<O: Operation>(
        &self,
        form: &CompactForm,
        config: &BucketConfiguration,
        op: &O,
        now: i64,
        retried: &impl Fn(),
    ) -> Result<Result<O::Output, OperationError>, Exit> {
        let w = self.load();
        // Straight-line early returns, no joining `match`: the result stays in registers.
        if !is_value(w) {
            return Err(Exit::Marker(w));
        }
        let v = value(w);
        let (out, new) = match form.plan(op, v, now) {
            Ok(planned) => planned,
            Err(CompactStop::Invalid(e)) => return Ok(Err(e)),
            Err(CompactStop::Decline) => {
                return self.run_loop(form, config, op, now, retried, None);
            }
        };
        if new == v {
            return Ok(Ok(out));
        }
        let Some(next) = encode_value(new) else {
            return self.run_loop(form, config, op, now, retried, None);
        };
        match self.swap(w, next) {
            Ok(_) => Ok(Ok(out)),
            Err(seen) => {
                retried();
                self.run_loop(form, config, op, now, retried, Some(seen))
            }
        }
    }

    /// [`run`](Self::run) in full. `seen` is the word a lost compare-and-swap returned: each
    /// retry starts from the value that beat it, as governor's loop does, instead of loading
    /// again a cache line the other core is writing.
    #[inline(never)]
    pub(crate) fn run_loop<O: Operation>(
        &self,
        form: &CompactForm,
        config: &BucketConfiguration,
        op: &O,
        now: i64,
        retried: &impl Fn(),
        mut seen: Option<u64>,
    ) -> Result<Result<O::Output, OperationError>, Exit> {
        let [b] = config.bandwidths() else {
            // Unreachable: a compact form is only made for one greedy bandwidth.
            return Err(Exit::Leave(self.load()));
        };
        let backoff = Backoff::new();
        loop {
            let w = seen.take().unwrap_or_else(|| self.load());
            if !is_value(w) {
                return Err(Exit::Marker(w));
            }
            let v = value(w);
            // The GCRA step for try_consume; decoded and planned by the core for the rest.
            let (out, next) = match form.plan(op, v, now) {
                Ok((out, new)) if new == v => return Ok(Ok(out)),
                Ok((out, new)) => (out, encode_value(new)),
                Err(CompactStop::Invalid(e)) => return Ok(Err(e)),
                Err(CompactStop::Decline) => {
                    match plan_state(op, config, decode(form, b, v, now), now) {
                        Ok((out, Some(new))) => (out, encode(form, b, new)),
                        other => return Ok(other.map(|(out, _)| out)),
                    }
                }
            };
            let Some(next) = next else {
                return Err(Exit::Leave(w));
            };
            match self.swap(w, next) {
                Ok(_) => return Ok(Ok(out)),
                Err(beaten_by) => {
                    retried();
                    seen = Some(beaten_by);
                    backoff.spin();
                }
            }
        }
    }
}

/// `op` on the one-bandwidth state `s` of `config` at `now`: the core's single-bandwidth
/// shortcut, or its general engine. The new state, if it changed.
#[inline]
pub(crate) fn plan_state<O: Operation>(
    op: &O,
    config: &BucketConfiguration,
    s: BandwidthState,
    now: i64,
) -> Result<(O::Output, Option<BandwidthState>), OperationError> {
    match plan_one(op, config, now, || s) {
        Some(single) => single,
        None => plan(op, config, now, |_| s).map(|plan| {
            let mut new = None;
            plan.write(|_, st| new = Some(st));
            (plan.into_output(), new)
        }),
    }
}

#[cfg(all(test, not(bucket4rs_loom)))]
mod tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn values_and_markers_round_trip_at_the_edges() {
        for u in [0, 1, -1, i64::MAX, MIN_VALUE, MIN_VALUE + 1] {
            let w = encode_value(u).expect("fits");
            assert!(is_value(w));
            assert_eq!(value(w), u);
        }
        assert_eq!(encode_value(MIN_VALUE - 1), None);
        assert_eq!(encode_value(i64::MIN), None);
        for n in [0, 1, 65_535, (1 << 17) - 1] {
            assert!(!is_value(marker(n)));
            assert_eq!(marker_of(marker(n)), n);
        }
    }

    #[test]
    fn only_greedy_states_at_or_below_capacity_encode() {
        let greedy = Bandwidth::simple(10, Duration::from_secs(1)).expect("valid");
        let interval = Bandwidth::builder()
            .capacity(10)
            .refill_intervally(10, Duration::from_secs(1))
            .build()
            .expect("valid");
        assert_eq!(CompactForm::new(&interval, 0), None);
        let form = CompactForm::new(&greedy, 0).expect("greedy");
        let full = BandwidthState::from_parts(0, 10, 0);
        assert!(encode(&form, &greedy, full).is_some());
        let over = BandwidthState::from_parts(0, 11, 0);
        assert_eq!(encode(&form, &greedy, over), None);
        // Decoded at its own time, a word gives its state back.
        let form = CompactForm::new(&greedy, -9).expect("greedy");
        let st = BandwidthState::from_parts(5, 3, 700_000_000);
        let u = value(encode(&form, &greedy, st).expect("fits"));
        assert_eq!(decode(&form, &greedy, u, 5), st);
    }

    #[test]
    fn a_state_above_capacity_leaves_the_word_untouched() {
        let config = BucketConfiguration::new(vec![
            Bandwidth::simple(10, Duration::from_secs(1)).expect("valid"),
        ])
        .expect("valid");
        let b = &config.bandwidths()[0];
        let form = CompactForm::new(b, 0).expect("greedy");
        let w = encode(&form, b, BandwidthState::from_parts(0, 10, 0)).expect("fits");
        let word = CompactWord::new(w);
        let op = bucket4rs_core::ops::ForceAddTokens(5);
        assert_eq!(
            word.run(&form, &config, &op, 0, &|| {}),
            Err(Exit::Leave(w))
        );
        assert_eq!(word.load(), w);
        let take = bucket4rs_core::ops::TryConsume(4);
        assert_eq!(word.run(&form, &config, &take, 0, &|| {}), Ok(Ok(true)));
        let left = decode(&form, b, value(word.load()), 0);
        assert_eq!(left.tokens(), 6);
    }
}
