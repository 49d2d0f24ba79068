//! The Redis backend's connections and its estimate of the server's clock.
//!
//! Each slot holds one multiplexed connection whose driver task this module spawns, so it
//! knows when the connection has ended (the server closed it, was killed or restarted): the
//! next command then goes on a fresh connection instead of failing on the dead one. A
//! connection that cannot be made (refused, or not within the connect timeout or the call's
//! deadline) is a prompt, retryable error: nothing was sent.
//!
//! The clock estimate turns a caller's deadline (an [`Instant`] of this host) into a reading of
//! the server's `TIME`, for the scripts to refuse a command that runs after it.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use core::time::Duration;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;

use super::map_err;
use crate::error::{BackendError, BackendErrorKind};

/// How long the best (largest) offset observation is kept before a newer one replaces it, so
/// that a step of either clock is followed within this time.
const SKEW_WINDOW: Duration = Duration::from_secs(10);

/// A connection and whether its driver has ended.
#[derive(Clone)]
pub(super) struct Live {
    pub(super) conn: MultiplexedConnection,
    dead: Arc<AtomicBool>,
}

impl Live {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
}

/// Marks a connection dead when its driver task ends, or is dropped unfinished (its runtime
/// shut down).
struct Ended(Arc<AtomicBool>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A lower bound of (server clock − host wall clock), in microseconds.
struct Skew {
    best: i64,
    since: Instant,
}

impl Skew {
    /// A reply's bound: the server's `TIME` (seconds, microseconds) minus the host's
    /// wall-clock time when the reply arrived (the server read its clock before that).
    fn bound(seconds: i64, micros: i64, arrived: i64) -> i64 {
        seconds
            .saturating_mul(1_000_000)
            .saturating_add(micros)
            .saturating_sub(arrived)
    }

    /// Keeps the largest bound seen (the tightest), replaced by the next one once it is
    /// older than [`SKEW_WINDOW`] so a clock step is followed.
    fn observe(&mut self, seen: i64, at: Instant) {
        if seen > self.best || at.saturating_duration_since(self.since) > SKEW_WINDOW {
            self.best = seen;
            self.since = at;
        }
    }

    /// A deadline `left` from `host_now` (host wall-clock microseconds) on the server's clock.
    fn on_server(&self, host_now: i64, left: Duration) -> i64 {
        let left = i64::try_from(left.as_micros()).unwrap_or(i64::MAX);
        host_now.saturating_add(left).saturating_add(self.best)
    }
}

pub(super) struct Pool {
    client: redis::Client,
    slots: Box<[tokio::sync::Mutex<Option<Live>>]>,
    next: AtomicUsize,
    connect_timeout: Duration,
    response_timeout: Duration,
    skew: Mutex<Skew>,
}

/// Microseconds since the Unix epoch on this host's wall clock.
pub(super) fn host_micros() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
    }
}

fn unavailable_within(until: Instant) -> BackendError {
    let left = until.saturating_duration_since(Instant::now());
    BackendError::new(
        BackendErrorKind::Unavailable,
        format!("no connection to Redis could be made within {left:?}"),
    )
    .retryable(true)
}

