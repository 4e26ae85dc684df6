use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::crd::{
    BrokerProtocol, BrokerTlsSpec, CaKeyRef, CaSource, DatabaseTlsSpec, DeliveryMode,
    ImagePullPolicy, LogFormat, OutboxRelaySpec, PasswordSecretRef, PostgresTlsMode, TlsSecretRef,
};
use crate::reconcile::input::dereference::dereference_secrets;
use crate::reconcile::input::dereference::read_cache::ObjectReader;
use crate::reconcile::input::validate::validate;
use crate::test_support::{LEAK_CANARY, sample_relay, sample_spec};

fn build(spec: OutboxRelaySpec, replicas: i32) -> Deployment {
    let relay = sample_relay("orders", spec);
    let plan = validate(&relay.spec).unwrap();
    build_deployment(
        &relay,
        &plan,
        "orders-db=7",
        replicas,
        &BuildSettings::default(),
    )
}

fn container(deployment: &Deployment) -> &Container {
    &pod(deployment).containers[0]
}

fn pod(deployment: &Deployment) -> &PodSpec {
    deployment.spec.template.spec.as_ref().unwrap()
}

/// The value following `--name` in the container's arguments.
fn arg<'a>(deployment: &'a Deployment, name: &str) -> Option<&'a str> {
    let args = container(deployment).args.as_ref().unwrap();
    args.iter()
        .position(|a| a == &format!("--{name}"))
        .map(|i| args[i + 1].as_str())
}

