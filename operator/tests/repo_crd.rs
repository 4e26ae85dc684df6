//! The CRD file never drifts from the Rust types, and every sample a user might copy is
//! accepted by the generated schema (structure, patterns, ranges and CEL rules) and by the
//! operator's own validation.

use std::path::{Path, PathBuf};

use kube::core::cel::Validator;
use outbox_operator::crd::OutboxRelay;
use outbox_operator::crd::crd_yaml;
use outbox_operator::reconcile::input::validate::validate;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn schema() -> Value {
    let crd: Value = serde_yaml::from_str(&crd_yaml()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

#[test]
fn crd_file_matches_the_rust_types() {
    let generated = crd_yaml();
    let path = repo_root().join("crds/outboxrelays.yaml");
    let on_disk = std::fs::read_to_string(&path).unwrap();
    assert!(
        generated == on_disk,
        "{} is out of date; run `make crds`",
        path.display()
    );
    let chart_copy = repo_root().join("charts/outbox-relay-operator/crds/outboxrelays.yaml");
    if chart_copy.exists() {
        assert!(
            std::fs::read_to_string(&chart_copy).unwrap() == generated,
            "{} is out of date; run `make crds`",
            chart_copy.display()
        );
    }
}

#[test]
fn crd_has_the_promised_shape() {
    let crd: Value = serde_yaml::from_str(&crd_yaml()).unwrap();
    assert_eq!(crd["spec"]["group"], "outboxrelay.io");
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "obr");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1beta1");
    assert_eq!(version["storage"], true);
    let scale = &version["subresources"]["scale"];
    assert_eq!(scale["specReplicasPath"], ".spec.replicas");
    assert_eq!(scale["statusReplicasPath"], ".status.replicas");
    assert_eq!(scale["labelSelectorPath"], ".status.selector");
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Ready", "Suspended", "Replicas", "Backlog", "Oldest", "Age"]
    );
    let conditions =
        &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"][0], "type");
}

/// v1beta1 is stored; v1alpha1 is still served, deprecated with a warning, with the very same
/// schema, subresources and columns (which is why the CRD has no conversion webhook: the API
/// server converts between equal schemas by rewriting `apiVersion`).
#[test]
fn v1alpha1_is_served_deprecated_with_the_same_schema_as_v1beta1() {
    let crd: Value = serde_yaml::from_str(&crd_yaml()).unwrap();
    let versions = crd["spec"]["versions"].as_array().unwrap();
    let names: Vec<&str> = versions
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["v1beta1", "v1alpha1"]);
    let (beta, alpha) = (&versions[0], &versions[1]);
    assert_eq!(
        (&beta["served"], &beta["storage"], beta.get("deprecated")),
        (&Value::Bool(true), &Value::Bool(true), None)
    );
    assert_eq!(
        (&alpha["served"], &alpha["storage"], &alpha["deprecated"]),
        (&Value::Bool(true), &Value::Bool(false), &Value::Bool(true))
    );
    let warning = alpha["deprecationWarning"].as_str().unwrap();
    assert!(warning.contains("outboxrelay.io/v1beta1"), "{warning}");
    for part in ["schema", "subresources", "additionalPrinterColumns"] {
        assert_eq!(
            alpha[part], beta[part],
            "{part} differs between the versions"
        );
    }
    assert!(
        crd["spec"].get("conversion").is_none(),
        "no conversion: strategy None is the API server's default"
    );
}

/// The OutboxRelay documents of every sample file (Secrets and kustomizations are skipped).
fn sample_relays() -> Vec<(String, Value)> {
    let dir = repo_root().join("config/samples");
    let mut found = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value: Value = serde::Deserialize::deserialize(document)
                .unwrap_or_else(|e| panic!("{} document {i}: {e}", path.display()));
            if value["kind"] == "OutboxRelay" {
                found.push((format!("{} document {i}", path.display()), value));
            }
        }
    }
    found
}

