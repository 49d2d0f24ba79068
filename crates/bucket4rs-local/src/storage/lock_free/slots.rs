//! The slots of a lock-free bucket: immutable state snapshots in recycled slots, published by
//! one compare-and-swap of a generation-tagged index (the protocol is described in `mod.rs`).

use bucket4rs_core::ops::Operation;
use bucket4rs_core::ops::{plan, plan_one};
use bucket4rs_core::{
    BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
};
use crossbeam_utils::Backoff;

use super::{FAST, LockFree};
use crate::primitive::{AtomicBool, AtomicI64, Ordering, fence};
use crate::storage::Replacement;

const INDEX_BITS: u32 = 16;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const MAX_SLOTS: usize = 1 << INDEX_BITS;

/// A slot allocated on demand (under contention, or for a configuration with more bandwidths
/// than the inline slots have room for).
#[derive(Debug)]
pub(super) struct Slot {
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

pub(super) fn words(n: usize) -> Box<[AtomicI64]> {
    (0..n).map(|_| AtomicI64::new(0)).collect()
}

/// A view of one slot: its busy flag and its words.
#[derive(Clone, Copy)]
pub(super) struct SlotRef<'a> {
    pub(super) busy: &'a AtomicBool,
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
    pub(super) fn write(self, i: usize, s: BandwidthState) {
        if let Some(w) = self.words.get(3 * i..3 + 3 * i) {
            w[0].store(s.last_refill_nanos(), Ordering::Relaxed);
            w[1].store(s.tokens(), Ordering::Relaxed);
            w[2].store(s.remainder(), Ordering::Relaxed);
        }
    }

    #[inline]
    pub(super) fn set_config_index(self, index: i64) {
        // Only stored when it changes: the word stays shared in every cache otherwise.
        if self.config.load(Ordering::Relaxed) != index {
            self.config.store(index, Ordering::Relaxed);
        }
    }
}

/// State words per slot for `config`.
pub(super) fn stride(config: &BucketConfiguration) -> usize {
    3 * config.bandwidths().len()
}

#[derive(Debug, Default)]
pub(super) struct Overflow {
    pub(super) slots: boxcar::Vec<Slot>,
    configs: boxcar::Vec<BucketConfiguration>,
}

impl LockFree {
    #[inline]
    pub(super) fn slot(&self, index: usize) -> Option<SlotRef<'_>> {
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
    pub(super) fn config(&self, index: i64) -> Option<&BucketConfiguration> {
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

    pub(super) fn overflow(&self) -> &Overflow {
        self.overflow.get_or_init(Box::default)
    }

    /// The table index of `config`, adding it if no equal configuration is there yet.
    pub(super) fn intern(&self, config: &BucketConfiguration) -> i64 {
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
    pub(super) fn claim(&self, current: usize, needed: usize) -> usize {
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
    pub(super) fn still(&self, cur: u64) -> bool {
        fence(Ordering::Acquire);
        self.hot.current.load(Ordering::Relaxed) == cur
    }

    /// Makes sure `spare` holds a claimed slot with room for `needed` words; returns it.
    #[inline]
    pub(super) fn ensure_spare<'a>(
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

    /// Loads `current` and the slot and configuration it names.
    #[inline]
    pub(super) fn load(&self) -> Option<(u64, SlotRef<'_>, i64, &BucketConfiguration)> {
        let cur = self.hot.current.load(Ordering::Acquire);
        let slot = self.slot((cur & INDEX_MASK) as usize)?;
        let index = slot.config_index();
        Some((cur, slot, index, self.config(index)?))
    }

    /// Publishes `spare` (already written) over `cur`, whose slot is `old`.
    #[inline]
    pub(super) fn publish(&self, cur: u64, old: SlotRef<'_>, spare: usize) -> bool {
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

    /// [`run`](Self::run) on the slots.
    #[inline(never)]
    pub(super) fn run_slots<O: Operation, T>(
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
            if let Some(single) = plan_one(op, config, now, || slot.read(0)) {
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
            match plan(op, config, now, |i| slot.read(i)) {
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

    /// Replaces the configuration on the slots (the bucket has left its word).
    pub(super) fn replace_on_slots<F>(&self, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement,
    {
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

    /// The configuration and state on the slots, read consistently.
    pub(super) fn slots_snapshot(&self) -> (BucketConfiguration, BucketState) {
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
