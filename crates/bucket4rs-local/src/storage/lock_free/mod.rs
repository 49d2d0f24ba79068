//! The lock-free strategy: one 64-bit compare-and-swap for a one-bandwidth greedy bucket on a
//! monotonic clock, one 128-bit compare-and-swap for other one-bandwidth buckets; immutable
//! snapshots in recycled slots, published by one CAS, for everything else.
//!
//! # Compact mode (one greedy bandwidth, monotonic clock)
//!
//! The default case — one greedy limit, the default [`FastClock`](crate::FastClock) — keeps
//! the whole state in one 64-bit word: the GCRA's "theoretical arrival time" in the core's
//! exact scaled units (the core's compact form), the reading at which the bucket is full again. With
//! readings that never go back, the last refill time is implied and need not be stored. An
//! operation loads the word, runs the GCRA step for try_consume (`u' = max(u, p) + need`,
//! taken when `u' − p <= capacity`; other operations decode, plan with the core and
//! re-encode), and compare-and-swaps the new word in: governor's shape and cost, with
//! Bucket4j's exact integer semantics. The hot path is inlined into the caller; everything
//! else (retries, other operations, leaving the mode) is out of line. The word and its step
//! are shared with the keyed bucket (`storage::word`); how the mode ends is in `compact.rs`.
//!
//! # Packed mode (one bandwidth)
//!
//! A bucket whose configuration has a single bandwidth but no compact form (an interval
//! refill, or a clock that may go back) keeps its whole state in one 128-bit word, `packed`:
//! the last refill time, and the balance in the core's scaled form
//! (the core's scaled state, `tokens × unit + remainder / quantum`, in 62
//! bits) with a two-bit mode. An operation loads the word (Acquire), decides with the core —
//! `plan_scaled` (division-free) for try_consume, else decode and `plan_one` /
//! `plan` — and, if the state changes, compare-and-swaps the new word in (AcqRel). A
//! read-only outcome needs no validation: the load was atomic. This is the classic single-word
//! CAS loop (governor's shape), with an exact two-word state.
//!
//! Packed mode ends, for good, when a new state does not fit the word (a forced addition or a
//! debt beyond 62 bits, a remainder the scaled form cannot hold) or the configuration is
//! replaced: the thread *freezes* the word (same state, mode FROZEN, so no packed CAS can
//! succeed any more); then any thread that sees a frozen word installs its state in a slot —
//! the first publication over the slots' untouched initial `current` (0), so exactly one
//! installation wins — and marks the word SLOTS. Every thread that meets a frozen word helps,
//! so none waits for the one that froze it. Packed mode is used only where the 128-bit word is
//! native and loads without writing (x86-64 with `CMPXCHG16B` and AVX): elsewhere
//! `portable-atomic` would emulate it with a lock, or load it with a compare-and-swap, and
//! rejections would write the shared line.
//!
//! # Slot mode
//!
//! The bucket's per-bandwidth state lives in a *slot*: atomic words `[L0, s0, e0, L1, s1, e1,
//! …]` plus the index of the slot's configuration. `current` holds the index of the slot in
//! force plus a generation counter, bumped by every publication. For a one-bandwidth bucket,
//! `current`, the busy flags and both inline slots share one cache line, so an operation under
//! contention moves one line between cores. A failed compare-and-swap backs off briefly
//! (`crossbeam_utils::Backoff`) before retrying.
//!
//! - **Read-only outcomes** (rejections, probes, estimates, `available_tokens`): load `current`
//!   (Acquire), read the slot's words (Relaxed), `fence(Acquire)`, and re-load `current`. If it
//!   is unchanged, no publication happened in between, so the slot was in force — and never
//!   written — the whole time: the snapshot is consistent. Otherwise retry.
//! - **Changes**: claim a free slot (`busy` false → true), `fence(Release)`, write the new state
//!   into it (Relaxed), `fence(Acquire)`, then compare-and-swap `current` from the generation
//!   read to (generation + 1, claimed slot) with Release. On success the old slot is released
//!   (`busy` = false, Release); on failure the claimed slot is kept for the retry.
//!
//! A reader that observes any word written by a recycler is ordered after that recycler's claim
//! (its release fence pairs with the reader's acquire fence), and the claim is ordered after the
//! publication that retired the slot, so the reader's validation sees a newer `current` and
//! retries. Garbage read from a torn snapshot is harmless: every core function is total, and
//! the result is discarded.
//!
//! Some thread always makes progress (a failed CAS means another one published), so the bucket
//! is lock-free; a thread never waits for another. Slots are created on demand when every
//! existing one is in use — at most one more than the number of threads operating at once — so
//! after warm-up no operation allocates. The generation has 48 bits: a reader would have to
//! stall for 2^48 publications for a stale compare-and-swap to succeed.
//!
//! Configurations replaced at run time are interned in an append-only table (equal
//! configurations share an entry) that lives as long as the bucket.
//!
//! # Files
//!
//! `mod.rs` holds the storage type and the dispatch by mode; `compact.rs` how a bucket leaves
//! the compact word; `packed.rs` the packed word; `slots.rs` the slots, their publication and
//! the replacement of configurations.

