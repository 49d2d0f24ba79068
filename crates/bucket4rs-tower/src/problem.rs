//! RFC 9457 problem details for the responses the layer makes itself.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use serde_json::{Map, Value};

/// An RFC 9457 `application/problem+json` response: `type` is `about:blank`, so `title` is
/// the status phrase; `detail` explains; extension members carry the numbers.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Problem {
    status: StatusCode,
    members: Map<String, Value>,
}

impl Problem {
    /// A problem with `status` and `detail`.
    pub(crate) fn new(status: StatusCode, detail: impl Into<String>) -> Self {
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
    #[must_use]
    pub(crate) fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.members.insert(name.into(), value.into());
        self
    }

    /// The JSON body.
    pub(crate) fn to_json(&self) -> String {
        Value::Object(self.members.clone()).to_string()
    }

    /// The response, with `Content-Type: application/problem+json`.
    pub(crate) fn into_response<B: From<Bytes>>(self) -> Response<B> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_is_rfc_9457_json_with_its_extensions() {
        let r: Response<Bytes> = too_many_requests(
            0,
            Problem::new(StatusCode::TOO_MANY_REQUESTS, "try later").with("plan", "free"),
        );
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        // At least one second, in the header and the body.
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        let body: Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "type": "about:blank",
                "title": "Too Many Requests",
                "status": 429,
                "detail": "try later",
                "plan": "free",
                "retry_after": 1,
            })
        );
    }
}
