//! The in-memory API server answers a real kube Client the way a cluster would: create, get,
//! list with selectors, watch from a resourceVersion, server-side apply, merge patch, the status
//! subresource, generation, conflicts and Status bodies.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use outbox_operator::OutboxRelay;
use outbox_tests::apiserver::ApiServer;
use serde_json::json;

fn deployment(name: &str, replicas: i32, label: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"tier": label}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "i"}]}
            }
        }
    })
}

fn api_code(error: kube::Error) -> u16 {
    match error {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other}"),
    }
}

#[tokio::test]
async fn create_get_list_delete_with_conflicts_and_not_found() {
    let server = ApiServer::start().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(server.client("shop"), "shop");
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("db".into()),
            labels: Some(BTreeMap::from([("role".into(), "db".into())])),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([("url".into(), "postgres://x".into())])),
        ..Default::default()
    };
    let created = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    assert!(created.uid().is_some());
    assert!(created.creation_timestamp().is_some());
    let version: u64 = created.resource_version().unwrap().parse().unwrap();

    let again = secrets.create(&PostParams::default(), &secret).await;
    assert_eq!(api_code(again.unwrap_err()), 409);
    assert_eq!(api_code(secrets.get("missing").await.unwrap_err()), 404);
    assert!(secrets.get_opt("missing").await.unwrap().is_none());

    let mut other = secret.clone();
    other.metadata.name = Some("amqp".into());
    other.metadata.labels = Some(BTreeMap::from([("role".into(), "amqp".into())]));
    secrets
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    let selected = secrets
        .list(&ListParams::default().labels("role=db"))
        .await
        .unwrap();
    assert_eq!(selected.items.len(), 1);
    assert_eq!(selected.items[0].name_any(), "db");
    let everywhere: Api<Secret> = Api::all(server.client("shop"));
    assert_eq!(
        everywhere
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    // A replace with a stale resourceVersion is refused; with the live one it passes.
    let mut stale = created.clone();
    stale.metadata.resource_version = Some((version - 1).to_string());
    assert_eq!(
        api_code(
            secrets
                .replace("db", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        409
    );
    let replaced = secrets
        .replace("db", &PostParams::default(), &created)
        .await
        .unwrap();
    assert_eq!(replaced.uid(), created.uid());

    secrets
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_code(secrets.get("db").await.unwrap_err()), 404);
    let twice = secrets.delete("db", &DeleteParams::default()).await;
    assert_eq!(api_code(twice.unwrap_err()), 404);
}

#[tokio::test]
async fn apply_and_status_subresource_keep_their_parts_apart() {
    let server = ApiServer::start().await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(server.client("shop"), "shop");
    let apply = PatchParams::apply("test-manager").force();

    let first = deployments
        .patch("relay", &apply, &Patch::Apply(deployment("relay", 1, "a")))
        .await
        .unwrap();
    assert_eq!(first.metadata.generation, Some(1));
    assert_eq!(first.spec.replicas, Some(1));

    // Status through /status; the main resource's apply cannot touch it.
    deployments
        .patch_status(
            "relay",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 1, "readyReplicas": 1}})),
        )
        .await
        .unwrap();
    let mut with_status = deployment("relay", 3, "a");
    with_status["status"] = json!({"readyReplicas": 99});
    let scaled = deployments
        .patch("relay", &apply, &Patch::Apply(with_status))
        .await
        .unwrap();
    assert_eq!(scaled.spec.replicas, Some(3));
    assert_eq!(
        scaled.metadata.generation,
        Some(2),
        "a spec change bumps generation"
    );
    assert_eq!(scaled.status.unwrap().ready_replicas, Some(1));

    // A status write changes neither spec nor generation.
    let after_status = deployments
        .patch_status(
            "relay",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 7}, "status": {"readyReplicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(after_status.spec.replicas, Some(3));
    assert_eq!(after_status.metadata.generation, Some(2));
    assert_eq!(after_status.status.unwrap().ready_replicas, Some(3));

    // Re-applying the same thing is a no-op: no new resourceVersion.
    let before = deployments.get("relay").await.unwrap().resource_version();
    let same = deployments
        .patch("relay", &apply, &Patch::Apply(deployment("relay", 3, "a")))
        .await
        .unwrap();
    assert_eq!(same.resource_version(), before);

    // A field the manager stops applying is removed.
    let mut without_labels = deployment("relay", 3, "a");
    without_labels["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("labels");
    let pruned = deployments
        .patch("relay", &apply, &Patch::Apply(without_labels))
        .await
        .unwrap();
    assert!(pruned.labels().is_empty(), "{:?}", pruned.labels());

    // Status of a missing object is 404, never a create.
    let missing = deployments
        .patch_status(
            "ghost",
            &PatchParams::apply("test-manager"),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment", "status": {}})),
        )
        .await;
    assert_eq!(api_code(missing.unwrap_err()), 404);
}

#[tokio::test]
async fn watches_replay_and_honour_selectors_timeouts_and_bookmarks() {
    let server = ApiServer::start().await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(server.client("shop"), "shop");
    let apply = PatchParams::apply("test-manager");
    let list = deployments.list(&ListParams::default()).await.unwrap();
    let version = list.metadata.resource_version.unwrap();

    deployments
        .patch("a", &apply, &Patch::Apply(deployment("a", 1, "front")))
        .await
        .unwrap();
    deployments
        .patch("b", &apply, &Patch::Apply(deployment("b", 1, "back")))
        .await
        .unwrap();
    deployments
        .patch("a", &apply, &Patch::Apply(deployment("a", 2, "front")))
        .await
        .unwrap();
    deployments
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();

    let params = WatchParams::default().labels("tier=front").timeout(2);
    let started = std::time::Instant::now();
    let events: Vec<WatchEvent<Deployment>> = deployments
        .watch(&params, &version)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let (bookmarks, changes): (Vec<_>, Vec<_>) = events
        .into_iter()
        .partition(|event| matches!(event, WatchEvent::Bookmark(_)));
    let changes: Vec<String> = changes
        .into_iter()
        .map(|event| match event {
            WatchEvent::Added(d) => format!("ADDED {}", d.name_any()),
            WatchEvent::Modified(d) => format!("MODIFIED {} {:?}", d.name_any(), d.spec.replicas),
            WatchEvent::Deleted(d) => format!("DELETED {}", d.name_any()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(changes, ["ADDED a", "MODIFIED a Some(2)", "DELETED a"]);
    // The quiet second after the replay brings a bookmark at the newest version.
    let newest = deployments
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    match bookmarks.last() {
        Some(WatchEvent::Bookmark(bookmark)) => {
            assert_eq!(bookmark.metadata.resource_version, newest);
        }
        other => panic!("no bookmark on a quiet watch: {other:?}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(10),
        "the watch ends at timeoutSeconds, took {waited:?}"
    );
}

#[tokio::test]
async fn kube_runtime_watchers_see_custom_resources_and_their_status() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client("shop");
    let relays: Api<OutboxRelay> = Api::namespaced(client.clone(), "shop");
    let stream = watcher(relays.clone(), watcher::Config::default().any_semantic())
        .default_backoff()
        .applied_objects();
    let mut stream = Box::pin(stream);

    let spec = serde_json::from_value(json!({
        "database": {"urlSecretRef": {"name": "db"}},
        "broker": {"urlSecretRef": {"name": "amqp"}},
    }))
    .unwrap();
    let relay = relays
        .create(&PostParams::default(), &OutboxRelay::new("orders", spec))
        .await
        .unwrap();
    assert_eq!(relay.metadata.generation, Some(1));
    let seen = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the watcher reports the new relay")
        .unwrap()
        .unwrap();
    assert_eq!(seen.name_any(), "orders");

    relays
        .patch_status(
            "orders",
            &PatchParams::apply("op").force(),
            &Patch::Apply(json!({
                "apiVersion": "outboxrelay.io/v1alpha1",
                "kind": "OutboxRelay",
                "status": {"backlog": 42, "desiredReplicas": 2},
            })),
        )
        .await
        .unwrap();
    let updated = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the watcher reports the status change")
        .unwrap()
        .unwrap();
    let status = updated.status.unwrap();
    assert_eq!(status.backlog, Some(42));
    assert_eq!(status.desired_replicas, Some(2));
    assert_eq!(
        updated.metadata.generation,
        Some(1),
        "status does not bump generation"
    );
}

#[tokio::test]
async fn the_operators_leader_election_runs_on_a_lease() {
    use k8s_openapi::api::coordination::v1::Lease;
    use outbox_operator::leader::{LeaseSettings, release, try_acquire_or_renew};

    let server = ApiServer::start().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client("ops"), "ops");
    let first = LeaseSettings::new("outbox-operator", "pod-a");
    let second = LeaseSettings::new("outbox-operator", "pod-b");

    assert!(
        try_acquire_or_renew(&leases, &first).await.unwrap(),
        "the first candidate leads"
    );
    assert!(
        !try_acquire_or_renew(&leases, &second).await.unwrap(),
        "the second waits"
    );
    assert!(
        try_acquire_or_renew(&leases, &first).await.unwrap(),
        "the leader renews"
    );

    // A write based on an old version loses, as a candidate racing the leader would.
    let mut stale = leases.get("outbox-operator").await.unwrap();
    try_acquire_or_renew(&leases, &first).await.unwrap();
    stale.spec.as_mut().unwrap().holder_identity = Some("pod-b".into());
    let raced = leases
        .replace("outbox-operator", &PostParams::default(), &stale)
        .await;
    assert_eq!(api_code(raced.unwrap_err()), 409);

    release(&leases, &first).await.unwrap();
    assert!(
        try_acquire_or_renew(&leases, &second).await.unwrap(),
        "a release hands over at once"
    );
    assert!(!try_acquire_or_renew(&leases, &first).await.unwrap());
    let lease = leases.get("outbox-operator").await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("pod-b"));
    assert_eq!(lease.lease_transitions, Some(1));
}
