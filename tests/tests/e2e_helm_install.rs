//! The chart with the real helm on the real control plane: `helm install` cluster-wide and
//! with `watchNamespaces`, `helm upgrade`, `helm uninstall`; an install over the previous
//! release's CRD, which the operator upgrades (and migrates the stored relays); the operator running with the
//! chart's ServiceAccount token reconciles what its RBAC covers, leaves the rest alone, and
//! is never denied a request (the API server's audit log says so).
//!
//! The cluster-wide operator watches every namespace, so it gets a control plane of its own:
//! on the shared one it would reconcile the other tests' relays.
//!
//! make test runs these tests twice: on the Kubernetes the node runs, and with
//! `OUTBOX_KUBERNETES=oldest` on an API server of the oldest minor the chart supports. The
//! operator is compiled against the newest API; an empty list of refused requests there shows
//! it asks only for what that server serves.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::PostParams;
use outbox_operator::OutboxRelay;
use outbox_tests::cluster::{
    OPERATOR_NAME, OperatorProcess, accepted_writes, create_connection_secrets, install_chart,
    install_chart_cluster_wide, refusals, relay_spec,
};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::{api_versions, db, helm, unique};

fn fresh_namespace(plane: &ControlPlane, prefix: &str) -> String {
    let ns = unique(prefix).replace('_', "-");
    plane.create_namespace(&ns).unwrap();
    ns
}

/// Creates Secrets, a table and an OutboxRelay (zero replicas) in `ns`; returns its name.
async fn relay_in(plane: &ControlPlane, ns: &str) -> String {
    let client = plane.admin_client().await.unwrap();
    create_connection_secrets(&client, ns).await;
    let table = unique("helm");
    db::seeded_table(&db::table(&table), 0).await;
    let mut spec = relay_spec(&table, &table);
    spec.replicas = 0;
    let name = table.replace('_', "-");
    let relays: Api<OutboxRelay> = Api::namespaced(client, ns);
    relays
        .create(&PostParams::default(), &OutboxRelay::new(&name, spec))
        .await
        .unwrap();
    name
}

