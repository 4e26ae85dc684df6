//! Lag reports: what the relay pods tell the operator about the backlog.
//!
//! Every pod upserts one row `(relay, pod)` per report interval with its publish rate and
//! total, and the problem that keeps it from relaying, if any (so the operator can name it
//! without reading the pod's logs). Only the pod holding the relay's advisory lock measures
//! the backlog and the table's health, so N pods do not run N counts; the count is capped so a
//! huge backlog costs bounded time.

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

use crate::database::PoolMode;
use crate::table::health::TableHealth;
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
           problem_kind text, \
           problem text, \
           table_health jsonb, \
           max_rate double precision, \
           rate_limited_seconds double precision, \
           PRIMARY KEY (relay, pod))",
        reports.quoted()
    )
}

/// Brings a report table made by an earlier version up to [`create_table_sql`]'s columns.
pub fn upgrade_table_sql(reports: &TableName) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS problem_kind text, \
         ADD COLUMN IF NOT EXISTS problem text, ADD COLUMN IF NOT EXISTS table_health jsonb, \
         ADD COLUMN IF NOT EXISTS max_rate double precision, \
         ADD COLUMN IF NOT EXISTS rate_limited_seconds double precision",
        reports.quoted()
    )
}

/// What keeps a pod from relaying, as a code a program can act on; [`Problem::message`] says
/// it to a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProblemKind {
    /// The exchange to publish to (or the dead-letter exchange) is missing on the broker.
    ExchangeNotFound,
    /// The AMQP 1.0 broker has no node at the target address.
    AddressNotFound,
    /// The database's TLS handshake fails (untrusted or expired certificate, wrong host name,
    /// no TLS on the server, a refused client certificate).
    DatabaseTls,
    /// The database refuses the login (password, pg_hba rule, certificate user).
    DatabaseAuth,
    /// A database setting or a file it names is unusable (password file, sslrootcert, sslmode).
    DatabaseSettings,
    /// Every database server reached is a read-only standby: waiting for a primary.
    DatabaseReadOnly,
    /// The broker's TLS handshake fails.
    BrokerTls,
    /// The broker refuses the login.
    BrokerAuth,
    /// A broker setting or file is unusable (CA file, client certificate, password file).
    BrokerSettings,
    /// The broker blocks publishing (a memory or disk alarm): nothing is claimed until it lifts.
    BrokerBlocked,
    /// The broker does not answer, or refuses connections (down, restarting, a cut network,
    /// a host name that does not resolve).
    BrokerUnreachable,
    /// The database does not answer, or refuses connections; shown on the pod's `/readyz`
    /// (a pod that cannot reach the database cannot write its report either).
    DatabaseUnreachable,
    /// A code this version does not know, written by a newer relay; kept as written.
    Other(String),
}

impl ProblemKind {
    /// The code stored in the `problem_kind` column, usable as a Kubernetes condition reason.
    pub fn code(&self) -> &str {
        match self {
            ProblemKind::ExchangeNotFound => "ExchangeNotFound",
            ProblemKind::AddressNotFound => "AddressNotFound",
            ProblemKind::DatabaseTls => "DatabaseTLS",
            ProblemKind::DatabaseAuth => "DatabaseAuth",
            ProblemKind::DatabaseSettings => "DatabaseSettings",
            ProblemKind::DatabaseReadOnly => "DatabaseReadOnly",
            ProblemKind::BrokerTls => "BrokerTLS",
            ProblemKind::BrokerAuth => "BrokerAuth",
            ProblemKind::BrokerSettings => "BrokerSettings",
            ProblemKind::BrokerBlocked => "BrokerBlocked",
            ProblemKind::BrokerUnreachable => "BrokerUnreachable",
            ProblemKind::DatabaseUnreachable => "DatabaseUnreachable",
            ProblemKind::Other(code) => code,
        }
    }

    pub fn from_code(code: &str) -> Self {
        match code {
            "ExchangeNotFound" => ProblemKind::ExchangeNotFound,
            "AddressNotFound" => ProblemKind::AddressNotFound,
            "DatabaseTLS" => ProblemKind::DatabaseTls,
            "DatabaseAuth" => ProblemKind::DatabaseAuth,
            "DatabaseSettings" => ProblemKind::DatabaseSettings,
            "DatabaseReadOnly" => ProblemKind::DatabaseReadOnly,
            "BrokerTLS" => ProblemKind::BrokerTls,
            "BrokerAuth" => ProblemKind::BrokerAuth,
            "BrokerSettings" => ProblemKind::BrokerSettings,
            "BrokerBlocked" => ProblemKind::BrokerBlocked,
            "BrokerUnreachable" => ProblemKind::BrokerUnreachable,
            "DatabaseUnreachable" => ProblemKind::DatabaseUnreachable,
            other => ProblemKind::Other(other.to_string()),
        }
    }

