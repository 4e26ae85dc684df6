//! A namespace of its own on the real control plane (enforcing the restricted Pod Security
//! profile), set up as a user would: the operator chart
//! `helm install`ed into it (namespaced mode, watching that namespace) with its operator
//! Deployment running as shipped, on the real node (kubelet, containerd, the project's image;
//! shared by the test binary's namespaces) with the chart's ServiceAccount (so the chart's RBAC
//! decides every request it makes) and in-cluster credentials; the relay pods on the same node;
//! and the connection Secrets pointing at the local PostgreSQL and RabbitMQ on the address pods
//! reach them at. Only the operator's timings are a test's (retries and resyncs short, text
//! logs), through the chart's `extraArgs` and `logFormat`.
//!
//! [`OperatorProcess`] runs the operator as a process instead, for the tests that start and
//! kill operators themselves (leader election, the chart's install modes).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use outbox_operator::{OutboxRelay, OutboxRelaySpec};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::control_plane::spawn::die_with_parent_tokio;
use crate::control_plane::{ControlPlane, client_from_kubeconfig, free_port};
use crate::history::History;
use crate::node::Node;
use crate::pods::{PodCountSample, PodWatch, container_id};
use crate::services::url_for_pods;
use crate::{helm, process, unique};

/// Secrets holding the connection URLs, as a user would create them.
pub const DATABASE_SECRET: &str = "outbox-db";
pub const BROKER_SECRET: &str = "outbox-amqp";
/// The chart's objects are named this (`fullnameOverride`), so its ServiceAccount is too.
pub const OPERATOR_NAME: &str = "outbox-operator";

pub struct TestCluster {
    pub plane: &'static ControlPlane,
    pub namespace: String,
    /// The admin's client, for what the test itself does.
    pub client: Client,
    pub node: &'static Node,
    /// The namespace's pods as the kubelet reports them.
    pub pods: PodWatch,
    pub operator: OperatorPod,
    histories: std::sync::Mutex<BTreeMap<String, History>>,
    /// Zero on the clock of [`Self::versions_of`], [`Self::clock`] and the pod timeline.
    origin: chrono::DateTime<chrono::Utc>,
    started: Instant,
}

