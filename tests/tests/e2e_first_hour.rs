//! A user's first hour with the operator, typed as they would type it, on the real control
//! plane: the chart installed with helm, then only `kubectl` (the control plane's own, 1.37)
//! against a sample from `config/samples/` whose URLs point at the local PostgreSQL and
//! RabbitMQ, on the address the real node's pods reach them at.

use std::time::Duration;

use lapin::ExchangeKind;
use outbox_tests::cluster::{OPERATOR_NAME, TestCluster};
use outbox_tests::services::url_for_pods;
use outbox_tests::{broker, db, health, process, unique};
use serde_json::Value;

fn for_pods(url: &str) -> String {
    url_for_pods(url).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The orders sample, with its Secrets' URLs pointed at this machine's services (as pods reach
/// them) and its table,
/// exchange and Secret names made the test's own.
fn orders_sample(table: &str, exchange: &str) -> String {
    let path = outbox_tests::repo_root().join("config/samples/outboxrelay-orders.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let line = match line.trim_start() {
            l if l.starts_with("url: postgres://") => {
                format!("  url: {}", for_pods(&outbox_tests::database_url()))
            }
            l if l.starts_with("url: amqp://") => {
                format!("  url: {}", for_pods(&outbox_tests::amqp_url()))
            }
            "table: outbox_messages" => format!("    table: {table}"),
            "exchange: outbox" => format!("    exchange: {exchange}"),
            _ => line.to_string(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    assert!(
        out.contains(table) && out.contains(exchange),
        "the sample changed shape:\n{out}"
    );
    out
}

struct User<'a> {
    cluster: &'a TestCluster,
}

impl User<'_> {
    /// `kubectl -n NS args…`, which must succeed.
    fn kubectl(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.cluster.namespace.as_str()];
        full.extend_from_slice(args);
        self.cluster
            .plane
            .kubectl_ok(&full)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    fn apply(&self, manifest: &str) -> String {
        let mut command = self.cluster.plane.kubectl();
        command.args([
            "apply",
            "--validate=strict",
            "-n",
            &self.cluster.namespace,
            "-f",
            "-",
        ]);
        let output = process::output_with_stdin(&mut command, manifest).unwrap();
        assert!(
            output.status.success(),
            "kubectl apply failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `kubectl wait … --for=CONDITION obr/NAME`, retried until `timeout`.
    fn wait_for(&self, condition: &str, object: &str, timeout: Duration) {
        let timeout_arg = format!("--timeout={}s", timeout.as_secs());
        self.kubectl(&["wait", &format!("--for={condition}"), &timeout_arg, object]);
    }

    /// Polls `kubectl get … -o jsonpath=PATH` until it prints `want`.
    async fn wait_jsonpath(&self, object: &str, path: &str, want: &str, timeout: Duration) {
        let jsonpath = format!("jsonpath={path}");
        let mut last = String::new();
        let ok =
            outbox_tests::wait::holds(&format!("{object} shows {want} at {path}"), timeout, || {
                last = self.kubectl(&["get", object, "-o", &jsonpath]);
                let matched = last.trim() == want;
                async move { matched }
            })
            .await;
        assert!(
            ok,
            "{object} {path} is {last:?}, not {want:?} after {timeout:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_first_hour_with_kubectl() {
    let table_name = unique("first_hour");
    let table = db::table(&table_name);
    db::seeded_table(&table, 0).await;
    let consumer = broker::consume(&table_name, ExchangeKind::Fanout, "").await;
    let cluster = TestCluster::start().await;
    cluster.record("orders");
    let user = User { cluster: &cluster };

    // Secrets and the OutboxRelay from the sample, then wait for Ready.
    let out = user.apply(&orders_sample(&table_name, &table_name));
    assert!(
        out.contains("outboxrelay.outboxrelay.io/orders created"),
        "{out}"
    );
    user.wait_for("condition=Ready", "obr/orders", Duration::from_secs(120));

    // Rows inserted are delivered once each.
    let mut conn = db::connect().await;
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 2_000, 50, |_| {})
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "rows still pending"
    );
    consumer.wait_for(2_000, Duration::from_secs(60)).await;
    assert_eq!(consumer.distinct(), 2_000);
    assert!(
        consumer.duplicates().is_empty(),
        "{:?}",
        consumer.duplicates()
    );

    // kubectl get obr: the printer columns, with real values once a report says 0 pending.
    user.wait_jsonpath(
        "obr/orders",
        "{.status.backlog}",
        "0",
        Duration::from_secs(60),
    )
    .await;
    // The backlog can be reported before the pod's readiness reaches the Ready condition.
    user.wait_jsonpath(
        "obr/orders",
        "{.status.conditions[?(@.type==\"Ready\")].status}",
        "True",
        Duration::from_secs(60),
    )
    .await;
    let table_text = user.kubectl(&["get", "obr"]);
    let mut lines = table_text.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "READY",
            "SUSPENDED",
            "REPLICAS",
            "BACKLOG",
            "OLDEST",
            "AGE"
        ],
        "{table_text}"
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..5],
        ["orders", "True", "false", "1", "0"],
        "{table_text}"
    );

    // Manual mode, then `kubectl scale`: three relay pods.
    let generation = user.kubectl(&["get", "obr/orders", "-o", "jsonpath={.metadata.generation}"]);
    user.kubectl(&[
        "patch",
        "obr/orders",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/scaling"}]"#,
    ]);
    user.kubectl(&["scale", "obr/orders", "--replicas=3"]);
    let scaled = outbox_tests::wait::holds("the relay scaled", Duration::from_secs(90), || async {
        cluster.running_pods("orders").len() == 3
    })
    .await;
    assert!(scaled, "relay pods: {:?}", cluster.running_pods("orders"));
    user.wait_jsonpath(
        "deploy/orders",
        "{.status.readyReplicas}",
        "3",
        Duration::from_secs(60),
    )
    .await;
    // Each spec edit is a new generation, and the status says it has seen the last one.
    let new_generation =
        user.kubectl(&["get", "obr/orders", "-o", "jsonpath={.metadata.generation}"]);
    assert!(
        new_generation.trim().parse::<i64>().unwrap()
            >= generation.trim().parse::<i64>().unwrap() + 2,
        "generation {generation} -> {new_generation}"
    );
    user.wait_jsonpath(
        "obr/orders",
        "{.status.observedGeneration}",
        new_generation.trim(),
        Duration::from_secs(60),
    )
    .await;
    user.wait_jsonpath(
        "obr/orders",
        "{.status.replicas}",
        "3",
        Duration::from_secs(60),
    )
    .await;

    // kubectl get events names what happened.
    let events = user.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=orders",
    ]);
    for reason in ["IndexCreated", "DeploymentCreated"] {
        assert!(events.contains(reason), "no {reason} in:\n{events}");
    }

    // A second OutboxRelay on the orders table: the table is claimed by `orders`, so this one
    // is Stalled, names the other, and runs no pods.
    cluster.record("copy");
    user.apply(&orders_sample(&table_name, &table_name).replace("name: orders\n", "name: copy\n"));
    user.wait_jsonpath(
        "obr/copy",
        "{.status.conditions[?(@.type==\"Stalled\")].reason}",
        "TableClaimedByAnotherRelay",
        Duration::from_secs(60),
    )
    .await;
    let message = user.kubectl(&[
        "get",
        "obr/copy",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].message}",
    ]);
    assert!(
        message.contains(&format!("OutboxRelay {}/orders", cluster.namespace)),
        "{message}"
    );
    let (copy_deployed, ..) = cluster
        .plane
        .kubectl_output(&["-n", &cluster.namespace, "get", "deploy/copy"])
        .unwrap();
    assert!(
        !copy_deployed,
        "the second relay of one table got a Deployment"
    );

    // A relay whose Secret does not exist yet: Ready=False/SecretNotFound, then Ready by itself
    // once the Secret is created. Its table is its own; it publishes to the orders exchange.
    let late_table = unique("first_hour_late");
    db::seeded_table(&db::table(&late_table), 0).await;
    let late = orders_sample(&late_table, &table_name)
        .replace("name: orders-db", "name: late-db")
        .replace("name: orders\n", "name: late\n");
    let is_late_secret = |d: &&str| d.contains("kind: Secret") && d.contains("name: late-db");
    let late_relay = late
        .split("---")
        .filter(|d| !is_late_secret(d))
        .collect::<Vec<_>>()
        .join("---");
    cluster.record("late");
    user.apply(&late_relay);
    user.wait_jsonpath(
        "obr/late",
        "{.status.conditions[?(@.type==\"Ready\")].reason}",
        "SecretNotFound",
        Duration::from_secs(60),
    )
    .await;
    let status = user.kubectl(&[
        "get",
        "obr/late",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ]);
    assert_eq!(status.trim(), "False");
    let secret = late.split("---").find(is_late_secret).unwrap().to_string();
    user.apply(&secret);
    user.wait_for("condition=Ready", "obr/late", Duration::from_secs(120));

    // How kstatus (Helm 4's --wait, Flux) and the shipped Argo CD health check read the
    // versions the two relays went through.
    tools_read_each_version_as_the_relay_was(&cluster);

    // kubectl delete obr: the Deployment and its pods go (garbage collection through the owner
    // reference), the table's rows stay as they are.
    let rows_before = db::scalar_i64(
        &mut conn,
        &format!("SELECT count(*) FROM {}", table.name.quoted()),
    )
    .await;
    user.kubectl(&[
        "delete",
        "obr/orders",
        "obr/late",
        "obr/copy",
        "--wait=true",
        "--timeout=60s",
    ]);
    let collected = outbox_tests::wait::holds(
        "the Deployment was garbage-collected",
        Duration::from_secs(90),
        || async {
            let (_, out, _) = cluster
                .plane
                .kubectl_output(&[
                    "-n",
                    &cluster.namespace,
                    "get",
                    "deploy,rs,pods",
                    "-o",
                    "name",
                ])
                .unwrap();
            // The chart's own operator (Deployment, ReplicaSet, pod) stays, of course.
            let relay_objects = out.lines().filter(|l| !l.contains(OPERATOR_NAME)).count();
            relay_objects == 0 && cluster.running_pods("orders").is_empty()
        },
    )
    .await;
    assert!(
        collected,
        "left behind: {}",
        user.kubectl(&["get", "deploy,rs,pods", "-o", "name"])
    );
    let rows_after = db::scalar_i64(
        &mut conn,
        &format!("SELECT count(*) FROM {}", table.name.quoted()),
    )
    .await;
    assert_eq!(rows_after, rows_before);
    assert_eq!(db::pending(&mut conn, &table).await, 0);

    consumer.close().await;
    cluster.shutdown().await;
}

