//! The build step: the relay Deployment, as a pure function of the OutboxRelay, its
//! validated plan and the replicas decided. No I/O here, so every field is unit-tested.
//!
//! Secrets reach the pods only as `valueFrom.secretKeyRef`; the builder receives Secret
//! *versions* (to roll the pods when a Secret changes), never their values.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile,
    SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use outbox_relay::config::argv::{column_args, run_argv};
use outbox_relay::config::{RunArgs, TableArgs};
use outbox_relay::table::outbox::DeliveryOrder;

use crate::crd::{BrokerProtocol, BrokerSpec, OutboxRelay, SecretKeyRef};
use crate::reconcile::input::validate::RelayPlan;
use outbox_relay::broker::cloudevents::CloudEventsMode;

use self::files::ConnectionFiles;
use self::otlp::otlp_env;
use self::placement::{disruption_budget, spread_constraints};
use self::resources::relay_resources;

mod env;
mod files;
pub mod otlp;
pub mod placement;
pub mod resources;

/// Where the relay binary lives in the shared image.
pub const RELAY_BINARY: &str = "/usr/local/bin/outbox-relay";
/// The relay serves /metrics, /healthz and /readyz here.
/// The relay's default metrics port, as the container port type wants it.
pub const METRICS_PORT: i32 = outbox_relay::defaults::METRICS_PORT as i32;
pub const METRICS_PORT_NAME: &str = "metrics";
pub const CONTAINER_NAME: &str = "relay";
/// Hash of the desired Deployment; equal hashes mean nothing to apply.
pub const SPEC_HASH_ANNOTATION: &str = "outboxrelay.io/spec-hash";
/// Versions of the referenced Secrets; a change rolls the pods so they read the new values.
pub const SECRET_VERSIONS_ANNOTATION: &str = "outboxrelay.io/secret-versions";
/// The replicas a relay ran with when `spec.suspend` scaled it to zero, kept on its Deployment
/// (on the cluster, so an operator restart does not forget it) while suspended; the resume's
/// apply leaves it out, and server-side apply removes it. Not covered by the spec hash: see
/// [`replicas_before_suspend`].
pub const REPLICAS_BEFORE_SUSPEND_ANNOTATION: &str = "outboxrelay.io/replicas-before-suspend";
/// The field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "outbox-operator";
/// A non-root user that exists in distroless-style images; set explicitly so `runAsNonRoot`
/// holds even for an image whose USER is root.
const NON_ROOT_UID: i64 = 65532;

/// What the builder needs from the operator's own configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildSettings {
    /// Relay image used when the spec names none: the operator's own image.
    pub default_image: String,
}

impl Default for BuildSettings {
    fn default() -> Self {
        Self {
            default_image: format!(
                "ghcr.io/outbox-relay/outbox-relay:{}",
                env!("CARGO_PKG_VERSION")
            ),
        }
    }
}

/// The labels that select a relay's pods. Never change them: a Deployment's selector is
/// immutable.
pub fn selector_labels(relay: &OutboxRelay) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "outbox-relay".to_string(),
        ),
        ("app.kubernetes.io/instance".to_string(), relay.name_any()),
    ])
}

/// The Kubernetes recommended labels of everything the operator creates for a relay.
pub fn recommended_labels(relay: &OutboxRelay) -> BTreeMap<String, String> {
    let mut labels = selector_labels(relay);
    labels.insert("app.kubernetes.io/component".into(), "relay".into());
    labels.insert("app.kubernetes.io/part-of".into(), "outbox-relay".into());
    labels.insert("app.kubernetes.io/managed-by".into(), FIELD_MANAGER.into());
    labels
}

