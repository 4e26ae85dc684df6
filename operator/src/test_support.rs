//! Objects shared by the unit and request-level tests.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

use crate::crd::{BrokerSpec, DatabaseSpec, OutboxRelay, OutboxRelaySpec, SecretKeyRef};

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

/// A spec pointing at the given table, with the Secret names of [`sample_spec`].
pub fn spec_for_table(table: &str) -> OutboxRelaySpec {
    OutboxRelaySpec {
        database: DatabaseSpec {
            table: table.into(),
            ..sample_spec().database
        },
        broker: BrokerSpec {
            url_secret_ref: SecretKeyRef {
                name: "orders-amqp".into(),
                key: "url".into(),
            },
            ..sample_spec().broker
        },
        ..sample_spec()
    }
}
