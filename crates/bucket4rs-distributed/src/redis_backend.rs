//! The Redis backend: one `EVALSHA` round trip per operation, atomic, exact.

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};
use core::time::Duration;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use redis::{ErrorKind, ProtocolVersion, RedisError, ServerErrorKind, Value};

use crate::backend::{Backend, BackendClock, Command, Transaction, Write};
use crate::error::{BackendError, BackendErrorKind};
use crate::key::StorageKey;
use crate::tls::TlsOptions;

mod cluster;
mod conn;
use crate::skew::host_micros;
use cluster::Cluster;
use conn::{Pool, Source};

const OP_SCRIPT: &str = include_str!("lua/op.lua");
const CAS_SCRIPT: &str = include_str!("lua/cas.lua");
/// Arguments at or above this go straight to the client-computed path.
const EXACT: u64 = 1 << 53;
/// TTLs of this many milliseconds or more are stored as no expiry (the scripts agree).
const TTL_CAP_MS: u64 = 4_000_000_000_000_000;

/// Connection settings of a [`RedisBackend`].
///
/// ```
/// use bucket4rs_distributed::RedisOptions;
/// use std::time::Duration;
/// let o = RedisOptions::default().response_timeout(Duration::from_millis(200)).connections(2);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct RedisOptions {
    response_timeout: Duration,
    connect_timeout: Duration,
    connections: usize,
    tls: Option<TlsOptions>,
    replicas: Option<Replicas>,
}

/// [`RedisOptions::wait_for_replicas`]: how many replicas must have a write, within how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Replicas {
    count: u32,
    timeout: Duration,
}

impl Default for RedisOptions {
    /// 500 ms response timeout, 1 s connect timeout, one multiplexed connection, no wait for
    /// replicas.
    fn default() -> Self {
        Self {
            response_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(1),
            connections: 1,
            tls: None,
            replicas: None,
        }
    }
}

impl RedisOptions {
    /// How long one command may wait for its reply.
    ///
    /// ```
    /// # use bucket4rs_distributed::RedisOptions; use std::time::Duration;
    /// let o = RedisOptions::default().response_timeout(Duration::from_millis(100));
    /// ```
    pub fn response_timeout(mut self, d: Duration) -> Self {
        self.response_timeout = d;
        self
    }

    /// How long one connection attempt may take.
    ///
    /// ```
    /// # use bucket4rs_distributed::RedisOptions; use std::time::Duration;
    /// let o = RedisOptions::default().connect_timeout(Duration::from_millis(100));
    /// ```
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Number of multiplexed connections used round-robin (default 1: requests of all tasks
    /// are pipelined on it).
    ///
    /// ```
    /// # use bucket4rs_distributed::RedisOptions;
    /// let o = RedisOptions::default().connections(4);
    /// ```
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n.max(1);
        self
    }

    /// The certificates of a `rediss://` connection: private CAs trusted besides the
    /// platform's roots, a client certificate for mutual TLS. Without it a `rediss://` URL
    /// trusts the platform's roots. The server's host name is always verified. Refused with a
    /// `redis://` URL (TLS asked for, plaintext configured).
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{RedisOptions, TlsOptions};
    /// let o = RedisOptions::default().tls(TlsOptions::default().ca_file("ca.pem")?);
    /// # Ok::<(), bucket4rs_distributed::TlsError>(())
    /// ```
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Grants a write only once `replicas` replicas have it (Redis' `WAIT replicas
    /// timeout`), against the over-grant of a failover: Redis replicates asynchronously, so a
    /// master that dies before its replicas have a consumption lets the promoted replica grant
    /// those tokens again.
    ///
    /// Every round trip that writes (the script's, the compare-and-set's, a settlement's, a
    /// remove's) carries a `WAIT` behind its command, in the same round trip and to the same
    /// node (on a Cluster, the master of the key's slot). When fewer than `replicas`
    /// acknowledge the write within `timeout` (rounded up to whole milliseconds, and cut to
    /// the caller's deadline), the call is not granted: it fails as
    /// [`BackendErrorKind::InDoubt`] (the master applied it; if the master survives, the
    /// manager's settlement gives it back). Round trips that cannot write (`available_tokens`,
    /// `estimate_ability_to_consume`, reads) carry no `WAIT`, and a call whose script wrote
    /// nothing is answered whatever the replicas say. Without it (the default) a write is
    /// granted once the master has it.
    ///
    /// Checked by the constructors: `replicas` must be at least 1, and `timeout` above zero
    /// and below the response timeout (the `WAIT`'s answer must arrive before the command's
    /// reply is given up on); a [`BackendErrorKind::Other`] otherwise.
    ///
    /// ```
    /// # use bucket4rs_distributed::RedisOptions; use std::time::Duration;
    /// let o = RedisOptions::default().wait_for_replicas(1, Duration::from_millis(50));
    /// ```
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some(Replicas {
            count: replicas,
            timeout,
        });
        self
    }
}

/// Counters of a [`RedisBackend`] (for tests, benchmarks and monitoring).
///
/// ```
/// let s = bucket4rs_distributed::RedisStats::default();
/// assert_eq!(s.round_trips, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Commands sent (each one network round trip).
    pub round_trips: u64,
    /// Operations completed by the Lua fast path.
    pub fast_path: u64,
    /// Operations computed by the client and compare-and-set (extreme values, replacement).
    pub exact_path: u64,
    /// Lost compare-and-set races (retried by the manager).
    pub conflicts: u64,
    /// Scripts reloaded after `NOSCRIPT` (e.g. after `SCRIPT FLUSH` or a restart).
    pub script_reloads: u64,
}

#[derive(Default)]
struct Counters {
    round_trips: AtomicU64,
    fast_path: AtomicU64,
    exact_path: AtomicU64,
    conflicts: AtomicU64,
    script_reloads: AtomicU64,
}

struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

