//! Where the node sits on the host's network, as a machine of a cluster sits on its network:
//!
//! - The host answers on [`SERVICES_ADDRESS`] (see `crate::services`): the servers "outside
//!   the cluster" and the API server, as pods reach a managed database.
//! - Node `N` gets a veth pair: `outbox-nodeN` on the host, `eth0` in the node, with the node's
//!   address `10.213.N.2` and a default route through the host.
//! - Its pods get `10.244.N.0/24` on the CNI bridge inside the node; traffic leaving the node is
//!   masqueraded to the node's address (as a cloud network does for pods), and the host routes
//!   the pod subnet to the node, so a test reaches a pod's own IP and port.
//!
//! The index `N` is taken by creating the host's interface: the kernel refuses a second
//! `outbox-nodeN`, so concurrent nodes never share one. The pair vanishes with the node's
//! network namespace, and the host's routes through it with the pair.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::bail;

use super::command::output_of;
use super::sandbox::Sandbox;
use crate::services::SERVICES_ADDRESS;

/// The pods' addresses inside every node: `10.244.N.0/24`.
const POD_NETWORK: [u8; 2] = [10, 244];
/// The nodes' own addresses: `10.213.N.2`, beside the host's `10.213.0.1`.
const NODE_NETWORK: [u8; 2] = [10, 213];

/// The node's link to the host.
#[derive(Debug, Clone)]
pub struct NodeLink {
    pub index: u8,
    /// The host's end of the veth pair.
    pub host_interface: String,
}

impl NodeLink {
    /// The host's interface of the node at `node_address` (a node's `InternalIP`), or `None`
    /// for an address outside the nodes' network.
    pub fn host_interface_of(node_address: Ipv4Addr) -> Option<String> {
        let [a, b, index, 2] = node_address.octets() else {
            return None;
        };
        ([a, b] == NODE_NETWORK).then(|| host_interface_name(index))
    }

    pub fn node_address(&self) -> Ipv4Addr {
        Ipv4Addr::new(NODE_NETWORK[0], NODE_NETWORK[1], self.index, 2)
    }

    /// The pod subnet, `10.244.N.0/24`.
    pub fn pod_subnet(&self) -> String {
        format!("{}.{}.{}.0/24", POD_NETWORK[0], POD_NETWORK[1], self.index)
    }

    /// Connects the node's network namespace to the host: the veth pair, the addresses and
    /// routes on both ends, forwarding inside the node.
    pub fn attach(sandbox: &Sandbox) -> anyhow::Result<NodeLink> {
        let link = take_free_index(sandbox)?;
        let node = link.node_address().to_string();
        let services = SERVICES_ADDRESS.to_string();
        let host = link.host_interface.as_str();
        // `src` makes the host answer pods and the node from the services address.
        ip(&["link", "set", host, "up"])?;
        ip(&[
            "route",
            "add",
            &format!("{node}/32"),
            "dev",
            host,
            "src",
            &services,
        ])?;
        ip(&[
            "route",
            "add",
            &link.pod_subnet(),
            "via",
            &node,
            "dev",
            host,
            "src",
            &services,
        ])?;
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["addr", "add", &format!("{node}/32"), "dev", "eth0"],
            vec!["link", "set", "eth0", "up"],
            vec!["route", "add", &services, "dev", "eth0"],
            vec!["route", "add", "default", "via", &services, "dev", "eth0"],
        ] {
            sandbox.run("ip", &args)?;
        }
        // The node routes between its pods' bridge and eth0. Bridged pod traffic passes
        // iptables, so kube-proxy's Service rules apply between pods of one node too.
        sandbox.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        sandbox.run("sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=1"])?;
        Ok(link)
    }
}

/// Creates `outbox-nodeN` for the first free `N`, its peer moved into the node as `eth0`.
fn take_free_index(sandbox: &Sandbox) -> anyhow::Result<NodeLink> {
    let pid = sandbox.init_pid.to_string();
    for index in 1..=250u8 {
        let host_interface = host_interface_name(index);
        let output = Command::new("ip")
            .args(["link", "add", &host_interface, "type", "veth"])
            .args(["peer", "name", "eth0", "netns", &pid])
            .output()?;
        if output.status.success() {
            return Ok(NodeLink {
                index,
                host_interface,
            });
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !stderr.contains("File exists") {
            bail!("ip link add {host_interface} failed: {}", stderr.trim());
        }
    }
    bail!("all 250 node links (outbox-node1 to outbox-node250) are taken")
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let what = format!("ip {}", args.join(" "));
    output_of(
        Command::new("ip").args(args),
        &what,
        "Debian's iproute2 package",
    )?;
    Ok(())
}

fn host_interface_name(index: u8) -> String {
    format!("outbox-node{index}")
}
