//! The lock-free strategy: one 64-bit compare-and-swap for a one-bandwidth greedy bucket on a
//! monotonic clock, one 128-bit compare-and-swap for other one-bandwidth buckets; immutable
//! snapshots in recycled slots, published by one CAS, for everything else.
//!
//! # Compact mode (one greedy bandwidth, monotonic clock)
//!
//! The default case — one greedy limit, the default [`FastClock`](crate::FastClock) — keeps
//! the whole state in one 64-bit word: the GCRA's "theoretical arrival time" in the core's
//! exact scaled units ([`CompactForm`]), the reading at which the bucket is full again. With
//! readings that never go back, the last refill time is implied and need not be stored. An
//! operation loads the word, runs the GCRA step for try_consume (`u' = max(u, p) + need`,
//! taken when `u' − p <= capacity`; other operations decode, plan with the core and
//! re-encode), and compare-and-swaps the new word in: governor's shape and cost, with
//! Bucket4j's exact integer semantics. The hot path is inlined into the caller; everything
//! else (retries, other operations, leaving the mode) is out of line. See [`compact`] for the
//! word and how the mode ends.
//!
//! # Packed mode (one bandwidth)
//!
//! A bucket whose configuration has a single bandwidth but no compact form (an interval
//! refill, or a clock that may go back) keeps its whole state in one 128-bit word, `packed`:
//! the last refill time, and the balance in the core's scaled form
//! ([`ScaledState`](bucket4rs_core::ScaledState), `tokens × unit + remainder / quantum`, in 62
//! bits) with a two-bit mode. An operation loads the word (Acquire), decides with the core —
//! `ops::plan_scaled` (division-free) for try_consume, else decode and `ops::plan_one` /
//! `ops::plan` — and, if the state changes, compare-and-swaps the new word in (AcqRel). A
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

use std::sync::OnceLock;

use bucket4rs_core::ops::{self, Operation};
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketState, CompactForm, CompactStop, ConfigError,
    OperationError,
};

use crossbeam_utils::Backoff;

use super::{NewStorage, Replacement, Storage};
use crate::primitive::{
    AtomicBool, AtomicI64, AtomicU64, AtomicU128, Ordering, fence, wide_word_supported,
};

const INDEX_BITS: u32 = 16;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const MAX_SLOTS: usize = 1 << INDEX_BITS;

/// Slots kept inline; further slots (only needed under contention) go to the overflow table.
#[cfg(not(bucket4rs_loom))]
const FAST: usize = 2;
/// Under loom every slot a 3-thread model can need is inline, so the model covers all of them.
#[cfg(bucket4rs_loom)]
const FAST: usize = 4;

/// A slot allocated on demand (under contention, or for a configuration with more bandwidths
/// than the inline slots have room for).
#[derive(Debug)]
struct Slot {
    busy: AtomicBool,
    config: AtomicI64,
    words: Box<[AtomicI64]>,
}

impl Slot {
    fn new(stride: usize, busy: bool) -> Self {
        Self {
            busy: AtomicBool::new(busy),
            config: AtomicI64::new(0),
            words: words(stride),
        }
    }
}

fn words(n: usize) -> Box<[AtomicI64]> {
    (0..n).map(|_| AtomicI64::new(0)).collect()
}

/// A view of one slot: its busy flag and its words.
#[derive(Clone, Copy)]
struct SlotRef<'a> {
    busy: &'a AtomicBool,
    /// Index of the slot's configuration in the interned table (0: the first one). Rarely
    /// written, so it lives apart from the hot state words.
    config: &'a AtomicI64,
    /// Three words per bandwidth: last refill, tokens, remainder.
    words: &'a [AtomicI64],
}

impl SlotRef<'_> {
    #[inline]
    fn config_index(self) -> i64 {
        self.config.load(Ordering::Relaxed)
    }

    #[inline]
    fn read(self, i: usize) -> BandwidthState {
        match self.words.get(3 * i..3 + 3 * i) {
            Some(w) => BandwidthState::from_parts(
                w[0].load(Ordering::Relaxed),
                w[1].load(Ordering::Relaxed),
                w[2].load(Ordering::Relaxed),
            ),
            None => BandwidthState::default(),
        }
    }

    #[inline]
    fn write(self, i: usize, s: BandwidthState) {
        if let Some(w) = self.words.get(3 * i..3 + 3 * i) {
            w[0].store(s.last_refill_nanos(), Ordering::Relaxed);
            w[1].store(s.tokens(), Ordering::Relaxed);
            w[2].store(s.remainder(), Ordering::Relaxed);
        }
    }

    #[inline]
    fn set_config_index(self, index: i64) {
        // Only stored when it changes: the word stays shared in every cache otherwise.
        if self.config.load(Ordering::Relaxed) != index {
            self.config.store(index, Ordering::Relaxed);
        }
    }
}

