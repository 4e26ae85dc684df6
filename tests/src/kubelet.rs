//! A small kubelet (with the ReplicaSet controller folded in) for the in-memory API server: it
//! watches Deployments and keeps `spec.replicas` real `outbox-relay` processes running for each,
//! built from the pod template's container command, args and env, and writes the Deployment's
//! status the way the real controllers do, through the status subresource.
//!
//! What it models, because the autoscaling tests depend on it:
//! - scale down sends SIGTERM (the relay finishes its batch and exits 0), to pods whose process
//!   is down first, then not-ready ones, then the newest, as the ReplicaSet controller picks;
//! - a pod is ready once the relay logged that it is relaying (its readiness endpoint is on an
//!   ephemeral port here, so the log line stands in for the probe);
//! - a process that exits stays a (not ready) pod and is restarted under the same name after
//!   `restart_delay`, as a container restart is; a long delay models CrashLoopBackOff;
//! - a template change replaces every pod (a crude Recreate rollout).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, EnvVar, Secret};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::process::{Child, Command};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::process;

/// The log line after which a relay counts as ready.
const READY_LOG_LINE: &str = "relaying";
/// How often pods are checked even when no Deployment changed.
const SYNC_PERIOD: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// Wait before restarting a process that exited.
    pub restart_delay: Duration,
    /// SIGKILL after this long when the pod spec names no grace period.
    pub default_grace: Duration,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            restart_delay: Duration::from_secs(1),
            default_grace: Duration::from_secs(30),
        }
    }
}

/// Pod counts of one Deployment at one moment, recorded whenever they change.
#[derive(Debug, Clone, PartialEq)]
pub struct PodCountSample {
    /// Seconds since the kubelet started.
    pub at: f64,
    /// `namespace/name` of the Deployment.
    pub deployment: String,
    pub spec_replicas: i32,
    /// Pods whose process is alive.
    pub running: usize,
    pub ready: usize,
}

struct Pod {
    name: String,
    template_hash: String,
    child: Option<Child>,
    log: PathBuf,
    /// Length of the log when the current process started; readiness looks after it.
    log_offset: u64,
    ready: bool,
    exited_at: Option<Instant>,
    started_at: Instant,
    /// False until a process first started: a pod that never ran starts without delay.
    ran: bool,
}

impl Pod {
    fn start_due(&self, restart_delay: Duration) -> bool {
        match self.exited_at {
            Some(_) if !self.ran => true,
            Some(at) => at.elapsed() >= restart_delay,
            None => false,
        }
    }
}

#[derive(Default)]
struct State {
    /// Pods per Deployment key (`namespace/name`).
    pods: BTreeMap<String, Vec<Pod>>,
    /// Processes sent SIGTERM, awaited in the background; kept to kill them at shutdown.
    terminating: Vec<JoinHandle<()>>,
    /// Last status written per Deployment, so unchanged status is not rewritten.
    written_status: BTreeMap<String, serde_json::Value>,
    timeline: Vec<PodCountSample>,
    /// Pods the test asked to keep down (see [`Kubelet::crash_pod`]).
    held_down: Vec<String>,
}

/// The running kubelet; processes are killed when it is dropped.
pub struct Kubelet {
    state: Arc<Mutex<State>>,
    tasks: Vec<JoinHandle<()>>,
    started: Instant,
    /// Wall-clock time of `started`, to put database timestamps on the same clock.
    origin: chrono::DateTime<chrono::Utc>,
}

