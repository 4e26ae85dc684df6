//! Request-level tests of the reconciler against the scripted API server, with the migration
//! running for real against the local PostgreSQL (one fresh table per test).

use std::time::Duration;

use http::Method;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::conditions::{self, DEGRADED, INDEX_READY, READY};
use crate::controller::{Settings, error_policy, reconcile};
use crate::crd::{OutboxRelay, OutboxRelayStatus};
use crate::deployment::{BuildSettings, build_deployment, selector_string};
use crate::error::Error;
use crate::fixtures::{Exchange, Reply, Step, finish, mock_context, serve};
use crate::migration::{MigrationKey, MigrationOutcome};
use crate::status::{Observation, healthy_status};
use crate::test_support::{
    LEAK_CANARY, connect, create_outbox_table, database_url_with_canary, sample_relay, secret,
    spec_for_table,
};
use crate::validation::validate;

const NS: &str = "shop";
const SECRETS: &str = "/api/v1/namespaces/shop/secrets";
const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/shop/deployments/orders";
const STATUS: &str = "/apis/outboxrelay.io/v1alpha1/namespaces/shop/outboxrelays/orders/status";

fn db_secret() -> Value {
    serde_json::to_value(secret("orders-db", "url", &database_url_with_canary())).unwrap()
}

fn amqp_secret() -> Value {
    serde_json::to_value(secret(
        "orders-amqp",
        "url",
        &format!("amqp://relay:{LEAK_CANARY}@127.0.0.1:5672/%2f"),
    ))
    .unwrap()
}

fn secret_steps() -> Vec<Step> {
    vec![
        Step::get(format!("{SECRETS}/orders-db"), Reply::ok(db_secret())),
        Step::get(format!("{SECRETS}/orders-amqp"), Reply::ok(amqp_secret())),
    ]
}

/// The status a PATCH sent, read back as our type.
fn sent_status(body: &Value) -> OutboxRelayStatus {
    serde_json::from_value(body["status"].clone()).unwrap()
}

fn condition(status: &OutboxRelayStatus, type_: &str) -> (String, String) {
    let c = conditions::find(&status.conditions, type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status:?}"));
    (c.status.clone(), c.reason.clone())
}

/// Asserts each `(type, status, reason)`, reporting every mismatch at once.
fn assert_conditions(status: &OutboxRelayStatus, expected: &[(&str, &str, &str)]) {
    let wrong: Vec<String> = expected
        .iter()
        .filter_map(|&(type_, want_status, want_reason)| {
            let got = condition(status, type_);
            (got != (want_status.to_string(), want_reason.to_string())).then(|| {
                format!(
                    "{type_}: want {want_status}/{want_reason}, got {}/{}",
                    got.0, got.1
                )
            })
        })
        .collect();
    assert!(wrong.is_empty(), "{}\nin {status:?}", wrong.join("; "));
}

/// No request body ever carries a Secret value.
fn assert_no_secret_leaked(seen: &[Exchange]) {
    for exchange in seen {
        let text = exchange.body.to_string();
        if exchange.uri.contains("/secrets/") {
            continue; // the Secret itself, as the fixture served it
        }
        assert!(
            !text.contains(LEAK_CANARY),
            "{} {} leaked: {text}",
            exchange.method,
            exchange.uri
        );
    }
}

/// A Deployment as the API server returns it after an apply: with a generation and a status.
fn served(mut deployment: Value, generation: i64, ready: i32, replicas: i32) -> Value {
    deployment["metadata"]["generation"] = json!(generation);
    deployment["status"] = json!({
        "observedGeneration": generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": replicas,
    });
    deployment
}

/// The status PATCH, answered with the object as the API server would return it.
fn patch_status(check: impl FnOnce(&Value) + Send + 'static) -> Step {
    Step::new(Method::PATCH, STATUS, move |body| {
        check(body);
        let mut relay = serde_json::to_value(sample_relay("orders", spec_for_table("t"))).unwrap();
        relay["status"] = body["status"].clone();
        Reply::ok(relay)
    })
}

fn apply_deployment(check: impl FnOnce(&Value) + Send + 'static) -> Step {
    Step::new(Method::PATCH, DEPLOYMENT, move |body| {
        check(body);
        Reply::ok(served(body.clone(), 1, 0, 0))
    })
}

