//! `cargo run --release -p bookshelf`: the Bookshelf API on 127.0.0.1:8080.

use std::convert::Infallible;
use std::process::ExitCode;

use axum::extract::Request;
use axum::response::Response;
use tower::Service;

use bookshelf::Args;

#[tokio::main]
async fn main() -> ExitCode {
    // Warnings and errors to stderr: a store that cannot be reached, the store's own
    // errors behind a 500 or 503 (never in the response body).
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
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
    let started = bookshelf::app_from(&args, plans).await?;
    serve(&args, started.app, &started.store).await?;
    // The tokens this instance holds in leases (a hot key on a shared store) go back to
    // the store now, rather than being lost from it (an under-grant until they refill).
    if let Err(e) = started.layer.release_leases().await {
        tracing::warn!("leased tokens could not be given back to the store: {e}");
    }
    Ok(())
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
    bookshelf::serve_with(listener, app, bookshelf::shutdown_signal(), &args.serve)
        .await
        .map_err(|e| e.to_string())?;
    println!("Bookshelf API stopped.");
    Ok(())
}