impl Kubelet {
    /// Starts watching Deployments in `namespace` through `client`.
    pub async fn start(client: Client, namespace: &str, config: KubeletConfig) -> Self {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let (store, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let watch = tokio::spawn(
            watcher(deployments.clone(), watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .for_each(move |_| {
                    notify.notify_one();
                    futures::future::ready(())
                }),
        );
        store
            .wait_until_ready()
            .await
            .expect("the Deployment watch starts");
        let state = Arc::new(Mutex::new(State::default()));
        let started = Instant::now();
        let origin = chrono::Utc::now();
        let sync = tokio::spawn(sync_loop(Syncer {
            client,
            deployments,
            store,
            state: state.clone(),
            config,
            started,
            changed,
        }));
        Self {
            state,
            tasks: vec![watch, sync],
            started,
            origin,
        }
    }

    /// Pod-count changes so far, oldest first.
    pub fn timeline(&self) -> Vec<PodCountSample> {
        self.state.lock().unwrap().timeline.clone()
    }

    /// Seconds since the kubelet started, the clock of [`Self::timeline`].
    pub fn clock(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The wall-clock time of the kubelet's start: zero on the clock of [`Self::timeline`].
    pub fn origin(&self) -> chrono::DateTime<chrono::Utc> {
        self.origin
    }

    /// Names of the pods of Deployment `namespace/name` whose process is alive.
    pub fn running_pods(&self, deployment: &str) -> Vec<String> {
        let mut state = self.state.lock().unwrap();
        state
            .pods
            .get_mut(deployment)
            .map(|pods| {
                pods.iter_mut()
                    .filter_map(|pod| alive(pod).then(|| pod.name.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// SIGKILLs the pod's process and keeps it from restarting, like a container stuck in
    /// CrashLoopBackOff: the pod still exists, counts against the replicas, and is not ready.
    pub fn crash_pod(&self, pod_name: &str) -> bool {
        let mut state = self.state.lock().unwrap();
        state.held_down.push(pod_name.to_string());
        let pod = state
            .pods
            .values_mut()
            .flatten()
            .find(|pod| pod.name == pod_name);
        match pod.and_then(|pod| pod.child.as_mut()) {
            Some(child) => child.start_kill().is_ok(),
            None => false,
        }
    }

    /// Stops syncing and terminates every process (SIGTERM, then SIGKILL after `grace`).
    pub async fn shutdown(mut self, grace: Duration) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let (pods, terminating) = {
            let mut state = self.state.lock().unwrap();
            let pods: Vec<Pod> = std::mem::take(&mut state.pods)
                .into_values()
                .flatten()
                .collect();
            (pods, std::mem::take(&mut state.terminating))
        };
        let stops = pods
            .into_iter()
            .filter_map(|pod| pod.child)
            .map(|child| terminate(child, grace));
        futures::future::join_all(stops).await;
        for task in terminating {
            let _ = task.await;
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        // Children are spawned with kill_on_drop, so dropping the state kills them.
        if let Ok(mut state) = self.state.lock() {
            state.pods.clear();
            for task in &state.terminating {
                task.abort();
            }
        }
    }
}

struct Syncer {
    client: Client,
    deployments: Api<Deployment>,
    store: Store<Deployment>,
    state: Arc<Mutex<State>>,
    config: KubeletConfig,
    started: Instant,
    changed: Arc<Notify>,
}

async fn sync_loop(syncer: Syncer) {
    loop {
        for deployment in syncer.store.state() {
            if let Err(error) = syncer.sync_deployment(&deployment).await {
                tracing::warn!(deployment = %deployment.name_any(), %error, "kubelet sync failed");
            }
        }
        syncer.stop_pods_of_deleted_deployments();
        tokio::select! {
            _ = syncer.changed.notified() => {}
            _ = tokio::time::sleep(SYNC_PERIOD) => {}
        }
    }
}

impl Syncer {
    async fn sync_deployment(&self, deployment: &Deployment) -> anyhow::Result<()> {
        let key = deployment_key(deployment);
        let desired = deployment.spec.replicas.unwrap_or(1).max(0);
        let template = deployment.spec.template.clone();
        let template_hash = serde_json::to_string(&template)?;
        let pod_spec = template.spec.clone().unwrap_or_default();
        let container = pod_spec
            .containers
            .first()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("the pod template has no container"))?;
        let grace = pod_spec
            .termination_grace_period_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(self.config.default_grace);

        // Secrets are read first, and only when a process is to start: the state lock is never
        // held across an await.
        let env = if self.must_start_a_process(&key, desired, &template_hash) {
            self.resolve_env(&container, deployment).await
        } else {
            None
        };
        let plan = PodPlan {
            key: key.clone(),
            name: deployment.name_any(),
            desired,
            template_hash,
            container,
            grace,
            generation: deployment.metadata.generation,
        };
        let Some(status) = self.sync_pods(&plan, env.as_deref()) else {
            return Ok(());
        };
        let written = self
            .deployments
            .patch_status(
                &plan.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await;
        if written.is_err() {
            // Forget it, so the next sync writes it again.
            self.state.lock().unwrap().written_status.remove(&plan.key);
        }
        written?;
        Ok(())
    }

    /// Makes the pods match `plan`, records the counts, and returns the Deployment status to
    /// write when it differs from the last one written.
    fn sync_pods(&self, plan: &PodPlan, env: Option<&[EnvSource]>) -> Option<serde_json::Value> {
        let mut guard = self.state.lock().unwrap();
        let state = &mut *guard;
        let pods = state.pods.entry(plan.key.clone()).or_default();

        // Outdated pods go first; the fill-up below starts their replacements.
        let (current, outdated): (Vec<Pod>, Vec<Pod>) = std::mem::take(pods)
            .into_iter()
            .partition(|pod| pod.template_hash == plan.template_hash);
        *pods = current;
        state.terminating.extend(
            outdated
                .into_iter()
                .filter_map(|pod| pod.child)
                .map(|child| tokio::spawn(terminate(child, plan.grace))),
        );

        for pod in pods.iter_mut() {
            refresh(pod);
            let held = state.held_down.contains(&pod.name);
            let restart_due = pod.start_due(self.config.restart_delay);
            if let (true, false, Some(env)) = (restart_due, held, env) {
                restart(pod, &plan.container, env);
            }
        }

        let desired = plan.desired as usize;
        while pods.len() < desired {
            let name = format!(
                "{}-{}",
                plan.name,
                &uuid::Uuid::new_v4().simple().to_string()[..5]
            );
            let mut pod = Pod {
                log: process::log_path(&name),
                name,
                template_hash: plan.template_hash.clone(),
                child: None,
                log_offset: 0,
                ready: false,
                exited_at: Some(Instant::now()),
                started_at: Instant::now(),
                ran: false,
            };
            if let Some(env) = env {
                restart(&mut pod, &plan.container, env);
            }
            pods.push(pod);
        }

        if pods.len() > desired {
            // Like the ReplicaSet controller: pods whose container is down go first, then
            // not-ready ones, then the newest. (`child` is current: refreshed above.)
            pods.sort_by_key(|pod| {
                (
                    pod.child.is_some(),
                    pod.ready,
                    std::cmp::Reverse(pod.started_at),
                )
            });
            let excess = pods.len() - desired;
            state.terminating.extend(
                pods.drain(..excess)
                    .filter_map(|pod| pod.child)
                    .map(|child| tokio::spawn(terminate(child, plan.grace))),
            );
            pods.sort_by_key(|pod| pod.started_at);
        }

        let running = pods.iter_mut().map(alive).filter(|alive| *alive).count();
        let ready = pods.iter().filter(|pod| pod.ready).count();
        let replicas = pods.len();
        let changed = state
            .timeline
            .iter()
            .rev()
            .find(|s| s.deployment == plan.key)
            .is_none_or(|last| {
                (last.spec_replicas, last.running, last.ready) != (plan.desired, running, ready)
            });
        if changed {
            state.timeline.push(PodCountSample {
                at: self.started.elapsed().as_secs_f64(),
                deployment: plan.key.clone(),
                spec_replicas: plan.desired,
                running,
                ready,
            });
        }

        let status = json!({
            "observedGeneration": plan.generation,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": replicas - ready,
        });
        if state.written_status.get(&plan.key) == Some(&status) {
            return None;
        }
        state
            .written_status
            .insert(plan.key.clone(), status.clone());
        Some(status)
    }

    /// Whether the Deployment `key` lacks pods, or has one whose restart is due.
    fn must_start_a_process(&self, key: &str, desired: i32, template_hash: &str) -> bool {
        let mut state = self.state.lock().unwrap();
        let State {
            pods, held_down, ..
        } = &mut *state;
        let Some(pods) = pods.get_mut(key) else {
            return desired > 0;
        };
        let current = pods
            .iter()
            .filter(|pod| pod.template_hash == template_hash)
            .count();
        current < desired as usize
            || pods.iter_mut().any(|pod| {
                refresh(pod);
                !held_down.contains(&pod.name) && pod.start_due(self.config.restart_delay)
            })
    }

    /// The container's environment with Secret references resolved; `None` while a Secret
    /// or key is missing (the pod then waits, as CreateContainerConfigError does).
    async fn resolve_env(
        &self,
        container: &Container,
        deployment: &Deployment,
    ) -> Option<Vec<EnvSource>> {
        let namespace = deployment.namespace().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let mut env = Vec::new();
        for var in container.env.iter().flatten() {
            env.push(match resolve_var(var, &secrets).await {
                Ok(source) => source,
                Err(error) => {
                    tracing::warn!(var = %var.name, %error, "kubelet cannot set env");
                    return None;
                }
            });
        }
        Some(env)
    }

    fn stop_pods_of_deleted_deployments(&self) {
        let live: Vec<String> = self
            .store
            .state()
            .iter()
            .map(|d| deployment_key(d))
            .collect();
        let mut state = self.state.lock().unwrap();
        let gone: Vec<String> = state
            .pods
            .keys()
            .filter(|key| !live.contains(key))
            .cloned()
            .collect();
        for key in gone {
            let pods = state.pods.remove(&key).unwrap_or_default();
            let grace = self.config.default_grace;
            let stops: Vec<JoinHandle<()>> = pods
                .into_iter()
                .filter_map(|pod| pod.child)
                .map(|child| tokio::spawn(terminate(child, grace)))
                .collect();
            state.terminating.extend(stops);
        }
    }
}

/// What one Deployment asks of the kubelet right now.
struct PodPlan {
    key: String,
    name: String,
    desired: i32,
    template_hash: String,
    container: Container,
    grace: Duration,
    generation: Option<i64>,
}

/// An environment variable as the kubelet hands it to the process.
#[derive(Debug, Clone)]
enum EnvSource {
    Value(String, String),
    /// `fieldRef: metadata.name`: the pod's own name.
    PodName(String),
}

async fn resolve_var(var: &EnvVar, secrets: &Api<Secret>) -> anyhow::Result<EnvSource> {
    if let Some(value) = &var.value {
        return Ok(EnvSource::Value(var.name.clone(), value.clone()));
    }
    let Some(from) = &var.value_from else {
        return Ok(EnvSource::Value(var.name.clone(), String::new()));
    };
    if let Some(secret_ref) = &from.secret_key_ref {
        let secret = secrets.get(&secret_ref.name).await?;
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&secret_ref.key))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(&secret_ref.key))
                    .map(|s| s.clone().into_bytes())
            })
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "key {} missing in Secret {}",
                    secret_ref.key,
                    secret_ref.name
                )
            })?;
        return Ok(EnvSource::Value(
            var.name.clone(),
            String::from_utf8(bytes)?,
        ));
    }
    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
        Some("metadata.name") => Ok(EnvSource::PodName(var.name.clone())),
        other => anyhow::bail!("unsupported env source {other:?} for {}", var.name),
    }
}

