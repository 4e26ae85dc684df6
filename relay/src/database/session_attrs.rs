//! libpq's `target_session_attrs`: which of the servers a URL lists a session may use, decided
//! from what the server says it is once connected. Pure: the query lives in the caller.

use std::fmt;
use std::str::FromStr;

/// The values libpq accepts, with its meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionAttrs {
    /// The first server that accepts the connection.
    Any,
    /// A server whose sessions accept writes (not in recovery, and `default_transaction_read_only`
    /// off).
    ReadWrite,
    /// A server whose sessions do not accept writes.
    ReadOnly,
    /// A server not in recovery.
    Primary,
    /// A server in recovery.
    Standby,
    /// A standby if any is reachable, else any server.
    PreferStandby,
}

/// What the server said about itself after the connection was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerRole {
    /// `pg_is_in_recovery()`: a standby (streaming, or still replaying after a restart).
    pub in_recovery: bool,
    /// `transaction_read_only` of a new session: a standby, or `default_transaction_read_only`.
    pub read_only: bool,
}

/// One pass over the host list: prefer-standby makes two, the first taking standbys only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    StandbysOnly,
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "target_session_attrs {value:?} is not one of any, read-write, read-only, primary, standby, \
     prefer-standby"
)]
pub struct UnknownAttrs {
    pub value: String,
}

impl SessionAttrs {
    pub const ALL: [SessionAttrs; 6] = [
        SessionAttrs::Any,
        SessionAttrs::ReadWrite,
        SessionAttrs::ReadOnly,
        SessionAttrs::Primary,
        SessionAttrs::Standby,
        SessionAttrs::PreferStandby,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SessionAttrs::Any => "any",
            SessionAttrs::ReadWrite => "read-write",
            SessionAttrs::ReadOnly => "read-only",
            SessionAttrs::Primary => "primary",
            SessionAttrs::Standby => "standby",
            SessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// Whether a session chosen this way can be written to: a relay, a migration and a seed
    /// need one; libpq's `any` is taken at its word.
    pub fn may_write(self) -> bool {
        matches!(
            self,
            SessionAttrs::Any | SessionAttrs::ReadWrite | SessionAttrs::Primary
        )
    }

    /// Whether the server must be asked what it is before the session is used.
    pub fn asks_the_server(self) -> bool {
        self != SessionAttrs::Any
    }

    pub fn passes(self) -> &'static [Pass] {
        match self {
            SessionAttrs::PreferStandby => &[Pass::StandbysOnly, Pass::Any],
            _ => &[Pass::Any],
        }
    }

    /// Whether a server of `role` may serve the session in `pass`.
    pub fn accepts(self, role: ServerRole, pass: Pass) -> bool {
        match (self, pass) {
            (_, Pass::StandbysOnly) => role.in_recovery,
            (SessionAttrs::Any | SessionAttrs::PreferStandby, Pass::Any) => true,
            (SessionAttrs::ReadWrite, Pass::Any) => !role.read_only,
            (SessionAttrs::ReadOnly, Pass::Any) => role.read_only,
            (SessionAttrs::Primary, Pass::Any) => !role.in_recovery,
            (SessionAttrs::Standby, Pass::Any) => role.in_recovery,
        }
    }
}

impl FromStr for SessionAttrs {
    type Err = UnknownAttrs;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|attrs| attrs.name() == text)
            .ok_or_else(|| UnknownAttrs { value: text.into() })
    }
}

impl fmt::Display for SessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl ServerRole {
    /// The role in words, for "HOST is …".
    pub fn describe(self) -> &'static str {
        match (self.in_recovery, self.read_only) {
            (true, _) => "a read-only standby (in recovery)",
            (false, true) => {
                "a primary whose sessions are read-only (default_transaction_read_only = on)"
            }
            (false, false) => "a primary accepting writes",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIMARY: ServerRole = ServerRole {
        in_recovery: false,
        read_only: false,
    };
    const STANDBY: ServerRole = ServerRole {
        in_recovery: true,
        read_only: true,
    };
    const READ_ONLY_PRIMARY: ServerRole = ServerRole {
        in_recovery: false,
        read_only: true,
    };

    #[test]
    fn each_value_keeps_libpqs_meaning() {
        use SessionAttrs::*;
        let table = [
            (Any, [true, true, true]),
            (ReadWrite, [true, false, false]),
            (ReadOnly, [false, true, true]),
            (Primary, [true, false, true]),
            (Standby, [false, true, false]),
            (PreferStandby, [true, true, true]),
        ];
        for (attrs, [primary, standby, ro_primary]) in table {
            assert_eq!(
                attrs.accepts(PRIMARY, Pass::Any),
                primary,
                "{attrs} on a primary"
            );
            assert_eq!(
                attrs.accepts(STANDBY, Pass::Any),
                standby,
                "{attrs} on a standby"
            );
            assert_eq!(
                attrs.accepts(READ_ONLY_PRIMARY, Pass::Any),
                ro_primary,
                "{attrs} on a read-only primary"
            );
            assert_eq!(attrs.name().parse::<SessionAttrs>().unwrap(), attrs);
        }
    }

    #[test]
    fn prefer_standby_looks_for_a_standby_first() {
        let attrs = SessionAttrs::PreferStandby;
        assert_eq!(attrs.passes(), [Pass::StandbysOnly, Pass::Any]);
        assert!(!attrs.accepts(PRIMARY, Pass::StandbysOnly));
        assert!(attrs.accepts(STANDBY, Pass::StandbysOnly));
        assert_eq!(SessionAttrs::ReadWrite.passes(), [Pass::Any]);
    }

    #[test]
    fn only_write_capable_choices_may_write() {
        let writable: Vec<_> = SessionAttrs::ALL
            .into_iter()
            .filter(|a| a.may_write())
            .map(SessionAttrs::name)
            .collect();
        assert_eq!(writable, ["any", "read-write", "primary"]);
        let err = "readwrite".parse::<SessionAttrs>().unwrap_err();
        assert!(err.to_string().contains("read-write, read-only"), "{err}");
    }
}
