//! `outbox-operator`: `run` the controller, print the `crd`, or `migrate-storage`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgAction, Parser, Subcommand};
use outbox_operator::crd::CRD_NAME;
use outbox_operator::metrics::Metrics;
use outbox_operator::reconcile::Settings;
use outbox_operator::reconcile::build::BuildSettings;
use outbox_operator::reconcile::database::sessions::SESSIONS_PER_DATABASE;
use outbox_operator::reconcile::driver::context::DEFAULT_RECONCILE_CONCURRENCY;
use outbox_operator::runtime::run::{RunOptions, run};
use outbox_operator::runtime::storage_migration::{Scope, migrate_storage};
use outbox_operator::runtime::telemetry::{self, LogFormat};
use outbox_relay::telemetry::export::flush_and_stop;
use outbox_relay::telemetry::settings::otlp_target;

#[derive(Parser)]
#[command(
    name = "outbox-operator",
    version,
    about = "Kubernetes operator for outbox relays"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Reconcile OutboxRelay resources until SIGTERM.
    // Boxed: the other commands take no arguments, and clippy would have every Command as large.
    Run(Box<RunArgs>),
    /// Print the OutboxRelay CustomResourceDefinition as YAML.
    Crd,
    /// Rewrite every stored OutboxRelay at the CRD's storage version.
    ///
    /// Then set the CRD's status.storedVersions to that version alone, so that a later release
    /// may stop serving an older one. The operator does this at start when it watches every
    /// namespace; a namespaced operator cannot, so run this once as a cluster administrator
    /// (it lists and updates OutboxRelays in every namespace and patches the CRD's status).
    MigrateStorage,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Namespace to watch; repeat for several. Default: all namespaces.
    #[arg(
        long = "namespace",
        value_name = "NS",
        env = "OUTBOX_OPERATOR_NAMESPACES",
        value_delimiter = ','
    )]
    namespaces: Vec<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(
        long,
        default_value = "0.0.0.0:8080",
        env = "OUTBOX_OPERATOR_METRICS_ADDR"
    )]
    metrics_addr: SocketAddr,
    /// text or json.
    #[arg(
        long,
        value_enum,
        default_value = "json",
        env = "OUTBOX_OPERATOR_LOG_FORMAT"
    )]
    log_format: LogFormat,
    /// Elect one active replica through a coordination/v1 Lease.
    #[arg(long, default_value_t = true, action = ArgAction::Set, env = "OUTBOX_OPERATOR_LEADER_ELECTION")]
    leader_election: bool,
    /// Namespace of the Lease. Default: the operator's own namespace.
    #[arg(long, env = "OUTBOX_OPERATOR_LEADER_ELECTION_NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// Name of the Lease.
    #[arg(
        long,
        default_value = "outbox-relay-operator",
        env = "OUTBOX_OPERATOR_LEASE_NAME"
    )]
    lease_name: String,
    /// Apply this release's CRD at start (server-side apply, as the leader) and rewrite stored
    /// OutboxRelays at its storage version. Off: apply `outbox-operator crd` yourself.
    #[arg(long, default_value_t = true, action = ArgAction::Set, env = "OUTBOX_OPERATOR_MANAGE_CRD")]
    manage_crd: bool,
    /// Relay image for OutboxRelays that name none. Default: this operator's own image.
    #[arg(long, env = "OUTBOX_OPERATOR_RELAY_IMAGE")]
    relay_image: Option<String>,
    /// First retry of a failed reconcile; doubles with each consecutive failure.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, env = "OUTBOX_OPERATOR_RETRY_BASE")]
    retry_base: Duration,
    /// Longest wait between retries of a failing reconcile.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, env = "OUTBOX_OPERATOR_RETRY_MAX")]
    retry_max: Duration,
    /// Reconcile every relay at least this often, even when nothing changed.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, env = "OUTBOX_OPERATOR_RESYNC_INTERVAL")]
    resync_interval: Duration,
    /// How long a deleted OutboxRelay waits at most for its database cleanup (claim release,
    /// and what cleanupPolicy delete removes) before it is deleted anyway, with a Warning event
    /// naming what was left behind. Bounds `kubectl delete` and namespace deletion while the
    /// database is down or its Secret is gone.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, env = "OUTBOX_OPERATOR_CLEANUP_TIMEOUT")]
    cleanup_timeout: Duration,
    /// Reconciles running at once (1 to 1000). Each waits mostly on the API server and the
    /// database; more of them finish a mass change (a restart, a rotated Secret touching every
    /// OutboxRelay) sooner at the price of bursts of API requests.
    #[arg(long, default_value_t = DEFAULT_RECONCILE_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..=1000), env = "OUTBOX_OPERATOR_RECONCILE_CONCURRENCY")]
    reconcile_concurrency: u16,
    /// The operator's sessions one database sees at most at any moment (1 to 100), however many
    /// OutboxRelays use it: the database steps of more reconciles wait their turn.
    #[arg(long, default_value_t = SESSIONS_PER_DATABASE, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100), env = "OUTBOX_OPERATOR_SESSIONS_PER_DATABASE")]
    sessions_per_database: usize,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // The workspace builds one rustls backend (ring); naming it keeps the API-server client
    // working even if a dependency ever brings a second one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match execute(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // `{:#}` gives the whole cause chain on one line, without a backtrace dump.
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Crd => {
            print!("{}", outbox_operator::crd::crd_yaml());
            Ok(())
        }
        Command::MigrateStorage => {
            let client = kube::Client::try_default()
                .await
                .context("no Kubernetes configuration found (in-cluster or kubeconfig)")?;
            let outcome = migrate_storage(&client, CRD_NAME, &Scope::Cluster).await?;
            println!(
                "storedVersions was {:?}; {} OutboxRelays rewritten; storedVersions is [{:?}]",
                outcome.stored_before, outcome.rewritten, outcome.storage_version
            );
            Ok(())
        }
        Command::Run(args) => {
            let metrics = Arc::new(Metrics::default());
            let otlp = otlp_target(|name| std::env::var(name).ok())?;
            let spans = telemetry::init(args.log_format, otlp.as_ref(), metrics.spans.clone())?;
            let mut build = BuildSettings::default();
            if let Some(image) = args.relay_image {
                build.default_image = image;
            }
            let result = run(RunOptions {
                namespaces: args.namespaces,
                metrics_addr: args.metrics_addr,
                leader_election: args.leader_election,
                leader_election_namespace: args.leader_election_namespace,
                lease_name: args.lease_name,
                manage_crd: args.manage_crd,
                settings: Settings {
                    build,
                    resync_after: args.resync_interval,
                    base_backoff: args.retry_base,
                    max_backoff: args.retry_max.max(args.retry_base),
                    cleanup_timeout: args.cleanup_timeout,
                    reconcile_concurrency: args.reconcile_concurrency,
                    sessions_per_database: args.sessions_per_database,
                    ..Settings::default()
                },
                metrics,
            })
            .await;
            if let Some(provider) = spans {
                // The exporter's thread sends them on this runtime: wait for it off the runtime.
                let flush = move || flush_and_stop(provider, Duration::from_secs(5));
                let _ = tokio::task::spawn_blocking(flush).await;
            }
            result
        }
    }
}