/// `key=value,key=value` form of the selector, for `status.selector` and the scale subresource.
pub fn selector_string(relay: &OutboxRelay) -> String {
    selector_labels(relay)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The relay name in lag reports and advisory locks: `<namespace>/<name>`.
pub fn report_name(relay: &OutboxRelay) -> String {
    format!(
        "{}/{}",
        relay.namespace().unwrap_or_default(),
        relay.name_any()
    )
}

/// The Deployment for `relay`, with the spec hash annotation set.
pub fn build_deployment(
    relay: &OutboxRelay,
    plan: &RelayPlan,
    secret_versions: &str,
    replicas: i32,
    settings: &BuildSettings,
) -> Deployment {
    let spec = &relay.spec.relay;
    let labels = recommended_labels(relay);
    let files = ConnectionFiles::of(&relay.spec);

    let mut pod_labels = spec.pod_labels.clone();
    // Ours win: a user label must not break the selector.
    pod_labels.extend(labels.clone());

    let mut pod_annotations = spec.pod_annotations.clone();
    pod_annotations.extend([
        ("prometheus.io/scrape".to_string(), "true".to_string()),
        ("prometheus.io/port".to_string(), METRICS_PORT.to_string()),
        ("prometheus.io/path".to_string(), "/metrics".to_string()),
        (
            SECRET_VERSIONS_ANNOTATION.to_string(),
            secret_versions.to_string(),
        ),
    ]);

    let container = Container {
        name: CONTAINER_NAME.into(),
        image: Some(
            spec.image
                .clone()
                .unwrap_or_else(|| settings.default_image.clone()),
        ),
        image_pull_policy: Some(spec.image_pull_policy.as_str().into()),
        command: Some(vec![RELAY_BINARY.into()]),
        args: Some(relay_args(relay, plan, &files)),
        env: Some(
            [
                secret_env("DATABASE_URL", &relay.spec.database.url_secret_ref),
                secret_env(
                    broker_url_env(&relay.spec.broker),
                    &relay.spec.broker.url_secret_ref,
                ),
                EnvVar {
                    name: "POD_NAME".into(),
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.name".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]
            .into_iter()
            .chain(
                (relay.spec.database.session_url_secret_ref.as_ref())
                    .map(|reference| secret_env("SESSION_DATABASE_URL", reference)),
            )
            .chain(files.env.iter().cloned())
            // Last, after POD_NAME, which its resource attributes refer to.
            .chain(spec.tracing.iter().flat_map(|tracing| {
                otlp_env(
                    tracing,
                    &relay.namespace().unwrap_or_default(),
                    &relay.name_any(),
                )
            }))
            .collect(),
        ),
        volume_mounts: files.any().then(|| files.mounts.clone()),
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: METRICS_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        liveness_probe: Some(http_probe("/healthz", 10, 3)),
        readiness_probe: Some(http_probe("/readyz", 5, 2)),
        resources: relay_resources(spec.resources.as_ref(), spec.workers_per_pod),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(NON_ROOT_UID),
            run_as_group: Some(NON_ROOT_UID),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..Default::default()
        }),
        ..Default::default()
    };

    let pod = PodSpec {
        containers: vec![container],
        termination_grace_period_seconds: Some(spec.termination_grace_period_seconds),
        // The relay never calls the Kubernetes API.
        automount_service_account_token: Some(false),
        service_account_name: spec.service_account_name.clone(),
        node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
        tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
        affinity: spec.affinity.clone(),
        topology_spread_constraints: spread_constraints(relay, &selector_labels(relay)),
        image_pull_secrets: (!spec.image_pull_secrets.is_empty())
            .then(|| spec.image_pull_secrets.clone()),
        priority_class_name: spec.priority_class_name.clone(),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            seccomp_profile: Some(runtime_default_seccomp()),
            // The mounted keys are group-readable only; the relay's user reads them as group.
            fs_group: files.any().then_some(NON_ROOT_UID),
            ..Default::default()
        }),
        volumes: files.any().then(|| files.volumes.clone()),
        ..Default::default()
    };

    let mut deployment = Deployment {
        metadata: ObjectMeta {
            name: Some(relay.name_any()),
            namespace: relay.namespace(),
            labels: Some(labels),
            owner_references: relay.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..Default::default()
        },
        spec: DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector_labels(relay)),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        },
        status: None,
    };
    // The budget is applied with the Deployment, so a change of it must change the hash too.
    let hash = content_hash(&(&deployment, build_disruption_budget(relay)));
    deployment.metadata.annotations =
        Some(BTreeMap::from([(SPEC_HASH_ANNOTATION.to_string(), hash)]));
    deployment
}

