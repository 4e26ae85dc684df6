//! Issue 54, point 4: the soak (see `outbox_tests::soak`). Two relay pods of one OutboxRelay,
//! on a PostgreSQL primary with a synchronous standby of the test's own and the three-node
//! RabbitMQ cluster (a quorum queue, the consumer on node 1), run by the operator on the real
//! node. The seeded rows are drained first to measure the ceiling; then half of it is offered
//! steadily while the faults come on their schedule, and every period is recorded. The run
//! fails on a leak (memory over 130 % of the baseline period's), a fault-free period under 85 %
//! of the first one's throughput, a latency p99 that does not come back after the long
//! transaction, or a lost message.
//!
//! `make test` runs 18 periods of 6 seconds; `make soak` 90 periods of a minute
//! (`SOAK_MINUTES`), in the release build. The CSV, the Markdown table and the plot are left in
//! `target/soak/` (`SOAK_DIR`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use kube::api::PostParams;
use outbox_operator::OutboxRelay;
use outbox_operator::crd::OutboxRelaySpec;
use outbox_tests::cluster::{TestCluster, create_url_secret_as_is, relay_spec};
use outbox_tests::rabbit_cluster::{self, Lease, all_nodes_for_pods, node_url};
use outbox_tests::soak::arrivals::Arrivals;
use outbox_tests::soak::producer::Producer;
use outbox_tests::soak::sampler::Sampler;
use outbox_tests::soak::schedule::{Fault, Schedule};
use outbox_tests::soak::verdict::{FaultSpan, verdict};
use outbox_tests::soak::{Settings, plot, record};
use outbox_tests::standby::{Server, StandbyPair, Stop};
use outbox_tests::{db, unique, wait};
use serde_json::json;
use sqlx::PgConnection;

const DATABASE_SECRET: &str = "soak-db";
const BROKER_SECRET: &str = "soak-amqp";
const RELAY: &str = "soak";
/// Relay pods, fixed: the soak measures them, not the autoscaler.
const REPLICAS: i32 = 2;
/// The broker node the soak restarts: never node 1, where the consumer reads.
const RESTARTED_NODE: usize = 2;
/// Longest wait for the seeded rows to arrive (the pods start first) and for the last ones.
const DRAIN: Duration = Duration::from_secs(300);

fn spec(table: &str) -> OutboxRelaySpec {
    let mut spec = serde_json::to_value(relay_spec(table, table)).expect("a spec");
    spec["replicas"] = json!(REPLICAS);
    spec["database"]["urlSecretRef"]["name"] = json!(DATABASE_SECRET);
    spec["broker"]["urlSecretRef"]["name"] = json!(BROKER_SECRET);
    serde_json::from_value(spec).expect("the soak's spec deserializes")
}

/// What the faults act on.
struct Targets<'a> {
    cluster: &'a TestCluster,
    pair: &'a StandbyPair,
    lease: &'a Lease,
    schedule: &'a Schedule,
    started: Instant,
}

impl Targets<'_> {
    fn clock(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Waits for period `at`, carries `fault` out and records when it began and ended.
    async fn scheduled(&self, at: u32, fault: Fault, spans: &Mutex<Vec<FaultSpan>>) {
        let due = self.started + Duration::from_secs_f64(self.schedule.start_of(at));
        tokio::time::sleep_until(due.into()).await;
        let start_s = self.clock();
        let index = {
            let mut spans = spans.lock().unwrap();
            spans.push(FaultSpan {
                fault,
                start_s,
                end_s: start_s,
            });
            spans.len() - 1
        };
        self.inflict(fault).await;
        let end_s = self.clock();
        spans.lock().unwrap()[index].end_s = end_s;
        eprintln!("soak: {} from {start_s:.1} s to {end_s:.1} s", fault.name());
    }

    /// Carries `fault` out; returns once it is over (the pod back, the node or server up, the
    /// transaction ended).
    async fn inflict(&self, fault: Fault) {
        match fault {
            Fault::RelayPodKilled => {
                let pods = self.cluster.running_pods(RELAY);
                let pod = pods.first().expect("a relay pod runs");
                self.cluster.signal_pod(pod, "SIGKILL").await;
                tokio::time::sleep(Duration::from_secs(2)).await;
                let back = wait::holds("both relay pods run again", DRAIN, || async {
                    self.cluster.running_pods(RELAY).len() == REPLICAS as usize
                })
                .await;
                assert!(back, "{}", self.cluster.operator.log_text());
            }
            Fault::BrokerNodeRestarted => {
                rabbit_cluster::node("stop", RESTARTED_NODE).await;
                self.lease.bring_back().await;
            }
            Fault::PostgresRestarted => {
                self.pair.stop(Server::Primary, Stop::Fast).await;
                self.pair.start_server(Server::Primary).await;
            }
            Fault::LongTransaction { periods } => {
                let mut conn = db::connect_to(&self.pair.primary_url()).await;
                db::exec(&mut conn, "BEGIN").await;
                // A transaction id of its own: vacuum keeps every row version newer than it.
                db::scalar_i64(&mut conn, "SELECT txid_current()").await;
                tokio::time::sleep(self.schedule.period * periods).await;
                // A restart of the server meanwhile would have ended it already.
                let _ = sqlx::raw_sql("ROLLBACK").execute(&mut conn).await;
            }
        }
    }
}

