//! What the kubelet reports about a namespace's relay pods, as the API server has it: which
//! pods run and are ready, per relay, and every change of those counts while a test runs (the
//! autoscaling tests draw and check them against the replicas the operator asked for).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::task::JoinHandle;

/// The label the operator puts on every pod of an OutboxRelay: its name.
pub const RELAY_LABEL: &str = "app.kubernetes.io/instance";

/// Pod counts of one relay at one moment, recorded whenever they change.
#[derive(Debug, Clone, PartialEq)]
pub struct PodCountSample {
    /// Seconds since the watch's origin.
    pub at: f64,
    /// The OutboxRelay (and Deployment) the pods belong to.
    pub relay: String,
    /// Pods whose container the kubelet reports running (terminating ones included, until
    /// their process is gone).
    pub running: usize,
    /// Pods whose Ready condition is True.
    pub ready: usize,
}

/// A watch on the pods of one namespace.
pub struct PodWatch {
    store: Store<Pod>,
    timeline: Arc<Mutex<Vec<PodCountSample>>>,
    task: JoinHandle<()>,
}

impl PodWatch {
    /// Starts watching `pods`; times in the timeline are seconds since `origin`.
    pub fn start(pods: Api<Pod>, origin: DateTime<Utc>) -> Self {
        let (store, writer) = reflector::store();
        let timeline = Arc::new(Mutex::new(Vec::new()));
        let sink = timeline.clone();
        let reader = store.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(pods, watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .applied_objects();
            let mut stream = std::pin::pin!(stream);
            let mut last: BTreeMap<String, (usize, usize)> = BTreeMap::new();
            while let Some(event) = stream.next().await {
                if event.is_err() {
                    continue;
                }
                let now = (Utc::now() - origin).as_seconds_f64();
                let counts = counts_by_relay(&reader.state());
                let mut samples = sink.lock().unwrap();
                let relays: BTreeSet<&String> = counts.keys().chain(last.keys()).collect();
                for relay in relays {
                    let (running, ready) = counts.get(relay).copied().unwrap_or_default();
                    if last.get(relay).copied().unwrap_or_default() != (running, ready) {
                        samples.push(PodCountSample {
                            at: now,
                            relay: relay.clone(),
                            running,
                            ready,
                        });
                    }
                }
                drop(samples);
                last = counts;
            }
        });
        Self {
            store,
            timeline,
            task,
        }
    }

    /// Names of the relay's pods whose container runs.
    pub fn running(&self, relay: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .store
            .state()
            .iter()
            .filter(|pod| relay_of(pod) == Some(relay) && container_running(pod))
            .map(|pod| pod.name_any())
            .collect();
        names.sort();
        names
    }

    /// The pod `name` as last seen.
    pub fn get(&self, name: &str) -> Option<Arc<Pod>> {
        self.store
            .state()
            .into_iter()
            .find(|pod| pod.name_any() == name)
    }

    /// Pod-count changes so far, oldest first.
    pub fn timeline(&self) -> Vec<PodCountSample> {
        self.timeline.lock().unwrap().clone()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The CRI id of the pod's first container, `containerd://…`, once it has started.
pub fn container_id(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .container_id
        .clone()
}

fn relay_of(pod: &Pod) -> Option<&str> {
    pod.labels().get(RELAY_LABEL).map(String::as_str)
}

fn container_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|statuses| {
            statuses
                .iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// (running, ready) per relay.
fn counts_by_relay(pods: &[Arc<Pod>]) -> BTreeMap<String, (usize, usize)> {
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for pod in pods {
        let Some(relay) = relay_of(pod) else { continue };
        let entry = counts.entry(relay.to_string()).or_default();
        if container_running(pod) {
            entry.0 += 1;
        }
        if pod_ready(pod) {
            entry.1 += 1;
        }
    }
    counts
}
