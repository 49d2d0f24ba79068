//! The command line: flags, defaults, and the refusal of settings that can only break.

use core::fmt;
use core::time::Duration;
use std::net::SocketAddr;

use bucket4rs_tower::{FailurePolicy, PlanResolver as _, PlanTable, PlansError};
use ipnet::IpNet;

use crate::serve::{MAX_CONNECTIONS, ServeOptions};

/// The most backend connections `--connections` may ask for.
pub const MAX_BACKEND_CONNECTIONS: usize = 1024;

/// Where buckets live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    /// In this process (the default).
    Embedded,
    /// Redis at this URL: instances share limits.
    Redis(String),
    /// A Redis Cluster reached through these seed URLs (`--redis-cluster URL,URL,…`).
    RedisCluster(Vec<String>),
    /// The Redis master these sentinels name (`--redis-sentinel URL,URL,… --sentinel-master
    /// NAME`): calls follow a failover.
    RedisSentinel {
        /// The sentinels' URLs.
        sentinels: Vec<String>,
        /// The monitored master's name.
        master: String,
    },
    /// PostgreSQL at this URL: instances share limits.
    Postgres(String),
    /// This SQLite file: limits survive a restart; instances on this machine share them.
    Sqlite(String),
}

/// What limited requests get while the shared store cannot decide (`--on-backend-failure`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// 503 (the default).
    Error,
    /// 429.
    Deny,
    /// A per-key limit in this process, at this rate (`fallback:10 per minute`).
    Fallback(String),
}

impl OnFailure {
    /// The layer's failure policy.
    ///
    /// # Errors
    /// A fallback rate the plans file syntax does not accept.
    ///
    /// ```
    /// use bookshelf::OnFailure;
    /// assert!(OnFailure::Fallback("10 per minute".into()).policy().is_ok());
    /// assert!(OnFailure::Fallback("ten".into()).policy().is_err());
    /// ```
    pub fn policy(&self) -> Result<FailurePolicy, String> {
        match self {
            Self::Error => Ok(FailurePolicy::error()),
            Self::Deny => Ok(FailurePolicy::deny()),
            Self::Fallback(rate) => {
                // The rate in the plans file's syntax, read by the plans file's parser.
                let quoted = serde_json::to_string(rate).map_err(|e| e.to_string())?;
                let toml = format!(
                    "[plans.fallback]\nlimits = [{quoted}]\n[keys]\nfallback = \"fallback\"\n"
                );
                let plan = PlanTable::from_toml(&toml)
                    .map_err(|e| format!("--on-backend-failure fallback:{rate}: {e}"))?
                    .resolve("fallback")
                    .ok_or("--on-backend-failure: no fallback plan")?;
                Ok(FailurePolicy::fallback(plan))
            }
        }
    }
}

/// What clients are told apart by (`--key`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyBy {
    /// The `X-API-Key` header, whose plan the plans file gives (the default).
    ApiKey,
    /// The client's address (behind `--trusted-proxy` networks, the address they saw):
    /// every client gets the plans file's default plan.
    Ip,
}

/// The command line.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Args {
    /// `--addr HOST:PORT` (default 127.0.0.1:8080).
    pub addr: SocketAddr,
    /// `--plans FILE` (default: the shipped `plans.toml`).
    pub plans: Option<String>,
    /// `--redis URL` / `--redis-cluster URLS` / `--redis-sentinel URLS --sentinel-master NAME`
    /// / `--postgres URL` / `--sqlite FILE`.
    pub store: Store,
    /// `--tls-ca FILE`, `--tls-cert FILE --tls-key FILE`: a private CA to trust and a client
    /// certificate for Redis over TLS (`rediss://`).
    pub tls: TlsFiles,
    /// `--key-prefix P`: the storage key prefix (default `bookshelf`).
    pub key_prefix: String,
    /// `--max-keys N`: the in-process store's key cap (default 1,000,000; not 0).
    pub max_keys: usize,
    /// `--backend-timeout D`: the longest a shared-store call may take (default 1s; not 0).
    pub backend_timeout: Duration,
    /// `--on-backend-failure error|deny|fallback:RATE` (default `error`).
    pub on_failure: OnFailure,
    /// `--connections N`: connections to Redis or PostgreSQL (default: the backend's).
    pub connections: Option<usize>,
    /// `--key api-key|ip` (default `api-key`).
    pub key: KeyBy,
    /// `--trusted-proxy CIDR` (repeatable): the proxies whose forwarding header names the
    /// client (with `--key ip`), exempt from the per-address connection cap.
    pub trusted_proxies: Vec<IpNet>,
    /// `--header-timeout`, `--idle-timeout`, `--max-connections`.
    pub serve: ServeOptions,
    /// `--no-limit`: serve without the rate-limit layer (to measure its overhead).
    pub no_limit: bool,
    /// `--help`.
    pub help: bool,
}

