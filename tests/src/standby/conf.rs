//! The settings a standby pair's servers are made with, as text: what the template's
//! `postgresql.conf` and `pg_hba.conf` gain, each server's `outbox-pair.conf` (its port, and
//! whom it waits for), and the name a standby gives the primary. Pure, so the recipe can be read
//! (and hashed into the template's cache key) in one place.

use std::net::Ipv4Addr;

use crate::services::SERVICES_ADDRESS;

/// Written in a pair's folder (and a template's) when it is made: only a folder holding it is
/// ever removed.
pub const MARK: &str = ".outbox-standby-pair";

/// The per-server settings file, included by the template's `postgresql.conf`: pg_basebackup
/// copies it and each server rewrites it.
pub const PAIR_CONF: &str = "outbox-pair.conf";

/// The name the standby connects to the primary with, which the primary's
/// `synchronous_standby_names` waits for.
pub const STANDBY_NAME: &str = "replica1";

/// Where the servers listen besides the pods' address: loopback only.
pub const HOST: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// The tests' nodes and their pods: the /16 of the services address (scripts/services/common.sh's
/// NODES_NETWORK), trusted like the services address itself.
fn nodes_network() -> String {
    let [a, b, _, _] = SERVICES_ADDRESS.octets();
    format!("{a}.{b}.0.0/16")
}

/// What the template's `postgresql.conf` gains. TCP only, so pairs never share a socket
/// folder; on the services address too, for the pods of the tests' cluster (a server that
/// cannot bind it, on a host without it, warns and goes on). No fsync: throw-away servers (a
/// killed server's writes are in the page cache, which the standby's tests need).
pub fn template_settings() -> String {
    [
        "# outbox-relay standby pair (tests/src/standby.rs)".to_string(),
        format!("listen_addresses = '{HOST},{SERVICES_ADDRESS}'"),
        "unix_socket_directories = ''".into(),
        "max_connections = 100".into(),
        "shared_buffers = 32MB".into(),
        "fsync = off".into(),
        "wal_level = replica".into(),
        "max_wal_senders = 5".into(),
        "wal_keep_size = 64MB".into(),
        "synchronous_commit = on".into(),
        "hot_standby = on".into(),
        format!("include_if_exists = '{PAIR_CONF}'"),
    ]
    .map(|line| line + "\n")
    .concat()
}

/// What the template's `pg_hba.conf` gains: the pods are trusted, as on the tests' main server.
pub fn template_hba() -> String {
    format!(
        "host all all {} trust # outbox-relay pods trust\n\
         host all all {SERVICES_ADDRESS}/32 trust # outbox-relay pods trust\n",
        nodes_network()
    )
}

/// The `outbox-pair.conf` of a primary on `port`: it waits for the standby's flush at every
/// commit (`synchronous_commit = on`).
pub fn primary_conf(port: u16) -> String {
    format!("port = {port}\nsynchronous_standby_names = 'FIRST 1 ({STANDBY_NAME})'\n")
}

/// The `outbox-pair.conf` of a standby on `port`. Written before its first start: once
/// promoted, a standby that still named a synchronous standby would hold every commit waiting
/// for one that does not exist.
pub fn standby_conf(port: u16) -> String {
    format!("port = {port}\nsynchronous_standby_names = ''\n")
}

/// `postgresql.auto.conf` as pg_basebackup -R wrote it, with the standby's `primary_conninfo`
/// naming it [`STANDBY_NAME`]; `None` when it has no `primary_conninfo` line.
pub fn name_the_standby(auto_conf: &str) -> Option<String> {
    const SETTING: &str = "primary_conninfo = '";
    let mut found = false;
    let lines: Vec<String> = auto_conf
        .lines()
        .map(|line| match line.strip_prefix(SETTING) {
            Some(rest) => {
                found = true;
                format!("{SETTING}application_name={STANDBY_NAME} {rest}")
            }
            None => line.to_string(),
        })
        .collect();
    found.then(|| lines.iter().map(|line| format!("{line}\n")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_listens_on_loopback_and_the_pods_address_and_trusts_the_pods() {
        let settings = template_settings();
        assert!(
            settings.contains("listen_addresses = '127.0.0.1,10.213.0.1'\n"),
            "{settings}"
        );
        assert!(settings.ends_with("include_if_exists = 'outbox-pair.conf'\n"));
        let hba = template_hba();
        assert!(hba.starts_with("host all all 10.213.0.0/16 trust"), "{hba}");
        assert!(hba.contains("host all all 10.213.0.1/32 trust"), "{hba}");
    }

    #[test]
    fn the_primary_waits_for_replica1_and_the_standby_for_nobody() {
        assert_eq!(
            primary_conf(5441),
            "port = 5441\nsynchronous_standby_names = 'FIRST 1 (replica1)'\n"
        );
        assert_eq!(
            standby_conf(5442),
            "port = 5442\nsynchronous_standby_names = ''\n"
        );
    }

    #[test]
    fn the_standby_connects_as_replica1_and_a_file_without_conninfo_is_refused() {
        let written = "# Do not edit this file manually!\n\
                       primary_conninfo = 'user=postgres host=127.0.0.1 port=5441'\n";
        assert_eq!(
            name_the_standby(written).unwrap(),
            "# Do not edit this file manually!\n\
             primary_conninfo = 'application_name=replica1 user=postgres host=127.0.0.1 port=5441'\n"
        );
        assert_eq!(name_the_standby("# nothing\n"), None);
    }
}
