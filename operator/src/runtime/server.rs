//! The operator's HTTP endpoints: `/metrics` for Prometheus, `/healthz` (the process serves
//! requests) and `/readyz` (it reached the Kubernetes API).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;

/// What the endpoints report on.
#[derive(Clone)]
pub struct ServerState {
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(state): State<ServerState>) -> String {
    state.metrics.render()
}

async fn readyz(State(state): State<ServerState>) -> (StatusCode, &'static str) {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not connected to the Kubernetes API yet",
        )
    }
}

/// Serves until the process ends.
pub async fn serve(addr: SocketAddr, state: ServerState) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, router(state)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn health_readiness_and_metrics_are_served() {
        let state = ServerState {
            metrics: Arc::new(Metrics::default()),
            ready: Arc::new(AtomicBool::new(false)),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });

        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        state.ready.store(true, Ordering::Relaxed);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        drop(state.metrics.reconcile_started("shop/orders"));
        let metrics = get(addr, "/metrics").await;
        assert!(
            metrics.contains("outbox_operator_reconciles_total"),
            "{metrics}"
        );
    }
}