impl TestCluster {
    /// A fresh namespace with the chart installed and its operator pod ready, the Secrets and
    /// a watch on its pods, on the shared node.
    pub async fn start() -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let plane = ControlPlane::shared();
        let node = tokio::task::spawn_blocking(Node::shared)
            .await
            .expect("the node starts");
        let namespace = unique("e2e").replace('_', "-");
        // The API server itself refuses any pod of the chart or the operator that breaks the
        // restricted profile.
        plane
            .create_restricted_namespace(&namespace)
            .expect("create the namespace, restricted");
        let client = plane.admin_client().await.expect("an admin client");
        create_connection_secrets(&client, &namespace).await;
        let operator = OperatorPod::install(plane, &namespace)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let origin = chrono::Utc::now();
        let started = Instant::now();
        let pods = PodWatch::start(Api::namespaced(client.clone(), &namespace), origin);
        Self {
            plane,
            namespace,
            client,
            node,
            pods,
            operator,
            histories: Default::default(),
            origin,
            started,
        }
    }

    pub fn relays(&self) -> Api<OutboxRelay> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates the OutboxRelay and starts recording every version of it and of its
    /// Deployment.
    pub async fn create_relay(&self, name: &str, spec: OutboxRelaySpec) -> OutboxRelay {
        self.record(name);
        self.relays()
            .create(&PostParams::default(), &OutboxRelay::new(name, spec))
            .await
            .expect("the OutboxRelay is created")
    }

    /// Records every version of the relay and the Deployment called `name` from now on.
    pub fn record(&self, name: &str) {
        let mut histories = self.histories.lock().unwrap();
        histories
            .entry(format!("outboxrelays/{name}"))
            .or_insert_with(|| History::record(self.relays(), name));
        histories
            .entry(format!("deployments/{name}"))
            .or_insert_with(|| History::record(self.deployments(), name));
    }

    /// Seconds since the cluster started: the clock of [`Self::versions_of`] and the pods'
    /// timeline.
    pub fn clock(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The wall-clock time of the cluster's start: zero on [`Self::clock`].
    pub fn origin(&self) -> chrono::DateTime<chrono::Utc> {
        self.origin
    }

    /// Names of the relay's pods whose container runs.
    pub fn running_pods(&self, relay: &str) -> Vec<String> {
        self.pods.running(relay)
    }

    /// Pod-count changes of the namespace's relays so far, oldest first.
    pub fn pod_timeline(&self) -> Vec<PodCountSample> {
        self.pods.timeline()
    }

    /// Freezes the pod's relay process (SIGSTOP through the container runtime), as a relay
    /// that hangs looks: alive, silent, its probes failing until the kubelet restarts it.
    pub async fn freeze_pod(&self, pod: &str) {
        self.signal_pod(pod, "SIGSTOP").await;
    }

    /// Sends `signal` to the pod's relay process through the container runtime: `SIGKILL` is
    /// a crash the kubelet restarts the container after.
    ///
    /// The container the pod's status names may have just exited (a restart the status does not
    /// show yet, seen once on a loaded machine: containerd answered "task … not found"): the pod
    /// is read again and its container signalled for up to 10 s.
    pub async fn signal_pod(&self, pod: &str, signal: &'static str) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pod_object = pods.get(pod).await.expect("the pod exists");
            let container = container_id(&pod_object).expect("the pod's container has started");
            let node = self.node;
            let sent =
                tokio::task::spawn_blocking(move || node.signal_container(&container, signal))
                    .await
                    .expect("the signal task");
            match sent {
                Ok(()) => return,
                Err(error)
                    if format!("{error:#}").contains("not found") && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => panic!("{error:#}"),
            }
        }
    }

    /// Every version the API server stored of `kind/name` since [`Self::record`], with the
    /// second of [`Self::clock`] it arrived.
    pub fn versions_of(&self, kind: &str, name: &str) -> Vec<(f64, serde_json::Value)> {
        let origin = self.origin;
        let histories = self.histories.lock().unwrap();
        histories
            .get(&format!("{kind}/{name}"))
            .map(|h| h.versions())
            .unwrap_or_default()
            .into_iter()
            .map(|(at, value)| ((at - origin).as_seconds_f64(), value))
            .collect()
    }

    /// The relay's Deployment replicas, `None` before the operator created it.
    pub async fn deployment_replicas(&self, name: &str) -> Option<i32> {
        self.deployments()
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|d| d.spec.replicas)
    }

    /// Every `spec.replicas` the relay's Deployment had, with the second of [`Self::clock`] it
    /// was written, consecutive repeats dropped: the exact scaling history.
    pub fn replicas_history(&self, name: &str) -> Vec<(f64, i32)> {
        let mut history: Vec<(f64, i32)> = Vec::new();
        for (at, deployment) in self.versions_of("deployments", name) {
            let Some(replicas) = deployment["spec"]["replicas"].as_i64() else {
                continue;
            };
            if history.last().map(|h| h.1) != Some(replicas as i32) {
                history.push((at, replicas as i32));
            }
        }
        history
    }

    /// Reasons and notes of the events about the relay, oldest first.
    pub async fn events(&self, relay: &str) -> Vec<(String, String)> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut list = events
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        list.sort_by_key(|e| {
            e.metadata
                .resource_version
                .as_ref()
                .and_then(|v| v.parse::<u64>().ok())
        });
        list.into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(relay))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// The name lag reports carry for the relay: `<namespace>/<name>`.
    /// Waits until the relay `name` shows `Ready=status` (with `reason`, unless empty) and
    /// returns the condition as (status, reason, message); panics with the operator's log.
    pub async fn wait_for_ready(
        &self,
        name: &str,
        status: &str,
        reason: &str,
    ) -> (String, String, String) {
        let relays = self.relays();
        let found = crate::wait::for_value(
            &format!("{name}: Ready={status} ({reason})"),
            Duration::from_secs(150),
            || async {
                let relay = relays.get(name).await.ok()?;
                ready_condition(&relay)
                    .filter(|(s, r, _)| s == status && (reason.is_empty() || r == reason))
            },
        )
        .await;
        match found {
            Ok(found) => found,
            Err(e) => {
                let relay = relays.get(name).await.ok();
                panic!(
                    "{e}: {:?}\n{}",
                    relay.as_ref().and_then(ready_condition),
                    self.operator.log_text()
                )
            }
        }
    }

    pub fn report_name(&self, relay: &str) -> String {
        format!("{}/{relay}", self.namespace)
    }

    /// Requests of the operator's ServiceAccount that the API server denied (403), as
    /// `verb resource: uri` lines, from the audit log.
    pub fn operator_denials(&self) -> Vec<String> {
        denials(self.plane, &self.namespace, OPERATOR_NAME)
    }

    /// Stops the operator first (so it does not react), then removes the namespace (the
    /// kubelet stops its pods with SIGTERM). Fails the test if the operator was ever denied a
    /// request.
    pub async fn shutdown(self) {
        self.operator.stop(&self.client).await;
        // With no operator left to clean up, the relays' finalizers would hold the namespace's
        // deletion forever: take them off, as a person uninstalling the operator would.
        let relays = self.relays();
        let names = relays.list(&ListParams::default()).await.map(|l| l.items);
        for relay in names.unwrap_or_default() {
            let name = relay.metadata.name.unwrap_or_default();
            let patch = json!({"metadata": {"finalizers": null}});
            let _ = relays
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
        let denied = denials(self.plane, &self.namespace, OPERATOR_NAME);
        let _ =
            self.plane
                .kubectl_output(&["delete", "namespace", &self.namespace, "--wait=false"]);
        assert!(
            denied.is_empty(),
            "the chart's RBAC denied the operator: {denied:#?}"
        );
    }
}

