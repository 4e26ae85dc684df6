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

mod env;
mod pod;
mod sync;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

pub use pod::local_args;
use pod::{Pod, alive, terminate};
use sync::{Syncer, sync_loop};

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