/// Everything the API server would refuse before CEL runs: types, unknown fields, required
/// fields, enums, patterns, lengths and ranges.
fn structural_errors(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if schema["nullable"] != true {
            errors.push(format!("{path}: must not be null"));
        }
        return;
    }
    if schema["x-kubernetes-int-or-string"] == true {
        if !(value.is_i64() || value.is_string()) {
            errors.push(format!("{path}: must be an integer or a string"));
        }
        return;
    }
    if schema["x-kubernetes-preserve-unknown-fields"] == true && schema.get("type").is_none() {
        return;
    }
    let type_ok = match schema["type"].as_str() {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    };
    if !type_ok {
        errors.push(format!("{path}: must be of type {}", schema["type"]));
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        errors.push(format!("{path}: {value} is not one of {allowed:?}"));
    }
    if let (Some(text), Some(pattern)) = (value.as_str(), schema["pattern"].as_str())
        && !regex::Regex::new(pattern).unwrap().is_match(text)
    {
        errors.push(format!("{path}: {text:?} does not match {pattern}"));
    }
    if let Some(text) = value.as_str() {
        let length = text.chars().count() as u64;
        if schema["minLength"].as_u64().is_some_and(|min| length < min) {
            errors.push(format!("{path}: too short"));
        }
        if schema["maxLength"].as_u64().is_some_and(|max| length > max) {
            errors.push(format!("{path}: too long"));
        }
    }
    if let Some(number) = value.as_f64() {
        if schema["minimum"].as_f64().is_some_and(|min| number < min) {
            errors.push(format!("{path}: {number} is below {}", schema["minimum"]));
        }
        if schema["maximum"].as_f64().is_some_and(|max| number > max) {
            errors.push(format!("{path}: {number} is above {}", schema["maximum"]));
        }
    }
    if let Some(object) = value.as_object() {
        for required in schema["required"].as_array().into_iter().flatten() {
            let key = required.as_str().unwrap();
            // Fields with a schema default are filled in by the API server first.
            let defaulted = schema["properties"][key].get("default").is_some();
            if !object.contains_key(key) && !defaulted {
                errors.push(format!("{path}.{key}: is required"));
            }
        }
        for (key, child) in object {
            let child_path = format!("{path}.{key}");
            if let Some(property) = schema["properties"].get(key) {
                structural_errors(property, child, &child_path, errors);
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                structural_errors(additional, child, &child_path, errors);
            } else if schema["x-kubernetes-preserve-unknown-fields"] != true
                && !(path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&key.as_str()))
            {
                errors.push(format!("{child_path}: unknown field"));
            }
        }
    }
    if let (Some(items), Some(schema_items)) = (value.as_array(), schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            structural_errors(schema_items, item, &format!("{path}[{i}]"), errors);
        }
    }
}

/// All reasons the schema (structure and CEL) refuses `object`; empty when it is accepted.
fn schema_errors(object: &Value) -> Vec<String> {
    let schema = schema();
    let mut errors = Vec::new();
    structural_errors(&schema, object, "", &mut errors);
    if let Err(cel) = Validator::new().validate(&schema, object, None) {
        errors.push(format!("CEL: {cel}"));
    }
    errors
}

#[test]
fn every_sample_validates_against_the_schema_and_the_operator() {
    let samples = sample_relays();
    assert!(!samples.is_empty(), "config/samples has no OutboxRelay");
    for (origin, object) in samples {
        let errors = schema_errors(&object);
        assert!(errors.is_empty(), "{origin}: {errors:#?}");
        let relay: OutboxRelay = serde_json::from_value(object)
            .unwrap_or_else(|e| panic!("{origin}: does not deserialize: {e}"));
        if let Err(e) = validate(&relay.spec) {
            panic!("{origin}: refused by the operator: {e}");
        }
    }
}

fn minimal_relay() -> Value {
    serde_json::json!({
        "apiVersion": "outboxrelay.io/v1beta1",
        "kind": "OutboxRelay",
        "metadata": {"name": "orders"},
        "spec": {
            "database": {"urlSecretRef": {"name": "orders-db"}},
            "broker": {"urlSecretRef": {"name": "orders-amqp"}},
        }
    })
}

#[test]
fn min_replicas_above_max_replicas_is_rejected_by_cel() {
    let mut object = minimal_relay();
    assert_eq!(schema_errors(&object), Vec::<String>::new());
    object["spec"]["scaling"] = serde_json::json!({"minReplicas": 5, "maxReplicas": 3});
    let errors = schema_errors(&object);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].starts_with("CEL: "), "{errors:#?}");
    assert!(
        errors[0].contains("minReplicas must not be greater than maxReplicas"),
        "{errors:#?}"
    );
    // With the defaults filled in (min 1, max 10) the rule holds, as on the API server.
    object["spec"]["scaling"] = serde_json::json!({"minReplicas": 0});
    assert_eq!(schema_errors(&object), Vec::<String>::new());
}

