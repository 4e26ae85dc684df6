//! `make cluster` as the README walks through it: the real Makefile target starts the local
//! control plane in the background; the user's Secrets and OutboxRelay, in `default` and
//! pointing at the local PostgreSQL and RabbitMQ (on the address pods reach them at), relay rows
//! through relay pods the real node runs; `make cluster-down` leaves no process behind.
//!
//! The cluster gets a folder of its own (`OUTBOX_CLUSTER_DIR`), so a `make cluster` the
//! developer has running is left alone, and runs this test's own build of `outbox-cluster`
//! (`CLUSTER_BIN`, with the `outbox-relay` and `outbox-operator` next to it), so make builds
//! nothing. `OUTBOX_CLUSTER_EXIT_WITH` makes the cluster stop by itself should this test process
//! die without running `make cluster-down`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use lapin::ExchangeKind;
use outbox_tests::node::{NodeLink, cgroup_roots_of, remove_stale_cgroups};
use outbox_tests::services::url_for_pods;
use outbox_tests::{broker, db, process, unique};

/// Longest a make target may take: the start includes the chart's `helm install --wait`.
const MAKE_TIMEOUT: Duration = Duration::from_secs(360);

/// The processes a running cluster must have started, by program name.
const PROGRAMS: [&str; 10] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
    "outbox-pause",
    "outbox-operator",
    "outbox-relay",
];

/// The URL a user of `make cluster` puts in a Secret: the server as pods reach it.
fn for_pods(url: &str) -> String {
    url_for_pods(url).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `make TARGET` in the repository, for the cluster in `dir`: (succeeded, stdout, stderr).
async fn make(target: &str, dir: &Path) -> (bool, String, String) {
    let repo = outbox_tests::repo_root();
    let mut command = tokio::process::Command::new("make");
    command
        .args(["--no-print-directory", "-C"])
        .arg(&repo)
        .arg(target)
        .arg(concat!(
            "CLUSTER_BIN=",
            env!("CARGO_BIN_EXE_outbox-cluster")
        ))
        .env("OUTBOX_CLUSTER_DIR", dir)
        .env("OUTBOX_CLUSTER_EXIT_WITH", std::process::id().to_string())
        // Not a sub-make of the `make test` that may run this test: its jobserver is not ours.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(MAKE_TIMEOUT, command.output())
        .await
        .unwrap_or_else(|_| panic!("make {target} took over {MAKE_TIMEOUT:?}"))
        .expect("run make");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A process as /proc shows it: its start time tells it from a later one with the same pid.
#[derive(Debug, Clone, PartialEq)]
struct Proc {
    pid: u32,
    start_time: u64,
    program: String,
}

impl Proc {
    fn read(pid: u32) -> Option<(Proc, u32, char)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name, which may hold spaces: state, ppid, … starttime (22nd).
        let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
        let state = fields.first()?.chars().next()?;
        let ppid = fields.get(1)?.parse().ok()?;
        let start_time = fields.get(19)?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let program = String::from_utf8_lossy(argv0)
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        Some((
            Proc {
                pid,
                start_time,
                program,
            },
            ppid,
            state,
        ))
    }

    /// Whether this very process still runs (a zombie has stopped).
    fn still_there(&self) -> bool {
        matches!(Proc::read(self.pid), Some((now, _, state))
            if now.start_time == self.start_time && state != 'Z')
    }
}

/// Every live descendant of `root`.
fn descendants(root: u32) -> Vec<Proc> {
    let mut children: BTreeMap<u32, Vec<Proc>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some((proc, ppid, state)) = Proc::read(pid)
            && state != 'Z'
        {
            children.entry(ppid).or_default().push(proc);
        }
    }
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for child in children.remove(&parent).unwrap_or_default() {
            parents.push(child.pid);
            found.push(child);
        }
    }
    found
}

/// The cluster folder; on a failing test, shows the cluster's log and kills what it started
/// (SIGKILL to outbox-cluster; the parent-death signal takes the rest).
struct ClusterDir(PathBuf);

impl ClusterDir {
    fn pid(&self) -> Option<Proc> {
        let pid = std::fs::read_to_string(self.0.join("pid")).ok()?;
        Proc::read(pid.trim().parse().ok()?).map(|(proc, ..)| proc)
    }
}

impl Drop for ClusterDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let log = std::fs::read_to_string(self.0.join("cluster.log")).unwrap_or_default();
        eprintln!("--- {}/cluster.log ---\n{log}", self.0.display());
        if let Some(proc) = self.pid()
            && proc.program == "outbox-cluster"
        {
            // SAFETY: kill(2) on the pid the cluster wrote, checked to be an outbox-cluster.
            unsafe { libc::kill(proc.pid as i32, libc::SIGKILL) };
        }
    }
}

