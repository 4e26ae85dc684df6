//! The autoscaling loop end to end on the real control plane: kube-apiserver, etcd and
//! kube-controller-manager, the chart installed with helm, its operator pod and the relay pods
//! on the real node (kube-scheduler, kubelet, containerd, the project's image), the real
//! PostgreSQL and RabbitMQ. Intervals are short so a scenario takes a minute or less; assertions are about
//! what happens and in which order, with generous timeouts for a loaded machine. The one timed
//! claim is the issue's: the spike's replicas within one polling interval of the report that
//! showed it.
//!
//! Needs the relay binary built alongside (`cargo build --workspace`). The spike run is drawn
//! to `target/e2e/spike.svg`; `docs/img/autoscaling-spike.svg` is a copy of one such run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use lapin::ExchangeKind;
use outbox_operator::OutboxRelay;
use outbox_operator::crd::ScalingSpec;
use outbox_relay::table::OutboxTable;
use outbox_tests::cluster::{TestCluster, relay_spec};
use outbox_tests::scaling_recorder::{Recording, ScalingRecorder, Subject};
use outbox_tests::{broker, db, process, timeline, unique};
use serde_json::json;

/// The budget of a scenario's setting-up steps, which are preconditions rather than what is
/// measured: minutes, so a machine busy with other test binaries does not fail them.
const SETUP_BUDGET: Duration = Duration::from_secs(240);

/// The scenarios run one at a time even when the harness runs tests in parallel: each starts
/// several relay processes, and two of them at once on two cores would measure the machine
/// rather than the operator.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One scenario's table, exchange (same name) and consumer, plus the cluster.
struct Scenario {
    /// Held until the scenario is dropped.
    _turn: tokio::sync::MutexGuard<'static, ()>,
    /// When this scenario's turn began, for the runtime it prints.
    started: Instant,
    cluster: TestCluster,
    /// Table and exchange name (underscores).
    table_name: String,
    /// OutboxRelay and Deployment name (a DNS label).
    relay: String,
    table: OutboxTable,
    consumer: broker::Consumer,
}

impl Scenario {
    async fn start(prefix: &str, rows: u64) -> Self {
        let turn = ONE_AT_A_TIME.lock().await;
        let table_name = unique(&format!("e2e_{prefix}"));
        let table = db::table(&table_name);
        db::seeded_table(&table, rows).await;
        // The exchange must exist before a relay publishes to it.
        let consumer = broker::consume(&table_name, ExchangeKind::Fanout, "").await;
        let cluster = TestCluster::start().await;
        Self {
            _turn: turn,
            started: Instant::now(),
            cluster,
            relay: table_name.replace('_', "-"),
            table_name,
            table,
            consumer,
        }
    }

    fn running(&self) -> usize {
        self.running_pods().len()
    }

    fn running_pods(&self) -> Vec<String> {
        self.cluster.running_pods(&self.relay)
    }

    /// How often the kubelet restarted the pod's container.
    fn restarts_of(&self, pod: &str) -> i32 {
        self.cluster
            .pods
            .get(pod)
            .and_then(|p| p.status.clone()?.container_statuses?.first().cloned())
            .map_or(0, |c| c.restart_count)
    }

    async fn relay(&self) -> OutboxRelay {
        self.cluster
            .relays()
            .get(&self.relay)
            .await
            .expect("the relay exists")
    }

    async fn pending(&self) -> i64 {
        db::pending(&mut db::connect().await, &self.table).await
    }

    /// Waits until the table has no pending row and the consumer saw every id.
    async fn assert_drained_and_delivered(&self, timeout: Duration) {
        let drained = outbox_tests::wait::holds("the table is drained", timeout, || async {
            self.pending().await == 0
        })
        .await;
        assert!(drained, "{} rows still pending", self.pending().await);
        let ids = db::all_ids(&mut db::connect().await, &self.table).await;
        let arrived =
            outbox_tests::wait::holds("every message arrived", Duration::from_secs(60), || async {
                self.consumer.distinct() >= ids.len()
            })
            .await;
        let missing = ids.iter().filter(|id| !self.consumer.has(id)).count();
        assert!(
            arrived && missing == 0,
            "{missing} of {} ids never reached the consumer",
            ids.len()
        );
    }