/// `helm install` of the chart into `namespace`, watching `namespace` only, with zero operator
/// pods (the test runs the operator as a process, [`OperatorProcess`]), plus `extra` `--set`
/// values.
pub fn install_chart(
    plane: &ControlPlane,
    namespace: &str,
    extra: &[String],
) -> anyhow::Result<String> {
    let mut set = vec![
        format!("fullnameOverride={OPERATOR_NAME}"),
        "replicaCount=0".to_string(),
        format!("watchNamespaces={{{namespace}}}"),
    ];
    set.extend_from_slice(extra);
    helm::install(plane, OPERATOR_NAME, namespace, &set)
}

/// `helm install` of the chart into `namespace` as the README's first command does: watching
/// every namespace (a ClusterRole), with `operator_pods` operator pods (0 when the operator
/// runs as a process) and more chart `values`.
pub fn install_chart_cluster_wide(
    plane: &ControlPlane,
    namespace: &str,
    operator_pods: u32,
    values: &[&str],
) -> anyhow::Result<String> {
    let mut set = vec![
        format!("fullnameOverride={OPERATOR_NAME}"),
        format!("replicaCount={operator_pods}"),
    ];
    set.extend(values.iter().map(|value| value.to_string()));
    helm::install(plane, OPERATOR_NAME, namespace, &set)
}

/// Audit records of ServiceAccount `namespace/name` with response code 403.
pub fn denials(plane: &ControlPlane, namespace: &str, name: &str) -> Vec<String> {
    audited_responses(plane, namespace, name, |code, _, _| code == 403)
}