fn full_spec() -> OutboxRelaySpec {
    let mut spec = sample_spec();
    spec.replicas = 3;
    spec.database.table = "sales.events".into();
    spec.database.url_secret_ref.key = "dsn".into();
    spec.database.columns.id = "event_id".into();
    spec.database.columns.kind = "event_type".into();
    spec.database.columns.payload = "body".into();
    spec.database.columns.occurred_at = "created_at".into();
    spec.database.columns.processed_at = "sent_at".into();
    spec.database.columns.error = "last_error".into();
    spec.database.columns.routing_key = Some("rk".into());
    spec.database.columns.headers = Some("hdrs".into());
    spec.database.columns.attempts = Some("tries".into());
    spec.broker.exchange = Some("sales".into());
    spec.broker.routing_key = Some("sales.static".into());
    spec.broker.publisher_confirms = false;
    spec.broker.mandatory = true;
    spec.broker.dead_letter_exchange = Some("sales.dlx".into());
    spec.broker.url_secret_ref.key = "amqp".into();
    let r = &mut spec.relay;
    r.image = Some("registry.example/relay:9.9".into());
    r.image_pull_policy = ImagePullPolicy::Always;
    r.batch_size = 1234;
    r.workers_per_pod = 7;
    r.inflight_batches = 3;
    r.delivery_mode = DeliveryMode::Delete;
    r.max_attempts = 9;
    r.publish_timeout = "3s".into();
    r.poll_interval = "50ms".into();
    r.report_interval = "2s".into();
    r.processed_retention = Some("168h".into());
    r.idle_in_transaction_timeout = Some("40s".into());
    r.dead_client_timeout = Some("12s".into());
    r.broker_heartbeat = Some("5s".into());
    r.log_format = LogFormat::Text;
    r.termination_grace_period_seconds = 45;
    r.resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "memory".into(),
            Quantity("256Mi".into()),
        )])),
        requests: Some(BTreeMap::from([("cpu".into(), Quantity("250m".into()))])),
        ..Default::default()
    });
    r.pod_annotations = BTreeMap::from([("team".into(), "sales".into())]);
    r.pod_labels = BTreeMap::from([
        ("tier".into(), "backend".into()),
        // Must not override the selector.
        ("app.kubernetes.io/instance".into(), "hijack".into()),
    ]);
    r.node_selector = BTreeMap::from([("disk".into(), "ssd".into())]);
    r.tolerations = vec![Toleration {
        key: Some("dedicated".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }];
    r.affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "zone".into(),
                        operator: "In".into(),
                        values: Some(vec!["a".into()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    r.service_account_name = Some("relay-sa".into());
    r.image_pull_secrets = vec![LocalObjectReference {
        name: "regcred".into(),
    }];
    r.priority_class_name = Some("high".into());
    spec
}

#[test]
fn every_spec_field_lands_in_the_deployment() {
    let d = build(full_spec(), 3);
    let c = container(&d);
    let p = pod(&d);

    assert_eq!(d.spec.replicas, Some(3));
    assert_eq!(c.image.as_deref(), Some("registry.example/relay:9.9"));
    assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(c.command.as_ref().unwrap(), &vec![RELAY_BINARY.to_string()]);
    assert_eq!(c.args.as_ref().unwrap()[0], "run");
    let expected = [
        ("table", "sales.events"),
        ("id-column", "event_id"),
        ("type-column", "event_type"),
        ("payload-column", "body"),
        ("occurred-at-column", "created_at"),
        ("processed-at-column", "sent_at"),
        ("error-column", "last_error"),
        ("routing-key-column", "rk"),
        ("headers-column", "hdrs"),
        ("attempts-column", "tries"),
        ("mode", "delete"),
        ("relay-name", "shop/orders"),
        ("idle-in-transaction-timeout", "40s"),
        ("dead-client-timeout", "12s"),
        ("broker-heartbeat", "5s"),
        ("exchange", "sales"),
        ("routing-key", "sales.static"),
        ("batch-size", "1234"),
        ("workers", "7"),
        ("inflight-batches", "3"),
        ("publisher-confirms", "false"),
        ("mandatory", "true"),
        ("publish-timeout", "3s"),
        ("max-attempts", "9"),
        ("dead-letter-exchange", "sales.dlx"),
        ("poll-interval", "50ms"),
        ("report-interval", "2s"),
        ("metrics-addr", "0.0.0.0:9090"),
        ("log-format", "text"),
        ("shutdown-grace", "40s"),
        ("processed-retention", "168h"),
    ];
    for (name, value) in expected {
        assert_eq!(arg(&d, name), Some(value), "--{name}");
    }
    // Every argument after "run" is a --flag value pair we listed.
    assert_eq!(c.args.as_ref().unwrap().len(), 1 + 2 * expected.len());

    let env = c.env.as_ref().unwrap();
    let secret_ref = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.secret_key_ref.as_ref())
            .map(|s| (s.name.clone(), s.key.clone()))
    };
    assert_eq!(
        secret_ref("DATABASE_URL"),
        Some(("orders-db".into(), "dsn".into()))
    );
    assert_eq!(
        secret_ref("AMQP_URL"),
        Some(("orders-amqp".into(), "amqp".into()))
    );
    assert!(
        env.iter().all(|e| e.value.is_none()),
        "no literal env values"
    );
    let pod_name = env.iter().find(|e| e.name == "POD_NAME").unwrap();
    assert_eq!(
        pod_name
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "metadata.name"
    );

    assert_eq!(c.resources, full_spec().relay.resources);
    assert_eq!(p.termination_grace_period_seconds, Some(45));
    assert_eq!(p.node_selector.as_ref().unwrap()["disk"], "ssd");
    assert_eq!(
        p.tolerations.as_ref().unwrap()[0].key.as_deref(),
        Some("dedicated")
    );
    assert_eq!(p.affinity, full_spec().relay.affinity);
    assert_eq!(p.service_account_name.as_deref(), Some("relay-sa"));
    assert_eq!(p.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    assert_eq!(p.priority_class_name.as_deref(), Some("high"));
    assert_eq!(p.automount_service_account_token, Some(false));

    let template = d.spec.template.metadata.as_ref().unwrap();
    let pod_labels = template.labels.as_ref().unwrap();
    assert_eq!(pod_labels["tier"], "backend");
    assert_eq!(pod_labels["app.kubernetes.io/instance"], "orders");
    let annotations = template.annotations.as_ref().unwrap();
    assert_eq!(annotations["team"], "sales");
    assert_eq!(annotations["prometheus.io/port"], "9090");
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations[SECRET_VERSIONS_ANNOTATION], "orders-db=7");
}

