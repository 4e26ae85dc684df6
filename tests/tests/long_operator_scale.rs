//! The operator with many OutboxRelays on the real API server (issue 54, point 3): their tables
//! spread over ten databases, the relays suspended so no pod runs (the operator still migrates
//! each table and counts its backlog), the operator as a process with the chart's RBAC. Checked:
//! every relay becomes Ready, the operator never has more than two sessions on one database,
//! the API server never asked it to back off (429), and a change that touches every relay (each
//! database Secret rotated) reconciles them all again under the same bound; no request was
//! answered 429 and no more reconciles ran at once than the concurrency bound allows. What it
//! took (time, operator RSS, reconcile p99, API requests per second, the queue of relays waiting
//! for their reconcile after the rotation and how it drained) is printed, not asserted: `make
//! scale` runs the same with 1,000 relays (OPERATOR_SCALE_RELAYS) and the book carries its
//! figures.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use outbox_operator::OutboxRelay;
use outbox_operator::reconcile::driver::context::DEFAULT_RECONCILE_CONCURRENCY;
use outbox_relay::table::OutboxTable;
use outbox_relay::table::ident::TableName;
use outbox_tests::cluster::{
    BROKER_SECRET, OPERATOR_NAME, OperatorProcess, create_url_secret, install_chart,
    ready_condition, relay_spec, throttled,
};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::db::PrivateDatabase;
use outbox_tests::{amqp_url, http, unique};
use serde_json::json;
use sqlx::{Connection, PgConnection};

const DATABASES: usize = 10;
/// The operator's bound (its default, `--sessions-per-database`).
const SESSIONS_PER_DATABASE: i64 = 2;

fn relay_count() -> usize {
    std::env::var("OPERATOR_SCALE_RELAYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100)
}

/// The most sessions of the operator seen at once on each database, sampled until stopped.
async fn watch_sessions(databases: Vec<String>, stop: Arc<AtomicBool>) -> BTreeMap<String, i64> {
    let mut conn = PgConnection::connect(&outbox_tests::database_url())
        .await
        .unwrap();
    let mut most: BTreeMap<String, i64> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let counts: Vec<(String, i64)> = sqlx::query_as(
            "SELECT datname::text, count(*) FROM pg_stat_activity \
             WHERE application_name = 'outbox-relay' AND datname = ANY($1) GROUP BY datname",
        )
        .bind(&databases)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        for (database, count) in counts {
            let seen = most.entry(database).or_default();
            *seen = (*seen).max(count);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    most
}

/// The sum of every series of one metric family in a text exposition.
fn family_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// What the operator's API client and controller did, sampled every half second until stopped.
#[derive(Debug, Default)]
struct ApiLoad {
    /// Requests per second in the busiest window of two samples 1 to 1.5 s apart.
    peak_per_second: f64,
    /// The most reconciles seen running at once.
    peak_in_flight: f64,
    /// (seconds since the start, requests sent so far), for rates over any window.
    requests: Vec<(f64, f64)>,
}

impl ApiLoad {
    /// Requests per second between two moments (seconds since the sampler's start).
    fn rate(&self, from: f64, to: f64) -> f64 {
        let at = |t: f64| {
            self.requests
                .iter()
                .take_while(|(when, _)| *when <= t)
                .last()
                .map_or(0.0, |(_, n)| *n)
        };
        (at(to) - at(from)) / (to - from).max(1e-9)
    }
}

async fn watch_api_load(
    operator_metrics: String,
    started: Instant,
    stop: Arc<AtomicBool>,
) -> ApiLoad {
    let mut load = ApiLoad::default();
    while !stop.load(Ordering::Relaxed) {
        // Nothing listens yet while the operator starts.
        let Some((_, text)) = http::try_get(&operator_metrics, "/metrics").await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let now = started.elapsed().as_secs_f64();
        let sent = family_sum(&text, "outbox_operator_api_requests_total");
        load.peak_in_flight = load
            .peak_in_flight
            .max(family_sum(&text, "outbox_operator_reconciles_in_flight"));
        if let Some((t, then)) = load.requests.iter().rev().find(|(t, _)| now - t >= 1.0) {
            load.peak_per_second = load.peak_per_second.max((sent - then) / (now - t));
        }
        load.requests.push((now, sent));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    load
}

/// `METHOD code: count` of every series of `outbox_operator_api_requests_total`, and the number
/// of reconciles so far: what one reconcile costs the API server.
async fn api_requests_by_answer(operator: &OperatorProcess) -> (Vec<String>, f64) {
    let (_, text) = http::get(&operator.metrics_addr, "/metrics").await;
    let by_answer = text
        .lines()
        .filter_map(|line| {
            let labels = line.strip_prefix("outbox_operator_api_requests_total{")?;
            let (labels, count) = labels.split_once("} ")?;
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_string())
            };
            Some(format!("{} {}: {count}", label("method")?, label("code")?))
        })
        .collect();
    (
        by_answer,
        family_sum(&text, "outbox_operator_reconciles_total"),
    )
}

/// `outbox_operator_reconciles_total` of every relay, by `namespace/name`.
async fn reconciles(operator: &OperatorProcess) -> BTreeMap<String, u64> {
    let (_, text) = http::get(&operator.metrics_addr, "/metrics").await;
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("outbox_operator_reconciles_total{relay=\"")?;
            let (relay, value) = rest.split_once("\"} ")?;
            Some((relay.to_string(), value.trim().parse::<f64>().ok()? as u64))
        })
        .collect()
}

