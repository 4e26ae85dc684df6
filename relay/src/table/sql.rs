//! The SQL text of the table protocol, built once per table from validated, quoted
//! identifiers. Values are always bound (`$1`, `$2`, …), never formatted in.

use std::sync::Arc;

use crate::table::inspect::{PayloadKind, TableShape};
use crate::table::outbox::{DeliveryMode, DeliveryOrder, OutboxTable};

/// The names of the claim's output columns: every row decodes into the same shape whatever is
/// mapped, and the protocol reads the columns by these names.
pub mod columns {
    pub const ID: &str = "id";
    pub const KIND: &str = "kind";
    pub const PAYLOAD: &str = "payload";
    pub const OCCURRED_AT: &str = "occurred_at";
    pub const ROUTING_KEY: &str = "routing_key";
    pub const HEADERS: &str = "headers";
    pub const ATTEMPTS: &str = "attempts";
    pub const PARTITION_KEY: &str = "partition_key";
    /// Only in per-key claims: the row's lane, so a worker knows which keys go with a lane.
    pub const LANE: &str = "lane";
}

/// Per-key ordering hashes every partition key into one of this many lanes; a lane is claimed
/// by one worker at a time (`runtime::lanes`). A power of two, so the lane is a bit mask of the
/// key's hash; fixed, because every pod of a relay must map a key to the same lane.
pub const LANES: i32 = 256;

/// The statements one worker runs, prepared as text at start.
#[derive(Debug, Clone)]
pub struct Statements {
    /// Claims up to `$1` pending rows in claim order, skipping rows other workers hold. Under
    /// per-key ordering every claim takes one more value, the lanes the worker holds (an int4[],
    /// the last placeholder), and does not skip locked rows: see [`Statements::build`].
    pub claim: Arc<str>,
    /// The same claim starting at claim position `$2` (a timestamptz: the last claimed row's
    /// occurred-at), so the index scan seeks past the processed rows whose dead entries pile up
    /// at the head of the pending index until vacuum. The bound is a value, not a row, because
    /// in delete mode that row is gone. Only a shortcut: the worker still runs the full claim
    /// regularly, which picks up rows that commit late with an older claim position.
    pub claim_from: Arc<str>,
    /// The same claim starting at the earlier of `$2` (a timestamptz, NULL for none: the first
    /// pending row an earlier wide claim found) and the database's now() minus `$3` seconds, so
    /// it picks up rows committed late with a claim position that recent while walking only
    /// the dead entries of that window, not the whole dead prefix the full claim walks.
    pub claim_recent: Arc<str>,
    /// Settles a batch where every row was confirmed: `$1 uuid[]`.
    pub settle_all_published: Arc<str>,
    /// Settles a batch with per-row outcomes: `$1 uuid[]`, `$2 text[]` (error or NULL),
    /// `$3 bool[]` (true = done: published or dead-lettered; false = stays pending).
    pub settle_outcomes: Arc<str>,
    /// Capped count of pending rows: `$1` is the cap.
    pub backlog: Arc<str>,
    /// Age in seconds of the oldest pending row, NULL when none is pending.
    pub oldest_age: Arc<str>,
    /// Deletes up to `$2` rows processed more than `$1` seconds ago (retention in mark mode).
    pub purge_processed: Arc<str>,
}

impl Statements {
    /// Statements for a table whose shape was inspected (the relay's path).
    pub fn for_shape(table: &OutboxTable, shape: &TableShape) -> Self {
        Self::build(table, shape.payload, shape.raw_text)
    }

    /// Statements for a UTF-8 database, when only the payload kind is known.
    pub fn new(table: &OutboxTable, payload: PayloadKind) -> Self {
        Self::build(table, payload, false)
    }

