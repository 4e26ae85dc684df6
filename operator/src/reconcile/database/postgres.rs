//! The database steps on a real PostgreSQL, with the relay crate's own functions: the same
//! migration as `outbox-relay migrate`, the same report table and capped count as the pods.
//!
//! One short connection per step: the operator reconciles many relays on many databases, and
//! an idle pool per relay would hold connections their owners budgeted for the application.
//! At most a few of them on one database at once (see [`SessionLimit`]).

use std::time::Duration;

use chrono::Utc;
use futures::FutureExt;
use futures::future::BoxFuture;
use outbox_relay::connect::secret_url::SecretUrl;
use outbox_relay::database::{DatabaseTarget, FailureKind};
use outbox_relay::defaults::BACKLOG_CAP;
use outbox_relay::table::cleanup::{CleanupError, remove_migration};
use outbox_relay::table::health::{HorizonClock, measure_table_health};
use outbox_relay::table::inspect::{InspectError, inspect};
use outbox_relay::table::limits::write_share;
use outbox_relay::table::migrate::{MigrateError, migrate};
use outbox_relay::table::reports::{Report, measure_backlog, read_reports, summarize};
use outbox_relay::table::sql::Statements;
use sqlx::Connection;
use sqlx::postgres::PgConnection;
use tokio::sync::OwnedSemaphorePermit;

use crate::reconcile::database::claims::{
    CLAIMS_TABLE, Claim, claim_table, other_holder, release_claim,
};
use crate::reconcile::database::sessions::SessionLimit;
use crate::reconcile::database::{
    CleanupRequest, CleanupRun, LagObservation, LagQuery, MigrationRun, PodProblem, RateShare,
    RelayDatabase,
};
use crate::reconcile::driver::error::Error;
use crate::reconcile::input::validate::RelayPlan;

/// A connection attempt longer than this is an outage, not a slow network; the reconciler must
/// not sit on it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a short step (observing the lag, writing a rate share, cleaning up) may take,
/// its connect included. Each is a few statements that take milliseconds; past this the server
/// or the path to it is gone. A connection whose path was cut silently never fails by itself:
/// sqlx sets no TCP keepalive on its sockets (launchbadge/sqlx #3540), so without this bound the
/// reconcile would wait on its reply forever, holding one of the database's sessions
/// ([`SessionLimit`]) and, with it, every other relay's steps on that database.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// The same for the migration, whose `CREATE INDEX CONCURRENTLY` reads the whole table: an
/// hour is far above what the big-table measurement took (docs/scale.md), and still a bound.
/// Past it the build is abandoned (PostgreSQL leaves an invalid index, which the next attempt
/// rebuilds), so the bound must stay well above any real build.
pub const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// The production [`RelayDatabase`].
#[derive(Debug)]
pub struct PostgresDatabase {
    sessions: SessionLimit,
    step_timeout: Duration,
}

impl Default for PostgresDatabase {
    fn default() -> Self {
        Self {
            sessions: SessionLimit::default(),
            step_timeout: STEP_TIMEOUT,
        }
    }
}

impl PostgresDatabase {
    /// At most `sessions_per_database` sessions on one database at any moment.
    pub fn new(sessions_per_database: usize) -> Self {
        Self {
            sessions: SessionLimit::new(sessions_per_database),
            step_timeout: STEP_TIMEOUT,
        }
    }

    /// Another bound for the short steps than [`STEP_TIMEOUT`] (tests wait less).
    pub fn with_step_timeout(self, step_timeout: Duration) -> Self {
        Self {
            step_timeout,
            ..self
        }
    }
}

/// Runs `step` for at most `limit`; past it, the database counts as unreachable. Dropping the
/// step drops its connection and its session permit.
async fn bounded<T>(
    limit: Duration,
    what: &str,
    target: &DatabaseTarget,
    step: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(limit, step).await.unwrap_or_else(|_| {
        Err(Error::DatabaseUnreachable(format!(
            "{what}: {} did not answer within {} s (a cut network, or a server that stopped \
             answering); retrying",
            target.url().redacted(),
            limit.as_secs()
        )))
    })
}