/// State words per slot for `config`.
fn stride(config: &BucketConfiguration) -> usize {
    3 * config.bandwidths().len()
}

/// The words operations touch, one cache line per protocol, so that an operation under
/// contention moves one line between cores: the compact word with its form and the lost-race
/// counter (line 0); the published slot index, the busy flags and both inline slots of a
/// one-bandwidth bucket (line 1); the packed word (line 2).
#[derive(Debug)]
#[repr(C, align(64))]
struct Hot {
    /// The compact one-bandwidth state, or a mode marker (see [`compact`]).
    compact: AtomicU64,
    /// How compact values read (fixed; beside the word, so the hot path touches one line).
    /// A placeholder in a bucket that did not start compact (its word holds a marker from
    /// the start, so the form is never read): no `Option` to test on the hot path.
    form: CompactForm,
    /// Lost compare-and-swap races ([`LockFree::contention_retries`]). In the compact word's
    /// cache line: a thread that just lost a race on that word holds the line, so counting
    /// costs no extra transfer between cores.
    retries: AtomicU64,
    _line1: [u64; 1],
    current: AtomicU64,
    busy: [AtomicBool; FAST],
    /// The inline slots' words when the first configuration has a single bandwidth.
    single: [AtomicI64; 3 * FAST],
    /// The packed one-bandwidth state, or the [`SLOTS`] mode marker (see [`packed`]).
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

#[derive(Debug, Default)]
struct Overflow {
    slots: boxcar::Vec<Slot>,
    configs: boxcar::Vec<BucketConfiguration>,
}

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

impl NewStorage for LockFree {
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
                    Some((form, compact::encode(&form, b, st)?))
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
                compact: AtomicU64::new(compact.unwrap_or(compact::SLOTS_WORD)),
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
    /// How many times a compare-and-swap lost a race and the operation was retried — a
    /// diagnostic of contention (it only counts, it never slows the success path).
    ///
    /// ```
    /// use bucket4rs_local::{Bucket, LockFreeBucket};
    /// use std::time::Duration;
    /// let bucket: LockFreeBucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .build()?;
    /// bucket.try_consume(1)?;
    /// assert_eq!(bucket.storage().contention_retries(), 0); // one thread never retries
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn contention_retries(&self) -> u64 {
        self.hot.retries.load(Ordering::Relaxed)
    }

    /// Whether the bucket runs on a one-bandwidth word rather than on the slots: the compact
    /// 64-bit word ([`is_compact`](Self::is_compact)), or the packed 128-bit one (one
    /// bandwidth whose clock may go back or whose refill is by intervals, a state that fits,
    /// a CPU with a native 128-bit word — x86-64 with AVX). Once a bucket leaves its word it
    /// never returns.
    ///
    /// ```
    /// use bucket4rs_local::{Bucket, LockFreeBucket, ManualClock};
    /// use std::time::Duration;
    /// // One greedy limit on the default (monotonic) clock: the compact word, on any CPU.
    /// let one: LockFreeBucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .build()?;
    /// assert!(one.storage().is_packed() && one.storage().is_compact());
    /// // A clock that may go back: the packed word where it is native.
    /// let manual: LockFreeBucket<ManualClock> = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .with_clock(ManualClock::new(0))
    ///     .build()?;
    /// # #[cfg(target_arch = "x86_64")]
    /// assert_eq!(manual.storage().is_packed(), std::arch::is_x86_feature_detected!("avx"));
    /// let two: LockFreeBucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .add_limit(|l| l.capacity(100).refill_greedy(100, Duration::from_secs(60)))
    ///     .build()?;
    /// assert!(!two.storage().is_packed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_packed(&self) -> bool {
        match self.kind {
            Kind::Compact => self.is_compact(),
            Kind::Packed => packed::mode(self.hot.packed.load(Ordering::Acquire)) != packed::SLOTS,
            Kind::Slots => false,
        }
    }

