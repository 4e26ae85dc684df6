//! Sustained mode: one long relay run per delivery mode on a big table, throughput per minute,
//! so a claim that slows down as processed rows pile up (MVCC bloat at the head of the pending
//! index) shows. Mark mode runs twice: with the migration's autovacuum settings and without
//! them, which tells how much of the cure the settings are; and a third time with a REPEATABLE
//! READ transaction held open for the whole run, the production failure no setting cures: no
//! dead row can be removed, and the relay's table-health figures say why.

use std::time::Duration;

use outbox_relay::broker::BrokerProtocol;
use outbox_relay::table::DeliveryMode;
use outbox_relay::table::migrate::MigrationOptions;
use serde::Serialize;
use sqlx::AssertSqlSafe;

use crate::env::Env;
use crate::fixture::Fixture;
use crate::measure::{Measurement, SAMPLE_EVERY, Sample};
use crate::names::RunNames;
use crate::relay_run::{Until, measure_relay};
use crate::workload::Workload;

#[derive(Debug, Clone)]
pub struct SustainedOptions {
    pub rows: u64,
    pub duration: Duration,
    /// Length of one throughput bucket: a minute, shorter in the smoke run.
    pub bucket: Duration,
    /// Which variants to run (mark, mark-no-autovacuum, mark-held-snapshot, delete); empty
    /// means all.
    pub variants: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SustainedRun {
    pub label: String,
    pub mode: &'static str,
    pub autovacuum_settings: bool,
    /// A snapshot was held open for the whole run.
    pub held_snapshot: bool,
    /// Messages per second in each full bucket.
    pub per_bucket: Vec<f64>,
    /// Last full bucket over the first.
    pub last_over_first: f64,
    pub autovacuum_runs: i64,
    pub measurement: Measurement,
}

/// Messages per second in consecutive buckets of `bucket`, from the first message on; the
/// trailing partial bucket is left out.
pub fn per_bucket(series: &[Sample], bucket: Duration) -> Vec<f64> {
    let Some(start) = series.iter().position(|s| s.count > 0) else {
        return Vec::new();
    };
    let t0 = series[start].t - SAMPLE_EVERY.as_secs_f64();
    let count_at = |t: f64| {
        series
            .iter()
            .take_while(|s| s.t <= t + 1e-9)
            .last()
            .map_or(0, |s| s.count)
    };
    let end = series.last().map_or(t0, |s| s.t);
    let width = bucket.as_secs_f64();
    let mut rates = Vec::new();
    let mut from = t0;
    while from + width <= end + 1e-9 {
        rates.push((count_at(from + width) - count_at(from)) as f64 / width);
        from += width;
    }
    rates
}

pub async fn run(
    env: &Env,
    names: &RunNames,
    options: &SustainedOptions,
) -> anyhow::Result<Vec<SustainedRun>> {
    let variants = [
        ("mark", "mark", DeliveryMode::Mark, true, false),
        (
            "mark-no-autovacuum",
            "mark, no autovacuum settings",
            DeliveryMode::Mark,
            false,
            false,
        ),
        (
            "mark-held-snapshot",
            "mark, a snapshot held open",
            DeliveryMode::Mark,
            true,
            true,
        ),
        ("delete", "delete", DeliveryMode::Delete, true, false),
    ];
    let mut results = Vec::new();
    for (index, (key, label, mode, autovacuum, held)) in variants.into_iter().enumerate() {
        if !options.variants.is_empty() && !options.variants.iter().any(|v| v == key) {
            continue;
        }
        eprintln!(
            "== sustained, {label}: seeding {} rows, then {:?} of relaying",
            options.rows, options.duration
        );
        let fixture = Fixture::create(
            &env.database_url,
            &names.table(&format!("sustained{index}")),
            Workload::Article,
            options.rows,
            mode,
            &MigrationOptions {
                skip_autovacuum: !autovacuum,
                ..Default::default()
            },
            None,
        )
        .await?;
        let outcome = async {
            // A report job's transaction: one read, then idle for the whole run.
            let holder = match held {
                true => Some(hold_snapshot(&fixture).await?),
                false => None,
            };
            let measurement = measure_relay(
                env,
                names,
                &fixture,
                &format!("sustained-{}", mode.as_str()),
                &[],
                BrokerProtocol::Amqp091,
                Until::Window(options.duration),
            )
            .await?;
            let mut conn = fixture.connect().await?;
            let autovacuum_runs: i64 = sqlx::query_scalar(AssertSqlSafe(
                "SELECT coalesce(autovacuum_count, 0) FROM pg_stat_user_tables WHERE relid = to_regclass($1)"
                    .to_string(),
            ))
            .bind(fixture.table.name.quoted())
            .fetch_optional(&mut conn)
            .await?
            .unwrap_or(0);
            if let Some(mut holder) = holder {
                sqlx::query("ROLLBACK").execute(&mut holder).await?;
            }
            anyhow::Ok((measurement, autovacuum_runs))
        }
        .await;
        fixture.drop_table().await?;
        let (measurement, autovacuum_runs) = outcome?;
        let per_bucket = per_bucket(&measurement.series, options.bucket);
        let last_over_first = match (per_bucket.first(), per_bucket.last()) {
            (Some(first), Some(last)) if *first > 0.0 => last / first,
            _ => 0.0,
        };
        eprintln!(
            "  per bucket: {:?} msg/s; last/first {last_over_first:.2}; autovacuum ran {autovacuum_runs} time(s)",
            per_bucket.iter().map(|r| r.round()).collect::<Vec<_>>()
        );
        results.push(SustainedRun {
            label: label.to_string(),
            mode: mode.as_str(),
            autovacuum_settings: autovacuum,
            held_snapshot: held,
            per_bucket,
            last_over_first,
            autovacuum_runs,
            measurement,
        });
    }
    Ok(results)
}

async fn hold_snapshot(fixture: &Fixture) -> anyhow::Result<sqlx::PgConnection> {
    let mut conn = fixture.connect().await?;
    sqlx::query("SET application_name = 'outbox-bench-held-snapshot'")
        .execute(&mut conn)
        .await?;
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut conn)
        .await?;
    let sql = format!(
        "SELECT count(*) FROM (SELECT 1 FROM {} LIMIT 1) one",
        fixture.table.name.quoted()
    );
    sqlx::query(AssertSqlSafe(sql)).execute(&mut conn).await?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_full_intervals_only() {
        let series: Vec<Sample> = (1..=10)
            .map(|i| Sample {
                t: i as f64 * 0.25,
                count: i * 100,
            })
            .collect();
        let rates = per_bucket(&series, Duration::from_secs(1));
        assert_eq!(rates.len(), 2);
        assert!((rates[0] - 400.0).abs() < 1e-9);
    }
}
