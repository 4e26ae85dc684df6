//! The CRD on a real kube-apiserver: accepted as a structural schema with its CEL rules (and
//! their cost budget), documented for `kubectl explain`, the samples apply, and every kind of
//! bad OutboxRelay is refused by the server with a message that names the field. Both served
//! versions carry every field, the deprecated one with a warning, and a stored version can be
//! dropped only once the operator's storage migration ran.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use outbox_operator::runtime::storage_migration::{Scope, migrate_storage};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::{api_versions, process, unique};

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The CRD from `crds/`, applied and Established once per test binary.
fn plane_with_crd() -> &'static ControlPlane {
    static APPLIED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let plane = ControlPlane::shared();
    APPLIED.get_or_init(|| {
        let crd = repo("crds/outboxrelays.yaml");
        plane
            .kubectl_ok(&["apply", "--server-side", "-f", crd.to_str().unwrap()])
            .expect("the real API server accepts the CRD");
        // Polled rather than `kubectl wait --for=condition=Established`: kubectl 1.34's wait
        // fails at once, instead of waiting, while the new CRD has no conditions yet.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let established = loop {
            let status = plane.kubectl_ok(&[
                "get",
                "crd/outboxrelays.outboxrelay.io",
                "-o",
                r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#,
            ]);
            if matches!(&status, Ok(s) if s.trim() == "True") {
                break true;
            }
            if std::time::Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        assert!(established, "the CRD did not become Established in 60 s");
    });
    plane
}

/// `kubectl apply --validate=strict -f -` of `manifest` in `namespace`: (ok, stdout+stderr).
fn apply(plane: &ControlPlane, namespace: &str, manifest: &str) -> (bool, String) {
    api_versions::kubectl_stdin(
        plane,
        &["apply", "--validate=strict", "-n", namespace],
        manifest,
    )
}

fn namespace(plane: &ControlPlane, prefix: &str) -> String {
    let ns = unique(prefix).replace('_', "-");
    plane.create_namespace(&ns).unwrap();
    ns
}

#[test]
fn the_real_api_server_accepts_the_crd_and_reports_its_version() {
    let plane = plane_with_crd();
    let version = plane.kubectl_ok(&["version", "-o", "json"]).unwrap();
    let version: serde_json::Value = serde_json::from_str(&version).unwrap();
    let server = version["serverVersion"]["gitVersion"].as_str().unwrap();
    // The release OUTBOX_KUBERNETES picks (make test runs this file on the oldest too).
    let expected = plane.release.version().unwrap();
    assert_eq!(server, expected, "the control plane reports {server}");
    let crd = plane
        .kubectl_ok(&["get", "crd", "outboxrelays.outboxrelay.io", "-o", "json"])
        .unwrap();
    let crd: serde_json::Value = serde_json::from_str(&crd).unwrap();
    let conditions = crd["status"]["conditions"].as_array().unwrap();
    for kind in ["Established", "NamesAccepted"] {
        assert!(
            conditions
                .iter()
                .any(|c| c["type"] == kind && c["status"] == "True"),
            "{kind} missing in {conditions:?}"
        );
    }
    // A non-structural schema would show up as a NonStructuralSchema condition.
    assert!(
        !conditions
            .iter()
            .any(|c| c["type"] == "NonStructuralSchema"),
        "{conditions:?}"
    );
    let resources = plane
        .kubectl_ok(&["api-resources", "--api-group=outboxrelay.io"])
        .unwrap();
    assert!(resources.contains("obr"), "{resources}");
}

