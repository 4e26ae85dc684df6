//! Takes the soak's measurements at the end of every period, on a task of its own so that a
//! fault being carried out (a RabbitMQ node takes seconds to restart) never delays a period.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use outbox_relay::table::OutboxTable;
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio::task::JoinHandle;

use super::arrivals::Arrivals;
use super::memory::container_rss_mib;
use super::record::Period;
use super::verdict::FaultSpan;
use crate::cluster::OPERATOR_POD_SELECTOR;
use crate::pods::{RELAY_LABEL, container_id};

/// How long a period's database reading may retry (PostgreSQL restarting) before the
/// period carries the previous reading.
const READ_RETRIES: u32 = 6;

/// What the sampler reads from.
pub struct Sampler {
    pub period: Duration,
    pub periods: u32,
    /// The database's primary, for the table's backlog, dead tuples and size.
    pub database_url: String,
    pub table: OutboxTable,
    pub arrivals: Arc<Arrivals>,
    /// The producer's count of inserted rows.
    pub inserted: Arc<AtomicU64>,
    /// The namespace's pods: the relay's and the operator's.
    pub pods: Api<Pod>,
    pub relay: String,
    /// The node's cgroup root, where the pods' memory is counted.
    pub cgroup_root: &'static str,
    /// The faults as they are carried out.
    pub spans: Arc<Mutex<Vec<FaultSpan>>>,
}

/// The table's backlog, dead tuples and size in MiB.
async fn table_reading(url: &str, table: &OutboxTable) -> Result<(i64, i64, f64), sqlx::Error> {
    let mut conn = PgConnection::connect(url).await?;
    let sql = format!(
        "SELECT (SELECT count(*) FROM {t} WHERE {processed} IS NULL), \
                coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0), \
                pg_total_relation_size($1::regclass)",
        t = table.name.quoted(),
        processed = table.columns.processed_at.quoted()
    );
    let (backlog, dead, bytes): (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(sql))
        .bind(table.name.quoted())
        .fetch_one(&mut conn)
        .await?;
    let _ = conn.close().await;
    Ok((backlog, dead, bytes as f64 / (1024.0 * 1024.0)))
}

impl Sampler {
    /// The largest anonymous memory of the pods `selector` selects, MiB.
    async fn largest_rss(&self, selector: &str) -> Option<f64> {
        let pods = self
            .pods
            .list(&ListParams::default().labels(selector))
            .await
            .ok()?;
        pods.items
            .iter()
            .filter_map(container_id)
            .filter_map(|id| container_rss_mib(self.cgroup_root, &id))
            .reduce(f64::max)
    }

    async fn table_reading(&self) -> Option<(i64, i64, f64)> {
        for _ in 0..READ_RETRIES {
            match table_reading(&self.database_url, &self.table).await {
                Ok(reading) => return Some(reading),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        None
    }

    /// Measures every period from `started` on; returns them once the last has ended.
    pub fn start(self, started: Instant) -> JoinHandle<Vec<Period>> {
        tokio::spawn(async move {
            let relay_selector = format!("{RELAY_LABEL}={}", self.relay);
            let mut periods: Vec<Period> = Vec::new();
            let mut offered_before = self.inserted.load(Ordering::SeqCst);
            let mut reading = (0, 0, 0.0);
            let mut begun = started;
            for index in 0..self.periods {
                let end = started + self.period * (index + 1);
                tokio::time::sleep_until(end.into()).await;
                let now = Instant::now();
                let seconds = now.duration_since(begun).as_secs_f64();
                let to = now.duration_since(started).as_secs_f64();
                begun = now;
                // A fault is named in the period the schedule put it in: the sampler wakes a
                // little after the boundary, where a fault due at it has already begun.
                let length = self.period.as_secs_f64();
                let (from, until) = (length * f64::from(index), length * f64::from(index + 1));
                let (delivered, latency_p99_ms) = self.arrivals.take_period();
                let offered_now = self.inserted.load(Ordering::SeqCst);
                let offered = offered_now - offered_before;
                offered_before = offered_now;
                if let Some(now) = self.table_reading().await {
                    reading = now;
                }
                let (backlog, dead_tuples, table_mib) = reading;
                let faults = self
                    .spans
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|s| s.start_s >= from && s.start_s < until)
                    .map(|s| s.fault.name())
                    .collect();
                periods.push(Period {
                    index,
                    end_s: to,
                    seconds,
                    offered,
                    delivered,
                    throughput: delivered as f64 / seconds,
                    backlog,
                    latency_p99_ms,
                    relay_rss_mib: self.largest_rss(&relay_selector).await,
                    operator_rss_mib: self.largest_rss(OPERATOR_POD_SELECTOR).await,
                    dead_tuples,
                    table_mib,
                    faults,
                });
            }
            periods
        })
    }
}