#[test]
fn optional_flags_are_left_out_when_unset() {
    let d = build(sample_spec(), 1);
    for name in [
        "routing-key-column",
        "headers-column",
        "attempts-column",
        "routing-key",
        "dead-letter-exchange",
        "processed-retention",
    ] {
        assert_eq!(arg(&d, name), None, "--{name}");
    }
    assert_eq!(arg(&d, "mode"), Some("mark"));
    assert_eq!(arg(&d, "log-format"), Some("json"));
    assert_eq!(arg(&d, "publisher-confirms"), Some("true"));
    assert_eq!(arg(&d, "shutdown-grace"), Some("25s"));
    assert_eq!(
        container(&d).image.as_deref(),
        Some(BuildSettings::default().default_image.as_str())
    );
    let p = pod(&d);
    assert!(p.node_selector.is_none() && p.tolerations.is_none() && p.affinity.is_none());
}

/// The name of the environment variable whose value comes from `secret`.
fn env_from_secret<'a>(deployment: &'a Deployment, secret: &str) -> Option<&'a str> {
    container(deployment)
        .env
        .iter()
        .flatten()
        .find(|env| {
            env.value_from
                .as_ref()
                .and_then(|from| from.secret_key_ref.as_ref())
                .is_some_and(|reference| reference.name == secret)
        })
        .map(|env| env.name.as_str())
}

#[test]
fn amqp10_renders_its_flags_and_none_of_amqp091() {
    let mut spec = sample_spec();
    spec.broker.protocol = BrokerProtocol::Amqp10;
    spec.broker.address = Some("/amq/queue/orders".into());
    let broker_secret = spec.broker.url_secret_ref.name.clone();
    let d = build(spec, 1);
    assert_eq!(arg(&d, "broker-protocol"), Some("amqp10"));
    assert_eq!(arg(&d, "address"), Some("/amq/queue/orders"));
    for refused in ["exchange", "mandatory", "publisher-confirms", "routing-key"] {
        assert_eq!(arg(&d, refused), None, "--{refused}");
    }
    assert_eq!(env_from_secret(&d, &broker_secret), Some("BROKER_URL"));

    // The relay itself accepts what was rendered: parsed as its command line, with the URLs
    // the environment would bring, it resolves to an AMQP 1.0 relay on that address.
    #[derive(clap::Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }
    let argv = container(&d).args.clone().unwrap();
    let mut parsed = <Run as clap::Parser>::try_parse_from(&argv).unwrap().args;
    parsed.table.database_url = Some("postgres://relay@db:5432/orders".into());
    parsed.broker_url = Some("amqp://relay:secret@broker:5672".into());
    parsed.amqp_url = None;
    let config = outbox_relay::config::resolve_run(&parsed).unwrap();
    assert_eq!(config.broker_protocol, BrokerProtocol::Amqp10);
    assert_eq!(config.address.as_deref(), Some("/amq/queue/orders"));
}

#[test]
fn per_key_ordering_reaches_the_pods_and_unordered_renders_nothing_new() {
    let mut spec = sample_spec();
    spec.relay.ordering = crate::crd::RelayOrdering::PerKey;
    spec.database.columns.partition_key = Some("order_id".into());
    let d = build(spec, 1);
    assert_eq!(arg(&d, "ordering"), Some("per-key"));
    assert_eq!(arg(&d, "partition-key-column"), Some("order_id"));
    let plain = build(sample_spec(), 1);
    assert_eq!(arg(&plain, "ordering"), None);
    assert_eq!(arg(&plain, "partition-key-column"), None);
}

