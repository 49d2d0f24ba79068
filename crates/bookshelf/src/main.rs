//! `cargo run --release -p bookshelf`: the Bookshelf API on 127.0.0.1:8080.

use std::convert::Infallible;
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use tower::Service;

use bookshelf::{Args, Store};
use bucket4rs_distributed::{
    PostgresBackend, PostgresOptions, ProxyManager, RedisBackend, RedisOptions,
};
use bucket4rs_tower::RateLimitLayer;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bookshelf: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), String> {
    let args = Args::parse(std::env::args().skip(1)).map_err(|e| e.to_string())?;
    if args.help {
        print!("{}", bookshelf::USAGE);
        return Ok(());
    }
    let plans = bookshelf::load_plans(args.plans.as_deref())?;
    if args.no_limit {
        return serve(&args, bookshelf::routes(), "none (--no-limit)").await;
    }
    match &args.store {
        Store::Embedded => {
            let store = RateLimitLayer::builder().max_keys(args.max_keys);
            let app = bookshelf::app(store, plans).map_err(|e| format!("--max-keys: {e}"))?;
            serve(&args, app, "in-process").await
        }
        Store::Redis(url) => {
            let backend = RedisBackend::connect(url, RedisOptions::default())
                .await
                .map_err(|e| format!("--redis {url}: {e}"))?;
            let manager = ProxyManager::configure(backend)
                .key_prefix(&args.key_prefix)
                .build()
                .map_err(|e| format!("--key-prefix: {e}"))?;
            let app = bookshelf::app(RateLimitLayer::builder().backend(manager), plans)
                .map_err(|e| e.to_string())?;
            serve(&args, app, &format!("Redis at {url}")).await
        }
        Store::Postgres(url) => {
            let backend = PostgresBackend::connect(url, PostgresOptions::default())
                .await
                .map_err(|e| format!("--postgres {url}: {e}"))?;
            backend
                .migrate()
                .await
                .map_err(|e| format!("--postgres {url}: creating the bucket table: {e}"))?;
            // Expired rows are invisible at once; the reaper deletes them until the
            // server stops.
            let reaper = backend.spawn_reaper(Duration::from_secs(30), 1_000);
            let manager = ProxyManager::configure(backend)
                .key_prefix(&args.key_prefix)
                .build()
                .map_err(|e| format!("--key-prefix: {e}"))?;
            let app = bookshelf::app(RateLimitLayer::builder().backend(manager), plans)
                .map_err(|e| e.to_string())?;
            let served = serve(&args, app, &format!("PostgreSQL at {url}")).await;
            drop(reaper);
            served
        }
    }
}

/// Binds `--addr`, prints the address and a curl line, and serves until Ctrl-C or SIGTERM.
async fn serve<S>(args: &Args, app: S, store: &str) -> Result<(), String>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.addr))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("Bookshelf API listening on http://{addr} (buckets: {store})");
    println!("Try:");
    println!("  curl -i -H 'X-API-Key: free-demo-key' http://{addr}/books/9781593278281");
    println!("  curl -i -H 'X-API-Key: pro-demo-key' 'http://{addr}/books/search?q=rust'");
    println!("Ctrl-C to stop.");
    bookshelf::serve(listener, app, bookshelf::shutdown_signal())
        .await
        .map_err(|e| e.to_string())?;
    println!("Bookshelf API stopped.");
    Ok(())
}
