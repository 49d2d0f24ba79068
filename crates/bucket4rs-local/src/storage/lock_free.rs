//! The lock-free strategy: immutable snapshots in recycled slots, published by one CAS.
//!
//! # Protocol
//!
//! The bucket's configuration index and per-bandwidth state live in a *slot*: an array of
//! atomic words `[config_index, L0, s0, e0, L1, s1, e1, …]`. `current` holds the index of the
//! slot in force plus a generation counter, bumped by every publication.
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
    BandwidthState, BucketConfiguration, BucketState, ConfigError, OperationError,
};

use super::{NewStorage, Replacement, Storage};
use crate::primitive::{AtomicBool, AtomicI64, AtomicU64, Ordering, fence};

const INDEX_BITS: u32 = 16;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const MAX_SLOTS: usize = 1 << INDEX_BITS;

/// Slots kept inline; further slots (only needed under contention) go to the overflow table.
#[cfg(not(bucket4rs_loom))]
const FAST: usize = 2;
/// Under loom every slot a 3-thread model can need is inline, so the model covers all of them.
#[cfg(bucket4rs_loom)]
const FAST: usize = 4;

#[derive(Debug)]
struct Slot {
    busy: AtomicBool,
    words: Box<[AtomicI64]>,
}

impl Slot {
    fn new(stride: usize, busy: bool) -> Self {
        Self {
            busy: AtomicBool::new(busy),
            words: (0..stride).map(|_| AtomicI64::new(0)).collect(),
        }
    }

    #[inline]
    fn word(&self, j: usize) -> i64 {
        self.words.get(j).map_or(0, |w| w.load(Ordering::Relaxed))
    }

    #[inline]
    fn read(&self, i: usize) -> BandwidthState {
        let b = 1 + 3 * i;
        BandwidthState::from_parts(self.word(b), self.word(b + 1), self.word(b + 2))
    }

    #[inline]
    fn write(&self, i: usize, s: BandwidthState) {
        let b = 1 + 3 * i;
        if let Some(w) = self.words.get(b..b + 3) {
            w[0].store(s.last_refill_nanos(), Ordering::Relaxed);
            w[1].store(s.tokens(), Ordering::Relaxed);
            w[2].store(s.remainder(), Ordering::Relaxed);
        }
    }
}

fn stride(config: &BucketConfiguration) -> usize {
    1 + 3 * config.bandwidths().len()
}

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
    current: AtomicU64,
    fast: [Slot; FAST],
    first_config: BucketConfiguration,
    overflow: OnceLock<Box<Overflow>>,
    retries: AtomicU64,
}

