//! The reconciler: a pipeline of small steps, each failing with its own [`Error`] variant.
//!
//! dereference Secrets → validate → migrate (once per generation) → observe the Deployment →
//! decide the replicas → build the Deployment (pure) → server-side apply it (only when it
//! changed) → status (server-side apply, only when it changed) → requeue.
//!
//! The replicas are decided before the build, so scaling and the template change are one
//! apply rather than two writes.
//!
//! A failure the user can act on (missing Secret, bad spec, unreachable database) becomes
//! Ready=False and Degraded=True with the error's reason, a Warning event, and a retry with
//! per-relay exponential backoff. Nothing a user writes can panic the operator.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use outbox_relay::table::migrate::{AUTOVACUUM_OFF_WARNING, IndexAction};

use crate::crd::{OutboxRelay, OutboxRelayStatus};
use crate::deployment::{
    BuildSettings, FIELD_MANAGER, build_deployment, report_name, selector_string, spec_hash,
};
use crate::error::Error;
use crate::events::{self, reasons};
use crate::metrics::Metrics;
use crate::migration::{MigrationKey, MigrationMemory, MigrationOutcome, migrate_once};
use crate::scaling::{ScalingMemory, ScalingOutcome, decide_scale};
use crate::secrets::{dereference_secrets, referenced_secret_names};
use crate::status::{Observation, failed_status, healthy_status};
use crate::validation::validate;

/// Knobs of the reconciler that are not part of any resource.
#[derive(Debug, Clone)]
pub struct Settings {
    pub build: BuildSettings,
    /// Requeue of a healthy relay in manual mode; watches bring changes sooner.
    pub resync_after: Duration,
    /// Retry when another migration holds the lock: soon, it is usually a short wait.
    pub lock_busy_retry: Duration,
    /// First retry after a failure; doubles per consecutive failure up to `max_backoff`.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            build: BuildSettings::default(),
            resync_after: Duration::from_secs(300),
            lock_busy_retry: Duration::from_secs(5),
            base_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// State shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub migrations: MigrationMemory,
    pub scaling: ScalingMemory,
    pub failures: FailureCounts,
    pub settings: Settings,
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, settings: Settings) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            migrations: MigrationMemory::default(),
            scaling: ScalingMemory::default(),
            failures: FailureCounts::default(),
            settings,
        }
    }
}

/// Consecutive failures per relay, for exponential backoff.
#[derive(Debug, Default)]
pub struct FailureCounts {
    counts: Mutex<HashMap<String, u32>>,
}

impl FailureCounts {
    /// Records one more failure and returns how many in a row there were.
    pub fn record(&self, key: &str) -> u32 {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(key.to_string()).or_insert(0);
        *count = count.saturating_add(1);
        *count
    }

