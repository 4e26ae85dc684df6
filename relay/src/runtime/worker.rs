//! A worker: one database connection and one broker connection, running batches until
//! shutdown. Outages are not message failures: the worker drops the broken connection, backs
//! off with jitter and reconnects; the open transaction rolls back, so no row is marked.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::broker::Publisher;
use crate::broker::amqp::{AmqpPublisher, AmqpSettings};
use crate::metrics::Metrics;
use crate::protocol::batch::{BatchError, BatchSettings, run_batch};
use crate::protocol::cursor::ClaimCursor;
use crate::runtime::backoff::Backoff;
use crate::secret_url::SecretUrl;
use crate::table::sql::Statements;

/// What every worker of a process shares.
#[derive(Clone)]
pub struct WorkerContext {
    pub database_url: SecretUrl,
    pub amqp_url: SecretUrl,
    pub amqp: AmqpSettings,
    pub statements: Arc<Statements>,
    pub settings: BatchSettings,
    pub poll_interval: Duration,
    pub metrics: Metrics,
    pub shutdown: CancellationToken,
    /// Bumped by the LISTEN task when the NOTIFY trigger fires.
    pub wake: watch::Receiver<u64>,
    pub published_total: Arc<AtomicU64>,
}

/// Tracks one connection's contribution to a "connected" gauge.
struct ConnectedFlag {
    gauge: prometheus::IntGauge,
    up: bool,
}

impl ConnectedFlag {
    fn new(gauge: prometheus::IntGauge) -> Self {
        Self { gauge, up: false }
    }

    fn set(&mut self, up: bool) {
        if up != self.up {
            if up {
                self.gauge.inc()
            } else {
                self.gauge.dec()
            }
            self.up = up;
        }
    }
}

impl Drop for ConnectedFlag {
    fn drop(&mut self) {
        self.set(false);
    }
}

pub async fn run_worker(ctx: WorkerContext, worker: usize) {
    let mut db: Option<PgConnection> = None;
    let mut broker: Option<AmqpPublisher> = None;
    let mut db_flag = ConnectedFlag::new(ctx.metrics.database_connected.clone());
    let mut broker_flag = ConnectedFlag::new(ctx.metrics.broker_connected.clone());
    let mut db_backoff = Backoff::default();
    let mut broker_backoff = Backoff::default();
    let mut wake = ctx.wake.clone();
    let mut cursor = ClaimCursor::default();

    while !ctx.shutdown.is_cancelled() {
        if db.is_none() {
            match crate::table::connect::connect(&ctx.database_url).await {
                Ok(conn) => {
                    if db_backoff.failures() > 0 {
                        info!(worker, "reconnected to PostgreSQL");
                    }
                    db_backoff.reset();
                    db = Some(conn);
                }
                Err(e) => {
                    warn!(worker, database = %ctx.database_url, error = %e, "cannot reach PostgreSQL; retrying");
                    pause(&ctx.shutdown, db_backoff.next_delay()).await;
                    continue;
                }
            }
        }
        db_flag.set(true);
        if broker.as_ref().is_none_or(|p| !p.is_connected()) {
            if let Some(old) = broker.take() {
                old.close().await;
            }
            broker_flag.set(false);
            match AmqpPublisher::connect(&ctx.amqp_url, ctx.amqp.clone()).await {
                Ok(publisher) => {
                    if broker_backoff.failures() > 0 {
                        info!(worker, "reconnected to the broker");
                    }
                    broker_backoff.reset();
                    broker = Some(publisher);
                }
                Err(e) => {
                    warn!(worker, broker = %ctx.amqp_url, error = %e, "cannot reach the broker; retrying");
                    pause(&ctx.shutdown, broker_backoff.next_delay()).await;
                    continue;
                }
            }
        }
        broker_flag.set(true);

        let seen_wake = *wake.borrow_and_update();
        let conn = db.as_mut().expect("connected above");
        let publisher = broker.as_mut().expect("connected above");
        let start = cursor.next_start();
        ctx.metrics.workers_busy.inc();
        let result = run_batch(
            conn,
            publisher,
            &ctx.statements,
            &ctx.settings,
            &ctx.metrics,
            start,
        )
        .await;
        ctx.metrics.workers_busy.dec();
        match result {
            Ok(report) => {
                ctx.published_total
                    .fetch_add(report.published as u64, Ordering::Relaxed);
                cursor.advance(&report, ctx.settings.batch_size);
                if let Some(reason) = report.broker_broken {
                    warn!(worker, %reason, untouched = report.untouched, "broker connection failed mid-batch; reconnecting");
                    if let Some(old) = broker.take() {
                        old.close().await;
                    }
                    broker_flag.set(false);
                    pause(&ctx.shutdown, broker_backoff.next_delay()).await;
                } else if report.claimed == 0 && cursor.idle_after_empty_claim() {
                    idle(&ctx, &mut wake, seen_wake).await;
                }
            }
            Err(e) => {
                let message = match &e {
                    BatchError::Database(err) => err.to_string(),
                    BatchError::DatabaseTimeout(_) => e.to_string(),
                };
                warn!(worker, error = %message, "batch rolled back; reconnecting to PostgreSQL");
                db = None;
                cursor.reset();
                db_flag.set(false);
                pause(&ctx.shutdown, db_backoff.next_delay()).await;
            }
        }
    }
    if let Some(publisher) = broker {
        publisher.close().await;
    }
    if let Some(conn) = db {
        let _ = conn.close().await;
    }
}

/// Sleeps, but wakes at once on shutdown.
async fn pause(shutdown: &CancellationToken, delay: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.cancelled() => {}
    }
}

/// Waits for new rows: a NOTIFY (when listening), the poll interval, or shutdown. A NOTIFY that
/// arrived while the worker was claiming counts too, since it compares against `seen`.
async fn idle(ctx: &WorkerContext, wake: &mut watch::Receiver<u64>, seen: u64) {
    if *wake.borrow() != seen {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep(ctx.poll_interval) => {}
        // Err means nobody can signal any more (listening is off): rely on the poll interval.
        Ok(()) = wake.changed() => {}
        _ = ctx.shutdown.cancelled() => {}
    }
}