/// Starts (or restarts) the pod's process.
fn restart(pod: &mut Pod, container: &Container, env: &[EnvSource]) {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&pod.log)
        .expect("open the pod log");
    pod.log_offset = log_file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut command = Command::new(program(container));
    command
        .args(local_args(container.args.as_deref().unwrap_or_default()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true);
    for source in env {
        match source {
            EnvSource::Value(name, value) => command.env(name, value),
            EnvSource::PodName(name) => command.env(name, &pod.name),
        };
    }
    match command.spawn() {
        Ok(child) => {
            pod.child = Some(child);
            pod.exited_at = None;
            pod.ready = false;
            pod.ran = true;
        }
        Err(error) => {
            tracing::warn!(pod = %pod.name, %error, "kubelet could not start the process");
            pod.exited_at = Some(Instant::now());
        }
    }
}

/// The image's relay binary is the one built next to the tests.
fn program(container: &Container) -> PathBuf {
    let command = container
        .command
        .as_ref()
        .and_then(|c| c.first())
        .map(String::as_str)
        .unwrap_or("outbox-relay");
    let name = command.rsplit('/').next().unwrap_or(command);
    process::binary(name)
}

/// The container args, with the metrics server on an ephemeral local port so that several
/// relays share one machine.
pub fn local_args(args: &[String]) -> Vec<String> {
    let mut local = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--metrics-addr" {
            iter.next();
            local.extend(["--metrics-addr".to_string(), "127.0.0.1:0".to_string()]);
        } else if arg.starts_with("--metrics-addr=") {
            local.push("--metrics-addr=127.0.0.1:0".to_string());
        } else {
            local.push(arg.clone());
        }
    }
    local
}

