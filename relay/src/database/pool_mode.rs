//! What sits between the relay and PostgreSQL, as the user declares it: a server session of the
//! relay's own (a direct connection, or a pooler in session mode), or a pooler in transaction
//! mode (PgBouncer `pool_mode = transaction`), which lends a server session for one transaction
//! at a time and hands the next transaction, or the next statement outside one, to whichever
//! session is free.
//!
//! Declared, not detected: a pooler does not say its pool mode in the protocol, and the first
//! sign of it (a prepared statement that already exists, or is gone) comes only when two clients
//! happen to share a server session, possibly after rows were claimed. See
//! docs/connecting-securely.md, "Behind a connection pooler".

/// What the database URL reaches: `session`, a server session of the relay's own (the server, or
/// a pooler in session mode), or `transaction`, a pooler in transaction mode (PgBouncer
/// `pool_mode = transaction`), where the relay sends unnamed statements inside transactions and
/// needs a session URL of its own for what takes a session (per-key ordering, LISTEN, the
/// migration's lock). Declared, not detected: a pooler does not tell its mode.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    /// Every connection is a server session of its own, for as long as it is open: named
    /// prepared statements (parsed once per connection), session advisory locks and LISTEN work.
    #[default]
    Session,
    /// Each transaction may run on another server session. The relay then sends unnamed
    /// statements, each inside a transaction (sqlx sends a Sync between Parse and Bind, and
    /// outside a transaction the pooler may give the Bind to another session), and keeps what
    /// needs a session (per-key lanes, LISTEN, the migration's lock) on `--session-database-url`.
    Transaction,
}

impl PoolMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }

    /// Whether statements may be named and kept prepared on the connection (sqlx's
    /// `persistent`): only when the connection is one server session for its whole life. Under
    /// transaction pooling a named statement stays on a server session other clients use next,
    /// where the driver's `sqlx_s_1` of another client collides with it.
    pub fn named_statements(self) -> bool {
        self == PoolMode::Session
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_session_keeps_named_statements() {
        assert!(PoolMode::default().named_statements());
        assert!(!PoolMode::Transaction.named_statements());
        assert_eq!(PoolMode::Transaction.as_str(), "transaction");
    }
}
