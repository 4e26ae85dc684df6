//! `outbox-cluster`: the local Kubernetes behind `make cluster`, to try the operator without a
//! cluster.
//!
//! It starts the tests' real control plane (etcd, kube-apiserver, kube-controller-manager) with
//! its files under `--dir`, `helm install`s the operator chart cluster-wide (with zero operator
//! pods), runs the operator as a process with a token of the chart's ServiceAccount, and runs a
//! node agent that takes the pods of every namespace and runs them as local processes of the
//! `outbox-relay` built next to this binary, so relay pods reach the PostgreSQL and RabbitMQ on
//! 127.0.0.1. Once all of that is up it writes `<dir>/kubeconfig` and prints
//! `KUBECONFIG=<path>` and where `kubectl` and `helm` are, then stays in the foreground until
//! SIGTERM or SIGINT: the operator gets SIGTERM, the relays SIGTERM and their grace period, and
//! the control plane stops.
//!
//! Every process it starts dies with it, even on `kill -9` (`PR_SET_PDEATHSIG`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use outbox_tests::cluster::{OperatorProcess, install_chart_cluster_wide};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::node_agent::{NodeAgent, NodeAgentConfig};
use outbox_tests::{helm, http, process};
use tokio::signal::unix::{SignalKind, signal};

/// Where the chart and the operator's ServiceAccount live, as in the README's install.
const RELEASE_NAMESPACE: &str = "outbox-relay-system";
/// The one node, which runs the pods of every namespace.
const NODE: &str = "local";
/// Longest wait for the operator's `/readyz` after it started.
const OPERATOR_READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser)]
#[command(
    name = "outbox-cluster",
    about = "A local control plane with the operator installed, until SIGTERM (make cluster)"
)]
struct Cli {
    /// Folder of the cluster's files: kubeconfig, pid, logs, the control plane's state.
    /// Default: .cache/cluster in the repository.
    #[arg(long, env = "OUTBOX_CLUSTER_DIR")]
    dir: Option<PathBuf>,
    /// Also stop when the process with this pid exits, so a test's cluster never outlives the
    /// test.
    #[arg(long, env = "OUTBOX_CLUSTER_EXIT_WITH")]
    exit_with: Option<u32>,
}

/// The cluster's files under its folder.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn pid(&self) -> PathBuf {
        self.dir.join("pid")
    }
    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
    fn plane(&self) -> PathBuf {
        self.dir.join("plane")
    }
    fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }
}