/// Buckets in Redis.
///
/// Each operation is one `EVALSHA` of a Lua script that reads the record, validates it as the
/// client's decoder would, computes the operation exactly with integers kept below 2^53,
/// writes the new record with its TTL (none when a recreated record could answer differently)
/// and returns the record it read; the client recomputes the result with the Rust core from
/// that pre-image and checks the script wrote the same bytes. When exactness cannot be
/// guaranteed in doubles (huge capacities, long gaps), for a record the script does not
/// validate, or for configuration replacement, the script returns the record unchanged and the
/// client computes with the core and writes with a compare-and-set script (bounded retries).
/// Both scripts refuse to run past the caller's deadline (converted to the server's clock), so
/// a call that timed out changes nothing later. An ended connection is replaced before the next
/// command; a refused connection fails at once. `NOSCRIPT` is handled by sending the script
/// again with `EVAL`. See `docs/distributed.md`.
///
/// ```no_run
/// use bucket4rs_core::{Bandwidth, BucketConfiguration};
/// use bucket4rs_distributed::{ProxyManager, RedisBackend, RedisOptions};
/// use std::time::Duration;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
/// let manager = ProxyManager::configure(backend).key_prefix("api").build()?;
/// let config = BucketConfiguration::builder()
///     .add_bandwidth(Bandwidth::simple(100, Duration::from_secs(60))?)
///     .build()?;
/// let bucket = manager.builder().build("tenant-1", move || config.clone())?;
/// if !bucket.try_consume(1).await? {
///     // reply 429
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    conn: Conn,
    op: Arc<Script>,
    cas: Arc<Script>,
    counters: Arc<Counters>,
    /// [`RedisOptions::wait_for_replicas`].
    replicas: Option<Replicas>,
}

/// What a backend sends its commands on: one server's connections, or a cluster's. Everything
/// above [`RedisBackend::send`] (the scripts, their arguments, `NOSCRIPT`, the replies, the
/// records) is the same for both.
#[derive(Clone)]
enum Conn {
    Node(Arc<Pool>),
    Cluster(Arc<Cluster>),
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedisBackend");
        match &self.conn {
            Conn::Node(pool) => d.field("connections", &pool.len()),
            Conn::Cluster(_) => d.field("cluster", &true),
        };
        d.field("stats", &self.stats()).finish()
    }
}

fn map_err(e: RedisError) -> BackendError {
    // Replies of a server that refused to run the command at all: busy with a long script,
    // still loading its data after a restart, a replica without its primary, a slot being
    // moved (TRYAGAIN), a cluster that has lost a slot's master (CLUSTERDOWN), a replica,
    // which writes nothing a client sends (READONLY: a master demoted by a failover).
    let refused = matches!(
        e.code(),
        Some("BUSY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY")
    );
    let kind = if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if refused || e.is_connection_refusal() || e.is_io_error() || e.is_connection_dropped() {
        BackendErrorKind::Unavailable
    } else if e.code() == Some("WRONGTYPE") {
        BackendErrorKind::WrongType
    } else if e.code() == Some("OOM") {
        // maxmemory reached with a no-eviction policy: the script's first write was refused,
        // nothing was written.
        BackendErrorKind::CapacityExhausted
    } else if matches!(
        e.kind(),
        ErrorKind::UnexpectedReturnType
            | ErrorKind::Parse
            | ErrorKind::Extension
            | ErrorKind::Server(ServerErrorKind::ResponseError)
    ) {
        BackendErrorKind::Protocol
    } else {
        BackendErrorKind::Other
    };
    // Only a refused connection or a refused command certainly did not run.
    let retryable = refused || e.is_connection_refusal();
    BackendError::new(kind, e.to_string())
        .retryable(retryable)
        .with_source(e)
}

/// Refuses options under which every call would fail (a zero response or connect timeout),
/// or every write (a wait for no replica, or for longer than a reply is waited for).
fn check_options(options: &RedisOptions) -> Result<(), BackendError> {
    let refused = |why: &str| Err(BackendError::new(BackendErrorKind::Other, why));
    if options.response_timeout.is_zero() || options.connect_timeout.is_zero() {
        return refused("RedisOptions: the response and connect timeouts must be above zero");
    }
    if let Some(r) = options.replicas {
        if r.count == 0 {
            return refused("RedisOptions::wait_for_replicas: at least one replica");
        }
        if r.timeout.is_zero() {
            // `WAIT n 0` blocks until the replicas answer, however long.
            return refused("RedisOptions::wait_for_replicas: the timeout must be above zero");
        }
        if r.timeout >= options.response_timeout {
            return refused(
                "RedisOptions::wait_for_replicas: the timeout must be below the response \
                 timeout (the WAIT's answer must arrive before the reply is given up on)",
            );
        }
    }
    Ok(())
}

/// [`RedisOptions::tls`] with a plaintext address.
fn plaintext_with_tls() -> BackendError {
    BackendError::new(
        BackendErrorKind::Other,
        "RedisOptions::tls needs a TLS address (a rediss:// URL): refused rather than \
         connecting without TLS",
    )
}

/// `client` speaking RESP3, whose connections report their end (`conn`).
fn resp3(client: redis::Client) -> Result<redis::Client, BackendError> {
    let info = client.get_connection_info().clone();
    let redis = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(redis)).map_err(map_err)
}

/// An error of a command that was sent: the server's own error reply (it answered, so
/// [`map_err`] says what it means), or no reply at all (the connection ended or broke, the
/// reply did not arrive in time), after which the command may have run: in doubt.
fn sent_err(e: RedisError) -> BackendError {
    if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
        BackendError::new(
            BackendErrorKind::InDoubt,
            format!("no reply from Redis after the command was sent ({e}): it may have run"),
        )
        .with_source(e)
    } else {
        map_err(e)
    }
}

/// A reply to one round trip: the command's value, when it arrived ([`host_micros`]), and
/// what the `WAIT` sent behind it answered (`None`: none was sent): how many replicas
/// acknowledged the connection's writes, or the `WAIT`'s own error.
struct Reply {
    value: Value,
    arrived: i64,
    acked: Option<Result<i64, String>>,
}

