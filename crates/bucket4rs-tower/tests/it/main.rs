//! Integration tests of the layer with a manual clock (no sockets, no sleeps), each
//! behavioural test on both stores: the in-process one (`.clock(..)`, `.max_keys(..)`) and a
//! shared one (`.backend(..)`: the embedded backend through the async manager).

mod conformance;
mod counted;
mod leasing;
mod limits;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bucket4rs_core::{Bandwidth, BucketConfiguration, ManualClock, TokensInheritanceStrategy};
use bucket4rs_distributed::{
    Backend, BackendClock, BackendError, BackendErrorKind, EmbeddedBackend, ProxyManager,
    StorageKey, Transaction,
};
use bucket4rs_tower::{
    FailurePolicy, KeyExtractor, Plan, PlanResolver, PlanTable, RateLimitLayer,
    RateLimitLayerBuilder,
};
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

fn simple(capacity: u64, period: Duration) -> BucketConfiguration {
    BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(capacity, period).unwrap())
        .build()
        .unwrap()
}

/// Which store a layer keeps its buckets in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The in-process `KeyedBucket` (the default store).
    InProcess,
    /// The embedded backend behind a `ProxyManager` (as Redis or PostgreSQL would be).
    Remote,
}

/// One store on its own manual clock, to build layers on.
struct Store {
    kind: Kind,
    clock: ManualClock,
    /// The remote store's manager (a clone shares the backend with the layer's).
    manager: Option<ProxyManager<EmbeddedBackend>>,
    max_keys: usize,
}

impl Store {
    fn new(kind: Kind, max_keys: usize) -> Self {
        let clock = ManualClock::new(1_000_000_000);
        // No TTL margin: the store expires a record when its TTL says, so a key is forgotten
        // exactly when full again, as in the in-process store.
        let manager = (kind == Kind::Remote).then(|| {
            ProxyManager::configure(
                EmbeddedBackend::with_clock(clock.clone())
                    .with_max_keys(max_keys)
                    .unwrap(),
            )
            .ttl_margin(Duration::ZERO)
            .build()
            .unwrap()
        });
        Self {
            kind,
            clock,
            manager,
            max_keys,
        }
    }

    /// A layer builder on this store (every other setting at its default).
    fn builder(&self) -> RateLimitLayerBuilder {
        match &self.manager {
            None => RateLimitLayer::builder()
                .clock(self.clock.clone())
                .max_keys(self.max_keys),
            // The clock of the buckets in this process: the fallback limit's.
            Some(manager) => RateLimitLayer::builder()
                .backend(manager.clone())
                .clock(self.clock.clone()),
        }
    }

    /// The tokens of `key`'s bucket (a plan of `capacity` when it has none).
    fn tokens(&self, layer: &RateLimitLayer, key: &str, capacity: u64) -> i64 {
        match &self.manager {
            None => layer.local_store().unwrap().available_tokens(key).unwrap(),
            Some(manager) => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let b = manager
                    .builder()
                    .build(key, move || simple(capacity, Duration::from_secs(3_600)))
                    .unwrap();
                rt.block_on(b.available_tokens()).unwrap()
            }
        }
    }

    /// How many keys have a bucket in this store (`layer` is the layer built on it).
    fn keys(&self, layer: &RateLimitLayer) -> usize {
        match &self.manager {
            None => layer.local_store().expect("an in-process store").len(),
            Some(manager) => {
                assert!(
                    layer.local_store().is_none(),
                    "a remote layer has no local store"
                );
                manager.backend().len()
            }
        }
    }
}