#[test]
fn trace_columns_and_cloudevents_reach_the_pods_and_absent_renders_nothing_new() {
    let mut spec = sample_spec();
    spec.database.columns.traceparent = Some("trace_parent".into());
    spec.database.columns.tracestate = Some("trace_state".into());
    spec.broker.cloud_events = Some(crate::crd::CloudEventsSpec {
        mode: Default::default(),
        source: "urn:example:orders".into(),
    });
    let d = build(spec, 1);
    assert_eq!(arg(&d, "traceparent-column"), Some("trace_parent"));
    assert_eq!(arg(&d, "tracestate-column"), Some("trace_state"));
    assert_eq!(arg(&d, "cloudevents"), Some("binary"));
    assert_eq!(arg(&d, "cloudevents-source"), Some("urn:example:orders"));
    let plain = build(sample_spec(), 1);
    assert_eq!(arg(&plain, "cloudevents"), None);
    assert_eq!(arg(&plain, "traceparent-column"), None);
}

fn tracing_spec(sample_ratio: Option<f64>) -> crate::crd::TracingSpec {
    crate::crd::TracingSpec {
        otlp_endpoint: "http://otel-collector.observability:4318".into(),
        sample_ratio,
        headers_secret_ref: Some(crate::crd::OtlpHeadersSecretRef {
            name: "otlp-auth".into(),
            key: "headers".into(),
        }),
    }
}

#[test]
fn tracing_reaches_the_pods_as_the_standard_otel_variables_and_absent_renders_nothing_new() {
    let mut spec = sample_spec();
    spec.relay.tracing = Some(tracing_spec(Some(0.25)));
    let d = build(spec, 1);
    assert_eq!(
        env_value(&d, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        Some("http://otel-collector.observability:4318")
    );
    assert_eq!(
        env_value(&d, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        Some("http/protobuf")
    );
    assert_eq!(env_value(&d, "OTEL_TRACES_SAMPLER"), Some("traceidratio"));
    assert_eq!(env_value(&d, "OTEL_TRACES_SAMPLER_ARG"), Some("0.25"));
    assert_eq!(
        env_value(&d, "OTEL_RESOURCE_ATTRIBUTES"),
        Some("k8s.namespace.name=shop,k8s.pod.name=$(POD_NAME),k8s.deployment.name=orders")
    );
    // The kubelet expands $(POD_NAME) only when POD_NAME is defined before the reference.
    let names: Vec<&str> = container(&d)
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    let position = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert!(
        position("POD_NAME") < position("OTEL_RESOURCE_ATTRIBUTES"),
        "{names:?}"
    );
    // No service name: the binary's own default (outbox-relay) names the spans' service.
    assert!(!names.contains(&"OTEL_SERVICE_NAME"), "{names:?}");

    // Without a ratio the SDK's default sampler stays: no sampler variables.
    let mut spec = sample_spec();
    spec.relay.tracing = Some(crate::crd::TracingSpec {
        headers_secret_ref: None,
        ..tracing_spec(None)
    });
    let d = build(spec, 1);
    assert_eq!(env_value(&d, "OTEL_TRACES_SAMPLER"), None);
    assert_eq!(env_value(&d, "OTEL_TRACES_SAMPLER_ARG"), None);
    assert_eq!(env_from_secret(&d, "otlp-auth"), None);
    assert!(env_value(&d, "OTEL_EXPORTER_OTLP_ENDPOINT").is_some());

    // Absent: not one variable more, so existing Deployments keep their pod-template hash.
    let plain = build(sample_spec(), 1);
    let otel: Vec<&str> = container(&plain)
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .filter(|name| name.starts_with("OTEL_"))
        .collect();
    assert!(otel.is_empty(), "{otel:?}");
    let mut traced = sample_spec();
    traced.relay.tracing = Some(tracing_spec(None));
    assert_ne!(spec_hash(&plain), spec_hash(&build(traced, 1)));
}

#[test]
fn the_otlp_headers_reach_the_pods_by_secret_reference_only() {
    let mut spec = sample_spec();
    spec.relay.tracing = Some(tracing_spec(Some(1.0)));
    let d = build(spec, 1);
    assert_eq!(
        env_from_secret(&d, "otlp-auth"),
        Some("OTEL_EXPORTER_OTLP_HEADERS")
    );
    let headers = container(&d)
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "OTEL_EXPORTER_OTLP_HEADERS")
        .unwrap();
    assert_eq!(headers.value, None, "never by value");
    let selector = headers
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .unwrap();
    assert_eq!(
        (selector.key.as_str(), selector.optional),
        ("headers", Some(false))
    );
    assert_eq!(env_value(&d, "OTEL_TRACES_SAMPLER_ARG"), Some("1"));
}

#[test]
fn amqp091_keeps_the_deployment_it_had_before_protocols() {
    let spec = sample_spec();
    let broker_secret = spec.broker.url_secret_ref.name.clone();
    let d = build(spec, 1);
    // No --broker-protocol and the old variable name: an operator upgrade rolls no pods.
    assert_eq!(arg(&d, "broker-protocol"), None);
    assert_eq!(arg(&d, "address"), None);
    assert_eq!(arg(&d, "exchange"), Some("outbox"));
    assert_eq!(env_from_secret(&d, &broker_secret), Some("AMQP_URL"));
}

/// A spec with every connection-security field: database TLS with a CA from a ConfigMap and a
/// client certificate, both passwords in Secrets, broker TLS with a CA Secret.
fn secure_spec() -> OutboxRelaySpec {
    let mut spec = sample_spec();
    let key_ref = |name: &str| CaKeyRef {
        name: name.into(),
        key: "ca.crt".into(),
    };
    spec.database.password_secret_ref = Some(PasswordSecretRef {
        name: "orders-db-password".into(),
        key: "token".into(),
    });
    spec.database.tls = Some(DatabaseTlsSpec {
        mode: PostgresTlsMode::VerifyFull,
        ca: Some(CaSource {
            secret_key_ref: None,
            config_map_key_ref: Some(key_ref("company-ca")),
        }),
        client_certificate_secret_ref: Some(TlsSecretRef {
            name: "orders-db-client".into(),
        }),
    });
    spec.broker.password_secret_ref = Some(PasswordSecretRef {
        name: "orders-amqp-password".into(),
        key: "password".into(),
    });
    spec.broker.tls = Some(BrokerTlsSpec {
        ca: Some(CaSource {
            secret_key_ref: Some(key_ref("rabbit-ca")),
            config_map_key_ref: None,
        }),
        client_certificate_secret_ref: None,
    });
    spec
}

fn env_value<'a>(deployment: &'a Deployment, name: &str) -> Option<&'a str> {
    container(deployment)
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

