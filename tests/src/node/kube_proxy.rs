//! kube-proxy's configuration file (`kubeproxy.config.k8s.io/v1alpha1`): iptables mode, as most
//! clusters run it, so a pod reaches the `kubernetes` Service's ClusterIP and the operator's
//! in-cluster configuration works exactly as on a cluster. Its chains live in the node's own
//! network namespace.

use std::path::{Path, PathBuf};

use serde::Serialize;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub client_connection: ClientConnection,
    pub mode: &'static str,
    pub hostname_override: String,
    /// Traffic from outside this range to a Service is masqueraded.
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: String,
    pub metrics_bind_address: &'static str,
    pub healthz_bind_address: &'static str,
    /// Its default (-999) needs CAP_SYS_RESOURCE, which root lacks on these machines.
    pub oom_score_adj: i32,
    pub conntrack: Conntrack,
}

#[derive(Debug, Serialize)]
pub struct ClientConnection {
    pub kubeconfig: PathBuf,
}

/// Zero leaves the kernel's values alone: `nf_conntrack_max` is the machine's, not the node's.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conntrack {
    pub max_per_core: u32,
    pub min: u32,
    pub tcp_established_timeout: &'static str,
    pub tcp_close_wait_timeout: &'static str,
}

impl KubeProxyConfiguration {
    pub fn new(kubeconfig: &Path, node_name: &str, pod_subnet: &str) -> KubeProxyConfiguration {
        KubeProxyConfiguration {
            api_version: "kubeproxy.config.k8s.io/v1alpha1",
            kind: "KubeProxyConfiguration",
            client_connection: ClientConnection {
                kubeconfig: kubeconfig.to_path_buf(),
            },
            mode: "iptables",
            hostname_override: node_name.to_string(),
            cluster_cidr: pod_subnet.to_string(),
            metrics_bind_address: "127.0.0.1:10249",
            healthz_bind_address: "127.0.0.1:10256",
            oom_score_adj: 0,
            conntrack: Conntrack {
                max_per_core: 0,
                min: 0,
                tcp_established_timeout: "0s",
                tcp_close_wait_timeout: "0s",
            },
        }
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_vec_pretty(self)?)?;
        Ok(())
    }
}
