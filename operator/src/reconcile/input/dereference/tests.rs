use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::crd::{
    BrokerTlsSpec, CaKeyRef, CaSource, DatabaseTlsSpec, PasswordSecretRef, TlsSecretRef,
};
use crate::test_support::{LEAK_CANARY, mock_service, sample_spec};

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

fn object_meta(name: &str, version: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("shop".into()),
        resource_version: Some(version.into()),
        ..Default::default()
    }
}

fn secret_of(name: &str, version: &str, data: &[(&str, &str)]) -> serde_json::Value {
    let data = data
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
    serde_json::to_value(Secret {
        metadata: object_meta(name, version),
        data: Some(data),
        ..Default::default()
    })
    .unwrap()
}

fn config_map_of(name: &str, version: &str, data: &[(&str, &str)]) -> serde_json::Value {
    let data = data
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    serde_json::to_value(ConfigMap {
        metadata: object_meta(name, version),
        data: Some(data),
        ..Default::default()
    })
    .unwrap()
}

/// Dereferences `spec` against an API server holding `objects` (by request path suffix, e.g.
/// `secrets/orders-db`); any other object is not found.
async fn dereference(
    spec: &OutboxRelaySpec,
    objects: BTreeMap<String, serde_json::Value>,
) -> Result<RelaySecrets, Error> {
    let (service, mut handle) = mock_service::pair();
    let server = tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let path = request.uri().path().to_string();
            let found = objects
                .iter()
                .find(|(suffix, _)| path.ends_with(suffix.as_str()));
            let response = match found {
                Some((_, body)) => http::Response::builder()
                    .body(serde_json::to_vec(body).unwrap().into())
                    .unwrap(),
                None => http::Response::builder()
                    .status(404)
                    .body(
                        serde_json::to_vec(&serde_json::json!({
                            "kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "NotFound", "code": 404, "message": "not found"
                        }))
                        .unwrap()
                        .into(),
                    )
                    .unwrap(),
            };
            send.send_response(response);
        }
    });
    let client = kube::Client::new(service, "shop");
    let secrets = ObjectReader::<Secret>::new(client.clone(), "shop", None);
    let config_maps = ObjectReader::<ConfigMap>::new(client, "shop", None);
    let result = dereference_secrets(&secrets, &config_maps, spec).await;
    drop(secrets);
    drop(config_maps);
    server.abort();
    result
}

fn base_objects(db_url: &str, amqp_url: &str) -> BTreeMap<String, serde_json::Value> {
    BTreeMap::from([
        (
            "secrets/orders-db".to_string(),
            secret_of("orders-db", "7", &[("url", db_url)]),
        ),
        (
            "secrets/orders-amqp".to_string(),
            secret_of("orders-amqp", "8", &[("url", amqp_url)]),
        ),
    ])
}

fn secure_spec() -> OutboxRelaySpec {
    let mut spec = sample_spec();
    spec.database.password_secret_ref = Some(PasswordSecretRef {
        name: "orders-db-password".into(),
        key: "password".into(),
    });
    spec.database.tls = Some(DatabaseTlsSpec {
        ca: Some(CaSource {
            secret_key_ref: None,
            config_map_key_ref: Some(CaKeyRef {
                name: "company-ca".into(),
                key: "ca.crt".into(),
            }),
        }),
        client_certificate_secret_ref: Some(TlsSecretRef {
            name: "orders-db-client".into(),
        }),
        ..Default::default()
    });
    spec.broker.tls = Some(BrokerTlsSpec {
        ca: Some(CaSource {
            secret_key_ref: Some(CaKeyRef {
                name: "rabbit-ca".into(),
                key: "ca.crt".into(),
            }),
            config_map_key_ref: None,
        }),
        client_certificate_secret_ref: None,
    });
    spec
}

fn secure_objects() -> BTreeMap<String, serde_json::Value> {
    let mut objects = base_objects(
        "postgres://app@db:5432/orders",
        "amqps://app:pw@mq:5671/%2f",
    );
    objects.insert(
        "secrets/orders-db-password".into(),
        secret_of(
            "orders-db-password",
            "31",
            &[("password", &format!("{LEAK_CANARY}\nignored"))],
        ),
    );
    objects.insert(
        "secrets/orders-db-client".into(),
        secret_of(
            "orders-db-client",
            "12",
            &[("tls.crt", CA), ("tls.key", KEY)],
        ),
    );
    objects.insert(
        "configmaps/company-ca".into(),
        config_map_of("company-ca", "5", &[("ca.crt", CA)]),
    );
    objects.insert(
        "secrets/rabbit-ca".into(),
        secret_of("rabbit-ca", "9", &[("ca.crt", CA)]),
    );
    objects
}

