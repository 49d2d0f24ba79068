//! A remote server's clock as seen from this host: the estimate that turns a caller's deadline
//! (an [`Instant`] here) into a reading of the server's clock, for the server to refuse a
//! command that runs after it (the Redis scripts, the PostgreSQL statements).
//!
//! Each reply that carries the server's clock gives a lower bound of (server clock − host wall
//! clock): the server read its clock before the reply arrived, so the bound is short by the
//! reply's transit. The largest bound is the tightest; a slow reply gives a looser one and is
//! ignored. A bound older than [`WINDOW`] is replaced by the next, so a step of either clock is
//! followed within that time.

use core::time::Duration;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How long the tightest bound is kept before a newer one replaces it.
const WINDOW: Duration = Duration::from_secs(10);

/// Microseconds since the Unix epoch on this host's wall clock.
pub(crate) fn host_micros() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
    }
}

/// The tightest recent lower bound of (server clock − host wall clock), in microseconds.
#[derive(Debug)]
pub(crate) struct ClockOffset(Mutex<Bound>);

#[derive(Debug)]
struct Bound {
    best: i64,
    since: Option<Instant>,
}

impl Bound {
    fn observe(&mut self, seen: i64, at: Instant) {
        let stale = self
            .since
            .is_none_or(|since| at.saturating_duration_since(since) > WINDOW);
        if stale || seen > self.best {
            self.best = seen;
            self.since = Some(at);
        }
    }

    fn on_server(&self, host_now: i64, left: Duration) -> i64 {
        let left = i64::try_from(left.as_micros()).unwrap_or(i64::MAX);
        host_now.saturating_add(left).saturating_add(self.best)
    }
}

impl ClockOffset {
    /// No observation yet: the server's clock is taken to be this host's until the first.
    pub(crate) fn new() -> Self {
        Self(Mutex::new(Bound {
            best: 0,
            since: None,
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bound> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reply that carried the server's clock reading `server_us` (µs since the epoch) and
    /// arrived at `arrived_us` ([`host_micros`]).
    pub(crate) fn observe(&self, server_us: i64, arrived_us: i64) {
        let seen = server_us.saturating_sub(arrived_us);
        self.lock().observe(seen, Instant::now());
    }

    /// Whether a reply has carried the server's clock yet.
    #[cfg(feature = "redis")]
    pub(crate) fn is_observed(&self) -> bool {
        self.lock().since.is_some()
    }

    /// Forgets the bound: the server is another machine now (a failover), whose clock the
    /// next observation measures afresh.
    #[cfg(feature = "redis")]
    pub(crate) fn forget(&self) {
        *self.lock() = Bound {
            best: 0,
            since: None,
        };
    }

    /// An estimate of the server's clock now, in µs since the epoch: slightly behind it (by
    /// the transit of the reply the bound came from).
    #[cfg(feature = "postgres")]
    pub(crate) fn server_now_us(&self) -> i64 {
        host_micros().saturating_add(self.lock().best)
    }

    /// `deadline` as a reading of the server's clock in µs: the host's wall-clock time of the
    /// deadline plus the bound, so a command that passes the check on the server started at
    /// least one reply's transit before the caller's deadline (as long as neither clock
    /// stepped since the bound was observed).
    pub(crate) fn on_server(&self, deadline: Instant) -> i64 {
        let left = deadline.saturating_duration_since(Instant::now());
        self.lock().on_server(host_micros(), left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server clock an hour ahead of this host and one an hour behind: the deadline handed
    /// to the server is the caller's moment on the server's clock, less the reply's transit
    /// (the bound is taken when the reply arrived, after the server read its clock).
    #[test]
    fn deadlines_move_to_the_server_clock_less_the_transit() {
        let hour = 3_600_000_000i64;
        let host = 1_700_000_000_000_000i64;
        for offset in [hour, -hour, 0] {
            // The server read its clock at host + 100 µs, the reply arrived at host + 300 µs.
            let mut bound = Bound {
                best: 0,
                since: None,
            };
            bound.observe((host + 100 + offset) - (host + 300), Instant::now());
            assert_eq!(bound.best, offset - 200);
            let left = Duration::from_millis(250);
            assert_eq!(bound.on_server(host, left), host + 250_000 + offset - 200);
        }
    }

    /// The tightest bound is kept, whatever a slow reply says (the bug this fixes: one reply
    /// delayed by a loaded machine pulled every later deadline into the past); after the
    /// window a newer one replaces it (a clock step is followed).
    #[test]
    fn the_tightest_recent_bound_is_kept() {
        let t0 = Instant::now();
        let mut bound = Bound {
            best: 0,
            since: None,
        };
        bound.observe(10, t0);
        bound.observe(-700_000, t0 + Duration::from_secs(1));
        assert_eq!(
            bound.best, 10,
            "a looser bound (a slow reply) does not replace it"
        );
        bound.observe(12, t0 + Duration::from_secs(2));
        assert_eq!(bound.best, 12);
        bound.observe(-1_000, t0 + Duration::from_secs(20));
        assert_eq!(
            bound.best, -1_000,
            "the server clock stepped back: followed"
        );
    }

    /// The public face: an observation moves the deadline by the offset.
    #[test]
    fn an_observed_offset_moves_the_deadline() {
        let offset = ClockOffset::new();
        let deadline = Instant::now() + Duration::from_secs(1);
        let before = offset.on_server(deadline);
        let now = host_micros();
        offset.observe(now + 5_000_000, now);
        let after = offset.on_server(deadline);
        assert!(
            (after - before - 5_000_000).abs() < 100_000,
            "{}",
            after - before
        );
    }

    /// After a failover to another machine the old server's bound is forgotten: the next
    /// observation is taken whatever it says, even a looser (smaller) bound.
    #[cfg(feature = "redis")]
    #[test]
    fn a_forgotten_bound_is_replaced_by_the_next_observation() {
        let offset = ClockOffset::new();
        let hour = 3_600_000_000i64;
        offset.observe(1_700_000_000_000_000 + hour, 1_700_000_000_000_000);
        assert!(offset.is_observed());
        assert_eq!(offset.lock().best, hour);
        offset.forget();
        assert!(!offset.is_observed());
        offset.observe(1_700_000_000_000_000 - hour, 1_700_000_000_000_000);
        assert_eq!(
            offset.lock().best,
            -hour,
            "the new server's clock, an hour behind"
        );
    }
}
