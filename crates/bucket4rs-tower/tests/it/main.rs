//! Integration tests of the layer, in-process with a manual clock (no sockets, no sleeps).

use std::convert::Infallible;
use std::time::Duration;

use async_trait::async_trait;
use bucket4rs_core::{Bandwidth, BucketConfiguration, ManualClock};
use bucket4rs_distributed::{
    Backend, BackendClock, BackendError, BackendErrorKind, EmbeddedBackend, FailurePolicy,
    ProxyManager, StorageKey, Transaction,
};
use bucket4rs_tower::{KeyExtractor, Plan, PlanResolver, PlanTable, RateLimitLayer};
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};

type Resp = Response<Bytes>;

fn hello()
-> impl Service<Request<()>, Response = Resp, Error = Infallible, Future: Send> + Clone + Send + 'static
{
    tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Bytes::from_static(b"hello")))
    })
}

fn bw(id: &str, capacity: u64, period: Duration) -> Bandwidth {
    Bandwidth::builder()
        .capacity(capacity)
        .refill_greedy(capacity, period)
        .id(id)
        .build()
        .unwrap()
}

fn free_plan() -> Plan {
    let config = BucketConfiguration::builder()
        .add_bandwidth(bw("burst", 20, Duration::from_secs(60)))
        .add_bandwidth(bw("daily", 1000, Duration::from_secs(86_400)))
        .build()
        .unwrap();
    Plan::new("free", config)
}

fn manual() -> (ManualClock, ProxyManager<EmbeddedBackend>) {
    let clock = ManualClock::new(1_000_000_000);
    let manager =
        ProxyManager::new(EmbeddedBackend::with_clock(clock.clone()).with_max_keys(10_000));
    (clock, manager)
}

fn req(key: Option<&str>, path: &str) -> Request<()> {
    let mut b = Request::get(path);
    if let Some(k) = key {
        b = b.header("x-api-key", k);
    }
    b.body(()).unwrap()
}

async fn call<S>(svc: &S, r: Request<()>) -> Resp
where
    S: Service<Request<()>, Response = Resp, Error = Infallible> + Clone,
{
    svc.clone().oneshot(r).await.unwrap()
}

fn body_json(r: &Resp) -> serde_json::Value {
    serde_json::from_slice(r.body()).unwrap()
}

#[tokio::test]
async fn twenty_allowed_then_429_with_per_bandwidth_headers() {
    let (clock, manager) = manual();
    let layer = RateLimitLayer::builder()
        .backend(manager)
        .plans(free_plan())
        .remaining_header(true)
        .build();
    let svc = layer.layer(hello());
    for i in 1..=20u64 {
        let r = call(&svc, req(Some("k"), "/books/1")).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()["ratelimit-policy"],
            r#""burst";q=20;w=60, "daily";q=1000;w=86400"#
        );
        let burst_t = if i == 20 { 3 } else { 0 };
        assert_eq!(
            r.headers()["ratelimit"].to_str().unwrap(),
            format!(
                r#""burst";r={};t={burst_t}, "daily";r={};t=0"#,
                20 - i,
                1000 - i
            )
        );
        assert_eq!(
            r.headers()["x-rate-limit-remaining"],
            (20 - i).to_string().as_str()
        );
    }
    let r = call(&svc, req(Some("k"), "/books/1")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "3");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(
        r.headers()["ratelimit"],
        r#""burst";r=0;t=3, "daily";r=980;t=0"#
    );
    let body = body_json(&r);
    assert_eq!(body["status"], 429);
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["type"], "about:blank");
    assert_eq!(body["retry_after"], 3);
    assert_eq!(body["plan"], "free");

    // 1 ns short of a token: still limited, and Retry-After rounds up to 1 (never 0).
    clock.advance(Duration::from_nanos(2_999_999_999));
    let r = call(&svc, req(Some("k"), "/books/1")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    clock.advance(Duration::from_nanos(1));
    assert_eq!(
        call(&svc, req(Some("k"), "/books/1")).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn costs_come_from_the_request_and_over_capacity_is_a_configuration_error() {
    let (_clock, manager) = manual();
    let layer = RateLimitLayer::builder()
        .backend(manager)
        .plans(free_plan())
        .cost(|r| match r.uri().path() {
            "/search" => 5,
            "/export" => u64::MAX,
            "/health" => 0,
            _ => 1,
        })
        .build();
    let svc = layer.clone().layer(hello());
    for _ in 0..4 {
        assert_eq!(
            call(&svc, req(Some("k"), "/search")).await.status(),
            StatusCode::OK
        );
    }
    let r = call(&svc, req(Some("k"), "/search")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "15");
    assert_eq!(body_json(&r)["cost"], 5);

    let r = call(&svc, req(Some("other"), "/export")).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.headers().get("retry-after").is_none());
    let body = body_json(&r);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .starts_with("cost exceeds capacity"),
        "{body}"
    );
    assert_eq!(body["capacity"], 20);
    // Cost 0 is unmetered: no bucket, no headers.
    let r = call(&svc, req(Some("third"), "/health")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("ratelimit").is_none());
    assert_eq!(layer.manager().backend().len(), 1, "only `k` has a bucket");
}