/// The Warning event a migration that ran sends first when this PostgreSQL server runs without
/// autovacuum (test machines often do), read from the server itself; none when it runs.
async fn autovacuum_warning() -> Option<Step> {
    let off: bool = sqlx::query_scalar(
        "SELECT bool_or(setting = 'off') FROM pg_settings WHERE name IN ('autovacuum', 'track_counts')",
    )
    .fetch_one(&mut connect().await)
    .await
    .unwrap();
    off.then(|| {
        Step::write(
            Method::POST,
            format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"),
            |body| {
                assert_eq!(body["reason"], "AutovacuumOff");
                assert_eq!(body["type"], "Warning");
                let note = body["note"].as_str().unwrap();
                assert!(note.contains("VACUUM the outbox table"), "{body}");
            },
        )
    })
}

#[tokio::test]
async fn new_relay_is_migrated_deployed_and_reported() {
    let table = create_outbox_table().await;
    let relay = sample_relay("orders", spec_for_table(&table));
    let (ctx, handle) = mock_context(Settings::default());
    let mut script = secret_steps();
    script.extend(autovacuum_warning().await);
    script.push(Step::event(NS, "IndexCreated"));
    script.push(Step::get(
        DEPLOYMENT,
        Reply::not_found("deployments.apps", "orders"),
    ));
    script.push(apply_deployment(|body| {
        assert_eq!(body["kind"], "Deployment");
        assert_eq!(
            body["metadata"]["ownerReferences"][0]["kind"],
            "OutboxRelay"
        );
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "uid-orders");
        assert_eq!(body["spec"]["replicas"], 1);
    }));
    script.push(Step::event(NS, "DeploymentCreated"));
    let table_for_check = table.clone();
    script.push(patch_status(move |body| {
        assert_eq!(body["kind"], "OutboxRelay");
        let status = sent_status(body);
        assert_eq!(status.observed_generation, Some(1));
        assert_conditions(
            &status,
            &[
                (INDEX_READY, "True", "IndexCreated"),
                (READY, "False", "Progressing"),
                (DEGRADED, "False", "AsExpected"),
            ],
        );
        assert_eq!(status.desired_replicas, Some(1));
        assert_eq!(
            status.selector.as_deref(),
            Some("app.kubernetes.io/instance=orders,app.kubernetes.io/name=outbox-relay")
        );
        let index = conditions::find(&status.conditions, INDEX_READY).unwrap();
        assert!(
            index.message.contains(&table_for_check),
            "{}",
            index.message
        );
    }));
    let server = serve(handle, script);

    let action = reconcile(relay.into(), ctx).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    let seen = finish(server).await;
    assert_no_secret_leaked(&seen);
    let apply = seen
        .iter()
        .find(|e| e.method == Method::PATCH && e.uri.contains("/deployments/"))
        .unwrap();
    assert!(
        apply.uri.contains("fieldManager=outbox-operator"),
        "{}",
        apply.uri
    );
    assert!(apply.uri.contains("force=true"), "{}", apply.uri);

    // The index really exists and is valid.
    assert!(index_is_valid(&mut connect().await, &table).await);
}

/// A relay whose Deployment and status are exactly what the operator would write.
fn settled_relay(table: &str, generation: i64) -> (OutboxRelay, Value, String) {
    let mut relay = sample_relay("orders", spec_for_table(table));
    relay.metadata.generation = Some(generation);
    let plan = validate(&relay.spec).unwrap();
    let fingerprint = "orders-amqp=7,orders-db=7".to_string();
    let deployment = build_deployment(&relay, &plan, &fingerprint, 1, &BuildSettings::default());
    let live = served(serde_json::to_value(&deployment).unwrap(), 1, 1, 1);
    let live_typed: Deployment = serde_json::from_value(live.clone()).unwrap();
    let migrated = MigrationOutcome::AlreadyMigrated;
    // Manual mode, one pod, no report yet: what the reconcile will observe.
    let scaling = crate::scaling::ScalingOutcome {
        replicas: 1,
        previous: 1,
        lag: Some(crate::lag::LagObservation::default()),
        lag_problem: None,
        recommendation: None,
        observation: None,
        last_scale_time: None,
    };
    let observation = Observation {
        generation: Some(generation),
        table: table.to_string(),
        migration: &migrated,
        deployment: &live_typed,
        desired_replicas: 1,
        selector: selector_string(&relay),
        scaling: &scaling,
    };
    relay.status = Some(healthy_status(None, &observation, Timestamp::now()));
    (relay, live, fingerprint)
}

#[tokio::test]
async fn unchanged_relay_causes_no_writes() {
    let table = create_outbox_table().await;
    let (relay, live, fingerprint) = settled_relay(&table, 1);
    assert_conditions(
        relay.status.as_ref().unwrap(),
        &[(READY, "True", "Available")],
    );
    let (ctx, handle) = mock_context(Settings::default());
    ctx.migrations.remember(MigrationKey {
        relay_uid: "uid-orders".into(),
        generation: 1,
        secrets_fingerprint: fingerprint,
    });
    let mut script = secret_steps();
    script.push(Step::get(DEPLOYMENT, Reply::ok(live)));
    let server = serve(handle, script);

    let action = reconcile(relay.into(), ctx).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    let seen = finish(server).await;
    assert!(seen.iter().all(|e| e.method == Method::GET), "{seen:#?}");
}

