//! A node agent for the real control plane: what a kubelet does, as far as the operator's tests
//! need it, with each container run by runc from the project's image (a local process of the
//! binary the image path names is the fallback where runc cannot run, see [`PodRuntime`]).
//!
//! - It registers a Node (Ready) and binds the namespace's unscheduled Pods to it through the
//!   `pods/binding` subresource, as kube-scheduler would (there is one node per test namespace;
//!   `make cluster` runs one node for every namespace, [`NodeAgent::start_all_namespaces`]).
//! - It runs each Pod's first container: command and args as the pod spec says, env resolved
//!   from values, Secrets and fields, the security context (user, runAsNonRoot, read-only
//!   root, no privilege escalation, capabilities), volumes (Secret, ConfigMap, emptyDir and the
//!   projected ServiceAccount token, CA and namespace, with `KUBERNETES_SERVICE_HOST`/`PORT`,
//!   so a pod reaches the API server with in-cluster credentials). Every pod uses the image
//!   built from this build's binaries, whatever image its spec names.
//! - Pods share the host's network (no CNI here): each declared port is mapped to a free
//!   loopback port, and listen addresses on it in args and env are rewritten to match, so two
//!   pods of one Deployment never collide; probes use the mapped port.
//! - It runs the readiness probe (httpGet) and writes the Pod's status: phase, conditions,
//!   container status with restarts; a process that exits is restarted after `restart_delay`.
//! - When a Pod is deleted it sends SIGTERM, waits the grace period, SIGKILLs, and removes the
//!   Pod with a zero grace period, as a kubelet finishes a deletion.
//!
//! Deployments, ReplicaSets and garbage collection are the real controllers'. What is not
//! modelled: pulling images, init containers, more than one container, liveness probes,
//! resource limits.

mod container;
mod env;
mod status;
mod volumes;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

pub use container::PodRuntime;
use container::{Launch, PortMap, Process};
use status::ContainerState;

#[derive(Debug, Clone)]
pub struct NodeAgentConfig {
    /// Wait before restarting a container whose process exited (a fixed back-off).
    pub restart_delay: Duration,
    /// Longest wait between readiness probes (a pod's own period is used when shorter), so
    /// tests see readiness at test speed.
    pub max_probe_period: Duration,
    pub runtime: PodRuntime,
    /// The API server's URL, announced to containers as `KUBERNETES_SERVICE_HOST`/`PORT`.
    pub api_server: Option<String>,
}

impl Default for NodeAgentConfig {
    fn default() -> Self {
        Self {
            restart_delay: Duration::from_secs(1),
            max_probe_period: Duration::from_millis(500),
            runtime: PodRuntime::detect(),
            api_server: None,
        }
    }
}

/// Pod counts of one Deployment at one moment, recorded whenever they change.
#[derive(Debug, Clone, PartialEq)]
pub struct PodCountSample {
    /// Seconds since the agent started.
    pub at: f64,
    /// Name of the Deployment the pods belong to.
    pub deployment: String,
    /// Pods whose process is alive.
    pub running: usize,
    pub ready: usize,
}

#[derive(Default)]
struct Shared {
    /// Live pods per Deployment name, with whether each is ready.
    running: BTreeMap<String, Vec<(String, bool)>>,
    timeline: Vec<PodCountSample>,
    /// Pods the test asked to keep down (see [`NodeAgent::crash_pod`]).
    held_down: Vec<String>,
    /// Pods to SIGKILL on the next sync.
    kill: Vec<String>,
    /// The runc container of each pod (by name) started last, with the containers runtime.
    containers: BTreeMap<String, String>,
}

/// The running node agent; its processes are killed when it is dropped.
pub struct NodeAgent {
    pub node: String,
    client: Client,
    shared: Arc<Mutex<Shared>>,
    tasks: Vec<JoinHandle<()>>,
    stop: Arc<Notify>,
    started: Instant,
    origin: chrono::DateTime<chrono::Utc>,
}

