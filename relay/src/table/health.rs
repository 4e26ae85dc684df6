//! Table health: what keeps VACUUM from cleaning the outbox table, and how far behind it is.
//!
//! A SKIP LOCKED queue does not usually fail in the relay: a long transaction, an abandoned
//! replication slot or a forgotten prepared transaction holds back the database's cleanup
//! horizon, dead rows pile up at the head of the pending index, and every claim slows. The
//! measuring pod reads, with the privileges of an ordinary application role:
//!
//! - the **horizon holder**: of every backend snapshot (`backend_xmin`), transaction id
//!   (`backend_xid`), prepared transaction and replication-slot `xmin` that can hold back this
//!   table, the oldest (by transaction-id age). Backends of other databases are left out: since
//!   PostgreSQL 14 they do not hold back a table of this one (walsenders do, and are kept).
//!   `pg_stat_activity` shows the pid, application name and xids of every session to every
//!   role, but the state and start time only of the role's own sessions (or with
//!   `pg_read_all_stats`): for another role's session the age in seconds is then "at least
//!   since this process first saw it", and [`TableHealth::hidden_holder`] says so;
//! - dead and live tuples and the last (auto)vacuum from `pg_stat_all_tables`, the pending
//!   index's size, and whether autovacuum runs for the server and for the table.

use std::fmt;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use crate::database::PoolMode;
use crate::table::inspect::SERVER_AUTOVACUUM_SQL;
use crate::table::outbox::OutboxTable;

/// One measure of the table's health, as stored in the report table's `table_health` column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableHealth {
    /// The oldest holder of the cleanup horizon; `None` when no other session holds a snapshot
    /// or transaction id at this moment.
    pub horizon: Option<HorizonHolder>,
    pub dead_tuples: Option<i64>,
    pub live_tuples: Option<i64>,
    /// Seconds since the later of the last VACUUM and autovacuum; `None` for never.
    pub last_vacuum_age_seconds: Option<f64>,
    /// Bytes of the pending-rows index; `None` when it does not exist (yet).
    pub pending_index_bytes: Option<i64>,
    pub server_autovacuum: bool,
    /// `autovacuum_enabled` is not set to false on the table.
    pub table_autovacuum: bool,
    /// The server's `server_version_num`, e.g. 160004 for 16.4; `None` in a report written by an
    /// older relay, or when the table was gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version_num: Option<i32>,
}

impl TableHealth {
    /// The horizon's age in seconds, 0 when nothing holds it.
    pub fn horizon_age_seconds(&self) -> f64 {
        self.horizon.as_ref().map_or(0.0, |h| h.age_seconds)
    }

    /// The server's version as people write it (`16.4`, `13.23`), from `server_version_num`:
    /// `SHOW server_version` may carry a packager's suffix (`15.18 (Debian 15.18-0+deb12u1)`).
    pub fn server_version(&self) -> Option<String> {
        self.server_version_num
            .map(|n| format!("{}.{}", n / 10_000, n % 10_000))
    }

    /// The holder, when this role may not see its state and start time.
    pub fn hidden_holder(&self) -> Option<&HorizonHolder> {
        self.horizon.as_ref().filter(|h| !h.visible)
    }
}

/// What holds the horizon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderKind {
    /// A session's snapshot (`backend_xmin`): typically a REPEATABLE READ or SERIALIZABLE
    /// transaction left open, or a long query.
    Snapshot,
    /// A session's transaction id (`backend_xid`): a transaction that wrote and is still open.
    Transaction,
    PreparedTransaction,
    ReplicationSlot,
    /// A kind a newer relay wrote.
    #[serde(other)]
    Other,
}