/// `cmd` (after `ASKING` if `asking`) with the `WAIT` of `replicas` behind it, as one
/// pipeline whose replies all come back, errors as values ([`split`]). The `WAIT`'s timeout
/// is cut to `left`, the time to the caller's deadline, in whole milliseconds and at least
/// one (`WAIT n 0` blocks until the replicas answer, however long).
fn with_wait(
    asking: bool,
    cmd: &redis::Cmd,
    replicas: Replicas,
    left: Duration,
) -> redis::Pipeline {
    let ms = replicas
        .timeout
        .min(left)
        .as_nanos()
        .div_ceil(1_000_000)
        .max(1);
    let mut pipe = redis::pipe();
    if asking {
        pipe.cmd("ASKING");
    }
    pipe.add_command(cmd.clone())
        .cmd("WAIT")
        .arg(replicas.count)
        .arg(u64::try_from(ms).unwrap_or(u64::MAX))
        .ignore_errors();
    pipe
}

/// The replies of a command and of the `WAIT` behind it ([`with_wait`], without `ASKING`'s):
/// the command's value, or its error as an error (as for a command sent alone).
fn split(replies: Vec<Value>) -> Result<(Value, Option<Result<i64, String>>), RedisError> {
    let mut replies = replies.into_iter();
    let value = match replies.next() {
        Some(Value::ServerError(e)) => return Err(e.into()),
        Some(v) => v,
        None => {
            return Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "no reply to the command before WAIT",
            )));
        }
    };
    let acked = match replies.next() {
        Some(Value::Int(n)) => Ok(n),
        Some(Value::ServerError(e)) => Err(RedisError::from(e).to_string()),
        other => Err(format!("unexpected reply to WAIT: {other:?}")),
    };
    Ok((value, Some(acked)))
}

/// A reply to one of the scripts that this library cannot read: the script ran, so what it
/// did is not known.
fn garbled(what: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::InDoubt,
        format!("unreadable reply from the bucket script ({what}): it may have written"),
    )
}

/// The scripts' answer to a command that reached the server after its caller's deadline.
fn too_late() -> BackendError {
    BackendError::new(
        BackendErrorKind::Timeout,
        "the command reached Redis after the caller's deadline and was not run",
    )
}

fn protocol(what: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Protocol,
        format!("unexpected reply: {what}"),
    )
}

fn int(v: Option<&Value>) -> Result<i64, BackendError> {
    match v {
        Some(Value::Int(i)) => Ok(*i),
        _ => Err(protocol("expected an integer")),
    }
}

fn bytes(v: Option<&Value>) -> Result<Option<&[u8]>, BackendError> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::BulkString(b)) => Ok(Some(b)),
        _ => Err(protocol("expected a bulk string")),
    }
}

fn ttl_ms(ttl: Option<Duration>) -> String {
    match ttl {
        None => String::new(),
        Some(t) => {
            let ms = t.as_nanos().div_ceil(1_000_000).max(1);
            // Beyond ~126 000 years: keep forever rather than overflow Redis' limit.
            if ms >= TTL_CAP_MS as u128 {
                String::new()
            } else {
                ms.to_string()
            }
        }
    }
}

impl RedisBackend {
    /// A backend for the Redis at `url` (`redis://[user:password@]host:port/db`) with
    /// `options`.
    ///
    /// Creating it never waits for the server and never fails because the server is down:
    /// it connects in the background (on the current tokio runtime), and until Redis answers
    /// every call fails at once with a retryable [`BackendErrorKind::Unavailable`] (nothing
    /// was sent), which the manager's retries, its circuit breaker and a
    /// failure policy (`bucket4rs-tower`'s `FailurePolicy`) handle as any outage. So an application starts
    /// while its store is down and serves per its failure policy until the store answers.
    ///
    /// # Errors
    /// [`BackendErrorKind::Other`] for a URL the `redis` crate does not read, and for a zero
    /// response or connect timeout (every call would fail).
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{RedisBackend, RedisOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, BackendError> {
        let client = redis::Client::open(url).map_err(map_err)?;
        Self::with_client(client, options)
    }

    /// `client` with the certificates of `tls` (its address must be a TLS one).
    fn with_certificates(
        client: redis::Client,
        tls: &TlsOptions,
    ) -> Result<redis::Client, BackendError> {
        let info = client.get_connection_info().clone();
        if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            return Err(plaintext_with_tls());
        }
        redis::Client::build_with_tls(info, tls.redis_certificates()).map_err(map_err)
    }

    /// A backend on a `redis` [`Client`](redis::Client) of the application's own, with its
    /// address, credentials, database, TCP and TLS settings; otherwise as
    /// [`connect`](Self::connect) (it connects in the background when called on a tokio
    /// runtime, else on the first call). The backend makes its own connections from the
    /// client, speaking RESP3 (Redis 6 or newer) whatever the client's protocol: it must know
    /// when a connection has ended to replace it before the next command, which is why it
    /// takes a client rather than a connection.
    ///
    /// # Errors
    /// [`BackendErrorKind::Other`] for a zero response or connect timeout.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{RedisBackend, RedisOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://app:secret@cache.internal:6379/2")?;
    /// let backend = RedisBackend::with_client(client.clone(), RedisOptions::default())?;
    /// # Ok(()) }
    /// ```
    pub fn with_client(client: redis::Client, options: RedisOptions) -> Result<Self, BackendError> {
        check_options(&options)?;
        let client = match &options.tls {
            Some(tls) => Self::with_certificates(client, tls)?,
            None => client,
        };
        if matches!(
            client.get_connection_info().addr(),
            redis::ConnectionAddr::TcpTls { .. }
        ) {
            crate::tls::install_provider();
        }
        let pool = Arc::new(Pool::new(
            Source::Client(resp3(client)?),
            options.connections,
            options.connect_timeout,
            options.response_timeout,
        ));
        pool.start();
        Ok(Self::on(Conn::Node(pool), options.replicas))
    }

