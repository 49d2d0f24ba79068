//! The packed word of a lock-free bucket.
//!
//! The packed representation of a one-bandwidth state: one 128-bit word, so an operation is
//! one load and one compare-and-swap.
//!
//! The high half holds the last refill time; the low half the mode (top two bits) and the
//! scaled balance `tokens × period + remainder` (62-bit two's complement, see
//! `ScaledState::from_state`). A bucket starts packed when its configuration has one
//! bandwidth and its state fits; a state that does not fit (a huge forced addition or debt) or a
//! configuration replacement moves it to the slots for good: the word is first *frozen* (its
//! state kept, no packed write can succeed any more), the state is installed in a slot by
//! whichever thread gets there first, and the word becomes `SLOTS`.

use bucket4rs_core::forms::ScaledState;
use bucket4rs_core::ops::Operation;
use bucket4rs_core::ops::plan_scaled;
use bucket4rs_core::{Bandwidth, BandwidthState, BucketConfiguration, OperationError};
use crossbeam_utils::Backoff;

use super::LockFree;
use super::slots::stride;
use crate::primitive::Ordering;
use crate::storage::word::plan_state;

/// Mode: the packed state is in force.
pub(super) const PACKED: u64 = 0;
/// Mode: the packed state is being moved to the slots.
pub(super) const FROZEN: u64 = 1;
/// Mode: the slots hold the state.
pub(super) const SLOTS: u64 = 2;
/// The word of a bucket whose state lives in the slots.
pub(super) const SLOTS_WORD: u128 = (SLOTS as u128) << MODE_SHIFT;

const MODE_SHIFT: u32 = 62;
const BALANCE_MASK: u64 = (1 << MODE_SHIFT) - 1;

#[inline]
pub(super) fn mode(w: u128) -> u64 {
    (w as u64) >> MODE_SHIFT
}

/// `st` packed in `mode`, if its scaled balance fits 62 bits.
#[inline]
pub(super) fn encode_scaled(st: ScaledState, mode: u64) -> Option<u128> {
    let balance = st.balance();
    // Fits 62-bit two's complement exactly when the top three bits agree.
    if (balance << 2) >> 2 != balance {
        return None;
    }
    let lo = (balance as u64 & BALANCE_MASK) | (mode << MODE_SHIFT);
    Some(((st.last_refill_nanos() as u64 as u128) << 64) | lo as u128)
}

/// `st` packed in `mode`, if it has a scaled form that fits 62 bits.
#[inline]
pub(super) fn encode(b: &Bandwidth, st: BandwidthState, mode: u64) -> Option<u128> {
    encode_scaled(ScaledState::from_state(b, st)?, mode)
}

/// The scaled state packed in `w` (any mode but [`SLOTS`]).
#[inline]
pub(super) fn scaled(w: u128) -> ScaledState {
    let lo = w as u64;
    // Sign-extend the 62-bit balance.
    ScaledState::new((w >> 64) as u64 as i64, ((lo << 2) as i64) >> 2)
}

/// The state packed in `w` (any mode but [`SLOTS`]).
#[inline]
pub(super) fn decode(b: &Bandwidth, w: u128) -> BandwidthState {
    scaled(w).to_state(b)
}

/// `w` (packed) with the frozen mode.
#[inline]
pub(super) fn frozen(w: u128) -> u128 {
    (w & !((3u128) << MODE_SHIFT)) | ((FROZEN as u128) << MODE_SHIFT)
}

#[cfg(all(test, not(bucket4rs_loom)))]
mod tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn encode_decode_round_trip_at_the_edges() {
        // One token per 100 ns: remainders are any of 0..100, a token is 100 units.
        let b = Bandwidth::builder()
            .capacity(10)
            .refill_greedy(1, Duration::from_nanos(100))
            .build()
            .unwrap();
        for (last, tokens, rem) in [
            (0, 0, 0),
            (i64::MIN, -1, 99),
            (i64::MAX, 10, 0),
            (-5, (1 << 61) / 100 - 1, 99),
            (7, -(1 << 61) / 100, 0),
        ] {
            let st = BandwidthState::from_parts(last, tokens, rem);
            for m in [PACKED, FROZEN] {
                let w = encode(&b, st, m).expect("fits");
                assert_eq!(mode(w), m);
                assert_eq!(decode(&b, w), st);
            }
            let w = encode(&b, st, PACKED).expect("fits");
            assert_eq!(mode(frozen(w)), FROZEN);
            assert_eq!(decode(&b, frozen(w)), st);
        }
        // Just outside 62 bits, or a remainder out of range: not packable.
        for (tokens, rem) in [
            ((1 << 61) / 100, 52),
            (-(1 << 61) / 100 - 1, 0),
            (0, 100),
            (0, -1),
        ] {
            assert_eq!(
                encode(&b, BandwidthState::from_parts(0, tokens, rem), PACKED),
                None
            );
        }
        assert_eq!(mode(SLOTS_WORD), SLOTS);
    }
}

/// What an operation decided on the compact or packed word `W`.
enum Step<T, W> {
    /// Compare-and-swap this word in, then return the output.
    Publish(T, W),
    /// The new state does not fit the word: leave packed mode.
    Freeze,
    /// An outcome that writes nothing.
    Done(Result<T, OperationError>),
}

impl<T, W> Step<T, W> {
    #[inline]
    fn publish(out: T, word: Option<W>) -> Self {
        match word {
            Some(w) => Self::Publish(out, w),
            None => Self::Freeze,
        }
    }
}