impl HolderKind {
    pub fn label(self) -> &'static str {
        match self {
            HolderKind::Snapshot => "snapshot",
            HolderKind::Transaction => "transaction",
            HolderKind::PreparedTransaction => "prepared transaction",
            HolderKind::ReplicationSlot => "replication slot",
            HolderKind::Other => "other",
        }
    }

    fn from_sql(kind: &str) -> Self {
        match kind {
            "snapshot" => HolderKind::Snapshot,
            "transaction" => HolderKind::Transaction,
            "prepared_transaction" => HolderKind::PreparedTransaction,
            "replication_slot" => HolderKind::ReplicationSlot,
            _ => HolderKind::Other,
        }
    }
}

/// The holder of the cleanup horizon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HorizonHolder {
    pub kind: HolderKind,
    /// The session's pid (for a slot, the pid of the walsender using it, if any).
    pub pid: Option<i32>,
    /// The application name of a session, the gid of a prepared transaction, a slot's name.
    pub name: Option<String>,
    pub user: Option<String>,
    /// `idle in transaction`, `active`, …; a slot's `active`/`inactive`.
    pub state: Option<String>,
    /// The xid that holds the horizon, as text (for telling one holder from the next).
    pub xid: String,
    /// Transaction ids between the horizon and the next one.
    pub age_xids: i64,
    /// How long it has held the horizon. Dated by PostgreSQL (the transaction's start, the
    /// PREPARE) when this role may see that; otherwise since this process first saw it.
    pub age_seconds: f64,
    /// This role may see the session's state and start time (its own, or `pg_read_all_stats`).
    pub visible: bool,
}

impl fmt::Display for HorizonHolder {
    /// `pid 4242 (application "billing-report", user app, idle in transaction) holds a
    /// snapshot` — the words the operator's message and the log use.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut about = Vec::new();
        let name_label = match self.kind {
            HolderKind::PreparedTransaction => "gid",
            HolderKind::ReplicationSlot => "slot",
            _ => "application",
        };
        if let Some(name) = self.name.as_deref().filter(|n| !n.is_empty()) {
            about.push(format!("{name_label} {name:?}"));
        }
        if let Some(user) = &self.user {
            about.push(format!("user {user}"));
        }
        if let Some(state) = &self.state {
            about.push(state.clone());
        }
        let who = match self.pid {
            Some(pid) => format!("pid {pid}"),
            None => "a".to_string(),
        };
        let about = if about.is_empty() {
            String::new()
        } else {
            format!(" ({})", about.join(", "))
        };
        let kind = self.kind.label();
        match self.kind {
            HolderKind::Snapshot | HolderKind::Transaction | HolderKind::Other => {
                write!(f, "{who}{about} holds a {kind}")
            }
            HolderKind::PreparedTransaction | HolderKind::ReplicationSlot => match self.pid {
                Some(pid) => write!(f, "a {kind}{about} used by pid {pid}"),
                None => write!(f, "a {kind}{about}"),
            },
        }
    }
}

/// Remembers since when the current holder has been seen, to date a holder PostgreSQL does
/// not date for this role. One per measuring session.
#[derive(Debug, Default)]
pub struct HorizonClock {
    seen: Option<(String, Instant)>,
}

impl HorizonClock {
    fn first_seen(&mut self, key: String, now: Instant) -> Instant {
        match &self.seen {
            Some((seen_key, since)) if *seen_key == key => *since,
            _ => {
                self.seen = Some((key, now));
                now
            }
        }
    }
}

const HOLDER_SQL: &str = "\
WITH sessions AS (
  SELECT pid, application_name, usename::text AS usr, state, xact_start, backend_xid, backend_xmin,
         coalesce(pg_has_role(usesysid, 'USAGE'), false)
           OR pg_has_role('pg_read_all_stats', 'USAGE') AS visible
  FROM pg_stat_activity
  WHERE pid <> pg_backend_pid()
    AND (datname = current_database() OR backend_type = 'walsender')
), holders AS (
  SELECT 'transaction' AS kind, pid, application_name AS name, usr, state, xact_start AS since,
         backend_xid AS xid, visible FROM sessions WHERE backend_xid IS NOT NULL
  UNION ALL
  SELECT 'snapshot', pid, application_name, usr, state, xact_start, backend_xmin, visible
  FROM sessions WHERE backend_xmin IS NOT NULL
  UNION ALL
  SELECT 'prepared_transaction', NULL, gid, owner::text, NULL, prepared, transaction, true
  FROM pg_prepared_xacts WHERE database = current_database()
  UNION ALL
  SELECT 'replication_slot', active_pid, slot_name::text, NULL,
         CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL, xmin, true
  FROM pg_replication_slots WHERE xmin IS NOT NULL
)
SELECT kind, pid, name, usr, state, xid::text AS xid, age(xid)::bigint AS age_xids,
       extract(epoch FROM now() - since)::float8 AS dated_seconds, visible
