//! A worker: one database connection and one publisher, running batches until shutdown.
//! Outages are not message failures: the worker drops the broken connection, backs off with
//! jitter and reconnects; the open transaction rolls back, so no row is marked.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::broker::{Connector, Publisher};
use crate::metrics::Metrics;
use crate::protocol::batch::{BatchSettings, run_batch};
use crate::protocol::cursor::ClaimCursor;
use crate::runtime::backoff::Backoff;
use crate::secret_url::SecretUrl;
use crate::table::sql::Statements;

/// What every worker of a process shares. `C` opens the publishers: the worker never names a
/// broker.
#[derive(Clone)]
pub struct WorkerContext<C> {
    pub database_url: SecretUrl,
    pub broker: C,
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
                self.gauge.inc();
            } else {
                self.gauge.dec();
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

/// One of the worker's two connections, with its gauge and its backoff: the same reconnect
/// rules for the database and the broker.
struct Link<T> {
    /// "PostgreSQL" or "the broker", for the log lines.
    service: &'static str,
    connection: Option<T>,
    flag: ConnectedFlag,
    backoff: Backoff,
}

impl<T> Link<T> {
    fn new(service: &'static str, gauge: prometheus::IntGauge) -> Self {
        Self {
            service,
            connection: None,
            flag: ConnectedFlag::new(gauge),
            backoff: Backoff::default(),
        }
    }

    /// Connects unless connected. False when that failed; it has then waited its backoff.
    async fn ensure<E: Display>(
        &mut self,
        connect: impl Future<Output = Result<T, E>>,
        endpoint: &(dyn Display + Sync),
        shutdown: &CancellationToken,
    ) -> bool {
        if self.connection.is_none() {
            match connect.await {
                Ok(connection) => {
                    if self.backoff.failures() > 0 {
                        info!("reconnected to {}", self.service);
                    }
                    self.backoff.reset();
                    self.connection = Some(connection);
                }
                Err(e) => {
                    warn!(endpoint = %endpoint, error = %e, "cannot reach {}; retrying", self.service);
                    pause(shutdown, self.backoff.next_delay()).await;
                    return false;
                }
            }
        }
        self.flag.set(true);
        true
    }

    /// After a failure of the connection taken away: waits before the next attempt.
    async fn back_off(&mut self, shutdown: &CancellationToken) {
        pause(shutdown, self.backoff.next_delay()).await;
    }

    /// Takes the connection away, e.g. for closing; the gauge counts it as down.
    fn take(&mut self) -> Option<T> {
        self.flag.set(false);
        self.connection.take()
    }
}

pub async fn run_worker<C: Connector>(ctx: WorkerContext<C>, worker: usize) {
    run_worker_loop(ctx)
        .instrument(info_span!("worker", worker))
        .await;
}

async fn run_worker_loop<C: Connector>(ctx: WorkerContext<C>) {
    let mut db: Link<PgConnection> =
        Link::new("PostgreSQL", ctx.metrics.database_connected.clone());
    let mut broker: Link<C::Publisher> =
        Link::new("the broker", ctx.metrics.broker_connected.clone());
    let mut wake = ctx.wake.clone();
    let mut cursor = ClaimCursor::default();

    while !ctx.shutdown.is_cancelled() {
        let connect_db = crate::table::connect::connect(&ctx.database_url);
        if !db
            .ensure(connect_db, &ctx.database_url, &ctx.shutdown)
            .await
        {
            continue;
        }
        if broker
            .connection
            .as_ref()
            .is_some_and(|p| !p.is_connected())
            && let Some(old) = broker.take()
        {
            old.close().await;
        }
        if !broker
            .ensure(ctx.broker.connect(), ctx.broker.endpoint(), &ctx.shutdown)
            .await
        {
            continue;
        }

        let seen_wake = *wake.borrow_and_update();
        let conn = db.connection.as_mut().expect("connected above");
        let publisher = broker.connection.as_mut().expect("connected above");
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
                if let Some(reason) = &report.broker_broken {
                    warn!(%reason, untouched = report.untouched, "broker connection failed mid-batch; reconnecting");
                    if let Some(old) = broker.take() {
                        old.close().await;
                    }
                    broker.back_off(&ctx.shutdown).await;
                } else if report.claimed == 0 && cursor.idle_after_empty_claim() {
                    idle(&ctx, &mut wake, seen_wake).await;
                }
            }
            Err(e) => {
                warn!(error = %e, "batch rolled back; reconnecting to PostgreSQL");
                cursor.reset();
                drop(db.take());
                db.back_off(&ctx.shutdown).await;
            }
        }
    }
    if let Some(publisher) = broker.take() {
        publisher.close().await;
    }
    if let Some(conn) = db.take() {
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
async fn idle<C>(ctx: &WorkerContext<C>, wake: &mut watch::Receiver<u64>, seen: u64) {
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
