//! The controller: which objects are watched and which relays each change wakes up. It runs
//! [`reconcile`] and [`error_policy`] for every OutboxRelay in one namespace, or in all.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kube::{Api, ResourceExt};

use crate::crd::OutboxRelay;
use crate::reconcile::input::dereference::read_cache::ReadCache;
use crate::reconcile::input::dereference::{referenced_config_map_names, referenced_secret_names};
use crate::reconcile::{Context, error_policy, reconcile};

/// The relays in `store` that refer to the Secret `name` in `namespace`.
pub fn relays_referencing(
    store: &Store<OutboxRelay>,
    namespace: Option<&str>,
    name: &str,
) -> Vec<ObjectRef<OutboxRelay>> {
    relays_naming(store, namespace, name, referenced_secret_names)
}

/// The relays in `store` that refer to the ConfigMap `name` in `namespace` (a CA bundle).
pub fn relays_referencing_config_map(
    store: &Store<OutboxRelay>,
    namespace: Option<&str>,
    name: &str,
) -> Vec<ObjectRef<OutboxRelay>> {
    relays_naming(store, namespace, name, referenced_config_map_names)
}

fn relays_naming(
    store: &Store<OutboxRelay>,
    namespace: Option<&str>,
    name: &str,
    names: fn(&crate::crd::OutboxRelaySpec) -> Vec<&str>,
) -> Vec<ObjectRef<OutboxRelay>> {
    store
        .state()
        .iter()
        .filter(|relay| {
            relay.namespace().as_deref() == namespace && names(&relay.spec).contains(&name)
        })
        .map(|relay| ObjectRef::from_obj(relay.as_ref()))
        .collect()
}

/// What of a relay, when it changes, is worth a reconcile of it: its spec (the generation, which
/// the API server also moves when it marks the relay for deletion), its labels and annotations
/// (the suspend and replay requests are annotations) and its finalizers. The reconcile's own
/// status write changes none of them, and before this filter each one woke the relay for a pass
/// that found nothing to do: most of the 8.5 reconciles per relay, and of the API requests, that
/// `long_operator_scale` counted over 100 relays' start and one rotation. Its Deployment's
/// changes, its Secrets' and ConfigMaps' and the requeue timer still wake it as before.
fn relay_change(relay: &OutboxRelay) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    relay.metadata.generation.hash(&mut hasher);
    relay.labels().hash(&mut hasher);
    relay.annotations().hash(&mut hasher);
    relay.finalizers().hash(&mut hasher);
    relay
        .metadata
        .deletion_timestamp
        .is_some()
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// The objects of kind `K` in `namespace`, or in every namespace.
fn api_in<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// Passes one event of a metadata watch over `scope` to `cache`; a failed watch call (the
/// watcher retries it) tells it nothing.
fn note_version<K>(
    cache: &ReadCache<K>,
    scope: &Option<String>,
    event: &Result<watcher::Event<PartialObjectMeta<K>>, watcher::Error>,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    if let Ok(event) = event {
        cache.observe(scope.as_deref(), event);
    }
}

