//! The upgrade a user makes, on the real node, under traffic: the previous release (built from
//! its recorded commit by `scripts/previous-release.sh`) and this build (`make dist`) pushed to
//! a registry the node pulls from; the previous release `helm install`ed from `oci://`; two
//! OutboxRelays of two pods each relaying while a producer inserts rows into both tables the
//! whole time; then `helm upgrade` to this build, and `helm rollback` to the previous release.
//! After each step: every row at the broker, every OutboxRelay `Ready` with its conditions and
//! `observedGeneration` caught up, the operator pod rolled to the step's digest, the relay pods
//! rolled to it one at a time (never fewer ready than the PodDisruptionBudget allows), the
//! pending index the same valid index as before (the migration is not redone), and the
//! cluster's CRD this tree's `crds/outboxrelays.yaml`.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use lapin::ExchangeKind;
use outbox_operator::OutboxRelay;
use outbox_relay::table::OutboxTable;
use outbox_tests::broker::{self, Consumer};
use outbox_tests::cluster::{
    OPERATOR_NAME, TEST_OPERATOR_ARGS, create_connection_secrets, relay_spec,
};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::node::Node;
use outbox_tests::previous_release::PreviousRelease;
use outbox_tests::registry::{Registry, run_dist};
use outbox_tests::{db, helm, process, repo_root, unique, wait};

const STEP: Duration = Duration::from_secs(180);
const REPLICAS: i32 = 2;

/// A release as the registry holds it: what `helm install`/`upgrade` is given.
#[derive(Clone)]
struct Published {
    version: String,
    chart: String,
    image_repo: String,
    digest: String,
}

impl Published {
    fn image_ref(&self) -> String {
        format!("{}@{}", self.image_repo, self.digest)
    }
}

/// The previous release's image and chart pushed as `make dist` pushes them.
fn publish_previous(
    plane: &ControlPlane,
    registry: &Registry,
    previous: &PreviousRelease,
    work: &Path,
) -> Published {
    // Built from the release's commit, as its label says.
    let config = std::process::Command::new("skopeo")
        .args(["inspect", "--config"])
        .arg(format!("oci:{}", previous.image_layout))
        .output()
        .expect("run skopeo");
    let config: serde_json::Value = serde_json::from_slice(&config.stdout).unwrap_or_default();
    assert_eq!(
        config["config"]["Labels"]["org.opencontainers.image.revision"],
        previous.commit.as_str(),
        "the previous release's image"
    );
    let image_repo = format!("{}/outbox-relay/outbox-relay", registry.address);
    let digest_file = work.join("previous.digest");
    let copied = std::process::Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-tls-verify=false",
        ])
        .arg("--digestfile")
        .arg(&digest_file)
        .arg(format!("oci:{}", previous.image_layout))
        .arg(format!("docker://{image_repo}:{}", previous.version))
        .output()
        .expect("run skopeo");
    assert!(
        copied.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&copied.stderr)
    );
    let digest = std::fs::read_to_string(&digest_file).unwrap();
    assert_eq!(digest.trim(), previous.image_digest, "the image as built");
    let charts = format!("oci://{}/outbox-relay/charts", registry.address);
    helm::helm(
        plane,
        &[
            "push",
            previous.chart_package.to_str().unwrap(),
            &charts,
            "--plain-http",
        ],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    Published {
        version: previous.version.clone(),
        chart: format!("{charts}/outbox-relay-operator"),
        image_repo,
        digest: digest.trim().to_owned(),
    }
}

/// `helm install` or `helm upgrade` of `release` into `ns`, watching `ns`, pinned by digest.
fn helm_to(
    plane: &ControlPlane,
    verb: &str,
    release: &Published,
    ns: &str,
) -> anyhow::Result<String> {
    let values = [
        format!("fullnameOverride={OPERATOR_NAME}"),
        format!("watchNamespaces={{{ns}}}"),
        "logFormat=text".to_owned(),
        format!("extraArgs={{{}}}", TEST_OPERATOR_ARGS.join(",")),
        format!("image.repository={}", release.image_repo),
        format!("image.digest={}", release.digest),
    ];
    let mut args = vec![
        verb,
        OPERATOR_NAME,
        &release.chart,
        "--version",
        &release.version,
        "--plain-http",
        "-n",
        ns,
    ];
    args.extend(helm::wait_flags(plane));
    for value in &values {
        args.extend(["--set", value]);
    }
    helm::helm(plane, &args)
}

