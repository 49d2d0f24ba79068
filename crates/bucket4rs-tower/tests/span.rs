//! The decision span, in a test binary of its own: tracing-core caches each callsite's
//! interest process-wide, and while a single subscriber is registered it asks the
//! registering thread's default subscriber. A test on another thread of a shared binary that
//! reaches the span first (with no subscriber of its own) caches "never" for every thread, so
//! this check needs a process in which it is the only test.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bucket4rs_core::{Bandwidth, BucketConfiguration};
use bucket4rs_tower::{Plan, RateLimitLayer};
use bytes::Bytes;
use http::{Request, Response};
use tower::{Layer, Service, ServiceExt};

type Resp = Response<Bytes>;

async fn call<S>(svc: &S, key: &str) -> Resp
where
    S: Service<Request<()>, Response = Resp, Error = Infallible> + Clone,
{
    let r = Request::get("/").header("x-api-key", key).body(()).unwrap();
    svc.clone().oneshot(r).await.unwrap()
}

/// Each decision runs in a `rate_limit` span at DEBUG, with the plan, the cost and the
/// layer's own status (0: allowed).
#[tokio::test]
async fn each_decision_runs_in_a_debug_span() {
    use tracing_subscriber::layer::SubscriberExt as _;
    #[derive(Clone, Default)]
    struct Spans(Arc<Mutex<Vec<String>>>);
    struct Fields<'a>(&'a mut String);
    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={v:?}", f.name()));
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let m = attrs.metadata();
            self.0
                .lock()
                .unwrap()
                .push(format!("{} {}", m.level(), m.name()));
        }
        fn on_record(
            &self,
            _: &tracing::span::Id,
            values: &tracing::span::Record<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut spans = self.0.lock().unwrap();
            if let Some(last) = spans.last_mut() {
                values.record(&mut Fields(last));
            }
        }
    }
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let config = BucketConfiguration::builder()
        .add_bandwidth(Bandwidth::simple(1, Duration::from_secs(60)).unwrap())
        .build()
        .unwrap();
    let svc = RateLimitLayer::builder()
        .plans(Plan::new("free", config))
        .build()
        .unwrap()
        .layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Bytes::from_static(b"hello")))
        }));
    call(&svc, "k").await;
    call(&svc, "k").await;
    let seen = spans.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "DEBUG rate_limit plan=\"free\" cost=1 status=0",
            "DEBUG rate_limit plan=\"free\" cost=1 status=429"
        ]
    );
}