/// Runs the controller for one namespace (or all, with `None`) until `shutdown` resolves.
pub async fn run_controller(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let scope = namespace.as_deref();
    let relays: Api<OutboxRelay> = api_in(&ctx.client, scope);
    let deployments: Api<Deployment> = api_in(&ctx.client, scope);
    // Secrets and ConfigMaps as metadata only (an Api of PartialObjectMeta makes metadata-only
    // requests): a change of one's version wakes the relays that name it, and the reconcile
    // reads those by name. No value of an unrelated Secret reaches the operator or its cache.
    let secrets: Api<PartialObjectMeta<Secret>> = api_in(&ctx.client, scope);
    let config_maps: Api<PartialObjectMeta<ConfigMap>> = api_in(&ctx.client, scope);
    let concurrency = controller::Config::default().concurrency(ctx.settings.reconcile_concurrency);
    // Controller::new's own stream (a reflector over the watcher), with the filter between it
    // and the trigger: the store still gets every version, so a reconcile reads the newest.
    let (store, writer) = reflector::store();
    let relay_changes = reflector::reflector(
        writer,
        watcher(relays, watcher::Config::default().any_semantic()),
    )
    .applied_objects()
    .predicate_filter(relay_change, Default::default());
    let controller = Controller::for_stream(relay_changes, store.clone()).with_config(concurrency);
    let config_map_store = store.clone();
    // The same events tell the reconciles' read cache which version of each object is the
    // newest, so an unchanged Secret is not read again at every poll.
    let (secret_ctx, config_map_ctx) = (ctx.clone(), ctx.clone());
    let scope_name = namespace.clone();
    let config_map_scope = namespace.clone();
    controller
        .owns(
            deployments,
            watcher::Config::default().labels("app.kubernetes.io/managed-by=outbox-operator"),
        )
        .watches_stream(
            watcher(secrets, watcher::Config::default())
                .inspect(move |event| note_version(&secret_ctx.secret_reads, &scope_name, event))
                .touched_objects(),
            move |secret: PartialObjectMeta<Secret>| {
                relays_referencing(
                    &store,
                    secret.metadata.namespace.as_deref(),
                    &secret.name_any(),
                )
            },
        )
        .watches_stream(
            watcher(config_maps, watcher::Config::default())
                .inspect(move |event| {
                    note_version(&config_map_ctx.config_map_reads, &config_map_scope, event);
                })
                .touched_objects(),
            move |config_map: PartialObjectMeta<ConfigMap>| {
                relays_referencing_config_map(
                    &config_map_store,
                    config_map.metadata.namespace.as_deref(),
                    &config_map.name_any(),
                )
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(%object, "reconciled"),
                Err(error) => tracing::debug!(%error, "reconcile did not complete"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_write_does_not_wake_the_relay_and_its_spec_annotations_and_deletion_do() {
        use crate::test_support::{sample_relay, sample_spec};

        let mut relay = sample_relay("orders", sample_spec());
        relay.metadata.generation = Some(1);
        let before = relay_change(&relay);
        let mut status_written = relay.clone();
        status_written.status = Some(Default::default());
        status_written.metadata.resource_version = Some("2".into());
        assert_eq!(relay_change(&status_written), before);

        let mut spec_changed = relay.clone();
        spec_changed.metadata.generation = Some(2);
        let mut annotated = relay.clone();
        annotated
            .annotations_mut()
            .insert("outboxrelay.io/suspend".into(), "true".into());
        let mut labelled = relay.clone();
        labelled.labels_mut().insert("team".into(), "a".into());
        let mut finalized = relay.clone();
        finalized
            .finalizers_mut()
            .push("outboxrelay.io/cleanup".into());
        let mut deleted = relay.clone();
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        for changed in [spec_changed, annotated, labelled, finalized, deleted] {
            assert_ne!(relay_change(&changed), before, "{:?}", changed.metadata);
        }
    }

    #[test]
    fn a_secret_maps_to_the_relays_that_use_it() {
        use crate::test_support::{sample_relay, sample_spec};
        use kube::runtime::{reflector, watcher};

        let (store, mut writer) = reflector::store::<OutboxRelay>();
        let orders = sample_relay("orders", sample_spec());
        let mut billing = sample_relay("billing", sample_spec());
        billing.spec.database.url_secret_ref.name = "billing-db".into();
        let mut elsewhere = sample_relay("orders-copy", sample_spec());
        elsewhere.metadata.namespace = Some("other".into());
        for relay in [&orders, &billing, &elsewhere] {
            writer.apply_watcher_event(&watcher::Event::Apply(relay.clone()));
        }
        let names = |secret: &str| {
            let mut names: Vec<String> = relays_referencing(&store, Some("shop"), secret)
                .into_iter()
                .map(|r| r.name)
                .collect();
            names.sort();
            names
        };
        assert_eq!(names("orders-db"), vec!["orders"]);
        assert_eq!(names("orders-amqp"), vec!["billing", "orders"]);
        assert_eq!(names("billing-db"), vec!["billing"]);
        assert!(names("unrelated").is_empty());
    }
}