#[test]
fn the_protocols_broker_options_are_checked_by_cel() {
    let amqp10 = |broker: Value| {
        let mut object = minimal_relay();
        let secret = object["spec"]["broker"]["urlSecretRef"].clone();
        object["spec"]["broker"] = broker;
        object["spec"]["broker"]["urlSecretRef"] = secret;
        object
    };
    let accepted = amqp10(serde_json::json!({"protocol": "amqp10", "address": "orders"}));
    assert_eq!(schema_errors(&accepted), Vec::<String>::new());
    let cases = [
        (
            serde_json::json!({"protocol": "amqp10"}),
            "address is required with protocol amqp10",
        ),
        (
            serde_json::json!({"address": "orders"}),
            "address is an AMQP 1.0 field",
        ),
        (
            serde_json::json!({"protocol": "amqp10", "address": "orders", "exchange": ""}),
            "exchange is an AMQP 0-9-1 field",
        ),
        (
            serde_json::json!({"protocol": "amqp10", "address": "orders", "routingKey": "x"}),
            "routingKey is an AMQP 0-9-1 field",
        ),
        (
            serde_json::json!({"protocol": "amqp10", "address": "orders", "deadLetterExchange": "dlx"}),
            "deadLetterExchange is an AMQP 0-9-1 field",
        ),
        (
            serde_json::json!({"protocol": "amqp10", "address": "orders", "publisherConfirms": false}),
            "publisherConfirms: false has no meaning under amqp10",
        ),
    ];
    for (broker, message) in cases {
        let errors = schema_errors(&amqp10(broker.clone()));
        assert!(
            errors.len() == 1 && errors[0].starts_with("CEL: ") && errors[0].contains(message),
            "{broker}: {errors:#?}"
        );
    }
    // mandatory false is what the default says, and is no error under amqp10.
    let quiet =
        amqp10(serde_json::json!({"protocol": "amqp10", "address": "orders", "mandatory": false}));
    assert_eq!(schema_errors(&quiet), Vec::<String>::new());
    let mut column = accepted;
    column["spec"]["database"]["columns"] = serde_json::json!({"routingKey": "topic"});
    let errors = schema_errors(&column);
    assert!(
        errors.len() == 1 && errors[0].contains("columns.routingKey is an AMQP 0-9-1 mapping"),
        "{errors:#?}"
    );
}

#[test]
fn per_key_ordering_and_the_partition_key_are_checked_together_by_cel() {
    let mut object = minimal_relay();
    object["spec"]["relay"] = serde_json::json!({"ordering": "perKey"});
    let errors = schema_errors(&object);
    assert!(
        errors.len() == 1 && errors[0].contains("set database.columns.partitionKey"),
        "{errors:#?}"
    );
    object["spec"]["database"]["columns"] = serde_json::json!({"partitionKey": "order_id"});
    assert_eq!(schema_errors(&object), Vec::<String>::new());
    object["spec"]["relay"] = serde_json::json!({"ordering": "unordered"});
    let errors = schema_errors(&object);
    assert!(
        errors.len() == 1 && errors[0].contains("only has a meaning with relay.ordering perKey"),
        "{errors:#?}"
    );
}

#[test]
fn structural_mistakes_are_rejected() {
    let cases = [
        (
            "/spec/database/table",
            serde_json::json!("orders; drop table x"),
        ),
        ("/spec/relay", serde_json::json!({"batchSize": 0})),
        (
            "/spec/relay",
            serde_json::json!({"deliveryMode": "archive"}),
        ),
        ("/spec/relay", serde_json::json!({"pollInterval": "soon"})),
        (
            "/spec/database/columns",
            serde_json::json!({"payload": "1body"}),
        ),
        ("/spec/database/password", serde_json::json!("hunter2")),
    ];
    for (pointer, value) in cases {
        let mut object = minimal_relay();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        object.pointer_mut(parent).unwrap()[key] = value.clone();
        let errors = schema_errors(&object);
        assert!(!errors.is_empty(), "{pointer} = {value} was accepted");
    }
}
