//! What the server is told about a relay session right after connect, so that no claim
//! outlives its relay by more than a stated bound (docs/reliability.md, "Partitions").
//!
//! A claim is a row lock held by one server session inside one transaction. If the relay's
//! process vanishes behind a silent partition (no RST, no FIN), nothing reaches the server any
//! more, and an `idle in transaction` session sends nothing either: the server would wait for
//! its kernel's keepalive, about two hours on Linux. The relay's own timers cannot help, since
//! the relay is the party that is gone. So every session sets, for itself:
//!
//! - `tcp_keepalives_idle`, `_interval`, `_count`: the server probes an idle relay connection
//!   and ends the session when the probes go unanswered, within `dead_client`;
//! - `tcp_user_timeout`: the same bound when the server has data in flight to the relay (the
//!   kernel does not probe a connection with unacknowledged data; it retransmits for ~15 min);
//! - `idle_in_transaction_session_timeout`: a relay that is alive but stalled inside a
//!   transaction (a paused process, a broker that never confirms) gives its rows back too.
//!
//! All are `user`-context settings, so no privilege is needed. They are sent as one `SET`
//! statement rather than the startup packet's `options`: PgBouncer refuses startup `options` it
//! does not track ("unsupported startup parameter"), while a `SET` passes through a session
//! pool. Under a transaction pool a `SET` would stay on a server session that other clients get
//! next, so none is sent there (the caller passes no bounds); the pooler's own
//! `idle_transaction_timeout` and keepalives do the job (docs/connecting-securely.md).
//!
//! A name the URL's own `options` parameter sets (`options=-c name=value`) is left to it.

use std::time::Duration;

use crate::connect::tcp_keepalive::Probes;
use crate::defaults;

/// How long the server lets a relay session be idle inside a transaction, and how long it
/// takes to notice that the relay's end of the connection is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionBounds {
    /// `idle_in_transaction_session_timeout`: above the longest legitimate wait inside a
    /// transaction (a batch's confirm wait, `--publish-timeout`).
    pub idle_in_transaction: Duration,
    /// Within this the server ends the session of a relay that vanished (keepalive probes and
    /// `tcp_user_timeout`).
    pub dead_client: Duration,
}

impl Default for SessionBounds {
    fn default() -> Self {
        Self {
            idle_in_transaction: defaults::IDLE_IN_TRANSACTION_TIMEOUT,
            dead_client: defaults::DEAD_CLIENT_TIMEOUT,
        }
    }
}

impl SessionBounds {
    /// The server's keepalive probes, ending within [`SessionBounds::dead_client`].
    pub fn keepalives(&self) -> Probes {
        Probes::within(self.dead_client)
    }

    /// The settings, as PostgreSQL names and values (units spelled out).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let keepalives = self.keepalives();
        vec![
            (
                "idle_in_transaction_session_timeout",
                format!("{}ms", self.idle_in_transaction.as_millis()),
            ),
            ("tcp_keepalives_idle", format!("{}s", keepalives.idle_s)),
            (
                "tcp_keepalives_interval",
                format!("{}s", keepalives.interval_s),
            ),
            ("tcp_keepalives_count", keepalives.count.to_string()),
            (
                "tcp_user_timeout",
                format!("{}ms", self.dead_client.as_millis()),
            ),
        ]
    }

    /// The statement that sets them on a new session, leaving out the names `url_options` (the
    /// URL's `options` startup parameter) already sets; None when nothing is left to set.
    pub fn statement(&self, url_options: Option<&str>) -> Option<String> {
        let given = option_names(url_options.unwrap_or_default());
        let sets: Vec<String> = self
            .settings()
            .into_iter()
            .filter(|(name, _)| !given.iter().any(|g| g == name))
            .map(|(name, value)| format!("SET {name} = '{value}'"))
            .collect();
        (!sets.is_empty()).then(|| sets.join("; "))
    }
}

/// The setting names of a libpq `options` string: `-c name=value`, `-cname=value` and
/// `--name=value`, with `-` in a name meaning `_` as the server reads it.
fn option_names(options: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut words = options.split_whitespace();
    while let Some(word) = words.next() {
        let assignment = if word == "-c" {
            words.next()
        } else if let Some(rest) = word.strip_prefix("--") {
            Some(rest)
        } else {
            word.strip_prefix("-c")
        };
        if let Some((name, _)) = assignment.and_then(|a| a.split_once('=')) {
            names.push(name.replace('-', "_").to_ascii_lowercase());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(idle_s: u64, dead_s: u64) -> SessionBounds {
        SessionBounds {
            idle_in_transaction: Duration::from_secs(idle_s),
            dead_client: Duration::from_secs(dead_s),
        }
    }

    #[test]
    fn the_server_probes_as_the_relay_does() {
        assert_eq!(
            bounds(30, 15).keepalives(),
            Probes {
                idle_s: 5,
                interval_s: 3,
                count: 3
            }
        );
    }

    #[test]
    fn one_statement_sets_every_bound_with_units() {
        let sql = bounds(30, 15).statement(None).unwrap();
        assert_eq!(
            sql,
            "SET idle_in_transaction_session_timeout = '30000ms'; \
             SET tcp_keepalives_idle = '5s'; SET tcp_keepalives_interval = '3s'; \
             SET tcp_keepalives_count = '3'; SET tcp_user_timeout = '15000ms'"
        );
    }

    #[test]
    fn what_the_url_options_set_is_left_to_them() {
        let sql = bounds(30, 15)
            .statement(Some(
                "-c idle_in_transaction_session_timeout=5000 -ctcp_user_timeout=1 \
                 --tcp-keepalives-idle=9 -c search_path=app",
            ))
            .unwrap();
        assert!(!sql.contains("idle_in_transaction"), "{sql}");
        assert!(!sql.contains("tcp_user_timeout"), "{sql}");
        assert!(!sql.contains("tcp_keepalives_idle"), "{sql}");
        assert!(sql.contains("tcp_keepalives_interval = '3s'"), "{sql}");
        let every = "-c idle_in_transaction_session_timeout=1 -c tcp_keepalives_idle=1 \
                     -c tcp_keepalives_interval=1 -c tcp_keepalives_count=1 -c tcp_user_timeout=1";
        assert_eq!(bounds(30, 15).statement(Some(every)), None);
    }
}
