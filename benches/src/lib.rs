//! Shared pieces of the bucket4rs benchmarks (`benches/main.rs`) and of the memory report
//! (`src/bin/bucket4rs-memory.rs`): same-source clocks, the textbook `Mutex<f64>` bucket,
//! the bucket configurations (local and keyed), the barrier-released thread runners and a
//! counting allocator; and (features `redis`, `postgres`) the throwaway servers of the Redis
//! and PostgreSQL examples and how they report several runs (`servers`, `runs`).
//!
//! Run everything with `cargo xtask bench [--quick]`; see `README.md` beside `Cargo.toml`.

#[cfg(any(feature = "redis", feature = "postgres"))]
pub mod runs;
#[cfg(any(feature = "redis", feature = "postgres"))]
pub mod servers;

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use bucket4rs_core::Clock;
use bucket4rs_local::{Bucket, BucketBuilder, KeyedBucket, KeyedBucketBuilder};

/// Capacity of the "never runs dry" configuration: a full bucket of it outlasts any run.
pub const HUGE: u64 = 1_000_000_000_000;

/// Refill of the "never runs dry" configuration per second: one token a nanosecond, the
/// fastest refill a Bucket4j bandwidth allows, and far above what any number of threads take.
pub const PER_SECOND: u64 = 1_000_000_000;

/// bucket4rs on the same clock source as governor's default `QuantaClock`:
/// `quanta::Clock::raw()` scaled by `delta_as_nanos(0, raw)`, exactly what governor reads.
#[derive(Clone, Debug)]
pub struct QuantaClock(quanta::Clock);

impl QuantaClock {
    /// A calibrated quanta clock.
    #[must_use]
    pub fn new() -> Self {
        Self(quanta::Clock::new())
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cold]
#[inline(never)]
fn saturated() -> i64 {
    i64::MAX
}

impl Clock for QuantaClock {
    #[inline]
    fn now_nanos(&self) -> i64 {
        let raw = self.0.raw();
        // Saturating with a branch, as `FastClock` does, rather than a conditional move on the
        // way from the counter to the limiter.
        match i64::try_from(self.0.delta_as_nanos(0, raw)) {
            Ok(nanos) => nanos,
            Err(_) => saturated(),
        }
    }
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// A bucket builder whose single limit never runs dry during a benchmark.
pub fn never_dry() -> BucketBuilder {
    Bucket::builder().add_limit(|l| {
        l.capacity(HUGE)
            .refill_greedy(PER_SECOND, Duration::from_secs(1))
    })
}

/// A bucket builder with `n` limits that never run dry (the first one binding).
pub fn never_dry_n(n: usize) -> BucketBuilder {
    let mut b = Bucket::builder();
    for i in 0..n {
        let seconds = i as u64 + 1;
        b = b.add_limit(|l| {
            l.capacity(HUGE * seconds)
                .refill_greedy(PER_SECOND, Duration::from_secs(seconds))
        });
    }
    b
}

/// A bucket builder for the denied path: one token an hour, which the caller takes first.
pub fn slow() -> BucketBuilder {
    Bucket::builder().add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(3600)))
}

/// State of the textbook bucket: fractional tokens and the last refill time.
#[derive(Debug)]
pub struct TextbookState {
    tokens: f64,
    last: Instant,
}

/// The textbook token bucket every tutorial shows: a lock around `f64` tokens, refilled from
/// `Instant::now()` on every call. Generic over the lock so std's and parking_lot's mutexes
/// run the same code.
#[derive(Debug)]
pub struct Textbook<M> {
    state: M,
    capacity: f64,
    per_second: f64,
}

/// The lock a [`Textbook`] bucket uses.
pub trait Lock: Sync {
    /// Runs `f` on the locked state.
    fn with<R>(&self, f: impl FnOnce(&mut TextbookState) -> R) -> R;
}

impl Lock for Mutex<TextbookState> {
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut TextbookState) -> R) -> R {
        f(&mut self
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl Lock for parking_lot::Mutex<TextbookState> {
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut TextbookState) -> R) -> R {
        f(&mut self.lock())
    }
}

/// The textbook bucket behind `std::sync::Mutex`.
pub type TextbookStd = Textbook<Mutex<TextbookState>>;
/// The textbook bucket behind `parking_lot::Mutex`.
pub type TextbookParkingLot = Textbook<parking_lot::Mutex<TextbookState>>;

