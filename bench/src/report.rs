//! The results of one invocation: JSON for machines, a Markdown table for people.

use std::fmt::Write as _;

use serde::Serialize;

use crate::latency::LatencyResult;
use crate::scaling::ScalingRun;
use crate::sustained::SustainedRun;
use crate::throughput::{Contender, WorkloadResult};

/// The batch stages in the order a batch goes through them.
const STAGES: [&str; 6] = ["claim", "slot", "publish", "confirm", "mark", "commit"];

#[derive(Debug, Clone, Serialize)]
pub struct Context {
    pub started_at: String,
    pub finished_at: String,
    pub cores: usize,
    pub load_average_before: Option<f64>,
    pub load_average_after: Option<f64>,
    pub postgres_version: String,
    pub rabbitmq_version: String,
    pub smoke: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub context: Context,
    pub throughput: Vec<WorkloadResult>,
    pub sustained: Vec<SustainedRun>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyResult>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scaling: Vec<ScalingRun>,
}

fn contender_row(out: &mut String, workload: &str, c: &Contender) {
    let m = &c.median_run;
    let rss = m
        .peak_rss_mib
        .map_or("–".to_string(), |r| format!("{r:.1}"));
    let us = &m.cpu_us_per_message;
    let _ = writeln!(
        out,
        "| {workload} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {rss} |",
        c.label,
        c.rate.median,
        c.rate.min,
        c.rate.max,
        m.cpu.subject,
        m.cpu.postgres,
        m.cpu.rabbitmq,
        us.subject,
        us.postgres,
        us.postgres_backends,
        us.rabbitmq
    );
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let c = &self.context;
        let _ = writeln!(
            out,
            "# outbox-bench {}\n\nstarted {}, {} cores, load average {} before / {} after; PostgreSQL {}, RabbitMQ {}\n",
            if c.smoke {
                "(smoke: tiny sizes, numbers mean nothing)"
            } else {
                ""
            },
            c.started_at,
            c.cores,
            c.load_average_before
                .map_or("?".into(), |l| format!("{l:.2}")),
            c.load_average_after
                .map_or("?".into(), |l| format!("{l:.2}")),
            c.postgres_version,
            c.rabbitmq_version
        );
        if !self.throughput.is_empty() {
            let _ = writeln!(
                out,
                "## Throughput (msg/s: median, min, max of the runs; CPU seconds over the median run's window, and per message)\n"
            );
            let _ = writeln!(
                out,
                "| workload | contender | median | min | max | CPU subject s | CPU postgres s | CPU rabbitmq s | subject µs/msg | postgres µs/msg | of which backends | rabbitmq µs/msg | relay peak RSS MiB |"
            );
            let _ = writeln!(
                out,
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            );
            for w in &self.throughput {
                let name = w.workload_name();
                for ceiling in &w.ceiling_by_connections {
                    contender_row(&mut out, name, ceiling);
                }
                contender_row(&mut out, name, &w.relay_defaults);
                if let Some(baseline) = &w.baseline {
                    contender_row(&mut out, name, &baseline.contender);
                }
                contender_row(&mut out, name, &w.relay_best);
                contender_row(&mut out, name, &w.naive);
                for per_key in &w.per_key {
                    contender_row(&mut out, name, &per_key.contender);
                }
                if let Some(amqp10) = &w.amqp10 {
                    for ceiling in &amqp10.ceiling_by_connections {
                        contender_row(&mut out, name, ceiling);
                    }
                    contender_row(&mut out, name, &amqp10.relay);
                }
            }
            let _ = writeln!(
                out,
                "\n| workload | rows | payload bytes | relay/ceiling | best/ceiling | relay/naive | best/naive | sweep (msg/s, one run each) |"
            );
            let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---|");
            for w in &self.throughput {
                let sweep = w
                    .sweep
                    .iter()
                    .map(|(label, rate)| format!("{label} {rate:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {sweep} |",
                    w.workload_name(),
                    w.rows,
                    w.payload_bytes,
                    w.relay_over_ceiling,
                    w.best_over_ceiling,
                    w.relay_over_naive,
                    w.best_over_naive
                );
            }
            for w in &self.throughput {
                let Some(b) = &w.baseline else { continue };
                let (this, base) = (&w.relay_defaults.median_run, &b.contender.median_run);
                let _ = writeln!(
                    out,
                    "\n{}: this relay over the baseline ({}) at defaults, same rounds: {:.3} x msg/s; µs/msg relay {:.2} → {:.2}, postgres {:.2} → {:.2} (backends {:.2} → {:.2}), rabbitmq {:.2} → {:.2} (baseline → this)",
                    w.workload_name(),
                    b.binary,
                    b.relay_over_baseline,
                    base.cpu_us_per_message.subject,
                    this.cpu_us_per_message.subject,
                    base.cpu_us_per_message.postgres,
                    this.cpu_us_per_message.postgres,
                    base.cpu_us_per_message.postgres_backends,
                    this.cpu_us_per_message.postgres_backends,
                    base.cpu_us_per_message.rabbitmq,
                    this.cpu_us_per_message.rabbitmq,
                );
            }
            if self.throughput.iter().any(|w| !w.per_key.is_empty()) {
                let _ = writeln!(
                    out,
                    "\nPer-key ordering (`--ordering per-key`, relay defaults otherwise; runs alternate with the unordered defaults):\n"
                );
                let _ = writeln!(
                    out,
                    "| workload | keys | median msg/s | over unordered | claim ms (mean) | confirm ms (mean) |"
                );
                let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
                for w in &self.throughput {
                    for per_key in &w.per_key {
                        let stage = |name: &str| {
                            per_key
                                .contender
                                .median_run
                                .stages
                                .get(name)
                                .map_or("–".into(), |t| format!("{:.2}", t.mean_ms))
                        };
                        let _ = writeln!(
                            out,
                            "| {} | {} | {:.0} | {:.2} | {} | {} |",
                            w.workload_name(),
                            per_key.keys,
                            per_key.contender.rate.median,
                            per_key.over_unordered,
                            stage("claim"),
                            stage("confirm")
                        );
                    }
                }
            }
            if self.throughput.iter().any(|w| w.amqp10.is_some()) {
                let _ = writeln!(
                    out,
                    "\nAMQP 1.0 (RabbitMQ's AMQP 1.0 plugin on the same broker; the ceiling is the relay's own AMQP 1.0 publisher fed from memory):\n"
                );
                let _ = writeln!(
                    out,
                    "| workload | ceiling msg/s (best) | relay msg/s | relay/ceiling | relay µs/msg |"
                );
                let _ = writeln!(out, "|---|---:|---:|---:|---:|");
                for w in &self.throughput {
                    let Some(a) = &w.amqp10 else { continue };
                    let _ = writeln!(
                        out,
                        "| {} | {:.0} ({}) | {:.0} | {:.2} | {:.2} |",
                        w.workload_name(),
                        a.ceiling.rate.median,
                        a.ceiling.label,
                        a.relay.rate.median,
                        a.relay_over_ceiling,
                        a.relay.median_run.cpu_us_per_message.subject
                    );
                }
            }
            let _ = writeln!(
                out,
                "\nMean time per batch stage, relay at defaults (ms):\n"
            );
            let _ = writeln!(out, "| workload | {} | batches |", STAGES.join(" | "));
            let _ = writeln!(out, "|---|{}---:|", "---:|".repeat(STAGES.len()));
            for w in &self.throughput {
                let s = &w.relay_defaults.median_run.stages;
                let means: Vec<String> = STAGES
                    .iter()
                    .map(|k| {
                        s.get(*k)
                            .map_or("–".into(), |t| format!("{:.2}", t.mean_ms))
                    })
                    .collect();
                let batches = s.get("publish").map_or(0, |t| t.count);
                let _ = writeln!(
                    out,
                    "| {} | {} | {batches} |",
                    w.workload_name(),
                    means.join(" | ")
                );
            }
        }
        if !self.sustained.is_empty() {
            let _ = writeln!(out, "\n## Sustained (relay at defaults, article rows)\n");
            let _ = writeln!(
                out,
                "| variant | msg/s per bucket | last/first | autovacuum runs | claim ms (mean) | horizon age s / dead tuples at the end (relay's report) |"
            );
            let _ = writeln!(out, "|---|---|---:|---:|---:|---|");
            for s in &self.sustained {
                let buckets = s
                    .per_bucket
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let claim = s
                    .measurement
                    .stages
                    .get("claim")
                    .map_or("–".into(), |t| format!("{:.2}", t.mean_ms));
                let health = &s.measurement.table_health;
                let reported = match (
                    health.get("cleanup_horizon_age_seconds"),
                    health.get("table_dead_tuples"),
                ) {
                    (Some(age), Some(dead)) => format!("{age:.0} / {dead:.0}"),
                    _ => "–".into(),
                };
                let _ = writeln!(
                    out,
                    "| {} | {buckets} | {:.2} | {} | {claim} | {reported} |",
                    s.label, s.last_over_first, s.autovacuum_runs
                );
            }
        }
        if let Some(l) = &self.latency {
            let _ = writeln!(out, "\n## Latency (insert commit → consumer receive)\n");
            let _ = writeln!(
                out,
                "| rows/s | seconds | delivered | p50 ms | p99 ms | max ms | relay CPU s | relay peak RSS MiB |"
            );
            let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|");
            let _ = writeln!(
                out,
                "| {:.0} | {:.0} | {}/{} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                l.rate,
                l.seconds,
                l.delivered,
                l.inserted,
                l.p50_ms,
                l.p99_ms,
                l.max_ms,
                l.relay_cpu.subject,
                l.relay_peak_rss_mib
                    .map_or("–".into(), |r| format!("{r:.1}"))
            );
            let _ = writeln!(
                out,
                "\nBatch stages over the run, mean / p99 (ms, p99 from the histogram buckets):\n"
            );
            let _ = writeln!(out, "| stage | batches | mean | p99 |");
            let _ = writeln!(out, "|---|---:|---:|---:|");
            for stage in STAGES {
                let Some(time) = l.stages.get(stage) else {
                    continue;
                };
                let _ = writeln!(
                    out,
                    "| {stage} | {} | {:.2} | {:.1} |",
                    time.count, time.mean_ms, time.p99_ms
                );
            }
        }
        if !self.scaling.is_empty() {
            scaling_table(&mut out, &self.scaling);
        }
        out
    }
}

