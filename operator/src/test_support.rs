//! Objects shared by the unit and request-level tests.

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

/// The local PostgreSQL the tests use (trust authentication, so any password is accepted).
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// [`database_url`] with [`LEAK_CANARY`] as the password, so a leak of the URL is detectable.
pub fn database_url_with_canary() -> String {
    let url = database_url();
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((user, host)) if !user.contains(':') => {
                format!("{scheme}://{user}:{LEAK_CANARY}@{host}")
            }
            _ => url,
        },
        None => url,
    }
}

pub async fn connect() -> sqlx::PgConnection {
    use sqlx::Connection;
    sqlx::PgConnection::connect(&database_url())
        .await
        .expect("the local PostgreSQL must be running (see scripts/services.sh)")
}

/// Creates a fresh outbox table with the reference columns; its name is unique per call, so
/// tests never share data.
pub async fn create_outbox_table() -> String {
    let name = format!("obr_{}", uuid::Uuid::new_v4().simple());
    let mut conn = connect().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE \"{name}\" (id uuid PRIMARY KEY, type varchar(255) NOT NULL, content jsonb NOT NULL, \
         occurred_on_utc timestamptz NOT NULL, processed_on_utc timestamptz NULL, error text NULL)"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    name
}