/// [`plan_state`] as a step on a one-bandwidth word: a new state is published in the form
/// `encode` gives it, or frozen out of the word if it has none.
#[inline]
fn decoded_step<O: Operation, W>(
    op: &O,
    config: &BucketConfiguration,
    s: BandwidthState,
    now: i64,
    encode: impl FnOnce(BandwidthState) -> Option<W>,
) -> Step<O::Output, W> {
    match plan_state(op, config, s, now) {
        Ok((out, Some(new))) => Step::publish(out, encode(new)),
        other => Step::Done(other.map(|(out, _)| out)),
    }
}

impl LockFree {
    /// Runs `op`: on the packed word while the bucket is in packed mode, else on the slots.
    /// Inlined into `run_other`, away from compact buckets' hot path.
    #[inline]
    pub(super) fn run_packed<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
    ) -> Result<(O::Output, T), OperationError> {
        let backoff = Backoff::new();
        loop {
            let w = self.hot.packed.load(Ordering::Acquire);
            match mode(w) {
                PACKED => {
                    let config = &self.first_config;
                    let [b] = config.bandwidths() else {
                        // Unreachable: packed mode is only entered for one bandwidth.
                        return self.run_slots(op, now, finish);
                    };
                    let scaled = scaled(w);
                    // Division-free first (try_consume on a greedy bandwidth), then decoded.
                    let step = match plan_scaled(op, b, now, scaled) {
                        Some(Ok((out, Some(new)))) => {
                            Step::publish(out, encode_scaled(new, PACKED))
                        }
                        Some(other) => Step::Done(other.map(|(out, _)| out)),
                        None => {
                            decoded_step(op, &self.first_config, scaled.to_state(b), now, |new| {
                                encode(b, new, PACKED)
                            })
                        }
                    };
                    let cas = |next| {
                        let word = &self.hot.packed;
                        word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Relaxed)
                    };
                    let settled =
                        self.settle(step, |next| cas(next).is_ok(), &backoff, || self.freeze(w));
                    if let Some(result) = settled {
                        return result.map(|out| (out, finish(config)));
                    }
                }
                FROZEN => self.thaw(w),
                _ => return self.run_slots(op, now, finish),
            }
        }
    }

    /// What a loop over a one-bandwidth word does with one attempt's `step`: the output to
    /// return, or `None` to reload and try again — after a lost race (counted, then backing
    /// off) or after `freeze` moved the bucket off the word because the new state does not
    /// fit it. A step that writes nothing is returned as it is: the word was read in one
    /// atomic load, so the outcome is consistent.
    #[inline]
    fn settle<Out, W>(
        &self,
        step: Step<Out, W>,
        cas: impl FnOnce(W) -> bool,
        backoff: &Backoff,
        freeze: impl FnOnce(),
    ) -> Option<Result<Out, OperationError>> {
        match step {
            Step::Publish(out, next) => {
                if cas(next) {
                    return Some(Ok(out));
                }
                self.hot.retries.fetch_add(1, Ordering::Relaxed);
                backoff.spin();
                None
            }
            Step::Freeze => {
                freeze();
                None
            }
            Step::Done(result) => Some(result),
        }
    }

    /// Stops packed-mode writes: `w` (packed) becomes frozen with the same state. Losing the
    /// race is fine: the caller reloads the word either way.
    #[cold]
    fn freeze(&self, w: u128) {
        let _ = self
            .hot
            .packed
            .compare_exchange(w, frozen(w), Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Completes the move out of packed mode that froze `w`: installs its state in a slot
    /// (unless another thread already did), then marks the word `SLOTS`. Any thread that
    /// sees a frozen word helps, so no thread waits for the one that froze it.
    #[cold]
    fn thaw(&self, w: u128) {
        // While the bucket was packed, `current` kept its initial value 0 (generation 0,
        // slot 0); the first publication after the freeze is the installation.
        if self.hot.current.load(Ordering::Acquire) == 0 {
            let [b] = self.first_config.bandwidths() else {
                return;
            };
            let state = decode(b, w);
            let mut spare = None;
            if let (Some((i, target)), Some(old)) = (
                self.ensure_spare(&mut spare, 0, stride(&self.first_config)),
                self.slot(0),
            ) {
                target.set_config_index(0);
                target.write(0, state);
                if self.publish(0, old, i) {
                    spare = None;
                }
            }
            if let Some((_, s)) = spare {
                s.busy.store(false, Ordering::Release);
            }
        }
        let _ =
            self.hot
                .packed
                .compare_exchange(w, SLOTS_WORD, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Leaves the packed word for good (for a replacement, which only the slots serve).
    #[cold]
    pub(super) fn leave_packed(&self) {
        loop {
            let w = self.hot.packed.load(Ordering::Acquire);
            match mode(w) {
                PACKED => self.freeze(w),
                FROZEN => self.thaw(w),
                _ => return,
            }
        }
    }

    /// The state of a packed bucket while it is on its word (`None` once it left it).
    pub(super) fn packed_snapshot(&self, b: &Bandwidth) -> Option<BandwidthState> {
        loop {
            let w = self.hot.packed.load(Ordering::Acquire);
            match mode(w) {
                PACKED => return Some(decode(b, w)),
                FROZEN => self.thaw(w),
                _ => return None,
            }
        }
    }
}
