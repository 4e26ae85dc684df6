//! The pod network inside the node: the CNI bridge plugin with host-local addresses (Debian's
//! containernetworking-plugins), as simple clusters and kind use. containerd's CRI plugin runs
//! it for every pod sandbox.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// A CNI network configuration list (`.conflist`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkList {
    pub cni_version: String,
    pub name: String,
    /// Only the bridge: no pod here asks for a hostPort, so no portmap plugin.
    pub plugins: Vec<Bridge>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bridge {
    #[serde(rename = "type")]
    pub kind: String,
    pub bridge: String,
    /// The bridge holds the subnet's first address, the pods' default gateway.
    pub is_gateway: bool,
    /// Pod traffic leaving the subnet leaves with the node's address.
    pub ip_masq: bool,
    /// A pod reaches itself through a Service that picks it.
    pub hairpin_mode: bool,
    pub ipam: HostLocal,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostLocal {
    #[serde(rename = "type")]
    pub kind: String,
    /// Where host-local records the addresses it gave out (by default /var/lib/cni, which
    /// every node of the machine would share).
    pub data_dir: PathBuf,
    pub ranges: Vec<Vec<Range>>,
    pub routes: Vec<Route>,
}

#[derive(Debug, Serialize)]
pub struct Range {
    pub subnet: String,
}

#[derive(Debug, Serialize)]
pub struct Route {
    pub dst: String,
}

impl NetworkList {
    /// Pods on bridge `cni0` with addresses from `subnet`, their allocations under `dir`.
    pub fn bridge(subnet: &str, dir: &Path) -> NetworkList {
        NetworkList {
            cni_version: "0.4.0".into(),
            name: "outbox-pods".into(),
            plugins: vec![Bridge {
                kind: "bridge".into(),
                bridge: "cni0".into(),
                is_gateway: true,
                ip_masq: true,
                hairpin_mode: true,
                ipam: HostLocal {
                    kind: "host-local".into(),
                    data_dir: dir.join("ipam"),
                    ranges: vec![vec![Range {
                        subnet: subnet.to_string(),
                    }]],
                    routes: vec![Route {
                        dst: "0.0.0.0/0".into(),
                    }],
                },
            }],
        }
    }

    /// Writes the list as the only file of `conf_dir`, which containerd reads.
    pub fn write(&self, conf_dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(conf_dir)?;
        std::fs::write(
            conf_dir.join("10-outbox-pods.conflist"),
            serde_json::to_vec_pretty(self)?,
        )?;
        Ok(())
    }
}
