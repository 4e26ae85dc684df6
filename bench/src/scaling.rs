//! Scaling mode (`--scaling`): one table, workers added the way pods add them — several relay
//! processes of several workers each — and at every point msg/s, CPU per message, and the
//! figures the two cores cannot distort: buffers and pending-index entries read per claimed
//! row, the claim's latency, and how many sessions wait on locks. With a baseline binary, both
//! run at every point, one right after the other.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use futures::future::join_all;
use outbox_relay::broker::BrokerProtocol;
use outbox_relay::database::options::APPLICATION_NAME;
use outbox_relay::table::DeliveryMode;
use outbox_relay::table::migrate::MigrationOptions;
use serde::Serialize;
use sqlx::{Connection, PgConnection};

use crate::broker::Destination;
use crate::env::Env;
use crate::fixture::Fixture;
use crate::measure::{Measurement, sample};
use crate::names::RunNames;
use crate::pg_stats::{SessionWaits, TableCounters, sample_waits, statements_available};
use crate::relay_process::{RelayProcess, broker_args};
use crate::scrape;
use crate::workload::Workload;

/// The points of the issue: 1, 2, 8, 16, 32 and 64 workers, eight per process past eight.
pub const DEFAULT_POINTS: &str = "1x1,1x2,1x8,2x8,4x8,8x8";

/// Relay processes and workers per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Point {
    pub processes: usize,
    pub workers: usize,
}

impl Point {
    pub fn total_workers(&self) -> usize {
        self.processes * self.workers
    }

    pub fn label(&self) -> String {
        format!("{}x{}", self.processes, self.workers)
    }

    /// "2x8": two processes of eight workers.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let parsed = text.split_once('x').and_then(|(p, w)| {
            Some(Self {
                processes: p.trim().parse().ok()?,
                workers: w.trim().parse().ok()?,
            })
        });
        match parsed {
            Some(point) if point.processes > 0 && point.workers > 0 => Ok(point),
            _ => anyhow::bail!(
                "--scaling-points entries look like 2x8 (relay processes x workers each), got {text:?}"
            ),
        }
    }
}

pub struct ScalingOptions {
    pub points: Vec<Point>,
    /// Pending rows seeded for each point: enough that the window ends before the table drains.
    pub rows: u64,
    pub window: Duration,
    /// Run until every row was relayed instead (the smoke run).
    pub drain: bool,
    pub baseline_relay: Option<PathBuf>,
}

/// One point of one relay binary.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingRun {
    /// "relay" or "baseline".
    pub contender: String,
    pub point: Point,
    pub measurement: Measurement,
    /// Rows the claims returned over the whole run (start to stop).
    pub claimed_rows: i64,
    pub claims: i64,
    /// Buffers the claim statements touched per claimed row (pg_stat_statements); None
    /// without it.
    pub claim_buffers_per_row: Option<f64>,
    /// Buffers of the table and all its indexes per claimed row: claims, marks and reports.
    pub table_buffers_per_row: f64,
    /// Pending-index entries read per claimed row: the entries a claim steps over show here.
    pub index_entries_per_row: f64,
    /// Claim latency over every process's histogram.
    pub claim_p50_ms: f64,
    pub claim_p99_ms: f64,
    /// Mean claim execution time on the server (pg_stat_statements).
    pub claim_mean_ms: Option<f64>,
    /// Mean time of the lag report's capped backlog count on the server.
    pub backlog_count_mean_ms: Option<f64>,
    pub waits: SessionWaits,
}

impl ScalingRun {
    pub fn rows_per_claim(&self) -> f64 {
        self.claimed_rows as f64 / self.claims.max(1) as f64
    }
}

pub async fn run(
    env: &Env,
    names: &RunNames,
    options: &ScalingOptions,
) -> anyhow::Result<Vec<ScalingRun>> {
    let mut conn = PgConnection::connect(&env.database_url).await?;
    let statements = statements_available(&mut conn).await;
    let mut contenders = vec![("relay".to_string(), env.clone())];
    if let Some(baseline) = &options.baseline_relay {
        let mut baseline_env = env.clone();
        baseline_env.relay_bin = baseline.clone();
        contenders.push(("baseline".to_string(), baseline_env));
    }
    let mut runs = Vec::new();
    for &point in &options.points {
        for (contender, env) in &contenders {
            eprintln!(
                "scaling {contender} {}: {} process(es) x {} worker(s)",
                point.label(),
                point.processes,
                point.workers
            );
            let run = run_point(env, names, options, point, contender, statements)
                .await
                .with_context(|| format!("scaling point {} ({contender})", point.label()))?;
            eprintln!(
                "  {:.0} msg/s, {} buffers per claimed row, claim p99 {:.1} ms",
                run.measurement.rate,
                run.claim_buffers_per_row
                    .map_or("?".to_string(), |b| format!("{b:.1}")),
                run.claim_p99_ms
            );
            runs.push(run);
        }
    }
    Ok(runs)
}