/// What runs while the cluster is up, stopped in reverse order.
struct Cluster {
    plane: ControlPlane,
    node: NodeAgent,
    operator: OperatorProcess,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let dir = cli
        .dir
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/cluster"));
    match prepare(&dir) {
        Ok(files) => {
            // SAFETY: no other thread runs yet (the runtime is built below), so nothing reads
            // the environment while it changes.
            unsafe { std::env::set_var(process::LOG_DIR_ENV, files.logs()) };
            let result = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("start the runtime")
                .and_then(|runtime| {
                    let result = runtime.block_on(run(&files, cli.exit_with));
                    // Not waiting for a start-up cut short in its blocking part.
                    runtime.shutdown_timeout(Duration::from_secs(1));
                    result
                });
            let _ = std::fs::remove_file(files.kubeconfig());
            let _ = std::fs::remove_file(files.pid());
            match result {
                Ok(()) => {
                    eprintln!("outbox-cluster: stopped");
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("outbox-cluster: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(error) => {
            eprintln!("outbox-cluster: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Claims the folder: refuses when a live cluster already uses it, then writes the pid file
/// and removes what an earlier run left: its logs and its kubeconfig (which appears again only
/// once all is up).
fn prepare(dir: &Path) -> anyhow::Result<Files> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let files = Files {
        dir: std::path::absolute(dir)?,
    };
    if let Ok(text) = std::fs::read_to_string(files.pid())
        && let Ok(pid) = text.trim().parse::<u32>()
        && pid != std::process::id()
        && is_outbox_cluster(pid)
    {
        bail!(
            "already running as pid {pid} with {}: stop it first (make cluster-down)",
            files.dir.display()
        );
    }
    let _ = std::fs::remove_file(files.kubeconfig());
    let _ = std::fs::remove_dir_all(files.logs());
    std::fs::write(files.pid(), format!("{}\n", std::process::id()))?;
    Ok(files)
}

/// Whether `pid` is a live `outbox-cluster` (pids are reused).
fn is_outbox_cluster(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| {
            let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(argv0).ends_with("outbox-cluster")
        })
        .unwrap_or(false)
}

async fn run(files: &Files, exit_with: Option<u32>) -> anyhow::Result<()> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    // A signal during start-up ends the process at once: no relay runs yet that needs a grace
    // period, and what has started dies with the process (the parent-death signal).
    let cluster = tokio::select! {
        cluster = start(files) => cluster?,
        _ = terminate.recv() => bail!("stopped by SIGTERM during start-up"),
        _ = interrupt.recv() => bail!("stopped by SIGINT during start-up"),
    };
    tokio::select! {
        _ = terminate.recv() => eprintln!("outbox-cluster: SIGTERM, stopping"),
        _ = interrupt.recv() => eprintln!("outbox-cluster: SIGINT, stopping"),
        pid = exited(exit_with) => eprintln!("outbox-cluster: process {pid} exited, stopping"),
    }
    // The operator first, so it does not react to the pods going away; then the relays, each
    // with SIGTERM and its grace period; the control plane last.
    cluster.operator.stop().await;
    cluster.node.shutdown().await;
    drop(cluster.plane);
    Ok(())
}

async fn start(files: &Files) -> anyhow::Result<Cluster> {
    let plane_dir = files.plane();
    eprintln!(
        "outbox-cluster: starting etcd, kube-apiserver and kube-controller-manager in {}",
        plane_dir.display()
    );
    let plane = tokio::task::spawn_blocking(move || -> anyhow::Result<ControlPlane> {
        let plane = ControlPlane::start_in(&plane_dir)?;
        eprintln!("outbox-cluster: API server ready at {}", plane.server);
        plane.create_namespace(RELEASE_NAMESPACE)?;
        install_chart_cluster_wide(&plane, RELEASE_NAMESPACE).context("helm install")?;
        eprintln!(
            "outbox-cluster: chart installed in {RELEASE_NAMESPACE}, watching every namespace"
        );
        Ok(plane)
    })
    .await??;
    let client = plane.admin_client().await?;
    let node = NodeAgent::start_all_namespaces(client, NODE, NodeAgentConfig::default()).await?;
    eprintln!("outbox-cluster: node {NODE} runs the pods of every namespace");
    let operator = OperatorProcess::start(&plane, RELEASE_NAMESPACE, "", "operator", &[]).await?;
    wait_operator_ready(&operator).await?;
    eprintln!(
        "outbox-cluster: operator running (log {})",
        operator.log.display()
    );

    // Written last and renamed into place, so its presence means everything is up.
    let staged = files.dir.join("kubeconfig.tmp");
    std::fs::copy(&plane.kubeconfig, &staged)?;
    std::fs::rename(&staged, files.kubeconfig())?;
    let version = plane
        .kubectl_ok(&["version", "-o", "json"])
        .ok()
        .and_then(|json| serde_json::from_str::<serde_json::Value>(&json).ok())
        .and_then(|v| {
            v["serverVersion"]["gitVersion"]
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "version unknown".into());
    let mut out = std::io::stdout().lock();
    writeln!(out, "KUBECONFIG={}", files.kubeconfig().display())?;
    writeln!(
        out,
        "kubectl: {} ({version}, the control plane's own)",
        plane.kubectl_path().display()
    )?;
    writeln!(out, "helm: {}", helm::helm_path()?.display())?;
    writeln!(
        out,
        "logs: {} (operator and pods), {} (control plane)",
        files.logs().display(),
        files.plane().display()
    )?;
    out.flush()?;
    Ok(Cluster {
        plane,
        node,
        operator,
    })
}

/// Polls the operator's `/readyz` until it answers 200.
async fn wait_operator_ready(operator: &OperatorProcess) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if tokio::net::TcpStream::connect(&operator.metrics_addr)
            .await
            .is_ok()
            && http::get(&operator.metrics_addr, "/readyz").await.0 == 200
        {
            return Ok(());
        }
        if started.elapsed() > OPERATOR_READY_TIMEOUT {
            let log = operator.log_text();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            bail!(
                "the operator is not ready after {OPERATOR_READY_TIMEOUT:?}; the end of {}:\n{}",
                operator.log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Resolves to `pid` once that process is gone; never, without a pid.
async fn exited(pid: Option<u32>) -> u32 {
    let Some(pid) = pid else {
        return std::future::pending().await;
    };
    while Path::new(&format!("/proc/{pid}")).exists() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    pid
}