mod compact;
mod packed;
mod slots;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use bucket4rs_core::forms::CompactForm;
use bucket4rs_core::ops::Operation;
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
};

use super::sealed::{New, Sealed};
use super::word::{self, CompactWord, Exit};
use super::{NewStorage, Replacement, Storage};
use crate::primitive::{
    AtomicBool, AtomicI64, AtomicU64, AtomicU128, Ordering, wide_word_supported,
};
use slots::{Overflow, stride, words};

/// Slots kept inline; further slots (only needed under contention) go to the overflow table.
#[cfg(not(bucket4rs_loom))]
const FAST: usize = 2;
/// Under loom every slot a 3-thread model can need is inline, so the model covers all of them.
#[cfg(bucket4rs_loom)]
const FAST: usize = 4;

/// The words operations touch, one cache line per protocol, so that an operation under
/// contention moves one line between cores: the compact word with its form and the lost-race
/// counter (line 0); the published slot index, the busy flags and both inline slots of a
/// one-bandwidth bucket (line 1); the packed word (line 2).
#[derive(Debug)]
#[repr(C, align(64))]
struct Hot {
    /// The compact one-bandwidth state, or a marker (see `compact.rs`).
    compact: CompactWord,
    /// How compact values read (fixed; beside the word, so the hot path touches one line).
    /// A placeholder in a bucket that did not start compact (its word holds a marker from
    /// the start, so the form is never read): no `Option` to test on the hot path.
    form: CompactForm,
    /// Lost compare-and-swap races (read by the stress tests). In the compact word's
    /// cache line: a thread that just lost a race on that word holds the line, so counting
    /// costs no extra transfer between cores.
    retries: AtomicU64,
    _line1: [u64; 1],
    current: AtomicU64,
    busy: [AtomicBool; FAST],
    /// The inline slots' words when the first configuration has a single bandwidth.
    single: [AtomicI64; 3 * FAST],
    /// The packed one-bandwidth state, or the slots marker (see `packed.rs`).
    packed: AtomicU128,
}

// The lines above, checked (loom's atomics have other sizes).
#[cfg(not(bucket4rs_loom))]
const _: () = {
    assert!(core::mem::offset_of!(Hot, retries) < 64);
    assert!(core::mem::offset_of!(Hot, current) == 64);
    assert!(core::mem::offset_of!(Hot, single) + 8 * 3 * FAST <= 128);
    assert!(core::mem::offset_of!(Hot, packed) == 128);
};

