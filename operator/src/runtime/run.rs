//! `outbox-operator run`: the HTTP endpoints, leader election, and one controller per watched
//! namespace, until SIGTERM. Losing the lease stops the controllers and goes back to
//! campaigning, so a partitioned replica never reconciles next to the new leader.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::Notify;

use crate::crd::{self, CRD_NAME};
use crate::metrics::Metrics;
use crate::reconcile::{Context, Settings};
use crate::runtime::api_requests::CountApiRequests;
use crate::runtime::controller::run_controller;
use crate::runtime::crd_apply::{apply_crd, check_served};
use crate::runtime::leader::{LeaseSettings, release, try_acquire_or_renew};
use crate::runtime::server::{ServerState, serve};
use crate::runtime::storage_migration::{Scope, migrate_storage};

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    pub metrics_addr: SocketAddr,
    pub leader_election: bool,
    /// Namespace of the Lease; default: $POD_NAMESPACE, else the client's namespace.
    pub leader_election_namespace: Option<String>,
    pub lease_name: String,
    /// Apply this release's CRD and migrate stored objects to its storage version, as the
    /// leader, before reconciling; off: only check that the cluster serves that version.
    pub manage_crd: bool,
    pub settings: Settings,
    /// Made before the run, so that the span exporter set up with the log counts into it.
    pub metrics: Arc<Metrics>,
}

/// A one-way "stop" flag that any number of futures can wait on.
#[derive(Default)]
struct StopSignal {
    stopped: AtomicBool,
    notify: Notify,
}

impl StopSignal {
    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    async fn wait(self: Arc<Self>) {
        loop {
            let notified = self.notify.notified();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}

pub async fn run(options: RunOptions) -> anyhow::Result<()> {
    let metrics = options.metrics.clone();
    let ready = Arc::new(AtomicBool::new(false));
    let state = ServerState {
        metrics: metrics.clone(),
        ready: ready.clone(),
    };
    let addr = options.metrics_addr;
    tokio::spawn(async move {
        if let Err(error) = serve(addr, state).await {
            tracing::error!(%error, %addr, "the metrics and health server stopped");
        }
    });

    let config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration found (in-cluster or kubeconfig)")?;
    let client = kube::client::ClientBuilder::try_from(config)
        .context("the Kubernetes client could not be built from its configuration")?
        .with_layer(&CountApiRequests::new(metrics.api_requests.clone()))
        .build();
    let server = client
        .apiserver_version()
        .await
        .context("the Kubernetes API server did not answer")?;
    ready.store(true, Ordering::Relaxed);
    // One line that says what this operator does, for `kubectl logs` right after an install.
    let watching = if options.namespaces.is_empty() {
        "every namespace".to_string()
    } else {
        options.namespaces.join(", ")
    };
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        kubernetes = %server.git_version,
        watching = %watching,
        leader_election = options.leader_election,
        metrics = %addr,
        relay_image = %options.settings.build.default_image,
        "outbox-operator started"
    );

    let shutdown = Arc::new(StopSignal::default());
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            wait_for_signal().await;
            tracing::info!("shutting down");
            shutdown.stop();
        }
    });

    let ctx = Arc::new(Context::new(
        client.clone(),
        metrics,
        options.settings.clone(),
    ));
    if !options.leader_election {
        prepare_cluster(&client, &options).await?;
        run_controllers(ctx, &options.namespaces, shutdown.clone()).await;
        return Ok(());
    }

    let lease_namespace = options
        .leader_election_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .unwrap_or_else(|| client.default_namespace().to_string());
    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_namespace);
    let identity = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| format!("outbox-operator-{}", std::process::id()));
    let lease = LeaseSettings::new(options.lease_name.clone(), identity);

    while !shutdown.is_stopped() {
        if !campaign(&leases, &lease, &shutdown).await {
            break;
        }
        tracing::info!(lease = %lease.name, identity = %lease.identity, "became the leader");
        // Only the leader writes the CRD: during a rolling update the old operator, while it
        // still leads, never puts its older CRD back over the new one's.
        if let Err(error) = prepare_cluster(&client, &options).await {
            if let Err(release_error) = release(&leases, &lease).await {
                tracing::warn!(error = %release_error, "could not release the lease");
            }
            return Err(error);
        }
        let lost = Arc::new(StopSignal::default());
        let renewer = tokio::spawn(keep_renewing(
            leases.clone(),
            lease.clone(),
            lost.clone(),
            shutdown.clone(),
        ));
        let either = Arc::new(StopSignal::default());
        let stop_forwarder = {
            let (either, lost, shutdown) = (either.clone(), lost.clone(), shutdown.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = lost.wait() => {},
                    _ = shutdown.wait() => {},
                }
                either.stop();
            })
        };
        run_controllers(ctx.clone(), &options.namespaces, either).await;
        renewer.abort();
        stop_forwarder.abort();
        if lost.is_stopped() && !shutdown.is_stopped() {
            tracing::warn!("lost the lease; stopped reconciling and campaigning again");
        }
    }
    if let Err(error) = release(&leases, &lease).await {
        tracing::warn!(%error, "could not release the lease");
    }
    Ok(())
}