impl RelayDatabase for PostgresDatabase {
    fn migrate<'a>(
        &'a self,
        database: &'a DatabaseTarget,
        plan: &'a RelayPlan,
        relay_name: &'a str,
    ) -> BoxFuture<'a, Result<MigrationRun, Error>> {
        migrate_table(
            &self.sessions,
            self.step_timeout,
            database,
            plan,
            relay_name,
        )
        .boxed()
    }

    fn observe_lag<'a>(
        &'a self,
        database: &'a DatabaseTarget,
        plan: &'a RelayPlan,
        query: LagQuery,
    ) -> BoxFuture<'a, Result<LagObservation, Error>> {
        bounded(
            self.step_timeout,
            "observing the lag",
            database,
            observe_lag(&self.sessions, database, plan, query),
        )
        .boxed()
    }

    fn write_rate_share<'a>(
        &'a self,
        database: &'a DatabaseTarget,
        plan: &'a RelayPlan,
        relay_name: &'a str,
        share: Option<RateShare>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        bounded(
            self.step_timeout,
            "writing the rate-limit share",
            database,
            write_rate_share(&self.sessions, database, plan, relay_name, share),
        )
        .boxed()
    }

    fn clean_up<'a>(
        &'a self,
        database: &'a DatabaseTarget,
        plan: &'a RelayPlan,
        request: CleanupRequest,
    ) -> BoxFuture<'a, Result<CleanupRun, Error>> {
        bounded(
            self.step_timeout,
            "cleaning up",
            database,
            clean_up(&self.sessions, database, plan, request),
        )
        .boxed()
    }
}

/// The share goes into the limits table the migration created next to the report table.
async fn write_rate_share(
    sessions: &SessionLimit,
    target: &DatabaseTarget,
    plan: &RelayPlan,
    relay_name: &str,
    share: Option<RateShare>,
) -> Result<(), Error> {
    let database_url = target.url();
    let mut conn = connect(sessions, target).await?;
    let result = write_share(&mut conn, &plan.table.limits_table(), relay_name, share).await;
    let _ = conn.close().await;
    result.map_err(|e| {
        Error::ObserveLag(redact(
            &format!("writing the rate-limit share: {e}"),
            database_url,
        ))
    })
}

/// Removes what the migration created (when asked and the table is still this relay's), then
/// releases the claim: in that order, so no other relay can claim and migrate the table while
/// its index is being dropped.
async fn clean_up(
    sessions: &SessionLimit,
    target: &DatabaseTarget,
    plan: &RelayPlan,
    request: CleanupRequest,
) -> Result<CleanupRun, Error> {
    let database_url = target.url();
    let mut conn = connect(sessions, target).await?;
    let result = clean_up_on(&mut conn, plan, &request).await;
    let _ = conn.close().await;
    result.map_err(|error| match error {
        CleanupStepError::Claim(e) if is_connection_error(&e) => {
            Error::DatabaseUnreachable(redact(&e.to_string(), database_url))
        }
        CleanupStepError::Claim(e) => Error::CleanupFailed(format!(
            "releasing the claim in {}: {}",
            claims_table_name(plan),
            redact(&e.to_string(), database_url)
        )),
        CleanupStepError::Remove(e) if e.database_error().is_some_and(is_connection_error) => {
            Error::DatabaseUnreachable(redact(&e.to_string(), database_url))
        }
        CleanupStepError::Remove(e) => Error::CleanupFailed(redact(&e.to_string(), database_url)),
    })
}

enum CleanupStepError {
    Claim(sqlx::Error),
    Remove(CleanupError),
}

async fn clean_up_on(
    conn: &mut PgConnection,
    plan: &RelayPlan,
    request: &CleanupRequest,
) -> Result<CleanupRun, CleanupStepError> {
    let table = &plan.table.name;
    let relay = request.relay_name.as_str();
    let holder = other_holder(conn, table, relay)
        .await
        .map_err(CleanupStepError::Claim)?;
    let removed = match (&holder, request.remove_migration) {
        (None, true) => Some(
            remove_migration(conn, &plan.table, &plan.migration, relay)
                .await
                .map_err(CleanupStepError::Remove)?,
        ),
        _ => None,
    };
    let claim = release_claim(conn, table, relay)
        .await
        .map_err(CleanupStepError::Claim)?;
    Ok(CleanupRun { claim, removed })
}