#[tokio::test]
async fn replicas_changed_behind_our_back_are_restored() {
    let table = create_outbox_table().await;
    let (relay, mut live, fingerprint) = settled_relay(&table, 1);
    live["spec"]["replicas"] = json!(3);
    let (ctx, handle) = mock_context(Settings::default());
    ctx.migrations.remember(MigrationKey {
        relay_uid: "uid-orders".into(),
        generation: 1,
        secrets_fingerprint: fingerprint,
    });
    let mut script = secret_steps();
    script.push(Step::get(DEPLOYMENT, Reply::ok(live)));
    script.push(Step::new(Method::PATCH, DEPLOYMENT, |body| {
        assert_eq!(body["spec"]["replicas"], 1);
        Reply::ok(served(body.clone(), 1, 1, 1))
    }));
    script.push(Step::event(NS, "DeploymentUpdated"));
    let server = serve(handle, script);

    reconcile(relay.into(), ctx).await.unwrap();
    finish(server).await;
}

#[tokio::test]
async fn a_deployment_the_api_server_refuses_is_reported() {
    let table = create_outbox_table().await;
    let mut relay = sample_relay("orders", spec_for_table(&table));
    relay
        .spec
        .relay
        .pod_labels
        .insert("bad label!".into(), "x".into());
    let (ctx, handle) = mock_context(Settings::default());
    let mut script = secret_steps();
    script.extend(autovacuum_warning().await);
    script.push(Step::event(NS, "IndexCreated"));
    script.push(Step::get(
        DEPLOYMENT,
        Reply::not_found("deployments.apps", "orders"),
    ));
    script.push(Step::new(Method::PATCH, DEPLOYMENT, |_| Reply {
        status: http::StatusCode::UNPROCESSABLE_ENTITY,
        body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": "Invalid", "code": 422,
            "message": "Deployment.apps \"orders\" is invalid: spec.template.metadata.labels: Invalid value: \"bad label!\""}),
    }));
    script.push(patch_status(|body| {
        let status = sent_status(body);
        assert_conditions(
            &status,
            &[
                (READY, "False", "DeploymentRejected"),
                (DEGRADED, "True", "DeploymentRejected"),
            ],
        );
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert!(ready.message.contains("bad label!"), "{}", ready.message);
    }));
    script.push(Step::event(NS, "DeploymentRejected"));
    let server = serve(handle, script);

    let error = reconcile(relay.into(), ctx).await.unwrap_err();
    assert_eq!(error.metric_label(), "apply_deployment");
    finish(server).await;
}

#[tokio::test]
async fn missing_secret_is_reported_without_a_deployment() {
    let relay = sample_relay("orders", spec_for_table("outbox_messages"));
    let (ctx, handle) = mock_context(Settings::default());
    let script = vec![
        Step::get(
            format!("{SECRETS}/orders-db"),
            Reply::not_found("secrets", "orders-db"),
        ),
        patch_status(|body| {
            let status = sent_status(body);
            assert_conditions(
                &status,
                &[
                    (READY, "False", "SecretNotFound"),
                    (DEGRADED, "True", "SecretNotFound"),
                ],
            );
            let ready = conditions::find(&status.conditions, READY).unwrap();
            assert!(ready.message.contains("orders-db"), "{}", ready.message);
            assert_eq!(status.observed_generation, Some(1));
        }),
        Step::write(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/shop/events",
            |body| {
                assert_eq!(body["reason"], "SecretNotFound");
                assert_eq!(body["type"], "Warning");
                assert_eq!(body["regarding"]["name"], "orders");
            },
        ),
    ];
    let server = serve(handle, script);

    let relay = std::sync::Arc::new(relay);
    let error = reconcile(relay.clone(), ctx.clone()).await.unwrap_err();
    assert!(
        matches!(error, Error::SecretNotFound { ref name } if name == "orders-db"),
        "{error:?}"
    );
    // Backed off: 5 s, then 10 s for the next failure in a row.
    assert_eq!(
        error_policy(relay.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(5))
    );
    assert_eq!(
        error_policy(relay, &error, ctx.clone()),
        Action::requeue(Duration::from_secs(10))
    );
    drop(ctx);
    let seen = finish(server).await;
    assert!(
        !seen.iter().any(|e| e.uri.contains("/deployments")),
        "{seen:#?}"
    );
}

