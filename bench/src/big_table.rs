//! Big-table mode (`--big-table`): the claim on a table that kept its history — 10 million
//! processed and 1 million pending rows in mark mode, 1 million pending in delete mode — by the
//! relay at its defaults: claim latency, buffers per claimed row, and the lag report's backlog
//! count. The plan PostgreSQL picks for these tables is checked in `make test`
//! (tests/tests/services/claim_plan.rs); this measures what it costs.

use std::time::Duration;

use anyhow::Context;
use outbox_relay::table::DeliveryMode;
use outbox_relay::table::migrate::MigrationOptions;
use sqlx::{Connection, PgConnection};

use crate::broker::Destination;
use crate::env::Env;
use crate::fixture::Fixture;
use crate::names::RunNames;
use crate::pg_stats::statements_available;
use crate::scaling::{Point, ScalingOptions, ScalingRun, measure_point};
use crate::workload::Workload;

pub struct BigTableOptions {
    /// Rows already processed (mark mode only: delete mode keeps none).
    pub processed: u64,
    pub pending: u64,
    pub window: Duration,
    /// Run until every pending row was relayed instead (the smoke run).
    pub drain: bool,
}

/// The relay's defaults: one process of two workers.
const DEFAULTS: Point = Point {
    processes: 1,
    workers: 2,
};

pub async fn run(
    env: &Env,
    names: &RunNames,
    options: &BigTableOptions,
) -> anyhow::Result<Vec<ScalingRun>> {
    let mut conn = PgConnection::connect(&env.database_url).await?;
    let statements = statements_available(&mut conn).await;
    let mut runs = Vec::new();
    for (mode, processed) in [
        (DeliveryMode::Mark, options.processed),
        (DeliveryMode::Delete, 0),
    ] {
        let pending = format!("{} pending", rows_label(options.pending));
        let label = match processed {
            0 => format!("{} {pending}", mode.as_str()),
            _ => format!(
                "{} {} processed + {pending}",
                mode.as_str(),
                rows_label(processed)
            ),
        };
        eprintln!("big table: {label}");
        let what = format!("big_{}", mode.as_str());
        let fixture = Fixture::create_with_history(
            &env.database_url,
            &names.table(&what),
            Workload::Article,
            options.pending,
            processed,
            mode,
            &MigrationOptions::default(),
            None,
        )
        .await
        .with_context(|| format!("seeding {label}"))?;
        let destination = Destination::declare(&env.amqp_url, names.exchange(&what), None).await?;
        let scaling = ScalingOptions {
            points: vec![DEFAULTS],
            rows: options.pending,
            window: options.window,
            drain: options.drain,
            baseline_relay: None,
        };
        let measured =
            measure_point(env, &fixture, &destination, &scaling, DEFAULTS, statements).await;
        destination.delete(&env.amqp_url).await?;
        fixture.drop_table().await?;
        let (measurement, counted) = measured.with_context(|| label.clone())?;
        let run = counted.into_run(&label, DEFAULTS, measurement);
        eprintln!(
            "  {:.0} msg/s, claim p50 / p99 {:.1} / {:.1} ms, backlog count {} ms",
            run.measurement.rate,
            run.claim_p50_ms,
            run.claim_p99_ms,
            run.backlog_count_mean_ms
                .map_or("?".to_string(), |ms| format!("{ms:.1}"))
        );
        runs.push(run);
    }
    Ok(runs)
}

/// 10000000 as "10M", 20000 as "20k".
fn rows_label(rows: u64) -> String {
    match rows {
        r if r >= 1_000_000 && r % 1_000_000 == 0 => format!("{}M", r / 1_000_000),
        r if r >= 1_000 && r % 1_000 == 0 => format!("{}k", r / 1_000),
        r => r.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_counts_read_as_people_write_them() {
        assert_eq!(rows_label(10_000_000), "10M");
        assert_eq!(rows_label(20_000), "20k");
        assert_eq!(rows_label(1_500), "1500");
    }
}
