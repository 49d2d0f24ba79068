//! The application the command line asks for: its store, its failure policy, its knobs.

use core::time::Duration;

use axum::Router;
use bucket4rs_distributed::{
    Backend, PostgresBackend, PostgresOptions, ProxyManager, RedisBackend, RedisOptions,
    SqliteBackend, SqliteOptions, TlsOptions,
};
use bucket4rs_tower::{PlanTable, RateLimit, RateLimitLayer};

use crate::{Args, Store, WithHealth};

/// The rate-limited application of [`app`](crate::app), whatever its store.
pub type App = WithHealth<RateLimit<Router>>;

/// What [`app_from`] made: the application, where its buckets live (for the banner), and its
/// rate-limit layer (to give leased tokens back at a graceful shutdown:
/// [`RateLimitLayer::release_leases`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct Started {
    /// The application to serve.
    pub app: App,
    /// Where the buckets live, in words: `in-process`, `Redis at …`.
    pub store: String,
    /// The application's rate-limit layer.
    pub layer: RateLimitLayer,
}

/// The application `args` describe, and where its buckets live (for the banner). Call it
/// on a tokio runtime: a Redis or PostgreSQL backend is created at once and connects in the
/// background, so the server serves at once, and until the store is reachable limited
/// requests get the `--on-backend-failure` answer.
///
/// A PostgreSQL URL is read as the distributed crate reads it
/// ([`PostgresBackend::connect`]): besides what tokio-postgres reads, libpq's TLS parameters
/// `sslmode=verify-ca|verify-full`, `sslrootcert`, `sslcert` and `sslkey`.
///
/// # Errors
/// A store URL that cannot be read (for PostgreSQL also a certificate file named in it that
/// cannot be read), or the layer or the manager refuses a setting (the message names the
/// flag).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let args = bookshelf::Args::parse(["--redis", "redis://127.0.0.1:1/"].map(String::from))?;
/// let started = bookshelf::app_from(&args, bookshelf::load_plans(None)?).await?;
/// assert_eq!(started.store, "Redis at redis://127.0.0.1:1/");
/// // … serve `started.app`; at a graceful shutdown:
/// started.layer.release_leases().await?;
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn app_from(args: &Args, plans: PlanTable) -> Result<Started, String> {
    let policy = args.on_failure.policy()?;
    let (layer, store) = match &args.store {
        Store::Embedded => {
            let store = RateLimitLayer::builder()
                .max_keys(args.max_keys)
                .failure_policy(policy);
            let layer = crate::layer_keyed(store, plans, args.key, &args.trusted_proxies)?;
            (layer, "in-process".into())
        }
        Store::Redis(url) => {
            let options = redis_options(args)?;
            // Created at once: the backend connects in the background, and until Redis
            // answers its calls fail, which the failure policy answers.
            let client = bucket4rs_distributed::redis::Client::open(url.as_str())
                .map_err(|e| format!("--redis: {e}"))?;
            let backend =
                RedisBackend::with_client(client, options).map_err(|e| format!("--redis: {e}"))?;
            (shared(args, backend, plans)?, format!("Redis at {url}"))
        }
        Store::RedisCluster(seeds) => {
            let backend = RedisBackend::connect_cluster(seeds, redis_options(args)?)
                .await
                .map_err(|e| format!("--redis-cluster: {e}"))?;
            (
                shared(args, backend, plans)?,
                format!("Redis Cluster at {}", seeds.join(",")),
            )
        }
        Store::RedisSentinel { sentinels, master } => {
            let backend = RedisBackend::connect_sentinel(sentinels, master, redis_options(args)?)
                .await
                .map_err(|e| format!("--redis-sentinel: {e}"))?;
            (
                shared(args, backend, plans)?,
                format!(
                    "Redis master {master:?} of the sentinels {}",
                    sentinels.join(",")
                ),
            )
        }
        Store::Postgres(url) => {
            let mut options = PostgresOptions::default();
            if let Some(n) = args.connections {
                options = options.max_connections(n);
            }
            // The backend's own reading of the URL (libpq's TLS parameters included, which
            // tokio-postgres' `Config` refuses). Created at once, as for Redis: `connect`
            // does not wait for the server; the table is made once PostgreSQL answers.
            let backend = PostgresBackend::connect(url, options)
                .await
                .map_err(|e| format!("--postgres: {e}"))?;
            tokio::spawn(migrate_then_reap(backend.clone()));
            (
                shared(args, backend, plans)?,
                format!("PostgreSQL at {url}"),
            )
        }
        Store::Sqlite(file) => {
            // A file on this machine: opened now (milliseconds, on the backend's own thread),
            // so a path that cannot be a database stops the server at start.
            let path = file.clone();
            let opened = std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .build()
                    .map_err(|e| e.to_string())?
                    .block_on(SqliteBackend::open(&path, SqliteOptions::default()))
                    .map_err(|e| e.to_string())
            })
            .join()
            .map_err(|_| "--sqlite: opening the file panicked".to_owned())?;
            let backend = opened.map_err(|e| format!("--sqlite {file}: {e}"))?;
            // Expired rows are invisible at once; the reaper frees their space for the life of
            // the process (its handle, which would stop it, is never dropped).
            std::mem::forget(backend.spawn_reaper(Duration::from_secs(30), 1_000));
            (shared(args, backend, plans)?, format!("SQLite file {file}"))
        }
    };
    Ok(Started {
        app: crate::app_of(&layer),
        store,
        layer,
    })
}