impl NodeAgent {
    /// Registers node `agent-<namespace>` and starts running the namespace's pods.
    pub async fn start(
        client: Client,
        namespace: &str,
        config: NodeAgentConfig,
    ) -> anyhow::Result<Self> {
        let pods = Api::namespaced(client.clone(), namespace);
        Self::start_watching(client, pods, format!("agent-{namespace}"), config).await
    }

    /// Registers node `node` and starts running the pods of every namespace: the one node of
    /// a local cluster, where users create OutboxRelays wherever they like.
    pub async fn start_all_namespaces(
        client: Client,
        node: &str,
        config: NodeAgentConfig,
    ) -> anyhow::Result<Self> {
        Self::start_watching(client.clone(), Api::all(client), node.to_string(), config).await
    }

    /// Runs the pods `pods` lists (one namespace's or all).
    async fn start_watching(
        client: Client,
        pods: Api<Pod>,
        node: String,
        config: NodeAgentConfig,
    ) -> anyhow::Result<Self> {
        register_node(&client, &node).await?;
        let (store, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let watch = tokio::spawn(
            watcher(pods.clone(), watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .for_each(move |_| {
                    notify.notify_one();
                    futures::future::ready(())
                }),
        );
        store.wait_until_ready().await?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(Notify::new());
        let started = Instant::now();
        let agent = Agent {
            node: node.clone(),
            client: client.clone(),
            store,
            config,
            shared: shared.clone(),
            runs: BTreeMap::new(),
            changed,
            started,
        };
        let sync = tokio::spawn(agent.run(stop.clone()));
        Ok(Self {
            node,
            client,
            shared,
            tasks: vec![watch, sync],
            stop,
            started,
            origin: chrono::Utc::now(),
        })
    }

    /// Names of the pods of Deployment `deployment` whose process is alive.
    pub fn running_pods(&self, deployment: &str) -> Vec<String> {
        let shared = self.shared.lock().unwrap();
        shared
            .running
            .get(deployment)
            .map(|pods| pods.iter().map(|(name, _)| name.clone()).collect())
            .unwrap_or_default()
    }

    /// The runc container id of pod `pod`'s latest start (containers runtime only).
    pub fn container_of(&self, pod: &str) -> Option<String> {
        self.shared.lock().unwrap().containers.get(pod).cloned()
    }

    /// Pod-count changes so far, oldest first.
    pub fn timeline(&self) -> Vec<PodCountSample> {
        self.shared.lock().unwrap().timeline.clone()
    }

    /// Seconds since the agent started, the clock of [`Self::timeline`].
    pub fn clock(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The wall-clock time of the agent's start: zero on the clock of [`Self::timeline`].
    pub fn origin(&self) -> chrono::DateTime<chrono::Utc> {
        self.origin
    }

    /// SIGKILLs the pod's process and keeps it from restarting, like a container stuck in
    /// CrashLoopBackOff: the pod still exists, counts against the replicas, and is not ready.
    pub fn crash_pod(&self, pod: &str) {
        let mut shared = self.shared.lock().unwrap();
        shared.held_down.push(pod.to_string());
        shared.kill.push(pod.to_string());
    }

    /// Stops every process (SIGTERM, the pods' grace periods) and removes the Node.
    pub async fn shutdown(mut self) {
        self.stop.notify_one();
        if let Some(sync) = self.tasks.pop() {
            let _ = tokio::time::timeout(Duration::from_secs(60), sync).await;
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let _ = nodes.delete(&self.node, &DeleteParams::default()).await;
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        // The sync task owns the children (kill_on_drop): aborting it kills them.
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn register_node(client: &Client, node: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let object: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
    }))?;
    match nodes.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(error) => return Err(error.into()),
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let capacity = json!({"cpu": "2", "memory": "16Gi", "pods": "110"});
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": capacity,
                "allocatable": capacity,
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": node}],
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "the outbox-relay test node agent is running",
                    "lastHeartbeatTime": now, "lastTransitionTime": now,
                }],
                "nodeInfo": {
                    "kubeletVersion": "outbox-test-node-agent", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64",
                    "containerRuntimeVersion": "local-process://1", "osImage": "",
                    "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": "",
                },
            }})),
        )
        .await?;
    Ok(())
}

