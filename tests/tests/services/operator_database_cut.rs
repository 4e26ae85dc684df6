//! The operator's database steps behind a connection that stops answering (a proxy that holds
//! every byte, as a silent cut looks to the client): each step gives up within its bound with
//! `DatabaseUnreachable`, and gives its session back, so the next step on that database runs
//! as soon as the path answers again (issue 53: the operator's database step behind a cut).

use std::time::{Duration, Instant};

use outbox_operator::OutboxRelaySpec;
use outbox_operator::reconcile::database::postgres::PostgresDatabase;
use outbox_operator::reconcile::database::{LagQuery, RelayDatabase};
use outbox_operator::reconcile::driver::error::Error;
use outbox_operator::reconcile::input::validate::{RelayPlan, validate};
use outbox_relay::connect::secret_url::{SecretUrl, UrlKind};
use outbox_relay::database::DatabaseTarget;
use outbox_tests::{db, proxy, unique};

/// The bound the test gives the steps (production: `STEP_TIMEOUT`, 30 s).
const STEP_BOUND: Duration = Duration::from_secs(3);

/// How much later than its bound a step may give up on a busy machine.
const SLACK: Duration = Duration::from_secs(2);

fn plan_for(table: &str) -> RelayPlan {
    let spec: OutboxRelaySpec = serde_json::from_value(serde_json::json!({
        "database": {"urlSecretRef": {"name": "db"}, "table": table},
        "broker": {"urlSecretRef": {"name": "amqp"}},
    }))
    .unwrap();
    validate(&spec).unwrap()
}

fn query(relay: &str) -> LagQuery {
    LagQuery {
        relay_name: relay.to_owned(),
        running: 0,
        stale_after: Duration::from_secs(30),
    }
}

/// The step's error and how long it took; a panic if it succeeded or never ended.
async fn failing<T: std::fmt::Debug>(
    step: impl Future<Output = Result<T, Error>>,
) -> (Error, Duration) {
    let started = Instant::now();
    // Without a bound of its own the step would wait on the stalled path forever.
    let outcome = tokio::time::timeout(STEP_BOUND * 4, step)
        .await
        .unwrap_or_else(|_| panic!("the step never gave up behind the stalled path"));
    let took = started.elapsed();
    match outcome {
        Ok(value) => panic!("the step succeeded behind a stalled path: {value:?}"),
        Err(error) => (error, took),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_behind_a_stalled_path_gives_up_within_its_bound_and_frees_its_session() {
    let name = unique("operator_cut");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 100).await;
    outbox_relay::table::migrate::migrate(&mut conn, &table, &Default::default())
        .await
        .expect("migrate the table");
    let plan = plan_for(&name);
    let relay = format!("cut/{name}");
    let (url, switch) = proxy::start_for_url(&outbox_tests::database_url())
        .await
        .expect("a proxy in front of PostgreSQL");
    let target = DatabaseTarget::from_url(SecretUrl::parse(&url, UrlKind::Postgres).unwrap());
    // One session per database: a step that kept its session would hold up the next forever.
    let database = PostgresDatabase::new(1).with_step_timeout(STEP_BOUND);

    let seen = database
        .observe_lag(&target, &plan, query(&relay))
        .await
        .expect("the lag through a healthy path");
    assert_eq!(seen.backlog, Some(100), "{seen:?}");

    switch.stall();
    let (error, took) = failing(database.observe_lag(&target, &plan, query(&relay))).await;
    eprintln!("observing the lag behind the stall: {error} after {took:?}");
    assert!(
        matches!(&error, Error::DatabaseUnreachable(m) if m.contains("did not answer within 3 s")),
        "{error:?}"
    );
    assert!(took >= STEP_BOUND && took <= STEP_BOUND + SLACK, "{took:?}");

    let (error, took) = failing(database.migrate(&target, &plan, &relay)).await;
    eprintln!("migrating behind the stall: {error} after {took:?}");
    assert!(
        matches!(&error, Error::DatabaseUnreachable(m) if m.starts_with("claiming the table")),
        "{error:?}"
    );
    assert!(took >= STEP_BOUND && took <= STEP_BOUND + SLACK, "{took:?}");

    // The path answers again: the next step gets the database's one session at once.
    switch.resume();
    let started = Instant::now();
    let seen = database
        .observe_lag(&target, &plan, query(&relay))
        .await
        .expect("the lag once the path answers again");
    assert_eq!(seen.backlog, Some(100), "{seen:?}");
    assert!(started.elapsed() < STEP_BOUND, "{:?}", started.elapsed());
}