impl<M: Lock> Textbook<M> {
    /// Takes one token if there is one.
    #[inline]
    pub fn try_acquire(&self) -> bool {
        let (capacity, per_second) = (self.capacity, self.per_second);
        self.state.with(|s| {
            let now = Instant::now();
            let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
            s.tokens = elapsed.mul_add(per_second, s.tokens).min(capacity);
            s.last = now;
            if s.tokens >= 1.0 {
                s.tokens -= 1.0;
                true
            } else {
                false
            }
        })
    }
}

macro_rules! textbook_ctor {
    ($ty:ty, $lock:expr) => {
        impl $ty {
            /// A full bucket of `capacity` tokens refilling `per_second`.
            #[must_use]
            #[allow(clippy::cast_precision_loss)]
            pub fn new(capacity: u64, per_second: f64, initial: u64) -> Self {
                let state = TextbookState {
                    tokens: initial as f64,
                    last: Instant::now(),
                };
                Self {
                    state: $lock(state),
                    capacity: capacity as f64,
                    per_second,
                }
            }
        }
    };
}
textbook_ctor!(TextbookStd, Mutex::new);
textbook_ctor!(TextbookParkingLot, parking_lot::Mutex::new);

/// Runs `op` `iters` times in total, split over `threads` threads that a barrier releases
/// together; returns the wall time from the first thread's start to the last thread's end,
/// so `wall / iters` is the aggregate time per operation.
pub fn run_threads<F: Fn() + Sync>(threads: usize, iters: u64, op: F) -> Duration {
    spans(threads, iters, |_, mine| {
        for _ in 0..mine {
            op();
        }
        0
    })
    .0
}

/// [`run_threads`] over `len` items visited round-robin: each thread keeps its own running
/// index, starting at its own offset (thread `t` of `n` at `t * len / n`), so the threads walk
/// the items independently, with no shared counter between them. `op(i)` answers whether item
/// `i` gave the expected outcome; returns the wall time and how many answers were not.
///
/// # Panics
/// If `len` is zero.
pub fn run_threads_over<F: Fn(usize) -> bool + Sync>(
    threads: usize,
    iters: u64,
    len: usize,
    op: F,
) -> (Duration, u64) {
    assert!(len > 0, "nothing to visit");
    spans(threads, iters, |t, mine| {
        let mut i = t * len / threads;
        let mut wrong = 0;
        for _ in 0..mine {
            wrong += u64::from(!op(i));
            i = if i + 1 == len { 0 } else { i + 1 };
        }
        wrong
    })
}

/// Runs `body(thread, operations)` on `threads` threads released together by a barrier, the
/// operations split as evenly as `iters` allows; returns the wall time from the first start
/// to the last end, and the sum of what the bodies returned.
fn spans<F: Fn(usize, u64) -> u64 + Sync>(threads: usize, iters: u64, body: F) -> (Duration, u64) {
    let barrier = Barrier::new(threads);
    let n = threads as u64;
    let spans: Vec<(Instant, Instant, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, body) = (&barrier, &body);
                let mine = iters / n + u64::from((t as u64) < iters % n);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let out = body(t, mine);
                    (start, Instant::now(), out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .collect()
    });
    let start = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let end = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    (end - start, spans.iter().map(|s| s.2).sum())
}

/// The cores this process may run on.
#[must_use]
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// A criterion parameter for a thread count, marked when it oversubscribes the cores.
#[must_use]
pub fn threads_label(threads: usize) -> String {
    if threads > cores() {
        format!("{threads}-oversubscribed")
    } else {
        threads.to_string()
    }
}

/// A global allocator that counts live heap bytes and allocation calls, for the memory report.
/// Install it with `#[global_allocator]` in a binary; it forwards to the system allocator.
#[derive(Debug)]
pub struct CountingAllocator {
    live: AtomicI64,
    calls: AtomicU64,
}

impl CountingAllocator {
    /// A counter at zero.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            live: AtomicI64::new(0),
            calls: AtomicU64::new(0),
        }
    }

    /// Bytes currently allocated.
    pub fn live(&self) -> i64 {
        self.live.load(Ordering::SeqCst)
    }

    /// Allocation calls so far (alloc, alloc_zeroed and realloc).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Default for CountingAllocator {
    fn default() -> Self {
        Self::new()
    }
}