/// One OutboxRelay with its own table and a consumer on its exchange.
struct Relay {
    name: String,
    table: OutboxTable,
    consumer: Consumer,
}

async fn list_pods(client: &Client, ns: &str, selector: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The pods of a relay (or the operator) as (uid, image, ready and not terminating,
/// terminating).
async fn pods_of(client: &Client, ns: &str, selector: &str) -> Vec<(String, String, bool, bool)> {
    let listed = list_pods(client, ns, selector).await;
    listed
        .iter()
        .map(|pod| {
            let image = pod.spec.as_ref().unwrap().containers[0]
                .image
                .clone()
                .unwrap_or_default();
            let terminating = pod.metadata.deletion_timestamp.is_some();
            let ready = !terminating
                && pod
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|c| c.iter().all(|c| c.ready));
            (pod.metadata.uid.clone().unwrap(), image, ready, terminating)
        })
        .collect()
}

/// The OutboxRelays at `outboxrelay.io/v1alpha1`: the version the previous release serves,
/// which users of it wrote, and which this build still serves (deprecated).
fn v1alpha1(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &v1alpha1_resource())
}

fn v1alpha1_resource() -> ApiResource {
    ApiResource {
        group: "outboxrelay.io".into(),
        version: "v1alpha1".into(),
        api_version: "outboxrelay.io/v1alpha1".into(),
        kind: "OutboxRelay".into(),
        plural: "outboxrelays".into(),
    }
}

/// Ready=True, `observedGeneration` the object's generation, and how many conditions it has.
fn settled(object: &DynamicObject) -> (bool, usize) {
    let status = &object.data["status"];
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    let ready = conditions
        .iter()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let observed = status["observedGeneration"].as_i64() == object.metadata.generation;
    (ready && observed, conditions.len())
}

fn relay_selector(relay: &str) -> String {
    format!("app.kubernetes.io/name=outbox-relay,app.kubernetes.io/instance={relay}")
}

/// The table's indexes other than its key, as (oid, valid).
async fn indexes(table: &OutboxTable) -> Vec<(i64, bool)> {
    sqlx::query_as(
        "SELECT indexrelid::bigint, indisvalid FROM pg_index \
         WHERE indrelid = to_regclass($1) AND NOT indisprimary ORDER BY 1",
    )
    .bind(table.name.quoted())
    .fetch_all(&mut db::connect().await)
    .await
    .unwrap()
}

/// What a step sampled of the relay pods while it ran: per relay, the fewest ready and the
/// most pods at once that were not terminating (stopping pods finish their batch first).
/// `lowest` describes each relay's pods at the sample with the fewest ready, for the failure
/// message: a pod's phase, readiness and restarts tell a slow probe from a crash.
#[derive(Default)]
struct Rollout {
    fewest_ready: Vec<usize>,
    fewest_running: Vec<usize>,
    most_pods: Vec<usize>,
    lowest: Vec<String>,
}