#[tokio::test]
async fn the_database_target_carries_the_password_and_tls_material_and_shows_neither() {
    let found = dereference(&secure_spec(), secure_objects()).await.unwrap();
    assert_eq!(found.database.given_password(), Some(LEAK_CANARY));
    let tls = found.database.tls().expect("TLS material");
    assert_eq!(
        tls.ca.as_ref().unwrap().origin,
        "ConfigMap company-ca, key ca.crt"
    );
    assert_eq!(
        tls.client.as_ref().unwrap().1.origin,
        "Secret orders-db-client, key tls.key"
    );
    let shown = format!("{found:?}");
    assert!(!shown.contains(LEAK_CANARY), "{shown}");
    assert!(!shown.contains("MIIE"), "{shown}");
    // A password rotation must not roll the pods; the CA and certificates do.
    assert_eq!(
        found.fingerprint(),
        "configmap/company-ca=5,orders-amqp=8,orders-db=7,orders-db-client=12,rabbit-ca=9"
    );
}

#[tokio::test]
async fn a_missing_object_or_key_is_named() {
    let mut objects = secure_objects();
    objects.remove("configmaps/company-ca");
    let err = dereference(&secure_spec(), objects).await.unwrap_err();
    assert_eq!(err.user_facing_reason(), Some("ConfigMapNotFound"));
    assert!(err.to_string().contains("company-ca"), "{err}");

    let mut objects = secure_objects();
    objects.insert(
        "secrets/orders-db-client".into(),
        secret_of("orders-db-client", "12", &[("tls.crt", CA)]),
    );
    let err = dereference(&secure_spec(), objects).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Secret orders-db-client has no key tls.key"
    );

    let mut objects = secure_objects();
    objects.insert(
        "secrets/rabbit-ca".into(),
        secret_of("rabbit-ca", "9", &[("ca.crt", "not a cert")]),
    );
    let err = dereference(&secure_spec(), objects).await.unwrap_err();
    assert_eq!(err.user_facing_reason(), Some("SecretValueInvalid"));
    assert!(
        err.to_string().contains("rabbit-ca") && err.to_string().contains("PEM"),
        "{err}"
    );

    let mut objects = secure_objects();
    objects.insert(
        "secrets/orders-db-password".into(),
        secret_of("orders-db-password", "31", &[("password", "\n")]),
    );
    let err = dereference(&secure_spec(), objects).await.unwrap_err();
    assert!(
        err.to_string().contains("orders-db-password") && err.to_string().contains("empty"),
        "{err}"
    );
}

#[tokio::test]
async fn urls_that_contradict_the_tls_fields_are_refused_naming_the_parameter() {
    let mut objects = secure_objects();
    objects.extend(base_objects(
        &format!("postgres://app:{LEAK_CANARY}@db/orders?sslmode=disable"),
        "amqps://app:pw@mq:5671/%2f",
    ));
    let err = dereference(&secure_spec(), objects).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("sslmode") && text.contains("spec.database.tls"),
        "{text}"
    );
    assert!(!text.contains(LEAK_CANARY), "{text}");

    let mut objects = secure_objects();
    objects.extend(base_objects(
        "postgres://app@db/orders",
        "amqp://app:pw@mq:5672/%2f",
    ));
    let err = dereference(&secure_spec(), objects).await.unwrap_err();
    assert!(err.to_string().contains("amqps://"), "{err}");

    // Issue 44: a list of nodes, every one of them amqps:// under spec.broker.tls.
    let mut objects = secure_objects();
    objects.extend(base_objects(
        "postgres://app@db/orders",
        &format!("amqps://app:{LEAK_CANARY}@mq-0:5671/%2f,amqp://app:{LEAK_CANARY}@mq-1:5672/%2f"),
    ));
    let err = dereference(&secure_spec(), objects).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("element 2 of 2 is not an amqps:// URL"),
        "{text}"
    );
    assert!(!text.contains(LEAK_CANARY), "{text}");
}

#[tokio::test]
async fn the_broker_secret_may_hold_a_list_of_nodes() {
    let objects = base_objects(
        "postgres://app@db/orders",
        "amqp://app:pw@mq-0:5672/%2f,amqp://app:pw@mq-1:5672/%2f,amqp://app:pw@mq-2:5672/%2f",
    );
    let found = dereference(&sample_spec(), objects).await.unwrap();
    assert_eq!(found.broker_urls.len(), 3);
    let objects = base_objects(
        "postgres://app@db/orders",
        &format!("amqp://app:{LEAK_CANARY}@mq-0:5672/%2f,mq-1:5672"),
    );
    let err = dereference(&sample_spec(), objects).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("has a comma after its user and password"),
        "{text}"
    );
    assert!(!text.contains(LEAK_CANARY), "{text}");
}

