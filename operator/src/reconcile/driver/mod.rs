//! Runs the steps of one reconcile in order (see the table in [`crate::reconcile`]):
//!
//! dereference → validate → migrate (once per generation) → observe → recommend → build (pure)
//! → apply (only when it changed) → status (only when it changed) → requeue.
//!
//! A relay being deleted goes to the cleanup step instead ([`crate::reconcile::cleanup`]).
//!
//! A failure the user can act on (missing Secret, bad spec, unreachable database) becomes
//! Ready=False and Degraded=True with the error's reason, a Warning event, and a retry with
//! per-relay exponential backoff. Nothing a user writes can panic the operator.
//!
//! Beneath it, what every step is handed or may return: the [`context`] (clients, per-relay
//! memories, metrics, settings), the [`error`], and the [`memory`] the per-relay state is kept
//! in; and the request-level tests of the whole pipeline.

pub mod context;
pub mod error;
pub mod memory;

#[cfg(test)]
mod pipeline_tests;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Api, ResourceExt};
use tracing::{Instrument, info_span};

use crate::crd::OutboxRelay;
use crate::reconcile::apply::{apply_deployment, write_status};
use crate::reconcile::build::{
    build_deployment, build_disruption_budget, remember_replicas_before_suspend, report_name,
    selector_string,
};
use crate::reconcile::cleanup::{FINALIZER, clean_up, time_left};
use crate::reconcile::driver::context::{Context, Settings};
use crate::reconcile::driver::error::Error;
use crate::reconcile::input::dereference::dereference_secrets;
use crate::reconcile::input::dereference::read_cache::ObjectReader;
use crate::reconcile::input::validate::validate;
use crate::reconcile::migrate::{MigrationKey, MigrationOutcome, migrate_once};
use crate::reconcile::observe::{RelayObjects, observe};
use crate::reconcile::scaling::rate_share::{rate_share, share_to_write};
use crate::reconcile::scaling::recommend::recommend_replicas;
use crate::reconcile::status::events::{
    self, announce_migration, announce_oom_kills, announce_pod_problem, announce_scaling,
    announce_suspension, announce_vacuum,
};
use crate::reconcile::status::{Observation, failed_status, healthy_status, pod_problem_message};

/// base × 2^(failures−1), capped.
pub fn backoff_delay(failures: u32, base: Duration, max: Duration) -> Duration {
    let exponent = failures.saturating_sub(1).min(16);
    base.saturating_mul(1u32 << exponent).min(max)
}

/// Reconciles one OutboxRelay: the pipeline, or the cleanup once it is being deleted. The
/// finalizer helper adds [`FINALIZER`] first (that write wakes the next reconcile) and removes
/// it when the cleanup returns `Ok`.
///
/// Its span, and one per step inside it, are exported as a trace when OTLP export is on (see
/// [`crate::runtime::telemetry`]); a failed reconcile's span has the error status.
#[tracing::instrument(
    name = "reconcile",
    skip_all,
    fields(
        relay = %report_name(&relay),
        otel.kind = "internal",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
)]
pub async fn reconcile(relay: Arc<OutboxRelay>, ctx: Arc<Context>) -> Result<Action, Error> {
    let relay_name = report_name(&relay);
    let _timer = ctx.metrics.reconcile_started(&relay_name);
    let namespace = relay.namespace().ok_or(Error::MissingNamespace)?;
    let relays: Api<OutboxRelay> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&relays, FINALIZER, relay, |event| async {
        match event {
            FinalizerEvent::Apply(relay) => apply(&relay, &ctx).await,
            FinalizerEvent::Cleanup(relay) => clean_up(&relay, &ctx).await,
        }
    })
    .await
    .map_err(Error::from);
    match &result {
        Ok(_) => ctx.failures.forget(&relay_name),
        // Waiting for pods to stop is part of a deletion, not a failure worth alerting on.
        Err(Error::RelayPodsStopping) => {}
        Err(error) => {
            ctx.metrics
                .reconcile_failed(&relay_name, error.metric_label());
            let span = tracing::Span::current();
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_description", error.to_string());
        }
    }
    result
}

