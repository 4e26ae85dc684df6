//! A real Kubernetes control plane for the tests, as envtest starts one for Go operators: etcd,
//! kube-apiserver and kube-controller-manager built from the Kubernetes Go modules by
//! `tests/control-plane/build.sh`, on free loopback ports, with fresh certificates, RBAC on,
//! ServiceAccount tokens (TokenRequest) and an audit log of every ServiceAccount request.
//!
//! [`ControlPlane::shared`] gives the tests of one binary one control plane (each test uses
//! its own namespace); [`ControlPlane::start`] gives a private one that stops when dropped;
//! [`ControlPlane::start_in`] one whose files live in a folder of the caller's choice (for
//! `make cluster`). Either way its processes get SIGKILL when the process that started them
//! exits (see [`spawn`]).

mod certs;
mod kubeconfig;
mod release;
pub mod spawn;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::Client;

pub use certs::{CertFiles, Usage};
pub use release::{RELEASE_ENV, Release};

use crate::services::SERVICES_ADDRESS;

/// How long etcd and the API server may take to come up on a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The controllers a test cluster needs: Deployments make ReplicaSets make Pods; the garbage
/// collector follows owner references; namespaces can be deleted; ServiceAccounts and their
/// CA bundle appear in every namespace. The node lifecycle controller removes the `not-ready`
/// taint a kubelet registers its node with, once the node is Ready. The disruption controller
/// keeps PodDisruptionBudgets' allowances, which evictions (a drain) consult. Taint-based
/// eviction is left out.
const CONTROLLERS: &[&str] = &[
    "deployment-controller",
    "node-lifecycle-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "endpointslice-controller",
    "disruption-controller",
];

