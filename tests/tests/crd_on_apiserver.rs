//! The CRD on a real kube-apiserver: accepted as a structural schema with its CEL rules (and
//! their cost budget), documented for `kubectl explain`, the samples apply, and every kind of
//! bad OutboxRelay is refused by the server with a message that names the field.

use std::path::Path;
use std::time::Duration;

use outbox_tests::control_plane::ControlPlane;
use outbox_tests::{process, unique};

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
    let mut command = plane.kubectl();
    command.args(["apply", "--validate=strict", "-n", namespace, "-f", "-"]);
    let output = process::output_with_stdin(&mut command, manifest).expect("run kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
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
        "apiVersion: outboxrelay.io/v1alpha1
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