/// The pipeline of a live relay; a failure the user can act on is shown on the object.
async fn apply(relay: &OutboxRelay, ctx: &Context) -> Result<Action, Error> {
    let result = run_pipeline(relay, ctx).await;
    if let Err(error) = &result {
        report_failure(relay, ctx, error).await;
    }
    result
}

/// What the controller does after a failed reconcile: retry with backoff per relay. A relay
/// being deleted retries no later than its cleanup's bound, so the finalizer goes on time;
/// pods that are still stopping are looked at again soon (their Deployment's deletion wakes
/// the relay too).
pub fn error_policy(relay: Arc<OutboxRelay>, error: &Error, ctx: Arc<Context>) -> Action {
    let relay_name = report_name(&relay);
    let failures = ctx
        .failures
        .update(&relay_name, |count| count.unwrap_or(0).saturating_add(1));
    let delay = retry_delay(&relay, error, failures, &ctx.settings, Timestamp::now());
    if matches!(error, Error::RelayPodsStopping) {
        tracing::info!(relay = %relay_name, retry_in = ?delay, "waiting for the relay pods to stop");
    } else {
        tracing::warn!(relay = %relay_name, %error, failures, retry_in = ?delay, "reconcile failed");
    }
    Action::requeue(delay)
}

/// When to retry after the `failures`-th failure in a row.
pub fn retry_delay(
    relay: &OutboxRelay,
    error: &Error,
    failures: u32,
    settings: &Settings,
    now: Timestamp,
) -> Duration {
    let delay = match error {
        Error::RelayPodsStopping => settings.lock_busy_retry,
        _ => backoff_delay(failures, settings.base_backoff, settings.max_backoff),
    };
    if relay.metadata.deletion_timestamp.is_none() {
        return delay;
    }
    let left = time_left(relay, settings.cleanup_timeout, now);
    delay.min(left).max(MIN_RETRY)
}

/// The soonest retry: a requeue of zero would spin.
const MIN_RETRY: Duration = Duration::from_secs(1);

