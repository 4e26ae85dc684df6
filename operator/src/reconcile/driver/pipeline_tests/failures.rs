//! Failures the user can act on: each becomes conditions naming the cause, a Warning event,
//! and a retry with backoff; none writes a Deployment.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;

use super::scenario::{Scenario, amqp_secret, assert_conditions, message, orders_relay};
use crate::crd::OutboxRelay;
use crate::reconcile::status::conditions::{DEGRADED, INDEX_READY, READY, RECONCILING, STALLED};
use crate::reconcile::{Error, error_policy};
use crate::test_support::api_server::Reply;
use crate::test_support::{LEAK_CANARY, database_url_with_canary, secret};

#[tokio::test]
async fn missing_secret_is_reported_without_a_deployment() {
    let mut backoffs = Vec::new();
    let outcome = Scenario::new(orders_relay("outbox_messages"))
        .reads_secret("orders-db", Reply::not_found("secrets", "orders-db"))
        .writes_status(|status| {
            assert_conditions(
                status,
                &[
                    (READY, "False", "SecretNotFound"),
                    (DEGRADED, "True", "SecretNotFound"),
                    // A person must create it: kstatus reads Failed, not InProgress.
                    (STALLED, "True", "SecretNotFound"),
                    (RECONCILING, "False", "SecretNotFound"),
                ],
            );
            let ready = message(status, READY);
            assert!(ready.contains("orders-db"), "{ready}");
            assert_eq!(status.observed_generation, Some(1));
        })
        .event_checked("SecretNotFound", |body| {
            assert_eq!(body["type"], "Warning");
            assert_eq!(body["regarding"]["name"], "orders");
        })
        .run_then(|relay, ctx, result| {
            // Backed off: 5 s, then 10 s for the next failure in a row.
            let error = result.as_ref().unwrap_err();
            for _ in 0..2 {
                backoffs.push(error_policy(relay.clone(), error, ctx.clone()));
            }
        })
        .await;
    assert!(
        matches!(outcome.error(), Error::SecretNotFound { name } if name == "orders-db"),
        "{:?}",
        outcome.error()
    );
    assert_eq!(
        backoffs,
        vec![
            Action::requeue(Duration::from_secs(5)),
            Action::requeue(Duration::from_secs(10))
        ]
    );
    assert!(!outcome.seen.iter().any(|e| e.uri.contains("/deployments")));
    assert!(outcome.database.is_empty(), "{:?}", outcome.database);
}

#[tokio::test]
async fn secret_problems_name_the_secret_but_never_its_value() {
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
        let outcome = Scenario::new(orders_relay("outbox_messages"))
            .reads_secret("orders-db", Reply::ok(serde_json::to_value(db).unwrap()))
            .reads_secret("orders-amqp", Reply::ok(amqp_secret()))
            .writes_status(move |status| {
                assert_conditions(status, &[(READY, "False", reason)]);
                let ready = message(status, READY);
                assert!(ready.contains("orders-db"), "{ready}");
            })
            .event(reason)
            .run()
            .await;
        assert_eq!(outcome.error().user_facing_reason(), Some(reason));
    }
}

/// The database steps' failures, as the database answers them, become their conditions.
async fn database_failure(
    error: Error,
    check: impl FnOnce(&crate::OutboxRelayStatus) + Send + 'static,
    reason: &'static str,
) -> Error {
    let error = Arc::new(std::sync::Mutex::new(Some(error)));
    let outcome = Scenario::new(orders_relay("outbox_messages"))
        .database(move |db| db.migration(move |_| Err(error.lock().unwrap().take().unwrap())))
        .reads_secrets()
        .writes_status(check)
        .warning(reason, "")
        .run()
        .await;
    assert!(!outcome.seen.iter().any(|e| e.uri.contains("/deployments")));
    outcome.result.unwrap_err()
}

#[tokio::test]
async fn unreachable_database_degrades_the_relay() {
    let error = database_failure(
        Error::DatabaseUnreachable(
            "connection refused (postgres://app:***@127.0.0.1:1/test)".into(),
        ),
        |status| {
            assert_conditions(
                status,
                &[
                    (DEGRADED, "True", "DatabaseUnreachable"),
                    (READY, "False", "DatabaseUnreachable"),
                    (INDEX_READY, "False", "DatabaseUnreachable"),
                    // Retried by the operator: in progress until it has lasted 5 minutes.
                    (RECONCILING, "True", "DatabaseUnreachable"),
                    (STALLED, "False", "DatabaseUnreachable"),
                ],
            );
            let degraded = message(status, DEGRADED);
            assert!(degraded.contains("127.0.0.1:1"), "{degraded}");
        },
        "DatabaseUnreachable",
    )
    .await;
    assert!(matches!(error, Error::DatabaseUnreachable(_)), "{error:?}");
}