/// Each pod of `selector` in one line: name, image digest's end, phase, ready/terminating,
/// restarts, and a waiting or terminated container's reason.
async fn describe_pods(client: &Client, ns: &str, selector: &str) -> String {
    let listed = list_pods(client, ns, selector).await;
    let lines: Vec<String> = listed
        .iter()
        .map(|pod| {
            let status = pod.status.clone().unwrap_or_default();
            let containers = status.container_statuses.unwrap_or_default();
            let image = pod.spec.as_ref().map_or(String::new(), |s| {
                let image = s.containers[0].image.clone().unwrap_or_default();
                image[image.len().saturating_sub(8)..].to_owned()
            });
            let state: Vec<String> = containers
                .iter()
                .map(|c| {
                    let state = c.state.clone().unwrap_or_default();
                    let reason = state
                        .waiting
                        .and_then(|w| w.reason)
                        .or(state.terminated.and_then(|t| t.reason))
                        .unwrap_or_else(|| "running".into());
                    format!("ready={} restarts={} {reason}", c.ready, c.restart_count)
                })
                .collect();
            format!(
                "{} …{image} {} terminating={} {}",
                pod.metadata.name.clone().unwrap_or_default(),
                status.phase.unwrap_or_default(),
                pod.metadata.deletion_timestamp.is_some(),
                state.join(", ")
            )
        })
        .collect();
    lines.join("; ")
}