/// Audit records of ServiceAccount `namespace/name` the API server refused: every 4xx and 5xx
/// but the ones a working client meets, a `get` or `delete` of an object that is not there
/// (404), a write that lost an optimistic-concurrency race (409), an expired resource
/// version (410), a request API Priority and Fairness asked to retry (429: a loaded API
/// server sheds requests this way, and every client retries them), and the finalizer's own
/// lost race (below). So a resource, version or field the server does not serve shows up (404
/// on a list, watch or apply; 400; 422 elsewhere), besides denials.
///
/// A read (`get`, `list`, `watch`) answered 5xx is the server's own failure, not a refusal of
/// anything the client asked: a loaded single-node etcd times out, or the client went away
/// mid-request as it stopped. Seen once on a fresh machine's run of the oldest Kubernetes, a
/// lease `get` answered 500 while three end-to-end jobs and a build shared two cores. Writes
/// answered 5xx still count: a conversion or admission failure shows up that way.
///
/// kube-runtime's finalizer helper, the operator's only patch of an OutboxRelay itself (not a
/// subresource), adds and removes its entry with a JSON patch whose `test` operation checks the
/// finalizers it saw in its cache: a stale cache (a watch restarted, as when the operator has
/// just applied its CRD) fails that test with 422, and the controller retries with the fresh
/// object. That 422 is the JSON-patch form of a 409.
pub fn refusals(plane: &ControlPlane, namespace: &str, name: &str) -> Vec<String> {
    audited_responses(plane, namespace, name, |code, verb, resource| {
        let finalizer_race = code == 422 && verb == "patch" && resource == "outboxrelays";
        let server_failed_a_read = code >= 500 && matches!(verb, "get" | "list" | "watch");
        let expected = matches!(code, 409 | 410 | 429)
            || (code == 404 && matches!(verb, "get" | "delete"))
            || finalizer_race
            || server_failed_a_read;
        code >= 400 && !expected
    })
}

/// Audit records of ServiceAccount `namespace/name` that API Priority and Fairness asked to back
/// off (429): what a client with too many requests in flight meets.
pub fn throttled(plane: &ControlPlane, namespace: &str, name: &str) -> Vec<String> {
    audited_responses(plane, namespace, name, |code, _, _| code == 429)
}

/// `resource` or `resource/subresource` of every write (create, update, patch) the API server
/// accepted from ServiceAccount `namespace/name`.
pub fn accepted_writes(
    plane: &ControlPlane,
    namespace: &str,
    name: &str,
) -> std::collections::BTreeSet<String> {
    plane
        .audit_events_of(namespace, name)
        .into_iter()
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch")))
        .filter(|e| (200..300).contains(&e["responseStatus"]["code"].as_i64().unwrap_or(0)))
        .map(|e| audited_resource(&e))
        .collect()
}

/// `resource` or `resource/subresource` an audit record is about.
fn audited_resource(event: &serde_json::Value) -> String {
    let resource = event["objectRef"]["resource"].as_str().unwrap_or_default();
    match event["objectRef"]["subresource"].as_str() {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    }
}

/// `verb resource: URI (code)` of the completed requests of ServiceAccount `namespace/name`
/// whose response code and verb `select` picks.
fn audited_responses(
    plane: &ControlPlane,
    namespace: &str,
    name: &str,
    select: impl Fn(i64, &str, &str) -> bool,
) -> Vec<String> {
    plane
        .audit_events_of(namespace, name)
        .into_iter()
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter(|e| {
            let code = e["responseStatus"]["code"].as_i64().unwrap_or(0);
            select(
                code,
                e["verb"].as_str().unwrap_or_default(),
                &audited_resource(e),
            )
        })
        .map(|e| {
            format!(
                "{} {}: {} ({}{})",
                e["verb"],
                e["objectRef"]["resource"],
                e["requestURI"],
                e["responseStatus"]["code"],
                e["responseStatus"]["message"]
                    .as_str()
                    .map(|message| format!(": {message}"))
                    .unwrap_or_default()
            )
        })
        .collect()
}