#[tokio::test]
async fn missing_malformed_and_unknown_keys_never_reach_the_backend() {
    let (_clock, manager) = manual();
    let table = PlanTable::from_toml(
        r#"
        [plans.free]
        limits = ["20 per minute"]
        [keys]
        good = "free"
        "#,
    )
    .unwrap();
    let layer = RateLimitLayer::builder()
        .backend(manager)
        .plans(table)
        .build();
    let svc = layer.clone().layer(hello());

    let r = call(&svc, req(None, "/")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["www-authenticate"], "ApiKey");
    assert_eq!(body_json(&r)["status"], 401);

    let mut bad = req(None, "/");
    bad.headers_mut().insert(
        "x-api-key",
        HeaderValue::from_bytes(b"caf\xc3\xa9 \xff").unwrap(),
    );
    assert_eq!(call(&svc, bad).await.status(), StatusCode::UNAUTHORIZED);
    let huge = "k".repeat(10_000);
    assert_eq!(
        call(&svc, req(Some(&huge), "/")).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&svc, req(Some("nobody"), "/")).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&svc, req(Some("good"), "/")).await.status(),
        StatusCode::OK
    );
    assert_eq!(layer.manager().backend().len(), 1);

    let forbidding = RateLimitLayer::builder()
        .plans(|_: &str| -> Option<Plan> { None })
        .unknown_key_status(StatusCode::FORBIDDEN)
        .build()
        .layer(hello());
    let r = call(&forbidding, req(Some("x"), "/")).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.headers().get("www-authenticate").is_none());
}

