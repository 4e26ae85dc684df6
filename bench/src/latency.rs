//! Latency mode: a service-like writer inserts rows at a steady rate in small transactions;
//! a consumer on a bound queue notes when each message arrives. Latency is insert commit →
//! consumer receive, per message id. The table carries the NOTIFY trigger, so idle relay
//! workers wake on commit instead of at the next poll.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use outbox_relay::broker::BrokerProtocol;
use outbox_relay::table::DeliveryMode;
use outbox_relay::table::migrate::MigrationOptions;
use outbox_relay::tools::seed::ARTICLE_TYPE;
use serde::Serialize;
use sqlx::{AssertSqlSafe, Connection as _, PgConnection};
use uuid::Uuid;

use crate::broker::Destination;
use crate::env::Env;
use crate::fixture::Fixture;
use crate::names::{RunNames, next_run};
use crate::procstat::{CpuSeconds, CpuSnapshot, peak_rss_mib};
use crate::relay_process::{RelayProcess, broker_args};
use crate::scrape::{self, StageTime};
use crate::stats::percentile;
use crate::workload::Workload;

/// How often the writer commits: a service writes its outbox row in each business transaction;
/// 10 ms groups what arrives in that time, like seed --rate.
const TICK: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Serialize)]
pub struct LatencyResult {
    pub rate: f64,
    pub seconds: f64,
    pub inserted: u64,
    pub delivered: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub relay_cpu: CpuSeconds,
    pub relay_peak_rss_mib: Option<f64>,
    /// The relay's batch stages over the run: where a row's latency goes.
    pub stages: BTreeMap<String, StageTime>,
}

type Stamps = Arc<Mutex<HashMap<Uuid, Instant>>>;

/// Inserts at `rate` rows/s for `duration`, stamping each row's commit time.
async fn write_steadily(
    database_url: String,
    table: String,
    rate: f64,
    duration: Duration,
    committed: Stamps,
) -> anyhow::Result<u64> {
    let mut conn = PgConnection::connect(&database_url).await?;
    let sql = format!(
        "INSERT INTO {table} (id, type, content, occurred_on_utc) \
         SELECT u, $2, jsonb_build_object('OrderId', u), clock_timestamp() FROM unnest($1::uuid[]) AS u"
    );
    let started = Instant::now();
    let mut inserted = 0u64;
    let mut ticker = tokio::time::interval(TICK);
    while started.elapsed() < duration {
        ticker.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        if due <= inserted {
            continue;
        }
        let ids: Vec<Uuid> = (inserted..due).map(|_| Uuid::now_v7()).collect();
        sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(&ids)
            .bind(ARTICLE_TYPE)
            .execute(&mut conn)
            .await?;
        let now = Instant::now();
        let mut stamps = committed.lock().expect("not poisoned");
        for id in ids {
            stamps.insert(id, now);
        }
        inserted = due;
    }
    Ok(inserted)
}

/// Receives from the queue, stamping each message id's arrival, until the task is aborted.
async fn receive(
    amqp_url: String,
    queue: String,
    received: Stamps,
    ready: tokio::sync::oneshot::Sender<()>,
) -> anyhow::Result<()> {
    let connection = Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel.basic_qos(1000, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let _ = ready.send(());
    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        let now = Instant::now();
        if let Some(id) = delivery
            .properties
            .message_id()
            .as_ref()
            .and_then(|id| Uuid::parse_str(id.as_str()).ok())
        {
            received.lock().expect("not poisoned").insert(id, now);
        }
        delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

pub async fn run(
    env: &Env,
    names: &RunNames,
    rate: f64,
    duration: Duration,
) -> anyhow::Result<LatencyResult> {
    eprintln!(
        "== latency: {rate} rows/s for {duration:?}, relay at its defaults, NOTIFY trigger on"
    );
    let fixture = Fixture::create(
        &env.database_url,
        &names.table("latency"),
        Workload::Article,
        0,
        DeliveryMode::Mark,
        &MigrationOptions {
            notify: true,
            ..Default::default()
        },
        None,
    )
    .await?;
    let what = format!("latency.{}", next_run());
    let destination = Destination::declare(
        &env.amqp_url,
        names.exchange(&what),
        Some(names.queue(&what)),
    )
    .await?;
    let outcome = measure(env, &fixture, &destination, rate, duration).await;
    destination.delete(&env.amqp_url).await?;
    fixture.drop_table().await?;
    outcome
}

async fn measure(
    env: &Env,
    fixture: &Fixture,
    destination: &Destination,
    rate: f64,
    duration: Duration,
) -> anyhow::Result<LatencyResult> {
    let committed: Stamps = Arc::default();
    let received: Stamps = Arc::default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let consumer = tokio::spawn(receive(
        env.amqp_url.clone(),
        destination.queue.clone().context("latency needs a queue")?,
        received.clone(),
        ready_tx,
    ));
    ready_rx.await.context("the consumer did not start")?;
    let broker = broker_args(env, destination, BrokerProtocol::Amqp091);
    let relay = RelayProcess::start(env, fixture, &broker, &[], "latency").await?;
    // Let the workers connect and go idle, so the first rows meet a waiting relay.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu_before = CpuSnapshot::take(&[relay.pid()]);
    let started = Instant::now();
    let inserted = write_steadily(
        fixture.database_url.clone(),
        fixture.table.name.quoted(),
        rate,
        duration,
        committed.clone(),
    )
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    // Wait for the stragglers, then stop.
    let deadline = Instant::now() + Duration::from_secs(30);
    while (received.lock().expect("not poisoned").len() as u64) < inserted
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let relay_cpu = cpu_before.until(&CpuSnapshot::take(&[relay.pid()]));
    let relay_peak_rss_mib = peak_rss_mib(relay.pid());
    let stages = scrape::stages(&relay.metrics().await.unwrap_or_default());
    relay.stop().await?;
    consumer.abort();

    let committed = committed.lock().expect("not poisoned");
    let received = received.lock().expect("not poisoned");
    let mut latencies: Vec<f64> = committed
        .iter()
        .filter_map(|(id, at)| {
            let arrived = received.get(id)?;
            Some(arrived.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let delivered = latencies.len() as u64;
    ensure!(
        delivered == inserted,
        "latency run: {inserted} rows inserted but only {delivered} reached the consumer"
    );
    Ok(LatencyResult {
        rate,
        seconds,
        inserted,
        delivered,
        p50_ms: percentile(&latencies, 50.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: latencies.last().copied().unwrap_or_default(),
        relay_cpu,
        relay_peak_rss_mib,
        stages,
    })
}
