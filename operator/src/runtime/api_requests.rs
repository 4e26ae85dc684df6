//! Counts every request the operator's Kubernetes client sends, by HTTP method and by the status
//! code that came back, into `outbox_operator_api_requests_total`: what the operator costs the
//! API server, and whether it was ever told to back off (429, from API Priority and Fairness).
//! kube-rs has no client-side rate limiter (client-go's QPS and burst), so there is no
//! client-side throttling to report; the server's answer is the one that counts.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use prometheus::IntCounterVec;
use tower_layer::Layer;
use tower_service::Service;

/// The layer for `kube::client::ClientBuilder::with_layer`.
#[derive(Clone)]
pub struct CountApiRequests {
    counter: IntCounterVec,
}

impl CountApiRequests {
    /// `counter` has the labels `method` and `code`.
    pub fn new(counter: IntCounterVec) -> Self {
        Self { counter }
    }
}

impl<S> Layer<S> for CountApiRequests {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counter: self.counter.clone(),
        }
    }
}

/// The client's service with every answer counted.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
    counter: IntCounterVec,
}

impl<S, B, R> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let method = request.method().clone();
        let counter = self.counter.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let result = answer.await;
            // A watch is counted when its stream opens (its 200), not when it ends.
            let code = match &result {
                Ok(response) => response.status().as_str().to_owned(),
                Err(_) => "error".to_owned(),
            };
            counter.with_label_values(&[method.as_str(), &code]).inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::{Ready, ready};

    use http::StatusCode;
    use prometheus::Opts;

    use super::*;

    /// Answers 429 to a PATCH and 200 to everything else, as a busy API server might.
    struct Server;

    impl Service<Request<()>> for Server {
        type Response = Response<()>;
        type Error = Infallible;
        type Future = Ready<Result<Response<()>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<()>) -> Self::Future {
            let status = if request.method() == http::Method::PATCH {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let mut response = Response::new(());
            *response.status_mut() = status;
            ready(Ok(response))
        }
    }

    #[tokio::test]
    async fn each_answer_is_counted_by_method_and_code() {
        let counter =
            IntCounterVec::new(Opts::new("requests", "test"), &["method", "code"]).unwrap();
        let mut client = CountApiRequests::new(counter.clone()).layer(Server);
        for method in [http::Method::GET, http::Method::GET, http::Method::PATCH] {
            let request = Request::builder().method(method).body(()).unwrap();
            client.call(request).await.unwrap();
        }
        assert_eq!(counter.with_label_values(&["GET", "200"]).get(), 2);
        assert_eq!(counter.with_label_values(&["PATCH", "429"]).get(), 1);
        assert_eq!(counter.with_label_values(&["PATCH", "200"]).get(), 0);
    }
}
