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

use crate::announce::Announcer;
use crate::database::{DatabaseTarget, PoolMode, TRANSACTION_POOLING, behind_transaction_pooling};
use crate::defaults::BACKLOG_CAP;
use crate::metrics::Metrics;
use crate::runtime::health::Health;
use crate::runtime::rate::{LimitChange, RateGate};
use crate::table::OutboxTable;
use crate::table::health::{HorizonClock, TableHealth, measure_table_health_with};
use crate::table::ident::TableName;
use crate::table::reports::{
    Backlog, Report, Stored, measure_backlog, measurer_lock_key, upsert_report_with,
};
use crate::table::sql::Statements;

pub struct ReporterContext {
    pub database: DatabaseTarget,
    /// What `database` reaches. Under a transaction pool each report is one transaction, and
    /// the measurer is whoever holds the relay's lock during its report (a transaction lock:
    /// a session lock would stay on a server session other clients get).
    pub pool_mode: PoolMode,
    pub reports_table: TableName,
    /// Where the operator writes this relay's per-pod share of `spec.relay.maxRate`.
    pub limits_table: TableName,
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
    /// The rate limit: its share is read again at each report.
    pub rate: Arc<RateGate>,
    pub shutdown: CancellationToken,
}

/// Rows deleted per retention pass; small enough to keep each DELETE short.
const PURGE_CHUNK: i64 = 5_000;

struct Session {
    conn: PgConnection,
    state: SessionState,
}

/// What the reporter remembers about its connection.
#[derive(Default)]
struct SessionState {
    /// Holds the relay's measurer lock for the session's life (session pool mode only).
    measurer: bool,
    /// Said once per session that the report table cannot hold the problem yet.
    told_to_migrate: bool,
    /// Said once per session that another role's session holds the horizon, and which
    /// privilege would show more of it.
    told_hidden_holder: bool,
    /// Said once that this process measures.
    told_measuring: bool,
    /// Said once per session that the rate-limit share cannot be read.
    told_share_unreadable: bool,
    horizon_clock: HorizonClock,
}

/// A report that failed, with the step that failed, so the log says what went wrong rather
/// than guessing at a cause.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed: {source}{hint}")]
struct ReportError {
    step: &'static str,
    source: sqlx::Error,
    hint: String,
}

impl ReportError {
    fn at(step: &'static str, reports: &TableName) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| {
            let hint = if behind_transaction_pooling(&source) {
                format!(": {TRANSACTION_POOLING}")
            } else if step == WRITING && is_undefined_table(&source) {
                // Only a missing report table is cured by a migration.
                format!(": the report table {reports} does not exist")
            } else {
                String::new()
            };
            Self { step, source, hint }
        }
    }
}

impl ReportError {
    /// The cause when it is the schema's (a missing table or column, a privilege): the user's
    /// to fix, which a new connection does not cure.
    fn schema_cause(&self) -> Option<&'static str> {
        let code = self.source.as_database_error()?.code()?;
        match code.as_ref() {
            "42P01" => Some("ReportTableMissing"),
            "42703" => Some("ReportColumnMissing"),
            "42501" => Some("ReportPrivilege"),
            _ => None,
        }
    }
}

const WRITING: &str = "writing this pod's report row";

/// PostgreSQL's undefined_table (42P01).
fn is_undefined_table(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "42P01")
}

/// What fixes a report the schema refuses.
fn schema_fix(table: &TableName) -> String {
    format!(
        "run `outbox-relay migrate --table {table}` as a role that may create tables (or let \
         the operator migrate it), and grant the relay's role INSERT, UPDATE and DELETE on the \
         report table"
    )
}

