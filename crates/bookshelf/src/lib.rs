//! # bookshelf
//!
//! The Bookshelf API from the Bucket4j documentation, rate-limited with `bucket4rs-tower`:
//!
//! - `GET /books/{isbn}` looks a book up (costs 1 token);
//! - `GET /books/search?q=…` searches titles and authors (costs 5 tokens);
//! - the `X-API-Key` header chooses the plan (`free-demo-key`: 20 tokens per minute,
//!   `pro-demo-key`: 200 per minute, from `plans.toml`); an unknown key gets 401.
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
use core::fmt;
use core::future::Future;
use std::net::SocketAddr;

use axum::ServiceExt as _;
use axum::extract::{Path, Query, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bucket4rs_core::ConfigError;
use bucket4rs_tower::{
    PlanTable, PlansError, RateLimit, RateLimitLayer, RateLimitLayerBuilder, RequestInfo,
};
use serde::{Deserialize, Serialize};
use tower::{Layer as _, Service};

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
    store
        .key(bucket4rs_tower::KeyExtractor::header("x-api-key"))
        .plans(plans)
        .cost(cost)
        .build()
}

/// The rate-limited application: [`routes`] behind [`layer`].
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
pub fn app(
    store: RateLimitLayerBuilder,
    plans: PlanTable,
) -> Result<RateLimit<Router>, ConfigError> {
    // `with_state` turns the handlers into routes once, as `Router::into_make_service*`
    // does; a wrapped router would otherwise do it on every request.
    Ok(layer(store, plans)?.layer(routes().with_state(())))
}

/// Serves `app` (the [`app`], or the bare [`routes`]) on `listener` until `shutdown`
/// completes, then finishes in-flight requests. Handlers see the peer address as
/// `ConnectInfo<SocketAddr>`.
///
/// # Errors
/// I/O errors of the listener.
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
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// Where buckets live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    /// In this process (the default).
    Embedded,
    /// Redis at this URL: instances share limits.
    Redis(String),
    /// PostgreSQL at this URL: instances share limits.
    Postgres(String),
}

/// The command line.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Args {
    /// `--addr HOST:PORT` (default 127.0.0.1:8080).
    pub addr: SocketAddr,
    /// `--plans FILE` (default: the shipped `plans.toml`).
    pub plans: Option<String>,
    /// `--redis URL` / `--postgres URL`.
    pub store: Store,
    /// `--key-prefix P`: the storage key prefix (default `bookshelf`).
    pub key_prefix: String,
    /// `--max-keys N`: the embedded backend's key cap (default 1,000,000).
    pub max_keys: usize,
    /// `--no-limit`: serve without the rate-limit layer (to measure its overhead).
    pub no_limit: bool,
    /// `--help`.
    pub help: bool,
}

/// A command-line error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgsError(String);

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for ArgsError {}

/// The usage text.
pub const USAGE: &str = "\
bookshelf: the Bookshelf API, rate-limited by bucket4rs-tower

USAGE: bookshelf [--addr HOST:PORT] [--plans FILE] [--redis URL | --postgres URL]
                 [--key-prefix P] [--max-keys N] [--no-limit]

  --addr HOST:PORT  listen here (default 127.0.0.1:8080)
  --plans FILE      plans file (default: the shipped plans.toml)
  --redis URL       keep buckets in Redis, shared by every instance
  --postgres URL    keep buckets in PostgreSQL, shared by every instance
  --key-prefix P    storage key prefix (default bookshelf)
  --max-keys N      key cap of the in-process store (default 1000000)
  --no-limit        serve without rate limiting (to measure the layer's overhead)
";

impl Args {
    /// Parses the arguments (without the program name). Hand-rolled: eight flags do not
    /// justify a dependency.
    ///
    /// # Errors
    /// An unknown flag, a missing value, or an invalid address or number.
    ///
    /// ```
    /// use bookshelf::{Args, Store};
    /// let a = Args::parse(["--redis", "redis://127.0.0.1/"].map(String::from))?;
    /// assert_eq!(a.store, Store::Redis("redis://127.0.0.1/".into()));
    /// assert!(Args::parse(["--bogus".to_owned()]).is_err());
    /// # Ok::<(), bookshelf::ArgsError>(())
    /// ```
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, ArgsError> {
        let mut out = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            plans: None,
            store: Store::Embedded,
            key_prefix: "bookshelf".into(),
            max_keys: 1_000_000,
            no_limit: false,
            help: false,
        };
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let (flag, inline) = match flag.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
                _ => (flag, None),
            };
            let mut value = |name: &str| {
                inline
                    .clone()
                    .or_else(|| it.next())
                    .ok_or_else(|| ArgsError(format!("{name} needs a value\n\n{USAGE}")))
            };
            match flag.as_str() {
                "--addr" => {
                    let v = value("--addr")?;
                    out.addr = v
                        .parse()
                        .map_err(|_| ArgsError(format!("--addr: {v:?} is not HOST:PORT")))?;
                }
                "--plans" => out.plans = Some(value("--plans")?),
                "--redis" => out.store = Store::Redis(value("--redis")?),
                "--postgres" => out.store = Store::Postgres(value("--postgres")?),
                "--key-prefix" => out.key_prefix = value("--key-prefix")?,
                "--max-keys" => {
                    let v = value("--max-keys")?;
                    out.max_keys = v
                        .parse()
                        .map_err(|_| ArgsError(format!("--max-keys: {v:?} is not a number")))?;
                }
                "--no-limit" => out.no_limit = true,
                "-h" | "--help" => out.help = true,
                other => return Err(ArgsError(format!("unknown argument {other:?}\n\n{USAGE}"))),
            }
        }
        Ok(out)
    }
}

/// Reads the plans: `path`, or the shipped default.
///
/// # Errors
/// The file cannot be read, or a [`PlansError`] (prefixed with the file name).
///
/// ```
/// assert!(bookshelf::load_plans(None).is_ok());
/// assert!(bookshelf::load_plans(Some("/nonexistent.toml")).is_err());
/// ```
pub fn load_plans(path: Option<&str>) -> Result<PlanTable, String> {
    match path {
        None => {
            PlanTable::from_toml(DEFAULT_PLANS).map_err(|e: PlansError| format!("plans.toml: {e}"))
        }
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"))?;
            PlanTable::from_toml(&text).map_err(|e| format!("{p}: {e}"))
        }
    }
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