#[test]
fn connection_files_are_mounted_whole_read_only_and_named_by_flags_and_libpq_variables() {
    let d = build(secure_spec(), 1);
    let root = files::MOUNT_ROOT;
    assert_eq!(
        arg(&d, "database-password-file"),
        Some(format!("{root}/database-password/password").as_str())
    );
    assert_eq!(
        arg(&d, "broker-password-file"),
        Some(format!("{root}/broker-password/password").as_str())
    );
    assert_eq!(
        arg(&d, "broker-ca-file"),
        Some(format!("{root}/broker-ca/ca.crt").as_str())
    );
    assert_eq!(arg(&d, "broker-client-cert"), None);
    assert_eq!(env_value(&d, "PGSSLMODE"), Some("verify-full"));
    assert_eq!(
        env_value(&d, "PGSSLROOTCERT"),
        Some(format!("{root}/database-ca/ca.crt").as_str())
    );
    assert_eq!(
        env_value(&d, "PGSSLCERT"),
        Some(format!("{root}/database-client/tls.crt").as_str())
    );
    assert_eq!(
        env_value(&d, "PGSSLKEY"),
        Some(format!("{root}/database-client/tls.key").as_str())
    );

    let volumes = pod(&d).volumes.clone().unwrap();
    let mounts = container(&d).volume_mounts.clone().unwrap();
    assert_eq!(volumes.len(), 5, "{volumes:?}");
    assert_eq!(mounts.len(), volumes.len());
    for mount in &mounts {
        // Whole volumes: with subPath the kubelet would never update a rotated file.
        assert_eq!(mount.sub_path, None, "{mount:?}");
        assert_eq!(mount.read_only, Some(true), "{mount:?}");
    }
    let volume = |name: &str| volumes.iter().find(|v| v.name == name).unwrap();
    let password = volume("database-password").secret.clone().unwrap();
    assert_eq!(password.secret_name.as_deref(), Some("orders-db-password"));
    let item = &password.items.unwrap()[0];
    assert_eq!(
        (item.key.as_str(), item.path.as_str()),
        ("token", "password")
    );
    assert_eq!(password.default_mode, Some(0o440));
    let ca = volume("database-ca").config_map.clone().unwrap();
    assert_eq!(ca.name, "company-ca");
    let client = volume("database-client").secret.clone().unwrap();
    let keys: Vec<_> = client.items.unwrap().into_iter().map(|i| i.key).collect();
    assert_eq!(keys, ["tls.crt", "tls.key"]);
    // The group-readable files are the relay user's through the pod's fsGroup.
    let security = pod(&d).security_context.clone().unwrap();
    assert_eq!(security.fs_group, Some(NON_ROOT_UID));
}

