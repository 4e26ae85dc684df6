//! Objects shared by the unit and request-level tests, and the scripted API server.

pub mod api_server;
pub mod database;
pub mod mock_service;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

use crate::crd::{OutboxRelay, OutboxRelaySpec};

/// A password no real configuration contains, so finding it anywhere is a leak.
pub const LEAK_CANARY: &str = "Canary-Pw-7f3a9";

pub fn sample_spec() -> OutboxRelaySpec {
    serde_json::from_value(serde_json::json!({
        "database": {"urlSecretRef": {"name": "orders-db"}},
        "broker": {"urlSecretRef": {"name": "orders-amqp"}},
    }))
    .expect("the minimal spec deserializes with defaults")
}

/// A relay as the API server returns it: namespace, uid and generation set.
pub fn sample_relay(name: &str, spec: OutboxRelaySpec) -> OutboxRelay {
    let mut relay = OutboxRelay::new(name, spec);
    relay.metadata.namespace = Some("shop".into());
    relay.metadata.uid = Some(format!("uid-{name}"));
    relay.metadata.generation = Some(1);
    relay.metadata.resource_version = Some("100".into());
    // As the operator left it: the finalizer added, so a reconcile runs the pipeline at once.
    relay.metadata.finalizers = Some(vec![crate::reconcile::cleanup::FINALIZER.into()]);
    relay
}

/// A Secret holding `url` under `key`, as the API server returns it (data, base64 on the wire).
pub fn secret(name: &str, key: &str, url: &str) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            key.to_string(),
            ByteString(url.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

/// [`sample_spec`] pointing at `table`.
pub fn spec_for_table(table: &str) -> OutboxRelaySpec {
    let mut spec = sample_spec();
    spec.database.table = table.into();
    spec
}

/// A database URL with [`LEAK_CANARY`] as its password, so a leak of the URL is detectable.
/// The request-level tests never connect to it: their database is scripted.
pub fn database_url_with_canary() -> String {
    format!("postgres://app:{LEAK_CANARY}@db.shop.svc:5432/orders")
}
