//! Who is rate-limited: extracting a client key from a request.

use core::fmt;
use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Extensions, HeaderMap, HeaderName, Method, Request, Uri};

use crate::client_ip::ClientIp;

/// Keys longer than this many bytes are refused (as a missing key) before any backend call.
pub(crate) const MAX_KEY_LEN: usize = 256;

/// A borrowed view of a request's head, handed to key extractors and cost functions.
///
/// ```
/// use bucket4rs_tower::RequestInfo;
/// let req = http::Request::get("/books/search?q=rust").body(()).unwrap();
/// let info = RequestInfo::new(&req);
/// assert_eq!(info.uri().path(), "/books/search");
/// assert_eq!(info.method(), http::Method::GET);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct RequestInfo<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestInfo<'a> {
    /// The view of `req`.
    ///
    /// ```
    /// let req = http::Request::get("/").body(()).unwrap();
    /// assert!(bucket4rs_tower::RequestInfo::new(&req).headers().is_empty());
    /// ```
    pub fn new<B>(req: &'a Request<B>) -> Self {
        Self {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// The method.
    ///
    /// ```
    /// let req = http::Request::post("/").body(()).unwrap();
    /// assert_eq!(bucket4rs_tower::RequestInfo::new(&req).method(), http::Method::POST);
    /// ```
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The URI.
    ///
    /// ```
    /// let req = http::Request::get("/a?b=c").body(()).unwrap();
    /// assert_eq!(bucket4rs_tower::RequestInfo::new(&req).uri().query(), Some("b=c"));
    /// ```
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The headers.
    ///
    /// ```
    /// let req = http::Request::get("/").header("x-api-key", "k").body(()).unwrap();
    /// assert_eq!(bucket4rs_tower::RequestInfo::new(&req).headers()["x-api-key"], "k");
    /// ```
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (where servers put the peer address).
    ///
    /// ```
    /// let req = http::Request::get("/").body(()).unwrap();
    /// assert!(bucket4rs_tower::RequestInfo::new(&req).extensions().is_empty());
    /// ```
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// The peer address: axum's `ConnectInfo<SocketAddr>` (feature `axum`) or a plain
    /// `SocketAddr` extension.
    ///
    /// ```
    /// let mut req = http::Request::get("/").body(()).unwrap();
    /// req.extensions_mut().insert(std::net::SocketAddr::from(([127, 0, 0, 1], 9)));
    /// let ip = bucket4rs_tower::RequestInfo::new(&req).peer_addr().unwrap().ip();
    /// assert_eq!(ip.to_string(), "127.0.0.1");
    /// ```
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "axum")]
        if let Some(axum::extract::ConnectInfo(addr)) = self
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(*addr);
        }
        self.extensions.get::<SocketAddr>().copied()
    }
}

type KeyFn = dyn for<'a> Fn(&RequestInfo<'a>) -> Option<String> + Send + Sync;

#[derive(Clone)]
enum Kind {
    Header(HeaderName),
    Client(Arc<ClientIp>),
    Fn(Arc<KeyFn>),
}

/// Extracts the key a request is limited by. A request without a usable key (header absent,
/// empty, not visible ASCII, longer than 256 bytes; no peer address) is answered by the
/// layer's missing-key response (401 by default) and never reaches a backend.
///
/// ```
/// use bucket4rs_tower::{KeyExtractor, RequestInfo};
/// let by_key = KeyExtractor::header("x-api-key");
/// let req = http::Request::get("/").header("x-api-key", "abc").body(()).unwrap();
/// assert_eq!(by_key.extract(&RequestInfo::new(&req)).as_deref(), Some("abc"));
///
/// let by_tenant = KeyExtractor::from_fn(|r| r.uri().path().split('/').nth(1).map(str::to_owned));
/// let req = http::Request::get("/acme/orders").body(()).unwrap();
/// assert_eq!(by_tenant.extract(&RequestInfo::new(&req)).as_deref(), Some("acme"));
/// ```
#[derive(Clone)]
pub struct KeyExtractor(Kind);

impl fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Header(h) => write!(f, "KeyExtractor::Header({h})"),
            Kind::Client(c) => write!(f, "KeyExtractor::Client({c:?})"),
            Kind::Fn(_) => f.write_str("KeyExtractor::Fn"),
        }
    }
}

