//! The default clock of local buckets.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use bucket4rs_core::Clock;

#[derive(Debug)]
struct Anchor {
    clock: quanta::Clock,
    raw: u64,
    epoch_nanos: i64,
}

#[inline]
fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let clock = quanta::Clock::new();
        let raw = clock.raw();
        let epoch_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        Anchor {
            clock,
            raw,
            epoch_nanos,
        }
    })
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
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FastClock;

impl Clock for FastClock {
    #[inline]
    fn now_nanos(&self) -> i64 {
        let a = anchor();
        let delta = a.clock.delta_as_nanos(a.raw, a.clock.raw());
        a.epoch_nanos
            .saturating_add(i64::try_from(delta).unwrap_or(i64::MAX))
    }

    fn is_wall_clock_based(&self) -> bool {
        true
    }
}
