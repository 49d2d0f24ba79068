//! Several limits per request (exactness under concurrency, on both stores), shadow mode,
//! the allowlist, the refusal hook, gRPC refusals and the metrics, read back from a
//! recorder.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bucket4rs_tower::{ClientIp, KeyExtractor, Limit, Plan, RateLimitLayer, ShadowRefusal};
use http::{Request, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::Layer;

use crate::{Resp, body_json, call, hello, req, simple, stores};

/// Requests of 8 clients, 40 each, half on the limited route, from 8 threads at once,
/// against: a plan of 25 per client, a route limit of 30 for everyone, a global limit of
/// 1,000 (no refill: the clock stands still). Then every bucket holds exactly its capacity
/// less what the allowed requests took — a refused request, whichever limit refused it,
/// took nothing in the end.
#[test]
fn several_limits_count_every_token_under_concurrency() {
    for store in stores(10_000) {
        let kind = store.kind;
        let layer = store
            .builder()
            .plans(Plan::new("client", simple(25, Duration::from_secs(3_600))))
            .limit(
                Limit::global("search", simple(30, Duration::from_secs(3_600)))
                    .path_prefix("/search"),
            )
            .limit(Limit::global(
                "all",
                simple(1_000, Duration::from_secs(3_600)),
            ))
            .build()
            .unwrap();
        let svc = layer.clone().layer(hello());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .build()
            .unwrap();
        let allowed = Arc::new(AtomicU64::new(0));
        let allowed_search = Arc::new(AtomicU64::new(0));
        let per_client: Vec<Arc<AtomicU64>> = (0..8).map(|_| Arc::default()).collect();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for (c, mine) in per_client.iter().enumerate() {
                let (svc, allowed, allowed_search, mine) = (
                    svc.clone(),
                    allowed.clone(),
                    allowed_search.clone(),
                    mine.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    for i in 0..40 {
                        let path = if i % 2 == 0 { "/search" } else { "/other" };
                        let r = call(&svc, req(Some(&format!("client-{c}")), path)).await;
                        match r.status() {
                            StatusCode::OK => {
                                allowed.fetch_add(1, Ordering::SeqCst);
                                mine.fetch_add(1, Ordering::SeqCst);
                                if path == "/search" {
                                    allowed_search.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            StatusCode::TOO_MANY_REQUESTS => {}
                            other => panic!("{other}"),
                        }
                        tokio::task::yield_now().await;
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        let (allowed, allowed_search) = (
            allowed.load(Ordering::SeqCst),
            allowed_search.load(Ordering::SeqCst),
        );
        assert!(allowed_search <= 30, "{kind:?}: {allowed_search}");
        // Each client's bucket: 25 less what it was allowed.
        for (c, mine) in per_client.iter().enumerate() {
            let mine = mine.load(Ordering::SeqCst);
            assert!(mine <= 25, "{kind:?}");
            let left = store.tokens(&layer, &format!("client-{c}"), 25);
            assert_eq!(left, 25 - mine as i64, "{kind:?}: client-{c}");
        }
        // The route and the global buckets, read by a fresh client's request on the route.
        let r = rt.block_on(call(&svc, req(Some("probe"), "/search")));
        let rl = r.headers()["ratelimit"].to_str().unwrap().to_owned();
        let search_left = 30 - allowed_search;
        if search_left > 0 {
            assert_eq!(r.status(), StatusCode::OK, "{kind:?}: {rl}");
            assert!(
                rl.contains(&format!(r#""search";r={};"#, search_left - 1)),
                "{kind:?}: {rl}"
            );
            assert!(
                rl.contains(&format!(r#""all";r={};"#, 1_000 - allowed - 1)),
                "{kind:?}: {rl}"
            );
        } else {
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}: {rl}");
            assert!(rl.contains(r#""search";r=0;"#), "{kind:?}: {rl}");
            // The refused probe gave its global token back.
            assert!(
                rl.contains(&format!(r#""all";r={};"#, 1_000 - allowed - 1)),
                "{kind:?}: {rl}"
            );
            let again = rt.block_on(call(&svc, req(Some("probe"), "/other")));
            let rl = again.headers()["ratelimit"].to_str().unwrap().to_owned();
            assert!(
                rl.contains(&format!(r#""all";r={};"#, 1_000 - allowed - 1)),
                "{kind:?}: {rl}"
            );
        }
        println!(
            "{kind:?}: {allowed} of 320 allowed, {allowed_search} of 160 on the limited route"
        );
    }
}

/// The RateLimit fields list every policy; Retry-After is the longest wait of the limits
/// that refuse; the problem names that limit.
#[tokio::test]
async fn the_longest_wait_answers_and_every_policy_is_listed() {
    for store in stores(10_000) {
        let kind = store.kind;
        let svc = store
            .builder()
            .plans(Plan::new("free", simple(1, Duration::from_secs(10))))
            .limit(Limit::per_client(
                "mine",
                simple(1, Duration::from_secs(60)),
            ))
            .build()
            .unwrap()
            .layer(hello());
        let r = call(&svc, req(Some("k"), "/")).await;
        assert_eq!(r.status(), StatusCode::OK, "{kind:?}");
        assert_eq!(
            r.headers()["ratelimit-policy"],
            r#""0";q=1;w=10, "mine";q=1;w=60"#
        );
        assert_eq!(r.headers()["ratelimit"], r#""0";r=0;t=10, "mine";r=0;t=60"#);
        let r = call(&svc, req(Some("k"), "/")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        assert_eq!(r.headers()["retry-after"], "60", "{kind:?}");
        assert_eq!(body_json(&r)["plan"], "mine", "{kind:?}");
        // Another client has its own bucket of the per-client limit.
        assert_eq!(
            call(&svc, req(Some("j"), "/")).await.status(),
            StatusCode::OK
        );
    }
}

/// Shadow mode, per plan and layer-wide: decided, reported, never refused; the would-be
/// refusal is a response extension and a metric outcome.
#[test]
fn shadow_mode_serves_what_it_would_refuse_and_says_so() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            for (what, builder) in [
                (
                    "plan",
                    RateLimitLayer::builder()
                        .plans(Plan::new("trial", simple(1, Duration::from_secs(60))).shadow()),
                ),
                (
                    "layer",
                    RateLimitLayer::builder()
                        .plans(Plan::new("wide", simple(1, Duration::from_secs(60))))
                        .shadow(true),
                ),
            ] {
                let svc = builder.build().unwrap().layer(hello());
                let first = call(&svc, req(Some("k"), "/")).await;
                assert!(
                    first.extensions().get::<ShadowRefusal>().is_none(),
                    "{what}"
                );
                for _ in 0..2 {
                    let r = call(&svc, req(Some("k"), "/")).await;
                    assert_eq!(r.status(), StatusCode::OK, "{what}");
                    assert_eq!(r.headers()["ratelimit"], r#""0";r=0;t=60"#, "{what}");
                    let s = r
                        .extensions()
                        .get::<ShadowRefusal>()
                        .expect("would be refused");
                    assert_eq!(s.retry_after_secs(), 60, "{what}");
                }
            }
        })
    });
    let counts = counters(&snapshotter);
    assert_eq!(counts.get("trial/client/allowed"), Some(&1));
    assert_eq!(counts.get("trial/client/shadow_refused"), Some(&2));
    assert_eq!(counts.get("wide/client/shadow_refused"), Some(&2));
    assert_eq!(counts.get("wide/client/refused").copied().unwrap_or(0), 0);
}

/// The decision counters by `plan/limit/outcome`, and the other counters by name.
fn counters(s: &metrics_util::debugging::Snapshotter) -> std::collections::HashMap<String, u64> {
    let mut out = std::collections::HashMap::new();
    for (key, _, _, value) in s.snapshot().into_vec() {
        tally(&mut out, &key, &value);
    }
    out
}

/// Adds a counter of a snapshot (which resets them) to `out`, named as [`counters`] says.
fn tally(
    out: &mut std::collections::HashMap<String, u64>,
    key: &metrics_util::CompositeKey,
    value: &DebugValue,
) {
    {
        let &DebugValue::Counter(n) = value else {
            return;
        };
        let k = key.key();
        let label = |name: &str| {
            k.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        let name = match (label("plan"), label("limit"), label("outcome")) {
            (Some(p), Some(l), Some(o)) => format!("{p}/{l}/{o}"),
            (p, l, None) => match label("decision").or_else(|| label("kind")) {
                Some(v) => match (p, l) {
                    (Some(p), Some(l)) => format!("{}/{p}/{l}/{v}", k.name()),
                    _ => format!("{}/{v}", k.name()),
                },
                None => k.name().to_owned(),
            },
            _ => k.name().to_owned(),
        };
        *out.entry(name).or_default() += n;
    }
}

/// Metrics of refusals, limits, exemptions, store errors and the failure policy.
#[test]
fn metrics_count_each_decision_by_plan_and_limit() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let svc = RateLimitLayer::builder()
                .plans(Plan::new("free", simple(2, Duration::from_secs(60))))
                .limit(Limit::global("all", simple(3, Duration::from_secs(60))))
                .exempt_keys(["vip"])
                .build()
                .unwrap()
                .layer(hello());
            for _ in 0..3 {
                call(&svc, req(Some("a"), "/")).await; // the third refused by "free"
            }
            call(&svc, req(Some("b"), "/")).await; // the last global token
            for k in ["c", "d"] {
                let r = call(&svc, req(Some(k), "/")).await;
                assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "refused by all");
            }
            call(&svc, req(Some("vip"), "/")).await;
            // A store of one key, that key's bucket not forgettable: a new key meets the
            // failure policy.
            let full = RateLimitLayer::builder()
                .plans(Plan::new("small", simple(2, Duration::from_secs(60))))
                .max_keys(1)
                .failure_policy(bucket4rs_tower::FailurePolicy::deny())
                .build()
                .unwrap()
                .layer(hello());
            assert_eq!(
                call(&full, req(Some("x"), "/")).await.status(),
                StatusCode::OK
            );
            let r = call(&full, req(Some("y"), "/")).await;
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        })
    });
    let counts = counters(&snapshotter);
    // a, a, b, c, d by the plan; a's third refused by it.
    assert_eq!(counts.get("free/client/allowed"), Some(&5), "{counts:?}");
    assert_eq!(counts.get("free/client/refused"), Some(&1), "{counts:?}");
    // a, a, a (given back: "free" refused it), b by the global limit; c and d refused.
    assert_eq!(counts.get("all/all/allowed"), Some(&4), "{counts:?}");
    assert_eq!(counts.get("all/all/refused"), Some(&2), "{counts:?}");
    assert_eq!(
        counts.get("bucket4rs_http_exempt_total"),
        Some(&1),
        "{counts:?}"
    );
    assert_eq!(counts.get("small/client/allowed"), Some(&1), "{counts:?}");
    assert_eq!(
        counts.get("bucket4rs_http_store_errors_total/small/client/full"),
        Some(&1),
        "{counts:?}"
    );
    assert_eq!(
        counts.get("bucket4rs_http_failure_policy_total/small/client/deny"),
        Some(&1),
        "{counts:?}"
    );
}

/// A backend that is down until switched on; then the embedded backend answers.
#[derive(Debug, Default)]
struct Switch {
    up: std::sync::atomic::AtomicBool,
    store: bucket4rs_distributed::EmbeddedBackend,
}

#[async_trait::async_trait]
impl bucket4rs_distributed::Backend for Switch {
    async fn transact(
        &self,
        key: &bucket4rs_distributed::StorageKey,
        tx: &mut dyn bucket4rs_distributed::Transaction,
    ) -> Result<(), bucket4rs_distributed::BackendError> {
        if !self.up.load(Ordering::Relaxed) {
            return Err(crate::refused());
        }
        self.store.transact(key, tx).await
    }
    async fn read(
        &self,
        key: &bucket4rs_distributed::StorageKey,
    ) -> Result<Option<Vec<u8>>, bucket4rs_distributed::BackendError> {
        if !self.up.load(Ordering::Relaxed) {
            return Err(crate::refused());
        }
        self.store.read(key).await
    }
    async fn remove(
        &self,
        key: &bucket4rs_distributed::StorageKey,
    ) -> Result<bool, bucket4rs_distributed::BackendError> {
        self.store.remove(key).await
    }
}

/// The shared store's circuit breaker as a gauge: 0 while closed, 1 once it opened, 0 again
/// after its probe reached the store; the store's errors labelled by plan and limit. A
/// real-clock test: the breaker's probe runs every 10 ms, and the test waits (at most 5 s)
/// for it.
#[test]
fn the_breaker_state_is_a_gauge_and_store_errors_name_their_limit() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Each snapshot resets the counters: they are added up here as the gauge is read.
    let counts = std::cell::RefCell::new(std::collections::HashMap::new());
    let gauge = || {
        let mut open = None;
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            match value {
                DebugValue::Gauge(v) if key.key().name() == "bucket4rs_http_store_breaker_open" => {
                    open = Some(v.into_inner());
                }
                v => tally(&mut counts.borrow_mut(), &key, &v),
            }
        }
        open
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = Arc::new(Switch::default());
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let manager = bucket4rs_distributed::ProxyManager::configure(Arc::clone(&backend))
                .circuit_breaker(bucket4rs_distributed::CircuitBreaker::new(
                    2,
                    Duration::from_millis(10),
                ))
                .build()
                .unwrap();
            let svc = RateLimitLayer::builder()
                .backend(manager.clone())
                .plans(Plan::new("free", simple(5, Duration::from_secs(60))))
                .failure_policy(bucket4rs_tower::FailurePolicy::error())
                .build()
                .unwrap()
                .layer(hello());
            let first = call(&svc, req(Some("k"), "/")).await;
            assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(gauge(), Some(0.0), "one failure: still closed");
            // The second failure opens it (the manager may record that after answering).
            call(&svc, req(Some("k"), "/")).await;
            assert!(manager.is_circuit_open());
            let third = call(&svc, req(Some("k"), "/")).await;
            assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(gauge(), Some(1.0), "a request saw it open");
            backend.up.store(true, Ordering::Relaxed);
            let mut served = false;
            for _ in 0..500 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if call(&svc, req(Some("k"), "/")).await.status() == StatusCode::OK {
                    served = true;
                    break;
                }
            }
            assert!(served, "the probe closed the breaker within 5 s");
            assert_eq!(gauge(), Some(0.0), "closed again");
        })
    });
    let counts = counts.into_inner();
    assert!(
        counts
            .get("bucket4rs_http_store_errors_total/free/client/unavailable")
            .is_some_and(|&n| n >= 3),
        "{counts:?}"
    );
    assert_eq!(
        counts.get("bucket4rs_http_failure_policy_total/free/client/error"),
        counts.get("bucket4rs_http_store_errors_total/free/client/unavailable"),
        "{counts:?}"
    );
}

/// Exempt keys and networks skip limiting altogether: no bucket, no headers.
#[tokio::test]
async fn the_allowlist_skips_limiting() {
    let layer = RateLimitLayer::builder()
        .key(KeyExtractor::client(ClientIp::behind(["10.0.0.0/8"
            .parse()
            .unwrap()])))
        .plans(Plan::new("ip", simple(1, Duration::from_secs(60))))
        .exempt_keys(["198.51.100.1"])
        .exempt_networks(["192.0.2.0/24".parse().unwrap()])
        .build()
        .unwrap();
    let svc = layer.clone().layer(hello());
    let from = |peer: [u8; 4], xff: Option<&str>| {
        let mut r = Request::get("/");
        if let Some(x) = xff {
            r = r.header("x-forwarded-for", x);
        }
        let mut r = r.body(()).unwrap();
        r.extensions_mut()
            .insert(std::net::SocketAddr::from((peer, 1000)));
        r
    };
    for _ in 0..3 {
        for r in [
            from([198, 51, 100, 1], None),
            from([192, 0, 2, 77], None),
            from([10, 0, 0, 1], Some("192.0.2.9")),
        ] {
            let r = call(&svc, r).await;
            assert_eq!(r.status(), StatusCode::OK);
            assert!(r.headers().get("ratelimit").is_none(), "not metered");
        }
    }
    assert!(layer.local_store().unwrap().is_empty());
    // A client that names an exempt network in its own header is not exempt.
    call(&svc, from([203, 0, 113, 5], Some("192.0.2.9"))).await;
    let r = call(&svc, from([203, 0, 113, 5], Some("192.0.2.9"))).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A gRPC call is refused with grpc-status 8 and the wait in retry-after; the hook shapes
/// any refusal.
#[tokio::test]
async fn grpc_refusals_and_the_refusal_hook() {
    let svc = RateLimitLayer::builder()
        .plans(Plan::new("free", simple(1, Duration::from_secs(20))))
        .build()
        .unwrap()
        .layer(hello());
    let grpc = || {
        Request::post("/pkg.Service/Method")
            .header("x-api-key", "k")
            .header("content-type", "application/grpc+proto")
            .body(())
            .unwrap()
    };
    assert_eq!(call(&svc, grpc()).await.status(), StatusCode::OK);
    let r = call(&svc, grpc()).await;
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "gRPC statuses travel in headers"
    );
    assert_eq!(r.headers()["grpc-status"], "8");
    assert_eq!(r.headers()["retry-after"], "20");
    assert_eq!(r.headers()["content-type"], "application/grpc");
    assert!(r.headers().get("ratelimit").is_some());

    let hooked = RateLimitLayer::builder()
        .plans(Plan::new("free", simple(1, Duration::from_secs(20))))
        .on_refusal(|refusal, resp| {
            *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            resp.headers_mut()
                .insert("x-limit", refusal.limit().parse().unwrap());
            *resp.body_mut() = bytes::Bytes::from(format!("wait {}", refusal.retry_after_secs()));
        })
        .build()
        .unwrap()
        .layer(hello());
    call(&hooked, req(Some("k"), "/")).await;
    let r: Resp = call(&hooked, req(Some("k"), "/")).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["x-limit"], "free");
    assert_eq!(r.headers()["retry-after"], "20", "the layer's headers stay");
    assert_eq!(r.body(), "wait 20");
}
