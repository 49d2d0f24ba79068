//! How a lock-free bucket leaves its compact word (see `storage::word` for the word itself).
//!
//! Compact mode ends, for good, when a new state does not fit (above capacity, or a value out
//! of range) or the configuration is replaced: the thread writes the state, refilled to its
//! reading, into a claimed slot and swaps the word for a *frozen* word naming that slot (so no
//! compact compare-and-swap can succeed any more); then any thread that sees it publishes the
//! slot (the first publication over the untouched `current` wins) and marks the word
//! [`SLOTS_WORD`]. Every thread that meets a frozen word helps, so none waits for the one that
//! froze it.

use bucket4rs_core::forms::CompactForm;
use bucket4rs_core::{Bandwidth, BandwidthState};

use super::LockFree;
use super::slots::stride;
use crate::primitive::Ordering;
use crate::storage::word::{self, Exit};

/// Frozen words are markers `0..2^16` (the slot they name: slots are fewer than 2^16).
const FROZEN_MARKERS: u64 = 1 << 16;
/// The word of a bucket whose state lives in the slots.
pub(super) const SLOTS_WORD: u64 = word::marker(FROZEN_MARKERS);

/// The frozen word naming slot `index` (below 2^16).
#[inline]
fn frozen(index: usize) -> u64 {
    word::marker(index as u64 & (FROZEN_MARKERS - 1))
}

/// Whether `w` is a frozen word (and not a value or [`SLOTS_WORD`]).
#[inline]
fn is_frozen(w: u64) -> bool {
    !word::is_value(w) && word::marker_of(w) < FROZEN_MARKERS
}

/// The slot a frozen word names.
#[inline]
fn slot_of(w: u64) -> usize {
    word::marker_of(w) as usize
}

/// The form of a bucket that does not start compact, which is never read: any form.
#[cold]
pub(super) fn placeholder() -> CompactForm {
    // Constant input: one token a second is a valid, greedy bandwidth, so neither
    // `expect` can fire.
    let b = Bandwidth::simple(1, core::time::Duration::from_secs(1));
    CompactForm::new(&b.expect("valid"), 0).expect("greedy")
}

impl LockFree {
    /// One step off the compact word after `exit`: freezes the word whose new state did not
    /// fit (unless another thread changed it first: then the caller tries the word again), or
    /// helps install a frozen word. `false` once the word is the slots marker.
    pub(super) fn step_off(&self, exit: Exit, now: i64) -> bool {
        match exit {
            Exit::Leave(w) => {
                self.freeze_compact(w, now);
                true
            }
            Exit::Marker(w) if is_frozen(w) => {
                self.install(w);
                true
            }
            Exit::Marker(_) => false,
        }
    }

    /// Leaves the compact word for good (for a replacement, which only the slots serve),
    /// whatever the word holds.
    #[cold]
    pub(super) fn leave_compact(&self, now: i64) {
        loop {
            let w = self.hot.compact.load();
            let exit = if word::is_value(w) {
                Exit::Leave(w)
            } else {
                Exit::Marker(w)
            };
            if !self.step_off(exit, now) {
                return;
            }
        }
    }

    /// The state of a compact bucket refilled to `now`, while it is on its word (`None` once
    /// it left it: the slots hold the state).
    pub(super) fn compact_snapshot(
        &self,
        form: &CompactForm,
        b: &Bandwidth,
        now: i64,
    ) -> Option<BandwidthState> {
        loop {
            let w = self.hot.compact.load();
            if word::is_value(w) {
                // The word holds no last refill time: the state refilled to `now`.
                return Some(word::decode(form, b, word::value(w), now));
            }
            if !is_frozen(w) {
                return None;
            }
            self.install(w);
        }
    }

    /// The state of `w` (compact), refilled to `now`, is written into a claimed slot, then `w`
    /// is replaced by a frozen word naming that slot (so no compact compare-and-swap can
    /// succeed any more), and installed. If another thread changed the word first, the slot is
    /// released and the caller reloads.
    #[cold]
    fn freeze_compact(&self, w: u64, now: i64) {
        let (Some(form), [b]) = (self.form(), self.first_config.bandwidths()) else {
            return;
        };
        let state = word::decode(form, b, word::value(w), now);
        let mut spare = None;
        let Some((i, slot)) = self.ensure_spare(&mut spare, 0, stride(&self.first_config)) else {
            return;
        };
        slot.set_config_index(0);
        slot.write(0, state);
        // Release: whoever sees the frozen word sees the slot's words.
        match self.hot.compact.swap(w, frozen(i)) {
            Ok(_) => self.install(frozen(i)),
            Err(_) => slot.busy.store(false, Ordering::Release),
        }
    }

    /// Completes the move out of compact mode that froze the word into `w`: publishes the slot
    /// it names (unless another thread already did), then marks the word as slots. Any thread
    /// that sees a frozen word helps, so no thread waits for the one that froze it.
    #[cold]
    fn install(&self, w: u64) {
        // While the bucket was compact, `current` kept its initial value 0; the first
        // publication after the freeze is the installation, and only the frozen word's slot
        // is ever installed (a word is frozen once).
        if self.hot.current.load(Ordering::Acquire) == 0
            && let Some(old) = self.slot(0)
        {
            self.publish(0, old, slot_of(w));
        }
        let _ = self.hot.compact.swap(w, SLOTS_WORD);
    }
}

#[cfg(all(test, not(bucket4rs_loom)))]
mod tests {
    use super::*;

    #[test]
    fn frozen_words_name_their_slot_and_differ_from_the_slots_word() {
        for i in [0, 1, 65_535] {
            assert!(is_frozen(frozen(i)));
            assert_eq!(slot_of(frozen(i)), i);
            assert!(!word::is_value(frozen(i)));
        }
        assert!(!is_frozen(SLOTS_WORD));
        assert!(!word::is_value(SLOTS_WORD));
    }
}