/// Lock-free strategy: compare-and-swap over immutable state snapshots, never a lock, and no
/// heap allocation per operation (after warm-up), whatever the number of bandwidths.
///
/// Rejections and read-only operations never write shared memory. This is the default
/// strategy of [`BucketBuilder::build`](crate::BucketBuilder::build).
///
/// ```
/// use bucket4rs_local::{Bucket, LockFreeBucket};
/// use std::time::Duration;
///
/// let bucket: LockFreeBucket = Bucket::builder()
///     .add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(1)))
///     .build()?;
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| while bucket.try_consume(1).unwrap() {});
///     }
/// });
/// assert!(bucket.available_tokens() <= 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct LockFree {
    hot: Hot,
    /// The word this bucket started on (fixed): operations dispatch on it.
    kind: Kind,
    fast_config: [AtomicI64; FAST],
    /// State words per inline slot.
    stride: usize,
    /// The inline slots' words, `FAST * stride` of them, when the first configuration has
    /// several bandwidths (else empty: `hot.single` holds them).
    fast_words: Box<[AtomicI64]>,
    first_config: BucketConfiguration,
    overflow: OnceLock<Box<Overflow>>,
}

impl NewStorage for LockFree {}

impl New for LockFree {
    fn new(config: BucketConfiguration, state: BucketState, monotonic_clock: bool) -> Self {
        let stride = stride(&config);
        let one = match (config.bandwidths(), state.bandwidths()) {
            ([b], [st]) => Some((b, *st)),
            _ => None,
        };
        // Compact mode needs a clock that never goes back (the word does not store the last
        // refill time) and a greedy bandwidth. Values count from reading 0 when that fits (no
        // subtraction on the hot path), else from the state's last refill.
        let (form, compact) = one
            .filter(|_| monotonic_clock)
            .and_then(|(b, st)| {
                [0, st.last_refill_nanos()].into_iter().find_map(|base| {
                    let form = CompactForm::new(b, base)?;
                    Some((form, word::encode(&form, b, st)?))
                })
            })
            .map_or((None, None), |(form, word)| (Some(form), Some(word)));
        // Packed mode needs a native 128-bit compare-and-swap and a load that does not write
        // (else a lock would emulate it, or rejections would write the shared line).
        let packed = one
            .filter(|_| compact.is_none() && wide_word_supported())
            .and_then(|(b, st)| packed::encode(b, st, packed::PACKED));
        let kind = match (compact, packed) {
            (Some(_), _) => Kind::Compact,
            (None, Some(_)) => Kind::Packed,
            (None, None) => Kind::Slots,
        };
        let storage = Self {
            kind,
            hot: Hot {
                compact: CompactWord::new(compact.unwrap_or(compact::SLOTS_WORD)),
                form: form.unwrap_or_else(compact::placeholder),
                retries: AtomicU64::new(0),
                _line1: [0],
                packed: AtomicU128::new(packed.unwrap_or(packed::SLOTS_WORD)),
                current: AtomicU64::new(0),
                busy: core::array::from_fn(|i| AtomicBool::new(i == 0)),
                single: core::array::from_fn(|_| AtomicI64::new(0)),
            },
            fast_config: core::array::from_fn(|_| AtomicI64::new(0)),
            stride,
            fast_words: if stride == 3 {
                words(0)
            } else {
                words(FAST * stride)
            },
            first_config: config,
            overflow: OnceLock::new(),
        };
        if let Some(slot) = storage.slot(0) {
            for (i, s) in state.bandwidths().iter().enumerate() {
                slot.write(i, *s);
            }
        }
        storage
    }
}

impl LockFree {
    /// How many times a compare-and-swap lost a race and the operation was retried (it only
    /// counts, it never slows the success path): the stress tests check that races happened.
    #[cfg(test)]
    pub(crate) fn contention_retries(&self) -> u64 {
        self.hot.retries.load(Ordering::Relaxed)
    }

    /// Whether the bucket runs on a one-bandwidth word rather than on the slots: the compact
    /// 64-bit word ([`is_compact`](Self::is_compact)), or the packed 128-bit one (one
    /// bandwidth whose clock may go back or whose refill is by intervals, a state that fits,
    /// a CPU with a native 128-bit word — x86-64 with AVX). Once a bucket leaves its word it
    /// never returns.
    #[cfg(test)]
    pub(crate) fn is_packed(&self) -> bool {
        match self.kind {
            Kind::Compact => self.is_compact(),
            Kind::Packed => packed::mode(self.hot.packed.load(Ordering::Acquire)) != packed::SLOTS,
            Kind::Slots => false,
        }
    }

