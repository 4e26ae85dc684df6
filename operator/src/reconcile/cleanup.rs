//! The cleanup step, run when an OutboxRelay is deleted: the operator holds the deletion with
//! the finalizer [`FINALIZER`], stops the relay pods, then cleans up the database as
//! `spec.database.cleanupPolicy` says: the table's claim is always released (so another
//! OutboxRelay can take the table at once), and `delete` also removes what the migration
//! created. The owned objects (Deployment, PodDisruptionBudget) would go with the relay anyway,
//! by their owner references; the Deployment is deleted first only so that no pod writes a
//! report or relays from the table once its claim is gone.
//!
//! The cleanup is bounded: a finalizer that waits for an unreachable database or a deleted
//! Secret would wedge `kubectl delete` and the deletion of the namespace. Each failed attempt
//! is a Warning event with the reason and a retry with the reconciler's backoff; once
//! [`Settings::cleanup_timeout`] has passed since the deletion, the finalizer is removed
//! anyway and a last Warning event says what was left in the database.
//!
//! [`Settings::cleanup_timeout`]: crate::reconcile::Settings::cleanup_timeout

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};

use crate::crd::{CleanupPolicy, OutboxRelay};
use crate::reconcile::build::report_name;
use crate::reconcile::database::claims::{CLAIM_EXPIRES_AFTER, CLAIMS_TABLE, Release};
use crate::reconcile::database::{CleanupRequest, CleanupRun};
use crate::reconcile::driver::context::Context;
use crate::reconcile::driver::error::Error;
use crate::reconcile::input::dereference::dereference_secrets;
use crate::reconcile::input::dereference::read_cache::ObjectReader;
use crate::reconcile::input::validate::{RelayPlan, validate};
use crate::reconcile::status::events::{self, reasons};

/// The finalizer the operator puts on every OutboxRelay.
pub const FINALIZER: &str = "outboxrelay.io/cleanup";

/// One attempt's database work may take this long: dropping an index concurrently waits for
/// the transactions that could still use it, and the next attempt comes soon enough.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs one cleanup attempt. `Ok` lets the finalizer go (done, or given up after the bound);
/// `Err` keeps it and retries through the error policy.
pub async fn clean_up(relay: &OutboxRelay, ctx: &Context) -> Result<Action, Error> {
    let timeout = ctx.settings.cleanup_timeout;
    let left = time_left(relay, timeout, Timestamp::now());
    let plan = validate(&relay.spec).ok();
    let warn = |reason, note| {
        events::publish(
            &ctx.recorder,
            relay,
            EventType::Warning,
            reason,
            "Delete",
            note,
        )
    };
    match attempt(relay, ctx, left.is_zero()).await {
        Ok(run) => {
            let (type_, reason, note) = done_event(relay, plan.as_ref(), &run);
            events::publish(&ctx.recorder, relay, type_, reason, "Delete", note).await;
            forget(relay, ctx);
            Ok(Action::await_change())
        }
        Err(Error::RelayPodsStopping) if !left.is_zero() => Err(Error::RelayPodsStopping),
        Err(error) if !left.is_zero() => {
            let note = format!(
                "{error}; retrying for up to {} more, then the OutboxRelay is deleted anyway",
                humantime::format_duration(Duration::from_secs(left.as_secs()))
            );
            warn(reasons::CLEANUP_FAILED, note).await;
            Err(error)
        }
        Err(error) => {
            let note = format!(
                "gave up cleaning up the database {} after the deletion: {error}. Left in the \
                 database: {}",
                humantime::format_duration(timeout),
                left_behind(relay, plan.as_ref()).join("; ")
            );
            warn(reasons::CLEANUP_ABANDONED, note).await;
            tracing::warn!(relay = %report_name(relay), "cleanup abandoned; finalizer removed");
            forget(relay, ctx);
            Ok(Action::await_change())
        }
    }
}

/// The time the cleanup may still take; zero once the bound has passed.
pub fn time_left(relay: &OutboxRelay, timeout: Duration, now: Timestamp) -> Duration {
    let Some(deleted) = relay.metadata.deletion_timestamp.as_ref() else {
        return timeout;
    };
    // A deletion time ahead of the operator's clock (skew) counts as just now.
    let elapsed = Duration::try_from(now.duration_since(deleted.0)).unwrap_or_default();
    timeout.saturating_sub(elapsed)
}

