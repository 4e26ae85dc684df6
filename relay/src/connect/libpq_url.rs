//! libpq's multi-host URL form, which the driver does not parse (sqlx takes one host:
//! launchbadge/sqlx#179, open): `postgres://user@h1:5432,h2:5433/db?target_session_attrs=…`, and
//! the same hosts as the `host=h1,h2&port=5432,5433` query lists. This splits such a URL into
//! one single-host URL per host, in libpq's order, and takes out the parameters that choose
//! among them, which the driver neither knows nor needs. Pure text: no connection is made here.

use std::fmt;

/// The parameters that choose among the hosts, taken out of every single-host URL.
const CHOOSING: [&str; 5] = [
    "host",
    "port",
    "target_session_attrs",
    "connect_timeout",
    "load_balance_hosts",
];

/// libpq's default port.
const DEFAULT_PORT: u16 = 5432;

/// One host of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostUrl {
    /// The URL with this host only: for the driver. Holds the password: never shown.
    pub url: String,
    /// `host:port` (`[v6]:port`; a socket directory as it is), for messages.
    pub endpoint: String,
}

/// A URL split into its hosts.
#[derive(Clone, PartialEq, Eq)]
pub struct HostList {
    /// In the order given.
    pub hosts: Vec<HostUrl>,
    pub target_session_attrs: Option<String>,
    pub connect_timeout: Option<String>,
    pub load_balance_hosts: Option<String>,
}

impl fmt::Debug for HostList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The single-host URLs carry the password.
        let endpoints: Vec<&str> = self.hosts.iter().map(|h| h.endpoint.as_str()).collect();
        f.debug_struct("HostList")
            .field("hosts", &endpoints)
            .field("target_session_attrs", &self.target_session_attrs)
            .field("connect_timeout", &self.connect_timeout)
            .field("load_balance_hosts", &self.load_balance_hosts)
            .finish()
    }
}

/// Why a URL cannot be split. Never holds the URL (it may hold a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostListError {
    #[error("does not start with a scheme (postgres://)")]
    NoScheme,
    #[error("has an empty host in its host list (\"h1:5432,,h2\")")]
    EmptyHost,
    #[error("has port {port:?} for host {host}, which is not a port number")]
    BadPort { host: String, port: String },
    #[error(
        "names {hosts} hosts and {ports} ports: give one port for all hosts, or one per host, \
         in the same order"
    )]
    PortCount { hosts: usize, ports: usize },
    #[error("has an unclosed [ in an IPv6 host")]
    UnclosedBracket,
    #[error(
        "sets hostaddr with several hosts: the relay does not support hostaddr lists; give the \
         addresses as hosts"
    )]
    HostaddrList,
}

