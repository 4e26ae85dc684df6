//! `outbox-bench` (make bench): the relay measured side by side with the broker's ceiling and
//! the naive loop, on the local PostgreSQL and RabbitMQ. See docs/benchmarks.md.

mod big_table;
mod broker;
mod ceiling;
mod consumer_process;
mod env;
mod fixture;
mod latency;
mod measure;
mod naive;
mod names;
mod pg_stats;
mod plot;
mod procstat;
mod relay_process;
mod relay_run;
mod report;
mod scaling;
mod scrape;
mod stats;
mod sustained;
mod throughput;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use sqlx::{Connection, PgConnection};

use crate::big_table::BigTableOptions;
use crate::env::Env;
use crate::names::RunNames;
use crate::plot::{Line, Panel, rate_points};
use crate::report::{Context, Report};
use crate::scaling::{Point, ScalingOptions, ScalingRun};
use crate::sustained::SustainedOptions;
use crate::throughput::{RelaySettings, ThroughputOptions};
use crate::workload::Workload;

// The same allocator as the relay, so the in-process ceiling publisher is as efficient as the
// relay's and the ratio compares the table protocol, not two allocators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "outbox-bench",
    about = "Measures the outbox relay against the broker's ceiling and the naive loop"
)]
struct Args {
    /// A tiny run of every mode that takes seconds and checks delivery (CI).
    #[arg(long)]
    smoke: bool,
    /// Throughput mode; the default when no other mode is asked for.
    #[arg(long)]
    throughput: bool,
    /// Sustained mode: throughput per minute in mark and delete mode on a big table.
    #[arg(long)]
    sustained: bool,
    /// Scaling mode: one table, workers added over relay processes (--scaling-points), with
    /// the claim's buffers and index entries per row, its latency and the lock waits.
    #[arg(long)]
    scaling: bool,
    /// Points of the scaling mode, as PxW (P relay processes of W workers each).
    #[arg(long, value_delimiter = ',', default_value = scaling::DEFAULT_POINTS)]
    scaling_points: Vec<String>,
    /// Big-table mode: the claim and the backlog count on a table with --big-processed
    /// processed and --big-pending pending rows (mark mode), and --big-pending (delete mode).
    #[arg(long)]
    big_table: bool,
    #[arg(long, default_value_t = 10_000_000)]
    big_processed: u64,
    #[arg(long, default_value_t = 1_000_000)]
    big_pending: u64,
    /// Latency mode at R rows/s (default 1000).
    #[arg(long, value_name = "R", num_args = 0..=1, default_missing_value = "1000")]
    latency: Option<f64>,
    /// Workloads for throughput mode: article, realistic (default both).
    #[arg(long, value_delimiter = ',')]
    workload: Vec<String>,
    /// Rows seeded per table (throughput default: 2,000,000 article, 1,000,000 realistic;
    /// sustained default: 10,000,000 or what the minutes need).
    #[arg(long)]
    rows: Option<u64>,
    /// Runs per contender in throughput mode (median, min, max).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Measured window of one throughput run, in seconds.
    #[arg(long, default_value_t = 15)]
    window: u64,
    /// Sustained variants to run: mark, mark-no-autovacuum, mark-held-snapshot, delete (default
    /// all).
    #[arg(long, value_delimiter = ',')]
    sustained_variants: Vec<String>,
    /// Minutes of each sustained run.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// Seconds of steady inserts in latency mode.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Relay settings tried besides the defaults, as wN-bM (workers, batch size), with -iK
    /// (publish slots) and -rR (--max-rate R messages per second) optional; "none" skips the
    /// sweep.
    #[arg(long, value_delimiter = ',')]
    sweep: Vec<String>,
    /// Key counts of the per-key ordered contenders (`--ordering per-key` on a table whose
    /// rows take turns over that many partition keys); "0" skips them.
    #[arg(long, value_delimiter = ',', default_value = "1000,10")]
    per_key: Vec<u64>,
    /// Connection counts tried for the AMQP 1.0 ceiling (RabbitMQ's AMQP 1.0 plugin, at
    /// --amqp10-url); with any, the relay at its defaults is measured over AMQP 1.0 too. "0"
    /// skips both.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    amqp10_connections: Vec<usize>,
    /// The broker's AMQP 1.0 endpoint.
    #[arg(
        long,
        env = "AMQP10_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672"
    )]
    amqp10_url: String,
    /// Connection counts tried for the ceiling.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    connections: Vec<usize>,
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp_url: String,
    /// The relay binary (default: outbox-relay next to this binary).
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// Another relay binary (say, a build before a change), measured at its defaults in every
    /// throughput round right after the relay's defaults: before/after in one sitting.
    #[arg(long)]
    baseline_relay_bin: Option<PathBuf>,
    /// Where JSON, plots and logs go (default: target/bench).
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

