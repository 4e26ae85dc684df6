//! The reconciler's database steps, behind a trait held in the [`Context`]: migrate the
//! outbox table, observe the lag (the pods' reports, or a count when no pod runs), and clean
//! up when the OutboxRelay is deleted.
//!
//! The pipeline only sees these typed results; [`postgres::PostgresDatabase`] is the real one
//! (tested against PostgreSQL in `operator/tests/`), and the request-level tests script their
//! own, so a reconcile test needs no database.
//!
//! [`Context`]: crate::reconcile::Context

pub mod claims;
pub mod postgres;
pub mod sessions;

use std::time::Duration;

use futures::future::BoxFuture;
use outbox_relay::database::DatabaseTarget;
use outbox_relay::table::cleanup::CleanupReport;
use outbox_relay::table::health::TableHealth;
use outbox_relay::table::migrate::MigrationReport;

use crate::reconcile::database::claims::Release;
use crate::reconcile::driver::error::Error;
use crate::reconcile::input::validate::RelayPlan;

/// What the database steps of one reconcile can do.
pub trait RelayDatabase: Send + Sync {
    /// Claims the table for `relay_name` (`namespace/name`), then applies the outbox migration
    /// of `plan` (idempotent: a valid index is left alone). A missing table fails first, with
    /// nothing claimed. A table another relay holds is not migrated: its settings (index shape,
    /// NOTIFY trigger) are that relay's.
    fn migrate<'a>(
        &'a self,
        database: &'a DatabaseTarget,
        plan: &'a RelayPlan,
        relay_name: &'a str,
    ) -> BoxFuture<'a, Result<MigrationRun, Error>>;

    /// The relay's lag as its pods reported it, or as counted now when none runs.
    fn observe_lag<'a>(
        &'a self,
        database: &'a DatabaseTarget,
        plan: &'a RelayPlan,
        query: LagQuery,
    ) -> BoxFuture<'a, Result<LagObservation, Error>>;

    /// Writes the relay's per-pod share of `spec.relay.maxRate` into the limits table, or
    /// removes its row (`None`: no limit), for its pods to read at their next report.
    fn write_rate_share<'a>(
        &'a self,
        database: &'a DatabaseTarget,
        plan: &'a RelayPlan,
        relay_name: &'a str,
        share: Option<RateShare>,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Releases the relay's claim on its table and, when asked, removes what the migration
    /// created for it (see [`CleanupRequest`]). Idempotent, so a failed attempt is retried.
    fn clean_up<'a>(
        &'a self,
        database: &'a DatabaseTarget,
        plan: &'a RelayPlan,
        request: CleanupRequest,
    ) -> BoxFuture<'a, Result<CleanupRun, Error>>;
}

/// What a deleted OutboxRelay leaves to clean up in its database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupRequest {
    /// `namespace/name`: the claim's holder and the key of the report rows.
    pub relay_name: String,
    /// `cleanupPolicy: delete`: also remove the index, trigger, report rows and autovacuum
    /// settings, unless another relay holds the table.
    pub remove_migration: bool,
}

/// What a cleanup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupRun {
    pub claim: Release,
    /// What the migration's undoing removed; `None` when it was not asked for, or skipped
    /// because another relay holds the table ([`Release::HeldBy`]).
    pub removed: Option<CleanupReport>,
}

/// The outcome of one migration attempt that reached the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationRun {
    Migrated(MigrationReport),
    /// Another session holds the migration lock (another operator replica, or `outbox-relay
    /// migrate`); nothing was done.
    LockBusy,
}

/// Whose lag to observe, and how old a report may be to still count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LagQuery {
    /// `namespace/name`, the key the pods report under.
    pub relay_name: String,
    /// Pods the Deployment runs; at 0 nobody reports, so the backlog is counted instead.
    pub running: i32,
    /// A pod that stopped reporting longer ago no longer speaks for the relay.
    pub stale_after: Duration,
}

/// What the operator knows about the relay's lag this round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LagObservation {
    /// Pending rows, if a fresh measurement exists.
    pub backlog: Option<i64>,
    pub backlog_capped: bool,
    /// Age of that measurement.
    pub backlog_age: Option<Duration>,
    pub oldest_age_seconds: Option<f64>,
    /// Messages per second, summed over the pods that reported.
    pub publish_rate: f64,
    pub reporting_pods: usize,
    /// True when the operator counted the rows itself (no pod was running).
    pub measured_by_operator: bool,
    /// What keeps pods from relaying, as their fresh reports say; `None` when they relay.
    pub problem: Option<PodProblem>,
    /// The table's health, measured with the backlog (by the measuring pod, or by the operator
    /// when no pod runs); `None` when the reports carry none (a relay older than the figures).
    pub table_health: Option<TableHealth>,
    /// The rate limits in force in the reporting pods, summed; `None` when no pod has one (or
    /// the pods are older than rate limits).
    pub max_rate: Option<f64>,
    /// The publish rates of the pods that have a limit, summed: compared with `max_rate`.
    pub limited_publish_rate: f64,
    /// Seconds the pods' workers waited for permits during their last report interval.
    pub rate_limited_seconds: f64,
}

impl LagObservation {
    /// True while the pods that have a limit publish at [`HELD_BACK_SHARE`] of it or more:
    /// the limit, not the broker or the database, is what holds them back.
    pub fn held_back_by_rate_limit(&self) -> bool {
        self.max_rate.is_some_and(|limit| {
            limit > 0.0 && self.limited_publish_rate >= HELD_BACK_SHARE * limit
        })
    }
}

/// The share of their limits at which the pods count as held back by it. Under a steady
/// backlog a limited pod publishes at its limit (GCRA lets a burst of one claim above it), so
/// 90 % leaves room for the rate's measurement over a report interval.
pub const HELD_BACK_SHARE: f64 = 0.9;

/// What the operator writes into the limits table for one relay; re-exported for the pipeline.
pub use outbox_relay::table::limits::RateShare;

/// A problem relay pods reported (e.g. the exchange is missing on the broker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProblem {
    /// A condition reason: the relay's problem code, e.g. `ExchangeNotFound`.
    pub reason: String,
    /// The relay's own words, with the fix; never carries a password.
    pub message: String,
    /// The pods that report it, by name.
    pub pods: Vec<String>,
}