/// Notices an exited process and a process that became ready.
fn refresh(pod: &mut Pod) {
    if !alive(pod) {
        pod.ready = false;
        if pod.exited_at.is_none() {
            pod.exited_at = Some(Instant::now());
        }
        return;
    }
    if !pod.ready {
        pod.ready = std::fs::read(&pod.log).is_ok_and(|text| {
            let start = (pod.log_offset as usize).min(text.len());
            String::from_utf8_lossy(&text[start..]).contains(READY_LOG_LINE)
        });
    }
}

fn alive(pod: &mut Pod) -> bool {
    match pod.child.as_mut() {
        Some(child) => match child.try_wait() {
            Ok(None) => true,
            Ok(Some(_)) | Err(_) => {
                pod.child = None;
                false
            }
        },
        None => false,
    }
}

/// SIGTERM, then SIGKILL if the process outlives `grace`.
async fn terminate(mut child: Child, grace: Duration) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

fn deployment_key(deployment: &Deployment) -> String {
    format!(
        "{}/{}",
        deployment.namespace().unwrap_or_default(),
        deployment.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_address_moves_to_an_ephemeral_local_port() {
        let args: Vec<String> = ["run", "--metrics-addr", "0.0.0.0:9090", "--table", "t"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            local_args(&args),
            ["run", "--metrics-addr", "127.0.0.1:0", "--table", "t"]
        );
    }
}