    /// Whether the bucket runs on the compact 64-bit word: one greedy bandwidth, a clock that
    /// declares itself monotonic, a state that fits. Once it leaves compact mode it never
    /// returns.
    #[cfg(test)]
    pub(crate) fn is_compact(&self) -> bool {
        self.kind == Kind::Compact && word::is_value(self.hot.compact.load())
    }

    /// The compact form, if the bucket started compact (else the form is a placeholder).
    fn form(&self) -> Option<&CompactForm> {
        (self.kind == Kind::Compact).then_some(&self.hot.form)
    }

    /// Counts a lost compare-and-swap race.
    #[inline]
    fn retried(&self) {
        self.hot.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `op` on the word the bucket started on, or on the slots once it left it. The
    /// compact word is tried first (other buckets hold a marker there), so a compact bucket
    /// pays no dispatch.
    #[inline(always)]
    fn run<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
    ) -> Result<(O::Output, T), OperationError> {
        let config = &self.first_config;
        match self
            .hot
            .compact
            .run(&self.hot.form, config, op, now, &|| self.retried())
        {
            Ok(result) => result.map(|out| (out, finish(config))),
            Err(exit) => self.run_other(op, now, finish, exit),
        }
    }

    /// [`run`](Self::run) for a bucket that is not (or no longer) on its compact word: by the
    /// word it started on. Out of line, away from compact buckets' hot path.
    #[inline(never)]
    fn run_other<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
        exit: Exit,
    ) -> Result<(O::Output, T), OperationError> {
        match self.kind {
            Kind::Compact => {
                let config = &self.first_config;
                let mut exit = exit;
                while self.step_off(exit, now) {
                    // Frozen by another thread, or our freeze lost a race: the word again.
                    let form = &self.hot.form;
                    match self
                        .hot
                        .compact
                        .run_loop(form, config, op, now, &|| self.retried(), None)
                    {
                        Ok(result) => return result.map(|out| (out, finish(config))),
                        Err(e) => exit = e,
                    }
                }
                self.run_slots(op, now, finish)
            }
            Kind::Packed => self.run_packed(op, now, finish),
            Kind::Slots => self.run_slots(op, now, finish),
        }
    }

    /// Leaves the word the bucket started on (if it is still on it), for operations only the
    /// slots serve; `now` is the reading a compact state is refilled to.
    fn leave_word(&self, now: i64) {
        match self.kind {
            Kind::Compact => self.leave_compact(now),
            Kind::Packed => self.leave_packed(),
            Kind::Slots => {}
        }
    }
}

impl Storage for LockFree {}

impl Sealed for LockFree {
    #[inline(always)]
    fn execute<O: Operation>(&self, op: &O, now: i64) -> Result<O::Output, OperationError> {
        self.run(op, now, |_| ()).map(|(o, ())| o)
    }

    fn execute_with_config<O: Operation>(
        &self,
        op: &O,
        now: i64,
    ) -> Result<(O::Output, BucketConfiguration), OperationError> {
        self.run(op, now, BucketConfiguration::clone)
    }

    fn replace_with<F>(&self, now: i64, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement,
    {
        // Replacement is rare: it runs on the slots, which can hold any configuration.
        self.leave_word(now);
        self.replace_on_slots(f)
    }

    fn snapshot(&self, now: i64) -> (BucketConfiguration, BucketState) {
        let one = |st| {
            (
                self.first_config.clone(),
                BucketState::from_bandwidths(vec![st]),
            )
        };
        match (self.kind, self.first_config.bandwidths(), self.form()) {
            (Kind::Compact, [b], Some(form)) => {
                if let Some(state) = self.compact_snapshot(form, b, now) {
                    return one(state);
                }
            }
            (Kind::Packed, [b], _) => {
                if let Some(state) = self.packed_snapshot(b) {
                    return one(state);
                }
            }
            _ => {}
        }
        self.slots_snapshot()
    }
}

/// The word a bucket starts on, fixed at construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// One greedy bandwidth on a monotonic clock: the 64-bit compact word.
    Compact,
    /// One bandwidth: the 128-bit packed word.
    Packed,
    /// Several bandwidths, or no word fits: the slots from the start.
    Slots,
}