pub async fn run_reporter(ctx: ReporterContext) {
    let mut session: Option<Session> = None;
    // A failing report is said once, then once a minute: the same cause every interval.
    let report_said = Announcer::default();
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
            let refusals = &ctx.metrics.database_standby_refusals;
            match crate::database::connect_counted(&ctx.database, refusals).await {
                Ok(conn) => {
                    session = Some(Session {
                        conn,
                        state: SessionState::default(),
                    });
                }
                Err(e) => {
                    // The workers meet the same state and say it; said here only when it is
                    // news to them too.
                    let state = format!("reporter cannot connect to PostgreSQL: {e}");
                    if ctx.health.database_said().should_say(&state) {
                        warn!("{state}; skipping this report");
                    }
                    continue;
                }
            }
        }
        let current = session.as_mut().expect("connected above");
        match report(&ctx, current, total, rate).await {
            Ok(()) => {
                ctx.health.report_problem(None);
                if let Some(lasted) = report_said.over() {
                    info!(
                        after_s = lasted.as_secs(),
                        "the lag report is written again"
                    );
                }
            }
            Err(e) => {
                let cause = e.schema_cause();
                ctx.metrics
                    .report_failures
                    .with_label_values(&[cause.unwrap_or("Database")])
                    .inc();
                let failed_since = report_said.say(&e.to_string());
                match cause {
                    // The same on every connection: said once a minute, not reconnected for.
                    Some(cause) => {
                        let fix = schema_fix(&ctx.table.name);
                        if let Some(failed_since) = failed_since {
                            warn!(error = %e, reason = cause, failed_since, "the lag report cannot be written: {fix}; the relay relays meanwhile");
                        }
                        ctx.health
                            .report_problem(Some(format!("{cause}: {e}; {fix}")));
                    }
                    None => {
                        if let Some(failed_since) = failed_since {
                            warn!(error = %e, failed_since, "the lag report failed; reconnecting for the next one");
                        }
                        session = None;
                    }
                }
            }
        }
    }
    // A stopping pod removes its row so its rate no longer counts.
    if let Some(mut s) = session {
        let sql = format!(
            "DELETE FROM {} WHERE relay = $1 AND pod = $2",
            ctx.reports_table.quoted()
        );
        let delete = sqlx::query(AssertSqlSafe(sql))
            .bind(&ctx.relay)
            .bind(&ctx.pod)
            .persistent(ctx.pool_mode.named_statements());
        if ctx.pool_mode.named_statements() {
            let _ = delete.execute(&mut s.conn).await;
        } else if let Ok(mut tx) = s.conn.begin().await {
            // Unnamed statements need a transaction to keep one server session (see PoolMode).
            if delete.execute(&mut *tx).await.is_ok() {
                let _ = tx.commit().await;
            }
        }
        let _ = s.conn.close().await;
    }
}

/// One report: on a session as a few statements; under a transaction pool as one transaction,
/// since its statements then go unnamed.
async fn report(
    ctx: &ReporterContext,
    session: &mut Session,
    total: u64,
    rate: f64,
) -> Result<(), ReportError> {
    let Session { conn, state } = session;
    if ctx.pool_mode.named_statements() {
        return report_once(ctx, conn, state, total, rate).await;
    }
    let mut tx = conn.begin().await.map_err(ReportError::at(
        "opening the report's transaction",
        &ctx.reports_table,
    ))?;
    report_once(ctx, &mut tx, state, total, rate).await?;
    tx.commit()
        .await
        .map_err(ReportError::at("committing the report", &ctx.reports_table))
}

/// Whether this process measures the backlog and the table's health now.
async fn measures(
    ctx: &ReporterContext,
    conn: &mut PgConnection,
    state: &mut SessionState,
) -> Result<bool, sqlx::Error> {
    let measurer = match ctx.pool_mode {
        // Session-level lock: held until this connection closes, so the measurer is stable.
        PoolMode::Session if state.measurer => true,
        PoolMode::Session => {
            state.measurer =
                sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
                    .bind(measurer_lock_key(&ctx.relay))
                    .fetch_one(&mut *conn)
                    .await?;
            state.measurer
        }
        // Held to the end of this report's transaction: pods reporting at the same moment
        // do not count twice; at other moments each pod may measure (a capped count).
        PoolMode::Transaction => {
            sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))")
                .bind(measurer_lock_key(&ctx.relay))
                .persistent(false)
                .fetch_one(&mut *conn)
                .await?
        }
    };
    if measurer && !state.told_measuring {
        info!("this process measures the backlog for the relay");
        state.told_measuring = true;
    }
    Ok(measurer)
}

