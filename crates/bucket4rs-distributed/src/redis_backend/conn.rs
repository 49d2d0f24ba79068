//! The Redis backend's connections and its estimate of the server's clock.
//!
//! Each slot holds one multiplexed connection whose driver task this module spawns, so it
//! knows when the connection has ended (the server closed it, was killed or restarted): the
//! next command then goes on a fresh connection instead of failing on the dead one. A
//! connection that cannot be made (refused, or not within the connect timeout or the call's
//! deadline) is a prompt, retryable error: nothing was sent.
//!
//! The clock estimate (`crate::skew`) turns a caller's deadline (an [`Instant`] of this host)
//! into a reading of the server's `TIME`, for the scripts to refuse a command that runs after
//! it.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use core::time::Duration;
use std::sync::Arc;
use std::time::Instant;

use redis::aio::MultiplexedConnection;

use super::map_err;
use crate::error::{BackendError, BackendErrorKind};
use crate::skew::{ClockOffset, host_micros};

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

pub(super) struct Pool {
    client: redis::Client,
    slots: Box<[tokio::sync::Mutex<Option<Live>>]>,
    next: AtomicUsize,
    connect_timeout: Duration,
    response_timeout: Duration,
    skew: ClockOffset,
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
            skew: ClockOffset::new(),
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
                pool.observe(time.0, time.1, arrived);
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

    /// Records a reply that carried the server's `TIME` (seconds, microseconds) and arrived at
    /// `arrived` ([`host_micros`]).
    pub(super) fn observe(&self, seconds: i64, micros: i64, arrived: i64) {
        let server = seconds.saturating_mul(1_000_000).saturating_add(micros);
        self.skew.observe(server, arrived);
    }

    /// `deadline` as a reading of the server's clock in microseconds ('' without one): the
    /// host's wall-clock time of the deadline plus the lower bound of the offset, so a script
    /// that passes the check started at least one reply's return trip before the caller's
    /// deadline (as long as neither clock stepped since the bound was observed).
    pub(super) fn server_deadline(&self, deadline: Option<Instant>) -> String {
        let Some(deadline) = deadline else {
            return String::new();
        };
        self.skew.on_server(deadline).to_string()
    }
}