#[tokio::test]
async fn a_missing_table_fails_the_migration_with_the_spec_field() {
    let error = database_failure(
        Error::MigrationFailed(
            "invalid spec.database.table: table obr_missing does not exist; create it or fix the name".into(),
        ),
        |status| {
            assert_conditions(
                status,
                &[
                    (INDEX_READY, "False", "MigrationFailed"),
                    (DEGRADED, "True", "MigrationFailed"),
                ],
            );
            let degraded = message(status, DEGRADED);
            assert!(
                degraded.contains("spec.database.table") && degraded.contains("does not exist"),
                "{degraded}"
            );
        },
        "MigrationFailed",
    )
    .await;
    assert_eq!(error.metric_label(), "migration_failed");
}

#[tokio::test]
async fn an_id_without_a_unique_index_is_refused_with_its_own_reason() {
    let error = database_failure(
        Error::IdNotUnique(
            "spec.database.columns.id: column id of table t has no primary key or unique index; \
             settling by id needs unique ids: add PRIMARY KEY (id)"
                .into(),
        ),
        |status| {
            assert_conditions(
                status,
                &[
                    (READY, "False", "IdNotUnique"),
                    (INDEX_READY, "False", "IdNotUnique"),
                ],
            );
            let ready = message(status, READY);
            assert!(
                ready.contains("spec.database.columns.id")
                    && ready.contains("has no primary key or unique index")
                    && ready.contains("add PRIMARY KEY (id)"),
                "{ready}"
            );
        },
        "IdNotUnique",
    )
    .await;
    assert_eq!(error.metric_label(), "id_not_unique");
}

/// Collects everything the operator logs during a test, to search it for secrets.
#[derive(Clone, Default)]
struct LogBuffer(Arc<std::sync::Mutex<Vec<u8>>>);

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
            Box::new(|r| r.spec.broker.exchange = Some("x".repeat(300))),
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
    // The process-wide default, not a thread-local one: tests on other threads register the
    // same callsites concurrently, and a thread-local subscriber can then miss an event whose
    // interest another thread cached as "never" (it did, in CI). Every other test's log lines
    // land here too, which only widens the leak check. The rebuild makes callsites registered
    // before this point see the new subscriber.
    tracing::subscriber::set_global_default(subscriber)
        .expect("no other test of this binary sets a global subscriber");
    tracing::callsite::rebuild_interest_cache();

    for (mutate, db_url, reason, field) in cases {
        let mut relay = orders_relay("outbox_messages");
        mutate(&mut relay);
        let db_secret = match db_url {
            None => super::scenario::db_secret(),
            Some(url) => {
                let url = url.replace("{canary}", LEAK_CANARY);
                serde_json::to_value(secret("orders-db", "url", &url)).unwrap()
            }
        };
        let expected_field = field.to_string();
        let outcome = Scenario::new(relay)
            .reads_secret("orders-db", Reply::ok(db_secret))
            .reads_secret("orders-amqp", Reply::ok(amqp_secret()))
            .writes_status(move |status| {
                assert_conditions(
                    status,
                    &[(READY, "False", reason), (DEGRADED, "True", reason)],
                );
                let ready = message(status, READY);
                assert!(
                    ready.contains(&expected_field),
                    "{ready} does not name {expected_field}"
                );
            })
            .event(reason)
            // The controller runs the error policy after every failure; it logs the error.
            .run_then(|relay, ctx, result| {
                error_policy(relay, result.as_ref().unwrap_err(), ctx);
            })
            .await;
        assert_eq!(
            outcome.error().user_facing_reason(),
            Some(reason),
            "{}",
            outcome.error()
        );
        assert!(
            !outcome.seen.iter().any(|e| e.uri.contains("/deployments/")),
            "a bad spec must not touch the Deployment: {:#?}",
            outcome.seen
        );
        // Nothing was migrated.
        assert!(outcome.database.is_empty(), "{:?}", outcome.database);
    }
    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        logged.contains("reconcile failed"),
        "the capture should have seen the error policy's log lines:\n{logged}"
    );
    assert!(
        !logged.contains(LEAK_CANARY),
        "a Secret value reached the logs:\n{logged}"
    );
}