/// One row per point and binary: rate and CPU, then what PostgreSQL counted per claimed row.
fn scaling_table(out: &mut String, runs: &[ScalingRun]) {
    let _ = writeln!(
        out,
        "\n## Scaling (one table, processes x workers each)\n\n\
         Buffers and index entries are per claimed row over the whole run; claim latency from the \
         relays' histograms (p50 / p99) and the server (mean); waits are the mean number of relay \
         sessions waiting on a lock / a lightweight lock / running at all, sampled every 200 ms.\n"
    );
    let _ = writeln!(
        out,
        "| binary | config | workers | msg/s | relay µs/msg | PG µs/msg | claim buffers/row | table buffers/row | index entries/row | claim p50 / p99 ms | claim mean ms | rows/claim | waits lock / lwlock / active | backlog count ms |"
    );
    let _ = writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in runs {
        let m = &r.measurement;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {:.1} / {:.1} | {} | {:.0} | {:.2} / {:.2} / {:.1} | {} |",
            r.contender,
            r.point.label(),
            r.point.total_workers(),
            m.rate,
            m.cpu_us_per_message.subject,
            m.cpu_us_per_message.postgres_backends,
            r.claim_buffers_per_row
                .map_or("–".into(), |b| format!("{b:.1}")),
            r.table_buffers_per_row,
            r.index_entries_per_row,
            r.claim_p50_ms,
            r.claim_p99_ms,
            r.claim_mean_ms.map_or("–".into(), |ms| format!("{ms:.2}")),
            r.rows_per_claim(),
            r.waits.lock,
            r.waits.lwlock,
            r.waits.active,
            r.backlog_count_mean_ms
                .map_or("–".into(), |ms| format!("{ms:.1}"))
        );
    }
}

impl WorkloadResult {
    pub fn workload_name(&self) -> &'static str {
        self.workload.name()
    }
}