    /// Starts recording reports, status and replicas on the cluster's clock.
    fn record(&self) -> ScalingRecorder {
        let origin = self.cluster.origin();
        ScalingRecorder::start(Subject {
            relays: self.cluster.relays(),
            name: self.relay.clone(),
            report_name: self.cluster.report_name(&self.relay),
            table: self.table.clone(),
            clock: Arc::new(move |at| (at - origin).as_seconds_f64()),
        })
    }

    fn now(&self) -> f64 {
        self.cluster.clock()
    }

    async fn replicas(&self) -> Option<i32> {
        self.cluster.deployment_replicas(&self.relay).await
    }

    async fn event_reasons(&self) -> Vec<String> {
        self.cluster
            .events(&self.relay)
            .await
            .into_iter()
            .map(|(reason, _)| reason)
            .collect()
    }

    /// Every `spec.replicas` the Deployment had, with when it was written.
    fn replicas_history(&self) -> Vec<(f64, i32)> {
        self.cluster.replicas_history(&self.relay)
    }

    /// Reasons the relay's condition `kind` had in every status written at or after `since`,
    /// from the server's record (a status may hold for a fraction of a second).
    fn condition_reasons_since(&self, since: f64, kind: &str) -> Vec<String> {
        self.cluster
            .versions_of("outboxrelays", &self.relay)
            .into_iter()
            .filter(|(at, _)| *at >= since)
            .filter_map(|(_, relay)| {
                let conditions = relay["status"]["conditions"].as_array()?.clone();
                conditions
                    .iter()
                    .find(|c| c["type"] == kind)
                    .and_then(|c| c["reason"].as_str().map(String::from))
            })
            .collect()
    }

    /// When the Deployment was first written with `replicas` at or after `since`, from the
    /// server's record: exact, and never missing a short-lived value as polling could.
    fn replicas_written_since(&self, since: f64, replicas: i32) -> Option<f64> {
        self.replicas_history()
            .into_iter()
            .find(|(at, r)| *at >= since && *r == replicas)
            .map(|(at, _)| at)
    }

    async fn finish(self) {
        let name = self.relay.clone();
        let started = self.started;
        self.cluster.shutdown().await;
        self.consumer.close().await;
        eprintln!("{name} took {:?}", started.elapsed());
    }
}

/// Polls `check` until it holds, failing with `what` after `timeout`.
async fn wait_until<F, Fut>(what: &str, timeout: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    assert!(
        outbox_tests::wait::holds(what, timeout, check).await,
        "timed out after {timeout:?} waiting until {what}"
    );
}

/// A scaling block: the test's values over the defaults.
fn scaling(overrides: serde_json::Value) -> ScalingSpec {
    serde_json::from_value(overrides).expect("the scaling block deserializes")
}

/// Polls `probe` every 100 ms until it yields a value, failing with `what` after `timeout`.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn replica_counts(history: &[(f64, i32)]) -> Vec<i32> {
    history.iter().map(|(_, replicas)| *replicas).collect()
}

