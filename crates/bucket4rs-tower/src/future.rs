//! The response future of [`RateLimit`](crate::RateLimit).

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use crate::response::{RateHeaders, Verdict};
use crate::store::BoxFuture;

pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit).
    ///
    /// A state machine rather than one boxed `async` block: when the store answers at once
    /// (the in-process store), the inner service's future is polled in place and the
    /// rate-limit headers are added to its response; only a shared store's answer is a boxed
    /// future, with the request waiting beside it.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // A shared store is deciding; the request waits (boxed, so it does not enlarge the
        // future of the in-process path).
        Deciding {
            verdict: BoxFuture<Verdict<S::Response>>,
            waiting: Option<Box<(S, Request<ReqBody>)>>,
        },
        // Allowed (or unmetered): the inner service answers, then the headers are added.
        Calling {
            #[pin]
            fut: S::Future,
            headers: Option<RateHeaders>,
        },
        // Answered by the layer itself.
        Ready { resp: Option<S::Response> },
        Done,
    }
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    /// The inner service's future, with `headers` for its response.
    pub(crate) fn calling(fut: S::Future, headers: Option<RateHeaders>) -> Self {
        Self {
            state: State::Calling { fut, headers },
        }
    }

    /// The layer's own answer.
    pub(crate) fn ready(resp: S::Response) -> Self {
        Self {
            state: State::Ready { resp: Some(resp) },
        }
    }

    /// A shared store's verdict to wait for; then `inner` (ready) is called with `req`.
    pub(crate) fn deciding(
        verdict: BoxFuture<Verdict<S::Response>>,
        inner: S,
        req: Request<ReqBody>,
    ) -> Self {
        Self {
            state: State::Deciding {
                verdict,
                waiting: Some(Box::new((inner, req))),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Deciding { verdict, waiting } => {
                    let verdict = ready!(verdict.as_mut().poll(cx));
                    let Some(w) = waiting.take() else {
                        return Poll::Pending;
                    };
                    let (mut inner, req) = *w;
                    match verdict {
                        Verdict::Allow(headers) => state.set(State::Calling {
                            fut: inner.call(req),
                            headers,
                        }),
                        Verdict::Answer(resp) => state.set(State::Ready { resp: Some(resp) }),
                    }
                }
                StateProj::Calling { fut, headers } => {
                    // The inner future's output is returned as it is, the headers added to
                    // its response in place: the response is not moved out and back.
                    let mut out = fut.poll(cx);
                    if let Poll::Ready(Ok(resp)) = &mut out
                        && let Some(h) = headers.take()
                    {
                        h.apply(resp);
                    }
                    if out.is_ready() {
                        state.set(State::Done);
                    }
                    return out;
                }
                StateProj::Ready { resp } => {
                    let resp = resp.take();
                    state.set(State::Done);
                    if let Some(resp) = resp {
                        return Poll::Ready(Ok(resp));
                    }
                }
                // Polled after completion: nothing more will come (a future contract
                // violation by the caller, answered without a panic).
                StateProj::Done => return Poll::Pending,
            }
        }
    }
}
