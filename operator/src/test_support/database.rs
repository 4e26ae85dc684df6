//! A scripted [`RelayDatabase`] for the request-level tests: each test says what the migration
//! and the lag observation answer, and reads back which calls the pipeline made. The real
//! PostgreSQL side of these answers is tested in `operator/tests/services_postgres_database.rs`.

use std::sync::Mutex;

use futures::future::{BoxFuture, FutureExt, ready};
use outbox_relay::database::DatabaseTarget;
use outbox_relay::table::migrate::{IndexAction, MigrationReport};

use crate::reconcile::database::claims::Release;
use crate::reconcile::database::{
    CleanupRequest, CleanupRun, LagObservation, LagQuery, MigrationRun, RateShare, RelayDatabase,
};
use crate::reconcile::driver::error::Error;
use crate::reconcile::input::validate::RelayPlan;

type MigrationAnswer = Box<dyn FnMut(&RelayPlan) -> Result<MigrationRun, Error> + Send>;
type LagAnswer = Box<dyn FnMut(&LagQuery) -> Result<LagObservation, Error> + Send>;
type CleanupAnswer = Box<dyn FnMut(&CleanupRequest) -> Result<CleanupRun, Error> + Send>;

/// One call the pipeline made.
#[derive(Debug, Clone, PartialEq)]
pub enum DatabaseCall {
    /// A migration of this table.
    Migrate(String),
    ObserveLag(LagQuery),
    /// A per-pod share written (None: the row removed).
    WriteRateShare(Option<RateShare>),
    CleanUp(CleanupRequest),
}

pub struct ScriptedDatabase {
    migration: Mutex<MigrationAnswer>,
    lag: Mutex<LagAnswer>,
    cleanup: Mutex<CleanupAnswer>,
    calls: Mutex<Vec<DatabaseCall>>,
}

/// What a first migration of a fresh table reports on a server that runs autovacuum.
pub fn fresh_table_report(plan: &RelayPlan) -> MigrationReport {
    MigrationReport {
        index_name: format!("{}_pending_idx", plan.table.name),
        index: IndexAction::Created,
        reports_table_created: true,
        frontier_created: true,
        autovacuum_changed: true,
        notify_installed: false,
        server_autovacuum_off: false,
    }
}

/// What the real database answers when no pod has reported: a count of 0 when nothing runs
/// (the operator measures), nothing known otherwise.
pub fn nothing_reported(query: &LagQuery) -> LagObservation {
    if query.running == 0 {
        LagObservation {
            backlog: Some(0),
            backlog_age: Some(std::time::Duration::ZERO),
            measured_by_operator: true,
            ..Default::default()
        }
    } else {
        LagObservation::default()
    }
}

impl Default for ScriptedDatabase {
    /// A database whose table migrates as a fresh one and where no pod has reported yet.
    fn default() -> Self {
        Self {
            migration: Mutex::new(Box::new(|plan| {
                Ok(MigrationRun::Migrated(fresh_table_report(plan)))
            })),
            lag: Mutex::new(Box::new(|query| Ok(nothing_reported(query)))),
            cleanup: Mutex::new(Box::new(|_| {
                Ok(CleanupRun {
                    claim: Release::Released,
                    removed: None,
                })
            })),
            calls: Mutex::new(Vec::new()),
        }
    }
}

impl ScriptedDatabase {
    /// Every migration answers `answer(plan)`.
    pub fn migration(
        self,
        answer: impl FnMut(&RelayPlan) -> Result<MigrationRun, Error> + Send + 'static,
    ) -> Self {
        *self.migration.lock().unwrap() = Box::new(answer);
        self
    }

    /// Every migration runs and reports what a fresh table's would, changed by `change`.
    pub fn migrated(
        self,
        change: impl Fn(MigrationReport) -> MigrationReport + Send + 'static,
    ) -> Self {
        self.migration(move |plan| Ok(MigrationRun::Migrated(change(fresh_table_report(plan)))))
    }

    /// Every lag observation answers `answer(query)`.
    pub fn lag(
        self,
        answer: impl FnMut(&LagQuery) -> Result<LagObservation, Error> + Send + 'static,
    ) -> Self {
        *self.lag.lock().unwrap() = Box::new(answer);
        self
    }

    /// Every cleanup answers `answer(request)`.
    pub fn cleanup(
        self,
        answer: impl FnMut(&CleanupRequest) -> Result<CleanupRun, Error> + Send + 'static,
    ) -> Self {
        *self.cleanup.lock().unwrap() = Box::new(answer);
        self
    }

    pub fn calls(&self) -> Vec<DatabaseCall> {
        self.calls.lock().unwrap().clone()
    }

    fn record(&self, call: DatabaseCall) {
        self.calls.lock().unwrap().push(call);
    }
}

impl RelayDatabase for ScriptedDatabase {
    fn migrate<'a>(
        &'a self,
        _database: &'a DatabaseTarget,
        plan: &'a RelayPlan,
        _relay_name: &'a str,
    ) -> BoxFuture<'a, Result<MigrationRun, Error>> {
        self.record(DatabaseCall::Migrate(plan.table.name.to_string()));
        let answer = (self.migration.lock().unwrap())(plan);
        ready(answer).boxed()
    }

    fn observe_lag<'a>(
        &'a self,
        _database: &'a DatabaseTarget,
        _plan: &'a RelayPlan,
        query: LagQuery,
    ) -> BoxFuture<'a, Result<LagObservation, Error>> {
        let answer = (self.lag.lock().unwrap())(&query);
        self.record(DatabaseCall::ObserveLag(query));
        ready(answer).boxed()
    }

    fn write_rate_share<'a>(
        &'a self,
        _database: &'a DatabaseTarget,
        _plan: &'a RelayPlan,
        _relay_name: &'a str,
        share: Option<RateShare>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.record(DatabaseCall::WriteRateShare(share));
        ready(Ok(())).boxed()
    }

    fn clean_up<'a>(
        &'a self,
        _database: &'a DatabaseTarget,
        _plan: &'a RelayPlan,
        request: CleanupRequest,
    ) -> BoxFuture<'a, Result<CleanupRun, Error>> {
        let answer = (self.cleanup.lock().unwrap())(&request);
        self.record(DatabaseCall::CleanUp(request));
        ready(answer).boxed()
    }
}