    /// True for a server's state that usually passes without anyone's help (a restart, a
    /// failover, an alarm that clears, a network that heals): the relay retries, and the
    /// operator says Reconciling before Stalled. The rest (a password, a certificate, a missing
    /// exchange) need a person at once.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            ProblemKind::BrokerUnreachable
                | ProblemKind::DatabaseUnreachable
                | ProblemKind::DatabaseReadOnly
                | ProblemKind::BrokerBlocked
        )
    }
}

/// Why a pod cannot relay right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    /// What to tell the user, e.g. `exchange orders does not exist on vhost /: declare it, or
    /// pass --declare-exchange TYPE`. Never carries a password.
    pub message: String,
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
        .persistent(statements.persistent())
        .fetch_one(&mut *conn)
        .await?;
    let oldest_age_seconds: Option<f64> =
        sqlx::query_scalar(AssertSqlSafe(statements.oldest_age.clone()))
            .persistent(statements.persistent())
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
    /// What keeps the pod from relaying at the time of the report; None when it relays.
    pub problem: Option<Problem>,
    /// The table's health, from the measuring pod only (like the backlog).
    pub table_health: Option<TableHealth>,
    /// The rate limit in force in the pod (messages per second); None: none, or a relay older
    /// than rate limits.
    pub max_rate: Option<f64>,
    /// Seconds the pod's workers waited for rate-limit permits during the interval, summed
    /// over workers; None without a limit.
    pub rate_limited_seconds: Option<f64>,
}

/// What [`upsert_report`] could store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    Everything,
    /// The report table predates the rate-limit columns (`outbox-relay migrate` adds them):
    /// all but the limit was stored.
    WithoutRateLimit,
    /// The report table predates the problem and table-health columns (`outbox-relay
    /// migrate` adds them): the lag was stored, so the backlog and rates still reach the
    /// operator.
    LagOnly,
}

/// Writes (or replaces) this pod's report. The backlog columns are only overwritten by the
/// pod that measured, so a non-measuring pod leaves them NULL.
pub async fn upsert_report(
    conn: &mut PgConnection,
    reports: &TableName,
    report: &Report,
) -> Result<Stored, sqlx::Error> {
    for stored in Stored::TIERS {
        match write_report(conn, reports, report, stored, true).await {
            Err(e) if is_undefined_column(&e) && stored != Stored::LagOnly => continue,
            written => return written.map(|()| stored),
        }
    }
    unreachable!("the last tier returns")
}

/// [`upsert_report`] over a connection that reaches `pool_mode`. Under a transaction pool
/// each attempt runs in a transaction of its own (a savepoint when the caller has one open):
/// its statement goes unnamed, and a report table without the newer columns fails the first
/// attempt, which must not abort the caller's transaction.
pub async fn upsert_report_with(
    conn: &mut PgConnection,
    reports: &TableName,
    report: &Report,
    pool_mode: PoolMode,
) -> Result<Stored, sqlx::Error> {
    if pool_mode.named_statements() {
        return upsert_report(conn, reports, report).await;
    }
    for stored in Stored::TIERS {
        let mut attempt = conn.begin().await?;
        match write_report(&mut attempt, reports, report, stored, false).await {
            Err(e) if is_undefined_column(&e) && stored != Stored::LagOnly => {
                attempt.rollback().await?;
            }
            Err(e) => return Err(e),
            Ok(()) => {
                attempt.commit().await?;
                return Ok(stored);
            }
        }
    }
    unreachable!("the last tier returns")
}

impl Stored {
    /// From the newest columns down: a table not migrated since a release added columns
    /// still takes what it has columns for.
    const TIERS: [Stored; 3] = [
        Stored::Everything,
        Stored::WithoutRateLimit,
        Stored::LagOnly,
    ];
}

async fn write_report(
    conn: &mut PgConnection,
    reports: &TableName,
    report: &Report,
    stored: Stored,
    persistent: bool,
) -> Result<(), sqlx::Error> {
    let (columns, values, updates) = match stored {
        Stored::Everything => (
            ", problem_kind, problem, table_health, max_rate, rate_limited_seconds",
            ", $8, $9, $10, $11, $12",
            ", problem_kind = EXCLUDED.problem_kind, problem = EXCLUDED.problem, \
             table_health = EXCLUDED.table_health, max_rate = EXCLUDED.max_rate, \
             rate_limited_seconds = EXCLUDED.rate_limited_seconds",
        ),
        Stored::WithoutRateLimit => (
            ", problem_kind, problem, table_health",
            ", $8, $9, $10",
            ", problem_kind = EXCLUDED.problem_kind, problem = EXCLUDED.problem, \
             table_health = EXCLUDED.table_health",
        ),
        Stored::LagOnly => ("", "", ""),
    };
    let sql = format!(
        "INSERT INTO {} AS r (relay, pod, reported_at, backlog, backlog_capped, oldest_age_seconds, published_total, publish_rate{columns}) \
         VALUES ($1, $2, now(), $3, $4, $5, $6, $7{values}) \
         ON CONFLICT (relay, pod) DO UPDATE SET reported_at = now(), backlog = EXCLUDED.backlog, \
         backlog_capped = EXCLUDED.backlog_capped, oldest_age_seconds = EXCLUDED.oldest_age_seconds, \
         published_total = EXCLUDED.published_total, publish_rate = EXCLUDED.publish_rate{updates}",
        reports.quoted()
    );
    let mut query = sqlx::query(AssertSqlSafe(sql))
        .bind(&report.relay)
        .bind(&report.pod)
        .bind(report.backlog.map(|b| b.pending))
        .bind(report.backlog.is_some_and(|b| b.capped))
        .bind(report.backlog.and_then(|b| b.oldest_age_seconds))
        .bind(report.published_total)
        .bind(report.publish_rate);
    if stored != Stored::LagOnly {
        let problem = report.problem.as_ref();
        query = query
            .bind(problem.map(|p| p.kind.code()))
            .bind(problem.map(|p| p.message.as_str()))
            .bind(report.table_health.as_ref().map(sqlx::types::Json));
    }
    if stored == Stored::Everything {
        query = query
            .bind(report.max_rate)
            .bind(report.rate_limited_seconds);
    }
    query.persistent(persistent).execute(&mut *conn).await?;
    Ok(())
}

