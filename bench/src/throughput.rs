//! Throughput mode: for each workload, the ceiling (best of 1/2/4 connections), the relay at
//! its defaults, a sweep of settings, the relay at the best of them, and the naive loop, all
//! side by side in one run so the ratios hold even on a noisy machine.

use std::sync::Arc;
use std::time::Duration;

use outbox_relay::broker::BrokerProtocol;
use outbox_relay::table::DeliveryMode;
use outbox_relay::table::migrate::MigrationOptions;
use serde::Serialize;

use crate::broker::Destination;
use crate::ceiling::{self, Route};
use crate::consumer_process::ConsumerProcess;
use crate::env::Env;
use crate::fixture::{Fixture, KEY_COLUMN, sample_payloads};
use crate::measure::Measurement;
use crate::naive;
use crate::names::{RunNames, next_run};
use crate::relay_run::{Until, measure_relay};
use crate::stats::Spread;
use crate::workload::Workload;

/// Relay settings tried in the sweep; the default is always measured on its own.
#[derive(Debug, Clone, Serialize)]
pub struct RelaySettings {
    pub label: String,
    pub args: Vec<String>,
    #[serde(skip)]
    pub protocol: BrokerProtocol,
}

impl RelaySettings {
    pub fn defaults() -> Self {
        Self {
            label: "defaults".into(),
            args: Vec::new(),
            protocol: BrokerProtocol::Amqp091,
        }
    }

    /// The defaults, publishing over AMQP 1.0 to the same broker.
    pub fn amqp10_defaults() -> Self {
        Self {
            label: "amqp10-defaults".into(),
            args: Vec::new(),
            protocol: BrokerProtocol::Amqp10,
        }
    }

    /// Workers and batch size, and the publish slots when given (`--inflight-batches`; the
    /// relay's default otherwise). Labelled wN-bM or wN-bM-iK.
    pub fn with(workers: usize, batch: usize, inflight: Option<usize>) -> Self {
        let mut label = format!("w{workers}-b{batch}");
        let mut args = vec![
            "--workers".into(),
            workers.to_string(),
            "--batch-size".into(),
            batch.to_string(),
        ];
        if let Some(slots) = inflight {
            label.push_str(&format!("-i{slots}"));
            args.extend(["--inflight-batches".into(), slots.to_string()]);
        }
        Self {
            label,
            args,
            protocol: BrokerProtocol::Amqp091,
        }
    }

    /// The same settings under `--max-rate` (messages per second): the measured rate against
    /// the limit shows it is applied. Labelled …-rN.
    pub fn limited(mut self, max_rate: f64) -> Self {
        self.label.push_str(&format!("-r{max_rate}"));
        self.args
            .extend(["--max-rate".into(), max_rate.to_string()]);
        self
    }
}

#[derive(Debug, Clone)]
pub struct ThroughputOptions {
    pub workloads: Vec<Workload>,
    pub rows: Option<u64>,
    pub runs: usize,
    pub window: Duration,
    pub connections: Vec<usize>,
    pub sweep: Vec<RelaySettings>,
    /// Drain the table in every relay run and check every row arrived (smoke).
    pub drain: bool,
    /// Key counts of the per-key ordered contenders (`--ordering per-key`), each measured in
    /// every round beside the unordered defaults.
    pub per_key: Vec<u64>,
    /// Connection counts of the AMQP 1.0 ceiling; empty: no AMQP 1.0 contenders. With some,
    /// every round also runs the relay at its defaults over AMQP 1.0 to the same broker.
    pub amqp10_connections: Vec<usize>,
    /// Another relay binary (a build before a change) measured at its defaults in every round
    /// right after this one's, on the same table: before/after in one sitting.
    pub baseline_relay: Option<std::path::PathBuf>,
}

/// Several runs of one contender.
#[derive(Debug, Clone, Serialize)]
pub struct Contender {
    pub label: String,
    pub rate: Spread,
    /// The run with the median rate: its CPU, memory, stages and time series.
    pub median_run: Measurement,
}