/// What the agent knows of one pod it runs.
struct PodRun {
    name: String,
    deployment: Option<String>,
    log: PathBuf,
    ports: PortMap,
    process: Option<Process>,
    /// Exit code and time of the last process, for `lastState`.
    last_exit: Option<(i32, chrono::DateTime<chrono::Utc>)>,
    exited_at: Option<Instant>,
    restarts: i32,
    ran: bool,
    ready: bool,
    ready_changed: chrono::DateTime<chrono::Utc>,
    last_probe: Option<Instant>,
    /// Why the container cannot start (`CreateContainerConfigError`), if it cannot.
    config_error: Option<String>,
    terminating: bool,
    start_time: chrono::DateTime<chrono::Utc>,
    written: Option<serde_json::Value>,
}

struct Agent {
    node: String,
    /// For the pods' and Secrets' APIs in each pod's own namespace.
    client: Client,
    store: Store<Pod>,
    config: NodeAgentConfig,
    shared: Arc<Mutex<Shared>>,
    /// By pod uid.
    runs: BTreeMap<String, PodRun>,
    changed: Arc<Notify>,
    started: Instant,
}

/// How often pods are looked at even when nothing changed.
const SYNC_PERIOD: Duration = Duration::from_millis(200);

impl Agent {
    async fn run(mut self, stop: Arc<Notify>) {
        let mut terminations: Vec<JoinHandle<()>> = Vec::new();
        loop {
            for pod in self.store.state() {
                if let Err(error) = self.sync_pod(&pod, &mut terminations).await {
                    tracing::warn!(pod = %pod.name_any(), %error, "node agent sync failed");
                }
            }
            self.forget_vanished_pods();
            self.publish();
            tokio::select! {
                _ = self.changed.notified() => {}
                _ = tokio::time::sleep(SYNC_PERIOD) => {}
                _ = stop.notified() => break,
            }
        }
        // Shutdown: every container gets SIGTERM and its grace period, as on node drain.
        for run in self.runs.values_mut() {
            if let Some(process) = run.process.take() {
                terminations.push(tokio::spawn(async move {
                    process.terminate(Duration::from_secs(20)).await;
                }));
            }
        }
        for task in terminations {
            let _ = task.await;
        }
    }

    async fn sync_pod(
        &mut self,
        pod: &Pod,
        terminations: &mut Vec<JoinHandle<()>>,
    ) -> anyhow::Result<()> {
        let spec = pod.spec.clone().unwrap_or_default();
        let name = pod.name_any();
        let Some(uid) = pod.uid() else {
            return Ok(());
        };
        let namespace = pod.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        match spec.node_name.as_deref() {
            None if pod.metadata.deletion_timestamp.is_none() => {
                return self.bind(&pods, &name).await;
            }
            Some(node) if node == self.node => {}
            _ => return Ok(()),
        }
        let container = spec
            .containers
            .first()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("pod {name} has no container"))?;
        if !self.runs.contains_key(&uid) {
            let run = PodRun {
                log: crate::process::log_path(&name),
                deployment: deployment_of(pod),
                name: name.clone(),
                ports: PortMap::allocate(&container)?,
                process: None,
                last_exit: None,
                exited_at: None,
                restarts: 0,
                ran: false,
                ready: false,
                ready_changed: chrono::Utc::now(),
                last_probe: None,
                config_error: None,
                terminating: false,
                start_time: chrono::Utc::now(),
                written: None,
            };
            self.runs.insert(uid.clone(), run);
        }

