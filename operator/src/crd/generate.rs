//! The CRD as YAML: what `outbox-operator crd` prints and what `crds/outboxrelays.yaml` holds.

use kube::CustomResourceExt;

use crate::crd::OutboxRelay;

/// The CustomResourceDefinition generated from the Rust types, as one YAML document.
pub fn crd_yaml() -> String {
    serde_yaml::to_string(&OutboxRelay::crd()).expect("a CRD always serializes to YAML")
}
