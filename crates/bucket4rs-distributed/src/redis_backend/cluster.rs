//! The Redis Cluster connection of a `RedisBackend`: the redis crate's async cluster
//! connection, configured so that a command that may have run is never sent twice.
//!
//! What the crate retries on its own (redis 1.8, `cluster_async` `request::choose_response`),
//! all under one retry count (`ClusterClientBuilder::retries`, 16 by default): a `MOVED` or
//! `ASK` redirection, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING` and `READONLY` (the
//! node refused the command: safe to send again), a missing connection (nothing sent) — and
//! also an I/O error, a dropped connection and a response timeout, after which the command
//! may have run. The count cannot be set per kind of error, so the backend builds its client
//! with zero retries: the crate sends each command once and hands every error back. What the
//! crate still guarantees and does by itself, none of which sends a command twice: routing by
//! the slot of the key (the backend names it, `SpecificNode` of the key's slot on its master),
//! refreshing its slot map after a `MOVED` (commands sent meanwhile wait for the refresh),
//! reconnecting a node whose connection ended (the RESP3 disconnection push) or failed, and
//! reconnecting through the seed nodes when no connection is left. What it does not
//! guarantee: telling whether a command whose connection failed was written to the socket, so
//! an I/O error after a send is in doubt here ([`sent_err`](super::sent_err)), never re-sent.
//!
//! The backend follows the redirections itself, within the caller's deadline: after `MOVED`
//! it sends the command again by slot (the crate's refreshed map names the new master), after
//! `ASK` it sends `ASKING` and the command together to the node named (the slot is being
//! migrated there). A node answers both without running the command. `NOSCRIPT` is the
//! caller's (`RedisBackend::eval`): the script is sent again with `EVAL` to the same slot, so
//! each node's script cache is filled as it is needed.
//!
//! Each node has its own clock: the estimate that turns a caller's deadline into a reading of
//! the server's `TIME` is kept per slot (a slot is served by one master at a time), and the
//! first command of a slot with a deadline reads that master's `TIME` first, as the
//! single-node pool does after connecting.

use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;
use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use super::conn::{PROBE, answers_plaintext};
use super::{Replicas, Reply, map_err, split, with_wait};
use crate::error::{BackendError, BackendErrorKind};
use crate::skew::{ClockOffset, host_micros};
use crate::tls::TlsError;

/// Redirections followed for one command before its error is handed back (each costs a
/// round trip; a slot moves at most once or twice while a command is in flight).
const MAX_REDIRECTS: usize = 8;

/// The first wait of the background connector after a failed attempt; doubles up to
/// [`MAX_BACKOFF`] (as the single-node pool).
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How to name the cause of a refused TLS connection to the cluster: the crate reports its
/// failed first connection as text only ("Failed to create initial connections" and a
/// message), so the backend makes a connection of its own to a seed with the same TLS
/// configuration ([`crate::tls::refusal`]) and reports what rustls says as a [`TlsError`],
/// as the single-node connection does.
pub(super) struct TlsProbe {
    /// The seeds' host names and ports, as connected to (and verified against).
    pub(super) seeds: Vec<(String, u16)>,
    /// The roots and client certificate the crate's connections use.
    pub(super) config: Arc<rustls::ClientConfig>,
}

impl TlsProbe {
    /// The cause of a refused TLS connection, found within `budget`: the first seed whose
    /// handshake (or plaintext answer) gives a verdict.
    async fn refusal(&self, budget: Duration) -> Option<TlsError> {
        let until = Instant::now() + budget;
        for (host, port) in &self.seeds {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let config = Arc::clone(&self.config);
            if let Some(e) = crate::tls::refusal(config, host, *port, left / 2).await {
                return Some(e);
            }
            let left = until.saturating_duration_since(Instant::now());
            // A plaintext Redis mostly waits for the rest of the hello: asked in plaintext.
            if answers_plaintext(host, *port, left).await {
                return Some(TlsError::NotTls);
            }
        }
        None
    }
}

pub(super) struct Cluster {
    client: ClusterClient,
    tls: Option<TlsProbe>,
    conn: tokio::sync::Mutex<Option<ClusterConnection>>,
    connect_timeout: Duration,
    response_timeout: Duration,
    clocks: DashMap<Slot, Arc<ClockOffset>>,
}

fn unavailable(why: String) -> BackendError {
    BackendError::new(BackendErrorKind::Unavailable, why).retryable(true)
}

/// Where the next attempt of a command goes.
enum Target {
    /// The master of the key's slot, as the crate's slot map says.
    Slot,
    /// `ASKING` and the command to the node at this address.
    Ask(String, u16),
}

