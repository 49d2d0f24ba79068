//! The layer's cost per request, in-process (no sockets): a trivial service with and
//! without `RateLimitLayer` (embedded backend, one key, a limit never reached), and a key
//! flood (distinct keys, capped map) with its peak memory.
//!
//! ```text
//! cargo run --release -p bucket4rs-http-benches --bin tower_overhead -- [requests] [flood-keys] [max-keys]
//! ```

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bucket4rs_core::{Bandwidth, BucketConfiguration};
use bucket4rs_tower::FailurePolicy;
use bucket4rs_tower::{Plan, RateLimitLayer};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|s| s.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

async fn run<S>(svc: &S, n: u64, key: impl Fn(u64) -> String) -> (Duration, u64)
where
    S: Service<Request<()>, Response = Response<Bytes>, Error = Infallible> + Clone,
{
    let start = Instant::now();
    let mut ok = 0;
    for i in 0..n {
        let req = Request::get("/books/9781593278281")
            .header("x-api-key", key(i))
            .body(())
            .unwrap();
        if svc.clone().oneshot(req).await.unwrap().status() == StatusCode::OK {
            ok += 1;
        }
    }
    (start.elapsed(), ok)
}

fn main() {
    let n = arg(1, 1_000_000);
    let flood = arg(2, 1_000_000);
    let cap = arg(3, 100_000) as usize;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let inner = tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Bytes::from_static(b"{}")))
        });
        let big = BucketConfiguration::builder()
            .add_bandwidth(
                Bandwidth::builder()
                    .capacity(1_000_000_000_000)
                    .refill_greedy(1_000_000_000, Duration::from_secs(1))
                    .id("bench")
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let layer = RateLimitLayer::builder()
            .plans(Plan::new("bench", big.clone()))
            .build()
            .unwrap();
        let layered = layer.clone().layer(inner);
        // The bucket call alone (no HTTP types), to split the layer's cost.
        let store = layer.local_store().expect("in process");
        let start = Instant::now();
        for _ in 0..n {
            assert!(store.try_consume("bench-key", 1).unwrap());
        }
        println!(
            "{n} try_consume on the layer's in-process store: {:.0} ns each",
            start.elapsed().as_nanos() as f64 / n as f64
        );
        for _ in 0..3 {
            let (bare, _) = run(&inner, n, |_| "bench-key".into()).await;
            let (with, ok) = run(&layered, n, |_| "bench-key".into()).await;
            assert_eq!(ok, n);
            let per = |d: Duration| d.as_nanos() as f64 / n as f64;
            println!(
                "{n} requests: bare {:.0} ns/req, with layer {:.0} ns/req, layer cost {:.0} ns/req",
                per(bare),
                per(with),
                per(with) - per(bare)
            );
        }

        // Key flood: `flood` distinct keys, each 1 token of 20 per minute, map capped at `cap`.
        let per_minute = BucketConfiguration::builder()
            .add_bandwidth(Bandwidth::simple(20, Duration::from_secs(60)).unwrap())
            .build()
            .unwrap();
        let layer = RateLimitLayer::builder()
            .max_keys(cap)
            .plans(Plan::new("per-client", per_minute))
            .failure_policy(FailurePolicy::deny())
            .build()
            .unwrap();
        let svc = layer.clone().layer(inner);
        let before = peak_rss_kib();
        let mut max_len = 0;
        let mut allowed = 0;
        let start = Instant::now();
        let chunk = 10_000;
        let mut done = 0;
        while done < flood {
            let this = chunk.min(flood - done);
            let (_, ok) = run(&svc, this, |i| format!("flood-{}", done + i)).await;
            allowed += ok;
            done += this;
            max_len = max_len.max(layer.local_store().map_or(0, |s| s.len()));
        }
        println!(
            "key flood: {flood} distinct keys in {:.1?}, cap {cap}: {allowed} allowed, {} denied at the cap, \
             map never above {max_len} keys; peak RSS {} MiB (before the flood {} MiB)",
            start.elapsed(),
            flood - allowed,
            peak_rss_kib() / 1024,
            before / 1024
        );
    });
}