impl NewStorage for LockFree {
    fn new(config: BucketConfiguration, state: BucketState) -> Self {
        let n = stride(&config);
        let fast: [Slot; FAST] = core::array::from_fn(|i| Slot::new(n, i == 0));
        for (i, s) in state.bandwidths().iter().enumerate() {
            fast[0].write(i, *s);
        }
        Self {
            current: AtomicU64::new(0),
            fast,
            first_config: config,
            overflow: OnceLock::new(),
            retries: AtomicU64::new(0),
        }
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
        self.retries.load(Ordering::Relaxed)
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
    fn slot(&self, index: usize) -> Option<&Slot> {
        if index < FAST {
            self.fast.get(index)
        } else {
            self.overflow.get()?.slots.get(index - FAST)
        }
    }

    #[inline]
    fn config(&self, index: i64) -> Option<&BucketConfiguration> {
        if index == 0 {
            Some(&self.first_config)
        } else {
            self.overflow
                .get()?
                .configs
                .get(usize::try_from(index - 1).ok()?)
        }
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

    /// Claims a free slot with room for `needed` words.
    fn claim(&self, needed: usize) -> usize {
        let try_take = |s: &Slot| {
            s.words.len() >= needed
                && !s.busy.load(Ordering::Relaxed)
                && s.busy
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        };
        loop {
            if let Some(i) = self.fast.iter().position(try_take) {
                return i;
            }
            let overflow = self.overflow();
            if let Some((i, _)) = overflow.slots.iter().find(|(_, s)| try_take(s)) {
                return FAST + i;
            }
            if FAST + overflow.slots.count() < MAX_SLOTS {
                return FAST + overflow.slots.push(Slot::new(needed, true));
            }
            // 65536 operations are mid-flight on this bucket: wait for one to finish.
            std::thread::yield_now();
        }
    }

    #[inline]
    fn release(&self, index: usize) {
        if let Some(s) = self.slot(index) {
            s.busy.store(false, Ordering::Release);
        }
    }

    /// Publishes the claimed slot `spare` over `cur`. On success the old slot is released.
    #[inline]
    fn publish(&self, cur: u64, spare: usize) -> bool {
        let next = (((cur >> INDEX_BITS).wrapping_add(1)) << INDEX_BITS) | spare as u64;
        match self
            .current
            .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => {
                self.release((cur & INDEX_MASK) as usize);
                true
            }
            Err(_) => {
                self.retries.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Whether `current` still equals `cur` after the reads made so far.
    #[inline]
    fn still(&self, cur: u64) -> bool {
        fence(Ordering::Acquire);
        self.current.load(Ordering::Relaxed) == cur
    }

    /// Makes sure `spare` holds a claimed slot with room for `needed` words; returns it.
    fn ensure_spare(&self, spare: &mut Option<usize>, needed: usize) -> usize {
        if let Some(i) = *spare {
            if self.slot(i).is_some_and(|s| s.words.len() >= needed) {
                return i;
            }
            self.release(i);
        }
        let i = self.claim(needed);
        // Pairs with the acquire fence of readers that see our writes to a recycled slot.
        fence(Ordering::Release);
        *spare = Some(i);
        i
    }

    fn run<O: Operation, T>(
        &self,
        op: &O,
        now: i64,
        finish: impl Fn(&BucketConfiguration) -> T,
    ) -> Result<(O::Output, T), OperationError> {
        let mut spare: Option<usize> = None;
        let result = loop {
            let cur = self.current.load(Ordering::Acquire);
            let Some(slot) = self.slot((cur & INDEX_MASK) as usize) else {
                continue;
            };
            let config_index = slot.word(0);
            let Some(config) = self.config(config_index) else {
                continue;
            };
            let mut target: Option<&Slot> = None;
            let res = ops::execute(
                op,
                config,
                now,
                |i| slot.read(i),
                |i, s| {
                    let t = *target.get_or_insert_with(|| {
                        let idx = self.ensure_spare(&mut spare, stride(config));
                        let t = self.slot(idx).unwrap_or(&self.fast[0]);
                        t.words[0].store(config_index, Ordering::Relaxed);
                        t
                    });
                    t.write(i, s);
                },
            );
            match (target.is_some(), spare) {
                (true, Some(s)) => {
                    fence(Ordering::Acquire);
                    if self.publish(cur, s) {
                        spare = None;
                        break res.map(|o| (o, finish(config)));
                    }
                }
                _ => {
                    if self.still(cur) {
                        break res.map(|o| (o, finish(config)));
                    }
                }
            }
        };
        if let Some(s) = spare {
            self.release(s);
        }
        result
    }
}

impl Storage for LockFree {
    #[inline]
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

    fn replace_with<F>(&self, f: F) -> Result<(), ConfigError>
    where
        F: Fn(&BucketConfiguration, &dyn Fn(usize) -> BandwidthState) -> Replacement,
    {
        let mut spare: Option<usize> = None;
        let result = loop {
            let cur = self.current.load(Ordering::Acquire);
            let Some(slot) = self.slot((cur & INDEX_MASK) as usize) else {
                continue;
            };
            let Some(config) = self.config(slot.word(0)) else {
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
                    let s = self.ensure_spare(&mut spare, stride(&new_config));
                    let target = self.slot(s).unwrap_or(&self.fast[0]);
                    target.words[0].store(index, Ordering::Relaxed);
                    for (i, st) in new_state.bandwidths().iter().enumerate() {
                        target.write(i, *st);
                    }
                    fence(Ordering::Acquire);
                    if self.publish(cur, s) {
                        spare = None;
                        break Ok(());
                    }
                }
            }
        };
        if let Some(s) = spare {
            self.release(s);
        }
        result
    }

    fn snapshot(&self) -> (BucketConfiguration, BucketState) {
        loop {
            let cur = self.current.load(Ordering::Acquire);
            let Some(slot) = self.slot((cur & INDEX_MASK) as usize) else {
                continue;
            };
            let Some(config) = self.config(slot.word(0)) else {
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