impl Contender {
    fn of(label: String, runs: Vec<Measurement>) -> Self {
        let rates: Vec<f64> = runs.iter().map(|m| m.rate).collect();
        let rate = Spread::of(&rates);
        let median_run = runs
            .into_iter()
            .min_by(|a, b| {
                (a.rate - rate.median)
                    .abs()
                    .total_cmp(&(b.rate - rate.median).abs())
            })
            .unwrap_or_default();
        Self {
            label,
            rate,
            median_run,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkloadResult {
    pub workload: Workload,
    pub rows: u64,
    pub payload_bytes: usize,
    /// One entry per connection count.
    pub ceiling_by_connections: Vec<Contender>,
    pub ceiling: Contender,
    pub relay_defaults: Contender,
    /// One run per setting tried.
    pub sweep: Vec<(String, f64)>,
    pub relay_best: Contender,
    pub naive: Contender,
    /// The relay at its defaults with per-key ordering, one entry per key count.
    pub per_key: Vec<PerKeyResult>,
    /// The AMQP 1.0 ceiling and relay on the same broker, when measured.
    pub amqp10: Option<Amqp10Result>,
    /// The baseline binary at its defaults, when one was given.
    pub baseline: Option<BaselineResult>,
    pub relay_over_ceiling: f64,
    pub best_over_ceiling: f64,
    pub relay_over_naive: f64,
    pub best_over_naive: f64,
}

/// A per-key ordered contender beside the unordered defaults of the same rounds.
#[derive(Debug, Clone, Serialize)]
pub struct PerKeyResult {
    pub keys: u64,
    pub contender: Contender,
    /// Median per-key rate over the median unordered rate at the defaults.
    pub over_unordered: f64,
}

/// Another build of the relay at its defaults, in the same rounds as this one's.
#[derive(Debug, Clone, Serialize)]
pub struct BaselineResult {
    pub binary: String,
    pub contender: Contender,
    /// This build's median rate over the baseline's.
    pub relay_over_baseline: f64,
}

/// AMQP 1.0 (RabbitMQ's plugin on the same broker): its ceiling and the relay at its defaults,
/// in the same rounds as the AMQP 0-9-1 contenders.
#[derive(Debug, Clone, Serialize)]
pub struct Amqp10Result {
    pub ceiling_by_connections: Vec<Contender>,
    pub ceiling: Contender,
    pub relay: Contender,
    pub relay_over_ceiling: f64,
}

/// The arguments that turn per-key ordering on for a keyed fixture.
fn per_key_settings(keys: u64) -> RelaySettings {
    RelaySettings {
        label: format!("per-key-{keys}"),
        args: vec![
            "--ordering".into(),
            "per-key".into(),
            "--partition-key-column".into(),
            KEY_COLUMN.into(),
        ],
        protocol: BrokerProtocol::Amqp091,
    }
}

/// The measured table for relay runs; reseeded when too little is left pending so that every
/// run has a full window's worth of rows, vacuumed otherwise so each starts clean.
struct Table {
    fixture: Option<Fixture>,
    name: String,
    workload: Workload,
    rows: u64,
    database_url: String,
    reseed_below: u64,
    /// Partition keys of a keyed table (see [`Fixture::create`]).
    keys: Option<u64>,
}

impl Table {
    async fn ready(&mut self) -> anyhow::Result<&Fixture> {
        let reseed = match &self.fixture {
            None => true,
            Some(f) => (f.pending().await? as u64) < self.reseed_below,
        };
        if reseed {
            if let Some(old) = self.fixture.take() {
                old.drop_table().await?;
            }
            eprintln!("  seeding {} rows into {}", self.rows, self.name);
            self.fixture = Some(
                Fixture::create(
                    &self.database_url,
                    &self.name,
                    self.workload,
                    self.rows,
                    DeliveryMode::Mark,
                    &MigrationOptions::default(),
                    self.keys,
                )
                .await?,
            );
        } else if let Some(f) = &self.fixture {
            f.vacuum().await?;
        }
        Ok(self.fixture.as_ref().expect("set above"))
    }

    async fn drop_table(&mut self) -> anyhow::Result<()> {
        if let Some(f) = self.fixture.take() {
            f.drop_table().await?;
        }
        Ok(())
    }
}

async fn relay_runs(
    env: &Env,
    names: &RunNames,
    table: &mut Table,
    settings: &RelaySettings,
    runs: usize,
    until: Until,
) -> anyhow::Result<Vec<Measurement>> {
    let mut measured = Vec::new();
    for run in 0..runs {
        let fixture = table.ready().await?;
        let m = measure_relay(
            env,
            names,
            fixture,
            &settings.label,
            &settings.args,
            settings.protocol,
            until,
        )
        .await?;
        let us = &m.cpu_us_per_message;
        eprintln!(
            "  relay {} run {}: {:.0} msg/s, relay CPU {:.1} s, peak RSS {:.1} MiB; µs/msg relay {:.2}, postgres {:.2} (backends {:.2}), rabbitmq {:.2}",
            settings.label,
            run + 1,
            m.rate,
            m.cpu.subject,
            m.peak_rss_mib.unwrap_or_default(),
            us.subject,
            us.postgres,
            us.postgres_backends,
            us.rabbitmq
        );
        measured.push(m);
    }
    Ok(measured)
}

#[allow(clippy::too_many_arguments)]
async fn ceiling_run(
    env: &Env,
    names: &RunNames,
    workload: Workload,
    payloads: Arc<Vec<Vec<u8>>>,
    protocol: BrokerProtocol,
    connections: usize,
    round: usize,
    options: &ThroughputOptions,
) -> anyhow::Result<Measurement> {
    let what = format!(
        "{}.ceiling-{}-{connections}.{}",
        workload.name(),
        protocol.as_str(),
        next_run()
    );
    let destination = Destination::declare(
        &env.amqp_url,
        names.exchange(&what),
        workload.has_consumer().then(|| names.queue(&what)),
    )
    .await?;
    let consumer = match destination.queue {
        Some(_) => Some(ConsumerProcess::start(env, &destination, None).await?),
        None => None,
    };
    let route = match protocol {
        BrokerProtocol::Amqp091 => Route::Exchange {
            amqp_url: env.amqp_url.clone(),
            exchange: destination.exchange.clone(),
        },
        BrokerProtocol::Amqp10 => Route::Address {
            url: env.amqp10_url.clone(),
            address: destination.amqp10_address(),
        },
    };
    let result = ceiling::run(&route, payloads, connections, options.window).await;
    if let Some(consumer) = consumer {
        consumer.kill().await;
    }
    destination.delete(&env.amqp_url).await?;
    let m = result?;
    eprintln!(
        "  ceiling {} {connections} connection(s) run {round}: {:.0} msg/s",
        protocol.as_str(),
        m.rate
    );
    Ok(m)
}

/// One round of ceiling runs: every connection count once, each run added to its list.
struct CeilingRound<'a> {
    env: &'a Env,
    names: &'a RunNames,
    workload: Workload,
    payloads: &'a Arc<Vec<Vec<u8>>>,
    options: &'a ThroughputOptions,
}

impl CeilingRound<'_> {
    async fn run(
        &self,
        protocol: BrokerProtocol,
        connections: &[usize],
        runs: &mut [Vec<Measurement>],
        round: usize,
    ) -> anyhow::Result<()> {
        for (runs, &connections) in runs.iter_mut().zip(connections) {
            runs.push(
                ceiling_run(
                    self.env,
                    self.names,
                    self.workload,
                    self.payloads.clone(),
                    protocol,
                    connections,
                    round,
                    self.options,
                )
                .await?,
            );
        }
        Ok(())
    }
}

async fn naive_runs(
    env: &Env,
    names: &RunNames,
    table: &mut Table,
    options: &ThroughputOptions,
) -> anyhow::Result<Vec<Measurement>> {
    let mut measured = Vec::new();
    for run in 0..options.runs {
        let fixture = table.ready().await?;
        let pending = fixture.pending().await? as u64;
        let what = format!("{}.naive.{}", fixture.workload.name(), next_run());
        let destination = Destination::declare(
            &env.amqp_url,
            names.exchange(&what),
            fixture.workload.has_consumer().then(|| names.queue(&what)),
        )
        .await?;
        let consumer = match destination.queue {
            Some(_) => Some(ConsumerProcess::start(env, &destination, None).await?),
            None => None,
        };
        let result = naive::run(
            fixture,
            &env.amqp_url,
            &destination.exchange,
            options.window,
            pending,
        )
        .await;
        if let Some(consumer) = consumer {
            consumer.kill().await;
        }
        destination.delete(&env.amqp_url).await?;
        let m = result?;
        eprintln!("  naive run {}: {:.0} msg/s", run + 1, m.rate);
        measured.push(m);
    }
    Ok(measured)
}

pub async fn run_workload(
    env: &Env,
    names: &RunNames,
    workload: Workload,
    options: &ThroughputOptions,
) -> anyhow::Result<WorkloadResult> {
    let rows = options.rows.unwrap_or(workload.default_rows());
    eprintln!("== throughput, workload {} ({rows} rows)", workload.name());
    let payloads = Arc::new(sample_payloads(&env.database_url, workload, 1000).await?);
    let payload_bytes = payloads.iter().map(Vec::len).sum::<usize>() / payloads.len().max(1);

    let reseed_below = if options.drain { rows } else { rows / 2 };
    let mut table = Table {
        fixture: None,
        name: names.table(workload.name()),
        workload,
        rows,
        database_url: env.database_url.clone(),
        reseed_below,
        keys: None,
    };
    let mut keyed_tables: Vec<Table> = options
        .per_key
        .iter()
        .map(|&keys| Table {
            fixture: None,
            name: names.table(&format!("{}_keys{keys}", workload.name())),
            workload,
            rows,
            database_url: env.database_url.clone(),
            reseed_below,
            keys: Some(keys),
        })
        .collect();
    let until = if options.drain {
        Until::Drained {
            timeout: Duration::from_secs(120),
        }
    } else {
        Until::Window(options.window)
    };
    let measured = Contenders {
        env,
        names,
        workload,
        options,
        payloads: &payloads,
        until,
    }
    .measure(&mut table, &mut keyed_tables)
    .await;
    table.drop_table().await?;
    for keyed in &mut keyed_tables {
        keyed.drop_table().await?;
    }
    let Measured {
        ceiling_by_connections,
        relay_defaults,
        sweep,
        relay_best,
        naive,
        per_key,
        amqp10,
        baseline,
    } = measured?;
    let ceiling = best_of(&ceiling_by_connections);

    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let amqp10 = amqp10.map(|(ceiling_by_connections, relay)| {
        let ceiling = best_of(&ceiling_by_connections);
        Amqp10Result {
            relay_over_ceiling: ratio(relay.rate.median, ceiling.rate.median),
            ceiling_by_connections,
            ceiling,
            relay,
        }
    });
    let baseline = baseline.map(|(binary, contender)| BaselineResult {
        binary,
        relay_over_baseline: ratio(relay_defaults.rate.median, contender.rate.median),
        contender,
    });
    let per_key = per_key
        .into_iter()
        .map(|(keys, contender)| PerKeyResult {
            keys,
            over_unordered: ratio(contender.rate.median, relay_defaults.rate.median),
            contender,
        })
        .collect();
    Ok(WorkloadResult {
        workload,
        rows,
        payload_bytes,
        relay_over_ceiling: ratio(relay_defaults.rate.median, ceiling.rate.median),
        best_over_ceiling: ratio(relay_best.rate.median, ceiling.rate.median),
        relay_over_naive: ratio(relay_defaults.rate.median, naive.rate.median),
        best_over_naive: ratio(relay_best.rate.median, naive.rate.median),
        ceiling_by_connections,
        ceiling,
        relay_defaults,
        sweep,
        relay_best,
        naive,
        per_key,
        amqp10,
        baseline,
    })
}

/// Every contender's runs of one workload, before the ratios.
struct Measured {
    ceiling_by_connections: Vec<Contender>,
    relay_defaults: Contender,
    sweep: Vec<(String, f64)>,
    relay_best: Contender,
    naive: Contender,
    per_key: Vec<(u64, Contender)>,
    /// The AMQP 1.0 ceiling by connection count and the relay over AMQP 1.0.
    amqp10: Option<(Vec<Contender>, Contender)>,
    /// The other relay build's binary and its runs.
    baseline: Option<(String, Contender)>,
}

/// What the contenders of one workload run with.
struct Contenders<'a> {
    env: &'a Env,
    names: &'a RunNames,
    workload: Workload,
    options: &'a ThroughputOptions,
    payloads: &'a Arc<Vec<Vec<u8>>>,
    until: Until,
}

