//! The kubelet's configuration file (`kubelet.config.k8s.io/v1beta1`), with what this node needs
//! beyond the kubelet's defaults, each for a stated reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub authentication: Authentication,
    pub authorization: Authorization,
    /// The serving certificate the API server verifies for `kubectl logs`, `exec` and
    /// `port-forward` (signed by the control plane's CA for the node's address).
    pub tls_cert_file: PathBuf,
    pub tls_private_key_file: PathBuf,
    pub container_runtime_endpoint: String,
    /// containerd 1.6 cannot tell the kubelet its cgroup driver; there is no systemd here.
    pub cgroup_driver: &'static str,
    /// This node's own root in every hierarchy (see `cgroups.rs`).
    pub cgroup_root: String,
    /// The machines have cgroup v1, which the kubelet refuses from 1.35 unless told.
    pub fail_cgroup_v1: bool,
    /// Under the node's directory, not /var/log/pods, which every node would share.
    pub pod_logs_dir: PathBuf,
    /// Likewise instead of /usr/libexec/kubernetes/kubelet-plugins.
    pub volume_plugin_dir: PathBuf,
    pub read_only_port: u16,
    /// No cluster DNS here: pods reach the servers and the API server by address.
    pub cluster_domain: &'static str,
    pub resolv_conf: &'static str,
    /// A build machine's disk may be fuller than the kubelet's defaults allow (15% free for
    /// images): it would evict the tests' pods and delete the imported images, which cannot
    /// be pulled again. Only real exhaustion counts here.
    pub eviction_hard: BTreeMap<&'static str, &'static str>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: u8,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: u8,
    /// Swap may be on; pods get none either way.
    pub fail_swap_on: bool,
    /// The kubelet wants to lower its own oom_score_adj, which needs CAP_SYS_RESOURCE.
    pub oom_score_adj: i32,
    /// Secret and ConfigMap volumes follow their objects at test speed (the kubelet's
    /// default is a minute).
    pub sync_frequency: &'static str,
    /// The node's status and lease as often as a real node's; the node lifecycle controller
    /// reads them.
    pub node_status_update_frequency: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Authentication {
    pub x509: X509,
    pub webhook: Enabled,
    pub anonymous: Enabled,
}

#[derive(Debug, Serialize)]
pub struct X509 {
    /// The API server presents a client certificate of this CA.
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Enabled {
    pub enabled: bool,
}

#[derive(Debug, Serialize)]
pub struct Authorization {
    /// Asks the API server (SubjectAccessReview), as kubeadm's nodes do.
    pub mode: &'static str,
}

/// Where the kubelet's files are, and what it runs on.
pub struct KubeletFiles<'a> {
    pub dir: &'a Path,
    pub ca: &'a Path,
    pub serving_cert: &'a Path,
    pub serving_key: &'a Path,
    pub containerd_socket: &'a Path,
    pub cgroup_root: &'a str,
}

impl KubeletConfiguration {
    pub fn new(files: &KubeletFiles<'_>) -> KubeletConfiguration {
        KubeletConfiguration {
            api_version: "kubelet.config.k8s.io/v1beta1",
            kind: "KubeletConfiguration",
            authentication: Authentication {
                x509: X509 {
                    client_ca_file: files.ca.to_path_buf(),
                },
                webhook: Enabled { enabled: true },
                anonymous: Enabled { enabled: false },
            },
            authorization: Authorization { mode: "Webhook" },
            tls_cert_file: files.serving_cert.to_path_buf(),
            tls_private_key_file: files.serving_key.to_path_buf(),
            container_runtime_endpoint: format!("unix://{}", files.containerd_socket.display()),
            cgroup_driver: "cgroupfs",
            cgroup_root: files.cgroup_root.to_string(),
            fail_cgroup_v1: false,
            pod_logs_dir: files.dir.join("pod-logs"),
            volume_plugin_dir: files.dir.join("volume-plugins"),
            read_only_port: 0,
            cluster_domain: "cluster.local",
            resolv_conf: "/etc/resolv.conf",
            eviction_hard: BTreeMap::from([
                ("memory.available", "50Mi"),
                ("nodefs.available", "1%"),
                ("nodefs.inodesFree", "1%"),
                ("imagefs.available", "1%"),
            ]),
            image_gc_high_threshold_percent: 100,
            image_gc_low_threshold_percent: 99,
            fail_swap_on: false,
            oom_score_adj: 0,
            sync_frequency: "5s",
            node_status_update_frequency: "10s",
        }
    }

    /// JSON, which the kubelet's YAML decoder reads.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_vec_pretty(self)?)?;
        Ok(())
    }
}