fn condition(relay: &OutboxRelay, kind: &str) -> Option<(String, String)> {
    relay
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_mode_runs_spec_replicas_relays_and_drains_the_table() {
    let scenario = Scenario::start("manual", 20_000).await;
    let mut spec = relay_spec(&scenario.table_name, &scenario.table_name);
    spec.replicas = 2;
    scenario.cluster.create_relay(&scenario.relay, spec).await;

    wait_until(
        "two relay processes run",
        Duration::from_secs(60),
        || async { scenario.running() == 2 },
    )
    .await;
    wait_until(
        "the status shows two ready replicas",
        Duration::from_secs(60),
        || async {
            let status = scenario.relay().await.status.unwrap_or_default();
            status.replicas == Some(2) && status.ready_replicas == Some(2)
        },
    )
    .await;
    scenario
        .assert_drained_and_delivered(Duration::from_secs(180))
        .await;
    let relay = scenario.relay().await;
    assert_eq!(
        condition(&relay, "Ready").map(|c| c.0).as_deref(),
        Some("True"),
        "{:?}",
        relay.status
    );

    // kubectl scale obr/NAME --replicas=1, as a merge patch of spec.replicas.
    scenario
        .cluster
        .relays()
        .patch(
            &scenario.relay,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    wait_until(
        "one relay process is left",
        Duration::from_secs(60),
        || async { scenario.running() == 1 },
    )
    .await;
    wait_until(
        "the status shows one replica of the new generation",
        Duration::from_secs(60),
        || async {
            let relay = scenario.relay().await;
            let status = relay.status.clone().unwrap_or_default();
            status.replicas == Some(1) && status.observed_generation == relay.metadata.generation
        },
    )
    .await;
    let reasons: Vec<String> = scenario
        .cluster
        .events(&scenario.relay)
        .await
        .into_iter()
        .map(|e| e.0)
        .collect();
    assert!(
        reasons.iter().any(|r| r == "DeploymentCreated"),
        "events: {reasons:?}"
    );
    scenario.finish().await;
}

/// Rows one relay pod is expected to handle in the spike scenario.
const SPIKE_TARGET: i64 = 50_000;
const SPIKE_ROWS: u64 = 200_000;
const SPIKE_POLLING: Duration = Duration::from_secs(2);
const SPIKE_DOWN_WINDOW: f64 = 20.0;
/// Time a reconcile itself may take on a loaded two-core machine (connect, read the reports,
/// apply), on top of the polling interval the issue allows.
const RECONCILE_SLACK: Duration = Duration::from_secs(2);
/// How much later than the operator's last decision on a value a status sample may still show
/// it: the status keeps a value until the next poll writes another, and is written at the end
/// of a reconcile, read by a recorder that looks every 250 ms.
fn sample_latency(polling: Duration) -> f64 {
    polling.as_secs_f64() + 1.5
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spike_scales_up_within_one_polling_interval_drains_and_scales_down_after_the_window() {
    let scenario = Scenario::start("spike", 0).await;
    let mut spec = relay_spec(&scenario.table_name, &scenario.table_name);
    spec.scaling = Some(scaling(json!({
        "minReplicas": 1,
        "maxReplicas": 8,
        "targetBacklogPerReplica": SPIKE_TARGET,
        "pollingInterval": "2s",
        "scaleDown": {
            "stabilizationWindowSeconds": SPIKE_DOWN_WINDOW as i32,
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
        },
        "fallback": {"replicas": 1, "staleAfter": "5s"},
    })));
    scenario.cluster.create_relay(&scenario.relay, spec).await;
    let recorder = scenario.record();

    // Setting up (the migration, the first pod, its first report) is not what this scenario
    // measures: its budget is generous, so a busy machine or test runner only makes it slower.
    // The clock of each measured reaction starts from the event it reacts to.
    wait_until("the first relay pod runs", SETUP_BUDGET, || async {
        scenario.running() == 1
    })
    .await;
    wait_until(
        "the idle relay reports an empty backlog",
        SETUP_BUDGET,
        || async { !recorder.snapshot().reports.is_empty() },
    )
    .await;
    assert_eq!(scenario.replicas().await, Some(1));

    let spike_at = scenario.now();
    let table = scenario.table.clone();
    let mut conn = db::connect().await;
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, SPIKE_ROWS, 50, |_| {})
        .await
        .expect("the spike is loaded");

    let first_spike = wait_for(
        "a report that shows the spike",
        Duration::from_secs(60),
        || async {
            recorder
                .snapshot()
                .reports
                .into_iter()
                .find(|r| r.at >= spike_at && r.backlog > SPIKE_TARGET)
        },
    )
    .await;
    // What the target asks for, from the backlog the operator itself saw (its status): the
    // relay drains thousands of rows a second, so the report the operator reads at its next
    // poll may already ask for one replica fewer than the first report that showed the spike.
    let seen = wait_for(
        "the operator's status to show the spike",
        Duration::from_secs(60),
        || async {
            recorder
                .snapshot()
                .status
                .into_iter()
                .filter(|s| s.at >= spike_at)
                .find_map(|s| s.backlog.filter(|b| *b > SPIKE_TARGET))
        },
    )
    .await;
    let asked = (seen as f64 / SPIKE_TARGET as f64).ceil() as i32;
    let asked = asked.clamp(1, 8);
    assert!(asked > 1, "the spike must ask for more than one pod");

    let scaled_at = wait_for(
        "the Deployment to ask for the replicas the target asks for",
        Duration::from_secs(60),
        || async { scenario.replicas_written_since(spike_at, asked) },
    )
    .await;
    let reaction = scaled_at - first_spike.at;
    eprintln!(
        "spike: report of {} rows at {:.1}s, {asked} replicas {reaction:.2}s later",
        first_spike.backlog, first_spike.at
    );
    assert!(
        reaction <= (SPIKE_POLLING + RECONCILE_SLACK).as_secs_f64(),
        "{asked} replicas came {reaction:.2}s after the report that showed the spike; the \
         polling interval is {SPIKE_POLLING:?}"
    );
    wait_until(
        "the kubelet runs the new replicas",
        Duration::from_secs(60),
        || async { scenario.running() == asked as usize },
    )
    .await;

    scenario
        .assert_drained_and_delivered(Duration::from_secs(300))
        .await;
    wait_until(
        "the relay is back at minReplicas",
        Duration::from_secs(SPIKE_DOWN_WINDOW as u64 + 120),
        || async { scenario.replicas().await == Some(1) },
    )
    .await;
    let recording = recorder.stop();
    let history = scenario.replicas_history();

    let peak = history.iter().map(|r| r.1).max().unwrap();
    assert_eq!(
        peak, asked,
        "the relay never went beyond what the target asked for"
    );
    // The last reconcile that still saw a backlog asking for the peak, as its status shows it
    // (the operator may skip reports between two polls, so the reports cannot tell): the
    // highest recommendation over the window wins, so scale-down waits a whole window.
    let last_high = recording
        .status
        .iter()
        .filter(|s| {
            s.backlog
                .is_some_and(|b| b > SPIKE_TARGET * i64::from(asked - 1))
        })
        .map(|s| s.at)
        .fold(f64::MIN, f64::max);
    let first_down = history
        .iter()
        .find(|(at, r)| *at > scaled_at && *r < asked)
        .map(|(at, _)| *at)
        .expect("the relay scaled down");
    eprintln!(
        "spike: last status asking for {asked} at {last_high:.1}s, first scale-down at {first_down:.1}s"
    );
    assert!(
        first_down - last_high >= SPIKE_DOWN_WINDOW - sample_latency(SPIKE_POLLING),
        "scaled down {:.1}s after the last high report, inside the {SPIKE_DOWN_WINDOW}s window",
        first_down - last_high
    );
    let reasons = scenario.event_reasons().await;
    for reason in ["ScaledUp", "ScaledDown"] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "no {reason} event: {reasons:?}"
        );
    }

    plot(
        &scenario,
        &recording,
        "spike.svg",
        "200,000-row spike: replicas follow the backlog",
    );
    scenario.finish().await;
}