        if pod.metadata.deletion_timestamp.is_some() {
            let run = self.runs.get_mut(&uid).expect("inserted above");
            if !run.terminating {
                run.terminating = true;
                let grace = pod
                    .metadata
                    .deletion_grace_period_seconds
                    .or(spec.termination_grace_period_seconds)
                    .unwrap_or(30)
                    .max(0) as u64;
                let process = run.process.take();
                let pods = pods.clone();
                terminations.push(tokio::spawn(async move {
                    if let Some(process) = process {
                        process.terminate(Duration::from_secs(grace)).await;
                    }
                    // The kubelet's last word on a deleted pod: remove it for good.
                    let params = DeleteParams {
                        grace_period_seconds: Some(0),
                        preconditions: Some(Preconditions {
                            uid: Some(uid),
                            resource_version: None,
                        }),
                        ..DeleteParams::default()
                    };
                    let _ = pods.delete(&name, &params).await;
                }));
            }
            return Ok(());
        }

        let kill_now = {
            let mut shared = self.shared.lock().unwrap();
            let kill = shared.kill.contains(&name);
            shared.kill.retain(|n| n != &name);
            (kill, shared.held_down.contains(&name))
        };
        let (kill, held_down) = kill_now;
        let run = self.runs.get_mut(&uid).expect("inserted above");
        if kill && let Some(process) = run.process.as_mut() {
            process.kill();
        }
        // A process that exited: note it, restart it after the delay (restartPolicy Always).
        if let Some(process) = run.process.as_mut()
            && let Some(code) = process.try_exit()?
        {
            run.last_exit = Some((code, chrono::Utc::now()));
            run.exited_at = Some(Instant::now());
            run.process = None;
        }
        let start_due = match run.exited_at {
            _ if !run.ran => true,
            Some(at) => at.elapsed() >= self.config.restart_delay,
            None => false,
        };
        if run.process.is_none() && start_due && !held_down {
            match env::resolve(
                container.env.as_deref().unwrap_or_default(),
                pod,
                &Api::namespaced(self.client.clone(), &namespace),
            )
            .await
            {
                Ok(mut env) => {
                    run.config_error = None;
                    let runtime = self.config.runtime;
                    let mounts = match runtime {
                        PodRuntime::Containers => {
                            env.extend(service_env(self.config.api_server.as_deref()));
                            let dir = volumes_dir(&uid);
                            volumes::materialize(&self.client, pod, &container, &dir).await
                        }
                        PodRuntime::Processes => Ok(Vec::new()),
                    };
                    let id = crate::unique(&name);
                    let started = mounts.and_then(|mounts| {
                        let launch = Launch {
                            env: &env,
                            ports: &run.ports,
                            log: &run.log,
                            pod_security: spec.security_context.as_ref(),
                            mounts,
                            id: id.clone(),
                        };
                        container::start(runtime, &container, &launch)
                    });
                    match started {
                        Ok(process) => {
                            if runtime == PodRuntime::Containers {
                                let mut shared = self.shared.lock().unwrap();
                                shared.containers.insert(name.clone(), id);
                            }
                            if run.ran {
                                run.restarts += 1;
                            }
                            run.ran = true;
                            run.exited_at = None;
                            run.last_probe = None;
                            run.process = Some(process);
                        }
                        Err(error) => {
                            run.config_error = Some(format!("cannot start: {error:#}"));
                        }
                    }
                }
                Err(error) => run.config_error = Some(error.to_string()),
            }
        }

        let ready = match &run.process {
            None => false,
            Some(_) => {
                let period = container
                    .readiness_probe
                    .as_ref()
                    .and_then(|p| p.period_seconds)
                    .map(|s| Duration::from_secs(s.max(1) as u64))
                    .unwrap_or(self.config.max_probe_period)
                    .min(self.config.max_probe_period);
                if run.last_probe.is_none_or(|at| at.elapsed() >= period) {
                    run.last_probe = Some(Instant::now());
                    container::probe(container.readiness_probe.as_ref(), &run.ports).await
                } else {
                    run.ready
                }
            }
        };
        if ready != run.ready {
            run.ready = ready;
            run.ready_changed = chrono::Utc::now();
        }