/// What a pod reported as its problem, as the database reads it back.
fn missing_exchange(pods: &[&str]) -> crate::reconcile::database::PodProblem {
    crate::reconcile::database::PodProblem {
        reason: "ExchangeNotFound".into(),
        message: "exchange orders does not exist on vhost /: declare it, or pass \
                  --declare-exchange TYPE"
            .into(),
        pods: pods.iter().map(|p| p.to_string()).collect(),
    }
}

#[tokio::test]
async fn pods_that_report_a_missing_exchange_make_the_relay_not_ready_with_an_event() {
    let relay = orders_relay("outbox_messages");
    let live = super::scenario::live_deployment(&relay, 1);
    let outcome = Scenario::new(relay)
        .migrated_before()
        .database(|db| {
            db.lag(|_| {
                Ok(crate::reconcile::database::LagObservation {
                    reporting_pods: 1,
                    problem: Some(missing_exchange(&["orders-7f9c"])),
                    ..Default::default()
                })
            })
        })
        .reads_secrets()
        .finds_deployment(live)
        .keeps_deployment()
        .warning(
            "ExchangeNotFound",
            "pod orders-7f9c cannot relay: exchange orders does not exist",
        )
        .writes_status(|status| {
            assert_conditions(
                status,
                &[
                    (READY, "False", "ExchangeNotFound"),
                    (DEGRADED, "True", "ExchangeNotFound"),
                ],
            );
            let ready = message(status, READY);
            assert!(ready.contains("--declare-exchange TYPE"), "{ready}");
        })
        .run()
        .await;
    // The pods run; nothing about the Deployment changes, and the reconcile itself succeeded.
    assert!(outcome.result.is_ok());
}

#[test]
fn a_pod_problem_is_announced_when_it_starts_not_while_it_lasts() {
    use crate::reconcile::status::conditions::{NewCondition, set_condition};
    use crate::reconcile::status::events::problem_started;
    let problem = missing_exchange(&["orders-7f9c"]);
    let mut status = crate::OutboxRelayStatus::default();
    assert!(problem_started(None, &problem));
    let now = k8s_openapi::jiff::Timestamp::now();
    let available = NewCondition::new(READY, true, "Available", "1 of 1 relay pods ready");
    set_condition(&mut status.conditions, available, Some(1), now);
    assert!(problem_started(Some(&status), &problem));
    let blocked = NewCondition::new(READY, false, "ExchangeNotFound", "pod orders-7f9c ...");
    set_condition(&mut status.conditions, blocked, Some(1), now);
    assert!(!problem_started(Some(&status), &problem));
}

#[tokio::test]
async fn a_table_another_relay_holds_stalls_this_one_before_it_runs_pods() {
    let outcome = Scenario::new(orders_relay("outbox_messages"))
        .migrated_before()
        .database(|db| {
            db.lag(|_| {
                Err(Error::TableClaimed {
                    table: "outbox_messages".into(),
                    relay: "billing/orders".into(),
                    renewed_seconds_ago: 20.0,
                })
            })
        })
        .reads_secrets()
        .finds_no_deployment()
        .writes_status(|status| {
            assert_conditions(
                status,
                &[
                    (READY, "False", "TableClaimedByAnotherRelay"),
                    (STALLED, "True", "TableClaimedByAnotherRelay"),
                ],
            );
            let stalled = message(status, STALLED);
            assert!(stalled.contains("OutboxRelay billing/orders"), "{stalled}");
        })
        .warning("TableClaimedByAnotherRelay", "billing/orders")
        .run()
        .await;
    // Read, never written: no Deployment, so no pod relays the table a second time.
    assert!(outcome.left_the_deployment_alone());
    assert!(matches!(outcome.result, Err(Error::TableClaimed { .. })));
}

#[tokio::test]
async fn a_read_only_standby_behind_the_url_makes_the_relay_not_ready_with_its_own_reason() {
    let standby = "127.0.0.1:5433 is a read-only standby (in recovery); waiting for a primary";
    let outcome = Scenario::new(orders_relay("outbox_messages"))
        .migrated_before()
        .database(|db| db.lag(|_| Err(Error::DatabaseReadOnly(standby.into()))))
        .reads_secrets()
        .finds_no_deployment()
        .writes_status(|status| {
            assert_conditions(status, &[(READY, "False", "DatabaseReadOnly")]);
            let ready = message(status, READY);
            assert!(ready.contains("read-only standby"), "{ready}");
        })
        .warning("DatabaseReadOnly", "waiting for a primary")
        .run()
        .await;
    // Nothing written but the status: the pods wait for a primary as they are.
    assert!(outcome.left_the_deployment_alone());
    assert!(matches!(outcome.result, Err(Error::DatabaseReadOnly(_))));
}