    pub fn reset(&self, key: &str) {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// base × 2^(failures−1), capped.
pub fn backoff_delay(failures: u32, base: Duration, max: Duration) -> Duration {
    let exponent = failures.saturating_sub(1).min(16);
    base.saturating_mul(1u32 << exponent).min(max)
}

/// Reconciles one OutboxRelay.
pub async fn reconcile(relay: Arc<OutboxRelay>, ctx: Arc<Context>) -> Result<Action, Error> {
    let relay_name = report_name(&relay);
    let _timer = ctx.metrics.reconcile_started(&relay_name);
    match run_pipeline(&relay, &ctx).await {
        Ok(action) => {
            ctx.failures.reset(&relay_name);
            Ok(action)
        }
        Err(error) => {
            ctx.metrics.reconcile_failed(&relay_name, &error);
            report_failure(&relay, &ctx, &error).await;
            Err(error)
        }
    }
}

/// What the controller does after a failed reconcile: retry with backoff per relay.
pub fn error_policy(relay: Arc<OutboxRelay>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.failures.record(&report_name(&relay));
    let delay = backoff_delay(
        failures,
        ctx.settings.base_backoff,
        ctx.settings.max_backoff,
    );
    tracing::warn!(relay = %report_name(&relay), %error, failures, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn run_pipeline(relay: &OutboxRelay, ctx: &Context) -> Result<Action, Error> {
    let namespace = relay.namespace().ok_or(Error::MissingNamespace)?;
    let name = relay.name_any();
    let generation = relay.metadata.generation;

    // 1. Secrets
    let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let secrets = dereference_secrets(&secrets_api, &relay.spec).await?;

    // 2. Validation
    let plan = validate(&relay.spec).map_err(Error::InvalidSpec)?;

    // 3. Migration, once per generation and database Secret version
    let key = MigrationKey {
        relay_uid: relay.uid().unwrap_or_else(|| format!("{namespace}/{name}")),
        generation: generation.unwrap_or(0),
        secrets_fingerprint: secrets.fingerprint(),
    };
    let migration = migrate_once(&ctx.migrations, key, &secrets.database_url, &plan).await?;
    announce_migration(relay, ctx, &migration).await;

    // 4. Replicas and the Deployment
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let live = deployments
        .get_opt(&name)
        .await
        .map_err(Error::ObserveDeployment)?;
    let scale = decide_scale(
        &relay.spec,
        &plan,
        &secrets.database_url,
        &report_name(relay),
        live.as_ref(),
        &ctx.scaling,
        chrono::Utc::now(),
    )
    .await;
    let existed = live.is_some();
    let desired = build_deployment(
        relay,
        &plan,
        &secrets.fingerprint(),
        scale.replicas,
        &ctx.settings.build,
    );

    // 5. Apply, unless the live Deployment already carries this exact build. Replicas are
    // compared too: `kubectl scale deployment` changes them without touching the hash.
    let observed = match live {
        Some(live)
            if spec_hash(&live) == spec_hash(&desired)
                && live.spec.replicas == desired.spec.replicas =>
        {
            live
        }
        live => {
            let applied = deployments
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&desired),
                )
                .await
                .map_err(Error::ApplyDeployment)?;
            let (reason, verb) = if live.is_some() {
                (reasons::DEPLOYMENT_UPDATED, "updated")
            } else {
                (reasons::DEPLOYMENT_CREATED, "created")
            };
            events::publish(
                &ctx.recorder,
                relay,
                EventType::Normal,
                reason,
                "ApplyDeployment",
                format!("{verb} Deployment {name} with {} replicas", scale.replicas),
            )
            .await;
            applied
        }
    };

    if existed {
        announce_scaling(relay, ctx, &scale).await;
    }

    // 6. Status
    let observation = Observation {
        generation,
        table: plan.table.name.to_string(),
        migration: &migration,
        deployment: &observed,
        desired_replicas: scale.replicas,
        selector: selector_string(relay),
        scaling: &scale,
    };
    let status = healthy_status(relay.status.as_ref(), &observation, Timestamp::now());
    write_status(relay, ctx, &status).await?;

    Ok(match (&migration, &plan.scaling) {
        (MigrationOutcome::LockBusy, _) => Action::requeue(ctx.settings.lock_busy_retry),
        (_, Some(scaling)) => Action::requeue(scaling.polling_interval),
        (_, None) => Action::requeue(ctx.settings.resync_after),
    })
}

/// ScaledUp / ScaledDown events, with the numbers that led there.
async fn announce_scaling(relay: &OutboxRelay, ctx: &Context, scale: &ScalingOutcome) {
    // Manual changes are announced as DeploymentUpdated; these events are the autoscaler's.
    let (Some(recommendation), Some(observation)) = (&scale.recommendation, &scale.observation)
    else {
        return;
    };
    if !scale.changed() {
        return;
    }
    let (reason, direction) = if scale.replicas > scale.previous {
        (reasons::SCALED_UP, "up")
    } else {
        (reasons::SCALED_DOWN, "down")
    };
    let why = recommendation.message(observation);
    events::publish(
        &ctx.recorder,
        relay,
        EventType::Normal,
        reason,
        "Scale",
        format!(
            "scaled {direction} from {} to {} replicas: {why}",
            scale.previous, scale.replicas
        ),
    )
    .await;
}

async fn announce_migration(relay: &OutboxRelay, ctx: &Context, migration: &MigrationOutcome) {
    let MigrationOutcome::Migrated(report) = migration else {
        return;
    };
    if report.server_autovacuum_off {
        events::publish(
            &ctx.recorder,
            relay,
            EventType::Warning,
            reasons::AUTOVACUUM_OFF,
            "Migrate",
            AUTOVACUUM_OFF_WARNING.to_string(),
        )
        .await;
    }
    let (type_, reason) = match report.index {
        IndexAction::Created => (EventType::Normal, reasons::INDEX_CREATED),
        // Good news about bad news: the earlier build failed; say so loudly.
        IndexAction::RebuiltInvalid => (EventType::Warning, reasons::INVALID_INDEX_REBUILT),
        IndexAction::AlreadyValid => return,
    };
    events::publish(
        &ctx.recorder,
        relay,
        type_,
        reason,
        "Migrate",
        report.lines().join("; "),
    )
    .await;
}

/// Writes `status` with server-side apply, unless it equals what the object already has.
async fn write_status(
    relay: &OutboxRelay,
    ctx: &Context,
    status: &OutboxRelayStatus,
) -> Result<(), Error> {
    if relay.status.as_ref() == Some(status) {
        return Ok(());
    }
    let namespace = relay.namespace().ok_or(Error::MissingNamespace)?;
    let relays: Api<OutboxRelay> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = serde_json::json!({
        "apiVersion": OutboxRelay::api_version(&()),
        "kind": OutboxRelay::kind(&()),
        "status": status,
    });
    relays
        .patch_status(
            &relay.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::PatchStatus)?;
    Ok(())
}

/// Turns a user-facing failure into conditions and a Warning event. API-server trouble is
/// only logged (by the error policy): writing about it would most likely fail as well.
async fn report_failure(relay: &OutboxRelay, ctx: &Context, error: &Error) {
    let Some(reason) = error.user_facing_reason() else {
        return;
    };
    let status = failed_status(
        relay.status.as_ref(),
        relay.metadata.generation,
        reason,
        error,
        Timestamp::now(),
    );
    if let Err(write_error) = write_status(relay, ctx, &status).await {
        tracing::warn!(relay = %report_name(relay), error = %write_error, "could not write the failure status");
    }
    events::publish(
        &ctx.recorder,
        relay,
        EventType::Warning,
        reason,
        "Reconcile",
        error.to_string(),
    )
    .await;
}

/// The relays in `store` that refer to the Secret `name` in `namespace`.
pub fn relays_referencing(
    store: &Store<OutboxRelay>,
    namespace: Option<&str>,
    name: &str,
) -> Vec<ObjectRef<OutboxRelay>> {
    store
        .state()
        .iter()
        .filter(|relay| {
            relay.namespace().as_deref() == namespace
                && referenced_secret_names(&relay.spec).contains(&name)
        })
        .map(|relay| ObjectRef::from_obj(relay.as_ref()))
        .collect()
}

/// Runs the controller for one namespace (or all, with `None`) until `shutdown` resolves.
pub async fn run_controller(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (relays, deployments, secrets): (Api<OutboxRelay>, Api<Deployment>, Api<Secret>) =
        match &namespace {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client, ns),
            ),
            None => (
                Api::all(client.clone()),
                Api::all(client.clone()),
                Api::all(client),
            ),
        };
    let controller = Controller::new(relays, watcher::Config::default().any_semantic());
    let store = controller.store();
    controller
        .owns(
            deployments,
            watcher::Config::default().labels("app.kubernetes.io/managed-by=outbox-operator"),
        )
        .watches(
            secrets,
            watcher::Config::default(),
            move |secret: Secret| {
                relays_referencing(
                    &store,
                    secret.metadata.namespace.as_deref(),
                    &secret.name_any(),
                )
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((object, _)) => tracing::debug!(%object, "reconciled"),
                Err(error) => tracing::debug!(%error, "reconcile did not complete"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let base = Duration::from_secs(5);
        let max = Duration::from_secs(300);
        let delays: Vec<u64> = (1..=9)
            .map(|n| backoff_delay(n, base, max).as_secs())
            .collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff_delay(u32::MAX, base, max), max);
    }

    #[test]
    fn a_secret_maps_to_the_relays_that_use_it() {
        use crate::test_support::{sample_relay, sample_spec};
        use kube::runtime::{reflector, watcher};

        let (store, mut writer) = reflector::store::<OutboxRelay>();
        let orders = sample_relay("orders", sample_spec());
        let mut billing = sample_relay("billing", sample_spec());
        billing.spec.database.url_secret_ref.name = "billing-db".into();
        let mut elsewhere = sample_relay("orders-copy", sample_spec());
        elsewhere.metadata.namespace = Some("other".into());
        for relay in [&orders, &billing, &elsewhere] {
            writer.apply_watcher_event(&watcher::Event::Apply(relay.clone()));
        }
        let names = |secret: &str| {
            let mut names: Vec<String> = relays_referencing(&store, Some("shop"), secret)
                .into_iter()
                .map(|r| r.name)
                .collect();
            names.sort();
            names
        };
        assert_eq!(names("orders-db"), vec!["orders"]);
        assert_eq!(names("orders-amqp"), vec!["billing", "orders"]);
        assert_eq!(names("billing-db"), vec!["billing"]);
        assert!(names("unrelated").is_empty());
    }

    #[test]
    fn failure_counts_reset_on_success() {
        let counts = FailureCounts::default();
        assert_eq!(counts.record("a"), 1);
        assert_eq!(counts.record("a"), 2);
        assert_eq!(counts.record("b"), 1);
        counts.reset("a");
        assert_eq!(counts.record("a"), 1);
    }
}