fn claims_table_name(plan: &RelayPlan) -> String {
    match &plan.table.name.schema {
        Some(schema) => format!("{schema}.{CLAIMS_TABLE}"),
        None => CLAIMS_TABLE.to_string(),
    }
}

async fn migrate_table(
    sessions: &SessionLimit,
    step_timeout: Duration,
    target: &DatabaseTarget,
    plan: &RelayPlan,
    relay_name: &str,
) -> Result<MigrationRun, Error> {
    let database_url = target.url();
    let claimed = bounded(step_timeout, "claiming the table", target, async {
        let mut conn = connect(sessions, target).await?;
        match hold_claim(
            &mut conn,
            plan,
            relay_name,
            database_url,
            Error::MigrationFailed,
        )
        .await
        {
            Ok(()) => Ok(conn),
            Err(error) => {
                let _ = conn.close().await;
                Err(error)
            }
        }
    });
    let mut conn = claimed.await?;
    let result = match tokio::time::timeout(
        MIGRATION_TIMEOUT,
        migrate(&mut conn, &plan.table, &plan.migration),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => {
            return Err(Error::DatabaseUnreachable(format!(
                "migrating: {} did not finish the migration within {} minutes; retrying",
                database_url.redacted(),
                MIGRATION_TIMEOUT.as_secs() / 60
            )));
        }
    };
    // Closing politely is a courtesy; the migration's outcome is what matters.
    let _ = conn.close().await;
    match result {
        Ok(report) => Ok(MigrationRun::Migrated(report)),
        Err(MigrateError::LockBusy) => Ok(MigrationRun::LockBusy),
        Err(MigrateError::Table(InspectError::Database(e))) | Err(MigrateError::Database(e))
            if is_connection_error(&e) =>
        {
            Err(Error::DatabaseUnreachable(redact(
                &e.to_string(),
                database_url,
            )))
        }
        Err(e @ MigrateError::IdNotUnique { .. }) => Err(Error::IdNotUnique(redact(
            &describe_for_spec(&e),
            database_url,
        ))),
        Err(other) => Err(Error::MigrationFailed(redact(
            &describe_for_spec(&other),
            database_url,
        ))),
    }
}

/// Takes or renews `relay_name`'s claim on the plan's table: `TableClaimed` when another relay
/// holds it; a missing table is `failed` with the migration's own words for it, before anything
/// is claimed. A database that cannot record claims (no right to create the claims table) is
/// logged and let through, as before claims existed; any other failure becomes `failed`.
async fn hold_claim(
    conn: &mut PgConnection,
    plan: &RelayPlan,
    relay_name: &str,
    database_url: &SecretUrl,
    failed: fn(String) -> Error,
) -> Result<(), Error> {
    match claim_table(conn, &plan.table.name, relay_name).await {
        Ok(Claim::Held) => Ok(()),
        Ok(Claim::TableMissing) => {
            let missing =
                MigrateError::Table(InspectError::TableMissing(plan.table.name.to_string()));
            Err(failed(redact(&describe_for_spec(&missing), database_url)))
        }
        Ok(Claim::NotChecked(why)) => {
            tracing::warn!(
                relay = %relay_name,
                reason = %redact(&why, database_url),
                "cannot record which relay holds the table; two OutboxRelays on it would both run"
            );
            Ok(())
        }
        Ok(Claim::HeldBy {
            relay,
            renewed_seconds_ago,
        }) => Err(Error::TableClaimed {
            table: plan.table.name.to_string(),
            relay,
            renewed_seconds_ago,
        }),
        Err(e) => Err(failed(redact(&e.to_string(), database_url))),
    }
}

/// Reads the reports (or measures, when nothing runs). Reports older than the query's
/// `stale_after` do not count.
async fn observe_lag(
    sessions: &SessionLimit,
    target: &DatabaseTarget,
    plan: &RelayPlan,
    query: LagQuery,
) -> Result<LagObservation, Error> {
    let database_url = target.url();
    let mut conn = connect(sessions, target).await?;
    // Every round renews the relay's claim on its table, or finds another relay holds it.
    if let Err(error) = hold_claim(
        &mut conn,
        plan,
        &query.relay_name,
        database_url,
        Error::ObserveLag,
    )
    .await
    {
        let _ = conn.close().await;
        return Err(error);
    }
    let result = if query.running == 0 {
        measure(&mut conn, plan).await
    } else {
        read(&mut conn, plan, &query).await
    };
    let _ = conn.close().await;
    result.map_err(|message| Error::ObserveLag(redact(&message, database_url)))
}