#[tokio::test]
async fn a_multi_host_url_is_taken_and_one_choosing_read_only_sessions_is_refused() {
    let url = format!("postgres://app:{LEAK_CANARY}@db-a:5432,db-b:5433/orders");
    let found = dereference(
        &sample_spec(),
        base_objects(&url, "amqp://app:pw@mq:5672/%2f"),
    )
    .await
    .unwrap();
    assert_eq!(found.database.url().expose(), url);
    assert_eq!(
        found.database.to_string(),
        "postgres://app:***@db-a:5432,db-b:5433/orders"
    );

    let url = format!("{url}?target_session_attrs=standby");
    let err = dereference(
        &sample_spec(),
        base_objects(&url, "amqp://app:pw@mq:5672/%2f"),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("target_session_attrs=standby"), "{text}");
    assert!(text.contains("orders-db"), "{text}");
    assert!(!text.contains(LEAK_CANARY), "{text}");
}

#[tokio::test]
async fn behind_a_transaction_pool_the_operator_connects_by_the_session_url() {
    let mut spec = sample_spec();
    spec.database.pool_mode = Some(crate::crd::PoolMode::Transaction);
    spec.database.session_url_secret_ref = Some(SecretKeyRef {
        name: "orders-db-direct".into(),
        key: "url".into(),
    });
    let mut objects = base_objects("postgres://app@pgbouncer:6432/orders", "amqp://mq/%2f");
    objects.insert(
        "secrets/orders-db-direct".into(),
        secret_of(
            "orders-db-direct",
            "3",
            &[("url", "postgres://app@db:5432/orders")],
        ),
    );
    let found = dereference(&spec, objects).await.unwrap();
    assert_eq!(
        found.database.url().expose(),
        "postgres://app@db:5432/orders"
    );
    // The session URL is an env value of the pods: a change rolls them.
    assert!(
        found.fingerprint().contains("orders-db-direct=3"),
        "{}",
        found.fingerprint()
    );
}

#[test]
fn the_watches_know_every_referenced_object() {
    let spec = secure_spec();
    let mut secrets = referenced_secret_names(&spec);
    secrets.sort();
    assert_eq!(
        secrets,
        [
            "orders-amqp",
            "orders-db",
            "orders-db-client",
            "orders-db-password",
            "rabbit-ca"
        ]
    );
    assert_eq!(referenced_config_map_names(&spec), ["company-ca"]);
}

fn traced_spec() -> OutboxRelaySpec {
    let mut spec = sample_spec();
    spec.relay.tracing = Some(crate::crd::TracingSpec {
        otlp_endpoint: "https://otlp.example.com".into(),
        sample_ratio: None,
        headers_secret_ref: Some(crate::crd::OtlpHeadersSecretRef {
            name: "otlp-auth".into(),
            key: "headers".into(),
        }),
    });
    spec
}

fn traced_objects(headers: &str) -> BTreeMap<String, serde_json::Value> {
    let mut objects = base_objects("postgres://app@db/orders", "amqp://app:pw@mq:5672/%2f");
    objects.insert(
        "secrets/otlp-auth".into(),
        secret_of("otlp-auth", "21", &[("headers", headers)]),
    );
    objects
}

#[tokio::test]
async fn the_otlp_headers_secret_is_checked_watched_and_rolls_the_pods() {
    let spec = traced_spec();
    let mut names = referenced_secret_names(&spec);
    names.sort();
    assert_eq!(names, ["orders-amqp", "orders-db", "otlp-auth"]);

    let headers = format!("x-api-key={LEAK_CANARY}, x-team=orders");
    let found = dereference(&spec, traced_objects(&headers)).await.unwrap();
    // The pods read it from their environment at start: a change must restart them.
    assert_eq!(
        found.fingerprint(),
        "orders-amqp=8,orders-db=7,otlp-auth=21"
    );

    let mut objects = traced_objects(&headers);
    objects.remove("secrets/otlp-auth");
    let err = dereference(&spec, objects).await.unwrap_err();
    assert_eq!(err.user_facing_reason(), Some("SecretNotFound"));
    assert!(err.to_string().contains("otlp-auth"), "{err}");

    let mut objects = traced_objects(&headers);
    objects.insert(
        "secrets/otlp-auth".into(),
        secret_of("otlp-auth", "22", &[("token", &headers)]),
    );
    let err = dereference(&spec, objects).await.unwrap_err();
    assert_eq!(err.to_string(), "Secret otlp-auth has no key headers");

    for bad in [
        LEAK_CANARY.to_string(),
        format!("={LEAK_CANARY}"),
        " , ".into(),
    ] {
        let err = dereference(&spec, traced_objects(&bad)).await.unwrap_err();
        let text = err.to_string();
        assert_eq!(
            err.user_facing_reason(),
            Some("SecretValueInvalid"),
            "{text}"
        );
        assert!(
            text.contains("otlp-auth") && text.contains("key=value"),
            "{text}"
        );
        assert!(!text.contains(LEAK_CANARY), "{text}");
    }
}
