//! `outbox-cluster`: the local Kubernetes behind `make cluster`, to try the operator without a
//! cluster.
//!
//! It starts the tests' real control plane (etcd, kube-apiserver, kube-controller-manager) with
//! its files under `--dir`, runs a node agent that takes the pods of every namespace and runs
//! them as runc containers of the image built from the binaries next to this one (with the
//! host's network, so pods reach the PostgreSQL and RabbitMQ on 127.0.0.1), and `helm
//! install`s the operator chart cluster-wide, as shipped: the chart's own operator Deployment
//! runs as a container with in-cluster credentials (the projected ServiceAccount token and CA,
//! `KUBERNETES_SERVICE_HOST`/`PORT`), as a kubelet would run it. Where runc cannot run, the
//! pods are local processes and the operator runs as a process with a token of the chart's
//! ServiceAccount instead. Once all of that is up it writes `<dir>/kubeconfig` and prints
//! `KUBECONFIG=<path>` and where `kubectl` and `helm` are, then stays in the foreground until
//! SIGTERM or SIGINT: the operator gets SIGTERM, the relays SIGTERM and their grace period, and
//! the control plane stops.
//!
//! Every process it starts dies with it, even on `kill -9` (`PR_SET_PDEATHSIG`, and for the
//! containers the reaper of `outbox_tests::oci`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams};
use outbox_tests::cluster::{OPERATOR_NAME, OperatorProcess, install_chart_cluster_wide};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::node_agent::{NodeAgent, NodeAgentConfig, PodRuntime};
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
    operator: Operator,
}

/// Where the operator runs.
enum Operator {
    /// The chart's Deployment, its pod a container on the node agent.
    Pod(Api<Deployment>),
    /// A process with a token of the chart's ServiceAccount (where runc cannot run).
    Process(OperatorProcess),
}

impl Operator {
    /// Stops the operator before the relays, so it does not react to their pods going away.
    async fn stop(self, node: &NodeAgent) {
        match self {
            Operator::Process(process) => process.stop().await,
            Operator::Pod(deployments) => {
                let scale = serde_json::json!({"spec": {"replicas": 0}});
                let params = PatchParams::default();
                let _ = deployments
                    .patch(OPERATOR_NAME, &params, &Patch::Merge(&scale))
                    .await;
                let started = Instant::now();
                while !node.running_pods(OPERATOR_NAME).is_empty()
                    && started.elapsed() < OPERATOR_READY_TIMEOUT
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
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
    cluster.operator.stop(&cluster.node).await;
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
        Ok(plane)
    })
    .await??;
    let plane = std::sync::Arc::new(plane);
    let client = plane.admin_client().await?;
    let config = NodeAgentConfig {
        api_server: Some(plane.server.clone()),
        ..NodeAgentConfig::default()
    };
    let runtime = config.runtime;
    let node = NodeAgent::start_all_namespaces(client.clone(), NODE, config).await?;
    let how = match runtime {
        PodRuntime::Containers => "as runc containers of the image",
        PodRuntime::Processes => "as local processes (runc cannot run here)",
    };
    eprintln!("outbox-cluster: node {NODE} runs the pods of every namespace {how}");
    // With containers the chart runs its own operator pod; helm's --wait sees it ready.
    let operator_pods = u32::from(runtime == PodRuntime::Containers);
    let installing = plane.clone();
    tokio::task::spawn_blocking(move || {
        install_chart_cluster_wide(&installing, RELEASE_NAMESPACE, operator_pods)
    })
    .await?
    .context("helm install")?;
    eprintln!("outbox-cluster: chart installed in {RELEASE_NAMESPACE}, watching every namespace");
    let operator = match runtime {
        PodRuntime::Containers => {
            eprintln!("outbox-cluster: the chart's operator pod is ready");
            Operator::Pod(Api::namespaced(client, RELEASE_NAMESPACE))
        }
        PodRuntime::Processes => {
            let process =
                OperatorProcess::start(&plane, RELEASE_NAMESPACE, "", "operator", &[]).await?;
            wait_operator_ready(&process).await?;
            eprintln!(
                "outbox-cluster: operator running (log {})",
                process.log.display()
            );
            Operator::Process(process)
        }
    };
    let plane = std::sync::Arc::try_unwrap(plane)
        .map_err(|_| anyhow::anyhow!("the control plane is still shared"))?;

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
