//! LISTEN for the NOTIFY trigger (installed by `migrate --notify`) so idle workers wake as soon
//! as rows are committed instead of at the next poll. Polling stays as the fallback: a lost
//! connection or a missing trigger only costs latency.

use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::database::{DatabaseTarget, listener_pool};
use crate::runtime::backoff::Backoff;
use crate::runtime::health::Health;

pub async fn run_listener(
    database: DatabaseTarget,
    channel: String,
    wake: watch::Sender<u64>,
    health: Health,
    shutdown: CancellationToken,
) {
    let mut backoff = Backoff::default();
    while !shutdown.is_cancelled() {
        let connected = match listener_pool(&database).await {
            Ok(pool) => PgListener::connect_with(&pool)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let mut listener = match connected {
            Ok(l) => l,
            Err(e) => {
                let state = format!("LISTEN connection failed: {e}; relying on polling");
                if health.database_said().should_say(&state) {
                    warn!("{state}");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => continue,
                    _ = shutdown.cancelled() => return,
                }
            }
        };
        if let Err(e) = listener.listen(&channel).await {
            warn!(error = %e, "LISTEN failed; relying on polling");
            tokio::select! {
                _ = tokio::time::sleep(backoff.next_delay()) => continue,
                _ = shutdown.cancelled() => return,
            }
        }
        backoff.reset();
        debug!(%channel, "listening for new rows");
        loop {
            tokio::select! {
                received = listener.recv() => match received {
                    Ok(_) => { wake.send_modify(|n| *n = n.wrapping_add(1)); }
                    Err(e) => { warn!(error = %e, "LISTEN connection lost"); break; }
                },
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