/// Records who did what for every ServiceAccount (the operator, the relays' tokens) with the
/// response code, and nothing for the test's admin or the controllers' own certificates. Their
/// Secret requests are recorded with the response, so a test sees which Secrets' values a
/// ServiceAccount received.
const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: RequestResponse
    userGroups: [\"system:serviceaccounts\"]
    resources: [{group: \"\", resources: [\"secrets\"]}]
  - level: Metadata
    userGroups: [\"system:serviceaccounts\"]
  - level: None
";

struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

pub struct ControlPlane {
    dir: PathBuf,
    bin: PathBuf,
    /// Which Kubernetes it runs (`OUTBOX_KUBERNETES`).
    pub release: Release,
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// The admin's kubeconfig (a client certificate in `system:masters`).
    pub kubeconfig: PathBuf,
    pub certs: CertFiles,
    pub audit_log: PathBuf,
    components: Mutex<Vec<Component>>,
    /// Whether dropping stops the processes (a private control plane) or not (the shared one,
    /// which lives in a static and dies with the process).
    owned: bool,
    /// Whether dropping leaves the files (logs, certificates) for a look afterwards.
    keep_dir: bool,
}

impl ControlPlane {
    /// The control plane shared by the tests of this test binary, started on first use.
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<ControlPlane> = OnceLock::new();
        SHARED.get_or_init(|| {
            let mut plane = fresh_dir()
                .and_then(|dir| Self::boot(dir, false))
                .unwrap_or_else(|error| panic!("{error:#}"));
            plane.owned = false;
            plane
        })
    }

    /// A control plane of one's own, stopped (and its directory removed) when dropped.
    pub fn start() -> anyhow::Result<ControlPlane> {
        Self::boot(fresh_dir()?, false)
    }

    /// A control plane of one's own with its files in `dir`, which is emptied first (a stable
    /// place for its kubeconfig and logs, as `make cluster` needs). Stopped when dropped; the
    /// files stay, for a look at the logs afterwards.
    pub fn start_in(dir: &Path) -> anyhow::Result<ControlPlane> {
        match std::fs::remove_dir_all(dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(error).with_context(|| format!("empty {}", dir.display()));
            }
            _ => {}
        }
        std::fs::create_dir_all(dir)?;
        Self::boot(std::path::absolute(dir)?, true)
    }

    fn boot(dir: PathBuf, keep_dir: bool) -> anyhow::Result<ControlPlane> {
        let release = Release::from_env()?;
        let bin = binaries(release)?;
        let certs = certs::write(&dir)?;
        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        // On the services address, where the node and its pods reach it too.
        let api_port = crate::services::free_port()?;
        let server = format!("https://{SERVICES_ADDRESS}:{api_port}");
        let kubeconfig = dir.join("admin.kubeconfig");
        kubeconfig::write_certificate(&kubeconfig, &server, &certs)?;
        let audit_policy = dir.join("audit-policy.yaml");
        std::fs::write(&audit_policy, AUDIT_POLICY)?;
        let audit_log = dir.join("audit.log");
        install_failure_logs(&dir);

        let plane = ControlPlane {
            dir: dir.clone(),
            bin,
            release,
            server,
            kubeconfig,
            certs,
            audit_log,
            components: Mutex::new(Vec::new()),
            owned: true,
            keep_dir,
        };

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        plane.launch(
            "etcd",
            &[
                "--name=test",
                &format!("--data-dir={}", dir.join("etcd").display()),
                &format!("--listen-client-urls={etcd_url}"),
                &format!("--advertise-client-urls={etcd_url}"),
                &format!("--listen-peer-urls={peer_url}"),
                &format!("--initial-advertise-peer-urls={peer_url}"),
                &format!("--initial-cluster=test={peer_url}"),
                // A test cluster's data is thrown away: no fsync, as envtest does.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )?;

        let certs = &plane.certs;
        let api_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={api_port}"),
            format!("--bind-address={SERVICES_ADDRESS}"),
            // The `kubernetes` Service's endpoint: pods reach the API server through its
            // ClusterIP, which kube-proxy on the node forwards here.
            format!("--advertise-address={SERVICES_ADDRESS}"),
            format!("--cert-dir={}", dir.display()),
            format!("--tls-cert-file={}", certs.serving_cert.display()),
            format!("--tls-private-key-file={}", certs.serving_key.display()),
            format!("--client-ca-file={}", certs.ca_cert.display()),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            // As kubeadm sets it up: kubelets are authorized by the Node authorizer and may
            // only write their own Node and their pods' status (NodeRestriction).
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!(
                "--kubelet-client-certificate={}",
                certs.kubelet_client_cert.display()
            ),
            format!(
                "--kubelet-client-key={}",
                certs.kubelet_client_key.display()
            ),
            format!(
                "--kubelet-certificate-authority={}",
                certs.ca_cert.display()
            ),
            // The node's name resolves nowhere; its address is what reaches it.
            "--kubelet-preferred-address-types=InternalIP".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!(
                "--service-account-key-file={}",
                certs.service_account_public.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                certs.service_account_key.display()
            ),
            format!("--audit-policy-file={}", audit_policy.display()),
            format!("--audit-log-path={}", plane.audit_log.display()),
            "--audit-log-format=json".into(),
            // Written as each request completes, so a test reads what just happened.
            "--audit-log-mode=blocking".into(),
        ];
        let api_args: Vec<&str> = api_args.iter().map(String::as_str).collect();
        plane.launch("kube-apiserver", &api_args)?;
        plane.wait_ready("/readyz")?;
        if !release.runs_controllers() {
            return Ok(plane);
        }

        let controllers = CONTROLLERS.join(",");
        let kcm_args = [
            format!("--kubeconfig={}", plane.kubeconfig.display()),
            format!("--controllers={controllers}"),
            format!(
                "--service-account-private-key-file={}",
                plane.certs.service_account_key.display()
            ),
            format!("--root-ca-file={}", plane.certs.ca_cert.display()),
            "--leader-elect=false".into(),
            // No serving port: nothing scrapes it, and tests run in parallel.
            "--secure-port=0".into(),
            // Controllers react at test speed.
            "--concurrent-deployment-syncs=10".into(),
            "--concurrent-replicaset-syncs=10".into(),
        ];
        let kcm_args: Vec<&str> = kcm_args.iter().map(String::as_str).collect();
        plane.launch("kube-controller-manager", &kcm_args)?;
        plane.wait_default_service_account()?;
        Ok(plane)
    }

    /// kube-scheduler, which places pods on the nodes that kubelets register. Started with the
    /// first real node (see `crate::node`), once: later nodes find it running.
    pub fn start_scheduler(&self) -> anyhow::Result<()> {
        if !self.release.runs_controllers() {
            bail!(
                "a node needs the control plane's controllers, scheduler and kubelet: {RELEASE_ENV}={:?} builds etcd, kube-apiserver and kubectl only",
                self.release
            );
        }
        let components = self.components.lock().expect("not poisoned");
        if components.iter().any(|c| c.name == "kube-scheduler") {
            return Ok(());
        }
        drop(components);
        let kubeconfig = format!("--kubeconfig={}", self.kubeconfig.display());
        self.launch(
            "kube-scheduler",
            &[
                &kubeconfig,
                "--leader-elect=false",
                // No serving port: nothing scrapes it, and tests run in parallel.
                "--secure-port=0",
            ],
        )
    }

    /// A certificate of the control plane's CA (see [`certs::issue`]), in its directory.
    pub fn issue_certificate(
        &self,
        stem: &str,
        usage: certs::Usage<'_>,
    ) -> anyhow::Result<(PathBuf, PathBuf)> {
        certs::issue(&self.certs, &self.dir, stem, usage)
    }

    /// A kubeconfig `<stem>.kubeconfig` that logs in with a client certificate of `user` in
    /// `group`, issued for it.
    pub fn certificate_kubeconfig(
        &self,
        stem: &str,
        user: &str,
        group: Option<&str>,
    ) -> anyhow::Result<PathBuf> {
        let (cert, key) = self.issue_certificate(stem, certs::Usage::Client { user, group })?;
        let path = self.dir.join(format!("{stem}.kubeconfig"));
        kubeconfig::write_client_certificate(&path, &self.server, &self.certs, &cert, &key)?;
        Ok(path)
    }

    fn launch(&self, name: &'static str, args: &[&str]) -> anyhow::Result<()> {
        let log = self.dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let mut command = Command::new(self.bin.join(name));
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = spawn::spawn_for_process_lifetime(command)
            .with_context(|| format!("start {name} from {}", self.bin.display()))?;
        self.components
            .lock()
            .expect("not poisoned")
            .push(Component { name, child, log });
        Ok(())
    }

    /// Polls the API server's `path` (`/readyz`) until it answers ok.
    fn wait_ready(&self, path: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            self.fail_if_exited()?;
            let out = self.kubectl_output(&["get", "--raw", path]);
            if matches!(&out, Ok((true, stdout, _)) if stdout.trim() == "ok") {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "kube-apiserver not ready after {START_TIMEOUT:?}: {out:?}\n{}",
                    self.logs(40)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The `default` ServiceAccount of `default` appears once the controllers run: the sign
    /// that kube-controller-manager is working.
    fn wait_default_service_account(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            self.fail_if_exited()?;
            if let Ok((true, ..)) =
                self.kubectl_output(&["get", "serviceaccount", "default", "-n", "default"])
            {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "kube-controller-manager made no default ServiceAccount in {START_TIMEOUT:?}\n{}",
                    self.logs(40)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn fail_if_exited(&self) -> anyhow::Result<()> {
        let mut components = self.components.lock().expect("not poisoned");
        for component in components.iter_mut() {
            if let Some(status) = component.child.try_wait()? {
                let tail = crate::daemon::log_tail(&component.log, 40);
                bail!("{} exited with {status}:\n{tail}", component.name);
            }
        }
        Ok(())
    }

    /// The directory of the control plane's binaries (kubectl among them).
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    pub fn kubectl_path(&self) -> PathBuf {
        self.bin.join("kubectl")
    }

    /// A `kubectl` command with the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(self.kubectl_path());
        command.env("KUBECONFIG", &self.kubeconfig);
        command
    }

    /// Runs admin `kubectl args…`: (succeeded, stdout, stderr).
    pub fn kubectl_output(&self, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
        let output = self.kubectl().args(args).stdin(Stdio::null()).output()?;
        Ok((
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ))
    }

    /// Runs admin `kubectl args…` and returns stdout, failing with kubectl's stderr.
    pub fn kubectl_ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let (ok, stdout, stderr) = self.kubectl_output(args)?;
        if !ok {
            bail!("kubectl {} failed: {stderr}", args.join(" "));
        }
        Ok(stdout)
    }

    /// Runs admin `kubectl args…` until it succeeds, for what the server publishes a moment
    /// after a change (a new CRD's OpenAPI for `kubectl explain`); fails with the last error.
    pub fn kubectl_eventually(&self, args: &[&str], timeout: Duration) -> anyhow::Result<String> {
        let started = Instant::now();
        loop {
            match self.kubectl_ok(args) {
                Ok(stdout) => return Ok(stdout),
                Err(error) if started.elapsed() > timeout => {
                    return Err(error.context(format!("still failing after {timeout:?}")));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(250)),
            }
        }
    }

    /// A kube client with the admin's credentials.
    pub async fn admin_client(&self) -> anyhow::Result<Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// Creates the namespace (idempotent).
    pub fn create_namespace(&self, namespace: &str) -> anyhow::Result<()> {
        let (ok, _, stderr) = self.kubectl_output(&["create", "namespace", namespace])?;
        if !ok && !stderr.contains("AlreadyExists") {
            bail!("create namespace {namespace}: {stderr}");
        }
        Ok(())
    }

    /// Creates the namespace labelled `pod-security.kubernetes.io/enforce: restricted`, so the
    /// API server itself refuses any pod in it that breaks the restricted profile.
    pub fn create_restricted_namespace(&self, namespace: &str) -> anyhow::Result<()> {
        self.create_namespace(namespace)?;
        self.kubectl_ok(&[
            "label",
            "namespace",
            namespace,
            "--overwrite",
            "pod-security.kubernetes.io/enforce=restricted",
        ])
        .map(drop)
    }

    /// A kubeconfig holding a token of ServiceAccount `namespace/name` (TokenRequest, as
    /// `kubectl create token` does), written next to the control plane's files.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<PathBuf> {
        let token =
            self.kubectl_ok(&["create", "token", name, "-n", namespace, "--duration=24h"])?;
        let path = self.dir.join(format!("sa-{namespace}-{name}.kubeconfig"));
        kubeconfig::write_token(&path, &self.server, &self.certs, token.trim(), namespace)?;
        Ok(path)
    }

    /// Audit records of requests by ServiceAccount `namespace/name`, as JSON objects.
    pub fn audit_events_of(&self, namespace: &str, name: &str) -> Vec<serde_json::Value> {
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let Ok(file) = std::fs::File::open(&self.audit_log) else {
            return Vec::new();
        };
        BufReader::new(file)
            .lines()
            .map_while(Result::ok)
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(&line).ok())
            .filter(|event| event["user"]["username"] == user.as_str())
            .collect()
    }

    /// The last `lines` lines of every component's log, for a failure message.
    pub fn logs(&self, lines: usize) -> String {
        let components = self.components.lock().map(|c| {
            c.iter()
                .map(|c| (c.name, c.log.clone()))
                .collect::<Vec<_>>()
        });
        let mut text = String::new();
        for (name, log) in components.unwrap_or_default() {
            text.push_str(&format!("--- last {lines} lines of {name} ---\n"));
            text.push_str(&crate::daemon::log_tail(&log, lines));
            text.push('\n');
        }
        text
    }

    /// The control plane's working directory (certificates, logs, kubeconfigs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Ok(components) = self.components.get_mut() {
            // Controllers first, etcd last.
            for component in components.iter_mut().rev() {
                let _ = component.child.kill();
                let _ = component.child.wait();
            }
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A kube client for the cluster and credentials of the kubeconfig file at `path`.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

/// The binaries' directory: `OUTBOX_CONTROL_PLANE_BIN` for the current release, else what
/// `build.sh` prints for the release's module (it builds them on first use and answers from
/// its cache after that).
fn binaries(release: Release) -> anyhow::Result<PathBuf> {
    if let Ok(dir) = std::env::var("OUTBOX_CONTROL_PLANE_BIN")
        && release == Release::Current
    {
        return Ok(PathBuf::from(dir));
    }
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = crate::repo_root().join("tests/control-plane/build.sh");
        crate::process::path_printed_by(
            &script,
            &[release.module_dir().as_os_str()],
            "the control plane could not be built",
        )
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// A new directory for one control plane, under the system temp dir. Directories of earlier
/// test processes that are gone are removed first, since a killed run cannot clean up.
fn fresh_dir() -> anyhow::Result<PathBuf> {
    let root = std::env::temp_dir().join("outbox-control-planes");
    std::fs::create_dir_all(&root)?;
    for entry in std::fs::read_dir(&root)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = root.join(format!(
        "{}-{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// On a failing test, prints the last lines of the control plane's logs after the panic
/// message, so a red run explains itself. Installed once per process, for every control plane
/// directory it starts.
fn install_failure_logs(dir: &Path) {
    static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    static HOOK: OnceLock<()> = OnceLock::new();
    DIRS.lock().expect("not poisoned").push(dir.to_path_buf());
    HOOK.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let dirs = DIRS.lock().map(|d| d.clone()).unwrap_or_default();
            for dir in dirs {
                for name in ["kube-apiserver", "kube-controller-manager"] {
                    let log = dir.join(format!("{name}.log"));
                    if log.exists() {
                        eprintln!(
                            "--- last 20 lines of {} ---\n{}",
                            log.display(),
                            crate::daemon::log_tail(&log, 20)
                        );
                    }
                }
            }
        }));
    });
}