#[tokio::test]
async fn spec_change_updates_the_deployment_and_advances_observed_generation() {
    let table = create_outbox_table().await;
    // The table was migrated for generation 1 already (by `outbox-relay migrate`, say).
    let plan = validate(&spec_for_table(&table)).unwrap();
    outbox_relay::table::migrate::migrate(&mut connect().await, &plan.table, &plan.migration)
        .await
        .unwrap();
    let (mut relay, live, _) = settled_relay(&table, 1);
    relay.metadata.generation = Some(2);
    relay.spec.relay.batch_size = 2000;

    let (ctx, handle) = mock_context(Settings::default());
    let mut script = secret_steps();
    // Generation 2 is migrated again; the index is already valid, so no index event.
    script.extend(autovacuum_warning().await);
    script.push(Step::get(DEPLOYMENT, Reply::ok(live)));
    script.push(Step::new(Method::PATCH, DEPLOYMENT, |body| {
        let args = body["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap();
        let at = args.iter().position(|a| a == "--batch-size").unwrap();
        assert_eq!(args[at + 1], "2000");
        Reply::ok(served(body.clone(), 2, 1, 1))
    }));
    script.push(Step::event(NS, "DeploymentUpdated"));
    script.push(patch_status(|body| {
        let status = sent_status(body);
        assert_eq!(status.observed_generation, Some(2));
        assert_conditions(
            &status,
            &[
                (INDEX_READY, "True", "IndexValid"),
                (READY, "True", "Available"),
            ],
        );
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert_eq!(ready.observed_generation, Some(2));
    }));
    let server = serve(handle, script);

    reconcile(relay.into(), ctx).await.unwrap();
    let seen = finish(server).await;
    assert_no_secret_leaked(&seen);
}

async fn index_is_valid(conn: &mut sqlx::PgConnection, table: &str) -> bool {
    sqlx::query_scalar("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($1)")
        .bind(format!("\"{table}_pending_idx\""))
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn invalid_index_is_rebuilt_and_reported() {
    let table = create_outbox_table().await;
    let mut conn = connect().await;
    // Two rows with the same occurred_on_utc make a UNIQUE build fail half-way, which leaves
    // an INVALID index under the very name the migration uses.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{table}\" (id, type, content, occurred_on_utc) VALUES \
         (gen_random_uuid(), 't', '{{}}', '2024-01-01T00:00:00Z'), \
         (gen_random_uuid(), 't', '{{}}', '2024-01-01T00:00:00Z')"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let failed = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE UNIQUE INDEX CONCURRENTLY \"{table}_pending_idx\" ON \"{table}\" (occurred_on_utc)"
    )))
    .execute(&mut conn)
    .await;
    assert!(
        failed.is_err(),
        "the unique build should fail on duplicates"
    );
    assert!(
        !index_is_valid(&mut conn, &table).await,
        "precondition: the index is INVALID"
    );

    let relay = sample_relay("orders", spec_for_table(&table));
    let (ctx, handle) = mock_context(Settings::default());
    let mut script = secret_steps();
    script.extend(autovacuum_warning().await);
    script.push(Step::write(
        Method::POST,
        "/apis/events.k8s.io/v1/namespaces/shop/events",
        |body| {
            assert_eq!(body["reason"], "InvalidIndexRebuilt");
            assert_eq!(body["type"], "Warning");
            assert!(body["note"].as_str().unwrap().contains("INVALID"), "{body}");
        },
    ));
    script.push(Step::get(
        DEPLOYMENT,
        Reply::not_found("deployments.apps", "orders"),
    ));
    script.push(apply_deployment(|_| {}));
    script.push(Step::event(NS, "DeploymentCreated"));
    script.push(patch_status(|body| {
        let status = sent_status(body);
        assert_conditions(&status, &[(INDEX_READY, "True", "InvalidIndexRebuilt")]);
    }));
    let server = serve(handle, script);

    reconcile(relay.into(), ctx).await.unwrap();
    finish(server).await;
    assert!(
        index_is_valid(&mut conn, &table).await,
        "the index was rebuilt valid"
    );
}