/// The certificate files of `--tls-ca`, `--tls-cert` and `--tls-key`.
///
/// ```
/// let a = bookshelf::Args::parse(["--redis", "rediss://cache:6380", "--tls-ca", "ca.pem"].map(String::from))?;
/// assert_eq!(a.tls.ca.as_deref(), Some("ca.pem"));
/// # Ok::<(), bookshelf::ArgsError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// A PEM file of CA certificates trusted besides the platform's roots.
    pub ca: Option<String>,
    /// A PEM certificate chain presented to the server (mutual TLS), with `key`.
    pub cert: Option<String>,
    /// The PEM private key of `cert`.
    pub key: Option<String>,
}

impl TlsFiles {
    /// Whether any file was given.
    ///
    /// ```
    /// assert!(!bookshelf::TlsFiles::default().any());
    /// ```
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }
}

/// A command-line error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgsError(String);

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for ArgsError {}

/// The usage text.
pub const USAGE: &str = "\
bookshelf: the Bookshelf API, rate-limited by bucket4rs-tower

USAGE: bookshelf [--addr HOST:PORT] [--plans FILE]
                 [--redis URL | --redis-cluster URL,URL,... |
                  --redis-sentinel URL,URL,... --sentinel-master NAME |
                  --postgres URL | --sqlite FILE]
                 [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] [--key-prefix P] [--max-keys N] [--backend-timeout D]
                 [--on-backend-failure error|deny|fallback:RATE] [--connections N]
                 [--key api-key|ip] [--trusted-proxy CIDR]...
                 [--header-timeout D] [--idle-timeout D] [--max-connections N]
                 [--max-connections-per-address N] [--no-limit]

  --addr HOST:PORT      listen here (default 127.0.0.1:8080)
  --plans FILE          plans file (default: the shipped plans.toml, whose search limit
                        leases on a shared store: see Leasing below)
  --redis URL           keep buckets in Redis, shared by every instance (rediss:// for TLS)
  --redis-cluster URL,URL,...
                        keep buckets in a Redis Cluster reached through these seed nodes
  --redis-sentinel URL,URL,...
                        keep buckets in the Redis master these sentinels name (with
                        --sentinel-master NAME); calls follow a failover
  --sentinel-master NAME
                        the master's name in the sentinels' configuration, or
                        redis[s]://[user:password@]NAME[/db] for a master with a password
                        or on TLS
  --tls-ca FILE         trust the CA certificates in this PEM file besides the platform's
                        roots (Redis over TLS; for PostgreSQL: ?sslrootcert=FILE in the URL)
  --tls-cert FILE       present this PEM certificate chain to Redis (mutual TLS), with
  --tls-key FILE        its PEM private key
  --postgres URL        keep buckets in PostgreSQL, shared by every instance (TLS:
                        ?sslmode=verify-full&sslrootcert=FILE, as libpq reads them)
  --sqlite FILE         keep buckets in this SQLite file: kept across restarts, shared by
                        every instance on this machine
  --key-prefix P        storage key prefix (default bookshelf)
  --max-keys N          key cap of the in-process store (default 1000000; at the cap a
                        new key gets the failure policy's answer)
  --backend-timeout D   longest call to Redis or PostgreSQL, retries included (default 1s)
  --on-backend-failure  what limited requests get while the store cannot decide:
                        error (503, the default), deny (429), or fallback:RATE, a
                        per-key limit in this process (e.g. 'fallback:10 per minute')
  --connections N       connections to Redis (default 1) or PostgreSQL (default 16)
  --key api-key|ip      tell clients apart by the X-API-Key header and give each its plan
                        from the plans file (default), or by address: every address gets
                        the plans file's default plan (default_plan, else free)
  --trusted-proxy CIDR  a network of your load balancers or proxies (repeatable): with
                        --key ip, a request from one of them is keyed by the client address
                        its X-Forwarded-For names (read from the right); they are not
                        held to --max-connections-per-address
  --header-timeout D    time a client has to send a request's headers; also closes an
                        unused kept-alive connection (default 10s)
  --idle-timeout D      close a connection on which no byte moves for this long (default 60s)
  --max-connections N   open connections at most; beyond, new ones wait (default 1024)
  --max-connections-per-address N
                        open connections of one client address at most; beyond, its new
                        ones are closed at once (default 64)
  --no-limit            serve without rate limiting (to measure the layer's overhead)

Durations: 500ms, 10s, 2m, 1h. Zero timeouts, a zero key cap and zero connections are
refused. The server starts even when Redis or PostgreSQL is down: it connects in the
background, retrying, and until then limited requests get the failure policy's answer
(GET /health answers 200 throughout).

Leasing: a plan or limit with `lease = true` (or `lease = { processes = N, ... }`) in the
plans file, on a shared store (--redis, --redis-cluster, --redis-sentinel, --postgres,
--sqlite), is served by each instance from blocks of tokens it leases from the store: a hot
key (the shipped file's search limit, one bucket for every search) then costs a round trip
per block, not per request, and no instance grants a token the store did not give it. What
a lease did not use goes back when it ends, and at a graceful stop (Ctrl-C, SIGTERM). In
process there is nothing to lease: the setting is accepted and does nothing.

Exact limits across a Redis restart need an fsync'd append-only file
(appendonly yes, appendfsync always): otherwise Redis forgets the last writes, and the
clients whose buckets it forgets get tokens back.
";

/// A duration: a whole number and a unit (`ms`, `s`, `m`, `h`).
fn duration(flag: &str, v: &str) -> Result<Duration, ArgsError> {
    let bad = || {
        ArgsError(format!(
            "{flag}: {v:?} is not a duration such as 500ms, 10s or 2m"
        ))
    };
    let split = v.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = v.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
    .ok_or_else(bad)?;
    if d.is_zero() {
        return Err(ArgsError(format!(
            "{flag}: a zero timeout would refuse everything; give a duration above zero"
        )));
    }
    Ok(d)
}

/// A count between 1 and `max`.
fn count(flag: &str, v: &str, max: usize, zero: &str) -> Result<usize, ArgsError> {
    let n: usize = v
        .parse()
        .map_err(|_| ArgsError(format!("{flag}: {v:?} is not a number")))?;
    if n == 0 {
        return Err(ArgsError(format!("{flag}: 0 {zero}; give at least 1")));
    }
    if n > max {
        return Err(ArgsError(format!("{flag}: {n} is above the most, {max}")));
    }
    Ok(n)
}

impl Args {
    /// Parses the arguments (without the program name). Hand-rolled: a dozen flags do not
    /// justify a dependency.
    ///
    /// # Errors
    /// An unknown flag, a missing value, an invalid address, number, duration or policy,
    /// and the settings that can only break: a zero timeout, key cap or connection count.
    ///
    /// ```
    /// use bookshelf::{Args, Store};
    /// let a = Args::parse(["--redis", "redis://127.0.0.1/"].map(String::from))?;
    /// assert_eq!(a.store, Store::Redis("redis://127.0.0.1/".into()));
    /// assert!(Args::parse(["--bogus".to_owned()]).is_err());
    /// assert!(Args::parse(["--max-keys", "0"].map(String::from)).is_err());
    /// assert!(Args::parse(["--backend-timeout", "0s"].map(String::from)).is_err());
    /// # Ok::<(), bookshelf::ArgsError>(())
    /// ```
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, ArgsError> {
        let mut out = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            plans: None,
            store: Store::Embedded,
            key_prefix: "bookshelf".into(),
            max_keys: 1_000_000,
            backend_timeout: Duration::from_secs(1),
            on_failure: OnFailure::Error,
            connections: None,
            key: KeyBy::ApiKey,
            trusted_proxies: Vec::new(),
            serve: ServeOptions::default(),
            no_limit: false,
            help: false,
            tls: TlsFiles::default(),
        };
        let mut sentinel_master = None;
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let (flag, inline) = match flag.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
                _ => (flag, None),
            };
            let mut value = |name: &str| {
                inline
                    .clone()
                    .or_else(|| it.next())
                    .ok_or_else(|| ArgsError(format!("{name} needs a value\n\n{USAGE}")))
            };
            let f = flag.as_str();
            match f {
                "--addr" => {
                    let v = value(f)?;
                    out.addr = v
                        .parse()
                        .map_err(|_| ArgsError(format!("--addr: {v:?} is not HOST:PORT")))?;
                }
                "--plans" => out.plans = Some(value(f)?),
                "--redis" => out.store = Store::Redis(value(f)?),
                "--redis-cluster" => out.store = Store::RedisCluster(urls(f, &value(f)?)?),
                "--redis-sentinel" => {
                    out.store = Store::RedisSentinel {
                        sentinels: urls(f, &value(f)?)?,
                        master: String::new(),
                    };
                }
                "--sentinel-master" => sentinel_master = Some(value(f)?),
                "--tls-ca" => out.tls.ca = Some(value(f)?),
                "--tls-cert" => out.tls.cert = Some(value(f)?),
                "--tls-key" => out.tls.key = Some(value(f)?),
                "--postgres" => out.store = Store::Postgres(value(f)?),
                "--sqlite" => out.store = Store::Sqlite(value(f)?),
                "--key-prefix" => out.key_prefix = value(f)?,
                "--max-keys" => {
                    out.max_keys = count(f, &value(f)?, usize::MAX, "keys would refuse every key")?;
                }
                "--backend-timeout" => out.backend_timeout = duration(f, &value(f)?)?,
                "--on-backend-failure" => {
                    let v = value(f)?;
                    out.on_failure = match v.as_str() {
                        "error" => OnFailure::Error,
                        "deny" => OnFailure::Deny,
                        other => match other.strip_prefix("fallback:") {
                            Some(rate) => OnFailure::Fallback(rate.trim().to_owned()),
                            None => {
                                return Err(ArgsError(format!(
                                    "--on-backend-failure: {v:?} is not error, deny or fallback:RATE"
                                )));
                            }
                        },
                    };
                    // A bad rate is refused now, not when the store first fails.
                    out.on_failure.policy().map_err(ArgsError)?;
                }
                "--connections" => {
                    out.connections = Some(count(
                        f,
                        &value(f)?,
                        MAX_BACKEND_CONNECTIONS,
                        "connections could never reach the store",
                    )?);
                }
                "--header-timeout" => out.serve.header_timeout = duration(f, &value(f)?)?,
                "--idle-timeout" => out.serve.idle_timeout = duration(f, &value(f)?)?,
                "--max-connections" => {
                    out.serve.max_connections = count(
                        f,
                        &value(f)?,
                        MAX_CONNECTIONS,
                        "connections would refuse every client",
                    )?;
                }
                "--key" => {
                    let v = value(f)?;
                    out.key = match v.as_str() {
                        "api-key" => KeyBy::ApiKey,
                        "ip" => KeyBy::Ip,
                        other => {
                            return Err(ArgsError(format!(
                                "--key: {other:?} is not api-key or ip"
                            )));
                        }
                    };
                }
                "--trusted-proxy" => {
                    let v = value(f)?;
                    let net = v
                        .trim()
                        .parse::<IpNet>()
                        .or_else(|_| v.trim().parse::<std::net::IpAddr>().map(IpNet::from))
                        .map_err(|_| {
                            ArgsError(format!(
                                "--trusted-proxy: {v:?} is not a network such as 10.0.0.0/8"
                            ))
                        })?;
                    out.trusted_proxies.push(net.trunc());
                }
                "--max-connections-per-address" => {
                    out.serve.max_connections_per_address = count(
                        f,
                        &value(f)?,
                        MAX_CONNECTIONS,
                        "connections would refuse every client",
                    )?;
                }
                "--no-limit" => out.no_limit = true,
                "-h" | "--help" => out.help = true,
                other => return Err(ArgsError(format!("unknown argument {other:?}\n\n{USAGE}"))),
            }
        }
        out.serve.unlimited = out.trusted_proxies.clone();
        match (&mut out.store, sentinel_master) {
            (Store::RedisSentinel { master, .. }, Some(name)) => *master = name,
            (Store::RedisSentinel { .. }, None) => {
                return Err(ArgsError(
                    "--redis-sentinel needs --sentinel-master NAME".to_owned(),
                ));
            }
            (_, Some(_)) => {
                return Err(ArgsError(
                    "--sentinel-master goes with --redis-sentinel".to_owned(),
                ));
            }
            (_, None) => {}
        }
        if out.tls.cert.is_some() != out.tls.key.is_some() {
            return Err(ArgsError("--tls-cert and --tls-key go together".to_owned()));
        }
        if out.tls.any()
            && !matches!(
                out.store,
                Store::Redis(_) | Store::RedisCluster(_) | Store::RedisSentinel { .. }
            )
        {
            return Err(ArgsError(
                "--tls-ca, --tls-cert and --tls-key are for Redis (PostgreSQL reads \
                 sslrootcert, sslcert and sslkey from its URL)"
                    .to_owned(),
            ));
        }
        Ok(out)
    }
}

/// A comma-separated list of URLs (`--redis-cluster`, `--redis-sentinel`).
fn urls(flag: &str, list: &str) -> Result<Vec<String>, ArgsError> {
    let urls: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(ArgsError(format!("{flag} needs at least one URL")));
    }
    Ok(urls)
}

