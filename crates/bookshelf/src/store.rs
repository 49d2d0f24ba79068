//! The application the command line asks for: its store, its failure policy, its knobs.

use core::time::Duration;

use axum::Router;
use bucket4rs_distributed::{
    Backend, BackendClock, PostgresBackend, PostgresOptions, ProxyManager, RedisBackend,
    RedisOptions,
};
use bucket4rs_tower::{PlanTable, RateLimit, RateLimitLayer};

use crate::{Args, Deferred, Store, WithHealth};

/// The rate-limited application of [`app`](crate::app), whatever its store.
pub type App = WithHealth<RateLimit<Router>>;

/// The application `args` describe, and where its buckets live (for the banner). Call it
/// on a tokio runtime: a Redis or PostgreSQL store is connected in the background
/// ([`Deferred`]), so the server serves at once, and until the store is reachable limited
/// requests get the `--on-backend-failure` answer.
///
/// # Errors
/// The layer or the manager refuses a setting (the message names the flag).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let args = bookshelf::Args::parse(["--redis", "redis://127.0.0.1:1/"].map(String::from))?;
/// let (app, store) = bookshelf::app_from(&args, bookshelf::load_plans(None)?)?;
/// assert_eq!(store, "Redis at redis://127.0.0.1:1/");
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn app_from(args: &Args, plans: PlanTable) -> Result<(App, String), String> {
    let policy = args.on_failure.policy()?;
    match &args.store {
        Store::Embedded => {
            let store = RateLimitLayer::builder()
                .max_keys(args.max_keys)
                .failure_policy(policy);
            let app = crate::app(store, plans).map_err(|e| format!("--max-keys: {e}"))?;
            Ok((app, "in-process".into()))
        }
        Store::Redis(url) => {
            let mut options = RedisOptions::default();
            if let Some(n) = args.connections {
                options = options.connections(n);
            }
            let target = url.clone();
            let backend = Deferred::connect("Redis", BackendClock::WallClock, move || {
                let (url, options) = (target.clone(), options.clone());
                async move {
                    let backend = RedisBackend::connect(&url, options)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok((backend, ()))
                }
            });
            Ok((shared(args, backend, plans)?, format!("Redis at {url}")))
        }
        Store::Postgres(url) => {
            let mut options = PostgresOptions::default();
            if let Some(n) = args.connections {
                options = options.max_connections(n);
            }
            let target = url.clone();
            let backend = Deferred::connect("PostgreSQL", BackendClock::WallClock, move || {
                let (url, options) = (target.clone(), options.clone());
                async move {
                    let backend = PostgresBackend::connect(&url, options)
                        .await
                        .map_err(|e| e.to_string())?;
                    backend
                        .migrate()
                        .await
                        .map_err(|e| format!("creating the bucket table: {e}"))?;
                    // Expired rows are invisible at once; the reaper deletes them for as
                    // long as the backend lives.
                    let reaper = backend.spawn_reaper(Duration::from_secs(30), 1_000);
                    Ok((backend, reaper))
                }
            });
            Ok((
                shared(args, backend, plans)?,
                format!("PostgreSQL at {url}"),
            ))
        }
    }
}

/// The application over a shared store.
fn shared<B: Backend>(args: &Args, backend: B, plans: PlanTable) -> Result<App, String> {
    let manager = ProxyManager::configure(backend)
        .key_prefix(&args.key_prefix)
        .timeout(args.backend_timeout)
        .build()
        .map_err(|e| format!("--key-prefix / --backend-timeout: {e}"))?;
    let store = RateLimitLayer::builder()
        .backend(manager)
        .failure_policy(args.on_failure.policy()?);
    crate::app(store, plans).map_err(|e| e.to_string())
}