#[tokio::test]
async fn unreachable_database_degrades_the_relay() {
    let relay = sample_relay("orders", spec_for_table("outbox_messages"));
    let (ctx, handle) = mock_context(Settings::default());
    let unreachable = serde_json::to_value(secret(
        "orders-db",
        "url",
        &format!("postgres://postgres:{LEAK_CANARY}@127.0.0.1:1/test"),
    ))
    .unwrap();
    let script = vec![
        Step::get(format!("{SECRETS}/orders-db"), Reply::ok(unreachable)),
        Step::get(format!("{SECRETS}/orders-amqp"), Reply::ok(amqp_secret())),
        patch_status(|body| {
            let status = sent_status(body);
            assert_conditions(
                &status,
                &[
                    (DEGRADED, "True", "DatabaseUnreachable"),
                    (READY, "False", "DatabaseUnreachable"),
                    (INDEX_READY, "False", "DatabaseUnreachable"),
                ],
            );
            let degraded = conditions::find(&status.conditions, DEGRADED).unwrap();
            assert!(
                degraded.message.contains("127.0.0.1:1"),
                "{}",
                degraded.message
            );
        }),
        Step::write(
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/shop/events",
            |body| {
                assert_eq!(body["reason"], "DatabaseUnreachable");
                assert_eq!(body["type"], "Warning");
            },
        ),
    ];
    let server = serve(handle, script);

    let error = reconcile(relay.into(), ctx).await.unwrap_err();
    assert!(matches!(error, Error::DatabaseUnreachable(_)), "{error:?}");
    assert!(!error.to_string().contains(LEAK_CANARY), "{error}");
    let seen = finish(server).await;
    assert_no_secret_leaked(&seen);
}

#[tokio::test]
async fn busy_migration_lock_does_not_block_the_reconcile() {
    let table = create_outbox_table().await;
    // Hold the lock the migration takes, as a concurrent `outbox-relay migrate` would.
    let mut holder = connect().await;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
        .bind(format!("outbox-relay:migrate:\"{table}\""))
        .fetch_one(&mut holder)
        .await
        .unwrap();
    assert!(locked);

    let relay = sample_relay("orders", spec_for_table(&table));
    let (ctx, handle) = mock_context(Settings::default());
    let mut script = secret_steps();
    script.push(Step::get(
        DEPLOYMENT,
        Reply::not_found("deployments.apps", "orders"),
    ));
    script.push(apply_deployment(|_| {}));
    script.push(Step::event(NS, "DeploymentCreated"));
    script.push(patch_status(|body| {
        let status = sent_status(body);
        assert_conditions(
            &status,
            &[
                (INDEX_READY, "Unknown", "MigrationInProgress"),
                (READY, "False", "MigrationPending"),
            ],
        );
    }));
    let server = serve(handle, script);

    let action = reconcile(relay.into(), ctx).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(5)));
    finish(server).await;
}

#[test]
fn a_deployment_status_round_trips() {
    // Guards the fixtures: what `served` writes must read back as a DeploymentStatus.
    let value = served(
        json!({"metadata": {}, "spec": {"selector": {}, "template": {}}}),
        3,
        1,
        2,
    );
    let deployment: Deployment = serde_json::from_value(value).unwrap();
    assert_eq!(
        deployment.status,
        Some(DeploymentStatus {
            observed_generation: Some(3),
            replicas: Some(2),
            ready_replicas: Some(1),
            updated_replicas: Some(2),
            ..Default::default()
        })
    );
}

#[tokio::test]
async fn secret_problems_name_the_secret_but_never_its_value() {
    let relay = sample_relay("orders", spec_for_table("outbox_messages"));
    for (db, reason) in [
        (
            secret("orders-db", "dsn", &database_url_with_canary()),
            "SecretKeyMissing",
        ),
        (
            secret("orders-db", "url", &format!("mysql://u:{LEAK_CANARY}@h/db")),
            "SecretValueInvalid",
        ),
    ] {
        let (ctx, handle) = mock_context(Settings::default());
        let script = vec![
            Step::get(
                format!("{SECRETS}/orders-db"),
                Reply::ok(serde_json::to_value(db).unwrap()),
            ),
            Step::get(format!("{SECRETS}/orders-amqp"), Reply::ok(amqp_secret())),
            patch_status(move |body| {
                let status = sent_status(body);
                assert_conditions(&status, &[(READY, "False", reason)]);
                let ready = conditions::find(&status.conditions, READY).unwrap();
                assert!(ready.message.contains("orders-db"), "{}", ready.message);
            }),
            Step::event(NS, reason),
        ];
        let server = serve(handle, script);
        let error = reconcile(relay.clone().into(), ctx).await.unwrap_err();
        assert_eq!(error.user_facing_reason(), Some(reason));
        let seen = finish(server).await;
        assert_no_secret_leaked(&seen);
    }
}

