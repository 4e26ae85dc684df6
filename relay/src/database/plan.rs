//! The hosts of a URL and how to choose among them (libpq's multi-host form), each host's
//! options resolved: what [`connect`](super::connect()) walks through. Pure.

use std::time::Duration;

use super::options::{self, Resolved, SettingsError};
use super::session_attrs::SessionAttrs;
use super::target::TlsMaterial;
use crate::connect::libpq_url::{self, HostList};
use crate::defaults;

/// One server of the list.
#[derive(Debug, Clone)]
pub struct Host {
    /// `host:port`, for messages.
    pub endpoint: String,
    pub resolved: Resolved,
}

#[derive(Debug, Clone)]
pub struct Plan {
    /// In the order the URL gives them.
    pub hosts: Vec<Host>,
    pub attrs: SessionAttrs,
    /// Per host; `None`: wait as long as the network does (`connect_timeout=0`).
    pub connect_timeout: Option<Duration>,
    /// `load_balance_hosts=random`: try the hosts in a random order (libpq 16).
    pub random_order: bool,
}

/// How the URL chooses among its hosts, without resolving them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub attrs: SessionAttrs,
    /// The URL set `target_session_attrs` itself.
    pub attrs_given: bool,
    pub connect_timeout: Option<Duration>,
    pub random_order: bool,
    pub hosts: usize,
}

/// Reads the choosing parameters of `url`.
pub fn choice(url: &str) -> Result<Choice, SettingsError> {
    let list = libpq_url::split(url).map_err(|e| SettingsError::Invalid {
        reason: e.to_string(),
    })?;
    choice_of(&list)
}

fn choice_of(list: &HostList) -> Result<Choice, SettingsError> {
    // libpq's default is `any`; a relay writes, so a session that cannot is refused before it
    // is used, whether one host is given or several (a stale DNS answer, a replica's URL).
    let attrs = match &list.target_session_attrs {
        Some(text) => text.parse().map_err(SettingsError::SessionAttrs)?,
        None => SessionAttrs::ReadWrite,
    };
    let connect_timeout = match list.connect_timeout.as_deref() {
        None => Some(defaults::DATABASE_CONNECT_TIMEOUT),
        Some(text) => match text.trim().parse::<u64>() {
            Ok(0) => None,
            // libpq treats 1 as 2: one second is too short for a TLS handshake and a login.
            Ok(seconds) => Some(Duration::from_secs(seconds.max(2))),
            Err(_) => {
                return Err(SettingsError::ConnectTimeout {
                    value: text.to_string(),
                });
            }
        },
    };
    let random_order = match list.load_balance_hosts.as_deref() {
        None | Some("disable") => false,
        Some("random") => true,
        Some(other) => {
            return Err(SettingsError::LoadBalanceHosts {
                value: other.to_string(),
            });
        }
    };
    Ok(Choice {
        attrs,
        attrs_given: list.target_session_attrs.is_some(),
        connect_timeout,
        random_order,
        hosts: list.hosts.len(),
    })
}

/// Every host of `url`, resolved with the password and the TLS material given.
pub fn plan(
    url: &str,
    password: Option<&str>,
    tls: Option<&TlsMaterial>,
) -> Result<Plan, SettingsError> {
    let list = libpq_url::split(url).map_err(|e| SettingsError::Invalid {
        reason: e.to_string(),
    })?;
    let choice = choice_of(&list)?;
    let hosts = list
        .hosts
        .iter()
        .map(|host| {
            let resolved = options::resolve(&host.url, password, tls)?;
            let endpoint = if host.endpoint.is_empty() {
                format!("{}:{}", resolved.host, resolved.options.get_port())
            } else {
                host.endpoint.clone()
            };
            Ok(Host { endpoint, resolved })
        })
        .collect::<Result<Vec<_>, SettingsError>>()?;
    Ok(Plan {
        hosts,
        attrs: choice.attrs,
        connect_timeout: choice.connect_timeout,
        random_order: choice.random_order,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_is_the_default_and_libpqs_values_are_taken() {
        let c = choice("postgres://app@h1,h2/db").unwrap();
        assert_eq!(
            (c.attrs, c.attrs_given, c.hosts),
            (SessionAttrs::ReadWrite, false, 2)
        );
        assert_eq!(c.connect_timeout, Some(defaults::DATABASE_CONNECT_TIMEOUT));
        let c = choice("postgres://app@h1/db?target_session_attrs=any&connect_timeout=1").unwrap();
        assert_eq!(c.attrs, SessionAttrs::Any);
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(2)));
        let c = choice("postgres://app@h1/db?connect_timeout=0&load_balance_hosts=random").unwrap();
        assert_eq!(c.connect_timeout, None);
        assert!(c.random_order);
    }

    #[test]
    fn bad_choices_name_the_parameter() {
        for (url, names) in [
            (
                "postgres://h/db?target_session_attrs=master",
                "target_session_attrs",
            ),
            ("postgres://h/db?connect_timeout=5s", "connect_timeout"),
            (
                "postgres://h/db?load_balance_hosts=roundrobin",
                "load_balance_hosts",
            ),
        ] {
            let err = choice(url).unwrap_err().to_string();
            assert!(err.contains(names), "{url}: {err}");
        }
    }

    #[test]
    fn each_host_is_resolved_with_the_shared_settings() {
        let plan = plan(
            "postgres://app:pw@h1:5432,h2:5433/db?sslmode=disable&application_name=billing",
            None,
            None,
        )
        .unwrap();
        let endpoints: Vec<&str> = plan.hosts.iter().map(|h| h.endpoint.as_str()).collect();
        assert_eq!(endpoints, ["h1:5432", "h2:5433"]);
        for host in &plan.hosts {
            assert_eq!(options::mode_name(host.resolved.mode), "disable");
            assert_eq!(
                host.resolved.options.get_application_name(),
                Some("billing")
            );
        }
        assert_eq!(plan.hosts[1].resolved.options.get_port(), 5433);
    }
}