/// Reads the plans: `path`, or the shipped default.
///
/// # Errors
/// The file cannot be read, or a [`PlansError`] (prefixed with the file name).
///
/// ```
/// assert!(bookshelf::load_plans(None).is_ok());
/// assert!(bookshelf::load_plans(Some("/nonexistent.toml")).is_err());
/// ```
pub fn load_plans(path: Option<&str>) -> Result<PlanTable, String> {
    match path {
        None => PlanTable::from_toml(crate::DEFAULT_PLANS)
            .map_err(|e: PlansError| format!("plans.toml: {e}")),
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"))?;
            PlanTable::from_toml(&text).map_err(|e| format!("{p}: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, ArgsError> {
        Args::parse(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn the_cluster_sentinel_and_tls_flags_are_read_and_checked() {
        let a = parse(&["--redis-cluster", "redis://a:1, redis://b:2,redis://c:3"]).unwrap();
        assert_eq!(
            a.store,
            Store::RedisCluster(vec![
                "redis://a:1".into(),
                "redis://b:2".into(),
                "redis://c:3".into()
            ])
        );
        let a = parse(&[
            "--redis-sentinel=redis://s1:26379,redis://s2:26379",
            "--sentinel-master",
            "limits",
        ])
        .unwrap();
        assert_eq!(
            a.store,
            Store::RedisSentinel {
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
                master: "limits".into()
            }
        );
        let a = parse(&[
            "--redis",
            "rediss://cache:6380",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "c.key",
        ])
        .unwrap();
        assert_eq!(a.tls.ca.as_deref(), Some("ca.pem"));
        assert!(a.tls.any());
        for (bad, says) in [
            (
                &["--redis-sentinel", "redis://s:1"][..],
                "needs --sentinel-master",
            ),
            (
                &["--sentinel-master", "m"][..],
                "goes with --redis-sentinel",
            ),
            (&["--redis-cluster", " , "][..], "at least one URL"),
            (
                &["--redis", "rediss://x", "--tls-cert", "c.pem"][..],
                "go together",
            ),
            (
                &["--postgres", "postgres://x", "--tls-ca", "ca.pem"][..],
                "sslrootcert",
            ),
            (&["--tls-ca", "ca.pem"][..], "are for Redis"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_serving_and_backend_flags_are_read() {
        let a = parse(&[
            "--header-timeout=2s",
            "--idle-timeout",
            "500ms",
            "--max-connections",
            "8",
            "--backend-timeout",
            "250ms",
            "--connections",
            "4",
            "--on-backend-failure",
            "deny",
        ])
        .unwrap();
        assert_eq!(a.serve.header_timeout, Duration::from_secs(2));
        assert_eq!(a.serve.idle_timeout, Duration::from_millis(500));
        assert_eq!(a.serve.max_connections, 8);
        assert_eq!(a.backend_timeout, Duration::from_millis(250));
        assert_eq!(a.connections, Some(4));
        assert_eq!(a.on_failure, OnFailure::Deny);
        let a = parse(&["--on-backend-failure", "fallback:10 per minute"]).unwrap();
        assert_eq!(a.on_failure, OnFailure::Fallback("10 per minute".into()));
        let a = parse(&[
            "--key",
            "ip",
            "--trusted-proxy",
            "10.1.2.3/8",
            "--trusted-proxy=2001:db8::1",
            "--max-connections-per-address",
            "4",
        ])
        .unwrap();
        assert_eq!(a.key, KeyBy::Ip);
        assert_eq!(
            a.trusted_proxies,
            [
                "10.0.0.0/8".parse::<IpNet>().unwrap(),
                "2001:db8::1/128".parse().unwrap()
            ]
        );
        assert_eq!(a.serve.max_connections_per_address, 4);
        assert_eq!(a.serve.unlimited, a.trusted_proxies);
        assert_eq!(parse(&[]).unwrap().key, KeyBy::ApiKey);
        let d = parse(&[]).unwrap();
        assert_eq!(d.serve, ServeOptions::default());
        assert_eq!(d.backend_timeout, Duration::from_secs(1));
        assert_eq!(d.on_failure, OnFailure::Error);
    }

    #[test]
    fn knobs_that_can_only_break_are_refused_with_the_flag_named() {
        for (args, says) in [
            (&["--max-keys", "0"][..], "--max-keys: 0 keys"),
            (
                &["--backend-timeout", "0ms"],
                "--backend-timeout: a zero timeout",
            ),
            (
                &["--header-timeout", "0s"],
                "--header-timeout: a zero timeout",
            ),
            (&["--idle-timeout", "0m"], "--idle-timeout: a zero timeout"),
            (&["--connections", "0"], "--connections: 0 connections"),
            (
                &["--max-connections", "0"],
                "--max-connections: 0 connections",
            ),
            (&["--max-connections", "99999999"], "above the most"),
            (&["--connections", "5000"], "above the most"),
            (&["--backend-timeout", "10"], "is not a duration"),
            (&["--backend-timeout", "-1s"], "is not a duration"),
            (
                &["--backend-timeout", "99999999999999999999h"],
                "is not a duration",
            ),
            (
                &["--on-backend-failure", "allow"],
                "not error, deny or fallback",
            ),
            (&["--on-backend-failure", "fallback:lots"], "fallback:lots"),
            (
                &["--key", "cookie"],
                "--key: \"cookie\" is not api-key or ip",
            ),
            (&["--trusted-proxy", "10.0.0.0/33"], "--trusted-proxy"),
            (&["--trusted-proxy", "lb.internal"], "--trusted-proxy"),
            (
                &["--max-connections-per-address", "0"],
                "--max-connections-per-address: 0 connections",
            ),
        ] {
            let e = parse(args).unwrap_err().to_string();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn the_usage_says_what_exact_limits_across_a_redis_restart_need() {
        assert!(USAGE.contains("appendonly yes"));
        assert!(USAGE.contains("appendfsync always"));
        for flag in [
            "--header-timeout",
            "--idle-timeout",
            "--max-connections",
            "--backend-timeout",
            "--on-backend-failure",
            "--connections",
            "--max-keys",
            "--key",
            "--trusted-proxy",
            "--max-connections-per-address",
        ] {
            assert!(USAGE.contains(flag), "{flag}");
        }
    }
}