/// The timings of a test's operator, as `outbox-operator run` flags: retries and resyncs
/// short, so a test sees a fix within seconds.
pub const TEST_OPERATOR_ARGS: [&str; 8] = [
    "--retry-base",
    "500ms",
    "--retry-max",
    "5s",
    "--resync-interval",
    "30s",
    // A deletion whose database cleanup cannot finish gives up after this (5 minutes by
    // default), so a test of it waits seconds.
    "--cleanup-timeout",
    "20s",
];

/// The labels that select the chart's operator pods.
pub const OPERATOR_POD_SELECTOR: &str = "app.kubernetes.io/name=outbox-relay-operator";

/// The chart's operator Deployment in a test's namespace: one pod on the node, as shipped but
/// for [`TEST_OPERATOR_ARGS`] (the chart's `extraArgs`) and text logs.
pub struct OperatorPod {
    plane: &'static ControlPlane,
    namespace: String,
}

impl OperatorPod {
    /// `helm install`s the chart into `namespace`, watching it, and waits (helm's `--wait`)
    /// for the operator pod to be ready.
    pub async fn install(plane: &'static ControlPlane, namespace: &str) -> anyhow::Result<Self> {
        Self::install_with(plane, namespace, &[]).await
    }

    /// [`Self::install`] with more chart values (`replicaCount=2`, …).
    pub async fn install_with(
        plane: &'static ControlPlane,
        namespace: &str,
        values: &[&str],
    ) -> anyhow::Result<Self> {
        let mut set = vec![
            format!("fullnameOverride={OPERATOR_NAME}"),
            format!("watchNamespaces={{{namespace}}}"),
            "logFormat=text".to_string(),
            format!("extraArgs={{{}}}", TEST_OPERATOR_ARGS.join(",")),
        ];
        set.extend(values.iter().map(|value| value.to_string()));
        let release_namespace = namespace.to_string();
        tokio::task::spawn_blocking(move || {
            helm::install(plane, OPERATOR_NAME, &release_namespace, &set)
        })
        .await??;
        Ok(Self {
            plane,
            namespace: namespace.to_string(),
        })
    }

    /// The operator's log, through the API server (`kubectl logs`), or why it cannot be read.
    pub fn log_text(&self) -> String {
        let deployment = format!("deploy/{OPERATOR_NAME}");
        let args = ["-n", &self.namespace, "logs", &deployment, "--tail=-1"];
        match self.plane.kubectl_output(&args) {
            Ok((true, stdout, _)) => format!("--- operator log ---\n{stdout}"),
            Ok((false, _, stderr)) => format!("(no operator log: {})", stderr.trim()),
            Err(error) => format!("(no operator log: {error:#})"),
        }
    }

    /// The operator's pods, as the API server has them.
    pub async fn pods(&self, client: &Client) -> anyhow::Result<Vec<Pod>> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &self.namespace);
        let selector = ListParams::default().labels(OPERATOR_POD_SELECTOR);
        Ok(pods.list(&selector).await?.items)
    }

    /// Scales the operator to zero and waits (at most 30 s) until its pod is gone.
    pub async fn stop(&self, client: &Client) {
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &self.namespace);
        let scale = json!({"spec": {"replicas": 0}});
        let _ = deployments
            .patch(
                OPERATOR_NAME,
                &PatchParams::default(),
                &Patch::Merge(&scale),
            )
            .await;
        let _ = crate::wait::until(
            "the operator pod is gone",
            Duration::from_secs(30),
            || async { self.pods(client).await.is_ok_and(|pods| pods.is_empty()) },
        )
        .await;
    }
}

/// `outbox-operator run` as its own process, authenticated with a token of the chart's
/// ServiceAccount, exactly as the pod would be but for the credentials' path.
pub struct OperatorProcess {
    child: Child,
    pub log: PathBuf,
    /// `127.0.0.1:PORT` of its /metrics, /healthz and /readyz.
    pub metrics_addr: String,
    pub kubeconfig: PathBuf,
}