impl Cluster {
    /// A cluster connection that connects on [`start`](Self::start) or the first command;
    /// `client` must have been built with zero retries (the constructors do).
    pub(super) fn new(
        client: ClusterClient,
        tls: Option<TlsProbe>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            client,
            tls,
            conn: tokio::sync::Mutex::new(None),
            connect_timeout,
            response_timeout,
            clocks: DashMap::new(),
        }
    }

    /// Connects in the background on the current tokio runtime (none: the first command
    /// connects), retrying with a backoff until the cluster answers, so that a backend can be
    /// created while the cluster is down. Ends when connected or when the backend is dropped.
    pub(super) fn start(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let cluster = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut wait = FIRST_BACKOFF;
            loop {
                let Some(cluster) = cluster.upgrade() else {
                    return;
                };
                let until = Instant::now() + cluster.connect_timeout;
                if cluster.live(until).await.is_ok() {
                    return;
                }
                drop(cluster);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
        });
    }

    pub(super) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub(super) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// The cluster connection, made now if there is none yet (the crate keeps it connected
    /// from then on). Fails, retryably (nothing was sent), when it cannot be made before
    /// `until`.
    async fn live(&self, until: Instant) -> Result<ClusterConnection, BackendError> {
        let left = until.saturating_duration_since(Instant::now());
        let Ok(mut current) = tokio::time::timeout(left, self.conn.lock()).await else {
            return Err(unavailable(format!(
                "no connection to the Redis Cluster could be made within {left:?}"
            )));
        };
        if let Some(conn) = current.as_ref() {
            return Ok(conn.clone());
        }
        let mut left = until
            .saturating_duration_since(Instant::now())
            .min(self.connect_timeout);
        // Time kept to name the cause of a refused TLS connection.
        let probe = match &self.tls {
            Some(_) => (left / 4).min(PROBE),
            None => Duration::ZERO,
        };
        left -= probe;
        let failed = match tokio::time::timeout(left, self.client.get_async_connection()).await {
            Ok(Ok(conn)) => {
                *current = Some(conn.clone());
                return Ok(conn);
            }
            // The crate reports a failed first connection as an I/O error naming the cause
            // (refused, timed out, a failed handshake or authentication) as text: nothing was
            // sent.
            Ok(Err(e)) => {
                unavailable(format!("no connection to the Redis Cluster: {e}")).with_source(e)
            }
            Err(_) => unavailable(format!(
                "no connection to the Redis Cluster could be made within {left:?}"
            )),
        };
        // A refused certificate, a plaintext server: typed, and not retried within the call
        // (the same handshake would fail again).
        if let Some(tls) = &self.tls
            && let Some(refused) = tls.refusal(probe).await
        {
            return Err(refused.into_backend());
        }
        Err(failed)
    }

    fn clock(&self, slot: Slot) -> Arc<ClockOffset> {
        if let Some(clock) = self.clocks.get(&slot) {
            return Arc::clone(clock.value());
        }
        Arc::clone(
            self.clocks
                .entry(slot)
                .or_insert_with(|| Arc::new(ClockOffset::new()))
                .value(),
        )
    }

    /// Records a reply for `key` that carried its master's `TIME` and arrived at `arrived`.
    pub(super) fn observe(&self, key: &str, seconds: i64, micros: i64, arrived: i64) {
        let server = seconds.saturating_mul(1_000_000).saturating_add(micros);
        self.clock(Slot::for_key(key)).observe(server, arrived);
    }

    /// `deadline` as a reading of the clock of `key`'s master ('' without one); its `TIME` is
    /// read first when no reply for this slot has carried it yet (a read: its failure is
    /// retryable).
    pub(super) async fn server_deadline(
        &self,
        key: &str,
        deadline: Option<Instant>,
        until: Instant,
        round_trips: &AtomicU64,
    ) -> Result<String, BackendError> {
        let Some(deadline) = deadline else {
            return Ok(String::new());
        };
        let slot = Slot::for_key(key);
        let clock = self.clock(slot);
        if !clock.is_observed() {
            let mut conn = self.live(until).await?;
            let left = until.saturating_duration_since(Instant::now());
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                Route::with_slot(slot, SlotAddr::Master),
            ));
            round_trips.fetch_add(1, Ordering::Relaxed);
            let sent = host_micros();
            match tokio::time::timeout(left, conn.route_command(redis::cmd("TIME"), route)).await {
                Ok(Ok(v)) => {
                    let (seconds, micros): (i64, i64) = redis::from_redis_value(v)
                        .map_err(|e| map_err(e.into()).retryable(true))?;
                    let server = seconds.saturating_mul(1_000_000).saturating_add(micros);
                    clock.observe(server, host_micros().max(sent));
                }
                Ok(Err(e)) => return Err(map_err(e).retryable(true)),
                Err(_) => {
                    return Err(unavailable(format!(
                        "the Redis Cluster did not answer TIME within {left:?}"
                    )));
                }
            }
        }
        // Compared with TIME in µs, exact below 2^53 (as the single-node pool).
        Ok(clock.on_server(deadline).min((1 << 53) - 1).to_string())
    }

    /// One command for `key` (with the `WAIT` of `wait` behind it, in the same round trip to
    /// the same node), sent once to its slot's master and again only where a node answered
    /// that it did not run it (`MOVED`, `ASK`), bounded by `until`; with the host's wall-clock
    /// time its reply arrived. The same contract as the single-node send: the outer error is a
    /// command that was not sent or got no reply in time, the inner one the error of a sent
    /// command.
    pub(super) async fn send(
        &self,
        cmd: &redis::Cmd,
        wait: Option<Replicas>,
        key: &str,
        until: Instant,
        round_trips: &AtomicU64,
    ) -> Result<Result<Reply, RedisError>, BackendError> {
        let mut conn = self.live(until).await?;
        let slot = Slot::for_key(key);
        let mut target = Target::Slot;
        let mut last = String::new();
        for _ in 0..=MAX_REDIRECTS {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    "the caller's deadline passed before the command was sent",
                ));
            }
            round_trips.fetch_add(1, Ordering::Relaxed);
            let attempt = async {
                let (route, asking) = match &target {
                    Target::Slot => {
                        let route = SingleNodeRoutingInfo::SpecificNode(Route::with_slot(
                            slot,
                            SlotAddr::Master,
                        ));
                        let Some(r) = wait else {
                            let v = conn
                                .route_command(cmd.clone(), RoutingInfo::SingleNode(route))
                                .await?;
                            return Ok((v, None));
                        };
                        let replies = conn
                            .route_pipeline(with_wait(false, cmd, r, left), 0, 2, route)
                            .await?;
                        return split(replies);
                    }
                    Target::Ask(host, port) => (
                        SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port: *port,
                        },
                        true,
                    ),
                };
                // `ASKING` and the command (and the WAIT) to the node named.
                let pipe = match wait {
                    Some(r) => with_wait(asking, cmd, r, left),
                    None => {
                        let mut pipe = redis::pipe();
                        pipe.cmd("ASKING").add_command(cmd.clone()).ignore_errors();
                        pipe
                    }
                };
                let count = if wait.is_some() { 2 } else { 1 };
                let mut replies = conn.route_pipeline(pipe, 1, count, route).await?;
                if wait.is_some() {
                    return split(replies);
                }
                match replies.pop() {
                    Some(Value::ServerError(e)) => Err(e.into()),
                    Some(v) => Ok((v, None)),
                    None => Err(RedisError::from((
                        ErrorKind::UnexpectedReturnType,
                        "no reply to the command after ASKING",
                    ))),
                }
            };
            let reply = tokio::time::timeout(left, attempt).await;
            let arrived = host_micros();
            let e = match reply {
                // The crate hands back a server's error reply that it does not act on as a
                // value (the single-node connection makes it an error, as here).
                Ok(Ok((Value::ServerError(e), _))) => e.into(),
                Ok(Ok((value, acked))) => {
                    return Ok(Ok(Reply {
                        value,
                        arrived,
                        acked,
                    }));
                }
                Ok(Err(e)) => e,
                Err(_) => {
                    return Err(BackendError::new(
                        BackendErrorKind::InDoubt,
                        format!(
                            "no reply from the Redis Cluster within {left:?} after the command \
                             was sent: it may have run"
                        ),
                    ));
                }
            };
            last = e.to_string();
            match e.kind() {
                // Not run: the slot has moved. The crate refreshes its slot map (commands
                // wait for the refresh), so the next attempt by slot goes to the new master.
                ErrorKind::Server(ServerErrorKind::Moved) => target = Target::Slot,
                // Not run: the slot is being migrated and the key is on the importing node.
                ErrorKind::Server(ServerErrorKind::Ask) => {
                    let Some((host, port)) = e
                        .redirect_node()
                        .and_then(|(addr, _)| addr.rsplit_once(':'))
                        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                    else {
                        return Ok(Err(e));
                    };
                    target = Target::Ask(host, port);
                }
                // No connection to the node asked for: nothing was sent.
                ErrorKind::ClusterConnectionNotFound => {
                    return Err(unavailable(format!(
                        "no connection to the Redis Cluster node for this key: {e}"
                    ))
                    .with_source(e));
                }
                _ => return Ok(Err(e)),
            }
        }
        Err(unavailable(format!(
            "the Redis Cluster redirected the command {MAX_REDIRECTS} times without running it \
             (last: {last})"
        )))
    }
}