    /// A backend for the Redis Cluster whose nodes include `seeds` (`redis://host:port` or
    /// `rediss://host:port` URLs, any of the cluster's nodes: the rest are found through
    /// them) with `options`.
    ///
    /// Each operation is the same one `EVALSHA` as on a single node, sent to the master of its
    /// key's slot; a bucket lives on one master, and the buckets of many keys spread over all
    /// of them. `MOVED` and `ASK` (a slot that moved, or is moving, to another master) are
    /// followed within the caller's deadline, a node's script cache is filled by `EVAL` when
    /// it answers `NOSCRIPT`, and a command that was sent is never sent again (an I/O error or
    /// a missing reply after the send is [`BackendErrorKind::InDoubt`], as on a single node).
    /// The cluster's connections are the `redis` crate's (one multiplexed connection per
    /// node): [`RedisOptions::connections`] does not apply.
    ///
    /// As [`connect`](Self::connect), creating it never waits for the cluster: it connects in
    /// the background, and until a seed answers every call fails at once with a retryable
    /// [`BackendErrorKind::Unavailable`]. With [`RedisOptions::tls`] every seed must be a
    /// `rediss://` URL. A refused TLS handshake is reported as on a single node: a
    /// non-retryable `Unavailable` whose source is a [`TlsError`](crate::TlsError) (the
    /// backend asks a seed itself, with the same TLS configuration, why the cluster's
    /// connection failed).
    ///
    /// # Errors
    /// [`BackendErrorKind::Other`] for no seed, a URL the `redis` crate does not read, seeds
    /// that disagree (credentials, TLS), a `redis://` seed with [`RedisOptions::tls`], and for
    /// a zero response or connect timeout.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{RedisBackend, RedisOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let seeds = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"];
    /// let backend = RedisBackend::connect_cluster(seeds, RedisOptions::default()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_cluster<I>(seeds: I, options: RedisOptions) -> Result<Self, BackendError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut infos = Vec::new();
        // The seeds connected to over TLS, their certificates verified: where a refused
        // handshake is asked for its cause.
        let mut verified = Vec::new();
        for seed in seeds {
            let info =
                redis::IntoConnectionInfo::into_connection_info(seed.as_ref()).map_err(map_err)?;
            match info.addr() {
                redis::ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: false,
                    ..
                } => verified.push((host.clone(), *port)),
                redis::ConnectionAddr::TcpTls { .. } => {}
                _ if options.tls.is_some() => return Err(plaintext_with_tls()),
                _ => {}
            }
            infos.push(info);
        }
        if infos.is_empty() {
            return Err(BackendError::new(
                BackendErrorKind::Other,
                "RedisBackend::connect_cluster needs at least one seed URL",
            ));
        }
        // Every seed on verified TLS: its configuration is the one the crate builds from
        // `RedisOptions::tls` (or the platform's roots).
        let tls = if verified.len() == infos.len() {
            let config = options
                .tls
                .clone()
                .unwrap_or_default()
                .client_config(crate::tls::Verify::Full)
                .map_err(|e| BackendError::new(BackendErrorKind::Other, e.to_string()))?;
            Some(cluster::TlsProbe {
                seeds: verified,
                config: Arc::new(config),
            })
        } else {
            None
        };
        Self::cluster(
            redis::cluster::ClusterClientBuilder::new(infos),
            options,
            tls,
        )
    }

    /// A backend on a Redis Cluster client builder of the application's own, with its seed
    /// nodes, credentials, TLS, TCP and read-routing settings; otherwise as
    /// [`connect_cluster`](Self::connect_cluster).
    ///
    /// It takes the builder rather than a built [`ClusterClient`](redis::cluster::ClusterClient)
    /// because it must set what a built client cannot change: zero retries (the crate's
    /// retries would send a command again after an I/O error or a timeout, when it may have
    /// run; the backend follows `MOVED` and `ASK` itself), RESP3 (a node's connection reports
    /// its end, to be replaced before the next command), and the timeouts and certificates of
    /// `options`, which replace the builder's. It does not know the builder's seeds, so a
    /// refused TLS handshake is a retryable `Unavailable` naming the cause in its message
    /// only (not a typed [`TlsError`](crate::TlsError) as from
    /// [`connect_cluster`](Self::connect_cluster)).
    ///
    /// # Errors
    /// [`BackendErrorKind::Other`] for a builder the `redis` crate refuses (no seed, seeds
    /// that disagree, unreadable certificates) and for a zero response or connect timeout.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{RedisBackend, RedisOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let builder = redis::cluster::ClusterClientBuilder::new(["redis://10.0.0.1:6379"])
    ///     .username("app")
    ///     .password("secret");
    /// let backend = RedisBackend::with_cluster_builder(builder, RedisOptions::default())?;
    /// # Ok(()) }
    /// ```
    pub fn with_cluster_builder(
        builder: redis::cluster::ClusterClientBuilder,
        options: RedisOptions,
    ) -> Result<Self, BackendError> {
        Self::cluster(builder, options, None)
    }

    /// [`with_cluster_builder`](Self::with_cluster_builder), naming the cause of a refused
    /// TLS connection through `tls` if given.
    fn cluster(
        builder: redis::cluster::ClusterClientBuilder,
        options: RedisOptions,
        tls: Option<cluster::TlsProbe>,
    ) -> Result<Self, BackendError> {
        check_options(&options)?;
        let mut builder = builder
            .retries(0)
            .use_protocol(ProtocolVersion::RESP3)
            .connection_timeout(options.connect_timeout)
            .response_timeout(options.response_timeout)
            // Each call is bounded by its caller's deadline instead.
            .overall_response_timeout(None);
        if let Some(tls) = &options.tls {
            builder = builder.certs(tls.redis_certificates());
        }
        // The rustls provider the crate's TLS connections (rediss:// seeds) are built with.
        crate::tls::install_provider();
        let client = builder.build().map_err(map_err)?;
        let cluster = Arc::new(Cluster::new(
            client,
            tls,
            options.connect_timeout,
            options.response_timeout,
        ));
        cluster.start();
        Ok(Self::on(Conn::Cluster(cluster), options.replicas))
    }

    /// A backend for the master of the service `master` that the Redis Sentinels at
    /// `sentinels` monitor, with `options`; otherwise as [`connect`](Self::connect).
    ///
    /// `sentinels` are `redis://[user:password@]host:26379` URLs with the sentinels' own
    /// credentials if they have any (`requirepass` on the sentinels), or `rediss://` URLs for
    /// sentinels on TLS; all of them alike. `master` is the service's name, or a URL naming
    /// it with how its master (and replicas) are reached: `redis://[user:password@]NAME[/db]`
    /// for a master with a password (`requirepass`) or an ACL user, `rediss://…` for a master
    /// on TLS (the port, if any, is not used: the sentinels name the address). With
    /// [`RedisOptions::tls`] the certificates (private CAs, a client certificate) apply to
    /// whichever of the sentinels and the master are on TLS; one of them must be.
    ///
    /// Each new connection asks the sentinels for the current master and checks with `ROLE`
    /// that it is one before anything is sent on it. After a failover the old master's
    /// connections end, or it answers as a replica (`READONLY`, a refused command: retryable,
    /// nothing was written), so the next call connects to the promoted replica, without a
    /// restart. Until the sentinels name a master that answers, calls fail at once with a
    /// retryable [`BackendErrorKind::Unavailable`]; a refused TLS handshake (with the
    /// sentinels or the master) or refused credentials are a non-retryable `Unavailable`
    /// instead (the first with a [`TlsError`](crate::TlsError) as its source). Replication
    /// is asynchronous: writes the old master acknowledged and did not pass on before it
    /// failed are lost, so its buckets may grant again what they had granted, unless
    /// [`RedisOptions::wait_for_replicas`] (see `docs/distributed.md`).
    ///
    /// # Errors
    /// [`BackendErrorKind::Other`] for no sentinel, a URL the `redis` crate does not read,
    /// sentinels' URLs that disagree (credentials, TLS), [`RedisOptions::tls`] with neither
    /// the sentinels nor the master on TLS, and options every call would fail with.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{RedisBackend, RedisOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let sentinels = ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"];
    /// let backend = RedisBackend::connect_sentinel(sentinels, "limits", RedisOptions::default()).await?;
    /// // Sentinels with a password of their own; a master with an ACL user, on TLS.
    /// let sentinels = ["rediss://:sentinel-secret@10.0.0.1:26379"];
    /// let backend =
    ///     RedisBackend::connect_sentinel(sentinels, "rediss://app:secret@limits", RedisOptions::default())
    ///         .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_sentinel<I>(
        sentinels: I,
        master: &str,
        options: RedisOptions,
    ) -> Result<Self, BackendError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let refuse = |why: &str| {
            Err(BackendError::new(
                BackendErrorKind::Other,
                format!("RedisBackend::connect_sentinel: {why}"),
            ))
        };
        let mut addrs = Vec::new();
        // The sentinels' (TLS, user, password), which must agree.
        let mut common: Option<(bool, Option<String>, Option<String>)> = None;
        for url in sentinels {
            let info =
                redis::IntoConnectionInfo::into_connection_info(url.as_ref()).map_err(map_err)?;
            let settings = info.redis_settings();
            let these = (
                matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }),
                settings.username().map(str::to_owned),
                settings.password().map(str::to_owned),
            );
            if common.as_ref().is_some_and(|c| *c != these) {
                return refuse("the sentinels' URLs disagree on TLS or credentials");
            }
            common = Some(these);
            addrs.push(info.addr().clone());
        }
        let Some((sentinels_tls, user, password)) = common else {
            return refuse("at least one sentinel URL is needed");
        };
        let (service, node) = if master.contains("://") {
            let info = redis::IntoConnectionInfo::into_connection_info(master).map_err(map_err)?;
            let (name, tls) = match info.addr() {
                redis::ConnectionAddr::Tcp(host, _) => (host.clone(), None),
                redis::ConnectionAddr::TcpTls { host, insecure, .. } => (
                    host.clone(),
                    Some(if *insecure {
                        redis::TlsMode::Insecure
                    } else {
                        redis::TlsMode::Secure
                    }),
                ),
                _ => return refuse("the master's URL must be redis:// or rediss://"),
            };
            (name, Some((info.redis_settings().clone(), tls)))
        } else {
            (master.to_owned(), None)
        };
        let mut builder = redis::sentinel::SentinelClientBuilder::new(
            addrs,
            service,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(map_err)?;
        if let Some(user) = user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        let mut master_tls = false;
        if let Some((settings, tls)) = node {
            if let Some(user) = settings.username() {
                builder = builder.set_client_to_redis_username(user);
            }
            if let Some(password) = settings.password() {
                builder = builder.set_client_to_redis_password(password);
            }
            builder = builder.set_client_to_redis_db(settings.db());
            if let Some(mode) = tls {
                builder = builder.set_client_to_redis_tls_mode(mode);
                master_tls = true;
            }
        }
        if let Some(tls) = &options.tls {
            if !sentinels_tls && !master_tls {
                return Err(plaintext_with_tls());
            }
            if sentinels_tls {
                builder = builder.set_client_to_sentinel_certificates(tls.redis_certificates());
            }
            if master_tls {
                builder = builder.set_client_to_redis_certificates(tls.redis_certificates());
            }
        }
        Self::sentinel(builder, options)
    }

    /// A backend on a Redis Sentinel client builder of the application's own (the sentinels,
    /// the service, their credentials and TLS, and the master's credentials, database and
    /// TLS, certificates included); otherwise as [`connect_sentinel`](Self::connect_sentinel).
    ///
    /// The backend makes its connections to the master from the client it builds, speaking
    /// RESP3 whatever the builder says (a connection must report its end to be replaced before
    /// the next command), and checks each with `ROLE` (a builder for a replica only gets
    /// retryable refusals). Certificates are the builder's
    /// (`set_client_to_redis_certificates`, `set_client_to_sentinel_certificates`).
    ///
    /// # Errors
    /// [`BackendErrorKind::Other`] for a builder the `redis` crate refuses, for
    /// [`RedisOptions::tls`] (give the certificates to the builder) and for options every call
    /// would fail with.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{RedisBackend, RedisOptions};
    /// use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let sentinels = [redis::ConnectionAddr::Tcp("10.0.0.1".into(), 26379)];
    /// let builder = SentinelClientBuilder::new(sentinels, "limits", SentinelServerType::Master)?
    ///     .set_client_to_sentinel_password("sentinel-secret")
    ///     .set_client_to_redis_username("app")
    ///     .set_client_to_redis_password("secret");
    /// let backend = RedisBackend::with_sentinel_builder(builder, RedisOptions::default())?;
    /// # Ok(()) }
    /// ```
    pub fn with_sentinel_builder(
        builder: redis::sentinel::SentinelClientBuilder,
        options: RedisOptions,
    ) -> Result<Self, BackendError> {
        if options.tls.is_some() {
            return Err(BackendError::new(
                BackendErrorKind::Other,
                "RedisBackend::with_sentinel_builder: RedisOptions::tls is refused here; give \
                 the certificates to the builder (set_client_to_redis_certificates, \
                 set_client_to_sentinel_certificates)",
            ));
        }
        Self::sentinel(builder, options)
    }

    fn sentinel(
        builder: redis::sentinel::SentinelClientBuilder,
        options: RedisOptions,
    ) -> Result<Self, BackendError> {
        check_options(&options)?;
        let client = builder
            .set_client_to_redis_protocol(ProtocolVersion::RESP3)
            .build()
            .map_err(map_err)?;
        // The rustls provider the crate's TLS connections (sentinels, master) are built with.
        crate::tls::install_provider();
        let pool = Arc::new(Pool::new(
            Source::Sentinel(tokio::sync::Mutex::new(client)),
            options.connections,
            options.connect_timeout,
            options.response_timeout,
        ));
        pool.start();
        Ok(Self::on(Conn::Node(pool), options.replicas))
    }

    fn on(conn: Conn, replicas: Option<Replicas>) -> Self {
        Self {
            conn,
            op: Arc::new(Script::new(OP_SCRIPT)),
            cas: Arc::new(Script::new(CAS_SCRIPT)),
            counters: Arc::new(Counters::default()),
            replicas,
        }
    }

    /// A snapshot of the counters.
    ///
    /// ```no_run
    /// # use bucket4rs_distributed::{RedisBackend, RedisOptions};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # let backend = RedisBackend::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
    /// println!("{:?}", backend.stats());
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> RedisStats {
        let c = &self.counters;
        RedisStats {
            round_trips: c.round_trips.load(Ordering::Relaxed),
            fast_path: c.fast_path.load(Ordering::Relaxed),
            exact_path: c.exact_path.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            script_reloads: c.script_reloads.load(Ordering::Relaxed),
        }
    }

    /// When a call without a caller's deadline (`read`, `remove`, a transaction built outside
    /// a manager) gives up: one connect and one response timeout from now.
    fn default_until(&self) -> Instant {
        let (connect, response) = match &self.conn {
            Conn::Node(pool) => (pool.connect_timeout(), pool.response_timeout()),
            Conn::Cluster(c) => (c.connect_timeout(), c.response_timeout()),
        };
        Instant::now() + connect + response
    }

    /// `deadline` as a reading of the clock of the server that holds `key` ('' without one).
    async fn server_deadline(
        &self,
        key: &StorageKey,
        deadline: Option<Instant>,
        until: Instant,
    ) -> Result<String, BackendError> {
        match &self.conn {
            Conn::Node(pool) => Ok(pool.server_deadline(deadline)),
            Conn::Cluster(c) => {
                c.server_deadline(key.as_str(), deadline, until, &self.counters.round_trips)
                    .await
            }
        }
    }

    /// Records a reply for `key` that carried its server's `TIME`.
    fn observe(&self, key: &StorageKey, seconds: i64, micros: i64, arrived: i64) {
        match &self.conn {
            Conn::Node(pool) => pool.observe(seconds, micros, arrived),
            Conn::Cluster(c) => c.observe(key.as_str(), seconds, micros, arrived),
        }
    }

    /// One command on a live connection (a fresh one when the last has ended), bounded by
    /// `until`; with the host's wall-clock time its reply arrived ([`host_micros`]) and, when
    /// `writes` and [`RedisOptions::wait_for_replicas`] is set, the `WAIT` sent behind it.
    ///
    /// Only errors of commands that were never sent are retryable: no connection could be
    /// made. A command that was sent and failed (a reset, a closed connection, no reply in
    /// time) may have run, so it is reported, not re-sent, and its connection is dropped when
    /// the error may have broken it.
    async fn query(
        &self,
        cmd: &redis::Cmd,
        key: &StorageKey,
        until: Instant,
        writes: bool,
    ) -> Result<Reply, BackendError> {
        self.send(cmd, key, until, writes).await?.map_err(sent_err)
    }

    /// [`query`](Self::query) with the server's error as it came. On a cluster the command
    /// goes to the master of `key`'s slot ([`Cluster::send`]).
    async fn send(
        &self,
        cmd: &redis::Cmd,
        key: &StorageKey,
        until: Instant,
        writes: bool,
    ) -> Result<Result<Reply, RedisError>, BackendError> {
        let wait = self.replicas.filter(|_| writes);
        let pool = match &self.conn {
            Conn::Node(pool) => pool,
            Conn::Cluster(c) => {
                return c
                    .send(cmd, wait, key.as_str(), until, &self.counters.round_trips)
                    .await;
            }
        };
        let slot = pool.pick();
        let live = pool.live(slot, until).await?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BackendError::new(
                BackendErrorKind::Timeout,
                "the caller's deadline passed before the command was sent",
            ));
        }
        self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
        let mut conn = live.conn.clone();
        let exchange = async {
            match wait {
                None => Ok(cmd.query_async::<Value>(&mut conn).await.map(|v| (v, None))),
                Some(r) => {
                    let pipe = with_wait(false, cmd, r, left);
                    let replies: Vec<Value> = pipe.query_async(&mut conn).await?;
                    Ok(split(replies))
                }
            }
        };
        let reply = tokio::time::timeout(left, exchange).await;
        let arrived = host_micros();
        let reply = match reply {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(e),
            Err(_) => {
                return Err(BackendError::new(
                    BackendErrorKind::InDoubt,
                    format!(
                        "no reply from Redis within {left:?} after the command was sent: it may have run"
                    ),
                ));
            }
        };
        match reply {
            Ok((value, acked)) => Ok(Ok(Reply {
                value,
                arrived,
                acked,
            })),
            Err(e) => {
                // READONLY: a replica now (a failover); the next connection asks the sentinels.
                if e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error()
                    || e.code() == Some("READONLY")
                {
                    pool.discard(slot, &live).await;
                }
                Ok(Err(e))
            }
        }
    }

    async fn eval(
        &self,
        script: &Script,
        key: &StorageKey,
        args: &[&[u8]],
        until: Instant,
        writes: bool,
    ) -> Result<Reply, BackendError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&script.sha).arg(1).arg(key.as_str());
        for a in args {
            cmd.arg(*a);
        }
        match self.send(&cmd, key, until, writes).await? {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // The script cache was flushed (SCRIPT FLUSH, restart, failover): EVAL sends
                // the source, runs it and caches it again, in one round trip.
                self.counters.script_reloads.fetch_add(1, Ordering::Relaxed);
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script.source).arg(1).arg(key.as_str());
                for a in args {
                    cmd.arg(*a);
                }
                self.query(&cmd, key, until, writes).await
            }
            r => r.map_err(sent_err),
        }
    }

    /// After a round trip that wrote: `Ok` unless [`RedisOptions::wait_for_replicas`] asked
    /// for more replicas than acknowledged the write in time, when the write may be lost by
    /// a failover and the call is in doubt (the master has it: settled if it survives).
    fn replicated(&self, reply: &Reply) -> Result<(), BackendError> {
        let Some(r) = self.replicas else {
            return Ok(());
        };
        let (acked, why) = match &reply.acked {
            Some(Ok(n)) if *n >= i64::from(r.count) => return Ok(()),
            Some(Ok(n)) => (n.to_string(), String::new()),
            Some(Err(e)) => ("no".to_owned(), format!(" (WAIT failed: {e})")),
            None => ("no".to_owned(), " (no WAIT was sent)".to_owned()),
        };
        Err(BackendError::new(
            BackendErrorKind::InDoubt,
            format!(
                "written on the Redis master, but {acked} of the {} replicas asked for \
                 acknowledged it within {:?}{why}: a failover may lose the write, so the call \
                 is not granted",
                r.count, r.timeout
            ),
        ))
    }

    /// Compare-and-set `write` over `expected` (`None`: absent).
    async fn cas(
        &self,
        key: &StorageKey,
        expected: Option<&[u8]>,
        write: Write,
        deadline: Option<Instant>,
    ) -> Result<(), BackendError> {
        let Write::Put { record, ttl } = write else {
            return Ok(());
        };
        let ttl = ttl_ms(ttl);
        let (flag, exp): (&[u8], &[u8]) = match expected {
            None => (b"0", b""),
            Some(e) => (b"1", e),
        };
        let until = deadline.unwrap_or_else(|| self.default_until());
        let server_deadline = self.server_deadline(key, deadline, until).await?;
        let reply = self
            .eval(
                &self.cas,
                key,
                &[
                    flag,
                    exp,
                    &record,
                    ttl.as_bytes(),
                    server_deadline.as_bytes(),
                ],
                until,
                true,
            )
            .await?;
        match reply.value {
            Value::Int(1) => self.replicated(&reply),
            Value::Int(0) => {
                self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                Err(BackendError::new(
                    BackendErrorKind::Conflict,
                    "the record changed between read and write",
                )
                .retryable(true))
            }
            Value::Int(-1) => Err(BackendError::new(
                BackendErrorKind::WrongType,
                "not a string",
            )),
            Value::Int(-2) => Err(too_late()),
            _ => Err(garbled("compare-and-set reply")),
        }
    }
}