#[test]
fn a_transaction_pool_gets_the_pool_mode_flag_and_the_session_url_from_its_secret() {
    let mut spec = sample_spec();
    spec.database.pool_mode = Some(crate::crd::PoolMode::Transaction);
    spec.database.session_url_secret_ref = Some(crate::crd::SecretKeyRef {
        name: "orders-db-direct".into(),
        key: "url".into(),
    });
    let d = build(spec, 1);
    assert_eq!(arg(&d, "database-pool-mode"), Some("transaction"));
    assert_eq!(
        env_from_secret(&d, "orders-db-direct"),
        Some("SESSION_DATABASE_URL")
    );
    let plain = build(sample_spec(), 1);
    assert_eq!(arg(&plain, "database-pool-mode"), None);
}

#[test]
fn verify_full_without_a_ca_trusts_the_system_store_and_plain_specs_mount_nothing() {
    let mut spec = sample_spec();
    spec.database.tls = Some(DatabaseTlsSpec::default());
    let d = build(spec, 1);
    assert_eq!(env_value(&d, "PGSSLMODE"), Some("verify-full"));
    assert_eq!(env_value(&d, "PGSSLROOTCERT"), Some("system"));
    assert_eq!(pod(&d).volumes, None);

    let plain = build(sample_spec(), 1);
    assert_eq!(pod(&plain).volumes, None);
    assert_eq!(container(&plain).volume_mounts, None);
    assert_eq!(pod(&plain).security_context.clone().unwrap().fs_group, None);
    assert_eq!(env_value(&plain, "PGSSLMODE"), None);
    assert_eq!(arg(&plain, "database-password-file"), None);
}

#[test]
fn pods_run_restricted() {
    let d = build(sample_spec(), 1);
    let c = container(&d);
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_ref().unwrap(),
        &vec!["ALL".to_string()]
    );
    assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    let psc = pod(&d).security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );
}

#[test]
fn probes_and_metrics_port_are_named() {
    let d = build(sample_spec(), 1);
    let c = container(&d);
    let port = &c.ports.as_ref().unwrap()[0];
    assert_eq!(port.name.as_deref(), Some("metrics"));
    assert_eq!(port.container_port, 9090);
    let path = |probe: &Option<Probe>| {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.port, IntOrString::String("metrics".into()));
        get.path.clone().unwrap()
    };
    assert_eq!(path(&c.liveness_probe), "/healthz");
    assert_eq!(path(&c.readiness_probe), "/readyz");
}

