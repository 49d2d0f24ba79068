//! The Redis backend's connections and its estimate of the server's clock.
//!
//! Each slot holds one of the redis crate's multiplexed connections (its own driver task, its
//! response timeout, cancellation-safe requests). The connection speaks RESP3, so its driver
//! reports its end (the server closed it, was killed or restarted) with a disconnection push,
//! which marks the slot's connection dead: the next command then goes on a fresh connection
//! instead of failing on the dead one.
//!
//! Why a slot of our own rather than the crate's `ConnectionManager`, which also reconnects
//! after a disconnection push: the manager answers a command with one error whether its
//! connection could not be made (nothing sent: safe to retry) or the command was sent and its
//! reply did not come (it may have run): a connect timeout and a response timeout are both
//! an I/O `TimedOut`, and a failed reconnect is handed to every later command as it was. The
//! backend must tell the two apart (the first is a retryable `Unavailable`, the second never
//! re-sent), so it connects in its own step, bounded by the connect timeout and the caller's
//! deadline, before anything is sent. A connection that cannot be made (refused, or not in
//! time) is a prompt, retryable error.
//!
//! The clock estimate (`crate::skew`) turns a caller's deadline (an [`Instant`] of this host)
//! into a reading of the server's `TIME`, for the scripts to refuse a command that runs after
//! it.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use core::time::Duration;
use std::sync::Arc;
use std::time::Instant;

use redis::aio::{AsyncPushSender, MultiplexedConnection, SendError};
use redis::{AsyncConnectionConfig, PushInfo, PushKind};

use super::map_err;
use crate::error::{BackendError, BackendErrorKind};
use crate::skew::{ClockOffset, host_micros};
use crate::tls::TlsError;

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

/// The connection's push sender: marks it dead on the driver's disconnection push, and when
/// the driver is dropped unfinished (its runtime shut down), since the driver owns the sender.
struct Watch(Arc<AtomicBool>);

impl AsyncPushSender for Watch {
    fn send(&self, info: PushInfo) -> Result<(), SendError> {
        if info.kind == PushKind::Disconnection {
            self.0.store(true, Ordering::Release);
        }
        Ok(())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Where a pool's connections go: one address, or the current master of a service that
/// Redis Sentinel monitors.
pub(super) enum Source {
    /// The client's address.
    Client(redis::Client),
    /// The master the sentinels name, asked again for every new connection: after a
    /// failover the old master's connections end (or it answers `READONLY`, which drops the
    /// connection too), and the next connection goes to the promoted replica. The client
    /// holds the sentinels' addresses and credentials and how the master is reached
    /// (credentials, database, TLS, RESP3 for its connections to report their end).
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

impl Source {
    /// The client of the address to connect to now, asking the sentinels if need be within
    /// `left` (a failure is retryable: nothing was sent; but a refused handshake or refused
    /// credentials fail the same way until the configuration changes).
    async fn client(&self, left: Duration) -> Result<redis::Client, BackendError> {
        let sentinel = match self {
            Self::Client(client) => return Ok(client.clone()),
            Self::Sentinel(sentinel) => sentinel,
        };
        let ask = async { sentinel.lock().await.async_get_client().await };
        match tokio::time::timeout(left, ask).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(refused(&e).unwrap_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Unavailable,
                    format!("the sentinels name no reachable master: {e}"),
                )
                .retryable(true)
                .with_source(e)
            })),
            Err(_) => Err(BackendError::new(
                BackendErrorKind::Unavailable,
                format!("the sentinels named no master within {left:?}"),
            )
            .retryable(true)),
        }
    }
}

/// A connection refused until the configuration changes: a TLS handshake that failed (typed,
/// [`TlsError`]), or credentials the server refused (a wrong password or user, or none where
/// one is needed). Not retried, by the backend or by the caller; the background connector
/// keeps trying, so a fixed server is used without a restart.
fn refused(e: &redis::RedisError) -> Option<BackendError> {
    if let Some(tls) = TlsError::cause(e) {
        return Some(tls.into_backend());
    }
    let credentials = e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"));
    credentials.then(|| {
        BackendError::new(
            BackendErrorKind::Unavailable,
            format!(
                "Redis refused the credentials (a wrong password or user, or none given where \
                 one is needed): {e}"
            ),
        )
        .refused_until_fixed(true)
        .with_source(e.clone())
    })
}

pub(super) struct Pool {
    source: Source,
    slots: Box<[tokio::sync::Mutex<Option<Live>>]>,
    next: AtomicUsize,
    connect_timeout: Duration,
    response_timeout: Duration,
    skew: ClockOffset,
    /// The address the last connection went to ([`Source::Sentinel`] changes it on a
    /// failover: the clock estimate is then measured afresh).
    server: std::sync::Mutex<Option<redis::ConnectionAddr>>,
}

fn unavailable_within(budget: Duration) -> BackendError {
    BackendError::new(
        BackendErrorKind::Unavailable,
        format!("no connection to Redis could be made within {budget:?}"),
    )
    .retryable(true)
}

/// The longest a TLS connection that timed out leaves for asking the address in plaintext.
pub(super) const PROBE: Duration = Duration::from_millis(200);