fn command_args(command: Command) -> (u8, u64, u64) {
    let fits = |n: u64| n < EXACT;
    match command {
        Command::TryConsume(n) if fits(n) => (1, n, 0),
        Command::TryConsumeAndReturnRemaining(n) if fits(n) => (2, n, 0),
        Command::EstimateAbilityToConsume(n) if fits(n) => (3, n, 0),
        Command::TryConsumeAsMuchAsPossible(None) => (4, u64::MAX, 0),
        Command::TryConsumeAsMuchAsPossible(Some(l)) if fits(l) => (4, l, 0),
        Command::AddTokens(n) if fits(n) => (5, n, 0),
        Command::ForceAddTokens(n) if fits(n) => (6, n, 0),
        Command::Reset => (7, 0, 0),
        Command::AvailableTokens => (8, 0, 0),
        Command::ConsumeIgnoringRateLimits(n) if fits(n) => (9, n, 0),
        Command::Lease { tokens, processes } if fits(tokens) => (12, tokens, u64::from(processes)),
        // The script's waits stay below 2^53: a longer maximum answers the same as 2^53 - 1,
        // which the script reads exactly.
        Command::Reserve {
            tokens,
            max_wait_nanos,
        } if fits(tokens) => (10, tokens, max_wait_nanos.min(EXACT - 1)),
        _ => (0, 0, 0),
    }
}

