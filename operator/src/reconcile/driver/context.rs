//! What every reconcile shares: the clients (API server, database), the per-relay memories,
//! the metrics, and the reconciler's own settings.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use crate::metrics::Metrics;
use crate::reconcile::build::{BuildSettings, FIELD_MANAGER};
use crate::reconcile::database::RelayDatabase;
use crate::reconcile::database::postgres::PostgresDatabase;
use crate::reconcile::database::sessions::SESSIONS_PER_DATABASE;
use crate::reconcile::driver::memory::RelayMemory;
use crate::reconcile::input::dereference::read_cache::ReadCache;
use crate::reconcile::migrate::MigrationMemory;
use crate::reconcile::scaling::rate_share::RateShareMemory;
use crate::reconcile::scaling::recommend::ScalingMemory;

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
    /// How long after its deletion an OutboxRelay's cleanup is retried before the finalizer
    /// is removed anyway ([`DEFAULT_CLEANUP_TIMEOUT`]).
    pub cleanup_timeout: Duration,
    /// Reconciles running at once (kube-runtime's default has no bound): each holds API
    /// requests and, for its database steps, a session.
    pub reconcile_concurrency: u16,
    /// The operator's sessions one database sees at most at any moment
    /// ([`crate::reconcile::database::sessions`]).
    pub sessions_per_database: usize,
}

/// Reconciles at once by default: enough to keep a thousand OutboxRelays moving (a reconcile
/// mostly waits on the API server and the database), few enough that a restart does not fire a
/// thousand at the API server's priority-and-fairness queue together.
pub const DEFAULT_RECONCILE_CONCURRENCY: u16 = 8;

/// How long a deleted OutboxRelay waits for its cleanup by default. Long enough to ride out a
/// database restart or a managed-service failover (a minute or two) with a few retries; short
/// enough that a namespace deletion, which removes the Secret and the database access along
/// with the relay, is not held for longer than a person would wait before suspecting a hang.
pub const DEFAULT_CLEANUP_TIMEOUT: Duration = Duration::from_secs(5 * 60);

impl Default for Settings {
    fn default() -> Self {
        Self {
            build: BuildSettings::default(),
            resync_after: Duration::from_secs(300),
            lock_busy_retry: Duration::from_secs(5),
            base_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
            cleanup_timeout: DEFAULT_CLEANUP_TIMEOUT,
            reconcile_concurrency: DEFAULT_RECONCILE_CONCURRENCY,
            sessions_per_database: SESSIONS_PER_DATABASE,
        }
    }
}

impl Settings {
    /// How long a relay's memories outlive its last reconcile. A live relay is reconciled at
    /// least every resync or backoff interval, so only a deleted relay's entries get this old;
    /// a scaling relay polled less often than this (hours) starts its autoscaler history
    /// afresh each time, as after an operator restart, which its long interval makes moot.
    pub fn forget_after(&self) -> Duration {
        const AT_LEAST: Duration = Duration::from_secs(3600);
        (self.resync_after.max(self.max_backoff) * 3).max(AT_LEAST)
    }
}

/// State shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub database: Arc<dyn RelayDatabase>,
    pub metrics: Arc<Metrics>,
    pub migrations: MigrationMemory,
    pub scaling: ScalingMemory,
    /// The per-pod rate shares last written.
    pub rate_shares: RateShareMemory,
    /// Consecutive failures per relay, for the error policy's backoff.
    pub failures: RelayMemory<u32>,
    /// The Secrets and ConfigMaps the relays refer to, read again only when the metadata
    /// watch saw them change (the controller feeds it).
    pub secret_reads: ReadCache<Secret>,
    pub config_map_reads: ReadCache<ConfigMap>,
    pub settings: Settings,
}

impl Context {
    /// The production context: the database steps run on PostgreSQL.
    pub fn new(client: Client, metrics: Arc<Metrics>, settings: Settings) -> Self {
        let database = Arc::new(PostgresDatabase::new(settings.sessions_per_database));
        Self::with_database(client, database, metrics, settings)
    }

    pub fn with_database(
        client: Client,
        database: Arc<dyn RelayDatabase>,
        metrics: Arc<Metrics>,
        settings: Settings,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let forget_after = settings.forget_after();
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            database,
            metrics,
            migrations: RelayMemory::new(forget_after),
            scaling: RelayMemory::new(forget_after),
            rate_shares: RelayMemory::new(forget_after),
            failures: RelayMemory::new(forget_after),
            secret_reads: ReadCache::default(),
            config_map_reads: ReadCache::default(),
            settings,
        }
    }
}