/// Whether `host:port` answers a plaintext `PING` with a Redis reply (`+PONG`, or an error
/// such as `-NOAUTH`) within `budget`: a plaintext Redis where TLS was asked for. Needed
/// because such a server reads the TLS hello as an inline command and, unless the hello
/// happens to hold a newline byte, waits for the rest of it: the handshake gets no answer.
pub(super) async fn answers_plaintext(host: &str, port: u16, budget: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut reply = [0u8; 1];
        stream.read_exact(&mut reply).await.ok()?;
        Some(matches!(reply[0], b'+' | b'-'))
    };
    matches!(tokio::time::timeout(budget, probe).await, Ok(Some(true)))
}

/// The first wait of the background connector after a failed attempt; it doubles up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait of the background connector between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Pool {
    /// A pool whose slots have no connection yet: nothing is sent until [`start`](Self::start)
    /// or the first command.
    pub(super) fn new(
        source: Source,
        connections: usize,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            source,
            slots: (0..connections.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
            connect_timeout,
            response_timeout,
            skew: ClockOffset::new(),
            server: std::sync::Mutex::new(None),
        }
    }

    /// Connects the first slot in the background on the current tokio runtime (none: the
    /// first command connects), retrying with a backoff (50 ms, doubling up to 5 s) until a
    /// connection is made, so that a backend can be created while its server is down or
    /// refuses the handshake. Ends when the connection is made or the pool is dropped.
    pub(super) fn start(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut wait = FIRST_BACKOFF;
            loop {
                let Some(pool) = pool.upgrade() else { return };
                let until = Instant::now() + pool.connect_timeout;
                if pool.live(0, until).await.is_ok() {
                    return;
                }
                drop(pool);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
        });
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
            return Err(unavailable_within(left));
        };
        if let Some(live) = current.as_ref().filter(|l| !l.is_dead()) {
            return Ok(live.clone());
        }
        *current = None;
        let client = self
            .source
            .client(until.saturating_duration_since(Instant::now()))
            .await?;
        {
            let addr = client.get_connection_info().addr().clone();
            let mut last = self.server.lock().unwrap_or_else(|p| p.into_inner());
            if last.as_ref().is_some_and(|l| *l != addr) {
                // Another machine, another clock: its TIME is read before the first command.
                self.skew.forget();
            }
            *last = Some(addr);
        }
        let mut left = until
            .saturating_duration_since(Instant::now())
            .min(self.connect_timeout);
        let tls = match client.get_connection_info().addr() {
            redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
            _ => None,
        };
        // A TLS connection keeps time to ask the address in plaintext if it times out.
        let probe = if tls.is_some() {
            (left / 4).min(PROBE)
        } else {
            Duration::ZERO
        };
        left -= probe;
        let dead = Arc::new(AtomicBool::new(false));
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(Some(self.response_timeout))
            .set_push_sender(Watch(Arc::clone(&dead)));
        let connect = client.get_multiplexed_async_connection_with_config(&config);
        let conn = match tokio::time::timeout(left, connect).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                // A refused certificate, a plaintext server, refused credentials: not retried
                // within the call (the same connection would fail again).
                if let Some(refused) = refused(&e) {
                    return Err(refused);
                }
                // Nothing was sent on a connection that could not be made.
                let io = e.is_io_error() || e.is_connection_refusal() || e.is_timeout();
                return Err(map_err(e).retryable(io));
            }
            Err(_) => {
                if let Some((host, port)) = tls
                    && answers_plaintext(&host, port, probe).await
                {
                    return Err(TlsError::NotTls.into_backend());
                }
                return Err(unavailable_within(left));
            }
        };
        if matches!(self.source, Source::Sentinel(_)) {
            // The sentinels' word may be stale (a failover under way): only a master takes
            // the scripts' writes, so this connection is checked before anything is sent on
            // it. A read, so its failure is retryable.
            let mut conn = conn.clone();
            let left = until.saturating_duration_since(Instant::now());
            let role = redis::cmd("ROLE");
            match tokio::time::timeout(left, role.query_async::<redis::Role>(&mut conn)).await {
                Ok(Ok(redis::Role::Primary { .. })) => {}
                Ok(Ok(other)) => {
                    return Err(BackendError::new(
                        BackendErrorKind::Unavailable,
                        format!("the server the sentinels named is not a master: {other:?}"),
                    )
                    .retryable(true));
                }
                Ok(Err(e)) => return Err(map_err(e).retryable(true)),
                Err(_) => return Err(unavailable_within(left)),
            }
        }
        if !self.skew.is_observed() {
            // No reading of the server's clock yet (the backend was created while the server
            // was down): read it before the first command, whose deadline depends on it. A
            // read changes nothing, so its failure is retryable too.
            let mut conn = conn.clone();
            let left = until.saturating_duration_since(Instant::now());
            let cmd = redis::cmd("TIME");
            let sent = host_micros();
            match tokio::time::timeout(left, cmd.query_async::<(i64, i64)>(&mut conn)).await {
                Ok(Ok((seconds, micros))) => {
                    self.observe(seconds, micros, host_micros().max(sent));
                }
                Ok(Err(e)) => return Err(map_err(e).retryable(true)),
                Err(_) => return Err(unavailable_within(left)),
            }
        }
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
        // The scripts compare it with the server's TIME in µs, exactly while both are below
        // 2^53 (the year 2255): a later deadline changes no answer, and capped it stays exact.
        self.skew.on_server(deadline).min((1 << 53) - 1).to_string()
    }
}