FROM holders ORDER BY age(xid) DESC, since NULLS LAST LIMIT 1";

#[derive(sqlx::FromRow)]
struct HolderRow {
    kind: String,
    pid: Option<i32>,
    name: Option<String>,
    usr: Option<String>,
    state: Option<String>,
    xid: String,
    age_xids: i64,
    /// NULL when PostgreSQL does not date it for this role (or a slot, which has no start).
    dated_seconds: Option<f64>,
    visible: bool,
}

#[derive(sqlx::FromRow)]
struct StatsRow {
    dead_tuples: Option<i64>,
    live_tuples: Option<i64>,
    last_vacuum_age_seconds: Option<f64>,
    pending_index_bytes: Option<i64>,
    server_autovacuum: bool,
    table_autovacuum: bool,
    server_version_num: Option<i32>,
}

/// Measures the health of `table` now. `clock` dates holders PostgreSQL does not date.
pub async fn measure_table_health(
    conn: &mut PgConnection,
    table: &OutboxTable,
    clock: &mut HorizonClock,
) -> Result<TableHealth, sqlx::Error> {
    measure_table_health_with(conn, table, clock, PoolMode::Session).await
}

/// [`measure_table_health`] over a connection that reaches `pool_mode`; under a transaction
/// pool the caller runs it inside a transaction, since its statements then go unnamed.
pub async fn measure_table_health_with(
    conn: &mut PgConnection,
    table: &OutboxTable,
    clock: &mut HorizonClock,
    pool_mode: PoolMode,
) -> Result<TableHealth, sqlx::Error> {
    let persistent = pool_mode.named_statements();
    let row: Option<HolderRow> = sqlx::query_as(HOLDER_SQL)
        .persistent(persistent)
        .fetch_optional(&mut *conn)
        .await?;
    let now = Instant::now();
    let horizon = row.map(|row| {
        let kind = HolderKind::from_sql(&row.kind);
        let key = format!("{kind:?}/{:?}/{:?}/{}", row.pid, row.name, row.xid);
        let seen_for = now.duration_since(clock.first_seen(key, now)).as_secs_f64();
        HorizonHolder {
            kind,
            pid: row.pid,
            name: row.name,
            user: row.usr,
            state: row.state,
            xid: row.xid,
            age_xids: row.age_xids,
            age_seconds: row.dated_seconds.unwrap_or(seen_for).max(0.0),
            visible: row.visible,
        }
    });
    if horizon.is_none() {
        clock.seen = None;
    }

    let index_names: Vec<String> = [false, true]
        .into_iter()
        .map(|covering_index| table.pending_index(covering_index).as_str().to_string())
        .collect();
    let sql = format!(
        "SELECT s.n_dead_tup AS dead_tuples, s.n_live_tup AS live_tuples, \
                extract(epoch FROM now() - greatest(s.last_vacuum, s.last_autovacuum))::float8 \
                  AS last_vacuum_age_seconds, \
                (SELECT sum(pg_relation_size(i.indexrelid))::bigint FROM pg_index i \
                   JOIN pg_class ic ON ic.oid = i.indexrelid \
                   WHERE i.indrelid = c.oid AND ic.relname = ANY($2)) AS pending_index_bytes, \
                {SERVER_AUTOVACUUM_SQL} AS server_autovacuum, \
                coalesce((SELECT option_value::bool FROM pg_options_to_table(c.reloptions) \
                          WHERE option_name = 'autovacuum_enabled'), true) AS table_autovacuum, \
                current_setting('server_version_num')::int AS server_version_num \
         FROM pg_class c LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid \
         WHERE c.oid = to_regclass($1)"
    );
    let stats: Option<StatsRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(table.name.quoted())
        .bind(&index_names)
        .persistent(persistent)
        .fetch_optional(&mut *conn)
        .await?;
    // The table was dropped since the start: nothing to say about it, nothing on.
    let stats = stats.unwrap_or(StatsRow {
        dead_tuples: None,
        live_tuples: None,
        last_vacuum_age_seconds: None,
        pending_index_bytes: None,
        server_autovacuum: false,
        table_autovacuum: false,
        server_version_num: None,
    });
    Ok(TableHealth {
        horizon,
        dead_tuples: stats.dead_tuples,
        live_tuples: stats.live_tuples,
        last_vacuum_age_seconds: stats.last_vacuum_age_seconds,
        pending_index_bytes: stats.pending_index_bytes,
        server_autovacuum: stats.server_autovacuum,
        table_autovacuum: stats.table_autovacuum,
        server_version_num: stats.server_version_num,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_version_reads_as_people_write_it() {
        let mut health = TableHealth {
            horizon: None,
            dead_tuples: None,
            live_tuples: None,
            last_vacuum_age_seconds: None,
            pending_index_bytes: None,
            server_autovacuum: true,
            table_autovacuum: true,
            server_version_num: Some(130_023),
        };
        assert_eq!(health.server_version().as_deref(), Some("13.23"));
        health.server_version_num = Some(180_000);
        assert_eq!(health.server_version().as_deref(), Some("18.0"));
        // A report an older relay wrote has no version, and reads back without one.
        let older: TableHealth = serde_json::from_str(
            r#"{"horizon":null,"dead_tuples":1,"live_tuples":2,"last_vacuum_age_seconds":null,
                "pending_index_bytes":null,"server_autovacuum":true,"table_autovacuum":true}"#,
        )
        .unwrap();
        assert_eq!(older.server_version(), None);
    }

    fn holder(kind: HolderKind) -> HorizonHolder {
        HorizonHolder {
            kind,
            pid: Some(4242),
            name: Some("billing-report".into()),
            user: Some("app".into()),
            state: Some("idle in transaction".into()),
            xid: "1234".into(),
            age_xids: 10,
            age_seconds: 60.0,
            visible: true,
        }
    }

    #[test]
    fn a_holder_is_named_the_way_a_person_finds_it() {
        assert_eq!(
            holder(HolderKind::Snapshot).to_string(),
            "pid 4242 (application \"billing-report\", user app, idle in transaction) holds a snapshot"
        );
        let slot = HorizonHolder {
            pid: None,
            name: Some("standby_1".into()),
            user: None,
            state: Some("inactive".into()),
            ..holder(HolderKind::ReplicationSlot)
        };
        assert_eq!(
            slot.to_string(),
            "a replication slot (slot \"standby_1\", inactive)"
        );
    }

    #[test]
    fn the_clock_dates_a_holder_from_when_it_was_first_seen() {
        let mut clock = HorizonClock::default();
        let start = Instant::now();
        let later = start + std::time::Duration::from_secs(30);
        assert_eq!(clock.first_seen("a".into(), start), start);
        assert_eq!(clock.first_seen("a".into(), later), start);
        assert_eq!(clock.first_seen("b".into(), later), later);
    }

    #[test]
    fn a_kind_from_a_newer_relay_is_read_as_other() {
        let read: HolderKind = serde_json::from_str("\"lunar_eclipse\"").unwrap();
        assert_eq!(read, HolderKind::Other);
        let stored = serde_json::to_string(&HolderKind::PreparedTransaction).unwrap();
        assert_eq!(stored, "\"prepared_transaction\"");
    }
}
