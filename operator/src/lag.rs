//! The observe step of autoscaling: what the backlog is and how fast the pods publish.
//!
//! While pods run, they report (one of them measures the backlog; each reports its rate). At
//! zero pods nobody reports, so the operator measures the backlog itself, with the relay
//! crate's own capped count, so scale-from-zero can happen at all.

use std::time::Duration;

use chrono::Utc;
use outbox_relay::defaults::BACKLOG_CAP;
use outbox_relay::secret_url::SecretUrl;
use outbox_relay::table::inspect::inspect;
use outbox_relay::table::reports::{measure_backlog, read_reports, summarize};
use outbox_relay::table::sql::Statements;
use sqlx::Connection;

use crate::error::Error;
use crate::migration::{connect, redact};
use crate::validation::RelayPlan;

/// What the operator knows about the relay's lag this round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LagObservation {
    /// Pending rows, if a fresh measurement exists.
    pub backlog: Option<i64>,
    pub backlog_capped: bool,
    /// Age of that measurement.
    pub backlog_age: Option<Duration>,
    pub oldest_age_seconds: Option<f64>,
    /// Messages per second, summed over the pods that reported.
    pub publish_rate: f64,
    pub reporting_pods: usize,
    /// True when the operator counted the rows itself (no pod was running).
    pub measured_by_operator: bool,
}

/// Reads the reports (or measures, when `running` is 0). Reports older than `stale_after`
/// do not count: a pod that stopped reporting no longer speaks for the relay.
pub async fn observe_lag(
    database_url: &SecretUrl,
    plan: &RelayPlan,
    relay_name: &str,
    running: i32,
    stale_after: Duration,
) -> Result<LagObservation, Error> {
    let mut conn = connect(database_url).await?;
    let result = async {
        if running == 0 {
            let shape = inspect(&mut conn, &plan.table)
                .await
                .map_err(|e| e.to_string())?;
            let statements = Statements::for_shape(&plan.table, &shape);
            let backlog = measure_backlog(&mut conn, &statements, BACKLOG_CAP)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(LagObservation {
                backlog: Some(backlog.pending),
                backlog_capped: backlog.capped,
                backlog_age: Some(Duration::ZERO),
                oldest_age_seconds: backlog.oldest_age_seconds,
                measured_by_operator: true,
                ..Default::default()
            });
        }
        let reports = read_reports(
            &mut conn,
            &plan.table.reports_table(),
            relay_name,
            stale_after.as_secs_f64(),
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
        Ok(LagObservation {
            backlog: lag.backlog.map(|b| b.pending),
            backlog_capped: lag.backlog.is_some_and(|b| b.capped),
            backlog_age: measured_at.map(|at| (now - at).to_std().unwrap_or_default()),
            oldest_age_seconds: lag.backlog.and_then(|b| b.oldest_age_seconds),
            publish_rate: lag.publish_rate,
            reporting_pods: lag.reporting_pods,
            measured_by_operator: false,
        })
    }
    .await;
    let _ = conn.close().await;
    result.map_err(|message: String| Error::ObserveLag(redact(&message, database_url)))
}