/// Draws the run under target/e2e/.
fn plot(scenario: &Scenario, recording: &Recording, file: &str, title: &str) {
    let path = process::target_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .join("e2e")
        .join(file);
    let pods: Vec<_> = scenario
        .cluster
        .pod_timeline()
        .into_iter()
        .filter(|s| s.relay == scenario.relay)
        .collect();
    let replicas = scenario.replicas_history();
    timeline::draw(&path, title, &replicas, &pods, &recording.backlog).expect("the plot is drawn");
    eprintln!("plot: {}", path.display());
}

const ZERO_COOLDOWN: f64 = 10.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_on_an_idle_table_start_a_pod_from_zero_and_it_returns_to_zero_after_the_cooldown() {
    let scenario = Scenario::start("zero", 0).await;
    let mut spec = relay_spec(&scenario.table_name, &scenario.table_name);
    spec.scaling = Some(scaling(json!({
        "minReplicas": 0,
        "maxReplicas": 3,
        "targetBacklogPerReplica": 10_000,
        "activationBacklog": 0,
        "pollingInterval": "1s",
        "cooldownPeriod": format!("{}s", ZERO_COOLDOWN as u64),
        "scaleDown": {"stabilizationWindowSeconds": 5},
        "fallback": {"replicas": 1, "staleAfter": "5s"},
    })));
    scenario.cluster.create_relay(&scenario.relay, spec).await;
    let recorder = scenario.record();

    wait_until(
        "the Deployment exists with zero replicas",
        Duration::from_secs(60),
        || async { scenario.replicas().await == Some(0) },
    )
    .await;
    // An idle table keeps it at zero: no process starts.
    for _ in 0..30 {
        assert_eq!(scenario.running(), 0, "a relay started on an empty table");
        assert_eq!(scenario.replicas().await, Some(0));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let arrival = scenario.now();
    let mut conn = db::connect().await;
    outbox_relay::tools::seed::copy_rows(&mut conn, &scenario.table, 1_000, 50, |_| {})
        .await
        .expect("rows arrive");
    let woke_at = wait_for("a pod to start", Duration::from_secs(60), || async {
        (scenario.running() == 1).then(|| scenario.now())
    })
    .await;
    eprintln!("zero: rows at {arrival:.1}s, pod running at {woke_at:.1}s");
    scenario
        .assert_drained_and_delivered(Duration::from_secs(120))
        .await;

    let zero_at = wait_for(
        "the relay to return to zero",
        Duration::from_secs(ZERO_COOLDOWN as u64 + 90),
        || async { scenario.replicas_written_since(woke_at, 0) },
    )
    .await;
    wait_until(
        "the relay process exits",
        Duration::from_secs(30),
        || async { scenario.running() == 0 },
    )
    .await;
    let recording = recorder.stop();
    // The last reconcile that saw a backlog, as its status shows it: the cooldown runs from
    // there (the operator counts itself while no pod runs, and may skip reports).
    let last_active = recording
        .status
        .iter()
        .filter(|s| s.backlog.is_some_and(|b| b > 0))
        .map(|s| s.at)
        .fold(arrival, f64::max);
    eprintln!("zero: last backlog seen at {last_active:.1}s, back at zero at {zero_at:.1}s");
    assert!(
        zero_at - last_active >= ZERO_COOLDOWN - sample_latency(Duration::from_secs(1)),
        "back to zero {:.1}s after the last backlog, before the {ZERO_COOLDOWN}s cooldown",
        zero_at - last_active
    );
    assert_eq!(
        replica_counts(&scenario.replicas_history()),
        vec![0, 1, 0],
        "created at zero, one pod for the rows, zero again"
    );
    let reasons = scenario.event_reasons().await;
    for reason in ["ScaledUp", "ScaledDown"] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "no {reason} event: {reasons:?}"
        );
    }
    scenario.finish().await;
}

