//! The least a rate limiter speaking the IETF headers does on the Bookshelf, for measuring
//! how far the real layer is from it: the header floor (`src/bin/header_floor.rs`) plus
//! one bucket per client key, and nothing else.
//!
//! Per request: read the client key (`X-API-Key`; 401 without it), look its bucket up in a
//! concurrent map (created on first sight; no plan table, key cap, eviction, storage key or
//! failure policy), take the route's cost (1, or 5 for a search) from it (a lock-free
//! `bucket4rs-local` bucket of the bench plan's bandwidth: 10^12 tokens, refilled 10^9 per
//! second), and add `RateLimit-Policy` (a constant) and `RateLimit` with the tokens left, the
//! value reused from the thread's previous request when the tokens left are the same. A
//! refused request gets a bare 429.
//!
//! With `LIMITER_FLOOR_STORE=minimal` in its environment, each key's bucket is instead two
//! integers in the map's entry (tokens and the instant of the last refill), refilled
//! greedily by a few lines of integer arithmetic under the map's shard lock: the least a
//! token bucket can be, with none of `bucket4rs-local`'s generality (several bandwidths,
//! exact refill of any period, listeners, strategies).
//!
//! It is not a product: it exists only so that the overhead scripts can run it as their
//! `peer` side (`PEER=…/limiter_floor`), which gives the cost of this minimum beside the
//! layer's in the same rounds (`benches/README.md`, "HTTP overhead").
//!
//! ```text
//! cargo build --release -p bucket4rs-http-benches --bin limiter_floor
//! PEER=target/release/limiter_floor benches/http/scripts/overhead-paired.sh 24
//! LIMITER_FLOOR_STORE=minimal PEER=target/release/limiter_floor benches/http/scripts/overhead-paired.sh 24
//! ```

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::Router;
use axum::routing::future::RouteFuture;
use bucket4rs_local::{Bucket, Clock, FastClock, LockFreeBucket};
use dashmap::DashMap;
use tower::Service;

static KEY: HeaderName = HeaderName::from_static("x-api-key");
static POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
// The bench plan's policy, as the layer sends it.
const POLICY_VALUE: &str = "\"bench\";q=1000000000000;w=1000";

const CAPACITY: u64 = 1_000_000_000_000;
const REFILL_PER_SECOND: u64 = 1_000_000_000;

/// Where the keys' buckets are: takes `cost` tokens from `key`'s bucket (created full on
/// first sight) and answers the tokens left, or `None` when it holds fewer.
trait Store: Send + Sync + 'static {
    fn take(&self, key: &str, cost: u64) -> Option<u64>;
    /// The keys it holds (for the tests).
    #[cfg(test)]
    fn len(&self) -> usize;
}

type Map<V> = DashMap<Box<str>, V, foldhash::fast::RandomState>;

fn new_map<V>() -> Map<V> {
    DashMap::with_hasher(foldhash::fast::RandomState::default())
}

/// A `bucket4rs-local` lock-free bucket per key.
struct LocalBuckets(Map<LockFreeBucket>);