#[tokio::test]
async fn a_missing_table_fails_the_migration_with_the_spec_field() {
    let missing = format!("obr_missing_{}", uuid::Uuid::new_v4().simple());
    let relay = sample_relay("orders", spec_for_table(&missing));
    let (ctx, handle) = mock_context(Settings::default());
    let mut script = secret_steps();
    script.push(patch_status(|body| {
        let status = sent_status(body);
        assert_conditions(
            &status,
            &[
                (INDEX_READY, "False", "MigrationFailed"),
                (DEGRADED, "True", "MigrationFailed"),
            ],
        );
        let degraded = conditions::find(&status.conditions, DEGRADED).unwrap();
        assert!(
            degraded.message.contains("spec.database.table")
                && degraded.message.contains("does not exist"),
            "{}",
            degraded.message
        );
    }));
    script.push(Step::event(NS, "MigrationFailed"));
    let server = serve(handle, script);

    let error = reconcile(relay.into(), ctx).await.unwrap_err();
    assert_eq!(error.metric_label(), "migration_failed");
    finish(server).await;
}

#[tokio::test]
async fn an_id_without_a_unique_index_is_refused_with_its_own_reason() {
    let table = create_outbox_table().await;
    let mut conn = crate::test_support::connect().await;
    // The fixture's table has a primary key; take it away, as a user's table might lack one.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE \"{table}\" DROP CONSTRAINT \"{table}_pkey\""
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let relay = sample_relay("orders", spec_for_table(&table));
    let (ctx, handle) = mock_context(Settings::default());
    let mut script = secret_steps();
    script.push(patch_status(|body| {
        let status = sent_status(body);
        assert_conditions(
            &status,
            &[
                (READY, "False", "IdNotUnique"),
                (INDEX_READY, "False", "IdNotUnique"),
            ],
        );
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert!(
            ready.message.contains("spec.database.columns.id")
                && ready.message.contains("has no primary key or unique index")
                && ready.message.contains("add PRIMARY KEY (id)"),
            "{}",
            ready.message
        );
    }));
    script.push(Step::event(NS, "IdNotUnique"));
    let server = serve(handle, script);

    let error = reconcile(relay.into(), ctx).await.unwrap_err();
    assert_eq!(error.metric_label(), "id_not_unique");
    finish(server).await;
}

/// A relay with a scaling block, its table migrated (so the report table exists) and the
/// migration remembered, so the script starts at the Deployment.
async fn scaling_relay(
    min: i32,
    max: i32,
    target: i64,
) -> (
    OutboxRelay,
    String,
    std::sync::Arc<crate::controller::Context>,
    crate::fixtures::Handle,
) {
    // Each test gets its own schema, so its report table is its own: the reports of all
    // these tests speak for the same relay name, shop/orders.
    let table = create_outbox_table().await;
    let schema = format!("s_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {schema}; ALTER TABLE \"{table}\" SET SCHEMA {schema}"
    )))
    .execute(&mut connect().await)
    .await
    .unwrap();
    let table = format!("{schema}.{table}");
    let mut relay = sample_relay("orders", spec_for_table(&table));
    relay.spec.scaling = Some(
        serde_json::from_value(
            json!({"minReplicas": min, "maxReplicas": max, "targetBacklogPerReplica": target}),
        )
        .unwrap(),
    );
    let plan = validate(&relay.spec).unwrap();
    outbox_relay::table::migrate::migrate(&mut connect().await, &plan.table, &plan.migration)
        .await
        .unwrap();
    let (ctx, handle) = mock_context(Settings::default());
    ctx.migrations.remember(MigrationKey {
        relay_uid: "uid-orders".into(),
        generation: 1,
        secrets_fingerprint: "orders-amqp=7,orders-db=7".into(),
    });
    (relay, table, ctx, handle)
}

fn live_deployment(relay: &OutboxRelay, replicas: i32) -> Value {
    let plan = validate(&relay.spec).unwrap();
    let fingerprint = "orders-amqp=7,orders-db=7";
    let deployment = build_deployment(
        relay,
        &plan,
        fingerprint,
        replicas,
        &BuildSettings::default(),
    );
    served(
        serde_json::to_value(&deployment).unwrap(),
        1,
        replicas,
        replicas,
    )
}

fn outbox_table(table: &str) -> outbox_relay::table::OutboxTable {
    outbox_relay::table::OutboxTable::new(
        outbox_relay::table::ident::TableName::parse(table).unwrap(),
    )
}

async fn report_backlog(table: &str, pod: &str, backlog: Option<i64>, rate: f64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (relay, pod, backlog, publish_rate) VALUES ('shop/orders', $1, $2, $3)",
        outbox_table(table).reports_table().quoted()
    )))
    .bind(pod)
    .bind(backlog)
    .bind(rate)
    .execute(&mut connect().await)
    .await
    .unwrap();
}

