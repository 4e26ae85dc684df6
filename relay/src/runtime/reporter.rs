//! The per-process reporter: every report interval it upserts this pod's row in the report
//! table; the pod holding the relay's advisory lock also measures the backlog and the table's
//! health (and, when a retention is set, purges old processed rows), so one count runs per
//! relay, not one per pod.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::database::DatabaseTarget;
use crate::defaults::BACKLOG_CAP;
use crate::metrics::Metrics;
use crate::runtime::health::Health;
use crate::table::OutboxTable;
use crate::table::health::{HorizonClock, TableHealth, measure_table_health};
use crate::table::ident::TableName;
use crate::table::reports::{
    Backlog, Report, Stored, measure_backlog, measurer_lock_key, upsert_report,
};
use crate::table::sql::Statements;

pub struct ReporterContext {
    pub database: DatabaseTarget,
    pub reports_table: TableName,
    pub table: OutboxTable,
    pub statements: Arc<Statements>,
    pub relay: String,
    pub pod: String,
    pub interval: Duration,
    pub retention: Option<Duration>,
    pub metrics: Metrics,
    pub published_total: Arc<AtomicU64>,
    /// What keeps the process from relaying, written with each report.
    pub health: Health,
    pub shutdown: CancellationToken,
}

/// Rows deleted per retention pass; small enough to keep each DELETE short.
const PURGE_CHUNK: i64 = 5_000;

struct Session {
    conn: PgConnection,
    measurer: bool,
    /// Said once per session that the report table cannot hold the problem yet.
    told_to_migrate: bool,
    /// Said once per session that another role's session holds the horizon, and which
    /// privilege would show more of it.
    told_hidden_holder: bool,
    horizon_clock: HorizonClock,
}

pub async fn run_reporter(ctx: ReporterContext) {
    let mut session: Option<Session> = None;
    let mut last_total = ctx.published_total.load(Ordering::Relaxed);
    let mut last_at = Instant::now();
    let mut ticker = tokio::time::interval(ctx.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = ctx.shutdown.cancelled() => break,
        }
        let total = ctx.published_total.load(Ordering::Relaxed);
        let elapsed = last_at.elapsed().as_secs_f64().max(1e-3);
        let rate = (total - last_total) as f64 / elapsed;
        ctx.metrics.publish_rate.set(rate);
        (last_total, last_at) = (total, Instant::now());

        if session.is_none() {
            match crate::database::connect(&ctx.database).await {
                Ok(conn) => {
                    session = Some(Session {
                        conn,
                        measurer: false,
                        told_to_migrate: false,
                        told_hidden_holder: false,
                        horizon_clock: HorizonClock::default(),
                    });
                }
                Err(e) => {
                    warn!(error = %e, "reporter cannot reach PostgreSQL; skipping this report");
                    continue;
                }
            }
        }
        let current = session.as_mut().expect("connected above");
        if let Err(e) = report_once(&ctx, current, total, rate).await {
            warn!(error = %e, "writing the lag report failed");
            session = None;
        }
    }
    // A stopping pod removes its row so its rate no longer counts.
    if let Some(mut s) = session {
        let sql = format!(
            "DELETE FROM {} WHERE relay = $1 AND pod = $2",
            ctx.reports_table.quoted()
        );
        let _ = sqlx::query(AssertSqlSafe(sql))
            .bind(&ctx.relay)
            .bind(&ctx.pod)
            .execute(&mut s.conn)
            .await;
        let _ = s.conn.close().await;
    }
}

async fn report_once(
    ctx: &ReporterContext,
    session: &mut Session,
    total: u64,
    rate: f64,
) -> Result<(), sqlx::Error> {
    if !session.measurer {
        // Session-level lock: held until this connection closes, so the measurer is stable.
        session.measurer =
            sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
                .bind(measurer_lock_key(&ctx.relay))
                .fetch_one(&mut session.conn)
                .await?;
        if session.measurer {
            info!("this process measures the backlog for the relay");
        }
    }
    let backlog: Option<Backlog> = if session.measurer {
        let backlog = measure_backlog(&mut session.conn, &ctx.statements, BACKLOG_CAP).await?;
        ctx.metrics.backlog.set(backlog.pending);
        ctx.metrics.backlog_capped.set(i64::from(backlog.capped));
        ctx.metrics
            .oldest_age_seconds
            .set(backlog.oldest_age_seconds.unwrap_or(0.0));
        if let Some(retention) = ctx.retention {
            let purged = sqlx::query(AssertSqlSafe(ctx.statements.purge_processed.clone()))
                .bind(retention.as_secs_f64())
                .bind(PURGE_CHUNK)
                .execute(&mut session.conn)
                .await?
                .rows_affected();
            if purged > 0 {
                debug!(purged, "deleted processed rows past the retention");
            }
        }
        Some(backlog)
    } else {
        None
    };
    let table_health = if session.measurer {
        let health =
            measure_table_health(&mut session.conn, &ctx.table, &mut session.horizon_clock).await?;
        publish_table_health(&ctx.metrics, &health);
        if let Some(holder) = health.hidden_holder()
            && !session.told_hidden_holder
        {
            warn!(
                holder = %holder,
                "the cleanup horizon is held by another role's session: this role sees its pid \
                 and application name but not its state or how long it has been open (its age \
                 counts from when this process first saw it); grant pg_read_all_stats to the \
                 relay's database role to see them"
            );
            session.told_hidden_holder = true;
        }
        Some(health)
    } else {
        None
    };
    let report = Report {
        relay: ctx.relay.clone(),
        pod: ctx.pod.clone(),
        reported_at: chrono::Utc::now(),
        backlog,
        published_total: i64::try_from(total).unwrap_or(i64::MAX),
        publish_rate: rate,
        problem: ctx.health.problem(),
        table_health,
    };
    let stored = upsert_report(&mut session.conn, &ctx.reports_table, &report).await?;
    ctx.metrics
        .last_report_timestamp
        .set(report.reported_at.timestamp_millis() as f64 / 1000.0);
    if stored == Stored::LagOnly && !session.told_to_migrate {
        warn!(
            "the report table has no problem and table-health columns, so the operator cannot \
             see why this pod is not relaying or what holds back VACUUM; run `outbox-relay \
             migrate` to add them"
        );
        session.told_to_migrate = true;
    }
    Ok(())
}

/// Sets the table-health gauges; the holder series is replaced, so only the current one shows.
fn publish_table_health(metrics: &Metrics, health: &TableHealth) {
    let m = &metrics.table;
    m.horizon_age_seconds.set(health.horizon_age_seconds());
    m.horizon_age_xids
        .set(health.horizon.as_ref().map_or(0, |h| h.age_xids));
    m.horizon_holder.reset();
    if let Some(holder) = &health.horizon {
        let pid = holder.pid.map(|p| p.to_string()).unwrap_or_default();
        let name = holder.name.as_deref().unwrap_or("");
        m.horizon_holder
            .with_label_values(&[holder.kind.label(), pid.as_str(), name])
            .set(1);
    }
    m.dead_tuples.set(health.dead_tuples.unwrap_or(0));
    m.live_tuples.set(health.live_tuples.unwrap_or(0));
    m.last_vacuum_age_seconds
        .set(health.last_vacuum_age_seconds.unwrap_or(-1.0));
    m.pending_index_bytes
        .set(health.pending_index_bytes.unwrap_or(0));
    m.autovacuum_enabled
        .with_label_values(&["server"])
        .set(i64::from(health.server_autovacuum));
    m.autovacuum_enabled
        .with_label_values(&["table"])
        .set(i64::from(health.table_autovacuum));
}
