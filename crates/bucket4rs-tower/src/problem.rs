//! RFC 9457 problem details for the responses the layer makes itself.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use serde_json::{Map, Value};

/// An RFC 9457 `application/problem+json` response: `type` is `about:blank`, so `title` is
/// the status phrase; `detail` explains; extension members carry the numbers.
///
/// ```
/// use bucket4rs_tower::Problem;
/// use http::StatusCode;
/// let p = Problem::new(StatusCode::TOO_MANY_REQUESTS, "try later").with("retry_after", 3);
/// let body = p.to_json();
/// assert!(body.contains(r#""status":429"#));
/// assert!(body.contains(r#""title":"Too Many Requests""#));
/// assert!(body.contains(r#""retry_after":3"#));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    status: StatusCode,
    members: Map<String, Value>,
}

impl Problem {
    /// A problem with `status` and `detail`.
    ///
    /// ```
    /// let p = bucket4rs_tower::Problem::new(http::StatusCode::UNAUTHORIZED, "unknown API key");
    /// assert_eq!(p.status(), http::StatusCode::UNAUTHORIZED);
    /// ```
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        let mut members = Map::new();
        members.insert("type".into(), Value::from("about:blank"));
        members.insert(
            "title".into(),
            Value::from(status.canonical_reason().unwrap_or("Error")),
        );
        members.insert("status".into(), Value::from(status.as_u16()));
        members.insert("detail".into(), Value::from(detail.into()));
        Self { status, members }
    }

    /// Adds an extension member.
    ///
    /// ```
    /// let p = bucket4rs_tower::Problem::new(http::StatusCode::UNAUTHORIZED, "x").with("plan", "free");
    /// assert!(p.to_json().contains(r#""plan":"free""#));
    /// ```
    #[must_use]
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.members.insert(name.into(), value.into());
        self
    }

    /// The status.
    ///
    /// ```
    /// let p = bucket4rs_tower::Problem::new(http::StatusCode::SERVICE_UNAVAILABLE, "down");
    /// assert_eq!(p.status().as_u16(), 503);
    /// ```
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The JSON body.
    ///
    /// ```
    /// let p = bucket4rs_tower::Problem::new(http::StatusCode::UNAUTHORIZED, "x");
    /// assert!(p.to_json().starts_with('{'));
    /// ```
    pub fn to_json(&self) -> String {
        Value::Object(self.members.clone()).to_string()
    }

    /// The response, with `Content-Type: application/problem+json`.
    ///
    /// ```
    /// let r: http::Response<bytes::Bytes> = bucket4rs_tower::Problem::new(http::StatusCode::UNAUTHORIZED, "x").into_response();
    /// assert_eq!(r.headers()["content-type"], "application/problem+json");
    /// ```
    pub fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let body = B::from(Bytes::from(self.to_json()));
        let mut r = Response::new(body);
        *r.status_mut() = self.status;
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        r
    }
}

/// A 429 response with `Retry-After` (whole seconds, at least 1).
pub(crate) fn too_many_requests<B: From<Bytes>>(
    retry_after_secs: u64,
    problem: Problem,
) -> Response<B> {
    let secs = retry_after_secs.max(1);
    let mut r = problem.with("retry_after", secs).into_response::<B>();
    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
    r
}