async fn attempt(
    relay: &OutboxRelay,
    ctx: &Context,
    past_deadline: bool,
) -> Result<CleanupRun, Error> {
    let namespace = relay.namespace().ok_or(Error::MissingNamespace)?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    // Past the bound, a pod that still stops does not keep the database as it is.
    if !relay_pods_gone(relay, &deployments).await? && !past_deadline {
        return Err(Error::RelayPodsStopping);
    }
    let secrets_api = ObjectReader::new(ctx.client.clone(), &namespace, Some(&ctx.secret_reads));
    let config_maps_api =
        ObjectReader::new(ctx.client.clone(), &namespace, Some(&ctx.config_map_reads));
    let secrets = dereference_secrets(&secrets_api, &config_maps_api, &relay.spec).await?;
    let plan = validate(&relay.spec).map_err(Error::InvalidSpec)?;
    let request = CleanupRequest {
        relay_name: report_name(relay),
        remove_migration: relay.spec.database.cleanup_policy == CleanupPolicy::Delete,
    };
    let cleanup = ctx.database.clean_up(&secrets.database, &plan, request);
    tokio::time::timeout(ATTEMPT_TIMEOUT, cleanup)
        .await
        .unwrap_or_else(|_| {
            Err(Error::CleanupFailed(format!(
                "the database did not finish within {}s",
                ATTEMPT_TIMEOUT.as_secs()
            )))
        })
}

