//! The floor of any rate-limit layer on the Bookshelf: the same routes and server as
//! `bookshelf --no-limit`, behind a service that does only what every layer speaking the
//! IETF headers must do on an allowed request, and nothing a rate limiter decides:
//!
//! - read the client key (`X-API-Key`; 401 without it),
//! - add `RateLimit-Policy` and `RateLimit` to the response, with constant values of the
//!   same length as the bench plan's (`benches/http/bench-plans.toml`).
//!
//! There is no bucket, no plan lookup and no formatting: the difference between this server
//! and `--no-limit` is the cost of the headers alone (the key lookup, two `HeaderMap`
//! inserts, hyper writing two more fields, 85 more bytes on the wire). The overhead scripts
//! (`benches/http/scripts/overhead*.sh`) run it beside the real layer.
//!
//! ```text
//! cargo build --release -p bucket4rs-http-benches --bin header_floor
//! target/release/header_floor --addr 127.0.0.1:18083
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::Router;
use axum::routing::future::RouteFuture;
use tower::Service;

static KEY: HeaderName = HeaderName::from_static("x-api-key");
static POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
// The values the layer sends for the bench plan's never-exhausted key.
const POLICY_VALUE: &str = "\"bench\";q=1000000000000;w=1000";
const RATELIMIT_VALUE: &str = "\"bench\";r=999999999999;t=0";

/// The routes behind the floor service.
#[derive(Clone)]
struct Floor(Router);

/// The routes' future, whose response gets the two headers (`None`: refused, no key).
struct FloorFuture(Option<RouteFuture<Infallible>>);

impl Future for FloorFuture {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Some(fut) => {
                let mut resp = ready!(Pin::new(fut).poll(cx))?;
                let h = resp.headers_mut();
                h.insert(POLICY.clone(), HeaderValue::from_static(POLICY_VALUE));
                h.insert(RATELIMIT.clone(), HeaderValue::from_static(RATELIMIT_VALUE));
                Poll::Ready(Ok(resp))
            }
            None => Poll::Ready(Ok(StatusCode::UNAUTHORIZED.into_response())),
        }
    }
}

impl Service<Request> for Floor {
    type Response = Response;
    type Error = Infallible;
    type Future = FloorFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        <Router as Service<Request>>::poll_ready(&mut self.0, cx)
    }

    fn call(&mut self, req: Request) -> FloorFuture {
        let has_key = req
            .headers()
            .get(&KEY)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|k| !k.trim_ascii().is_empty());
        FloorFuture(has_key.then(|| self.0.call(req)))
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = bucket4rs_http_benches::parse_addr_only(
        std::env::args().skip(1),
        ([127, 0, 0, 1], 18083).into(),
    )
    .map_err(std::io::Error::other)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "header floor listening on http://{}",
        listener.local_addr()?
    );
    // `with_state` as in `bookshelf::app`: the handlers become routes once.
    let app = Floor(bookshelf::routes().with_state(()));
    bookshelf::serve(listener, app, bookshelf::shutdown_signal()).await
}
