//! What the tests of the API's versions share: the previous release's CRD (v1alpha1 only,
//! kept in `tests/fixtures`), OutboxRelays that set every field, a comparison of JSON values
//! that tolerates what the API server adds (defaults), and the field paths of a schema.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::control_plane::ControlPlane;
use crate::{process, repo_root};

/// The CRD of the release before v1beta1: v1alpha1 served and stored, nothing else.
pub fn previous_crd_path() -> PathBuf {
    repo_root().join("tests/fixtures/outboxrelays-v1alpha1-crd.yaml")
}

/// Two OutboxRelays (v1alpha1) that between them set every spec field.
pub fn every_field_path() -> PathBuf {
    repo_root().join("tests/fixtures/outboxrelay-every-field.yaml")
}

/// A status (a merge patch of `/status`) that sets every status field.
pub fn every_status_field() -> Value {
    let path = repo_root().join("tests/fixtures/outboxrelay-every-status-field.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("read the status fixture"))
        .expect("the status fixture is JSON")
}

/// Two OutboxRelays (v1alpha1) that set every spec field release 0.1.0's CRD
/// ([`previous_crd_path`]) had: what its users could have written.
pub fn previous_every_field_path() -> PathBuf {
    repo_root().join("tests/fixtures/outboxrelay-every-field-0.1.yaml")
}

/// The OutboxRelays of [`every_field_path`].
pub fn every_field_relays() -> Vec<Value> {
    relays_in(&every_field_path())
}

/// The OutboxRelays of a fixture file.
pub fn relays_in(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read the fixture");
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).expect("YAML"))
        .collect()
}

/// Subtrees of Kubernetes' own types, set once in the fixture rather than field by field.
pub const KUBERNETES_TYPES: &[&str] = &[
    "spec.relay.affinity",
    "spec.relay.resources",
    "spec.relay.tolerations",
    "spec.relay.topologySpreadConstraints",
];

/// The paths of every leaf field of an OpenAPI schema (`a.b[].c`); objects without properties
/// (maps) and the subtrees in `whole` count as one leaf each.
pub fn schema_leaves(schema: &Value, path: &str, whole: &[&str], out: &mut BTreeSet<String>) {
    if whole.contains(&path) {
        out.insert(path.to_string());
        return;
    }
    match schema["type"].as_str() {
        Some("object") if schema["properties"].is_object() => {
            for (name, child) in schema["properties"].as_object().into_iter().flatten() {
                schema_leaves(child, &join(path, name), whole, out);
            }
        }
        Some("array") => schema_leaves(&schema["items"], &format!("{path}[]"), whole, out),
        _ => {
            out.insert(path.to_string());
        }
    }
}

/// The leaf paths a JSON value sets, in the notation of [`schema_leaves`].
pub fn value_leaves(value: &Value, path: &str, whole: &[&str], out: &mut BTreeSet<String>) {
    if whole.contains(&path) {
        out.insert(path.to_string());
        return;
    }
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (name, child) in map {
                value_leaves(child, &join(path, name), whole, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                value_leaves(item, &format!("{path}[]"), whole, out);
            }
        }
        _ => {
            out.insert(path.to_string());
        }
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Whether `big` holds everything `small` does (objects: every key, recursively; anything else:
/// equal). Err names the first path where they differ.
pub fn contains(big: &Value, small: &Value, path: &str) -> Result<(), String> {
    match (big, small) {
        (Value::Object(b), Value::Object(s)) => {
            for (key, value) in s {
                let inner = join(path, key);
                match b.get(key) {
                    Some(found) => contains(found, value, &inner)?,
                    None => return Err(format!("{inner}: missing (expected {value})")),
                }
            }
            Ok(())
        }
        (Value::Array(b), Value::Array(s)) if b.len() == s.len() => {
            for (i, (found, value)) in b.iter().zip(s).enumerate() {
                contains(found, value, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        // Numbers compare by value: the fixture's 4.5 and the server's 4.5 may differ in type.
        (Value::Number(b), Value::Number(s)) if b.as_f64() == s.as_f64() => Ok(()),
        _ if big == small => Ok(()),
        _ => Err(format!("{path}: {big} where {small} was expected")),
    }
}

/// `kubectl get TARGET -o json` (admin), parsed.
pub fn get_json(plane: &ControlPlane, args: &[&str]) -> anyhow::Result<Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    let text = plane.kubectl_ok(&all)?;
    serde_json::from_str(&text).context("kubectl printed no JSON")
}

/// `kubectl ARGS -f -` with `manifest` on stdin: (ok, stdout + stderr), where kubectl prints
/// the API server's warnings.
pub fn kubectl_stdin(plane: &ControlPlane, args: &[&str], manifest: &str) -> (bool, String) {
    let mut command = plane.kubectl();
    command.args(args).args(["-f", "-"]);
    let output = process::output_with_stdin(&mut command, manifest).expect("run kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Polls until the CRD is Established and discovery serves `group/version`.
pub fn wait_served(plane: &ControlPlane, group: &str, version: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let served = plane.kubectl_ok(&["get", "--raw", &format!("/apis/{group}/{version}")]);
        if served.is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{group}/{version} not served after 60 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The CRD's `status.storedVersions`.
pub fn stored_versions(plane: &ControlPlane, crd: &str) -> anyhow::Result<Vec<String>> {
    let crd = get_json(plane, &["crd", crd])?;
    Ok(crd["status"]["storedVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect())
}

/// The kind and plural of [`renamed_crd`]'s copies.
pub const RENAMED_KIND: &str = "MigrationProbe";
pub const RENAMED_PLURAL: &str = "migrationprobes";

/// `crd_yaml` (one CRD, YAML) under another group and names (no short name), so a test can
/// change its versions on a shared API server without touching the real one, nor making
/// `kubectl get obr` or `outboxrelays` ambiguous; returns (the CRD as JSON, its name).
pub fn renamed_crd(crd_yaml: &str, group: &str) -> (Value, String) {
    let mut crd: Value = serde_yaml::from_str(crd_yaml).expect("the CRD is YAML");
    let name = format!("{RENAMED_PLURAL}.{group}");
    crd["metadata"]["name"] = Value::String(name.clone());
    crd["spec"]["group"] = Value::String(group.to_string());
    crd["spec"]["names"] = serde_json::json!({
        "kind": RENAMED_KIND,
        "plural": RENAMED_PLURAL,
        "singular": RENAMED_KIND.to_lowercase(),
    });
    (crd, name)
}