/// Settings tried besides the defaults: workers, batch size, publish slots (None: the
/// relay's default of one; Some(0): one per worker, i.e. no limit).
const DEFAULT_SWEEP: [(usize, usize, Option<usize>); 8] = [
    (1, 500, None),
    (3, 500, None),
    (4, 500, None),
    (2, 250, None),
    (2, 1000, None),
    (2, 500, Some(0)),
    (4, 500, Some(0)),
    (4, 1000, Some(0)),
];

/// Parses the --sweep list ("w4-b1000,w2-b500-i0,w2-b500-r5000,…" or "none").
fn sweep_from(args: &[String]) -> anyhow::Result<Vec<RelaySettings>> {
    if args.is_empty() {
        return Ok(DEFAULT_SWEEP
            .into_iter()
            .map(|(w, b, i)| RelaySettings::with(w, b, i))
            .collect());
    }
    if args == ["none"] {
        return Ok(Vec::new());
    }
    args.iter().map(|text| parse_setting(text)).collect()
}

fn parse_setting(text: &str) -> anyhow::Result<RelaySettings> {
    let parsed = (|| {
        let (text, max_rate) = match text.split_once("-r") {
            Some((settings, rate)) => (settings, Some(rate.parse::<f64>().ok()?)),
            None => (text, None),
        };
        let (workers, rest) = text.strip_prefix('w')?.split_once("-b")?;
        let (batch, inflight) = match rest.split_once("-i") {
            Some((batch, slots)) => (batch, Some(slots.parse().ok()?)),
            None => (rest, None),
        };
        let settings = RelaySettings::with(workers.parse().ok()?, batch.parse().ok()?, inflight);
        Some(match max_rate {
            Some(rate) => settings.limited(rate),
            None => settings,
        })
    })();
    parsed.ok_or_else(|| {
        anyhow::anyhow!(
            "--sweep entries look like w4-b1000, w4-b1000-i0 or w4-b1000-r5000, got {text:?}"
        )
    })
}