/// Brings the cluster's CRD to this release's and its stored objects to the storage version
/// (or, when the operator does not manage its CRD, checks that the version it works on is
/// served). A failed migration is a warning, not a stop: reconciling works either way, and
/// only a later release that stops serving the old version needs it done.
async fn prepare_cluster(client: &Client, options: &RunOptions) -> anyhow::Result<()> {
    if !options.manage_crd {
        return check_served(client).await;
    }
    apply_crd(client, &crd::crd()).await?;
    tracing::info!(crd = CRD_NAME, "applied this release's CRD");
    let scope = if options.namespaces.is_empty() {
        Scope::Cluster
    } else {
        Scope::Namespaces(options.namespaces.clone())
    };
    match migrate_storage(client, CRD_NAME, &scope).await {
        Ok(outcome) if outcome.stored_before == [outcome.storage_version.clone()] => {}
        Ok(outcome) if outcome.stored_versions_updated => tracing::info!(
            rewritten = outcome.rewritten,
            stored_versions_were = ?outcome.stored_before,
            storage_version = %outcome.storage_version,
            "rewrote every OutboxRelay at the storage version; status.storedVersions is now the storage version alone"
        ),
        Ok(outcome) => tracing::warn!(
            rewritten = outcome.rewritten,
            stored_versions = ?outcome.stored_before,
            "rewrote the watched namespaces' OutboxRelays at the storage version; other namespaces may hold older ones, so status.storedVersions stays: run `outbox-operator migrate-storage` as a cluster administrator before upgrading to a release that stops serving an old version"
        ),
        Err(error) => tracing::warn!(
            error = format!("{error:#}"),
            "could not migrate the stored OutboxRelays to the storage version; the next start tries again, or run `outbox-operator migrate-storage`"
        ),
    }
    Ok(())
}

/// Tries for the lease until won (true) or shut down (false).
async fn campaign(leases: &Api<Lease>, lease: &LeaseSettings, shutdown: &Arc<StopSignal>) -> bool {
    loop {
        match try_acquire_or_renew(leases, lease).await {
            Ok(true) => return true,
            Ok(false) => tracing::debug!("another replica leads; waiting"),
            Err(error) => tracing::warn!(%error, "leader election failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(lease.retry_period) => {},
            _ = shutdown.clone().wait() => return false,
        }
    }
}

/// Renews until a renewal is refused, or none succeeded for a whole lease duration; then
/// signals `lost`.
async fn keep_renewing(
    leases: Api<Lease>,
    lease: LeaseSettings,
    lost: Arc<StopSignal>,
    shutdown: Arc<StopSignal>,
) {
    let mut last_renewal = tokio::time::Instant::now();
    while !shutdown.is_stopped() {
        tokio::time::sleep(lease.retry_period).await;
        match try_acquire_or_renew(&leases, &lease).await {
            Ok(true) => last_renewal = tokio::time::Instant::now(),
            Ok(false) => break,
            Err(error) => {
                tracing::warn!(%error, "could not renew the lease");
                // Stop before the lease can expire under us and another replica starts.
                if last_renewal.elapsed() + lease.retry_period >= lease.lease_duration {
                    break;
                }
            }
        }
    }
    lost.stop();
}

async fn run_controllers(ctx: Arc<Context>, namespaces: &[String], stop: Arc<StopSignal>) {
    let targets: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    let controllers = targets
        .into_iter()
        .map(|namespace| run_controller(ctx.clone(), namespace, stop.clone().wait()));
    futures::future::join_all(controllers).await;
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_waiter_sees_the_stop() {
        let signal = Arc::new(StopSignal::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| tokio::spawn(signal.clone().wait()))
            .collect();
        tokio::task::yield_now().await;
        signal.stop();
        for waiter in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .unwrap()
                .unwrap();
        }
        // A late waiter returns at once.
        signal.clone().wait().await;
    }
}
