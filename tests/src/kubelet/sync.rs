//! The sync loop: make each Deployment's pods match its spec, record the counts, write the
//! Deployment's status.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Secret};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::env::{EnvSource, resolve_var};
use super::pod::{Pod, alive, refresh, restart, terminate};
use super::{KubeletConfig, PodCountSample, State};
use crate::process;

/// How often pods are checked even when no Deployment changed.
const SYNC_PERIOD: Duration = Duration::from_millis(200);

pub(super) struct Syncer {
    pub(super) client: Client,
    pub(super) deployments: Api<Deployment>,
    pub(super) store: Store<Deployment>,
    pub(super) state: Arc<Mutex<State>>,
    pub(super) config: KubeletConfig,
    pub(super) started: Instant,
    pub(super) changed: Arc<Notify>,
}

pub(super) async fn sync_loop(syncer: Syncer) {
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

fn deployment_key(deployment: &Deployment) -> String {
    format!(
        "{}/{}",
        deployment.namespace().unwrap_or_default(),
        deployment.name_any()
    )
}