#[tokio::test]
async fn client_ip_and_closure_keys() {
    let (_clock, manager) = manual();
    let one = BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(1, Duration::from_secs(60)).unwrap())
        .build()
        .unwrap();
    let svc = RateLimitLayer::builder()
        .backend(manager)
        .key(KeyExtractor::client_ip())
        .plans(Plan::new("per-ip", one.clone()))
        .build()
        .layer(hello());
    let from = |ip: [u8; 4]| {
        let mut r = req(None, "/");
        r.extensions_mut()
            .insert(std::net::SocketAddr::from((ip, 5555)));
        r
    };
    assert_eq!(
        call(&svc, from([10, 0, 0, 1])).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        call(&svc, from([10, 0, 0, 1])).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        call(&svc, from([10, 0, 0, 2])).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        call(&svc, req(None, "/")).await.status(),
        StatusCode::UNAUTHORIZED
    );

    let by_tenant = RateLimitLayer::builder()
        .key(KeyExtractor::from_fn(|r| {
            r.uri().path().split('/').nth(1).map(str::to_owned)
        }))
        .plans(Plan::new("tenant", one))
        .build()
        .layer(hello());
    assert_eq!(
        call(&by_tenant, req(None, "/acme/a")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        call(&by_tenant, req(None, "/acme/b")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        call(&by_tenant, req(None, "/globex/a")).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_changed_plan_takes_over_the_existing_bucket() {
    let (_clock, manager) = manual();
    let small = Plan::new(
        "free",
        BucketConfiguration::builder()
            .add_bandwidth(bw("burst", 2, Duration::from_secs(60)))
            .build()
            .unwrap(),
    );
    let big = Plan::new(
        "pro",
        BucketConfiguration::builder()
            .add_bandwidth(bw("burst", 200, Duration::from_secs(60)))
            .build()
            .unwrap(),
    );
    let upgraded = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = upgraded.clone();
    let svc = RateLimitLayer::builder()
        .backend(manager)
        .plans(move |_: &str| {
            Some(if flag.load(std::sync::atomic::Ordering::SeqCst) {
                big.clone()
            } else {
                small.clone()
            })
        })
        .build()
        .layer(hello());
    call(&svc, req(Some("k"), "/")).await;
    call(&svc, req(Some("k"), "/")).await;
    assert_eq!(
        call(&svc, req(Some("k"), "/")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    upgraded.store(true, std::sync::atomic::Ordering::SeqCst);
    // The request that sees the new plan is still decided by the stored (free) bucket, which
    // is then switched to pro, keeping its tokens (none): pro refills 200/min, i.e. 1 per 0.3 s.
    let r = call(&svc, req(Some("k"), "/")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = call(&svc, req(Some("k"), "/")).await;
    assert_eq!(r.headers()["ratelimit-policy"], r#""burst";q=200;w=60"#);
}

/// A backend that is always down.
#[derive(Debug)]
struct Down;

#[async_trait]
impl Backend for Down {
    async fn transact(&self, _: &StorageKey, _: &mut dyn Transaction) -> Result<(), BackendError> {
        Err(BackendError::new(
            BackendErrorKind::Unavailable,
            "connection refused",
        ))
    }
    async fn read(&self, _: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        Err(BackendError::new(
            BackendErrorKind::Unavailable,
            "connection refused",
        ))
    }
    async fn remove(&self, _: &StorageKey) -> Result<bool, BackendError> {
        Err(BackendError::new(
            BackendErrorKind::Unavailable,
            "connection refused",
        ))
    }
}

/// The embedded backend behind one `yield_now`: its answer is not there at the first poll.
/// `in_process` says what it claims (the layer polls an in-process backend once in `call`).
#[derive(Debug)]
struct Yielding {
    inner: EmbeddedBackend,
    in_process: bool,
}

#[async_trait]
impl Backend for Yielding {
    async fn transact(
        &self,
        key: &StorageKey,
        tx: &mut dyn Transaction,
    ) -> Result<(), BackendError> {
        tokio::task::yield_now().await;
        self.inner.transact(key, tx).await
    }
    async fn read(&self, key: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        self.inner.read(key).await
    }
    async fn remove(&self, key: &StorageKey) -> Result<bool, BackendError> {
        self.inner.remove(key).await
    }
    fn clock(&self) -> BackendClock {
        self.inner.clock()
    }
    fn is_in_process(&self) -> bool {
        self.in_process
    }
}

/// Status and rate-limit headers of 22 requests on one key (the 21st and 22nd refused).
async fn answers<S>(svc: &S) -> Vec<(StatusCode, Option<HeaderValue>, Option<HeaderValue>)>
where
    S: Service<Request<()>, Response = Resp, Error = Infallible> + Clone,
{
    let mut out = Vec::new();
    for _ in 0..22 {
        let r = call(svc, req(Some("k"), "/books/1")).await;
        let h = |name: &str| r.headers().get(name).cloned();
        out.push((r.status(), h("ratelimit"), h("retry-after")));
    }
    out
}

#[tokio::test]
async fn a_backend_that_answers_later_gets_the_same_answers() {
    let (_, manager) = manual();
    let svc = RateLimitLayer::builder()
        .backend(manager)
        .plans(free_plan())
        .build()
        .layer(hello());
    let expected = answers(&svc).await;
    assert_eq!(expected[19].0, StatusCode::OK);
    assert_eq!(expected[20].0, StatusCode::TOO_MANY_REQUESTS);
    assert!(expected.iter().all(|(_, rl, _)| rl.is_some()));
    for in_process in [false, true] {
        let clock = ManualClock::new(1_000_000_000);
        let backend = Yielding {
            inner: EmbeddedBackend::with_clock(clock),
            in_process,
        };
        let svc = RateLimitLayer::builder()
            .backend(ProxyManager::new(backend))
            .plans(free_plan())
            .build()
            .layer(hello());
        assert_eq!(answers(&svc).await, expected, "in_process: {in_process}");
    }
}

#[tokio::test]
async fn backend_failures_follow_the_failure_policy_never_a_silent_allow() {
    let layer = |policy| {
        RateLimitLayer::builder()
            .backend(ProxyManager::new(Down))
            .plans(free_plan())
            .failure_policy(policy)
            .build()
            .layer(hello())
    };
    let r = call(&layer(FailurePolicy::error()), req(Some("k"), "/")).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert!(
        body_json(&r)["detail"]
            .as_str()
            .unwrap()
            .contains("connection refused")
    );

    let r = call(&layer(FailurePolicy::deny()), req(Some("k"), "/")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    let detail = body_json(&r)["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("connection refused") && detail.contains("failure policy"),
        "{detail}"
    );

    let two = BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(2, Duration::from_secs(60)).unwrap())
        .build()
        .unwrap();
    let svc = layer(FailurePolicy::fallback(two));
    assert_eq!(
        call(&svc, req(Some("k"), "/")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        call(&svc, req(Some("k"), "/")).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        call(&svc, req(Some("k"), "/")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        call(&svc, req(Some("j"), "/")).await.status(),
        StatusCode::OK
    );
}

async fn flood<S>(svc: &S, round: usize) -> (usize, usize)
where
    S: Service<Request<()>, Response = Resp, Error = Infallible> + Clone,
{
    let (mut ok, mut denied) = (0, 0);
    for i in 0..1_000 {
        let r = call(svc, req(Some(&format!("flood-{round}-{i}")), "/")).await;
        match r.status() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => denied += 1,
            s => panic!("unexpected {s}"),
        }
    }
    (ok, denied)
}

#[tokio::test]
async fn a_key_flood_never_grows_past_the_cap_and_busy_clients_keep_their_bucket() {
    const CAP: usize = 100;
    let clock = ManualClock::new(1_000_000_000);
    let manager = ProxyManager::new(EmbeddedBackend::with_clock(clock.clone()).with_max_keys(CAP));
    let five = BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(5, Duration::from_secs(1)).unwrap())
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder()
        .backend(manager)
        .plans(Plan::new("per-client", five))
        .failure_policy(FailurePolicy::deny())
        .build();
    let svc = layer.clone().layer(hello());
    let len = || layer.manager().backend().len();

    // A busy client empties its bucket.
    for _ in 0..5 {
        assert_eq!(
            call(&svc, req(Some("busy"), "/")).await.status(),
            StatusCode::OK
        );
    }
    let mut max_len = len();
    let mut round = 0;
    let (ok, denied) = flood(&svc, round).await;
    max_len = max_len.max(len());
    // No flood key has refilled yet: exactly CAP - 1 got in, the rest met the deny policy.
    assert_eq!((ok, denied), (CAP - 1, 1_000 - (CAP - 1)));
    assert_eq!(
        call(&svc, req(Some("busy"), "/")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    for _ in 0..5 {
        // Flood keys (1 token of 5 used) are full again after 0.2 s and expire 1 s later
        // (the TTL margin); the busy client keeps draining its bucket and never expires.
        clock.advance(Duration::from_millis(1_500));
        round += 1;
        let mut busy_ok = 0;
        for _ in 0..6 {
            if call(&svc, req(Some("busy"), "/")).await.status() == StatusCode::OK {
                busy_ok += 1;
            }
        }
        assert_eq!(
            busy_ok, 5,
            "the busy client gets its refill (5/s for 1.5 s, capped), not a fresh bucket"
        );
        let (ok, _) = flood(&svc, round).await;
        assert_eq!(ok, CAP - 1, "expired flood keys were evicted to make room");
        let r = call(&svc, req(Some("busy"), "/")).await;
        assert_eq!(
            r.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "the busy client was not handed a fresh bucket"
        );
        max_len = max_len.max(len());
        assert!(len() <= CAP);
    }
    assert!(max_len <= CAP, "map grew to {max_len}");
}

#[test]
fn plans_file_errors_name_the_field() {
    let err = |text: &str| PlanTable::from_toml(text).unwrap_err().to_string();
    assert_eq!(
        err("[plans.free]\nlimits = [{ capacity = 20, refill = 20, period = \"1 fortnight\" }]"),
        r#"plans.free.limits[0].period: "1 fortnight" is not a duration"#
    );
    assert_eq!(
        err("[plans.pro]\nlimits = [\"5/s\", { capcity = 3, period = \"1s\" }]"),
        "plans.pro.limits[1].capcity: unknown field (expected one of id, capacity, refill, \
         period, rate, initial_tokens, refill_kind)"
    );
    assert_eq!(
        err("[plans.free]\nlimits = [\"lots per minute\"]"),
        r#"plans.free.limits[0]: "lots per minute" is not a rate (expected e.g. "20 per minute" or "20/1m")"#
    );
    assert_eq!(
        err("[plans.free]\nlimits = [{ capacity = -1, period = \"1s\" }]"),
        "plans.free.limits[0].capacity: must not be negative, found -1"
    );
    assert_eq!(
        err("[plans.free]\nlimits = [{ capacity = 0, period = \"1s\" }]"),
        format!(
            "plans.free.limits[0]: {}",
            Bandwidth::builder()
                .capacity(0)
                .refill_greedy(0, Duration::from_secs(1))
                .build()
                .unwrap_err()
        )
    );
    assert_eq!(
        err("[plans.free]\nlimits = [{ capacity = 5, period = \"0s\" }]"),
        r#"plans.free.limits[0].period: "0s" is zero; a period must be positive"#
    );
    assert_eq!(
        err("[plans.free]\nlimits = [{ id = \"a\", rate = \"1/s\" }, { id = \"a\", rate = \"2/s\" }]")
            .split(':')
            .next()
            .unwrap(),
        "plans.free.limits"
    );
    assert_eq!(
        err("[plans.free]\nlimits = [\"1/s\"]\n[keys]\nk1 = \"gold\""),
        r#"keys.k1: plan "gold" is not defined in [plans]"#
    );
    assert_eq!(err("[plans]"), "plans: define at least one plan");
    assert_eq!(
        err("[plan.free]"),
        "plan: unknown field (expected `plans` or `keys`)"
    );
    assert!(err("[plans.free\nlimits = 3").starts_with("invalid TOML: "));
    // Every shape of limit.
    let t = PlanTable::from_toml(
        r#"
        [plans.p]
        limits = [
          "20 per minute",
          "1000/day",
          { id = "burst", capacity = 10, refill = 1, period = "6s" },
          { id = "hourly", rate = "500 per 1h", initial_tokens = 100 },
          { id = "window", capacity = 60, period = "1 minute", refill_kind = "intervally" },
        ]
        "#,
    )
    .unwrap();
    let plan = t.plan("p").unwrap();
    assert_eq!(
        plan.policy_header(),
        r#""0";q=20;w=60, "1";q=1000;w=86400, "burst";q=10;w=60, "hourly";q=500;w=3600, "window";q=60;w=60"#
    );
}

/// A plan resolver that counts its `resolve` calls, and passes `fixed_plans` on.
struct Counting<R> {
    inner: R,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<R: PlanResolver> PlanResolver for Counting<R> {
    fn resolve(&self, key: &str) -> Option<Plan> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.resolve(key)
    }
    fn fixed_plans(&self) -> Option<Vec<Plan>> {
        self.inner.fixed_plans()
    }
}

fn two_plans() -> PlanTable {
    PlanTable::from_toml(
        r#"
        [plans.free]
        limits = [{ id = "burst", capacity = 20, refill = 20, period = "1 minute" }]
        [plans.pro]
        limits = [{ id = "burst", capacity = 200, refill = 200, period = "1 minute" }]
        [keys]
        f = "free"
        p = "pro"
        "#,
    )
    .unwrap()
}

/// With fixed plans (a plans file) a key is resolved only when it has no live bucket: its
/// plan is read off the bucket's configuration, with the same answers as resolving it.
#[tokio::test]
async fn a_known_client_of_fixed_plans_is_resolved_once() {
    let (clock, manager) = manual();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = || calls.load(std::sync::atomic::Ordering::SeqCst);
    let layer = RateLimitLayer::builder()
        .backend(manager)
        .plans(Counting {
            inner: two_plans(),
            calls: calls.clone(),
        })
        .cost(|r| match r.uri().path() {
            "/search" => 50,
            "/export" => u64::MAX,
            _ => 1,
        })
        .build();
    let svc = layer.clone().layer(hello());
    for i in 1..=25u64 {
        let r = call(&svc, req(Some("f"), "/books/1")).await;
        if i <= 20 {
            assert_eq!(r.status(), StatusCode::OK, "request {i}");
            assert_eq!(r.headers()["ratelimit-policy"], r#""burst";q=20;w=60"#);
            let t = if i == 20 { 3 } else { 0 };
            assert_eq!(
                r.headers()["ratelimit"].to_str().unwrap(),
                format!(r#""burst";r={};t={t}"#, 20 - i)
            );
        } else {
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "request {i}");
            assert_eq!(r.headers()["retry-after"], "3");
            assert_eq!(body_json(&r)["plan"], "free");
        }
    }
    assert_eq!(count(), 1, "resolved for the bucket's creation only");

    // Each plan is read off its own bucket, with its own capacity for the cost check.
    for _ in 0..3 {
        call(&svc, req(Some("p"), "/books/1")).await;
    }
    let r = call(&svc, req(Some("p"), "/search")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["ratelimit"], r#""burst";r=147;t=0"#);
    assert_eq!(count(), 2);

    // A cost beyond the key's plan is answered from the plan, the bucket untouched.
    clock.advance(Duration::from_secs(3));
    let r = call(&svc, req(Some("f"), "/search")).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body_json(&r)["capacity"], 20);
    let r = call(&svc, req(Some("p"), "/export")).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(count(), 4);
    let r = call(&svc, req(Some("f"), "/books/1")).await;
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "the token refilled in 3 s is there"
    );
    assert_eq!(r.headers()["ratelimit"], r#""burst";r=0;t=3"#);

    // An unknown key is resolved (and refused) each time; no bucket is made for it.
    for _ in 0..2 {
        let r = call(&svc, req(Some("u"), "/books/1")).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(count(), 6);
    assert_eq!(layer.manager().backend().len(), 2);

    // Once a bucket has expired (full again, past the TTL margin), the key is resolved
    // again, and gets a fresh bucket of its plan.
    clock.advance(Duration::from_secs(3_600));
    let r = call(&svc, req(Some("f"), "/books/1")).await;
    assert_eq!(r.headers()["ratelimit"], r#""burst";r=19;t=0"#);
    assert_eq!(count(), 7);

    // A resolver whose answers may change (a closure) is asked on every request.
    let (_clock, manager) = manual();
    let table = two_plans();
    let changing = Counting {
        inner: move |key: &str| table.resolve(key),
        calls: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    };
    let calls = changing.calls.clone();
    let svc = RateLimitLayer::builder()
        .backend(manager)
        .plans(changing)
        .build()
        .layer(hello());
    for _ in 0..3 {
        call(&svc, req(Some("f"), "/books/1")).await;
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// With fixed plans, a key whose live bucket holds a configuration none of the plans has
/// (made by another user of the store) is left to the resolving path, which answers from
/// the stored bucket and switches it to the key's plan, as for a changed plan.
#[tokio::test]
async fn a_bucket_under_another_configuration_is_switched_to_the_plan() {
    let (_clock, manager) = manual();
    let other = BucketConfiguration::builder()
        .add_bandwidth(bw("burst", 2, Duration::from_secs(60)))
        .build()
        .unwrap();
    let b = manager.in_process_bucket("f", &other).unwrap().unwrap();
    assert!(b.try_consume(1).unwrap().value);
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let layer = RateLimitLayer::builder()
        .backend(manager.clone())
        .plans(Counting {
            inner: two_plans(),
            calls: calls.clone(),
        })
        .build();
    let svc = layer.layer(hello());
    let r = call(&svc, req(Some("f"), "/books/1")).await;
    assert_eq!(r.status(), StatusCode::OK);
    // Decided by the stored bucket (its last token), reported under its own policy.
    assert_eq!(r.headers()["ratelimit-policy"], r#""burst";q=2;w=60"#);
    assert_eq!(r.headers()["ratelimit"], r#""burst";r=0;t=30"#);
    let stored = manager.configuration("f").await.unwrap().unwrap();
    assert_eq!(
        stored.bandwidths()[0].capacity(),
        20,
        "switched to the free plan"
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    // From then on, the free plan's bucket (no tokens kept) is read without resolving.
    let r = call(&svc, req(Some("f"), "/books/1")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["ratelimit-policy"], r#""burst";q=20;w=60"#);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}