fn scale_event(reason: &'static str, needle: &'static str) -> Step {
    Step::write(
        Method::POST,
        "/apis/events.k8s.io/v1/namespaces/shop/events",
        move |body| {
            assert_eq!(body["reason"], reason, "{body}");
            let note = body["note"].as_str().unwrap_or_default();
            assert!(note.contains(needle), "{note}");
        },
    )
}

#[tokio::test]
async fn reported_backlog_scales_up_within_the_rate_policy_with_an_event() {
    let (relay, table, ctx, handle) = scaling_relay(1, 10, 1000).await;
    report_backlog(&table, "orders-a", Some(9_000), 120.0).await;
    report_backlog(&table, "orders-b", None, 80.0).await;
    let mut script = secret_steps();
    script.push(Step::get(DEPLOYMENT, Reply::ok(live_deployment(&relay, 1))));
    script.push(Step::new(Method::PATCH, DEPLOYMENT, |body| {
        // 9 asked for; from 1 pod the default policies allow max(+100 %, +4) = 5.
        assert_eq!(body["spec"]["replicas"], 5);
        Reply::ok(served(body.clone(), 2, 1, 5))
    }));
    script.push(Step::event(NS, "DeploymentUpdated"));
    script.push(scale_event(
        "ScaledUp",
        "from 1 to 5 replicas: backlog 9000 asks for 9",
    ));
    script.push(patch_status(|body| {
        let status = sent_status(body);
        assert_eq!(status.desired_replicas, Some(5));
        assert_eq!(status.backlog, Some(9_000));
        assert_eq!(status.publish_rate, Some(200.0));
        assert!(status.last_scale_time.is_some());
        assert_conditions(
            &status,
            &[
                ("ScalingActive", "True", "ValidBacklog"),
                ("ScalingLimited", "True", "ScaleUpLimit"),
            ],
        );
    }));
    let server = serve(handle, script);
    let action = reconcile(relay.into(), ctx).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(15)));
    finish(server).await;
}

#[tokio::test]
async fn at_zero_pods_the_operator_measures_and_wakes_the_relay() {
    let (relay, table, ctx, handle) = scaling_relay(0, 4, 1000).await;
    let mut conn = connect().await;
    outbox_relay::tools::seed::copy_rows(&mut conn, &outbox_table(&table), 30, 50, |_| {})
        .await
        .unwrap();
    let mut script = secret_steps();
    script.push(Step::get(DEPLOYMENT, Reply::ok(live_deployment(&relay, 0))));
    script.push(Step::new(Method::PATCH, DEPLOYMENT, |body| {
        assert_eq!(body["spec"]["replicas"], 1);
        Reply::ok(served(body.clone(), 2, 0, 1))
    }));
    script.push(Step::event(NS, "DeploymentUpdated"));
    script.push(scale_event("ScaledUp", "from 0 to 1 replicas: backlog 30"));
    script.push(patch_status(|body| {
        let status = sent_status(body);
        assert_eq!(status.backlog, Some(30));
        let active = conditions::find(&status.conditions, "ScalingActive").unwrap();
        assert!(
            active.message.contains("measured by the operator"),
            "{}",
            active.message
        );
    }));
    let server = serve(handle, script);
    reconcile(relay.into(), ctx).await.unwrap();
    finish(server).await;
}

#[tokio::test]
async fn stale_reports_run_the_fallback_never_zero() {
    let (mut relay, _table, ctx, handle) = scaling_relay(0, 10, 1000).await;
    relay.spec.scaling.as_mut().unwrap().fallback.replicas = 2;
    // Three pods run, none has reported: the backlog is unknown.
    let mut script = secret_steps();
    script.push(Step::get(DEPLOYMENT, Reply::ok(live_deployment(&relay, 3))));
    script.push(Step::new(Method::PATCH, DEPLOYMENT, |body| {
        assert_eq!(body["spec"]["replicas"], 2);
        Reply::ok(served(body.clone(), 2, 2, 2))
    }));
    script.push(Step::event(NS, "DeploymentUpdated"));
    script.push(scale_event("ScaledDown", "fallback of 2 replicas"));
    script.push(patch_status(|body| {
        let status = sent_status(body);
        assert_eq!(status.desired_replicas, Some(2));
        assert_conditions(
            &status,
            &[
                ("ScalingActive", "False", "StaleReports"),
                ("ScalingLimited", "True", "StaleReports"),
            ],
        );
    }));
    let server = serve(handle, script);
    reconcile(relay.into(), ctx).await.unwrap();
    finish(server).await;
}