#[test]
fn labels_owner_and_selector_follow_the_relay() {
    let d = build(sample_spec(), 1);
    assert_eq!(d.metadata.name.as_deref(), Some("orders"));
    assert_eq!(d.metadata.namespace.as_deref(), Some("shop"));
    let labels = d.metadata.labels.as_ref().unwrap();
    for key in [
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
        "app.kubernetes.io/part-of",
        "app.kubernetes.io/managed-by",
    ] {
        assert!(labels.contains_key(key), "{key}");
    }
    let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.kind, "OutboxRelay");
    assert_eq!(owner.api_version, "outboxrelay.io/v1beta1");
    assert_eq!(owner.name, "orders");
    assert_eq!(owner.uid, "uid-orders");
    assert_eq!(owner.controller, Some(true));
    let selector = d.spec.selector.match_labels.clone().unwrap();
    assert_eq!(
        selector,
        selector_labels(&sample_relay("orders", sample_spec()))
    );
    assert_eq!(
        selector_string(&sample_relay("orders", sample_spec())),
        "app.kubernetes.io/instance=orders,app.kubernetes.io/name=outbox-relay"
    );
}

#[test]
fn the_hash_changes_with_the_spec_and_only_then() {
    let a = build(sample_spec(), 1);
    let b = build(sample_spec(), 1);
    assert_eq!(spec_hash(&a), spec_hash(&b));
    assert!(spec_hash(&a).is_some());
    let mut spec = sample_spec();
    spec.relay.batch_size = 42;
    assert_ne!(spec_hash(&a), spec_hash(&build(spec, 1)));
    assert_ne!(spec_hash(&a), spec_hash(&build(sample_spec(), 2)));
}

#[tokio::test]
async fn no_secret_value_reaches_the_deployment() {
    use crate::test_support::mock_service;
    use crate::test_support::secret;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};

    // Dereference real Secret objects carrying a recognisable password, then build from what
    // the reconciler has in hand: the password must not appear anywhere in the result.
    let (service, mut handle) = mock_service::pair();
    let server = tokio::spawn(async move {
        for (name, key, value) in [
            (
                "orders-db",
                "url",
                format!("postgres://app:{LEAK_CANARY}@db:5432/app"),
            ),
            (
                "orders-amqp",
                "url",
                format!("amqp://app:{LEAK_CANARY}@mq:5672/%2f"),
            ),
            ("otlp-auth", "headers", format!("x-api-key={LEAK_CANARY}")),
        ] {
            let (request, send) = handle.next_request().await.expect("a Secret GET");
            assert!(request.uri().path().ends_with(&format!("/secrets/{name}")));
            let body = serde_json::to_vec(&secret(name, key, &value)).unwrap();
            send.send_response(http::Response::builder().body(body.into()).unwrap());
        }
    });
    let client = kube::Client::new(service, "shop");
    let secrets = ObjectReader::<Secret>::new(client.clone(), "shop", None);
    let config_maps = ObjectReader::<ConfigMap>::new(client, "shop", None);
    let relay = sample_relay("orders", full_spec_with_default_keys());
    let found = dereference_secrets(&secrets, &config_maps, &relay.spec)
        .await
        .unwrap();
    server.await.unwrap();
    assert_eq!(
        found.database.url().password().as_deref(),
        Some(LEAK_CANARY)
    );

    let plan = validate(&relay.spec).unwrap();
    let d = build_deployment(
        &relay,
        &plan,
        &found.fingerprint(),
        2,
        &BuildSettings::default(),
    );
    let text = serde_json::to_string(&d).unwrap();
    assert!(!text.contains(LEAK_CANARY), "{text}");
    assert!(!text.contains("postgres://"), "{text}");
    assert!(!text.contains("amqp://"), "{text}");
    assert!(!format!("{found:?}").contains(LEAK_CANARY));
}

fn full_spec_with_default_keys() -> OutboxRelaySpec {
    let mut spec = full_spec();
    spec.database.url_secret_ref.key = "url".into();
    spec.broker.url_secret_ref.key = "url".into();
    spec.relay.tracing = Some(tracing_spec(Some(0.5)));
    spec
}
