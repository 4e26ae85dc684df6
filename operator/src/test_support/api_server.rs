//! A scripted Kubernetes API server for request-level tests (the controller-rs pattern): the
//! test lists the exact requests it expects, in order, with the reply to each; the server fails
//! the test on any other request, and records every request body so tests can search them.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::reconcile::database::RelayDatabase;
use crate::reconcile::{Context, Settings};
use crate::test_support::mock_service;

pub use mock_service::Handle;

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: Method,
    /// Path and query.
    pub uri: String,
    pub body: Value,
}

/// What the server answers.
pub struct Reply {
    pub status: StatusCode,
    pub body: Value,
}

impl Reply {
    pub fn ok(body: Value) -> Self {
        Self {
            status: StatusCode::OK,
            body,
        }
    }

    pub fn not_found(kind: &str, name: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            body: serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("{kind} \"{name}\" not found"), "reason": "NotFound", "code": 404,
            }),
        }
    }
}

/// One expected request: method, exact path (without query), and how to answer its body.
pub struct Step {
    method: Method,
    path: String,
    reply: Box<dyn FnOnce(&Value) -> Reply + Send>,
}

impl Step {
    pub fn new(
        method: Method,
        path: impl Into<String>,
        reply: impl FnOnce(&Value) -> Reply + Send + 'static,
    ) -> Self {
        Self {
            method,
            path: path.into(),
            reply: Box::new(reply),
        }
    }

    pub fn get(path: impl Into<String>, reply: Reply) -> Self {
        Self::new(Method::GET, path, move |_| reply)
    }

    /// A write whose reply echoes the request body (what the API server returns on success),
    /// after `check` looked at it.
    pub fn write(
        method: Method,
        path: impl Into<String>,
        check: impl FnOnce(&Value) + Send + 'static,
    ) -> Self {
        Self::new(method, path, move |body| {
            check(body);
            Reply::ok(body.clone())
        })
    }
}

/// The client side of a context wired to the mock (and to `database`), and the server side to
/// script.
pub fn mock_context(
    settings: Settings,
    database: Arc<dyn RelayDatabase>,
) -> (Arc<Context>, Handle) {
    let (service, handle) = mock_service::pair();
    let client = Client::new(service, "default");
    let ctx = Context::with_database(client, database, Arc::new(Metrics::default()), settings);
    (Arc::new(ctx), handle)
}

/// Serves `script` in order, then refuses anything more until every client is gone. The join
/// handle yields every request received.
pub fn serve(mut handle: Handle, script: Vec<Step>) -> JoinHandle<Vec<Exchange>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        for step in script {
            let Some((request, send)) = handle.next_request().await else {
                panic!(
                    "the client finished, but {} {} was still expected; seen: {:#?}",
                    step.method,
                    step.path,
                    summary(&seen)
                );
            };
            let exchange = read(request).await;
            assert_eq!(
                (&exchange.method, path_of(&exchange.uri)),
                (&step.method, step.path.as_str()),
                "unexpected request; seen before: {:#?}",
                summary(&seen)
            );
            let reply = (step.reply)(&exchange.body);
            seen.push(exchange);
            let body = serde_json::to_vec(&reply.body).unwrap();
            send.send_response(
                Response::builder()
                    .status(reply.status)
                    .body(Body::from(body))
                    .unwrap(),
            );
        }
        if let Some((request, _)) = handle.next_request().await {
            let extra = read(request).await;
            panic!(
                "unexpected extra request {} {}; seen before: {:#?}",
                extra.method,
                extra.uri,
                summary(&seen)
            );
        }
        seen
    })
}

/// Waits for the server; it ends once the test dropped every clone of the client.
pub async fn finish(server: JoinHandle<Vec<Exchange>>) -> Vec<Exchange> {
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the mock API server did not finish; is a Context still alive?")
        .expect("the mock API server failed")
}

async fn read(request: Request<Body>) -> Exchange {
    let method = request.method().clone();
    let uri = request.uri().to_string();
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    Exchange { method, uri, body }
}

fn path_of(uri: &str) -> &str {
    uri.split('?').next().unwrap_or(uri)
}

fn summary(seen: &[Exchange]) -> Vec<String> {
    seen.iter()
        .map(|e| format!("{} {}", e.method, e.uri))
        .collect()
}