/// Deletes the relay Deployment (foreground, so it is gone only once its pods are) and says
/// whether it is gone. A relay deleted with `--cascade=orphan` keeps its pods: the user asked
/// for that, so they are not waited for.
async fn relay_pods_gone(
    relay: &OutboxRelay,
    deployments: &Api<Deployment>,
) -> Result<bool, Error> {
    if relay.finalizers().iter().any(|f| f == "orphan") {
        return Ok(true);
    }
    match deployments
        .delete(&relay.name_any(), &DeleteParams::foreground())
        .await
    {
        // Left: the Deployment still exists, waiting for its pods; Right: it is gone.
        Ok(deleted) => Ok(deleted.is_right()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(true),
        Err(error) => Err(Error::StopRelayPods(error)),
    }
}

/// The relay's memories are of no use once it is gone.
fn forget(relay: &OutboxRelay, ctx: &Context) {
    let relay_name = report_name(relay);
    if let Some(uid) = relay.uid() {
        ctx.migrations.forget(&uid);
    }
    ctx.scaling.forget(&relay_name);
    ctx.failures.forget(&relay_name);
}

/// The event of a finished cleanup: what was removed, or what stays and why.
pub fn done_event(
    relay: &OutboxRelay,
    plan: Option<&RelayPlan>,
    run: &CleanupRun,
) -> (EventType, &'static str, String) {
    let table = plan.map_or_else(
        || relay.spec.database.table.clone(),
        |p| p.table.name.to_string(),
    );
    let claim = match &run.claim {
        Release::Released => format!("released the claim on table {table}"),
        Release::NotHeld => format!("held no claim on table {table}"),
        Release::HeldBy(other) => format!("table {table} is claimed by OutboxRelay {other}"),
    };
    let objects = migration_objects(relay, plan).join(", ");
    match (&run.removed, &run.claim, relay.spec.database.cleanup_policy) {
        (Some(report), _, _) => (
            EventType::Normal,
            reasons::DATABASE_CLEANED_UP,
            format!(
                "{claim}; {}; the outbox table and its rows were not touched",
                report.lines().join("; ")
            ),
        ),
        (None, Release::HeldBy(other), CleanupPolicy::Delete) => (
            EventType::Warning,
            reasons::DATABASE_OBJECTS_RETAINED,
            format!(
                "{claim}: kept {objects}, which serve {other} (cleanupPolicy delete removes them \
                 only from a table this relay holds)"
            ),
        ),
        (None, _, _) => (
            EventType::Normal,
            reasons::DATABASE_OBJECTS_RETAINED,
            format!(
                "{claim}; kept in the database (cleanupPolicy retain): {objects}. Set \
                 spec.database.cleanupPolicy to delete before deleting an OutboxRelay to remove \
                 them"
            ),
        ),
    }
}

/// What an abandoned cleanup leaves in the database.
pub fn left_behind(relay: &OutboxRelay, plan: Option<&RelayPlan>) -> Vec<String> {
    let table = plan.map_or_else(
        || relay.spec.database.table.clone(),
        |p| p.table.name.to_string(),
    );
    let mut left = vec![format!(
        "the claim of {} on table {table} in {CLAIMS_TABLE} (it expires {} after its last \
         renewal; until then no other OutboxRelay can relay the table)",
        report_name(relay),
        humantime::format_duration(CLAIM_EXPIRES_AFTER)
    )];
    if relay.spec.database.cleanup_policy == CleanupPolicy::Delete {
        left.extend(migration_objects(relay, plan));
    }
    left
}

/// What the migration created for the relay, by name where the spec gives one.
pub fn migration_objects(relay: &OutboxRelay, plan: Option<&RelayPlan>) -> Vec<String> {
    let Some(plan) = plan else {
        return vec![format!(
            "the pending-row index, NOTIFY trigger, report rows of {} and autovacuum settings \
             of table {}",
            report_name(relay),
            relay.spec.database.table
        )];
    };
    let table = &plan.table;
    let mut objects = vec![format!(
        "index {}",
        outbox_relay::table::migrate::index_name(table, &plan.migration)
    )];
    if plan.migration.notify {
        let trigger = outbox_relay::table::migrate::notify_object_name(table);
        objects.push(format!("NOTIFY trigger and function {trigger}"));
    }
    objects.push(format!(
        "the report rows of {} in {}",
        report_name(relay),
        table.reports_table()
    ));
    if !plan.migration.skip_autovacuum {
        objects.push(format!("the autovacuum settings of table {}", table.name));
    }
    objects
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use outbox_relay::table::cleanup::CleanupReport;

    use super::*;
    use crate::test_support::{sample_relay, spec_for_table};

    fn deleted_at(seconds: i64) -> OutboxRelay {
        let mut relay = sample_relay("orders", spec_for_table("app.orders"));
        relay.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(seconds).unwrap()));
        relay
    }

    #[test]
    fn the_bound_counts_from_the_deletion() {
        let timeout = Duration::from_secs(300);
        let relay = deleted_at(1_000);
        let at = |s| Timestamp::from_second(s).unwrap();
        assert_eq!(time_left(&relay, timeout, at(1_000)), timeout);
        assert_eq!(
            time_left(&relay, timeout, at(1_100)),
            Duration::from_secs(200)
        );
        assert_eq!(time_left(&relay, timeout, at(1_300)), Duration::ZERO);
        assert_eq!(time_left(&relay, timeout, at(9_999)), Duration::ZERO);
        // Skew: a deletion "in the future" leaves the whole bound.
        assert_eq!(time_left(&relay, timeout, at(900)), timeout);
    }

    #[test]
    fn retain_says_what_stays_and_how_to_remove_it() {
        let relay = deleted_at(1_000);
        let plan = validate(&relay.spec).unwrap();
        let run = CleanupRun {
            claim: Release::Released,
            removed: None,
        };
        let (type_, reason, note) = done_event(&relay, Some(&plan), &run);
        assert_eq!(
            (type_, reason),
            (EventType::Normal, "DatabaseObjectsRetained")
        );
        for shown in [
            "released the claim on table app.orders",
            "index orders_pending_idx",
            "report rows of shop/orders in app.outbox_relay_reports",
            "autovacuum settings of table app.orders",
            "cleanupPolicy to delete",
        ] {
            assert!(note.contains(shown), "{shown:?} not in {note}");
        }
    }

    #[test]
    fn delete_lists_what_was_removed_and_spares_the_rows() {
        let mut relay = deleted_at(1_000);
        relay.spec.database.cleanup_policy = CleanupPolicy::Delete;
        let plan = validate(&relay.spec).unwrap();
        let run = CleanupRun {
            claim: Release::Released,
            removed: Some(CleanupReport {
                index_dropped: Some("orders_pending_idx".into()),
                report_rows_deleted: 1,
                ..Default::default()
            }),
        };
        let (type_, reason, note) = done_event(&relay, Some(&plan), &run);
        assert_eq!((type_, reason), (EventType::Normal, "DatabaseCleanedUp"));
        assert!(note.contains("dropped index orders_pending_idx"), "{note}");
        assert!(note.contains("rows were not touched"), "{note}");
    }

    #[test]
    fn a_table_another_relay_holds_is_left_alone_with_a_warning() {
        let mut relay = deleted_at(1_000);
        relay.spec.database.cleanup_policy = CleanupPolicy::Delete;
        let plan = validate(&relay.spec).unwrap();
        let run = CleanupRun {
            claim: Release::HeldBy("shop/first".into()),
            removed: None,
        };
        let (type_, _, note) = done_event(&relay, Some(&plan), &run);
        assert_eq!(type_, EventType::Warning);
        assert!(note.contains("serve shop/first"), "{note}");
    }

    #[test]
    fn an_abandoned_cleanup_names_the_claim_and_with_delete_the_objects() {
        let mut relay = deleted_at(1_000);
        let plan = validate(&relay.spec).unwrap();
        let retained = left_behind(&relay, Some(&plan));
        assert_eq!(retained.len(), 1, "{retained:?}");
        assert!(retained[0].contains("outbox_relay_claims"), "{retained:?}");
        relay.spec.database.cleanup_policy = CleanupPolicy::Delete;
        let deleted = left_behind(&relay, Some(&plan)).join("; ");
        assert!(deleted.contains("index orders_pending_idx"), "{deleted}");
        // With a spec that does not validate, the objects are described by the table's name.
        let unknown = left_behind(&relay, None).join("; ");
        assert!(unknown.contains("of table app.orders"), "{unknown}");
    }
}
