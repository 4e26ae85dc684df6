//! Where the servers `scripts/services.sh` starts can be reached from inside a cluster.
//!
//! Tests on the host reach PostgreSQL, PgBouncer, RabbitMQ and Artemis on 127.0.0.1. Pods and
//! the test node cannot: they have network namespaces of their own. So services.sh gives the
//! host a second address, [`SERVICES_ADDRESS`] on the `outbox-services` interface, makes the
//! servers listen on it too and lets it in through pg_hba, as a managed database outside a
//! cluster is reached by an address routed to it. The control plane's API server listens on it
//! as well, so the node's kubelet and the pods' in-cluster clients reach the API server.

use std::net::Ipv4Addr;

/// The host's address that nodes and pods reach.
pub const SERVICES_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
/// The host interface holding [`SERVICES_ADDRESS`] (a bridge without ports: this kernel has no
/// `dummy` interfaces), made by `scripts/services.sh`.
pub const SERVICES_INTERFACE: &str = "outbox-services";

/// Fails with the fix when the host does not have [`SERVICES_ADDRESS`] (services.sh not run
/// since the machine started).
pub fn check_address() -> anyhow::Result<()> {
    match std::net::TcpListener::bind((SERVICES_ADDRESS, 0)) {
        Ok(_) => Ok(()),
        Err(error) => anyhow::bail!(
            "the host has no address {SERVICES_ADDRESS} (interface {SERVICES_INTERFACE}), where the node, its pods and the API server meet: run ./scripts/services.sh ({error})"
        ),
    }
}