/// Splits `url` into its hosts. A single-host URL gives a list of one, the same URL without the
/// choosing parameters.
pub fn split(url: &str) -> Result<HostList, HostListError> {
    let (scheme, rest) = url.split_once("://").ok_or(HostListError::NoScheme)?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, host_text) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let (query, fragment) = match query.map(|q| q.split_once('#').unwrap_or((q, ""))) {
        Some((q, f)) => (q, f),
        None => ("", ""),
    };
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let param = |name: &str| {
        pairs
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, v)| v.clone())
    };

    // The query's lists win over the authority, as in libpq.
    let mut hosts: Vec<(String, Option<String>)> = match param("host") {
        Some(list) => list
            .split(',')
            .map(|h| (h.trim().to_string(), None))
            .collect(),
        None if host_text.is_empty() => Vec::new(),
        None => host_text
            .split(',')
            .map(split_host_port)
            .collect::<Result<_, _>>()?,
    };
    if hosts.iter().any(|(h, _)| h.is_empty()) {
        return Err(HostListError::EmptyHost);
    }
    if hosts.len() > 1 && param("hostaddr").is_some_and(|a| a.contains(',')) {
        return Err(HostListError::HostaddrList);
    }
    if let Some(ports) = param("port") {
        let ports: Vec<String> = ports.split(',').map(|p| p.trim().to_string()).collect();
        if hosts.is_empty() {
            // `?port=` alone: the driver's default host.
            hosts.push((String::new(), None));
        }
        match ports.len() {
            1 => hosts
                .iter_mut()
                .for_each(|(_, p)| *p = Some(ports[0].clone())),
            n if n == hosts.len() => hosts
                .iter_mut()
                .zip(ports)
                .for_each(|((_, p), port)| *p = Some(port)),
            n => {
                return Err(HostListError::PortCount {
                    hosts: hosts.len(),
                    ports: n,
                });
            }
        }
    }

    let kept: Vec<&(String, String)> = pairs
        .iter()
        .filter(|(key, _)| !CHOOSING.contains(&key.as_str()))
        .collect();
    let query_for = |socket: Option<&str>| {
        let mut out = url::form_urlencoded::Serializer::new(String::new());
        if let Some(dir) = socket {
            out.append_pair("host", dir);
        }
        for (key, value) in &kept {
            out.append_pair(key, value);
        }
        let text = out.finish();
        if text.is_empty() {
            String::new()
        } else {
            format!("?{text}")
        }
    };
    let fragment = if fragment.is_empty() {
        String::new()
    } else {
        format!("#{fragment}")
    };

    let mut list = Vec::with_capacity(hosts.len().max(1));
    if hosts.is_empty() {
        // No host at all: the URL as it is (the caller decides whether that is allowed).
        list.push(HostUrl {
            url: format!("{scheme}://{userinfo}{path}{}{fragment}", query_for(None)),
            endpoint: String::new(),
        });
    }
    for (host, port) in hosts {
        let port_text = port.filter(|p| !p.is_empty());
        let port = match &port_text {
            Some(text) => text.parse::<u16>().map_err(|_| HostListError::BadPort {
                host: host.clone(),
                port: text.clone(),
            })?,
            None => DEFAULT_PORT,
        };
        let (authority_host, socket) = if host.starts_with('/') {
            // A socket directory goes in the query, where the driver reads it.
            ("localhost".to_string(), Some(host.as_str()))
        } else {
            (host.clone(), None)
        };
        list.push(HostUrl {
            url: format!(
                "{scheme}://{userinfo}{authority_host}:{port}{path}{}{fragment}",
                query_for(socket)
            ),
            endpoint: format!("{host}:{port}"),
        });
    }
    Ok(HostList {
        hosts: list,
        target_session_attrs: param("target_session_attrs"),
        connect_timeout: param("connect_timeout"),
        load_balance_hosts: param("load_balance_hosts"),
    })
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`; the port as written (checked later).
fn split_host_port(spec: &str) -> Result<(String, Option<String>), HostListError> {
    let spec = spec.trim();
    if let Some(inner) = spec.strip_prefix('[') {
        let close = inner.find(']').ok_or(HostListError::UnclosedBracket)?;
        let host = format!("[{}]", &inner[..close]);
        let port = inner[close + 1..].strip_prefix(':').map(str::to_string);
        return Ok((host, port));
    }
    Ok(match spec.rsplit_once(':') {
        Some((host, port)) => (host.to_string(), Some(port.to_string())),
        None => (spec.to_string(), None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(list: &HostList) -> Vec<&str> {
        list.hosts.iter().map(|h| h.url.as_str()).collect()
    }

    #[test]
    fn one_host_stays_as_it_was_without_the_choosing_parameters() {
        let list = split("postgres://app:pw@db:6000/orders?sslmode=require").unwrap();
        assert_eq!(
            urls(&list),
            ["postgres://app:pw@db:6000/orders?sslmode=require"]
        );
        assert_eq!(list.hosts[0].endpoint, "db:6000");
        let list = split("postgresql://app@db/orders?target_session_attrs=primary").unwrap();
        assert_eq!(urls(&list), ["postgresql://app@db:5432/orders"]);
        assert_eq!(list.target_session_attrs.as_deref(), Some("primary"));
    }

    #[test]
    fn the_authority_list_keeps_its_order_and_each_port() {
        let list = split(
            "postgres://app:p%40ss@h1:5432,h2:5433,h3/db?target_session_attrs=read-write\
             &connect_timeout=3&sslmode=verify-full",
        )
        .unwrap();
        assert_eq!(
            urls(&list),
            [
                "postgres://app:p%40ss@h1:5432/db?sslmode=verify-full",
                "postgres://app:p%40ss@h2:5433/db?sslmode=verify-full",
                "postgres://app:p%40ss@h3:5432/db?sslmode=verify-full",
            ]
        );
        assert_eq!(list.connect_timeout.as_deref(), Some("3"));
        assert_eq!(list.target_session_attrs.as_deref(), Some("read-write"));
    }

    #[test]
    fn the_query_lists_match_ports_to_hosts_as_libpq_does() {
        let list = split("postgres://app@/db?host=h1,h2&port=5432,5433").unwrap();
        let endpoints: Vec<&str> = list.hosts.iter().map(|h| h.endpoint.as_str()).collect();
        assert_eq!(endpoints, ["h1:5432", "h2:5433"]);
        let list = split("postgres://app@h1,h2/db?port=6432").unwrap();
        assert!(list.hosts.iter().all(|h| h.endpoint.ends_with(":6432")));
        let err = split("postgres://app@/db?host=h1,h2,h3&port=1,2").unwrap_err();
        assert_eq!(err, HostListError::PortCount { hosts: 3, ports: 2 });
        assert!(err.to_string().contains("one port for all hosts"));
    }

    #[test]
    fn ipv6_hosts_and_socket_directories() {
        let list = split("postgres://app@[::1]:5433,[fe80::1]/db").unwrap();
        assert_eq!(list.hosts[0].endpoint, "[::1]:5433");
        assert_eq!(list.hosts[1].url, "postgres://app@[fe80::1]:5432/db");
        let list = split("postgres://app@/db?host=/run/postgresql").unwrap();
        assert_eq!(
            list.hosts[0].url,
            "postgres://app@localhost:5432/db?host=%2Frun%2Fpostgresql"
        );
    }

    #[test]
    fn mistakes_are_named_without_the_password() {
        for (url, want) in [
            ("postgres://app:s3cret@h1,,h2/db", HostListError::EmptyHost),
            (
                "postgres://app:s3cret@h1:54x2,h2/db",
                HostListError::BadPort {
                    host: "h1".into(),
                    port: "54x2".into(),
                },
            ),
            (
                "postgres://app:s3cret@[::1/db",
                HostListError::UnclosedBracket,
            ),
            ("app:s3cret@h1", HostListError::NoScheme),
        ] {
            let err = split(url).unwrap_err();
            assert_eq!(err, want, "{url}");
            assert!(!err.to_string().contains("s3cret"));
        }
        let list = split("postgres://app:s3cret@h1,h2/db").unwrap();
        assert!(!format!("{list:?}").contains("s3cret"));
    }
}