/// Collects everything the operator logs during a test, to search it for secrets.
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Bad input, table-driven: each case becomes Ready=False with a reason and a message naming
/// the field, a Warning event, no Deployment write and no migration; and no Secret value
/// shows up in any request, log line or error.
#[tokio::test]
async fn bad_input_becomes_a_condition_naming_the_field_and_writes_nothing() {
    type Mutation = Box<dyn Fn(&mut OutboxRelay)>;
    let table = create_outbox_table().await;
    let cases: Vec<(Mutation, Option<&str>, &str, &str)> = vec![
        (
            Box::new(|r| r.spec.database.table = "orders\"; DROP TABLE x; --".into()),
            None,
            "InvalidSpec",
            "spec.database.table",
        ),
        (
            Box::new(|r| r.spec.database.table = "tab le".into()),
            None,
            "InvalidSpec",
            "spec.database.table",
        ),
        (
            Box::new(|r| r.spec.database.table = "tablé".into()),
            None,
            "InvalidSpec",
            "spec.database.table",
        ),
        (
            Box::new(|r| r.spec.database.table = "t".repeat(64)),
            None,
            "InvalidSpec",
            "spec.database.table",
        ),
        (
            Box::new(|r| r.spec.database.table = String::new()),
            None,
            "InvalidSpec",
            "spec.database.table",
        ),
        (
            Box::new(|r| r.spec.database.columns.payload = "pay;load".into()),
            None,
            "InvalidSpec",
            "spec.database.columns.payload",
        ),
        (
            Box::new(|r| r.spec.relay.batch_size = -1),
            None,
            "InvalidSpec",
            "spec.relay.batchSize",
        ),
        (
            Box::new(|r| r.spec.relay.batch_size = i32::MAX),
            None,
            "InvalidSpec",
            "spec.relay.batchSize",
        ),
        (
            Box::new(|r| r.spec.relay.workers_per_pod = 0),
            None,
            "InvalidSpec",
            "spec.relay.workersPerPod",
        ),
        (
            Box::new(|r| r.spec.relay.publish_timeout = "soon".into()),
            None,
            "InvalidSpec",
            "spec.relay.publishTimeout",
        ),
        (
            Box::new(|r| r.spec.broker.exchange = "x".repeat(300)),
            None,
            "InvalidSpec",
            "spec.broker.exchange",
        ),
        (
            Box::new(|_| {}),
            Some("mysql://root:{canary}@db/x"),
            "SecretValueInvalid",
            "orders-db",
        ),
        (
            Box::new(|_| {}),
            Some("postgres://:{canary}@/x"),
            "SecretValueInvalid",
            "orders-db",
        ),
    ];
    let logs = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::TRACE)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    for (mutate, db_url, reason, field) in cases {
        let mut relay = sample_relay("orders", spec_for_table(&table));
        mutate(&mut relay);
        let (ctx, handle) = mock_context(Settings::default());
        let db_secret = match db_url {
            None => db_secret(),
            Some(url) => serde_json::to_value(secret(
                "orders-db",
                "url",
                &url.replace("{canary}", LEAK_CANARY),
            ))
            .unwrap(),
        };
        let expected_reason = reason;
        let expected_field = field.to_string();
        let script = vec![
            Step::get(format!("{SECRETS}/orders-db"), Reply::ok(db_secret)),
            Step::get(format!("{SECRETS}/orders-amqp"), Reply::ok(amqp_secret())),
            patch_status(move |body| {
                let status = sent_status(body);
                assert_conditions(
                    &status,
                    &[
                        (READY, "False", expected_reason),
                        (DEGRADED, "True", expected_reason),
                    ],
                );
                let ready = conditions::find(&status.conditions, READY).unwrap();
                assert!(
                    ready.message.contains(&expected_field),
                    "{} does not name {expected_field}",
                    ready.message
                );
            }),
            Step::event(NS, reason),
        ];
        let server = serve(handle, script);
        let error = reconcile(relay.into(), ctx).await.unwrap_err();
        assert_eq!(error.user_facing_reason(), Some(reason), "{error}");
        assert!(!error.to_string().contains(LEAK_CANARY), "{error}");
        let seen = finish(server).await;
        assert!(
            !seen.iter().any(|e| e.uri.contains("/deployments/")),
            "a bad spec must not touch the Deployment: {seen:#?}"
        );
        assert_no_secret_leaked(&seen);
    }
    // Nothing was migrated: the table has no pending-row index.
    let indexes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexname LIKE '%pending%'",
    )
    .bind(&table)
    .fetch_one(&mut connect().await)
    .await
    .unwrap();
    assert_eq!(indexes, 0);
    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        !logged.is_empty(),
        "the capture should have seen the reconciler's logs"
    );
    assert!(
        !logged.contains(LEAK_CANARY),
        "a Secret value reached the logs:\n{logged}"
    );
}