impl OperatorProcess {
    /// Starts an operator with the token of ServiceAccount `OPERATOR_NAME` in `release_ns`,
    /// watching `watch_ns` (empty: every namespace), leader election off unless `extra` says
    /// otherwise. `name` names its log.
    pub async fn start(
        plane: &ControlPlane,
        release_ns: &str,
        watch_ns: &str,
        name: &str,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let kubeconfig = plane.service_account_kubeconfig(release_ns, OPERATOR_NAME)?;
        let log = process::log_path(&format!("{release_ns}-{name}"));
        let file = std::fs::File::create(&log)?;
        let metrics_addr = format!("127.0.0.1:{}", free_port()?);
        let mut command = Command::new(process::binary("outbox-operator"));
        command.args([
            "run",
            "--metrics-addr",
            &metrics_addr,
            "--log-format",
            "text",
        ]);
        if !watch_ns.is_empty() {
            command.args(["--namespace", watch_ns]);
        }
        if !extra.iter().any(|a| a.starts_with("--leader-election")) {
            command.arg("--leader-election=false");
        }
        command
            .args(TEST_OPERATOR_ARGS)
            .args(extra)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAMESPACE", release_ns)
            .env("POD_NAME", format!("{name}-{}", std::process::id()))
            .env(
                "RUST_LOG",
                std::env::var("OPERATOR_LOG").unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        die_with_parent_tokio(&mut command);
        let child = command.spawn()?;
        Ok(Self {
            child,
            log,
            metrics_addr,
            kubeconfig,
        })
    }

    /// A client with the operator's own credentials.
    pub async fn client(&self) -> anyhow::Result<Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGKILL: no chance to release the Lease.
    pub async fn kill9(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, then SIGKILL after 10 s.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The Ready condition of `relay` as (status, reason, message).
pub fn ready_condition(relay: &OutboxRelay) -> Option<(String, String, String)> {
    let conditions = &relay.status.as_ref()?.conditions;
    let found = conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((
        found.status.clone(),
        found.reason.clone(),
        found.message.clone(),
    ))
}

/// The Secrets [`relay_spec`] refers to, holding the local PostgreSQL and RabbitMQ URLs (as
/// pods reach them, see [`create_url_secret`]).
pub async fn create_connection_secrets(client: &Client, namespace: &str) {
    for (name, url) in [
        (DATABASE_SECRET, crate::database_url()),
        (BROKER_SECRET, crate::amqp_url()),
    ] {
        create_url_secret(client, namespace, name, &url).await;
    }
}

/// A Secret `name` holding `url` under the key `url`, as a user would create it. A loopback
/// host in `url` (how the tests on this host reach the servers) is written as the services
/// address, where the relay pods reach the same servers, and so does the operator.
pub async fn create_url_secret(client: &Client, namespace: &str, name: &str, url: &str) {
    let url = url_for_pods(url).unwrap_or_else(|e| panic!("the URL of Secret {name}: {e:#}"));
    create_url_secret_as_is(client, namespace, name, &url).await;
}

/// A Secret `name` holding `url` under the key `url`, written as given: for what
/// [`url_for_pods`] does not parse (libpq's multi-host URLs, broker lists), made with the
/// services address already.
pub async fn create_url_secret_as_is(client: &Client, namespace: &str, name: &str, url: &str) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "url".to_string(),
            k8s_openapi::ByteString(url.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("the Secret {name} is created: {e}"));
}

/// An OutboxRelay spec for `table`, publishing to `exchange`, with the intervals of a test:
/// fast polling, a report every second, and a short grace period.
pub fn relay_spec(table: &str, exchange: &str) -> OutboxRelaySpec {
    serde_json::from_value(json!({
        "database": {"urlSecretRef": {"name": DATABASE_SECRET}, "table": table},
        "broker": {"urlSecretRef": {"name": BROKER_SECRET}, "exchange": exchange},
        "relay": {
            "batchSize": 500,
            "workersPerPod": 2,
            "pollInterval": "100ms",
            "reportInterval": "1s",
            "terminationGracePeriodSeconds": 15,
            "logFormat": "text",
        },
    }))
    .expect("the test spec deserializes")
}
