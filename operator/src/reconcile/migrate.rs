//! The migrate step: the outbox table is migrated once per spec generation and database
//! Secret version. What was migrated is remembered by this process only: after a restart each
//! relay is migrated once more, which is cheap because the migration is idempotent (it finds
//! the index valid and does nothing).

use outbox_relay::database::DatabaseTarget;
use outbox_relay::table::migrate::MigrationReport;

use crate::reconcile::database::{MigrationRun, RelayDatabase};
use crate::reconcile::driver::error::Error;
use crate::reconcile::driver::memory::RelayMemory;
use crate::reconcile::input::validate::RelayPlan;

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

/// The migrations done by this process, per relay uid.
pub type MigrationMemory = RelayMemory<MigrationKey>;

/// Is `key` the last thing migrated for its relay?
pub fn already_migrated(memory: &MigrationMemory, key: &MigrationKey) -> bool {
    memory.get(&key.relay_uid).as_ref() == Some(key)
}

/// Runs the migration unless `memory` says this key was migrated already.
pub async fn migrate_once(
    memory: &MigrationMemory,
    database: &dyn RelayDatabase,
    key: MigrationKey,
    target: &DatabaseTarget,
    plan: &RelayPlan,
    relay_name: &str,
) -> Result<MigrationOutcome, Error> {
    if already_migrated(memory, &key) {
        return Ok(MigrationOutcome::AlreadyMigrated);
    }
    match database.migrate(target, plan, relay_name).await? {
        MigrationRun::Migrated(report) => {
            memory.put(&key.relay_uid.clone(), key);
            Ok(MigrationOutcome::Migrated(report))
        }
        MigrationRun::LockBusy => Ok(MigrationOutcome::LockBusy),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn memory_is_per_generation_and_secret_version() {
        let memory = MigrationMemory::new(Duration::from_secs(3600));
        let key = MigrationKey {
            relay_uid: "u1".into(),
            generation: 1,
            secrets_fingerprint: "db=1".into(),
        };
        assert!(!already_migrated(&memory, &key));
        memory.put("u1", key.clone());
        assert!(already_migrated(&memory, &key));
        assert!(!already_migrated(
            &memory,
            &MigrationKey {
                generation: 2,
                ..key.clone()
            }
        ));
        assert!(!already_migrated(
            &memory,
            &MigrationKey {
                secrets_fingerprint: "db=2".into(),
                ..key.clone()
            }
        ));
        memory.forget("u1");
        assert!(!already_migrated(&memory, &key));
    }
}
