//! # bookshelf
//!
//! The Bookshelf API from the Bucket4j documentation, rate-limited with `bucket4rs-tower`:
//!
//! - `GET /books/{isbn}` looks a book up (costs 1 token);
//! - `GET /books/search?q=…` searches titles and authors (costs 5 tokens);
//! - the `X-API-Key` header chooses the plan (`free-demo-key`: 20 tokens per minute,
//!   `pro-demo-key`: 200 per minute, from `plans.toml`); an unknown key gets 401;
//! - every client's searches together get 600 tokens a minute (the plans file's search
//!   limit: one bucket, a hot key on a shared store, which each instance leases).
//!
//! The binary (`cargo run --release -p bookshelf`) parses its arguments with [`Args::parse`]
//! and serves with [`serve`]; tests start the same server in-process on port 0.
//!
//! ```
//! let args = bookshelf::Args::parse(["--addr", "127.0.0.1:0"].map(String::from))?;
//! assert_eq!(args.addr.port(), 0);
//! # Ok::<(), bookshelf::ArgsError>(())
//! ```

use core::convert::Infallible;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};

use axum::extract::{Path, Query, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bucket4rs_core::ConfigError;
use bucket4rs_tower::{
    KeyExtractor, PlanTable, RateLimitLayer, RateLimitLayerBuilder, RequestInfo,
};
use serde::{Deserialize, Serialize};
use tower::{Layer as _, Service};

mod args;
mod serve;
mod store;

pub use args::{
    Args, ArgsError, KeyBy, MAX_BACKEND_CONNECTIONS, OnFailure, Store, TlsFiles, USAGE, load_plans,
};
pub use serve::{MAX_CONNECTIONS, ServeOptions, serve_with};
pub use store::{App, Started, app_from};

/// The default plans file, shipped in the crate.
pub const DEFAULT_PLANS: &str = include_str!("../plans.toml");

/// The default listening address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";

/// One book of the catalogue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Book {
    /// ISBN-13, digits only.
    pub isbn: String,
    /// Title.
    pub title: String,
    /// Author.
    pub author: String,
    /// Year of first publication.
    pub year: u16,
}

const CATALOGUE: &[(&str, &str, &str, u16)] = &[
    ("9780134685991", "Effective Java", "Joshua Bloch", 2001),
    (
        "9781593278281",
        "The Rust Programming Language",
        "Steve Klabnik and Carol Nichols",
        2018,
    ),
    (
        "9781492052593",
        "Programming Rust",
        "Jim Blandy, Jason Orendorff and Leonora Tindall",
        2017,
    ),
    (
        "9780201633610",
        "Design Patterns",
        "Erich Gamma, Richard Helm, Ralph Johnson and John Vlissides",
        1994,
    ),
    ("9780132350884", "Clean Code", "Robert C. Martin", 2008),
    (
        "9780262033848",
        "Introduction to Algorithms",
        "Thomas H. Cormen et al.",
        1990,
    ),
    (
        "9781449373320",
        "Designing Data-Intensive Applications",
        "Martin Kleppmann",
        2017,
    ),
    ("9780321125217", "Domain-Driven Design", "Eric Evans", 2003),
    (
        "9780596007126",
        "Head First Design Patterns",
        "Eric Freeman and Elisabeth Robson",
        2004,
    ),
    (
        "9781617294549",
        "Microservices Patterns",
        "Chris Richardson",
        2018,
    ),
];

/// The in-memory catalogue.
///
/// ```
/// assert_eq!(bookshelf::catalogue().len(), 10);
/// ```
pub fn catalogue() -> Vec<Book> {
    CATALOGUE
        .iter()
        .map(|&(isbn, title, author, year)| Book {
            isbn: isbn.into(),
            title: title.into(),
            author: author.into(),
            year,
        })
        .collect()
}

/// What a request costs: a search 5 tokens, anything else 1.
///
/// ```
/// let req = axum::http::Request::get("/books/search?q=rust").body(()).unwrap();
/// assert_eq!(bookshelf::cost(&bucket4rs_tower::RequestInfo::new(&req)), 5);
/// ```
pub fn cost(req: &RequestInfo<'_>) -> u64 {
    if req.uri().path() == "/books/search" {
        5
    } else {
        1
    }
}