impl Store for LocalBuckets {
    fn take(&self, key: &str, cost: u64) -> Option<u64> {
        let probe = match self.0.get(key) {
            Some(b) => b.try_consume_and_return_remaining(cost),
            None => self
                .0
                .entry(key.into())
                .or_insert_with(new_bucket)
                .try_consume_and_return_remaining(cost),
        };
        probe
            .ok()
            .filter(|p| p.is_consumed())
            .map(|p| p.remaining_tokens())
    }
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Two integers per key, in the map's entry (`LIMITER_FLOOR_STORE=minimal`).
struct Minimal {
    map: Map<(u64, i64)>,
    clock: FastClock,
}

impl Store for Minimal {
    fn take(&self, key: &str, cost: u64) -> Option<u64> {
        let now = self.clock.now_nanos();
        let mut entry = match self.map.get_mut(key) {
            Some(e) => e,
            None => self.map.entry(key.into()).or_insert((CAPACITY, now)),
        };
        let (tokens, last) = &mut *entry;
        // Greedy refill of everything since the last one (none if the clock went back).
        // Exact at this rate of one token per nanosecond; at other rates it would drop the
        // fraction of a token at each refill (the core keeps it), which a measuring stub
        // does not need.
        let elapsed = u128::try_from(now.saturating_sub(*last)).unwrap_or(0);
        let refill = elapsed * u128::from(REFILL_PER_SECOND) / 1_000_000_000;
        let full = (u128::from(*tokens) + refill).min(u128::from(CAPACITY));
        *tokens = u64::try_from(full).unwrap_or(CAPACITY);
        *last = now.max(*last);
        let left = tokens.checked_sub(cost)?;
        *tokens = left;
        Some(left)
    }
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// The routes behind the bare limiter.
struct Bare<S> {
    routes: Router,
    buckets: Arc<S>,
}

impl<S> Clone for Bare<S> {
    fn clone(&self) -> Self {
        Self {
            routes: self.routes.clone(),
            buckets: Arc::clone(&self.buckets),
        }
    }
}

/// The routes' future, whose response gets the two headers; or the limiter's own answer.
// The large variant is the one every measured request takes: boxing it would add an
// allocation per request to what this server measures.
#[allow(clippy::large_enum_variant)]
enum BareFuture {
    Allowed(RouteFuture<Infallible>, Option<HeaderValue>),
    Answer(Option<Response>),
}

impl Future for BareFuture {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            BareFuture::Allowed(fut, value) => {
                let mut resp = ready!(Pin::new(fut).poll(cx))?;
                let h = resp.headers_mut();
                h.insert(POLICY.clone(), HeaderValue::from_static(POLICY_VALUE));
                if let Some(v) = value.take() {
                    h.insert(RATELIMIT.clone(), v);
                }
                Poll::Ready(Ok(resp))
            }
            BareFuture::Answer(resp) => Poll::Ready(Ok(resp
                .take()
                .unwrap_or_else(|| StatusCode::INTERNAL_SERVER_ERROR.into_response()))),
        }
    }
}

thread_local! {
    /// The thread's last `RateLimit` value and its tokens left.
    static LAST: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
}

/// The `RateLimit` value for `remaining` tokens left (`t` is 0: the request was allowed).
fn ratelimit_value(remaining: u64) -> Option<HeaderValue> {
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((r, v)) = last.as_ref()
            && *r == remaining
        {
            return Some(v.clone());
        }
        let mut digits = itoa::Buffer::new();
        let mut buf = [0u8; 64];
        let parts: [&[u8]; 3] = [
            b"\"bench\";r=",
            digits.format(remaining).as_bytes(),
            b";t=0",
        ];
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        let v = HeaderValue::from_bytes(&buf[..at]).ok()?;
        *last = Some((remaining, v.clone()));
        Some(v)
    })
}

fn new_bucket() -> LockFreeBucket {
    Bucket::builder()
        .add_limit(|l| {
            l.capacity(CAPACITY)
                .refill_greedy(REFILL_PER_SECOND, Duration::from_secs(1))
        })
        .build()
        .expect("a valid bandwidth")
}

