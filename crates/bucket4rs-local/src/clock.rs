//! The default clock of local buckets.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use bucket4rs_core::Clock;

#[derive(Debug)]
struct Anchor {
    clock: quanta::Clock,
    /// Epoch nanoseconds minus the counter's nanoseconds, both read at the anchoring: a reading
    /// is `offset + counter nanoseconds`, one addition after quanta's scaling.
    offset: i64,
    /// The largest counter reading (nanoseconds) whose sum with `offset` fits `i64`, and at
    /// most `i64::MAX`: one comparison decides the saturation.
    limit: u64,
}

impl Anchor {
    fn new(clock: quanta::Clock, offset: i64) -> Self {
        // offset <= 0: every counter reading up to i64::MAX fits; else up to i64::MAX − offset.
        let limit = i64::MAX.saturating_sub(offset.max(0)).unsigned_abs();
        Self {
            clock,
            offset,
            limit,
        }
    }

    /// `offset + nanos`, saturated at `i64::MAX`.
    #[inline]
    fn reading(&self, nanos: u64) -> i64 {
        if nanos <= self.limit {
            // nanos <= limit <= i64::MAX, and the sum fits by the choice of `limit`.
            (nanos as i64).wrapping_add(self.offset)
        } else {
            saturated()
        }
    }
}

#[inline]
fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let clock = quanta::Clock::new();
        let counter = counter_nanos(&clock);
        let epoch_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        Anchor::new(clock, epoch_nanos.saturating_sub(counter))
    })
}

/// The counter in nanoseconds (quanta's scaling of the raw time-stamp counter), as `i64`.
#[inline]
fn counter_nanos(clock: &quanta::Clock) -> i64 {
    let nanos = clock.delta_as_nanos(0, clock.raw());
    i64::try_from(nanos).unwrap_or(i64::MAX)
}

/// A reading past `i64::MAX` nanoseconds since the epoch (year 2262): saturated. Out of line,
/// so the hot path tests for it with a branch, not with a conditional move in the chain of
/// operations from the counter to the compare-and-swap.
#[cold]
#[inline(never)]
fn saturated() -> i64 {
    i64::MAX
}

/// The default clock: wall-clock nanoseconds since the Unix epoch, advanced by the CPU's
/// time-stamp counter (through `quanta`).
///
/// It is anchored to the system time once per process and then moves with a monotonic counter,
/// so it
/// - costs about half of `Instant::now()` (the clock read is most of a limiter's cost),
/// - never jumps when the system time is adjusted (a wall clock stepped forward would mint
///   tokens),
/// - counts epoch time, so aligned interval refill works out of the box,
/// - keeps nanosecond precision, where Bucket4j's default `SYSTEM_MILLISECONDS` truncates.
///
/// Over long uptimes it can drift from an NTP-disciplined system clock by the counter's
/// frequency error (parts per million); use [`SystemMillisClock`](bucket4rs_core::SystemMillisClock)
/// when aligned refills must follow the system time exactly.
///
/// ```
/// use bucket4rs_local::{Clock, FastClock};
/// let a = FastClock.now_nanos();
/// let b = FastClock.now_nanos();
/// assert!(b >= a);
/// assert!(a > 1_600_000_000_000_000_000); // epoch-based
/// assert!(FastClock.is_wall_clock_based());
/// assert!(FastClock.is_monotonic());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FastClock;

impl Clock for FastClock {
    #[inline]
    fn now_nanos(&self) -> i64 {
        let a = anchor();
        // The offset is the epoch time at the counter's zero, so the sum only overflows in the
        // year 2262; it then saturates.
        a.reading(a.clock.delta_as_nanos(0, a.clock.raw()))
    }

    fn is_wall_clock_based(&self) -> bool {
        true
    }

    /// The time-stamp counter never goes back on CPUs where `quanta` uses it (an invariant
    /// TSC, synchronized across cores), and the `Instant` fallback is monotonic too.
    fn is_monotonic(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The saturating sum the reading stands for.
    fn exact(offset: i64, nanos: u64) -> i64 {
        i64::try_from(nanos)
            .ok()
            .and_then(|n| offset.checked_add(n))
            .unwrap_or(i64::MAX)
    }

    #[test]
    fn readings_saturate_exactly_where_the_sum_leaves_i64() {
        const OFFSETS: [i64; 9] = [
            i64::MIN,
            i64::MIN + 1,
            -5,
            -1,
            0,
            1,
            5,
            i64::MAX - 1,
            i64::MAX,
        ];
        const MAX: u64 = i64::MAX as u64;
        const NANOS: [u64; 12] = [
            0,
            1,
            2,
            4,
            5,
            6,
            MAX - 1,
            MAX,
            MAX + 1,
            MAX + 2,
            u64::MAX - 1,
            u64::MAX,
        ];
        let clock = quanta::Clock::new();
        for offset in OFFSETS {
            let a = Anchor::new(clock.clone(), offset);
            let edge = (i64::MAX as i128 - offset as i128).clamp(0, MAX as i128) as u64;
            let edges = [edge.saturating_sub(1), edge, edge.saturating_add(1)];
            for nanos in NANOS.into_iter().chain(edges) {
                assert_eq!(a.reading(nanos), exact(offset, nanos), "{offset} + {nanos}");
            }
        }
    }
}