/// PostgreSQL's undefined_column (42703).
fn is_undefined_column(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "42703")
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
    // The newer columns are read through to_jsonb, which yields NULL for a column the table
    // lacks: a report table from before them (not migrated yet) still gives the lag.
    let rows: Vec<ReportRow> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT relay, pod, reported_at, backlog, backlog_capped, oldest_age_seconds, published_total, publish_rate, \
         to_jsonb(r) ->> 'problem_kind' AS problem_kind, to_jsonb(r) ->> 'problem' AS problem, \
         to_jsonb(r) -> 'table_health' AS table_health, \
         (to_jsonb(r) ->> 'max_rate')::float8 AS max_rate, \
         (to_jsonb(r) ->> 'rate_limited_seconds')::float8 AS rate_limited_seconds FROM {t} AS r WHERE relay = $1 AND reported_at >= now() - make_interval(secs => $2) ORDER BY reported_at DESC"
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
    problem_kind: Option<String>,
    problem: Option<String>,
    table_health: Option<serde_json::Value>,
    max_rate: Option<f64>,
    rate_limited_seconds: Option<f64>,
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
            // A message without a kind cannot be written; a kind without one shows its code.
            problem: row.problem_kind.map(|code| Problem {
                message: row.problem.unwrap_or_else(|| code.clone()),
                kind: ProblemKind::from_code(&code),
            }),
            // JSON null (a pod that did not measure) and a shape this version cannot read
            // both mean "no figures": one odd report must not hide the lag.
            table_health: row
                .table_health
                .and_then(|value| serde_json::from_value(value).ok()),
            max_rate: row.max_rate,
            rate_limited_seconds: row.rate_limited_seconds,
        }
    }
}

/// The relay-wide view the operator scales on: the freshest measured backlog and the sum of
/// the pods' publish rates.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayLag {
    pub backlog: Option<Backlog>,
    pub publish_rate: f64,
    /// The rate limits in force in the reporting pods, summed; None when none has one.
    pub max_rate: Option<f64>,
    /// The reporting pods' publish rates, summed over the pods that have a limit: compared
    /// with `max_rate`, it says whether the limit holds them back.
    pub limited_publish_rate: f64,
    /// Seconds the pods' workers waited for permits during their last interval, summed.
    pub rate_limited_seconds: f64,
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
        max_rate: reports
            .iter()
            .filter_map(|r| r.max_rate)
            .reduce(|a, b| a + b),
        limited_publish_rate: reports
            .iter()
            .filter(|r| r.max_rate.is_some())
            .map(|r| r.publish_rate)
            .sum(),
        rate_limited_seconds: reports.iter().filter_map(|r| r.rate_limited_seconds).sum(),
        reporting_pods: reports.len(),
        newest_report: reports.iter().map(|r| r.reported_at).max(),
    }
}

/// Advisory lock key text for "who measures the backlog of this relay".
pub fn measurer_lock_key(relay: &str) -> String {
    format!("outbox-relay:measure:{relay}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_kinds_survive_the_table_and_unknown_codes_are_kept() {
        let known = ProblemKind::ExchangeNotFound;
        assert_eq!(ProblemKind::from_code(known.code()), known);
        let newer = ProblemKind::from_code("SomethingNew");
        assert_eq!(newer, ProblemKind::Other("SomethingNew".into()));
        assert_eq!(newer.code(), "SomethingNew");
    }

    #[test]
    fn a_new_report_table_has_the_columns_the_upgrade_adds() {
        let reports = TableName::parse("outbox_messages_reports").unwrap();
        let created = create_table_sql(&reports);
        let upgrade = upgrade_table_sql(&reports);
        for column in [
            "problem_kind text",
            "problem text",
            "table_health jsonb",
            "max_rate double precision",
            "rate_limited_seconds double precision",
        ] {
            assert!(created.contains(column), "{created}");
            assert!(
                upgrade.contains(&format!("ADD COLUMN IF NOT EXISTS {column}")),
                "{upgrade}"
            );
        }
    }
}