const FALLBACK_REPLICAS: i32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_relay_whose_reports_go_stale_leads_to_fallback_replicas_not_zero() {
    let scenario = Scenario::start("stale", 5_000).await;
    let mut spec = relay_spec(&scenario.table_name, &scenario.table_name);
    // minReplicas 0, so zero is a choice the operator could make; the long cooldown means a
    // fresh report would never ask for it during this test, so a zero could only come from
    // mistaking silence for an empty table.
    spec.scaling = Some(scaling(json!({
        "minReplicas": 0,
        "maxReplicas": 4,
        "targetBacklogPerReplica": 10_000,
        "pollingInterval": "1s",
        "cooldownPeriod": "300s",
        "scaleDown": {"stabilizationWindowSeconds": 5},
        "fallback": {"replicas": FALLBACK_REPLICAS, "staleAfter": "3s"},
    })));
    scenario.cluster.create_relay(&scenario.relay, spec).await;

    wait_until("one relay runs", Duration::from_secs(60), || async {
        scenario.running() == 1
    })
    .await;
    scenario
        .assert_drained_and_delivered(Duration::from_secs(120))
        .await;
    wait_until(
        "the relay reports an empty backlog and runs one pod",
        Duration::from_secs(60),
        || async {
            let status = scenario.relay().await.status.unwrap_or_default();
            status.backlog == Some(0) && scenario.replicas().await == Some(1)
        },
    )
    .await;

    // Frozen, not killed: a killed relay is restarted by the kubelet at once and reports again
    // before the reports could go stale. A hung one stays silent until its liveness probe
    // has failed three times (30 s), longer than `staleAfter`.
    let pod = scenario.cluster.running_pods(&scenario.relay)[0].clone();
    let frozen_at = scenario.now();
    scenario.cluster.freeze_pod(&pod).await;
    // From the server's record, not by polling: the fallback may last only until the
    // replacement pod's first report, a fraction of a second.
    let fallback_at = wait_for("the fallback replicas", Duration::from_secs(60), || async {
        scenario.replicas_written_since(frozen_at, FALLBACK_REPLICAS)
    })
    .await;
    eprintln!("stale: {pod} frozen at {frozen_at:.1}s, fallback at {fallback_at:.1}s");
    wait_until(
        "the status to say the reports are stale",
        Duration::from_secs(30),
        || async {
            scenario
                .condition_reasons_since(frozen_at, "ScalingActive")
                .iter()
                .any(|reason| reason == "StaleReports")
        },
    )
    .await;
    // The replacement pod reports again and the relay settles at one pod, never at zero. The
    // ReplicaSet picks which pod goes at the scale-down (the hung one once it is not ready);
    // if it keeps the hung one, the kubelet's liveness probe restarts it. Either way the pod
    // left is not the frozen process.
    wait_until(
        "the fresh reports bring the relay back to one pod, not the frozen process",
        Duration::from_secs(120),
        || async {
            let running = scenario.running_pods();
            let frozen_left = running.contains(&pod) && scenario.restarts_of(&pod) == 0;
            scenario.replicas().await == Some(1) && running.len() == 1 && !frozen_left
        },
    )
    .await;
    let history = scenario.replicas_history();
    eprintln!("stale: replicas history {history:?}");
    let since_freeze: Vec<i32> = history
        .into_iter()
        .filter(|(at, _)| *at >= frozen_at)
        .map(|(_, replicas)| replicas)
        .collect();
    assert!(
        since_freeze.first() == Some(&FALLBACK_REPLICAS)
            && since_freeze.last() == Some(&1)
            && !since_freeze.contains(&0),
        "after the freeze: the fallback first, one pod once reports are fresh again, never \
         zero: {since_freeze:?}"
    );
    scenario.finish().await;
}