/// The Redis options of the command line: connections and certificates (a certificate file
/// that cannot be read stops the server at start; a server whose certificate is refused is
/// an outage, answered by the failure policy).
fn redis_options(args: &Args) -> Result<RedisOptions, String> {
    let mut options = RedisOptions::default();
    if let Some(n) = args.connections {
        options = options.connections(n);
    }
    if args.tls.any() {
        let mut tls = TlsOptions::default();
        if let Some(ca) = &args.tls.ca {
            tls = tls.ca_file(ca).map_err(|e| format!("--tls-ca: {e}"))?;
        }
        if let (Some(cert), Some(key)) = (&args.tls.cert, &args.tls.key) {
            tls = tls
                .client_identity_files(cert, key)
                .map_err(|e| format!("--tls-cert / --tls-key: {e}"))?;
        }
        options = options.tls(tls);
    }
    Ok(options)
}

/// Creates the bucket table once PostgreSQL answers (retrying: 250 ms, doubling up to 5 s),
/// then deletes expired rows every 30 s for as long as the process runs (expired rows are
/// invisible at once; the reaper only frees their space).
async fn migrate_then_reap(backend: PostgresBackend) {
    let mut wait = Duration::from_millis(250);
    let mut failed = 0u32;
    while let Err(e) = backend.migrate().await {
        failed = failed.saturating_add(1);
        tracing::warn!("PostgreSQL: cannot create the bucket table ({e}); retrying in {wait:?}");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(5));
    }
    tracing::info!("PostgreSQL: bucket table ready after {failed} failed attempts");
    let _reaper = backend.spawn_reaper(Duration::from_secs(30), 1_000);
    core::future::pending::<()>().await;
}

/// The rate-limit layer over a shared store.
fn shared<B: Backend>(args: &Args, backend: B, plans: PlanTable) -> Result<RateLimitLayer, String> {
    let manager = ProxyManager::configure(backend)
        .key_prefix(&args.key_prefix)
        .timeout(args.backend_timeout)
        .build()
        .map_err(|e| format!("--key-prefix / --backend-timeout: {e}"))?;
    let store = RateLimitLayer::builder()
        .backend(manager)
        .failure_policy(args.on_failure.policy()?);
    crate::layer_keyed(store, plans, args.key, &args.trusted_proxies)
}