impl Pool {
    /// Connects every slot (within `budget` each) and reads the server's clock once.
    pub(super) async fn connect(
        client: redis::Client,
        connections: usize,
        connect_timeout: Duration,
        response_timeout: Duration,
        budget: Duration,
    ) -> Result<Self, BackendError> {
        let pool = Self {
            client,
            slots: (0..connections.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
            connect_timeout,
            response_timeout,
            skew: Mutex::new(Skew {
                best: 0,
                since: Instant::now(),
            }),
        };
        for slot in 0..pool.slots.len() {
            let until = Instant::now() + budget;
            let live = pool.live(slot, until).await.map_err(|e| {
                if e.kind() == BackendErrorKind::Unavailable && e.is_retryable() {
                    BackendError::new(
                        BackendErrorKind::Timeout,
                        format!("could not connect to Redis within {budget:?}: {e}"),
                    )
                } else {
                    e
                }
            })?;
            if slot == 0 {
                let mut conn = live.conn;
                let sent = host_micros();
                let time: (i64, i64) = redis::cmd("TIME")
                    .query_async(&mut conn)
                    .await
                    .map_err(map_err)?;
                let arrived = host_micros().max(sent);
                pool.lock_skew().best = Skew::bound(time.0, time.1, arrived);
            }
        }
        Ok(pool)
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The slot for the next command (round-robin).
    pub(super) fn pick(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()
    }

    pub(super) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub(super) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The slot's connection; a fresh one if it has none or its connection has ended. Fails
    /// (retryably: nothing was sent) when none can be made before `until`.
    pub(super) async fn live(&self, slot: usize, until: Instant) -> Result<Live, BackendError> {
        let left = until.saturating_duration_since(Instant::now());
        let Ok(mut current) = tokio::time::timeout(left, self.slots[slot].lock()).await else {
            return Err(unavailable_within(until));
        };
        if let Some(live) = current.as_ref().filter(|l| !l.is_dead()) {
            return Ok(live.clone());
        }
        *current = None;
        let left = until
            .saturating_duration_since(Instant::now())
            .min(self.connect_timeout);
        let connect = self
            .client
            .create_multiplexed_tokio_connection_with_response_timeout(self.response_timeout);
        let (conn, driver) = match tokio::time::timeout(left, connect).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                // Nothing was sent on a connection that could not be made.
                let io = e.is_io_error() || e.is_connection_refusal() || e.is_timeout();
                return Err(map_err(e).retryable(io));
            }
            Err(_) => return Err(unavailable_within(until)),
        };
        let dead = Arc::new(AtomicBool::new(false));
        let ended = Ended(Arc::clone(&dead));
        tokio::spawn(async move {
            driver.await;
            drop(ended);
        });
        let live = Live { conn, dead };
        *current = Some(live.clone());
        Ok(live)
    }

    /// Drops the slot's connection if it is still `live` (after an error that may have broken
    /// it): the next command connects afresh.
    pub(super) async fn discard(&self, slot: usize, live: &Live) {
        let mut current = self.slots[slot].lock().await;
        if current
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(&c.dead, &live.dead))
        {
            *current = None;
        }
    }

    fn lock_skew(&self) -> std::sync::MutexGuard<'_, Skew> {
        self.skew.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a reply that carried the server's `TIME` (seconds, microseconds) and arrived at
    /// `arrived` ([`host_micros`]).
    pub(super) fn observe(&self, seconds: i64, micros: i64, arrived: i64) {
        let seen = Skew::bound(seconds, micros, arrived);
        self.lock_skew().observe(seen, Instant::now());
    }

    /// `deadline` as a reading of the server's clock in microseconds ('' without one): the
    /// host's wall-clock time of the deadline plus the lower bound of the offset, so a script
    /// that passes the check started at least one reply's return trip before the caller's
    /// deadline (as long as neither clock stepped since the bound was observed).
    pub(super) fn server_deadline(&self, deadline: Option<Instant>) -> String {
        let Some(deadline) = deadline else {
            return String::new();
        };
        let left = deadline.saturating_duration_since(Instant::now());
        self.lock_skew().on_server(host_micros(), left).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server clock an hour ahead of this host and one an hour behind: the deadline handed
    /// to the script is the caller's moment on the server's clock, less the reply's return
    /// trip (the bound is taken when the reply arrived, after the server read its clock).
    #[test]
    fn deadlines_move_to_the_server_clock_less_the_return_trip() {
        let hour = 3_600_000_000i64;
        let host = 1_700_000_000_000_000i64;
        for offset in [hour, -hour, 0] {
            // The server read TIME at host + 100 µs, the reply arrived at host + 300 µs.
            let server = host + 100 + offset;
            let bound = Skew::bound(server / 1_000_000, server % 1_000_000, host + 300);
            assert_eq!(bound, offset - 200);
            let skew = Skew {
                best: bound,
                since: Instant::now(),
            };
            let left = Duration::from_millis(250);
            assert_eq!(skew.on_server(host, left), host + 250_000 + offset - 200);
        }
    }

    /// The tightest bound is kept; after the window a newer one replaces it (a clock step).
    #[test]
    fn the_tightest_recent_bound_is_kept() {
        let t0 = Instant::now();
        let mut skew = Skew {
            best: 10,
            since: t0,
        };
        skew.observe(5, t0 + Duration::from_secs(1));
        assert_eq!(
            skew.best, 10,
            "a looser bound (a slow reply) does not replace it"
        );
        skew.observe(12, t0 + Duration::from_secs(2));
        assert_eq!(skew.best, 12);
        skew.observe(-1_000, t0 + Duration::from_secs(20));
        assert_eq!(skew.best, -1_000, "the server clock stepped back: followed");
    }
}