#[derive(Debug, Deserialize)]
struct SearchQuery {
    #[serde(default)]
    q: String,
}

fn not_found(isbn: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": "Not Found",
        "status": 404,
        "detail": format!("no book with ISBN {isbn}"),
    });
    let mut r = (StatusCode::NOT_FOUND, body.to_string()).into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/problem+json"),
    );
    r
}

async fn lookup(Path(isbn): Path<String>) -> Response {
    let digits: String = isbn.chars().filter(char::is_ascii_digit).collect();
    match CATALOGUE.iter().find(|b| b.0 == digits) {
        Some(&(isbn, title, author, year)) => Json(Book {
            isbn: isbn.into(),
            title: title.into(),
            author: author.into(),
            year,
        })
        .into_response(),
        None => not_found(&isbn),
    }
}

async fn search(Query(query): Query<SearchQuery>) -> Json<Vec<Book>> {
    let q = query.q.to_lowercase();
    let hits = catalogue()
        .into_iter()
        .filter(|b| b.title.to_lowercase().contains(&q) || b.author.to_lowercase().contains(&q))
        .collect();
    Json(hits)
}

/// The routes, without rate limiting.
///
/// ```
/// let app: axum::Router = bookshelf::routes();
/// ```
pub fn routes() -> Router {
    // `/books/search` is a static segment: it wins over `{isbn}`.
    Router::new()
        .route("/books/search", get(search))
        .route("/books/{isbn}", get(lookup))
}

/// The rate-limiting layer of the Bookshelf: `X-API-Key` → plan from `plans`, costs from
/// [`cost`], buckets where `store` keeps them (`RateLimitLayer::builder()` for this process,
/// `.backend(manager)` for a shared store).
///
/// # Errors
/// The store's configuration error (a key cap of zero).
///
/// ```
/// use bucket4rs_tower::RateLimitLayer;
/// let plans = bucket4rs_tower::PlanTable::from_toml(bookshelf::DEFAULT_PLANS)?;
/// let layer = bookshelf::layer(RateLimitLayer::builder().max_keys(10_000), plans)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn layer(
    store: RateLimitLayerBuilder,
    plans: PlanTable,
) -> Result<RateLimitLayer, ConfigError> {
    plans
        .configure(store.key(bucket4rs_tower::KeyExtractor::header("x-api-key")))
        .cost(cost)
        .build()
}

/// The rate-limiting layer with clients told apart by `key`: the `X-API-Key` header (as
/// [`layer`]), or the client's address behind the `trusted` proxy networks, every address
/// under the plans file's default plan. The file's further limits and allowlist apply.
///
/// # Errors
/// `--key ip` with a plans file that names no default plan; the store's configuration
/// error.
///
/// ```
/// use bucket4rs_tower::RateLimitLayer;
/// let plans = bucket4rs_tower::PlanTable::from_toml(bookshelf::DEFAULT_PLANS)?;
/// let trusted = ["10.0.0.0/8".parse()?];
/// let layer = bookshelf::layer_keyed(RateLimitLayer::builder(), plans, bookshelf::KeyBy::Ip, &trusted)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn layer_keyed(
    store: RateLimitLayerBuilder,
    plans: PlanTable,
    key: KeyBy,
    trusted: &[ipnet::IpNet],
) -> Result<RateLimitLayer, String> {
    let built = match key {
        KeyBy::ApiKey => layer(store, plans),
        KeyBy::Ip => {
            let every = plans.default_plan().cloned().ok_or(
                "--key ip: the plans file names no default plan (default_plan = \"NAME\", or a plan named free)",
            )?;
            let client = bucket4rs_tower::ClientIp::behind(trusted.iter().copied());
            plans
                .configure_with(store.key(KeyExtractor::client(client)), Some(every))
                .cost(cost)
                .build()
        }
    };
    built.map_err(|e| format!("--max-keys: {e}"))
}