#[test]
fn kubectl_explain_prints_the_field_docs() {
    let plane = plane_with_crd();
    // The server publishes a new CRD's OpenAPI a moment after it is Established.
    let text = plane
        .kubectl_eventually(
            &["explain", "outboxrelays.spec.scaling"],
            Duration::from_secs(60),
        )
        .unwrap();
    for field in [
        "minReplicas",
        "maxReplicas",
        "targetBacklogPerReplica",
        "pollingInterval",
    ] {
        assert!(text.contains(field), "explain lacks {field}:\n{text}");
    }
    let text = plane
        .kubectl_ok(&["explain", "outboxrelays.spec.scaling.maxReplicas"])
        .unwrap();
    assert!(
        text.contains("DESCRIPTION") && text.lines().count() > 4,
        "{text}"
    );
    let text = plane
        .kubectl_ok(&["explain", "outboxrelays.spec.database.tls"])
        .unwrap();
    for field in ["mode", "ca", "clientCertificateSecretRef", "sslmode"] {
        assert!(text.contains(field), "explain lacks {field}:\n{text}");
    }
    let text = plane
        .kubectl_ok(&["explain", "outboxrelays.spec.broker.passwordSecretRef"])
        .unwrap();
    assert!(text.contains("mounted as a file"), "{text}");
    let text = plane
        .kubectl_ok(&["explain", "outboxrelays.spec.relay.tracing"])
        .unwrap();
    for field in [
        "otlpEndpoint",
        "sampleRatio",
        "headersSecretRef",
        "OTLP/HTTP",
    ] {
        assert!(text.contains(field), "explain lacks {field}:\n{text}");
    }
}

#[test]
fn the_samples_apply_with_kustomize() {
    let plane = plane_with_crd();
    let ns = namespace(plane, "samples");
    let samples = repo("config/samples");
    let out = plane
        .kubectl_ok(&[
            "apply",
            "--validate=strict",
            "-n",
            &ns,
            "-k",
            samples.to_str().unwrap(),
        ])
        .unwrap();
    assert!(out.contains("outboxrelay.outboxrelay.io/orders"), "{out}");
    assert!(out.contains("outboxrelay.outboxrelay.io/invoices"), "{out}");
    let names = plane
        .kubectl_ok(&["get", "obr", "-n", &ns, "-o", "name"])
        .unwrap();
    assert_eq!(names.lines().count(), 4, "{names}");
}

/// A valid OutboxRelay with `spec_extra` merged into its spec (YAML fragment, indented).
fn relay(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: outboxrelay.io/v1beta1
kind: OutboxRelay
metadata:
  name: {name}
spec:
{spec}"
    )
}

const BASE: &str = "  database:
    urlSecretRef: {name: db}
    table: outbox_messages
  broker:
    urlSecretRef: {name: amqp}
    exchange: outbox
";

