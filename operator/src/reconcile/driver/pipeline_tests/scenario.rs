//! A builder for request-level reconcile tests: the relay, what the database answers, and the
//! requests the API server expects in order, each with its reply and its check.
//!
//! Every scenario also checks, whatever it is about, that no request body carries a Secret
//! value (the fixtures' Secrets hold [`LEAK_CANARY`]).

use std::sync::Arc;

use http::{Method, StatusCode};
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::crd::{OutboxRelay, OutboxRelayStatus};
use crate::reconcile::build::{BuildSettings, build_deployment};
use crate::reconcile::input::validate::validate;
use crate::reconcile::migrate::MigrationKey;
use crate::reconcile::status::conditions;
use crate::reconcile::{Context, Error, Settings, reconcile};
use crate::test_support::api_server::{Exchange, Reply, Step, finish, mock_context, serve};
use crate::test_support::database::{DatabaseCall, ScriptedDatabase};
use crate::test_support::{LEAK_CANARY, database_url_with_canary, sample_relay, secret};

const SECRETS: &str = "/api/v1/namespaces/shop/secrets";
const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/shop/deployments/orders";
/// The relay's pods are listed (by label selector) after the Deployment is read.
const PODS: &str = "/api/v1/namespaces/shop/pods";
const STATUS: &str = "/apis/outboxrelay.io/v1beta1/namespaces/shop/outboxrelays/orders/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/shop/events";
const BUDGET: &str = "/apis/policy/v1/namespaces/shop/poddisruptionbudgets/orders";
/// The OutboxRelay itself: the finalizer helper patches its metadata.
const RELAY: &str = "/apis/outboxrelay.io/v1beta1/namespaces/shop/outboxrelays/orders";
/// The versions of the fixtures' two Secrets, as the pipeline fingerprints them.
pub const SECRETS_FINGERPRINT: &str = "orders-amqp=7,orders-db=7";

/// What a scenario's reconcile did.
pub struct Outcome {
    pub result: Result<Action, Error>,
    /// Every request the API server received, in order.
    pub seen: Vec<Exchange>,
    pub database: Vec<DatabaseCall>,
}

impl Outcome {
    pub fn action(&self) -> &Action {
        self.result.as_ref().expect("the reconcile succeeded")
    }

    pub fn error(&self) -> &Error {
        self.result.as_ref().expect_err("the reconcile failed")
    }

    /// True when the reconcile wrote nothing to a Deployment (it may have read one).
    pub fn left_the_deployment_alone(&self) -> bool {
        !self
            .seen
            .iter()
            .any(|e| e.uri.contains("/deployments") && e.method != Method::GET)
    }

    pub fn migrations(&self) -> usize {
        let migrations = self.database.iter();
        migrations
            .filter(|c| matches!(c, DatabaseCall::Migrate(_)))
            .count()
    }
}

pub struct Scenario {
    relay: OutboxRelay,
    settings: Settings,
    database: ScriptedDatabase,
    migrated_before: bool,
    script: Vec<Step>,
}

impl Scenario {
    pub fn new(relay: OutboxRelay) -> Self {
        Self {
            relay,
            settings: Settings::default(),
            database: ScriptedDatabase::default(),
            migrated_before: false,
            script: Vec::new(),
        }
    }

    /// Changes what the database answers.
    pub fn database(mut self, script: impl FnOnce(ScriptedDatabase) -> ScriptedDatabase) -> Self {
        self.database = script(self.database);
        self
    }

    /// This process migrated the relay's generation before, so the pipeline skips the step.
    pub fn migrated_before(mut self) -> Self {
        self.migrated_before = true;
        self
    }

    /// Both Secrets are read and exist.
    pub fn reads_secrets(self) -> Self {
        self.reads_secret("orders-db", Reply::ok(db_secret()))
            .reads_secret("orders-amqp", Reply::ok(amqp_secret()))
    }

    pub fn reads_secret(self, name: &str, reply: Reply) -> Self {
        self.expect(Step::get(format!("{SECRETS}/{name}"), reply))
    }

    /// An event with this reason, after `check` looked at it.
    pub fn event_checked(
        self,
        reason: &'static str,
        check: impl FnOnce(&Value) + Send + 'static,
    ) -> Self {
        self.expect(Step::write(Method::POST, EVENTS, move |body| {
            assert_eq!(body["reason"], reason, "event {body}");
            check(body);
        }))
    }