/// The `outbox-relay run` arguments, exactly the relay's flag names.
fn relay_args(relay: &OutboxRelay, plan: &RelayPlan, files: &ConnectionFiles) -> Vec<String> {
    let spec = &relay.spec;
    let amqp10 = spec.broker.protocol == BrokerProtocol::Amqp10;
    let options = RunArgs {
        table: TableArgs {
            table: Some(plan.table.name.to_string()),
            columns: column_args(&plan.table.columns),
            mode: Some(plan.table.mode),
            // Only per-key is rendered: unordered Deployments stay as they were.
            ordering: (plan.table.ordering == DeliveryOrder::PerKey).then_some(plan.table.ordering),
            relay_name: Some(report_name(relay)),
            database_password_file: files.database_password_file.clone(),
            database_pool_mode: relay.spec.database.pool_mode,
            // Rendered only when set, so Deployments made before they existed keep their hash.
            idle_in_transaction_timeout: plan.idle_in_transaction_timeout,
            dead_client_timeout: plan.dead_client_timeout,
            ..Default::default()
        },
        broker_password_file: files.broker_password_file.clone(),
        broker_ca_file: files.broker_ca_file.clone(),
        broker_client_cert: files.broker_client_cert.clone(),
        broker_client_key: files.broker_client_key.clone(),
        // Under amqp10 the 0-9-1 options stay unrendered: the relay refuses them there (and
        // validation has refused a spec that sets them). Under amqp091 the protocol flag stays
        // unrendered too, so Deployments made before it existed keep their hash.
        broker_protocol: amqp10.then_some(BrokerProtocol::Amqp10),
        address: spec.broker.address.clone().filter(|_| amqp10),
        exchange: (!amqp10).then(|| {
            (spec.broker.exchange.as_deref())
                .unwrap_or(outbox_relay::defaults::EXCHANGE)
                .to_string()
        }),
        routing_key: spec.broker.routing_key.clone(),
        batch_size: Some(spec.relay.batch_size.into()),
        workers: Some(spec.relay.workers_per_pod.into()),
        inflight_batches: Some(spec.relay.inflight_batches.into()),
        publisher_confirms: (!amqp10).then_some(spec.broker.publisher_confirms),
        mandatory: (!amqp10).then_some(spec.broker.mandatory),
        publish_timeout: Some(plan.publish_timeout),
        broker_heartbeat: plan.broker_heartbeat.filter(|_| !amqp10),
        max_attempts: Some(spec.relay.max_attempts.into()),
        dead_letter_exchange: spec.broker.dead_letter_exchange.clone(),
        poll_interval: Some(plan.poll_interval),
        report_interval: Some(plan.report_interval),
        // The pod's address, so the kubelet's probes and Prometheus reach it.
        metrics_addr: Some(SocketAddr::from(([0, 0, 0, 0], METRICS_PORT as u16))),
        log_format: Some(spec.relay.log_format),
        // Finish the batch in flight a little before the kubelet's SIGKILL, so a rolling
        // restart commits instead of leaving rows to be relayed twice.
        shutdown_grace: Some(Duration::from_secs(shutdown_grace_seconds(
            spec.relay.termination_grace_period_seconds,
        ))),
        processed_retention: plan.processed_retention,
        // Rendered only when set, so Deployments without CloudEvents keep their hash.
        cloudevents: spec
            .broker
            .cloud_events
            .as_ref()
            .map(|_| CloudEventsMode::Binary),
        cloudevents_source: spec.broker.cloud_events.as_ref().map(|c| c.source.clone()),
        ..Default::default()
    };
    run_argv(&options)
}

/// Five seconds of margin below the termination grace period, and never below one second.
fn shutdown_grace_seconds(termination_grace_period_seconds: i64) -> u64 {
    (termination_grace_period_seconds - 5)
        .max(termination_grace_period_seconds / 2)
        .max(1)
        .unsigned_abs()
}

/// The variable the broker URL reaches the relay in: AMQP_URL, its AMQP 0-9-1 name, keeps
/// existing Deployments unchanged; amqp10 gets the protocol-neutral BROKER_URL.
fn broker_url_env(broker: &BrokerSpec) -> &'static str {
    match broker.protocol {
        BrokerProtocol::Amqp091 => "AMQP_URL",
        BrokerProtocol::Amqp10 => "BROKER_URL",
    }
}

fn secret_env(name: &str, reference: &SecretKeyRef) -> EnvVar {
    env::secret_key_env(name, &reference.name, &reference.key)
}

fn http_probe(path: &str, period_seconds: i32, failure_threshold: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(METRICS_PORT_NAME.into()),
            ..Default::default()
        }),
        period_seconds: Some(period_seconds),
        failure_threshold: Some(failure_threshold),
        timeout_seconds: Some(2),
        ..Default::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..Default::default()
    }
}

/// FNV-1a over the JSON form: stable across processes and Rust versions (unlike std's
/// hasher), so an operator restart does not re-apply every Deployment.
fn content_hash(objects: &impl serde::Serialize) -> String {
    let bytes = serde_json::to_vec(objects).expect("Kubernetes objects always serialize");
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The relay pods' PodDisruptionBudget, or `None` when `spec.relay.disruptionBudget` turns
/// it off.
pub fn build_disruption_budget(
    relay: &OutboxRelay,
) -> Option<k8s_openapi::api::policy::v1::PodDisruptionBudget> {
    disruption_budget(relay, &recommended_labels(relay), &selector_labels(relay))
}

/// Marks `deployment` (a suspended relay's) with the replicas it ran with before.
pub fn remember_replicas_before_suspend(deployment: &mut Deployment, replicas: i32) {
    let annotations = deployment
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    annotations.insert(
        REPLICAS_BEFORE_SUSPEND_ANNOTATION.to_string(),
        replicas.to_string(),
    );
}

/// The replicas a Deployment ran with before its relay was suspended, if it says so. A value
/// edited by hand into something that is not a count is ignored rather than trusted.
pub fn replicas_before_suspend(deployment: &Deployment) -> Option<i32> {
    let annotations = deployment.metadata.annotations.as_ref()?;
    let value = annotations.get(REPLICAS_BEFORE_SUSPEND_ANNOTATION)?;
    value.trim().parse::<i32>().ok().filter(|n| *n >= 0)
}

/// The hash the builder stamped on a Deployment, if any.
pub fn spec_hash(deployment: &Deployment) -> Option<&str> {
    deployment
        .metadata
        .annotations
        .as_ref()?
        .get(SPEC_HASH_ANNOTATION)
        .map(String::as_str)
}

#[cfg(test)]
mod tests;