/// `kubectl args…` with the cluster's kubeconfig and `stdin`, which must succeed.
fn kubectl(kubectl: &Path, kubeconfig: &Path, args: &[&str], stdin: &str) -> String {
    let mut command = std::process::Command::new(kubectl);
    command.args(args).env("KUBECONFIG", kubeconfig);
    let output = process::output_with_stdin(&mut command, stdin).expect("run kubectl");
    assert!(
        output.status.success(),
        "kubectl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The kubectl `make cluster` printed (`kubectl: <path> (…)`).
fn printed_kubectl(stdout: &str) -> PathBuf {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("kubectl: "))
        .and_then(|l| l.split_whitespace().next())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no kubectl line in:\n{stdout}"))
}

/// The OutboxRelay of the README's section "Try it on a local control plane", for `table`
/// and `exchange`.
fn readme_relay(table: &str, exchange: &str) -> String {
    format!(
        "apiVersion: outboxrelay.io/v1beta1
kind: OutboxRelay
metadata:
  name: orders
spec:
  database: {{urlSecretRef: {{name: orders-db}}, table: {table}}}
  broker: {{urlSecretRef: {{name: orders-amqp}}, exchange: {exchange}}}
  scaling: {{minReplicas: 1, maxReplicas: 4, targetBacklogPerReplica: 10000}}
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_cluster_relays_rows_and_make_cluster_down_leaves_no_process() {
    let dir = ClusterDir(std::env::temp_dir().join(unique("outbox-cluster")));
    let (ok, stdout, stderr) = make("cluster", &dir.0).await;
    assert!(ok, "make cluster failed:\n{stdout}\n{stderr}");

    // One KUBECONFIG= line naming the folder's kubeconfig, and the control plane's kubectl.
    let kubeconfigs: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("KUBECONFIG="))
        .collect();
    assert_eq!(
        kubeconfigs,
        [dir.0.join("kubeconfig").to_str().unwrap()],
        "{stdout}"
    );
    let kubeconfig = PathBuf::from(kubeconfigs[0]);
    let kubectl_path = printed_kubectl(&stdout);
    let helm_path = stdout
        .lines()
        .find_map(|l| l.strip_prefix("helm: "))
        .map(|l| PathBuf::from(l.trim()))
        .unwrap_or_else(|| panic!("no helm line in:\n{stdout}"));
    let run = |args: &[&str], stdin: &str| kubectl(&kubectl_path, &kubeconfig, args, stdin);

    // The README's steps: a table and an exchange with a queue, the Secrets, the OutboxRelay.
    let name = unique("make_cluster");
    let table = db::table(&name);
    let mut conn = db::seeded_table(&table, 0).await;
    let consumer = broker::consume(&name, ExchangeKind::Fanout, "").await;
    let database_url = format!(
        "--from-literal=url={}",
        for_pods(&outbox_tests::database_url())
    );
    let amqp_url = format!("--from-literal=url={}", for_pods(&outbox_tests::amqp_url()));
    run(
        &["create", "secret", "generic", "orders-db", &database_url],
        "",
    );
    run(
        &["create", "secret", "generic", "orders-amqp", &amqp_url],
        "",
    );
    let applied = run(&["apply", "-f", "-"], &readme_relay(&name, &name));
    assert!(applied.contains("orders created"), "{applied}");
    run(
        &[
            "wait",
            "--for=condition=Ready",
            "obr/orders",
            "--timeout=180s",
        ],
        "",
    );

    // Rows inserted are relayed, once each, by the relay pods.
    outbox_relay::tools::seed::copy_rows(&mut conn, &table, 2_000, 50, |_| {})
        .await
        .unwrap();
    assert!(
        db::wait_until_drained(&table, Duration::from_secs(120)).await,
        "rows still pending"
    );
    assert_eq!(
        consumer.wait_for(2_000, Duration::from_secs(60)).await,
        2_000
    );
    assert_eq!(consumer.distinct(), 2_000);
    let shown = run(&["get", "obr"], "");
    let row: Vec<&str> = shown
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row.get(..2), Some(&["orders", "True"][..]), "{shown}");

    // The operator is the chart's own pod, as shipped: ready, confined as its securityContext
    // says, on in-cluster credentials; and the real-cluster suite passes here.
    {
        let pods = run(
            &[
                "get",
                "pods",
                "-n",
                "outbox-relay-system",
                "-o",
                "jsonpath={.items[*].status.containerStatuses[*].ready}",
            ],
            "",
        );
        assert_eq!(pods.trim(), "true", "the operator pod is not ready: {pods}");
        let e2e =
            tokio::process::Command::new(outbox_tests::repo_root().join("scripts/e2e-cluster.sh"))
                .env("KUBECONFIG", &kubeconfig)
                .env("E2E_DATABASE_URL", for_pods(&outbox_tests::database_url()))
                .env("E2E_AMQP_URL", for_pods(&outbox_tests::amqp_url()))
                .env("E2E_TIMEOUT", "120")
                // The tools make cluster printed: CI's helm is not where chart-check caches it.
                .env("HELM", &helm_path)
                .env("KUBECTL", &kubectl_path)
                .stdin(Stdio::null())
                .output()
                .await
                .expect("run scripts/e2e-cluster.sh");
        let said = String::from_utf8_lossy(&e2e.stdout).into_owned()
            + &String::from_utf8_lossy(&e2e.stderr);
        assert!(
            e2e.status.success() && said.contains("e2e-cluster: passed"),
            "{said}"
        );
    }

    // Every part of the cluster is a descendant of the one outbox-cluster process.
    let cluster = dir
        .pid()
        .expect("the cluster's pid file names a live process");
    assert_eq!(cluster.program, "outbox-cluster");
    let tree = descendants(cluster.pid);
    for program in PROGRAMS {
        assert!(
            tree.iter().any(|p| p.program == program),
            "no {program} under outbox-cluster: {tree:?}"
        );
    }
    // The operator's and the relays' processes run as the pods' user, not as root.
    {
        for proc in tree
            .iter()
            .filter(|p| ["outbox-operator", "outbox-relay"].contains(&p.program.as_str()))
        {
            let status =
                std::fs::read_to_string(format!("/proc/{}/status", proc.pid)).unwrap_or_default();
            let uid = status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .unwrap_or_default();
            assert!(uid.contains("65532"), "{} runs as {uid}", proc.program);
        }
    }

    let (ok, stdout, stderr) = make("cluster-down", &dir.0).await;
    assert!(ok, "make cluster-down failed:\n{stdout}\n{stderr}");
    let left: Vec<&Proc> = std::iter::once(&cluster)
        .chain(&tree)
        .filter(|p| p.still_there())
        .collect();
    assert!(left.is_empty(), "left running after cluster-down: {left:?}");
    assert!(!dir.0.join("pid").exists() && !kubeconfig.exists());
    consumer.close().await;
    let _ = std::fs::remove_dir_all(&dir.0);
}

/// The guarantee behind every test harness here: what a process starts (control plane, node,
/// operator, relays) dies with it, even when it is killed without a chance to clean up
/// (PR_SET_PDEATHSIG on every child, the node's processes with its namespaces); and what the
/// kernel does not remove with them, the node's cgroups, the next node's start removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_cluster_process_takes_everything_it_started_with_it() {
    let dir = ClusterDir(std::env::temp_dir().join(unique("outbox-cluster-kill")));
    let (ok, stdout, stderr) = make("cluster", &dir.0).await;
    assert!(ok, "make cluster failed:\n{stdout}\n{stderr}");
    let cluster = dir
        .pid()
        .expect("the cluster's pid file names a live process");
    let tree = descendants(cluster.pid);
    for program in PROGRAMS.iter().filter(|p| **p != "outbox-relay") {
        assert!(
            tree.iter().any(|p| p.program == *program),
            "no {program} under outbox-cluster: {tree:?}"
        );
    }
    // The node's end of the network on the host, and its cgroups.
    let kubectl_path = printed_kubectl(&stdout);
    let address = kubectl(
        &kubectl_path,
        &dir.0.join("kubeconfig"),
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.addresses[?(@.type==\"InternalIP\")].address}",
        ],
        "",
    );
    let interface = address
        .trim()
        .parse()
        .ok()
        .and_then(NodeLink::host_interface_of)
        .unwrap_or_else(|| panic!("the node's InternalIP {address:?} is not a test node's"));
    let interface_path = Path::new("/sys/class/net").join(&interface);
    assert!(interface_path.exists(), "no {interface} on the host");
    let cgroups = cgroup_roots_of(cluster.pid).unwrap();
    assert!(!cgroups.is_empty(), "the node made no cgroup root");

    // SAFETY: kill(2) on the pid the cluster wrote, read back as outbox-cluster above.
    unsafe { libc::kill(cluster.pid as i32, libc::SIGKILL) };
    let gone = outbox_tests::wait::holds(
        "every process of the cluster is gone",
        Duration::from_secs(10),
        || async { tree.iter().all(|p| !p.still_there()) },
    )
    .await;
    let left: Vec<&Proc> = tree.iter().filter(|p| p.still_there()).collect();
    assert!(
        gone,
        "left running after kill -9 of outbox-cluster: {left:?}"
    );
    let unlinked = outbox_tests::wait::holds(
        "the node's interface is gone with its network namespace",
        Duration::from_secs(10),
        || async { !interface_path.exists() },
    )
    .await;
    assert!(unlinked, "{interface} is still on the host");
    let dir_text = dir.0.to_string_lossy().into_owned();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mounted: Vec<&str> = mounts.lines().filter(|l| l.contains(&dir_text)).collect();
    assert!(mounted.is_empty(), "mounts left on the host: {mounted:#?}");
    // What the next node's start does first.
    remove_stale_cgroups().unwrap();
    let left: Vec<_> = cgroups.iter().filter(|dir| dir.exists()).collect();
    assert!(left.is_empty(), "cgroups left after the sweep: {left:?}");
    let _ = std::fs::remove_dir_all(&dir.0);
}