    fn build(table: &OutboxTable, payload: PayloadKind, raw_text: bool) -> Self {
        let t = table.name.quoted();
        let c = &table.columns;
        let (id, kind, body, occurred, processed, error) = (
            c.id.quoted(),
            c.kind.quoted(),
            c.payload.quoted(),
            c.occurred_at.quoted(),
            c.processed_at.quoted(),
            c.error.quoted(),
        );
        // Every row decodes into the same shape whatever is mapped (see `columns`), so the
        // worker reads it without branching per table.
        // In a SQL_ASCII database, converting to SQL_ASCII hands the stored bytes over as they
        // are (bytea), where a UTF-8 client encoding would make the server reject them.
        let text = |expr: String| {
            if raw_text {
                format!("convert_to({expr}::text, 'SQL_ASCII')")
            } else {
                format!("{expr}::text")
            }
        };
        let payload_expr = match payload {
            PayloadKind::Json | PayloadKind::Text => text(format!("t.{body}")),
            PayloadKind::Bytes => format!("t.{body}"),
        };
        let kind_expr = text(format!("t.{kind}"));
        let routing_expr = c
            .routing_key
            .as_ref()
            .map_or("NULL::text".to_string(), |col| {
                text(format!("t.{}", col.quoted()))
            });
        let headers_expr = c.headers.as_ref().map_or("NULL::jsonb".to_string(), |col| {
            format!("t.{}::jsonb", col.quoted())
        });
        let attempts_expr = c.attempts.as_ref().map_or("0".to_string(), |col| {
            format!("coalesce(t.{}, 0)::int4", col.quoted())
        });

        let per_key = table.ordering == DeliveryOrder::PerKey && c.partition_key.is_some();
        // Only per-key claims need the key; the unordered claim does not read or send it.
        let key_expr = match (&c.partition_key, per_key) {
            (Some(col), true) => text(format!("t.{}", col.quoted())),
            _ => "NULL::text".to_string(),
        };
        // Per-key ordering: a worker claims only rows of the lanes it holds, where no other
        // relay worker claims (runtime::lanes), so it need not skip locked rows, and must not:
        // a row locked by someone else would let a later row of its key overtake it. It waits
        // instead (bounded by the batch's database timeout). A NULL key is unordered, its
        // lane spread by the id. Ties in occurred-at are broken by id, so the order of a key is
        // total.
        let lane_expr = c.partition_key.as_ref().map_or(String::new(), |col| {
            format!(
                "(hashtext(coalesce(t.{}::text, t.{id}::text)) & {})",
                col.quoted(),
                LANES - 1
            )
        });
        let claim_where = |bound: &str, lanes_placeholder: usize| {
            use columns::*;
            let (lane_column, lanes, order, lock) = if per_key {
                (
                    format!(", {lane_expr} AS {LANE}"),
                    format!(" AND {lane_expr} = ANY(${lanes_placeholder}::int4[])"),
                    format!("t.{occurred}, t.{id}"),
                    "FOR UPDATE OF t",
                )
            } else {
                (
                    String::new(),
                    String::new(),
                    format!("t.{occurred}"),
                    "FOR UPDATE OF t SKIP LOCKED",
                )
            };
            format!(
                "SELECT t.{id} AS {ID}, {kind_expr} AS {KIND}, {payload_expr} AS {PAYLOAD}, \
                 t.{occurred}::timestamptz AS {OCCURRED_AT}, {routing_expr} AS {ROUTING_KEY}, \
                 {headers_expr} AS {HEADERS}, {attempts_expr} AS {ATTEMPTS}, \
                 {key_expr} AS {PARTITION_KEY}{lane_column} \
                 FROM {t} AS t WHERE t.{processed} IS NULL{bound}{lanes} \
                 ORDER BY {order} LIMIT $1 {lock}"
            )
        };
        let claim = claim_where("", 2);
        // The bound is the claim's own output (the column cast to timestamptz). Against a
        // timestamp column the comparison is btree's cross-type timestamp >= timestamptz, which
        // converts with the session time zone exactly as the claim did, and is still an index
        // condition.
        let claim_from = claim_where(&format!(" AND t.{occurred} >= $2::timestamptz"), 3);
        // LEAST ignores a NULL horizon. The bound is a stable expression, computed once per
        // statement, so it stays an index condition.
        let claim_recent = claim_where(
            &format!(
                " AND t.{occurred} >= least($2::timestamptz, now() - make_interval(secs => $3::float8))"
            ),
            4,
        );

        let settle_all_published = match table.mode {
            DeliveryMode::Mark => format!(
                "UPDATE {t} SET {processed} = now(), {error} = NULL WHERE {id} = ANY($1::uuid[])"
            ),
            DeliveryMode::Delete => format!("DELETE FROM {t} WHERE {id} = ANY($1::uuid[])"),
        };

        let attempts_set = c.attempts.as_ref().map_or(String::new(), |col| {
            let col = col.quoted();
            format!(", {col} = coalesce(t.{col}, 0) + CASE WHEN u.error IS NULL THEN 0 ELSE 1 END")
        });
        let outcomes = "unnest($1::uuid[], $2::text[], $3::bool[]) AS u(id, error, done)";
        let update_outcomes = |only_failed: &str| {
            format!(
                "UPDATE {t} AS t SET {processed} = CASE WHEN u.done THEN now() ELSE NULL END, \
                 {error} = u.error{attempts_set} FROM {outcomes} WHERE t.{id} = u.id{only_failed}"
            )
        };
        let settle_outcomes = match table.mode {
            DeliveryMode::Mark => update_outcomes(""),
            // Published rows go; failed and dead-lettered rows stay with their error so they
            // can be inspected. Both parts run in one statement, on disjoint rows.
            DeliveryMode::Delete => format!(
                "WITH published AS (DELETE FROM {t} AS t USING {outcomes} \
                 WHERE t.{id} = u.id AND u.error IS NULL) {}",
                update_outcomes(" AND u.error IS NOT NULL")
            ),
        };

        let backlog = format!(
            "SELECT count(*) FROM (SELECT 1 FROM {t} WHERE {processed} IS NULL LIMIT $1) AS pending"
        );
        let oldest_age = format!(
            "SELECT extract(epoch FROM now() - ({occurred})::timestamptz)::float8 FROM {t} \
             WHERE {processed} IS NULL ORDER BY {occurred} LIMIT 1"
        );

        let purge_processed = format!(
            "DELETE FROM {t} WHERE {id} IN (SELECT {id} FROM {t} WHERE {processed} IS NOT NULL \
             AND {processed} < now() - make_interval(secs => $1) LIMIT $2)"
        );

        Self {
            purge_processed: purge_processed.into(),
            claim: claim.into(),
            claim_from: claim_from.into(),
            claim_recent: claim_recent.into(),
            settle_all_published: settle_all_published.into(),
            settle_outcomes: settle_outcomes.into(),
            backlog: backlog.into(),
            oldest_age: oldest_age.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::ident::{Ident, TableName};

    fn table() -> OutboxTable {
        OutboxTable::new(TableName::parse("app.outbox").unwrap())
    }

    #[test]
    fn claim_skips_locked_rows_in_claim_order() {
        let s = Statements::new(&table(), PayloadKind::Json);
        assert!(
            s.claim
                .contains("FROM \"app\".\"outbox\" AS t WHERE t.\"processed_on_utc\" IS NULL")
        );
        assert!(
            s.claim
                .contains("ORDER BY t.\"occurred_on_utc\" LIMIT $1 FOR UPDATE OF t SKIP LOCKED")
        );
        assert!(
            s.claim
                .contains("NULL::text AS routing_key, NULL::jsonb AS headers, 0 AS attempts")
        );
        assert!(s.claim_from.contains(
            "IS NULL AND t.\"occurred_on_utc\" >= $2::timestamptz ORDER BY t.\"occurred_on_utc\" LIMIT $1 FOR UPDATE OF t SKIP LOCKED"
        ));
        assert!(s.claim_recent.contains(
            "IS NULL AND t.\"occurred_on_utc\" >= least($2::timestamptz, now() - make_interval(secs => $3::float8)) ORDER BY"
        ));
    }

    #[test]
    fn optional_columns_are_read_when_mapped() {
        let mut t = table();
        t.columns.routing_key = Some(Ident::new("rk").unwrap());
        t.columns.headers = Some(Ident::new("hdrs").unwrap());
        t.columns.attempts = Some(Ident::new("tries").unwrap());
        let s = Statements::new(&t, PayloadKind::Bytes);
        assert!(
            s.claim
                .contains("t.\"content\" AS payload, t.\"occurred_on_utc\"")
        );
        assert!(
            s.claim
                .contains("t.\"rk\"::text AS routing_key, t.\"hdrs\"::jsonb AS headers, coalesce(t.\"tries\", 0)::int4")
        );
        assert!(
            s.settle_outcomes
                .contains("\"tries\" = coalesce(t.\"tries\", 0) + CASE")
        );
    }

    #[test]
    fn delete_mode_deletes_only_published_rows() {
        let mut t = table();
        t.mode = DeliveryMode::Delete;
        let s = Statements::new(&t, PayloadKind::Json);
        assert!(
            s.settle_all_published
                .starts_with("DELETE FROM \"app\".\"outbox\"")
        );
        assert!(s.settle_outcomes.contains("u.error IS NULL) UPDATE"));
        assert!(s.settle_outcomes.ends_with("AND u.error IS NOT NULL"));
    }

    #[test]
    fn sql_ascii_databases_hand_text_over_as_raw_bytes() {
        let shape = TableShape {
            payload: PayloadKind::Text,
            raw_text: true,
            server_autovacuum: true,
        };
        let s = Statements::for_shape(&table(), &shape);
        assert!(s.claim.contains("convert_to(t.\"type\"::text, 'SQL_ASCII') AS kind, convert_to(t.\"content\"::text, 'SQL_ASCII')"));
        let utf8 = Statements::for_shape(
            &table(),
            &TableShape {
                raw_text: false,
                ..shape
            },
        );
        assert!(!utf8.claim.contains("convert_to"));
    }

    /// The `$n` placeholders of a statement, in order of first appearance.
    fn placeholders(sql: &str) -> Vec<u32> {
        let mut found = Vec::new();
        let mut rest = sql;
        while let Some(at) = rest.find('$') {
            rest = &rest[at + 1..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(n) = digits.parse()
                && !found.contains(&n)
            {
                found.push(n);
            }
        }
        found
    }

    #[test]
    fn every_statement_binds_its_values() {
        // Every mode and every optional column, so each variant of each statement is checked.
        let mut t = table();
        t.columns.routing_key = Some(Ident::new("rk").unwrap());
        t.columns.headers = Some(Ident::new("hdrs").unwrap());
        t.columns.attempts = Some(Ident::new("tries").unwrap());
        for mode in [DeliveryMode::Mark, DeliveryMode::Delete] {
            t.mode = mode;
            let s = Statements::new(&t, PayloadKind::Text);
            // Each statement with the values its callers bind: $1..$n, every one used.
            for (text, values) in [
                (&s.claim, 1),
                (&s.claim_from, 2),
                (&s.claim_recent, 3),
                (&s.settle_all_published, 1),
                (&s.settle_outcomes, 3),
                (&s.backlog, 1),
                (&s.oldest_age, 0),
                (&s.purge_processed, 2),
            ] {
                let mut used = placeholders(text);
                used.sort_unstable();
                assert_eq!(used, (1..=values).collect::<Vec<u32>>(), "{text}");
                // No value is formatted in: the text holds no string literal at all.
                assert!(!text.contains('\''), "a literal in {text}");
            }
        }
    }

    #[test]
    fn per_key_claims_take_the_held_lanes_in_a_total_order_and_wait_for_locks() {
        let mut t = table();
        t.columns.partition_key = Some(Ident::new("aggregate_id").unwrap());
        t.ordering = DeliveryOrder::PerKey;
        let s = Statements::new(&t, PayloadKind::Json);
        let lane = format!(
            "(hashtext(coalesce(t.\"aggregate_id\"::text, t.\"id\"::text)) & {})",
            LANES - 1
        );
        for (text, lanes) in [(&s.claim, 2), (&s.claim_from, 3), (&s.claim_recent, 4)] {
            assert!(
                text.contains(&format!("{lane} = ANY(${lanes}::int4[])")),
                "{text}"
            );
            assert!(
                text.ends_with("ORDER BY t.\"occurred_on_utc\", t.\"id\" LIMIT $1 FOR UPDATE OF t"),
                "{text}"
            );
            assert!(text.contains("t.\"aggregate_id\"::text AS partition_key"));
            let mut used = placeholders(text);
            used.sort_unstable();
            assert_eq!(used, (1..=lanes).collect::<Vec<u32>>(), "{text}");
        }
        // The column alone changes nothing: unordered claims skip locked rows as before.
        t.ordering = DeliveryOrder::Unordered;
        let unordered = Statements::new(&t, PayloadKind::Json);
        assert!(unordered.claim.ends_with("FOR UPDATE OF t SKIP LOCKED"));
        assert!(!unordered.claim.contains("hashtext"));
        assert!(unordered.claim.contains("NULL::text AS partition_key"));
    }
}
