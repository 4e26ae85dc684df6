//! The tests' real node (tests/src/node): containerd, runc, the CNI bridge, the kubelet,
//! kube-proxy and kube-scheduler, as a cluster runs pods. One relay pod of the project's image,
//! in a namespace that enforces the restricted Pod Security profile, shows what a hand-written
//! stand-in for a node could not: the scheduler places it, the kubelet runs it under containerd with its
//! own IP, its readiness probe, its memory limit in the node's cgroups, `kubectl logs` through
//! the API server, the `kubernetes` Service's ClusterIP through kube-proxy; and the node leaves
//! nothing behind when it stops.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use outbox_tests::broker::consume;
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::node::{NODE_NAME, Node};
use outbox_tests::oci::{IMAGE_REPOSITORY, Image};
use outbox_tests::ports::{PG_PORT, RABBITMQ_PORT};
use outbox_tests::services::SERVICES_ADDRESS;
use outbox_tests::{db, http, process, unique, wait};
use serde_json::json;

/// A pod that meets the restricted profile: the relay as the chart's pods run it, against the
/// servers on the services address.
fn relay_pod(name: &str, table: &str, exchange: &str) -> Pod {
    let image = format!("{IMAGE_REPOSITORY}:{}", Image::shared().tag());
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "terminationGracePeriodSeconds": 10,
            "containers": [{
                "name": "relay",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["/usr/local/bin/outbox-relay"],
                "args": ["run", "--table", table, "--exchange", exchange,
                         "--metrics-addr", "0.0.0.0:9090", "--log-format", "json",
                         "--poll-interval", "100ms"],
                "env": [
                    {"name": "DATABASE_URL",
                     "value": format!("postgres://postgres@{SERVICES_ADDRESS}:{PG_PORT}/test")},
                    {"name": "AMQP_URL",
                     "value": format!("amqp://guest:guest@{SERVICES_ADDRESS}:{RABBITMQ_PORT}/%2f")},
                ],
                "ports": [{"name": "http", "containerPort": 9090}],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9090}, "periodSeconds": 1},
                "resources": {
                    "requests": {"cpu": "50m", "memory": "64Mi"},
                    "limits": {"memory": "128Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))
    .expect("the pod deserializes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_runs_a_relay_pod_and_leaves_nothing_behind() {
    let plane = ControlPlane::start().unwrap_or_else(|e| panic!("{e:#}"));
    let mut node = Node::start(&plane).unwrap_or_else(|e| panic!("{e:#}"));
    let client = plane.admin_client().await.expect("an admin client");

    // The node as `kubectl get nodes` shows it: Ready, at its own address.
    let wide = plane
        .kubectl_ok(&["get", "nodes", "-o", "wide", "--no-headers"])
        .unwrap();
    let address = node.link.node_address().to_string();
    assert!(
        wide.starts_with(NODE_NAME) && wide.contains(" Ready ") && wide.contains(&address),
        "{wide}"
    );

    // The API server enforces the restricted profile in the namespace.
    let namespace = unique("node").replace('_', "-");
    plane.create_restricted_namespace(&namespace).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let mut privileged = relay_pod("privileged", "t", "x");
    let context = privileged.spec.as_mut().unwrap().containers[0]
        .security_context
        .as_mut()
        .unwrap();
    context.privileged = Some(true);
    context.allow_privilege_escalation = None;
    let refused = pods
        .create(&PostParams::default(), &privileged)
        .await
        .expect_err("a privileged pod breaks the restricted profile");
    assert!(
        refused
            .to_string()
            .contains("violates PodSecurity \"restricted"),
        "{refused}"
    );

    // A relay pod drains a table to RabbitMQ, both reached on the services address.
    let table = unique("node_outbox");
    let exchange = unique("node_ex");
    let mut conn = db::seeded_table(&db::table(&table), 300).await;
    let url = outbox_tests::database_url();
    let (code, _, stderr) =
        process::run_relay_command(&["migrate", "--database-url", &url, "--table", &table]).await;
    assert_eq!(code, 0, "{stderr}");
    let consumer = consume(&exchange, lapin::ExchangeKind::Topic, "#").await;
    pods.create(
        &PostParams::default(),
        &relay_pod("relay", &table, &exchange),
    )
    .await
    .expect("the restricted relay pod is admitted");
    let ready = wait::for_value("the relay pod Ready", Duration::from_secs(120), || async {
        let pod = pods.get("relay").await.ok()?;
        let status = pod.status.clone()?;
        let ready = status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(pod)
    })
    .await;
    let pod = ready.unwrap_or_else(|e| {
        let described = plane.kubectl_output(&["describe", "pod", "relay", "-n", &namespace]);
        panic!("{e}: {described:?}\n{}", node.logs(30))
    });
    assert_eq!(consumer.wait_for(300, Duration::from_secs(60)).await, 300);
    consumer
        .assert_each_id_once(&mut conn, &db::table(&table), 300)
        .await;

    // kube-scheduler placed it; the pod has its own address on the node's bridge, and its port
    // 9090 is its own: no rewriting.
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(NODE_NAME)
    );
    let pod_ip = pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let subnet_prefix = node.link.pod_subnet().trim_end_matches("0/24").to_string();
    assert!(
        pod_ip.starts_with(&subnet_prefix),
        "{pod_ip} in {}",
        node.link.pod_subnet()
    );
    let (status, metrics) = http::get(&format!("{pod_ip}:9090"), "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("outbox_relay_messages_published_total 300"),
        "{metrics}"
    );

    // `kubectl logs` goes through the API server to the kubelet's serving port.
    let logs = plane
        .kubectl_ok(&["logs", "relay", "-n", &namespace])
        .unwrap();
    let json_lines = logs
        .lines()
        .filter(|line| serde_json::from_str::<serde_json::Value>(line).is_ok())
        .count();
    assert!(json_lines > 0, "no JSON log lines: {logs}");

    // The memory limit is the container's cgroup limit, under the node's own cgroup root.
    let uid = pod.metadata.uid.clone().unwrap();
    let limits = node
        .run("sh", &["-c", &format!("cat /sys/fs/cgroup/memory{}/kubepods/burstable/pod{uid}/*/memory.limit_in_bytes", node.cgroup_root())])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        limits
            .lines()
            .any(|l| l.trim() == (128u64 << 20).to_string()),
        "{limits}"
    );

    // The `kubernetes` Service's ClusterIP leads to the API server through kube-proxy's rules
    // in the node.
    let kubeconfig = plane.kubeconfig.display().to_string();
    let kubectl = plane.kubectl_path().display().to_string();
    let readyz = node
        .run(
            &kubectl,
            &[
                "--kubeconfig",
                &kubeconfig,
                "--server=https://10.0.0.1:443",
                "get",
                "--raw",
                "/readyz",
            ],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(readyz.trim(), "ok");
    node.fail_if_exited().unwrap();

    // Nothing of the node is left once it stops.
    let leftovers = node.leftovers_probe();
    drop(node);
    drop(plane);
    let left = leftovers.remaining();
    assert!(left.is_empty(), "left behind: {left:#?}");
}