#[allow(clippy::cast_possible_wrap)]
// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counters are side effects only.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.live.fetch_add(layout.size() as i64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.live.fetch_add(layout.size() as i64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.live.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.live
            .fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Prints why a benchmark was skipped and, when `BUCKET4RS_BENCH_NOTES` names a file (as
/// `cargo xtask bench` arranges), appends it there for the report.
pub fn note(message: &str) {
    use std::io::Write as _;
    eprintln!("note: {message}");
    if let Some(path) = std::env::var_os("BUCKET4RS_BENCH_NOTES") {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        if let Ok(mut f) = file {
            let _ = writeln!(f, "{message}");
        }
    }
}

/// The configuration of the remote keyed benchmarks (Redis, PostgreSQL): never runs dry, and a
/// consumed token takes days to come back, so a key never expires (and is recreated) in the
/// middle of a run.
#[must_use]
pub fn keyed_config() -> bucket4rs_core::BucketConfiguration {
    let limit = bucket4rs_core::Bandwidth::builder()
        .capacity(HUGE)
        .refill_greedy(1_000, Duration::from_secs(1_000_000))
        .build()
        .expect("bandwidth");
    bucket4rs_core::BucketConfiguration::builder()
        .add_bandwidth(limit)
        .build()
        .expect("configuration")
}

/// Capacity of the keyed "never runs dry" limits, on both sides: governor's largest burst.
pub const KEYED_CAPACITY: u64 = u32::MAX as u64;

/// The keys of the keyed benchmarks and of the memory figures: `"k0"`, `"k1"`, …
#[must_use]
pub fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("k{i}")).collect()
}

/// A keyed bucket whose keys never run dry during a benchmark and never become forgettable:
/// [`KEYED_CAPACITY`] tokens refilling one a second, far below what any thread takes, so a key
/// once used stays short of full (a full key is one a sweep may forget). One greedy bandwidth
/// on the default monotonic clock: every key runs on the compact word.
pub fn keyed_never_dry<K>() -> KeyedBucketBuilder<K> {
    KeyedBucket::builder().add_limit(|l| {
        l.capacity(KEYED_CAPACITY)
            .refill_greedy(1, Duration::from_secs(1))
    })
}

/// governor's quota of the same limit as [`keyed_never_dry`]: a burst of [`KEYED_CAPACITY`]
/// cells, one a second.
#[must_use]
pub fn governor_never_dry() -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::MIN).allow_burst(NonZeroU32::MAX)
}

/// A keyed bucket for the denied path and the memory figures: one token an hour, which the
/// caller takes first (so the key is neither full nor forgettable for an hour).
pub fn keyed_slow<K>() -> KeyedBucketBuilder<K> {
    KeyedBucket::builder().add_limit(|l| l.capacity(1).refill_greedy(1, Duration::from_secs(3600)))
}

/// governor's quota of the same limit as [`keyed_slow`]: one cell an hour.
#[must_use]
pub fn governor_slow() -> governor::Quota {
    governor::Quota::per_hour(NonZeroU32::MIN)
}

/// Capacity of the light keys' limit, on both sides: a second's refill, so that a thread
/// preempted between its clock reading and its update (whose reading is then older than the
/// bucket's last change) still finds its token; a smaller burst would refuse such a call.
pub const LIGHT_CAPACITY: u64 = 1_000_000_000;

/// A keyed bucket of light keys: [`LIGHT_CAPACITY`] tokens refilling one a nanosecond, so a key
/// is full again (and may be forgotten) by the time it comes back, however soon; every call is
/// allowed. The regime of a per-client limit most clients stay well under.
pub fn keyed_light<K>() -> KeyedBucketBuilder<K> {
    KeyedBucket::builder().add_limit(|l| {
        l.capacity(LIGHT_CAPACITY)
            .refill_greedy(PER_SECOND, Duration::from_secs(1))
    })
}

/// governor's quota of the same limit as [`keyed_light`]: a burst of [`LIGHT_CAPACITY`] cells,
/// one a nanosecond.
#[must_use]
pub fn governor_light() -> governor::Quota {
    let burst = NonZeroU32::new(LIGHT_CAPACITY as u32).expect("non-zero");
    governor::Quota::with_period(Duration::from_nanos(1))
        .expect("non-zero period")
        .allow_burst(burst)
}

/// A criterion parameter for a keyed benchmark: `"10000 keys, 2 threads"`, the thread count
/// labelled as by [`threads_label`].
#[must_use]
pub fn keyed_label(keys: usize, threads: usize) -> String {
    let k = if keys == 1 { "key" } else { "keys" };
    let t = if threads == 1 { "thread" } else { "threads" };
    format!("{keys} {k}, {} {t}", threads_label(threads))
}