/// `(status, reason)` of the relay's condition of type `kind`.
fn condition<'a>(relay: &'a Value, kind: &str) -> Option<(&'a str, &'a str)> {
    relay["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or(""),
            )
        })
}

/// Every recorded version of `orders`, `late` and `copy`, judged by kstatus and the Argo CD
/// health check: in progress while pods start, failed while a Secret is missing or the table
/// is another relay's, current once ready, and the two tools agree on each version.
fn tools_read_each_version_as_the_relay_was(cluster: &TestCluster) {
    let mut relays: Vec<(String, Value)> = Vec::new();
    for name in ["orders", "late", "copy"] {
        for (_, version) in cluster.versions_of("outboxrelays", name) {
            relays.push((name.to_string(), version));
        }
    }
    let objects: Vec<Value> = relays.iter().map(|(_, v)| v.clone()).collect();
    let verdicts = health::assess(cluster.plane, &objects).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(verdicts.len(), objects.len());
    let mut saw = std::collections::BTreeSet::new();
    for ((name, relay), verdict) in relays.iter().zip(&verdicts) {
        if relay.get("status").is_none() {
            // Before the operator's first status kstatus cannot tell a new object from a
            // settled one and says Current; the health check waits for the operator.
            assert_eq!(verdict.argocd, "Progressing", "{name}: {verdict:?}");
            continue;
        }
        let pair = (verdict.kstatus.as_str(), verdict.argocd.as_str());
        assert!(
            matches!(
                pair,
                ("Current", "Healthy") | ("InProgress", "Progressing") | ("Failed", "Degraded")
            ),
            "kstatus and Argo CD disagree on {name}: {verdict:?}\n{relay}"
        );
        let seen = relay["status"]["observedGeneration"] == relay["metadata"]["generation"];
        let ready = condition(relay, "Ready");
        if seen && ready.is_some_and(|(_, reason)| reason == "SecretNotFound") {
            assert_eq!(verdict.kstatus, "Failed", "{name}: {verdict:?}\n{relay}");
            assert!(
                verdict.argocd_message.contains("SecretNotFound"),
                "{verdict:?}"
            );
            saw.insert("a missing Secret: Failed");
        }
        if seen && ready.is_some_and(|(_, reason)| reason == "TableClaimedByAnotherRelay") {
            assert_eq!(verdict.kstatus, "Failed", "{name}: {verdict:?}\n{relay}");
            saw.insert("a claimed table: Failed");
        }
        if seen && ready.is_some_and(|(_, reason)| reason == "Progressing") {
            assert_eq!(
                verdict.kstatus, "InProgress",
                "{name}: {verdict:?}\n{relay}"
            );
            saw.insert("pods starting: InProgress");
        }
        if seen && ready == Some(("True", "Available")) {
            assert_eq!(verdict.kstatus, "Current", "{name}: {verdict:?}\n{relay}");
            saw.insert("ready: Current");
        }
    }
    assert_eq!(
        saw.len(),
        4,
        "the versions recorded did not cover every state: only {saw:?}"
    );
}