/// At zero pods nobody reports, so the operator counts the backlog itself, with the relay
/// crate's own capped count, so scale-from-zero can happen at all.
async fn measure(conn: &mut PgConnection, plan: &RelayPlan) -> Result<LagObservation, String> {
    let shape = inspect(conn, &plan.table)
        .await
        .map_err(|e| e.to_string())?;
    let statements = Statements::for_shape(&plan.table, &shape);
    let backlog = measure_backlog(conn, &statements, BACKLOG_CAP)
        .await
        .map_err(|e| e.to_string())?;
    // A fresh clock: a holder PostgreSQL does not date for the operator's role counts as new,
    // so with no pod running only holders it can date can make the relay VacuumBlocked.
    let table_health = measure_table_health(conn, &plan.table, &mut HorizonClock::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(LagObservation {
        backlog: Some(backlog.pending),
        backlog_capped: backlog.capped,
        backlog_age: Some(Duration::ZERO),
        oldest_age_seconds: backlog.oldest_age_seconds,
        measured_by_operator: true,
        table_health: Some(table_health),
        ..Default::default()
    })
}

/// While pods run, one of them measures the backlog and each reports its rate.
async fn read(
    conn: &mut PgConnection,
    plan: &RelayPlan,
    query: &LagQuery,
) -> Result<LagObservation, String> {
    let reports = read_reports(
        conn,
        &plan.table.reports_table(),
        &query.relay_name,
        query.stale_after.as_secs_f64(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let lag = summarize(&reports);
    let now = Utc::now();
    let measured_at = reports
        .iter()
        .filter(|r| r.backlog.is_some())
        .map(|r| r.reported_at)
        .max();
    let table_health = reports
        .iter()
        .filter_map(|r| Some((r.reported_at, r.table_health.as_ref()?)))
        .max_by_key(|(at, _)| *at)
        .map(|(_, health)| health.clone());
    Ok(LagObservation {
        backlog: lag.backlog.map(|b| b.pending),
        backlog_capped: lag.backlog.is_some_and(|b| b.capped),
        backlog_age: measured_at.map(|at| (now - at).to_std().unwrap_or_default()),
        oldest_age_seconds: lag.backlog.and_then(|b| b.oldest_age_seconds),
        publish_rate: lag.publish_rate,
        reporting_pods: lag.reporting_pods,
        measured_by_operator: false,
        problem: pod_problem(&reports),
        table_health,
        max_rate: lag.max_rate,
        limited_publish_rate: lag.limited_publish_rate,
        rate_limited_seconds: lag.rate_limited_seconds,
    })
}

/// The problem of the first pod (by name) that reports one, with every pod reporting the
/// same kind. A code a newer relay wrote that is no valid condition reason is shown under a
/// generic one, with its own words kept.
fn pod_problem(reports: &[Report]) -> Option<PodProblem> {
    let mut troubled: Vec<(&str, &outbox_relay::table::reports::Problem)> = reports
        .iter()
        .filter_map(|r| Some((r.pod.as_str(), r.problem.as_ref()?)))
        .collect();
    troubled.sort_by_key(|(pod, _)| *pod);
    let (_, first) = troubled.first()?;
    let pods = troubled
        .iter()
        .filter(|(_, problem)| problem.kind == first.kind)
        .map(|(pod, _)| pod.to_string())
        .collect();
    let code = first.kind.code();
    let reason = if is_condition_reason(code) {
        code.to_string()
    } else {
        "RelayProblem".to_string()
    };
    Some(PodProblem {
        reason,
        message: first.message.clone(),
        pods,
    })
}

/// The API server's pattern for a condition reason: a letter, then letters, digits, `_`, `,`
/// or `:`, not ending in `,` or `:`; at most 1024 characters.
fn is_condition_reason(text: &str) -> bool {
    let mut chars = text.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let allowed = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'));
    starts_with_letter && allowed && !text.ends_with([',', ':']) && text.len() <= 1024
}

/// One step's session, holding one of its database's [`SessionLimit`] permits until it ends.
struct Session {
    conn: PgConnection,
    _permit: OwnedSemaphorePermit,
}

impl std::ops::Deref for Session {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Session {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

impl Session {
    /// Ends the session politely; the permit goes with it.
    async fn close(self) -> Result<(), sqlx::Error> {
        self.conn.close().await
    }
}

/// Connects as the relays do (libpq's sslmode meanings, the same failure words), so what the
/// operator reports is what a relay pod would meet; first waits for one of the database's
/// sessions (the connect timeout starts after).
async fn connect(sessions: &SessionLimit, target: &DatabaseTarget) -> Result<Session, Error> {
    let permit = sessions.acquire(target.url()).await;
    let database_url = target.url();
    let attempt = outbox_relay::database::connect(target);
    match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
        Ok(Ok(conn)) => Ok(Session {
            conn,
            _permit: permit,
        }),
        Ok(Err(e)) => {
            let message = format!(
                "{} ({})",
                redact(&e.to_string(), database_url),
                database_url.redacted()
            );
            Err(match e.kind {
                FailureKind::Unreachable | FailureKind::Other => {
                    Error::DatabaseUnreachable(message)
                }
                FailureKind::ReadOnly => Error::DatabaseReadOnly(message),
                FailureKind::Tls | FailureKind::Auth | FailureKind::Settings => {
                    Error::DatabaseRefused {
                        reason: e.kind.code(),
                        message,
                    }
                }
            })
        }
        Err(_) => Err(Error::DatabaseUnreachable(format!(
            "no answer within {}s ({})",
            CONNECT_TIMEOUT.as_secs(),
            database_url.redacted()
        ))),
    }
}

fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut
    )
}

/// The relay's messages name its command-line options (`--table`, `--payload-column`); on an
/// OutboxRelay the user edits spec fields, so name those instead.
fn describe_for_spec(error: &MigrateError) -> String {
    let text = error.to_string();
    [
        ("--table", "spec.database.table"),
        ("--id-column", "spec.database.columns.id"),
        ("--type-column", "spec.database.columns.type"),
        ("--payload-column", "spec.database.columns.payload"),
        ("--occurred-at-column", "spec.database.columns.occurredAt"),
        ("--processed-at-column", "spec.database.columns.processedAt"),
        ("--error-column", "spec.database.columns.error"),
        ("--routing-key-column", "spec.database.columns.routingKey"),
        ("--headers-column", "spec.database.columns.headers"),
        ("--attempts-column", "spec.database.columns.attempts"),
        (
            "--partition-key-column",
            "spec.database.columns.partitionKey",
        ),
    ]
    .iter()
    .fold(text, |text, (flag, field)| text.replace(flag, field))
}

/// Driver messages do not include the password, but a message that quotes a connection string
/// would; never let one through.
fn redact(message: &str, url: &SecretUrl) -> String {
    let mut text = message.replace(url.expose(), url.redacted());
    if let Some(password) = url.password().filter(|p| !p.is_empty()) {
        text = text.replace(&password, "***");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_relay::connect::secret_url::UrlKind;

    #[test]
    fn redaction_removes_url_and_password() {
        let url =
            SecretUrl::parse("postgres://app:Tr0ub4dor@db:5432/x", UrlKind::Postgres).unwrap();
        let text = redact(
            "failed for postgres://app:Tr0ub4dor@db:5432/x; password Tr0ub4dor rejected",
            &url,
        );
        assert!(!text.contains("Tr0ub4dor"), "{text}");
        assert!(text.contains("db:5432"), "{text}");
    }

    #[test]
    fn only_valid_condition_reasons_pass_through() {
        assert!(is_condition_reason("ExchangeNotFound"));
        assert!(is_condition_reason("A_b:c"));
        for bad in ["", "9Lives", "has space", "Ends:", "Bad-Dash"] {
            assert!(!is_condition_reason(bad), "{bad}");
        }
    }

    #[test]
    fn relay_option_names_become_spec_fields() {
        let error = MigrateError::Table(InspectError::TableMissing("orders".into()));
        assert_eq!(
            describe_for_spec(&error),
            "invalid spec.database.table: table orders does not exist; create it or fix the name"
        );
    }
}