async fn report_once(
    ctx: &ReporterContext,
    conn: &mut PgConnection,
    state: &mut SessionState,
    total: u64,
    rate: f64,
) -> Result<(), ReportError> {
    let reports = &ctx.reports_table;
    match read_share_into(
        conn,
        ctx.pool_mode,
        &ctx.limits_table,
        &ctx.relay,
        &ctx.rate,
    )
    .await
    {
        Ok(change) => say_limit_change(change, "this pod's share of spec.relay.maxRate changed"),
        // The limit in force stays as it is; the report goes on.
        Err(e) if !state.told_share_unreadable => {
            warn!(error = %e, limits = %ctx.limits_table, "cannot read this relay's rate-limit share; keeping the limit in force");
            state.told_share_unreadable = true;
        }
        Err(_) => {}
    }
    let measurer = measures(ctx, conn, state)
        .await
        .map_err(ReportError::at("taking the measurer's lock", reports))?;
    let backlog: Option<Backlog> = if measurer {
        let backlog = measure_backlog(conn, &ctx.statements, BACKLOG_CAP)
            .await
            .map_err(ReportError::at("measuring the backlog", reports))?;
        ctx.metrics.backlog.set(backlog.pending);
        ctx.metrics.backlog_capped.set(i64::from(backlog.capped));
        ctx.metrics
            .oldest_age_seconds
            .set(backlog.oldest_age_seconds.unwrap_or(0.0));
        if let Some(retention) = ctx.retention {
            let purged = sqlx::query(AssertSqlSafe(ctx.statements.purge_processed.clone()))
                .bind(retention.as_secs_f64())
                .bind(PURGE_CHUNK)
                .persistent(ctx.statements.persistent())
                .execute(&mut *conn)
                .await
                .map_err(ReportError::at(
                    "deleting processed rows past the retention",
                    reports,
                ))?
                .rows_affected();
            if purged > 0 {
                debug!(purged, "deleted processed rows past the retention");
            }
        }
        Some(backlog)
    } else {
        None
    };
    let table_health = if measurer {
        let health =
            measure_table_health_with(conn, &ctx.table, &mut state.horizon_clock, ctx.pool_mode)
                .await
                .map_err(ReportError::at("measuring the table's health", reports))?;
        publish_table_health(&ctx.metrics, &health);
        if let Some(holder) = health.hidden_holder()
            && !state.told_hidden_holder
        {
            warn!(
                holder = %holder,
                "the cleanup horizon is held by another role's session: this role sees its pid \
                 and application name but not its state or how long it has been open (its age \
                 counts from when this process first saw it); grant pg_read_all_stats to the \
                 relay's database role to see them"
            );
            state.told_hidden_holder = true;
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
        max_rate: ctx.rate.in_force(),
        rate_limited_seconds: ctx.rate.in_force().map(|_| ctx.rate.take_waited_seconds()),
    };
    let stored = upsert_report_with(conn, reports, &report, ctx.pool_mode)
        .await
        .map_err(ReportError::at(WRITING, reports))?;
    ctx.metrics
        .last_report_timestamp
        .set(report.reported_at.timestamp_millis() as f64 / 1000.0);
    if stored == Stored::LagOnly && !state.told_to_migrate {
        warn!(
            "the report table has no problem and table-health columns, so the operator cannot \
             see why this pod is not relaying or what holds back VACUUM; run `outbox-relay \
             migrate` to add them"
        );
        state.told_to_migrate = true;
    }
    Ok(())
}

/// Reads `relay`'s per-pod share from the limits table and hands it to the rate limit, in a
/// transaction (a savepoint inside the report's) so a failed read never aborts the caller's.
pub async fn read_share_into(
    conn: &mut PgConnection,
    pool_mode: PoolMode,
    limits: &TableName,
    relay: &str,
    rate: &RateGate,
) -> Result<LimitChange, sqlx::Error> {
    let mut tx = conn.begin().await?;
    let share =
        crate::table::limits::read_share(&mut tx, limits, relay, pool_mode.named_statements())
            .await?;
    tx.commit().await?;
    Ok(rate.set_share(share))
}

/// Says a new limit in force, once, when it changed.
pub fn say_limit_change(change: LimitChange, why: &str) {
    match change {
        LimitChange::Unchanged => {}
        LimitChange::Now(Some(rate)) => {
            info!(
                max_rate = rate,
                "rate limit in force: {rate} messages per second ({why})"
            );
        }
        LimitChange::Now(None) => info!("no rate limit in force any more ({why})"),
    }
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