async fn versions(env: &Env) -> (String, String) {
    let postgres = async {
        let mut conn = PgConnection::connect(&env.database_url).await.ok()?;
        sqlx::query_scalar::<_, String>("SHOW server_version")
            .fetch_one(&mut conn)
            .await
            .ok()
    }
    .await
    .unwrap_or_else(|| "?".into());
    // The AMQP handshake's server properties are not exposed by lapin; ask the broker's CLI.
    let rabbitmq = tokio::process::Command::new("rabbitmqctl")
        .arg("version")
        .output()
        .await
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into());
    (postgres, rabbitmq)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let began = Instant::now();
    let env = Env {
        database_url: args.database_url.clone(),
        amqp_url: args.amqp_url.clone(),
        amqp10_url: args.amqp10_url.clone(),
        relay_bin: args
            .relay_bin
            .clone()
            .unwrap_or_else(env::sibling_relay_binary),
        out_dir: args.out_dir.clone().unwrap_or_else(env::default_out_dir),
    };
    anyhow::ensure!(
        env.relay_bin.exists(),
        "relay binary {} not found; build it with cargo build --release -p outbox-relay",
        env.relay_bin.display()
    );
    std::fs::create_dir_all(&env.out_dir)?;
    let names = RunNames::new();
    let started_at = chrono::Utc::now().to_rfc3339();
    let load_before = procstat::load_average();
    let (postgres_version, rabbitmq_version) = versions(&env).await;

    let smoke = args.smoke;
    let any_mode = args.sustained || args.latency.is_some() || args.scaling || args.big_table;
    let do_throughput = smoke || args.throughput || !any_mode;
    let workloads = if args.workload.is_empty() {
        Workload::ALL.to_vec()
    } else {
        args.workload
            .iter()
            .map(|w| {
                Workload::parse(w).ok_or_else(|| {
                    anyhow::anyhow!("unknown workload {w:?}; use article or realistic")
                })
            })
            .collect::<anyhow::Result<_>>()?
    };

    let mut report = Report {
        context: Context {
            started_at,
            finished_at: String::new(),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_average_before: load_before,
            load_average_after: None,
            postgres_version,
            rabbitmq_version,
            smoke,
        },
        throughput: Vec::new(),
        sustained: Vec::new(),
        latency: None,
        scaling: Vec::new(),
    };

    if do_throughput {
        let per_key: Vec<u64> = args.per_key.iter().copied().filter(|&k| k > 0).collect();
        let amqp10_connections: Vec<usize> = args
            .amqp10_connections
            .iter()
            .copied()
            .filter(|&c| c > 0)
            .collect();
        let options = if smoke {
            ThroughputOptions {
                workloads: workloads.clone(),
                rows: Some(args.rows.unwrap_or(3000)),
                runs: 1,
                window: Duration::from_secs(1),
                connections: vec![1, 2],
                sweep: vec![RelaySettings::with(4, 1000, Some(0))],
                drain: true,
                per_key: per_key.clone(),
                amqp10_connections: amqp10_connections.iter().take(1).copied().collect(),
                baseline_relay: args.baseline_relay_bin.clone(),
            }
        } else {
            ThroughputOptions {
                workloads: workloads.clone(),
                rows: args.rows,
                runs: args.runs.max(1),
                window: Duration::from_secs(args.window.max(1)),
                connections: args.connections.clone(),
                sweep: sweep_from(&args.sweep)?,
                drain: false,
                per_key: per_key.clone(),
                amqp10_connections: amqp10_connections.clone(),
                baseline_relay: args.baseline_relay_bin.clone(),
            }
        };
        for &workload in &options.workloads {
            report
                .throughput
                .push(throughput::run_workload(&env, &names, workload, &options).await?);
        }
    }
    if smoke || args.sustained {
        let options = if smoke {
            SustainedOptions {
                rows: args.rows.unwrap_or(20_000),
                duration: Duration::from_secs(3),
                bucket: Duration::from_secs(1),
                variants: Vec::new(),
            }
        } else {
            let duration = Duration::from_secs(args.minutes.max(1) * 60);
            // 10 million rows, or about what the minutes can relay at ~45k msg/s.
            let rows = args
                .rows
                .unwrap_or_else(|| (args.minutes * 60 * 45_000).min(10_000_000));
            SustainedOptions {
                rows,
                duration,
                bucket: Duration::from_secs(60),
                variants: args.sustained_variants.clone(),
            }
        };
        report.sustained = sustained::run(&env, &names, &options).await?;
    }
    if smoke || args.latency.is_some() {
        let (rate, seconds) = if smoke {
            (200.0, 3)
        } else {
            (args.latency.unwrap_or(1000.0), args.seconds)
        };
        anyhow::ensure!(rate > 0.0, "--latency needs a positive rate");
        report.latency =
            Some(latency::run(&env, &names, rate, Duration::from_secs(seconds.max(1))).await?);
    }

    if smoke || args.scaling {
        let options = if smoke {
            ScalingOptions {
                points: vec![Point::parse("1x1")?, Point::parse("2x2")?],
                rows: args.rows.unwrap_or(3000),
                window: Duration::from_secs(1),
                drain: true,
                baseline_relay: None,
            }
        } else {
            ScalingOptions {
                points: args
                    .scaling_points
                    .iter()
                    .map(|p| Point::parse(p))
                    .collect::<anyhow::Result<_>>()?,
                rows: args.rows.unwrap_or(800_000),
                window: Duration::from_secs(args.window.max(1)),
                drain: false,
                baseline_relay: args.baseline_relay_bin.clone(),
            }
        };
        report.scaling = scaling::run(&env, &names, &options).await?;
    }

    if smoke || args.big_table {
        let options = if smoke {
            BigTableOptions {
                processed: 20_000,
                pending: 3_000,
                window: Duration::from_secs(1),
                drain: true,
            }
        } else {
            BigTableOptions {
                processed: args.big_processed,
                pending: args.big_pending,
                window: Duration::from_secs(args.window.max(1)),
                drain: false,
            }
        };
        report
            .scaling
            .extend(big_table::run(&env, &names, &options).await?);
    }

    report.context.finished_at = chrono::Utc::now().to_rfc3339();
    report.context.load_average_after = procstat::load_average();
    write_outputs(&env, &report)?;
    print!("{}", report.markdown());
    eprintln!(
        "done in {:.1} s; JSON and plot in {}",
        began.elapsed().as_secs_f64(),
        env.out_dir.display()
    );
    Ok(())
}

