//! Everything that can stop a reconcile, one variant per step and cause. Each variant knows
//! its metric label (for `outbox_operator_reconcile_failures_total`) and, when the user can act
//! on it, the condition reason and event it turns into.

use crate::reconcile::input::validate::SpecErrors;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Secret {name} not found in the relay's namespace")]
    SecretNotFound { name: String },
    #[error("Secret {name} has no key {key}")]
    SecretKeyMissing { name: String, key: String },
    #[error("the value of key {key} in Secret {name} {reason}")]
    SecretValueInvalid {
        name: String,
        key: String,
        reason: String,
    },
    #[error("reading a Secret failed: {0}")]
    ReadSecret(#[source] kube::Error),
    #[error("ConfigMap {name} not found in the relay's namespace")]
    ConfigMapNotFound { name: String },
    #[error("ConfigMap {name} has no key {key}")]
    ConfigMapKeyMissing { name: String, key: String },
    #[error("the value of key {key} in ConfigMap {name} {reason}")]
    ConfigMapValueInvalid {
        name: String,
        key: String,
        reason: String,
    },
    #[error("reading a ConfigMap failed: {0}")]
    ReadConfigMap(#[source] kube::Error),
    #[error("invalid spec: {0}")]
    InvalidSpec(#[source] SpecErrors),
    /// The message is already redacted: it never carries the URL's password.
    #[error("cannot connect to the database: {0}")]
    DatabaseUnreachable(String),
    /// Every server the URL names is a read-only standby (a failover under way, a replica's
    /// URL): waited out like an outage, with a reason of its own. Already redacted.
    #[error("cannot connect to the database: {0}")]
    DatabaseReadOnly(String),
    /// The database refused the operator for a reason someone must fix: TLS (`DatabaseTLS`),
    /// the login (`DatabaseAuth`) or a setting (`DatabaseSettings`). Already redacted.
    #[error("cannot connect to the database: {message}")]
    DatabaseRefused {
        reason: &'static str,
        message: String,
    },
    /// The message is already redacted.
    #[error("migration failed: {0}")]
    MigrationFailed(String),
    /// The table's id column is not kept unique; the migration refused it. Its own reason
    /// because the fix is in the user's table, not in the spec or the database's health.
    #[error("migration refused: {0}")]
    IdNotUnique(String),
    /// The message is already redacted.
    #[error("reading the lag reports failed: {0}")]
    ObserveLag(String),
    /// Another OutboxRelay relays this table of this database; this one runs no pods.
    #[error(
        "table {table} is relayed by OutboxRelay {relay} (its claim was renewed {renewed_seconds_ago:.0}s ago): two relays on one table would both run, with their own settings. Delete one of the two OutboxRelays, or point this one at another table; a deleted relay's claim expires 15 minutes after its last renewal"
    )]
    TableClaimed {
        table: String,
        relay: String,
        renewed_seconds_ago: f64,
    },
    #[error("reading the relay Deployment failed: {0}")]
    ObserveDeployment(#[source] kube::Error),
    #[error("applying the relay Deployment failed: {0}")]
    ApplyDeployment(#[source] kube::Error),
    #[error("applying the relay pods' PodDisruptionBudget failed: {0}")]
    ApplyDisruptionBudget(#[source] kube::Error),
    #[error("writing the status failed: {0}")]
    PatchStatus(#[source] kube::Error),
    #[error("the OutboxRelay has no namespace")]
    MissingNamespace,
    /// The database refused or failed a cleanup statement. Already redacted.
    #[error("cleaning up the database failed: {0}")]
    CleanupFailed(String),
    /// The relay Deployment is being deleted and its pods are still stopping: the database is
    /// cleaned up once none of them can write a report or use the index any more.
    #[error("the relay pods are still stopping")]
    RelayPodsStopping,
    #[error("deleting the relay Deployment failed: {0}")]
    StopRelayPods(#[source] kube::Error),
    /// Adding or removing the finalizer failed (kube-runtime's finalizer helper's words).
    #[error("{0}")]
    Finalizer(String),
}

/// The finalizer helper wraps the pipeline's errors; its own (adding or removing the
/// finalizer) are API-server trouble.
impl From<kube::runtime::finalizer::Error<Error>> for Error {
    fn from(error: kube::runtime::finalizer::Error<Error>) -> Self {
        use kube::runtime::finalizer::Error as Finalizer;
        match error {
            Finalizer::ApplyFailed(error) | Finalizer::CleanupFailed(error) => error,
            other => Error::Finalizer(other.to_string()),
        }
    }
}

impl Error {
    /// Label of this error in metrics; stable, snake_case, one per variant.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::SecretNotFound { .. } => "secret_not_found",
            Error::SecretKeyMissing { .. } => "secret_key_missing",
            Error::SecretValueInvalid { .. } => "secret_value_invalid",
            Error::ReadSecret(_) => "read_secret",
            Error::ConfigMapNotFound { .. } => "config_map_not_found",
            Error::ConfigMapKeyMissing { .. } => "config_map_key_missing",
            Error::ConfigMapValueInvalid { .. } => "config_map_value_invalid",
            Error::ReadConfigMap(_) => "read_config_map",
            Error::InvalidSpec(_) => "invalid_spec",
            Error::DatabaseUnreachable(_) => "database_unreachable",
            Error::DatabaseReadOnly(_) => "database_read_only",
            Error::DatabaseRefused { .. } => "database_refused",
            Error::MigrationFailed(_) => "migration_failed",
            Error::IdNotUnique(_) => "id_not_unique",
            Error::ObserveLag(_) => "observe_lag",
            Error::TableClaimed { .. } => "table_claimed",
            Error::ObserveDeployment(_) => "observe_deployment",
            Error::ApplyDeployment(_) => "apply_deployment",
            Error::ApplyDisruptionBudget(_) => "apply_disruption_budget",
            Error::PatchStatus(_) => "patch_status",
            Error::MissingNamespace => "missing_namespace",
            Error::CleanupFailed(_) => "cleanup_failed",
            Error::RelayPodsStopping => "relay_pods_stopping",
            Error::StopRelayPods(_) => "stop_relay_pods",
            Error::Finalizer(_) => "finalizer",
        }
    }

    /// The condition reason and event reason for errors the user should see on the object.
    /// `None` for API-server trouble: writing a condition about it would likely fail too, and
    /// the retry usually fixes it.
    pub fn user_facing_reason(&self) -> Option<&'static str> {
        match self {
            Error::SecretNotFound { .. } => Some("SecretNotFound"),
            Error::SecretKeyMissing { .. } => Some("SecretKeyMissing"),
            Error::SecretValueInvalid { .. } => Some("SecretValueInvalid"),
            Error::ConfigMapNotFound { .. } => Some("ConfigMapNotFound"),
            Error::ConfigMapKeyMissing { .. } => Some("ConfigMapKeyMissing"),
            Error::ConfigMapValueInvalid { .. } => Some("ConfigMapValueInvalid"),
            Error::InvalidSpec(_) => Some("InvalidSpec"),
            Error::DatabaseUnreachable(_) => Some("DatabaseUnreachable"),
            Error::DatabaseReadOnly(_) => Some("DatabaseReadOnly"),
            Error::DatabaseRefused { reason, .. } => Some(reason),
            Error::MigrationFailed(_) => Some("MigrationFailed"),
            Error::IdNotUnique(_) => Some("IdNotUnique"),
            Error::ObserveLag(_) => Some("LagUnavailable"),
            Error::TableClaimed { .. } => Some("TableClaimedByAnotherRelay"),
            Error::MissingNamespace => Some("InvalidSpec"),
            Error::CleanupFailed(_) => Some("CleanupFailed"),
            // The API server refused the Deployment itself: something in the spec (a label,
            // a toleration, a resource quantity) is not valid there. The user must fix it.
            Error::ApplyDeployment(kube::Error::Api(status))
                if status.is_invalid() || status.code == 400 =>
            {
                Some("DeploymentRejected")
            }
            // An invalid maxUnavailable (a percentage the server refuses) is the spec's.
            Error::ApplyDisruptionBudget(kube::Error::Api(status))
                if status.is_invalid() || status.code == 400 =>
            {
                Some("DisruptionBudgetRejected")
            }
            Error::ReadSecret(_)
            | Error::ReadConfigMap(_)
            | Error::ObserveDeployment(_)
            | Error::ApplyDeployment(_)
            | Error::ApplyDisruptionBudget(_)
            | Error::PatchStatus(_)
            | Error::RelayPodsStopping
            | Error::StopRelayPods(_)
            | Error::Finalizer(_) => None,
        }
    }

    /// True for failures the operator's retries usually get past without anyone's help (the
    /// database restarting, an API-server hiccup); the rest need a person, and the relay is
    /// Stalled at once (see `progress`).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::DatabaseUnreachable(_)
            | Error::DatabaseReadOnly(_)
            | Error::ObserveLag(_)
            | Error::ReadSecret(_)
            | Error::ReadConfigMap(_)
            | Error::ObserveDeployment(_)
            | Error::PatchStatus(_)
            | Error::CleanupFailed(_)
            | Error::RelayPodsStopping
            | Error::StopRelayPods(_)
            | Error::Finalizer(_) => true,
            Error::ApplyDeployment(_) | Error::ApplyDisruptionBudget(_) => {
                self.user_facing_reason().is_none()
            }
            Error::SecretNotFound { .. }
            | Error::SecretKeyMissing { .. }
            | Error::SecretValueInvalid { .. }
            | Error::ConfigMapNotFound { .. }
            | Error::ConfigMapKeyMissing { .. }
            | Error::ConfigMapValueInvalid { .. }
            | Error::InvalidSpec(_)
            | Error::DatabaseRefused { .. }
            | Error::MigrationFailed(_)
            | Error::IdNotUnique(_)
            | Error::TableClaimed { .. }
            | Error::MissingNamespace => false,
        }
    }

    /// True when the table's index state is what failed, so IndexReady turns False too.
    pub fn concerns_the_index(&self) -> bool {
        matches!(
            self,
            Error::DatabaseUnreachable(_)
                | Error::DatabaseReadOnly(_)
                | Error::DatabaseRefused { .. }
                | Error::MigrationFailed(_)
                | Error::IdNotUnique(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_reasons_are_distinct_per_user_facing_cause() {
        let errors = [
            Error::SecretNotFound { name: "db".into() },
            Error::SecretKeyMissing {
                name: "db".into(),
                key: "url".into(),
            },
            Error::SecretValueInvalid {
                name: "db".into(),
                key: "url".into(),
                reason: "has no host".into(),
            },
            Error::ConfigMapNotFound { name: "ca".into() },
            Error::ConfigMapKeyMissing {
                name: "ca".into(),
                key: "ca.crt".into(),
            },
            Error::ConfigMapValueInvalid {
                name: "ca".into(),
                key: "ca.crt".into(),
                reason: "holds no PEM certificate".into(),
            },
            Error::InvalidSpec(SpecErrors(vec![])),
            Error::DatabaseUnreachable("refused".into()),
            Error::DatabaseReadOnly("127.0.0.1:5433 is a read-only standby".into()),
            Error::DatabaseRefused {
                reason: "DatabaseTLS",
                message: "the server's certificate is not trusted".into(),
            },
            Error::MigrationFailed("table missing".into()),
            Error::IdNotUnique("column id has no primary key".into()),
            Error::TableClaimed {
                table: "public.orders".into(),
                relay: "shop/orders".into(),
                renewed_seconds_ago: 12.0,
            },
        ];
        let labels: std::collections::BTreeSet<_> =
            errors.iter().map(Error::metric_label).collect();
        let reasons: std::collections::BTreeSet<_> = errors
            .iter()
            .filter_map(Error::user_facing_reason)
            .collect();
        assert_eq!(labels.len(), errors.len());
        assert_eq!(reasons.len(), errors.len());
        assert_eq!(
            Error::SecretKeyMissing {
                name: "db".into(),
                key: "url".into()
            }
            .to_string(),
            "Secret db has no key url"
        );
    }
}