/// Whether the operator reconciled the relay: it has a status for its generation and a
/// Deployment.
async fn reconciled(plane: &ControlPlane, ns: &str, name: &str) -> bool {
    let client = plane.admin_client().await.unwrap();
    let relays: Api<OutboxRelay> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client, ns);
    let Ok(relay) = relays.get(name).await else {
        return false;
    };
    let seen = relay.status.and_then(|s| s.observed_generation) == relay.metadata.generation;
    seen && deployments.get_opt(name).await.ok().flatten().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wide_install_reconciles_every_namespace_upgrades_and_uninstalls() {
    let plane = ControlPlane::start().expect("a control plane of this test's own");
    let system = fresh_namespace(&plane, "system");
    let release = OPERATOR_NAME;
    let chart = helm::chart_dir();
    let chart = chart.to_str().unwrap();
    // Leader election on, as with several operator pods: the Lease is among what it writes.
    install_chart_cluster_wide(&plane, &system, 0, &["leaderElection.enabled=true"])
        .expect("helm install, cluster-wide");
    let roles = plane
        .kubectl_ok(&["get", "clusterrole,clusterrolebinding", "-o", "name"])
        .unwrap();
    assert!(
        roles.contains(&format!(
            "clusterrole.rbac.authorization.k8s.io/{OPERATOR_NAME}"
        )),
        "{roles}"
    );

    let operator = OperatorProcess::start(
        &plane,
        &system,
        "",
        "cluster-wide",
        &["--leader-election=true"],
    )
    .await
    .unwrap();
    let team_a = fresh_namespace(&plane, "team-a");
    let team_b = fresh_namespace(&plane, "team-b");
    let a = relay_in(&plane, &team_a).await;
    let b = relay_in(&plane, &team_b).await;
    for (ns, name) in [(&team_a, &a), (&team_b, &b)] {
        let ok =
            outbox_tests::wait::holds("the relay is reconciled", Duration::from_secs(60), || {
                reconciled(&plane, ns, name)
            })
            .await;
        assert!(ok, "{ns}/{name} not reconciled: {}", operator.log_text());
    }
    // Everything the operator writes, each accepted once at least: the Deployment (server-side
    // apply), the status, events and the leader Lease.
    let wrote = outbox_tests::wait::holds(
        "the operator wrote its status, events and Lease",
        Duration::from_secs(30),
        || async {
            let writes = accepted_writes(&plane, &system, OPERATOR_NAME);
            ["deployments", "outboxrelays/status", "events", "leases"]
                .iter()
                .all(|resource| writes.contains(*resource))
        },
    )
    .await;
    assert!(
        wrote,
        "writes accepted: {:?}\n{}",
        accepted_writes(&plane, &system, OPERATOR_NAME),
        operator.log_text()
    );

    // helm upgrade: a changed value reaches the Deployment; the release's revision moves.
    let upgrade: [&str; 8] = [
        "upgrade",
        release,
        chart,
        "-n",
        &system,
        "--reuse-values",
        "--set",
        "logFormat=text",
    ];
    helm::helm(&plane, &[&upgrade[..], helm::wait_flags(&plane)].concat()).expect("helm upgrade");
    let args = plane
        .kubectl_ok(&[
            "get",
            "deploy",
            OPERATOR_NAME,
            "-n",
            &system,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].args}",
        ])
        .unwrap();
    assert!(args.contains("--log-format=text"), "{args}");
    let history = helm::helm(&plane, &["history", release, "-n", &system]).unwrap();
    assert!(history.lines().count() >= 3, "{history}");

    operator.stop().await;
    let refused = refusals(&plane, &system, OPERATOR_NAME);
    assert!(refused.is_empty(), "the API server refused: {refused:#?}");

    // helm uninstall removes the release's objects, cluster-scoped ones too; the CRD (from
    // the chart's crds/ folder) stays, as Helm keeps CRDs, and so do the OutboxRelays.
    let uninstall: [&str; 4] = ["uninstall", release, "-n", &system];
    helm::helm(&plane, &[&uninstall[..], helm::wait_flags(&plane)].concat())
        .expect("helm uninstall");
    let left = plane
        .kubectl_ok(&["get", "clusterrole,clusterrolebinding", "-o", "name"])
        .unwrap();
    assert!(!left.contains(OPERATOR_NAME), "{left}");
    let (sa_left, ..) = plane
        .kubectl_output(&["get", "serviceaccount", OPERATOR_NAME, "-n", &system])
        .unwrap();
    assert!(!sa_left, "the ServiceAccount outlived the release");
    plane
        .kubectl_ok(&["get", "crd", "outboxrelays.outboxrelay.io"])
        .expect("the CRD stays");
    plane
        .kubectl_ok(&["get", "obr", &a, "-n", &team_a])
        .expect("the OutboxRelays stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_install_leaves_other_namespaces_alone_without_a_denied_request() {
    let plane = ControlPlane::shared();
    let release_ns = fresh_namespace(plane, "release");
    let watched = fresh_namespace(plane, "watched");
    let other = fresh_namespace(plane, "other");
    install_chart(
        plane,
        &release_ns,
        &[format!("watchNamespaces={{{watched}}}")],
    )
    .expect("helm install, namespaced");
    // Roles in the watched namespace only; nothing cluster-wide.
    let roles = plane
        .kubectl_ok(&["get", "role", "-n", &watched, "-o", "name"])
        .unwrap();
    assert!(roles.contains(OPERATOR_NAME), "{roles}");
    let (in_other, ..) = plane
        .kubectl_output(&["get", "role", OPERATOR_NAME, "-n", &other])
        .unwrap();
    assert!(!in_other, "a Role in an unwatched namespace");

    // A Secret no relay names, in the watched namespace: its value must never reach the
    // operator (it watches Secrets as metadata only and reads by name what relays reference).
    let canary = format!("unrelated-{}", uuid::Uuid::new_v4());
    plane
        .kubectl_ok(&[
            "create",
            "secret",
            "generic",
            "unrelated",
            "-n",
            &watched,
            &format!("--from-literal=value={canary}"),
        ])
        .unwrap();
    let operator = OperatorProcess::start(plane, &release_ns, &watched, "namespaced", &[])
        .await
        .unwrap();
    let mine = relay_in(plane, &watched).await;
    let theirs = relay_in(plane, &other).await;
    let ok = outbox_tests::wait::holds(
        "the watched namespace's relay is reconciled",
        Duration::from_secs(60),
        || reconciled(plane, &watched, &mine),
    )
    .await;
    assert!(
        ok,
        "the watched relay was not reconciled: {}",
        operator.log_text()
    );
    // A few polls later the other namespace's relay is still untouched.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = plane
        .kubectl_ok(&[
            "get",
            "obr",
            &theirs,
            "-n",
            &other,
            "-o",
            "jsonpath={.status}",
        ])
        .unwrap();
    assert!(
        status.trim().is_empty(),
        "an unwatched relay got a status: {status}"
    );
    let (deployed, ..) = plane
        .kubectl_output(&["get", "deploy", &theirs, "-n", &other])
        .unwrap();
    assert!(!deployed, "an unwatched relay got a Deployment");
    operator.stop().await;
    let refused = refusals(plane, &release_ns, OPERATOR_NAME);
    assert!(refused.is_empty(), "the API server refused: {refused:#?}");
    // The audit log records the operator's Secret requests with their responses: it read the
    // relay's own Secrets (values included), and no response carried the unrelated one's.
    let audited = plane.audit_events_of(&release_ns, OPERATOR_NAME);
    let read_values = audited.iter().any(|e| {
        e["objectRef"]["resource"] == "secrets"
            && e["verb"] == "get"
            && e["responseObject"]["data"].is_object()
    });
    assert!(read_values, "no Secret read by name in the audit log");
    let encoded = serde_json::to_string(&k8s_openapi::ByteString(canary.into_bytes())).unwrap();
    let encoded = encoded.trim_matches('"');
    let leaked: Vec<String> = audited
        .iter()
        .filter(|e| e.to_string().contains(encoded))
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(
        leaked.is_empty(),
        "the unrelated Secret's value reached the operator: {leaked:?}"
    );

    // The check above can fail: a ServiceAccount without the chart's rights is denied, and the
    // audit log shows it.
    plane
        .kubectl_ok(&["create", "serviceaccount", "powerless", "-n", &watched])
        .unwrap();
    let powerless = plane
        .service_account_kubeconfig(&watched, "powerless")
        .unwrap();
    let attempt = std::process::Command::new(plane.kubectl_path())
        .args(["get", "obr", "-n", &watched])
        .env("KUBECONFIG", &powerless)
        .output()
        .unwrap();
    assert!(!attempt.status.success());
    let seen = outbox_tests::wait::holds(
        "the audit log shows the denial",
        Duration::from_secs(10),
        || async { !refusals(plane, &watched, "powerless").is_empty() },
    )
    .await;
    assert!(seen, "the audit log does not show the denied request");
    for ns in [&release_ns, &watched, &other] {
        let _ = plane.kubectl_output(&["delete", "namespace", ns, "--wait=false"]);
    }
}