impl Contenders<'_> {
    async fn measure(
        &self,
        table: &mut Table,
        keyed_tables: &mut [Table],
    ) -> anyhow::Result<Measured> {
        let Self {
            env,
            names,
            workload,
            options,
            payloads,
            until,
        } = *self;
        // Rounds: each runs every ceiling connection count once and the relay at its defaults
        // once, so whatever drifts over a long run (the broker's message store, WAL, other
        // load on the machine) weighs on both sides of the ratio alike.
        let defaults = RelaySettings::defaults();
        let mut ceiling_runs = vec![Vec::new(); options.connections.len()];
        let mut default_runs = Vec::new();
        let mut per_key_runs = vec![Vec::new(); options.per_key.len()];
        let mut amqp10_ceiling_runs = vec![Vec::new(); options.amqp10_connections.len()];
        let mut amqp10_relay_runs = Vec::new();
        let mut baseline_runs = Vec::new();
        let baseline_env = options.baseline_relay.as_ref().map(|binary| Env {
            relay_bin: binary.clone(),
            ..env.clone()
        });
        let amqp10_defaults = RelaySettings::amqp10_defaults();
        let ceiling = CeilingRound {
            env,
            names,
            workload,
            payloads,
            options,
        };
        for round in 1..=options.runs {
            let protocol = BrokerProtocol::Amqp091;
            ceiling
                .run(protocol, &options.connections, &mut ceiling_runs, round)
                .await?;
            default_runs.extend(relay_runs(env, names, table, &defaults, 1, until).await?);
            if let Some(baseline_env) = &baseline_env {
                let baseline = RelaySettings {
                    label: "baseline-defaults".into(),
                    ..defaults.clone()
                };
                baseline_runs
                    .extend(relay_runs(baseline_env, names, table, &baseline, 1, until).await?);
            }
            for ((runs, keyed), &keys) in per_key_runs
                .iter_mut()
                .zip(keyed_tables.iter_mut())
                .zip(&options.per_key)
            {
                let settings = per_key_settings(keys);
                runs.extend(relay_runs(env, names, keyed, &settings, 1, until).await?);
            }
            let protocol = BrokerProtocol::Amqp10;
            let connections = &options.amqp10_connections;
            ceiling
                .run(protocol, connections, &mut amqp10_ceiling_runs, round)
                .await?;
            if !options.amqp10_connections.is_empty() {
                amqp10_relay_runs
                    .extend(relay_runs(env, names, table, &amqp10_defaults, 1, until).await?);
            }
        }
        let amqp10 = (!options.amqp10_connections.is_empty()).then(|| {
            let ceiling_by_connections: Vec<Contender> = amqp10_ceiling_runs
                .into_iter()
                .zip(&options.amqp10_connections)
                .map(|(runs, connections)| {
                    Contender::of(format!("amqp10 ceiling, {connections} conn"), runs)
                })
                .collect();
            let relay = Contender::of("amqp10 relay, defaults".into(), amqp10_relay_runs);
            (ceiling_by_connections, relay)
        });
        let per_key: Vec<(u64, Contender)> = per_key_runs
            .into_iter()
            .zip(&options.per_key)
            .map(|(runs, &keys)| {
                let label = format!("relay, per-key, {keys} keys");
                (keys, Contender::of(label, runs))
            })
            .collect();
        let ceiling_by_connections: Vec<Contender> = ceiling_runs
            .into_iter()
            .zip(&options.connections)
            .map(|(runs, connections)| Contender::of(format!("ceiling, {connections} conn"), runs))
            .collect();
        let relay_defaults = Contender::of("relay, defaults".into(), default_runs);
        let baseline = options.baseline_relay.as_ref().map(|binary| {
            let contender = Contender::of("baseline relay, defaults".into(), baseline_runs);
            (binary.display().to_string(), contender)
        });
        let mut sweep = vec![(defaults.label.clone(), relay_defaults.rate.median)];
        let mut best = (defaults.clone(), relay_defaults.rate.median);
        for settings in &options.sweep {
            let runs = relay_runs(env, names, table, settings, 1, until).await?;
            let rate = runs[0].rate;
            sweep.push((settings.label.clone(), rate));
            if rate > best.1 {
                best = (settings.clone(), rate);
            }
        }
        let relay_best = if best.0.label == defaults.label {
            Contender {
                label: "relay, best (= defaults)".into(),
                ..relay_defaults.clone()
            }
        } else {
            Contender::of(
                format!("relay, best ({})", best.0.label),
                relay_runs(env, names, table, &best.0, options.runs, until).await?,
            )
        };
        let naive = Contender::of(
            "naive".into(),
            naive_runs(env, names, table, options).await?,
        );
        Ok(Measured {
            ceiling_by_connections,
            relay_defaults,
            sweep,
            relay_best,
            naive,
            per_key,
            amqp10,
            baseline,
        })
    }
}

/// The contender with the highest median: the ceiling over the connection counts tried.
fn best_of(contenders: &[Contender]) -> Contender {
    contenders
        .iter()
        .max_by(|a, b| a.rate.median.total_cmp(&b.rate.median))
        .cloned()
        .expect("at least one connection count")
}
