//! The transport under the scripted API server: a `tower` service that hands each request to
//! the test with a one-shot channel for its response.
//!
//! Written here rather than taken from `tower-test`: that crate turns on tokio's `test-util`
//! feature, and a feature that only tests use changed how tokio, and every crate above it, was
//! compiled for the test build, so `make demo` and `make test` built the workspace twice.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::client::Body;
use tokio::sync::{mpsc, oneshot};

type Exchange = (Request<Body>, oneshot::Sender<Response<Body>>);

/// The client's side: give it to `kube::Client::new`.
#[derive(Clone)]
pub struct MockService {
    requests: mpsc::UnboundedSender<Exchange>,
}

/// The test's side: receives the requests in the order they were sent.
pub struct Handle {
    requests: mpsc::UnboundedReceiver<Exchange>,
}

/// Answers one request.
pub struct SendResponse {
    reply: oneshot::Sender<Response<Body>>,
}

#[derive(Debug, thiserror::Error)]
#[error("the mock API server stopped before answering")]
pub struct NoAnswer;

pub fn pair() -> (MockService, Handle) {
    let (requests, receiver) = mpsc::unbounded_channel();
    (MockService { requests }, Handle { requests: receiver })
}

impl Handle {
    /// The next request; `None` once every clone of the service is gone.
    pub async fn next_request(&mut self) -> Option<(Request<Body>, SendResponse)> {
        let (request, reply) = self.requests.recv().await?;
        Some((request, SendResponse { reply }))
    }
}

impl SendResponse {
    pub fn send_response(self, response: Response<Body>) {
        // The client may have given up on the request (a timeout); nobody is left to tell.
        let _ = self.reply.send(response);
    }
}

impl tower_service::Service<Request<Body>> for MockService {
    type Response = Response<Body>;
    type Error = NoAnswer;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, NoAnswer>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), NoAnswer>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (reply, answer) = oneshot::channel();
        let sent = self.requests.send((request, reply));
        Box::pin(async move {
            sent.map_err(|_| NoAnswer)?;
            answer.await.map_err(|_| NoAnswer)
        })
    }
}