/// Samples the relays' pods every 250 ms until `stop`.
fn sample_rollout(
    client: Client,
    ns: String,
    relays: Vec<String>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Rollout> {
    tokio::spawn(async move {
        let mut rollout = Rollout {
            fewest_ready: vec![usize::MAX; relays.len()],
            fewest_running: vec![usize::MAX; relays.len()],
            most_pods: vec![0; relays.len()],
            lowest: vec![String::new(); relays.len()],
        };
        while !stop.load(Ordering::Relaxed) {
            for (i, relay) in relays.iter().enumerate() {
                let pods = pods_of(&client, &ns, &relay_selector(relay)).await;
                let ready = pods.iter().filter(|p| p.2).count();
                if ready < rollout.fewest_ready[i] {
                    rollout.lowest[i] = describe_pods(&client, &ns, &relay_selector(relay)).await;
                }
                rollout.fewest_ready[i] = rollout.fewest_ready[i].min(ready);
                let running = pods.iter().filter(|p| !p.3).count();
                rollout.most_pods[i] = rollout.most_pods[i].max(running);
                rollout.fewest_running[i] = rollout.fewest_running[i].min(running);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        rollout
    })
}

/// Inserts 50 rows into each table every 100 ms until `stop`; returns the rows inserted.
fn produce(tables: Vec<OutboxTable>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut conn = db::connect().await;
        let mut rows = 0;
        while !stop.load(Ordering::Relaxed) {
            for table in &tables {
                outbox_relay::tools::seed::copy_rows(&mut conn, table, 50, 50, |_| {})
                    .await
                    .expect("the producer inserts");
                rows += 50;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        rows
    })
}

/// Where the cluster's CRD differs from this tree's file, or None: every field the file sets
/// must be there with the same value (the API server may add defaults of its own), arrays of
/// the same length, and a schema's `properties` the same names (so a field the new CRD
/// dropped counts too).
fn crd_difference(
    file: &serde_json::Value,
    cluster: &serde_json::Value,
    path: &str,
) -> Option<String> {
    use serde_json::Value;
    match (file, cluster) {
        (Value::Object(want), Value::Object(have)) => {
            if path.ends_with("/properties") {
                let (a, b): (BTreeSet<_>, BTreeSet<_>) =
                    (want.keys().collect(), have.keys().collect());
                if a != b {
                    return Some(format!(
                        "{path}: fields {a:?} in the file, {b:?} on the cluster"
                    ));
                }
            }
            want.iter().find_map(|(key, value)| match have.get(key) {
                Some(other) => crd_difference(value, other, &format!("{path}/{key}")),
                None => Some(format!("{path}/{key}: not on the cluster")),
            })
        }
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() => want
            .iter()
            .zip(have)
            .enumerate()
            .find_map(|(i, (a, b))| crd_difference(a, b, &format!("{path}/{i}"))),
        // YAML's 10000.0 is JSON's 10000 once the API server has stored it.
        (Value::Number(want), Value::Number(have)) if want.as_f64() == have.as_f64() => None,
        (want, have) if want == have => None,
        (want, have) => Some(format!("{path}: {want} in the file, {have} on the cluster")),
    }
}

/// One step (the upgrade, or the rollback) with the producer running: `helm` does it, then
/// everything is checked against `to`.
#[allow(clippy::too_many_arguments)]
async fn step(
    what: &str,
    plane: &'static ControlPlane,
    client: &Client,
    ns: &str,
    relays: &[Relay],
    helm_step: impl FnOnce() -> anyhow::Result<String> + Send + 'static,
    to: &Published,
    index_before: &[Vec<(i64, bool)>],
) {
    let operator_before: BTreeSet<String> =
        pods_of(client, ns, "app.kubernetes.io/name=outbox-relay-operator")
            .await
            .into_iter()
            .map(|p| p.0)
            .collect();
    let mut pods_before = BTreeSet::new();
    for relay in relays {
        for pod in pods_of(client, ns, &relay_selector(&relay.name)).await {
            pods_before.insert(pod.0);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce(
        relays.iter().map(|r| r.table.clone()).collect(),
        stop.clone(),
    );
    let sampling = Arc::new(AtomicBool::new(false));
    let sampler = sample_rollout(
        client.clone(),
        ns.to_owned(),
        relays.iter().map(|r| r.name.clone()).collect(),
        sampling.clone(),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    let done = tokio::task::spawn_blocking(helm_step).await.unwrap();
    assert!(done.is_ok(), "{what}: {done:?}\n{}", plane.logs(20));

    // The operator pod rolled to the step's image.
    let image_ref = to.image_ref();
    let operator_rolled = wait::holds(
        &format!("{what}: the operator pod rolled"),
        STEP,
        || async {
            let pods = pods_of(client, ns, "app.kubernetes.io/name=outbox-relay-operator").await;
            pods.len() == 1
                && pods[0].2
                && pods[0].1 == image_ref
                && !operator_before.contains(&pods[0].0)
        },
    )
    .await;
    assert!(
        operator_rolled,
        "{what}: operator pods {:?}",
        pods_of(client, ns, "app.kubernetes.io/name=outbox-relay-operator").await
    );

    // Each relay's pods rolled to it: all new pods, of the step's image, all ready.
    for relay in relays {
        let rolled = wait::holds(&format!("{what}: {} rolled", relay.name), STEP, || async {
            let pods = pods_of(client, ns, &relay_selector(&relay.name)).await;
            pods.len() == REPLICAS as usize
                && pods.iter().all(|(uid, image, ready, _)| {
                    *ready && *image == image_ref && !pods_before.contains(uid)
                })
        })
        .await;
        assert!(
            rolled,
            "{what}: {} pods {:?}",
            relay.name,
            pods_of(client, ns, &relay_selector(&relay.name)).await
        );
    }
    sampling.store(true, Ordering::Relaxed);
    let rollout = sampler.await.unwrap();
    for (i, relay) in relays.iter().enumerate() {
        // The relay Deployment's rolling update is Kubernetes' default (25 %: at two replicas
        // one pod surges and none is taken away first), so there are always two pods that are
        // not terminating. Readiness is the kubelet's probe, which a loaded node may fail once
        // on a pod (a CI run saw one of two ready for a moment); the promise to users is the
        // PodDisruptionBudget's: at most one unavailable. A dip is described either way.
        let events = || {
            plane
                .kubectl_ok(&["get", "events", "-n", ns, "--sort-by=.lastTimestamp"])
                .unwrap_or_default()
        };
        assert!(
            rollout.fewest_running[i] >= REPLICAS as usize,
            "{what}: {} had {} pods not terminating at one point: {}\n{}",
            relay.name,
            rollout.fewest_running[i],
            rollout.lowest[i],
            events()
        );
        assert!(
            rollout.fewest_ready[i] >= REPLICAS as usize - 1,
            "{what}: {} had {} ready pods at one point: {}\n{}",
            relay.name,
            rollout.fewest_ready[i],
            rollout.lowest[i],
            events()
        );
        if rollout.fewest_ready[i] < REPLICAS as usize {
            println!(
                "{what}: {} had {} ready pods at one point: {}",
                relay.name, rollout.fewest_ready[i], rollout.lowest[i]
            );
        }
        assert!(
            rollout.most_pods[i] <= REPLICAS as usize + 1,
            "{what}: {} ran {} pods at once",
            relay.name,
            rollout.most_pods[i]
        );
        println!(
            "{what}: {} rolled with at least {} ready, at most {} pods at once",
            relay.name, rollout.fewest_ready[i], rollout.most_pods[i]
        );
    }

    // Every OutboxRelay is there, Ready, with its conditions, and its generation observed,
    // read at the version its users wrote it in.
    let old_api = v1alpha1(client, ns);
    for relay in relays {
        let caught_up = wait::holds(
            &format!("{what}: {} Ready and observed", relay.name),
            STEP,
            || async { settled(&old_api.get(&relay.name).await.unwrap()).0 },
        )
        .await;
        let object = old_api.get(&relay.name).await.unwrap();
        assert!(caught_up, "{what}: {:#}", object.data["status"]);
        assert!(
            settled(&object).1 >= 2,
            "{what}: {:#}",
            object.data["status"]
        );
    }

    // The rows, the producer's included, all reach the broker; the index is the one there was.
    stop.store(true, Ordering::Relaxed);
    let inserted = producer.await.unwrap();
    for (relay, before) in relays.iter().zip(index_before) {
        assert!(
            db::wait_until_drained(&relay.table, STEP).await,
            "{what}: rows of {} still pending",
            relay.name
        );
        let ids = db::all_ids(&mut db::connect().await, &relay.table).await;
        let arrived = wait::holds(
            &format!("{what}: every row of {} arrived", relay.name),
            STEP,
            || {
                let all = ids.iter().all(|id| relay.consumer.has(id));
                async move { all }
            },
        )
        .await;
        assert!(
            arrived,
            "{what}: rows of {} never reached the broker",
            relay.name
        );
        assert_eq!(
            &indexes(&relay.table).await,
            before,
            "{what}: the index of {}",
            relay.name
        );
    }
    println!("{what}: {inserted} rows inserted while it ran, all delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_previous_release_upgrades_to_this_build_under_traffic_and_rolls_back() {
    let plane = ControlPlane::shared();
    let node = tokio::task::spawn_blocking(Node::shared)
        .await
        .expect("the node starts");
    let previous = tokio::task::spawn_blocking(PreviousRelease::get)
        .await
        .unwrap()
        .expect("the previous release");
    let work = process::target_dir().join(unique("upgrade"));
    std::fs::create_dir_all(&work).unwrap();
    let registry = Registry::start_for_node(&work.join("registry")).expect("a registry");
    node.trust_plain_http_registry(&registry.address)
        .expect("containerd told about the registry");
    let old = publish_previous(plane, &registry, &previous, &work);
    let dist = tokio::task::block_in_place(|| run_dist(&registry, &work.join("dist"), None))
        .expect("make dist");
    let new = Published {
        version: dist.get("VERSION").to_owned(),
        chart: dist.get("CHART_OCI").to_owned(),
        image_repo: dist.get("IMAGE_REPO").to_owned(),
        digest: dist.get("IMAGE_DIGEST").to_owned(),
    };
    assert_ne!(old.version, new.version);
    assert_ne!(old.digest, new.digest);

    // The previous release, installed from the registry, relaying two tables.
    let ns = unique("upgrade").replace('_', "-");
    plane.create_restricted_namespace(&ns).unwrap();
    let client = plane.admin_client().await.unwrap();
    create_connection_secrets(&client, &ns).await;
    let installed = tokio::task::block_in_place(|| helm_to(plane, "install", &old, &ns));
    assert!(installed.is_ok(), "{installed:?}\n{}", node.logs(20));
    let old_api = v1alpha1(&client, &ns);
    let mut relays = Vec::new();
    for _ in 0..2 {
        let table_name = unique("upgrade");
        let table = db::table(&table_name);
        db::seeded_table(&table, 2_000).await;
        let consumer = broker::consume(&table_name, ExchangeKind::Fanout, "").await;
        let name = table_name.replace('_', "-");
        let mut spec = serde_json::to_value(relay_spec(&table_name, &table_name)).unwrap();
        spec["replicas"] = REPLICAS.into();
        let object = DynamicObject::new(&name, &v1alpha1_resource())
            .data(serde_json::json!({ "spec": spec }));
        old_api
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        relays.push(Relay {
            name,
            table,
            consumer,
        });
    }
    for relay in &relays {
        let ready = wait::holds(
            &format!("{} Ready on the previous release", relay.name),
            STEP,
            || async {
                settled(&old_api.get(&relay.name).await.unwrap()).0
                    && pods_of(&client, &ns, &relay_selector(&relay.name))
                        .await
                        .iter()
                        .filter(|p| p.2 && p.1 == old.image_ref())
                        .count()
                        == REPLICAS as usize
            },
        )
        .await;
        assert!(
            ready,
            "{:#}",
            old_api.get(&relay.name).await.unwrap().data["status"]
        );
        assert!(db::wait_until_drained(&relay.table, STEP).await);
    }
    let mut index_before = Vec::new();
    for relay in &relays {
        let found = indexes(&relay.table).await;
        assert!(
            found.len() == 1 && found[0].1,
            "one valid pending index on {}: {found:?}",
            relay.name
        );
        index_before.push(found);
    }

    // helm upgrade to this build.
    let (upgrade_ns, upgrade_to) = (ns.clone(), new.clone());
    step(
        "upgrade",
        plane,
        &client,
        &ns,
        &relays,
        move || helm_to(plane, "upgrade", &upgrade_to, &upgrade_ns),
        &new,
        &index_before,
    )
    .await;

    // The objects written at the previous release's version read at this build's too.
    let current: Api<OutboxRelay> = Api::namespaced(client.clone(), &ns);
    for relay in &relays {
        let object = current.get(&relay.name).await;
        assert!(
            object.as_ref().is_ok_and(|o| o.status.is_some()),
            "{} at this build's version: {object:?}",
            relay.name
        );
    }

    // The cluster's CRD is this tree's (helm never updates crds/: whatever brings it there).
    let file: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("crds/outboxrelays.yaml")).unwrap(),
    )
    .unwrap();
    let difference = || {
        let cluster: serde_json::Value = serde_json::from_str(
            &plane
                .kubectl_ok(&["get", "crd", "outboxrelays.outboxrelay.io", "-o", "json"])
                .unwrap(),
        )
        .unwrap();
        crd_difference(
            &file["spec"]["versions"],
            &cluster["spec"]["versions"],
            "spec.versions",
        )
    };
    let same = wait::holds(
        "the cluster's CRD is crds/outboxrelays.yaml",
        Duration::from_secs(60),
        || {
            let differs = difference().is_some();
            async move { !differs }
        },
    )
    .await;
    assert!(
        same,
        "the CRD on the cluster differs from crds/outboxrelays.yaml: {:?}",
        difference()
    );

    // helm rollback to the previous release, checked the same way.
    let rollback_ns = ns.clone();
    step(
        "rollback",
        plane,
        &client,
        &ns,
        &relays,
        move || {
            helm::helm(
                plane,
                &[
                    "rollback",
                    OPERATOR_NAME,
                    "1",
                    "-n",
                    &rollback_ns,
                    "--wait",
                    "--timeout",
                    "120s",
                ],
            )
        },
        &old,
        &index_before,
    )
    .await;

    for relay in relays {
        relay.consumer.close().await;
    }
    let _ = tokio::task::block_in_place(|| {
        helm::helm(plane, &["uninstall", OPERATOR_NAME, "-n", &ns, "--wait"])
    });
    let _ = plane.kubectl_output(&["delete", "namespace", &ns, "--wait=false"]);
    drop(registry);
    let _ = std::fs::remove_dir_all(&work);
}
