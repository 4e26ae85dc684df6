//! Records what an autoscaling run looks like from outside, on the test cluster's clock: the lag
//! reports as the relay pods write them, the pending rows and the OutboxRelay's status. (The
//! Deployment's replicas need no sampling: the API server keeps every version.) Tests assert on
//! the order of these events; the plot draws them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::Api;
use outbox_operator::OutboxRelay;
use outbox_relay::table::OutboxTable;
use outbox_relay::table::REPORTS_TABLE;
use tokio::task::JoinHandle;

use crate::db;
use crate::timeline::BacklogSample;

/// One measured backlog as a pod reported it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportSample {
    /// When the pod wrote it (database clock), in seconds on the test cluster's clock.
    pub at: f64,
    pub backlog: i64,
}

/// The OutboxRelay's status at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusSample {
    pub at: f64,
    pub desired_replicas: Option<i32>,
    pub backlog: Option<i64>,
    /// Reason of the ScalingLimited condition.
    pub limited_reason: Option<String>,
    /// Reason of the ScalingActive condition.
    pub active_reason: Option<String>,
}

#[derive(Debug, Default, Clone)]
pub struct Recording {
    pub reports: Vec<ReportSample>,
    pub backlog: Vec<BacklogSample>,
    pub status: Vec<StatusSample>,
}

/// What to record.
pub struct Subject {
    pub relays: Api<OutboxRelay>,
    pub name: String,
    /// The relay's name in the reports table: `namespace/name`.
    pub report_name: String,
    pub table: OutboxTable,
    /// Converts a wall-clock time to the kubelet's clock.
    pub clock: Arc<dyn Fn(DateTime<Utc>) -> f64 + Send + Sync>,
}

pub struct ScalingRecorder {
    recording: Arc<Mutex<Recording>>,
    task: JoinHandle<()>,
}

/// How often the recorder looks.
const PERIOD: Duration = Duration::from_millis(250);

impl ScalingRecorder {
    pub fn start(subject: Subject) -> Self {
        let recording = Arc::new(Mutex::new(Recording::default()));
        let task = tokio::spawn(record(subject, recording.clone()));
        Self { recording, task }
    }

    pub fn snapshot(&self) -> Recording {
        self.recording.lock().unwrap().clone()
    }

    pub fn stop(self) -> Recording {
        self.task.abort();
        self.snapshot()
    }
}

async fn record(subject: Subject, recording: Arc<Mutex<Recording>>) {
    let mut conn = db::connect().await;
    let reports_sql = format!(
        "SELECT reported_at, backlog FROM {} WHERE relay = $1 AND backlog IS NOT NULL \
         AND reported_at > $2 ORDER BY reported_at",
        outbox_relay::table::ident::Ident::new(REPORTS_TABLE)
            .expect("constant is valid")
            .quoted()
    );
    let mut last_report = DateTime::<Utc>::UNIX_EPOCH;
    let mut tick = 0u64;
    loop {
        let now = (subject.clock)(Utc::now());
        let reports: Vec<(DateTime<Utc>, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(reports_sql.clone()))
                .bind(&subject.report_name)
                .bind(last_report)
                .fetch_all(&mut conn)
                .await
                .unwrap_or_default();
        let relay = subject.relays.get_opt(&subject.name).await.ok().flatten();
        // Counting every tick would load the database the relays drain; every other is enough.
        let pending = if tick.is_multiple_of(2) {
            Some(db::pending(&mut conn, &subject.table).await)
        } else {
            None
        };
        tick += 1;

        let status = relay.and_then(|r| r.status);
        last_report = store(
            &mut recording.lock().unwrap(),
            Fetched {
                now,
                reports,
                status,
                pending,
            },
            &*subject.clock,
        )
        .unwrap_or(last_report);
        tokio::time::sleep(PERIOD).await;
    }
}

/// One round of looking.
struct Fetched {
    now: f64,
    reports: Vec<(DateTime<Utc>, i64)>,
    status: Option<outbox_operator::OutboxRelayStatus>,
    pending: Option<i64>,
}

/// Adds one round to the recording; returns the newest report time seen.
fn store(
    recording: &mut Recording,
    fetched: Fetched,
    clock: &(dyn Fn(DateTime<Utc>) -> f64 + Send + Sync),
) -> Option<DateTime<Utc>> {
    let Fetched {
        now,
        reports,
        status,
        pending,
    } = fetched;
    let newest = reports.last().map(|(at, _)| *at);
    for (at, backlog) in reports {
        recording.reports.push(ReportSample {
            at: clock(at),
            backlog,
        });
    }
    if let Some(pending) = pending {
        recording.backlog.push(BacklogSample {
            at: now,
            pending,
            reported: status.as_ref().and_then(|s| s.backlog),
        });
    }
    if let Some(status) = status {
        let reason = |kind: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == kind)
                .map(|c| c.reason.clone())
        };
        recording.status.push(StatusSample {
            at: now,
            desired_replicas: status.desired_replicas,
            backlog: status.backlog,
            limited_reason: reason("ScalingLimited"),
            active_reason: reason("ScalingActive"),
        });
    }
    newest
}