async fn run_point(
    env: &Env,
    names: &RunNames,
    options: &ScalingOptions,
    point: Point,
    contender: &str,
    statements: bool,
) -> anyhow::Result<ScalingRun> {
    let what = format!("scaling_{contender}_{}", point.label());
    let fixture = Fixture::create(
        &env.database_url,
        &names.table(&what),
        Workload::Article,
        options.rows,
        DeliveryMode::Mark,
        &MigrationOptions::default(),
        None,
    )
    .await?;
    let destination = Destination::declare(&env.amqp_url, names.exchange(&what), None).await?;
    let result = measure_point(env, &fixture, &destination, options, point, statements).await;
    destination.delete(&env.amqp_url).await?;
    fixture.drop_table().await?;
    let (measurement, counted) = result?;
    Ok(counted.into_run(contender, point, measurement))
}

/// What one point counted besides the sampled rate.
pub struct Counted {
    counters: TableCounters,
    claim_p50_ms: f64,
    claim_p99_ms: f64,
    waits: SessionWaits,
}

impl Counted {
    pub fn into_run(self, contender: &str, point: Point, measurement: Measurement) -> ScalingRun {
        let claims = self.counters.claims;
        // Without pg_stat_statements the settled rows stand in for the claimed ones.
        let claimed_rows = claims.map_or(measurement.messages as i64, |c| c.rows);
        let per_row = |count: i64| count as f64 / claimed_rows.max(1) as f64;
        ScalingRun {
            contender: contender.to_string(),
            point,
            claimed_rows,
            claims: claims.map_or(0, |c| c.calls),
            claim_buffers_per_row: claims.map(|c| per_row(c.blocks)),
            table_buffers_per_row: per_row(self.counters.heap_blocks + self.counters.index_blocks),
            index_entries_per_row: per_row(self.counters.pending_index_entries),
            claim_p50_ms: self.claim_p50_ms,
            claim_p99_ms: self.claim_p99_ms,
            claim_mean_ms: claims.map(|c| c.exec_ms / c.calls.max(1) as f64),
            backlog_count_mean_ms: self
                .counters
                .backlog_counts
                .filter(|c| c.calls > 0)
                .map(|c| c.exec_ms / c.calls as f64),
            waits: self.waits,
            measurement,
        }
    }
}

pub async fn measure_point(
    env: &Env,
    fixture: &Fixture,
    destination: &Destination,
    options: &ScalingOptions,
    point: Point,
    statements: bool,
) -> anyhow::Result<(Measurement, Counted)> {
    let table = fixture.name();
    let mut conn = fixture.connect().await?;
    let pending_before = fixture.pending().await? as u64;
    let before = TableCounters::read(&mut conn, &table, statements).await?;
    let broker = broker_args(env, destination, BrokerProtocol::Amqp091);
    let workers = ["--workers".to_string(), point.workers.to_string()];
    let mut relays = Vec::new();
    for index in 0..point.processes {
        let label = format!("{}-{index}", point.label());
        relays.push(RelayProcess::start(env, fixture, &broker, &workers, &label).await?);
    }
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let waits = tokio::spawn(sample_waits(
        env.database_url.clone(),
        APPLICATION_NAME,
        Duration::from_millis(200),
        stop_sampling.clone(),
    ));
    let pids: Vec<u32> = relays.iter().map(RelayProcess::pid).collect();
    let window = if options.drain {
        Duration::from_secs(120)
    } else {
        options.window
    };
    let sampled = sample(
        || published_by_all(&relays),
        &pids,
        window,
        Some(pending_before),
    )
    .await;
    stop_sampling.store(true, Ordering::Relaxed);
    let texts: Vec<String> = join_all(relays.iter().map(RelayProcess::metrics))
        .await
        .into_iter()
        .flatten()
        .collect();
    let confirmed: u64 = texts.iter().filter_map(|t| scrape::published(t)).sum();
    let stopped = join_all(relays.into_iter().map(RelayProcess::stop)).await;
    let waits = waits.await.context("the lock-wait sampler")??;
    let measurement = sampled?;
    for stop in stopped {
        stop?;
    }
    // The relays' backends have exited, so every counter they kept is flushed.
    let after = TableCounters::read(&mut conn, &table, statements).await?;
    let failed = fixture.failed().await?;
    ensure!(
        failed == 0,
        "the relays settled {failed} row(s) with an error"
    );
    let pending_after = fixture.pending().await? as u64;
    let settled = pending_before.saturating_sub(pending_after);
    ensure!(
        settled >= confirmed,
        "the relays reported {confirmed} confirmed messages but only {settled} rows were settled"
    );
    if options.drain {
        ensure!(
            pending_after == 0,
            "the relays left {pending_after} of {pending_before} rows pending"
        );
    }
    Ok((
        measurement,
        Counted {
            counters: after.since(&before),
            claim_p50_ms: scrape::merged_stage_quantile(&texts, "claim", 0.50),
            claim_p99_ms: scrape::merged_stage_quantile(&texts, "claim", 0.99),
            waits,
        },
    ))
}

/// The published counters of every process added up; None while one cannot be read.
async fn published_by_all(relays: &[RelayProcess]) -> Option<u64> {
    let counts = join_all(relays.iter().map(RelayProcess::published)).await;
    counts.into_iter().sum()
}