/// Whether the bucket script may write with these arguments ([`RedisBackend::transact`]'s):
/// not when every operation only reads (`estimate_ability_to_consume`, `available_tokens`),
/// nor when one is computed by the client (code 0: the script writes nothing for the whole
/// call). Only such a round trip carries the `WAIT` of [`RedisOptions::wait_for_replicas`].
fn script_writes(args: &[Vec<u8>]) -> bool {
    let codes: Vec<&[u8]> = if args.first().is_some_and(|c| c.as_slice() == b"11") {
        args.iter().skip(12).step_by(3).map(Vec::as_slice).collect()
    } else {
        args.first().map(Vec::as_slice).into_iter().collect()
    };
    !codes.contains(&b"0".as_slice()) && codes.iter().any(|c| !matches!(*c, b"3" | b"8"))
}

/// The script's (code, tokens, max wait) arguments of one operation (code 0: computed by the
/// client).
fn command_strings(command: Command) -> [String; 3] {
    let (code, arg, max_wait) = command_args(command);
    let arg = if code == 4 && arg == u64::MAX {
        "-1".to_owned()
    } else {
        arg.to_string()
    };
    [code.to_string(), arg, max_wait.to_string()]
}

#[async_trait]
impl Backend for RedisBackend {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        let (hi, lo) = match tx.client_now() {
            Some(now) => ((now >> 32).to_string(), (now & 0xffff_ffff).to_string()),
            None => (String::new(), String::new()),
        };
        // The margin in whole milliseconds (capped where TTLs stop: no expiry) and the
        // nanoseconds below one, for the script to round exactly as `ttl_ms`.
        let margin = tx.ttl_margin();
        let margin_ms = margin.as_millis().min(TTL_CAP_MS as u128).to_string();
        let margin_ns = (margin.subsec_nanos() % 1_000_000).to_string();
        let deadline = tx.deadline();
        let until = deadline.unwrap_or_else(|| self.default_until());
        // ARGV[1..3]: the command (code 11 and, from ARGV[13], one triple per operation for
        // a batch); ARGV[4..8]: clock, TTL margin, deadline on the server's clock; ARGV[9..12]:
        // the operation id for the record's ledger (owner as 8 bytes, seq, floor, window).
        // Settlements and lease returns are made by the client (code 0): they are rare (a
        // lease's return rides with its next round trip only when it left tokens unused), and
        // the ledger arithmetic they need stays in one place.
        let id = tx.operation();
        let settling = id.is_some_and(|id| !id.settles.is_empty() || !id.returns.is_empty());
        let command = |c: Command| {
            if settling {
                ["0".to_owned(), String::new(), String::new()]
            } else {
                command_strings(c)
            }
        };
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(12);
        let tail = [
            hi,
            lo,
            margin_ms,
            margin_ns,
            self.server_deadline(key, deadline, until).await?,
        ];
        let ledger: [Vec<u8>; 4] = match id {
            Some(id) => [
                id.owner.to_be_bytes().to_vec(),
                id.seq.to_string().into_bytes(),
                id.floor.to_string().into_bytes(),
                id.window.to_string().into_bytes(),
            ],
            None => Default::default(),
        };
        match tx.batch() {
            Some(commands) => {
                args.extend([b"11".to_vec(), Vec::new(), Vec::new()]);
                args.extend(tail.map(String::into_bytes));
                args.extend(ledger);
                for &c in commands {
                    args.extend(command(c).map(String::into_bytes));
                }
            }
            None => {
                args.extend(command(tx.command()).map(String::into_bytes));
                args.extend(tail.map(String::into_bytes));
                args.extend(ledger);
            }
        }
        let arg_refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let writes = script_writes(&args);
        let reply = self.eval(&self.op, key, &arg_refs, until, writes).await?;
        let arrived = reply.arrived;
        let Value::Array(items) = &reply.value else {
            return Err(garbled("not an array"));
        };
        let status = int(items.first()).map_err(|_| garbled("status"))?;
        let field = |i: usize| int(items.get(i)).map_err(|_| garbled("clock"));
        self.observe(key, field(3)?, field(4)?, arrived);
        let now = (field(1)? << 32) | (field(2)? & 0xffff_ffff);
        match status {
            0 => {
                self.counters.exact_path.fetch_add(1, Ordering::Relaxed);
                let write = tx.apply(None, Some(now));
                self.cas(key, None, write, deadline).await
            }
            1 => {
                self.counters.fast_path.fetch_add(1, Ordering::Relaxed);
                let pre = bytes(items.get(5))
                    .ok()
                    .flatten()
                    .ok_or_else(|| garbled("pre-image"))?;
                let post = bytes(items.get(6)).map_err(|_| garbled("post-image"))?;
                // The core decides; the script must have written exactly the same bytes (and
                // only over a record the core reads: it validates what the decoder does).
                let expected = tx.apply(Some(pre), Some(now));
                let agrees = match (&expected, post) {
                    (Write::Keep, None) => true,
                    (Write::Put { record, .. }, Some(p)) => record.as_slice() == p,
                    (Write::Put { record, .. }, None) => record.as_slice() == pre,
                    (Write::Keep, Some(p)) => p == pre && crate::format::decode(pre).is_ok(),
                };
                if !agrees {
                    return Err(BackendError::new(
                        BackendErrorKind::Inconsistent,
                        format!(
                            "the Lua fast path and the core disagree on {:?} for key {key}",
                            tx.command()
                        ),
                    ));
                }
                // A write the replicas asked for may not have: not granted.
                if post.is_some() {
                    self.replicated(&reply)
                } else {
                    Ok(())
                }
            }
            2 => {
                self.counters.exact_path.fetch_add(1, Ordering::Relaxed);
                let pre = bytes(items.get(5))?.ok_or_else(|| protocol("missing record"))?;
                let write = tx.apply(Some(pre), Some(now));
                self.cas(key, Some(pre), write, deadline).await
            }
            3 => {
                let found = match items.get(5) {
                    Some(Value::SimpleString(s)) => s.clone(),
                    Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                    _ => "unknown".to_owned(),
                };
                Err(BackendError::new(BackendErrorKind::WrongType, found))
            }
            4 => Err(too_late()),
            5 => Err(BackendError::new(
                BackendErrorKind::Conflict,
                "this operation was applied or settled already: it is not applied again",
            )),
            _ => Err(garbled("unknown status")),
        }
    }

    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key.as_str());
        let v = self
            .query(&cmd, key, self.default_until(), false)
            .await?
            .value;
        match v {
            Value::Nil => Ok(None),
            Value::BulkString(b) => Ok(Some(b)),
            _ => Err(protocol("GET reply")),
        }
    }

    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(key.as_str());
        let reply = self.query(&cmd, key, self.default_until(), true).await?;
        let removed = int(Some(&reply.value))? > 0;
        if removed {
            self.replicated(&reply)?;
        }
        Ok(removed)
    }

    fn clock(&self) -> BackendClock {
        BackendClock::WallClock
    }
}
