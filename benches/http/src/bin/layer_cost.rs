//! The Bookshelf app called in-process (no sockets, no HTTP parsing), with the rate-limit
//! layer (`with`: [`bookshelf::app`] on the server's default store, buckets in this process),
//! without it (`without`: [`bookshelf::routes`]), with the layer added per route by
//! `Router::layer` (`per-route`), or with the layer on a store that reads the system time
//! (`with-system-clock`; `with-three-limits`: also a route and a global limit;
//! `with-recorder`: with a `metrics` recorder installed). Prints the time per request.
//! Timings on a shared machine are noisy; instruction counts are not:
//!
//! ```text
//! cargo build --release -p bucket4rs-http-benches --bin layer_cost
//! valgrind --tool=callgrind target/release/layer_cost with 20000
//! valgrind --tool=callgrind target/release/layer_cost without 20000
//! ```
//!
//! (Each mode makes 1,000 warm-up requests first, so divide the difference by 21,000.)
//!
//! Under valgrind the CPU has no invariant time-stamp counter, so `FastClock` (the `with`
//! store's clock) falls back to `clock_gettime` and calibrates once at start: compare builds
//! with `with-system-clock`, whose clock costs the same under valgrind as outside it.

use std::time::Instant;

use axum::body::Body;
use axum::http::Request;
use bucket4rs_core::SystemNanosClock;
use bucket4rs_tower::RateLimitLayer;
use tower::ServiceExt;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "with".into());
    let n: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let plans = bucket4rs_tower::PlanTable::from_toml(bucket4rs_http_benches::BENCH_PLANS)
        .expect("bench plans");
    let app = match mode.as_str() {
        // The layer added with `Router::layer` (per route), for comparison.
        "per-route" => bookshelf::routes()
            .layer(bookshelf::layer(RateLimitLayer::builder(), plans).expect("layer")),
        "without" => bookshelf::routes(),
        "with" => {
            let app = bookshelf::app(RateLimitLayer::builder(), plans).expect("layer");
            return drive(app, &mode, n);
        }
        "with-system-clock" => {
            let store = RateLimitLayer::builder().clock(SystemNanosClock);
            let app = bookshelf::app(store, plans).expect("layer");
            return drive(app, &mode, n);
        }
        // Three limits per request: the plan, a route limit, a global limit.
        "with-three-limits" => {
            let plans = bucket4rs_tower::PlanTable::from_toml(include_str!(
                "../../bench-plans-three-limits.toml"
            ))
            .expect("bench plans");
            let store = RateLimitLayer::builder().clock(SystemNanosClock);
            let app = bookshelf::app(store, plans).expect("layer");
            return drive(app, &mode, n);
        }
        // One limit, with a `metrics` recorder installed (metrics-util's debugging one).
        "with-recorder" => {
            metrics_util::debugging::DebuggingRecorder::new()
                .install()
                .expect("the only recorder");
            let store = RateLimitLayer::builder().clock(SystemNanosClock);
            let app = bookshelf::app(store, plans).expect("layer");
            return drive(app, &mode, n);
        }
        other => panic!(
            "mode {other:?}: with, with-system-clock, with-three-limits, with-recorder, \
             without or per-route"
        ),
    };
    // As `axum::serve` does (`into_make_service*`): handlers become routes once, not per request.
    drive(app.with_state(()), &mode, n);
}

fn drive<S>(mut svc: S, mode: &str, n: u64)
where
    S: tower::Service<
            Request<Body>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        >,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let once = async |svc: &mut S| {
            let req = Request::get("/books/9781593278281")
                .header("x-api-key", "bench-key")
                .body(Body::empty())
                .expect("request");
            let resp = svc
                .ready()
                .await
                .expect("ready")
                .call(req)
                .await
                .expect("infallible");
            assert!(resp.status().is_success());
            let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                .await
                .expect("body");
            std::hint::black_box(body);
        };
        for _ in 0..1000 {
            once(&mut svc).await;
        }
        let start = Instant::now();
        for _ in 0..n {
            once(&mut svc).await;
        }
        let el = start.elapsed();
        println!(
            "{mode}: {n} requests, {:.0} ns/req",
            el.as_nanos() as f64 / n as f64
        );
    });
}