/// The 99th percentile of every reconcile, from the per-relay histograms' buckets added up: the
/// bucket bound it falls under, in seconds.
async fn reconcile_p99(operator: &OperatorProcess) -> Option<f64> {
    let (_, text) = http::get(&operator.metrics_addr, "/metrics").await;
    let mut buckets: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("outbox_operator_reconcile_duration_seconds_bucket{")
        else {
            continue;
        };
        let Some((labels, count)) = rest.split_once("} ") else {
            continue;
        };
        let Some(le) = labels
            .split(',')
            .find_map(|label| label.strip_prefix("le=\""))
            .map(|le| le.trim_end_matches('"').to_string())
        else {
            continue;
        };
        *buckets.entry(le).or_default() += count.trim().parse::<f64>().unwrap_or(0.0);
    }
    let mut bounds: Vec<(f64, f64)> = buckets
        .into_iter()
        .map(|(le, count)| (le.parse().unwrap_or(f64::INFINITY), count))
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = bounds.last()?.1;
    bounds
        .iter()
        .find(|(_, count)| *count >= 0.99 * total)
        .map(|(bound, _)| *bound)
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

async fn all_ready(relays: &Api<OutboxRelay>, count: usize) -> bool {
    let Ok(list) = relays.list(&Default::default()).await else {
        return false;
    };
    list.items.len() == count
        && list.items.iter().all(|relay| {
            ready_condition(relay)
                .is_some_and(|(status, reason, _)| status == "True" && reason == "Suspended")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_relays_become_ready_within_two_sessions_per_database_and_no_throttling() {
    let count = relay_count();
    let plane = ControlPlane::shared();
    let namespace = unique("scale").replace('_', "-");
    plane.create_restricted_namespace(&namespace).unwrap();
    install_chart(plane, &namespace, &[]).expect("helm install, no operator pod");
    let client = plane.admin_client().await.unwrap();
    create_url_secret(&client, &namespace, BROKER_SECRET, &amqp_url()).await;

    let mut databases = Vec::new();
    for index in 0..DATABASES {
        let database = PrivateDatabase::create("scale").await;
        create_url_secret(&client, &namespace, &format!("db-{index}"), &database.url).await;
        databases.push(database);
    }
    let relays: Api<OutboxRelay> = Api::namespaced(client.clone(), &namespace);
    for index in 0..count {
        let database = &databases[index % DATABASES];
        let table = format!("outbox_{index}");
        let mut conn = database.connect().await;
        let outbox = OutboxTable::new(TableName::parse(&table).unwrap());
        outbox_relay::tools::seed::create_table(&mut conn, &outbox)
            .await
            .expect("create the outbox table");
        let _ = conn.close().await;
        let mut spec = relay_spec(&table, "amq.topic");
        spec.database.url_secret_ref.name = format!("db-{}", index % DATABASES);
        spec.suspend = true;
        let relay = OutboxRelay::new(&format!("relay-{index}"), spec);
        relays
            .create(&PostParams::default(), &relay)
            .await
            .expect("create the OutboxRelay");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let names: Vec<String> = databases.iter().map(|d| d.name.clone()).collect();
    let sessions = tokio::spawn(watch_sessions(names.clone(), stop.clone()));
    let started = Instant::now();
    let operator = OperatorProcess::start(plane, &namespace, &namespace, "scale", &[])
        .await
        .expect("start the operator");
    let load_stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(watch_api_load(
        operator.metrics_addr.clone(),
        started,
        load_stop.clone(),
    ));
    let ready = outbox_tests::wait::holds(
        "every relay Ready (Suspended)",
        Duration::from_secs(60 + count as u64),
        || all_ready(&relays, count),
    )
    .await;
    let to_ready = started.elapsed();
    assert!(
        ready,
        "not every relay became Ready:\n{}",
        operator.log_text()
    );

    // A change that touches every relay: each database Secret rotated (its resourceVersion
    // moves), so every relay that names it is reconciled again.
    let before = reconciles(&operator).await;
    let rotated_at = Instant::now();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    for index in 0..DATABASES {
        let patch = json!({"metadata": {"annotations": {"rotated": unique("at")}}});
        secrets
            .patch(
                &format!("db-{index}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }
    // The relays still waiting for their reconcile after the rotation: the controller's queue as
    // a user sees it, sampled while it drains.
    let waiting = std::sync::Mutex::new(Vec::<(f64, usize)>::new());
    let all_again = outbox_tests::wait::holds(
        "every relay reconciled after the rotation",
        Duration::from_secs(60 + count as u64),
        || async {
            let now = reconciles(&operator).await;
            let left = before
                .iter()
                .filter(|(relay, then)| now.get(*relay) <= Some(*then))
                .count();
            waiting
                .lock()
                .unwrap()
                .push((rotated_at.elapsed().as_secs_f64(), left));
            left == 0 && before.len() == count
        },
    )
    .await;
    let to_reconcile_all = rotated_at.elapsed();
    stop.store(true, Ordering::Relaxed);
    load_stop.store(true, Ordering::Relaxed);
    let most = sessions.await.unwrap();
    let load = load.await.unwrap();
    let ready_at = to_ready.as_secs_f64();
    let rotated = rotated_at.duration_since(started).as_secs_f64();
    let waiting = waiting.into_inner().unwrap();
    let drained = |share: f64| {
        waiting
            .iter()
            .find(|(_, left)| (*left as f64) <= share * count as f64)
            .map_or(f64::NAN, |(t, _)| *t)
    };
    eprintln!(
        "API requests: {:.1}/s on average until all were Ready, {:.1}/s from the rotation until \
         all were reconciled again, {:.0}/s in the busiest second; at most {} reconciles at once \
         (bound {DEFAULT_RECONCILE_CONCURRENCY}); after the rotation the queue held {} relays at \
         first and was at 3/4 after {:.1} s, 1/2 after {:.1} s, 1/4 after {:.1} s, empty after \
         {:.1} s",
        load.rate(0.0, ready_at),
        load.rate(rotated, rotated + to_reconcile_all.as_secs_f64()),
        load.peak_per_second,
        load.peak_in_flight,
        waiting.first().map_or(0, |(_, left)| *left),
        drained(0.75),
        drained(0.5),
        drained(0.25),
        drained(0.0),
    );
    let p99 = reconcile_p99(&operator).await;
    let rss = operator.pid().and_then(peak_rss_mib);
    eprintln!(
        "{count} relays over {DATABASES} databases: all Ready after {:.1} s; every relay \
         reconciled again {:.1} s after the Secrets' rotation; operator peak RSS {:?} MiB; \
         reconcile p99 under {:?} s; most sessions per database {most:?}",
        to_ready.as_secs_f64(),
        to_reconcile_all.as_secs_f64(),
        rss,
        p99
    );
    assert!(
        all_again,
        "not every relay was reconciled after the rotation"
    );
    assert_eq!(
        most.len(),
        DATABASES,
        "the operator reached every database: {most:?}"
    );
    assert!(
        most.values().all(|&n| n <= SESSIONS_PER_DATABASE),
        "at most {SESSIONS_PER_DATABASE} sessions per database: {most:?}"
    );
    assert!(
        load.peak_in_flight <= f64::from(DEFAULT_RECONCILE_CONCURRENCY),
        "more reconciles at once than the bound {DEFAULT_RECONCILE_CONCURRENCY}: {}",
        load.peak_in_flight
    );
    assert!(
        load.peak_in_flight >= 1.0 && load.peak_per_second >= 1.0,
        "the sampler saw the operator work: {} reconciles at once at most, {} requests in the \
         busiest second",
        load.peak_in_flight,
        load.peak_per_second
    );
    let (by_answer, reconciled) = api_requests_by_answer(&operator).await;
    eprintln!(
        "API requests by answer: {}; {:.1} per reconcile over {reconciled} reconciles",
        by_answer.join(", "),
        load.requests.last().map_or(0.0, |(_, n)| *n) / reconciled.max(1.0)
    );
    let told_429: Vec<&String> = by_answer
        .iter()
        .filter(|answer| answer.contains(" 429: ") && !answer.ends_with(": 0"))
        .collect();
    assert!(
        told_429.is_empty(),
        "the API server answered 429: {told_429:#?}"
    );
    let backed_off = throttled(plane, &namespace, OPERATOR_NAME);
    assert!(
        backed_off.is_empty(),
        "the API server throttled: {backed_off:#?}"
    );

    operator.stop().await;
    for database in databases {
        database.drop_now().await;
    }
}
