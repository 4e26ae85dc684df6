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
    free_port().map(drop)
}

/// A port free on [`SERVICES_ADDRESS`] now; fails with the fix when the host lacks the address.
pub fn free_port() -> anyhow::Result<u16> {
    match std::net::TcpListener::bind((SERVICES_ADDRESS, 0)) {
        Ok(listener) => Ok(listener.local_addr()?.port()),
        Err(error) => anyhow::bail!(
            "the host has no address {SERVICES_ADDRESS} (interface {SERVICES_INTERFACE}), where the node, its pods and the API server meet: run ./scripts/services.sh ({error})"
        ),
    }
}

/// Runs `scripts/services.sh ARGS` (the one place that starts and stops servers); its stderr
/// comes back in the error.
pub async fn script(args: &[&str]) -> Result<(), String> {
    let output = tokio::process::Command::new(crate::repo_root().join("scripts/services.sh"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("run scripts/services.sh: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "scripts/services.sh {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// `url` as a pod reaches the same server: a loopback host (`127.0.0.1`, `::1`, `localhost`)
/// becomes [`SERVICES_ADDRESS`]; user, password, port, database and parameters stay as they
/// are (the URL is parsed, not edited as text). Any other host is left alone.
pub fn url_for_pods(url: &str) -> anyhow::Result<String> {
    let mut parsed = url::Url::parse(url).map_err(|e| anyhow::anyhow!("not a URL ({e})"))?;
    if matches!(
        parsed.host_str(),
        Some("127.0.0.1" | "[::1]" | "::1" | "localhost")
    ) {
        parsed
            .set_host(Some(&SERVICES_ADDRESS.to_string()))
            .map_err(|e| anyhow::anyhow!("cannot set the host of the URL ({e})"))?;
    }
    Ok(parsed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_become_the_services_address_and_the_rest_stays() {
        let cases = [
            (
                "postgres://u:p%40ss@127.0.0.1:6432/transaction?sslmode=verify-full",
                "postgres://u:p%40ss@10.213.0.1:6432/transaction?sslmode=verify-full",
            ),
            (
                "amqps://outbox_cert@localhost:5671/%2f?auth_mechanism=external",
                "amqps://outbox_cert@10.213.0.1:5671/%2f?auth_mechanism=external",
            ),
            (
                "amqp://outbox:outbox@[::1]:5673",
                "amqp://outbox:outbox@10.213.0.1:5673",
            ),
            (
                "postgres://db.example.com/app",
                "postgres://db.example.com/app",
            ),
        ];
        for (url, expected) in cases {
            assert_eq!(url_for_pods(url).unwrap(), expected, "{url}");
        }
    }
}