impl<S: Store> Service<Request> for Bare<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = BareFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        <Router as Service<Request>>::poll_ready(&mut self.routes, cx)
    }

    fn call(&mut self, req: Request) -> BareFuture {
        let key = req
            .headers()
            .get(&KEY)
            .and_then(|v| v.to_str().ok())
            .filter(|k| !k.trim_ascii().is_empty());
        let Some(key) = key else {
            return BareFuture::Answer(Some(StatusCode::UNAUTHORIZED.into_response()));
        };
        let cost = if req.uri().path() == "/books/search" {
            5
        } else {
            1
        };
        match self.buckets.take(key, cost) {
            Some(left) => {
                let value = ratelimit_value(left);
                BareFuture::Allowed(self.routes.call(req), value)
            }
            None => BareFuture::Answer(Some(StatusCode::TOO_MANY_REQUESTS.into_response())),
        }
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = bucket4rs_http_benches::parse_addr_only(
        std::env::args().skip(1),
        ([127, 0, 0, 1], 18094).into(),
    )
    .map_err(std::io::Error::other)?;
    let minimal = match std::env::var("LIMITER_FLOOR_STORE").as_deref() {
        Ok("minimal") => true,
        Ok("local") | Err(_) => false,
        Ok(other) => {
            return Err(std::io::Error::other(format!(
                "LIMITER_FLOOR_STORE={other:?}: expected `local` (the default) or `minimal`"
            )));
        }
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "bare limiter ({}) listening on http://{}",
        if minimal { "minimal" } else { "local" },
        listener.local_addr()?
    );
    let routes = bookshelf::routes().with_state(());
    let shutdown = bookshelf::shutdown_signal();
    if minimal {
        let buckets = Arc::new(Minimal {
            map: new_map(),
            clock: FastClock,
        });
        bookshelf::serve(listener, Bare { routes, buckets }, shutdown).await
    } else {
        let buckets = Arc::new(LocalBuckets(new_map()));
        bookshelf::serve(listener, Bare { routes, buckets }, shutdown).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    fn bare<S: Store>(buckets: S) -> Bare<S> {
        Bare {
            routes: bookshelf::routes().with_state(()),
            buckets: Arc::new(buckets),
        }
    }

    async fn get<S: Store>(app: &Bare<S>, path: &str, key: Option<&str>) -> Response {
        let mut req = axum::http::Request::get(path);
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        app.clone()
            .oneshot(req.body(axum::body::Body::empty()).unwrap())
            .await
            .unwrap()
    }

    fn header<'a>(resp: &'a Response, name: &str) -> Option<&'a str> {
        resp.headers().get(name).map(|v| v.to_str().unwrap())
    }

    /// The measured path does what the docs say: the route's cost taken from the key's own
    /// bucket, the tokens left in `RateLimit`, the policy constant; 401 without a key.
    #[tokio::test]
    async fn each_key_pays_its_route_cost_from_its_own_bucket() {
        each_key_pays(bare(LocalBuckets(new_map()))).await;
        each_key_pays(bare(Minimal {
            map: new_map(),
            clock: FastClock,
        }))
        .await;
    }

    async fn each_key_pays<S: Store>(app: Bare<S>) {
        let first = get(&app, "/books/9781593278281", Some("a")).await;
        assert_eq!(first.status(), StatusCode::OK);
        assert_eq!(header(&first, "ratelimit-policy"), Some(POLICY_VALUE));
        let r = |resp: &Response| -> u64 {
            let v = header(resp, "ratelimit").unwrap();
            let rest = v.strip_prefix("\"bench\";r=").unwrap();
            rest.strip_suffix(";t=0").unwrap().parse().unwrap()
        };
        // Refilled at one token per nanosecond, so full again before each request (they are
        // microseconds apart): the tokens left are the capacity less the route's cost.
        assert_eq!(r(&first), 999_999_999_999);
        let search = get(&app, "/books/search?q=rust", Some("a")).await;
        assert_eq!(search.status(), StatusCode::OK);
        assert_eq!(r(&search), 999_999_999_995);
        let other = get(&app, "/books/9781593278281", Some("b")).await;
        assert_eq!(r(&other), 999_999_999_999, "a new key gets a full bucket");
        assert_eq!(app.buckets.len(), 2);
        assert_eq!(
            get(&app, "/books/1", None).await.status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get(&app, "/books/1", Some("  ")).await.status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(app.buckets.len(), 2);
    }

    /// The minimal bucket refills greedily up to the capacity, and refuses a cost beyond
    /// what it holds without taking anything.
    #[test]
    fn the_minimal_bucket_refills_and_refuses() {
        let m = Minimal {
            map: new_map(),
            clock: FastClock,
        };
        assert_eq!(m.take("k", CAPACITY), Some(0));
        // Emptied: a cost beyond what has refilled since is refused, and takes nothing.
        assert_eq!(m.take("k", CAPACITY), None);
        let (tokens, _) = *m.map.get("k").unwrap();
        assert!(tokens < CAPACITY);
        // Set the last refill 2,000 s back (twice what fills it): refilled to the capacity,
        // not beyond.
        m.map.get_mut("k").unwrap().1 -= 2_000_000_000_000;
        assert_eq!(m.take("k", 1), Some(CAPACITY - 1));
    }

    /// The per-thread memo gives the value of the tokens asked for, not a stale one.
    #[test]
    fn the_ratelimit_value_follows_the_tokens_left() {
        for r in [5, 5, 7, 0, u64::MAX, 7] {
            let v = ratelimit_value(r).unwrap();
            assert_eq!(v.to_str().unwrap(), format!("\"bench\";r={r};t=0"));
        }
    }
}
