//! The relay's HTTP endpoints: `/metrics` for Prometheus, `/healthz` (the process is alive)
//! and `/readyz` (at least one worker is connected to both PostgreSQL and the broker).

use std::net::SocketAddr;

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

fn router(metrics: Metrics) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readiness))
        .with_state(metrics)
}

async fn render_metrics(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        metrics.render(),
    )
}

async fn readiness(State(metrics): State<Metrics>) -> impl IntoResponse {
    let db = metrics.database_connected.get() > 0;
    let broker = metrics.broker_connected.get() > 0;
    let body = format!("database: {}\nbroker: {}\n", up(db), up(broker));
    let status = if db && broker {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

fn up(connected: bool) -> &'static str {
    if connected {
        "connected"
    } else {
        "not connected"
    }
}

/// Binds the address now (so a taken port is reported at start) and serves until shutdown.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    // The actual port matters when the configured one is 0 (tests, several relays on a host).
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, router(metrics))
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    }))
}
