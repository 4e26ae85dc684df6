//! The relay's HTTP endpoints: `/metrics` for Prometheus, `/healthz` (the process is alive)
//! and `/readyz` (at least one worker is connected to both PostgreSQL and the broker; when not,
//! the body names the reason if one is known). A suspended relay stays ready: it could deliver
//! and was told not to, which is no reason for a probe to restart it or a load balancer to
//! count it out; the body says `delivery: suspended`.

use std::net::SocketAddr;

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::runtime::health::Health;

#[derive(Clone)]
struct Endpoints {
    metrics: Metrics,
    health: Health,
}

fn router(metrics: Metrics, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readiness))
        .with_state(Endpoints { metrics, health })
}

async fn render_metrics(State(Endpoints { metrics, .. }): State<Endpoints>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        metrics.render(),
    )
}

async fn readiness(State(endpoints): State<Endpoints>) -> impl IntoResponse {
    let db = endpoints.metrics.database_connected.get() > 0;
    let broker = endpoints.metrics.broker_connected.get() > 0;
    let blocked = endpoints.metrics.broker_blocked.get() > 0;
    let mut body = String::new();
    let status = if db && broker && !blocked {
        StatusCode::OK
    } else {
        // First, so a probe's truncated output still shows it.
        if let Some(problem) = endpoints.health.problem() {
            // The code too, so a script can act on it as the operator does on the reports.
            body = format!("not ready ({}): {}\n", problem.kind.code(), problem.message);
        }
        StatusCode::SERVICE_UNAVAILABLE
    };
    let broker_state = if blocked {
        "connected, blocked by an alarm"
    } else {
        up(broker)
    };
    body.push_str(&format!("database: {}\nbroker: {broker_state}\n", up(db)));
    if let Some(report) = endpoints.health.report_state() {
        body.push_str(&format!("lag report: not written ({report})\n"));
    }
    body.push_str(if endpoints.metrics.suspended.get() > 0 {
        "delivery: suspended (SIGUSR2 resumes)\n"
    } else {
        "delivery: running\n"
    });
    (status, body)
}

fn up(connected: bool) -> &'static str {
    if connected {
        "connected"
    } else {
        "not connected"
    }
}

/// Binds `addr`. Competing relays on one host are the relay's scaling model, so when the
/// *default* port is taken the relay takes a free port on the same interface and says so; an
/// address the user gave is kept to, and a taken one is an error they must fix.
pub async fn bind(addr: SocketAddr, is_default: bool) -> std::io::Result<TcpListener> {
    match TcpListener::bind(addr).await {
        Err(e) if is_default && e.kind() == std::io::ErrorKind::AddrInUse => {
            let listener = TcpListener::bind(SocketAddr::new(addr.ip(), 0)).await?;
            tracing::warn!(
                taken = %addr,
                addr = %listener.local_addr()?,
                "the default metrics port {} is taken (another relay on this host?); serving on port {} instead; pass --metrics-addr to choose",
                addr.port(),
                listener.local_addr()?.port()
            );
            Ok(listener)
        }
        other => other,
    }
}

/// Binds the address now (so a taken port is reported at start) and serves until shutdown.
pub async fn serve(
    addr: SocketAddr,
    is_default: bool,
    metrics: Metrics,
    health: Health,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = bind(addr, is_default).await?;
    // The actual port matters when the configured one is 0 (tests, several relays on a host).
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, router(metrics, health))
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    }))
}

#[cfg(test)]
mod bind_tests {
    use super::*;

    #[test]
    fn the_default_listens_on_loopback_only() {
        assert!(crate::defaults::METRICS_ADDR.ip().is_loopback());
        assert_eq!(
            crate::defaults::METRICS_ADDR.port(),
            crate::defaults::METRICS_PORT
        );
    }

    #[tokio::test]
    async fn a_taken_default_moves_to_a_free_port_but_a_given_address_does_not() {
        let holder = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let taken = holder.local_addr().unwrap();
        let moved = bind(taken, true).await.unwrap().local_addr().unwrap();
        assert_eq!(moved.ip(), taken.ip());
        assert_ne!(moved.port(), taken.port());
        let refused = bind(taken, false).await.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::AddrInUse);
    }
}