        let state = match (&run.process, &run.config_error) {
            (Some(process), _) => ContainerState::Running(process.started_at),
            (None, Some(error)) => {
                ContainerState::Waiting("CreateContainerConfigError", error.clone())
            }
            (None, None) if run.ran => ContainerState::Waiting(
                "CrashLoopBackOff",
                format!("back-off restarting failed container {}", container.name),
            ),
            (None, None) => ContainerState::Waiting("ContainerCreating", String::new()),
        };
        let status = status::pod_status(&status::PodFacts {
            container: &container.name,
            image: container.image.as_deref().unwrap_or_default(),
            state,
            last_exit: run.last_exit,
            restarts: run.restarts,
            ready: run.ready,
            ready_changed: run.ready_changed,
            start_time: run.start_time,
        });
        if run.written.as_ref() != Some(&status) {
            pods.patch_status(
                &run.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
            run.written = Some(status);
        }
        Ok(())
    }

    async fn bind(&self, pods: &Api<Pod>, pod: &str) -> anyhow::Result<()> {
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        });
        pods.create_subresource::<_, serde_json::Value>(
            "binding",
            pod,
            &PostParams::default(),
            &binding,
        )
        .await?;
        Ok(())
    }

    /// Pods gone from the API (deleted with no grace, or garbage-collected): their processes
    /// are killed (dropping the child kills it).
    fn forget_vanished_pods(&mut self) {
        let live: Vec<String> = self.store.state().iter().filter_map(|p| p.uid()).collect();
        self.runs.retain(|uid, _| {
            let keep = live.contains(uid);
            if !keep {
                let _ = std::fs::remove_dir_all(volumes_dir(uid));
            }
            keep
        });
    }

    /// Publishes the live pods per Deployment and records changed counts.
    fn publish(&mut self) {
        let mut running: BTreeMap<String, Vec<(String, bool)>> = BTreeMap::new();
        for run in self.runs.values() {
            if let (Some(deployment), Some(_)) = (&run.deployment, &run.process) {
                running
                    .entry(deployment.clone())
                    .or_default()
                    .push((run.name.clone(), run.ready));
            }
        }
        let at = self.started.elapsed().as_secs_f64();
        let mut shared = self.shared.lock().unwrap();
        let mut deployments: Vec<String> = running.keys().cloned().collect();
        deployments.extend(shared.running.keys().cloned());
        deployments.sort();
        deployments.dedup();
        for deployment in deployments {
            let pods = running.get(&deployment).cloned().unwrap_or_default();
            let count = (pods.len(), pods.iter().filter(|p| p.1).count());
            let last = shared
                .timeline
                .iter()
                .rev()
                .find(|s| s.deployment == deployment)
                .map(|s| (s.running, s.ready));
            if last != Some(count) && !(last.is_none() && count == (0, 0)) {
                shared.timeline.push(PodCountSample {
                    at,
                    deployment: deployment.clone(),
                    running: count.0,
                    ready: count.1,
                });
            }
        }
        shared.running = running;
    }
}

/// Where a pod's volumes are written.
fn volumes_dir(pod_uid: &str) -> PathBuf {
    crate::process::target_dir()
        .join("pod-volumes")
        .join(pod_uid)
}

/// What a kubelet tells every container about the `kubernetes` Service; here the API server's
/// own loopback address, since pods share the host's network.
fn service_env(api_server: Option<&str>) -> Vec<(String, String)> {
    let Some(host_port) = api_server.and_then(|url| url.strip_prefix("https://")) else {
        return Vec::new();
    };
    let Some((host, port)) = host_port.trim_end_matches('/').rsplit_once(':') else {
        return Vec::new();
    };
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), host.into()),
        ("KUBERNETES_SERVICE_PORT".into(), port.into()),
    ]
}

/// The Deployment a ReplicaSet's pod belongs to: the ReplicaSet's name less its
/// `-<pod-template-hash>` suffix.
fn deployment_of(pod: &Pod) -> Option<String> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.kind == "ReplicaSet")?;
    let hash = pod.labels().get("pod-template-hash")?;
    owner
        .name
        .strip_suffix(&format!("-{hash}"))
        .map(str::to_string)
}