    /// Whether the bucket runs on the compact 64-bit word: one greedy bandwidth, a clock that
    /// declares itself [monotonic](bucket4rs_core::Clock::is_monotonic) (the default
    /// [`FastClock`](crate::FastClock) does), a state that fits. Then an operation is one
    /// 64-bit load and at most one 64-bit compare-and-swap, like governor's. Once it leaves
    /// compact mode it never returns.
    ///
    /// ```
    /// use bucket4rs_local::{Bucket, LockFreeBucket, ManualClock};
    /// use std::time::Duration;
    /// let greedy: LockFreeBucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .build()?;
    /// assert!(greedy.storage().is_compact());
    /// // A manual clock may go back: the bucket keeps the last refill time (packed or slots).
    /// let manual: LockFreeBucket<ManualClock> = Bucket::builder()
    ///     .add_limit(|l| l.capacity(10).refill_greedy(10, Duration::from_secs(1)))
    ///     .with_clock(ManualClock::new(0))
    ///     .build()?;
    /// assert!(!manual.storage().is_compact());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_compact(&self) -> bool {
        self.kind == Kind::Compact
            && compact::mode(self.hot.compact.load(Ordering::Acquire)) == compact::VALUE
    }

    /// Slots allocated so far (two inline, more only under contention).
    ///
    /// ```
    /// use bucket4rs_local::{Bucket, LockFreeBucket};
    /// use std::time::Duration;
    /// let bucket: LockFreeBucket = Bucket::builder()
    ///     .add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(1)))
    ///     .build()?;
    /// assert_eq!(bucket.storage().slot_count(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn slot_count(&self) -> usize {
        FAST + self.overflow.get().map_or(0, |o| o.slots.count())
    }

    #[inline]
    fn slot(&self, index: usize) -> Option<SlotRef<'_>> {
        if index < FAST {
            let start = index * self.stride;
            let words = if self.stride == 3 {
                &self.hot.single[..]
            } else {
                &self.fast_words[..]
            };
            Some(SlotRef {
                busy: self.hot.busy.get(index)?,
                config: self.fast_config.get(index)?,
                words: words.get(start..start + self.stride)?,
            })
        } else {
            self.overflow_slot(index)
        }
    }

    #[cold]
    fn overflow_slot(&self, index: usize) -> Option<SlotRef<'_>> {
        let s = self.overflow.get()?.slots.get(index - FAST)?;
        Some(SlotRef {
            busy: &s.busy,
            config: &s.config,
            words: &s.words,
        })
    }

    #[inline]
    fn config(&self, index: i64) -> Option<&BucketConfiguration> {
        if index == 0 {
            Some(&self.first_config)
        } else {
            self.interned(index)
        }
    }

    #[cold]
    fn interned(&self, index: i64) -> Option<&BucketConfiguration> {
        self.overflow
            .get()?
            .configs
            .get(usize::try_from(index - 1).ok()?)
    }

    fn overflow(&self) -> &Overflow {
        self.overflow.get_or_init(Box::default)
    }

    /// The table index of `config`, adding it if no equal configuration is there yet.
    fn intern(&self, config: &BucketConfiguration) -> i64 {
        if *config == self.first_config {
            return 0;
        }
        let table = &self.overflow().configs;
        if let Some((i, _)) = table.iter().find(|(_, c)| *c == config) {
            return i as i64 + 1;
        }
        table.push(config.clone()) as i64 + 1
    }

    /// Claims a free slot with room for `needed` words, trying first the inline slot after
    /// `current` (the only candidate on one thread).
    #[inline]
    fn claim(&self, current: usize, needed: usize) -> usize {
        if needed <= self.stride {
            for k in 1..=FAST {
                let i = (current + k) % FAST;
                let busy = &self.hot.busy[i];
                if !busy.load(Ordering::Relaxed)
                    && busy
                        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    return i;
                }
            }
        }
        self.claim_overflow(needed)
    }

    #[cold]
    #[inline(never)]
    fn claim_overflow(&self, needed: usize) -> usize {
        let take = |s: &Slot| {
            s.words.len() >= needed
                && !s.busy.load(Ordering::Relaxed)
                && s.busy
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        };
        loop {
            let overflow = self.overflow();
            if let Some((i, _)) = overflow.slots.iter().find(|(_, s)| take(s)) {
                return FAST + i;
            }
            if FAST + overflow.slots.count() < MAX_SLOTS {
                return FAST + overflow.slots.push(Slot::new(needed, true));
            }
            // 65536 operations are mid-flight on this bucket: wait for one to finish.
            std::thread::yield_now();
        }
    }

    /// Whether `current` still equals `cur` after the reads made so far.
    #[inline]
    fn still(&self, cur: u64) -> bool {
        fence(Ordering::Acquire);
        self.hot.current.load(Ordering::Relaxed) == cur
    }

    /// Makes sure `spare` holds a claimed slot with room for `needed` words; returns it.
    #[inline]
    fn ensure_spare<'a>(
        &'a self,
        spare: &mut Option<(usize, SlotRef<'a>)>,
        current: usize,
        needed: usize,
    ) -> Option<(usize, SlotRef<'a>)> {
        if let Some((i, s)) = *spare {
            if s.words.len() >= needed {
                return Some((i, s));
            }
            s.busy.store(false, Ordering::Release);
            *spare = None;
        }
        let i = self.claim(current, needed);
        let s = self.slot(i)?;
        // Pairs with the acquire fence of readers that see our writes to a recycled slot.
        fence(Ordering::Release);
        *spare = Some((i, s));
        Some((i, s))
    }

    /// The compact form, if the bucket started compact (else the form is a placeholder).
    fn form(&self) -> Option<&CompactForm> {
        (self.kind == Kind::Compact).then_some(&self.hot.form)
    }

    /// Loads `current` and the slot and configuration it names.
    #[inline]
    fn load(&self) -> Option<(u64, SlotRef<'_>, i64, &BucketConfiguration)> {
        let cur = self.hot.current.load(Ordering::Acquire);
        let slot = self.slot((cur & INDEX_MASK) as usize)?;
        let index = slot.config_index();
        Some((cur, slot, index, self.config(index)?))
    }

    /// Publishes `spare` (already written) over `cur`, whose slot is `old`.
    #[inline]
    fn publish(&self, cur: u64, old: SlotRef<'_>, spare: usize) -> bool {
        fence(Ordering::Acquire);
        let next = (((cur >> INDEX_BITS).wrapping_add(1)) << INDEX_BITS) | spare as u64;
        match self
            .hot
            .current
            .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => {
                old.busy.store(false, Ordering::Release);
                true
            }
            Err(_) => {
                self.hot.retries.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
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
        self.run_compact(op, now, finish)
    }

    /// [`run`](Self::run) for a bucket that is not in compact mode (or a compact operation
    /// that needs more than the inline path): by the word the bucket started on.
    #[inline(never)]
    fn run_other<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
    ) -> Result<(O::Output, T), OperationError> {
        match self.kind {
            Kind::Compact => self.run_compact_loop(op, now, finish, None),
            Kind::Packed => self.run_packed(op, now, finish),
            Kind::Slots => self.run_slots(op, now, finish),
        }
    }

    /// Runs `op` on the compact word: the common case — compact mode, the division-free
    /// shortcut, no lost race — inline, in one load and at most one compare-and-swap;
    /// everything else in [`run_compact_loop`](Self::run_compact_loop), out of line so the hot
    /// path stays small (no spills, no jump table).
    #[inline(always)]
    fn run_compact<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
    ) -> Result<(O::Output, T), OperationError> {
        let config = &self.first_config;
        let w = self.hot.compact.load(Ordering::Acquire);
        // Straight-line early returns, no joining `match`: the result stays in registers.
        let form = &self.hot.form;
        if compact::mode(w) != compact::VALUE {
            return self.run_other(op, now, finish);
        }
        let v = compact::value(w);
        let (out, new) = match form.plan(op, v, now) {
            Ok(planned) => planned,
            Err(CompactStop::Invalid(e)) => return Err(e),
            Err(CompactStop::Decline) => return self.run_other(op, now, finish),
        };
        if new == v {
            return Ok((out, finish(config)));
        }
        let Some(next) = compact::encode_value(new) else {
            return self.run_other(op, now, finish);
        };
        match self
            .hot
            .compact
            .compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok((out, finish(config))),
            Err(seen) => {
                self.hot.retries.fetch_add(1, Ordering::Relaxed);
                self.retry_compact(op, now, finish, seen)
            }
        }
    }

    /// A lost race of the inline path: the loop, starting from the word the failed
    /// compare-and-swap saw (no reload of a line the other core is writing).
    #[inline(never)]
    fn retry_compact<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
        seen: u64,
    ) -> Result<(O::Output, T), OperationError> {
        self.run_compact_loop(op, now, finish, Some(seen))
    }

    /// [`run_compact`](Self::run_compact) in full: retries with backoff, the decoded path for
    /// operations without a shortcut, leaving compact mode, and the slots after it. `seen`
    /// is the word a lost compare-and-swap returned: each retry starts from the value that
    /// beat it, as governor's loop does, instead of loading again a cache line the other
    /// core is writing (on the Intel machine, 2-thread throughput on one bucket went from
    /// 0.86× governor's to 2×).
    #[inline]
    fn run_compact_loop<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
        mut seen: Option<u64>,
    ) -> Result<(O::Output, T), OperationError> {
        let backoff = Backoff::new();
        let config = &self.first_config;
        let (Some(form), [b]) = (self.form(), config.bandwidths()) else {
            // Unreachable: compact mode is only entered for one greedy bandwidth.
            return self.run_slots(op, now, finish);
        };
        loop {
            // The word a lost compare-and-swap saw (read with `Acquire`, as a load), or a load.
            let w = match seen.take() {
                Some(w) => w,
                None => self.hot.compact.load(Ordering::Acquire),
            };
            match compact::mode(w) {
                compact::VALUE => {
                    let v = compact::value(w);
                    // The GCRA step for try_consume; decoded for everything else.
                    let step = match form.plan(op, v, now) {
                        Ok((out, new)) if new == v => Step::Done(Ok(out)),
                        Ok((out, new)) => Step::publish(out, compact::encode_value(new)),
                        Err(CompactStop::Invalid(e)) => Step::Done(Err(e)),
                        Err(CompactStop::Decline) => {
                            let s = form.decode(v, now).to_state(b);
                            self.decoded_step(op, s, now, |new| compact::encode(form, b, new))
                        }
                    };
                    let cas = |next| {
                        let word = &self.hot.compact;
                        word.compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire)
                    };
                    let settled = self.settle(
                        step,
                        |next| match cas(next) {
                            Ok(_) => true,
                            Err(beaten_by) => {
                                seen = Some(beaten_by);
                                false
                            }
                        },
                        &backoff,
                        || {
                            self.freeze_compact(w, now);
                        },
                    );
                    if let Some(result) = settled {
                        return result.map(|out| (out, finish(config)));
                    }
                }
                compact::FROZEN => self.install(w),
                _ => return self.run_slots(op, now, finish),
            }
        }
    }

    /// Runs `op`: on the packed word while the bucket is in packed mode, else on the slots.
    /// Inlined into [`run_other`](Self::run_other), away from compact buckets' hot path.
    #[inline]
    fn run_packed<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
    ) -> Result<(O::Output, T), OperationError> {
        let backoff = Backoff::new();
        loop {
            let w = self.hot.packed.load(Ordering::Acquire);
            match packed::mode(w) {
                packed::PACKED => {
                    let config = &self.first_config;
                    let [b] = config.bandwidths() else {
                        // Unreachable: packed mode is only entered for one bandwidth.
                        return self.run_slots(op, now, finish);
                    };
                    let scaled = packed::scaled(w);
                    // Division-free first (try_consume on a greedy bandwidth), then decoded.
                    let step = match ops::plan_scaled(op, b, now, scaled) {
                        Some(Ok((out, Some(new)))) => {
                            Step::publish(out, packed::encode_scaled(new, packed::PACKED))
                        }
                        Some(other) => Step::Done(other.map(|(out, _)| out)),
                        None => self.decoded_step(op, scaled.to_state(b), now, |new| {
                            packed::encode(b, new, packed::PACKED)
                        }),
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
                packed::FROZEN => self.thaw(w),
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

    /// The one-bandwidth path for operations without a scaled shortcut, on the decoded state
    /// `s`: the core's shortcut or its general engine. The new state, if it changed.
    #[inline]
    fn plan_state<O: Operation>(
        &self,
        op: &O,
        s: BandwidthState,
        now: i64,
    ) -> Result<(O::Output, Option<BandwidthState>), OperationError> {
        let config = &self.first_config;
        match ops::plan_one(op, config, now, || s) {
            Some(single) => single,
            None => ops::plan(op, config, now, |_| s).map(|plan| {
                let mut new = None;
                plan.write(|_, st| new = Some(st));
                (plan.into_output(), new)
            }),
        }
    }

    /// [`plan_state`](Self::plan_state) as a step on a one-bandwidth word: a new state is
    /// published in the form `encode` gives it, or frozen out of the word if it has none.
    #[inline]
    fn decoded_step<O: Operation, W>(
        &self,
        op: &O,
        s: BandwidthState,
        now: i64,
        encode: impl FnOnce(BandwidthState) -> Option<W>,
    ) -> Step<O::Output, W> {
        match self.plan_state(op, s, now) {
            Ok((out, Some(new))) => Step::publish(out, encode(new)),
            other => Step::Done(other.map(|(out, _)| out)),
        }
    }

    /// Moves a compact bucket to the slots for good: the state of `w` (compact), refilled to
    /// `now`, is written into a claimed slot, then `w` is replaced by a frozen word naming that
    /// slot (so no compact compare-and-swap can succeed any more), and installed. If another
    /// thread changed the word first, the slot is released and the caller reloads.
    #[cold]
    fn freeze_compact(&self, w: u64, now: i64) {
        let (Some(form), [b]) = (self.form(), self.first_config.bandwidths()) else {
            return;
        };
        let state = form.decode(compact::value(w), now);
        let mut spare = None;
        let Some((i, slot)) = self.ensure_spare(&mut spare, 0, stride(&self.first_config)) else {
            return;
        };
        slot.set_config_index(0);
        slot.write(0, state.to_state(b));
        // Release: whoever sees the frozen word sees the slot's words.
        match self.hot.compact.compare_exchange(
            w,
            compact::frozen(i),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => self.install(compact::frozen(i)),
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
        if self.hot.current.load(Ordering::Acquire) == 0 {
            if let Some(old) = self.slot(0) {
                self.publish(0, old, compact::slot(w));
            }
        }
        let _ = self.hot.compact.compare_exchange(
            w,
            compact::SLOTS_WORD,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Stops packed-mode writes: `w` (packed) becomes frozen with the same state. Losing the
    /// race is fine: the caller reloads the word either way.
    #[cold]
    fn freeze(&self, w: u128) {
        let _ = self.hot.packed.compare_exchange(
            w,
            packed::frozen(w),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Completes the move out of packed mode that froze `w`: installs its state in a slot
    /// (unless another thread already did), then marks the word [`SLOTS`]. Any thread that
    /// sees a frozen word helps, so no thread waits for the one that froze it.
    #[cold]
    fn thaw(&self, w: u128) {
        // While the bucket was packed, `current` kept its initial value 0 (generation 0,
        // slot 0); the first publication after the freeze is the installation.
        if self.hot.current.load(Ordering::Acquire) == 0 {
            let [b] = self.first_config.bandwidths() else {
                return;
            };
            let state = packed::decode(b, w);
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
        let _ = self.hot.packed.compare_exchange(
            w,
            packed::SLOTS_WORD,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Leaves the word the bucket started on (if it is still on it), for operations only the
    /// slots serve; `now` is the reading a compact state is refilled to.
    fn leave_word(&self, now: i64) {
        match self.kind {
            Kind::Compact => loop {
                let w = self.hot.compact.load(Ordering::Acquire);
                match compact::mode(w) {
                    compact::VALUE => self.freeze_compact(w, now),
                    compact::FROZEN => self.install(w),
                    _ => return,
                }
            },
            Kind::Packed => loop {
                let w = self.hot.packed.load(Ordering::Acquire);
                match packed::mode(w) {
                    packed::PACKED => self.freeze(w),
                    packed::FROZEN => self.thaw(w),
                    _ => return,
                }
            },
            Kind::Slots => {}
        }
    }

    /// [`run`](Self::run) on the slots.
    #[inline(never)]
    fn run_slots<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
    ) -> Result<(O::Output, T), OperationError> {
        let mut spare: Option<(usize, SlotRef<'_>)> = None;
        let backoff = Backoff::new();
        let result = loop {
            let Some((cur, slot, config_index, config)) = self.load() else {
                continue;
            };
            // One bandwidth: the core's shortcut, without the general engine's plan.
            if let Some(single) = ops::plan_one(op, config, now, || slot.read(0)) {
                match single {
                    Ok((out, Some(state))) => {
                        let current = (cur & INDEX_MASK) as usize;
                        let Some((idx, target)) =
                            self.ensure_spare(&mut spare, current, stride(config))
                        else {
                            continue;
                        };
                        target.set_config_index(config_index);
                        target.write(0, state);
                        if self.publish(cur, slot, idx) {
                            spare = None;
                            break Ok((out, finish(config)));
                        }
                        backoff.spin();
                    }
                    other => {
                        if self.still(cur) {
                            break other.map(|(out, _)| (out, finish(config)));
                        }
                    }
                }
                continue;
            }
            match ops::plan(op, config, now, |i| slot.read(i)) {
                Ok(plan) if plan.changes() => {
                    let current = (cur & INDEX_MASK) as usize;
                    let Some((idx, target)) =
                        self.ensure_spare(&mut spare, current, stride(config))
                    else {
                        continue;
                    };
                    target.set_config_index(config_index);
                    plan.write(|i, s| target.write(i, s));
                    if self.publish(cur, slot, idx) {
                        spare = None;
                        break Ok((plan.into_output(), finish(config)));
                    }
                    // Lost the race: back off briefly so the winners' cache line settles.
                    backoff.spin();
                }
                other => {
                    if self.still(cur) {
                        break other.map(|p| (p.into_output(), finish(config)));
                    }
                }
            }
        };
        if let Some((_, s)) = spare {
            s.busy.store(false, Ordering::Release);
        }
        result
    }
}

impl Storage for LockFree {
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
        let mut spare: Option<(usize, SlotRef<'_>)> = None;
        let backoff = Backoff::new();
        let result = loop {
            let Some((cur, slot, _, config)) = self.load() else {
                continue;
            };
            match f(config, &|i| slot.read(i)) {
                Err(e) => {
                    if self.still(cur) {
                        break Err(e);
                    }
                }
                Ok((new_config, new_state)) => {
                    let index = self.intern(&new_config);
                    let current = (cur & INDEX_MASK) as usize;
                    let Some((s, target)) =
                        self.ensure_spare(&mut spare, current, stride(&new_config))
                    else {
                        continue;
                    };
                    target.set_config_index(index);
                    for (i, st) in new_state.bandwidths().iter().enumerate() {
                        target.write(i, *st);
                    }
                    if self.publish(cur, slot, s) {
                        spare = None;
                        break Ok(());
                    }
                    backoff.spin();
                }
            }
        };
        if let Some((_, s)) = spare {
            s.busy.store(false, Ordering::Release);
        }
        result
    }

    fn snapshot(&self, now: i64) -> (BucketConfiguration, BucketState) {
        let one = |st| {
            (
                self.first_config.clone(),
                BucketState::from_bandwidths(vec![st]),
            )
        };
        match (self.kind, self.first_config.bandwidths(), self.form()) {
            (Kind::Compact, [b], Some(form)) => loop {
                let w = self.hot.compact.load(Ordering::Acquire);
                match compact::mode(w) {
                    // The word holds no last refill time: the state refilled to `now`.
                    compact::VALUE => return one(form.decode(compact::value(w), now).to_state(b)),
                    compact::FROZEN => self.install(w),
                    _ => break,
                }
            },
            (Kind::Packed, [b], _) => loop {
                let w = self.hot.packed.load(Ordering::Acquire);
                match packed::mode(w) {
                    packed::PACKED => return one(packed::decode(b, w)),
                    packed::FROZEN => self.thaw(w),
                    _ => break,
                }
            },
            _ => {}
        }
        loop {
            let Some((cur, slot, _, config)) = self.load() else {
                continue;
            };
            let list = (0..config.bandwidths().len())
                .map(|i| slot.read(i))
                .collect();
            if self.still(cur) {
                return (config.clone(), BucketState::from_bandwidths(list));
            }
        }
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

/// The compact representation of a one-bandwidth greedy state: one 64-bit word, so an
/// operation is one 64-bit load and at most one 64-bit compare-and-swap — governor's cost.
///
/// The word is the compact value `u` itself (see [`CompactForm`]): the reading,
/// in scaled units counted from `base`, at which the bucket is full again. The balance at a
/// reading `t` is `capacity − max(0, u − (t − base) × rate)`; exact while readings never go
/// back, which is why compact mode needs a [monotonic](bucket4rs_core::Clock::is_monotonic)
/// clock. A reading taken before another thread's change (and handed in after it) sees the
/// refill only up to itself: conservative by the nanoseconds of the race, never generous.
/// The lowest 2^17 values of `i64` are reserved as markers: a frozen word naming a slot, and
/// the slots word; a value there does not fit and moves the bucket to the slots.
///
/// Compact mode ends, for good, when a new state does not fit (above capacity, or a value out
/// of range) or the configuration is replaced: the thread writes the state, refilled to its
/// reading, into a claimed slot and swaps the word for a *frozen* word naming that slot; then
/// any thread that sees it publishes the slot (the first publication over the untouched
/// `current` wins) and marks the word [`SLOTS`](compact::SLOTS).
mod compact {
    use bucket4rs_core::{Bandwidth, BandwidthState, CompactForm, ScaledState};

    /// Mode: the compact value is in force.
    pub(super) const VALUE: u64 = 0;
    /// Mode: frozen; the word names the slot holding the state.
    pub(super) const FROZEN: u64 = 1;
    /// Mode: the slots hold the state.
    pub(super) const SLOTS: u64 = 2;

    /// Frozen words are `i64::MIN + slot` (slots are fewer than 2^16).
    const FROZEN_BASE: i64 = i64::MIN;
    /// The word of a bucket whose state lives in the slots.
    pub(super) const SLOTS_WORD: u64 = (i64::MIN + (1 << 16)) as u64;
    /// The smallest compact value a word holds; everything below is a marker.
    const MIN_VALUE: i64 = i64::MIN + (1 << 17);

    #[inline]
    pub(super) fn mode(w: u64) -> u64 {
        if w as i64 >= MIN_VALUE {
            VALUE
        } else if w == SLOTS_WORD {
            SLOTS
        } else {
            FROZEN
        }
    }

    /// The compact value in `w` (mode [`VALUE`]).
    #[inline]
    pub(super) fn value(w: u64) -> i64 {
        w as i64
    }

    /// The word holding `u`, if it is not in the markers' range.
    #[inline]
    pub(super) fn encode_value(u: i64) -> Option<u64> {
        (u >= MIN_VALUE).then_some(u as u64)
    }

    /// The form of a bucket that does not start compact, which is never read: any form.
    #[cold]
    pub(super) fn placeholder() -> CompactForm {
        // Constant input: one token a second is a valid, greedy bandwidth, so neither
        // `expect` can fire.
        let b = Bandwidth::simple(1, core::time::Duration::from_secs(1));
        CompactForm::new(&b.expect("valid"), 0).expect("greedy")
    }

    /// The word holding `st` of `b` in `form`, if it fits.
    #[inline]
    pub(super) fn encode(form: &CompactForm, b: &Bandwidth, st: BandwidthState) -> Option<u64> {
        encode_value(form.encode(ScaledState::from_state(b, st)?)?)
    }

    /// The frozen word naming slot `index` (below 2^16).
    #[inline]
    pub(super) fn frozen(index: usize) -> u64 {
        FROZEN_BASE.wrapping_add((index & 0xffff) as i64) as u64
    }

    /// The slot a frozen word names.
    #[inline]
    pub(super) fn slot(w: u64) -> usize {
        (w as i64).wrapping_sub(FROZEN_BASE) as usize
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use core::time::Duration;

        #[test]
        fn words_round_trip_at_the_edges() {
            for u in [0, 1, -1, i64::MAX, MIN_VALUE, MIN_VALUE + 1] {
                let w = encode_value(u).expect("fits");
                assert_eq!((mode(w), value(w)), (VALUE, u));
            }
            assert_eq!(encode_value(MIN_VALUE - 1), None);
            assert_eq!(encode_value(i64::MIN), None);
            for i in [0, 1, 65_535] {
                assert_eq!((mode(frozen(i)), slot(frozen(i))), (FROZEN, i));
            }
            assert_eq!(mode(SLOTS_WORD), SLOTS);
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
            assert_eq!(form.decode(u, 5).to_state(&greedy), st);
        }
    }
}

/// The packed representation of a one-bandwidth state: one 128-bit word, so an operation is
/// one load and one compare-and-swap.
///
/// The high half holds the last refill time; the low half the mode (top two bits) and the
/// scaled balance `tokens × period + remainder` (62-bit two's complement, see
/// [`BandwidthState::scaled_balance`]). A bucket starts packed when its configuration has one
/// bandwidth and its state fits; a state that does not fit (a huge forced addition or debt) or a
/// configuration replacement moves it to the slots for good: the word is first *frozen* (its
/// state kept, no packed write can succeed any more), the state is installed in a slot by
/// whichever thread gets there first, and the word becomes [`SLOTS`].
mod packed {
    use bucket4rs_core::{Bandwidth, BandwidthState, ScaledState};

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

    #[cfg(test)]
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
}
