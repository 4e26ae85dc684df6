//! Lag reports: what the relay pods tell the operator about the backlog.
//!
//! Every pod upserts one row `(relay, pod)` per report interval with its publish rate and
//! total. Only the pod holding the relay's advisory lock measures the backlog, so N pods do not
//! run N counts; the count is capped so a huge backlog costs bounded time.

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgConnection};

use crate::table::ident::TableName;
use crate::table::sql::Statements;

pub fn create_table_sql(reports: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
           relay text NOT NULL, \
           pod text NOT NULL, \
           reported_at timestamptz NOT NULL DEFAULT now(), \
           backlog bigint, \
           backlog_capped boolean NOT NULL DEFAULT false, \
           oldest_age_seconds double precision, \
           published_total bigint NOT NULL DEFAULT 0, \
           publish_rate double precision NOT NULL DEFAULT 0, \
           PRIMARY KEY (relay, pod))",
        reports.quoted()
    )
}

/// The pending rows of a table, as measured now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub pending: i64,
    /// True when counting stopped at the cap: there are at least `pending` rows.
    pub capped: bool,
    /// Age of the oldest pending row, `None` when nothing is pending.
    pub oldest_age_seconds: Option<f64>,
}

/// Measures the backlog with a capped count over the pending index.
pub async fn measure_backlog(
    conn: &mut PgConnection,
    statements: &Statements,
    cap: i64,
) -> Result<Backlog, sqlx::Error> {
    let pending: i64 = sqlx::query_scalar(AssertSqlSafe(statements.backlog.clone()))
        .bind(cap)
        .fetch_one(&mut *conn)
        .await?;
    let oldest_age_seconds: Option<f64> =
        sqlx::query_scalar(AssertSqlSafe(statements.oldest_age.clone()))
            .fetch_optional(&mut *conn)
            .await?
            .flatten();
    Ok(Backlog {
        pending,
        capped: pending >= cap,
        oldest_age_seconds,
    })
}

/// One pod's report row.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub relay: String,
    pub pod: String,
    pub reported_at: DateTime<Utc>,
    pub backlog: Option<Backlog>,
    pub published_total: i64,
    pub publish_rate: f64,
}

/// Writes (or replaces) this pod's report. The backlog columns are only overwritten by the
/// pod that measured, so a non-measuring pod leaves them NULL.
pub async fn upsert_report(
    conn: &mut PgConnection,
    reports: &TableName,
    report: &Report,
) -> Result<(), sqlx::Error> {
    let sql = format!(
        "INSERT INTO {} AS r (relay, pod, reported_at, backlog, backlog_capped, oldest_age_seconds, published_total, publish_rate) \
         VALUES ($1, $2, now(), $3, $4, $5, $6, $7) \
         ON CONFLICT (relay, pod) DO UPDATE SET reported_at = now(), backlog = EXCLUDED.backlog, \
         backlog_capped = EXCLUDED.backlog_capped, oldest_age_seconds = EXCLUDED.oldest_age_seconds, \
         published_total = EXCLUDED.published_total, publish_rate = EXCLUDED.publish_rate",
        reports.quoted()
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(&report.relay)
        .bind(&report.pod)
        .bind(report.backlog.map(|b| b.pending))
        .bind(report.backlog.is_some_and(|b| b.capped))
        .bind(report.backlog.and_then(|b| b.oldest_age_seconds))
        .bind(report.published_total)
        .bind(report.publish_rate)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Reports of one relay newer than `max_age_seconds`, newest first. Older rows belong to pods
/// that stopped; they are deleted on the way so the table does not grow with pod churn.
pub async fn read_reports(
    conn: &mut PgConnection,
    reports: &TableName,
    relay: &str,
    max_age_seconds: f64,
) -> Result<Vec<Report>, sqlx::Error> {
    let t = reports.quoted();
    // Rows ten times older than the freshness limit are certainly dead.
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {t} WHERE relay = $1 AND reported_at < now() - make_interval(secs => $2)"
    )))
    .bind(relay)
    .bind(max_age_seconds * 10.0)
    .execute(&mut *conn)
    .await?;
    let rows: Vec<ReportRow> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT relay, pod, reported_at, backlog, backlog_capped, oldest_age_seconds, published_total, publish_rate \
         FROM {t} WHERE relay = $1 AND reported_at >= now() - make_interval(secs => $2) ORDER BY reported_at DESC"
    )))
    .bind(relay)
    .bind(max_age_seconds)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(Report::from).collect())
}

/// A row of the report table as stored.
#[derive(sqlx::FromRow)]
struct ReportRow {
    relay: String,
    pod: String,
    reported_at: DateTime<Utc>,
    backlog: Option<i64>,
    backlog_capped: bool,
    oldest_age_seconds: Option<f64>,
    published_total: i64,
    publish_rate: f64,
}

impl From<ReportRow> for Report {
    fn from(row: ReportRow) -> Self {
        Report {
            backlog: row.backlog.map(|pending| Backlog {
                pending,
                capped: row.backlog_capped,
                oldest_age_seconds: row.oldest_age_seconds,
            }),
            relay: row.relay,
            pod: row.pod,
            reported_at: row.reported_at,
            published_total: row.published_total,
            publish_rate: row.publish_rate,
        }
    }
}

/// The relay-wide view the operator scales on: the freshest measured backlog and the sum of
/// the pods' publish rates.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayLag {
    pub backlog: Option<Backlog>,
    pub publish_rate: f64,
    pub reporting_pods: usize,
    pub newest_report: Option<DateTime<Utc>>,
}

pub fn summarize(reports: &[Report]) -> RelayLag {
    RelayLag {
        backlog: reports
            .iter()
            .filter_map(|r| r.backlog.map(|b| (r.reported_at, b)))
            .max_by_key(|(at, _)| *at)
            .map(|(_, b)| b),
        publish_rate: reports.iter().map(|r| r.publish_rate).sum(),
        reporting_pods: reports.len(),
        newest_report: reports.iter().map(|r| r.reported_at).max(),
    }
}

/// Advisory lock key text for "who measures the backlog of this relay".
pub fn measurer_lock_key(relay: &str) -> String {
    format!("outbox-relay:measure:{relay}")
}