/// An upgrade from the release before v1beta1: its chart installed the CRD of then (v1alpha1
/// only), and OutboxRelays are stored at v1alpha1. `helm upgrade` to this chart leaves the CRD
/// as it was (Helm never upgrades `crds/`: helm #8668); the operator, once leader, applies its
/// own, rewrites the relays at v1beta1 and brings `storedVersions` to `["v1beta1"]`, without a
/// refused request. Then `helm uninstall` leaves the CRD and the relays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_upgrades_the_crd_and_migrates_stored_relays_and_uninstall_keeps_them() {
    let plane = ControlPlane::start().expect("a control plane of this test's own");
    let crd_name = outbox_operator::crd::CRD_NAME;
    let system = fresh_namespace(&plane, "system");
    // The previous release's chart: this one with the CRD of then in its crds/.
    let previous_chart = plane.dir().join("chart-previous");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(helm::chart_dir())
        .arg(&previous_chart)
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::copy(
        api_versions::previous_crd_path(),
        previous_chart.join("crds/outboxrelays.yaml"),
    )
    .unwrap();
    let values = [
        format!("fullnameOverride={OPERATOR_NAME}"),
        "replicaCount=0".to_string(),
        "leaderElection.enabled=true".to_string(),
    ];
    let mut install = vec![
        "install",
        OPERATOR_NAME,
        previous_chart.to_str().unwrap(),
        "-n",
        &system,
    ];
    for value in &values {
        install.extend(["--set", value.as_str()]);
    }
    helm::helm(&plane, &[&install[..], helm::wait_flags(&plane)].concat())
        .expect("helm install of the previous chart");
    api_versions::wait_served(&plane, "outboxrelay.io", "v1alpha1").unwrap();
    let team = fresh_namespace(&plane, "team");
    // What a user of that release wrote: its CRD refuses this build's newer fields.
    let fixture = std::fs::read_to_string(api_versions::previous_every_field_path()).unwrap();
    let (ok, out) = api_versions::kubectl_stdin(&plane, &["create", "-n", &team], &fixture);
    assert!(ok, "{out}");
    let before: Vec<serde_json::Value> =
        api_versions::relays_in(&api_versions::previous_every_field_path())
            .iter()
            .map(|relay| {
                let name = relay["metadata"]["name"].as_str().unwrap();
                api_versions::get_json(&plane, &["obr", name, "-n", &team]).unwrap()
            })
            .collect();
    assert_eq!(
        api_versions::stored_versions(&plane, crd_name).unwrap(),
        ["v1alpha1"]
    );

    let chart = helm::chart_dir();
    let upgrade = [
        "upgrade",
        OPERATOR_NAME,
        chart.to_str().unwrap(),
        "-n",
        &system,
        "--reuse-values",
    ];
    helm::helm(&plane, &[&upgrade[..], helm::wait_flags(&plane)].concat())
        .expect("helm upgrade to this chart");
    let crd = api_versions::get_json(&plane, &["crd", crd_name]).unwrap();
    assert_eq!(
        crd["spec"]["versions"].as_array().unwrap().len(),
        1,
        "helm upgrade changed the CRD (it never does: helm #8668)"
    );

    let operator = OperatorProcess::start(
        &plane,
        &system,
        "",
        "crd-upgrade",
        &["--leader-election=true"],
    )
    .await
    .unwrap();
    let migrated = outbox_tests::wait::holds(
        "the operator applied its CRD and migrated the stored relays",
        Duration::from_secs(90),
        || async {
            api_versions::stored_versions(&plane, crd_name).ok()
                == Some(vec!["v1beta1".to_string()])
        },
    )
    .await;
    assert!(
        migrated,
        "storedVersions: {:?}\n{}",
        api_versions::stored_versions(&plane, crd_name),
        operator.log_text()
    );
    // The cluster's CRD is this release's: everything the generated one says (the API server
    // adds its defaults around it).
    let generated = serde_json::to_value(outbox_operator::crd::crd()).unwrap();
    let cluster = api_versions::get_json(&plane, &["crd", crd_name]).unwrap();
    api_versions::contains(&cluster["spec"], &generated["spec"], "spec")
        .unwrap_or_else(|e| panic!("the cluster's CRD is not this release's: {e}"));
    let served: Vec<&str> = cluster["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(served, ["v1beta1", "v1alpha1"]);
    // Every relay kept its spec and generation, read through the new version.
    for old in &before {
        let name = old["metadata"]["name"].as_str().unwrap();
        let now = api_versions::get_json(
            &plane,
            &[
                &format!("outboxrelays.v1beta1.outboxrelay.io/{name}"),
                "-n",
                &team,
            ],
        )
        .unwrap();
        // This release's CRD adds `spec.suspend` with a default of false, which the API server
        // fills in when it reads an object stored without it (structural-schema defaulting:
        // no write, no new generation). Everything else is as the user wrote it.
        let mut spec = now["spec"].clone();
        let suspend = spec.as_object_mut().and_then(|s| s.remove("suspend"));
        assert_eq!(suspend, Some(serde_json::json!(false)), "{name}: {spec}");
        assert_eq!(spec, old["spec"], "{name}");
        assert_eq!(
            now["metadata"]["generation"], old["metadata"]["generation"],
            "{name}"
        );
    }
    let log = operator.log_text();
    assert!(log.contains("applied this release's CRD"), "{log}");
    assert!(
        log.contains("rewrote every OutboxRelay at the storage version"),
        "{log}"
    );
    operator.stop().await;
    let refused = refusals(&plane, &system, OPERATOR_NAME);
    assert!(refused.is_empty(), "the API server refused: {refused:#?}");
    let writes = accepted_writes(&plane, &system, OPERATOR_NAME);
    for resource in [
        "customresourcedefinitions",
        "customresourcedefinitions/status",
        "outboxrelays",
    ] {
        assert!(
            writes.contains(resource),
            "no {resource} write in {writes:?}"
        );
    }

    // helm uninstall: the CRD (this release's, applied by the operator) and the relays stay.
    let uninstall: [&str; 4] = ["uninstall", OPERATOR_NAME, "-n", &system];
    helm::helm(&plane, &[&uninstall[..], helm::wait_flags(&plane)].concat())
        .expect("helm uninstall");
    let after = api_versions::get_json(&plane, &["crd", crd_name]).expect("the CRD stays");
    api_versions::contains(&after["spec"], &generated["spec"], "spec").unwrap();
    let names = plane
        .kubectl_ok(&["get", "obr", "-n", &team, "-o", "name"])
        .unwrap();
    assert_eq!(names.lines().count(), 2, "the OutboxRelays stay: {names}");

    // Installing again over a CRD that differs from the chart's crds/ (here the previous
    // chart's over this release's): Helm 4 applies crds/ on install, server-side and without
    // force, so the fields the operator owns conflict. --skip-crds, as the install docs say,
    // installs the release and leaves the CRD to the operator.
    let mut again = install.clone();
    let refused = helm::helm(&plane, &[&again[..], helm::wait_flags(&plane)].concat())
        .expect_err("helm install over another release's CRD");
    assert!(format!("{refused:#}").contains("conflict"), "{refused:#}");
    again.push("--skip-crds");
    helm::helm(&plane, &[&again[..], helm::wait_flags(&plane)].concat())
        .expect("helm install --skip-crds");
    let kept = api_versions::get_json(&plane, &["crd", crd_name]).unwrap();
    api_versions::contains(&kept["spec"], &generated["spec"], "spec").unwrap();
}
