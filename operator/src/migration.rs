//! Step 3 of the reconcile: migrate the outbox table with the relay crate's own function, once
//! per spec generation. The memory of what was migrated lives in the operator process: after a
//! restart each relay is migrated once more, which is cheap because the migration is idempotent
//! (it finds the index valid and does nothing).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use outbox_relay::secret_url::SecretUrl;
use outbox_relay::table::inspect::InspectError;
use outbox_relay::table::migrate::{MigrateError, MigrationReport, migrate};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

use crate::error::Error;
use crate::validation::RelayPlan;

/// A connection attempt longer than this is an outage, not a slow network; the reconciler must
/// not sit on it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the migrate step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationOutcome {
    /// The migration ran now.
    Migrated(MigrationReport),
    /// This generation (with these Secrets) was migrated before; nothing was done.
    AlreadyMigrated,
    /// Another session holds the migration lock (another operator replica, or `outbox-relay
    /// migrate`). The reconcile goes on and comes back soon.
    LockBusy,
}

/// Identifies what was migrated: a relay object at one generation with one database Secret
/// version. A changed spec or a changed database URL migrates again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigrationKey {
    pub relay_uid: String,
    pub generation: i64,
    pub secrets_fingerprint: String,
}

/// The migrations done by this process.
#[derive(Debug, Default)]
pub struct MigrationMemory {
    done: Mutex<HashMap<String, MigrationKey>>,
}

impl MigrationMemory {
    pub fn is_done(&self, key: &MigrationKey) -> bool {
        self.lock().get(&key.relay_uid) == Some(key)
    }

    pub fn remember(&self, key: MigrationKey) {
        self.lock().insert(key.relay_uid.clone(), key);
    }

    pub fn forget(&self, relay_uid: &str) {
        self.lock().remove(relay_uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, MigrationKey>> {
        // A poisoned lock only means another reconcile panicked mid-insert; the map is still
        // a valid cache.
        self.done.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs the migration unless `memory` says this key was migrated already.
pub async fn migrate_once(
    memory: &MigrationMemory,
    key: MigrationKey,
    database_url: &SecretUrl,
    plan: &RelayPlan,
) -> Result<MigrationOutcome, Error> {
    if memory.is_done(&key) {
        return Ok(MigrationOutcome::AlreadyMigrated);
    }
    let mut conn = connect(database_url).await?;
    let result = migrate(&mut conn, &plan.table, &plan.migration).await;
    // Closing politely is a courtesy; the migration's outcome is what matters.
    let _ = conn.close().await;
    match result {
        Ok(report) => {
            memory.remember(key);
            Ok(MigrationOutcome::Migrated(report))
        }
        Err(MigrateError::LockBusy) => Ok(MigrationOutcome::LockBusy),
        Err(MigrateError::Table(InspectError::Database(e))) | Err(MigrateError::Database(e))
            if is_connection_error(&e) =>
        {
            Err(Error::DatabaseUnreachable(redact(
                &e.to_string(),
                database_url,
            )))
        }
        Err(e @ MigrateError::IdNotUnique { .. }) => Err(Error::IdNotUnique(redact(
            &describe_for_spec(&e),
            database_url,
        ))),
        Err(other) => Err(Error::MigrationFailed(redact(
            &describe_for_spec(&other),
            database_url,
        ))),
    }
}

pub(crate) async fn connect(database_url: &SecretUrl) -> Result<PgConnection, Error> {
    let attempt = PgConnection::connect(database_url.expose());
    match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(Error::DatabaseUnreachable(format!(
            "{} ({})",
            redact(&e.to_string(), database_url),
            database_url.redacted()
        ))),
        Err(_) => Err(Error::DatabaseUnreachable(format!(
            "no answer within {}s ({})",
            CONNECT_TIMEOUT.as_secs(),
            database_url.redacted()
        ))),
    }
}

fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut
    )
}

/// The relay's messages name its command-line options (`--table`, `--payload-column`); on an
/// OutboxRelay the user edits spec fields, so name those instead.
fn describe_for_spec(error: &MigrateError) -> String {
    let text = error.to_string();
    [
        ("--table", "spec.database.table"),
        ("--id-column", "spec.database.columns.id"),
        ("--type-column", "spec.database.columns.type"),
        ("--payload-column", "spec.database.columns.payload"),
        ("--occurred-at-column", "spec.database.columns.occurredAt"),
        ("--processed-at-column", "spec.database.columns.processedAt"),
        ("--error-column", "spec.database.columns.error"),
        ("--routing-key-column", "spec.database.columns.routingKey"),
        ("--headers-column", "spec.database.columns.headers"),
        ("--attempts-column", "spec.database.columns.attempts"),
    ]
    .iter()
    .fold(text, |text, (flag, field)| text.replace(flag, field))
}

/// Driver messages do not include the password, but a message that quotes a connection string
/// would; never let one through.
pub(crate) fn redact(message: &str, url: &SecretUrl) -> String {
    let mut text = message.replace(url.expose(), url.redacted());
    if let Some(password) = url.password().filter(|p| !p.is_empty()) {
        text = text.replace(&password, "***");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_relay::secret_url::UrlKind;

    #[test]
    fn redaction_removes_url_and_password() {
        let url =
            SecretUrl::parse("postgres://app:Tr0ub4dor@db:5432/x", UrlKind::Postgres).unwrap();
        let text = redact(
            "failed for postgres://app:Tr0ub4dor@db:5432/x; password Tr0ub4dor rejected",
            &url,
        );
        assert!(!text.contains("Tr0ub4dor"), "{text}");
        assert!(text.contains("db:5432"), "{text}");
    }

    #[test]
    fn relay_option_names_become_spec_fields() {
        let error = MigrateError::Table(InspectError::TableMissing("orders".into()));
        assert_eq!(
            describe_for_spec(&error),
            "invalid spec.database.table: table orders does not exist; create it or fix the name"
        );
    }

    #[test]
    fn memory_is_per_generation_and_secret_version() {
        let memory = MigrationMemory::default();
        let key = MigrationKey {
            relay_uid: "u1".into(),
            generation: 1,
            secrets_fingerprint: "db=1".into(),
        };
        assert!(!memory.is_done(&key));
        memory.remember(key.clone());
        assert!(memory.is_done(&key));
        assert!(!memory.is_done(&MigrationKey {
            generation: 2,
            ..key.clone()
        }));
        assert!(!memory.is_done(&MigrationKey {
            secrets_fingerprint: "db=2".into(),
            ..key.clone()
        }));
        memory.forget("u1");
        assert!(!memory.is_done(&key));
    }
}