async fn run_pipeline(relay: &OutboxRelay, ctx: &Context) -> Result<Action, Error> {
    let namespace = relay.namespace().ok_or(Error::MissingNamespace)?;
    let name = relay.name_any();
    let relay_name = report_name(relay);
    let generation = relay.metadata.generation;

    let secrets_api = ObjectReader::new(ctx.client.clone(), &namespace, Some(&ctx.secret_reads));
    let config_maps_api =
        ObjectReader::new(ctx.client.clone(), &namespace, Some(&ctx.config_map_reads));
    let secrets = dereference_secrets(&secrets_api, &config_maps_api, &relay.spec)
        .instrument(info_span!("dereference"))
        .await?;

    let plan =
        info_span!("validate").in_scope(|| validate(&relay.spec).map_err(Error::InvalidSpec))?;

    let key = MigrationKey {
        relay_uid: relay.uid().unwrap_or_else(|| relay_name.clone()),
        generation: generation.unwrap_or(0),
        secrets_fingerprint: secrets.fingerprint(),
    };
    let database = ctx.database.as_ref();
    let migration = migrate_once(
        &ctx.migrations,
        database,
        key,
        &secrets.database,
        &plan,
        &relay_name,
    )
    .instrument(info_span!("migrate", table = %plan.table.name))
    .await?;
    announce_migration(&ctx.recorder, relay, &migration).await;

    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let selector = selector_string(relay);
    let objects = RelayObjects {
        deployments: &deployments,
        pods: &pods,
        name: &name,
        selector: &selector,
    };
    let observed = observe(objects, database, &secrets.database, &plan, &relay_name)
        .instrument(info_span!("observe"))
        .await?;

    let history = ctx.scaling.get(&relay_name);
    let (scale, history) = info_span!("recommend").in_scope(|| {
        recommend_replicas(&relay.spec, &plan, &observed, history, chrono::Utc::now())
    });
    if let Some(history) = history {
        ctx.scaling.put(&relay_name, history);
    }

    // Before the Deployment changes: a scale-up's new pods read their share as they start.
    let running = observed
        .live
        .as_ref()
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.replicas)
        .unwrap_or(0);
    let share = plan
        .max_rate
        .map(|max_rate| rate_share(max_rate, scale.replicas, running));
    if let Some(write) = share_to_write(share, ctx.rate_shares.get(&relay_name)) {
        match database
            .write_rate_share(&secrets.database, &plan, &relay_name, write)
            .await
        {
            Ok(()) => ctx.rate_shares.put(&relay_name, write),
            // The pods keep the share they have; the next round writes it again.
            Err(error) => tracing::warn!(%error, "the rate-limit share was not written"),
        }
    }

    let mut desired = build_deployment(
        relay,
        &plan,
        &secrets.fingerprint(),
        scale.replicas,
        &ctx.settings.build,
    );
    if let Some(before) = scale.replicas_before_suspend {
        remember_replicas_before_suspend(&mut desired, before);
    }
    let existed = observed.live.is_some();
    let oom_kills = observed.oom_kills;
    let budget = build_disruption_budget(relay);
    let applied = apply_deployment(
        ctx,
        relay,
        &deployments,
        observed.live,
        &desired,
        budget.as_ref(),
    )
    .instrument(info_span!("apply", replicas = scale.replicas))
    .await?;
    if existed {
        announce_scaling(&ctx.recorder, relay, &scale).await;
    }

    let observation = Observation {
        generation,
        table: plan.table.name.to_string(),
        migration: &migration,
        deployment: &applied,
        desired_replicas: scale.replicas,
        selector,
        scaling: &scale,
        vacuum_blocked_after: plan.vacuum_blocked_after,
        oom_kills: &oom_kills,
        rate_share: share,
    };
    let status = healthy_status(relay.status.as_ref(), &observation, Timestamp::now());
    let problem = scale.lag.as_ref().and_then(|lag| lag.problem.as_ref());
    announce_pod_problem(&ctx.recorder, relay, problem, pod_problem_message).await;
    announce_vacuum(&ctx.recorder, relay, &status, &observation.table).await;
    announce_oom_kills(&ctx.recorder, relay, &oom_kills).await;
    announce_suspension(&ctx.recorder, relay, &status, plan.suspended).await;
    write_status(ctx, relay, &status)
        .instrument(info_span!("status"))
        .await?;

    Ok(match (&migration, &plan.scaling) {
        (MigrationOutcome::LockBusy, _) => Action::requeue(ctx.settings.lock_busy_retry),
        (_, Some(scaling)) => Action::requeue(scaling.polling_interval),
        (_, None) => Action::requeue(ctx.settings.resync_after),
    })
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
    if let Err(write_error) = write_status(ctx, relay, &status).await {
        tracing::warn!(error = %write_error, "could not write the failure status");
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
    fn a_deleted_relay_retries_no_later_than_its_bound() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

        let settings = Settings::default(); // 5 s doubling to 5 min; a 5-minute bound
        let mut relay =
            crate::test_support::sample_relay("orders", crate::test_support::sample_spec());
        let deleted = Timestamp::from_second(1_000).unwrap();
        let at = |s| Timestamp::from_second(s).unwrap();
        let error = Error::DatabaseUnreachable("refused".into());
        let delays = |relay: &OutboxRelay, now| {
            (1..=8)
                .map(|n| retry_delay(relay, &error, n, &settings, now).as_secs())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            delays(&relay, at(1_000)),
            [5, 10, 20, 40, 80, 160, 300, 300]
        );
        relay.metadata.deletion_timestamp = Some(Time(deleted));
        assert_eq!(
            delays(&relay, at(1_200)),
            [5, 10, 20, 40, 80, 100, 100, 100]
        );
        // Past the bound: once more, a second later, and that attempt gives up.
        assert_eq!(delays(&relay, at(1_400)), [1; 8]);
        let stopping = retry_delay(&relay, &Error::RelayPodsStopping, 9, &settings, at(1_000));
        assert_eq!(stopping, settings.lock_busy_retry);
    }
}
