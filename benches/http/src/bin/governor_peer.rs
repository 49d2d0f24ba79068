//! The Bookshelf routes behind the closest Rust peer of `bucket4rs-tower`:
//! [`tower_governor`](https://crates.io/crates/tower_governor) (governor's keyed GCRA
//! limiter in a tower layer), set up as a user of it would to do what Bookshelf's layer does
//! on an allowed request:
//!
//! - one limit per client key, read from `X-API-Key` (a request without one is refused);
//! - two rate-limit headers on every allowed response (`use_headers`: `x-ratelimit-limit`
//!   and `x-ratelimit-remaining`, governor's own, not the IETF fields);
//! - a quota that is never reached (a burst of 10⁹, one token back every nanosecond), so
//!   every request takes the allowed path, as with `benches/http/bench-plans.toml`.
//!
//! It has no plans (one quota for every key), no per-route cost, no key cap and no idle-key
//! eviction, so it does less than the real layer. The overhead scripts
//! (`benches/http/scripts/overhead-paired.sh`, `PEER=`) run it beside the real layer,
//! against the same `bookshelf --no-limit`, to compare the two layers' throughput loss in
//! the same rounds.
//!
//! ```text
//! cargo build --release -p bucket4rs-http-benches --bin governor_peer
//! target/release/governor_peer --addr 127.0.0.1:18089
//! ```

use axum::http::Request;
use tower::Layer as _;
use tower_governor::GovernorError;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

/// The client key: the `X-API-Key` header, owned (the keyed store keeps it).
#[derive(Clone, Copy, Debug)]
struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
        req.headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim_ascii)
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = bucket4rs_http_benches::parse_addr_only(
        std::env::args().skip(1),
        ([127, 0, 0, 1], 18089).into(),
    )
    .map_err(std::io::Error::other)?;
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(1_000_000_000)
        .key_extractor(ApiKey)
        .use_headers()
        .finish()
        .ok_or_else(|| std::io::Error::other("invalid governor quota"))?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "tower_governor peer listening on http://{}",
        listener.local_addr()?
    );
    // Around the whole router, as `bookshelf::app` wraps it with the real layer.
    let app = GovernorLayer::new(config).layer(bookshelf::routes().with_state(()));
    bookshelf::serve(listener, app, bookshelf::shutdown_signal()).await
}