/// Rows held by an open transaction: pending (the backlog counts them) but skipped by the
/// relays' `FOR UPDATE SKIP LOCKED`, so the backlog stays where the test puts it.
const PINNED_ROWS: u64 = 2_000;
const STEADY_TARGET: i64 = 1_000;
const STEADY_RATE: f64 = 100.0;
const STEADY_SECONDS: f64 = 40.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_load_inside_the_tolerance_never_changes_the_replicas() {
    let scenario = Scenario::start("steady", PINNED_ROWS).await;
    let mut pin = db::connect().await;
    db::exec(&mut pin, "BEGIN").await;
    let pinned = db::scalar_i64(
        &mut pin,
        &format!(
            "SELECT count(*) FROM (SELECT 1 FROM {} FOR UPDATE) AS locked",
            scenario.table.name.quoted()
        ),
    )
    .await;
    assert_eq!(pinned, PINNED_ROWS as i64);

    // Backlog = 2,000 pinned rows + what the inflow adds before the relays take it: slightly
    // above 2 × target, so ceil() alone would flap between 2 and 3 pods; the 10 % tolerance
    // keeps 2.
    let mut spec = relay_spec(&scenario.table_name, &scenario.table_name);
    spec.scaling = Some(scaling(json!({
        "minReplicas": 1,
        "maxReplicas": 6,
        "targetBacklogPerReplica": STEADY_TARGET,
        "tolerance": 0.1,
        "pollingInterval": "1s",
        "scaleDown": {"stabilizationWindowSeconds": 3},
        "fallback": {"replicas": 2, "staleAfter": "5s"},
    })));
    scenario.cluster.create_relay(&scenario.relay, spec).await;
    let recorder = scenario.record();
    wait_until(
        "two relays run and report",
        Duration::from_secs(60),
        || async {
            scenario.running() == 2
                && scenario
                    .relay()
                    .await
                    .status
                    .unwrap_or_default()
                    .backlog
                    .is_some()
        },
    )
    .await;

    let load_from = scenario.now();
    let rows = (STEADY_RATE * STEADY_SECONDS) as u64;
    let table = scenario.table.clone();
    let inflow = tokio::spawn(async move {
        let mut conn = db::connect().await;
        outbox_relay::tools::seed::insert_at_rate(&mut conn, &table, STEADY_RATE, rows, 50, |_| {})
            .await
            .expect("steady inflow")
    });
    assert_eq!(inflow.await.unwrap(), rows);
    let load_until = scenario.now();
    let during = recorder.snapshot();

    let reports: Vec<i64> = during
        .reports
        .iter()
        .filter(|r| (load_from..load_until).contains(&r.at))
        .map(|r| r.backlog)
        .collect();
    assert!(
        reports.len() >= 10,
        "too few reports during the load: {reports:?}"
    );
    assert!(
        reports.iter().all(|b| *b <= 2 * STEADY_TARGET * 11 / 10),
        "the load left the tolerance band, the test proves nothing: {reports:?}"
    );
    let history = scenario.replicas_history();
    assert_eq!(
        history.last().map(|h| h.1),
        Some(2),
        "two pods for a backlog of 2 × target"
    );
    let changes: Vec<_> = history.iter().filter(|(at, _)| *at >= load_from).collect();
    assert!(
        changes.is_empty(),
        "the replicas changed under steady load: {history:?}"
    );
    let pods = scenario.cluster.pod_timeline();
    let node_saw: Vec<usize> = pods
        .iter()
        .filter(|s| s.relay == scenario.relay && s.at >= load_from)
        .map(|s| s.running)
        .collect();
    assert!(
        node_saw.iter().all(|r| *r == 2),
        "the kubelet ran {node_saw:?} pods under steady load"
    );
    let above = reports.iter().filter(|b| **b > 2 * STEADY_TARGET).count();
    eprintln!(
        "steady: {} reports, backlog {}..{}, {above} above 2 × target",
        reports.len(),
        reports.iter().min().unwrap(),
        reports.iter().max().unwrap()
    );

    // Release the pinned rows: everything is relayed.
    db::exec(&mut pin, "ROLLBACK").await;
    scenario
        .assert_drained_and_delivered(Duration::from_secs(120))
        .await;
    recorder.stop();
    scenario.finish().await;
}