#[test]
fn invalid_outbox_relays_are_refused_with_the_field_named() {
    let plane = plane_with_crd();
    let ns = namespace(plane, "invalid");
    let (ok, out) = apply(plane, &ns, &relay("valid", BASE));
    assert!(ok, "the base spec must be valid: {out}");
    let secure = BASE
        .replace(
            "    table: outbox_messages\n",
            "    table: outbox_messages\n    passwordSecretRef: {name: db-password}\n    tls:\n      \
             ca: {configMapKeyRef: {name: company-ca}}\n      clientCertificateSecretRef: {name: db-client}\n",
        )
        .replace(
            "    exchange: outbox\n",
            "    exchange: outbox\n    passwordSecretRef: {name: amqp-password, key: pw}\n    \
             tls: {ca: {secretKeyRef: {name: rabbit-ca}}}\n",
        );
    let (ok, out) = apply(plane, &ns, &relay("secure", &secure));
    assert!(
        ok,
        "every connection-security field together is valid: {out}"
    );
    let applied = plane
        .kubectl_ok(&[
            "get",
            "obr",
            "secure",
            "-n",
            &ns,
            "-o",
            "jsonpath={.spec.database.tls}",
        ])
        .unwrap();
    // The API server filled in the defaults: verify-full, and the CA's key.
    assert!(
        applied.contains("\"mode\":\"verify-full\"") && applied.contains("\"key\":\"ca.crt\""),
        "{applied}"
    );
    plane
        .kubectl_ok(&["delete", "obr", "secure", "-n", &ns])
        .unwrap();

    let cases: &[(&str, String, &[&str])] = &[
        (
            "a string where an integer goes",
            format!("{BASE}  relay:\n    batchSize: many\n"),
            &["spec.relay.batchSize"],
        ),
        (
            "a batch size above the limit",
            format!("{BASE}  relay:\n    batchSize: 20000\n"),
            &["spec.relay.batchSize", "10000"],
        ),
        (
            "minReplicas above maxReplicas (CEL)",
            format!("{BASE}  scaling:\n    minReplicas: 5\n    maxReplicas: 2\n"),
            &[
                "spec.scaling",
                "minReplicas must not be greater than maxReplicas",
            ],
        ),
        (
            "fallback replicas above maxReplicas (CEL)",
            format!("{BASE}  scaling:\n    maxReplicas: 2\n    fallback:\n      replicas: 3\n"),
            &[
                "spec.scaling",
                "fallback.replicas must not be greater than maxReplicas",
            ],
        ),
        (
            "an unknown field under strict field validation",
            format!("{BASE}  relay:\n    batchSise: 10\n"),
            &["unknown field", "spec.relay.batchSise"],
        ),
        (
            "a bad enum value",
            format!("{BASE}  relay:\n    deliveryMode: archive\n"),
            &["spec.relay.deliveryMode", "archive", "mark", "delete"],
        ),
        (
            "a table name that is not an identifier",
            BASE.replace("outbox_messages", "\"orders; drop table x\""),
            &["spec.database.table"],
        ),
        (
            "a duration that is not a duration",
            format!("{BASE}  scaling:\n    pollingInterval: soon\n"),
            &["spec.scaling.pollingInterval"],
        ),
        (
            "protocol amqp10 without an address (CEL)",
            BASE.replace("    exchange: outbox\n", "    protocol: amqp10\n"),
            &[
                "spec.broker.address",
                "address is required with protocol amqp10",
            ],
        ),
        (
            "an exchange under amqp10 (CEL)",
            BASE.replace(
                "    exchange: outbox\n",
                "    exchange: outbox\n    protocol: amqp10\n    address: orders\n",
            ),
            &[
                "spec.broker.exchange",
                "exchange is an AMQP 0-9-1 field with no meaning under amqp10",
            ],
        ),
        (
            "mandatory under amqp10 (CEL)",
            BASE.replace(
                "    exchange: outbox\n",
                "    protocol: amqp10\n    address: orders\n    mandatory: true\n",
            ),
            &["spec.broker.mandatory", "mandatory is an AMQP 0-9-1 field"],
        ),
        (
            "a routing-key column under amqp10 (CEL, across sections)",
            BASE.replace(
                "    exchange: outbox\n",
                "    protocol: amqp10\n    address: orders\n",
            )
            .replace(
                "    table: outbox_messages\n",
                "    table: outbox_messages\n    columns:\n      routingKey: topic\n",
            ),
            &[
                "spec.database.columns.routingKey",
                "columns.routingKey is an AMQP 0-9-1 mapping",
            ],
        ),
        (
            "an address under amqp091 (CEL)",
            format!("{BASE}    address: orders\n"),
            &["spec.broker.address", "address is an AMQP 1.0 field"],
        ),
        (
            "perKey ordering without a partition key (CEL)",
            format!("{BASE}  relay:\n    ordering: perKey\n"),
            &["spec.relay.ordering", "set database.columns.partitionKey"],
        ),
        (
            "a partition key without perKey ordering (CEL)",
            BASE.replace(
                "    table: outbox_messages\n",
                "    table: outbox_messages\n    columns:\n      partitionKey: order_id\n",
            ),
            &[
                "spec.database.columns.partitionKey",
                "only has a meaning with relay.ordering perKey",
            ],
        ),
        (
            "verify-ca without a CA (CEL)",
            BASE.replace(
                "    table: outbox_messages\n",
                "    table: outbox_messages\n    tls: {mode: verify-ca}\n",
            ),
            &["spec.database.tls.ca", "mode verify-ca checks"],
        ),
        (
            "a CA with a mode that verifies nothing (CEL)",
            BASE.replace(
                "    table: outbox_messages\n",
                "    table: outbox_messages\n    tls: {mode: prefer, ca: {secretKeyRef: {name: db-ca}}}\n",
            ),
            &["spec.database.tls.ca", "only used to verify"],
        ),
        (
            "a client certificate with TLS disabled (CEL)",
            BASE.replace(
                "    table: outbox_messages\n",
                "    table: outbox_messages\n    tls: {mode: disable, clientCertificateSecretRef: {name: c}}\n",
            ),
            &["spec.database.tls.clientCertificateSecretRef", "mode disable"],
        ),
        (
            "a CA from both a Secret and a ConfigMap (CEL)",
            format!(
                "{BASE}    tls: {{ca: {{secretKeyRef: {{name: a}}, configMapKeyRef: {{name: b}}}}}}\n"
            ),
            &["spec.broker.tls.ca", "exactly one of secretKeyRef and configMapKeyRef"],
        ),
        (
            "a transaction pool without a session URL (CEL)",
            BASE.replace(
                "    table: outbox_messages\n",
                "    table: outbox_messages\n    poolMode: transaction\n",
            ),
            &["spec.database.sessionUrlSecretRef", "needs database.sessionUrlSecretRef"],
        ),
        (
            "an sslmode libpq does not know",
            BASE.replace(
                "    table: outbox_messages\n",
                "    table: outbox_messages\n    tls: {mode: strict}\n",
            ),
            &["spec.database.tls.mode", "verify-full"],
        ),
        (
            "an unknown protocol",
            format!("{BASE}    protocol: amqp\n"),
            &["spec.broker.protocol", "amqp091", "amqp10"],
        ),
        (
            "a maxRate of zero (issue 47)",
            format!("{BASE}  relay:\n    maxRate: 0\n"),
            &["spec.relay.maxRate", "greater than or equal to 1"],
        ),
        (
            "a negative maxRate (issue 47)",
            format!("{BASE}  relay:\n    maxRate: -5\n"),
            &["spec.relay.maxRate", "greater than or equal to 1"],
        ),
        (
            "an OTLP endpoint that is not an http(s) URL (CEL)",
            format!("{BASE}  relay:\n    tracing: {{otlpEndpoint: \"otel-collector:4317\"}}\n"),
            &[
                "spec.relay.tracing.otlpEndpoint",
                "must be an http:// or https:// URL with a host",
            ],
        ),
        (
            "an OTLP endpoint without a host (CEL)",
            format!("{BASE}  relay:\n    tracing: {{otlpEndpoint: \"http:///v1\"}}\n"),
            &[
                "spec.relay.tracing.otlpEndpoint",
                "must be an http:// or https:// URL with a host",
            ],
        ),
        (
            "an OTLP endpoint with a password in it (CEL)",
            format!(
                "{BASE}  relay:\n    tracing: {{otlpEndpoint: \"https://u:pw@otlp.example.com\"}}\n"
            ),
            &[
                "spec.relay.tracing.otlpEndpoint",
                "must not carry a user or password",
                "headersSecretRef",
            ],
        ),
        (
            "a tracing block without its endpoint",
            format!("{BASE}  relay:\n    tracing: {{sampleRatio: 0.5}}\n"),
            &["spec.relay.tracing.otlpEndpoint", "Required"],
        ),
        (
            "a sample ratio above 1",
            format!(
                "{BASE}  relay:\n    tracing: {{otlpEndpoint: \"http://c:4318\", sampleRatio: 1.5}}\n"
            ),
            &["spec.relay.tracing.sampleRatio", "less than or equal to 1"],
        ),
        (
            "a negative sample ratio",
            format!(
                "{BASE}  relay:\n    tracing: {{otlpEndpoint: \"http://c:4318\", sampleRatio: -0.1}}\n"
            ),
            &["spec.relay.tracing.sampleRatio", "greater than or equal to 0"],
        ),
        (
            "a missing required field",
            BASE.replace("    exchange: outbox\n", "")
                .replace("    urlSecretRef: {name: amqp}\n", "    exchange: outbox\n"),
            &["spec.broker.urlSecretRef", "Required"],
        ),
    ];
    let mut failures = Vec::new();
    for (i, (what, spec, expected)) in cases.iter().enumerate() {
        let (ok, out) = apply(plane, &ns, &relay(&format!("bad-{i}"), spec));
        let named = expected.iter().all(|e| out.contains(e));
        if ok || !named {
            failures.push(format!(
                "{what}: accepted={ok}, expected {expected:?} in:\n{out}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let names = plane
        .kubectl_ok(&["get", "obr", "-n", &ns, "-o", "name"])
        .unwrap();
    assert_eq!(names.trim(), "outboxrelay.outboxrelay.io/valid");
}

/// The fixture's two OutboxRelays set every field of the schema (Kubernetes' own types once
/// each): a field added to the CRD without a value there fails here, so the round trip below
/// covers it too.
#[test]
fn the_every_field_fixture_sets_every_field() {
    let crd: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo("crds/outboxrelays.yaml")).unwrap())
            .unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let mut fields = BTreeSet::new();
    api_versions::schema_leaves(
        &schema["spec"],
        "spec",
        api_versions::KUBERNETES_TYPES,
        &mut fields,
    );
    api_versions::schema_leaves(&schema["status"], "status", &[], &mut fields);
    assert!(fields.len() > 100, "{fields:?}");
    // A leaf of the schema (a map such as podLabels included) is a leaf of the values too.
    let leaves: Vec<&str> = fields.iter().map(String::as_str).collect();
    let mut set = BTreeSet::new();
    for relay in api_versions::every_field_relays() {
        api_versions::value_leaves(&relay["spec"], "spec", &leaves, &mut set);
    }
    let status = api_versions::every_status_field();
    api_versions::value_leaves(&status["status"], "status", &leaves, &mut set);
    let missing: Vec<&String> = fields.difference(&set).collect();
    assert!(
        missing.is_empty(),
        "tests/fixtures lacks a value for {missing:#?}"
    );
    let unknown: Vec<&String> = set.difference(&fields).collect();
    assert!(
        unknown.is_empty(),
        "tests/fixtures sets fields the CRD lacks: {unknown:#?}"
    );
}

/// Every field written through the deprecated v1alpha1 reads back the same through v1beta1
/// (the storage version) and through v1alpha1, and the other way round; v1alpha1's requests
/// carry the deprecation warning, v1beta1's none; `kubectl get obr` picks v1beta1.
#[test]
fn every_field_round_trips_through_both_versions_and_v1alpha1_warns() {
    let plane = plane_with_crd();
    let ns = namespace(plane, "versions");
    let fixture = std::fs::read_to_string(api_versions::every_field_path()).unwrap();
    let (ok, out) =
        api_versions::kubectl_stdin(plane, &["apply", "--validate=strict", "-n", &ns], &fixture);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!(
            "Warning: {}",
            outbox_operator::crd::DEPRECATION_WARNING
        )),
        "kubectl shows no deprecation warning for v1alpha1:\n{out}"
    );
    let status = api_versions::every_status_field();
    let relays = api_versions::every_field_relays();
    for relay in &relays {
        let name = relay["metadata"]["name"].as_str().unwrap();
        let (ok, out) = plane
            .kubectl_output(&[
                "patch",
                &format!("outboxrelays.v1alpha1.outboxrelay.io/{name}"),
                "-n",
                &ns,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ])
            .map(|(ok, stdout, stderr)| (ok, stdout + &stderr))
            .unwrap();
        assert!(ok, "{out}");
        let alpha = api_versions::get_json(
            plane,
            &[
                &format!("outboxrelays.v1alpha1.outboxrelay.io/{name}"),
                "-n",
                &ns,
            ],
        )
        .unwrap();
        let beta = api_versions::get_json(
            plane,
            &[
                &format!("outboxrelays.v1beta1.outboxrelay.io/{name}"),
                "-n",
                &ns,
            ],
        )
        .unwrap();
        assert_eq!(alpha["apiVersion"], "outboxrelay.io/v1alpha1");
        assert_eq!(beta["apiVersion"], "outboxrelay.io/v1beta1");
        for part in ["spec", "status"] {
            assert_eq!(
                alpha[part], beta[part],
                "{name}: {part} differs between the versions"
            );
        }
        // What was written is what is read (plus the defaults the server filled in).
        api_versions::contains(&beta["spec"], &relay["spec"], "spec")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        api_versions::contains(&beta["status"], &status["status"], "status")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The typed client (the operator's) reads every field at v1beta1.
        let typed: outbox_operator::OutboxRelay = serde_json::from_value(beta.clone())
            .unwrap_or_else(|e| panic!("{name}: the operator cannot read it: {e}"));
        let spec = serde_json::to_value(&typed.spec).unwrap();
        api_versions::contains(&spec, &relay["spec"], "spec")
            .unwrap_or_else(|e| panic!("{name} through the operator's type: {e}"));
        let preferred = plane
            .kubectl_ok(&[
                "get",
                "obr",
                name,
                "-n",
                &ns,
                "-o",
                "jsonpath={.apiVersion}",
            ])
            .unwrap();
        assert_eq!(preferred, "outboxrelay.io/v1beta1");

        // The other way: written through v1beta1 (no warning), read through v1alpha1.
        let mut copy = relay.clone();
        copy["apiVersion"] = "outboxrelay.io/v1beta1".into();
        copy["metadata"]["name"] = format!("{name}-beta").into();
        let (ok, out) = api_versions::kubectl_stdin(
            plane,
            &["create", "--validate=strict", "-n", &ns],
            &copy.to_string(),
        );
        assert!(ok, "{out}");
        assert!(!out.contains("Warning"), "a warning for v1beta1: {out}");
        let back = api_versions::get_json(
            plane,
            &[
                &format!("outboxrelays.v1alpha1.outboxrelay.io/{name}-beta"),
                "-n",
                &ns,
            ],
        )
        .unwrap();
        assert_eq!(back["apiVersion"], "outboxrelay.io/v1alpha1");
        assert_eq!(
            back["spec"], beta["spec"],
            "{name}: written at v1beta1, read at v1alpha1"
        );
    }
    // `kubectl get` lists them through either version.
    for resource in [
        "outboxrelays.v1alpha1.outboxrelay.io",
        "outboxrelays.v1beta1.outboxrelay.io",
    ] {
        let names = plane
            .kubectl_ok(&["get", resource, "-n", &ns, "-o", "name"])
            .unwrap();
        assert_eq!(names.lines().count(), 4, "{resource}: {names}");
    }
    let _ = plane.kubectl_output(&["delete", "namespace", &ns, "--wait=false"]);
}

/// A CRD whose storedVersions still names v1alpha1 cannot drop it (the API server refuses);
/// after the operator's storage migration rewrote every object, it can. On a CRD of its own
/// group (the real one is shared by this binary's tests), with the operator's migration code.
#[test]
fn dropping_v1alpha1_is_refused_until_the_storage_migration_ran() {
    let plane = ControlPlane::shared();
    let group = format!("{}.example.com", unique("migrate").replace('_', "-"));
    let previous = std::fs::read_to_string(api_versions::previous_crd_path()).unwrap();
    let (old_crd, crd_name) = api_versions::renamed_crd(&previous, &group);
    let (ok, out) =
        api_versions::kubectl_stdin(plane, &["apply", "--server-side"], &old_crd.to_string());
    assert!(ok, "{out}");
    api_versions::wait_served(plane, &group, "v1alpha1").unwrap();
    let ns = namespace(plane, "migrate");
    let object = |name: &str, version: &str| {
        relay(name, BASE)
            .replace(
                "apiVersion: outboxrelay.io/v1beta1",
                &format!("apiVersion: {group}/{version}"),
            )
            .replace(
                "kind: OutboxRelay",
                &format!("kind: {}", api_versions::RENAMED_KIND),
            )
    };
    let (ok, out) =
        api_versions::kubectl_stdin(plane, &["create", "-n", &ns], &object("old", "v1alpha1"));
    assert!(ok, "{out}");

    // This release's CRD: v1beta1 stored; storedVersions now names both.
    let (new_crd, _) = api_versions::renamed_crd(&outbox_operator::crd::crd_yaml(), &group);
    let (ok, out) =
        api_versions::kubectl_stdin(plane, &["apply", "--server-side"], &new_crd.to_string());
    assert!(ok, "{out}");
    api_versions::wait_served(plane, &group, "v1beta1").unwrap();
    let (ok, out) =
        api_versions::kubectl_stdin(plane, &["create", "-n", &ns], &object("new", "v1beta1"));
    assert!(ok, "{out}");
    assert_eq!(
        api_versions::stored_versions(plane, &crd_name).unwrap(),
        ["v1alpha1", "v1beta1"]
    );

    // A later release that serves v1beta1 only is refused while v1alpha1 may still be in etcd.
    let mut later = new_crd.clone();
    later["spec"]["versions"] = serde_json::Value::Array(
        later["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["name"] == "v1beta1")
            .cloned()
            .collect(),
    );
    let (ok, out) =
        api_versions::kubectl_stdin(plane, &["apply", "--server-side"], &later.to_string());
    assert!(!ok, "dropping a stored version was accepted: {out}");
    // 1.34 says "must appear in spec.versions", 1.37 "missing from spec.versions; v1alpha1 was
    // previously a storage version, and must remain in spec.versions until a storage
    // migration ...".
    assert!(
        out.contains(r#"status.storedVersions[0]: Invalid value: "v1alpha1""#)
            && out.contains("spec.versions"),
        "{out}"
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcome = runtime
        .block_on(async {
            let client = plane.admin_client().await?;
            migrate_storage(&client, &crd_name, &Scope::Cluster).await
        })
        .unwrap();
    assert_eq!(outcome.stored_before, ["v1alpha1", "v1beta1"]);
    assert_eq!(outcome.storage_version, "v1beta1");
    assert_eq!(outcome.rewritten, 2, "{outcome:?}");
    assert!(outcome.stored_versions_updated);
    assert_eq!(
        api_versions::stored_versions(plane, &crd_name).unwrap(),
        ["v1beta1"]
    );
    // Nothing left to do the second time.
    let again = runtime
        .block_on(async {
            let client = plane.admin_client().await?;
            migrate_storage(&client, &crd_name, &Scope::Cluster).await
        })
        .unwrap();
    assert_eq!(again.rewritten, 0, "{again:?}");

    let (ok, out) =
        api_versions::kubectl_stdin(plane, &["apply", "--server-side"], &later.to_string());
    assert!(
        ok,
        "v1alpha1 could not be dropped after the migration: {out}"
    );
    for name in ["old", "new"] {
        let read = api_versions::get_json(
            plane,
            &[
                &format!("{}.v1beta1.{group}/{name}", api_versions::RENAMED_PLURAL),
                "-n",
                &ns,
            ],
        )
        .unwrap();
        assert_eq!(
            read["spec"]["database"]["table"], "outbox_messages",
            "{read}"
        );
    }
    let _ = plane.kubectl_output(&["delete", "crd", &crd_name, "--wait=false"]);
    let _ = plane.kubectl_output(&["delete", "namespace", &ns, "--wait=false"]);
}

/// `outbox-operator migrate-storage`, the step a namespaced install leaves to an administrator:
/// with this release's CRD just applied nothing is stored at v1alpha1, so it says so and
/// leaves storedVersions at `["v1beta1"]`.
#[test]
fn migrate_storage_reports_what_it_did() {
    let plane = plane_with_crd();
    let output = std::process::Command::new(process::binary("outbox-operator"))
        .arg("migrate-storage")
        .env("KUBECONFIG", &plane.kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(r#"storedVersions was ["v1beta1"]; 0 OutboxRelays rewritten; storedVersions is ["v1beta1"]"#),
        "{stdout}"
    );
}
