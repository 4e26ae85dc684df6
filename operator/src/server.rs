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