/// The rate-limited application: [`routes`] behind [`layer`], and `GET /health` (200,
/// outside the limiter: it answers whatever the rate-limit store's state).
///
/// The layer wraps the whole router rather than being added with `Router::layer`, which
/// axum applies to each route: every request would then also clone the layered route (a
/// boxed service) and box its future. Both apply the layer to the same requests (axum's
/// `Router::layer` also covers the fallback), so the answers are the same.
///
/// # Errors
/// As [`layer`].
///
/// ```
/// use bucket4rs_tower::RateLimitLayer;
/// let plans = bucket4rs_tower::PlanTable::from_toml(bookshelf::DEFAULT_PLANS)?;
/// let app = bookshelf::app(RateLimitLayer::builder(), plans)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn app(store: RateLimitLayerBuilder, plans: PlanTable) -> Result<App, ConfigError> {
    // `with_state` turns the handlers into routes once, as `Router::into_make_service*`
    // does; a wrapped router would otherwise do it on every request.
    Ok(app_of(&layer(store, plans)?))
}

/// [`routes`] behind `layer`, and `GET /health`.
pub(crate) fn app_of(layer: &RateLimitLayer) -> App {
    WithHealth(layer.layer(routes().with_state(())))
}

/// [`app`] with the layer of [`layer_keyed`].
///
/// # Errors
/// As [`layer_keyed`].
///
/// ```
/// use bucket4rs_tower::RateLimitLayer;
/// let plans = bucket4rs_tower::PlanTable::from_toml(bookshelf::DEFAULT_PLANS)?;
/// let app = bookshelf::app_keyed(RateLimitLayer::builder(), plans, bookshelf::KeyBy::Ip, &[])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn app_keyed(
    store: RateLimitLayerBuilder,
    plans: PlanTable,
    key: KeyBy,
    trusted: &[ipnet::IpNet],
) -> Result<App, String> {
    Ok(app_of(&layer_keyed(store, plans, key, trusted)?))
}

/// `GET /health` answered before the wrapped service (from [`app`]): 200 with
/// `{"status":"ok"}`, never rate-limited, so a load balancer sees the server up while the
/// rate-limit store is down. Every other request goes to the wrapped service.
///
/// ```
/// # use tower::ServiceExt;
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let app = bookshelf::WithHealth(bookshelf::routes().with_state(()));
/// let req = axum::http::Request::get("/health").body(axum::body::Body::empty())?;
/// assert_eq!(app.oneshot(req).await?.status(), 200);
/// # Ok::<(), Box<dyn std::error::Error>>(()) })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct WithHealth<S>(pub S);

impl<S> Service<Request> for WithHealth<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = HealthFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        if req.uri().path() == "/health" {
            let mut r = (StatusCode::OK, r#"{"status":"ok"}"#).into_response();
            r.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            );
            HealthFuture {
                inner: None,
                ready: Some(r),
            }
        } else {
            HealthFuture {
                inner: Some(self.0.call(req)),
                ready: None,
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`WithHealth`]: the health answer, or the wrapped service's.
    #[derive(Debug)]
    pub struct HealthFuture<F> {
        #[pin]
        inner: Option<F>,
        ready: Option<Response>,
    }
}

impl<F: Future<Output = Result<Response, Infallible>>> Future for HealthFuture<F> {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.inner.as_pin_mut() {
            Some(inner) => inner.poll(cx),
            None => this
                .ready
                .take()
                .map_or(Poll::Pending, |r| Poll::Ready(Ok(r))),
        }
    }
}

/// Serves `app` (the [`app`], or the bare [`routes`]) on `listener` until `shutdown`
/// completes, then finishes in-flight requests: [`serve_with`] the default
/// [`ServeOptions`] (10 s to send a request's headers, 60 s idle, 1,024 connections).
///
/// # Errors
/// As [`serve_with`].
///
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// bookshelf::serve(listener, bookshelf::routes(), std::future::pending()).await
/// # }
/// ```
pub async fn serve<S>(
    listener: tokio::net::TcpListener,
    app: S,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    serve_with(listener, app, shutdown, &ServeOptions::default()).await
}

/// Resolves on Ctrl-C or SIGTERM.
///
/// ```no_run
/// # async fn run() { bookshelf::shutdown_signal().await; }
/// ```
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            core::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => core::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = core::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