/// JSON (latest and timestamped) and the throughput-over-time plot.
fn write_outputs(env: &Env, report: &Report) -> anyhow::Result<()> {
    let stem = if report.context.smoke {
        "smoke"
    } else {
        "results"
    };
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(env.out_dir.join(format!("{stem}.json")), &json)?;
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    std::fs::write(env.out_dir.join(format!("{stem}-{stamp}.json")), &json)?;

    let mut panels = Vec::new();
    for w in &report.throughput {
        let lines = [&w.ceiling, &w.relay_defaults, &w.relay_best, &w.naive]
            .into_iter()
            .map(|c| Line {
                label: format!("{} ({:.0} msg/s)", c.label, c.rate.median),
                points: rate_points(&c.median_run.series, 4),
            })
            .collect();
        panels.push((format!("throughput, {} workload", w.workload_name()), lines));
    }
    if !report.sustained.is_empty() {
        let lines = report
            .sustained
            .iter()
            .map(|s| Line {
                label: s.label.clone(),
                points: rate_points(&s.measurement.series, 40),
            })
            .collect();
        panels.push(("sustained, article rows, relay defaults".into(), lines));
    }
    plot::draw(&env.out_dir.join(format!("{stem}.svg")), &panels)?;
    if !report.scaling.is_empty() {
        draw_scaling(
            &env.out_dir.join(format!("{stem}-scaling.svg")),
            &report.scaling,
        )?;
    }
    Ok(())
}

/// msg/s and the claim's buffers per row against the number of workers, a line per binary.
fn draw_scaling(path: &std::path::Path, runs: &[ScalingRun]) -> anyhow::Result<()> {
    let mut contenders: Vec<&str> = Vec::new();
    for run in runs {
        if !contenders.contains(&run.contender.as_str()) {
            contenders.push(&run.contender);
        }
    }
    let lines = |value: &dyn Fn(&ScalingRun) -> f64| -> Vec<Line> {
        contenders
            .iter()
            .map(|&contender| Line {
                label: contender.to_string(),
                points: runs
                    .iter()
                    .filter(|r| r.contender == contender)
                    .map(|r| (r.point.total_workers() as f64, value(r)))
                    .collect(),
            })
            .collect()
    };
    let rate = lines(&|r| r.measurement.rate);
    let buffers = lines(&|r| r.claim_buffers_per_row.unwrap_or(r.table_buffers_per_row));
    let p99 = lines(&|r| r.claim_p99_ms);
    let panels = [
        Panel {
            title: "throughput against workers, one table",
            x_desc: "workers (processes x workers each)",
            y_desc: "messages/s",
            lines: &rate,
        },
        Panel {
            title: "buffers the claim reads per claimed row",
            x_desc: "workers",
            y_desc: "buffers per row",
            lines: &buffers,
        },
        Panel {
            title: "claim latency p99",
            x_desc: "workers",
            y_desc: "ms",
            lines: &p99,
        },
    ];
    plot::draw_panels(path, &panels)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let smoke = args.smoke;
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "outbox-bench{} FAILED: {e:#}",
                if smoke { " --smoke" } else { "" }
            );
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_entries_name_workers_batch_and_slots() {
        let with_slots = parse_setting("w4-b1000-i0").unwrap();
        assert_eq!(with_slots.label, "w4-b1000-i0");
        assert_eq!(
            with_slots.args,
            [
                "--workers",
                "4",
                "--batch-size",
                "1000",
                "--inflight-batches",
                "0"
            ]
        );
        assert_eq!(parse_setting("w2-b500").unwrap().args.len(), 4);
        let limited = parse_setting("w2-b500-i0-r5000").unwrap();
        assert_eq!(limited.label, "w2-b500-i0-r5000");
        assert_eq!(limited.args[6..], ["--max-rate", "5000"]);
        for bad in ["w2", "b500", "w2-b500-ix", "wx-b500", "w2-b500-rfast"] {
            assert!(parse_setting(bad).is_err(), "{bad}");
        }
    }
}
