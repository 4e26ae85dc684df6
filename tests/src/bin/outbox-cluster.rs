//! `outbox-cluster`: the local Kubernetes behind `make cluster`, to try the operator without a
//! cluster.
//!
//! It starts the tests' real control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler) with its files under `--dir`, and the tests' real node (containerd, runc,
//! the CNI bridge, the kubelet and kube-proxy, see `outbox_tests::node`) with the image built
//! from the binaries next to this one imported. Then it `helm install`s the operator chart
//! cluster-wide, as shipped: the chart's operator Deployment runs as a pod on the node, with
//! in-cluster credentials, reaching the API server through the `kubernetes` Service. Pods
//! reach the local PostgreSQL and RabbitMQ on the services address, 10.213.0.1. Once all of
//! that is up it writes `<dir>/kubeconfig` and prints `KUBECONFIG=<path>` and where `kubectl`
//! and `helm` are, then stays in the foreground until SIGTERM or SIGINT: the operator is
//! scaled to zero, the relays get SIGTERM and their grace period (their Deployments scaled to
//! zero), then the node and the control plane stop.
//!
//! Every process it starts dies with it, even on `kill -9` (`PR_SET_PDEATHSIG`, and the node's
//! processes with the node's namespaces).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use outbox_tests::cluster::{OPERATOR_NAME, install_chart_cluster_wide};
use outbox_tests::control_plane::ControlPlane;
use outbox_tests::node::Node;
use outbox_tests::services::SERVICES_ADDRESS;
use outbox_tests::{helm, process};
use tokio::signal::unix::{SignalKind, signal};

/// Where the chart and the operator's ServiceAccount live, as in the README's install.
const RELEASE_NAMESPACE: &str = "outbox-relay-system";
/// The chart's operator pods (its selector).
const OPERATOR_PODS: &str = "app.kubernetes.io/name=outbox-relay-operator";
/// The relay pods of every OutboxRelay.
const RELAY_PODS: &str = "app.kubernetes.io/part-of=outbox-relay,app.kubernetes.io/component=relay";
/// Longest wait for pods to go at the stop (the relays' default grace period is 30 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

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
    node: Node,
    client: Client,
}

impl Cluster {
    /// The operator first, so it does not react to the relays going away; then the relays,
    /// each with SIGTERM and its grace period, as the kubelet stops pods.
    async fn stop_pods(&self) {
        let operator: Api<Deployment> = Api::namespaced(self.client.clone(), RELEASE_NAMESPACE);
        scale_to_zero(&operator, OPERATOR_NAME).await;
        wait_pods_gone(&self.client, OPERATOR_PODS).await;
        let deployments: Api<Deployment> = Api::all(self.client.clone());
        let relays = deployments
            .list(&ListParams::default().labels(RELAY_PODS))
            .await
            .map(|list| list.items)
            .unwrap_or_default();
        for relay in relays {
            let Some(namespace) = relay.namespace() else {
                continue;
            };
            let api = Api::namespaced(self.client.clone(), &namespace);
            scale_to_zero(&api, &relay.name_any()).await;
        }
        wait_pods_gone(&self.client, RELAY_PODS).await;
    }
}

async fn scale_to_zero(deployments: &Api<Deployment>, name: &str) {
    let scale = serde_json::json!({"spec": {"replicas": 0}});
    let _ = deployments
        .patch(name, &PatchParams::default(), &Patch::Merge(&scale))
        .await;
}

/// Waits (at most [`STOP_TIMEOUT`]) until no pod of any namespace matches `selector`.
async fn wait_pods_gone(client: &Client, selector: &str) {
    let pods: Api<Pod> = Api::all(client.clone());
    let started = Instant::now();
    while started.elapsed() < STOP_TIMEOUT {
        let listed = pods.list(&ListParams::default().labels(selector)).await;
        if listed.is_ok_and(|list| list.items.is_empty()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let dir = cli
        .dir
        .unwrap_or_else(|| outbox_tests::repo_root().join(".cache/cluster"));
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
    // The pods first (the operator, then the relays with their grace period), then the node,
    // the control plane last.
    cluster.stop_pods().await;
    drop(cluster.node);
    drop(cluster.plane);
    Ok(())
}

async fn start(files: &Files) -> anyhow::Result<Cluster> {
    let plane_dir = files.plane();
    eprintln!(
        "outbox-cluster: starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler in {}",
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
    let starting = plane.clone();
    let node = tokio::task::spawn_blocking(move || Node::start(&starting)).await??;
    eprintln!(
        "outbox-cluster: node {} Ready at {}: containerd, the kubelet and kube-proxy; pods reach this machine's servers on {SERVICES_ADDRESS}",
        node.name,
        node.link.node_address()
    );
    let client = plane.admin_client().await?;
    // The chart's own operator pod; helm's --wait sees it ready.
    let installing = plane.clone();
    tokio::task::spawn_blocking(move || {
        install_chart_cluster_wide(&installing, RELEASE_NAMESPACE, 1, &[])
    })
    .await?
    .context("helm install")?;
    eprintln!(
        "outbox-cluster: chart installed in {RELEASE_NAMESPACE}, watching every namespace; its operator pod is ready"
    );
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
        "logs: kubectl logs (operator and pods), {} (control plane), {} (node)",
        files.plane().display(),
        files.plane().join("node").display()
    )?;
    out.flush()?;
    Ok(Cluster {
        plane,
        node,
        client,
    })
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