/// Both stores, each on a fresh clock at 1 s, capped at `max_keys` keys.
fn stores(max_keys: usize) -> [Store; 2] {
    [
        Store::new(Kind::InProcess, max_keys),
        Store::new(Kind::Remote, max_keys),
    ]
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
    for store in stores(10_000) {
        let kind = store.kind;
        let layer = store
            .builder()
            .plans(free_plan())
            .remaining_header(true)
            .build()
            .unwrap();
        let svc = layer.layer(hello());
        for i in 1..=20u64 {
            let r = call(&svc, req(Some("k"), "/books/1")).await;
            assert_eq!(r.status(), StatusCode::OK, "{kind:?} request {i}");
            assert_eq!(
                r.headers()["ratelimit-policy"],
                r#""burst";q=20;w=60, "daily";q=1000;w=86400"#,
                "{kind:?}"
            );
            let burst_t = if i == 20 { 3 } else { 0 };
            assert_eq!(
                r.headers()["ratelimit"].to_str().unwrap(),
                format!(
                    r#""burst";r={};t={burst_t}, "daily";r={};t=0"#,
                    20 - i,
                    1000 - i
                ),
                "{kind:?}"
            );
            assert_eq!(
                r.headers()["x-rate-limit-remaining"],
                (20 - i).to_string().as_str(),
                "{kind:?}"
            );
            assert!(r.headers().get("retry-after").is_none(), "{kind:?}");
            assert_eq!(r.body(), "hello", "{kind:?}: the inner service answered");
        }
        let r = call(&svc, req(Some("k"), "/books/1")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        assert_eq!(r.headers()["retry-after"], "3", "{kind:?}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        assert_eq!(
            r.headers()["ratelimit"],
            r#""burst";r=0;t=3, "daily";r=980;t=0"#,
            "{kind:?}"
        );
        assert_eq!(r.headers()["x-rate-limit-remaining"], "0", "{kind:?}");
        let body = body_json(&r);
        assert_eq!(body["status"], 429);
        assert_eq!(body["title"], "Too Many Requests");
        assert_eq!(body["type"], "about:blank");
        assert_eq!(body["retry_after"], 3);
        assert_eq!(body["plan"], "free");
        assert_eq!(body["cost"], 1);
        assert_eq!(body["remaining"], 0);

        // Half a token's wait left: Retry-After rounds up.
        store.clock.advance(Duration::from_millis(1_500));
        let r = call(&svc, req(Some("k"), "/books/1")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        assert_eq!(r.headers()["retry-after"], "2", "{kind:?}");
        assert_eq!(
            r.headers()["ratelimit"],
            r#""burst";r=0;t=2, "daily";r=980;t=0"#,
            "{kind:?}"
        );
        // 1 ns short of a token: still limited, and Retry-After rounds up to 1 (never 0).
        store.clock.advance(Duration::from_nanos(1_499_999_999));
        let r = call(&svc, req(Some("k"), "/books/1")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        assert_eq!(r.headers()["retry-after"], "1", "{kind:?}");
        store.clock.advance(Duration::from_nanos(1));
        let r = call(&svc, req(Some("k"), "/books/1")).await;
        assert_eq!(r.status(), StatusCode::OK, "{kind:?}");
        assert_eq!(
            r.headers()["ratelimit"],
            r#""burst";r=0;t=3, "daily";r=979;t=0"#,
            "{kind:?}"
        );
        assert_eq!(store.keys(&layer), 1, "{kind:?}");
    }
}

#[tokio::test]
async fn costs_come_from_the_request_and_over_capacity_is_a_configuration_error() {
    for store in stores(10_000) {
        let kind = store.kind;
        let layer = store
            .builder()
            .plans(free_plan())
            .cost(|r| match r.uri().path() {
                "/search" => 5,
                "/export" => u64::MAX,
                "/bulk" => 21,
                "/health" => 0,
                _ => 1,
            })
            .build()
            .unwrap();
        let svc = layer.clone().layer(hello());
        for _ in 0..4 {
            assert_eq!(
                call(&svc, req(Some("k"), "/search")).await.status(),
                StatusCode::OK,
                "{kind:?}"
            );
        }
        let r = call(&svc, req(Some("k"), "/search")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        assert_eq!(r.headers()["retry-after"], "15", "{kind:?}");
        assert_eq!(
            r.headers()["ratelimit"],
            r#""burst";r=0;t=15, "daily";r=980;t=0"#
        );
        assert_eq!(body_json(&r)["cost"], 5);

        let r = call(&svc, req(Some("other"), "/export")).await;
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "{kind:?}");
        assert!(r.headers().get("retry-after").is_none());
        assert!(r.headers().get("ratelimit").is_none());
        let body = body_json(&r);
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .starts_with("cost exceeds capacity"),
            "{kind:?}: {body}"
        );
        assert_eq!(body["capacity"], 20);
        assert_eq!(body["cost"], u64::MAX);
        assert_eq!(body["plan"], "free");
        // Beyond the capacity of a bucket that exists: answered 500, the bucket untouched.
        for path in ["/export", "/bulk"] {
            let r = call(&svc, req(Some("k"), path)).await;
            assert_eq!(
                r.status(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "{kind:?} {path}"
            );
            assert_eq!(body_json(&r)["capacity"], 20, "{kind:?} {path}");
        }
        let r = call(&svc, req(Some("fresh"), "/bulk")).await;
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "{kind:?}");
        assert_eq!(body_json(&r)["cost"], 21);
        // Cost 0 is unmetered: no bucket, no headers (even on a key whose bucket is empty).
        for key in ["third", "k"] {
            let r = call(&svc, req(Some(key), "/health")).await;
            assert_eq!(r.status(), StatusCode::OK, "{kind:?} {key}");
            assert!(r.headers().get("ratelimit").is_none(), "{kind:?} {key}");
            assert!(
                r.headers().get("ratelimit-policy").is_none(),
                "{kind:?} {key}"
            );
        }
        assert_eq!(store.keys(&layer), 1, "{kind:?}: only `k` has a bucket");
        // `k` kept its state through the 500 and the unmetered request: still empty, one
        // token 3 s later, a search (5) refused with that token left, 4 × 3 s to wait.
        store.clock.advance(Duration::from_secs(3));
        let r = call(&svc, req(Some("k"), "/search")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        assert_eq!(r.headers()["retry-after"], "12", "{kind:?}");
        assert_eq!(body_json(&r)["remaining"], 1, "{kind:?}");
        let r = call(&svc, req(Some("k"), "/books/1")).await;
        assert_eq!(r.status(), StatusCode::OK, "{kind:?}");
        assert_eq!(
            r.headers()["ratelimit"],
            r#""burst";r=0;t=3, "daily";r=979;t=0"#
        );
    }
}

#[tokio::test]
async fn missing_malformed_and_unknown_keys_never_reach_the_store() {
    for store in stores(10_000) {
        let kind = store.kind;
        let table = PlanTable::from_toml(
            r#"
            [plans.free]
            limits = ["20 per minute"]
            [keys]
            good = "free"
            "#,
        )
        .unwrap();
        let layer = store.builder().plans(table).build().unwrap();
        let svc = layer.clone().layer(hello());

        let r = call(&svc, req(None, "/")).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{kind:?}");
        assert_eq!(r.headers()["www-authenticate"], "ApiKey");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
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
            StatusCode::UNAUTHORIZED,
            "{kind:?}"
        );
        for _ in 0..2 {
            let r = call(&svc, req(Some("nobody"), "/")).await;
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{kind:?}");
            assert_eq!(body_json(&r)["detail"], "unknown client key");
        }
        let r = call(&svc, req(Some("good"), "/")).await;
        assert_eq!(r.status(), StatusCode::OK, "{kind:?}");
        assert_eq!(r.headers()["ratelimit"], r#""0";r=19;t=0"#);
        assert_eq!(store.keys(&layer), 1, "{kind:?}");

        let forbidding = store
            .builder()
            .plans(|_: &str| -> Option<Plan> { None })
            .unknown_key_status(StatusCode::FORBIDDEN)
            .missing_key_status(StatusCode::BAD_REQUEST)
            .build()
            .unwrap()
            .layer(hello());
        let r = call(&forbidding, req(Some("x"), "/")).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{kind:?}");
        assert!(r.headers().get("www-authenticate").is_none());
        let r = call(&forbidding, req(None, "/")).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{kind:?}");
        assert!(r.headers().get("www-authenticate").is_none());
        // No plans at all: every key is unknown.
        let no_plans = store.builder().build().unwrap().layer(hello());
        let r = call(&no_plans, req(Some("x"), "/")).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{kind:?}");
    }
}

#[tokio::test]
async fn client_ip_and_closure_keys() {
    for store in stores(10_000) {
        let kind = store.kind;
        let one = simple(1, Duration::from_secs(60));
        let svc = store
            .builder()
            .key(KeyExtractor::client_ip())
            .plans(Plan::new("per-ip", one.clone()))
            .build()
            .unwrap()
            .layer(hello());
        let from = |ip: [u8; 4]| {
            let mut r = req(None, "/");
            r.extensions_mut()
                .insert(std::net::SocketAddr::from((ip, 5555)));
            r
        };
        assert_eq!(
            call(&svc, from([10, 0, 0, 1])).await.status(),
            StatusCode::OK,
            "{kind:?}"
        );
        assert_eq!(
            call(&svc, from([10, 0, 0, 1])).await.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{kind:?}"
        );
        assert_eq!(
            call(&svc, from([10, 0, 0, 2])).await.status(),
            StatusCode::OK,
            "{kind:?}"
        );
        assert_eq!(
            call(&svc, req(None, "/")).await.status(),
            StatusCode::UNAUTHORIZED,
            "{kind:?}"
        );

        let by_tenant = store
            .builder()
            .key(KeyExtractor::from_fn(|r| {
                r.uri().path().split('/').nth(1).map(str::to_owned)
            }))
            .plans(Plan::new("tenant", one))
            .build()
            .unwrap()
            .layer(hello());
        assert_eq!(
            call(&by_tenant, req(None, "/acme/a")).await.status(),
            StatusCode::OK,
            "{kind:?}"
        );
        assert_eq!(
            call(&by_tenant, req(None, "/acme/b")).await.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{kind:?}"
        );
        assert_eq!(
            call(&by_tenant, req(None, "/globex/a")).await.status(),
            StatusCode::OK,
            "{kind:?}"
        );
    }
}

/// A key whose plan changes keeps its bucket, switched to the new plan with its tokens as
/// they are, in both stores alike: the request that notices is decided under what the
/// bucket had, then the bucket is switched.
#[tokio::test]
async fn a_changed_plan_takes_over_the_existing_bucket() {
    for store in stores(10_000) {
        let kind = store.kind;
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
        let upgraded = Arc::new(AtomicBool::new(false));
        let flag = upgraded.clone();
        let svc = store
            .builder()
            .plans(move |_: &str| {
                Some(if flag.load(Ordering::SeqCst) {
                    big.clone()
                } else {
                    small.clone()
                })
            })
            .build()
            .unwrap()
            .layer(hello());
        call(&svc, req(Some("k"), "/")).await;
        call(&svc, req(Some("k"), "/")).await;
        let r = call(&svc, req(Some("k"), "/")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        assert_eq!(r.headers()["retry-after"], "30", "{kind:?}");
        upgraded.store(true, Ordering::SeqCst);
        // The first request under pro: the free bucket's tokens (none) carried over.
        let r = call(&svc, req(Some("k"), "/")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        let body = body_json(&r);
        // Decided under the stored free bucket (one token per 30 s), then switched.
        assert_eq!(
            r.headers()["ratelimit-policy"],
            r#""burst";q=2;w=60"#,
            "{kind:?}"
        );
        assert_eq!(r.headers()["retry-after"], "30", "{kind:?}");
        assert_eq!(
            body["plan"], "pro",
            "{kind:?}: the key's plan, under the bucket's limits"
        );
        let r = call(&svc, req(Some("k"), "/")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        assert_eq!(
            r.headers()["ratelimit-policy"],
            r#""burst";q=200;w=60"#,
            "{kind:?}"
        );
        assert_eq!(r.headers()["retry-after"], "1", "{kind:?}");
        // Pro's refill, not a fresh pro bucket (200 tokens) nor free's (30 s a token).
        store.clock.advance(Duration::from_millis(300));
        let r = call(&svc, req(Some("k"), "/")).await;
        assert_eq!(r.status(), StatusCode::OK, "{kind:?}");
        assert_eq!(r.headers()["ratelimit"], r#""burst";r=0;t=1"#, "{kind:?}");
    }
}

/// A backend that is always down.
#[derive(Debug)]
struct Down;

fn refused() -> BackendError {
    BackendError::new(BackendErrorKind::Unavailable, "connection refused")
}

#[async_trait]
impl Backend for Down {
    async fn transact(&self, _: &StorageKey, _: &mut dyn Transaction) -> Result<(), BackendError> {
        Err(refused())
    }
    async fn read(&self, _: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        Err(refused())
    }
    async fn remove(&self, _: &StorageKey) -> Result<bool, BackendError> {
        Err(refused())
    }
}

/// The embedded backend behind one `yield_now`: its answer is not there at the first poll.
/// `in_process` says what it claims.
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

type Answer = (
    StatusCode,
    Option<HeaderValue>,
    Option<HeaderValue>,
    Option<HeaderValue>,
);

/// Status and rate-limit headers of 22 requests on one key (the 21st and 22nd refused).
async fn answers<S>(svc: &S) -> Vec<Answer>
where
    S: Service<Request<()>, Response = Resp, Error = Infallible> + Clone,
{
    let mut out = Vec::new();
    for _ in 0..22 {
        let r = call(svc, req(Some("k"), "/books/1")).await;
        let h = |name: &str| r.headers().get(name).cloned();
        out.push((
            r.status(),
            h("ratelimit"),
            h("retry-after"),
            h("x-rate-limit-remaining"),
        ));
    }
    out
}

#[tokio::test]
async fn a_backend_that_answers_later_gets_the_same_answers() {
    let mut by_store = Vec::new();
    for store in stores(10_000) {
        let svc = store
            .builder()
            .plans(free_plan())
            .remaining_header(true)
            .build()
            .unwrap()
            .layer(hello());
        by_store.push(answers(&svc).await);
    }
    let expected = &by_store[0];
    assert_eq!(&by_store[1], expected, "in process and remote answer alike");
    assert_eq!(expected[19].0, StatusCode::OK);
    assert_eq!(expected[20].0, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        expected
            .iter()
            .all(|(_, rl, _, rem)| rl.is_some() && rem.is_some())
    );
    for in_process in [false, true] {
        let clock = ManualClock::new(1_000_000_000);
        let backend = Yielding {
            inner: EmbeddedBackend::with_clock(clock),
            in_process,
        };
        let svc = RateLimitLayer::builder()
            .backend(ProxyManager::new(backend))
            .plans(free_plan())
            .remaining_header(true)
            .build()
            .unwrap()
            .layer(hello());
        assert_eq!(&answers(&svc).await, expected, "in_process: {in_process}");
    }
}

const UNAVAILABLE_DETAIL: &str = "the rate-limit store is unavailable; try again shortly";
const FULL_DETAIL: &str =
    "the rate-limit store cannot take new clients right now; try again shortly";

/// The answer of a store that cannot decide under `FailurePolicy::error`: 503, a generic
/// body (nothing of the store's own error), Retry-After 1, no rate-limit headers.
fn assert_unavailable(r: &Resp, what: &str, detail: &str) {
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
    assert_eq!(
        r.headers()["content-type"],
        "application/problem+json",
        "{what}"
    );
    assert_eq!(r.headers()["retry-after"], "1", "{what}");
    assert!(r.headers().get("ratelimit").is_none(), "{what}");
    let body = body_json(r);
    assert_eq!(body["status"], 503, "{what}");
    assert_eq!(body["detail"], detail, "{what}");
    let text = String::from_utf8_lossy(r.body()).into_owned();
    for leak in ["refused", "maximum", "keys", "capacity"] {
        assert!(
            !text.contains(leak),
            "{what}: the body tells {leak:?}: {text}"
        );
    }
}

/// The answer of a store that cannot decide under `FailurePolicy::deny`.
fn assert_denied_on_failure(r: &Resp, what: &str) {
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
    assert_eq!(r.headers()["retry-after"], "1", "{what}");
    assert!(r.headers().get("ratelimit").is_none(), "{what}");
    let detail = body_json(r)["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("failure policy"), "{what}: {detail}");
    assert!(!detail.contains("refused"), "{what}: {detail}");
}

#[tokio::test]
async fn backend_failures_follow_the_failure_policy_never_a_silent_allow() {
    let layer = |policy| {
        RateLimitLayer::builder()
            .backend(ProxyManager::new(Down))
            .plans(free_plan())
            .failure_policy(policy)
            .build()
            .unwrap()
            .layer(hello())
    };
    let r = call(&layer(FailurePolicy::error()), req(Some("k"), "/")).await;
    assert_unavailable(&r, "down, error policy", UNAVAILABLE_DETAIL);

    let r = call(&layer(FailurePolicy::deny()), req(Some("k"), "/")).await;
    assert_denied_on_failure(&r, "down, deny policy");

    let fallback =
        || FailurePolicy::fallback(Plan::new("fallback", simple(2, Duration::from_secs(60))));
    let svc = layer(fallback());
    for left in [1, 0] {
        let r = call(&svc, req(Some("k"), "/")).await;
        assert_eq!(r.status(), StatusCode::OK);
        // The fallback answers as a limit: its own policy and state.
        assert_eq!(r.headers()["ratelimit-policy"], r#""0";q=2;w=60"#);
        let t = if left == 0 { 30 } else { 0 };
        assert_eq!(
            r.headers()["ratelimit"].to_str().unwrap(),
            format!(r#""0";r={left};t={t}"#)
        );
    }
    let r = call(&svc, req(Some("k"), "/")).await;
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "fallback exhausted"
    );
    assert_eq!(r.headers()["retry-after"], "30", "the fallback's own wait");
    assert_eq!(r.headers()["ratelimit"], r#""0";r=0;t=30"#);
    assert_eq!(body_json(&r)["plan"], "fallback");
    assert_eq!(
        call(&svc, req(Some("j"), "/")).await.status(),
        StatusCode::OK,
        "the fallback limits per key"
    );
    // What needs no store is answered without it.
    assert_eq!(
        call(&svc, req(None, "/")).await.status(),
        StatusCode::UNAUTHORIZED
    );
}

/// Makes a failure policy (a fallback's local limiter is per policy).
type MakePolicy = fn() -> FailurePolicy;

/// A store full of keys that cannot be forgotten cannot decide for a new key: the failure
/// policy does, on both stores; known keys are served as ever, and once a bucket can be
/// forgotten, the new key gets one.
#[tokio::test]
async fn a_full_store_follows_the_failure_policy() {
    let policies: [(&str, MakePolicy); 3] = [
        ("error", FailurePolicy::error),
        ("deny", FailurePolicy::deny),
        ("fallback", || {
            FailurePolicy::fallback(Plan::new("fallback", simple(2, Duration::from_secs(60))))
        }),
    ];
    for (name, policy) in policies {
        for store in stores(1) {
            let what = format!("{:?}, {name} policy", store.kind);
            let layer = store
                .builder()
                .plans(Plan::new("two", simple(2, Duration::from_secs(2))))
                .failure_policy(policy())
                .build()
                .unwrap();
            let svc = layer.clone().layer(hello());
            // `a` takes the only place: half empty, it cannot be forgotten.
            let r = call(&svc, req(Some("a"), "/")).await;
            assert_eq!(r.status(), StatusCode::OK, "{what}");
            assert_eq!(r.headers()["ratelimit"], r#""0";r=1;t=0"#, "{what}");
            for i in 0..3 {
                let r = call(&svc, req(Some("b"), "/")).await;
                match (name, i) {
                    ("error", _) => assert_unavailable(&r, &what, FULL_DETAIL),
                    ("deny", _) => assert_denied_on_failure(&r, &what),
                    ("fallback", 2) => {
                        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
                        assert_eq!(r.headers()["retry-after"], "30", "{what}");
                    }
                    _ => {
                        assert_eq!(r.status(), StatusCode::OK, "{what}: the fallback limit");
                        assert_eq!(r.headers()["ratelimit-policy"], r#""0";q=2;w=60"#);
                    }
                }
            }
            assert_eq!(store.keys(&layer), 1, "{what}");
            // The known key is served from its bucket as ever.
            let r = call(&svc, req(Some("a"), "/")).await;
            assert_eq!(r.status(), StatusCode::OK, "{what}");
            assert_eq!(r.headers()["ratelimit"], r#""0";r=0;t=1"#, "{what}");
            assert_eq!(
                call(&svc, req(Some("a"), "/")).await.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "{what}"
            );
            // Full again 1 ns short of 2 s: still not forgettable.
            store.clock.advance(Duration::from_nanos(1_999_999_999));
            let r = call(&svc, req(Some("b"), "/")).await;
            if name == "fallback" {
                // The fallback's third request for `b`: refused by the fallback limit.
                assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{what}");
            } else {
                assert_ne!(r.status(), StatusCode::OK, "{what}");
            }
            assert_ne!(
                r.headers().get("ratelimit-policy").map(|v| v.as_bytes()),
                Some(&br#""0";q=2;w=2"#[..]),
                "{what}: not metered by the store"
            );
            // Full: `a` is forgotten to make room, and `b` is metered.
            store.clock.advance(Duration::from_nanos(1));
            let r = call(&svc, req(Some("b"), "/")).await;
            assert_eq!(r.status(), StatusCode::OK, "{what}");
            assert_eq!(r.headers()["ratelimit"], r#""0";r=1;t=0"#, "{what}");
            assert_eq!(store.keys(&layer), 1, "{what}");
        }
    }
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
    for store in stores(CAP) {
        let kind = store.kind;
        let layer = store
            .builder()
            .plans(Plan::new("per-client", simple(5, Duration::from_secs(1))))
            .failure_policy(FailurePolicy::deny())
            .build()
            .unwrap();
        let svc = layer.clone().layer(hello());
        let len = || store.keys(&layer);

        // A busy client empties its bucket.
        for _ in 0..5 {
            assert_eq!(
                call(&svc, req(Some("busy"), "/")).await.status(),
                StatusCode::OK,
                "{kind:?}"
            );
        }
        let mut max_len = len();
        let mut round = 0;
        let (ok, denied) = flood(&svc, round).await;
        max_len = max_len.max(len());
        // No flood key has refilled yet: exactly CAP - 1 got in, the rest met the deny policy.
        assert_eq!((ok, denied), (CAP - 1, 1_000 - (CAP - 1)), "{kind:?}");
        assert_eq!(
            call(&svc, req(Some("busy"), "/")).await.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{kind:?}"
        );

        for _ in 0..5 {
            // Flood keys (1 token of 5 used) are full again after 0.2 s; the busy client
            // keeps draining its bucket.
            store.clock.advance(Duration::from_millis(1_500));
            round += 1;
            let mut busy_ok = 0;
            for _ in 0..6 {
                if call(&svc, req(Some("busy"), "/")).await.status() == StatusCode::OK {
                    busy_ok += 1;
                }
            }
            assert_eq!(
                busy_ok, 5,
                "{kind:?}: the busy client gets its refill (5/s for 1.5 s, capped)"
            );
            let (ok, _) = flood(&svc, round).await;
            assert_eq!(
                ok,
                CAP - 1,
                "{kind:?}: full flood keys were forgotten to make room"
            );
            let r = call(&svc, req(Some("busy"), "/")).await;
            assert_eq!(
                r.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "{kind:?}: the busy client was not handed a fresh bucket"
            );
            max_len = max_len.max(len());
            assert!(len() <= CAP, "{kind:?}");
        }
        assert!(max_len <= CAP, "{kind:?}: map grew to {max_len}");
    }
}

#[test]
fn the_builder_chooses_the_store() {
    let plan = || Plan::new("p", simple(5, Duration::from_secs(1)));
    let local = RateLimitLayer::builder().plans(plan()).build().unwrap();
    let store = local.local_store().expect("in process by default");
    assert_eq!(store.available_tokens("some client").unwrap(), 5);
    assert!(store.is_empty(), "asking about a key stores no full bucket");

    let remote = RateLimitLayer::builder()
        .backend(ProxyManager::new(EmbeddedBackend::new()))
        .plans(plan())
        .build()
        .unwrap();
    assert!(remote.local_store().is_none());
    // The key cap and the clock are the in-process buckets': a backend keeps the store.
    let still_remote = RateLimitLayer::builder()
        .backend(ProxyManager::new(EmbeddedBackend::new()))
        .max_keys(3)
        .clock(ManualClock::new(0))
        .plans(plan())
        .build()
        .unwrap();
    assert!(still_remote.local_store().is_none());

    assert_eq!(
        RateLimitLayer::builder().max_keys(0).build().unwrap_err(),
        bucket4rs_core::ConfigError::ZeroMaxKeys
    );
    assert!(
        RateLimitLayer::builder()
            .clock(ManualClock::new(0))
            .max_keys(0)
            .build()
            .is_err()
    );
    assert!(EmbeddedBackend::new().with_max_keys(0).is_err());
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
        "plan: unknown field (expected one of plans, keys, default_plan, limits, exempt)"
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

/// A plan resolver that counts its `resolve` calls.
struct Counting<R> {
    inner: R,
    calls: Arc<AtomicUsize>,
}

impl<R: PlanResolver> PlanResolver for Counting<R> {
    fn resolve(&self, key: &str) -> Option<Plan> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.resolve(key)
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

/// A key whose bucket holds a configuration none of the plans has (made by another user of
/// the store) is switched to the key's plan, tokens as they are, in both stores alike: the
/// request decided under the bucket's configuration, then the bucket switched.
#[tokio::test]
async fn a_bucket_under_another_configuration_is_switched_to_the_plan() {
    for store in stores(10_000) {
        let kind = store.kind;
        let other = BucketConfiguration::builder()
            .add_bandwidth(bw("burst", 2, Duration::from_secs(60)))
            .build()
            .unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let count = || calls.load(Ordering::SeqCst);
        let layer = store
            .builder()
            .plans(Counting {
                inner: two_plans(),
                calls: calls.clone(),
            })
            .build()
            .unwrap();
        // The bucket of `f` under `other`, with one of its two tokens left.
        match &store.manager {
            None => {
                let local = layer.local_store().unwrap();
                local
                    .replace_configuration("f", other.clone(), TokensInheritanceStrategy::Reset)
                    .unwrap();
                assert!(local.try_consume("f", 1).unwrap());
            }
            Some(manager) => {
                let other = other.clone();
                let b = manager.builder().build("f", move || other.clone()).unwrap();
                assert!(b.try_consume(1).await.unwrap());
            }
        }
        let base = count();
        let svc = layer.clone().layer(hello());
        let r = call(&svc, req(Some("f"), "/books/1")).await;
        assert_eq!(r.status(), StatusCode::OK, "{kind:?}");
        // Decided by the stored bucket (its last token), reported under its own policy,
        // then switched.
        assert_eq!(r.headers()["ratelimit-policy"], r#""burst";q=2;w=60"#);
        assert_eq!(r.headers()["ratelimit"], r#""burst";r=0;t=30"#);
        let stored = match &store.manager {
            None => layer
                .local_store()
                .unwrap()
                .snapshot("f")
                .unwrap()
                .configuration()
                .clone(),
            Some(manager) => {
                let any = other.clone();
                let b = manager.builder().build("f", move || any.clone()).unwrap();
                b.configuration().await.unwrap().unwrap()
            }
        };
        assert_eq!(
            stored,
            *two_plans().plan("free").unwrap().configuration(),
            "{kind:?}"
        );
        assert_eq!(count(), base + 1, "{kind:?}");
        // From then on, the free plan's bucket (no tokens kept) decides.
        let r = call(&svc, req(Some("f"), "/books/1")).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{kind:?}");
        assert_eq!(r.headers()["ratelimit-policy"], r#""burst";q=20;w=60"#);
        assert_eq!(r.headers()["retry-after"], "3", "{kind:?}");
        assert_eq!(count(), base + 2, "{kind:?}: one resolve per request");
    }
}

/// A plan (fixed) and a closure (resolved per request) answer alike when a key's bucket
/// holds a configuration equal to its plan's, from another allocation (set through
/// `local_store()`): it is the plan's configuration, nothing to switch. Switching it anyway
/// is not harmless: an AS_IS replacement caps tokens at the capacity (and starts anonymous
/// bandwidths afresh), so a bonus given with `force_add_tokens` is lost.
#[tokio::test]
async fn a_bucket_equal_to_its_plan_is_not_switched() {
    let mut remaining = Vec::new();
    for fixed in [true, false] {
        let clock = ManualClock::new(1_000_000_000);
        let plan = free_plan();
        let builder = RateLimitLayer::builder()
            .clock(clock)
            .remaining_header(true);
        let builder = if fixed {
            builder.plans(plan)
        } else {
            builder.plans(move |_: &str| Some(plan.clone()))
        };
        let layer = builder.build().unwrap();
        let svc = layer.clone().layer(hello());
        for _ in 0..5 {
            assert_eq!(
                call(&svc, req(Some("k"), "/")).await.status(),
                StatusCode::OK
            );
        }
        let store = layer.local_store().unwrap();
        // The plan's configuration, built again (a reloaded plans file would be the same).
        let copy = free_plan().configuration().clone();
        store
            .replace_configuration("k", copy, TokensInheritanceStrategy::AsIs)
            .unwrap();
        assert_eq!(store.available_tokens("k").unwrap(), 15);
        store.force_add_tokens("k", 100).unwrap();
        assert_eq!(store.available_tokens("k").unwrap(), 115);
        let r = call(&svc, req(Some("k"), "/")).await;
        assert_eq!(r.status(), StatusCode::OK);
        remaining.push(r.headers()["x-rate-limit-remaining"].clone());
    }
    assert_eq!(remaining, ["114", "114"], "fixed plans, resolved plans");
}

/// Two plans of equal limits are two plans: a key is answered under its
/// own, whatever the store shares between equal configurations.
#[tokio::test]
async fn plans_of_equal_limits_keep_their_names() {
    let table = PlanTable::from_toml(
        r#"
        [plans.free]
        limits = ["2 per minute"]
        [plans.trial]
        limits = ["2 per minute"]
        [keys]
        f = "free"
        t = "trial"
        "#,
    )
    .unwrap();
    let layer = RateLimitLayer::builder()
        .clock(ManualClock::monotonic(1_000_000_000))
        .plans(table)
        .build()
        .unwrap();
    let svc = layer.layer(hello());
    assert_eq!(
        call(&svc, req(Some("f"), "/")).await.status(),
        StatusCode::OK
    );
    for _ in 0..2 {
        assert_eq!(
            call(&svc, req(Some("t"), "/")).await.status(),
            StatusCode::OK
        );
    }
    let r = call(&svc, req(Some("t"), "/")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body_json(&r)["plan"], "trial");
}

/// Events seen by a tracing subscriber: each event's fields, formatted.
#[derive(Clone, Default)]
struct Seen(Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={:?} ", field.name(), value));
            }
        }
        let mut fields = Fields(format!("{} ", event.metadata().level()));
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
}

/// A backend that fails with what real drivers say: nothing of it may reach a client.
#[derive(Debug)]
struct Internals(BackendErrorKind, &'static str);

#[async_trait]
impl Backend for Internals {
    async fn transact(&self, _: &StorageKey, _: &mut dyn Transaction) -> Result<(), BackendError> {
        Err(BackendError::new(self.0, self.1))
    }
    async fn read(&self, _: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        Err(BackendError::new(self.0, self.1))
    }
    async fn remove(&self, _: &StorageKey) -> Result<bool, BackendError> {
        Err(BackendError::new(self.0, self.1))
    }
}

/// A backend whose stored record is corrupt: its transaction reads garbage.
#[derive(Debug)]
struct Corrupt;

#[async_trait]
impl Backend for Corrupt {
    async fn transact(&self, _: &StorageKey, tx: &mut dyn Transaction) -> Result<(), BackendError> {
        let _ = tx.apply(
            Some(b"\x01garbage that is no record CapacityExhausted"),
            None,
        );
        Ok(())
    }
    async fn read(&self, _: &StorageKey) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(Some(b"garbage".to_vec()))
    }
    async fn remove(&self, _: &StorageKey) -> Result<bool, BackendError> {
        Ok(false)
    }
}

/// What no response body may carry: the drivers' and the store's own words.
const INTERNALS: [&str; 8] = [
    "broken pipe",
    "NOSCRIPT",
    "e0e1f9fabfc9d4800c877a703b823ac0578ff831",
    "CapacityExhausted",
    "relation",
    "SELECT",
    "garbage",
    "backend error",
];

#[tokio::test]
async fn fault_5xx_bodies_say_what_happened_and_the_detail_goes_to_tracing() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let seen = Seen::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(seen.clone()));
    let failing = [
        (
            Internals(BackendErrorKind::Unavailable, "broken pipe (os error 32)"),
            StatusCode::SERVICE_UNAVAILABLE,
            "the rate-limit store is unavailable; try again shortly",
        ),
        (
            Internals(
                BackendErrorKind::Protocol,
                "NOSCRIPT No matching script e0e1f9fabfc9d4800c877a703b823ac0578ff831",
            ),
            StatusCode::SERVICE_UNAVAILABLE,
            "the rate-limit store is unavailable; try again shortly",
        ),
        (
            Internals(
                BackendErrorKind::Other,
                "ERROR: relation \"bucket4rs_buckets\" does not exist (SELECT record FROM ...)",
            ),
            StatusCode::SERVICE_UNAVAILABLE,
            "the rate-limit store is unavailable; try again shortly",
        ),
        (
            Internals(
                BackendErrorKind::CapacityExhausted,
                "CapacityExhausted: 10 keys",
            ),
            StatusCode::SERVICE_UNAVAILABLE,
            "the rate-limit store cannot take new clients right now; try again shortly",
        ),
    ];
    let mut bodies = Vec::new();
    for (backend, status, detail) in failing {
        let said = backend.1;
        let svc = RateLimitLayer::builder()
            .backend(ProxyManager::new(backend))
            .plans(free_plan())
            .build()
            .unwrap()
            .layer(hello());
        let before = seen.0.lock().unwrap().len();
        let r = call(&svc, req(Some("secret-api-key"), "/")).await;
        assert_eq!(r.status(), status, "{said}");
        assert_eq!(body_json(&r)["detail"], detail, "{said}");
        bodies.push(String::from_utf8_lossy(r.body()).into_owned());
        let logged = seen.0.lock().unwrap()[before..].join("\n");
        assert!(logged.contains(said), "the detail is logged: {logged}");
        assert!(logged.starts_with("WARN"), "{logged}");
        assert!(
            !logged.contains("secret-api-key"),
            "the key is not logged: {logged}"
        );
        // A flood on a failing store logs a line a second, not a line a request.
        let before = seen.0.lock().unwrap().len();
        for _ in 0..200 {
            assert_eq!(call(&svc, req(Some("k"), "/")).await.status(), status);
        }
        let flood = seen.0.lock().unwrap().len() - before;
        assert!(
            flood <= 2,
            "{flood} events for 200 failed requests within a second or so"
        );
    }
    let svc = RateLimitLayer::builder()
        .backend(ProxyManager::new(Corrupt))
        .plans(free_plan())
        .build()
        .unwrap()
        .layer(hello());
    let before = seen.0.lock().unwrap().len();
    let r = call(&svc, req(Some("secret-api-key"), "/")).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body_json(&r)["detail"],
        "the rate-limit store answered with a record it cannot read; the request was not served"
    );
    bodies.push(String::from_utf8_lossy(r.body()).into_owned());
    let logged = seen.0.lock().unwrap()[before..].join("\n");
    assert!(
        logged.starts_with("ERROR"),
        "the corrupt record is logged: {logged}"
    );
    for body in &bodies {
        for internal in INTERNALS {
            assert!(!body.contains(internal), "{internal:?} in {body}");
        }
    }
    println!(
        "fault: 5xx bodies: {} failing stores answered without a word of their errors; {} events logged",
        bodies.len(),
        seen.0.lock().unwrap().len()
    );
}

/// Hostile keys get the missing-key answer (a problem body, 401 by default) and touch no
/// bucket, on both stores; a key at the length limit is served.
#[tokio::test]
async fn hostile_keys_get_a_clear_4xx_and_change_no_state() {
    for store in stores(10_000) {
        let kind = store.kind;
        let layer = store.builder().plans(free_plan()).build().unwrap();
        let svc = layer.clone().layer(hello());
        let longest = "k".repeat(256);
        let r = call(&svc, req(Some(&longest), "/")).await;
        assert_eq!(r.status(), StatusCode::OK, "{kind:?}: 256 bytes is allowed");
        assert_eq!(store.keys(&layer), 1, "{kind:?}");
        let hostile: [&[u8]; 9] = [
            &[b'k'; 257],
            &[b'k'; 65_536],
            b"",
            b"   ",
            b"\t \t",
            b"caf\xc3\xa9",
            b"\xff\xfe",
            b"key\x80",
            b"\xc3\x28 invalid utf-8",
        ];
        for bytes in hostile {
            let mut r = req(None, "/");
            r.headers_mut()
                .insert("x-api-key", HeaderValue::from_bytes(bytes).unwrap());
            let r = call(&svc, r).await;
            let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(16)]).into_owned();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{kind:?}: {shown:?}");
            assert_eq!(r.headers()["content-type"], "application/problem+json");
            assert_eq!(
                body_json(&r)["detail"],
                "the request carries no usable client key",
                "{kind:?}: {shown:?}"
            );
            assert!(r.headers().get("ratelimit").is_none(), "{kind:?}");
        }
        assert_eq!(
            store.keys(&layer),
            1,
            "{kind:?}: no bucket for a hostile key"
        );
        // The served key's bucket is as one request left it.
        let r = call(&svc, req(Some(&longest), "/")).await;
        assert_eq!(
            r.headers()["ratelimit"],
            r#""burst";r=18;t=0, "daily";r=998;t=0"#,
            "{kind:?}"
        );
    }
}