    pub fn event(self, reason: &'static str) -> Self {
        self.event_checked(reason, |_| {})
    }

    /// A Warning event whose note contains `needle`.
    pub fn warning(self, reason: &'static str, needle: &'static str) -> Self {
        self.event_checked(reason, move |body| {
            assert_eq!(body["type"], "Warning", "{body}");
            let note = body["note"].as_str().unwrap_or_default();
            assert!(note.contains(needle), "{note}");
        })
    }

    /// The Deployment is read; it does not exist (nor do pods).
    pub fn finds_no_deployment(self) -> Self {
        self.expect(Step::get(
            DEPLOYMENT,
            Reply::not_found("deployments.apps", "orders"),
        ))
        .finds_pods(Vec::new())
    }

    /// The Deployment is read; the API server has `live`, and its pods are all well.
    pub fn finds_deployment(self, live: Value) -> Self {
        self.finds_deployment_with_pods(live, Vec::new())
    }

    /// The Deployment is read, then its pods: `pods`.
    pub fn finds_deployment_with_pods(self, live: Value, pods: Vec<Value>) -> Self {
        self.expect(Step::get(DEPLOYMENT, Reply::ok(live)))
            .finds_pods(pods)
    }

    fn finds_pods(self, pods: Vec<Value>) -> Self {
        let list = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods});
        self.expect(Step::get(PODS, Reply::ok(list)))
    }

    /// The Deployment is applied, checked, and served back at `generation` with its replicas
    /// `ready`; then the relay pods' PodDisruptionBudget is applied.
    pub fn applies_deployment(
        self,
        generation: i64,
        ready: i32,
        check: impl FnOnce(&Value) + Send + 'static,
    ) -> Self {
        self.expect(Step::new(Method::PATCH, DEPLOYMENT, move |body| {
            check(body);
            let replicas = body["spec"]["replicas"].as_i64().unwrap_or(0) as i32;
            Reply::ok(served(
                body.clone(),
                generation,
                ready.min(replicas),
                replicas,
            ))
        }))
        // The relay pods' disruption budget goes with it: at most one pod at a time.
        .expect(Step::write(Method::PATCH, BUDGET, |body| {
            assert_eq!(body["spec"]["maxUnavailable"], 1, "{body}");
            assert_eq!(
                body["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
                "orders"
            );
            assert_eq!(
                body["metadata"]["ownerReferences"][0]["kind"],
                "OutboxRelay"
            );
        }))
    }

    /// The live Deployment is this build already, so it is not applied; the relay pods'
    /// PodDisruptionBudget is read, to put it back if someone deleted it.
    pub fn keeps_deployment(self) -> Self {
        let budget = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "orders", "namespace": "shop"}, "spec": {"maxUnavailable": 1}});
        self.expect(Step::get(BUDGET, Reply::ok(budget)))
    }

    /// The live Deployment is this build already, but its PodDisruptionBudget was deleted by
    /// hand: the budget is applied again, and the Deployment left alone.
    pub fn restores_deleted_budget(self) -> Self {
        self.expect(Step::get(
            BUDGET,
            Reply::not_found("poddisruptionbudgets.policy", "orders"),
        ))
        .expect(Step::write(Method::PATCH, BUDGET, |body| {
            assert_eq!(body["spec"]["maxUnavailable"], 1, "{body}");
        }))
    }

    /// The Deployment does not exist, is created, served back with no pod ready yet, and
    /// announced.
    pub fn creates_deployment(self) -> Self {
        self.finds_no_deployment()
            .applies_deployment(1, 0, |_| {})
            .event("DeploymentCreated")
    }

    /// The Deployment apply is refused with `status` and `message`.
    pub fn refuses_deployment(self, status: StatusCode, message: &str) -> Self {
        let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "Invalid", "code": status.as_u16(), "message": message});
        self.expect(Step::new(Method::PATCH, DEPLOYMENT, move |_| Reply {
            status,
            body,
        }))
    }

    /// The relay Deployment is deleted (foreground); the API server answers `reply`.
    pub fn deletes_deployment(self, reply: Reply) -> Self {
        self.expect(Step::new(Method::DELETE, DEPLOYMENT, move |_| reply))
    }

    /// The finalizer helper patches the relay's finalizers (a JSON patch); `check` reads the
    /// operations, and the relay comes back with `finalizers` as the result.
    pub fn patches_finalizers(
        self,
        finalizers: Vec<&'static str>,
        check: impl FnOnce(&Value) + Send + 'static,
    ) -> Self {
        let mut relay = serde_json::to_value(&self.relay).unwrap();
        self.expect(Step::new(Method::PATCH, RELAY, move |body| {
            check(body);
            relay["metadata"]["finalizers"] = json!(finalizers);
            Reply::ok(relay)
        }))
    }

    /// Changes the reconciler's settings.
    pub fn settings(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(&mut self.settings);
        self
    }

    /// The status is written; `check` reads it as our type.
    pub fn writes_status(self, check: impl FnOnce(&OutboxRelayStatus) + Send + 'static) -> Self {
        let relay = serde_json::to_value(&self.relay).unwrap();
        self.expect(Step::new(Method::PATCH, STATUS, move |body| {
            assert_eq!(body["kind"], "OutboxRelay", "{body}");
            check(&sent_status(body));
            let mut relay = relay;
            relay["status"] = body["status"].clone();
            Reply::ok(relay)
        }))
    }

    pub fn expect(mut self, step: Step) -> Self {
        self.script.push(step);
        self
    }

    pub async fn run(self) -> Outcome {
        self.run_then(|_, _, _| {}).await
    }

    /// Reconciles once, then lets `after` use the context (the error policy, say) before the
    /// API server is checked for requests nobody expected.
    pub async fn run_then(
        self,
        after: impl FnOnce(Arc<OutboxRelay>, Arc<Context>, &Result<Action, Error>),
    ) -> Outcome {
        let database = Arc::new(self.database);
        let (ctx, handle) = mock_context(self.settings, database.clone());
        if self.migrated_before {
            ctx.migrations.put(
                "uid-orders",
                MigrationKey {
                    relay_uid: "uid-orders".into(),
                    generation: self.relay.metadata.generation.unwrap_or(0),
                    secrets_fingerprint: SECRETS_FINGERPRINT.into(),
                },
            );
        }
        let server = serve(handle, self.script);
        let relay = Arc::new(self.relay);
        let result = reconcile(relay.clone(), ctx.clone()).await;
        after(relay, ctx, &result);
        let seen = finish(server).await;
        assert_no_secret_leaked(&seen);
        if let Err(error) = &result {
            assert!(!error.to_string().contains(LEAK_CANARY), "{error}");
        }
        Outcome {
            result,
            seen,
            database: database.calls(),
        }
    }
}