async fn wait_for_every_id(
    arrivals: &Arrivals,
    conn: &mut PgConnection,
    table: &outbox_relay::table::OutboxTable,
) -> usize {
    let ids = db::all_ids(conn, table).await;
    wait::holds(
        "every id reached the consumer",
        Duration::from_secs(60),
        || async { ids.iter().all(|id| arrivals.has(id)) },
    )
    .await;
    ids.iter().filter(|id| !arrivals.has(id)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_soak_through_the_operators_pods_loses_nothing_and_leaks_nothing() {
    let settings = Settings::from_env().unwrap_or_else(|e| panic!("{e}"));
    let schedule = &settings.schedule;
    let pair = StandbyPair::start().await;
    let name = unique("soak");
    let table = db::table(&name);
    let conn = db::seeded_table_in(&pair.primary_url(), &table, settings.ceiling_rows).await;
    let lease = Lease::take().await;
    rabbit_cluster::declare(&node_url(1), &name, rabbit_cluster::quorum(&[])).await;
    let arrivals = Arc::new(Arrivals::start(node_url(1), format!("{name}_q")));

    let cluster = TestCluster::start().await;
    let (client, namespace) = (&cluster.client, &cluster.namespace);
    create_url_secret_as_is(
        client,
        namespace,
        DATABASE_SECRET,
        &pair.multi_host_url_for_pods(),
    )
    .await;
    create_url_secret_as_is(client, namespace, BROKER_SECRET, &all_nodes_for_pods()).await;
    cluster
        .relays()
        .create(
            &PostParams::default(),
            &OutboxRelay::new(RELAY, spec(&name)),
        )
        .await
        .expect("the OutboxRelay is created");

    // The ceiling: the seeded rows, drained by the two pods.
    let seeded = settings.ceiling_rows as usize;
    assert!(
        wait::holds("the seeded rows arrive", DRAIN, || async {
            arrivals.distinct() >= seeded
        })
        .await,
        "{} of {seeded} seeded rows arrived\n{}",
        arrivals.distinct(),
        cluster.operator.log_text()
    );
    let span = arrivals
        .span()
        .expect("rows arrived")
        .as_secs_f64()
        .max(0.1);
    let ceiling = seeded as f64 / span;
    let rate = settings.offered_rate(ceiling);
    eprintln!(
        "soak: ceiling {ceiling:.0} msg/s ({seeded} rows in {span:.1} s); offering {rate:.0} \
         rows/s for {} periods of {:?}",
        schedule.periods, schedule.period
    );

    arrivals.take_period();
    let producer = Producer::start(pair.primary_url(), table.clone(), rate);
    let started = Instant::now();
    let spans: Arc<Mutex<Vec<FaultSpan>>> = Arc::default();
    let sampler = Sampler {
        period: schedule.period,
        periods: schedule.periods,
        database_url: pair.primary_url(),
        table: table.clone(),
        arrivals: arrivals.clone(),
        inserted: producer.inserted_counter(),
        pods: kube::Api::namespaced(client.clone(), namespace),
        relay: RELAY.to_string(),
        cgroup_root: cluster.node.cgroup_root(),
        spans: spans.clone(),
    }
    .start(started);

    let targets = Targets {
        cluster: &cluster,
        pair: &pair,
        lease: &lease,
        schedule,
        started,
    };
    // Each fault at its own time, side by side: a slow one (a RabbitMQ node takes half a
    // minute to stop and rejoin) never delays the next.
    join_all(
        schedule
            .faults
            .iter()
            .map(|&(at, fault)| targets.scheduled(at, fault, &spans)),
    )
    .await;
    let periods = sampler.await.expect("the sampler ends");
    let failed_inserts = producer.failures();
    let offered = producer.stop().await;

    // Everything inserted reaches the consumer.
    let drained = db::wait_until_drained_in(&pair.primary_url(), &table, DRAIN).await;
    let mut conn_now = db::connect_to(&pair.primary_url()).await;
    let lost = wait_for_every_id(&arrivals, &mut conn_now, &table).await;
    arrivals.stop();
    let spans = spans.lock().unwrap().clone();

    record::write(&settings.dir, &periods).expect("the soak's records are written");
    let svg = settings.dir.join("soak.svg");
    let title = format!(
        "soak: {} periods of {:?}, {rate:.0} rows/s offered",
        schedule.periods, schedule.period
    );
    plot::draw(&svg, &title, &periods, &spans).expect("the soak's plot is drawn");
    eprintln!(
        "{}\nsoak: {offered} rows offered after the ceiling ({failed_inserts} inserts failed and \
         were retried), {} repeats, {lost} lost; records and plot in {}",
        record::markdown(&periods),
        arrivals.repeats(),
        settings.dir.display()
    );

    let failed = verdict(schedule, &periods, &spans, lost);
    assert!(
        drained,
        "rows left pending {DRAIN:?} after the load stopped"
    );
    assert!(failed.is_empty(), "the soak failed:\n{}", failed.join("\n"));
    drop(conn);
    cluster.shutdown().await;
    lease.restore().await;
}