impl KeyExtractor {
    /// The value of a header, such as `X-API-Key`. An invalid header name is
    /// not a panic: it matches nothing, so every request is answered as missing its key.
    ///
    /// ```
    /// # use bucket4rs_tower::{KeyExtractor, RequestInfo};
    /// let req = http::Request::get("/").body(()).unwrap();
    /// assert_eq!(KeyExtractor::header("x-api-key").extract(&RequestInfo::new(&req)), None);
    /// ```
    pub fn header(name: &str) -> Self {
        match HeaderName::try_from(name) {
            Ok(h) => Self(Kind::Header(h)),
            Err(_) => Self(Kind::Fn(Arc::new(|_| None))),
        }
    }

    /// The peer's IP address (see [`RequestInfo::peer_addr`]; serve axum with
    /// `into_make_service_with_connect_info::<SocketAddr>()` and enable feature `axum`),
    /// IPv6 grouped by /64: [`client`](Self::client) with [`ClientIp::new`]. Behind a load
    /// balancer, every client's peer is the balancer: use [`client`](Self::client) with
    /// [`ClientIp::behind`] there.
    ///
    /// ```
    /// # use bucket4rs_tower::{KeyExtractor, RequestInfo};
    /// let mut req = http::Request::get("/").body(()).unwrap();
    /// req.extensions_mut().insert(std::net::SocketAddr::from(([10, 1, 2, 3], 4000)));
    /// assert_eq!(KeyExtractor::client_ip().extract(&RequestInfo::new(&req)).as_deref(), Some("10.1.2.3"));
    /// ```
    pub fn client_ip() -> Self {
        Self::client(ClientIp::new())
    }

    /// The client's address as `client` finds it (behind trusted proxies, from their
    /// forwarding header): an IPv4 address (`203.0.113.7`) or an IPv6 prefix
    /// (`2001:db8:1:2::/64`).
    ///
    /// ```
    /// # use bucket4rs_tower::{ClientIp, KeyExtractor, RequestInfo};
    /// let key = KeyExtractor::client(ClientIp::behind(["10.0.0.0/8".parse()?]));
    /// let mut req = http::Request::get("/").header("x-forwarded-for", "203.0.113.7").body(())?;
    /// req.extensions_mut().insert(std::net::SocketAddr::from(([10, 0, 0, 2], 4000)));
    /// assert_eq!(key.extract(&RequestInfo::new(&req)).as_deref(), Some("203.0.113.7"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn client(client: ClientIp) -> Self {
        Self(Kind::Client(Arc::new(client)))
    }

    /// Any closure over the request head. The layer calls it once per request.
    ///
    /// ```
    /// # use bucket4rs_tower::{KeyExtractor, RequestInfo};
    /// let k = KeyExtractor::from_fn(|r| Some(r.method().to_string()));
    /// let req = http::Request::get("/").body(()).unwrap();
    /// assert_eq!(k.extract(&RequestInfo::new(&req)).as_deref(), Some("GET"));
    /// ```
    pub fn from_fn(
        f: impl for<'a> Fn(&RequestInfo<'a>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self(Kind::Fn(Arc::new(f)))
    }

    /// The client address this extractor reads, when it is one.
    pub(crate) fn client_reader(&self) -> Option<&ClientIp> {
        match &self.0 {
            Kind::Client(c) => Some(c),
            _ => None,
        }
    }

    /// The key of a request, if it has a usable one.
    ///
    /// ```
    /// # use bucket4rs_tower::{KeyExtractor, RequestInfo};
    /// let req = http::Request::get("/").header("x-api-key", "").body(()).unwrap();
    /// assert_eq!(KeyExtractor::header("x-api-key").extract(&RequestInfo::new(&req)), None);
    /// ```
    #[inline]
    pub fn extract<'a>(&self, req: &RequestInfo<'a>) -> Option<Cow<'a, str>> {
        let key: Cow<'a, str> = match &self.0 {
            // `to_str` admits visible ASCII, space and tab only, so `trim_ascii` is `trim`.
            Kind::Header(h) => Cow::Borrowed(req.headers.get(h)?.to_str().ok()?.trim_ascii()),
            other => Cow::Owned(owned_key(other, req)?),
        };
        (!key.is_empty() && key.len() <= MAX_KEY_LEN).then_some(key)
    }
}

/// The key of a client IP or closure extractor. Out of line, so the header extractor's
/// path, which runs on every request, stays compact.
#[inline(never)]
fn owned_key(kind: &Kind, req: &RequestInfo<'_>) -> Option<String> {
    match kind {
        Kind::Client(c) => c.key(req),
        Kind::Fn(f) => f(req),
        Kind::Header(_) => None,
    }
}