pub fn db_secret() -> Value {
    serde_json::to_value(secret("orders-db", "url", &database_url_with_canary())).unwrap()
}

pub fn amqp_secret() -> Value {
    let url = format!("amqp://relay:{LEAK_CANARY}@127.0.0.1:5672/%2f");
    serde_json::to_value(secret("orders-amqp", "url", &url)).unwrap()
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

/// The message of condition `type_`.
pub fn message(status: &OutboxRelayStatus, type_: &str) -> String {
    let found = conditions::find(&status.conditions, type_);
    found.map(|c| c.message.clone()).unwrap_or_default()
}

/// Asserts each `(type, status, reason)`, reporting every mismatch at once.
pub fn assert_conditions(status: &OutboxRelayStatus, expected: &[(&str, &str, &str)]) {
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
        if exchange.uri.contains("/secrets/") {
            continue; // the Secret itself, as the fixture served it
        }
        let text = exchange.body.to_string();
        assert!(
            !text.contains(LEAK_CANARY),
            "{} {} leaked: {text}",
            exchange.method,
            exchange.uri
        );
    }
}

/// A Deployment as the API server returns it after an apply: with a generation and a status.
pub fn served(mut deployment: Value, generation: i64, ready: i32, replicas: i32) -> Value {
    deployment["metadata"]["generation"] = json!(generation);
    deployment["status"] = json!({
        "observedGeneration": generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": replicas,
    });
    deployment
}

/// The Deployment the operator would have applied for `relay` with `replicas`, as served, all
/// of them ready.
pub fn live_deployment(relay: &OutboxRelay, replicas: i32) -> Value {
    let plan = validate(&relay.spec).unwrap();
    let settings = BuildSettings::default();
    let deployment = build_deployment(relay, &plan, SECRETS_FINGERPRINT, replicas, &settings);
    let value = serde_json::to_value(&deployment).unwrap();
    served(value, 1, replicas, replicas)
}

/// The fixtures' relay `shop/orders`, reading `table`.
pub fn orders_relay(table: &str) -> OutboxRelay {
    sample_relay("orders", crate::test_support::spec_for_table(table))
}
